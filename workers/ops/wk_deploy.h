/*
 * wk_deploy: the ops workers' side of CreateWorkload. The operation `workload.create` (params
 * {"deploy": base64 of the pb.DeployOptions bytes}) is carried out in journaled steps:
 *
 *   check    Eru's checks (pv_deploy_check): a bad deploy fails the operation INVALID_ARGUMENT;
 *   reserve  one plan request with the request id "plan-<op id>" (pv_sched_call "reserve"), so a
 *            redelivered operation names the same reservation (ALREADY_EXISTS: read back with
 *            pv_resv_get); a plan that fails fails the operation with the scheduler's code and
 *            message ("need: N, available: M");
 *   dispatch one child operation `workload.create_on_node` per node of the plan, on the queue
 *            node:<name> of that node's agent, idempotent by request id "<op id>/<node>", with
 *            params {"deploy", "node", "pod", "reservation", "allocations": [{"id", "seq",
 *            "resources"}]}; each child is announced on this operation's output as
 *            {type=node, node, op} so the gateway relays the child's own output (one entry per
 *            workload: {type=workload, id, name, nodename, podname, publish, success, error});
 *   wait     until every child has finished; a child still PENDING after
 *            worker.node_op_timeout_ms (no agent took it) is cancelled and its instances count as
 *            failed;
 *   release  the reservation is released: the allocations that no workload took over (failed
 *            instances, cancelled children) go back to their nodes; created ones stay with their
 *            workloads.
 * A plan on one node (most creates: count 1) needs no child: after reserve (planned before any
 * lease on a fresh delivery: wk_deploy_prelease) the operation itself
 * is handed over to the queue node:<name> (wk_op_handover, the plan's reply never journaled: the
 * node part's params above replace its params, and its announcement {type=node, node, op = its
 * own id, instances, nodes=1} is written with it), and wk_deploy_create, delivered there to the
 * node's agent, runs the node part's instances (wk_node_deploy_create_ending: when all of them
 * succeed, the last one's record ends the reservation) and else releases the reservation: one
 * operation's submit, lease and end instead of two. A cancel then finishes the
 * instances already sent, as for a child, and ends CANCELLED; while it waits on the node's queue
 * (its agent dead, say), a cancel, or worker.node_op_timeout_ms without an agent taking it,
 * hands it back to the ops queue (pv_op_handover), where it gives the reservation back and ends
 * CANCELLED.
 * Partial success is success, as in Eru: the operation SUCCEEDS with its per-workload errors in
 * the children's output; the message counts created and failed instances.
 */
#ifndef WK_DEPLOY_H
#define WK_DEPLOY_H

#include <stdbool.h>

#include "pv_status.h"
#include "wk_consumer.h"
#include "wk_handler.h"
#include "pv_kinds.h"

/* The handler of PV_KIND_DEPLOY. */
int wk_deploy_create(wk_op *op, pv_status *st);

/* The ops consumer's pre-lease step of a fresh PV_KIND_DEPLOY delivery (wk_consumer_opts.prelease):
 * a deploy never run, PENDING on that entry, is planned without a lease (the same request id
 * "plan-<op id>", so the same reservation whatever follows), and a plan on one node hands it
 * over to that node's queue straight from PENDING (pv_op_handover_pending: no RUNNING, fencing
 * token, event and publish on the ops queue; a lease, a record read and a hand-over instead of a
 * lease and a hand-over). true: handed over. false, for the leased run to do as ever: a bad
 * deploy, a plan that failed or put instances on several nodes (that run's reserve step finds
 * the reservation), or a record that moved meanwhile (cancelled: its reservation is given back
 * here; claimed by another worker: left to it). */
bool wk_deploy_prelease(const wk_prelease *p);

#endif
