/*
 * gw_memory: arena cap and idle trims (see gw_memory.h).
 *
 * The trimmer wakes every idle period and compares the number of calls started with what it
 * saw last time: unchanged means no call started for a whole period. It trims once per idle
 * spell, so an idle gateway costs one wake-up per period and nothing else. It sleeps on a
 * condition variable so that stopping does not wait out a period.
 */
#include "gw_memory.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_log.h"
#include "pv_mem.h"
#include "pv_time.h"

struct gw_memory {
    atomic_ulong calls; /* calls started since start */
    atomic_ulong trims;
    int idle_ms;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    bool stopping;     /* under mu */
};

void gw_memory_tune(int arenas) {
    if (arenas > 0 && mallopt(M_ARENA_MAX, arenas) != 1)
        pv_info("gateway.malloc_arenas %d: this allocator does not take M_ARENA_MAX (not "
                "glibc's: a sanitizer build?)",
                arenas);
    pv_mem_keep_freed();
}

void gw_memory_note_call(gw_memory *m) {
    if (m) atomic_fetch_add_explicit(&m->calls, 1, memory_order_relaxed);
}

unsigned long gw_memory_trims(const gw_memory *m) {
    return m ? atomic_load(&m->trims) : 0;
}

/* Sleeps one period; false once stopping. */
static bool wait_period(gw_memory *m) {
    struct timespec until = pv_time_mono_after(m->idle_ms);
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    while (!m->stopping && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&m->cv, &m->mu, &until);
    bool go_on = !m->stopping;
    pthread_mutex_unlock(&m->mu);
    return go_on;
}

static void *trimmer_main(void *arg) {
    gw_memory *m = arg;
    unsigned long seen = atomic_load(&m->calls);
    bool trimmed = true; /* nothing to give back before the first call */
    while (wait_period(m)) {
        unsigned long now = atomic_load(&m->calls);
        if (now != seen) {
            seen = now;
            trimmed = false;
            continue;
        }
        if (trimmed) continue;
        malloc_trim(0);
        atomic_fetch_add(&m->trims, 1);
        trimmed = true;
    }
    return NULL;
}

int gw_memory_start(int idle_ms, gw_memory **out, pv_status *st) {
    *out = NULL;
    if (idle_ms <= 0) return PV_OK;
    gw_memory *m = calloc(1, sizeof *m);
    if (!m) return pv_status_set(st, PV_INTERNAL, "memory trimmer: out of memory");
    m->idle_ms = idle_ms;
    pthread_mutex_init(&m->mu, NULL);
    pv_time_cond_init(&m->cv);
    int rc = pthread_create(&m->thread, NULL, trimmer_main, m);
    if (rc != 0) {
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        free(m);
        return pv_status_set(st, PV_INTERNAL, "memory trimmer: cannot start its thread: %s",
                             strerror(rc));
    }
    *out = m;
    return PV_OK;
}

void gw_memory_stop(gw_memory *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->stopping = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}
