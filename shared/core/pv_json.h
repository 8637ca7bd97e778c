/*
 * pv_json: reading the fields of JSON records (jansson) without a NULL check at every use: a
 * missing field, or one of another type, reads as the empty string or 0. For records whose
 * fields the reader only shows or compares; a field whose absence is an error is checked with
 * json_object_get directly.
 *
 * Ownership: the strings returned are the object's (valid while it lives); nothing is allocated.
 */
#ifndef PV_JSON_H
#define PV_JSON_H

#include <jansson.h>
#include <stdint.h>

/* The string at key, else "" (NULL object or key included). */
const char *pv_json_str(const json_t *o, const char *key);

/* The string at key, else def. */
const char *pv_json_str_or(const json_t *o, const char *key, const char *def);

/* The integer at key, else 0. */
int64_t pv_json_int(const json_t *o, const char *key);

#endif
