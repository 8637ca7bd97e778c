/*
 * pv_time: the three ways a client names a point in time (see pv_time.h). Each parser takes the
 * whole text or fails, so "10mins" or "2026-12-02" is an error, never a guess.
 */
#include "pv_time.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t pv_time_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int pv_time_cond_init(pthread_cond_t *cv) {
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc != 0) return rc;
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

int64_t pv_time_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct timespec pv_time_mono_after(int64_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* exactly n digits at *p, advancing it */
static bool digits(const char **p, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)(*p)[i])) return false;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    *out = v;
    return true;
}

/* ".123..." at *p: milliseconds (further digits dropped), advancing past all of them */
static int fraction_ms(const char **p) {
    if (**p != '.') return 0;
    (*p)++;
    int ms = 0, n = 0;
    while (isdigit((unsigned char)**p)) {
        if (n < 3) ms = ms * 10 + (**p - '0');
        n++;
        (*p)++;
    }
    for (; n < 3; n++)
        ms *= 10;
    return ms;
}

static bool rfc3339(const char *s, int64_t *out) {
    int Y, M, D, h, m, sec;
    const char *p = s;
    if (!digits(&p, 4, &Y) || *p++ != '-' || !digits(&p, 2, &M) || *p++ != '-' ||
        !digits(&p, 2, &D))
        return false;
    if (*p != 'T' && *p != 't' && *p != ' ') return false;
    p++;
    if (!digits(&p, 2, &h) || *p++ != ':' || !digits(&p, 2, &m) || *p++ != ':' ||
        !digits(&p, 2, &sec))
        return false;
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60) return false;
    if (*p == '.' && !isdigit((unsigned char)p[1])) return false;
    int ms = fraction_ms(&p);
    int offset_min = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1, oh, om;
        if (!digits(&p, 2, &oh) || *p++ != ':' || !digits(&p, 2, &om) || oh > 23 || om > 59)
            return false;
        offset_min = sign * (oh * 60 + om);
    } else {
        return false;
    }
    if (*p) return false;
    struct tm tm = {.tm_year = Y - 1900,
                    .tm_mon = M - 1,
                    .tm_mday = D,
                    .tm_hour = h,
                    .tm_min = m,
                    .tm_sec = sec};
    time_t t = timegm(&tm);
    *out = ((int64_t)t - (int64_t)offset_min * 60) * 1000 + ms;
    return true;
}

static bool unix_seconds(const char *s, int64_t *out) {
    const char *p = s;
    if (!isdigit((unsigned char)*p)) return false;
    int64_t v = 0;
    while (isdigit((unsigned char)*p)) {
        if (v > INT64_MAX / 10000) return false;
        v = v * 10 + (*p++ - '0');
    }
    if (*p == '.' && !isdigit((unsigned char)p[1])) return false;
    int ms = fraction_ms(&p);
    if (*p) return false;
    *out = v * 1000 + ms;
    return true;
}

/* Go's duration subset: [number unit]+, units h m s ms; a fraction allowed ("1.5h") */
static bool duration_ms(const char *s, int64_t *out) {
    const char *p = s;
    double total = 0;
    bool any = false;
    while (*p) {
        char *end;
        if (!isdigit((unsigned char)*p) && *p != '.') return false;
        double v = strtod(p, &end);
        if (end == p) return false;
        p = end;
        double unit;
        if (strncmp(p, "ms", 2) == 0) {
            unit = 1;
            p += 2;
        } else if (*p == 'h') {
            unit = 3600e3;
            p++;
        } else if (*p == 'm') {
            unit = 60e3;
            p++;
        } else if (*p == 's') {
            unit = 1e3;
            p++;
        } else {
            return false;
        }
        total += v * unit;
        any = true;
    }
    if (!any || total > 1e15) return false;
    *out = (int64_t)total;
    return true;
}

int pv_time_parse(const char *field, const char *text, int64_t now_ms, int64_t *out_ms,
                  pv_status *st) {
    int64_t v;
    if (text && rfc3339(text, &v)) {
        *out_ms = v;
        return PV_OK;
    }
    if (text && unix_seconds(text, &v)) {
        *out_ms = v;
        return PV_OK;
    }
    if (text && duration_ms(text, &v)) {
        *out_ms = now_ms - v;
        return PV_OK;
    }
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: \"%s\" is not a time: give RFC 3339 (2026-12-02T16:55:38Z), Unix "
                         "seconds (1796229307) or a duration back from now (10m, 1h30m, 45s)",
                         field, text ? text : "");
}
