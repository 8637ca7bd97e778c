/*
 * Unit tests of pv_res's whole-node functions: node and request objects (every plugin together,
 * engine defaults, usage applied), capacities, allocations (which cores, NUMA node and volumes
 * they take, and that allocating k times succeeds exactly min(k, capacity) times on many node
 * shapes), usage added and removed, the usage and resources documents written back, Eru's
 * capacity and usage documents, percentages and SetNode deltas.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_res.h"

#define G (1LL << 30)
#define M (1LL << 20)

static void node_ok(const char *res, const char *usage, const pv_res_engine_info *info,
                    pv_res_node *node) {
    pv_status st;
    if (pv_res_node_parse(res, usage, info, node, &st) != PV_OK)
        fail_msg("%s / %s: %s", res ? res : "-", usage ? usage : "-", st.msg);
}

static void node_bad(const char *res, const char *usage, int code, const char *msg) {
    pv_res_node node;
    pv_status st;
    assert_int_equal(pv_res_node_parse(res, usage, NULL, &node, &st), code);
    assert_string_equal(st.msg, msg);
    assert_null(node.cpumem.cores);
    assert_null(node.storage.volumes);
}

static void req_ok(const char *json, pv_res_req *req) {
    pv_status st;
    if (pv_res_req_parse(json, req, &st) != PV_OK) fail_msg("%s: %s", json ? json : "-", st.msg);
}

static int64_t capacity(const pv_res_node *node, const pv_res_req *req) {
    pv_res_cap cap;
    pv_status st;
    if (pv_res_node_capacity(node, req, &cap, &st) != PV_OK) fail_msg("capacity: %s", st.msg);
    return cap.capacity;
}

static char *usage_of(const pv_res_node *node) {
    char *out;
    pv_status st;
    if (pv_res_node_usage_dump(node, &out, &st) != PV_OK) fail_msg("usage_dump: %s", st.msg);
    return out;
}

static char *resources_of(const pv_res_node *node) {
    char *out;
    pv_status st;
    if (pv_res_node_resources_dump(node, &out, &st) != PV_OK)
        fail_msg("resources_dump: %s", st.msg);
    return out;
}

static void usage_is(const pv_res_node *node, const char *want) {
    char *got = usage_of(node);
    assert_string_equal(got, want);
    free(got);
}

static char *alloc_one(pv_res_node *node, const pv_res_req *req) {
    char *doc;
    pv_status st;
    if (pv_res_node_alloc(node, req, &doc, &st) != PV_OK) fail_msg("alloc: %s", st.msg);
    return doc;
}

static void alloc_is(pv_res_node *node, const pv_res_req *req, const char *want) {
    char *got = alloc_one(node, req);
    assert_string_equal(got, want);
    free(got);
}

static void usage_bad(pv_res_node *node, const char *alloc, int sign, int code, const char *msg) {
    pv_status st;
    char *before = usage_of(node);
    assert_int_equal(pv_res_node_usage_add(node, alloc, sign, &st), code);
    assert_string_equal(st.msg, msg);
    usage_is(node, before);
    free(before);
}

static const char *k_node = "{\"cpumem\":{\"cpu\":\"0:100,1:50,2:100,3:100\",\"memory\":\"4G\","
                            "\"numa-cpu\":[\"0,1\",\"2,3\"]},\"storage\":{\"storage\":\"10G\","
                            "\"volumes\":[\"/data0:100G\",\"/data1:50G\",\"/data2:20G\"]}}";

static void test_node_parse(void **state) {
    (void)state;
    pv_res_node node;
    node_ok(k_node,
            "{\"cpumem\":{\"cpu_request\":1.5,\"cpu_limit\":2,\"memory_request\":1024,"
            "\"memory_limit\":2048,\"cpu_map\":{\"1\":50,\"3\":100},\"numa_memory\":{\"1\":1024}},"
            "\"storage\":{\"storage_request\":5,\"storage_limit\":6,\"volumes\":{\"/data1\":5}}}",
            NULL, &node);
    assert_int_equal(node.cpumem.ncores, 4);
    assert_int_equal(node.cpumem.cores[1].pieces, 50);
    assert_int_equal(node.cpumem.cores[1].used, 50);
    assert_int_equal(node.cpumem.cores[3].used, 100);
    assert_int_equal(node.cpumem.cores[0].used, 0);
    assert_true(node.cpumem.cpu_used == 1.5);
    assert_true(node.cpu_limit_used == 2);
    assert_int_equal(node.cpumem.memory, 4 * G);
    assert_int_equal(node.cpumem.memory_used, 1024);
    assert_int_equal(node.memory_limit_used, 2048);
    assert_int_equal(node.cpumem.numa_memory[1], 2 * G);
    assert_int_equal(node.cpumem.numa_memory_used[1], 1024);
    assert_int_equal(node.cpumem.numa_memory_used[0], 0);
    assert_int_equal(node.storage.storage, 180 * G); /* volumes count in storage, as in Eru */
    assert_int_equal(node.storage.storage_used, 5);
    assert_int_equal(node.storage_limit_used, 6);
    assert_int_equal(node.storage.volumes[1].used, 5);
    pv_res_node_free(&node);

    /* absent plugins: the engine's defaults */
    pv_res_engine_info info = {.cpu_count = 4, .mem_total = 10 * G, .storage_total = 100 * G};
    node_ok(NULL, NULL, &info, &node);
    assert_int_equal(node.cpumem.ncores, 4);
    assert_int_equal(node.cpumem.memory, 8 * G);
    assert_int_equal(node.storage.storage, 80 * G);
    pv_res_node_free(&node);
    node_ok("{\"storage\":{\"storage\":\"1G\"}}", NULL, &info, &node);
    assert_int_equal(node.cpumem.ncores, 4);
    assert_int_equal(node.storage.storage, G);
    pv_res_node_free(&node);
    /* no info, or no core count: no cores and no memory */
    node_ok(NULL, NULL, NULL, &node);
    assert_int_equal(node.cpumem.ncores, 0);
    assert_int_equal(node.cpumem.memory, 0);
    assert_int_equal(node.storage.storage, 0);
    pv_res_node_free(&node);
    info.cpu_count = 0;
    node_ok("{}", "{}", &info, &node);
    assert_int_equal(node.cpumem.ncores, 0);
    assert_int_equal(node.cpumem.memory, 0);
    pv_res_node_free(&node);
    /* a given document without info still needs its fields */
    node_bad("{\"cpumem\":{\"cpu\":2}}", NULL, PV_INVALID_ARGUMENT,
             "cpumem: memory: is required (no engine info: start the node agent or give the "
             "node's resources)");
}

static void test_node_parse_errors(void **state) {
    (void)state;
    const char *res = "{\"cpumem\":{\"cpu\":2,\"memory\":\"1G\"},\"storage\":{\"volumes\":"
                      "[\"/d:1G\"]}}";
    node_bad("{\"gpu\":{}}", NULL, PV_INVALID_ARGUMENT,
             "resources: unknown plugin \"gpu\" (known: cpumem, storage)");
    node_bad("{\"cpumem\":\"{}\"}", NULL, PV_INVALID_ARGUMENT,
             "resources: cpumem: must be a JSON object");
    node_bad("[]", NULL, PV_INVALID_ARGUMENT,
             "resources: must be a JSON object of plugin documents");
    node_bad("{\"cpumem\":{\"cpu\":2,\"memory\":\"-1G\"}}", NULL, PV_INVALID_ARGUMENT,
             "cpumem: memory: \"-1G\" must not be negative");
    node_bad(res, "{\"cpumem\":{\"cpu\":1}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: cpu: unknown field");
    node_bad(res, "{\"cpumem\":{\"numa_node\":\"0\"}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: numa_node: unknown field");
    node_bad(res, "{\"storage\":{\"volume_plan\":{}}}", PV_INVALID_ARGUMENT,
             "usage: storage: volume_plan: unknown field");
    node_bad(res, "{\"cpumem\":{\"memory_request\":-1}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: memory_request: -1 must not be negative");
    node_bad(res, "{\"cpumem\":{\"memory_request\":\"1G\"}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: memory_request: must be an integer");
    node_bad(res, "{\"cpumem\":{\"cpu_request\":-0.5}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: cpu_request: -0.5 must be between 0 and 1e9");
    node_bad(res, "{\"cpumem\":{\"cpu_map\":{\"x\":1}}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: cpu_map: \"x\" is not a core id");
    node_bad(res, "{\"cpumem\":{\"cpu_map\":{\"1\":-5}}}", PV_INVALID_ARGUMENT,
             "usage: cpumem: cpu_map: 1: -5 must not be negative");
    node_bad(res, "{\"cpumem\":{\"cpu_map\":{\"9\":100}}}", PV_FAILED_PRECONDITION,
             "usage: cpumem: cpu_map: core 9 is not on the node");
    node_bad(res, "{\"cpumem\":{\"numa_memory\":{\"0\":1}}}", PV_FAILED_PRECONDITION,
             "usage: cpumem: numa_memory: NUMA node 0 is not on the node");
    node_bad(res, "{\"storage\":{\"volumes\":{\"/e\":1}}}", PV_FAILED_PRECONDITION,
             "usage: storage: volumes: /e is not a volume of the node");
    node_bad(res, "{\"disk\":{}}", PV_INVALID_ARGUMENT,
             "usage: unknown plugin \"disk\" (known: cpumem, storage)");
    node_bad(res, "{\"cpumem\":", PV_INVALID_ARGUMENT,
             "usage: not valid JSON: unexpected token near end of file");
}

static void test_req_parse(void **state) {
    (void)state;
    pv_res_req req;
    pv_status st;
    req_ok(NULL, &req);
    assert_true(req.cpumem.cpu_request == 0);
    assert_int_equal(req.storage.nvolumes, 0);
    pv_res_req_free(&req);
    req_ok("{\"cpumem\":{\"cpu-limit\":2,\"memory-request\":\"1G\",\"cpu-bind\":true},"
           "\"storage\":{\"storage\":\"1G\",\"volumes\":[\"AUTO:/data:rw:1G\"]}}",
           &req);
    assert_true(req.cpumem.cpu_request == 2); /* the limit, as the plugin has it */
    assert_int_equal(req.cpumem.memory_request, G);
    assert_true(req.cpumem.cpu_bind);
    assert_int_equal(req.storage.storage_request, 2 * G);
    assert_int_equal(req.storage.nvolumes, 1);
    pv_res_req_free(&req);
    assert_int_equal(pv_res_req_parse("{\"gpu\":{\"count\":1}}", &req, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "request: unknown plugin \"gpu\" (known: cpumem, storage)");
    assert_int_equal(pv_res_req_parse("{\"cpumem\":{\"cpu-bind\":true}}", &req, &st),
                     PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "cpumem: cpu-bind: needs cpu-request (or cpu-limit) above 0");
    assert_int_equal(pv_res_req_parse("{\"storage\":{\"volumes\":[\"AUTO\"]}}", &req, &st),
                     PV_INVALID_ARGUMENT);
    assert_null(req.storage.volumes);
}

static void test_capacity(void **state) {
    (void)state;
    pv_res_node node;
    pv_res_req req;
    pv_res_cap cap;
    node_ok(k_node, NULL, NULL, &node);
    /* memory allows 4, storage 180G / 40G = 4, volumes: 10G each on used volumes ... */
    req_ok("{\"cpumem\":{\"cpu-request\":1,\"memory-request\":\"1G\"},"
           "\"storage\":{\"storage\":\"60G\"}}",
           &req);
    assert_int_equal(pv_res_node_capacity(&node, &req, &cap, NULL), PV_OK);
    assert_int_equal(cap.capacity, 3); /* storage: 180G / 60G */
    assert_int_equal(cap.weight, 2);
    assert_true(cap.rate > 0.29 && cap.rate < 0.30); /* (1/4 + 1/3) / 2 */
    pv_res_req_free(&req);
    req_ok(NULL, &req);
    assert_int_equal(capacity(&node, &req), PV_RES_UNBOUNDED);
    pv_res_req_free(&req);
    req_ok("{\"cpumem\":{\"cpu-request\":5}}", &req);
    assert_int_equal(capacity(&node, &req), 0); /* more than 4 cores */
    pv_res_req_free(&req);
    pv_res_node_free(&node);
    /* a node without cores takes only requests for no CPU */
    node_ok(NULL, NULL, NULL, &node);
    req_ok("{\"cpumem\":{\"cpu-request\":0.1}}", &req);
    assert_int_equal(capacity(&node, &req), 0);
    pv_res_req_free(&req);
    pv_res_node_free(&node);
}

static void test_alloc_documents(void **state) {
    (void)state;
    pv_res_node node;
    pv_res_req req;
    pv_status st;
    char *doc;
    node_ok(k_node, NULL, NULL, &node);
    req_ok("{\"cpumem\":{\"cpu-request\":1.5,\"cpu-limit\":2,\"memory-request\":\"1G\","
           "\"cpu-bind\":true}}",
           &req);
    /* NUMA node 0 first: the busier fragment core 1 (50 free) and the whole core 0 */
    alloc_is(&node, &req,
             "{\"cpumem\":{\"cpu_request\":1.5,\"cpu_limit\":2.0,\"memory_request\":1073741824,"
             "\"memory_limit\":1073741824,\"cpu_map\":{\"0\":100,\"1\":50},\"numa_node\":\"0\","
             "\"numa_memory\":{\"0\":1073741824}},\"storage\":{\"storage_request\":0,"
             "\"storage_limit\":0}}");
    /* then NUMA node 1: the whole core of higher id, a fragment of the other */
    alloc_is(&node, &req,
             "{\"cpumem\":{\"cpu_request\":1.5,\"cpu_limit\":2.0,\"memory_request\":1073741824,"
             "\"memory_limit\":1073741824,\"cpu_map\":{\"2\":50,\"3\":100},\"numa_node\":\"1\","
             "\"numa_memory\":{\"1\":1073741824}},\"storage\":{\"storage_request\":0,"
             "\"storage_limit\":0}}");
    usage_is(&node, "{\"cpumem\":{\"cpu_request\":3.0,\"cpu_limit\":4.0,"
                    "\"memory_request\":2147483648,\"memory_limit\":2147483648,"
                    "\"cpu_map\":{\"0\":100,\"1\":50,\"2\":50,\"3\":100},"
                    "\"numa_memory\":{\"0\":1073741824,\"1\":1073741824}}}");
    /* 50 pieces left on core 2: no plan; the node does not change */
    char *before = usage_of(&node);
    assert_int_equal(pv_res_node_alloc(&node, &req, &doc, &st), PV_RESOURCE_EXHAUSTED);
    assert_null(doc);
    assert_string_equal(st.msg, "cpumem: no cores left for cpu-request 1.5 with cpu-bind "
                                "(memory-request 1073741824, free memory 2147483648)");
    usage_is(&node, before);
    free(before);
    pv_res_req_free(&req);

    /* without binding: no cores, no NUMA node, memory only */
    req_ok("{\"cpumem\":{\"cpu-request\":0.5,\"memory-request\":\"1536M\"}}", &req);
    alloc_is(
        &node, &req,
        "{\"cpumem\":{\"cpu_request\":0.5,\"cpu_limit\":0.5,\"memory_request\":1610612736,"
        "\"memory_limit\":1610612736},\"storage\":{\"storage_request\":0,\"storage_limit\":0}}");
    assert_int_equal(pv_res_node_alloc(&node, &req, &doc, &st), PV_RESOURCE_EXHAUSTED);
    assert_string_equal(st.msg, "cpumem: memory-request 1610612736 is more than the free memory "
                                "536870912");
    pv_res_req_free(&req);

    /* storage: normal on the smallest volume that fits (moved to the used side), exclusive ones
     * together on the next unused volume, whole, in proportion; unlimited on the most room */
    req_ok("{\"storage\":{\"volumes\":[\"AUTO:/data:rw:10G\",\"AUTO:/x:rwm:5G\","
           "\"AUTO:/y:m:15G\",\"AUTO:/tmp\",\"/etc:/etc:ro\"]}}",
           &req);
    alloc_is(&node, &req,
             "{\"cpumem\":{\"cpu_request\":0.0,\"cpu_limit\":0.0,\"memory_request\":0,"
             "\"memory_limit\":0},\"storage\":{\"storage_request\":32212254720,"
             "\"storage_limit\":32212254720,\"volumes\":{\"/data2\":10737418240,"
             "\"/data1\":53687091200,\"/data0\":0},\"volume_plan\":{"
             "\"AUTO:/data:rw:10737418240\":{\"/data2\":10737418240},"
             "\"AUTO:/x:mrw:5368709120\":{\"/data1\":13421772800},"
             "\"AUTO:/y:m:16106127360\":{\"/data1\":40265318400},"
             "\"AUTO:/tmp:rw:0\":{\"/data0\":0}}}}");
    alloc_is(&node, &req,
             "{\"cpumem\":{\"cpu_request\":0.0,\"cpu_limit\":0.0,\"memory_request\":0,"
             "\"memory_limit\":0},\"storage\":{\"storage_request\":32212254720,"
             "\"storage_limit\":32212254720,\"volumes\":{\"/data2\":10737418240,"
             "\"/data0\":107374182400,\"/data1\":0},\"volume_plan\":{"
             "\"AUTO:/data:rw:10737418240\":{\"/data2\":10737418240},"
             "\"AUTO:/x:mrw:5368709120\":{\"/data0\":26843545600},"
             "\"AUTO:/y:m:16106127360\":{\"/data0\":80530636800},"
             "\"AUTO:/tmp:rw:0\":{\"/data1\":0}}}}");
    assert_int_equal(pv_res_node_alloc(&node, &req, &doc, &st), PV_RESOURCE_EXHAUSTED);
    assert_string_equal(st.msg, "storage: no volume has room left for the requested volumes");
    pv_res_req_free(&req);
    req_ok("{\"storage\":{\"storage\":\"150G\"}}", &req);
    assert_int_equal(pv_res_node_alloc(&node, &req, &doc, &st), PV_RESOURCE_EXHAUSTED);
    assert_string_equal(st.msg, "storage: storage-request 161061273600 is more than the free "
                                "storage 128849018880");
    pv_res_req_free(&req);
    pv_res_node_free(&node);
}

static void test_usage_add(void **state) {
    (void)state;
    pv_res_node node;
    pv_status st;
    node_ok(k_node, NULL, NULL, &node);
    const char *a = "{\"cpumem\":{\"cpu_request\":0.1,\"memory_request\":100,"
                    "\"cpu_map\":{\"2\":10},\"numa_node\":\"1\",\"numa_memory\":{\"1\":100}},"
                    "\"storage\":{\"storage_request\":7,\"volumes\":{\"/data0\":7},"
                    "\"volume_plan\":{\"AUTO:/d:rw:7\":{\"/data0\":7}}}}";
    for (int i = 0; i < 3; i++)
        assert_int_equal(pv_res_node_usage_add(&node, a, 1, &st), PV_OK);
    usage_is(&node, "{\"cpumem\":{\"cpu_request\":0.3,\"memory_request\":300,"
                    "\"cpu_map\":{\"2\":30},\"numa_memory\":{\"1\":300}},"
                    "\"storage\":{\"storage_request\":21,\"volumes\":{\"/data0\":21}}}");
    /* a removal that would go below zero changes nothing, in no plugin */
    usage_bad(&node, "{\"cpumem\":{\"cpu_request\":0.1},\"storage\":{\"volumes\":{\"/data1\":1}}}",
              -1, PV_FAILED_PRECONDITION,
              "allocation: storage: volumes: /data1: removing 1 from 0 in use would go below zero");
    usage_bad(&node, "{\"cpumem\":{\"cpu_request\":0.5}}", -1, PV_FAILED_PRECONDITION,
              "allocation: cpumem: cpu_request: removing 0.5 from 0.3 in use would go below zero");
    usage_bad(&node, a, 0, PV_INVALID_ARGUMENT, "allocation: sign: 0 must be 1 or -1");
    usage_bad(&node, "{\"cpumem\":{\"numa_node\":\"7\"}}", 1, PV_FAILED_PRECONDITION,
              "allocation: cpumem: numa_node: NUMA node 7 is not on the node");
    usage_bad(&node, "{\"storage\":{\"volume_plan\":{\"x\":{\"/data0\":-1}}}}", 1,
              PV_INVALID_ARGUMENT,
              "allocation: storage: volume_plan: x: /data0: -1 must not be negative");
    usage_bad(&node, "{\"cpumem\":{\"memory_request\":9223372036854775807}}", 1,
              PV_INVALID_ARGUMENT,
              "allocation: cpumem: memory_request: 9223372036854775807 more is too large");
    for (int i = 0; i < 3; i++)
        assert_int_equal(pv_res_node_usage_add(&node, a, -1, &st), PV_OK);
    usage_is(&node, "{}"); /* 0.1 three times in, three times out: nothing left over */
    /* adding beyond the capacity is the caller's business (as Eru's usage updates) */
    assert_int_equal(pv_res_node_usage_add(&node, "{\"cpumem\":{\"cpu_map\":{\"1\":80}}}", 1, &st),
                     PV_OK);
    assert_int_equal(node.cpumem.cores[1].used, 80);
    assert_int_equal(pv_res_node_usage_add(&node, NULL, -1, &st), PV_OK);
    pv_res_node_free(&node);
}

static void test_dumps(void **state) {
    (void)state;
    pv_res_node node, again;
    pv_res_req req;
    node_ok(k_node, NULL, NULL, &node);
    char *res = resources_of(&node);
    assert_string_equal(res, "{\"cpumem\":{\"cpu\":\"0:100,1:50,2:100,3:100\","
                             "\"memory\":4294967296,\"numa-cpu\":[\"0,1\",\"2,3\"],"
                             "\"numa-memory\":[2147483648,2147483648]},\"storage\":{"
                             "\"storage\":10737418240,\"volumes\":[\"/data0:107374182400\","
                             "\"/data1:53687091200\",\"/data2:21474836480\"]}}");
    usage_is(&node, "{}");
    req_ok("{\"cpumem\":{\"cpu-request\":0.5,\"memory-request\":\"256M\",\"cpu-bind\":true},"
           "\"storage\":{\"volumes\":[\"AUTO:/data:rw:10G\"]}}",
           &req);
    free(alloc_one(&node, &req));
    free(alloc_one(&node, &req));
    /* the documents give the same node back: capacities and usage */
    char *usage = usage_of(&node);
    node_ok(res, usage, NULL, &again);
    assert_int_equal(capacity(&again, &req), capacity(&node, &req));
    usage_is(&again, usage);
    char *res2 = resources_of(&again);
    assert_string_equal(res2, res);
    free(res2);
    free(usage);
    free(res);
    pv_res_node_free(&again);
    pv_res_node_free(&node);
    pv_res_req_free(&req);
    /* the engine's defaults are written out; a node without cores has no cpumem document */
    pv_res_engine_info info = {.cpu_count = 2, .mem_total = 10 * G, .storage_total = 0};
    node_ok(NULL, NULL, &info, &node);
    res = resources_of(&node);
    assert_string_equal(res, "{\"cpumem\":{\"cpu\":\"0:100,1:100\",\"memory\":8589934592},"
                             "\"storage\":{\"storage\":0}}");
    free(res);
    pv_res_node_free(&node);
    node_ok(NULL, NULL, NULL, &node);
    res = resources_of(&node);
    assert_string_equal(res, "{\"storage\":{\"storage\":0}}");
    node_ok(res, NULL, NULL, &again);
    assert_int_equal(again.cpumem.ncores, 0);
    free(res);
    pv_res_node_free(&again);
    pv_res_node_free(&node);
}

static void expect_eru(const char *res, const char *usage, const char *want_cap,
                       const char *want_use) {
    char *cap = NULL, *use = NULL;
    pv_status st;
    if (pv_res_eru_docs(res, usage, &cap, &use, &st) != PV_OK)
        fail_msg("%s / %s: %s", res, usage ? usage : "-", st.msg);
    assert_string_equal(cap, want_cap);
    assert_string_equal(use, want_use);
    free(cap);
    free(use);
}

#define ERU_IDLE_4                                                                                 \
    "{\"cpumem\":{\"cpu\":0,\"cpu_map\":{\"0\":0,\"1\":0,\"2\":0,\"3\":0},\"memory\":0,"           \
    "\"numa_memory\":{},\"numa\":{}},\"storage\":{\"volumes\":{},\"disks\":[],\"storage\":0}}"

/* Eru's documents: one shape for capacity and usage, whatever form the record holds. */
static void test_eru_documents(void **state) {
    (void)state;
    const char *cap4 =
        "{\"cpumem\":{\"cpu\":4,\"cpu_map\":{\"0\":100,\"1\":100,\"2\":100,\"3\":100},"
        "\"memory\":8589934592,\"numa_memory\":{},\"numa\":{}},\"storage\":{"
        "\"volumes\":{},\"disks\":[],\"storage\":0}}";
    /* AddNode's given form, SetNode's materialised form and an empty usage: the same text */
    expect_eru("{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}", NULL, cap4, ERU_IDLE_4);
    expect_eru("{\"cpumem\":{\"cpu\":\"0:100,1:100,2:100,3:100\",\"memory\":8589934592},"
               "\"storage\":{\"storage\":0}}",
               "{}", cap4, ERU_IDLE_4);
    /* usage in the same shape: cores requested (a fraction stays one), pieces bound, bytes */
    expect_eru("{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}",
               "{\"cpumem\":{\"cpu_request\":1.1,\"cpu_limit\":2,\"memory_request\":1073741824,"
               "\"memory_limit\":2147483648,\"cpu_map\":{\"2\":100}}}",
               cap4,
               "{\"cpumem\":{\"cpu\":1.1,\"cpu_map\":{\"0\":0,\"1\":0,\"2\":100,\"3\":0},"
               "\"memory\":1073741824,\"numa_memory\":{},\"numa\":{}},\"storage\":{\"volumes\":{},"
               "\"disks\":[],\"storage\":0}}");
    /* NUMA, twelve cores (members in string order: 10 before 2, as Go writes maps), volumes */
    expect_eru(
        "{\"cpumem\":{\"cpu\":12,\"memory\":\"12G\",\"numa-cpu\":[\"0,1,2,3,4,5\","
        "\"6,7,8,9,10,11\"]},\"storage\":{\"storage\":\"10G\",\"volumes\":[\"/data1:2G\","
        "\"/data0:1G\"]}}",
        "{\"cpumem\":{\"cpu_request\":2,\"cpu_map\":{\"10\":100,\"11\":100},\"numa_memory\":{"
        "\"1\":1073741824},\"memory_request\":1073741824},\"storage\":{\"storage_request\":"
        "1073741824,\"volumes\":{\"/data1\":1073741824}}}",
        "{\"cpumem\":{\"cpu\":12,\"cpu_map\":{\"0\":100,\"1\":100,\"10\":100,\"11\":100,\"2\":100,"
        "\"3\":100,\"4\":100,\"5\":100,\"6\":100,\"7\":100,\"8\":100,\"9\":100},\"memory\":"
        "12884901888,\"numa_memory\":{\"0\":6442450944,\"1\":6442450944},\"numa\":{\"0\":\"0\","
        "\"1\":\"0\",\"10\":\"1\",\"11\":\"1\",\"2\":\"0\",\"3\":\"0\",\"4\":\"0\",\"5\":\"0\","
        "\"6\":\"1\",\"7\":\"1\",\"8\":\"1\",\"9\":\"1\"}},\"storage\":{\"volumes\":{\"/data0\":"
        "1073741824,\"/data1\":2147483648},\"disks\":[],\"storage\":13958643712}}",
        "{\"cpumem\":{\"cpu\":2,\"cpu_map\":{\"0\":0,\"1\":0,\"10\":100,\"11\":100,\"2\":0,\"3\":0,"
        "\"4\":0,\"5\":0,\"6\":0,\"7\":0,\"8\":0,\"9\":0},\"memory\":1073741824,\"numa_memory\":{"
        "\"0\":0,\"1\":1073741824},\"numa\":{\"0\":\"0\",\"1\":\"0\",\"10\":\"1\",\"11\":\"1\","
        "\"2\":\"0\",\"3\":\"0\",\"4\":\"0\",\"5\":\"0\",\"6\":\"1\",\"7\":\"1\",\"8\":\"1\","
        "\"9\":\"1\"}},\"storage\":{\"volumes\":{\"/data0\":0,\"/data1\":1073741824},\"disks\":[],"
        "\"storage\":1073741824}}");
    /* a node without cpumem still answers both plugins */
    expect_eru("{\"storage\":{\"storage\":\"1T\"}}", NULL,
               "{\"cpumem\":{\"cpu\":0,\"cpu_map\":{},\"memory\":0,\"numa_memory\":{},\"numa\":{}},"
               "\"storage\":{\"volumes\":{},\"disks\":[],\"storage\":1099511627776}}",
               "{\"cpumem\":{\"cpu\":0,\"cpu_map\":{},\"memory\":0,\"numa_memory\":{},\"numa\":{}},"
               "\"storage\":{\"volumes\":{},\"disks\":[],\"storage\":0}}");
    /* what allocations add shows, and removing them gives the idle text back */
    pv_res_node node;
    pv_res_req req;
    pv_status st;
    node_ok("{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}", NULL, NULL, &node);
    req_ok("{\"cpumem\":{\"cpu-request\":0.1,\"memory-request\":\"512M\"}}", &req);
    char *a1 = NULL, *a2 = NULL, *cap = NULL, *use = NULL;
    assert_int_equal(pv_res_node_alloc(&node, &req, &a1, &st), PV_OK);
    assert_int_equal(pv_res_node_alloc(&node, &req, &a2, &st), PV_OK);
    assert_int_equal(pv_res_node_eru_dump(&node, &cap, &use, &st), PV_OK);
    assert_string_equal(cap, cap4);
    assert_string_equal(use,
                        "{\"cpumem\":{\"cpu\":0.2,\"cpu_map\":{\"0\":0,\"1\":0,\"2\":0,\"3\":0},"
                        "\"memory\":1073741824,\"numa_memory\":{},\"numa\":{}},\"storage\":{"
                        "\"volumes\":{},\"disks\":[],\"storage\":0}}");
    free(cap);
    free(use);
    assert_int_equal(pv_res_node_usage_add(&node, a1, -1, &st), PV_OK);
    assert_int_equal(pv_res_node_usage_add(&node, a2, -1, &st), PV_OK);
    assert_int_equal(pv_res_node_eru_dump(&node, &cap, &use, &st), PV_OK);
    assert_string_equal(use, ERU_IDLE_4);
    free(cap);
    free(use);
    free(a1);
    free(a2);
    pv_res_req_free(&req);
    pv_res_node_free(&node);
    /* a record the plugins cannot read fails as the parse does */
    assert_int_equal(pv_res_eru_docs("{\"gpu\":{}}", NULL, &cap, &use, &st), PV_INVALID_ARGUMENT);
    assert_null(cap);
    assert_null(use);
}

static void test_percent(void **state) {
    (void)state;
    pv_res_node node;
    pv_res_percent pct;
    node_ok(k_node,
            "{\"cpumem\":{\"cpu_request\":1,\"memory_request\":1073741824},"
            "\"storage\":{\"storage_request\":19327352832,\"volumes\":{\"/data1\":"
            "18253611008}}}",
            NULL, &node);
    pv_res_node_percent(&node, &pct);
    assert_true(pct.cpu == 0.25);
    assert_true(pct.memory == 0.25);
    assert_true(pct.storage > 0.0999 && pct.storage < 0.1001); /* 18G of 180G */
    assert_true(pct.volume > 0.0999 && pct.volume < 0.1001);   /* 17G of 170G */
    pv_res_node_free(&node);
    node_ok(NULL, NULL, NULL, &node);
    pv_res_node_percent(&node, &pct);
    assert_true(pct.cpu == 0 && pct.memory == 0 && pct.storage == 0 && pct.volume == 0);
    pv_res_node_free(&node);
}

static void delta_is(const char *base, const char *delta, const char *usage, const char *want) {
    char *out;
    pv_status st;
    if (pv_res_node_delta(base, delta, usage, &out, &st) != PV_OK)
        fail_msg("delta %s: %s", delta, st.msg);
    assert_string_equal(out, want);
    free(out);
}

static void delta_bad(const char *base, const char *delta, const char *usage, const char *msg) {
    char *out;
    pv_status st;
    assert_int_equal(pv_res_node_delta(base, delta, usage, &out, &st), PV_INVALID_ARGUMENT);
    assert_null(out);
    assert_string_equal(st.msg, msg);
}

static void test_delta(void **state) {
    (void)state;
    const char *base = "{\"cpumem\":{\"cpu\":4,\"memory\":\"4G\",\"numa-cpu\":[\"0,1\",\"2,3\"]},"
                       "\"storage\":{\"storage\":\"10G\",\"volumes\":[\"/d0:100G\",\"/d1:50G\"]}}";
    const char *usage = "{\"cpumem\":{\"cpu_request\":1,\"memory_request\":1073741824,"
                        "\"cpu_map\":{\"1\":100},\"numa_memory\":{\"0\":1073741824}},"
                        "\"storage\":{\"storage_request\":5,\"volumes\":{\"/d1\":5}}}";
    const char *same_storage = "\"storage\":{\"storage\":10737418240,\"volumes\":["
                               "\"/d0:107374182400\",\"/d1:53687091200\"]}}";
    char want[1024];
    /* nothing added: the base, written out in full */
    snprintf(want, sizeof want,
             "{\"cpumem\":{\"cpu\":\"0:100,1:100,2:100,3:100\",\"memory\":4294967296,"
             "\"numa-cpu\":[\"0,1\",\"2,3\"],\"numa-memory\":[2147483648,2147483648]},%s",
             same_storage);
    delta_is(base, "{}", usage, want);
    /* -1: core 0 loses its 100 pieces and, unused, disappears (from its NUMA node too) */
    snprintf(want, sizeof want,
             "{\"cpumem\":{\"cpu\":\"1:100,2:100,3:100\",\"memory\":4294967296,"
             "\"numa-cpu\":[\"1\",\"2,3\"],\"numa-memory\":[2147483648,2147483648]},%s",
             same_storage);
    delta_is(base, "{\"cpumem\":{\"cpu\":-1}}", usage, want);
    /* per core id, a new core with a new layout, memory and NUMA memory added */
    snprintf(want, sizeof want,
             "{\"cpumem\":{\"cpu\":\"1:100,2:100,3:150,4:100\",\"memory\":1073741824,"
             "\"numa-cpu\":[\"1,4\",\"2,3\"],\"numa-memory\":[1073741824,3221225472]},%s",
             same_storage);
    delta_is(base,
             "{\"cpumem\":{\"cpu\":\"0:-100,3:50,4:100\",\"numa-cpu\":[\"1,4\",\"2,3\"],"
             "\"memory\":\"-3G\",\"numa-memory\":[\"-1G\",1073741824]}}",
             usage, want);
    /* storage adds; a volume at 0 disappears, a new one appears */
    delta_is(base, "{\"storage\":{\"storage\":\"-10G\",\"volumes\":[\"/d0:-100G\",\"/d2:1T\"]}}",
             usage,
             "{\"cpumem\":{\"cpu\":\"0:100,1:100,2:100,3:100\",\"memory\":4294967296,"
             "\"numa-cpu\":[\"0,1\",\"2,3\"],\"numa-memory\":[2147483648,2147483648]},"
             "\"storage\":{\"storage\":0,\"volumes\":[\"/d1:53687091200\","
             "\"/d2:1099511627776\"]}}");
    /* a node without cpumem gets one from the delta */
    delta_is(NULL, "{\"cpumem\":{\"cpu\":2,\"memory\":\"1G\"}}", NULL,
             "{\"cpumem\":{\"cpu\":\"0:100,1:100\",\"memory\":1073741824},"
             "\"storage\":{\"storage\":0}}");

    /* below zero, or below what is in use */
    delta_bad(base, "{\"cpumem\":{\"cpu\":-2}}", usage,
              "cpumem: cpu: core 1 would have 0 pieces, below the 100 in use");
    delta_bad(base, "{\"cpumem\":{\"cpu\":\"2:-150\"}}", usage,
              "cpumem: cpu: core 2 would have -50 pieces, below zero");
    delta_bad(base, "{\"cpumem\":{\"memory\":\"-3.5G\"}}", usage,
              "cpumem: memory: 536870912 would be below the 1073741824 in use");
    delta_bad(base, "{\"cpumem\":{\"memory\":\"-5G\"}}", NULL,
              "cpumem: memory: would be -1073741824, below zero");
    delta_bad(base, "{\"cpumem\":{\"numa-memory\":[\"-1.5G\"]}}", usage,
              "cpumem: numa-memory[0]: 536870912 would be below the 1073741824 in use");
    delta_bad(base, "{\"storage\":{\"volumes\":[\"/d1:-50G\"]}}", usage,
              "storage: volumes: /d1 would be 0, below the 5 in use");
    delta_bad(base, "{\"storage\":{\"volumes\":[\"/d1:-51G\"]}}", NULL,
              "storage: volumes: /d1 would be -1073741824, below zero");
    delta_bad(base, "{\"storage\":{\"storage\":\"-11G\"}}", usage,
              "storage: storage: would be -1073741824 (volumes apart), below zero");
    delta_bad("{\"storage\":{\"storage\":10}}", "{\"storage\":{\"storage\":-6}}",
              "{\"storage\":{\"storage_request\":5}}",
              "storage: storage: 4 would be below the 5 in use");
    /* a client's delta near 2^63 is refused, never wrapped into a small size */
    delta_bad(base, "{\"cpumem\":{\"memory\":9223372036854775807}}", NULL,
              "cpumem: memory: 4294967296 + (9223372036854775807) is outside what a size can "
              "hold");
    delta_bad(base, "{\"cpumem\":{\"numa-memory\":[9223372036854775807]}}", NULL,
              "cpumem: numa-memory[0]: 2147483648 + (9223372036854775807) is outside what a "
              "size can hold");
    delta_bad(base, "{\"storage\":{\"volumes\":[\"/d0:8E\",\"/d0:8E\"]}}", NULL,
              "storage: volumes[0]: \"8E\" is too large");
    delta_bad(
        base,
        "{\"storage\":{\"volumes\":[\"/d0:9223372036854775807\",\"/d0:9223372036854775807\"]}}",
        NULL,
        "storage: volumes[0]: 107374182400 + (9223372036854775807) is outside what a size "
        "can hold");
    delta_bad(base, "{\"storage\":{\"storage\":-9223372036854775807}}", NULL,
              "storage: storage: would be -9223372026117357567 (volumes apart), below zero");
    /* a new core needs a NUMA node when the node has them */
    delta_bad(base, "{\"cpumem\":{\"cpu\":\"4:100\"}}", usage,
              "cpumem: numa-cpu: core 4 is in no NUMA node");
    delta_bad(base, "{\"cpumem\":{\"cpu\":-4}}", NULL, "cpumem: cpu: no core would be left");
    delta_bad(NULL, "{\"cpumem\":{\"memory\":\"1G\"}}", NULL, "cpumem: cpu: no core would be left");
    delta_bad(base, "{\"gpu\":{}}", NULL, "delta: unknown plugin \"gpu\" (known: cpumem, storage)");
    delta_bad(base, "{\"cpumem\":{\"share\":1}}", NULL, "cpumem: share: unknown field");
    delta_bad(base, "{\"cpumem\":{\"cpu\":\"x\"}}", NULL,
              "cpumem: cpu: \"x\" must be a core count or \"id:pieces,...\"");
    delta_bad(base, "{\"cpumem\":{\"cpu\":\"1:+5\"}}", NULL,
              "cpumem: cpu: \"1:+5\" must be id:pieces (e.g. \"0:-50\")");
    delta_bad(base, "{\"storage\":{\"volumes\":[\"/d0\"]}}", NULL,
              "storage: volumes[0]: \"/d0\" must be path:size (e.g. \"/data0:-1T\")");
}

/* ---- the property: k allocations succeed min(k, capacity) times ---- */

#define MAX_ALLOCS 256

/*
 * Allocates until it fails: every success lowers the capacity by exactly one, the failure leaves
 * the node as it was, the number of successes is the first capacity; then gives everything back
 * (every other allocation first, then the rest, to mix the order) and checks the usage is what it
 * was and the capacity is back.
 */
static void check_alloc_property(const char *res, const char *usage, const char *req_json) {
    pv_res_node node;
    pv_res_req req;
    pv_status st;
    node_ok(res, usage, NULL, &node);
    req_ok(req_json, &req);
    char *usage0 = usage_of(&node);
    int64_t cap0 = capacity(&node, &req);
    int unbounded = cap0 == PV_RES_UNBOUNDED; /* then a few allocations, capacity unchanged */
    if (unbounded) cap0 = 3;
    if (cap0 > MAX_ALLOCS)
        fail_msg("%s on %s: capacity %lld too large to test", req_json, res, (long long)cap0);
    char *docs[MAX_ALLOCS + 1];
    int64_t n = 0;
    for (;;) {
        char *before = usage_of(&node);
        char *doc;
        if (unbounded && n == cap0) {
            free(before);
            break;
        }
        int rc = pv_res_node_alloc(&node, &req, &doc, &st);
        if (rc != PV_OK) {
            assert_int_equal(rc, PV_RESOURCE_EXHAUSTED);
            assert_null(doc);
            usage_is(&node, before);
            free(before);
            break;
        }
        free(before);
        if (n == MAX_ALLOCS)
            fail_msg("%s on %s: more than %d allocations", req_json, res, MAX_ALLOCS);
        docs[n++] = doc;
        int64_t cap = capacity(&node, &req);
        if (unbounded) assert_int_equal(cap, PV_RES_UNBOUNDED);
        if (!unbounded && cap != cap0 - n)
            fail_msg("%s on %s (usage %s): after %lld allocations (last %s) capacity %lld, want "
                     "%lld",
                     req_json, res, usage ? usage : "-", (long long)n, doc, (long long)cap,
                     (long long)(cap0 - n));
    }
    if (n != cap0)
        fail_msg("%s on %s: %lld allocations, capacity was %lld", req_json, res, (long long)n,
                 (long long)cap0);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = pass; i < n; i += 2) {
            if (pv_res_node_usage_add(&node, docs[i], -1, &st) != PV_OK)
                fail_msg("removing %s: %s", docs[i], st.msg);
            free(docs[i]);
        }
    usage_is(&node, usage0);
    assert_int_equal(capacity(&node, &req), unbounded ? PV_RES_UNBOUNDED : cap0);
    free(usage0);
    pv_res_req_free(&req);
    pv_res_node_free(&node);
}

static const char *const k_shapes[] = {
    "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}",
    "{\"cpumem\":{\"cpu\":4,\"memory\":\"3G\"}}",
    "{\"cpumem\":{\"cpu\":\"0:100,1:50,2:100,3:30,5:200\",\"memory\":\"16G\"}}",
    "{\"cpumem\":{\"cpu\":8,\"memory\":\"16G\",\"numa-cpu\":[\"0,1,2,3\",\"4,5,6,7\"]}}",
    "{\"cpumem\":{\"cpu\":6,\"memory\":\"6G\",\"numa-cpu\":[\"0,2,4\",\"1,3,5\"],"
    "\"numa-memory\":[\"2G\",\"4G\"]}}",
    "{\"cpumem\":{\"cpu\":\"0:100,1:100,2:70,3:100,4:40,5:100\",\"memory\":\"5G\","
    "\"numa-cpu\":[\"0,1,2\",\"3,4,5\"],\"numa-memory\":[\"1G\",\"4G\"]}}",
};

static const char *const k_cpu_reqs[] = {
    "{\"cpumem\":{\"cpu-request\":1,\"memory-request\":\"1G\"}}",
    "{\"cpumem\":{\"cpu-request\":0.5,\"memory-request\":\"512M\",\"cpu-bind\":true}}",
    "{\"cpumem\":{\"cpu-request\":1,\"memory-request\":\"1G\",\"cpu-bind\":true}}",
    "{\"cpumem\":{\"cpu-request\":1.3,\"memory-request\":\"600M\",\"cpu-bind\":true}}",
    "{\"cpumem\":{\"cpu-request\":2,\"cpu-bind\":true}}",
    "{\"cpumem\":{\"cpu-request\":0.3,\"cpu-limit\":1,\"cpu-bind\":true}}",
    "{\"cpumem\":{\"cpu-request\":2.5,\"memory-request\":\"1G\",\"cpu-bind\":true}}",
};

static void test_property_cpumem(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof k_shapes / sizeof *k_shapes; s++)
        for (size_t r = 0; r < sizeof k_cpu_reqs / sizeof *k_cpu_reqs; r++)
            check_alloc_property(k_shapes[s], NULL, k_cpu_reqs[r]);
}

/* The same shapes, already partly used by other allocations. */
static void test_property_cpumem_busy(void **state) {
    (void)state;
    static const char *const k_first[] = {
        "{\"cpumem\":{\"cpu-request\":0.7,\"memory-request\":\"256M\",\"cpu-bind\":true}}",
        "{\"cpumem\":{\"cpu-request\":1.5,\"memory-request\":\"1G\",\"cpu-bind\":true}}",
    };
    for (size_t s = 0; s < sizeof k_shapes / sizeof *k_shapes; s++)
        for (size_t f = 0; f < 2; f++) {
            pv_res_node node;
            pv_res_req first;
            node_ok(k_shapes[s], NULL, NULL, &node);
            req_ok(k_first[f], &first);
            for (int i = 0; i < 2; i++) {
                char *doc;
                pv_status st;
                if (pv_res_node_alloc(&node, &first, &doc, &st) == PV_OK) free(doc);
            }
            char *usage = usage_of(&node);
            for (size_t r = 0; r < sizeof k_cpu_reqs / sizeof *k_cpu_reqs; r++)
                check_alloc_property(k_shapes[s], usage, k_cpu_reqs[r]);
            free(usage);
            pv_res_req_free(&first);
            pv_res_node_free(&node);
        }
}

/* A small deterministic generator, so that failures repeat. */
static uint64_t g_seed = 88172645463325252ULL;
static unsigned rnd(unsigned n) {
    g_seed ^= g_seed << 13;
    g_seed ^= g_seed >> 7;
    g_seed ^= g_seed << 17;
    return (unsigned)(g_seed % n);
}

/* Random node shapes (pieces, NUMA split, memory), random busy state, random bound requests. */
static void test_property_cpumem_random(void **state) {
    (void)state;
    static const int k_pieces[] = {100, 100, 100, 200, 50, 30, 70, 100};
    static const char *const k_cpu[] = {"0.2", "0.5", "0.7", "1", "1.5", "2", "2.3", "3"};
    for (int round = 0; round < 400; round++) {
        char res[1024], req_json[256], cpu[512] = "", numa0[128] = "", numa1[128] = "";
        int ncores = 1 + (int)rnd(8), numa = (int)rnd(2);
        size_t len = 0, l0 = 0, l1 = 0;
        for (int i = 0; i < ncores; i++) {
            len += (size_t)snprintf(cpu + len, sizeof cpu - len, "%s%d:%d", i ? "," : "", i,
                                    k_pieces[rnd(8)]);
            if (i % 2 == 0)
                l0 += (size_t)snprintf(numa0 + l0, sizeof numa0 - l0, "%s%d", l0 ? "," : "", i);
            else
                l1 += (size_t)snprintf(numa1 + l1, sizeof numa1 - l1, "%s%d", l1 ? "," : "", i);
        }
        long long mem = (1 + rnd(8)) * G / 2;
        if (numa && ncores > 1)
            snprintf(res, sizeof res,
                     "{\"cpumem\":{\"cpu\":\"%s\",\"memory\":%lld,\"numa-cpu\":[\"%s\",\"%s\"],"
                     "\"numa-memory\":[%lld,%lld]}}",
                     cpu, mem, numa0, numa1, mem / 4 * (1 + rnd(2)), mem / 4 * (1 + rnd(3)));
        else
            snprintf(res, sizeof res, "{\"cpumem\":{\"cpu\":\"%s\",\"memory\":%lld}}", cpu, mem);
        /* some busy state first: a few allocations of another request */
        pv_res_node node;
        pv_res_req first;
        node_ok(res, NULL, NULL, &node);
        snprintf(req_json, sizeof req_json,
                 "{\"cpumem\":{\"cpu-request\":%s,\"memory-request\":%lld,\"cpu-bind\":true}}",
                 k_cpu[rnd(8)], (long long)(rnd(3) * 256 * M));
        req_ok(req_json, &first);
        for (unsigned i = rnd(4); i > 0; i--) {
            char *doc;
            pv_status st;
            if (pv_res_node_alloc(&node, &first, &doc, &st) == PV_OK) free(doc);
        }
        char *usage = usage_of(&node);
        pv_res_req_free(&first);
        pv_res_node_free(&node);
        snprintf(req_json, sizeof req_json,
                 "{\"cpumem\":{\"cpu-request\":%s,\"memory-request\":%lld,\"cpu-bind\":%s}}",
                 k_cpu[rnd(8)], (long long)(rnd(3) * 384 * M), rnd(5) ? "true" : "false");
        check_alloc_property(res, usage, req_json);
        free(usage);
    }
}

static const char *const k_storage_shapes[] = {
    "{\"storage\":{\"storage\":\"10G\",\"volumes\":[\"/data0:100G\",\"/data1:50G\"]}}",
    "{\"storage\":{\"storage\":\"1T\",\"volumes\":[\"/a:10G\",\"/b:20G\",\"/c:30G\","
    "\"/d:30G\"]}}",
    "{\"storage\":{\"storage\":\"35G\"}}",
    "{\"storage\":{\"storage\":0,\"volumes\":[\"/v0:8G\",\"/v1:8G\",\"/v2:16G\"]}}",
};

static const char *const k_storage_reqs[] = {
    "{\"storage\":{\"storage\":\"10G\"}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/data:rw:10G\"]}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/data:rw:10G\",\"AUTO:/logs:rw:3G\"]}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/data:rwm:8G\"]}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/data:rwm:4G\",\"AUTO:/wal:rwm:2G\"]}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/data:rwm:8G\",\"AUTO:/logs:rw:2G\"]}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/scratch\",\"AUTO:/data:rw:5G\",\"/etc:/etc:ro\"]}}",
    "{\"storage\":{\"storage\":\"2G\",\"volumes\":[\"AUTO:/data:rw:6G\"]}}",
    "{\"storage\":{\"volumes\":[\"AUTO:/scratch\"]}}",
};

static void test_property_storage(void **state) {
    (void)state;
    for (size_t s = 0; s < sizeof k_storage_shapes / sizeof *k_storage_shapes; s++)
        for (size_t r = 0; r < sizeof k_storage_reqs / sizeof *k_storage_reqs; r++) {
            check_alloc_property(k_storage_shapes[s], NULL, k_storage_reqs[r]);
            /* and with the node partly used by each other request first */
            for (size_t f = 0; f < sizeof k_storage_reqs / sizeof *k_storage_reqs; f++) {
                pv_res_node node;
                pv_res_req first;
                node_ok(k_storage_shapes[s], NULL, NULL, &node);
                req_ok(k_storage_reqs[f], &first);
                char *doc;
                pv_status st;
                if (pv_res_node_alloc(&node, &first, &doc, &st) == PV_OK) free(doc);
                char *usage = usage_of(&node);
                check_alloc_property(k_storage_shapes[s], usage, k_storage_reqs[r]);
                free(usage);
                pv_res_req_free(&first);
                pv_res_node_free(&node);
            }
        }
}

/* Random volume sets and usage, random mixes of normal, exclusive, unlimited and plain mounts. */
/* One of the five kinds of volume binding the property test draws, for volume i. */
static void bind_of(char *one, size_t len, unsigned kind, unsigned i, int gigs) {
    switch (kind) {
    case 0:
        snprintf(one, len, "AUTO:/n%u:rw:%dG", i, gigs);
        break;
    case 1:
        snprintf(one, len, "AUTO:/m%u:rwm:%dG", i, gigs);
        break;
    case 2:
        snprintf(one, len, "AUTO:/u%u", i);
        break;
    case 3:
        snprintf(one, len, "/host%u:/in%u", i, i);
        break;
    default:
        snprintf(one, len, "AUTO:/n%u:ro:%dG", i, gigs);
        break;
    }
}

static void test_property_storage_random(void **state) {
    (void)state;
    static const int k_gigs[] = {4, 8, 10, 16, 20, 30, 50};
    for (int round = 0; round < 400; round++) {
        char res[512], vols[400] = "", req_json[400], binds[300] = "";
        unsigned nvol = rnd(6);
        size_t len = 0, blen = 0;
        for (unsigned i = 0; i < nvol; i++)
            len += (size_t)snprintf(vols + len, sizeof vols - len, "%s\"/v%u:%dG\"", i ? "," : "",
                                    i, k_gigs[rnd(7)]);
        snprintf(res, sizeof res, "{\"storage\":{\"storage\":\"%uG\",\"volumes\":[%s]}}",
                 rnd(3) * 20, vols);
        pv_res_node node;
        node_ok(res, NULL, NULL, &node);
        for (unsigned pre = rnd(4); pre > 0; pre--) { /* some busy state first */
            pv_res_req first;
            snprintf(req_json, sizeof req_json,
                     "{\"storage\":{\"volumes\":[\"AUTO:/p:rw%s:%dG\"]}}", rnd(3) ? "" : "m",
                     k_gigs[rnd(4)]);
            req_ok(req_json, &first);
            char *doc;
            pv_status st;
            if (pv_res_node_alloc(&node, &first, &doc, &st) == PV_OK) free(doc);
            pv_res_req_free(&first);
        }
        char *usage = usage_of(&node);
        pv_res_node_free(&node);
        for (unsigned b = 1 + rnd(3), i = 0; i < b; i++) {
            char one[64];
            bind_of(one, sizeof one, rnd(5), i, k_gigs[rnd(5)]);
            blen +=
                (size_t)snprintf(binds + blen, sizeof binds - blen, "%s\"%s\"", i ? "," : "", one);
        }
        if (rnd(4) == 0)
            snprintf(req_json, sizeof req_json,
                     "{\"storage\":{\"storage-request\":\"%dG\",\"volumes\":[%s]}}", k_gigs[rnd(3)],
                     binds);
        else
            snprintf(req_json, sizeof req_json, "{\"storage\":{\"volumes\":[%s]}}", binds);
        check_alloc_property(res, usage, req_json);
        free(usage);
    }
}

/* Both plugins limit at once: the smaller capacity wins, and both give back. */
static void test_property_both(void **state) {
    (void)state;
    static const char *const k_nodes[] = {
        "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"},\"storage\":{\"storage\":\"20G\","
        "\"volumes\":[\"/data0:30G\",\"/data1:10G\"]}}",
        "{\"cpumem\":{\"cpu\":8,\"memory\":\"16G\",\"numa-cpu\":[\"0,1,2,3\",\"4,5,6,7\"]},"
        "\"storage\":{\"volumes\":[\"/v0:16G\",\"/v1:16G\",\"/v2:16G\"]}}",
    };
    static const char *const k_reqs[] = {
        "{\"cpumem\":{\"cpu-request\":1.5,\"memory-request\":\"1G\",\"cpu-bind\":true},"
        "\"storage\":{\"volumes\":[\"AUTO:/data:rw:5G\"]}}",
        "{\"cpumem\":{\"cpu-request\":0.5,\"cpu-bind\":true},"
        "\"storage\":{\"volumes\":[\"AUTO:/data:rwm:10G\"]}}",
        "{\"cpumem\":{\"cpu-request\":1,\"memory-request\":\"3G\"},"
        "\"storage\":{\"storage\":\"4G\"}}",
    };
    for (size_t n = 0; n < 2; n++)
        for (size_t r = 0; r < 3; r++)
            check_alloc_property(k_nodes[n], NULL, k_reqs[r]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_parse),
        cmocka_unit_test(test_node_parse_errors),
        cmocka_unit_test(test_req_parse),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_alloc_documents),
        cmocka_unit_test(test_usage_add),
        cmocka_unit_test(test_dumps),
        cmocka_unit_test(test_eru_documents),
        cmocka_unit_test(test_percent),
        cmocka_unit_test(test_delta),
        cmocka_unit_test(test_property_cpumem),
        cmocka_unit_test(test_property_cpumem_busy),
        cmocka_unit_test(test_property_cpumem_random),
        cmocka_unit_test(test_property_storage),
        cmocka_unit_test(test_property_storage_random),
        cmocka_unit_test(test_property_both),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
