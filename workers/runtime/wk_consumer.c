/*
 * wk_consumer: the reader, the pool and the lease keeper of one queue (see wk_consumer.h).
 *
 * Why it is built this way:
 * - The reader asks XREADGROUP for exactly as many entries as there are free slots, so nothing
 *   sits in this process's pending list unworked while another worker idles. The reader takes
 *   the leases of everything one read delivered in one pipelined round trip
 *   (pv_op_acquire_batch) and hands the pool only operations it leased: per operation that
 *   saves a round trip, and the system calls and Redis wake-ups that go with it, while the
 *   reader is back on its blocking read after one short exchange. An entry whose acquisition
 *   failed (Redis away) goes to the pool as before, which acquires it itself and retries.
 *   While a read keeps filling every free slot there is a backlog: the reader then reads and
 *   leases in one call (pv_op_take, never blocking) until a take comes back short, and only
 *   then blocks again, so a busy worker pays one round trip per batch, not two.
 * - Delivered-but-unfinished entries of a dead worker stay in the group's pending list; the
 *   reader reclaims those idle longer than a lease plus a margin (XAUTOCLAIM). Live work never
 *   looks idle because the keeper's renewals re-claim the entry (pv_op_renew), and the margin
 *   makes sure the record's lease has expired too by then, so the reclaim leads to a RUN and not
 *   to BUSY (which would cost another lease).
 * - Every write about an operation is fenced by its token inside Redis. A write refused with
 *   PV_ABORTED means another worker owns the operation now: the op is marked lost, the handler
 *   stops, and nothing more is written.
 * - Outcome writes that fail because Redis is away are retried a few times; if that is not
 *   enough the entry stays pending and is redelivered, and the journal turns the rerun into a
 *   resume.
 * - The reader sends CLIENT ID with every read (pipelined, free), so that stop can interrupt its
 *   blocking read with CLIENT UNBLOCK instead of waiting for the block to time out.
 */
#include "wk_consumer.h"

#include "pv_time.h"
#include "pv_metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_log.h"
#include "pv_mem.h"
#include "pv_op.h"
#include "wk_handler.h"

#define RECLAIM_EVERY_MS 1000
#define PROMOTE_EVERY_MS 500
#define TRIM_EVERY_MS 30000
#define FIRST_TRIM_MS 2000 /* soon after start, so a restarted worker tidies up early */
#define RECLAIM_MARGIN_MS 1000
#define RENEW_EVERY_MS 500
#define MAX_BLOCK_MS 1000
#define COMMIT_TRIES 5
#define ACQUIRE_TRIES 3

typedef struct job {
    struct job *next;
    char entry[64];
    char op_id[PV_ID_MAX];
    bool acquired; /* the reader leased it already: rec and token are set, res is RUN */
    bool prelease; /* a fresh delivery of the consumer's prelease_kind: its step comes first */
    pv_op rec;
    int64_t token;
} job;

typedef struct slot {
    wk_op *op;     /* running operation, NULL when free */
    bool renewing; /* the keeper is using op: it must not be freed yet */
} slot;

struct wk_consumer;

typedef struct pool_thread {
    struct wk_consumer *c;
    int index;
    pv_redis *redis;
    pthread_t thread;
    bool started;
} pool_thread;

struct wk_consumer {
    /* settings, fixed after start */
    char *queue;
    char *consumer;
    char stream[PV_KEY_MAX];
    pv_keys keys;
    pv_op_opts opts;
    int concurrency, lease_ms, backoff_base_ms, backoff_max_ms, shutdown_ms;
    bool test_operations;
    void *context;              /* handed to every handler (wk_op_context) */
    struct pv_metrics *metrics; /* may be NULL */
    const pv_config *cfg;       /* handed to every handler (wk_op_config); outlives the consumer */
    char *prelease_kind;        /* NULL: no pre-lease step */
    wk_prelease_fn prelease;

    pv_redis *reader_redis, *keeper_redis, *control_redis;
    pool_thread *pool;
    pthread_t reader, keeper;
    bool reader_started, keeper_started;

    /* guarded by mu. Three condition variables (CLOCK_MONOTONIC), so that a new job wakes one
     * pool thread and not every thread of the process: */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* free slots, renewals done, reader done, stop */
    pthread_cond_t work_cv;   /* a job is queued, or the pool closes */
    pthread_cond_t keeper_cv; /* the keeper stops */
    job *head, *tail;
    int busy;      /* jobs queued or being worked on */
    slot *slots;   /* one per pool thread */
    bool stopping; /* no new reads; new work is handed back */
    bool closing;  /* pool threads exit once the queue is empty */
    bool keeper_stop;
    bool reader_done;
    long long reader_id;  /* CLIENT ID of the reader's connection, 0 when unknown */
    uint64_t reader_conn; /* the reader's connection it was read on (pv_redis_connections) */
};

/* Logs a Redis outage once when it starts and once when it ends; one per loop. Other errors of
 * a retrying loop are logged once until the next success. */
typedef struct outage {
    bool down;
    bool failing;
} outage;

static void loop_error(outage *o, const char *what, const pv_status *st) {
    if (o->failing) return;
    o->failing = true;
    pv_error("%s failed (retrying): %s", what, st->msg);
}

static void outage_note(outage *o, const char *who, int rc, const pv_status *st) {
    if (rc == PV_UNAVAILABLE && !o->down) {
        pv_warn("%s: redis unavailable, retrying: %s", who, st->msg);
        o->down = true;
    } else if (rc == PV_OK && o->down) {
        pv_info("%s: redis is back", who);
        o->down = false;
    }
    if (rc == PV_OK) o->failing = false;
}

/* Waits on cv for at most ms; called with c->mu held. */
static void wait_on(struct wk_consumer *c, pthread_cond_t *cv, int64_t ms) {
    if (ms <= 0) return;
    struct timespec until = pv_time_mono_after(ms);
    pthread_cond_timedwait(cv, &c->mu, &until);
}

static void wait_ms(struct wk_consumer *c, int64_t ms) {
    wait_on(c, &c->cv, ms);
}

/* Sleeps ms unless the consumer stops meanwhile. */
static void pause_unless_stopping(struct wk_consumer *c, int ms) {
    pthread_mutex_lock(&c->mu);
    if (!c->stopping) wait_ms(c, ms);
    pthread_mutex_unlock(&c->mu);
}

static bool is_stopping(struct wk_consumer *c) {
    pthread_mutex_lock(&c->mu);
    bool v = c->stopping;
    pthread_mutex_unlock(&c->mu);
    return v;
}

/* --- the queue of delivered entries ----------------------------------------------------------- */

static const char *field(const redisReply *fields, const char *name) {
    if (!fields || fields->type != REDIS_REPLY_ARRAY) return NULL;
    for (size_t i = 0; i + 1 < fields->elements; i += 2) {
        const redisReply *k = fields->element[i], *v = fields->element[i + 1];
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            strcmp(k->str, name) == 0)
            return v->str;
    }
    return NULL;
}

/* An entry that carries no operation would stay pending for ever: acknowledge it. */
static void ack_malformed(struct wk_consumer *c, pv_redis *r, const char *entry) {
    pv_status st;
    pv_warn("queue=%s entry=%s carries no operation id: acknowledged and skipped", c->queue, entry);
    redisReply *reply = NULL;
    pv_redis_command(r, &reply, &st, "XACK %s %s %s", c->stream, PV_OP_GROUP, entry);
    if (reply) freeReplyObject(reply);
}

static void queue_job(struct wk_consumer *c, job *j) {
    pthread_mutex_lock(&c->mu);
    if (c->tail)
        c->tail->next = j;
    else
        c->head = j;
    c->tail = j;
    c->busy++;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
}

static void job_free(job *j) {
    pv_op_clear(&j->rec);
    free(j);
}

static const char *acquire_name(pv_op_acquire_result res);

/* What a delivery that is not to be run means for the log. */
static void log_not_run(const char *op_id, const char *entry, const pv_op *rec,
                        pv_op_acquire_result res) {
    if (res == PV_OP_ACQ_DEAD || res == PV_OP_ACQ_CANCELLED)
        pv_info("op end id=%s kind=%s attempt=%d outcome=%s", op_id, rec->kind ? rec->kind : "?",
                rec->attempts, acquire_name(res));
    else
        pv_debug("op id=%s entry=%s: %s", op_id, entry, acquire_name(res));
}

/* Leases the delivered jobs in one pipeline and queues those to run; a job whose acquisition
 * failed is queued unleased (the pool acquires it, riding out a short outage). */
static void acquire_and_queue(struct wk_consumer *c, pv_redis *r, job **jobs, size_t n) {
    const char **entries = calloc(n, sizeof *entries), **ids = calloc(n, sizeof *ids);
    pv_op *recs = calloc(n, sizeof *recs);
    int64_t *tokens = calloc(n, sizeof *tokens);
    pv_op_acquire_result *res = calloc(n, sizeof *res);
    int *rcs = calloc(n, sizeof *rcs);
    pv_status *sts = calloc(n, sizeof *sts);
    bool ok = entries && ids && recs && tokens && res && rcs && sts;
    if (ok) {
        for (size_t i = 0; i < n; i++) {
            entries[i] = jobs[i]->entry;
            ids[i] = jobs[i]->op_id;
        }
        pv_op_acquire_batch(r, &c->keys, &c->opts, c->queue, c->consumer, n, entries, ids,
                            c->lease_ms, recs, tokens, res, rcs, sts);
    }
    for (size_t i = 0; i < n; i++) {
        job *j = jobs[i];
        if (ok && rcs[i] == PV_OK && res[i] != PV_OP_ACQ_RUN) {
            log_not_run(j->op_id, j->entry, &recs[i], res[i]);
            pv_op_clear(&recs[i]);
            job_free(j);
            continue;
        }
        if (ok && rcs[i] == PV_OK) {
            j->acquired = true;
            j->rec = recs[i];
            j->token = tokens[i];
        } else if (ok && rcs[i] != PV_UNAVAILABLE) {
            pv_warn("op acquire id=%s entry=%s: %s; the pool tries again", j->op_id, j->entry,
                    sts[i].msg);
        }
        queue_job(c, j);
    }
    PV_FREE(entries, ids, recs, tokens, res, rcs, sts);
}

/* Queues (or logs) what pv_op_take gave; the records move into the jobs. */
static void queue_taken(struct wk_consumer *c, pv_op_taken *taken, size_t n) {
    for (size_t i = 0; i < n; i++) {
        pv_op_taken *t = &taken[i];
        if (!t->op_id[0]) {
            pv_warn("queue=%s entry=%s carries no operation id: acknowledged and skipped", c->queue,
                    t->entry);
            continue;
        }
        if (t->rc == PV_OK && t->res != PV_OP_ACQ_RUN) {
            log_not_run(t->op_id, t->entry, &t->rec, t->res);
            pv_op_clear(&t->rec);
            continue;
        }
        job *j = calloc(1, sizeof *j);
        if (!j) {
            pv_error("op id=%s entry=%s: out of memory; left for redelivery", t->op_id, t->entry);
            pv_op_clear(&t->rec);
            continue;
        }
        snprintf(j->entry, sizeof j->entry, "%s", t->entry);
        snprintf(j->op_id, sizeof j->op_id, "%s", t->op_id);
        if (t->rc == PV_OK) {
            j->acquired = true;
            j->rec = t->rec;
            j->token = t->token;
            memset(&t->rec, 0, sizeof t->rec);
        } else if (t->rc != PV_UNAVAILABLE) {
            pv_warn("op acquire id=%s entry=%s: %s; the pool tries again", t->op_id, t->entry,
                    t->st.msg);
        }
        queue_job(c, j);
    }
}

/* Whether a delivered entry goes to the pre-lease step: read as new (fresh), of its kind. A
 * claimed one (its worker stalled or died) is leased as ever, so its deliveries are counted. */
static bool wants_prelease(const struct wk_consumer *c, const redisReply *fields, bool fresh) {
    const char *kind = c->prelease && fresh ? field(fields, "kind") : NULL;
    return kind && strcmp(kind, c->prelease_kind) == 0;
}

/* Takes the entries of an XREADGROUP (fresh) or XAUTOCLAIM entry array: leased in one batch,
 * then queued for the pool; those for the pre-lease step are queued unleased. */
static void enqueue_entries(struct wk_consumer *c, pv_redis *r, const redisReply *entries,
                            bool fresh) {
    if (!entries || entries->type != REDIS_REPLY_ARRAY || entries->elements == 0) return;
    job **jobs = calloc(entries->elements, sizeof *jobs);
    if (!jobs) {
        pv_error("queue=%s: out of memory; %zu entries left for redelivery", c->queue,
                 entries->elements);
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
            e->element[0]->type != REDIS_REPLY_STRING)
            continue;
        const char *entry = e->element[0]->str;
        const char *op_id = field(e->element[1], "op");
        if (!op_id || strlen(op_id) >= PV_ID_MAX || strlen(entry) >= sizeof(((job *)0)->entry)) {
            ack_malformed(c, r, entry);
            continue;
        }
        job *j = calloc(1, sizeof *j);
        if (!j) {
            pv_error("queue=%s entry=%s: out of memory; left for redelivery", c->queue, entry);
            continue;
        }
        snprintf(j->entry, sizeof j->entry, "%s", entry);
        snprintf(j->op_id, sizeof j->op_id, "%s", op_id);
        if ((j->prelease = wants_prelease(c, e->element[1], fresh)))
            queue_job(c, j);
        else
            jobs[n++] = j;
    }
    if (n > 0) acquire_and_queue(c, r, jobs, n);
    free(jobs);
}

/* --- the reader ------------------------------------------------------------------------------- */

static int ensure_group(struct wk_consumer *c, outage *o) {
    pv_status st;
    for (;;) {
        int rc = pv_op_ensure_group(c->reader_redis, &c->keys, c->queue, &st);
        outage_note(o, "reader", rc, &st);
        if (rc == PV_OK) return PV_OK;
        if (rc != PV_UNAVAILABLE) loop_error(o, "creating the consumer group", &st);
        if (is_stopping(c)) return rc;
        pause_unless_stopping(c, wk_random_between(100, 500));
    }
}

/* A failed read or reclaim: a vanished stream/group is created again, an outage waited out. */
static void read_failed(struct wk_consumer *c, outage *o, const char *what, int rc,
                        const pv_status *st) {
    outage_note(o, "reader", rc, st);
    if (strstr(st->msg, "NOGROUP")) {
        pv_warn("queue=%s: the consumer group is gone (%s); creating it again", c->queue, what);
        ensure_group(c, o);
        return;
    }
    if (rc != PV_UNAVAILABLE) loop_error(o, what, st);
    pause_unless_stopping(c, wk_random_between(100, 500));
}

static int free_slots(struct wk_consumer *c) {
    pthread_mutex_lock(&c->mu);
    int n = c->stopping ? 0 : c->concurrency - c->busy;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* XAUTOCLAIM: takes over entries idle past the lease (their worker died or lost Redis). */
static void reclaim(struct wk_consumer *c, outage *o, char *cursor, size_t cursor_len) {
    int n = free_slots(c);
    if (n <= 0) return;
    char min_idle[32], count[32];
    snprintf(min_idle, sizeof min_idle, "%d", c->lease_ms + RECLAIM_MARGIN_MS);
    snprintf(count, sizeof count, "%d", n);
    const char *argv[] = {"XAUTOCLAIM", c->stream, PV_OP_GROUP, c->consumer,
                          min_idle,     cursor,    "COUNT",     count};
    redisReply *reply = NULL;
    pv_status st;
    int rc = pv_redis_commandv(c->reader_redis, &reply, &st, 8, argv, NULL);
    if (rc != PV_OK) {
        read_failed(c, o, "XAUTOCLAIM", rc, &st);
        return;
    }
    outage_note(o, "reader", rc, &st);
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements >= 2) {
        if (reply->element[0]->type == REDIS_REPLY_STRING)
            snprintf(cursor, cursor_len, "%s", reply->element[0]->str);
        const redisReply *entries = reply->element[1];
        if (entries->type == REDIS_REPLY_ARRAY && entries->elements > 0)
            pv_info("queue=%s reclaimed %zu entries idle past the lease", c->queue,
                    entries->elements);
        enqueue_entries(c, c->reader_redis, entries, false);
    }
    freeReplyObject(reply);
}

static void promote(struct wk_consumer *c, outage *o) {
    pv_status st;
    int moved = 0;
    int rc = pv_op_promote_due(c->reader_redis, &c->keys, &c->opts, &moved, &st);
    outage_note(o, "reader", rc, &st);
    if (rc != PV_OK && rc != PV_UNAVAILABLE) loop_error(o, "promoting due retries", &st);
    if (moved > 0) pv_debug("promoted %d due retries", moved);
}

static void trim(struct wk_consumer *c, outage *o) {
    pv_status st;
    long long trimmed = 0;
    int rc = pv_op_trim(c->reader_redis, &c->keys, c->queue, &trimmed, &st);
    outage_note(o, "reader", rc, &st);
    if (rc != PV_OK && rc != PV_UNAVAILABLE) loop_error(o, "trimming the queue", &st);
    if (trimmed > 0) pv_debug("queue=%s trimmed %lld entries", c->queue, trimmed);
}

/* One blocking read of up to n new entries; CLIENT ID rides along so stop can unblock it, on
 * the first read of each connection only (it is the connection's for its life). Returns how
 * many entries it delivered. */
static size_t read_new(struct wk_consumer *c, outage *o, int n, int64_t block_ms) {
    char count[32], block[32];
    snprintf(count, sizeof count, "%d", n);
    snprintf(block, sizeof block, "%" PRId64, block_ms < 1 ? 1 : block_ms);
    const char *id_argv[] = {"CLIENT", "ID"};
    const char *argv[] = {"XREADGROUP", "GROUP", PV_OP_GROUP, c->consumer, "COUNT", count,
                          "BLOCK",      block,   "STREAMS",   c->stream,   ">"};
    pv_status st;
    redisReply *id = NULL, *reply = NULL;
    uint64_t conn = pv_redis_connections(c->reader_redis);
    bool ask_id = conn == 0 || conn != c->reader_conn;
    int rc = ask_id ? pv_redis_append(c->reader_redis, 2, id_argv, NULL, &st) : PV_OK;
    if (rc == PV_OK) rc = pv_redis_append(c->reader_redis, 11, argv, NULL, &st);
    /* a connection made by these appends: its id is asked for on the next read */
    bool same = pv_redis_connections(c->reader_redis) == conn;
    if (rc == PV_OK && ask_id) {
        /* A refused CLIENT ID only costs the fast stop; a lost connection fails both replies. */
        long long got_id = 0;
        if (pv_redis_get_reply(c->reader_redis, &id, NULL) == PV_OK &&
            id->type == REDIS_REPLY_INTEGER)
            got_id = id->integer;
        if (id) freeReplyObject(id);
        pthread_mutex_lock(&c->mu);
        c->reader_id = got_id;
        pthread_mutex_unlock(&c->mu);
        c->reader_conn = got_id ? pv_redis_connections(c->reader_redis) : 0;
    } else if (rc == PV_OK && !same) {
        pthread_mutex_lock(&c->mu);
        c->reader_id = 0;
        pthread_mutex_unlock(&c->mu);
        c->reader_conn = 0;
    }
    if (rc == PV_OK) rc = pv_redis_get_reply(c->reader_redis, &reply, &st);
    if (rc != PV_OK) {
        read_failed(c, o, "XREADGROUP", rc, &st);
        return 0;
    }
    outage_note(o, "reader", rc, &st);
    /* nil = the block timed out (or stop unblocked us); else [[stream, entries]] */
    size_t got = 0;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 0 &&
        reply->element[0]->type == REDIS_REPLY_ARRAY && reply->element[0]->elements >= 2) {
        const redisReply *entries = reply->element[0]->element[1];
        if (entries->type == REDIS_REPLY_ARRAY) got = entries->elements;
        enqueue_entries(c, c->reader_redis, entries, true);
    }
    freeReplyObject(reply);
    return got;
}

/* Reads and leases up to n new entries in one call, without blocking (a backlog). Returns how
 * many it took. */
static size_t take_new(struct wk_consumer *c, outage *o, int n) {
    pv_op_taken *taken = calloc((size_t)n, sizeof *taken);
    if (!taken) return 0;
    size_t got = 0;
    pv_status st;
    int rc = pv_op_take(c->reader_redis, &c->keys, &c->opts, c->queue, c->consumer, n, c->lease_ms,
                        taken, &got, &st);
    if (rc != PV_OK)
        read_failed(c, o, "pv_op_take", rc, &st);
    else {
        outage_note(o, "reader", rc, &st);
        queue_taken(c, taken, got);
    }
    for (size_t i = 0; i < got; i++)
        pv_op_clear(&taken[i].rec);
    free(taken);
    return got;
}

/* Waits until a slot is free, the stop, or the deadline; returns the free slots. */
static int wait_free_slots(struct wk_consumer *c, int64_t deadline) {
    pthread_mutex_lock(&c->mu);
    while (!c->stopping && c->busy >= c->concurrency && pv_time_mono_ms() < deadline)
        wait_ms(c, deadline - pv_time_mono_ms());
    int n = c->stopping ? 0 : c->concurrency - c->busy;
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void *reader_main(void *arg) {
    struct wk_consumer *c = arg;
    outage o = {false};
    char cursor[64] = "0-0";
    bool backlog = false; /* the last read filled every free slot: more may be waiting */
    int64_t now = pv_time_mono_ms();
    int64_t next_reclaim = now, next_promote = now, next_trim = now + FIRST_TRIM_MS;
    if (ensure_group(c, &o) == PV_OK)
        pv_info("consuming queue=%s stream=%s consumer=%s concurrency=%d lease_ms=%d", c->queue,
                c->stream, c->consumer, c->concurrency, c->lease_ms);
    while (!is_stopping(c)) {
        now = pv_time_mono_ms();
        if (now >= next_reclaim) {
            reclaim(c, &o, cursor, sizeof cursor);
            next_reclaim = now + RECLAIM_EVERY_MS;
        }
        if (now >= next_promote) {
            promote(c, &o);
            next_promote = now + PROMOTE_EVERY_MS;
        }
        if (now >= next_trim) {
            trim(c, &o);
            next_trim = now + TRIM_EVERY_MS;
        }
        int64_t next = next_reclaim < next_promote ? next_reclaim : next_promote;
        int n = wait_free_slots(c, next);
        int64_t block = next - pv_time_mono_ms();
        if (n > 0 && backlog)
            backlog = take_new(c, &o, n) == (size_t)n;
        else if (n > 0 && block > 0)
            backlog = read_new(c, &o, n, block > MAX_BLOCK_MS ? MAX_BLOCK_MS : block) == (size_t)n;
    }
    pthread_mutex_lock(&c->mu);
    c->reader_done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* --- the pool --------------------------------------------------------------------------------- */

static const char *acquire_name(pv_op_acquire_result res) {
    switch (res) {
    case PV_OP_ACQ_RUN:
        return "run";
    case PV_OP_ACQ_DONE:
        return "already-done";
    case PV_OP_ACQ_CANCELLED:
        return "cancelled-before-start";
    case PV_OP_ACQ_DEAD:
        return "dead";
    case PV_OP_ACQ_BUSY:
        return "busy";
    case PV_OP_ACQ_GONE:
        return "gone";
    }
    return "?";
}

/* pv_op_acquire, tolerating a short outage. On PV_OK *res says what happened. */
static int acquire(pool_thread *t, const job *j, pv_op *rec, int64_t *token,
                   pv_op_acquire_result *res, outage *o) {
    struct wk_consumer *c = t->c;
    pv_status st;
    int rc = PV_OK;
    for (int i = 0; i < ACQUIRE_TRIES; i++) {
        pv_op_clear(rec);
        rc = pv_op_acquire(t->redis, &c->keys, &c->opts, c->queue, c->consumer, j->entry, j->op_id,
                           c->lease_ms, rec, token, res, &st);
        outage_note(o, "pool", rc, &st);
        if (rc != PV_UNAVAILABLE) break;
        pause_unless_stopping(c, wk_random_between(100, 500));
    }
    if (rc != PV_OK && rc != PV_UNAVAILABLE)
        pv_error("op acquire id=%s entry=%s failed: %s", j->op_id, j->entry, st.msg);
    else if (rc != PV_OK)
        pv_warn("op acquire id=%s entry=%s: %s; left for redelivery", j->op_id, j->entry, st.msg);
    return rc;
}

static void slot_register(pool_thread *t, wk_op *op) {
    struct wk_consumer *c = t->c;
    pthread_mutex_lock(&c->mu);
    c->slots[t->index].op = op;
    if (c->stopping) wk_op_set_shutdown(op);
    pthread_mutex_unlock(&c->mu);
}

/* Takes the op out of the keeper's sight, waiting for a renewal in flight. */
static void slot_unregister(pool_thread *t) {
    struct wk_consumer *c = t->c;
    slot *s = &c->slots[t->index];
    pthread_mutex_lock(&c->mu);
    while (s->renewing)
        pthread_cond_wait(&c->cv, &c->mu);
    s->op = NULL;
    pthread_mutex_unlock(&c->mu);
}

typedef enum {
    OUT_SUCCEEDED,
    OUT_FAILED,
    OUT_CANCELLED,
    OUT_RETRY,
    OUT_RELEASE,
    OUT_HANDED /* handed over to another queue (wk_op_handover): its workers end it */
} outcome_kind;

typedef struct outcome {
    outcome_kind kind;
    int code;
    char message[PV_STATUS_MSG_MAX];
    int delay_ms;
} outcome;

static const char *outcome_name(outcome_kind k) {
    switch (k) {
    case OUT_SUCCEEDED:
        return "SUCCEEDED";
    case OUT_FAILED:
        return "FAILED";
    case OUT_CANCELLED:
        return "CANCELLED";
    case OUT_RETRY:
        return "retry";
    case OUT_RELEASE:
        return "handed-back";
    case OUT_HANDED:
        return "handed-over";
    }
    return "?";
}

/* Full-jitter exponential backoff: random in [0, min(max, base * 2^(attempt-1))]. */
static int backoff_ms(const struct wk_consumer *c, int attempt) {
    int shift = attempt > 1 ? attempt - 1 : 0;
    if (shift > 30) shift = 30;
    long long cap = (long long)c->backoff_base_ms << shift;
    if (cap > c->backoff_max_ms) cap = c->backoff_max_ms;
    return wk_random_between(0, (int)cap);
}

static void decide(struct wk_consumer *c, wk_op *op, int rc, const pv_status *hst, outcome *out) {
    memset(out, 0, sizeof *out);
    const pv_op *rec = wk_op_record(op);
    if (rc == PV_OK && wk_op_handed_over(op)) {
        out->kind = OUT_HANDED;
    } else if (rc == PV_OK) {
        out->kind = OUT_SUCCEEDED;
    } else if (rc == PV_CANCELLED || wk_op_is_cancelled(op)) {
        out->kind = OUT_CANCELLED;
        out->code = PV_CANCELLED;
        snprintf(out->message, sizeof out->message, "operation %s cancelled", rec->id);
    } else if (wk_code_transient(rc) && !wk_op_failure_final(op)) {
        bool shutting_down = is_stopping(c);
        out->kind = shutting_down ? OUT_RELEASE : OUT_RETRY;
        out->code = rc;
        snprintf(out->message, sizeof out->message, "%s", hst->msg);
        if (!shutting_down) out->delay_ms = backoff_ms(c, rec->attempts);
    } else {
        out->kind = OUT_FAILED;
        out->code = rc;
        snprintf(out->message, sizeof out->message, "%s", hst->msg);
    }
}

static int write_outcome(pool_thread *t, wk_op *op, const outcome *out, bool *dead, pv_status *st) {
    struct wk_consumer *c = t->c;
    const pv_op *rec = wk_op_record(op);
    int64_t token = wk_op_token(op);
    const char *const *fields, *const *values;
    size_t n = wk_op_end_output(op, &fields, &values); /* its last word, told with the end */
    switch (out->kind) {
    case OUT_SUCCEEDED:
        return pv_op_finish_output(t->redis, &c->keys, &c->opts, rec, token, PV_OP_SUCCEEDED, 0,
                                   wk_op_end_message(op), n, fields, values, st);
    case OUT_FAILED:
        return pv_op_finish_output(t->redis, &c->keys, &c->opts, rec, token, PV_OP_FAILED,
                                   out->code, out->message, n, fields, values, st);
    case OUT_CANCELLED:
        return pv_op_finish_output(t->redis, &c->keys, &c->opts, rec, token, PV_OP_CANCELLED,
                                   PV_CANCELLED, out->message, n, fields, values, st);
    case OUT_RETRY:
        return pv_op_retry_later(t->redis, &c->keys, &c->opts, rec, token, out->delay_ms, out->code,
                                 out->message, dead, st);
    case OUT_RELEASE:
        return pv_op_release(t->redis, &c->keys, &c->opts, rec, token, st);
    case OUT_HANDED: /* written by the hand-over itself */
        return PV_OK;
    }
    return pv_status_set(st, PV_INTERNAL, "unknown outcome %d", (int)out->kind);
}

/* Between tries of a write that matters while Redis is away. Not cut short by the stop: the
 * shutdown deadline bounds it. */
static void outage_pause(void) {
    struct timespec ts = {0, (long)wk_random_between(100, 500) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Writes the outcome, retrying while Redis is away (the writes are fenced: a retry after a reply
 * that was lost is refused instead of applied twice). Returns the final code. */
static int commit(pool_thread *t, wk_op *op, const outcome *out, bool *dead, outage *o,
                  pv_status *st) {
    bool unsure = false; /* an earlier try may have been applied without us hearing back */
    int rc = PV_OK;
    for (int i = 0; i < COMMIT_TRIES; i++) {
        rc = write_outcome(t, op, out, dead, st);
        outage_note(o, "pool", rc, st);
        if (rc == PV_ABORTED && unsure) {
            pv_op now;
            memset(&now, 0, sizeof now);
            pv_status gst;
            bool applied =
                pv_op_get(t->redis, &t->c->keys, wk_op_record(op)->id, &now, &gst) == PV_OK &&
                now.status != PV_OP_RUNNING;
            pv_op_clear(&now);
            if (applied) return PV_OK;
        }
        if (rc != PV_UNAVAILABLE) return rc;
        unsure = true;
        outage_pause();
    }
    return rc;
}

/* pivirt_operations_handled_total{kind,outcome}: one delivery handled. */
static void count_handled(struct wk_consumer *c, const char *kind, const char *result) {
    if (!c->metrics) return;
    char labels[256];
    const char *kv[] = {"kind", kind, "outcome", result};
    pv_metrics_labels(labels, sizeof labels, 2, kv);
    pv_metrics_count(c->metrics, "pivirt_operations_handled_total",
                     "Deliveries of operations this worker handled, by kind and outcome.", labels,
                     1);
}

static void run_op(pool_thread *t, pv_op *rec, int64_t token, outage *o) {
    struct wk_consumer *c = t->c;
    wk_env env = {.redis = t->redis,
                  .keys = &c->keys,
                  .opts = &c->opts,
                  .lease_ms = c->lease_ms,
                  .test_operations = c->test_operations,
                  .context = c->context,
                  .cfg = c->cfg};
    wk_op *op = NULL;
    pv_status st;
    if (wk_op_new(&env, rec, token, &op, &st) != PV_OK) {
        pv_error("op id=%s: %s; left for redelivery", rec->id, st.msg);
        return;
    }
    const pv_op *r = wk_op_record(op);
    slot_register(t, op);
    pv_info("op start id=%s kind=%s attempt=%d/%d", r->id, r->kind, r->attempts, r->max_attempts);
    int64_t t0 = pv_time_mono_ms();

    pv_status hst;
    pv_status_clear(&hst);
    int rc = wk_handler_run(op, &hst);
    outcome out;
    decide(c, op, rc, &hst, &out);

    const char *result = outcome_name(out.kind);
    bool dead = false;
    if (wk_op_is_lost(op) && out.kind != OUT_HANDED) { /* a renew after it may find it gone */
        wk_op_stop_code(op, &st);
        pv_warn("op lease lost id=%s kind=%s attempt=%d: %s; nothing more is written", r->id,
                r->kind, r->attempts, st.msg);
        result = "lease-lost";
    } else if ((rc = commit(t, op, &out, &dead, o, &st)) == PV_ABORTED) {
        wk_op_set_lost(op, st.msg);
        pv_warn("op lease lost id=%s kind=%s attempt=%d: %s; outcome %s not written", r->id,
                r->kind, r->attempts, st.msg, result);
        result = "lease-lost";
    } else if (rc != PV_OK) {
        pv_warn("op id=%s outcome %s not written: %s; left for redelivery", r->id, result, st.msg);
        result = "unwritten";
    } else if (dead) {
        result = "FAILED(dead-letter)";
    }
    slot_unregister(t);
    double ms = (double)(pv_time_mono_ms() - t0);
    count_handled(c, r->kind ? r->kind : "", result);
    if (c->metrics) {
        char labels[256];
        const char *kv[] = {"kind", r->kind ? r->kind : ""};
        if (out.kind == OUT_SUCCEEDED || out.kind == OUT_FAILED || out.kind == OUT_CANCELLED) {
            pv_metrics_labels(labels, sizeof labels, 1, kv);
            pv_metrics_observe(c->metrics, "pivirt_operation_duration_seconds",
                               "Time a worker took on the delivery that ended an operation.",
                               labels, ms / 1e3);
        }
    }
    if (out.kind == OUT_SUCCEEDED)
        pv_info("op end id=%s kind=%s attempt=%d outcome=%s ms=%.0f", r->id, r->kind, r->attempts,
                result, ms);
    else if (out.kind == OUT_RETRY)
        pv_info("op end id=%s kind=%s attempt=%d outcome=%s delay_ms=%d ms=%.0f code=%s msg=\"%s\"",
                r->id, r->kind, r->attempts, result, out.delay_ms, ms, pv_code_name(out.code),
                out.message);
    else
        pv_info("op end id=%s kind=%s attempt=%d outcome=%s ms=%.0f code=%s msg=\"%s\"", r->id,
                r->kind, r->attempts, result, ms, pv_code_name(out.code), out.message);
    wk_op_free(op);
}

/* An entry that arrived after stop: acquired only to be handed straight back. */
static void hand_back(pool_thread *t, pv_op *rec, int64_t token, outage *o) {
    pv_status st;
    int rc = PV_UNAVAILABLE;
    for (int i = 0; i < COMMIT_TRIES && rc == PV_UNAVAILABLE; i++) {
        if (i > 0) outage_pause();
        rc = pv_op_release(t->redis, &t->c->keys, &t->c->opts, rec, token, &st);
        outage_note(o, "pool", rc, &st);
    }
    if (rc == PV_OK)
        pv_info("op handed back id=%s kind=%s (shutting down)", rec->id, rec->kind);
    else
        pv_warn("op id=%s not handed back: %s; left for redelivery", rec->id, st.msg);
}

/* The pre-lease step of a fresh delivery (never while stopping: then it is leased and handed
 * straight back as any other). true: dealt with. */
static bool prelease(pool_thread *t, const job *j) {
    struct wk_consumer *c = t->c;
    if (!j->prelease || is_stopping(c)) return false;
    wk_prelease p = {.context = c->context,
                     .redis = t->redis,
                     .keys = &c->keys,
                     .cfg = c->cfg,
                     .opts = &c->opts,
                     .queue = c->queue,
                     .consumer = c->consumer,
                     .op_id = j->op_id,
                     .entry = j->entry};
    if (!c->prelease(&p)) return false;
    count_handled(c, c->prelease_kind, "handed-over"); /* as a leased hand-over is */
    return true;
}

static void process(pool_thread *t, job *j, outage *o) {
    if (prelease(t, j)) return;
    pv_op rec;
    memset(&rec, 0, sizeof rec);
    int64_t token = 0;
    pv_op_acquire_result res = PV_OP_ACQ_GONE;
    int rc = PV_OK;
    if (j->acquired) { /* leased by the reader: take the record over */
        rec = j->rec;
        memset(&j->rec, 0, sizeof j->rec);
        token = j->token;
        res = PV_OP_ACQ_RUN;
    } else {
        rc = acquire(t, j, &rec, &token, &res, o);
    }
    if (rc == PV_OK) {
        if (res == PV_OP_ACQ_RUN && is_stopping(t->c))
            hand_back(t, &rec, token, o);
        else if (res == PV_OP_ACQ_RUN)
            run_op(t, &rec, token, o);
        else
            log_not_run(j->op_id, j->entry, &rec, res);
    }
    pv_op_clear(&rec);
}

static void *pool_main(void *arg) {
    pool_thread *t = arg;
    struct wk_consumer *c = t->c;
    outage o = {false};
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!c->head && !c->closing)
            pthread_cond_wait(&c->work_cv, &c->mu);
        job *j = c->head;
        if (j) {
            c->head = j->next;
            if (!c->head) c->tail = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        if (!j) break;
        process(t, j, &o);
        job_free(j);
        pthread_mutex_lock(&c->mu);
        c->busy--;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* --- the lease keeper ------------------------------------------------------------------------- */

static void renew_one(struct wk_consumer *c, wk_op *op, outage *o) {
    pv_status st;
    bool cancel = false;
    int rc = pv_op_renew(c->keeper_redis, &c->keys, wk_op_record(op), c->consumer, wk_op_token(op),
                         c->lease_ms, &cancel, &st);
    outage_note(o, "lease keeper", rc, &st);
    if (rc == PV_OK && cancel && !wk_op_is_cancelled(op)) {
        pv_info("op cancel requested id=%s", wk_op_record(op)->id);
        wk_op_set_cancel(op);
    } else if (rc == PV_ABORTED && !wk_op_is_lost(op)) {
        pv_warn("op lease lost id=%s: %s", wk_op_record(op)->id, st.msg);
        wk_op_set_lost(op, st.msg);
    } else if (rc == PV_FAILED_PRECONDITION) {
        /* Finished by its own handler thread between the snapshot and this renewal. */
        pv_debug("op renew id=%s: %s", wk_op_record(op)->id, st.msg);
    } else if (rc != PV_OK && rc != PV_UNAVAILABLE && rc != PV_ABORTED) {
        pv_warn("op renew id=%s: %s", wk_op_record(op)->id, st.msg);
    }
}

static void *keeper_main(void *arg) {
    struct wk_consumer *c = arg;
    outage o = {false};
    int every = c->lease_ms / 3 < RENEW_EVERY_MS ? c->lease_ms / 3 : RENEW_EVERY_MS;
    if (every < 20) every = 20;
    wk_op **held = calloc((size_t)c->concurrency, sizeof *held);
    int *index = calloc((size_t)c->concurrency, sizeof *index);
    if (!held || !index) {
        pv_error("lease keeper: out of memory; leases will not be renewed");
        free(held);
        free(index);
        return NULL;
    }
    pthread_mutex_lock(&c->mu);
    while (!c->keeper_stop) {
        int64_t until = pv_time_mono_ms() + every;
        while (!c->keeper_stop && pv_time_mono_ms() < until)
            wait_on(c, &c->keeper_cv, until - pv_time_mono_ms());
        if (c->keeper_stop) break;
        int n = 0;
        for (int i = 0; i < c->concurrency; i++) {
            if (!c->slots[i].op) continue;
            c->slots[i].renewing = true;
            held[n] = c->slots[i].op;
            index[n++] = i;
        }
        pthread_mutex_unlock(&c->mu);
        for (int i = 0; i < n; i++)
            renew_one(c, held[i], &o);
        pthread_mutex_lock(&c->mu);
        for (int i = 0; i < n; i++)
            c->slots[index[i]].renewing = false;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    free(held);
    free(index);
    return NULL;
}

/* --- start and stop --------------------------------------------------------------------------- */

static void consumer_free(struct wk_consumer *c) {
    if (!c) return;
    while (c->head) {
        job *next = c->head->next;
        job_free(c->head);
        c->head = next;
    }
    for (int i = 0; c->pool && i < c->concurrency; i++)
        pv_redis_free(c->pool[i].redis);
    free(c->pool);
    free(c->slots);
    pv_redis_free(c->reader_redis);
    pv_redis_free(c->keeper_redis);
    pv_redis_free(c->control_redis);
    free(c->queue);
    free(c->consumer);
    free(c->prelease_kind);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->keeper_cv);
    free(c);
}

static int new_redis(const pv_config *cfg, int extra_timeout_ms, pv_redis **out, pv_status *st) {
    pv_redis_opts ro;
    pv_redis_opts_from_config(cfg, &ro);
    ro.command_timeout_ms += extra_timeout_ms;
    return pv_redis_new(&ro, out, st);
}

static int configure(struct wk_consumer *c, const wk_consumer_opts *o, pv_status *st) {
    const pv_config *cfg = o->cfg;
    c->queue = strdup(o->queue);
    c->consumer = strdup(o->consumer);
    if (!c->queue || !c->consumer) return pv_status_set(st, PV_INTERNAL, "out of memory");
    c->concurrency = cfg->worker.concurrency > 0 ? cfg->worker.concurrency : 1;
    c->lease_ms = cfg->worker.lease_ms > 0 ? cfg->worker.lease_ms : 10000;
    c->backoff_base_ms = cfg->worker.backoff_base_ms > 0 ? cfg->worker.backoff_base_ms : 1;
    c->backoff_max_ms = cfg->worker.backoff_max_ms > 0 ? cfg->worker.backoff_max_ms : 1;
    c->shutdown_ms = cfg->worker.shutdown_ms >= 0 ? cfg->worker.shutdown_ms : 0;
    c->test_operations = cfg->test_operations;
    c->context = o->context;
    c->metrics = o->metrics;
    if (o->prelease && o->prelease_kind) {
        if (!(c->prelease_kind = strdup(o->prelease_kind)))
            return pv_status_set(st, PV_INTERNAL, "out of memory");
        c->prelease = o->prelease;
    }
    c->cfg = cfg;
    c->opts.retention_seconds = cfg->ops.retention_seconds;
    c->opts.events_maxlen = cfg->ops.events_maxlen;
    if (pv_keys_init(&c->keys, cfg->redis.prefix, st) != PV_OK ||
        pv_op_queue_key(&c->keys, c->queue, c->stream, sizeof c->stream, st) != PV_OK)
        return st->code;
    c->slots = calloc((size_t)c->concurrency, sizeof *c->slots);
    c->pool = calloc((size_t)c->concurrency, sizeof *c->pool);
    if (!c->slots || !c->pool) return pv_status_set(st, PV_INTERNAL, "out of memory");
    /* The reader blocks up to MAX_BLOCK_MS inside a command: its timeout must cover that. */
    if (new_redis(cfg, MAX_BLOCK_MS, &c->reader_redis, st) != PV_OK ||
        new_redis(cfg, 0, &c->keeper_redis, st) != PV_OK ||
        new_redis(cfg, 0, &c->control_redis, st) != PV_OK)
        return st->code;
    for (int i = 0; i < c->concurrency; i++) {
        c->pool[i].c = c;
        c->pool[i].index = i;
        if (new_redis(cfg, 0, &c->pool[i].redis, st) != PV_OK) return st->code;
    }
    return PV_OK;
}

static void join_all(struct wk_consumer *c) {
    if (c->reader_started) pthread_join(c->reader, NULL);
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    c->keeper_stop = true;
    pthread_cond_broadcast(&c->work_cv);
    pthread_cond_broadcast(&c->keeper_cv);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->concurrency; i++)
        if (c->pool[i].started) pthread_join(c->pool[i].thread, NULL);
    if (c->keeper_started) pthread_join(c->keeper, NULL);
}

int wk_consumer_start(const wk_consumer_opts *o, wk_consumer **out, pv_status *st) {
    *out = NULL;
    struct wk_consumer *c = calloc(1, sizeof *c);
    if (!c) return pv_status_set(st, PV_INTERNAL, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pv_time_cond_init(&c->cv);
    pv_time_cond_init(&c->work_cv);
    pv_time_cond_init(&c->keeper_cv);
    if (configure(c, o, st) != PV_OK) {
        consumer_free(c);
        return st->code;
    }
    bool ok = pthread_create(&c->keeper, NULL, keeper_main, c) == 0;
    c->keeper_started = ok;
    for (int i = 0; ok && i < c->concurrency; i++)
        ok = c->pool[i].started =
            pthread_create(&c->pool[i].thread, NULL, pool_main, &c->pool[i]) == 0;
    if (ok) ok = c->reader_started = pthread_create(&c->reader, NULL, reader_main, c) == 0;
    if (!ok) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_mutex_unlock(&c->mu);
        join_all(c);
        consumer_free(c);
        return pv_status_set(st, PV_INTERNAL, "cannot start the consumer threads");
    }
    *out = c;
    return PV_OK;
}

/* Interrupts the reader's blocking read until the reader has seen the stop. */
static void stop_reader(struct wk_consumer *c) {
    pthread_mutex_lock(&c->mu);
    while (!c->reader_done) {
        long long id = c->reader_id;
        pthread_mutex_unlock(&c->mu);
        if (id > 0) {
            redisReply *reply = NULL;
            pv_status st;
            pv_redis_command(c->control_redis, &reply, &st, "CLIENT UNBLOCK %lld", id);
            if (reply) freeReplyObject(reply);
        }
        pthread_mutex_lock(&c->mu);
        if (!c->reader_done) wait_ms(c, 50);
    }
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->reader, NULL);
    c->reader_started = false;
}

/* After the deadline: hands back what still runs (its handler ignored the stop). */
static int release_stragglers(struct wk_consumer *c) {
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->concurrency; i++) {
        wk_op *op = c->slots[i].op;
        if (!op || wk_op_is_lost(op)) continue;
        const pv_op *rec = wk_op_record(op);
        pv_status st;
        wk_op_set_lost(op, "handed back at shutdown");
        if (pv_op_release(c->control_redis, &c->keys, &c->opts, rec, wk_op_token(op), &st) == PV_OK)
            pv_warn("op id=%s kind=%s did not stop within %d ms: handed back", rec->id, rec->kind,
                    c->shutdown_ms);
        else
            pv_warn("op id=%s kind=%s did not stop within %d ms and could not be handed back: "
                    "%s; left for redelivery",
                    rec->id, rec->kind, c->shutdown_ms, st.msg);
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

bool wk_consumer_stop(wk_consumer *c) {
    if (!c) return true;
    int64_t deadline = pv_time_mono_ms() + c->shutdown_ms;
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    int running = 0;
    for (int i = 0; i < c->concurrency; i++) {
        if (!c->slots[i].op) continue;
        wk_op_set_shutdown(c->slots[i].op);
        running++;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pv_info("stopping queue=%s: no new work; %d operations running", c->queue, running);
    stop_reader(c);

    pthread_mutex_lock(&c->mu);
    while (c->busy > 0 && pv_time_mono_ms() < deadline)
        wait_ms(c, deadline - pv_time_mono_ms());
    bool idle = c->busy == 0;
    pthread_mutex_unlock(&c->mu);
    if (!idle && release_stragglers(c) > 0) {
        pthread_mutex_lock(&c->mu);
        c->keeper_stop = true;
        pthread_cond_broadcast(&c->keeper_cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->keeper, NULL);
        return false;
    }
    join_all(c);
    consumer_free(c);
    return true;
}
