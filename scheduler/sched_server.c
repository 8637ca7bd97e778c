/*
 * sched_server: the scheduler daemon's loop (see sched_server.h).
 *
 * Each request is acknowledged once answered, and the tick trims the stream below the oldest
 * entry the group still needs (pv_op_trim: its oldest pending or first undelivered entry), so
 * the stream holds work in progress and what was answered since the last tick: one command a
 * tick instead of an XDEL per request. A request whose deadline has passed is dropped unanswered:
 * its requester has abandoned it, and a reservation for it would be refused anyway. A request taken
 * over from a dead scheduler is simply run again: capacity has no effects, and a reservation's id
 * is derived from the request id, so a commit that did happen before the crash is found (DUPLICATE)
 * rather than made twice.
 */
#include "sched_server.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "pv_time.h"
#include "pv_keys.h"
#include "pv_log.h"
#include "pv_redis.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "pv_cluster.h"
#include "pv_workload.h"
#include "sched_cache.h"
#include "sched_place.h"

#define READ_COUNT 16
#define BLOCK_MS 500
#define CLAIM_EVERY_MS 1000
#define REAP_EVERY_MS 2000

struct sched_server {
    pthread_t thread;
    atomic_int stop;
    pv_redis *redis;
    sched_cache *cache;
    pv_keys keys;
    char instance[128];
    char stream[PV_KEY_MAX];
    int claim_idle_ms;
    int reservation_ttl_s;
    size_t orphan_cursor; /* where the next sweep of reservations of ended operations starts */
    unsigned long served, failed;
    unsigned long acked, trimmed; /* entries acknowledged; that count at the last trim */
};

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *field(const redisReply *fields, const char *name) {
    for (size_t i = 0; fields && i + 1 < fields->elements; i += 2)
        if (fields->element[i]->type == REDIS_REPLY_STRING &&
            strcmp(fields->element[i]->str, name) == 0 &&
            fields->element[i + 1]->type == REDIS_REPLY_STRING)
            return fields->element[i + 1]->str;
    return NULL;
}

static void reply_error(sched_server *s, const char *id, const sched_error *err) {
    char *body = pv_sched_error_body(&err->status, sched_kind_name(err->kind));
    pv_status st;
    if (!body || pv_sched_reply(s->redis, &s->keys, id, body, &st) != PV_OK)
        pv_warn("request %s: cannot send its error reply: %s", id, body ? st.msg : "out of memory");
    free(body);
}

/* Runs one request and answers it; *acked: its entry was acknowledged with the answer (a
 * reservation's commit does it in the same call). */
static void run_request(sched_server *s, const char *id, const char *kind, const char *body,
                        const char *entry_id, bool *acked) {
    sched_request req;
    sched_error err = {0};
    if (sched_request_parse(body, &req, &err.status) != PV_OK) {
        s->failed++;
        reply_error(s, id, &err);
        return;
    }
    req.ack = (pv_resv_ack){.stream = s->stream, .group = PV_SCHED_GROUP, .entry = entry_id};
    req.acked = acked;
    if (req.ttl_seconds <= 0) req.ttl_seconds = s->reservation_ttl_s;
    /* Ties between nodes change from request to request, as Eru's map order does, and stay as
     * they were for the same request: a redelivered deploy (its operation's plan id) plans the
     * same. */
    req.seed = sched_seed_of(id);
    char *reply = NULL;
    int rc;
    if (strcmp(kind, "capacity") == 0) {
        rc = sched_place_capacity(s->cache, s->redis, &s->keys, &req, &reply, &err);
        pv_status st;
        if (rc == PV_OK && pv_sched_reply(s->redis, &s->keys, id, reply, &st) != PV_OK)
            pv_warn("request %s: cannot send its reply: %s", id, st.msg);
    } else if (strcmp(kind, "reserve") == 0) {
        rc = sched_place_reserve(s->cache, s->redis, &s->keys, &req, id, pv_time_now_ms(), &reply,
                                 &err);
        if (rc == PV_OK && reply)
            pv_info("reserved for %s (app=%s entrypoint=%s owner=%s): %s", id, req.app, req.entry,
                    req.owner, reply);
    } else {
        pv_status_set(&err.status, PV_INVALID_ARGUMENT, "plan request kind \"%s\" is unknown",
                      kind);
        rc = err.status.code;
    }
    if (rc != PV_OK) {
        s->failed++;
        pv_debug("request %s (%s) failed: %s", id, kind, err.status.msg);
        reply_error(s, id, &err);
    } else {
        s->served++;
    }
    free(reply);
    sched_request_free(&req);
}

/* One stream entry: [entry id, [field, value, ...]]. */
static void handle_entry(sched_server *s, const redisReply *entry) {
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING)
        return;
    const char *entry_id = entry->element[0]->str;
    const redisReply *fields = entry->element[1];
    const char *id = field(fields, "id"), *kind = field(fields, "kind"),
               *body = field(fields, "body"), *deadline = field(fields, "deadline_ms");
    bool acked = false;
    if (id && kind && body) {
        int64_t until = deadline ? strtoll(deadline, NULL, 10) : 0;
        if (until > 0 && pv_time_now_ms() > until)
            pv_debug("request %s: its deadline passed before a scheduler took it; dropped", id);
        else
            run_request(s, id, kind, body, entry_id, &acked);
    } else if (fields && fields->type == REDIS_REPLY_ARRAY) {
        pv_warn("request entry %s lacks id, kind or body; dropped", entry_id);
    }
    if (acked) {
        s->acked++;
        return;
    }
    redisReply *rep = NULL;
    pv_status st;
    const char *ack[] = {"XACK", s->stream, PV_SCHED_GROUP, entry_id};
    if (pv_redis_commandv(s->redis, &rep, &st, 4, ack, NULL) == PV_OK) {
        freeReplyObject(rep);
        s->acked++;
    }
}

/* The requests of one read, planned on one view (sched_cache_batch). */
static void handle_entries(sched_server *s, const redisReply *entries) {
    sched_cache_batch(s->cache, true);
    for (size_t i = 0; entries && entries->type == REDIS_REPLY_ARRAY && i < entries->elements; i++)
        handle_entry(s, entries->element[i]);
    sched_cache_batch(s->cache, false);
}

static int ensure_group(sched_server *s, pv_status *st) {
    redisReply *rep = NULL;
    const char *argv[] = {"XGROUP", "CREATE", s->stream, PV_SCHED_GROUP, "0", "MKSTREAM"};
    int rc = pv_redis_commandv(s->redis, &rep, st, 6, argv, NULL);
    if (rep) freeReplyObject(rep);
    if (rc != PV_OK && strstr(st->msg, "BUSYGROUP")) return PV_OK;
    return rc;
}

/* New requests: XREADGROUP ... STREAMS <stream> >. */
static int read_new(sched_server *s, pv_status *st) {
    char block[16];
    snprintf(block, sizeof block, "%d", BLOCK_MS);
    const char *argv[] = {"XREADGROUP", "GROUP", PV_SCHED_GROUP, s->instance, "COUNT", "16",
                          "BLOCK",      block,   "STREAMS",      s->stream,   ">"};
    redisReply *rep = NULL;
    if (pv_redis_commandv(s->redis, &rep, st, 11, argv, NULL) != PV_OK) return st->code;
    /* [[stream, [entries]]] or nil on timeout */
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
        rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2)
        handle_entries(s, rep->element[0]->element[1]);
    freeReplyObject(rep);
    return PV_OK;
}

/* Requests another scheduler left pending too long: it died or hangs. */
static int claim_stale(sched_server *s, pv_status *st) {
    char idle[16];
    snprintf(idle, sizeof idle, "%d", s->claim_idle_ms);
    const char *argv[] = {"XAUTOCLAIM", s->stream, PV_SCHED_GROUP, s->instance,
                          idle,         "0-0",     "COUNT",        "16"};
    redisReply *rep = NULL;
    if (pv_redis_commandv(s->redis, &rep, st, 8, argv, NULL) != PV_OK) return st->code;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 && rep->element[1]->elements > 0) {
        pv_info("took over %zu plan request(s) left pending by another scheduler",
                rep->element[1]->elements);
        handle_entries(s, rep->element[1]);
    }
    freeReplyObject(rep);
    return PV_OK;
}

/* Gives the reservations ids back (one given back already is skipped) and frees ids. */
static void release_each(sched_server *s, char **ids, size_t n, const char *why) {
    pv_status st;
    for (size_t i = 0; i < n; i++) {
        if (pv_resv_release(s->redis, &s->keys, ids[i], &st) == PV_OK)
            pv_info("released reservation %s: %s", ids[i], why);
        else if (st.code != PV_NOT_FOUND)
            pv_warn("cannot release reservation %s (%s): %s", ids[i], why, st.msg);
    }
    pv_resv_ids_free(ids, n);
}

static void reap_expired(sched_server *s) {
    char **ids = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_resv_expired(s->redis, &s->keys, pv_time_now_ms(), 64, &ids, &n, &st) == PV_OK)
        release_each(s, ids, n, "nobody took it over before it expired");
}

/* Reservations whose owner operation ended without giving them back (a one-node create
 * dead-lettered on its node's queue, say) go back a minute after its end instead of at their
 * expiry: a sweep of ORPHAN_PAGE reservations every ORPHAN_EVERY_MS, each looked at once a
 * sweep. The minute leaves any end path that gives back by itself the time to do it first. */
#define ORPHAN_EVERY_MS 5000
#define ORPHAN_PAGE 64
#define ORPHAN_GRACE_MS 60000

static void reap_orphaned(sched_server *s) {
    char **ids = NULL;
    size_t n = 0;
    pv_status st;
    if (pv_resv_orphaned(s->redis, &s->keys, pv_time_now_ms(), ORPHAN_GRACE_MS, &s->orphan_cursor,
                         ORPHAN_PAGE, &ids, &n, &st) != PV_OK)
        pv_warn("looking for reservations whose operation ended: %s", st.msg);
    else
        release_each(s, ids, n, "its operation ended without giving it back");
}

/* Drops the requests answered since the last tick (never one still pending or not yet read).
 * Only after this scheduler acknowledged some (the trim is six commands): an idle one costs
 * nothing, and what another acknowledged goes with that one's trim or with the next here. */
static void trim_requests(sched_server *s) {
    if (s->acked == s->trimmed) return;
    s->trimmed = s->acked;
    const char *keys[] = {s->stream};
    redisReply *rep = NULL;
    pv_status st;
    if (pv_redis_fcall(s->redis, "pv_op_trim", 1, keys, 0, NULL, &rep, &st) != PV_OK)
        pv_warn("trimming the plan requests: %s", st.msg);
    else
        freeReplyObject(rep);
}

/* Eru's self-monitor: the workloads of nodes whose liveness ended are marked down. Every
 * scheduler does it on its tick; the function only writes real changes. */
static void mark_dead_nodes(sched_server *s) {
    size_t marked = 0;
    pv_status st;
    if (pv_workload_mark_dead_nodes(s->redis, &s->keys, &marked, &st) != PV_OK)
        pv_warn("marking the workloads of dead nodes: %s", st.msg);
    else if (marked > 0)
        pv_info("marked %zu workload(s) of dead nodes not running, not healthy", marked);
}

/* Clusters complete for the first time are recorded as formed (CREATING ends for good). */
static void mark_formed(sched_server *s) {
    size_t marked = 0;
    pv_status st;
    if (pv_cluster_mark_formed(s->redis, &s->keys, &marked, &st) != PV_OK)
        pv_warn("recording formed clusters: %s", st.msg);
    else if (marked > 0)
        pv_info("%zu cluster(s) formed: complete for the first time", marked);
}

/* The node cache follows the registry between requests too (the first time: every record), so a
 * request reads only what changed since the last tick. */
static void follow_nodes(sched_server *s) {
    pv_status st;
    if (sched_cache_refresh(s->cache, s->redis, &s->keys, &st) != PV_OK)
        pv_warn("following the node change index: %s", st.msg);
}

static void *loop(void *arg) {
    sched_server *s = arg;
    pv_status st;
    int grouped = 0, complained = 0;
    int64_t next_claim = 0, next_reap = 0, next_orphans = 0;
    while (!atomic_load(&s->stop)) {
        if (!grouped) {
            if (ensure_group(s, &st) != PV_OK) {
                if (!complained++) pv_warn("plan requests: %s; retrying", st.msg);
                sleep_ms(BLOCK_MS);
                continue;
            }
            grouped = 1;
            if (complained) pv_info("plan requests: connected again");
            complained = 0;
        }
        int64_t now = pv_time_now_ms();
        if (now >= next_claim) {
            next_claim = now + CLAIM_EVERY_MS;
            if (claim_stale(s, &st) != PV_OK) grouped = 0;
        }
        if (now >= next_reap) {
            next_reap = now + REAP_EVERY_MS;
            reap_expired(s);
            trim_requests(s);
            mark_dead_nodes(s);
            mark_formed(s);
            follow_nodes(s);
        }
        if (now >= next_orphans) {
            next_orphans = now + ORPHAN_EVERY_MS;
            reap_orphaned(s);
        }
        if (grouped && read_new(s, &st) != PV_OK) {
            /* A Redis that restarted empty has lost the group too: make it again. */
            grouped = 0;
            if (!complained++) pv_warn("plan requests: %s; retrying", st.msg);
            sleep_ms(100);
        }
    }
    return NULL;
}

int sched_server_start(const pv_config *cfg, const char *instance, sched_server **out,
                       pv_status *st) {
    *out = NULL;
    sched_server *s = calloc(1, sizeof *s);
    if (!s) return pv_status_set(st, PV_INTERNAL, "out of memory");
    snprintf(s->instance, sizeof s->instance, "%s", instance);
    s->claim_idle_ms = cfg->scheduler.claim_idle_ms;
    s->reservation_ttl_s = cfg->scheduler.reservation_ttl_seconds;
    pv_redis_opts o;
    pv_redis_opts_from_config(cfg, &o);
    /* The blocking read must end before the command timeout does. */
    if (o.command_timeout_ms != 0 && o.command_timeout_ms < BLOCK_MS * 2)
        o.command_timeout_ms = BLOCK_MS * 2;
    if (pv_keys_init(&s->keys, cfg->redis.prefix, st) != PV_OK ||
        pv_sched_key_requests(&s->keys, s->stream, sizeof s->stream, st) != PV_OK ||
        pv_redis_new(&o, &s->redis, st) != PV_OK) {
        free(s);
        return st->code;
    }
    if (!(s->cache = sched_cache_new()) || pthread_create(&s->thread, NULL, loop, s) != 0) {
        sched_cache_free(s->cache);
        pv_redis_free(s->redis);
        free(s);
        return pv_status_set(st, PV_INTERNAL, "cannot start the scheduler thread");
    }
    *out = s;
    return PV_OK;
}

void sched_server_stop(sched_server *s) {
    if (!s) return;
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    size_t entries;
    uint64_t reads, views;
    sched_cache_stats(s->cache, &entries, &reads, &views);
    pv_info("plan requests served=%lu failed=%lu; node cache entries=%zu reads=%llu views=%llu",
            s->served, s->failed, entries, (unsigned long long)reads, (unsigned long long)views);
    sched_cache_free(s->cache);
    pv_redis_free(s->redis);
    free(s);
}
