/*
 * pv_json: reading the fields of JSON records (jansson) without a NULL check at every use, and
 * writing documents whose numbers read as they were meant.
 *
 * Reads: a missing field, or one of another type, reads as the empty string or 0. For records
 * whose fields the reader only shows or compares; a field whose absence is an error is checked
 * with json_object_get directly.
 *
 * Writes: jansson prints every real with one precision for the whole document (%.17g unless
 * JSON_REAL_PRECISION says otherwise), so 0.1 comes out as 0.10000000000000001, and a smaller
 * precision would change values that need 17 digits. pv_json_dumps prints each real in the
 * shortest form that reads back as the same double (0.1, 1.5, 0.30000000000000004), with
 * jansson's spelling otherwise (".0" on integral reals, so a real stays a real; exponents without
 * '+' or leading zeros: 1e-7, 1e300), so every document it writes parses back to an equal one.
 *
 * Ownership: the strings the reads return are the object's (valid while it lives); nothing is
 * allocated. pv_json_dumps returns a malloc'd string the caller frees.
 */
#ifndef PV_JSON_H
#define PV_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* The string at key, else "" (NULL object or key included). */
const char *pv_json_str(const json_t *o, const char *key);

/* The string at key, else def. */
const char *pv_json_str_or(const json_t *o, const char *key, const char *def);

/* The integer at key, else 0. */
int64_t pv_json_int(const json_t *o, const char *key);

/*
 * v as compact JSON text (jansson's JSON_COMPACT output but for the reals, see above). flags may
 * hold JSON_COMPACT (the only layout there is), JSON_SORT_KEYS (members by key, bytewise) and
 * JSON_ENCODE_ANY (v need not be an object or an array); other jansson flags fail. Members come in
 * insertion order without JSON_SORT_KEYS. Strings are escaped as jansson escapes them by default.
 * NULL when v is NULL, not an object or array without JSON_ENCODE_ANY, nested deeper than 2048
 * levels, when flags has another bit, or when memory runs out.
 */
char *pv_json_dumps(const json_t *v, size_t flags);

/* The shortest text of d (finite) that strtod reads back as d, in jansson's spelling: buf gets
 * at most 32 bytes with the NUL. Returns the length, or -1 for NaN and infinities. */
int pv_json_real_text(double d, char *buf, size_t len);

#endif
