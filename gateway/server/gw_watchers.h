/*
 * gw_watchers: a set of server-stream calls that stay open to receive pushes (health Watch,
 * WatchServiceStatus, and later WatchOperation). A thousand watching clients cost a thousand
 * small entries, not a thousand threads.
 *
 * Adding a call takes a reference on it; the reference is dropped when the client goes away
 * (the entry removes itself on close) or when gw_watchers_finish_all ends the stream. All
 * functions are thread-safe.
 */
#ifndef GW_WATCHERS_H
#define GW_WATCHERS_H

#include <stddef.h>

#include "gw_server.h"

typedef struct gw_watchers gw_watchers;

gw_watchers *gw_watchers_new(void);
/* Frees the set. Only after the server is shut down (every call closed). */
void gw_watchers_free(gw_watchers *w);

/* Holds call c until it closes. Returns 0, or -1 (out of memory, or the call already closed:
 * then nothing is held). */
int gw_watchers_add(gw_watchers *w, gw_call *c);

/* Sends m to every call in the set. */
void gw_watchers_broadcast(gw_watchers *w, const ProtobufCMessage *m);

/* Sends m (if not NULL) then the status to every call; each is released when it closes. */
void gw_watchers_finish_all(gw_watchers *w, const ProtobufCMessage *m, int code,
                            const char *details);

size_t gw_watchers_count(gw_watchers *w);

#endif
