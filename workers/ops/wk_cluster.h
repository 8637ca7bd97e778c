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

#include <stdbool.h>
#include <stddef.h>

#include "pv_op.h"
#include "pv_workload.h"
#include "pv_status.h"
#include "wk_handler.h"

/* The label that makes a workload a daemon: it belongs to its node and is never moved. */
#define WK_DAEMON_LABEL "pivirt.io/daemon"

int wk_cluster_cordon(wk_op *op, pv_status *st);

/* ---- for the upgrade (wk_upgrade) ---- */

typedef enum {
    WK_DAEMONS_REFUSE, /* fail the drain, naming them (node.drain) */
    WK_DAEMONS_LEAVE,  /* leave them on the node (ignore_daemonsets, upgrades) */
    WK_DAEMONS_REMOVE, /* stop them: they go with their node (node.remove) */
} wk_daemon_policy;

typedef struct wk_drain_opts {
    const char *node;
    bool force;            /* remove what cannot be placed elsewhere */
    bool keep_unplaceable; /* leave it on the node instead of failing (upgrades) */
    bool stop_first;       /* stop the old one before placing its replacement (an upgrade
                              with max_surge 0); what cannot be placed is then lost */
    wk_daemon_policy daemons;
    int grace_seconds;    /* < 0: the engine's default */
    int unplaceable_code; /* the drain's failure when one cannot be placed */
} wk_drain_opts;

typedef struct wk_drain_tally {
    size_t moved, removed, left;
} wk_drain_tally;

/* Cordons the node, then moves its workloads per d (progress from base to base+span). */
int wk_cluster_drain_node(wk_op *op, const wk_drain_opts *d, int base, int span, wk_drain_tally *t,
                          pv_status *st);

/* Sets the node's bypass (cordon true, uncordon false). */
int wk_cluster_set_bypass(wk_op *op, const char *node, bool cordon, pv_status *st);

/* Submits a child operation (journaled as step, idempotent by request_id) and waits for it to
 * finish; *done is its final record (pv_op_clear it). A child no worker takes within
 * worker.node_op_timeout_ms is cancelled (CANCELLED). When this operation is cancelled the
 * child is cancelled too, unless ignore_cancel (a rollback finishes what it starts). */
int wk_cluster_run_child(wk_op *op, const char *step, const char *kind, const char *queue,
                         const char *params, const char *request_id, bool ignore_cancel,
                         pv_op *done, pv_status *st);
/* What a finished replacement deploy made: the new workload's id and node, or why none (id
 * empty). */
typedef struct wk_placed {
    char id[PV_WORKLOAD_ID_LEN + 1];
    char node[256];
    char why[PV_STATUS_MSG_MAX];
} wk_placed;
int wk_cluster_placement(wk_op *op, const pv_op *deploy, wk_placed *p, pv_status *st);

/* The workload's own DeployOptions made into a replacement's: one instance, on any node of its
 * pod but `node` (node names and include lists of the original dropped, its node labels
 * kept). *b64 is malloc'd. FAILED_PRECONDITION when the workload has none recorded. */
int wk_cluster_replacement_deploy(wk_op *op, const pv_workload *w, const char *node, char **b64,
                                  pv_status *st);

int wk_cluster_drain(wk_op *op, pv_status *st);
int wk_cluster_remove_node(wk_op *op, pv_status *st);
int wk_cluster_delete(wk_op *op, pv_status *st);

#endif
