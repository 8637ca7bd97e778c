/*
 * Unit tests of pv_mem: PV_FREE frees every argument (the sanitizer build's leak check fails the
 * test otherwise; freeing one twice or a non-heap pointer fails it at once), NULLs among them,
 * and evaluates each argument exactly once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "pv_mem.h"

static void test_frees_every_argument(void **state) {
    (void)state;
    char *a = strdup("a"), *b = malloc(100), *c = calloc(3, 8);
    int *d = malloc(sizeof *d);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_non_null(d);
    PV_FREE(a, NULL, b, c, d, NULL);
    PV_FREE(NULL);
    void *one = malloc(1);
    PV_FREE(one);
}

static int calls;
static void *counted_alloc(void) {
    calls++;
    return malloc(16);
}

static void test_arguments_evaluated_once(void **state) {
    (void)state;
    calls = 0;
    PV_FREE(counted_alloc(), counted_alloc(), counted_alloc());
    assert_int_equal(calls, 3);
}

static void test_free_n_takes_n(void **state) {
    (void)state;
    void *v[4] = {malloc(1), malloc(2), malloc(3), NULL};
    pv_free_n(v, 3);
    pv_free_n(v, 0); /* frees nothing: v's pointers are gone already */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frees_every_argument),
        cmocka_unit_test(test_arguments_evaluated_once),
        cmocka_unit_test(test_free_n_takes_n),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
