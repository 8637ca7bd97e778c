/*
 * Workload records and statuses on a real Redis (pv_workload + the pv_wl_* functions of
 * workload.lua): records with their indexes and the allocation they take over, listings with
 * every filter, statuses with their TTLs (set, kept, none, expired), SetWorkloadsStatus's
 * all-or-nothing batch, marking a node's workloads down, the pages and views a status watcher
 * reads, and the keyspace notifications of status keys under the pattern the watcher uses. The
 * state is checked as Redis holds it, through a plain hiredis connection.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_resv.h"
#include "pv_test_redis.h"
#include "pv_workload.h"

#define BASE "t:{reg}:"

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    redisContext *c;
    pv_node node_a, node_b; /* in pod "web" */
} fixture;

static void add_node(fixture *f, const char *name, pv_node *out) {
    pv_status st;
    pv_node_spec s = {.name = name,
                      .pod_name = "web",
                      .endpoint = "process://",
                      .resources = "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}"};
    if (pv_registry_add_node(f->r, &f->keys, &s, out, &st) != PV_OK)
        fail_msg("add_node %s: %s", name, st.msg);
}

/* A fresh Redis with pod "web" and its nodes na and nb: the handle under test (f->r) and a
 * plain connection to look at what it wrote (f->c). */
static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    pv_status st;
    if (!f || pv_test_redis_start(&f->srv, NULL) != 0 || pv_keys_init(&f->keys, "t:", &st) != PV_OK)
        return -1;
    if (!(f->r = pv_test_redis_client(f->srv, 5000)) || !(f->c = pv_test_redis_connect(f->srv)))
        return -1;
    pv_pod_spec spec = {.name = "web"};
    pv_pod pod;
    if (pv_registry_add_pod(f->r, &f->keys, &spec, &pod, &st) != PV_OK) return -1;
    pv_pod_clear(&pod);
    add_node(f, "na", &f->node_a);
    add_node(f, "nb", &f->node_b);
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    pv_node_clear(&f->node_b);
    pv_node_clear(&f->node_a);
    if (f->c) redisFree(f->c);
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

/* One command on the plain connection; the reply is the caller's. */
static redisReply *cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    void *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    if (!rep) fail_msg("redis: %s", f->c->errstr);
    return rep;
}

/* The same for commands answering an integer. */
static long long int_cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    if (!rep || rep->type != REDIS_REPLY_INTEGER) fail_msg("%s: not an integer reply", fmt);
    long long n = rep->integer;
    freeReplyObject(rep);
    return n;
}

/* A field of a hash as Redis holds it. */
static void assert_field(fixture *f, const char *key, const char *field, const char *want) {
    redisReply *rep = cmd(f, "HGET %s %s", key, field);
    bool same = rep->type == REDIS_REPLY_STRING && strcmp(rep->str, want) == 0;
    if (!same) fail_msg("%s %s: %s, want %s", key, field, rep->str ? rep->str : "(nil)", want);
    freeReplyObject(rep);
}

/* A workload of app/entry on node with id "<app>-<entry>-<n>" and labels. */
static void add_wl(fixture *f, const char *app, const char *entry, const char *node, int n,
                   const char *labels, char id[PV_WORKLOAD_ID_LEN + 1]) {
    snprintf(id, PV_WORKLOAD_ID_LEN + 1, "%s-%s-%d", app, entry, n);
    char name[128];
    snprintf(name, sizeof name, "%s_%s_abcdef", app, entry);
    pv_workload w = {.name = name,
                     .app = (char *)app,
                     .entry = (char *)entry,
                     .node = (char *)node,
                     .image = "img:1",
                     .labels = (char *)labels};
    memcpy(w.id, id, strlen(id) + 1);
    pv_status st;
    if (pv_workload_add(f->r, &f->keys, &w, &st) != PV_OK) fail_msg("add %s: %s", id, st.msg);
}

static pv_workload_status status_of(const char *id, bool running, bool healthy, int64_t ttl) {
    pv_workload_status s = {.running = running, .healthy = healthy, .ttl = ttl};
    snprintf(s.id, sizeof s.id, "%s", id);
    return s;
}

static void set_status(fixture *f, const char *id, bool running, int64_t ttl) {
    pv_workload_status s = status_of(id, running, running, ttl);
    pv_status st;
    if (pv_workload_set_status(f->r, &f->keys, &s, NULL, &st) != PV_OK)
        fail_msg("set status %s: %s", id, st.msg);
}

/* ---- records ---- */

static void test_new_id(void **state) {
    (void)state;
    char a[PV_WORKLOAD_ID_LEN + 1], b[PV_WORKLOAD_ID_LEN + 1];
    pv_status st;
    assert_int_equal(pv_workload_new_id(a, &st), PV_OK);
    assert_int_equal(pv_workload_new_id(b, &st), PV_OK);
    assert_int_equal(strlen(a), 64);
    assert_int_equal(strspn(a, "0123456789abcdef"), 64);
    assert_string_not_equal(a, b);
    assert_int_equal(pv_workload_check_id("id", a, &st), PV_OK);
}

static void test_add_get_remove(void **state) {
    fixture *f = *state;
    pv_status st;
    char id[PV_WORKLOAD_ID_LEN + 1];
    assert_int_equal(pv_workload_new_id(id, &st), PV_OK);
    pv_workload w = {.name = "app_web_qwerty",
                     .app = "app",
                     .entry = "web",
                     .node = "na",
                     .image = "busybox",
                     .privileged = true,
                     .labels = "{\"tier\":\"front\"}",
                     .env = "[\"A=1\"]",
                     .publish = "{\"net\":\"10.0.0.1:80\"}",
                     .resources = "{\"cpumem\":{\"memory\":1024}}",
                     .engine_id = "4242"};
    memcpy(w.id, id, sizeof w.id);
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_OK);

    pv_workload got;
    assert_int_equal(pv_workload_get(f->r, &f->keys, id, &got, &st), PV_OK);
    assert_string_equal(got.id, id);
    assert_string_equal(got.name, "app_web_qwerty");
    assert_string_equal(got.app, "app");
    assert_string_equal(got.entry, "web");
    assert_string_equal(got.pod, "web"); /* the node's pod */
    assert_string_equal(got.node, "na");
    assert_string_equal(got.node_id, f->node_a.id);
    assert_string_equal(got.image, "busybox");
    assert_true(got.privileged);
    assert_string_equal(got.labels, "{\"tier\":\"front\"}");
    assert_string_equal(got.env, "[\"A=1\"]");
    assert_string_equal(got.publish, "{\"net\":\"10.0.0.1:80\"}");
    assert_string_equal(got.resources, "{\"cpumem\":{\"memory\":1024}}");
    assert_string_equal(got.alloc_id, "");
    assert_string_equal(got.engine_id, "4242");
    assert_true(got.created_ms > 1600000000000LL);
    pv_workload_clear(&got);

    /* The indexes, as the registry sees them: RemoveNode refuses while the node hosts it. */
    char key[PV_KEY_MAX];
    snprintf(key, sizeof key, BASE "node-workloads:%s", f->node_a.id);
    assert_int_equal(int_cmd(f, "SISMEMBER %s %s", key, id), 1);
    assert_int_equal(int_cmd(f, "SISMEMBER " BASE "app-workloads:app %s", id), 1);
    assert_int_equal(int_cmd(f, "ZRANK " BASE "wls %s", id), 0);
    pv_node n;
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "na", &n, &st), PV_OK);
    assert_int_equal(n.workloads, 1);
    pv_node_clear(&n);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "na", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "still hosts 1 workload"));

    /* Taken ids, unknown nodes, a pod that is not the node's. */
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_ALREADY_EXISTS);
    assert_non_null(strstr(st.msg, id));
    w.id[0] = w.id[0] == 'a' ? 'b' : 'a';
    w.node = "nope";
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "node nope not found");
    w.node = "na";
    w.pod = "other";
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "pod: node na is in pod web, not other"));
    assert_int_equal(int_cmd(f, "ZCARD " BASE "wls"), 1);

    /* Remove: the record, its status and every index entry; NOT_FOUND the second time. */
    set_status(f, id, true, 0);
    assert_int_equal(pv_workload_remove(f->r, &f->keys, id, &st), PV_OK);
    snprintf(key, sizeof key, BASE "wl:%s", id);
    assert_int_equal(int_cmd(f, "EXISTS %s " BASE "wl-status:%s", key, id), 0);
    assert_int_equal(int_cmd(f, "ZCARD " BASE "wls"), 0);
    assert_int_equal(int_cmd(f, "SCARD " BASE "app-workloads:app"), 0);
    snprintf(key, sizeof key, BASE "node-workloads:%s", f->node_a.id);
    assert_int_equal(int_cmd(f, "SCARD %s", key), 0);
    assert_int_equal(pv_workload_remove(f->r, &f->keys, id, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg + strlen(st.msg) - strlen(" not found"), " not found");
    assert_int_equal(pv_workload_get(f->r, &f->keys, id, &got, &st), PV_NOT_FOUND);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "na", &st), PV_OK);
}

static void test_add_bad_input(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_workload w = {.id = "abc", .name = "a_b_c", .app = "a", .entry = "b", .node = "na"};
    const struct {
        const char *field;
        const char *value;
        const char *want;
    } cases[] = {
        {"id", "", "id: field is required"},
        {"id", "a/b", "id: \"a/b\" may only hold"},
        {"id", "0123456789012345678901234567890123456789012345678901234567890123456789",
         "is longer than 64"},
        {"labels", "{\"a\":1}", "labels[a]: value must be a string"},
        {"env", "{}", "env: not a JSON array of strings"},
        {"env", "[1]", "env: not a JSON array of strings"},
        {"publish", "[]", "publish: not a JSON object"},
        {"app", "a/b", "app"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pv_workload c = w;
        if (strcmp(cases[i].field, "id") == 0) snprintf(c.id, sizeof c.id, "%.64s", cases[i].value);
        if (strcmp(cases[i].field, "id") == 0 && strlen(cases[i].value) > 64) {
            /* Too long for the record: checked where ids come in as strings. */
            assert_int_equal(pv_workload_check_id("id", cases[i].value, &st), PV_INVALID_ARGUMENT);
            assert_non_null(strstr(st.msg, cases[i].want));
            continue;
        }
        if (strcmp(cases[i].field, "labels") == 0) c.labels = (char *)cases[i].value;
        if (strcmp(cases[i].field, "env") == 0) c.env = (char *)cases[i].value;
        if (strcmp(cases[i].field, "publish") == 0) c.publish = (char *)cases[i].value;
        if (strcmp(cases[i].field, "app") == 0) c.app = (char *)cases[i].value;
        assert_int_equal(pv_workload_add(f->r, &f->keys, &c, &st), PV_INVALID_ARGUMENT);
        if (!strstr(st.msg, cases[i].want)) fail_msg("case %zu: %s", i, st.msg);
    }
    assert_int_equal(int_cmd(f, "EXISTS " BASE "wls"), 0);
}

static void test_add_takes_over_allocation(void **state) {
    fixture *f = *state;
    pv_status st;
    char allocs[PV_KEY_MAX];
    snprintf(allocs, sizeof allocs, BASE "node-allocs:%s", f->node_b.id);
    const char *alloc = "{\"cpumem\":{\"memory\":536870912}}";
    freeReplyObject(cmd(f, "HSET %s resv-1.0 %s", allocs, alloc));
    freeReplyObject(cmd(f, "HSET %s resv-1.1 %s", allocs, alloc));

    pv_workload w = {.id = "w1",
                     .name = "a_b_xyzxyz",
                     .app = "a",
                     .entry = "b",
                     .node = "nb",
                     .alloc_id = "resv-1.0"};
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_OK);
    assert_int_equal(int_cmd(f, "HEXISTS %s resv-1.0", allocs), 0);
    assert_int_equal(int_cmd(f, "HEXISTS %s resv-1.1", allocs), 1);
    assert_field(f, BASE "wl:w1", "resources", alloc); /* none given: the allocation's */
    assert_field(f, BASE "wl:w1", "alloc_id", "resv-1.0");

    /* An allocation already handed over (or released) cannot be taken: nothing is written. */
    snprintf(w.id, sizeof w.id, "w2");
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "allocation resv-1.0 is not reserved on node nb"));
    assert_int_equal(int_cmd(f, "EXISTS " BASE "wl:w2"), 0);
    assert_int_equal(int_cmd(f, "ZCARD " BASE "wls"), 1);

    /* Given resources win over the allocation's copy. */
    w.alloc_id = "resv-1.1";
    w.resources = "{\"cpumem\":{\"memory\":1}}";
    assert_int_equal(pv_workload_add(f->r, &f->keys, &w, &st), PV_OK);
    assert_field(f, BASE "wl:w2", "resources", "{\"cpumem\":{\"memory\":1}}");
    assert_int_equal(int_cmd(f, "HLEN %s", allocs), 0);
}

static void assert_ids(pv_workload *v, size_t n, const char *const *want, size_t nwant) {
    if (n != nwant) fail_msg("got %zu workloads, want %zu", n, nwant);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(v[i].id, want[i]);
}

static void test_list_filters(void **state) {
    fixture *f = *state;
    pv_status st;
    char id[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "nb", 2, "{\"zone\":\"x\"}", id);
    add_wl(f, "api", "web", "na", 1, "{\"zone\":\"y\"}", id);
    add_wl(f, "api", "cron", "na", 3, "{\"zone\":\"x\",\"k\":\"v\"}", id);
    add_wl(f, "db", "main", "nb", 4, NULL, id);
    pv_workload *v = NULL;
    size_t n = 0;

    assert_int_equal(pv_workload_list(f->r, &f->keys, NULL, NULL, NULL, NULL, &v, &n, &st), PV_OK);
    const char *all[] = {"api-cron-3", "api-web-1", "api-web-2", "db-main-4"};
    assert_ids(v, n, all, 4);
    assert_string_equal(v[3].labels, "{}");
    pv_workload_array_free(v, n);

    assert_int_equal(pv_workload_list(f->r, &f->keys, "api", "web", "", "{}", &v, &n, &st), PV_OK);
    const char *web[] = {"api-web-1", "api-web-2"};
    assert_ids(v, n, web, 2);
    pv_workload_array_free(v, n);

    assert_int_equal(pv_workload_list(f->r, &f->keys, "", "", "na", NULL, &v, &n, &st), PV_OK);
    const char *on_a[] = {"api-cron-3", "api-web-1"};
    assert_ids(v, n, on_a, 2);
    pv_workload_array_free(v, n);

    assert_int_equal(
        pv_workload_list(f->r, &f->keys, "api", "", "", "{\"zone\":\"x\"}", &v, &n, &st), PV_OK);
    const char *zx[] = {"api-cron-3", "api-web-2"};
    assert_ids(v, n, zx, 2);
    pv_workload_array_free(v, n);

    assert_int_equal(
        pv_workload_list(f->r, &f->keys, "", "", "", "{\"zone\":\"x\",\"k\":\"v\"}", &v, &n, &st),
        PV_OK);
    const char *kv[] = {"api-cron-3"};
    assert_ids(v, n, kv, 1);
    pv_workload_array_free(v, n);

    assert_int_equal(pv_workload_list(f->r, &f->keys, "nope", "", "", NULL, &v, &n, &st), PV_OK);
    assert_null(v);
    assert_int_equal(n, 0);
    assert_int_equal(pv_workload_list(f->r, &f->keys, "", "", "ghost", NULL, &v, &n, &st), PV_OK);
    assert_int_equal(n, 0);
    assert_int_equal(pv_workload_list(f->r, &f->keys, "", "", "", "[]", &v, &n, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "labels"));
}

/* ---- statuses ---- */

static void test_status_set_get_ttl(void **state) {
    fixture *f = *state;
    pv_status st;
    char a[PV_WORKLOAD_ID_LEN + 1], b[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "na", 1, NULL, a);
    add_wl(f, "api", "web", "nb", 2, NULL, b);

    /* Not set yet: NOT_FOUND naming the id; an unknown workload reads the same. */
    pv_workload_status got;
    assert_int_equal(pv_workload_get_status(f->r, &f->keys, a, &got, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "status of workload api-web-1 not found");
    assert_int_equal(pv_workload_get_status(f->r, &f->keys, "zzz", &got, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "status of workload zzz not found");

    static const unsigned char ext[] = {0, 1, 2, 0xff, 'x'};
    pv_workload_status in[2] = {status_of(a, true, false, 30), status_of(b, false, true, 0)};
    in[0].networks = "{\"calico\":\"10.1.0.5\",\"host\":\"192.168.0.2\"}";
    in[0].extension = (unsigned char *)ext;
    in[0].extension_len = sizeof ext;
    pv_workload_status out[2];
    assert_int_equal(pv_workload_set_statuses(f->r, &f->keys, in, 2, out, &st), PV_OK);
    assert_string_equal(out[0].id, a);
    assert_true(out[0].running);
    assert_false(out[0].healthy);
    assert_int_equal(out[0].ttl, 30);
    assert_string_equal(out[0].app, "api");
    assert_string_equal(out[0].entry, "web");
    assert_string_equal(out[0].node, "na");
    assert_string_equal(out[1].node, "nb");
    assert_true(out[0].updated_ms > 1600000000000LL);
    pv_workload_status_clear(&out[0]);
    pv_workload_status_clear(&out[1]);

    /* As Redis holds them: a's key expires within its TTL, b's never. */
    long long ttl = int_cmd(f, "TTL " BASE "wl-status:%s", a);
    assert_true(ttl > 25 && ttl <= 30);
    assert_int_equal(int_cmd(f, "TTL " BASE "wl-status:%s", b), -1);

    assert_int_equal(pv_workload_get_status(f->r, &f->keys, a, &got, &st), PV_OK);
    assert_true(got.running);
    assert_false(got.healthy);
    assert_int_equal(got.ttl, 30);
    assert_string_equal(got.networks, "{\"calico\":\"10.1.0.5\",\"host\":\"192.168.0.2\"}");
    assert_int_equal(got.extension_len, sizeof ext);
    assert_memory_equal(got.extension, ext, sizeof ext);
    assert_string_equal(got.app, "api");
    assert_string_equal(got.node, "na");
    pv_workload_status_clear(&got);
    assert_int_equal(pv_workload_get_status(f->r, &f->keys, b, &got, &st), PV_OK);
    assert_string_equal(got.networks, "{}");
    assert_null(got.extension);
    assert_int_equal(got.extension_len, 0);
    pv_workload_status_clear(&got);

    /* Setting again with ttl 0 drops the expiry. */
    set_status(f, a, false, 0);
    assert_int_equal(int_cmd(f, "TTL " BASE "wl-status:%s", a), -1);

    /* Expiry: the status is gone, the workload stays. */
    set_status(f, b, true, 5);
    freeReplyObject(cmd(f, "PEXPIRE " BASE "wl-status:%s 30", b));
    usleep(150 * 1000);
    assert_int_equal(pv_workload_get_status(f->r, &f->keys, b, &got, &st), PV_NOT_FOUND);
    pv_workload w;
    assert_int_equal(pv_workload_get(f->r, &f->keys, b, &w, &st), PV_OK);
    pv_workload_clear(&w);
}

static void test_status_batch_all_or_nothing(void **state) {
    fixture *f = *state;
    pv_status st;
    char a[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "na", 1, NULL, a);
    pv_workload_status out[3];

    /* One unknown id: the call fails naming it and nothing is written, a's status included. */
    pv_workload_status in[3] = {status_of(a, true, true, 0), status_of("ghost", true, true, 0),
                                status_of(a, true, true, 0)};
    assert_int_equal(pv_workload_set_statuses(f->r, &f->keys, in, 3, out, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "workload ghost not found");
    assert_int_equal(int_cmd(f, "EXISTS " BASE "wl-status:%s", a), 0);

    /* Bad entries are refused before Redis: negative TTL, networks that are not strings, ids. */
    in[1] = status_of(a, true, true, -1);
    assert_int_equal(pv_workload_set_statuses(f->r, &f->keys, in, 2, out, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "ttl: -1"));
    in[1] = status_of(a, true, true, 0);
    in[1].networks = "{\"n\":1}";
    assert_int_equal(pv_workload_set_statuses(f->r, &f->keys, in, 2, out, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "networks[n]"));
    in[1] = status_of("a b", true, true, 0);
    assert_int_equal(pv_workload_set_statuses(f->r, &f->keys, in, 2, NULL, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "id: \"a b\""));
    assert_int_equal(int_cmd(f, "EXISTS " BASE "wl-status:%s", a), 0);

    /* Nothing to set is a success. */
    assert_int_equal(pv_workload_set_statuses(f->r, &f->keys, in, 0, out, &st), PV_OK);
}

static void assert_status_flags(fixture *f, const char *id, bool running, bool healthy) {
    pv_workload_status got;
    pv_status st;
    if (pv_workload_get_status(f->r, &f->keys, id, &got, &st) != PV_OK)
        fail_msg("status of %s: %s", id, st.msg);
    assert_int_equal(got.running, running);
    assert_int_equal(got.healthy, healthy);
    pv_workload_status_clear(&got);
}

static void test_mark_node_down(void **state) {
    fixture *f = *state;
    pv_status st;
    char a1[PV_WORKLOAD_ID_LEN + 1], a2[PV_WORKLOAD_ID_LEN + 1], b1[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "na", 1, NULL, a1);
    add_wl(f, "api", "web", "na", 2, NULL, a2);
    add_wl(f, "api", "web", "nb", 3, NULL, b1);
    pv_workload_status s = status_of(a1, true, true, 60);
    s.networks = "{\"net\":\"10.0.0.9\"}";
    assert_int_equal(pv_workload_set_status(f->r, &f->keys, &s, NULL, &st), PV_OK);
    set_status(f, b1, true, 0);

    size_t count = 0;
    assert_int_equal(pv_workload_mark_node_down(f->r, &f->keys, "na", &count, &st), PV_OK);
    assert_int_equal(count, 2);
    /* a1 keeps its TTL and networks; a2 had no status and gets one without expiry. */
    assert_status_flags(f, a1, false, false);
    long long ttl = int_cmd(f, "TTL " BASE "wl-status:%s", a1);
    assert_true(ttl > 50 && ttl <= 60);
    pv_workload_status got;
    assert_int_equal(pv_workload_get_status(f->r, &f->keys, a1, &got, &st), PV_OK);
    assert_string_equal(got.networks, "{\"net\":\"10.0.0.9\"}");
    assert_int_equal(got.ttl, 60);
    pv_workload_status_clear(&got);
    assert_status_flags(f, a2, false, false);
    assert_int_equal(int_cmd(f, "TTL " BASE "wl-status:%s", a2), -1);
    /* Other nodes' workloads are left alone. */
    assert_status_flags(f, b1, true, true);

    assert_int_equal(pv_workload_mark_node_down(f->r, &f->keys, "ghost", &count, &st),
                     PV_NOT_FOUND);
    assert_string_equal(st.msg, "node ghost not found");
    pv_node_spec empty = {.name = "nc", .pod_name = "web", .endpoint = "process://"};
    pv_node nc;
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &empty, &nc, &st), PV_OK);
    pv_node_clear(&nc);
    assert_int_equal(pv_workload_mark_node_down(f->r, &f->keys, "nc", &count, &st), PV_OK);
    assert_int_equal(count, 0);
}

/* The self-monitor's pass: only nodes whose alive key is gone, only workloads not marked down
 * yet, so a second pass changes nothing. Without the schedulers' change index (every node's
 * alive key asked) and, indexed, from its liveness set. */
static void mark_dead_nodes_pass(void **state, bool indexed) {
    fixture *f = *state;
    pv_status st;
    if (indexed) {
        redisReply *rep = cmd(f, "FCALL pv_sched_index 1 " BASE "nodes " BASE " idx-t");
        assert_int_equal(rep->type, REDIS_REPLY_STRING);
        freeReplyObject(rep);
    }
    assert_int_equal(int_cmd(f, "HEXISTS " BASE "node-index epoch"), indexed ? 1 : 0);
    char a1[PV_WORKLOAD_ID_LEN + 1], a2[PV_WORKLOAD_ID_LEN + 1], b1[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "na", 1, NULL, a1);
    add_wl(f, "api", "web", "na", 2, NULL, a2);
    add_wl(f, "api", "web", "nb", 3, NULL, b1);
    set_status(f, a1, true, 0);
    set_status(f, b1, true, 0);
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "nb", 60, NULL, &st), PV_OK);
    size_t count = 99;
    assert_int_equal(pv_workload_mark_dead_nodes(f->r, &f->keys, &count, &st), PV_OK);
    assert_int_equal(count, 2); /* na has no agent: a1 marked, a2 gets a down status */
    assert_status_flags(f, a1, false, false);
    assert_status_flags(f, a2, false, false);
    assert_status_flags(f, b1, true, true); /* nb is alive */
    assert_int_equal(pv_workload_mark_dead_nodes(f->r, &f->keys, &count, &st), PV_OK);
    assert_int_equal(count, 0);
    /* nb's liveness ends: its workload follows on the next pass. */
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "nb", -1, NULL, &st), PV_OK);
    assert_int_equal(pv_workload_mark_dead_nodes(f->r, &f->keys, &count, &st), PV_OK);
    assert_int_equal(count, 1);
    assert_status_flags(f, b1, false, false);
}

static void test_mark_dead_nodes(void **state) {
    mark_dead_nodes_pass(state, false);
}

static void test_mark_dead_nodes_indexed(void **state) {
    mark_dead_nodes_pass(state, true);
}

/* The verdict on a node's instance while a failover places the next incarnation: the
 * replacement it is making on another node, at the claimed epoch, is PLACING (its status
 * reports are refused, but it is not stale: an agent that removed it as MOVED lost the new
 * incarnation before the record could move to it); the lost node's old instance is MOVED.
 * Once the claim is undone the lost node's instance is OWN again and the half-made one MOVED. */
static void verdict_is(fixture *f, const char *id, const char *node, int64_t epoch,
                       pv_incarnation want, int64_t want_epoch) {
    pv_incarnation v;
    int64_t at = -1;
    pv_status st;
    if (pv_workload_ha_check(f->r, &f->keys, id, node, epoch, &v, &at, &st) != PV_OK)
        fail_msg("ha_check %s on %s: %s", id, node, st.msg);
    if (v != want || at != want_epoch)
        fail_msg("%s on %s at epoch %lld: verdict %d (record epoch %lld), want %d (%lld)", id, node,
                 (long long)epoch, (int)v, (long long)at, (int)want, (long long)want_epoch);
}

static void test_ha_check_while_placing(void **state) {
    fixture *f = *state;
    pv_status st;
    char a1[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "na", 1, "{\"pivirt.io/ha\":\"restart\"}", a1);
    verdict_is(f, a1, "na", 1, PV_INC_OWN, 1);
    verdict_is(f, a1, "nb", 1, PV_INC_MOVED, 1);
    verdict_is(f, "api-web-none", "na", 1, PV_INC_GONE, 0);
    int64_t epoch = 0;
    assert_int_equal(pv_workload_ha_claim(f->r, &f->keys, a1, "na", "op-1", &epoch, &st), PV_OK);
    assert_int_equal(epoch, 2);
    verdict_is(f, a1, "na", 1, PV_INC_MOVED, 2);
    verdict_is(f, a1, "nb", 2, PV_INC_PLACING, 2); /* the replacement being made */
    verdict_is(f, a1, "nb", 1, PV_INC_MOVED, 2);
    /* its report is refused (not the record's yet), and says why */
    pv_workload_status s = status_of(a1, true, true, 10);
    s.reporter = "nb";
    s.epoch = 2;
    assert_int_equal(pv_workload_set_status(f->r, &f->keys, &s, NULL, &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "(PLACING)"));
    bool undone = false;
    assert_int_equal(pv_workload_ha_unclaim(f->r, &f->keys, a1, "op-1", &undone, &st), PV_OK);
    assert_true(undone);
    verdict_is(f, a1, "na", 1, PV_INC_OWN, 1);
    verdict_is(f, a1, "nb", 2, PV_INC_MOVED, 1);
    /* placed this time: once the record moved to nb, nb's instance is the workload's, the lost
     * node's is old whatever its epoch */
    assert_int_equal(pv_workload_ha_claim(f->r, &f->keys, a1, "na", "op-2", &epoch, &st), PV_OK);
    assert_int_equal(epoch, 2);
    verdict_is(f, a1, "nb", 2, PV_INC_PLACING, 2);
    assert_int_equal(
        pv_resv_reincarnate_workload(f->r, &f->keys, a1, "nb", 2, NULL, "e2", NULL, &st), PV_OK);
    verdict_is(f, a1, "nb", 2, PV_INC_OWN, 2);
    verdict_is(f, a1, "na", 1, PV_INC_MOVED, 2);
    verdict_is(f, a1, "na", 2, PV_INC_MOVED, 2);
}

static void test_watcher_reads(void **state) {
    fixture *f = *state;
    pv_status st;
    char ids[5][PV_WORKLOAD_ID_LEN + 1];
    for (int i = 0; i < 5; i++)
        add_wl(f, "api", i < 3 ? "web" : "cron", "na", i, i == 1 ? "{\"z\":\"q\"}" : NULL, ids[i]);
    set_status(f, ids[0], true, 0);
    set_status(f, ids[1], true, 0);
    set_status(f, ids[3], false, 0);
    set_status(f, ids[4], true, 0);

    /* Pages of 2 over 5 workloads in id order: cron-3 cron-4 | web-0 web-1 | web-2. */
    pv_workload_status_ref *v = NULL;
    size_t n = 0;
    char next[PV_WORKLOAD_ID_LEN + 1];
    assert_int_equal(pv_workload_status_page(f->r, &f->keys, "", 2, &v, &n, next, &st), PV_OK);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].id, "api-cron-3");
    assert_string_equal(v[1].id, "api-cron-4");
    assert_string_equal(v[0].entry, "cron");
    assert_string_equal(v[0].node, "na");
    assert_true(v[0].updated_ms > 1600000000000LL);
    assert_string_equal(next, "api-cron-4");
    pv_workload_status_refs_free(v, n);
    assert_int_equal(pv_workload_status_page(f->r, &f->keys, next, 2, &v, &n, next, &st), PV_OK);
    assert_int_equal(n, 2);
    assert_string_equal(v[1].id, "api-web-1");
    assert_string_equal(v[1].labels, "{\"z\":\"q\"}");
    pv_workload_status_refs_free(v, n);
    /* web-2 has no status: the page is empty and the last. */
    assert_int_equal(pv_workload_status_page(f->r, &f->keys, next, 2, &v, &n, next, &st), PV_OK);
    assert_int_equal(n, 0);
    assert_null(v);
    assert_string_equal(next, "");
    assert_int_equal(pv_workload_status_page(f->r, &f->keys, "", 0, &v, &n, next, &st),
                     PV_INVALID_ARGUMENT);

    /* A view: status and record together; after removal neither. */
    pv_workload_status s;
    pv_workload rec;
    bool has_status, has_record;
    assert_int_equal(
        pv_workload_status_view(f->r, &f->keys, ids[1], &s, &has_status, &rec, &has_record, &st),
        PV_OK);
    assert_true(has_status && has_record);
    assert_true(s.running);
    assert_string_equal(s.app, "api");
    assert_string_equal(rec.labels, "{\"z\":\"q\"}");
    pv_workload_status_clear(&s);
    pv_workload_clear(&rec);
    assert_int_equal(
        pv_workload_status_view(f->r, &f->keys, ids[2], &s, &has_status, &rec, &has_record, &st),
        PV_OK);
    assert_false(has_status);
    assert_true(has_record);
    pv_workload_clear(&rec);
    assert_int_equal(pv_workload_remove(f->r, &f->keys, ids[1], &st), PV_OK);
    assert_int_equal(
        pv_workload_status_view(f->r, &f->keys, ids[1], &s, &has_status, &rec, &has_record, &st),
        PV_OK);
    assert_false(has_status);
    assert_false(has_record);
}

/* Reads pubsub messages until one on channel arrives (or fails after 2 s); returns its event. */
static char *next_event(redisContext *sub, const char *channel) {
    struct timeval tv = {2, 0};
    redisSetTimeout(sub, tv);
    for (;;) {
        redisReply *rep = NULL;
        if (redisGetReply(sub, (void **)&rep) != REDIS_OK || !rep) fail_msg("no notification");
        bool mine = rep->type == REDIS_REPLY_ARRAY && rep->elements == 4 &&
                    strcmp(rep->element[0]->str, "pmessage") == 0 &&
                    strcmp(rep->element[2]->str, channel) == 0;
        char *event = mine ? strdup(rep->element[3]->str) : NULL;
        freeReplyObject(rep);
        if (event) return event;
    }
}

static void test_keys_and_notifications(void **state) {
    fixture *f = *state;
    pv_status st;
    char buf[PV_KEY_MAX * 2];
    assert_int_equal(pv_workload_status_key(&f->keys, "abc", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, BASE "wl-status:abc");
    assert_int_equal(pv_workload_status_prefix(&f->keys, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, BASE "wl-status:");
    assert_int_equal(pv_workload_status_key(&f->keys, "a*b", buf, sizeof buf, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(pv_workload_status_pattern(&f->keys, 3, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "__keyspace@3__:" BASE "wl-status:*");
    pv_keys odd;
    pv_keys_init(&odd, "x*[", &st);
    assert_int_equal(pv_workload_status_pattern(&odd, 0, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "__keyspace@0__:x\\*\\[{reg}:wl-status:*");
    char tiny[16];
    assert_int_equal(pv_workload_status_pattern(&f->keys, 0, tiny, sizeof tiny, &st),
                     PV_INVALID_ARGUMENT);

    /* The watcher's pattern sees a status set, its expiry and its deletion. */
    assert_int_equal(pv_registry_ensure_notify(f->r, NULL, &st), PV_OK);
    char id[PV_WORKLOAD_ID_LEN + 1];
    add_wl(f, "api", "web", "na", 1, NULL, id);
    redisContext *sub = pv_test_redis_connect(f->srv);
    assert_non_null(sub);
    assert_int_equal(pv_workload_status_pattern(&f->keys, 0, buf, sizeof buf, &st), PV_OK);
    redisReply *rep = redisCommand(sub, "PSUBSCRIBE %s", buf);
    assert_non_null(rep);
    freeReplyObject(rep);
    char channel[PV_KEY_MAX * 2];
    snprintf(channel, sizeof channel, "__keyspace@0__:" BASE "wl-status:%s", id);

    set_status(f, id, true, 0);
    char *ev = next_event(sub, channel);
    assert_string_equal(ev, "set");
    free(ev);
    freeReplyObject(cmd(f, "PEXPIRE " BASE "wl-status:%s 20", id));
    ev = next_event(sub, channel);
    assert_string_equal(ev, "expire");
    free(ev);
    ev = next_event(sub, channel);
    assert_string_equal(ev, "expired");
    free(ev);
    set_status(f, id, true, 0);
    free(next_event(sub, channel));
    assert_int_equal(pv_workload_remove(f->r, &f->keys, id, &st), PV_OK);
    ev = next_event(sub, channel);
    assert_string_equal(ev, "del");
    free(ev);
    redisFree(sub);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_id),
        cmocka_unit_test_setup_teardown(test_add_get_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_takes_over_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_filters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_set_get_ttl, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_batch_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mark_node_down, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mark_dead_nodes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mark_dead_nodes_indexed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ha_check_while_placing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watcher_reads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keys_and_notifications, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
