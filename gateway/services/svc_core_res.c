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

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_deploy.h"
#include "pv_domains.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_res.h"
#include "pv_workload.h"
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

/* Calls fn(id, reported, the record's cpumem, arg) for each workload an engine of node reported
 * that has a record; stops at the first error fn returns. */
typedef int (*reported_fn)(const char *id, json_t *reported, json_t *cpumem, void *arg,
                           pv_status *st);

static int each_reported(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                         reported_fn fn, void *arg, pv_status *st) {
    json_t *j = NULL;
    int rc = pv_engine_workloads_get(r, k, node, engine, &j, st);
    const char *id;
    json_t *d;
    json_object_foreach(j, id, d) {
        pv_workload w = {0};
        pv_status wst;
        if (rc != PV_OK) break;
        if (pv_workload_get(r, k, id, &w, &wst) != PV_OK) continue;
        json_t *res = json_loads(w.resources ? w.resources : "{}", 0, NULL);
        rc = fn(id, d, json_object_get(res, "cpumem"), arg, st);
        json_decref(res);
        pv_workload_clear(&w);
    }
    json_decref(j);
    return rc;
}

/* What an engine reported of its workloads against their records: diff(id, reported, the
 * record's cpumem) gives a diff's text (malloc'd) or NULL when they agree. */
typedef char *(*diff_fn)(const char *id, json_t *reported, json_t *cpumem);

typedef struct diff_acc {
    diff_fn diff;
    char ***diffs; /* appended to (malloc'd strings) */
    size_t *n;
} diff_acc;

static int add_diff(const char *id, json_t *reported, json_t *cpumem, void *arg, pv_status *st) {
    diff_acc *a = arg;
    char *text = a->diff(id, reported, cpumem);
    if (!text) return PV_OK;
    char **grown = realloc(*a->diffs, (*a->n + 1) * sizeof *grown);
    if (!grown) {
        free(text);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    *a->diffs = grown;
    (*a->diffs)[(*a->n)++] = text;
    return PV_OK;
}

static int engine_diffs(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                        diff_fn diff, char ***diffs, size_t *n, pv_status *st) {
    diff_acc a = {diff, diffs, n};
    return each_reported(r, k, node, engine, add_diff, &a, st);
}

/* A virt node's real domains, as its agent reports them (engine info "virt": wk_engine_facts):
 * a running domain with other vcpus or memory than its allocation gives it (the virt engine's
 * mapping: ceil(cpu_limit) vcpus, 1 when 0; memory_limit bytes, 512 MiB when 0) is a diff: a
 * ReallocResource that applies at the next start, or a change made behind pivirt's back.
 * Domains without a record are the audit's (WL_ORPHAN). */
static char *domain_diff(const char *id, json_t *d, json_t *cm) {
    const char *state = json_string_value(json_object_get(d, "state"));
    if (!state || strcmp(state, "running") != 0) return NULL;
    double cpu = json_number_value(json_object_get(cm, "cpu_limit"));
    json_int_t mem = json_integer_value(json_object_get(cm, "memory_limit"));
    json_int_t want_vcpus = cpu > 0 ? (json_int_t)cpu : 1;
    if (cpu > (double)want_vcpus) want_vcpus++; /* ceil, without libm */
    json_int_t want_mem = mem > 0 ? (mem + 1023) / 1024 * 1024 : 512LL << 20;
    json_int_t vcpus = json_integer_value(json_object_get(d, "vcpus"));
    json_int_t memory = json_integer_value(json_object_get(d, "memory"));
    char *text = NULL;
    if ((vcpus != want_vcpus || memory != want_mem) &&
        asprintf(&text,
                 "workload %s: its domain %s runs with %lld vcpus and %lld MiB, its allocation "
                 "gives %lld vcpus and %lld MiB",
                 id, json_string_value(json_object_get(d, "domain")), (long long)vcpus,
                 (long long)(memory >> 20), (long long)want_vcpus, (long long)(want_mem >> 20)) < 0)
        text = NULL;
    return text;
}

/* The cores of a cpuset text ("0,2-3") as a bit mask (cores 0..63; others ignored). */
static unsigned long long cpuset_mask(const char *text) {
    unsigned long long m = 0;
    while (text && *text) {
        char *end;
        long a = strtol(text, &end, 10), b = a;
        if (end == text) break;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b && c >= 0 && c < 64; c++)
            m |= 1ULL << c;
        if (*end && *end != ',') break;
        text = *end == ',' ? end + 1 : end;
    }
    return m;
}

/* A docker node's containers as its agent inspected them (engine info "docker":
 * wk_docker_facts.c), in the docker engine's mapping (wk_docker_spec.c): bound cores (cpu_map)
 * as CpusetCpus without a quota, else cpu_limit as NanoCpus; memory_limit as Memory (0: none).
 * A container that differs is a diff: a ReallocResource the daemon did not apply, or a
 * `docker update` behind pivirt's back. */
static char *container_diff(const char *id, json_t *c, json_t *cm) {
    const char *core;
    json_t *unused;
    unsigned long long want_set = 0;
    json_object_foreach(json_object_get(cm, "cpu_map"), core, unused) want_set |= cpuset_mask(core);
    double want_cpu = want_set ? 0 : json_number_value(json_object_get(cm, "cpu_limit"));
    json_int_t want_mem = json_integer_value(json_object_get(cm, "memory_limit"));
    double cpu = json_number_value(json_object_get(c, "cpu"));
    const char *cpuset = json_string_value(json_object_get(c, "cpuset")) ?: "";
    json_int_t mem = json_integer_value(json_object_get(c, "memory"));
    char *text = NULL;
    if ((cpu - want_cpu > 1e-6 || want_cpu - cpu > 1e-6 || cpuset_mask(cpuset) != want_set ||
         mem != want_mem) &&
        asprintf(&text,
                 "workload %s: its container %s runs with cpu %g, cpuset \"%s\" and memory %lld "
                 "MiB, its allocation gives cpu %g, %s and memory %lld MiB",
                 id, json_string_value(json_object_get(c, "container")), cpu, cpuset,
                 (long long)(mem >> 20), want_cpu, want_set ? "bound cores" : "no cpuset",
                 (long long)(want_mem >> 20)) < 0)
        text = NULL;
    return text;
}

/* The delta that gives workload id the limits its container c really has (requests = limits,
 * as the docker engine maps them back): memory always; cpu unless cores are bound on either
 * side (a bound workload keeps its cores: ReallocResource cannot move them). NULL when out of
 * memory. */
static char *fix_delta(json_t *c, json_t *cm) {
    json_int_t mem = json_integer_value(json_object_get(c, "memory"));
    json_t *doc =
        json_pack("{s:I, s:I}", "memory-request",
                  mem - json_integer_value(json_object_get(cm, "memory_request")), "memory-limit",
                  mem - json_integer_value(json_object_get(cm, "memory_limit")));
    const char *cpuset = json_string_value(json_object_get(c, "cpuset"));
    if (doc && json_object_size(json_object_get(cm, "cpu_map")) == 0 && !(cpuset && *cpuset)) {
        double cpu = json_number_value(json_object_get(c, "cpu"));
        json_object_set_new(doc, "cpu-request",
                            json_real(cpu - json_number_value(json_object_get(cm, "cpu_request"))));
        json_object_set_new(doc, "cpu-limit",
                            json_real(cpu - json_number_value(json_object_get(cm, "cpu_limit"))));
    }
    json_t *delta = doc ? json_pack("{s:o}", "cpumem", doc) : NULL;
    char *text = delta ? json_dumps(delta, JSON_COMPACT) : NULL;
    json_decref(delta);
    return text;
}

/* GetNodeResource's fix on a docker node, as Eru's: each workload whose container's limits are
 * not its allocation's (a `docker update` behind pivirt's back) gets an allocation of what the
 * container really has, through ReallocResource's accounting (checked to fit, written with the
 * node's usage in one step), so the node's usage is what its containers hold and the diff is
 * gone. One that cannot be fixed (it would not fit, cores bound behind pivirt's back) is logged
 * and keeps its diff. */
typedef struct fix_ctx {
    pv_redis *r;
    const pv_keys *k;
    const char *node;
} fix_ctx;

static int fix_container(const char *id, json_t *c, json_t *cm, void *arg, pv_status *st) {
    (void)st;
    fix_ctx *f = arg;
    char *differs = container_diff(id, c, cm);
    char *delta = differs ? fix_delta(c, cm) : NULL;
    pv_status wst;
    if (delta && pv_resv_realloc_workload(f->r, f->k, id, delta, NULL, &wst) != PV_OK)
        pv_warn("GetNodeResource node=%s fix: workload %s not fixed: %s", f->node, id, wst.msg);
    else if (delta)
        pv_info("GetNodeResource node=%s fix: workload %s's allocation is now what its "
                "container has (%s)",
                f->node, id, delta);
    free(delta);
    free(differs);
    return PV_OK;
}

static int fix_containers(pv_redis *r, const pv_keys *k, const char *node, pv_status *st) {
    fix_ctx f = {r, k, node};
    return each_reported(r, k, node, "docker", fix_container, &f, st);
}

static int send_node_resource(gw_call *call, pv_redis *r, const char *name, int fix,
                              pv_status *st) {
    pv_resv_check c;
    if (fix && fix_containers(r, &app_of(call)->keys, name, st) != PV_OK) return st->code;
    if (pv_resv_check_node(r, &app_of(call)->keys, name, fix, &c, st) != PV_OK) return st->code;
    if (fix && c.ndiffs > 0)
        pv_info("GetNodeResource node=%s fix: usage rewritten from its allocations (%zu diffs)",
                name, c.ndiffs);
    /* The check's documents are the registry's forms; clients read Eru's (pv_res.h). */
    char *capacity = NULL, *usage = NULL;
    int rc =
        engine_diffs(r, &app_of(call)->keys, name, "virt", domain_diff, &c.diffs, &c.ndiffs, st);
    if (rc == PV_OK)
        rc = engine_diffs(r, &app_of(call)->keys, name, "docker", container_diff, &c.diffs,
                          &c.ndiffs, st);
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
