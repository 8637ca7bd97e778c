/*
 * gw_metrics: the gateway's metrics (see gw_metrics.h). The gRPC counters follow the names of
 * go-grpc-prometheus, which dashboards for gRPC servers already expect.
 */
#include "gw_metrics.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "pv_cluster.h"
#include "pv_log.h"
#include "pv_metrics.h"
#include "pv_op.h"
#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_storage.h"

struct gw_metrics {
    gw_app *app;
    pv_metrics *m;
    pv_metrics_server *srv;
    pv_redis *r; /* the collector's own connection (the HTTP thread's) */
};

gw_metrics *gw_metrics_new(gw_app *app) {
    gw_metrics *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->app = app;
    if (!(g->m = pv_metrics_new())) {
        free(g);
        return NULL;
    }
    return g;
}

void gw_metrics_free(gw_metrics *g) {
    if (!g) return;
    pv_metrics_server_stop(g->srv);
    pv_redis_free(g->r);
    pv_metrics_free(g->m);
    free(g);
}

/* "/pkg.Service/Method" into its service and method. */
static void split_path(const char *path, char *service, size_t scap, const char **method) {
    const char *slash = strrchr(path, '/');
    *method = slash ? slash + 1 : path;
    size_t n = slash && slash > path ? (size_t)(slash - path - 1) : 0;
    snprintf(service, scap, "%.*s", (int)n, path + 1);
}

void gw_metrics_on_call_start(void *arg, const char *path) {
    gw_metrics *g = arg;
    char service[128], labels[256];
    const char *method;
    split_path(path, service, sizeof service, &method);
    const char *kv[] = {"grpc_service", service, "grpc_method", method};
    pv_metrics_labels(labels, sizeof labels, 2, kv);
    pv_metrics_count(g->m, "grpc_server_started_total", "RPCs started on the server.", labels, 1);
}

void gw_metrics_on_call_end(void *arg, const char *path, int code, double seconds) {
    gw_metrics *g = arg;
    char service[128], labels[256], code_text[24];
    const char *method;
    split_path(path, service, sizeof service, &method);
    /* Eru's own codes (above 1000) are no canonical name: their number is the label */
    if (code >= 0 && code <= 16)
        snprintf(code_text, sizeof code_text, "%s", pv_code_name(code));
    else
        snprintf(code_text, sizeof code_text, "%d", code);
    const char *kv[] = {"grpc_service", service, "grpc_method", method, "grpc_code", code_text};
    pv_metrics_labels(labels, sizeof labels, 3, kv);
    pv_metrics_count(g->m, "grpc_server_handled_total",
                     "RPCs completed on the server, whatever their status.", labels, 1);
    pv_metrics_labels(labels, sizeof labels, 2, kv);
    pv_metrics_observe(g->m, "grpc_server_handling_seconds",
                       "Time from a call's arrival to its end, in seconds.", labels, seconds);
}

/* ---- what Redis says at scrape time ---- */

static pv_redis *collector_redis(gw_metrics *g) {
    if (g->r) return g->r;
    pv_redis_opts o;
    pv_redis_opts_from_config(&g->app->cfg, &o);
    pv_status st;
    if (pv_redis_new(&o, &g->r, &st) != PV_OK) {
        pv_warn("metrics: redis: %s", st.msg);
        g->r = NULL;
    }
    return g->r;
}

static void operations(gw_metrics *g, pv_metrics_text *t, pv_redis *r) {
    static const pv_op_status statuses[] = {PV_OP_PENDING, PV_OP_RUNNING, PV_OP_SUCCEEDED,
                                            PV_OP_FAILED, PV_OP_CANCELLED};
    pv_metrics_text_family(t, "pivirt_operations", "gauge",
                           "Operation records kept, by kind and status (the newest 1000 per "
                           "status).");
    int64_t oldest = 0;
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        pv_op_filter f = {.status = statuses[i], .limit = 1000};
        pv_op *ops = NULL;
        size_t n = 0;
        pv_status st;
        if (pv_op_list(r, &g->app->keys, &f, &ops, &n, &st) != PV_OK) continue;
        json_t *by_kind = json_object();
        for (size_t j = 0; j < n; j++) {
            const char *kind = ops[j].kind ? ops[j].kind : "";
            json_object_set_new(
                by_kind, kind,
                json_integer(json_integer_value(json_object_get(by_kind, kind)) + 1));
            if (statuses[i] == PV_OP_PENDING && (!oldest || ops[j].created_ms < oldest))
                oldest = ops[j].created_ms;
        }
        const char *kind;
        json_t *v;
        json_object_foreach(by_kind, kind, v) {
            char labels[256];
            const char *kv[] = {"kind", kind, "status", pv_op_status_name(statuses[i])};
            pv_metrics_labels(labels, sizeof labels, 2, kv);
            pv_metrics_text_value(t, "pivirt_operations", labels, (double)json_integer_value(v));
        }
        json_decref(by_kind);
        pv_op_array_free(ops, n);
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    int64_t now = (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
    pv_metrics_text_family(t, "pivirt_queue_oldest_pending_seconds", "gauge",
                           "Age of the oldest operation no worker has started (0 when none).");
    pv_metrics_text_value(t, "pivirt_queue_oldest_pending_seconds", NULL,
                          oldest ? (double)(now - oldest) / 1e3 : 0);
}

static void nodes_and_queues(gw_metrics *g, pv_metrics_text *t, pv_redis *r) {
    pv_node *nodes = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_registry_list_nodes(r, &g->app->keys, NULL, &nodes, &n, &st) != PV_OK) n = 0;
    pv_metrics_text_family(t, "pivirt_queue_pending", "gauge",
                           "Queue entries no worker has acknowledged, by queue.");
    for (size_t i = 0; i <= n; i++) {
        char queue[300], labels[400];
        snprintf(queue, sizeof queue, i == 0 ? "ops" : "node:%s", i == 0 ? "" : nodes[i - 1].name);
        int64_t pending = 0;
        if (pv_cluster_queue_unacked(r, &g->app->keys, queue, &pending, &st) != PV_OK) continue;
        const char *kv[] = {"queue", queue};
        pv_metrics_labels(labels, sizeof labels, 1, kv);
        pv_metrics_text_value(t, "pivirt_queue_pending", labels, (double)pending);
    }
    pv_metrics_text_family(t, "pivirt_node_condition", "gauge",
                           "1 when the node's agent reports the condition, else 0.");
    for (size_t i = 0; i < n; i++) {
        pv_node_conditions c;
        pv_cluster_node_conditions(&nodes[i], &c);
        const struct {
            const char *name;
            bool on;
        } k[] = {{"memory_pressure", c.memory_pressure},
                 {"disk_pressure", c.disk_pressure},
                 {"pid_pressure", c.pid_pressure},
                 {"network_unavailable", c.network_unavailable},
                 {"ready", nodes[i].alive && !nodes[i].bypass}};
        for (size_t j = 0; j < sizeof k / sizeof k[0]; j++) {
            char labels[400];
            const char *kv[] = {"node", nodes[i].name, "condition", k[j].name};
            pv_metrics_labels(labels, sizeof labels, 2, kv);
            pv_metrics_text_value(t, "pivirt_node_condition", labels, k[j].on ? 1 : 0);
        }
    }
    pv_node_array_free(nodes, n);
}

static void pools(gw_metrics *g, pv_metrics_text *t, pv_redis *r) {
    pv_pool *all = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_storage_list(r, &g->app->keys, PV_STO_POOL, NULL, (void **)&all, &n, &st) != PV_OK)
        return;
    static const char *const names[] = {"pivirt_pool_capacity_bytes", "pivirt_pool_used_bytes"};
    static const char *const helps[] = {"A storage pool's capacity.",
                                        "What a storage pool's space holds."};
    for (size_t f = 0; f < 2; f++) {
        pv_metrics_text_family(t, names[f], "gauge", helps[f]);
        for (size_t i = 0; i < n; i++) {
            char labels[300];
            const char *kv[] = {"pool", all[i].name};
            pv_metrics_labels(labels, sizeof labels, 1, kv);
            pv_metrics_text_value(t, names[f], labels,
                                  (double)(f == 0 ? all[i].capacity : all[i].used));
        }
    }
    pv_storage_array_free(PV_STO_POOL, all, n);
}

static void collect(void *arg, pv_metrics_text *t) {
    gw_metrics *g = arg;
    pv_redis *r = collector_redis(g);
    pv_metrics_text_family(t, "pivirt_redis_up", "gauge",
                           "1 when this gateway's metrics could read the control plane's Redis.");
    redisReply *rep = NULL;
    pv_status st;
    bool up = r && pv_redis_command(r, &rep, &st, "PING") == PV_OK;
    if (rep) freeReplyObject(rep);
    pv_metrics_text_value(t, "pivirt_redis_up", NULL, up ? 1 : 0);
    if (!up) return;
    operations(g, t, r);
    nodes_and_queues(g, t, r);
    pools(g, t, r);
}

int gw_metrics_start(gw_metrics *g, const char *listen, pv_status *st) {
    if (!listen || !*listen) return PV_OK;
    if (pv_metrics_serve(g->m, listen, collect, g, &g->srv, st) != PV_OK) return st->code;
    pv_info("metrics on http://%s/metrics", listen);
    return PV_OK;
}
