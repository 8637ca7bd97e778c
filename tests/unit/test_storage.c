/* pv_storage: plain names, pool configurations by type, the libvirt XML of each type. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pv_storage.h"

static void test_names(void **state) {
    (void)state;
    pv_status st;
    const char *ok[] = {"default", "data-01", "vm_disk.qcow2", "a"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(pv_storage_check_name("name", ok[i], &st), PV_OK);
    const char *bad[] = {"", "../x", "a/b", "-rf", ".hidden", "a b", "x\n", "a..b", "data.."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(pv_storage_check_name("name", bad[i], &st), PV_INVALID_ARGUMENT);
        assert_non_null(strstr(st.msg, "name: "));
    }
}

static int check(int type, const char *json, pv_status *st) {
    json_t *c = json_loads(json, 0, NULL);
    int rc = pv_storage_check_pool(type, c, st);
    json_decref(c);
    return rc;
}

static void test_configs(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(check(PV_POOL_DIR, "{\"path\":\"/srv/pool\"}", &st), PV_OK);
    assert_int_equal(check(PV_POOL_DIR, "{}", &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "config.path: required for this pool type");
    assert_int_equal(check(PV_POOL_DIR, "{\"path\":\"/a/../etc\"}", &st), PV_INVALID_ARGUMENT);
    assert_int_equal(check(PV_POOL_DIR, "{\"path\":\"/p\",\"colour\":\"red\"}", &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "config.colour: not a key"));
    assert_int_equal(check(PV_POOL_LVM, "{\"volume_group\":\"vg0\",\"thin_pool\":\"t\"}", &st),
                     PV_OK);
    assert_int_equal(
        check(PV_POOL_NFS, "{\"server\":\"nfs1:2049\",\"export\":\"/e\",\"path\":\"/m\"}", &st),
        PV_OK);
    assert_int_equal(
        check(PV_POOL_NFS, "{\"server\":\"nfs1:99999\",\"export\":\"/e\",\"path\":\"/m\"}", &st),
        PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "config.server"));
    assert_int_equal(check(PV_POOL_RBD,
                           "{\"monitors\":\"m1:6789,m2\",\"pool\":\"rbd\",\"user\":\"admin\","
                           "\"secret_uuid\":\"2ec115d7-3a88-3ceb-bc12-0ac909a6fd87\"}",
                           &st),
                     PV_OK);
    assert_int_equal(check(PV_POOL_RBD,
                           "{\"monitors\":\"m1\",\"pool\":\"rbd\",\"user\":\"admin\","
                           "\"secret_uuid\":\"nope\"}",
                           &st),
                     PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "config.secret_uuid: \"nope\" is not a UUID"));
    assert_int_equal(check(PV_POOL_DIR, "{\"path\":\"/p\",\"max_overcommit\":\"0.5\"}", &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(check(7, "{}", &st), PV_INVALID_ARGUMENT);
}

static char *xml_of(int type, const char *json) {
    json_t *c = json_loads(json, 0, NULL);
    char *xml = NULL;
    pv_status st;
    assert_int_equal(pv_storage_pool_xml("p1", NULL, type, c, &xml, &st), PV_OK);
    json_decref(c);
    return xml;
}

static void test_xml(void **state) {
    (void)state;
    char *x = xml_of(PV_POOL_DIR, "{\"path\":\"/srv/p\"}");
    assert_string_equal(x, "<pool type='dir'><name>p1</name><target><path>/srv/p</path></target>"
                           "</pool>");
    free(x);
    x = xml_of(PV_POOL_ISCSI, "{\"portal\":\"10.0.0.5:3260\",\"target\":\"iqn.2026-01.io:t1\","
                              "\"chap_username\":\"u\",\"chap_secret\":\"s1\"}");
    assert_non_null(strstr(x, "<host name='10.0.0.5' port='3260'/>"));
    assert_non_null(strstr(x, "<device path='iqn.2026-01.io:t1'/>"));
    assert_non_null(strstr(x, "<auth type='chap' username='u'><secret usage='s1'/></auth>"));
    free(x);
    x = xml_of(PV_POOL_LVM, "{\"volume_group\":\"vg0\",\"devices\":\"/dev/sdb,/dev/sdc\"}");
    assert_non_null(strstr(x, "<device path='/dev/sdb'/><device path='/dev/sdc'/>"));
    assert_non_null(strstr(x, "<target><path>/dev/vg0</path></target>"));
    free(x);
}

/* A pool's and a volume's records from their stored JSON, decoded as pv_storage_get does. */
static void records_of(const char *pool, const char *vol, pv_pool *p, pv_volume *v) {
    json_t *pj = json_loads(pool, 0, NULL), *vj = json_loads(vol, 0, NULL);
    assert_non_null(pj);
    assert_non_null(vj);
    pv_status st;
    assert_int_equal(pv_record_decode_json(&pv_pool_schema, "pool", pj, p, &st), PV_OK);
    assert_int_equal(pv_record_decode_json(&pv_volume_schema, "vol", vj, v, &st), PV_OK);
    json_decref(pj);
    json_decref(vj);
}

/* The command a snapshot operation runs, exactly, for records as the agent stores them. */
static void assert_argv(int what, const char *pool, const char *vol, const char *snap,
                        const char *const *want) {
    pv_pool p;
    pv_volume v;
    records_of(pool, vol, &p, &v);
    pv_argv a;
    pv_status st;
    assert_int_equal(pv_storage_snapshot_argv(what, &p, &v, snap, &a, &st), PV_OK);
    size_t n = 0;
    while (want[n])
        n++;
    assert_int_equal(a.n, n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(a.v[i], want[i]);
    assert_null(a.v[n]);
    pv_argv_clear(&a);
    assert_int_equal(a.n, 0);
    pv_storage_free(PV_STO_POOL, &p);
    pv_storage_free(PV_STO_VOL, &v);
}

static const char *lvm_pool = "{\"name\":\"fast-pool\",\"type\":2,\"config\":{"
                              "\"volume_group\":\"vg0\",\"snapshot_percent\":\"25\"}}";
static const char *lvm_pool_default = "{\"name\":\"p\",\"type\":2,\"config\":{"
                                      "\"volume_group\":\"pivirtd-vg\"}}";
static const char *rbd_pool = "{\"name\":\"ceph\",\"type\":5,\"config\":{"
                              "\"monitors\":\"mon1:6789,mon2\",\"pool\":\"rbd\","
                              "\"user\":\"libvirt\",\"secret_uuid\":"
                              "\"2ec115d7-3a88-3ceb-bc12-0ac909a6fd87\"}}";
static const char *vol_db = "{\"id\":\"vol-01\",\"name\":\"db-disk\",\"pool\":\"fast-pool\","
                            "\"format\":1,\"path\":\"/dev/vg0/db-disk\"}";

static void test_snapshot_method(void **state) {
    (void)state;
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_DIR, PV_VOL_QCOW2), PV_SNAPS_QCOW2);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_NFS, PV_VOL_QCOW2), PV_SNAPS_QCOW2);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_DIR, PV_VOL_RAW), PV_SNAPS_NONE);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_NFS, PV_VOL_RAW), PV_SNAPS_NONE);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_ISCSI, PV_VOL_RAW), PV_SNAPS_NONE);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_DIR, PV_VOL_VMDK), PV_SNAPS_NONE);
    /* LVM and RBD snapshot the block device, whatever format the volume was given */
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_LVM, PV_VOL_RAW), PV_SNAPS_LVM);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_LVM, PV_VOL_QCOW2), PV_SNAPS_LVM);
    assert_int_equal(pv_storage_snapshot_method(PV_POOL_RBD, PV_VOL_RAW), PV_SNAPS_RBD);
}

static void test_lvm_snapshot_argv(void **state) {
    (void)state;
    const char *snap = "snap-01JDQ4ZB7X3M9K2V5T8R6N4P1Q";
    assert_argv(PV_SNAP_CREATE, lvm_pool, vol_db, snap,
                (const char *const[]){"/sbin/lvcreate", "--snapshot", "--name", snap, "--extents",
                                      "25%ORIGIN", "vg0/db-disk", NULL});
    assert_argv(PV_SNAP_CREATE, lvm_pool_default, vol_db, snap,
                (const char *const[]){"/sbin/lvcreate", "--snapshot", "--name", snap, "--extents",
                                      "100%ORIGIN", "pivirtd-vg/db-disk", NULL});
    assert_argv(PV_SNAP_RESTORE, lvm_pool, vol_db, snap,
                (const char *const[]){"/bin/dd", "if=/dev/vg0/snap-01JDQ4ZB7X3M9K2V5T8R6N4P1Q",
                                      "of=/dev/vg0/db-disk", "bs=4M", "conv=fsync", "status=none",
                                      NULL});
    assert_argv(PV_SNAP_DELETE, lvm_pool, vol_db, snap,
                (const char *const[]){"/sbin/lvremove", "--yes",
                                      "vg0/snap-01JDQ4ZB7X3M9K2V5T8R6N4P1Q", NULL});
}

static void test_rbd_snapshot_argv(void **state) {
    (void)state;
    const char *snap = "snap-01JDQ4ZB7X3M9K2V5T8R6N4P1Q";
    const char *vol = "{\"id\":\"vol-02\",\"name\":\"web-root\",\"pool\":\"ceph\",\"format\":1}";
    static const char *const verbs[] = {"", "create", "rollback", "rm"};
    for (int what = PV_SNAP_CREATE; what <= PV_SNAP_DELETE; what++)
        assert_argv(what, rbd_pool, vol, snap,
                    (const char *const[]){"/usr/bin/rbd", "--id", "libvirt", "-m", "mon1:6789,mon2",
                                          "--no-progress", "snap", verbs[what],
                                          "rbd/web-root@snap-01JDQ4ZB7X3M9K2V5T8R6N4P1Q", NULL});
}

static int argv_fails(const char *pool, const char *vol, const char *snap, pv_status *st) {
    pv_pool p;
    pv_volume v;
    records_of(pool, vol, &p, &v);
    pv_argv a;
    int rc = pv_storage_snapshot_argv(PV_SNAP_CREATE, &p, &v, snap, &a, st);
    assert_int_equal(a.n, 0); /* nothing left to free on failure */
    pv_storage_free(PV_STO_POOL, &p);
    pv_storage_free(PV_STO_VOL, &v);
    return rc;
}

static void test_snapshot_argv_refuses(void **state) {
    (void)state;
    pv_status st;
    /* a name that would be read as an option, or reach outside the volume group */
    assert_int_equal(argv_fails(lvm_pool, "{\"name\":\"-rf\"}", "snap-1", &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "volume: \"-rf\" cannot go into a snapshot command"));
    assert_int_equal(argv_fails("{\"type\":2,\"config\":{\"volume_group\":\"vg0/../x\"}}", vol_db,
                                "snap-1", &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "config.volume_group"));
    assert_int_equal(argv_fails(lvm_pool, vol_db, "../snap", &st), PV_FAILED_PRECONDITION);
    assert_int_equal(argv_fails("{\"type\":5,\"config\":{\"monitors\":\"-x\",\"pool\":\"rbd\","
                                "\"user\":\"u\"}}",
                                vol_db, "snap-1", &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "config.monitors"));
    /* a directory pool has no snapshot command of its own */
    assert_int_equal(argv_fails("{\"type\":1,\"config\":{\"path\":\"/p\"}}", vol_db, "snap-1", &st),
                     PV_FAILED_PRECONDITION);
    /* the pool's snapshot share is checked with its config */
    assert_int_equal(
        check(PV_POOL_LVM, "{\"volume_group\":\"vg0\",\"snapshot_percent\":\"0\"}", &st),
        PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "config.snapshot_percent: \"0\" is not a whole percentage"));
    assert_int_equal(
        check(PV_POOL_LVM, "{\"volume_group\":\"vg0\",\"snapshot_percent\":\"100\"}", &st), PV_OK);
}

static void test_snapshot_done_before(void **state) {
    (void)state;
    /* what lvcreate, lvremove and rbd print when an earlier delivery already did the work */
    assert_true(pv_storage_snapshot_done_before(
        PV_SNAPS_LVM, PV_SNAP_CREATE,
        "  Logical Volume \"snap-1\" already exists in volume group \"vg0\"\n"));
    assert_true(pv_storage_snapshot_done_before(
        PV_SNAPS_LVM, PV_SNAP_DELETE, "  Failed to find logical volume \"vg0/snap-1\"\n"));
    assert_true(pv_storage_snapshot_done_before(
        PV_SNAPS_RBD, PV_SNAP_CREATE, "rbd: failed to create snapshot: (17) File exists\n"));
    assert_true(pv_storage_snapshot_done_before(
        PV_SNAPS_RBD, PV_SNAP_DELETE,
        "rbd: failed to remove snapshot: (2) No such file or directory\n"));
    assert_true(pv_storage_snapshot_done_before(
        PV_SNAPS_QCOW2, PV_SNAP_DELETE,
        "qemu-img: Could not delete snapshot 'snap-1': snapshot not found\n"));
    /* anything else is a failure, and a restore is never "done before" */
    assert_false(pv_storage_snapshot_done_before(
        PV_SNAPS_QCOW2, PV_SNAP_RESTORE,
        "qemu-img: Could not apply snapshot 'snap-1': Failed to load snapshot: No such file or "
        "directory\n"));
    assert_false(pv_storage_snapshot_done_before(
        PV_SNAPS_LVM, PV_SNAP_CREATE, "  Volume group \"vg0\" has insufficient free space\n"));
    assert_false(pv_storage_snapshot_done_before(PV_SNAPS_LVM, PV_SNAP_DELETE,
                                                 "  Logical Volume \"snap-1\" already exists"));
    assert_false(pv_storage_snapshot_done_before(PV_SNAPS_RBD, PV_SNAP_RESTORE,
                                                 "(2) No such file or directory"));
    assert_false(pv_storage_snapshot_done_before(PV_SNAPS_RBD, PV_SNAP_CREATE, NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_configs),
        cmocka_unit_test(test_xml),
        cmocka_unit_test(test_snapshot_method),
        cmocka_unit_test(test_lvm_snapshot_argv),
        cmocka_unit_test(test_rbd_snapshot_argv),
        cmocka_unit_test(test_snapshot_argv_refuses),
        cmocka_unit_test(test_snapshot_done_before),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
