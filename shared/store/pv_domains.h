/*
 * pv_domains: a virt node's real domains as its node agent reports them, for the readers that
 * compare them with the records (GetNodeResource's diffs, the audit's WL_NOT_RUNNING). The agent
 * puts its engine's facts (wk_engine_facts) in the node's engine info under the engine's type
 * (pv_registry_set_engine_info); a virt engine's hold "workloads": {workload id: {"domain",
 * "state" ("created", "running", "paused", "stopped"), "vcpus", "memory" (bytes), "exit_code",
 * "stopped_by_api"}}, the domains of that agent as libvirt had them at the last report.
 *
 * The readers' comparisons live here too (pv_domains_diffs, pv_domains_fix_containers): what an
 * engine reported against the allocations is domain logic, not a handler's.
 *
 * Ownership: *workloads is a new reference (json_decref), NULL when there is nothing to read.
 */
#ifndef PV_DOMAINS_H
#define PV_DOMAINS_H

#include <jansson.h>

#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"

/* The "workloads" an engine of type engine ("virt", "docker") reported for node, as
 * pv_domains_get (a docker engine's: {id: {"container", "state", "cpu", "cpuset", "memory"}},
 * wk_docker_facts.c). */
int pv_engine_workloads_get(pv_redis *r, const pv_keys *k, const char *node, const char *engine,
                            json_t **workloads, pv_status *st);

/* The reported domains of node (*workloads NULL, PV_OK, when its agent reports none: not a
 * virt node, or no report in the last interval). Redis failures as pv_redis. */
int pv_domains_get(pv_redis *r, const pv_keys *k, const char *node, json_t **workloads,
                   pv_status *st);

/* What node's engines reported against its workloads' allocations, one text per workload that
 * differs, appended to *diffs (grown with realloc; the strings malloc'd, the caller's to free
 * with the array): a running domain whose vcpus or memory are not its allocation's (the virt
 * engine's mapping), a container whose cpu, cpuset or memory are not (the docker engine's). */
int pv_domains_diffs(pv_redis *r, const pv_keys *k, const char *node, char ***diffs, size_t *n,
                     pv_status *st);

/* GetNodeResource's fix on a docker node, as Eru's: each workload whose container's limits are
 * not its allocation's gets an allocation of what the container really has, through
 * pv_resv_realloc_workload (checked to fit, written with the node's usage in one step). One that
 * cannot be fixed is logged and keeps its diff; only Redis failures are errors. */
int pv_domains_fix_containers(pv_redis *r, const pv_keys *k, const char *node, pv_status *st);

#endif
