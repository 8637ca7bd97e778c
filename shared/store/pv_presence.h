/*
 * pv_presence: a process says it is alive.
 *
 * Every pivirt process (gateway, worker, scheduler, node agent) runs one presence: a thread with
 * its own Redis connection that refreshes the process's TTL'd key and its entry in the live index
 * of its kind every interval (pv_keys.h has the key names; the TTL is three intervals, so one
 * late beat is not a death). An optional tick callback runs on that thread after each beat: the
 * gateway uses it to push the live gateway set to WatchServiceStatus clients. On stop the
 * process removes itself at once instead of waiting for the TTL.
 *
 * Redis being down is not fatal: beats fail (logged once per outage) and resume when it is back.
 */
#ifndef PV_PRESENCE_H
#define PV_PRESENCE_H

#include <stddef.h>

#include "pv_config.h"
#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"

typedef struct pv_presence pv_presence;

typedef void (*pv_presence_tick_fn)(void *arg, pv_redis *r);

typedef struct pv_presence_opts {
    const char *kind;          /* "gateway", "worker", "scheduler", "agent" */
    const char *instance;      /* unique among that kind ("<host>-<pid>", or the node name) */
    const char *addr;          /* what others should know to reach it ("" when nothing) */
    int interval_seconds;      /* >= 1 */
    pv_presence_tick_fn tick;  /* may be NULL */
    pv_presence_tick_fn leave; /* may be NULL: runs on the presence's connection in
                                  pv_presence_stop, before the presence itself leaves */
    void *tick_arg;
} pv_presence_opts;

/* Beats once synchronously (so the caller knows Redis answers: PV_UNAVAILABLE otherwise, but the
 * presence is still started and keeps trying), then starts the thread. *out is owned by the
 * caller and released by pv_presence_stop. Copies the strings of opts. */
int pv_presence_start(const pv_config *cfg, const pv_presence_opts *opts, pv_presence **out,
                      pv_status *st);

/* Stops the thread, removes the presence from Redis (best effort), frees p. */
void pv_presence_stop(pv_presence *p);

/* The values (JSON documents) of the live processes of a kind, in instance order. On PV_OK
 * *values is a malloc'd array of malloc'd strings (pv_presence_values_free). */
int pv_presence_list(pv_redis *r, const pv_keys *k, const char *kind, char ***values, size_t *n,
                     pv_status *st);
void pv_presence_values_free(char **values, size_t n);

/* "<short hostname>-<pid>": a default instance name. */
void pv_presence_default_instance(char *buf, size_t len);

#endif
