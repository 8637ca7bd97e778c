/*
 * Unit tests of pv_pbmap: a generated map field's entries as a JSON object (later keys winning,
 * unset strings as ""), and a value that is not UTF-8 reported while the others are still set.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_pbmap.h"

static void test_entries_to_object(void **state) {
    (void)state;
    Pb__DeployOptions__LabelsEntry a = PB__DEPLOY_OPTIONS__LABELS_ENTRY__INIT,
                                   b = PB__DEPLOY_OPTIONS__LABELS_ENTRY__INIT,
                                   c = PB__DEPLOY_OPTIONS__LABELS_ENTRY__INIT;
    a.key = "app";
    a.value = "web";
    b.key = "tier";
    b.value = NULL;
    c.key = "app";
    c.value = "api";
    Pb__DeployOptions__LabelsEntry *entries[] = {&a, &b, &c};
    json_t *o = json_object();
    assert_int_equal(pv_pbmap_add(o, (void *const *)entries, 3), 0);
    assert_int_equal(json_object_size(o), 2);
    assert_string_equal(json_string_value(json_object_get(o, "app")), "api");
    assert_string_equal(json_string_value(json_object_get(o, "tier")), "");
    assert_int_equal(pv_pbmap_add(o, NULL, 0), 0);
    assert_int_equal(json_object_size(o), 2);
    json_decref(o);
}

static void test_bad_value_reported(void **state) {
    (void)state;
    Pb__DeployOptions__LabelsEntry bad = PB__DEPLOY_OPTIONS__LABELS_ENTRY__INIT,
                                   good = PB__DEPLOY_OPTIONS__LABELS_ENTRY__INIT;
    bad.key = "bad";
    bad.value = "\xff\xfe";
    good.key = "good";
    good.value = "yes";
    Pb__DeployOptions__LabelsEntry *entries[] = {&bad, &good};
    json_t *o = json_object();
    assert_int_equal(pv_pbmap_add(o, (void *const *)entries, 2), -1);
    assert_null(json_object_get(o, "bad"));
    assert_string_equal(json_string_value(json_object_get(o, "good")), "yes");
    json_decref(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries_to_object),
        cmocka_unit_test(test_bad_value_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
