/*
 * gw_async: one asynchronous Redis connection with reconnects (see gw_async.h).
 *
 * hiredis runs no disconnect callback for a context that never connected, so a connect that
 * times out is freed here; one that fails or drops is freed by hiredis after its callback, so
 * the pointer is forgotten there and never freed twice.
 */
#include "gw_async.h"

#include <hiredis/adapters/libev.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "pv_log.h"
#include "pv_redis.h"

struct gw_async {
    const pv_config *cfg;
    struct ev_loop *loop;
    gw_async_spec spec;
    char what[64];
    char host[256];
    int port; /* 0: host is a unix socket path */
    redisAsyncContext *ac;
    ev_timer reconnect, connect_timeout;
    int backoff_ms;
    bool closed;
};

static void lost(gw_async *a, const char *why) {
    if (a->closed) return;
    a->spec.lost(a->spec.arg, why);
    ev_timer_stop(a->loop, &a->reconnect);
    ev_timer_set(&a->reconnect, a->backoff_ms / 1000.0, 0.);
    ev_timer_start(a->loop, &a->reconnect);
    int max = a->spec.backoff_ms.max ? a->spec.backoff_ms.max : a->spec.backoff_ms.min;
    a->backoff_ms = a->backoff_ms * 2 > max ? max : a->backoff_ms * 2;
}

static void ready(gw_async *a) {
    a->backoff_ms = a->spec.backoff_ms.min;
    a->spec.ready(a->spec.arg, a->ac);
}

static void on_auth(redisAsyncContext *ac, void *r, void *privdata) {
    (void)privdata;
    gw_async *a = ac->data;
    redisReply *reply = r;
    if (!reply) return; /* the connection is going away */
    if (reply->type == REDIS_REPLY_ERROR) {
        pv_error("%s: redis %s refused AUTH: %s", a->what, a->cfg->redis.addr, reply->str);
        redisAsyncDisconnect(ac);
        return;
    }
    ready(a);
}

static void on_connect(const redisAsyncContext *ac, int status) {
    gw_async *a = ac->data;
    ev_timer_stop(a->loop, &a->connect_timeout);
    if (status != REDIS_OK) {
        a->ac = NULL; /* hiredis frees it after this callback */
        lost(a, ac->errstr);
        return;
    }
    const char *pw = a->cfg->redis.password, *user = a->cfg->redis.username;
    if (pw && *pw && user && *user)
        redisAsyncCommand(a->ac, on_auth, NULL, "AUTH %s %s", user, pw);
    else if (pw && *pw)
        redisAsyncCommand(a->ac, on_auth, NULL, "AUTH %s", pw);
    else
        ready(a);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
    (void)status;
    gw_async *a = ac->data;
    a->ac = NULL;
    ev_timer_stop(a->loop, &a->connect_timeout);
    lost(a, ac->errstr[0] ? ac->errstr : "connection closed");
}

static void on_connect_timeout(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    gw_async *a = t->data;
    if (!a->ac) return;
    /* not connected yet, so hiredis runs no disconnect callback: freed here */
    redisAsyncFree(a->ac);
    a->ac = NULL;
    lost(a, "connect timed out");
}

static void on_reconnect(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    gw_async_connect(t->data);
}

/* The master as the Sentinels know it now (nothing to do without Sentinels). */
static int find_master(gw_async *a, pv_status *st) {
    const pv_config *cfg = a->cfg;
    if (cfg->redis.n_sentinels == 0) return PV_OK;
    return pv_redis_sentinel_master(
        (const char *const *)cfg->redis.sentinels, cfg->redis.n_sentinels, cfg->redis.master_name,
        cfg->redis.connect_timeout_ms, a->host, sizeof a->host, &a->port, st);
}

void gw_async_connect(gw_async *a) {
    if (a->ac || a->closed) return;
    pv_status st;
    if (find_master(a, &st) != PV_OK) {
        lost(a, st.msg);
        return;
    }
    redisAsyncContext *ac =
        a->port ? redisAsyncConnect(a->host, a->port) : redisAsyncConnectUnix(a->host);
    if (!ac || ac->err) {
        lost(a, ac ? ac->errstr : "out of memory");
        if (ac) redisAsyncFree(ac);
        return;
    }
    ac->data = a;
    if (redisLibevAttach(a->loop, ac) != REDIS_OK) {
        redisAsyncFree(ac);
        lost(a, "cannot attach to the event loop");
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    a->ac = ac;
    double limit = a->cfg->redis.connect_timeout_ms / 1000.0;
    ev_timer_set(&a->connect_timeout, limit > 0 ? limit : 1.0, 0.);
    ev_timer_start(a->loop, &a->connect_timeout);
}

void *gw_async_arg(const redisAsyncContext *ac) {
    return ((const gw_async *)ac->data)->spec.arg;
}

void gw_async_close(gw_async *a) {
    if (!a) return;
    a->closed = true;
    ev_timer_stop(a->loop, &a->reconnect);
    ev_timer_stop(a->loop, &a->connect_timeout);
    if (a->ac) {
        redisAsyncContext *ac = a->ac;
        a->ac = NULL;
        redisAsyncFree(ac);
    }
}

gw_async *gw_async_new(const pv_config *cfg, struct ev_loop *loop, const gw_async_spec *spec) {
    gw_async *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->cfg = cfg;
    a->loop = loop;
    a->spec = *spec;
    snprintf(a->what, sizeof a->what, "%s", spec->what);
    pv_status st;
    if (pv_redis_parse_addr(cfg->redis.addr, a->host, sizeof a->host, &a->port, &st) != PV_OK) {
        pv_error("%s: redis.addr %s is neither host:port nor a socket path", a->what,
                 cfg->redis.addr);
        free(a);
        return NULL;
    }
    a->backoff_ms = spec->backoff_ms.min;
    ev_init(&a->reconnect, on_reconnect);
    a->reconnect.data = a;
    ev_init(&a->connect_timeout, on_connect_timeout);
    a->connect_timeout.data = a;
    return a;
}

void gw_async_free(gw_async *a) {
    free(a);
}

int gw_async_open_follower(const pv_config *cfg, const gw_async_spec *spec, struct ev_loop **loop,
                           gw_async **async, pv_redis **redis) {
    pv_redis_opts o;
    pv_redis_opts_from_config(cfg, &o);
    pv_status st;
    *async = NULL;
    *redis = NULL;
    *loop = ev_loop_new(EVFLAG_AUTO);
    if (*loop && (*async = gw_async_new(cfg, *loop, spec)) && pv_redis_new(&o, redis, &st) == PV_OK)
        return 0;
    gw_async_close_follower(*loop, *async, *redis);
    *loop = NULL;
    *async = NULL;
    *redis = NULL;
    return -1;
}

void gw_async_close_follower(struct ev_loop *loop, gw_async *async, pv_redis *redis) {
    pv_redis_free(redis);
    gw_async_free(async);
    if (loop) ev_loop_destroy(loop);
}
