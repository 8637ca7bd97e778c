/*
 * Unit tests of pv_strv: adds (copied, taken, formatted), the NULL terminator execv needs,
 * truncation, sorted lookups, and failures that free what they were handed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "pv_strv.h"

static void test_adds_and_terminator(void **state) {
    (void)state;
    pv_strv s = {0};
    assert_int_equal(pv_strv_add(&s, "a"), 0);
    assert_int_equal(pv_strv_take(&s, strdup("b")), 0);
    assert_int_equal(pv_strv_addf(&s, "%s=%d", "c", 3), 0);
    assert_int_equal(pv_strv_add(&s, NULL), 0);
    for (int i = 0; i < 100; i++) /* past several reallocations */
        assert_int_equal(pv_strv_addf(&s, "x%d", i), 0);
    assert_int_equal(s.n, 104);
    assert_string_equal(s.v[0], "a");
    assert_string_equal(s.v[1], "b");
    assert_string_equal(s.v[2], "c=3");
    assert_string_equal(s.v[3], "");
    assert_string_equal(s.v[103], "x99");
    assert_null(s.v[104]);
    assert_false(s.oom);
    pv_strv_truncate(&s, 2);
    assert_int_equal(s.n, 2);
    assert_null(s.v[2]);
    pv_strv_free(&s);
    assert_int_equal(s.n, 0);
    assert_null(s.v);
    assert_int_equal(pv_strv_add(&s, "again"), 0); /* reusable */
    pv_strv_free(&s);
}

static void test_take_null_is_a_failure(void **state) {
    (void)state;
    pv_strv s = {0};
    assert_int_equal(pv_strv_take(&s, NULL), -1);
    assert_true(s.oom);
    assert_int_equal(s.n, 0);
    pv_strv_free(&s);
}

static void test_sorted_lookup(void **state) {
    (void)state;
    pv_strv s = {0};
    const char *in[] = {"node-b", "node-a", "node-c", "vol-1"};
    for (size_t i = 0; i < 4; i++)
        pv_strv_add(&s, in[i]);
    assert_false(pv_strv_has(&(pv_strv){0}, "x"));
    pv_strv_sort(&s);
    assert_string_equal(s.v[0], "node-a");
    assert_true(pv_strv_has(&s, "node-c"));
    assert_true(pv_strv_has(&s, "vol-1"));
    assert_false(pv_strv_has(&s, "node"));
    pv_strv_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adds_and_terminator),
        cmocka_unit_test(test_take_null_is_a_failure),
        cmocka_unit_test(test_sorted_lookup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
