/*
 * gw_health: grpc.health.v1.Health for the gateway's services.
 *
 * Check answers SERVING for "" (the server as a whole) and for every service served, NOT_FOUND
 * for any other name. Watch sends the current status, then holds the stream and sends
 * NOT_SERVING when the server begins to shut down, so load balancers drain it first.
 *
 * Ownership: the caller owns the service names array and its strings; they must outlive the
 * gw_health, which is freed after the server.
 */
#ifndef GW_HEALTH_H
#define GW_HEALTH_H

#include <stddef.h>

#include "gw_server.h"

typedef struct gw_health gw_health;

gw_health *gw_health_new(const char *const *services, size_t n_services);
void gw_health_free(gw_health *h);

/* Registers Check and Watch, and a shutdown hook that ends every Watch with NOT_SERVING.
 * no_auth exempts them from auth. */
int gw_health_register(gw_health *h, gw_server *s, int no_auth);

#endif
