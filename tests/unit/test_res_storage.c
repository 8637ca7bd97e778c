/*
 * Unit tests of pv_res's storage plugin: node documents (storage plus volumes), workload
 * requests (volume bindings, defaults, refusals) and capacities: storage only, volumes on used
 * volumes, exclusive volumes, and the minimum of both.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "pv_res.h"

#define G (1LL << 30)
#define T (1LL << 40)

static void node_ok(const char *json, pv_res_storage *node) {
    pv_status st;
    if (pv_res_storage_node_parse(json, strlen(json), NULL, node, &st) != PV_OK)
        fail_msg("%s: %s", json, st.msg);
}

static void req_ok(const char *json, pv_res_storage_req *req) {
    pv_status st;
    if (pv_res_storage_req_parse(json, strlen(json), req, &st) != PV_OK)
        fail_msg("%s: %s", json, st.msg);
}

static void node_bad(const char *json, const char *msg) {
    pv_res_storage node;
    pv_status st;
    assert_int_equal(pv_res_storage_node_parse(json, strlen(json), NULL, &node, &st),
                     PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, msg);
    assert_null(node.volumes);
}

static void req_bad(const char *json, const char *msg) {
    pv_res_storage_req req;
    pv_status st;
    assert_int_equal(pv_res_storage_req_parse(json, strlen(json), &req, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, msg);
    assert_null(req.volumes);
}

static int64_t cap_with(pv_res_storage *node, const char *req_json) {
    pv_res_storage_req req;
    pv_res_cap cap;
    req_ok(req_json, &req);
    assert_int_equal(pv_res_storage_capacity(node, &req, &cap, NULL), PV_OK);
    pv_res_storage_req_free(&req);
    return cap.capacity;
}

static const char *k_node = "{\"storage\":\"100G\",\"volumes\":[\"/data0:1T\",\"/data1:1T\"]}";

static void test_node_documents(void **state) {
    (void)state;
    pv_res_storage node;
    node_ok(k_node, &node);
    assert_int_equal(node.storage, 100 * G + 2 * T);
    assert_int_equal(node.nvolumes, 2);
    assert_string_equal(node.volumes[1].path, "/data1");
    assert_int_equal(node.volumes[1].size, T);
    pv_res_storage_free(&node);
    pv_res_engine_info info = {.storage_total = 10 * G};
    pv_status st;
    assert_int_equal(pv_res_storage_node_parse("{}", 2, &info, &node, &st), PV_OK);
    assert_int_equal(node.storage, 8 * G);
    pv_res_storage_free(&node);
    node_bad("{\"volumes\":[\"/data0\"]}",
             "storage: volumes[0]: \"/data0\" must be path:size (e.g. \"/data0:1T\")");
    node_bad("{\"volumes\":[\"/a:1G\",\"/a:2G\"]}", "storage: volumes[1]: /a appears twice");
    node_bad("{\"volumes\":[\"/a:-1G\"]}", "storage: volumes[0]: \"-1G\" must not be negative");
    node_bad("{\"storage\":\"-1G\"}", "storage: storage: \"-1G\" must not be negative");
    node_bad("{\"disks\":[]}", "storage: disks: unknown field");
    node_bad("{\"volumes\":\"/a:1G\"}", "storage: volumes: must be a list of at most 1024 strings");
}

static void test_requests(void **state) {
    (void)state;
    pv_res_storage_req req;
    req_ok("{\"storage-limit\":\"2G\",\"volumes\":[\"AUTO:/data:wrm:10G\",\"/h:/in\"]}", &req);
    assert_int_equal(req.storage_request, 12 * G);
    assert_int_equal(req.storage_limit, 12 * G);
    assert_int_equal(req.nvolumes, 2);
    assert_string_equal(req.volumes[0].flags, "mrw");
    assert_string_equal(req.volumes[1].flags, "rw");
    assert_string_equal(req.volumes[1].dst, "/in");
    pv_res_storage_req_free(&req);
    req_ok("{\"storage-request\":\"3G\",\"storage-limit\":\"1G\"}", &req);
    assert_int_equal(req.storage_limit, 3 * G);
    pv_res_storage_req_free(&req);
    req_ok("{\"storage\":\"1G\"}", &req);
    assert_int_equal(req.storage_request, G);
    assert_int_equal(req.storage_limit, G);
    pv_res_storage_req_free(&req);
    req_bad("{\"storage-request\":\"-1G\"}",
            "storage: storage-request: \"-1G\" must not be negative");
    req_bad("{\"volumes\":[\"AUTO\"]}",
            "storage: volumes[0]: \"AUTO\" must be src:dst[:flags][:size]");
    req_bad("{\"volumes\":[\"a:b:c:1G:9\"]}",
            "storage: volumes[0]: \"a:b:c:1G:9\" must be src:dst[:flags][:size]");
    req_bad("{\"volumes\":[\"AUTO:/d:m\"]}",
            "storage: volumes[0]: \"AUTO:/d:m\": an exclusive (m) volume needs a size");
    req_bad("{\"volumes\":[\"AUTO:/d:rw:1Q\"]}", "storage: volumes[0]: \"1Q\" is not a size");
    req_bad("{\"iops\":1}", "storage: iops: unknown field");
}

static void test_capacity(void **state) {
    (void)state;
    pv_res_storage node;
    node_ok(k_node, &node);
    /* storage only: (100G + 2T) / 10G */
    assert_int_equal(cap_with(&node, "{\"storage-request\":\"10G\"}"), 214);
    /* nothing requested: nothing limits */
    assert_true(cap_with(&node, "{}") == PV_RES_UNBOUNDED);
    /* host mounts need no scheduling */
    assert_true(cap_with(&node, "{\"volumes\":[\"/h:/in\"]}") == PV_RES_UNBOUNDED);
    /* AUTO volumes: both unused volumes move to the shared side: 10 + 10 */
    assert_int_equal(cap_with(&node, "{\"volumes\":[\"AUTO:/data:rw:100G\"]}"), 20);
    /* exclusive volumes: one per unused volume that fits */
    assert_int_equal(cap_with(&node, "{\"volumes\":[\"AUTO:/data:rwm:1T\"]}"), 2);
    assert_int_equal(cap_with(&node, "{\"volumes\":[\"AUTO:/data:rwm:2T\"]}"), 0);
    /* storage can be the tighter limit */
    assert_int_equal(
        cap_with(&node, "{\"storage-request\":\"1T\",\"volumes\":[\"AUTO:/data:rw:100G\"]}"), 1);
    /* used volumes keep what is left */
    node.volumes[0].used = 900 * G;
    node.volumes[1].used = T;
    assert_int_equal(cap_with(&node, "{\"volumes\":[\"AUTO:/data:rw:100G\"]}"), 1);
    pv_res_storage_req req;
    pv_res_cap cap;
    req_ok("{\"volumes\":[\"AUTO:/data:rw:100G\"]}", &req);
    assert_int_equal(pv_res_storage_capacity(&node, &req, &cap, NULL), PV_OK);
    assert_true(cap.usage > 0.93 && cap.usage < 0.94); /* 1924G of 2048G */
    assert_true(cap.rate > 0.048 && cap.rate < 0.049);
    pv_res_storage_req_free(&req);
    pv_res_storage_free(&node);
    /* AUTO on a node without volumes: none */
    node_ok("{\"storage\":\"1T\"}", &node);
    assert_int_equal(cap_with(&node, "{\"volumes\":[\"AUTO:/data:rw:1G\"]}"), 0);
    pv_res_storage_free(&node);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_documents),
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_capacity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
