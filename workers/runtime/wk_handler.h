/*
 * wk_handler: the handlers of operation kinds and the context a running operation gives them.
 *
 * A handler is a plain function registered in a static table by kind. It gets a wk_op, the
 * running operation: its record (read only), its parameters, and fenced ways to report progress
 * and to run journaled steps. Delivery is at least once, so a handler is written as a sequence of
 * idempotent steps (wk_op_step): a redelivered operation finds the results of the steps it already
 * did in the journal and resumes after them.
 *
 * A handler stops early when wk_op_should_stop says so and returns the code of wk_op_stop_code:
 *   PV_CANCELLED   cancellation was requested: the operation ends CANCELLED (error code 1);
 *   PV_ABORTED     the lease was lost (another worker owns the operation now): nothing more is
 *                  written by this worker;
 *   PV_UNAVAILABLE the worker is shutting down: the operation is handed back to the queue.
 * Any other failure is returned as a code with its message in st: transient codes (UNAVAILABLE,
 * DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED) are retried with backoff, others fail it.
 *
 * Threads: a wk_op is used by the thread that runs its handler; the consumer's lease keeper and
 * shutdown path only set its stop flags (wk_op_set_*), which are guarded by the op's own lock.
 *
 * Ownership: wk_op_new takes over the strings of the record it is given; wk_op_free releases
 * everything. Strings returned by wk_op_param live as long as the op. Results of wk_op_step are
 * malloc'd for the caller.
 */
#ifndef WK_HANDLER_H
#define WK_HANDLER_H

#include <stdbool.h>
#include <stdint.h>

#include "pv_config.h"
#include "pv_op.h"
#include "pv_redis.h"
#include "pv_status.h"

typedef struct wk_op wk_op;

/* A handler: PV_OK when the operation succeeded, else a code with its message in st. The
 * function type declares a module's handlers in one line (`wk_op_handler wk_x_list, wk_x_add;`). */
typedef int wk_op_handler(wk_op *op, pv_status *st);
typedef wk_op_handler *wk_handler_fn;

/* One journaled step: does its work (idempotently) and returns its result as a malloc'd string
 * in *result (never NULL on PV_OK; "" is fine), which the journal keeps. */
typedef int (*wk_step_fn)(wk_op *op, void *arg, char **result, pv_status *st);

/* --- for handlers ---------------------------------------------------------------------------- */

const pv_op *wk_op_record(const wk_op *op);

/* The value of a top-level key of the params JSON object as text (strings as they are, numbers
 * and booleans in their JSON form), or NULL when absent, null, an object or an array. */
const char *wk_op_param(wk_op *op, const char *key);

/* A parameter as an integer: def when absent; PV_INVALID_ARGUMENT naming the key and the value
 * when it is not an integer within [min, max]. */
int wk_op_param_int(wk_op *op, const char *key, long def, long min, long max, long *out,
                    pv_status *st);

/* Fenced progress report (percent 0..100, message formatted). Returns PV_OK, or the stop code
 * (see above) when the handler should stop. Redis being unreachable is not the handler's
 * problem: progress is informational, the call then returns PV_OK. */
int wk_op_progress(wk_op *op, int percent, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

bool wk_op_should_stop(wk_op *op);

/* From now on a cancel no longer stops the handler (sleeps, steps and progress go on; a lost
 * lease or a shutdown still do): for the undo work a cancelled operation must finish, such as
 * an upgrade's rollback. The operation still ends CANCELLED when a cancel was requested. */
void wk_op_begin_cleanup(wk_op *op);

/* PV_OK while the handler may go on; else the stop code with its reason in st. */
int wk_op_stop_code(wk_op *op, pv_status *st);

/* Sleeps ms milliseconds, waking at once when the handler should stop (returns the stop code). */
int wk_op_sleep(wk_op *op, int ms, pv_status *st);

/* A journaled idempotent step named `step`: when the journal has it, its recorded result is
 * returned without running fn; else fn runs and its result is journaled (fenced) before this
 * returns. *result (if result is not NULL) is the caller's to free. Redis being briefly
 * unreachable is waited out (up to about a lease); a lost lease is PV_ABORTED. */
int wk_op_step(wk_op *op, const char *step, wk_step_fn fn, void *arg, char **result, pv_status *st);

/* wk_op_step whose new answer is not journaled at once but held until the next
 * wk_op_output_step, which writes it with its output in the same call (a round trip less; until
 * then a redelivery runs fn again, as after a crash between fn and its journal entry, which a
 * step must take anyway). Any other step journals it on its own first. */
int wk_op_step_pending(wk_op *op, const char *step, wk_step_fn fn, void *arg, char **result,
                       pv_status *st);

/* *has: whether the journal has `step` (asked of Redis only on a redelivery: a first delivery's
 * journal is what it wrote itself). Outages are waited out as in wk_op_step. */
int wk_op_journaled(wk_op *op, const char *step, bool *has, pv_status *st);

/* A journaled output: unless the journal has `step`, one fenced call writes the output entry of
 * n fields, the journal entry `step` (empty) and the pending answer of wk_op_step_pending, if
 * any, atomically (pv_op_output_journal); so a redelivered operation does not tell its client
 * twice. Outages are waited out as in wk_op_step; a lost lease is PV_ABORTED. */
int wk_op_output_step(wk_op *op, const char *step, size_t n, const char *const *fields,
                      const char *const *values, pv_status *st);

/* Hands the operation over to `queue` (pv_op_handover: PENDING there with params_json, the
 * output entry of n fields written with it, not taken in timeout_ms: back to the ops queue with
 * a cancel): the handler returns PV_OK at once after it, and the consumer writes no outcome,
 * the worker of `queue` will. A pending answer of wk_op_step_pending is dropped: the params
 * must carry what the rest of the operation needs of it. Outages are waited out as in
 * wk_op_step; a lost lease is PV_ABORTED. */
int wk_op_handover(wk_op *op, const char *queue, const char *params_json, int timeout_ms, size_t n,
                   const char *const *fields, const char *const *values, pv_status *st);

/* Whether the operation was handed over (the consumer then writes no outcome). */
bool wk_op_handed_over(const wk_op *op);

/* wk_op_output_step for a run's last word: the entry is told with the operation's end, in the
 * same call (pv_op_finish_output), when this run ends it SUCCEEDED, FAILED or CANCELLED: a
 * fenced call less. Nothing of it is journaled: a run that does not end here (a retry, a lost
 * lease, a shutdown) tells nothing, and its redelivery runs the steps again (a pending answer
 * of wk_op_step_pending is not journaled either). Any later step or output of the run writes
 * it first, as wk_op_output_step would; the strings are copied. */
int wk_op_output_at_end(wk_op *op, const char *step, size_t n, const char *const *fields,
                        const char *const *values, pv_status *st);

/* The entry wk_op_output_at_end left for the end (for the consumer): its fields and values
 * (owned by op), and their number (0: none). */
size_t wk_op_end_output(const wk_op *op, const char *const **fields, const char *const **values);

/* Fails the operation with code and the formatted message in st, for good: no retry even when
 * the code is one wk_code_transient names (a drain's RESOURCE_EXHAUSTED is its answer, not a
 * passing fault). Returns code. */
int wk_op_fail_final(wk_op *op, pv_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The record's last message if the handler succeeds, written by the end itself (what a
 * wk_op_progress(op, 100, ...) just before the end would say, without its round trip). */
void wk_op_set_end_message(wk_op *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* That message, "" when none (for the consumer). */
const char *wk_op_end_message(const wk_op *op);

/* Whether the handler's failure was made final by wk_op_fail_final. */
bool wk_op_failure_final(const wk_op *op);

/* The Redis connection of the thread running the handler (for the handler's own commands). */
pv_redis *wk_op_redis(wk_op *op);
const pv_keys *wk_op_keys(const wk_op *op);
const pv_op_opts *wk_op_opts(const wk_op *op);

/* What the worker gives its handlers (wk_env.context): the node agent's engine, for instance. */
void *wk_op_context(const wk_op *op);

/* The process's configuration, or NULL (handlers then use the defaults). */
const pv_config *wk_op_config(const wk_op *op);

/* A fenced entry on the operation's output stream (pv_op_output_add): what a streaming call
 * relays to its client. PV_ABORTED when the lease is lost (the op then stops). */
int wk_op_output(wk_op *op, size_t n, const char *const *fields, const char *const *values,
                 pv_status *st);

/* --- for the consumer ------------------------------------------------------------------------ */

/* What a running operation needs from its worker: shared by every op of a thread. */
typedef struct wk_env {
    pv_redis *redis; /* the thread's connection */
    const pv_keys *keys;
    const pv_op_opts *opts;
    int lease_ms;
    bool test_operations; /* test.* kinds are runnable */
    void *context;        /* the role's state for its handlers (wk_op_context); may be NULL */
    const pv_config *cfg; /* the process's configuration (wk_op_config); may be NULL in tests */
} wk_env;

/* Takes over the strings of *rec (which is left zeroed) for an operation leased with token. */
int wk_op_new(const wk_env *env, pv_op *rec, int64_t token, wk_op **out, pv_status *st);
void wk_op_free(wk_op *op);
int64_t wk_op_token(const wk_op *op);

/* Stop flags, set by the lease keeper and the shutdown path; each wakes wk_op_sleep. */
void wk_op_set_cancel(wk_op *op);
void wk_op_set_lost(wk_op *op, const char *why);
void wk_op_set_shutdown(wk_op *op);
bool wk_op_is_lost(wk_op *op);
bool wk_op_is_cancelled(wk_op *op);

/* Runs the handler of the operation's kind. An unknown kind (or a test.* kind while test
 * operations are off) is PV_INVALID_ARGUMENT "no handler for kind X". */
int wk_handler_run(wk_op *op, pv_status *st);

/* A uniformly random integer in [lo, hi] (per-thread generator; for jitter, not secrets). */
int wk_random_between(int lo, int hi);

/* True for the codes that are worth another delivery after a backoff. */
bool wk_code_transient(int code);

#endif
