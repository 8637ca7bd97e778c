/*
 * pv_record: decodes and encodes records through their field tables (see pv_record.h). Every
 * value goes through one parser per type (from_text for a hash's text, from_json for a JSON
 * value), so a hash and a JSON document of the same kind agree on what is damaged.
 */
#include "pv_record.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AT(rec, f, T) ((T *)((char *)(rec) + (f)->off))

static const char *want_of(const pv_field *f) {
    switch (f->type) {
    case PV_FIELD_STR:
        return "text";
    case PV_FIELD_CHARS:
        return "a short text";
    case PV_FIELD_INT:
    case PV_FIELD_LONG:
    case PV_FIELD_I64:
        return "a whole number in range";
    case PV_FIELD_BOOL:
        return "0 or 1";
    case PV_FIELD_ENUM:
        return "a known name";
    case PV_FIELD_DOUBLE:
        return "a number";
    case PV_FIELD_JSON:
        return "JSON";
    }
    return "?";
}

static int damaged(const pv_record_schema *s, const char *key, const pv_field *f, const char *v,
                   pv_status *st) {
    return pv_status_set(st, PV_DATA_LOSS, "%s record %s: field %s: bad value \"%.200s\" (want %s)",
                         s->what, key ? key : "?", f->name, v, want_of(f));
}

static int parse_ll(const char *v, long long lo, long long hi, long long *out) {
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi) return -1;
    *out = n;
    return 0;
}

int pv_record_set_str(char **slot, const char *v) {
    char *copy = v ? strdup(v) : NULL;
    if (v && !copy) return -1;
    free(*slot);
    *slot = copy;
    return 0;
}

/* Stores one field from its stored text: 0, -1 damaged, -2 out of memory. */
static int from_text(const pv_field *f, const char *v, void *rec) {
    long long n = 0;
    switch (f->type) {
    case PV_FIELD_STR:
        return pv_record_set_str(AT(rec, f, char *), v) == 0 ? 0 : -2;
    case PV_FIELD_CHARS: {
        size_t len = strlen(v);
        if (len >= f->cap) return -1;
        memcpy(AT(rec, f, char), v, len + 1);
        return 0;
    }
    case PV_FIELD_INT:
        if (parse_ll(v, INT_MIN, INT_MAX, &n) != 0) return -1;
        *AT(rec, f, int) = (int)n;
        return 0;
    case PV_FIELD_LONG:
        if (parse_ll(v, LONG_MIN, LONG_MAX, &n) != 0) return -1;
        *AT(rec, f, long) = (long)n;
        return 0;
    case PV_FIELD_I64:
        if (parse_ll(v, INT64_MIN, INT64_MAX, &n) != 0) return -1;
        *AT(rec, f, int64_t) = (int64_t)n;
        return 0;
    case PV_FIELD_BOOL:
        if (parse_ll(v, 0, 1, &n) != 0) return -1;
        *AT(rec, f, bool) = n == 1;
        return 0;
    case PV_FIELD_ENUM:
        for (int i = 0; f->names[i]; i++)
            if (strcmp(f->names[i], v) == 0) {
                *AT(rec, f, int) = i;
                return 0;
            }
        return -1;
    case PV_FIELD_DOUBLE: {
        char *end = NULL;
        errno = 0;
        double d = strtod(v, &end);
        if (errno != 0 || end == v || *end != '\0' || !isfinite(d)) return -1;
        *AT(rec, f, double) = d;
        return 0;
    }
    case PV_FIELD_JSON: {
        json_t *j = json_loads(v, JSON_DECODE_ANY, NULL);
        if (!j) return -1;
        json_decref(*AT(rec, f, json_t *));
        *AT(rec, f, json_t *) = j;
        return 0;
    }
    }
    return -1;
}

/* Stores one field from a JSON value: 0, -1 damaged, -2 out of memory. */
static int from_json(const pv_field *f, json_t *v, void *rec) {
    switch (f->type) {
    case PV_FIELD_STR:
    case PV_FIELD_CHARS:
    case PV_FIELD_ENUM:
        return json_is_string(v) ? from_text(f, json_string_value(v), rec) : -1;
    case PV_FIELD_INT:
    case PV_FIELD_LONG:
    case PV_FIELD_I64: {
        if (!json_is_integer(v)) return -1;
        char text[32];
        snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return from_text(f, text, rec);
    }
    case PV_FIELD_BOOL:
        if (!json_is_boolean(v)) return -1;
        *AT(rec, f, bool) = json_is_true(v);
        return 0;
    case PV_FIELD_DOUBLE:
        if (!json_is_number(v)) return -1;
        *AT(rec, f, double) = json_number_value(v);
        return 0;
    case PV_FIELD_JSON:
        json_decref(*AT(rec, f, json_t *));
        *AT(rec, f, json_t *) = json_incref(v);
        return 0;
    }
    return -1;
}

/* The text of a JSON value in a message. */
static char *json_text(json_t *v) {
    return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
}

static const pv_field *field_named(const pv_record_schema *s, const char *name) {
    for (size_t i = 0; i < s->nfields; i++)
        if (strcmp(s->fields[i].name, name) == 0) return &s->fields[i];
    return NULL;
}

/* Gives absent fields their defaults (seen[i]: field i was stored); a required one absent is
 * damage. */
static int fill_absent(const pv_record_schema *s, const char *key, const bool *seen, void *rec,
                       pv_status *st) {
    for (size_t i = 0; i < s->nfields; i++) {
        const pv_field *f = &s->fields[i];
        if (seen[i] || f->optional) continue;
        if (f->required)
            return pv_status_set(st, PV_DATA_LOSS, "%s record %s: field %s: absent", s->what,
                                 key ? key : "?", f->name);
        const char *dflt = f->dflt ? f->dflt : f->type == PV_FIELD_STR ? "" : NULL;
        if (!dflt) continue;
        int rc = from_text(f, dflt, rec);
        if (rc == -2) return pv_status_set(st, PV_INTERNAL, "%s record: out of memory", s->what);
        if (rc != 0)
            return pv_status_set(st, PV_INTERNAL, "%s record: field %s: bad default \"%s\"",
                                 s->what, f->name, dflt);
    }
    return PV_OK;
}

static int decode_flat(const pv_record_schema *s, const char *key, const redisReply *a, void *rec,
                       bool *seen, pv_status *st) {
    if (a->type != REDIS_REPLY_ARRAY || a->elements % 2 != 0)
        return pv_status_set(st, PV_INTERNAL, "%s record %s: malformed reply (type %d)", s->what,
                             key ? key : "?", a->type);
    for (size_t e = 0; e < a->elements; e += 2) {
        const redisReply *name = a->element[e], *val = a->element[e + 1];
        if (name->type != REDIS_REPLY_STRING || val->type != REDIS_REPLY_STRING) continue;
        const pv_field *f = field_named(s, name->str);
        if (!f) continue;
        int rc = from_text(f, val->str, rec);
        if (rc == -2) return pv_status_set(st, PV_INTERNAL, "%s record: out of memory", s->what);
        if (rc != 0) return damaged(s, key, f, val->str, st);
        seen[f - s->fields] = true;
    }
    return fill_absent(s, key, seen, rec, st);
}

int pv_record_decode(const pv_record_schema *s, const char *key, const redisReply *flat, void *rec,
                     pv_status *st) {
    memset(rec, 0, s->size);
    bool *seen = calloc(s->nfields ? s->nfields : 1, sizeof *seen);
    if (!seen) return pv_status_set(st, PV_INTERNAL, "%s record: out of memory", s->what);
    int rc = decode_flat(s, key, flat, rec, seen, st);
    free(seen);
    if (rc != PV_OK) pv_record_free(s, rec);
    return rc;
}

/* Keeps a field the table does not name in the record's extra object. */
static int keep_extra(const pv_record_schema *s, void *rec, const char *name, json_t *v) {
    if (!s->extra_off) return 0;
    json_t **extra = (json_t **)((char *)rec + s->extra_off);
    if (!*extra && !(*extra = json_object())) return -2;
    return json_object_set(*extra, name, v) == 0 ? 0 : -2;
}

static int decode_obj(const pv_record_schema *s, const char *key, json_t *obj, void *rec,
                      bool *seen, pv_status *st) {
    if (!json_is_object(obj))
        return pv_status_set(st, PV_DATA_LOSS, "%s record %s: not a JSON object", s->what,
                             key ? key : "?");
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        const pv_field *f = field_named(s, name);
        int rc = f ? from_json(f, v, rec) : keep_extra(s, rec, name, v);
        if (rc == -2) return pv_status_set(st, PV_INTERNAL, "%s record: out of memory", s->what);
        if (rc != 0) {
            char *text = json_text(v);
            damaged(s, key, f, text ? text : "?", st);
            free(text);
            return st->code;
        }
        if (f) seen[f - s->fields] = true;
    }
    return fill_absent(s, key, seen, rec, st);
}

int pv_record_decode_json(const pv_record_schema *s, const char *key, json_t *obj, void *rec,
                          pv_status *st) {
    memset(rec, 0, s->size);
    bool *seen = calloc(s->nfields ? s->nfields : 1, sizeof *seen);
    if (!seen) return pv_status_set(st, PV_INTERNAL, "%s record: out of memory", s->what);
    int rc = decode_obj(s, key, obj, rec, seen, st);
    free(seen);
    if (rc != PV_OK) pv_record_free(s, rec);
    return rc;
}

/* Whether an optional field holds nothing to write. */
static bool unset(const pv_field *f, const void *rec) {
    if (!f->optional) return false;
    switch (f->type) {
    case PV_FIELD_STR:
        return !*AT(rec, f, char *const);
    case PV_FIELD_CHARS:
        return !*AT(rec, f, const char);
    case PV_FIELD_INT:
    case PV_FIELD_ENUM:
        return *AT(rec, f, const int) == 0;
    case PV_FIELD_LONG:
        return *AT(rec, f, const long) == 0;
    case PV_FIELD_I64:
        return *AT(rec, f, const int64_t) == 0;
    case PV_FIELD_BOOL:
        return !*AT(rec, f, const bool);
    case PV_FIELD_DOUBLE:
        return *AT(rec, f, const double) == 0;
    case PV_FIELD_JSON:
        return !*AT(rec, f, json_t *const);
    }
    return false;
}

/* The stored text of one field (malloc'd), NULL when the field has none to write (a NULL
 * string or JSON value without a default) or out of memory (*oom). */
static char *to_text(const pv_field *f, const void *rec, bool *oom) {
    char *out = NULL;
    int n = 0;
    switch (f->type) {
    case PV_FIELD_STR: {
        const char *v = *AT(rec, f, char *const);
        out = strdup(v ? v : f->dflt ? f->dflt : "");
        break;
    }
    case PV_FIELD_CHARS:
        out = strdup(AT(rec, f, const char));
        break;
    case PV_FIELD_INT:
        n = asprintf(&out, "%d", *AT(rec, f, const int));
        break;
    case PV_FIELD_LONG:
        n = asprintf(&out, "%ld", *AT(rec, f, const long));
        break;
    case PV_FIELD_I64:
        n = asprintf(&out, "%" PRId64, *AT(rec, f, const int64_t));
        break;
    case PV_FIELD_BOOL:
        out = strdup(*AT(rec, f, const bool) ? "1" : "0");
        break;
    case PV_FIELD_ENUM: {
        int v = *AT(rec, f, const int), i = 0;
        while (f->names[i] && i < v)
            i++;
        out = strdup(v >= 0 && i == v && f->names[i] ? f->names[i] : "");
        break;
    }
    case PV_FIELD_DOUBLE:
        n = asprintf(&out, "%.17g", *AT(rec, f, const double));
        break;
    case PV_FIELD_JSON: {
        json_t *v = *AT(rec, f, json_t *const);
        out = v ? json_text(v) : strdup(f->dflt ? f->dflt : "");
        break;
    }
    }
    if (n < 0) out = NULL;
    if (!out) *oom = true;
    return out;
}

int pv_record_encode(const pv_record_schema *s, const void *rec, pv_strv *argv) {
    for (size_t i = 0; i < s->nfields && !argv->oom; i++) {
        if (unset(&s->fields[i], rec)) continue;
        bool oom = false;
        char *text = to_text(&s->fields[i], rec, &oom);
        if (oom) {
            argv->oom = true;
            return -1;
        }
        pv_strv_add(argv, s->fields[i].name);
        pv_strv_take(argv, text);
    }
    return argv->oom ? -1 : 0;
}

/* The JSON value of one field; NULL when it has none (a NULL string or JSON value) or out of
 * memory (*oom). */
static json_t *to_json(const pv_field *f, const void *rec, bool *oom) {
    json_t *v = NULL;
    switch (f->type) {
    case PV_FIELD_STR: {
        const char *text = *AT(rec, f, char *const);
        if (!text) return NULL;
        v = json_string(text);
        break;
    }
    case PV_FIELD_CHARS:
        v = json_string(AT(rec, f, const char));
        break;
    case PV_FIELD_INT:
        v = json_integer(*AT(rec, f, const int));
        break;
    case PV_FIELD_LONG:
        v = json_integer(*AT(rec, f, const long));
        break;
    case PV_FIELD_I64:
        v = json_integer(*AT(rec, f, const int64_t));
        break;
    case PV_FIELD_BOOL:
        v = json_boolean(*AT(rec, f, const bool));
        break;
    case PV_FIELD_ENUM: {
        bool text_oom = false;
        char *name = to_text(f, rec, &text_oom);
        v = name ? json_string(name) : NULL;
        free(name);
        break;
    }
    case PV_FIELD_DOUBLE:
        v = json_real(*AT(rec, f, const double));
        break;
    case PV_FIELD_JSON: {
        json_t *j = *AT(rec, f, json_t *const);
        if (!j) return NULL;
        v = json_incref(j);
        break;
    }
    }
    if (!v) *oom = true;
    return v;
}

json_t *pv_record_encode_json(const pv_record_schema *s, const void *rec) {
    json_t *obj = NULL;
    if (s->extra_off) {
        json_t *extra = *(json_t *const *)((const char *)rec + s->extra_off);
        obj = extra ? json_deep_copy(extra) : json_object();
    } else {
        obj = json_object();
    }
    for (size_t i = 0; obj && i < s->nfields; i++) {
        if (unset(&s->fields[i], rec)) continue;
        bool oom = false;
        json_t *v = to_json(&s->fields[i], rec, &oom);
        if (oom || (v && json_object_set_new(obj, s->fields[i].name, v) != 0)) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

void pv_record_free(const pv_record_schema *s, void *rec) {
    if (!rec) return;
    for (size_t i = 0; i < s->nfields; i++) {
        const pv_field *f = &s->fields[i];
        if (f->type == PV_FIELD_STR) free(*AT(rec, f, char *));
        if (f->type == PV_FIELD_JSON) json_decref(*AT(rec, f, json_t *));
    }
    if (s->extra_off) json_decref(*(json_t **)((char *)rec + s->extra_off));
    memset(rec, 0, s->size);
}

void pv_record_array_free(const pv_record_schema *s, void *recs, size_t n) {
    for (size_t i = 0; recs && i < n; i++)
        pv_record_free(s, (char *)recs + i * s->size);
    free(recs);
}
