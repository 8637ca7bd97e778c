/*
 * svc_core_deploy: deploy and workload lifecycle (see svc_core_deploy.h). The handlers decode
 * and check the request and hand the per-node work to svc_relay.
 */
#include "svc_core_deploy.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_deploy.h"
#include "pv_id.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_op.h"
#include "pv_resv.h"
#include "pv_workload.h"
#include "svc_eru.h"
#include "svc_nodeop.h"
#include "svc_relay.h"

#define N_METHODS 6

struct svc_core_deploy {
    gw_app *app;
    gw_method methods[N_METHODS];
};

svc_core_deploy *svc_core_deploy_new(gw_app *app) {
    svc_core_deploy *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_deploy_free(svc_core_deploy *s) {
    free(s);
}

/* Follows Eru's calcium.doCreateWorkloads: once the options are valid, a deploy that fails
 * before any node is asked (no plan fits, no node, ...) is the stream's one message, success
 * false and the error (no other field), and the call ends OK. */
static void on_create_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__DeployOptions *o = (const Pb__DeployOptions *)req;
    pv_status st;
    if (pv_deploy_check_ha(o, &st) != PV_OK) { /* pivirt's own label: the standard code */
        gw_call_finish(call, PV_INVALID_ARGUMENT, st.msg);
        return;
    }
    if (pv_deploy_check(o, &st) != PV_OK) {
        gw_call_finishf(call, ERU_CREATE_WORKLOAD, "%s", st.msg);
        return;
    }
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, o->podname);
    int rc = svc_relay_submit_deploy(call, o, &rl, &st);
    if (rc == PV_OK) rc = svc_relay_run(&rl, &st);
    if (rc == PV_FAILED_PRECONDITION && rl.n == 0) { /* svc_relay_run: failed before any node */
        Pb__CreateWorkloadMessage m = PB__CREATE_WORKLOAD_MESSAGE__INIT;
        m.error = st.msg;
        rl.sent = rl.failed = 1;
        rc = gw_call_send(call, &m.base) == 0 ? PV_OK : PV_CANCELLED;
    }
    if (rc == PV_OK) {
        pv_info("CreateWorkload operation=%s: %zu instance(s) answered, %zu failed", rl.parent,
                rl.sent, rl.failed);
        gw_call_finish(call, PV_OK, NULL);
    } else if (rc != PV_CANCELLED) {
        gw_call_finishf(call, ERU_CREATE_WORKLOAD, "%s", st.msg);
    }
    svc_relay_free(&rl);
}

/* RemoveWorkload and ControlWorkload: the ids grouped by node, one operation of kind per node,
 * one answer per id. type NULL: a removal, which an unknown id fails first; a control answers
 * it in the stream, {id, error}, and goes on with the others. */
static void ids_on_nodes(gw_call *call, char **ids, size_t n_ids, const char *kind,
                         const char *type, bool force, int eru, const char *what) {
    if (n_ids == 0) {
        gw_call_finish(call, eru, "IDs: no workload ids given");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, NULL);
    json_t *by_node = NULL, *unknown = type ? json_array() : NULL;
    pv_status st;
    int rc = type && !unknown ? pv_status_set(&st, PV_INTERNAL, "out of memory")
                              : svc_relay_group_by_node(&rl, ids, n_ids, &by_node, unknown, &st);
    size_t i;
    json_t *u;
    json_array_foreach(unknown, i, u) {
        Pb__ControlWorkloadMessage m = PB__CONTROL_WORKLOAD_MESSAGE__INIT;
        m.id = (char *)json_string_value(json_array_get(u, 0));
        m.error = (char *)json_string_value(json_array_get(u, 1));
        rl.sent++;
        rl.failed++;
        if (rc == PV_OK && gw_call_send(call, &m.base) != 0)
            rc = pv_status_set(&st, PV_CANCELLED, "client gone");
    }
    json_decref(unknown);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        rc = svc_relay_submit_node_op(call, &rl, kind, node, node_ids, type, force, &st);
    }
    json_decref(by_node);
    svc_relay_finish(call, &rl, rc, &st, eru, what);
}

/* Follows Eru's calcium.ControlWorkload: each id is looked up on its own (withWorkloadLocked). */
static void on_control_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ControlWorkloadOptions *o = (const Pb__ControlWorkloadOptions *)req;
    static const char *const types[] = {"start", "stop", "restart", "suspend", "resume"};
    bool known = false;
    for (size_t i = 0; o->type && i < sizeof types / sizeof types[0]; i++)
        known = known || strcmp(o->type, types[i]) == 0;
    if (!known) {
        gw_call_finishf(call, ERU_CONTROL_WORKLOAD,
                        "type: \"%s\" is not start, stop, restart, suspend or resume",
                        o->type ? o->type : "");
        return;
    }
    ids_on_nodes(call, o->ids, o->n_ids, PV_KIND_CONTROL_NODE, o->type, o->force,
                 ERU_CONTROL_WORKLOAD, "ControlWorkload");
}

/* Follows Eru's calcium.RemoveWorkload: every id is looked up first (groupWorkloadsByNode). */
static void on_remove_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__RemoveWorkloadOptions *o = (const Pb__RemoveWorkloadOptions *)req;
    ids_on_nodes(call, o->ids, o->n_ids, PV_KIND_REMOVE_NODE, NULL, o->force, ERU_REMOVE_WORKLOAD,
                 "RemoveWorkload");
}

/* The deltas that take allocation `to` back to `from` (numbers: realloc's own documents). */
static char *inverse_delta(const char *from, const char *to) {
    static const char *const cpumem[][2] = {{"cpu-request", "cpu_request"},
                                            {"cpu-limit", "cpu_limit"},
                                            {"memory-request", "memory_request"},
                                            {"memory-limit", "memory_limit"}};
    json_t *a = json_loads(from, 0, NULL), *b = json_loads(to, 0, NULL);
    json_t *d = json_pack("{s:{}, s:{}}", "cpumem", "storage");
    for (size_t i = 0; d && i < 4; i++) {
        double x = json_number_value(json_object_get(json_object_get(a, "cpumem"), cpumem[i][1]));
        double y = json_number_value(json_object_get(json_object_get(b, "cpumem"), cpumem[i][1]));
        json_object_set_new(json_object_get(d, "cpumem"), cpumem[i][0], json_real(x - y));
    }
    static const char *const storage[][2] = {{"storage-request", "storage_request"},
                                             {"storage-limit", "storage_limit"}};
    for (size_t i = 0; d && i < 2; i++) {
        double x = json_number_value(json_object_get(json_object_get(a, "storage"), storage[i][1]));
        double y = json_number_value(json_object_get(json_object_get(b, "storage"), storage[i][1]));
        json_object_set_new(json_object_get(d, "storage"), storage[i][0], json_real(x - y));
    }
    char *text = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(a);
    json_decref(b);
    json_decref(d);
    return text;
}

/* Whether the registry still places the incarnation of w where w was read. */
static bool same_incarnation(pv_redis *r, const pv_keys *k, const pv_workload *w) {
    pv_workload now = {0};
    pv_status st;
    bool same = pv_workload_get(r, k, w->id, &now, &st) == PV_OK && now.epoch == w->epoch &&
                now.node && w->node && strcmp(now.node, w->node) == 0;
    pv_workload_clear(&now);
    return same;
}

/* ReallocResource in place: the accounting first (it is the capacity check), then the engine's
 * limits on the node; when the node cannot apply them, the accounting is put back. */
static void on_realloc_resource(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ReallocOptions *o = (const Pb__ReallocOptions *)req;
    gw_app *app = ((gw_app *)gw_call_app(call));
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *delta = NULL, *fresh = NULL;
    pv_workload w = {0};
    int rc = pv_workload_get(r, &app->keys, o->id, &w, &st);
    if (rc == PV_OK)
        rc = svc_eru_resources_json("resources", (void *const *)o->resources, o->n_resources,
                                    &delta, &st);
    if (rc == PV_OK) rc = pv_resv_realloc_workload(r, &app->keys, w.id, delta, &fresh, &st);
    if (rc == PV_OK) {
        json_t *j = json_loads(fresh, 0, NULL), *cm = json_object_get(j, "cpumem");
        json_t *params =
            json_pack("{s:s, s:f, s:I}", "id", w.id, "cpu_limit",
                      json_number_value(json_object_get(cm, "cpu_limit")), "memory_limit",
                      json_integer_value(json_object_get(cm, "memory_limit")));
        char op_id[PV_ID_MAX];
        pv_op rec = {0};
        pv_status nst;
        int nrc = svc_nodeop_submit(call, w.node, PV_KIND_REALLOC_NODE, params, 1, op_id, &nst);
        if (nrc == PV_OK) nrc = svc_nodeop_wait(call, r, &app->keys, op_id, &rec, &nst);
        if (nrc == PV_OK && rec.status != PV_OP_SUCCEEDED)
            nrc = pv_status_set(
                &nst, rec.error_code > 0 && rec.error_code <= 16 ? rec.error_code : PV_INTERNAL,
                "%s", rec.error_message ? rec.error_message : "failed");
        if (nrc != PV_OK && !same_incarnation(r, &app->keys, &w)) {
            /* a failover recreated it meanwhile (its node was lost while the call waited): the
             * new incarnation holds the resources its deploy reserved, not these */
            pv_warn("ReallocResource %s: not put back: the workload was recreated elsewhere", w.id);
        } else if (nrc != PV_OK) {
            char *back = inverse_delta(w.resources, fresh);
            pv_status bst;
            if (!back || pv_resv_realloc_workload(r, &app->keys, w.id, back, NULL, &bst) != PV_OK)
                pv_warn("ReallocResource %s: putting the accounting back failed: %s", w.id,
                        back ? bst.msg : "out of memory");
            free(back);
        }
        if (nrc != PV_OK) {
            rc = nrc;
            st = nst;
        }
        pv_op_clear(&rec);
        json_decref(params);
        json_decref(j);
    }
    if (rc == PV_OK) {
        pv_info("ReallocResource id=%s: %s", w.id, fresh);
        Pb__ReallocResourceMessage m = PB__REALLOC_RESOURCE_MESSAGE__INIT;
        m.error = "";
        gw_call_reply(call, &m.base);
    } else if (rc != PV_CANCELLED) {
        gw_call_finishf(call, ERU_REALLOC_RESOURCE, "%s", st.msg);
    }
    free(delta);
    free(fresh);
    pv_workload_clear(&w);
}

/* ReplaceWorkload: each old workload (the IDs, or every one of the app's entrypoint in the pod
 * carrying filter_labels) is replaced on its node by a new one from deployOpt that keeps its
 * resources; the old one runs on when the new one fails. */
static void on_replace_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ReplaceOptions *o = (const Pb__ReplaceOptions *)req;
    Pb__DeployOptions *d = o->deployopt;
    pv_status st;
    if (!d) {
        gw_call_finish(call, ERU_REPLACE_WORKLOAD, "deployOpt: required");
        return;
    }
    int32_t count = d->count;
    d->count = 1; /* each replacement is one instance; Eru's count does not apply */
    int rc = pv_deploy_check(d, &st);
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, d->podname);
    char **ids = NULL, *labels = NULL;
    size_t n = 0;
    pv_workload *found = NULL;
    if (rc == PV_OK && o->n_ids > 0) {
        ids = o->ids;
        n = o->n_ids;
    } else if (rc == PV_OK) {
        rc = svc_eru_labels_json("filter_labels", (void *const *)o->filter_labels,
                                 o->n_filter_labels, &labels, &st);
        if (rc == PV_OK)
            rc = pv_workload_list(r, rl.k, d->name, d->entrypoint->name, "", labels, &found, &n,
                                  &st);
        ids = n ? calloc(n, sizeof *ids) : NULL;
        for (size_t i = 0; ids && i < n; i++)
            ids[i] = found[i].id;
    }
    json_t *copy = json_object();
    for (size_t i = 0; copy && i < o->n_copy; i++)
        json_object_set_new(copy, o->copy[i]->key, json_string(o->copy[i]->value));
    char *b64 = NULL;
    if (rc == PV_OK) {
        size_t len = pb__deploy_options__get_packed_size(d);
        uint8_t *bytes = malloc(len ? len : 1);
        if (!bytes) rc = pv_status_set(&st, PV_INTERNAL, "out of memory");
        if (bytes) {
            pb__deploy_options__pack(d, bytes);
            rc = pv_b64_encode(bytes, len, &b64, &st);
            free(bytes);
        }
    }
    d->count = count;
    json_t *by_node = NULL;
    if (rc == PV_OK) rc = svc_relay_group_by_node(&rl, ids, n, &by_node, NULL, &st);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        json_t *params = json_pack("{s:s, s:s, s:O, s:O}", "deploy", b64, "pod", d->podname, "ids",
                                   node_ids, "copy", copy);
        rc = params ? svc_relay_submit_child(call, &rl, PV_KIND_REPLACE_NODE, node, params,
                                             node_ids, SVC_RELAY_REPLACE, &st)
                    : pv_status_set(&st, PV_INTERNAL, "out of memory");
        json_decref(params);
    }
    json_decref(by_node);
    json_decref(copy);
    free(b64);
    free(labels);
    if (ids != o->ids) free(ids);
    pv_workload_array_free(found, found ? n : 0);
    svc_relay_finish(call, &rl, rc, &st, ERU_REPLACE_WORKLOAD, "ReplaceWorkload");
}

/* Whether every id names a workload; else st names the first that does not. */
static bool all_known(pv_redis *r, const pv_keys *k, char **ids, size_t n, pv_status *st) {
    if (n == 0) {
        pv_status_set(st, PV_INVALID_ARGUMENT, "IDs: no workload ids given");
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        pv_workload w;
        if (pv_workload_get(r, k, ids[i], &w, st) != PV_OK) return false;
        pv_workload_clear(&w);
    }
    return true;
}

/* DissociateWorkload: the control plane forgets the workload and takes its resources back; the
 * engine's workload is left as it is (Eru's meaning), so no node is asked anything.
 * Follows Eru's calcium.DissociateWorkload: every id is looked up first (groupWorkloadsByNode),
 * so one that names no workload fails the call (1077) before any is let go; what goes wrong
 * for one of them afterwards is its message's error. */
static void on_dissociate_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__DissociateWorkloadOptions *o = (const Pb__DissociateWorkloadOptions *)req;
    pv_redis *r = gw_app_redis(call);
    const pv_keys *k = &((gw_app *)gw_call_app(call))->keys;
    pv_status kst;
    if (!all_known(r, k, o->ids, o->n_ids, &kst)) {
        gw_call_finishf(call, ERU_DISSOCIATE_WORKLOAD, "%s", kst.msg);
        return;
    }
    for (size_t i = 0; i < o->n_ids; i++) {
        pv_status st;
        Pb__DissociateWorkloadMessage m = PB__DISSOCIATE_WORKLOAD_MESSAGE__INIT;
        m.id = o->ids[i];
        m.error = pv_resv_return_workload(r, k, o->ids[i], &st) == PV_OK ? "" : st.msg;
        if (*m.error == '\0') {
            pv_info("DissociateWorkload id=%s", o->ids[i]);
            /* marked so the audit (pivirt-check) knows the engine's workload without a record
             * was let go on purpose; best effort: unmarked, the audit reports an orphan */
            if (pv_workload_mark_dissociated(r, k, o->ids[i], &st) != PV_OK)
                pv_warn("DissociateWorkload id=%s: not marked dissociated: %s", o->ids[i], st.msg);
        }
        if (gw_call_send(call, &m.base) != 0) return; /* the client has gone */
    }
    gw_call_finish(call, PV_OK, NULL);
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/CreateWorkload", GW_SERVER_STREAM, &pb__deploy_options__descriptor,
     on_create_workload, ERU_CREATE_WORKLOAD, true},
    {"/pb.CoreRPC/RemoveWorkload", GW_SERVER_STREAM, &pb__remove_workload_options__descriptor,
     on_remove_workload, ERU_REMOVE_WORKLOAD, true},
    {"/pb.CoreRPC/ControlWorkload", GW_SERVER_STREAM, &pb__control_workload_options__descriptor,
     on_control_workload, ERU_CONTROL_WORKLOAD, true},
    {"/pb.CoreRPC/DissociateWorkload", GW_SERVER_STREAM,
     &pb__dissociate_workload_options__descriptor, on_dissociate_workload, ERU_DISSOCIATE_WORKLOAD,
     true},
    {"/pb.CoreRPC/ReallocResource", GW_UNARY, &pb__realloc_options__descriptor, on_realloc_resource,
     ERU_REALLOC_RESOURCE, true},
    {"/pb.CoreRPC/ReplaceWorkload", GW_SERVER_STREAM, &pb__replace_options__descriptor,
     on_replace_workload, ERU_REPLACE_WORKLOAD, true},
};

int svc_core_deploy_register(svc_core_deploy *s, gw_server *server) {
    if (svc_eru_register(server, k_methods, N_METHODS, s->methods, s) != 0) return -1;
    return 0;
}
