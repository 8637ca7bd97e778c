/*
 * wk_upgrade: rolling, canary and blue/green cluster upgrades, and a node's upgrade hook (see
 * wk_upgrade.h).
 *
 * The rollout keeps its whole state in the upgrade record (pv_upgrade.h), written after every
 * change, so GetUpgradeStatus shows each node's state as it happens and a redelivered operation
 * resumes from it: nodes already UPGRADED are not touched again, and the hook children are
 * journaled steps with request ids of their own.
 */
#include "wk_upgrade.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pv_time.h"
#include "pv_kinds.h"
#include "pv_cluster.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_upgrade.h"
#include "wk_agent.h"
#include "wk_cluster.h"
#include "wk_engine.h"

#define POLL_MS 200

/* ==== the node's side: the upgrade hook ==== */

/* The last non-empty line of text, for messages. */
static void last_line(const char *text, char *out, size_t cap) {
    out[0] = '\0';
    if (!text) return;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
        n--;
    size_t start = n;
    while (start > 0 && text[start - 1] != '\n')
        start--;
    snprintf(out, cap, "%.*s", (int)(n - start), text + start);
}

int wk_upgrade_node(wk_op *op, pv_status *st) {
    wk_agent *agent = wk_op_context(op);
    if (!agent)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "%s needs the node agent (pivirt-worker --set worker.node=NAME)",
                             PV_KIND_UPGRADE_NODE);
    const char *version = wk_op_param(op, "version");
    if (pv_cluster_check_version("params.version", version, st) != PV_OK) return st->code;
    const pv_config *cfg = wk_op_config(op);
    int timeout_ms = (cfg ? cfg->upgrade.node_timeout_seconds : 300) * 1000;
    const char *hook = wk_agent_upgrade_hook(agent);
    char env_node[512], env_version[160], env_file[4200], env_data[4200];
    snprintf(env_node, sizeof env_node, "PIVIRT_NODE=%s", wk_agent_node(agent));
    snprintf(env_version, sizeof env_version, "PIVIRT_VERSION=%s", version);
    snprintf(env_file, sizeof env_file, "PIVIRT_VERSION_FILE=%s", wk_agent_version_file(agent));
    snprintf(env_data, sizeof env_data, "PIVIRT_DATA_DIR=%s", wk_agent_data_dir(agent));
    const char *env[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                         env_node,
                         env_version,
                         env_file,
                         env_data,
                         NULL};
    const char *argv[] = {hook, version, NULL};
    wk_op_progress(op, 10, "running %s %s", hook, version);
    int code = -1;
    char *output = NULL;
    int rc = wk_agent_run(agent, argv, env, timeout_ms, &code, &output, st);
    char tail[300];
    last_line(output, tail, sizeof tail);
    free(output);
    if (rc != PV_OK)
        return wk_op_fail_final(op, st, PV_FAILED_PRECONDITION, "upgrade hook %s %s: %s", hook,
                                version, st->msg);
    if (code != 0)
        return wk_op_fail_final(op, st, PV_FAILED_PRECONDITION, "upgrade hook %s %s exited %d%s%s",
                                hook, version, code, tail[0] ? ": " : "", tail);
    pv_status rst;
    if (wk_agent_report(agent, wk_op_redis(op), &rst) != PV_OK)
        pv_warn("upgrade node=%s: version not reported at once: %s", wk_agent_node(agent), rst.msg);
    char now[128];
    wk_agent_version(agent, now, sizeof now);
    pv_info("upgrade node=%s: hook %s %s done; the node reports %s", wk_agent_node(agent), hook,
            version, now);
    if (strcmp(now, version) != 0)
        return wk_op_fail_final(op, st, PV_FAILED_PRECONDITION,
                                "upgrade hook %s %s exited 0 but the node reports version %s", hook,
                                version, now);
    return wk_op_progress(op, 100, "node %s at %s", wk_agent_node(agent), version);
}

/* ==== the cluster's side: the rollout ==== */

typedef struct up_ctx {
    wk_op *op;
    const char *cluster, *cluster_id, *from, *to;
    pv_upgrade_strategy s;
    pv_upgrade_rec rec; /* the upgrade record */
    size_t n;           /* rec.n_nodes */
    int node_timeout_s, settle_s;
    bool broken; /* a rollback failed: the cluster is left in ERROR */
} up_ctx;

static pv_upgrade_node *node_j(up_ctx *c, size_t i) {
    return &c->rec.nodes[i];
}

static const char *node_name(up_ctx *c, size_t i) {
    return node_j(c, i)->name;
}

static int node_state(up_ctx *c, size_t i) {
    return node_j(c, i)->state;
}

static int node_batch(up_ctx *c, size_t i) {
    return node_j(c, i)->batch;
}

static int save(up_ctx *c, pv_status *st) {
    return pv_upgrade_put(wk_op_redis(c->op), wk_op_keys(c->op), c->cluster_id, &c->rec, st);
}

/* Sets node i's state and message and saves the record. */
static int set_node(up_ctx *c, size_t i, int state, pv_status *st, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int set_node(up_ctx *c, size_t i, int state, pv_status *st, const char *fmt, ...) {
    char msg[PV_STATUS_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pv_upgrade_node *n = node_j(c, i);
    n->state = state;
    if (pv_record_set_str(&n->message, msg) != 0)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    if (n->started_ms == 0 && state != PV_NODE_UPGRADE_PENDING && state != PV_NODE_UPGRADE_SKIPPED)
        n->started_ms = pv_time_now_ms();
    if (state == PV_NODE_UPGRADE_UPGRADED || state == PV_NODE_UPGRADE_FAILED ||
        state == PV_NODE_UPGRADE_ROLLED_BACK)
        n->finished_ms = pv_time_now_ms();
    pv_info("upgrade %s cluster=%s node=%s state=%d: %s", wk_op_record(c->op)->id, c->cluster,
            node_name(c, i), state, msg);
    return save(c, st);
}

static int set_phase(up_ctx *c, int phase, pv_status *st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int set_phase(up_ctx *c, int phase, pv_status *st, const char *fmt, ...) {
    char msg[PV_STATUS_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->rec.phase = phase;
    if (pv_record_set_str(&c->rec.message, msg) != 0)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    if (pv_upgrade_phase_done(phase)) c->rec.finished_ms = pv_time_now_ms();
    size_t done = 0, total = 0;
    for (size_t i = 0; i < c->n; i++) {
        total += node_batch(c, i) > 0;
        done += node_state(c, i) == PV_NODE_UPGRADE_UPGRADED;
    }
    wk_op_progress(c->op, total ? (int)(100 * done / total) : 100, "%s", msg);
    return save(c, st);
}

/* Whether node i is alive now and reports version; *now gets what it reports. */
static int node_at(up_ctx *c, size_t i, const char *version, bool *ok, char *now, size_t cap,
                   pv_status *st) {
    *ok = false;
    now[0] = '\0';
    pv_node n = {0};
    if (pv_registry_get_node(wk_op_redis(c->op), wk_op_keys(c->op), PV_REG_BY_NAME, node_name(c, i),
                             &n, st) != PV_OK)
        return st->code;
    json_t *info = n.engine_info && *n.engine_info ? json_loads(n.engine_info, 0, NULL) : NULL;
    const char *v = json_string_value(json_object_get(info, "version"));
    snprintf(now, cap, "%s", v ? v : "");
    *ok = n.alive && v && strcmp(v, version) == 0;
    json_decref(info);
    pv_node_clear(&n);
    return PV_OK;
}

/* A failure of node i that stops the rollout: recorded, and final. */
static int node_failed(up_ctx *c, size_t i, int code, pv_status *st, const char *why) {
    char msg[PV_STATUS_MSG_MAX];
    snprintf(msg, sizeof msg, "%.*s", (int)sizeof msg - 1, why); /* cut, as every message */
    pv_status wst;
    set_node(c, i, PV_NODE_UPGRADE_FAILED, &wst, "%s", msg);
    return wk_op_fail_final(c->op, st, code, "node %s: %s", node_name(c, i), msg);
}

/* Waits until node i is READY at version, within the node timeout. */
static int wait_ready(up_ctx *c, size_t i, const char *version, pv_status *st) {
    int64_t until = pv_time_now_ms() + (int64_t)c->node_timeout_s * 1000;
    char now[128] = "";
    for (;;) {
        bool ok = false;
        if (node_at(c, i, version, &ok, now, sizeof now, st) != PV_OK) return st->code;
        if (ok) return PV_OK;
        if (pv_time_now_ms() >= until) break;
        if (wk_op_sleep(c->op, POLL_MS, st) != PV_OK) return st->code;
    }
    return wk_op_fail_final(c->op, st, PV_DEADLINE_EXCEEDED,
                            "node %s not READY at %s within %d s (it reports %s)", node_name(c, i),
                            version, c->node_timeout_s, now[0] ? now : "nothing");
}

/* Runs the node's hook with version (a child on its queue) and waits for it READY there. */
static int hook_node(up_ctx *c, size_t i, const char *version, bool rollback, pv_status *st) {
    const char *name = node_name(c, i);
    node_j(c, i)->hooked = true;
    char params[256], queue[300], step[300], request_id[PV_KEY_MAX + 400];
    snprintf(params, sizeof params, "{\"version\":\"%s\"}", version);
    snprintf(queue, sizeof queue, "node:%s", name);
    snprintf(step, sizeof step, "%s:%s", rollback ? "rollback" : "upgrade", name);
    snprintf(request_id, sizeof request_id, "%s/%s", wk_op_record(c->op)->id, step);
    pv_op done;
    int rc = wk_cluster_run_child(c->op, step, PV_KIND_UPGRADE_NODE, queue, params, request_id,
                                  rollback, &done, st);
    if (rc != PV_OK) return rc;
    if (done.status != PV_OP_SUCCEEDED) {
        char why[PV_STATUS_MSG_MAX];
        snprintf(why, sizeof why, "%s",
                 done.status == PV_OP_CANCELLED
                     ? "its agent did not take the upgrade in time (is it running?)"
                     : (done.error_message ? done.error_message : "the upgrade hook failed"));
        pv_op_clear(&done);
        return wk_op_fail_final(c->op, st, PV_FAILED_PRECONDITION, "%s", why);
    }
    pv_op_clear(&done);
    return wait_ready(c, i, version, st);
}

/* Cordons and drains each node of the set (idx[0..m)); every agent must be running first. */
static int drain_set(up_ctx *c, const size_t *idx, size_t m, pv_status *st) {
    for (size_t j = 0; j < m; j++) {
        bool alive = false;
        if (pv_registry_get_alive(wk_op_redis(c->op), wk_op_keys(c->op), node_name(c, idx[j]),
                                  &alive, NULL, st) != PV_OK)
            return st->code;
        if (!alive)
            return node_failed(c, idx[j], PV_FAILED_PRECONDITION, st,
                               "its agent is not running: it cannot be upgraded");
    }
    for (size_t j = 0; j < m; j++) /* all out of scheduling before any drains into another */
        if (wk_cluster_set_bypass(c->op, node_name(c, idx[j]), true, st) != PV_OK) return st->code;
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        if (set_node(c, i, PV_NODE_UPGRADE_DRAINING, st, "cordoned; moving its workloads away") !=
            PV_OK)
            return st->code;
        wk_drain_opts d = {.node = node_name(c, i),
                           .keep_unplaceable = true,
                           .stop_first = c->s.max_surge == 0,
                           .daemons = WK_DAEMONS_LEAVE,
                           .grace_seconds = -1,
                           .unplaceable_code = PV_FAILED_PRECONDITION};
        wk_drain_tally t = {0};
        pv_status dst;
        int rc = wk_cluster_drain_node(c->op, &d, 0, 0, &t, &dst);
        if (rc != PV_OK) {
            *st = dst;
            if (wk_op_should_stop(c->op)) return rc;
            char why[PV_STATUS_MSG_MAX + 16];
            snprintf(why, sizeof why, "drain failed: %.480s", dst.msg);
            return node_failed(c, i, rc, st, why);
        }
        json_decref(node_j(c, i)->drained);
        node_j(c, i)->drained =
            json_pack("{s:I, s:I, s:I}", "moved", (json_int_t)t.moved, "removed",
                      (json_int_t)t.removed, "left", (json_int_t)t.left);
    }
    return PV_OK;
}

/* Runs the hook on each node of the set and waits for each READY at the target. */
static int upgrade_set(up_ctx *c, const size_t *idx, size_t m, pv_status *st) {
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        if (set_node(c, i, PV_NODE_UPGRADE_UPGRADING, st, "running the upgrade hook to %s",
                     c->to) != PV_OK)
            return st->code;
        pv_status hst;
        int rc = hook_node(c, i, c->to, false, &hst);
        if (rc != PV_OK) {
            *st = hst;
            if (!wk_op_failure_final(c->op)) return rc; /* a stop: cancel, lost lease */
            return node_failed(c, i, rc, st, hst.msg);
        }
    }
    return PV_OK;
}

static int uncordon_set(up_ctx *c, const size_t *idx, size_t m, pv_status *st) {
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        bool keep = node_j(c, i)->was_cordoned;
        if (!keep && wk_cluster_set_bypass(c->op, node_name(c, i), false, st) != PV_OK)
            return st->code;
        if (set_node(c, i, PV_NODE_UPGRADE_UPGRADED, st, "READY at %s%s", c->to,
                     keep ? "; left cordoned, as it was before" : "") != PV_OK)
            return st->code;
    }
    return PV_OK;
}

/* Watches the set stay READY at the target for the settle time. */
static int settle(up_ctx *c, const size_t *idx, size_t m, pv_status *st) {
    int64_t until = pv_time_now_ms() + (int64_t)c->settle_s * 1000;
    do {
        for (size_t j = 0; j < m; j++) {
            bool ok = false;
            char now[128];
            if (node_at(c, idx[j], c->to, &ok, now, sizeof now, st) != PV_OK) return st->code;
            if (!ok) {
                char why[PV_STATUS_MSG_MAX];
                snprintf(why, sizeof why,
                         "did not stay READY at %s through the %d s settle time (it reports %s)",
                         c->to, c->settle_s, now[0] ? now : "nothing");
                return node_failed(c, idx[j], PV_FAILED_PRECONDITION, st, why);
            }
        }
        if (pv_time_now_ms() >= until) break;
        if (wk_op_sleep(c->op, POLL_MS, st) != PV_OK) return st->code;
    } while (1);
    return PV_OK;
}

/* The nodes of batch b (or of batches >= b when from_b) that are not UPGRADED yet. */
static size_t pick(up_ctx *c, int b, bool from_b, size_t *idx) {
    size_t m = 0;
    for (size_t i = 0; i < c->n; i++) {
        int nb = node_batch(c, i);
        if ((nb == b || (from_b && nb > b)) && node_state(c, i) != PV_NODE_UPGRADE_UPGRADED)
            idx[m++] = i;
    }
    return m;
}

static int batch_rollout(up_ctx *c, int b, size_t *idx, pv_status *st) {
    size_t m = pick(c, b, false, idx);
    if (m == 0) return PV_OK;
    if (set_phase(c, PV_UPGRADE_UPGRADING, st, "batch %d: %zu node(s) to %s", b, m, c->to) !=
            PV_OK ||
        drain_set(c, idx, m, st) != PV_OK || upgrade_set(c, idx, m, st) != PV_OK)
        return st->code;
    if (c->s.type == PV_UPGRADE_CANARY && b == 1) {
        if (set_phase(c, PV_UPGRADE_VERIFYING, st, "canary %s: watching it stay READY for %d s",
                      node_name(c, idx[0]), c->settle_s) != PV_OK ||
            settle(c, idx, m, st) != PV_OK)
            return st->code;
    }
    return uncordon_set(c, idx, m, st);
}

static int blue_green(up_ctx *c, size_t *idx, pv_status *st) {
    size_t m = pick(c, 1, false, idx);
    if (m > 0) {
        if (set_phase(c, PV_UPGRADE_UPGRADING, st,
                      "green half: %zu node(s) to %s while the others carry the workloads", m,
                      c->to) != PV_OK ||
            drain_set(c, idx, m, st) != PV_OK || upgrade_set(c, idx, m, st) != PV_OK ||
            set_phase(c, PV_UPGRADE_VERIFYING, st,
                      "green half: watching it stay READY at %s for %d s", c->to,
                      c->settle_s) != PV_OK ||
            settle(c, idx, m, st) != PV_OK || uncordon_set(c, idx, m, st) != PV_OK)
            return st->code;
    }
    size_t *blue = calloc(c->n ? c->n : 1, sizeof *blue);
    if (!blue) return pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t mb = pick(c, 2, false, blue);
    int rc = PV_OK;
    if (mb > 0) {
        if (set_phase(c, PV_UPGRADE_MIGRATING, st,
                      "moving every workload onto the upgraded half (%zu node(s) to drain)",
                      mb) != PV_OK ||
            drain_set(c, blue, mb, st) != PV_OK ||
            set_phase(c, PV_UPGRADE_UPGRADING, st, "blue half: %zu node(s) to %s", mb, c->to) !=
                PV_OK ||
            upgrade_set(c, blue, mb, st) != PV_OK || uncordon_set(c, blue, mb, st) != PV_OK)
            rc = st->code;
    }
    free(blue);
    return rc;
}

static int rollout(up_ctx *c, pv_status *st) {
    size_t *idx = calloc(c->n ? c->n : 1, sizeof *idx);
    if (!idx) return pv_status_set(st, PV_INTERNAL, "out of memory");
    int rc = PV_OK;
    if (c->s.type == PV_UPGRADE_BLUE_GREEN) {
        rc = blue_green(c, idx, st);
    } else {
        int last = 0;
        for (size_t i = 0; i < c->n; i++)
            if (node_batch(c, i) > last) last = node_batch(c, i);
        for (int b = 1; rc == PV_OK && b <= last; b++)
            rc = batch_rollout(c, b, idx, st);
    }
    free(idx);
    return rc;
}

/* Returns every node the rollout touched to the old version. */
static void rollback(up_ctx *c) {
    wk_op_begin_cleanup(c->op);
    pv_status st;
    set_phase(c, PV_UPGRADE_ROLLING_BACK, &st, "returning the upgraded nodes to %s", c->from);
    for (size_t i = 0; i < c->n; i++) {
        int s = node_state(c, i);
        if (s == PV_NODE_UPGRADE_PENDING || s == PV_NODE_UPGRADE_SKIPPED) continue;
        const char *name = node_name(c, i);
        bool hooked = node_j(c, i)->hooked;
        set_node(c, i, PV_NODE_UPGRADE_ROLLING_BACK, &st, "%s",
                 hooked ? "running the upgrade hook back to the old version"
                        : "never upgraded: uncordoning it");
        pv_status hst;
        if (hooked && hook_node(c, i, c->from, true, &hst) != PV_OK) {
            if (wk_op_is_lost(c->op)) return;
            c->broken = true;
            set_node(c, i, PV_NODE_UPGRADE_FAILED, &st, "rollback to %s failed: %s", c->from,
                     hst.msg);
            continue;
        }
        bool keep = node_j(c, i)->was_cordoned;
        if (!keep && wk_cluster_set_bypass(c->op, name, false, &hst) != PV_OK) {
            c->broken = true;
            set_node(c, i, PV_NODE_UPGRADE_FAILED, &st, "rolled back but not uncordoned: %s",
                     hst.msg);
            continue;
        }
        set_node(c, i, PV_NODE_UPGRADE_ROLLED_BACK, &st, "back at %s", c->from);
    }
}

/* The record of this operation: resumed when a previous delivery wrote it, else new. */
static int load_record(up_ctx *c, pv_status *st) {
    pv_upgrade_rec rec;
    int rc = pv_upgrade_get(wk_op_redis(c->op), wk_op_keys(c->op), c->cluster_id, &rec, st);
    if (rc != PV_OK && rc != PV_NOT_FOUND) return rc;
    const char *owner = rec.operation_id;
    if (owner && strcmp(owner, wk_op_record(c->op)->id) == 0) {
        c->rec = rec;
    } else {
        pv_upgrade_rec_free(&rec);
        pv_node *nodes = NULL;
        size_t n = 0;
        if (pv_registry_list_nodes(wk_op_redis(c->op), wk_op_keys(c->op), c->cluster, &nodes, &n,
                                   st) != PV_OK)
            return st->code;
        bool made = pv_upgrade_new_record_of(wk_op_record(c->op)->id, c->cluster_id, c->from, c->to,
                                             &c->s, nodes, n, pv_time_now_ms(), &c->rec) == 0;
        pv_node_array_free(nodes, n);
        if (!made) return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    c->n = c->rec.n_nodes;
    return PV_OK;
}

static int run_upgrade(up_ctx *c, pv_status *st) {
    if (load_record(c, st) != PV_OK) return st->code;
    int phase = c->rec.phase;
    if (pv_upgrade_phase_done(phase)) /* a redelivery after the end was written */
        return phase == PV_UPGRADE_SUCCEEDED
                   ? PV_OK
                   : wk_op_fail_final(c->op, st, PV_FAILED_PRECONDITION, "%s", c->rec.message);
    if (pv_version_compare(c->to, c->from) < 0)
        pv_warn("upgrade %s cluster=%s: a downgrade, %s -> %s", wk_op_record(c->op)->id, c->cluster,
                c->from, c->to);
    int rc = rollout(c, st);
    if (rc == PV_OK) {
        pv_pod_update u = {
            .name = c->cluster, .cp_nodes = -1, .worker_nodes = -1, .version = c->to};
        pv_pod now = {0};
        if (pv_registry_update_pod(wk_op_redis(c->op), wk_op_keys(c->op), &u, &now, st) != PV_OK)
            return st->code;
        pv_pod_clear(&now);
        size_t done = 0;
        for (size_t i = 0; i < c->n; i++)
            done += node_state(c, i) == PV_NODE_UPGRADE_UPGRADED;
        set_phase(c, PV_UPGRADE_SUCCEEDED, st, "cluster %s at %s: %zu node(s) upgraded", c->cluster,
                  c->to, done);
        return PV_OK;
    }
    bool cancelled = wk_op_is_cancelled(c->op);
    if (!cancelled && !wk_op_failure_final(c->op)) return rc; /* lost, shutdown, Redis: resume */
    pv_status why = *st;
    rollback(c);
    if (wk_op_is_lost(c->op)) return wk_op_stop_code(c->op, st);
    pv_status sst;
    if (c->broken)
        set_phase(c, PV_UPGRADE_FAILED, &sst,
                  "%s; the rollback could not restore every node (the cluster is in ERROR)",
                  cancelled ? "cancelled" : why.msg);
    else
        set_phase(c, cancelled ? PV_UPGRADE_CANCELLED : PV_UPGRADE_ROLLED_BACK, &sst,
                  "%s; upgraded nodes rolled back to %s", cancelled ? "cancelled" : why.msg,
                  c->from);
    if (cancelled) return pv_status_set(st, PV_CANCELLED, "cancelled; rolled back to %s", c->from);
    return wk_op_fail_final(c->op, st, why.code, "%s; upgraded nodes rolled back to %s%s", why.msg,
                            c->from, c->broken ? " (not all: the cluster is in ERROR)" : "");
}

int wk_upgrade_cluster(wk_op *op, pv_status *st) {
    up_ctx c = {.op = op,
                .cluster = wk_op_param(op, "cluster"),
                .cluster_id = wk_op_param(op, "cluster_id"),
                .from = wk_op_param(op, "from"),
                .to = wk_op_param(op, "to")};
    if (!c.cluster || !c.cluster_id || !c.from || !c.to)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "params: cluster, cluster_id, from and to are required");
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    json_t *s = json_object_get(params, "strategy");
    c.s.type = (pv_upgrade_type)json_integer_value(json_object_get(s, "type"));
    if (c.s.type == 0) c.s.type = PV_UPGRADE_ROLLING;
    c.s.max_surge = (int)json_integer_value(json_object_get(s, "max_surge"));
    c.s.max_unavailable = (int)json_integer_value(json_object_get(s, "max_unavailable"));
    c.s.partition = (int)json_integer_value(json_object_get(s, "partition"));
    json_decref(params);
    const pv_config *cfg = wk_op_config(op);
    c.node_timeout_s = cfg ? cfg->upgrade.node_timeout_seconds : 300;
    c.settle_s = cfg ? cfg->upgrade.settle_seconds : 30;
    int rc = run_upgrade(&c, st);
    pv_upgrade_rec_free(&c.rec);
    return rc;
}
