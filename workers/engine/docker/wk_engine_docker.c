/*
 * wk_engine_docker: the docker engine's lifecycle calls (see wk_engine_docker.h): create
 * (pulling the image first when the daemon lacks it, as Eru pulls before it creates), start
 * with the after_start hooks, stop (before_stop hooks unless force, then stop with the grace as
 * t=), pause/unpause, remove, inspect, list by label, update of the limits.
 */
#include "wk_engine_docker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_log.h"
#include "pv_time.h"
#include "wk_engine_impl.h"

#define HOOK_TIMEOUT_MS 60000

static int docker_open(const char *uri, const wk_engine_opts *opts, void **impl, pv_status *st) {
    *impl = NULL;
    wk_docker *d = calloc(1, sizeof *d);
    if (!d || !(d->ids = json_object()) ||
        !(d->auths = wk_docker_auths(opts ? opts->registry_auths : NULL,
                                     opts ? opts->n_registry_auths : 0))) {
        if (d) json_decref(d->ids);
        free(d);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    wk_docker_tls tls = {opts ? opts->tls_ca : NULL, opts ? opts->tls_cert : NULL,
                         opts ? opts->tls_key : NULL};
    if (wk_docker_api_open(uri, &tls, &d->api, st) != PV_OK) {
        json_decref(d->ids);
        json_decref(d->auths);
        free(d);
        return st->code;
    }
    d->grace_seconds = opts && opts->stop_grace_seconds > 0 ? opts->stop_grace_seconds : 10;
    if (opts && opts->node && *opts->node &&
        asprintf(&d->node_label, "eru.nodename=%s", opts->node) < 0)
        d->node_label = NULL;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->watch_mu, NULL);
    pv_time_cond_init(&d->ev_cv);
    /* The daemon need not answer yet (it may start after the agent): each call says so. */
    json_t *version = NULL;
    pv_status vst;
    if (wk_docker_json(d->api, "GET", "/version", NULL, &version, "version", &vst) == PV_OK)
        pv_info("docker engine %s: Docker %s, API %s", uri,
                json_string_value(json_object_get(version, "Version")),
                json_string_value(json_object_get(version, "ApiVersion")));
    else
        pv_warn("docker engine %s: %s", uri, vst.msg);
    json_decref(version);
    if (wk_docker_events_start(d, &vst) != PV_OK)
        pv_warn("docker engine %s: %s; statuses come from listings only", uri, vst.msg);
    *impl = d;
    return PV_OK;
}

static void docker_close(void *impl) {
    wk_docker *d = impl;
    if (!d) return;
    wk_docker_events_stop(d);
    wk_docker_api_close(d->api);
    json_decref(d->ids);
    json_decref(d->auths);
    json_decref(d->live);
    free(d->node_label);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->watch_mu);
    pthread_cond_destroy(&d->ev_cv);
    free(d);
}

static int docker_ping(void *impl, pv_status *st) {
    wk_docker *d = impl;
    wk_docker_req req = {.method = "GET", .path = "/_ping", .timeout_ms = 5000};
    wk_docker_resp r;
    if (wk_docker_call(d->api, &req, &r, st) != PV_OK) return st->code;
    int rc = wk_docker_check(&r, "ping", st);
    wk_docker_resp_clear(&r);
    return rc;
}

void wk_docker_remember(wk_docker *d, const char *id, const char *cid) {
    pthread_mutex_lock(&d->mu);
    json_object_set_new(d->ids, id, json_string(cid));
    pthread_mutex_unlock(&d->mu);
}

void wk_docker_forget(wk_docker *d, const char *id) {
    pthread_mutex_lock(&d->mu);
    json_object_del(d->ids, id);
    pthread_mutex_unlock(&d->mu);
}

int wk_docker_list_labelled(wk_docker *d, const char *label, json_t **out, pv_status *st) {
    json_t *filters = json_pack("{s:[s]}", "label", label);
    if (filters && d->node_label && !strchr(label, '='))
        json_array_append_new(json_object_get(filters, "label"), json_string(d->node_label));
    char *text = filters ? json_dumps(filters, JSON_COMPACT) : NULL;
    json_decref(filters);
    char *esc = text ? wk_docker_escape(text) : NULL;
    free(text);
    char path[1024];
    if (!esc) return pv_status_set(st, PV_INTERNAL, "out of memory");
    snprintf(path, sizeof path, "/containers/json?all=1&filters=%s", esc);
    free(esc);
    return wk_docker_json(d->api, "GET", path, NULL, out, "list containers", st);
}

int wk_docker_resolve(wk_docker *d, const char *id, char cid[72], pv_status *st) {
    pthread_mutex_lock(&d->mu);
    const char *known = json_string_value(json_object_get(d->ids, id));
    if (known) snprintf(cid, 72, "%s", known);
    pthread_mutex_unlock(&d->mu);
    if (known) return PV_OK;
    char label[160];
    snprintf(label, sizeof label, WK_DOCKER_ID_LABEL "=%s", id);
    json_t *list = NULL;
    if (wk_docker_list_labelled(d, label, &list, st) != PV_OK) return st->code;
    const char *found = json_string_value(json_object_get(json_array_get(list, 0), "Id"));
    int rc = found ? PV_OK
                   : pv_status_set(st, PV_NOT_FOUND, "workload %s: no container of it on %s", id,
                                   wk_docker_api_endpoint(d->api));
    if (found) {
        snprintf(cid, 72, "%s", found);
        wk_docker_remember(d, id, found);
    }
    json_decref(list);
    return rc;
}

/* A call on the workload's container: "<path prefix>/<cid><suffix>". A 404 drops the cache. */
static int on_container(wk_docker *d, const char *id, const char *method, const char *suffix,
                        json_t *body, json_t **out, const char *what, int timeout_ms,
                        pv_status *st) {
    char cid[72], path[512];
    if (wk_docker_resolve(d, id, cid, st) != PV_OK) return st->code;
    snprintf(path, sizeof path, "/containers/%s%s", cid, suffix);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    wk_docker_req req = {.method = method,
                         .path = path,
                         .body = text,
                         .body_len = text ? strlen(text) : 0,
                         .timeout_ms = timeout_ms};
    wk_docker_resp r;
    int rc = wk_docker_call(d->api, &req, &r, st);
    free(text);
    if (out) *out = NULL;
    if (rc == PV_OK) {
        char label[600];
        snprintf(label, sizeof label, "workload %s: %s", id, what);
        rc = wk_docker_check(&r, label, st);
        if (rc == PV_OK && out && r.body) *out = json_loadb(r.body, r.len, 0, NULL);
    }
    if (rc == PV_NOT_FOUND) wk_docker_forget(d, id);
    wk_docker_resp_clear(&r);
    return rc;
}

/* ---- inspect ---- */

static wk_state state_of(const char *status) {
    if (!status) return WK_STATE_STOPPED;
    if (strcmp(status, "created") == 0) return WK_STATE_CREATED;
    if (strcmp(status, "running") == 0 || strcmp(status, "restarting") == 0)
        return WK_STATE_RUNNING;
    if (strcmp(status, "paused") == 0) return WK_STATE_PAUSED;
    return WK_STATE_STOPPED;
}

static char *dump(json_t *j) {
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return text ? text : strdup("{}");
}

/* {"net": "ip"} as Eru's VirtualizationInspect. */
static char *networks_of(json_t *settings) {
    json_t *out = json_object();
    const char *name;
    json_t *n;
    json_object_foreach(json_object_get(settings, "Networks"), name, n) {
        const char *ip = json_string_value(json_object_get(n, "IPAddress"));
        json_object_set_new(out, name, json_string(ip ? ip : ""));
    }
    return dump(out);
}

/* {"80/tcp": ["172.18.0.2:80", "0.0.0.0:80"]}: each published (exposed) port at the container's
 * address on each of its networks, as Eru reports them, then where the node binds it. */
static char *publish_of(json_t *config, json_t *settings) {
    json_t *out = json_object();
    const char *port, *net;
    json_t *unused, *n, *b;
    json_object_foreach(json_object_get(config, "ExposedPorts"), port, unused) {
        json_t *addrs = json_array();
        char addr[160];
        int number = atoi(port);
        json_object_foreach(json_object_get(settings, "Networks"), net, n) {
            const char *ip = json_string_value(json_object_get(n, "IPAddress"));
            if (!ip || !*ip) continue;
            snprintf(addr, sizeof addr, "%s:%d", ip, number);
            json_array_append_new(addrs, json_string(addr));
        }
        size_t i;
        json_array_foreach(json_object_get(json_object_get(settings, "Ports"), port), i, b) {
            const char *host = json_string_value(json_object_get(b, "HostIp")) ?: "";
            snprintf(addr, sizeof addr, strchr(host, ':') ? "[%s]:%s" : "%s:%s", host,
                     json_string_value(json_object_get(b, "HostPort")) ?: "");
            json_array_append_new(addrs, json_string(addr));
        }
        json_object_set_new(out, port, addrs);
    }
    return dump(out);
}

void wk_docker_info_of(json_t *c, wk_engine_info *out) {
    json_t *config = json_object_get(c, "Config"), *state = json_object_get(c, "State");
    json_t *labels = json_object_get(config, "Labels");
    const char *name = json_string_value(json_object_get(c, "Name"));
    out->id = strdup(json_string_value(json_object_get(labels, WK_DOCKER_ID_LABEL)) ?: "");
    out->name = strdup(name ? name + (name[0] == '/') : "");
    out->image = strdup(json_string_value(json_object_get(config, "Image")) ?: "");
    out->state = state_of(json_string_value(json_object_get(state, "Status")));
    out->exit_code = (int)json_integer_value(json_object_get(state, "ExitCode"));
    out->pid = json_integer_value(json_object_get(state, "Pid"));
    out->engine_id = strdup(json_string_value(json_object_get(c, "Id")) ?: "");
    json_t *settings = json_object_get(c, "NetworkSettings");
    out->networks_json = networks_of(settings);
    out->publish_json = publish_of(config, settings);
    out->log_path = strdup(""); /* the daemon keeps the log: wk_engine_logs */
    out->root = NULL;           /* files go through the archive calls */
    out->labels_json = dump(json_incref(labels ? labels : json_object()));
    out->started_ms = wk_docker_time_ms(json_string_value(json_object_get(state, "StartedAt")));
    out->finished_ms = wk_docker_time_ms(json_string_value(json_object_get(state, "FinishedAt")));
    out->restarts = (int)json_integer_value(json_object_get(c, "RestartCount"));
}

static int docker_inspect(void *impl, const char *id, wk_engine_info *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    json_t *c = NULL;
    if (on_container(impl, id, "GET", "/json", NULL, &c, "inspect", 0, st) != PV_OK)
        return st->code;
    wk_docker_info_of(c, out);
    json_decref(c);
    return PV_OK;
}

int wk_docker_inspect_all(wk_docker *d, json_t **out, pv_status *st) {
    *out = NULL;
    json_t *list = NULL;
    if (wk_docker_list_labelled(d, WK_DOCKER_ID_LABEL, &list, st) != PV_OK) return st->code;
    json_t *live = json_object();
    if (!live) {
        json_decref(list);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    size_t i;
    json_t *c;
    json_array_foreach(list, i, c) {
        const char *id =
            json_string_value(json_object_get(json_object_get(c, "Labels"), WK_DOCKER_ID_LABEL));
        const char *cid = json_string_value(json_object_get(c, "Id"));
        if (!id || !cid) continue;
        wk_docker_remember(d, id, cid);
        pv_status ist;
        json_t *in = NULL;
        if (on_container(d, id, "GET", "/json", NULL, &in, "inspect", 0, &ist) != PV_OK)
            continue; /* gone meanwhile: skip */
        json_object_set_new(live, id, in);
    }
    json_decref(list);
    *out = live;
    return PV_OK;
}

/* From what the event stream keeps while it is followed (no call to the daemon), else from a
 * listing of its own. */
static int docker_list(void *impl, wk_engine_info **out, size_t *n, pv_status *st) {
    wk_docker *d = impl;
    *out = NULL;
    *n = 0;
    json_t *fresh = NULL;
    pthread_mutex_lock(&d->mu);
    bool synced = d->synced && d->live;
    pthread_mutex_unlock(&d->mu);
    if (!synced && wk_docker_inspect_all(d, &fresh, st) != PV_OK) return st->code;
    pthread_mutex_lock(&d->mu);
    if (fresh) {
        json_decref(d->live);
        d->live = fresh;
    }
    json_t *live = d->live;
    wk_engine_info *infos = calloc(json_object_size(live) + 1, sizeof *infos);
    size_t got = 0;
    const char *id;
    json_t *c;
    json_object_foreach(live, id, c) {
        if (infos) wk_docker_info_of(c, &infos[got++]);
    }
    pthread_mutex_unlock(&d->mu);
    if (!infos) return pv_status_set(st, PV_INTERNAL, "out of memory");
    *out = infos;
    *n = got;
    return PV_OK;
}

/* ---- create ---- */

static int create_container(wk_docker *d, const wk_workload_spec *spec, json_t *body,
                            json_t **created, pv_status *st) {
    char *name = wk_docker_escape(spec->name ? spec->name : spec->id), path[600];
    snprintf(path, sizeof path, "/containers/create?name=%s", name ? name : "");
    free(name);
    int rc = wk_docker_json(d->api, "POST", path, body, created, "create container", st);
    if (rc == PV_NOT_FOUND && strstr(st->msg, "No such image")) {
        if (wk_docker_pull(d, spec->image, st) != PV_OK) return st->code;
        rc = wk_docker_json(d->api, "POST", path, body, created, "create container", st);
    }
    return rc;
}

/* What a container just created is, without an inspect of it (the daemon's work per create
 * is what the deploy waits for: it inspects once the container runs). */
static void created_info(const wk_workload_spec *spec, const char *cid, wk_engine_info *out) {
    out->id = strdup(spec->id);
    out->name = strdup(spec->name ? spec->name : spec->id);
    out->image = strdup(spec->image ? spec->image : "");
    out->state = WK_STATE_CREATED;
    out->engine_id = strdup(cid);
    out->networks_json = strdup("{}");
    out->publish_json = strdup("{}");
    out->log_path = strdup("");
    out->labels_json = strdup(spec->labels_json ? spec->labels_json : "{}");
}

/* No lookup first: a redelivered create meets its own container by name (the name derives
 * from the workload id), 409, and only then is it looked up by its label. */
static int docker_create(void *impl, const wk_workload_spec *spec, wk_engine_info *out,
                         pv_status *st) {
    wk_docker *d = impl;
    memset(out, 0, sizeof *out);
    json_t *body = wk_docker_create_body(d, spec, st);
    if (!body) return st->code;
    json_t *created = NULL;
    int rc = create_container(d, spec, body, &created, st);
    json_decref(body);
    if (rc == PV_ALREADY_EXISTS) {
        char cid[72];
        pv_status lst;
        int lrc = wk_docker_resolve(d, spec->id, cid, &lst);
        if (lrc == PV_OK)
            pv_status_set(st, PV_ALREADY_EXISTS, "workload %s: container %.12s exists", spec->id,
                          cid);
        else if (lrc != PV_NOT_FOUND)
            rc = pv_status_set(st, lrc, "%s", lst.msg);
        else { /* another workload's container has the name: the daemon's 409, not ours */
            char conflict[PV_STATUS_MSG_MAX];
            snprintf(conflict, sizeof conflict, "%s", st->msg);
            rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s", conflict);
        }
        json_decref(created);
        return rc;
    }
    const char *new_id = json_string_value(json_object_get(created, "Id"));
    if (rc == PV_OK && !new_id)
        rc = pv_status_set(st, PV_INTERNAL, "create container: no Id in the daemon's answer");
    if (rc == PV_OK) {
        wk_docker_remember(d, spec->id, new_id);
        created_info(spec, new_id, out);
    }
    json_decref(created);
    return rc;
}

/* ---- start, stop, pause ---- */

/* The container's labels (a new reference, NULL when none): the kept inspect's (a
 * container's labels never change), else an inspect of its own. */
static json_t *labels_of(wk_docker *d, const char *id) {
    pthread_mutex_lock(&d->mu);
    json_t *kept =
        json_object_get(json_object_get(json_object_get(d->live, id), "Config"), "Labels");
    json_t *labels = kept ? json_deep_copy(kept) : NULL;
    pthread_mutex_unlock(&d->mu);
    if (labels) return labels;
    wk_engine_info info;
    pv_status st;
    if (docker_inspect(d, id, &info, &st) != PV_OK) return NULL;
    labels = json_loads(info.labels_json, 0, NULL);
    wk_engine_info_clear(&info);
    return labels;
}

/* The hooks (after_start, before_stop) kept in the container's label pivirt.hooks: each a
 * shell line run with sh -c; failures are logged and passed over. */
static void run_hooks(wk_docker *d, const char *id, const char *which) {
    json_t *labels = labels_of(d, id);
    const char *text = json_string_value(json_object_get(labels, WK_DOCKER_HOOKS_LABEL));
    json_t *hooks = text ? json_loads(text, 0, NULL) : NULL;
    size_t i;
    json_t *h;
    pv_status st;
    json_array_foreach(json_object_get(hooks, which), i, h) {
        const char *argv[] = {"/bin/sh", "-c", json_string_value(h) ?: ""};
        int code = -1;
        char *out = NULL;
        size_t len = 0;
        if (wk_docker_exec(d, id, argv, 3, HOOK_TIMEOUT_MS, &code, &out, &len, &st) != PV_OK ||
            code != 0)
            pv_warn("workload %s: %s hook \"%s\" failed (exit %d): %s", id, which, argv[2], code,
                    st.code ? st.msg : (out ? out : ""));
        free(out);
    }
    json_decref(hooks);
    json_decref(labels);
}

static int docker_start(void *impl, const char *id, pv_status *st) {
    if (on_container(impl, id, "POST", "/start", NULL, NULL, "start", 0, st) != PV_OK)
        return st->code;
    run_hooks(impl, id, "after_start");
    return PV_OK;
}

/* A forced stop needs no inspect first: the daemon's 304 says it was not running. */
static int force_stop(wk_docker *d, const char *id, pv_status *st) {
    int rc = on_container(d, id, "POST", "/stop?t=0", NULL, NULL, "stop", 60000, st);
    if (rc == PV_FAILED_PRECONDITION && strstr(st->msg, "already in that state"))
        pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s is not running", id);
    return rc;
}

static int docker_stop(void *impl, const char *id, int grace_seconds, bool force, pv_status *st) {
    wk_docker *d = impl;
    if (force) return force_stop(d, id, st);
    wk_engine_info info;
    if (docker_inspect(d, id, &info, st) != PV_OK) return st->code;
    wk_state state = info.state;
    wk_engine_info_clear(&info);
    if (state != WK_STATE_RUNNING && state != WK_STATE_PAUSED)
        return pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s is not running", id);
    if (!force && state == WK_STATE_RUNNING) run_hooks(d, id, "before_stop");
    int grace = force ? 0 : grace_seconds < 0 ? d->grace_seconds : grace_seconds;
    char suffix[64];
    snprintf(suffix, sizeof suffix, "/stop?t=%d", grace);
    return on_container(d, id, "POST", suffix, NULL, NULL, "stop", (grace + 60) * 1000, st);
}

static int docker_pause(void *impl, const char *id, pv_status *st) {
    return on_container(impl, id, "POST", "/pause", NULL, NULL, "pause", 0, st);
}

static int docker_resume(void *impl, const char *id, pv_status *st) {
    return on_container(impl, id, "POST", "/unpause", NULL, NULL, "unpause", 0, st);
}

static int docker_remove(void *impl, const char *id, bool force, pv_status *st) {
    wk_docker *d = impl;
    int rc =
        on_container(d, id, "DELETE", force ? "?force=1&v=1" : "?v=1", NULL, NULL, "remove", 0, st);
    if (rc == PV_OK) wk_docker_forget(d, id);
    return rc;
}

/* ReallocResource: POST /containers/{id}/update; a limit of 0 lifts it (Eru: the largest). */
static int docker_set_limits(void *impl, const char *id, double cpu_limit, int64_t memory_limit,
                             pv_status *st) {
    json_int_t mem = memory_limit > 0 ? memory_limit : -1;
    json_t *body = json_pack(
        "{s:I, s:I, s:I, s:I}", "NanoCpus", (json_int_t)(cpu_limit > 0 ? cpu_limit * 1e9 : 0),
        "Memory", mem, "MemorySwap", mem, "MemoryReservation",
        memory_limit > 0
            ? (json_int_t)(memory_limit / 2 < (4LL << 20) ? (4LL << 20) : memory_limit / 2)
            : (json_int_t)0);
    int rc = on_container(impl, id, "POST", "/update", body, NULL, "update", 0, st);
    json_decref(body);
    return rc;
}

static int docker_set_tls(void *impl, const char *ca, const char *cert, const char *key,
                          pv_status *st) {
    wk_docker *d = impl;
    wk_docker_tls tls = {ca, cert, key};
    return wk_docker_api_set_tls(d->api, &tls, st);
}

const wk_engine_vtbl wk_engine_docker_vtbl = {
    .type = "docker",
    .open = docker_open,
    .close = docker_close,
    .create = docker_create,
    .start = docker_start,
    .stop = docker_stop,
    .pause = docker_pause,
    .resume = docker_resume,
    .remove = docker_remove,
    .inspect = docker_inspect,
    .list = docker_list,
    .exec = wk_docker_exec,
    .set_limits = docker_set_limits,
    .run = NULL,
    .log_range = NULL,
    .put_file = wk_docker_put_file,
    .get_tar = wk_docker_get_tar,
    .get_file = wk_docker_get_file,
    .logs = wk_docker_logs,
    .exec_io = wk_docker_exec_io,
    .image_list = wk_docker_image_list,
    .image_pull = wk_docker_pull,
    .image_remove = wk_docker_image_remove,
    .image_build = wk_docker_image_build,
    .ping = docker_ping,
    .networks = wk_docker_networks,
    .connect = wk_docker_connect,
    .disconnect = wk_docker_disconnect,
    .facts = wk_docker_facts,
    .set_watch = wk_docker_set_watch,
    .set_tls = docker_set_tls,
};
