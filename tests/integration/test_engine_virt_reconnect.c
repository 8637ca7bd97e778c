/*
 * The virt engine's calls across a libvirtd restart, on the system libvirtd's test driver
 * (test+unix:///default: libvirtd's own in-daemon test driver, reached over its RPC socket as
 * qemu:///system is) through a relay of the test's own on a unix socket (?socket=...): the
 * relay going down closes every connection the engine has and refuses new ones, as a libvirtd
 * stopped does, and coming up again is libvirtd back, without restarting the libvirtd that
 * every other test of the machine uses.
 *
 *   test_lost_errors        what libvirt says on a connection whose daemon went away is
 *                           classified as lost (wk_virt_conn_lost), a refusal is not
 *   test_calls_after_restart
 *                           after a restart, the first call on each dead connection (stop,
 *                           start, suspend, resume, inspect, list, remove) succeeds: it runs
 *                           again on a new connection
 *   test_remove_while_down  a remove issued while libvirtd is down succeeds once it is back
 *                           (1.5 s later); one issued while it stays down fails UNAVAILABLE
 *                           naming libvirt's URI (transient: the node operation is retried),
 *                           and the domain is still there to remove afterwards
 *
 * libvirtd must run (./ops/pivirt test starts it). Names are unique per run; the engine's state
 * directory is the test's own, so no other client's test domains are ever touched.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "pv_time.h"
#include "wk_engine.h"
#include "wk_virt_conn.h"

#define LIBVIRT_SOCK "/run/libvirt/libvirt-sock"
#define DIRECT_URI "test+unix:///default"
#define MAX_PAIRS 32

/* ---- the relay: a unix socket in front of libvirtd's ------------------------------------- */

typedef struct relay {
    char path[96];
    int ctl[2], ack[2]; /* commands to the relay's thread ('u', 'd', 'q'), its answers */
    int lfd;            /* listening; -1 while down */
    int pairs[MAX_PAIRS][2];
    int npairs;
    pthread_t th;
} relay;

static void relay_drop(relay *r, int i) {
    close(r->pairs[i][0]);
    close(r->pairs[i][1]);
    r->pairs[i][0] = r->pairs[--r->npairs][0];
    r->pairs[i][1] = r->pairs[r->npairs][1];
}

static int unix_socket(const char *path, bool listen_on) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int rc = listen_on ? bind(fd, (struct sockaddr *)&a, sizeof a) == 0 ? listen(fd, 16) : -1
                       : connect(fd, (struct sockaddr *)&a, sizeof a);
    if (rc != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A command: 'u' listens again, 'd' closes every relayed connection and the listening socket
 * (gone from the file system: a connect fails as with no libvirtd), 'q' ends the thread. */
static bool relay_command(relay *r, char cmd) {
    if (cmd == 'u' && r->lfd < 0) {
        unlink(r->path);
        r->lfd = unix_socket(r->path, true);
    } else if (cmd == 'd' || cmd == 'q') {
        while (r->npairs > 0)
            relay_drop(r, 0);
        if (r->lfd >= 0) close(r->lfd);
        r->lfd = -1;
        unlink(r->path);
    }
    char ok = r->lfd >= 0 || cmd != 'u' ? 'y' : 'n';
    if (write(r->ack[1], &ok, 1) != 1) return false;
    return cmd != 'q';
}

/* Copies what one side has to the other; false when that side closed. */
static bool relay_copy(int from, int to) {
    char buf[65536];
    ssize_t n = read(from, buf, sizeof buf);
    if (n <= 0) return false;
    for (ssize_t off = 0; off < n;) {
        ssize_t w = write(to, buf + off, (size_t)(n - off));
        if (w <= 0) return false;
        off += w;
    }
    return true;
}

static void *relay_main(void *arg) {
    relay *r = arg;
    for (;;) {
        struct pollfd p[2 + 2 * MAX_PAIRS];
        int np = 0;
        p[np++] = (struct pollfd){.fd = r->ctl[0], .events = POLLIN};
        p[np++] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
        for (int i = 0; i < r->npairs; i++) {
            p[np++] = (struct pollfd){.fd = r->pairs[i][0], .events = POLLIN};
            p[np++] = (struct pollfd){.fd = r->pairs[i][1], .events = POLLIN};
        }
        if (poll(p, (nfds_t)np, -1) < 0 && errno != EINTR) return NULL;
        char cmd;
        if ((p[0].revents & POLLIN) && read(r->ctl[0], &cmd, 1) == 1) {
            if (!relay_command(r, cmd)) return NULL;
            continue; /* the pairs changed */
        }
        if (r->lfd >= 0 && (p[1].revents & POLLIN)) {
            int c = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
            int u = c >= 0 ? unix_socket(LIBVIRT_SOCK, false) : -1;
            if (u >= 0 && r->npairs < MAX_PAIRS) {
                r->pairs[r->npairs][0] = c;
                r->pairs[r->npairs++][1] = u;
            } else {
                if (c >= 0) close(c);
                if (u >= 0) close(u);
            }
            continue;
        }
        for (int i = r->npairs - 1; i >= 0; i--) {
            short a = p[2 + 2 * i].revents, b = p[3 + 2 * i].revents;
            bool ok = true;
            if (a & (POLLIN | POLLHUP | POLLERR)) ok = relay_copy(r->pairs[i][0], r->pairs[i][1]);
            if (ok && (b & (POLLIN | POLLHUP | POLLERR)))
                ok = relay_copy(r->pairs[i][1], r->pairs[i][0]);
            if (!ok) relay_drop(r, i);
        }
    }
}

static void relay_say(relay *r, char cmd) {
    char ok = 0;
    assert_int_equal(write(r->ctl[1], &cmd, 1), 1);
    assert_int_equal(read(r->ack[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
}

/* ---- fixture ------------------------------------------------------------------------------ */

typedef struct fixture {
    relay r;
    char uri[160];
    char state_dir[64];
    wk_engine *e;
    virConnectPtr conn; /* the test's own, straight to libvirtd */
} fixture;

static int seq;

static void quiet(void *u, virErrorPtr err) {
    (void)u, (void)err;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    if (!f) return -1;
    virSetErrorFunc(NULL, quiet);
    if (!(f->conn = virConnectOpen(DIRECT_URI))) {
        fprintf(stderr, "%s: the system libvirtd does not answer (./ops/pivirt test starts it)\n",
                DIRECT_URI);
        return -1;
    }
    relay *r = &f->r;
    snprintf(r->path, sizeof r->path, "/tmp/pv-virt-relay-%d.sock", (int)getpid());
    r->lfd = -1;
    if (pipe(r->ctl) != 0 || pipe(r->ack) != 0 || pthread_create(&r->th, NULL, relay_main, r) != 0)
        return -1;
    relay_say(r, 'u');
    snprintf(f->uri, sizeof f->uri, "virt://" DIRECT_URI "?socket=%s", r->path);
    snprintf(f->state_dir, sizeof f->state_dir, "/tmp/pv-virt-reconnect-XXXXXX");
    if (!mkdtemp(f->state_dir)) return -1;
    wk_engine_opts opts = {.stop_grace_seconds = 2, .state_dir = f->state_dir};
    pv_status st;
    if (wk_engine_open(f->uri, &opts, &f->e, &st) != PV_OK) {
        fprintf(stderr, "open %s: %s\n", f->uri, st.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    wk_engine_close(f->e);
    if (f->r.ctl[1] > 0) {
        relay_say(&f->r, 'q');
        pthread_join(f->r.th, NULL);
    }
    if (f->conn) virConnectClose(f->conn);
    if (f->state_dir[0]) rmdir(f->state_dir);
    free(f);
    return 0;
}

/* libvirtd restarted under the engine: every connection closed, new ones answered. */
static void restart(fixture *f) {
    relay_say(&f->r, 'd');
    relay_say(&f->r, 'u');
}

static void spec_of(wk_workload_spec *s, char *id, size_t idn, char *name, size_t nn) {
    snprintf(id, idn, "rc-%d-%d", (int)getpid(), ++seq);
    snprintf(name, nn, "%s_vm", id);
    *s = (wk_workload_spec){.id = id, .name = name, .image = "hub/ns/app:1", .labels_json = "{}"};
}

/* The domain's state as libvirtd has it (-1: no such domain). */
static int vir_state(fixture *f, const char *name) {
    virDomainPtr d = virDomainLookupByName(f->conn, name);
    if (!d) return -1;
    int s = -1, reason;
    virDomainGetState(d, &s, &reason, 0);
    virDomainFree(d);
    return s;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_lost_errors(void **state) {
    fixture *f = *state;
    virError refused = {.code = VIR_ERR_NO_DOMAIN, .domain = VIR_FROM_TEST};
    virError too_large = {.code = VIR_ERR_RPC, .domain = VIR_FROM_RPC};
    virError qemu_internal = {.code = VIR_ERR_INTERNAL_ERROR, .domain = VIR_FROM_QEMU};
    assert_false(wk_virt_conn_lost(&refused));
    assert_false(wk_virt_conn_lost(&too_large));
    assert_false(wk_virt_conn_lost(&qemu_internal));
    assert_false(wk_virt_conn_lost(NULL));
    /* what libvirt itself reports: the first call after the restart (the socket closed under
     * it), and the next one (on a connection libvirt knows is closed) */
    char uri[160];
    snprintf(uri, sizeof uri, DIRECT_URI "?socket=%s", f->r.path);
    virConnectPtr c = virConnectOpen(uri);
    assert_non_null(c);
    restart(f);
    for (int i = 0; i < 2; i++) {
        virResetLastError();
        assert_int_equal(virConnectNumOfDomains(c), -1);
        virErrorPtr err = virGetLastError();
        assert_non_null(err);
        if (!wk_virt_conn_lost(err))
            fail_msg("call %d: not classified as lost: domain %d code %d: %s", i, err->domain,
                     err->code, err->message);
    }
    assert_int_equal(virConnectIsAlive(c), 0);
    virConnectClose(c);
}

static void test_calls_after_restart(void **state) {
    fixture *f = *state;
    char id[64], name[80];
    wk_workload_spec s;
    spec_of(&s, id, sizeof id, name, sizeof name);
    wk_engine_info info = {0};
    pv_status st;
    restart(f); /* before the first call of all: the create */
    if (wk_engine_create(f->e, &s, &info, &st) != PV_OK) fail_msg("create: %s", st.msg);
    wk_engine_info_clear(&info);
    restart(f);
    if (wk_engine_start(f->e, id, &st) != PV_OK) fail_msg("start: %s", st.msg);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_RUNNING);
    restart(f);
    if (wk_engine_pause(f->e, id, &st) != PV_OK) fail_msg("suspend: %s", st.msg);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_PAUSED);
    restart(f);
    if (wk_engine_resume(f->e, id, &st) != PV_OK) fail_msg("resume: %s", st.msg);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_RUNNING);
    restart(f);
    if (wk_engine_stop(f->e, id, 0, true, &st) != PV_OK) fail_msg("stop: %s", st.msg);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_SHUTOFF);
    restart(f);
    if (wk_engine_inspect(f->e, id, &info, &st) != PV_OK) fail_msg("inspect: %s", st.msg);
    assert_int_equal(info.state, WK_STATE_STOPPED);
    wk_engine_info_clear(&info);
    restart(f);
    wk_engine_info *all = NULL;
    size_t n = 0;
    if (wk_engine_list(f->e, &all, &n, &st) != PV_OK) fail_msg("list: %s", st.msg);
    assert_int_equal(n, 1); /* the engine's own domains: this one */
    assert_string_equal(all[0].id, id);
    wk_engine_info_array_free(all, n);
    restart(f);
    if (wk_engine_remove(f->e, id, true, &st) != PV_OK) fail_msg("remove: %s", st.msg);
    assert_int_equal(vir_state(f, name), -1);
}

typedef struct remove_job {
    fixture *f;
    const char *id;
    int rc;
    pv_status st;
    int64_t ms;
} remove_job;

static void *remove_thread(void *arg) {
    remove_job *j = arg;
    int64_t t0 = pv_time_mono_ms();
    j->rc = wk_engine_remove(j->f->e, j->id, true, &j->st);
    j->ms = pv_time_mono_ms() - t0;
    return NULL;
}

static void test_remove_while_down(void **state) {
    fixture *f = *state;
    char id[64], name[80];
    wk_workload_spec s;
    spec_of(&s, id, sizeof id, name, sizeof name);
    wk_engine_info info = {0};
    pv_status st;
    if (wk_engine_create(f->e, &s, &info, &st) != PV_OK) fail_msg("create: %s", st.msg);
    wk_engine_info_clear(&info);
    if (wk_engine_start(f->e, id, &st) != PV_OK) fail_msg("start: %s", st.msg);
    /* down for good: UNAVAILABLE naming libvirt's URI, within the engine's bounded wait */
    relay_say(&f->r, 'd');
    remove_job j = {.f = f, .id = id};
    remove_thread(&j);
    if (j.rc != PV_UNAVAILABLE) fail_msg("remove while down: code %d: %s", j.rc, j.st.msg);
    printf("remove while down: %.1f s: %s\n", (double)j.ms / 1000, j.st.msg);
    assert_non_null(strstr(j.st.msg, f->r.path));
    assert_in_range(j.ms, 5000, 20000);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_RUNNING); /* nothing done */
    /* down, then back 1.5 s later: the remove issued meanwhile succeeds */
    pthread_t th;
    j = (remove_job){.f = f, .id = id};
    assert_int_equal(pthread_create(&th, NULL, remove_thread, &j), 0);
    struct timespec pause = {1, 500000000L};
    nanosleep(&pause, NULL);
    relay_say(&f->r, 'u');
    pthread_join(th, NULL);
    if (j.rc != PV_OK) fail_msg("remove across the restart: code %d: %s", j.rc, j.st.msg);
    assert_in_range(j.ms, 1400, 10000);
    assert_int_equal(vir_state(f, name), -1);
}

int main(void) {
    /* as the agent's (pv_daemon): a write on a connection libvirtd closed must fail EPIPE */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_errors),
        cmocka_unit_test(test_calls_after_restart),
        cmocka_unit_test(test_remove_while_down),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
