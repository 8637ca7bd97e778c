/*
 * Unit tests of pv_config: defaults, the JSON file, the environment, --set and their order,
 * argv rewriting, every kind of error with its message, validation, the masked dump, and (under
 * ASan) that nothing leaks on any path, error paths included.
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
#include <unistd.h>

#include "pv_config.h"

/* ---- helpers ---- */

static char tmp_path[64];

/* Writes text to a fresh temp file; returns its path (valid until the next call). */
static const char *write_tmp(const char *text) {
    if (tmp_path[0] != '\0') unlink(tmp_path);
    /* mkstemp's template ends in six 'X' characters. */
    snprintf(tmp_path, sizeof(tmp_path), "/tmp/pv_test_config.%c%c%c%c%c%c", 'X', 'X', 'X', 'X',
             'X', 'X');
    int fd = mkstemp(tmp_path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    return tmp_path;
}

static int teardown_tmp(void **state) {
    (void)state;
    if (tmp_path[0] != '\0') unlink(tmp_path);
    tmp_path[0] = '\0';
    unsetenv("PIVIRT_CONFIG");
    unsetenv("PIVIRT_REDIS_DB");
    unsetenv("PIVIRT_REDIS_PREFIX");
    unsetenv("PIVIRT_REDIS_ADR");
    unsetenv("PIVIRT_GATEWAY_THREADS");
    return 0;
}

static void assert_contains(const char *text, const char *part) {
    if (strstr(text, part) == NULL) print_error("\"%s\" does not contain \"%s\"\n", text, part);
    assert_non_null(strstr(text, part));
}

static void init_ok(pv_config *c) {
    pv_status st;
    assert_int_equal(pv_config_init(c, &st), PV_OK);
}

/* pv_config_set must fail with INVALID_ARGUMENT, a message containing each of parts, and leave
 * the key's previous dump unchanged. */
static void expect_set_error(const char *key, const char *value, const char *part1,
                             const char *part2) {
    pv_config c;
    init_ok(&c);
    char *before = pv_config_dump_json(&c);
    pv_status st;
    assert_int_equal(pv_config_set(&c, key, value, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(st.code, PV_INVALID_ARGUMENT);
    assert_contains(st.msg, part1);
    if (part2 != NULL) assert_contains(st.msg, part2);
    char *after = pv_config_dump_json(&c);
    assert_string_equal(before, after);
    free(before);
    free(after);
    pv_config_free(&c);
}

static int load_file_error(const char *text, pv_status *st) {
    pv_config c;
    init_ok(&c);
    int rc = pv_config_load_file(&c, write_tmp(text), st);
    pv_config_free(&c);
    return rc;
}

static json_t *dump_parsed(const pv_config *c) {
    char *s = pv_config_dump_json(c);
    assert_non_null(s);
    json_error_t err;
    json_t *root = json_loads(s, 0, &err);
    free(s);
    assert_non_null(root);
    return root;
}

/* ---- defaults ---- */

static void test_defaults(void **state) {
    (void)state;
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_init(&c, &st), PV_OK);
    assert_string_equal(c.data_dir, "./.data");
    assert_int_equal(c.log_level, PV_LOG_INFO);
    assert_string_equal(c.redis.addr, "127.0.0.1:6390");
    assert_int_equal(c.redis.db, 0);
    assert_string_equal(c.redis.password, "");
    assert_string_equal(c.redis.prefix, "pv:");
    assert_int_equal(c.redis.connect_timeout_ms, 1000);
    assert_int_equal(c.redis.command_timeout_ms, 2000);
    assert_int_equal(c.gateway.n_listen, 3);
    assert_string_equal(c.gateway.listen[0], "localhost:8443");
    assert_string_equal(c.gateway.listen[1], "localhost:9002");
    assert_string_equal(c.gateway.listen[2], "localhost:5001");
    assert_int_equal(c.gateway.threads, 16);
    assert_string_equal(c.gateway.tls_cert, "");
    assert_string_equal(c.gateway.tls_key, "");
    assert_int_equal(c.gateway.max_request_bytes, 4194304);
    assert_int_equal(c.gateway.max_upload_bytes, 64L << 20);
    assert_int_equal(c.gateway.heartbeat_seconds, 2);
    assert_int_equal(c.gateway.shutdown_grace_ms, 5000);
    assert_int_equal(c.gateway.malloc_arenas, 4);
    assert_int_equal(c.gateway.memory_trim_idle_ms, 1000);
    assert_string_equal(c.gateway.advertise, "");
    assert_string_equal(c.auth.username, "");
    assert_string_equal(c.auth.password, "");
    assert_int_equal(c.worker.heartbeat_seconds, 2);
    assert_string_equal(c.worker.node, "");
    assert_string_equal(c.worker.pod, "local");
    assert_int_equal(c.scheduler.heartbeat_seconds, 2);
    assert_false(c.test_operations);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    pv_config_free(&c);
    assert_null(c.redis.addr);
    assert_null(c.gateway.listen);
    assert_int_equal(c.gateway.n_listen, 0);
    pv_config_free(&c); /* a freed config may be freed again */
}

/* ---- pv_config_set ---- */

static void test_set_each_type(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_set(&c, "redis.addr", "/run/redis.sock", &st), PV_OK);
    assert_string_equal(c.redis.addr, "/run/redis.sock");
    assert_int_equal(pv_config_set(&c, "redis.command_timeout_ms", "250", &st), PV_OK);
    assert_int_equal(c.redis.command_timeout_ms, 250);
    assert_int_equal(pv_config_set(&c, "gateway.max_request_bytes", "1048576", &st), PV_OK);
    assert_int_equal(c.gateway.max_request_bytes, 1048576);
    assert_int_equal(pv_config_set(&c, "gateway.threads", "64", &st), PV_OK);
    assert_int_equal(c.gateway.threads, 64);
    assert_int_equal(pv_config_set(&c, "gateway.shutdown_grace_ms", "0", &st), PV_OK);
    assert_int_equal(c.gateway.shutdown_grace_ms, 0);
    assert_int_equal(pv_config_set(&c, "log.level", "WARN", &st), PV_OK);
    assert_int_equal(c.log_level, PV_LOG_WARN);
    assert_int_equal(pv_config_set(&c, "gateway.listen", " a:1, b:2,,c:3 ", &st), PV_OK);
    assert_int_equal(c.gateway.n_listen, 3);
    assert_string_equal(c.gateway.listen[0], "a:1");
    assert_string_equal(c.gateway.listen[1], "b:2");
    assert_string_equal(c.gateway.listen[2], "c:3");
    assert_int_equal(pv_config_set(&c, "gateway.listen", "unix:/tmp/s", &st), PV_OK);
    assert_int_equal(c.gateway.n_listen, 1);
    assert_string_equal(c.gateway.listen[0], "unix:/tmp/s");
    pv_config_free(&c);
}

static void test_set_booleans(void **state) {
    (void)state;
    static const struct {
        const char *text;
        bool value;
    } cases[] = {{"true", true},   {"TRUE", true}, {"1", true},   {"yes", true},
                 {"false", false}, {"0", false},   {"no", false}, {"No", false}};
    pv_config c;
    init_ok(&c);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        c.test_operations = !cases[i].value;
        assert_int_equal(pv_config_set(&c, "test_operations", cases[i].text, NULL), PV_OK);
        assert_int_equal(c.test_operations, cases[i].value);
    }
    pv_config_free(&c);
    expect_set_error("test_operations", "maybe", "test_operations", "\"maybe\"");
    expect_set_error("test_operations", "", "test_operations", "is not a boolean");
}

static void test_set_bad_numbers(void **state) {
    (void)state;
    expect_set_error("redis.db", "12abc", "redis.db", "\"12abc\" is not an integer");
    expect_set_error("redis.db", "", "redis.db", "\"\" is not an integer");
    expect_set_error("redis.db", " 5", "redis.db", "is not an integer");
    expect_set_error("redis.db", "5 ", "redis.db", "is not an integer");
    expect_set_error("redis.db", "0x10", "redis.db", "is not an integer");
    expect_set_error("redis.db", "-1", "redis.db", "-1 must be at least 0");
    expect_set_error("redis.db", "99999999999999999999", "redis.db",
                     "\"99999999999999999999\" is out of range");
    expect_set_error("redis.db", "3000000000", "redis.db", "3000000000 is larger than 2147483647");
    expect_set_error("gateway.threads", "0", "gateway.threads", "0 is out of range 1..256");
    expect_set_error("gateway.threads", "257", "gateway.threads", "257 is out of range 1..256");
    expect_set_error("redis.connect_timeout_ms", "0", "redis.connect_timeout_ms",
                     "must be at least 1");
    expect_set_error("redis.command_timeout_ms", "-5", "redis.command_timeout_ms",
                     "-5 must be at least 1");
    expect_set_error("gateway.heartbeat_seconds", "0", "gateway.heartbeat_seconds", "at least 1");
    expect_set_error("worker.heartbeat_seconds", "0", "worker.heartbeat_seconds", "at least 1");
    expect_set_error("scheduler.heartbeat_seconds", "0", "scheduler.heartbeat_seconds",
                     "at least 1");
    expect_set_error("gateway.max_request_bytes", "0", "gateway.max_request_bytes", "at least 1");
    expect_set_error("gateway.max_upload_bytes", "268435457", "gateway.max_upload_bytes",
                     "268435457 is out of range 1..268435456");
}

static void test_set_bad_level_and_unknown_key(void **state) {
    (void)state;
    expect_set_error("log.level", "loud", "log.level", "\"loud\"");
    expect_set_error("redis.adr", "x", "unknown configuration key", "\"redis.adr\"");
    expect_set_error("", "x", "unknown configuration key", NULL);
}

static void test_set_long_value_is_cut_in_message(void **state) {
    (void)state;
    char v[2000];
    memset(v, '7', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    v[0] = 'x';
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_set(&c, "redis.db", v, &st), PV_INVALID_ARGUMENT);
    assert_true(strlen(st.msg) < 150);
    assert_contains(st.msg, "...\" is not an integer");
    pv_config_free(&c);
}

/* ---- the JSON file ---- */

static void test_file_merges_over_defaults(void **state) {
    (void)state;
    const char *path = write_tmp("{\n"
                                 "  \"data_dir\": \"/var/lib/pivirt\",\n"
                                 "  \"log\": {\"level\": \"debug\"},\n"
                                 "  \"redis\": {\"addr\": \"10.0.0.1:6379\", \"db\": 3},\n"
                                 "  \"gateway\": {\"listen\": [\"0.0.0.0:8443\", \"[::]:9002\"],\n"
                                 "              \"threads\": 4, \"max_request_bytes\": 65536},\n"
                                 "  \"worker\": {},\n"
                                 "  \"test_operations\": true\n"
                                 "}\n");
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_load_file(&c, path, &st), PV_OK);
    assert_string_equal(c.data_dir, "/var/lib/pivirt");
    assert_int_equal(c.log_level, PV_LOG_DEBUG);
    assert_string_equal(c.redis.addr, "10.0.0.1:6379");
    assert_int_equal(c.redis.db, 3);
    assert_int_equal(c.gateway.n_listen, 2);
    assert_string_equal(c.gateway.listen[0], "0.0.0.0:8443");
    assert_string_equal(c.gateway.listen[1], "[::]:9002");
    assert_int_equal(c.gateway.threads, 4);
    assert_int_equal(c.gateway.max_request_bytes, 65536);
    assert_true(c.test_operations);
    /* Keys the file does not name keep their defaults. */
    assert_string_equal(c.redis.prefix, "pv:");
    assert_int_equal(c.redis.command_timeout_ms, 2000);
    assert_string_equal(c.worker.pod, "local");
    pv_config_free(&c);
}

static void test_file_listen_as_string(void **state) {
    (void)state;
    const char *path = write_tmp("{\"gateway\": {\"listen\": \"a:1,b:2\"}}");
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_load_file(&c, path, &st), PV_OK);
    assert_int_equal(c.gateway.n_listen, 2);
    assert_string_equal(c.gateway.listen[1], "b:2");
    pv_config_free(&c);
}

static void test_file_bad_json_names_line(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(load_file_error("{\n  \"redis\": {\n    \"addr\": \"x\",\n  }\n}\n", &st),
                     PV_INVALID_ARGUMENT);
    assert_contains(st.msg, tmp_path);
    assert_contains(st.msg, "line 4 column 3");
}

static void test_file_missing(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_load_file(&c, "/nonexistent/pivirt.json", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "/nonexistent/pivirt.json");
    assert_contains(st.msg, "No such file");
    pv_config_free(&c);
}

static void test_file_unknown_key(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(load_file_error("{\"redis\": {\"adr\": \"x\"}}", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, tmp_path);
    assert_contains(st.msg, "unknown key \"redis.adr\"");
    assert_int_equal(load_file_error("{\"redis\": 5}", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "unknown key \"redis\"");
}

static void test_file_type_errors(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(load_file_error("{\"redis\": {\"db\": \"3\"}}", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, tmp_path);
    assert_contains(st.msg, "redis.db: expected an integer, got \"3\"");
    assert_int_equal(load_file_error("{\"gateway\": {\"threads\": 2.5}}", &st),
                     PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "gateway.threads: expected an integer, got 2.5");
    assert_int_equal(load_file_error("{\"gateway\": {\"threads\": 300}}", &st),
                     PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "gateway.threads: 300 is out of range 1..256");
    assert_int_equal(load_file_error("{\"test_operations\": 1}", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "test_operations: expected true or false, got 1");
    assert_int_equal(load_file_error("{\"redis\": {\"addr\": null}}", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "redis.addr: expected a string, got null");
    assert_int_equal(load_file_error("{\"gateway\": {\"listen\": [\"a:1\", 2]}}", &st),
                     PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "gateway.listen: expected an array of strings");
    assert_int_equal(load_file_error("{\"log\": {\"level\": \"loud\"}}", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "log.level: \"loud\"");
    assert_int_equal(load_file_error("[1, 2]", &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "the top level must be an object");
    assert_int_equal(load_file_error("{\"redis\": {\"db\": 1, \"db\": 2}}", &st),
                     PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "duplicate");
}

static void test_file_error_midway_keeps_config_owned(void **state) {
    (void)state;
    /* Keys before the bad one are applied; everything stays owned by c and is freed once. */
    const char *path = write_tmp("{\"redis\": {\"addr\": \"set-before-error\", \"prefix\": "
                                 "\"p:\"}, \"gateway\": {\"listen\": [\"x:1\"], \"threads\": "
                                 "\"many\"}}");
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_load_file(&c, path, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "gateway.threads");
    assert_string_equal(c.redis.addr, "set-before-error");
    assert_int_equal(c.gateway.threads, 16);
    pv_config_free(&c);
}

/* ---- the environment ---- */

static void test_env_applies_known_keys(void **state) {
    (void)state;
    char *envp[] = {"HOME=/root",
                    "PIVIRT_CONFIG=/not/read/here.json",
                    "PIVIRT_REDIS_ADDR=redis.internal:6379",
                    "PIVIRT_GATEWAY_THREADS=8",
                    "PIVIRT_TEST_OPERATIONS=yes",
                    "PIVIRT_DATA_DIR=/srv/pv",
                    "PIVIRT_GATEWAY_LISTEN=h1:1,h2:2",
                    "PIVIRTUAL=ignored",
                    NULL};
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_apply_env(&c, envp, &st), PV_OK);
    assert_string_equal(c.redis.addr, "redis.internal:6379");
    assert_int_equal(c.gateway.threads, 8);
    assert_true(c.test_operations);
    assert_string_equal(c.data_dir, "/srv/pv");
    assert_int_equal(c.gateway.n_listen, 2);
    assert_string_equal(c.gateway.listen[1], "h2:2");
    pv_config_free(&c);
}

static void test_env_unknown_and_bad(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    pv_status st;
    char *unknown[] = {"PIVIRT_REDIS_ADR=x", NULL};
    assert_int_equal(pv_config_apply_env(&c, unknown, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "PIVIRT_REDIS_ADR");
    assert_contains(st.msg, "names no configuration key");
    char *bad[] = {"PIVIRT_REDIS_DB=three", NULL};
    assert_int_equal(pv_config_apply_env(&c, bad, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "environment PIVIRT_REDIS_DB: redis.db: \"three\" is not an integer");
    assert_int_equal(c.redis.db, 0);
    pv_config_free(&c);
}

/* ---- pv_config_load: order of sources and argv ---- */

static void test_load_precedence_file_env_set(void **state) {
    (void)state;
    const char *path =
        write_tmp("{\"redis\": {\"db\": 1, \"prefix\": \"file:\", \"addr\": \"file:1\"}}");
    setenv("PIVIRT_REDIS_DB", "2", 1);
    setenv("PIVIRT_REDIS_PREFIX", "env:", 1);
    char a0[] = "prog", a1[] = "--config", a3[] = "--set", a4[] = "redis.db=3";
    char *argv[] = {a0, a1, (char *)path, a3, a4, NULL};
    int argc = 5;
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_load(&c, &argc, argv, &st), PV_OK);
    assert_int_equal(c.redis.db, 3);             /* --set beats env and file */
    assert_string_equal(c.redis.prefix, "env:"); /* env beats file */
    assert_string_equal(c.redis.addr, "file:1"); /* file beats defaults */
    assert_int_equal(c.redis.command_timeout_ms, 2000);
    assert_int_equal(argc, 1);
    assert_null(argv[1]);
    pv_config_free(&c);
}

static void test_load_file_from_env(void **state) {
    (void)state;
    const char *path = write_tmp("{\"worker\": {\"node\": \"n1\"}}");
    setenv("PIVIRT_CONFIG", path, 1);
    char a0[] = "prog";
    char *argv[] = {a0, NULL};
    int argc = 1;
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_load(&c, &argc, argv, &st), PV_OK);
    assert_string_equal(c.worker.node, "n1");
    pv_config_free(&c);
}

static void test_load_rewrites_argv(void **state) {
    (void)state;
    const char *path = write_tmp("{\"redis\": {\"db\": 4}}");
    char arg_cfg[128];
    snprintf(arg_cfg, sizeof(arg_cfg), "--config=%s", path);
    char *argv[] = {"pivirt-gateway",
                    "--config",
                    (char *)path,
                    "serve",
                    "--set",
                    "gateway.threads=3",
                    "--set=log.level=debug",
                    "-v",
                    arg_cfg,
                    "--",
                    "--set",
                    "x",
                    NULL};
    int argc = 12;
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_load(&c, &argc, argv, &st), PV_OK);
    assert_int_equal(c.redis.db, 4);
    assert_int_equal(c.gateway.threads, 3);
    assert_int_equal(c.log_level, PV_LOG_DEBUG);
    assert_int_equal(argc, 6);
    assert_string_equal(argv[0], "pivirt-gateway");
    assert_string_equal(argv[1], "serve");
    assert_string_equal(argv[2], "-v");
    assert_string_equal(argv[3], "--"); /* after "--" nothing is taken */
    assert_string_equal(argv[4], "--set");
    assert_string_equal(argv[5], "x");
    assert_null(argv[6]);
    pv_config_free(&c);
}

static void test_load_set_value_with_equals(void **state) {
    (void)state;
    char *argv[] = {"p", "--set", "auth.password=a=b", "--set", "auth.username=admin", NULL};
    int argc = 5;
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_load(&c, &argc, argv, &st), PV_OK);
    assert_string_equal(c.auth.password, "a=b");
    assert_string_equal(c.auth.username, "admin");
    pv_config_free(&c);
}

/* Every failing pv_config_load leaves c zeroed (and freeing it again is harmless): ASan's leak
 * check at exit proves nothing was left behind. */
static void expect_load_error(char **argv, int argc, const char *part) {
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_load(&c, &argc, argv, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, part);
    assert_null(c.redis.addr);
    assert_null(c.gateway.listen);
    pv_config_free(&c);
}

static void test_load_error_paths(void **state) {
    (void)state;
    char *unknown[] = {"p", "--set", "redis.adr=x", NULL};
    expect_load_error(unknown, 3, "--set: unknown configuration key \"redis.adr\"");
    char *no_eq[] = {"p", "--set", "redis.db", NULL};
    expect_load_error(no_eq, 3, "--set: \"redis.db\" is not key=value");
    char *no_key[] = {"p", "--set==x", NULL};
    expect_load_error(no_key, 2, "is not key=value");
    char *bad_value[] = {"p", "--set", "gateway.threads=0", NULL};
    expect_load_error(bad_value, 3, "--set: gateway.threads: 0 is out of range 1..256");
    char *dangling[] = {"p", "x", "--set", NULL};
    int argc = 3;
    pv_config c;
    pv_status st;
    assert_int_equal(pv_config_load(&c, &argc, dangling, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "--set: needs a value");
    assert_int_equal(argc, 2);
    assert_string_equal(dangling[1], "x");
    assert_null(dangling[2]);
    pv_config_free(&c);
    char *missing[] = {"p", "--config", "/nonexistent/x.json", NULL};
    expect_load_error(missing, 3, "/nonexistent/x.json");
    char *bad_json[] = {"p", "--config", (char *)write_tmp("{\"redis\": {\"addr\": \"a\""), NULL};
    expect_load_error(bad_json, 3, "line 1");
    char *invalid[] = {"p", "--set", "auth.username=Admin", "--set", "auth.password=x", NULL};
    expect_load_error(invalid, 5, "auth.username");
}

static void test_load_env_error(void **state) {
    (void)state;
    setenv("PIVIRT_REDIS_ADR", "x", 1);
    char *argv[] = {"p", NULL};
    expect_load_error(argv, 1, "PIVIRT_REDIS_ADR");
    unsetenv("PIVIRT_REDIS_ADR");
    setenv("PIVIRT_GATEWAY_THREADS", "lots", 1);
    expect_load_error(argv, 1, "environment PIVIRT_GATEWAY_THREADS: gateway.threads");
}

/* ---- validation ---- */

static void expect_invalid(const char **sets, const char *part) {
    pv_config c;
    init_ok(&c);
    pv_status st;
    for (const char **s = sets; *s != NULL; s += 2)
        assert_int_equal(pv_config_set(&c, s[0], s[1], &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, part);
    pv_config_free(&c);
}

static void test_validate_auth(void **state) {
    (void)state;
    const char *upper[] = {"auth.username", "Admin", "auth.password", "s", NULL};
    expect_invalid(upper, "auth.username: \"Admin\" must be lowercase");
    const char *space[] = {"auth.username", "a b", "auth.password", "s", NULL};
    expect_invalid(space, "auth.username: \"a b\" has a character not allowed");
    const char *colon[] = {"auth.username", ":path", "auth.password", "s", NULL};
    expect_invalid(colon, "auth.username");
    const char *reserved[] = {"auth.username", "grpc-timeout", "auth.password", "s", NULL};
    expect_invalid(reserved, "reserved");
    const char *binary[] = {"auth.username", "token-bin", "auth.password", "s", NULL};
    expect_invalid(binary, "reserved");
    const char *no_password[] = {"auth.username", "admin", NULL};
    expect_invalid(no_password, "auth.password: is required when auth.username is set");
    const char *bad_password[] = {"auth.username", "admin", "auth.password", "a\tb", NULL};
    expect_invalid(bad_password, "auth.password: must be printable ASCII");

    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_set(&c, "auth.username", "admin", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "auth.password", "s3cret pass", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    pv_config_free(&c);
}

/* registry.auths: HOST=USERNAME:PASSWORD entries (the password may hold ':' and '='); the dump
 * hides them. */
static void test_registry_auths(void **state) {
    (void)state;
    const char *no_user[] = {"registry.auths", "reg.example:5000=:pw", NULL};
    expect_invalid(no_user, "registry.auths[0]: \"reg.example:5000=...\" is not HOST=USERNAME");
    const char *no_host[] = {"registry.auths", "a=b:c,user:pw", NULL};
    expect_invalid(no_host, "registry.auths[1]: \"=...\" is not HOST=USERNAME:PASSWORD");
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_set(&c, "registry.auths", "127.0.0.1:5000=u:p:w=x", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    assert_int_equal(c.registry.n_auths, 1);
    assert_string_equal(c.registry.auths[0], "127.0.0.1:5000=u:p:w=x");
    json_t *dump = dump_parsed(&c);
    assert_string_equal(json_string_value(json_array_get(
                            json_object_get(json_object_get(dump, "registry"), "auths"), 0)),
                        "***");
    json_decref(dump);
    pv_config_free(&c);
}

static void test_validate_tls_and_listen(void **state) {
    (void)state;
    const char *cert_only[] = {"gateway.tls_cert", "/etc/pv/cert.pem", NULL};
    expect_invalid(cert_only, "gateway.tls_key: is required with gateway.tls_cert");
    const char *key_only[] = {"gateway.tls_key", "/etc/pv/key.pem", NULL};
    expect_invalid(key_only, "gateway.tls_cert: is required with gateway.tls_key");
    const char *bad_scm[] = {"git.scm_type", "svn", NULL};
    expect_invalid(bad_scm, "git.scm_type: \"svn\" is not git, github or gitlab");
    const char *no_listen[] = {"gateway.listen", " , ", NULL};
    expect_invalid(no_listen, "gateway.listen: at least one address is required");
    const char *no_addr[] = {"redis.addr", "", NULL};
    expect_invalid(no_addr, "redis.addr: is required");
    const char *bad_durability[] = {"redis.durability", "sync", NULL};
    expect_invalid(bad_durability, "redis.durability: \"sync\" is not one of async, replicated");

    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_set(&c, "gateway.tls_cert", "c.pem", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "gateway.tls_key", "k.pem", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    pv_config_free(&c);
}

/* The security keys: their defaults and the pairs that only make sense together. */
static void test_security_keys(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    assert_true(c.auth.exempt_health);
    assert_false(c.auth.exempt_reflection);
    assert_string_equal(c.gateway.tls_client_ca, "");
    assert_string_equal(c.redis.username, "");
    assert_int_equal(c.gateway.max_concurrent_streams, 1000);
    assert_int_equal(c.gateway.max_pending_ops_per_client, 10000);
    pv_status st;
    assert_int_equal(pv_config_set(&c, "gateway.max_pending_ops_per_client", "0", &st), PV_OK);
    assert_int_equal(c.gateway.max_pending_ops_per_client, 0);
    pv_config_free(&c);
    expect_set_error("gateway.max_concurrent_streams", "0", "gateway.max_concurrent_streams",
                     "out of range 1..1000000");
    expect_set_error("gateway.max_pending_ops_per_client", "-1",
                     "gateway.max_pending_ops_per_client", "at least 0");
    const char *ca_no_tls[] = {"gateway.tls_client_ca", "/etc/pv/ca.pem", NULL};
    expect_invalid(ca_no_tls, "gateway.tls_client_ca: needs gateway.tls_cert");
    const char *user_no_pw[] = {"redis.username", "pivirt", NULL};
    expect_invalid(user_no_pw, "redis.password: is required with redis.username (\"pivirt\")");

    init_ok(&c);
    assert_int_equal(pv_config_set(&c, "gateway.tls_cert", "c.pem", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "gateway.tls_key", "k.pem", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "gateway.tls_client_ca", "ca.pem", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "redis.username", "pivirt", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "redis.password", "redis-secret-3", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "auth.exempt_health", "false", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    assert_false(c.auth.exempt_health);
    char *dump = pv_config_dump_json(&c);
    assert_null(strstr(dump, "redis-secret-3"));
    assert_non_null(strstr(dump, "\"username\": \"pivirt\""));
    free(dump);
    pv_config_free(&c);
}

static void test_validate_ranges_of_struct_values(void **state) {
    (void)state;
    /* Code may fill the struct directly: validate checks the same ranges as the setters. */
    pv_config c;
    init_ok(&c);
    pv_status st;
    c.gateway.threads = 0;
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "gateway.threads: 0 is out of range 1..256");
    c.gateway.threads = 2;
    c.redis.command_timeout_ms = -1;
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "redis.command_timeout_ms");
    c.redis.command_timeout_ms = 10;
    c.scheduler.heartbeat_seconds = 0;
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "scheduler.heartbeat_seconds");
    pv_config_free(&c);
}

/* ha.fence_seconds must leave the safety margin below ha.node_timeout_seconds and stay above
 * the beat interval; each error names both keys and the values. */
static void test_validate_ha_fence(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(c.ha.node_timeout_seconds, 8);
    assert_int_equal(c.ha.fence_seconds, 5);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "ha.fence_seconds", "7", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "ha.fence_seconds: 7 must be at most ha.node_timeout_seconds (8)");
    assert_contains(st.msg, "safety margin of 2 s");
    assert_int_equal(pv_config_set(&c, "ha.fence_seconds", "8", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "ha.node_timeout_seconds");
    /* the margin exactly: accepted */
    assert_int_equal(pv_config_set(&c, "ha.node_timeout_seconds", "6", &st), PV_OK);
    assert_int_equal(pv_config_set(&c, "ha.fence_seconds", "4", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    /* not above the beat interval */
    assert_int_equal(pv_config_set(&c, "worker.heartbeat_seconds", "4", &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_INVALID_ARGUMENT);
    assert_contains(st.msg, "ha.fence_seconds: 4 must be more than worker.heartbeat_seconds (4)");
    pv_config_free(&c);
}

/* ---- dump ---- */

static void test_dump_masks_passwords(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    json_t *root = dump_parsed(&c);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(root, "redis"), "password")), "");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(root, "auth"), "password")), "");
    json_decref(root);

    assert_int_equal(pv_config_set(&c, "redis.password", "redis-secret-1", NULL), PV_OK);
    assert_int_equal(pv_config_set(&c, "auth.password", "auth-secret-2", NULL), PV_OK);
    char *s = pv_config_dump_json(&c);
    assert_null(strstr(s, "redis-secret-1"));
    assert_null(strstr(s, "auth-secret-2"));
    free(s);
    root = dump_parsed(&c);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(root, "redis"), "password")), "***");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(root, "auth"), "password")), "***");
    json_decref(root);
    pv_config_free(&c);
}

static void test_dump_shape_round_trips(void **state) {
    (void)state;
    pv_config c;
    init_ok(&c);
    assert_int_equal(pv_config_set(&c, "log.level", "warning", NULL), PV_OK);
    json_t *root = dump_parsed(&c);
    json_t *redis = json_object_get(root, "redis");
    assert_int_equal(json_integer_value(json_object_get(redis, "command_timeout_ms")), 2000);
    assert_string_equal(json_string_value(json_object_get(redis, "addr")), "127.0.0.1:6390");
    json_t *listen = json_object_get(json_object_get(root, "gateway"), "listen");
    assert_int_equal(json_array_size(listen), 3);
    assert_string_equal(json_string_value(json_array_get(listen, 2)), "localhost:5001");
    assert_string_equal(json_string_value(json_object_get(json_object_get(root, "log"), "level")),
                        "warn");
    assert_true(json_is_false(json_object_get(root, "test_operations")));
    assert_string_equal(json_string_value(json_object_get(root, "data_dir")), "./.data");
    json_decref(root);

    /* The dump (without secrets) is itself a valid config file that gives the same config. */
    char *s = pv_config_dump_json(&c);
    const char *path = write_tmp(s);
    pv_config d;
    init_ok(&d);
    pv_status st;
    assert_int_equal(pv_config_load_file(&d, path, &st), PV_OK);
    char *t = pv_config_dump_json(&d);
    assert_string_equal(s, t);
    free(s);
    free(t);
    pv_config_free(&d);
    pv_config_free(&c);
}

#define T(f) cmocka_unit_test_teardown(f, teardown_tmp)

/* Every key of the default configuration is in `from` (recursively), as in `want`. */
static void assert_same_keys(json_t *want, json_t *from, const char *where) {
    const char *key;
    json_t *v;
    json_object_foreach(want, key, v) {
        json_t *got = json_object_get(from, key);
        if (!got) fail_msg("ops/config.example.json lacks %s%s", where, key);
        if (json_is_object(v)) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s.", where, key);
            assert_same_keys(v, got, sub);
        }
    }
}

/* ops/config.example.json loads, is valid, and names every key there is. */
static void test_example_config_is_complete(void **state) {
    (void)state;
    const char *src = getenv("PV_SOURCE_DIR");
    if (!src) skip();
    char path[4096];
    snprintf(path, sizeof path, "%s/ops/config.example.json", src);
    pv_config c;
    init_ok(&c);
    pv_status st;
    assert_int_equal(pv_config_load_file(&c, path, &st), PV_OK);
    assert_int_equal(pv_config_validate(&c, &st), PV_OK);
    pv_config d;
    init_ok(&d);
    json_t *defaults = dump_parsed(&d);
    json_t *example = json_load_file(path, 0, NULL);
    assert_non_null(example);
    assert_same_keys(defaults, example, "");
    json_decref(defaults);
    json_decref(example);
    pv_config_free(&c);
    pv_config_free(&d);
}

int main(void) {
    /* The precedence tests own these variables; an outside value must not leak in. */
    teardown_tmp(NULL);
    const struct CMUnitTest tests[] = {
        T(test_defaults),
        T(test_set_each_type),
        T(test_set_booleans),
        T(test_set_bad_numbers),
        T(test_set_bad_level_and_unknown_key),
        T(test_set_long_value_is_cut_in_message),
        T(test_file_merges_over_defaults),
        T(test_file_listen_as_string),
        T(test_file_bad_json_names_line),
        T(test_file_missing),
        T(test_file_unknown_key),
        T(test_file_type_errors),
        T(test_file_error_midway_keeps_config_owned),
        T(test_env_applies_known_keys),
        T(test_env_unknown_and_bad),
        T(test_load_precedence_file_env_set),
        T(test_load_file_from_env),
        T(test_load_rewrites_argv),
        T(test_load_set_value_with_equals),
        T(test_load_error_paths),
        T(test_load_env_error),
        T(test_validate_auth),
        T(test_registry_auths),
        T(test_validate_tls_and_listen),
        T(test_validate_ranges_of_struct_values),
        T(test_validate_ha_fence),
        T(test_dump_masks_passwords),
        T(test_dump_shape_round_trips),
        T(test_example_config_is_complete),
        T(test_security_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
