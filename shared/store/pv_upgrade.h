/*
 * pv_upgrade: what a cluster upgrade (ClusterService's UpgradeCluster) is made of, away from
 * gRPC and from the workers: the order in which nodes go (batches per strategy), version
 * comparison, and the upgrade's status record that GetUpgradeStatus reads.
 *
 * The record is one JSON document per cluster, written only by the worker running the
 * cluster's upgrade (which holds the cluster) and kept until the next upgrade replaces it or the
 * cluster is deleted:
 *   <prefix>{reg}:upgrade:<cluster id>   string: {"cluster_id", "operation_id", "phase" (a
 *     pv_upgrade_phase), "from", "to", "downgrade", "strategy": {"type", "max_surge",
 *     "max_unavailable", "partition"}, "nodes": [{"id", "name", "state" (pv_node_upgrade_state),
 *     "message", "batch", "was_cordoned", "started_ms", "finished_ms"}] in name order,
 *     "message", "started_ms", "updated_ms", "finished_ms"}
 * The numbers of phases, node states and strategy types are those of the cluster API's enums.
 *
 * Ownership: pv_upgrade_get hands the caller a json_t reference (json_decref it).
 */
#ifndef PV_UPGRADE_H
#define PV_UPGRADE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_status.h"

typedef enum {
    PV_UPGRADE_PENDING = 1,
    PV_UPGRADE_UPGRADING = 2,
    PV_UPGRADE_VERIFYING = 3,
    PV_UPGRADE_MIGRATING = 4,
    PV_UPGRADE_ROLLING_BACK = 5,
    PV_UPGRADE_SUCCEEDED = 6,
    PV_UPGRADE_ROLLED_BACK = 7,
    PV_UPGRADE_CANCELLED = 8,
    PV_UPGRADE_FAILED = 9,
} pv_upgrade_phase;

typedef enum {
    PV_NODE_UPGRADE_PENDING = 1,
    PV_NODE_UPGRADE_DRAINING = 2,
    PV_NODE_UPGRADE_UPGRADING = 3,
    PV_NODE_UPGRADE_UPGRADED = 4,
    PV_NODE_UPGRADE_FAILED = 5,
    PV_NODE_UPGRADE_ROLLING_BACK = 6,
    PV_NODE_UPGRADE_ROLLED_BACK = 7,
    PV_NODE_UPGRADE_SKIPPED = 8,
} pv_node_upgrade_state;

typedef enum {
    PV_UPGRADE_ROLLING = 1,
    PV_UPGRADE_BLUE_GREEN = 2,
    PV_UPGRADE_CANARY = 3,
} pv_upgrade_type;

typedef struct pv_upgrade_strategy {
    pv_upgrade_type type; /* 0 is taken as ROLLING */
    int max_surge, max_unavailable, partition;
} pv_upgrade_strategy;

/* The batch of each of n nodes in name order (batch has n slots): 0 for the first `partition`
 * nodes, which stay at the old version; then ROLLING: groups of max(1, max_unavailable) from 1;
 * CANARY: the first upgradable node alone in batch 1, then groups as ROLLING; BLUE_GREEN: the
 * first half (rounded up) of the upgradable nodes in batch 1, the rest in batch 2. *nbatches
 * gets the number of batches (0 when the partition keeps every node). */
void pv_upgrade_batches(const pv_upgrade_strategy *s, size_t n, int *batch, int *nbatches);

/* A strategy's counts against the cluster's n nodes: max_surge, max_unavailable and partition
 * must be 0..n (a count of nodes past the cluster's means nothing, and 2^31-1 is a client's
 * mistake, not a plan). INVALID_ARGUMENT naming "strategy.<field>", the value and n. */
int pv_upgrade_check_strategy(const pv_upgrade_strategy *s, size_t n, pv_status *st);

/* Compares two "vMAJOR.MINOR.PATCH" versions: < 0, 0, > 0. Unparsable text compares as
 * v0.0.0. */
int pv_version_compare(const char *a, const char *b);

/* SUCCEEDED, ROLLED_BACK, CANCELLED, FAILED. */
bool pv_upgrade_phase_done(int phase);

/* A new record in phase PENDING for the nodes names[0..n) (name order; ids alongside;
 * cordoned[i]: the node was cordoned before, and stays so), every node PENDING or SKIPPED
 * with its batch. NULL when out of memory. */
json_t *pv_upgrade_new_record(const char *op_id, const char *cluster_id, const char *from,
                              const char *to, const pv_upgrade_strategy *s, const char *const *ids,
                              const char *const *names, const bool *cordoned, size_t n,
                              int64_t now_ms);

/* pv_upgrade_new_record for the cluster's nodes as the registry lists them (name order; a node
 * cordoned has bypass set). NULL when out of memory. */
json_t *pv_upgrade_new_record_of(const char *op_id, const char *cluster_id, const char *from,
                                 const char *to, const pv_upgrade_strategy *s, const pv_node *nodes,
                                 size_t n, int64_t now_ms);

/* NOT_FOUND "cluster <id> has never been upgraded" when there is no record. */
int pv_upgrade_get(pv_redis *r, const pv_keys *k, const char *cluster_id, json_t **out,
                   pv_status *st);

/* Stores rec (its updated_ms set to now first). */
int pv_upgrade_put(pv_redis *r, const pv_keys *k, const char *cluster_id, json_t *rec,
                   pv_status *st);

/* Forgets the cluster's record (DeleteCluster). Missing is fine. */
int pv_upgrade_delete(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_status *st);

#endif
