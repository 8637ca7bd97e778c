/*
 * wk_agent: what makes pivirt-worker --set worker.node=NAME the agent of node NAME.
 *
 * On every presence beat the agent first reports its engine info (type, CPUs, MemTotal, storage,
 * hostname, version, kernel: pv_registry_set_engine_info, with the alive key's TTL), whether or
 * not the node is registered. Then, when worker.pod is set (the default, "local"), it registers
 * its node there if the registry has no node of that name (creating the pod when missing), with
 * the resources the plugins' defaults give for that engine info; with worker.pod empty it
 * registers nothing and waits for an operator's AddNode, which takes the resources from the
 * report. Then it keeps the node alive: every beat refreshes the node's alive key (Eru's
 * SetNodeStatus with a TTL of ha.node_timeout_seconds), so Ready = the agent's heartbeat key lives;
 * until the node exists that write fails and is logged once. A clean stop deletes both keys at
 * once. Every step is retried on the next beat until Redis answers.
 *
 * Ownership: wk_agent_new copies what it keeps; wk_agent_free releases it.
 */
#ifndef WK_AGENT_H
#define WK_AGENT_H

#include "pv_config.h"
#include "pv_redis.h"
#include "wk_engine.h"

typedef struct wk_agent wk_agent;

/* Also opens the engine of worker.endpoint (state under <data_dir>/engine/<node>, images in
 * worker.image_dir); an engine that cannot be opened is logged and leaves the agent without one
 * (its deploys then fail saying so). */
wk_agent *wk_agent_new(const pv_config *cfg);
void wk_agent_free(wk_agent *a);

/* Starts the agent's self-fencing (wk_fence.h), with its guard process (the running program
 * re-executed with --fence-guard: call it from pivirt-worker only). */
int wk_agent_start_fence(wk_agent *a, const pv_config *cfg, pv_status *st);
struct wk_fence;
struct wk_fence *wk_agent_fence(wk_agent *a); /* NULL when not started */

/* The node's engine (NULL when it could not be opened) and the node's name. */
wk_engine *wk_agent_engine(wk_agent *a);
const char *wk_agent_node(const wk_agent *a);

/* A virt node's libvirt handle for networks and raw operations (NULL on other engines). */
struct wk_virt;
struct wk_virt *wk_agent_virt(wk_agent *a);

/* The node's image store (worker.image_dir) and the registry CacheImage copies from
 * (worker.registry_dir). */
const char *wk_agent_image_dir(const wk_agent *a);
/* The agent's data directory (BuildImage works under <data_dir>/build). */
const char *wk_agent_data_dir(const wk_agent *a);
/* git.private_key: the SSH key SCM builds clone with ("" = git's own configuration). */
const char *wk_agent_git_key(const wk_agent *a);
const char *wk_agent_registry_dir(const wk_agent *a);

/* The node's version as the agent reports it (annotation pivirt.io/version): the first word of
 * its version file (<data_dir>/node/<node>/version, written by the upgrade hook), or
 * "v<the agent's own version>" while there is none. */
void wk_agent_version(const wk_agent *a, char *out, size_t cap);
const char *wk_agent_version_file(const wk_agent *a);

/* What the agent runs to upgrade its node (upgrade.hook, default ops/hooks/node-upgrade). */
const char *wk_agent_upgrade_hook(const wk_agent *a);

/* Reports the engine info (with the version) now, from any thread with its own connection:
 * an upgrade does not wait for the next beat to show the new version. */
int wk_agent_report(wk_agent *a, pv_redis *r, pv_status *st);

/* Runs a program of the node (argv NULL-terminated; env "K=V" NULL-terminated) in its own
 * process group, at most timeout_ms: through the process engine where it runs (it reaps every
 * child of the process), else spawned and waited for here. *exit_code and the last few KiB of
 * its combined output (*output, caller frees); past the timeout the group is killed:
 * DEADLINE_EXCEEDED. */
int wk_agent_run(wk_agent *a, const char *const *argv, const char *const *env, int timeout_ms,
                 int *exit_code, char **output, pv_status *st);

/* A pv_presence tick: reports the engine info, registers the node if not yet done (and
 * worker.pod is set), then refreshes its alive key. */
void wk_agent_beat(void *agent, pv_redis *r);

/* A pv_presence leave callback: deletes the engine info and the node's alive key (clean
 * stop). */
void wk_agent_leave(void *agent, pv_redis *r);

#endif
