/*
 * svc_core_exec: LogStream, RunAndWait and ExecuteWorkload (see svc_core_exec.h). An
 * interactive ExecuteWorkload runs a thread of its own (the relay of its output), so their
 * number is bounded per gateway.
 */
#include "svc_core_exec.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_deploy.h"
#include "pv_id.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_op.h"
#include "pv_time.h"
#include "pv_workload.h"
#include "svc_eru.h"
#include "svc_nodeop.h"
#include "svc_relay.h"

#define N_METHODS 3

struct svc_core_exec {
    gw_app *app;
    atomic_int sessions; /* interactive ExecuteWorkload sessions running */
    gw_method methods[N_METHODS];
};

svc_core_exec *svc_core_exec_new(gw_app *app) {
    svc_core_exec *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_exec_free(svc_core_exec *s) {
    free(s);
}

static int attach_send(gw_call *call, const char *id, const char *data, size_t len,
                       Pb__StdStreamType type) {
    Pb__AttachWorkloadMessage m = PB__ATTACH_WORKLOAD_MESSAGE__INIT;
    m.workload_id = (char *)id;
    m.data.data = (uint8_t *)data;
    m.data.len = len;
    m.std_stream_type = type;
    return gw_call_send(call, &m.base);
}

/* Submits workload.log_on_node with params (borrowed) on node, one attempt (a log read twice
 * would repeat lines); op_id (PV_ID_MAX) gets its id. flags: gw_app_submit's. */
static int submit_log(gw_call *call, unsigned flags, const char *node, json_t *params, char *op_id,
                      pv_status *st) {
    if (!params) return pv_status_set(st, PV_INTERNAL, "out of memory");
    svc_nodeop_req q = {.node = node,
                        .kind = PV_KIND_LOG_NODE,
                        .target_prefix = "logs",
                        .params = params,
                        .max_attempts = 1,
                        .flags = flags};
    return svc_nodeop_submit_req(call, &q, op_id, st);
}

/* Whether a lookup's failure says the id names no workload (not that the lookup failed). */
static bool names_none(const pv_status *st) {
    return st->code == PV_NOT_FOUND || st->code == PV_INVALID_ARGUMENT;
}

/* LogStream: one operation on the workload's node; its output lines are relayed as they come,
 * and the operation is cancelled when the client goes (a followed log never ends otherwise).
 * Follows Eru's calcium.LogStream: a workload it cannot get is the one message {id, error}. */
static void on_log_stream(gw_call *call, const ProtobufCMessage *req) {
    const Pb__LogStreamOptions *o = (const Pb__LogStreamOptions *)req;
    int64_t since_ms = 0, until_ms = 0, now = pv_time_now_ms();
    pv_status tst;
    if ((o->since && *o->since &&
         pv_time_parse("since", o->since, now, &since_ms, &tst) != PV_OK) ||
        (o->until && *o->until &&
         pv_time_parse("until", o->until, now, &until_ms, &tst) != PV_OK)) {
        gw_call_finishf(call, ERU_LOG_STREAM, "%s", tst.msg);
        return;
    }
    if (since_ms > 0 && until_ms > 0 && until_ms < since_ms) {
        gw_call_finishf(call, ERU_LOG_STREAM, "until: \"%s\" is before since \"%s\"", o->until,
                        o->since);
        return;
    }
    pv_redis *r = gw_app_redis(call);
    gw_app *app = ((gw_app *)gw_call_app(call));
    pv_workload w;
    pv_status st;
    int rc = pv_workload_get(r, &app->keys, o->id, &w, &st);
    if (rc != PV_OK && names_none(&st)) {
        Pb__LogStreamMessage m = PB__LOG_STREAM_MESSAGE__INIT;
        m.id = o->id;
        m.error = st.msg;
        if (gw_call_send(call, &m.base) == 0) gw_call_finish(call, PV_OK, NULL);
        return;
    }
    if (rc != PV_OK) {
        gw_call_finishf(call, ERU_LOG_STREAM, "%s", st.msg);
        return;
    }
    json_t *params = json_pack("{s:s, s:s, s:b, s:I, s:I}", "id", w.id, "tail",
                               o->tail && *o->tail ? o->tail : "all", "follow", o->follow,
                               "since_ms", (json_int_t)since_ms, "until_ms", (json_int_t)until_ms);
    char op_id[PV_ID_MAX] = "", after[32] = "0";
    rc = submit_log(call, 0, w.node, params, op_id, &st);
    json_decref(params);
    pv_op_opts oo = gw_app_op_opts(app);
    for (bool over = false; rc == PV_OK;) {
        if (gw_call_is_closed(call)) {
            pv_op out;
            if (pv_op_cancel(r, &app->keys, &oo, op_id, &out, &st) == PV_OK) pv_op_clear(&out);
            rc = PV_CANCELLED;
            break;
        }
        pv_op_output *entries = NULL;
        size_t n = 0;
        if ((rc = pv_op_output_read(r, &app->keys, op_id, after, 200, over ? 0 : 200, &entries, &n,
                                    &st)) != PV_OK)
            break;
        for (size_t i = 0; rc == PV_OK && i < n; i++) {
            snprintf(after, sizeof after, "%s", entries[i].id);
            if (strcmp(svc_nodeop_value(&entries[i], "type"), "log") != 0) continue; /* exit, ... */
            const char *data = svc_nodeop_value(&entries[i], "data");
            Pb__LogStreamMessage m = PB__LOG_STREAM_MESSAGE__INIT;
            m.id = w.id;
            m.data.data = (uint8_t *)data;
            m.data.len = strlen(data);
            /* engines that keep the streams apart (docker) say which one */
            m.std_stream_type = strcmp(svc_nodeop_value(&entries[i], "stream"), "stderr") == 0
                                    ? PB__STD_STREAM_TYPE__STDERR
                                    : PB__STD_STREAM_TYPE__STDOUT;
            if (gw_call_send(call, &m.base) != 0) rc = PV_CANCELLED;
        }
        pv_op_output_free(entries, n);
        if (rc != PV_OK || (over && n == 0)) break;
        pv_op latest;
        if ((rc = pv_op_get(r, &app->keys, op_id, &latest, &st)) != PV_OK) break;
        over = latest.status == PV_OP_SUCCEEDED || latest.status == PV_OP_FAILED ||
               latest.status == PV_OP_CANCELLED;
        if (over && latest.status == PV_OP_FAILED) {
            /* Eru reports a log's failure in the stream's own error field. */
            Pb__LogStreamMessage m = PB__LOG_STREAM_MESSAGE__INIT;
            m.id = w.id;
            m.error = latest.error_message;
            m.std_stream_type = PB__STD_STREAM_TYPE__ERUERROR;
            if (gw_call_send(call, &m.base) != 0) rc = PV_CANCELLED;
        }
        pv_op_clear(&latest);
    }
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_LOG_STREAM, "%s", st.msg);
    pv_workload_clear(&w);
}

/* One workload's followed log, relayed until it ends; *code gets its exit code. */
typedef struct lambda_log {
    const char *id;
    char op[PV_ID_MAX], after[32];
    int code;
    bool done;
} lambda_log;

/* Sleeps until a log not done yet has news (a line, its end), SVC_RELAY_WAIT_MS at most. */
static int wait_logs(svc_relay *rl, const lambda_log *logs, size_t n, pv_status *st) {
    const char **ids = calloc(n, sizeof *ids);
    char(*cursors)[PV_OP_CURSOR_MAX] = calloc(n, sizeof *cursors);
    size_t m = 0;
    int rc = ids && cursors ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        if (!logs[i].done) {
            ids[m] = logs[i].op;
            snprintf(cursors[m++], PV_OP_CURSOR_MAX, "%s", logs[i].after);
        }
    bool woke;
    if (rc == PV_OK && m)
        rc = pv_op_output_wait(rl->r, rl->k, m, ids, cursors, SVC_RELAY_WAIT_MS, &woke, NULL, st);
    free(ids);
    free(cursors);
    return rc;
}

/* Relays the logs to the client; detached (async), they go to the gateway's log instead, until
 * deadline_ms (monotonic; 0 = none). */
static int follow_logs(gw_call *call, svc_relay *rl, lambda_log *logs, size_t n, bool detached,
                       int64_t deadline_ms, pv_status *st) {
    pv_op_opts oo = gw_app_op_opts(gw_call_app(call));
    for (size_t left = n; left > 0;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool late = deadline_ms > 0 && now.tv_sec * 1000LL + now.tv_nsec / 1000000 > deadline_ms;
        if ((!detached && gw_call_is_closed(call)) || late) {
            for (size_t i = 0; i < n; i++) {
                pv_op out;
                if (!logs[i].done && pv_op_cancel(rl->r, rl->k, &oo, logs[i].op, &out, st) == PV_OK)
                    pv_op_clear(&out);
            }
            return late ? pv_status_set(st, PV_DEADLINE_EXCEEDED, "async_timeout passed")
                        : pv_status_set(st, PV_CANCELLED, "client gone");
        }
        for (size_t i = 0; i < n; i++) {
            lambda_log *l = &logs[i];
            if (l->done) continue;
            pv_op rec;
            if (pv_op_get(rl->r, rl->k, l->op, &rec, st) != PV_OK) return st->code;
            bool over = rec.status == PV_OP_SUCCEEDED || rec.status == PV_OP_FAILED ||
                        rec.status == PV_OP_CANCELLED;
            pv_op_clear(&rec);
            pv_op_output *out = NULL;
            size_t got = 0;
            if (pv_op_output_read(rl->r, rl->k, l->op, l->after, 200, 0, &out, &got, st) != PV_OK)
                return st->code;
            int rc = PV_OK;
            for (size_t j = 0; rc == PV_OK && j < got; j++) {
                snprintf(l->after, sizeof l->after, "%s", out[j].id);
                const char *type = svc_nodeop_value(&out[j], "type");
                if (strcmp(type, "exit") == 0) {
                    l->code = atoi(svc_nodeop_value(&out[j], "code"));
                } else if (strcmp(type, "log") == 0 && detached) {
                    pv_info("RunAndWait async %s: %s", l->id, svc_nodeop_value(&out[j], "data"));
                } else if (strcmp(type, "log") == 0) {
                    char *line = NULL;
                    int len = asprintf(&line, "%s\n", svc_nodeop_value(&out[j], "data"));
                    if (len < 0 || attach_send(call, l->id, line, (size_t)len,
                                               PB__STD_STREAM_TYPE__STDOUT) != 0)
                        rc = pv_status_set(st, PV_CANCELLED, "client gone");
                    free(line);
                }
            }
            pv_op_output_free(out, got);
            if (rc != PV_OK) return rc;
            if (over && got == 0) {
                l->done = true;
                left--;
            }
        }
        if (left > 0 && wait_logs(rl, logs, n, st) != PV_OK) return st->code;
    }
    return PV_OK;
}

/* The followed log of a RunAndWait's workload id: the deploy was let through, so it is a part,
 * counted but never refused. */
static int submit_log_part(gw_call *call, const char *id, const char *node, char *op_id,
                           pv_status *st) {
    json_t *params = json_pack("{s:s, s:s, s:b}", "id", id, "tail", "all", "follow", 1);
    int rc = submit_log(call, GW_SUBMIT_PART, node, params, op_id, st);
    json_decref(params);
    return rc;
}

/* The instances that could not be created, after the IDs of those that were: each an empty
 * id, then "Create workload failed ERR" (ERUERROR), as Eru's RunAndWait tells them; detached
 * (async), those lines go to the gateway's log as the output does. */
static int send_failed_creates(gw_call *call, json_t *failures, bool async, pv_status *st) {
    size_t i;
    json_t *f;
    json_array_foreach(failures, i, f) {
        if (attach_send(call, "", "", 0, PB__STD_STREAM_TYPE__TYPEWORKLOADID) != 0)
            return pv_status_set(st, PV_CANCELLED, "client gone");
    }
    json_array_foreach(failures, i, f) {
        char *line = NULL;
        int len = asprintf(&line, "Create workload failed %s", json_string_value(f));
        if (len < 0) return pv_status_set(st, PV_INTERNAL, "out of memory");
        int sent = 0;
        if (async)
            pv_info("RunAndWait async: %s", line);
        else
            sent = attach_send(call, "", line, (size_t)len, PB__STD_STREAM_TYPE__ERUERROR);
        free(line);
        if (sent != 0) return pv_status_set(st, PV_CANCELLED, "client gone");
    }
    return PV_OK;
}

/* Creates, follows to the end, reports "[exitcode] N" and removes the workloads.
 * Follows Eru's calcium.RunAndWait: an instance that could not be created (all of them when no
 * plan fits) is told in the stream, and the call ends OK. */
static int lambda_run(gw_call *call, svc_relay *rl, const Pb__DeployOptions *o, bool async,
                      int async_timeout_s, pv_status *st) {
    int rc = svc_relay_submit_deploy(call, o, rl, st);
    if (rc == PV_OK) rc = svc_relay_run(rl, st);
    /* svc_relay_run: the deploy failed before asking any node (Eru: its create's one message) */
    if (rc == PV_FAILED_PRECONDITION && rl->n == 0 &&
        json_array_append_new(rl->failures, json_string(st->msg)) == 0)
        rc = PV_OK;
    size_t n = json_array_size(rl->created);
    lambda_log *logs = n ? calloc(n, sizeof *logs) : NULL;
    if (rc == PV_OK && n && !logs) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        json_t *c = json_array_get(rl->created, i);
        logs[i].id = json_string_value(json_object_get(c, "id"));
        snprintf(logs[i].after, sizeof logs[i].after, "0");
        if (attach_send(call, logs[i].id, logs[i].id, strlen(logs[i].id),
                        PB__STD_STREAM_TYPE__TYPEWORKLOADID) != 0)
            rc = pv_status_set(st, PV_CANCELLED, "client gone");
        else
            rc = submit_log_part(call, logs[i].id, json_string_value(json_object_get(c, "node")),
                                 logs[i].op, st);
    }
    if (rc == PV_OK) rc = send_failed_creates(call, rl->failures, async, st);
    int64_t deadline = 0;
    if (rc == PV_OK && async) {
        /* Detached: the client has its IDs; the gateway follows the output into its log for at
         * most async_timeout seconds, then removes the workloads as always. */
        gw_call_finish(call, PV_OK, NULL);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        deadline = now.tv_sec * 1000LL + now.tv_nsec / 1000000 +
                   1000LL * (async_timeout_s > 0 ? async_timeout_s : 600);
    }
    if (rc == PV_OK) rc = follow_logs(call, rl, logs, n, async, deadline, st);
    for (size_t i = 0; rc == PV_OK && !async && i < n; i++) {
        char line[64];
        int len = snprintf(line, sizeof line, "[exitcode] %d", logs[i].code);
        if (attach_send(call, logs[i].id, line, (size_t)len, PB__STD_STREAM_TYPE__STDOUT) != 0)
            rc = pv_status_set(st, PV_CANCELLED, "client gone");
    }
    /* RunAndWait always removes its workloads, whatever happened above. */
    if (n > 0) {
        /* the clean-up of a call that has submitted already: never refused */
        svc_relay rm;
        svc_relay_init(&rm, call, rl->r, NULL);
        rm.quiet = true;
        rm.part = true;
        json_t *by_node = json_object();
        for (size_t i = 0; by_node && i < n; i++) {
            json_t *c = json_array_get(rl->created, i);
            const char *node = json_string_value(json_object_get(c, "node"));
            json_t *list = json_object_get(by_node, node);
            if (!list) json_object_set_new(by_node, node, list = json_array());
            json_array_append(list, json_object_get(c, "id"));
        }
        const char *node;
        json_t *ids;
        pv_status rst;
        int rrc = PV_OK;
        json_object_foreach(by_node, node, ids) {
            if (rrc == PV_OK)
                rrc = svc_relay_submit_node_op(call, &rm, PV_KIND_REMOVE_NODE, node, ids, NULL,
                                               true, &rst);
        }
        json_decref(by_node);
        if (rrc == PV_OK) rrc = svc_relay_run(&rm, &rst);
        if (rrc != PV_OK && rrc != PV_CANCELLED)
            pv_warn("RunAndWait operation=%s: removing its workloads: %s", rl->parent, rst.msg);
        svc_relay_free(&rm);
    }
    free(logs);
    return rc;
}

static void lambda_free(void *p) {
    free(p);
}

/* The first message carries the options; later ones would be stdin, which the process engine
 * does not take (open_stdin), so they are read and dropped.
 * Follows Eru's calcium.RunAndWait: only bad options fail the call (lambda_run). */
static void on_run_and_wait(gw_call *call, const ProtobufCMessage *msg) {
    if (gw_call_user(call)) return; /* started: stdin or the half-close */
    if (!msg) {
        gw_call_finish(call, ERU_RUN_AND_WAIT, "RunAndWait: no options were sent");
        return;
    }
    gw_call_set_user(call, calloc(1, 1), lambda_free);
    const Pb__RunAndWaitOptions *o = (const Pb__RunAndWaitOptions *)msg;
    Pb__DeployOptions *d = o->deploy_options;
    pv_status st;
    if (!d) {
        gw_call_finish(call, ERU_RUN_AND_WAIT, "deploy_options: required");
        return;
    }
    /* cmd replaces the entrypoint's command, split on blanks as Eru does. */
    char *cmd = o->cmd.len ? strndup((const char *)o->cmd.data, o->cmd.len) : strdup(""),
         *save = NULL;
    char *argv[256];
    size_t argc = 0;
    for (char *t = cmd ? strtok_r(cmd, " \t\n", &save) : NULL; t && argc < 256;
         t = strtok_r(NULL, " \t\n", &save))
        argv[argc++] = t;
    char **old_commands = NULL;
    size_t old_n = 0;
    if (argc > 0 && d->entrypoint) {
        old_commands = d->entrypoint->commands;
        old_n = d->entrypoint->n_commands;
        d->entrypoint->commands = argv;
        d->entrypoint->n_commands = argc;
    }
    int rc = pv_deploy_check(d, &st);
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, d->podname);
    rl.quiet = true;
    rl.created = json_array();
    rl.failures = json_array();
    if (rc == PV_OK) rc = lambda_run(call, &rl, d, o->async, o->async_timeout, &st);
    if (o->async && rc != PV_OK) pv_warn("RunAndWait async operation=%s: %s", rl.parent, st.msg);
    if (d->entrypoint && argc > 0) {
        d->entrypoint->commands = old_commands;
        d->entrypoint->n_commands = old_n;
    }
    free(cmd);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_RUN_AND_WAIT, "%s", st.msg);
    json_decref(rl.created);
    json_decref(rl.failures);
    svc_relay_free(&rl);
}

/* ---- ExecuteWorkload ------------------------------------------------------------------------ */

/* Submits the exec of o on its workload's node: op_id (PV_ID_MAX) names it; *w is the workload
 * (pv_workload_clear); *unknown: the id names no workload. interactive: the command's input
 * and output stream while it runs. */
static int submit_exec(gw_call *call, const Pb__ExecuteWorkloadOptions *o, bool interactive,
                       char *op_id, pv_workload *w, bool *unknown, pv_status *st) {
    memset(w, 0, sizeof *w);
    *unknown = false;
    if (o->n_commands == 0) return pv_status_set(st, PV_INVALID_ARGUMENT, "commands: required");
    pv_redis *r = gw_app_redis(call);
    gw_app *app = ((gw_app *)gw_call_app(call));
    if (pv_workload_get(r, &app->keys, o->workload_id, w, st) != PV_OK) {
        *unknown = names_none(st);
        return st->code;
    }
    json_t *cmds = json_array(), *envs = json_array();
    for (size_t i = 0; cmds && i < o->n_commands; i++)
        json_array_append_new(cmds, json_string(o->commands[i]));
    for (size_t i = 0; envs && i < o->n_envs; i++)
        json_array_append_new(envs, json_string(o->envs[i]));
    json_t *params =
        json_pack("{s:s, s:o, s:o, s:s, s:b}", "id", w->id, "commands", cmds, "envs", envs,
                  "workdir", o->workdir ? o->workdir : "", "interactive", interactive);
    /* One attempt: a command is not run twice behind the client's back. */
    svc_nodeop_req q = {.node = w->node,
                        .kind = PV_KIND_EXEC_NODE,
                        .target_prefix = "exec",
                        .params = params,
                        .max_attempts = 1};
    int rc = params ? svc_nodeop_submit_req(call, &q, op_id, st)
                    : pv_status_set(st, PV_INTERNAL, "out of memory");
    json_decref(params);
    return rc;
}

/* A command without input: submitted, waited for, its output and exit code sent. */
static int execute(gw_call *call, const Pb__ExecuteWorkloadOptions *o, bool *unknown,
                   pv_status *st) {
    gw_app *app = ((gw_app *)gw_call_app(call));
    pv_workload w;
    char op_id[PV_ID_MAX] = "";
    pv_op rec = {0};
    int rc = submit_exec(call, o, false, op_id, &w, unknown, st);
    pv_redis *r = gw_app_redis(call);
    if (rc == PV_OK) rc = svc_nodeop_wait(call, r, &app->keys, op_id, &rec, st);
    if (rc == PV_OK && rec.status != PV_OP_SUCCEEDED)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s",
                           rec.error_message && *rec.error_message ? rec.error_message
                                                                   : "exec did not run");
    pv_op_clear(&rec);
    pv_op_output *out = NULL;
    size_t n = 0;
    if (rc == PV_OK) rc = pv_op_output_read(r, &app->keys, op_id, "0", 10, 0, &out, &n, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (strcmp(svc_nodeop_value(&out[i], "type"), "exec") != 0) continue;
        unsigned char *data = NULL;
        size_t len = 0;
        if (pv_b64_decode("data", svc_nodeop_value(&out[i], "data"), &data, &len, st) != PV_OK) {
            rc = st->code;
            break;
        }
        char line[64];
        int ll = snprintf(line, sizeof line, "[exitcode] %s", svc_nodeop_value(&out[i], "code"));
        if ((len &&
             attach_send(call, w.id, (const char *)data, len, PB__STD_STREAM_TYPE__STDOUT) != 0) ||
            attach_send(call, w.id, line, (size_t)ll, PB__STD_STREAM_TYPE__STDOUT) != 0)
            rc = pv_status_set(st, PV_CANCELLED, "client gone");
        free(data);
    }
    pv_op_output_free(out, n);
    pv_workload_clear(&w);
    return rc;
}

/* What an ExecuteWorkload call has read: its options (packed: the framework frees the message)
 * and, with open_stdin, the input of the later messages (repl_cmd). */
typedef struct exec_call {
    bool open_stdin;
    char op_id[PV_ID_MAX]; /* interactive: the running exec ("" until submitted) */
    size_t input_total;    /* interactive: bytes of input streamed so far */
} exec_call;

static void exec_call_free(void *p) {
    free(p);
}

/* Ends the call as rc says. Follows Eru's calcium.ExecuteWorkload: a workload it cannot get
 * (unknown) is the stream's one message, the error as its data (stdout), and the call OK. */
static void finish_exec(gw_call *call, const Pb__ExecuteWorkloadOptions *o, int rc, bool unknown,
                        const pv_status *st) {
    if (rc != PV_OK && unknown) {
        if (attach_send(call, o->workload_id, st->msg, strlen(st->msg),
                        PB__STD_STREAM_TYPE__STDOUT) != 0)
            return; /* the client has gone */
        rc = PV_OK;
    }
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_EXECUTE_WORKLOAD, "%s", st->msg);
}

static void exec_now(gw_call *call, const Pb__ExecuteWorkloadOptions *o) {
    pv_status st;
    bool unknown;
    int rc = execute(call, o, &unknown, &st);
    finish_exec(call, o, rc, unknown, &st);
}

/* ---- interactive exec: a relay thread per session ----
 * The input (later messages' repl_cmd) goes to the operation's input stream as it comes, from
 * the call's own handler; a thread of the session relays the output stream to the client as it
 * comes, ends the call with "[exitcode] N", and cancels the operation if the client leaves. At
 * most MAX_SESSIONS run at once on a gateway (each holds a thread and a Redis connection). */

#define MAX_SESSIONS 64

typedef struct exec_relay {
    gw_call *call; /* a reference of its own */
    svc_core_exec *svc;
    char op_id[PV_ID_MAX];
    char wid[PV_WORKLOAD_ID_LEN + 1];
} exec_relay;

static void relay_session(exec_relay *er, pv_redis *r) {
    gw_app *app = er->svc->app;
    char cursor[PV_OP_CURSOR_MAX] = "0";
    for (;;) {
        pv_status st;
        if (gw_call_is_closed(er->call)) {
            pv_op_opts oo = gw_app_op_opts(app);
            pv_op out;
            if (pv_op_cancel(r, &app->keys, &oo, er->op_id, &out, &st) == PV_OK) pv_op_clear(&out);
            return;
        }
        pv_op_output *out = NULL;
        size_t n = 0;
        if (pv_op_output_read(r, &app->keys, er->op_id, cursor, 100, SVC_RELAY_WAIT_MS, &out, &n,
                              &st) != PV_OK) {
            gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
            return;
        }
        bool ended = false;
        for (size_t i = 0; i < n && !ended; i++) {
            snprintf(cursor, sizeof cursor, "%s", out[i].id);
            const char *type = svc_nodeop_value(&out[i], "type");
            if (strcmp(type, "data") == 0) {
                unsigned char *data = NULL;
                size_t len = 0;
                if (pv_b64_decode("data", svc_nodeop_value(&out[i], "data"), &data, &len, &st) ==
                        PV_OK &&
                    len)
                    attach_send(er->call, er->wid, (const char *)data, len,
                                PB__STD_STREAM_TYPE__STDOUT);
                free(data);
            } else if (strcmp(type, "exit") == 0) {
                char line[64];
                int ll =
                    snprintf(line, sizeof line, "[exitcode] %s", svc_nodeop_value(&out[i], "code"));
                attach_send(er->call, er->wid, line, (size_t)ll, PB__STD_STREAM_TYPE__STDOUT);
                gw_call_finish(er->call, PV_OK, NULL);
                ended = true;
            }
        }
        pv_op_output_free(out, n);
        if (ended) return;
        if (n > 0) continue;
        pv_op rec;
        if (pv_op_get(r, &app->keys, er->op_id, &rec, &st) != PV_OK) {
            gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
            return;
        }
        bool over = pv_op_done(&rec);
        /* finished without an exit entry: it never ran, or its node failed it (a limit, as
         * the input a VM takes: RESOURCE_EXHAUSTED, as the gateway's own limits) */
        if (over)
            gw_call_finishf(er->call,
                            rec.error_code == PV_RESOURCE_EXHAUSTED ? PV_RESOURCE_EXHAUSTED
                                                                    : ERU_EXECUTE_WORKLOAD,
                            "%s",
                            rec.error_message && *rec.error_message ? rec.error_message
                                                                    : "exec ended without "
                                                                      "an exit code");
        pv_op_clear(&rec);
        if (over) return;
    }
}

static void *exec_relay_main(void *arg) {
    exec_relay *er = arg;
    pv_redis_opts ro;
    pv_redis_opts_from_config(&er->svc->app->cfg, &ro);
    pv_redis *r = NULL;
    pv_status st;
    if (pv_redis_new(&ro, &r, &st) == PV_OK)
        relay_session(er, r);
    else
        gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
    pv_redis_free(r);
    atomic_fetch_sub(&er->svc->sessions, 1);
    gw_call_unref(er->call);
    free(er);
    return NULL;
}

/* Submits the interactive exec and starts its relay. */
static int start_session(gw_call *call, const Pb__ExecuteWorkloadOptions *o, exec_call *x,
                         bool *unknown, pv_status *st) {
    *unknown = false;
    svc_core_exec *svc = gw_call_method_data(call);
    if (atomic_fetch_add(&svc->sessions, 1) >= MAX_SESSIONS) {
        atomic_fetch_sub(&svc->sessions, 1);
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                             "open_stdin: %d interactive sessions run on this gateway already",
                             MAX_SESSIONS);
    }
    exec_relay *er = calloc(1, sizeof *er);
    pv_workload w = {0};
    int rc = er ? submit_exec(call, o, true, x->op_id, &w, unknown, st)
                : pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) {
        er->call = call;
        er->svc = svc;
        snprintf(er->op_id, sizeof er->op_id, "%s", x->op_id);
        snprintf(er->wid, sizeof er->wid, "%s", w.id);
        gw_call_ref(call);
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, exec_relay_main, er) != 0) {
            gw_call_unref(call);
            rc = pv_status_set(st, PV_INTERNAL, "open_stdin: cannot start the session's thread");
        } else {
            er = NULL; /* the thread's */
        }
        pthread_attr_destroy(&attr);
    }
    pv_workload_clear(&w);
    if (er) {
        free(er);
        atomic_fetch_sub(&svc->sessions, 1);
    }
    return rc;
}

/* One chunk of input (or its end) for the running session. */
static void session_input(gw_call *call, exec_call *x, const ProtobufCBinaryData *data, bool eof) {
    gw_app *app = ((gw_app *)gw_call_app(call));
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *b64 = NULL;
    if (!eof && (x->input_total += data->len) > (size_t)app->cfg.gateway.max_request_bytes * 16) {
        pv_warn("ExecuteWorkload %s: input past 16x gateway.max_request_bytes dropped", x->op_id);
        return;
    }
    if (!eof && pv_b64_encode(data->data, data->len, &b64, &st) != PV_OK) return;
    if (pv_op_input_add(r, &app->keys, x->op_id, b64, eof, app->cfg.ops.retention_seconds, &st) !=
        PV_OK)
        pv_warn("ExecuteWorkload %s: input lost: %s", x->op_id, st.msg);
    free(b64);
}

/* The first message names the workload and the command. Without open_stdin the command runs at
 * once; with it, the session is interactive: the repl_cmd of the first and later messages is
 * its standard input as it comes, the half-close its end, and its output streams back as it
 * comes (no terminal: a program that insists on a tty sees pipes).
 * Follows Eru's calcium.ExecuteWorkload: an unknown workload is its one message (finish_exec). */
static void on_execute_workload(gw_call *call, const ProtobufCMessage *msg) {
    exec_call *x = gw_call_user(call);
    const Pb__ExecuteWorkloadOptions *o = (const Pb__ExecuteWorkloadOptions *)msg;
    if (x && x->op_id[0]) {
        if (o && o->repl_cmd.len) session_input(call, x, &o->repl_cmd, false);
        if (!o) session_input(call, x, NULL, true);
        return;
    }
    if (x && x->open_stdin) return; /* the session could not start: answered already */
    if (!x && msg && o->open_stdin) {
        if (!(x = calloc(1, sizeof *x))) {
            gw_call_finish(call, ERU_EXECUTE_WORKLOAD, "out of memory");
            return;
        }
        gw_call_set_user(call, x, exec_call_free);
        x->open_stdin = true;
        pv_status st;
        bool unknown;
        int rc = start_session(call, o, x, &unknown, &st);
        if (rc != PV_OK) {
            finish_exec(call, o, rc, unknown, &st);
            return;
        }
        if (o->repl_cmd.len) session_input(call, x, &o->repl_cmd, false);
        return;
    }
    if (x) return; /* ran already: later messages are not input */
    if (!msg) {
        gw_call_finish(call, ERU_EXECUTE_WORKLOAD, "ExecuteWorkload: no options were sent");
        return;
    }
    if (!(x = calloc(1, sizeof *x))) {
        gw_call_finish(call, ERU_EXECUTE_WORKLOAD, "out of memory");
        return;
    }
    gw_call_set_user(call, x, exec_call_free);
    exec_now(call, o);
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/LogStream", GW_SERVER_STREAM, &pb__log_stream_options__descriptor, on_log_stream,
     ERU_LOG_STREAM, true},
    {"/pb.CoreRPC/RunAndWait", GW_BIDI_STREAM, &pb__run_and_wait_options__descriptor,
     on_run_and_wait, ERU_RUN_AND_WAIT, true},
    {"/pb.CoreRPC/ExecuteWorkload", GW_BIDI_STREAM, &pb__execute_workload_options__descriptor,
     on_execute_workload, ERU_EXECUTE_WORKLOAD, true},
};

int svc_core_exec_register(svc_core_exec *s, gw_server *server) {
    return svc_eru_register(server, k_methods, N_METHODS, s->methods, s);
}
