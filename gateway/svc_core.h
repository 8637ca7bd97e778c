/*
 * svc_core: pb.CoreRPC, the Eru core API (seed 001), as far as this build serves it.
 *
 * Served now: Info and WatchServiceStatus. Every other CoreRPC method answers UNIMPLEMENTED
 * through the server's unknown-method path until its issue lands.
 */
#ifndef SVC_CORE_H
#define SVC_CORE_H

#include "gw_app.h"
#include "gw_server.h"
#include "pv_redis.h"

typedef struct svc_core svc_core;

svc_core *svc_core_new(gw_app *app);
void svc_core_free(svc_core *s);

/* Registers the served methods and a shutdown hook that ends WatchServiceStatus streams. */
int svc_core_register(svc_core *s, gw_server *server);

/* Presence tick (runs on the presence thread after each heartbeat): reads the live gateway set
 * and pushes it to every WatchServiceStatus stream. */
void svc_core_presence_tick(void *arg, pv_redis *r);

#endif
