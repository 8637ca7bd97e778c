/*
 * svc_core: pb.CoreRPC, the Eru core API (seed 001), as far as this build serves it.
 *
 * Served now: Info, WatchServiceStatus, and the pods and nodes of the registry (shared/
 * pv_registry): AddPod, RemovePod, GetPod, ListPods, AddNode, RemoveNode, ListPodNodes, GetNode,
 * GetNodeEngineInfo, SetNode, SetNodeStatus, GetNodeStatus, NodeStatusStream. Failures answer
 * Eru's per-call codes (shared/eru NOTES: AddPod 1021, ...; svc_eru.h). The resource calls are
 * svc_core_res (CalculateCapacity, GetNodeResource, GetPodResource) and the workload statuses
 * svc_core_wl. Every other CoreRPC method answers UNIMPLEMENTED through the server's
 * unknown-method path until its issue lands.
 *
 * NodeStatusStream needs Redis keyspace notifications for the alive keys
 * (PV_REGISTRY_NOTIFY_FLAGS): the watcher thread adds them with CONFIG SET when they are missing
 * and says so in the log.
 */
#ifndef SVC_CORE_H
#define SVC_CORE_H

#include "gw_app.h"
#include "gw_server.h"
#include "pv_redis.h"

typedef struct svc_core svc_core;

svc_core *svc_core_new(gw_app *app);
void svc_core_free(svc_core *s);

/* Registers the served methods, starts the liveness watcher thread (it connects to Redis by
 * itself and keeps trying) and registers a shutdown hook that ends the WatchServiceStatus and
 * NodeStatusStream streams and stops the watcher. Returns 0 or -1. */
int svc_core_register(svc_core *s, gw_server *server);

/* Presence tick (runs on the presence thread after each heartbeat): reads the live gateway set
 * and pushes it to every WatchServiceStatus stream. */
void svc_core_presence_tick(void *arg, pv_redis *r);

#endif
