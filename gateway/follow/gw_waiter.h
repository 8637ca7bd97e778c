/*
 * gw_waiter: the one place where WaitOperation and WatchOperation calls wait for Redis.
 *
 * A completion-queue thread must never park on a long Redis wait, so those handlers read the
 * record once, answer at once when it is already done, and otherwise hand the call here. One
 * thread runs a libev loop with an asynchronous hiredis connection in subscribe mode: it
 * SUBSCRIBEs the channel of each operation that at least one call waits on (pv_op_channel),
 * re-reads the record when a message arrives and pushes it to the waiting calls. A thousand
 * waiting clients cost a thousand small entries and one subscription per operation, not a
 * thousand threads.
 *
 * Modes:
 *   GW_WAITER_WAIT   answers the record (then OK) once it is done, or at timeout_ms with its
 *                    state at that moment.
 *   GW_WAITER_WATCH  sends the record on every change, ends with OK after the message in which
 *                    it is done. The caller has already sent the state it read (`sent`).
 *
 * Nothing is missed: the waiter subscribes first and reads the record after Redis confirmed the
 * subscription, so a change between the handler's read and the subscription is seen. When the
 * connection drops, the waiter reconnects with backoff, subscribes again and re-reads every
 * record. A client that goes away is dropped. At shutdown (gw_waiter_stop, also run by the
 * server's shutdown hook) every waiting call ends with UNAVAILABLE "gateway shutting down".
 *
 * Threads: gw_waiter_add runs on any thread and never blocks on Redis; everything else about a
 * waiting call happens on the waiter's thread.
 */
#ifndef GW_WAITER_H
#define GW_WAITER_H

#include <stdint.h>

#include "gw_app.h"
#include "gw_server.h"
#include "pv_op.h"

typedef struct gw_waiter gw_waiter;

typedef enum {
    GW_WAITER_WAIT,
    GW_WAITER_WATCH,
} gw_waiter_mode;

/* Makes a waiter for app's Redis (app must outlive it). NULL when out of memory. */
gw_waiter *gw_waiter_new(gw_app *app);

/* Registers the shutdown hook (before gw_server_start). Returns 0 or -1. */
int gw_waiter_register(gw_waiter *w, gw_server *server);

/* Starts the thread; it connects to Redis by itself (and keeps trying). Returns 0 or -1. */
int gw_waiter_start(gw_waiter *w);

/* Hands call c over: from now on the waiter answers it. op_id names the operation;
 * timeout_ms (GW_WAITER_WAIT only; > 0) is when to answer with the current state; sent
 * (GW_WAITER_WATCH only; may be NULL) is the state the caller already sent. Returns 0 when the
 * waiter took the call (it will answer it, with UNAVAILABLE when it is shutting down), -1 when
 * it could not (out of memory): the caller still owns the answer. */
int gw_waiter_add(gw_waiter *w, gw_call *c, const char *op_id, gw_waiter_mode mode,
                  int64_t timeout_ms, const pv_op *sent);

/* Ends every waiting call with UNAVAILABLE "gateway shutting down", stops the loop and joins
 * the thread. Later gw_waiter_add calls answer UNAVAILABLE at once. Idempotent. */
void gw_waiter_stop(gw_waiter *w);

/* Stops (if needed) and frees. Only after the server is shut down: a call that closes later
 * would still reach the waiter. */
void gw_waiter_free(gw_waiter *w);

#endif
