/*
 * wk_agent: what makes pivirt-worker --set worker.node=NAME the agent of node NAME.
 *
 * The agent registers its node in the registry (creating its pod when missing, as the local
 * stack's pod `local` is), with the resources read from the machine when the node is new, then
 * keeps the node alive: every presence beat refreshes the node's alive key (Eru's SetNodeStatus
 * with a TTL of three beats), so Ready = the agent's heartbeat key lives. A clean stop deletes
 * the key at once. Registration is retried on every beat until Redis answers.
 *
 * Ownership: wk_agent_new copies what it keeps; wk_agent_free releases it.
 */
#ifndef WK_AGENT_H
#define WK_AGENT_H

#include "pv_config.h"
#include "pv_redis.h"

typedef struct wk_agent wk_agent;

wk_agent *wk_agent_new(const pv_config *cfg);
void wk_agent_free(wk_agent *a);

/* A pv_presence tick: registers the node if not yet done, then refreshes its alive key. */
void wk_agent_beat(void *agent, pv_redis *r);

/* A pv_presence leave callback: deletes the node's alive key (clean stop). */
void wk_agent_leave(void *agent, pv_redis *r);

#endif
