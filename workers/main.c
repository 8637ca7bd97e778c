/*
 * pivirt-worker: the process that does the work behind long-running calls.
 *
 * Two roles of one binary. Without worker.node it is an ops worker and consumes the queue "ops"
 * (cluster-level orchestration); with worker.node=NAME it is the node agent of NAME: it keeps the
 * node's presence alive (Ready = the agent's heartbeat key lives) and consumes the queue
 * "node:NAME" of the operations that must run on that host.
 *
 * The consumer name is the process ("<host>-<pid>", or "<node>-<pid>" for an agent), so a
 * restarted process is a new consumer and the entries its predecessor held are reclaimed after a
 * lease like those of any dead worker. SIGTERM (or SIGINT) is a graceful stop: no new work, the
 * running operations get worker.shutdown_ms to finish and are otherwise handed back, the
 * presence leaves, exit status 0.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pv_config.h"
#include "pv_daemon.h"
#include "pv_log.h"
#include "pv_presence.h"
#include "wk_agent.h"
#include "wk_health.h"
#include "pv_validate.h"
#include "pv_version.h"
#include "pv_metrics.h"
#include "wk_consumer.h"
#include "wk_deploy.h"
#include "wk_fence.h"
#include "wk_ha.h"

static const char *k_usage =
    "usage: pivirt-worker [--config FILE] [--set key=value]... [--version] [--print-config]\n"
    "  ops worker by default (queue \"ops\"); --set worker.node=NAME [--set worker.pod=POD]\n"
    "  makes it the node agent of NAME (queue \"node:NAME\").\n";

/* The process's presence instance, its consumer name and its queue: an agent's are its node's
 * (node:NAME), an ops worker's its host's (ops). Buffers of 128, 160 and 160 bytes. */
static void role_names(const pv_config *cfg, bool agent, char *instance, char *consumer,
                       char *queue) {
    if (agent) {
        snprintf(instance, 128, "%s", cfg->worker.node);
        snprintf(consumer, 160, "%s-%d", cfg->worker.node, (int)getpid());
        snprintf(queue, 160, "node:%s", cfg->worker.node);
    } else {
        pv_presence_default_instance(instance, 128);
        snprintf(consumer, 160, "%s", instance);
        snprintf(queue, 160, "ops");
    }
}

/* /metrics on worker.metrics_listen when set; NULL when not served (said in the log). */
static pv_metrics_server *serve_metrics(const pv_config *cfg, pv_metrics *metrics) {
    pv_metrics_server *srv = NULL;
    pv_status st;
    if (!metrics || !cfg->worker.metrics_listen || !*cfg->worker.metrics_listen) return NULL;
    if (pv_metrics_serve(metrics, cfg->worker.metrics_listen, NULL, NULL, &srv, &st) != PV_OK)
        pv_error("%s; no metrics are served", st.msg);
    else
        pv_info("metrics on http://%s/metrics", cfg->worker.metrics_listen);
    return srv;
}

int main(int argc, char **argv) {
    /* the fence guard of a node agent (wk_fence.h): a process of its own, no configuration */
    if (argc == 4 && strcmp(argv[1], "--fence-guard") == 0)
        return wk_fence_guard_main(argv[2], argv[3]);
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
    char instance[128], consumer[160], queue[160];
    role_names(&cfg, agent, instance, consumer, queue);

    /* The agent registers its node and keeps its alive key on the presence's beat. */
    wk_agent *node_agent = agent ? wk_agent_new(&cfg) : NULL;
    if (agent && !node_agent) {
        pv_error("out of memory");
        pv_config_free(&cfg);
        return 1;
    }
    if (node_agent && wk_agent_start_fence(node_agent, &cfg, &st) != PV_OK)
        pv_error("fence: %s; this node's HA workloads are NOT fenced", st.msg);
    pv_presence_opts po = {
        .kind = agent ? "agent" : "worker",
        .instance = instance,
        .addr = agent ? cfg.worker.pod : "",
        .interval_seconds = cfg.worker.heartbeat_seconds,
        .tick = agent ? wk_agent_beat : NULL,
        .leave = agent ? wk_agent_leave : NULL,
        .tick_arg = node_agent,
    };
    pv_presence *presence = NULL;
    if (pv_presence_start(&cfg, &po, &presence, &st) != PV_OK) {
        if (!presence) {
            pv_error("presence: %s", st.msg);
            wk_agent_free(node_agent);
            pv_config_free(&cfg);
            return 1;
        }
        pv_warn("redis %s is not answering yet (%s); retrying", cfg.redis.addr, st.msg);
    }
    pv_metrics *metrics = pv_metrics_new();
    pv_metrics_server *metrics_srv = serve_metrics(&cfg, metrics);
    wk_consumer *consumer_handle = NULL;
    wk_consumer_opts co = {.cfg = &cfg,
                           .queue = queue,
                           .consumer = consumer,
                           .context = node_agent,
                           .metrics = metrics};
    if (!agent) { /* the ops queue: a fresh deploy is planned before any lease */
        co.prelease_kind = PV_KIND_DEPLOY;
        co.prelease = wk_deploy_prelease;
    }
    if (wk_consumer_start(&co, &consumer_handle, &st) != PV_OK) {
        pv_error("consumer: %s", st.msg);
        pv_metrics_server_stop(metrics_srv);
        pv_metrics_free(metrics);
        pv_presence_stop(presence);
        wk_agent_free(node_agent);
        pv_config_free(&cfg);
        return 1;
    }
    /* The agent reports its workloads' statuses (and runs their healthchecks) on its own. */
    wk_health *health = NULL;
    if (node_agent && wk_agent_engine(node_agent) &&
        wk_health_start(&cfg, wk_agent_engine(node_agent), wk_agent_fence(node_agent), &health,
                        &st) != PV_OK)
        pv_error("status reporter: %s; workloads' statuses are not reported", st.msg);
    /* The ops workers watch the nodes' liveness and recover HA workloads (wk_ha.h). */
    wk_ha_watch *watch = NULL;
    if (!agent && wk_ha_watch_start(&cfg, instance, &watch, &st) != PV_OK)
        pv_error("HA watch: %s; lost nodes are not noticed by this worker", st.msg);
    pv_info("started role=%s instance=%s consumer=%s queue=%s version=%s redis=%s",
            agent ? "agent" : "ops", instance, consumer, queue, PV_VERSION, cfg.redis.addr);
    int sig = pv_daemon_wait_signal();
    pv_info("signal=%d shutting down", sig);
    wk_ha_watch_stop(watch);
    wk_health_stop(health);
    bool clean = wk_consumer_stop(consumer_handle);
    pv_metrics_server_stop(metrics_srv);
    pv_presence_stop(presence);
    wk_agent_free(node_agent);
    pv_info("stopped%s", clean ? "" : " (a handler did not stop in time and was abandoned)");
    /* Abandoned handler threads still use cfg: exit without freeing it under them. */
    if (!clean) _exit(0);
    pv_metrics_free(metrics);
    pv_config_free(&cfg);
    return 0;
}
