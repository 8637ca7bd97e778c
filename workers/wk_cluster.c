/*
 * wk_cluster: ClusterService's node operations on the ops workers (see wk_cluster.h).
 */
#include "wk_cluster.h"

#include <stdbool.h>
#include <string.h>

#include "pv_log.h"
#include "pv_registry.h"

int wk_cluster_cordon(wk_op *op, pv_status *st) {
    const char *node = wk_op_param(op, "node");
    if (!node || !*node) return pv_status_set(st, PV_INVALID_ARGUMENT, "params.node: required");
    bool cordon = strcmp(wk_op_record(op)->kind, WK_CORDON_KIND) == 0;
    pv_node_update u = {.name = node, .bypass = cordon ? PV_TRI_TRUE : PV_TRI_FALSE};
    pv_node now = {0};
    int rc = pv_registry_set_node(wk_op_redis(op), wk_op_keys(op), &u, &now, st);
    if (rc != PV_OK) return rc;
    pv_info("%s node=%s op=%s", cordon ? "cordoned" : "uncordoned", node, wk_op_record(op)->id);
    pv_node_clear(&now);
    return wk_op_progress(op, 100, "node %s %s", node,
                          cordon ? "cordoned: it takes no new workloads"
                                 : "uncordoned: it takes workloads again");
}
