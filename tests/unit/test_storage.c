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
    const char *bad[] = {"", "../x", "a/b", "-rf", ".hidden", "a b", "x\n"};
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
    assert_int_equal(pv_storage_pool_xml("p1", type, c, &xml, &st), PV_OK);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_configs),
        cmocka_unit_test(test_xml),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
