/*
 * pv_status: codes and messages for every failure in pivirt.
 *
 * The message is formatted into the caller's struct so that no error path ever allocates or has
 * anything to free. Code names are the gRPC canonical names, so logs, tests and the gateway all
 * speak the same words.
 */
#include "pv_status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Indexed by code: the codes are dense from 0 to 16. */
static const char *const code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

#define N_CODES ((int)(sizeof(code_names) / sizeof(code_names[0])))

int pv_status_set(pv_status *st, int code, const char *fmt, ...) {
    if (st == NULL) return code;
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
    va_end(ap);
    return code;
}

void pv_status_clear(pv_status *st) {
    if (st == NULL) return;
    st->code = PV_OK;
    st->msg[0] = '\0';
}

/* Appends src to dst (holding *len bytes) without passing PV_STATUS_MSG_MAX - 1. */
static void append(char *dst, size_t *len, const char *src) {
    size_t n = strlen(src);
    size_t room = PV_STATUS_MSG_MAX - 1 - *len;
    if (n > room) n = room;
    memcpy(dst + *len, src, n);
    *len += n;
    dst[*len] = '\0';
}

int pv_status_prefix(pv_status *st, const char *fmt, ...) {
    if (st == NULL) return PV_UNKNOWN;
    char prefix[PV_STATUS_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);

    /* Copy the old message first: st->msg is both source and destination. */
    char old[PV_STATUS_MSG_MAX];
    memcpy(old, st->msg, sizeof(old));
    old[sizeof(old) - 1] = '\0';
    size_t len = 0;
    st->msg[0] = '\0';
    append(st->msg, &len, prefix);
    if (old[0] != '\0') {
        append(st->msg, &len, ": ");
        append(st->msg, &len, old);
    }
    return st->code;
}

const char *pv_code_name(int code) {
    if (code < 0 || code >= N_CODES) return "UNKNOWN";
    return code_names[code];
}

int pv_code_parse(const char *name, size_t len, int *code) {
    if (name == NULL) return -1;
    for (int i = 0; i < N_CODES; i++) {
        if (strlen(code_names[i]) == len && memcmp(code_names[i], name, len) == 0) {
            if (code != NULL) *code = i;
            return 0;
        }
    }
    return -1;
}

void pv_quote(const char *value, char *buf, size_t size) {
    size_t o = 0;
    buf[o++] = '"';
    for (const unsigned char *p = (const unsigned char *)(value ? value : ""); *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\')
            snprintf(esc, sizeof esc, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", *p);
        else
            snprintf(esc, sizeof esc, "%c", *p);
        size_t n = strlen(esc);
        if (o + n > PV_QUOTE_MAX || o + n + 5 > size) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, esc, n);
        o += n;
    }
    buf[o++] = '"';
    buf[o] = '\0';
}
