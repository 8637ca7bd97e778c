/*
 * wk_deploy: CreateWorkload's orchestration on the ops workers (see wk_deploy.h).
 *
 * Every step that writes is either journaled (reserve, each dispatch) or idempotent by itself
 * (child submissions carry a request id; releasing a released reservation is NOT_FOUND), so an
 * operation redelivered after its worker died resumes without reserving or creating twice.
 * Output announcements of children may repeat after a redelivery; readers key them by child id.
 */
#include "wk_deploy.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_time.h"
#include "pv_kinds.h"
#include "pv_deploy.h"
#include "pv_json.h"
#include "pv_log.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "wk_node_deploy.h"

/* How long a deploy sleeps in XREAD for news of its children. Their streams' end entries wake
 * it when they finish; this bounds the wait for a child that ends without output (its agent
 * lost, say) and for a cancel. */
#define WAIT_MS 200
#define DEFAULT_NODE_TIMEOUT_MS 60000
#define DEFAULT_PLAN_TIMEOUT_MS 10000

typedef struct deploy_ctx {
    wk_op *op; /* NULL in the lease-free hand-over (wk_deploy_prelease) */
    /* what the plan and a node's params need, the operation's or given without one */
    pv_redis *r;
    const pv_keys *k;
    const pv_config *cfg;
    const char *op_id, *params;
    const char *deploy_b64;
    Pb__DeployOptions *opts;
    char request_id[PV_ID_MAX + 8];
    /* dispatch of one node */
    const char *node;
    json_t *allocs; /* that node's allocations, with their seq numbers */
    const char *reservation;
} deploy_ctx;

static int dup_out(char *text, char **result, pv_status *st) {
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    *result = text;
    return PV_OK;
}

/* The reservation as the reply of a plan request would give it, read back after a crash. */
static int reply_from_reservation(const deploy_ctx *c, const char *resv_id, char **result,
                                  pv_status *st) {
    pv_resv rv;
    if (pv_resv_get(c->r, c->k, resv_id, &rv, st) != PV_OK) return st->code;
    json_t *allocs = json_object(), *plan = json_object();
    for (size_t i = 0; allocs && plan && i < rv.nnodes; i++) {
        json_t *list = json_array();
        for (size_t j = 0; list && j < rv.nodes[i].nallocs; j++) {
            json_t *res = rv.nodes[i].allocs[j] ? json_loads(rv.nodes[i].allocs[j], 0, NULL) : NULL;
            json_array_append_new(list, json_pack("{s:s, s:o}", "id", rv.nodes[i].alloc_ids[j],
                                                  "resources", res ? res : json_object()));
        }
        json_object_set_new(plan, rv.nodes[i].name, json_integer((json_int_t)rv.nodes[i].nallocs));
        json_object_set_new(allocs, rv.nodes[i].name, list ? list : json_array());
    }
    json_t *j =
        json_pack("{s:s, s:o, s:o}", "reservation", resv_id, "plan", plan, "allocations", allocs);
    pv_resv_clear(&rv);
    char *text = j ? pv_json_dumps(j, JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return dup_out(text, result, st);
}

/* The plan: one request "plan-<op id>" to the schedulers, the reply in *result. */
static int ask_plan(const deploy_ctx *c, char **result, pv_status *st) {
    char *body = NULL;
    if (pv_deploy_plan_body(c->opts, c->op_id, &body, st) != PV_OK) return st->code;
    pv_sched_call_opts o = {
        .timeout_ms = c->cfg ? c->cfg->scheduler.request_timeout_ms : DEFAULT_PLAN_TIMEOUT_MS,
        .request_id = c->request_id,
    };
    int rc = pv_sched_call(c->r, c->k, "reserve", body, &o, result, st);
    free(body);
    if (rc == PV_ALREADY_EXISTS) {
        /* Reserved by an earlier delivery that died before journaling the answer (or by the
         * lease-free attempt of this one). */
        char resv_id[PV_ID_MAX + 8];
        snprintf(resv_id, sizeof resv_id, "resv%s", strchr(c->request_id, '-'));
        return reply_from_reservation(c, resv_id, result, st);
    }
    return rc;
}

static int step_reserve(wk_op *op, void *arg, char **result, pv_status *st) {
    (void)op;
    return ask_plan(arg, result, st);
}

/* The params of a node's part: the deploy's, the node, pod, reservation and its allocations
 * there (and a failover's incarnation, wk_ha.h, kept by the deploy's params). */
static char *node_params(deploy_ctx *c, const char *node, json_t *allocs, const char *reservation) {
    json_t *params =
        json_pack("{s:s, s:s, s:s, s:s, s:O}", "deploy", c->deploy_b64, "node", node, "pod",
                  c->opts->podname, "reservation", reservation, "allocations", allocs);
    json_t *all = json_loads(c->params, 0, NULL);
    json_t *inc = json_object_get(all, "incarnate");
    if (params && json_is_object(inc)) json_object_set(params, "incarnate", inc);
    json_decref(all);
    char *text = params ? pv_json_dumps(params, 0) : NULL;
    json_decref(params);
    return text;
}

static int step_dispatch(wk_op *op, void *arg, char **result, pv_status *st) {
    deploy_ctx *c = arg;
    char *text = node_params(c, c->node, c->allocs, c->reservation);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    const pv_op *rec = wk_op_record(op);
    char queue[PV_KEY_MAX], target[PV_KEY_MAX], request_id[PV_KEY_MAX];
    snprintf(queue, sizeof queue, "node:%s", c->node);
    snprintf(target, sizeof target, "deploy:%s:%s", rec->id, c->node);
    snprintf(request_id, sizeof request_id, "%s/%s", rec->id, c->node);
    pv_op_submit_req req = {.kind = PV_KIND_DEPLOY_NODE,
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .request_id = request_id};
    pv_op child;
    bool existed = false;
    int rc =
        pv_op_submit(wk_op_redis(op), wk_op_keys(op), wk_op_opts(op), &req, &child, &existed, st);
    free(text);
    if (rc != PV_OK) return rc;
    rc = dup_out(strdup(child.id), result, st);
    pv_op_clear(&child);
    return rc;
}

/* Tells the relay of a node's part: its operation, how many instances it was given and how
 * many nodes the plan has, so that a relay that has seen every instance of every node succeed
 * can answer its client without waiting for the operations' ends. */
static int announce(wk_op *op, const char *node, const char *child, size_t instances, size_t nodes,
                    pv_status *st) {
    char ni[24], nn[24];
    snprintf(ni, sizeof ni, "%zu", instances);
    snprintf(nn, sizeof nn, "%zu", nodes);
    const char *fields[] = {"type", "node", "op", "instances", "nodes"},
               *values[] = {"node", node, child, ni, nn};
    /* journaled with the pending dispatch step: one fenced call for both, told once */
    char step[PV_KEY_MAX];
    snprintf(step, sizeof step, "announced:%s", node);
    return wk_op_output_step(op, step, 5, fields, values, st);
}

/* Numbers each allocation with its place in the whole deploy (ERU_WORKLOAD_SEQ). */
static void number_allocations(json_t *allocations) {
    const char *node;
    json_t *list;
    json_int_t seq = 0;
    json_object_foreach(allocations, node, list) {
        size_t i;
        json_t *a;
        json_array_foreach(list, i, a) json_object_set_new(a, "seq", json_integer(seq++));
    }
}

static bool finished(pv_op_status s) {
    return s == PV_OP_SUCCEEDED || s == PV_OP_FAILED || s == PV_OP_CANCELLED;
}

/* What wait_children tracks per child, and the scratch arrays of one wait. */
typedef struct child_wait {
    char (*cursors)[PV_OP_CURSOR_MAX]; /* each child's output cursor */
    bool *done, *ended;                /* finished (record read); end entry seen */
    char (*wcur)[PV_OP_CURSOR_MAX];    /* of the children waited on */
    bool *wended;
    const char **wids;
    size_t *widx;
} child_wait;

/* Sleeps until a child not finished yet writes output or ends, WAIT_MS at most, and never past
 * a stop (cancel, lost lease, shutdown) by more than that. *woke: whether any child had news. */
static int wait_news(wk_op *op, char **children, size_t n, child_wait *w, bool *woke,
                     pv_status *st) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!w->done[i]) {
            w->wids[m] = children[i];
            w->widx[m] = i;
            memcpy(w->wcur[m++], w->cursors[i], PV_OP_CURSOR_MAX);
        }
    if (pv_op_output_wait(wk_op_redis(op), wk_op_keys(op), m, w->wids, w->wcur, WAIT_MS, woke,
                          w->wended, st) != PV_OK)
        return st->code;
    for (size_t j = 0; j < m; j++) {
        memcpy(w->cursors[w->widx[j]], w->wcur[j], PV_OP_CURSOR_MAX);
        w->ended[w->widx[j]] = w->wended[j];
    }
    return wk_op_sleep(op, 0, st);
}

/* Reads child i's record: done, and failed, when it has finished; cancels it when no agent took
 * it within timeout. */
static int check_child(wk_op *op, char **children, size_t i, child_wait *w, int64_t timeout,
                       size_t *failed, pv_status *st) {
    pv_op child;
    int rc = pv_op_get(wk_op_redis(op), wk_op_keys(op), children[i], &child, st);
    if (rc == PV_NOT_FOUND) { /* expired: long finished */
        w->done[i] = true;
        return PV_OK;
    }
    if (rc != PV_OK) return rc;
    if (finished(child.status)) {
        w->done[i] = true;
        *failed += child.status != PV_OP_SUCCEEDED;
    } else if (child.status == PV_OP_PENDING && pv_time_now_ms() - child.created_ms > timeout) {
        pv_op out;
        pv_warn("deploy %s: no agent took %s on queue %s within %lld ms; cancelling it",
                wk_op_record(op)->id, child.id, child.queue, (long long)timeout);
        if (pv_op_cancel(wk_op_redis(op), wk_op_keys(op), wk_op_opts(op), child.id, &out, st) ==
            PV_OK)
            pv_op_clear(&out);
    }
    pv_op_clear(&child);
    return PV_OK;
}

/* Waits for every child; cancels those no agent took in time. *failed_nodes counts children
 * that did not succeed. A child's record is read when its end entry arrives; every record not
 * finished is read again when a wait brings no news or a second has passed since the last
 * full pass (children that end without output, children no agent takes). */
static int wait_loop(wk_op *op, char **children, size_t n, child_wait *w, size_t *failed_nodes,
                     pv_status *st) {
    const pv_config *cfg = wk_op_config(op);
    int64_t timeout = cfg ? cfg->worker.node_op_timeout_ms : DEFAULT_NODE_TIMEOUT_MS;
    size_t failed = 0;
    /* the children were just submitted: their records can only say pending until a wait
     * brings news or a second passes */
    bool full = false;
    int64_t last_full = pv_time_now_ms();
    for (;;) {
        size_t left = 0;
        for (size_t i = 0; i < n; i++) {
            if (!w->done[i] && (full || w->ended[i]) &&
                check_child(op, children, i, w, timeout, &failed, st) != PV_OK)
                return st->code;
            left += !w->done[i];
        }
        if (full) last_full = pv_time_now_ms();
        if (left == 0) {
            *failed_nodes = failed;
            return PV_OK;
        }
        bool woke = false;
        if (wait_news(op, children, n, w, &woke, st) != PV_OK) return st->code;
        full = !woke || pv_time_now_ms() - last_full >= 1000;
    }
}

static int wait_children(wk_op *op, char **children, size_t n, size_t *failed_nodes,
                         pv_status *st) {
    *failed_nodes = 0;
    size_t c = n ? n : 1;
    child_wait w = {.cursors = calloc(c, sizeof *w.cursors),
                    .done = calloc(c, sizeof *w.done),
                    .ended = calloc(c, sizeof *w.ended),
                    .wcur = calloc(c, sizeof *w.wcur),
                    .wended = calloc(c, sizeof *w.wended),
                    .wids = calloc(c, sizeof *w.wids),
                    .widx = calloc(c, sizeof *w.widx)};
    int rc = w.cursors && w.done && w.ended && w.wcur && w.wended && w.wids && w.widx
                 ? wait_loop(op, children, n, &w, failed_nodes, st)
                 : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(w.cursors);
    free(w.done);
    free(w.ended);
    free(w.wcur);
    free(w.wended);
    free(w.wids);
    free(w.widx);
    return rc;
}

/* What a hand-over of a one-node plan writes: the node's queue, the node part's params and the
 * announcement of the operation as its own node part (fields/values: 5). */
typedef struct handover_msg {
    char queue[PV_KEY_MAX], instances[24];
    char *params;
    const char *fields[5], *values[5];
    int timeout_ms;
} handover_msg;

static int handover_msg_init(handover_msg *m, deploy_ctx *c, json_t *allocations,
                             const char *reservation, pv_status *st) {
    const char *node = json_object_iter_key(json_object_iter(allocations));
    json_t *list = json_object_iter_value(json_object_iter(allocations));
    if (!(m->params = node_params(c, node, list, reservation)))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    snprintf(m->queue, sizeof m->queue, "node:%s", node);
    snprintf(m->instances, sizeof m->instances, "%zu", json_array_size(list));
    const char *fields[] = {"type", "node", "op", "instances", "nodes"},
               *values[] = {"node", node, c->op_id, m->instances, "1"};
    memcpy(m->fields, fields, sizeof fields);
    memcpy(m->values, values, sizeof values);
    m->timeout_ms = c->cfg ? c->cfg->worker.node_op_timeout_ms : DEFAULT_NODE_TIMEOUT_MS;
    return PV_OK;
}

/* A plan on one node: this operation itself goes on on that node's agent (wk_op_handover) with
 * the node part's params, announced as its own node part; wk_deploy_create runs the rest there.
 * One operation instead of a deploy and a node part: no second submit, lease, wait and end. */
static int hand_over(deploy_ctx *c, json_t *allocations, const char *reservation, pv_status *st) {
    handover_msg m;
    if (handover_msg_init(&m, c, allocations, reservation, st) != PV_OK) return st->code;
    int rc = wk_op_handover(c->op, m.queue, m.params, m.timeout_ms, 5, m.fields, m.values, st);
    free(m.params);
    return rc;
}

/* What a handed-over deploy (hand_over) does where it runs next: on its node's agent, the node
 * part's instances (wk_node_deploy_create), to the end even when cancelled, as a node part
 * already sent would be; back on the ops queue (a cancel, or no agent took it in time), nothing
 * more. Then the reservation's unused allocations go back, unless a retry will follow. */
static int run_handed(wk_op *op, pv_status *st) {
    const pv_op *rec = wk_op_record(op);
    bool on_node = rec->queue && strcmp(rec->queue, "ops") != 0, ended = false;
    const char *reservation = wk_op_param(op, "reservation");
    int rc = PV_OK;
    if (on_node) {
        wk_op_begin_cleanup(op);
        rc = wk_node_deploy_create_ending(op, reservation, &ended, st);
        /* delivered again (or owned by another worker now): the reservation is still needed */
        if (rc != PV_OK && wk_code_transient(rc) && !wk_op_failure_final(op)) return rc;
    }
    pv_status rst;
    /* ended by the last instance's record: nothing to give back, nothing to read */
    if (!ended && pv_resv_release(wk_op_redis(op), wk_op_keys(op), reservation, &rst) != PV_OK &&
        rst.code != PV_NOT_FOUND) {
        if (rc == PV_OK)
            rc = pv_status_set(st, rst.code, "releasing reservation %s: %s", reservation, rst.msg);
        return rc;
    }
    if (rc != PV_OK) return rc;
    if (!on_node || wk_op_is_cancelled(op))
        return pv_status_set(st, PV_CANCELLED, "deploy cancelled: %s",
                             on_node ? "the instances already sent to the node were finished"
                                     : "no instance was made; its reservation was given back");
    wk_op_set_end_message(op, "deployed on 1 node(s)");
    return PV_OK;
}

static int run(deploy_ctx *c, pv_status *st) {
    wk_op *op = c->op;
    char *reply = NULL;
    /* journaled with what follows: the first dispatch, or given up by the hand-over, whose
     * params carry the plan */
    if (wk_op_step_pending(op, "reserve", step_reserve, c, &reply, st) != PV_OK) {
        /* Not enough resource is the deploy's answer, not a passing fault: no retries. */
        if (st->code == PV_RESOURCE_EXHAUSTED) st->code = PV_FAILED_PRECONDITION;
        return st->code;
    }
    json_t *plan = json_loads(reply, 0, NULL);
    free(reply);
    json_t *allocations = json_object_get(plan, "allocations");
    const char *reservation = json_string_value(json_object_get(plan, "reservation"));
    if (!json_is_object(allocations) || !reservation) {
        json_decref(plan);
        return pv_status_set(st, PV_INTERNAL, "deploy: the plan reply has no allocations");
    }
    number_allocations(allocations);
    size_t nnodes = json_object_size(allocations), n = 0;
    if (nnodes == 1) {
        int hrc = hand_over(c, allocations, reservation, st);
        json_decref(plan);
        return hrc;
    }
    char **children = calloc(nnodes ? nnodes : 1, sizeof *children);
    int rc = children ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    const char *node;
    json_t *list;
    json_object_foreach(allocations, node, list) {
        if (rc != PV_OK) break;
        char step[PV_KEY_MAX];
        snprintf(step, sizeof step, "dispatch:%s", node);
        c->node = node;
        c->allocs = list;
        c->reservation = reservation;
        /* a redelivery that finds no dispatch journaled submits again: the node operation's
         * idempotency key answers with the one submitted before */
        rc = wk_op_step_pending(op, step, step_dispatch, c, &children[n], st);
        if (rc == PV_OK) rc = announce(op, node, children[n++], json_array_size(list), nnodes, st);
    }
    size_t failed_nodes = 0;
    if (rc == PV_OK) rc = wait_children(op, children, n, &failed_nodes, st);
    bool cancelled = rc == PV_CANCELLED;
    if (cancelled) {
        /* A cancel stops the deploy, not the node operations already sent: they finish, and
         * what none of their workloads took goes back now, not when the reservation expires
         * (until then its node could not be removed). The deploy still ends CANCELLED. */
        pv_status cst;
        wk_op_begin_cleanup(op);
        rc = wait_children(op, children, n, &failed_nodes, &cst);
        if (rc != PV_OK) *st = cst;
    }
    if (rc == PV_OK) {
        /* What no workload took over goes back: the failed instances' allocations. */
        pv_status rst;
        if (pv_resv_release(wk_op_redis(op), wk_op_keys(op), reservation, &rst) != PV_OK &&
            rst.code != PV_NOT_FOUND)
            rc = pv_status_set(st, rst.code, "releasing reservation %s: %s", reservation, rst.msg);
    }
    if (cancelled && rc == PV_OK)
        rc = pv_status_set(st, PV_CANCELLED,
                           "deploy cancelled; the instances already sent to nodes were finished");
    if (rc == PV_OK) /* said by the end itself: a round trip less */
        wk_op_set_end_message(op, "deployed on %zu node(s), %zu of them with failures", n,
                              failed_nodes);
    for (size_t i = 0; i < n; i++)
        free(children[i]);
    free(children);
    json_decref(plan);
    return rc;
}

int wk_deploy_create(wk_op *op, pv_status *st) {
    if (wk_op_param(op, "reservation")) return run_handed(op, st);
    deploy_ctx c = {.op = op,
                    .r = wk_op_redis(op),
                    .k = wk_op_keys(op),
                    .cfg = wk_op_config(op),
                    .op_id = wk_op_record(op)->id,
                    .params = wk_op_record(op)->params,
                    .deploy_b64 = wk_op_param(op, "deploy")};
    if (!c.deploy_b64)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "params.deploy: required (base64 of "
                             "pb.DeployOptions)");
    unsigned char *bytes = NULL;
    size_t len = 0;
    if (pv_b64_decode("params.deploy", c.deploy_b64, &bytes, &len, st) != PV_OK) return st->code;
    c.opts = pb__deploy_options__unpack(NULL, len, bytes);
    free(bytes);
    if (!c.opts)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "params.deploy: not a pb.DeployOptions message");
    snprintf(c.request_id, sizeof c.request_id, "plan-%s", wk_op_record(op)->id);
    int rc = pv_deploy_check(c.opts, st);
    if (rc == PV_OK) rc = run(&c, st);
    pb__deploy_options__free_unpacked(c.opts, NULL);
    return rc;
}

/* ---- the lease-free hand-over ---- */

/* A delivery the lease-free path may take: a deploy never run, PENDING on this very entry of
 * the ops queue, not cancelled, not handed back (its params carry no reservation). */
static bool fresh_deploy(const pv_op *rec, const wk_prelease *p, json_t *params) {
    return rec->status == PV_OP_PENDING && rec->attempts == 0 && rec->started_ms == 0 &&
           !rec->cancel_requested && rec->kind && strcmp(rec->kind, PV_KIND_DEPLOY) == 0 &&
           rec->queue && strcmp(rec->queue, p->queue) == 0 && rec->entry &&
           strcmp(rec->entry, p->entry) == 0 && json_is_object(params) &&
           !json_object_get(params, "reservation") &&
           json_is_string(json_object_get(params, "deploy"));
}

/* The record moved while it was planned: ended (cancelled), its reservation has nobody left to
 * give it back, so it goes back now; still going (another worker claimed it), it is that one's. */
static void after_moved(const wk_prelease *p, const char *reservation) {
    pv_op rec = {0};
    pv_status st;
    if (pv_op_get(p->redis, p->keys, p->op_id, &rec, &st) == PV_OK && pv_op_done(&rec) &&
        pv_resv_release(p->redis, p->keys, reservation, &st) != PV_OK && st.code != PV_NOT_FOUND)
        pv_warn("deploy %s ended while planned: reservation %s not given back: %s (it expires)",
                p->op_id, reservation, st.msg);
    pv_op_clear(&rec);
}

/* Plans c's deploy and, on one node, hands the operation over there; true when it went. */
static bool plan_and_hand_over(deploy_ctx *c, const wk_prelease *p) {
    char *reply = NULL;
    pv_status st;
    if (ask_plan(c, &reply, &st) != PV_OK) {
        pv_debug("deploy %s: no lease-free plan (%s): leased as ever", p->op_id, st.msg);
        return false;
    }
    json_t *plan = json_loads(reply, 0, NULL);
    free(reply);
    json_t *allocations = json_object_get(plan, "allocations");
    const char *reservation = json_string_value(json_object_get(plan, "reservation"));
    bool went = false;
    handover_msg m = {0};
    /* more nodes: the leased run's reserve step finds this reservation (ALREADY_EXISTS) */
    if (json_object_size(allocations) == 1 && reservation) {
        number_allocations(allocations);
        bool moved = false;
        int rc = handover_msg_init(&m, c, allocations, reservation, &st);
        if (rc == PV_OK)
            rc = pv_op_handover_pending(p->redis, p->keys, p->opts, p->op_id, p->queue, p->entry,
                                        p->consumer, m.queue, m.params, m.timeout_ms, 5, m.fields,
                                        m.values, &moved, &st);
        went = rc == PV_OK && !moved;
        if (rc == PV_OK && moved) after_moved(p, reservation);
        if (went)
            pv_info("op id=%s kind=%s planned and handed to queue=%s without a lease", p->op_id,
                    PV_KIND_DEPLOY, m.queue);
        else if (rc != PV_OK)
            pv_warn("deploy %s: lease-free hand-over: %s; leased as ever", p->op_id, st.msg);
    }
    free(m.params);
    json_decref(plan);
    return went;
}

bool wk_deploy_prelease(const wk_prelease *p) {
    pv_op rec = {0};
    pv_status st;
    if (pv_op_get(p->redis, p->keys, p->op_id, &rec, &st) != PV_OK) return false;
    json_t *params = json_loads(rec.params ? rec.params : "{}", 0, NULL);
    bool went = false;
    if (fresh_deploy(&rec, p, params)) {
        deploy_ctx c = {.r = p->redis,
                        .k = p->keys,
                        .cfg = p->cfg,
                        .op_id = rec.id,
                        .params = rec.params,
                        .deploy_b64 = json_string_value(json_object_get(params, "deploy"))};
        unsigned char *bytes = NULL;
        size_t len = 0;
        if (pv_b64_decode("params.deploy", c.deploy_b64, &bytes, &len, &st) == PV_OK)
            c.opts = pb__deploy_options__unpack(NULL, len, bytes);
        free(bytes);
        snprintf(c.request_id, sizeof c.request_id, "plan-%s", rec.id);
        /* a bad deploy is failed by the leased run, which says why */
        if (c.opts && pv_deploy_check(c.opts, &st) == PV_OK) went = plan_and_hand_over(&c, p);
        if (c.opts) pb__deploy_options__free_unpacked(c.opts, NULL);
    }
    json_decref(params);
    pv_op_clear(&rec);
    return went;
}
