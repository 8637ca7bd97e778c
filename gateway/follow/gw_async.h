/*
 * gw_async: the asynchronous Redis connection of a follower's libev loop (gw_waiter,
 * gw_node_watch), written once: the master's address (from the Sentinels when configured, asked
 * again on every connect, so a failover is followed), connect with a bounded wait
 * (redis.connect_timeout_ms: an unreachable host would otherwise hang the connect forever),
 * attach to the loop, AUTH (redis.username/password), and reconnect with backoff when it fails
 * or drops.
 *
 * The follower hears two things: ready (connected and authenticated: subscribe now) and lost
 * (a connect failed or the connection dropped: a reconnect is scheduled). Everything runs on the
 * loop's thread. Replies to the follower's own commands find it with gw_async_arg(ac).
 *
 * Ownership: cfg, loop and the callbacks' arg are the caller's and outlive the connection;
 * gw_async_new allocates, gw_async_free frees (after gw_async_close, on the loop's thread or
 * once the loop has stopped).
 */
#ifndef GW_ASYNC_H
#define GW_ASYNC_H

#include <ev.h>
#include <hiredis/async.h>

#include "pv_config.h"
#include "pv_redis.h"

typedef struct gw_async gw_async;

typedef struct gw_async_spec {
    const char *what; /* names the follower in log lines ("waiter") */
    /* the wait before a reconnect: min first, doubled after each failure up to max (left 0:
     * every wait is min) */
    struct {
        int min, max;
    } backoff_ms;
    void (*ready)(void *arg, redisAsyncContext *ac);
    void (*lost)(void *arg, const char *why); /* not after gw_async_close */
    void *arg;
} gw_async_spec;

/* NULL when redis.addr is neither host:port nor a socket path (logged) or out of memory. */
gw_async *gw_async_new(const pv_config *cfg, struct ev_loop *loop, const gw_async_spec *spec);

/* Starts connecting unless connected, connecting or closed (the loop's thread). */
void gw_async_connect(gw_async *a);

/* The follower's arg, from a reply callback of a command sent on the connection. */
void *gw_async_arg(const redisAsyncContext *ac);

/* Closes the connection for good: no reconnect, no lost callback (the loop's thread). */
void gw_async_close(gw_async *a);

void gw_async_free(gw_async *a);

/* What a follower runs on: a loop of its own, the connection on it (spec) and a synchronous
 * handle for the reads its callbacks make. 0, or -1 with nothing left open. */
int gw_async_open_follower(const pv_config *cfg, const gw_async_spec *spec, struct ev_loop **loop,
                           gw_async **async, pv_redis **redis);

/* Frees what gw_async_open_follower opened, once the loop has stopped. */
void gw_async_close_follower(struct ev_loop *loop, gw_async *async, pv_redis *redis);

#endif
