/*
 * svc_core_deploy: pb.CoreRPC's deploy and workload lifecycle: CreateWorkload, RemoveWorkload,
 * ControlWorkload, ReallocResource, ReplaceWorkload and DissociateWorkload.
 *
 * CreateWorkload: the gateway checks the deploy (Eru's rules, pv_deploy_check: code 1074 and the
 * cause), submits the operation `workload.create` (workers/wk_deploy.h) carrying the request's
 * bytes, and relays to the client, as they happen, one CreateWorkloadMessage per instance from
 * the output streams of the operation's per-node children (svc_relay). An instance whose node's
 * part failed as a whole (no agent took it, the agent failed) is answered with success=false and
 * the cause. A failure before any node was asked (not enough resource, no scheduler) ends the
 * call with code 1074 and the cause. The client going away stops the relay, not the deploy (the
 * operation can be followed with pivirt.operations.v1). An x-request-id makes the call
 * idempotent: a retry relays the same deploy instead of making another.
 *
 * Remove, Control and Replace: one operation per node of the ids, relayed one answer per id.
 * Realloc: the accounting first, then the node's limits. Dissociate: the control plane forgets.
 *
 * Ownership: svc_core_deploy_new allocates, svc_core_deploy_free frees; it outlives the server.
 */
#ifndef SVC_CORE_DEPLOY_H
#define SVC_CORE_DEPLOY_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_deploy svc_core_deploy;

svc_core_deploy *svc_core_deploy_new(gw_app *app);
void svc_core_deploy_free(svc_core_deploy *s);

int svc_core_deploy_register(svc_core_deploy *s, gw_server *server);

#endif
