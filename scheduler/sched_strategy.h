/*
 * sched_strategy: Eru's deploy strategies (AUTO, FILL, EACH, GLOBAL, DRAINED) and DUMMY, as pure
 * functions over an array of nodes. No Redis, no globals, no logging: the same input always gives
 * the same plan, because every order used (sorts and heaps) is total: nodes that compare equal
 * go by their tie keys, then by input position.
 *
 * Ties: Eru ranges over a Go map, so nodes that tie come out in an order that changes from call
 * to call and repeated deploys spread over them. Here a request seeds the tie keys
 * (sched_ties_seed): different requests break ties in different orders, the same request (a
 * redelivery) in the same one. With every tie key 0 the input order decides, which is what the
 * reference cases and the plan CLI use. Either way a plan is the plan of the input taken in one
 * order (by tie key, then position), so it is always one Eru's algorithm gives for some order of
 * the nodes.
 *
 * Ownership: the nodes (and their names) are borrowed, read only, never kept. On PV_OK *plan owns
 * one allocation the caller releases with sched_plan_free(). On failure *plan is left empty
 * (sched_plan_free on it is harmless) and *err says why. Nothing else is allocated.
 */
#ifndef SCHED_STRATEGY_H
#define SCHED_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "pb/core.pb-c.h"
#include "pv_status.h"

/* The numbers of pb DeployOptions.Strategy, as the generated code names them. */
#define SCHED_AUTO PB__DEPLOY_OPTIONS__STRATEGY__AUTO
#define SCHED_FILL PB__DEPLOY_OPTIONS__STRATEGY__FILL
#define SCHED_EACH PB__DEPLOY_OPTIONS__STRATEGY__EACH
#define SCHED_GLOBAL PB__DEPLOY_OPTIONS__STRATEGY__GLOBAL
#define SCHED_DRAINED PB__DEPLOY_OPTIONS__STRATEGY__DRAINED
#define SCHED_DUMMY PB__DEPLOY_OPTIONS__STRATEGY__DUMMY

typedef struct sched_node {
    const char *name; /* borrowed */
    int64_t capacity; /* how many more instances fit; <= 0 means none */
    int64_t count;    /* instances already there */
    double usage;     /* GLOBAL and DRAINED: share of the main resource in use */
    double rate;      /* GLOBAL: share one more instance takes */
    uint64_t tie;     /* among nodes that compare equal the lower goes first (then position) */
} sched_node;

/* Eru's error kinds (names as Eru spells them, typos included). */
typedef enum sched_kind {
    SCHED_KIND_NONE = 0,
    SCHED_KIND_INSUFFICIENT_RESOURCE, /* ErrInsufficientResource */
    SCHED_KIND_INSUFFICIENT_CAPACITY, /* ErrInsufficientCapacity */
    SCHED_KIND_ALREADY_FILLED,        /* ErrAlreadyFilled */
    SCHED_KIND_INVALID_STRATEGY,      /* ErrInvaildDeployStrategy */
    SCHED_KIND_INVALID_COUNT,         /* ErrInvaildDeployCount */
    SCHED_KIND_NO_MEMORY,             /* ErrNoMemory (ours) */
} sched_kind;

typedef struct sched_error {
    sched_kind kind;
    pv_status status; /* code (RESOURCE_EXHAUSTED, INVALID_ARGUMENT, ...) and Eru's message */
} sched_error;

typedef struct sched_plan {
    size_t n;        /* number of input nodes */
    int64_t *deploy; /* deploy[i]: instances added on nodes[i] (DUMMY: its capacity) */
    uint8_t *listed; /* listed[i]: nodes[i] is named by the plan (FILL names zeros too) */
    int64_t total;   /* sum of deploy */
} sched_plan;

/* "AUTO", "FILL", "EACH", "GLOBAL", "DRAINED", "DUMMY" → the number; -1 for anything else. */
int sched_strategy_parse(const char *name);

/* "ErrInsufficientResource", ...; "" for SCHED_KIND_NONE. Static storage. */
const char *sched_kind_name(sched_kind kind);

/* A request's seed: FNV-1a of its id (never 0, which means "input order"). */
uint64_t sched_seed_of(const char *request_id);

/* Sets every node's tie key from seed and its name (a keyed hash: the same node gets the same
 * key for the same seed whichever other nodes take part); seed 0 sets them all to 0. */
void sched_ties_seed(sched_node *nodes, size_t n, uint64_t seed);

/* sched_ties_seed in two steps, for callers that keep each node's name key between plans instead
 * of hashing every name of a large pod again: a node's tie key is sched_tie(seed, its key). */
uint64_t sched_name_key(const char *name);
uint64_t sched_tie(uint64_t seed, uint64_t name_key);

/* Sum of the positive capacities, saturating at INT64_MAX: the `total` Eru's callers pass. */
int64_t sched_total(const sched_node *nodes, size_t n);

/*
 * Plans `need` instances with `strategy` as Eru's strategy.Deploy does: an unknown strategy (DUMMY
 * included: it only exists for CalculateCapacity) fails first, then need <= 0. `total` is taken
 * as given (Eru's callers pass the sum of capacities). limit < 0 counts as 0.
 */
int sched_plan_make(int strategy, const sched_node *nodes, size_t n, int64_t need, int64_t total,
                    int64_t limit, sched_plan *plan, sched_error *err);

/* The strategies themselves (need > 0 is the caller's check, as in Eru). */
int sched_auto(const sched_node *nodes, size_t n, int64_t need, int64_t total, int64_t limit,
               sched_plan *plan, sched_error *err);
int sched_fill(const sched_node *nodes, size_t n, int64_t need, int64_t limit, sched_plan *plan,
               sched_error *err);
int sched_each(const sched_node *nodes, size_t n, int64_t need, int64_t limit, sched_plan *plan,
               sched_error *err);
int sched_global(const sched_node *nodes, size_t n, int64_t need, int64_t total, sched_plan *plan,
                 sched_error *err);
int sched_drained(const sched_node *nodes, size_t n, int64_t need, int64_t total, sched_plan *plan,
                  sched_error *err);

/* CalculateCapacity with DUMMY: every node listed with its capacity (negative as 0), the sum in
 * plan->total; a sum <= 0 fails with ErrInsufficientResource. */
int sched_dummy(const sched_node *nodes, size_t n, sched_plan *plan, sched_error *err);

/* Frees what a plan owns and empties it. NULL and empty plans are fine. */
void sched_plan_free(sched_plan *plan);

#endif
