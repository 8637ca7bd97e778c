/*
 * pivirt-gateway: the gRPC front door of pivirt.
 *
 * Reads the configuration, builds the server (framework, health, reflection, services), starts
 * the presence heartbeat that makes this gateway visible to WatchServiceStatus clients and to
 * operators, then waits for SIGTERM or SIGINT and shuts down gracefully: presence first (peers
 * stop routing here), then the server (health watchers hear NOT_SERVING, in-flight calls finish
 * within the grace period, the rest are cancelled).
 *
 * Exit status: 0 after a clean shutdown, 1 when start-up fails, 2 for a bad configuration.
 */
#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_app.h"
#include "gw_health.h"
#include "gw_memory.h"
#include "gw_reflection.h"
#include "gw_server.h"
#include "gw_waiter.h"
#include "pv_config.h"
#include "pv_id.h"
#include "pv_log.h"
#include "pv_presence.h"
#include "pv_version.h"
#include "svc_core.h"
#include "svc_core_deploy.h"
#include "svc_core_exec.h"
#include "svc_core_files.h"
#include "svc_core_image.h"
#include "svc_core_net.h"
#include "svc_core_res.h"
#include "gw_metrics.h"
#include "svc_cluster.h"
#include "svc_storage.h"
#include "svc_core_wl.h"
#include "svc_operations.h"

extern const unsigned char pv_descriptor_set[];
extern const size_t pv_descriptor_set_len;

static void usage(FILE *f) {
    fprintf(f, "usage: pivirt-gateway [--config FILE] [--set key=value]... [--version] "
               "[--print-config]\n"
               "  Serves pb.CoreRPC, pivirt.cluster.v1, pivirt.storage.v1, "
               "pivirt.operations.v1,\n"
               "  grpc.health.v1 and server reflection on every gateway.listen address.\n"
               "  Configuration keys: see shared/pv_config.h; environment PIVIRT_<KEY>.\n");
}

static void *thread_redis_new(void *arg) {
    gw_app *app = arg;
    pv_redis_opts o;
    pv_redis_opts_from_config(&app->cfg, &o);
    pv_redis *r = NULL;
    pv_status st;
    if (pv_redis_new(&o, &r, &st) != PV_OK) pv_error("redis handle: %s", st.msg);
    return r;
}

static void thread_redis_free(void *r) {
    pv_redis_free(r);
}

static int is_declared(void *arg, const char *path) {
    return gw_reflection_has_method(arg, path);
}

/* Eru's instance identifier: the SHA-256 of the store settings, so every gateway of one system
 * reports the same identifier. */
static void compute_identifier(gw_app *app) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "store=redis\nredis.addr=%s\nredis.db=%d\nredis.prefix=%s\n",
                     app->cfg.redis.addr, app->cfg.redis.db, app->cfg.redis.prefix);
    pv_sha256_hex(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1, app->identifier);
}

/* The services that need only the app: each svc_<name> made by svc_<name>_new(app), registered
 * by svc_<name>_register and freed by svc_<name>_free, in this order. */
/* clang-format off */
#define APP_SERVICES(X)                                                                            \
    X(core) X(core_res) X(core_deploy) X(core_files) X(core_exec) X(core_image) X(core_net)        \
    X(core_wl) X(cluster) X(storage)
/* clang-format on */

typedef struct gateway {
    gw_app app;
    gw_reflection *reflection;
    gw_health *health;
#define FIELD(name) svc_##name *name;
    APP_SERVICES(FIELD)
#undef FIELD
    gw_metrics *metrics;
    gw_waiter *waiter;
    svc_operations *ops;
    gw_server *server;
    gw_memory *memory;
    pv_presence *presence;
    const char **services;
} gateway;

static void gateway_free(gateway *g) {
    gw_server_free(g->server);
    svc_operations_free(g->ops);
    gw_waiter_free(g->waiter); /* after the server: every waiting call is gone by then */
#define FREE(name) svc_##name##_free(g->name);
    APP_SERVICES(FREE)
#undef FREE
    gw_metrics_free(g->metrics); /* after the server: its calls report their end */
    gw_memory_stop(g->memory);   /* after the server too: its calls note their start */
    gw_health_free(g->health);
    gw_reflection_free(g->reflection);
    free(g->services);
    pv_config_free(&g->app.cfg);
}

/* The server's call observers: the metrics count every call, the trimmer wants to know that
 * calls come. */
static void observe_call_start(void *arg, const char *path) {
    gateway *g = arg;
    gw_memory_note_call(g->memory);
    gw_metrics_on_call_start(g->metrics, path);
}

static void observe_call_end(void *arg, const char *path, int code, double seconds) {
    gw_metrics_on_call_end(((gateway *)arg)->metrics, path, code, seconds);
}

/* Registers the app services in order: 0, or -1 when one fails (the rest are not tried). */
static int register_app_services(gateway *g) {
#define REGISTER(name)                                                                             \
    if (svc_##name##_register(g->name, g->server) != 0) return -1;
    APP_SERVICES(REGISTER)
#undef REGISTER
    return 0;
}

static int build_server(gateway *g) {
    char err[512];
    gw_app *app = &g->app;
    g->reflection = gw_reflection_new(pv_descriptor_set, pv_descriptor_set_len, err, sizeof err);
    if (!g->reflection) {
        pv_error("reflection: %s", err);
        return -1;
    }
    size_t n = gw_reflection_service_count(g->reflection);
    g->services = calloc(n ? n : 1, sizeof *g->services);
    if (!g->services) return -1;
    for (size_t i = 0; i < n; i++)
        g->services[i] = gw_reflection_service(g->reflection, i);
    g->health = gw_health_new(g->services, n);
    bool made = g->health != NULL;
#define NEW(name) made = (g->name = svc_##name##_new(app)) != NULL && made;
    APP_SERVICES(NEW)
#undef NEW
    g->metrics = gw_metrics_new(app);
    g->waiter = gw_waiter_new(app);
    g->ops = g->waiter ? svc_operations_new(app, g->waiter) : NULL;
    if (!made || !g->metrics || !g->ops) return -1;

    gw_server_opts o = {
        .listen = (const char *const *)app->cfg.gateway.listen,
        .n_listen = app->cfg.gateway.n_listen,
        .threads = app->cfg.gateway.threads,
        .tls_cert_path = app->cfg.gateway.tls_cert,
        .tls_key_path = app->cfg.gateway.tls_key,
        .tls_client_ca_path = app->cfg.gateway.tls_client_ca,
        .max_concurrent_streams = app->cfg.gateway.max_concurrent_streams,
        .max_streams_per_client = app->cfg.gateway.max_streams_per_client,
        .auth_username = app->cfg.auth.username,
        .auth_password = app->cfg.auth.password,
        .max_request_bytes = app->cfg.gateway.max_request_bytes,
        .max_upload_bytes = app->cfg.gateway.max_upload_bytes,
        .shutdown_grace_ms = app->cfg.gateway.shutdown_grace_ms,
        .app = app,
        .is_declared = is_declared,
        .is_declared_arg = g->reflection,
        .thread_init = thread_redis_new,
        .thread_free = thread_redis_free,
        .state_missing = "no Redis connection on this gateway thread",
        .on_call_start = observe_call_start,
        .on_call_end = observe_call_end,
        .observer_arg = g,
    };
    g->server = gw_server_new(&o, err, sizeof err);
    if (!g->server) {
        pv_error("server: %s", err);
        return -1;
    }
    if (gw_health_register(g->health, g->server, app->cfg.auth.exempt_health) != 0 ||
        gw_reflection_register(g->reflection, g->server, app->cfg.auth.exempt_reflection) != 0 ||
        register_app_services(g) != 0 || svc_operations_register(g->ops, g->server) != 0 ||
        gw_waiter_register(g->waiter, g->server) != 0 || gw_waiter_start(g->waiter) != 0) {
        pv_error("registering the services failed");
        return -1;
    }
    return 0;
}

/* The lines an operator looks for in the log: where it listens and how it runs. */
static void log_started(const gateway *g) {
    for (size_t i = 0; i < g->app.cfg.gateway.n_listen; i++)
        pv_info("listening addr=%s port=%d", g->app.cfg.gateway.listen[i],
                gw_server_bound_port(g->server, i));
    pv_info("started version=%s revision=%s instance=%s redis=%s threads=%d tls=%s auth=%s",
            PV_VERSION, PV_GIT_REVISION, g->app.instance, g->app.cfg.redis.addr,
            g->app.cfg.gateway.threads,
            !*g->app.cfg.gateway.tls_cert       ? "off"
            : *g->app.cfg.gateway.tls_client_ca ? "mutual"
                                                : "on",
            *g->app.cfg.auth.username ? "on" : "off");
}

/* Reads the configuration and the command line: -1 when the gateway is to run, else the exit
 * status of what was asked instead (--version, --print-config, --help, a word it does not know,
 * a bad configuration). The caller frees the configuration either way. */
static int configure(gateway *g, int *argc, char **argv) {
    pv_status st;
    if (pv_config_load(&g->app.cfg, argc, argv, &st) != PV_OK) {
        fprintf(stderr, "pivirt-gateway: %s\n", st.msg);
        return 2;
    }
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("pivirt-gateway %s (%s)\n", PV_VERSION, PV_GIT_REVISION);
            return 0;
        }
        if (strcmp(argv[i], "--print-config") == 0) {
            /* The effective configuration, passwords shown as "***". */
            char *json = pv_config_dump_json(&g->app.cfg);
            if (json) printf("%s\n", json);
            free(json);
            return json ? 0 : 1;
        }
        bool help = strcmp(argv[i], "--help") == 0;
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    pv_log_set_level(g->app.cfg.log_level);
    if (pv_keys_init(&g->app.keys, g->app.cfg.redis.prefix, &st) != PV_OK) {
        fprintf(stderr, "pivirt-gateway: %s\n", st.msg);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv) {
    gateway g;
    memset(&g, 0, sizeof g);
    pv_status st;
    pv_log_init("gateway", PV_LOG_INFO);
    int done = configure(&g, &argc, argv);
    if (done >= 0) {
        pv_config_free(&g.app.cfg);
        return done;
    }
    pv_presence_default_instance(g.app.instance, sizeof g.app.instance);
    compute_identifier(&g.app);
    g.app.advertise =
        *g.app.cfg.gateway.advertise ? g.app.cfg.gateway.advertise : g.app.cfg.gateway.listen[0];

    /* before any thread exists: an arena cap holds only for threads made after it */
    gw_memory_tune(g.app.cfg.gateway.malloc_arenas);

    /* Signals are taken by sigwait in this thread only; every other thread blocks them. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    grpc_init();
    int rc = 1;
    if (gw_memory_start(g.app.cfg.gateway.memory_trim_idle_ms, &g.memory, &st) != PV_OK) {
        pv_error("%s", st.msg);
        goto out;
    }
    if (build_server(&g) != 0 || gw_server_start(g.server) != 0) goto out;
    if (gw_metrics_start(g.metrics, g.app.cfg.gateway.metrics_listen, &st) != PV_OK) {
        pv_error("%s", st.msg);
        goto out;
    }

    pv_presence_opts po = {
        .kind = "gateway",
        .instance = g.app.instance,
        .addr = g.app.advertise,
        .interval_seconds = g.app.cfg.gateway.heartbeat_seconds,
        .tick = svc_core_presence_tick,
        .tick_arg = g.core,
    };
    if (pv_presence_start(&g.app.cfg, &po, &g.presence, &st) != PV_OK) {
        if (!g.presence) {
            pv_error("presence: %s", st.msg);
            gw_server_shutdown(g.server);
            goto out;
        }
        pv_warn("redis %s is not answering yet (%s); serving anyway, calls that need it answer "
                "UNAVAILABLE",
                g.app.cfg.redis.addr, st.msg);
    }
    log_started(&g);

    int sig = 0;
    sigwait(&sigs, &sig);
    pv_info("signal=%d shutting down (grace %d ms)", sig, g.app.cfg.gateway.shutdown_grace_ms);
    pv_presence_stop(g.presence);
    g.presence = NULL;
    gw_server_shutdown(g.server);
    rc = 0;
out:
    gateway_free(&g);
    grpc_shutdown_blocking();
    if (rc == 0) pv_info("stopped");
    return rc;
}
