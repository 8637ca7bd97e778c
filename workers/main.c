/*
 * pivirt-worker: the process that does the work behind long-running calls.
 *
 * Two roles of one binary. Without worker.node it is an ops worker (cluster-level
 * orchestration); with worker.node=NAME it is the node agent of NAME, which keeps the node's
 * presence alive (Ready = the agent's heartbeat key lives) and, as later issues add them, runs
 * the engines and the storage of its host.
 *
 * This build does the presence part of both roles: it shows up in the live set of its kind
 * (ops/pivirt status and GetHealth read it) and leaves it on SIGTERM. Operation consumption
 * comes with the operation pipeline.
 */
#include <stdio.h>
#include <string.h>

#include "pv_config.h"
#include "pv_daemon.h"
#include "pv_log.h"
#include "pv_presence.h"
#include "pv_validate.h"
#include "pv_version.h"

static const char *k_usage =
    "usage: pivirt-worker [--config FILE] [--set key=value]... [--version]\n"
    "  ops worker by default; --set worker.node=NAME [--set worker.pod=POD] makes it the\n"
    "  node agent of NAME.\n";

int main(int argc, char **argv) {
    pv_config cfg;
    int rc = pv_daemon_init("pivirt-worker", k_usage, &cfg, &argc, argv);
    if (rc >= 0) {
        pv_config_free(&cfg);
        return rc;
    }
    pv_status st;
    bool agent = cfg.worker.node && *cfg.worker.node;
    if (agent && pv_validate_name("worker.node", cfg.worker.node, &st) != PV_OK) {
        fprintf(stderr, "pivirt-worker: %s\n", st.msg);
        pv_config_free(&cfg);
        return 2;
    }
    char instance[128];
    if (agent) snprintf(instance, sizeof instance, "%s", cfg.worker.node);
    else pv_presence_default_instance(instance, sizeof instance);

    pv_presence_opts po = {
        .kind = agent ? "agent" : "worker",
        .instance = instance,
        .addr = agent ? cfg.worker.pod : "",
        .interval_seconds = cfg.worker.heartbeat_seconds,
    };
    pv_presence *presence = NULL;
    if (pv_presence_start(&cfg, &po, &presence, &st) != PV_OK) {
        if (!presence) {
            pv_error("presence: %s", st.msg);
            pv_config_free(&cfg);
            return 1;
        }
        pv_warn("redis %s is not answering yet (%s); retrying", cfg.redis.addr, st.msg);
    }
    pv_info("started role=%s instance=%s version=%s redis=%s", agent ? "agent" : "ops", instance,
            PV_VERSION, cfg.redis.addr);
    int sig = pv_daemon_wait_signal();
    pv_info("signal=%d shutting down", sig);
    pv_presence_stop(presence);
    pv_config_free(&cfg);
    pv_info("stopped");
    return 0;
}
