/*
 * Unit tests of pv_log: the exact shape of a line (UTC time with milliseconds, level, component,
 * pid), level filtering, the 4 KiB cap, one line per event, and that lines written by many
 * threads at once arrive whole. stderr is captured by pointing fd 2 at a temp file or a pipe.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pv_log.h"

#define TIME_RE "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"

/* fd 2 goes to a fresh temp file until capture_end, which returns what was written. */
static int saved_fd = -1;
static int capture_fd = -1;

static void capture_begin(void) {
    char path[32];
    /* mkstemp's template ends in six 'X' characters. */
    snprintf(path, sizeof(path), "/tmp/pv_test_log.%c%c%c%c%c%c", 'X', 'X', 'X', 'X', 'X', 'X');
    capture_fd = mkstemp(path);
    assert_true(capture_fd >= 0);
    unlink(path);
    saved_fd = dup(STDERR_FILENO);
    assert_true(saved_fd >= 0);
    assert_int_equal(dup2(capture_fd, STDERR_FILENO), STDERR_FILENO);
}

/* Returns a malloc'd NUL-terminated copy of the captured bytes; *len_out gets its length. */
static char *capture_end(size_t *len_out) {
    assert_int_equal(dup2(saved_fd, STDERR_FILENO), STDERR_FILENO);
    close(saved_fd);
    off_t size = lseek(capture_fd, 0, SEEK_END);
    assert_true(size >= 0);
    char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(pread(capture_fd, buf, (size_t)size, 0), size);
    buf[size] = '\0';
    close(capture_fd);
    if (len_out != NULL) *len_out = (size_t)size;
    return buf;
}

static void assert_matches(const char *text, const char *pattern) {
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int rc = regexec(&re, text, 0, NULL, 0);
    if (rc != 0) print_error("%s\ndoes not match\n%s\n", text, pattern);
    regfree(&re);
    assert_int_equal(rc, 0);
}

static int setup(void **state) {
    (void)state;
    pv_log_init("gateway", PV_LOG_INFO);
    return 0;
}

static void test_line_shape(void **state) {
    (void)state;
    capture_begin();
    pv_info("event=start addr=%s n=%d", "localhost:8443", 3);
    char *out = capture_end(NULL);
    char pattern[256];
    snprintf(pattern, sizeof(pattern),
             "^" TIME_RE " INFO gateway\\[%ld\\] event=start addr=localhost:8443 n=3\n$",
             (long)getpid());
    assert_matches(out, pattern);
    free(out);
}

static void test_time_is_utc_now(void **state) {
    (void)state;
    /* time(2) reads the coarse clock, which may lag the logger's by a tick: read the same one */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t before = ts.tv_sec;
    capture_begin();
    pv_info("tick");
    char *out = capture_end(NULL);
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t after = ts.tv_sec;
    struct tm tm = {0};
    char *rest = strptime(out, "%Y-%m-%dT%H:%M:%S", &tm);
    assert_non_null(rest);
    time_t logged = timegm(&tm); /* the line is UTC: read it back as UTC */
    assert_true(logged >= before && logged <= after);
    free(out);
}

static void test_every_level_name(void **state) {
    (void)state;
    pv_log_set_level(PV_LOG_DEBUG);
    capture_begin();
    pv_debug("a");
    pv_info("b");
    pv_warn("c");
    pv_error("d");
    char *out = capture_end(NULL);
    char pattern[512];
    long pid = (long)getpid();
    snprintf(pattern, sizeof(pattern),
             "^" TIME_RE " DEBUG gateway\\[%ld\\] a\n" TIME_RE " INFO gateway\\[%ld\\] b\n" TIME_RE
             " WARN gateway\\[%ld\\] c\n" TIME_RE " ERROR gateway\\[%ld\\] d\n$",
             pid, pid, pid, pid);
    assert_matches(out, pattern);
    free(out);
}

static int evaluated;
static int count_evaluation(void) {
    return ++evaluated;
}

static void test_level_filters(void **state) {
    (void)state;
    pv_log_set_level(PV_LOG_WARN);
    assert_false(pv_log_enabled(PV_LOG_DEBUG));
    assert_false(pv_log_enabled(PV_LOG_INFO));
    assert_true(pv_log_enabled(PV_LOG_WARN));
    assert_true(pv_log_enabled(PV_LOG_ERROR));
    evaluated = 0;
    capture_begin();
    pv_debug("n=%d", count_evaluation());
    pv_info("dropped");
    pv_warn("kept");
    size_t len;
    char *out = capture_end(&len);
    assert_int_equal(evaluated, 0); /* pv_debug does not even format when disabled */
    assert_null(strstr(out, "dropped"));
    assert_non_null(strstr(out, " WARN gateway["));
    assert_int_equal(out[len - 1], '\n');
    assert_ptr_equal(strchr(out, '\n'), out + len - 1); /* exactly one line */
    free(out);
}

static void test_long_line_truncated_to_4k(void **state) {
    (void)state;
    size_t n = 10000;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, 'x', n);
    big[n] = '\0';
    capture_begin();
    pv_error("%s", big);
    size_t len;
    char *out = capture_end(&len);
    assert_int_equal(len, 4096);
    assert_memory_equal(out + len - 4, "...\n", 4);
    assert_ptr_equal(strchr(out, '\n'), out + len - 1);
    assert_matches(out, "^" TIME_RE " ERROR gateway\\[[0-9]+\\] x+\\.\\.\\.\n$");
    free(out);
    free(big);
}

static void test_line_that_just_fits_is_whole(void **state) {
    (void)state;
    /* Measure the header, then log a message that fills the line to exactly 4096 bytes. */
    capture_begin();
    pv_info("%s", "");
    size_t head;
    char *out = capture_end(&head);
    free(out);
    head -= 1; /* the newline */
    size_t n = 4096 - 1 - head;
    char *msg = malloc(n + 1);
    assert_non_null(msg);
    memset(msg, 'z', n);
    msg[n] = '\0';
    capture_begin();
    pv_info("%s", msg);
    size_t len;
    out = capture_end(&len);
    assert_int_equal(len, 4096);
    assert_memory_equal(out + len - 4, "zzz\n", 4);
    free(out);
    free(msg);
}

static void test_newlines_in_message_stay_one_line(void **state) {
    (void)state;
    capture_begin();
    pv_warn("first\nsecond\r\nthird");
    char *out = capture_end(NULL);
    assert_matches(out, "^" TIME_RE " WARN gateway\\[[0-9]+\\] first second  third\n$");
    free(out);
}

static void test_errno_preserved(void **state) {
    (void)state;
    capture_begin();
    errno = ENOENT;
    pv_info("x");
    int e = errno;
    char *out = capture_end(NULL);
    free(out);
    assert_int_equal(e, ENOENT);
}

static void test_level_parse(void **state) {
    (void)state;
    pv_log_level l = PV_LOG_ERROR;
    assert_int_equal(pv_log_level_parse("debug", &l), 0);
    assert_int_equal(l, PV_LOG_DEBUG);
    assert_int_equal(pv_log_level_parse("INFO", &l), 0);
    assert_int_equal(l, PV_LOG_INFO);
    assert_int_equal(pv_log_level_parse("Warn", &l), 0);
    assert_int_equal(l, PV_LOG_WARN);
    l = PV_LOG_DEBUG;
    assert_int_equal(pv_log_level_parse("warning", &l), 0);
    assert_int_equal(l, PV_LOG_WARN);
    assert_int_equal(pv_log_level_parse("ERROR", &l), 0);
    assert_int_equal(l, PV_LOG_ERROR);
    assert_int_equal(pv_log_level_parse("verbose", &l), -1);
    assert_int_equal(pv_log_level_parse("", &l), -1);
    assert_int_equal(pv_log_level_parse(NULL, &l), -1);
    assert_int_equal(l, PV_LOG_ERROR);
    assert_string_equal(pv_log_level_name(PV_LOG_DEBUG), "DEBUG");
    assert_string_equal(pv_log_level_name(PV_LOG_INFO), "INFO");
    assert_string_equal(pv_log_level_name(PV_LOG_WARN), "WARN");
    assert_string_equal(pv_log_level_name(PV_LOG_ERROR), "ERROR");
}

#define N_THREADS 4
#define LINES_PER_THREAD 200
#define MSG_LEN 3000

static void *writer(void *arg) {
    char msg[MSG_LEN + 1];
    memset(msg, 'a' + (int)(intptr_t)arg, MSG_LEN);
    msg[MSG_LEN] = '\0';
    for (int i = 0; i < LINES_PER_THREAD; i++)
        pv_info("%s", msg);
    return NULL;
}

/* A line is whole when its message is one letter repeated MSG_LEN times. */
static void check_line(const char *line, size_t len, int *per_thread) {
    const char *msg = memchr(line, ']', len);
    assert_non_null(msg);
    msg += 2;
    size_t n = len - (size_t)(msg - line);
    assert_int_equal(n, MSG_LEN);
    size_t same = 1;
    while (same < n && msg[same] == msg[0])
        same++;
    assert_int_equal(same, n);
    int t = msg[0] - 'a';
    assert_true(t >= 0 && t < N_THREADS);
    per_thread[t]++;
}

static void test_threads_never_interleave(void **state) {
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    assert_int_equal(dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
    close(fds[1]);

    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, writer, (void *)(intptr_t)i), 0);

    /* Read concurrently: the pipe holds far less than the 2.4 MB the writers produce. */
    size_t cap = (size_t)N_THREADS * LINES_PER_THREAD * 4096, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t expected_lines = (size_t)N_THREADS * LINES_PER_THREAD, lines = 0;
    while (lines < expected_lines) {
        ssize_t r = read(fds[0], buf + len, cap - len);
        assert_true(r > 0);
        for (ssize_t i = 0; i < r; i++)
            lines += buf[len + (size_t)i] == '\n';
        len += (size_t)r;
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    close(fds[0]);

    int per_thread[N_THREADS] = {0};
    for (char *p = buf; p < buf + len;) {
        char *nl = memchr(p, '\n', (size_t)(buf + len - p));
        assert_non_null(nl);
        check_line(p, (size_t)(nl - p), per_thread);
        p = nl + 1;
    }
    for (int i = 0; i < N_THREADS; i++)
        assert_int_equal(per_thread[i], LINES_PER_THREAD);
    free(buf);
}

static void test_component_is_copied(void **state) {
    (void)state;
    char name[16];
    snprintf(name, sizeof(name), "worker");
    pv_log_init(name, PV_LOG_INFO);
    snprintf(name, sizeof(name), "changed");
    capture_begin();
    pv_info("x");
    char *out = capture_end(NULL);
    assert_matches(out, "^" TIME_RE " INFO worker\\[[0-9]+\\] x\n$");
    free(out);
    pv_log_init("gateway", PV_LOG_INFO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_line_shape, setup),
        cmocka_unit_test_setup(test_time_is_utc_now, setup),
        cmocka_unit_test_setup(test_every_level_name, setup),
        cmocka_unit_test_setup(test_level_filters, setup),
        cmocka_unit_test_setup(test_long_line_truncated_to_4k, setup),
        cmocka_unit_test_setup(test_line_that_just_fits_is_whole, setup),
        cmocka_unit_test_setup(test_newlines_in_message_stay_one_line, setup),
        cmocka_unit_test_setup(test_errno_preserved, setup),
        cmocka_unit_test_setup(test_level_parse, setup),
        cmocka_unit_test_setup(test_threads_never_interleave, setup),
        cmocka_unit_test_setup(test_component_is_copied, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
