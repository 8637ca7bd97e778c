/*
 * gw_app: the state of one pivirt-gateway process, shared by its services, and the one place
 * the gateway submits operations.
 *
 * The gateway holds no state of its own beyond this: everything durable is in Redis, so any
 * number of gateways run side by side. Each completion-queue thread has its own Redis
 * connection (hiredis contexts are not thread-safe), reached with gw_app_redis.
 *
 * Every operation the gateway submits goes through gw_app_submit, so that the options come from
 * one place (the configuration) and every submission counts against its client's bound on
 * unfinished operations (gateway.max_pending_ops_per_client).
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

/* Ends a server-streaming call by rc, once its messages are sent: OK; nothing more when
 * PV_CANCELLED (the client went while they were sent); else st's code and message. */
void gw_app_finish_stream(gw_call *call, int rc, const pv_status *st);

/* The retention and limits every operation is written with (from the configuration). */
pv_op_opts gw_app_op_opts(const gw_app *app);

/* How gw_app_submit treats one submission (flags, or-ed). */
enum {
    /* the client's x-request-id, when it sent one, makes a retry return the same operation */
    GW_SUBMIT_IDEMPOTENT = 1 << 0,
    /* a later part of a call that has submitted an operation already (the second node of a
     * removal, the logs of a RunAndWait, its clean-up): counted, never refused, so that a call
     * is refused whole before it changed anything, never half-way with some nodes asked */
    GW_SUBMIT_PART = 1 << 1,
};

/* Submits req for call's client through the calling thread's connection: sets req's client
 * fields (and with GW_SUBMIT_IDEMPOTENT its request_id), so the operation joins the client's
 * unfinished set and, unless GW_SUBMIT_PART, is refused (PV_RESOURCE_EXHAUSTED, nothing
 * written) when the client has the bound already. No connection: PV_UNAVAILABLE. On PV_OK
 * *out (NULL: not wanted) is the record (pv_op_clear) and *existed (may be NULL) whether it was
 * there already (same request id). req's strings stay the caller's. */
int gw_app_submit(gw_call *call, unsigned flags, pv_op_submit_req *req, pv_op *out, bool *existed,
                  pv_status *st);

/* gw_app_submit without a call: client ("" or NULL: not counted) and request_id (NULL: none)
 * given by the caller; for gw_app_submit and the tests. */
int gw_app_submit_for(const gw_app *app, pv_redis *r, const char *client, const char *request_id,
                      unsigned flags, pv_op_submit_req *req, pv_op *out, bool *existed,
                      pv_status *st);

#endif
