/*
 * pv_keys: every Redis key name of pivirt, in one place.
 *
 * Every key starts with the configured prefix (redis.prefix, "pv:" by default), so several
 * pivirt systems, or the tests, can share one Redis. Functions write into a caller buffer and
 * return PV_OK, or PV_INVALID_ARGUMENT when the name does not fit (PV_KEY_MAX is plenty for
 * validated names).
 *
 * Presence (TTL'd keys of live processes):
 *   <prefix>presence:<kind>:<instance>   string (JSON about the process), expires
 *   <prefix>presence:<kind>              sorted set instance -> expiry (ms), the live index
 * kinds: gateway, worker, scheduler, agent (instance = node name for an agent).
 */
#ifndef PV_KEYS_H
#define PV_KEYS_H

#include <stddef.h>

#include "pv_status.h"

#define PV_KEY_MAX 256
#define PV_KEY_PREFIX_MAX 64

typedef struct pv_keys {
    char prefix[PV_KEY_PREFIX_MAX];
} pv_keys;

/* prefix: printable, no spaces, at most PV_KEY_PREFIX_MAX-1 bytes (may be empty). */
int pv_keys_init(pv_keys *k, const char *prefix, pv_status *st);

int pv_key_presence(const pv_keys *k, const char *kind, const char *instance, char *buf, size_t len,
                    pv_status *st);
int pv_key_presence_index(const pv_keys *k, const char *kind, char *buf, size_t len, pv_status *st);

#endif
