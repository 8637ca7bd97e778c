/*
 * Unit tests of pv_json: present fields, missing ones, fields of another type and NULL objects
 * read as their defaults; the writer prints each real in its shortest exact form and everything
 * else as jansson's compact output does.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_json.h"

static void test_reads_with_defaults(void **state) {
    (void)state;
    json_t *o = json_pack("{s:s, s:I, s:i, s:n}", "name", "vol-1", "size", (json_int_t)1 << 40,
                          "format", 2, "gone");
    assert_string_equal(pv_json_str(o, "name"), "vol-1");
    assert_string_equal(pv_json_str(o, "missing"), "");
    assert_string_equal(pv_json_str(o, "size"), ""); /* an integer is no string */
    assert_string_equal(pv_json_str_or(o, "missing", "raw"), "raw");
    assert_string_equal(pv_json_str_or(o, "name", "raw"), "vol-1");
    assert_int_equal(pv_json_int(o, "size"), (int64_t)1 << 40);
    assert_int_equal(pv_json_int(o, "name"), 0);
    assert_int_equal(pv_json_int(o, "gone"), 0);
    assert_string_equal(pv_json_str(NULL, "name"), "");
    assert_int_equal(pv_json_int(NULL, "size"), 0);
    json_decref(o);
}

static void expect_real(double d, const char *want) {
    char buf[32];
    int n = pv_json_real_text(d, buf, sizeof buf);
    if (n < 0 || strcmp(buf, want) != 0)
        fail_msg("%.17g printed as \"%s\", want \"%s\"", d, n < 0 ? "(error)" : buf, want);
    assert_int_equal((size_t)n, strlen(want));
}

static void test_reals_shortest(void **state) {
    (void)state;
    expect_real(0.1, "0.1");
    expect_real(1.5, "1.5");
    expect_real(0.1 + 0.2, "0.30000000000000004"); /* needs all 17 digits: kept */
    expect_real(2.0 / 3.0, "0.6666666666666666");
    expect_real(4.0, "4.0"); /* stays a real when read back */
    expect_real(0.0, "0.0");
    expect_real(-0.25, "-0.25");
    expect_real(1e-7, "1e-7");
    expect_real(-2.5e-10, "-2.5e-10");
    expect_real(1e300, "1e300");
    expect_real(1e21, "1e21");
    expect_real(123456789.0, "123456789.0");
    expect_real(1.2345678901234568e20, "1.2345678901234568e20");
    expect_real(DBL_MAX, "1.7976931348623157e308");
    expect_real(5e-324, "5e-324"); /* the smallest denormal */
    char buf[32];
    assert_int_equal(pv_json_real_text(0.0 / 0.0, buf, sizeof buf), -1);
    assert_int_equal(pv_json_real_text(1.0 / 0.0, buf, sizeof buf), -1);
    assert_int_equal(pv_json_real_text(1.5, buf, 8), -1); /* too small a buffer */
}

/* Decimals of at most three places print as written (k/1000: "0.005", "1.234", "12.0"). */
static void test_reals_short_decimals(void **state) {
    (void)state;
    for (int k = 0; k < 200000; k++) {
        char want[32];
        if (k % 1000 == 0) {
            snprintf(want, sizeof want, "%d.0", k / 1000);
        } else {
            int frac = k % 1000, digits = 3;
            while (frac % 10 == 0)
                frac /= 10, digits--;
            snprintf(want, sizeof want, "%d.%0*d", k / 1000, digits, frac);
        }
        char buf[32];
        pv_json_real_text(k / 1000.0, buf, sizeof buf);
        if (strcmp(buf, want) != 0) fail_msg("%d/1000 printed as %s, want %s", k, buf, want);
    }
}

/* Any double reads back exactly, never longer than %.17g prints it. */
static void test_reals_read_back(void **state) {
    (void)state;
    uint64_t x = 0x9E3779B97F4A7C15u;
    int done = 0;
    while (done < 100000) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double d;
        memcpy(&d, &x, sizeof d);
        char buf[32], full[40];
        int n = pv_json_real_text(d, buf, sizeof buf);
        if (d != d || d - d != 0) {
            assert_int_equal(n, -1);
            continue;
        }
        if (n < 0 || strtod(buf, NULL) != d) fail_msg("%.17g printed as %s", d, buf);
        snprintf(full, sizeof full, "%.17g", d);
        if ((size_t)n > strlen(full) + 2) /* ".0" may be added to an integral one */
            fail_msg("%.17g printed as %s, longer than %s", d, buf, full);
        done++;
    }
}

static void expect_dump(const json_t *v, size_t flags, const char *want) {
    char *got = pv_json_dumps(v, flags);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_documents(void **state) {
    (void)state;
    json_error_t jerr;
    const char *text =
        "{\"z\":[1,0.1,\"q\\\"\\\\\\n\\t\\b\\f\\r\\u0001\\u001F/\xc3\xa9\",true,false,"
        "null],\"a\":{},\"m\":[],\"cpu\":{\"cpu_request\":0.30000000000000004,"
        "\"cpu_limit\":2.0,\"memory\":-9223372036854775808}}";
    json_t *doc = json_loads(text, 0, &jerr);
    assert_non_null(doc);
    /* insertion order, compact, strings escaped as jansson does */
    expect_dump(doc, 0, text);
    expect_dump(doc, JSON_COMPACT, text);
    char *sorted = pv_json_dumps(doc, JSON_SORT_KEYS);
    assert_non_null(sorted);
    assert_string_equal(sorted,
                        "{\"a\":{},\"cpu\":{\"cpu_limit\":2.0,\"cpu_request\":0.30000000000000004,"
                        "\"memory\":-9223372036854775808},\"m\":[],\"z\":[1,0.1,\"q\\\"\\\\\\n\\t"
                        "\\b\\f\\r\\u0001\\u001F/\xc3\xa9\",true,false,null]}");
    /* the same text as jansson's but for the reals: equal once both are read back */
    json_t *back = json_loads(sorted, 0, &jerr);
    assert_true(json_equal(back, doc));
    json_decref(back);
    json_object_del(doc, "cpu");
    json_array_remove(json_object_get(doc, "z"), 1);
    char *mine = pv_json_dumps(doc, JSON_SORT_KEYS),
         *theirs = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(mine, theirs);
    free(mine);
    free(theirs);
    free(sorted);
    json_decref(doc);
}

static void test_refusals(void **state) {
    (void)state;
    json_t *r = json_real(0.1);
    assert_null(pv_json_dumps(r, 0)); /* a bare value needs JSON_ENCODE_ANY, as in jansson */
    expect_dump(r, JSON_ENCODE_ANY, "0.1");
    json_t *o = json_object();
    assert_null(pv_json_dumps(o, JSON_INDENT(2)));
    assert_null(pv_json_dumps(o, JSON_ENSURE_ASCII));
    assert_null(pv_json_dumps(NULL, JSON_ENCODE_ANY));
    json_t *deep = json_array(), *cur = deep;
    for (int i = 0; i < 3000; i++) {
        json_t *next = json_array();
        json_array_append_new(cur, next);
        cur = next;
    }
    assert_null(pv_json_dumps(deep, 0));
    json_decref(deep);
    json_decref(o);
    json_decref(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reads_with_defaults),
                                       cmocka_unit_test(test_reals_shortest),
                                       cmocka_unit_test(test_reals_short_decimals),
                                       cmocka_unit_test(test_reals_read_back),
                                       cmocka_unit_test(test_documents),
                                       cmocka_unit_test(test_refusals)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
