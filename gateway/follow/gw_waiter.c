/*
 * gw_waiter: one libev loop, one asynchronous hiredis connection in subscribe mode, and the
 * waiting calls (see gw_waiter.h for what it promises).
 *
 * Hand-over: gw_waiter_add pushes the call's entry on a mutex-protected list and wakes the loop
 * with an ev_async; the call's close callback does the same with a second list. Every other
 * piece of state (the table of watched operations, the subscriptions, the timers) belongs to
 * the loop's thread, so it needs no lock.
 *
 * Entry lifetime: an entry holds one reference on its call and has two references of its own,
 * one for the loop (dropped when the entry leaves the table: answered, timed out, dropped after
 * its client went away, or at shutdown) and one for the call's close callback (dropped once the
 * loop has seen the close, or by the callback itself once the loop has stopped). Whichever goes
 * last frees the entry and releases the call, so a client that vanishes while its answer is
 * being pushed is never a use after free.
 *
 * Subscriptions: one per operation channel while at least one call waits on it. hiredis 0.14
 * keeps one callback per channel and removes it when an unsubscribe reply arrives, so at most
 * one SUBSCRIBE or UNSUBSCRIBE is in flight per channel (states NONE -> PENDING -> ACTIVE ->
 * LEAVING -> NONE); a call that arrives while the channel is leaving subscribes again once the
 * unsubscribe is confirmed. Records are read after the subscription is confirmed, so a change
 * made before the subscription took effect is still seen.
 *
 * Reads: a synchronous pv_redis owned by the loop's thread (one HGETALL, well under a
 * millisecond; the loop does nothing else meanwhile). A read that fails for another reason than
 * NOT_FOUND is retried by a timer while the subscription stands (after a reconnect the new
 * subscription reads again), so a dropped read never leaves a watcher behind.
 */
#include "gw_waiter.h"

#include <ev.h>
#include <hiredis/async.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "gw_async.h"
#include "op_convert.h"
#include "pv_log.h"
#include "pv_status.h"

#define RECONNECT_MIN_MS 50
#define RECONNECT_MAX_MS 1000
#define REREAD_RETRY_S 0.25
#define TABLE_MIN_BUCKETS 64

typedef enum { SUB_NONE, SUB_PENDING, SUB_ACTIVE, SUB_LEAVING } sub_state;

/* What a watcher was last sent: a new message goes out only when one of these changed. */
typedef struct op_sig {
    int64_t updated_ms;
    int status, progress, attempts, error_code;
    bool cancel_requested;
    uint64_t text_hash;
} op_sig;

typedef struct op_watch op_watch;

typedef struct waiter_entry {
    gw_waiter *w;
    gw_call *call;
    gw_waiter_mode mode;
    char id[PV_ID_MAX];
    char channel[PV_KEY_MAX];
    int64_t timeout_ms;
    op_sig last;
    bool have_last;
    atomic_int refs;
    atomic_bool closed;
    struct waiter_entry *next_add, *next_closed; /* hand-over lists, under w->mu */
    /* the loop's thread only */
    op_watch *watch; /* NULL while not in the table */
    struct waiter_entry *prev, *next;
    ev_timer timer;
} waiter_entry;

/* One watched operation: its channel, its subscription and the calls waiting on it. */
struct op_watch {
    char channel[PV_KEY_MAX];
    char id[PV_ID_MAX];
    sub_state sub;
    bool warned; /* a failed read was logged; quiet until a read succeeds */
    waiter_entry *head;
    size_t n;
    ev_timer retry;
    gw_waiter *w;
    op_watch *next_in_bucket;
};

struct gw_waiter {
    gw_app *app;

    pthread_t thread;
    bool thread_started, joined;
    struct ev_loop *loop;
    ev_async wake;

    pthread_mutex_t mu;
    bool accepting, stop_requested;
    waiter_entry *adds, *closes; /* pushed at the head; reversed when taken */

    /* the loop's thread only */
    gw_async *async;
    redisAsyncContext *ac; /* while ready: connected and authenticated */
    bool ready, stopping, was_lost;
    pv_redis *redis;
    op_watch **buckets;
    size_t n_buckets, n_watches;
};

static void settle(gw_waiter *w, op_watch *ow);

/* ---------------------------------------------------------------------------------------- */
/* entries                                                                                    */

static void entry_unref(waiter_entry *e) {
    if (atomic_fetch_sub(&e->refs, 1) == 1) {
        gw_call_unref(e->call);
        free(e);
    }
}

static uint64_t fnv1a(uint64_t h, const char *s) {
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    return h * 1099511628211ULL; /* separates ("ab","c") from ("a","bc") */
}

static op_sig sig_of(const pv_op *op) {
    op_sig s;
    memset(&s, 0, sizeof s);
    s.updated_ms = op->updated_ms;
    s.status = (int)op->status;
    s.progress = op->progress;
    s.attempts = op->attempts;
    s.error_code = op->error_code;
    s.cancel_requested = op->cancel_requested;
    uint64_t h = 1469598103934665603ULL;
    h = fnv1a(h, op->message);
    h = fnv1a(h, op->error_message);
    h = fnv1a(h, op->worker);
    s.text_hash = fnv1a(h, op->metadata);
    return s;
}

static bool sig_equal(const op_sig *a, const op_sig *b) {
    return a->updated_ms == b->updated_ms && a->status == b->status && a->progress == b->progress &&
           a->attempts == b->attempts && a->error_code == b->error_code &&
           a->cancel_requested == b->cancel_requested && a->text_hash == b->text_hash;
}

/* ---------------------------------------------------------------------------------------- */
/* the table of watched operations (by channel name)                                         */

static size_t bucket_of(const gw_waiter *w, const char *channel) {
    return (size_t)(fnv1a(1469598103934665603ULL, channel) % w->n_buckets);
}

static op_watch *watch_find(gw_waiter *w, const char *channel, size_t len) {
    if (len >= PV_KEY_MAX) return NULL;
    char key[PV_KEY_MAX];
    memcpy(key, channel, len);
    key[len] = '\0';
    for (op_watch *ow = w->buckets[bucket_of(w, key)]; ow; ow = ow->next_in_bucket)
        if (strcmp(ow->channel, key) == 0) return ow;
    return NULL;
}

static void table_grow(gw_waiter *w) {
    size_t n = w->n_buckets * 2;
    op_watch **nb = calloc(n, sizeof *nb);
    if (!nb) return; /* longer chains, still correct */
    op_watch **old = w->buckets;
    size_t old_n = w->n_buckets;
    w->buckets = nb;
    w->n_buckets = n;
    for (size_t i = 0; i < old_n; i++) {
        for (op_watch *ow = old[i], *next; ow; ow = next) {
            next = ow->next_in_bucket;
            size_t b = bucket_of(w, ow->channel);
            ow->next_in_bucket = nb[b];
            nb[b] = ow;
        }
    }
    free(old);
}

static void on_retry(struct ev_loop *loop, ev_timer *t, int revents);

static op_watch *watch_get(gw_waiter *w, const waiter_entry *e) {
    op_watch *ow = watch_find(w, e->channel, strlen(e->channel));
    if (ow) return ow;
    ow = calloc(1, sizeof *ow);
    if (!ow) return NULL;
    memcpy(ow->channel, e->channel, sizeof ow->channel);
    memcpy(ow->id, e->id, sizeof ow->id);
    ow->w = w;
    ev_timer_init(&ow->retry, on_retry, REREAD_RETRY_S, 0.);
    ow->retry.data = ow;
    if (w->n_watches >= 2 * w->n_buckets) table_grow(w);
    size_t b = bucket_of(w, ow->channel);
    ow->next_in_bucket = w->buckets[b];
    w->buckets[b] = ow;
    w->n_watches++;
    return ow;
}

static void watch_free(gw_waiter *w, op_watch *ow) {
    op_watch **pp = &w->buckets[bucket_of(w, ow->channel)];
    while (*pp && *pp != ow)
        pp = &(*pp)->next_in_bucket;
    if (*pp) *pp = ow->next_in_bucket;
    w->n_watches--;
    ev_timer_stop(w->loop, &ow->retry);
    free(ow);
}

static void link_entry(op_watch *ow, waiter_entry *e) {
    e->watch = ow;
    e->prev = NULL;
    e->next = ow->head;
    if (ow->head) ow->head->prev = e;
    ow->head = e;
    ow->n++;
}

/* Takes e out of the table and drops the loop's reference. The watch may now be empty: the
 * caller settles it (settle) when it is done with it. */
static void unlink_entry(gw_waiter *w, waiter_entry *e) {
    op_watch *ow = e->watch;
    if (!ow) return;
    if (e->prev)
        e->prev->next = e->next;
    else
        ow->head = e->next;
    if (e->next) e->next->prev = e->prev;
    ow->n--;
    e->watch = NULL;
    ev_timer_stop(w->loop, &e->timer);
    entry_unref(e);
}

/* ---------------------------------------------------------------------------------------- */
/* subscriptions                                                                              */

static void on_sub_reply(redisAsyncContext *ac, void *r, void *privdata);

static void subscribe(gw_waiter *w, op_watch *ow) {
    if (!w->ready || ow->sub != SUB_NONE) return;
    if (redisAsyncCommand(w->ac, on_sub_reply, NULL, "SUBSCRIBE %s", ow->channel) == REDIS_OK)
        ow->sub = SUB_PENDING;
    else
        pv_warn("waiter: SUBSCRIBE %s could not be sent: %s", ow->channel, w->ac->errstr);
}

static void unsubscribe(gw_waiter *w, op_watch *ow) {
    /* hiredis sends the unsubscribe reply to the channel's own callback (on_sub_reply). */
    if (w->ready && redisAsyncCommand(w->ac, NULL, NULL, "UNSUBSCRIBE %s", ow->channel) == REDIS_OK)
        ow->sub = SUB_LEAVING;
}

/* Called once nothing more will be done with ow: an empty watch unsubscribes or goes away.
 * ow may be freed. */
static void settle(gw_waiter *w, op_watch *ow) {
    if (ow->n > 0) return;
    ev_timer_stop(w->loop, &ow->retry);
    if (ow->sub == SUB_ACTIVE) unsubscribe(w, ow);
    if (ow->sub == SUB_NONE) watch_free(w, ow);
    /* PENDING and LEAVING: the reply in flight settles it. */
}

/* ---------------------------------------------------------------------------------------- */
/* answering                                                                                  */

static void finish_all(gw_waiter *w, op_watch *ow, int code, const char *msg) {
    for (waiter_entry *e = ow->head, *next; e; e = next) {
        next = e->next;
        gw_call_finish(e->call, code, msg);
        unlink_entry(w, e);
    }
}

/* Pushes the record to every call waiting on it: a WAIT call is answered once it is done, a
 * WATCH call gets every state it has not seen yet. */
static void dispatch(gw_waiter *w, op_watch *ow, const pv_op *op) {
    bool done = pv_op_done(op);
    op_sig sig = sig_of(op);
    op_convert_msg m;
    pv_status st;
    if (op_convert_fill(op, &m, &st) != PV_OK) {
        op_convert_free(&m);
        finish_all(w, ow, PV_INTERNAL, st.msg);
        return;
    }
    for (waiter_entry *e = ow->head, *next; e; e = next) {
        next = e->next;
        if (atomic_load(&e->closed)) continue; /* its close is on the way to the loop */
        if (e->mode == GW_WAITER_WAIT) {
            if (!done) continue;
            gw_call_reply(e->call, &m.msg.base);
            unlink_entry(w, e);
            continue;
        }
        if (!e->have_last || !sig_equal(&e->last, &sig)) {
            gw_call_send(e->call, &m.msg.base);
            e->last = sig;
            e->have_last = true;
        }
        if (done) {
            gw_call_finish(e->call, PV_OK, NULL);
            unlink_entry(w, e);
        }
    }
    op_convert_free(&m);
}

/* Reads the record and pushes it. ow may be freed. */
static void refresh(gw_waiter *w, op_watch *ow) {
    pv_op op;
    memset(&op, 0, sizeof op);
    pv_status st;
    int rc = pv_op_get(w->redis, &w->app->keys, ow->id, &op, &st);
    if (rc == PV_OK) {
        ev_timer_stop(w->loop, &ow->retry);
        ow->warned = false;
        dispatch(w, ow, &op);
    } else if (rc == PV_NOT_FOUND) {
        finish_all(w, ow, rc, st.msg);
    } else if (w->ready) {
        /* The subscription is fine but the read failed: try again soon. Without a connection
         * there is nothing to do: the subscription after the reconnect reads again. */
        if (!ow->warned)
            pv_warn("waiter: reading operation %s failed (%s); retrying", ow->id, st.msg);
        ow->warned = true;
        if (!ev_is_active(&ow->retry)) ev_timer_start(w->loop, &ow->retry);
    }
    pv_op_clear(&op);
    settle(w, ow);
}

static void on_retry(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    op_watch *ow = t->data;
    refresh(ow->w, ow);
}

static void on_timeout(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    waiter_entry *e = t->data;
    gw_waiter *w = e->w;
    op_watch *ow = e->watch;
    pv_op op;
    memset(&op, 0, sizeof op);
    pv_status st;
    if (pv_op_get(w->redis, &w->app->keys, e->id, &op, &st) == PV_OK)
        op_convert_reply(e->call, &op);
    else
        gw_call_finish(e->call, st.code, st.msg);
    pv_op_clear(&op);
    unlink_entry(w, e);
    settle(w, ow);
}

static void on_sub_reply(redisAsyncContext *ac, void *r, void *privdata) {
    (void)privdata;
    gw_waiter *w = gw_async_arg(ac);
    redisReply *reply = r;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3) return;
    if (reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = reply->element[0]->str;
    op_watch *ow = watch_find(w, reply->element[1]->str, reply->element[1]->len);
    if (!ow) return;
    if (strcmp(kind, "message") == 0) {
        if (ow->sub == SUB_ACTIVE && ow->n > 0) refresh(w, ow);
    } else if (strcmp(kind, "subscribe") == 0) {
        ow->sub = SUB_ACTIVE;
        if (ow->n > 0)
            refresh(w, ow);
        else
            settle(w, ow);
    } else if (strcmp(kind, "unsubscribe") == 0) {
        ow->sub = SUB_NONE;
        if (ow->n > 0)
            subscribe(w, ow);
        else
            settle(w, ow);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* the connection                                                                             */

static void for_each_watch(gw_waiter *w, void (*fn)(gw_waiter *, op_watch *)) {
    for (size_t i = 0; i < w->n_buckets; i++) {
        for (op_watch *ow = w->buckets[i], *next; ow; ow = next) {
            next = ow->next_in_bucket;
            fn(w, ow);
        }
    }
}

static void forget_subscription(gw_waiter *w, op_watch *ow) {
    ow->sub = SUB_NONE;
    settle(w, ow);
}

static void lost(gw_waiter *w, const char *why) {
    if (!w->was_lost && !w->stopping)
        pv_warn("waiter: redis %s: %s; waiting calls keep waiting, reconnecting",
                w->app->cfg.redis.addr, why);
    w->was_lost = true;
}

/* gw_async: a connect failed or the connection dropped (it reconnects by itself). */
static void on_lost(void *arg, const char *why) {
    gw_waiter *w = arg;
    w->ac = NULL;
    w->ready = false;
    lost(w, why);
    for_each_watch(w, forget_subscription);
}

static void subscribe_waiting(gw_waiter *w, op_watch *ow) {
    if (ow->n > 0) subscribe(w, ow);
}

/* gw_async: connected and authenticated. */
static void on_ready(void *arg, redisAsyncContext *ac) {
    gw_waiter *w = arg;
    w->ac = ac;
    w->ready = true;
    if (w->was_lost)
        pv_info("waiter: redis %s reachable again; subscribing %zu operations again",
                w->app->cfg.redis.addr, w->n_watches);
    w->was_lost = false;
    for_each_watch(w, subscribe_waiting);
}

/* ---------------------------------------------------------------------------------------- */
/* hand-over                                                                                  */

static void take_entry(gw_waiter *w, waiter_entry *e) {
    if (atomic_load(&e->closed)) {
        entry_unref(e);
        return;
    }
    if (w->stopping) {
        gw_call_finish(e->call, PV_UNAVAILABLE, "gateway shutting down");
        entry_unref(e);
        return;
    }
    op_watch *ow = watch_get(w, e);
    if (!ow) {
        gw_call_finish(e->call, PV_INTERNAL, "out of memory registering the wait");
        entry_unref(e);
        return;
    }
    link_entry(ow, e);
    if (e->mode == GW_WAITER_WAIT) {
        ev_timer_set(&e->timer, (double)e->timeout_ms / 1000.0, 0.);
        ev_timer_start(w->loop, &e->timer);
    }
    if (ow->sub == SUB_ACTIVE)
        refresh(w, ow); /* subscribed already: read now */
    else
        subscribe(w, ow); /* read once the subscription is confirmed */
}

static void take_close(gw_waiter *w, waiter_entry *e) {
    op_watch *ow = e->watch;
    if (ow) {
        unlink_entry(w, e);
        settle(w, ow);
    }
    entry_unref(e); /* the close callback's reference */
}

static waiter_entry *reversed(waiter_entry *head, bool closes) {
    waiter_entry *out = NULL;
    while (head) {
        waiter_entry *next = closes ? head->next_closed : head->next_add;
        if (closes)
            head->next_closed = out;
        else
            head->next_add = out;
        out = head;
        head = next;
    }
    return out;
}

static void end_all(gw_waiter *w, op_watch *ow) {
    finish_all(w, ow, PV_UNAVAILABLE, "gateway shutting down");
    ow->sub = SUB_NONE;
    settle(w, ow);
}

static void stop_loop(gw_waiter *w) {
    w->stopping = true;
    for_each_watch(w, end_all);
    w->ready = false;
    w->ac = NULL;
    gw_async_close(w->async);
    ev_async_stop(w->loop, &w->wake);
    ev_break(w->loop, EVBREAK_ALL);
}

static void on_wake(struct ev_loop *loop, ev_async *a, int revents) {
    (void)revents;
    gw_waiter *w = a->data;
    pthread_mutex_lock(&w->mu);
    waiter_entry *adds = w->adds, *closes = w->closes;
    w->adds = w->closes = NULL;
    bool stop = w->stop_requested;
    if (stop) w->accepting = false; /* from now on close callbacks drop their own reference */
    pthread_mutex_unlock(&w->mu);

    ev_now_update(loop);
    for (waiter_entry *e = reversed(adds, false), *next; e; e = next) {
        next = e->next_add;
        take_entry(w, e);
    }
    for (waiter_entry *e = reversed(closes, true), *next; e; e = next) {
        next = e->next_closed;
        take_close(w, e);
    }
    if (stop) stop_loop(w);
}

static void on_call_close(gw_call *c, void *arg) {
    (void)c;
    waiter_entry *e = arg;
    gw_waiter *w = e->w;
    atomic_store(&e->closed, true);
    pthread_mutex_lock(&w->mu);
    if (w->accepting) {
        e->next_closed = w->closes;
        w->closes = e;
        ev_async_send(w->loop, &w->wake);
        pthread_mutex_unlock(&w->mu);
        return;
    }
    pthread_mutex_unlock(&w->mu);
    entry_unref(e);
}

int gw_waiter_add(gw_waiter *w, gw_call *c, const char *op_id, gw_waiter_mode mode,
                  int64_t timeout_ms, const pv_op *sent) {
    waiter_entry *e = calloc(1, sizeof *e);
    if (!e) return -1;
    pv_status st;
    if (pv_op_channel(&w->app->keys, op_id, e->channel, sizeof e->channel, &st) != PV_OK) {
        free(e);
        gw_call_finish(c, st.code, st.msg);
        return 0;
    }
    e->w = w;
    e->call = c;
    e->mode = mode;
    snprintf(e->id, sizeof e->id, "%s", op_id);
    e->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
    if (sent) {
        e->last = sig_of(sent);
        e->have_last = true;
    }
    ev_init(&e->timer, on_timeout);
    e->timer.data = e;
    atomic_init(&e->refs, 2); /* the loop's and the close callback's */
    atomic_init(&e->closed, false);
    gw_call_ref(c);
    if (gw_call_on_close(c, on_call_close, e) != 0) {
        /* Closed already: nobody is left to answer. */
        gw_call_unref(c);
        free(e);
        return 0;
    }
    pthread_mutex_lock(&w->mu);
    if (!w->accepting) {
        pthread_mutex_unlock(&w->mu);
        gw_call_finish(c, PV_UNAVAILABLE, "gateway shutting down");
        entry_unref(e); /* the close callback drops the other reference */
        return 0;
    }
    e->next_add = w->adds;
    w->adds = e;
    ev_async_send(w->loop, &w->wake);
    pthread_mutex_unlock(&w->mu);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* life                                                                                       */

gw_waiter *gw_waiter_new(gw_app *app) {
    gw_waiter *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->app = app;
    w->n_buckets = TABLE_MIN_BUCKETS;
    w->buckets = calloc(w->n_buckets, sizeof *w->buckets);
    gw_async_spec spec = {.what = "waiter",
                          .backoff_ms = {RECONNECT_MIN_MS, RECONNECT_MAX_MS},
                          .ready = on_ready,
                          .lost = on_lost,
                          .arg = w};
    if (!w->buckets ||
        gw_async_open_follower(&app->cfg, &spec, &w->loop, &w->async, &w->redis) != 0) {
        free(w->buckets);
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    ev_async_init(&w->wake, on_wake);
    w->wake.data = w;
    ev_async_start(w->loop, &w->wake);
    return w;
}

static void hook_stop(void *arg) {
    gw_waiter_stop(arg);
}

int gw_waiter_register(gw_waiter *w, gw_server *server) {
    return gw_server_on_shutdown(server, hook_stop, w);
}

static void *waiter_thread(void *arg) {
    gw_waiter *w = arg;
    gw_async_connect(w->async);
    ev_run(w->loop, 0);
    return NULL;
}

int gw_waiter_start(gw_waiter *w) {
    /* The thread inherits the caller's signal mask: main blocks SIGINT/SIGTERM before this. */
    pthread_mutex_lock(&w->mu);
    w->accepting = true;
    pthread_mutex_unlock(&w->mu);
    if (pthread_create(&w->thread, NULL, waiter_thread, w) != 0) {
        pthread_mutex_lock(&w->mu);
        w->accepting = false;
        pthread_mutex_unlock(&w->mu);
        return -1;
    }
    w->thread_started = true;
    return 0;
}

void gw_waiter_stop(gw_waiter *w) {
    if (!w) return;
    if (!w->thread_started || w->joined) {
        pthread_mutex_lock(&w->mu);
        w->accepting = false;
        pthread_mutex_unlock(&w->mu);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->stop_requested = true;
    ev_async_send(w->loop, &w->wake);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    w->joined = true;
}

void gw_waiter_free(gw_waiter *w) {
    if (!w) return;
    gw_waiter_stop(w);
    /* The loop has ended every call and emptied the table; what is left are entries of calls
     * whose close callback has not run, and those free themselves. */
    for (size_t i = 0; i < w->n_buckets; i++) {
        for (op_watch *ow = w->buckets[i], *next; ow; ow = next) {
            next = ow->next_in_bucket;
            free(ow);
        }
    }
    free(w->buckets);
    gw_async_close_follower(w->loop, w->async, w->redis);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
