/*
 * wk_engine_docker: the docker engine (wk_engine.h) for nodes whose endpoint is
 * unix:///path/docker.sock or tcp://host:port: each workload is one container of that daemon,
 * made and driven through the Engine API (wk_docker_api.h), as Eru's own docker engine does.
 *
 * A container carries Eru's labels (ERU=1, ERU_META, eru.nodename, eru.coreid: the agent's
 * spec has them) and "pivirt.id" = the workload's id, by which the engine finds it again: the
 * engine keeps nothing on disk, so an agent that restarts (or a daemon that restarted) finds its
 * containers by that label (wk_engine_list); containers without it are never listed nor
 * touched. Its name is the workload's (app_entry_xxxxxx), as Eru names them.
 *
 * Files: (wk_docker_files.c) PUT/GET archive. Exec, logs (wk_docker_exec.c): exec create/start
 * with the multiplexed stream split into stdout and stderr, logs with tail/since/until/follow.
 * The create body (wk_docker_spec.c) follows Eru's: cpumem as NanoCpus or, bound, CpusetCpus
 * without a quota; Memory = MemorySwap, MemoryReservation half of it (at least 4 MiB); the
 * entrypoint's commands as Cmd; env, dir, user, privileged (root and SYS_ADMIN), restart
 * ("policy[:retries]"), publish, dns, extra_hosts, sysctls, networks; raw_args merged as Eru's
 * RawArgs (pid_mod, storage_opt, cap_add, cap_drop, ulimits, runtime). Every container runs
 * with Init (docker-init as PID 1): a main process that ignores SIGTERM (busybox sh) then still
 * stops at once instead of waiting out its grace.
 *
 * This header is the modules' shared interior; the agent reaches the engine through wk_engine.h.
 */
#ifndef WK_ENGINE_DOCKER_H
#define WK_ENGINE_DOCKER_H

#include <jansson.h>
#include <pthread.h>

#include "wk_docker_api.h"
#include "wk_engine.h"

#define WK_DOCKER_ID_LABEL "pivirt.id"
/* the entrypoint's hooks, {"after_start": [...], "before_stop": [...]} */
#define WK_DOCKER_HOOKS_LABEL "pivirt.hooks"

typedef struct wk_docker {
    wk_docker_api *api;
    int grace_seconds;  /* default stop grace */
    pthread_mutex_t mu; /* ids, live, synced, the events follower's state */
    json_t *ids;        /* workload id -> container id, learnt from creates and lookups */
    char *node_label;   /* "eru.nodename=<node>": the list's filter; NULL = none */
    json_t *auths;      /* registry host -> {"username", "password", "serveraddress"} */
    /* workload id -> its container's inspect, as the last listing made it and the event
     * stream keeps it since (wk_docker_events.c); the list and the engine info read it */
    json_t *live;
    bool synced; /* live follows the event stream: the list needs no call of its own */
    /* the events follower (wk_docker_events.c) */
    pthread_t ev_thread;
    pthread_cond_t ev_cv;
    bool ev_started, ev_stopping;
    int64_t ev_last_ns; /* the daemon's time of the last event seen (since= at a reconnect) */
    pthread_mutex_t watch_mu;
    wk_engine_watch_fn watch;
    void *watch_arg;
} wk_docker;

/* The container id of workload id into cid (65 bytes): the cache, else a lookup by label.
 * NOT_FOUND naming the workload when the daemon has no container of it. */
int wk_docker_resolve(wk_docker *d, const char *id, char cid[72], pv_status *st);
/* GET /containers/json of every container with the id label (label "pivirt.id" alone: all of
 * this node's; "pivirt.id=X": workload X's); *out a new reference. */
int wk_docker_list_labelled(wk_docker *d, const char *label, json_t **out, pv_status *st);
/* Drops what the cache knows of id (a container removed, or gone behind the engine's back). */
void wk_docker_forget(wk_docker *d, const char *id);

/* Every container of this node (the id label, the node's label) inspected: *out a new object
 * workload id -> inspect. */
int wk_docker_inspect_all(wk_docker *d, json_t **out, pv_status *st);
/* info of a container's inspect (wk_engine_info_clear frees it). */
void wk_docker_info_of(json_t *inspect, wk_engine_info *out);
/* Caches workload id's container id. */
void wk_docker_remember(wk_docker *d, const char *id, const char *cid);

/* wk_docker_events.c: the daemon's event stream. Start: a thread that lists the node's
 * containers (d->live), then follows GET /events for them, keeping d->live as the daemon has
 * it and calling the watch (wk_engine_set_watch) for each change; when the stream breaks (the
 * daemon stopped or restarted) it reconnects with backoff, lists again and asks for what it
 * missed (since= the last event's time). Stop joins it (within about a second). */
int wk_docker_events_start(wk_docker *d, pv_status *st);
void wk_docker_events_stop(wk_docker *d);
void wk_docker_set_watch(void *impl, wk_engine_watch_fn fn, void *arg);
/* Workload id's container cid inspected again into d->live, and the watch told: a change the
 * stream does not carry (a network connect or disconnect is a network event). */
void wk_docker_refresh(wk_docker *d, const char *id, const char *cid);
/* Calls the watch for id (NULL: everything). */
void wk_docker_notify(wk_docker *d, const char *id);

/* The create body of a spec (a new reference), or NULL with *st (INVALID_ARGUMENT naming the
 * field: raw_args that is no JSON object, a bad restart policy). */
json_t *wk_docker_create_body(const wk_docker *d, const wk_workload_spec *spec, pv_status *st);

/* wk_docker_exec.c */
int wk_docker_exec(void *impl, const char *id, const char *const *argv, size_t argc, int timeout_ms,
                   int *exit_code, char **output, size_t *output_len, pv_status *st);
int wk_docker_exec_io(void *impl, const char *id, const wk_exec_io *io, int *exit_code,
                      pv_status *st);
int wk_docker_logs(void *impl, const char *id, const wk_engine_log_opts *o, wk_engine_line_fn fn,
                   void *ctx, int *exit_code, pv_status *st);

/* wk_docker_files.c */
int wk_docker_put_file(void *impl, const char *id, const char *path, const void *data, size_t len,
                       int mode, int uid, int gid, pv_status *st);
int wk_docker_get_tar(void *impl, const char *id, const char *path, char **tar, size_t *len,
                      pv_status *st);
int wk_docker_get_file(void *impl, const char *id, const char *path, char **data, size_t *len,
                       int *mode, int *uid, int *gid, pv_status *st);

/* wk_docker_image.c */
/* d->auths from registry.auths entries "HOST=USERNAME:PASSWORD" (a new object; entries that
 * do not parse are logged and skipped: the configuration refuses them before). NULL when out
 * of memory. */
json_t *wk_docker_auths(const char *const *entries, size_t n);
int wk_docker_image_list(void *impl, wk_engine_image **out, size_t *n, pv_status *st);
int wk_docker_pull(void *impl, const char *ref, pv_status *st);
int wk_docker_image_remove(void *impl, const char *ref, bool prune, pv_status *st);
int wk_docker_image_build(void *impl, const void *tar, size_t len, const char *exist_id,
                          const char *const *refs, size_t nrefs, wk_engine_line_fn log, void *ctx,
                          char **id, pv_status *st);

/* wk_docker_facts.c: the engine info report (GET /info, each container's limits from d->live) */
int wk_docker_facts(void *impl, char **out, pv_status *st);
/* {"container", "state", "cpu", "cpuset", "memory"} of a container's inspect (a new object). */
json_t *wk_docker_limits_of(json_t *inspect);

/* wk_docker_net.c */
int wk_docker_networks(void *impl, wk_engine_network **out, size_t *n, pv_status *st);
int wk_docker_connect(void *impl, const char *id, const char *network, const char *ipv4,
                      const char *ipv6, wk_engine_network *out, pv_status *st);
int wk_docker_disconnect(void *impl, const char *id, const char *network, bool force,
                         pv_status *st);

#endif
