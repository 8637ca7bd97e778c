/*
 * pv_cluster: ClusterService's view of the one registry (see ../shared/DESIGN.md, "One model,
 * three APIs"): a cluster is a pod, a node is the same record CoreRPC's AddNode makes. What the
 * view derives lives here, away from gRPC: a node's status (CORDONED before readiness; READY
 * while its agent's heartbeat key lives), a cluster's status from its nodes and topology, and
 * the checks of ClusterService's own fields (versions, addresses, roles).
 */
#ifndef PV_CLUSTER_H
#define PV_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_status.h"

typedef enum {
    PV_NODE_READY = 1,
    PV_NODE_NOT_READY = 2,
    PV_NODE_DRAINING = 3,
    PV_NODE_CORDONED = 4,
    PV_NODE_ERROR = 5,
} pv_node_state;

typedef enum {
    PV_CLUSTER_CREATING = 1,
    PV_CLUSTER_RUNNING = 2,
    PV_CLUSTER_DEGRADED = 3,
    PV_CLUSTER_ERROR = 4,
    PV_CLUSTER_UPGRADING = 5,
} pv_cluster_state;

/* "vMAJOR.MINOR.PATCH" (numbers without leading zeros); INVALID_ARGUMENT naming field. */
int pv_cluster_check_version(const char *field, const char *v, pv_status *st);

/* The most nodes of one role a cluster's topology may ask for. A count is what the cluster
 * waits for before it is RUNNING: one no registry could hold would keep it CREATING for ever. */
#define PV_CLUSTER_TOPOLOGY_MAX 10000

/* A topology's control_plane_count and worker_count: 0..PV_CLUSTER_TOPOLOGY_MAX each, else
 * INVALID_ARGUMENT naming "topology.<field>" and the value. */
int pv_cluster_check_topology(int64_t control_plane_count, int64_t worker_count, pv_status *st);

/* An IPv4 or IPv6 address; INVALID_ARGUMENT naming field. */
int pv_cluster_check_ip(const char *field, const char *ip, pv_status *st);

/* CORDONED (bypass) before readiness; READY while alive; NOT_READY otherwise. */
pv_node_state pv_cluster_node_state(const pv_node *n);

/* Whether the node is being drained now: an operation that drains it (node.drain, node.remove,
 * cluster.delete) holds it and is RUNNING. Its status then shows DRAINING (before readiness). */
int pv_cluster_node_draining(pv_redis *r, const pv_keys *k, const pv_node *n, bool *draining,
                             pv_status *st);

/* Whether at least one node and the topology's counts of control-plane and worker nodes are up
 * (alive: a cordoned node still counts, it only takes no new work). */
bool pv_cluster_complete(const pv_pod *p, const pv_node *nodes, size_t n);

/* Records formed_ms on every cluster that is complete for the first time (the schedulers' tick
 * runs it, so a cluster nobody read while complete is DEGRADED, not CREATING, when it later
 * loses a node). *count (may be NULL) gets how many it marked. */
int pv_cluster_mark_formed(pv_redis *r, const pv_keys *k, size_t *count, pv_status *st);

/* CREATING until the cluster is complete for the first time (p->formed_ms), then RUNNING while
 * it is complete and every node is up, DEGRADED otherwise. */
pv_cluster_state pv_cluster_state_of(const pv_pod *p, const pv_node *nodes, size_t n);

/* ---- a node's machine: figures and pressure conditions ---- */

/* What a node agent reads from its machine each beat (engine info "machine"). */
typedef struct pv_machine {
    int64_t mem_total, mem_available; /* /proc/meminfo */
    int64_t disk_total, disk_free;    /* the file system of the agent's data directory */
    int64_t tasks, pid_max;           /* /proc/loadavg's task count, kernel.pid_max */
    double cpu_busy_cores;            /* CPU time in use over the last beat, in cores */
    bool network_up;                  /* a non-loopback interface is up with an address */
} pv_machine;

/* Thresholds in percent of use (worker.*_pressure_percent). */
typedef struct pv_pressure_limits {
    int memory, disk, pid;
} pv_pressure_limits;

typedef struct pv_node_conditions {
    bool memory_pressure, disk_pressure, pid_pressure, network_unavailable;
} pv_node_conditions;

/* Pressure where use reaches the threshold; figures that are unknown (0 totals) press nothing. */
void pv_cluster_conditions_of(const pv_machine *m, const pv_pressure_limits *l,
                              pv_node_conditions *out);

/* The conditions an agent reported in its engine info ("conditions"), all false when none. */
void pv_cluster_node_conditions(const pv_node *n, pv_node_conditions *out);

/* Entries of a queue's stream ("ops", "node:<name>") no worker has acknowledged: its group's
 * lag (never delivered) plus its pending entries (delivered, not acknowledged), added to *out.
 * A queue never used has none. */
int pv_cluster_queue_unacked(pv_redis *r, const pv_keys *k, const char *queue, int64_t *out,
                             pv_status *st);

/* ---- health ---- */

typedef enum { PV_HEALTHY = 1, PV_DEGRADED = 2, PV_UNHEALTHY = 3 } pv_health;

/* What GetHealth reports of a cluster: each control-plane component and node with a status and
 * why, and the overall status with the reason that decided it. Owned strings; pv_health_free. */
typedef struct pv_health_item {
    char *name; /* "redis", "gateway <instance>", ...; nodes: the node's name */
    char *node_id;
    pv_health status;
    char *message;
    int64_t last_check_ms;
} pv_health_item;

typedef struct pv_health_report {
    pv_health status;
    char *message;
    pv_health_item *components, *nodes;
    size_t ncomponents, nnodes;
} pv_health_report;

/* Builds the report for pod p from Redis (the caller's connection answered, so Redis is
 * HEALTHY), the live processes (pv_presence) and the pod's nodes. The rules, in order:
 * UNHEALTHY when no ops worker or no scheduler runs (nothing long can happen) or no node of the
 * cluster is up; DEGRADED when a node is down (its agent's heartbeat missing) or cordoned
 * nodes are all that is up; else HEALTHY. */
int pv_cluster_health(pv_redis *r, const pv_keys *k, const pv_pod *p, pv_health_report *out,
                      pv_status *st);
void pv_health_free(pv_health_report *h);

/* ---- metrics ---- */

typedef struct pv_cluster_metrics {
    int nodes_total, nodes_ready, nodes_not_ready, nodes_cordoned;
    int cpu_cores, cpu_used_cores;
    int64_t memory, memory_used, storage, storage_used;
    int workloads;
    int ops_pending, ops_running, ops_succeeded, ops_failed, ops_cancelled;
    int64_t queue_depth;         /* entries not acknowledged on the ops queue and its nodes' */
    double oldest_pending_age_s; /* 0 when nothing is pending */
    int64_t collected_ms;
} pv_cluster_metrics;

/* A node's capacity and use (cores, bytes) from its resources and usage, with its agent's
 * report for what they leave to the machine. */
/* A node's capacity and use: the machine's own figures when its agent reports them (engine info
 * "machine": memory, disk, CPU time in use), else the registered resources and what its
 * workloads hold. */
typedef struct pv_node_capacity {
    int cpu_cores, cpu_used_cores;
    int64_t memory, memory_used, storage, storage_used;
} pv_node_capacity;
void pv_cluster_node_capacity(const pv_node *n, pv_node_capacity *out);

/* GetMetrics' figures for pod p. Operations counted: those whose target is the cluster or one
 * of its nodes (at most the newest 1000 per target, kept ones included); the queue: the entries
 * of the ops queue and of each node's queue that no worker has acknowledged yet (delivered or
 * not). */
int pv_cluster_metrics_of(pv_redis *r, const pv_keys *k, const pv_pod *p, pv_cluster_metrics *out,
                          pv_status *st);

/* Whether the JSON object of strings `have` holds every key/value of `want` (both JSON text;
 * want NULL or "{}" matches everything). */
bool pv_cluster_labels_match(const char *have, const char *want);

#endif
