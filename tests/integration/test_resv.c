/*
 * Reservations and plans against a real Redis: sched_place (capacity, reserve) over the registry,
 * pv_resv (commit, release, expiry, GetNodeResource's check and fix) and the compare-and-set that
 * keeps concurrent reservations from overcommitting a node.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <cmocka.h>
#include <jansson.h>

#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "pv_test_redis.h"
#include "pv_workload.h"
#include "sched_cache.h"
#include "sched_place.h"

#define BASE "t:{reg}:"
#define GIB 1073741824LL

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    redisContext *c;
} fixture;

static pv_redis *connect_new(fixture *f) {
    pv_redis *r = pv_test_redis_client(f->srv, 5000);
    assert_non_null(r);
    return r;
}

static void add_node(fixture *f, const char *name, const char *resources, int alive) {
    pv_status st;
    pv_node n;
    pv_node_spec spec = {
        .name = name, .pod_name = "p1", .endpoint = "process://", .resources = resources};
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &spec, &n, &st), PV_OK);
    pv_node_clear(&n);
    if (alive) assert_int_equal(pv_registry_set_alive(f->r, &f->keys, name, 600, NULL, &st), PV_OK);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_keys_init(&f->keys, "t:", &st);
    f->r = connect_new(f);
    f->c = pv_test_redis_connect(f->srv);
    if (!f->c) return -1;
    pv_pod p;
    pv_pod_spec ps = {.name = "p1"};
    if (pv_registry_add_pod(f->r, &f->keys, &ps, &p, &st) != PV_OK) return -1;
    pv_pod_clear(&p);
    add_node(f, "n1", "{\"cpumem\":{\"cpu\":4,\"memory\":\"4G\"}}", 1);
    add_node(f, "n2", "{\"cpumem\":{\"cpu\":2,\"memory\":\"2G\"}}", 1);
    add_node(f, "n3", "{\"cpumem\":{\"cpu\":8,\"memory\":\"8G\"}}", 0); /* no agent: down */
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

static void request(sched_request *req, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pv_status st;
    int rc = sched_request_parse(buf, req, &st);
    if (rc != PV_OK) fail_msg("request %s: %s", buf, st.msg);
}

/* A capacity reply's lines (pv_sched.h) as {"total": N, "node_capacities": {...}} (caller
 * decrefs), their order checked: by name. Frees reply. */
static json_t *capacity_json(char *reply) {
    pv_sched_capacity c;
    pv_status st;
    if (pv_sched_capacity_parse(reply, &c, &st) != PV_OK) fail_msg("capacity reply: %s", st.msg);
    json_t *caps = json_object();
    for (size_t i = 0; i < c.n; i++) {
        if (i > 0) assert_true(strcmp(c.names[i - 1], c.names[i]) < 0);
        json_object_set_new(caps, c.names[i], json_integer(c.counts[i]));
    }
    json_t *j = json_pack("{s:I, s:o}", "total", (json_int_t)c.total, "node_capacities", caps);
    pv_sched_capacity_clear(&c);
    free(reply);
    assert_non_null(j);
    return j;
}

/* Capacity reply as a JSON object (caller decrefs); asserts success. */
static json_t *capacity(fixture *f, pv_redis *r, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sched_request req;
    request(&req, "%s", buf);
    char *reply = NULL;
    sched_error err = {0};
    int rc = sched_place_capacity(NULL, r ? r : f->r, &f->keys, &req, &reply, &err);
    sched_request_free(&req);
    if (rc != PV_OK) fail_msg("capacity %s: %s", buf, err.status.msg);
    return capacity_json(reply);
}

static long long cap_of(json_t *j, const char *node) {
    json_t *v = json_object_get(json_object_get(j, "node_capacities"), node);
    return v ? json_integer_value(v) : -1;
}

static long long total_of(json_t *j) {
    return json_integer_value(json_object_get(j, "total"));
}

static long long dummy_total(fixture *f) {
    json_t *j = capacity(f, NULL,
                         "{\"pod\":\"p1\",\"strategy\":99,\"resources\":{\"cpumem\":"
                         "{\"memory-request\":\"1G\"}}}");
    long long t = total_of(j);
    json_decref(j);
    return t;
}

static long long int_cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    long long v = rep->type == REDIS_REPLY_INTEGER  ? rep->integer
                  : rep->type == REDIS_REPLY_STRING ? strtoll(rep->str, NULL, 10)
                                                    : -1;
    freeReplyObject(rep);
    return v;
}

static char *node_id(fixture *f, const char *name) {
    redisReply *rep = redisCommand(f->c, "HGET " BASE "nodes %s", name);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    char *id = strdup(rep->str);
    freeReplyObject(rep);
    return id;
}

/* Reserves with a fresh request id; returns the reservation id (caller frees) or NULL with
 * *code set. */
static char *reserve(fixture *f, pv_redis *r, int count, const char *extra, int *code) {
    sched_request req;
    request(&req,
            "{\"pod\":\"p1\",\"strategy\":0,\"count\":%d,\"app\":\"web\",\"entrypoint\":\"main\","
            "\"resources\":{\"cpumem\":{\"memory-request\":\"1G\"}}%s}",
            count, extra ? extra : "");
    char id[PV_ID_MAX];
    pv_id_new("plan", id, sizeof id);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    char *reply = NULL;
    sched_error err = {0};
    int rc = sched_place_reserve(NULL, r ? r : f->r, &f->keys, &req, id,
                                 (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000, &reply, &err);
    sched_request_free(&req);
    *code = rc;
    if (rc != PV_OK) return NULL;
    json_t *j = json_loads(reply, 0, NULL);
    free(reply);
    char *resv = strdup(json_string_value(json_object_get(j, "reservation")));
    json_decref(j);
    return resv;
}

/* ---------------------------------------------------------------------------------------- */

static void test_capacity_dummy_and_plans(void **state) {
    fixture *f = *state;
    json_t *j = capacity(f, NULL,
                         "{\"pod\":\"p1\",\"strategy\":99,\"resources\":{\"cpumem\":"
                         "{\"memory-request\":\"1G\"}}}");
    assert_int_equal(total_of(j), 6); /* n3 is down: not counted */
    assert_int_equal(cap_of(j, "n1"), 4);
    assert_int_equal(cap_of(j, "n2"), 2);
    assert_int_equal(cap_of(j, "n3"), -1);
    json_decref(j);
    /* all=true counts the down node; naming it includes it too. */
    j = capacity(f, NULL,
                 "{\"pod\":\"p1\",\"strategy\":99,\"all\":true,\"resources\":{\"cpumem\":"
                 "{\"memory-request\":\"1G\"}}}");
    assert_int_equal(total_of(j), 14);
    json_decref(j);
    j = capacity(f, NULL,
                 "{\"includes\":[\"n3\"],\"strategy\":99,\"resources\":{\"cpumem\":"
                 "{\"memory-request\":\"2G\"}}}");
    assert_int_equal(total_of(j), 4);
    assert_int_equal(cap_of(j, "n3"), 4);
    json_decref(j);
    j = capacity(f, NULL,
                 "{\"pod\":\"p1\",\"excludes\":[\"n1\"],\"strategy\":99,\"resources\":"
                 "{\"cpumem\":{\"memory-request\":\"1G\"}}}");
    assert_int_equal(total_of(j), 2);
    json_decref(j);
    /* AUTO evens out: 3 instances -> 2 on the bigger node, 1 on the other. */
    j = capacity(f, NULL,
                 "{\"pod\":\"p1\",\"strategy\":0,\"count\":3,\"resources\":{\"cpumem\":"
                 "{\"memory-request\":\"1G\"}}}");
    assert_int_equal(total_of(j), 3);
    assert_int_equal(cap_of(j, "n1") + cap_of(j, "n2"), 3);
    json_decref(j);
    /* named nodes come back by name (the helper checks the order), a node named twice once */
    j = capacity(f, NULL,
                 "{\"includes\":[\"n2\",\"n1\",\"n2\"],\"strategy\":99,\"resources\":"
                 "{\"cpumem\":{\"memory-request\":\"1G\"}}}");
    assert_int_equal(json_object_size(json_object_get(j, "node_capacities")), 2);
    assert_int_equal(cap_of(j, "n1"), 4);
    assert_int_equal(cap_of(j, "n2"), 2);
    json_decref(j);
}

/* The capacity lines (pv_sched.h): what the writer writes the reader reads back, in order; the
 * writer refuses what the format cannot carry, the reader anything but its own lines. */
static void test_capacity_lines(void **state) {
    (void)state;
    const char *names[] = {"a", "n-2.x_y", "z"};
    int64_t counts[] = {0, 1234567890123LL, 7};
    char *body = NULL;
    pv_status st;
    assert_int_equal(pv_sched_capacity_write(names, counts, 3, 1234567890130LL, &body, &st), PV_OK);
    assert_string_equal(body, "pv-capacity 1234567890130 3\n0 a\n1234567890123 n-2.x_y\n7 z\n");
    pv_sched_capacity c;
    assert_int_equal(pv_sched_capacity_parse(body, &c, &st), PV_OK);
    assert_int_equal(c.total, 1234567890130LL);
    assert_int_equal(c.n, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_string_equal(c.names[i], names[i]);
        assert_int_equal(c.counts[i], counts[i]);
    }
    pv_sched_capacity_clear(&c);
    free(body);
    assert_int_equal(pv_sched_capacity_write(names, counts, 0, 0, &body, &st), PV_OK);
    assert_string_equal(body, "pv-capacity 0 0\n");
    assert_int_equal(pv_sched_capacity_parse(body, &c, &st), PV_OK);
    assert_int_equal(c.n, 0);
    free(body);

    const char *bad_names[] = {"a\nb"};
    assert_int_equal(pv_sched_capacity_write(bad_names, counts, 1, 0, &body, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "a\nb"));
    int64_t negative[] = {-1};
    assert_int_equal(pv_sched_capacity_write(names, negative, 1, 0, &body, &st),
                     PV_INVALID_ARGUMENT);

    const char *bad[] = {"{\"total\":1}",
                         "pv-capacity 1\n",
                         "pv-capacity 1 2\n1 a\n",
                         "pv-capacity 1 1\n1 a\n2 b\n",
                         "pv-capacity 1 1\n1 \n",
                         "pv-capacity 1 1\nx a\n",
                         "pv-capacity -1 0\n",
                         "pv-capacity 1 1\n1 a",
                         "pv-capacity 1 99999999999999\n1 a\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *copy = strdup(bad[i]);
        assert_int_equal(pv_sched_capacity_parse(copy, &c, &st), PV_INTERNAL);
        assert_null(c.names);
        free(copy);
    }
}

static void test_capacity_errors(void **state) {
    fixture *f = *state;
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"strategy\":0,\"count\":7,\"resources\":{\"cpumem\":"
                  "{\"memory-request\":\"1G\"}}}");
    char *reply = NULL;
    sched_error err = {0};
    assert_int_equal(sched_place_capacity(NULL, f->r, &f->keys, &req, &reply, &err),
                     PV_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(err.status.msg, "need: 7, available: 6"));
    assert_int_equal(err.kind, SCHED_KIND_INSUFFICIENT_RESOURCE);
    sched_request_free(&req);

    request(&req, "{\"pod\":\"nope\",\"strategy\":99}");
    assert_int_equal(sched_place_capacity(NULL, f->r, &f->keys, &req, &reply, &err), PV_NOT_FOUND);
    sched_request_free(&req);

    pv_status st;
    assert_int_equal(sched_request_parse("{\"pod\":\"p1\",\"resources\":{\"cpumem\":"
                                         "{\"memory-request\":\"-1G\"}}}",
                                         &req, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "memory-request"));
    assert_int_equal(sched_request_parse("{\"pod\":3}", &req, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "pod"));
}

static void test_reserve_and_release(void **state) {
    fixture *f = *state;
    char *id1 = node_id(f, "n1"), *id2 = node_id(f, "n2");
    long long rev0 = int_cmd(f, "HGET " BASE "node:%s usage_rev", id1);
    int code;
    char *resv = reserve(f, NULL, 3, NULL, &code);
    assert_int_equal(code, PV_OK);
    assert_non_null(resv);
    assert_int_equal(dummy_total(f), 3);
    assert_true(int_cmd(f, "HGET " BASE "node:%s usage_rev", id1) > rev0);
    assert_int_equal(int_cmd(f, "HLEN " BASE "node-allocs:%s", id1) +
                         int_cmd(f, "HLEN " BASE "node-allocs:%s", id2),
                     3);
    assert_int_equal(int_cmd(f, "HGET " BASE "deploy-count:web:main n1") +
                         int_cmd(f, "HGET " BASE "deploy-count:web:main n2"),
                     3);
    /* A node holding allocations cannot be removed. */
    pv_status st;
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n1", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "reserved"));

    assert_int_equal(pv_resv_release(f->r, &f->keys, resv, &st), PV_OK);
    assert_int_equal(dummy_total(f), 6);
    assert_int_equal(int_cmd(f, "HLEN " BASE "node-allocs:%s", id1), 0);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "deploy-count:web:main"), 0);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "resv:%s", resv), 0);
    assert_int_equal(pv_resv_release(f->r, &f->keys, resv, &st), PV_NOT_FOUND);
    free(resv);
    free(id1);
    free(id2);
}

static void test_reserve_not_enough(void **state) {
    fixture *f = *state;
    int code;
    char *resv = reserve(f, NULL, 7, NULL, &code);
    assert_null(resv);
    assert_int_equal(code, PV_RESOURCE_EXHAUSTED);
    assert_int_equal(dummy_total(f), 6); /* nothing taken */
}

static void test_same_request_reserves_once(void **state) {
    fixture *f = *state;
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"count\":2,\"resources\":{\"cpumem\":"
                  "{\"memory-request\":\"1G\"}}}");
    sched_error err = {0};
    char *reply = NULL;
    assert_int_equal(sched_place_reserve(NULL, f->r, &f->keys, &req, "plan-AAAA", 1, &reply, &err),
                     PV_OK);
    assert_non_null(reply);
    free(reply);
    reply = NULL;
    /* A scheduler taking the same request over after a crash, or the requester asking again with
     * the same id, finds the reservation made: nothing more is reserved, and it is named. */
    assert_int_equal(sched_place_reserve(NULL, f->r, &f->keys, &req, "plan-AAAA", 1, &reply, &err),
                     PV_ALREADY_EXISTS);
    assert_null(reply);
    assert_non_null(strstr(err.status.msg, "resv-AAAA"));
    pv_resv rv = {0};
    pv_status st;
    assert_int_equal(pv_resv_get(f->r, &f->keys, "resv-AAAA", &rv, &st), PV_OK);
    size_t held = 0;
    for (size_t i = 0; i < rv.nnodes; i++)
        for (size_t a = 0; a < rv.nodes[i].nallocs; a++) {
            assert_non_null(rv.nodes[i].allocs[a]);
            assert_non_null(strstr(rv.nodes[i].allocs[a], "cpumem"));
            held++;
        }
    assert_int_equal(held, 2);
    pv_resv_clear(&rv);
    assert_int_equal(pv_resv_get(f->r, &f->keys, "resv-NOPE", &rv, &st), PV_NOT_FOUND);
    assert_int_equal(dummy_total(f), 4);
    sched_request_free(&req);
}

/* A plan's reply is for the connection waiting on it now: a Redis crash and restart keep the
 * reservation its commit made (appendfsync always) but neither reply (not in the AOF), and the
 * requester asking again with its id finds the reservation. */
static void test_replies_not_kept_across_restart(void **state) {
    fixture *f = *state;
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"count\":1,\"resources\":{\"cpumem\":"
                  "{\"memory-request\":\"1G\"}}}");
    sched_error err = {0};
    char *reply = NULL;
    assert_int_equal(sched_place_reserve(NULL, f->r, &f->keys, &req, "plan-AAAR", 1, &reply, &err),
                     PV_OK);
    assert_non_null(reply);
    free(reply);
    reply = NULL;
    pv_status st;
    assert_int_equal(pv_sched_reply(f->r, &f->keys, "plan-CCCR", "{\"x\":1}", &st), PV_OK);
    assert_int_equal(int_cmd(f, "LLEN " BASE "sched:reply:plan-AAAR"), 1);
    assert_int_equal(int_cmd(f, "LLEN " BASE "sched:reply:plan-CCCR"), 1);
    assert_true(int_cmd(f, "TTL " BASE "sched:reply:plan-CCCR") > 0);

    assert_int_equal(pv_test_redis_kill9(f->srv), 0);
    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    redisFree(f->c);
    f->c = pv_test_redis_connect(f->srv);
    assert_non_null(f->c);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "resv:resv-AAAR " BASE "resv-made:resv-AAAR"), 2);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "sched:reply:plan-AAAR"), 0);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "sched:reply:plan-CCCR"), 0);
    assert_int_equal(sched_place_reserve(NULL, f->r, &f->keys, &req, "plan-AAAR", 1, &reply, &err),
                     PV_ALREADY_EXISTS);
    assert_null(reply);
    assert_int_equal(dummy_total(f), 5); /* 6 slots of 1G (n1 4, n2 2), one held */
    sched_request_free(&req);
}

static bool has_id(char **ids, size_t n, const char *id) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0) return true;
    return false;
}

/* pv_resv_orphaned finds the reservations of operations that ended a while ago or have no
 * record, not those of a running one, of one that ended within the grace, made within the grace,
 * or owned by something that is not an operation; pages of 2 sweep all six and start again. */
static void test_orphaned_reservations(void **state) {
    fixture *f = *state;
    static const char *const owners[] = {"op-ENDED",    "op-NORECORD", "op-RUNNING",
                                         "op-FRESHEND", "op-FRESHRES", "bench"};
    char *resv[6];
    for (int i = 0; i < 6; i++) {
        char extra[64];
        int code;
        snprintf(extra, sizeof extra, ",\"owner\":\"%s\"", owners[i]);
        resv[i] = reserve(f, NULL, 1, extra, &code);
        assert_non_null(resv[i]);
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    long long real = (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000, now = real + 120000;
    int_cmd(f, "HSET t:{ops}:op:op-ENDED status FAILED finished_ms %lld", real);
    int_cmd(f, "HSET t:{ops}:op:op-RUNNING status RUNNING");
    int_cmd(f, "HSET t:{ops}:op:op-FRESHEND status SUCCEEDED finished_ms %lld", now - 1000);
    int_cmd(f, "HSET t:{ops}:op:op-FRESHRES status CANCELLED finished_ms %lld", real);
    int_cmd(f, "HSET " BASE "resv:%s created_ms %lld", resv[4], now - 1000);
    int_cmd(f, "HSET t:{ops}:op:bench status FAILED finished_ms %lld", real);

    size_t cursor = 0, total = 0, calls = 0;
    char *found[6];
    do {
        char **ids = NULL;
        size_t n = 0;
        pv_status st;
        assert_int_equal(pv_resv_orphaned(f->r, &f->keys, now, 60000, &cursor, 2, &ids, &n, &st),
                         PV_OK);
        for (size_t i = 0; i < n; i++)
            found[total++] = strdup(ids[i]);
        pv_resv_ids_free(ids, n);
        calls++;
    } while (cursor != 0 && calls < 10);
    assert_int_equal(calls, 4); /* pages at 0, 2, 4 and an empty one at 6 */
    assert_int_equal(total, 2);
    assert_true(has_id(found, total, resv[0]));
    assert_true(has_id(found, total, resv[1]));
    pv_status st;
    for (size_t i = 0; i < total; i++) {
        assert_int_equal(pv_resv_release(f->r, &f->keys, found[i], &st), PV_OK);
        free(found[i]);
    }
    assert_int_equal(dummy_total(f), 2);
    for (int i = 0; i < 6; i++)
        free(resv[i]);
}

static void test_abandoned_request_reserves_nothing(void **state) {
    fixture *f = *state;
    redisReply *rep = redisCommand(f->c, "SET " BASE "sched:gone:plan-BBBB 1");
    freeReplyObject(rep);
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"count\":2,\"resources\":{\"cpumem\":"
                  "{\"memory-request\":\"1G\"}}}");
    sched_error err = {0};
    char *reply = NULL;
    assert_int_equal(sched_place_reserve(NULL, f->r, &f->keys, &req, "plan-BBBB", 1, &reply, &err),
                     PV_OK);
    assert_null(reply);
    assert_int_equal(dummy_total(f), 6);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "resv:resv-BBBB"), 0);
    sched_request_free(&req);
}

static void test_expired_reservations(void **state) {
    fixture *f = *state;
    int code;
    char *resv = reserve(f, NULL, 2, ",\"ttl_seconds\":1", &code);
    assert_non_null(resv);
    char **ids = NULL;
    size_t n = 0;
    pv_status st;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    int64_t now = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    assert_int_equal(pv_resv_expired(f->r, &f->keys, now - 10000, 10, &ids, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    assert_int_equal(pv_resv_expired(f->r, &f->keys, now + 2000, 10, &ids, &n, &st), PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(ids[0], resv);
    pv_resv_ids_free(ids, n);
    assert_int_equal(pv_resv_release(f->r, &f->keys, resv, &st), PV_OK);
    assert_int_equal(pv_resv_expired(f->r, &f->keys, now + 2000, 10, &ids, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    free(resv);
}

static void test_check_and_fix(void **state) {
    fixture *f = *state;
    int code;
    char *resv = reserve(f, NULL, 2, NULL, &code);
    assert_non_null(resv);
    pv_resv_check c;
    pv_status st;
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0);
    assert_non_null(strstr(c.resources, "cpumem"));
    pv_resv_check_clear(&c);
    /* Usage drifts from the allocations (a crash between two writers, an operator's edit). */
    char *id1 = node_id(f, "n1");
    redisReply *rep = redisCommand(f->c, "HSET " BASE "node:%s usage %s", id1,
                                   "{\"cpumem\":{\"memory_request\":5}}");
    freeReplyObject(rep);
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_true(c.ndiffs > 0);
    assert_non_null(strstr(c.diffs[0], "cpumem."));
    pv_resv_check_clear(&c);
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 1, &c, &st), PV_OK);
    assert_true(c.ndiffs > 0); /* what was fixed */
    pv_resv_check_clear(&c);
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0);
    pv_resv_check_clear(&c);
    assert_int_equal(dummy_total(f), 4);
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "nope", 0, &c, &st), PV_NOT_FOUND);
    free(id1);
    free(resv);
}

/* Threads racing single-instance reservations, each on its own connection, until the pod is
 * full: exactly the capacity is handed out, never more. */
typedef struct racer {
    fixture *f;
    int won, conflicts_seen;
} racer;

static void *race(void *arg) {
    racer *rc = arg;
    pv_redis *r = connect_new(rc->f);
    for (;;) {
        int code;
        char *resv = reserve(rc->f, r, 1, NULL, &code);
        if (!resv) break;
        rc->won++;
        free(resv);
    }
    pv_redis_free(r);
    return NULL;
}

static void test_concurrent_reservations_never_overcommit(void **state) {
    fixture *f = *state;
    enum { N = 4 };
    pthread_t t[N];
    racer rs[N];
    for (int i = 0; i < N; i++) {
        rs[i] = (racer){.f = f};
        pthread_create(&t[i], NULL, race, &rs[i]);
    }
    int won = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        won += rs[i].won;
    }
    assert_int_equal(won, 6);
    /* Full: DUMMY says so as Eru does (a total of 0 is "not enough resource"). */
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"strategy\":99,\"resources\":{\"cpumem\":"
                  "{\"memory-request\":\"1G\"}}}");
    char *reply = NULL;
    sched_error err = {0};
    assert_int_equal(sched_place_capacity(NULL, f->r, &f->keys, &req, &reply, &err),
                     PV_RESOURCE_EXHAUSTED);
    sched_request_free(&req);
    char *id1 = node_id(f, "n1"), *id2 = node_id(f, "n2");
    assert_int_equal(int_cmd(f, "HLEN " BASE "node-allocs:%s", id1), 4);
    assert_int_equal(int_cmd(f, "HLEN " BASE "node-allocs:%s", id2), 2);
    /* The recorded usage is exactly what the allocations add up to. */
    pv_resv_check c;
    pv_status st;
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0);
    assert_non_null(strstr(c.usage, "4294967296"));
    pv_resv_check_clear(&c);
    free(id1);
    free(id2);
}

/* Reserves count instances of web/main (memory each, "1G") on n1 under plan id plan: the plan's
 * reply (the caller decrefs it); *allocs (may be NULL) its allocations on n1, borrowed from it. */
static json_t *reserve_on_n1(fixture *f, int count, const char *memory, const char *plan,
                             json_t **allocs) {
    sched_request req;
    request(&req,
            "{\"includes\":[\"n1\"],\"count\":%d,\"app\":\"web\",\"entrypoint\":"
            "\"main\",\"resources\":{\"cpumem\":{\"memory-request\":\"%s\"}}}",
            count, memory);
    sched_error err = {0};
    char *reply = NULL;
    assert_int_equal(sched_place_reserve(NULL, f->r, &f->keys, &req, plan, 1, &reply, &err), PV_OK);
    sched_request_free(&req);
    json_t *j = json_loads(reply, 0, NULL);
    free(reply);
    assert_non_null(j);
    if (allocs) *allocs = json_object_get(json_object_get(j, "allocations"), "n1");
    return j;
}

/* A deploy where one of two instances is created: the workload takes its allocation over
 * (pv_workload_add), releasing the reservation gives back only the other one, the deploy count
 * keeps the created instance, and the node's usage is exactly the workload's. */
static void test_release_after_partial_deploy(void **state) {
    fixture *f = *state;
    json_t *list;
    json_t *j = reserve_on_n1(f, 2, "1G", "plan-CCCC", &list);
    json_t *first = json_array_get(list, 0);
    assert_non_null(first);
    pv_workload w = {0};
    assert_int_equal(pv_workload_new_id(w.id, &(pv_status){0}), PV_OK);
    w.name = "web_main_abcdef";
    w.app = "web";
    w.entry = "main";
    w.node = "n1";
    w.image = "img";
    w.alloc_id = (char *)json_string_value(json_object_get(first, "id"));
    pv_status st;
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_OK);
    json_decref(j);
    assert_int_equal(dummy_total(f), 4); /* n1: 4G - 2G reserved */
    assert_int_equal(pv_resv_release(f->r, &f->keys, "resv-CCCC", &st), PV_OK);
    assert_int_equal(dummy_total(f), 5); /* the workload keeps its 1G */
    assert_int_equal(int_cmd(f, "HGET " BASE "deploy-count:web:main n1"), 1);
    pv_resv_check c;
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0); /* usage = the workload's resources */
    assert_non_null(strstr(c.usage, "1073741824"));
    pv_resv_check_clear(&c);
}

/* A plan request's stream entry, read into the group and so pending, as the scheduler holds it:
 * its id into entry. */
static void pending_request(fixture *f, const char *stream, char *entry, size_t len) {
    redisReply *rep = redisCommand(f->c, "XGROUP CREATE %s g 0 MKSTREAM", stream);
    freeReplyObject(rep);
    rep = redisCommand(f->c, "XADD %s * id x", stream);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    snprintf(entry, len, "%s", rep->str);
    freeReplyObject(rep);
    rep = redisCommand(f->c, "XREADGROUP GROUP g s1 COUNT 1 STREAMS %s >", stream);
    freeReplyObject(rep);
}

/* A reservation's commit acknowledges the plan request's entry it was given (one call for the
 * commit and the XACK), and only a commit: the same request again (DUPLICATE, answered
 * ALREADY_EXISTS) leaves its entry pending for the server to acknowledge. */
static void test_commit_acknowledges_the_request(void **state) {
    fixture *f = *state;
    const char *stream = BASE "sched:requests";
    for (int round = 0; round < 2; round++) {
        char entry[64];
        pending_request(f, stream, entry, sizeof entry);
        sched_request req;
        request(&req, "{\"includes\":[\"n1\"],\"count\":1,\"app\":\"web\",\"entrypoint\":"
                      "\"main\",\"resources\":{\"cpumem\":{\"memory-request\":\"1G\"}}}");
        bool acked = false;
        req.ack = (pv_resv_ack){.stream = stream, .group = "g", .entry = entry};
        req.acked = &acked;
        sched_error err = {0};
        char *reply = NULL;
        assert_int_equal(
            sched_place_reserve(NULL, f->r, &f->keys, &req, "plan-AAAK", 1, &reply, &err),
            round == 0 ? PV_OK : PV_ALREADY_EXISTS);
        free(reply);
        sched_request_free(&req);
        assert_int_equal(acked, round == 0);
        redisReply *rep = redisCommand(f->c, "XPENDING %s g - + 10", stream);
        assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
        assert_int_equal(rep->elements, (size_t)round); /* the second's entry is still there */
        freeReplyObject(rep);
    }
}

/* A one-node deploy of two instances whose agent names the reservation with each record
 * (pv_workload_add_ending): the first leaves it (the other allocation is still on the node),
 * the second, the last, ends it in the same step (record and expiry entry gone, no release
 * needed: a release finds nothing); the node's usage and deploy count stay the two workloads'. */
static void test_last_instance_ends_reservation(void **state) {
    fixture *f = *state;
    json_t *list;
    json_t *j = reserve_on_n1(f, 2, "1G", "plan-EEEE", &list);
    assert_int_equal(json_array_size(list), 2);
    const char *a0 = json_string_value(json_object_get(json_array_get(list, 0), "id")),
               *a1 = json_string_value(json_object_get(json_array_get(list, 1), "id"));
    const char *names[] = {"web_main_000001", "web_main_000002"}, *others[][1] = {{a1}, {a0}};
    for (int i = 0; i < 2; i++) {
        pv_workload w = {.name = (char *)names[i],
                         .app = "web",
                         .entry = "main",
                         .node = "n1",
                         .image = "img",
                         .alloc_id = (char *)(i ? a1 : a0)};
        pv_status st;
        assert_int_equal(pv_workload_new_id(w.id, &st), PV_OK);
        bool ended = !i; /* must be overwritten */
        assert_int_equal(
            pv_workload_add_ending(f->r, &f->keys, &w, "resv-EEEE", others[i], 1, &ended, &st),
            PV_OK);
        assert_int_equal(ended, i == 1);
        assert_int_equal(int_cmd(f, "EXISTS " BASE "resv:resv-EEEE"), i == 0);
        assert_int_equal(int_cmd(f, "ZCARD " BASE "resvs"), i == 0);
    }
    json_decref(j);
    pv_status st;
    assert_int_equal(pv_resv_release(f->r, &f->keys, "resv-EEEE", &st), PV_NOT_FOUND);
    assert_int_equal(dummy_total(f), 4); /* n1: 4G - the two workloads' 2G */
    assert_int_equal(int_cmd(f, "HGET " BASE "deploy-count:web:main n1"), 2);
    pv_resv_check c;
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0);
    pv_resv_check_clear(&c);
}

/* Workloads of one node given back at once by many threads, each on its own connection: every
 * give-back succeeds (each moves the node's usage under the others: retried without a wait, a
 * burst like this exhausted the retries and a RemoveWorkload failed), and the node ends empty. */
enum { RETURNERS = 16, RETURNS_EACH = 4 };

typedef struct returner {
    fixture *f;
    char ids[RETURNS_EACH][sizeof((pv_workload){0}).id];
    int failed;
    char msg[PV_STATUS_MSG_MAX];
} returner;

static void *give_back(void *arg) {
    returner *g = arg;
    pv_redis *r = connect_new(g->f);
    for (int i = 0; i < RETURNS_EACH; i++) {
        pv_status st = {0};
        if (pv_resv_return_workload(r, &g->f->keys, g->ids[i], &st) != PV_OK) {
            g->failed++;
            snprintf(g->msg, sizeof g->msg, "%s", st.msg);
        }
    }
    pv_redis_free(r);
    return NULL;
}

/* Adds a workload on n1 taking allocation alloc of the plan; its id into id. */
static void add_on_n1(fixture *f, json_t *alloc, int i, char *id, size_t idlen) {
    pv_workload w = {0};
    pv_status st;
    assert_int_equal(pv_workload_new_id(w.id, &st), PV_OK);
    char name[64];
    snprintf(name, sizeof name, "web_main_%06d", i);
    w.name = name;
    w.app = "web";
    w.entry = "main";
    w.node = "n1";
    w.image = "img";
    w.alloc_id = (char *)json_string_value(json_object_get(alloc, "id"));
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_OK);
    snprintf(id, idlen, "%.*s", (int)(idlen - 1), w.id);
}

static void test_concurrent_returns_all_succeed(void **state) {
    fixture *f = *state;
    enum { N = RETURNERS * RETURNS_EACH };
    json_t *allocs;
    json_t *j = reserve_on_n1(f, N, "64M", "plan-RRRR", &allocs);
    assert_int_equal(json_array_size(allocs), N);
    static returner g[RETURNERS];
    for (int i = 0; i < N; i++) {
        returner *to = &g[i % RETURNERS];
        to->f = f;
        add_on_n1(f, json_array_get(allocs, i), i, to->ids[i / RETURNERS], sizeof to->ids[0]);
    }
    json_decref(j);
    pv_status st;
    assert_int_equal(pv_resv_release(f->r, &f->keys, "resv-RRRR", &st), PV_OK);
    pthread_t t[RETURNERS];
    for (int i = 0; i < RETURNERS; i++)
        pthread_create(&t[i], NULL, give_back, &g[i]);
    int failed = 0;
    for (int i = 0; i < RETURNERS; i++) {
        pthread_join(t[i], NULL);
        if (g[i].failed)
            print_message("give-backs of thread %d: %d failed: %s\n", i, g[i].failed, g[i].msg);
        failed += g[i].failed;
        g[i].failed = 0;
    }
    assert_int_equal(failed, 0);
    pv_resv_check c;
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0);
    pv_resv_check_clear(&c);
    assert_int_equal(dummy_total(f), 6); /* both nodes whole again */
}

/* A node's part of a removal gives back all of its workloads in one compare-and-set: one usage
 * write for three workloads; one whose record is another incarnation than the instance's
 * (replaced elsewhere: epoch 2, the instance 1) is left alone; the same call again (a
 * redelivered removal) finds the others gone and writes nothing; the usage matches what is
 * left throughout. */
static void test_batched_return_and_retry(void **state) {
    fixture *f = *state;
    json_t *allocs;
    json_t *j = reserve_on_n1(f, 3, "1G", "plan-BBBB", &allocs);
    char ids[3][sizeof((pv_workload){0}).id];
    for (int i = 0; i < 3; i++)
        add_on_n1(f, json_array_get(allocs, i), i, ids[i], sizeof ids[i]);
    json_decref(j);
    pv_status st;
    assert_int_equal(pv_resv_release(f->r, &f->keys, "resv-BBBB", &st), PV_OK);
    assert_int_equal(dummy_total(f), 3); /* n1: 4G - 3G */
    assert_int_equal(int_cmd(f, "HSET " BASE "wl:%s epoch 2", ids[2]), 0);
    char *id1 = node_id(f, "n1");
    long long rev0 = int_cmd(f, "HGET " BASE "node:%s usage_rev", id1);
    pv_resv_return w[3];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 3; i++)
            w[i] = (pv_resv_return){.id = ids[i], .epoch = 1};
        assert_int_equal(pv_resv_return_workloads(f->r, &f->keys, "n1", w, 3, &st), PV_OK);
        assert_int_equal(w[0].outcome, round == 0 ? PV_OK : PV_NOT_FOUND);
        assert_int_equal(w[1].outcome, round == 0 ? PV_OK : PV_NOT_FOUND);
        assert_int_equal(w[2].outcome, PV_FAILED_PRECONDITION);
        assert_int_equal(w[2].moved_epoch, 2);
        assert_int_equal(int_cmd(f, "HGET " BASE "node:%s usage_rev", id1), rev0 + 1);
        assert_int_equal(int_cmd(f, "EXISTS " BASE "wl:%s", ids[0]), 0);
        assert_int_equal(int_cmd(f, "EXISTS " BASE "wl:%s", ids[2]), 1);
        assert_int_equal(int_cmd(f, "HGET " BASE "deploy-count:web:main n1"), 1);
        assert_int_equal(int_cmd(f, "SCARD " BASE "node-workloads:%s", id1), 1);
        assert_int_equal(dummy_total(f), 5); /* n1: 4G - the one left */
        pv_resv_check c;
        assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
        assert_int_equal(c.ndiffs, 0);
        pv_resv_check_clear(&c);
    }
    /* unchecked (no instance epoch): removed whatever its incarnation */
    assert_int_equal(pv_resv_return_workload(f->r, &f->keys, ids[2], &st), PV_OK);
    assert_int_equal(pv_resv_return_workload(f->r, &f->keys, ids[2], &st), PV_NOT_FOUND);
    assert_int_equal(dummy_total(f), 6);
    assert_int_equal(int_cmd(f, "HLEN " BASE "deploy-count:web:main"), 0);
    free(id1);
}

/* A node part larger than one call of the function takes (PV_RESV_RETURN_BATCH) goes back in
 * several, every workload settled, the usage exact: one call of them all failed in Lua's
 * unpack past ~2,600 workloads. */
static void test_batched_return_of_many(void **state) {
    fixture *f = *state;
    enum { N = 2700 }; /* 8,100 keys: past Lua's unpack in one call, 11 calls of the batch */
    json_t *allocs;
    json_t *j = reserve_on_n1(f, N, "1M", "plan-MANY", &allocs);
    assert_int_equal(json_array_size(allocs), N);
    static char ids[N][sizeof((pv_workload){0}).id];
    static pv_resv_return w[N];
    for (int i = 0; i < N; i++) {
        add_on_n1(f, json_array_get(allocs, i), i, ids[i], sizeof ids[i]);
        w[i] = (pv_resv_return){.id = ids[i]};
    }
    json_decref(j);
    pv_status st;
    assert_int_equal(pv_resv_release(f->r, &f->keys, "resv-MANY", &st), PV_OK);
    assert_int_equal(pv_resv_return_workloads(f->r, &f->keys, "n1", w, N, &st), PV_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(w[i].outcome, PV_OK);
    char *id1 = node_id(f, "n1");
    assert_int_equal(int_cmd(f, "SCARD " BASE "node-workloads:%s", id1), 0);
    assert_int_equal(int_cmd(f, "HLEN " BASE "deploy-count:web:main"), 0);
    assert_int_equal(dummy_total(f), 6); /* n1 whole again: 4G of 1G each, 2G on n2 */
    pv_resv_check c;
    assert_int_equal(pv_resv_check_node(f->r, &f->keys, "n1", 0, &c, &st), PV_OK);
    assert_int_equal(c.ndiffs, 0);
    pv_resv_check_clear(&c);
    free(id1);
}

/* DUMMY total through a cache kept across calls, as the scheduler daemon keeps one. */
static long long cached_total(fixture *f, sched_cache *cache) {
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"strategy\":99,\"resources\":{\"cpumem\":"
                  "{\"memory-request\":\"1G\"}}}");
    char *reply = NULL;
    sched_error err = {0};
    int rc = sched_place_capacity(cache, f->r, &f->keys, &req, &reply, &err);
    sched_request_free(&req);
    if (rc != PV_OK) return -rc;
    json_t *j = capacity_json(reply);
    long long t = total_of(j);
    json_decref(j);
    return t;
}

static void test_cache_follows_every_change(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    pv_status st;
    assert_int_equal(cached_total(f, cache), 6);
    /* Resources replaced: the node's rev moves, the cache re-reads it. */
    pv_node_update u = {.name = "n2", .resources = "{\"cpumem\":{\"cpu\":2,\"memory\":\"5G\"}}"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 9);
    /* Liveness is never cached. */
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n3", 600, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 17);
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n3", -1, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 9);
    /* Bypass (cordon) is a write of the record. */
    pv_node_update b = {.name = "n1", .bypass = PV_TRI_TRUE};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &b, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 5);
    b.bypass = PV_TRI_FALSE;
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &b, NULL, &st), PV_OK);
    /* A reservation's usage, and a node removed and added again under the same name. */
    int code;
    char *resv = reserve(f, NULL, 2, NULL, &code);
    assert_non_null(resv);
    assert_int_equal(cached_total(f, cache), 7);
    assert_int_equal(pv_resv_release(f->r, &f->keys, resv, &st), PV_OK);
    free(resv);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n2", &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 4);
    add_node(f, "n2", "{\"cpumem\":{\"cpu\":2,\"memory\":\"1G\"}}", 1);
    assert_int_equal(cached_total(f, cache), 5);
    size_t entries;
    uint64_t reads, views;
    sched_cache_stats(cache, &entries, &reads, &views);
    assert_int_equal(entries, 3);
    assert_true(views >= 8);
    assert_true(reads < views * 3); /* unchanged nodes were not read again on every view */
    sched_cache_free(cache);
}

static uint64_t cache_reads(sched_cache *cache) {
    size_t entries;
    uint64_t reads, views;
    sched_cache_stats(cache, &entries, &reads, &views);
    return reads;
}

/* A view reads again only the records whose change index moved: none when nothing changed, the
 * one node a write touched, and nothing for a heartbeat (liveness comes with every view). */
static void test_cache_reads_only_what_changed(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    pv_status st;
    assert_int_equal(cached_total(f, cache), 6);
    uint64_t r0 = cache_reads(cache);
    assert_int_equal(r0, 3);
    assert_int_equal(cached_total(f, cache), 6);
    assert_int_equal(cache_reads(cache), r0);
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n1", 600, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 6);
    assert_int_equal(cache_reads(cache), r0);
    /* One node's usage (a reservation on n2 alone) */
    int code;
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"includes\":[\"n2\"],\"count\":1,\"resources\":"
                  "{\"cpumem\":{\"memory-request\":\"1G\"}}}");
    char *reply = NULL;
    sched_error err = {0};
    code = sched_place_reserve(NULL, f->r, &f->keys, &req, NULL, 0, &reply, &err);
    sched_request_free(&req);
    assert_int_equal(code, PV_OK);
    free(reply);
    assert_int_equal(cached_total(f, cache), 5);
    assert_int_equal(cache_reads(cache), r0 + 1);
    sched_cache_free(cache);
}

/* A node that only usage writes touched since the cache read it (another scheduler's
 * reservation, then its release) is read as its usage alone; one whose record was written
 * otherwise too (its resources replaced, before or after a usage write) is read whole. Each
 * total is what a cold cache finds. */
static void test_cache_reads_usage_alone(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    pv_status st;
    int code;
    assert_int_equal(cached_total(f, cache), 6);
    uint64_t r0 = cache_reads(cache);
    assert_int_equal(sched_cache_usage_reads(cache), 0);
    char *resv = reserve(f, NULL, 2, NULL, &code); /* another scheduler's: no cache */
    assert_non_null(resv);
    assert_int_equal(cached_total(f, cache), 4);
    uint64_t touched = cache_reads(cache) - r0; /* the nodes the reservation took */
    assert_true(touched >= 1);
    assert_int_equal(sched_cache_usage_reads(cache), touched);
    assert_int_equal(pv_resv_release(f->r, &f->keys, resv, &st), PV_OK);
    free(resv);
    assert_int_equal(cached_total(f, cache), 6);
    assert_int_equal(sched_cache_usage_reads(cache), 2 * touched);

    uint64_t u0 = sched_cache_usage_reads(cache), r1 = cache_reads(cache);
    pv_node_update u = {.name = "n2", .resources = "{\"cpumem\":{\"cpu\":2,\"memory\":\"5G\"}}"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, NULL, &st), PV_OK);
    resv = reserve(f, NULL, 2, ",\"includes\":[\"n2\"]", &code);
    assert_non_null(resv);
    free(resv);
    assert_int_equal(cached_total(f, cache), 7); /* n1 4, n2 5 - 2 */
    assert_int_equal(cached_total(f, NULL), 7);
    assert_int_equal(cache_reads(cache), r1 + 1);
    assert_int_equal(sched_cache_usage_reads(cache), u0);

    resv = reserve(f, NULL, 1, ",\"includes\":[\"n2\"]", &code);
    assert_non_null(resv);
    free(resv);
    u.resources = "{\"cpumem\":{\"cpu\":2,\"memory\":\"6G\"}}";
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 7); /* n1 4, n2 6 - 3 */
    assert_int_equal(cached_total(f, NULL), 7);
    assert_int_equal(cache_reads(cache), r1 + 2);
    assert_int_equal(sched_cache_usage_reads(cache), u0);
    sched_cache_free(cache);
}

/* A node whose alive key expires is down in the next view, without any write of its record. */
static void test_cache_sees_liveness_expire(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    pv_status st;
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n3", 1, NULL, &st), PV_OK);
    long long total = cached_total(f, cache);
    bool expired = int_cmd(f, "EXISTS " BASE "alive:n3") == 0;
    assert_true(total == 14 || expired); /* 6 + n3's 8, unless the second passed already */
    for (int i = 0; i < 300 && int_cmd(f, "EXISTS " BASE "alive:n3") == 1; i++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(int_cmd(f, "EXISTS " BASE "alive:n3"), 0);
    assert_int_equal(cached_total(f, cache), 6);
    sched_cache_free(cache);
}

/* Records written before the index existed (or an index lost): the next view builds it from the
 * records and the alive keys, and a cache that followed the old index reads everything again. */
static void test_cache_index_rebuilt(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    assert_int_equal(cached_total(f, cache), 6);
    assert_int_equal(int_cmd(f, "DEL " BASE "node-index " BASE "node-revs " BASE "node-alive"), 3);
    /* n2 removed behind the cache's back, as a Redis restarted from an older file would have */
    assert_int_equal(int_cmd(f, "HDEL " BASE "nodes n2"), 1);
    uint64_t r0 = cache_reads(cache);
    assert_int_equal(cached_total(f, cache), 4);
    assert_int_equal(int_cmd(f, "ZCARD " BASE "node-revs"), 2);
    assert_int_equal(int_cmd(f, "ZCOUNT " BASE "node-alive 1 +inf"), 1); /* n1; n3 has no agent */
    assert_int_equal(cache_reads(cache), r0 + 2);
    size_t entries;
    uint64_t reads, views;
    sched_cache_stats(cache, &entries, &reads, &views);
    assert_int_equal(entries, 2);
    sched_cache_free(cache);
}

/* What a plan through cache sees of web/main's deploy counts on n1, n2 and n4: FILL up to 4
 * places 4 - count on each node (n4: -1 while it is not there). */
static void cached_counts(fixture *f, sched_cache *cache, long long out[3]) {
    sched_request req;
    request(&req,
            "{\"pod\":\"p1\",\"strategy\":%d,\"count\":4,\"app\":\"web\",\"entrypoint\":"
            "\"main\",\"resources\":{\"cpumem\":{\"memory-request\":\"256M\"}}}",
            SCHED_FILL);
    char *reply = NULL;
    sched_error err = {0};
    int rc = sched_place_capacity(cache, f->r, &f->keys, &req, &reply, &err);
    sched_request_free(&req);
    if (rc != PV_OK) fail_msg("FILL: %s", err.status.msg);
    json_t *j = capacity_json(reply);
    const char *names[] = {"n1", "n2", "n4"};
    for (int i = 0; i < 3; i++)
        out[i] = cap_of(j, names[i]) < 0 ? -1 : 4 - cap_of(j, names[i]);
    json_decref(j);
}

/* A reservation of count instances of web/main on the named node, through cache (NULL: another
 * scheduler's); its reply into *reply when reply is not NULL. */
static char *reserve_on(fixture *f, sched_cache *cache, const char *node, int count,
                        const char *resources, char **reply) {
    sched_request req;
    request(&req,
            "{\"pod\":\"p1\",\"includes\":[\"%s\"],\"count\":%d,\"app\":\"web\","
            "\"entrypoint\":\"main\",\"resources\":%s}",
            node, count, resources);
    char id[PV_ID_MAX];
    pv_id_new("plan", id, sizeof id);
    char *body = NULL;
    sched_error err = {0};
    int rc = sched_place_reserve(cache, f->r, &f->keys, &req, id, 1, &body, &err);
    sched_request_free(&req);
    if (rc != PV_OK) fail_msg("reserve on %s: %s", node, err.status.msg);
    json_t *j = json_loads(body, 0, NULL);
    char *resv = strdup(json_string_value(json_object_get(j, "reservation")));
    json_decref(j);
    if (reply)
        *reply = body;
    else
        free(body);
    return resv;
}

#define ASSERT_COUNTS(c, a, b, d)                                                                  \
    do {                                                                                           \
        assert_int_equal((c)[0], (a));                                                             \
        assert_int_equal((c)[1], (b));                                                             \
        assert_int_equal((c)[2], (d));                                                             \
    } while (0)

/* A scheduler keeps the deploy counts it read: a plan after a change (its own reservation,
 * another scheduler's, a release, a workload removed, a node added) sees the new counts, and
 * reads from Redis only the counts of the nodes that changed. */
static void test_cache_counts_follow_changes(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    long long c[3];
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 0, 0, -1);
    uint64_t reads = sched_cache_count_reads(cache);
    assert_int_equal(reads, 2); /* n1, n2 */
    cached_counts(f, cache, c);
    assert_int_equal(sched_cache_count_reads(cache), reads); /* nothing changed: nothing read */
    /* its own reservation: the commit's result goes into the cache, nothing is read again */
    const char *mem = "{\"cpumem\":{\"memory-request\":\"256M\"}}";
    char *mine = reserve_on(f, cache, "n1", 2, mem, NULL);
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 2, 0, -1);
    assert_int_equal(sched_cache_count_reads(cache), reads);
    /* another scheduler's: n2's count alone is read again */
    char *body = NULL;
    char *theirs = reserve_on(f, NULL, "n2", 1, mem, &body);
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 2, 1, -1);
    assert_int_equal(sched_cache_count_reads(cache), reads + 1);
    /* a release (pv_sched_release) and a workload removed (pv_wl_remove_release) */
    pv_status st;
    assert_int_equal(pv_resv_release(f->r, &f->keys, mine, &st), PV_OK);
    json_t *j = json_loads(body, 0, NULL);
    json_t *alloc = json_array_get(json_object_get(json_object_get(j, "allocations"), "n2"), 0);
    pv_workload w = {0};
    assert_int_equal(pv_workload_new_id(w.id, &st), PV_OK);
    w.name = "web_main_counted";
    w.app = "web";
    w.entry = "main";
    w.node = "n2";
    w.image = "img";
    w.alloc_id = (char *)json_string_value(json_object_get(alloc, "id"));
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_OK);
    assert_int_equal(pv_resv_release(f->r, &f->keys, theirs, &st), PV_OK);
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 0, 1, -1); /* the workload keeps n2's count */
    assert_int_equal(pv_resv_return_workload(f->r, &f->keys, w.id, &st), PV_OK);
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 0, 0, -1);
    /* a node added, then another scheduler's reservation on it */
    add_node(f, "n4", "{\"cpumem\":{\"cpu\":4,\"memory\":\"4G\"}}", 1);
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 0, 0, 0);
    char *more = reserve_on(f, NULL, "n4", 3, mem, NULL);
    cached_counts(f, cache, c);
    ASSERT_COUNTS(c, 0, 0, 3);
    json_decref(j);
    free(body);
    free(mine);
    free(theirs);
    free(more);
    sched_cache_free(cache);
}

/* A commit over several nodes puts them into the change index and the deploy counts with a few
 * commands for all of them (nodes_changed, add_counts): each node gets its own seq above the
 * one before, the last the index's; each count is its allocations; the committing cache's
 * answer is a cold one's; a release takes every count away. */
static void test_multi_node_commit_counts_and_index(void **state) {
    fixture *f = *state;
    add_node(f, "n4", "{\"cpumem\":{\"cpu\":4,\"memory\":\"4G\"}}", 1);
    add_node(f, "n5", "{\"cpumem\":{\"cpu\":4,\"memory\":\"4G\"}}", 1);
    sched_cache *cache = sched_cache_new();
    assert_int_equal(cached_total(f, cache), 14);
    long long seq0 = int_cmd(f, "HGET " BASE "node-index seq");
    sched_request req;
    request(&req, "{\"pod\":\"p1\",\"count\":7,\"app\":\"web\",\"entrypoint\":\"main\","
                  "\"resources\":{\"cpumem\":{\"memory-request\":\"1G\"}}}");
    char *body = NULL;
    sched_error err = {0};
    assert_int_equal(sched_place_reserve(cache, f->r, &f->keys, &req, "plan-MULTI", 1, &body, &err),
                     PV_OK);
    sched_request_free(&req);
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    json_t *allocs = json_object_get(j, "allocations");
    assert_true(json_object_size(allocs) >= 3);
    long long seq1 = int_cmd(f, "HGET " BASE "node-index seq");
    assert_int_equal(seq1 - seq0, (long long)json_object_size(allocs));
    const char *name;
    json_t *list;
    long long seen = 0, seqs_sum = 0, total = 0;
    json_object_foreach(allocs, name, list) {
        pv_node n;
        pv_status st;
        assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, name, &n, &st),
                         PV_OK);
        long long seq = int_cmd(f, "ZSCORE " BASE "node-revs %s", n.id);
        pv_node_clear(&n);
        assert_true(seq > seq0 && seq <= seq1);
        seqs_sum += seq;
        seen++;
        assert_int_equal(int_cmd(f, "HGET " BASE "deploy-count:web:main %s", name),
                         (long long)json_array_size(list));
        total += (long long)json_array_size(list);
    }
    assert_int_equal(total, 7);
    assert_int_equal(seqs_sum, (seq0 + 1 + seq1) * seen / 2); /* seq0+1 .. seq1, each once */
    assert_int_equal(int_cmd(f, "HLEN " BASE "deploy-count:web:main"), seen);
    assert_int_equal(cached_total(f, cache), 7);
    assert_int_equal(cached_total(f, NULL), 7);
    pv_status st;
    assert_int_equal(pv_resv_release(f->r, &f->keys, "resv-MULTI", &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "deploy-count:web:main"), 0);
    assert_int_equal(int_cmd(f, "HGET " BASE "node-index seq"), seq1 + seen);
    assert_int_equal(cached_total(f, cache), 14);
    json_decref(j);
    sched_cache_free(cache);
}

/* A reservation allocates on the cache's parsed node in place and the cache keeps the result
 * when the commit is made: what the cache then answers is what a fresh read of the records
 * gives, cores included. */
static void test_cache_after_own_commit_matches_redis(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    const char *cores = "{\"cpumem\":{\"cpu-bind\":true,\"cpu-request\":1,\"memory-request\":"
                        "\"512M\"}}";
    assert_int_equal(cached_total(f, cache), 6);
    uint64_t r0 = cache_reads(cache);
    char *a = reserve_on(f, cache, "n1", 2, cores, NULL);
    char *b = reserve_on(f, cache, "n2", 1, cores, NULL);
    const char *q = "{\"pod\":\"p1\",\"strategy\":99,\"resources\":{\"cpumem\":{\"cpu-bind\":"
                    "true,\"cpu-request\":1,\"memory-request\":\"256M\"}}}";
    sched_request req;
    request(&req, "%s", q);
    char *reply = NULL;
    sched_error err = {0};
    assert_int_equal(sched_place_capacity(cache, f->r, &f->keys, &req, &reply, &err), PV_OK);
    sched_request_free(&req);
    json_t *cached = capacity_json(reply);
    assert_int_equal(cache_reads(cache), r0); /* its own writes were not read back */
    json_t *fresh = capacity(f, NULL, "%s", q);
    assert_int_equal(total_of(cached), total_of(fresh));
    assert_int_equal(cap_of(cached, "n1"), cap_of(fresh, "n1"));
    assert_int_equal(cap_of(cached, "n2"), cap_of(fresh, "n2"));
    assert_int_equal(cap_of(fresh, "n1"), 2); /* 4 cores, 2 taken */
    json_decref(cached);
    json_decref(fresh);
    free(a);
    free(b);
    sched_cache_free(cache);
}

/* pv_sched_commit answers 'OK' unless asked for the seqs after its node list: a scheduler of
 * the previous version (which reads 'OK' alone) and this library work together, and this
 * scheduler with the previous library (which answers 'OK') reads its nodes back instead. */
static void test_commit_answers_by_what_it_was_asked(void **state) {
    fixture *f = *state;
    int code;
    char *resv = reserve(f, NULL, 1, NULL, &code); /* pv_resv_commit asks for the seqs */
    assert_non_null(resv);
    free(resv);
#define COMMIT_NO_NODES(id)                                                                        \
    "FCALL pv_sched_commit 1 " BASE "resv:" id " " BASE " " id " p1 o web main 0 {} '' '' 60 0"
    redisReply *rep = redisCommand(f->c, COMMIT_NO_NODES("resv-X1"));
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    assert_string_equal(rep->str, "OK");
    freeReplyObject(rep);
    rep = redisCommand(f->c, COMMIT_NO_NODES("resv-X2") " seqs");
    if (rep->type == REDIS_REPLY_ERROR) fail_msg("%s", rep->str);
    assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
    assert_int_equal(rep->elements, 2); /* 'OK', now: no nodes */
    assert_string_equal(rep->element[0]->str, "OK");
    freeReplyObject(rep);
#undef COMMIT_NO_NODES
}

/* How many times Redis ran a command (INFO commandstats: inside functions too). */
static long long cmd_calls(fixture *f, const char *cmd) {
    redisReply *rep = redisCommand(f->c, "INFO commandstats");
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    char pat[64];
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    const char *p = strstr(rep->str, pat);
    long long n = p ? strtoll(p + strlen(pat), NULL, 10) : 0;
    freeReplyObject(rep);
    return n;
}

/* A view whose change counter has not moved reads no range of the change index, and a change
 * right after such a view is still seen by the next one. */
static void test_cache_unmoved_index_skips_range(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    pv_status st;
    assert_int_equal(cached_total(f, cache), 6);
    long long z0 = cmd_calls(f, "zrangebyscore");
    assert_int_equal(cached_total(f, cache), 6);
    assert_int_equal(cmd_calls(f, "zrangebyscore") - z0, 1); /* the dead nodes only */
    pv_node_update u = {.name = "n2", .resources = "{\"cpumem\":{\"cpu\":2,\"memory\":\"5G\"}}"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, NULL, &st), PV_OK);
    assert_int_equal(cached_total(f, cache), 9);
    assert_int_equal(cmd_calls(f, "zrangebyscore") - z0, 3);
    sched_cache_free(cache);
}

static int view_pod(fixture *f, sched_cache *cache, const char *pod, size_t *n) {
    sched_cache_entry **e = NULL;
    pv_status st;
    int rc = sched_cache_view(cache, f->r, &f->keys, pod, &e, n, &st);
    free(e);
    return rc;
}

/* Requests read together share one view (sched_cache_batch): the batch's first view follows
 * the change index, the others do not ask again (one pv_sched_changes call, seen by its one
 * dead-node range read), until the cache is told it is behind or the batch ends. A plan of the
 * batch over a node another writer moved meanwhile is refused by the commit's compare-and-set
 * and planned again on a fresh view: it succeeds, and the node's usage is exact. */
static void test_cache_batch_shares_one_view(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    size_t n = 0;
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK); /* the cold read */
    sched_cache_batch(cache, true);
    long long z0 = cmd_calls(f, "zrangebyscore");
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(n, 3);
    assert_int_equal(cmd_calls(f, "zrangebyscore") - z0, 1);
    sched_cache_behind(cache);
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(cmd_calls(f, "zrangebyscore") - z0, 2);
    sched_cache_batch(cache, false);
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(cmd_calls(f, "zrangebyscore") - z0, 4);

    sched_cache_batch(cache, true);
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    /* another scheduler (its own cache) reserves on every node of the pod: this batch's view
     * does not know; its own plan is refused, then made again on a fresh view */
    const char *bodies[] = {"{\"pod\":\"p1\",\"count\":3,\"app\":\"web\",\"entrypoint\":"
                            "\"main\",\"resources\":{\"cpumem\":{\"memory-request\":\"1G\"}}}",
                            "{\"pod\":\"p1\",\"count\":1,\"app\":\"web\",\"entrypoint\":"
                            "\"main\",\"resources\":{\"cpumem\":{\"memory-request\":\"1G\"}}}"};
    for (int i = 0; i < 2; i++) {
        sched_request req;
        request(&req, "%s", bodies[i]);
        sched_error err = {0};
        char *reply = NULL;
        assert_int_equal(sched_place_reserve(i ? cache : NULL, f->r, &f->keys, &req,
                                             i ? "plan-BAT2" : "plan-BAT1", 1, &reply, &err),
                         PV_OK);
        free(reply);
        sched_request_free(&req);
    }
    sched_cache_batch(cache, false);
    const char *names[] = {"n1", "n2", "n3"};
    for (int i = 0; i < 3; i++) {
        pv_resv_check c;
        pv_status st;
        assert_int_equal(pv_resv_check_node(f->r, &f->keys, names[i], 0, &c, &st), PV_OK);
        assert_int_equal(c.ndiffs, 0);
        pv_resv_check_clear(&c);
    }
    assert_int_equal(cached_total(f, cache), 6 - 4); /* the four 1G reserved */
    sched_cache_free(cache);
}

/* A pod the last view held a node of is not read again while no node changed; a pod without
 * nodes is read every time, so its removal is seen at once, and so is a pod emptied and
 * removed after a view that skipped its read. */
static void test_cache_unmoved_index_skips_pod_read(void **state) {
    fixture *f = *state;
    sched_cache *cache = sched_cache_new();
    pv_status st;
    pv_pod p;
    pv_pod_spec ps = {.name = "p2"};
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &ps, &p, &st), PV_OK);
    pv_pod_clear(&p);
    size_t n = 0;
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(n, 3);
    long long h0 = cmd_calls(f, "hexists");
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_OK);
    assert_int_equal(cmd_calls(f, "hexists"), h0);
    assert_int_equal(view_pod(f, cache, "p2", &n), PV_OK);
    assert_int_equal(n, 0);
    assert_int_equal(cmd_calls(f, "hexists"), h0 + 1);
    assert_int_equal(pv_registry_remove_pod(f->r, &f->keys, "p2", &st), PV_OK);
    assert_int_equal(view_pod(f, cache, "p2", &n), PV_NOT_FOUND);
    const char *names[] = {"n1", "n2", "n3"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(pv_registry_remove_node(f->r, &f->keys, names[i], &st), PV_OK);
    assert_int_equal(pv_registry_remove_pod(f->r, &f->keys, "p1", &st), PV_OK);
    assert_int_equal(view_pod(f, cache, "p1", &n), PV_NOT_FOUND);
    sched_cache_free(cache);
}

static void test_sched_call_without_scheduler(void **state) {
    fixture *f = *state;
    pv_sched_call_opts o = {.timeout_ms = 200, .request_id = "plan-none"};
    char *reply = NULL;
    pv_status st;
    assert_int_equal(pv_sched_call(f->r, &f->keys, "capacity", "{}", &o, &reply, &st),
                     PV_UNAVAILABLE);
    assert_non_null(strstr(st.msg, "no scheduler"));
    assert_null(reply);
    /* the request is gone from the stream and marked abandoned: nobody commits it later */
    redisReply *rep = redisCommand(f->c, "XLEN " BASE "sched:requests");
    assert_int_equal(rep->integer, 0);
    freeReplyObject(rep);
    rep = redisCommand(f->c, "EXISTS " BASE "sched:gone:plan-none");
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
}

/* A reply that comes within the first wait is taken without asking whether a scheduler is
 * registered (here none is, and the answer is there already). */
static void test_sched_call_quick_reply_asks_no_presence(void **state) {
    fixture *f = *state;
    redisReply *rep = redisCommand(f->c, "RPUSH " BASE "sched:reply:plan-quick {\"ok\":1}");
    freeReplyObject(rep);
    long long fcalls = cmd_calls(f, "fcall");
    pv_sched_call_opts o = {.timeout_ms = 2000, .request_id = "plan-quick"};
    char *reply = NULL;
    pv_status st;
    assert_int_equal(pv_sched_call(f->r, &f->keys, "capacity", "{}", &o, &reply, &st), PV_OK);
    assert_string_equal(reply, "{\"ok\":1}");
    free(reply);
    assert_int_equal(cmd_calls(f, "fcall"), fcalls); /* no pv_presence_live */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_capacity_dummy_and_plans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_capacity_errors, setup, teardown),
        cmocka_unit_test(test_capacity_lines),
        cmocka_unit_test_setup_teardown(test_reserve_and_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reserve_not_enough, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_request_reserves_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replies_not_kept_across_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_orphaned_reservations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abandoned_request_reserves_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expired_reservations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_and_fix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_reservations_never_overcommit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_cache_follows_every_change, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_reads_only_what_changed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_reads_usage_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multi_node_commit_counts_and_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_sees_liveness_expire, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_index_rebuilt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_counts_follow_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_after_own_commit_matches_redis, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_after_partial_deploy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_instance_ends_reservation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_acknowledges_the_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_returns_all_succeed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batched_return_and_retry, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batched_return_of_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_answers_by_what_it_was_asked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_unmoved_index_skips_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_unmoved_index_skips_pod_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_batch_shares_one_view, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sched_call_without_scheduler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sched_call_quick_reply_asks_no_presence, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
