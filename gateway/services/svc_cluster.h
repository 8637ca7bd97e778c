/*
 * svc_cluster: pivirt.cluster.v1.ClusterService on the one registry (clusters are pods, nodes
 * the same records CoreRPC's AddNode makes). Served: CreateCluster, GetCluster, ListClusters,
 * UpdateCluster, AddNode, GetNode, ListNodes, GetHealth, GetMetrics; CordonNode and
 * UncordonNode answer an Operation an ops worker runs once it ended (or after 5 s as it stands);
 * DrainNode, RemoveNode, DeleteCluster (workers/wk_cluster.h) and UpgradeCluster
 * (workers/wk_upgrade.h) answer theirs at once; GetUpgradeStatus reads the upgrade record
 * (shared/pv_upgrade.h). All 16 calls are served.
 *
 * Clusters and nodes are named by id or by name. Standard gRPC codes; messages name the field.
 *
 * Ownership: svc_cluster_new borrows app (it must outlive the service).
 */
#ifndef SVC_CLUSTER_H
#define SVC_CLUSTER_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_cluster svc_cluster;

svc_cluster *svc_cluster_new(gw_app *app);
void svc_cluster_free(svc_cluster *s);

/* Adds the served methods to server (before gw_server_start). Returns 0 or -1. */
int svc_cluster_register(svc_cluster *s, gw_server *server);

#endif
