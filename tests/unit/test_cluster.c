/* pv_cluster: version and address checks, node and cluster states. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "pv_cluster.h"

static void test_version(void **state) {
    (void)state;
    pv_status st;
    const char *ok[] = {"v0.0.89", "v1.2.3", "v10.0.0", "v0.0.0"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(pv_cluster_check_version("version", ok[i], &st), PV_OK);
    const char *bad[] = {"",        "1.2.3",      "v1.2",  "v1.2.3.4",
                         "v01.2.3", "v1.2.3-rc1", "v1..3", "V1.2.3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pv_cluster_check_version("version", bad[i], &st), PV_INVALID_ARGUMENT);
        assert_non_null(strstr(st.msg, "version: \""));
    }
}

static void test_ip(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(pv_cluster_check_ip("ip", "10.0.0.1", &st), PV_OK);
    assert_int_equal(pv_cluster_check_ip("ip", "fd00::7", &st), PV_OK);
    assert_int_equal(pv_cluster_check_ip("ip", "10.0.0.300", &st), PV_INVALID_ARGUMENT);
    assert_int_equal(pv_cluster_check_ip("ip", "host.example", &st), PV_INVALID_ARGUMENT);
    assert_int_equal(pv_cluster_check_ip("ip", "", &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "ip: \"\" is not an IPv4 or IPv6 address"));
}

static pv_node node(const char *role, bool alive, bool bypass) {
    pv_node n;
    memset(&n, 0, sizeof n);
    n.role = (char *)role;
    n.alive = alive;
    n.bypass = bypass;
    return n;
}

static void test_states(void **state) {
    (void)state;
    pv_node a = node("worker", true, false);
    assert_int_equal(pv_cluster_node_state(&a), PV_NODE_READY);
    a.alive = false;
    assert_int_equal(pv_cluster_node_state(&a), PV_NODE_NOT_READY);
    a.bypass = true; /* cordoned shows before readiness */
    assert_int_equal(pv_cluster_node_state(&a), PV_NODE_CORDONED);

    pv_pod p;
    memset(&p, 0, sizeof p);
    p.cp_nodes = 1;
    p.worker_nodes = 1;
    assert_int_equal(pv_cluster_state_of(&p, NULL, 0), PV_CLUSTER_CREATING);
    pv_node nodes[3] = {node("control-plane", true, false), node("worker", false, false),
                        node("worker", true, true)};
    /* the cordoned worker is up: complete, but one node is down */
    assert_true(pv_cluster_complete(&p, nodes, 3));
    assert_int_equal(pv_cluster_state_of(&p, nodes, 3), PV_CLUSTER_DEGRADED);
    nodes[1].alive = true;
    assert_int_equal(pv_cluster_state_of(&p, nodes, 3), PV_CLUSTER_RUNNING);
    /* not complete: CREATING until it once was, DEGRADED after */
    assert_false(pv_cluster_complete(&p, nodes, 1));
    assert_int_equal(pv_cluster_state_of(&p, nodes, 1), PV_CLUSTER_CREATING);
    p.formed_ms = 1;
    assert_int_equal(pv_cluster_state_of(&p, nodes, 1), PV_CLUSTER_DEGRADED);
}

static void test_labels(void **state) {
    (void)state;
    assert_true(pv_cluster_labels_match("{\"a\":\"1\",\"b\":\"2\"}", "{\"a\":\"1\"}"));
    assert_true(pv_cluster_labels_match("{}", NULL));
    assert_true(pv_cluster_labels_match("{}", "{}"));
    assert_false(pv_cluster_labels_match("{\"a\":\"1\"}", "{\"a\":\"2\"}"));
    assert_false(pv_cluster_labels_match("{}", "{\"a\":\"1\"}"));
}

static void test_conditions(void **state) {
    (void)state;
    pv_pressure_limits l = {90, 80, 50};
    pv_machine m = {.mem_total = 1000,
                    .mem_available = 100,
                    .disk_total = 1000,
                    .disk_free = 201,
                    .tasks = 49,
                    .pid_max = 100,
                    .network_up = true};
    pv_node_conditions c;
    pv_cluster_conditions_of(&m, &l, &c);
    assert_true(c.memory_pressure); /* 90% in use reaches 90 */
    assert_false(c.disk_pressure);  /* 79.9% */
    assert_false(c.pid_pressure);
    assert_false(c.network_unavailable);
    m.disk_free = 200;
    m.tasks = 50;
    m.network_up = false;
    pv_cluster_conditions_of(&m, &l, &c);
    assert_true(c.disk_pressure && c.pid_pressure && c.network_unavailable);
    pv_machine unknown = {.network_up = true};
    pv_cluster_conditions_of(&unknown, &l, &c);
    assert_false(c.memory_pressure || c.disk_pressure || c.pid_pressure);
    /* read back from an agent's report */
    pv_node n;
    memset(&n, 0, sizeof n);
    n.engine_info = "{\"conditions\":{\"disk_pressure\":true,\"memory_pressure\":false}}";
    pv_cluster_node_conditions(&n, &c);
    assert_true(c.disk_pressure);
    assert_false(c.memory_pressure);
    n.engine_info = "";
    pv_cluster_node_conditions(&n, &c);
    assert_false(c.disk_pressure);
}

static void test_topology(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(pv_cluster_check_topology(0, 0, &st), PV_OK);
    assert_int_equal(pv_cluster_check_topology(3, PV_CLUSTER_TOPOLOGY_MAX, &st), PV_OK);
    assert_int_equal(pv_cluster_check_topology(2147483647, 1, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "topology.control_plane_count: 2147483647 is more nodes than a "
                                "cluster may hold (10000)");
    assert_int_equal(pv_cluster_check_topology(1, -1, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "topology.worker_count: -1 is negative");
    assert_int_equal(pv_cluster_check_topology(1, PV_CLUSTER_TOPOLOGY_MAX + 1, &st),
                     PV_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topology), cmocka_unit_test(test_version),
        cmocka_unit_test(test_ip),       cmocka_unit_test(test_states),
        cmocka_unit_test(test_labels),   cmocka_unit_test(test_conditions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
