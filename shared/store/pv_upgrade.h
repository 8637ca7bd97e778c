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
 * in this order (a node may also hold "hooked": true once its pre-upgrade hook ran, and
 * "drained": {"moved", "removed", "left"}). The numbers of phases, node states and strategy
 * types are those of the cluster API's enums. The record is a pv_upgrade_rec, decoded and
 * encoded by pv_record through its schemas: a damaged field is PV_DATA_LOSS naming the key and
 * the field ("<key> nodes[2]" for a node's), and fields this build does not know are kept.
 *
 * Ownership: a pv_upgrade_rec owns its strings, nodes and JSON values; pv_upgrade_rec_free
 * releases them.
 */
#ifndef PV_UPGRADE_H
#define PV_UPGRADE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_keys.h"
#include "pv_record.h"
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

typedef struct pv_upgrade_node {
    char *id, *name;
    int state; /* pv_node_upgrade_state */
    char *message;
    int batch; /* 0: kept at the old version by the partition */
    bool was_cordoned;
    int64_t started_ms, finished_ms; /* 0: not yet */
    bool hooked;                     /* optional: its pre-upgrade hook ran */
    json_t *drained;                 /* optional: what its drain did, NULL before */
    json_t *extra;
} pv_upgrade_node;

typedef struct pv_upgrade_rec {
    char *cluster_id, *operation_id;
    int phase; /* pv_upgrade_phase */
    char *from, *to;
    bool downgrade;
    pv_upgrade_strategy strategy;
    json_t *strategy_extra; /* the strategy's fields this build does not know */
    char *message;
    int64_t started_ms, updated_ms, finished_ms;
    pv_upgrade_node *nodes; /* n_nodes, in name order */
    size_t n_nodes;
    json_t *extra;
} pv_upgrade_rec;

void pv_upgrade_rec_free(pv_upgrade_rec *rec);

/* Fills *out (zeroed first) with a new record in phase PENDING for the nodes names[0..n) (name
 * order; ids alongside; cordoned[i]: the node was cordoned before, and stays so), every node
 * PENDING or SKIPPED with its batch. 0, or -1 out of memory (*out left zeroed). */
int pv_upgrade_new_record(const char *op_id, const char *cluster_id, const char *from,
                          const char *to, const pv_upgrade_strategy *s, const char *const *ids,
                          const char *const *names, const bool *cordoned, size_t n, int64_t now_ms,
                          pv_upgrade_rec *out);

/* pv_upgrade_new_record for the cluster's nodes as the registry lists them (name order; a node
 * cordoned has bypass set). 0, or -1 out of memory (*out left zeroed). */
int pv_upgrade_new_record_of(const char *op_id, const char *cluster_id, const char *from,
                             const char *to, const pv_upgrade_strategy *s, const pv_node *nodes,
                             size_t n, int64_t now_ms, pv_upgrade_rec *out);

/* The record's document, as pv_upgrade_put stores it (compact, its fields in the order above);
 * the caller frees it. NULL out of memory. */
char *pv_upgrade_dumps(const pv_upgrade_rec *rec);

/* Fills *out (zeroed first). NOT_FOUND "cluster <id> has never been upgraded" when there is no
 * record; DATA_LOSS naming the key and field of a damaged one. */
int pv_upgrade_get(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_upgrade_rec *out,
                   pv_status *st);

/* Stores rec (its updated_ms set to now first). */
int pv_upgrade_put(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_upgrade_rec *rec,
                   pv_status *st);

/* Forgets the cluster's record (DeleteCluster). Missing is fine. */
int pv_upgrade_delete(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_status *st);

#endif
