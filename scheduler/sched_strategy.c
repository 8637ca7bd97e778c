/*
 * sched_strategy: Eru's deploy strategies as pure functions (see sched_strategy.h).
 *
 * Each strategy is the algorithm of the public Eru core (its strategy package), rewritten so that a
 * plan costs O(n log n) at most: AUTO and GLOBAL pop a binary min-heap once per instance (O(n) to
 * build, O(log n) per instance), FILL, EACH and DRAINED sort once. Eru's Go sorts and heaps are
 * not stable and its nodes come from a map, so equal nodes come out in any order there; here every
 * comparison ends with the tie keys and then the input position, which makes each order total and
 * each plan the plan of a stable sort of the input taken in (tie, position) order. Messages follow
 * Eru's wrapping: "<detail>: <error text>".
 */
#include "sched_strategy.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_deploy.h"

/* ---- errors ---- */

static const char *kind_text(sched_kind kind) {
    switch (kind) {
    case SCHED_KIND_INSUFFICIENT_RESOURCE:
        return "cannot alloc a plan, not enough resource";
    case SCHED_KIND_INSUFFICIENT_CAPACITY:
        return "cannot alloc a plan, not enough nodes capacity";
    case SCHED_KIND_ALREADY_FILLED:
        return "cannot alloc a fill node plan, each node has enough workloads";
    case SCHED_KIND_INVALID_STRATEGY:
        return "deploy method not support yet";
    case SCHED_KIND_INVALID_COUNT:
        return "invalid deploy count";
    case SCHED_KIND_NO_MEMORY:
        return "out of memory";
    case SCHED_KIND_NONE:
        break;
    }
    return "";
}

static int kind_code(sched_kind kind) {
    switch (kind) {
    case SCHED_KIND_INSUFFICIENT_RESOURCE:
    case SCHED_KIND_INSUFFICIENT_CAPACITY:
    case SCHED_KIND_NO_MEMORY:
        return PV_RESOURCE_EXHAUSTED;
    case SCHED_KIND_ALREADY_FILLED:
        return PV_FAILED_PRECONDITION;
    case SCHED_KIND_INVALID_STRATEGY:
    case SCHED_KIND_INVALID_COUNT:
        return PV_INVALID_ARGUMENT;
    case SCHED_KIND_NONE:
        break;
    }
    return PV_OK;
}

const char *sched_kind_name(sched_kind kind) {
    switch (kind) {
    case SCHED_KIND_INSUFFICIENT_RESOURCE:
        return "ErrInsufficientResource";
    case SCHED_KIND_INSUFFICIENT_CAPACITY:
        return "ErrInsufficientCapacity";
    case SCHED_KIND_ALREADY_FILLED:
        return "ErrAlreadyFilled";
    case SCHED_KIND_INVALID_STRATEGY:
        return "ErrInvaildDeployStrategy";
    case SCHED_KIND_INVALID_COUNT:
        return "ErrInvaildDeployCount";
    case SCHED_KIND_NO_MEMORY:
        return "ErrNoMemory";
    case SCHED_KIND_NONE:
        break;
    }
    return "";
}

/* Fills err with kind and "<detail>: <kind text>" (just the kind text when fmt is NULL). */
__attribute__((format(printf, 3, 4))) static int set_error(sched_error *err, sched_kind kind,
                                                           const char *fmt, ...) {
    char detail[PV_STATUS_MSG_MAX];
    detail[0] = '\0';
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
    }
    int code = kind_code(kind);
    if (err) {
        err->kind = kind;
        if (detail[0])
            pv_status_set(&err->status, code, "%s: %s", detail, kind_text(kind));
        else
            pv_status_set(&err->status, code, "%s", kind_text(kind));
    }
    return code;
}

/* Eru's "not enough resource": what was asked and what could be placed. */
static int insufficient(sched_error *err, int64_t need, int64_t available) {
    return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE, "need: %lld, available: %lld",
                     (long long)need, (long long)available);
}

static void clear_error(sched_error *err) {
    if (err) {
        err->kind = SCHED_KIND_NONE;
        pv_status_clear(&err->status);
    }
}

/* ---- plans ---- */

static int plan_alloc(sched_plan *plan, size_t n, sched_error *err) {
    memset(plan, 0, sizeof *plan);
    /* One block: deploy[n] then listed[n]; at least one byte so an empty plan is still owned. */
    size_t bytes = n * (sizeof(int64_t) + 1);
    void *block = calloc(1, bytes ? bytes : 1);
    if (!block) return set_error(err, SCHED_KIND_NO_MEMORY, "plan over %zu nodes", n);
    plan->n = n;
    plan->deploy = block;
    plan->listed = (uint8_t *)(plan->deploy + n);
    return PV_OK;
}

void sched_plan_free(sched_plan *plan) {
    if (!plan) return;
    free(plan->deploy);
    memset(plan, 0, sizeof *plan);
}

static void plan_add(sched_plan *plan, size_t i, int64_t k) {
    plan->deploy[i] += k;
    plan->listed[i] = 1;
    plan->total += k;
}

static void *alloc_array(size_t n, size_t size, sched_error *err) {
    void *p = malloc(n ? n * size : 1);
    if (!p) set_error(err, SCHED_KIND_NO_MEMORY, "work array of %zu nodes", n);
    return p;
}

int64_t sched_total(const sched_node *nodes, size_t n) {
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (nodes[i].capacity <= 0) continue;
        if (total > INT64_MAX - nodes[i].capacity) return INT64_MAX;
        total += nodes[i].capacity;
    }
    return total;
}

int sched_strategy_parse(const char *name) {
    static const struct {
        const char *name;
        int value;
    } k_names[] = {{"AUTO", SCHED_AUTO},     {"FILL", SCHED_FILL},       {"EACH", SCHED_EACH},
                   {"GLOBAL", SCHED_GLOBAL}, {"DRAINED", SCHED_DRAINED}, {"DUMMY", SCHED_DUMMY}};
    if (!name) return -1;
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++)
        if (strcmp(name, k_names[i].name) == 0) return k_names[i].value;
    return -1;
}

/* ---- ties ---- */

uint64_t sched_seed_of(const char *request_id) {
    uint64_t h = 14695981039346656037u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)(request_id ? request_id : ""); *p; p++)
        h = (h ^ *p) * 1099511628211u;
    return h ? h : 1;
}

/* splitmix64's finaliser: every bit of x moves every bit of the result. */
static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15u;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return x ^ (x >> 31);
}

uint64_t sched_name_key(const char *name) {
    return mix(sched_seed_of(name));
}

uint64_t sched_tie(uint64_t seed, uint64_t name_key) {
    return seed ? mix(seed ^ name_key) : 0;
}

void sched_ties_seed(sched_node *nodes, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++)
        nodes[i].tie = sched_tie(seed, sched_name_key(nodes[i].name));
}

/* ---- a binary min-heap of work items, ordered by a total "less" ---- */

typedef struct item {
    int64_t count;
    int64_t capacity;
    double usage;
    double rate;
    uint64_t tie; /* then the tie key */
    size_t idx;   /* and the input position: the last tie-break */
} item;

/* The order of items that compare equal otherwise: -1, 1 (never 0 for two items). */
static int tie_cmp(const item *a, const item *b) {
    if (a->tie != b->tie) return a->tie < b->tie ? -1 : 1;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

typedef int (*item_less)(const item *a, const item *b);

static void heap_down(item *h, size_t m, size_t i, item_less less) {
    item x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && less(&h[c + 1], &h[c])) c++;
        if (!less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heap_build(item *h, size_t m, item_less less) {
    for (size_t i = m / 2; i-- > 0;)
        heap_down(h, m, i, less);
}

/* Eru's CommunismPlan: fewest instances first, then the most room. */
static int auto_less(const item *a, const item *b) {
    if (a->count != b->count) return a->count < b->count;
    if (a->capacity != b->capacity) return a->capacity > b->capacity;
    return tie_cmp(a, b) < 0;
}

/* Eru's GlobalPlan: the lowest usage after one more instance first. */
static int global_less(const item *a, const item *b) {
    double ka = a->usage + a->rate, kb = b->usage + b->rate;
    if (ka != kb) return ka < kb;
    return tie_cmp(a, b) < 0;
}

/* ---- AUTO ---- */

static int auto_admits(const item *it, int64_t limit) {
    return it->capacity > 0 && (limit <= 0 || it->count < limit);
}

int sched_auto(const sched_node *nodes, size_t n, int64_t need, int64_t total, int64_t limit,
               sched_plan *plan, sched_error *err) {
    memset(plan, 0, sizeof *plan);
    if (total < need) return insufficient(err, need, total);
    item *h = alloc_array(n, sizeof *h, err);
    if (!h) return PV_RESOURCE_EXHAUSTED;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        item it = {
            .count = nodes[i].count, .capacity = nodes[i].capacity, .tie = nodes[i].tie, .idx = i};
        if (auto_admits(&it, limit)) h[m++] = it;
    }
    int rc = plan_alloc(plan, n, err);
    if (rc != PV_OK) {
        free(h);
        return rc;
    }
    heap_build(h, m, auto_less);
    int64_t placed = 0;
    while (placed < need) {
        if (m == 0) {
            free(h);
            sched_plan_free(plan);
            if (limit > 0)
                return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE,
                                 "reached nodelimit, a node can host at most %lld instances",
                                 (long long)limit);
            /* Without a limit only a `total` larger than the real room gets here. */
            return insufficient(err, need, placed);
        }
        plan_add(plan, h[0].idx, 1);
        placed++;
        h[0].count++;
        h[0].capacity--;
        if (!auto_admits(&h[0], limit)) h[0] = h[--m];
        heap_down(h, m, 0, auto_less);
    }
    free(h);
    clear_error(err);
    return PV_OK;
}

/* ---- GLOBAL ---- */

int sched_global(const sched_node *nodes, size_t n, int64_t need, int64_t total, sched_plan *plan,
                 sched_error *err) {
    memset(plan, 0, sizeof *plan);
    if (total < need) return insufficient(err, need, total);
    item *h = alloc_array(n, sizeof *h, err);
    if (!h) return PV_RESOURCE_EXHAUSTED;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].capacity > 0)
            h[m++] = (item){.capacity = nodes[i].capacity,
                            .usage = nodes[i].usage,
                            .rate = nodes[i].rate,
                            .tie = nodes[i].tie,
                            .idx = i};
    int rc = plan_alloc(plan, n, err);
    if (rc != PV_OK) {
        free(h);
        return rc;
    }
    heap_build(h, m, global_less);
    for (int64_t placed = 0; placed < need; placed++) {
        if (m == 0) {
            free(h);
            sched_plan_free(plan);
            return insufficient(err, need, placed);
        }
        plan_add(plan, h[0].idx, 1);
        h[0].usage += h[0].rate;
        h[0].capacity--;
        if (h[0].capacity <= 0) h[0] = h[--m];
        heap_down(h, m, 0, global_less);
    }
    free(h);
    clear_error(err);
    return PV_OK;
}

/* ---- sorted strategies: FILL, EACH, DRAINED ---- */

static int fill_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->count != b->count) return a->count > b->count ? -1 : 1;             /* count desc */
    if (a->capacity != b->capacity) return a->capacity > b->capacity ? -1 : 1; /* capacity desc */
    return tie_cmp(a, b);
}

static int each_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->capacity != b->capacity) return a->capacity > b->capacity ? -1 : 1; /* capacity desc */
    return tie_cmp(a, b);
}

static int drained_cmp(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->capacity != b->capacity) return a->capacity < b->capacity ? -1 : 1; /* capacity asc */
    if (a->usage != b->usage) return a->usage > b->usage ? -1 : 1;             /* usage desc */
    return tie_cmp(a, b);
}

/* Copies the nodes into work items sorted by cmp; NULL (err set) when out of memory. */
static item *sorted_items(const sched_node *nodes, size_t n, int (*cmp)(const void *, const void *),
                          sched_error *err) {
    item *v = alloc_array(n, sizeof *v, err);
    if (!v) return NULL;
    for (size_t i = 0; i < n; i++)
        v[i] = (item){.count = nodes[i].count,
                      .capacity = nodes[i].capacity,
                      .usage = nodes[i].usage,
                      .rate = nodes[i].rate,
                      .tie = nodes[i].tie,
                      .idx = i};
    if (n > 1) qsort(v, n, sizeof *v, cmp);
    return v;
}

int sched_fill(const sched_node *nodes, size_t n, int64_t need, int64_t limit, sched_plan *plan,
               sched_error *err) {
    memset(plan, 0, sizeof *plan);
    if (limit <= 0) limit = (int64_t)n;
    if ((int64_t)n < limit)
        return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE,
                         "node len %zu cannot alloc a fill node plan", n);
    item *v = sorted_items(nodes, n, fill_cmp, err);
    if (!v) return PV_RESOURCE_EXHAUSTED;
    int rc = plan_alloc(plan, n, err);
    if (rc != PV_OK) {
        free(v);
        return rc;
    }
    int64_t remain = limit;
    for (size_t k = 0; k < n; k++) {
        /* count + capacity >= need, written so that it cannot overflow */
        if (v[k].capacity < need - v[k].count) continue;
        int64_t add = need - v[k].count;
        plan_add(plan, v[k].idx, add > 0 ? add : 0);
        if (--remain == 0) {
            free(v);
            if (plan->total == 0) {
                sched_plan_free(plan);
                return set_error(err, SCHED_KIND_ALREADY_FILLED, NULL);
            }
            clear_error(err);
            return PV_OK;
        }
    }
    free(v);
    sched_plan_free(plan);
    return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE,
                     "not enough nodes that can fill up to %lld instances, require %lld nodes",
                     (long long)need, (long long)remain);
}

int sched_each(const sched_node *nodes, size_t n, int64_t need, int64_t limit, sched_plan *plan,
               sched_error *err) {
    memset(plan, 0, sizeof *plan);
    if (limit <= 0) limit = (int64_t)n;
    if ((int64_t)n < limit)
        return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE,
                         "node len %zu < limit, cannot alloc an average node plan", n);
    item *v = sorted_items(nodes, n, each_cmp, err);
    if (!v) return PV_RESOURCE_EXHAUSTED;
    size_t p = 0; /* nodes with room for `need` more: a prefix of the sorted order */
    while (p < n && v[p].capacity >= need)
        p++;
    if (p == 0) {
        free(v);
        return set_error(err, SCHED_KIND_INSUFFICIENT_CAPACITY,
                         "insufficient nodes, at least 1 needed");
    }
    if ((int64_t)p < limit) {
        free(v);
        return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE,
                         "not enough nodes with capacity of %lld, require %lld nodes",
                         (long long)need, (long long)limit);
    }
    int rc = plan_alloc(plan, n, err);
    if (rc == PV_OK) {
        for (int64_t k = 0; k < limit; k++)
            plan_add(plan, v[k].idx, need);
        clear_error(err);
    }
    free(v);
    return rc;
}

int sched_drained(const sched_node *nodes, size_t n, int64_t need, int64_t total, sched_plan *plan,
                  sched_error *err) {
    memset(plan, 0, sizeof *plan);
    if (total < need) return insufficient(err, need, total);
    item *v = sorted_items(nodes, n, drained_cmp, err);
    if (!v) return PV_RESOURCE_EXHAUSTED;
    int rc = plan_alloc(plan, n, err);
    if (rc != PV_OK) {
        free(v);
        return rc;
    }
    int64_t left = need;
    for (size_t k = 0; k < n && left > 0; k++) {
        if (v[k].capacity <= 0) continue;
        int64_t add = left < v[k].capacity ? left : v[k].capacity;
        plan_add(plan, v[k].idx, add);
        left -= add;
    }
    free(v);
    if (left > 0) {
        sched_plan_free(plan);
        return insufficient(err, need, need - left);
    }
    clear_error(err);
    return PV_OK;
}

/* ---- DUMMY and the dispatcher ---- */

int sched_dummy(const sched_node *nodes, size_t n, sched_plan *plan, sched_error *err) {
    int rc = plan_alloc(plan, n, err);
    if (rc != PV_OK) return rc;
    for (size_t i = 0; i < n; i++) {
        int64_t c = nodes[i].capacity > 0 ? nodes[i].capacity : 0;
        plan->deploy[i] = c;
        plan->listed[i] = 1;
    }
    plan->total = sched_total(nodes, n);
    if (plan->total <= 0) {
        sched_plan_free(plan);
        return set_error(err, SCHED_KIND_INSUFFICIENT_RESOURCE,
                         "no node meets all the resource requirements at the same time");
    }
    clear_error(err);
    return PV_OK;
}

int sched_plan_make(int strategy, const sched_node *nodes, size_t n, int64_t need, int64_t total,
                    int64_t limit, sched_plan *plan, sched_error *err) {
    memset(plan, 0, sizeof *plan);
    if (limit < 0) limit = 0;
    switch (strategy) {
    case SCHED_AUTO:
    case SCHED_FILL:
    case SCHED_EACH:
    case SCHED_GLOBAL:
    case SCHED_DRAINED:
        break;
    case SCHED_DUMMY:
        return set_error(err, SCHED_KIND_INVALID_STRATEGY, "strategy: DUMMY");
    default:
        return set_error(err, SCHED_KIND_INVALID_STRATEGY, "strategy: %d", strategy);
    }
    if (need <= 0) return set_error(err, SCHED_KIND_INVALID_COUNT, "count: %lld", (long long)need);
    if (need > PV_DEPLOY_MAX_COUNT)
        return set_error(err, SCHED_KIND_INVALID_COUNT,
                         "count: %lld is more than one plan places (%d)", (long long)need,
                         PV_DEPLOY_MAX_COUNT);
    switch (strategy) {
    case SCHED_AUTO:
        return sched_auto(nodes, n, need, total, limit, plan, err);
    case SCHED_FILL:
        return sched_fill(nodes, n, need, limit, plan, err);
    case SCHED_EACH:
        return sched_each(nodes, n, need, limit, plan, err);
    case SCHED_GLOBAL:
        return sched_global(nodes, n, need, total, plan, err);
    default:
        return sched_drained(nodes, n, need, total, plan, err);
    }
}
