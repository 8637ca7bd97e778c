/* Fuzz target: what the gateway does with a request's bytes before any handler logic, for every
 * method of the four services: protobuf-c decoding into the method's input type, the enum
 * check every handler runs first (and the wire check for NUL bytes inside strings, which decoding
 * would cut), the name checks of the fields that name things, and the JSON
 * form (pvcli, logs) written and read back to the same JSON. The first byte picks the method. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pivirt/cluster/v1/cluster.pb-c.h"
#include "pivirt/operations/v1/operations.pb-c.h"
#include "pivirt/storage/v1/storage.pb-c.h"
#include "pv_pbjson.h"
#include "pv_storage.h"
#include "pv_validate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz check failed at line %d: %s\n", __LINE__, #cond);                \
            __builtin_trap();                                                                      \
        }                                                                                          \
    } while (0)

static const ProtobufCServiceDescriptor *const services[] = {
    &pb__core_rpc__descriptor,
    &pivirt__cluster__v1__cluster_service__descriptor,
    &pivirt__storage__v1__storage_service__descriptor,
    &pivirt__operations__v1__operation_service__descriptor,
};

static const ProtobufCMessageDescriptor *method_input(uint8_t pick) {
    size_t total = 0;
    for (size_t s = 0; s < sizeof services / sizeof services[0]; s++)
        total += services[s]->n_methods;
    size_t k = pick % total;
    for (size_t s = 0;; s++) {
        if (k < services[s]->n_methods) return services[s]->methods[k].input;
        k -= services[s]->n_methods;
    }
}

/* The top-level string fields that name a resource go through the name checks the handlers
 * use; whatever they hold, the checks answer (and a refusal says why). */
static void check_names(const ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) continue;
        const char *v = *(const char *const *)((const char *)m + f->offset);
        if (!v) continue;
        pv_status st;
        if (strstr(f->name, "name") || strcmp(f->name, "pool") == 0) {
            if (pv_validate_name(f->name, v, &st) != PV_OK) CHECK(st.msg[0]);
            if (pv_storage_check_name(f->name, v, &st) == PV_OK)
                CHECK(!strchr(v, '/') && !strstr(v, "..") && v[0] != '-');
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const ProtobufCMessageDescriptor *d = method_input(data[0]);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
    if (!m) return 0;
    pv_status st;
    /* a refusal names a field and has a NUL to point at */
    if (pv_validate_wire(d, data + 1, size - 1, &st) != PV_OK)
        CHECK(st.msg[0] && memchr(data + 1, 0, size - 1));
    else if (pv_validate_message(m, &st) == PV_OK)
        check_names(m);
    json_t *j = pv_pbjson_to_json(m);
    if (j) {
        ProtobufCMessage *again = NULL;
        if (pv_pbjson_from_json(d, j, &again, &st) == PV_OK) {
            json_t *j2 = pv_pbjson_to_json(again);
            CHECK(j2 && json_equal(j, j2));
            json_decref(j2);
            protobuf_c_message_free_unpacked(again, NULL);
        }
        json_decref(j);
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}
