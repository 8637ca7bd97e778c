/*
 * pv_domains: a virt node's reported domains (see pv_domains.h).
 */
#include "pv_domains.h"

#include <stdlib.h>

#include "pv_registry.h"

int pv_domains_get(pv_redis *r, const pv_keys *k, const char *node, json_t **workloads,
                   pv_status *st) {
    return pv_engine_workloads_get(r, k, node, "virt", workloads, st);
}

int pv_engine_workloads_get(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                            json_t **workloads, pv_status *st) {
    *workloads = NULL;
    char *report = NULL;
    int rc = pv_registry_get_engine_info(r, k, node, &report, st);
    if (rc == PV_NOT_FOUND) {
        pv_status_clear(st);
        return PV_OK;
    }
    if (rc != PV_OK) return rc;
    json_t *j = json_loads(report, 0, NULL);
    free(report);
    json_t *w = json_object_get(json_object_get(j, engine), "workloads");
    if (json_is_object(w)) *workloads = json_incref(w);
    json_decref(j);
    return PV_OK;
}
