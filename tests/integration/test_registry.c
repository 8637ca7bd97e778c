/*
 * The registry of pods and nodes on a real Redis (pv_registry + the pv_reg_* functions of
 * registry.lua): every call's success and error paths, the records as Redis holds them (read
 * with a plain hiredis connection), liveness keys with their TTL and their expiry, the agents'
 * engine info reports, SetNode's usage_rev compare-and-set, and the keyspace-notification
 * settings the liveness watchers rely on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_test_redis.h"

#define BASE "t:{reg}:"

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    redisContext *c;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_keys_init(&f->keys, "t:", &st);
    if (!(f->r = pv_test_redis_client(f->srv, 5000))) return -1;
    f->c = pv_test_redis_connect(f->srv);
    if (!f->c) return -1;
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

static redisReply *cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    return rep;
}

static long long int_cmd(fixture *f, const char *fmt, ...) {
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

/* HGET as a string compared with want (NULL = the field is absent). */
static void assert_hget(fixture *f, const char *key, const char *field, const char *want) {
    redisReply *rep = cmd(f, "HGET %s %s", key, field);
    if (!want) {
        assert_int_equal(rep->type, REDIS_REPLY_NIL);
    } else {
        assert_int_equal(rep->type, REDIS_REPLY_STRING);
        assert_string_equal(rep->str, want);
    }
    freeReplyObject(rep);
}

static void add_pod(fixture *f, const char *name, pv_pod *out) {
    pv_status st;
    pv_pod_spec s = {.name = name, .desc = "the pod"};
    pv_pod p;
    int rc = pv_registry_add_pod(f->r, &f->keys, &s, out ? out : &p, &st);
    if (rc != PV_OK) fail_msg("add_pod %s: %s", name, st.msg);
    if (!out) pv_pod_clear(&p);
}

static void add_node(fixture *f, const char *name, const char *pod, pv_node *out) {
    pv_status st;
    pv_node_spec s = {.name = name,
                      .pod_name = pod,
                      .endpoint = "process://",
                      .labels = "{\"zone\":\"a\"}",
                      .resources = "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}"};
    pv_node n;
    int rc = pv_registry_add_node(f->r, &f->keys, &s, out ? out : &n, &st);
    if (rc != PV_OK) fail_msg("add_node %s: %s", name, st.msg);
    if (!out) pv_node_clear(&n);
}

/* ---- pods ---- */

static void test_pod_add_get_list_remove(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_pod p;
    add_pod(f, "web", &p);
    assert_string_equal(p.name, "web");
    assert_string_equal(p.desc, "the pod");
    assert_string_equal(p.labels, "{}");
    assert_int_equal(strncmp(p.id, "cluster-", 8), 0);
    assert_true(p.created_ms > 0);
    assert_int_equal(p.created_ms, p.updated_ms);
    assert_int_equal(p.n_nodes, 0);

    char key[PV_KEY_MAX];
    snprintf(key, sizeof key, BASE "pod:%s", p.id);
    assert_hget(f, key, "name", "web");
    assert_hget(f, BASE "pods", "web", p.id);

    pv_pod g;
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_NAME, "web", &g, &st), PV_OK);
    assert_string_equal(g.id, p.id);
    assert_string_equal(g.desc, "the pod");
    pv_pod_clear(&g);
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_ID, p.id, &g, &st), PV_OK);
    assert_string_equal(g.name, "web");
    pv_pod_clear(&g);

    add_pod(f, "alpha", NULL);
    add_pod(f, "zeta", NULL);
    pv_pod *pods;
    size_t n;
    assert_int_equal(pv_registry_list_pods(f->r, &f->keys, &pods, &n, &st), PV_OK);
    assert_int_equal(n, 3);
    assert_string_equal(pods[0].name, "alpha");
    assert_string_equal(pods[1].name, "web");
    assert_string_equal(pods[2].name, "zeta");
    pv_pod_array_free(pods, n);

    assert_int_equal(pv_registry_remove_pod(f->r, &f->keys, "web", &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS %s", key), 0);
    assert_int_equal(int_cmd(f, "HEXISTS " BASE "pods web"), 0);
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_NAME, "web", &g, &st),
                     PV_NOT_FOUND);
    assert_string_equal(st.msg, "pod web not found");
    pv_pod_clear(&p);
}

static void test_pod_errors(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_pod p;
    add_pod(f, "web", NULL);
    pv_pod_spec dup = {.name = "web"};
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &dup, &p, &st), PV_ALREADY_EXISTS);
    assert_string_equal(st.msg, "pod web already exists");

    pv_pod_spec bad = {.name = "a/b"};
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &bad, &p, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "name"));
    pv_pod_spec empty = {.name = ""};
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &empty, &p, &st), PV_INVALID_ARGUMENT);
    pv_pod_spec neg = {.name = "x", .cp_nodes = -1};
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &neg, &p, &st), PV_INVALID_ARGUMENT);
    pv_pod_spec labels = {.name = "x", .labels = "{\"a\":1}"};
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &labels, &p, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "labels[a]: value must be a string");
    assert_int_equal(int_cmd(f, "HLEN " BASE "pods"), 1);

    assert_int_equal(pv_registry_remove_pod(f->r, &f->keys, "nope", &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "pod nope not found");

    add_node(f, "n1", "web", NULL);
    add_node(f, "n2", "web", NULL);
    assert_int_equal(pv_registry_remove_pod(f->r, &f->keys, "web", &st), PV_FAILED_PRECONDITION);
    assert_string_equal(st.msg, "pod web still has 2 node(s): remove them first");
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_NAME, "web", &p, &st), PV_OK);
    assert_int_equal(p.n_nodes, 2);
    pv_pod_clear(&p);

    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n1", &st), PV_OK);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n2", &st), PV_OK);
    assert_int_equal(pv_registry_remove_pod(f->r, &f->keys, "web", &st), PV_OK);
}

/* ---- nodes ---- */

static void test_node_add_get_list(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_pod p;
    add_pod(f, "web", &p);
    pv_node n;
    add_node(f, "n2", "web", &n);
    assert_int_equal(strncmp(n.id, "node-", 5), 0);
    assert_string_equal(n.name, "n2");
    assert_string_equal(n.pod_name, "web");
    assert_string_equal(n.pod_id, p.id);
    assert_string_equal(n.role, "worker");
    assert_string_equal(n.endpoint, "process://");
    assert_string_equal(n.engine, "process");
    assert_string_equal(n.labels, "{\"zone\":\"a\"}");
    assert_string_equal(n.resources, "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}");
    assert_false(n.bypass);
    assert_false(n.alive);
    assert_true(pv_node_down(&n));
    assert_int_equal(n.workloads, 0);

    char key[PV_KEY_MAX];
    snprintf(key, sizeof key, BASE "node:%s", n.id);
    assert_hget(f, key, "engine", "process");
    assert_hget(f, BASE "nodes", "n2", n.id);
    assert_int_equal(int_cmd(f, "SISMEMBER " BASE "pod-nodes:%s %s", p.id, n.id), 1);

    pv_node_spec virt = {.name = "n1", .pod_name = "web", .endpoint = "virt://qemu:///system"};
    pv_node v;
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &virt, &v, &st), PV_OK);
    assert_string_equal(v.engine, "virt");
    assert_string_equal(v.resources, "{}");
    pv_node_clear(&v);
    pv_node_spec docker = {.name = "n3", .pod_name = "web", .endpoint = "tcp://10.0.0.3:2376"};
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &docker, &v, &st), PV_OK);
    assert_string_equal(v.engine, "docker");
    pv_node_clear(&v);

    pv_node g;
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n2", &g, &st), PV_OK);
    assert_string_equal(g.id, n.id);
    pv_node_clear(&g);
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_ID, n.id, &g, &st), PV_OK);
    assert_string_equal(g.name, "n2");
    pv_node_clear(&g);

    add_pod(f, "other", NULL);
    add_node(f, "m1", "other", NULL);
    pv_node *nodes;
    size_t count;
    assert_int_equal(pv_registry_list_nodes(f->r, &f->keys, "web", &nodes, &count, &st), PV_OK);
    assert_int_equal(count, 3);
    assert_string_equal(nodes[0].name, "n1");
    assert_string_equal(nodes[1].name, "n2");
    assert_string_equal(nodes[2].name, "n3");
    pv_node_array_free(nodes, count);
    assert_int_equal(pv_registry_list_nodes(f->r, &f->keys, "", &nodes, &count, &st), PV_OK);
    assert_int_equal(count, 4);
    assert_string_equal(nodes[0].name, "m1");
    pv_node_array_free(nodes, count);
    assert_int_equal(pv_registry_list_nodes(f->r, &f->keys, "nope", &nodes, &count, &st),
                     PV_NOT_FOUND);
    assert_null(nodes);
    pv_pod_clear(&p);
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_NAME, "web", &p, &st), PV_OK);
    assert_int_equal(p.n_nodes, 3);
    pv_pod_clear(&p);

    pv_node_clear(&n);
}

static void test_node_errors(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_node n;
    pv_node_spec s = {.name = "n1", .pod_name = "missing", .endpoint = "process://"};
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &s, &n, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "pod missing not found");
    add_pod(f, "web", NULL);
    add_node(f, "n1", "web", NULL);
    s.pod_name = "web";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &s, &n, &st), PV_ALREADY_EXISTS);
    assert_string_equal(st.msg, "node n1 already exists");

    pv_node_spec bad = {.name = "n2", .pod_name = "web", .endpoint = "http://x"};
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "http://x"));
    bad.endpoint = "virt://";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    bad.endpoint = "";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    bad.endpoint = "process://";
    bad.resources = "{\"cpumem\":4}";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "resources[cpumem]: the plugin's document must be a JSON object");
    bad.resources = "[1]";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    /* The plugins check their own documents (shared/core/pv_res). */
    bad.resources = "{\"gpu\":{}}";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "resources: unknown plugin \"gpu\" (known: cpumem, storage)");
    bad.resources = "{\"cpumem\":{\"cpu\":4,\"memory\":\"-1G\"}}";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(strncmp(st.msg, "resources: cpumem", 17), 0);
    assert_non_null(strstr(st.msg, "memory"));
    bad.resources = "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\",\"bogus\":1}}";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "bogus"));
    bad.resources = "{\"storage\":{\"storage\":\"1T\",\"volumes\":[\"/data0:1T\"]}}";
    bad.name = "n9";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_OK);
    pv_node_clear(&n);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n9", &st), PV_OK);
    bad.name = "n2";
    bad.resources = NULL;
    bad.role = "boss";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    bad.role = NULL;
    bad.name = "bad name";
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &bad, &n, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(int_cmd(f, "HLEN " BASE "nodes"), 1);

    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "nope", &n, &st),
                     PV_NOT_FOUND);
    assert_string_equal(st.msg, "node nope not found");
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "nope", &st), PV_NOT_FOUND);

    /* A node hosting workloads stays. */
    pv_node g;
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &g, &st), PV_OK);
    redisReply *rep = cmd(f, "SADD " BASE "node-workloads:%s w1 w2", g.id);
    freeReplyObject(rep);
    pv_node_clear(&g);
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &g, &st), PV_OK);
    assert_int_equal(g.workloads, 2);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n1", &st), PV_FAILED_PRECONDITION);
    assert_string_equal(st.msg, "node n1 still hosts 2 workload(s): remove them first");
    rep = cmd(f, "DEL " BASE "node-workloads:%s", g.id);
    freeReplyObject(rep);

    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n1", 100, NULL, &st), PV_OK);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n1", &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "alive:n1 " BASE "node:%s", g.id), 0);
    assert_int_equal(int_cmd(f, "HLEN " BASE "nodes"), 0);
    pv_pod p;
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_NAME, "web", &p, &st), PV_OK);
    assert_int_equal(p.n_nodes, 0);
    pv_pod_clear(&p);
    pv_node_clear(&g);
}

static void test_set_node(void **state) {
    fixture *f = *state;
    pv_status st;
    add_pod(f, "web", NULL);
    add_node(f, "n1", "web", NULL);
    pv_node n;

    pv_node_update u = {.name = "n1", .labels = "{\"disk\":\"ssd\"}", .labels_merge = true};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_non_null(strstr(n.labels, "\"zone\":\"a\""));
    assert_non_null(strstr(n.labels, "\"disk\":\"ssd\""));
    assert_false(n.bypass);
    pv_node_clear(&n);

    u = (pv_node_update){.name = "n1", .labels = "{\"only\":\"this\"}"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_string_equal(n.labels, "{\"only\":\"this\"}");
    pv_node_clear(&n);

    u = (pv_node_update){.name = "n1",
                         .endpoint = "virt://qemu:///system",
                         .resources = "{\"storage\":{\"storage\":\"1T\"}}",
                         .bypass = PV_TRI_TRUE};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_string_equal(n.endpoint, "virt://qemu:///system");
    assert_string_equal(n.engine, "virt");
    assert_string_equal(n.resources, "{\"storage\":{\"storage\":\"1T\"}}");
    assert_string_equal(n.labels, "{\"only\":\"this\"}");
    assert_true(n.bypass);
    assert_true(n.updated_ms >= n.created_ms);
    pv_node_clear(&n);

    u = (pv_node_update){.name = "n1", .bypass = PV_TRI_KEEP};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_true(n.bypass);
    pv_node_clear(&n);
    u.bypass = PV_TRI_FALSE;
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_false(n.bypass);
    pv_node_clear(&n);

    u = (pv_node_update){.name = "nope"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_NOT_FOUND);
    u = (pv_node_update){.name = "n1", .endpoint = "ftp://x"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_INVALID_ARGUMENT);
    u = (pv_node_update){.name = "n1", .labels = "not json"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_INVALID_ARGUMENT);
    u = (pv_node_update){.name = "n1", .bypass = (pv_tri)7};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_INVALID_ARGUMENT);
}

/* A node's engine TLS (Eru's ca, cert, key) is kept apart from its record: no reader of the
 * record sees it, SetNode replaces each one given, RemoveNode deletes it. */
static void test_node_tls(void **state) {
    fixture *f = *state;
    pv_status st;
    add_pod(f, "web", NULL);
    pv_node n;
    pv_node_spec s = {.name = "d1",
                      .pod_name = "web",
                      .endpoint = "tcp://10.0.0.9:2376",
                      .tls_ca = "CA1",
                      .tls_cert = "CERT1",
                      .tls_key = "KEY1"};
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &s, &n, &st), PV_OK);
    char id[PV_ID_MAX];
    snprintf(id, sizeof id, "%s", n.id);
    pv_node_clear(&n);
    /* not in the record */
    assert_int_equal(int_cmd(f, "HEXISTS " BASE "node:%s key", id), 0);
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "d1", &n, &st), PV_OK);
    assert_null(strstr(n.engine_info ? n.engine_info : "", "KEY1"));
    pv_node_clear(&n);
    char *ca = NULL, *cert = NULL, *key = NULL;
    assert_int_equal(pv_registry_get_node_tls(f->r, &f->keys, "d1", &ca, &cert, &key, &st), PV_OK);
    assert_string_equal(ca, "CA1");
    assert_string_equal(cert, "CERT1");
    assert_string_equal(key, "KEY1");
    free(ca), free(cert), free(key);
    /* SetNode: the CA alone */
    pv_node_update u = {.name = "d1", .tls_ca = "CA2"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, NULL, &st), PV_OK);
    assert_int_equal(pv_registry_get_node_tls(f->r, &f->keys, "d1", &ca, &cert, &key, &st), PV_OK);
    assert_string_equal(ca, "CA2");
    assert_string_equal(cert, "CERT1");
    assert_string_equal(key, "KEY1");
    free(ca), free(cert), free(key);
    /* a node without: empty; an unknown one: NOT_FOUND */
    add_node(f, "n2", "web", NULL);
    assert_int_equal(pv_registry_get_node_tls(f->r, &f->keys, "n2", &ca, &cert, &key, &st), PV_OK);
    assert_string_equal(ca, "");
    assert_string_equal(key, "");
    free(ca), free(cert), free(key);
    assert_int_equal(pv_registry_get_node_tls(f->r, &f->keys, "nope", &ca, &cert, &key, &st),
                     PV_NOT_FOUND);
    assert_null(key);
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "d1", &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "node-tls:%s", id), 0);
}

/* A reservation changes a node's usage the way the scheduler's commit does (sched.lua): usage
 * and usage_rev together. */
static void reserve(fixture *f, const char *id, const char *usage) {
    redisReply *rep = cmd(f, "HSET " BASE "node:%s usage %s", id, usage);
    freeReplyObject(rep);
    assert_int_equal(int_cmd(f, "HINCRBY " BASE "node:%s usage_rev 1", id) > 0, 1);
}

static void test_set_node_usage_rev(void **state) {
    fixture *f = *state;
    pv_status st;
    add_pod(f, "web", NULL);
    pv_node n;
    add_node(f, "n1", "web", &n);
    assert_int_equal(n.usage_rev, 0);
    assert_string_equal(n.usage, "{}");
    char key[PV_KEY_MAX], id[PV_ID_MAX];
    snprintf(key, sizeof key, BASE "node:%s", n.id);
    snprintf(id, sizeof id, "%s", n.id);
    const char *usage = "{\"cpumem\":{\"cpu_request\":1,\"memory_request\":1073741824}}";
    reserve(f, id, usage);
    pv_node_clear(&n);

    /* The writer read the node at rev 1: its write goes through, and only then. */
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &n, &st), PV_OK);
    assert_int_equal(n.usage_rev, 1);
    assert_string_equal(n.usage, usage);
    int64_t seen = n.usage_rev;
    pv_node_clear(&n);
    pv_node_update u = {.name = "n1",
                        .labels = "{\"disk\":\"ssd\"}",
                        .resources = "{\"cpumem\":{\"cpu\":8,\"memory\":\"16G\"}}",
                        .check_usage_rev = true,
                        .usage_rev = seen,
                        .bypass = PV_TRI_TRUE};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_string_equal(n.resources, "{\"cpumem\":{\"cpu\":8,\"memory\":\"16G\"}}");
    assert_int_equal(n.usage_rev, 1); /* SetNode never moves the revision itself */
    pv_node_clear(&n);

    /* A reservation lands between the read and the write: the stale write is refused whole
     * (resources, labels and bypass alike) and says why. */
    reserve(f, id, "{}");
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &n, &st), PV_OK);
    assert_int_equal(n.usage_rev, 2);
    pv_node_clear(&n);
    u = (pv_node_update){.name = "n1",
                         .labels = "{\"stale\":\"yes\"}",
                         .resources = "{\"cpumem\":{\"cpu\":1,\"memory\":\"1G\"}}",
                         .check_usage_rev = true,
                         .usage_rev = seen,
                         .bypass = PV_TRI_FALSE};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_ABORTED);
    assert_string_equal(st.msg, "node n1: usage changed while its resources were computed "
                                "(usage_rev 2, expected 1)");
    assert_hget(f, key, "resources", "{\"cpumem\":{\"cpu\":8,\"memory\":\"16G\"}}");
    assert_hget(f, key, "labels", "{\"disk\":\"ssd\"}");
    assert_hget(f, key, "bypass", "1");
    assert_hget(f, key, "usage_rev", "2");

    /* Re-read, retry: it goes through. */
    u.usage_rev = 2;
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_string_equal(n.resources, "{\"cpumem\":{\"cpu\":1,\"memory\":\"1G\"}}");
    assert_string_equal(n.labels, "{\"stale\":\"yes\"}");
    assert_false(n.bypass);
    pv_node_clear(&n);

    /* Without resources there is nothing to check against the usage. */
    u = (pv_node_update){
        .name = "n1", .check_usage_rev = true, .usage_rev = 99, .bypass = PV_TRI_TRUE};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_true(n.bypass);
    pv_node_clear(&n);
    /* Unconditional writes (check_usage_rev false) stay as they were. */
    u = (pv_node_update){.name = "n1", .resources = "{\"cpumem\":{\"cpu\":2,\"memory\":1}}"};
    assert_int_equal(pv_registry_set_node(f->r, &f->keys, &u, &n, &st), PV_OK);
    assert_string_equal(n.resources, "{\"cpumem\":{\"cpu\":2,\"memory\":1}}");
    pv_node_clear(&n);
}

/* ---- engine info ---- */

static void test_engine_info(void **state) {
    fixture *f = *state;
    pv_status st;
    const char *info = "{\"cpu_count\":6,\"hostname\":\"h\",\"kernel\":\"6.1.0\","
                       "\"mem_total\":8589934592,\"storage_total\":1099511627776,"
                       "\"type\":\"process\",\"version\":\"v1\"}";
    char *got = (char *)"untouched";
    assert_int_equal(pv_registry_get_engine_info(f->r, &f->keys, "n1", &got, &st), PV_NOT_FOUND);
    assert_null(got);
    assert_string_equal(st.msg, "no agent has reported engine info for node n1");

    /* Written before the node exists: the agent may start first. */
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n1", info, 60, &st), PV_OK);
    long long ttl = int_cmd(f, "TTL " BASE "engine-info:n1");
    assert_true(ttl > 50 && ttl <= 60);
    assert_int_equal(pv_registry_get_engine_info(f->r, &f->keys, "n1", &got, &st), PV_OK);
    assert_string_equal(got, info);
    pv_res_engine_info facts;
    assert_int_equal(pv_registry_engine_facts(got, &facts, &st), PV_OK);
    assert_int_equal(facts.cpu_count, 6);
    assert_int_equal(facts.mem_total, 8589934592LL);
    assert_int_equal(facts.storage_total, 1099511627776LL);
    free(got);
    assert_int_equal(
        pv_registry_engine_facts("{\"cpu_count\":-3,\"mem_total\":\"8G\"}", &facts, &st), PV_OK);
    assert_int_equal(facts.cpu_count, 0);
    assert_int_equal(facts.mem_total, 0);
    assert_int_equal(facts.storage_total, 0);
    assert_int_equal(pv_registry_engine_facts("[1]", &facts, &st), PV_INVALID_ARGUMENT);

    /* The node's readers carry the report; a node without one has "". */
    add_pod(f, "web", NULL);
    add_node(f, "n1", "web", NULL);
    add_node(f, "n2", "web", NULL);
    pv_node n;
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &n, &st), PV_OK);
    assert_string_equal(n.engine_info, info);
    pv_node_clear(&n);
    pv_node *nodes;
    size_t count;
    assert_int_equal(pv_registry_list_nodes(f->r, &f->keys, "web", &nodes, &count, &st), PV_OK);
    assert_int_equal(count, 2);
    assert_string_equal(nodes[0].engine_info, info);
    assert_string_equal(nodes[1].engine_info, "");
    pv_node_array_free(nodes, count);

    /* Bad input never reaches Redis. */
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n1", "{}", 60, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n1", "nope", 60, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n1", info, 0, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "ttl: 0"));
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "a/b", info, 60, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(pv_registry_get_engine_info(f->r, &f->keys, "a/b", &got, &st),
                     PV_INVALID_ARGUMENT);

    /* RemoveNode leaves the agent's report alone; the agent's clean stop deletes it. */
    assert_int_equal(pv_registry_remove_node(f->r, &f->keys, "n1", &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "engine-info:n1"), 1);
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n1", NULL, -1, &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "engine-info:n1"), 0);
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n1", NULL, -1, &st), PV_OK);

    /* It expires with its TTL. */
    assert_int_equal(pv_registry_set_engine_info(f->r, &f->keys, "n2", info, 1, &st), PV_OK);
    for (int i = 0; i < 40 && int_cmd(f, "EXISTS " BASE "engine-info:n2") == 1; i++)
        usleep(100 * 1000);
    assert_int_equal(pv_registry_get_engine_info(f->r, &f->keys, "n2", &got, &st), PV_NOT_FOUND);
}

static void test_resources_checks(void **state) {
    (void)state;
    pv_status st;
    assert_true(pv_registry_resources_complete("{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}"));
    assert_false(pv_registry_resources_complete(NULL));
    assert_false(pv_registry_resources_complete("{}"));
    assert_false(pv_registry_resources_complete("{\"cpumem\":{\"cpu\":4}}"));
    assert_false(pv_registry_resources_complete("{\"storage\":{\"storage\":\"1T\"}}"));
    assert_false(pv_registry_resources_complete("not json"));

    /* Absent fields take the engine's defaults; given ones are still checked. */
    pv_res_engine_info info = {.cpu_count = 2, .mem_total = 1 << 30, .storage_total = 1 << 30};
    assert_int_equal(pv_registry_check_resources("{\"cpumem\":{\"cpu\":4}}", &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "memory"));
    assert_int_equal(pv_registry_check_resources_with("{\"cpumem\":{\"cpu\":4}}", &info, &st),
                     PV_OK);
    assert_int_equal(pv_registry_check_resources_with("{\"cpumem\":{}}", &info, &st), PV_OK);
    assert_int_equal(
        pv_registry_check_resources_with("{\"cpumem\":{\"memory\":\"-1G\"}}", &info, &st),
        PV_INVALID_ARGUMENT);
    assert_int_equal(strncmp(st.msg, "resources: cpumem", 17), 0);
    assert_int_equal(pv_registry_check_resources_with("{\"gpu\":{}}", &info, &st),
                     PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "resources: unknown plugin \"gpu\" (known: cpumem, storage)");
}

/* ---- liveness ---- */

static void test_liveness(void **state) {
    fixture *f = *state;
    pv_status st;
    add_pod(f, "web", NULL);
    add_node(f, "n1", "web", NULL);
    add_node(f, "n2", "web", NULL);
    bool alive = true;
    char *pod = NULL;
    assert_int_equal(pv_registry_get_alive(f->r, &f->keys, "n1", &alive, &pod, &st), PV_OK);
    assert_false(alive);
    assert_string_equal(pod, "web");
    free(pod);

    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n1", 0, NULL, &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "ttl: 0"));
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "nope", 10, NULL, &st), PV_NOT_FOUND);
    assert_string_equal(st.msg, "node nope not found");
    assert_int_equal(pv_registry_get_alive(f->r, &f->keys, "nope", &alive, NULL, &st),
                     PV_NOT_FOUND);

    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n1", 100, NULL, &st), PV_OK);
    long long ttl = int_cmd(f, "TTL " BASE "alive:n1");
    assert_true(ttl > 90 && ttl <= 100);
    assert_int_equal(pv_registry_get_alive(f->r, &f->keys, "n1", &alive, NULL, &st), PV_OK);
    assert_true(alive);
    pv_node n;
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &n, &st), PV_OK);
    assert_true(n.alive);
    assert_false(pv_node_down(&n));
    pv_node_clear(&n);

    char **names;
    size_t count;
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n2", 1, "{\"pid\":1}", &st), PV_OK);
    assert_int_equal(pv_registry_alive_nodes(f->r, &f->keys, &names, &count, &st), PV_OK);
    assert_int_equal(count, 2);
    assert_string_equal(names[0], "n1");
    assert_string_equal(names[1], "n2");
    pv_registry_names_free(names, count);

    /* The TTL runs out. */
    for (int i = 0; i < 40 && int_cmd(f, "EXISTS " BASE "alive:n2") == 1; i++)
        usleep(100 * 1000);
    assert_int_equal(pv_registry_get_alive(f->r, &f->keys, "n2", &alive, NULL, &st), PV_OK);
    assert_false(alive);
    assert_int_equal(pv_registry_alive_nodes(f->r, &f->keys, &names, &count, &st), PV_OK);
    assert_int_equal(count, 1);
    assert_string_equal(names[0], "n1");
    pv_registry_names_free(names, count);

    /* A negative ttl deletes. */
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n1", -1, NULL, &st), PV_OK);
    assert_int_equal(int_cmd(f, "EXISTS " BASE "alive:n1"), 0);
    assert_int_equal(pv_registry_alive_nodes(f->r, &f->keys, &names, &count, &st), PV_OK);
    assert_int_equal(count, 0);
    assert_null(names);
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, "n1", -1, NULL, &st), PV_OK);

    pv_node *nodes;
    assert_int_equal(pv_registry_list_nodes(f->r, &f->keys, "web", &nodes, &count, &st), PV_OK);
    assert_int_equal(count, 2);
    assert_false(nodes[0].alive);
    assert_false(nodes[1].alive);
    pv_node_array_free(nodes, count);
}

static void test_notify_and_keys(void **state) {
    fixture *f = *state;
    pv_status st;
    char buf[PV_KEY_MAX];
    assert_int_equal(pv_registry_alive_key(&f->keys, "n1", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, BASE "alive:n1");
    assert_int_equal(pv_registry_alive_prefix(&f->keys, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, BASE "alive:");
    assert_int_equal(pv_registry_alive_pattern(&f->keys, 3, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "__keyspace@3__:" BASE "alive:*");
    pv_keys odd;
    pv_keys_init(&odd, "a*[b]:", &st);
    assert_int_equal(pv_registry_alive_pattern(&odd, 0, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "__keyspace@0__:a\\*\\[b\\]:{reg}:alive:*");

    redisReply *rep = cmd(f, "CONFIG SET notify-keyspace-events Ex");
    freeReplyObject(rep);
    bool changed = false;
    assert_int_equal(pv_registry_ensure_notify(f->r, &changed, &st), PV_OK);
    assert_true(changed);
    rep = cmd(f, "CONFIG GET notify-keyspace-events");
    assert_int_equal(rep->elements, 2);
    for (const char *c = "K$gxE"; *c; c++)
        assert_non_null(strchr(rep->element[1]->str, *c));
    freeReplyObject(rep);
    assert_int_equal(pv_registry_ensure_notify(f->r, &changed, &st), PV_OK);
    assert_false(changed);
    rep = cmd(f, "CONFIG SET notify-keyspace-events KA");
    freeReplyObject(rep);
    assert_int_equal(pv_registry_ensure_notify(f->r, &changed, &st), PV_OK);
    assert_false(changed);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pod_add_get_list_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pod_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_add_get_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_node_usage_rev, setup, teardown),
        cmocka_unit_test_setup_teardown(test_node_tls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_info, setup, teardown),
        cmocka_unit_test(test_resources_checks),
        cmocka_unit_test_setup_teardown(test_liveness, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notify_and_keys, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
