/*
 * wk_agent: node registration and liveness of the node agent (see wk_agent.h).
 *
 * Resources of a new node come from the machine, with Eru's defaults: cpumem gets every online
 * CPU (100 pieces each) and 80% of MemTotal, storage gets the size of the file system holding
 * the data directory. An existing node keeps what an operator set (SetNode), so restarting an
 * agent never undoes a change.
 */
#include "wk_agent.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "pv_keys.h"
#include "pv_log.h"
#include "pv_registry.h"

struct wk_agent {
    pv_keys keys;
    char *node;
    char *pod;
    char *data_dir;
    int ttl_seconds;
    bool registered;
    bool failing;
};

wk_agent *wk_agent_new(const pv_config *cfg) {
    wk_agent *a = calloc(1, sizeof *a);
    pv_status st;
    if (!a || pv_keys_init(&a->keys, cfg->redis.prefix, &st) != PV_OK) {
        free(a);
        return NULL;
    }
    a->node = strdup(cfg->worker.node);
    a->pod = strdup(cfg->worker.pod);
    a->data_dir = strdup(cfg->data_dir);
    a->ttl_seconds = 3 * cfg->worker.heartbeat_seconds;
    if (!a->node || !a->pod || !a->data_dir) {
        wk_agent_free(a);
        return NULL;
    }
    return a;
}

void wk_agent_free(wk_agent *a) {
    if (!a) return;
    free(a->node);
    free(a->pod);
    free(a->data_dir);
    free(a);
}

static long long mem_total_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    long long kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

static long long fs_bytes(const char *path) {
    struct statvfs v;
    if (statvfs(path, &v) != 0 && statvfs(".", &v) != 0) return 0;
    return (long long)v.f_blocks * (long long)v.f_frsize;
}

static int register_node(wk_agent *a, pv_redis *r, pv_status *st) {
    pv_pod pod;
    memset(&pod, 0, sizeof pod);
    pv_pod_spec ps = {.name = a->pod, .desc = "created by the node agent of a member node"};
    int rc = pv_registry_add_pod(r, &a->keys, &ps, &pod, st);
    pv_pod_clear(&pod);
    if (rc != PV_OK && rc != PV_ALREADY_EXISTS) return rc;

    pv_node node;
    memset(&node, 0, sizeof node);
    rc = pv_registry_get_node(r, &a->keys, a->node, &node, st);
    if (rc == PV_OK) {
        if (strcmp(node.pod_name, a->pod) != 0)
            pv_warn("agent node=%s is registered in pod %s, not %s: keeping the registry's",
                    a->node, node.pod_name, a->pod);
        pv_node_clear(&node);
        return PV_OK;
    }
    if (rc != PV_NOT_FOUND) return rc;

    char resources[512];
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(resources, sizeof resources,
             "{\"cpumem\":{\"cpu\":%ld,\"memory\":%lld},\"storage\":{\"storage\":%lld}}",
             cpus > 0 ? cpus : 1, mem_total_bytes() / 10 * 8, fs_bytes(a->data_dir));
    pv_node_spec ns = {
        .name = a->node, .pod_name = a->pod, .endpoint = "process://", .resources = resources};
    rc = pv_registry_add_node(r, &a->keys, &ns, &node, st);
    if (rc == PV_OK)
        pv_info("agent registered node=%s id=%s pod=%s resources=%s", a->node, node.id, a->pod,
                resources);
    pv_node_clear(&node);
    return rc == PV_ALREADY_EXISTS ? PV_OK : rc; /* another agent of the same name raced us */
}

void wk_agent_beat(void *arg, pv_redis *r) {
    wk_agent *a = arg;
    pv_status st;
    int rc = PV_OK;
    if (!a->registered) {
        rc = register_node(a, r, &st);
        if (rc == PV_OK) a->registered = true;
    }
    if (rc == PV_OK) rc = pv_registry_set_alive(r, &a->keys, a->node, a->ttl_seconds, NULL, &st);
    if (rc != PV_OK && !a->failing) pv_warn("agent node=%s: %s", a->node, st.msg);
    a->failing = rc != PV_OK;
}

void wk_agent_leave(void *arg, pv_redis *r) {
    wk_agent *a = arg;
    pv_status st;
    if (a->registered && pv_registry_set_alive(r, &a->keys, a->node, -1, NULL, &st) != PV_OK)
        pv_warn("agent node=%s could not delete its alive key: %s", a->node, st.msg);
}
