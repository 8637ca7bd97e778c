/*
 * wk_engine: picks the engine of an endpoint and dispatches to it (see wk_engine.h). The engines
 * themselves live in wk_engine_process.c and wk_engine_virt.c behind wk_engine_impl.h.
 */
#include "wk_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_engine_impl.h"
#include "pv_mem.h"

struct wk_engine {
    const wk_engine_vtbl *v;
    void *impl;
};

void wk_engine_info_clear(wk_engine_info *info) {
    if (!info) return;
    PV_FREE(info->id, info->name, info->image, info->engine_id, info->networks_json,
            info->publish_json, info->log_path, info->root, info->labels_json);
    memset(info, 0, sizeof *info);
}

void wk_engine_info_array_free(wk_engine_info *infos, size_t n) {
    for (size_t i = 0; infos && i < n; i++)
        wk_engine_info_clear(&infos[i]);
    free(infos);
}

static int has_scheme(const char *endpoint, const char *scheme, const char **rest) {
    size_t n = strlen(scheme);
    if (strncmp(endpoint, scheme, n) != 0) return 0;
    *rest = endpoint + n;
    return 1;
}

int wk_engine_open(const char *endpoint, const wk_engine_opts *opts, wk_engine **out,
                   pv_status *st) {
    *out = NULL;
    const char *rest = NULL;
    const wk_engine_vtbl *v = NULL;
    if (!endpoint) endpoint = "";
    if (has_scheme(endpoint, "process://", &rest))
        v = &wk_engine_process_vtbl;
    else if (has_scheme(endpoint, "virt://", &rest))
        v = &wk_engine_virt_vtbl;
    else if (has_scheme(endpoint, "tcp://", &rest) || has_scheme(endpoint, "unix://", &rest)) {
        v = &wk_engine_docker_vtbl;
        rest = endpoint; /* the docker engine tells unix:// from tcp:// itself */
    } else
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "endpoint %s: unknown scheme (process://, virt://<libvirt URI>)",
                             endpoint);
    const char *uri = (opts && opts->uri && *opts->uri) ? opts->uri : rest;
    wk_engine *e = calloc(1, sizeof *e);
    if (!e) return pv_status_set(st, PV_INTERNAL, "out of memory");
    e->v = v;
    if (v->open(uri, opts, &e->impl, st) != PV_OK) {
        free(e);
        return st->code;
    }
    *out = e;
    return PV_OK;
}

void wk_engine_close(wk_engine *e) {
    if (!e) return;
    e->v->close(e->impl);
    free(e);
}

const char *wk_engine_type(const wk_engine *e) {
    return e->v->type;
}

int wk_engine_create(wk_engine *e, const wk_workload_spec *spec, wk_engine_info *out,
                     pv_status *st) {
    return e->v->create(e->impl, spec, out, st);
}

int wk_engine_start(wk_engine *e, const char *id, pv_status *st) {
    return e->v->start(e->impl, id, st);
}

int wk_engine_stop(wk_engine *e, const char *id, int grace_seconds, bool force, pv_status *st) {
    return e->v->stop(e->impl, id, grace_seconds, force, st);
}

int wk_engine_pause(wk_engine *e, const char *id, pv_status *st) {
    return e->v->pause(e->impl, id, st);
}

int wk_engine_resume(wk_engine *e, const char *id, pv_status *st) {
    return e->v->resume(e->impl, id, st);
}

int wk_engine_remove(wk_engine *e, const char *id, bool force, pv_status *st) {
    return e->v->remove(e->impl, id, force, st);
}

int wk_engine_inspect(wk_engine *e, const char *id, wk_engine_info *out, pv_status *st) {
    return e->v->inspect(e->impl, id, out, st);
}

int wk_engine_list(wk_engine *e, wk_engine_info **out, size_t *n, pv_status *st) {
    return e->v->list(e->impl, out, n, st);
}

int wk_engine_exec(wk_engine *e, const char *id, const char *const *argv, size_t argc,
                   int timeout_ms, int *exit_code, char **output, size_t *output_len,
                   pv_status *st) {
    return e->v->exec(e->impl, id, argv, argc, timeout_ms, exit_code, output, output_len, st);
}

int wk_engine_set_limits(wk_engine *e, const char *id, double cpu_limit, int64_t memory_limit,
                         pv_status *st) {
    if (!e->v->set_limits)
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "the %s engine cannot change a workload's limits in place",
                             e->v->type);
    return e->v->set_limits(e->impl, id, cpu_limit, memory_limit, st);
}

int wk_engine_set_limits_how(wk_engine *e, const char *id, double cpu_limit, int64_t memory_limit,
                             char *how, size_t how_cap, pv_status *st) {
    if (how_cap) how[0] = '\0';
    if (e->v->set_limits_how)
        return e->v->set_limits_how(e->impl, id, cpu_limit, memory_limit, how, how_cap, st);
    int rc = wk_engine_set_limits(e, id, cpu_limit, memory_limit, st);
    if (rc == PV_OK && how_cap) snprintf(how, how_cap, "applied now");
    return rc;
}

int wk_engine_log_range(wk_engine *e, const char *id, int64_t since_ms, int64_t until_ms,
                        int64_t *start, int64_t *end, pv_status *st) {
    if (!e->v->log_range)
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "the %s engine keeps no timed log: since and until need one",
                             e->v->type);
    return e->v->log_range(e->impl, id, since_ms, until_ms, start, end, st);
}

int wk_engine_run(wk_engine *e, const char *const *argv, size_t argc, const char *const *env,
                  const char *cwd, int timeout_ms, int *exit_code, char **output,
                  size_t *output_len, pv_status *st) {
    *exit_code = -1;
    *output = NULL;
    *output_len = 0;
    if (!e->v->run)
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "the %s engine runs no programs of the node (builds need a "
                             "process:// node)",
                             e->v->type);
    return e->v->run(e->impl, argv, argc, env, cwd, timeout_ms, exit_code, output, output_len, st);
}

/* ---- the docker engine's additions (wk_engine.h: engines whose workloads have no root here) */

int wk_engine_ping(wk_engine *e, pv_status *st) {
    return e->v->ping ? e->v->ping(e->impl, st) : PV_OK;
}

static int lacks(const wk_engine *e, const char *what, pv_status *st) {
    return pv_status_set(st, PV_UNIMPLEMENTED, "the %s engine has no %s", e->v->type, what);
}

int wk_engine_put_file(wk_engine *e, const char *id, const char *path, const void *data, size_t len,
                       int mode, int uid, int gid, pv_status *st) {
    if (!e->v->put_file) return lacks(e, "archive upload (its files are under info.root)", st);
    return e->v->put_file(e->impl, id, path, data, len, mode, uid, gid, st);
}

int wk_engine_get_tar(wk_engine *e, const char *id, const char *path, char **tar, size_t *len,
                      pv_status *st) {
    *tar = NULL;
    *len = 0;
    if (!e->v->get_tar) return lacks(e, "archive download (its files are under info.root)", st);
    return e->v->get_tar(e->impl, id, path, tar, len, st);
}

int wk_engine_get_file(wk_engine *e, const char *id, const char *path, char **data, size_t *len,
                       int *mode, int *uid, int *gid, pv_status *st) {
    *data = NULL;
    *len = 0;
    if (!e->v->get_file) return lacks(e, "archive download (its files are under info.root)", st);
    return e->v->get_file(e->impl, id, path, data, len, mode, uid, gid, st);
}

int wk_engine_logs(wk_engine *e, const char *id, const wk_engine_log_opts *o, wk_engine_line_fn fn,
                   void *ctx, int *exit_code, pv_status *st) {
    *exit_code = -1;
    if (!e->v->logs) return lacks(e, "log stream of its own (its log is info.log_path)", st);
    return e->v->logs(e->impl, id, o, fn, ctx, exit_code, st);
}

int wk_exec_buf_collect(void *ctx, int stream, const char *data, size_t len, pv_status *st) {
    (void)stream;
    wk_exec_buf *b = ctx;
    if (len >= WK_EXEC_BUF_MAX) {
        data += len - WK_EXEC_BUF_MAX;
        len = WK_EXEC_BUF_MAX;
    }
    if (b->len + len > WK_EXEC_BUF_MAX) { /* keep the tail */
        size_t drop = b->len + len - WK_EXEC_BUF_MAX;
        memmove(b->data, b->data + drop, b->len - drop);
        b->len -= drop;
    }
    if (!b->data && !(b->data = malloc(WK_EXEC_BUF_MAX + 1)))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

int wk_engine_exec_io(wk_engine *e, const char *id, const wk_exec_io *io, int *exit_code,
                      pv_status *st) {
    *exit_code = -1;
    if (!e->v->exec_io) return lacks(e, "streaming exec", st);
    return e->v->exec_io(e->impl, id, io, exit_code, st);
}

void wk_engine_image_array_free(wk_engine_image *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) {
        free(v[i].ref);
        free(v[i].id);
    }
    free(v);
}

int wk_engine_image_list(wk_engine *e, wk_engine_image **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    if (!e->v->image_list) return lacks(e, "images of its own (they are the agent's files)", st);
    return e->v->image_list(e->impl, out, n, st);
}

int wk_engine_image_pull(wk_engine *e, const char *ref, pv_status *st) {
    if (!e->v->image_pull) return lacks(e, "images of its own (they are the agent's files)", st);
    return e->v->image_pull(e->impl, ref, st);
}

int wk_engine_image_remove(wk_engine *e, const char *ref, bool prune, pv_status *st) {
    if (!e->v->image_remove) return lacks(e, "images of its own (they are the agent's files)", st);
    return e->v->image_remove(e->impl, ref, prune, st);
}

int wk_engine_image_build(wk_engine *e, const void *tar, size_t len, const char *exist_id,
                          const char *const *refs, size_t nrefs, wk_engine_line_fn log, void *ctx,
                          char **id, pv_status *st) {
    *id = NULL;
    if (!e->v->image_build) return lacks(e, "images of its own (they are the agent's files)", st);
    return e->v->image_build(e->impl, tar, len, exist_id, refs, nrefs, log, ctx, id, st);
}

void wk_engine_network_clear(wk_engine_network *n) {
    if (!n) return;
    while (n->nsubnets > 0)
        free(n->subnets[--n->nsubnets]);
    free(n->subnets);
    free(n->name);
    n->subnets = NULL;
    n->name = NULL;
}

void wk_engine_network_array_free(wk_engine_network *v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        wk_engine_network_clear(&v[i]);
    free(v);
}

int wk_engine_networks(wk_engine *e, wk_engine_network **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    if (!e->v->networks) return lacks(e, "networks of its own", st);
    return e->v->networks(e->impl, out, n, st);
}

int wk_engine_connect(wk_engine *e, const char *id, const char *network, const char *ipv4,
                      const char *ipv6, wk_engine_network *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    if (!e->v->connect) return lacks(e, "networks of its own", st);
    return e->v->connect(e->impl, id, network, ipv4, ipv6, out, st);
}

int wk_engine_disconnect(wk_engine *e, const char *id, const char *network, bool force,
                         pv_status *st) {
    if (!e->v->disconnect) return lacks(e, "networks of its own", st);
    return e->v->disconnect(e->impl, id, network, force, st);
}

int wk_engine_facts(wk_engine *e, char **json, pv_status *st) {
    *json = NULL;
    return e->v->facts ? e->v->facts(e->impl, json, st) : PV_OK;
}

int wk_engine_set_tls(wk_engine *e, const char *ca, const char *cert, const char *key,
                      pv_status *st) {
    if (!e->v->set_tls)
        return pv_status_set(st, PV_UNIMPLEMENTED, "the %s engine has no TLS to set", e->v->type);
    return e->v->set_tls(e->impl, ca, cert, key, st);
}

void wk_engine_set_watch(wk_engine *e, wk_engine_watch_fn fn, void *arg) {
    if (e && e->v->set_watch) e->v->set_watch(e->impl, fn, arg);
}

void wk_engine_set_restart_gate(wk_engine *e, wk_engine_restart_gate fn, void *arg) {
    if (e && e->v->set_restart_gate) e->v->set_restart_gate(e->impl, fn, arg);
}
