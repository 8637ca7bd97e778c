/*
 * pv_res: the cpumem and storage resource plugins of Eru, as pure functions (see pv_res.h).
 *
 * Why here and not in the scheduler: the gateway must refuse a bad AddNode/SetNode document with
 * the same words the scheduler would use later, so both link one parser.
 *
 * The capacity rules follow the public Eru plugins (projecteru2/core resource/plugins/cpumem and
 * projecteru2/resource-storage) with three deliberate differences, all for determinism or
 * correctness: NUMA nodes are visited in index order (Eru walks a Go map), a CPU request is
 * rounded to the nearest piece (Eru truncates 0.29 × 100 to 28), and normal volume plans are
 * counted up to PV_RES_STORAGE_MAX_PLANS per node (Eru's scheduler has the same kind of cap).
 */
#include "pv_res.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- human sizes ---- */

int pv_res_size_parse(const char *text, int64_t *bytes, pv_status *st) {
    *bytes = 0;
    if (!text || !*text) return pv_status_set(st, PV_INVALID_ARGUMENT, "\"\" is not a size");
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '-')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "\"%s\" must not be negative", text);
    if (*p == '+') p++;
    if (!isdigit((unsigned char)*p))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "\"%s\" is not a size", text);
    uint64_t whole = 0;
    int overflow = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            overflow = 1;
        else
            whole = whole * 10 + d;
    }
    long double frac = 0, scale = 1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "\"%s\" is not a size", text);
        for (; isdigit((unsigned char)*p); p++) {
            scale /= 10;
            frac += (long double)(*p - '0') * scale;
        }
    }
    static const char k_units[] = "KMGTPE";
    int shift = 0;
    if (*p) {
        const char *u = strchr(k_units, toupper((unsigned char)*p));
        if (!u) goto suffix;
        shift = 10 * (int)(u - k_units + 1);
        p++;
        if (*p == 'i' || *p == 'I') p++;
    }
suffix:
    if (*p == 'b' || *p == 'B') p++;
    while (isspace((unsigned char)*p))
        p++;
    if (*p) return pv_status_set(st, PV_INVALID_ARGUMENT, "\"%s\" is not a size", text);
    uint64_t unit = (uint64_t)1 << shift;
    if (overflow || (whole && whole > (uint64_t)INT64_MAX / unit))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "\"%s\" is too large", text);
    uint64_t value = whole * unit;
    uint64_t extra = (uint64_t)(frac * (long double)unit);
    if (value > (uint64_t)INT64_MAX - extra)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "\"%s\" is too large", text);
    *bytes = (int64_t)(value + extra);
    return PV_OK;
}

/* ---- JSON helpers (messages: "<plugin>: <field>: ...") ---- */

static json_t *load_doc(const char *plugin, const char *json, size_t len, pv_status *st) {
    if (!json || len == 0) return json_object();
    json_error_t jerr;
    json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc) {
        pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not valid JSON: %s", plugin, jerr.text);
        return NULL;
    }
    if (!json_is_object(doc)) {
        json_decref(doc);
        pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be a JSON object", plugin);
        return NULL;
    }
    return doc;
}

static int only_known(const char *plugin, const json_t *doc, const char *const *allowed,
                      pv_status *st) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)doc, key, v) {
        int known = 0;
        for (size_t i = 0; allowed[i] && !known; i++)
            known = strcmp(key, allowed[i]) == 0;
        if (!known)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: unknown field", plugin, key);
    }
    return PV_OK;
}

/* A size given as a JSON integer (bytes) or a human string; label names it in messages. */
static int size_value(const char *plugin, const char *label, const json_t *v, int64_t *out,
                      pv_status *st) {
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (n < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: %lld must not be negative",
                                 plugin, label, (long long)n);
        *out = (int64_t)n;
        return PV_OK;
    }
    if (!json_is_string(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: %s: must be a size (bytes or a string like \"4G\")", plugin,
                             label);
    if (pv_res_size_parse(json_string_value(v), out, st) != PV_OK)
        return pv_status_prefix(st, "%s: %s", plugin, label);
    return PV_OK;
}

/* The member `field` of doc as a size; absent: *out untouched. */
static int get_size(const char *plugin, const json_t *doc, const char *field, int64_t *out,
                    pv_status *st) {
    const json_t *v = json_object_get(doc, field);
    return v ? size_value(plugin, field, v, out, st) : PV_OK;
}

static int get_cores(const char *plugin, const json_t *doc, const char *field, double *out,
                     pv_status *st) {
    const json_t *v = json_object_get(doc, field);
    if (!v) return PV_OK;
    if (!json_is_number(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: must be a number of cores", plugin,
                             field);
    double d = json_number_value(v);
    if (d < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: %g must not be negative", plugin,
                             field, d);
    *out = d;
    return PV_OK;
}

static int get_bool(const char *plugin, const json_t *doc, const char *field, int *out,
                    pv_status *st) {
    const json_t *v = json_object_get(doc, field);
    if (!v) return PV_OK;
    if (!json_is_boolean(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: must be true or false", plugin,
                             field);
    *out = json_is_true(v);
    return PV_OK;
}

/* Parses a whole decimal number in [min, max] from s[0..len). */
static int parse_int(const char *s, size_t len, long long min, long long max, long long *out) {
    if (len == 0 || len > 18) return -1;
    long long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < min || v > max) return -1;
    *out = v;
    return 0;
}

/* ---- capacity across plugins ---- */

void pv_res_cap_combine(const pv_res_cap *caps, size_t n, pv_res_cap *out) {
    memset(out, 0, sizeof *out);
    out->capacity = PV_RES_UNBOUNDED;
    double usage = 0, rate = 0;
    int weight = 0;
    for (size_t i = 0; i < n; i++) {
        if (caps[i].capacity < out->capacity) out->capacity = caps[i].capacity;
        usage += caps[i].usage * caps[i].weight;
        rate += caps[i].rate * caps[i].weight;
        weight += caps[i].weight;
    }
    if (weight > 0) {
        out->usage = usage / weight;
        out->rate = rate / weight;
    }
    out->weight = weight;
}

static double ratio(double a, double b) {
    return b == 0 ? 0 : a / b;
}

/* ---- cpumem: node ---- */

#define CPUMEM "cpumem"
#define PV_RES_MAX_CORES 4096

void pv_res_cpumem_free(pv_res_cpumem *node) {
    if (!node) return;
    free(node->cores);
    free(node->numa_memory);
    memset(node, 0, sizeof *node);
}

static int core_cmp(const void *a, const void *b) {
    const pv_res_core *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static pv_res_core *find_core(pv_res_cpumem *node, int id) {
    pv_res_core key = {.id = id};
    return bsearch(&key, node->cores, node->ncores, sizeof key, core_cmp);
}

static int cores_alloc(pv_res_cpumem *node, size_t n, pv_status *st) {
    node->cores = calloc(n ? n : 1, sizeof *node->cores);
    if (!node->cores) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    node->ncores = n;
    return PV_OK;
}

static int cores_whole(pv_res_cpumem *node, long long count, pv_status *st) {
    if (count <= 0 || count > PV_RES_MAX_CORES)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": cpu: %lld must be between 1 and %d cores", count,
                             PV_RES_MAX_CORES);
    if (cores_alloc(node, (size_t)count, st) != PV_OK) return st->code;
    for (long long i = 0; i < count; i++)
        node->cores[i] = (pv_res_core){.id = (int)i, .pieces = PV_RES_SHARE_BASE, .numa = -1};
    return PV_OK;
}

/* "id:pieces,..." */
static int cores_list(pv_res_cpumem *node, const char *list, pv_status *st) {
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    if (n > PV_RES_MAX_CORES)
        return pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": cpu: more than %d cores",
                             PV_RES_MAX_CORES);
    if (cores_alloc(node, n, st) != PV_OK) return st->code;
    const char *p = list;
    for (size_t i = 0; i < n; i++) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        long long id, pieces;
        if (!colon || parse_int(p, (size_t)(colon - p), 0, 1 << 20, &id) != 0 ||
            parse_int(colon + 1, len - (size_t)(colon + 1 - p), 0, INT32_MAX, &pieces) != 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": cpu: \"%.*s\" must be id:pieces (e.g. \"0:100\")",
                                 (int)len, p);
        node->cores[i] = (pv_res_core){.id = (int)id, .pieces = pieces, .numa = -1};
        p += len + (p[len] == ',');
    }
    qsort(node->cores, n, sizeof *node->cores, core_cmp);
    for (size_t i = 1; i < n; i++)
        if (node->cores[i].id == node->cores[i - 1].id)
            return pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": cpu: core %d appears twice",
                                 node->cores[i].id);
    return PV_OK;
}

static int parse_cpu(pv_res_cpumem *node, const json_t *v, const pv_res_engine_info *info,
                     pv_status *st) {
    if (!v) {
        if (!info || info->cpu_count <= 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": cpu: is required (no engine info: start the node "
                                        "agent or give the node's resources)");
        return cores_whole(node, info->cpu_count, st);
    }
    if (json_is_integer(v)) return cores_whole(node, json_integer_value(v), st);
    if (!json_is_string(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": cpu: must be a core count or \"id:pieces,...\"");
    const char *s = json_string_value(v);
    long long count;
    if (!strchr(s, ':') && parse_int(s, strlen(s), 0, INT32_MAX, &count) == 0)
        return cores_whole(node, count, st);
    return cores_list(node, s, st);
}

/* numa-cpu: ["0,1", "2,3"]: index = NUMA node. */
static int parse_numa_cpu(pv_res_cpumem *node, const json_t *v, pv_status *st) {
    if (!json_is_array(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": numa-cpu: must be a list like [\"0,1\",\"2,3\"]");
    size_t idx;
    const json_t *e;
    json_array_foreach(v, idx, e) {
        if (!json_is_string(e))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": numa-cpu[%zu]: must be a string like \"0,1\"", idx);
        const char *p = json_string_value(e);
        do {
            size_t len = strcspn(p, ",");
            long long id;
            pv_res_core *core = NULL;
            if (parse_int(p, len, 0, 1 << 20, &id) == 0) core = find_core(node, (int)id);
            if (!core)
                return pv_status_set(st, PV_INVALID_ARGUMENT,
                                     CPUMEM ": numa-cpu[%zu]: \"%.*s\" is not a core of cpu", idx,
                                     (int)len, p);
            if (core->numa >= 0)
                return pv_status_set(st, PV_INVALID_ARGUMENT,
                                     CPUMEM ": numa-cpu[%zu]: core %d is already in NUMA node %d",
                                     idx, core->id, core->numa);
            core->numa = (int)idx;
            p += len + (p[len] == ',');
        } while (*p);
    }
    node->nnuma = json_array_size(v);
    for (size_t i = 0; i < node->ncores; i++)
        if (node->nnuma > 0 && node->cores[i].numa < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": numa-cpu: core %d is in no NUMA node",
                                 node->cores[i].id);
    return PV_OK;
}

static int parse_numa_memory(pv_res_cpumem *node, const json_t *v, pv_status *st) {
    /* one block: numa_memory[nnuma] then numa_memory_used[nnuma] */
    node->numa_memory = calloc(node->nnuma ? 2 * node->nnuma : 1, sizeof(int64_t));
    if (!node->numa_memory)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    node->numa_memory_used = node->numa_memory + node->nnuma;
    if (!v) {
        for (size_t i = 0; i < node->nnuma; i++)
            node->numa_memory[i] = node->memory / (int64_t)node->nnuma;
        return PV_OK;
    }
    if (!json_is_array(v) || json_array_size(v) != node->nnuma)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": numa-memory: must list one size per numa-cpu entry (%zu)",
                             node->nnuma);
    for (size_t i = 0; i < node->nnuma; i++) {
        char label[40];
        snprintf(label, sizeof label, "numa-memory[%zu]", i);
        if (size_value(CPUMEM, label, json_array_get(v, i), &node->numa_memory[i], st) != PV_OK)
            return st->code;
    }
    return PV_OK;
}

int pv_res_cpumem_node_parse(const char *json, size_t len, const pv_res_engine_info *info,
                             pv_res_cpumem *node, pv_status *st) {
    static const char *const k_fields[] = {"cpu", "memory", "numa-cpu", "numa-memory", NULL};
    memset(node, 0, sizeof *node);
    json_t *doc = load_doc(CPUMEM, json, len, st);
    if (!doc) return st->code;
    int rc = only_known(CPUMEM, doc, k_fields, st);
    if (rc == PV_OK) rc = parse_cpu(node, json_object_get(doc, "cpu"), info, st);
    if (rc == PV_OK) {
        if (json_object_get(doc, "memory"))
            rc = get_size(CPUMEM, doc, "memory", &node->memory, st);
        else if (info && info->mem_total > 0)
            node->memory = info->mem_total / 10 * 8; /* Eru keeps 20% for the host */
        else
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               CPUMEM ": memory: is required (no engine info: start the node "
                                      "agent or give the node's resources)");
    }
    const json_t *numa_cpu = json_object_get(doc, "numa-cpu");
    const json_t *numa_mem = json_object_get(doc, "numa-memory");
    if (rc == PV_OK && !numa_cpu && numa_mem)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           CPUMEM ": numa-memory: needs numa-cpu (which cores each NUMA node has)");
    if (rc == PV_OK && numa_cpu) rc = parse_numa_cpu(node, numa_cpu, st);
    if (rc == PV_OK && node->nnuma > 0) rc = parse_numa_memory(node, numa_mem, st);
    json_decref(doc);
    if (rc != PV_OK) pv_res_cpumem_free(node);
    return rc;
}

/* ---- cpumem: workload request ---- */

int pv_res_cpumem_req_parse(const char *json, size_t len, pv_res_cpumem_req *req, pv_status *st) {
    static const char *const k_fields[] = {
        "cpu-request",   "cpu-limit", "memory-request", "memory-limit", "cpu-bind",
        "keep-cpu-bind", NULL};
    memset(req, 0, sizeof *req);
    json_t *doc = load_doc(CPUMEM, json, len, st);
    if (!doc) return st->code;
    int keep = 0;
    int rc = only_known(CPUMEM, doc, k_fields, st);
    if (rc == PV_OK) rc = get_cores(CPUMEM, doc, "cpu-request", &req->cpu_request, st);
    if (rc == PV_OK) rc = get_cores(CPUMEM, doc, "cpu-limit", &req->cpu_limit, st);
    if (rc == PV_OK) rc = get_size(CPUMEM, doc, "memory-request", &req->memory_request, st);
    if (rc == PV_OK) rc = get_size(CPUMEM, doc, "memory-limit", &req->memory_limit, st);
    if (rc == PV_OK) rc = get_bool(CPUMEM, doc, "cpu-bind", &req->cpu_bind, st);
    if (rc == PV_OK) rc = get_bool(CPUMEM, doc, "keep-cpu-bind", &keep, st);
    json_decref(doc);
    if (rc != PV_OK) {
        memset(req, 0, sizeof *req);
        return rc;
    }
    if (req->cpu_request == 0) req->cpu_request = req->cpu_limit;
    if (req->cpu_limit > 0 && req->cpu_limit < req->cpu_request) req->cpu_limit = req->cpu_request;
    if (req->memory_request == 0) req->memory_request = req->memory_limit;
    if (req->memory_limit > 0 && req->memory_limit < req->memory_request)
        req->memory_limit = req->memory_request;
    if (req->cpu_bind && req->cpu_request == 0) {
        memset(req, 0, sizeof *req);
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": cpu-bind: needs cpu-request (or cpu-limit) above 0");
    }
    return PV_OK;
}

/* ---- cpumem: CPU plans ----
 *
 * A pool is the free pieces of some cores. A plan takes `full` distinct whole cores (100 pieces
 * each) plus `fragment` pieces of one more core. Whole plans come from "full" cores (free pieces
 * a positive multiple of 100), fragments from the other cores plus, when that gives more plans,
 * the busiest full cores moved over. Eru's choice of the split is kept: the number m of full cores
 * moved that gives the most plans, the smallest such m on ties.
 */

typedef struct pool_core {
    int id;
    int64_t pieces;     /* free */
    pv_res_core *owner; /* where a taken plan is written back */
} pool_core;

/* byLoad: fewer free pieces first (busier), then the lower id. */
static int by_load(const void *a, const void *b) {
    const pool_core *x = a, *y = b;
    if (x->pieces != y->pieces) return x->pieces < y->pieces ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Most plans of `full` distinct whole cores over units[] (whole cores free per core): the
 * largest t with sum(min(units_i, t)) >= full * t, which the greedy "take the freest cores" of
 * Eru reaches. */
static int64_t count_full(const int64_t *units, size_t n, int64_t full) {
    int64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += units[i];
    int64_t lo = 0, hi = sum / full;
    while (lo < hi) {
        int64_t t = lo + (hi - lo + 1) / 2, got = 0;
        for (size_t i = 0; i < n && got < full * t; i++)
            got += units[i] < t ? units[i] : t;
        if (got >= full * t)
            lo = t;
        else
            hi = t - 1;
    }
    return lo;
}

typedef struct split {
    int64_t plans;
    size_t moved; /* full cores (busiest first) used for fragments */
} split;

/* fullc[]: full cores by load; fragc[]: fragment cores by load. */
static split best_split(const pool_core *fullc, size_t nfull, const pool_core *fragc, size_t nfrag,
                        int64_t full, int64_t fragment, int64_t *units) {
    split best = {0, 0};
    if (full == 0) { /* fragments only: every core is usable */
        for (size_t i = 0; i < nfrag; i++)
            best.plans += fragc[i].pieces / fragment;
        for (size_t i = 0; i < nfull; i++)
            best.plans += fullc[i].pieces / fragment;
        best.moved = nfull;
        return best;
    }
    for (size_t i = 0; i < nfull; i++)
        units[i] = fullc[i].pieces / PV_RES_SHARE_BASE;
    if (fragment == 0) {
        best.plans = count_full(units, nfull, full);
        return best;
    }
    /* fragment cores may number at most (all cores − full) */
    int64_t max_frag = (int64_t)(nfull + nfrag) - full;
    int64_t max_moved = max_frag - (int64_t)nfrag;
    if (max_moved > (int64_t)nfull) max_moved = (int64_t)nfull;
    if (max_moved < 0) max_moved = 0;
    int64_t frag_plans = 0;
    for (size_t i = 0; i < nfrag; i++)
        frag_plans += fragc[i].pieces / fragment;
    for (int64_t m = 0; m <= max_moved; m++) {
        if (m > 0) frag_plans += fullc[m - 1].pieces / fragment;
        int64_t whole = count_full(units + m, nfull - (size_t)m, full);
        int64_t plans = whole < frag_plans ? whole : frag_plans;
        if (plans > best.plans) {
            best.plans = plans;
            best.moved = (size_t)m;
        }
    }
    return best;
}

/*
 * Plans within one pool, at most max_plans (memory), and takes their pieces from the pool's
 * owners (the working copy of the node) so that a later pool sees what is left.
 * Returns the number of plans, or -1 when out of memory.
 */
static int64_t pool_plans(pool_core *pool, size_t n, int64_t full, int64_t fragment,
                          int64_t max_plans) {
    pool_core *fullc = malloc((n ? n : 1) * sizeof *fullc);
    pool_core *fragc = malloc((n ? n : 1) * sizeof *fragc);
    int64_t *units = malloc((n ? n : 1) * sizeof *units);
    if (!fullc || !fragc || !units) {
        free(fullc);
        free(fragc);
        free(units);
        return -1;
    }
    size_t nfull = 0, nfrag = 0;
    for (size_t i = 0; i < n; i++) {
        if (pool[i].pieces >= PV_RES_SHARE_BASE && pool[i].pieces % PV_RES_SHARE_BASE == 0)
            fullc[nfull++] = pool[i];
        else if (pool[i].pieces > 0)
            fragc[nfrag++] = pool[i];
    }
    qsort(fullc, nfull, sizeof *fullc, by_load);
    qsort(fragc, nfrag, sizeof *fragc, by_load);
    split s = best_split(fullc, nfull, fragc, nfrag, full, fragment, units);
    int64_t plans = s.plans < max_plans ? s.plans : max_plans;
    if (plans > 0 && full > 0) {
        /* whole parts come from the full cores not moved to fragments */
        pool_core *rest = fullc + s.moved;
        size_t nrest = nfull - s.moved;
        for (int64_t p = 0; p < plans; p++) {
            /* the `full` freest distinct cores of this round (ties: the higher id, as Eru's
             * heap orders them); units[i] == -1 marks a core taken in this round */
            for (int64_t picked = 0; picked < full; picked++) {
                size_t best = nrest;
                for (size_t i = 0; i < nrest; i++) {
                    if (rest[i].pieces < PV_RES_SHARE_BASE || units[i] == -1) continue;
                    if (best == nrest || rest[i].pieces > rest[best].pieces ||
                        (rest[i].pieces == rest[best].pieces && rest[i].id > rest[best].id))
                        best = i;
                }
                if (best == nrest) break;
                rest[best].pieces -= PV_RES_SHARE_BASE;
                rest[best].owner->used += PV_RES_SHARE_BASE;
                units[best] = -1; /* taken in this round */
            }
            for (size_t i = 0; i < nrest; i++)
                units[i] = 0;
        }
    }
    if (plans > 0 && fragment > 0) {
        /* fragment parts: fragment cores first, then the moved full cores, each in load order */
        int64_t left = plans;
        for (size_t pass = 0; pass < 2 && left > 0; pass++) {
            pool_core *v = pass == 0 ? fragc : fullc;
            size_t nv = pass == 0 ? nfrag : s.moved;
            for (size_t i = 0; i < nv && left > 0; i++) {
                int64_t k = v[i].pieces / fragment;
                if (k > left) k = left;
                v[i].owner->used += k * fragment;
                left -= k;
            }
        }
    }
    free(fullc);
    free(fragc);
    free(units);
    return plans;
}

static int64_t mem_cap(int64_t free_mem, int64_t request) {
    if (request <= 0) return PV_RES_UNBOUNDED;
    return free_mem > 0 ? free_mem / request : 0;
}

/* Binding capacity over a working copy of the cores (used pieces get updated). */
static int64_t bound_plans(const pv_res_cpumem *node, pv_res_core *cores,
                           const pv_res_cpumem_req *req) {
    int64_t pieces = (int64_t)(req->cpu_request * PV_RES_SHARE_BASE + 0.5); /* nearest piece */
    int64_t full = pieces / PV_RES_SHARE_BASE, fragment = pieces % PV_RES_SHARE_BASE;
    if (pieces <= 0) return 0;
    pool_core *pool = malloc((node->ncores ? node->ncores : 1) * sizeof *pool);
    if (!pool) return -1;
    int64_t mem_free = node->memory - node->memory_used, total = 0;
    for (size_t numa = 0; numa <= node->nnuma; numa++) {
        int cross = numa == node->nnuma; /* the last pass: across NUMA nodes */
        size_t n = 0;
        for (size_t i = 0; i < node->ncores; i++) {
            if (!cross && cores[i].numa != (int)numa) continue;
            pool[n++] = (pool_core){
                .id = cores[i].id, .pieces = cores[i].pieces - cores[i].used, .owner = &cores[i]};
        }
        int64_t limit = cross ? mem_cap(mem_free, req->memory_request)
                              : mem_cap(node->numa_memory[numa] - node->numa_memory_used[numa],
                                        req->memory_request);
        int64_t got = pool_plans(pool, n, full, fragment, limit);
        if (got < 0) {
            free(pool);
            return -1;
        }
        total += got;
        mem_free -= got * req->memory_request;
    }
    free(pool);
    return total;
}

int pv_res_cpumem_capacity(const pv_res_cpumem *node, const pv_res_cpumem_req *req, pv_res_cap *out,
                           pv_status *st) {
    memset(out, 0, sizeof *out);
    out->weight = 1;
    if (!req->cpu_bind) {
        out->usage = ratio((double)node->memory_used, (double)node->memory);
        if (req->cpu_request > (double)node->ncores) return PV_OK;
        out->capacity = mem_cap(node->memory - node->memory_used, req->memory_request);
        out->rate =
            req->memory_request > 0 ? ratio((double)req->memory_request, (double)node->memory) : 0;
        return PV_OK;
    }
    out->weight = 100; /* binding decides above everything else, as in Eru */
    out->usage = ratio(node->cpu_used, (double)node->ncores);
    out->rate = ratio(req->cpu_request, (double)node->ncores);
    pv_res_core *cores = malloc((node->ncores ? node->ncores : 1) * sizeof *cores);
    if (!cores) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    memcpy(cores, node->cores, node->ncores * sizeof *cores);
    int64_t plans = bound_plans(node, cores, req);
    free(cores);
    if (plans < 0) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    out->capacity = plans;
    return PV_OK;
}

/* ---- storage: node ---- */

#define STORAGE "storage"
#define PV_RES_MAX_VOLUMES 1024

void pv_res_storage_free(pv_res_storage *node) {
    if (!node) return;
    for (size_t i = 0; i < node->nvolumes; i++)
        free(node->volumes[i].path);
    free(node->volumes);
    memset(node, 0, sizeof *node);
}

static int string_list(const char *plugin, const json_t *doc, const char *field, const json_t **out,
                       pv_status *st) {
    *out = json_object_get(doc, field);
    if (!*out) return PV_OK;
    if (!json_is_array(*out) || json_array_size(*out) > PV_RES_MAX_VOLUMES)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: %s: must be a list of at most %d strings", plugin, field,
                             PV_RES_MAX_VOLUMES);
    size_t i;
    const json_t *e;
    json_array_foreach(*out, i, e) {
        if (!json_is_string(e))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s[%zu]: must be a string", plugin,
                                 field, i);
    }
    return PV_OK;
}

/* "/data0:1T" */
static int parse_node_volume(const char *text, size_t i, pv_res_volume *vol, pv_status *st) {
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text || strchr(text, ':') != colon)
        return pv_status_set(
            st, PV_INVALID_ARGUMENT,
            STORAGE ": volumes[%zu]: \"%s\" must be path:size (e.g. \"/data0:1T\")", i, text);
    if (pv_res_size_parse(colon + 1, &vol->size, st) != PV_OK)
        return pv_status_prefix(st, STORAGE ": volumes[%zu]", i);
    vol->path = strndup(text, (size_t)(colon - text));
    if (!vol->path) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    return PV_OK;
}

int pv_res_storage_node_parse(const char *json, size_t len, const pv_res_engine_info *info,
                              pv_res_storage *node, pv_status *st) {
    static const char *const k_fields[] = {"storage", "volumes", NULL};
    memset(node, 0, sizeof *node);
    json_t *doc = load_doc(STORAGE, json, len, st);
    if (!doc) return st->code;
    const json_t *vols = NULL;
    int rc = only_known(STORAGE, doc, k_fields, st);
    if (rc == PV_OK) rc = string_list(STORAGE, doc, "volumes", &vols, st);
    if (rc == PV_OK) {
        if (json_object_get(doc, "storage"))
            rc = get_size(STORAGE, doc, "storage", &node->storage, st);
        else if (info && info->storage_total > 0)
            node->storage = info->storage_total / 10 * 8;
    }
    size_t n = vols ? json_array_size(vols) : 0;
    if (rc == PV_OK && n > 0) {
        node->volumes = calloc(n, sizeof *node->volumes);
        if (!node->volumes)
            rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    }
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        rc =
            parse_node_volume(json_string_value(json_array_get(vols, i)), i, &node->volumes[i], st);
        if (rc != PV_OK) break;
        node->nvolumes = i + 1;
        for (size_t j = 0; j < i && rc == PV_OK; j++)
            if (strcmp(node->volumes[j].path, node->volumes[i].path) == 0)
                rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                                   STORAGE ": volumes[%zu]: %s appears twice", i,
                                   node->volumes[i].path);
        if (rc == PV_OK && node->storage > INT64_MAX - node->volumes[i].size)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, STORAGE ": volumes: total is too large");
        if (rc == PV_OK) node->storage += node->volumes[i].size; /* Eru counts volumes in storage */
    }
    if (rc == PV_OK && n > 0) node->nvolumes = n;
    json_decref(doc);
    if (rc != PV_OK) pv_res_storage_free(node);
    return rc;
}

/* ---- storage: workload request ---- */

void pv_res_storage_req_free(pv_res_storage_req *req) {
    if (!req) return;
    for (size_t i = 0; i < req->nvolumes; i++) {
        free(req->volumes[i].src);
        free(req->volumes[i].dst);
        free(req->volumes[i].flags);
    }
    free(req->volumes);
    memset(req, 0, sizeof *req);
}

static int flag_cmp(const void *a, const void *b) {
    return *(const char *)a - *(const char *)b;
}

static int requires_schedule(const pv_res_binding *b) {
    size_t n = strlen(b->src);
    return n == 0 || (n >= 4 && strcmp(b->src + n - 4, "AUTO") == 0);
}

static int is_mono(const pv_res_binding *b) {
    return requires_schedule(b) && strchr(b->flags, 'm') != NULL;
}

/* "src:dst[:flags][:size]" */
static int parse_binding(const char *text, size_t i, pv_res_binding *b, pv_status *st) {
    const char *parts[4] = {0};
    size_t lens[4] = {0}, n = 0;
    const char *p = text;
    for (;;) {
        size_t len = strcspn(p, ":");
        if (n == 4)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 STORAGE ": volumes[%zu]: \"%s\" must be src:dst[:flags][:size]", i,
                                 text);
        parts[n] = p;
        lens[n++] = len;
        if (!p[len]) break;
        p += len + 1;
    }
    if (n < 2 || lens[1] == 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             STORAGE ": volumes[%zu]: \"%s\" must be src:dst[:flags][:size]", i,
                             text);
    if (n == 4) {
        char size[64];
        snprintf(size, sizeof size, "%.*s", (int)lens[3], parts[3]);
        if (pv_res_size_parse(size, &b->size, st) != PV_OK)
            return pv_status_prefix(st, STORAGE ": volumes[%zu]", i);
    }
    b->src = strndup(parts[0], lens[0]);
    b->dst = strndup(parts[1], lens[1]);
    b->flags = n >= 3 && lens[2] > 0 ? strndup(parts[2], lens[2]) : strdup("rw");
    if (!b->src || !b->dst || !b->flags)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    qsort(b->flags, strlen(b->flags), 1, flag_cmp);
    if (is_mono(b) && b->size == 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             STORAGE ": volumes[%zu]: \"%s\": an exclusive (m) volume needs a size",
                             i, text);
    return PV_OK;
}

int pv_res_storage_req_parse(const char *json, size_t len, pv_res_storage_req *req, pv_status *st) {
    static const char *const k_fields[] = {"storage-request", "storage-limit", "storage", "volumes",
                                           NULL};
    memset(req, 0, sizeof *req);
    json_t *doc = load_doc(STORAGE, json, len, st);
    if (!doc) return st->code;
    const json_t *vols = NULL;
    int rc = only_known(STORAGE, doc, k_fields, st);
    if (rc == PV_OK) rc = get_size(STORAGE, doc, "storage-request", &req->storage_request, st);
    if (rc == PV_OK) rc = get_size(STORAGE, doc, "storage-limit", &req->storage_limit, st);
    if (rc == PV_OK && json_object_get(doc, "storage")) {
        rc = get_size(STORAGE, doc, "storage", &req->storage_request, st);
        req->storage_limit = req->storage_request;
    }
    if (rc == PV_OK) rc = string_list(STORAGE, doc, "volumes", &vols, st);
    size_t n = vols ? json_array_size(vols) : 0;
    if (rc == PV_OK && n > 0) {
        req->volumes = calloc(n, sizeof *req->volumes);
        if (!req->volumes)
            rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
        else
            req->nvolumes = n;
    }
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        rc = parse_binding(json_string_value(json_array_get(vols, i)), i, &req->volumes[i], st);
    json_decref(doc);
    if (rc != PV_OK) {
        pv_res_storage_req_free(req);
        return rc;
    }
    if (req->storage_limit > 0 && req->storage_request == 0)
        req->storage_request = req->storage_limit;
    if (req->storage_limit > 0 && req->storage_request > req->storage_limit)
        req->storage_limit = req->storage_request; /* a soft limit, as Eru has it */
    for (size_t i = 0; i < n; i++) {
        if (req->storage_request > INT64_MAX - req->volumes[i].size ||
            req->storage_limit > INT64_MAX - req->volumes[i].size) {
            pv_res_storage_req_free(req);
            return pv_status_set(st, PV_INVALID_ARGUMENT, STORAGE ": volumes: total is too large");
        }
        req->storage_request += req->volumes[i].size;
        req->storage_limit += req->volumes[i].size;
    }
    return PV_OK;
}

/* ---- storage: volume plans ----
 *
 * Requests that need scheduling are "normal" (AUTO with a size), "mono" (AUTO with flag m: a
 * whole unused volume each) or "unlimited" (AUTO without a size: needs some volume, takes no
 * room). Normal requests go on volumes already in use, smallest fitting volume first; mono
 * requests on unused volumes. While mono plans outnumber normal ones, Eru moves the smallest
 * unused volume that fits a normal request over to the used side; so do we.
 */

typedef struct vol {
    const char *path;
    int64_t free;
    int used;
} vol;

static int vol_cmp(const void *a, const void *b) {
    const vol *x = a, *y = b;
    if (x->free != y->free) return x->free < y->free ? -1 : 1;
    return strcmp(x->path, y->path);
}

static int64_t normal_plans(const vol *vols, size_t nv, int64_t *scratch, const int64_t *sizes,
                            size_t nsizes) {
    if (nsizes == 0) return PV_RES_UNBOUNDED;
    size_t k = 0;
    for (size_t i = 0; i < nv; i++)
        if (vols[i].used) scratch[k++] = vols[i].free;
    if (nsizes == 1) { /* one request: every volume holds floor(free / size) of it */
        int64_t plans = 0;
        for (size_t i = 0; i < k; i++)
            plans += scratch[i] / sizes[0];
        return plans < PV_RES_STORAGE_MAX_PLANS ? plans : PV_RES_STORAGE_MAX_PLANS;
    }
    int64_t plans = 0;
    while (plans < PV_RES_STORAGE_MAX_PLANS) {
        for (size_t r = 0; r < nsizes; r++) {
            size_t best = k;
            for (size_t i = 0; i < k; i++)
                if (scratch[i] >= sizes[r] && (best == k || scratch[i] < scratch[best])) best = i;
            if (best == k) return plans;
            scratch[best] -= sizes[r];
        }
        plans++;
    }
    return plans;
}

static int64_t mono_plans(const vol *vols, size_t nv, int64_t mono_total, size_t nmono) {
    if (nmono == 0) return PV_RES_UNBOUNDED;
    int64_t plans = 0;
    for (size_t i = 0; i < nv; i++)
        if (!vols[i].used && vols[i].free >= mono_total) plans++;
    return plans;
}

static int size_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Returns the number of volume plans, or -1 when out of memory. */
static int64_t volume_plans(const pv_res_storage *node, const pv_res_storage_req *req) {
    size_t nnormal = 0, nmono = 0, nsched = 0;
    int64_t mono_total = 0;
    for (size_t i = 0; i < req->nvolumes; i++) {
        const pv_res_binding *b = &req->volumes[i];
        if (!requires_schedule(b)) continue;
        nsched++;
        if (is_mono(b))
            nmono++, mono_total += b->size;
        else if (b->size > 0)
            nnormal++;
    }
    if (nsched == 0) return PV_RES_UNBOUNDED;
    if (node->nvolumes == 0) return 0;
    size_t nv = node->nvolumes;
    vol *vols = malloc(nv * sizeof *vols);
    int64_t *sizes = malloc((nnormal ? nnormal : 1) * sizeof *sizes);
    int64_t *scratch = malloc(nv * sizeof *scratch);
    if (!vols || !sizes || !scratch) {
        free(vols);
        free(sizes);
        free(scratch);
        return -1;
    }
    for (size_t i = 0; i < nv; i++)
        vols[i] = (vol){.path = node->volumes[i].path,
                        .free = node->volumes[i].size - node->volumes[i].used,
                        .used = node->volumes[i].used != 0};
    qsort(vols, nv, sizeof *vols, vol_cmp);
    size_t k = 0;
    for (size_t i = 0; i < req->nvolumes; i++) {
        const pv_res_binding *b = &req->volumes[i];
        if (requires_schedule(b) && !is_mono(b) && b->size > 0) sizes[k++] = b->size;
    }
    qsort(sizes, nnormal, sizeof *sizes, size_cmp);
    int64_t normal = normal_plans(vols, nv, scratch, sizes, nnormal);
    int64_t mono = mono_plans(vols, nv, mono_total, nmono);
    while (mono > normal && nnormal > 0) {
        size_t p = nv; /* the smallest unused volume that fits the smallest normal request */
        for (size_t i = 0; i < nv && p == nv; i++)
            if (!vols[i].used && vols[i].free >= sizes[0]) p = i;
        if (p == nv) break;
        vols[p].used = 1;
        normal = normal_plans(vols, nv, scratch, sizes, nnormal);
        mono = mono_plans(vols, nv, mono_total, nmono);
    }
    free(vols);
    free(sizes);
    free(scratch);
    return normal < mono ? normal : mono;
}

int pv_res_storage_capacity(const pv_res_storage *node, const pv_res_storage_req *req,
                            pv_res_cap *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    out->weight = 1;
    int64_t plans = volume_plans(node, req);
    if (plans < 0) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    out->capacity = plans;
    if (req->storage_request > 0) {
        int64_t left = node->storage - node->storage_used;
        int64_t by_storage = left > 0 ? left / req->storage_request : 0;
        if (req->nvolumes == 0 || by_storage < out->capacity) out->capacity = by_storage;
    }
    int64_t vol_total = 0, vol_used = 0, req_vol = 0;
    for (size_t i = 0; i < node->nvolumes; i++) {
        vol_total += node->volumes[i].size;
        vol_used += node->volumes[i].used;
    }
    if (vol_total == 0 && node->storage == 0) return PV_OK;
    for (size_t i = 0; i < req->nvolumes; i++)
        req_vol += req->volumes[i].size;
    if (req->nvolumes > 0 || req->storage_request == 0) {
        out->usage = ratio((double)vol_used, (double)vol_total);
        out->rate = ratio((double)req_vol, (double)vol_total);
    } else {
        out->usage = ratio((double)node->storage_used, (double)node->storage);
        out->rate = ratio((double)req->storage_request, (double)node->storage);
    }
    return PV_OK;
}
