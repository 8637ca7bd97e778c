/*
 * gw_metrics: the gateway's Prometheus metrics on gateway.metrics_listen (pv_metrics):
 *   grpc_server_started_total{grpc_service,grpc_method}
 *   grpc_server_handled_total{grpc_service,grpc_method,grpc_code}
 *   grpc_server_handling_seconds{grpc_service,grpc_method} (histogram)
 * counted by the server's call observers, and, read from Redis at each scrape (the whole
 * control plane's view, the same from every gateway):
 *   pivirt_operations{kind,status}            kept operation records (newest 1000 per status)
 *   pivirt_queue_pending{queue}               entries no worker has acknowledged
 *   pivirt_queue_oldest_pending_seconds       age of the oldest PENDING operation
 *   pivirt_node_condition{node,condition}     1 when the node's agent reports it
 *   pivirt_pool_capacity_bytes{pool}, pivirt_pool_used_bytes{pool}
 *
 * Ownership: gw_metrics_new borrows app; gw_metrics_free stops the HTTP server first.
 */
#ifndef GW_METRICS_H
#define GW_METRICS_H

#include "gw_app.h"
#include "pv_status.h"

typedef struct gw_metrics gw_metrics;

gw_metrics *gw_metrics_new(gw_app *app);
void gw_metrics_free(gw_metrics *g);

/* Serves /metrics on listen; "" serves nothing. */
int gw_metrics_start(gw_metrics *g, const char *listen, pv_status *st);

/* gw_server_opts' observers (arg: the gw_metrics). */
void gw_metrics_on_call_start(void *arg, const char *path);
void gw_metrics_on_call_end(void *arg, const char *path, int code, double seconds);

#endif
