/*
 * pv_cluster: see pv_cluster.h.
 */
#include "pv_time.h"
#include "pv_cluster.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_op.h"
#include "pv_presence.h"
#include "pv_res.h"

/* a decimal number without a leading zero (0 itself is fine); advances *p */
static bool number(const char **p) {
    const char *s = *p;
    if (!isdigit((unsigned char)*s)) return false;
    if (*s == '0' && isdigit((unsigned char)s[1])) return false;
    int n = 0;
    while (isdigit((unsigned char)*s) && n < 9)
        s++, n++;
    if (isdigit((unsigned char)*s)) return false;
    *p = s;
    return true;
}

int pv_cluster_check_version(const char *field, const char *v, pv_status *st) {
    const char *p = v ? v : "";
    if (*p == 'v' && (p++, number(&p)) && *p++ == '.' && number(&p) && *p++ == '.' && number(&p) &&
        *p == '\0')
        return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: \"%s\" is not a version like v1.2.3 (vMAJOR.MINOR.PATCH)", field,
                         v ? v : "");
}

static int check_count(const char *field, int64_t v, pv_status *st) {
    if (v < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "topology.%s: %" PRId64 " is negative", field,
                             v);
    if (v > PV_CLUSTER_TOPOLOGY_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "topology.%s: %" PRId64 " is more nodes than a cluster may hold (%d)",
                             field, v, PV_CLUSTER_TOPOLOGY_MAX);
    return PV_OK;
}

int pv_cluster_check_topology(int64_t control_plane_count, int64_t worker_count, pv_status *st) {
    if (check_count("control_plane_count", control_plane_count, st) != PV_OK) return st->code;
    return check_count("worker_count", worker_count, st);
}

int pv_cluster_check_ip(const char *field, const char *ip, pv_status *st) {
    unsigned char buf[16];
    if (ip && (inet_pton(AF_INET, ip, buf) == 1 || inet_pton(AF_INET6, ip, buf) == 1)) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%s\" is not an IPv4 or IPv6 address",
                         field, ip ? ip : "");
}

pv_node_state pv_cluster_node_state(const pv_node *n) {
    if (n->bypass) return PV_NODE_CORDONED;
    return n->alive ? PV_NODE_READY : PV_NODE_NOT_READY;
}

int pv_cluster_node_draining(pv_redis *r, const pv_keys *k, const pv_node *n, bool *draining,
                             pv_status *st) {
    *draining = false;
    char holder[PV_ID_MAX];
    if (pv_op_lock_holder(r, k, n->id, holder, st) != PV_OK) return st->code;
    if (!holder[0]) return PV_OK;
    pv_op op;
    int rc = pv_op_get(r, k, holder, &op, st);
    if (rc == PV_NOT_FOUND) return PV_OK; /* finished and expired since */
    if (rc != PV_OK) return rc;
    static const char *const kinds[] = {"node.drain", "node.remove", "cluster.delete"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (op.kind && strcmp(op.kind, kinds[i]) == 0 && op.status == PV_OP_RUNNING)
            *draining = true;
    pv_op_clear(&op);
    return PV_OK;
}

pv_cluster_state pv_cluster_state_of(const pv_pod *p, const pv_node *nodes, size_t n) {
    int cp_up = 0, workers_up = 0, up = 0, down = 0;
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].alive) {
            down++;
            continue;
        }
        up++;
        if (nodes[i].role && strcmp(nodes[i].role, "control-plane") == 0)
            cp_up++;
        else
            workers_up++;
    }
    bool complete = up > 0 && cp_up >= p->cp_nodes && workers_up >= p->worker_nodes;
    if (!complete) return p->formed_ms > 0 ? PV_CLUSTER_DEGRADED : PV_CLUSTER_CREATING;
    return down ? PV_CLUSTER_DEGRADED : PV_CLUSTER_RUNNING;
}

int pv_cluster_mark_formed(pv_redis *r, const pv_keys *k, size_t *count, pv_status *st) {
    if (count) *count = 0;
    pv_pod *pods = NULL;
    size_t n = 0;
    if (pv_registry_list_pods(r, k, &pods, &n, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (pods[i].formed_ms > 0) continue;
        pv_node *nodes = NULL;
        size_t nn = 0;
        rc = pv_registry_list_nodes(r, k, pods[i].name, &nodes, &nn, st);
        if (rc == PV_NOT_FOUND) { /* deleted meanwhile */
            rc = PV_OK;
            continue;
        }
        if (rc == PV_OK && pv_cluster_complete(&pods[i], nodes, nn)) {
            pv_pod_update u = {
                .name = pods[i].name, .cp_nodes = -1, .worker_nodes = -1, .mark_formed = true};
            pv_pod now = {0};
            rc = pv_registry_update_pod(r, k, &u, &now, st);
            if (rc == PV_NOT_FOUND) rc = PV_OK;
            if (rc == PV_OK && count) (*count)++;
            pv_pod_clear(&now);
        }
        pv_node_array_free(nodes, nn);
    }
    pv_pod_array_free(pods, n);
    return rc;
}

bool pv_cluster_complete(const pv_pod *p, const pv_node *nodes, size_t n) {
    int cp_up = 0, workers_up = 0;
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].alive) continue;
        if (nodes[i].role && strcmp(nodes[i].role, "control-plane") == 0)
            cp_up++;
        else
            workers_up++;
    }
    return cp_up + workers_up > 0 && cp_up >= p->cp_nodes && workers_up >= p->worker_nodes;
}

bool pv_cluster_labels_match(const char *have, const char *want) {
    if (!want || !*want || strcmp(want, "{}") == 0) return true;
    json_t *h = json_loads(have ? have : "{}", 0, NULL), *w = json_loads(want, 0, NULL);
    bool ok = json_is_object(w);
    const char *key;
    json_t *v;
    json_object_foreach(w, key, v) {
        const char *got = json_string_value(json_object_get(h, key));
        if (!got || !json_is_string(v) || strcmp(got, json_string_value(v)) != 0) ok = false;
    }
    json_decref(h);
    json_decref(w);
    return ok;
}

/* ---- health ---- */

static int add_item(pv_health_item **v, size_t *n, const char *name, const char *node_id,
                    pv_health status, const char *message, int64_t at) {
    pv_health_item *grown = realloc(*v, (*n + 1) * sizeof **v);
    if (!grown) return -1;
    *v = grown;
    pv_health_item *it = &grown[(*n)++];
    it->name = strdup(name);
    it->node_id = strdup(node_id ? node_id : "");
    it->status = status;
    it->message = strdup(message);
    it->last_check_ms = at;
    return it->name && it->node_id && it->message ? 0 : -1;
}

/* The live processes of a kind as components; *count how many. */
static int add_kind(pv_redis *r, const pv_keys *k, const char *kind, pv_health_report *h,
                    size_t *count, pv_status *st) {
    char **values = NULL;
    size_t n = 0;
    if (pv_presence_list(r, k, kind, &values, &n, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        json_t *j = json_loads(values[i], 0, NULL);
        const char *inst = json_string_value(json_object_get(j, "instance"));
        char name[256];
        snprintf(name, sizeof name, "%s %s", kind, inst ? inst : "?");
        if (add_item(&h->components, &h->ncomponents, name, NULL, PV_HEALTHY, "heartbeat alive",
                     pv_time_now_ms()) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        json_decref(j);
    }
    pv_presence_values_free(values, n);
    *count = n;
    return rc;
}

int pv_cluster_health(pv_redis *r, const pv_keys *k, const pv_pod *p, pv_health_report *out,
                      pv_status *st) {
    memset(out, 0, sizeof *out);
    int64_t now = pv_time_now_ms();
    if (add_item(&out->components, &out->ncomponents, "redis", NULL, PV_HEALTHY, "answering",
                 now) != 0)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t gateways = 0, workers = 0, schedulers = 0;
    int rc = add_kind(r, k, "gateway", out, &gateways, st);
    if (rc == PV_OK) rc = add_kind(r, k, "worker", out, &workers, st);
    if (rc == PV_OK) rc = add_kind(r, k, "scheduler", out, &schedulers, st);
    if (rc == PV_OK && workers == 0)
        add_item(&out->components, &out->ncomponents, "worker", NULL, PV_UNHEALTHY,
                 "no ops worker is running: operations wait", now);
    if (rc == PV_OK && schedulers == 0)
        add_item(&out->components, &out->ncomponents, "scheduler", NULL, PV_UNHEALTHY,
                 "no scheduler is running: nothing can be placed", now);
    pv_node *nodes = NULL;
    size_t n = 0, up = 0, down = 0, cordoned_up = 0, pressed = 0;
    char down_names[160] = ""; /* the first of them, for the cluster's message */
    if (rc == PV_OK) rc = pv_registry_list_nodes(r, k, p->name, &nodes, &n, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const pv_node *nd = &nodes[i];
        pv_health hs = nd->alive ? PV_HEALTHY : PV_UNHEALTHY;
        char why[160];
        snprintf(why, sizeof why, "%s",
                 nd->alive ? (nd->bypass ? "ready, cordoned" : "ready")
                           : (nd->bypass ? "agent heartbeat missing; cordoned"
                                         : "agent heartbeat missing"));
        pv_node_conditions c;
        pv_cluster_node_conditions(nd, &c);
        if (nd->alive &&
            (c.memory_pressure || c.disk_pressure || c.pid_pressure || c.network_unavailable)) {
            hs = PV_DEGRADED;
            pressed++;
            snprintf(why + strlen(why), sizeof why - strlen(why), "; under%s%s%s%s",
                     c.memory_pressure ? " memory pressure" : "",
                     c.disk_pressure ? " disk pressure" : "", c.pid_pressure ? " pid pressure" : "",
                     c.network_unavailable ? " network unavailable" : "");
        }
        up += nd->alive;
        down += !nd->alive;
        if (!nd->alive)
            snprintf(down_names + strlen(down_names), sizeof down_names - strlen(down_names),
                     "%s%s", down > 1 ? ", " : "", nd->name);
        cordoned_up += nd->alive && nd->bypass;
        if (add_item(&out->nodes, &out->nnodes, nd->name, nd->id, hs, why,
                     nd->alive ? now : nd->updated_ms) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    pv_node_array_free(nodes, n);
    if (rc != PV_OK) {
        pv_health_free(out);
        return rc;
    }
    char why[256];
    if (workers == 0 || schedulers == 0) {
        out->status = PV_UNHEALTHY;
        snprintf(why, sizeof why, "no %s is running", workers == 0 ? "ops worker" : "scheduler");
    } else if (up == 0) {
        out->status = PV_UNHEALTHY;
        snprintf(why, sizeof why, n ? "none of its %zu nodes is up" : "it has no nodes", n);
    } else if (down > 0) {
        out->status = PV_DEGRADED;
        snprintf(why, sizeof why, "%zu of its %zu nodes are down: %s", down, n, down_names);
    } else if (pressed > 0) {
        out->status = PV_DEGRADED;
        snprintf(why, sizeof why, "%zu of its %zu nodes are under pressure", pressed, n);
    } else if (cordoned_up == up) {
        out->status = PV_DEGRADED;
        snprintf(why, sizeof why, "every node that is up is cordoned: nothing new can run");
    } else {
        out->status = PV_HEALTHY;
        snprintf(why, sizeof why, "%zu nodes up; %zu gateways, %zu ops workers, %zu schedulers", up,
                 gateways, workers, schedulers);
    }
    out->message = strdup(why);
    return PV_OK;
}

void pv_health_free(pv_health_report *h) {
    for (size_t i = 0; i < h->ncomponents; i++) {
        free(h->components[i].name);
        free(h->components[i].node_id);
        free(h->components[i].message);
    }
    for (size_t i = 0; i < h->nnodes; i++) {
        free(h->nodes[i].name);
        free(h->nodes[i].node_id);
        free(h->nodes[i].message);
    }
    free(h->components);
    free(h->nodes);
    free(h->message);
    memset(h, 0, sizeof *h);
}

/* ---- metrics ---- */

static bool at_least(int64_t used, int64_t total, int percent) {
    return total > 0 && percent > 0 && used * 100 >= total * (int64_t)percent;
}

void pv_cluster_conditions_of(const pv_machine *m, const pv_pressure_limits *l,
                              pv_node_conditions *out) {
    out->memory_pressure = at_least(m->mem_total - m->mem_available, m->mem_total, l->memory);
    out->disk_pressure = at_least(m->disk_total - m->disk_free, m->disk_total, l->disk);
    out->pid_pressure = at_least(m->tasks, m->pid_max, l->pid);
    out->network_unavailable = !m->network_up;
}

void pv_cluster_node_conditions(const pv_node *n, pv_node_conditions *out) {
    memset(out, 0, sizeof *out);
    json_t *info = n->engine_info && *n->engine_info ? json_loads(n->engine_info, 0, NULL) : NULL;
    json_t *c = json_object_get(info, "conditions");
    out->memory_pressure = json_is_true(json_object_get(c, "memory_pressure"));
    out->disk_pressure = json_is_true(json_object_get(c, "disk_pressure"));
    out->pid_pressure = json_is_true(json_object_get(c, "pid_pressure"));
    out->network_unavailable = json_is_true(json_object_get(c, "network_unavailable"));
    json_decref(info);
}

void pv_cluster_node_capacity(const pv_node *n, pv_node_capacity *out) {
    memset(out, 0, sizeof *out);
    json_t *info = n->engine_info && *n->engine_info ? json_loads(n->engine_info, 0, NULL) : NULL;
    json_t *m = json_object_get(info, "machine");
    if (json_is_object(m)) {
        json_int_t mt = json_integer_value(json_object_get(m, "mem_total"));
        json_int_t dt = json_integer_value(json_object_get(m, "disk_total"));
        out->cpu_cores = (int)json_integer_value(json_object_get(info, "cpu_count"));
        out->cpu_used_cores = (int)(json_number_value(json_object_get(m, "cpu_busy_cores")) + 0.5);
        out->memory = mt;
        out->memory_used = mt - json_integer_value(json_object_get(m, "mem_available"));
        out->storage = dt;
        out->storage_used = dt - json_integer_value(json_object_get(m, "disk_free"));
        json_decref(info);
        return;
    }
    pv_res_engine_info facts = {.cpu_count = json_integer_value(json_object_get(info, "cpu_count")),
                                .mem_total = json_integer_value(json_object_get(info, "mem_total")),
                                .storage_total =
                                    json_integer_value(json_object_get(info, "storage_total"))};
    json_decref(info);
    pv_res_node res = {0};
    pv_status st;
    if (pv_res_node_parse(n->resources, n->usage, &facts, &res, &st) == PV_OK) {
        out->cpu_cores = (int)res.cpumem.ncores;
        out->cpu_used_cores = (int)(res.cpumem.cpu_used + 0.999);
        out->memory = res.cpumem.memory;
        out->memory_used = res.cpumem.memory_used;
        out->storage = res.storage.storage;
        out->storage_used = res.storage.storage_used;
    }
    pv_res_node_free(&res);
}

/* Operations targeting target, by status; the oldest PENDING one's creation time. */
static int count_ops(pv_redis *r, const pv_keys *k, const char *target, pv_cluster_metrics *m,
                     int64_t *oldest_pending_ms, pv_status *st) {
    pv_op_filter f = {.target = target, .status = PV_OP_ANY, .limit = 1000};
    pv_op *ops = NULL;
    size_t n = 0;
    if (pv_op_list(r, k, &f, &ops, &n, st) != PV_OK) return st->code;
    for (size_t i = 0; i < n; i++) {
        switch (ops[i].status) {
        case PV_OP_PENDING:
            m->ops_pending++;
            if (!*oldest_pending_ms || ops[i].created_ms < *oldest_pending_ms)
                *oldest_pending_ms = ops[i].created_ms;
            break;
        case PV_OP_RUNNING:
            m->ops_running++;
            break;
        case PV_OP_SUCCEEDED:
            m->ops_succeeded++;
            break;
        case PV_OP_FAILED:
            m->ops_failed++;
            break;
        case PV_OP_CANCELLED:
            m->ops_cancelled++;
            break;
        default:
            break;
        }
    }
    pv_op_array_free(ops, n);
    return PV_OK;
}

int pv_cluster_queue_unacked(pv_redis *r, const pv_keys *k, const char *queue, int64_t *out,
                             pv_status *st) {
    char key[PV_KEY_MAX];
    if (pv_op_queue_key(k, queue, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    const char *argv[] = {"XINFO", "GROUPS", key};
    int rc = pv_redis_commandv(r, &rep, st, 3, argv, NULL);
    if (rc != PV_OK) {
        if (strstr(st->msg, "no such key")) return PV_OK;
        return rc;
    }
    for (size_t g = 0; rep->type == REDIS_REPLY_ARRAY && g < rep->elements; g++) {
        const redisReply *grp = rep->element[g];
        for (size_t i = 0; grp->type == REDIS_REPLY_ARRAY && i + 1 < grp->elements; i += 2) {
            const char *f = grp->element[i]->str;
            const redisReply *v = grp->element[i + 1];
            if (f && (strcmp(f, "pending") == 0 || strcmp(f, "lag") == 0) &&
                v->type == REDIS_REPLY_INTEGER)
                *out += v->integer;
        }
    }
    freeReplyObject(rep);
    return PV_OK;
}

int pv_cluster_metrics_of(pv_redis *r, const pv_keys *k, const pv_pod *p, pv_cluster_metrics *out,
                          pv_status *st) {
    memset(out, 0, sizeof *out);
    out->collected_ms = pv_time_now_ms();
    pv_node *nodes = NULL;
    size_t n = 0;
    if (pv_registry_list_nodes(r, k, p->name, &nodes, &n, st) != PV_OK) return st->code;
    int64_t oldest = 0;
    int rc = count_ops(r, k, p->id, out, &oldest, st);
    if (rc == PV_OK) rc = pv_cluster_queue_unacked(r, k, "ops", &out->queue_depth, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const pv_node *nd = &nodes[i];
        out->nodes_total++;
        switch (pv_cluster_node_state(nd)) {
        case PV_NODE_READY:
            out->nodes_ready++;
            break;
        case PV_NODE_CORDONED:
            out->nodes_cordoned++;
            break;
        default:
            out->nodes_not_ready++;
            break;
        }
        pv_node_capacity c;
        pv_cluster_node_capacity(nd, &c);
        out->cpu_cores += c.cpu_cores;
        out->cpu_used_cores += c.cpu_used_cores;
        out->memory += c.memory;
        out->memory_used += c.memory_used;
        out->storage += c.storage;
        out->storage_used += c.storage_used;
        out->workloads += (int)nd->workloads;
        rc = count_ops(r, k, nd->id, out, &oldest, st);
        char queue[300];
        snprintf(queue, sizeof queue, "node:%s", nd->name);
        if (rc == PV_OK) rc = pv_cluster_queue_unacked(r, k, queue, &out->queue_depth, st);
    }
    pv_node_array_free(nodes, n);
    if (oldest) out->oldest_pending_age_s = (double)(out->collected_ms - oldest) / 1000.0;
    if (out->oldest_pending_age_s < 0) out->oldest_pending_age_s = 0;
    return rc;
}
