/* Fuzz target: the resource plugins' documents a client sends (a workload's request) and an
 * operator sets (a node's resources), parsed as the scheduler and the registry do. */
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
    free(text);
    return 0;
}
