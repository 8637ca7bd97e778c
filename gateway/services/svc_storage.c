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
static void answer_pool(gw_call *call, const char *name, json_t *fallback, bool pending);

/* ---- maps and timestamps ---- */

typedef struct str_entry {
    ProtobufCMessage base;
    char *key, *value;
} str_entry;

static json_t *map_json(void *const *entries, size_t n) {
    json_t *o = json_object();
    for (size_t i = 0; o && i < n; i++) {
        const str_entry *e = entries[i];
        json_object_set_new(o, e->key ? e->key : "", json_string(e->value ? e->value : ""));
    }
    return o;
}

/* Entries pointing into obj (which must outlive them); free the array only. */
static void **map_entries(json_t *obj, const ProtobufCMessageDescriptor *d, size_t *n) {
    *n = 0;
    size_t count = json_object_size(obj);
    if (!count) return NULL;
    void **out = calloc(count, sizeof *out);
    str_entry *e = calloc(count, d->sizeof_message);
    if (!out || !e) {
        free(out);
        free(e);
        return NULL;
    }
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        str_entry *x = (str_entry *)((char *)e + *n * d->sizeof_message);
        protobuf_c_message_init(d, x);
        x->key = (char *)key;
        x->value = (char *)json_string_value(v);
        out[(*n)++] = x;
    }
    return out;
}

static void map_free(void **entries) {
    if (entries) free(entries[0]);
    free(entries);
}

static void ts_of(Google__Protobuf__Timestamp *ts, int64_t ms) {
    google__protobuf__timestamp__init(ts);
    ts->seconds = ms / 1000;
    ts->nanos = (int32_t)(ms % 1000) * 1000000;
}

/* ---- messages ---- */

static int send_pool(gw_call *call, json_t *rec, bool reply) {
    Pivirt__Storage__V1__StoragePool m = PIVIRT__STORAGE__V1__STORAGE_POOL__INIT;
    Google__Protobuf__Timestamp created;
    m.name = (char *)pv_json_str(rec, "name");
    m.type = (Pivirt__Storage__V1__PoolType)pv_json_int(rec, "type");
    m.status = (Pivirt__Storage__V1__PoolStatus)pv_json_int(rec, "status");
    m.capacity_bytes = pv_json_int(rec, "capacity");
    m.used_bytes = pv_json_int(rec, "used");
    m.available_bytes = pv_json_int(rec, "available");
    json_t *config = json_object_get(rec, "config");
    m.config = (Pivirt__Storage__V1__StoragePool__ConfigEntry **)map_entries(
        config, &pivirt__storage__v1__storage_pool__config_entry__descriptor, &m.n_config);
    ts_of(&created, pv_json_int(rec, "created_ms"));
    m.created_at = &created;
    int rc = 0;
    if (reply)
        gw_call_reply(call, &m.base);
    else
        rc = gw_call_send(call, &m.base);
    map_free((void **)m.config);
    return rc;
}

static int send_volume(gw_call *call, json_t *rec, bool reply) {
    Pivirt__Storage__V1__Volume m = PIVIRT__STORAGE__V1__VOLUME__INIT;
    Google__Protobuf__Timestamp created, updated;
    m.id = (char *)pv_json_str(rec, "id");
    m.name = (char *)pv_json_str(rec, "name");
    m.pool = (char *)pv_json_str(rec, "pool");
    m.size_bytes = pv_json_int(rec, "size");
    m.used_bytes = pv_json_int(rec, "used");
    m.format = (Pivirt__Storage__V1__VolumeFormat)pv_json_int(rec, "format");
    m.status = (Pivirt__Storage__V1__VolumeStatus)pv_json_int(rec, "status");
    m.labels = (Pivirt__Storage__V1__Volume__LabelsEntry **)map_entries(
        json_object_get(rec, "labels"), &pivirt__storage__v1__volume__labels_entry__descriptor,
        &m.n_labels);
    ts_of(&created, pv_json_int(rec, "created_ms"));
    ts_of(&updated, pv_json_int(rec, "updated_ms"));
    m.created_at = &created;
    m.updated_at = &updated;
    int rc = 0;
    if (reply)
        gw_call_reply(call, &m.base);
    else
        rc = gw_call_send(call, &m.base);
    map_free((void **)m.labels);
    return rc;
}

static int send_snapshot(gw_call *call, json_t *rec, bool reply) {
    Pivirt__Storage__V1__Snapshot m = PIVIRT__STORAGE__V1__SNAPSHOT__INIT;
    Google__Protobuf__Timestamp created;
    m.id = (char *)pv_json_str(rec, "id");
    m.name = (char *)pv_json_str(rec, "name");
    m.volume_id = (char *)pv_json_str(rec, "volume_id");
    m.size_bytes = pv_json_int(rec, "size");
    m.status = (Pivirt__Storage__V1__SnapshotStatus)pv_json_int(rec, "status");
    m.parent_snapshot_id = (char *)pv_json_str(rec, "parent");
    ts_of(&created, pv_json_int(rec, "created_ms"));
    m.created_at = &created;
    if (reply) {
        gw_call_reply(call, &m.base);
        return 0;
    }
    return gw_call_send(call, &m.base);
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

/* Submits kind on the queue of node's agent (target and holds locked while it runs) and waits
 * for it up to the call's deadline. PV_OK: it succeeded; PV_DEADLINE_EXCEEDED in *st->code
 * with *pending set: still running (the caller answers the resource as it stands); else its
 * error. *op_out (may be NULL) gets the record. */
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
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "node %s (which holds the pool) is not registered", node);
    if (arc != PV_OK) return arc;
    if (!alive)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "the agent of node %s, which holds the pool, is not running", node);
    char queue[300];
    snprintf(queue, sizeof queue, "node:%s", node);
    char *text = json_dumps(params, JSON_COMPACT);
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

static int node_of_pool(json_t *pool, char *out, size_t cap) {
    snprintf(out, cap, "%s", pv_json_str(pool, "node"));
    return PV_OK;
}

/* The pool a request names in field: a plain name, else INVALID_ARGUMENT naming the field (a
 * malformed name is no name of a pool: not NOT_FOUND echoing it). */
static int get_pool(gw_call *call, const char *field, const char *name, json_t **rec,
                    pv_status *st) {
    *rec = NULL;
    if (pv_storage_check_name(field, name, st) != PV_OK) return st->code;
    return pv_storage_get(gw_app_redis(call), keys_of(call), "pool", name, rec, st);
}

/* The volume ("vol": by id, or by a name one pool holds) or snapshot ("snap") a request names in
 * field, checked as a reference first (pv_id_check). */
static int get_ref(gw_call *call, const char *kind, const char *field, const char *ref,
                   json_t **rec, pv_status *st) {
    *rec = NULL;
    if (pv_id_check(field, ref, st) != PV_OK) return st->code;
    if (strcmp(kind, "vol") == 0)
        return pv_storage_find_volume(gw_app_redis(call), keys_of(call), ref, rec, st);
    return pv_storage_get(gw_app_redis(call), keys_of(call), kind, ref, rec, st);
}

/* ---- pools ---- */

static void on_create_pool(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CreatePoolRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_POOL_CREATE)) return;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    json_t *config = map_json((void *const *)req->config, req->n_config);
    json_t *rec = NULL;
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    if (rc == PV_OK && req->type == PIVIRT__STORAGE__V1__POOL_TYPE__POOL_TYPE_UNSPECIFIED)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT, "type: required (POOL_TYPE_DIR, ...)");
    if (rc == PV_OK && json_object_get(config, "status_message"))
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "config.status_message: set by pivirt, not by the caller");
    if (rc == PV_OK) rc = pv_storage_check_pool((int)req->type, config, &st);
    if (rc == PV_OK) {
        rc = pv_storage_get(r, keys_of(call), "pool", req->name, &rec, &st);
        if (rc == PV_OK)
            rc = pv_status_set(&st, PV_ALREADY_EXISTS, "name: a pool named %s already exists",
                               req->name);
        else if (rc == PV_NOT_FOUND)
            rc = PV_OK;
        json_decref(rec);
        rec = NULL;
    }
    char node[256];
    if (json_object_get(config, "node"))
        snprintf(node, sizeof node, "%s", json_string_value(json_object_get(config, "node")));
    else
        default_node(call, node, sizeof node);
    bool pending = false;
    if (rc == PV_OK) {
        json_t *params = json_pack("{s:s, s:i, s:O, s:s}", "name", req->name, "type",
                                   (int)req->type, "config", config, "node", node);
        char target[300];
        snprintf(target, sizeof target, "pool:%s", req->name);
        rc = run_op(call, PV_KIND_POOL_CREATE, node, target, NULL, 0, params, true, &pending, NULL,
                    &st);
        json_decref(params);
    }
    if (rc == PV_OK) {
        json_t *asked =
            json_pack("{s:i, s:O, s:s}", "type", (int)req->type, "config", config, "node", node);
        answer_pool(call, req->name, asked, pending);
        json_decref(asked);
    } else {
        finish_status(call, &st);
    }
    json_decref(rec);
    json_decref(config);
}

static void on_get_pool(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetPoolRequest *req = (const void *)msg;
    pv_status st;
    json_t *rec = NULL;
    if (get_pool(call, "name", req->name, &rec, &st) != PV_OK) return finish_status(call, &st);
    send_pool(call, rec, true);
    json_decref(rec);
}

static void on_list_pools(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ListPoolsRequest *req = (const void *)msg;
    pv_status st;
    json_t *all = NULL;
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK)
        rc = pv_storage_list(gw_app_redis(call), keys_of(call), "pool", NULL, &all, &st);
    size_t i;
    json_t *p;
    json_array_foreach(all, i, p) {
        if (rc != PV_OK) break;
        if (req->type && pv_json_int(p, "type") != (int64_t)req->type) continue;
        if (send_pool(call, p, false) != 0) rc = PV_CANCELLED;
    }
    json_decref(all);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        finish_status(call, &st);
}

static void on_delete_pool(gw_call *call, const ProtobufCMessage *msg) {
    if (answer_retry(call, PV_KIND_POOL_DELETE)) return;
    const Pivirt__Storage__V1__DeletePoolRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    json_t *rec = NULL, *vols = NULL;
    int rc = get_pool(call, "name", req->name, &rec, &st);
    if (rc == PV_OK) rc = pv_storage_list(r, keys_of(call), "vol", req->name, &vols, &st);
    if (rc == PV_OK && json_array_size(vols) > 0)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                           "pool %s still holds %zu volume(s) (%s%s): delete them first", req->name,
                           json_array_size(vols), pv_json_str(json_array_get(vols, 0), "name"),
                           json_array_size(vols) > 1 ? ", ..." : "");
    bool pending = false;
    char node[256] = "", target[300];
    if (rc == PV_OK) {
        node_of_pool(rec, node, sizeof node);
        snprintf(target, sizeof target, "pool:%s", req->name);
        json_t *params = json_pack("{s:s}", "name", req->name);
        rc = run_op(call, PV_KIND_POOL_DELETE, node, target, NULL, 0, params, true, &pending, NULL,
                    &st);
        json_decref(params);
    }
    if (rc == PV_OK)
        reply_empty(call);
    else
        finish_status(call, &st);
    json_decref(rec);
    json_decref(vols);
}

static void on_get_pool_stats(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetPoolStatsRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    json_t *rec = NULL, *vols = NULL;
    int rc = get_pool(call, "name", req->name, &rec, &st);
    if (rc == PV_OK) rc = pv_storage_list(r, keys_of(call), "vol", req->name, &vols, &st);
    Pivirt__Storage__V1__PoolStats m = PIVIRT__STORAGE__V1__POOL_STATS__INIT;
    size_t i;
    json_t *v;
    json_array_foreach(vols, i, v) {
        if (rc != PV_OK) break;
        json_t *snaps = NULL;
        rc = pv_storage_list(r, keys_of(call), "snap", pv_json_str(v, "id"), &snaps, &st);
        m.snapshot_count += (int32_t)json_array_size(snaps);
        json_decref(snaps);
    }
    if (rc == PV_OK) {
        m.name = (char *)pv_json_str(rec, "name");
        m.capacity_bytes = pv_json_int(rec, "capacity");
        m.used_bytes = pv_json_int(rec, "used");
        m.available_bytes = pv_json_int(rec, "available");
        m.volume_count = (int32_t)json_array_size(vols);
        m.usage_percent =
            m.capacity_bytes > 0 ? 100.0 * (double)m.used_bytes / (double)m.capacity_bytes : 0;
        gw_call_reply(call, &m.base);
    } else {
        finish_status(call, &st);
    }
    json_decref(rec);
    json_decref(vols);
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

/* Answers the volume id after a mutation: the record, or CREATING when its agent has not
 * written it yet (pending). */
static void answer_volume(gw_call *call, const char *id, json_t *fallback, bool pending) {
    pv_status st;
    json_t *rec = NULL;
    int rc = pv_storage_get(gw_app_redis(call), keys_of(call), "vol", id, &rec, &st);
    if (rc == PV_NOT_FOUND && pending && fallback) {
        send_volume(call, fallback, true);
        return;
    }
    if (rc == PV_OK) {
        send_volume(call, rec, true);
        json_decref(rec);
    } else {
        finish_status(call, &st);
    }
}

/* Answers pool `name` after its creation: the record, or INACTIVE from what was asked
 * (fallback: name, type, config, node) while its agent has not made it (pending). */
static void answer_pool(gw_call *call, const char *name, json_t *fallback, bool pending) {
    pv_status st;
    json_t *rec = NULL;
    int rc = pv_storage_get(gw_app_redis(call), keys_of(call), "pool", name, &rec, &st);
    if (rc == PV_NOT_FOUND && pending && fallback) {
        rec = json_pack("{s:s, s:O, s:i, s:O, s:O}", "name", name, "type",
                        json_object_get(fallback, "type"), "status", 2 /* INACTIVE */, "config",
                        json_object_get(fallback, "config"), "node",
                        json_object_get(fallback, "node"));
        rc = rec ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    }
    if (rc == PV_OK)
        send_pool(call, rec, true);
    else
        finish_status(call, &st);
    json_decref(rec);
}

/* Answers snapshot id after its creation: the record, or CREATING while pending. */
static void answer_snapshot(gw_call *call, const char *id, json_t *fallback, bool pending) {
    pv_status st;
    json_t *rec = NULL;
    int rc = pv_storage_get(gw_app_redis(call), keys_of(call), "snap", id, &rec, &st);
    if (rc == PV_NOT_FOUND && pending && fallback) {
        rec = json_pack("{s:s, s:O, s:O, s:i}", "id", id, "name", json_object_get(fallback, "name"),
                        "volume_id", json_object_get(fallback, "volume_id"), "status",
                        PV_SNAP_CREATING);
        rc = rec ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    }
    if (rc == PV_OK)
        send_snapshot(call, rec, true);
    else
        finish_status(call, &st);
    json_decref(rec);
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
    if (rc != PV_OK) {
        finish_status(call, &st);
    } else if (strstr(kind, "_delete")) {
        reply_empty(call);
    } else if (strcmp(kind, PV_KIND_POOL_CREATE) == 0) {
        answer_pool(call, pv_json_str(params, "name"), params, pending);
    } else if (strcmp(kind, PV_KIND_SNAPSHOT_CREATE) == 0) {
        answer_snapshot(call, pv_json_str(params, "id"), params, pending);
    } else { /* volume_create, volume_clone, volume_resize: params.id is the volume */
        if (!json_object_get(params, "status"))
            json_object_set_new(params, "status", json_integer(PV_VOL_CREATING));
        answer_volume(call, pv_json_str(params, "id"), params, pending);
    }
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
    json_t *pool = NULL, *labels = map_json((void *const *)req->labels, req->n_labels);
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
    json_t *params = NULL;
    if (rc == PV_OK) {
        node_of_pool(pool, node, sizeof node);
        params = json_pack("{s:s, s:s, s:s, s:I, s:i, s:O}", "id", id, "name", req->name, "pool",
                           req->pool, "size", (json_int_t)req->size_bytes, "format",
                           (int)req->format, "labels", labels);
        rc = run_op(call, PV_KIND_VOLUME_CREATE, node, id, NULL, 0, params, true, &pending, NULL,
                    &st);
    }
    if (rc == PV_OK) {
        json_object_set_new(params, "status", json_integer(PV_VOL_CREATING));
        answer_volume(call, id, params, pending);
    } else {
        finish_status(call, &st);
    }
    json_decref(params);
    json_decref(pool);
    json_decref(labels);
}

/* Get by id: the record of kind named by id, answered by send. */
static void answer_ref(gw_call *call, const char *kind, const char *id,
                       int (*send)(gw_call *, json_t *, bool)) {
    pv_status st;
    json_t *rec = NULL;
    if (get_ref(call, kind, "id", id, &rec, &st) == PV_OK)
        send(call, rec, true);
    else
        finish_status(call, &st);
    json_decref(rec);
}

static void on_get_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetVolumeRequest *req = (const void *)msg;
    answer_ref(call, "vol", req->id, send_volume);
}

static void on_list_volumes(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ListVolumesRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    json_t *want = map_json((void *const *)req->labels, req->n_labels), *pools = NULL;
    int rc = PV_OK;
    if (req->pool && *req->pool) {
        json_t *p = NULL;
        rc = get_pool(call, "pool", req->pool, &p, &st);
        pools = json_array();
        if (rc == PV_OK) json_array_append_new(pools, p);
    } else {
        rc = pv_storage_list(r, keys_of(call), "pool", NULL, &pools, &st);
    }
    size_t i;
    json_t *p;
    json_array_foreach(pools, i, p) {
        if (rc != PV_OK) break;
        json_t *vols = NULL;
        rc = pv_storage_list(r, keys_of(call), "vol", pv_json_str(p, "name"), &vols, &st);
        size_t j;
        json_t *v;
        json_array_foreach(vols, j, v) {
            if (rc != PV_OK) break;
            if (!labels_match(json_object_get(v, "labels"), want)) continue;
            if (send_volume(call, v, false) != 0) rc = PV_CANCELLED;
        }
        json_decref(vols);
    }
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        finish_status(call, &st);
    json_decref(pools);
    json_decref(want);
}

/* The volume ref names and its pool's node. */
static int volume_and_node(gw_call *call, const char *field, const char *ref, json_t **vol,
                           char *node, size_t cap, pv_status *st) {
    pv_redis *r = gw_app_redis(call);
    if (get_ref(call, "vol", field, ref, vol, st) != PV_OK) return st->code;
    json_t *pool = NULL;
    if (pv_storage_get(r, keys_of(call), "pool", pv_json_str(*vol, "pool"), &pool, st) != PV_OK) {
        json_decref(*vol);
        *vol = NULL;
        return st->code;
    }
    node_of_pool(pool, node, cap);
    json_decref(pool);
    return PV_OK;
}

/* Deletes record rec (its "id") of volume vol on node with the operation kind, waited for, and
 * answers Empty; or, rc not PV_OK, the failure st so far. */
static void answer_delete(gw_call *call, int rc, pv_status *st, const char *kind, const char *node,
                          json_t *vol, json_t *rec) {
    bool pending = false;
    if (rc == PV_OK) {
        json_t *params = json_pack("{s:s}", "id", pv_json_str(rec, "id"));
        rc = run_op(call, kind, node, pv_json_str(vol, "id"), NULL, 0, params, true, &pending, NULL,
                    st);
        json_decref(params);
    }
    if (rc == PV_OK)
        reply_empty(call);
    else
        finish_status(call, st);
}

static void on_delete_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__DeleteVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_DELETE)) return;
    pv_status st;
    json_t *vol = NULL;
    char node[256];
    int rc = volume_and_node(call, "id", req->id, &vol, node, sizeof node, &st);
    if (rc == PV_OK && pv_json_int(vol, "status") == PV_VOL_IN_USE)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION, "volume %s is in use by a running workload",
                           pv_json_str(vol, "name"));
    answer_delete(call, rc, &st, PV_KIND_VOLUME_DELETE, node, vol, vol);
    json_decref(vol);
}

static void on_resize_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ResizeVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_RESIZE)) return;
    pv_status st;
    json_t *vol = NULL;
    char node[256];
    int rc = volume_and_node(call, "id", req->id, &vol, node, sizeof node, &st);
    if (rc == PV_OK && req->new_size_bytes < pv_json_int(vol, "size"))
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "new_size_bytes: %lld is smaller than the volume's %lld: volumes only "
                           "grow",
                           (long long)req->new_size_bytes, (long long)pv_json_int(vol, "size"));
    if (rc == PV_OK && pv_json_int(vol, "status") == PV_VOL_IN_USE)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION, "volume %s is in use by a running workload",
                           pv_json_str(vol, "name"));
    bool pending = false;
    if (rc == PV_OK) {
        json_t *params = json_pack("{s:s, s:I}", "id", pv_json_str(vol, "id"), "size",
                                   (json_int_t)req->new_size_bytes);
        rc = run_op(call, PV_KIND_VOLUME_RESIZE, node, pv_json_str(vol, "id"), NULL, 0, params,
                    true, &pending, NULL, &st);
        json_decref(params);
    }
    if (rc == PV_OK)
        answer_volume(call, pv_json_str(vol, "id"), NULL, false);
    else
        finish_status(call, &st);
    json_decref(vol);
}

static void on_clone_volume(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CloneVolumeRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_VOLUME_CLONE)) return;
    pv_status st;
    json_t *src = NULL, *pool = NULL, *params = NULL;
    char src_node[256], node[256], id[PV_ID_MAX];
    int rc =
        volume_and_node(call, "source_id", req->source_id, &src, src_node, sizeof src_node, &st);
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    const char *pool_name = req->pool && *req->pool ? req->pool : pv_json_str(src, "pool");
    if (rc == PV_OK) {
        rc = get_pool(call, "pool", pool_name, &pool, &st);
        if (rc == PV_NOT_FOUND) pv_status_prefix(&st, "pool");
    }
    if (rc == PV_OK) {
        node_of_pool(pool, node, sizeof node);
        if (strcmp(node, src_node) != 0)
            rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                               "pool: %s is on node %s, the source on %s: clones stay on the "
                               "source's host",
                               pool_name, node, src_node);
    }
    pv_id_new("vol", id, sizeof id);
    bool pending = false;
    if (rc == PV_OK) {
        params = json_pack("{s:s, s:s, s:s, s:s}", "source_id", pv_json_str(src, "id"), "id", id,
                           "name", req->name, "pool", pool_name);
        const char *holds[] = {pv_json_str(src, "id")};
        rc = run_op(call, PV_KIND_VOLUME_CLONE, node, id, holds, 1, params, true, &pending, NULL,
                    &st);
    }
    if (rc == PV_OK) {
        json_object_set_new(params, "status", json_integer(PV_VOL_CREATING));
        json_object_set(params, "size", json_object_get(src, "size"));
        json_object_set(params, "format", json_object_get(src, "format"));
        answer_volume(call, id, params, pending);
    } else {
        finish_status(call, &st);
    }
    json_decref(params);
    json_decref(src);
    json_decref(pool);
}

/* ---- snapshots ---- */

static void on_create_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__CreateSnapshotRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_SNAPSHOT_CREATE)) return;
    pv_status st;
    json_t *vol = NULL;
    char node[256], id[PV_ID_MAX];
    int rc = volume_and_node(call, "volume_id", req->volume_id, &vol, node, sizeof node, &st);
    if (rc == PV_OK) rc = pv_storage_check_name("name", req->name, &st);
    json_t *pool = NULL;
    if (rc == PV_OK)
        rc = pv_storage_get(gw_app_redis(call), keys_of(call), "pool", pv_json_str(vol, "pool"),
                            &pool, &st);
    /* LVM and RBD pools snapshot with their own commands; elsewhere only qcow2 can */
    if (rc == PV_OK && pv_storage_snapshot_method((int)pv_json_int(pool, "type"),
                                                  (int)pv_json_int(vol, "format")) == PV_SNAPS_NONE)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                           "volume_id: volume %s is not qcow2: snapshots are qcow2 internal "
                           "snapshots, or LVM and RBD snapshots in those pools",
                           pv_json_str(vol, "name"));
    json_decref(pool);
    pv_id_new("snap", id, sizeof id);
    bool pending = false;
    if (rc == PV_OK) {
        json_t *params = json_pack("{s:s, s:s, s:s}", "id", id, "volume_id", pv_json_str(vol, "id"),
                                   "name", req->name);
        /* snapshots of one volume go one at a time: the volume is the operation's target */
        rc = run_op(call, PV_KIND_SNAPSHOT_CREATE, node, pv_json_str(vol, "id"), NULL, 0, params,
                    true, &pending, NULL, &st);
        json_decref(params);
    }
    if (rc == PV_OK) {
        json_t *asked =
            json_pack("{s:s, s:s}", "name", req->name, "volume_id", pv_json_str(vol, "id"));
        answer_snapshot(call, id, asked, pending);
        json_decref(asked);
    } else {
        finish_status(call, &st);
    }
    json_decref(vol);
}

static void on_get_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__GetSnapshotRequest *req = (const void *)msg;
    answer_ref(call, "snap", req->id, send_snapshot);
}

/* Parents before children: each snapshot after the one it branches from (creation order breaks
 * ties, and is the order of the records). */
static void on_list_snapshots(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__ListSnapshotsRequest *req = (const void *)msg;
    pv_status st;
    json_t *vol = NULL, *all = NULL;
    int rc = get_ref(call, "vol", "volume_id", req->volume_id, &vol, &st);
    if (rc == PV_OK)
        rc = pv_storage_list(gw_app_redis(call), keys_of(call), "snap", pv_json_str(vol, "id"),
                             &all, &st);
    size_t n = json_array_size(all), sent = 0;
    bool *done = calloc(n ? n : 1, sizeof *done);
    json_t *emitted = json_object();
    /* repeated passes: a snapshot goes once its parent went (or its parent is gone) */
    while (rc == PV_OK && done && sent < n) {
        size_t before = sent;
        for (size_t i = 0; rc == PV_OK && i < n; i++) {
            json_t *s = json_array_get(all, i);
            const char *parent = pv_json_str(s, "parent");
            bool parent_known = false;
            for (size_t j = 0; j < n && *parent; j++)
                parent_known |= strcmp(pv_json_str(json_array_get(all, j), "id"), parent) == 0;
            if (done[i] || (*parent && parent_known && !json_object_get(emitted, parent))) continue;
            if (send_snapshot(call, s, false) != 0) rc = PV_CANCELLED;
            done[i] = true;
            json_object_set_new(emitted, pv_json_str(s, "id"), json_true());
            sent++;
        }
        if (sent == before) break; /* a cycle cannot happen; stop rather than spin */
    }
    free(done);
    json_decref(emitted);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        finish_status(call, &st);
    json_decref(all);
    json_decref(vol);
}

static void on_restore_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__RestoreSnapshotRequest *req = (const void *)msg;
    pv_status st;
    json_t *snap = NULL, *vol = NULL;
    char node[256];
    int rc = get_ref(call, "snap", "snapshot_id", req->snapshot_id, &snap, &st);
    if (rc == PV_OK)
        rc = volume_and_node(call, "volume_id", pv_json_str(snap, "volume_id"), &vol, node,
                             sizeof node, &st);
    /* A volume in use may be restored while its VM is shut off: only the node's agent can tell
     * (it asks libvirt whether a running domain holds the image, and refuses naming it) */
    pv_op op = {0};
    bool pending = false;
    if (rc == PV_OK) {
        json_t *params = json_pack("{s:s}", "snapshot_id", pv_json_str(snap, "id"));
        rc = run_op(call, PV_KIND_SNAPSHOT_RESTORE, node, pv_json_str(vol, "id"), NULL, 0, params,
                    false, &pending, &op, &st);
        json_decref(params);
    }
    if (rc == PV_OK)
        op_convert_reply(call, &op);
    else
        finish_status(call, &st);
    pv_op_clear(&op);
    json_decref(snap);
    json_decref(vol);
}

static void on_delete_snapshot(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Storage__V1__DeleteSnapshotRequest *req = (const void *)msg;
    if (answer_retry(call, PV_KIND_SNAPSHOT_DELETE)) return;
    pv_status st;
    json_t *snap = NULL, *vol = NULL;
    char node[256];
    int rc = get_ref(call, "snap", "id", req->id, &snap, &st);
    if (rc == PV_OK)
        rc = volume_and_node(call, "volume_id", pv_json_str(snap, "volume_id"), &vol, node,
                             sizeof node, &st);
    answer_delete(call, rc, &st, PV_KIND_SNAPSHOT_DELETE, node, vol, snap);
    json_decref(snap);
    json_decref(vol);
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
