/*
 * The reflection index over the embedded descriptor set: every API service is there, every
 * declared method is known (and nothing else), and a bad set is refused with a message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gw_reflection.h"

extern const unsigned char pv_descriptor_set[];
extern const size_t pv_descriptor_set_len;

static int has_service(const gw_reflection *r, const char *name) {
    for (size_t i = 0; i < gw_reflection_service_count(r); i++)
        if (strcmp(gw_reflection_service(r, i), name) == 0) return 1;
    return 0;
}

static void test_services(void **state) {
    (void)state;
    char err[256];
    gw_reflection *r = gw_reflection_new(pv_descriptor_set, pv_descriptor_set_len, err, sizeof err);
    assert_non_null(r);
    assert_true(has_service(r, "pb.CoreRPC"));
    assert_true(has_service(r, "pivirt.cluster.v1.ClusterService"));
    assert_true(has_service(r, "pivirt.storage.v1.StorageService"));
    assert_true(has_service(r, "pivirt.operations.v1.OperationService"));
    assert_true(has_service(r, "grpc.health.v1.Health"));
    assert_true(has_service(r, "grpc.reflection.v1.ServerReflection"));
    assert_true(has_service(r, "grpc.reflection.v1alpha.ServerReflection"));
    assert_int_equal(gw_reflection_service_count(r), 7);
    gw_reflection_free(r);
}

static void test_methods(void **state) {
    (void)state;
    char err[256];
    gw_reflection *r = gw_reflection_new(pv_descriptor_set, pv_descriptor_set_len, err, sizeof err);
    assert_non_null(r);
    assert_true(gw_reflection_has_method(r, "/pb.CoreRPC/Info"));
    assert_true(gw_reflection_has_method(r, "/pb.CoreRPC/RunAndWait"));
    assert_true(gw_reflection_has_method(r, "/pivirt.cluster.v1.ClusterService/DrainNode"));
    assert_true(gw_reflection_has_method(r, "/pivirt.storage.v1.StorageService/GetPoolStats"));
    assert_true(
        gw_reflection_has_method(r, "/pivirt.operations.v1.OperationService/WaitOperation"));
    assert_false(gw_reflection_has_method(r, "/pb.CoreRPC/NoSuchMethod"));
    assert_false(gw_reflection_has_method(r, "/pb.CoreRPC"));
    assert_false(gw_reflection_has_method(r, "pb.CoreRPC/Info"));
    gw_reflection_free(r);
}

static void test_bad_set_is_refused(void **state) {
    (void)state;
    char err[256] = "";
    static const unsigned char junk[] = {0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01};
    gw_reflection *r = gw_reflection_new(junk, sizeof junk, err, sizeof err);
    assert_null(r);
    assert_non_null(strstr(err, "does not decode"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_services),
        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_bad_set_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
