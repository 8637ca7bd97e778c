/*
 * pv_mem: freeing several allocations at once, and what the allocator keeps (see pv_mem.h).
 */
#include "pv_mem.h"

#include <malloc.h>
#include <stdlib.h>

#include "pv_log.h"

void pv_free_n(void *const *ptrs, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}

bool pv_mem_keep_freed(void) {
    /* both, or the dynamic mmap threshold glibc drops with any of them maps every block apart */
    bool taken = mallopt(M_MMAP_THRESHOLD, (int)PV_MEM_MMAP_THRESHOLD) == 1 &&
                 mallopt(M_TRIM_THRESHOLD, (int)PV_MEM_TRIM_THRESHOLD) == 1;
    if (!taken)
        pv_info("this allocator does not take malloc's thresholds (not glibc's: a sanitizer "
                "build?): large blocks are mapped and unmapped with each use");
    return taken;
}
