/*
 * gw_async, the followers' asynchronous Redis connection, on a real redis-server: it connects
 * and authenticates (ready), hears the server die (lost) and comes back by itself when the
 * server does; a refused AUTH is lost, never ready; after gw_async_close nothing more is heard.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gw_async.h"
#include "pv_test_redis.h"

typedef struct seen {
    int ready, lost;
    char why[256];
} seen;

static void on_ready(void *arg, redisAsyncContext *ac) {
    (void)ac;
    ((seen *)arg)->ready++;
}

static void on_lost(void *arg, const char *why) {
    seen *s = arg;
    s->lost++;
    snprintf(s->why, sizeof s->why, "%s", why);
}

/* Runs loop until *counter reaches want, 5 s at most; returns whether it did. */
static bool run_until(struct ev_loop *loop, const int *counter, int want) {
    for (int i = 0; i < 500 && *counter < want; i++) {
        ev_now_update(loop);
        ev_run(loop, EVRUN_NOWAIT);
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return *counter >= want;
}

static gw_async *start(pv_config *cfg, struct ev_loop *loop, seen *s) {
    gw_async_spec spec = {
        .what = "test", .backoff_ms = {20, 100}, .ready = on_ready, .lost = on_lost, .arg = s};
    gw_async *a = gw_async_new(cfg, loop, &spec);
    assert_non_null(a);
    gw_async_connect(a);
    return a;
}

static void test_reconnects_after_the_server_comes_back(void **state) {
    (void)state;
    pv_test_redis *srv;
    assert_int_equal(pv_test_redis_start(&srv, "--requirepass s3cret"), 0);
    pv_config cfg = {0};
    cfg.redis.addr = (char *)pv_test_redis_addr(srv);
    cfg.redis.password = "s3cret";
    cfg.redis.connect_timeout_ms = 1000;
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    seen s = {0};
    gw_async *a = start(&cfg, loop, &s);
    assert_true(run_until(loop, &s.ready, 1));
    assert_int_equal(s.lost, 0);
    assert_int_equal(pv_test_redis_kill9(srv), 0);
    assert_true(run_until(loop, &s.lost, 1));
    assert_int_equal(pv_test_redis_restart(srv), 0);
    assert_true(run_until(loop, &s.ready, 2));
    gw_async_close(a);
    int lost = s.lost;
    assert_int_equal(pv_test_redis_kill9(srv), 0);
    run_until(loop, &s.lost, lost + 1);
    assert_int_equal(s.lost, lost); /* closed: not heard */
    gw_async_free(a);
    ev_loop_destroy(loop);
    pv_test_redis_free(srv);
}

static void test_refused_auth_is_lost_not_ready(void **state) {
    (void)state;
    pv_test_redis *srv;
    assert_int_equal(pv_test_redis_start(&srv, "--requirepass s3cret"), 0);
    pv_config cfg = {0};
    cfg.redis.addr = (char *)pv_test_redis_addr(srv);
    cfg.redis.password = "wrong";
    cfg.redis.connect_timeout_ms = 1000;
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    seen s = {0};
    gw_async *a = start(&cfg, loop, &s);
    assert_true(run_until(loop, &s.lost, 1));
    assert_int_equal(s.ready, 0);
    gw_async_close(a);
    gw_async_free(a);
    ev_loop_destroy(loop);
    pv_test_redis_free(srv);
}

static void test_bad_address_is_refused(void **state) {
    (void)state;
    pv_config cfg = {0};
    cfg.redis.addr = "host:notaport";
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    seen s = {0};
    gw_async_spec spec = {.what = "test", .ready = on_ready, .lost = on_lost, .arg = &s};
    assert_null(gw_async_new(&cfg, loop, &spec));
    ev_loop_destroy(loop);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reconnects_after_the_server_comes_back),
        cmocka_unit_test(test_refused_auth_is_lost_not_ready),
        cmocka_unit_test(test_bad_address_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
