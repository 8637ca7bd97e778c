/*
 * gw_health: grpc.health.v1.Health (see gw_health.h).
 *
 * Check is a plain lookup. Watch holds its stream in a gw_watchers set; the shutdown hook sends
 * NOT_SERVING to every watcher and ends the streams, so a balancer that watches stops sending
 * work before the listener goes away.
 */
#include "gw_health.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "gw_watchers.h"
#include "pv_status.h"

typedef Grpc__Health__V1__HealthCheckRequest health_request;
typedef Grpc__Health__V1__HealthCheckResponse health_response;

struct gw_health {
    const char *const *services;
    size_t n_services;
    atomic_bool stopping;
    gw_watchers *watchers;
    gw_method m_check, m_watch;
};

gw_health *gw_health_new(const char *const *services, size_t n_services) {
    gw_health *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->services = services;
    h->n_services = n_services;
    h->watchers = gw_watchers_new();
    if (!h->watchers) {
        free(h);
        return NULL;
    }
    return h;
}

void gw_health_free(gw_health *h) {
    if (!h) return;
    gw_watchers_free(h->watchers);
    free(h);
}

static bool known_service(const gw_health *h, const char *name) {
    if (!*name) return true;
    for (size_t i = 0; i < h->n_services; i++)
        if (strcmp(h->services[i], name) == 0) return true;
    return false;
}

static int serving_status(gw_health *h) {
    return atomic_load(&h->stopping)
               ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
               : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
}

static void on_check(gw_call *call, const ProtobufCMessage *msg) {
    gw_health *h = gw_call_method_data(call);
    const health_request *req = (const health_request *)msg;
    if (!known_service(h, req->service)) {
        gw_call_finishf(call, PV_NOT_FOUND, "service: unknown service \"%.200s\"", req->service);
        return;
    }
    health_response resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = serving_status(h);
    gw_call_reply(call, &resp.base);
}

static void on_watch(gw_call *call, const ProtobufCMessage *msg) {
    gw_health *h = gw_call_method_data(call);
    const health_request *req = (const health_request *)msg;
    health_response resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    /* The protocol says Watch of an unknown service reports SERVICE_UNKNOWN, not an error. */
    resp.status = known_service(h, req->service)
                      ? serving_status(h)
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    gw_call_send(call, &resp.base);
    if (atomic_load(&h->stopping)) {
        gw_call_finish(call, PV_UNAVAILABLE, "server shutting down");
        return;
    }
    if (gw_watchers_add(h->watchers, call) != 0) gw_call_finish(call, PV_CANCELLED, NULL);
}

static void on_shutdown(void *arg) {
    gw_health *h = arg;
    atomic_store(&h->stopping, true);
    health_response resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
    gw_watchers_finish_all(h->watchers, &resp.base, PV_UNAVAILABLE, "server shutting down");
}

int gw_health_register(gw_health *h, gw_server *s, int no_auth) {
    h->m_check = (gw_method){
        .path = "/grpc.health.v1.Health/Check",
        .kind = GW_UNARY,
        .request = &grpc__health__v1__health_check_request__descriptor,
        .handler = on_check,
        .no_auth = no_auth != 0,
        .data = h,
    };
    h->m_watch = h->m_check;
    h->m_watch.path = "/grpc.health.v1.Health/Watch";
    h->m_watch.kind = GW_SERVER_STREAM;
    h->m_watch.handler = on_watch;
    if (gw_server_add_method(s, &h->m_check) != 0) return -1;
    if (gw_server_add_method(s, &h->m_watch) != 0) return -1;
    return gw_server_on_shutdown(s, on_shutdown, h);
}
