/*
 * gw_watchers: a mutex-protected doubly linked list of held calls.
 *
 * Each entry is the argument of its call's close callback, and that callback is the only place
 * an entry is unlinked and freed and its reference dropped: the framework runs it exactly once,
 * whether the client went away or the stream was finished here (the close op completes after
 * the status is sent). Finishing therefore never races with a disconnect.
 * Lock order: the set's mutex, then (inside gw_call_send) the call's; the framework runs close
 * callbacks without holding the call's mutex, so the reverse order never happens.
 */
#include "gw_watchers.h"

#include <pthread.h>
#include <stdlib.h>

#include "pv_status.h"

typedef struct watch_entry {
    gw_call *call;
    struct watch_entry *prev, *next;
    struct gw_watchers *set;
} watch_entry;

struct gw_watchers {
    pthread_mutex_t mu;
    watch_entry *head;
    size_t count;
};

gw_watchers *gw_watchers_new(void) {
    gw_watchers *w = calloc(1, sizeof *w);
    if (w) pthread_mutex_init(&w->mu, NULL);
    return w;
}

static void unlink_locked(gw_watchers *w, watch_entry *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        w->head = e->next;
    if (e->next) e->next->prev = e->prev;
    w->count--;
}

static void on_watcher_close(gw_call *c, void *arg) {
    watch_entry *e = arg;
    gw_watchers *w = e->set;
    pthread_mutex_lock(&w->mu);
    unlink_locked(w, e);
    pthread_mutex_unlock(&w->mu);
    free(e);
    gw_call_unref(c);
}

int gw_watchers_add(gw_watchers *w, gw_call *c) {
    watch_entry *e = calloc(1, sizeof *e);
    if (!e) return -1;
    e->call = c;
    e->set = w;
    gw_call_ref(c);
    pthread_mutex_lock(&w->mu);
    e->next = w->head;
    if (w->head) w->head->prev = e;
    w->head = e;
    w->count++;
    pthread_mutex_unlock(&w->mu);
    if (gw_call_on_close(c, on_watcher_close, e) != 0) {
        /* Closed already: the callback will never run, so undo here. */
        pthread_mutex_lock(&w->mu);
        unlink_locked(w, e);
        pthread_mutex_unlock(&w->mu);
        free(e);
        gw_call_unref(c);
        return -1;
    }
    return 0;
}

void gw_watchers_broadcast(gw_watchers *w, const ProtobufCMessage *m) {
    pthread_mutex_lock(&w->mu);
    for (watch_entry *e = w->head; e; e = e->next)
        gw_call_send(e->call, m);
    pthread_mutex_unlock(&w->mu);
}

void gw_watchers_finish_all(gw_watchers *w, const ProtobufCMessage *m, int code,
                            const char *details) {
    pthread_mutex_lock(&w->mu);
    for (watch_entry *e = w->head; e; e = e->next) {
        if (m) gw_call_send(e->call, m);
        gw_call_finish(e->call, code, details);
    }
    pthread_mutex_unlock(&w->mu);
}

size_t gw_watchers_count(gw_watchers *w) {
    pthread_mutex_lock(&w->mu);
    size_t n = w->count;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void gw_watchers_free(gw_watchers *w) {
    if (!w) return;
    /* After gw_server_shutdown every call is gone, and with it every entry. */
    pthread_mutex_destroy(&w->mu);
    free(w);
}
