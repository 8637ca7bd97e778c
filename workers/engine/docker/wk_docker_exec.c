/*
 * wk_docker_exec: exec and logs of the docker engine (see wk_engine_docker.h).
 *
 * Exec is POST /containers/{id}/exec, then POST /exec/{id}/start without Detach, whose answer
 * is the command's multiplexed output until it ends, then GET /exec/{id}/json for its exit
 * code. Logs are GET /containers/{id}/logs, the same multiplexed stream, cut into lines per
 * stream (a line split over frames is put together again; a last line without a newline is
 * handed on at the end).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <signal.h>

#include "pv_time.h"
#include "wk_engine_docker.h"

#define EXIT_POLL_US 20000
#define EXIT_POLL_TRIES 250

static json_t *strings(const char *const *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_string(v[i] ? v[i] : ""));
    return a;
}

/* POST /containers/{cid}/exec: the exec's id into eid. */
static int exec_create(wk_docker *d, const char *id, const wk_exec_io *io, bool in, char eid[72],
                       pv_status *st) {
    char cid[72], path[256];
    if (wk_docker_resolve(d, id, cid, st) != PV_OK) return st->code;
    snprintf(path, sizeof path, "/containers/%s/exec", cid);
    json_t *body =
        json_pack("{s:b, s:b, s:b, s:b, s:o, s:o, s:s}", "AttachStdin", in, "AttachStdout", 1,
                  "AttachStderr", 1, "Tty", 0, "Cmd", strings(io->argv, io->argc), "Env",
                  strings(io->env, io->nenv), "WorkingDir", io->workdir ? io->workdir : "");
    json_t *created = NULL;
    char what[128];
    snprintf(what, sizeof what, "workload %.64s: exec", id);
    int rc = wk_docker_json(d->api, "POST", path, body, &created, what, st);
    json_decref(body);
    if (rc == PV_NOT_FOUND && !strstr(st->msg, "No such exec")) wk_docker_forget(d, id);
    if (rc == PV_FAILED_PRECONDITION || (rc == PV_ALREADY_EXISTS))
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s is not running", id);
    const char *e = json_string_value(json_object_get(created, "Id"));
    if (rc == PV_OK && !e) rc = pv_status_set(st, PV_INTERNAL, "%s: no Id in the answer", what);
    if (rc == PV_OK) snprintf(eid, 72, "%s", e);
    json_decref(created);
    return rc;
}

/* The exit code of a finished exec (its inspect may say Running a moment after the stream
 * ended). */
static int exec_exit(wk_docker *d, const char *eid, int *code, pv_status *st) {
    char path[256];
    snprintf(path, sizeof path, "/exec/%s/json", eid);
    for (int i = 0; i < EXIT_POLL_TRIES; i++) {
        json_t *j = NULL;
        if (wk_docker_json(d->api, "GET", path, NULL, &j, "exec inspect", st) != PV_OK)
            return st->code;
        bool running = json_is_true(json_object_get(j, "Running"));
        json_t *c = json_object_get(j, "ExitCode");
        *code = json_is_integer(c) ? (int)json_integer_value(c) : -1;
        json_decref(j);
        if (!running) return PV_OK;
        usleep(EXIT_POLL_US);
    }
    return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                         "exec %.12s: still running after its output "
                         "ended",
                         eid);
}

/* Ends an exec left behind (its client gone, its time up): its process, when the daemon is on
 * this machine (unix://: the pid the daemon reports is one of this machine's); a tcp:// daemon
 * elsewhere leaves it to end with its input. */
static void exec_kill(wk_docker *d, const char *eid) {
    if (strncmp(wk_docker_api_endpoint(d->api), "unix://", 7) != 0) return;
    char path[256];
    snprintf(path, sizeof path, "/exec/%s/json", eid);
    json_t *j = NULL;
    pv_status st;
    if (wk_docker_json(d->api, "GET", path, NULL, &j, "exec inspect", &st) != PV_OK) return;
    json_int_t pid = json_integer_value(json_object_get(j, "Pid"));
    if (json_is_true(json_object_get(j, "Running")) && pid > 1) kill((pid_t)pid, SIGKILL);
    json_decref(j);
}

typedef struct relay {
    const wk_exec_io *io;
    wk_docker_demux demux;
} relay;

static int relay_frame(void *ctx, int stream, const char *data, size_t len, pv_status *st) {
    relay *r = ctx;
    if (stream != 1 && stream != 2) return PV_OK;
    return r->io->output(r->io->ctx, stream, data, len, st) == 0
               ? PV_OK
               : (st->code ? st->code : pv_status_set(st, PV_CANCELLED, "exec: output stopped"));
}

static int relay_data(void *ctx, const char *data, size_t len, pv_status *st) {
    relay *r = ctx;
    return wk_docker_demux_feed(&r->demux, data, len, st) == PV_OK ? 0 : 1;
}

/* With stdin: the start hijacks the connection; what the input gives is written to it (its end
 * a half-close) while the output is read from it, until the daemon closes it. */
static int exec_with_input(wk_docker *d, const char *eid, const wk_exec_io *io, pv_status *st) {
    char path[256];
    snprintf(path, sizeof path, "/exec/%s/start", eid);
    wk_docker_conn *c = NULL;
    if (wk_docker_hijack(d->api, path, "{\"Detach\":false,\"Tty\":false}", &c, st) != PV_OK)
        return st->code;
    relay r = {.io = io};
    wk_docker_demux_init(&r.demux, relay_frame, &r);
    int64_t until = io->timeout_ms > 0 ? pv_time_now_ms() + io->timeout_ms : 0;
    bool in_open = true, eof = false;
    char buf[16384];
    int rc = PV_OK;
    while (rc == PV_OK && !eof) {
        size_t got = 0;
        rc = wk_docker_conn_read(c, buf, sizeof buf, in_open ? 20 : 200, &got, &eof, st);
        if (rc == PV_OK && got) rc = wk_docker_demux_feed(&r.demux, buf, got, st);
        if (rc == PV_OK) { /* after the input's end too: it says when the exec is to stop */
            long n = io->input(io->ctx, buf, sizeof buf, in_open ? 30 : 0, st);
            if (n > 0 && in_open) rc = wk_docker_conn_write(c, buf, (size_t)n, st);
            if (n == -1 && in_open) {
                wk_docker_conn_close_write(c);
                in_open = false;
            }
            if (n < -1) rc = st->code ? st->code : PV_CANCELLED;
        }
        if (rc == PV_OK && until && pv_time_now_ms() > until)
            rc = pv_status_set(st, PV_DEADLINE_EXCEEDED, "exec still running after %d ms",
                               io->timeout_ms);
    }
    wk_docker_conn_close(c);
    return rc;
}

int wk_docker_exec_io(void *impl, const char *id, const wk_exec_io *io, int *exit_code,
                      pv_status *st) {
    wk_docker *d = impl;
    *exit_code = -1;
    char eid[72];
    if (exec_create(d, id, io, io->input != NULL, eid, st) != PV_OK) return st->code;
    if (io->input) {
        int rc = exec_with_input(d, eid, io, st);
        if (rc != PV_OK) exec_kill(d, eid);
        if (rc == PV_DEADLINE_EXCEEDED) *exit_code = 137;
        return rc == PV_OK ? exec_exit(d, eid, exit_code, st) : rc;
    }
    char path[256];
    snprintf(path, sizeof path, "/exec/%s/start", eid);
    static const char start[] = "{\"Detach\":false,\"Tty\":false}";
    relay r = {.io = io};
    wk_docker_demux_init(&r.demux, relay_frame, &r);
    wk_docker_req req = {.method = "POST",
                         .path = path,
                         .body = start,
                         .body_len = sizeof start - 1,
                         .timeout_ms = io->timeout_ms > 0 ? io->timeout_ms : -1,
                         .on_data = relay_data,
                         .ctx = &r};
    wk_docker_resp resp;
    int rc = wk_docker_call(d->api, &req, &resp, st);
    if (rc == PV_OK) rc = wk_docker_check(&resp, "exec start", st);
    wk_docker_resp_clear(&resp);
    if (rc == PV_DEADLINE_EXCEEDED) {
        exec_kill(d, eid);
        *exit_code = 137;
        return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                             "workload %s: exec still running after %d ms", id, io->timeout_ms);
    }
    if (rc == PV_OK) rc = exec_exit(d, eid, exit_code, st);
    return rc;
}

int wk_docker_exec(void *impl, const char *id, const char *const *argv, size_t argc, int timeout_ms,
                   int *exit_code, char **output, size_t *output_len, pv_status *st) {
    wk_exec_buf out = {0};
    wk_exec_io io = {.argv = argv,
                     .argc = argc,
                     .timeout_ms = timeout_ms,
                     .output = wk_exec_buf_collect,
                     .ctx = &out};
    int rc = wk_docker_exec_io(impl, id, &io, exit_code, st);
    *output = out.data ? out.data : strdup("");
    *output_len = out.len;
    return rc;
}

/* ---- logs ---- */

typedef struct lines {
    wk_engine_line_fn fn;
    void *ctx;
    wk_docker_demux demux;
    char *part[3]; /* the unfinished line of each stream */
    size_t plen[3];
} lines;

static int line_frame(void *ctx, int stream, const char *data, size_t len, pv_status *st) {
    lines *l = ctx;
    if (stream != 1 && stream != 2) return PV_OK;
    while (len > 0) {
        const char *nl = memchr(data, '\n', len);
        size_t take = nl ? (size_t)(nl - data) : len;
        char *grown = realloc(l->part[stream], l->plen[stream] + take + 1);
        if (!grown) return pv_status_set(st, PV_INTERNAL, "out of memory");
        l->part[stream] = grown;
        memcpy(grown + l->plen[stream], data, take);
        l->plen[stream] += take;
        grown[l->plen[stream]] = '\0';
        if (!nl) return PV_OK;
        size_t n = l->plen[stream];
        l->plen[stream] = 0;
        if (l->fn(l->ctx, stream, l->part[stream], n, st) != 0)
            return st->code ? st->code : pv_status_set(st, PV_CANCELLED, "log: stopped");
        data = nl + 1;
        len -= take + 1;
    }
    return PV_OK;
}

static int line_data(void *ctx, const char *data, size_t len, pv_status *st) {
    lines *l = ctx;
    return wk_docker_demux_feed(&l->demux, data, len, st) == PV_OK ? 0 : 1;
}

static int line_tick(void *ctx, pv_status *st) {
    lines *l = ctx;
    return l->fn(l->ctx, 0, NULL, 0, st);
}

static void seconds(char *out, size_t cap, int64_t ms) {
    snprintf(out, cap, "%lld.%03lld", (long long)(ms / 1000), (long long)(ms % 1000));
}

int wk_docker_logs(void *impl, const char *id, const wk_engine_log_opts *o, wk_engine_line_fn fn,
                   void *ctx, int *exit_code, pv_status *st) {
    wk_docker *d = impl;
    *exit_code = -1;
    char cid[72], path[512], tail[32] = "all", since[32] = "0", until[32] = "0";
    if (wk_docker_resolve(d, id, cid, st) != PV_OK) return st->code;
    if (o->tail >= 0) snprintf(tail, sizeof tail, "%ld", o->tail);
    if (o->since_ms > 0) seconds(since, sizeof since, o->since_ms);
    if (o->until_ms > 0) seconds(until, sizeof until, o->until_ms);
    snprintf(path, sizeof path,
             "/containers/%s/logs?stdout=1&stderr=1&follow=%d&tail=%s&since=%s%s%s", cid,
             o->follow ? 1 : 0, tail, since, o->until_ms > 0 ? "&until=" : "",
             o->until_ms > 0 ? until : "");
    lines l = {.fn = fn, .ctx = ctx};
    wk_docker_demux_init(&l.demux, line_frame, &l);
    wk_docker_req req = {.method = "GET",
                         .path = path,
                         .timeout_ms = o->follow ? -1 : 0,
                         .on_data = line_data,
                         .on_tick = line_tick,
                         .ctx = &l};
    wk_docker_resp r;
    char what[128];
    snprintf(what, sizeof what, "workload %.64s: logs", id);
    int rc = wk_docker_call(d->api, &req, &r, st);
    if (rc == PV_OK) rc = wk_docker_check(&r, what, st);
    wk_docker_resp_clear(&r);
    for (int s = 1; s <= 2; s++) { /* what came last without its newline */
        if (rc == PV_OK && l.plen[s] && fn(ctx, s, l.part[s], l.plen[s], st) != 0)
            rc = st->code ? st->code : PV_CANCELLED;
        free(l.part[s]);
    }
    if (rc == PV_OK && o->follow) {
        char ipath[128];
        snprintf(ipath, sizeof ipath, "/containers/%s/json", cid);
        json_t *c = NULL;
        if (wk_docker_json(d->api, "GET", ipath, NULL, &c, what, st) != PV_OK) return st->code;
        json_t *state = json_object_get(c, "State");
        if (!json_is_true(json_object_get(state, "Running")))
            *exit_code = (int)json_integer_value(json_object_get(state, "ExitCode"));
        json_decref(c);
    }
    return rc;
}
