/*
 * svc_core_wl: SetWorkloadsStatus, GetWorkloadsStatus, WorkloadStatusStream (see svc_core_wl.h).
 *
 * The unary calls are thin: shared/pv_workload checks and stores, the handler converts.
 * SetWorkloadsStatus is all or nothing (Eru stops at the first unknown workload, having written
 * those before it; here nothing is written then) and answers 1056 naming the id;
 * GetWorkloadsStatus answers 1055 naming the first id without a live status.
 *
 * WorkloadStatusStream: Eru streams one message per change of a workload's status key. Here the
 * changes are the keyspace notifications of the wl-status keys, followed by one gw_node_watch
 * per gateway that the first stream starts (a gateway nobody asks keeps no connection for it and
 * reads nothing). A notification carries no value, so for a "set" the follower reads the status
 * and the record together and sends what is there then: {id, workload, status}. "del" and
 * "expired" give {id, delete: true}, with the workload while its record still exists. A status
 * whose record cannot be read gives {id, error}.
 *
 * The filters (app, entrypoint, node, labels) need the workload's record, which is gone when its
 * removal deletes the status. So the follower keeps, for every live status, whose it is and when
 * it was written (pv_workload_status_ref, sorted by id): deletions are filtered with that, and
 * after a reconnection the same table tells which statuses changed or vanished meanwhile, which
 * are reported then (around a reconnection a change may be reported twice, never lost). The
 * first read fills the table silently: a stream reports changes, not the current state, as in
 * Eru. A deletion of a status it never knew and whose record is gone can match no filter: only
 * unfiltered streams get it.
 *
 * Lock order: the service's mutex, then (inside gw_call_send) the call's; the framework runs close
 * callbacks without the call's mutex (as in gw_watchers).
 */
#include "svc_core_wl.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_node_watch.h"
#include "pb/core.pb-c.h"
#include "pv_log.h"
#include "pv_pbmap.h"
#include "pv_registry.h"
#include "pv_workload.h"
#include "svc_eru.h"

#define N_METHODS 7
#define STATUS_PAGE 1000
/* How long the first stream waits for the follower's first read, so that changes made right
 * after it is accepted are seen. */
#define FIRST_SYNC_WAIT_MS 3000

typedef struct wl_stream wl_stream;

struct svc_core_wl {
    gw_app *app;
    gw_method methods[N_METHODS];
    gw_node_watch *watch;
    pthread_mutex_t mu; /* streams, started, closing */
    wl_stream *streams;
    bool started, closing;
    /* the follower's thread only */
    pv_workload_status_ref *known; /* every live status known, sorted by id */
    size_t n_known, cap_known;
    bool filled;
};

svc_core_wl *svc_core_wl_new(gw_app *app) {
    svc_core_wl *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->app = app;
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void svc_core_wl_free(svc_core_wl *s) {
    if (!s) return;
    gw_node_watch_free(s->watch);
    pv_workload_status_refs_free(s->known, s->n_known);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static svc_core_wl *svc_of(gw_call *call) {
    return gw_call_method_data(call);
}

/* ------------------------------------------------------------------------------------------ */
/* messages                                                                                    */

/* A map<string,string> field built from a JSON object; the entries point into obj. */
typedef struct map_buf {
    json_t *obj; /* every value a string */
    void **ptrs; /* pv_pbmap_entries */
    size_t n;
} map_buf;

/* A JSON value as a map value: strings as they are, arrays of strings joined with "," (Eru's
 * publish form: "ip:port,ip:port"), anything else as compact JSON. */
static json_t *map_value(json_t *v) {
    if (json_is_string(v)) return json_incref(v);
    if (json_is_array(v) && json_array_size(v) > 0 && json_is_string(json_array_get(v, 0))) {
        size_t len = 1, i;
        json_t *e;
        json_array_foreach(v, i, e) len += json_string_length(e) + 1;
        char *buf = calloc(1, len);
        if (!buf) return NULL;
        json_array_foreach(v, i, e) {
            if (i > 0) strcat(buf, ",");
            if (json_is_string(e)) strcat(buf, json_string_value(e));
        }
        json_t *out = json_string(buf);
        free(buf);
        return out;
    }
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    json_t *out = text ? json_string(text) : NULL;
    free(text);
    return out;
}

static void map_free(map_buf *m) {
    json_decref(m->obj);
    pv_pbmap_entries_free(m->ptrs);
    memset(m, 0, sizeof *m);
}

static int map_fill(map_buf *m, const ProtobufCMessageDescriptor *d, const char *json) {
    memset(m, 0, sizeof *m);
    json_t *src = json_loads(json ? json : "{}", 0, NULL);
    m->obj = json_object();
    const char *key;
    json_t *v;
    json_object_foreach(src, key, v) json_object_set_new(m->obj, key, map_value(v));
    json_decref(src);
    if (!m->obj) return -1;
    return pv_pbmap_entries(m->obj, d, &m->ptrs, &m->n);
}

typedef struct status_msg {
    Pb__WorkloadStatus msg;
    map_buf networks;
} status_msg;

static int status_msg_fill(status_msg *m, const pv_workload_status *s) {
    pb__workload_status__init(&m->msg);
    if (map_fill(&m->networks, &pb__workload_status__networks_entry__descriptor, s->networks) != 0)
        return -1;
    m->msg.id = (char *)s->id;
    m->msg.running = s->running;
    m->msg.healthy = s->healthy;
    m->msg.networks = (Pb__WorkloadStatus__NetworksEntry **)m->networks.ptrs;
    m->msg.n_networks = m->networks.n;
    m->msg.extension.data = s->extension;
    m->msg.extension.len = s->extension ? s->extension_len : 0;
    m->msg.ttl = s->ttl;
    m->msg.appname = s->app ? s->app : "";
    m->msg.entrypoint = s->entry ? s->entry : "";
    m->msg.nodename = s->node ? s->node : "";
    return 0;
}

typedef struct workload_msg {
    Pb__Workload msg;
    map_buf labels, publish;
    json_t *env;
    char **env_v;
} workload_msg;

static void workload_msg_free(workload_msg *m) {
    map_free(&m->labels);
    map_free(&m->publish);
    json_decref(m->env);
    free(m->env_v);
}

/* The record as pb.Workload (status may be NULL). */
static int workload_msg_fill(workload_msg *m, const pv_workload *w, Pb__WorkloadStatus *status) {
    memset(m, 0, sizeof *m);
    pb__workload__init(&m->msg);
    m->msg.id = (char *)w->id;
    m->msg.podname = w->pod;
    m->msg.nodename = w->node;
    m->msg.name = w->name;
    m->msg.privileged = w->privileged;
    m->msg.image = w->image;
    m->msg.status = status;
    m->msg.create_time = w->created_ms / 1000; /* Eru's: Unix seconds */
    m->msg.resources = w->resources;
    if (map_fill(&m->labels, &pb__workload__labels_entry__descriptor, w->labels) != 0 ||
        map_fill(&m->publish, &pb__workload__publish_entry__descriptor, w->publish) != 0)
        return -1;
    m->msg.labels = (Pb__Workload__LabelsEntry **)m->labels.ptrs;
    m->msg.n_labels = m->labels.n;
    m->msg.publish = (Pb__Workload__PublishEntry **)m->publish.ptrs;
    m->msg.n_publish = m->publish.n;
    m->env = json_loads(w->env ? w->env : "[]", 0, NULL);
    size_t n = json_array_size(m->env), i;
    json_t *v;
    if (n == 0) return 0;
    if (!(m->env_v = calloc(n, sizeof *m->env_v))) return -1;
    json_array_foreach(m->env, i, v) {
        if (json_is_string(v)) m->env_v[m->msg.n_env++] = (char *)json_string_value(v);
    }
    m->msg.env = m->env_v;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* GetWorkload, GetWorkloads, ListWorkloads, ListNodeWorkloads                                  */

/* A workload with its live status (when it has one) as pb.Workload, in one allocation the
 * caller frees with full_free. */
typedef struct full_msg {
    workload_msg w;
    status_msg s;
    pv_workload_status st;
    bool has_status;
} full_msg;

static void full_free(full_msg *f) {
    workload_msg_free(&f->w);
    if (f->has_status) map_free(&f->s.networks);
    pv_workload_status_clear(&f->st);
}

static int full_fill(full_msg *f, pv_redis *r, const pv_keys *k, const pv_workload *w,
                     pv_status *st) {
    memset(f, 0, sizeof *f);
    pv_status sst;
    f->has_status = pv_workload_get_status(r, k, w->id, &f->st, &sst) == PV_OK;
    if (!f->has_status && sst.code != PV_NOT_FOUND) return *st = sst, st->code;
    if (f->has_status && status_msg_fill(&f->s, &f->st) != 0)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    if (workload_msg_fill(&f->w, w, f->has_status ? &f->s.msg : NULL) != 0)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    return PV_OK;
}

static void on_get_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__WorkloadID *o = (const Pb__WorkloadID *)req;
    pv_redis *r = gw_app_redis(call);
    pv_workload w;
    full_msg f;
    pv_status st;
    const pv_keys *k = &svc_of(call)->app->keys;
    if (pv_workload_get(r, k, o->id, &w, &st) != PV_OK) {
        gw_call_finishf(call, ERU_GET_WORKLOAD, "%s", st.msg);
        return;
    }
    if (full_fill(&f, r, k, &w, &st) == PV_OK)
        gw_call_reply(call, &f.w.msg.base);
    else
        gw_call_finishf(call, ERU_GET_WORKLOAD, "%s", st.msg);
    full_free(&f);
    pv_workload_clear(&w);
}

/* Replies pb.Workloads for n records (each with its status). */
static void reply_workloads(gw_call *call, pv_redis *r, const pv_workload *ws, size_t n, int eru) {
    full_msg *f = calloc(n ? n : 1, sizeof *f);
    Pb__Workload **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    pv_status st;
    int rc = f && ptrs ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    size_t filled = 0;
    for (; rc == PV_OK && filled < n; filled++) {
        rc = full_fill(&f[filled], r, &svc_of(call)->app->keys, &ws[filled], &st);
        ptrs[filled] = &f[filled].w.msg;
    }
    Pb__Workloads out = PB__WORKLOADS__INIT;
    out.workloads = ptrs;
    out.n_workloads = n;
    if (rc == PV_OK)
        gw_call_reply(call, &out.base);
    else
        gw_call_finishf(call, eru, "%s", st.msg);
    for (size_t i = 0; f && i < filled; i++)
        full_free(&f[i]);
    free(f);
    free(ptrs);
}

static void on_get_workloads(gw_call *call, const ProtobufCMessage *req) {
    const Pb__WorkloadIDs *o = (const Pb__WorkloadIDs *)req;
    pv_redis *r = gw_app_redis(call);
    pv_workload *ws = calloc(o->n_ids ? o->n_ids : 1, sizeof *ws);
    pv_status st;
    int rc = ws ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    size_t got = 0;
    for (; rc == PV_OK && got < o->n_ids; got++)
        if ((rc = pv_workload_get(r, &svc_of(call)->app->keys, o->ids[got], &ws[got], &st)) !=
            PV_OK)
            break;
    if (rc == PV_OK)
        reply_workloads(call, r, ws, got, ERU_GET_WORKLOADS);
    else
        gw_call_finishf(call, ERU_GET_WORKLOADS, "%s", st.msg);
    pv_workload_array_free(ws, got);
}

/* One listing: its workloads (pv_workload_array_free) and, when it failed, why. */
typedef struct listing {
    pv_workload *ws;
    size_t n;
    pv_status st;
} listing;

/* The workloads of app, entrypoint and node ("" for any) that carry every label of the map
 * field labels, into *l. */
static int list_labelled(gw_call *call, const char *app, const char *entrypoint, const char *node,
                         void *const *labels, size_t n_labels, listing *l) {
    char *json = NULL;
    l->ws = NULL;
    l->n = 0;
    int rc = svc_eru_labels_json("labels", labels, n_labels, &json, &l->st);
    if (rc == PV_OK)
        rc = pv_workload_list(gw_app_redis(call), &svc_of(call)->app->keys, app, entrypoint, node,
                              json, &l->ws, &l->n, &l->st);
    free(json);
    return rc;
}

static void on_list_workloads(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ListWorkloadsOptions *o = (const Pb__ListWorkloadsOptions *)req;
    listing l;
    int rc = list_labelled(call, o->appname, o->entrypoint, o->nodename, (void *const *)o->labels,
                           o->n_labels, &l);
    for (size_t i = 0; rc == PV_OK && i < l.n && (o->limit <= 0 || (int64_t)i < o->limit); i++) {
        full_msg f;
        rc = full_fill(&f, gw_app_redis(call), &svc_of(call)->app->keys, &l.ws[i], &l.st);
        if (rc == PV_OK && gw_call_send(call, &f.w.msg.base) != 0)
            rc = pv_status_set(&l.st, PV_CANCELLED, "client gone");
        full_free(&f);
    }
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_LIST_WORKLOADS, "%s", l.st.msg);
    pv_workload_array_free(l.ws, l.n);
}

/* The node must exist (Eru's GetNode first); its workloads answer as one pb.Workloads. */
static void on_list_node_workloads(gw_call *call, const ProtobufCMessage *req) {
    const Pb__GetNodeOptions *o = (const Pb__GetNodeOptions *)req;
    listing l = {0};
    pv_node node;
    int rc = pv_registry_get_node(gw_app_redis(call), &svc_of(call)->app->keys, PV_REG_BY_NAME,
                                  o->nodename, &node, &l.st);
    if (rc == PV_OK) pv_node_clear(&node);
    if (rc == PV_OK)
        rc = list_labelled(call, "", "", o->nodename, (void *const *)o->labels, o->n_labels, &l);
    if (rc == PV_OK)
        reply_workloads(call, gw_app_redis(call), l.ws, l.n, ERU_LIST_NODE_WORKLOADS);
    else
        gw_call_finishf(call, ERU_LIST_NODE_WORKLOADS, "%s", l.st.msg);
    pv_workload_array_free(l.ws, l.n);
}

/* ------------------------------------------------------------------------------------------ */
/* SetWorkloadsStatus, GetWorkloadsStatus                                                      */

static void reply_statuses(gw_call *call, const pv_workload_status *v, size_t n, int eru) {
    status_msg *m = calloc(n ? n : 1, sizeof *m);
    Pb__WorkloadStatus **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    size_t filled = 0;
    bool ok = m && ptrs;
    while (ok && filled < n) {
        ok = status_msg_fill(&m[filled], &v[filled]) == 0;
        ptrs[filled] = &m[filled].msg;
        filled++; /* a half-filled one is freed with the others */
    }
    Pb__WorkloadsStatus out = PB__WORKLOADS_STATUS__INIT;
    out.status = ptrs;
    out.n_status = n;
    if (ok)
        gw_call_reply(call, &out.base);
    else
        gw_call_finish(call, eru, "out of memory");
    for (size_t i = 0; i < filled; i++)
        map_free(&m[i].networks);
    free(m);
    free(ptrs);
}

static void on_set_workloads_status(gw_call *call, const ProtobufCMessage *req) {
    const Pb__SetWorkloadsStatusOptions *o = (const Pb__SetWorkloadsStatusOptions *)req;
    pv_redis *r = gw_app_redis(call);
    size_t n = o->n_status;
    pv_workload_status *in = calloc(n ? n : 1, sizeof *in), *out = calloc(n ? n : 1, sizeof *out);
    char **networks = calloc(n ? n : 1, sizeof *networks);
    pv_status st;
    int rc = in && out && networks ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const Pb__WorkloadStatus *p = o->status[i];
        char id_field[48], net_field[48];
        snprintf(id_field, sizeof id_field, "status[%zu].id", i);
        snprintf(net_field, sizeof net_field, "status[%zu].networks", i);
        if ((rc = pv_workload_check_id(id_field, p->id, &st)) != PV_OK ||
            (rc = svc_eru_labels_json(net_field, (void *const *)p->networks, p->n_networks,
                                      &networks[i], &st)) != PV_OK)
            break;
        snprintf(in[i].id, sizeof in[i].id, "%s", p->id);
        in[i].running = p->running;
        in[i].healthy = p->healthy;
        in[i].networks = networks[i];
        in[i].extension = p->extension.data;
        in[i].extension_len = p->extension.len;
        in[i].ttl = p->ttl;
    }
    if (rc == PV_OK) rc = pv_workload_set_statuses(r, &svc_of(call)->app->keys, in, n, out, &st);
    if (rc == PV_OK)
        reply_statuses(call, out, n, ERU_SET_WORKLOADS_STATUS);
    else
        gw_call_finishf(call, ERU_SET_WORKLOADS_STATUS, "%s", st.msg);
    for (size_t i = 0; i < n && out && networks; i++) {
        pv_workload_status_clear(&out[i]);
        free(networks[i]);
    }
    free(in);
    free(out);
    free(networks);
}

static void on_get_workloads_status(gw_call *call, const ProtobufCMessage *req) {
    const Pb__WorkloadIDs *o = (const Pb__WorkloadIDs *)req;
    pv_redis *r = gw_app_redis(call);
    size_t n = o->n_ids, got = 0;
    pv_workload_status *out = calloc(n ? n : 1, sizeof *out);
    pv_status st;
    int rc = out ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    while (rc == PV_OK && got < n) {
        rc = pv_workload_get_status(r, &svc_of(call)->app->keys, o->ids[got], &out[got], &st);
        if (rc == PV_OK) got++;
    }
    if (rc == PV_OK)
        reply_statuses(call, out, n, ERU_GET_WORKLOADS_STATUS);
    else
        gw_call_finishf(call, ERU_GET_WORKLOADS_STATUS, "%s", st.msg);
    for (size_t i = 0; i < got; i++)
        pv_workload_status_clear(&out[i]);
    free(out);
}

/* ------------------------------------------------------------------------------------------ */
/* WorkloadStatusStream: the streams and their filters                                         */

struct wl_stream {
    gw_call *call;
    svc_core_wl *s;
    char *app, *entry, *node; /* "" = any */
    json_t *labels;           /* object of strings; empty = any */
    wl_stream *prev, *next;
};

/* Whose a status is, as the filters see it. */
typedef struct owner {
    const char *app, *entry, *node;
    json_t *labels;
} owner;

static void owner_init(owner *o, const char *app, const char *entry, const char *node,
                       const char *labels) {
    o->app = app ? app : "";
    o->entry = entry ? entry : "";
    o->node = node ? node : "";
    o->labels = json_loads(labels ? labels : "{}", 0, NULL);
}

static bool stream_wants(wl_stream *e, const owner *o) {
    bool filtered = *e->app || *e->entry || *e->node || json_object_size(e->labels) > 0;
    if (!o) return !filtered;
    if ((*e->app && strcmp(e->app, o->app) != 0) || (*e->entry && strcmp(e->entry, o->entry)) ||
        (*e->node && strcmp(e->node, o->node) != 0))
        return false;
    const char *key;
    json_t *want;
    json_object_foreach(e->labels, key, want) {
        const char *have = json_string_value(json_object_get(o->labels, key));
        if (!have || strcmp(have, json_string_value(want)) != 0) return false;
    }
    return true;
}

/* Sends m to every stream whose filters the owner passes (o NULL: the owner is unknown, and only
 * unfiltered streams get it unless to_all). */
static void broadcast(svc_core_wl *s, const ProtobufCMessage *m, const owner *o, bool to_all) {
    pthread_mutex_lock(&s->mu);
    for (wl_stream *e = s->streams; e; e = e->next)
        if ((!o && to_all) || stream_wants(e, o)) gw_call_send(e->call, m);
    pthread_mutex_unlock(&s->mu);
}

static void stream_free(wl_stream *e) {
    free(e->app);
    free(e->entry);
    free(e->node);
    json_decref(e->labels);
    free(e);
}

static void unlink_locked(svc_core_wl *s, wl_stream *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        s->streams = e->next;
    if (e->next) e->next->prev = e->prev;
}

static void on_stream_close(gw_call *c, void *arg) {
    wl_stream *e = arg;
    pthread_mutex_lock(&e->s->mu);
    unlink_locked(e->s, e);
    pthread_mutex_unlock(&e->s->mu);
    stream_free(e);
    gw_call_unref(c);
}

static wl_stream *stream_new(gw_call *call, const Pb__WorkloadStatusStreamOptions *o,
                             pv_status *st) {
    char *labels = NULL;
    if (svc_eru_labels_json("labels", (void *const *)o->labels, o->n_labels, &labels, st) != PV_OK)
        return NULL;
    wl_stream *e = calloc(1, sizeof *e);
    if (e) {
        e->call = call;
        e->s = svc_of(call);
        e->app = strdup(o->appname ? o->appname : "");
        e->entry = strdup(o->entrypoint ? o->entrypoint : "");
        e->node = strdup(o->nodename ? o->nodename : "");
        e->labels = json_loads(labels, 0, NULL);
    }
    free(labels);
    if (e && e->app && e->entry && e->node && e->labels) return e;
    if (e) stream_free(e);
    pv_status_set(st, PV_INTERNAL, "out of memory");
    return NULL;
}

static void on_workload_status_stream(gw_call *call, const ProtobufCMessage *req) {
    svc_core_wl *s = svc_of(call);
    pv_status st;
    wl_stream *e = stream_new(call, (const Pb__WorkloadStatusStreamOptions *)req, &st);
    if (!e) {
        gw_call_finishf(call, st.code, "%s", st.msg);
        return;
    }
    gw_call_ref(call);
    pthread_mutex_lock(&s->mu);
    bool closing = s->closing, start = !closing && !s->started;
    if (!closing) {
        e->next = s->streams;
        if (s->streams) s->streams->prev = e;
        s->streams = e;
    }
    if (start && gw_node_watch_start(s->watch) == 0)
        s->started = true;
    else if (start)
        pv_error("WorkloadStatusStream: cannot start the status follower thread");
    pthread_mutex_unlock(&s->mu);
    if (closing) {
        stream_free(e);
        gw_call_unref(call);
        gw_call_finish(call, PV_UNAVAILABLE, "gateway shutting down");
        return;
    }
    if (gw_call_on_close(call, on_stream_close, e) != 0) {
        /* Closed already: the callback will never run, so undo here. */
        pthread_mutex_lock(&s->mu);
        unlink_locked(s, e);
        pthread_mutex_unlock(&s->mu);
        stream_free(e);
        gw_call_unref(call);
        return;
    }
    if (start && gw_node_watch_wait_synced(s->watch, FIRST_SYNC_WAIT_MS) != 0)
        pv_warn("WorkloadStatusStream: no first read of the statuses within %d ms; the stream "
                "reports changes once redis %s answers",
                FIRST_SYNC_WAIT_MS, s->app->cfg.redis.addr);
}

/* ------------------------------------------------------------------------------------------ */
/* WorkloadStatusStream: the follower (its thread only)                                        */

/* Where id is, or would go, in the table (its lower bound). */
static size_t known_find(const svc_core_wl *s, const char *id, bool *found) {
    size_t lo = 0, hi = s->n_known;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(s->known[mid].id, id) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = lo < s->n_known && strcmp(s->known[lo].id, id) == 0;
    return lo;
}

static void ref_clear(pv_workload_status_ref *r) {
    free(r->app);
    free(r->entry);
    free(r->node);
    free(r->labels);
    memset(r, 0, sizeof *r);
}

/* Remembers (or updates) whose status id is. Out of memory it is simply not remembered: its
 * deletion then reaches the unfiltered streams only. */
static void known_put(svc_core_wl *s, const pv_workload_status *st, const pv_workload *rec) {
    pv_workload_status_ref r = {.updated_ms = st->updated_ms,
                                .app = strdup(rec->app),
                                .entry = strdup(rec->entry),
                                .node = strdup(rec->node),
                                .labels = strdup(rec->labels)};
    snprintf(r.id, sizeof r.id, "%s", st->id);
    bool found;
    size_t at = known_find(s, r.id, &found);
    if (!r.app || !r.entry || !r.node || !r.labels) {
        ref_clear(&r);
        return;
    }
    if (found) {
        ref_clear(&s->known[at]);
        s->known[at] = r;
        return;
    }
    if (s->n_known == s->cap_known) {
        size_t cap = s->cap_known ? 2 * s->cap_known : 256;
        pv_workload_status_ref *v = realloc(s->known, cap * sizeof *v);
        if (!v) {
            ref_clear(&r);
            return;
        }
        s->known = v;
        s->cap_known = cap;
    }
    memmove(&s->known[at + 1], &s->known[at], (s->n_known - at) * sizeof *s->known);
    s->known[at] = r;
    s->n_known++;
}

/* Moves id's entry out into *out; false when unknown. */
static bool known_take(svc_core_wl *s, const char *id, pv_workload_status_ref *out) {
    bool found;
    size_t at = known_find(s, id, &found);
    if (!found) return false;
    *out = s->known[at];
    memmove(&s->known[at], &s->known[at + 1], (s->n_known - at - 1) * sizeof *s->known);
    s->n_known--;
    return true;
}

/* Sends an error about id to the streams its known owner passes (every stream when unknown:
 * they should hear that something could not be read). */
static void report_error(svc_core_wl *s, const char *id, const char *error) {
    Pb__WorkloadStatusStreamMessage m = PB__WORKLOAD_STATUS_STREAM_MESSAGE__INIT;
    m.id = (char *)id;
    m.error = (char *)error;
    bool found;
    size_t at = known_find(s, id, &found);
    owner o = {0};
    if (found) {
        const pv_workload_status_ref *k = &s->known[at];
        owner_init(&o, k->app, k->entry, k->node, k->labels);
    }
    broadcast(s, &m.base, found ? &o : NULL, true);
    if (found) json_decref(o.labels);
    pv_debug("WorkloadStatusStream: id=%s error=%s", id, error);
}

/* A status was written: sends it with the record as they are now. */
static void report_set(svc_core_wl *s, pv_redis *r, const char *id) {
    pv_workload_status stv;
    pv_workload rec;
    bool has_status, has_record;
    pv_status st;
    if (pv_workload_status_view(r, &s->app->keys, id, &stv, &has_status, &rec, &has_record, &st) !=
        PV_OK) {
        report_error(s, id, st.msg);
        return;
    }
    if (!has_status) { /* gone again already: its deletion is reported next */
        if (has_record) pv_workload_clear(&rec);
        return;
    }
    if (!has_record) {
        char msg[160];
        snprintf(msg, sizeof msg, "workload %s not found", id);
        report_error(s, id, msg);
        pv_workload_status_clear(&stv);
        return;
    }
    known_put(s, &stv, &rec);
    status_msg sm;
    workload_msg wm;
    memset(&wm, 0, sizeof wm);
    if (status_msg_fill(&sm, &stv) == 0 && workload_msg_fill(&wm, &rec, &sm.msg) == 0) {
        Pb__WorkloadStatusStreamMessage m = PB__WORKLOAD_STATUS_STREAM_MESSAGE__INIT;
        m.id = (char *)id;
        m.workload = &wm.msg;
        m.status = &sm.msg;
        owner o;
        owner_init(&o, rec.app, rec.entry, rec.node, rec.labels);
        broadcast(s, &m.base, &o, false);
        json_decref(o.labels);
        pv_debug("WorkloadStatusStream: id=%s running=%d healthy=%d", id, (int)stv.running,
                 (int)stv.healthy);
    } else {
        pv_warn("WorkloadStatusStream: out of memory building the message of workload %s", id);
    }
    workload_msg_free(&wm);
    map_free(&sm.networks);
    pv_workload_status_clear(&stv);
    pv_workload_clear(&rec);
}

/* A status is gone (deleted or expired); known is whose it was (NULL when unknown). */
static void report_gone(svc_core_wl *s, pv_redis *r, const char *id,
                        const pv_workload_status_ref *known) {
    pv_workload rec;
    pv_status st;
    bool has_record = pv_workload_get(r, &s->app->keys, id, &rec, &st) == PV_OK;
    Pb__WorkloadStatusStreamMessage m = PB__WORKLOAD_STATUS_STREAM_MESSAGE__INIT;
    m.id = (char *)id;
    m.delete_ = true;
    workload_msg wm;
    memset(&wm, 0, sizeof wm);
    if (has_record && workload_msg_fill(&wm, &rec, NULL) == 0) m.workload = &wm.msg;
    owner o = {0};
    bool have_owner = known || has_record;
    if (known)
        owner_init(&o, known->app, known->entry, known->node, known->labels);
    else if (has_record)
        owner_init(&o, rec.app, rec.entry, rec.node, rec.labels);
    broadcast(s, &m.base, have_owner ? &o : NULL, false);
    if (have_owner) json_decref(o.labels);
    pv_debug("WorkloadStatusStream: id=%s deleted", id);
    workload_msg_free(&wm);
    if (has_record) pv_workload_clear(&rec);
}

static void on_status_event(void *arg, pv_redis *r, const char *id, const char *event) {
    svc_core_wl *s = arg;
    if (pv_workload_check_id("id", id, NULL) != PV_OK) return; /* not a status key of ours */
    if (strcmp(event, "set") == 0) {
        report_set(s, r, id);
    } else if (strcmp(event, "del") == 0 || strcmp(event, "expired") == 0) {
        pv_workload_status_ref k;
        bool known = known_take(s, id, &k);
        report_gone(s, r, id, known ? &k : NULL);
        if (known) ref_clear(&k);
    }
}

/* Every live status, in id order, read page by page. */
static int read_live(pv_redis *r, const pv_keys *k, pv_workload_status_ref **out, size_t *n,
                     size_t *cap, pv_status *st) {
    *out = NULL;
    *n = *cap = 0;
    char next[PV_WORKLOAD_ID_LEN + 1] = "";
    do {
        pv_workload_status_ref *page = NULL;
        size_t got = 0;
        if (pv_workload_status_page(r, k, next, STATUS_PAGE, &page, &got, next, st) != PV_OK) break;
        if (*n + got > *cap) {
            size_t want = *cap ? *cap : 256;
            while (want < *n + got)
                want *= 2;
            pv_workload_status_ref *v = realloc(*out, want * sizeof *v);
            if (!v) {
                pv_workload_status_refs_free(page, got);
                pv_status_set(st, PV_INTERNAL, "out of memory");
                break;
            }
            *out = v;
            *cap = want;
        }
        if (got) memcpy(*out + *n, page, got * sizeof *page);
        *n += got;
        free(page); /* its strings moved into *out */
    } while (next[0]);
    if (st->code == PV_OK) return PV_OK;
    pv_workload_status_refs_free(*out, *n);
    *out = NULL;
    *n = *cap = 0;
    return st->code;
}

/* After each (re)subscription: the first read fills the table; later ones report what changed
 * while the follower was not listening. */
static void on_status_resync(void *arg, pv_redis *r) {
    svc_core_wl *s = arg;
    pv_workload_status_ref *fresh = NULL;
    size_t n = 0, cap = 0;
    pv_status st;
    pv_status_clear(&st);
    if (read_live(r, &s->app->keys, &fresh, &n, &cap, &st) != PV_OK) {
        pv_warn("WorkloadStatusStream: reading the live statuses: %s", st.msg);
        return;
    }
    pv_workload_status_ref *old = s->known;
    size_t n_old = s->n_known;
    s->known = fresh;
    s->n_known = n;
    s->cap_known = cap;
    bool report = s->filled;
    s->filled = true;
    /* Both tables are in id order: one merge walk finds what vanished, appeared or changed. The
     * fresh table is re-read through s->known: reporting a change updates its entry in place. */
    for (size_t i = 0, j = 0; report && (i < n_old || j < n);) {
        int c = i == n_old ? 1 : j == n ? -1 : strcmp(old[i].id, s->known[j].id);
        if (c < 0) {
            report_gone(s, r, old[i].id, &old[i]);
            i++;
        } else if (c > 0) {
            char id[PV_WORKLOAD_ID_LEN + 1];
            snprintf(id, sizeof id, "%s", s->known[j++].id);
            report_set(s, r, id);
        } else {
            bool changed = old[i].updated_ms != s->known[j].updated_ms;
            char id[PV_WORKLOAD_ID_LEN + 1];
            snprintf(id, sizeof id, "%s", s->known[j].id);
            i++;
            j++;
            if (changed) report_set(s, r, id);
        }
    }
    pv_workload_status_refs_free(old, n_old);
}

/* ------------------------------------------------------------------------------------------ */
/* registration                                                                                */

static void on_shutdown(void *arg) {
    svc_core_wl *s = arg;
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_mutex_unlock(&s->mu);
    gw_node_watch_stop(s->watch);
    pthread_mutex_lock(&s->mu);
    for (wl_stream *e = s->streams; e; e = e->next)
        gw_call_finish(e->call, PV_UNAVAILABLE, "gateway shutting down");
    pthread_mutex_unlock(&s->mu);
}

/* The calls this module serves; bad requests answer the call's Eru code (0: not in Eru's table,
 * so the standard INVALID_ARGUMENT, as for NodeStatusStream). */
static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/SetWorkloadsStatus", GW_UNARY, &pb__set_workloads_status_options__descriptor,
     on_set_workloads_status, ERU_SET_WORKLOADS_STATUS, true},
    {"/pb.CoreRPC/GetWorkloadsStatus", GW_UNARY, &pb__workload_ids__descriptor,
     on_get_workloads_status, ERU_GET_WORKLOADS_STATUS, true},
    {"/pb.CoreRPC/GetWorkload", GW_UNARY, &pb__workload_id__descriptor, on_get_workload,
     ERU_GET_WORKLOAD, true},
    {"/pb.CoreRPC/GetWorkloads", GW_UNARY, &pb__workload_ids__descriptor, on_get_workloads,
     ERU_GET_WORKLOADS, true},
    {"/pb.CoreRPC/ListWorkloads", GW_SERVER_STREAM, &pb__list_workloads_options__descriptor,
     on_list_workloads, ERU_LIST_WORKLOADS, true},
    {"/pb.CoreRPC/ListNodeWorkloads", GW_UNARY, &pb__get_node_options__descriptor,
     on_list_node_workloads, ERU_LIST_NODE_WORKLOADS, true},
    {"/pb.CoreRPC/WorkloadStatusStream", GW_SERVER_STREAM,
     &pb__workload_status_stream_options__descriptor, on_workload_status_stream, 0, false},
};

int svc_core_wl_register(svc_core_wl *s, gw_server *server) {
    char pattern[2 * PV_KEY_MAX], prefix[PV_KEY_MAX];
    pv_status st;
    if (pv_workload_status_pattern(&s->app->keys, s->app->cfg.redis.db, pattern, sizeof pattern,
                                   &st) != PV_OK ||
        pv_workload_status_prefix(&s->app->keys, prefix, sizeof prefix, &st) != PV_OK) {
        pv_error("WorkloadStatusStream: %s", st.msg);
        return -1;
    }
    /* the follower: every status key's changes, read back with on_status_resync */
    gw_node_watch_keys spec = {.what = "WorkloadStatusStream", .arg = s};
    spec.pattern = pattern;
    spec.prefix = prefix;
    spec.resync = on_status_resync;
    spec.event = on_status_event;
    if (!(s->watch = gw_node_watch_new_keys(s->app, &spec))) return -1;
    if (svc_eru_register(server, k_methods, N_METHODS, s->methods, s) != 0) return -1;
    return gw_server_on_shutdown(server, on_shutdown, s);
}
