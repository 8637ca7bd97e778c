/*
 * wk_ha: the lost-node watch of the ops workers and the failover operation (see wk_ha.h).
 *
 * The failover reuses the drain's pieces (wk_cluster.h): the replacement's DeployOptions, the
 * journaled child deploy, reading where it landed. What differs is the identity: a drain makes
 * a new workload and removes the old, a failover makes the next incarnation of the same
 * workload (same id, epoch + 1), because the old one cannot be asked to stop: its node is gone
 * and fenced itself.
 */
#include "wk_ha.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_op.h"
#include "pv_time.h"
#include "pv_workload.h"
#include "wk_cluster.h"

/* ---- events ---- */

/* One entry of the operators' events stream, in the operations' flat shape (op empty). */
static void ha_event(pv_redis *r, const pv_keys *k, int maxlen, const char *kind,
                     const char *target, const char *status, const char *worker, const char *fmt,
                     ...) __attribute__((format(printf, 8, 9)));
static void ha_event(pv_redis *r, const pv_keys *k, int maxlen, const char *kind,
                     const char *target, const char *status, const char *worker, const char *fmt,
                     ...) {
    char key[PV_KEY_MAX], msg[PV_STATUS_MSG_MAX], cap[24];
    pv_status st;
    if (pv_op_events_key(k, key, sizeof key, &st) != PV_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(cap, sizeof cap, "%d", maxlen > 0 ? maxlen : 100000);
    const char *argv[] = {"XADD",   key,       "MAXLEN", "~",      cap,
                          "*",      "op",      "",       "kind",   kind,
                          "target", target,    "status", status,   "progress",
                          "0",      "message", msg,      "worker", worker ? worker : ""};
    redisReply *rep = NULL;
    if (pv_redis_commandv(r, &rep, &st, (int)(sizeof argv / sizeof *argv), argv, NULL) != PV_OK)
        pv_warn("event %s %s not written: %s", kind, target, st.msg);
    if (rep) freeReplyObject(rep);
}

static void op_event(wk_op *op, const char *kind, const char *target, const char *status,
                     const char *msg) {
    ha_event(wk_op_redis(op), wk_op_keys(op), wk_op_opts(op)->events_maxlen, kind, target, status,
             wk_op_record(op)->worker, "%s", msg);
}

/* ---- recovering one workload ---- */

typedef struct claim_arg {
    const char *node, *id;
} claim_arg;

/* The claim's journaled result: the new epoch, or "skip:<why>" when the workload is not to be
 * taken (its node is alive again, it was moved meanwhile). */
static int step_claim(wk_op *op, void *arg, char **result, pv_status *st) {
    const claim_arg *c = arg;
    int64_t epoch = 0;
    pv_status cst;
    int rc = pv_workload_ha_claim(wk_op_redis(op), wk_op_keys(op), c->id, c->node,
                                  wk_op_record(op)->id, &epoch, &cst);
    if (rc == PV_FAILED_PRECONDITION || rc == PV_NOT_FOUND) {
        if (asprintf(result, "skip:%s", cst.msg) < 0) *result = NULL;
    } else if (rc != PV_OK) {
        *st = cst;
        return rc;
    } else if (asprintf(result, "%lld", (long long)epoch) < 0) {
        *result = NULL;
    }
    return *result ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}

static void unclaim(wk_op *op, const char *id) {
    pv_status st;
    if (pv_workload_ha_unclaim(wk_op_redis(op), wk_op_keys(op), id, wk_op_record(op)->id, NULL,
                               &st) != PV_OK)
        pv_warn("failover %s: claim of %s not undone: %s", wk_op_record(op)->id, id, st.msg);
}

/* The child deploy's parameters: the replacement's options and the incarnation to make. */
static char *place_params(const char *b64, const char *id, int64_t epoch) {
    json_t *j = json_pack("{s:s, s:{s:s, s:I}}", "deploy", b64, "incarnate", "id", id, "epoch",
                          (json_int_t)epoch);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

/* Whether the record now places incarnation epoch of id away from node; *where its node. */
static bool landed(wk_op *op, const char *id, const char *node, int64_t epoch, char *where,
                   size_t cap) {
    pv_workload rec = {0};
    pv_status st;
    bool yes = pv_workload_get(wk_op_redis(op), wk_op_keys(op), id, &rec, &st) == PV_OK &&
               rec.epoch == epoch && rec.node && strcmp(rec.node, node) != 0 &&
               (!rec.placing || !*rec.placing);
    if (yes) snprintf(where, cap, "%s", rec.node);
    pv_workload_clear(&rec);
    return yes;
}

int wk_ha_recover(wk_op *op, const char *node, const pv_workload *w, bool *recovered, char *why,
                  size_t cap, pv_status *st) {
    *recovered = false;
    why[0] = '\0';
    char step[PV_KEY_MAX], *res = NULL;
    claim_arg c = {node, w->id};
    snprintf(step, sizeof step, "ha:claim:%s", w->id);
    if (wk_op_step(op, step, step_claim, &c, &res, st) != PV_OK) return st->code;
    if (strncmp(res, "skip:", 5) == 0) {
        snprintf(why, cap, "%s", res + 5);
        free(res);
        return PV_OK;
    }
    int64_t epoch = atoll(res);
    free(res);
    char *b64 = NULL;
    pv_status dst;
    int rc = wk_cluster_replacement_deploy(op, w, node, &b64, &dst);
    if (rc != PV_OK) {
        unclaim(op, w->id);
        if (rc != PV_FAILED_PRECONDITION) {
            *st = dst;
            return rc;
        }
        snprintf(why, cap, "%s", dst.msg);
        return PV_OK;
    }
    char *params = place_params(b64, w->id, epoch);
    free(b64);
    if (!params) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char request_id[PV_KEY_MAX];
    snprintf(step, sizeof step, "ha:place:%s", w->id);
    snprintf(request_id, sizeof request_id, "%s/ha/%s", wk_op_record(op)->id, w->id);
    pv_op done;
    rc =
        wk_cluster_run_child(op, step, PV_KIND_DEPLOY, "ops", params, request_id, false, &done, st);
    free(params);
    if (rc != PV_OK) {
        if (rc == PV_CANCELLED) unclaim(op, w->id); /* a cancel leaves it where it was */
        return rc;
    }
    char where[256];
    if (landed(op, w->id, node, epoch, where, sizeof where)) {
        *recovered = true;
        snprintf(why, cap, "%s", where);
    } else {
        wk_placed p;
        if (wk_cluster_placement(op, &done, &p, &dst) != PV_OK) snprintf(p.why, sizeof p.why, "?");
        snprintf(why, cap, "%s", p.why[0] ? p.why : "its next incarnation was not recorded");
        unclaim(op, w->id);
    }
    pv_op_clear(&done);
    return PV_OK;
}

/* ---- node.failover ---- */

static int recover_all(wk_op *op, const char *node, pv_workload *w, size_t n, size_t nha,
                       size_t *moved, pv_status *st) {
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        if (!pv_workload_is_ha(w[i].labels, NULL)) continue;
        if (wk_op_progress(op, 5 + (int)(90 * done / nha), "recovering %s (%zu of %zu)", w[i].name,
                           done + 1, nha) != PV_OK)
            return wk_op_stop_code(op, st);
        bool ok = false;
        char why[PV_STATUS_MSG_MAX], msg[PV_STATUS_MSG_MAX + 300];
        if (wk_ha_recover(op, node, &w[i], &ok, why, sizeof why, st) != PV_OK) return st->code;
        done++;
        if (ok) {
            (*moved)++;
            snprintf(msg, sizeof msg, "workload %s (%s) of lost node %s runs again on node %s",
                     w[i].name, w[i].id, node, why);
            op_event(op, "workload.recovered", w[i].id, "RUNNING", msg);
        } else {
            snprintf(msg, sizeof msg, "workload %s (%s) of lost node %s stays down: %s", w[i].name,
                     w[i].id, node, why);
            op_event(op, "workload.unplaced", w[i].id, "DOWN", msg);
        }
        pv_info("failover %s: %s", wk_op_record(op)->id, msg);
        wk_op_progress(op, 5 + (int)(90 * done / nha), "%s", msg);
    }
    return PV_OK;
}

int wk_ha_failover(wk_op *op, pv_status *st) {
    const char *node = wk_op_param(op, "node");
    if (!node || !*node) return pv_status_set(st, PV_INVALID_ARGUMENT, "params.node: required");
    pv_workload *w = NULL;
    size_t n = 0, nha = 0, moved = 0;
    if (pv_workload_list(wk_op_redis(op), wk_op_keys(op), NULL, NULL, node, NULL, &w, &n, st) !=
        PV_OK)
        return st->code;
    for (size_t i = 0; i < n; i++)
        nha += pv_workload_is_ha(w[i].labels, NULL);
    int rc = wk_op_progress(op, 5, "node %s is lost: %zu of its %zu workload(s) carry %s=%s", node,
                            nha, n, PV_HA_LABEL, PV_HA_RESTART);
    if (rc == PV_OK && nha) rc = recover_all(op, node, w, n, nha, &moved, st);
    pv_workload_array_free(w, n);
    if (rc != PV_OK) return rc;
    return wk_op_progress(op, 100,
                          "node %s: %zu of %zu HA workload(s) recreated elsewhere, %zu stay "
                          "down; %zu workload(s) without %s stay down",
                          node, moved, nha, nha - moved, n - nha, PV_HA_LABEL);
}

/* ---- the watch ---- */

struct wk_ha_watch {
    pv_redis *redis;
    pv_keys keys;
    pv_op_opts opts;
    char instance[128];
    int timeout_seconds;
    bool failing;
    pthread_t thread;
    bool started;
    atomic_bool stop;
};

static void submit_failover(wk_ha_watch *w, const pv_ha_change *c) {
    json_t *p = json_pack("{s:s}", "node", c->node);
    char *params = p ? json_dumps(p, JSON_COMPACT) : NULL;
    json_decref(p);
    char request_id[PV_KEY_MAX];
    snprintf(request_id, sizeof request_id, "ha/%s/%lld", c->node_id, (long long)c->downs);
    pv_op_submit_req req = {.kind = PV_KIND_FAILOVER,
                            .target = c->node_id,
                            .queue = "ops",
                            .params_json = params,
                            .request_id = request_id};
    pv_op rec;
    bool existed = false;
    pv_status st;
    int rc = params ? pv_op_submit(w->redis, &w->keys, &w->opts, &req, &rec, &existed, &st)
                    : pv_status_set(&st, PV_INTERNAL, "out of memory");
    free(params);
    if (rc != PV_OK) { /* another operation holds the node (a drain): the next scan tries again */
        pv_warn("node %s lost: its failover is not submitted yet: %s", c->node, st.msg);
        return;
    }
    if (!existed)
        pv_info("node %s lost: failover %s submitted for %lld HA workload(s)", c->node, rec.id,
                (long long)c->ha_workloads);
    pv_op_clear(&rec);
    if (pv_workload_ha_ack(w->redis, &w->keys, c->node_id, &st) != PV_OK)
        pv_warn("node %s: failover acknowledgement: %s", c->node, st.msg);
}

static void on_change(wk_ha_watch *w, const pv_ha_change *c) {
    if (c->change == PV_HA_UP) {
        ha_event(w->redis, &w->keys, w->opts.events_maxlen, "node.ready", c->node, "READY",
                 w->instance, "node %s is ready again: its agent renews its liveness", c->node);
        pv_info("event=node_ready node=%s", c->node);
        return;
    }
    if (c->change == PV_HA_DOWN) {
        ha_event(w->redis, &w->keys, w->opts.events_maxlen, "node.not_ready", c->node, "NOT_READY",
                 w->instance,
                 "node %s has not renewed its liveness for ha.node_timeout_seconds (%d s): "
                 "NOT_READY; %lld HA workload(s) to recreate elsewhere",
                 c->node, w->timeout_seconds, (long long)c->ha_workloads);
        pv_warn("event=node_not_ready node=%s ha_workloads=%lld", c->node,
                (long long)c->ha_workloads);
    }
    if (c->ha_workloads > 0) submit_failover(w, c);
}

int wk_ha_watch_once(wk_ha_watch *w, pv_status *st) {
    pv_ha_change *c = NULL;
    size_t n = 0;
    if (pv_workload_ha_scan(w->redis, &w->keys, &c, &n, st) != PV_OK) return st->code;
    for (size_t i = 0; i < n; i++)
        on_change(w, &c[i]);
    pv_ha_changes_free(c, n);
    return PV_OK;
}

static void *watch_thread(void *arg) {
    wk_ha_watch *w = arg;
    while (!atomic_load(&w->stop)) {
        pv_status st;
        int rc = wk_ha_watch_once(w, &st);
        if (rc != PV_OK && !w->failing) pv_warn("HA watch: %s (retrying)", st.msg);
        if (rc == PV_OK && w->failing) pv_info("HA watch: scanning again");
        w->failing = rc != PV_OK;
        struct timespec ts = {0, WK_HA_SCAN_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int wk_ha_watch_start(const pv_config *cfg, const char *instance, wk_ha_watch **out,
                      pv_status *st) {
    *out = NULL;
    wk_ha_watch *w = calloc(1, sizeof *w);
    if (!w) return pv_status_set(st, PV_INTERNAL, "out of memory");
    snprintf(w->instance, sizeof w->instance, "%s", instance);
    w->timeout_seconds = cfg->ha.node_timeout_seconds;
    w->opts = (pv_op_opts){cfg->ops.retention_seconds, cfg->ops.events_maxlen};
    pv_redis_opts ro;
    pv_redis_opts_from_config(cfg, &ro);
    if (pv_keys_init(&w->keys, cfg->redis.prefix, st) != PV_OK ||
        pv_redis_new(&ro, &w->redis, st) != PV_OK) {
        free(w);
        return st->code;
    }
    if (pthread_create(&w->thread, NULL, watch_thread, w) != 0) {
        wk_ha_watch_stop(w);
        return pv_status_set(st, PV_INTERNAL, "HA watch: cannot start its thread");
    }
    w->started = true;
    *out = w;
    return PV_OK;
}

void wk_ha_watch_stop(wk_ha_watch *w) {
    if (!w) return;
    if (w->started) {
        atomic_store(&w->stop, true);
        pthread_join(w->thread, NULL);
    }
    pv_redis_free(w->redis);
    free(w);
}
