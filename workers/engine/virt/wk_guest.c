/*
 * wk_guest: the QEMU guest agent protocol over libvirt (see wk_guest.h). Each command is one
 * JSON object {"execute", "arguments"}; libvirt hands back the agent's reply, whose "return" is
 * what the command gave, or fails with the agent's error in its message.
 */
#include "wk_guest.h"

#include <jansson.h>
#include <limits.h>
#include <libvirt/libvirt-qemu.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_b64.h"
#include "pv_time.h"
#include "wk_virt_conn.h"

#define COMMAND_TIMEOUT_S 10 /* one agent command (a hung guest: this long, once) */
#define AGENT_RETRY_MS 200   /* between tries while the agent is not connected */
#define POLL_MIN_MS 10       /* guest-exec-status: first poll, doubling to */
#define POLL_MAX_MS 100
#define KILL_WAIT_MS 2000 /* a killed command's status, at most this long */

struct wk_guest {
    pthread_mutex_t mu;
    virConnectPtr conn;
    char uri[PATH_MAX]; /* conn's, to reopen it after a libvirtd restart (wk_virt_conn.h) */
};

static void silent(void *user, virErrorPtr err) {
    (void)user, (void)err;
}

int wk_guest_open(const char *uri, wk_guest **out, pv_status *st) {
    *out = NULL;
    wk_guest *g = calloc(1, sizeof *g);
    if (!g) return pv_status_set(st, PV_INTERNAL, "out of memory");
    g->conn = virConnectOpen(uri);
    if (!g->conn) {
        free(g);
        return pv_status_set(st, PV_UNAVAILABLE, "virConnectOpen %s (guest agent): %s", uri,
                             virGetLastErrorMessage());
    }
    virConnSetErrorFunc(g->conn, NULL, silent);
    snprintf(g->uri, sizeof g->uri, "%s", uri);
    pthread_mutex_init(&g->mu, NULL);
    *out = g;
    return PV_OK;
}

void wk_guest_close(wk_guest *g) {
    if (!g) return;
    virConnectClose(g->conn);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One try of text on the domain: the reply (caller frees) or NULL with libvirt's error. */
static char *try_command(wk_guest *g, const char *uuid, const char *text, int *code, char *msg,
                         size_t cap) {
    pthread_mutex_lock(&g->mu);
    wk_virt_conn_revive(&g->conn, g->uri, silent, NULL);
    virResetLastError();
    virDomainPtr d = virDomainLookupByUUIDString(g->conn, uuid);
    char *reply = d ? virDomainQemuAgentCommand(d, text, COMMAND_TIMEOUT_S, 0) : NULL;
    if (!reply) {
        virErrorPtr e = virGetLastError();
        *code = e ? e->code : VIR_ERR_INTERNAL_ERROR;
        snprintf(msg, cap, "%s", e && e->message ? e->message : "unknown error");
    }
    if (d) virDomainFree(d);
    pthread_mutex_unlock(&g->mu);
    return reply;
}

static int command_failed(const wk_guest_target *t, const char *name, int code, const char *msg,
                          pv_status *st) {
    switch (code) {
    case VIR_ERR_NO_DOMAIN:
        return pv_status_set(st, PV_NOT_FOUND, "workload %s: its domain is gone", t->id);
    case VIR_ERR_AGENT_UNRESPONSIVE:
    case VIR_ERR_AGENT_UNSYNCED:
        return pv_status_set(st, PV_UNAVAILABLE,
                             "workload %s: the guest agent does not answer (%s): the guest needs "
                             "qemu-guest-agent running on its org.qemu.guest_agent.0 channel",
                             t->id, msg);
    case VIR_ERR_OPERATION_INVALID:
        return pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s: %s: %s", t->id, name, msg);
    default:
        return pv_status_set(st, PV_INTERNAL, "workload %s: %s: %s", t->id, name, msg);
    }
}

/* Runs the agent command name with args (taken over; NULL: none) and gives its "return"
 * (*ret, caller decrefs; NULL allowed). A guest agent that is not connected is tried again
 * until the target's deadline. */
static int command(wk_guest *g, const wk_guest_target *t, const char *name, json_t *args,
                   json_t **ret, pv_status *st) {
    if (ret) *ret = NULL;
    json_t *cmd = json_pack("{s:s}", "execute", name);
    if (cmd && args) json_object_set_new(cmd, "arguments", args);
    if (!cmd) json_decref(args);
    char *text = cmd ? json_dumps(cmd, JSON_COMPACT) : NULL;
    json_decref(cmd);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char *reply, msg[PV_STATUS_MSG_MAX];
    int code = 0;
    while (!(reply = try_command(g, t->uuid, text, &code, msg, sizeof msg)) &&
           code == VIR_ERR_AGENT_UNRESPONSIVE && pv_time_mono_ms() < t->agent_deadline_ms)
        sleep_ms(AGENT_RETRY_MS);
    free(text);
    if (!reply) return command_failed(t, name, code, msg, st);
    json_t *r = json_loads(reply, 0, NULL);
    free(reply);
    json_t *value = json_object_get(r, "return");
    if (!value) {
        json_decref(r);
        return pv_status_set(st, PV_INTERNAL, "workload %s: %s: the agent's reply has no return",
                             t->id, name);
    }
    if (ret) *ret = json_incref(value);
    json_decref(r);
    return PV_OK;
}

/* ---- exec --------------------------------------------------------------------------------- */

/* Appends n bytes of d to *buf (*len bytes, kept NUL-terminated). */
static int append(char **buf, size_t *len, const unsigned char *d, size_t n, pv_status *st) {
    char *grown = realloc(*buf, *len + n + 1);
    if (!grown) return pv_status_set(st, PV_INTERNAL, "out of memory");
    memcpy(grown + *len, d, n);
    *len += n;
    grown[*len] = '\0';
    *buf = grown;
    return PV_OK;
}

/* Appends the decoded base64 field of reply to *out, at most cap bytes in all. */
static int append_b64(const json_t *reply, const char *field, size_t cap, char **out, size_t *len,
                      pv_status *st) {
    const char *b64 = json_string_value(json_object_get(reply, field));
    if (!b64 || !*b64) return PV_OK;
    unsigned char *data = NULL;
    size_t n = 0;
    if (pv_b64_decode(field, b64, &data, &n, st) != PV_OK) return st->code;
    if (*len + n > cap) n = cap > *len ? cap - *len : 0;
    int rc = append(out, len, data, n, st);
    free(data);
    return rc;
}

/* guest-exec-status of pid until it has exited or deadline (monotonic ms; <= 0: none) passes:
 * *status is the answer with exited true, or NULL past the deadline. */
static int wait_exit(wk_guest *g, const wk_guest_target *t, json_int_t pid, int64_t deadline,
                     json_t **status, pv_status *st) {
    *status = NULL;
    for (int pause = POLL_MIN_MS;; pause = pause * 2 > POLL_MAX_MS ? POLL_MAX_MS : pause * 2) {
        json_t *s = NULL;
        int rc = command(g, t, "guest-exec-status", json_pack("{s:I}", "pid", pid), &s, st);
        if (rc != PV_OK) return rc;
        if (json_is_true(json_object_get(s, "exited"))) {
            *status = s;
            return PV_OK;
        }
        json_decref(s);
        if (deadline > 0 && pv_time_mono_ms() >= deadline) return PV_OK;
        sleep_ms(pause);
    }
}

/* Starts argv; *pid, or *exit_code 127 and the agent's message as output when the program
 * could not be started. */
static int start_exec(wk_guest *g, const wk_guest_target *t, const char *const *argv, size_t argc,
                      const void *input, size_t input_len, json_int_t *pid, int *exit_code,
                      char **output, size_t *output_len, pv_status *st) {
    *pid = -1;
    json_t *args = json_array();
    for (size_t i = 1; args && i < argc; i++)
        json_array_append_new(args, json_string(argv[i] ? argv[i] : ""));
    json_t *a = json_pack("{s:s, s:o, s:b}", "path", argv[0], "arg", args ? args : json_array(),
                          "capture-output", 1);
    if (!a) return pv_status_set(st, PV_INTERNAL, "out of memory");
    if (input && input_len > 0) {
        char *b64 = NULL;
        if (pv_b64_encode(input, input_len, &b64, st) != PV_OK) {
            json_decref(a);
            return st->code;
        }
        json_object_set_new(a, "input-data", json_string(b64));
        free(b64);
    }
    json_t *ret = NULL;
    int rc = command(g, t, "guest-exec", a, &ret, st);
    if (rc == PV_INTERNAL) { /* the agent's own refusal: no such program, not executable */
        *exit_code = 127;
        if (asprintf(output, "%s\n", st->msg) < 0) *output = NULL;
        *output_len = *output ? strlen(*output) : 0;
        pv_status_clear(st);
        return PV_OK;
    }
    if (rc == PV_OK) *pid = json_integer_value(json_object_get(ret, "pid"));
    json_decref(ret);
    return rc;
}

/* Kills pid in the guest (the agent cannot) and drops its status. */
static void kill_exec(wk_guest *g, const wk_guest_target *t, json_int_t pid) {
    char num[24];
    snprintf(num, sizeof num, "%lld", (long long)pid);
    const char *argv[] = {"kill", "-9", num};
    json_int_t kpid = -1;
    int code = 0;
    char *out = NULL;
    size_t len = 0;
    pv_status kst;
    json_t *s = NULL;
    if (start_exec(g, t, argv, 3, NULL, 0, &kpid, &code, &out, &len, &kst) == PV_OK && kpid >= 0)
        wait_exit(g, t, kpid, pv_time_mono_ms() + KILL_WAIT_MS, &s, &kst);
    json_decref(s);
    s = NULL;
    wait_exit(g, t, pid, pv_time_mono_ms() + KILL_WAIT_MS, &s, &kst);
    json_decref(s);
    free(out);
}

int wk_guest_exec(wk_guest *g, const wk_guest_target *t, const char *const *argv, size_t argc,
                  const void *input, size_t input_len, int timeout_ms, int *exit_code,
                  char **output, size_t *output_len, pv_status *st) {
    *exit_code = -1;
    *output = NULL;
    *output_len = 0;
    if (argc == 0 || !argv[0] || !*argv[0])
        return pv_status_set(st, PV_INVALID_ARGUMENT, "commands: empty");
    int64_t deadline = timeout_ms > 0 ? pv_time_mono_ms() + timeout_ms : 0;
    json_int_t pid;
    int rc =
        start_exec(g, t, argv, argc, input, input_len, &pid, exit_code, output, output_len, st);
    if (rc != PV_OK || pid < 0) return rc;
    json_t *status = NULL;
    if ((rc = wait_exit(g, t, pid, deadline, &status, st)) != PV_OK) return rc;
    if (!status) {
        kill_exec(g, t, pid);
        *exit_code = 137;
        return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                             "workload %s: %s still running after %d ms; killed in the guest",
                             t->id, argv[0], timeout_ms);
    }
    json_t *sig = json_object_get(status, "signal");
    *exit_code = json_is_integer(sig)
                     ? 128 + (int)json_integer_value(sig)
                     : (int)json_integer_value(json_object_get(status, "exitcode"));
    rc = append_b64(status, "out-data", WK_GUEST_OUTPUT_MAX, output, output_len, st);
    if (rc == PV_OK)
        rc = append_b64(status, "err-data", WK_GUEST_OUTPUT_MAX, output, output_len, st);
    if (rc == PV_OK && !*output) *output = calloc(1, 1);
    json_decref(status);
    return rc;
}

/* ---- files -------------------------------------------------------------------------------- */

static int file_open(wk_guest *g, const wk_guest_target *t, const char *path, const char *mode,
                     json_int_t *handle, pv_status *st) {
    json_t *ret = NULL;
    int rc = command(g, t, "guest-file-open", json_pack("{s:s, s:s}", "path", path, "mode", mode),
                     &ret, st);
    *handle = json_integer_value(ret);
    json_decref(ret);
    return rc;
}

static void file_close(wk_guest *g, const wk_guest_target *t, json_int_t handle) {
    pv_status cst;
    command(g, t, "guest-file-close", json_pack("{s:I}", "handle", handle), NULL, &cst);
}

/* mkdir -p of path's directory in the guest. */
static int make_parent(wk_guest *g, const wk_guest_target *t, const char *path, pv_status *st) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return PV_OK;
    *slash = '\0';
    const char *argv[] = {"mkdir", "-p", dir};
    int code = -1;
    char *out = NULL;
    size_t len = 0;
    int rc = wk_guest_exec(g, t, argv, 3, NULL, 0, COMMAND_TIMEOUT_S * 1000, &code, &out, &len, st);
    if (rc == PV_OK && code != 0)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s: mkdir -p %s: %.200s", t->id,
                           dir, out ? out : "");
    free(out);
    return rc;
}

static int write_chunks(wk_guest *g, const wk_guest_target *t, json_int_t h, const char *path,
                        const unsigned char *data, size_t len, pv_status *st) {
    int rc = PV_OK;
    for (size_t off = 0; rc == PV_OK && off < len; off += WK_GUEST_WRITE_CHUNK) {
        size_t n = len - off < WK_GUEST_WRITE_CHUNK ? len - off : WK_GUEST_WRITE_CHUNK;
        char *b64 = NULL;
        json_t *ret = NULL;
        if ((rc = pv_b64_encode(data + off, n, &b64, st)) != PV_OK) break;
        rc = command(g, t, "guest-file-write", json_pack("{s:I, s:s}", "handle", h, "buf-b64", b64),
                     &ret, st);
        free(b64);
        if (rc == PV_OK && json_integer_value(json_object_get(ret, "count")) != (json_int_t)n)
            rc = pv_status_set(st, PV_INTERNAL, "workload %s: %s: a short write at %zu", t->id,
                               path, off);
        json_decref(ret);
    }
    return rc;
}

int wk_guest_write_file(wk_guest *g, const wk_guest_target *t, const char *path, const void *data,
                        size_t len, pv_status *st) {
    json_int_t h = -1;
    int rc = make_parent(g, t, path, st);
    if (rc == PV_OK) rc = file_open(g, t, path, "w", &h, st);
    if (rc != PV_OK) return rc;
    rc = write_chunks(g, t, h, path, data, len, st);
    file_close(g, t, h);
    return rc;
}

/* Appends one chunk read from handle h (at most max bytes in all); *eof at the end. */
static int read_chunk(wk_guest *g, const wk_guest_target *t, json_int_t h, size_t max, char **data,
                      size_t *len, bool *eof, pv_status *st) {
    json_t *ret = NULL;
    int rc = command(g, t, "guest-file-read",
                     json_pack("{s:I, s:i}", "handle", h, "count", WK_GUEST_CHUNK), &ret, st);
    if (rc != PV_OK) return rc;
    json_int_t n = json_integer_value(json_object_get(ret, "count"));
    *eof = json_is_true(json_object_get(ret, "eof")) || n == 0;
    if (*len + (size_t)n > max)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "larger than %zu bytes", max);
    else
        rc = append_b64(ret, "buf-b64", max, data, len, st);
    json_decref(ret);
    return rc;
}

int wk_guest_read_file(wk_guest *g, const wk_guest_target *t, const char *path, size_t max,
                       char **data, size_t *len, pv_status *st) {
    *data = NULL;
    *len = 0;
    json_int_t h = -1;
    int rc = file_open(g, t, path, "r", &h, st);
    bool eof = false;
    bool opened = rc == PV_OK;
    while (rc == PV_OK && !eof)
        if ((rc = read_chunk(g, t, h, max, data, len, &eof, st)) == PV_FAILED_PRECONDITION)
            pv_status_prefix(st, "workload %s: %s", t->id, path);
    if (opened) file_close(g, t, h);
    if (rc == PV_OK && !*data) *data = calloc(1, 1);
    if (rc != PV_OK) {
        free(*data);
        *data = NULL;
        *len = 0;
    }
    return rc;
}
