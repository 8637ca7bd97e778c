/*
 * pv_keys: builds key names (see pv_keys.h for the schema). Kept as plain formatting so that
 * an operator reading pv_keys.h knows exactly what redis-cli will show.
 */
#include "pv_keys.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int pv_keys_init(pv_keys *k, const char *prefix, pv_status *st) {
    if (!prefix) prefix = "";
    size_t n = strlen(prefix);
    if (n >= sizeof k->prefix)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix: longer than %d bytes",
                             PV_KEY_PREFIX_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if (prefix[i] <= ' ' || prefix[i] > '~')
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "redis.prefix: \"%s\" must be printable without spaces", prefix);
    memcpy(k->prefix, prefix, n + 1);
    return PV_OK;
}

static int key_format(const pv_keys *k, char *buf, size_t len, pv_status *st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int key_format(const pv_keys *k, char *buf, size_t len, pv_status *st, const char *fmt,
                      ...) {
    int n = snprintf(buf, len, "%s", k->prefix);
    if (n < 0 || (size_t)n >= len) goto too_long;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, len - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0 || (size_t)(n + m) >= len) goto too_long;
    return PV_OK;
too_long:
    return pv_status_set(st, PV_INVALID_ARGUMENT, "key name longer than %zu bytes", len - 1);
}

int pv_key_presence(const pv_keys *k, const char *kind, const char *instance, char *buf, size_t len,
                    pv_status *st) {
    return key_format(k, buf, len, st, "presence:%s:%s", kind, instance);
}

int pv_key_presence_index(const pv_keys *k, const char *kind, char *buf, size_t len,
                          pv_status *st) {
    return key_format(k, buf, len, st, "presence:%s", kind);
}
