/*
 * pv_id: ULID-based identifiers and SHA-256 digests.
 *
 * A ULID puts the creation time (milliseconds) in its first 10 characters, so ids sort by age in
 * Redis sorted sets and listings without a separate timestamp, and 80 bits from getrandom(2)
 * after it, so processes on many machines can mint ids with no coordination and no collision in
 * practice. Lower-case Crockford base32 keeps ids readable and safe in keys, URLs and file names.
 *
 * The gateway mints an id or two per call, so the random bytes come from a small per-thread
 * buffer refilled by one getrandom(2) per 25 ids instead of one system call per id. A forked
 * child must not hand out the bytes its parent also holds: a fork handler empties the buffer of
 * the (only) thread that survives in the child.
 *
 * pv_id_check refuses references that could not be an id or a name before any lookup: a value
 * with '/' or ".." would otherwise travel into a key or a path, and a 1 MiB one into a log line
 * and an error message. Values are quoted and cut in its messages for the same reason.
 */
#include "pv_id.h"

#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define ULID_LEN 26
#define ULID_RANDOM_BYTES 10

static const char crockford[] = "0123456789abcdefghjkmnpqrstvwxyz";

#define RANDOM_POOL_BYTES 256

static __thread unsigned char pool[RANDOM_POOL_BYTES];
static __thread size_t pool_left; /* unused bytes at the end of pool */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void pool_forget(void) {
    explicit_bzero(pool, sizeof pool);
    pool_left = 0;
}

static void register_atfork(void) {
    pthread_atfork(NULL, NULL, pool_forget);
}

static int fill_random(unsigned char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom(buf + got, len - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

/* len bytes from the per-thread pool, refilling it when it runs short. */
static int take_random(unsigned char *buf, size_t len) {
    if (len > sizeof pool) return fill_random(buf, len);
    pthread_once(&atfork_once, register_atfork);
    if (pool_left < len) {
        if (fill_random(pool, sizeof pool) != 0) return -1;
        pool_left = sizeof pool;
    }
    unsigned char *src = pool + sizeof pool - pool_left;
    memcpy(buf, src, len);
    explicit_bzero(src, len); /* a byte is handed out once */
    pool_left -= len;
    return 0;
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 48 bits of time in 10 characters (the top 2 bits of the first are always 0), then 80 random
 * bits in 16 characters, 5 bits each, most significant first. */
static void encode_ulid(uint64_t ms, const unsigned char rnd[ULID_RANDOM_BYTES], char *out) {
    for (int i = 9; i >= 0; i--) {
        out[i] = crockford[ms & 31u];
        ms >>= 5;
    }
    /* 80 bits = two 40-bit halves, 8 characters each. */
    for (int half = 0; half < 2; half++) {
        uint64_t v = 0;
        for (int b = 0; b < 5; b++)
            v = (v << 8) | rnd[half * 5 + b];
        for (int i = 7; i >= 0; i--) {
            out[10 + half * 8 + i] = crockford[v & 31u];
            v >>= 5;
        }
    }
    out[ULID_LEN] = '\0';
}

int pv_id_new(const char *prefix, char *out, size_t outlen) {
    size_t plen = prefix != NULL ? strlen(prefix) : 0;
    size_t need = (plen > 0 ? plen + 1 : 0) + ULID_LEN + 1;
    if (out == NULL || need > outlen || need > PV_ID_MAX) return -1;

    unsigned char rnd[ULID_RANDOM_BYTES];
    if (take_random(rnd, sizeof(rnd)) != 0) return -1;

    char *p = out;
    if (plen > 0) {
        memcpy(p, prefix, plen);
        p[plen] = '-';
        p += plen + 1;
    }
    encode_ulid(now_ms(), rnd, p);
    return 0;
}

void pv_sha256_hex(const void *data, size_t len, char out[65]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (data == NULL) data = "";
    if (EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32) {
        /* Only out-of-memory inside libcrypto gets here; an empty digest cannot be mistaken
         * for a real one. */
        out[0] = '\0';
        return;
    }
    for (unsigned int i = 0; i < mdlen; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15u];
    }
    out[64] = '\0';
}

static int ref_char_ok(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

int pv_id_check(const char *field, const char *value, pv_status *st) {
    if (!value || !*value) return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is required", field);
    char q[PV_QUOTE_BUF];
    pv_quote(value, q, sizeof q);
    size_t len = strnlen(value, PV_ID_REF_MAX + 1);
    if (len > PV_ID_REF_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s (%zu bytes) is longer than %d bytes",
                             field, q, strlen(value), PV_ID_REF_MAX);
    if (strchr(value, '/'))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s must not contain '/'", field, q);
    if (strstr(value, ".."))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s must not contain \"..\"", field, q);
    if (value[0] == '-' || value[0] == '.')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s must not start with '%c'", field, q,
                             value[0]);
    for (size_t i = 0; i < len; i++)
        if (!ref_char_ok((unsigned char)value[i]))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "%s: %s has a character other than letters, digits, '.', '_' "
                                 "and '-' at byte %zu",
                                 field, q, i);
    return PV_OK;
}
