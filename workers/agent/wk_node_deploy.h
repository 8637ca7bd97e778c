/*
 * wk_node_deploy: a node agent's part of CreateWorkload, the operation
 * `workload.create_on_node` (workers/ops/wk_deploy.h) on the queue node:<name>. For each allocation
 * the reservation made on this node it creates and starts one instance on the agent's engine and
 * records it (pv_workload_add, which takes the allocation over), then writes one output entry:
 *   {type=workload, id, name, nodename, podname, publish (JSON object), success (1|0), error,
 *    resources (the allocation's JSON)}
 * A failed instance is removed from the engine again and reported with its cause; its allocation
 * stays reserved for the deploy to give back. The operation succeeds when every instance was
 * answered, whatever each answer was.
 *
 * Instances are idempotent across redeliveries: an instance's workload id is derived from its
 * allocation id (sha256), so a second delivery finds what the first created instead of making
 * another.
 *
 * Every instance gets the environment APP_NAME, ERU_POD, ERU_NODE_NAME, ERU_WORKLOAD_SEQ (and the
 * deploy's env), and the labels ERU=1, ERU_META, eru.nodename, eru.coreid (and the deploy's).
 */
#ifndef WK_NODE_DEPLOY_H
#define WK_NODE_DEPLOY_H

#include <stdbool.h>

#include "pv_status.h"
#include "wk_handler.h"
#include "pv_kinds.h"

/* The handler of `workload.create_on_node` (PV_KIND_DEPLOY_NODE); wk_op_context(op) is the node's
 * wk_agent. */
int wk_node_deploy_create(wk_op *op, pv_status *st);

/* wk_node_deploy_create for a one-node deploy handed over to this node (wk_deploy.h), whose
 * reservation resv_id holds only this node's allocations, those of the params: when every
 * instance succeeded, the last one's record ends the reservation in the same step
 * (pv_workload_add_ending) and *resv_ended is true; else (a failure, a redelivery that finds the
 * last instance journaled, more than 256 instances) it is false and the caller releases it. */
int wk_node_deploy_create_ending(wk_op *op, const char *resv_id, bool *resv_ended, pv_status *st);

/* RemoveWorkload's part on a node: the operation `workload.remove_on_node`, params {"ids":
 * [...], "force": bool, "grace_seconds": N (optional; else the engine's)}. Each workload is
 * stopped (before_stop hooks unless force; SIGTERM, then SIGKILL after the grace) and removed from
 * the engine (already gone is fine); then the records of all of them are removed with their
 * resources given back to the node in one step (pv_resv_return_workloads: one usage write for the
 * node's part, not one per workload); one output entry each: {type=removed, id, success (1|0),
 * hook (what went wrong, or "")}, journaled ("reported:<id>"): a redelivery skips those and redoes
 * the others (each pass finds what is already gone and goes on). An id given twice is told once. */
int wk_node_deploy_remove(wk_op *op, pv_status *st);

/* ControlWorkload's part on a node: `workload.control_on_node`, params {"ids", "type": start |
 * stop | restart | suspend | resume, "force": bool (no hooks)}. Starting a running workload and
 * stopping a stopped one are no-ops, as with Docker. The workload's status follows (running,
 * healthy = running; no expiry). One output entry each: {type=controlled, id, error, hook}. */
int wk_node_deploy_control(wk_op *op, pv_status *st);

/* LogStream's part on the workload's node: `workload.log_on_node`, params {"id", "tail": "all"
 * or N (last N lines), "follow": bool}. Writes the workload's output lines (the engine's own
 * "<time> pivirt: ..." notes left out) as output entries {type=log, data}; with follow it keeps
 * reading while the workload runs, until it stops (then a last entry {type=exit, code} says how)
 * or the operation is cancelled (the gateway cancels it when its client goes). Not journaled: a
 * redelivery starts the log again. */
/* ExecuteWorkload's part on the node: `workload.exec_on_node`, params {"id", "commands": [...],
 * "envs": ["K=V"], "workdir", "timeout_ms"}: runs the command in the running workload (the
 * engine's exec: its root and environment, then env -C workdir K=V ... for the extras) and
 * writes one output entry {type=exec, data (base64 of the combined output), code}. */
int wk_node_deploy_exec(wk_op *op, pv_status *st);

/* ReallocResource's part on the node: `workload.realloc_on_node`, params {"id", "cpu_limit",
 * "memory_limit"}: the engine applies the new limits in place (wk_engine_set_limits). */
int wk_node_deploy_realloc(wk_op *op, pv_status *st);

/* ReplaceWorkload's part on the node: `workload.replace_on_node`, params {"deploy", "pod", "ids",
 * "copy": {old path: new path}}: for each old workload, stop it, create and start the new one
 * with its resources (the files of copy taken from the old root), record the new and drop the
 * old; when the new one fails, it is removed and the old one started again. One entry each:
 * {type=replaced, id, name, nodename, podname, publish, success, error, old}. */
int wk_node_deploy_replace(wk_op *op, pv_status *st);

int wk_node_deploy_log(wk_op *op, pv_status *st);

#endif
