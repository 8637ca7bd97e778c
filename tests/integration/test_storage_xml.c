/*
 * The pool XML of every type (pv_storage_pool_xml) as libvirt takes it: defined in libvirt's
 * in-process test driver (test:///default), which parses it with libvirt's own pool parser, and
 * read back (virStoragePoolGetXMLDesc) with the source each type needs. DIR pools are real in
 * e2e.test_storage; LVM, NFS, iSCSI and RBD need hardware or servers this machine lacks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "pv_storage.h"

static void quiet(void *user, virErrorPtr err) {
    (void)user;
    (void)err;
}

/* Defines the pool of type with config (JSON), reads its XML back; every want is in it. */
static void defined_as(int type, const char *json, const char *const *want, size_t n) {
    virSetErrorFunc(NULL, quiet);
    virConnectPtr conn = virConnectOpen("test:///default");
    assert_non_null(conn);
    char name[64];
    static int seq;
    snprintf(name, sizeof name, "pvxml-%d-%d", (int)getpid(), ++seq);
    json_t *config = json_loads(json, 0, NULL);
    char *xml = NULL;
    pv_status st;
    assert_int_equal(pv_storage_pool_xml(name, NULL, type, config, &xml, &st), PV_OK);
    virStoragePoolPtr p = virStoragePoolDefineXML(conn, xml, 0);
    if (!p) fail_msg("libvirt refused %s: %s", xml, virGetLastErrorMessage());
    char *back = virStoragePoolGetXMLDesc(p, 0);
    assert_non_null(back);
    for (size_t i = 0; i < n; i++)
        if (!strstr(back, want[i])) fail_msg("%s not in %s", want[i], back);
    free(back);
    assert_int_equal(virStoragePoolUndefine(p), 0);
    virStoragePoolFree(p);
    free(xml);
    json_decref(config);
    virConnectClose(conn);
}

static void test_lvm(void **state) {
    (void)state;
    const char *want[] = {"<pool type='logical'>", "<name>vg-fast</name>",
                          "<device path='/dev/sdb'/>", "<format type='lvm2'/>",
                          "<path>/dev/vg-fast</path>"};
    defined_as(PV_POOL_LVM,
               "{\"volume_group\":\"vg-fast\",\"devices\":\"/dev/sdb\","
               "\"thin_pool\":\"thin\"}",
               want, 5);
}

static void test_nfs(void **state) {
    (void)state;
    const char *want[] = {"<pool type='netfs'>", "<host name='nfs1.example' port='2049'/>",
                          "<dir path='/exports/vm'/>", "<format type='nfs'/>",
                          "<path>/mnt/vm</path>"};
    defined_as(PV_POOL_NFS,
               "{\"server\":\"nfs1.example:2049\",\"export\":\"/exports/vm\","
               "\"path\":\"/mnt/vm\"}",
               want, 5);
}

static void test_iscsi(void **state) {
    (void)state;
    const char *want[] = {"<pool type='iscsi'>", "<host name='10.0.0.5' port='3260'/>",
                          "<device path='iqn.2026-01.io.example:store'/>",
                          "<auth type='chap' username='pv'>", "<secret usage='pv-chap'/>"};
    defined_as(PV_POOL_ISCSI,
               "{\"portal\":\"10.0.0.5:3260\",\"target\":"
               "\"iqn.2026-01.io.example:store\",\"chap_username\":\"pv\","
               "\"chap_secret\":\"pv-chap\"}",
               want, 5);
}

static void test_rbd(void **state) {
    (void)state;
    const char *want[] = {"<pool type='rbd'>",
                          "<name>vms</name>",
                          "<host name='mon1' port='6789'/>",
                          "<host name='mon2'/>",
                          "<auth type='ceph' username='libvirt'>",
                          "<secret uuid='2ec115d7-3a88-3ceb-bc12-0ac909a6fd87'/>"};
    defined_as(PV_POOL_RBD,
               "{\"monitors\":\"mon1:6789,mon2\",\"pool\":\"vms\",\"user\":"
               "\"libvirt\",\"secret_uuid\":\"2ec115d7-3a88-3ceb-bc12-0ac909a6fd87\"}",
               want, 6);
}

static void test_dir(void **state) {
    (void)state;
    const char *want[] = {"<pool type='dir'>", "<path>/srv/pools/a</path>"};
    defined_as(PV_POOL_DIR, "{\"path\":\"/srv/pools/a\"}", want, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dir),   cmocka_unit_test(test_lvm), cmocka_unit_test(test_nfs),
        cmocka_unit_test(test_iscsi), cmocka_unit_test(test_rbd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
