/*
 * pv_pbmap: map<string, string> fields of generated messages as JSON (see pv_pbmap.h).
 */
#include "pv_pbmap.h"

#include <stdlib.h>

int pv_pbmap_add(json_t *obj, void *const *entries, size_t n) {
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        const pv_pbmap_entry *e = entries[i];
        if (json_object_set_new(obj, e->key ? e->key : "", json_string(e->value ? e->value : "")) !=
            0)
            rc = -1;
    }
    return rc;
}

json_t *pv_pbmap_object(void *const *entries, size_t n) {
    json_t *o = json_object();
    if (o) pv_pbmap_add(o, entries, n);
    return o;
}

/* One block holds the entries, *out[0] its start: pv_pbmap_entries_free frees both. */
int pv_pbmap_entries(json_t *obj, const ProtobufCMessageDescriptor *d, void ***out, size_t *n) {
    *out = NULL;
    *n = 0;
    size_t count = json_object_size(obj);
    if (!count) return 0;
    void **ptrs = calloc(count, sizeof *ptrs);
    char *block = calloc(count, d->sizeof_message);
    if (!ptrs || !block) {
        free(ptrs);
        free(block);
        return -1;
    }
    size_t used = 0;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (!json_is_string(v)) continue;
        pv_pbmap_entry *e = (pv_pbmap_entry *)(block + used * d->sizeof_message);
        protobuf_c_message_init(d, e);
        e->key = (char *)key;
        e->value = (char *)json_string_value(v);
        ptrs[used++] = e;
    }
    if (!used) {
        free(ptrs);
        free(block);
        return 0;
    }
    *out = ptrs;
    *n = used;
    return 0;
}

void pv_pbmap_entries_free(void **entries) {
    if (entries) free(entries[0]);
    free(entries);
}
