/*
 * sched_place: one plan request against the registry, as pivirt-scheduler serves it: which nodes
 * take part (Eru's node filter), how many instances of the request fit on each (the resource
 * plugins), the plan (the strategies), and for a reservation the allocations on each node,
 * committed atomically (shared/store/pv_resv).
 *
 * The request body (a JSON object; shared/store/pv_sched.h carries it):
 *   {"pod": "p1", "includes": ["n1"], "excludes": [], "labels": {"k": "v"}, "all": false,
 *    "resources": {"cpumem": {"cpu-request": 1, "memory-request": "1G"}}, "strategy": 0,
 *    "count": 3, "nodes_limit": 0, "app": "", "entrypoint": "", "owner": "",
 *    "ttl_seconds": 600}
 * Node filter as Eru's: named nodes (includes) are taken whatever their pod and liveness;
 * otherwise the pod's nodes that match every label, skipping down ones (bypassed or not alive)
 * unless all; then excludes are removed.
 *
 * Replies:
 *   capacity: "pv-capacity N 1\n3 n1\n" (pv_sched.h's capacity lines, not JSON: the total, then
 *             each node by name; DUMMY: the capacity of every node where at least one instance
 *             fits; other strategies: the plan, as Eru's CalculateCapacity). As in Eru, nodes
 *             where nothing fits take no part in plans.
 *   reserve:  {"reservation": "resv-...", "total": N, "plan": {"n1": 2},
 *              "allocations": {"n1": [{"id": "resv-....0", "resources": {...}}]}}
 * Failures: a status code and Eru's error kind in *err (the caller makes the error reply).
 *
 * Ownership: sched_request owns what parsing allocated (sched_request_free); reply bodies are
 * malloc'd for the caller.
 */
#ifndef SCHED_PLACE_H
#define SCHED_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_resv.h"
#include "sched_cache.h"
#include "sched_strategy.h"

typedef struct sched_request {
    char *pod;
    char **includes, **excludes;
    size_t nincludes, nexcludes;
    char **label_keys, **label_values;
    size_t nlabels;
    int all;
    char *resources; /* the request object as JSON text, "{}" when none */
    int strategy;
    int64_t count, nodes_limit;
    char *app, *entry, *owner;
    int64_t ttl_seconds; /* reservations: how long they are held before the reaper frees them */
    uint64_t seed;       /* not in the body: the server's sched_seed_of(request id); ties between
                          * nodes go by it (sched_strategy.h), 0 = input (name) order */
    /* not in the body either: the request's stream entry, acknowledged by the reservation's
     * commit (borrowed; stream NULL: none), and *acked set true when it was (may be NULL) */
    pv_resv_ack ack;
    bool *acked;
} sched_request;

/* INVALID_ARGUMENT naming the field (in *st) for a malformed body or a bad resource request. */
int sched_request_parse(const char *json, sched_request *req, pv_status *st);
void sched_request_free(sched_request *req);

/* CalculateCapacity. On PV_OK *reply is the body. cache (NULL: one made for this call) keeps
 * the node records between calls (sched_cache.h). */
int sched_place_capacity(sched_cache *cache, pv_redis *r, const pv_keys *k,
                         const sched_request *req, char **reply, sched_error *err);

/*
 * A deploy's reservation: plans, allocates and commits, planning again from fresh data when
 * another scheduler's commit got there first. request_id (may be NULL) names the plan request:
 * the reservation id is derived from it (a retried request finds its reservation instead of
 * making a second one: ALREADY_EXISTS naming the reservation) and the commit writes the reply to
 * it atomically. On PV_OK the reply is written (or its requester has gone); *reply_out (may be
 * NULL) gets a copy of the body when this call wrote it.
 */
int sched_place_reserve(sched_cache *cache, pv_redis *r, const pv_keys *k, const sched_request *req,
                        const char *request_id, int64_t now_ms, char **reply_out, sched_error *err);

#endif
