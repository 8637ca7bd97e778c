/*
 * sched_cache: the node records a scheduler has read and parsed, kept between plan requests.
 *
 * A plan over a 1,000-node pod is dominated by reading and parsing the node records, not by the
 * strategies. Every write of a node record bumps its `rev` (shared/store/redis/registry.lua and
 * sched.lua), so the scheduler asks Redis only for each node's id, rev and liveness
 * (pv_sched_view), and re-reads the few records whose rev moved. Liveness is never cached: it
 * comes with every view. Entries of nodes no view has named for a while are dropped.
 *
 * Ownership: the cache owns its entries; pointers to them stay valid until the next call that
 * takes the cache (sched_cache_view, sched_cache_node, sched_cache_sweep). One thread only.
 */
#ifndef SCHED_CACHE_H
#define SCHED_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_res.h"

typedef struct sched_cache sched_cache;

typedef struct sched_cache_entry {
    pv_node rec;     /* the record as read (rec.alive: as of the last view) */
    pv_res_node res; /* rec's resources and usage, parsed */
    bool res_ok;     /* false: the record does not parse; res_err says why */
    char res_err[512];
    int64_t last_used_ms;
} sched_cache_entry;

sched_cache *sched_cache_new(void);
void sched_cache_free(sched_cache *c);

/*
 * The nodes of a pod in name order, fresh: *out is a malloc'd array of n pointers into the cache
 * (the caller frees the array, not the entries). NOT_FOUND when the pod does not exist.
 */
int sched_cache_view(sched_cache *c, pv_redis *r, const pv_keys *k, const char *pod,
                     sched_cache_entry ***out, size_t *n, pv_status *st);

/* One node by name, read now (named nodes are few; their liveness must be exact). */
int sched_cache_node(sched_cache *c, pv_redis *r, const pv_keys *k, const char *name,
                     sched_cache_entry **out, pv_status *st);

/* Drops entries not used for max_idle_ms. */
void sched_cache_sweep(sched_cache *c, int64_t max_idle_ms);

/* Counters for the log: entries held, records read since the start, views served. */
void sched_cache_stats(const sched_cache *c, size_t *entries, uint64_t *reads, uint64_t *views);

#endif
