/*
 * pivirt-scheduler: computes capacity and deploy plans and commits resource reservations.
 *
 * The daemon keeps its presence (the live set read by gateways before they send a plan request,
 * by health checks and by ops/pivirt status) and serves plan requests from Redis
 * (sched_server.h) until SIGTERM. `pivirt-scheduler plan` runs one plan from JSON on stdin
 * instead (sched_plan_cli.h).
 */
#include <stdio.h>
#include <string.h>

#include "pv_config.h"
#include "pv_daemon.h"
#include "pv_log.h"
#include "pv_mem.h"
#include "pv_presence.h"
#include "pv_version.h"
#include "sched_plan_cli.h"
#include "sched_server.h"

static const char *k_usage = "usage: pivirt-scheduler [--config FILE] [--set key=value]... "
                             "[--version] [--print-config]\n"
                             "       pivirt-scheduler plan < request.json\n";

int main(int argc, char **argv) {
    /* The one-shot plan command needs no config, no Redis and no presence. */
    if (argc >= 2 && strcmp(argv[1], "plan") == 0) return sched_plan_cli_main(argc - 1, argv + 1);
    pv_config cfg;
    int rc = pv_daemon_init("pivirt-scheduler", k_usage, &cfg, &argc, argv);
    if (rc >= 0) {
        pv_config_free(&cfg);
        return rc;
    }
    /* before any thread: a plan over a large pod frees and takes again the same big blocks */
    pv_mem_keep_freed();
    char instance[128];
    pv_presence_default_instance(instance, sizeof instance);
    pv_presence_opts po = {
        .kind = "scheduler",
        .instance = instance,
        .addr = "",
        .interval_seconds = cfg.scheduler.heartbeat_seconds,
    };
    pv_presence *presence = NULL;
    pv_status st;
    if (pv_presence_start(&cfg, &po, &presence, &st) != PV_OK) {
        if (!presence) {
            pv_error("presence: %s", st.msg);
            pv_config_free(&cfg);
            return 1;
        }
        pv_warn("redis %s is not answering yet (%s); retrying", cfg.redis.addr, st.msg);
    }
    sched_server *server = NULL;
    if (sched_server_start(&cfg, instance, &server, &st) != PV_OK) {
        pv_error("scheduler: %s", st.msg);
        pv_presence_stop(presence);
        pv_config_free(&cfg);
        return 1;
    }
    pv_info("started instance=%s version=%s redis=%s", instance, PV_VERSION, cfg.redis.addr);
    int sig = pv_daemon_wait_signal();
    pv_info("signal=%d shutting down", sig);
    /* Presence goes first, so gateways stop sending here while the last requests finish. */
    pv_presence_stop(presence);
    sched_server_stop(server);
    pv_config_free(&cfg);
    pv_info("stopped");
    return 0;
}
