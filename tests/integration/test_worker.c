/*
 * Reliability of the operation pipeline with real pivirt-worker processes on a real Redis (AOF
 * appendfsync always): workers killed with SIGKILL, paused past their lease, stopped with
 * SIGTERM; Redis killed and restarted under load; the queue's stream deleted under a worker; an
 * always-failing handler; cancellation before and during a run. Operations are submitted with
 * pv_op_submit directly.
 *
 * What is measured, per test, and printed as one figure line on stderr:
 *   every operation ends in the expected state, none is lost, none is twice in effect (the
 *   test.sleep effect counter of each operation is exactly 1), redelivery after a worker's death
 *   comes within 15 s with the default lease, a worker that lost its lease commits nothing, an
 *   always-failing operation gets exactly max_attempts deliveries and one dead letter, cancel
 *   lands within 1 s, and pv_op_check finds no inconsistency afterwards.
 * The workers are the sanitizer build when the tests are: each test stops its workers gracefully
 * (so LeakSanitizer runs at their exit) and fails on any sanitizer report in their logs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pv_op.h"
#include "pv_redis.h"
#include "pv_test_redis.h"

#define MAX_WORKERS 4100 /* ./ops/pivirt chaos starts 2 + 4 x scale workers over a run */
#define PREFIX "tw:"

typedef struct worker {
    pid_t pid;  /* 0 once reaped */
    int status; /* wait status once reaped */
    char log[512];
} worker;

typedef struct fixture {
    pv_test_redis *srv;
    pv_redis *r;
    pv_keys keys;
    pv_op_opts opts;
    char logdir[256];
    worker workers[MAX_WORKERS];
    int n_workers;
    int targets; /* for unique targets: one running operation per resource */
} fixture;

/* --- time and small helpers ------------------------------------------------------------------ */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static char *read_file(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) return strdup("");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, fp);
    buf[got] = '\0';
    fclose(fp);
    return buf;
}

static bool log_contains(const worker *w, const char *needle) {
    char *text = read_file(w->log);
    bool found = strstr(text, needle) != NULL;
    free(text);
    return found;
}

static void dump_log(const worker *w) {
    char *text = read_file(w->log);
    size_t n = strlen(text);
    const char *tail = n > 6000 ? text + n - 6000 : text;
    fprintf(stderr, "---- %s (last %zu bytes) ----\n%s---- end ----\n", w->log, strlen(tail), tail);
    free(text);
}

/* --- fixture --------------------------------------------------------------------------------- */

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_keys_init(&f->keys, PREFIX, &st);
    f->opts.retention_seconds = 3600;
    f->opts.events_maxlen = 100000;
    if (!(f->r = pv_test_redis_client(f->srv, 2000))) return -1;
    /* mkdtemp's template: the prefix and six 'X' placeholders */
    int n = snprintf(f->logdir, sizeof f->logdir, "/tmp/pv-test-worker-");
    memset(f->logdir + n, 'X', 6);
    f->logdir[n + 6] = '\0';
    if (!mkdtemp(f->logdir)) return -1;
    *state = f;
    return 0;
}

static void reap(worker *w, int timeout_ms) {
    int64_t until = now_ms() + timeout_ms;
    while (w->pid > 0) {
        pid_t p = waitpid(w->pid, &w->status, WNOHANG);
        if (p == w->pid || (p < 0 && errno == ECHILD)) {
            w->pid = 0;
            break;
        }
        if (now_ms() >= until) break;
        sleep_ms(5);
    }
}

static int teardown(void **state) {
    fixture *f = *state;
    for (int i = 0; i < f->n_workers; i++) {
        worker *w = &f->workers[i];
        if (w->pid <= 0) continue;
        kill(w->pid, SIGCONT);
        kill(w->pid, SIGKILL);
        reap(w, 5000);
    }
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    if (!getenv("PV_KEEP_LOGS")) {
        for (int i = 0; i < f->n_workers; i++)
            unlink(f->workers[i].log);
        rmdir(f->logdir);
    } else {
        fprintf(stderr, "worker logs kept in %s\n", f->logdir);
    }
    free(f);
    return 0;
}

/* --- worker processes ------------------------------------------------------------------------ */

/* Starts pivirt-worker with the common settings plus `extra` ("key=value", NULL-terminated) and
 * waits until it consumes. */
static worker *start_worker(fixture *f, const char *const *extra) {
    assert_true(f->n_workers < MAX_WORKERS);
    worker *w = &f->workers[f->n_workers];
    snprintf(w->log, sizeof w->log, "%s/worker-%d.log", f->logdir, f->n_workers);
    f->n_workers++;
    const char *dir = getenv("PV_BUILD_DIR");
    assert_non_null(dir);
    char bin[512], addr[128], prefix[64];
    snprintf(bin, sizeof bin, "%s/bin/pivirt-worker", dir);
    snprintf(addr, sizeof addr, "redis.addr=%s", pv_test_redis_addr(f->srv));
    snprintf(prefix, sizeof prefix, "redis.prefix=%s", PREFIX);
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    const char *common[] = {addr, prefix, "test_operations=true", "worker.heartbeat_seconds=1",
                            "redis.connect_timeout_ms=500"};
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) {
        argv[n++] = "--set";
        argv[n++] = common[i];
    }
    for (int i = 0; extra && extra[i]; i++) {
        argv[n++] = "--set";
        argv[n++] = extra[i];
    }
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        int fd = open(w->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    w->pid = pid;
    int64_t until = now_ms() + 15000;
    while (!log_contains(w, "consuming queue=") && now_ms() < until) {
        if (waitpid(pid, &w->status, WNOHANG) == pid) {
            w->pid = 0;
            dump_log(w);
            fail_msg("worker %d exited at start", (int)pid);
        }
        sleep_ms(10);
    }
    if (!log_contains(w, "consuming queue=")) {
        dump_log(w);
        fail_msg("worker %d did not start consuming within 15 s", (int)pid);
    }
    return w;
}

static void kill9(worker *w) {
    kill(w->pid, SIGKILL);
    reap(w, 5000);
    assert_int_equal(w->pid, 0);
}

/* SIGTERM and wait; returns the milliseconds until exit and asserts exit status 0. */
static int64_t stop_worker(worker *w, int timeout_ms) {
    int64_t t0 = now_ms();
    kill(w->pid, SIGTERM);
    reap(w, timeout_ms);
    if (w->pid != 0) {
        dump_log(w);
        fail_msg("worker did not exit within %d ms of SIGTERM", timeout_ms);
    }
    if (!WIFEXITED(w->status) || WEXITSTATUS(w->status) != 0) {
        dump_log(w);
        fail_msg("worker exit status %d (signal %d), want 0",
                 WIFEXITED(w->status) ? WEXITSTATUS(w->status) : -1,
                 WIFSIGNALED(w->status) ? WTERMSIG(w->status) : 0);
    }
    return now_ms() - t0;
}

static bool alive(const worker *w) {
    int status;
    return w->pid > 0 && waitpid(w->pid, &status, WNOHANG) == 0;
}

static bool runs_on(const pv_op *op, const worker *w) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-%d", (int)w->pid);
    size_t n = op->worker ? strlen(op->worker) : 0, m = strlen(suffix);
    return n > m && strcmp(op->worker + n - m, suffix) == 0;
}

/* Stops every running worker gracefully, then fails on any sanitizer report in any log and on
 * any inconsistency pv_op_check finds. */
static void finish_test(fixture *f) {
    for (int i = 0; i < f->n_workers; i++)
        if (f->workers[i].pid > 0) stop_worker(&f->workers[i], 15000);
    static const char *reports[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                    "runtime error:", "SUMMARY: UndefinedBehaviorSanitizer"};
    for (int i = 0; i < f->n_workers; i++) {
        for (size_t j = 0; j < sizeof reports / sizeof reports[0]; j++) {
            if (!log_contains(&f->workers[i], reports[j])) continue;
            dump_log(&f->workers[i]);
            fail_msg("sanitizer report \"%s\" in %s", reports[j], f->workers[i].log);
        }
    }
    char *report = NULL;
    int problems = -1;
    pv_status st;
    assert_int_equal(pv_op_check(f->r, &f->keys, &report, &problems, &st), PV_OK);
    if (problems != 0) fprintf(stderr, "pv_op_check:\n%s", report);
    free(report);
    assert_int_equal(problems, 0);
}

/* --- operations ------------------------------------------------------------------------------ */

static void submit(fixture *f, const char *kind, const char *params, int max_attempts, char *id) {
    char target[64];
    snprintf(target, sizeof target, "res-%d", ++f->targets);
    pv_op_submit_req req = {.kind = kind,
                            .target = target,
                            .queue = "ops",
                            .params_json = params,
                            .max_attempts = max_attempts};
    pv_op op;
    memset(&op, 0, sizeof op);
    bool existed = true;
    pv_status st;
    int rc = pv_op_submit(f->r, &f->keys, &f->opts, &req, &op, &existed, &st);
    if (rc != PV_OK) fail_msg("submit %s %s: %s", kind, params, st.msg);
    assert_false(existed);
    snprintf(id, PV_ID_MAX, "%s", op.id);
    pv_op_clear(&op);
}

static void get_op(fixture *f, const char *id, pv_op *out) {
    pv_status st;
    pv_op_clear(out);
    memset(out, 0, sizeof *out);
    int rc = pv_op_get(f->r, &f->keys, id, out, &st);
    if (rc != PV_OK) fail_msg("get %s: %s", id, st.msg);
}

/* Polls until done; returns the milliseconds waited (fails after timeout_ms). */
static int64_t wait_done(fixture *f, const char *id, int timeout_ms, pv_op *out) {
    int64_t t0 = now_ms();
    for (;;) {
        get_op(f, id, out);
        if (pv_op_done(out)) return now_ms() - t0;
        if (now_ms() - t0 > timeout_ms)
            fail_msg("operation %s not done after %d ms: %s attempts %d worker %s", id, timeout_ms,
                     pv_op_status_name(out->status), out->attempts, out->worker ? out->worker : "");
        sleep_ms(5);
    }
}

/* Polls until the operation runs on w; returns the milliseconds waited. */
static int64_t wait_running_on(fixture *f, const char *id, const worker *w, int timeout_ms) {
    int64_t t0 = now_ms();
    pv_op op;
    memset(&op, 0, sizeof op);
    for (;;) {
        get_op(f, id, &op);
        if (op.status == PV_OP_RUNNING && runs_on(&op, w)) break;
        if (now_ms() - t0 > timeout_ms || pv_op_done(&op))
            fail_msg("operation %s not running on worker %d after %d ms: %s worker %s", id,
                     (int)w->pid, timeout_ms, pv_op_status_name(op.status),
                     op.worker ? op.worker : "");
        sleep_ms(5);
    }
    pv_op_clear(&op);
    return now_ms() - t0;
}

__attribute__((format(printf, 2, 3))) static long long counter(fixture *f, const char *fmt, ...) {
    char key[PV_KEY_MAX], suffix[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(suffix, sizeof suffix, fmt, ap);
    va_end(ap);
    snprintf(key, sizeof key, "%s%s", PREFIX, suffix);
    redisReply *reply = NULL;
    pv_status st;
    if (pv_redis_command(f->r, &reply, &st, "GET %s", key) != PV_OK)
        fail_msg("GET %s: %s", key, st.msg);
    long long v = reply->type == REDIS_REPLY_STRING ? atoll(reply->str) : 0;
    freeReplyObject(reply);
    return v;
}

static long long effect(fixture *f, const char *name) {
    return counter(f, "test:effect:%s", name);
}

static long long effect_runs(fixture *f, const char *name) {
    return counter(f, "test:effect_runs:%s", name);
}

static long long runs(fixture *f, const char *name) {
    return counter(f, "test:runs:%s", name);
}

/* Entries of a stream whose field `op` is id (and, with worker set, whose field worker is it). */
static int count_entries(fixture *f, const char *stream, const char *id) {
    redisReply *reply = NULL;
    pv_status st;
    if (pv_redis_command(f->r, &reply, &st, "XRANGE %s - +", stream) != PV_OK)
        fail_msg("XRANGE %s: %s", stream, st.msg);
    int n = 0;
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *fields = reply->element[i]->element[1];
        for (size_t j = 0; j + 1 < fields->elements; j += 2)
            if (strcmp(fields->element[j]->str, "op") == 0 &&
                strcmp(fields->element[j + 1]->str, id) == 0)
                n++;
    }
    freeReplyObject(reply);
    return n;
}

static bool name_is(const char *consumer, pid_t pid) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-%d", (int)pid);
    size_t n = strlen(consumer), m = strlen(suffix);
    return n > m && strcmp(consumer + n - m, suffix) == 0;
}

/* Events of op id written by the worker with pid `stale` after the first event written by the
 * worker with pid `fresh`: writes that a fenced pipeline must have refused. */
static int stale_events(fixture *f, const char *id, pid_t stale, pid_t fresh) {
    char key[PV_KEY_MAX];
    pv_status st;
    assert_int_equal(pv_op_events_key(&f->keys, key, sizeof key, &st), PV_OK);
    redisReply *reply = NULL;
    if (pv_redis_command(f->r, &reply, &st, "XRANGE %s - +", key) != PV_OK)
        fail_msg("XRANGE %s: %s", key, st.msg);
    bool fresh_seen = false;
    int n = 0;
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *fields = reply->element[i]->element[1];
        const char *op = "", *by = "";
        for (size_t j = 0; j + 1 < fields->elements; j += 2) {
            if (strcmp(fields->element[j]->str, "op") == 0) op = fields->element[j + 1]->str;
            if (strcmp(fields->element[j]->str, "worker") == 0) by = fields->element[j + 1]->str;
        }
        if (strcmp(op, id) != 0) continue;
        if (name_is(by, fresh))
            fresh_seen = true;
        else if (fresh_seen && name_is(by, stale))
            n++;
    }
    freeReplyObject(reply);
    return n;
}

static void dead_key(fixture *f, char *buf, size_t len) {
    /* pv_op.h documents the key but has no accessor for it. */
    snprintf(buf, len, "%s{ops}:dead", f->keys.prefix);
}

static void queue_key(fixture *f, char *buf, size_t len) {
    pv_status st;
    assert_int_equal(pv_op_queue_key(&f->keys, "ops", buf, len, &st), PV_OK);
}

static long long pending_entries(fixture *f) {
    char key[PV_KEY_MAX];
    queue_key(f, key, sizeof key);
    redisReply *reply = NULL;
    pv_status st;
    if (pv_redis_command(f->r, &reply, &st, "XPENDING %s %s", key, PV_OP_GROUP) != PV_OK)
        fail_msg("XPENDING %s: %s", key, st.msg);
    long long n = reply->element[0]->integer;
    freeReplyObject(reply);
    return n;
}

/* --- the tests ------------------------------------------------------------------------------- */

/* ./ops/pivirt chaos sets PV_CHAOS_SCALE (e.g. 10): that many times the operations and kills of
 * the bounded run that ./ops/pivirt test does. */
static int chaos_scale(void) {
    const char *s = getenv("PV_CHAOS_SCALE");
    int n = s ? atoi(s) : 1;
    return n >= 1 && n <= 1000 ? n : 1;
}

/* Workers killed with SIGKILL in the middle of operations, again and again: every operation
 * ends SUCCEEDED exactly once in effect. */
static void test_kill9_workers_repeatedly(void **state) {
    fixture *f = *state;
    const int KILL9_OPS = 160 * chaos_scale(), KILL9_KILLS = 4 * chaos_scale();
    const char *settings[] = {"worker.lease_ms=1000", "worker.concurrency=8",
                              "worker.backoff_base_ms=50", NULL};
    worker *w[2] = {start_worker(f, settings), start_worker(f, settings)};
    char(*ids)[PV_ID_MAX] = calloc((size_t)KILL9_OPS, PV_ID_MAX);
    assert_non_null(ids);
    int64_t t0 = now_ms();
    for (int i = 0; i < KILL9_OPS; i++) {
        char params[128];
        snprintf(params, sizeof params, "{\"ms\": %d, \"steps\": 4, \"effect\": \"k%d\"}",
                 200 + (i * 37) % 400, i);
        submit(f, "test.sleep", params, 20, ids[i]);
    }
    for (int k = 0; k < KILL9_KILLS; k++) {
        sleep_ms(700);
        int victim = k % 2;
        kill9(w[victim]);
        w[victim] = start_worker(f, settings);
    }
    int succeeded = 0, lost = 0, duplicated = 0, reruns = 0, redelivered = 0;
    int64_t last_done = 0;
    pv_op op;
    memset(&op, 0, sizeof op);
    for (int i = 0; i < KILL9_OPS; i++) {
        char name[16];
        snprintf(name, sizeof name, "k%d", i);
        wait_done(f, ids[i], 60000, &op);
        if (op.status == PV_OP_SUCCEEDED)
            succeeded++;
        else
            lost++;
        if (op.attempts > 1) redelivered++;
        if (effect(f, name) != 1) duplicated++;
        if (effect_runs(f, name) > 1) reruns++;
        if (op.finished_ms - op.created_ms > last_done) last_done = op.finished_ms - op.created_ms;
    }
    pv_op_clear(&op);
    free(ids);
    fprintf(stderr,
            "kill9: %d ops, %d kills of 2 workers, %d succeeded, %d lost, %d effects not exactly "
            "once, %d redelivered (effect step re-ran for %d), all done in %.1f s (max "
            "submit->done %.1f s)\n",
            KILL9_OPS, KILL9_KILLS, succeeded, lost, duplicated, redelivered, reruns,
            (double)(now_ms() - t0) / 1000.0, (double)last_done / 1000.0);
    assert_int_equal(succeeded, KILL9_OPS);
    assert_int_equal(duplicated, 0);
    assert_true(redelivered > 0);
    finish_test(f);
}

/* With the default 10 s lease, the operation of a killed worker runs again on another worker
 * within 15 s. */
static void test_redelivery_with_default_lease(void **state) {
    fixture *f = *state;
    worker *a = start_worker(f, NULL);
    char id[PV_ID_MAX];
    submit(f, "test.sleep", "{\"ms\": 60000, \"steps\": 60}", 0, id);
    wait_running_on(f, id, a, 5000);
    worker *b = start_worker(f, NULL);
    sleep_ms(300);
    int64_t t0 = now_ms();
    kill9(a);
    wait_running_on(f, id, b, 20000);
    int64_t redelivery = now_ms() - t0;
    pv_op op;
    memset(&op, 0, sizeof op);
    pv_status st;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, id, &op, &st), PV_OK);
    wait_done(f, id, 3000, &op);
    assert_int_equal(op.status, PV_OP_CANCELLED);
    assert_int_equal(op.attempts, 2);
    pv_op_clear(&op);
    fprintf(stderr,
            "redelivery: worker killed, its operation running on the other worker after "
            "%.1f s (lease 10 s, bound 15 s)\n",
            (double)redelivery / 1000.0);
    assert_true(redelivery <= 15000);
    finish_test(f);
}

/* A worker paused past its lease and resumed after another took over commits nothing. */
static void test_sigstop_past_lease(void **state) {
    fixture *f = *state;
    const char *settings[] = {"worker.lease_ms=1000", NULL};
    worker *a = start_worker(f, settings);
    char id[PV_ID_MAX];
    submit(f, "test.sleep", "{\"ms\": 3000, \"steps\": 6, \"effect\": \"s\"}", 0, id);
    wait_running_on(f, id, a, 5000);
    sleep_ms(200);
    worker *b = start_worker(f, settings);
    int64_t t0 = now_ms();
    kill(a->pid, SIGSTOP);
    int64_t takeover = wait_running_on(f, id, b, 10000);
    sleep_ms(300); /* well past a's lease */
    int64_t paused = now_ms() - t0;
    kill(a->pid, SIGCONT);
    pv_op op;
    memset(&op, 0, sizeof op);
    wait_done(f, id, 15000, &op);
    assert_int_equal(op.status, PV_OP_SUCCEEDED);
    assert_true(runs_on(&op, b));
    int64_t until = now_ms() + 5000;
    while (!log_contains(a, "lease lost") && now_ms() < until)
        sleep_ms(20);
    bool refused = log_contains(a, "lease lost");
    int stale = stale_events(f, id, a->pid, b->pid);
    fprintf(stderr,
            "sigstop: worker paused %.1f s with a 1 s lease, taken over after %.1f s; %d stale "
            "commits, effect %lld (step ran %lld times), paused worker %s\n",
            (double)paused / 1000.0, (double)takeover / 1000.0, stale, effect(f, "s"),
            effect_runs(f, "s"), refused ? "logged \"lease lost\"" : "did NOT log lease lost");
    assert_int_equal(stale, 0);
    assert_int_equal(effect(f, "s"), 1);
    assert_true(refused);
    assert_true(alive(a));
    get_op(f, id, &op);
    assert_int_equal(op.status, PV_OP_SUCCEEDED);
    assert_true(runs_on(&op, b));
    pv_op_clear(&op);
    finish_test(f);
}

/* An always-failing handler gets exactly max_attempts deliveries, then FAILED with its last
 * error and one dead letter; a flaky one succeeds after its transient failures. */
static void test_retries_and_dead_letter(void **state) {
    fixture *f = *state;
    const char *settings[] = {"worker.backoff_base_ms=50", "worker.backoff_max_ms=200", NULL};
    start_worker(f, settings);
    char fail_id[PV_ID_MAX], flaky_id[PV_ID_MAX];
    submit(f, "test.fail", "{\"runs\": \"f\"}", 3, fail_id);
    submit(f, "test.flaky", "{\"failures\": 2, \"runs\": \"fl\"}", 5, flaky_id);
    pv_op op;
    memset(&op, 0, sizeof op);
    int64_t ms = wait_done(f, fail_id, 20000, &op);
    assert_int_equal(op.status, PV_OP_FAILED);
    assert_int_equal(op.error_code, PV_UNAVAILABLE);
    assert_string_equal(op.error_message, "test.fail always fails");
    assert_int_equal(op.attempts, 3);
    char dead[PV_KEY_MAX];
    dead_key(f, dead, sizeof dead);
    sleep_ms(300); /* a stray extra delivery would show up by now */
    long long deliveries = runs(f, "f");
    int letters = count_entries(f, dead, fail_id);
    fprintf(stderr,
            "dead-letter: test.fail with max_attempts 3: %lld deliveries, FAILED after "
            "%.1f s with \"%s\", %d dead letters\n",
            deliveries, (double)ms / 1000.0, op.error_message, letters);
    assert_int_equal(deliveries, 3);
    assert_int_equal(letters, 1);

    wait_done(f, flaky_id, 20000, &op);
    assert_int_equal(op.status, PV_OP_SUCCEEDED);
    assert_int_equal(op.attempts, 3);
    assert_int_equal(runs(f, "fl"), 3);
    assert_int_equal(count_entries(f, dead, flaky_id), 0);
    pv_op_clear(&op);
    finish_test(f);
}

/* Cancelled before start: never runs. Cancelled while running: CANCELLED within 1 s. */
static void test_cancel(void **state) {
    fixture *f = *state;
    char early[PV_ID_MAX], late[PV_ID_MAX], marker[PV_ID_MAX];
    submit(f, "test.sleep", "{\"ms\": 100, \"effect\": \"c0\", \"runs\": \"c0\"}", 0, early);
    pv_op op;
    memset(&op, 0, sizeof op);
    pv_status st;
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, early, &op, &st), PV_OK);
    assert_int_equal(op.status, PV_OP_CANCELLED);

    start_worker(f, NULL);
    submit(f, "test.sleep", "{\"ms\": 0}", 0, marker);
    wait_done(f, marker, 10000, &op);
    assert_int_equal(op.status, PV_OP_SUCCEEDED);
    int64_t until = now_ms() + 3000;
    while (pending_entries(f) > 0 && now_ms() < until)
        sleep_ms(10);
    assert_int_equal(pending_entries(f), 0);
    get_op(f, early, &op);
    assert_int_equal(op.status, PV_OP_CANCELLED);
    assert_int_equal(op.error_code, 1);
    long long early_runs = runs(f, "c0");
    assert_int_equal(early_runs, 0);
    assert_int_equal(effect(f, "c0"), 0);

    submit(f, "test.sleep", "{\"ms\": 5000, \"steps\": 5, \"runs\": \"c1\"}", 0, late);
    until = now_ms() + 5000;
    do {
        get_op(f, late, &op);
        sleep_ms(5);
    } while (op.status != PV_OP_RUNNING && now_ms() < until);
    assert_int_equal(op.status, PV_OP_RUNNING);
    sleep_ms(300);
    int64_t t0 = now_ms();
    pv_op_clear(&op); /* pv_op_cancel fills op afresh */
    assert_int_equal(pv_op_cancel(f->r, &f->keys, &f->opts, late, &op, &st), PV_OK);
    wait_done(f, late, 3000, &op);
    int64_t took = now_ms() - t0;
    fprintf(stderr,
            "cancel: cancelled before start ran %lld times; cancelled while running "
            "ended %s %.2f s after the cancel (error code %d)\n",
            early_runs, pv_op_status_name(op.status), (double)took / 1000.0, op.error_code);
    assert_int_equal(op.status, PV_OP_CANCELLED);
    assert_int_equal(op.error_code, 1);
    assert_true(took <= 1000);
    pv_op_clear(&op);
    finish_test(f);
}

#define LOAD_MS 5000
#define LOAD_MAX 2000

/* Redis killed with SIGKILL and restarted (AOF always) under submit load: every acknowledged
 * operation ends SUCCEEDED, exactly once in effect, and the workers reconnect by themselves. */
static void test_redis_restart_under_load(void **state) {
    fixture *f = *state;
    const char *settings[] = {"worker.lease_ms=2000", "worker.concurrency=8",
                              "worker.backoff_base_ms=50", "worker.backoff_max_ms=500", NULL};
    worker *w[2] = {start_worker(f, settings), start_worker(f, settings)};
    static char ids[LOAD_MAX][PV_ID_MAX];
    static int effect_of[LOAD_MAX];
    int acked = 0, refused = 0, seq = 0;
    int64_t slowest_refusal = 0, t_kill = 1500, t_restart = 2500, back_at = 0;
    bool killed = false, restarted = false;
    int64_t t0 = now_ms();
    while (now_ms() - t0 < LOAD_MS && acked < LOAD_MAX) {
        int64_t t = now_ms() - t0;
        if (!killed && t >= t_kill) {
            assert_int_equal(pv_test_redis_kill9(f->srv), 0);
            killed = true;
        }
        if (killed && !restarted && t >= t_restart) {
            assert_int_equal(pv_test_redis_restart(f->srv), 0);
            restarted = true;
            back_at = now_ms();
        }
        char params[128], target[64];
        snprintf(params, sizeof params, "{\"ms\": 100, \"steps\": 2, \"effect\": \"r%d\"}", seq);
        snprintf(target, sizeof target, "load-%d", seq);
        pv_op_submit_req req = {.kind = "test.sleep",
                                .target = target,
                                .queue = "ops",
                                .params_json = params,
                                .max_attempts = 20};
        pv_op op;
        memset(&op, 0, sizeof op);
        bool existed = false;
        pv_status st;
        int64_t s0 = now_ms();
        int rc = pv_op_submit(f->r, &f->keys, &f->opts, &req, &op, &existed, &st);
        if (rc == PV_OK) {
            snprintf(ids[acked], PV_ID_MAX, "%s", op.id);
            effect_of[acked++] = seq;
        } else {
            assert_int_equal(rc, PV_UNAVAILABLE);
            refused++;
            if (now_ms() - s0 > slowest_refusal) slowest_refusal = now_ms() - s0;
            sleep_ms(20);
        }
        pv_op_clear(&op);
        seq++;
        sleep_ms(5);
    }
    assert_true(restarted);
    int succeeded = 0, duplicated = 0;
    pv_op op;
    memset(&op, 0, sizeof op);
    for (int i = 0; i < acked; i++) {
        char name[16];
        snprintf(name, sizeof name, "r%d", effect_of[i]);
        wait_done(f, ids[i], 60000, &op);
        if (op.status == PV_OP_SUCCEEDED)
            succeeded++;
        else
            fprintf(stderr, "redis-restart: %s ended %s after %d attempts: %d %s\n", op.id,
                    pv_op_status_name(op.status), op.attempts, op.error_code,
                    op.error_message ? op.error_message : "");
        if (effect(f, name) != 1) duplicated++;
    }
    pv_op_clear(&op);
    int64_t drained = now_ms() - back_at;
    bool both_alive = alive(w[0]) && alive(w[1]);
    fprintf(stderr,
            "redis-restart: %d submits acknowledged (%d refused with UNAVAILABLE while Redis was "
            "down, slowest refusal %lld ms), %d succeeded, %d lost, %d effects not exactly once; "
            "all done %.1f s after Redis was back; workers reconnected by themselves: %s\n",
            acked, refused, (long long)slowest_refusal, succeeded, acked - succeeded, duplicated,
            (double)drained / 1000.0, both_alive ? "yes" : "NO");
    assert_int_equal(succeeded, acked);
    assert_int_equal(duplicated, 0);
    assert_true(refused > 0);
    assert_true(both_alive);
    finish_test(f);
}

/* SIGTERM while running a long operation: the worker exits 0 within shutdown_ms + 2 s and hands
 * the operation over, which completes on the other worker. */
static void test_sigterm_hands_over(void **state) {
    fixture *f = *state;
    const char *settings[] = {"worker.shutdown_ms=3000", NULL};
    worker *a = start_worker(f, settings);
    char id[PV_ID_MAX];
    submit(f, "test.sleep", "{\"ms\": 4000, \"steps\": 8, \"effect\": \"t\"}", 0, id);
    wait_running_on(f, id, a, 5000);
    worker *b = start_worker(f, settings);
    sleep_ms(1000);
    int64_t t0 = now_ms();
    int64_t exit_ms = stop_worker(a, 3000 + 2000);
    int64_t handover = wait_running_on(f, id, b, 5000) + exit_ms;
    pv_op op;
    memset(&op, 0, sizeof op);
    wait_done(f, id, 10000, &op);
    int64_t total = now_ms() - t0;
    fprintf(stderr,
            "sigterm: worker exited 0 after %.2f s (bound 5 s), operation running on the "
            "other worker %.2f s after the signal, done %.1f s after it: %s, attempts %d, "
            "effect %lld\n",
            (double)exit_ms / 1000.0, (double)handover / 1000.0, (double)total / 1000.0,
            pv_op_status_name(op.status), op.attempts, effect(f, "t"));
    assert_int_equal(op.status, PV_OP_SUCCEEDED);
    assert_true(runs_on(&op, b));
    assert_int_equal(effect(f, "t"), 1);
    assert_int_equal(op.attempts, 1); /* a hand-back is not counted as a delivery */
    assert_true(log_contains(a, "handed-back"));
    pv_op_clear(&op);
    finish_test(f);
}

/* The queue's stream (and with it the consumer group) vanishes under a running worker, as after
 * a Redis that lost its data: the worker creates the group again and consumes new work. */
static void test_group_recreated(void **state) {
    fixture *f = *state;
    worker *w = start_worker(f, NULL);
    char id[PV_ID_MAX], key[PV_KEY_MAX];
    submit(f, "test.sleep", "{\"ms\": 0}", 0, id);
    pv_op op;
    memset(&op, 0, sizeof op);
    wait_done(f, id, 5000, &op);
    queue_key(f, key, sizeof key);
    redisReply *reply = NULL;
    pv_status st;
    assert_int_equal(pv_redis_command(f->r, &reply, &st, "DEL %s", key), PV_OK);
    freeReplyObject(reply);
    submit(f, "test.sleep", "{\"ms\": 0}", 0, id);
    int64_t ms = wait_done(f, id, 10000, &op);
    fprintf(stderr,
            "group-recreated: stream deleted under the worker, next operation %s after "
            "%.2f s\n",
            pv_op_status_name(op.status), (double)ms / 1000.0);
    assert_int_equal(op.status, PV_OP_SUCCEEDED);
    assert_true(log_contains(w, "creating it again"));
    pv_op_clear(&op);
    finish_test(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill9_workers_repeatedly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redelivery_with_default_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigstop_past_lease, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retries_and_dead_letter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redis_restart_under_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_hands_over, setup, teardown),
        cmocka_unit_test_setup_teardown(test_group_recreated, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
