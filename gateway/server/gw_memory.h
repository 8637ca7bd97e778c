/*
 * gw_memory: gives the memory of a burst back once the gateway goes idle.
 *
 * A burst of large requests (MiB messages, maps of 10,000 entries) is decoded on every pool
 * thread at once: glibc serves each thread from an arena of its own and keeps what was freed
 * there for the next allocation, so the gateway's resident memory stays at its peak for good
 * (measured: 21 MB idle, 99 MB at the peak of 400 1 MiB and 400 10,000-entry requests, 94 MB
 * 3 s after; with both measures below, 72 MB and 29 MB).
 * Two measures, both measured with `./ops/pivirt bench gateway-memory`:
 *   - gw_memory_tune, at start before any thread: at most gateway.malloc_arenas arenas, so a
 *     burst spreads over fewer heaps (the peak is lower, the rest fragments less);
 *   - a trimmer thread: once no call has started for gateway.memory_trim_idle_ms, one
 *     malloc_trim(0) hands every free page of every arena back to the kernel. Not while calls
 *     keep coming: pages a busy gateway frees it would take back at once.
 *
 * Ownership: gw_memory_start returns a trimmer the caller stops with gw_memory_stop (which
 * joins its thread and frees it). gw_memory_note_call is safe from any thread.
 */
#ifndef GW_MEMORY_H
#define GW_MEMORY_H

#include "pv_status.h"

typedef struct gw_memory gw_memory;

/* Caps glibc's arenas at arenas (0: glibc's own default, 8 per core) and keeps large freed
 * blocks for the next call (pv_mem_keep_freed: the trimmer gives them back once idle). Call
 * before threads. */
void gw_memory_tune(int arenas);

/* Starts the trimmer: idle_ms without a new call, then one trim. idle_ms 0: no trimmer, *out
 * NULL and PV_OK. */
int gw_memory_start(int idle_ms, gw_memory **out, pv_status *st);

/* A call started (the server's call observer). m may be NULL. */
void gw_memory_note_call(gw_memory *m);

/* How many trims the trimmer made (tests, logs). */
unsigned long gw_memory_trims(const gw_memory *m);

/* Stops and frees the trimmer; NULL is fine. */
void gw_memory_stop(gw_memory *m);

#endif
