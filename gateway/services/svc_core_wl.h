/*
 * svc_core_wl: the workload records and statuses of pb.CoreRPC (shared/pv_workload.h): the reads
 * GetWorkload, GetWorkloads, ListWorkloads, ListNodeWorkloads (each workload with its live
 * status), SetWorkloadsStatus, GetWorkloadsStatus, and WorkloadStatusStream, fed by a
 * gw_node_watch follower of the status keys that starts with the first stream.
 *
 * Ownership: svc_core_wl_new allocates, svc_core_wl_free frees (after the server is shut down);
 * the methods registered point into it, so it outlives the server.
 */
#ifndef SVC_CORE_WL_H
#define SVC_CORE_WL_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_wl svc_core_wl;

svc_core_wl *svc_core_wl_new(gw_app *app);
void svc_core_wl_free(svc_core_wl *s);

/* Registers the calls above, and the shutdown
 * hook that ends the streams. Returns 0 or -1. */
int svc_core_wl_register(svc_core_wl *s, gw_server *server);

#endif
