/*
 * svc_core: pb.CoreRPC handlers.
 *
 * Info reports the build (version, git revision, build time, compiler, OS/arch) and the
 * instance identifier: the SHA-256 of the store settings, as Eru does, so two gateways on the
 * same Redis report the same identifier and a client can tell it talks to one system.
 *
 * WatchServiceStatus streams the live set of gateway addresses. The set comes from the
 * gateways' presence keys in Redis, read on the presence thread after each heartbeat and pushed
 * to every open stream; a new stream gets the last known set at once. Errors carry Eru's code
 * for the call (1001).
 *
 * Pods and nodes (AddPod ... GetNodeStatus) are thin: the records, their checks and their
 * atomic changes live in shared/pv_registry; a handler turns the request into a registry call
 * and the record into the pb message. Every failure answers the call's own Eru code (1021 for
 * AddPod, ...), the registry's message naming the cause, as Eru's clients expect.
 *
 * Engine info: Eru asks a node's engine; here the node's agent reports it into Redis on every
 * beat (pv_registry_set_engine_info), so Node.info and GetNodeEngineInfo read the report and no
 * call waits on an engine. The resource arithmetic (AddNode's defaults from that report,
 * SetNode's delta and its check against usage) is the plugins' (shared/pv_res); SetNode writes
 * its result only while the usage it was checked against is still the node's (usage_rev).
 *
 * NodeStatusStream: the calls wait in a gw_watchers set that gw_node_watch (one liveness
 * follower per gateway) pushes to.
 */
#include "svc_core.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "gw_node_watch.h"
#include "gw_watchers.h"
#include "pb/core.pb-c.h"
#include "pv_log.h"
#include "pv_pem.h"
#include "pv_presence.h"
#include "pv_registry.h"
#include "pv_res.h"
#include "pv_status.h"
#include "pv_validate.h"
#include "pv_version.h"
#include "pv_workload.h"
#include "svc_eru.h"

#define N_METHODS 15

struct svc_core {
    gw_app *app;
    char os_arch[72];
    gw_watchers *watchers;
    pthread_mutex_t mu;
    char **addresses; /* last known live set, under mu */
    size_t n_addresses;
    gw_watchers *node_watchers; /* NodeStatusStream calls */
    gw_node_watch *status;
    gw_method methods[N_METHODS];
};

static const char *go_arch(const char *machine) {
    /* Eru reports Go's GOOS/GOARCH; clients compare these names. */
    if (strcmp(machine, "x86_64") == 0) return "amd64";
    if (strcmp(machine, "aarch64") == 0) return "arm64";
    if (strcmp(machine, "i686") == 0 || strcmp(machine, "i386") == 0) return "386";
    return machine;
}

svc_core *svc_core_new(gw_app *app) {
    svc_core *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->app = app;
    s->watchers = gw_watchers_new();
    s->node_watchers = gw_watchers_new();
    if (!s->watchers || !s->node_watchers) {
        gw_watchers_free(s->watchers);
        gw_watchers_free(s->node_watchers);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    struct utsname u;
    if (uname(&u) == 0) {
        char os[32];
        snprintf(os, sizeof os, "%.31s", u.sysname);
        for (char *p = os; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
        snprintf(s->os_arch, sizeof s->os_arch, "%.31s/%.31s", os, go_arch(u.machine));
    } else {
        snprintf(s->os_arch, sizeof s->os_arch, "unknown");
    }
    return s;
}

static void free_addresses(char **a, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(a[i]);
    free(a);
}

void svc_core_free(svc_core *s) {
    if (!s) return;
    gw_node_watch_free(s->status);
    gw_watchers_free(s->watchers);
    gw_watchers_free(s->node_watchers);
    free_addresses(s->addresses, s->n_addresses);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void on_info(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    svc_core *s = gw_call_method_data(call);
    Pb__CoreInfo info = PB__CORE_INFO__INIT;
    info.version = PV_VERSION;
    info.revison = PV_GIT_REVISION;
    info.build_at = PV_BUILD_TIME;
    info.golang_version = "gcc " __VERSION__;
    info.os_arch = s->os_arch;
    info.identifier = s->app->identifier;
    gw_call_reply(call, &info.base);
}

/* Builds a ServiceStatus from the current set; the strings stay owned by s (caller holds mu). */
static void status_locked(svc_core *s, Pb__ServiceStatus *st) {
    pb__service_status__init(st);
    st->addresses = s->addresses;
    st->n_addresses = s->n_addresses;
    /* The next push comes within one heartbeat; twice that tolerates one late beat. */
    st->interval_in_second = 2 * s->app->cfg.gateway.heartbeat_seconds;
}

static void on_watch_service_status(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    svc_core *s = gw_call_method_data(call);
    Pb__ServiceStatus st;
    pthread_mutex_lock(&s->mu);
    status_locked(s, &st);
    gw_call_send(call, &st.base);
    pthread_mutex_unlock(&s->mu);
    if (gw_watchers_add(s->watchers, call) != 0)
        gw_call_finish(call, ERU_WATCH_SERVICE_STATUS, "WatchServiceStatus: client gone");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Extracts the "addr" of each presence document; unique and sorted so clients see a stable set. */
static size_t addresses_from(char **values, size_t n, char **out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_loads(values[i], 0, NULL);
        const char *addr = j ? json_string_value(json_object_get(j, "addr")) : NULL;
        if (addr && *addr) out[k++] = strdup(addr);
        json_decref(j);
    }
    qsort(out, k, sizeof *out, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++) {
        if (u > 0 && strcmp(out[u - 1], out[i]) == 0)
            free(out[i]);
        else
            out[u++] = out[i];
    }
    return u;
}

void svc_core_presence_tick(void *arg, pv_redis *r) {
    svc_core *s = arg;
    char **values = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_presence_list(r, &s->app->keys, "gateway", &values, &n, &st) != PV_OK) {
        pv_warn("WatchServiceStatus: cannot read the live gateways: %s", st.msg);
        return;
    }
    char **addrs = calloc(n ? n : 1, sizeof *addrs);
    if (!addrs) {
        pv_presence_values_free(values, n);
        return;
    }
    size_t k = addresses_from(values, n, addrs);
    pv_presence_values_free(values, n);

    Pb__ServiceStatus msg;
    pthread_mutex_lock(&s->mu);
    free_addresses(s->addresses, s->n_addresses);
    s->addresses = addrs;
    s->n_addresses = k;
    status_locked(s, &msg);
    gw_watchers_broadcast(s->watchers, &msg.base);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------------------------------- */
/* request and record conversion                                                             */

static int fail_oom(pv_status *st) {
    return pv_status_set(st, PV_INTERNAL, "out of memory");
}

/* Whether every wanted label is on the node with the same value. */
static bool labels_match(const pv_node *n, void *const *want, size_t n_want) {
    return svc_eru_labels_match(n->labels, want, n_want);
}

/* A pb.Node and what it points to. The strings of the pv_node are borrowed. */
typedef struct node_msg {
    Pb__Node msg;
    Pb__Node__LabelsEntry *entries;
    Pb__Node__LabelsEntry **ptrs;
    json_t *labels;
    char *info;
    char *capacity, *usage; /* Eru's documents (pv_res_node_eru_dump) */
} node_msg;

static void node_msg_free(node_msg *m) {
    free(m->entries);
    free(m->ptrs);
    json_decref(m->labels);
    free(m->info);
    free(m->capacity);
    free(m->usage);
    memset(m, 0, sizeof *m);
}

/* The agent's engine report as a JSON object (an empty one when there is none or it is not
 * readable: the report is advice, the record is the truth). NULL when out of memory. */
static json_t *engine_report(const pv_node *n) {
    json_t *j = n->engine_info && *n->engine_info ? json_loads(n->engine_info, 0, NULL) : NULL;
    if (json_is_object(j)) return j;
    json_decref(j);
    return json_object();
}

/* Node.info: the agent's report with what the registry knows on top (its fields win, so a
 * report never contradicts the record). */
static char *node_info(const pv_node *n) {
    json_t *j = engine_report(n);
    json_t *reg = json_pack("{s:s, s:s, s:s, s:s, s:b}", "engine", n->engine, "id", n->id, "role",
                            n->role, "ip", n->ip, "alive", n->alive);
    char *text = NULL;
    if (j && reg && json_object_update(j, reg) == 0)
        text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(reg);
    json_decref(j);
    return text;
}

/* Node.resource_capacity and resource_usage in the shape Eru's plugins answer, whatever form the
 * record holds (given documents, defaults materialised, internal usage). A record the plugins
 * cannot read is shown as it is (the record is the truth; GetNodeResource names the fault). */
static int node_resource_docs(node_msg *m, const pv_node *n, pv_status *st) {
    pv_status pst;
    if (pv_res_eru_docs(n->resources, n->usage, &m->capacity, &m->usage, &pst) == PV_OK) {
        m->msg.resource_capacity = m->capacity;
        m->msg.resource_usage = m->usage;
        return PV_OK;
    }
    if (pst.code == PV_RESOURCE_EXHAUSTED) return fail_oom(st);
    pv_warn("node %s: resources shown as recorded: %s", n->name, pst.msg);
    m->msg.resource_capacity = n->resources;
    m->msg.resource_usage = n->usage;
    return PV_OK;
}

static int node_msg_fill(node_msg *m, const pv_node *n, bool with_info, pv_status *st) {
    memset(m, 0, sizeof *m);
    pb__node__init(&m->msg);
    m->msg.name = n->name;
    m->msg.endpoint = n->endpoint;
    m->msg.podname = n->pod_name;
    m->msg.available = n->alive;
    m->msg.bypass = n->bypass;
    if (node_resource_docs(m, n, st) != PV_OK) return st->code;
    if (with_info && !(m->info = node_info(n))) return fail_oom(st);
    if (m->info) m->msg.info = m->info;
    m->labels = json_loads(n->labels, 0, NULL);
    size_t count = json_is_object(m->labels) ? json_object_size(m->labels) : 0;
    if (count == 0) return PV_OK;
    m->entries = calloc(count, sizeof *m->entries);
    m->ptrs = calloc(count, sizeof *m->ptrs);
    if (!m->entries || !m->ptrs) return fail_oom(st);
    const char *key;
    json_t *v;
    size_t i = 0;
    json_object_foreach(m->labels, key, v) {
        if (!json_is_string(v)) continue; /* the record is the truth: show what is readable */
        pb__node__labels_entry__init(&m->entries[i]);
        m->entries[i].key = (char *)key;
        m->entries[i].value = (char *)json_string_value(v);
        m->ptrs[i] = &m->entries[i];
        i++;
    }
    m->msg.labels = m->ptrs;
    m->msg.n_labels = i;
    return PV_OK;
}

static void reply_node(gw_call *call, const pv_node *n, bool with_info, int eru) {
    node_msg m;
    pv_status st;
    if (node_msg_fill(&m, n, with_info, &st) == PV_OK)
        gw_call_reply(call, &m.msg.base);
    else
        gw_call_finishf(call, eru, "%s", st.msg);
    node_msg_free(&m);
}

static void reply_pod(gw_call *call, const pv_pod *p) {
    Pb__Pod msg = PB__POD__INIT;
    msg.name = p->name;
    msg.desc = p->desc;
    gw_call_reply(call, &msg.base);
}

static void reply_empty(gw_call *call) {
    Pb__Empty e = PB__EMPTY__INIT;
    gw_call_reply(call, &e.base);
}

/* Ends the call with the Eru code of the method and the cause. */
static void fail(gw_call *call, int eru, const pv_status *st) {
    gw_call_finishf(call, eru, "%s", st->msg);
}

static const pv_keys *keys_of(gw_call *call) {
    svc_core *s = gw_call_method_data(call);
    return &s->app->keys;
}

/* ---------------------------------------------------------------------------------------- */
/* pods                                                                                       */

static void on_add_pod(gw_call *call, const ProtobufCMessage *req) {
    const Pb__AddPodOptions *o = (const Pb__AddPodOptions *)req;
    pv_redis *r = gw_app_redis(call);
    /* A pod is a cluster at the control plane's own version, with no topology to wait for. */
    pv_pod_spec spec = {.name = o->name, .desc = o->desc, .version = PV_VERSION};
    pv_pod p;
    pv_status st;
    if (pv_registry_add_pod(r, keys_of(call), &spec, &p, &st) != PV_OK) {
        fail(call, ERU_ADD_POD, &st);
        return;
    }
    pv_info("AddPod name=%s id=%s", p.name, p.id);
    reply_pod(call, &p);
    pv_pod_clear(&p);
}

static void on_remove_pod(gw_call *call, const ProtobufCMessage *req) {
    const Pb__RemovePodOptions *o = (const Pb__RemovePodOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    if (pv_registry_remove_pod(r, keys_of(call), o->name, &st) != PV_OK) {
        fail(call, ERU_REMOVE_POD, &st);
        return;
    }
    pv_info("RemovePod name=%s", o->name);
    reply_empty(call);
}

static void on_get_pod(gw_call *call, const ProtobufCMessage *req) {
    const Pb__GetPodOptions *o = (const Pb__GetPodOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_pod p;
    pv_status st;
    if (pv_registry_get_pod(r, keys_of(call), PV_REG_BY_NAME, o->name, &p, &st) != PV_OK) {
        fail(call, ERU_GET_POD, &st);
        return;
    }
    reply_pod(call, &p);
    pv_pod_clear(&p);
}

static void on_list_pods(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    pv_redis *r = gw_app_redis(call);
    pv_pod *pods = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_registry_list_pods(r, keys_of(call), &pods, &n, &st) != PV_OK) {
        fail(call, ERU_LIST_PODS, &st);
        return;
    }
    Pb__Pod *msgs = calloc(n ? n : 1, sizeof *msgs);
    Pb__Pod **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    if (!msgs || !ptrs) {
        gw_call_finish(call, ERU_LIST_PODS, "out of memory");
    } else {
        for (size_t i = 0; i < n; i++) {
            pb__pod__init(&msgs[i]);
            msgs[i].name = pods[i].name;
            msgs[i].desc = pods[i].desc;
            ptrs[i] = &msgs[i];
        }
        Pb__Pods out = PB__PODS__INIT;
        out.pods = ptrs;
        out.n_pods = n;
        gw_call_reply(call, &out.base);
    }
    free(msgs);
    free(ptrs);
    pv_pod_array_free(pods, n);
}

/* ---------------------------------------------------------------------------------------- */
/* nodes                                                                                      */

/* Stand-in engine facts for checking given documents when no report exists: large enough that
 * no given field (numa-cpu naming high core ids, large numa-memory) is refused because of them. */
static const pv_res_engine_info k_standin = {
    .cpu_count = 1024, .mem_total = INT64_C(1) << 50, .storage_total = INT64_C(1) << 50};

/* The resources AddNode stores for node (*out, caller frees). As Eru reads a node's capacity from
 * its engine, what the request leaves out (everything, or cpu, memory, storage) takes the
 * plugins' defaults from the engine info the node's agent reports, and the complete object is
 * stored (pv_res_node_resources_dump): the node's capacity stays what it was when added, whatever
 * the agent reports later. Without a report the request must describe the node on its own. The
 * given documents are checked first either way, so a bad field is named as such. */
static int add_node_resources(pv_redis *r, const pv_keys *k, const char *node, const char *given,
                              char **out, pv_status *st) {
    *out = NULL;
    char *report = NULL;
    pv_res_engine_info info;
    int rc = pv_registry_get_engine_info(r, k, node, &report, st);
    if (rc == PV_OK) rc = pv_registry_engine_facts(report, &info, st);
    free(report);
    if (rc != PV_OK && rc != PV_NOT_FOUND) return rc;
    if (rc == PV_NOT_FOUND) {
        if (pv_registry_check_resources_with(given, &k_standin, st) != PV_OK) return st->code;
        if (!pv_registry_resources_complete(given))
            return pv_status_set(st, PV_FAILED_PRECONDITION,
                                 "no agent has reported engine info for node %s: start its agent "
                                 "(pivirt-worker --set worker.node=%s) or give resources (cpumem "
                                 "with cpu and memory)",
                                 node, node);
        return (*out = strdup(given)) ? PV_OK : fail_oom(st);
    }
    if (pv_registry_check_resources_with(given, &info, st) != PV_OK) return st->code;
    pv_res_node parsed;
    memset(&parsed, 0, sizeof parsed);
    rc = pv_res_node_parse(given, NULL, &info, &parsed, st);
    if (rc == PV_OK) rc = pv_res_node_resources_dump(&parsed, out, st);
    pv_res_node_free(&parsed);
    return rc;
}

/* A node's engine TLS material (Eru's ca, cert, key): PEM that a TLS client could load, or none.
 * Stored apart from the record (pv_registry.h: node-tls), never answered nor logged; the node's
 * agent uses it for a tcp:// docker daemon when its configuration has no worker.tls_*. */
static int check_tls(const char *ca, const char *cert, const char *key, pv_status *st) {
    if (pv_pem_check_certs("ca", ca, st) != PV_OK ||
        pv_pem_check_certs("cert", cert, st) != PV_OK || pv_pem_check_key("key", key, st) != PV_OK)
        return st->code;
    return pv_pem_check_pair("cert", cert, "key", key, st);
}

static void on_add_node(gw_call *call, const ProtobufCMessage *req) {
    const Pb__AddNodeOptions *o = (const Pb__AddNodeOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *labels = NULL, *given = NULL, *resources = NULL;
    /* The name first: it keys the engine report looked up next. */
    if (pv_validate_name("nodename", o->nodename, &st) != PV_OK ||
        check_tls(o->ca, o->cert, o->key, &st) != PV_OK ||
        svc_eru_labels_json("labels", (void *const *)o->labels, o->n_labels, &labels, &st) !=
            PV_OK ||
        svc_eru_resources_json("resources", (void *const *)o->resources, o->n_resources, &given,
                               &st) != PV_OK ||
        add_node_resources(r, keys_of(call), o->nodename, given, &resources, &st) != PV_OK) {
        free(labels);
        free(given);
        fail(call, ERU_ADD_NODE, &st);
        return;
    }
    free(given);
    pv_node_spec spec = {.name = o->nodename,
                         .pod_name = o->podname,
                         .endpoint = o->endpoint,
                         .labels = labels,
                         .resources = resources,
                         .tls_ca = o->ca,
                         .tls_cert = o->cert,
                         .tls_key = o->key};
    pv_node n;
    int rc = pv_registry_add_node(r, keys_of(call), &spec, &n, &st);
    free(labels);
    free(resources);
    if (rc != PV_OK) {
        fail(call, ERU_ADD_NODE, &st);
        return;
    }
    pv_info("AddNode name=%s pod=%s endpoint=%s engine=%s id=%s", n.name, n.pod_name, n.endpoint,
            n.engine, n.id);
    reply_node(call, &n, true, ERU_ADD_NODE);
    pv_node_clear(&n);
}

static void on_remove_node(gw_call *call, const ProtobufCMessage *req) {
    const Pb__RemoveNodeOptions *o = (const Pb__RemoveNodeOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    if (pv_registry_remove_node(r, keys_of(call), o->nodename, &st) != PV_OK) {
        fail(call, ERU_REMOVE_NODE, &st);
        return;
    }
    pv_info("RemoveNode name=%s", o->nodename);
    reply_empty(call);
}

static void on_get_node(gw_call *call, const ProtobufCMessage *req) {
    /* Eru's GetNode looks the node up by name alone; its labels are not a filter. */
    const Pb__GetNodeOptions *o = (const Pb__GetNodeOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_node n;
    pv_status st;
    if (pv_registry_get_node(r, keys_of(call), PV_REG_BY_NAME, o->nodename, &n, &st) != PV_OK) {
        fail(call, ERU_GET_NODE, &st);
        return;
    }
    reply_node(call, &n, true, ERU_GET_NODE);
    pv_node_clear(&n);
}

static void on_get_node_engine_info(gw_call *call, const ProtobufCMessage *req) {
    const Pb__GetNodeOptions *o = (const Pb__GetNodeOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_node n;
    pv_status st;
    if (pv_registry_get_node(r, keys_of(call), PV_REG_BY_NAME, o->nodename, &n, &st) != PV_OK) {
        fail(call, ERU_GET_NODE_STATUS, &st);
        return;
    }
    /* The report's type when the agent has sent one (it is the engine that answers Eru's
     * call), else the one the endpoint selects. pb.Engine has no other field. */
    json_t *report = engine_report(&n);
    const char *type = json_string_value(json_object_get(report, "type"));
    Pb__Engine e = PB__ENGINE__INIT;
    e.type = type && *type ? (char *)type : n.engine;
    gw_call_reply(call, &e.base);
    json_decref(report);
    pv_node_clear(&n);
}

static void on_list_pod_nodes(gw_call *call, const ProtobufCMessage *req) {
    /* timeout_in_second bounds Eru's engine round trip for the info. Here the info is the
     * agent's report, read from Redis with the node records in the same call, so there is no
     * engine round trip to bound: the field is accepted and has nothing to do. */
    const Pb__ListNodesOptions *o = (const Pb__ListNodesOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_node *nodes = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_registry_list_nodes(r, keys_of(call), o->podname, &nodes, &n, &st) != PV_OK) {
        fail(call, ERU_LIST_POD_NODES, &st);
        return;
    }
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        if (!o->all && pv_node_down(&nodes[i])) continue;
        if (!labels_match(&nodes[i], (void *const *)o->labels, o->n_labels)) continue;
        node_msg m;
        if (node_msg_fill(&m, &nodes[i], !o->skip_info, &st) != PV_OK) {
            gw_call_finishf(call, ERU_LIST_POD_NODES, "%s", st.msg);
            ok = false;
        } else if (gw_call_send(call, &m.msg.base) != 0) {
            ok = false; /* the client has gone */
        }
        node_msg_free(&m);
    }
    if (ok) gw_call_finish(call, PV_OK, NULL);
    pv_node_array_free(nodes, n);
}

/* How often SetNode re-reads a node whose usage a reservation changed under it. */
#define SET_NODE_ATTEMPTS 5

/* The resources SetNode writes over cur's (*out, caller frees). With delta: the current ones plus
 * given (Eru's delta; the plugins refuse a result below zero or below the usage). Without: given
 * as it is, refused when it is below what the node uses (the same check, on a zero delta). */
static int set_node_resources(const pv_node *cur, const char *given, bool delta, char **out,
                              pv_status *st) {
    *out = NULL;
    int rc;
    if (delta) {
        rc = pv_res_node_delta(cur->resources, given, cur->usage, out, st);
    } else {
        char *unchanged = NULL;
        rc = pv_res_node_delta(given, "{}", cur->usage, &unchanged, st);
        free(unchanged);
        if (rc == PV_OK && !(*out = strdup(given))) rc = fail_oom(st);
    }
    if (rc != PV_OK) {
        free(*out);
        *out = NULL;
        return pv_status_prefix(st, "resources of node %s", cur->name);
    }
    return PV_OK;
}

/* pv_registry_set_node, with resources (given, NULL = keep) computed against the node's usage
 * and written only while that usage is still the node's: a reservation that changes it in
 * between makes the write fail (ABORTED), and the node is read again. */
static int update_node(pv_redis *r, const pv_keys *k, pv_node_update *u, const char *given,
                       bool delta, pv_node *out, pv_status *st) {
    if (!given) return pv_registry_set_node(r, k, u, out, st);
    if (!delta && pv_registry_check_resources(given, st) != PV_OK) return st->code;
    for (int attempt = 0; attempt < SET_NODE_ATTEMPTS; attempt++) {
        pv_node cur;
        if (pv_registry_get_node(r, k, PV_REG_BY_NAME, u->name, &cur, st) != PV_OK) return st->code;
        char *resources = NULL;
        int rc = set_node_resources(&cur, given, delta, &resources, st);
        if (rc == PV_OK) {
            u->resources = resources;
            u->check_usage_rev = true;
            u->usage_rev = cur.usage_rev;
            rc = pv_registry_set_node(r, k, u, out, st);
            u->resources = NULL;
        }
        free(resources);
        pv_node_clear(&cur);
        if (rc != PV_ABORTED) return rc;
    }
    return pv_status_set(st, PV_ABORTED,
                         "node %s: its usage changed %d times while SetNode computed its "
                         "resources; try again",
                         u->name, SET_NODE_ATTEMPTS);
}

static void on_set_node(gw_call *call, const ProtobufCMessage *req) {
    const Pb__SetNodeOptions *o = (const Pb__SetNodeOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *labels = NULL, *resources = NULL;
    if (check_tls(o->ca, o->cert, o->key, &st) != PV_OK ||
        (o->n_labels > 0 && svc_eru_labels_json("labels", (void *const *)o->labels, o->n_labels,
                                                &labels, &st) != PV_OK) ||
        (o->n_resources > 0 && svc_eru_resources_json("resources", (void *const *)o->resources,
                                                      o->n_resources, &resources, &st) != PV_OK)) {
        free(labels);
        fail(call, ERU_SET_NODE, &st);
        return;
    }
    /* Eru replaces the labels when the request carries some, and keeps them otherwise. */
    pv_node_update u = {.name = o->nodename,
                        .endpoint = o->endpoint,
                        .labels = labels,
                        .labels_merge = false,
                        .bypass = (pv_tri)o->bypass,
                        .tls_ca = o->ca,
                        .tls_cert = o->cert,
                        .tls_key = o->key};
    pv_node n;
    int rc = update_node(r, keys_of(call), &u, resources, o->delta, &n, &st);
    free(labels);
    free(resources);
    if (rc != PV_OK) {
        fail(call, ERU_SET_NODE, &st);
        return;
    }
    if (o->workloads_down) {
        /* Eru marks every workload of the node not running and not healthy, keeping their TTLs;
         * WorkloadStatusStream followers see each change. */
        size_t marked = 0;
        if (pv_workload_mark_node_down(r, keys_of(call), n.name, &marked, &st) != PV_OK) {
            fail(call, ERU_SET_NODE, &st);
            pv_node_clear(&n);
            return;
        }
        pv_info("SetNode name=%s workloads_down: %zu workload(s) marked down", n.name, marked);
    }
    pv_info("SetNode name=%s bypass=%d endpoint=%s", n.name, (int)n.bypass, n.endpoint);
    reply_node(call, &n, true, ERU_SET_NODE);
    pv_node_clear(&n);
}

/* ---------------------------------------------------------------------------------------- */
/* liveness                                                                                   */

static void on_set_node_status(gw_call *call, const ProtobufCMessage *req) {
    const Pb__SetNodeStatusOptions *o = (const Pb__SetNodeStatusOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    if (pv_registry_set_alive(r, keys_of(call), o->nodename, (long long)o->ttl, NULL, &st) !=
        PV_OK) {
        fail(call, ERU_SET_NODE_STATUS, &st);
        return;
    }
    reply_empty(call);
}

static void on_get_node_status(gw_call *call, const ProtobufCMessage *req) {
    const Pb__GetNodeStatusOptions *o = (const Pb__GetNodeStatusOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    bool alive = false;
    char *pod = NULL;
    if (pv_registry_get_alive(r, keys_of(call), o->nodename, &alive, &pod, &st) != PV_OK) {
        fail(call, ERU_GET_NODE_STATUS, &st);
        return;
    }
    if (!alive) { /* Eru reads the status key, and a missing key is its error, not "not alive" */
        free(pod);
        pv_status_set(&st, PV_NOT_FOUND,
                      "node status of %s not found: never set, or its ttl ran out", o->nodename);
        fail(call, ERU_GET_NODE_STATUS, &st);
        return;
    }
    Pb__NodeStatusStreamMessage m = PB__NODE_STATUS_STREAM_MESSAGE__INIT;
    m.nodename = o->nodename;
    m.podname = pod;
    m.alive = alive;
    gw_call_reply(call, &m.base);
    free(pod);
}

static void on_node_status_stream(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    svc_core *s = gw_call_method_data(call);
    if (gw_watchers_add(s->node_watchers, call) != 0)
        gw_call_finish(call, PV_CANCELLED, "NodeStatusStream: client gone");
}

/* ---------------------------------------------------------------------------------------- */
/* registration                                                                               */

static void on_shutdown(void *arg) {
    svc_core *s = arg;
    gw_watchers_finish_all(s->watchers, NULL, PV_UNAVAILABLE, "gateway shutting down");
    gw_node_watch_stop(s->status);
    gw_watchers_finish_all(s->node_watchers, NULL, PV_UNAVAILABLE, "gateway shutting down");
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/Info", GW_UNARY, &pb__empty__descriptor, on_info, 0, false},
    {"/pb.CoreRPC/WatchServiceStatus", GW_SERVER_STREAM, &pb__empty__descriptor,
     on_watch_service_status, ERU_WATCH_SERVICE_STATUS, false},
    {"/pb.CoreRPC/AddPod", GW_UNARY, &pb__add_pod_options__descriptor, on_add_pod, ERU_ADD_POD,
     true},
    {"/pb.CoreRPC/RemovePod", GW_UNARY, &pb__remove_pod_options__descriptor, on_remove_pod,
     ERU_REMOVE_POD, true},
    {"/pb.CoreRPC/GetPod", GW_UNARY, &pb__get_pod_options__descriptor, on_get_pod, ERU_GET_POD,
     true},
    {"/pb.CoreRPC/ListPods", GW_UNARY, &pb__empty__descriptor, on_list_pods, ERU_LIST_PODS, true},
    {"/pb.CoreRPC/AddNode", GW_UNARY, &pb__add_node_options__descriptor, on_add_node, ERU_ADD_NODE,
     true},
    {"/pb.CoreRPC/RemoveNode", GW_UNARY, &pb__remove_node_options__descriptor, on_remove_node,
     ERU_REMOVE_NODE, true},
    {"/pb.CoreRPC/ListPodNodes", GW_SERVER_STREAM, &pb__list_nodes_options__descriptor,
     on_list_pod_nodes, ERU_LIST_POD_NODES, true},
    {"/pb.CoreRPC/GetNode", GW_UNARY, &pb__get_node_options__descriptor, on_get_node, ERU_GET_NODE,
     true},
    {"/pb.CoreRPC/GetNodeEngineInfo", GW_UNARY, &pb__get_node_options__descriptor,
     on_get_node_engine_info, ERU_GET_NODE_STATUS, true},
    {"/pb.CoreRPC/SetNode", GW_UNARY, &pb__set_node_options__descriptor, on_set_node, ERU_SET_NODE,
     true},
    {"/pb.CoreRPC/SetNodeStatus", GW_UNARY, &pb__set_node_status_options__descriptor,
     on_set_node_status, ERU_SET_NODE_STATUS, true},
    {"/pb.CoreRPC/GetNodeStatus", GW_UNARY, &pb__get_node_status_options__descriptor,
     on_get_node_status, ERU_GET_NODE_STATUS, true},
    /* Not in Eru's table: the standard codes (INVALID_ARGUMENT for a bad request). */
    {"/pb.CoreRPC/NodeStatusStream", GW_SERVER_STREAM, &pb__empty__descriptor,
     on_node_status_stream, 0, false},
};

int svc_core_register(svc_core *s, gw_server *server) {
    if (svc_eru_register(server, k_methods, N_METHODS, s->methods, s) != 0) return -1;
    s->status = gw_node_watch_new(s->app, s->node_watchers);
    if (!s->status || gw_node_watch_start(s->status) != 0) return -1;
    return gw_server_on_shutdown(server, on_shutdown, s);
}
