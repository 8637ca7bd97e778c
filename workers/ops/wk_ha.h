/*
 * wk_ha: what the cluster does when a node is lost.
 *
 * Detection. Readiness is the node's alive key, which its agent renews every beat with a TTL
 * of ha.node_timeout_seconds: a node that has not beaten for that long is NOT_READY wherever
 * it is read (ClusterService, CoreRPC's GetNodeStatus and NodeStatusStream, GetHealth). Every
 * ops worker runs the watch (wk_ha_watch_start): every WK_HA_SCAN_MS it asks Redis which
 * nodes changed (pv_workload_ha_scan). The scan is one Redis function that reports a change and
 * records it in the same step, so whatever the number of ops workers each change is reported
 * to exactly one of them: there is no leader to elect, no lease to lose or to wait out when
 * one dies, and the ops workers are where the recovery runs anyway (the scheduler only plans;
 * it has no business submitting operations). Each change is an entry on the events stream
 * (kind node.not_ready / node.ready, the node's name as target), and a node lost with HA
 * workloads gets a node.failover operation (request id from the node and its count of losses,
 * so a worker that dies between the scan and the submit leaves it to the next scan, never to
 * two).
 *
 *   node.failover
 *       params {node}: for each workload of the node labelled pivirt.io/ha=restart (id order):
 *       claim it (pv_workload_ha_claim: only while the node's alive key is gone; its epoch goes
 *       up, so the node's old instance can no longer write), then place its next incarnation
 *       from its own DeployOptions on another node of its pod with the deploy every
 *       CreateWorkload uses (a child workload.create: scheduler plan and reservation, capacity
 *       and strategy respected, the target node's agent), keeping its id at the new epoch
 *       (params.incarnate). What cannot be placed has its claim undone and stays down, with an
 *       event (kind workload.unplaced) saying why; each one recreated gets workload.recovered.
 *       Journaled per workload, retried, cancellable (the child in flight is cancelled).
 *       Workloads without the label stay down, as in Eru.
 *
 * The node's agent fenced the old instances before the alive key expired (wk_fence.h), so
 * the new incarnation never runs beside the old one.
 */
#ifndef WK_HA_H
#define WK_HA_H

#include "pv_config.h"
#include "pv_status.h"
#include "wk_handler.h"

#define WK_HA_SCAN_MS 500

/* node.failover (above). */
int wk_ha_failover(wk_op *op, pv_status *st);

/* Recovers workload w of a node that is gone (claim, then place the next incarnation);
 * *recovered says whether it runs elsewhere now, why (cap bytes) why not. Used by the failover
 * and by a forced drain or removal of a node whose agent is gone (wk_cluster.h). Steps are
 * journaled under "ha:<id>". */
struct pv_workload;
int wk_ha_recover(wk_op *op, const char *node, const struct pv_workload *w, bool *recovered,
                  char *why, size_t cap, pv_status *st);

typedef struct wk_ha_watch wk_ha_watch;

/* Starts the watch of an ops worker (instance: its presence name, in the events it writes). */
int wk_ha_watch_start(const pv_config *cfg, const char *instance, wk_ha_watch **out, pv_status *st);
void wk_ha_watch_stop(wk_ha_watch *w); /* NULL is fine */

/* One scan and what it calls for (events, failovers), as the watch's thread runs it: for
 * tests. */
int wk_ha_watch_once(wk_ha_watch *w, pv_status *st);

#endif
