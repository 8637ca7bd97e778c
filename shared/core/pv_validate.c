/*
 * pv_validate: input checks shared by every service.
 *
 * Names become parts of Redis keys, libvirt object names and file paths, so they are held to a
 * small safe alphabet: no '/', no "..", nothing that starts like an option or a hidden file.
 * Enum checks walk the protobuf-c descriptors because protobuf-c keeps unknown enum numbers as
 * they arrived on the wire; without this walk a handler would store a value no code knows.
 * Values are quoted, escaped and cut in messages so that a hostile value cannot flood a log
 * line or forge one.
 */
#include "pv_validate.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define PATH_MAX_LEN 256 /* field path in enum messages; deeper paths are cut */
#define MAX_DEPTH 100    /* nesting beyond this is refused rather than recursed */

static int name_char_ok(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int pv_validate_required(const char *field, const char *value, pv_status *st) {
    if (value == NULL || value[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is required", field);
    return PV_OK;
}

int pv_validate_name(const char *field, const char *value, pv_status *st) {
    int rc = pv_validate_required(field, value, st);
    if (rc != PV_OK) return rc;

    char q[PV_QUOTE_BUF];
    pv_quote(value, q, sizeof(q));
    if (strchr(value, '/') != NULL)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s must not contain '/'", field, q);
    if (strstr(value, "..") != NULL)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s must not contain \"..\"", field, q);
    if (strlen(value) > PV_NAME_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s is longer than %d bytes", field, q,
                             PV_NAME_MAX);
    if (value[0] == '-' || value[0] == '.')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s must not start with '%c'", field, q,
                             value[0]);
    for (size_t i = 0; value[i] != '\0'; i++) {
        unsigned char c = (unsigned char)value[i];
        if (!name_char_ok(c))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "%s: %s has a character other than letters, digits, '.', '_' "
                                 "and '-' at byte %zu",
                                 field, q, i);
    }
    return PV_OK;
}

static const void *field_ptr(const ProtobufCMessage *m, unsigned offset) {
    return (const char *)m + offset;
}

/* Whether a singular field holds a value: oneof members only when selected, proto2 optional
 * scalars only with their has_ flag; proto3 and required fields always. */
static int field_present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)field_ptr(m, f->quantifier_offset) == f->id;
    if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset != 0)
        return *(const protobuf_c_boolean *)field_ptr(m, f->quantifier_offset) != 0;
    return 1;
}

static int check_enum(const ProtobufCFieldDescriptor *f, int value, const char *path,
                      pv_status *st) {
    const ProtobufCEnumDescriptor *ed = f->descriptor;
    if (protobuf_c_enum_descriptor_get_value(ed, value) != NULL) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: unknown value %d for %s", path, value,
                         ed->name);
}

static int check_message(const ProtobufCMessage *m, const char *path, int depth, pv_status *st);

int pv_validate_utf8_prefix(const char *s, size_t *valid) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (p[i]) {
        unsigned c = p[i];
        size_t n = c < 0x80             ? 1
                   : (c & 0xE0) == 0xC0 ? 2
                   : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 ? 4
                                        : 0;
        if (n == 0 || (n == 2 && c < 0xC2) || (n == 4 && c > 0xF4)) break;
        size_t k = 1;
        while (k < n && (p[i + k] & 0xC0) == 0x80)
            k++;
        if (k < n) break;
        /* overlong three-byte forms, UTF-16 surrogates, past U+10FFFF */
        if (n == 3 && ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] >= 0xA0))) break;
        if (n == 4 && ((c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] >= 0x90))) break;
        i += n;
    }
    if (valid) *valid = i;
    return p[i] == 0;
}

static int check_string(const char *s, const char *path, pv_status *st) {
    size_t at = 0;
    if (!s || pv_validate_utf8_prefix(s, &at)) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is not valid UTF-8 (at byte %zu)", path, at);
}

static int check_field(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                       const char *path, int depth, pv_status *st) {
    char here[PATH_MAX_LEN];
    char item[PATH_MAX_LEN + 24]; /* room for "[index]" after a full path */
    snprintf(here, sizeof(here), "%s%s%s", path, path[0] != '\0' ? "." : "", f->name);

    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t n = *(const size_t *)field_ptr(m, f->quantifier_offset);
        const void *arr = *(const void *const *)field_ptr(m, f->offset);
        for (size_t i = 0; i < n; i++) {
            snprintf(item, sizeof(item), "%s[%zu]", here, i);
            int rc = PV_OK;
            if (f->type == PROTOBUF_C_TYPE_ENUM)
                rc = check_enum(f, ((const int *)arr)[i], item, st);
            else if (f->type == PROTOBUF_C_TYPE_STRING)
                rc = check_string(((const char *const *)arr)[i], item, st);
            else
                rc = check_message(((const ProtobufCMessage *const *)arr)[i], item, depth + 1, st);
            if (rc != PV_OK) return rc;
        }
        return PV_OK;
    }
    if (!field_present(m, f)) return PV_OK;
    if (f->type == PROTOBUF_C_TYPE_ENUM)
        return check_enum(f, *(const int *)field_ptr(m, f->offset), here, st);
    if (f->type == PROTOBUF_C_TYPE_STRING)
        return check_string(*(const char *const *)field_ptr(m, f->offset), here, st);
    return check_message(*(const ProtobufCMessage *const *)field_ptr(m, f->offset), here, depth + 1,
                         st);
}

static int check_message(const ProtobufCMessage *m, const char *path, int depth, pv_status *st) {
    if (m == NULL || m->descriptor == NULL) return PV_OK; /* unset sub-message: nothing inside */
    if (depth > MAX_DEPTH)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: nested more than %d levels deep",
                             path[0] != '\0' ? path : "message", MAX_DEPTH);
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_ENUM && f->type != PROTOBUF_C_TYPE_MESSAGE &&
            f->type != PROTOBUF_C_TYPE_STRING)
            continue;
        int rc = check_field(m, f, path, depth, st);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

int pv_validate_message(const ProtobufCMessage *m, pv_status *st) {
    return check_message(m, "", 0, st);
}

/* ---- the wire form: NUL bytes in strings ---- */

/* protobuf-c hands a string field to C as a NUL-terminated copy, so a U+0000 inside it (valid
 * protobuf) silently cuts it: "default\0zzz" would act on "default". The length is known only
 * on the wire, so this walks the encoded bytes with the message's descriptor. */

typedef struct wire {
    const uint8_t *p, *end;
} wire;

static int wire_varint(wire *w, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && w->p < w->end; shift += 7) {
        uint8_t b = *w->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Advances past one field's value of wire type wt; *body and *body_len get a length-delimited
 * value's bytes. */
static int wire_skip(wire *w, unsigned wt, const uint8_t **body, size_t *body_len) {
    uint64_t v;
    switch (wt) {
    case 0:
        return wire_varint(w, &v);
    case 1:
    case 5: {
        size_t n = wt == 1 ? 8 : 4;
        if ((size_t)(w->end - w->p) < n) return -1;
        w->p += n;
        return 0;
    }
    case 2:
        if (wire_varint(w, &v) != 0 || v > (uint64_t)(w->end - w->p)) return -1;
        *body = w->p;
        *body_len = (size_t)v;
        w->p += v;
        return 0;
    }
    return -1; /* groups (3, 4) and reserved types: protobuf-c refuses them too */
}

/* How many times field `number` stood in [start, upto): the index of a repeated item, asked
 * only when one is refused. */
static size_t wire_index(const uint8_t *start, const uint8_t *upto, uint32_t number) {
    wire w = {start, upto};
    size_t n = 0;
    uint64_t key;
    while (w.p < w.end && wire_varint(&w, &key) == 0) {
        const uint8_t *body = NULL;
        size_t len = 0;
        if (wire_skip(&w, (unsigned)(key & 7), &body, &len) != 0) break;
        if ((key >> 3) == number && w.p < upto) n++;
    }
    return n;
}

static int check_wire(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                      const char *path, int depth, pv_status *st);

static int check_wire_field(const ProtobufCFieldDescriptor *f, const uint8_t *msg_start,
                            const uint8_t *body, size_t len, const char *path, int depth,
                            pv_status *st) {
    char here[PATH_MAX_LEN];
    char item[PATH_MAX_LEN + 24];
    snprintf(here, sizeof(here), "%s%s%s", path, path[0] != '\0' ? "." : "", f->name);
    const char *name = here;
    if (f->label == PROTOBUF_C_LABEL_REPEATED && f->type == PROTOBUF_C_TYPE_STRING) {
        snprintf(item, sizeof(item), "%s[%zu]", here, wire_index(msg_start, body, f->id));
        name = item;
    }
    if (f->type == PROTOBUF_C_TYPE_STRING) {
        const uint8_t *nul = memchr(body, 0, len);
        if (!nul) return PV_OK;
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: holds a NUL byte (at byte %zu); strings may not contain U+0000",
                             name, (size_t)(nul - body));
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE)
        return check_wire(f->descriptor, body, len, here, depth + 1, st);
    return PV_OK; /* bytes keep their NULs; packed scalars hold none of interest */
}

static int check_wire(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                      const char *path, int depth, pv_status *st) {
    if (depth > MAX_DEPTH)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: nested more than %d levels deep",
                             path[0] != '\0' ? path : "message", MAX_DEPTH);
    wire w = {buf, buf + len};
    while (w.p < w.end) {
        uint64_t key;
        const uint8_t *body = NULL;
        size_t body_len = 0;
        if (wire_varint(&w, &key) != 0 || wire_skip(&w, (unsigned)(key & 7), &body, &body_len))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is not a valid %s message",
                                 path[0] != '\0' ? path : "request", d->name);
        if (!body || key >> 3 > UINT32_MAX) continue;
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
        if (!f) continue; /* an unknown field: kept aside by protobuf-c, read by nobody */
        int rc = check_wire_field(f, buf, body, body_len, path, depth, st);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

int pv_validate_wire(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                     pv_status *st) {
    return check_wire(d, buf, len, "", 0, st);
}
