/*
 * gw_node_watch: the gateway's one follower of node liveness, for NodeStatusStream.
 *
 * A thread runs a libev loop with an asynchronous hiredis connection (like gw_waiter) that
 * PSUBSCRIBEs the keyspace notifications of the nodes' alive keys (shared/pv_registry.h). It
 * keeps the set of alive nodes it knows of and pushes a message to every call of its gw_watchers
 * set when a node becomes alive (a "set" of a key it did not know) or dead ("del" or "expired"),
 * so a heartbeat that only refreshes a key is silent. After every (re)subscription it reads the
 * alive set from the registry and reports the difference, so changes made while it was
 * disconnected are not lost. A thousand streams cost a thousand entries, not threads.
 *
 * Ownership: the gw_app and the gw_watchers set are the caller's and outlive the watcher.
 */
#ifndef GW_NODE_WATCH_H
#define GW_NODE_WATCH_H

#include "gw_app.h"
#include "gw_watchers.h"

typedef struct gw_node_watch gw_node_watch;

/* NULL when the Redis address or prefix is unusable (logged) or out of memory. */
gw_node_watch *gw_node_watch_new(gw_app *app, gw_watchers *out);
/* Starts the thread (call after the signal mask of the process is set). 0 or -1. */
int gw_node_watch_start(gw_node_watch *w);
/* Stops and joins the thread; idempotent. */
void gw_node_watch_stop(gw_node_watch *w);
void gw_node_watch_free(gw_node_watch *w);

#endif
