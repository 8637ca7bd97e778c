/*
 * Unit tests of pv_status: code names both ways for every code, message formatting and
 * truncation, and prefixing that keeps the code.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "pv_status.h"

static const struct {
    int code;
    const char *name;
} all_codes[] = {
    {PV_OK, "OK"},
    {PV_CANCELLED, "CANCELLED"},
    {PV_UNKNOWN, "UNKNOWN"},
    {PV_INVALID_ARGUMENT, "INVALID_ARGUMENT"},
    {PV_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"},
    {PV_NOT_FOUND, "NOT_FOUND"},
    {PV_ALREADY_EXISTS, "ALREADY_EXISTS"},
    {PV_PERMISSION_DENIED, "PERMISSION_DENIED"},
    {PV_RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED"},
    {PV_FAILED_PRECONDITION, "FAILED_PRECONDITION"},
    {PV_ABORTED, "ABORTED"},
    {PV_OUT_OF_RANGE, "OUT_OF_RANGE"},
    {PV_UNIMPLEMENTED, "UNIMPLEMENTED"},
    {PV_INTERNAL, "INTERNAL"},
    {PV_UNAVAILABLE, "UNAVAILABLE"},
    {PV_DATA_LOSS, "DATA_LOSS"},
    {PV_UNAUTHENTICATED, "UNAUTHENTICATED"},
};
#define N_ALL (sizeof(all_codes) / sizeof(all_codes[0]))

static void test_code_numbers_match_grpc(void **state) {
    (void)state;
    assert_int_equal(N_ALL, 17);
    for (size_t i = 0; i < N_ALL; i++)
        assert_int_equal(all_codes[i].code, (int)i);
}

static void test_code_name_every_code(void **state) {
    (void)state;
    for (size_t i = 0; i < N_ALL; i++)
        assert_string_equal(pv_code_name(all_codes[i].code), all_codes[i].name);
}

static void test_code_name_out_of_range_is_unknown(void **state) {
    (void)state;
    assert_string_equal(pv_code_name(17), "UNKNOWN");
    assert_string_equal(pv_code_name(-1), "UNKNOWN");
    assert_string_equal(pv_code_name(1021), "UNKNOWN");
}

static void test_code_parse_every_code(void **state) {
    (void)state;
    for (size_t i = 0; i < N_ALL; i++) {
        int code = -1;
        assert_int_equal(pv_code_parse(all_codes[i].name, strlen(all_codes[i].name), &code), 0);
        assert_int_equal(code, all_codes[i].code);
    }
}

static void test_code_parse_uses_len_not_nul(void **state) {
    (void)state;
    int code = -1;
    assert_int_equal(pv_code_parse("NOT_FOUND=5", 9, &code), 0);
    assert_int_equal(code, PV_NOT_FOUND);
}

static void test_code_parse_rejects_non_codes(void **state) {
    (void)state;
    int code = 42;
    assert_int_equal(pv_code_parse("not_found", 9, &code), -1);
    assert_int_equal(pv_code_parse("NOT", 3, &code), -1);
    assert_int_equal(pv_code_parse("OK ", 3, &code), -1);
    assert_int_equal(pv_code_parse("", 0, &code), -1);
    assert_int_equal(pv_code_parse("NOT_FOUNDX", 10, &code), -1);
    assert_int_equal(pv_code_parse(NULL, 0, &code), -1);
    assert_int_equal(code, 42); /* untouched on failure */
}

static void test_set_formats_and_returns_code(void **state) {
    (void)state;
    pv_status st;
    pv_status_clear(&st);
    assert_int_equal(pv_status_set(&st, PV_NOT_FOUND, "node %s: %d", "n1", 7), PV_NOT_FOUND);
    assert_int_equal(st.code, PV_NOT_FOUND);
    assert_string_equal(st.msg, "node n1: 7");
}

static void test_set_null_status_returns_code(void **state) {
    (void)state;
    assert_int_equal(pv_status_set(NULL, PV_ABORTED, "x"), PV_ABORTED);
}

static void test_set_truncates_long_message(void **state) {
    (void)state;
    char big[2000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    pv_status st;
    pv_status_set(&st, PV_INTERNAL, "%s", big);
    assert_int_equal(strlen(st.msg), PV_STATUS_MSG_MAX - 1);
    assert_int_equal(st.code, PV_INTERNAL);
}

static void test_clear(void **state) {
    (void)state;
    pv_status st;
    pv_status_set(&st, PV_INTERNAL, "boom");
    pv_status_clear(&st);
    assert_int_equal(st.code, PV_OK);
    assert_string_equal(st.msg, "");
    pv_status_clear(NULL); /* allowed, like pv_status_set(NULL, ...) */
}

static void test_prefix_keeps_code(void **state) {
    (void)state;
    pv_status st;
    pv_status_set(&st, PV_INVALID_ARGUMENT, "redis.db: \"x\" is not an integer");
    assert_int_equal(pv_status_prefix(&st, "config %s", "/etc/pv.json"), PV_INVALID_ARGUMENT);
    assert_int_equal(st.code, PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "config /etc/pv.json: redis.db: \"x\" is not an integer");
    pv_status_prefix(&st, "load");
    assert_string_equal(st.msg, "load: config /etc/pv.json: redis.db: \"x\" is not an integer");
}

static void test_prefix_on_empty_message(void **state) {
    (void)state;
    pv_status st;
    pv_status_set(&st, PV_UNAVAILABLE, "%s", "");
    assert_int_equal(pv_status_prefix(&st, "redis"), PV_UNAVAILABLE);
    assert_string_equal(st.msg, "redis");
}

static void test_prefix_truncates(void **state) {
    (void)state;
    char big[600];
    memset(big, 'y', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    pv_status st;
    pv_status_set(&st, PV_DATA_LOSS, "%s", big);
    pv_status_prefix(&st, "abc");
    assert_int_equal(strlen(st.msg), PV_STATUS_MSG_MAX - 1);
    assert_memory_equal(st.msg, "abc: yyy", 8);
    assert_int_equal(st.code, PV_DATA_LOSS);
}

static void test_quote(void **state) {
    (void)state;
    char q[PV_QUOTE_BUF];
    pv_quote("a\"b\\c\n", q, sizeof q);
    assert_string_equal(q, "\"a\\\"b\\\\c\\x0a\"");
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    pv_quote(big, q, sizeof q);
    assert_true(strlen(q) <= PV_QUOTE_MAX + 5);
    assert_non_null(strstr(q, "...\""));
    pv_quote(NULL, q, sizeof q);
    assert_string_equal(q, "\"\"");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote),
        cmocka_unit_test(test_code_numbers_match_grpc),
        cmocka_unit_test(test_code_name_every_code),
        cmocka_unit_test(test_code_name_out_of_range_is_unknown),
        cmocka_unit_test(test_code_parse_every_code),
        cmocka_unit_test(test_code_parse_uses_len_not_nul),
        cmocka_unit_test(test_code_parse_rejects_non_codes),
        cmocka_unit_test(test_set_formats_and_returns_code),
        cmocka_unit_test(test_set_null_status_returns_code),
        cmocka_unit_test(test_set_truncates_long_message),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_prefix_keeps_code),
        cmocka_unit_test(test_prefix_on_empty_message),
        cmocka_unit_test(test_prefix_truncates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
