/*
 * pv_log: one line per event on stderr, easy for people and for grep.
 *
 *   2026-12-02T12:00:00.123Z INFO gateway[4242] req=3f2a method=/pb.CoreRPC/Info code=OK ms=0.4
 *
 * The message is free text, by convention key=value pairs (logfmt) with the event first. Each line
 * is written with a single write(2), so lines from threads and processes never interleave.
 * The level and component are process-wide (set once at start, before threads).
 */
#ifndef PV_LOG_H
#define PV_LOG_H

#include <stdbool.h>

typedef enum { PV_LOG_DEBUG = 0, PV_LOG_INFO, PV_LOG_WARN, PV_LOG_ERROR } pv_log_level;

/* component: a short name ("gateway", "worker", ...), copied. */
void pv_log_init(const char *component, pv_log_level level);
void pv_log_set_level(pv_log_level level);
bool pv_log_enabled(pv_log_level level);

/* "debug", "info", "warn"/"warning", "error" (any case); returns 0 or -1 when unknown. */
int pv_log_level_parse(const char *name, pv_log_level *out);
const char *pv_log_level_name(pv_log_level level);

void pv_log_write(pv_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define pv_debug(...)                                                                              \
    do {                                                                                           \
        if (pv_log_enabled(PV_LOG_DEBUG)) pv_log_write(PV_LOG_DEBUG, __VA_ARGS__);                 \
    } while (0)
#define pv_info(...) pv_log_write(PV_LOG_INFO, __VA_ARGS__)
#define pv_warn(...) pv_log_write(PV_LOG_WARN, __VA_ARGS__)
#define pv_error(...) pv_log_write(PV_LOG_ERROR, __VA_ARGS__)

#endif
