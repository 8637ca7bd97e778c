/*
 * pv_kinds: every operation kind, the one contract the gateway (which submits operations) and
 * the workers (whose handlers take them by kind) both include, so neither side can spell one
 * the other does not know. A kind is "<area>.<verb>", with "_on_node" for the part of an
 * operation a node's agent runs on the queue node:<name>; operators see these names in
 * ListOperations, the events stream and the logs, so they never change once released.
 */
#ifndef PV_KINDS_H
#define PV_KINDS_H

/* the pipeline's own tests and benchmarks (test_operations) */
#define PV_KIND_TEST_SLEEP "test.sleep"
#define PV_KIND_TEST_FAIL "test.fail"
#define PV_KIND_TEST_FLAKY "test.flaky"

/* ClusterService, on the ops workers */
#define PV_KIND_CORDON "node.cordon"
#define PV_KIND_UNCORDON "node.uncordon"
#define PV_KIND_DRAIN "node.drain"
#define PV_KIND_NODE_REMOVE "node.remove"
#define PV_KIND_CLUSTER_DELETE "cluster.delete"
#define PV_KIND_FAILOVER "node.failover" /* a lost node's HA workloads, recreated elsewhere */
#define PV_KIND_UPGRADE "cluster.upgrade"
/* ... and on a node's agent */
#define PV_KIND_UPGRADE_NODE "node.upgrade_on_node"

/* pb.CoreRPC workloads: the deploy on the ops workers, each node's part on its agent */
#define PV_KIND_DEPLOY "workload.create"
#define PV_KIND_DEPLOY_NODE "workload.create_on_node"
#define PV_KIND_REMOVE_NODE "workload.remove_on_node"
#define PV_KIND_CONTROL_NODE "workload.control_on_node"
#define PV_KIND_LOG_NODE "workload.log_on_node"
#define PV_KIND_EXEC_NODE "workload.exec_on_node"
#define PV_KIND_REALLOC_NODE "workload.realloc_on_node"
#define PV_KIND_REPLACE_NODE "workload.replace_on_node"
#define PV_KIND_SEND_NODE "workload.send_on_node"
#define PV_KIND_COPY_NODE "workload.copy_on_node"

/* pb.CoreRPC images, networks and the engine pass-through, on a node's agent */
#define PV_KIND_IMAGE_LIST_NODE "image.list_on_node"
#define PV_KIND_IMAGE_REMOVE_NODE "image.remove_on_node"
#define PV_KIND_IMAGE_CACHE_NODE "image.cache_on_node"
#define PV_KIND_IMAGE_BUILD_NODE "image.build_on_node"
#define PV_KIND_NET_LIST_NODE "net.list_on_node"
#define PV_KIND_NET_CONNECT_NODE "net.connect_on_node"
#define PV_KIND_NET_DISCONNECT_NODE "net.disconnect_on_node"
#define PV_KIND_RAW_NODE "raw.on_node"

/* StorageService, on the agent of the pool's node */
#define PV_KIND_POOL_CREATE "storage.pool_create"
#define PV_KIND_POOL_DELETE "storage.pool_delete"
#define PV_KIND_VOLUME_CREATE "storage.volume_create"
#define PV_KIND_VOLUME_RESIZE "storage.volume_resize"
#define PV_KIND_VOLUME_CLONE "storage.volume_clone"
#define PV_KIND_VOLUME_DELETE "storage.volume_delete"
#define PV_KIND_SNAPSHOT_CREATE "storage.snapshot_create"
#define PV_KIND_SNAPSHOT_RESTORE "storage.snapshot_restore"
#define PV_KIND_SNAPSHOT_DELETE "storage.snapshot_delete"

#endif
