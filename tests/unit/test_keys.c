/*
 * Unit tests of pv_keys: every key kind's exact name (the stored data and the Lua functions
 * depend on them byte for byte), the prefixes and patterns made from a kind, names that do not
 * fit, and the prefix checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "pv_keys.h"

static const struct {
    pv_key_kind kind;
    const char *a, *b, *want;
} k_names[] = {
    {PV_KEY_OPS, NULL, NULL, "pv:{ops}:"},
    {PV_KEY_OP, "op-1", NULL, "pv:{ops}:op:op-1"},
    {PV_KEY_OP_QUEUE, "default", NULL, "pv:{ops}:q:default"},
    {PV_KEY_OP_INDEX, NULL, NULL, "pv:{ops}:index"},
    {PV_KEY_OP_BY_KIND, "node.deploy", NULL, "pv:{ops}:by-kind:node.deploy"},
    {PV_KEY_OP_BY_TARGET, "wl-1", NULL, "pv:{ops}:by-target:wl-1"},
    {PV_KEY_OP_DELAYED, NULL, NULL, "pv:{ops}:delayed"},
    {PV_KEY_OP_EVENTS, NULL, NULL, "pv:{ops}:events"},
    {PV_KEY_OP_DEAD, NULL, NULL, "pv:{ops}:dead"},
    {PV_KEY_OP_FENCE, NULL, NULL, "pv:{ops}:fence"},
    {PV_KEY_OP_LOCK, "node-1", NULL, "pv:{ops}:lock:node-1"},
    {PV_KEY_OP_IDEM, "rid-1", NULL, "pv:{ops}:idem:rid-1"},
    {PV_KEY_OP_PENDING_BY, "client-1", NULL, "pv:{ops}:pending-by:client-1"},
    {PV_KEY_OP_OUT, "op-1", NULL, "pv:{ops}:out:op-1"},
    {PV_KEY_OP_IN, "op-1", NULL, "pv:{ops}:in:op-1"},
    {PV_KEY_OP_CHAN, "op-1", NULL, "pv:{ops}:chan:op-1"},
    {PV_KEY_OP_UPLOAD, "up-1", NULL, "pv:{ops}:upload:up-1"},
    {PV_KEY_REG, NULL, NULL, "pv:{reg}:"},
    {PV_KEY_PODS, NULL, NULL, "pv:{reg}:pods"},
    {PV_KEY_POD, "cluster-1", NULL, "pv:{reg}:pod:cluster-1"},
    {PV_KEY_POD_NODES, "cluster-1", NULL, "pv:{reg}:pod-nodes:cluster-1"},
    {PV_KEY_NODES, NULL, NULL, "pv:{reg}:nodes"},
    {PV_KEY_NODE, "node-1", NULL, "pv:{reg}:node:node-1"},
    {PV_KEY_NODE_WORKLOADS, "node-1", NULL, "pv:{reg}:node-workloads:node-1"},
    {PV_KEY_NODE_ALLOCS, "node-1", NULL, "pv:{reg}:node-allocs:node-1"},
    {PV_KEY_ALIVE, "n1", NULL, "pv:{reg}:alive:n1"},
    {PV_KEY_ENGINE_INFO, "n1", NULL, "pv:{reg}:engine-info:n1"},
    {PV_KEY_ENGINE_INV, "n1", NULL, "pv:{reg}:engine-inv:n1"},
    {PV_KEY_RESV, "resv-1", NULL, "pv:{reg}:resv:resv-1"},
    {PV_KEY_RESVS, NULL, NULL, "pv:{reg}:resvs"},
    {PV_KEY_DEPLOY_COUNT, "app", "web", "pv:{reg}:deploy-count:app:web"},
    {PV_KEY_SCHED_REQUESTS, NULL, NULL, "pv:{reg}:sched:requests"},
    {PV_KEY_SCHED_REPLY, "req-1", NULL, "pv:{reg}:sched:reply:req-1"},
    {PV_KEY_SCHED_GONE, "req-1", NULL, "pv:{reg}:sched:gone:req-1"},
    {PV_KEY_UPGRADE, "cluster-1", NULL, "pv:{reg}:upgrade:cluster-1"},
    {PV_KEY_WL, "w1", NULL, "pv:{reg}:wl:w1"},
    {PV_KEY_WLS, NULL, NULL, "pv:{reg}:wls"},
    {PV_KEY_APP_WORKLOADS, "app", NULL, "pv:{reg}:app-workloads:app"},
    {PV_KEY_WL_STATUS, "w1", NULL, "pv:{reg}:wl-status:w1"},
    {PV_KEY_WL_DEPLOY, "w1", NULL, "pv:{reg}:wl-deploy:w1"},
    {PV_KEY_DISSOCIATED, "w1", NULL, "pv:{reg}:dissociated:w1"},
    {PV_KEY_POOL, "p1", NULL, "pv:{sto}:pool:p1"},
    {PV_KEY_VOL, "vol-1", NULL, "pv:{sto}:vol:vol-1"},
    {PV_KEY_SNAP, "snap-1", NULL, "pv:{sto}:snap:snap-1"},
    {PV_KEY_POOLS, NULL, NULL, "pv:{sto}:pools"},
    {PV_KEY_POOL_VOLS, "p1", NULL, "pv:{sto}:pool-vols:p1"},
    {PV_KEY_POOL_NAMES, "p1", NULL, "pv:{sto}:pool-names:p1"},
    {PV_KEY_VOL_SNAPS, "vol-1", NULL, "pv:{sto}:vol-snaps:vol-1"},
    {PV_KEY_VOL_USER, "vol-1", NULL, "pv:{sto}:vol-user:vol-1"},
    {PV_KEY_WL_VOLS, "w1", NULL, "pv:{sto}:wl-vols:w1"},
    {PV_KEY_PRESENCE, "gateway", "gw-a", "pv:presence:gateway:gw-a"},
    {PV_KEY_PRESENCE_INDEX, "gateway", NULL, "pv:presence:gateway"},
    {PV_KEY_TEST_RUNS, "r1", NULL, "pv:test:runs:r1"},
};

#define N_NAMES (sizeof k_names / sizeof k_names[0])

static void keys_init(pv_keys *k, const char *prefix) {
    pv_status st = {0};
    assert_int_equal(pv_keys_init(k, prefix, &st), PV_OK);
}

static void test_every_kind_named(void **state) {
    (void)state;
    pv_keys k;
    keys_init(&k, "pv:");
    assert_int_equal(N_NAMES, PV_KEY_KIND_COUNT); /* a new kind gets a row here */
    bool seen[PV_KEY_KIND_COUNT] = {false};
    for (size_t i = 0; i < N_NAMES; i++) {
        char buf[PV_KEY_MAX];
        pv_status st = {0};
        assert_int_equal(
            pv_key2(&k, k_names[i].kind, k_names[i].a, k_names[i].b, buf, sizeof buf, &st), PV_OK);
        assert_string_equal(buf, k_names[i].want);
        assert_false(seen[k_names[i].kind]);
        seen[k_names[i].kind] = true;
        int arity = pv_key_arity(k_names[i].kind);
        assert_int_equal(arity, k_names[i].b ? 2 : k_names[i].a ? 1 : 0);
        if (arity < 2) { /* the one-name form and the malloc'd forms agree */
            assert_int_equal(pv_key(&k, k_names[i].kind, k_names[i].a, buf, sizeof buf, &st),
                             PV_OK);
            assert_string_equal(buf, k_names[i].want);
            char *dup = pv_key_new(&k, k_names[i].kind, k_names[i].a);
            assert_non_null(dup);
            assert_string_equal(dup, k_names[i].want);
            free(dup);
            pv_strv v = {0};
            assert_int_equal(pv_key_add(&k, k_names[i].kind, k_names[i].a, &v), 0);
            assert_int_equal(v.n, 1);
            assert_string_equal(v.v[0], k_names[i].want);
            pv_strv_free(&v);
        }
    }
    assert_int_equal(pv_key_arity(PV_KEY_KIND_COUNT), -1);
}

static void test_prefixes_and_patterns(void **state) {
    (void)state;
    pv_keys k;
    keys_init(&k, "");
    char buf[PV_KEY_MAX];
    pv_status st = {0};
    assert_int_equal(pv_key(&k, PV_KEY_WL, "w1", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "{reg}:wl:w1"); /* an empty prefix adds nothing */
    keys_init(&k, "t:");
    assert_int_equal(pv_key(&k, PV_KEY_ALIVE, "", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{reg}:alive:");
    assert_int_equal(pv_key(&k, PV_KEY_OP, "*", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{ops}:op:*");
    assert_int_equal(pv_key(&k, PV_KEY_OP_EVENTS, "ignored", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{ops}:events");
    assert_int_equal(pv_key2(&k, PV_KEY_DEPLOY_COUNT, "app", NULL, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:{reg}:deploy-count:app:");
    assert_int_equal(pv_key_keyspace_pattern(&k, PV_KEY_WL_STATUS, 3, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "__keyspace@3__:t:{reg}:wl-status:*");
    keys_init(&k, "a*b?[c]\\:");
    assert_int_equal(pv_key_keyspace_pattern(&k, PV_KEY_ALIVE, 0, buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "__keyspace@0__:a\\*b\\?\\[c\\]\\\\:{reg}:alive:*");
    keys_init(&k, "t:");
    assert_int_equal(pv_key_presence(&k, "agent", "n1", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:presence:agent:n1");
    assert_int_equal(pv_key_presence_index(&k, "agent", buf, sizeof buf, &st), PV_OK);
    assert_string_equal(buf, "t:presence:agent");
}

static void test_too_long(void **state) {
    (void)state;
    pv_keys k;
    keys_init(&k, "pv:");
    char buf[PV_KEY_MAX], name[PV_KEY_MAX];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    pv_status st = {0};
    assert_int_equal(pv_key(&k, PV_KEY_WL, name, buf, sizeof buf, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "key name longer than 255 bytes");
    /* exactly full: "pv:{ops}:op:" and the id take all 15 bytes of a 16-byte buffer */
    char small[16];
    pv_status_clear(&st);
    assert_int_equal(pv_key(&k, PV_KEY_OP, "abc", small, sizeof small, &st), PV_OK);
    assert_string_equal(small, "pv:{ops}:op:abc");
    assert_int_equal(pv_key(&k, PV_KEY_OP, "abcd", small, sizeof small, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "key name longer than 15 bytes");
    assert_int_equal(pv_key2(&k, PV_KEY_PRESENCE, "gateway", name, buf, sizeof buf, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(pv_key(&k, PV_KEY_KIND_COUNT, "x", buf, sizeof buf, &st), PV_INVALID_ARGUMENT);
    assert_null(pv_key_new(&k, PV_KEY_KIND_COUNT, "x"));
    char *big = pv_key_new(&k, PV_KEY_WL, name); /* malloc'd: any length */
    assert_non_null(big);
    assert_int_equal(strlen(big), strlen("pv:{reg}:wl:") + strlen(name));
    free(big);
    assert_int_equal(pv_key_keyspace_pattern(&k, PV_KEY_ALIVE, 0, small, sizeof small, &st),
                     PV_INVALID_ARGUMENT);
}

static void test_prefix_checks(void **state) {
    (void)state;
    pv_keys k;
    pv_status st = {0};
    char longp[PV_KEY_PREFIX_MAX + 1];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    assert_int_equal(pv_keys_init(&k, longp, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "redis.prefix: longer than 63 bytes"));
    assert_int_equal(pv_keys_init(&k, "a b", &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "must be printable without spaces"));
    assert_int_equal(pv_keys_init(&k, NULL, &st), PV_OK);
    assert_string_equal(k.prefix, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_named),
        cmocka_unit_test(test_prefixes_and_patterns),
        cmocka_unit_test(test_too_long),
        cmocka_unit_test(test_prefix_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
