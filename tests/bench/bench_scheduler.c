/*
 * bench_scheduler: one plan of 1,000 instances over 1k, 10k and 100k nodes with each strategy,
 * printed side by side with how the time grew against n log n. The goal is ≤ 10 ms per plan at
 * 10k nodes. Nodes get varied capacities, counts and usages (a fixed pseudo-random sequence,
 * the same every run) so that sorts and heaps do real work. Each figure is the best of several
 * runs, which is what the algorithm costs once caches are warm.
 *
 *   bench_scheduler [--runs N] [--goal-ms M]   exit 1 when a 10k plan misses the goal
 *
 * The strategies live in the scheduler program, so this compiles their one source file itself.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched_strategy.h"

static const size_t k_sizes[] = {1000, 10000, 100000};
enum { NSIZES = 3, NEED = 1000 };

static const struct {
    const char *name;
    int strategy;
    int64_t need; /* FILL plans up to a per-node target, EACH a per-node number */
    int64_t limit;
} k_runs[] = {
    {"AUTO", SCHED_AUTO, NEED, 0},       {"FILL", SCHED_FILL, 10, 200},
    {"EACH", SCHED_EACH, 2, 500},        {"GLOBAL", SCHED_GLOBAL, NEED, 0},
    {"DRAINED", SCHED_DRAINED, NEED, 0},
};
enum { NRUNS = sizeof k_runs / sizeof k_runs[0] };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static sched_node *make_nodes(size_t n) {
    sched_node *nodes = calloc(n, sizeof *nodes);
    if (!nodes) return NULL;
    uint64_t x = 88172645463325252ULL; /* xorshift64: the same nodes every run */
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        nodes[i] = (sched_node){.name = "node",
                                .capacity = (int64_t)(x % 16),
                                .count = (int64_t)((x >> 8) % 8),
                                .usage = (double)((x >> 16) % 1000) / 1000.0,
                                .rate = 0.001 + (double)((x >> 32) % 50) / 1000.0};
    }
    return nodes;
}

int main(int argc, char **argv) {
    int runs = 7;
    double goal = 10.0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--goal-ms") == 0)
            goal = atof(argv[i + 1]);
    }
    if (runs < 1) runs = 1;
    double ms[NRUNS][NSIZES];
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = k_sizes[s];
        sched_node *nodes = make_nodes(n);
        if (!nodes) {
            fprintf(stderr, "out of memory\n");
            return 2;
        }
        int64_t total = sched_total(nodes, n);
        for (size_t r = 0; r < NRUNS; r++) {
            ms[r][s] = 1e18;
            for (int k = 0; k < runs; k++) {
                sched_plan plan;
                sched_error err;
                double t0 = now_ms();
                int rc = sched_plan_make(k_runs[r].strategy, nodes, n, k_runs[r].need, total,
                                         k_runs[r].limit, &plan, &err);
                double dt = now_ms() - t0;
                if (rc != PV_OK) {
                    fprintf(stderr, "%s over %zu nodes: %s\n", k_runs[r].name, n, err.status.msg);
                    free(nodes);
                    return 2;
                }
                sched_plan_free(&plan);
                if (dt < ms[r][s]) ms[r][s] = dt;
            }
        }
        free(nodes);
    }
    printf("scheduler plan, 1,000 instances (FILL: up to 10 on 200 nodes, EACH: 2 on 500), best "
           "of %d runs\n",
           runs);
    printf("%-8s %10s %10s %10s   %-22s %-22s\n", "strategy", "1k ms", "10k ms", "100k ms",
           "10k/1k (n log n 13.3)", "100k/10k (n log n 12.5)");
    int missed = 0;
    double nlogn_a = (1e4 * log(1e4)) / (1e3 * log(1e3)),
           nlogn_b = (1e5 * log(1e5)) / (1e4 * log(1e4));
    for (size_t r = 0; r < NRUNS; r++) {
        double a = ms[r][1] / ms[r][0], b = ms[r][2] / ms[r][1];
        printf("%-8s %10.3f %10.3f %10.3f   %-22.1f %-22.1f%s\n", k_runs[r].name, ms[r][0],
               ms[r][1], ms[r][2], a, b, ms[r][1] > goal ? "  MISSES the 10k goal" : "");
        missed |= ms[r][1] > goal;
    }
    printf("goal: <= %.1f ms at 10k nodes: %s (n log n growth: x%.1f then x%.1f)\n", goal,
           missed ? "MISSED" : "met", nlogn_a, nlogn_b);
    return missed;
}
