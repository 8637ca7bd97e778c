/*
 * gw_app: per-thread Redis connections for the gateway's handlers and the one submission path
 * (see gw_app.h).
 */
#include "gw_app.h"

#include <stdlib.h>
#include <string.h>

#include "pv_log.h"

#define LIMIT_NAME "gateway.max_pending_ops_per_client"

pv_redis *gw_app_redis(gw_call *call) {
    return gw_call_thread_state(call);
}

void gw_app_finish_stream(gw_call *call, int rc, const pv_status *st) {
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finish(call, st->code, st->msg);
}

pv_op_opts gw_app_op_opts(const gw_app *app) {
    pv_op_opts o = {.retention_seconds = app->cfg.ops.retention_seconds,
                    .events_maxlen = app->cfg.ops.events_maxlen};
    return o;
}

int gw_app_submit_for(const gw_app *app, pv_redis *r, const char *client, const char *request_id,
                      unsigned flags, pv_op_submit_req *req, pv_op *out, bool *existed,
                      pv_status *st) {
    if (out) memset(out, 0, sizeof *out);
    if (!r) return pv_status_set(st, PV_UNAVAILABLE, "no Redis connection on this gateway thread");
    req->client = client;
    /* A part is counted (the client's set holds it until it ends) but never refused: the call
     * it belongs to was let through, and refusing its second node would leave the first one
     * changed and the call half done. */
    req->client_max_pending =
        flags & GW_SUBMIT_PART ? 0 : app->cfg.gateway.max_pending_ops_per_client;
    req->limit_name = LIMIT_NAME;
    if (flags & GW_SUBMIT_IDEMPOTENT) req->request_id = request_id;
    pv_op_opts oo = gw_app_op_opts(app);
    pv_op rec = {0};
    bool had = false;
    int rc = pv_op_submit(r, &app->keys, &oo, req, &rec, &had, st);
    if (existed) *existed = rc == PV_OK && had;
    if (rc == PV_OK && out)
        *out = rec; /* the caller's now */
    else
        pv_op_clear(&rec);
    return rc;
}

int gw_app_submit(gw_call *call, unsigned flags, pv_op_submit_req *req, pv_op *out, bool *existed,
                  pv_status *st) {
    const char *rid = gw_call_has_client_request_id(call) ? gw_call_request_id(call) : NULL;
    return gw_app_submit_for(gw_call_app(call), gw_app_redis(call), gw_call_client(call), rid,
                             flags, req, out, existed, st);
}
