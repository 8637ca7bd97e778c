/*
 * wk_engine_impl: what an engine implementation provides to wk_engine.c's dispatch. Each engine
 * file defines one wk_engine_vtbl; the functions take the engine's own state (impl) and have the
 * semantics of the wk_engine.h function of the same name.
 */
#ifndef WK_ENGINE_IMPL_H
#define WK_ENGINE_IMPL_H

#include "wk_engine.h"

typedef struct wk_engine_vtbl {
    const char *type; /* "process", "virt" */
    /* uri: what follows "<type>://" in the endpoint (or opts->uri when set) */
    int (*open)(const char *uri, const wk_engine_opts *opts, void **impl, pv_status *st);
    void (*close)(void *impl);
    int (*create)(void *impl, const wk_workload_spec *spec, wk_engine_info *out, pv_status *st);
    int (*start)(void *impl, const char *id, pv_status *st);
    int (*stop)(void *impl, const char *id, int grace_seconds, bool force, pv_status *st);
    int (*pause)(void *impl, const char *id, pv_status *st);
    int (*resume)(void *impl, const char *id, pv_status *st);
    int (*remove)(void *impl, const char *id, bool force, pv_status *st);
    int (*inspect)(void *impl, const char *id, wk_engine_info *out, pv_status *st);
    int (*list)(void *impl, wk_engine_info **out, size_t *n, pv_status *st);
    int (*exec)(void *impl, const char *id, const char *const *argv, size_t argc, int timeout_ms,
                int *exit_code, char **output, size_t *output_len, pv_status *st);
    /* may be NULL: the engine cannot change a workload's limits in place */
    int (*set_limits)(void *impl, const char *id, double cpu_limit, int64_t memory_limit,
                      pv_status *st);
    /* may be NULL: set_limits applies everything now (wk_engine_set_limits_how says "now") */
    int (*set_limits_how)(void *impl, const char *id, double cpu_limit, int64_t memory_limit,
                          char *how, size_t how_cap, pv_status *st);
    /* may be NULL: the engine runs no programs of the node */
    int (*run)(void *impl, const char *const *argv, size_t argc, const char *const *env,
               const char *cwd, int timeout_ms, int *exit_code, char **output, size_t *output_len,
               pv_status *st);
    /* may be NULL: the engine keeps no timed log */
    int (*log_range)(void *impl, const char *id, int64_t since_ms, int64_t until_ms, int64_t *start,
                     int64_t *end, pv_status *st);
    /* may be NULL: the engine's workloads have a root on this machine, or no files at all */
    int (*put_file)(void *impl, const char *id, const char *path, const void *data, size_t len,
                    int mode, int uid, int gid, pv_status *st);
    int (*get_tar)(void *impl, const char *id, const char *path, char **tar, size_t *len,
                   pv_status *st);
    int (*get_file)(void *impl, const char *id, const char *path, char **data, size_t *len,
                    int *mode, int *uid, int *gid, pv_status *st);
    /* may be NULL: the engine's log is a file (info.log_path), or there is none */
    int (*logs)(void *impl, const char *id, const wk_engine_log_opts *o, wk_engine_line_fn fn,
                void *ctx, int *exit_code, pv_status *st);
    /* may be NULL: exec only through exec */
    int (*exec_io)(void *impl, const char *id, const wk_exec_io *io, int *exit_code, pv_status *st);
    /* may be NULL: the engine's images are the agent's files */
    int (*image_list)(void *impl, wk_engine_image **out, size_t *n, pv_status *st);
    int (*image_pull)(void *impl, const char *ref, pv_status *st);
    int (*image_remove)(void *impl, const char *ref, bool prune, pv_status *st);
    int (*image_build)(void *impl, const void *tar, size_t len, const char *exist_id,
                       const char *const *refs, size_t nrefs, wk_engine_line_fn log, void *ctx,
                       char **id, pv_status *st);
    /* may be NULL: nothing to ping */
    int (*ping)(void *impl, pv_status *st);
    /* may be NULL: no networks of the engine's own */
    int (*networks)(void *impl, wk_engine_network **out, size_t *n, pv_status *st);
    int (*connect)(void *impl, const char *id, const char *network, const char *ipv4,
                   const char *ipv6, wk_engine_network *out, pv_status *st);
    int (*disconnect)(void *impl, const char *id, const char *network, bool force, pv_status *st);
    /* may be NULL: the engine restarts nothing by itself */
    void (*set_restart_gate)(void *impl, wk_engine_restart_gate fn, void *arg);
    /* may be NULL: no daemon reached over TLS */
    int (*set_tls)(void *impl, const char *ca, const char *cert, const char *key, pv_status *st);
    /* may be NULL: the engine learns of no change by itself (wk_engine_set_watch) */
    void (*set_watch)(void *impl, wk_engine_watch_fn fn, void *arg);
    /* may be NULL: the engine has nothing to report beyond its type */
    int (*facts)(void *impl, char **json, pv_status *st);
} wk_engine_vtbl;

/* The entries every engine fills, for one whose functions are named <p>_open, <p>_close, ...
 * <p>_exec: `WK_ENGINE_OPS(p),` in its vtbl's initialiser, the optional ones after it. */
#define WK_ENGINE_OPS(p)                                                                           \
    .open = p##_open, .close = p##_close, .create = p##_create, .start = p##_start,                \
    .stop = p##_stop, .pause = p##_pause, .resume = p##_resume, .remove = p##_remove,              \
    .inspect = p##_inspect, .list = p##_list, .exec = p##_exec

extern const wk_engine_vtbl wk_engine_process_vtbl;
extern const wk_engine_vtbl wk_engine_virt_vtbl;
extern const wk_engine_vtbl wk_engine_docker_vtbl;

#endif
