/*
 * pv_mem: freeing several allocations in one statement, and how a process's allocator keeps
 * what it frees.
 *
 * A record with many owned fields, or a function's cleanup exit that took a handful of buffers,
 * lists them once (PV_FREE(a, b, c)) instead of a run of free() lines that every such record or
 * exit would write again.
 *
 * pv_mem_keep_freed: a call that answers for a 10,000-node pod (a capacity answer, a plan's
 * snapshot) allocates and frees a few buffers of hundreds of KiB each time. glibc maps each one
 * apart (above its 128 KiB mmap threshold, raised only by what was last freed) or gives the top
 * of its heap back once more than twice that is free, so every call faults its pages in again:
 * measured, a quarter of the gateway's and the scheduler's CPU for such a call. Serving blocks up
 * to PV_MEM_MMAP_THRESHOLD from the heap and keeping up to PV_MEM_TRIM_THRESHOLD free there
 * lets the next call reuse the pages. The gateway gives them back when idle (gw_memory.h).
 * Blocks above 1 MiB (a 1 MiB request) are still mapped apart: with 4 MiB, the gateway held some
 * 8 MB more after a burst of them, even once trimmed (fragments of its arenas).
 */
#ifndef PV_MEM_H
#define PV_MEM_H

#include <stdbool.h>
#include <stddef.h>

#define PV_MEM_MMAP_THRESHOLD (1u << 20)
#define PV_MEM_TRIM_THRESHOLD (32u << 20)

/* Sets both thresholds (glibc's mallopt); call at start, before threads. false (and a line in
 * the log) when the allocator does not take them (a sanitizer's), which changes nothing else. */
bool pv_mem_keep_freed(void);

/* free() on each of ptrs[0..n); NULL entries are skipped, as free skips them. */
void pv_free_n(void *const *ptrs, size_t n);

/* PV_FREE(a, b, ...): free(a); free(b); ... in that order, each argument evaluated once. */
#define PV_FREE(...)                                                                               \
    pv_free_n((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif
