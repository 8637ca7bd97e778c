/* Fuzz target: JSON from a client (pvcli's request bodies, anything read with pv_pbjson) into
 * messages of every API and back. Whatever the bytes, no crash, no leak, and a message that
 * was read writes back to JSON that reads again. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "pb/core.pb-c.h"
#include "pivirt/cluster/v1/cluster.pb-c.h"
#include "pivirt/storage/v1/storage.pb-c.h"
#include "pv_pbjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const ProtobufCMessageDescriptor *const types[] = {
        &pivirt__cluster__v1__upgrade_cluster_request__descriptor,
        &pivirt__cluster__v1__create_cluster_request__descriptor,
        &pivirt__storage__v1__create_pool_request__descriptor,
        &pivirt__storage__v1__volume__descriptor,
        &pb__deploy_options__descriptor,
    };
    if (size < 1) return 0;
    const ProtobufCMessageDescriptor *d = types[data[0] % (sizeof types / sizeof types[0])];
    json_t *j = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    if (!j) return 0;
    ProtobufCMessage *m = NULL;
    pv_status st;
    if (pv_pbjson_from_json(d, j, &m, &st) == PV_OK) {
        json_t *back = pv_pbjson_to_json(m);
        ProtobufCMessage *again = NULL;
        if (pv_pbjson_from_json(d, back, &again, &st) != PV_OK) __builtin_trap();
        protobuf_c_message_free_unpacked(again, NULL);
        json_decref(back);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    json_decref(j);
    return 0;
}
