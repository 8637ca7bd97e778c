/*
 * gw_app_submit_for, the gateway's one submission path, on a real Redis: every submission joins
 * its client's unfinished set; a client at gateway.max_pending_ops_per_client is refused with
 * nothing written, except for the parts of a call let through (GW_SUBMIT_PART), which are
 * counted and never refused, so a call is never stopped half-way; the client's request id makes
 * a retry the same operation only with GW_SUBMIT_IDEMPOTENT; no connection is UNAVAILABLE.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gw_app.h"
#include "pv_test_redis.h"

typedef struct fixture {
    pv_test_redis *srv;
    pv_redis *r;
    gw_app app;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (!f || pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    if (pv_keys_init(&f->app.keys, "t:", &st) != PV_OK) return -1;
    if (!(f->r = pv_test_redis_client(f->srv, 5000))) return -1;
    f->app.cfg.ops.retention_seconds = 3600;
    f->app.cfg.ops.events_maxlen = 1000;
    f->app.cfg.gateway.max_pending_ops_per_client = 2;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

/* Submits one operation of target for client; its id into id (PV_ID_MAX) when not NULL. */
static int submit(fixture *f, const char *client, const char *rid, unsigned flags,
                  const char *target, char *id, bool *existed, pv_status *st) {
    pv_op_submit_req req = {.kind = "test.sleep", .target = target, .queue = "ops"};
    pv_op rec;
    int rc = gw_app_submit_for(&f->app, f->r, client, rid, flags, &req, &rec, existed, st);
    if (rc == PV_OK && id) snprintf(id, PV_ID_MAX, "%s", rec.id);
    pv_op_clear(&rec);
    return rc;
}

static void test_bound_refuses_a_call_but_never_its_parts(void **state) {
    fixture *f = *state;
    pv_status st;
    char first[PV_ID_MAX];
    assert_int_equal(submit(f, "host:a", NULL, 0, "t1", first, NULL, &st), PV_OK);
    assert_int_equal(submit(f, "host:a", NULL, 0, "t2", NULL, NULL, &st), PV_OK);
    assert_int_equal(submit(f, "host:a", NULL, 0, "t3", NULL, NULL, &st), PV_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.msg, "gateway.max_pending_ops_per_client"));
    assert_non_null(strstr(st.msg, "host:a"));
    /* another client has its own bound */
    assert_int_equal(submit(f, "host:b", NULL, 0, "t4", NULL, NULL, &st), PV_OK);
    /* a part of a call let through is taken, and counted: with the first operation gone the
     * client still has two unfinished (the second and the part), so a new call is refused */
    assert_int_equal(submit(f, "host:a", NULL, GW_SUBMIT_PART, "t5", NULL, NULL, &st), PV_OK);
    pv_op_opts oo = gw_app_op_opts(&f->app);
    pv_op out;
    assert_int_equal(pv_op_cancel(f->r, &f->app.keys, &oo, first, &out, &st), PV_OK);
    assert_int_equal(out.status, PV_OP_CANCELLED);
    pv_op_clear(&out);
    assert_int_equal(submit(f, "host:a", NULL, 0, "t6", NULL, NULL, &st), PV_RESOURCE_EXHAUSTED);
}

static void test_request_id_only_when_idempotent(void **state) {
    fixture *f = *state;
    pv_status st;
    char a[PV_ID_MAX], b[PV_ID_MAX];
    bool existed = true;
    assert_int_equal(submit(f, "", "rid-1", GW_SUBMIT_IDEMPOTENT, "t1", a, &existed, &st), PV_OK);
    assert_false(existed);
    assert_int_equal(submit(f, "", "rid-1", GW_SUBMIT_IDEMPOTENT, "t1", b, &existed, &st), PV_OK);
    assert_true(existed);
    assert_string_equal(a, b);
    /* without the flag the client's id is not the operation's: a second operation */
    assert_int_equal(submit(f, "", "rid-2", 0, "t7", a, &existed, &st), PV_OK);
    assert_int_equal(submit(f, "", "rid-2", 0, "t8", b, &existed, &st), PV_OK);
    assert_false(existed);
    assert_string_not_equal(a, b);
}

static void test_no_connection_is_unavailable(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_op_submit_req req = {.kind = "test.sleep", .target = "t1", .queue = "ops"};
    pv_op rec;
    assert_int_equal(gw_app_submit_for(&f->app, NULL, "host:a", NULL, 0, &req, &rec, NULL, &st),
                     PV_UNAVAILABLE);
    assert_string_equal(rec.id, ""); /* nothing to clear */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bound_refuses_a_call_but_never_its_parts, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_request_id_only_when_idempotent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_connection_is_unavailable, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
