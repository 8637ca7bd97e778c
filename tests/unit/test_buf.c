/* pv_buf: appends keep every byte, in order, across growth; a format that cannot be printed
 * marks the buffer failed and later appends do nothing; pv_buf_free leaves it empty. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pv_buf.h"

static void test_appends_grow(void **state) {
    (void)state;
    pv_buf b = {0};
    pv_buf_addf(&b, "%s", "");
    assert_non_null(b.s);
    assert_string_equal(b.s, "");
    assert_int_equal(b.len, 0);
    pv_buf_addf(&b, "<pool type='%s'>", "dir");
    assert_string_equal(b.s, "<pool type='dir'>");
    /* past the first allocation: every line kept, in order */
    for (int i = 0; i < 1000; i++)
        pv_buf_addf(&b, "%04d\n", i);
    assert_false(b.oom);
    assert_int_equal(b.len, strlen("<pool type='dir'>") + 1000 * 5);
    assert_int_equal(strlen(b.s), b.len);
    assert_true(b.cap > b.len);
    assert_memory_equal(b.s + strlen("<pool type='dir'>"), "0000\n0001\n", 10);
    assert_string_equal(b.s + b.len - 5, "0999\n");
    /* one append larger than doubling once */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    size_t before = b.len;
    pv_buf_addf(&b, "%s", big);
    assert_int_equal(b.len, before + sizeof big - 1);
    assert_string_equal(b.s + before, big);
    pv_buf_free(&b);
    assert_null(b.s);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
}

static void test_failure_sticks(void **state) {
    (void)state;
    pv_buf b = {0};
    pv_buf_addf(&b, "kept ");
    b.oom = true; /* as after a failed allocation */
    pv_buf_addf(&b, "dropped");
    assert_string_equal(b.s, "kept ");
    assert_int_equal(b.len, 5);
    pv_buf_free(&b);
    assert_false(b.oom);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_grow),
        cmocka_unit_test(test_failure_sticks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
