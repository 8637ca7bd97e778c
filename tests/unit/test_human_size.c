/*
 * Unit tests of pv_res_size_parse: binary units, suffix spellings, fractions, and the refusals
 * (empty, negative, malformed, overflowing) with their messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "pv_res.h"

static int64_t size_of(const char *text) {
    int64_t v = -1;
    pv_status st;
    if (pv_res_size_parse(text, &v, &st) != PV_OK) fail_msg("%s: %s", text, st.msg);
    return v;
}

static void refused(const char *text, const char *msg) {
    int64_t v = 7;
    pv_status st;
    assert_int_equal(pv_res_size_parse(text, &v, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(st.code, PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, msg);
    assert_int_equal(v, 0);
}

static void test_units_are_binary(void **state) {
    (void)state;
    assert_int_equal(size_of("0"), 0);
    assert_int_equal(size_of("123"), 123);
    assert_int_equal(size_of("1K"), 1024);
    assert_int_equal(size_of("512M"), 512LL << 20);
    assert_int_equal(size_of("4G"), 4LL << 30);
    assert_int_equal(size_of("1T"), 1LL << 40);
    assert_int_equal(size_of("2P"), 2LL << 50);
    assert_int_equal(size_of("7E"), 7LL << 60);
}

static void test_spellings(void **state) {
    (void)state;
    assert_int_equal(size_of("4g"), 4LL << 30);
    assert_int_equal(size_of("4GB"), 4LL << 30);
    assert_int_equal(size_of("4GiB"), 4LL << 30);
    assert_int_equal(size_of("4gib"), 4LL << 30);
    assert_int_equal(size_of("100B"), 100);
    assert_int_equal(size_of(" 8G "), 8LL << 30);
    assert_int_equal(size_of("+1K"), 1024);
    assert_int_equal(size_of("1.5G"), 3LL << 29);
    assert_int_equal(size_of("0.5K"), 512);
    assert_int_equal(size_of("9223372036854775807"), INT64_MAX);
}

static void test_refusals(void **state) {
    (void)state;
    refused("", "\"\" is not a size");
    refused(NULL, "\"\" is not a size");
    refused("-1G", "\"-1G\" must not be negative");
    refused("-5", "\"-5\" must not be negative");
    refused("G", "\"G\" is not a size");
    refused("4X", "\"4X\" is not a size");
    refused("4 G", "\"4 G\" is not a size");
    refused("4GG", "\"4GG\" is not a size");
    refused("1.", "\"1.\" is not a size");
    refused("0x10", "\"0x10\" is not a size");
    refused("8E", "\"8E\" is too large");
    refused("9223372036854775808", "\"9223372036854775808\" is too large");
    refused("99999999999999999999999", "\"99999999999999999999999\" is too large");
    refused("8192P", "\"8192P\" is too large");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_are_binary),
        cmocka_unit_test(test_spellings),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
