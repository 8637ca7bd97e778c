/*
 * wk_log_index: a log's time index (see wk_log_index.h).
 */
#include "wk_log_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pv_time.h"
#include "wk_engine.h"

void wk_log_index_append(const char *path, int64_t ms, int64_t size) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) return;
    char line[64];
    int n = snprintf(line, sizeof line, "%" PRId64 " %" PRId64 "\n", ms, size);
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

/* The index's entries, oldest first: *ms and *size are malloc'd arrays of *n. */
static int index_read(const char *path, int64_t **ms, int64_t **size, size_t *n) {
    *ms = *size = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : -1;
    size_t cap = 0;
    long long a, b;
    while (fscanf(f, "%lld %lld", &a, &b) == 2) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            int64_t *m2 = realloc(*ms, cap * sizeof **ms),
                    *s2 = m2 ? realloc(*size, cap * sizeof **size) : NULL;
            if (m2) *ms = m2;
            if (!m2 || !s2) {
                fclose(f);
                return -1;
            }
            *size = s2;
        }
        (*ms)[*n] = a;
        (*size)[(*n)++] = b;
    }
    fclose(f);
    return 0;
}

int64_t wk_log_index_last_size(const char *path) {
    int64_t *ms, *size;
    size_t n;
    int64_t last = -1;
    if (index_read(path, &ms, &size, &n) == 0 && n > 0) last = size[n - 1];
    free(ms);
    free(size);
    return last;
}

int wk_log_index_range(const char *path, int64_t since_ms, int64_t until_ms, int64_t *start,
                       int64_t *end, pv_status *st) {
    *start = 0;
    *end = -1;
    int64_t *ms = NULL, *size = NULL;
    size_t n = 0;
    if (index_read(path, &ms, &size, &n) != 0) {
        int err = errno;
        free(ms);
        free(size);
        return pv_status_set(st, PV_INTERNAL, "its log index %s: %s", path, strerror(err));
    }
    /* The bytes an entry adds were written in the tick before it: (ms - tick, ms]. since: from
     * the size at the last entry no later than since (what follows may be up to a tick older
     * than since); until: to the size at the first entry no earlier than until, or at the one
     * before when that entry's whole tick came after until. With no such entry, what the log
     * holds past the last entry came in the tick under way: after until when until is older
     * than a tick, else it may not be (kept). */
    for (size_t i = 0; since_ms > 0 && i < n && ms[i] <= since_ms; i++)
        *start = size[i];
    bool found = false;
    for (size_t i = 0; until_ms > 0 && i < n; i++)
        if (ms[i] >= until_ms) {
            bool after = ms[i] - WK_ENGINE_LOG_INDEX_MS >= until_ms;
            *end = !after ? size[i] : i > 0 ? size[i - 1] : 0;
            found = true;
            break;
        }
    if (until_ms > 0 && !found && until_ms <= pv_time_now_ms() - WK_ENGINE_LOG_INDEX_MS)
        *end = n > 0 ? size[n - 1] : 0;
    if (*end >= 0 && *end < *start) *end = *start;
    free(ms);
    free(size);
    return PV_OK;
}
