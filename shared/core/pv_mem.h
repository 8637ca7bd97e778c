/*
 * pv_mem: freeing several allocations in one statement. A record with many owned fields, or a
 * function's cleanup exit that took a handful of buffers, lists them once (PV_FREE(a, b, c))
 * instead of a run of free() lines that every such record or exit would write again.
 */
#ifndef PV_MEM_H
#define PV_MEM_H

#include <stddef.h>

/* free() on each of ptrs[0..n); NULL entries are skipped, as free skips them. */
void pv_free_n(void *const *ptrs, size_t n);

/* PV_FREE(a, b, ...): free(a); free(b); ... in that order, each argument evaluated once. */
#define PV_FREE(...)                                                                               \
    pv_free_n((void *const[]){__VA_ARGS__}, sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif
