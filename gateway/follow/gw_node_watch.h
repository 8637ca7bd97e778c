/*
 * gw_node_watch: the gateway's followers of Redis keys through keyspace notifications. One
 * implementation serves node liveness (NodeStatusStream) and, through gw_node_watch_new_keys,
 * any other family of keys (the workload statuses behind WorkloadStatusStream).
 *
 * A follower is a thread running a libev loop with an asynchronous hiredis connection (like
 * gw_waiter) that PSUBSCRIBEs one pattern, and a synchronous pv_redis of that thread for reads.
 * It makes sure Redis sends the notifications (pv_registry_ensure_notify) and, after every
 * (re)subscription, calls its resync callback to read the current state, so changes made while
 * it was disconnected are not lost (subscribed first, then read: nothing falls in between).
 * Every notification of a key under its prefix then goes to the event callback. Both callbacks
 * run on the follower's thread only, one at a time, so the state they keep needs no lock.
 *
 * Liveness (gw_node_watch_new) keeps the set of alive nodes it knows of and pushes a message to
 * every call of its gw_watchers set when a node becomes alive (a "set" of a key it did not know)
 * or dead ("del" or "expired"), so a heartbeat that only refreshes a key is silent; a resync
 * reports the difference between that set and the registry's. A thousand streams cost a
 * thousand entries, not threads.
 *
 * Ownership: the gw_app, the gw_watchers set and a spec's arg are the caller's and outlive the
 * follower; the spec's strings are copied.
 */
#ifndef GW_NODE_WATCH_H
#define GW_NODE_WATCH_H

#include "gw_app.h"
#include "gw_watchers.h"
#include "pv_redis.h"

typedef struct gw_node_watch gw_node_watch;

/* NULL when the Redis address or prefix is unusable (logged) or out of memory. */
gw_node_watch *gw_node_watch_new(gw_app *app, gw_watchers *out);

/* A follower of the keys under prefix (the keys the PSUBSCRIBE pattern matches). */
typedef struct gw_node_watch_keys {
    const char *what;    /* names the follower in log lines ("WorkloadStatusStream") */
    const char *pattern; /* "__keyspace@<db>__:<escaped prefix>*" */
    const char *prefix;  /* the key prefix; events carry the rest of the key name */
    /* After each (re)subscription; r is the follower's own connection. */
    void (*resync)(void *arg, pv_redis *r);
    /* One notification: rest = the key name after prefix, event = "set", "del", "expired", ... */
    void (*event)(void *arg, pv_redis *r, const char *rest, const char *event);
    void *arg;
} gw_node_watch_keys;

/* NULL when the Redis address is unusable, a string too long (logged) or out of memory. */
gw_node_watch *gw_node_watch_new_keys(gw_app *app, const gw_node_watch_keys *spec);

/* Starts the thread (call after the signal mask of the process is set). 0 or -1. */
int gw_node_watch_start(gw_node_watch *w);

/* Waits at most timeout_ms until the first resync after the start has run. 0, or -1 when it has
 * not (Redis unreachable, or not started). */
int gw_node_watch_wait_synced(gw_node_watch *w, int timeout_ms);

/* Stops and joins the thread; idempotent. */
void gw_node_watch_stop(gw_node_watch *w);
void gw_node_watch_free(gw_node_watch *w);

#endif
