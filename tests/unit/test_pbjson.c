/* pv_pbjson: messages of the APIs to JSON and back: enums by name, int64 as strings, maps,
 * nested messages, timestamps, and errors that name the field's path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pivirt/cluster/v1/cluster.pb-c.h"
#include "pivirt/storage/v1/storage.pb-c.h"
#include "pv_pbjson.h"

static void test_to_json(void **state) {
    (void)state;
    Pivirt__Storage__V1__Volume v = PIVIRT__STORAGE__V1__VOLUME__INIT;
    Pivirt__Storage__V1__Volume__LabelsEntry e = PIVIRT__STORAGE__V1__VOLUME__LABELS_ENTRY__INIT;
    Pivirt__Storage__V1__Volume__LabelsEntry *entries[] = {&e};
    Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    ts.seconds = 1764694538; /* 2025-12-02T16:55:38Z */
    ts.nanos = 250000000;
    e.key = "app";
    e.value = "db";
    v.id = "vol-1";
    v.size_bytes = 107374182400LL;
    v.format = PIVIRT__STORAGE__V1__VOLUME_FORMAT__VOLUME_FORMAT_QCOW2;
    v.labels = entries;
    v.n_labels = 1;
    v.created_at = &ts;
    json_t *j = pv_pbjson_to_json(&v.base);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "vol-1");
    assert_string_equal(json_string_value(json_object_get(j, "size_bytes")), "107374182400");
    assert_string_equal(json_string_value(json_object_get(j, "format")), "VOLUME_FORMAT_QCOW2");
    assert_string_equal(json_string_value(json_object_get(j, "status")),
                        "VOLUME_STATUS_UNSPECIFIED"); /* scalars always written */
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "labels"), "app")),
                        "db");
    assert_string_equal(json_string_value(json_object_get(j, "created_at")),
                        "2025-12-02T16:55:38.250Z");
    assert_null(json_object_get(j, "updated_at")); /* unset messages left out */
    json_decref(j);
}

/* created_at of a Volume written as JSON. Caller frees. */
static char *created_at_json(int64_t seconds, int32_t nanos) {
    Pivirt__Storage__V1__Volume v = PIVIRT__STORAGE__V1__VOLUME__INIT;
    Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    ts.seconds = seconds;
    ts.nanos = nanos;
    v.created_at = &ts;
    json_t *j = pv_pbjson_to_json(&v.base);
    char *out = strdup(json_string_value(json_object_get(j, "created_at")));
    json_decref(j);
    return out;
}

static void expect_created_at(int64_t seconds, int32_t nanos, const char *want) {
    char *got = created_at_json(seconds, nanos);
    assert_string_equal(got, want);
    free(got);
}

/* Found by fuzz_pbjson: a time before 1970 read from JSON had negative nanos, written back as
 * ".-750Z", which did not read again. */
static void test_timestamps_round_trip_at_the_edges(void **state) {
    (void)state;
    const char *texts[] = {"1231-12-02T16:55:38.250Z", "1969-12-31T23:59:59.999Z",
                           "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z",
                           "0999-03-04T05:06:07Z"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char doc[128];
        snprintf(doc, sizeof doc, "{\"created_at\": \"%s\"}", texts[i]);
        json_t *j = json_loads(doc, 0, NULL);
        ProtobufCMessage *m = NULL;
        pv_status st;
        assert_int_equal(pv_pbjson_from_json(&pivirt__storage__v1__volume__descriptor, j, &m, &st),
                         PV_OK);
        const Pivirt__Storage__V1__Volume *v = (const void *)m;
        assert_true(v->created_at->nanos >= 0 && v->created_at->nanos < 1000000000);
        json_t *back = pv_pbjson_to_json(m);
        assert_string_equal(json_string_value(json_object_get(back, "created_at")), texts[i]);
        json_decref(back);
        protobuf_c_message_free_unpacked(m, NULL);
        json_decref(j);
    }
    /* invalid Timestamps off the wire: nanos carried into seconds, the range clamped */
    expect_created_at(0, -1, "1969-12-31T23:59:59.999Z");
    expect_created_at(0, 1500000000, "1970-01-01T00:00:01.500Z");
    expect_created_at(INT64_MAX, 0, "9999-12-31T23:59:59.999Z");
    expect_created_at(INT64_MIN, -999999999, "0001-01-01T00:00:00Z");
}

/* Strings that are not UTF-8 (protobuf-c does not check) are written with U+FFFD in place of
 * each stray byte, not left out. */
static void test_invalid_utf8_written_lossily(void **state) {
    (void)state;
    Pivirt__Storage__V1__Volume v = PIVIRT__STORAGE__V1__VOLUME__INIT;
    v.id = "vo\x80\x80\x04";
    json_t *j = pv_pbjson_to_json(&v.base);
    assert_string_equal(json_string_value(json_object_get(j, "id")),
                        "vo\xef\xbf\xbd\xef\xbf\xbd\x04");
    json_decref(j);
}

static void test_from_json(void **state) {
    (void)state;
    json_t *j = json_loads("{\"cluster_id\": \"c1\", \"targetVersion\": \"v2.0.0\", \"strategy\": "
                           "{\"type\": \"UPGRADE_TYPE_CANARY\", \"max_surge\": \"2\", "
                           "\"maxUnavailable\": 1}}",
                           0, NULL);
    ProtobufCMessage *m = NULL;
    pv_status st;
    assert_int_equal(
        pv_pbjson_from_json(&pivirt__cluster__v1__upgrade_cluster_request__descriptor, j, &m, &st),
        PV_OK);
    const Pivirt__Cluster__V1__UpgradeClusterRequest *r = (const void *)m;
    assert_string_equal(r->cluster_id, "c1");
    assert_string_equal(r->target_version, "v2.0.0");
    assert_int_equal(r->strategy->type, PIVIRT__CLUSTER__V1__UPGRADE_TYPE__UPGRADE_TYPE_CANARY);
    assert_int_equal(r->strategy->max_surge, 2);
    assert_int_equal(r->strategy->max_unavailable, 1);
    /* and back: the same JSON, by the .proto's names */
    json_t *back = pv_pbjson_to_json(m);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(back, "strategy"), "type")),
        "UPGRADE_TYPE_CANARY");
    json_decref(back);
    protobuf_c_message_free_unpacked(m, NULL);
    json_decref(j);

    j = json_loads("{\"name\": \"p\", \"type\": 1, \"config\": {\"path\": \"/srv\"}}", 0, NULL);
    assert_int_equal(
        pv_pbjson_from_json(&pivirt__storage__v1__create_pool_request__descriptor, j, &m, &st),
        PV_OK);
    const Pivirt__Storage__V1__CreatePoolRequest *p = (const void *)m;
    assert_int_equal(p->type, PIVIRT__STORAGE__V1__POOL_TYPE__POOL_TYPE_DIR);
    assert_int_equal(p->n_config, 1);
    assert_string_equal(p->config[0]->key, "path");
    assert_string_equal(p->config[0]->value, "/srv");
    protobuf_c_message_free_unpacked(m, NULL);
    json_decref(j);
}

static void expect_error(const ProtobufCMessageDescriptor *d, const char *text, const char *msg) {
    json_t *j = json_loads(text, 0, NULL);
    ProtobufCMessage *m = NULL;
    pv_status st;
    assert_int_equal(pv_pbjson_from_json(d, j, &m, &st), PV_INVALID_ARGUMENT);
    assert_null(m);
    if (!strstr(st.msg, msg)) fail_msg("\"%s\" not in \"%s\"", msg, st.msg);
    json_decref(j);
}

static void test_errors(void **state) {
    (void)state;
    const ProtobufCMessageDescriptor *up =
        &pivirt__cluster__v1__upgrade_cluster_request__descriptor;
    expect_error(up, "{\"strategy\": {\"max_surge\": \"x\"}}",
                 "strategy.max_surge: \"x\" is not a 32-bit integer");
    expect_error(up, "{\"strategy\": {\"type\": \"FAST\"}}",
                 "strategy.type: \"FAST\" is not a value of pivirt.cluster.v1.UpgradeType");
    expect_error(up, "{\"colour\": 1}",
                 "colour: pivirt.cluster.v1.UpgradeClusterRequest has no such field");
    expect_error(up, "[1]", "request: [1] is not an object");
    expect_error(&pivirt__storage__v1__create_pool_request__descriptor,
                 "{\"config\": {\"path\": 3}}", "config.path: 3 is not a string");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_to_json),
        cmocka_unit_test(test_timestamps_round_trip_at_the_edges),
        cmocka_unit_test(test_invalid_utf8_written_lossily),
        cmocka_unit_test(test_from_json),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
