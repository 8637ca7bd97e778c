/*
 * wk_docker_facts: what a docker node's agent reports of its daemon in the node's engine info
 * (wk_engine_facts; Node.info and GetNodeEngineInfo read it under "docker"): GET /info's
 * figures (versions, drivers, cores, memory, container and image counts) and "workloads", each
 * container of this node as the daemon really has it: {workload id: {"container", "state",
 * "cpu" (NanoCpus in cores, 0 = no quota), "cpuset" (CpusetCpus, "" = not bound), "memory"
 * (bytes, 0 = no limit)}}, as the last listing inspected them and the event stream has kept
 * them since (d->live: an "update" event inspects the container again; no call of its own).
 * GetNodeResource compares those limits with the recorded allocations (its diffs: a ReallocResource
 * the daemon did not apply, a `docker update` behind pivirt's back).
 */
#include <stdlib.h>
#include <string.h>

#include "wk_engine_docker.h"

/* The figures of GET /info the report keeps, under the report's names. */
static const struct {
    const char *from, *to;
} INFO_KEYS[] = {{"ServerVersion", "server_version"},
                 {"OperatingSystem", "os"},
                 {"KernelVersion", "kernel"},
                 {"Driver", "storage_driver"},
                 {"CgroupDriver", "cgroup_driver"},
                 {"CgroupVersion", "cgroup_version"},
                 {"NCPU", "cpus"},
                 {"MemTotal", "mem_total"},
                 {"Containers", "containers"},
                 {"ContainersRunning", "running"},
                 {"ContainersPaused", "paused"},
                 {"ContainersStopped", "stopped"},
                 {"Images", "images"},
                 {"Name", "hostname"}};

json_t *wk_docker_limits_of(json_t *in) {
    json_t *host = json_object_get(in, "HostConfig");
    const char *name = json_string_value(json_object_get(in, "Name"));
    return json_pack(
        "{s:s, s:s, s:f, s:s, s:I}", "container", name ? name + (name[0] == '/') : "", "state",
        json_string_value(json_object_get(json_object_get(in, "State"), "Status")) ?: "", "cpu",
        (double)json_integer_value(json_object_get(host, "NanoCpus")) / 1e9, "cpuset",
        json_string_value(json_object_get(host, "CpusetCpus")) ?: "", "memory",
        json_integer_value(json_object_get(host, "Memory")));
}

int wk_docker_facts(void *impl, char **out, pv_status *st) {
    wk_docker *d = impl;
    *out = NULL;
    json_t *info = NULL;
    if (wk_docker_json(d->api, "GET", "/info", NULL, &info, "info", st) != PV_OK) return st->code;
    json_t *facts = json_pack("{s:s, s:o}", "endpoint", wk_docker_api_endpoint(d->api), "workloads",
                              json_object());
    for (size_t i = 0; facts && i < sizeof INFO_KEYS / sizeof INFO_KEYS[0]; i++) {
        json_t *v = json_object_get(info, INFO_KEYS[i].from);
        if (v) json_object_set(facts, INFO_KEYS[i].to, v);
    }
    json_decref(info);
    int rc = facts ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    json_t *workloads = json_object_get(facts, "workloads");
    const char *id;
    json_t *c;
    pthread_mutex_lock(&d->mu);
    json_object_foreach(d->live, id, c) {
        json_object_set_new(workloads, id, wk_docker_limits_of(c));
    }
    pthread_mutex_unlock(&d->mu);
    if (rc == PV_OK && !(*out = json_dumps(facts, JSON_COMPACT | JSON_SORT_KEYS)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    json_decref(facts);
    return rc;
}
