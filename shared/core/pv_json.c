/*
 * pv_json: field reads of JSON records with defaults (see pv_json.h).
 */
#include "pv_json.h"

const char *pv_json_str_or(const json_t *o, const char *key, const char *def) {
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : def;
}

const char *pv_json_str(const json_t *o, const char *key) {
    return pv_json_str_or(o, key, "");
}

int64_t pv_json_int(const json_t *o, const char *key) {
    return (int64_t)json_integer_value(json_object_get(o, key));
}
