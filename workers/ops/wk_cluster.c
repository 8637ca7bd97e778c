/*
 * wk_cluster: ClusterService's node and cluster operations on the ops workers (see
 * wk_cluster.h).
 *
 * A drain moves workloads with the pipeline every deploy uses rather than one of its own: the
 * replacement is a child `workload.create` (scheduler plan, reservation, the target node's
 * agent), the old workload's stop a child `workload.remove_on_node` on the drained node's queue.
 * So a replacement lands exactly where CreateWorkload would put it (the drained node is cordoned
 * and excluded) and the resources follow the same books.
 */
#include "wk_cluster.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_time.h"
#include "pv_kinds.h"
#include "pv_id.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_deploy.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "pv_upgrade.h"
#include "pv_workload.h"
#include "wk_ha.h"

/* How often a drain reads the record of the child it waits for. */
#define CHILD_POLL_MS 100
#define DEFAULT_NODE_TIMEOUT_MS 60000

static bool param_true(wk_op *op, const char *key) {
    const char *v = wk_op_param(op, key);
    return v && strcmp(v, "true") == 0;
}

int wk_cluster_set_bypass(wk_op *op, const char *node, bool cordon, pv_status *st) {
    pv_node_update u = {.name = node, .bypass = cordon ? PV_TRI_TRUE : PV_TRI_FALSE};
    pv_node now = {0};
    int rc = pv_registry_set_node(wk_op_redis(op), wk_op_keys(op), &u, &now, st);
    pv_node_clear(&now);
    return rc;
}

int wk_cluster_cordon(wk_op *op, pv_status *st) {
    const char *node = wk_op_param(op, "node");
    if (!node || !*node) return pv_status_set(st, PV_INVALID_ARGUMENT, "params.node: required");
    bool cordon = strcmp(wk_op_record(op)->kind, PV_KIND_CORDON) == 0;
    if (wk_cluster_set_bypass(op, node, cordon, st) != PV_OK) return st->code;
    pv_info("%s node=%s op=%s", cordon ? "cordoned" : "uncordoned", node, wk_op_record(op)->id);
    return wk_op_progress(op, 100, "node %s %s", node,
                          cordon ? "cordoned: it takes no new workloads"
                                 : "uncordoned: it takes workloads again");
}

/* ---- children ---- */

static int dup_result(char *text, char **result, pv_status *st) {
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    *result = text;
    return PV_OK;
}

/* What a journaled submission needs: the child's kind, queue, params and request id. */
typedef struct child_req {
    const char *kind, *queue, *params, *request_id, *target_prefix;
} child_req;

static int step_submit(wk_op *op, void *arg, char **result, pv_status *st) {
    const child_req *c = arg;
    char target[PV_ID_MAX];
    pv_id_new(c->target_prefix, target, sizeof target);
    pv_op_submit_req req = {.kind = c->kind,
                            .target = target,
                            .queue = c->queue,
                            .params_json = c->params,
                            .request_id = c->request_id};
    pv_op child;
    bool existed = false;
    if (pv_op_submit(wk_op_redis(op), wk_op_keys(op), wk_op_opts(op), &req, &child, &existed, st) !=
        PV_OK)
        return st->code;
    int rc = dup_result(strdup(child.id), result, st);
    pv_op_clear(&child);
    return rc;
}

static void cancel_child(wk_op *op, const char *id) {
    pv_op out;
    pv_status cst;
    if (pv_op_cancel(wk_op_redis(op), wk_op_keys(op), wk_op_opts(op), id, &out, &cst) == PV_OK)
        pv_op_clear(&out);
}

static int run_child(wk_op *op, const char *step, const child_req *c, pv_op *done, pv_status *st) {
    return wk_cluster_run_child(op, step, c->kind, c->queue, c->params, c->request_id, false, done,
                                st);
}

int wk_cluster_run_child(wk_op *op, const char *step, const char *kind, const char *queue,
                         const char *params, const char *request_id, bool ignore_cancel,
                         pv_op *done, pv_status *st) {
    child_req req = {kind, queue, params, request_id,
                     strncmp(kind, PV_KIND_DEPLOY, 16) == 0 ? "deploy" : "wlop"};
    const child_req *c = &req;
    memset(done, 0, sizeof *done);
    char *id = NULL;
    if (wk_op_step(op, step, step_submit, (void *)c, &id, st) != PV_OK) return st->code;
    const pv_config *cfg = wk_op_config(op);
    int64_t timeout = cfg ? cfg->worker.node_op_timeout_ms : DEFAULT_NODE_TIMEOUT_MS;
    bool timed_out = false;
    int rc;
    for (;;) {
        pv_op rec;
        rc = pv_op_get(wk_op_redis(op), wk_op_keys(op), id, &rec, st);
        if (rc != PV_OK) break;
        if (pv_op_done(&rec)) {
            *done = rec;
            break;
        }
        if (!timed_out && rec.status == PV_OP_PENDING &&
            pv_time_now_ms() - rec.created_ms > timeout) {
            pv_warn("%s %s: no worker took %s (%s on %s) within %lld ms; cancelling it",
                    wk_op_record(op)->kind, wk_op_record(op)->id, rec.id, rec.kind, rec.queue,
                    (long long)timeout);
            cancel_child(op, id);
            timed_out = true;
        }
        pv_op_clear(&rec);
        rc = wk_op_sleep(op, CHILD_POLL_MS, st);
        if (rc == PV_CANCELLED && ignore_cancel) { /* a rollback finishes what it started */
            struct timespec ts = {0, CHILD_POLL_MS * 1000000L};
            nanosleep(&ts, NULL);
            rc = PV_OK;
            continue;
        }
        if (rc != PV_OK) {
            if (rc == PV_CANCELLED) cancel_child(op, id);
            break;
        }
    }
    free(id);
    return rc;
}

static const char *field_of(const pv_op_output *e, const char *name) {
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->fields[i], name) == 0) return e->values[i];
    return NULL;
}

static const char *or_empty(const char *s) {
    return s ? s : "";
}

/* The output entries of an operation, every one (they are few: one per node or workload). */
static int read_output(wk_op *op, const char *id, pv_op_output **out, size_t *n, pv_status *st) {
    return pv_op_output_read(wk_op_redis(op), wk_op_keys(op), id, "0", 1000, 0, out, n, st);
}

typedef wk_placed placed;

int wk_cluster_placement(wk_op *op, const pv_op *deploy, wk_placed *p, pv_status *st) {
    memset(p, 0, sizeof *p);
    if (deploy->status != PV_OP_SUCCEEDED) {
        snprintf(p->why, sizeof p->why, "%s",
                 deploy->status == PV_OP_CANCELLED
                     ? "its replacement's deploy was cancelled (no worker took it in time?)"
                     : (deploy->error_message && *deploy->error_message ? deploy->error_message
                                                                        : "the deploy failed"));
        return PV_OK;
    }
    pv_op_output *nodes = NULL;
    size_t nn = 0;
    if (read_output(op, deploy->id, &nodes, &nn, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && !p->id[0] && i < nn; i++) {
        const char *type = field_of(&nodes[i], "type"), *child = field_of(&nodes[i], "op");
        if (!type || strcmp(type, "node") != 0 || !child) continue;
        pv_op_output *wl = NULL;
        size_t nw = 0;
        rc = read_output(op, child, &wl, &nw, st);
        for (size_t j = 0; rc == PV_OK && !p->id[0] && j < nw; j++) {
            const char *t = field_of(&wl[j], "type"), *ok = field_of(&wl[j], "success");
            if (!t || strcmp(t, "workload") != 0) continue;
            if (ok && strcmp(ok, "1") == 0) {
                snprintf(p->id, sizeof p->id, "%s", or_empty(field_of(&wl[j], "id")));
                snprintf(p->node, sizeof p->node, "%s", or_empty(field_of(&wl[j], "nodename")));
            } else {
                const char *e = field_of(&wl[j], "error");
                snprintf(p->why, sizeof p->why, "%s", e && *e ? e : "its replacement failed");
            }
        }
        pv_op_output_free(wl, nw);
    }
    pv_op_output_free(nodes, nn);
    if (rc == PV_OK && !p->id[0] && !p->why[0])
        snprintf(p->why, sizeof p->why, "its replacement's deploy made no workload");
    return rc;
}

/* ---- the replacement's deploy options ---- */

int wk_cluster_replacement_deploy(wk_op *op, const pv_workload *w, const char *node, char **b64,
                                  pv_status *st) {
    *b64 = NULL;
    char *orig = NULL;
    if (pv_workload_deploy(wk_op_redis(op), wk_op_keys(op), w->id, &orig, st) != PV_OK)
        return st->code;
    unsigned char *bytes = NULL;
    size_t len = 0;
    int rc = pv_b64_decode("deploy", orig, &bytes, &len, st);
    free(orig);
    if (rc != PV_OK) return rc;
    Pb__DeployOptions *o = pb__deploy_options__unpack(NULL, len, bytes);
    free(bytes);
    if (!o)
        return pv_status_set(st, PV_INTERNAL, "workload %s: its recorded deploy is unreadable",
                             w->id);
    /* Swapped in for packing and put back before the free, which frees what the counts say. */
    size_t n_names = o->n_nodenames;
    Pb__NodeFilter *filter = o->node_filter;
    Pb__NodeFilter mine = PB__NODE_FILTER__INIT;
    char *exclude[] = {(char *)node};
    mine.excludes = exclude;
    mine.n_excludes = 1;
    if (filter) {
        mine.labels = filter->labels;
        mine.n_labels = filter->n_labels;
    }
    o->n_nodenames = 0;
    o->node_filter = &mine;
    o->count = 1;
    o->nodes_limit = 0;
    o->deploy_strategy = PB__DEPLOY_OPTIONS__STRATEGY__AUTO;
    char *pod = o->podname;
    if (!pod || !*pod) o->podname = w->pod; /* borrowed until restored */
    len = pb__deploy_options__get_packed_size(o);
    uint8_t *packed = malloc(len ? len : 1);
    if (packed) pb__deploy_options__pack(o, packed);
    o->n_nodenames = n_names;
    o->node_filter = filter;
    o->podname = pod;
    pb__deploy_options__free_unpacked(o, NULL);
    if (!packed) return pv_status_set(st, PV_INTERNAL, "out of memory");
    rc = pv_b64_encode(packed, len, b64, st);
    free(packed);
    return rc;
}

/* Whether w's replacement would fit on another node now: the scheduler's count, nothing
 * reserved. For max_surge 0, where the old one stops before its replacement is placed. */
static int fits_elsewhere(wk_op *op, const wk_drain_opts *d, const pv_workload *w, bool *fits,
                          char *why, size_t cap, pv_status *st) {
    *fits = false;
    char *b64 = NULL;
    pv_status dst;
    int rc = wk_cluster_replacement_deploy(op, w, d->node, &b64, &dst);
    if (rc == PV_FAILED_PRECONDITION) {
        snprintf(why, cap, "%s", dst.msg);
        return PV_OK;
    }
    if (rc != PV_OK) {
        *st = dst;
        return rc;
    }
    unsigned char *bytes = NULL;
    size_t len = 0;
    rc = pv_b64_decode("deploy", b64, &bytes, &len, st);
    free(b64);
    if (rc != PV_OK) return rc;
    Pb__DeployOptions *o = pb__deploy_options__unpack(NULL, len, bytes);
    free(bytes);
    if (!o) return pv_status_set(st, PV_INTERNAL, "workload %s: unreadable deploy", w->id);
    char *body = NULL, *reply = NULL;
    const pv_config *cfg = wk_op_config(op);
    pv_sched_call_opts so = {.timeout_ms = cfg ? cfg->scheduler.request_timeout_ms : 10000};
    rc = pv_deploy_plan_body(o, NULL, &body, st);
    pb__deploy_options__free_unpacked(o, NULL);
    if (rc == PV_OK)
        rc = pv_sched_call(wk_op_redis(op), wk_op_keys(op), "capacity", body, &so, &reply, &dst);
    free(body);
    if (rc == PV_OK) {
        /* the scheduler's capacity lines (pv_sched.h) */
        pv_sched_capacity caps;
        rc = pv_sched_capacity_parse(reply, &caps, &dst);
        *fits = rc == PV_OK && caps.total >= 1;
        pv_sched_capacity_clear(&caps);
        if (rc != PV_OK)
            *st = dst;
        else if (!*fits)
            snprintf(why, cap, "no other node has room for it");
    } else if (rc == PV_RESOURCE_EXHAUSTED || rc == PV_FAILED_PRECONDITION) {
        snprintf(why, cap, "%s", dst.msg);
        rc = PV_OK;
    } else {
        *st = dst;
    }
    free(reply);
    return rc;
}

static bool is_daemon(const pv_workload *w) {
    json_t *labels = json_loads(w->labels ? w->labels : "{}", 0, NULL);
    const char *v = json_string_value(json_object_get(labels, WK_DAEMON_LABEL));
    bool yes = v && strcmp(v, "true") == 0;
    json_decref(labels);
    return yes;
}

/* "name (id12), name (id12), ..." of the workloads flagged in pick, at most a few. */
static void name_list(const pv_workload *w, size_t n, const bool *pick, char *out, size_t cap) {
    size_t used = 0, shown = 0, total = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!pick[i]) continue;
        total++;
        if (shown == 8 || used + 1 >= cap) continue;
        int m =
            snprintf(out + used, cap - used, "%s%s (%.12s)", shown ? ", " : "", w[i].name, w[i].id);
        if (m > 0) used += (size_t)m < cap - used ? (size_t)m : cap - used - 1;
        shown++;
    }
    if (total > shown && used + 1 < cap)
        snprintf(out + used, cap - used, " and %zu more", total - shown);
}

/* ---- one node's drain ---- */

typedef wk_drain_opts drain_opts;
typedef wk_drain_tally drain_tally;

/* Stops and removes workload w on its node (a child on the node's queue). A node whose agent is
 * gone cannot stop anything: with force the record is dropped (its resources given back),
 * otherwise FAILED_PRECONDITION says so. */
static int stop_old(wk_op *op, const drain_opts *d, const pv_workload *w, pv_status *st) {
    bool alive = false;
    if (pv_registry_get_alive(wk_op_redis(op), wk_op_keys(op), d->node, &alive, NULL, st) != PV_OK)
        return st->code;
    if (!alive) {
        if (!d->force)
            return wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                                    "workload %s (%s) cannot be stopped: the agent of node %s is "
                                    "not running (start it, or use force to drop the record)",
                                    w->name, w->id, d->node);
        int rc = pv_resv_return_workload(wk_op_redis(op), wk_op_keys(op), w->id, st);
        if (rc == PV_NOT_FOUND) rc = PV_OK;
        if (rc == PV_OK)
            pv_warn("%s %s: node %s has no agent; record of workload %s dropped (force)",
                    wk_op_record(op)->kind, wk_op_record(op)->id, d->node, w->id);
        return rc;
    }
    json_t *params = json_pack("{s:[s], s:b}", "ids", w->id, "force", 0);
    if (params && d->grace_seconds >= 0)
        json_object_set_new(params, "grace_seconds", json_integer(d->grace_seconds));
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char queue[300], request_id[PV_KEY_MAX], step[PV_KEY_MAX];
    snprintf(queue, sizeof queue, "node:%s", d->node);
    snprintf(request_id, sizeof request_id, "%s/stop/%s", wk_op_record(op)->id, w->id);
    snprintf(step, sizeof step, "stop:%s", w->id);
    child_req c = {PV_KIND_REMOVE_NODE, queue, text, request_id, "wlop"};
    pv_op done;
    int rc = run_child(op, step, &c, &done, st);
    free(text);
    if (rc != PV_OK) return rc;
    if (done.status != PV_OP_SUCCEEDED) {
        rc = wk_op_fail_final(
            op, st, PV_FAILED_PRECONDITION, "workload %s (%s) was not stopped on node %s: %s",
            w->name, w->id, d->node,
            done.status == PV_OP_CANCELLED ? "its agent did not take the stop in time"
                                           : (done.error_message ? done.error_message : "failed"));
    } else {
        pv_op_output *out = NULL;
        size_t n = 0;
        rc = read_output(op, done.id, &out, &n, st);
        for (size_t i = 0; rc == PV_OK && i < n; i++) {
            const char *t = field_of(&out[i], "type"), *ok = field_of(&out[i], "success");
            if (t && strcmp(t, "removed") == 0 && ok && strcmp(ok, "0") == 0)
                rc = wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                                      "workload %s (%s) was not removed from node %s: %s", w->name,
                                      w->id, d->node, or_empty(field_of(&out[i], "hook")));
        }
        pv_op_output_free(out, n);
    }
    pv_op_clear(&done);
    return rc;
}

/* ControlWorkload `type` (stop, start) of the old instance w on its node, its record kept: for
 * max_surge 0, the old one stops before its replacement is placed and is removed only once the
 * replacement runs, so its recorded deploy is still there to place it from, and a redelivered
 * drain still finds it on the node. Nothing to do when the node's agent is gone. */
static int control_old(wk_op *op, const drain_opts *d, const pv_workload *w, const char *type,
                       pv_status *st) {
    bool alive = false;
    if (pv_registry_get_alive(wk_op_redis(op), wk_op_keys(op), d->node, &alive, NULL, st) != PV_OK)
        return st->code;
    if (!alive) return PV_OK;
    json_t *params = json_pack("{s:[s], s:s, s:b}", "ids", w->id, "type", type, "force", 0);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char queue[300], request_id[PV_KEY_MAX], step[PV_KEY_MAX];
    snprintf(queue, sizeof queue, "node:%s", d->node);
    /* "control-": stop_old's own step and request are "stop:<id>" and ".../stop/<id>" */
    snprintf(request_id, sizeof request_id, "%s/control-%s/%s", wk_op_record(op)->id, type, w->id);
    snprintf(step, sizeof step, "control-%s:%s", type, w->id);
    child_req c = {PV_KIND_CONTROL_NODE, queue, text, request_id, "wlop"};
    pv_op done;
    int rc = run_child(op, step, &c, &done, st);
    free(text);
    if (rc != PV_OK) return rc;
    if (done.status != PV_OP_SUCCEEDED)
        rc = wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                              "workload %s (%s): %s on node %s failed: %s", w->name, w->id, type,
                              d->node, done.error_message ? done.error_message : "failed");
    pv_op_output *out = NULL;
    size_t n = 0;
    if (rc == PV_OK) rc = read_output(op, done.id, &out, &n, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const char *err = field_of(&out[i], "error");
        if (err && *err)
            rc = wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                                  "workload %s (%s): %s on node %s failed: %s", w->name, w->id,
                                  type, d->node, err);
    }
    pv_op_output_free(out, n);
    pv_op_clear(&done);
    return rc;
}

/* Places w's replacement elsewhere; *p says where, or why not (p->id empty). */
static int place_elsewhere(wk_op *op, const drain_opts *d, const pv_workload *w, placed *p,
                           pv_status *st) {
    memset(p, 0, sizeof *p);
    char *b64 = NULL;
    pv_status dst;
    int rc = wk_cluster_replacement_deploy(op, w, d->node, &b64, &dst);
    if (rc == PV_FAILED_PRECONDITION) {
        snprintf(p->why, sizeof p->why, "%s", dst.msg);
        return PV_OK;
    }
    if (rc != PV_OK) {
        *st = dst;
        return rc;
    }
    json_t *params = json_pack("{s:s}", "deploy", b64);
    free(b64);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char request_id[PV_KEY_MAX], step[PV_KEY_MAX];
    snprintf(request_id, sizeof request_id, "%s/place/%s", wk_op_record(op)->id, w->id);
    snprintf(step, sizeof step, "place:%s", w->id);
    child_req c = {PV_KIND_DEPLOY, "ops", text, request_id, "deploy"};
    pv_op done;
    rc = run_child(op, step, &c, &done, st);
    free(text);
    if (rc == PV_OK) rc = wk_cluster_placement(op, &done, p, st);
    pv_op_clear(&done);
    return rc;
}

/* A forced drain of a node whose agent is gone (its alive key expired: it fenced itself): an HA
 * workload is recreated elsewhere as its next incarnation at once (wk_ha.h), instead of waiting
 * for the node's failover. *done: it was. */
static int recover_ha(wk_op *op, const drain_opts *d, const pv_workload *w, bool gone, int pct,
                      drain_tally *t, bool *done, pv_status *st) {
    *done = false;
    if (!gone || !pv_workload_is_ha(w->labels, NULL)) return PV_OK;
    char why[PV_STATUS_MSG_MAX];
    if (wk_ha_recover(op, d->node, w, done, why, sizeof why, st) != PV_OK) return st->code;
    if (*done) {
        t->moved++;
        wk_op_progress(op, pct, "%s (%s): node %s is gone; its next incarnation runs on node %s",
                       w->name, w->id, d->node, why);
    } else {
        wk_op_progress(op, pct, "%s (%s): node %s is gone and it cannot be recreated: %s", w->name,
                       w->id, d->node, why);
    }
    return PV_OK;
}

/* Moves (or, per the options, removes or leaves) every workload of the node. The node must be
 * cordoned already. */
static int move_all(wk_op *op, const drain_opts *d, pv_workload *w, size_t n, const bool *daemon,
                    int base, int span, drain_tally *t, pv_status *st) {
    bool alive = true;
    if (d->force &&
        pv_registry_get_alive(wk_op_redis(op), wk_op_keys(op), d->node, &alive, NULL, st) != PV_OK)
        return st->code;
    for (size_t i = 0; i < n; i++) {
        int pct = base + (int)((size_t)span * i / (n ? n : 1));
        bool recovered = false;
        if (!daemon[i] && recover_ha(op, d, &w[i], !alive, pct, t, &recovered, st) != PV_OK)
            return st->code;
        if (recovered) continue;
        if (daemon[i] && d->daemons == WK_DAEMONS_LEAVE) {
            t->left++;
            continue;
        }
        int rc;
        if (daemon[i]) {
            wk_op_progress(op, pct, "removing daemon workload %s (%zu of %zu) with node %s",
                           w[i].name, i + 1, n, d->node);
            if ((rc = stop_old(op, d, &w[i], st)) != PV_OK) return rc;
            t->removed++;
            continue;
        }
        if ((rc = wk_op_progress(op, pct, "moving %s (%zu of %zu): placing a replacement",
                                 w[i].name, i + 1, n)) != PV_OK)
            return wk_op_stop_code(op, st);
        if (d->stop_first) { /* max_surge 0: no replacement runs next to the old one */
            bool fits = false;
            char why[PV_STATUS_MSG_MAX] = "";
            if ((rc = fits_elsewhere(op, d, &w[i], &fits, why, sizeof why, st)) != PV_OK) return rc;
            if (!fits) { /* stopping it first would lose it: it stays */
                t->left++;
                wk_op_progress(op, pct,
                               "%s (%s) stays on node %s: it cannot be placed elsewhere "
                               "(%s)",
                               w[i].name, w[i].id, d->node, why);
                continue;
            }
            if ((rc = control_old(op, d, &w[i], "stop", st)) != PV_OK) return rc;
        }
        placed p;
        rc = place_elsewhere(op, d, &w[i], &p, st);
        if (rc == PV_NOT_FOUND) { /* removed by someone else meanwhile: nothing to move */
            pv_info("%s %s: workload %s is gone already", wk_op_record(op)->kind,
                    wk_op_record(op)->id, w[i].id);
            continue;
        }
        if (rc != PV_OK) return rc;
        if (!p.id[0] && d->stop_first) { /* it fitted a moment ago: it runs again where it was */
            if ((rc = control_old(op, d, &w[i], "start", st)) != PV_OK) return rc;
            t->left++;
            wk_op_progress(op, pct, "%s (%s) stays on node %s: it cannot be placed elsewhere (%s)",
                           w[i].name, w[i].id, d->node, p.why);
            continue;
        }
        if (!p.id[0] && d->keep_unplaceable) {
            t->left++;
            wk_op_progress(op, pct, "%s (%s) stays on node %s: it cannot be placed elsewhere (%s)",
                           w[i].name, w[i].id, d->node, p.why);
            continue;
        }
        if (!p.id[0] && !d->force) {
            wk_op_progress(op, pct, "blocked: %s (%s) cannot be placed elsewhere: %s", w[i].name,
                           w[i].id, p.why);
            return wk_op_fail_final(op, st, d->unplaceable_code,
                                    "workload %s (%s) cannot be placed elsewhere: %s; use force "
                                    "to remove it instead",
                                    w[i].name, w[i].id, p.why);
        }
        if (p.id[0])
            wk_op_progress(op, pct,
                           "moving %s (%zu of %zu): replacement %.12s runs on %s; "
                           "stopping the old one",
                           w[i].name, i + 1, n, p.id, p.node);
        else
            wk_op_progress(op, pct,
                           "removing %s (%zu of %zu): it cannot be placed elsewhere "
                           "(%s)",
                           w[i].name, i + 1, n, p.why);
        if ((rc = stop_old(op, d, &w[i], st)) != PV_OK) return rc;
        if (p.id[0]) {
            t->moved++;
            pv_info("%s %s: moved workload %s from %s to %s as %s", wk_op_record(op)->kind,
                    wk_op_record(op)->id, w[i].id, d->node, p.node, p.id);
            wk_op_progress(op, base + (int)((size_t)span * (i + 1) / n),
                           "moved %s (%zu of %zu) to node %s as %.12s", w[i].name, i + 1, n, p.node,
                           p.id);
        } else {
            t->removed++;
            wk_op_progress(op, base + (int)((size_t)span * (i + 1) / n),
                           "removed %s (%zu of %zu): it could not be placed elsewhere (force)",
                           w[i].name, i + 1, n);
        }
    }
    return PV_OK;
}

int wk_cluster_drain_node(wk_op *op, const wk_drain_opts *d, int base, int span, wk_drain_tally *t,
                          pv_status *st) {
    pv_workload *w = NULL;
    size_t n = 0;
    if (pv_workload_list(wk_op_redis(op), wk_op_keys(op), NULL, NULL, d->node, NULL, &w, &n, st) !=
        PV_OK)
        return st->code;
    bool *daemon = calloc(n ? n : 1, sizeof *daemon);
    int rc = daemon ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t ndaemons = 0;
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        ndaemons += daemon[i] = is_daemon(&w[i]);
    if (rc == PV_OK && ndaemons && d->daemons == WK_DAEMONS_REFUSE) {
        char names[300];
        name_list(w, n, daemon, names, sizeof names);
        rc = wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                              "node %s runs %zu daemon workload(s) (label %s=true): %s; set "
                              "ignore_daemonsets to leave them in place",
                              d->node, ndaemons, WK_DAEMON_LABEL, names);
    }
    if (rc == PV_OK) rc = wk_cluster_set_bypass(op, d->node, true, st);
    if (rc == PV_OK)
        rc = wk_op_progress(op, base, "node %s cordoned; %zu workload(s) on it", d->node, n);
    if (rc == PV_OK) rc = move_all(op, d, w, n, daemon, base, span, t, st);
    free(daemon);
    pv_workload_array_free(w, n);
    return rc;
}

static int required(wk_op *op, const char *key, const char **out, pv_status *st) {
    *out = wk_op_param(op, key);
    if (!*out || !**out) return pv_status_set(st, PV_INVALID_ARGUMENT, "params.%s: required", key);
    return PV_OK;
}

int wk_cluster_drain(wk_op *op, pv_status *st) {
    drain_opts d = {.force = param_true(op, "force"),
                    .daemons =
                        param_true(op, "ignore_daemonsets") ? WK_DAEMONS_LEAVE : WK_DAEMONS_REFUSE,
                    .unplaceable_code = PV_RESOURCE_EXHAUSTED};
    long grace = -1;
    if (required(op, "node", &d.node, st) != PV_OK ||
        wk_op_param_int(op, "grace_period_seconds", -1, 0, 86400, &grace, st) != PV_OK)
        return st->code;
    d.grace_seconds = (int)grace;
    drain_tally t = {0};
    if (wk_cluster_drain_node(op, &d, 5, 90, &t, st) != PV_OK) return st->code;
    pv_info("drained node=%s op=%s moved=%zu removed=%zu left=%zu", d.node, wk_op_record(op)->id,
            t.moved, t.removed, t.left);
    return wk_op_progress(op, 100,
                          "node %s drained and cordoned: %zu workload(s) moved, %zu removed, "
                          "%zu daemon(s) left in place",
                          d.node, t.moved, t.removed, t.left);
}

static int remove_record(wk_op *op, const char *node, pv_status *st) {
    int rc = pv_registry_remove_node(wk_op_redis(op), wk_op_keys(op), node, st);
    return rc == PV_NOT_FOUND ? PV_OK : rc; /* removed by an earlier delivery */
}

int wk_cluster_remove_node(wk_op *op, pv_status *st) {
    drain_opts d = {.force = param_true(op, "force"),
                    .daemons = WK_DAEMONS_REMOVE,
                    .unplaceable_code = PV_FAILED_PRECONDITION};
    if (required(op, "node", &d.node, st) != PV_OK) return st->code;
    d.grace_seconds = -1;
    drain_tally t = {0};
    pv_node n = {0};
    int rc = pv_registry_get_node(wk_op_redis(op), wk_op_keys(op), PV_REG_BY_NAME, d.node, &n, st);
    pv_node_clear(&n);
    if (rc == PV_NOT_FOUND) /* an earlier delivery removed it */
        return wk_op_progress(op, 100, "node %s removed", d.node);
    if (rc == PV_OK) rc = wk_cluster_drain_node(op, &d, 5, 85, &t, st);
    if (rc == PV_OK) rc = remove_record(op, d.node, st);
    if (rc != PV_OK) return rc;
    pv_info("removed node=%s op=%s moved=%zu removed=%zu", d.node, wk_op_record(op)->id, t.moved,
            t.removed);
    return wk_op_progress(op, 100, "node %s removed: %zu workload(s) moved, %zu removed", d.node,
                          t.moved, t.removed);
}

int wk_cluster_delete(wk_op *op, pv_status *st) {
    const char *cluster = NULL;
    if (required(op, "cluster", &cluster, st) != PV_OK) return st->code;
    bool force = param_true(op, "force");
    pv_node *nodes = NULL;
    size_t nn = 0;
    int rc = pv_registry_list_nodes(wk_op_redis(op), wk_op_keys(op), cluster, &nodes, &nn, st);
    if (rc == PV_NOT_FOUND) /* an earlier delivery removed it */
        return wk_op_progress(op, 100, "cluster %s deleted", cluster);
    if (rc != PV_OK) return rc;
    long total = 0;
    for (size_t i = 0; i < nn; i++)
        total += nodes[i].workloads;
    if (total > 0 && !force) {
        pv_node_array_free(nodes, nn);
        return wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                                "cluster %s still runs %ld workload(s), which would be lost; "
                                "remove them first or use force",
                                cluster, total);
    }
    size_t removed = 0;
    for (size_t i = 0; rc == PV_OK && i < nn; i++) {
        pv_workload *w = NULL;
        size_t n = 0;
        rc = pv_workload_list(wk_op_redis(op), wk_op_keys(op), NULL, NULL, nodes[i].name, NULL, &w,
                              &n, st);
        drain_opts d = {.node = nodes[i].name, .force = true, .grace_seconds = -1};
        if (rc == PV_OK) rc = wk_cluster_set_bypass(op, d.node, true, st);
        for (size_t j = 0; rc == PV_OK && j < n; j++) {
            wk_op_progress(op, (int)(90 * i / nn), "node %s (%zu of %zu): removing %s", d.node,
                           i + 1, nn, w[j].name);
            rc = stop_old(op, &d, &w[j], st);
            removed += rc == PV_OK;
        }
        pv_workload_array_free(w, n);
        if (rc == PV_OK) rc = remove_record(op, d.node, st);
        if (rc == PV_OK)
            wk_op_progress(op, (int)(90 * (i + 1) / nn), "node %s removed (%zu of %zu)", d.node,
                           i + 1, nn);
    }
    pv_node_array_free(nodes, nn);
    pv_pod pod = {0};
    if (rc == PV_OK)
        rc =
            pv_registry_get_pod(wk_op_redis(op), wk_op_keys(op), PV_REG_BY_NAME, cluster, &pod, st);
    if (rc == PV_OK) rc = pv_upgrade_delete(wk_op_redis(op), wk_op_keys(op), pod.id, st);
    if (rc == PV_OK) rc = pv_registry_remove_pod(wk_op_redis(op), wk_op_keys(op), cluster, st);
    pv_pod_clear(&pod);
    if (rc == PV_NOT_FOUND) rc = PV_OK; /* removed by an earlier delivery */
    if (rc != PV_OK) return rc;
    pv_info("deleted cluster=%s op=%s nodes=%zu workloads=%zu", cluster, wk_op_record(op)->id, nn,
            removed);
    return wk_op_progress(op, 100, "cluster %s deleted: %zu node(s), %zu workload(s) removed",
                          cluster, nn, removed);
}
