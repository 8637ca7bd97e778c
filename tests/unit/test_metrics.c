/* pv_metrics: label escaping, counters, histograms and collectors in the text format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pv_metrics.h"

static void test_labels(void **state) {
    (void)state;
    char buf[128];
    const char *kv[] = {"a", "x\"y", "b", "back\\slash\nline"};
    pv_metrics_labels(buf, sizeof buf, 2, kv);
    assert_string_equal(buf, "a=\"x\\\"y\",b=\"back\\\\slash\\nline\"");
    char tiny[8];
    pv_metrics_labels(tiny, sizeof tiny, 2, kv); /* truncated, never overflowed */
    assert_true(strlen(tiny) < sizeof tiny);
}

static void collect(void *arg, pv_metrics_text *t) {
    (void)arg;
    pv_metrics_text_family(t, "g_bytes", "gauge", "A gauge.");
    pv_metrics_text_value(t, "g_bytes", "pool=\"p\"", 42);
}

static void test_render(void **state) {
    (void)state;
    pv_metrics *m = pv_metrics_new();
    pv_metrics_count(m, "c_total", "A counter.", "k=\"v\"", 2);
    pv_metrics_count(m, "c_total", "A counter.", "k=\"v\"", 1);
    pv_metrics_count(m, "c_total", "A counter.", "k=\"w\"", -5); /* counters never go down */
    pv_metrics_observe(m, "h_seconds", "A histogram.", "", 0.02);
    pv_metrics_observe(m, "h_seconds", "A histogram.", "", 3);
    pv_metrics_observe(m, "c_total", "wrong kind", "", 1); /* ignored: c_total is a counter */
    char *text = NULL;
    size_t len = 0;
    pv_status st;
    assert_int_equal(pv_metrics_render(m, collect, NULL, &text, &len, &st), PV_OK);
    assert_int_equal(strlen(text), len);
    assert_non_null(strstr(text, "# TYPE c_total counter\n"));
    assert_non_null(strstr(text, "c_total{k=\"v\"} 3\n"));
    assert_null(strstr(text, "k=\"w\"")); /* a negative add is refused outright */
    assert_non_null(strstr(text, "# TYPE h_seconds histogram\n"));
    assert_non_null(strstr(text, "h_seconds_bucket{le=\"0.01\"} 0\n"));
    assert_non_null(strstr(text, "h_seconds_bucket{le=\"0.025\"} 1\n"));
    assert_non_null(strstr(text, "h_seconds_bucket{le=\"5\"} 2\n"));
    assert_non_null(strstr(text, "h_seconds_bucket{le=\"+Inf\"} 2\n"));
    assert_non_null(strstr(text, "h_seconds_sum 3.02"));
    assert_non_null(strstr(text, "h_seconds_count 2\n"));
    assert_non_null(strstr(text, "# TYPE g_bytes gauge\ng_bytes{pool=\"p\"} 42\n"));
    free(text);
    pv_metrics_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
