/*
 * The storage records on a real Redis (pv_storage_*): a volume attached to a workload is
 * IN_USE and held by it alone, detached READY again; a volume whose restore is journaled on its
 * record (restoring: the agent is in the middle of one, or died there) cannot be attached, since
 * its data may be either snapshot's until the restore completes. A name is one volume's per
 * pool, and a pool's claimed names are read back in one call. Each kind's stored document is
 * read into its struct and written back byte for byte (fields this build does not know
 * included), and a damaged field is DATA_LOSS naming the record's key and the field.
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
    pv_volume rec = {.id = (char *)id,
                     .name = (char *)id,
                     .pool = "default",
                     .size = (int64_t)1 << 30,
                     .format = PV_VOL_QCOW2,
                     .status = PV_VOL_READY,
                     .current_snapshot = "snap-a",
                     .restoring = (char *)restoring};
    pv_status st;
    assert_int_equal(pv_storage_put(f->r, &f->keys, PV_STO_VOL, &rec, &st), PV_OK);
}

static int status_of(fixture *f, const char *id) {
    pv_volume rec;
    pv_status st;
    assert_int_equal(pv_storage_get(f->r, &f->keys, PV_STO_VOL, id, &rec, &st), PV_OK);
    int s = rec.status;
    pv_storage_free(PV_STO_VOL, &rec);
    return s;
}

static void set_raw(fixture *f, const char *key, const char *text) {
    redisReply *rep = NULL;
    pv_status st;
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "SET %s %s", key, text), PV_OK);
    freeReplyObject(rep);
}

static char *get_raw(fixture *f, const char *key) {
    redisReply *rep = NULL;
    pv_status st;
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "GET %s", key), PV_OK);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    char *text = strdup(rep->str);
    freeReplyObject(rep);
    return text;
}

/* Documents as the agent wrote them before the codec (compact, sorted keys), with a field no
 * build knows yet. */
static const char *k_pool_doc =
    "{\"available\":700,\"capacity\":1000,\"config\":{\"path\":\"/srv/p1\"},\"created_ms\":11,"
    "\"future\":[1,2],\"libvirt_uuid\":\"u-1\",\"name\":\"p1\",\"node\":\"n1\",\"status\":1,"
    "\"type\":1,\"updated_ms\":12,\"used\":300}";
static const char *k_vol_doc =
    "{\"cloned_from\":\"vol-0\",\"created_ms\":21,\"current_snapshot\":\"\",\"format\":2,"
    "\"id\":\"vol-1\",\"in_use_by\":\"wl-9\",\"labels\":{\"app\":\"db\"},\"name\":\"disk\","
    "\"path\":\"/srv/p1/disk\",\"pool\":\"p1\",\"size\":4096,\"status\":3,\"updated_ms\":22,"
    "\"used\":512}";
static const char *k_snap_doc =
    "{\"created_ms\":31,\"id\":\"snap-1\",\"name\":\"s\",\"parent\":\"\",\"size\":512,"
    "\"status\":2,\"updated_ms\":32,\"volume_id\":\"vol-1\"}";

/* Each kind read into its struct, and encoded back to the same bytes. */
static void test_round_trip(void **state) {
    fixture *f = *state;
    pv_status st;
    set_raw(f, "t:{sto}:pool:p1", k_pool_doc);
    set_raw(f, "t:{sto}:vol:vol-1", k_vol_doc);
    set_raw(f, "t:{sto}:snap:snap-1", k_snap_doc);
    pv_pool pool;
    assert_int_equal(pv_storage_get(f->r, &f->keys, PV_STO_POOL, "p1", &pool, &st), PV_OK);
    assert_string_equal(pool.name, "p1");
    assert_int_equal(pool.type, PV_POOL_DIR);
    assert_int_equal(pool.status, PV_POOL_ACTIVE);
    assert_int_equal(pool.capacity, 1000);
    assert_int_equal(pool.used, 300);
    assert_int_equal(pool.available, 700);
    assert_string_equal(json_string_value(json_object_get(pool.config, "path")), "/srv/p1");
    assert_string_equal(pool.node, "n1");
    assert_string_equal(pool.libvirt_uuid, "u-1");
    assert_int_equal(pool.created_ms, 11);
    char *text = pv_storage_dumps(PV_STO_POOL, &pool);
    assert_string_equal(text, k_pool_doc);
    free(text);
    pv_volume vol;
    assert_int_equal(pv_storage_get(f->r, &f->keys, PV_STO_VOL, "vol-1", &vol, &st), PV_OK);
    assert_string_equal(vol.id, "vol-1");
    assert_string_equal(vol.pool, "p1");
    assert_int_equal(vol.size, 4096);
    assert_int_equal(vol.used, 512);
    assert_int_equal(vol.format, PV_VOL_QCOW2);
    assert_int_equal(vol.status, PV_VOL_IN_USE);
    assert_string_equal(vol.in_use_by, "wl-9");
    assert_string_equal(vol.cloned_from, "vol-0");
    assert_string_equal(vol.path, "/srv/p1/disk");
    assert_string_equal(vol.current_snapshot, "");
    assert_null(vol.restoring); /* absent stays absent */
    assert_false(vol.imported);
    text = pv_storage_dumps(PV_STO_VOL, &vol);
    assert_string_equal(text, k_vol_doc);
    free(text);
    pv_snapshot snap;
    assert_int_equal(pv_storage_get(f->r, &f->keys, PV_STO_SNAP, "snap-1", &snap, &st), PV_OK);
    assert_string_equal(snap.volume_id, "vol-1");
    assert_int_equal(snap.size, 512);
    assert_int_equal(snap.status, PV_SNAP_READY);
    text = pv_storage_dumps(PV_STO_SNAP, &snap);
    assert_string_equal(text, k_snap_doc);
    free(text);
    /* written back: only updated_ms moves; the index lists it */
    assert_int_equal(pv_storage_put(f->r, &f->keys, PV_STO_POOL, &pool, &st), PV_OK);
    assert_true(pool.updated_ms > 12);
    pool.updated_ms = 12;
    char *want = pv_storage_dumps(PV_STO_POOL, &pool), *have = get_raw(f, "t:{sto}:pool:p1");
    json_t *h = json_loads(have, 0, NULL);
    assert_true(json_integer_value(json_object_get(h, "updated_ms")) > 12);
    json_object_set_new(h, "updated_ms", json_integer(12));
    free(have);
    have = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(have, want);
    json_decref(h);
    free(have);
    free(want);
    pv_pool *all = NULL;
    size_t n = 0;
    assert_int_equal(pv_storage_list(f->r, &f->keys, PV_STO_POOL, NULL, (void **)&all, &n, &st),
                     PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(all[0].name, "p1");
    pv_storage_array_free(PV_STO_POOL, all, n);
    pv_storage_free(PV_STO_POOL, &pool);
    pv_storage_free(PV_STO_VOL, &vol);
    pv_storage_free(PV_STO_SNAP, &snap);
}

/* A damaged field of each kind: DATA_LOSS naming the key, the field and the value. */
static void test_damaged_field(void **state) {
    fixture *f = *state;
    pv_status st;
    static const struct {
        pv_sto_kind kind;
        const char *key, *id, *doc, *want;
    } k[] = {
        {PV_STO_POOL, "t:{sto}:pool:p2", "p2", "{\"name\":\"p2\",\"capacity\":\"lots\"}",
         "pool record t:{sto}:pool:p2: field capacity: bad value \"\"lots\"\""},
        {PV_STO_VOL, "t:{sto}:vol:vol-2", "vol-2", "{\"id\":\"vol-2\",\"format\":\"qcow2\"}",
         "volume record t:{sto}:vol:vol-2: field format: bad value \"\"qcow2\"\""},
        {PV_STO_VOL, "t:{sto}:vol:vol-3", "vol-3", "{\"id\":\"vol-3\",\"imported\":1}",
         "volume record t:{sto}:vol:vol-3: field imported: bad value \"1\""},
        {PV_STO_SNAP, "t:{sto}:snap:snap-2", "snap-2", "{\"id\":\"snap-2\",\"parent\":7}",
         "snapshot record t:{sto}:snap:snap-2: field parent: bad value \"7\""},
        {PV_STO_SNAP, "t:{sto}:snap:snap-3", "snap-3", "[1]",
         "snapshot record t:{sto}:snap:snap-3: not a JSON object"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        set_raw(f, k[i].key, k[i].doc);
        union {
            pv_pool p;
            pv_volume v;
            pv_snapshot s;
        } rec;
        assert_int_equal(pv_storage_get(f->r, &f->keys, k[i].kind, k[i].id, &rec, &st),
                         PV_DATA_LOSS);
        if (!strstr(st.msg, k[i].want)) fail_msg("%s: %s", k[i].key, st.msg);
    }
    /* a list holding a damaged record refuses it too, rather than answer it as zeros */
    put_volume(f, "vol-4", NULL);
    set_raw(f, "t:{sto}:vol:vol-4", "{\"id\":\"vol-4\",\"pool\":\"default\",\"size\":-0.5}");
    void *vols = NULL;
    size_t n = 0;
    assert_int_equal(pv_storage_list(f->r, &f->keys, PV_STO_VOL, "default", &vols, &n, &st),
                     PV_DATA_LOSS);
    assert_non_null(strstr(st.msg, "t:{sto}:vol:vol-4: field size"));
    assert_null(vols);
    assert_int_equal(n, 0);
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
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_field, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
