/*
 * gw_app: per-thread Redis connections for the gateway's handlers.
 */
#include "gw_app.h"

#include <stdlib.h>

#include "pv_log.h"

pv_redis *gw_app_redis(gw_call *call) {
    return gw_call_thread_state(call);
}

void gw_app_count_client(gw_call *call, pv_op_submit_req *req) {
    const gw_app *app = gw_call_app(call);
    req->client = gw_call_client(call);
    req->client_max_pending = app->cfg.gateway.max_pending_ops_per_client;
    req->limit_name = "gateway.max_pending_ops_per_client";
}
