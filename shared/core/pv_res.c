/*
 * pv_res: the cpumem and storage resource plugins of Eru, as pure functions (see pv_res.h).
 *
 * Why here and not in the scheduler: the gateway must refuse a bad AddNode/SetNode document with
 * the same words the scheduler would use later, so both link one parser.
 *
 * The capacity rules follow the public Eru plugins (projecteru2/core resource/plugins/cpumem and
 * projecteru2/resource-storage) with these deliberate differences, all for determinism or
 * correctness: NUMA nodes are visited in index order (Eru walks a Go map), a CPU request is
 * rounded to the nearest piece (Eru truncates 0.29 × 100 to 28), and normal volume plans are
 * counted up to PV_RES_STORAGE_MAX_PLANS per node (Eru's scheduler has the same kind of cap).
 * Two counts are made by allocating one plan at a time (one_by_one_plans,
 * one_by_one_volume_plans): binding requests of whole cores plus a fragment, and volume requests
 * mixing normal and exclusive volumes. Eru counts them in one pass, but taking its first plan can
 * leave a node where the next pass finds more plans than it had left (or fewer), and the
 * scheduler allocates one workload at a time: capacity must be what that gets.
 *
 * The whole-node part (pv_res_node_*) joins the plugins: node, usage, request and allocation
 * objects keyed by plugin, allocation as the first plan of the count, and SetNode deltas.
 */
#include "pv_res.h"
#include "pv_json.h"

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
#define PV_RES_CPU_MAX_PLANS 10000 /* binding plans counted one by one per node at most */

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
    /* Eru's rules: a request of 0 takes the limit, a limit below the request (0 included) is
     * raised to it, so what a workload is granted is also what it may use. */
    if (req->cpu_request == 0) req->cpu_request = req->cpu_limit;
    if (req->cpu_limit < req->cpu_request) req->cpu_limit = req->cpu_request;
    if (req->memory_request == 0) req->memory_request = req->memory_limit;
    if (req->memory_limit < req->memory_request) req->memory_limit = req->memory_request;
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

/*
 * Binding plans over a working copy of the cores (used pieces get updated), at most max_total of
 * them: PV_RES_UNBOUNDED counts the capacity, 1 takes the plan an allocation gets (the first one
 * the count makes). *where (may be NULL) gets the NUMA node of the last plan taken, -1 for a plan
 * across NUMA nodes. Returns the number of plans, or -1 when out of memory.
 */
static int64_t bound_plans(const pv_res_cpumem *node, pv_res_core *cores,
                           const pv_res_cpumem_req *req, int64_t max_total, int *where) {
    int64_t pieces = (int64_t)(req->cpu_request * PV_RES_SHARE_BASE + 0.5); /* nearest piece */
    int64_t full = pieces / PV_RES_SHARE_BASE, fragment = pieces % PV_RES_SHARE_BASE;
    if (where) *where = -1;
    if (pieces <= 0) return 0;
    pool_core *pool = malloc((node->ncores ? node->ncores : 1) * sizeof *pool);
    if (!pool) return -1;
    int64_t mem_free = node->memory - node->memory_used, total = 0;
    for (size_t numa = 0; numa <= node->nnuma && total < max_total; numa++) {
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
        if (limit > max_total - total) limit = max_total - total;
        int64_t got = pool_plans(pool, n, full, fragment, limit);
        if (got < 0) {
            free(pool);
            return -1;
        }
        if (got > 0 && where) *where = cross ? -1 : (int)numa;
        total += got;
        mem_free -= got * req->memory_request;
    }
    free(pool);
    return total;
}

/*
 * Binding plans of whole cores plus a fragment, counted by taking the first plan again and again
 * (what pv_res_node_alloc does), at most PV_RES_CPU_MAX_PLANS. For these requests Eru's one-pass
 * count is not what one-at-a-time allocation gets: a plan turns a whole core into a fragment core
 * and the next count may find more plans than were left (or fewer). Whole-only and fragment-only
 * requests have no such effect, and keep the one-pass count. Returns -1 when out of memory.
 */
static int64_t one_by_one_plans(const pv_res_cpumem *node, pv_res_core *cores,
                                const pv_res_cpumem_req *req) {
    pv_res_cpumem sim = *node; /* shallow: cores and NUMA usage are working copies */
    int64_t *numa_used = malloc((node->nnuma ? node->nnuma : 1) * sizeof *numa_used);
    if (!numa_used) return -1;
    if (node->nnuma) memcpy(numa_used, node->numa_memory_used, node->nnuma * sizeof *numa_used);
    sim.cores = cores;
    sim.numa_memory_used = numa_used;
    int64_t plans = 0;
    while (plans < PV_RES_CPU_MAX_PLANS) {
        int where;
        int64_t got = bound_plans(&sim, cores, req, 1, &where);
        if (got <= 0) {
            if (got < 0) plans = -1;
            break;
        }
        sim.memory_used += req->memory_request;
        if (where >= 0) numa_used[where] += req->memory_request;
        plans++;
    }
    free(numa_used);
    return plans;
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
    int64_t pieces = (int64_t)(req->cpu_request * PV_RES_SHARE_BASE + 0.5);
    int64_t plans = pieces >= PV_RES_SHARE_BASE && pieces % PV_RES_SHARE_BASE
                        ? one_by_one_plans(node, cores, req)
                        : bound_plans(node, cores, req, PV_RES_UNBOUNDED, NULL);
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
            if (scratch[i] > 0) plans += scratch[i] / sizes[0]; /* used beyond size: none */
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

/*
 * Returns the number of volume plans, or -1 when out of memory. keep (may be NULL) gets the
 * volumes as the count last split them (sorted by free room, then path; `used` says which side
 * each ended on; caller frees), or NULL when no volume needs scheduling or the node has none.
 */
static int64_t volume_plans(const pv_res_storage *node, const pv_res_storage_req *req, vol **keep) {
    if (keep) *keep = NULL;
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
    if (keep)
        *keep = vols;
    else
        free(vols);
    free(sizes);
    free(scratch);
    return normal < mono ? normal : mono;
}

static int set_new(json_t *obj, const char *key, json_t *v, pv_status *st) {
    if (!v || json_object_set_new(obj, key, v) != 0)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED, "allocation: out of memory");
    return PV_OK;
}

static int storage_exhausted(const pv_res_storage *node, const pv_res_storage_req *req,
                             pv_status *st) {
    int64_t left = node->storage - node->storage_used;
    if (req->storage_request > 0 && req->storage_request > left)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                             STORAGE ": storage-request %lld is more than the free storage %lld",
                             (long long)req->storage_request, (long long)(left > 0 ? left : 0));
    return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                         STORAGE ": no volume has room left for the requested volumes");
}

/* Eru's text for a binding: src:dst:flags:bytes. */
static char *binding_key(const pv_res_binding *b) {
    char *key = NULL;
    if (asprintf(&key, "%s:%s:%s:%lld", b->src, b->dst, b->flags, (long long)b->size) < 0)
        return NULL;
    return key;
}

/* Records that binding b sits on `path` with `bytes`: in add (per node volume) and, when given,
 * in the allocation's volumes and volume_plan. */
static int plan_put(const pv_res_storage *node, int64_t *add, json_t *volumes, json_t *plan,
                    const pv_res_binding *b, const char *path, int64_t bytes, pv_status *st) {
    for (size_t i = 0; i < node->nvolumes; i++)
        if (node->volumes[i].path == path) add[i] += bytes; /* vol.path points into node */
    if (!volumes) return PV_OK;
    json_t *have = json_object_get(volumes, path);
    int rc =
        set_new(volumes, path, json_integer((have ? json_integer_value(have) : 0) + bytes), st);
    char *key = binding_key(b);
    if (rc == PV_OK && !key)
        rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    json_t *inner = key ? json_object_get(plan, key) : NULL;
    if (rc == PV_OK && !inner) rc = set_new(plan, key, inner = json_object(), st);
    if (rc == PV_OK) {
        have = json_object_get(inner, path); /* the same binding twice: one entry, summed */
        rc = set_new(inner, path, json_integer((have ? json_integer_value(have) : 0) + bytes), st);
    }
    free(key);
    return rc;
}

/* Bindings of one kind in Eru's order: by size, then as given. */
static size_t bindings_by_size(const pv_res_storage_req *req, int mono,
                               const pv_res_binding **out) {
    size_t n = 0;
    for (size_t i = 0; i < req->nvolumes; i++) {
        const pv_res_binding *b = &req->volumes[i];
        if (!requires_schedule(b) || is_mono(b) != mono || (!mono && b->size == 0)) continue;
        size_t j = n++;
        for (; j > 0 && out[j - 1]->size > b->size; j--) /* insertion: stable */
            out[j] = out[j - 1];
        out[j] = b;
    }
    return n;
}

/*
 * The first volume plan of the count (volume_plans): normal bindings, smallest first, each on the
 * used volume with the least room that fits; the mono bindings together on the first unused
 * volume that holds them all, which they take whole (shared in proportion to their sizes, the
 * rounding rest to the smallest); unlimited bindings on the volume with the most room left.
 */
static int storage_plan(const pv_res_storage *node, const pv_res_storage_req *req, int64_t *add,
                        json_t *volumes, json_t *plan, pv_status *st) {
    vol *vols;
    int64_t plans = volume_plans(node, req, &vols);
    size_t nv = node->nvolumes;
    const pv_res_binding **list = malloc((req->nvolumes + 1) * sizeof *list);
    int rc = PV_OK;
    if (plans < 0 || !list)
        rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    else if (plans < 1 || !vols)
        rc = storage_exhausted(node, req, st);
    size_t n = rc == PV_OK ? bindings_by_size(req, 0, list) : 0;
    for (size_t r = 0; rc == PV_OK && r < n; r++) {
        size_t best = nv;
        for (size_t i = 0; i < nv; i++)
            if (vols[i].used && vols[i].free >= list[r]->size &&
                (best == nv || vols[i].free < vols[best].free))
                best = i;
        if (best == nv) {
            rc = storage_exhausted(node, req, st);
            break;
        }
        vols[best].free -= list[r]->size;
        rc = plan_put(node, add, volumes, plan, list[r], vols[best].path, list[r]->size, st);
    }
    n = rc == PV_OK ? bindings_by_size(req, 1, list) : 0;
    if (n > 0) {
        int64_t total = 0;
        for (size_t r = 0; r < n; r++)
            total += list[r]->size;
        size_t pick = nv;
        for (size_t i = 0; i < nv && pick == nv; i++)
            if (!vols[i].used && vols[i].free >= total) pick = i;
        if (pick == nv) rc = storage_exhausted(node, req, st);
        int64_t whole = pick < nv ? vols[pick].free : 0, given = 0;
        int64_t *share = calloc(n, sizeof *share);
        if (rc == PV_OK && !share)
            rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
        for (size_t r = 0; rc == PV_OK && r < n; r++)
            given += share[r] = (int64_t)((__int128)list[r]->size * whole / total);
        if (rc == PV_OK) share[0] += whole - given;
        for (size_t r = 0; rc == PV_OK && r < n; r++)
            rc = plan_put(node, add, volumes, plan, list[r], vols[pick].path, share[r], st);
        if (rc == PV_OK) vols[pick].free = 0;
        free(share);
    }
    for (size_t i = 0; rc == PV_OK && i < req->nvolumes; i++) {
        const pv_res_binding *b = &req->volumes[i];
        if (!requires_schedule(b) || is_mono(b) || b->size > 0) continue;
        size_t most = nv; /* most room; ties: used volumes first, then the order above */
        for (int side = 1; side >= 0; side--)
            for (size_t k = 0; k < nv; k++)
                if (vols[k].used == side && (most == nv || vols[k].free > vols[most].free))
                    most = k;
        rc = plan_put(node, add, volumes, plan, b, vols[most].path, 0, st);
    }
    free(vols);
    free(list);
    return rc;
}

/*
 * Volume plans for requests with both normal and exclusive (mono) volumes, counted by taking the
 * first plan again and again (what pv_res_node_alloc does). Eru's one-pass count moves unused
 * volumes to the used side until mono plans no longer outnumber normal ones; after an allocation
 * the split starts again from what is really in use, so the one-pass count is not what
 * one-at-a-time allocation gets. Normal-only and mono-only requests keep the one-pass count.
 * Returns -1 when out of memory.
 */
static int64_t one_by_one_volume_plans(const pv_res_storage *node, const pv_res_storage_req *req) {
    pv_res_storage sim = *node; /* shallow: the paths stay the node's */
    size_t nv = node->nvolumes;
    sim.volumes = malloc((nv ? nv : 1) * sizeof *sim.volumes);
    int64_t *add = malloc((nv ? nv : 1) * sizeof *add), plans = 0;
    if (!sim.volumes || !add) plans = -1;
    if (plans == 0 && nv) memcpy(sim.volumes, node->volumes, nv * sizeof *sim.volumes);
    while (plans >= 0 && plans < PV_RES_STORAGE_MAX_PLANS) {
        int64_t n = volume_plans(&sim, req, NULL);
        if (n <= 0) {
            if (n < 0) plans = -1;
            break;
        }
        pv_status st;
        memset(add, 0, nv * sizeof *add);
        if (storage_plan(&sim, req, add, NULL, NULL, &st) != PV_OK) break;
        for (size_t i = 0; i < nv; i++)
            sim.volumes[i].used += add[i];
        plans++;
    }
    free(sim.volumes);
    free(add);
    return plans;
}

int pv_res_storage_capacity(const pv_res_storage *node, const pv_res_storage_req *req,
                            pv_res_cap *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    out->weight = 1;
    size_t nnormal = 0, nmono = 0;
    for (size_t i = 0; i < req->nvolumes; i++) {
        const pv_res_binding *b = &req->volumes[i];
        nmono += is_mono(b);
        nnormal += requires_schedule(b) && !is_mono(b) && b->size > 0;
    }
    int64_t plans =
        nnormal && nmono ? one_by_one_volume_plans(node, req) : volume_plans(node, req, NULL);
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

/* ---- a whole node ----
 *
 * The plugins glued together. Resources, usage, requests and allocations are JSON objects keyed
 * by plugin. Every change to a node's used fields goes through one path (a usage/allocation
 * document parsed into a `use`, checked against a copy, then stored), and pv_res_node_alloc
 * applies the very document it returns through that path: what an allocation adds is exactly
 * what removing it takes back.
 */

#define CPU_DIGITS 1e6 /* cpu sums are kept to a millionth of a core so adds and removes cancel */

static const char *const k_plugins[] = {CPUMEM, STORAGE, NULL};

/* json NULL or "": "{}". Each member must be a known plugin whose value is an object. */
static json_t *load_plugins(const char *label, const char *json, pv_status *st) {
    if (!json || !*json) return json_object();
    json_error_t jerr;
    json_t *doc = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc) {
        pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not valid JSON: %s", label, jerr.text);
        return NULL;
    }
    const char *key;
    json_t *v;
    if (!json_is_object(doc)) {
        pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be a JSON object of plugin documents",
                      label);
        goto fail;
    }
    json_object_foreach(doc, key, v) {
        int known = 0;
        for (size_t i = 0; k_plugins[i] && !known; i++)
            known = strcmp(key, k_plugins[i]) == 0;
        if (!known) {
            pv_status_set(st, PV_INVALID_ARGUMENT, "%s: unknown plugin \"%s\" (known: %s, %s)",
                          label, key, CPUMEM, STORAGE);
            goto fail;
        }
        if (!json_is_object(v)) {
            pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: must be a JSON object", label, key);
            goto fail;
        }
    }
    return doc;
fail:
    json_decref(doc);
    return NULL;
}

/* A plugin's document as text for the plugin parsers: *text NULL when the plugin is absent. */
static int plugin_text(const json_t *doc, const char *plugin, char **text, pv_status *st) {
    const json_t *v = json_object_get(doc, plugin);
    *text = v ? pv_json_dumps(v, 0) : NULL;
    if (v && !*text) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, "%s: out of memory", plugin);
    return PV_OK;
}

static int dump_doc(json_t *doc, char **out, pv_status *st) {
    *out = doc ? pv_json_dumps(doc, 0) : NULL;
    json_decref(doc);
    if (!*out) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    return PV_OK;
}

/* ---- a whole node: parse ---- */

void pv_res_node_free(pv_res_node *node) {
    if (!node) return;
    pv_res_cpumem_free(&node->cpumem);
    pv_res_storage_free(&node->storage);
    memset(node, 0, sizeof *node);
}

/* An absent cpumem document: the engine's cores and 80% of its memory; no cores, no memory. */
static int cpumem_defaults(const pv_res_engine_info *info, pv_res_cpumem *c, pv_status *st) {
    memset(c, 0, sizeof *c);
    if (!info || info->cpu_count <= 0) return cores_alloc(c, 0, st);
    if (cores_whole(c, info->cpu_count, st) != PV_OK) return st->code;
    if (info->mem_total > 0) c->memory = info->mem_total / 10 * 8;
    return PV_OK;
}

/* What one usage or allocation document holds, indexed like the node's arrays. */
typedef struct use {
    double cpu_request, cpu_limit;
    int64_t memory_request, memory_limit;
    int64_t storage_request, storage_limit;
    int64_t *cores;   /* node->cpumem.ncores entries */
    int64_t *numa;    /* node->cpumem.nnuma entries */
    int64_t *volumes; /* node->storage.nvolumes entries; cores, numa and volumes are one block */
} use;

static int use_init(use *u, const pv_res_node *node, pv_status *st) {
    memset(u, 0, sizeof *u);
    size_t nc = node->cpumem.ncores, nn = node->cpumem.nnuma, nv = node->storage.nvolumes;
    u->cores = calloc(nc + nn + nv + 1, sizeof(int64_t));
    if (!u->cores) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    u->numa = u->cores + nc;
    u->volumes = u->numa + nn;
    return PV_OK;
}

static void use_free(use *u) {
    free(u->cores);
    memset(u, 0, sizeof *u);
}

/* The node's used fields as a use. */
static int use_of_node(use *u, const pv_res_node *node, pv_status *st) {
    if (use_init(u, node, st) != PV_OK) return st->code;
    const pv_res_cpumem *c = &node->cpumem;
    u->cpu_request = c->cpu_used;
    u->cpu_limit = node->cpu_limit_used;
    u->memory_request = c->memory_used;
    u->memory_limit = node->memory_limit_used;
    u->storage_request = node->storage.storage_used;
    u->storage_limit = node->storage_limit_used;
    for (size_t i = 0; i < c->ncores; i++)
        u->cores[i] = c->cores[i].used;
    for (size_t i = 0; i < c->nnuma; i++)
        u->numa[i] = c->numa_memory_used[i];
    for (size_t i = 0; i < node->storage.nvolumes; i++)
        u->volumes[i] = node->storage.volumes[i].used;
    return PV_OK;
}

static void use_store(pv_res_node *node, const use *u) {
    pv_res_cpumem *c = &node->cpumem;
    c->cpu_used = u->cpu_request;
    node->cpu_limit_used = u->cpu_limit;
    c->memory_used = u->memory_request;
    node->memory_limit_used = u->memory_limit;
    node->storage.storage_used = u->storage_request;
    node->storage_limit_used = u->storage_limit;
    for (size_t i = 0; i < c->ncores; i++)
        c->cores[i].used = u->cores[i];
    for (size_t i = 0; i < c->nnuma; i++)
        c->numa_memory_used[i] = u->numa[i];
    for (size_t i = 0; i < node->storage.nvolumes; i++)
        node->storage.volumes[i].used = u->volumes[i];
}

/* *have += sign × delta; what names the quantity ("cpumem: cpu_map: core 3"). */
static int use_add_bytes(const char *label, const char *what, int64_t *have, int64_t delta,
                         int sign, pv_status *st) {
    if (sign > 0) {
        if (*have > INT64_MAX - delta)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: %lld more is too large", label,
                                 what, (long long)delta);
        *have += delta;
        return PV_OK;
    }
    if (delta > *have)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "%s: %s: removing %lld from %lld in use would go below zero", label,
                             what, (long long)delta, (long long)*have);
    *have -= delta;
    return PV_OK;
}

static int use_add_cores(const char *label, const char *what, double *have, double delta, int sign,
                         pv_status *st) {
    double x = (*have + sign * delta) * CPU_DIGITS; /* |x| < 2^53: fits int64_t exactly */
    double sum = (double)(int64_t)(x < 0 ? x - 0.5 : x + 0.5) / CPU_DIGITS;
    if (sum < 0)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "%s: %s: removing %g from %g in use would go below zero", label, what,
                             delta, *have);
    *have = sum == 0 ? 0 : sum; /* no -0 */
    return PV_OK;
}

/* have ± delta, every field; have is left half-updated on failure (callers pass a copy). */
static int use_combine(const pv_res_node *node, use *have, const use *delta, int sign,
                       const char *label, pv_status *st) {
    const pv_res_cpumem *c = &node->cpumem;
    char what[160];
    int rc = use_add_cores(label, CPUMEM ": cpu_request", &have->cpu_request, delta->cpu_request,
                           sign, st);
    if (rc == PV_OK)
        rc = use_add_cores(label, CPUMEM ": cpu_limit", &have->cpu_limit, delta->cpu_limit, sign,
                           st);
    if (rc == PV_OK)
        rc = use_add_bytes(label, CPUMEM ": memory_request", &have->memory_request,
                           delta->memory_request, sign, st);
    if (rc == PV_OK)
        rc = use_add_bytes(label, CPUMEM ": memory_limit", &have->memory_limit, delta->memory_limit,
                           sign, st);
    for (size_t i = 0; rc == PV_OK && i < c->ncores; i++) {
        snprintf(what, sizeof what, CPUMEM ": cpu_map: core %d", c->cores[i].id);
        rc = use_add_bytes(label, what, &have->cores[i], delta->cores[i], sign, st);
    }
    for (size_t i = 0; rc == PV_OK && i < c->nnuma; i++) {
        snprintf(what, sizeof what, CPUMEM ": numa_memory: NUMA node %zu", i);
        rc = use_add_bytes(label, what, &have->numa[i], delta->numa[i], sign, st);
    }
    if (rc == PV_OK)
        rc = use_add_bytes(label, STORAGE ": storage_request", &have->storage_request,
                           delta->storage_request, sign, st);
    if (rc == PV_OK)
        rc = use_add_bytes(label, STORAGE ": storage_limit", &have->storage_limit,
                           delta->storage_limit, sign, st);
    for (size_t i = 0; rc == PV_OK && i < node->storage.nvolumes; i++) {
        snprintf(what, sizeof what, STORAGE ": volumes: %.100s", node->storage.volumes[i].path);
        rc = use_add_bytes(label, what, &have->volumes[i], delta->volumes[i], sign, st);
    }
    return rc;
}

/* ---- a whole node: usage and allocation documents ---- */

/* A non-negative integer of bytes or pieces; where names it ("usage: cpumem: memory_request"). */
static int use_int(const char *where, const json_t *v, int64_t *out, pv_status *st) {
    if (!json_is_integer(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be an integer", where);
    json_int_t n = json_integer_value(v);
    if (n < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %lld must not be negative", where,
                             (long long)n);
    *out = (int64_t)n;
    return PV_OK;
}

/* An object of key -> non-negative integer; each key goes through `slot`, which gives where the
 * value adds up (NULL with st set when the key is refused). */
typedef int64_t *(*slot_fn)(const char *where, const char *key, void *ctx, pv_status *st);

static int use_map(const char *where, const json_t *v, slot_fn slot, void *ctx, pv_status *st) {
    if (!json_is_object(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be a JSON object", where);
    const char *key;
    const json_t *e;
    json_object_foreach((json_t *)v, key, e) {
        char at[256];
        snprintf(at, sizeof at, "%.150s: %.80s", where, key);
        int64_t n = 0, *dst = slot(where, key, ctx, st);
        if (!dst) return st->code;
        if (use_int(at, e, &n, st) != PV_OK) return st->code;
        if (*dst > INT64_MAX - n)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: too large", at);
        *dst += n;
    }
    return PV_OK;
}

typedef struct slot_ctx {
    const pv_res_node *node;
    use *u;
} slot_ctx;

static int64_t *core_slot(const char *where, const char *key, void *ctx, pv_status *st) {
    slot_ctx *c = ctx;
    long long id;
    if (parse_int(key, strlen(key), 0, 1 << 20, &id) != 0) {
        pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%.80s\" is not a core id", where, key);
        return NULL;
    }
    pv_res_core *core = find_core((pv_res_cpumem *)&c->node->cpumem, (int)id);
    if (!core) {
        pv_status_set(st, PV_FAILED_PRECONDITION, "%s: core %lld is not on the node", where, id);
        return NULL;
    }
    return &c->u->cores[core - c->node->cpumem.cores];
}

static int numa_index(const char *where, const char *key, const pv_res_node *node, size_t *out,
                      pv_status *st) {
    long long idx;
    if (parse_int(key, strlen(key), 0, 1 << 20, &idx) != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%.80s\" is not a NUMA node index",
                             where, key);
    if ((size_t)idx >= node->cpumem.nnuma)
        return pv_status_set(st, PV_FAILED_PRECONDITION, "%s: NUMA node %lld is not on the node",
                             where, idx);
    *out = (size_t)idx;
    return PV_OK;
}

static int64_t *numa_slot(const char *where, const char *key, void *ctx, pv_status *st) {
    slot_ctx *c = ctx;
    size_t idx = 0;
    return numa_index(where, key, c->node, &idx, st) == PV_OK ? &c->u->numa[idx] : NULL;
}

static int64_t *volume_slot(const char *where, const char *key, void *ctx, pv_status *st) {
    slot_ctx *c = ctx;
    for (size_t i = 0; i < c->node->storage.nvolumes; i++)
        if (strcmp(c->node->storage.volumes[i].path, key) == 0) return &c->u->volumes[i];
    pv_status_set(st, PV_FAILED_PRECONDITION, "%s: %.100s is not a volume of the node", where, key);
    return NULL;
}

/* volume_plan values are where each binding sits; the volumes map already counts them. */
static int64_t *plan_slot(const char *where, const char *key, void *ctx, pv_status *st) {
    (void)where, (void)key, (void)st;
    return ctx;
}

static int use_cores_value(const char *where, const json_t *v, double *out, pv_status *st) {
    if (!json_is_number(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be a number of cores", where);
    double d = json_number_value(v);
    if (!(d >= 0) || d > 1e9)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %g must be between 0 and 1e9", where, d);
    *out = d;
    return PV_OK;
}

/* One field of a plugin's usage or allocation document into ctx->u; where names it. */
typedef int (*use_field_fn)(const char *where, const char *key, const json_t *v, slot_ctx *ctx,
                            pv_status *st);

/* Reads every field of doc (one plugin's usage or allocation document) with field: unknown keys,
 * and alloc_only among usage documents (label "usage"; only allocations say where they sit),
 * fail naming the label, the plugin and the key. */
static int parse_use(const char *label, const char *plugin, const json_t *doc,
                     const char *const *known, const char *alloc_only, use_field_fn field,
                     slot_ctx *ctx, pv_status *st) {
    int alloc = strcmp(label, "allocation") == 0;
    char prefix[64], where[128];
    snprintf(prefix, sizeof prefix, "%s: %s", label, plugin);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)doc, key, v) {
        size_t i = 0;
        while (known[i] && strcmp(known[i], key) != 0)
            i++;
        if (!known[i] || (!alloc && strcmp(key, alloc_only) == 0))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %.80s: unknown field", prefix, key);
        snprintf(where, sizeof where, "%s: %s", prefix, key);
        int rc = field(where, key, v, ctx, st);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

static int cpumem_use_field(const char *where, const char *key, const json_t *v, slot_ctx *ctx,
                            pv_status *st) {
    use *u = ctx->u;
    if (strcmp(key, "cpu_request") == 0) return use_cores_value(where, v, &u->cpu_request, st);
    if (strcmp(key, "cpu_limit") == 0) return use_cores_value(where, v, &u->cpu_limit, st);
    if (strcmp(key, "memory_request") == 0) return use_int(where, v, &u->memory_request, st);
    if (strcmp(key, "memory_limit") == 0) return use_int(where, v, &u->memory_limit, st);
    if (strcmp(key, "cpu_map") == 0) return use_map(where, v, core_slot, ctx, st);
    if (strcmp(key, "numa_memory") == 0) return use_map(where, v, numa_slot, ctx, st);
    /* numa_node */
    if (!json_is_string(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be a string", where);
    size_t idx;
    if (!*json_string_value(v)) return PV_OK; /* "": across NUMA nodes */
    return numa_index(where, json_string_value(v), ctx->node, &idx, st);
}

static int storage_use_field(const char *where, const char *key, const json_t *v, slot_ctx *ctx,
                             pv_status *st) {
    use *u = ctx->u;
    if (strcmp(key, "storage_request") == 0) return use_int(where, v, &u->storage_request, st);
    if (strcmp(key, "storage_limit") == 0) return use_int(where, v, &u->storage_limit, st);
    if (strcmp(key, "volumes") == 0) return use_map(where, v, volume_slot, ctx, st);
    /* volume_plan */
    if (!json_is_object(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: must be a JSON object", where);
    const char *binding;
    const json_t *plan;
    json_object_foreach((json_t *)v, binding, plan) {
        char at[256];
        int64_t sink = 0; /* checked for shape only */
        snprintf(at, sizeof at, "%.150s: %.80s", where, binding);
        int rc = use_map(at, plan, plan_slot, &sink, st);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

/* label: "usage" or "allocation" (only allocations say where they sit: numa_node, volume_plan). */
static int parse_cpumem_use(const char *label, const json_t *doc, const pv_res_node *node, use *u,
                            pv_status *st) {
    static const char *const k_fields[] = {"cpu_request",  "cpu_limit", "memory_request",
                                           "memory_limit", "cpu_map",   "numa_memory",
                                           "numa_node",    NULL};
    slot_ctx ctx = {node, u};
    return parse_use(label, CPUMEM, doc, k_fields, "numa_node", cpumem_use_field, &ctx, st);
}

static int parse_storage_use(const char *label, const json_t *doc, const pv_res_node *node, use *u,
                             pv_status *st) {
    static const char *const k_fields[] = {"storage_request", "storage_limit", "volumes",
                                           "volume_plan", NULL};
    slot_ctx ctx = {node, u};
    return parse_use(label, STORAGE, doc, k_fields, "volume_plan", storage_use_field, &ctx, st);
}

/* Adds (sign +1) or removes (-1) a usage or allocation object; node unchanged on failure. */
static int apply_doc(pv_res_node *node, const char *label, const char *json, int sign,
                     pv_status *st) {
    json_t *doc = load_plugins(label, json, st);
    if (!doc) return st->code;
    use delta, have = {0};
    int rc = use_init(&delta, node, st);
    const json_t *part = json_object_get(doc, CPUMEM);
    if (rc == PV_OK && part) rc = parse_cpumem_use(label, part, node, &delta, st);
    part = json_object_get(doc, STORAGE);
    if (rc == PV_OK && part) rc = parse_storage_use(label, part, node, &delta, st);
    if (rc == PV_OK) rc = use_of_node(&have, node, st);
    if (rc == PV_OK) rc = use_combine(node, &have, &delta, sign, label, st);
    if (rc == PV_OK) use_store(node, &have);
    use_free(&delta);
    use_free(&have);
    json_decref(doc);
    return rc;
}

int pv_res_node_parse(const char *resources_json, const char *usage_json,
                      const pv_res_engine_info *info, pv_res_node *node, pv_status *st) {
    memset(node, 0, sizeof *node);
    json_t *res = load_plugins("resources", resources_json, st);
    if (!res) return st->code;
    char *text = NULL;
    int rc = plugin_text(res, CPUMEM, &text, st);
    if (rc == PV_OK)
        rc = text ? pv_res_cpumem_node_parse(text, strlen(text), info, &node->cpumem, st)
                  : cpumem_defaults(info, &node->cpumem, st);
    free(text);
    text = NULL;
    if (rc == PV_OK) rc = plugin_text(res, STORAGE, &text, st);
    if (rc == PV_OK)
        rc = pv_res_storage_node_parse(text, text ? strlen(text) : 0, info, &node->storage, st);
    free(text);
    json_decref(res);
    if (rc == PV_OK && usage_json) rc = apply_doc(node, "usage", usage_json, 1, st);
    if (rc != PV_OK) pv_res_node_free(node);
    return rc;
}

int pv_res_node_usage_add(pv_res_node *node, const char *alloc_json, int sign, pv_status *st) {
    if (sign != 1 && sign != -1)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "allocation: sign: %d must be 1 or -1", sign);
    return apply_doc(node, "allocation", alloc_json, sign, st);
}

/* ---- a whole node: requests and capacity ---- */

void pv_res_req_free(pv_res_req *req) {
    if (!req) return;
    pv_res_storage_req_free(&req->storage);
    memset(req, 0, sizeof *req);
}

int pv_res_req_parse(const char *request_json, pv_res_req *req, pv_status *st) {
    memset(req, 0, sizeof *req);
    json_t *doc = load_plugins("request", request_json, st);
    if (!doc) return st->code;
    char *text = NULL;
    int rc = plugin_text(doc, CPUMEM, &text, st);
    if (rc == PV_OK) rc = pv_res_cpumem_req_parse(text, text ? strlen(text) : 0, &req->cpumem, st);
    free(text);
    text = NULL;
    if (rc == PV_OK) rc = plugin_text(doc, STORAGE, &text, st);
    if (rc == PV_OK)
        rc = pv_res_storage_req_parse(text, text ? strlen(text) : 0, &req->storage, st);
    free(text);
    json_decref(doc);
    if (rc != PV_OK) pv_res_req_free(req);
    return rc;
}

int pv_res_node_capacity(const pv_res_node *node, const pv_res_req *req, pv_res_cap *out,
                         pv_status *st) {
    pv_res_cap caps[2];
    memset(out, 0, sizeof *out);
    if (pv_res_cpumem_capacity(&node->cpumem, &req->cpumem, &caps[0], st) != PV_OK ||
        pv_res_storage_capacity(&node->storage, &req->storage, &caps[1], st) != PV_OK)
        return st->code;
    pv_res_cap_combine(caps, 2, out);
    return PV_OK;
}

/* ---- a whole node: allocation ---- */

/* Why one more workload does not fit, per plugin (called when its capacity is 0). */
static int cpumem_exhausted(const pv_res_cpumem *node, const pv_res_cpumem_req *req,
                            pv_status *st) {
    if (req->cpu_bind)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                             CPUMEM ": no cores left for cpu-request %g with cpu-bind "
                                    "(memory-request %lld, free memory %lld)",
                             req->cpu_request, (long long)req->memory_request,
                             (long long)(node->memory - node->memory_used));
    if (req->cpu_request > (double)node->ncores)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                             CPUMEM ": cpu-request %g is more than the node's %zu cores",
                             req->cpu_request, node->ncores);
    return pv_status_set(
        st, PV_RESOURCE_EXHAUSTED, CPUMEM ": memory-request %lld is more than the free memory %lld",
        (long long)req->memory_request, (long long)(node->memory - node->memory_used));
}

/* The cpumem part of an allocation: the cores of the first binding plan and its NUMA node. */
static int cpumem_alloc_doc(const pv_res_cpumem *node, const pv_res_cpumem_req *req, json_t *out,
                            pv_status *st) {
    int rc = set_new(out, "cpu_request", json_real(req->cpu_request), st);
    if (rc == PV_OK) rc = set_new(out, "cpu_limit", json_real(req->cpu_limit), st);
    if (rc == PV_OK) rc = set_new(out, "memory_request", json_integer(req->memory_request), st);
    if (rc == PV_OK) rc = set_new(out, "memory_limit", json_integer(req->memory_limit), st);
    if (rc != PV_OK || !req->cpu_bind) return rc;
    pv_res_core *cores = malloc((node->ncores ? node->ncores : 1) * sizeof *cores);
    if (!cores) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    memcpy(cores, node->cores, node->ncores * sizeof *cores);
    int where;
    int64_t got = bound_plans(node, cores, req, 1, &where);
    json_t *map = json_object();
    rc = set_new(out, "cpu_map", map, st);
    if (rc == PV_OK && got != 1)
        rc = got < 0 ? pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory")
                     : cpumem_exhausted(node, req, st);
    for (size_t i = 0; rc == PV_OK && i < node->ncores; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", cores[i].id);
        if (cores[i].used != node->cores[i].used)
            rc = set_new(map, id, json_integer(cores[i].used - node->cores[i].used), st);
    }
    free(cores);
    if (rc != PV_OK || where < 0) return rc;
    char idx[16];
    snprintf(idx, sizeof idx, "%d", where);
    json_t *numa = json_object();
    rc = set_new(out, "numa_node", json_string(idx), st);
    if (rc == PV_OK) rc = set_new(out, "numa_memory", numa, st);
    if (rc == PV_OK) rc = set_new(numa, idx, json_integer(req->memory_request), st);
    return rc;
}

static int storage_alloc_doc(const pv_res_storage *node, const pv_res_storage_req *req, json_t *out,
                             pv_status *st) {
    int rc = set_new(out, "storage_request", json_integer(req->storage_request), st);
    if (rc == PV_OK) rc = set_new(out, "storage_limit", json_integer(req->storage_limit), st);
    int sched = 0;
    for (size_t i = 0; i < req->nvolumes; i++)
        sched |= requires_schedule(&req->volumes[i]);
    if (rc != PV_OK || !sched) return rc;
    json_t *volumes = json_object(), *plan = json_object();
    rc = set_new(out, "volumes", volumes, st);
    if (rc == PV_OK) rc = set_new(out, "volume_plan", plan, st);
    int64_t *add = calloc(node->nvolumes + 1, sizeof *add);
    if (rc == PV_OK && !add)
        rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    if (rc == PV_OK) rc = storage_plan(node, req, add, volumes, plan, st);
    free(add);
    return rc;
}

int pv_res_node_alloc(pv_res_node *node, const pv_res_req *req, char **alloc_json, pv_status *st) {
    *alloc_json = NULL;
    pv_res_cap cap;
    if (pv_res_cpumem_capacity(&node->cpumem, &req->cpumem, &cap, st) != PV_OK) return st->code;
    if (cap.capacity < 1) return cpumem_exhausted(&node->cpumem, &req->cpumem, st);
    if (pv_res_storage_capacity(&node->storage, &req->storage, &cap, st) != PV_OK) return st->code;
    if (cap.capacity < 1) return storage_exhausted(&node->storage, &req->storage, st);
    json_t *doc = json_object(), *cpumem = json_object(), *storage = json_object();
    int rc = set_new(doc, CPUMEM, cpumem, st);
    if (rc == PV_OK) rc = set_new(doc, STORAGE, storage, st);
    if (rc == PV_OK) rc = cpumem_alloc_doc(&node->cpumem, &req->cpumem, cpumem, st);
    if (rc == PV_OK) rc = storage_alloc_doc(&node->storage, &req->storage, storage, st);
    if (rc != PV_OK) {
        json_decref(doc);
        return rc;
    }
    char *text;
    if (dump_doc(doc, &text, st) != PV_OK) return st->code;
    if (pv_res_node_usage_add(node, text, 1, st) != PV_OK) {
        free(text);
        return pv_status_prefix(st, "allocating");
    }
    *alloc_json = text;
    return PV_OK;
}

/* ---- a whole node: documents out ---- */

static int put_int(json_t *obj, const char *key, int64_t v, pv_status *st) {
    return v == 0 ? PV_OK : set_new(obj, key, json_integer(v), st);
}

/* obj into parent under key unless it is empty (then dropped). */
static int put_nonempty(json_t *parent, const char *key, json_t *obj, pv_status *st) {
    if (obj && json_object_size(obj) == 0) {
        json_decref(obj);
        return PV_OK;
    }
    return set_new(parent, key, obj, st);
}

static json_t *cpumem_usage(const pv_res_node *node, pv_status *st) {
    const pv_res_cpumem *c = &node->cpumem;
    json_t *doc = json_object(), *map = json_object(), *numa = json_object();
    int rc = doc && map && numa ? PV_OK
                                : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "usage: out of memory");
    if (rc == PV_OK && c->cpu_used != 0)
        rc = set_new(doc, "cpu_request", json_real(c->cpu_used), st);
    if (rc == PV_OK && node->cpu_limit_used != 0)
        rc = set_new(doc, "cpu_limit", json_real(node->cpu_limit_used), st);
    if (rc == PV_OK) rc = put_int(doc, "memory_request", c->memory_used, st);
    if (rc == PV_OK) rc = put_int(doc, "memory_limit", node->memory_limit_used, st);
    for (size_t i = 0; rc == PV_OK && i < c->ncores; i++) {
        char id[16];
        snprintf(id, sizeof id, "%d", c->cores[i].id);
        rc = put_int(map, id, c->cores[i].used, st);
    }
    for (size_t i = 0; rc == PV_OK && i < c->nnuma; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        rc = put_int(numa, idx, c->numa_memory_used[i], st);
    }
    if (rc == PV_OK) rc = put_nonempty(doc, "cpu_map", map, st), map = NULL;
    if (rc == PV_OK) rc = put_nonempty(doc, "numa_memory", numa, st), numa = NULL;
    json_decref(map);
    json_decref(numa);
    if (rc == PV_OK) return doc;
    json_decref(doc);
    return NULL;
}

static json_t *storage_usage(const pv_res_node *node, pv_status *st) {
    const pv_res_storage *s = &node->storage;
    json_t *doc = json_object(), *vols = json_object();
    int rc = doc && vols ? PV_OK : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "usage: out of memory");
    if (rc == PV_OK) rc = put_int(doc, "storage_request", s->storage_used, st);
    if (rc == PV_OK) rc = put_int(doc, "storage_limit", node->storage_limit_used, st);
    for (size_t i = 0; rc == PV_OK && i < s->nvolumes; i++)
        rc = put_int(vols, s->volumes[i].path, s->volumes[i].used, st);
    if (rc == PV_OK) rc = put_nonempty(doc, "volumes", vols, st), vols = NULL;
    json_decref(vols);
    if (rc == PV_OK) return doc;
    json_decref(doc);
    return NULL;
}

int pv_res_node_usage_dump(const pv_res_node *node, char **usage_json, pv_status *st) {
    *usage_json = NULL;
    json_t *doc = json_object();
    if (!doc) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, "usage: out of memory");
    json_t *part = cpumem_usage(node, st);
    int rc = part ? put_nonempty(doc, CPUMEM, part, st) : st->code;
    if (rc == PV_OK) {
        part = storage_usage(node, st);
        rc = part ? put_nonempty(doc, STORAGE, part, st) : st->code;
    }
    if (rc != PV_OK) {
        json_decref(doc);
        return rc;
    }
    return dump_doc(doc, usage_json, st);
}

/* "id:pieces,..." of every core, and the NUMA lists "id,id" per NUMA node. */
static json_t *cpumem_resources(const pv_res_cpumem *c, pv_status *st) {
    size_t cap = c->ncores * 24 + 1;
    char *cpu = malloc(cap);
    json_t *doc = json_object();
    int rc =
        cpu && doc ? PV_OK : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    size_t len = 0;
    if (cpu) cpu[0] = '\0';
    for (size_t i = 0; rc == PV_OK && i < c->ncores; i++)
        len += (size_t)snprintf(cpu + len, cap - len, "%s%d:%lld", i ? "," : "", c->cores[i].id,
                                (long long)c->cores[i].pieces);
    if (rc == PV_OK) rc = set_new(doc, "cpu", json_string(cpu), st);
    if (rc == PV_OK) rc = set_new(doc, "memory", json_integer(c->memory), st);
    if (rc == PV_OK && c->nnuma > 0) {
        json_t *ncpu = json_array(), *nmem = json_array();
        rc = set_new(doc, "numa-cpu", ncpu, st);
        if (rc == PV_OK)
            rc = set_new(doc, "numa-memory", nmem, st);
        else
            json_decref(nmem);
        for (size_t n = 0; rc == PV_OK && n < c->nnuma; n++) {
            len = 0;
            cpu[0] = '\0';
            for (size_t i = 0; i < c->ncores; i++)
                if (c->cores[i].numa == (int)n)
                    len += (size_t)snprintf(cpu + len, cap - len, "%s%d", len ? "," : "",
                                            c->cores[i].id);
            if (json_array_append_new(ncpu, json_string(cpu)) != 0 ||
                json_array_append_new(nmem, json_integer(c->numa_memory[n])) != 0)
                rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
        }
    }
    free(cpu);
    if (rc == PV_OK) return doc;
    json_decref(doc);
    return NULL;
}

static json_t *storage_resources(const pv_res_storage *s, pv_status *st) {
    json_t *doc = json_object(), *vols = json_array();
    int rc =
        doc && vols ? PV_OK : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    int64_t plain = s->storage; /* the parser adds the volumes back in */
    for (size_t i = 0; rc == PV_OK && i < s->nvolumes; i++) {
        char *text = NULL;
        plain -= s->volumes[i].size;
        if (asprintf(&text, "%s:%lld", s->volumes[i].path, (long long)s->volumes[i].size) < 0 ||
            json_array_append_new(vols, json_string(text)) != 0)
            rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
        free(text);
    }
    if (rc == PV_OK) rc = set_new(doc, "storage", json_integer(plain), st);
    if (rc == PV_OK && s->nvolumes > 0) rc = set_new(doc, "volumes", vols, st), vols = NULL;
    json_decref(vols);
    if (rc == PV_OK) return doc;
    json_decref(doc);
    return NULL;
}

int pv_res_node_resources_dump(const pv_res_node *node, char **resources_json, pv_status *st) {
    *resources_json = NULL;
    json_t *doc = json_object();
    if (!doc) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    int rc = PV_OK;
    if (node->cpumem.ncores > 0) { /* no cores: no cpumem document can say so; absent says it */
        json_t *part = cpumem_resources(&node->cpumem, st);
        rc = part ? set_new(doc, CPUMEM, part, st) : st->code;
    }
    if (rc == PV_OK) {
        json_t *part = storage_resources(&node->storage, st);
        rc = part ? set_new(doc, STORAGE, part, st) : st->code;
    }
    if (rc != PV_OK) {
        json_decref(doc);
        return rc;
    }
    return dump_doc(doc, resources_json, st);
}

void pv_res_node_percent(const pv_res_node *node, pv_res_percent *out) {
    const pv_res_cpumem *c = &node->cpumem;
    const pv_res_storage *s = &node->storage;
    int64_t vol_total = 0, vol_used = 0;
    for (size_t i = 0; i < s->nvolumes; i++) {
        vol_total += s->volumes[i].size;
        vol_used += s->volumes[i].used;
    }
    out->cpu = ratio(c->cpu_used, (double)c->ncores);
    out->memory = ratio((double)c->memory_used, (double)c->memory);
    out->storage = ratio((double)s->storage_used, (double)s->storage);
    out->volume = ratio((double)vol_used, (double)vol_total);
}

/* ---- a whole node: Eru's documents ---- */

/* A number as Go's encoding/json writes a float64: whole values without a fraction. */
static json_t *eru_number(double d) {
    if (d == (double)(int64_t)d && d > -9007199254740992.0 && d < 9007199254740992.0)
        return json_integer((json_int_t)d);
    return json_real(d);
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* map into doc under key with its members in string order (as Go writes a map); map is taken. */
static int set_sorted(json_t *doc, const char *key, json_t *map, pv_status *st) {
    size_t n = json_object_size(map), i = 0;
    const char **keys = map ? malloc((n ? n : 1) * sizeof *keys) : NULL;
    json_t *sorted = keys ? json_object() : NULL;
    const char *k;
    json_t *v;
    if (sorted) {
        json_object_foreach(map, k, v) keys[i++] = k;
        qsort(keys, n, sizeof *keys, key_cmp);
    }
    int rc = sorted ? PV_OK : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    for (i = 0; rc == PV_OK && i < n; i++)
        rc = set_new(sorted, keys[i], json_incref(json_object_get(map, keys[i])), st);
    free(keys);
    json_decref(map);
    if (rc != PV_OK) {
        json_decref(sorted);
        return rc;
    }
    return set_new(doc, key, sorted, st);
}

/* Eru's cpumem NodeResource: capacity (used = 0) or usage (used = 1), the same fields. */
static json_t *cpumem_eru(const pv_res_cpumem *c, int used, pv_status *st) {
    json_t *doc = json_object(), *map = json_object(), *numa_mem = json_object(),
           *numa = json_object();
    int rc = doc && map && numa_mem && numa
                 ? PV_OK
                 : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    char id[24], idx[24];
    for (size_t i = 0; rc == PV_OK && i < c->ncores; i++) {
        snprintf(id, sizeof id, "%d", c->cores[i].id);
        rc = set_new(map, id, json_integer(used ? c->cores[i].used : c->cores[i].pieces), st);
        snprintf(idx, sizeof idx, "%d", c->cores[i].numa);
        if (rc == PV_OK && c->cores[i].numa >= 0) rc = set_new(numa, id, json_string(idx), st);
    }
    for (size_t i = 0; rc == PV_OK && i < c->nnuma; i++) {
        snprintf(idx, sizeof idx, "%zu", i);
        rc = set_new(numa_mem, idx, json_integer(used ? c->numa_memory_used[i] : c->numa_memory[i]),
                     st);
    }
    if (rc == PV_OK)
        rc = set_new(doc, "cpu", eru_number(used ? c->cpu_used : (double)c->ncores), st);
    if (rc == PV_OK) rc = set_sorted(doc, "cpu_map", map, st), map = NULL;
    if (rc == PV_OK)
        rc = set_new(doc, "memory", json_integer(used ? c->memory_used : c->memory), st);
    if (rc == PV_OK) rc = set_sorted(doc, "numa_memory", numa_mem, st), numa_mem = NULL;
    if (rc == PV_OK) rc = set_sorted(doc, "numa", numa, st), numa = NULL;
    json_decref(map);
    json_decref(numa_mem);
    json_decref(numa);
    if (rc == PV_OK) return doc;
    json_decref(doc);
    return NULL;
}

/* Eru's storage NodeResource (no disk IOPS limits here: "disks" is empty). */
static json_t *storage_eru(const pv_res_storage *s, int used, pv_status *st) {
    json_t *doc = json_object(), *vols = json_object();
    int rc =
        doc && vols ? PV_OK : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    for (size_t i = 0; rc == PV_OK && i < s->nvolumes; i++)
        rc = set_new(vols, s->volumes[i].path,
                     json_integer(used ? s->volumes[i].used : s->volumes[i].size), st);
    if (rc == PV_OK) rc = set_sorted(doc, "volumes", vols, st), vols = NULL;
    if (rc == PV_OK) rc = set_new(doc, "disks", json_array(), st);
    if (rc == PV_OK)
        rc = set_new(doc, "storage", json_integer(used ? s->storage_used : s->storage), st);
    json_decref(vols);
    if (rc == PV_OK) return doc;
    json_decref(doc);
    return NULL;
}

static int eru_doc(const pv_res_node *node, int used, char **out, pv_status *st) {
    json_t *doc = json_object();
    int rc = doc ? PV_OK : pv_status_set(st, PV_RESOURCE_EXHAUSTED, "resources: out of memory");
    if (rc == PV_OK) rc = set_new(doc, CPUMEM, cpumem_eru(&node->cpumem, used, st), st);
    if (rc == PV_OK) rc = set_new(doc, STORAGE, storage_eru(&node->storage, used, st), st);
    if (rc == PV_OK) return dump_doc(doc, out, st);
    json_decref(doc);
    return rc;
}

int pv_res_node_eru_dump(const pv_res_node *node, char **capacity_json, char **usage_json,
                         pv_status *st) {
    *capacity_json = *usage_json = NULL;
    if (eru_doc(node, 0, capacity_json, st) == PV_OK && eru_doc(node, 1, usage_json, st) == PV_OK)
        return PV_OK;
    free(*capacity_json);
    *capacity_json = NULL;
    return st->code;
}

int pv_res_eru_docs(const char *resources_json, const char *usage_json, char **capacity_out,
                    char **usage_out, pv_status *st) {
    *capacity_out = *usage_out = NULL;
    pv_res_node node;
    int rc = pv_res_node_parse(resources_json, usage_json, NULL, &node, st);
    if (rc == PV_OK) rc = pv_res_node_eru_dump(&node, capacity_out, usage_out, st);
    pv_res_node_free(&node);
    return rc;
}

/* ---- a whole node: SetNode deltas ---- */

/* A size that may be negative: an integer, or a human size with an optional '-'. */
static int signed_size(const char *plugin, const char *label, const json_t *v, int64_t *out,
                       pv_status *st) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return PV_OK;
    }
    if (!json_is_string(v))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: %s: must be a size (bytes or a string like \"-4G\")", plugin,
                             label);
    const char *s = json_string_value(v);
    int neg = *s == '-';
    if (pv_res_size_parse(s + neg, out, st) != PV_OK)
        return pv_status_prefix(st, "%s: %s", plugin, label);
    if (neg) *out = -*out;
    return PV_OK;
}

/* *out = have + add for a delta; a client's delta near 2^63 must not wrap into a small size. */
static int delta_sum(const char *plugin, const char *label, int64_t have, int64_t add, int64_t *out,
                     pv_status *st) {
    if (__builtin_add_overflow(have, add, out))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: %s: %lld + (%lld) is outside what a size can hold", plugin, label,
                             (long long)have, (long long)add);
    return PV_OK;
}

/* Adds delta pieces to core id, creating it (outside any NUMA node) when new. */
static int core_add(pv_res_cpumem *c, size_t *cap, int id, int64_t pieces, pv_status *st) {
    pv_res_core *core = NULL;
    for (size_t i = 0; i < c->ncores && !core; i++)
        if (c->cores[i].id == id) core = &c->cores[i];
    if (!core) {
        if (c->ncores == *cap) {
            size_t ncap = *cap * 2 + 8;
            pv_res_core *grown =
                ncap > PV_RES_MAX_CORES * 2 ? NULL : realloc(c->cores, ncap * sizeof *grown);
            if (!grown)
                return pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": cpu: too many cores");
            c->cores = grown;
            *cap = ncap;
        }
        core = &c->cores[c->ncores++];
        *core = (pv_res_core){.id = id, .numa = -1};
    }
    if ((pieces > 0 && core->pieces > INT32_MAX - pieces) ||
        (pieces < 0 && core->pieces < INT32_MIN - pieces))
        return pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": cpu: core %d: too many pieces", id);
    core->pieces += pieces;
    return PV_OK;
}

/* Delta cpu: N (cores 0..|N|-1, 100 pieces each with N's sign) or "id:pieces,..." (signed). */
static int delta_cpu(pv_res_cpumem *c, size_t *cap, const json_t *v, pv_status *st) {
    long long count;
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (json_is_integer(v) || (s && !strchr(s, ':'))) {
        int neg = s && *s == '-';
        if (json_is_integer(v))
            count = json_integer_value(v);
        else if (parse_int(s + neg, strlen(s + neg), 0, PV_RES_MAX_CORES, &count) == 0)
            count = neg ? -count : count;
        else
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": cpu: \"%s\" must be a core count or \"id:pieces,...\"",
                                 s);
        if (count < -PV_RES_MAX_CORES || count > PV_RES_MAX_CORES)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": cpu: %lld must be between -%d and %d cores", count,
                                 PV_RES_MAX_CORES, PV_RES_MAX_CORES);
        int64_t each = count < 0 ? -PV_RES_SHARE_BASE : PV_RES_SHARE_BASE;
        for (long long i = 0; i < (count < 0 ? -count : count); i++)
            if (core_add(c, cap, (int)i, each, st) != PV_OK) return st->code;
        return PV_OK;
    }
    if (!s)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": cpu: must be a core count or \"id:pieces,...\"");
    const char *p = s;
    do {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        long long id, pieces;
        const char *num = colon ? colon + 1 : NULL;
        int neg = num && *num == '-';
        if (!colon || parse_int(p, (size_t)(colon - p), 0, 1 << 20, &id) != 0 ||
            parse_int(num + neg, len - (size_t)(num + neg - p), 0, INT32_MAX, &pieces) != 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": cpu: \"%.*s\" must be id:pieces (e.g. \"0:-50\")",
                                 (int)len, p);
        if (core_add(c, cap, (int)id, neg ? -pieces : pieces, st) != PV_OK) return st->code;
        p += len + (p[len] == ',');
    } while (*p);
    return PV_OK;
}

/* base + delta for cpumem into *out (cores and memory; the caller adds NUMA). base carries the
 * usage, so a core left with 0 pieces and no usage disappears and one below its usage fails. */
static int delta_cpumem(const pv_res_node *base, const json_t *d, pv_res_cpumem *out,
                        pv_status *st) {
    static const char *const k_fields[] = {"cpu", "memory", "numa-cpu", "numa-memory", NULL};
    const pv_res_cpumem *b = &base->cpumem;
    memset(out, 0, sizeof *out);
    size_t cap = b->ncores + 8;
    out->cores = malloc(cap * sizeof *out->cores);
    if (!out->cores) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    memcpy(out->cores, b->cores, b->ncores * sizeof *out->cores);
    out->ncores = b->ncores;
    out->memory = b->memory;
    int rc = d ? only_known(CPUMEM, d, k_fields, st) : PV_OK;
    const json_t *v = d ? json_object_get(d, "cpu") : NULL;
    if (rc == PV_OK && v) rc = delta_cpu(out, &cap, v, st);
    int64_t mem = 0;
    v = d ? json_object_get(d, "memory") : NULL;
    if (rc == PV_OK && v) rc = signed_size(CPUMEM, "memory", v, &mem, st);
    if (rc == PV_OK) rc = delta_sum(CPUMEM, "memory", out->memory, mem, &out->memory, st);
    if (rc == PV_OK && out->memory < 0)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": memory: would be %lld, below zero",
                           (long long)out->memory);
    for (size_t i = 0; rc == PV_OK && i < out->ncores; i++) {
        pv_res_core *core = &out->cores[i];
        if (core->pieces < 0)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               CPUMEM ": cpu: core %d would have %lld pieces, below zero", core->id,
                               (long long)core->pieces);
        else if (core->pieces < core->used)
            rc =
                pv_status_set(st, PV_INVALID_ARGUMENT,
                              CPUMEM ": cpu: core %d would have %lld pieces, below the %lld in use",
                              core->id, (long long)core->pieces, (long long)core->used);
    }
    size_t kept = 0;
    for (size_t i = 0; rc == PV_OK && i < out->ncores; i++)
        if (out->cores[i].pieces > 0 || out->cores[i].used > 0) out->cores[kept++] = out->cores[i];
    if (rc == PV_OK) out->ncores = kept;
    if (rc == PV_OK) qsort(out->cores, out->ncores, sizeof *out->cores, core_cmp);
    return rc;
}

/* NUMA layout and memory of the result, as node-document fields on doc (a cpumem document). */
static int delta_numa(const pv_res_cpumem *b, const pv_res_cpumem *nc, const json_t *d, json_t *doc,
                      pv_status *st) {
    const json_t *layout = d ? json_object_get(d, "numa-cpu") : NULL;
    const json_t *mem = d ? json_object_get(d, "numa-memory") : NULL;
    size_t nnuma = layout && json_is_array(layout) ? json_array_size(layout) : b->nnuma;
    if (layout) { /* a new layout replaces the old one, as Eru's delta does */
        if (set_new(doc, "numa-cpu", json_deep_copy(layout), st) != PV_OK) return st->code;
    } else if (b->nnuma > 0) {
        json_t *lists = json_array();
        if (set_new(doc, "numa-cpu", lists, st) != PV_OK) return st->code;
        for (size_t n = 0; n < b->nnuma; n++) {
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            if (!f) return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
            int first = 1; /* the cores still there, in the NUMA node they were in */
            for (size_t i = 0; i < nc->ncores; i++) {
                const pv_res_core *was = find_core((pv_res_cpumem *)b, nc->cores[i].id);
                if (!was || was->numa != (int)n) continue;
                fprintf(f, first ? "%d" : ",%d", was->id);
                first = 0;
            }
            fclose(f);
            int rc = json_array_append_new(lists, json_string(text ? text : "")) == 0
                         ? PV_OK
                         : pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
            free(text);
            if (rc != PV_OK) return rc;
        }
    }
    if (nnuma == 0) return PV_OK;
    if (mem && (!json_is_array(mem) || json_array_size(mem) > nnuma))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": numa-memory: must list at most one size per NUMA node (%zu)",
                             nnuma);
    if (!mem && nnuma != b->nnuma) return PV_OK; /* a new layout: memory split evenly */
    json_t *sizes = json_array();
    if (set_new(doc, "numa-memory", sizes, st) != PV_OK) return st->code;
    for (size_t n = 0; n < nnuma; n++) {
        int64_t add = 0, have = n < b->nnuma ? b->numa_memory[n] : 0;
        char label[40];
        snprintf(label, sizeof label, "numa-memory[%zu]", n);
        if (mem && n < json_array_size(mem) &&
            signed_size(CPUMEM, label, json_array_get(mem, n), &add, st) != PV_OK)
            return st->code;
        int64_t now;
        if (delta_sum(CPUMEM, label, have, add, &now, st) != PV_OK) return st->code;
        if (now < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": %s: would be %lld, below zero",
                                 label, (long long)now);
        if (json_array_append_new(sizes, json_integer(now)) != 0)
            return pv_status_set(st, PV_RESOURCE_EXHAUSTED, CPUMEM ": out of memory");
    }
    return PV_OK;
}

/* One volume of a delta result: base volumes keep their path; new ones point into the delta. */
typedef struct vol_sum {
    const char *path;
    int plen;
    int64_t size, used;
} vol_sum;

/* base + delta volumes ("/path:size", signed) into sum[*n]. */
static int delta_volumes(const json_t *vols, vol_sum *sum, size_t *n, pv_status *st) {
    for (size_t i = 0; vols && i < json_array_size(vols); i++) {
        const char *text = json_string_value(json_array_get(vols, i));
        const char *colon = strrchr(text, ':');
        char label[40];
        snprintf(label, sizeof label, "volumes[%zu]", i);
        if (!colon || colon == text)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 STORAGE ": %s: \"%s\" must be path:size (e.g. \"/data0:-1T\")",
                                 label, text);
        json_t *size = json_string(colon + 1);
        int64_t bytes = 0;
        int rc = size ? signed_size(STORAGE, label, size, &bytes, st)
                      : pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
        json_decref(size);
        if (rc != PV_OK) return rc;
        int plen = (int)(colon - text);
        size_t k = 0;
        while (k < *n && (sum[k].plen != plen || strncmp(sum[k].path, text, (size_t)plen) != 0))
            k++;
        if (k == *n) sum[(*n)++] = (vol_sum){text, plen, 0, 0};
        if (delta_sum(STORAGE, label, sum[k].size, bytes, &sum[k].size, st) != PV_OK)
            return st->code;
    }
    return PV_OK;
}

/* base + delta for storage, written as a storage node document into doc. A volume left at 0
 * disappears. */
static int delta_storage(const pv_res_storage *b, const json_t *d, json_t *doc, pv_status *st) {
    static const char *const k_fields[] = {"storage", "volumes", NULL};
    int64_t plain = b->storage, add = 0;
    for (size_t i = 0; i < b->nvolumes; i++)
        plain -= b->volumes[i].size;
    int rc = d ? only_known(STORAGE, d, k_fields, st) : PV_OK;
    const json_t *v = d ? json_object_get(d, "storage") : NULL;
    if (rc == PV_OK && v) rc = signed_size(STORAGE, "storage", v, &add, st);
    if (rc == PV_OK) rc = delta_sum(STORAGE, "storage", plain, add, &plain, st);
    if (rc == PV_OK && plain < 0)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           STORAGE ": storage: would be %lld (volumes apart), below zero",
                           (long long)plain);
    if (rc == PV_OK) rc = set_new(doc, "storage", json_integer(plain), st);
    const json_t *vols = NULL;
    if (rc == PV_OK && d) rc = string_list(STORAGE, d, "volumes", &vols, st);
    size_t n = 0, nd = vols ? json_array_size(vols) : 0;
    vol_sum *sum = calloc(b->nvolumes + nd + 1, sizeof *sum);
    if (rc == PV_OK && !sum)
        rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
    for (size_t i = 0; rc == PV_OK && i < b->nvolumes; i++) {
        const pv_res_volume *bv = &b->volumes[i];
        sum[n++] = (vol_sum){bv->path, (int)strlen(bv->path), bv->size, bv->used};
    }
    if (rc == PV_OK) rc = delta_volumes(vols, sum, &n, st);
    json_t *list = rc == PV_OK ? json_array() : NULL;
    if (rc == PV_OK) rc = set_new(doc, "volumes", list, st);
    for (size_t k = 0; rc == PV_OK && k < n; k++) {
        if (sum[k].size < 0)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               STORAGE ": volumes: %.*s would be %lld, below zero", sum[k].plen,
                               sum[k].path, (long long)sum[k].size);
        else if (sum[k].size < sum[k].used)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               STORAGE ": volumes: %.*s would be %lld, below the %lld in use",
                               sum[k].plen, sum[k].path, (long long)sum[k].size,
                               (long long)sum[k].used);
        else if (sum[k].size > 0 || sum[k].used > 0) {
            char *text = NULL;
            if (asprintf(&text, "%.*s:%lld", sum[k].plen, sum[k].path, (long long)sum[k].size) <
                    0 ||
                json_array_append_new(list, json_string(text)) != 0)
                rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, STORAGE ": out of memory");
            free(text);
        }
    }
    if (rc == PV_OK && json_array_size(list) == 0) json_object_del(doc, "volumes");
    free(sum);
    return rc;
}

/* Every used field of node within its capacity; the message names plugin and field. */
static int within(const pv_res_node *node, pv_status *st) {
    const pv_res_cpumem *c = &node->cpumem;
    const pv_res_storage *s = &node->storage;
    if (c->memory < c->memory_used)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             CPUMEM ": memory: %lld would be below the %lld in use",
                             (long long)c->memory, (long long)c->memory_used);
    for (size_t n = 0; n < c->nnuma; n++)
        if (c->numa_memory[n] < c->numa_memory_used[n])
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 CPUMEM ": numa-memory[%zu]: %lld would be below the %lld in use",
                                 n, (long long)c->numa_memory[n],
                                 (long long)c->numa_memory_used[n]);
    if (s->storage < s->storage_used)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             STORAGE ": storage: %lld would be below the %lld in use",
                             (long long)s->storage, (long long)s->storage_used);
    return PV_OK;
}

int pv_res_node_delta(const char *base_json, const char *delta_json, const char *usage_json,
                      char **out_json, pv_status *st) {
    *out_json = NULL;
    pv_res_node base, result;
    pv_res_cpumem nc = {0};
    json_t *delta = load_plugins("delta", delta_json, st), *out = NULL, *cdoc = NULL;
    if (!delta) return st->code;
    int rc = pv_res_node_parse(base_json, usage_json, NULL, &base, st);
    if (rc != PV_OK) {
        json_decref(delta);
        return rc;
    }
    const json_t *dc = json_object_get(delta, CPUMEM), *ds = json_object_get(delta, STORAGE);
    out = json_object();
    if (!out) rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, "delta: out of memory");
    if (rc == PV_OK && (base.cpumem.ncores > 0 || dc)) {
        rc = delta_cpumem(&base, dc, &nc, st);
        if (rc == PV_OK) cdoc = cpumem_resources(&nc, st);
        if (rc == PV_OK && !cdoc) rc = st->code;
        if (rc == PV_OK) rc = delta_numa(&base.cpumem, &nc, dc, cdoc, st);
        if (rc == PV_OK && nc.ncores == 0)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, CPUMEM ": cpu: no core would be left");
        if (rc == PV_OK) rc = set_new(out, CPUMEM, cdoc, st), cdoc = NULL;
    }
    json_t *sdoc = rc == PV_OK ? json_object() : NULL;
    if (rc == PV_OK) rc = set_new(out, STORAGE, sdoc, st);
    if (rc == PV_OK) rc = delta_storage(&base.storage, ds, sdoc, st);
    char *text = NULL;
    if (rc == PV_OK) rc = dump_doc(out, &text, st), out = NULL;
    /* the result must parse, and hold what is in use */
    if (rc == PV_OK) rc = pv_res_node_parse(text, NULL, NULL, &result, st);
    if (rc == PV_OK) {
        if (usage_json && apply_doc(&result, "usage", usage_json, 1, st) != PV_OK)
            rc = st->code = PV_INVALID_ARGUMENT; /* usage the result cannot hold */
        if (rc == PV_OK) rc = within(&result, st);
        pv_res_node_free(&result);
    }
    json_decref(cdoc);
    json_decref(out);
    json_decref(delta);
    free(nc.cores);
    pv_res_node_free(&base);
    if (rc != PV_OK) {
        free(text);
        return rc;
    }
    *out_json = text;
    return PV_OK;
}
