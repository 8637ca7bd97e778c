/*
 * Unit tests of pv_res's cpumem plugin: node documents (core counts, core lists, NUMA, engine
 * defaults), workload requests (defaults between request and limit, refusals with messages) and
 * capacities with and without CPU binding, NUMA first, capped by memory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "pv_res.h"

#define G (1LL << 30)
#define M (1LL << 20)

static void node_ok(const char *json, const pv_res_engine_info *info, pv_res_cpumem *node) {
    pv_status st;
    if (pv_res_cpumem_node_parse(json, strlen(json), info, node, &st) != PV_OK)
        fail_msg("%s: %s", json, st.msg);
}

static void node_bad(const char *json, const char *msg) {
    pv_res_cpumem node;
    pv_status st;
    assert_int_equal(pv_res_cpumem_node_parse(json, strlen(json), NULL, &node, &st),
                     PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, msg);
    assert_null(node.cores);
}

static void req_ok(const char *json, pv_res_cpumem_req *req) {
    pv_status st;
    if (pv_res_cpumem_req_parse(json, strlen(json), req, &st) != PV_OK)
        fail_msg("%s: %s", json, st.msg);
}

static void req_bad(const char *json, const char *msg) {
    pv_res_cpumem_req req;
    pv_status st;
    assert_int_equal(pv_res_cpumem_req_parse(json, strlen(json), &req, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, msg);
}

static int64_t cap_of(const char *node_json, const char *req_json) {
    pv_res_cpumem node;
    pv_res_cpumem_req req;
    pv_res_cap cap;
    pv_status st;
    node_ok(node_json, NULL, &node);
    req_ok(req_json, &req);
    assert_int_equal(pv_res_cpumem_capacity(&node, &req, &cap, &st), PV_OK);
    pv_res_cpumem_free(&node);
    return cap.capacity;
}

static void test_node_documents(void **state) {
    (void)state;
    pv_res_cpumem node;
    node_ok("{\"cpu\":4,\"memory\":\"4G\"}", NULL, &node);
    assert_int_equal(node.ncores, 4);
    assert_int_equal(node.cores[3].id, 3);
    assert_int_equal(node.cores[3].pieces, 100);
    assert_int_equal(node.cores[3].numa, -1);
    assert_int_equal(node.memory, 4 * G);
    assert_int_equal(node.nnuma, 0);
    pv_res_cpumem_free(&node);
    node_ok("{\"cpu\":\"3:100,1:50\",\"memory\":1000}", NULL, &node);
    assert_int_equal(node.ncores, 2);
    assert_int_equal(node.cores[0].id, 1);
    assert_int_equal(node.cores[0].pieces, 50);
    assert_int_equal(node.cores[1].id, 3);
    assert_int_equal(node.memory, 1000);
    pv_res_cpumem_free(&node);
    node_ok("{\"cpu\":\"2\",\"memory\":\"1G\",\"numa-cpu\":[\"0\",\"1\"]}", NULL, &node);
    assert_int_equal(node.nnuma, 2);
    assert_int_equal(node.cores[1].numa, 1);
    assert_int_equal(node.numa_memory[0], G / 2);
    assert_int_equal(node.numa_memory[1], G / 2);
    pv_res_cpumem_free(&node);
}

static void test_engine_defaults(void **state) {
    (void)state;
    pv_res_engine_info info = {.cpu_count = 2, .mem_total = 10 * G};
    pv_res_cpumem node;
    node_ok("{}", &info, &node);
    assert_int_equal(node.ncores, 2);
    assert_int_equal(node.memory, 8 * G);
    pv_res_cpumem_free(&node);
    node_ok("{\"memory\":\"1G\"}", &info, &node);
    assert_int_equal(node.memory, G);
    pv_res_cpumem_free(&node);
    node_bad("{}", "cpumem: cpu: is required (no engine info: start the node agent or give the "
                   "node's resources)");
    node_bad("{\"cpu\":2}", "cpumem: memory: is required (no engine info: start the node agent or "
                            "give the node's resources)");
}

static void test_node_refusals(void **state) {
    (void)state;
    node_bad("{\"cpu\":2,\"memory\":\"1G\",\"gpu\":1}", "cpumem: gpu: unknown field");
    node_bad("{\"cpu\":2,\"memory\":\"-1G\"}", "cpumem: memory: \"-1G\" must not be negative");
    node_bad("{\"cpu\":2,\"memory\":-1}", "cpumem: memory: -1 must not be negative");
    node_bad("{\"cpu\":0,\"memory\":1}", "cpumem: cpu: 0 must be between 1 and 4096 cores");
    node_bad("{\"cpu\":\"0:100,x\",\"memory\":1}",
             "cpumem: cpu: \"x\" must be id:pieces (e.g. \"0:100\")");
    node_bad("{\"cpu\":\"0:100,0:50\",\"memory\":1}", "cpumem: cpu: core 0 appears twice");
    node_bad("{\"cpu\":2,\"memory\":1,\"numa-cpu\":[\"0\"]}",
             "cpumem: numa-cpu: core 1 is in no NUMA node");
    node_bad("{\"cpu\":2,\"memory\":1,\"numa-cpu\":[\"0,1\",\"1\"]}",
             "cpumem: numa-cpu[1]: core 1 is already in NUMA node 0");
    node_bad("{\"cpu\":2,\"memory\":1,\"numa-cpu\":[\"0,7\"]}",
             "cpumem: numa-cpu[0]: \"7\" is not a core of cpu");
    node_bad("{\"cpu\":2,\"memory\":1,\"numa-cpu\":[\"0\",\"1\"],\"numa-memory\":[\"1G\"]}",
             "cpumem: numa-memory: must list one size per numa-cpu entry (2)");
    node_bad("{\"cpu\":2,\"memory\":1,\"numa-cpu\":[\"0\",\"1\"],\"numa-memory\":[\"1G\",\"-2\"]}",
             "cpumem: numa-memory[1]: \"-2\" must not be negative");
    node_bad("{\"cpu\":2,", "cpumem: not valid JSON: string or '}' expected near end of file");
    node_bad("[1]", "cpumem: must be a JSON object");
}

static void test_requests(void **state) {
    (void)state;
    pv_res_cpumem_req req;
    req_ok("{\"cpu-limit\":2,\"memory-limit\":\"1G\"}", &req);
    assert_true(req.cpu_request == 2.0 && req.cpu_limit == 2.0);
    assert_int_equal(req.memory_request, G);
    req_ok("{\"cpu-request\":2,\"cpu-limit\":1,\"memory-request\":\"1G\",\"memory-limit\":5}",
           &req);
    assert_true(req.cpu_limit == 2.0);
    assert_int_equal(req.memory_limit, G);
    req_ok("", &req);
    assert_int_equal(req.memory_request, 0);
    req_bad("{\"memory-request\":\"-1G\"}", "cpumem: memory-request: \"-1G\" must not be negative");
    req_bad("{\"cpu-request\":-1}", "cpumem: cpu-request: -1 must not be negative");
    req_bad("{\"cpu-bind\":true}", "cpumem: cpu-bind: needs cpu-request (or cpu-limit) above 0");
    req_bad("{\"cpu-bind\":1,\"cpu-request\":1}", "cpumem: cpu-bind: must be true or false");
    req_bad("{\"cpu\":1}", "cpumem: cpu: unknown field");
}

static void test_capacity_without_binding(void **state) {
    (void)state;
    const char *n = "{\"cpu\":4,\"memory\":\"4G\"}";
    assert_int_equal(cap_of(n, "{\"cpu-request\":1,\"memory-request\":\"1G\"}"), 4);
    assert_int_equal(cap_of(n, "{\"memory-request\":\"3G\"}"), 1);
    assert_int_equal(cap_of(n, "{\"cpu-request\":5,\"memory-request\":\"1G\"}"), 0);
    assert_true(cap_of(n, "{\"cpu-request\":1}") == PV_RES_UNBOUNDED);
    pv_res_cpumem node;
    pv_res_cpumem_req req;
    pv_res_cap cap;
    node_ok(n, NULL, &node);
    node.memory_used = G;
    req_ok("{\"memory-request\":\"1G\"}", &req);
    assert_int_equal(pv_res_cpumem_capacity(&node, &req, &cap, NULL), PV_OK);
    assert_int_equal(cap.capacity, 3);
    assert_true(cap.usage == 0.25 && cap.rate == 0.25 && cap.weight == 1);
    pv_res_cpumem_free(&node);
}

static void test_capacity_with_binding(void **state) {
    (void)state;
    const char *n = "{\"cpu\":4,\"memory\":\"4G\"}";
    assert_int_equal(cap_of(n, "{\"cpu-request\":1,\"cpu-bind\":true}"), 4);
    assert_int_equal(cap_of(n, "{\"cpu-request\":2,\"cpu-bind\":true}"), 2);
    /* 1.5 cores: one whole core plus 50 pieces; the best split moves one core to fragments */
    assert_int_equal(cap_of(n, "{\"cpu-request\":1.5,\"cpu-bind\":true}"), 2);
    assert_int_equal(cap_of(n, "{\"cpu-request\":0.5,\"cpu-bind\":true}"), 8);
    assert_int_equal(cap_of(n, "{\"cpu-request\":0.3,\"cpu-bind\":true}"), 12);
    assert_int_equal(cap_of(n, "{\"cpu-request\":5,\"cpu-bind\":true}"), 0);
    /* memory caps the plans */
    assert_int_equal(cap_of(n, "{\"cpu-request\":0.5,\"cpu-bind\":true,\"memory-request\":\"1G\"}"),
                     4);
    /* fragments of partly used cores: 50 + 100 + 30 free pieces hold 0.3 cores 1 + 3 + 1 times */
    assert_int_equal(cap_of("{\"cpu\":\"0:50,1:100,2:30\",\"memory\":1}",
                            "{\"cpu-request\":0.3,\"cpu-bind\":true}"),
                     5);
    pv_res_cpumem node;
    pv_res_cpumem_req req;
    pv_res_cap cap;
    node_ok(n, NULL, &node);
    node.cores[0].used = 100;
    node.cores[1].used = 100;
    node.cpu_used = 2;
    req_ok("{\"cpu-request\":1,\"cpu-bind\":true}", &req);
    assert_int_equal(pv_res_cpumem_capacity(&node, &req, &cap, NULL), PV_OK);
    assert_int_equal(cap.capacity, 2);
    assert_true(cap.usage == 0.5 && cap.rate == 0.25 && cap.weight == 100);
    /* the computation works on a copy: the node is unchanged */
    assert_int_equal(node.cores[2].used, 0);
    pv_res_cpumem_free(&node);
}

static void test_capacity_numa_first(void **state) {
    (void)state;
    /* two whole cores never fit inside one single-core NUMA node: only across */
    assert_int_equal(cap_of("{\"cpu\":2,\"memory\":\"4G\",\"numa-cpu\":[\"0\",\"1\"]}",
                            "{\"cpu-request\":2,\"cpu-bind\":true}"),
                     1);
    /* NUMA memory caps each node, the rest goes across with the memory left */
    assert_int_equal(cap_of("{\"cpu\":2,\"memory\":\"4G\",\"numa-cpu\":[\"0\",\"1\"],"
                            "\"numa-memory\":[\"1G\",\"3G\"]}",
                            "{\"cpu-request\":0.5,\"cpu-bind\":true,\"memory-request\":\"1G\"}"),
                     4);
    assert_int_equal(cap_of("{\"cpu\":4,\"memory\":\"2G\",\"numa-cpu\":[\"0,1\",\"2,3\"]}",
                            "{\"cpu-request\":1.5,\"cpu-bind\":true,\"memory-request\":\"512M\"}"),
                     2);
}

static void test_combine(void **state) {
    (void)state;
    pv_res_cap caps[] = {{.capacity = 7, .usage = 0.5, .rate = 0.1, .weight = 1},
                         {.capacity = PV_RES_UNBOUNDED, .usage = 0.1, .rate = 0.3, .weight = 1}};
    pv_res_cap out;
    pv_res_cap_combine(caps, 2, &out);
    assert_int_equal(out.capacity, 7);
    assert_true(out.usage > 0.2999 && out.usage < 0.3001);
    assert_true(out.rate > 0.1999 && out.rate < 0.2001);
    pv_res_cap_combine(caps, 0, &out);
    assert_true(out.capacity == PV_RES_UNBOUNDED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_documents),
        cmocka_unit_test(test_engine_defaults),
        cmocka_unit_test(test_node_refusals),
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_capacity_without_binding),
        cmocka_unit_test(test_capacity_with_binding),
        cmocka_unit_test(test_capacity_numa_first),
        cmocka_unit_test(test_combine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
