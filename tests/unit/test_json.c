/*
 * Unit tests of pv_json: present fields, missing ones, fields of another type and NULL objects
 * read as their defaults.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reads_with_defaults)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
