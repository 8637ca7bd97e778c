/*
 * sched_server: the scheduler daemon's work loop. Takes plan requests from the request stream
 * (shared/store/pv_sched.h) as one consumer of the schedulers' group, answers capacity requests and
 * commits reservations (sched_place.h), takes over requests another scheduler left pending for
 * scheduler.claim_idle_ms (it died mid-request), releases reservations whose time ran out, and
 * marks the workloads of nodes whose liveness ended not running (Eru's self-monitor).
 *
 * One thread with its own Redis connection. Scale by running more schedulers: the group hands
 * each request to one of them, and reservations stay correct across any number of them because
 * their commits compare-and-set (pv_resv.h).
 *
 * Ownership: sched_server_start allocates the server; sched_server_stop stops, joins and frees.
 */
#ifndef SCHED_SERVER_H
#define SCHED_SERVER_H

#include "pv_config.h"
#include "pv_status.h"

typedef struct sched_server sched_server;

/* Copies what it needs from cfg; instance names this scheduler in the group. */
int sched_server_start(const pv_config *cfg, const char *instance, sched_server **out,
                       pv_status *st);
void sched_server_stop(sched_server *s);

#endif
