/*
 * wk_test_kinds: the test.* operation kinds, for the pipeline's own tests and benchmarks. They are
 * runnable only when the configuration sets test_operations (wk_handler checks).
 *
 *   test.sleep {ms, steps, effect, runs}  sleeps ms in `steps` journaled steps (resumed, not
 *       repeated, after a redelivery), reporting progress and stopping at once on cancel. With
 *       effect=X it applies one side effect halfway, as a journaled step that increments
 *       <prefix>test:effect:X exactly once per operation whatever the redeliveries (the effect is
 *       idempotent on its own, as every step must be) and counts how often the step itself ran
 *       in <prefix>test:effect_runs:X (more than once only when a worker died between the effect
 *       and its journal entry).
 *   test.fail {runs}      always fails with PV_UNAVAILABLE "test.fail always fails".
 *   test.flaky {failures, runs}  fails transiently on its first `failures` deliveries, then
 *       succeeds.
 * With runs=Y every kind increments <prefix>test:runs:Y each time its handler starts, so a test
 * can count deliveries that ran.
 */
#ifndef WK_TEST_KINDS_H
#define WK_TEST_KINDS_H

#include "pv_status.h"

typedef struct wk_op wk_op;

int wk_test_sleep(wk_op *op, pv_status *st);
int wk_test_fail(wk_op *op, pv_status *st);
int wk_test_flaky(wk_op *op, pv_status *st);

#endif
