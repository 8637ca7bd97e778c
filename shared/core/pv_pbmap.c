/*
 * pv_pbmap: map<string, string> fields of generated messages as JSON (see pv_pbmap.h).
 */
#include "pv_pbmap.h"

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
