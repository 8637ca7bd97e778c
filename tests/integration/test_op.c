/*
 * Operation records on a real Redis (pv_op + the pv_op_* functions of functions.lua): submit
 * writes record, entry, locks, index, idempotency key and event together; leases are fenced so
 * a worker that lost its lease commits nothing; retries, dead letters, cancel, release, trim,
 * listing and the consistency check behave as pv_op.h says. Every test reads Redis directly
 * (a plain hiredis connection) to check what was written, not only what pv_op reports.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_op.h"
#include "pv_redis.h"
#include "pv_test_redis.h"
#include "pv_upload.h"

#define Q "t:{ops}:q:"
#define LOCK "t:{ops}:lock:"
#define OPKEY "t:{ops}:op:"
#define OPS_BASE "t:{ops}:"

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    redisContext *c; /* independent connection for checks and for simulating accidents */
    pv_op_opts opts;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_keys_init(&f->keys, "t:", &st);
    if (!(f->r = pv_test_redis_client(f->srv, 5000))) return -1;
    f->c = pv_test_redis_connect(f->srv);
    if (!f->c) return -1;
    f->opts.retention_seconds = 3600;
    f->opts.events_maxlen = 1000;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    redisFree(f->c);
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

/* ---- direct Redis access ---- */

static redisReply *cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    return rep;
}

/* A command whose reply does not matter (it must not be an error). */
static void exec_cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    assert_int_not_equal(rep->type, REDIS_REPLY_ERROR);
    freeReplyObject(rep);
}

static long long num(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

/* A string reply as a malloc'd string; NULL for nil. */
static char *text(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    char *s = NULL;
    if (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
        s = strdup(rep->str);
    else
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);
    return s;
}

static void assert_text(fixture *f, const char *want, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    if (want == NULL) {
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    } else {
        assert_int_equal(rep->type, REDIS_REPLY_STRING);
        assert_string_equal(rep->str, want);
    }
    freeReplyObject(rep);
}

static int64_t wall_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* The value of field `name` in a flat field/value array. */
static const char *field(const redisReply *flat, const char *name) {
    for (size_t i = 0; i + 1 < flat->elements; i += 2)
        if (strcmp(flat->element[i]->str, name) == 0) return flat->element[i + 1]->str;
    return NULL;
}

/* The newest entry of the events stream as a reply (caller frees); its fields are element[1]. */
static redisReply *last_event(fixture *f) {
    redisReply *rep = cmd(f, "XREVRANGE t:{ops}:events + - COUNT 1");
    assert_int_equal(rep->elements, 1);
    return rep;
}

static void assert_last_event(fixture *f, const char *op, const char *status,
                              const char *message_part) {
    redisReply *ev = last_event(f);
    const redisReply *fl = ev->element[0]->element[1];
    assert_string_equal(field(fl, "op"), op);
    assert_string_equal(field(fl, "status"), status);
    assert_non_null(field(fl, "kind"));
    assert_non_null(field(fl, "target"));
    assert_non_null(field(fl, "progress"));
    assert_non_null(field(fl, "worker"));
    assert_non_null(strstr(field(fl, "message"), message_part));
    freeReplyObject(ev);
}

/* Entries of a queue stream that carry op id. */
static int entries_of(fixture *f, const char *queue, const char *id) {
    redisReply *rep = cmd(f, "XRANGE " Q "%s - +", queue);
    int n = 0;
    for (size_t i = 0; i < rep->elements; i++)
        if (strcmp(field(rep->element[i]->element[1], "op"), id) == 0) n++;
    freeReplyObject(rep);
    return n;
}

static long long pending_count(fixture *f, const char *queue) {
    redisReply *rep = cmd(f, "XPENDING " Q "%s workers", queue);
    long long n = rep->element[0]->integer;
    freeReplyObject(rep);
    return n;
}

/* The entry ids of a queue stream, joined with spaces (caller frees). */
static char *stream_ids(fixture *f, const char *queue) {
    redisReply *rep = cmd(f, "XRANGE " Q "%s - +", queue);
    char *out = calloc(1, rep->elements * 32 + 1);
    for (size_t i = 0; i < rep->elements; i++) {
        if (i) strcat(out, " ");
        strcat(out, rep->element[i]->element[0]->str);
    }
    freeReplyObject(rep);
    return out;
}

/* ---- pipeline steps ---- */

static pv_op submit_full(fixture *f, const char *kind, const char *target, const char *queue,
                         const char *rid, const char *const *holds, size_t n_holds,
                         int max_attempts) {
    pv_op op;
    bool existed = true;
    pv_status st;
    pv_op_submit_req req = {.kind = kind,
                            .target = target,
                            .queue = queue,
                            .params_json = "{\"ms\":\"10\"}",
                            .metadata_json = "{\"node_id\":\"n\"}",
                            .request_id = rid,
                            .max_attempts = max_attempts,
                            .holds = holds,
                            .n_holds = n_holds};
    int rc = pv_op_submit(f->r, &f->keys, &f->opts, &req, &op, &existed, &st);
    if (rc != PV_OK) fail_msg("submit %s on %s: %s", kind, target, st.msg);
    assert_false(existed);
    return op;
}

static pv_op submit(fixture *f, const char *target) {
    return submit_full(f, "test.sleep", target, "ops", NULL, NULL, 0, 0);
}

static void ensure_group(fixture *f, const char *queue) {
    pv_status st;
    assert_int_equal(pv_op_ensure_group(f->r, &f->keys, queue, &st), PV_OK);
}

/* Copies the first entry of an XREADGROUP/XAUTOCLAIM entry list. Returns 1 when there was one. */
static int first_entry(const redisReply *list, char *entry, char *op_id) {
    if (list->type != REDIS_REPLY_ARRAY || list->elements == 0) return 0;
    const redisReply *e = list->element[0];
    snprintf(entry, 64, "%s", e->element[0]->str);
    snprintf(op_id, PV_ID_MAX, "%s", field(e->element[1], "op"));
    return 1;
}

/* XREADGROUP one new entry for consumer, as a worker does. */
static int read_entry(fixture *f, const char *queue, const char *consumer, char *entry,
                      char *op_id) {
    redisReply *rep =
        cmd(f, "XREADGROUP GROUP workers %s COUNT 1 STREAMS " Q "%s >", consumer, queue);
    int got =
        rep->type == REDIS_REPLY_ARRAY && first_entry(rep->element[0]->element[1], entry, op_id);
    freeReplyObject(rep);
    return got;
}

/* XAUTOCLAIM one entry idle at least min_idle ms, as a worker does for a dead worker's work. */
static int autoclaim(fixture *f, const char *queue, const char *consumer, int min_idle, char *entry,
                     char *op_id) {
    redisReply *rep =
        cmd(f, "XAUTOCLAIM " Q "%s workers %s %d 0-0 COUNT 1", queue, consumer, min_idle);
    int got = first_entry(rep->element[1], entry, op_id);
    freeReplyObject(rep);
    return got;
}

static pv_op_acquire_result acquire(fixture *f, const char *queue, const char *consumer,
                                    const char *entry, const char *op_id, int lease_ms, pv_op *op,
                                    int64_t *token) {
    pv_op_acquire_result res;
    pv_status st;
    int rc = pv_op_acquire(f->r, &f->keys, &f->opts, queue, consumer, entry, op_id, lease_ms, op,
                           token, &res, &st);
    if (rc != PV_OK) fail_msg("acquire %s: %s", op_id, st.msg);
    return res;
}

/* Reads the next entry of queue and leases it: the usual start of a run. */
static void take(fixture *f, const char *queue, const char *consumer, int lease_ms, pv_op *op,
                 int64_t *token) {
    char entry[64], id[PV_ID_MAX];
    assert_int_equal(read_entry(f, queue, consumer, entry, id), 1);
    assert_int_equal(acquire(f, queue, consumer, entry, id, lease_ms, op, token), PV_OP_ACQ_RUN);
    assert_string_equal(op->entry, entry);
}

static void finish(fixture *f, const pv_op *op, int64_t token, pv_op_status status) {
    pv_status st;
    int rc = pv_op_finish(f->r, &f->keys, &f->opts, op, token, status, 0, "", &st);
    if (rc != PV_OK) fail_msg("finish %s: %s", op->id, st.msg);
}

static pv_op get(fixture *f, const char *id) {
    pv_op op;
    pv_status st;
    int rc = pv_op_get(f->r, &f->keys, id, &op, &st);
    if (rc != PV_OK) fail_msg("get %s: %s", id, st.msg);
    return op;
}

/* The operations' audit (pv_op_check) finds no problem. */
static void assert_audit_clean(fixture *f) {
    char *report = NULL;
    int problems = -1;
    pv_status st;
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    if (problems != 0) fail_msg("audit: %d problem(s): %s", problems, report ? report : "");
    free(report);
}

/* ---- tests ---- */

static void test_submit_and_get(void **state) {
    fixture *f = *state;
    int64_t before = wall_ms();
    pv_op op = submit(f, "node-1");
    int64_t after = wall_ms();
    assert_int_equal(strncmp(op.id, "op-", 3), 0);
    assert_string_equal(op.kind, "test.sleep");
    assert_string_equal(op.target, "node-1");
    assert_string_equal(op.queue, "ops");
    assert_int_equal(op.status, PV_OP_PENDING);
    assert_false(pv_op_done(&op));
    assert_int_equal(op.progress, 0);
    assert_int_equal(op.attempts, 0);
    assert_int_equal(op.max_attempts, PV_OP_DEFAULT_MAX_ATTEMPTS);
    assert_int_equal(op.error_code, 0);
    assert_string_equal(op.params, "{\"ms\":\"10\"}");
    assert_string_equal(op.metadata, "{\"node_id\":\"n\"}");
    assert_string_equal(op.request_id, "");
    assert_string_equal(op.worker, "");
    assert_false(op.cancel_requested);
    assert_true(op.created_ms >= before - 1000 && op.created_ms <= after + 1000);
    assert_int_equal(op.updated_ms, op.created_ms);
    assert_int_equal(op.started_ms, 0);
    assert_int_equal(op.finished_ms, 0);

    /* The stream entry, the index, the lock and the event were written with it. */
    redisReply *rep = cmd(f, "XRANGE " Q "ops - +");
    assert_int_equal(rep->elements, 1);
    assert_string_equal(rep->element[0]->element[0]->str, op.entry);
    assert_string_equal(field(rep->element[0]->element[1], "op"), op.id);
    assert_string_equal(field(rep->element[0]->element[1], "kind"), "test.sleep");
    freeReplyObject(rep);
    char *score = text(f, "ZSCORE t:{ops}:index %s", op.id);
    assert_int_equal(strtoll(score, NULL, 10), op.created_ms);
    free(score);
    assert_text(f, op.id, "GET " LOCK "node-1");
    assert_last_event(f, op.id, "PENDING", "submitted to queue ops");

    pv_op got = get(f, op.id);
    assert_string_equal(got.id, op.id);
    assert_string_equal(got.kind, op.kind);
    assert_string_equal(got.target, op.target);
    assert_string_equal(got.queue, op.queue);
    assert_string_equal(got.params, op.params);
    assert_string_equal(got.metadata, op.metadata);
    assert_string_equal(got.entry, op.entry);
    assert_int_equal(got.status, PV_OP_PENDING);
    assert_int_equal(got.created_ms, op.created_ms);
    assert_int_equal(got.max_attempts, op.max_attempts);
    pv_op_clear(&got);
    pv_op_clear(&got); /* clearing twice is allowed */

    pv_status st;
    assert_int_equal(pv_op_get(f->r, &f->keys, "op-nosuch", &got, &st), PV_NOT_FOUND);
    assert_non_null(strstr(st.msg, "op-nosuch"));
    assert_int_equal(pv_op_get(f->r, &f->keys, "", &got, &st), PV_INVALID_ARGUMENT);

    /* Defaults and validation. */
    pv_op_submit_req bad = {.kind = "test.sleep", .target = "", .queue = "ops"};
    bool existed;
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &bad, &got, &existed, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "target"));
    bad.target = "node-9";
    bad.params_json = "[1]";
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &bad, &got, &existed, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "params"));
    bad.params_json = NULL;
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &bad, &got, &existed, &st), PV_OK);
    assert_string_equal(got.params, "{}");
    assert_string_equal(got.metadata, "{}");
    pv_op_clear(&got);
    pv_op_clear(&op);
}

static void test_idempotency(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_op a = submit_full(f, "test.sleep", "node-1", "ops", "req-1", NULL, 0, 0);
    assert_string_equal(a.request_id, "req-1");
    long long ttl = num(f, "TTL t:{ops}:idem:req-1");
    assert_true(ttl > 86000 && ttl <= PV_OP_IDEMPOTENCY_SECONDS);
    assert_text(f, a.id, "GET t:{ops}:idem:req-1");

    /* Same request id: the same operation, even with other arguments and while it holds the
     * target; nothing new is written. */
    pv_op_submit_req again = {
        .kind = "test.fail", .target = "node-1", .queue = "ops", .request_id = "req-1"};
    pv_op b;
    bool existed = false;
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &again, &b, &existed, &st), PV_OK);
    assert_true(existed);
    assert_string_equal(b.id, a.id);
    assert_string_equal(b.kind, "test.sleep");
    assert_int_equal(entries_of(f, "ops", a.id), 1);
    assert_int_equal(num(f, "XLEN " Q "ops"), 1);
    assert_int_equal(num(f, "ZCARD t:{ops}:index"), 1);
    pv_op_clear(&b);

    /* A different request id is a different operation. */
    pv_op c = submit_full(f, "test.sleep", "node-2", "ops", "req-2", NULL, 0, 0);
    assert_string_not_equal(c.id, a.id);

    /* Still the same operation once it has finished. */
    ensure_group(f, "ops");
    pv_op run;
    int64_t token;
    take(f, "ops", "w1", 10000, &run, &token);
    assert_string_equal(run.id, a.id);
    finish(f, &run, token, PV_OP_SUCCEEDED);
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &again, &b, &existed, &st), PV_OK);
    assert_true(existed);
    assert_string_equal(b.id, a.id);
    assert_int_equal(b.status, PV_OP_SUCCEEDED);
    assert_int_equal(entries_of(f, "ops", a.id), 1);
    pv_op_clear(&b);

    /* An idempotency key whose record expired no longer blocks the request id. */
    exec_cmd(f, "DEL " OPKEY "%s", a.id);
    pv_op d = submit_full(f, "test.sleep", "node-1", "ops", "req-1", NULL, 0, 0);
    assert_string_not_equal(d.id, a.id);
    assert_text(f, d.id, "GET t:{ops}:idem:req-1");
    pv_op_clear(&run);
    pv_op_clear(&a);
    pv_op_clear(&c);
    pv_op_clear(&d);
}

static void test_locks(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op a = submit(f, "node-1");
    pv_op b;
    bool existed;
    pv_op_submit_req req = {.kind = "node.drain", .target = "node-1", .queue = "ops"};
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &req, &b, &existed, &st), PV_ABORTED);
    assert_non_null(strstr(st.msg, "node-1 is held by operation"));
    assert_non_null(strstr(st.msg, a.id));
    assert_non_null(strstr(st.msg, "(test.sleep)"));
    assert_int_equal(num(f, "XLEN " Q "ops"), 1); /* nothing written */

    /* A cluster operation holds its nodes: a node operation on one of them is refused. */
    const char *nodes[] = {"node-2", "node-3", "cluster-1", "node-2"};
    pv_op c = submit_full(f, "cluster.upgrade", "cluster-1", "ops", NULL, nodes, 4, 0);
    assert_text(f, c.id, "GET " LOCK "node-2");
    assert_text(f, c.id, "GET " LOCK "node-3");
    assert_text(f, c.id, "GET " LOCK "cluster-1");
    req.target = "node-3";
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &req, &b, &existed, &st), PV_ABORTED);
    assert_non_null(strstr(st.msg, "node-3 is held by operation"));
    assert_non_null(strstr(st.msg, c.id));
    assert_non_null(strstr(st.msg, "(cluster.upgrade)"));
    /* A node operation that would also hold a taken node is refused as a whole. */
    const char *also[] = {"node-1"};
    pv_op_submit_req req2 = {
        .kind = "node.drain", .target = "node-7", .queue = "ops", .holds = also, .n_holds = 1};
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &req2, &b, &existed, &st), PV_ABORTED);
    assert_non_null(strstr(st.msg, a.id));
    assert_int_equal(num(f, "EXISTS " LOCK "node-7"), 0);

    /* After the holders finish, the resources are free again (the cluster operation's finish
     * learns its holds from the record: the caller knew only its target). */
    pv_op run;
    int64_t token;
    take(f, "ops", "w1", 10000, &run, &token);
    assert_string_equal(run.id, a.id);
    finish(f, &run, token, PV_OP_SUCCEEDED);
    pv_op_clear(&run);
    take(f, "ops", "w1", 10000, &run, &token);
    assert_string_equal(run.id, c.id);
    finish(f, &run, token, PV_OP_FAILED);
    pv_op_clear(&run);
    assert_int_equal(
        num(f, "EXISTS " LOCK "node-1 " LOCK "node-2 " LOCK "node-3 " LOCK "cluster-1"), 0);
    pv_op d = submit_full(f, "node.drain", "node-3", "ops", NULL, NULL, 0, 0);
    assert_text(f, d.id, "GET " LOCK "node-3");

    /* Cancelling a pending cluster operation frees its holds too. */
    const char *nodes2[] = {"node-4", "node-5"};
    pv_op e = submit_full(f, "cluster.upgrade", "cluster-2", "ops", NULL, nodes2, 2, 0);
    pv_op cancelled;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, e.id, &cancelled, &st), PV_OK);
    assert_int_equal(cancelled.status, PV_OP_CANCELLED);
    assert_int_equal(num(f, "EXISTS " LOCK "node-4 " LOCK "node-5 " LOCK "cluster-2"), 0);
    pv_op_clear(&cancelled);

    /* A lock left by an operation whose record is gone is stale: taken over. */
    pv_op g = submit(f, "vol-1");
    exec_cmd(f, "DEL " OPKEY "%s", g.id);
    pv_op h = submit_full(f, "volume.resize", "vol-1", "ops", NULL, NULL, 0, 0);
    assert_text(f, h.id, "GET " LOCK "vol-1");
    /* So is one left by a finished operation. */
    exec_cmd(f, "SET " LOCK "vol-2 %s", a.id);
    pv_op i = submit(f, "vol-2");
    assert_text(f, i.id, "GET " LOCK "vol-2");

    pv_op *all[] = {&a, &c, &d, &e, &g, &h, &i};
    for (size_t n = 0; n < sizeof all / sizeof all[0]; n++)
        pv_op_clear(all[n]);
}

/* A target minted for its operation (target_unlocked: a deploy's "deploy-<id>") takes no lock:
 * the submit writes none and the end does not look for one (a lock planted under its name, even
 * naming it, is left alone: a locked target's end deletes it), while its holds still lock; the
 * audit finds nothing wrong with it running. */
static void test_unlocked_target(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    const char *holds[] = {"node-9"};
    pv_op_submit_req req = {.kind = "test.sleep",
                            .target = "deploy-1",
                            .queue = "ops",
                            .holds = holds,
                            .n_holds = 1,
                            .target_unlocked = true};
    pv_op a;
    bool existed;
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &req, &a, &existed, &st), PV_OK);
    assert_int_equal(num(f, "EXISTS " LOCK "deploy-1"), 0);
    assert_text(f, a.id, "GET " LOCK "node-9");
    assert_text(f, "1", "HGET " OPKEY "%s target_unlocked", a.id);
    pv_op run;
    int64_t token;
    take(f, "ops", "w1", 10000, &run, &token);
    assert_string_equal(run.id, a.id);
    assert_audit_clean(f);
    exec_cmd(f, "SET " LOCK "deploy-1 %s", a.id);
    finish(f, &run, token, PV_OP_SUCCEEDED);
    assert_text(f, a.id, "GET " LOCK "deploy-1");
    assert_int_equal(num(f, "EXISTS " LOCK "node-9"), 0);
    pv_op_clear(&run);
    pv_op_clear(&a);
}

/* The record's hash, journal included, as one string (to compare before/after). */
static char *record_dump(fixture *f, const char *id) {
    redisReply *rep = cmd(f, "HGETALL " OPKEY "%s", id);
    size_t len = 1;
    for (size_t i = 0; i < rep->elements; i++)
        len += rep->element[i]->len + 1;
    char *out = calloc(1, len);
    /* Field order of a small hash is insertion order, stable between two reads. */
    for (size_t i = 0; i < rep->elements; i++) {
        strcat(out, rep->element[i]->str);
        strcat(out, "\n");
    }
    freeReplyObject(rep);
    return out;
}

static void test_fencing(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op sub = submit(f, "node-1");
    char entry[64], id[PV_ID_MAX];
    assert_int_equal(read_entry(f, "ops", "w1", entry, id), 1);
    assert_string_equal(id, sub.id);

    pv_op old, cur, tmp;
    int64_t t1 = 0, t2 = 0, tx = 0;
    int64_t before = wall_ms();
    assert_int_equal(acquire(f, "ops", "w1", entry, id, 200, &old, &t1), PV_OP_ACQ_RUN);
    assert_true(t1 > 0);
    assert_int_equal(old.status, PV_OP_RUNNING);
    assert_int_equal(old.attempts, 1);
    assert_true(old.unjournaled); /* nothing journaled yet: the worker need not read it */
    assert_string_equal(old.worker, "w1");
    assert_true(old.started_ms >= before - 1000);
    assert_last_event(f, id, "RUNNING", "started by w1 (attempt 1 of 5)");
    assert_int_equal(pv_op_progress(f->r, &f->keys, &f->opts, &old, t1, 150, "half", &st), PV_OK);
    pv_op p = get(f, id);
    assert_int_equal(p.progress, 100); /* clamped */
    assert_string_equal(p.message, "half");
    pv_op_clear(&p);
    assert_int_equal(pv_op_journal_put(f->r, &f->keys, &old, t1, "step1", "v1", &st), PV_OK);

    /* While the lease lives another worker is turned away. */
    assert_int_equal(acquire(f, "ops", "w2", entry, id, 200, &tmp, &tx), PV_OP_ACQ_BUSY);
    assert_int_equal(tx, 0);
    pv_op_clear(&tmp);

    /* w1 stalls past its lease; w2 reclaims the entry and gets a newer token. */
    usleep(300 * 1000);
    char e2[64], id2[PV_ID_MAX];
    assert_int_equal(autoclaim(f, "ops", "w2", 250, e2, id2), 1);
    assert_string_equal(e2, entry);
    assert_int_equal(acquire(f, "ops", "w2", e2, id2, 10000, &cur, &t2), PV_OP_ACQ_RUN);
    assert_true(t2 > t1);
    assert_int_equal(cur.attempts, 2);
    assert_false(cur.unjournaled); /* w1 journaled step1: w2 must read the journal */
    assert_string_equal(cur.worker, "w2");
    assert_int_equal(cur.started_ms, old.started_ms);

    /* w1 wakes up: nothing it sends commits. */
    char *snapshot = record_dump(f, id);
    long long events = num(f, "XLEN t:{ops}:events");
    bool cancel = true, dead = true;
    assert_int_equal(pv_op_progress(f->r, &f->keys, &f->opts, &old, t1, 90, "stale", &st),
                     PV_ABORTED);
    assert_non_null(strstr(st.msg, "lease lost"));
    assert_non_null(strstr(st.msg, id));
    assert_int_equal(pv_op_journal_put(f->r, &f->keys, &old, t1, "step1", "stale", &st),
                     PV_ABORTED);
    assert_int_equal(pv_op_journal_put(f->r, &f->keys, &old, t1, "step2", "stale", &st),
                     PV_ABORTED);
    assert_int_equal(pv_op_renew(f->r, &f->keys, &old, "w1", t1, 200, &cancel, &st), PV_ABORTED);
    assert_false(cancel);
    assert_int_equal(pv_op_retry_later(f->r, &f->keys, &f->opts, &old, t1, 10, 14, "x", &dead, &st),
                     PV_ABORTED);
    assert_false(dead);
    assert_int_equal(pv_op_release(f->r, &f->keys, &f->opts, &old, t1, &st), PV_ABORTED);
    assert_int_equal(
        pv_op_finish(f->r, &f->keys, &f->opts, &old, t1, PV_OP_FAILED, 13, "stale", &st),
        PV_ABORTED);
    char want[256];
    snprintf(want, sizeof want, "lease lost: operation %s is now leased with a newer token", id);
    assert_string_equal(st.msg, want);
    char *after = record_dump(f, id);
    assert_string_equal(after, snapshot);
    assert_int_equal(num(f, "XLEN t:{ops}:events"), events);
    assert_int_equal(pending_count(f, "ops"), 1);
    free(after);
    free(snapshot);

    /* The current holder renews: the lease moves and the entry stops looking idle. */
    usleep(150 * 1000);
    char *lease0 = text(f, "HGET " OPKEY "%s lease_until_ms", id);
    assert_int_equal(pv_op_renew(f->r, &f->keys, &cur, "w2", t2, 10000, &cancel, &st), PV_OK);
    assert_false(cancel);
    char *lease1 = text(f, "HGET " OPKEY "%s lease_until_ms", id);
    assert_true(strtoll(lease1, NULL, 10) > strtoll(lease0, NULL, 10));
    free(lease0);
    free(lease1);
    redisReply *pend = cmd(f, "XPENDING " Q "ops workers - + 10");
    assert_int_equal(pend->elements, 1);
    assert_string_equal(pend->element[0]->element[1]->str, "w2");
    assert_true(pend->element[0]->element[2]->integer < 100);
    freeReplyObject(pend);

    /* The holder finishes; watchers hear it on the operation's channel. */
    char chan[PV_KEY_MAX];
    assert_int_equal(pv_op_channel(&f->keys, id, chan, sizeof chan, &st), PV_OK);
    assert_string_equal(chan + strlen(chan) - strlen(id), id);
    redisContext *sub_c = pv_test_redis_connect(f->srv);
    redisReply *sr = redisCommand(sub_c, "SUBSCRIBE %s", chan);
    freeReplyObject(sr);
    struct timeval tv = {2, 0};
    redisSetTimeout(sub_c, tv);
    finish(f, &cur, t2, PV_OP_SUCCEEDED);
    void *msg = NULL;
    assert_int_equal(redisGetReply(sub_c, &msg), REDIS_OK);
    redisReply *m = msg;
    assert_string_equal(m->element[0]->str, "message");
    assert_string_equal(m->element[2]->str, "SUCCEEDED");
    freeReplyObject(m);
    redisFree(sub_c);

    pv_op done = get(f, id);
    assert_int_equal(done.status, PV_OP_SUCCEEDED);
    assert_true(pv_op_done(&done));
    assert_int_equal(done.progress, 100);
    assert_int_equal(done.error_code, 0);
    assert_true(done.finished_ms >= done.started_ms && done.finished_ms > 0);
    assert_int_equal(pending_count(f, "ops"), 0);
    assert_int_equal(num(f, "EXISTS " LOCK "node-1"), 0);
    long long ttl = num(f, "TTL " OPKEY "%s", id);
    assert_true(ttl > 3500 && ttl <= 3600);
    assert_last_event(f, id, "SUCCEEDED", "half");
    char *v = NULL;
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, id, "step1", &v, &st), PV_OK);
    assert_string_equal(v, "v1");
    free(v);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, id, "step2", &v, &st), PV_OK);
    assert_null(v);

    /* Finishing again with the same token (an answer lost in transit) changes nothing; any
     * other write on a finished operation is refused. */
    events = num(f, "XLEN t:{ops}:events");
    finish(f, &cur, t2, PV_OP_SUCCEEDED);
    assert_int_equal(num(f, "XLEN t:{ops}:events"), events);
    assert_int_equal(pv_op_progress(f->r, &f->keys, &f->opts, &cur, t2, 5, "late", &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "already SUCCEEDED"));
    pv_op_clear(&done);
    pv_op_clear(&old);
    pv_op_clear(&cur);
    pv_op_clear(&sub);
}

static void test_journal(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op sub = submit(f, "node-1");
    char *v = (char *)"sentinel";
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, sub.id, "boot", &v, &st), PV_OK);
    assert_null(v);
    pv_op op;
    int64_t token;
    take(f, "ops", "w1", 10000, &op, &token);
    assert_int_equal(pv_op_journal_put(f->r, &f->keys, &op, token, "boot", "vm-7 started", &st),
                     PV_OK);
    assert_int_equal(pv_op_journal_put(f->r, &f->keys, &op, token, "copy", "", &st), PV_OK);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, sub.id, "boot", &v, &st), PV_OK);
    assert_string_equal(v, "vm-7 started");
    free(v);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, sub.id, "copy", &v, &st), PV_OK);
    assert_string_equal(v, "");
    free(v);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, sub.id, "other", &v, &st), PV_OK);
    assert_null(v);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, "op-nosuch", "boot", &v, &st), PV_NOT_FOUND);
    assert_null(v);
    /* An entry whose record expired: acked, GONE, and *out still has strings. */
    pv_op gone = submit(f, "node-2");
    char e[64], id[PV_ID_MAX];
    assert_int_equal(read_entry(f, "ops", "w1", e, id), 1);
    exec_cmd(f, "DEL " OPKEY "%s", gone.id);
    pv_op g;
    int64_t t = -1;
    assert_int_equal(acquire(f, "ops", "w1", e, id, 1000, &g, &t), PV_OP_ACQ_GONE);
    assert_string_equal(g.id, gone.id);
    assert_string_equal(g.kind, "");
    assert_int_equal(t, 0);
    assert_int_equal(pending_count(f, "ops"), 1); /* only the running one */
    pv_op_clear(&g);
    pv_op_clear(&gone);
    /* Journal fields stay out of the record a reader sees. */
    pv_op got = get(f, sub.id);
    assert_string_equal(got.id, sub.id);
    pv_op_clear(&got);
    pv_op_clear(&op);
    pv_op_clear(&sub);
}

/* An operation on target wl-1 submitted (*sub) and leased by worker w1 (*op, *token). */
static void submit_and_take(fixture *f, pv_op *sub, pv_op *op, int64_t *token) {
    ensure_group(f, "ops");
    *sub = submit(f, "wl-1");
    take(f, "ops", "w1", 10000, op, token);
}

/* The output stream: fenced appends, reads from the start, after an id and blocking, and the
 * stream expires with its record. */
static void test_output(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_op sub, op;
    int64_t token;
    submit_and_take(f, &sub, &op, &token);
    pv_op_output *out = NULL;
    size_t n = 99;
    assert_int_equal(pv_op_output_read(f->r, &f->keys, op.id, "0", 10, 0, &out, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    assert_null(out);
    const char *fields[] = {"id", "name"}, *v1[] = {"w-a", "app_web_abcdef"},
               *v2[] = {"w-b", "app_web_ghijkl"};
    char first[32];
    assert_int_equal(pv_op_output_add(f->r, &f->keys, &op, token, 2, fields, v1, first, &st),
                     PV_OK);
    assert_int_equal(pv_op_output_add(f->r, &f->keys, &op, token, 2, fields, v2, NULL, &st), PV_OK);
    assert_int_equal(pv_op_output_read(f->r, &f->keys, op.id, "0", 10, 0, &out, &n, &st), PV_OK);
    assert_int_equal(n, 2);
    assert_string_equal(out[0].id, first);
    assert_int_equal(out[0].n, 2);
    assert_string_equal(out[0].fields[1], "name");
    assert_string_equal(out[0].values[1], "app_web_abcdef");
    assert_string_equal(out[1].values[0], "w-b");
    pv_op_output_free(out, n);
    assert_int_equal(pv_op_output_read(f->r, &f->keys, op.id, first, 10, 0, &out, &n, &st), PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].values[0], "w-b");
    char last[32];
    snprintf(last, sizeof last, "%s", out[0].id);
    pv_op_output_free(out, n);
    int64_t t0 = wall_ms();
    assert_int_equal(pv_op_output_read(f->r, &f->keys, op.id, last, 10, 200, &out, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    assert_true(wall_ms() - t0 >= 150);
    /* A stale token writes nothing. */
    assert_int_equal(pv_op_output_add(f->r, &f->keys, &op, token + 1, 2, fields, v1, NULL, &st),
                     PV_ABORTED);
    assert_int_equal(num(f, "XLEN " OPS_BASE "out:%s", op.id), 2);
    assert_int_equal(num(f, "TTL " OPS_BASE "out:%s", op.id), -1);
    /* the last word told with the end (pv_op_finish_output): its entry, then the end's; a stale
     * token writes neither, a repeated end (its answer lost) no second entry */
    const char *v3[] = {"w-c", "app_web_mnopqr"};
    assert_int_equal(pv_op_finish_output(f->r, &f->keys, &f->opts, &op, token + 1, PV_OP_SUCCEEDED,
                                         0, "", 2, fields, v3, &st),
                     PV_ABORTED);
    assert_int_equal(num(f, "XLEN " OPS_BASE "out:%s", op.id), 2);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pv_op_finish_output(f->r, &f->keys, &f->opts, &op, token, PV_OP_SUCCEEDED,
                                             0, "", 2, fields, v3, &st),
                         PV_OK);
    assert_int_equal(num(f, "XLEN " OPS_BASE "out:%s", op.id), 4); /* w-c and the end */
    assert_int_equal(pv_op_output_read(f->r, &f->keys, op.id, last, 10, 0, &out, &n, &st), PV_OK);
    assert_int_equal(n, 1); /* the end entry is plumbing */
    assert_string_equal(out[0].values[0], "w-c");
    pv_op_output_free(out, n);
    assert_true(num(f, "TTL " OPS_BASE "out:%s", op.id) > 0);
    pv_op_clear(&op);
    pv_op_clear(&sub);
}

/* pv_op_output_journal: the output entry and the journal entries land together, fenced: a
 * stale token writes neither. */
static void test_output_journal(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_op sub, op;
    int64_t token;
    submit_and_take(f, &sub, &op, &token);
    const char *fields[] = {"type", "id"}, *values[] = {"workload", "w-a"};
    const char *steps[] = {"instance:a", "reported:a"}, *jvalues[] = {"{\"id\":\"w-a\"}", ""};
    assert_int_equal(pv_op_output_journal(f->r, &f->keys, &op, token + 1, 2, steps, jvalues, 2,
                                          fields, values, &st),
                     PV_ABORTED);
    assert_int_equal(num(f, "EXISTS " OPS_BASE "out:%s", op.id), 0);
    char *v = NULL;
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, op.id, "instance:a", &v, &st), PV_OK);
    assert_null(v);
    assert_int_equal(
        pv_op_output_journal(f->r, &f->keys, &op, token, 2, steps, jvalues, 2, fields, values, &st),
        PV_OK);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, op.id, "instance:a", &v, &st), PV_OK);
    assert_string_equal(v, "{\"id\":\"w-a\"}");
    free(v);
    assert_int_equal(pv_op_journal_get(f->r, &f->keys, op.id, "reported:a", &v, &st), PV_OK);
    assert_string_equal(v, "");
    free(v);
    pv_op_output *out = NULL;
    size_t n = 0;
    assert_int_equal(pv_op_output_read(f->r, &f->keys, op.id, "0", 10, 0, &out, &n, &st), PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(out[0].values[0], "workload");
    assert_string_equal(out[0].values[1], "w-a");
    pv_op_output_free(out, n);
    finish(f, &op, token, PV_OP_SUCCEEDED);
    pv_op_clear(&op);
    pv_op_clear(&sub);
}

/* notify_end: a waiter blocks on the output stream of an operation that writes no output and
 * wakes when it ends; readers never see the opening entry; the stream gets the retention. */
static void test_notify_end(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op sub;
    bool existed = true;
    pv_op_submit_req req = {
        .kind = "test.sleep", .target = "wl-n", .queue = "ops", .notify_end = true};
    assert_int_equal(pv_op_submit(f->r, &f->keys, &f->opts, &req, &sub, &existed, &st), PV_OK);
    assert_int_equal(num(f, "XLEN " OPS_BASE "out:%s", sub.id), 1);
    assert_true(num(f, "TTL " OPS_BASE "out:%s", sub.id) > 0);
    pv_op_output *out = NULL;
    size_t n = 99;
    assert_int_equal(pv_op_output_read(f->r, &f->keys, sub.id, "0", 10, 0, &out, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    assert_null(out);
    /* the opening entry wakes the first wait (nothing ended yet), then the wait blocks */
    const char *ids[] = {sub.id};
    char cursors[1][PV_OP_CURSOR_MAX] = {"0"};
    bool woke = false, ended = true;
    assert_int_equal(pv_op_output_wait(f->r, &f->keys, 1, ids, cursors, 200, &woke, &ended, &st),
                     PV_OK);
    assert_false(ended);
    int64_t t0 = wall_ms();
    assert_int_equal(pv_op_output_wait(f->r, &f->keys, 1, ids, cursors, 200, &woke, &ended, &st),
                     PV_OK);
    assert_false(woke);
    assert_true(wall_ms() - t0 >= 150);
    pv_op op;
    int64_t token;
    take(f, "ops", "w1", 10000, &op, &token);
    finish(f, &op, token, PV_OP_SUCCEEDED);
    assert_int_equal(pv_op_output_wait(f->r, &f->keys, 1, ids, cursors, 1000, &woke, &ended, &st),
                     PV_OK);
    assert_true(woke);
    assert_true(ended);
    assert_true(num(f, "TTL " OPS_BASE "out:%s", sub.id) >= f->opts.retention_seconds - 1);
    pv_op_clear(&op);
    pv_op_clear(&sub);
}

static int dead_letters_of(fixture *f, const char *id) {
    redisReply *rep = cmd(f, "XRANGE t:{ops}:dead - +");
    int n = 0;
    for (size_t i = 0; i < rep->elements; i++)
        if (strcmp(field(rep->element[i]->element[1], "op"), id) == 0) n++;
    freeReplyObject(rep);
    return n;
}

static void test_retry_and_dead_letter(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op sub = submit_full(f, "test.fail", "node-1", "ops", NULL, NULL, 0, 3);
    assert_int_equal(sub.max_attempts, 3);
    for (int attempt = 1; attempt <= 3; attempt++) {
        pv_op op;
        int64_t token;
        take(f, "ops", "w1", 10000, &op, &token);
        assert_string_equal(op.id, sub.id);
        assert_int_equal(op.attempts, attempt);
        char err[64];
        snprintf(err, sizeof err, "disk busy %d", attempt);
        bool dead = true;
        int moved = -1;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        assert_int_equal(
            pv_op_retry_later(f->r, &f->keys, &f->opts, &op, token, 150, 14, err, &dead, &st),
            PV_OK);
        assert_int_equal(pending_count(f, "ops"), 0);
        if (attempt < 3) {
            assert_false(dead);
            pv_op w = get(f, sub.id);
            assert_int_equal(w.status, PV_OP_PENDING);
            assert_string_equal(w.entry, "");
            assert_int_equal(w.error_code, 0);
            assert_non_null(strstr(w.message, err));
            assert_true(num(f, "ZCARD t:{ops}:delayed") == 1);
            assert_last_event(f, sub.id, "PENDING", "retrying in 150 ms");
            pv_op_clear(&w);
            /* Not due yet: nothing moves, nothing to read (unless this machine stalled the
             * test past the 150 ms: then it is due, rightly). */
            assert_int_equal(pv_op_promote_due(f->r, &f->keys, &f->opts, &moved, &st), PV_OK);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            long long ms = (t1.tv_sec - t0.tv_sec) * 1000LL + (t1.tv_nsec - t0.tv_nsec) / 1000000;
            char e[64], id[PV_ID_MAX];
            int early = moved;
            if (ms < 150) {
                assert_int_equal(early, 0);
                assert_int_equal(read_entry(f, "ops", "w1", e, id), 0);
            }
            usleep(200 * 1000);
            assert_int_equal(pv_op_promote_due(f->r, &f->keys, &f->opts, &moved, &st), PV_OK);
            assert_int_equal(early + moved, 1); /* queued again exactly once */
            assert_int_equal(num(f, "ZCARD t:{ops}:delayed"), 0);
            w = get(f, sub.id);
            assert_string_not_equal(w.entry, "");
            assert_string_not_equal(w.entry, op.entry);
            assert_int_equal(entries_of(f, "ops", sub.id), attempt + 1);
            pv_op_clear(&w);
        } else {
            assert_true(dead);
        }
        pv_op_clear(&op);
    }
    pv_op end = get(f, sub.id);
    assert_int_equal(end.status, PV_OP_FAILED);
    assert_int_equal(end.error_code, 14);
    assert_string_equal(end.error_message, "disk busy 3");
    assert_int_equal(end.attempts, 3);
    assert_int_equal(dead_letters_of(f, sub.id), 1);
    assert_int_equal(num(f, "EXISTS " LOCK "node-1"), 0);
    assert_last_event(f, sub.id, "FAILED", "disk busy 3");
    pv_op_clear(&end);

    /* Workers that die mid-run (nobody reports an error): the delivery after max_attempts
     * ends it FAILED and dead-lettered, once. */
    pv_op sub2 = submit_full(f, "test.sleep", "node-2", "ops", NULL, NULL, 0, 2);
    pv_op op;
    int64_t token;
    take(f, "ops", "w1", 100, &op, &token);
    pv_op_clear(&op);
    char e[64], id[PV_ID_MAX];
    for (int i = 0; i < 2; i++) {
        usleep(150 * 1000);
        assert_int_equal(autoclaim(f, "ops", "w2", 100, e, id), 1);
        assert_string_equal(id, sub2.id);
        pv_op_acquire_result res = acquire(f, "ops", "w2", e, id, 100, &op, &token);
        assert_int_equal(res, i == 0 ? PV_OP_ACQ_RUN : PV_OP_ACQ_DEAD);
        pv_op_clear(&op);
    }
    pv_op end2 = get(f, sub2.id);
    assert_int_equal(end2.status, PV_OP_FAILED);
    assert_int_equal(end2.attempts, 2);
    assert_int_equal(end2.error_code, PV_UNAVAILABLE);
    assert_non_null(strstr(end2.error_message, "never finished"));
    assert_int_equal(dead_letters_of(f, sub2.id), 1);
    assert_int_equal(pending_count(f, "ops"), 0);
    /* A late duplicate of the entry: acked, done, no second dead letter. */
    assert_int_equal(acquire(f, "ops", "w3", e, id, 100, &op, &token), PV_OP_ACQ_DONE);
    assert_int_equal(dead_letters_of(f, sub2.id), 1);
    pv_op_clear(&op);
    pv_op_clear(&end2);
    pv_op_clear(&sub2);
    pv_op_clear(&sub);
}

static void test_cancel(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");

    /* PENDING: cancelled at once, and it never runs. */
    pv_op a = submit(f, "node-1");
    pv_op c;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, a.id, &c, &st), PV_OK);
    assert_int_equal(c.status, PV_OP_CANCELLED);
    assert_int_equal(c.error_code, PV_CANCELLED);
    assert_true(c.cancel_requested);
    assert_true(c.finished_ms > 0);
    assert_int_equal(num(f, "EXISTS " LOCK "node-1"), 0);
    assert_last_event(f, a.id, "CANCELLED", "cancelled");
    int64_t updated = c.updated_ms;
    pv_op_clear(&c);
    char e[64], id[PV_ID_MAX];
    pv_op op;
    int64_t token = -1;
    assert_int_equal(read_entry(f, "ops", "w1", e, id), 1);
    assert_int_equal(acquire(f, "ops", "w1", e, id, 10000, &op, &token), PV_OP_ACQ_CANCELLED);
    assert_int_equal(token, 0);
    assert_int_equal(op.attempts, 0);
    assert_int_equal(op.started_ms, 0);
    assert_int_equal(pending_count(f, "ops"), 0);
    pv_op_clear(&op);

    /* A finished operation is returned unchanged. */
    usleep(5 * 1000);
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, a.id, &c, &st), PV_OK);
    assert_int_equal(c.status, PV_OP_CANCELLED);
    assert_int_equal(c.updated_ms, updated);
    pv_op_clear(&c);

    /* RUNNING: told through its record; its worker ends it CANCELLED (code 1). */
    pv_op b = submit(f, "node-2");
    take(f, "ops", "w1", 10000, &op, &token);
    assert_string_equal(op.id, b.id);
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, b.id, &c, &st), PV_OK);
    assert_int_equal(c.status, PV_OP_RUNNING);
    assert_true(c.cancel_requested);
    assert_last_event(f, b.id, "RUNNING", "cancel requested");
    pv_op_clear(&c);
    bool cancel = false;
    assert_int_equal(pv_op_renew(f->r, &f->keys, &op, "w1", token, 10000, &cancel, &st), PV_OK);
    assert_true(cancel);
    assert_int_equal(
        pv_op_finish(f->r, &f->keys, &f->opts, &op, token, PV_OP_CANCELLED, 0, NULL, &st), PV_OK);
    pv_op end = get(f, b.id);
    assert_int_equal(end.status, PV_OP_CANCELLED);
    assert_int_equal(end.error_code, 1);
    assert_int_equal(num(f, "EXISTS " LOCK "node-2"), 0);
    assert_int_equal(pending_count(f, "ops"), 0);
    pv_op_clear(&end);
    pv_op_clear(&op);

    /* A cancel requested while a run failed transiently ends it instead of retrying. */
    pv_op d = submit(f, "node-3");
    take(f, "ops", "w1", 10000, &op, &token);
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, d.id, &c, &st), PV_OK);
    pv_op_clear(&c);
    bool dead = true;
    assert_int_equal(
        pv_op_retry_later(f->r, &f->keys, &f->opts, &op, token, 100, 14, "flaky", &dead, &st),
        PV_OK);
    assert_false(dead);
    end = get(f, d.id);
    assert_int_equal(end.status, PV_OP_CANCELLED);
    assert_int_equal(num(f, "ZCARD t:{ops}:delayed"), 0);
    pv_op_clear(&end);
    pv_op_clear(&op);

    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, "op-nosuch", &c, &st), PV_NOT_FOUND);
    assert_non_null(strstr(st.msg, "op-nosuch"));
    pv_op_clear(&a);
    pv_op_clear(&b);
    pv_op_clear(&d);
}

static void test_release(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op sub = submit(f, "node-1");
    pv_op op;
    int64_t token;
    take(f, "ops", "w1", 10000, &op, &token);
    assert_int_equal(op.attempts, 1);
    assert_int_equal(pv_op_release(f->r, &f->keys, &f->opts, &op, token, &st), PV_OK);
    pv_op back = get(f, sub.id);
    assert_int_equal(back.status, PV_OP_PENDING);
    assert_int_equal(back.attempts, 0);
    assert_string_not_equal(back.entry, op.entry);
    assert_int_equal(entries_of(f, "ops", sub.id), 2);
    assert_int_equal(pending_count(f, "ops"), 0); /* the old entry is acked */
    assert_text(f, sub.id, "GET " LOCK "node-1"); /* still holds its target */
    assert_last_event(f, sub.id, "PENDING", "handed back by w1");

    /* The old holder's token is dead; another worker takes the fresh entry at once. */
    assert_int_equal(pv_op_release(f->r, &f->keys, &f->opts, &op, token, &st), PV_ABORTED);
    pv_op again;
    int64_t t2;
    take(f, "ops", "w2", 10000, &again, &t2);
    assert_string_equal(again.id, sub.id);
    assert_string_equal(again.entry, back.entry);
    assert_int_equal(again.attempts, 1);
    assert_true(t2 > token);
    pv_op_clear(&again);
    pv_op_clear(&back);
    pv_op_clear(&op);
    pv_op_clear(&sub);
}

/* Hands the operation taken from "ops" over to node:n1 (pv_op_handover), with its announcement;
 * *back is the record after it. */
static void hand_over(fixture *f, const pv_op *op, int64_t token, int timeout_ms, pv_op *back) {
    pv_status st;
    const char *fields[] = {"type", "op"}, *values[] = {"node", op->id};
    int rc = pv_op_handover(f->r, &f->keys, &f->opts, op, token, "node:n1", "{\"node\":\"n1\"}",
                            timeout_ms, 2, fields, values, &st);
    if (rc != PV_OK) fail_msg("handover %s: %s", op->id, st.msg);
    *back = get(f, op->id);
}

/* pv_op_handover: the operation goes on on another queue, at once, fenced; a cancel or a
 * timeout while it waits there hands it back to the ops queue, where it runs (to be undone)
 * instead of ending where it stands; a cancel while it runs there lets it run. */
/* pv_op_handover_pending with the test's output entry; *moved is the answer. */
static int hand_over_pending(fixture *f, const char *id, const char *entry, bool *moved) {
    pv_status st;
    const char *fields[] = {"type", "node"}, *values[] = {"node", "n1"};
    int rc = pv_op_handover_pending(f->r, &f->keys, &f->opts, id, "ops", entry, "w1", "node:n1",
                                    "{\"node\":\"n1\"}", 60000, 2, fields, values, moved, &st);
    if (rc != PV_OK) fail_msg("hand over %s: %s", id, st.msg);
    return rc;
}

/* A delivered, never leased operation handed over straight from PENDING: on the node's queue
 * with its new params and timeout, its ops entry acknowledged, announced, no token, no
 * RUNNING, no attempt counted, and the node's worker leases it as any hand-over. Not when the
 * record moved: cancelled, leased (by a worker that claimed the entry), on another entry, or
 * handed over already; then nothing is written and the entry stays the caller's. */
static void test_handover_pending(void **state) {
    fixture *f = *state;
    ensure_group(f, "ops");
    ensure_group(f, "node:n1");
    pv_op sub = submit(f, "node-1");
    char entry[64], id[PV_ID_MAX];
    assert_int_equal(read_entry(f, "ops", "w1", entry, id), 1);
    bool moved = true;
    hand_over_pending(f, "op-none", entry, &moved);
    assert_true(moved); /* no such record */
    hand_over_pending(f, sub.id, "1-1", &moved);
    assert_true(moved); /* not its entry */
    assert_int_equal(pending_count(f, "ops"), 1);
    hand_over_pending(f, sub.id, entry, &moved);
    assert_false(moved);
    pv_op now = get(f, sub.id);
    assert_int_equal(now.status, PV_OP_PENDING);
    assert_string_equal(now.queue, "node:n1");
    assert_string_equal(now.params, "{\"node\":\"n1\"}");
    assert_int_equal(now.attempts, 0);
    assert_int_equal(now.started_ms, 0);
    assert_int_equal(pending_count(f, "ops"), 0);
    assert_int_equal(entries_of(f, "node:n1", sub.id), 1);
    assert_int_equal(num(f, "XLEN t:{ops}:out:%s", sub.id), 1);
    char *due = text(f, "ZSCORE t:{ops}:delayed %s", sub.id);
    assert_non_null(due);
    free(due);
    assert_last_event(f, sub.id, "PENDING", "handed over to queue node:n1 by w1");
    hand_over_pending(f, sub.id, entry, &moved);
    assert_true(moved); /* handed over already: once */
    assert_int_equal(entries_of(f, "node:n1", sub.id), 1);
    pv_op on_node;
    int64_t token;
    take(f, "node:n1", "a1", 10000, &on_node, &token);
    assert_null(text(f, "ZSCORE t:{ops}:delayed %s", sub.id));
    finish(f, &on_node, token, PV_OP_SUCCEEDED);
    pv_op_clear(&on_node);
    pv_op_clear(&now);
    pv_op_clear(&sub);

    /* cancelled while planned: ended at once by the cancel, the hand-over refused */
    sub = submit(f, "node-2");
    assert_int_equal(read_entry(f, "ops", "w1", entry, id), 1);
    pv_op out;
    pv_status st;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, sub.id, &out, &st), PV_OK);
    assert_int_equal(out.status, PV_OP_CANCELLED);
    hand_over_pending(f, sub.id, entry, &moved);
    assert_true(moved);
    assert_int_equal(entries_of(f, "node:n1", sub.id), 0);
    pv_op_clear(&out);
    pv_op_clear(&sub);

    /* leased meanwhile (another worker claimed the entry and acquired it): its run is left be */
    sub = submit(f, "node-3");
    assert_int_equal(read_entry(f, "ops", "w1", entry, id), 1);
    pv_op run;
    assert_int_equal(acquire(f, "ops", "w2", entry, sub.id, 10000, &run, &token), PV_OP_ACQ_RUN);
    hand_over_pending(f, sub.id, entry, &moved);
    assert_true(moved);
    now = get(f, sub.id);
    assert_int_equal(now.status, PV_OP_RUNNING);
    assert_string_equal(now.queue, "ops");
    assert_audit_clean(f);
    pv_op_clear(&now);
    pv_op_clear(&run);
    pv_op_clear(&sub);
}

static void test_handover(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    ensure_group(f, "node:n1");
    pv_op sub = submit(f, "node-1"), op, back, on_node;
    int64_t token, t2;
    take(f, "ops", "w1", 10000, &op, &token);
    hand_over(f, &op, token, 60000, &back);
    char *due = text(f, "ZSCORE t:{ops}:delayed %s", sub.id);
    assert_non_null(due); /* the timeout of the hand-over */
    free(due);
    assert_int_equal(back.status, PV_OP_PENDING);
    assert_string_equal(back.queue, "node:n1");
    assert_string_equal(back.params, "{\"node\":\"n1\"}");
    assert_int_equal(back.attempts, 0); /* the handing worker's delivery does not count */
    assert_int_equal(pending_count(f, "ops"), 0);
    assert_int_equal(entries_of(f, "node:n1", sub.id), 1);
    assert_text(f, sub.id, "GET " LOCK "node-1"); /* still holds its target */
    assert_int_equal(num(f, "XLEN t:{ops}:out:%s", sub.id), 1);
    assert_last_event(f, sub.id, "PENDING", "handed over to queue node:n1 by w1");
    /* fenced: the old token writes nothing, not even a second hand-over */
    const char *fields[] = {"type"}, *values[] = {"node"};
    assert_int_equal(pv_op_handover(f->r, &f->keys, &f->opts, &op, token, "node:n1", "{}", 1, 1,
                                    fields, values, &st),
                     PV_ABORTED);
    assert_int_equal(entries_of(f, "node:n1", sub.id), 1);
    /* the node's worker takes it; a cancel then lets it run (its handler finishes it) */
    take(f, "node:n1", "a1", 10000, &on_node, &t2);
    assert_null(text(f, "ZSCORE t:{ops}:delayed %s", sub.id)); /* its timeout is moot */
    pv_op out;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, sub.id, &out, &st), PV_OK);
    assert_int_equal(out.status, PV_OP_RUNNING);
    assert_true(out.cancel_requested);
    finish(f, &on_node, t2, PV_OP_CANCELLED);
    pv_op_clear(&out);
    pv_op_clear(&on_node);
    pv_op_clear(&back);
    pv_op_clear(&op);
    pv_op_clear(&sub);

    /* cancelled while it waits on the node's queue: back on "ops" with the cancel, and run */
    sub = submit(f, "node-2");
    take(f, "ops", "w1", 10000, &op, &token);
    /* entry ids are per stream: here the hand-over's entry on node:n1 and the hand-back's on ops
     * read the same (both streams' last ids set alike), as two made in one millisecond can */
    freeReplyObject(cmd(f, "XSETID " Q "node:n1 9999999999999-0"));
    freeReplyObject(cmd(f, "XSETID " Q "ops 9999999999999-0"));
    hand_over(f, &op, token, 60000, &back);
    assert_string_equal(back.entry, "9999999999999-1");
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, sub.id, &out, &st), PV_OK);
    assert_int_equal(out.status, PV_OP_PENDING);
    assert_string_equal(out.queue, "ops");
    assert_true(out.cancel_requested);
    assert_text(f, sub.id, "GET " LOCK "node-2");
    pv_op_clear(&out);
    take(f, "ops", "w2", 10000, &on_node, &t2); /* RUN, not CANCELLED: it is to be undone */
    assert_true(on_node.cancel_requested);
    assert_string_equal(on_node.entry, "9999999999999-1");
    /* the stale entry on the node's queue is skipped */
    char entry[64], id[PV_ID_MAX];
    assert_int_equal(read_entry(f, "node:n1", "a1", entry, id), 1);
    assert_int_equal(acquire(f, "node:n1", "a1", entry, id, 10000, &out, &t2), PV_OP_ACQ_DONE);
    pv_op_clear(&out);
    pv_op_clear(&on_node);
    pv_op_clear(&back);
    pv_op_clear(&op);
    pv_op_clear(&sub);

    /* no worker of node:n1 takes it in time: pv_op_promote_due hands it back the same way */
    sub = submit(f, "node-3");
    take(f, "ops", "w1", 10000, &op, &token);
    hand_over(f, &op, token, 1, &back);
    usleep(20000);
    int moved = 0;
    assert_int_equal(pv_op_promote_due(f->r, &f->keys, &f->opts, &moved, &st), PV_OK);
    assert_int_equal(moved, 1);
    pv_op now = get(f, sub.id);
    assert_int_equal(now.status, PV_OP_PENDING);
    assert_string_equal(now.queue, "ops");
    assert_true(now.cancel_requested);
    assert_last_event(f, sub.id, "PENDING", "took it in time");
    assert_audit_clean(f);
    pv_op_clear(&now);
    pv_op_clear(&back);
    pv_op_clear(&op);
    pv_op_clear(&sub);
}

static void test_trim(void **state) {
    fixture *f = *state;
    pv_status st;
    long long trimmed = -1;
    /* No group yet: nothing was delivered, nothing goes. */
    pv_op first = submit_full(f, "test.sleep", "t-0", "trimq", NULL, NULL, 0, 0);
    assert_int_equal(pv_op_trim(f->r, &f->keys, "trimq", &trimmed, &st), PV_OK);
    assert_int_equal(trimmed, 0);
    assert_int_equal(num(f, "XLEN " Q "trimq"), 1);
    assert_int_equal(pv_op_trim(f->r, &f->keys, "nosuchq", &trimmed, &st), PV_OK);
    assert_int_equal(trimmed, 0);

    ensure_group(f, "trimq");
    ensure_group(f, "trimq"); /* an existing group is fine */
    char target[16];
    for (int i = 1; i < 6; i++) {
        snprintf(target, sizeof target, "t-%d", i);
        pv_op o = submit_full(f, "test.sleep", target, "trimq", NULL, NULL, 0, 0);
        pv_op_clear(&o);
    }
    /* Deliver E0..E3; finish E0 and E2; E1 and E3 stay pending; E4, E5 undelivered. */
    pv_op run[4];
    int64_t tok[4];
    for (int i = 0; i < 4; i++)
        take(f, "trimq", "w1", 10000, &run[i], &tok[i]);
    finish(f, &run[0], tok[0], PV_OP_SUCCEEDED);
    finish(f, &run[2], tok[2], PV_OP_SUCCEEDED);
    char *before = stream_ids(f, "trimq");
    assert_int_equal(pv_op_trim(f->r, &f->keys, "trimq", &trimmed, &st), PV_OK);
    assert_int_equal(trimmed, 1); /* only E0, below the oldest pending E1 */
    char *after = stream_ids(f, "trimq");
    assert_string_equal(after, strchr(before, ' ') + 1);
    assert_int_equal(pending_count(f, "trimq"), 2);
    free(after);

    /* Nothing pending: the bound is the first undelivered entry, E4. */
    finish(f, &run[1], tok[1], PV_OP_SUCCEEDED);
    finish(f, &run[3], tok[3], PV_OP_SUCCEEDED);
    assert_int_equal(pv_op_trim(f->r, &f->keys, "trimq", &trimmed, &st), PV_OK);
    assert_int_equal(trimmed, 3);
    assert_int_equal(num(f, "XLEN " Q "trimq"), 2);
    pv_op next;
    int64_t t;
    take(f, "trimq", "w1", 10000, &next, &t); /* E4 is still there to be read */
    assert_int_equal(pv_op_trim(f->r, &f->keys, "trimq", &trimmed, &st), PV_OK);
    assert_int_equal(trimmed, 0); /* E4 pending, E5 undelivered */
    finish(f, &next, t, PV_OP_SUCCEEDED);
    pv_op_clear(&next);
    take(f, "trimq", "w1", 10000, &next, &t);
    finish(f, &next, t, PV_OP_SUCCEEDED);
    pv_op_clear(&next);
    /* Everything delivered and acked: all of it goes. */
    assert_int_equal(pv_op_trim(f->r, &f->keys, "trimq", &trimmed, &st), PV_OK);
    assert_int_equal(trimmed, 2);
    assert_int_equal(num(f, "XLEN " Q "trimq"), 0);
    free(before);
    for (int i = 0; i < 4; i++)
        pv_op_clear(&run[i]);
    pv_op_clear(&first);
}

static void test_list(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    const char *kinds[] = {"a.x", "b.y", "a.x", "b.y", "a.x"};
    const char *targets[] = {"n-1", "n-2", "n-3", "n-4", "n-5"};
    char ids[5][PV_ID_MAX];
    for (int i = 0; i < 5; i++) {
        pv_op o = submit_full(f, kinds[i], targets[i], "ops", NULL, NULL, 0, 0);
        strcpy(ids[i], o.id);
        pv_op_clear(&o);
        usleep(3 * 1000); /* distinct creation times, so newest-first is one order */
    }
    pv_op run;
    int64_t tok;
    take(f, "ops", "w1", 10000, &run, &tok); /* ids[0] */
    finish(f, &run, tok, PV_OP_SUCCEEDED);
    pv_op_clear(&run);
    take(f, "ops", "w1", 10000, &run, &tok); /* ids[1] stays RUNNING */
    pv_op_clear(&run);

    pv_op *ops = NULL;
    size_t n = 0;
    pv_op_filter all = {.limit = 100};
    assert_int_equal(pv_op_list(f->r, &f->keys, &all, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 5);
    for (int i = 0; i < 5; i++)
        assert_string_equal(ops[i].id, ids[4 - i]);
    pv_op_array_free(ops, n);

    pv_op_filter by_kind = {.kind = "a.x", .limit = 100};
    assert_int_equal(pv_op_list(f->r, &f->keys, &by_kind, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 3);
    assert_string_equal(ops[0].id, ids[4]);
    assert_string_equal(ops[1].id, ids[2]);
    assert_string_equal(ops[2].id, ids[0]);
    pv_op_array_free(ops, n);

    pv_op_filter by_target = {.target = "n-4", .limit = 100};
    assert_int_equal(pv_op_list(f->r, &f->keys, &by_target, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ops[0].id, ids[3]);
    assert_string_equal(ops[0].kind, "b.y");
    pv_op_array_free(ops, n);

    pv_op_filter by_status = {.status = PV_OP_PENDING, .limit = 100};
    assert_int_equal(pv_op_list(f->r, &f->keys, &by_status, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ops[i].status, PV_OP_PENDING);
    pv_op_array_free(ops, n);
    pv_op_filter running = {.status = PV_OP_RUNNING, .kind = "b.y", .limit = 100};
    assert_int_equal(pv_op_list(f->r, &f->keys, &running, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ops[0].id, ids[1]);
    pv_op_array_free(ops, n);

    pv_op_filter limited = {.limit = 2};
    assert_int_equal(pv_op_list(f->r, &f->keys, &limited, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 2);
    assert_string_equal(ops[0].id, ids[4]);
    assert_string_equal(ops[1].id, ids[3]);
    pv_op_array_free(ops, n);

    pv_op_filter none = {.kind = "c.z", .limit = 10};
    assert_int_equal(pv_op_list(f->r, &f->keys, &none, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    pv_op_array_free(ops, n);

    /* An expired record is skipped and leaves the index. */
    exec_cmd(f, "DEL " OPKEY "%s", ids[2]);
    assert_int_equal(pv_op_list(f->r, &f->keys, &all, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++)
        assert_string_not_equal(ops[i].id, ids[2]);
    pv_op_array_free(ops, n);
    assert_null(text(f, "ZSCORE t:{ops}:index %s", ids[2]));
}

/* Ends a PENDING operation (CANCELLED), so its target is free again. */
static void cancel_pending(fixture *f, const char *id) {
    pv_op out;
    pv_status st;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, id, &out, &st), PV_OK);
    assert_int_equal(out.status, PV_OP_CANCELLED);
    pv_op_clear(&out);
}

/* ops (n of them) are exactly the odd-numbered of ids, each once, newest first (ids created in
 * the same ms come in any order among themselves). */
static void assert_odd_newest_first(char (*ids)[PV_ID_MAX], int n_ids, const pv_op *ops, size_t n) {
    assert_int_equal(n, n_ids / 2);
    bool *seen = calloc((size_t)n_ids, sizeof *seen);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(ops[i].kind, "k.odd");
        if (i > 0) assert_true(ops[i].created_ms <= ops[i - 1].created_ms);
        int at = -1;
        for (int j = 1; j < n_ids && at < 0; j += 2)
            if (strcmp(ids[j], ops[i].id) == 0) at = j;
        assert_true(at >= 0);
        assert_false(seen[at]);
        seen[at] = true;
    }
    free(seen);
}

/* ListOperations' filters read the kind's and the target's index: every page comes back in
 * order across pages and ties of created ms, the target's index lives with its newest record,
 * and each submit trims members whose record expired. */
static void test_list_indexes(void **state) {
    fixture *f = *state;
    pv_status st;
    enum { N = 250 }; /* more than a page of 100, fast enough for many equal created_ms */
    char(*ids)[PV_ID_MAX] = calloc(N, sizeof *ids);
    for (int i = 0; i < N; i++) {
        /* Every third on the target "shared" (ended before the next one may take it), the
         * others on their own targets; kinds alternate. */
        char target[32];
        if (i % 3 == 0)
            snprintf(target, sizeof target, "shared");
        else
            snprintf(target, sizeof target, "own-%d", i);
        pv_op o = submit_full(f, i % 2 ? "k.odd" : "k.even", target, "ops", NULL, NULL, 0, 0);
        strcpy(ids[i], o.id);
        if (i % 3 == 0 && i < N - 1) cancel_pending(f, o.id);
        pv_op_clear(&o);
    }
    assert_int_equal(num(f, "ZCARD t:{ops}:by-kind:k.even"), N / 2);
    assert_int_equal(num(f, "ZCARD t:{ops}:by-kind:k.odd"), N / 2);
    assert_int_equal(num(f, "ZCARD t:{ops}:by-target:shared"), (N + 2) / 3);
    assert_int_equal(num(f, "ZCARD t:{ops}:by-target:own-1"), 1);

    pv_op *ops = NULL;
    size_t n = 0;
    pv_op_filter odd = {.kind = "k.odd", .limit = 1000};
    assert_int_equal(pv_op_list(f->r, &f->keys, &odd, &ops, &n, &st), PV_OK);
    assert_int_equal(n, N / 2);
    assert_odd_newest_first(ids, N, ops, n);
    pv_op_array_free(ops, n);

    /* One operation at a time on "shared", so each was created after the previous ended:
     * their order is the submits'. */
    pv_op_filter shared_even = {.kind = "k.even", .target = "shared", .limit = 1000};
    assert_int_equal(pv_op_list(f->r, &f->keys, &shared_even, &ops, &n, &st), PV_OK);
    size_t want = 0;
    for (int i = N - 1; i >= 0; i--)
        if (i % 3 == 0 && i % 2 == 0) {
            assert_true(want < n);
            assert_string_equal(ops[want].id, ids[i]);
            want++;
        }
    assert_int_equal(n, want);
    pv_op_array_free(ops, n);

    pv_op_filter few = {.target = "shared", .status = PV_OP_CANCELLED, .limit = 3};
    assert_int_equal(pv_op_list(f->r, &f->keys, &few, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ops[0].status, PV_OP_CANCELLED);
    assert_string_equal(ops[0].id, ids[246]); /* 249 is the last on "shared", still PENDING */
    pv_op_array_free(ops, n);

    /* The target's index has no expiry while an operation on it is unfinished, and the
     * retention of the record once the newest one ended. */
    assert_int_equal(num(f, "TTL t:{ops}:by-target:shared"), -1);
    assert_int_equal(num(f, "TTL t:{ops}:by-target:own-2"), -1);
    cancel_pending(f, ids[2]);
    long long ttl = num(f, "TTL t:{ops}:by-target:own-2");
    assert_true(ttl > 3500 && ttl <= 3600);
    cancel_pending(f, ids[249]);
    ttl = num(f, "TTL t:{ops}:by-target:shared");
    assert_true(ttl > 3500 && ttl <= 3600);
    pv_op o = submit_full(f, "k.even", "shared", "ops", NULL, NULL, 0, 0);
    assert_int_equal(num(f, "TTL t:{ops}:by-target:shared"), -1);

    /* Trimming: members older than the retention whose record is gone leave the indexes a
     * submit adds to; an old one whose record still lives (a long-running operation) stays.
     * One submit in four checks them (the one whose id's last byte is a multiple of 4). */
    int64_t old = wall_ms() - 3601 * 1000LL;
    exec_cmd(f, "ZADD t:{ops}:index %lld ghost-1", (long long)old);
    exec_cmd(f, "ZADD t:{ops}:by-kind:k.even %lld ghost-1", (long long)old);
    exec_cmd(f, "ZADD t:{ops}:by-target:shared %lld ghost-1", (long long)old);
    exec_cmd(f, "ZADD t:{ops}:by-kind:k.even %lld %s", (long long)old + 1, o.id);
    cancel_pending(f, o.id);
    pv_op next = submit_full(f, "k.even", "shared", "ops", NULL, NULL, 0, 0);
    while ((unsigned char)next.id[strlen(next.id) - 1] % 4 != 0) {
        char *still = text(f, "ZSCORE t:{ops}:index ghost-1"); /* not a checking submit */
        assert_non_null(still);
        free(still);
        cancel_pending(f, next.id);
        pv_op_clear(&next);
        next = submit_full(f, "k.even", "shared", "ops", NULL, NULL, 0, 0);
    }
    assert_null(text(f, "ZSCORE t:{ops}:index ghost-1"));
    assert_null(text(f, "ZSCORE t:{ops}:by-kind:k.even ghost-1"));
    assert_null(text(f, "ZSCORE t:{ops}:by-target:shared ghost-1"));
    char *kept = text(f, "ZSCORE t:{ops}:by-kind:k.even %s", o.id);
    assert_non_null(kept);
    free(kept);
    pv_op_clear(&next);
    pv_op_clear(&o);
    free(ids);
}

static void test_check(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    char *report = NULL;
    int problems = -1;
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    assert_int_equal(problems, 0);
    assert_string_equal(report, "");
    free(report);

    /* A healthy mix: finished, running, waiting out a retry, pending, cancelled. */
    const char *nodes[] = {"node-8", "node-9"};
    pv_op done = submit(f, "n-1");
    pv_op running = submit_full(f, "cluster.upgrade", "c-1", "ops", NULL, nodes, 2, 0);
    pv_op retry = submit(f, "n-3");
    pv_op run;
    int64_t tok;
    take(f, "ops", "w1", 10000, &run, &tok);
    finish(f, &run, tok, PV_OP_SUCCEEDED);
    pv_op_clear(&run);
    take(f, "ops", "w1", 10000, &run, &tok);
    pv_op_clear(&run);
    take(f, "ops", "w1", 10000, &run, &tok);
    bool dead;
    assert_int_equal(
        pv_op_retry_later(f->r, &f->keys, &f->opts, &run, tok, 60000, 14, "later", &dead, &st),
        PV_OK);
    pv_op_clear(&run);
    pv_op pending = submit(f, "n-4");
    pv_op gone_entry = submit(f, "n-5");
    pv_op gone_record = submit(f, "n-6");
    pv_op c;
    pv_op cancelled = submit(f, "n-7");
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, cancelled.id, &c, &st), PV_OK);
    pv_op_clear(&c);
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    if (problems != 0) fail_msg("unexpected problems:\n%s", report);
    free(report);

    /* Someone deletes a pending operation's stream entry by hand. */
    exec_cmd(f, "XDEL " Q "ops %s", gone_entry.entry);
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    assert_int_equal(problems, 1);
    assert_non_null(strstr(report, gone_entry.id));
    assert_non_null(strstr(report, "has no entry"));
    free(report);

    /* ... and another one's record: its entry and its lock now point at nothing. */
    exec_cmd(f, "DEL " OPKEY "%s", gone_record.id);
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    assert_int_equal(problems, 3);
    char line[256];
    snprintf(line, sizeof line, "entry %s carries operation %s, which has no record",
             gone_record.entry, gone_record.id);
    assert_non_null(strstr(report, line));
    snprintf(line, sizeof line, "lock of n-6 names operation %s, which has no record",
             gone_record.id);
    assert_non_null(strstr(report, line));
    free(report);

    /* A pending operation's entry delivered and acked by hand: it would never run. */
    char e[64], id[PV_ID_MAX];
    assert_int_equal(read_entry(f, "ops", "w1", e, id), 1);
    assert_string_equal(id, pending.id);
    exec_cmd(f, "XACK " Q "ops workers %s", e);
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    assert_int_equal(problems, 4);
    snprintf(line, sizeof line, "operation %s (PENDING) entry %s of t:{ops}:q:ops was delivered",
             pending.id, e);
    assert_non_null(strstr(report, line));
    free(report);

    pv_op *all[] = {&done, &running, &retry, &pending, &gone_entry, &gone_record, &cancelled};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        pv_op_clear(all[i]);
}

static void test_atomicity_many(void **state) {
    fixture *f = *state;
    pv_status st;
    enum { N = 200 };
    char(*ids)[PV_ID_MAX] = calloc(N, PV_ID_MAX);
    char(*entries)[64] = calloc(N, 64);
    char target[32];
    for (int i = 0; i < N; i++) {
        snprintf(target, sizeof target, "node-%d", i);
        pv_op o = submit(f, target);
        strcpy(ids[i], o.id);
        strcpy(entries[i], o.entry);
        pv_op_clear(&o);
    }
    assert_int_equal(num(f, "XLEN " Q "ops"), N);
    assert_int_equal(num(f, "ZCARD t:{ops}:index"), N);
    redisReply *rep = cmd(f, "XRANGE " Q "ops - +");
    assert_int_equal(rep->elements, N);
    for (int i = 0; i < N; i++) {
        int found = 0;
        for (size_t e = 0; e < rep->elements; e++)
            if (strcmp(field(rep->element[e]->element[1], "op"), ids[i]) == 0) {
                found++;
                assert_string_equal(rep->element[e]->element[0]->str, entries[i]);
            }
        assert_int_equal(found, 1);
        pv_op g = get(f, ids[i]);
        assert_string_equal(g.entry, entries[i]);
        pv_op_clear(&g);
    }
    freeReplyObject(rep);

    assert_audit_clean(f);

    /* Listing pages through the index: every one once, newest first. */
    pv_op *ops = NULL;
    size_t n = 0;
    pv_op_filter all = {.limit = 1000};
    assert_int_equal(pv_op_list(f->r, &f->keys, &all, &ops, &n, &st), PV_OK);
    assert_int_equal(n, N);
    for (size_t i = 1; i < n; i++) {
        assert_true(ops[i].created_ms <= ops[i - 1].created_ms);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(ops[i].id, ops[j].id);
    }
    pv_op_array_free(ops, n);
    pv_op_filter some = {.limit = 150};
    assert_int_equal(pv_op_list(f->r, &f->keys, &some, &ops, &n, &st), PV_OK);
    assert_int_equal(n, 150);
    pv_op_array_free(ops, n);
    free(ids);
    free(entries);
}

/* The worker's batch paths: pv_op_acquire_batch leases n delivered entries in one round trip
 * with exactly the outcomes pv_op_acquire gives one by one, and pv_op_take reads and leases a
 * backlog in one call, nothing when there is nothing new. */
static void test_acquire_batch_and_take(void **state) {
    fixture *f = *state;
    pv_status st;
    ensure_group(f, "ops");
    pv_op a = submit(f, "batch-1"), b = submit(f, "batch-2"), c = submit(f, "batch-3");
    pv_op cancelled;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, b.id, &cancelled, &st), PV_OK);
    pv_op_clear(&cancelled);

    char entries[3][64], ids[3][PV_ID_MAX];
    const char *ep[3], *ip[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(read_entry(f, "ops", "w1", entries[i], ids[i]), 1);
        ep[i] = entries[i];
        ip[i] = ids[i];
    }
    assert_string_equal(ids[0], a.id);
    assert_string_equal(ids[1], b.id);
    assert_string_equal(ids[2], c.id);
    pv_op out[3];
    int64_t tokens[3];
    pv_op_acquire_result res[3];
    int rcs[3];
    pv_status sts[3];
    memset(out, 0, sizeof out);
    assert_int_equal(pv_op_acquire_batch(f->r, &f->keys, &f->opts, "ops", "w1", 3, ep, ip, 10000,
                                         out, tokens, res, rcs, sts),
                     PV_OK);
    assert_int_equal(rcs[0], PV_OK);
    assert_int_equal(rcs[1], PV_OK);
    assert_int_equal(rcs[2], PV_OK);
    assert_int_equal(res[0], PV_OP_ACQ_RUN);
    assert_int_equal(res[1], PV_OP_ACQ_CANCELLED);
    assert_int_equal(res[2], PV_OP_ACQ_RUN);
    assert_true(tokens[0] > 0 && tokens[2] > 0 && tokens[0] != tokens[2]);
    assert_int_equal(out[0].status, PV_OP_RUNNING);
    assert_int_equal(out[0].attempts, 1);
    assert_string_equal(out[0].worker, "w1");
    assert_int_equal(out[2].status, PV_OP_RUNNING);
    finish(f, &out[0], tokens[0], PV_OP_SUCCEEDED);
    finish(f, &out[2], tokens[2], PV_OP_SUCCEEDED);
    pv_op done = get(f, a.id);
    assert_int_equal(done.status, PV_OP_SUCCEEDED);
    pv_op_clear(&done);
    for (int i = 0; i < 3; i++)
        pv_op_clear(&out[i]);

    /* A backlog of two, taken in one call; then nothing is left. */
    pv_op d = submit(f, "take-1"), e = submit(f, "take-2");
    pv_op_taken taken[5];
    size_t n = 99;
    memset(taken, 0, sizeof taken);
    assert_int_equal(pv_op_take(f->r, &f->keys, &f->opts, "ops", "w2", 5, 10000, taken, &n, &st),
                     PV_OK);
    assert_int_equal(n, 2);
    assert_string_equal(taken[0].op_id, d.id);
    assert_string_equal(taken[1].op_id, e.id);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(taken[i].rc, PV_OK);
        assert_int_equal(taken[i].res, PV_OP_ACQ_RUN);
        assert_true(taken[i].token > 0);
        assert_int_equal(taken[i].rec.status, PV_OP_RUNNING);
        assert_string_equal(taken[i].rec.worker, "w2");
        assert_true(strlen(taken[i].entry) > 0);
        finish(f, &taken[i].rec, taken[i].token, PV_OP_SUCCEEDED);
        pv_op_clear(&taken[i].rec);
    }
    n = 99;
    assert_int_equal(pv_op_take(f->r, &f->keys, &f->opts, "ops", "w2", 5, 10000, taken, &n, &st),
                     PV_OK);
    assert_int_equal(n, 0);
    assert_int_equal(pending_count(f, "ops"), 0);

    /* A queue without its consumer group is the call's own failure. */
    assert_int_not_equal(
        pv_op_take(f->r, &f->keys, &f->opts, "nogroup", "w2", 5, 10000, taken, &n, &st), PV_OK);
    pv_op_clear(&a);
    pv_op_clear(&b);
    pv_op_clear(&c);
    pv_op_clear(&d);
    pv_op_clear(&e);
}

static void test_key_names(void **state) {
    fixture *f = *state;
    pv_status st;
    char buf[PV_KEY_MAX];
    assert_int_equal(pv_op_queue_key(&f->keys, "node:n1", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{ops}:q:node:n1");
    assert_int_equal(pv_op_events_key(&f->keys, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{ops}:events");
    assert_int_equal(pv_op_channel(&f->keys, "op-1", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{ops}:chan:op-1");
    assert_int_equal(pv_op_queue_key(&f->keys, "ops", buf, 8, &st), PV_INVALID_ARGUMENT);
    pv_op_status s;
    assert_int_equal(pv_op_status_parse("CANCELLED", &s), 0);
    assert_int_equal(s, PV_OP_CANCELLED);
    assert_int_equal(pv_op_status_parse("cancelled", &s), -1);
    assert_string_equal(pv_op_status_name(PV_OP_RUNNING), "RUNNING");
}

/* An upload: binary bytes back as they went, with a TTL; gone after the drop, and a missing
 * one is FAILED_PRECONDITION naming it. */
static void test_upload(void **state) {
    fixture *f = *state;
    pv_status st;
    char id[PV_ID_MAX], key[PV_KEY_MAX];
    const unsigned char data[] = {'t', 'a', 'r', 0, 0xff, '\n', 7};
    assert_int_equal(pv_upload_put(f->r, &f->keys, data, sizeof data, id, &st), PV_OK);
    snprintf(key, sizeof key, "t:{ops}:upload:%s", id);
    redisReply *ttl = redisCommand(f->c, "TTL %s", key);
    assert_true(ttl->integer > PV_UPLOAD_TTL_SECONDS - 10 && ttl->integer <= PV_UPLOAD_TTL_SECONDS);
    freeReplyObject(ttl);
    unsigned char *got = NULL;
    size_t len = 0;
    assert_int_equal(pv_upload_get(f->r, &f->keys, id, &got, &len, &st), PV_OK);
    assert_int_equal(len, sizeof data);
    assert_memory_equal(got, data, sizeof data);
    free(got);
    pv_upload_drop(f->r, &f->keys, id);
    assert_int_equal(pv_upload_get(f->r, &f->keys, id, &got, &len, &st), PV_FAILED_PRECONDITION);
    assert_null(got);
    assert_non_null(strstr(st.msg, id));
    assert_non_null(strstr(st.msg, "is gone"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_upload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submit_and_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency, setup, teardown),
        cmocka_unit_test_setup_teardown(test_locks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unlocked_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fencing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_journal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_output, setup, teardown),
        cmocka_unit_test_setup_teardown(test_output_journal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notify_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_and_dead_letter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handover_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_indexes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_atomicity_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_acquire_batch_and_take, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_names, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
