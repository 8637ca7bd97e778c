/*
 * pv_op: Operation records on Redis streams, the spine of pivirt.
 *
 * Every long-running call becomes an Operation record plus an entry on the stream of the queue
 * that runs it, written atomically by one Redis function (FCALL pv_op_submit), together with the
 * idempotency key of the call's x-request-id (24 h) and the locks on the resources it changes
 * (one running operation per resource: a second one gets PV_ABORTED naming the holder). Workers
 * read the stream with a consumer group, take a lease with a fencing token, report progress,
 * journal idempotent steps and finish; every write a worker makes is checked against its token
 * inside a Redis function, so a worker that lost its lease (paused, partitioned) commits nothing.
 * Delivery is at least once: a handler's steps are journaled on the record so a redelivered
 * operation resumes instead of repeating side effects.
 *
 * Keys (all share the hash tag {ops}, because they change together; <p> = redis.prefix):
 *   <p>{ops}:op:<id>       hash: the record (fields below), journal fields "j:<step>"
 *   <p>{ops}:out:<id>      stream: the operation's output (pv_op_output_add), what a streaming
 *                          call relays to its client; it expires with the record
 *   <p>{ops}:q:<queue>     stream of the queue: entries {op, kind}; consumer group "workers"
 *                          queues: "ops" (ops workers), "node:<name>" (the agent of <name>)
 *   <p>{ops}:idem:<rid>    string: op id of a request id, expires after 24 h
 *   <p>{ops}:lock:<res>    string: op id holding resource <res> while it is not finished
 *   <p>{ops}:pending-by:<client>  set: op ids a gateway client submitted (finished ones are
 *                          dropped lazily when the set reaches the client's limit); 24 h
 *   <p>{ops}:index         zset: op id -> created ms (ListOperations, newest first)
 *   <p>{ops}:by-kind:<kind>      zset: the same, for the operations of one kind
 *   <p>{ops}:by-target:<res>     zset: the same, for the operations on one target; it expires
 *                          with the record of the target's newest finished operation
 *                          (ListOperations with a kind or target filter reads only these; each
 *                          submit trims expired records' members from the three it adds to)
 *   <p>{ops}:delayed       zset: op id -> due ms (retries waiting out their backoff, and the
 *                          timeouts of hand-overs not taken yet: pv_op_handover)
 *   <p>{ops}:events        stream for operators: flat fields op kind target status progress
 *                          message worker (capped at about 100k entries)
 *   <p>{ops}:dead          stream of dead letters: op kind target attempts code message
 *   <p>{ops}:fence         counter: fencing tokens
 *   <p>{ops}:chan:<id>     pub/sub channel: the new status name on every change of op <id>
 *
 * Record fields: id kind target queue status (PENDING|RUNNING|SUCCEEDED|FAILED|CANCELLED)
 * progress message error_code error_message created_ms updated_ms started_ms finished_ms
 * attempts max_attempts worker request_id cancel_requested (0|1) params (JSON object)
 * metadata (JSON object of strings) holds (JSON array of resource ids) token lease_until_ms
 * entry (current stream entry id) retry_at_ms, last_error_code last_error_message (the latest
 * transient error, kept apart from error_* which are set only when it ends), handed (the entry
 * pv_op_handover put it on; "" when never handed over). Finished records
 * expire after the retention. A field still at its default (0, "", holds "[]") may be absent
 * from the hash: readers take the default.
 *
 * Ownership: pv_op values filled by these functions own their strings; release them with
 * pv_op_clear (safe on a zeroed or already cleared pv_op). Arrays from pv_op_list are freed
 * with pv_op_array_free.
 */
#ifndef PV_OP_H
#define PV_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_id.h"
#include "pv_keys.h"
#include "pv_record.h"
#include "pv_redis.h"
#include "pv_status.h"

/* The same numbers as pivirt.operations.v1.OperationStatus. */
typedef enum {
    PV_OP_ANY = 0,
    PV_OP_PENDING = 1,
    PV_OP_RUNNING = 2,
    PV_OP_SUCCEEDED = 3,
    PV_OP_FAILED = 4,
    PV_OP_CANCELLED = 5,
} pv_op_status;

#define PV_OP_GROUP "workers"
#define PV_OP_DEFAULT_MAX_ATTEMPTS 5
#define PV_OP_IDEMPOTENCY_SECONDS 86400

typedef struct pv_op {
    char id[PV_ID_MAX];
    char *kind;
    char *target;
    char *queue;
    pv_op_status status;
    int progress; /* 0..100 */
    char *message;
    int error_code; /* 0 unless FAILED/CANCELLED (CANCELLED: 1) */
    char *error_message;
    int64_t created_ms, updated_ms, started_ms, finished_ms; /* 0 = not yet */
    int attempts, max_attempts;
    char *worker;
    char *request_id;
    bool cancel_requested;
    char *params;   /* JSON object text, "{}" when none */
    char *metadata; /* JSON object of strings, "{}" when none */
    char *entry;    /* the stream entry that carries it now ("" when none) */
    /* Set only in what pv_op_acquire (or pv_op_take) answers for a RUN: the record had no
     * journal entry when it was leased, so the journal holds only what this delivery writes.
     * false: unknown (read the journal). */
    bool unjournaled;
} pv_op;

/* The record's fields (pv_record.h): the one table every reader of an operation decodes by. */
extern const pv_record_schema pv_op_schema;

void pv_op_clear(pv_op *op);
void pv_op_array_free(pv_op *ops, size_t n);
bool pv_op_done(const pv_op *op);                            /* SUCCEEDED, FAILED or CANCELLED */
const char *pv_op_status_name(pv_op_status s);               /* "PENDING", ... */
int pv_op_status_parse(const char *name, pv_op_status *out); /* 0 or -1 */

/* Retention and limits every process agrees on (from the configuration). */
typedef struct pv_op_opts {
    int retention_seconds; /* finished records expire after this (7 days) */
    int events_maxlen;     /* approximate cap of the events stream (100000) */
} pv_op_opts;

/* --- the gateway's side --------------------------------------------------------------- */

typedef struct pv_op_submit_req {
    const char *kind;          /* "node.drain", "test.sleep", ... */
    const char *target;        /* id of the resource the operation changes */
    const char *queue;         /* "ops" or "node:<name>" */
    const char *params_json;   /* NULL = "{}" */
    const char *metadata_json; /* NULL = "{}" */
    const char *request_id;    /* NULL/"" = not idempotent */
    int max_attempts;          /* <= 0: PV_OP_DEFAULT_MAX_ATTEMPTS */
    const char *const *holds;  /* more resources held while it runs (the target always is):
                                  an operation on a cluster holds each of its nodes */
    size_t n_holds;
    /* Who asked, for the bound on unfinished operations per client: NULL/"" = not counted
     * (operations the workers submit for their own work). */
    const char *client;
    int client_max_pending; /* > 0: refuse when the client has this many unfinished already */
    const char *limit_name; /* names the limit in the error ("gateway.max_pending_ops_...") */
    /* The submitter will wait for the end (op_convert_wait): the operation's output stream is
     * opened at once with a plumbing entry no reader sees, so that its end entry, which only
     * an existing stream gets, wakes a pv_op_output_wait even when the operation writes no
     * output. */
    bool notify_end;
    /* The target was minted for this very operation (pv_id_new: a deploy's "deploy-<id>", a
     * node part's "wlop-<id>"), so nothing else can name it: no lock is taken on it (a GET and
     * a SET at the submit, a GET and a DEL at the end, that guard nothing), and its target
     * index is new (no PERSIST or trim of it). Holds still lock. */
    bool target_unlocked;
} pv_op_submit_req;

/* Writes record + stream entry + idempotency key + locks + index + event atomically.
 * The same request_id within 24 h returns the existing operation (*existed = true) whatever
 * its state. A held resource: PV_ABORTED "<resource> is held by operation <id> (<kind>)".
 * With req->client, the operation joins the client's set of unfinished operations
 * (PV_OPS "pending-by:<client>"); with client_max_pending > 0 and that many unfinished
 * already: PV_RESOURCE_EXHAUSTED naming the client and the limit, and nothing is written.
 * On PV_OK *out is the new (or existing) record. */
int pv_op_submit(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op_submit_req *req,
                 pv_op *out, bool *existed, pv_status *st);

/* The id of the unfinished operation holding resource res (its target or one of its holds),
 * into holder (PV_ID_MAX bytes); "" when none does. */
int pv_op_lock_holder(pv_redis *r, const pv_keys *k, const char *res, char *holder, pv_status *st);

/* The id of the operation a request id made (within the 24 h its key lives), into id
 * (PV_ID_MAX bytes); "" when none. */
int pv_op_find_request(pv_redis *r, const pv_keys *k, const char *request_id, char *id,
                       pv_status *st);

/* PV_NOT_FOUND "operation <id> not found" when missing or expired. */
int pv_op_get(pv_redis *r, const pv_keys *k, const char *id, pv_op *out, pv_status *st);

typedef struct pv_op_filter {
    const char *kind;    /* NULL/"" = any */
    const char *target;  /* NULL/"" = any */
    pv_op_status status; /* PV_OP_ANY = any */
    int limit;           /* 1..1000 */
} pv_op_filter;

/* Newest first. *ops is an array of *n records (pv_op_array_free). */
int pv_op_list(pv_redis *r, const pv_keys *k, const pv_op_filter *f, pv_op **ops, size_t *n,
               pv_status *st);

/* Best effort: PENDING ends CANCELLED at once (it will never run: a worker that receives it
 * acks it); RUNNING gets cancel_requested and its worker ends it CANCELLED (error code 1);
 * a finished operation is returned unchanged. *out is the record after the call. */
int pv_op_cancel(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *id, pv_op *out,
                 pv_status *st);

/* --- the worker's side ---------------------------------------------------------------- */

/* What pv_op_acquire decided for a delivered entry. */
typedef enum {
    PV_OP_ACQ_RUN,       /* leased: run the handler with *token */
    PV_OP_ACQ_DONE,      /* already finished (a duplicate or late entry): acked, nothing to do */
    PV_OP_ACQ_CANCELLED, /* cancelled before it ran: ended CANCELLED and acked */
    PV_OP_ACQ_DEAD,      /* this delivery exceeds max_attempts: ended FAILED with the last
                            error, copied to the dead-letter stream, acked */
    PV_OP_ACQ_BUSY,      /* another worker holds a live lease: left alone */
    PV_OP_ACQ_GONE,      /* no record (expired): entry acked */
} pv_op_acquire_result;

/* Takes the lease of the operation carried by stream entry `entry` of `queue`, delivered to
 * `consumer`: counts the delivery (attempts), draws a new fencing token, sets RUNNING, worker,
 * lease_until = now + lease_ms. */
int pv_op_acquire(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *queue,
                  const char *consumer, const char *entry, const char *op_id, int lease_ms,
                  pv_op *out, int64_t *token, pv_op_acquire_result *res, pv_status *st);

/* pv_op_acquire for n delivered entries of one queue in one pipeline (one round trip instead of
 * n): entry i carries op_ids[i]; out[i], tokens[i], res[i] are its result, rcs[i] its code (and
 * sts[i] its status when not PV_OK), exactly as pv_op_acquire would give them. Every array
 * holds n elements; every out[i] is filled or zeroed (pv_op_clear each). Returns PV_OK: the
 * outcome of each entry is in rcs. */
int pv_op_acquire_batch(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *queue,
                        const char *consumer, size_t n, const char *const *entries,
                        const char *const *op_ids, int lease_ms, pv_op *out, int64_t *tokens,
                        pv_op_acquire_result *res, int *rcs, pv_status *sts);

/* One entry read and leased by pv_op_take. */
typedef struct pv_op_taken {
    char entry[64];        /* the stream entry */
    char op_id[PV_ID_MAX]; /* "" when the entry carried no operation (it was acked) */
    pv_op rec;             /* as pv_op_acquire fills it (pv_op_clear) */
    int64_t token;
    pv_op_acquire_result res;
    int rc;       /* PV_OK, or the code of this entry's acquisition */
    pv_status st; /* set when rc is not PV_OK */
} pv_op_taken;

/* Reads up to `count` new entries of `queue` for `consumer` without blocking (XREADGROUP) and
 * acquires each as pv_op_acquire does, in one call: a worker with a backlog saves the round trip
 * of a separate read. out holds count elements; *n = entries taken (0: nothing new). A failure
 * of the call itself (Redis away, no consumer group) is the return code; the entries taken have
 * their own rc. */
int pv_op_take(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *queue,
               const char *consumer, int count, int lease_ms, pv_op_taken *out, size_t *n,
               pv_status *st);

/* Extends the lease and keeps the stream entry from looking idle (XCLAIM to the same consumer),
 * so XAUTOCLAIM does not take a live operation. *cancel_requested tells the handler to stop.
 * PV_ABORTED "lease lost" when the token is no longer current. */
int pv_op_renew(pv_redis *r, const pv_keys *k, const pv_op *op, const char *consumer, int64_t token,
                int lease_ms, bool *cancel_requested, pv_status *st);

/* Fenced progress report (percent clamped to 0..100). PV_ABORTED when the lease is lost. */
int pv_op_progress(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                   int64_t token, int percent, const char *message, pv_status *st);

/* Journal of idempotent steps. get: *value is malloc'd or NULL when the step is not recorded.
 * put is fenced. */
int pv_op_journal_get(pv_redis *r, const pv_keys *k, const char *op_id, const char *step,
                      char **value, pv_status *st);
int pv_op_journal_put(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token,
                      const char *step, const char *value, pv_status *st);

/* Output: a fenced entry of n field/value pairs (fields[i], values[i]) on the operation's output
 * stream (kept to about PV_OP_OUTPUT_MAXLEN entries). *entry_id (may be NULL, at least 32 bytes)
 * gets the stream id. PV_ABORTED when the lease is lost (nothing written). */
#define PV_OP_OUTPUT_MAXLEN 100000
int pv_op_output_add(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token, size_t n,
                     const char *const *fields, const char *const *values, char *entry_id,
                     pv_status *st);

/* pv_op_output_add and m journal entries (steps[i] -> jvalues[i], as pv_op_journal_put) in one
 * fenced call, atomically: a step's answer and the mark that it was told are saved with the
 * output that tells it (two journal round trips fewer per instance of a deploy or removal). */
int pv_op_output_journal(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token, size_t m,
                         const char *const *steps, const char *const *jvalues, size_t n,
                         const char *const *fields, const char *const *values, pv_status *st);

/* One entry of an output stream: its id and n field/value pairs (owned; pv_op_output_free). */
typedef struct pv_op_output {
    char id[32];
    size_t n;
    char **fields, **values;
} pv_op_output;
void pv_op_output_free(pv_op_output *entries, size_t n);

/* Reads the entries after `after` ("0" = from the start), at most count, waiting up to block_ms
 * for the first one (0 = do not wait; the connection's command timeout must exceed block_ms).
 * *entries is malloc'd (NULL when none). The stream's closing entry (type "end", written when
 * the operation finishes) and the opening one of notify_end are plumbing for pv_op_output_wait
 * and never returned here. */
int pv_op_output_read(pv_redis *r, const pv_keys *k, const char *op_id, const char *after,
                      size_t count, int block_ms, pv_op_output **entries, size_t *n, pv_status *st);

/* Input: what an operation's submitter streams to it while it runs (ExecuteWorkload's stdin),
 * on <prefix>{ops}:in:<op>: entries {data: base64} and a last {eof: 1}, kept ttl_seconds
 * (<= 0: a day) after the last one. Read like output (entries in pv_op_output form). */
int pv_op_input_add(pv_redis *r, const pv_keys *k, const char *op_id, const char *data_b64,
                    bool eof, int ttl_seconds, pv_status *st);
int pv_op_input_read(pv_redis *r, const pv_keys *k, const char *op_id, const char *after,
                     size_t count, int block_ms, pv_op_output **entries, size_t *n, pv_status *st);

/* Blocks up to block_ms (> 0, under the connection's command timeout) until any of the n
 * operations' output streams has an entry after cursors[i] ("0": from the start), the closing
 * "end" entry included: a follower of running operations wakes on their output and on their
 * end, without polling. Each cursor advances to the newest entry seen; *woke tells whether any
 * came; ended (NULL, or n flags) is set for each stream whose end entry came (the operation is
 * finished; its record says how). A follower must leave finished operations out of the set
 * (their end entry would wake it at once, every time). An operation that finishes without ever
 * writing output has no stream and no end entry, unless it was submitted with notify_end: else
 * only its record tells. */
#define PV_OP_CURSOR_MAX 32
int pv_op_output_wait(pv_redis *r, const pv_keys *k, size_t n, const char *const *op_ids,
                      char (*cursors)[PV_OP_CURSOR_MAX], int block_ms, bool *woke, bool *ended,
                      pv_status *st);

/* pv_op_output_wait that also hands over what it read, saving the follower a read of its own:
 * entries[i] (malloc'd, NULL when none; free with pv_op_output_free(entries[i], counts[i])) are
 * stream i's entries after cursors[i] as pv_op_output_read returns them (end entries left
 * out), at most 100: with 100 there may be more, which the next wait or read returns. */
int pv_op_output_wait_entries(pv_redis *r, const pv_keys *k, size_t n, const char *const *op_ids,
                              char (*cursors)[PV_OP_CURSOR_MAX], int block_ms, bool *woke,
                              bool *ended, pv_op_output **entries, size_t *counts, pv_status *st);

/* Fenced end: status SUCCEEDED, FAILED (error_code, error_message) or CANCELLED (code 1); for
 * SUCCEEDED a non-empty error_message is the record's last message instead (a progress call
 * less):
 * releases the locks it holds, acks the entry, publishes, appends the event, sets the record's
 * expiry. PV_ABORTED when the lease is lost (nothing written). */
int pv_op_finish(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op, int64_t token,
                 pv_op_status status, int error_code, const char *error_message, pv_status *st);

/* pv_op_finish that also writes an output entry of n fields just before the end entry, in the
 * same call: the run's last output, told with its end (a round trip and a fenced check less
 * than pv_op_output_add before the end). n = 0: pv_op_finish. */
int pv_op_finish_output(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                        int64_t token, pv_op_status status, int error_code,
                        const char *error_message, size_t n, const char *const *fields,
                        const char *const *values, pv_status *st);

/* Fenced transient failure: records the error, acks the entry, status back to PENDING with
 * retry_at = now + delay_ms (in the delayed set); pv_op_promote_due puts it back on its queue
 * when due. When attempts already reached max_attempts it fails for good instead (FAILED,
 * dead-lettered) and *dead is set. */
int pv_op_retry_later(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                      int64_t token, int delay_ms, int error_code, const char *error_message,
                      bool *dead, pv_status *st);

/* Fenced hand-back at shutdown: PENDING again, entry acked and a fresh entry added, so another
 * worker takes it at once. The delivery is not counted against max_attempts. */
int pv_op_release(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                  int64_t token, pv_status *st);

/* Fenced hand-over to another queue whose workers carry the operation on (a one-node deploy's
 * node part runs on that node's agent: one operation where there were two): PENDING on a fresh
 * entry of `queue` with params_json as its params, the old entry acked, and an output entry of n
 * fields (none when n is 0) written with it, atomically; the delivery does not count against
 * max_attempts. From then on the operation is "handed over": a cancel does not end it where it
 * stands but makes a worker run it (on its new queue, or, while it waits there, back on the ops
 * queue, where it is undone), and so does a timeout: still not taken by a worker of `queue`
 * after timeout_ms, pv_op_promote_due hands it back to the ops queue with a cancel requested.
 * The handler tells such a run by its params. PV_ABORTED when the lease is lost (nothing
 * written). */
int pv_op_handover(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                   int64_t token, const char *queue, const char *params_json, int timeout_ms,
                   size_t n, const char *const *fields, const char *const *values, pv_status *st);

/* pv_op_handover of an operation nobody leased: op_id, still PENDING and never run, on the
 * entry of the ops queue (from_queue) its caller was delivered and has not acknowledged, which
 * the hand-over acknowledges. by names the caller in the event. *moved: the record is not that
 * any more (gone, cancelled, run or handed over since, another entry): nothing was written and
 * the entry is still the caller's. */
int pv_op_handover_pending(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *op_id,
                           const char *from_queue, const char *entry, const char *by,
                           const char *queue, const char *params_json, int timeout_ms, size_t n,
                           const char *const *fields, const char *const *values, bool *moved,
                           pv_status *st);

/* Moves retries whose time has come back onto their queues (and hand-overs no worker took in
 * time back to the ops queue, see pv_op_handover); *moved = how many. Their events
 * keep the events stream at o->events_maxlen, as every other write does. */
int pv_op_promote_due(pv_redis *r, const pv_keys *k, const pv_op_opts *o, int *moved,
                      pv_status *st);

/* Creates the consumer group of a queue (MKSTREAM; an existing group is fine). */
int pv_op_ensure_group(pv_redis *r, const pv_keys *k, const char *queue, pv_status *st);

/* Trims the queue's stream below its oldest entry that is pending or not yet delivered
 * (XTRIM MINID): no pending work is ever trimmed away. *trimmed = entries removed. */
int pv_op_trim(pv_redis *r, const pv_keys *k, const char *queue, long long *trimmed, pv_status *st);

/* Consistency check of the whole pipeline: every unfinished record has its stream entry (or a
 * delayed retry), every pending stream entry has its record, every lock points at an unfinished
 * operation. Writes one line per problem into report (malloc'd, "" when none) and the count into
 * *problems. */
int pv_op_check(pv_redis *r, const pv_keys *k, char **report, int *problems, pv_status *st);

/* Stream key of a queue, for consumers (XREADGROUP) and tests. */
int pv_op_queue_key(const pv_keys *k, const char *queue, char *buf, size_t len, pv_status *st);
/* The events stream key (operators: redis-cli XREAD BLOCK 0 STREAMS <key> '$'). */
int pv_op_events_key(const pv_keys *k, char *buf, size_t len, pv_status *st);
/* The pub/sub channel of one operation. */
int pv_op_channel(const pv_keys *k, const char *op_id, char *buf, size_t len, pv_status *st);

#endif
