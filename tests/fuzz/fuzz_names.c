/* Fuzz target: the small parsers of what callers type: names (workloads, pools, volumes),
 * human sizes ("4G", "1.5GiB"), Eru's volume bindings ("src:dst[:flags][:size]") and times
 * (RFC 3339, Unix seconds, durations). A name that passes can never be a path out of its
 * directory; a size that parses is never negative. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pv_res.h"
#include "pv_storage.h"
#include "pv_time.h"
#include "pv_validate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    pv_status st;
    if (pv_validate_name("name", text, &st) == PV_OK) {
        CHECK(strlen(text) <= PV_NAME_MAX && !strchr(text, '/') && !strstr(text, ".."));
        CHECK(text[0] != '-' && text[0] != '.');
    } else {
        CHECK(st.code == PV_INVALID_ARGUMENT && st.msg[0]);
    }
    if (pv_storage_check_name("name", text, &st) == PV_OK)
        CHECK(text[0] && !strchr(text, '/') && strcmp(text, "..") != 0 && text[0] != '-');
    int64_t bytes = -1;
    if (pv_res_size_parse(text, &bytes, &st) == PV_OK)
        CHECK(bytes >= 0);
    else
        CHECK(st.msg[0]);
    /* one volume binding, as a workload's storage document carries it */
    json_t *doc = json_pack("{s:[s]}", "volumes", text);
    char *body = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    pv_res_storage_req req;
    if (body && pv_res_storage_req_parse(body, strlen(body), &req, &st) == PV_OK) {
        CHECK(req.nvolumes == 1 && req.volumes[0].size >= 0 && req.storage_request >= 0);
        pv_res_storage_req_free(&req);
    }
    free(body);
    json_decref(doc);
    int64_t when = 0;
    if (pv_time_parse("since", text, 1700000000000LL, &when, &st) != PV_OK) CHECK(st.msg[0]);
    free(text);
    return 0;
}
