/*
 * wk_cluster: the ops workers' handlers for ClusterService's node and cluster operations.
 *
 *   node.cordon / node.uncordon
 *       params {node}: sets the node's bypass (Eru's), so it takes no new workloads (cordon) or
 *       takes them again (uncordon). Idempotent: cordoning a cordoned node changes nothing.
 *
 *   node.drain
 *       params {node, cluster, force, ignore_daemonsets, grace_period_seconds}: daemon
 *       workloads (label pivirt.io/daemon=true) fail it FAILED_PRECONDITION naming them unless
 *       ignore_daemonsets (then they stay); the node is cordoned; then, one workload at a time
 *       (id order), a replacement is deployed from the workload's own DeployOptions (count 1,
 *       any node of its pod but this one: a child `workload.create`), and only once it runs is
 *       the old one stopped on the node (a child `workload.remove_on_node`: before_stop hooks,
 *       SIGTERM, SIGKILL after the grace). A workload that cannot be placed elsewhere fails the
 *       drain RESOURCE_EXHAUSTED naming it and why, unless force (then it is removed). Progress
 *       names each workload moved and what blocks it. Cancelling it cancels the child in
 *       flight; the node stays cordoned either way.
 *
 *   node.remove
 *       params {node, cluster, force}: the drain above, daemons removed rather than refused
 *       (they belong to the node), a workload that cannot be placed failing it
 *       FAILED_PRECONDITION unless force; then the node's record goes.
 *
 *   cluster.delete
 *       params {cluster, force}: workloads cannot move within a cluster whose every node goes,
 *       so any workload fails it FAILED_PRECONDITION naming them unless force (then each is
 *       stopped and removed); then every node's record and the cluster's (pod's).
 *
 * Every step that writes is journaled (per workload: place, stop) or idempotent, so an
 * operation redelivered after its worker died resumes where it was; children are submitted
 * with request ids derived from the operation's id and the workload's, never twice.
 */
#ifndef WK_CLUSTER_H
#define WK_CLUSTER_H

#include "pv_status.h"
#include "wk_handler.h"

#define WK_CORDON_KIND "node.cordon"
#define WK_UNCORDON_KIND "node.uncordon"
#define WK_DRAIN_KIND "node.drain"
#define WK_NODE_REMOVE_KIND "node.remove"
#define WK_CLUSTER_DELETE_KIND "cluster.delete"

/* The label that makes a workload a daemon: it belongs to its node and is never moved. */
#define WK_DAEMON_LABEL "pivirt.io/daemon"

int wk_cluster_cordon(wk_op *op, pv_status *st);
int wk_cluster_drain(wk_op *op, pv_status *st);
int wk_cluster_remove_node(wk_op *op, pv_status *st);
int wk_cluster_delete(wk_op *op, pv_status *st);

#endif
