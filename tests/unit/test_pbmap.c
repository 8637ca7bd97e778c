/*
 * Unit tests of pv_pbmap: a generated map field's entries as a JSON object (later keys winning,
 * unset strings as ""), and a value that is not UTF-8 reported while the others are still set;
 * and a JSON object as entries of a given entry message (strings only, pointing into it).
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
    json_t *made = pv_pbmap_object((void *const *)entries, 3);
    assert_int_equal(json_object_size(made), 2);
    assert_string_equal(json_string_value(json_object_get(made, "app")), "api");
    assert_string_equal(json_string_value(json_object_get(made, "tier")), "");
    json_decref(made);
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

static void test_object_to_entries(void **state) {
    (void)state;
    json_t *o = json_pack("{s:s, s:i, s:s}", "app", "web", "port", 80, "tier", "front");
    void **entries = NULL;
    size_t n = 99;
    assert_int_equal(
        pv_pbmap_entries(o, &pb__deploy_options__labels_entry__descriptor, &entries, &n), 0);
    assert_int_equal(n, 2); /* the number is passed over */
    const Pb__DeployOptions__LabelsEntry *a = entries[0], *b = entries[1];
    assert_ptr_equal(a->base.descriptor, &pb__deploy_options__labels_entry__descriptor);
    assert_string_equal(a->key, "app");
    assert_string_equal(a->value, "web");
    assert_string_equal(b->key, "tier");
    assert_string_equal(b->value, "front");
    json_t *back = json_object();
    assert_int_equal(pv_pbmap_add(back, entries, n), 0);
    assert_string_equal(json_string_value(json_object_get(back, "tier")), "front");
    json_decref(back);
    pv_pbmap_entries_free(entries);
    assert_int_equal(
        pv_pbmap_entries(NULL, &pb__deploy_options__labels_entry__descriptor, &entries, &n), 0);
    assert_null(entries);
    assert_int_equal(n, 0);
    json_t *numbers = json_pack("{s:i}", "port", 80);
    assert_int_equal(
        pv_pbmap_entries(numbers, &pb__deploy_options__labels_entry__descriptor, &entries, &n), 0);
    assert_null(entries);
    assert_int_equal(n, 0);
    pv_pbmap_entries_free(entries);
    json_decref(numbers);
    json_decref(o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entries_to_object),
        cmocka_unit_test(test_bad_value_reported),
        cmocka_unit_test(test_object_to_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
