/*
 * wk_log_index: the time index of a workload's log, for LogStream's since and until. A log is
 * written straight by what the workload runs (its processes, or virtlogd for a guest's serial
 * console), so nothing notes when a line was written; instead its engine samples the log's size
 * once per WK_ENGINE_LOG_INDEX_MS and appends "<wall ms> <size>" to the index file whenever it
 * grew, meaning "by then the log held this many bytes". since and until become byte ranges of
 * the log from it, to the tick. Both engines keep one (process: <home>/log.idx; virt:
 * <state>/logs/<id>.idx).
 *
 * Files only, no state; the caller serialises the writes of one index.
 */
#ifndef WK_LOG_INDEX_H
#define WK_LOG_INDEX_H

#include <stdint.h>

#include "pv_status.h"

/* Appends the entry (ms, size) to the index at path (created); best effort. */
void wk_log_index_append(const char *path, int64_t ms, int64_t size);

/* The size at the index's last entry; -1 when it has none. */
int64_t wk_log_index_last_size(const char *path);

/* LogStream's byte range of the log between since_ms and until_ms (<= 0: open), as
 * wk_engine_log_range says: *start a byte offset, *end one too or -1 (to the end). INTERNAL
 * naming the index when it cannot be read; an index not yet written is an empty one. */
int wk_log_index_range(const char *path, int64_t since_ms, int64_t until_ms, int64_t *start,
                       int64_t *end, pv_status *st);

#endif
