/*
 * pv_domains: what node agents report of their engines' workloads, and its comparison with the
 * records (see pv_domains.h).
 */
#include "pv_domains.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_log.h"
#include "pv_registry.h"
#include "pv_resv.h"
#include "pv_workload.h"

int pv_domains_get(pv_redis *r, const pv_keys *k, const char *node, json_t **workloads,
                   pv_status *st) {
    return pv_engine_workloads_get(r, k, node, "virt", workloads, st);
}

int pv_engine_workloads_get(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                            json_t **workloads, pv_status *st) {
    *workloads = NULL;
    char *report = NULL;
    int rc = pv_registry_get_engine_info(r, k, node, &report, st);
    if (rc == PV_NOT_FOUND) {
        pv_status_clear(st);
        return PV_OK;
    }
    if (rc != PV_OK) return rc;
    json_t *j = json_loads(report, 0, NULL);
    free(report);
    json_t *w = json_object_get(json_object_get(j, engine), "workloads");
    if (json_is_object(w)) *workloads = json_incref(w);
    json_decref(j);
    return PV_OK;
}

/* Calls fn(id, reported, the record's cpumem, arg) for each workload an engine of node reported
 * that has a record; stops at the first error fn returns. */
typedef int (*reported_fn)(const char *id, json_t *reported, json_t *cpumem, void *arg,
                           pv_status *st);

static int each_reported(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                         reported_fn fn, void *arg, pv_status *st) {
    json_t *j = NULL;
    int rc = pv_engine_workloads_get(r, k, node, engine, &j, st);
    const char *id;
    json_t *d;
    json_object_foreach(j, id, d) {
        pv_workload w = {0};
        pv_status wst;
        if (rc != PV_OK) break;
        if (pv_workload_get(r, k, id, &w, &wst) != PV_OK) continue;
        json_t *res = json_loads(w.resources ? w.resources : "{}", 0, NULL);
        rc = fn(id, d, json_object_get(res, "cpumem"), arg, st);
        json_decref(res);
        pv_workload_clear(&w);
    }
    json_decref(j);
    return rc;
}

/* What an engine reported of its workloads against their records: diff(id, reported, the
 * record's cpumem) gives a diff's text (malloc'd) or NULL when they agree. */
typedef char *(*diff_fn)(const char *id, json_t *reported, json_t *cpumem);

typedef struct diff_acc {
    diff_fn diff;
    char ***diffs; /* appended to (malloc'd strings) */
    size_t *n;
} diff_acc;

static int add_diff(const char *id, json_t *reported, json_t *cpumem, void *arg, pv_status *st) {
    diff_acc *a = arg;
    char *text = a->diff(id, reported, cpumem);
    if (!text) return PV_OK;
    char **grown = realloc(*a->diffs, (*a->n + 1) * sizeof *grown);
    if (!grown) {
        free(text);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    *a->diffs = grown;
    (*a->diffs)[(*a->n)++] = text;
    return PV_OK;
}

static int engine_diffs(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                        diff_fn diff, char ***diffs, size_t *n, pv_status *st) {
    diff_acc a = {diff, diffs, n};
    return each_reported(r, k, node, engine, add_diff, &a, st);
}

static char *domain_diff(const char *id, json_t *d, json_t *cm);
static char *container_diff(const char *id, json_t *c, json_t *cm);

int pv_domains_diffs(pv_redis *r, const pv_keys *k, const char *node, char ***diffs, size_t *n,
                     pv_status *st) {
    int rc = engine_diffs(r, k, node, "virt", domain_diff, diffs, n, st);
    return rc == PV_OK ? engine_diffs(r, k, node, "docker", container_diff, diffs, n, st) : rc;
}

/* A virt node's real domains, as its agent reports them (engine info "virt": wk_engine_facts):
 * a running domain with other vcpus or memory than its allocation gives it (the virt engine's
 * mapping: ceil(cpu_limit) vcpus, 1 when 0; memory_limit bytes, 512 MiB when 0) is a diff: a
 * ReallocResource that applies at the next start, or a change made behind pivirt's back.
 * Domains without a record are the audit's (WL_ORPHAN). */
static char *domain_diff(const char *id, json_t *d, json_t *cm) {
    const char *state = json_string_value(json_object_get(d, "state"));
    if (!state || strcmp(state, "running") != 0) return NULL;
    double cpu = json_number_value(json_object_get(cm, "cpu_limit"));
    json_int_t mem = json_integer_value(json_object_get(cm, "memory_limit"));
    json_int_t want_vcpus = cpu > 0 ? (json_int_t)cpu : 1;
    if (cpu > (double)want_vcpus) want_vcpus++; /* ceil, without libm */
    json_int_t want_mem = mem > 0 ? (mem + 1023) / 1024 * 1024 : 512LL << 20;
    json_int_t vcpus = json_integer_value(json_object_get(d, "vcpus"));
    json_int_t memory = json_integer_value(json_object_get(d, "memory"));
    char *text = NULL;
    if ((vcpus != want_vcpus || memory != want_mem) &&
        asprintf(&text,
                 "workload %s: its domain %s runs with %lld vcpus and %lld MiB, its allocation "
                 "gives %lld vcpus and %lld MiB",
                 id, json_string_value(json_object_get(d, "domain")), (long long)vcpus,
                 (long long)(memory >> 20), (long long)want_vcpus, (long long)(want_mem >> 20)) < 0)
        text = NULL;
    return text;
}

/* The cores of a cpuset text ("0,2-3") as a bit mask (cores 0..63; others ignored). */
static unsigned long long cpuset_mask(const char *text) {
    unsigned long long m = 0;
    while (text && *text) {
        char *end;
        long a = strtol(text, &end, 10), b = a;
        if (end == text) break;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c >= 0 && c < 64; c++)
            m |= 1ULL << c;
        if (*end && *end != ',') break;
        text = *end == ',' ? end + 1 : end;
    }
    return m;
}

/* A docker node's containers as its agent inspected them (engine info "docker":
 * wk_docker_facts.c), in the docker engine's mapping (wk_docker_spec.c): bound cores (cpu_map)
 * as CpusetCpus without a quota, else cpu_limit as NanoCpus; memory_limit as Memory (0: none).
 * A container that differs is a diff: a ReallocResource the daemon did not apply, or a
 * `docker update` behind pivirt's back. */
static char *container_diff(const char *id, json_t *c, json_t *cm) {
    const char *core;
    json_t *unused;
    unsigned long long want_set = 0;
    json_object_foreach(json_object_get(cm, "cpu_map"), core, unused) want_set |= cpuset_mask(core);
    double want_cpu = want_set ? 0 : json_number_value(json_object_get(cm, "cpu_limit"));
    json_int_t want_mem = json_integer_value(json_object_get(cm, "memory_limit"));
    double cpu = json_number_value(json_object_get(c, "cpu"));
    const char *cpuset = json_string_value(json_object_get(c, "cpuset")) ?: "";
    json_int_t mem = json_integer_value(json_object_get(c, "memory"));
    char *text = NULL;
    if ((cpu - want_cpu > 1e-6 || want_cpu - cpu > 1e-6 || cpuset_mask(cpuset) != want_set ||
         mem != want_mem) &&
        asprintf(&text,
                 "workload %s: its container %s runs with cpu %g, cpuset \"%s\" and memory %lld "
                 "MiB, its allocation gives cpu %g, %s and memory %lld MiB",
                 id, json_string_value(json_object_get(c, "container")), cpu, cpuset,
                 (long long)(mem >> 20), want_cpu, want_set ? "bound cores" : "no cpuset",
                 (long long)(want_mem >> 20)) < 0)
        text = NULL;
    return text;
}

/* The delta that gives workload id the limits its container c really has (requests = limits,
 * as the docker engine maps them back): memory always; cpu unless cores are bound on either
 * side (a bound workload keeps its cores: ReallocResource cannot move them). NULL when out of
 * memory. */
static char *fix_delta(json_t *c, json_t *cm) {
    json_int_t mem = json_integer_value(json_object_get(c, "memory"));
    json_t *doc =
        json_pack("{s:I, s:I}", "memory-request",
                  mem - json_integer_value(json_object_get(cm, "memory_request")), "memory-limit",
                  mem - json_integer_value(json_object_get(cm, "memory_limit")));
    const char *cpuset = json_string_value(json_object_get(c, "cpuset"));
    if (doc && json_object_size(json_object_get(cm, "cpu_map")) == 0 && !(cpuset && *cpuset)) {
        double cpu = json_number_value(json_object_get(c, "cpu"));
        json_object_set_new(doc, "cpu-request",
                            json_real(cpu - json_number_value(json_object_get(cm, "cpu_request"))));
        json_object_set_new(doc, "cpu-limit",
                            json_real(cpu - json_number_value(json_object_get(cm, "cpu_limit"))));
    }
    json_t *delta = doc ? json_pack("{s:o}", "cpumem", doc) : NULL;
    char *text = delta ? json_dumps(delta, JSON_COMPACT) : NULL;
    json_decref(delta);
    return text;
}

/* GetNodeResource's fix on a docker node, as Eru's: each workload whose container's limits are
 * not its allocation's (a `docker update` behind pivirt's back) gets an allocation of what the
 * container really has, through ReallocResource's accounting (checked to fit, written with the
 * node's usage in one step), so the node's usage is what its containers hold and the diff is
 * gone. One that cannot be fixed (it would not fit, cores bound behind pivirt's back) is logged
 * and keeps its diff. */
typedef struct fix_ctx {
    pv_redis *r;
    const pv_keys *k;
    const char *node;
} fix_ctx;

static int fix_container(const char *id, json_t *c, json_t *cm, void *arg, pv_status *st) {
    (void)st;
    fix_ctx *f = arg;
    char *differs = container_diff(id, c, cm);
    char *delta = differs ? fix_delta(c, cm) : NULL;
    pv_status wst;
    if (delta && pv_resv_realloc_workload(f->r, f->k, id, delta, NULL, &wst) != PV_OK)
        pv_warn("GetNodeResource node=%s fix: workload %s not fixed: %s", f->node, id, wst.msg);
    else if (delta)
        pv_info("GetNodeResource node=%s fix: workload %s's allocation is now what its "
                "container has (%s)",
                f->node, id, delta);
    free(delta);
    free(differs);
    return PV_OK;
}

int pv_domains_fix_containers(pv_redis *r, const pv_keys *k, const char *node, pv_status *st) {
    fix_ctx f = {r, k, node};
    return each_reported(r, k, node, "docker", fix_container, &f, st);
}
