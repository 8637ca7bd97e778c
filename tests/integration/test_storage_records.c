/*
 * The storage records on a real Redis (pv_storage_*): a volume attached to a workload is
 * IN_USE and held by it alone, detached READY again; a volume whose restore is journaled on its
 * record (restoring: the agent is in the middle of one, or died there) cannot be attached, since
 * its data may be either snapshot's until the restore completes. A name is one volume's per
 * pool, and a pool's claimed names are read back in one call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "pv_keys.h"
#include "pv_storage.h"
#include "pv_test_redis.h"

typedef struct fixture {
    pv_test_redis *srv;
    pv_redis *r;
    pv_keys keys;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    pv_status st;
    if (!f || pv_test_redis_start(&f->srv, NULL) != 0 ||
        pv_keys_init(&f->keys, "t:", &st) != PV_OK || !(f->r = pv_test_redis_client(f->srv, 5000)))
        return -1;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (f->r) pv_redis_free(f->r);
    pv_test_redis_free(f->srv); /* stops it too */
    free(f);
    return 0;
}

static void put_volume(fixture *f, const char *id, const char *restoring) {
    json_t *rec = json_pack("{s:s, s:s, s:s, s:I, s:i, s:i, s:s}", "id", id, "name", id, "pool",
                            "default", "size", (json_int_t)1 << 30, "format", PV_VOL_QCOW2,
                            "status", PV_VOL_READY, "current_snapshot", "snap-a");
    if (restoring) json_object_set_new(rec, "restoring", json_string(restoring));
    pv_status st;
    assert_int_equal(pv_storage_put(f->r, &f->keys, "vol", rec, &st), PV_OK);
    json_decref(rec);
}

static int status_of(fixture *f, const char *id) {
    json_t *rec = NULL;
    pv_status st;
    assert_int_equal(pv_storage_get(f->r, &f->keys, "vol", id, &rec, &st), PV_OK);
    int s = (int)json_integer_value(json_object_get(rec, "status"));
    json_decref(rec);
    return s;
}

static void test_attach_and_detach(void **state) {
    fixture *f = *state;
    pv_status st;
    put_volume(f, "vol-1", NULL);
    assert_int_equal(pv_storage_attach(f->r, &f->keys, "vol-1", "wl-1", &st), PV_OK);
    assert_int_equal(status_of(f, "vol-1"), PV_VOL_IN_USE);
    assert_int_equal(pv_storage_attach(f->r, &f->keys, "vol-1", "wl-1", &st), PV_OK); /* again */
    assert_int_equal(pv_storage_attach(f->r, &f->keys, "vol-1", "wl-2", &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "in use by workload wl-1"));
    assert_int_equal(pv_storage_detach_all(f->r, &f->keys, "wl-1", &st), PV_OK);
    assert_int_equal(status_of(f, "vol-1"), PV_VOL_READY);
    assert_int_equal(pv_storage_attach(f->r, &f->keys, "vol-1", "wl-2", &st), PV_OK);
}

static void test_no_attach_during_restore(void **state) {
    fixture *f = *state;
    pv_status st;
    put_volume(f, "vol-2", "snap-b");
    assert_int_equal(pv_storage_attach(f->r, &f->keys, "vol-2", "wl-1", &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "a restore to snapshot snap-b is running or did not finish"));
    assert_int_equal(status_of(f, "vol-2"), PV_VOL_READY); /* untouched, nobody holds it */
    /* the restore done (one write: the snapshot reached, the journal gone): attachable */
    put_volume(f, "vol-2", NULL);
    assert_int_equal(pv_storage_attach(f->r, &f->keys, "vol-2", "wl-1", &st), PV_OK);
    assert_int_equal(status_of(f, "vol-2"), PV_VOL_IN_USE);
}

/* Names: one volume per name in a pool; the claimed ones read back in one call. */
static void test_claimed_names(void **state) {
    fixture *f = *state;
    pv_status st;
    json_t *names = NULL;
    assert_int_equal(pv_storage_claimed_names(f->r, &f->keys, "default", &names, &st), PV_OK);
    assert_int_equal(json_object_size(names), 0);
    json_decref(names);
    assert_int_equal(pv_storage_claim_name(f->r, &f->keys, "default", "disk", "vol-a", &st), PV_OK);
    assert_int_equal(pv_storage_claim_name(f->r, &f->keys, "default", "disk", "vol-a", &st), PV_OK);
    assert_int_equal(pv_storage_claim_name(f->r, &f->keys, "default", "disk", "vol-b", &st),
                     PV_ALREADY_EXISTS);
    assert_int_equal(pv_storage_claim_name(f->r, &f->keys, "other", "disk", "vol-b", &st), PV_OK);
    assert_int_equal(pv_storage_claim_name(f->r, &f->keys, "default", "data", "vol-c", &st), PV_OK);
    assert_int_equal(pv_storage_claimed_names(f->r, &f->keys, "default", &names, &st), PV_OK);
    assert_int_equal(json_object_size(names), 2);
    assert_string_equal(json_string_value(json_object_get(names, "disk")), "vol-a");
    assert_string_equal(json_string_value(json_object_get(names, "data")), "vol-c");
    json_decref(names);
    assert_int_equal(pv_storage_release_name(f->r, &f->keys, "default", "disk", &st), PV_OK);
    assert_int_equal(pv_storage_claimed_names(f->r, &f->keys, "default", &names, &st), PV_OK);
    assert_null(json_object_get(names, "disk"));
    json_decref(names);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_attach_and_detach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_attach_during_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claimed_names, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
