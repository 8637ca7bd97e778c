/*
 * Presence on a real Redis: a started presence is in the live set of its kind with its JSON
 * document, a stopped one leaves at once, an instance that stops beating (crashed) drops out
 * after its TTL, and a presence started while Redis is down reports UNAVAILABLE but joins by
 * itself once Redis is back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_config.h"
#include "pv_presence.h"
#include "pv_redis.h"
#include "pv_test_redis.h"

typedef struct fixture {
    pv_test_redis *srv;
    pv_config cfg;
    pv_keys keys;
    pv_redis *r;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_config_init(&f->cfg, &st);
    pv_config_set(&f->cfg, "redis.addr", pv_test_redis_addr(f->srv), &st);
    pv_config_set(&f->cfg, "redis.prefix", "t:", &st);
    pv_keys_init(&f->keys, "t:", &st);
    f->r = pv_test_redis_client(f->srv, 2000);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    pv_redis_free(f->r);
    pv_config_free(&f->cfg);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

static size_t live(fixture *f, const char *kind, const char *want_substring) {
    char **values = NULL;
    size_t n = 0;
    pv_status st;
    assert_int_equal(pv_presence_list(f->r, &f->keys, kind, &values, &n, &st), PV_OK);
    if (want_substring && n > 0) assert_non_null(strstr(values[0], want_substring));
    pv_presence_values_free(values, n);
    return n;
}

static void test_join_and_leave(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_presence *a = NULL, *b = NULL;
    pv_presence_opts oa = {
        .kind = "gateway", .instance = "gw-a", .addr = "127.0.0.1:1", .interval_seconds = 1};
    pv_presence_opts ob = oa;
    ob.instance = "gw-b";
    ob.addr = "127.0.0.1:2";
    assert_int_equal(pv_presence_start(&f->cfg, &oa, &a, &st), PV_OK);
    assert_int_equal(live(f, "gateway", "\"addr\":\"127.0.0.1:1\""), 1);
    assert_int_equal(pv_presence_start(&f->cfg, &ob, &b, &st), PV_OK);
    assert_int_equal(live(f, "gateway", NULL), 2);
    assert_int_equal(live(f, "worker", NULL), 0);

    redisContext *c = pv_test_redis_connect(f->srv);
    redisReply *ttl = redisCommand(c, "PTTL t:presence:gateway:gw-a");
    assert_true(ttl->integer > 0 && ttl->integer <= 3000);
    freeReplyObject(ttl);

    pv_presence_stop(a);
    assert_int_equal(live(f, "gateway", "gw-b"), 1);
    redisReply *ex = redisCommand(c, "EXISTS t:presence:gateway:gw-a");
    assert_int_equal(ex->integer, 0);
    freeReplyObject(ex);
    redisFree(c);
    pv_presence_stop(b);
    assert_int_equal(live(f, "gateway", NULL), 0);
}

static void test_dead_instance_expires(void **state) {
    fixture *f = *state;
    pv_status st;
    /* A beat with a 300 ms TTL and nobody renewing it: a process that died. */
    const char *keys[] = {"t:presence:worker:dead", "t:presence:worker"};
    const char *args[] = {"300", "{\"addr\":\"\"}", "dead"};
    redisReply *reply = NULL;
    assert_int_equal(pv_redis_fcall(f->r, "pv_heartbeat", 2, keys, 3, args, &reply, &st), PV_OK);
    freeReplyObject(reply);
    assert_int_equal(live(f, "worker", NULL), 1);
    usleep(500 * 1000);
    assert_int_equal(live(f, "worker", NULL), 0);
}

static void test_start_while_redis_down(void **state) {
    fixture *f = *state;
    pv_status st;
    pv_presence *p = NULL;
    pv_presence_opts o = {.kind = "scheduler", .instance = "s1", .addr = "", .interval_seconds = 1};
    pv_test_redis_kill9(f->srv);
    assert_int_equal(pv_presence_start(&f->cfg, &o, &p, &st), PV_UNAVAILABLE);
    assert_non_null(p);
    assert_non_null(strstr(st.msg, pv_test_redis_addr(f->srv)));
    assert_int_equal(pv_test_redis_restart(f->srv), 0);
    size_t n = 0;
    for (int i = 0; i < 40 && n == 0; i++) {
        usleep(100 * 1000);
        char **values = NULL;
        if (pv_presence_list(f->r, &f->keys, "scheduler", &values, &n, &st) != PV_OK) n = 0;
        pv_presence_values_free(values, n);
    }
    assert_int_equal(n, 1);
    pv_presence_stop(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_join_and_leave, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_instance_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_while_redis_down, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
