/*
 * Unit tests of ck_report (pivirt-check's findings): a second pass keeps only what both passes
 * saw, compared by kind and subject whatever the detail says; differences sort by area, kind,
 * subject; the text summary and the JSON document carry the counts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ck_report.h"

static void test_keep_seen_by_kind_and_subject(void **state) {
    (void)state;
    ck_report a = {0}, b = {0};
    assert_int_equal(ck_report_add(&a, CK_AREA_OPS, "OP_UNACKED", "queue ops entry 1-1",
                                   "pending for %d ms", 61000),
                     0);
    assert_int_equal(ck_report_add(&a, CK_AREA_WORKLOADS, "WL_ORPHAN", "workload w1", "x"), 0);
    assert_int_equal(ck_report_add(&a, CK_AREA_STORAGE, "VOL_MISSING", "volume v1", "gone"), 0);
    /* the second pass: the same unacked entry, older now; the orphan was a create in flight;
     * a new difference the first pass did not see */
    assert_int_equal(ck_report_add(&b, CK_AREA_OPS, "OP_UNACKED", "queue ops entry 1-1",
                                   "pending for %d ms", 62000),
                     0);
    assert_int_equal(ck_report_add(&b, CK_AREA_STORAGE, "VOL_MISSING", "volume v1", "gone"), 0);
    assert_int_equal(ck_report_add(&b, CK_AREA_STORAGE, "VOL_MISSING", "volume v2", "gone"), 0);
    ck_report_keep_seen(&b, &a);
    assert_int_equal(b.ndiffs, 2);
    assert_string_equal(b.diffs[0].subject, "queue ops entry 1-1");
    assert_string_equal(b.diffs[0].detail, "pending for 62000 ms"); /* the latest figures */
    assert_string_equal(b.diffs[1].subject, "volume v1");
    ck_report_free(&a);
    ck_report_free(&b);
    assert_null(b.diffs);
    assert_int_equal(b.ndiffs, 0);
}

static void test_sort_and_text(void **state) {
    (void)state;
    ck_report r = {0};
    assert_int_equal(ck_report_add(&r, CK_AREA_CLUSTERS, "CLUSTER_NODE", "cluster c", "d1"), 0);
    assert_int_equal(ck_report_add(&r, CK_AREA_OPS, "OP_LOST", "op b", "d2"), 0);
    assert_int_equal(ck_report_add(&r, CK_AREA_OPS, "OP_LOST", "op a", "d3"), 0);
    assert_int_equal(ck_report_note(&r, "node %s: not here", "n9"), 0);
    r.ops = 7;
    ck_report_sort(&r);
    assert_string_equal(r.diffs[0].subject, "op a");
    assert_string_equal(r.diffs[1].subject, "op b");
    assert_string_equal(r.diffs[2].kind, "CLUSTER_NODE");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    ck_report_print_text(&r, f, 12);
    fclose(f);
    assert_non_null(strstr(text, "OP_LOST op a: d3\nOP_LOST op b: d2\nCLUSTER_NODE cluster c: d1\n"
                                 "note: node n9: not here\ncheck: 3 differences (ops 2, "
                                 "reservations 0, workloads 0, storage 0, clusters 1); checked 7 "
                                 "operations"));
    assert_non_null(strstr(text, " in 12 ms\n"));
    free(text);
    ck_report_free(&r);
}

static void test_json(void **state) {
    (void)state;
    ck_report r = {0};
    assert_int_equal(
        ck_report_add(&r, CK_AREA_RESERVATIONS, "RESV_LEAK", "allocation a.0", "held for ever"), 0);
    r.nodes = 3;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_report_print_json(&r, f, 5);
    fclose(f);
    json_t *doc = json_loads(text, 0, NULL);
    assert_non_null(doc);
    assert_int_equal(json_integer_value(json_object_get(doc, "total")), 1);
    assert_int_equal(json_integer_value(json_object_get(doc, "elapsed_ms")), 5);
    json_t *d = json_array_get(json_object_get(doc, "differences"), 0);
    assert_string_equal(json_string_value(json_object_get(d, "kind")), "RESV_LEAK");
    assert_string_equal(json_string_value(json_object_get(d, "area")), "reservations");
    assert_string_equal(json_string_value(json_object_get(d, "subject")), "allocation a.0");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(doc, "counts"), "reservations")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(doc, "checked"), "nodes")),
                     3);
    json_decref(doc);
    free(text);
    ck_report_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_seen_by_kind_and_subject),
        cmocka_unit_test(test_sort_and_text),
        cmocka_unit_test(test_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
