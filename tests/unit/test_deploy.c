/*
 * Unit tests of pv_deploy: CreateWorkload's checks in Eru's order with Eru's words and the field
 * named, every field a deploy's instances would otherwise fail on one by one (name, image, dir,
 * restart, publish, log driver, user, env, dns, extra_hosts, raw_args, modes, nodes_limit), and
 * the plan request built from DeployOptions (node filter union, resources, strategy).
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

/* Each field Eru validates before a deploy starts: a bad value fails the whole check, naming the
 * field and the quoted value; a good one of the same field passes. */
static void test_check_every_field(void **state) {
    (void)state;
    deploy d;
    pv_status st;
    make(&d, "{\"memory-request\":\"1G\"}");
    d.o.name = "a/b";
    expect(&d, "name: \"a/b\" must not contain '/'");
    d.o.name = "web";
    d.o.image = "../../etc/passwd";
    expect(&d, "image ../../etc/passwd: not a valid reference");
    d.o.image = "hub:5000/ns/web:v1";
    assert_int_equal(pv_deploy_check(&d.o, &st), PV_OK);
    d.o.nodes_limit = -1;
    expect(&d, "nodes_limit: -1 is negative");
    d.o.nodes_limit = 2;
    d.entry.name = "we b";
    expect(&d, "entrypoint.name: \"we b\" has a character other than");
    d.entry.name = "main";
    d.entry.dir = "a/../../x";
    expect(&d, "entrypoint.dir: \"a/../../x\" must stay inside the workload's root");
    d.entry.dir = "/srv/app";
    d.entry.restart = "sometimes";
    expect(&d, "entrypoint.restart: \"sometimes\" is not a restart policy");
    d.entry.restart = "on-failure";
    char *publish[] = {"80/tcp", "70000"};
    d.entry.publish = publish;
    d.entry.n_publish = 2;
    expect(&d, "entrypoint.publish: \"70000\" is not \"port/proto\"");
    publish[1] = "53/udp";
    Pb__LogOptions log;
    pb__log_options__init(&log);
    log.type = "carrier-pigeon";
    d.entry.log = &log;
    expect(&d, "entrypoint.log.type: \"carrier-pigeon\" is not a log driver");
    log.type = "journald";
    assert_int_equal(pv_deploy_check(&d.o, &st), PV_OK);
    d.o.user = "root:wheel:x";
    expect(&d, "user: \"root:wheel:x\" is not");
    d.o.user = "-rf";
    expect(&d, "user: \"-rf\" is not");
    d.o.user = "1000:1000";
    char *env[] = {"A=1", "=x"};
    d.o.env = env;
    d.o.n_env = 2;
    expect(&d, "env: \"=x\" is not KEY=VALUE");
    env[1] = "NOEQUALS";
    expect(&d, "env: \"NOEQUALS\" is not KEY=VALUE");
    env[1] = "B=";
    char *dns[] = {"10.0.0.53", "ns1.example"};
    d.o.dns = dns;
    d.o.n_dns = 2;
    expect(&d, "dns: \"ns1.example\" is not an IPv4 or IPv6 address");
    dns[1] = "fd00::53";
    char *hosts[] = {"db:10.0.0.7", "db:nowhere"};
    d.o.extra_hosts = hosts;
    d.o.n_extra_hosts = 2;
    expect(&d, "extra_hosts: \"db:nowhere\" is not \"host:ip\"");
    hosts[1] = "v6:fd00::7";
    d.o.raw_args.data = (uint8_t *)"[1,2]";
    d.o.raw_args.len = 5;
    expect(&d, "raw_args: 5 bytes that are not a JSON object");
    d.o.raw_args.data = (uint8_t *)"{\"x\":1}";
    d.o.raw_args.len = 7;
    assert_int_equal(pv_deploy_check(&d.o, &st), PV_OK);
}

/* Modes: 0 to 07777, so neither -1 nor a mode with bits past the permission and special bits
 * reaches a node's chmod. */
static void test_check_modes(void **state) {
    (void)state;
    deploy d;
    pv_status st;
    make(&d, "{\"memory-request\":\"1G\"}");
    Pb__FileMode mode;
    pb__file_mode__init(&mode);
    Pb__DeployOptions__ModesEntry e, *ep[1] = {&e};
    pb__deploy_options__modes_entry__init(&e);
    e.key = "/etc/app.conf";
    e.value = &mode;
    d.o.modes = ep;
    d.o.n_modes = 1;
    mode.mode = -1;
    expect(&d, "modes[\"/etc/app.conf\"]: -1");
    mode.mode = 010000;
    expect(&d, "modes[\"/etc/app.conf\"]: 4096 (010000) is not a file mode (0 to 07777)");
    mode.mode = 07777;
    assert_int_equal(pv_deploy_check(&d.o, &st), PV_OK);
    assert_int_equal(pv_deploy_check_mode("mode", 0, &st), PV_OK);
    assert_int_equal(pv_deploy_check_mode("mode", INT64_MAX, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "mode: 9223372036854775807"));
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
        cmocka_unit_test(test_check_every_field),
        cmocka_unit_test(test_check_modes),
        cmocka_unit_test(test_plan_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
