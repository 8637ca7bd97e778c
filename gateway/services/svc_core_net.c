/*
 * svc_core_net: networks and raw engine operations (see svc_core_net.h).
 */
#include "svc_core_net.h"

#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_kinds.h"
#include "pv_registry.h"
#include "pv_workload.h"
#include "svc_eru.h"
#include "svc_nodeop.h"

#define N_METHODS 4

struct svc_core_net {
    gw_app *app;
    gw_method methods[N_METHODS];
};

svc_core_net *svc_core_net_new(gw_app *app) {
    svc_core_net *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_net_free(svc_core_net *s) {
    free(s);
}

static gw_app *app_of(gw_call *call) {
    return ((svc_core_net *)gw_call_method_data(call))->app;
}

/* Runs kind on node and hands its output to the caller (*out, *n: pv_op_output_free). A failed
 * operation is its code and message. */
static int run(gw_call *call, pv_redis *r, const char *node, const char *kind, json_t *params,
               pv_op_output **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    gw_app *app = app_of(call);
    char op_id[PV_ID_MAX];
    pv_op rec = {0};
    int rc = svc_nodeop_submit(call, node, kind, params, 1, op_id, st);
    if (rc == PV_OK) rc = svc_nodeop_wait(call, r, &app->keys, op_id, &rec, st);
    if (rc == PV_OK && rec.status != PV_OP_SUCCEEDED)
        rc = pv_status_set(
            st, rec.error_code > 0 && rec.error_code <= 16 ? rec.error_code : PV_INTERNAL, "%s",
            rec.error_message ? rec.error_message : "failed");
    pv_op_clear(&rec);
    if (rc == PV_OK) rc = pv_op_output_read(r, &app->keys, op_id, "0", 10000, 0, out, n, st);
    return rc;
}

/* The node of a workload, which must be a virt node. */
static int virt_node_of(pv_redis *r, const pv_keys *k, const char *id, char **node, pv_status *st) {
    *node = NULL;
    pv_workload w;
    if (pv_workload_get(r, k, id, &w, st) != PV_OK) return st->code;
    pv_node n = {0};
    int rc = pv_registry_get_node(r, k, PV_REG_BY_NAME, w.node, &n, st);
    bool networks =
        rc == PV_OK && (strcmp(n.engine, "virt") == 0 || strcmp(n.engine, "docker") == 0);
    if (rc == PV_OK && !networks) /* docker nodes answer RawEngine UNIMPLEMENTED themselves */
        rc = pv_status_set(st, PV_UNIMPLEMENTED,
                           "workload %s runs on node %s with the %s engine, which uses the host's "
                           "network only and has no raw operations: they need a virt:// node",
                           id, n.name, n.engine);
    if (rc == PV_OK && !(*node = strdup(w.node))) rc = pv_status_set(st, PV_INTERNAL, "oom");
    pv_node_clear(&n);
    pv_workload_clear(&w);
    return rc;
}

/* An error keeps its standard code when it is UNIMPLEMENTED (the engine lacks the call), else
 * answers the call's Eru code. */
static void fail(gw_call *call, const pv_status *st, int eru) {
    gw_call_finishf(call, st->code == PV_UNIMPLEMENTED ? PV_UNIMPLEMENTED : eru, "%s", st->msg);
}

/* What a workload's node answered (out, got: answer_free) or why it did not (st). */
typedef struct answer {
    pv_op_output *out;
    size_t got;
    pv_status st;
} answer;

static void answer_free(answer *a) {
    pv_op_output_free(a->out, a->got);
}

/* Runs kind with params (taken: NULL is out of memory) on the virt node of workload id. */
static int run_on_workload(gw_call *call, const char *id, const char *kind, json_t *params,
                           answer *a) {
    pv_redis *r = gw_app_redis(call);
    char *node = NULL;
    a->out = NULL;
    a->got = 0;
    int rc = params ? virt_node_of(r, &app_of(call)->keys, id, &node, &a->st)
                    : pv_status_set(&a->st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) rc = run(call, r, node, kind, params, &a->out, &a->got, &a->st);
    free(node);
    json_decref(params);
    return rc;
}

static int fill_network(Pb__Network *m, const pv_op_output *e, json_t **subnets, char ***v) {
    pb__network__init(m);
    m->name = (char *)svc_nodeop_value(e, "name");
    *subnets = json_loads(svc_nodeop_value(e, "subnets"), 0, NULL);
    size_t n = json_array_size(*subnets);
    *v = n ? calloc(n, sizeof **v) : NULL;
    if (n && !*v) return -1;
    for (size_t i = 0; i < n; i++)
        (*v)[i] = (char *)json_string_value(json_array_get(*subnets, i));
    m->subnets = *v;
    m->n_subnets = n;
    return 0;
}

static void on_list_networks(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ListNetworkOptions *o = (const Pb__ListNetworkOptions *)req;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    pv_node *nodes = NULL;
    size_t n = 0;
    if (pv_registry_list_nodes(r, &app_of(call)->keys, o->podname, &nodes, &n, &st) != PV_OK) {
        gw_call_finishf(call, ERU_LIST_NETWORKS, "%s", st.msg);
        return;
    }
    const char *node = NULL;
    for (size_t i = 0; !node && i < n; i++)
        if (nodes[i].alive &&
            (strcmp(nodes[i].engine, "virt") == 0 || strcmp(nodes[i].engine, "docker") == 0))
            node = nodes[i].name;
    if (!node) {
        gw_call_finishf(call, PV_UNIMPLEMENTED,
                        "pod %s has no live virt:// node: the process engine uses the host's "
                        "network only",
                        o->podname);
        pv_node_array_free(nodes, n);
        return;
    }
    pv_op_output *out = NULL;
    size_t got = 0;
    json_t *none = json_object();
    int rc = run(call, r, node, PV_KIND_NET_LIST_NODE, none, &out, &got, &st);
    json_decref(none);
    if (rc != PV_OK) {
        if (st.code != PV_CANCELLED) fail(call, &st, ERU_LIST_NETWORKS);
        pv_node_array_free(nodes, n);
        return;
    }
    Pb__Network *nets = got ? calloc(got, sizeof *nets) : NULL;
    Pb__Network **ptrs = got ? calloc(got, sizeof *ptrs) : NULL;
    json_t **keep = got ? calloc(got, sizeof *keep) : NULL;
    char ***subs = got ? calloc(got, sizeof *subs) : NULL;
    Pb__Networks m = PB__NETWORKS__INIT;
    for (size_t i = 0; nets && ptrs && keep && subs && i < got; i++) {
        if (fill_network(&nets[i], &out[i], &keep[i], &subs[i]) != 0) break;
        ptrs[m.n_networks++] = &nets[i];
    }
    m.networks = ptrs;
    gw_call_reply(call, &m.base);
    for (size_t i = 0; keep && subs && i < got; i++) {
        json_decref(keep[i]);
        free(subs[i]);
    }
    free(nets);
    free(ptrs);
    free(keep);
    free(subs);
    pv_op_output_free(out, got);
    pv_node_array_free(nodes, n);
}

static void on_connect_network(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ConnectNetworkOptions *o = (const Pb__ConnectNetworkOptions *)req;
    answer a;
    int rc =
        run_on_workload(call, o->target, PV_KIND_NET_CONNECT_NODE,
                        json_pack("{s:s, s:s, s:s, s:s}", "id", o->target, "network", o->network,
                                  "ipv4", o->ipv4 ? o->ipv4 : "", "ipv6", o->ipv6 ? o->ipv6 : ""),
                        &a);
    if (rc == PV_OK && a.got > 0) {
        Pb__Network m;
        json_t *keep = NULL;
        char **subs = NULL;
        if (fill_network(&m, &a.out[0], &keep, &subs) == 0) gw_call_reply(call, &m.base);
        json_decref(keep);
        free(subs);
    } else if (rc == PV_OK) {
        gw_call_finish(call, ERU_CONNECT_NETWORK, "the node answered nothing");
    } else if (rc != PV_CANCELLED) {
        fail(call, &a.st, ERU_CONNECT_NETWORK);
    }
    answer_free(&a);
}

static void on_disconnect_network(gw_call *call, const ProtobufCMessage *req) {
    const Pb__DisconnectNetworkOptions *o = (const Pb__DisconnectNetworkOptions *)req;
    answer a;
    Pb__Empty e = PB__EMPTY__INIT;
    int rc = run_on_workload(
        call, o->target, PV_KIND_NET_DISCONNECT_NODE,
        json_pack("{s:s, s:s, s:b}", "id", o->target, "network", o->network, "force", o->force),
        &a);
    if (rc == PV_OK)
        gw_call_reply(call, &e.base);
    else if (rc != PV_CANCELLED)
        fail(call, &a.st, ERU_DISCONNECT_NETWORK);
    answer_free(&a);
}

static void on_raw_engine(gw_call *call, const ProtobufCMessage *req) {
    const Pb__RawEngineOptions *o = (const Pb__RawEngineOptions *)req;
    char *params_text =
        o->params.len ? strndup((const char *)o->params.data, o->params.len) : strdup("");
    answer a;
    int rc = run_on_workload(call, o->id, PV_KIND_RAW_NODE,
                             json_pack("{s:s, s:s, s:s}", "id", o->id, "op", o->op ? o->op : "",
                                       "params", params_text ? params_text : ""),
                             &a);
    free(params_text);
    if (rc == PV_OK) {
        Pb__RawEngineMessage m = PB__RAW_ENGINE_MESSAGE__INIT;
        const char *data = a.got ? svc_nodeop_value(&a.out[0], "data") : "";
        m.id = o->id;
        m.data.data = (uint8_t *)data;
        m.data.len = strlen(data);
        gw_call_reply(call, &m.base);
    } else if (rc != PV_CANCELLED) {
        fail(call, &a.st, ERU_RAW_ENGINE);
    }
    answer_free(&a);
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/ListNetworks", GW_UNARY, &pb__list_network_options__descriptor, on_list_networks,
     ERU_LIST_NETWORKS, true},
    {"/pb.CoreRPC/ConnectNetwork", GW_UNARY, &pb__connect_network_options__descriptor,
     on_connect_network, ERU_CONNECT_NETWORK, true},
    {"/pb.CoreRPC/DisconnectNetwork", GW_UNARY, &pb__disconnect_network_options__descriptor,
     on_disconnect_network, ERU_DISCONNECT_NETWORK, true},
    {"/pb.CoreRPC/RawEngine", GW_UNARY, &pb__raw_engine_options__descriptor, on_raw_engine,
     ERU_RAW_ENGINE, true},
};

int svc_core_net_register(svc_core_net *s, gw_server *server) {
    return svc_eru_register(server, k_methods, N_METHODS, s->methods, s);
}
