/*
 * Unit tests of pv_validate: plain names (every rule and its message, quoting and cutting of
 * hostile values), required fields, and the enum walk over real generated messages (grpc health,
 * google.protobuf descriptors with proto2 has_ flags) and over a small hand-built proto3
 * descriptor with repeated enums, sub-messages, a map and a oneof.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "pv_validate.h"

static void expect_error(int rc, const pv_status *st, const char *msg) {
    assert_int_equal(rc, PV_INVALID_ARGUMENT);
    assert_int_equal(st->code, PV_INVALID_ARGUMENT);
    assert_string_equal(st->msg, msg);
}

/* ---- names ---- */

static void test_name_accepts_plain_names(void **state) {
    (void)state;
    const char *ok[] = {"a", "web-1", "A_b.c", "1abc", "a.b.c", "x_", "node-01.pod_2", "Z"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        pv_status st;
        pv_status_clear(&st);
        assert_int_equal(pv_validate_name("name", ok[i], &st), PV_OK);
        assert_int_equal(st.code, PV_OK);
    }
    char max[PV_NAME_MAX + 1];
    memset(max, 'n', PV_NAME_MAX);
    max[PV_NAME_MAX] = '\0';
    assert_int_equal(pv_validate_name("name", max, NULL), PV_OK);
}

static void test_name_required(void **state) {
    (void)state;
    pv_status st;
    expect_error(pv_validate_name("name", "", &st), &st, "name: is required");
    expect_error(pv_validate_name("pool", NULL, &st), &st, "pool: is required");
}

static void test_name_slash(void **state) {
    (void)state;
    pv_status st;
    expect_error(pv_validate_name("name", "a/b", &st), &st, "name: \"a/b\" must not contain '/'");
    expect_error(pv_validate_name("volume", "/etc", &st), &st,
                 "volume: \"/etc\" must not contain '/'");
}

static void test_name_dotdot(void **state) {
    (void)state;
    pv_status st;
    expect_error(pv_validate_name("name", "a..b", &st), &st,
                 "name: \"a..b\" must not contain \"..\"");
    expect_error(pv_validate_name("name", "..", &st), &st, "name: \"..\" must not contain \"..\"");
}

static void test_name_leading_dash_or_dot(void **state) {
    (void)state;
    pv_status st;
    expect_error(pv_validate_name("name", "-rf", &st), &st,
                 "name: \"-rf\" must not start with '-'");
    expect_error(pv_validate_name("name", ".hidden", &st), &st,
                 "name: \".hidden\" must not start with '.'");
    expect_error(pv_validate_name("name", ".", &st), &st, "name: \".\" must not start with '.'");
}

static void test_name_too_long(void **state) {
    (void)state;
    char v[PV_NAME_MAX + 2];
    memset(v, 'a', PV_NAME_MAX + 1);
    v[PV_NAME_MAX + 1] = '\0';
    pv_status st;
    char want[256];
    snprintf(want, sizeof(want), "name: \"%s\" is longer than 63 bytes", v);
    expect_error(pv_validate_name("name", v, &st), &st, want);
}

static void test_name_bad_characters(void **state) {
    (void)state;
    pv_status st;
    expect_error(pv_validate_name("name", "a b", &st), &st,
                 "name: \"a b\" has a character other than letters, digits, '.', '_' and '-' at "
                 "byte 1");
    expect_error(pv_validate_name("name", "caf\xc3\xa9", &st), &st,
                 "name: \"caf\\xc3\\xa9\" has a character other than letters, digits, '.', '_' "
                 "and '-' at byte 3");
    expect_error(pv_validate_name("name", "a\nb", &st), &st,
                 "name: \"a\\x0ab\" has a character other than letters, digits, '.', '_' and '-' "
                 "at byte 1");
    expect_error(pv_validate_name("name", "x\"y", &st), &st,
                 "name: \"x\\\"y\" has a character other than letters, digits, '.', '_' and '-' "
                 "at byte 1");
}

static void test_name_long_value_is_cut_in_message(void **state) {
    (void)state;
    char v[5000];
    memset(v, 'q', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    v[10] = '/';
    pv_status st;
    assert_int_equal(pv_validate_name("name", v, &st), PV_INVALID_ARGUMENT);
    const char *open = strchr(st.msg, '"');
    const char *close = strrchr(st.msg, '"');
    assert_non_null(open);
    assert_true(close > open);
    size_t quoted = (size_t)(close - open - 1);
    assert_true(quoted <= 83);
    assert_memory_equal(close - 3, "...", 3);
    assert_non_null(strstr(st.msg, "must not contain '/'"));

    /* Escapes count against the cap too: a value of control bytes stays short. */
    memset(v, '\x01', sizeof(v) - 1);
    assert_int_equal(pv_validate_name("name", v, &st), PV_INVALID_ARGUMENT);
    assert_true(strlen(st.msg) < 200);
}

static void test_required(void **state) {
    (void)state;
    pv_status st;
    expect_error(pv_validate_required("cluster_id", NULL, &st), &st, "cluster_id: is required");
    expect_error(pv_validate_required("cluster_id", "", &st), &st, "cluster_id: is required");
    pv_status_clear(&st);
    assert_int_equal(pv_validate_required("cluster_id", "c-1", &st), PV_OK);
    assert_int_equal(st.code, PV_OK);
}

/* ---- enums in generated messages ---- */

static void test_enums_health_response(void **state) {
    (void)state;
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    pv_status st;
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    assert_int_equal(pv_validate_message(&r.base, &st), PV_OK);
    r.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
    assert_int_equal(pv_validate_message(&r.base, &st), PV_OK);
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)7;
    expect_error(pv_validate_message(&r.base, &st), &st,
                 "status: unknown value 7 for grpc.health.v1.HealthCheckResponse.ServingStatus");
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)-1;
    expect_error(pv_validate_message(&r.base, &st), &st,
                 "status: unknown value -1 for grpc.health.v1.HealthCheckResponse.ServingStatus");
}

static void test_enums_proto2_optional_checked_only_when_present(void **state) {
    (void)state;
    Google__Protobuf__FieldDescriptorProto f = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
    pv_status st;
    f.label = (Google__Protobuf__FieldDescriptorProto__Label)99;
    f.has_label = 0;
    assert_int_equal(pv_validate_message(&f.base, &st), PV_OK);
    f.has_label = 1;
    expect_error(pv_validate_message(&f.base, &st), &st,
                 "label: unknown value 99 for google.protobuf.FieldDescriptorProto.Label");
    f.label = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED;
    f.has_type = 1;
    f.type = (Google__Protobuf__FieldDescriptorProto__Type)0;
    expect_error(pv_validate_message(&f.base, &st), &st,
                 "type: unknown value 0 for google.protobuf.FieldDescriptorProto.Type");
}

static void test_enums_repeated_and_nested_messages(void **state) {
    (void)state;
    Google__Protobuf__FieldDescriptorProto f0 = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
    Google__Protobuf__FieldDescriptorProto f1 = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
    Google__Protobuf__FieldDescriptorProto *fields[] = {&f0, &f1};
    Google__Protobuf__DescriptorProto inner = GOOGLE__PROTOBUF__DESCRIPTOR_PROTO__INIT;
    inner.n_field = 2;
    inner.field = fields;
    Google__Protobuf__DescriptorProto *nested[] = {&inner};
    Google__Protobuf__DescriptorProto outer = GOOGLE__PROTOBUF__DESCRIPTOR_PROTO__INIT;
    outer.n_nested_type = 1;
    outer.nested_type = nested;
    Google__Protobuf__FileOptions opts = GOOGLE__PROTOBUF__FILE_OPTIONS__INIT;
    Google__Protobuf__DescriptorProto *types[] = {&outer};
    Google__Protobuf__FileDescriptorProto file = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO__INIT;
    file.n_message_type = 1;
    file.message_type = types;
    file.options = &opts;

    pv_status st;
    f1.has_type = 1;
    f1.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_STRING;
    assert_int_equal(pv_validate_message(&file.base, &st), PV_OK);

    f1.type = (Google__Protobuf__FieldDescriptorProto__Type)42;
    expect_error(pv_validate_message(&file.base, &st), &st,
                 "message_type[0].nested_type[0].field[1].type: unknown value 42 for "
                 "google.protobuf.FieldDescriptorProto.Type");

    f1.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_BOOL;
    opts.has_optimize_for = 1;
    opts.optimize_for = (Google__Protobuf__FileOptions__OptimizeMode)9;
    expect_error(pv_validate_message(&file.base, &st), &st,
                 "options.optimize_for: unknown value 9 for "
                 "google.protobuf.FileOptions.OptimizeMode");

    file.options = NULL; /* an unset sub-message holds nothing to check */
    assert_int_equal(pv_validate_message(&file.base, &st), PV_OK);
}

/* ---- a hand-built proto3 descriptor ----
 *
 *   enum test.v1.Color { COLOR_UNSPECIFIED = 0; RED = 1; BLUE = 2; GREEN = 5; }
 *   message Inner { Color color = 1; }
 *   message Outer {
 *     Color c = 1; repeated Color cs = 2; Inner inner = 3; repeated Inner inners = 4;
 *     map<string, Color> by_name = 5; oneof choice { Color picked = 6; Inner picked_inner = 7; }
 *   }
 */

typedef struct {
    ProtobufCMessage base;
    int color;
} Inner;

typedef struct {
    ProtobufCMessage base;
    char *key;
    int value;
} ByNameEntry;

typedef struct {
    ProtobufCMessage base;
    int c;
    size_t n_cs;
    int *cs;
    Inner *inner;
    size_t n_inners;
    Inner **inners;
    size_t n_by_name;
    ByNameEntry **by_name;
    uint32_t choice_case;
    union {
        int picked;
        Inner *picked_inner;
    };
} Outer;

static const ProtobufCEnumValue color_values[] = {
    {"COLOR_UNSPECIFIED", "COLOR_UNSPECIFIED", 0},
    {"RED", "RED", 1},
    {"BLUE", "BLUE", 2},
    {"GREEN", "GREEN", 5},
};
static const ProtobufCEnumValueIndex color_by_name[] = {
    {"BLUE", 2}, {"COLOR_UNSPECIFIED", 0}, {"GREEN", 3}, {"RED", 1}};
static const ProtobufCIntRange color_ranges[] = {{0, 0}, {5, 3}, {0, 4}};
static const ProtobufCEnumDescriptor color_descriptor = {PROTOBUF_C__ENUM_DESCRIPTOR_MAGIC,
                                                         "test.v1.Color",
                                                         "Color",
                                                         "Color",
                                                         "test.v1",
                                                         4,
                                                         color_values,
                                                         4,
                                                         color_by_name,
                                                         2,
                                                         color_ranges,
                                                         NULL,
                                                         NULL,
                                                         NULL,
                                                         NULL};

#define FIELD(name, id, label, type, qoff, off, desc, flags)                                       \
    { name, id, label, type, qoff, off, desc, NULL, flags, 0, NULL, NULL }

static const ProtobufCFieldDescriptor inner_fields[] = {
    FIELD("color", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_ENUM, 0, offsetof(Inner, color),
          &color_descriptor, 0),
};
static const unsigned one_index[] = {0};
static const ProtobufCIntRange one_range[] = {{1, 0}, {0, 1}};
static const ProtobufCMessageDescriptor inner_descriptor = {PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
                                                            "test.v1.Inner",
                                                            "Inner",
                                                            "Inner",
                                                            "test.v1",
                                                            sizeof(Inner),
                                                            1,
                                                            inner_fields,
                                                            one_index,
                                                            1,
                                                            one_range,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL};

static const ProtobufCFieldDescriptor entry_fields[] = {
    FIELD("key", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_STRING, 0, offsetof(ByNameEntry, key),
          NULL, 0),
    FIELD("value", 2, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_ENUM, 0, offsetof(ByNameEntry, value),
          &color_descriptor, 0),
};
static const unsigned two_index[] = {0, 1};
static const ProtobufCIntRange two_range[] = {{1, 0}, {0, 2}};
static const ProtobufCMessageDescriptor entry_descriptor = {PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
                                                            "test.v1.Outer.ByNameEntry",
                                                            "ByNameEntry",
                                                            "ByNameEntry",
                                                            "test.v1",
                                                            sizeof(ByNameEntry),
                                                            2,
                                                            entry_fields,
                                                            two_index,
                                                            1,
                                                            two_range,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL};

static const ProtobufCFieldDescriptor outer_fields[] = {
    FIELD("c", 1, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_ENUM, 0, offsetof(Outer, c),
          &color_descriptor, 0),
    FIELD("cs", 2, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_ENUM, offsetof(Outer, n_cs),
          offsetof(Outer, cs), &color_descriptor, PROTOBUF_C_FIELD_FLAG_PACKED),
    FIELD("inner", 3, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_MESSAGE, 0, offsetof(Outer, inner),
          &inner_descriptor, 0),
    FIELD("inners", 4, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_MESSAGE,
          offsetof(Outer, n_inners), offsetof(Outer, inners), &inner_descriptor, 0),
    FIELD("by_name", 5, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_MESSAGE,
          offsetof(Outer, n_by_name), offsetof(Outer, by_name), &entry_descriptor, 0),
    FIELD("picked", 6, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_ENUM, offsetof(Outer, choice_case),
          offsetof(Outer, picked), &color_descriptor, PROTOBUF_C_FIELD_FLAG_ONEOF),
    FIELD("picked_inner", 7, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_MESSAGE,
          offsetof(Outer, choice_case), offsetof(Outer, picked_inner), &inner_descriptor,
          PROTOBUF_C_FIELD_FLAG_ONEOF),
};
static const unsigned outer_index[] = {4, 0, 1, 2, 3, 5, 6};
static const ProtobufCIntRange outer_range[] = {{1, 0}, {0, 7}};
static const ProtobufCMessageDescriptor outer_descriptor = {PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
                                                            "test.v1.Outer",
                                                            "Outer",
                                                            "Outer",
                                                            "test.v1",
                                                            sizeof(Outer),
                                                            7,
                                                            outer_fields,
                                                            outer_index,
                                                            1,
                                                            outer_range,
                                                            NULL,
                                                            NULL,
                                                            NULL,
                                                            NULL};

static void init_outer(Outer *o) {
    memset(o, 0, sizeof(*o));
    o->base.descriptor = &outer_descriptor;
}

static void init_inner(Inner *i, int color) {
    memset(i, 0, sizeof(*i));
    i->base.descriptor = &inner_descriptor;
    i->color = color;
}

static void test_enums_proto3_singular_always_checked(void **state) {
    (void)state;
    Outer o;
    init_outer(&o);
    pv_status st;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
    o.c = 5;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
    o.c = 3; /* a gap between declared values */
    expect_error(pv_validate_message(&o.base, &st), &st, "c: unknown value 3 for test.v1.Color");
}

static void test_enums_repeated_enum(void **state) {
    (void)state;
    Outer o;
    init_outer(&o);
    int cs[] = {1, 2, 5, 6};
    o.cs = cs;
    o.n_cs = 3;
    pv_status st;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
    o.n_cs = 4;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "cs[3]: unknown value 6 for test.v1.Color");
}

static void test_enums_sub_messages(void **state) {
    (void)state;
    Outer o;
    init_outer(&o);
    Inner a, b, c;
    init_inner(&a, 1);
    init_inner(&b, 2);
    init_inner(&c, 100);
    Inner *list[] = {&a, &b};
    o.inner = &a;
    o.inners = list;
    o.n_inners = 2;
    pv_status st;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
    o.inner = &c;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "inner.color: unknown value 100 for test.v1.Color");
    o.inner = NULL;
    list[1] = &c;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "inners[1].color: unknown value 100 for test.v1.Color");
}

static void test_enums_map_values(void **state) {
    (void)state;
    Outer o;
    init_outer(&o);
    ByNameEntry e0 = {{&entry_descriptor, 0, NULL}, "red", 1};
    ByNameEntry e1 = {{&entry_descriptor, 0, NULL}, "odd", -7};
    ByNameEntry *entries[] = {&e0, &e1};
    o.by_name = entries;
    o.n_by_name = 1;
    pv_status st;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
    o.n_by_name = 2;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "by_name[1].value: unknown value -7 for test.v1.Color");
}

/* Found by fuzz_wire: protobuf-c takes any bytes as a string; the JSON records and the JSON
 * form then dropped or mangled the field. */
static void test_strings_must_be_utf8(void **state) {
    (void)state;
    static const struct {
        const char *s;
        int ok;
        size_t valid;
    } cases[] = {
        {"", 1, 0},
        {"plain", 1, 5},
        {"h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82", 1, 18},
        {"\x80", 0, 0},
        {"ok\xc0\xaf", 0, 2},           /* overlong '/' */
        {"ab\xe0\x80\xaf", 0, 2},       /* overlong three-byte */
        {"\xed\xa0\x80", 0, 0},         /* a UTF-16 surrogate */
        {"x\xf4\x90\x80\x80", 0, 1},    /* past U+10FFFF */
        {"\xe6\x97", 0, 0},             /* cut short */
        {"vo\x80\x80\x04", 0, 2},       /* the fuzzer's */
        {"\xf4\x8f\xbf\xbf\x7f", 1, 5}, /* U+10FFFF itself */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t valid = 99;
        assert_int_equal(pv_validate_utf8_prefix(cases[i].s, &valid), cases[i].ok);
        assert_int_equal(valid, cases[i].valid);
    }
    Google__Protobuf__FieldDescriptorProto f = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
    pv_status st;
    f.name = "caf\xc3\xa9";
    assert_int_equal(pv_validate_message(&f.base, &st), PV_OK);
    f.name = "caf\xe9";
    expect_error(pv_validate_message(&f.base, &st), &st, "name: is not valid UTF-8 (at byte 3)");
    Outer o;
    init_outer(&o);
    ByNameEntry e0 = {{&entry_descriptor, 0, NULL},
                      "r\xff"
                      "d",
                      1};
    ByNameEntry *entries[] = {&e0};
    o.by_name = entries;
    o.n_by_name = 1;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "by_name[0].key: is not valid UTF-8 (at byte 1)");
}

static void test_enums_oneof_only_selected_member(void **state) {
    (void)state;
    Outer o;
    init_outer(&o);
    Inner bad;
    init_inner(&bad, 77);
    pv_status st;
    /* picked_inner holds a pointer; read as the enum member it is garbage, so nothing but the
     * selected member may be looked at. */
    o.picked_inner = &bad;
    o.choice_case = 0;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
    o.choice_case = 7;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "picked_inner.color: unknown value 77 for test.v1.Color");
    o.choice_case = 6;
    o.picked = 9;
    expect_error(pv_validate_message(&o.base, &st), &st,
                 "picked: unknown value 9 for test.v1.Color");
    o.picked = 2;
    assert_int_equal(pv_validate_message(&o.base, &st), PV_OK);
}

/* ---- NUL bytes on the wire ---- */

static int wire_check(const uint8_t *buf, size_t len, pv_status *st) {
    pv_status_clear(st);
    ProtobufCMessage *m = protobuf_c_message_unpack(
        &google__protobuf__file_descriptor_proto__descriptor, NULL, len, buf);
    assert_non_null(m); /* protobuf-c decodes it: the cut string is what the check is for */
    protobuf_c_message_free_unpacked(m, NULL);
    return pv_validate_wire(&google__protobuf__file_descriptor_proto__descriptor, buf, len, st);
}

static void test_wire_refuses_nul_in_strings(void **state) {
    (void)state;
    pv_status st;
    /* name (1) = "default\0zzz" */
    static const uint8_t top[] = {0x0a, 11, 'd', 'e', 'f', 'a', 'u', 'l', 't', 0, 'z', 'z', 'z'};
    expect_error(wire_check(top, sizeof top, &st), &st,
                 "name: holds a NUL byte (at byte 7); strings may not contain U+0000");
    /* dependency (3, repeated) = "a", "b\0" */
    static const uint8_t rep[] = {0x1a, 1, 'a', 0x1a, 2, 'b', 0};
    expect_error(wire_check(rep, sizeof rep, &st), &st,
                 "dependency[1]: holds a NUL byte (at byte 1); strings may not contain U+0000");
    /* message_type (4) { name (1) = "\0" } */
    static const uint8_t sub[] = {0x22, 3, 0x0a, 1, 0};
    expect_error(wire_check(sub, sizeof sub, &st), &st,
                 "message_type.name: holds a NUL byte (at byte 0); strings may not contain U+0000");
}

static void test_wire_keeps_nul_in_bytes(void **state) {
    (void)state;
    pv_status st;
    /* options (8) { uninterpreted_option (999) { string_value (7, bytes) = "\0\0" } }, and a
     * clean name and an unknown field (15) holding a NUL */
    static const uint8_t ok[] = {0x0a, 1, 'x', 0x42, 7, 0xba, 0x3e, 4, 0x3a, 2, 0, 0, 0x7a, 1, 0};
    assert_int_equal(wire_check(ok, sizeof ok, &st), PV_OK);
    assert_int_equal(st.code, PV_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_accepts_plain_names),
        cmocka_unit_test(test_name_required),
        cmocka_unit_test(test_name_slash),
        cmocka_unit_test(test_name_dotdot),
        cmocka_unit_test(test_name_leading_dash_or_dot),
        cmocka_unit_test(test_name_too_long),
        cmocka_unit_test(test_name_bad_characters),
        cmocka_unit_test(test_name_long_value_is_cut_in_message),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_enums_health_response),
        cmocka_unit_test(test_enums_proto2_optional_checked_only_when_present),
        cmocka_unit_test(test_enums_repeated_and_nested_messages),
        cmocka_unit_test(test_enums_proto3_singular_always_checked),
        cmocka_unit_test(test_enums_repeated_enum),
        cmocka_unit_test(test_enums_sub_messages),
        cmocka_unit_test(test_enums_map_values),
        cmocka_unit_test(test_strings_must_be_utf8),
        cmocka_unit_test(test_enums_oneof_only_selected_member),
        cmocka_unit_test(test_wire_refuses_nul_in_strings),
        cmocka_unit_test(test_wire_keeps_nul_in_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
