/*
 * gw_node_watch: liveness follower (see gw_node_watch.h).
 *
 * Hand-over from other threads is only the stop request (an ev_async under a mutex); all other
 * state belongs to the loop's thread. Reads of the registry use a synchronous pv_redis owned by
 * that thread.
 */
#include "gw_node_watch.h"

#include <ev.h>
#include <hiredis/adapters/libev.h>
#include <hiredis/async.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_status.h"

#define RECONNECT_S 0.5

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct gw_node_watch {
    gw_app *app;
    gw_watchers *out; /* the NodeStatusStream calls */
    char host[256];
    int port; /* 0: host is a unix socket path */
    char pattern[2 * PV_KEY_MAX];
    char channel_prefix[2 * PV_KEY_MAX]; /* "__keyspace@<db>__:<alive prefix>" */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    bool stop_requested, joined;
    struct ev_loop *loop;
    ev_async wake;
    ev_timer reconnect;
    /* the loop's thread only */
    redisAsyncContext *ac;
    pv_redis *redis;
    bool warned;
    char **alive; /* sorted names of the nodes known alive */
    size_t n_alive, cap_alive;
};

static void watch_connect(gw_node_watch *w);

static size_t alive_find(const gw_node_watch *w, const char *name, bool *found) {
    size_t lo = 0, hi = w->n_alive;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(w->alive[mid], name);
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
static bool alive_add(gw_node_watch *w, const char *name) {
    bool found;
    size_t at = alive_find(w, name, &found);
    if (found) return false;
    if (w->n_alive == w->cap_alive) {
        size_t cap = w->cap_alive ? 2 * w->cap_alive : 64;
        char **v = realloc(w->alive, cap * sizeof *v);
        if (!v) return true; /* reported, not remembered: a later refresh reports it again */
        w->alive = v;
        w->cap_alive = cap;
    }
    char *copy = strdup(name);
    if (!copy) return true;
    memmove(&w->alive[at + 1], &w->alive[at], (w->n_alive - at) * sizeof *w->alive);
    w->alive[at] = copy;
    w->n_alive++;
    return true;
}

static void alive_remove(gw_node_watch *w, const char *name) {
    bool found;
    size_t at = alive_find(w, name, &found);
    if (!found) return;
    free(w->alive[at]);
    memmove(&w->alive[at], &w->alive[at + 1], (w->n_alive - at - 1) * sizeof *w->alive);
    w->n_alive--;
}

static void push_status(gw_node_watch *w, const char *node, bool alive) {
    char *pod = NULL;
    bool now = false;
    pv_status st;
    /* The pod of a node removed meanwhile is unknown: the message carries none. */
    if (pv_registry_get_alive(w->redis, &w->app->keys, node, &now, &pod, &st) != PV_OK &&
        st.code != PV_NOT_FOUND)
        pv_warn("NodeStatusStream: reading node %s: %s", node, st.msg);
    Pb__NodeStatusStreamMessage m = PB__NODE_STATUS_STREAM_MESSAGE__INIT;
    m.nodename = (char *)node;
    m.podname = pod ? pod : "";
    m.alive = alive;
    gw_watchers_broadcast(w->out, &m.base);
    pv_debug("NodeStatusStream: node=%s alive=%d", node, (int)alive);
    free(pod);
}

/* Reports the difference between the known set and the registry's alive set. */
static void resync(gw_node_watch *w) {
    char **names = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_registry_alive_nodes(w->redis, &w->app->keys, &names, &n, &st) != PV_OK) {
        pv_warn("NodeStatusStream: reading the alive nodes: %s", st.msg);
        return;
    }
    for (size_t i = 0; i < w->n_alive;) {
        if (bsearch(&w->alive[i], names, n, sizeof *names, cmp_str)) {
            i++;
            continue;
        }
        char *gone = w->alive[i];
        w->alive[i] = NULL;
        memmove(&w->alive[i], &w->alive[i + 1], (w->n_alive - i - 1) * sizeof *w->alive);
        w->n_alive--;
        push_status(w, gone, false);
        free(gone);
    }
    for (size_t i = 0; i < n; i++)
        if (alive_add(w, names[i])) push_status(w, names[i], true);
    pv_registry_names_free(names, n);
}

static void on_event(gw_node_watch *w, const char *channel, const char *event) {
    size_t plen = strlen(w->channel_prefix);
    if (strncmp(channel, w->channel_prefix, plen) != 0) return;
    const char *node = channel + plen;
    if (strcmp(event, "set") == 0) {
        if (alive_add(w, node)) push_status(w, node, true);
    } else if (strcmp(event, "del") == 0 || strcmp(event, "expired") == 0) {
        /* Redis notifies only keys that existed: every one of these is a death. */
        alive_remove(w, node);
        push_status(w, node, false);
    }
}

static void on_pmessage(redisAsyncContext *ac, void *r, void *privdata) {
    (void)privdata;
    gw_node_watch *w = ac->data;
    redisReply *reply = r;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) return;
    const redisReply *kind = reply->element[0];
    if (kind->type != REDIS_REPLY_STRING) return;
    if (strcmp(kind->str, "psubscribe") == 0) {
        if (w->warned) pv_info("NodeStatusStream: redis reachable again");
        w->warned = false;
        resync(w); /* subscribed first, then read: nothing falls in between */
        return;
    }
    if (strcmp(kind->str, "pmessage") == 0 && reply->elements == 4 &&
        reply->element[2]->type == REDIS_REPLY_STRING &&
        reply->element[3]->type == REDIS_REPLY_STRING)
        on_event(w, reply->element[2]->str, reply->element[3]->str);
}

static void schedule_reconnect(gw_node_watch *w, const char *why) {
    if (!w->warned)
        pv_warn("NodeStatusStream: redis %s: %s; reconnecting", w->app->cfg.redis.addr, why);
    w->warned = true;
    ev_timer_stop(w->loop, &w->reconnect);
    ev_timer_set(&w->reconnect, RECONNECT_S, 0.);
    ev_timer_start(w->loop, &w->reconnect);
}

static void subscribe_now(gw_node_watch *w) {
    bool changed = false;
    pv_status st;
    if (pv_registry_ensure_notify(w->redis, &changed, &st) != PV_OK)
        pv_warn("NodeStatusStream: %s; liveness changes will not be seen unless redis.conf sets "
                "notify-keyspace-events %s",
                st.msg, PV_REGISTRY_NOTIFY_FLAGS);
    else if (changed)
        pv_warn("NodeStatusStream: redis notify-keyspace-events lacked %s; added it at run time "
                "(put it in redis.conf)",
                PV_REGISTRY_NOTIFY_FLAGS);
    if (redisAsyncCommand(w->ac, on_pmessage, NULL, "PSUBSCRIBE %s", w->pattern) != REDIS_OK)
        pv_warn("NodeStatusStream: PSUBSCRIBE could not be sent");
}

static void on_auth(redisAsyncContext *ac, void *r, void *privdata) {
    (void)privdata;
    gw_node_watch *w = ac->data;
    redisReply *reply = r;
    if (!reply) return;
    if (reply->type == REDIS_REPLY_ERROR) {
        pv_error("NodeStatusStream: redis refused AUTH: %s", reply->str);
        redisAsyncDisconnect(ac);
        return;
    }
    subscribe_now(w);
}

static void on_connect(const redisAsyncContext *ac, int status) {
    gw_node_watch *w = ac->data;
    if (status != REDIS_OK) {
        w->ac = NULL; /* hiredis frees it after this callback */
        schedule_reconnect(w, ac->errstr);
        return;
    }
    const char *pw = w->app->cfg.redis.password;
    if (pw && *pw) {
        redisAsyncCommand(w->ac, on_auth, NULL, "AUTH %s", pw);
        return;
    }
    subscribe_now(w);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
    (void)status;
    gw_node_watch *w = ac->data;
    w->ac = NULL;
    bool stopping;
    pthread_mutex_lock(&w->mu);
    stopping = w->stop_requested;
    pthread_mutex_unlock(&w->mu);
    if (!stopping) schedule_reconnect(w, ac->errstr[0] ? ac->errstr : "connection closed");
}

static void on_reconnect(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    watch_connect(t->data);
}

static void watch_connect(gw_node_watch *w) {
    if (w->ac) return;
    redisAsyncContext *ac =
        w->port ? redisAsyncConnect(w->host, w->port) : redisAsyncConnectUnix(w->host);
    if (!ac || ac->err) {
        schedule_reconnect(w, ac ? ac->errstr : "out of memory");
        if (ac) redisAsyncFree(ac);
        return;
    }
    ac->data = w;
    if (redisLibevAttach(w->loop, ac) != REDIS_OK) {
        redisAsyncFree(ac);
        schedule_reconnect(w, "cannot attach to the event loop");
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    w->ac = ac;
}

static void on_wake(struct ev_loop *loop, ev_async *a, int revents) {
    (void)revents;
    gw_node_watch *w = a->data;
    ev_timer_stop(loop, &w->reconnect);
    if (w->ac) {
        redisAsyncContext *ac = w->ac;
        w->ac = NULL;
        redisAsyncFree(ac);
    }
    ev_async_stop(loop, &w->wake);
    ev_break(loop, EVBREAK_ALL);
}

static void *watch_thread(void *arg) {
    gw_node_watch *w = arg;
    watch_connect(w);
    ev_run(w->loop, 0);
    return NULL;
}

static int parse_addr(gw_node_watch *w, const char *addr) {
    pv_status st;
    return pv_redis_parse_addr(addr, w->host, sizeof w->host, &w->port, &st) == PV_OK ? 0 : -1;
}

gw_node_watch *gw_node_watch_new(gw_app *app, gw_watchers *out) {
    gw_node_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->app = app;
    w->out = out;
    pv_status st;
    char prefix[PV_KEY_MAX];
    if (parse_addr(w, app->cfg.redis.addr) != 0 ||
        pv_registry_alive_pattern(&app->keys, app->cfg.redis.db, w->pattern, sizeof w->pattern,
                                  &st) != PV_OK ||
        pv_registry_alive_prefix(&app->keys, prefix, sizeof prefix, &st) != PV_OK) {
        pv_error("NodeStatusStream: redis.addr %s or redis.prefix %s unusable", app->cfg.redis.addr,
                 app->keys.prefix);
        free(w);
        return NULL;
    }
    snprintf(w->channel_prefix, sizeof w->channel_prefix, "__keyspace@%d__:%s", app->cfg.redis.db,
             prefix);
    pv_redis_opts o;
    pv_redis_opts_from_config(&app->cfg, &o);
    w->loop = ev_loop_new(EVFLAG_AUTO);
    if (!w->loop || pv_redis_new(&o, &w->redis, &st) != PV_OK) {
        if (w->loop) ev_loop_destroy(w->loop);
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    ev_async_init(&w->wake, on_wake);
    w->wake.data = w;
    ev_async_start(w->loop, &w->wake);
    ev_init(&w->reconnect, on_reconnect);
    w->reconnect.data = w;
    return w;
}

int gw_node_watch_start(gw_node_watch *w) {
    /* The thread inherits the caller's signal mask: main blocks SIGINT/SIGTERM before this. */
    if (pthread_create(&w->thread, NULL, watch_thread, w) != 0) return -1;
    w->started = true;
    return 0;
}

void gw_node_watch_stop(gw_node_watch *w) {
    if (!w || !w->started) return;
    pthread_mutex_lock(&w->mu);
    bool first = !w->stop_requested;
    w->stop_requested = true;
    if (first) ev_async_send(w->loop, &w->wake);
    pthread_mutex_unlock(&w->mu);
    if (first) {
        pthread_join(w->thread, NULL);
        w->joined = true;
    }
}

void gw_node_watch_free(gw_node_watch *w) {
    if (!w) return;
    gw_node_watch_stop(w);
    for (size_t i = 0; i < w->n_alive; i++)
        free(w->alive[i]);
    free(w->alive);
    pv_redis_free(w->redis);
    ev_loop_destroy(w->loop);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
