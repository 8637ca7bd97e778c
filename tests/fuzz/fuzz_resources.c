/* Fuzz target: the resource plugins' documents a client sends (a workload's request) and an
 * operator sets (a node's resources), parsed as the scheduler and the registry do, and the
 * same text as SetNode's delta on a node with cores, memory, NUMA nodes, storage and volumes in
 * use (sums near 2^63 must be refused, never wrapped: UBSan traps on a wrap). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pv_res.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    pv_status st;
    pv_res_req req;
    if (pv_res_req_parse(text, &req, &st) == PV_OK) pv_res_req_free(&req);
    pv_res_node node;
    pv_res_engine_info info = {.cpu_count = 4, .mem_total = 1LL << 33, .storage_total = 1LL << 40};
    if (pv_res_node_parse(text, "{}", &info, &node, &st) == PV_OK) pv_res_node_free(&node);
    static const char base[] =
        "{\"cpumem\":{\"cpu\":4,\"memory\":\"4G\",\"numa-cpu\":[\"0,1\",\"2,3\"]},"
        "\"storage\":{\"storage\":\"10G\",\"volumes\":[\"/d0:100G\",\"/d1:50G\"]}}";
    static const char usage[] =
        "{\"cpumem\":{\"memory_request\":1073741824,\"cpu_map\":{\"1\":100}},"
        "\"storage\":{\"volumes\":{\"/d1\":5}}}";
    char *out = NULL;
    if (pv_res_node_delta(base, text, usage, &out, &st) == PV_OK) free(out);
    free(text);
    return 0;
}
