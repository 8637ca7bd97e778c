/* pv_upgrade: the batches of each strategy, the partition, version order, the PENDING record. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pv_upgrade.h"

static void expect_batches(pv_upgrade_type type, int surge, int unavailable, int partition,
                           size_t n, const int *want, int want_count) {
    pv_upgrade_strategy s = {type, surge, unavailable, partition};
    int got[16], count = -1;
    pv_upgrade_batches(&s, n, got, &count);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(got[i], want[i]);
    assert_int_equal(count, want_count);
}

static void test_rolling(void **state) {
    (void)state;
    /* the seed's max_unavailable 0 means one node per batch */
    expect_batches(PV_UPGRADE_ROLLING, 1, 0, 0, 3, (int[]){1, 2, 3}, 3);
    expect_batches(PV_UPGRADE_ROLLING, 1, 2, 0, 5, (int[]){1, 1, 2, 2, 3}, 3);
    /* a one-node cluster upgrades its node alone */
    expect_batches(PV_UPGRADE_ROLLING, 1, 0, 0, 1, (int[]){1}, 1);
    /* the partition keeps the first nodes by name order */
    expect_batches(PV_UPGRADE_ROLLING, 1, 1, 2, 4, (int[]){0, 0, 1, 2}, 2);
    expect_batches(PV_UPGRADE_ROLLING, 1, 1, 9, 2, (int[]){0, 0}, 0);
    /* 0 is ROLLING */
    expect_batches((pv_upgrade_type)0, 0, 3, 0, 4, (int[]){1, 1, 1, 2}, 2);
}

static void test_canary(void **state) {
    (void)state;
    expect_batches(PV_UPGRADE_CANARY, 1, 2, 0, 5, (int[]){1, 2, 2, 3, 3}, 3);
    expect_batches(PV_UPGRADE_CANARY, 1, 0, 1, 3, (int[]){0, 1, 2}, 2);
}

static void test_blue_green(void **state) {
    (void)state;
    expect_batches(PV_UPGRADE_BLUE_GREEN, 1, 0, 0, 4, (int[]){1, 1, 2, 2}, 2);
    expect_batches(PV_UPGRADE_BLUE_GREEN, 1, 0, 0, 3, (int[]){1, 1, 2}, 2);
    expect_batches(PV_UPGRADE_BLUE_GREEN, 1, 0, 1, 3, (int[]){0, 1, 2}, 2);
    expect_batches(PV_UPGRADE_BLUE_GREEN, 1, 0, 0, 1, (int[]){1}, 1);
}

static void test_versions(void **state) {
    (void)state;
    assert_true(pv_version_compare("v1.2.3", "v1.2.4") < 0);
    assert_true(pv_version_compare("v1.10.0", "v1.9.9") > 0);
    assert_true(pv_version_compare("v2.0.0", "v10.0.0") < 0);
    assert_int_equal(pv_version_compare("v1.2.3", "v1.2.3"), 0);
    assert_true(pv_version_compare("junk", "v0.0.1") < 0);
    assert_true(pv_upgrade_phase_done(PV_UPGRADE_ROLLED_BACK));
    assert_false(pv_upgrade_phase_done(PV_UPGRADE_MIGRATING));
}

/* A new record, and its document exactly as the upgrade record has always been stored. */
static void test_new_record(void **state) {
    (void)state;
    pv_upgrade_strategy s = {PV_UPGRADE_ROLLING, 1, 0, 1};
    const char *ids[] = {"node-a", "node-b"}, *names[] = {"a", "b"};
    bool cordoned[] = {false, true};
    pv_upgrade_rec r;
    assert_int_equal(pv_upgrade_new_record("op-1", "cluster-1", "v1.1.0", "v1.0.0", &s, ids, names,
                                           cordoned, 2, 1000, &r),
                     0);
    assert_int_equal(r.phase, PV_UPGRADE_PENDING);
    assert_true(r.downgrade);
    assert_int_equal(r.n_nodes, 2);
    assert_int_equal(r.nodes[0].state, PV_NODE_UPGRADE_SKIPPED);
    assert_int_equal(r.nodes[1].state, PV_NODE_UPGRADE_PENDING);
    assert_int_equal(r.nodes[1].batch, 1);
    assert_true(r.nodes[1].was_cordoned);
    char *text = pv_upgrade_dumps(&r);
    assert_string_equal(
        text, "{\"cluster_id\":\"cluster-1\",\"operation_id\":\"op-1\",\"phase\":1,\"from\":"
              "\"v1.1.0\",\"to\":\"v1.0.0\",\"downgrade\":true,\"strategy\":{\"type\":1,"
              "\"max_surge\":1,\"max_unavailable\":0,\"partition\":1},\"message\":\"accepted; no "
              "node touched yet\",\"started_ms\":1000,\"updated_ms\":1000,\"finished_ms\":0,"
              "\"nodes\":[{\"id\":\"node-a\",\"name\":\"a\",\"state\":8,\"message\":\"kept by the "
              "partition\",\"batch\":0,\"was_cordoned\":false,\"started_ms\":0,\"finished_ms\":0},"
              "{\"id\":\"node-b\",\"name\":\"b\",\"state\":1,\"message\":\"waiting for its "
              "batch\",\"batch\":1,\"was_cordoned\":true,\"started_ms\":0,\"finished_ms\":0}]}");
    free(text);
    pv_upgrade_rec_free(&r);
    assert_null(r.nodes);
}

/* The record for the registry's nodes: ids and names from the records, a node's bypass as its
 * cordon. */
static void test_new_record_of_nodes(void **state) {
    (void)state;
    pv_upgrade_strategy s = {PV_UPGRADE_ROLLING, 1, 1, 0};
    pv_node nodes[3] = {{.id = "id-a", .name = "a"},
                        {.id = "id-b", .name = "b", .bypass = true},
                        {.id = "id-c", .name = "c"}};
    pv_upgrade_rec r;
    assert_int_equal(
        pv_upgrade_new_record_of("op-2", "cluster-2", "v1.0.0", "v1.1.0", &s, nodes, 3, 7, &r), 0);
    assert_string_equal(r.operation_id, "op-2");
    assert_int_equal(r.started_ms, 7);
    assert_int_equal(r.n_nodes, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_string_equal(r.nodes[i].id, nodes[i].id);
        assert_string_equal(r.nodes[i].name, nodes[i].name);
        assert_int_equal(r.nodes[i].was_cordoned, nodes[i].bypass);
        assert_int_equal(r.nodes[i].batch, (int)i + 1);
    }
    pv_upgrade_rec_free(&r);
    pv_upgrade_rec empty;
    assert_int_equal(
        pv_upgrade_new_record_of("op-3", "cluster-2", "v1", "v2", &s, NULL, 0, 7, &empty), 0);
    assert_int_equal(empty.n_nodes, 0);
    pv_upgrade_rec_free(&empty);
}

/* Strategy counts are bounded by the cluster's nodes: all of them is allowed (partition n keeps
 * every node, which the gateway answers FAILED_PRECONDITION), one more is not. */
static void test_check_strategy(void **state) {
    (void)state;
    pv_status st;
    pv_upgrade_strategy s = {
        .type = PV_UPGRADE_ROLLING, .max_surge = 4, .max_unavailable = 4, .partition = 4};
    assert_int_equal(pv_upgrade_check_strategy(&s, 4, &st), PV_OK);
    s.max_unavailable = 2147483647;
    assert_int_equal(pv_upgrade_check_strategy(&s, 4, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(
        st.msg, "strategy.max_unavailable: 2147483647 is more than the cluster's 4 node(s)");
    s.max_unavailable = 1;
    s.partition = 5;
    assert_int_equal(pv_upgrade_check_strategy(&s, 4, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "strategy.partition: 5 is more than the cluster's 4 node(s)");
    s.partition = 0;
    s.max_surge = -1;
    assert_int_equal(pv_upgrade_check_strategy(&s, 4, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "strategy.max_surge: -1 is negative");
    s.max_surge = 1;
    assert_int_equal(pv_upgrade_check_strategy(&s, 0, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "strategy.max_surge: 1 is more than the cluster's 0 node(s)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_strategy),
        cmocka_unit_test(test_rolling),
        cmocka_unit_test(test_canary),
        cmocka_unit_test(test_blue_green),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_new_record),
        cmocka_unit_test(test_new_record_of_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
