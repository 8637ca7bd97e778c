/*
 * svc_nodeop: one operation on a node's agent (see svc_nodeop.h). The operation is submitted
 * with notify_end, so op_convert_wait blocks on its output stream, whose end entry wakes it the
 * moment the operation ends; the answers that matter are on that stream, read once it ended.
 */
#include "svc_nodeop.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_convert.h"

const char *svc_nodeop_value(const pv_op_output *e, const char *field) {
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->fields[i], field) == 0) return e->values[i];
    return "";
}

int svc_nodeop_submit_req(gw_call *call, const svc_nodeop_req *q, char op_id[PV_ID_MAX],
                          pv_status *st) {
    char *text = json_dumps(q->params, JSON_COMPACT);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char queue[300], target[PV_ID_MAX];
    snprintf(queue, sizeof queue, "node:%s", q->node);
    pv_id_new(q->target_prefix, target, sizeof target);
    pv_op_submit_req req = {.kind = q->kind,
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .max_attempts = q->max_attempts,
                            .notify_end = q->notify_end,
                            .target_unlocked = true}; /* minted just above */
    pv_op rec;
    int rc = gw_app_submit(call, q->flags, &req, &rec, NULL, st);
    free(text);
    if (rc != PV_OK) return rc;
    snprintf(op_id, PV_ID_MAX, "%s", rec.id);
    pv_op_clear(&rec);
    return PV_OK;
}

int svc_nodeop_submit(gw_call *call, const char *node, const char *kind, json_t *params,
                      int max_attempts, char op_id[PV_ID_MAX], pv_status *st) {
    svc_nodeop_req q = {.node = node,
                        .kind = kind,
                        .target_prefix = "nodeop",
                        .params = params,
                        .max_attempts = max_attempts,
                        .notify_end = true};
    return svc_nodeop_submit_req(call, &q, op_id, st);
}

int svc_nodeop_wait(gw_call *call, pv_redis *r, const pv_keys *k, const char *id, pv_op *rec,
                    pv_status *st) {
    /* no bound of its own: the call's deadline or the client's leaving ends the wait */
    if (op_convert_wait(call, r, k, id, INT64_MAX / 2, rec, st) != PV_OK) return st->code;
    if (pv_op_done(rec)) return PV_OK;
    pv_op_clear(rec);
    if (gw_call_is_closed(call)) return pv_status_set(st, PV_CANCELLED, "client gone");
    return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                         "operation %s on the node is still running at the call's deadline", id);
}
