/*
 * pv_deploy: Eru's DeployOptions as the control plane reads them, shared by the gateway
 * (CalculateCapacity, CreateWorkload) and the ops workers that carry a deploy out: Eru's
 * validation of a deploy, and the plan request the schedulers take (scheduler/sched_place.h).
 * No Redis, no gRPC plumbing: the generated protobuf-c message only.
 *
 * Ownership: *body is malloc'd for the caller.
 */
#ifndef PV_DEPLOY_H
#define PV_DEPLOY_H

#include <stdint.h>

#include "pb/core.pb-c.h"
#include "pv_status.h"

/* CreateWorkload's checks, in Eru's order and with its words, each naming the field:
 * name ("app name is empty"; then a plain name, pv_validate_name), podname ("pod name is
 * empty"), image ("image is empty"; then a reference, pv_image_parse), count ("count is 0" for
 * <= 0, at most PV_DEPLOY_MAX_COUNT), nodes_limit (not negative), entrypoint.name ("entrypoint
 * name is empty", "entrypoint name has '_' character"; a plain name), entrypoint.dir (no ".."),
 * entrypoint.restart ("no", "always", "on-failure"), entrypoint.publish ("port[/tcp|udp|sctp]"),
 * entrypoint.log.type (a Docker log driver), the healthcheck, user ("user[:group]", names or
 * ids), env (KEY=VALUE), dns (IP addresses), extra_hosts ("host:ip"), raw_args (a JSON
 * object), modes (pv_deploy_check_mode), then the resource documents (pv_res_req_parse: plugin
 * and field named). INVALID_ARGUMENT; values quoted and cut. */
/* The most instances one deploy (and one scheduler plan) may ask for. The strategies that
 * spread instances (AUTO, GLOBAL) place them one at a time, as Eru does; without a bound a
 * count near 2^31 on nodes without memory requests (unbounded capacity) would hold a scheduler
 * for minutes. */
#define PV_DEPLOY_MAX_COUNT 1000000

int pv_deploy_check(const Pb__DeployOptions *o, pv_status *st);

/* The label that asks for recovery after a node is lost (workers/ops/wk_ha.h), and its one
 * policy; without it a lost node's workloads stay down, as in Eru. */
#define PV_HA_LABEL "pivirt.io/ha"
#define PV_HA_RESTART "restart"

/* The deploy's HA policy (labels PV_HA_LABEL): absent or PV_HA_RESTART, else INVALID_ARGUMENT
 * naming the label and the value. pv_deploy_check checks it too. */
int pv_deploy_check_ha(const Pb__DeployOptions *o, pv_status *st);

/* A file mode a client sends (DeployOptions.modes, Send, SendLargeFile): 0 to 07777, else
 * INVALID_ARGUMENT naming field and the value. */
int pv_deploy_check_mode(const char *field, int64_t mode, pv_status *st);

/* The plan request body for o: the pod, Eru's node filter (the legacy nodenames/nodelabels and
 * node_filter together), the resource request (documents checked), strategy, count,
 * nodes_limit, app and entrypoint (for the deploy counts), and owner (may be NULL: the
 * operation the reservation is for). INVALID_ARGUMENT naming the field for bad documents. */
int pv_deploy_plan_body(const Pb__DeployOptions *o, const char *owner, char **body, pv_status *st);

#endif
