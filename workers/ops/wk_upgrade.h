/*
 * wk_upgrade: ClusterService's UpgradeCluster on the workers.
 *
 *   cluster.upgrade (ops workers)
 *       params {cluster, cluster_id, from, to, strategy: {type, max_surge, max_unavailable,
 *       partition}}; holds the cluster and every node. Nodes go in the batches of
 *       pv_upgrade_batches (name order, the partition's first nodes skipped). Per node: cordon,
 *       drain (wk_cluster_drain_node: daemons stay, a workload that cannot be placed elsewhere
 *       stays too, max_surge 0 stops each old workload before its replacement is placed), its
 *       agent runs the upgrade hook (child node.upgrade_on_node), the node must then report
 *       READY at the target version within upgrade.node_timeout_seconds, then uncordon (a node
 *       that was cordoned before stays so). CANARY watches its first node stay READY at the
 *       target for upgrade.settle_seconds (VERIFYING) before the rest go as ROLLING. BLUE_GREEN
 *       upgrades the first half while the other carries the workloads, verifies the upgraded
 *       half for the settle time, moves every workload onto it (MIGRATING: the old half is
 *       cordoned and drained), then upgrades the old half.
 *       A node that fails (hook, timeout, no agent, a drain that fails) or a CancelOperation
 *       stops the rollout and rolls back every node it touched: the hook with the old version,
 *       READY at it, uncordon. The operation then ends FAILED (the node's cause, final) or
 *       CANCELLED. On success the cluster's version becomes the target. Every step is written
 *       to the upgrade record (pv_upgrade.h) GetUpgradeStatus reads.
 *
 *   node.upgrade_on_node (the node's agent)
 *       params {version}: runs the agent's upgrade hook (upgrade.hook, default
 *       ops/hooks/node-upgrade) with the version as its argument and PIVIRT_NODE,
 *       PIVIRT_VERSION, PIVIRT_VERSION_FILE and PIVIRT_DATA_DIR in its environment, within
 *       upgrade.node_timeout_seconds; a hook that fails (exit status, timeout) fails it
 *       FAILED_PRECONDITION with the hook's last output. Then the agent reports its version at
 *       once instead of at the next beat.
 */
#ifndef WK_UPGRADE_H
#define WK_UPGRADE_H

#include "pv_status.h"
#include "wk_handler.h"

int wk_upgrade_cluster(wk_op *op, pv_status *st);
int wk_upgrade_node(wk_op *op, pv_status *st);

#endif
