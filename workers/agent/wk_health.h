/*
 * wk_health: the node agent's status reporter, as Eru's agent does it. Every
 * worker.status_interval_seconds the agent looks at each workload its engine holds, runs the
 * entrypoint's healthcheck on the running ones, and reports {running, healthy, networks} as the
 * workload's status (Eru's SetWorkloadsStatus) with a TTL of three intervals: a status that
 * changed is written, an unchanged one only has its TTL renewed (no write, so
 * WorkloadStatusStream sees changes, not beats). When the agent dies its statuses expire, and
 * watchers see that as Eru's clients do. Engines that learn of changes themselves (docker: the
 * daemon's event stream, wk_engine_set_watch) have the changed workloads reported at once, in
 * between the passes, the same way (their signature compared, a write when it changed).
 *
 * Healthcheck (Eru's, kept in the ERU_META label: {"healthcheck": {"tcp_ports": ["80"],
 * "http_port": "8080", "url": "/health", "code": 200}}): every TCP port must accept a
 * connection, and GET url on http_port must answer code (any status below 500 when code is 0),
 * each within a second, on the workload's first network address (the host's for process
 * workloads). A running workload without a healthcheck is healthy; one that does not run never
 * is.
 *
 * Threads: one of its own, with its own Redis connection; the engine is thread-safe.
 * Ownership: wk_health_start copies what it keeps; wk_health_stop joins and frees.
 */
#ifndef WK_HEALTH_H
#define WK_HEALTH_H

#include <stdbool.h>
#include <stddef.h>

#include "pv_config.h"
#include "pv_redis.h"
#include "pv_status.h"
#include "wk_engine.h"

typedef struct wk_health wk_health;

/* Starts the reporter for engine (which must outlive it). With fence (may be NULL; it must
 * outlive the reporter) every status is a fenced write of the instance's incarnation
 * (pv_workload_status reporter and epoch), nothing is reported while the node is past its fence
 * time, an instance the registry says was recreated elsewhere is removed, and the workloads a
 * fence stopped are settled once it is lifted (wk_fence.h). */
struct wk_fence;
int wk_health_start(const pv_config *cfg, wk_engine *engine, struct wk_fence *fence,
                    wk_health **out, pv_status *st);

/* Stops the thread (within a check's timeout) and frees. NULL is fine. */
void wk_health_stop(wk_health *h);

/* One pass over the engine's workloads on r, as the thread runs it; *written and *renewed (may
 * be NULL) count the statuses written and the TTLs renewed. For tests: a reporter made with
 * wk_health_new never runs a thread of its own. */
wk_health *wk_health_new(const pv_config *cfg, wk_engine *engine);
void wk_health_free(wk_health *h);
int wk_health_pass(wk_health *h, pv_redis *r, size_t *written, size_t *renewed, pv_status *st);

/* The healthcheck alone: whether a running workload with these labels and networks (engine
 * info JSON) passes; why (may be NULL) gets the first failure. */
bool wk_health_check(const char *labels_json, const char *networks_json, char *why, size_t cap);

#endif
