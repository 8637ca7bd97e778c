/*
 * Unit tests of pv_deploy: CreateWorkload's checks in Eru's order with Eru's words and the field
 * named, and the plan request built from DeployOptions (node filter union, resources, strategy).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "pv_deploy.h"

typedef struct deploy {
    Pb__DeployOptions o;
    Pb__EntrypointOptions entry;
    Pb__DeployOptions__ResourcesEntry res, *res_ptr[1];
    Pb__DeployOptions__NodelabelsEntry label, *label_ptr[1];
    Pb__NodeFilter filter;
    Pb__NodeFilter__LabelsEntry flabel, *flabel_ptr[1];
    char *nodenames[1], *includes[1], *excludes[1];
} deploy;

/* A valid deploy of 3 instances of app "web" with a cpumem request. */
static void make(deploy *d, const char *resources) {
    memset(d, 0, sizeof *d);
    pb__deploy_options__init(&d->o);
    pb__entrypoint_options__init(&d->entry);
    d->entry.name = "main";
    d->o.name = "web";
    d->o.podname = "p1";
    d->o.image = "hub/ns/web:1";
    d->o.count = 3;
    d->o.entrypoint = &d->entry;
    pb__deploy_options__resources_entry__init(&d->res);
    d->res.key = "cpumem";
    d->res.value.data = (uint8_t *)resources;
    d->res.value.len = strlen(resources);
    d->res_ptr[0] = &d->res;
    d->o.resources = d->res_ptr;
    d->o.n_resources = 1;
}

static void expect(const deploy *d, const char *msg) {
    pv_status st;
    assert_int_equal(pv_deploy_check(&d->o, &st), PV_INVALID_ARGUMENT);
    if (!strstr(st.msg, msg)) fail_msg("\"%s\" does not contain \"%s\"", st.msg, msg);
}

static void test_check_order_and_words(void **state) {
    (void)state;
    deploy d;
    make(&d, "{\"memory-request\":\"1G\"}");
    pv_status st;
    assert_int_equal(pv_deploy_check(&d.o, &st), PV_OK);
    d.o.name = "";
    d.o.podname = "";
    expect(&d, "name: app name is empty"); /* the first failing check wins, as in Eru */
    d.o.name = "web";
    expect(&d, "podname: pod name is empty");
    d.o.podname = "p1";
    d.o.image = NULL;
    expect(&d, "image: image is empty");
    d.o.image = "img";
    d.o.count = 0;
    expect(&d, "count: count is 0");
    d.o.count = -2;
    expect(&d, "count: count is 0 (got -2)");
    d.o.count = PV_DEPLOY_MAX_COUNT + 1;
    expect(&d, "count: 1000001 is more than one deploy may ask for (1000000)");
    d.o.count = 1;
    d.o.entrypoint = NULL;
    expect(&d, "entrypoint.name: entrypoint name is empty");
    d.o.entrypoint = &d.entry;
    d.entry.name = "bad_entry";
    expect(&d, "entrypoint name has '_' character (\"bad_entry\")");
    d.entry.name = "good-entry";
    assert_int_equal(pv_deploy_check(&d.o, &st), PV_OK);
}

static void test_check_resources(void **state) {
    (void)state;
    deploy d;
    make(&d, "{\"memory-request\":\"-1G\"}");
    expect(&d, "memory-request");
    make(&d, "{nope");
    expect(&d, "resources[cpumem]: not valid JSON");
    make(&d, "[1]");
    expect(&d, "resources[cpumem]: the plugin's document must be a JSON object");
    make(&d, "{\"cpu-request\":1}");
    d.res.key = "gpu";
    expect(&d, "unknown plugin");
}

static void test_plan_body(void **state) {
    (void)state;
    deploy d;
    make(&d, "{\"memory-request\":\"1G\"}");
    d.o.deploy_strategy = PB__DEPLOY_OPTIONS__STRATEGY__EACH;
    d.o.nodes_limit = 2;
    d.nodenames[0] = "n1";
    d.o.nodenames = d.nodenames;
    d.o.n_nodenames = 1;
    pb__deploy_options__nodelabels_entry__init(&d.label);
    d.label.key = "zone";
    d.label.value = "a";
    d.label_ptr[0] = &d.label;
    d.o.nodelabels = d.label_ptr;
    d.o.n_nodelabels = 1;
    pb__node_filter__init(&d.filter);
    d.includes[0] = "n2";
    d.excludes[0] = "n3";
    d.filter.includes = d.includes;
    d.filter.n_includes = 1;
    d.filter.excludes = d.excludes;
    d.filter.n_excludes = 1;
    pb__node_filter__labels_entry__init(&d.flabel);
    d.flabel.key = "disk";
    d.flabel.value = "ssd";
    d.flabel_ptr[0] = &d.flabel;
    d.filter.labels = d.flabel_ptr;
    d.filter.n_labels = 1;
    d.filter.all = 1;
    d.o.node_filter = &d.filter;
    char *body = NULL;
    pv_status st;
    assert_int_equal(pv_deploy_plan_body(&d.o, "op-1", &body, &st), PV_OK);
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "pod")), "p1");
    json_t *inc = json_object_get(j, "includes");
    assert_int_equal(json_array_size(inc), 2);
    assert_string_equal(json_string_value(json_array_get(inc, 0)), "n1");
    assert_string_equal(json_string_value(json_array_get(inc, 1)), "n2");
    assert_string_equal(json_string_value(json_array_get(json_object_get(j, "excludes"), 0)), "n3");
    json_t *labels = json_object_get(j, "labels");
    assert_string_equal(json_string_value(json_object_get(labels, "zone")), "a");
    assert_string_equal(json_string_value(json_object_get(labels, "disk")), "ssd");
    assert_true(json_is_true(json_object_get(j, "all")));
    assert_int_equal(json_integer_value(json_object_get(j, "strategy")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), 3);
    assert_int_equal(json_integer_value(json_object_get(j, "nodes_limit")), 2);
    assert_string_equal(json_string_value(json_object_get(j, "app")), "web");
    assert_string_equal(json_string_value(json_object_get(j, "entrypoint")), "main");
    assert_string_equal(json_string_value(json_object_get(j, "owner")), "op-1");
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_object_get(j, "resources"), "cpumem"), "memory-request")),
        "1G");
    json_decref(j);
    make(&d, "{\"memory-request\":\"x\"}");
    assert_int_equal(pv_deploy_plan_body(&d.o, NULL, &body, &st), PV_INVALID_ARGUMENT);
    assert_null(body);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_order_and_words),
        cmocka_unit_test(test_check_resources),
        cmocka_unit_test(test_plan_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
