/*
 * pv_res: Eru's resource plugins without their store: human sizes, the cpumem and storage
 * plugins' documents (node resources, workload requests) and how many workloads of a request fit
 * on a node. Pure functions: the gateway validates AddNode/SetNode with them and the scheduler
 * computes capacities with them.
 *
 * Documents are the JSON of `resources` (map<string, bytes>, one document per plugin). Every
 * parse is strict: bad JSON, unknown fields, wrong types, negative sizes fail with
 * PV_INVALID_ARGUMENT and a message naming the plugin and the field, e.g.
 *   cpumem: memory-request: "-1G" must not be negative
 *
 * Ownership: parse functions fill a caller-provided struct whose arrays and strings they
 * allocate; the caller releases them with the matching *_free (safe on a zeroed or failed
 * struct: a failing parse frees what it took and leaves the struct zeroed).
 */
#ifndef PV_RES_H
#define PV_RES_H

#include <stddef.h>
#include <stdint.h>

#include "pv_status.h"

#define PV_RES_SHARE_BASE 100          /* pieces per core */
#define PV_RES_UNBOUNDED INT64_MAX     /* capacity when nothing limits it */
#define PV_RES_STORAGE_MAX_PLANS 10000 /* volume plans counted per node at most */

/* ---- human sizes (binary: "4G" = 4 × 2^30) ---- */

/*
 * Parses "123", "512M", "4G", "1T", "1.5G", "4GiB", "4gb" (K, M, G, T, P, E; case-insensitive;
 * optional "B" or "iB") into bytes. Empty, negative, malformed and overflowing values fail with
 * PV_INVALID_ARGUMENT; the message quotes the value (`"-1G" must not be negative`) and callers
 * prefix it with the field.
 */
int pv_res_size_parse(const char *text, int64_t *bytes, pv_status *st);

/* ---- engine facts used for defaults ---- */

typedef struct pv_res_engine_info {
    int64_t cpu_count;     /* cores the engine reports; <= 0: unknown */
    int64_t mem_total;     /* bytes; <= 0: unknown */
    int64_t storage_total; /* bytes; <= 0: unknown */
} pv_res_engine_info;

/* ---- what fits: one plugin's answer for one node ---- */

typedef struct pv_res_cap {
    int64_t capacity; /* workloads that fit; PV_RES_UNBOUNDED when nothing limits */
    double usage;     /* share of the main resource in use (GLOBAL) */
    double rate;      /* share one more workload takes (GLOBAL) */
    int weight;       /* how much this plugin counts for usage and rate */
} pv_res_cap;

/* Capacity across plugins: the minimum; usage and rate: averages weighted by weight. */
void pv_res_cap_combine(const pv_res_cap *caps, size_t n, pv_res_cap *out);

/* ---- cpumem ---- */

typedef struct pv_res_core {
    int id;
    int64_t pieces; /* capacity, PV_RES_SHARE_BASE per whole core */
    int64_t used;   /* pieces held by bound workloads */
    int numa;       /* NUMA node index, -1 when the node has no NUMA layout */
} pv_res_core;

typedef struct pv_res_cpumem {
    size_t ncores;
    pv_res_core *cores; /* owned; sorted by id */
    double cpu_used;    /* cores requested by the workloads there (bound or not) */
    int64_t memory;
    int64_t memory_used;
    size_t nnuma;
    int64_t *numa_memory;      /* owned; nnuma entries */
    int64_t *numa_memory_used; /* owned with numa_memory; nnuma entries */
} pv_res_cpumem;

/*
 * Node document: {"cpu": 4 | "0:100,1:50", "memory": 1073741824 | "4G",
 * "numa-cpu": ["0,1","2,3"], "numa-memory": ["2G","2G"]}. Absent cpu: info->cpu_count cores;
 * absent memory: 80% of info->mem_total (info may be NULL: then both are required). NUMA memory
 * absent with numa-cpu given: the memory split evenly. Usage starts at zero.
 */
int pv_res_cpumem_node_parse(const char *json, size_t len, const pv_res_engine_info *info,
                             pv_res_cpumem *node, pv_status *st);
void pv_res_cpumem_free(pv_res_cpumem *node);

typedef struct pv_res_cpumem_req {
    double cpu_request; /* cores */
    double cpu_limit;
    int64_t memory_request; /* bytes */
    int64_t memory_limit;
    int cpu_bind;
} pv_res_cpumem_req;

/*
 * Workload document: {"cpu-request": 1.5, "cpu-limit": 2, "memory-request": "512M",
 * "memory-limit": ..., "cpu-bind": true}. A request of 0 takes the limit, a limit below the
 * request is raised to it; cpu-bind with cpu-request 0 fails. json NULL or len 0: no request.
 */
int pv_res_cpumem_req_parse(const char *json, size_t len, pv_res_cpumem_req *req, pv_status *st);

/*
 * How many workloads of req fit on node. Without binding: 0 when cpu-request exceeds the cores,
 * else free memory / memory-request (unbounded without a memory request). With binding: the number
 * of CPU plans (floor(X) whole cores plus a fragment of the rest, busier cores first, within each
 * NUMA node first, then across), each capped by the memory there.
 */
int pv_res_cpumem_capacity(const pv_res_cpumem *node, const pv_res_cpumem_req *req, pv_res_cap *out,
                           pv_status *st);

/* ---- storage ---- */

typedef struct pv_res_volume {
    char *path; /* owned */
    int64_t size;
    int64_t used;
} pv_res_volume;

typedef struct pv_res_storage {
    int64_t storage; /* bytes, volumes included (as Eru counts it) */
    int64_t storage_used;
    size_t nvolumes;
    pv_res_volume *volumes; /* owned */
} pv_res_storage;

/* Node document: {"storage": "100G", "volumes": ["/data0:1T"]}. Absent storage: 80% of
 * info->storage_total (0 without info). */
int pv_res_storage_node_parse(const char *json, size_t len, const pv_res_engine_info *info,
                              pv_res_storage *node, pv_status *st);
void pv_res_storage_free(pv_res_storage *node);

typedef struct pv_res_binding {
    char *src;   /* owned; "AUTO" (or ending in AUTO, or empty): the plugin picks the volume */
    char *dst;   /* owned */
    char *flags; /* owned; sorted letters, "rw" by default; 'm' = exclusive volume */
    int64_t size;
} pv_res_binding;

typedef struct pv_res_storage_req {
    int64_t storage_request; /* volume sizes included */
    int64_t storage_limit;
    size_t nvolumes;
    pv_res_binding *volumes; /* owned */
} pv_res_storage_req;

/* Workload document: {"storage-request": "1G", "storage-limit": "2G", "storage": "1G" (both),
 * "volumes": ["AUTO:/data:rw:10G", "/host:/in"]}. json NULL or len 0: no request. */
int pv_res_storage_req_parse(const char *json, size_t len, pv_res_storage_req *req, pv_status *st);
void pv_res_storage_req_free(pv_res_storage_req *req);

/* min(volume plans, (storage − used) / storage-request), as Eru's storage plugin counts them. */
int pv_res_storage_capacity(const pv_res_storage *node, const pv_res_storage_req *req,
                            pv_res_cap *out, pv_status *st);

#endif
