/*
 * pv_log: one line per event on stderr.
 *
 * Each line is built in a stack buffer and handed to a single write(2): writes of at most
 * PIPE_BUF (4096) bytes to a pipe are atomic, so lines from threads and from processes sharing
 * one log file never interleave. That is why a line is capped at 4 KiB and a longer message is
 * cut and ends with "...". Newlines inside a message become spaces, so one event stays one line
 * for grep.
 */
#include "pv_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096
#define COMPONENT_MAX 32

static char log_component[COMPONENT_MAX] = "pivirt";
static pv_log_level log_level = PV_LOG_INFO;

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void pv_log_init(const char *component, pv_log_level level) {
    if (component != NULL && component[0] != '\0')
        snprintf(log_component, sizeof(log_component), "%s", component);
    pv_log_set_level(level);
}

void pv_log_set_level(pv_log_level level) {
    if (level < PV_LOG_DEBUG) level = PV_LOG_DEBUG;
    if (level > PV_LOG_ERROR) level = PV_LOG_ERROR;
    log_level = level;
}

bool pv_log_enabled(pv_log_level level) {
    return level >= log_level;
}

int pv_log_level_parse(const char *name, pv_log_level *out) {
    static const struct {
        const char *name;
        pv_log_level level;
    } names[] = {
        {"debug", PV_LOG_DEBUG},  {"info", PV_LOG_INFO},   {"warn", PV_LOG_WARN},
        {"warning", PV_LOG_WARN}, {"error", PV_LOG_ERROR},
    };
    if (name == NULL) return -1;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            if (out != NULL) *out = names[i].level;
            return 0;
        }
    }
    return -1;
}

const char *pv_log_level_name(pv_log_level level) {
    if (level < PV_LOG_DEBUG || level > PV_LOG_ERROR) return "UNKNOWN";
    return level_names[level];
}

/* "2026-12-02T12:00:00.123Z" into buf; returns its length. */
static int format_time(char *buf, size_t size) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, size, "%Y-%m-%dT%H:%M:%S", &tm);
    int m = snprintf(buf + n, size - n, ".%03ldZ", ts.tv_nsec / 1000000);
    return (int)n + m;
}

static void write_all(const char *buf, size_t len) {
    while (len > 0) {
        ssize_t w = write(STDERR_FILENO, buf, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* nowhere else to report a failing stderr */
        buf += w;
        len -= (size_t)w;
    }
}

void pv_log_write(pv_log_level level, const char *fmt, ...) {
    if (!pv_log_enabled(level)) return;
    int saved_errno = errno; /* callers log and then inspect errno */

    char line[LOG_LINE_MAX];
    char ts[40];
    format_time(ts, sizeof(ts));
    int head = snprintf(line, sizeof(line), "%s %s %s[%ld] ", ts, pv_log_level_name(level),
                        log_component, (long)getpid());

    va_list ap;
    va_start(ap, fmt);
    /* The newline later takes the place of vsnprintf's NUL, so a full line is exactly 4096. */
    int want = vsnprintf(line + head, sizeof(line) - (size_t)head, fmt, ap);
    va_end(ap);
    if (want < 0) want = 0;

    size_t len = (size_t)head + (size_t)want;
    if (len > sizeof(line) - 1) {
        len = sizeof(line) - 1;
        memcpy(line + len - 3, "...", 3);
    }
    for (size_t i = (size_t)head; i < len; i++) {
        if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
    }
    line[len++] = '\n';
    write_all(line, len);
    errno = saved_errno;
}
