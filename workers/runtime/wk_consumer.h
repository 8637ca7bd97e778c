/*
 * wk_consumer: consumes one operation queue with a consumer group and runs what it receives.
 *
 * Threads, each with its own Redis connection (hiredis contexts are not shared):
 *   reader   XREADGROUP ... BLOCK for as many entries as there are free slots, and the
 *            housekeeping of the queue: XAUTOCLAIM of entries idle past the lease (their worker
 *            died), promotion of retries that are due, trimming below the oldest pending entry;
 *   pool     worker.concurrency threads: take the lease (pv_op_acquire), run the handler, write
 *            the outcome (finish, retry later with backoff, or hand back at shutdown);
 *   keeper   renews every held lease twice a second and tells handlers about cancellation and
 *            about a lost lease.
 * Redis going away is survived everywhere: calls fail fast, each loop logs the outage once and
 * backs off, and pv_redis reconnects by itself; a vanished group is created again.
 *
 * Ownership: wk_consumer_start copies what it needs from its options; wk_consumer_stop frees the
 * consumer when every thread has ended.
 */
#ifndef WK_CONSUMER_H
#define WK_CONSUMER_H

#include <stdbool.h>

#include "pv_config.h"
#include "pv_keys.h"
#include "pv_op.h"
#include "pv_redis.h"
#include "pv_status.h"

typedef struct wk_consumer wk_consumer;

/* A fresh delivery (read as new, never claimed from another worker) of an operation of the
 * consumer's prelease_kind, given to its pre-lease step before any lease is taken. Everything is
 * borrowed for the call; redis is the pool thread's connection. */
typedef struct wk_prelease {
    void *context;
    pv_redis *redis;
    const pv_keys *keys;
    const pv_config *cfg;
    const pv_op_opts *opts;
    const char *queue, *consumer, *op_id, *entry;
} wk_prelease;

/* true: the delivery was dealt with and its entry acknowledged (the operation went on elsewhere
 * without a lease here: wk_deploy_prelease); false: it goes the usual way, leased and run. */
typedef bool (*wk_prelease_fn)(const wk_prelease *p);

typedef struct wk_consumer_opts {
    const pv_config *cfg; /* redis.*, worker.*, ops.*, test_operations */
    const char *queue;    /* "ops" or "node:<name>" */
    const char *consumer; /* unique per process: "<host>-<pid>", "<node>-<pid>" */
    void *context;        /* given to every handler (wk_op_context); may be NULL */
    /* may be NULL; borrowed: pivirt_operation_duration_seconds{kind} (each delivery that ended
     * the operation) and pivirt_operations_handled_total{kind,outcome} (every delivery) */
    struct pv_metrics *metrics;
    /* may be NULL: the pre-lease step of the fresh deliveries of prelease_kind (borrowed) */
    const char *prelease_kind;
    wk_prelease_fn prelease;
} wk_consumer_opts;

/* Starts the threads. Redis need not be up yet (the reader waits for it). */
int wk_consumer_start(const wk_consumer_opts *o, wk_consumer **out, pv_status *st);

/* Graceful stop: no new entries are read from this moment; running handlers are told to stop
 * and get worker.shutdown_ms to return, and what they leave unfinished is handed back to the
 * queue (pv_op_release) for another worker. Returns true when every thread ended and c is freed;
 * false when a handler ignored the stop past the deadline: its operation was handed back anyway
 * (its later writes are refused by fencing) and c stays allocated for the thread still using it,
 * which the exiting process then abandons. */
bool wk_consumer_stop(wk_consumer *c);

#endif
