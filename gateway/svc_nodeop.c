/*
 * svc_nodeop: one operation on a node's agent (see svc_nodeop.h). The operation is submitted
 * with notify_end, so waiting blocks on its output stream, whose end entry wakes the waiter the
 * moment it ends; the answers that matter are on that stream, read once the operation ended.
 */
#include "svc_nodeop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest one blocked read lasts before the record and the client are looked at again. */
#define WAIT_SLICE_MS 250

const char *svc_nodeop_value(const pv_op_output *e, const char *field) {
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->fields[i], field) == 0) return e->values[i];
    return "";
}

int svc_nodeop_submit(gw_app *app, pv_redis *r, const char *node, const char *kind, json_t *params,
                      int max_attempts, char op_id[PV_ID_MAX], pv_status *st) {
    char *text = json_dumps(params, JSON_COMPACT);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char queue[300], target[PV_ID_MAX];
    snprintf(queue, sizeof queue, "node:%s", node);
    pv_id_new("nodeop", target, sizeof target);
    pv_op_submit_req req = {.kind = kind,
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .max_attempts = max_attempts,
                            .notify_end = true};
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    pv_op rec;
    bool existed = false;
    int rc = pv_op_submit(r, &app->keys, &oo, &req, &rec, &existed, st);
    free(text);
    if (rc != PV_OK) return rc;
    snprintf(op_id, PV_ID_MAX, "%s", rec.id);
    pv_op_clear(&rec);
    return PV_OK;
}

int svc_nodeop_wait(gw_call *call, pv_redis *r, const pv_keys *k, const char *id, pv_op *rec,
                    pv_status *st) {
    int slice = WAIT_SLICE_MS, ct = pv_redis_command_timeout_ms(r);
    if (ct > 0 && ct / 2 < slice) slice = ct / 2 > 0 ? ct / 2 : 1;
    char cursor[1][PV_OP_CURSOR_MAX] = {"0"};
    for (;;) {
        if (pv_op_get(r, k, id, rec, st) != PV_OK) return st->code;
        if (pv_op_done(rec)) return PV_OK;
        pv_op_clear(rec);
        if (gw_call_is_closed(call)) return pv_status_set(st, PV_CANCELLED, "client gone");
        bool woke = false;
        if (pv_op_output_wait(r, k, 1, (const char *const[]){id}, cursor, slice, &woke, NULL, st) !=
            PV_OK)
            return st->code;
    }
}
