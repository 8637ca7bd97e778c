/*
 * wk_engine: picks the engine of an endpoint and dispatches to it (see wk_engine.h). The engines
 * themselves live in wk_engine_process.c and wk_engine_virt.c behind wk_engine_impl.h.
 */
#include "wk_engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_engine_impl.h"

struct wk_engine {
    const wk_engine_vtbl *v;
    void *impl;
};

void wk_engine_info_clear(wk_engine_info *info) {
    if (!info) return;
    free(info->id);
    free(info->name);
    free(info->image);
    free(info->engine_id);
    free(info->networks_json);
    free(info->publish_json);
    free(info->log_path);
    free(info->root);
    free(info->labels_json);
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
    else if (has_scheme(endpoint, "tcp://", &rest) || has_scheme(endpoint, "unix://", &rest))
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "endpoint %s: the docker engine is not available on this system "
                             "(no Docker engine runs here); use process:// or virt://",
                             endpoint);
    else
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

int wk_engine_put_file(wk_engine *e, const char *id, const char *path, const void *data, size_t len,
                       int mode, int uid, int gid, pv_status *st) {
    if (!e->v->put_file)
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "workload %s: the %s engine's files are in its root on this machine",
                             id, e->v->type);
    return e->v->put_file(e->impl, id, path, data, len, mode, uid, gid, st);
}

int wk_engine_get_tar(wk_engine *e, const char *id, const char *path, char **tar, size_t *len,
                      pv_status *st) {
    *tar = NULL;
    *len = 0;
    if (!e->v->get_tar)
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "workload %s: the %s engine's files are in its root on this machine",
                             id, e->v->type);
    return e->v->get_tar(e->impl, id, path, tar, len, st);
}

int wk_engine_facts(wk_engine *e, char **json, pv_status *st) {
    *json = NULL;
    return e->v->facts ? e->v->facts(e->impl, json, st) : PV_OK;
}
