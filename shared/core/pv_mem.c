/*
 * pv_mem: freeing several allocations at once (see pv_mem.h).
 */
#include "pv_mem.h"

#include <stdlib.h>

void pv_free_n(void *const *ptrs, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}
