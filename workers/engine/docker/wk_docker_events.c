/*
 * wk_docker_events: the daemon's event stream (see wk_engine_docker.h), as Eru's agent follows
 * it: one long GET /events for the node's containers (type=container, the node's label), each
 * event a line of JSON. What an event changes is kept in d->live and the watch is told the
 * workload's id, so a container killed, stopped or paused straight through the daemon shows in
 * its workload's status at once, not at the agent's next pass; the list (wk_engine_list) reads
 * d->live and costs the daemon nothing while the stream is followed.
 *
 * An event that only moves a container's state (die, pause, unpause, oom) is applied to its
 * kept inspect; the others that change what is reported (create, start, restart, update,
 * rename) inspect the container again; destroy drops it; kill and stop change nothing by
 * themselves (a die follows). Events come in the daemon's order, so replayed ones (since=)
 * end where the daemon is.
 *
 * Each (re)connection: the daemon's time (GET /info SystemTime), a full listing (events missed
 * while the stream was down, a restarted daemon's containers), then the stream from since= the
 * last event seen (else that time), so nothing between the listing and the subscription is
 * lost; a broken stream (daemon stopped or restarted) is retried with backoff (0.1 s doubling
 * to 2 s).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_log.h"
#include "pv_time.h"
#include "wk_engine_docker.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000

/* The actions followed: what changes a container's state, limits or name. */
static const char *const ACTIONS[] = {"create", "start",  "restart",      "die", "stop",
                                      "kill",   "pause",  "unpause",      "oom", "destroy",
                                      "update", "rename", "health_status"};

void wk_docker_set_watch(void *impl, wk_engine_watch_fn fn, void *arg) {
    wk_docker *d = impl;
    pthread_mutex_lock(&d->watch_mu);
    d->watch = fn;
    d->watch_arg = arg;
    pthread_mutex_unlock(&d->watch_mu);
}

void wk_docker_notify(wk_docker *d, const char *id) {
    pthread_mutex_lock(&d->watch_mu);
    if (d->watch) d->watch(d->watch_arg, id);
    pthread_mutex_unlock(&d->watch_mu);
}

static bool stopping(wk_docker *d) {
    pthread_mutex_lock(&d->mu);
    bool s = d->ev_stopping;
    pthread_mutex_unlock(&d->mu);
    return s;
}

/* ---- one event ---- */

/* The state an action leaves, on the kept inspect c; false when it needs an inspect instead. */
static bool patch_state(json_t *c, const char *action, json_t *attrs, int64_t ns) {
    json_t *state = json_object_get(c, "State");
    if (!json_is_object(state)) return false;
    if (strcmp(action, "die") == 0) {
        const char *code = json_string_value(json_object_get(attrs, "exitCode"));
        char finished[64];
        time_t secs = (time_t)(ns / 1000000000);
        struct tm tm;
        gmtime_r(&secs, &tm);
        size_t n = strftime(finished, sizeof finished, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(finished + n, sizeof finished - n, ".%09lldZ", (long long)(ns % 1000000000));
        json_object_set_new(state, "Status", json_string("exited"));
        json_object_set_new(state, "Running", json_false());
        json_object_set_new(state, "Paused", json_false());
        json_object_set_new(state, "Pid", json_integer(0));
        json_object_set_new(state, "ExitCode", json_integer(code ? atoi(code) : -1));
        json_object_set_new(state, "FinishedAt", json_string(finished));
    } else if (strcmp(action, "pause") == 0 || strcmp(action, "unpause") == 0) {
        bool paused = action[0] == 'p';
        json_object_set_new(state, "Status", json_string(paused ? "paused" : "running"));
        json_object_set_new(state, "Paused", json_boolean(paused));
    } else if (strcmp(action, "oom") == 0) {
        json_object_set_new(state, "OOMKilled", json_true());
    } else {
        return false;
    }
    return true;
}

/* Inspects container cid (workload id) again into d->live; a container gone is dropped. */
static void reinspect(wk_docker *d, const char *id, const char *cid) {
    char path[160];
    snprintf(path, sizeof path, "/containers/%.72s/json", cid);
    json_t *in = NULL;
    pv_status st;
    int rc = wk_docker_json(d->api, "GET", path, NULL, &in, "inspect", &st);
    pthread_mutex_lock(&d->mu);
    if (rc == PV_OK && in)
        json_object_set_new(d->live, id, in);
    else if (rc == PV_NOT_FOUND)
        json_object_del(d->live, id);
    else
        json_decref(in);
    pthread_mutex_unlock(&d->mu);
}

void wk_docker_refresh(wk_docker *d, const char *id, const char *cid) {
    reinspect(d, id, cid);
    wk_docker_notify(d, id);
}

static int on_event(void *ctx, json_t *ev, pv_status *st) {
    (void)st;
    wk_docker *d = ctx;
    const char *action = json_string_value(json_object_get(ev, "Action"));
    json_t *actor = json_object_get(ev, "Actor");
    json_t *attrs = json_object_get(actor, "Attributes");
    const char *cid = json_string_value(json_object_get(actor, "ID"));
    const char *id = json_string_value(json_object_get(attrs, WK_DOCKER_ID_LABEL));
    int64_t ns = json_integer_value(json_object_get(ev, "timeNano"));
    pthread_mutex_lock(&d->mu);
    if (ns > d->ev_last_ns) d->ev_last_ns = ns;
    pthread_mutex_unlock(&d->mu);
    if (!action || !cid || !id) return PV_OK; /* not a workload's container */
    if (strcmp(action, "kill") == 0 || strcmp(action, "stop") == 0) return PV_OK;
    bool patched = false;
    if (strcmp(action, "destroy") == 0) {
        pthread_mutex_lock(&d->mu);
        json_object_del(d->live, id);
        pthread_mutex_unlock(&d->mu);
        wk_docker_forget(d, id);
        patched = true;
    } else if (strncmp(action, "health_status", 13) == 0) {
        patched = true; /* the agent's own check decides healthy: only tell it */
    } else {
        pthread_mutex_lock(&d->mu);
        json_t *c = json_object_get(d->live, id);
        patched = c && patch_state(c, action, attrs, ns);
        pthread_mutex_unlock(&d->mu);
    }
    if (!patched) {
        wk_docker_remember(d, id, cid);
        reinspect(d, id, cid);
    }
    wk_docker_notify(d, id);
    return PV_OK;
}

/* ---- the stream ---- */

static int on_data(void *ctx, const char *data, size_t len, pv_status *st) {
    return wk_docker_ndjson_feed(ctx, data, len, st) == PV_OK ? 0 : 1;
}

static int on_tick(void *ctx, pv_status *st) {
    wk_docker_ndjson *lines = ctx;
    if (!stopping(lines->ctx)) return 0;
    pv_status_set(st, PV_CANCELLED, "docker events: the engine closes");
    return 1;
}

/* The stream's path: since= (ns, the daemon's clock) and the filters. NULL when out of memory. */
static char *events_path(wk_docker *d, int64_t since_ns) {
    json_t *filters = json_pack("{s:[s], s:[s], s:[]}", "type", "container", "label",
                                d->node_label ? d->node_label : WK_DOCKER_ID_LABEL, "event");
    for (size_t i = 0; filters && i < sizeof ACTIONS / sizeof ACTIONS[0]; i++)
        json_array_append_new(json_object_get(filters, "event"), json_string(ACTIONS[i]));
    char *text = filters ? json_dumps(filters, JSON_COMPACT) : NULL;
    json_decref(filters);
    char *esc = text ? wk_docker_escape(text) : NULL, *path = NULL;
    free(text);
    if (esc &&
        asprintf(&path, "/events?since=%lld.%09lld&filters=%s", (long long)(since_ns / 1000000000),
                 (long long)(since_ns % 1000000000), esc) < 0)
        path = NULL;
    free(esc);
    return path;
}

/* The daemon's clock now (GET /info SystemTime) in ns. */
static int daemon_now(wk_docker *d, int64_t *ns, pv_status *st) {
    json_t *info = NULL;
    if (wk_docker_json(d->api, "GET", "/info", NULL, &info, "info", st) != PV_OK) return st->code;
    *ns = wk_docker_time_ms(json_string_value(json_object_get(info, "SystemTime"))) * 1000000;
    json_decref(info);
    if (*ns <= 0) *ns = pv_time_now_ms() * 1000000;
    return PV_OK;
}

/* One connection: listing, then the stream until it breaks (or the engine closes). *lost: the
 * last one broke (said once, and once that it is followed again). */
static int follow_once(wk_docker *d, bool *lost, pv_status *st) {
    int64_t now_ns = 0;
    json_t *live = NULL;
    if (daemon_now(d, &now_ns, st) != PV_OK || wk_docker_inspect_all(d, &live, st) != PV_OK)
        return st->code;
    pthread_mutex_lock(&d->mu);
    json_decref(d->live);
    d->live = live;
    d->synced = true;
    int64_t since = d->ev_last_ns > 0 ? d->ev_last_ns : now_ns;
    size_t n = json_object_size(live);
    pthread_mutex_unlock(&d->mu);
    if (*lost)
        pv_info("docker events of %s: followed again (%zu containers listed)",
                wk_docker_api_endpoint(d->api), n);
    *lost = false;
    wk_docker_notify(d, NULL); /* what the listing found may differ from what was reported */
    char *path = events_path(d, since);
    if (!path) return pv_status_set(st, PV_INTERNAL, "out of memory");
    wk_docker_ndjson lines = {.fn = on_event, .ctx = d};
    wk_docker_req req = {.method = "GET",
                         .path = path,
                         .timeout_ms = -1,
                         .on_data = on_data,
                         .on_tick = on_tick,
                         .ctx = &lines};
    wk_docker_resp r;
    int rc = wk_docker_call(d->api, &req, &r, st);
    if (rc == PV_OK) rc = wk_docker_check(&r, "events", st);
    if (rc == PV_OK)
        rc = pv_status_set(st, PV_UNAVAILABLE, "docker daemon at %s: events ended",
                           wk_docker_api_endpoint(d->api));
    wk_docker_resp_clear(&r);
    pv_status est;
    wk_docker_ndjson_end(&lines, &est);
    free(path);
    return rc;
}

static void *follow(void *arg) {
    wk_docker *d = arg;
    int backoff = BACKOFF_MIN_MS;
    bool lost = false;
    while (!stopping(d)) {
        pv_status st;
        int64_t t0 = pv_time_mono_ms();
        bool was_lost = lost;
        follow_once(d, &lost, &st);
        pthread_mutex_lock(&d->mu);
        d->synced = false;
        bool quit = d->ev_stopping;
        pthread_mutex_unlock(&d->mu);
        if (quit) break;
        if (!was_lost || !lost)
            pv_warn("docker events of %s: %s; following again once it answers",
                    wk_docker_api_endpoint(d->api), st.msg);
        lost = true;
        /* a stream that ran a while starts the backoff over */
        backoff = pv_time_mono_ms() - t0 > BACKOFF_MAX_MS ? BACKOFF_MIN_MS : backoff;
        struct timespec until = pv_time_mono_after(backoff);
        pthread_mutex_lock(&d->mu);
        while (!d->ev_stopping && pthread_cond_timedwait(&d->ev_cv, &d->mu, &until) == 0) {
        }
        pthread_mutex_unlock(&d->mu);
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
    return NULL;
}

int wk_docker_events_start(wk_docker *d, pv_status *st) {
    if (pthread_create(&d->ev_thread, NULL, follow, d) != 0)
        return pv_status_set(st, PV_INTERNAL, "docker events: cannot start a thread");
    d->ev_started = true;
    return PV_OK;
}

void wk_docker_events_stop(wk_docker *d) {
    if (!d->ev_started) return;
    pthread_mutex_lock(&d->mu);
    d->ev_stopping = true;
    pthread_cond_broadcast(&d->ev_cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->ev_thread, NULL);
    d->ev_started = false;
}
