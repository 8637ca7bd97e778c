/*
 * Unit tests of gw_memory's trimmer: no trim while calls keep starting, one trim once none has
 * started for the idle period, no second trim in the same idle spell, another after the next
 * call; idle 0 starts nothing. (What a trim gives back is measured by `./ops/pivirt bench
 * gateway-memory` on the release build: sanitizer builds do not allocate through glibc.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <time.h>

#include "gw_memory.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_trims_once_per_idle_spell(void **state) {
    (void)state;
    gw_memory *m = NULL;
    pv_status st;
    assert_int_equal(gw_memory_start(50, &m, &st), PV_OK);
    assert_non_null(m);
    sleep_ms(200);
    assert_int_equal(gw_memory_trims(m), 0); /* no call yet: nothing to give back */
    for (int i = 0; i < 30; i++) {           /* busy: a call every 10 ms */
        gw_memory_note_call(m);
        sleep_ms(10);
    }
    assert_int_equal(gw_memory_trims(m), 0);
    sleep_ms(300);
    assert_int_equal(gw_memory_trims(m), 1);
    sleep_ms(200);
    assert_int_equal(gw_memory_trims(m), 1); /* still the same idle spell */
    gw_memory_note_call(m);
    sleep_ms(300);
    assert_int_equal(gw_memory_trims(m), 2);
    gw_memory_stop(m);
}

static void test_off(void **state) {
    (void)state;
    gw_memory *m = (gw_memory *)1;
    pv_status st;
    assert_int_equal(gw_memory_start(0, &m, &st), PV_OK);
    assert_null(m);
    gw_memory_note_call(NULL);
    assert_int_equal(gw_memory_trims(NULL), 0);
    gw_memory_stop(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trims_once_per_idle_spell),
        cmocka_unit_test(test_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
