/*
 * gw_node_watch: keyspace-notification followers (see gw_node_watch.h).
 *
 * The first half is the follower itself, which knows nothing of what it follows: connection,
 * AUTH, notification settings, PSUBSCRIBE, reconnection, and dispatch to the spec's callbacks.
 * The second half is node liveness, one user of it.
 *
 * Hand-over from other threads is only the stop request (an ev_async under a mutex) and the
 * "synced" flag (under the same mutex, with a condition variable); all other state belongs to
 * the loop's thread.
 */
#include "gw_node_watch.h"

#include <errno.h>
#include <ev.h>
#include <hiredis/async.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gw_async.h"
#include "pb/core.pb-c.h"
#include "pv_time.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_status.h"

#define RECONNECT_MS 500

struct gw_node_watch {
    gw_app *app;
    char what[64];
    char pattern[2 * PV_KEY_MAX];
    char channel_prefix[2 * PV_KEY_MAX]; /* "__keyspace@<db>__:<key prefix>" */
    void (*resync)(void *arg, pv_redis *r);
    void (*event)(void *arg, pv_redis *r, const char *rest, const char *event);
    void *arg;
    void (*free_arg)(void *arg); /* for the state a built-in user (liveness) owns */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t synced_cv;
    bool stop_requested, synced;
    struct ev_loop *loop;
    ev_async wake;
    /* the loop's thread only */
    gw_async *async;
    redisAsyncContext *ac; /* while connected and authenticated */
    pv_redis *redis;
    bool warned;
    bool config_denied; /* the Redis user may not run CONFIG (ops/redis.acl): asked once */
};

static void resync(gw_node_watch *w) {
    w->resync(w->arg, w->redis);
    pthread_mutex_lock(&w->mu);
    w->synced = true;
    pthread_cond_broadcast(&w->synced_cv);
    pthread_mutex_unlock(&w->mu);
}

static void on_pmessage(redisAsyncContext *ac, void *r, void *privdata) {
    (void)privdata;
    gw_node_watch *w = gw_async_arg(ac);
    redisReply *reply = r;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) return;
    const redisReply *kind = reply->element[0];
    if (kind->type != REDIS_REPLY_STRING) return;
    if (strcmp(kind->str, "psubscribe") == 0) {
        if (w->warned) pv_info("%s: redis reachable again", w->what);
        w->warned = false;
        resync(w); /* subscribed first, then read: nothing falls in between */
        return;
    }
    if (strcmp(kind->str, "pmessage") != 0 || reply->elements != 4 ||
        reply->element[2]->type != REDIS_REPLY_STRING ||
        reply->element[3]->type != REDIS_REPLY_STRING)
        return;
    const char *channel = reply->element[2]->str;
    size_t plen = strlen(w->channel_prefix);
    if (strncmp(channel, w->channel_prefix, plen) == 0)
        w->event(w->arg, w->redis, channel + plen, reply->element[3]->str);
}

/* gw_async: a connect failed or the connection dropped (it reconnects by itself). */
static void on_lost(void *arg, const char *why) {
    gw_node_watch *w = arg;
    w->ac = NULL;
    if (!w->warned) pv_warn("%s: redis %s: %s; reconnecting", w->what, w->app->cfg.redis.addr, why);
    w->warned = true;
}

static void subscribe_now(gw_node_watch *w) {
    bool changed = false;
    pv_status st;
    int rc = w->config_denied ? PV_OK : pv_registry_ensure_notify(w->redis, &changed, &st);
    if (rc == PV_PERMISSION_DENIED) {
        /* The ACL user of ops/redis.acl has no CONFIG, by design: redis.conf sets the flags. */
        w->config_denied = true;
        pv_info("%s: the redis user may not read the configuration; relying on redis.conf for "
                "notify-keyspace-events %s",
                w->what, PV_REGISTRY_NOTIFY_FLAGS);
    } else if (rc != PV_OK)
        pv_warn("%s: %s; changes will not be seen unless redis.conf sets "
                "notify-keyspace-events %s",
                w->what, st.msg, PV_REGISTRY_NOTIFY_FLAGS);
    else if (changed)
        pv_warn("%s: redis notify-keyspace-events lacked %s; added it at run time "
                "(put it in redis.conf)",
                w->what, PV_REGISTRY_NOTIFY_FLAGS);
    if (redisAsyncCommand(w->ac, on_pmessage, NULL, "PSUBSCRIBE %s", w->pattern) != REDIS_OK)
        pv_warn("%s: PSUBSCRIBE could not be sent", w->what);
}

/* gw_async: connected and authenticated. */
static void on_ready(void *arg, redisAsyncContext *ac) {
    gw_node_watch *w = arg;
    w->ac = ac;
    subscribe_now(w);
}

static void on_wake(struct ev_loop *loop, ev_async *a, int revents) {
    (void)revents;
    gw_node_watch *w = a->data;
    w->ac = NULL;
    gw_async_close(w->async);
    ev_async_stop(loop, &w->wake);
    ev_break(loop, EVBREAK_ALL);
}

static void *watch_thread(void *arg) {
    gw_node_watch *w = arg;
    gw_async_connect(w->async);
    ev_run(w->loop, 0);
    return NULL;
}

static bool copy(char *dst, size_t len, const char *src) {
    int n = snprintf(dst, len, "%s", src ? src : "");
    return n >= 0 && (size_t)n < len;
}

gw_node_watch *gw_node_watch_new_keys(gw_app *app, const gw_node_watch_keys *spec) {
    gw_node_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->app = app;
    w->resync = spec->resync;
    w->event = spec->event;
    w->arg = spec->arg;
    copy(w->what, sizeof w->what, spec->what);
    int n = snprintf(w->channel_prefix, sizeof w->channel_prefix, "__keyspace@%d__:%s",
                     app->cfg.redis.db, spec->prefix);
    if (!copy(w->pattern, sizeof w->pattern, spec->pattern) || n < 0 ||
        (size_t)n >= sizeof w->channel_prefix) {
        pv_error("%s: key prefix %s unusable", w->what, spec->prefix);
        free(w);
        return NULL;
    }
    gw_async_spec as = {.what = w->what,
                        .backoff_ms.min = RECONNECT_MS,
                        .ready = on_ready,
                        .lost = on_lost,
                        .arg = w};
    if (gw_async_open_follower(&app->cfg, &as, &w->loop, &w->async, &w->redis) != 0) {
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    pv_time_cond_init(&w->synced_cv);
    ev_async_init(&w->wake, on_wake);
    w->wake.data = w;
    ev_async_start(w->loop, &w->wake);
    return w;
}

int gw_node_watch_start(gw_node_watch *w) {
    /* The thread inherits the caller's signal mask: main blocks SIGINT/SIGTERM before this. */
    if (pthread_create(&w->thread, NULL, watch_thread, w) != 0) return -1;
    w->started = true;
    return 0;
}

int gw_node_watch_wait_synced(gw_node_watch *w, int timeout_ms) {
    struct timespec until = pv_time_mono_after(timeout_ms);
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->synced && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&w->synced_cv, &w->mu, &until);
    bool synced = w->synced;
    pthread_mutex_unlock(&w->mu);
    return synced ? 0 : -1;
}

void gw_node_watch_stop(gw_node_watch *w) {
    if (!w || !w->started) return;
    pthread_mutex_lock(&w->mu);
    bool first = !w->stop_requested;
    w->stop_requested = true;
    if (first) ev_async_send(w->loop, &w->wake);
    pthread_mutex_unlock(&w->mu);
    if (first) pthread_join(w->thread, NULL);
}

void gw_node_watch_free(gw_node_watch *w) {
    if (!w) return;
    gw_node_watch_stop(w);
    if (w->free_arg) w->free_arg(w->arg);
    gw_async_close_follower(w->loop, w->async, w->redis);
    pthread_cond_destroy(&w->synced_cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

/* ------------------------------------------------------------------------------------------ */
/* node liveness (NodeStatusStream)                                                            */

typedef struct liveness {
    gw_app *app;
    gw_watchers *out; /* the NodeStatusStream calls */
    char **alive;     /* sorted names of the nodes known alive */
    size_t n_alive, cap_alive;
} liveness;

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t alive_find(const liveness *l, const char *name, bool *found) {
    size_t lo = 0, hi = l->n_alive;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(l->alive[mid], name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* Adds name; returns true when it was not there. */
static bool alive_add(liveness *l, const char *name) {
    bool found;
    size_t at = alive_find(l, name, &found);
    if (found) return false;
    if (l->n_alive == l->cap_alive) {
        size_t cap = l->cap_alive ? 2 * l->cap_alive : 64;
        char **v = realloc(l->alive, cap * sizeof *v);
        if (!v) return true; /* reported, not remembered: a later refresh reports it again */
        l->alive = v;
        l->cap_alive = cap;
    }
    char *dup = strdup(name);
    if (!dup) return true;
    memmove(&l->alive[at + 1], &l->alive[at], (l->n_alive - at) * sizeof *l->alive);
    l->alive[at] = dup;
    l->n_alive++;
    return true;
}

static void alive_remove(liveness *l, const char *name) {
    bool found;
    size_t at = alive_find(l, name, &found);
    if (!found) return;
    free(l->alive[at]);
    memmove(&l->alive[at], &l->alive[at + 1], (l->n_alive - at - 1) * sizeof *l->alive);
    l->n_alive--;
}

static void push_status(liveness *l, pv_redis *r, const char *node, bool alive) {
    char *pod = NULL;
    bool now = false;
    pv_status st;
    /* The pod of a node removed meanwhile is unknown: the message carries none. */
    if (pv_registry_get_alive(r, &l->app->keys, node, &now, &pod, &st) != PV_OK &&
        st.code != PV_NOT_FOUND)
        pv_warn("NodeStatusStream: reading node %s: %s", node, st.msg);
    Pb__NodeStatusStreamMessage m = PB__NODE_STATUS_STREAM_MESSAGE__INIT;
    m.nodename = (char *)node;
    m.podname = pod ? pod : "";
    m.alive = alive;
    gw_watchers_broadcast(l->out, &m.base);
    pv_debug("NodeStatusStream: node=%s alive=%d", node, (int)alive);
    free(pod);
}

/* Reports the difference between the known set and the registry's alive set. */
static void liveness_resync(void *arg, pv_redis *r) {
    liveness *l = arg;
    char **names = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_registry_alive_nodes(r, &l->app->keys, &names, &n, &st) != PV_OK) {
        pv_warn("NodeStatusStream: reading the alive nodes: %s", st.msg);
        return;
    }
    for (size_t i = 0; i < l->n_alive;) {
        if (bsearch(&l->alive[i], names, n, sizeof *names, cmp_str)) {
            i++;
            continue;
        }
        char *gone = l->alive[i];
        memmove(&l->alive[i], &l->alive[i + 1], (l->n_alive - i - 1) * sizeof *l->alive);
        l->n_alive--;
        push_status(l, r, gone, false);
        free(gone);
    }
    for (size_t i = 0; i < n; i++)
        if (alive_add(l, names[i])) push_status(l, r, names[i], true);
    pv_registry_names_free(names, n);
}

static void liveness_event(void *arg, pv_redis *r, const char *node, const char *event) {
    liveness *l = arg;
    if (strcmp(event, "set") == 0) {
        if (alive_add(l, node)) push_status(l, r, node, true);
    } else if (strcmp(event, "del") == 0 || strcmp(event, "expired") == 0) {
        /* Redis notifies only keys that existed: every one of these is a death. */
        alive_remove(l, node);
        push_status(l, r, node, false);
    }
}

static void liveness_free(void *arg) {
    liveness *l = arg;
    for (size_t i = 0; i < l->n_alive; i++)
        free(l->alive[i]);
    free(l->alive);
    free(l);
}

gw_node_watch *gw_node_watch_new(gw_app *app, gw_watchers *out) {
    char pattern[2 * PV_KEY_MAX], prefix[PV_KEY_MAX];
    pv_status st;
    if (pv_registry_alive_pattern(&app->keys, app->cfg.redis.db, pattern, sizeof pattern, &st) !=
            PV_OK ||
        pv_registry_alive_prefix(&app->keys, prefix, sizeof prefix, &st) != PV_OK) {
        pv_error("NodeStatusStream: redis.prefix %s unusable: %s", app->keys.prefix, st.msg);
        return NULL;
    }
    liveness *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->app = app;
    l->out = out;
    gw_node_watch_keys spec = {.what = "NodeStatusStream",
                               .pattern = pattern,
                               .prefix = prefix,
                               .resync = liveness_resync,
                               .event = liveness_event,
                               .arg = l};
    gw_node_watch *w = gw_node_watch_new_keys(app, &spec);
    if (!w) {
        free(l);
        return NULL;
    }
    w->free_arg = liveness_free;
    return w;
}
