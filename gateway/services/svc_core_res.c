/*
 * svc_core_res: CalculateCapacity, GetNodeResource, GetPodResource (see svc_core_res.h).
 *
 * CalculateCapacity is a plan request: the handler turns DeployOptions into the scheduler's
 * request body (scheduler/sched_place.h), waits for the answer within the call's deadline (or
 * scheduler.request_timeout_ms when the client set none) and stops waiting when the client goes.
 * The resource documents are checked here first, so a malformed request is refused without a
 * round trip and with the plugin and field named.
 */
#include "svc_core_res.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_deploy.h"
#include "pv_domains.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_res.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "svc_eru.h"

#define N_METHODS 3

struct svc_core_res {
    gw_app *app;
    gw_method methods[N_METHODS];
};

svc_core_res *svc_core_res_new(gw_app *app) {
    svc_core_res *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_res_free(svc_core_res *s) {
    free(s);
}

static gw_app *app_of(gw_call *call) {
    return ((svc_core_res *)gw_call_method_data(call))->app;
}

/* ------------------------------------------------------------------------------------------ */
/* CalculateCapacity                                                                           */

static int call_gone(void *arg) {
    return gw_call_is_closed(arg);
}

static int64_t wait_budget(gw_call *call) {
    int64_t left = gw_call_deadline_ms(call);
    int64_t dflt = app_of(call)->cfg.scheduler.request_timeout_ms;
    return left < dflt ? left : dflt;
}

/* The scheduler's capacity lines (pv_sched.h) read in place: the map entries point into the
 * reply, so a 10,000-node answer costs two allocations here, not a JSON tree. */
typedef struct capacity_msg {
    Pb__CapacityMessage msg;
    Pb__CapacityMessage__NodeCapacitiesEntry *entries;
    Pb__CapacityMessage__NodeCapacitiesEntry **ptrs;
    pv_sched_capacity caps;
} capacity_msg;

static int capacity_msg_fill(capacity_msg *m, char *reply, pv_status *st) {
    memset(m, 0, sizeof *m);
    pb__capacity_message__init(&m->msg);
    if (pv_sched_capacity_parse(reply, &m->caps, st) != PV_OK) return st->code;
    m->msg.total = m->caps.total;
    size_t n = m->caps.n;
    if (n == 0) return PV_OK;
    m->entries = malloc(n * sizeof *m->entries);
    m->ptrs = malloc(n * sizeof *m->ptrs);
    if (!m->entries || !m->ptrs) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        Pb__CapacityMessage__NodeCapacitiesEntry *e = &m->entries[i];
        pb__capacity_message__node_capacities_entry__init(e);
        e->key = (char *)m->caps.names[i];
        e->value = m->caps.counts[i];
        m->ptrs[i] = e;
    }
    m->msg.node_capacities = m->ptrs;
    m->msg.n_node_capacities = n;
    return PV_OK;
}

static void capacity_msg_free(capacity_msg *m) {
    free(m->entries);
    free(m->ptrs);
    pv_sched_capacity_clear(&m->caps);
}

static void on_calculate_capacity(gw_call *call, const ProtobufCMessage *req) {
    const Pb__DeployOptions *o = (const Pb__DeployOptions *)req;
    if (!o->entrypoint || !o->entrypoint->name || !*o->entrypoint->name) {
        gw_call_finish(call, ERU_CALCULATE_CAPACITY,
                       "entrypoint: no entry in spec (entrypoint.name is required)");
        return;
    }
    if ((!o->podname || !*o->podname) && o->n_nodenames == 0 &&
        (!o->node_filter || o->node_filter->n_includes == 0)) {
        gw_call_finish(call, ERU_CALCULATE_CAPACITY,
                       "podname: required unless nodes are named (nodenames, node_filter)");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *body = NULL, *reply = NULL;
    pv_sched_call_opts opts = {
        .timeout_ms = wait_budget(call), .cancelled = call_gone, .arg = call};
    if (pv_deploy_plan_body(o, NULL, &body, &st) != PV_OK ||
        pv_sched_call(r, &app_of(call)->keys, "capacity", body, &opts, &reply, &st) != PV_OK) {
        free(body);
        gw_call_finishf(call, ERU_CALCULATE_CAPACITY, "%s", st.msg);
        return;
    }
    free(body);
    capacity_msg m;
    if (capacity_msg_fill(&m, reply, &st) == PV_OK)
        gw_call_reply(call, &m.msg.base);
    else
        gw_call_finishf(call, ERU_CALCULATE_CAPACITY, "%s", st.msg);
    capacity_msg_free(&m);
    free(reply);
}

/* ------------------------------------------------------------------------------------------ */
/* GetNodeResource, GetPodResource                                                             */

static int send_node_resource(gw_call *call, pv_redis *r, const char *name, int fix,
                              pv_status *st) {
    pv_resv_check c;
    if (fix && pv_domains_fix_containers(r, &app_of(call)->keys, name, st) != PV_OK)
        return st->code;
    if (pv_resv_check_node(r, &app_of(call)->keys, name, fix, &c, st) != PV_OK) return st->code;
    if (fix && c.ndiffs > 0)
        pv_info("GetNodeResource node=%s fix: usage rewritten from its allocations (%zu diffs)",
                name, c.ndiffs);
    /* The check's documents are the registry's forms; clients read Eru's (pv_res.h). */
    char *capacity = NULL, *usage = NULL;
    int rc = pv_domains_diffs(r, &app_of(call)->keys, name, &c.diffs, &c.ndiffs, st);
    if (rc == PV_OK) rc = pv_res_eru_docs(c.resources, c.usage, &capacity, &usage, st);
    if (rc == PV_OK) {
        Pb__NodeResource m = PB__NODE_RESOURCE__INIT;
        m.name = (char *)name;
        m.diffs = c.diffs;
        m.n_diffs = c.ndiffs;
        m.resource_capacity = capacity;
        m.resource_usage = usage;
        rc = gw_call_send(call, &m.base) == 0 ? PV_OK : PV_CANCELLED;
        if (rc != PV_OK) pv_status_set(st, PV_CANCELLED, "client gone");
    }
    free(capacity);
    free(usage);
    pv_resv_check_clear(&c);
    return rc;
}

static void on_get_node_resource(gw_call *call, const ProtobufCMessage *req) {
    const Pb__GetNodeResourceOptions *o = (const Pb__GetNodeResourceOptions *)req;
    const char *name = o->opts ? o->opts->nodename : NULL;
    if (!name || !*name) {
        gw_call_finish(call, ERU_GET_NODE_RESOURCE, "opts.nodename: required");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    if (send_node_resource(call, r, name, o->fix, &st) != PV_OK) {
        gw_call_finishf(call, ERU_GET_NODE_RESOURCE, "%s", st.msg);
        return;
    }
    gw_call_finish(call, PV_OK, NULL);
}

static void on_get_pod_resource(gw_call *call, const ProtobufCMessage *req) {
    const Pb__GetPodOptions *o = (const Pb__GetPodOptions *)req;
    pv_redis *r = gw_app_redis(call);
    if (!o->name || !*o->name) {
        gw_call_finish(call, ERU_GET_POD_RESOURCE, "name: the pod name is required");
        return;
    }
    pv_node *nodes = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_registry_list_nodes(r, &app_of(call)->keys, o->name, &nodes, &n, &st) != PV_OK) {
        gw_call_finishf(call, ERU_GET_POD_RESOURCE, "%s", st.msg);
        return;
    }
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        rc = send_node_resource(call, r, nodes[i].name, 0, &st);
        /* A node removed while the stream runs is simply no longer part of the pod. */
        if (rc == PV_NOT_FOUND) rc = PV_OK;
    }
    pv_node_array_free(nodes, n);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_GET_POD_RESOURCE, "%s", st.msg);
}

/* ------------------------------------------------------------------------------------------ */

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/CalculateCapacity", GW_UNARY, &pb__deploy_options__descriptor,
     on_calculate_capacity, ERU_CALCULATE_CAPACITY, true},
    {"/pb.CoreRPC/GetNodeResource", GW_UNARY, &pb__get_node_resource_options__descriptor,
     on_get_node_resource, ERU_GET_NODE_RESOURCE, true},
    {"/pb.CoreRPC/GetPodResource", GW_SERVER_STREAM, &pb__get_pod_options__descriptor,
     on_get_pod_resource, ERU_GET_POD_RESOURCE, true},
};

int svc_core_res_register(svc_core_res *s, gw_server *server) {
    return svc_eru_register(server, k_methods, N_METHODS, s->methods, s);
}
