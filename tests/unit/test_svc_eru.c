/*
 * Unit tests of svc_eru's map-field conversions, the first C test of the service library
 * (pv_services): labels become sorted compact JSON, a plugin document that is not a JSON
 * object is refused naming the field and plugin, and label matching wants every label.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "svc_eru.h"

static void test_labels_json_sorted(void **state) {
    (void)state;
    Pb__Node__LabelsEntry a = PB__NODE__LABELS_ENTRY__INIT, b = PB__NODE__LABELS_ENTRY__INIT;
    a.key = "zone";
    a.value = "b";
    b.key = "arch";
    b.value = "arm64";
    void *entries[] = {&a, &b};
    char *out = NULL;
    pv_status st;
    assert_int_equal(svc_eru_labels_json("labels", entries, 2, &out, &st), PV_OK);
    assert_string_equal(out, "{\"arch\":\"arm64\",\"zone\":\"b\"}");
    assert_true(svc_eru_labels_match(out, entries, 2));
    a.value = "c";
    assert_false(svc_eru_labels_match(out, entries, 2));
    assert_true(svc_eru_labels_match(out, NULL, 0));
    free(out);
}

static void test_resources_json_refuses_non_object(void **state) {
    (void)state;
    Pb__ReallocOptions__ResourcesEntry e = PB__REALLOC_OPTIONS__RESOURCES_ENTRY__INIT;
    e.key = "cpumem";
    e.value.data = (uint8_t *)"[1]";
    e.value.len = 3;
    void *entries[] = {&e};
    char *out = (char *)1;
    pv_status st;
    assert_int_equal(svc_eru_resources_json("resources", entries, 1, &out, &st),
                     PV_INVALID_ARGUMENT);
    assert_null(out);
    assert_non_null(strstr(st.msg, "resources[cpumem]"));
    e.value.data = (uint8_t *)"{\"cpu-request\":1}";
    e.value.len = strlen((const char *)e.value.data);
    assert_int_equal(svc_eru_resources_json("resources", entries, 1, &out, &st), PV_OK);
    assert_string_equal(out, "{\"cpumem\":{\"cpu-request\":1}}");
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_labels_json_sorted),
        cmocka_unit_test(test_resources_json_refuses_non_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
