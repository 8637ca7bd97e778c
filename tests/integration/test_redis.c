/*
 * Integration tests of pv_redis against a real redis-server (one per test, via pv_test_redis):
 * commands and pipelining, the function library loaded on every connect, error mapping, and the
 * failure behaviour the rest of pivirt relies on: a crashed, restarted, paused or absent Redis
 * fails fast with PV_UNAVAILABLE naming the address, and the same handle works again as soon as
 * Redis is back.
 *
 * SIGPIPE is deliberately left at its default (fatal) action: pv_redis must not depend on the
 * program ignoring it.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_redis.h"
#include "pv_test_redis.h"

typedef struct fixture {
    pv_test_redis *srv;
    pv_redis *r;
    redisContext *raw; /* independent connection to check what the server really holds */
} fixture;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static pv_redis *new_handle(const char *addr, int command_timeout_ms, const char *password,
                            int db) {
    pv_redis_opts opts = {
        .addr = addr,
        .db = db,
        .password = password,
        .connect_timeout_ms = 1000,
        .command_timeout_ms = command_timeout_ms,
        .load_functions = 1,
    };
    pv_redis *r = NULL;
    pv_status st;
    assert_int_equal(pv_redis_new(&opts, &r, &st), PV_OK);
    assert_non_null(r);
    return r;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(pv_test_redis_start(&f->srv, NULL), 0);
    f->r = new_handle(pv_test_redis_addr(f->srv), 2000, NULL, 0);
    f->raw = pv_test_redis_connect(f->srv);
    assert_non_null(f->raw);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (f->raw != NULL) redisFree(f->raw);
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

/* Reconnects the independent connection after the server restarted. */
static void raw_reconnect(fixture *f) {
    redisFree(f->raw);
    f->raw = pv_test_redis_connect(f->srv);
    assert_non_null(f->raw);
}

/* Runs a command on the independent connection; the caller frees the reply. */
static redisReply *raw(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->raw, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    return rep;
}

static void assert_raw_string(fixture *f, const char *cmd, const char *key, const char *want) {
    redisReply *rep = raw(f, "%s %s", cmd, key);
    if (want == NULL) {
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    } else {
        assert_int_equal(rep->type, REDIS_REPLY_STRING);
        assert_string_equal(rep->str, want);
    }
    freeReplyObject(rep);
}

static long long client_id(pv_redis *r) {
    redisReply *rep = NULL;
    pv_status st;
    assert_int_equal(pv_redis_command(r, &rep, &st, "CLIENT ID"), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    long long id = rep->integer;
    freeReplyObject(rep);
    return id;
}

static int heartbeat(pv_redis *r, const char *key, const char *ttl, long long *result,
                     pv_status *st) {
    const char *keys[] = {key};
    const char *args[] = {ttl, "alive"};
    redisReply *rep = NULL;
    int rc = pv_redis_fcall(r, "pv_heartbeat", 1, keys, 2, args, &rep, st);
    if (rc == PV_OK) {
        assert_non_null(rep);
        assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
        *result = rep->integer;
        freeReplyObject(rep);
    } else {
        assert_null(rep);
    }
    return rc;
}

/* ---- commands ---- */

static void test_set_get_round_trip(void **state) {
    fixture *f = *state;
    pv_status st;
    redisReply *rep = NULL;

    assert_int_equal(pv_redis_command(f->r, &rep, &st, "SET %s %s", "greeting", "hello"), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_STATUS);
    assert_string_equal(rep->str, "OK");
    freeReplyObject(rep);

    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET %s", "greeting"), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "hello");
    freeReplyObject(rep);

    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET %s", "missing"), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_NIL);
    freeReplyObject(rep);

    /* A NULL reply pointer is allowed: the reply is freed for the caller. */
    assert_int_equal(pv_redis_command(f->r, NULL, &st, "SET %s %s", "k2", "v2"), PV_OK);
    assert_raw_string(f, "GET", "k2", "v2");
    assert_string_equal(pv_redis_addr(f->r), pv_test_redis_addr(f->srv));
}

static void test_commandv_is_binary_safe(void **state) {
    fixture *f = *state;
    pv_status st;
    const char key[] = "bin key\r\n";
    const unsigned char value[] = {0x00, 0x01, '\r', '\n', 0xff, 0x00, 'x'};

    const char *set_argv[] = {"SET", key, (const char *)value};
    const size_t set_len[] = {3, sizeof(key) - 1, sizeof(value)};
    assert_int_equal(pv_redis_commandv(f->r, NULL, &st, 3, set_argv, set_len), PV_OK);

    const char *get_argv[] = {"GET", key};
    const size_t get_len[] = {3, sizeof(key) - 1};
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_commandv(f->r, &rep, &st, 2, get_argv, get_len), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_int_equal(rep->len, sizeof(value));
    assert_memory_equal(rep->str, value, sizeof(value));
    freeReplyObject(rep);

    /* NULL lengths mean NUL-terminated arguments. */
    const char *strlen_argv[] = {"STRLEN", "bin key\r\n"};
    assert_int_equal(pv_redis_commandv(f->r, &rep, &st, 2, strlen_argv, NULL), PV_OK);
    assert_int_equal(rep->integer, sizeof(value));
    freeReplyObject(rep);

    assert_int_equal(pv_redis_commandv(f->r, &rep, &st, 0, get_argv, NULL), PV_INVALID_ARGUMENT);
    assert_null(rep);
}

static void test_pipeline_1000_in_order(void **state) {
    fixture *f = *state;
    pv_status st;
    const char *argv[] = {"INCR", "counter"};
    for (int i = 0; i < 1000; i++)
        assert_int_equal(pv_redis_append(f->r, 2, argv, NULL, &st), PV_OK);
    for (int i = 0; i < 1000; i++) {
        redisReply *rep = NULL;
        assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_OK);
        assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
        assert_int_equal(rep->integer, i + 1);
        freeReplyObject(rep);
    }
    assert_raw_string(f, "GET", "counter", "1000");

    /* Error replies inside a pipeline are mapped one by one and keep the order. */
    const char *bad[] = {"NOSUCHCMD"};
    const char *get[] = {"GET", "counter"};
    assert_int_equal(pv_redis_append(f->r, 1, bad, NULL, &st), PV_OK);
    assert_int_equal(pv_redis_append(f->r, 2, get, NULL, &st), PV_OK);
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_INTERNAL);
    assert_null(rep);
    assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_OK);
    assert_string_equal(rep->str, "1000");
    freeReplyObject(rep);
}

static void test_abandoned_pipeline_does_not_shift_replies(void **state) {
    fixture *f = *state;
    pv_status st;
    const char *incr[] = {"INCR", "c"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pv_redis_append(f->r, 2, incr, NULL, &st), PV_OK);
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_OK);
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);

    /* Two replies are still unread: a command must get its own reply, not INCR's. */
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET c"), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "3");
    freeReplyObject(rep);

    assert_int_equal(pv_redis_append(f->r, 2, incr, NULL, &st), PV_OK);
    assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_OK);
    assert_int_equal(rep->integer, 4);
    freeReplyObject(rep);
}

/* ---- the function library ---- */

static void test_functions_loaded_on_connect(void **state) {
    fixture *f = *state;
    pv_status st;
    long long res = -1;

    redisReply *list = raw(f, "FUNCTION LIST");
    assert_int_equal(list->elements, 0); /* a fresh server knows no functions */
    freeReplyObject(list);

    assert_int_equal(heartbeat(f->r, "presence:gw-1", "5000", &res, &st), PV_OK);
    assert_int_equal(res, 1);
    assert_int_equal(heartbeat(f->r, "presence:gw-1", "5000", &res, &st), PV_OK);
    assert_int_equal(res, 0);

    redisReply *ttl = raw(f, "PTTL presence:gw-1");
    assert_true(ttl->integer > 0 && ttl->integer <= 5000);
    freeReplyObject(ttl);
    assert_raw_string(f, "GET", "presence:gw-1", "alive");
}

static void test_functions_reloaded_after_client_kill(void **state) {
    fixture *f = *state;
    pv_status st;
    long long res = -1;
    assert_int_equal(heartbeat(f->r, "hb", "5000", &res, &st), PV_OK);

    freeReplyObject(raw(f, "FUNCTION FLUSH"));
    assert_int_equal(heartbeat(f->r, "hb", "5000", &res, &st), PV_INTERNAL);
    assert_string_equal(st.msg, "redis: ERR Function not found");

    long long id = client_id(f->r);
    redisReply *killed = raw(f, "CLIENT KILL ID %lld", id);
    assert_int_equal(killed->integer, 1);
    freeReplyObject(killed);

    /* The handle notices the closed idle connection, reconnects and loads the library: the very
     * next call works. */
    assert_int_equal(heartbeat(f->r, "hb", "5000", &res, &st), PV_OK);
    assert_int_equal(res, 0);
    assert_true(client_id(f->r) != id);
}

static void test_functions_reloaded_after_empty_restart(void **state) {
    fixture *f = *state;
    pv_status st;
    long long res = -1;
    assert_int_equal(heartbeat(f->r, "hb", "60000", &res, &st), PV_OK);

    /* FUNCTION FLUSH is in the AOF: the restarted server comes back without functions. */
    freeReplyObject(raw(f, "FUNCTION FLUSH"));
    assert_int_equal(pv_test_redis_kill9(f->srv), 0);
    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    raw_reconnect(f);
    redisReply *list = raw(f, "FUNCTION LIST");
    assert_int_equal(list->elements, 0);
    freeReplyObject(list);

    assert_int_equal(heartbeat(f->r, "hb", "60000", &res, &st), PV_OK);
    assert_int_equal(res, 0); /* the key itself survived in the AOF */
}

/* ---- errors ---- */

static void test_error_replies_are_mapped(void **state) {
    fixture *f = *state;
    pv_status st;
    long long res = -1;
    long long id = client_id(f->r);

    assert_int_equal(heartbeat(f->r, "hb", "x", &res, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(st.code, PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "ttl must be a positive number of ms, got x");

    redisReply *rep = NULL;
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "NOSUCHCMD a"), PV_INTERNAL);
    assert_null(rep);
    assert_int_equal(strncmp(st.msg, "redis: ERR unknown command 'NOSUCHCMD'", 38), 0);

    freeReplyObject(raw(f, "RPUSH list a"));
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET list"), PV_INTERNAL);
    assert_int_equal(strncmp(st.msg, "redis: WRONGTYPE ", 17), 0);

    /* Error replies are answers, not failures of the connection: it is kept. */
    assert_int_equal(client_id(f->r), id);

    const char *keys[] = {"k"};
    assert_int_equal(pv_redis_fcall(f->r, "pv_heartbeat", -1, keys, 0, NULL, &rep, &st),
                     PV_INVALID_ARGUMENT);
    assert_null(rep);
}

static void test_error_status_text(void **state) {
    (void)state;
    static const struct {
        const char *in;
        int code;
        const char *msg;
    } cases[] = {
        {"NOT_FOUND no such thing", PV_NOT_FOUND, "no such thing"},
        {"ERR something", PV_INTERNAL, "redis: ERR something"},
        {"ABORTED op-1 holds node-2", PV_ABORTED, "op-1 holds node-2"},
        {"FAILED_PRECONDITION ", PV_FAILED_PRECONDITION, ""},
        {"NOT_FOUND", PV_INTERNAL, "redis: NOT_FOUND"}, /* a code needs a message after it */
        {"not_found x", PV_INTERNAL, "redis: not_found x"},
        {"OK fine", PV_INTERNAL, "redis: OK fine"}, /* OK is not an error code */
        {"WRONGTYPE Operation against a key", PV_INTERNAL,
         "redis: WRONGTYPE Operation against a key"},
        {"", PV_INTERNAL, "redis: "},
        /* Redis's transient answers are worth a retry: UNAVAILABLE, not INTERNAL. */
        {"LOADING Redis is loading the dataset in memory", PV_UNAVAILABLE,
         "redis: LOADING Redis is loading the dataset in memory"},
        {"BUSY Redis is busy running a script", PV_UNAVAILABLE,
         "redis: BUSY Redis is busy running a script"},
        {"READONLY You can't write against a read only replica.", PV_UNAVAILABLE,
         "redis: READONLY You can't write against a read only replica."},
        {"MASTERDOWN Link with MASTER is down", PV_UNAVAILABLE,
         "redis: MASTERDOWN Link with MASTER is down"},
        {"BUSYGROUP Consumer Group name already exists", PV_INTERNAL,
         "redis: BUSYGROUP Consumer Group name already exists"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pv_status st;
        int code = pv_redis_error_status(cases[i].in, strlen(cases[i].in), &st);
        assert_int_equal(code, cases[i].code);
        assert_int_equal(st.code, cases[i].code);
        assert_string_equal(st.msg, cases[i].msg);
    }
    /* The length bounds the text: nothing after it is read. */
    pv_status st;
    assert_int_equal(pv_redis_error_status("NOT_FOUND abcdef", 12, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "ab");
}

/* ---- failures ---- */

static void assert_unavailable_naming(const pv_status *st, int rc, const char *addr) {
    assert_int_equal(rc, PV_UNAVAILABLE);
    assert_int_equal(st->code, PV_UNAVAILABLE);
    assert_non_null(strstr(st->msg, addr));
}

static void test_kill9_fails_fast_then_recovers(void **state) {
    fixture *f = *state;
    pv_status st;
    redisReply *rep = NULL;
    const char *addr = pv_test_redis_addr(f->srv);
    assert_int_equal(pv_redis_command(f->r, NULL, &st, "SET durable yes"), PV_OK);

    assert_int_equal(pv_test_redis_kill9(f->srv), 0);
    for (int i = 0; i < 2; i++) {
        double t0 = now_s();
        int rc = pv_redis_command(f->r, &rep, &st, "GET durable");
        double took = now_s() - t0;
        assert_unavailable_naming(&st, rc, addr);
        assert_null(rep);
        assert_true(took < 0.3);
    }

    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    /* Same handle, no explicit reconnect: the next command works, and the write acknowledged
     * before the crash is there (appendfsync always). */
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET durable"), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "yes");
    freeReplyObject(rep);
}

static void test_kill9_mid_pipeline(void **state) {
    fixture *f = *state;
    pv_status st;
    const char *addr = pv_test_redis_addr(f->srv);
    const char *incr[] = {"INCR", "c"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pv_redis_append(f->r, 2, incr, NULL, &st), PV_OK);
    assert_int_equal(pv_test_redis_kill9(f->srv), 0);

    double t0 = now_s();
    for (int i = 0; i < 3; i++) {
        redisReply *rep = NULL;
        assert_unavailable_naming(&st, pv_redis_get_reply(f->r, &rep, &st), addr);
        assert_null(rep);
    }
    assert_true(now_s() - t0 < 0.3);

    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pv_redis_append(f->r, 2, incr, NULL, &st), PV_OK);
    for (int i = 0; i < 2; i++) {
        redisReply *rep = NULL;
        assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_OK);
        assert_int_equal(rep->integer, i + 1); /* the INCRs in flight at the crash never ran */
        freeReplyObject(rep);
    }
}

/* 4 MB of commands are still unwritten when Redis dies: the first write meets a closed socket
 * and the next one a reset one, which raises SIGPIPE (fatal here: see the top of the file). */
static void test_kill9_before_large_pipeline_is_written(void **state) {
    fixture *f = *state;
    pv_status st;
    enum { N = 64, VALUE_LEN = 64 * 1024 };
    char *value = malloc(VALUE_LEN);
    assert_non_null(value);
    memset(value, 'v', VALUE_LEN);
    const char *argv[] = {"SET", "big", value};
    const size_t len[] = {3, 3, VALUE_LEN};
    for (int i = 0; i < N; i++)
        assert_int_equal(pv_redis_append(f->r, 3, argv, len, &st), PV_OK);
    free(value); /* hiredis copied the command */
    assert_int_equal(pv_test_redis_kill9(f->srv), 0);

    double t0 = now_s();
    for (int i = 0; i < N; i++) {
        redisReply *rep = NULL;
        assert_unavailable_naming(&st, pv_redis_get_reply(f->r, &rep, &st),
                                  pv_test_redis_addr(f->srv));
    }
    assert_true(now_s() - t0 < 0.3);
}

static void test_new_pipeline_after_abandoned_failed_one(void **state) {
    fixture *f = *state;
    pv_status st;
    const char *ping[] = {"PING"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(pv_redis_append(f->r, 1, ping, NULL, &st), PV_OK);
    assert_int_equal(pv_test_redis_kill9(f->srv), 0);
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_UNAVAILABLE);
    /* The caller gives up on the other two replies and starts over once Redis is back. */
    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    assert_int_equal(pv_redis_append(f->r, 1, ping, NULL, &st), PV_OK);
    assert_int_equal(pv_redis_get_reply(f->r, &rep, &st), PV_OK);
    assert_string_equal(rep->str, "PONG");
    freeReplyObject(rep);
    assert_int_equal(pv_redis_command(f->r, NULL, &st, "PING"), PV_OK);
}

static void test_idle_connection_survives_restart(void **state) {
    fixture *f = *state;
    pv_status st;
    assert_int_equal(pv_redis_command(f->r, NULL, &st, "SET k v"), PV_OK);
    assert_int_equal(pv_test_redis_stop(f->srv), 0);
    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    /* Redis restarted while the handle was idle: no command was in flight, none fails. */
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET k"), PV_OK);
    assert_string_equal(rep->str, "v");
    freeReplyObject(rep);
}

static void test_command_timeout_blocking_command(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_redis *r = new_handle(pv_test_redis_addr(f->srv), 200, NULL, 0);
    assert_int_equal(pv_redis_connect(r, &st), PV_OK);

    redisReply *rep = NULL;
    double t0 = now_s();
    int rc = pv_redis_command(r, &rep, &st, "BLPOP empty-list 2");
    double took = now_s() - t0;
    assert_unavailable_naming(&st, rc, pv_test_redis_addr(f->srv));
    assert_non_null(strstr(st.msg, "no reply within 200 ms"));
    assert_null(rep);
    assert_true(took >= 0.15 && took < 0.6);

    t0 = now_s();
    assert_int_equal(pv_redis_command(r, &rep, &st, "PING"), PV_OK);
    assert_string_equal(rep->str, "PONG");
    freeReplyObject(rep);
    assert_true(now_s() - t0 < 0.2);
    pv_redis_free(r);
}

static void test_command_timeout_paused_server(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_redis *r = new_handle(pv_test_redis_addr(f->srv), 200, NULL, 0);
    assert_int_equal(pv_redis_command(r, NULL, &st, "SET k v"), PV_OK);

    /* A blocking reader (no command timeout) connecting to the stalled server: the kernel
     * accepts the connection, the handshake is bounded by the connect timeout. */
    pv_redis_opts reader_opts = {.addr = pv_test_redis_addr(f->srv),
                                 .connect_timeout_ms = 300,
                                 .command_timeout_ms = 0,
                                 .load_functions = 1};
    pv_redis *reader = NULL;
    assert_int_equal(pv_redis_new(&reader_opts, &reader, &st), PV_OK);

    kill(pv_test_redis_pid(f->srv), SIGSTOP);
    double t0 = now_s();
    int rc = pv_redis_command(r, NULL, &st, "GET k");
    double took = now_s() - t0;
    pv_status reader_st;
    double t1 = now_s();
    int reader_rc = pv_redis_connect(reader, &reader_st);
    double reader_took = now_s() - t1;
    kill(pv_test_redis_pid(f->srv), SIGCONT);

    assert_unavailable_naming(&st, rc, pv_test_redis_addr(f->srv));
    assert_non_null(strstr(st.msg, "no reply within 200 ms"));
    assert_true(took >= 0.15 && took < 0.6);
    assert_unavailable_naming(&reader_st, reader_rc, pv_test_redis_addr(f->srv));
    assert_non_null(strstr(reader_st.msg, "no reply within 300 ms"));
    assert_true(reader_took >= 0.25 && reader_took < 0.7);
    assert_int_equal(pv_redis_connect(reader, &reader_st), PV_OK);
    pv_redis_free(reader);

    redisReply *rep = NULL;
    assert_int_equal(pv_redis_command(r, &rep, &st, "GET k"), PV_OK);
    assert_string_equal(rep->str, "v");
    freeReplyObject(rep);
    pv_redis_free(r);
}

/* A loopback port with nothing listening. */
static int unused_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void test_connection_refused(void **state) {
    (void)state;
    char addr[32], want[96];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", unused_port());
    snprintf(want, sizeof(want), "redis %s: Connection refused", addr);
    pv_redis *r = new_handle(addr, 1000, NULL, 0);
    pv_status st;

    double t0 = now_s();
    assert_int_equal(pv_redis_connect(r, &st), PV_UNAVAILABLE);
    assert_string_equal(st.msg, want);
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_command(r, &rep, &st, "PING"), PV_UNAVAILABLE);
    assert_string_equal(st.msg, want);
    assert_null(rep);
    const char *ping[] = {"PING"};
    assert_int_equal(pv_redis_append(r, 1, ping, NULL, &st), PV_UNAVAILABLE);
    assert_int_equal(pv_redis_get_reply(r, &rep, &st), PV_UNAVAILABLE);
    assert_true(now_s() - t0 < 0.3);
    pv_redis_free(r);
}

/* ---- options ---- */

static void test_other_address_forms(void **state) {
    fixture *f = *state;
    pv_status st;
    long long res = -1;
    pv_redis *r = new_handle(pv_test_redis_socket(f->srv), 1000, NULL, 0);
    assert_int_equal(heartbeat(r, "hb-unix", "5000", &res, &st), PV_OK);
    assert_int_equal(res, 1);
    assert_raw_string(f, "GET", "hb-unix", "alive");
    pv_redis_free(r);

    /* The server listens on 127.0.0.1 only: "localhost" must not end up on ::1. */
    char addr[32];
    snprintf(addr, sizeof(addr), "localhost:%d", pv_test_redis_port(f->srv));
    r = new_handle(addr, 1000, NULL, 0);
    assert_int_equal(heartbeat(r, "hb-unix", "5000", &res, &st), PV_OK);
    assert_int_equal(res, 0);
    pv_redis_free(r);
}

static void test_auth_and_db(void **state) {
    (void)state;
    pv_test_redis *srv = NULL;
    assert_int_equal(pv_test_redis_start(&srv, "--requirepass \"s3cret pw\" --databases 4"), 0);
    const char *addr = pv_test_redis_addr(srv);
    pv_status st;

    pv_redis *none = new_handle(addr, 1000, NULL, 0);
    assert_int_equal(pv_redis_command(none, NULL, &st, "PING"), PV_UNAUTHENTICATED);
    assert_non_null(strstr(st.msg, addr));
    pv_redis_free(none);

    pv_redis *wrong = new_handle(addr, 1000, "wrong-pw", 0);
    assert_int_equal(pv_redis_connect(wrong, &st), PV_UNAUTHENTICATED);
    assert_null(strstr(st.msg, "wrong-pw"));
    pv_redis_free(wrong);

    pv_redis *baddb = new_handle(addr, 1000, "s3cret pw", 9);
    assert_int_equal(pv_redis_connect(baddb, &st), PV_INTERNAL);
    assert_non_null(strstr(st.msg, "SELECT"));
    pv_redis_free(baddb);

    pv_redis *r = new_handle(addr, 1000, "s3cret pw", 3);
    assert_int_equal(pv_redis_command(r, NULL, &st, "SET in-db-3 yes"), PV_OK);
    long long res = -1;
    assert_int_equal(heartbeat(r, "hb", "5000", &res, &st), PV_OK);
    pv_redis_free(r);

    redisContext *c = pv_test_redis_connect(srv);
    assert_non_null(c);
    redisReply *rep = redisCommand(c, "AUTH %s", "s3cret pw");
    assert_string_equal(rep->str, "OK");
    freeReplyObject(rep);
    rep = redisCommand(c, "EXISTS in-db-3");
    assert_int_equal(rep->integer, 0);
    freeReplyObject(rep);
    freeReplyObject(redisCommand(c, "SELECT 3"));
    rep = redisCommand(c, "EXISTS in-db-3");
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    redisFree(c);
    pv_test_redis_free(srv);
}

static void test_invalid_options(void **state) {
    (void)state;
    static const char *bad[] = {"",       "nocolon",    "host:",    ":6379",
                                "host:0", "host:70000", "host:12ab"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pv_redis_opts opts = {.addr = bad[i], .connect_timeout_ms = 100};
        pv_redis *r = (pv_redis *)1;
        pv_status st;
        assert_int_equal(pv_redis_new(&opts, &r, &st), PV_INVALID_ARGUMENT);
        assert_null(r);
    }
    pv_redis_opts neg = {.addr = "127.0.0.1:1", .command_timeout_ms = -1};
    pv_redis *r = NULL;
    pv_status st;
    assert_int_equal(pv_redis_new(&neg, &r, &st), PV_INVALID_ARGUMENT);

    /* The handle copies its options. */
    char addr[] = "[::1]:6390";
    pv_redis_opts opts = {.addr = addr};
    assert_int_equal(pv_redis_new(&opts, &r, &st), PV_OK);
    addr[0] = 'X';
    assert_string_equal(pv_redis_addr(r), "[::1]:6390");
    pv_redis_free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_set_get_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commandv_is_binary_safe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipeline_1000_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abandoned_pipeline_does_not_shift_replies, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_functions_loaded_on_connect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_functions_reloaded_after_client_kill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_functions_reloaded_after_empty_restart, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_error_replies_are_mapped, setup, teardown),
        cmocka_unit_test(test_error_status_text),
        cmocka_unit_test_setup_teardown(test_kill9_fails_fast_then_recovers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill9_mid_pipeline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill9_before_large_pipeline_is_written, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_new_pipeline_after_abandoned_failed_one, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_idle_connection_survives_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_timeout_blocking_command, setup, teardown),
        cmocka_unit_test_setup_teardown(test_command_timeout_paused_server, setup, teardown),
        cmocka_unit_test(test_connection_refused),
        cmocka_unit_test_setup_teardown(test_other_address_forms, setup, teardown),
        cmocka_unit_test(test_auth_and_db),
        cmocka_unit_test(test_invalid_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
