/*
 * svc_nodeop: what the pb.CoreRPC services share to run one operation on a node's agent (queue
 * node:<name>) and read its answers from the operation's output stream.
 *
 * Ownership: the caller owns params (borrowed here) and *rec (pv_op_clear).
 */
#ifndef SVC_NODEOP_H
#define SVC_NODEOP_H

#include <jansson.h>

#include "gw_app.h"
#include "gw_server.h"
#include "pv_id.h"
#include "pv_op.h"

/* The value of field in an output entry ("" when absent). */
const char *svc_nodeop_value(const pv_op_output *e, const char *field);

/* One operation for a node's agent, as svc_nodeop_submit_req submits it. */
typedef struct svc_nodeop_req {
    const char *node, *kind;
    const char *target_prefix; /* the target's generated id says what it is: "logs", "exec" */
    json_t *params;            /* borrowed */
    int max_attempts;          /* <= 0: the default */
    bool notify_end;           /* the caller waits for the end (pv_op_submit_req.notify_end) */
    unsigned flags;            /* gw_app_submit's: GW_SUBMIT_PART for the later parts of a call */
} svc_nodeop_req;

/* Submits q for call's client (gw_app_submit) on the node's queue; op_id gets its id. */
int svc_nodeop_submit_req(gw_call *call, const svc_nodeop_req *q, char op_id[PV_ID_MAX],
                          pv_status *st);

/* An operation of kind with params on node's queue, waited for with svc_nodeop_wait. */
int svc_nodeop_submit(gw_call *call, const char *node, const char *kind, json_t *params,
                      int max_attempts, char op_id[PV_ID_MAX], pv_status *st);

/* Waits until the operation has ended (*rec: its final record), or the client has gone
 * (CANCELLED), or the call's deadline is near (DEADLINE_EXCEEDED; the operation goes on). */
int svc_nodeop_wait(gw_call *call, pv_redis *r, const pv_keys *k, const char *id, pv_op *rec,
                    pv_status *st);

#endif
