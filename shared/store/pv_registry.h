/*
 * pv_registry: the one registry of pods (= clusters) and nodes, whichever API writes them
 * (pb.CoreRPC's AddPod/AddNode, pivirt.cluster.v1's CreateCluster/AddNode), and the liveness
 * keys of the nodes.
 *
 * Every change that touches more than one key is one Redis function of the library
 * "pivirt_registry" (shared/store/redis/registry.lua), so it is atomic; errors come back as
 * '<CODE> message' and pv_redis maps them to codes (NOT_FOUND, ALREADY_EXISTS,
 * FAILED_PRECONDITION, INVALID_ARGUMENT). This module checks what it can before calling Redis
 * (names, endpoint schemes, JSON shapes) so bad input never reaches the functions.
 *
 * Keys (all under the hash tag {reg}; <p> = redis.prefix):
 *   <p>{reg}:pod:<id>             hash: the pod/cluster record (fields below)
 *   <p>{reg}:pods                 hash: pod name -> pod id (names are unique system-wide)
 *   <p>{reg}:pod-nodes:<pod id>   set: ids of the pod's nodes
 *   <p>{reg}:node:<id>            hash: the node record (fields below)
 *   <p>{reg}:nodes                hash: node name -> node id (names are unique system-wide)
 *   <p>{reg}:node-workloads:<id>  set: ids of the workloads on the node (written by the workload
 *                                 code later; RemoveNode refuses while it is not empty)
 *   <p>{reg}:node-allocs:<id>     hash: allocation id -> JSON of what one reserved instance holds
 *                                 there (written by the scheduler's reservations, pv_resv.h)
 *   <p>{reg}:node-tls:<id>        hash: ca cert key, the node's engine TLS (Eru's AddNode/SetNode
 *                                 fields: secrets, apart from the record so that no reader of
 *                                 records carries them; only the node's agent asks for them)
 *   <p>{reg}:alive:<node name>    string with a TTL: the node is alive while it exists (Eru's
 *                                 node status key; SetNodeStatus semantics)
 *   <p>{reg}:engine-info:<node name>
 *                                 string with a TTL (the alive key's): the engine info the node's
 *                                 agent reports on every beat, a JSON object (fields below). Keyed
 *                                 by name and written whether or not the node is registered, so an
 *                                 operator can start an agent first and AddNode it without
 *                                 resources afterwards; deleted by the agent's clean stop, left
 *                                 alone by RemoveNode (the agent owns it).
 *
 * Pod record fields: id ("cluster-<ulid>") name desc version cp_nodes worker_nodes (topology
 * counts) labels annotations (JSON objects of strings) created_ms updated_ms.
 * Node record fields: id ("node-<ulid>") name pod_id pod_name role (Eru's nodes: "worker";
 * ClusterService: "control-plane" or "worker") ip endpoint engine (from the endpoint scheme:
 * process:// -> process, virt://<libvirt URI> -> virt, tcp:// and unix:// -> docker) labels
 * (JSON object of strings) resources (JSON object: plugin name -> the plugin's JSON document as
 * given) bypass (0|1: Eru's bypass = cordon) usage (JSON object: plugin -> usage document, the
 * sum of the node's allocations; written by reservations only) usage_rev (bumped by every write
 * of usage: reservations compare-and-set on it) rev (bumped by every write of the record, so a
 * reader that keeps records, as the schedulers do, re-reads only what changed) created_ms
 * updated_ms.
 * Readers add: a pod's node count, a node's alive flag (its alive key exists) and engine info.
 * Engine info fields: type (the engine: "process", ...) cpu_count mem_total (bytes, MemTotal)
 * storage_total (bytes of the file system holding the agent's data directory) hostname version
 * (pivirt's) kernel (uname release); readers take what they know and ignore the rest.
 *
 * A node is down when it is bypassed or not alive. Liveness changes are visible to subscribers
 * as keyspace notifications of the alive keys (pv_registry_alive_pattern): "set" = alive,
 * "del"/"expired" = dead; pv_registry_notify_flags says which flags Redis needs.
 *
 * Ownership: records filled by these functions own their strings; release them with
 * pv_pod_clear / pv_node_clear (safe on zeroed or cleared records); arrays with
 * pv_pod_array_free / pv_node_array_free; name arrays with pv_registry_names_free.
 */
#ifndef PV_REGISTRY_H
#define PV_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_id.h"
#include "pv_keys.h"
#include "pv_record.h"
#include "pv_redis.h"
#include "pv_res.h"
#include "pv_status.h"

/* The keyspace-notification classes the liveness watchers need: K (keyspace channel), $ (SET),
 * g (DEL), x (expiry). */
#define PV_REGISTRY_NOTIFY_FLAGS "K$gx"

typedef struct pv_pod {
    char id[PV_ID_MAX];
    char *name;
    char *desc;
    char *version;
    int cp_nodes, worker_nodes; /* topology counts wanted (ClusterService) */
    char *labels;               /* JSON object of strings, "{}" when none */
    char *annotations;          /* JSON object of strings, "{}" when none */
    int64_t created_ms, updated_ms;
    int64_t formed_ms; /* when it first had the nodes its topology asks for; 0 = never */
    long n_nodes;      /* filled by the readers */
} pv_pod;

typedef struct pv_node {
    char id[PV_ID_MAX];
    char *name;
    char *pod_id;
    char *pod_name;
    char *role;
    char *ip;
    char *endpoint;
    char *engine;    /* "process", "virt" or "docker" */
    char *labels;    /* JSON object of strings, "{}" when none */
    char *resources; /* JSON object: plugin -> document, "{}" when none */
    bool bypass;
    char *usage;       /* JSON object: plugin -> usage document, "{}" when none */
    int64_t usage_rev; /* compare-and-set revision of usage */
    int64_t rev;       /* bumped by every write of the record (schedulers' caches follow it) */
    int64_t created_ms, updated_ms;
    bool alive;        /* filled by the readers */
    long workloads;    /* filled by the readers: size of the workload set */
    long allocs;       /* filled by the readers: number of reserved allocations */
    char *engine_info; /* filled by the readers: the agent's report (JSON), "" when none */
} pv_node;

/* The records' fields (pv_record.h): the tables every reader of a pod or a node decodes by. */
extern const pv_record_schema pv_pod_schema;
extern const pv_record_schema pv_node_schema;

void pv_pod_clear(pv_pod *p);
void pv_pod_array_free(pv_pod *pods, size_t n);
void pv_node_clear(pv_node *n);
void pv_node_array_free(pv_node *nodes, size_t n);
void pv_registry_names_free(char **names, size_t n);

/* A node is down when bypassed or not alive. */
bool pv_node_down(const pv_node *n);

/* --- checks (no Redis) ------------------------------------------------------------------ */

/* The engine an endpoint selects: process://[anything] -> "process", virt://<uri> (uri not
 * empty) -> "virt", tcp://host:port and unix:///path -> "docker" (static strings).
 * INVALID_ARGUMENT naming the endpoint otherwise. */
int pv_registry_engine_of(const char *endpoint, const char **engine, pv_status *st);

/* labels: a JSON object whose values are strings (field names the field in messages). */
int pv_registry_check_labels(const char *field, const char *json, pv_status *st);

/* resources: a JSON object, each member the node document of a known plugin (cpumem, storage),
 * checked by the plugin's own parser (shared/core/pv_res: unknown fields, bad sizes, ...). Without
 * engine info, cpumem needs both cpu and memory. */
int pv_registry_check_resources(const char *json, pv_status *st);

/* The same checks, absent fields taking their defaults from info (NULL: as above). */
int pv_registry_check_resources_with(const char *json, const pv_res_engine_info *info,
                                     pv_status *st);

/* Whether resources (a JSON object, NULL = "{}") describe a node without any engine info: a
 * cpumem document with both cpu and memory. Shape only: pv_registry_check_resources checks the
 * values. */
bool pv_registry_resources_complete(const char *json);

/* --- one pod or node by name or by id --------------------------------------------------- */

typedef enum { PV_REG_BY_NAME, PV_REG_BY_ID } pv_reg_by;

/* The pod or node whose name (PV_REG_BY_NAME) or id is value. NOT_FOUND when missing;
 * INVALID_ARGUMENT naming the field when value is no valid name. */
int pv_registry_get_pod(pv_redis *r, const pv_keys *k, pv_reg_by by, const char *value, pv_pod *out,
                        pv_status *st);
int pv_registry_get_node(pv_redis *r, const pv_keys *k, pv_reg_by by, const char *value,
                         pv_node *out, pv_status *st);

/* --- pods ------------------------------------------------------------------------------- */

typedef struct pv_pod_spec {
    const char *name;           /* required, pv_validate_name */
    const char *desc;           /* NULL = "" */
    const char *version;        /* NULL = "" */
    int cp_nodes, worker_nodes; /* >= 0 */
    const char *labels;         /* NULL = "{}" */
    const char *annotations;    /* NULL = "{}" */
} pv_pod_spec;

/* ALREADY_EXISTS "pod <name> already exists". On PV_OK *out is the new record. */
int pv_registry_add_pod(pv_redis *r, const pv_keys *k, const pv_pod_spec *spec, pv_pod *out,
                        pv_status *st);

/* ClusterService's UpdateCluster: what is set replaces the stored value (labels and
 * annotations: JSON objects of strings, NULL = keep; counts: < 0 = keep). NOT_FOUND when
 * missing. On PV_OK *out is the record as it is now. */
typedef struct pv_pod_update {
    const char *name;
    const char *labels, *annotations;
    int cp_nodes, worker_nodes;
    bool mark_formed;    /* sets formed_ms to now unless it is set (once per cluster) */
    const char *version; /* NULL/"" = keep (an upgrade sets it when it is done) */
} pv_pod_update;
int pv_registry_update_pod(pv_redis *r, const pv_keys *k, const pv_pod_update *u, pv_pod *out,
                           pv_status *st);

/* NOT_FOUND when missing; FAILED_PRECONDITION "pod <name> still has N nodes ..." while it has
 * nodes. */
int pv_registry_remove_pod(pv_redis *r, const pv_keys *k, const char *name, pv_status *st);

/* Every pod in name order. *pods is NULL when there are none. */
int pv_registry_list_pods(pv_redis *r, const pv_keys *k, pv_pod **pods, size_t *n, pv_status *st);

/* --- nodes ------------------------------------------------------------------------------ */

typedef struct pv_node_spec {
    const char *name;      /* required, pv_validate_name */
    const char *pod_name;  /* required: the pod must exist (NOT_FOUND) */
    const char *role;      /* NULL = "worker" */
    const char *ip;        /* NULL = "" */
    const char *endpoint;  /* required: see pv_registry_engine_of */
    const char *labels;    /* NULL = "{}" */
    const char *resources; /* NULL = "{}" */
    /* the node's engine TLS, PEM (NULL or "" = none): kept in node-tls, never in the record */
    const char *tls_ca, *tls_cert, *tls_key;
} pv_node_spec;

/* NOT_FOUND "pod <p> not found"; ALREADY_EXISTS "node <name> already exists".
 * On PV_OK *out is the new record. */
int pv_registry_add_node(pv_redis *r, const pv_keys *k, const pv_node_spec *spec, pv_node *out,
                         pv_status *st);

/* NOT_FOUND; FAILED_PRECONDITION "node <name> still hosts N workloads" while it does. Also
 * deletes its alive key. */
int pv_registry_remove_node(pv_redis *r, const pv_keys *k, const char *name, pv_status *st);

/* The nodes of a pod (pod_name NULL or "": of every pod), name order, with their alive flags.
 * NOT_FOUND when the pod does not exist. *nodes is NULL when there are none. */
int pv_registry_list_nodes(pv_redis *r, const pv_keys *k, const char *pod_name, pv_node **nodes,
                           size_t *n, pv_status *st);

typedef enum { PV_TRI_KEEP = 0, PV_TRI_TRUE = 1, PV_TRI_FALSE = 2 } pv_tri; /* Eru's TriOpt */

typedef struct pv_node_update {
    const char *name;      /* required */
    const char *endpoint;  /* NULL/"" = keep; else validated, the engine follows it */
    const char *labels;    /* NULL = keep; else a JSON object of strings */
    bool labels_merge;     /* true: labels are merged into the current ones; false: replace */
    const char *resources; /* NULL = keep; else replaces the whole resources object */
    /* With resources: when check_usage_rev, nothing is written unless the node's usage_rev is
     * still usage_rev (the one read with the usage the new resources were checked against):
     * ABORTED otherwise, and the caller re-reads and tries again. */
    bool check_usage_rev;
    int64_t usage_rev;
    pv_tri bypass;
    const char *tls_ca, *tls_cert, *tls_key; /* NULL or "" = keep each */
} pv_node_update;

/* The node's engine TLS as AddNode/SetNode stored it (each "" when none; caller frees the
 * three). NOT_FOUND when the node does not exist. */
int pv_registry_get_node_tls(pv_redis *r, const pv_keys *k, const char *name, char **ca,
                             char **cert, char **key, pv_status *st);

/* NOT_FOUND when missing; ABORTED on a usage_rev mismatch (above). On PV_OK *out (may be NULL)
 * is the updated record. */
int pv_registry_set_node(pv_redis *r, const pv_keys *k, const pv_node_update *u, pv_node *out,
                         pv_status *st);

/* --- liveness ----------------------------------------------------------------------------- */

/* Eru's SetNodeStatus: ttl_seconds > 0 (re)sets the alive key with that TTL, < 0 deletes it,
 * 0 is INVALID_ARGUMENT. The node must exist (NOT_FOUND). value NULL = "1" (what the key holds;
 * an agent may store a small JSON about itself). This is what a node agent calls to heartbeat:
 * every interval with a TTL of a few intervals, and with -1 when it stops cleanly. */
int pv_registry_set_alive(pv_redis *r, const pv_keys *k, const char *node, long long ttl_seconds,
                          const char *value, pv_status *st);

/* Whether the node's alive key exists; *pod_name (may be NULL) gets its pod (caller frees).
 * NOT_FOUND when the node does not exist. */
int pv_registry_get_alive(pv_redis *r, const pv_keys *k, const char *node, bool *alive,
                          char **pod_name, pv_status *st);

/* The names of every registered node that is alive now, name order (a watcher's starting
 * point). *names is NULL when there are none. */
int pv_registry_alive_nodes(pv_redis *r, const pv_keys *k, char ***names, size_t *n, pv_status *st);

/* --- engine info ---------------------------------------------------------------------------- */

/* What the agent of node reports about its engine: json (a JSON object whose "type" is a
 * non-empty string, see the fields above) stored for ttl_seconds > 0; ttl_seconds < 0 deletes
 * it; 0 is INVALID_ARGUMENT. The node need not be registered. */
int pv_registry_set_engine_info(pv_redis *r, const pv_keys *k, const char *node, const char *json,
                                long long ttl_seconds, pv_status *st);

/* The live report of node's agent in *json (caller frees). NOT_FOUND "no agent has reported
 * engine info for node <node>" when there is none (the node need not be registered). */
int pv_registry_get_engine_info(pv_redis *r, const pv_keys *k, const char *node, char **json,
                                pv_status *st);

/* The facts of a report the resource plugins take their defaults from: cpu_count, mem_total,
 * storage_total (absent, not integers or negative: 0 = unknown). INVALID_ARGUMENT when json is
 * not a JSON object. */
int pv_registry_engine_facts(const char *json, pv_res_engine_info *out, pv_status *st);

/* Key names: the alive key of a node, the key prefix of every alive key (its node name follows
 * it), and the PSUBSCRIBE pattern of their keyspace notifications on database db (glob
 * characters of the prefix escaped). */
int pv_registry_alive_key(const pv_keys *k, const char *node, char *buf, size_t len, pv_status *st);
int pv_registry_alive_prefix(const pv_keys *k, char *buf, size_t len, pv_status *st);
int pv_registry_alive_pattern(const pv_keys *k, int db, char *buf, size_t len, pv_status *st);

/* Makes sure Redis's notify-keyspace-events holds PV_REGISTRY_NOTIFY_FLAGS, adding what is
 * missing to what is set (CONFIG GET, CONFIG SET). *changed (may be NULL) says whether it had to
 * set it: the project's redis.conf should carry them, see ops/. */
int pv_registry_ensure_notify(pv_redis *r, bool *changed, pv_status *st);

#endif
