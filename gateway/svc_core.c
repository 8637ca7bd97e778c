/*
 * svc_core: pb.CoreRPC handlers.
 *
 * Info reports the build (version, git revision, build time, compiler, OS/arch) and the
 * instance identifier: the SHA-256 of the store settings, as Eru does, so two gateways on the
 * same Redis report the same identifier and a client can tell it talks to one system.
 *
 * WatchServiceStatus streams the live set of gateway addresses. The set comes from the
 * gateways' presence keys in Redis, read on the presence thread after each heartbeat and pushed
 * to every open stream; a new stream gets the last known set at once. Errors carry Eru's code
 * for the call (1001).
 */
#include "svc_core.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "gw_watchers.h"
#include "pb/core.pb-c.h"
#include "pv_log.h"
#include "pv_presence.h"
#include "pv_status.h"
#include "pv_version.h"

#define ERU_WATCH_SERVICE_STATUS 1001

struct svc_core {
    gw_app *app;
    char os_arch[72];
    gw_watchers *watchers;
    pthread_mutex_t mu;
    char **addresses; /* last known live set, under mu */
    size_t n_addresses;
    gw_method m_info, m_watch;
};

static const char *go_arch(const char *machine) {
    /* Eru reports Go's GOOS/GOARCH; clients compare these names. */
    if (strcmp(machine, "x86_64") == 0) return "amd64";
    if (strcmp(machine, "aarch64") == 0) return "arm64";
    if (strcmp(machine, "i686") == 0 || strcmp(machine, "i386") == 0) return "386";
    return machine;
}

svc_core *svc_core_new(gw_app *app) {
    svc_core *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->app = app;
    s->watchers = gw_watchers_new();
    if (!s->watchers) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    struct utsname u;
    if (uname(&u) == 0) {
        char os[32];
        snprintf(os, sizeof os, "%.31s", u.sysname);
        for (char *p = os; *p; p++)
            if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
        snprintf(s->os_arch, sizeof s->os_arch, "%.31s/%.31s", os, go_arch(u.machine));
    } else {
        snprintf(s->os_arch, sizeof s->os_arch, "unknown");
    }
    return s;
}

static void free_addresses(char **a, size_t n) {
    for (size_t i = 0; i < n; i++) free(a[i]);
    free(a);
}

void svc_core_free(svc_core *s) {
    if (!s) return;
    gw_watchers_free(s->watchers);
    free_addresses(s->addresses, s->n_addresses);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void on_info(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    svc_core *s = gw_call_method_data(call);
    Pb__CoreInfo info = PB__CORE_INFO__INIT;
    info.version = PV_VERSION;
    info.revison = PV_GIT_REVISION;
    info.build_at = PV_BUILD_TIME;
    info.golang_version = "gcc " __VERSION__;
    info.os_arch = s->os_arch;
    info.identifier = s->app->identifier;
    gw_call_reply(call, &info.base);
}

/* Builds a ServiceStatus from the current set; the strings stay owned by s (caller holds mu). */
static void status_locked(svc_core *s, Pb__ServiceStatus *st) {
    pb__service_status__init(st);
    st->addresses = s->addresses;
    st->n_addresses = s->n_addresses;
    /* The next push comes within one heartbeat; twice that tolerates one late beat. */
    st->interval_in_second = 2 * s->app->cfg.gateway.heartbeat_seconds;
}

static void on_watch_service_status(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    svc_core *s = gw_call_method_data(call);
    Pb__ServiceStatus st;
    pthread_mutex_lock(&s->mu);
    status_locked(s, &st);
    gw_call_send(call, &st.base);
    pthread_mutex_unlock(&s->mu);
    if (gw_watchers_add(s->watchers, call) != 0)
        gw_call_finish(call, ERU_WATCH_SERVICE_STATUS, "WatchServiceStatus: client gone");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Extracts the "addr" of each presence document; unique and sorted so clients see a stable set. */
static size_t addresses_from(char **values, size_t n, char **out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_loads(values[i], 0, NULL);
        const char *addr = j ? json_string_value(json_object_get(j, "addr")) : NULL;
        if (addr && *addr) out[k++] = strdup(addr);
        json_decref(j);
    }
    qsort(out, k, sizeof *out, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++) {
        if (u > 0 && strcmp(out[u - 1], out[i]) == 0) free(out[i]);
        else out[u++] = out[i];
    }
    return u;
}

void svc_core_presence_tick(void *arg, pv_redis *r) {
    svc_core *s = arg;
    char **values = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_presence_list(r, &s->app->keys, "gateway", &values, &n, &st) != PV_OK) {
        pv_warn("WatchServiceStatus: cannot read the live gateways: %s", st.msg);
        return;
    }
    char **addrs = calloc(n ? n : 1, sizeof *addrs);
    if (!addrs) {
        pv_presence_values_free(values, n);
        return;
    }
    size_t k = addresses_from(values, n, addrs);
    pv_presence_values_free(values, n);

    Pb__ServiceStatus msg;
    pthread_mutex_lock(&s->mu);
    free_addresses(s->addresses, s->n_addresses);
    s->addresses = addrs;
    s->n_addresses = k;
    status_locked(s, &msg);
    gw_watchers_broadcast(s->watchers, &msg.base);
    pthread_mutex_unlock(&s->mu);
}

static void on_shutdown(void *arg) {
    svc_core *s = arg;
    gw_watchers_finish_all(s->watchers, NULL, PV_UNAVAILABLE, "gateway shutting down");
}

int svc_core_register(svc_core *s, gw_server *server) {
    s->m_info = (gw_method){
        .path = "/pb.CoreRPC/Info",
        .kind = GW_UNARY,
        .request = &pb__empty__descriptor,
        .handler = on_info,
        .data = s,
    };
    s->m_watch = (gw_method){
        .path = "/pb.CoreRPC/WatchServiceStatus",
        .kind = GW_SERVER_STREAM,
        .request = &pb__empty__descriptor,
        .handler = on_watch_service_status,
        .bad_request_code = ERU_WATCH_SERVICE_STATUS,
        .data = s,
    };
    if (gw_server_add_method(server, &s->m_info) != 0) return -1;
    if (gw_server_add_method(server, &s->m_watch) != 0) return -1;
    return gw_server_on_shutdown(server, on_shutdown, s);
}
