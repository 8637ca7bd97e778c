/*
 * pv_presence: heartbeat thread and live-set queries (see pv_presence.h).
 *
 * The beat is one FCALL (pv_heartbeat: SET with PX, ZADD to the index, drop expired members),
 * so the key and the index never disagree for long. The thread sleeps on a condition variable,
 * so stop is immediate rather than waiting out an interval.
 */
#include "pv_time.h"
#include "pv_presence.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pv_log.h"
#include "pv_version.h"

struct pv_presence {
    pv_redis *redis;
    char key[PV_KEY_MAX];
    char index[PV_KEY_MAX];
    char *instance;
    char *kind;
    char *value;
    int interval_seconds;
    pv_presence_tick_fn tick;
    pv_presence_tick_fn leave;
    void *tick_arg;

    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    bool failing; /* the last beat failed: log recovery once */
};

void pv_presence_default_instance(char *buf, size_t len) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    char *dot = strchr(host, '.');
    if (dot) *dot = '\0';
    snprintf(buf, len, "%s-%d", host, (int)getpid());
}

static char *make_value(const pv_presence_opts *o) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    json_t *j =
        json_pack("{s:s, s:s, s:i, s:s, s:s, s:s, s:I}", "kind", o->kind, "instance", o->instance,
                  "pid", (int)getpid(), "host", host, "addr", o->addr ? o->addr : "", "version",
                  PV_VERSION, "started_at", (json_int_t)time(NULL));
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return s;
}

static int beat(pv_presence *p, pv_status *st) {
    char ttl[32];
    snprintf(ttl, sizeof ttl, "%d", p->interval_seconds * 3000);
    const char *keys[] = {p->key, p->index};
    const char *args[] = {ttl, p->value, p->instance};
    redisReply *reply = NULL;
    int rc = pv_redis_fcall(p->redis, "pv_heartbeat", 2, keys, 3, args, &reply, st);
    if (reply) freeReplyObject(reply);
    return rc;
}

static void beat_and_log(pv_presence *p) {
    pv_status st;
    pv_status_clear(&st);
    int rc = beat(p, &st);
    if (rc != PV_OK && !p->failing) {
        pv_warn("presence kind=%s instance=%s beat failed: %s", p->kind, p->instance, st.msg);
        p->failing = true;
    } else if (rc == PV_OK && p->failing) {
        pv_info("presence kind=%s instance=%s beating again", p->kind, p->instance);
        p->failing = false;
    }
    if (rc == PV_OK && p->tick) p->tick(p->tick_arg, p->redis);
}

static void *presence_thread(void *arg) {
    pv_presence *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += p->interval_seconds;
        while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0) {
        }
        if (p->stop) break;
        pthread_mutex_unlock(&p->mu);
        beat_and_log(p);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void presence_free(pv_presence *p) {
    if (!p) return;
    pv_redis_free(p->redis);
    free(p->instance);
    free(p->kind);
    free(p->value);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int pv_presence_start(const pv_config *cfg, const pv_presence_opts *o, pv_presence **out,
                      pv_status *st) {
    *out = NULL;
    pv_keys keys;
    if (pv_keys_init(&keys, cfg->redis.prefix, st) != PV_OK) return st->code;
    pv_presence *p = calloc(1, sizeof *p);
    if (!p) return pv_status_set(st, PV_INTERNAL, "out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pv_time_cond_init(&p->cv);
    p->instance = strdup(o->instance);
    p->kind = strdup(o->kind);
    p->value = make_value(o);
    p->interval_seconds = o->interval_seconds > 0 ? o->interval_seconds : 1;
    p->tick = o->tick;
    p->leave = o->leave;
    p->tick_arg = o->tick_arg;
    pv_redis_opts ro;
    pv_redis_opts_from_config(cfg, &ro);
    if (!p->instance || !p->kind || !p->value) {
        presence_free(p);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (pv_key_presence(&keys, o->kind, o->instance, p->key, sizeof p->key, st) != PV_OK ||
        pv_key_presence_index(&keys, o->kind, p->index, sizeof p->index, st) != PV_OK ||
        pv_redis_new(&ro, &p->redis, st) != PV_OK) {
        presence_free(p);
        return st->code;
    }
    int rc = beat(p, st);
    if (rc != PV_OK)
        p->failing = true;
    else if (p->tick)
        p->tick(p->tick_arg, p->redis);
    if (pthread_create(&p->thread, NULL, presence_thread, p) != 0) {
        presence_free(p);
        return pv_status_set(st, PV_INTERNAL, "cannot start the presence thread");
    }
    p->running = true;
    *out = p;
    return rc;
}

void pv_presence_stop(pv_presence *p) {
    if (!p) return;
    if (p->running) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    if (p->leave) p->leave(p->tick_arg, p->redis);
    const char *keys[] = {p->key, p->index};
    const char *args[] = {p->instance};
    redisReply *reply = NULL;
    pv_status st;
    if (pv_redis_fcall(p->redis, "pv_presence_leave", 2, keys, 1, args, &reply, &st) != PV_OK)
        pv_warn("presence kind=%s instance=%s could not leave: %s", p->kind, p->instance, st.msg);
    if (reply) freeReplyObject(reply);
    presence_free(p);
}

void pv_presence_values_free(char **values, size_t n) {
    for (size_t i = 0; values && i < n; i++)
        free(values[i]);
    free(values);
}

int pv_presence_list(pv_redis *r, const pv_keys *k, const char *kind, char ***values, size_t *n,
                     pv_status *st) {
    *values = NULL;
    *n = 0;
    char index[PV_KEY_MAX];
    if (pv_key_presence_index(k, kind, index, sizeof index, st) != PV_OK) return st->code;
    const char *keys[] = {index};
    redisReply *members = NULL;
    if (pv_redis_fcall(r, "pv_presence_live", 1, keys, 0, NULL, &members, st) != PV_OK)
        return st->code;
    if (members->type != REDIS_REPLY_ARRAY || members->elements == 0) {
        freeReplyObject(members);
        return PV_OK;
    }
    size_t m = members->elements;
    const char **argv = calloc(m + 1, sizeof *argv);
    char(*names)[PV_KEY_MAX] = calloc(m, PV_KEY_MAX);
    char **out = calloc(m, sizeof *out);
    if (!argv || !names || !out) {
        free(argv);
        free(names);
        free(out);
        freeReplyObject(members);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    argv[0] = "MGET";
    for (size_t i = 0; i < m; i++) {
        pv_key_presence(k, kind, members->element[i]->str, names[i], PV_KEY_MAX, st);
        argv[i + 1] = names[i];
    }
    freeReplyObject(members);
    redisReply *vals = NULL;
    int rc = pv_redis_commandv(r, &vals, st, (int)m + 1, argv, NULL);
    free(argv);
    free(names);
    if (rc != PV_OK) {
        free(out);
        return rc;
    }
    size_t count = 0;
    for (size_t i = 0; i < vals->elements; i++)
        if (vals->element[i]->type == REDIS_REPLY_STRING)
            out[count++] = strdup(vals->element[i]->str);
    freeReplyObject(vals);
    *values = out;
    *n = count;
    return PV_OK;
}
