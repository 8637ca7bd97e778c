/*
 * gw_app: the state of one pivirt-gateway process, shared by its services.
 *
 * The gateway holds no state of its own beyond this: everything durable is in Redis, so any
 * number of gateways run side by side. Each completion-queue thread has its own Redis
 * connection (hiredis contexts are not thread-safe), reached with gw_app_redis.
 */
#ifndef GW_APP_H
#define GW_APP_H

#include "gw_server.h"
#include "pv_config.h"
#include "pv_keys.h"
#include "pv_op.h"
#include "pv_redis.h"

typedef struct gw_app {
    pv_config cfg;
    pv_keys keys;
    char instance[128];    /* "<host>-<pid>": this gateway among its peers */
    char identifier[65];   /* SHA-256 of the store settings (CoreRPC.Info) */
    const char *advertise; /* the address peers and clients are told about */
} gw_app;

/* The calling pool thread's Redis connection (made on first use, reconnecting by itself). */
pv_redis *gw_app_redis(gw_call *call);

/* Makes the operation req will submit count against the calling client's bound on unfinished
 * operations (gateway.max_pending_ops_per_client): sets req's client fields. For operations a
 * client asked for, not the parts the gateway splits a call into. The strings stay the call's. */
void gw_app_count_client(gw_call *call, pv_op_submit_req *req);

#endif
