/*
 * pv_pbjson: descriptor-driven protobuf <-> JSON (see pv_pbjson.h).
 */
#include "pv_pbjson.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_b64.h"
#include "pv_time.h"
#include "pv_validate.h"

#define TIMESTAMP "google.protobuf.Timestamp"

static void *field_ptr(const ProtobufCMessage *m, unsigned offset) {
    return (char *)m + offset;
}

static size_t type_size(const ProtobufCFieldDescriptor *f) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    }
    return 0;
}

/* ---- to JSON ---- */

static bool is_map_entry(const ProtobufCMessageDescriptor *d) {
    size_t n = strlen(d->name);
    return n > 5 && strcmp(d->name + n - 5, "Entry") == 0 && d->n_fields == 2 &&
           strcmp(d->fields[0].name, "key") == 0 && strcmp(d->fields[1].name, "value") == 0;
}

static json_t *msg_json(const ProtobufCMessage *m);

/* The range protobuf's JSON mapping gives Timestamp: 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z. */
#define TS_MIN_SECONDS (-62135596800LL)
#define TS_MAX_SECONDS 253402300799LL

static json_t *timestamp_json(const ProtobufCMessage *m) {
    int64_t secs = 0;
    int64_t nanos = 0;
    for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &m->descriptor->fields[i];
        if (strcmp(f->name, "seconds") == 0) secs = *(int64_t *)field_ptr(m, f->offset);
        if (strcmp(f->name, "nanos") == 0) nanos = *(int32_t *)field_ptr(m, f->offset);
    }
    /* A message off the wire may hold nanos outside 0..999999999 and seconds outside the
     * range: carried over and clamped, so what is written is always an RFC 3339 time that
     * reads back (an invalid Timestamp has no faithful JSON form). */
    int64_t carry = nanos / 1000000000 - (nanos % 1000000000 < 0);
    nanos -= carry * 1000000000;
    if (secs > TS_MAX_SECONDS - carry)
        secs = TS_MAX_SECONDS, nanos = 999000000;
    else if (secs < TS_MIN_SECONDS - carry)
        secs = TS_MIN_SECONDS, nanos = 0;
    else
        secs += carry;
    time_t t = (time_t)secs;
    struct tm tm;
    if (!gmtime_r(&t, &tm)) return json_string("1970-01-01T00:00:00Z");
    char buf[64];
    int ms = (int)(nanos / 1000000);
    snprintf(buf, sizeof buf,
             ms ? "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" : "%04d-%02d-%02dT%02d:%02d:%02dZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
    return json_string(buf);
}

/* A JSON string of s. Protobuf strings must be UTF-8, but protobuf-c does not check: each byte
 * that does not fit becomes U+FFFD, so a field is written (lossily) rather than left out. */
static json_t *text_json(const char *s) {
    size_t ok = 0;
    if (pv_validate_utf8_prefix(s, &ok)) return json_string(s);
    size_t n = strlen(s);
    char *buf = malloc(3 * n + 1), *o = buf;
    if (!buf) return NULL;
    while (*s) {
        pv_validate_utf8_prefix(s, &ok);
        memcpy(o, s, ok);
        o += ok;
        s += ok;
        if (*s) {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            s++;
        }
    }
    *o = '\0';
    json_t *j = json_string(buf);
    free(buf);
    return j;
}

static json_t *value_json(const ProtobufCFieldDescriptor *f, const void *p) {
    char num[32];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(num, sizeof num, "%" PRId64, *(const int64_t *)p);
        return json_string(num);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(num, sizeof num, "%" PRIu64, *(const uint64_t *)p);
        return json_string(num);
    case PROTOBUF_C_TYPE_FLOAT:
        return json_real(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *v =
            protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)p);
        return v ? json_string(v->name) : json_integer(*(const int *)p);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        return text_json(s ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        char *text = NULL;
        pv_status st;
        if (pv_b64_encode(b->data, b->len, &text, &st) != PV_OK) return json_null();
        json_t *j = json_string(text);
        free(text);
        return j;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        if (!sub) return NULL;
        if (strcmp(sub->descriptor->name, TIMESTAMP) == 0 ||
            strcmp(sub->descriptor->name, "Timestamp") == 0)
            return timestamp_json(sub);
        return msg_json(sub);
    }
    }
    return json_null();
}

static json_t *msg_json(const ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *o = json_object();
    for (unsigned i = 0; o && i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *p = field_ptr(m, f->offset);
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t which = *(const uint32_t *)field_ptr(m, f->quantifier_offset);
            if (which != f->id) continue;
        }
        json_t *v = NULL;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)field_ptr(m, f->quantifier_offset);
            const char *arr = *(char *const *)p;
            bool map = f->type == PROTOBUF_C_TYPE_MESSAGE && is_map_entry(f->descriptor);
            v = map ? json_object() : json_array();
            for (size_t k = 0; v && k < n; k++) {
                const void *item = arr + k * type_size(f);
                if (map) {
                    const ProtobufCMessage *e = *(ProtobufCMessage *const *)item;
                    const ProtobufCMessageDescriptor *ed = e->descriptor;
                    json_t *key = value_json(&ed->fields[0], field_ptr(e, ed->fields[0].offset));
                    json_t *val = value_json(&ed->fields[1], field_ptr(e, ed->fields[1].offset));
                    char kbuf[64];
                    const char *ks = json_string_value(key);
                    if (!ks) {
                        snprintf(kbuf, sizeof kbuf, "%" JSON_INTEGER_FORMAT,
                                 json_integer_value(key));
                        ks = kbuf;
                    }
                    json_object_set_new(v, ks, val ? val : json_null());
                    json_decref(key);
                } else {
                    json_t *x = value_json(f, item);
                    json_array_append_new(v, x ? x : json_null());
                }
            }
        } else {
            v = value_json(f, p);
        }
        if (v) json_object_set_new(o, f->name, v);
    }
    return o;
}

json_t *pv_pbjson_to_json(const ProtobufCMessage *m) {
    return m ? msg_json(m) : NULL;
}

/* ---- from JSON ---- */

/* "max_surge" and "maxSurge" both name field max_surge. */
static bool name_matches(const char *field, const char *key) {
    if (strcmp(field, key) == 0) return true;
    const char *a = field, *b = key;
    while (*a && *b) {
        if (*a == '_') {
            a++;
            if (toupper((unsigned char)*a) != *b) return false;
        } else if (*a != *b) {
            return false;
        }
        a++;
        b++;
    }
    return !*a && !*b;
}

static int from_msg(const ProtobufCMessageDescriptor *d, json_t *j, ProtobufCMessage **out,
                    const char *path, pv_status *st);

static int bad(pv_status *st, const char *path, const char *want, json_t *v) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %.80s is not %s", path, text ? text : "?", want);
    free(text);
    return PV_INVALID_ARGUMENT;
}

static int int_of(json_t *v, long long *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        char *end;
        const char *s = json_string_value(v);
        *out = strtoll(s, &end, 10);
        return *s && !*end ? 0 : -1;
    }
    return -1;
}

static int timestamp_from(const ProtobufCMessageDescriptor *d, json_t *v, void **out,
                          const char *path, pv_status *st) {
    int64_t ms = 0;
    if (!json_is_string(v) || pv_time_parse(path, json_string_value(v), 0, &ms, st) != PV_OK)
        return bad(st, path, "an RFC 3339 time", v);
    ProtobufCMessage *m = calloc(1, d->sizeof_message);
    if (!m) return pv_status_set(st, PV_INTERNAL, "out of memory");
    protobuf_c_message_init(d, m);
    /* floor division: before 1970 the seconds go down and the nanos stay positive */
    int64_t secs = ms / 1000 - (ms % 1000 < 0);
    int32_t nanos = (int32_t)(ms - secs * 1000) * 1000000;
    for (unsigned i = 0; i < d->n_fields; i++) {
        if (strcmp(d->fields[i].name, "seconds") == 0)
            *(int64_t *)field_ptr(m, d->fields[i].offset) = secs;
        if (strcmp(d->fields[i].name, "nanos") == 0)
            *(int32_t *)field_ptr(m, d->fields[i].offset) = nanos;
    }
    *out = m;
    return PV_OK;
}

/* Writes one value of field f from v into p (a scalar slot or an array element). */
static int value_from(const ProtobufCFieldDescriptor *f, json_t *v, void *p, const char *path,
                      pv_status *st) {
    long long n;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if (int_of(v, &n) != 0 || n < INT32_MIN || n > INT32_MAX)
            return bad(st, path, "a 32-bit integer", v);
        *(int32_t *)p = (int32_t)n;
        return PV_OK;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if (int_of(v, &n) != 0 || n < 0 || n > UINT32_MAX)
            return bad(st, path, "an unsigned 32-bit integer", v);
        *(uint32_t *)p = (uint32_t)n;
        return PV_OK;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        if (int_of(v, &n) != 0) return bad(st, path, "an integer", v);
        *(int64_t *)p = n;
        return PV_OK;
    case PROTOBUF_C_TYPE_FLOAT:
        if (!json_is_number(v)) return bad(st, path, "a number", v);
        *(float *)p = (float)json_number_value(v);
        return PV_OK;
    case PROTOBUF_C_TYPE_DOUBLE:
        if (!json_is_number(v)) return bad(st, path, "a number", v);
        *(double *)p = json_number_value(v);
        return PV_OK;
    case PROTOBUF_C_TYPE_BOOL:
        if (!json_is_boolean(v)) return bad(st, path, "true or false", v);
        *(protobuf_c_boolean *)p = json_is_true(v);
        return PV_OK;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev = NULL;
        if (json_is_string(v))
            ev = protobuf_c_enum_descriptor_get_value_by_name(ed, json_string_value(v));
        else if (json_is_integer(v))
            ev = protobuf_c_enum_descriptor_get_value(ed, (int)json_integer_value(v));
        if (!ev) {
            char want[160];
            snprintf(want, sizeof want, "a value of %s", ed->name);
            return bad(st, path, want, v);
        }
        *(int *)p = ev->value;
        return PV_OK;
    }
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(v)) return bad(st, path, "a string", v);
        char *s = strdup(json_string_value(v));
        if (!s) return pv_status_set(st, PV_INTERNAL, "out of memory");
        *(char **)p = s;
        return PV_OK;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        if (!json_is_string(v)) return bad(st, path, "base64 text", v);
        if (pv_b64_decode(path, json_string_value(v), &b->data, &b->len, st) != PV_OK)
            return st->code;
        return PV_OK;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *md = f->descriptor;
        if (strcmp(md->name, TIMESTAMP) == 0) return timestamp_from(md, v, (void **)p, path, st);
        return from_msg(md, v, (ProtobufCMessage **)p, path, st);
    }
    }
    return pv_status_set(st, PV_INTERNAL, "%s: unsupported type", path);
}

static int field_from(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, json_t *v,
                      const char *path, pv_status *st) {
    void *p = field_ptr(m, f->offset);
    if (f->label != PROTOBUF_C_LABEL_REPEATED) {
        if (json_is_null(v)) return PV_OK;
        int rc = value_from(f, v, p, path, st);
        if (rc == PV_OK && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            *(uint32_t *)field_ptr(m, f->quantifier_offset) = f->id;
        else if (rc == PV_OK && f->label == PROTOBUF_C_LABEL_OPTIONAL &&
                 f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            *(protobuf_c_boolean *)field_ptr(m, f->quantifier_offset) = 1;
        return rc;
    }
    bool map = f->type == PROTOBUF_C_TYPE_MESSAGE && is_map_entry(f->descriptor);
    size_t n = map ? json_object_size(v) : json_array_size(v);
    if (map ? !json_is_object(v) : !json_is_array(v))
        return bad(st, path, map ? "an object" : "an array", v);
    char *arr = calloc(n ? n : 1, type_size(f));
    if (!arr) return pv_status_set(st, PV_INTERNAL, "out of memory");
    *(void **)p = arr;
    size_t *count = field_ptr(m, f->quantifier_offset);
    char sub[512];
    if (map) {
        const ProtobufCMessageDescriptor *ed = f->descriptor;
        const char *key;
        json_t *val;
        json_object_foreach(v, key, val) {
            snprintf(sub, sizeof sub, "%.300s.%.200s", path, key);
            ProtobufCMessage *e = calloc(1, ed->sizeof_message);
            if (!e) return pv_status_set(st, PV_INTERNAL, "out of memory");
            protobuf_c_message_init(ed, e);
            ((ProtobufCMessage **)arr)[(*count)++] = e;
            json_t *k = json_string(key);
            int rc = value_from(&ed->fields[0], k, field_ptr(e, ed->fields[0].offset), sub, st);
            json_decref(k);
            if (rc == PV_OK)
                rc = value_from(&ed->fields[1], val, field_ptr(e, ed->fields[1].offset), sub, st);
            if (rc != PV_OK) return rc;
        }
        return PV_OK;
    }
    for (size_t i = 0; i < n; i++) {
        snprintf(sub, sizeof sub, "%.400s[%zu]", path, i);
        int rc = value_from(f, json_array_get(v, i), arr + i * type_size(f), sub, st);
        if (rc != PV_OK) return rc;
        (*count)++;
    }
    return PV_OK;
}

static int from_msg(const ProtobufCMessageDescriptor *d, json_t *j, ProtobufCMessage **out,
                    const char *path, pv_status *st) {
    *out = NULL;
    if (!json_is_object(j)) return bad(st, *path ? path : "request", "an object", j);
    ProtobufCMessage *m = calloc(1, d->sizeof_message);
    if (!m) return pv_status_set(st, PV_INTERNAL, "out of memory");
    protobuf_c_message_init(d, m);
    *out = m; /* the caller frees what was built so far, on error too */
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        const ProtobufCFieldDescriptor *f = NULL;
        for (unsigned i = 0; i < d->n_fields && !f; i++)
            if (name_matches(d->fields[i].name, key)) f = &d->fields[i];
        char sub[512];
        snprintf(sub, sizeof sub, "%.300s%s%.200s", path, *path ? "." : "", f ? f->name : key);
        if (!f)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s has no such field", sub, d->name);
        int rc = field_from(m, f, v, sub, st);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

int pv_pbjson_from_json(const ProtobufCMessageDescriptor *d, json_t *j, ProtobufCMessage **out,
                        pv_status *st) {
    ProtobufCMessage *m = NULL;
    int rc = from_msg(d, j, &m, "", st);
    if (rc != PV_OK) {
        if (m) protobuf_c_message_free_unpacked(m, NULL);
        return rc;
    }
    *out = m;
    return PV_OK;
}
