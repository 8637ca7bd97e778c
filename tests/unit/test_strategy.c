/*
 * Unit tests of sched_strategy through its C API: every case of tests/fixtures/strategy_cases.json
 * (Eru's reference cases: plans, error kinds and messages, final counts), then what the cases do
 * not pin down: ties follow the input order (seed 0) or a request's seed (the same seed, the
 * same plan; many seeds spread over tied nodes; every plan is the reference's on some order of
 * the nodes), DUMMY, the dispatcher's order of checks, totals that lie, and big inputs.
 *
 * The strategies live in the scheduler program, not in a library, so this test compiles their
 * one source file itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_deploy.h"
#include "sched_strategy.h"

static json_t *load_cases(void) {
    const char *src = getenv("PV_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/strategy_cases.json", src ? src : "../..");
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    if (!doc) fail_msg("cannot load %s: %s", path, jerr.text);
    return doc;
}

static int64_t int_member(const json_t *o, const char *k) {
    const json_t *v = json_object_get(o, k);
    return v ? (int64_t)json_integer_value(v) : 0;
}

static int int64_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void check_case(size_t idx, const json_t *c) {
    const json_t *jn = json_object_get(c, "nodes");
    size_t n = json_array_size(jn);
    sched_node *nodes = calloc(n ? n : 1, sizeof *nodes);
    assert_non_null(nodes);
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(jn, i);
        nodes[i] = (sched_node){.name = json_string_value(json_object_get(o, "name")),
                                .capacity = int_member(o, "capacity"),
                                .count = int_member(o, "count"),
                                .usage = json_number_value(json_object_get(o, "usage")),
                                .rate = json_number_value(json_object_get(o, "rate"))};
    }
    int strategy = sched_strategy_parse(json_string_value(json_object_get(c, "strategy")));
    sched_plan plan;
    sched_error err;
    int rc = sched_plan_make(strategy, nodes, n, int_member(c, "need"), int_member(c, "total"),
                             int_member(c, "limit"), &plan, &err);
    const json_t *expect = json_object_get(c, "expect");
    if (expect) {
        if (rc != PV_OK) fail_msg("case %zu: unexpected error %s", idx, err.status.msg);
        size_t listed = 0;
        for (size_t i = 0; i < n; i++) {
            const json_t *want = json_object_get(expect, nodes[i].name);
            if (want) {
                if (!plan.listed[i] || plan.deploy[i] != json_integer_value(want))
                    fail_msg("case %zu: node %s got %lld (listed %d), want %lld", idx,
                             nodes[i].name, (long long)plan.deploy[i], plan.listed[i],
                             (long long)json_integer_value(want));
                listed++;
            } else if (plan.listed[i]) {
                fail_msg("case %zu: node %s listed with %lld, not expected", idx, nodes[i].name,
                         (long long)plan.deploy[i]);
            }
        }
        assert_int_equal(listed, json_object_size(expect));
        const json_t *final = json_object_get(c, "expect_final_counts_sorted");
        if (final) {
            int64_t *counts = calloc(n, sizeof *counts);
            assert_non_null(counts);
            for (size_t i = 0; i < n; i++)
                counts[i] = nodes[i].count + plan.deploy[i];
            qsort(counts, n, sizeof *counts, int64_cmp);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(counts[i], json_integer_value(json_array_get(final, i)));
            free(counts);
        }
        sched_plan_free(&plan);
    } else {
        const json_t *e = json_object_get(c, "expect_error");
        if (rc == PV_OK)
            fail_msg("case %zu: planned, want error %s", idx,
                     json_string_value(json_object_get(e, "kind")));
        assert_int_equal(rc, err.status.code);
        assert_string_equal(sched_kind_name(err.kind),
                            json_string_value(json_object_get(e, "kind")));
        if (!strstr(err.status.msg, json_string_value(json_object_get(e, "contains"))))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", idx, err.status.msg,
                     json_string_value(json_object_get(e, "contains")));
        assert_null(plan.deploy);
        sched_plan_free(&plan);
    }
    free(nodes);
}

static void test_reference_cases(void **state) {
    (void)state;
    json_t *doc = load_cases();
    const json_t *cases = json_object_get(doc, "cases");
    assert_int_equal(json_array_size(cases), 47);
    for (size_t i = 0; i < json_array_size(cases); i++)
        check_case(i, json_array_get(cases, i));
    json_decref(doc);
}

/* Plans `need` and returns the deploy of each node in a static array (test helper). */
static const int64_t *plan_of(int strategy, const sched_node *nodes, size_t n, int64_t need,
                              int64_t limit) {
    static int64_t out[64];
    sched_plan plan;
    sched_error err;
    int rc = sched_plan_make(strategy, nodes, n, need, sched_total(nodes, n), limit, &plan, &err);
    if (rc != PV_OK) fail_msg("plan failed: %s", err.status.msg);
    memcpy(out, plan.deploy, n * sizeof *out);
    sched_plan_free(&plan);
    return out;
}

static void test_ties_follow_input_order(void **state) {
    (void)state;
    sched_node same[] = {{"a", 5, 1, 0, 0, 0}, {"b", 5, 1, 0, 0, 0}, {"c", 5, 1, 0, 0, 0}};
    const int64_t *d = plan_of(SCHED_AUTO, same, 3, 2, 0);
    assert_int_equal(d[0], 1);
    assert_int_equal(d[1], 1);
    assert_int_equal(d[2], 0);
    d = plan_of(SCHED_EACH, same, 3, 2, 2);
    assert_int_equal(d[0], 2);
    assert_int_equal(d[1], 2);
    assert_int_equal(d[2], 0);
    d = plan_of(SCHED_DRAINED, same, 3, 7, 0);
    assert_int_equal(d[0], 5);
    assert_int_equal(d[1], 2);
    assert_int_equal(d[2], 0);
    d = plan_of(SCHED_GLOBAL, same, 3, 1, 0);
    assert_int_equal(d[0], 1);
    d = plan_of(SCHED_FILL, same, 3, 2, 2);
    assert_int_equal(d[0], 1);
    assert_int_equal(d[1], 1);
    assert_int_equal(d[2], 0);
    /* reversing the input reverses the choice among equals */
    sched_node rev[] = {{"c", 5, 1, 0, 0, 0}, {"b", 5, 1, 0, 0, 0}, {"a", 5, 1, 0, 0, 0}};
    d = plan_of(SCHED_AUTO, rev, 3, 1, 0);
    assert_int_equal(d[0], 1);
}

/* ---- seeded ties ---- */

static const int k_strategies[] = {SCHED_AUTO, SCHED_FILL, SCHED_EACH, SCHED_GLOBAL, SCHED_DRAINED};
static const char *const k_names[] = {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"};

/* The plan (or the error) of one call; plan NULL and kind set on failure. */
typedef struct outcome {
    int rc;
    sched_kind kind;
    int64_t deploy[8];
    uint8_t listed[8];
} outcome;

static outcome run(int strategy, const sched_node *nodes, size_t n, int64_t need, int64_t limit) {
    outcome o;
    memset(&o, 0, sizeof o);
    sched_plan plan;
    sched_error err;
    o.rc = sched_plan_make(strategy, nodes, n, need, sched_total(nodes, n), limit, &plan, &err);
    o.kind = o.rc == PV_OK ? SCHED_KIND_NONE : err.kind;
    if (o.rc == PV_OK) {
        memcpy(o.deploy, plan.deploy, n * sizeof *o.deploy);
        memcpy(o.listed, plan.listed, n);
    }
    sched_plan_free(&plan);
    return o;
}

/* The reference: Eru's algorithm on nodes[perm[0]], nodes[perm[1]], ... (input order decides
 * ties), mapped back to the nodes' own positions. */
static outcome run_permuted(int strategy, const sched_node *nodes, const size_t *perm, size_t n,
                            int64_t need, int64_t limit) {
    sched_node p[8];
    for (size_t k = 0; k < n; k++) {
        p[k] = nodes[perm[k]];
        p[k].tie = 0;
    }
    outcome r = run(strategy, p, n, need, limit), back = r;
    for (size_t k = 0; k < n; k++) {
        back.deploy[perm[k]] = r.deploy[k];
        back.listed[perm[k]] = r.listed[k];
    }
    return back;
}

static int same_outcome(const outcome *a, const outcome *b, size_t n) {
    if (a->rc != b->rc || a->kind != b->kind) return 0;
    return memcmp(a->deploy, b->deploy, n * sizeof *a->deploy) == 0 &&
           memcmp(a->listed, b->listed, n) == 0;
}

static void random_nodes(uint64_t *x, sched_node *nodes, size_t n) {
    for (size_t i = 0; i < n; i++) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        /* few distinct values, so that most nodes tie with another */
        nodes[i] = (sched_node){.name = k_names[i],
                                .capacity = (int64_t)(*x % 3) * 2,
                                .count = (int64_t)((*x >> 8) % 2),
                                .usage = (double)((*x >> 16) % 2) / 4,
                                .rate = 0.25};
    }
}

static int next_perm(size_t *p, size_t n) {
    size_t i = n - 1;
    while (i > 0 && p[i - 1] >= p[i])
        i--;
    if (i == 0) return 0;
    size_t j = n - 1;
    while (p[j] <= p[i - 1])
        j--;
    size_t t = p[i - 1];
    p[i - 1] = p[j];
    p[j] = t;
    for (size_t a = i, b = n - 1; a < b; a++, b--)
        t = p[a], p[a] = p[b], p[b] = t;
    return 1;
}

/* The seed comes from the request id: the same id, the same keys; seed 0 = input order. */
static void test_seeds(void **state) {
    (void)state;
    assert_int_equal(sched_seed_of("plan-01J0AAAA"), sched_seed_of("plan-01J0AAAA"));
    assert_int_not_equal(sched_seed_of("plan-01J0AAAA"), sched_seed_of("plan-01J0AAAB"));
    assert_int_not_equal(sched_seed_of(""), 0);
    sched_node a[3] = {{.name = "x"}, {.name = "y"}, {.name = "z"}}, b[2] = {{.name = "z"}};
    sched_ties_seed(a, 3, 42);
    sched_ties_seed(b, 1, 42);
    assert_int_equal(a[2].tie, b[0].tie); /* a node's key does not depend on the others */
    assert_int_not_equal(a[0].tie, a[1].tie);
    sched_ties_seed(a, 3, 0);
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(a[i].tie, 0);
}

/* The same seed gives the same plan; over many seeds every tied node wins, about as often. */
static void test_ties_spread_over_seeds(void **state) {
    (void)state;
    enum { N = 5, SEEDS = 2000 };
    sched_node nodes[N];
    for (size_t i = 0; i < N; i++)
        nodes[i] = (sched_node){.name = k_names[i], .capacity = 5, .count = 1};
    for (size_t s = 0; s < sizeof k_strategies / sizeof k_strategies[0]; s++) {
        int64_t wins[N] = {0};
        int strategy = k_strategies[s];
        int64_t need = strategy == SCHED_FILL ? 2 : 1, limit = strategy == SCHED_AUTO ? 0 : 1;
        for (uint64_t seed = 1; seed <= SEEDS; seed++) {
            sched_ties_seed(nodes, N, sched_seed_of("plan-x") ^ seed);
            outcome o = run(strategy, nodes, N, need, limit), again;
            assert_int_equal(o.rc, PV_OK);
            again = run(strategy, nodes, N, need, limit);
            assert_true(same_outcome(&o, &again, N));
            size_t winners = 0;
            for (size_t i = 0; i < N; i++)
                if (o.deploy[i] > 0) wins[i]++, winners++;
            assert_int_equal(winners, 1);
        }
        for (size_t i = 0; i < N; i++)
            if (wins[i] < SEEDS / N / 2 || wins[i] > SEEDS / N * 2)
                fail_msg("strategy %d: node %zu won %lld of %d plans", strategy, i,
                         (long long)wins[i], SEEDS);
    }
}

/* Every seeded plan (or error) is the reference's on one order of the nodes: the order by tie
 * key, exactly; and, over all orders of up to five nodes, some order gives it. */
static void test_seeded_plans_are_eru_plans(void **state) {
    (void)state;
    uint64_t x = 0x2545F4914F6CDD1Du;
    for (int round = 0; round < 3000; round++) {
        size_t n = 1 + (size_t)(round % 5);
        sched_node nodes[8];
        random_nodes(&x, nodes, n);
        sched_ties_seed(nodes, n, (uint64_t)round + 1);
        int strategy = k_strategies[round % 5];
        int64_t need = 1 + (int64_t)(x >> 40) % 6, limit = (int64_t)(x >> 50) % 3;
        outcome got = run(strategy, nodes, n, need, limit);
        size_t perm[8];
        for (size_t i = 0; i < n; i++)
            perm[i] = i;
        for (size_t i = 1; i < n; i++) /* insertion sort by (tie, position) */
            for (size_t j = i; j > 0 && nodes[perm[j - 1]].tie > nodes[perm[j]].tie; j--) {
                size_t t = perm[j];
                perm[j] = perm[j - 1];
                perm[j - 1] = t;
            }
        outcome ref = run_permuted(strategy, nodes, perm, n, need, limit);
        if (!same_outcome(&got, &ref, n))
            fail_msg("round %d (strategy %d, %zu nodes): not the plan of the tie order", round,
                     strategy, n);
        for (size_t i = 0; i < n; i++)
            perm[i] = i;
        int found = 0;
        do {
            ref = run_permuted(strategy, nodes, perm, n, need, limit);
            found = same_outcome(&got, &ref, n);
        } while (!found && next_perm(perm, n));
        if (!found) fail_msg("round %d: no order of the nodes gives the plan", round);
    }
}

static void test_dispatch_order_and_kinds(void **state) {
    (void)state;
    sched_node nodes[] = {{"a", 5, 0, 0, 0, 0}};
    sched_plan plan;
    sched_error err;
    /* strategy is checked before the count, as Eru's strategy.Deploy does */
    assert_int_equal(sched_plan_make(7, nodes, 1, 0, 5, 0, &plan, &err), PV_INVALID_ARGUMENT);
    assert_int_equal(err.kind, SCHED_KIND_INVALID_STRATEGY);
    assert_string_equal(err.status.msg, "strategy: 7: deploy method not support yet");
    assert_int_equal(sched_plan_make(SCHED_DUMMY, nodes, 1, 1, 5, 0, &plan, &err),
                     PV_INVALID_ARGUMENT);
    assert_string_equal(err.status.msg, "strategy: DUMMY: deploy method not support yet");
    assert_int_equal(sched_plan_make(SCHED_AUTO, nodes, 1, 0, 5, 0, &plan, &err),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(err.kind, SCHED_KIND_INVALID_COUNT);
    assert_string_equal(err.status.msg, "count: 0: invalid deploy count");
    /* found by fuzz_planner: GLOBAL and AUTO place one instance at a time, so a count near
     * 2^63 on unbounded nodes never ended; past PV_DEPLOY_MAX_COUNT a plan is refused at once */
    sched_node huge[] = {{.name = "a", .capacity = INT64_MAX}, {.name = "b", .capacity = 9}};
    assert_int_equal(
        sched_plan_make(SCHED_GLOBAL, huge, 2, INT64_MAX - 1, INT64_MAX, 0, &plan, &err),
        PV_INVALID_ARGUMENT);
    assert_int_equal(err.kind, SCHED_KIND_INVALID_COUNT);
    assert_int_equal(
        sched_plan_make(SCHED_AUTO, huge, 2, PV_DEPLOY_MAX_COUNT, INT64_MAX, 0, &plan, &err),
        PV_OK);
    assert_int_equal(plan.total, PV_DEPLOY_MAX_COUNT);
    sched_plan_free(&plan);
    assert_int_equal(sched_plan_make(SCHED_AUTO, nodes, 1, 6, 5, 0, &plan, &err),
                     PV_RESOURCE_EXHAUSTED);
    assert_string_equal(err.status.msg,
                        "need: 6, available: 5: cannot alloc a plan, not enough resource");
    assert_int_equal(sched_strategy_parse("auto"), -1);
    assert_int_equal(sched_strategy_parse("GLOBAL"), SCHED_GLOBAL);
    assert_string_equal(sched_kind_name(SCHED_KIND_NONE), "");
}

static void test_total_that_lies(void **state) {
    (void)state;
    sched_node nodes[] = {{"a", 2, 0, 0, 0, 0}, {"b", 1, 0, 0, 0, 0}};
    sched_plan plan;
    sched_error err;
    /* AUTO without a limit and DRAINED run out of room before need: the real room is reported */
    assert_int_equal(sched_plan_make(SCHED_AUTO, nodes, 2, 5, 100, 0, &plan, &err),
                     PV_RESOURCE_EXHAUSTED);
    assert_string_equal(err.status.msg,
                        "need: 5, available: 3: cannot alloc a plan, not enough resource");
    assert_int_equal(sched_plan_make(SCHED_DRAINED, nodes, 2, 5, 100, 0, &plan, &err),
                     PV_RESOURCE_EXHAUSTED);
    assert_string_equal(err.status.msg,
                        "need: 5, available: 3: cannot alloc a plan, not enough resource");
    assert_null(plan.deploy);
}

static void test_dummy(void **state) {
    (void)state;
    sched_node nodes[] = {{"a", 3, 9, 0, 0, 0}, {"b", 0, 0, 0, 0, 0}, {"c", -4, 0, 0, 0, 0}};
    sched_plan plan;
    sched_error err;
    assert_int_equal(sched_dummy(nodes, 3, &plan, &err), PV_OK);
    assert_int_equal(plan.total, 3);
    assert_int_equal(plan.deploy[0], 3);
    assert_int_equal(plan.deploy[1], 0);
    assert_int_equal(plan.deploy[2], 0);
    assert_true(plan.listed[0] && plan.listed[1] && plan.listed[2]);
    sched_plan_free(&plan);
    assert_int_equal(sched_dummy(nodes + 1, 2, &plan, &err), PV_RESOURCE_EXHAUSTED);
    assert_int_equal(err.kind, SCHED_KIND_INSUFFICIENT_RESOURCE);
    assert_string_equal(err.status.msg, "no node meets all the resource requirements at the same "
                                        "time: cannot alloc a plan, not enough resource");
    sched_plan_free(&plan); /* harmless on an empty plan */
}

static void test_saturating_total_and_huge_capacity(void **state) {
    (void)state;
    sched_node nodes[] = {{"a", INT64_MAX, 0, 0.5, 0.1, 0}, {"b", INT64_MAX, 0, 0.2, 0.1, 0}};
    assert_true(sched_total(nodes, 2) == INT64_MAX);
    const int64_t *d = plan_of(SCHED_GLOBAL, nodes, 2, 4, 0);
    /* b's keys go 0.3, 0.4, 0.5, then 0.6 ties with a's first 0.6: the input order picks a */
    assert_int_equal(d[0], 1);
    assert_int_equal(d[1], 3);
    d = plan_of(SCHED_AUTO, nodes, 2, 1000, 0);
    assert_int_equal(d[0], 500);
    assert_int_equal(d[1], 500);
}

static void test_large_auto_balances(void **state) {
    (void)state;
    enum { N = 10000 };
    sched_node *nodes = calloc(N, sizeof *nodes);
    assert_non_null(nodes);
    for (size_t i = 0; i < N; i++)
        nodes[i] = (sched_node){"x", 3, (int64_t)(i % 4), 0, 0, 0};
    sched_plan plan;
    sched_error err;
    assert_int_equal(
        sched_plan_make(SCHED_AUTO, nodes, N, 5000, sched_total(nodes, N), 0, &plan, &err), PV_OK);
    assert_int_equal(plan.total, 5000);
    /* The count-0 nodes come up to 1 (2500); at count 1 the original count-1 nodes have more
     * room (3 against 2), so they take the other 2500. */
    for (size_t i = 0; i < N; i++)
        assert_int_equal(plan.deploy[i], i % 4 < 2 ? 1 : 0);
    sched_plan_free(&plan);
    free(nodes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_cases),
        cmocka_unit_test(test_ties_follow_input_order),
        cmocka_unit_test(test_seeds),
        cmocka_unit_test(test_ties_spread_over_seeds),
        cmocka_unit_test(test_seeded_plans_are_eru_plans),
        cmocka_unit_test(test_dispatch_order_and_kinds),
        cmocka_unit_test(test_total_that_lies),
        cmocka_unit_test(test_dummy),
        cmocka_unit_test(test_saturating_total_and_huge_capacity),
        cmocka_unit_test(test_large_auto_balances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
