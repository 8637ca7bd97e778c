/*
 * pv_workload: workload records (Eru's workloads: processes and VMs placed on nodes) and their
 * statuses, reported by node agents with a TTL.
 *
 * A workload is recorded when a deploy creates it on a node (the workload code of the
 * CreateWorkload issue calls pv_workload_add with the allocation its reservation made) and
 * removed when it is removed. Its status is a separate, short-lived entry that whoever watches
 * the workload (the node's agent, or a client through SetWorkloadsStatus) rewrites with a TTL;
 * when the entry expires the workload is simply of unknown status again, as in Eru.
 *
 * Keys (all under the registry's hash tag, <b> = "<prefix>{reg}:"):
 *   <b>wl:<id>                    hash: the record (fields below)
 *   <b>wls                        zset: every workload id, score 0 (lexical order = id order)
 *   <b>node-workloads:<node id>   set: ids of the node's workloads (the registry reads its size:
 *                                 RemoveNode refuses while it is not empty)
 *   <b>app-workloads:<app>        set: ids of the app's workloads
 *   <b>wl-status:<id>             string with an optional TTL: the status JSON
 *                                 {"running": bool, "healthy": bool, "networks": {name: ip},
 *                                  "extension": "<base64>", "ttl": N, "updated_ms": N}
 * Status changes are visible to watchers as keyspace notifications of the wl-status keys
 * (pv_workload_status_pattern): "set" = a new status, "del"/"expired" = gone.
 *
 * Record fields: id (Eru: 64 hex characters, from pv_workload_new_id) name ("<app>_<entry>_<6
 * random [a-zA-Z]>") app entry pod node node_id image privileged (0|1) labels (JSON object of
 * strings) env (JSON array of strings) publish (JSON object) resources (JSON object: plugin ->
 * allocation, as pv_res.h) alloc_id (the reservation allocation it took over, "" if none)
 * engine_id (the engine's own handle: pid, libvirt domain uuid) created_ms epoch (its
 * incarnation, 1 at first) placing (the failover op placing the next incarnation, "" = none).
 *   <b>wl-deploy:<id>             string: base64 of the pb.DeployOptions that made it (what a
 *                                 drain places a replacement from), when known
 *   <b>ha:ready                   hash: node id -> what the HA scans saw ("1" ready, "0" not,
 *                                 "0p" not, its failover to submit); <b>ha:downs: node id ->
 *                                 how many times it went down
 *   <b>dissociated:<id>           string "1": DissociateWorkload forgot workload <id> and left
 *                                 its engine's workload running on purpose (the audit,
 *                                 pivirt-check, does not call it an orphan)
 *
 * Ownership: records filled by these functions own their strings (pv_workload_clear, safe on a
 * zeroed record); arrays with pv_workload_array_free; statuses with pv_workload_status_clear.
 */
#ifndef PV_WORKLOAD_H
#define PV_WORKLOAD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_deploy.h"
#include "pv_keys.h"
#include "pv_record.h"
#include "pv_redis.h"
#include "pv_status.h"

#define PV_WORKLOAD_ID_LEN 64

typedef struct pv_workload {
    char id[PV_WORKLOAD_ID_LEN + 1];
    char *name, *app, *entry, *pod, *node, *node_id, *image;
    bool privileged;
    char *labels, *env, *publish, *resources; /* JSON texts ("{}"/"[]" when none) */
    char *alloc_id, *engine_id;
    const char *deploy; /* pv_workload_add's input only (borrowed, never filled by readers):
                           base64 of the pb.DeployOptions that made it, kept apart from the
                           record (pv_workload_deploy) so listings do not carry its files */
    int64_t created_ms;
    int64_t epoch; /* the incarnation: 1 when created, one more each time a failover recreates
                      it elsewhere (wk_ha.h); every fenced write names the epoch it is of */
    char *placing; /* the failover operation placing its next incarnation ("" = none) */
} pv_workload;

/* The record's fields (pv_record.h): the table every reader of a workload decodes by. */
extern const pv_record_schema pv_workload_schema;

void pv_workload_clear(pv_workload *w);
void pv_workload_array_free(pv_workload *w, size_t n);

/* A fresh id: 64 lowercase hex characters from the system's random source. */
int pv_workload_new_id(char out[PV_WORKLOAD_ID_LEN + 1], pv_status *st);

/* Records w (w->id set by the caller, node by name: NOT_FOUND when the node is not registered;
 * ALREADY_EXISTS when the id is taken). Adds it to the node's and the app's sets. When
 * w->alloc_id is not empty the allocation moves from the node's reserved allocations
 * (node-allocs) to the workload in the same step (FAILED_PRECONDITION when it is no longer
 * there: the reservation was released), and w->resources NULL/"" takes the allocation's
 * document. w->pod NULL/"" is the node's pod; another pod is INVALID_ARGUMENT. id, app, entry,
 * node (plain names), name (required), labels, env and publish are checked first
 * (INVALID_ARGUMENT naming the field). */
int pv_workload_add(pv_redis *r, const pv_keys *k, const pv_workload *w, pv_status *st);

/* pv_workload_add for the instance that takes the last allocation of reservation resv_id when
 * that reservation held only this node's allocations: w->alloc_id and others[0..nothers) (all
 * borrowed), as a one-node deploy's plan made them. When none of the others is left on the node
 * either (workloads took them all), the reservation ends in the same step (its record and expiry
 * entry are deleted: a release would find nothing to give back) and *resv_ended is true; else
 * it stays for the caller's release (pv_resv_release). Nothing happens to it when the add fails
 * (ALREADY_EXISTS included). resv_id NULL/"" or an empty w->alloc_id: pv_workload_add. */
int pv_workload_add_ending(pv_redis *r, const pv_keys *k, const pv_workload *w, const char *resv_id,
                           const char *const *others, size_t nothers, bool *resv_ended,
                           pv_status *st);

/* The base64 pb.DeployOptions workload id was made from, malloc'd in *out (the caller frees).
 * NOT_FOUND when the workload does not exist; FAILED_PRECONDITION when it exists but was
 * recorded without one (made before this was kept, or dissociated from its deploy). */
int pv_workload_deploy(pv_redis *r, const pv_keys *k, const char *id, char **out, pv_status *st);

/* Removes the record, its status and its set memberships. NOT_FOUND when missing. The
 * resources it held are the caller's to give back (pv_resv). */
int pv_workload_remove(pv_redis *r, const pv_keys *k, const char *id, pv_status *st);

/* NOT_FOUND "workload <id> not found" when missing. */
int pv_workload_get(pv_redis *r, const pv_keys *k, const char *id, pv_workload *out, pv_status *st);

/* The name of the node workload id is on (*node malloc'd, the caller's to free): what a call
 * routing to the workload's node needs, one HGET instead of the record. INVALID_ARGUMENT for a
 * malformed id, NOT_FOUND "workload <id> not found" when missing. */
int pv_workload_node(pv_redis *r, const pv_keys *k, const char *id, char **node, pv_status *st);

/* Every workload, or those of an app (app non-empty), an entrypoint (entry non-empty, with
 * app), a node (node non-empty; an unknown node has none) and carrying every label of
 * labels_json (NULL/"{}" = any). Id order. *out NULL when none. */
int pv_workload_list(pv_redis *r, const pv_keys *k, const char *app, const char *entry,
                     const char *node, const char *labels_json, pv_workload **out, size_t *n,
                     pv_status *st);

/* --- statuses (Eru's SetWorkloadsStatus / GetWorkloadsStatus) ---------------------------- */

typedef struct pv_workload_status {
    char id[PV_WORKLOAD_ID_LEN + 1];
    bool running, healthy;
    char *networks; /* JSON object of strings, "{}" when none */
    unsigned char *extension;
    size_t extension_len;
    int64_t ttl; /* seconds; 0 = no expiry */
    int64_t updated_ms;
    /* filled by the readers from the workload record */
    char *app, *entry, *node;
    /* writers only (never filled by readers): a node agent's report is fenced: reporter is its
     * node and epoch the incarnation its instance is of (<= 0: 1); the write is refused
     * FAILED_PRECONDITION ("stale report: ...") unless the record places that incarnation on
     * that node. NULL/"" = unfenced (SetWorkloadsStatus from a client). Only
     * pv_workload_set_status (one entry) reads them. */
    const char *reporter;
    int64_t epoch;
} pv_workload_status;

void pv_workload_status_clear(pv_workload_status *s);

/* Sets the status of an existing workload (NOT_FOUND otherwise) with its TTL (ttl < 0 is
 * INVALID_ARGUMENT naming the field). On PV_OK *out (may be NULL) is the status as stored, with
 * the workload's app, entry and node. s->networks NULL or "" = "{}" (else a JSON object of
 * strings); s->app, entry, node and updated_ms are not read. */
int pv_workload_set_status(pv_redis *r, const pv_keys *k, const pv_workload_status *s,
                           pv_workload_status *out, pv_status *st);

/* The engine inventory of a node: the ids its engine holds, as its agent last listed them
 * (every status interval), for an audit that cannot look at the engine itself (a virt node's
 * libvirt connection, a process engine on another machine). One key per node,
 * <prefix>{reg}:engine-inv:<node name>, holding {"at_ms": <when listed>, "ids": [...]} and
 * living ttl seconds, so it is gone when its agent has been away that long. */
int pv_workload_inventory_put(pv_redis *r, const pv_keys *k, const char *node,
                              const char *const *ids, size_t n, int ttl, pv_status *st);

/* *ids (a JSON array of strings, the caller's to json_decref) and *at_ms of node's inventory;
 * NOT_FOUND when there is none; INTERNAL when it does not read as one. */
int pv_workload_inventory_get(pv_redis *r, const pv_keys *k, const char *node, json_t **ids,
                              int64_t *at_ms, pv_status *st);

/* The same for n statuses at once (SetWorkloadsStatus), all or nothing: every entry is checked
 * and every workload must exist (NOT_FOUND "workload <id> not found" naming the first missing
 * one) before any status is written. out (may be NULL) is an array of n the caller provides;
 * on PV_OK out[i] is entry i as stored (clear each with pv_workload_status_clear). */
int pv_workload_set_statuses(pv_redis *r, const pv_keys *k, const pv_workload_status *in, size_t n,
                             pv_workload_status *out, pv_status *st);

/* NOT_FOUND "status of workload <id> not found" when the workload has no live status (or does
 * not exist). */
int pv_workload_get_status(pv_redis *r, const pv_keys *k, const char *id, pv_workload_status *out,
                           pv_status *st);

/* What Eru's self-monitor does: marks the workloads of every node whose liveness has ended not
 * running and not healthy, leaving those already marked alone (so it can run on every tick).
 * *count (may be NULL) gets how many changed. */
int pv_workload_mark_dead_nodes(pv_redis *r, const pv_keys *k, size_t *count, pv_status *st);

/* Marks every workload of a node not running and not healthy (SetNode workloads_down, and the
 * node's liveness ending), in one step: an existing status keeps its TTL and its other fields;
 * a workload without one gets a status without expiry, as Eru writes it. Watchers see a "set"
 * of each. NOT_FOUND when the node is not registered. *count (may be NULL) gets how many. */
int pv_workload_mark_node_down(pv_redis *r, const pv_keys *k, const char *node, size_t *count,
                               pv_status *st);

/* --- following statuses (WorkloadStatusStream) ------------------------------------------- */

/* What a watcher streams for one change of a status key: the live status (*has_status false
 * when the key is gone again) and the record (*has_record false when the workload is gone),
 * read together. out_status and out_rec are filled only when their flag is true. */
int pv_workload_status_view(pv_redis *r, const pv_keys *k, const char *id,
                            pv_workload_status *out_status, bool *has_status, pv_workload *out_rec,
                            bool *has_record, pv_status *st);

/* A live status as a watcher keeps it: whose it is and when it was written. */
typedef struct pv_workload_status_ref {
    char id[PV_WORKLOAD_ID_LEN + 1];
    int64_t updated_ms;
    char *app, *entry, *node, *labels; /* the record's (labels: JSON object) */
} pv_workload_status_ref;

void pv_workload_status_refs_free(pv_workload_status_ref *v, size_t n);

/* One page of the live statuses in id order: those of the workloads after id `after` ("" = from
 * the start), scanning at most limit workloads (limit > 0). *next gets the id to pass as after
 * for the next page, "" when this was the last. *out NULL when the page holds no status (a page
 * may be empty and still not the last). */
int pv_workload_status_page(pv_redis *r, const pv_keys *k, const char *after, size_t limit,
                            pv_workload_status_ref **out, size_t *n,
                            char next[PV_WORKLOAD_ID_LEN + 1], pv_status *st);

/* Whether id is well formed: 1..PV_WORKLOAD_ID_LEN bytes of [A-Za-z0-9._-] (INVALID_ARGUMENT
 * naming field otherwise). Every function taking an id checks it. */
int pv_workload_check_id(const char *field, const char *id, pv_status *st);

/* Key names: the status key of an id, the prefix of every status key (the id follows it), and
 * the PSUBSCRIBE pattern of their keyspace notifications on database db. */
/* Marks workload id as let go by DissociateWorkload (<b>dissociated:<id>), so the audit does not
 * report the engine's workload without a record as an orphan. */
int pv_workload_mark_dissociated(pv_redis *r, const pv_keys *k, const char *id, pv_status *st);

/* --- high availability (workers/ops/wk_ha.h, workers/agent/wk_fence.h) ------------------- */

/* PV_HA_LABEL and PV_HA_RESTART: pv_deploy.h. */

/* Whether labels (JSON object) carry PV_HA_LABEL=restart. Another value of the label is an
 * error (st, may be NULL: INVALID_ARGUMENT naming the label and the value) and false. */
bool pv_workload_is_ha(const char *labels_json, pv_status *st);

/* What a node's instance of a workload is to the registry: its current incarnation (OWN), one
 * at the epoch a failover is placing (PLACING: on any node, the replacement it is making
 * included, which exists on its node's engine before the record moves there), an old one
 * (MOVED: the record is on another node or at another epoch), or nothing (GONE: no record). */
typedef enum { PV_INC_OWN, PV_INC_PLACING, PV_INC_MOVED, PV_INC_GONE } pv_incarnation;

/* The verdict on node's instance of workload id at epoch; *record_epoch (may be NULL) the
 * record's epoch (0 when gone). */
int pv_workload_ha_check(pv_redis *r, const pv_keys *k, const char *id, const char *node,
                         int64_t epoch, pv_incarnation *verdict, int64_t *record_epoch,
                         pv_status *st);

/* A failover (op_id) takes workload id from node: only while node's alive key is gone
 * (FAILED_PRECONDITION otherwise, and when the workload is on another node; ABORTED while
 * another failover places it). The epoch goes up (*epoch: the new one), so the node's instance
 * is stale from then on, its status says not running, and placing = op_id. Repeated by the
 * same op: the same epoch. */
int pv_workload_ha_claim(pv_redis *r, const pv_keys *k, const char *id, const char *node,
                         const char *op_id, int64_t *epoch, pv_status *st);

/* Undoes op_id's claim when its replacement could not be placed (*undone: whether it held
 * one): the old incarnation is the workload's again. */
int pv_workload_ha_unclaim(pv_redis *r, const pv_keys *k, const char *id, const char *op_id,
                           bool *undone, pv_status *st);

/* A change of a node's readiness seen by pv_workload_ha_scan. */
typedef enum { PV_HA_DOWN, PV_HA_UP, PV_HA_PENDING } pv_ha_change_kind;
typedef struct pv_ha_change {
    char *node, *node_id;
    pv_ha_change_kind change; /* PENDING: down, its failover not submitted yet */
    int64_t ha_workloads;     /* DOWN, PENDING: its workloads with PV_HA_LABEL */
    int64_t downs;            /* DOWN, PENDING: how many times it went down (request ids) */
} pv_ha_change;
void pv_ha_changes_free(pv_ha_change *c, size_t n);

/* The nodes whose readiness (alive key) changed since any caller's previous scan, each change
 * reported to one caller only (<b>ha:ready holds what the scans saw), plus the down nodes with
 * HA workloads whose failover was not acknowledged (pv_workload_ha_ack) yet. *out malloc'd
 * (pv_ha_changes_free), NULL when nothing changed. */
int pv_workload_ha_scan(pv_redis *r, const pv_keys *k, pv_ha_change **out, size_t *n,
                        pv_status *st);
int pv_workload_ha_ack(pv_redis *r, const pv_keys *k, const char *node_id, pv_status *st);

int pv_workload_status_key(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st);
int pv_workload_status_prefix(const pv_keys *k, char *buf, size_t len, pv_status *st);
int pv_workload_status_pattern(const pv_keys *k, int db, char *buf, size_t len, pv_status *st);

#endif
