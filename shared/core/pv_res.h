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

/* Capacity across plugins: the minimum; usage and rate: averages weighted by weight. (Eru's
 * resource manager adds the first plugin's usage and rate without its weight, a slip in its merge
 * that only shows with unequal weights; this is the weighted average it divides for.) */
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
 * NUMA node first, then across), each capped by the memory there. Where Eru's one-pass count can
 * promise more plans than taking them one by one leaves (whole cores plus a fraction), the count
 * is made by allocating one plan at a time, so that it always equals how many pv_res_node_alloc
 * calls succeed: a capacity the scheduler reports can always be reserved.
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

/* min(volume plans, (storage − used) / storage-request), as Eru's storage plugin counts them,
 * except that requests mixing sized AUTO volumes with exclusive ('m') ones are counted by
 * allocating one plan at a time (Eru's count can exceed what allocation then finds). */
int pv_res_storage_capacity(const pv_res_storage *node, const pv_res_storage_req *req,
                            pv_res_cap *out, pv_status *st);

/* ---- a whole node: every plugin together (what the registry stores, what the scheduler uses) ----
 *
 * A node's `resources` is a JSON object plugin -> node document ({"cpumem": {...}, "storage":
 * {...}}); a plugin whose document is absent is parsed from "{}" with the engine info (its
 * defaults), so without info an absent cpumem has no cores and no memory.
 *
 * A node's `usage` is a JSON object plugin -> usage document, the sum of the allocations held
 * on the node. An allocation (what one workload holds on one node) has the same shape as a usage
 * document plus fields that say where it sits; summing allocations gives usage:
 *   cpumem:  {"cpu_request": 1.5, "cpu_limit": 2, "memory_request": 536870912,
 *             "memory_limit": 536870912, "cpu_map": {"0": 100, "1": 50},
 *             "numa_node": "0", "numa_memory": {"0": 536870912}}
 *            (cpu_map and numa_* only with binding; numa_node is left out of usage documents)
 *   storage: {"storage_request": N, "storage_limit": N, "volumes": {"/data0": N},
 *             "volume_plan": {"AUTO:/data:rw:10737418240": {"/data0": N}}}
 *            (volume_plan is left out of usage documents; an exclusive 'm' volume counts whole)
 * Keys use underscores as Eru's plugins store them. Parsers of these documents accept absent
 * fields as zero and reject unknown fields, wrong types and negative values (INVALID_ARGUMENT
 * naming "usage" or "allocation", the plugin and the field); a core, NUMA node or volume the node
 * does not have is FAILED_PRECONDITION ("usage: cpumem: cpu_map: core 9 is not on the node").
 * Sizes are integers of bytes there, pieces integers, cpu values numbers; cpu sums are kept to a
 * millionth of a core, so adding and removing the same allocations leaves exactly zero. A
 * volume_plan key is Eru's text of the binding: src:dst:flags:bytes (flags sorted, "rw" when
 * none were given); its values say where each binding sits and are checked for shape only (the
 * `volumes` map is what counts).
 *
 * A request is a JSON object plugin -> workload document ({"cpumem": {"cpu-request": 1, ...},
 * "storage": {...}}, the CreateWorkload/CalculateCapacity `resources` map); absent plugins ask
 * for nothing.
 *
 * Every object here must map plugin names to JSON objects (not strings holding JSON); an unknown
 * plugin fails with INVALID_ARGUMENT ("<resources|usage|request|allocation|delta>: unknown plugin
 * \"gpu\" (known: cpumem, storage)"). Plugin documents fail with the plugin parsers' messages
 * ("cpumem: memory: ..."), as the gateway's checks word them.
 */

typedef struct pv_res_node {
    pv_res_cpumem cpumem;
    pv_res_storage storage;
    /* limit sums of the allocations held: usage documents carry them, capacities ignore them */
    double cpu_limit_used;
    int64_t memory_limit_used;
    int64_t storage_limit_used;
} pv_res_node;

typedef struct pv_res_req {
    pv_res_cpumem_req cpumem;
    pv_res_storage_req storage;
} pv_res_req;

/* resources_json: the node's resources object (NULL = "{}"); usage_json: its usage object
 * (NULL = "{}"), applied to the used fields; info may be NULL. Unknown plugins fail with
 * INVALID_ARGUMENT ("resources: unknown plugin ..."). Release with pv_res_node_free.
 * An absent cpumem document takes info->cpu_count cores and 80% of info->mem_total, each only
 * when known (> 0); with no core count (or no info) the node has no cores and no memory (Eru
 * refuses a cpumem node without cores, so no document can describe one; absence does). Usage
 * above the capacity is accepted (what is held is held): nothing more fits where it is. */
int pv_res_node_parse(const char *resources_json, const char *usage_json,
                      const pv_res_engine_info *info, pv_res_node *node, pv_status *st);
void pv_res_node_free(pv_res_node *node);

/* request_json NULL or "{}": a request for nothing. Release with pv_res_req_free. */
int pv_res_req_parse(const char *request_json, pv_res_req *req, pv_status *st);
void pv_res_req_free(pv_res_req *req);

/* Every plugin's capacity for req, combined (pv_res_cap_combine). A request for nothing is
 * PV_RES_UNBOUNDED. Two counts are made one allocation at a time instead of Eru's one pass (see
 * pv_res.c), because for them the one-pass count is not what allocating one by one gets:
 * cpu-bind requests of whole cores plus a fragment (1.5), and volume requests mixing normal and
 * exclusive ('m') AUTO volumes. */
int pv_res_node_capacity(const pv_res_node *node, const pv_res_req *req, pv_res_cap *out,
                         pv_status *st);

/* Allocates one workload of req on node: picks its cores (binding: the same choice the capacity
 * count makes first), NUMA node and volumes, adds them to the node's used fields and returns the
 * allocation object ({"cpumem": {...}, "storage": {...}}, caller frees). RESOURCE_EXHAUSTED
 * naming the plugin when it does not fit; node is then unchanged. Calling it k times succeeds
 * exactly min(k, capacity) times (capacity below the per-node plan caps, 10000).
 * The object always has both plugins and their four request/limit fields (zeros included).
 * cpumem without binding: no cores, no NUMA node (as Eru). With binding: the first plan, NUMA
 * nodes in index order then across them; a plan across NUMA nodes has no numa_node and charges
 * only the node's memory. storage: normal AUTO bindings (smallest first) each on the used volume
 * with the least room that fits; the exclusive ones together on the first unused volume (least
 * room first) that holds them all, which they take whole, shared in proportion to their sizes
 * (the rounding rest to the smallest); AUTO bindings without a size on the volume with the most
 * room left after that (ties: volumes in use first), with 0 bytes; plain mounts are not planned
 * and absent from volume_plan; volumes and volume_plan only when some binding needs a volume. */
int pv_res_node_alloc(pv_res_node *node, const pv_res_req *req, char **alloc_json, pv_status *st);

/* Adds (sign = +1) or removes (sign = -1) an allocation object to/from the node's used fields;
 * removal that would go below zero fails with FAILED_PRECONDITION and leaves node unchanged.
 * Any other sign is INVALID_ARGUMENT. Every check comes before any change (all plugins or none).
 * Adding beyond the capacity is accepted, as Eru's usage updates accept it; adding past INT64_MAX
 * is INVALID_ARGUMENT. NULL or "{}" changes nothing. */
int pv_res_node_usage_add(pv_res_node *node, const char *alloc_json, int sign, pv_status *st);

/* The node's usage object (every plugin, zeros omitted inside a plugin's document; "{}" on a node
 * that uses nothing) and its full resources object (every plugin, defaults materialised, so
 * pv_res_node_parse(resources, NULL, NULL, ...) gives the same capacities back). Caller frees.
 * Usage: a plugin with nothing in use is left out. Resources: cpu as "id:pieces,..." and sizes as
 * bytes; numa-cpu/numa-memory only on NUMA nodes; storage's "storage" is written without the
 * volumes (the parser adds them back); cpumem is left out on a node without cores. */
int pv_res_node_usage_dump(const pv_res_node *node, char **usage_json, pv_status *st);
int pv_res_node_resources_dump(const pv_res_node *node, char **resources_json, pv_status *st);

/* Per-plugin share in use, for Eru's NodeResource percentages: cpu (cores requested / cores),
 * memory, storage, volumes (bytes used / bytes); 0 where the node has none of it. cpu divides by
 * the number of cores (as Eru's capacity usage does), whatever their pieces; storage counts the
 * volumes in, as Eru does. */
typedef struct pv_res_percent {
    double cpu, memory, storage, volume;
} pv_res_percent;
void pv_res_node_percent(const pv_res_node *node, pv_res_percent *out);

/*
 * Eru's view of a node: what its cpumem and storage plugins answer for it (GetNodeResourceInfo),
 * the documents Node.resource_capacity / resource_usage and NodeResource carry. Capacity and
 * usage have one shape, whatever the node was given and whether anything is used:
 *   {"cpumem": {"cpu": 4, "cpu_map": {"0": 100, "1": 100, "2": 100, "3": 100},
 *               "memory": 8589934592, "numa_memory": {"0": 4294967296, "1": 4294967296},
 *               "numa": {"0": "0", "1": "0", "2": "1", "3": "1"}},
 *    "storage": {"volumes": {"/data0": 1099511627776}, "disks": [], "storage": 1209462790553}}
 * Capacity: cpu = the number of cores, cpu_map = pieces per core, memory and numa_memory in
 * bytes, numa = each core's NUMA node (empty without a layout); storage in bytes with the
 * volumes, volumes = bytes per volume, disks empty (no IOPS limits here). Usage: cpu = cores
 * requested, cpu_map = pieces bound per core, memory = bytes requested, numa_memory = bytes
 * requested per NUMA node, numa = the node's layout (as Eru copies it), storage = bytes
 * requested (volumes included), volumes = bytes held per volume. Every plugin, core, NUMA node
 * and volume is listed, zeros included; limits are not part of Eru's documents. Fields come in
 * Eru's order, map members in string order and whole cpu values as integers, as Go writes them,
 * so the text is the text Eru sends. Caller frees both; on failure both are NULL.
 */
int pv_res_node_eru_dump(const pv_res_node *node, char **capacity_json, char **usage_json,
                         pv_status *st);

/* pv_res_node_parse(resources_json, usage_json, NULL, ...) then pv_res_node_eru_dump: the
 * documents of a registry record (its resources object and usage object). */
int pv_res_eru_docs(const char *resources_json, const char *usage_json, char **capacity_json,
                    char **usage_json_out, pv_status *st);

/* SetNode with delta=true (Eru's semantics): adds delta_json (a resources object in node-document
 * form) to base_json and writes the new resources object (caller frees). cpumem: cpu is added per
 * core id ("id:pieces" entries; an integer N stands for cores 0..|N|-1 at 100 pieces each, with
 * N's sign), a core left with 0 pieces and no usage disappears; memory and numa-memory add.
 * storage: storage adds; volumes "/path:size" add per path (a volume left at 0 disappears). A
 * result below zero, or below what usage_json (may be NULL) holds, fails with INVALID_ARGUMENT
 * naming the plugin and field.
 * Signed sizes: integers or human sizes with a leading '-' ("-1G"); "id:-50" for pieces. A
 * numa-cpu in the delta replaces the layout (as Eru's delta does); numa-memory adds per index
 * (a new layout with another count and no numa-memory: the memory split evenly). Cores that
 * disappear leave their NUMA lists; a new core on a NUMA node needs a numa-cpu in the delta.
 * A result without cores while cpumem is there (or given) fails ("cpumem: cpu: no core would be
 * left"). base_json NULL = "{}" (no engine info: an absent cpumem has no cores). The output is
 * in pv_res_node_resources_dump's form, and parses. */
int pv_res_node_delta(const char *base_json, const char *delta_json, const char *usage_json,
                      char **out_json, pv_status *st);

#endif
