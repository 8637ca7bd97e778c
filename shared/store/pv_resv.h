/*
 * pv_resv: reservations of node resources, committed atomically.
 *
 * A deploy first reserves what its instances will hold (cores, memory, volumes) on the nodes its
 * plan picked; the workloads that follow take over the allocations, and a deploy that fails gives
 * them back. Reservations are what keep concurrent deploys from overcommitting a node across any
 * number of gateways and schedulers: the resource arithmetic is done in C on a snapshot of the
 * nodes (shared/core/pv_res), and the commit is one Redis function (shared/store/redis/sched.lua)
 * that writes the new usage only if no node it touches changed since the snapshot (each node's
 * usage_rev). A commit that loses the race reports the conflict; the caller plans again.
 *
 * Keys (under the registry's hash tag, <b> = "<prefix>{reg}:"):
 *   <b>resv:<id>                  hash: id pod owner app entry expires_ms created_ms nodes, where
 *                                 nodes is a JSON object node id -> {"name": .., "allocs":
 *                                 [allocation ids]}
 *   <b>resvs                      zset: reservation id by expires_ms (those with an expiry)
 *   <b>node-allocs:<node id>      hash: allocation id -> allocation object (pv_res.h)
 *   <b>deploy-count:<app>:<entry> hash: node name -> instances of that app/entrypoint reserved
 *                                 there (the `count` of Eru's strategies). Whatever changes a
 *                                 node's count changes its usage_rev in the same function: the
 *                                 schedulers keep counts by it (scheduler/sched_cache.h)
 * and each node record's usage / usage_rev fields (pv_registry.h).
 * Allocation ids are "<reservation id>.<n>", n counting from 0 across the reservation.
 *
 * Ownership: pv_resv_node and pv_resv own their strings and arrays; pv_resv_clear releases them
 * (safe on a zeroed struct). Functions that take a pv_resv borrow it.
 */
#ifndef PV_RESV_H
#define PV_RESV_H

#include <stddef.h>
#include <stdint.h>

#include "pv_id.h"
#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"

typedef struct pv_resv_node {
    char id[PV_ID_MAX];
    char *name;
    int64_t rev; /* the usage_rev the new usage was computed from */
    char *usage; /* the node's usage object after the change */
    size_t nallocs;
    char **alloc_ids; /* nallocs ids */
    char **allocs;    /* nallocs allocation objects (JSON) */
    /* Set by pv_resv_commit when it commits: the node record's rev just before this write, its
     * seq in the schedulers' change index (pv_sched.h) just after it, and Redis's clock then
     * (updated_ms). */
    int64_t rev_before, seq_after, written_ms;
} pv_resv_node;

typedef struct pv_resv {
    char id[PV_ID_MAX]; /* "resv-<ulid>" */
    char *pod;
    char *owner;        /* who will use it (an operation id), "" when none */
    char *app, *entry;  /* for the deploy counts; "" = not counted */
    int64_t expires_ms; /* wall-clock ms after which the reaper releases it; 0 = never */
    size_t nnodes;
    pv_resv_node *nodes;
} pv_resv;

void pv_resv_clear(pv_resv *rv);

/* Adds an empty node entry (name copied) and returns it, or NULL when out of memory. */
pv_resv_node *pv_resv_add_node(pv_resv *rv, const char *id, const char *name, int64_t rev);

/* Appends an allocation (copied) to a node entry, naming it "<rv id>.<seq>". */
int pv_resv_node_add_alloc(pv_resv_node *n, const char *resv_id, size_t seq, const char *alloc,
                           pv_status *st);

typedef enum {
    PV_RESV_COMMITTED = 0,
    PV_RESV_CONFLICT,  /* a node moved since the snapshot: plan again */
    PV_RESV_DUPLICATE, /* this reservation id exists already (a retried request) */
    PV_RESV_ABANDONED, /* the requester gave up (pv_sched_abandon): nothing written */
} pv_resv_outcome;

/*
 * Commits rv: writes every node's new usage and allocations, the reservation record and, when
 * request_id is not NULL, the plan reply reply_body for that request (kept reply_ttl_s seconds),
 * all or nothing. *conflict (may be NULL, PV_NAME_MAX bytes is plenty: 256) gets the name of
 * the node that moved on PV_RESV_CONFLICT. On PV_RESV_COMMITTED each node's rev_before,
 * seq_after and written_ms are set (the rest of rv is only read).
 */
int pv_resv_commit(pv_redis *r, const pv_keys *k, pv_resv *rv, const char *request_id,
                   const char *reply_body, int reply_ttl_s, pv_resv_outcome *out, char *conflict,
                   size_t conflict_len, pv_status *st);

/* A stream entry a commit acknowledges in its group when it commits (borrowed strings): the
 * plan request it answers, so that the request ends in the commit's call (sched_server.c). */
typedef struct pv_resv_ack {
    const char *stream, *group, *entry;
} pv_resv_ack;

/* pv_resv_commit that also acknowledges ack (may be NULL: none) on PV_RESV_COMMITTED, and only
 * then: any other outcome leaves the entry pending for the caller. */
int pv_resv_commit_acking(pv_redis *r, const pv_keys *k, pv_resv *rv, const char *request_id,
                          const char *reply_body, int reply_ttl_s, const pv_resv_ack *ack,
                          pv_resv_outcome *out, char *conflict, size_t conflict_len, pv_status *st);

/*
 * Gives a reservation's allocations back: reads it and its nodes, subtracts each allocation from
 * the node's usage (pv_res), and commits with the same compare-and-set, retrying on conflicts.
 * NOT_FOUND when the reservation does not exist (released already).
 */
int pv_resv_release(pv_redis *r, const pv_keys *k, const char *resv_id, pv_status *st);

/* Reads a reservation back: its record and, per node, its allocation ids with their documents
 * (allocs[i] NULL for an allocation a workload has taken over, or that was released). The
 * nodes' rev and usage are not read (0 and NULL). NOT_FOUND when it does not exist. */
int pv_resv_get(pv_redis *r, const pv_keys *k, const char *resv_id, pv_resv *out, pv_status *st);

/* Removes a workload record and gives what it held back to its node, atomically (compare-and-set
 * on the node's usage_rev, retried): the node's usage minus the workload's resources, its deploy
 * count minus one. NOT_FOUND when the workload is not recorded. A usage that would go below zero
 * (it drifted) is clamped and logged; GetNodeResource's fix repairs it. */
int pv_resv_return_workload(pv_redis *r, const pv_keys *k, const char *workload_id, pv_status *st);

/* pv_resv_return_workloads' outcome of a workload not settled (yet). */
/* At most this many workloads go back in one call of the Redis function: its Lua unpacks their
 * keys into one DEL, and Lua 5.1 unpacks fewer than 8,000 values; a node part of a removal can
 * name tens of thousands (ids in a 4 MiB request). More take several calls, each atomic. */
#define PV_RESV_RETURN_BATCH 256
#define PV_RESV_UNSETTLED (-1)

/* One workload of pv_resv_return_workloads: id and epoch are the caller's (borrowed), outcome
 * and moved_epoch are set. */
typedef struct pv_resv_return {
    const char *id;
    int64_t epoch;       /* the instance's incarnation on node; 0: not checked */
    int outcome;         /* PV_OK: removed and given back; PV_NOT_FOUND: not recorded (removed
                          * before); PV_FAILED_PRECONDITION: replaced elsewhere, the record is
                          * another incarnation (at moved_epoch): left alone */
    int64_t moved_epoch; /* with PV_FAILED_PRECONDITION */
} pv_resv_return;

/* pv_resv_return_workload for n workloads (ids distinct), one node's part of a removal: what
 * the workloads of one node held goes back in one compare-and-set of that node (one usage write
 * and one change-index entry for all of them, not one each). A workload with an epoch whose
 * record is another incarnation than node's instance at that epoch (pv_workload_ha_check's
 * MOVED, checked atomically with the removal) is left alone. PV_OK with every outcome set, else
 * a Redis error or PV_ABORTED when the nodes' usage kept changing (outcomes of the workloads
 * not reached stay PV_RESV_UNSETTLED). */
int pv_resv_return_workloads(pv_redis *r, const pv_keys *k, const char *node, pv_resv_return *w,
                             size_t n, pv_status *st);

/* A failover's replacement of workload_id, made on node at epoch (the claim's, pv_workload.h),
 * takes the record over: it moves to node with engine_id (and labels, "" = kept), takes the
 * reservation's allocation alloc_id, and what it held goes back to its old node, atomically
 * (compare-and-set on the old node's usage, as above). FAILED_PRECONDITION when the record is at
 * another epoch; done already: PV_OK. */
int pv_resv_reincarnate_workload(pv_redis *r, const pv_keys *k, const char *workload_id,
                                 const char *node, int64_t epoch, const char *alloc_id,
                                 const char *engine_id, const char *labels, pv_status *st);

/* ReallocResource's accounting: the workload's allocation plus delta_json (a resources object of
 * deltas: {"cpumem": {"cpu-request": 0.5, "memory-limit": "-256M", ...}, "storage":
 * {"storage-request": "1G"}}, each may be negative), checked to fit on its node and written with
 * the node's usage in one compare-and-set step. INVALID_ARGUMENT for a bad delta or a result
 * below zero, FAILED_PRECONDITION for a cpu change of a workload bound to cores,
 * RESOURCE_EXHAUSTED naming the node when it does not fit. *new_alloc (may be NULL) gets the
 * new allocation (caller frees). */
int pv_resv_realloc_workload(pv_redis *r, const pv_keys *k, const char *workload_id,
                             const char *delta_json, char **new_alloc, pv_status *st);

/* Ids of the reservations whose expiry is at or before now_ms (at most max). *ids is a malloc'd
 * array of malloc'd strings (pv_resv_ids_free); NULL when none. */
int pv_resv_expired(pv_redis *r, const pv_keys *k, int64_t now_ms, size_t max, char ***ids,
                    size_t *n, pv_status *st);
void pv_resv_ids_free(char **ids, size_t n);

/* Ids of reservations whose owner operation ("op-..." owners only) ended (SUCCEEDED, FAILED or
 * CANCELLED) more than grace_ms before now_ms, or has no record, among those made more than
 * grace_ms ago: an operation that ends without giving its reservation back (a one-node create
 * dead-lettered, or cancelled while its node's delivery failed) would otherwise hold the
 * allocations until the reservation expires. Looks at up to max reservations from position
 * *cursor of the expiry index and moves *cursor on (back to 0 after the last): a sweep over
 * calls. *ids as pv_resv_expired. */
int pv_resv_orphaned(pv_redis *r, const pv_keys *k, int64_t now_ms, int64_t grace_ms,
                     size_t *cursor, size_t max, char ***ids, size_t *n, pv_status *st);

/* Deploy counts of app/entry: fills counts[i] for names[i] (0 when absent). Up to
 * PV_RESV_COUNTS_BY_NAME names are read by name (HMGET: what a scheduler whose counts are cached
 * reads after a few changes), more with the whole hash (HGETALL: at most one field per node). */
#define PV_RESV_COUNTS_BY_NAME 512
int pv_resv_deploy_counts(pv_redis *r, const pv_keys *k, const char *app, const char *entry,
                          const char *const *names, size_t n, int64_t *counts, pv_status *st);

/*
 * GetNodeResource for one node: its usage as recorded, the usage its reserved allocations and its
 * workloads' resources (pv_workload.h) add up to, and the differences between the two (one message
 * per plugin field that differs, Eru's `diffs`). With fix, the recorded usage is rewritten to the
 * sum (compare-and-set; retried). Strings are malloc'd (caller frees; *diffs with
 * pv_resv_ids_free).
 */
typedef struct pv_resv_check {
    char *resources; /* full resources object (defaults materialised) */
    char *usage;     /* the usage after the call (the sum when fixed) */
    char **diffs;
    size_t ndiffs;
    double cpu_percent, memory_percent, storage_percent, volume_percent;
} pv_resv_check;
int pv_resv_check_node(pv_redis *r, const pv_keys *k, const char *node_name, int fix,
                       pv_resv_check *out, pv_status *st);
void pv_resv_check_clear(pv_resv_check *c);

#endif
