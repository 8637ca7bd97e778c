/*
 * Deploy reservations through real pivirt-scheduler processes, raced from several client
 * processes: each client is what a gateway (or an ops worker) does for a deploy, pv_sched_call
 * with kind "reserve" on its own Redis connection. Two schedulers serve the requests; the pod
 * holds exactly CAPACITY instances of the request. However the requests interleave, exactly
 * CAPACITY reservations succeed, the rest fail with RESOURCE_EXHAUSTED, and the nodes' usage is
 * what the allocations add up to. A second test kills one scheduler with SIGKILL in the middle
 * of the race: the other takes its pending requests over and still nothing is overcommitted.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_presence.h"
#include "pv_redis.h"
#include "pv_registry.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "pv_test_redis.h"

#define CLIENTS 3
#define CAPACITY 12 /* 8 on n1, 4 on n2 at 1G each */

typedef struct fixture {
    pv_test_redis *srv;
    pv_keys keys;
    pv_redis *r;
    pid_t sched[2];
} fixture;

static pv_redis *connect_new(fixture *f) {
    return pv_test_redis_client(f->srv, 5000);
}

static pid_t start_scheduler(fixture *f, int i) {
    const char *build = getenv("PV_BUILD_DIR");
    char bin[1024], addr[128], log[1024], inst[64];
    snprintf(bin, sizeof bin, "%s/bin/pivirt-scheduler", build ? build : ".");
    snprintf(addr, sizeof addr, "redis.addr=%s", pv_test_redis_addr(f->srv));
    snprintf(log, sizeof log, "%s/scheduler-%d.log", pv_test_redis_dir(f->srv), i);
    snprintf(inst, sizeof inst, "race-%d", i);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *out = freopen(log, "a", stderr);
        (void)out;
        execl(bin, bin, "--set", addr, "--set", "redis.prefix=t:", "--set",
              "scheduler.claim_idle_ms=300", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits until n schedulers have their presence in Redis. */
static int wait_schedulers(fixture *f, size_t n) {
    for (int i = 0; i < 100; i++) {
        char **v = NULL;
        size_t got = 0;
        pv_status st;
        if (pv_presence_list(f->r, &f->keys, "scheduler", &v, &got, &st) == PV_OK) {
            pv_presence_values_free(v, got);
            if (got >= n) return 0;
        }
        usleep(100 * 1000);
    }
    return -1;
}

static void add_node(fixture *f, const char *name, const char *resources) {
    pv_status st;
    pv_node n;
    pv_node_spec spec = {
        .name = name, .pod_name = "p1", .endpoint = "process://", .resources = resources};
    assert_int_equal(pv_registry_add_node(f->r, &f->keys, &spec, &n, &st), PV_OK);
    pv_node_clear(&n);
    assert_int_equal(pv_registry_set_alive(f->r, &f->keys, name, 600, NULL, &st), PV_OK);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    pv_status st;
    if (pv_test_redis_start(&f->srv, NULL) != 0) return -1;
    pv_keys_init(&f->keys, "t:", &st);
    if (!(f->r = connect_new(f))) return -1;
    pv_pod p;
    pv_pod_spec ps = {.name = "p1"};
    if (pv_registry_add_pod(f->r, &f->keys, &ps, &p, &st) != PV_OK) return -1;
    pv_pod_clear(&p);
    add_node(f, "n1", "{\"cpumem\":{\"cpu\":16,\"memory\":\"8G\"}}");
    add_node(f, "n2", "{\"cpumem\":{\"cpu\":16,\"memory\":\"4G\"}}");
    for (int i = 0; i < 2; i++)
        f->sched[i] = start_scheduler(f, i);
    if (wait_schedulers(f, 2) != 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    for (int i = 0; i < 2; i++) {
        if (f->sched[i] <= 0) continue;
        kill(f->sched[i], SIGTERM);
        int status = 0;
        waitpid(f->sched[i], &status, 0);
    }
    pv_redis_free(f->r);
    pv_test_redis_free(f->srv);
    free(f);
    return 0;
}

/* A client process: reserves one instance at a time until the pod is full; writes how many it
 * won and how many requests failed otherwise than RESOURCE_EXHAUSTED to fd. */
static void client(fixture *f, int fd) {
    pv_redis *r = connect_new(f);
    int won = 0, odd = 0, full = 0;
    const char *body = "{\"pod\":\"p1\",\"count\":1,\"app\":\"race\",\"entrypoint\":\"e\","
                       "\"resources\":{\"cpumem\":{\"memory-request\":\"1G\"}}}";
    while (r && !full) {
        pv_sched_call_opts o = {.timeout_ms = 15000};
        char *reply = NULL;
        pv_status st;
        int rc = pv_sched_call(r, &f->keys, "reserve", body, &o, &reply, &st);
        if (rc == PV_OK)
            won++;
        else if (rc == PV_RESOURCE_EXHAUSTED)
            full = 1;
        else if (++odd > 20)
            break;
        if (rc != PV_OK && rc != PV_RESOURCE_EXHAUSTED)
            fprintf(stderr, "client %d: %s\n", (int)getpid(), st.msg);
        free(reply);
    }
    int out[2] = {won, odd};
    ssize_t w = write(fd, out, sizeof out);
    (void)w;
    pv_redis_free(r);
}

/* Runs the clients; with kill_one, SIGKILLs scheduler 0 shortly after they start. Returns the
 * total won; *odd gets the failures other than a full pod. */
static int race(fixture *f, int kill_one, int *odd) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t kids[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(fds[0]);
            client(f, fds[1]);
            _exit(0);
        }
    }
    close(fds[1]);
    if (kill_one) {
        usleep(20 * 1000);
        kill(f->sched[0], SIGKILL);
        waitpid(f->sched[0], NULL, 0);
        f->sched[0] = 0;
    }
    int won = 0;
    *odd = 0;
    for (int i = 0; i < CLIENTS; i++) {
        int got[2] = {0, 0};
        assert_int_equal(read(fds[0], got, sizeof got), (ssize_t)sizeof got);
        won += got[0];
        *odd += got[1];
    }
    for (int i = 0; i < CLIENTS; i++)
        waitpid(kids[i], NULL, 0);
    close(fds[0]);
    return won;
}

static long long allocs_total(fixture *f) {
    redisContext *c = pv_test_redis_connect(f->srv);
    long long total = 0;
    for (int i = 1; i <= 2; i++) {
        redisReply *id = redisCommand(c, "HGET t:{reg}:nodes n%d", i);
        redisReply *n = redisCommand(c, "HLEN t:{reg}:node-allocs:%s", id->str);
        total += n->integer;
        freeReplyObject(n);
        freeReplyObject(id);
    }
    redisFree(c);
    return total;
}

static void assert_usage_consistent(fixture *f) {
    for (int i = 1; i <= 2; i++) {
        char name[8];
        snprintf(name, sizeof name, "n%d", i);
        pv_resv_check c;
        pv_status st;
        assert_int_equal(pv_resv_check_node(f->r, &f->keys, name, 0, &c, &st), PV_OK);
        if (c.ndiffs > 0) fail_msg("%s: %s", name, c.diffs[0]);
        pv_resv_check_clear(&c);
    }
}

/* The schedulers trim the request stream on their tick (every 2 s): once every request is
 * answered, nothing is left in it. */
static void assert_requests_trimmed(fixture *f) {
    redisContext *c = pv_test_redis_connect(f->srv);
    long long left = -1;
    for (int i = 0; i < 60 && left != 0; i++) {
        if (i > 0) usleep(100 * 1000);
        redisReply *n = redisCommand(c, "XLEN t:{reg}:sched:requests");
        left = n->integer;
        freeReplyObject(n);
    }
    redisFree(c);
    assert_int_equal(left, 0);
}

static void test_two_schedulers_never_overcommit(void **state) {
    fixture *f = *state;
    int odd = 0;
    int won = race(f, 0, &odd);
    assert_int_equal(odd, 0);
    assert_int_equal(won, CAPACITY);
    assert_int_equal(allocs_total(f), CAPACITY);
    assert_usage_consistent(f);
    assert_requests_trimmed(f);
}

static void test_scheduler_killed_mid_race(void **state) {
    fixture *f = *state;
    int odd = 0;
    int won = race(f, 1, &odd);
    /* Requests the dead scheduler held are taken over (claim_idle_ms 300), so every client
     * still reaches a full pod; a request it had committed before dying counts once. */
    assert_int_equal(odd, 0);
    assert_int_equal(won, CAPACITY);
    assert_int_equal(allocs_total(f), CAPACITY);
    assert_usage_consistent(f);
    assert_requests_trimmed(f);
}

/* A requester that asks again with the same request id (an operation redelivered after its
 * worker died) is told at once that the reservation exists, and can read it. */
static void test_same_request_id_answers_already_exists(void **state) {
    fixture *f = *state;
    const char *body = "{\"pod\":\"p1\",\"count\":3,\"resources\":{\"cpumem\":"
                       "{\"memory-request\":\"1G\"}}}";
    pv_sched_call_opts o = {.timeout_ms = 10000, .request_id = "plan-op-42"};
    char *reply = NULL;
    pv_status st;
    assert_int_equal(pv_sched_call(f->r, &f->keys, "reserve", body, &o, &reply, &st), PV_OK);
    assert_non_null(strstr(reply, "resv-op-42"));
    free(reply);
    reply = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(pv_sched_call(f->r, &f->keys, "reserve", body, &o, &reply, &st),
                     PV_ALREADY_EXISTS);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 5);
    assert_non_null(strstr(st.msg, "resv-op-42"));
    pv_resv rv;
    assert_int_equal(pv_resv_get(f->r, &f->keys, "resv-op-42", &rv, &st), PV_OK);
    size_t held = 0;
    for (size_t i = 0; i < rv.nnodes; i++)
        held += rv.nodes[i].nallocs;
    assert_int_equal(held, 3);
    pv_resv_clear(&rv);
    assert_int_equal(allocs_total(f), 3);
    o.request_id = "bogus-1";
    assert_int_equal(pv_sched_call(f->r, &f->keys, "reserve", body, &o, &reply, &st),
                     PV_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_schedulers_never_overcommit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_killed_mid_race, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_request_id_answers_already_exists, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
