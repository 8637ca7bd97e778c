/*
 * svc_cluster: ClusterService's handlers (see svc_cluster.h). Each handler decodes and checks,
 * calls the registry (shared/pv_registry) and the view (shared/pv_cluster), and encodes; the
 * encoding helpers below turn registry records into Cluster and Node messages.
 */
#include "svc_cluster.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pivirt/cluster/v1/cluster.pb-c.h"
#include "op_convert.h"
#include "pv_cluster.h"
#include "pv_id.h"
#include "pv_pbmap.h"
#include "pv_json.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_mem.h"
#include "pv_registry.h"
#include "pv_res.h"
#include "pv_validate.h"
#include "pv_upgrade.h"
#include "pv_workload.h"

struct svc_cluster {
    gw_app *app;
    gw_method methods[16];
    char paths[16][GW_PATH_MAX];
};

svc_cluster *svc_cluster_new(gw_app *app) {
    svc_cluster *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_cluster_free(svc_cluster *s) {
    free(s);
}

static const pv_keys *keys_of(gw_call *call) {
    return &((svc_cluster *)gw_call_method_data(call))->app->keys;
}

static void finish_status(gw_call *call, const pv_status *st) {
    gw_call_finish(call, st->code, st->msg);
}

/* ---- maps ---- */

/* A request's map as a JSON object text (caller frees). */
static char *map_json(void *const *entries, size_t n) {
    json_t *o = pv_pbmap_object(entries, n);
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return text;
}

/* Entries of descriptor d for a JSON object of strings; they point into *keep (the parsed
 * object, the caller's to json_decref) and are freed with pv_pbmap_entries_free. */
static void **map_entries(const char *json, const ProtobufCMessageDescriptor *d, json_t **keep,
                          size_t *n) {
    *keep = json_loads(json && *json ? json : "{}", 0, NULL);
    void **out;
    pv_pbmap_entries(*keep, d, &out, n);
    return out;
}

static void timestamp(Google__Protobuf__Timestamp *ts, int64_t ms) {
    google__protobuf__timestamp__init(ts);
    ts->seconds = ms / 1000;
    ts->nanos = (int32_t)(ms % 1000) * 1000000;
}

/* ---- lookups ---- */

/* A cluster by id or by name. A reference that could be neither is refused naming the request's
 * field; the registry's own checks would name theirs ("id"). */
static int find_cluster(pv_redis *r, const pv_keys *k, const char *field, const char *ref,
                        pv_pod *out, pv_status *st) {
    if (pv_id_check(field, ref, st) != PV_OK) return st->code;
    if (pv_registry_get_pod(r, k, PV_REG_BY_ID, ref, out, st) == PV_OK) return PV_OK;
    if (st->code != PV_NOT_FOUND && st->code != PV_INVALID_ARGUMENT) return st->code;
    if (pv_registry_get_pod(r, k, PV_REG_BY_NAME, ref, out, st) == PV_OK) return PV_OK;
    if (st->code == PV_NOT_FOUND || st->code == PV_INVALID_ARGUMENT)
        return pv_status_set(st, PV_NOT_FOUND, "%s: cluster %s not found", field, ref);
    return st->code;
}

/* A node by id or by name, which must belong to cluster pod. */
static int find_node(pv_redis *r, const pv_keys *k, const pv_pod *pod, const char *ref,
                     pv_node *out, pv_status *st) {
    if (pv_id_check("node_id", ref, st) != PV_OK) return st->code;
    int rc = pv_registry_get_node(r, k, PV_REG_BY_ID, ref, out, st);
    if (rc == PV_NOT_FOUND) rc = pv_registry_get_node(r, k, PV_REG_BY_NAME, ref, out, st);
    if (rc == PV_NOT_FOUND || rc == PV_INVALID_ARGUMENT)
        return pv_status_set(st, PV_NOT_FOUND, "node_id: node %s not found", ref);
    if (rc != PV_OK) return rc;
    if (strcmp(out->pod_id, pod->id) != 0) {
        pv_status_set(st, PV_NOT_FOUND, "node_id: node %s is not in cluster %s (it is in %s)", ref,
                      pod->name, out->pod_name);
        pv_node_clear(out);
        return PV_NOT_FOUND;
    }
    return PV_OK;
}

/* ---- encoding ---- */

typedef struct node_msg {
    Pivirt__Cluster__V1__Node msg;
    Pivirt__Cluster__V1__NodeResources res;
    Pivirt__Cluster__V1__NodeConditions cond;
    Google__Protobuf__Timestamp created, updated;
    json_t *labels_json, *annotations_json;
} node_msg;

static void node_msg_free(node_msg *m) {
    pv_pbmap_entries_free((void **)m->msg.labels);
    pv_pbmap_entries_free((void **)m->msg.annotations);
    json_decref(m->labels_json);
    json_decref(m->annotations_json);
}

static void node_resources(const pv_node *n, Pivirt__Cluster__V1__NodeResources *out) {
    pivirt__cluster__v1__node_resources__init(out);
    pv_node_capacity c;
    pv_cluster_node_capacity(n, &c);
    out->cpu_cores = c.cpu_cores;
    out->memory_bytes = c.memory;
    out->storage_bytes = c.storage;
    out->cpu_used_cores = c.cpu_used_cores;
    out->memory_used_bytes = c.memory_used;
    out->storage_used_bytes = c.storage_used;
}

/* The node's message; state: what its operations make it (DRAINING, ERROR), 0 for what its
 * record and heartbeat say (node_state_now). */
static int node_fill(const pv_node *n, pv_node_state state, node_msg *m) {
    memset(m, 0, sizeof *m);
    pivirt__cluster__v1__node__init(&m->msg);
    m->msg.id = (char *)n->id;
    m->msg.name = n->name;
    m->msg.cluster_id = n->pod_id;
    m->msg.role = n->role && strcmp(n->role, "control-plane") == 0
                      ? PIVIRT__CLUSTER__V1__NODE_ROLE__NODE_ROLE_CONTROL_PLANE
                      : PIVIRT__CLUSTER__V1__NODE_ROLE__NODE_ROLE_WORKER;
    m->msg.status = (Pivirt__Cluster__V1__NodeStatus)(state ? state : pv_cluster_node_state(n));
    m->msg.ip = n->ip ? n->ip : "";
    node_resources(n, &m->res);
    m->msg.resources = &m->res;
    pivirt__cluster__v1__node_conditions__init(&m->cond);
    pv_node_conditions c;
    pv_cluster_node_conditions(n, &c);
    m->cond.memory_pressure = c.memory_pressure;
    m->cond.disk_pressure = c.disk_pressure;
    m->cond.pid_pressure = c.pid_pressure;
    m->cond.network_unavailable = c.network_unavailable;
    m->msg.conditions = &m->cond;
    m->msg.labels = (Pivirt__Cluster__V1__Node__LabelsEntry **)map_entries(
        n->labels, &pivirt__cluster__v1__node__labels_entry__descriptor, &m->labels_json,
        &m->msg.n_labels);
    /* the agent's software version, as the annotation */
    json_t *info = n->engine_info && *n->engine_info ? json_loads(n->engine_info, 0, NULL) : NULL;
    json_t *ann = json_object();
    const char *version = json_string_value(json_object_get(info, "version"));
    if (version) json_object_set_new(ann, "pivirt.io/version", json_string(version));
    json_decref(info);
    char *ann_text = json_dumps(ann, JSON_COMPACT);
    json_decref(ann);
    m->msg.annotations = (Pivirt__Cluster__V1__Node__AnnotationsEntry **)map_entries(
        ann_text, &pivirt__cluster__v1__node__annotations_entry__descriptor, &m->annotations_json,
        &m->msg.n_annotations);
    free(ann_text);
    timestamp(&m->created, n->created_ms);
    timestamp(&m->updated, n->updated_ms);
    m->msg.created_at = &m->created;
    m->msg.updated_at = &m->updated;
    return PV_OK;
}

/* The nodes the last upgrade of the node's cluster failed to roll back (when that upgrade
 * FAILED), read once per cluster and kept in cache (a JSON object: cluster id -> an object of
 * those node ids, empty when none). Borrowed from the cache. A failed read counts as none. */
static json_t *upgrade_failures_of(gw_call *call, json_t *cache, const char *pod_id) {
    json_t *failed = json_object_get(cache, pod_id);
    if (failed) return failed;
    failed = json_object();
    pv_status st;
    pv_upgrade_rec rec;
    if (pv_upgrade_get(gw_app_redis(call), keys_of(call), pod_id, &rec, &st) == PV_OK &&
        rec.phase == PV_UPGRADE_FAILED)
        for (size_t i = 0; failed && i < rec.n_nodes; i++)
            if (rec.nodes[i].state == PV_NODE_UPGRADE_FAILED)
                json_object_set_new(failed, rec.nodes[i].id, json_true());
    pv_upgrade_rec_free(&rec);
    json_object_set_new(cache, pod_id, failed);
    return failed;
}

/* DRAINING while an operation drains n; ERROR when the cluster's last upgrade failed to roll
 * it back (failed: upgrade_failures_of its cluster); else 0. A failed read shows the node as
 * its record says. */
static pv_node_state node_state_now(gw_call *call, const pv_node *n, json_t *failed) {
    bool draining = false;
    pv_status st;
    if (pv_cluster_node_draining(gw_app_redis(call), keys_of(call), n, &draining, &st) != PV_OK)
        pv_warn("node %s: drain state not read: %s", n->name, st.msg);
    if (draining) return PV_NODE_DRAINING;
    return json_object_get(failed, n->id) ? PV_NODE_ERROR : 0;
}

static int send_node(gw_call *call, const pv_node *n) {
    node_msg m;
    json_t *cache = json_object();
    node_fill(n, node_state_now(call, n, upgrade_failures_of(call, cache, n->pod_id)), &m);
    json_decref(cache);
    int rc = gw_call_send(call, &m.msg.base);
    node_msg_free(&m);
    return rc;
}

/* The phase of the cluster's current or last upgrade, 0 when it has none (or it is unread). */
static int upgrade_phase(gw_call *call, pv_redis *r, const char *cluster_id) {
    pv_upgrade_rec rec;
    pv_status st;
    int rc = pv_upgrade_get(r, keys_of(call), cluster_id, &rec, &st);
    if (rc != PV_OK && rc != PV_NOT_FOUND)
        pv_warn("cluster %s: upgrade record: %s", cluster_id, st.msg);
    int phase = rc == PV_OK ? rec.phase : 0;
    pv_upgrade_rec_free(&rec);
    return phase;
}

/* The cluster's status: UPGRADING while an upgrade runs, ERROR after one that could not roll
 * back, else from its nodes. */
static pv_cluster_state cluster_state(gw_call *call, pv_redis *r, const pv_pod *p,
                                      const pv_node *nodes, size_t n) {
    int phase = upgrade_phase(call, r, p->id);
    if (phase == PV_UPGRADE_FAILED) return PV_CLUSTER_ERROR;
    if (phase > 0 && !pv_upgrade_phase_done(phase)) return PV_CLUSTER_UPGRADING;
    return pv_cluster_state_of(p, nodes, n);
}

/* A cluster as its message, with its nodes (for the status and the topology's ids). */
static int send_cluster(gw_call *call, pv_redis *r, const pv_pod *p, pv_status *st) {
    pv_node *nodes = NULL;
    size_t n = 0;
    if (pv_registry_list_nodes(r, keys_of(call), p->name, &nodes, &n, st) != PV_OK) return st->code;
    /* the first read that sees the cluster complete records it: from then on a missing node
     * makes it DEGRADED, never CREATING again */
    pv_pod formed = {0};
    if (p->formed_ms == 0 && pv_cluster_complete(p, nodes, n)) {
        pv_pod_update u = {
            .name = p->name, .cp_nodes = -1, .worker_nodes = -1, .mark_formed = true};
        pv_status fst;
        if (pv_registry_update_pod(r, keys_of(call), &u, &formed, &fst) == PV_OK)
            p = &formed;
        else
            pv_warn("cluster %s: recording that it formed: %s", p->name, fst.msg);
    }
    Pivirt__Cluster__V1__Cluster m = PIVIRT__CLUSTER__V1__CLUSTER__INIT;
    Pivirt__Cluster__V1__ClusterTopology topo = PIVIRT__CLUSTER__V1__CLUSTER_TOPOLOGY__INIT;
    Google__Protobuf__Timestamp created, updated;
    m.id = (char *)p->id;
    m.name = p->name;
    m.status = (Pivirt__Cluster__V1__ClusterStatus)cluster_state(call, r, p, nodes, n);
    m.version = p->version ? p->version : "";
    topo.control_plane_count = p->cp_nodes;
    topo.worker_count = p->worker_nodes;
    char **cps = n ? calloc(n, sizeof *cps) : NULL,
         **workers = n ? calloc(n, sizeof *workers) : NULL;
    for (size_t i = 0; cps && workers && i < n; i++) {
        if (nodes[i].role && strcmp(nodes[i].role, "control-plane") == 0)
            cps[topo.n_control_plane_nodes++] = nodes[i].id;
        else
            workers[topo.n_worker_nodes++] = nodes[i].id;
    }
    topo.control_plane_nodes = cps;
    topo.worker_nodes = workers;
    m.topology = &topo;
    json_t *lk = NULL, *ak = NULL;
    m.labels = (Pivirt__Cluster__V1__Cluster__LabelsEntry **)map_entries(
        p->labels, &pivirt__cluster__v1__cluster__labels_entry__descriptor, &lk, &m.n_labels);
    m.annotations = (Pivirt__Cluster__V1__Cluster__AnnotationsEntry **)map_entries(
        p->annotations, &pivirt__cluster__v1__cluster__annotations_entry__descriptor, &ak,
        &m.n_annotations);
    timestamp(&created, p->created_ms);
    timestamp(&updated, p->updated_ms);
    m.created_at = &created;
    m.updated_at = &updated;
    int rc = gw_call_send(call, &m.base) == 0 ? PV_OK : PV_CANCELLED;
    pv_pbmap_entries_free((void **)m.labels);
    pv_pbmap_entries_free((void **)m.annotations);
    json_decref(lk);
    json_decref(ak);
    free(cps);
    free(workers);
    pv_node_array_free(nodes, n);
    pv_pod_clear(&formed);
    return rc;
}

/* ---- clusters ---- */

static void on_create_cluster(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__CreateClusterRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    if (pv_validate_name("name", req->name, &st) != PV_OK ||
        pv_cluster_check_version("version", req->version, &st) != PV_OK)
        return finish_status(call, &st);
    int cp = req->topology ? req->topology->control_plane_count : 0;
    int workers = req->topology ? req->topology->worker_count : 0;
    if (pv_cluster_check_topology(cp, workers, &st) != PV_OK) return finish_status(call, &st);
    char *labels = map_json((void *const *)req->labels, req->n_labels);
    char *annotations = map_json((void *const *)req->annotations, req->n_annotations);
    pv_pod_spec spec = {.name = req->name,
                        .version = req->version,
                        .cp_nodes = cp,
                        .worker_nodes = workers,
                        .labels = labels,
                        .annotations = annotations};
    pv_pod p = {0};
    int rc = pv_registry_add_pod(r, keys_of(call), &spec, &p, &st);
    if (rc == PV_ALREADY_EXISTS)
        pv_status_set(&st, PV_ALREADY_EXISTS, "name: a cluster named %s already exists", req->name);
    if (rc == PV_OK) {
        pv_info("CreateCluster id=%s name=%s version=%s", p.id, p.name, p.version);
        rc = send_cluster(call, r, &p, &st);
    }
    gw_app_finish_stream(call, rc, &st);
    pv_pod_clear(&p);
    free(labels);
    free(annotations);
}

static void on_get_cluster(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__GetClusterRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = send_cluster(call, r, &p, &st);
    gw_app_finish_stream(call, rc, &st);
    pv_pod_clear(&p);
}

static void on_list_clusters(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__ListClustersRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *want = map_json((void *const *)req->labels, req->n_labels);
    pv_pod *pods = NULL;
    size_t n = 0;
    int rc = pv_registry_list_pods(r, keys_of(call), &pods, &n, &st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (!pv_cluster_labels_match(pods[i].labels, want)) continue;
        if (req->status != PIVIRT__CLUSTER__V1__CLUSTER_STATUS__CLUSTER_STATUS_UNSPECIFIED) {
            pv_node *nodes = NULL;
            size_t nn = 0;
            if ((rc = pv_registry_list_nodes(r, keys_of(call), pods[i].name, &nodes, &nn, &st)) !=
                PV_OK)
                break;
            pv_cluster_state s = cluster_state(call, r, &pods[i], nodes, nn);
            pv_node_array_free(nodes, nn);
            if ((int)s != (int)req->status) continue;
        }
        rc = send_cluster(call, r, &pods[i], &st);
    }
    gw_app_finish_stream(call, rc, &st);
    pv_pod_array_free(pods, n);
    free(want);
}

static void on_update_cluster(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__UpdateClusterRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0}, now = {0};
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK && req->name && *req->name && strcmp(req->name, p.name) != 0)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "name: a cluster's name is immutable (it is %s, not %s)", p.name,
                           req->name);
    if (rc == PV_OK && req->topology)
        rc = pv_cluster_check_topology(req->topology->control_plane_count,
                                       req->topology->worker_count, &st);
    char *labels = rc == PV_OK && (req->n_labels || req->update_labels)
                       ? map_json((void *const *)req->labels, req->n_labels)
                       : NULL;
    char *annotations = rc == PV_OK && (req->n_annotations || req->update_annotations)
                            ? map_json((void *const *)req->annotations, req->n_annotations)
                            : NULL;
    if (rc == PV_OK) {
        pv_pod_update u = {.name = p.name,
                           .labels = labels,
                           .annotations = annotations,
                           .cp_nodes = req->topology ? req->topology->control_plane_count : -1,
                           .worker_nodes = req->topology ? req->topology->worker_count : -1};
        rc = pv_registry_update_pod(r, keys_of(call), &u, &now, &st);
    }
    if (rc == PV_OK) rc = send_cluster(call, r, &now, &st);
    gw_app_finish_stream(call, rc, &st);
    free(labels);
    free(annotations);
    pv_pod_clear(&p);
    pv_pod_clear(&now);
}

/* ---- nodes ---- */

static void on_add_node(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__AddNodeRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_node n = {0};
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK) rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = pv_validate_name("name", req->name, &st);
    if (rc == PV_OK && req->role == PIVIRT__CLUSTER__V1__NODE_ROLE__NODE_ROLE_UNSPECIFIED)
        rc = pv_status_set(&st, PV_INVALID_ARGUMENT,
                           "role: required (NODE_ROLE_CONTROL_PLANE or NODE_ROLE_WORKER)");
    if (rc == PV_OK) rc = pv_cluster_check_ip("ip", req->ip, &st);
    char *labels = rc == PV_OK ? map_json((void *const *)req->labels, req->n_labels) : NULL;
    if (rc == PV_OK) {
        /* the node's resources come from its agent's report when it has one; until then the
         * node holds none, and its agent fills them in when it first beats */
        char *report = NULL;
        pv_status ist;
        const char *resources = "{}";
        char *defaults = NULL;
        if (pv_registry_get_engine_info(r, keys_of(call), req->name, &report, &ist) == PV_OK &&
            report) {
            pv_res_engine_info facts;
            if (pv_registry_engine_facts(report, &facts, &ist) == PV_OK) {
                pv_res_node res = {0};
                if (pv_res_node_parse(NULL, NULL, &facts, &res, &ist) == PV_OK &&
                    pv_res_node_resources_dump(&res, &defaults, &ist) == PV_OK)
                    resources = defaults;
                pv_res_node_free(&res);
            }
        }
        pv_node_spec spec = {.name = req->name,
                             .pod_name = p.name,
                             .role = req->role ==
                                             PIVIRT__CLUSTER__V1__NODE_ROLE__NODE_ROLE_CONTROL_PLANE
                                         ? "control-plane"
                                         : "worker",
                             .ip = req->ip,
                             .endpoint = "process://",
                             .labels = labels,
                             .resources = resources};
        rc = pv_registry_add_node(r, keys_of(call), &spec, &n, &st);
        if (rc == PV_ALREADY_EXISTS)
            pv_status_set(&st, PV_ALREADY_EXISTS, "name: a node named %s already exists",
                          req->name);
        free(report);
        free(defaults);
    }
    if (rc == PV_OK) {
        pv_info("AddNode cluster=%s node=%s role=%s ip=%s", p.name, n.name, n.role, n.ip);
        rc = send_node(call, &n) == 0 ? PV_OK : PV_CANCELLED;
    }
    gw_app_finish_stream(call, rc, &st);
    free(labels);
    pv_pod_clear(&p);
    pv_node_clear(&n);
}

static void on_get_node(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__GetNodeRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_node n = {0};
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = find_node(r, keys_of(call), &p, req->node_id, &n, &st);
    if (rc == PV_OK) rc = send_node(call, &n) == 0 ? PV_OK : PV_CANCELLED;
    gw_app_finish_stream(call, rc, &st);
    pv_pod_clear(&p);
    pv_node_clear(&n);
}

static void on_list_nodes(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__ListNodesRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK && req->cluster_id && *req->cluster_id)
        rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    char *want = map_json((void *const *)req->labels, req->n_labels);
    pv_node *nodes = NULL;
    size_t n = 0;
    if (rc == PV_OK) rc = pv_registry_list_nodes(r, keys_of(call), p.name, &nodes, &n, &st);
    json_t *upgrades = json_object(); /* each cluster's upgrade failures, read once */
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        node_msg m;
        json_t *up = upgrade_failures_of(call, upgrades, nodes[i].pod_id);
        node_fill(&nodes[i], node_state_now(call, &nodes[i], up), &m);
        bool keep = pv_cluster_labels_match(nodes[i].labels, want) &&
                    (req->role == PIVIRT__CLUSTER__V1__NODE_ROLE__NODE_ROLE_UNSPECIFIED ||
                     req->role == m.msg.role) &&
                    (req->status == PIVIRT__CLUSTER__V1__NODE_STATUS__NODE_STATUS_UNSPECIFIED ||
                     req->status == m.msg.status);
        if (keep && gw_call_send(call, &m.msg.base) != 0) rc = PV_CANCELLED;
        node_msg_free(&m);
    }
    json_decref(upgrades);
    gw_app_finish_stream(call, rc, &st);
    pv_node_array_free(nodes, n);
    pv_pod_clear(&p);
    free(want);
}

/* ---- health ---- */

static void on_get_health(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__GetHealthRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_health_report h = {0};
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = pv_cluster_health(r, keys_of(call), &p, &h, &st);
    if (rc != PV_OK) {
        finish_status(call, &st);
        pv_pod_clear(&p);
        return;
    }
    Pivirt__Cluster__V1__ClusterHealth m = PIVIRT__CLUSTER__V1__CLUSTER_HEALTH__INIT;
    m.cluster_id = (char *)p.id;
    m.status = (Pivirt__Cluster__V1__HealthStatus)h.status;
    m.message = h.message;
    size_t nc = h.ncomponents, nn = h.nnodes;
    Pivirt__Cluster__V1__ComponentHealth *cs = nc ? calloc(nc, sizeof *cs) : NULL;
    Pivirt__Cluster__V1__ComponentHealth **cps = nc ? calloc(nc, sizeof *cps) : NULL;
    Pivirt__Cluster__V1__NodeHealth *ns = nn ? calloc(nn, sizeof *ns) : NULL;
    Pivirt__Cluster__V1__NodeHealth **nps = nn ? calloc(nn, sizeof *nps) : NULL;
    Google__Protobuf__Timestamp *ts = calloc(nc + nn + 1, sizeof *ts);
    if ((nc && (!cs || !cps)) || (nn && (!ns || !nps)) || !ts) {
        gw_call_finish(call, PV_INTERNAL, "out of memory");
    } else {
        for (size_t i = 0; i < nc; i++) {
            pivirt__cluster__v1__component_health__init(&cs[i]);
            cs[i].name = h.components[i].name;
            cs[i].status = (Pivirt__Cluster__V1__HealthStatus)h.components[i].status;
            cs[i].message = h.components[i].message;
            timestamp(&ts[i], h.components[i].last_check_ms);
            cs[i].last_check = &ts[i];
            cps[i] = &cs[i];
        }
        for (size_t i = 0; i < nn; i++) {
            pivirt__cluster__v1__node_health__init(&ns[i]);
            ns[i].node_id = h.nodes[i].node_id;
            ns[i].node_name = h.nodes[i].name;
            ns[i].status = (Pivirt__Cluster__V1__HealthStatus)h.nodes[i].status;
            ns[i].message = h.nodes[i].message;
            timestamp(&ts[nc + i], h.nodes[i].last_check_ms);
            ns[i].last_check = &ts[nc + i];
            nps[i] = &ns[i];
        }
        m.n_components = nc;
        m.components = cps;
        m.n_nodes = nn;
        m.nodes = nps;
        gw_call_reply(call, &m.base);
    }
    PV_FREE(cs, cps, ns, nps, ts);
    pv_health_free(&h);
    pv_pod_clear(&p);
}

/* ---- metrics ---- */

static void on_get_metrics(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__GetMetricsRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_cluster_metrics mt;
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = pv_cluster_metrics_of(r, keys_of(call), &p, &mt, &st);
    if (rc != PV_OK) {
        finish_status(call, &st);
        pv_pod_clear(&p);
        return;
    }
    Pivirt__Cluster__V1__ClusterMetrics m = PIVIRT__CLUSTER__V1__CLUSTER_METRICS__INIT;
    Pivirt__Cluster__V1__NodeStatusCounts nodes = PIVIRT__CLUSTER__V1__NODE_STATUS_COUNTS__INIT;
    Pivirt__Cluster__V1__OperationStatusCounts ops =
        PIVIRT__CLUSTER__V1__OPERATION_STATUS_COUNTS__INIT;
    Google__Protobuf__Timestamp at;
    m.cluster_id = (char *)p.id;
    nodes.total = mt.nodes_total;
    nodes.ready = mt.nodes_ready;
    nodes.not_ready = mt.nodes_not_ready;
    nodes.cordoned = mt.nodes_cordoned;
    m.nodes = &nodes;
    m.cpu_cores = mt.cpu_cores;
    m.cpu_used_cores = mt.cpu_used_cores;
    m.memory_bytes = mt.memory;
    m.memory_used_bytes = mt.memory_used;
    m.storage_bytes = mt.storage;
    m.storage_used_bytes = mt.storage_used;
    m.workload_count = mt.workloads;
    ops.pending = mt.ops_pending;
    ops.running = mt.ops_running;
    ops.succeeded = mt.ops_succeeded;
    ops.failed = mt.ops_failed;
    ops.cancelled = mt.ops_cancelled;
    m.operations = &ops;
    m.queue_depth = mt.queue_depth;
    m.oldest_pending_age_seconds = mt.oldest_pending_age_s;
    timestamp(&at, mt.collected_ms);
    m.collected_at = &at;
    gw_call_reply(call, &m.base);
    pv_pod_clear(&p);
}

/* ---- node operations ---- */

/* How long a node operation is waited for before its Operation is answered as it stands:
 * cordoning takes one registry write, so a worker normally finishes it well within this. */
#define NODE_OP_WAIT_MS 5000

/* What an Operation-answering call submits. */
typedef struct op_req {
    const char *kind, *target;
    const char *const *holds;
    size_t n_holds;
    json_t *params; /* borrowed */
    bool wait;      /* answer once it ended (NODE_OP_WAIT_MS at most), else at once */
} op_req;

/* Submits the operation (idempotent by the call's x-request-id) and answers its record. */
static void answer_op(gw_call *call, const op_req *o) {
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *params = json_dumps(o->params, JSON_COMPACT);
    pv_op_submit_req req = {.kind = o->kind,
                            .target = o->target,
                            .queue = "ops",
                            .params_json = params,
                            .holds = o->holds,
                            .n_holds = o->n_holds,
                            .notify_end = o->wait};
    bool existed = false;
    pv_op sub = {0}, rec = {0};
    int rc = params ? gw_app_submit(call, GW_SUBMIT_IDEMPOTENT, &req, &sub, &existed, &st)
                    : pv_status_set(&st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) {
        pv_info("%s target=%s params=%s op=%s%s", o->kind, o->target, params, sub.id,
                existed ? " (existing, same x-request-id)" : "");
        if (o->wait)
            rc = op_convert_wait(call, r, keys_of(call), sub.id, NODE_OP_WAIT_MS, &rec, &st);
    }
    if (rc == PV_OK)
        op_convert_reply(call, o->wait ? &rec : &sub);
    else
        finish_status(call, &st);
    free(params);
    pv_op_clear(&sub);
    pv_op_clear(&rec);
}

/* A node operation's common part: the cluster and the node (of that cluster) the request
 * names, checked by check (may be NULL) before anything is submitted, then an Operation of
 * kind on the ops workers holding the node and its cluster, with params {node, cluster} and
 * extra's members; answered once it ended (wait: NODE_OP_WAIT_MS at most) or at once. */
typedef int (*node_check_fn)(gw_call *call, const void *req, const pv_pod *p, const pv_node *n,
                             pv_status *st);

static void node_op(gw_call *call, const char *cluster_id, const char *node_id, const char *kind,
                    json_t *extra, bool wait, node_check_fn check, const void *req) {
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_node n = {0};
    int rc = find_cluster(r, keys_of(call), "cluster_id", cluster_id, &p, &st);
    if (rc == PV_OK) rc = find_node(r, keys_of(call), &p, node_id, &n, &st);
    if (rc == PV_OK && check) rc = check(call, req, &p, &n, &st);
    if (rc == PV_OK) {
        json_t *params = json_pack("{s:s, s:s}", "node", n.name, "cluster", p.name);
        if (extra) json_object_update(params, extra);
        const char *holds[] = {p.id};
        op_req o = {kind, n.id, holds, 1, params, wait};
        answer_op(call, &o);
        json_decref(params);
    } else {
        finish_status(call, &st);
    }
    json_decref(extra);
    pv_pod_clear(&p);
    pv_node_clear(&n);
}

/* CordonNode and UncordonNode: node.cordon / node.uncordon (Eru's bypass), a registry write,
 * answered once done. */
static void on_cordon_node(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__CordonNodeRequest *req = (const void *)msg;
    node_op(call, req->cluster_id, req->node_id, PV_KIND_CORDON, NULL, true, NULL, NULL);
}

static void on_uncordon_node(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__UncordonNodeRequest *req = (const void *)msg;
    node_op(call, req->cluster_id, req->node_id, PV_KIND_UNCORDON, NULL, true, NULL, NULL);
}

/* "name (id12), ..." of up to 8 workloads, and how many more; labels_json filters. *count gets
 * how many there are. */
static int workloads_named(pv_redis *r, const pv_keys *k, const pv_node *nodes, size_t nn,
                           const char *labels_json, char *out, size_t cap, size_t *count,
                           pv_status *st) {
    size_t used = 0, shown = 0;
    *count = 0;
    out[0] = '\0';
    for (size_t i = 0; i < nn; i++) {
        pv_workload *w = NULL;
        size_t n = 0;
        if (pv_workload_list(r, k, NULL, NULL, nodes[i].name, labels_json, &w, &n, st) != PV_OK)
            return st->code;
        for (size_t j = 0; j < n; j++, (*count)++) {
            if (shown == 8 || used + 1 >= cap) continue;
            int m = snprintf(out + used, cap - used, "%s%s (%.12s) on %s", shown ? ", " : "",
                             w[j].name, w[j].id, nodes[i].name);
            if (m > 0) used += (size_t)m < cap - used ? (size_t)m : cap - used - 1;
            shown++;
        }
        pv_workload_array_free(w, n);
    }
    if (*count > shown && used + 1 < cap)
        snprintf(out + used, cap - used, " and %zu more", *count - shown);
    return PV_OK;
}

/* DrainNode's checks at the call: the grace, and daemons refuse it before anything moves. */
static int drain_check(gw_call *call, const void *msg, const pv_pod *p, const pv_node *n,
                       pv_status *st) {
    (void)p;
    const Pivirt__Cluster__V1__DrainNodeRequest *req = msg;
    if (req->grace_period_seconds < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "grace_period_seconds: %d is negative",
                             (int)req->grace_period_seconds);
    if (req->grace_period_seconds > 86400)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "grace_period_seconds: %d is more than a day (86400)",
                             (int)req->grace_period_seconds);
    if (req->ignore_daemonsets) return PV_OK;
    char names[400];
    size_t count = 0;
    if (workloads_named(gw_app_redis(call), keys_of(call), n, 1, "{\"pivirt.io/daemon\":\"true\"}",
                        names, sizeof names, &count, st) != PV_OK)
        return st->code;
    if (count > 0)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "node %s runs %zu daemon workload(s) (label pivirt.io/daemon=true): "
                             "%s; set ignore_daemonsets to leave them in place",
                             n->name, count, names);
    return PV_OK;
}

/* DrainNode: node.drain (workers/wk_cluster.h), answered at once. */
static void on_drain_node(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__DrainNodeRequest *req = (const void *)msg;
    json_t *extra =
        json_pack("{s:b, s:b, s:i}", "force", req->force, "ignore_daemonsets",
                  req->ignore_daemonsets, "grace_period_seconds", (int)req->grace_period_seconds);
    node_op(call, req->cluster_id, req->node_id, PV_KIND_DRAIN, extra, false, drain_check, req);
}

/* RemoveNode: node.remove (drain, then the record), answered at once. */
static void on_remove_node(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__RemoveNodeRequest *req = (const void *)msg;
    node_op(call, req->cluster_id, req->node_id, PV_KIND_NODE_REMOVE,
            json_pack("{s:b}", "force", req->force), false, NULL, NULL);
}

/* DeleteCluster: cluster.delete, holding the cluster and every node of it. Workloads would be
 * lost (no node of the cluster remains to take them): refused here unless force. */
/* An operation of kind on cluster p holding it and each of its nodes, with params (borrowed),
 * answered at once; or, rc not PV_OK, the failure st so far. */
static void answer_cluster_op(gw_call *call, int rc, const pv_status *st, const char *kind,
                              const pv_pod *p, const pv_node *nodes, size_t nn, json_t *params) {
    if (rc != PV_OK) {
        finish_status(call, st);
        return;
    }
    const char **holds = calloc(nn ? nn : 1, sizeof *holds);
    if (!holds || !params) {
        free(holds);
        gw_call_finish(call, PV_INTERNAL, "out of memory");
        return;
    }
    for (size_t i = 0; i < nn; i++)
        holds[i] = nodes[i].id;
    op_req o = {kind, p->id, holds, nn, params, false};
    answer_op(call, &o);
    free(holds);
}

static void on_delete_cluster(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__DeleteClusterRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_node *nodes = NULL;
    size_t nn = 0;
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = pv_registry_list_nodes(r, keys_of(call), p.name, &nodes, &nn, &st);
    if (rc == PV_OK && !req->force) {
        char names[400];
        size_t count = 0;
        rc = workloads_named(r, keys_of(call), nodes, nn, NULL, names, sizeof names, &count, &st);
        if (rc == PV_OK && count > 0)
            rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                               "cluster %s runs %zu workload(s), which would be lost: %s; remove "
                               "them first or set force",
                               p.name, count, names);
    }
    json_t *params =
        rc == PV_OK ? json_pack("{s:s, s:b}", "cluster", p.name, "force", req->force) : NULL;
    answer_cluster_op(call, rc, &st, PV_KIND_CLUSTER_DELETE, &p, nodes, nn, params);
    json_decref(params);
    pv_node_array_free(nodes, nn);
    pv_pod_clear(&p);
}

/* ---- upgrades ---- */

/* UpgradeCluster: cluster.upgrade on the ops workers (workers/wk_upgrade.h), holding the
 * cluster and every node, answered at once. */
static void on_upgrade_cluster(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__UpgradeClusterRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_node *nodes = NULL;
    size_t nn = 0;
    const Pivirt__Cluster__V1__UpgradeStrategy *s = req->strategy;
    pv_upgrade_strategy us = {
        .type = s && s->type ? (pv_upgrade_type)s->type : PV_UPGRADE_ROLLING,
        .max_surge = s ? s->max_surge : 0,
        .max_unavailable = s ? s->max_unavailable : 0,
        .partition = s ? s->partition : 0,
    };
    int rc = PV_OK; /* gw_server validated msg (enums, UTF-8) before this handler */
    if (rc == PV_OK) rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = pv_cluster_check_version("target_version", req->target_version, &st);
    if (rc == PV_OK) rc = pv_registry_list_nodes(r, keys_of(call), p.name, &nodes, &nn, &st);
    if (rc == PV_OK) rc = pv_upgrade_check_strategy(&us, nn, &st);
    /* ROLLING's default with no strategy at all: one node at a time, one replacement at once
     * (set after the check, which bounds what the client sent) */
    if (!s) us.max_surge = 1;
    if (rc == PV_OK && p.version && strcmp(p.version, req->target_version) == 0)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                           "target_version: cluster %s already runs %s", p.name, p.version);
    if (rc == PV_OK && (int64_t)nn <= (int64_t)us.partition)
        rc = pv_status_set(&st, PV_FAILED_PRECONDITION,
                           "cluster %s has no node to upgrade (%zu node(s), partition %d)", p.name,
                           nn, us.partition);
    json_t *params = NULL;
    if (rc == PV_OK) {
        const char *from = p.version ? p.version : "";
        if (pv_version_compare(req->target_version, from) < 0)
            pv_warn("UpgradeCluster cluster=%s: a downgrade, %s -> %s", p.name, from,
                    req->target_version);
        params = json_pack("{s:s, s:s, s:s, s:s, s:{s:i, s:i, s:i, s:i}}", "cluster", p.name,
                           "cluster_id", p.id, "from", from, "to", req->target_version, "strategy",
                           "type", (int)us.type, "max_surge", us.max_surge, "max_unavailable",
                           us.max_unavailable, "partition", us.partition);
    }
    answer_cluster_op(call, rc, &st, PV_KIND_UPGRADE, &p, nodes, nn, params);
    json_decref(params);
    pv_node_array_free(nodes, nn);
    pv_pod_clear(&p);
}

/* The record GetUpgradeStatus answers: the worker's, or, while the newest upgrade operation has
 * not written one yet, a PENDING one made from its parameters. NOT_FOUND: never upgraded. */
static int upgrade_record(gw_call *call, pv_redis *r, const pv_pod *p, const pv_node *nodes,
                          size_t nn, pv_upgrade_rec *out, pv_status *st) {
    int rc = pv_upgrade_get(r, keys_of(call), p->id, out, st);
    if (rc != PV_OK && rc != PV_NOT_FOUND) return rc;
    bool found = rc == PV_OK;
    pv_op_filter f = {.kind = PV_KIND_UPGRADE, .target = p->id, .status = PV_OP_ANY, .limit = 1};
    pv_op *ops = NULL;
    size_t n = 0;
    if (pv_op_list(r, keys_of(call), &f, &ops, &n, st) != PV_OK) {
        pv_upgrade_rec_free(out);
        return st->code;
    }
    const char *owner = out->operation_id;
    if (n == 1 && !pv_op_done(&ops[0]) && (!owner || strcmp(owner, ops[0].id) != 0)) {
        json_t *params = json_loads(ops[0].params, 0, NULL),
               *js = json_object_get(params, "strategy");
        pv_upgrade_strategy us = {
            .type = (pv_upgrade_type)json_integer_value(json_object_get(js, "type")),
            .max_surge = (int)json_integer_value(json_object_get(js, "max_surge")),
            .max_unavailable = (int)json_integer_value(json_object_get(js, "max_unavailable")),
            .partition = (int)json_integer_value(json_object_get(js, "partition"))};
        const char *from = json_string_value(json_object_get(params, "from"));
        const char *to = json_string_value(json_object_get(params, "to"));
        pv_upgrade_rec pending;
        if (pv_upgrade_new_record_of(ops[0].id, p->id, from ? from : "", to ? to : "", &us, nodes,
                                     nn, ops[0].created_ms, &pending) == 0) {
            pv_upgrade_rec_free(out);
            *out = pending;
            found = true;
        }
        json_decref(params);
    }
    pv_op_array_free(ops, n);
    return found ? PV_OK
                 : pv_status_set(st, PV_NOT_FOUND, "cluster %s has never been upgraded", p->name);
}

/* What a node reports as its version now ("" when nothing). */
static const char *reported_version(const pv_node *nodes, size_t nn, const char *name,
                                    json_t **keep) {
    for (size_t i = 0; i < nn; i++) {
        if (strcmp(nodes[i].name, name) != 0 || !nodes[i].engine_info) continue;
        *keep = json_loads(nodes[i].engine_info, 0, NULL);
        return pv_json_str(*keep, "version");
    }
    return "";
}

static void on_get_upgrade_status(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Cluster__V1__GetUpgradeStatusRequest *req = (const void *)msg;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_pod p = {0};
    pv_node *nodes = NULL;
    size_t nn = 0;
    pv_upgrade_rec rec = {0};
    int rc = find_cluster(r, keys_of(call), "cluster_id", req->cluster_id, &p, &st);
    if (rc == PV_OK) rc = pv_registry_list_nodes(r, keys_of(call), p.name, &nodes, &nn, &st);
    if (rc == PV_OK) rc = upgrade_record(call, r, &p, nodes, nn, &rec, &st);
    if (rc != PV_OK) {
        finish_status(call, &st);
        pv_node_array_free(nodes, nn);
        pv_pod_clear(&p);
        return;
    }
    Pivirt__Cluster__V1__UpgradeStatus m = PIVIRT__CLUSTER__V1__UPGRADE_STATUS__INIT;
    Pivirt__Cluster__V1__UpgradeStrategy strat = PIVIRT__CLUSTER__V1__UPGRADE_STRATEGY__INIT;
    Google__Protobuf__Timestamp started, updated, finished;
    m.cluster_id = rec.cluster_id;
    m.operation_id = rec.operation_id;
    m.phase = (Pivirt__Cluster__V1__UpgradePhase)rec.phase;
    m.from_version = rec.from;
    m.to_version = rec.to;
    strat.type = (Pivirt__Cluster__V1__UpgradeType)rec.strategy.type;
    strat.max_surge = rec.strategy.max_surge;
    strat.max_unavailable = rec.strategy.max_unavailable;
    strat.partition = rec.strategy.partition;
    m.strategy = &strat;
    m.message = rec.message;
    m.downgrade = rec.downgrade;
    size_t n = rec.n_nodes;
    Pivirt__Cluster__V1__NodeUpgradeStatus *ns = calloc(n ? n : 1, sizeof *ns);
    Pivirt__Cluster__V1__NodeUpgradeStatus **np = calloc(n ? n : 1, sizeof *np);
    Google__Protobuf__Timestamp *ts = calloc(2 * (n ? n : 1), sizeof *ts);
    json_t **infos = calloc(n ? n : 1, sizeof *infos);
    if (!ns || !np || !ts || !infos) n = 0;
    for (size_t i = 0; i < n; i++) {
        const pv_upgrade_node *x = &rec.nodes[i];
        pivirt__cluster__v1__node_upgrade_status__init(&ns[i]);
        ns[i].node_id = x->id;
        ns[i].node_name = x->name;
        ns[i].state = (Pivirt__Cluster__V1__NodeUpgradeState)x->state;
        ns[i].message = x->message;
        ns[i].batch = x->batch;
        ns[i].version = (char *)reported_version(nodes, nn, ns[i].node_name, &infos[i]);
        if (x->started_ms) {
            timestamp(&ts[2 * i], x->started_ms);
            ns[i].started_at = &ts[2 * i];
        }
        if (x->finished_ms) {
            timestamp(&ts[2 * i + 1], x->finished_ms);
            ns[i].finished_at = &ts[2 * i + 1];
        }
        np[i] = &ns[i];
        if (ns[i].batch > 0) {
            m.nodes_total++;
            m.nodes_upgraded += strcmp(ns[i].version, m.to_version) == 0;
        }
    }
    m.nodes = np;
    m.n_nodes = n;
    timestamp(&started, rec.started_ms);
    timestamp(&updated, rec.updated_ms);
    m.started_at = &started;
    m.updated_at = &updated;
    if (rec.finished_ms) {
        timestamp(&finished, rec.finished_ms);
        m.finished_at = &finished;
    }
    gw_call_reply(call, &m.base);
    for (size_t i = 0; infos && i < n; i++)
        json_decref(infos[i]);
    PV_FREE(infos, ns, np, ts);
    pv_upgrade_rec_free(&rec);
    pv_node_array_free(nodes, nn);
    pv_pod_clear(&p);
}

int svc_cluster_register(svc_cluster *s, gw_server *server) {
    /* every ClusterService method reads Redis */
#define M(name, kind, req, fn)                                                                     \
    { name, kind, &pivirt__cluster__v1__##req##__descriptor, fn, true }
    static const gw_method_spec k[] = {
        M("CreateCluster", GW_UNARY, create_cluster_request, on_create_cluster),
        M("GetCluster", GW_UNARY, get_cluster_request, on_get_cluster),
        M("ListClusters", GW_SERVER_STREAM, list_clusters_request, on_list_clusters),
        M("UpdateCluster", GW_UNARY, update_cluster_request, on_update_cluster),
        M("AddNode", GW_UNARY, add_node_request, on_add_node),
        M("GetNode", GW_UNARY, get_node_request, on_get_node),
        M("ListNodes", GW_SERVER_STREAM, list_nodes_request, on_list_nodes),
        M("CordonNode", GW_UNARY, cordon_node_request, on_cordon_node),
        M("GetHealth", GW_UNARY, get_health_request, on_get_health),
        M("GetMetrics", GW_UNARY, get_metrics_request, on_get_metrics),
        M("UncordonNode", GW_UNARY, uncordon_node_request, on_uncordon_node),
        M("DrainNode", GW_UNARY, drain_node_request, on_drain_node),
        M("RemoveNode", GW_UNARY, remove_node_request, on_remove_node),
        M("DeleteCluster", GW_UNARY, delete_cluster_request, on_delete_cluster),
        M("UpgradeCluster", GW_UNARY, upgrade_cluster_request, on_upgrade_cluster),
        M("GetUpgradeStatus", GW_UNARY, get_upgrade_status_request, on_get_upgrade_status),
    };
#undef M
    return gw_server_add_service(server, "pivirt.cluster.v1.ClusterService", k,
                                 sizeof k / sizeof k[0], s, s->methods, s->paths);
}
