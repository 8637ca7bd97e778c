/*
 * svc_eru: the map-field conversions every pb.CoreRPC handler shares (see svc_eru.h).
 *
 * protobuf-c generates one entry type per map field (Pb__Node__LabelsEntry, ...), all laid out
 * as base, key, value; pv_pbmap_entry and bytes_entry read any of them, so one function serves
 * every map of a kind.
 */
#include "svc_eru.h"

#include "pv_json.h"
#include "pv_pbmap.h"
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct bytes_entry {
    ProtobufCMessage base;
    char *key;
    ProtobufCBinaryData value;
} bytes_entry;

static int fail_oom(pv_status *st) {
    return pv_status_set(st, PV_INTERNAL, "out of memory");
}

int svc_eru_labels_json(const char *field, void *const *entries, size_t n, char **out,
                        pv_status *st) {
    *out = NULL;
    json_t *j = json_object();
    for (size_t i = 0; j && i < n; i++) {
        const pv_pbmap_entry *e = entries[i];
        if (json_object_set_new(j, e->key, json_string(e->value)) != 0) {
            json_decref(j);
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s[%s]: not valid UTF-8", field, e->key);
        }
    }
    *out = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return *out ? PV_OK : fail_oom(st);
}

int svc_eru_resources_json(const char *field, void *const *entries, size_t n, char **out,
                           pv_status *st) {
    *out = NULL;
    json_t *j = json_object();
    if (!j) return fail_oom(st);
    for (size_t i = 0; i < n; i++) {
        const bytes_entry *e = entries[i];
        json_error_t err;
        json_t *doc = json_loadb((const char *)e->value.data, e->value.len, 0, &err);
        int rc = PV_OK;
        if (!doc)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s[%s]: not valid JSON: %s", field, e->key,
                               err.text);
        else if (!json_is_object(doc))
            rc =
                pv_status_set(st, PV_INVALID_ARGUMENT,
                              "%s[%s]: the plugin's document must be a JSON object", field, e->key);
        else if (json_object_set(j, e->key, doc) != 0)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s: plugin name is not UTF-8", field);
        json_decref(doc);
        if (rc != PV_OK) {
            json_decref(j);
            return rc;
        }
    }
    *out = pv_json_dumps(j, JSON_SORT_KEYS);
    json_decref(j);
    return *out ? PV_OK : fail_oom(st);
}

bool svc_eru_labels_match(const char *labels_json, void *const *want, size_t n_want) {
    if (n_want == 0) return true;
    json_t *have = json_loads(labels_json, 0, NULL);
    bool ok = have != NULL;
    for (size_t i = 0; ok && i < n_want; i++) {
        const pv_pbmap_entry *e = want[i];
        const char *v = json_string_value(json_object_get(have, e->key));
        ok = v && strcmp(v, e->value) == 0;
    }
    json_decref(have);
    return ok;
}

int svc_eru_register(gw_server *server, const svc_eru_method *table, size_t n, gw_method *methods,
                     void *data) {
    for (size_t i = 0; i < n; i++) {
        /* A table shorter than its declared size leaves zeroed entries: refuse them loudly. */
        if (!table[i].path || !table[i].handler) return -1;
        /* the client's messages come one by one: the same signature, as on_message */
        bool by_message = table[i].kind == GW_CLIENT_STREAM || table[i].kind == GW_BIDI_STREAM;
        methods[i] = (gw_method){.path = table[i].path,
                                 .kind = table[i].kind,
                                 .request = table[i].request,
                                 .handler = by_message ? NULL : table[i].handler,
                                 .on_message = by_message ? table[i].handler : NULL,
                                 .bad_request_code = table[i].eru,
                                 .needs_state = table[i].needs_redis,
                                 .data = data};
        if (gw_server_add_method(server, &methods[i]) != 0) return -1;
    }
    return 0;
}
