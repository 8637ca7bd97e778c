/*
 * pv_sched: the plan-request protocol between the processes that need a plan (gateways now,
 * ops workers for deploys) and the schedulers (pivirt-scheduler, any number of them).
 *
 * A requester adds an entry to the request stream and blocks on its own reply list; one
 * scheduler of the consumer group takes the entry, computes, and pushes the reply. Keys (under
 * the registry's hash tag, <b> = "<prefix>{reg}:"):
 *   <b>sched:requests     stream, group PV_SCHED_GROUP; fields: id kind body deadline_ms
 *   <b>sched:reply:<id>   list holding the one reply body; expires a minute after it is written;
 *                         not in the AOF nor replicated (a message to a waiting connection,
 *                         which a restart ends anyway: sched.lua's push_reply)
 *   <b>sched:gone:<id>    set when the requester gave up waiting
 * A requester that times out marks its request gone in the same atomic step that checks for a
 * late reply (pv_sched_abandon in shared/store/redis/sched.lua), and a reservation's commit refuses
 * a gone request, so a reservation is either seen by its requester or never made: nothing leaks
 * when a deadline passes mid-plan.
 *
 * Reply bodies are JSON objects, but for capacity (below); a failure is {"error": {"code": N
 * (pv_status code), "kind": "ErrInsufficientResource"|..., "message": "..."}}, written compact so
 * that it starts with PV_SCHED_ERROR_START, and no other reply does: the requester parses only
 * those.
 *
 * A capacity reply (kind "capacity") is lines, not JSON: a DUMMY answer names every node of the
 * pod, and parsing a 10,000-key JSON object (a hash table and allocations per node) cost the
 * gateway more CPU than the scheduler spent on the plan. pv_sched_capacity_write writes it and
 * pv_sched_capacity_parse reads it in place, nothing else does:
 *   "pv-capacity <total> <n>\n"      then n lines
 *   "<count> <node name>\n"
 * total and count decimal, >= 0; names 1..PV_SCHED_NAME_MAX bytes without '\n' or NUL (registry
 * names are [A-Za-z0-9._-]), in the order they were given (the plan's: by name).
 *
 * Ownership: reply strings handed out are malloc'd, the caller frees them.
 */
#ifndef PV_SCHED_H
#define PV_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"

#define PV_SCHED_GROUP "schedulers"
#define PV_SCHED_REPLY_TTL_S 60
#define PV_SCHED_ERROR_START "{\"error\":"
#define PV_SCHED_GONE_TTL_S 600

int pv_sched_key_requests(const pv_keys *k, char *buf, size_t len, pv_status *st);
int pv_sched_key_reply(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st);
int pv_sched_key_gone(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st);

typedef struct pv_sched_call_opts {
    int64_t timeout_ms;          /* > 0: how long to wait for the reply */
    int (*cancelled)(void *arg); /* may be NULL: polled while waiting; non-zero stops */
    void *arg;
    /* NULL: a fresh "plan-<ulid>". Else "plan-<...>" chosen by the caller, so that asking again
     * (an operation redelivered after a crash) names the same reservation "resv-<...>": the
     * answer is then ALREADY_EXISTS, and pv_resv_get reads what was reserved. */
    const char *request_id;
} pv_sched_call_opts;

/*
 * Sends one request (kind "capacity" or "reserve", body a JSON object) and waits for its reply.
 * UNAVAILABLE "no scheduler is running" when no pivirt-scheduler is live; DEADLINE_EXCEEDED when
 * no reply came in time, CANCELLED when opts->cancelled said so (the request is abandoned in both
 * cases). A reply carrying "error" becomes that status and message (*reply NULL). On PV_OK
 * *reply is the reply body.
 */
int pv_sched_call(pv_redis *r, const pv_keys *k, const char *kind, const char *body,
                  const pv_sched_call_opts *opts, char **reply, pv_status *st);

/* Scheduler side: pushes a reply body for request id unless its requester has gone. */
int pv_sched_reply(pv_redis *r, const pv_keys *k, const char *id, const char *body, pv_status *st);

#define PV_SCHED_CAPACITY_START "pv-capacity "
#define PV_SCHED_NAME_MAX 1024

/* A capacity reply read in place: names point into the body parsed (which must outlive them). */
typedef struct pv_sched_capacity {
    int64_t total;
    size_t n;
    const char **names; /* malloc'd array (pv_sched_capacity_clear) */
    int64_t *counts;    /* malloc'd array */
} pv_sched_capacity;

/* The body for n nodes (names[i] gets counts[i]) and the total: malloc'd into *body.
 * INVALID_ARGUMENT naming the node for a name the format cannot carry, a negative count. */
int pv_sched_capacity_write(const char *const *names, const int64_t *counts, size_t n,
                            int64_t total, char **body, pv_status *st);

/* Reads a body pv_sched_capacity_write wrote; body is modified (each line's end becomes NUL).
 * INTERNAL naming the line for anything else. On failure *out holds nothing. */
int pv_sched_capacity_parse(char *body, pv_sched_capacity *out, pv_status *st);
void pv_sched_capacity_clear(pv_sched_capacity *c);

/* {"error": {...}} for a status (code and message) and an Eru error kind ("" for none).
 * NULL when out of memory. */
char *pv_sched_error_body(const pv_status *err, const char *kind);

#endif
