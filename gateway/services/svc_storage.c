/*
 * svc_storage: StorageService's handlers (see svc_storage.h): decode and check, read the
 * records or submit the node agent's operation and wait for it, encode.
 */
#include "svc_storage.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "google/protobuf/empty.pb-c.h"
#include "op_convert.h"
#include "pivirt/storage/v1/storage.pb-c.h"
#include "pv_id.h"
#include "pv_json.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_op.h"
#include "pv_pbmap.h"
#include "pv_registry.h"
#include "pv_storage.h"
#include "pv_validate.h"

#define N_METHODS 16
/* The longest a mutation is waited for before the resource is answered as it stands. */
#define MAX_WAIT_MS 60000

struct svc_storage {
    gw_app *app;
    gw_method methods[N_METHODS];
    char paths[N_METHODS][GW_PATH_MAX];
};

svc_storage *svc_storage_new(gw_app *app) {
    svc_storage *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_storage_free(svc_storage *s) {
    free(s);
}

static gw_app *app_of(gw_call *call) {
    return ((svc_storage *)gw_call_method_data(call))->app;
}

static const pv_keys *keys_of(gw_call *call) {
    return &app_of(call)->keys;
}

static void finish_status(gw_call *call, const pv_status *st) {
    gw_call_finish(call, st->code, st->msg);
}

static bool answer_retry(gw_call *call, const char *kind);
static void answer_made(gw_call *call, int rc, const pv_status *st, pv_sto_kind kind,
                        const char *id, const void *fallback, bool pending);

/* A record of any storage kind, as pv_storage_get fills it. */
typedef union sto_rec {
    pv_pool pool;
    pv_volume vol;
    pv_snapshot snap;
} sto_rec;

/* ---- maps and timestamps ---- */

/* Entries pointing into obj (which must outlive them); freed with pv_pbmap_entries_free. */
static void **map_entries(json_t *obj, const ProtobufCMessageDescriptor *d, size_t *n) {
    void **out;
    pv_pbmap_entries(obj, d, &out, n);
    return out;
}

static void ts_of(Google__Protobuf__Timestamp *ts, int64_t ms) {
    google__protobuf__timestamp__init(ts);
    ts->seconds = ms / 1000;
    ts->nanos = (int32_t)(ms % 1000) * 1000000;
}

/* ---- messages ---- */

/* Sends m (a unary call's reply or a stream's next message): 0, or -1 when the stream is gone. */
static int send_msg(gw_call *call, ProtobufCMessage *m, bool reply) {
    if (!reply) return gw_call_send(call, m);
    gw_call_reply(call, m);
    return 0;
}

static int send_pool(gw_call *call, const pv_pool *rec, bool reply) {
    Pivirt__Storage__V1__StoragePool m = PIVIRT__STORAGE__V1__STORAGE_POOL__INIT;
    Google__Protobuf__Timestamp created;
    m.name = rec->name ? rec->name : "";
    m.type = (Pivirt__Storage__V1__PoolType)rec->type;
    m.status = (Pivirt__Storage__V1__PoolStatus)rec->status;
    m.capacity_bytes = rec->capacity;
    m.used_bytes = rec->used;
    m.available_bytes = rec->available;
    m.config = (Pivirt__Storage__V1__StoragePool__ConfigEntry **)map_entries(
        rec->config, &pivirt__storage__v1__storage_pool__config_entry__descriptor, &m.n_config);
    ts_of(&created, rec->created_ms);
    m.created_at = &created;
    int rc = send_msg(call, &m.base, reply);
    pv_pbmap_entries_free((void **)m.config);
    return rc;
}

static int send_volume(gw_call *call, const pv_volume *rec, bool reply) {
    Pivirt__Storage__V1__Volume m = PIVIRT__STORAGE__V1__VOLUME__INIT;
    Google__Protobuf__Timestamp created, updated;
    m.id = rec->id ? rec->id : "";
    m.name = rec->name ? rec->name : "";
    m.pool = rec->pool ? rec->pool : "";
    m.size_bytes = rec->size;
    m.used_bytes = rec->used;
    m.format = (Pivirt__Storage__V1__VolumeFormat)rec->format;
    m.status = (Pivirt__Storage__V1__VolumeStatus)rec->status;
    m.labels = (Pivirt__Storage__V1__Volume__LabelsEntry **)map_entries(
        rec->labels, &pivirt__storage__v1__volume__labels_entry__descriptor, &m.n_labels);
    ts_of(&created, rec->created_ms);
    ts_of(&updated, rec->updated_ms);
    m.created_at = &created;
    m.updated_at = &updated;
    int rc = send_msg(call, &m.base, reply);
    pv_pbmap_entries_free((void **)m.labels);
    return rc;
}

static int send_snapshot(gw_call *call, const pv_snapshot *rec, bool reply) {
    Pivirt__Storage__V1__Snapshot m = PIVIRT__STORAGE__V1__SNAPSHOT__INIT;
    Google__Protobuf__Timestamp created;
    m.id = rec->id ? rec->id : "";
    m.name = rec->name ? rec->name : "";
    m.volume_id = rec->volume_id ? rec->volume_id : "";
    m.size_bytes = rec->size;
    m.status = (Pivirt__Storage__V1__SnapshotStatus)rec->status;
    m.parent_snapshot_id = rec->parent ? rec->parent : "";
    ts_of(&created, rec->created_ms);
    m.created_at = &created;
    return send_msg(call, &m.base, reply);
}

static int send_rec(gw_call *call, pv_sto_kind kind, const void *rec, bool reply) {
    if (kind == PV_STO_POOL) return send_pool(call, rec, reply);
    if (kind == PV_STO_VOL) return send_volume(call, rec, reply);
    return send_snapshot(call, rec, reply);
}

static void reply_empty(gw_call *call) {
    Google__Protobuf__Empty e = GOOGLE__PROTOBUF__EMPTY__INIT;
    gw_call_reply(call, &e.base);
}

/* ---- the node agent's operations ---- */

/* The node whose agent holds pools created without config.node. */
static void default_node(gw_call *call, char *out, size_t cap) {
    const char *n = app_of(call)->cfg.storage.default_node;
    if (n && *n) {
        snprintf(out, cap, "%s", n);
        return;
    }
    if (gethostname(out, cap) != 0) snprintf(out, cap, "local");
    out[cap - 1] = '\0';
}

/* How the call answers an operation: PV_OK when it succeeded or still runs (*pending), else
 * its error. */
static int op_outcome(const pv_op *rec, bool *pending, pv_status *st) {
    *pending = false;
    if (!pv_op_done(rec)) {
        *pending = true;
        return PV_OK;
    }
    if (rec->status == PV_OP_SUCCEEDED) return PV_OK;
    if (rec->status == PV_OP_CANCELLED)
        return pv_status_set(st, PV_ABORTED, "operation %s was cancelled", rec->id);
    return pv_status_set(st, rec->error_code ? rec->error_code : PV_INTERNAL, "%s",
                         rec->error_message ? rec->error_message : "failed");
}

/* Submits kind with params (taken: freed here; NULL, out of memory, fails) on the queue of
 * node's agent (target and holds locked while it runs) and, wait set, waits for it up to the
 * call's deadline. PV_OK: it succeeded, or still runs with *pending set (the caller answers the
 * resource as it stands); else its error. *op_out (may be NULL) gets the record. */
static int run_op(gw_call *call, const char *kind, const char *node, const char *target,
                  const char *const *holds, size_t n_holds, json_t *params, bool wait,
                  bool *pending, pv_op *op_out, pv_status *st) {
    *pending = false;
    gw_app *app = app_of(call);
    pv_redis *r = gw_app_redis(call);
    /* an operation no agent would take would sit on its lock until someone cancels it */
    bool alive = false;
    int arc = pv_registry_get_alive(r, &app->keys, node, &alive, NULL, st);
    if (arc == PV_NOT_FOUND)
        arc = pv_status_set(st, PV_FAILED_PRECONDITION,
                            "node %s (which holds the pool) is not registered", node);
    else if (arc == PV_OK && !alive)
        arc = pv_status_set(st, PV_FAILED_PRECONDITION,
                            "the agent of node %s, which holds the pool, is not running", node);
    if (arc != PV_OK) {
        json_decref(params);
        return arc;
    }
    char queue[300];
    snprintf(queue, sizeof queue, "node:%s", node);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    pv_op_submit_req req = {.kind = kind,
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .holds = holds,
                            .n_holds = n_holds,
                            .notify_end = wait};
    pv_op sub = {0};
    int rc = text ? gw_app_submit(call, GW_SUBMIT_IDEMPOTENT, &req, &sub, NULL, st)
                  : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(text);
    if (rc != PV_OK) return rc;
    pv_info("%s target=%s node=%s op=%s", kind, target, node, sub.id);
    pv_op rec = {0};
    if (wait) {
        rc = op_convert_wait(call, r, &app->keys, sub.id, MAX_WAIT_MS, &rec, st);
        pv_op_clear(&sub);
        if (rc != PV_OK) return rc;
    } else {
        rec = sub;
    }
    rc = op_outcome(&rec, pending, st);
    if (op_out)
        *op_out = rec;
    else
        pv_op_clear(&rec);
    return rc;
}

/* run_op's usual form: no holds, waited for. */
static int run_waited(gw_call *call, const char *kind, const char *node, const char *target,
                      json_t *params, bool *pending, pv_status *st) {
    return run_op(call, kind, node, target, NULL, 0, params, true, pending, NULL, st);
}

static int node_of_pool(const pv_pool *pool, char *out, size_t cap) {
    snprintf(out, cap, "%s", pool->node ? pool->node : "");
    return PV_OK;
}

/* The pool a request names in field: a plain name, else INVALID_ARGUMENT naming the field (a
 * malformed name is no name of a pool: not NOT_FOUND echoing it). */
static int get_pool(gw_call *call, const char *field, const char *name, pv_pool *rec,
                    pv_status *st) {
    memset(rec, 0, sizeof *rec);
    if (pv_storage_check_name(field, name, st) != PV_OK) return st->code;
    return pv_storage_get(gw_app_redis(call), keys_of(call), PV_STO_POOL, name, rec, st);
}

/* The volume ("vol": by id, or by a name one pool holds) or snapshot ("snap") a request names in
 * field, checked as a reference first (pv_id_check). */
static int get_ref(gw_call *call, pv_sto_kind kind, const char *field, const char *ref, void *rec,
                   pv_status *st) {
    memset(rec, 0, kind == PV_STO_VOL ? sizeof(pv_volume) : sizeof(pv_snapshot));
    if (pv_id_check(field, ref, st) != PV_OK) return st->code;
    if (kind == PV_STO_VOL)
        return pv_storage_find_volume(gw_app_redis(call), keys_of(call), ref, rec, st);
    return pv_storage_get(gw_app_redis(call), keys_of(call), kind, ref, rec, st);
}

/* Deletes the record field names (params {field: value}) on node with the operation kind
 * (target locked), waited for, and answers Empty; or, rc not PV_OK, the failure st so far. */
static void answer_delete(gw_call *call, int rc, pv_status *st, const char *kind, const char *node,
                          const char *target, const char *field, const char *value) {
    bool pending = false;
    if (rc == PV_OK)
        rc = run_waited(call, kind, node, target, json_pack("{s:s}", field, value), &pending, st);
    if (rc == PV_OK)
        reply_empty(call);
    else
        finish_status(call, st);
}

/* ---- pools ---- */

static void on_create_pool(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CreatePoolRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_POOL_CREATE)) return;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    json_t *config = pv_pbmap_object((void *const *)req->config, req->n_config);
    pv_pool rec = {0};
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    if (rc == PV_OK && req->type == PIVIRT__STORAGE__V1__POOL_TYPE__POOL_TYPE_UNSPECIFIED)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT, "type: required (POOL_TYPE_DIR, ...)");
    if (rc == PV_OK && json_object_get(config, "status_message"))
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "config.status_message: set by pivirt, not by the caller");
    if (rc == PV_OK) rc = pv_storage_check_pool((int)req->type, config, &st);
    if (rc == PV_OK) {
        rc = pv_storage_get(r, keys_of(call), PV_STO_POOL, req->name, &rec, &st);
        if (rc == PV_OK)
            rc = pv_status_set(&st, PV_ALREADY_EXISTS, "name: a pool named %s already exists",
                               req->name);
        else if (rc == PV_NOT_FOUND)
            rc = PV_OK;
        pv_storage_free(PV_STO_POOL, &rec);
    }
    char node[256];
    if (json_object_get(config, "node"))
        snprintf(node, sizeof node, "%s", json_string_value(json_object_get(config, "node")));
    else
        default_node(call, node, sizeof node);
    bool pending = false;
    char target[300];
    snprintf(target, sizeof target, "pool:%s", req->name);
    if (rc == PV_OK)
        rc = run_waited(call, PV_KIND_POOL_CREATE, node, target,
                        json_pack("{s:s, s:i, s:O, s:s}", "name", req->name, "type", (int)req->type,
                                  "config", config, "node", node),
                        &pending, &st);
    pv_pool asked = {.name = req->name,
                     .type = (int)req->type,
                     .status = PV_POOL_INACTIVE,
                     .config = config,
                     .node = node};
    answer_made(call, rc, &st, PV_STO_POOL, req->name, &asked, pending);
    json_decref(config);
}

static void on_get_pool(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetPoolRequest *req = (const void *)msg;
    pv_status st;
    pv_pool rec;
    if (get_pool(call, "name", req->name, &rec, &st) != PV_OK) return finish_status(call, &st);
    send_pool(call, &rec, true);
    pv_storage_free(PV_STO_POOL, &rec);
}

static void on_list_pools(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ListPoolsRequest *req = (const void *)msg;
    pv_status st;
    pv_pool *all = NULL;
    size_t n = 0;
    int rc = pv_storage_list(gw_app_redis(call), keys_of(call), PV_STO_POOL, NULL, (void **)&all,
                             &n, &st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (req->type && all[i].type != (int)req->type) continue;
        if (send_pool(call, &all[i], false) != 0) rc = PV_CANCELLED;
    }
    pv_storage_array_free(PV_STO_POOL, all, n);
    gw_app_finish_stream(call, rc, &st);
}

/* Pool name (the request's field "name") and its volumes (*vols, *nv: free them with
 * pv_storage_array_free, and *rec with pv_storage_free, whatever this returns). */
static int pool_and_volumes(gw_call *call, const char *name, pv_pool *rec, pv_volume **vols,
                            size_t *nv, pv_status *st) {
    int rc = get_pool(call, "name", name, rec, st);
    if (rc != PV_OK) return rc;
    return pv_storage_list(gw_app_redis(call), keys_of(call), PV_STO_VOL, name, (void **)vols, nv,
                           st);
}

static void on_delete_pool(gw_call *call, const ProtobufCMessage *msg) {
    if (answer_retry(call, PV_KIND_POOL_DELETE)) return;
    const Pivirt__Storage__V1__DeletePoolRequest *req = (const void *)msg;
    pv_status st;
    pv_pool rec;
    pv_volume *vols = NULL;
    size_t nv = 0;
    int rc = pool_and_volumes(call, req->name, &rec, &vols, &nv, &st);
    if (rc == PV_OK && nv > 0)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                           "pool %s still holds %zu volume(s) (%s%s): delete them first", req->name,
                           nv, vols[0].name, nv > 1 ? ", ..." : "");
    char node[256] = "", target[300];
    node_of_pool(&rec, node, sizeof node);
    snprintf(target, sizeof target, "pool:%s", req->name);
    answer_delete(call, rc, &st, PV_KIND_POOL_DELETE, node, target, "name", req->name);
    pv_storage_free(PV_STO_POOL, &rec);
    pv_storage_array_free(PV_STO_VOL, vols, nv);
}

static void on_get_pool_stats(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetPoolStatsRequest *req = (const void *)msg;
    pv_status st;
    pv_pool rec;
    pv_volume *vols = NULL;
    size_t nv = 0;
    int rc = pool_and_volumes(call, req->name, &rec, &vols, &nv, &st);
    Pivirt__Storage__V1__PoolStats m = PIVIRT__STORAGE__V1__POOL_STATS__INIT;
    for (size_t i = 0; rc == PV_OK && i < nv; i++) {
        void *snaps = NULL;
        size_t ns = 0;
        rc = pv_storage_list(gw_app_redis(call), keys_of(call), PV_STO_SNAP, vols[i].id, &snaps,
                             &ns, &st);
        m.snapshot_count += (int32_t)ns;
        pv_storage_array_free(PV_STO_SNAP, snaps, ns);
    }
    if (rc == PV_OK) {
        m.name = rec.name;
        m.capacity_bytes = rec.capacity;
        m.used_bytes = rec.used;
        m.available_bytes = rec.available;
        m.volume_count = (int32_t)nv;
        m.usage_percent =
            m.capacity_bytes > 0 ? 100.0 * (double)m.used_bytes / (double)m.capacity_bytes : 0;
        gw_call_reply(call, &m.base);
    } else {
        finish_status(call, &st);
    }
    pv_storage_free(PV_STO_POOL, &rec);
    pv_storage_array_free(PV_STO_VOL, vols, nv);
}

/* ---- volumes ---- */

static bool labels_match(json_t *have, json_t *want) {
    const char *key;
    json_t *v;
    json_object_foreach(want, key, v) {
        const char *h = json_string_value(json_object_get(have, key));
        if (!h || strcmp(h, json_string_value(v)) != 0) return false;
    }
    return true;
}

/* Answers record id of kind after a mutation: the record, or the fallback (what was asked, in
 * the state a new record starts in) while its agent has not written it yet (pending); or, rc
 * not PV_OK, the failure st so far. */
static void answer_made(gw_call *call, int rc, const pv_status *st, pv_sto_kind kind,
                        const char *id, const void *fallback, bool pending) {
    if (rc != PV_OK) return finish_status(call, st);
    pv_status gst;
    sto_rec rec;
    rc = pv_storage_get(gw_app_redis(call), keys_of(call), kind, id, &rec, &gst);
    if (rc == PV_NOT_FOUND && pending && fallback)
        send_rec(call, kind, fallback, true);
    else if (rc == PV_OK)
        send_rec(call, kind, &rec, true);
    else
        finish_status(call, &gst);
    pv_storage_free(kind, &rec);
}

/* Answers a retried call from its operation's params, read as the record they describe (a
 * pool's, a snapshot's, a volume's: the fields they share are named alike). */
static void answer_from_params(gw_call *call, const char *kind, json_t *params, bool pending) {
    pv_status st;
    sto_rec asked;
    pv_sto_kind sk = strcmp(kind, PV_KIND_POOL_CREATE) == 0       ? PV_STO_POOL
                     : strcmp(kind, PV_KIND_SNAPSHOT_CREATE) == 0 ? PV_STO_SNAP
                                                                  : PV_STO_VOL;
    const pv_record_schema *schema = sk == PV_STO_POOL   ? &pv_pool_schema
                                     : sk == PV_STO_SNAP ? &pv_snapshot_schema
                                                         : &pv_volume_schema;
    if (pv_record_decode_json(schema, "params", params, &asked, &st) != PV_OK)
        return finish_status(call, &st);
    const char *id = asked.vol.id; /* volume_create, volume_clone, volume_resize */
    if (sk == PV_STO_POOL) {
        asked.pool.status = PV_POOL_INACTIVE;
        id = asked.pool.name;
    } else if (sk == PV_STO_SNAP) {
        asked.snap.status = PV_SNAP_CREATING;
        id = asked.snap.id;
    } else if (!asked.vol.status) {
        asked.vol.status = PV_VOL_CREATING;
    }
    answer_made(call, PV_OK, NULL, sk, id, &asked, pending);
    pv_storage_free(sk, &asked);
}

/* A call retried with the x-request-id of an earlier one (its answer lost with a gateway or a
 * connection) is answered from the operation that one made, waited on as the first was, before
 * any check: the checks would judge the resource as that operation left it (a deleted volume
 * "not found", a made pool "already exists"), and ids drawn anew would name nothing. Returns
 * true when it answered the call. */
static bool answer_retry(gw_call *call, const char *kind) {
    if (!gw_call_has_client_request_id(call)) return false;
    gw_app *app = app_of(call);
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char op_id[PV_ID_MAX];
    if (pv_op_find_request(r, &app->keys, gw_call_request_id(call), op_id, &st) != PV_OK ||
        !op_id[0])
        return false; /* Redis unreachable: the call's own path reports it */
    pv_op rec = {0};
    bool pending = false;
    json_t *params = NULL;
    int rc = op_convert_wait(call, r, &app->keys, op_id, MAX_WAIT_MS, &rec, &st);
    if (rc == PV_OK && strcmp(rec.kind, kind) != 0)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "x-request-id: \"%.100s\" was used for operation %s (%s), not for "
                           "this call (%s)",
                           gw_call_request_id(call), rec.id, rec.kind, kind);
    if (rc == PV_OK) rc = op_outcome(&rec, &pending, &st);
    if (rc == PV_OK && !(params = json_loads(rec.params ? rec.params : "", 0, NULL)))
        rc = pv_status_set(&st, PV_INTERNAL, "operation %s: its params are not JSON", rec.id);
    if (rc != PV_OK)
        finish_status(call, &st);
    else if (strstr(kind, "_delete"))
        reply_empty(call);
    else
        answer_from_params(call, kind, params, pending);
    pv_info("a retried call (x-request-id %.100s) answered from operation %s (%s)",
            gw_call_request_id(call), op_id, kind);
    json_decref(params);
    pv_op_clear(&rec);
    return true;
}

static void on_create_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CreateVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_CREATE)) return;
    pv_status st;
    pv_pool pool = {0};
    json_t *labels = pv_pbmap_object((void *const *)req->labels, req->n_labels);
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    if (rc == PV_OK && req->size_bytes <= 0)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT, "size_bytes: %lld is not > 0",
                           (long long)req->size_bytes);
    if (rc == PV_OK && req->format == 0)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "format: required (VOLUME_FORMAT_RAW, QCOW2, VMDK or VDI)");
    if (rc == PV_OK) {
        rc = get_pool(call, "pool", req->pool, &pool, &st);
        if (rc == PV_NOT_FOUND) pv_status_prefix(&st, "pool");
    }
    char id[PV_ID_MAX], node[256];
    pv_id_new("vol", id, sizeof id);
    bool pending = false;
    node_of_pool(&pool, node, sizeof node);
    if (rc == PV_OK)
        rc = run_waited(call, PV_KIND_VOLUME_CREATE, node, id,
                        json_pack("{s:s, s:s, s:s, s:I, s:i, s:O}", "id", id, "name", req->name,
                                  "pool", req->pool, "size", (json_int_t)req->size_bytes, "format",
                                  (int)req->format, "labels", labels),
                        &pending, &st);
    pv_volume asked = {.id = id,
                       .name = req->name,
                       .pool = req->pool,
                       .size = req->size_bytes,
                       .format = (int)req->format,
                       .status = PV_VOL_CREATING,
                       .labels = labels};
    answer_made(call, rc, &st, PV_STO_VOL, id, &asked, pending);
    pv_storage_free(PV_STO_POOL, &pool);
    json_decref(labels);
}

/* Get by id: the volume or snapshot named by id. */
static void answer_ref(gw_call *call, pv_sto_kind kind, const char *id) {
    pv_status st;
    sto_rec rec;
    if (get_ref(call, kind, "id", id, &rec, &st) != PV_OK)
        finish_status(call, &st);
    else
        send_rec(call, kind, &rec, true);
    pv_storage_free(kind, &rec);
}

static void on_get_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetVolumeRequest *req = (const void *)msg;
    answer_ref(call, PV_STO_VOL, req->id);
}

/* Sends the volumes of pool whose labels hold want: PV_CANCELLED when the stream went. */
static int send_pool_volumes(gw_call *call, const char *pool, json_t *want, pv_status *st) {
    pv_volume *vols = NULL;
    size_t n = 0;
    int rc = pv_storage_list(gw_app_redis(call), keys_of(call), PV_STO_VOL, pool, (void **)&vols,
                             &n, st);
    for (size_t j = 0; rc == PV_OK && j < n; j++) {
        if (!labels_match(vols[j].labels, want)) continue;
        if (send_volume(call, &vols[j], false) != 0) rc = PV_CANCELLED;
    }
    pv_storage_array_free(PV_STO_VOL, vols, n);
    return rc;
}

static void on_list_volumes(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ListVolumesRequest *req = (const void *)msg;
    pv_status st;
    json_t *want = pv_pbmap_object((void *const *)req->labels, req->n_labels);
    pv_pool *pools = NULL;
    size_t n = 0;
    int rc = PV_OK;
    if (req->pool && *req->pool) {
        pools = calloc(1, sizeof *pools);
        rc = pools ? get_pool(call, "pool", req->pool, pools, &st)
                   : pv_status_set(&st, PV_INTERNAL, "out of memory");
        n = pools ? 1 : 0;
    } else {
        rc = pv_storage_list(gw_app_redis(call), keys_of(call), PV_STO_POOL, NULL, (void **)&pools,
                             &n, &st);
    }
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        rc = send_pool_volumes(call, pools[i].name, want, &st);
    gw_app_finish_stream(call, rc, &st);
    pv_storage_array_free(PV_STO_POOL, pools, n);
    json_decref(want);
}

/* The volume ref names and its pool's node. */
static int volume_and_node(gw_call *call, const char *field, const char *ref, pv_volume *vol,
                           char *node, size_t cap, pv_status *st) {
    pv_redis *r = gw_app_redis(call);
    if (get_ref(call, PV_STO_VOL, field, ref, vol, st) != PV_OK) return st->code;
    pv_pool pool;
    if (pv_storage_get(r, keys_of(call), PV_STO_POOL, vol->pool, &pool, st) != PV_OK) {
        pv_storage_free(PV_STO_VOL, vol);
        return st->code;
    }
    node_of_pool(&pool, node, cap);
    pv_storage_free(PV_STO_POOL, &pool);
    return PV_OK;
}

/* FAILED_PRECONDITION when vol is held by a running workload (`what` ends the message). */
static int check_not_in_use(const pv_volume *vol, const char *what, pv_status *st) {
    if (vol->status != PV_VOL_IN_USE) return PV_OK;
    return pv_status_set(st, PV_FAILED_PRECONDITION, "volume %s is in use by a running workload%s",
                         vol->name, what);
}

static void on_delete_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__DeleteVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_DELETE)) return;
    pv_status st;
    pv_volume vol;
    char node[256];
    int rc = volume_and_node(call, "id", req->id, &vol, node, sizeof node, &st);
    if (rc == PV_OK) rc = check_not_in_use(&vol, "", &st);
    answer_delete(call, rc, &st, PV_KIND_VOLUME_DELETE, node, vol.id, "id", vol.id);
    pv_storage_free(PV_STO_VOL, &vol);
}

static void on_resize_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ResizeVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_RESIZE)) return;
    pv_status st;
    pv_volume vol;
    char node[256];
    int rc = volume_and_node(call, "id", req->id, &vol, node, sizeof node, &st);
    if (rc == PV_OK && req->new_size_bytes < vol.size)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "new_size_bytes: %lld is smaller than the volume's %lld: volumes only "
                           "grow",
                           (long long)req->new_size_bytes, (long long)vol.size);
    if (rc == PV_OK) rc = check_not_in_use(&vol, "", &st);
    bool pending = false;
    if (rc == PV_OK)
        rc = run_waited(
            call, PV_KIND_VOLUME_RESIZE, node, vol.id,
            json_pack("{s:s, s:I}", "id", vol.id, "size", (json_int_t)req->new_size_bytes),
            &pending, &st);
    answer_made(call, rc, &st, PV_STO_VOL, vol.id, NULL, false);
    pv_storage_free(PV_STO_VOL, &vol);
}

static void on_clone_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CloneVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_CLONE)) return;
    pv_status st;
    pv_volume src;
    pv_pool pool = {0};
    char src_node[256], node[256], id[PV_ID_MAX];
    int rc =
        volume_and_node(call, "source_id", req->source_id, &src, src_node, sizeof src_node, &st);
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    const char *pool_name = req->pool && *req->pool ? req->pool : src.pool ? src.pool : "";
    if (rc == PV_OK) {
        rc = get_pool(call, "pool", pool_name, &pool, &st);
        if (rc == PV_NOT_FOUND) pv_status_prefix(&st, "pool");
    }
    if (rc == PV_OK) {
        node_of_pool(&pool, node, sizeof node);
        if (strcmp(node, src_node) != 0)
            rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                               "pool: %s is on node %s, the source on %s: clones stay on the "
                               "source's host",
                               pool_name, node, src_node);
    }
    pv_id_new("vol", id, sizeof id);
    bool pending = false;
    const char *holds[] = {src.id};
    if (rc == PV_OK)
        rc = run_op(call, PV_KIND_VOLUME_CLONE, node, id, holds, 1,
                    json_pack("{s:s, s:s, s:s, s:s}", "source_id", src.id, "id", id, "name",
                              req->name, "pool", pool_name),
                    true, &pending, NULL, &st);
    pv_volume asked = {.id = id,
                       .name = req->name,
                       .pool = (char *)pool_name,
                       .size = src.size,
                       .format = src.format,
                       .status = PV_VOL_CREATING};
    answer_made(call, rc, &st, PV_STO_VOL, id, &asked, pending);
    pv_storage_free(PV_STO_VOL, &src);
    pv_storage_free(PV_STO_POOL, &pool);
}

/* ---- snapshots ---- */

static void on_create_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CreateSnapshotRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_SNAPSHOT_CREATE)) return;
    pv_status st;
    pv_volume vol;
    pv_pool pool = {0};
    char node[256], id[PV_ID_MAX];
    int rc = volume_and_node(call, "volume_id", req->volume_id, &vol, node, sizeof node, &st);
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    if (rc == PV_OK)
        rc = pv_storage_get(gw_app_redis(call), keys_of(call), PV_STO_POOL, vol.pool, &pool, &st);
    /* LVM and RBD pools snapshot with their own commands; elsewhere only qcow2 can */
    if (rc == PV_OK && pv_storage_snapshot_method(pool.type, vol.format) == PV_SNAPS_NONE)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                           "volume_id: volume %s is not qcow2: snapshots are qcow2 internal "
                           "snapshots, or LVM and RBD snapshots in those pools",
                           vol.name);
    pv_storage_free(PV_STO_POOL, &pool);
    pv_id_new("snap", id, sizeof id);
    bool pending = false;
    /* snapshots of one volume go one at a time: the volume is the operation's target */
    if (rc == PV_OK)
        rc = run_waited(
            call, PV_KIND_SNAPSHOT_CREATE, node, vol.id,
            json_pack("{s:s, s:s, s:s}", "id", id, "volume_id", vol.id, "name", req->name),
            &pending, &st);
    pv_snapshot asked = {
        .id = id, .name = req->name, .volume_id = vol.id, .status = PV_SNAP_CREATING};
    answer_made(call, rc, &st, PV_STO_SNAP, id, &asked, pending);
    pv_storage_free(PV_STO_VOL, &vol);
}

static void on_get_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetSnapshotRequest *req = (const void *)msg;
    answer_ref(call, PV_STO_SNAP, req->id);
}

/* Whether snapshot id is one of all[0..n). */
static bool snapshot_listed(const pv_snapshot *all, size_t n, const char *id) {
    for (size_t j = 0; j < n; j++)
        if (strcmp(all[j].id, id) == 0) return true;
    return false;
}

/* Parents before children: each snapshot after the one it branches from (creation order breaks
 * ties, and is the order of the records). */
static void on_list_snapshots(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ListSnapshotsRequest *req = (const void *)msg;
    pv_status st;
    pv_volume vol;
    pv_snapshot *all = NULL;
    size_t n = 0, sent = 0;
    int rc = get_ref(call, PV_STO_VOL, "volume_id", req->volume_id, &vol, &st);
    if (rc == PV_OK)
        rc = pv_storage_list(gw_app_redis(call), keys_of(call), PV_STO_SNAP, vol.id, (void **)&all,
                             &n, &st);
    bool *done = calloc(n ? n : 1, sizeof *done);
    json_t *emitted = json_object();
    /* repeated passes: a snapshot goes once its parent went (or its parent is gone) */
    while (rc == PV_OK && done && sent < n) {
        size_t before = sent;
        for (size_t i = 0; rc == PV_OK && i < n; i++) {
            const char *parent = all[i].parent;
            bool parent_known = *parent && snapshot_listed(all, n, parent);
            if (done[i] || (parent_known && !json_object_get(emitted, parent))) continue;
            if (send_snapshot(call, &all[i], false) != 0) rc = PV_CANCELLED;
            done[i] = true;
            json_object_set_new(emitted, all[i].id, json_true());
            sent++;
        }
        if (sent == before) break; /* a cycle cannot happen; stop rather than spin */
    }
    free(done);
    json_decref(emitted);
    gw_app_finish_stream(call, rc, &st);
    pv_storage_array_free(PV_STO_SNAP, all, n);
    pv_storage_free(PV_STO_VOL, &vol);
}

/* The snapshot a request names in field, its volume and the volume's node. */
static int snapshot_and_volume(gw_call *call, const char *field, const char *ref, pv_snapshot *snap,
                               pv_volume *vol, char *node, size_t cap, pv_status *st) {
    memset(vol, 0, sizeof *vol);
    int rc = get_ref(call, PV_STO_SNAP, field, ref, snap, st);
    if (rc == PV_OK) rc = volume_and_node(call, "volume_id", snap->volume_id, vol, node, cap, st);
    return rc;
}

static void on_restore_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__RestoreSnapshotRequest *req = (const void *)msg;
    pv_status st;
    pv_snapshot snap;
    pv_volume vol;
    char node[256];
    int rc = snapshot_and_volume(call, "snapshot_id", req->snapshot_id, &snap, &vol, node,
                                 sizeof node, &st);
    /* A volume in use may be restored while its VM is shut off: only the node's agent can tell
     * (it asks libvirt whether a running domain holds the image, and refuses naming it) */
    pv_op op = {0};
    bool pending = false;
    if (rc == PV_OK)
        rc = run_op(call, PV_KIND_SNAPSHOT_RESTORE, node, vol.id, NULL, 0,
                    json_pack("{s:s}", "snapshot_id", snap.id), false, &pending, &op, &st);
    if (rc == PV_OK)
        op_convert_reply(call, &op);
    else
        finish_status(call, &st);
    pv_op_clear(&op);
    pv_storage_free(PV_STO_SNAP, &snap);
    pv_storage_free(PV_STO_VOL, &vol);
}

static void on_delete_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__DeleteSnapshotRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_SNAPSHOT_DELETE)) return;
    pv_status st;
    pv_snapshot snap;
    pv_volume vol;
    char node[256];
    int rc = snapshot_and_volume(call, "id", req->id, &snap, &vol, node, sizeof node, &st);
    answer_delete(call, rc, &st, PV_KIND_SNAPSHOT_DELETE, node, vol.id, "id", snap.id);
    pv_storage_free(PV_STO_SNAP, &snap);
    pv_storage_free(PV_STO_VOL, &vol);
}

int svc_storage_register(svc_storage *s, gw_server *server) {
#define M(name, kind, req, fn)                                                                     \
    { name, kind, &pivirt__storage__v1__##req##__descriptor, fn, true }
    static const gw_method_spec k[N_METHODS] = {
        M("CreatePool", GW_UNARY, create_pool_request, on_create_pool),
        M("GetPool", GW_UNARY, get_pool_request, on_get_pool),
        M("ListPools", GW_SERVER_STREAM, list_pools_request, on_list_pools),
        M("DeletePool", GW_UNARY, delete_pool_request, on_delete_pool),
        M("CreateVolume", GW_UNARY, create_volume_request, on_create_volume),
        M("GetVolume", GW_UNARY, get_volume_request, on_get_volume),
        M("ListVolumes", GW_SERVER_STREAM, list_volumes_request, on_list_volumes),
        M("DeleteVolume", GW_UNARY, delete_volume_request, on_delete_volume),
        M("ResizeVolume", GW_UNARY, resize_volume_request, on_resize_volume),
        M("CloneVolume", GW_UNARY, clone_volume_request, on_clone_volume),
        M("CreateSnapshot", GW_UNARY, create_snapshot_request, on_create_snapshot),
        M("GetSnapshot", GW_UNARY, get_snapshot_request, on_get_snapshot),
        M("ListSnapshots", GW_SERVER_STREAM, list_snapshots_request, on_list_snapshots),
        M("RestoreSnapshot", GW_UNARY, restore_snapshot_request, on_restore_snapshot),
        M("DeleteSnapshot", GW_UNARY, delete_snapshot_request, on_delete_snapshot),
        M("GetPoolStats", GW_UNARY, get_pool_stats_request, on_get_pool_stats),
    };
#undef M
    return gw_server_add_service(server, "pivirt.storage.v1.StorageService", k, N_METHODS, s,
                                 s->methods, s->paths);
}
