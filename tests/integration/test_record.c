/*
 * The record codec (pv_record) on a real Redis: a struct encoded into HSET's arguments, stored,
 * read back with HGETALL and decoded is the same struct; the same through JSON (unknown fields
 * kept); damaged stored values (numbers that do not parse or do not fit, booleans other than
 * 0/1, unknown enum names, texts too long for their buffer, required fields absent) are
 * PV_DATA_LOSS naming the key, the field and the value. Then, for each record kind, a record
 * written by its own functions reads back through the codec, and a damaged field of it is
 * rejected by the kind's reader with the key and the field named. (The storage records have
 * theirs in test_storage_records.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pv_keys.h"
#include "pv_op.h"
#include "pv_registry.h"
#include "pv_upgrade.h"
#include "pv_workload.h"
#include "pv_record.h"
#include "pv_redis.h"
#include "pv_test_redis.h"

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    redisContext *c; /* a plain connection: what the tests write and read behind the codec */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_keys_init(&f->keys, "t:", &st);
    if (!(f->r = pv_test_redis_client(f->srv, 5000))) return -1;
    if (!(f->c = pv_test_redis_connect(f->srv))) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    redisFree(f->c);
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

static void exec_cmd(fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(f->c, fmt, ap);
    va_end(ap);
    assert_non_null(rep);
    assert_int_not_equal(rep->type, REDIS_REPLY_ERROR);
    freeReplyObject(rep);
}

static redisReply *hgetall(fixture *f, const char *key) {
    redisReply *rep = redisCommand(f->c, "HGETALL %s", key);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_ARRAY);
    return rep;
}

/* ---- a schema with every field type ---- */

typedef struct sample {
    char id[8];
    char *name;
    int count;
    long total;
    int64_t at_ms;
    bool on;
    int color;
    double ratio;
    json_t *doc;
    char *note;
    json_t *extra;
} sample;

static const char *const k_colors[] = {"NONE", "RED", "GREEN", NULL};

static const pv_field k_sample_fields[] = {
    {.name = "id", .type = PV_FIELD_CHARS, .off = offsetof(sample, id), .cap = 8, .required = true},
    {.name = "name", .type = PV_FIELD_STR, .off = offsetof(sample, name)},
    {.name = "count", .type = PV_FIELD_INT, .off = offsetof(sample, count)},
    {.name = "total", .type = PV_FIELD_LONG, .off = offsetof(sample, total)},
    {.name = "at_ms", .type = PV_FIELD_I64, .off = offsetof(sample, at_ms)},
    {.name = "on", .type = PV_FIELD_BOOL, .off = offsetof(sample, on)},
    {.name = "color", .type = PV_FIELD_ENUM, .off = offsetof(sample, color), .names = k_colors},
    {.name = "ratio", .type = PV_FIELD_DOUBLE, .off = offsetof(sample, ratio)},
    {.name = "doc", .type = PV_FIELD_JSON, .off = offsetof(sample, doc), .dflt = "{}"},
    {.name = "note", .type = PV_FIELD_STR, .off = offsetof(sample, note), .dflt = "none"},
};

static const pv_record_schema k_sample = {"sample", k_sample_fields,
                                          PV_RECORD_NFIELDS(k_sample_fields), sizeof(sample),
                                          offsetof(sample, extra)};

static void fill_sample(sample *s) {
    memset(s, 0, sizeof *s);
    strcpy(s->id, "s-1");
    s->name = strdup("first one");
    s->count = -7;
    s->total = 1L << 40;
    s->at_ms = INT64_MAX;
    s->on = true;
    s->color = 2;
    s->ratio = 1.5;
    s->doc = json_pack("{s:i, s:[s]}", "a", 1, "b", "x");
    s->note = strdup("");
}

static void assert_same_sample(const sample *a, const sample *b) {
    assert_string_equal(a->id, b->id);
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->count, b->count);
    assert_int_equal(a->total, b->total);
    assert_true(a->at_ms == b->at_ms);
    assert_int_equal(a->on, b->on);
    assert_int_equal(a->color, b->color);
    assert_true(a->ratio == b->ratio);
    assert_true(json_equal(a->doc, b->doc));
    assert_string_equal(a->note, b->note);
}

/* HSET key <the sample's fields> through the codec's encoding. */
static void store_sample(fixture *f, const char *key, const sample *s) {
    pv_strv argv = {0};
    pv_strv_add(&argv, "HSET");
    pv_strv_add(&argv, key);
    assert_int_equal(pv_record_encode(&k_sample, s, &argv), 0);
    assert_int_equal(argv.n, 2 + 2 * k_sample.nfields);
    redisReply *rep = redisCommandArgv(f->c, (int)argv.n, (const char **)argv.v, NULL);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    freeReplyObject(rep);
    pv_strv_free(&argv);
}

static void test_hash_round_trip(void **state) {
    fixture *f = *state;
    sample in, out;
    fill_sample(&in);
    store_sample(f, "t:sample:1", &in);
    exec_cmd(f, "HSET t:sample:1 j:step done"); /* unknown fields are skipped */
    redisReply *rep = hgetall(f, "t:sample:1");
    pv_status st = {0};
    assert_int_equal(pv_record_decode(&k_sample, "t:sample:1", rep, &out, &st), PV_OK);
    assert_same_sample(&in, &out);
    assert_null(out.extra); /* a hash keeps no unknown fields */
    freeReplyObject(rep);
    pv_record_free(&k_sample, &out);
    assert_null(out.name); /* zeroed */

    /* absent fields take their defaults; only id is required */
    exec_cmd(f, "HSET t:sample:2 id s-2");
    rep = hgetall(f, "t:sample:2");
    assert_int_equal(pv_record_decode(&k_sample, "t:sample:2", rep, &out, &st), PV_OK);
    assert_string_equal(out.id, "s-2");
    assert_string_equal(out.name, "");
    assert_string_equal(out.note, "none");
    assert_int_equal(out.count, 0);
    assert_false(out.on);
    assert_int_equal(out.color, 0);
    assert_true(json_is_object(out.doc) && json_object_size(out.doc) == 0);
    freeReplyObject(rep);
    pv_record_free(&k_sample, &out);
    pv_record_free(&k_sample, &in);
}

static void test_json_round_trip(void **state) {
    (void)state;
    sample in, out;
    fill_sample(&in);
    in.at_ms = 1234567890123;
    json_t *j = pv_record_encode_json(&k_sample, &in);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "color")), "GREEN");
    assert_true(json_is_true(json_object_get(j, "on")));
    json_object_set_new(j, "later", json_string("a newer build's field"));
    pv_status st = {0};
    assert_int_equal(pv_record_decode_json(&k_sample, "t:sample:j", j, &out, &st), PV_OK);
    assert_same_sample(&in, &out);
    assert_non_null(out.extra);
    assert_string_equal(json_string_value(json_object_get(out.extra, "later")),
                        "a newer build's field");
    json_t *again = pv_record_encode_json(&k_sample, &out); /* what it did not know, it keeps */
    assert_true(json_equal(again, j));
    json_decref(again);
    json_decref(j);
    pv_record_free(&k_sample, &out);
    pv_record_free(&k_sample, &in);
}

/* The message a damaged field of t:sample:d gets. */
static void expect_damage(fixture *f, const char *field, const char *value, const char *want) {
    exec_cmd(f, "DEL t:sample:d");
    exec_cmd(f, "HSET t:sample:d id s-d %s %s", field, value);
    redisReply *rep = hgetall(f, "t:sample:d");
    sample out;
    pv_status st = {0};
    assert_int_equal(pv_record_decode(&k_sample, "t:sample:d", rep, &out, &st), PV_DATA_LOSS);
    char msg[512];
    snprintf(msg, sizeof msg, "sample record t:sample:d: field %s: bad value \"%s\" (want %s)",
             field, value, want);
    assert_string_equal(st.msg, msg);
    assert_null(out.name); /* freed and zeroed */
    freeReplyObject(rep);
}

static void test_damaged_fields(void **state) {
    fixture *f = *state;
    expect_damage(f, "count", "12x", "a whole number in range");
    expect_damage(f, "count", "4294967296", "a whole number in range"); /* past int */
    expect_damage(f, "at_ms", "9223372036854775808", "a whole number in range");
    expect_damage(f, "total", "", "a whole number in range");
    expect_damage(f, "on", "2", "0 or 1");
    expect_damage(f, "on", "true", "0 or 1");
    expect_damage(f, "color", "BLUE", "a known name");
    expect_damage(f, "ratio", "nan", "a number");
    expect_damage(f, "doc", "{oops", "JSON");
    expect_damage(f, "id", "12345678", "a short text"); /* 8 bytes do not fit in char[8] */

    exec_cmd(f, "DEL t:sample:d");
    exec_cmd(f, "HSET t:sample:d name nameless");
    redisReply *rep = hgetall(f, "t:sample:d");
    sample out;
    pv_status st = {0};
    assert_int_equal(pv_record_decode(&k_sample, "t:sample:d", rep, &out, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, "sample record t:sample:d: field id: absent");
    freeReplyObject(rep);

    /* JSON: the wrong JSON type is damage too */
    json_t *j = json_pack("{s:s, s:s}", "id", "s-j", "count", "3");
    assert_int_equal(pv_record_decode_json(&k_sample, "t:sample:j", j, &out, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, "sample record t:sample:j: field count: bad value \"\"3\"\" (want "
                                "a whole number in range)");
    json_decref(j);
    j = json_pack("[]");
    assert_int_equal(pv_record_decode_json(&k_sample, "t:sample:j", j, &out, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, "sample record t:sample:j: not a JSON object");
    json_decref(j);

    /* not a field/value array at all: the reply, not the record, is wrong */
    redisReply *str = redisCommand(f->c, "PING");
    assert_int_equal(pv_record_decode(&k_sample, "t:sample:d", str, &out, &st), PV_INTERNAL);
    freeReplyObject(str);
}

/* ---- each record kind ---- */

/* Stores rec under key through the codec's encoding and decodes it back into out. */
static void codec_round_trip(fixture *f, const pv_record_schema *s, const void *rec,
                             const char *key, void *out) {
    pv_strv argv = {0};
    pv_strv_add(&argv, "HSET");
    pv_strv_add(&argv, key);
    assert_int_equal(pv_record_encode(s, rec, &argv), 0);
    redisReply *rep = redisCommandArgv(f->c, (int)argv.n, (const char **)argv.v, NULL);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_INTEGER);
    freeReplyObject(rep);
    pv_strv_free(&argv);
    rep = hgetall(f, key);
    pv_status st = {0};
    assert_int_equal(pv_record_decode(s, key, rep, out, &st), PV_OK);
    freeReplyObject(rep);
}

/* The message a kind's reader gives for field = value in the record at key. */
static void damage(fixture *f, const char *what, const char *key, const char *field,
                   const char *value, const char *want, char *msg, size_t len) {
    exec_cmd(f, "HSET %s %s %s", key, field, value);
    snprintf(msg, len, "%s record %s: field %s: bad value \"%s\" (want %s)", what, key, field,
             value, want);
}

static void test_op_records(void **state) {
    fixture *f = *state;
    pv_op_opts o = {.retention_seconds = 3600, .events_maxlen = 100};
    pv_op_submit_req req = {.kind = "test.sleep",
                            .target = "node-1",
                            .queue = "ops",
                            .params_json = "{\"ms\":5}",
                            .request_id = "rid-1"};
    pv_op op, got, back;
    bool existed;
    pv_status st = {0};
    assert_int_equal(pv_op_submit(f->r, &f->keys, &o, &req, &op, &existed, &st), PV_OK);
    assert_int_equal(pv_op_get(f->r, &f->keys, op.id, &got, &st), PV_OK);
    assert_string_equal(got.kind, "test.sleep");
    assert_string_equal(got.params, "{\"ms\":5}");
    assert_string_equal(got.request_id, "rid-1");
    assert_int_equal(got.status, PV_OP_PENDING);
    assert_int_equal(got.max_attempts, PV_OP_DEFAULT_MAX_ATTEMPTS);
    assert_true(got.created_ms > 0);
    codec_round_trip(f, &pv_op_schema, &got, "t:copy:op", &back);
    assert_string_equal(back.id, got.id);
    assert_string_equal(back.target, got.target);
    assert_int_equal(back.status, got.status);
    assert_true(back.created_ms == got.created_ms);
    assert_string_equal(back.metadata, got.metadata);
    pv_op_clear(&back);

    char key[PV_KEY_MAX], msg[512];
    snprintf(key, sizeof key, "t:{ops}:op:%s", op.id);
    damage(f, "operation", key, "attempts", "1e3", "a whole number in range", msg, sizeof msg);
    assert_int_equal(pv_op_get(f->r, &f->keys, op.id, &back, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    exec_cmd(f, "HSET %s attempts 0", key);
    damage(f, "operation", key, "status", "FINISHED", "a known name", msg, sizeof msg);
    pv_op *list = NULL;
    size_t n = 0;
    pv_op_filter all = {.status = PV_OP_ANY};
    assert_int_equal(pv_op_list(f->r, &f->keys, &all, &list, &n, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    pv_op_clear(&got);
    pv_op_clear(&op);
}

static void test_pod_and_node_records(void **state) {
    fixture *f = *state;
    pv_status st = {0};
    pv_pod_spec ps = {.name = "web",
                      .desc = "the pod",
                      .cp_nodes = 1,
                      .worker_nodes = 2,
                      .labels = "{\"tier\":\"a\"}"};
    pv_pod pod, back_pod;
    assert_int_equal(pv_registry_add_pod(f->r, &f->keys, &ps, &pod, &st), PV_OK);
    assert_int_equal(pod.cp_nodes, 1);
    assert_int_equal(pod.worker_nodes, 2);
    assert_string_equal(pod.labels, "{\"tier\":\"a\"}");
    assert_string_equal(pod.annotations, "{}");
    codec_round_trip(f, &pv_pod_schema, &pod, "t:copy:pod", &back_pod);
    assert_string_equal(back_pod.id, pod.id);
    assert_string_equal(back_pod.desc, "the pod");
    assert_int_equal(back_pod.worker_nodes, 2);
    assert_true(back_pod.created_ms == pod.created_ms);
    pv_pod_clear(&back_pod);

    pv_node_spec ns = {.name = "n1",
                       .pod_name = "web",
                       .endpoint = "process://",
                       .resources = "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}"};
    pv_node node, back_node;
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &ns, &node, &st), PV_OK);
    assert_string_equal(node.role, "worker");
    assert_string_equal(node.engine, "process");
    assert_false(node.bypass);
    assert_false(node.alive);
    codec_round_trip(f, &pv_node_schema, &node, "t:copy:node", &back_node);
    assert_string_equal(back_node.id, node.id);
    assert_string_equal(back_node.resources, node.resources);
    assert_string_equal(back_node.pod_id, pod.id);
    assert_int_equal(back_node.bypass, node.bypass);
    pv_node_clear(&back_node);

    /* damage: each reader names the record's key (made from its id) and the field */
    char key[PV_KEY_MAX], msg[512];
    snprintf(key, sizeof key, "t:{reg}:pod:%s", pod.id);
    damage(f, "pod", key, "cp_nodes", "one", "a whole number in range", msg, sizeof msg);
    assert_int_equal(pv_registry_get_pod(f->r, &f->keys, PV_REG_BY_NAME, "web", &back_pod, &st),
                     PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    pv_pod *pods = NULL;
    size_t n = 0;
    assert_int_equal(pv_registry_list_pods(f->r, &f->keys, &pods, &n, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    snprintf(key, sizeof key, "t:{reg}:node:%s", node.id);
    damage(f, "node", key, "bypass", "yes", "0 or 1", msg, sizeof msg);
    assert_int_equal(pv_registry_get_node(f->r, &f->keys, PV_REG_BY_NAME, "n1", &back_node, &st),
                     PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    exec_cmd(f, "HSET %s bypass 0", key);
    damage(f, "node", key, "usage_rev", "99999999999999999999", "a whole number in range", msg,
           sizeof msg);
    pv_node *nodes = NULL;
    assert_int_equal(pv_registry_list_nodes(f->r, &f->keys, "web", &nodes, &n, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    pv_node_clear(&node);
    pv_pod_clear(&pod);
}

static void test_workload_records(void **state) {
    fixture *f = *state;
    pv_status st = {0};
    pv_workload w = {0}, got, copy;
    assert_int_equal(pv_workload_new_id(w.id, &st), PV_OK);
    w.name = strdup("app_web_abcdef");
    w.app = strdup("app");
    w.entry = strdup("web");
    w.node = strdup("n1");
    w.privileged = true;
    w.env = strdup("[\"A=1\"]");
    w.created_ms = 1700000000000;
    /* stored through the codec at its key, read by the kind's own reader */
    char key[PV_KEY_MAX], msg[512];
    snprintf(key, sizeof key, "t:{reg}:wl:%s", w.id);
    codec_round_trip(f, &pv_workload_schema, &w, key, &copy);
    pv_workload_clear(&copy);
    exec_cmd(f, "SADD t:{reg}:app-workloads:app %s", w.id);
    assert_int_equal(pv_workload_get(f->r, &f->keys, w.id, &got, &st), PV_OK);
    assert_string_equal(got.id, w.id);
    assert_string_equal(got.name, "app_web_abcdef");
    assert_true(got.privileged);
    assert_string_equal(got.env, "[\"A=1\"]");
    assert_string_equal(got.labels, "{}"); /* written as its default */
    assert_string_equal(got.pod, "");
    assert_true(got.created_ms == 1700000000000);
    pv_workload_clear(&got);

    damage(f, "workload", key, "created_ms", "soon", "a whole number in range", msg, sizeof msg);
    assert_int_equal(pv_workload_get(f->r, &f->keys, w.id, &got, &st), PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    exec_cmd(f, "HSET %s created_ms 1", key);
    damage(f, "workload", key, "privileged", "2", "0 or 1", msg, sizeof msg);
    pv_workload *list = NULL;
    size_t n = 0;
    assert_int_equal(pv_workload_list(f->r, &f->keys, "app", NULL, NULL, NULL, &list, &n, &st),
                     PV_DATA_LOSS);
    assert_string_equal(st.msg, msg);
    pv_workload_clear(&w);
}

static char *get_text(fixture *f, const char *key) {
    redisReply *rep = redisCommand(f->c, "GET %s", key);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STRING);
    char *text = strdup(rep->str);
    freeReplyObject(rep);
    return text;
}

/* The upgrade record: written by pv_upgrade_put, read back the same to the byte (its nodes'
 * optional fields and a field no build knows included); a damaged field of the record, of its
 * strategy or of a node is DATA_LOSS naming the key and the field. */
static void test_upgrade_records(void **state) {
    fixture *f = *state;
    pv_status st = {0};
    pv_upgrade_strategy s = {PV_UPGRADE_CANARY, 0, 1, 0};
    const char *ids[] = {"id-a", "id-b"}, *names[] = {"a", "b"};
    bool cordoned[] = {true, false};
    pv_upgrade_rec r, got;
    assert_int_equal(
        pv_upgrade_new_record("op-9", "c1", "v1.0.0", "v1.1.0", &s, ids, names, cordoned, 2, 5, &r),
        0);
    r.nodes[0].hooked = true;
    r.nodes[0].drained = json_pack("{s:i, s:i, s:i}", "moved", 2, "removed", 0, "left", 1);
    r.nodes[0].state = PV_NODE_UPGRADE_UPGRADED;
    r.nodes[0].finished_ms = 77;
    assert_int_equal(pv_upgrade_put(f->r, &f->keys, "c1", &r, &st), PV_OK);
    assert_true(r.updated_ms > 5);
    char *stored = get_text(f, "t:{reg}:upgrade:c1");
    assert_non_null(strstr(stored, "\"finished_ms\":77,\"hooked\":true,\"drained\":{\"moved\":2,"
                                   "\"removed\":0,\"left\":1}},{\"id\":\"id-b\""));
    assert_null(strstr(stored, "\"hooked\":false")); /* unset optional fields stay absent */
    assert_int_equal(pv_upgrade_get(f->r, &f->keys, "c1", &got, &st), PV_OK);
    assert_string_equal(got.operation_id, "op-9");
    assert_int_equal(got.strategy.type, PV_UPGRADE_CANARY);
    assert_int_equal(got.strategy.max_unavailable, 1);
    assert_int_equal(got.n_nodes, 2);
    assert_true(got.nodes[0].hooked);
    assert_int_equal(json_integer_value(json_object_get(got.nodes[0].drained, "left")), 1);
    assert_false(got.nodes[1].hooked);
    assert_null(got.nodes[1].drained);
    assert_true(got.updated_ms == r.updated_ms);
    char *again = pv_upgrade_dumps(&got);
    assert_string_equal(again, stored);
    free(again);
    pv_upgrade_rec_free(&got);
    free(stored);
    pv_upgrade_rec_free(&r);

    /* fields this build does not know, at any level, are written back */
    const char *doc = "{\"cluster_id\":\"c2\",\"operation_id\":\"op-1\",\"phase\":2,\"later\":[1],"
                      "\"strategy\":{\"type\":1,\"surge_pct\":5},\"nodes\":[{\"id\":\"x\","
                      "\"state\":3,\"zone\":\"z1\"}]}";
    exec_cmd(f, "SET t:{reg}:upgrade:c2 %s", doc);
    assert_int_equal(pv_upgrade_get(f->r, &f->keys, "c2", &got, &st), PV_OK);
    assert_int_equal(got.phase, PV_UPGRADE_UPGRADING);
    assert_int_equal(got.nodes[0].state, PV_NODE_UPGRADE_UPGRADING);
    assert_int_equal(pv_upgrade_put(f->r, &f->keys, "c2", &got, &st), PV_OK);
    pv_upgrade_rec_free(&got);
    stored = get_text(f, "t:{reg}:upgrade:c2");
    json_t *back = json_loads(stored, 0, NULL);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(back, "later"), 0)), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(back, "strategy"), "surge_pct")), 5);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(back, "nodes"), 0), "zone")),
                        "z1");
    json_decref(back);
    free(stored);

    static const struct {
        const char *doc, *want;
    } k[] = {
        {"{\"phase\":\"done\"}",
         "upgrade record t:{reg}:upgrade:c3: field phase: bad value \"\"done\"\" (want a whole "
         "number in range)"},
        {"{\"strategy\":{\"partition\":1.5}}",
         "upgrade record t:{reg}:upgrade:c3 strategy: field partition: bad value \"1.5\""},
        {"{\"nodes\":[{\"id\":\"a\"},{\"id\":\"b\",\"was_cordoned\":\"yes\"}]}",
         "upgrade record t:{reg}:upgrade:c3 nodes[1]: field was_cordoned: bad value "
         "\"\"yes\"\" (want 0 or 1)"},
        {"{\"nodes\":{\"id\":\"a\"}}",
         "upgrade record t:{reg}:upgrade:c3: field nodes: not an array"},
        {"not json", "upgrade record t:{reg}:upgrade:c3: not JSON"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        exec_cmd(f, "SET t:{reg}:upgrade:c3 %s", k[i].doc);
        assert_int_equal(pv_upgrade_get(f->r, &f->keys, "c3", &got, &st), PV_DATA_LOSS);
        if (!strstr(st.msg, k[i].want)) fail_msg("%s: %s", k[i].doc, st.msg);
        assert_null(got.nodes); /* nothing left to free */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_hash_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_json_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_op_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pod_and_node_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workload_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upgrade_records, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
