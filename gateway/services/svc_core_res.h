/*
 * svc_core_res: the resource side of pb.CoreRPC: CalculateCapacity (asked of a scheduler
 * through Redis, shared/pv_sched.h), GetNodeResource and GetPodResource (read from the registry
 * and the reservations, shared/pv_resv.h).
 *
 * Ownership: svc_core_res_new allocates, svc_core_res_free frees; the methods registered point
 * into it, so it outlives the server.
 */
#ifndef SVC_CORE_RES_H
#define SVC_CORE_RES_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_res svc_core_res;

svc_core_res *svc_core_res_new(gw_app *app);
void svc_core_res_free(svc_core_res *s);

/* Registers CalculateCapacity, GetNodeResource and GetPodResource. Returns 0 or -1. */
int svc_core_res_register(svc_core_res *s, gw_server *server);

#endif
