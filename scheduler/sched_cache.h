/*
 * sched_cache: the node records a scheduler has read and parsed, kept between plan requests.
 *
 * A plan over a 10,000-node pod must not read 10,000 records. Every write of a node that a plan
 * can see (its usage and allocations, resources, labels, bypass; its addition and removal) bumps,
 * in the same Redis function, a registry-wide change counter and the node's entry in a sorted
 * set of node -> last change (node-revs, shared/store/redis/sched.lua). So a view asks Redis
 * once for the nodes changed since the counter it last saw and the nodes not alive now
 * (pv_sched_changes: cost proportional to what changed, not to the pod), and re-reads only
 * those records: only the usage of a node whose every write since was a usage write (a
 * reservation's, a workload's), told by its revisions (pv_sched_nodes_since). Liveness comes with
 * every view (the alive keys' expiries are mirrored in node-alive), so a node that stopped beating
 * is down in the next plan. The cache holds every node of the registry (it must, to follow the
 * change feed); another epoch of the index, an index that went back (a Redis restarted empty) or a
 * node removed makes the next view read the whole index again and drop what left it.
 *
 * The deploy counts of the apps planned last (Eru's `count`: instances of an app/entrypoint per
 * node) are kept too. Every Redis function that changes a node's count for an app changes the
 * node's usage, and so its usage_rev, in the same step (pv_sched_commit and pv_sched_release,
 * a workload's removal and reincarnation): a count read at usage_rev R is the current one as
 * long as the node's record is still at R. So a plan re-reads only the counts of the nodes whose
 * usage_rev moved since it last read them (one HMGET of those names), not the app's whole
 * count hash: O(changes), not O(nodes). A full read of the index (another epoch, a node
 * removed, a Redis that went back) forgets every cached count.
 *
 * Staleness cannot overcommit: a reservation commits with the usage_rev of each node it
 * touches and pv_sched_commit refuses the whole commit if any moved (then plans again).
 *
 * Ownership: the cache owns its entries; pointers to them stay valid until the next call that
 * takes the cache (sched_cache_view, sched_cache_node). One thread only.
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

#define SCHED_CACHE_NAME_INLINE 64

typedef struct sched_cache_entry {
    /* What every plan reads of every node, first and together (entries are 64-byte aligned): a
     * 10,000-node plan is bound by the cache misses of touching each entry, so these are one
     * line, the name the next, the parsed resources the two after, and rec (read by
     * reservations) after them. */
    uint64_t name_key;  /* sched_name_key(rec.name) */
    uint64_t dead_view; /* the view that listed it not alive */
    int64_t seq;        /* the change index's seq for it when it was read (0: not from it) */
    int64_t usage_rev;  /* rec.usage_rev: its deploy counts can only have moved with it */
    const char *name;   /* rec.name: name_buf when it fits there */
    uint32_t slot;      /* a small number of its own while it is held (sched_cache_deploy_counts) */
    bool res_ok;        /* false: the record does not parse; res_err says why */
    bool listed;        /* a full read of the index named it (entries it did not name go) */
    bool bypass;        /* rec.bypass */
    bool alive;         /* as of the last view (rec.alive: as read) */
    _Alignas(64) char name_buf[SCHED_CACHE_NAME_INLINE];
    pv_res_node res; /* rec's resources and usage, parsed */
    pv_node rec;     /* the record as read */
    char res_err[512];
} sched_cache_entry;

/* Entries are far apart in memory and cold at each plan: loops over a pod's entries ask for
 * the one SCHED_PREFETCH ahead (its line `line`, 0..3) while working on this one. */
#define SCHED_PREFETCH 8
#define SCHED_PREFETCH_LINE(e, line) __builtin_prefetch((const char *)(e) + 64 * (line))

sched_cache *sched_cache_new(void);
void sched_cache_free(sched_cache *c);

/*
 * The nodes of a pod in name order, fresh: *out is a malloc'd array of n pointers into the cache
 * (the caller frees the array, not the entries). NOT_FOUND when the pod does not exist.
 */
int sched_cache_view(sched_cache *c, pv_redis *r, const pv_keys *k, const char *pod,
                     sched_cache_entry ***out, size_t *n, pv_status *st);

/*
 * Requests read together (one XREADGROUP) are planned on one view: between sched_cache_batch(c,
 * true) and sched_cache_batch(c, false), a view of a pod the cache holds nodes of asks Redis for
 * changes (pv_sched_changes: a call) only until one view of the batch did, and again whenever
 * the cache learned it is behind (sched_cache_behind; a commit over a record another writer
 * moved: sched_cache_wrote). Every commit is a compare-and-set of each node's usage_rev, so a
 * plan over a node whose usage moved since is refused and planned again on a fresh view; what a
 * later plan of the batch may not see is a node's liveness, labels or bypass changed within the
 * batch's milliseconds, as if it had been planned when the batch was read.
 */
void sched_cache_batch(sched_cache *c, bool on);
void sched_cache_behind(sched_cache *c);

/* Follows the change index now, with no pod in mind: the daemon calls it when it starts (a cold
 * cache of 10,000 nodes is read before the first request, not during it) and on its tick. */
int sched_cache_refresh(sched_cache *c, pv_redis *r, const pv_keys *k, pv_status *st);

/* One node by name, read now (named nodes are few; their liveness must be exact). */
int sched_cache_node(sched_cache *c, pv_redis *r, const pv_keys *k, const char *name,
                     sched_cache_entry **out, pv_status *st);

/*
 * The deploy counts of app/entry on the entries e[0..n) of this cache's last sched_cache_view
 * (a node's count is read again only when its usage_rev moved since it was read): counts[i]
 * for e[i], 0 when it has none. All 0 when app is NULL or "". The counts are as fresh as the
 * view's records; pv_sched_commit refuses a plan over a node whose usage_rev moved since, and a
 * count cannot move without it. The counts of the SCHED_COUNT_APPS apps used last are kept.
 */
#define SCHED_COUNT_APPS 16
int sched_cache_deploy_counts(sched_cache *c, pv_redis *r, const pv_keys *k, const char *app,
                              const char *entry, sched_cache_entry *const *e, size_t n,
                              int64_t *counts, pv_status *st);

/*
 * A reservation allocates on the cache's parsed nodes in place (no copy, no parse) and then tells
 * the cache how its commit went, for each node it allocated on:
 * - committed (pv_resv_commit's rev_before and seq_after): sched_cache_wrote. When the record's
 *   rev before the write is the entry's, nothing else wrote it in between (every write of a
 *   record bumps its rev): the entry takes the new usage (usage, malloc'd, taken over), the
 *   bumped revisions and seq_after, so the next view does not read it again; app/entry's cached
 *   count there goes up by added. Otherwise the entry is parsed again from its record (the next
 *   view reads the node: its seq moved).
 * - not committed (a conflict, a duplicate, an error): sched_cache_reparse, which parses the
 *   entry again from its record, as read.
 */
void sched_cache_wrote(sched_cache *c, sched_cache_entry *e, char *usage, int64_t rev_before,
                       int64_t seq_after, int64_t written_ms, const char *app, const char *entry,
                       int64_t added);
void sched_cache_reparse(sched_cache_entry *e);

/* Counters for the log and the tests: entries held, records read since the start, views
 * served, deploy counts read from Redis since the start (one per node and app read), and of the
 * records read, those read as their usage alone (only usage writes since the entry's revisions:
 * the rest of the entry is current). */
void sched_cache_stats(const sched_cache *c, size_t *entries, uint64_t *reads, uint64_t *views);
uint64_t sched_cache_count_reads(const sched_cache *c);
uint64_t sched_cache_usage_reads(const sched_cache *c);

#endif
