/*
 * wk_cluster: the ops workers' handlers for ClusterService's node operations.
 *
 *   node.cordon    params {node, cordon: true|false}: sets the node's bypass (Eru's), so it
 *                  takes no new workloads (cordon) or takes them again (uncordon). Idempotent:
 *                  cordoning a cordoned node changes nothing and succeeds.
 */
#ifndef WK_CLUSTER_H
#define WK_CLUSTER_H

#include "pv_status.h"
#include "wk_handler.h"

#define WK_CORDON_KIND "node.cordon"
#define WK_UNCORDON_KIND "node.uncordon"

int wk_cluster_cordon(wk_op *op, pv_status *st);

#endif
