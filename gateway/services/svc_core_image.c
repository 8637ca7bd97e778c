/*
 * svc_core_image: images on the nodes (see svc_core_image.h). The nodes are asked one after the
 * other; each answer is relayed when its node's operation has ended.
 */
#include "svc_core_image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_build.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_upload.h"
#include "pv_workload.h"
#include "svc_eru.h"
#include "svc_nodeop.h"

#define N_METHODS 4

struct svc_core_image {
    gw_app *app;
    gw_method methods[N_METHODS];
};

svc_core_image *svc_core_image_new(gw_app *app) {
    svc_core_image *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_image_free(svc_core_image *s) {
    free(s);
}

static gw_app *app_of(gw_call *call) {
    return ((svc_core_image *)gw_call_method_data(call))->app;
}

static bool named(char **names, size_t n, const char *name) {
    if (n == 0) return true;
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0) return true;
    return false;
}

/* Per node the call answers for: sends what answer() makes of its operation's output. */
typedef int (*answer_fn)(gw_call *call, const char *node, const pv_op_output *out, size_t n,
                         const char *error, void *arg);

static int per_node(gw_call *call, const char *pod, char **nodenames, size_t n_names,
                    const char *kind, json_t *params, answer_fn answer, void *arg, pv_status *st) {
    pv_redis *r = gw_app_redis(call);
    gw_app *app = app_of(call);
    pv_node *nodes = NULL;
    size_t n = 0;
    if (pv_registry_list_nodes(r, &app->keys, pod, &nodes, &n, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (!named(nodenames, n_names, nodes[i].name)) continue;
        if (!nodes[i].alive) {
            rc = answer(call, nodes[i].name, NULL, 0, "node agent is not alive", arg);
            continue;
        }
        char op_id[PV_ID_MAX];
        pv_op rec = {0};
        pv_status ost;
        if (svc_nodeop_submit(call, nodes[i].name, kind, params, 1, op_id, &ost) != PV_OK ||
            svc_nodeop_wait(call, r, &app->keys, op_id, &rec, &ost) != PV_OK) {
            pv_op_clear(&rec);
            if (ost.code == PV_CANCELLED) {
                rc = PV_CANCELLED; /* the nodes are freed below */
                break;
            }
            rc = answer(call, nodes[i].name, NULL, 0, ost.msg, arg);
            continue;
        }
        pv_op_output *out = NULL;
        size_t got = 0;
        if (pv_op_output_read(r, &app->keys, op_id, "0", 100000, 0, &out, &got, &ost) != PV_OK)
            rc = answer(call, nodes[i].name, NULL, 0, ost.msg, arg);
        else
            rc = answer(call, nodes[i].name, out, got,
                        rec.status == PV_OP_SUCCEEDED ? NULL : rec.error_message, arg);
        pv_op_output_free(out, got);
        pv_op_clear(&rec);
    }
    pv_node_array_free(nodes, n);
    if (rc != PV_OK && rc != PV_CANCELLED) pv_status_set(st, rc, "client gone");
    return rc;
}

static void finish(gw_call *call, int rc, const pv_status *st, int eru) {
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, eru, "%s", st->msg);
}

/* ---- ListImage ---- */

static int answer_list(gw_call *call, const char *node, const pv_op_output *out, size_t n,
                       const char *error, void *arg) {
    (void)arg;
    Pb__ListImageMessage m = PB__LIST_IMAGE_MESSAGE__INIT;
    m.nodename = (char *)node;
    m.err = (char *)(error ? error : "");
    Pb__ImageItem *items = n ? calloc(n, sizeof *items) : NULL;
    Pb__ImageItem **ptrs = n ? calloc(n, sizeof *ptrs) : NULL;
    char **tags = n ? calloc(n, sizeof *tags) : NULL;
    for (size_t i = 0; items && ptrs && tags && i < n; i++) {
        if (strcmp(svc_nodeop_value(&out[i], "type"), "image") != 0) continue;
        Pb__ImageItem *it = &items[m.n_images];
        pb__image_item__init(it);
        it->id = (char *)svc_nodeop_value(&out[i], "id");
        tags[m.n_images] = (char *)svc_nodeop_value(&out[i], "ref");
        it->tags = &tags[m.n_images];
        it->n_tags = 1;
        ptrs[m.n_images++] = it;
    }
    m.images = ptrs;
    int rc = gw_call_send(call, &m.base) == 0 ? PV_OK : PV_CANCELLED;
    free(items);
    free(ptrs);
    free(tags);
    return rc;
}

static void on_list_image(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ListImageOptions *o = (const Pb__ListImageOptions *)req;
    pv_status st;
    json_t *params = json_pack("{s:s}", "filter", o->filter ? o->filter : "");
    int rc = per_node(call, o->podname, o->nodenames, o->n_nodenames, PV_KIND_IMAGE_LIST_NODE,
                      params, answer_list, NULL, &st);
    json_decref(params);
    finish(call, rc, &st, ERU_LIST_IMAGE);
}

/* ---- RemoveImage, CacheImage: one message per image and node ---- */

typedef struct per_image {
    char **images;
    size_t n;
    bool cache;
} per_image;

static int send_image(gw_call *call, const per_image *p, const char *node, const char *image,
                      bool ok, const char *message) {
    if (p->cache) {
        Pb__CacheImageMessage m = PB__CACHE_IMAGE_MESSAGE__INIT;
        m.image = (char *)image;
        m.success = ok;
        m.nodename = (char *)node;
        m.message = (char *)message;
        return gw_call_send(call, &m.base) == 0 ? PV_OK : PV_CANCELLED;
    }
    char *messages[2] = {(char *)node, (char *)message};
    Pb__RemoveImageMessage m = PB__REMOVE_IMAGE_MESSAGE__INIT;
    m.image = (char *)image;
    m.success = ok;
    m.messages = messages;
    m.n_messages = 2;
    return gw_call_send(call, &m.base) == 0 ? PV_OK : PV_CANCELLED;
}

static int answer_images(gw_call *call, const char *node, const pv_op_output *out, size_t n,
                         const char *error, void *arg) {
    const per_image *p = arg;
    int rc = PV_OK;
    if (!out || n == 0) { /* the node's part failed whole: every image with its cause */
        for (size_t i = 0; rc == PV_OK && i < p->n; i++)
            rc = send_image(call, p, node, p->images[i], false, error ? error : "no answer");
        return rc;
    }
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        rc = send_image(call, p, node, svc_nodeop_value(&out[i], "image"),
                        strcmp(svc_nodeop_value(&out[i], "success"), "1") == 0,
                        svc_nodeop_value(&out[i], "message"));
    return rc;
}

static json_t *images_json(char **images, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_string(images[i]));
    return a;
}

static void on_remove_image(gw_call *call, const ProtobufCMessage *req) {
    const Pb__RemoveImageOptions *o = (const Pb__RemoveImageOptions *)req;
    pv_status st;
    if (o->n_images == 0) {
        gw_call_finish(call, ERU_REMOVE_IMAGE, "images: none given");
        return;
    }
    per_image p = {o->images, o->n_images, false};
    json_t *params =
        json_pack("{s:o, s:b}", "images", images_json(o->images, o->n_images), "prune", o->prune);
    int rc = per_node(call, o->podname, o->nodenames, o->n_nodenames, PV_KIND_IMAGE_REMOVE_NODE,
                      params, answer_images, &p, &st);
    json_decref(params);
    finish(call, rc, &st, ERU_REMOVE_IMAGE);
}

static void on_cache_image(gw_call *call, const ProtobufCMessage *req) {
    const Pb__CacheImageOptions *o = (const Pb__CacheImageOptions *)req;
    pv_status st;
    if (o->n_images == 0) {
        gw_call_finish(call, ERU_CACHE_IMAGE, "images: none given");
        return;
    }
    per_image p = {o->images, o->n_images, true};
    json_t *params = json_pack("{s:o}", "images", images_json(o->images, o->n_images));
    int rc = per_node(call, o->podname, o->nodenames, o->n_nodenames, PV_KIND_IMAGE_CACHE_NODE,
                      params, answer_images, &p, &st);
    json_decref(params);
    finish(call, rc, &st, ERU_CACHE_IMAGE);
}

/* ---- BuildImage ---- */

/* The build pod's most idle live node: the one with the fewest workloads. */
static int idle_node(pv_redis *r, const pv_keys *k, const char *pod, char **node, pv_status *st) {
    pv_node *nodes = NULL;
    size_t n = 0;
    *node = NULL;
    if (pv_registry_list_nodes(r, k, pod, &nodes, &n, st) != PV_OK) return st->code;
    const pv_node *best = NULL;
    for (size_t i = 0; i < n; i++)
        if (nodes[i].alive && (!best || nodes[i].workloads < best->workloads)) best = &nodes[i];
    int rc = best ? PV_OK
                  : pv_status_set(st, PV_FAILED_PRECONDITION,
                                  "build pod %s has no live node to build on", pod);
    if (best && !(*node = strdup(best->name))) rc = pv_status_set(st, PV_INTERNAL, "oom");
    pv_node_array_free(nodes, n);
    return rc;
}

static void on_build_image(gw_call *call, const ProtobufCMessage *req) {
    const Pb__BuildImageOptions *o = (const Pb__BuildImageOptions *)req;
    gw_app *app = app_of(call);
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    if (!o->name || !*o->name) {
        gw_call_finish(call, ERU_BUILD_IMAGE, "name: image name is empty");
        return;
    }
    json_t *scm = NULL;
    if (o->build_method == PB__BUILD_IMAGE_OPTIONS__BUILD_METHOD__SCM) {
        if (!app->cfg.git.scm_type || !*app->cfg.git.scm_type) {
            gw_call_finish(call, ERU_BUILD_IMAGE,
                           "build_method SCM: no SCM is configured on this control plane (set "
                           "git.scm_type); build from a tar (RAW) or a workload (EXIST)");
            return;
        }
        if (pv_build_scm_params(o->builds, &scm, &st) != PV_OK) {
            gw_call_finishf(call, ERU_BUILD_IMAGE, "%s", st.msg);
            return;
        }
    }
    json_t *refs = json_array();
    for (size_t i = 0; i < o->n_tags; i++) {
        char *ref = NULL;
        if (asprintf(&ref, "%s:%s", o->name, o->tags[i]) >= 0)
            json_array_append_new(refs, json_string(ref));
        free(ref);
    }
    if (o->n_tags == 0) {
        char *ref = NULL;
        if (asprintf(&ref, "%s:latest", o->name) >= 0)
            json_array_append_new(refs, json_string(ref));
        free(ref);
    }
    json_t *params = json_pack("{s:O}", "refs", refs);
    char upload[PV_ID_MAX] = "";
    char *node = NULL;
    int rc = PV_OK;
    if (scm) {
        json_object_set_new(params, "builds", scm);
        rc = idle_node(r, &app->keys, app->cfg.worker.build_pod, &node, &st);
    } else if (o->build_method == PB__BUILD_IMAGE_OPTIONS__BUILD_METHOD__RAW) {
        /* the tar goes to the node in an upload of its own, not base64 in the params */
        if (o->tar.len == 0)
            rc = pv_status_set(&st, PV_INVALID_ARGUMENT, "tar: empty for build_method RAW");
        if (rc == PV_OK) rc = idle_node(r, &app->keys, app->cfg.worker.build_pod, &node, &st);
        if (rc == PV_OK) rc = pv_upload_put(r, &app->keys, o->tar.data, o->tar.len, upload, &st);
        if (rc == PV_OK) json_object_set_new(params, "upload", json_string(upload));
    } else {
        pv_workload w;
        rc = o->exist_id && *o->exist_id
                 ? pv_workload_get(r, &app->keys, o->exist_id, &w, &st)
                 : pv_status_set(&st, PV_INVALID_ARGUMENT, "exist_id: required for EXIST");
        if (rc == PV_OK) {
            node = strdup(w.node);
            json_object_set_new(params, "exist_id", json_string(w.id));
            pv_workload_clear(&w);
        }
    }
    char op_id[PV_ID_MAX];
    pv_op rec = {0};
    bool submitted = false;
    if (rc == PV_OK)
        submitted = (rc = svc_nodeop_submit(call, node, PV_KIND_IMAGE_BUILD_NODE, params, 1, op_id,
                                            &st)) == PV_OK;
    if (rc == PV_OK) rc = svc_nodeop_wait(call, r, &app->keys, op_id, &rec, &st);
    /* taken (the operation is done: PV_OK) or never to be; an operation still running at the
     * call's end (a deadline, the client gone) may yet need it: its TTL takes it away */
    if (*upload && (!submitted || rc == PV_OK)) pv_upload_drop(r, &app->keys, upload);
    /* the build's log lines (SCM builds), then one message per image reference; a failed
     * build's log comes before its error */
    bool failed = rc == PV_OK && rec.status != PV_OP_SUCCEEDED;
    pv_op_output *out = NULL;
    size_t n = 0;
    if (rc == PV_OK) rc = pv_op_output_read(r, &app->keys, op_id, "0", 5000, 0, &out, &n, &st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        Pb__BuildImageMessage m = PB__BUILD_IMAGE_MESSAGE__INIT;
        bool log = strcmp(svc_nodeop_value(&out[i], "type"), "log") == 0;
        if (failed && !log) continue;
        m.id = log ? "" : (char *)svc_nodeop_value(&out[i], "id");
        m.status = log ? "building" : "finished";
        m.progress = log ? "" : (char *)svc_nodeop_value(&out[i], "ref");
        m.stream = (char *)svc_nodeop_value(&out[i], "stream");
        if (gw_call_send(call, &m.base) != 0) rc = PV_CANCELLED;
    }
    pv_op_output_free(out, n);
    if (rc == PV_OK && failed)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION, "%s",
                           rec.error_message ? rec.error_message : "build failed");
    pv_op_clear(&rec);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_BUILD_IMAGE, "%s", st.msg);
    free(node);
    json_decref(params);
    json_decref(refs);
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/ListImage", GW_SERVER_STREAM, &pb__list_image_options__descriptor, on_list_image,
     ERU_LIST_IMAGE, true},
    {"/pb.CoreRPC/RemoveImage", GW_SERVER_STREAM, &pb__remove_image_options__descriptor,
     on_remove_image, ERU_REMOVE_IMAGE, true},
    {"/pb.CoreRPC/CacheImage", GW_SERVER_STREAM, &pb__cache_image_options__descriptor,
     on_cache_image, ERU_CACHE_IMAGE, true},
    {"/pb.CoreRPC/BuildImage", GW_SERVER_STREAM, &pb__build_image_options__descriptor,
     on_build_image, ERU_BUILD_IMAGE, true},
};

int svc_core_image_register(svc_core_image *s, gw_server *server) {
    if (svc_eru_register(server, k_methods, N_METHODS, s->methods, s) != 0) return -1;
    s->methods[3].upload = true; /* BuildImage: its tar, bounded by gateway.max_upload_bytes */
    return 0;
}
