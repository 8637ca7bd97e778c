/* Fuzz target: the deploy strategies (the planner) on random nodes and requests. Whatever the
 * input, a plan never puts more on a node than its capacity, never a negative count, sums to
 * its total, and gives what was asked (AUTO, GLOBAL and DRAINED: `need` in all; FILL: every node
 * it adds to reaches `need`; EACH: `need` on exactly `limit` nodes); or it fails with one of
 * Eru's errors and an empty plan. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pv_deploy.h"
#include "sched_strategy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_NODES 24
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

/* Reads little integers off the input; zeros once it is used up. */
typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t byte(reader *r) {
    if (r->n == 0) return 0;
    r->n--;
    return *r->p++;
}

/* Mostly small values (where the strategies' branches are), sometimes huge ones (overflow). */
static int64_t amount(reader *r) {
    uint8_t b = byte(r);
    if (b < 0xF0) return (int64_t)b - 8; /* -8..231: negatives too */
    int64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (int64_t)(((uint64_t)v << 8) | byte(r));
    return v;
}

static void check_plan(int strategy, const sched_node *nodes, size_t n, int64_t need, int64_t limit,
                       const sched_plan *plan) {
    CHECK(plan->n == n && (n == 0 || (plan->deploy && plan->listed)));
    int64_t sum = 0, full = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t d = plan->deploy[i];
        CHECK(d >= 0);
        CHECK(d <= (nodes[i].capacity > 0 ? nodes[i].capacity : 0));
        CHECK(!__builtin_add_overflow(sum, d, &sum));
        if (strategy == SCHED_FILL && d > 0) CHECK(nodes[i].count + d == need);
        if (strategy == SCHED_EACH) {
            CHECK(d == 0 || d == need);
            if (d == need) full++;
        }
    }
    CHECK(sum == plan->total);
    if (strategy == SCHED_AUTO || strategy == SCHED_GLOBAL || strategy == SCHED_DRAINED)
        CHECK(plan->total == need);
    if (strategy == SCHED_EACH) CHECK(full == (limit > 0 ? limit : (int64_t)n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    static const int strategies[] = {SCHED_AUTO,    SCHED_FILL,  SCHED_EACH, SCHED_GLOBAL,
                                     SCHED_DRAINED, SCHED_DUMMY, 7};
    int strategy = strategies[byte(&r) % (sizeof strategies / sizeof strategies[0])];
    size_t n = byte(&r) % (MAX_NODES + 1);
    int64_t need = amount(&r), limit = amount(&r);
    sched_node nodes[MAX_NODES];
    static const char *const names[MAX_NODES] = {
        "n0",  "n1",  "n2",  "n3",  "n4",  "n5",  "n6",  "n7",  "n8",  "n9",  "n10", "n11",
        "n12", "n13", "n14", "n15", "n16", "n17", "n18", "n19", "n20", "n21", "n22", "n23"};
    for (size_t i = 0; i < n; i++) {
        nodes[i].name = names[i];
        nodes[i].capacity = amount(&r);
        nodes[i].count = amount(&r);
        if (nodes[i].count < 0) nodes[i].count = 0; /* instances already there: never negative */
        nodes[i].usage = byte(&r) / 128.0;
        nodes[i].rate = byte(&r) / 256.0;
        nodes[i].tie = byte(&r) % 4; /* ties of their own, and equal ones (then position) */
    }
    sched_plan plan;
    sched_error err;
    memset(&plan, 0xAB, sizeof plan); /* the planner must set it, whatever it held */
    int rc = strategy == SCHED_DUMMY ? sched_dummy(nodes, n, &plan, &err)
                                     : sched_plan_make(strategy, nodes, n, need,
                                                       sched_total(nodes, n), limit, &plan, &err);
    if (rc == PV_OK) {
        CHECK(err.kind == SCHED_KIND_NONE);
        if (strategy == SCHED_DUMMY) {
            int64_t sum = 0;
            for (size_t i = 0; i < n; i++) {
                CHECK(plan.deploy[i] == (nodes[i].capacity > 0 ? nodes[i].capacity : 0));
                sum = plan.deploy[i] > INT64_MAX - sum ? INT64_MAX : sum + plan.deploy[i];
            }
            CHECK(plan.total == sum && sum > 0);
        } else {
            CHECK(need > 0 && need <= PV_DEPLOY_MAX_COUNT);
            check_plan(strategy, nodes, n, need, limit, &plan);
        }
        sched_plan_free(&plan);
    } else {
        CHECK(err.kind != SCHED_KIND_NONE && err.status.code == rc && err.status.msg[0]);
        CHECK(plan.deploy == NULL && plan.total == 0);
    }
    return 0;
}
