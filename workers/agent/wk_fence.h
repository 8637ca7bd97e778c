/*
 * wk_fence: a node agent stops its own HA workloads (label pivirt.io/ha=restart) once it has
 * gone ha.fence_seconds without renewing its liveness in Redis, before the cluster may
 * recreate them elsewhere (ha.node_timeout_seconds after the last renewal: the alive key's
 * TTL). It needs nothing from Redis to do so: the deadline is kept on CLOCK_MONOTONIC (which
 * runs on while a process is stopped, so a SIGSTOP past the deadline is seen as one at once),
 * counted from the moment the last successful renewal was SENT (the key's TTL started later, on
 * Redis's clock).
 *
 * Two parts watch the deadline:
 *   - the fence thread in the agent checks it every FENCE_TICK_MS and stops the HA workloads
 *     through the engine (SIGKILL, no hooks: a fence does not negotiate), journaling each stop
 *     in <data_dir>/node/<node>/fence.log ("<unix ms> fence <id> epoch <n> <how>");
 *     wk_fence_gate, which the agent calls before every renewal, does the same first, so an
 *     agent resumed after a freeze fences before it renews or reports anything;
 *   - the guard, a small process of its own (the worker binary re-executed with
 *     --fence-guard), which kills the HA workloads' process groups itself WK_FENCE_GUARD_LAG_MS
 *     after the deadline, for the cases where the agent cannot: its process stopped (SIGSTOP)
 *     or dead (the workloads outlive the agent by design). The agent tells it the deadline and
 *     the HA workloads' main processes (pid and start time, so a reused pid is never killed;
 *     docker engine: also the container's id and the daemon's endpoint, and the guard kills the
 *     container through the Engine API with libcurl, POST /containers/{id}/kill, which the
 *     daemon's restart policy does not undo as it would a SIGKILL of the container's process;
 *     the pid only when the daemon does not answer and is on this machine) through a shared
 *     page, <data_dir>/node/<node>/fence.page (mmap'd file), which a
 *     restarted agent maps again: it adopts the running guard and the deadline the previous
 *     agent left, so a quick restart fences nothing and a slow one is fenced in time.
 *
 * A restart-policy HA workload killed while the lease is not current (by the guard during a
 * freeze, or by itself) is never brought back by the engine's policy: the fence is the process
 * engine's restart gate (wk_engine_set_restart_gate), which holds every HA restart once the
 * lease is older than the fence time less a margin (the guard must learn a restarted pid before
 * the deadline) and while fenced; the held workload is stopped by the fence and settled with
 * the registry like a fenced one. A fence's own stop cancels the policy too (want_running).
 *
 * After a fence, the agent's first successful renewal lifts it; the status reporter then asks
 * the registry about each stopped workload (pv_workload_ha_check): still this node's
 * incarnation, it is started again; replaced (recreated elsewhere), it is removed; gone (no
 * record), it is left stopped. The same goes for the workloads whose restart policy the
 * process engine held when it opened (wk_engine_opts.hold_restarts: the agent or the whole
 * host was down, so the node may have been lost and the workload recreated elsewhere): they
 * are journaled "held" in the fence log and wait for this agent's first renewal (before it, a
 * failover may still claim them) and the registry's word, never restarted blindly.
 *
 * Threads: the fence thread is its own; every function may be called from any thread.
 * Ownership: wk_fence_start copies what it keeps; wk_fence_stop joins, unmaps and frees (the
 * guard is left running: it keeps guarding until a new agent adopts it or it has fenced).
 */
#ifndef WK_FENCE_H
#define WK_FENCE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "pv_config.h"
#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"
#include "wk_engine.h"

#define WK_FENCE_TICK_MS 100
#define WK_FENCE_GUARD_LAG_MS 500
/* The engine label that says which incarnation (pv_workload.h epoch) an instance is of; none =
 * the first. */
#define WK_EPOCH_LABEL "pivirt.io/epoch"

typedef struct wk_fence wk_fence;

/* Starts the fence of node (cfg->worker.node) over engine (which must outlive it), and its
 * guard unless a live one is adopted. */
int wk_fence_start(const pv_config *cfg, wk_engine *engine, wk_fence **out, pv_status *st);
void wk_fence_stop(wk_fence *f);

/* Before a renewal: fences now if the deadline has passed (the agent was stopped, or cut off),
 * then returns the monotonic time (ms) to pass to wk_fence_renewed once the renewal succeeded. */
int64_t wk_fence_gate(wk_fence *f);
void wk_fence_renewed(wk_fence *f, int64_t sent_mono_ms);

/* Whether the node's reports may go out now: renewed within the fence time and no fence
 * waiting to be lifted. */
bool wk_fence_current(wk_fence *f);

/* Tells the guard at once what runs now (the fence thread does it every few ticks): after a
 * workload started, so that a freeze right after it finds it guarded. */
void wk_fence_refresh(wk_fence *f);

/* Whether the guard has HA workloads to guard (the agent then leaves its alive key to expire on
 * a clean stop, so the cluster recreates nothing before the guard has fenced). */
bool wk_fence_guarding(wk_fence *f);

/* The workloads fenced since the fence was lifted, as a JSON object id -> epoch (new
 * reference; empty when none), and the end of one's handling. */
json_t *wk_fence_lifted(wk_fence *f);
void wk_fence_settled(wk_fence *f, const char *id);

/* Whether node's instance of workload id (engine's) was replaced while the node was away: the
 * registry's record is on another node or at a later incarnation than the instance's
 * (WK_EPOCH_LABEL). A node operation queued for the node before it was lost (a control, a
 * removal, a replace) must then not act on it: why (cap bytes) says so, naming both
 * incarnations. false when the engine has no such instance, the registry has no record, or it
 * cannot be asked (the operation goes on and meets the engine's or registry's own answer). */
bool wk_fence_replaced(wk_engine *engine, pv_redis *r, const pv_keys *k, const char *node,
                       const char *id, char *why, size_t cap);

/* wk_fence_replaced for an instance at epoch the caller has read from its engine. */
bool wk_fence_replaced_at(pv_redis *r, const pv_keys *k, const char *node, const char *id,
                          int64_t epoch, char *why, size_t cap);

/* wk_fence_replaced's words (cap bytes of why) for node's instance of id at epoch, the record
 * at incarnation now. */
void wk_fence_replaced_why(const char *node, const char *id, int64_t epoch, int64_t now, char *why,
                           size_t cap);

/* The same check for a node operation that acts on one workload's instance (exec, logs,
 * realloc, send and copy of files): FAILED_PRECONDITION with wk_fence_replaced's message when the
 * instance was replaced, else PV_OK. */
int wk_fence_refuse_replaced(wk_engine *engine, pv_redis *r, const pv_keys *k, const char *node,
                             const char *id, pv_status *st);

/* The epoch an engine instance's labels say it is of (WK_EPOCH_LABEL; 1 without). */
int64_t wk_fence_epoch_of(const char *labels_json);

/* Appends "<unix ms> <what> <id> epoch <epoch> <how>" to the node's fence log. */
void wk_fence_log(wk_fence *f, const char *what, const char *id, int64_t epoch, const char *how);

/* The guard's main: pivirt-worker --fence-guard PAGE LOG. Returns the exit status. */
int wk_fence_guard_main(const char *page_path, const char *log_path);

#endif
