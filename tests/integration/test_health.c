/*
 * The agent's status reporter (wk_health) with real processes and a real Redis: workloads of
 * the process engine, registered in the registry, with and without Eru healthchecks (a real
 * HTTP server, python3's http.server, inside the workload), reported by wk_health_pass.
 *
 * Redis and the image archive are made (forked) before the engine opens: while it is open,
 * libev reaps every child of this process.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_test_util.h"

#include "pv_config.h"
#include "pv_keys.h"
#include "pv_registry.h"
#include "pv_test_redis.h"
#include "pv_workload.h"
#include "wk_engine.h"
#include "wk_health.h"

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    char dir[64], state_dir[96], image_dir[96];
    wk_engine *e;
    pv_config cfg;
    wk_health *h;
} fixture;

/* A port nothing listens on right now. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    pv_status st;
    snprintf(f->dir, sizeof f->dir, "/tmp/pv-health-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->state_dir, sizeof f->state_dir, "%s/state", f->dir);
    snprintf(f->image_dir, sizeof f->image_dir, "%s/images", f->dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/src %s/hc && echo ok > %s/src/index.html && tar -cf %s/hc/1.tar -C "
             "%s/src .",
             f->dir, f->image_dir, f->dir, f->image_dir, f->dir);
    if (system(cmd) != 0) return -1;
    if (pv_test_redis_start(&f->srv, NULL) != 0 || pv_keys_init(&f->keys, "t:", &st) != PV_OK ||
        !(f->r = pv_test_redis_client(f->srv, 5000)))
        return -1;
    pv_pod_spec pod_spec = {.name = "hp"};
    pv_pod pod;
    if (pv_registry_add_pod(f->r, &f->keys, &pod_spec, &pod, &st) != PV_OK) return -1;
    pv_pod_clear(&pod);
    pv_node_spec ns = {.name = "hn",
                       .pod_name = "hp",
                       .endpoint = "process://",
                       .resources = "{\"cpumem\":{\"cpu\":4,\"memory\":\"8G\"}}"};
    pv_node node;
    if (pv_registry_add_node(f->r, &f->keys, &ns, &node, &st) != PV_OK) return -1;
    pv_node_clear(&node);
    wk_engine_opts opts = {
        .state_dir = f->state_dir, .image_dir = f->image_dir, .stop_grace_seconds = 2};
    if (wk_engine_open("process://", &opts, &f->e, &st) != PV_OK) return -1;
    f->cfg.redis.prefix = "t:";
    f->cfg.worker.status_interval_seconds = 1;
    return (f->h = wk_health_new(&f->cfg, f->e)) ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    wk_engine_info *all = NULL;
    size_t n = 0;
    pv_status st;
    if (wk_engine_list(f->e, &all, &n, &st) == PV_OK)
        for (size_t i = 0; i < n; i++)
            wk_engine_remove(f->e, all[i].id, true, &st);
    wk_engine_info_array_free(all, n);
    wk_engine_close(f->e);
    wk_health_free(f->h);
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    pv_test_sh("rm -rf %s", f->dir);
    free(f);
    return 0;
}

/* Creates and starts workload id running argv, with labels, and registers it. */
static void run_wl(fixture *f, const char *id, const char *const *argv, size_t argc,
                   const char *labels, bool registered) {
    wk_workload_spec s;
    memset(&s, 0, sizeof s);
    s.id = id;
    s.name = "hc_web_abcdef";
    s.image = "hc:1";
    s.commands = argv;
    s.ncommands = argc;
    s.dir = "";
    s.user = "";
    s.restart = "no";
    s.labels_json = labels;
    wk_engine_info info;
    pv_status st;
    if (wk_engine_create(f->e, &s, &info, &st) != PV_OK) fail_msg("create %s: %s", id, st.msg);
    wk_engine_info_clear(&info);
    if (wk_engine_start(f->e, id, &st) != PV_OK) fail_msg("start %s: %s", id, st.msg);
    if (!registered) return;
    pv_workload w = {.name = "hc_web_abcdef",
                     .app = "hc",
                     .entry = "web",
                     .node = "hn",
                     .image = "hc:1",
                     .labels = (char *)labels};
    snprintf(w.id, sizeof w.id, "%s", id);
    if (pv_workload_add(f->r, &f->keys, &w, &st) != PV_OK) fail_msg("add %s: %s", id, st.msg);
}

static void pass(fixture *f, size_t *written, size_t *renewed) {
    pv_status st;
    if (wk_health_pass(f->h, f->r, written, renewed, &st) != PV_OK) fail_msg("pass: %s", st.msg);
}

static pv_workload_status status(fixture *f, const char *id) {
    pv_workload_status s;
    pv_status st;
    if (pv_workload_get_status(f->r, &f->keys, id, &s, &st) != PV_OK)
        fail_msg("status %s: %s", id, st.msg);
    return s;
}

static long long ttl_of(fixture *f, const char *id) {
    char key[PV_KEY_MAX];
    pv_status st;
    assert_int_equal(pv_workload_status_key(&f->keys, id, key, sizeof key, &st), PV_OK);
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "TTL %s", key), PV_OK);
    long long t = rep->integer;
    freeReplyObject(rep);
    return t;
}

static const char *const SLEEPER[] = {"/bin/sleep", "600"};

static void test_running_without_healthcheck_is_healthy(void **state) {
    fixture *f = *state;
    run_wl(f, "plain", SLEEPER, 2, "{\"ERU\":\"1\"}", true);
    size_t written, renewed;
    pass(f, &written, &renewed);
    assert_int_equal(written, 1);
    pv_workload_status s = status(f, "plain");
    assert_true(s.running);
    assert_true(s.healthy);
    assert_non_null(strstr(s.networks, "\"host\""));
    pv_workload_status_clear(&s);
    long long t = ttl_of(f, "plain");
    assert_true(t > 0 && t <= 3); /* three intervals of 1 s */
    /* unchanged: the TTL is renewed, nothing is written */
    pass(f, &written, &renewed);
    assert_int_equal(written, 0);
    assert_int_equal(renewed, 1);
}

static void test_stopped_deleted_and_unregistered(void **state) {
    fixture *f = *state;
    run_wl(f, "stops", SLEEPER, 2, "{}", true);
    run_wl(f, "stray", SLEEPER, 2, "{}", false); /* the engine's, not the registry's */
    size_t written, renewed;
    pass(f, &written, &renewed);
    assert_int_equal(written, 1);
    pv_status st;
    assert_int_equal(wk_engine_stop(f->e, "stops", 1, true, &st), PV_OK);
    pass(f, &written, &renewed);
    assert_int_equal(written, 1);
    pv_workload_status s = status(f, "stops");
    assert_false(s.running);
    assert_false(s.healthy);
    pv_workload_status_clear(&s);
    /* a status someone deleted comes back on the next pass but one */
    char key[PV_KEY_MAX];
    assert_int_equal(pv_workload_status_key(&f->keys, "stops", key, sizeof key, &st), PV_OK);
    redisReply *rep = NULL;
    assert_int_equal(pv_redis_command(f->r, &rep, &st, "DEL %s", key), PV_OK);
    freeReplyObject(rep);
    pass(f, &written, &renewed);
    assert_int_equal(renewed, 0);
    pass(f, &written, &renewed);
    assert_int_equal(written, 1);
    s = status(f, "stops");
    assert_false(s.running);
    pv_workload_status_clear(&s);
}

static void test_tcp_and_http_healthcheck(void **state) {
    fixture *f = *state;
    int port = free_port();
    char ps[16], good[512], bad[512], closed[512];
    snprintf(ps, sizeof ps, "%d", port);
    snprintf(good, sizeof good,
             "{\"ERU_META\":\"{\\\"healthcheck\\\":{\\\"tcp_ports\\\":[\\\"%d\\\"],"
             "\\\"http_port\\\":\\\"%d\\\",\\\"url\\\":\\\"/index.html\\\",\\\"code\\\":200}}\"}",
             port, port);
    snprintf(bad, sizeof bad,
             "{\"ERU_META\":\"{\\\"healthcheck\\\":{\\\"http_port\\\":\\\"%d\\\","
             "\\\"url\\\":\\\"/missing\\\",\\\"code\\\":200}}\"}",
             port);
    snprintf(closed, sizeof closed,
             "{\"ERU_META\":\"{\\\"healthcheck\\\":{\\\"tcp_ports\\\":[\\\"%d\\\"]}}\"}",
             free_port());
    const char *server[] = {"/usr/bin/python3", "-m", "http.server", ps, "--bind", "0.0.0.0"};
    run_wl(f, "web", server, 6, good, true);
    run_wl(f, "webbad", SLEEPER, 2, bad, true);
    run_wl(f, "webclosed", SLEEPER, 2, closed, true);
    /* the server takes a moment to listen */
    bool healthy = false;
    for (int i = 0; i < 100 && !healthy; i++) {
        pass(f, NULL, NULL);
        pv_workload_status s = status(f, "web");
        healthy = s.healthy;
        pv_workload_status_clear(&s);
        if (!healthy) pv_test_sleep_ms(100);
    }
    assert_true(healthy);
    pv_workload_status s = status(f, "webbad");
    assert_true(s.running);
    assert_false(s.healthy); /* 404, not 200 */
    pv_workload_status_clear(&s);
    s = status(f, "webclosed");
    assert_true(s.running);
    assert_false(s.healthy);
    pv_workload_status_clear(&s);
    /* the check says why */
    wk_engine_info info;
    pv_status st;
    assert_int_equal(wk_engine_inspect(f->e, "webbad", &info, &st), PV_OK);
    char why[256];
    assert_false(wk_health_check(info.labels_json, info.networks_json, why, sizeof why));
    assert_non_null(strstr(why, "answered 404, not 200"));
    wk_engine_info_clear(&info);
    /* the server goes away: unhealthy and not running */
    assert_int_equal(wk_engine_stop(f->e, "web", 1, true, &st), PV_OK);
    pass(f, NULL, NULL);
    s = status(f, "web");
    assert_false(s.running);
    assert_false(s.healthy);
    pv_workload_status_clear(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_running_without_healthcheck_is_healthy, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_stopped_deleted_and_unregistered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_and_http_healthcheck, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
