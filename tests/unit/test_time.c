/* pv_time_parse: the three forms, their edges, and what is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "pv_time.h"

#define NOW 1796229307123LL /* 2026-12-02T16:35:07.123Z */

static int64_t ok(const char *text) {
    int64_t v = 0;
    pv_status st;
    if (pv_time_parse("since", text, NOW, &v, &st) != PV_OK) fail_msg("%s: %s", text, st.msg);
    return v;
}

static void test_rfc3339(void **state) {
    (void)state;
    assert_int_equal(ok("2026-12-02T16:35:07Z"), 1796229307000LL);
    assert_int_equal(ok("2026-12-02T16:35:07.5Z"), 1796229307500LL);
    assert_int_equal(ok("2026-12-02T16:35:07.123456789Z"), 1796229307123LL);
    assert_int_equal(ok("2026-12-02T18:35:07+02:00"), 1796229307000LL);
    assert_int_equal(ok("2026-12-02t14:05:07-02:30"), 1796229307000LL);
    assert_int_equal(ok("1970-01-01T00:00:00Z"), 0);
}

static void test_unix_and_durations(void **state) {
    (void)state;
    assert_int_equal(ok("1796229307"), 1796229307000LL);
    assert_int_equal(ok("1796229307.25"), 1796229307250LL);
    assert_int_equal(ok("10m"), NOW - 600000);
    assert_int_equal(ok("1h30m"), NOW - 5400000);
    assert_int_equal(ok("1.5h"), NOW - 5400000);
    assert_int_equal(ok("45s"), NOW - 45000);
    assert_int_equal(ok("500ms"), NOW - 500);
}

static void test_refused(void **state) {
    (void)state;
    const char *bad[] = {"",
                         "yesterday",
                         "2026-12-02",
                         "10mins",
                         "10",
                         "-5m",
                         "2026-12-02T16:35:07",
                         "1.x",
                         "2026-13-02T16:35:07Z",
                         "2026-12-02T16:35:07+0200",
                         "m",
                         "1796229307."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v;
        pv_status st;
        int rc = pv_time_parse("until", bad[i], NOW, &v, &st);
        if (strcmp(bad[i], "10") == 0) { /* bare digits are Unix seconds */
            assert_int_equal(rc, PV_OK);
            assert_int_equal(v, 10000);
            continue;
        }
        if (rc != PV_INVALID_ARGUMENT) fail_msg("\"%s\" was taken (%lld)", bad[i], (long long)v);
        assert_non_null(strstr(st.msg, "until: \""));
    }
}

/* The two clocks: wall time is the epoch's (within a second of time(2)), the monotonic one only
 * moves forward, by about the time slept. */
static void test_clocks(void **state) {
    (void)state;
    int64_t wall = pv_time_now_ms();
    int64_t epoch = (int64_t)time(NULL) * 1000;
    assert_true(wall >= epoch - 1000 && wall <= epoch + 2000);
    int64_t a = pv_time_mono_ms();
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    int64_t b = pv_time_mono_ms();
    assert_true(b - a >= 19);
    assert_true(pv_time_mono_ms() >= b);
}

/* pv_time_mono_after: now on the monotonic clock plus ms, the nanoseconds carried into
 * seconds. */
static void test_mono_after(void **state) {
    (void)state;
    for (int64_t ms = 0; ms <= 2999; ms += 137) {
        struct timespec before;
        clock_gettime(CLOCK_MONOTONIC, &before);
        struct timespec t = pv_time_mono_after(ms);
        struct timespec after;
        clock_gettime(CLOCK_MONOTONIC, &after);
        assert_true(t.tv_nsec >= 0 && t.tv_nsec < 1000000000L);
        int64_t ns = (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
        int64_t lo = (int64_t)before.tv_sec * 1000000000LL + before.tv_nsec + ms * 1000000LL;
        int64_t hi = (int64_t)after.tv_sec * 1000000000LL + after.tv_nsec + ms * 1000000LL;
        assert_true(ns >= lo && ns <= hi);
    }
}

/* A condition variable from pv_time_cond_init times out on a monotonic deadline. */
static void test_monotonic_cond(void **state) {
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv;
    assert_int_equal(pv_time_cond_init(&cv), 0);
    int64_t t0 = pv_time_mono_ms();
    struct timespec until = pv_time_mono_after(30);
    pthread_mutex_lock(&mu);
    int rc = pthread_cond_timedwait(&cv, &mu, &until);
    pthread_mutex_unlock(&mu);
    assert_int_equal(rc, ETIMEDOUT);
    int64_t waited = pv_time_mono_ms() - t0;
    /* a wall-clock cv would read the monotonic deadline as long past and return at once */
    assert_true(waited >= 29 && waited < 5000);
    pthread_cond_destroy(&cv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc3339),    cmocka_unit_test(test_unix_and_durations),
        cmocka_unit_test(test_refused),    cmocka_unit_test(test_clocks),
        cmocka_unit_test(test_mono_after), cmocka_unit_test(test_monotonic_cond),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
