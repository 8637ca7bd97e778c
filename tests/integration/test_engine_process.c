/*
 * The process engine (wk_engine_process.c) with real processes: images are tar archives built
 * here from small shell scripts, each test opens the engine on a fresh state directory, and the
 * teardown force-removes every workload (killing its processes) before closing the engine, so
 * no process outlives a test.
 *
 * While the engine is open, libev reaps every child of this process: the tests only fork
 * (system(), tar) while no engine is open, and never wait for a child of their own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pv_test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wk_engine.h"
#include "wk_proc.h"
#include "wk_uids.h"
#include "wk_image.h"

#define IMAGE "test/app:v1"

typedef struct fixture {
    char state_dir[256];
    wk_engine *e;
} fixture;

static char image_dir[256];

/* --- helpers --------------------------------------------------------------------------------- */

/* A fresh directory named prefix + six random characters (mkdtemp's template ends in six 'X'). */
static int make_temp_dir(char *buf, size_t cap, const char *prefix) {
    int k = snprintf(buf, cap, "%s", prefix);
    if (k < 0 || (size_t)k + 7 > cap) return -1;
    memset(buf + k, 'X', 6);
    buf[k + 6] = '\0';
    return mkdtemp(buf) ? 0 : -1;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *slurp(const char *path) {
    FILE *fp = fopen(path, "r");
    if (!fp) return strdup("");
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, fp)) > 0)
        fwrite(chunk, 1, n, mem);
    fclose(fp);
    fclose(mem);
    return buf;
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* The /proc state letter of pid ('R', 'S', 'T', ...), or 0 when it is gone. */
static char proc_state(int64_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}

static bool proc_alive(int64_t pid) {
    char s = proc_state(pid);
    return s != 0 && s != 'Z' && s != 'X';
}

/* --- images: built once, before any engine is open ------------------------------------------- */

static int group_setup(void **state) {
    (void)state;
    if (make_temp_dir(image_dir, sizeof image_dir, "/tmp/pv-proc-images-") != 0) return -1;
    char src[300];
    snprintf(src, sizeof src, "%s/src", image_dir);
    pv_test_sh("mkdir -p %s/sub %s/test/app", src, image_dir);
    char path[400];
    snprintf(path, sizeof path, "%s/hello.sh", src);
    write_text(path, "echo \"hello $GREETING\"\necho \"err line\" >&2\necho \"pwd=$(pwd)\"\n"
                     "while :; do sleep 0.1; done\n");
    snprintf(path, sizeof path, "%s/term.sh", src);
    write_text(path, "trap 'echo got TERM; exit 0' TERM\necho ready\n"
                     "while :; do sleep 0.1; done\n");
    snprintf(path, sizeof path, "%s/ignore.sh", src);
    write_text(path, "trap '' TERM\necho ready\nwhile :; do sleep 0.1; done\n");
    snprintf(path, sizeof path, "%s/exit.sh", src);
    write_text(path, "sleep 0.2\necho \"exiting with ${CODE:-0}\"\nexit ${CODE:-0}\n");
    snprintf(path, sizeof path, "%s/mem.py", src);
    write_text(path, "import sys\nb = bytearray(int(sys.argv[1]) * 1024 * 1024)\n"
                     "print('allocated', len(b))\n");
    snprintf(path, sizeof path, "%s/sub/data.txt", src);
    write_text(path, "data in sub\n");
    pv_test_sh("tar -cf %s/test/app/v1.tar -C %s .", image_dir, src);
    /* Built here, not in their test: once an engine is open its loop reaps every child, so
     * system() there would lose its own child's status now and then. */
    pv_test_sh("mkdir -p %s/test/gz %s/test/dev && tar -czf %s/test/gz/v1.tar -C %s/src . && "
               "cd %s/test/dev && /usr/bin/python3 -c \"import tarfile, io\n"
               "t = tarfile.open('v1.tar', 'w:gz')\n"
               "i = tarfile.TarInfo('hello.sh'); i.size = 2; t.addfile(i, io.BytesIO(b':\\n'))\n"
               "d = tarfile.TarInfo('kmem'); d.type = tarfile.CHRTYPE; d.devmajor = 1; "
               "d.devminor = 2; t.addfile(d)\n"
               "t.close()\"",
               image_dir, image_dir, image_dir, image_dir, image_dir);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    pv_test_sh("rm -rf %s", image_dir);
    return 0;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (make_temp_dir(f->state_dir, sizeof f->state_dir, "/tmp/pv-proc-state-") != 0) return -1;
    wk_engine_opts opts = {
        .state_dir = f->state_dir, .image_dir = image_dir, .stop_grace_seconds = 3};
    pv_status st;
    if (wk_engine_open("process://", &opts, &f->e, &st) != PV_OK) {
        fprintf(stderr, "open: %s\n", st.msg);
        return -1;
    }
    *state = f;
    return 0;
}

/* Force-removes every workload (which kills its processes), closes the engine, and only then
 * forks (rm -rf): with the engine closed the children are ours again. */
static int teardown(void **state) {
    fixture *f = *state;
    if (f->e) {
        wk_engine_info *infos = NULL;
        size_t n = 0;
        pv_status st;
        if (wk_engine_list(f->e, &infos, &n, &st) == PV_OK) {
            for (size_t i = 0; i < n; i++) {
                int64_t pid = infos[i].pid;
                wk_engine_remove(f->e, infos[i].id, true, &st);
                if (pid > 0 && proc_alive(pid)) kill(-(pid_t)pid, SIGKILL);
            }
        }
        wk_engine_info_array_free(infos, n);
        wk_engine_close(f->e);
    }
    pv_test_sh("rm -rf %s", f->state_dir);
    free(f);
    return 0;
}

/* A spec for IMAGE running /bin/sh <script>; tests change what they need. */
static wk_workload_spec spec_for(const char *id, const char *const *cmd, size_t ncmd) {
    wk_workload_spec s;
    memset(&s, 0, sizeof s);
    s.id = id;
    s.name = "app_web_abcdef";
    s.image = IMAGE;
    s.commands = cmd;
    s.ncommands = ncmd;
    s.dir = "";
    s.user = "";
    s.restart = "no";
    s.labels_json = "{\"ERU\":\"1\"}";
    return s;
}

static void create_ok(fixture *f, const wk_workload_spec *s) {
    wk_engine_info info;
    pv_status st;
    int rc = wk_engine_create(f->e, s, &info, &st);
    if (rc != PV_OK) fail_msg("create %s: %s", s->id, st.msg);
    assert_int_equal(info.state, WK_STATE_CREATED);
    wk_engine_info_clear(&info);
}

static void start_ok(fixture *f, const char *id) {
    pv_status st;
    if (wk_engine_start(f->e, id, &st) != PV_OK) fail_msg("start %s: %s", id, st.msg);
}

static wk_engine_info inspect(fixture *f, const char *id) {
    wk_engine_info info;
    pv_status st;
    if (wk_engine_inspect(f->e, id, &info, &st) != PV_OK) fail_msg("inspect %s: %s", id, st.msg);
    return info;
}

/* Polls until the workload is in state (and, when min_restarts >= 0, restarted that often). */
static wk_engine_info wait_state(fixture *f, const char *id, wk_state state, int min_restarts,
                                 int timeout_ms) {
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        wk_engine_info info = inspect(f, id);
        if (info.state == state && (min_restarts < 0 || info.restarts >= min_restarts)) return info;
        if (now_ms() > deadline)
            fail_msg("%s: state %d restarts %d, want state %d restarts >= %d", id, info.state,
                     info.restarts, state, min_restarts);
        wk_engine_info_clear(&info);
        pv_test_sleep_ms(20);
    }
}

/* Polls the workload's log until it holds needle. */
static void wait_log(fixture *f, const char *id, const char *needle, int timeout_ms) {
    wk_engine_info info = inspect(f, id);
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        char *log = slurp(info.log_path);
        bool found = strstr(log, needle) != NULL;
        if (found || now_ms() > deadline) {
            if (!found) fail_msg("%s: log has no \"%s\":\n%s", id, needle, log);
            free(log);
            break;
        }
        free(log);
        pv_test_sleep_ms(20);
    }
    wk_engine_info_clear(&info);
}

static const char *const HELLO[] = {"/bin/sh", "hello.sh"};
static const char *const TERM_SH[] = {"/bin/sh", "term.sh"};
static const char *const IGNORE_SH[] = {"/bin/sh", "ignore.sh"};
static const char *const EXIT_SH[] = {"/bin/sh", "exit.sh"};
static const char *const HELLO_SUB[] = {"/bin/sh", "../hello.sh"}; /* with dir "sub" */

/* --- tests ----------------------------------------------------------------------------------- */

static void test_create_start_inspect(void **state) {
    fixture *f = *state;
    const char *publish[] = {"80/tcp", "53/udp"};
    wk_workload_spec s = spec_for("w1", HELLO, 2);
    s.publish = publish;
    s.npublish = 2;
    wk_engine_info info;
    pv_status st;
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_OK);
    assert_string_equal(info.id, "w1");
    assert_string_equal(info.name, "app_web_abcdef");
    assert_string_equal(info.image, IMAGE);
    assert_int_equal(info.state, WK_STATE_CREATED);
    assert_int_equal(info.pid, 0);
    assert_string_equal(info.labels_json, "{\"ERU\":\"1\"}");
    /* host network: {"host": ip} and every published port at ip:port */
    json_t *net = json_loads(info.networks_json, 0, NULL);
    const char *ip = json_string_value(json_object_get(net, "host"));
    assert_non_null(ip);
    json_t *pub = json_loads(info.publish_json, 0, NULL);
    char want[64];
    snprintf(want, sizeof want, "%s:80", ip);
    assert_string_equal(json_string_value(json_array_get(json_object_get(pub, "80/tcp"), 0)), want);
    snprintf(want, sizeof want, "%s:53", ip);
    assert_string_equal(json_string_value(json_array_get(json_object_get(pub, "53/udp"), 0)), want);
    json_decref(net);
    json_decref(pub);
    char root[400];
    snprintf(root, sizeof root, "%s/w1/root/hello.sh", f->state_dir);
    assert_int_equal(access(root, R_OK), 0);
    wk_engine_info_clear(&info);

    start_ok(f, "w1");
    info = inspect(f, "w1");
    assert_int_equal(info.state, WK_STATE_RUNNING);
    assert_true(info.pid > 0);
    assert_true(proc_alive(info.pid));
    char pid[24];
    snprintf(pid, sizeof pid, "%d", (int)info.pid);
    assert_string_equal(info.engine_id, pid);
    assert_true(info.started_ms > 0);
    /* its own process group and session */
    assert_int_equal(getpgid((pid_t)info.pid), (pid_t)info.pid);
    assert_int_equal(getsid((pid_t)info.pid), (pid_t)info.pid);
    wk_engine_info_clear(&info);

    assert_int_equal(wk_engine_start(f->e, "w1", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "w1"));
    assert_int_equal(wk_engine_inspect(f->e, "nope", &info, &st), PV_NOT_FOUND);
    assert_non_null(strstr(st.msg, "nope"));

    wk_engine_info *all = NULL;
    size_t n = 0;
    assert_int_equal(wk_engine_list(f->e, &all, &n, &st), PV_OK);
    assert_int_equal(n, 1);
    assert_string_equal(all[0].id, "w1");
    wk_engine_info_array_free(all, n);
    assert_string_equal(wk_engine_type(f->e), "process");
}

static void test_log_env_dir(void **state) {
    fixture *f = *state;
    const char *cmd[] = {"/bin/sh", "../hello.sh"};
    const char *env[] = {"GREETING=world"};
    wk_workload_spec s = spec_for("logs", cmd, 2);
    s.dir = "sub";
    s.env = env;
    s.nenv = 1;
    create_ok(f, &s);
    start_ok(f, "logs");
    wait_log(f, "logs", "hello world", 5000);
    wait_log(f, "logs", "err line", 5000);
    char want[400];
    snprintf(want, sizeof want, "pwd=%s/logs/root/sub\n", f->state_dir);
    wait_log(f, "logs", want, 5000);
    wk_engine_info info = inspect(f, "logs");
    char path[400];
    snprintf(path, sizeof path, "%s/logs/log", f->state_dir);
    assert_string_equal(info.log_path, path);
    wk_engine_info_clear(&info);
}

static void test_exit_code(void **state) {
    fixture *f = *state;
    const char *env[] = {"CODE=3"};
    wk_workload_spec s = spec_for("exit3", EXIT_SH, 2);
    s.env = env;
    s.nenv = 1;
    create_ok(f, &s);
    start_ok(f, "exit3");
    wk_engine_info info = wait_state(f, "exit3", WK_STATE_STOPPED, -1, 5000);
    assert_int_equal(info.exit_code, 3);
    assert_int_equal(info.pid, 0);
    assert_int_equal(info.restarts, 0);
    assert_true(info.finished_ms >= info.started_ms + 150);
    wk_engine_info_clear(&info);
    wait_log(f, "exit3", "exiting with 3", 1000);
    /* a stopped workload starts again */
    start_ok(f, "exit3");
    info = inspect(f, "exit3");
    assert_int_equal(info.state, WK_STATE_RUNNING);
    wk_engine_info_clear(&info);
}

static void test_stop_graceful(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("graceful", TERM_SH, 2);
    create_ok(f, &s);
    start_ok(f, "graceful");
    wait_log(f, "graceful", "ready", 5000);
    wk_engine_info info = inspect(f, "graceful");
    int64_t pid = info.pid;
    wk_engine_info_clear(&info);
    pv_status st;
    int64_t t0 = now_ms();
    assert_int_equal(wk_engine_stop(f->e, "graceful", 5, false, &st), PV_OK);
    assert_true(now_ms() - t0 < 2000);
    info = inspect(f, "graceful");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.exit_code, 0);
    assert_int_equal(info.pid, 0);
    wk_engine_info_clear(&info);
    assert_false(proc_alive(pid));
    wait_log(f, "graceful", "got TERM", 1000);
    /* stopping a stopped workload changes nothing */
    assert_int_equal(wk_engine_stop(f->e, "graceful", 1, false, &st), PV_OK);
}

static void test_stop_kill_after_grace(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("stubborn", IGNORE_SH, 2);
    create_ok(f, &s);
    start_ok(f, "stubborn");
    wait_log(f, "stubborn", "ready", 5000);
    wk_engine_info info = inspect(f, "stubborn");
    int64_t pid = info.pid;
    wk_engine_info_clear(&info);
    pv_status st;
    int64_t t0 = now_ms();
    assert_int_equal(wk_engine_stop(f->e, "stubborn", 1, false, &st), PV_OK);
    int64_t took = now_ms() - t0;
    assert_true(took >= 1000);
    assert_true(took < 4000);
    info = inspect(f, "stubborn");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.exit_code, 128 + SIGKILL);
    wk_engine_info_clear(&info);
    assert_false(proc_alive(pid));
    wait_log(f, "stubborn", "SIGKILL", 1000);
}

static void test_pause_resume(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("pz", HELLO, 2);
    create_ok(f, &s);
    start_ok(f, "pz");
    wk_engine_info info = inspect(f, "pz");
    int64_t pid = info.pid;
    wk_engine_info_clear(&info);
    pv_status st;
    assert_int_equal(wk_engine_pause(f->e, "pz", &st), PV_OK);
    info = inspect(f, "pz");
    assert_int_equal(info.state, WK_STATE_PAUSED);
    wk_engine_info_clear(&info);
    /* The engine waited for the stop to take: T, or D over a vfork child stopped before its
     * exec (wk_proc.h). */
    if (!wk_proc_stopped((pid_t)pid)) fail_msg("paused, but in state %c", proc_state(pid));
    assert_int_equal(wk_engine_pause(f->e, "pz", &st), PV_FAILED_PRECONDITION);
    assert_int_equal(wk_engine_resume(f->e, "pz", &st), PV_OK);
    info = inspect(f, "pz");
    assert_int_equal(info.state, WK_STATE_RUNNING);
    assert_int_equal(info.pid, pid);
    wk_engine_info_clear(&info);
    int64_t deadline = now_ms() + 10000;
    while (proc_state(pid) == 'T' && now_ms() < deadline)
        pv_test_sleep_ms(10);
    int ps = proc_state(pid); /* once: it may change between two reads */
    if (ps != 'S' && ps != 'R' && ps != 'D') fail_msg("resumed, but in state %c", ps);
    assert_int_equal(wk_engine_resume(f->e, "pz", &st), PV_FAILED_PRECONDITION);
    /* a paused workload still stops (SIGTERM is followed by SIGCONT) */
    assert_int_equal(wk_engine_pause(f->e, "pz", &st), PV_OK);
    assert_int_equal(wk_engine_stop(f->e, "pz", 2, false, &st), PV_OK);
    info = inspect(f, "pz");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.exit_code, 128 + SIGTERM);
    wk_engine_info_clear(&info);
}

/* Creates and starts id (HELLO) with restart policy restart. */
static void run_with_restart(fixture *f, const char *id, const char *restart) {
    wk_workload_spec s = spec_for(id, HELLO, 2);
    s.restart = restart;
    create_ok(f, &s);
    start_ok(f, id);
}

static void test_restart_always(void **state) {
    fixture *f = *state;
    run_with_restart(f, "always", "always");
    wk_engine_info info = inspect(f, "always");
    int64_t pid1 = info.pid;
    wk_engine_info_clear(&info);
    kill((pid_t)pid1, SIGKILL);
    info = wait_state(f, "always", WK_STATE_RUNNING, 1, 5000);
    assert_int_equal(info.restarts, 1);
    assert_true(info.pid > 0 && info.pid != pid1);
    assert_true(proc_alive(info.pid));
    int64_t pid2 = info.pid;
    wk_engine_info_clear(&info);
    kill((pid_t)pid2, SIGKILL);
    info = wait_state(f, "always", WK_STATE_RUNNING, 2, 5000);
    assert_int_equal(info.restarts, 2);
    wk_engine_info_clear(&info);
    wait_log(f, "always", "restarting in 200 ms", 1000); /* the backoff doubled */
    /* a stop ends the policy */
    pv_status st;
    assert_int_equal(wk_engine_stop(f->e, "always", 2, false, &st), PV_OK);
    pv_test_sleep_ms(500);
    info = inspect(f, "always");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.restarts, 2);
    wk_engine_info_clear(&info);
}

static void test_restart_no(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("never", HELLO, 2);
    create_ok(f, &s);
    start_ok(f, "never");
    wk_engine_info info = inspect(f, "never");
    kill((pid_t)info.pid, SIGKILL);
    wk_engine_info_clear(&info);
    info = wait_state(f, "never", WK_STATE_STOPPED, -1, 5000);
    assert_int_equal(info.exit_code, 128 + SIGKILL);
    wk_engine_info_clear(&info);
    pv_test_sleep_ms(500);
    info = inspect(f, "never");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.restarts, 0);
    wk_engine_info_clear(&info);
}

static void test_restart_on_failure(void **state) {
    fixture *f = *state;
    const char *ok_env[] = {"CODE=0"};
    const char *bad_env[] = {"CODE=1"};
    wk_workload_spec s = spec_for("okexit", EXIT_SH, 2);
    s.restart = "on-failure";
    s.env = ok_env;
    s.nenv = 1;
    create_ok(f, &s);
    s = spec_for("badexit", EXIT_SH, 2);
    s.restart = "on-failure";
    s.env = bad_env;
    s.nenv = 1;
    create_ok(f, &s);
    start_ok(f, "okexit");
    start_ok(f, "badexit");
    wk_engine_info info = wait_state(f, "badexit", WK_STATE_RUNNING, 2, 5000);
    assert_true(info.restarts >= 2);
    wk_engine_info_clear(&info);
    info = inspect(f, "okexit");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.exit_code, 0);
    assert_int_equal(info.restarts, 0);
    wk_engine_info_clear(&info);
    pv_status st;
    assert_int_equal(wk_engine_stop(f->e, "badexit", 1, true, &st), PV_OK);
    info = inspect(f, "badexit");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    int restarts = info.restarts;
    wk_engine_info_clear(&info);
    pv_test_sleep_ms(700);
    info = inspect(f, "badexit");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.restarts, restarts);
    wk_engine_info_clear(&info);
}

static void test_volumes(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("vols", HELLO, 2);
    const char *ro[] = {"/etc:/etc/host:ro"};
    s.volumes = ro;
    s.nvolumes = 1;
    wk_engine_info info;
    pv_status st;
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "cannot make a volume read-only"));
    const char *rw[] = {"/etc:/etc/host", "/tmp:data/tmp:rw"};
    s.volumes = rw;
    s.nvolumes = 2;
    create_ok(f, &s);
    info = inspect(f, "vols");
    char path[512], target[256];
    snprintf(path, sizeof path, "%s/etc/host", info.root);
    ssize_t n = readlink(path, target, sizeof target - 1);
    assert_true(n > 0);
    target[n] = '\0';
    assert_string_equal(target, "/etc");
    snprintf(path, sizeof path, "%s/data/tmp/", info.root);
    assert_int_equal(access(path, F_OK), 0);
    wk_engine_info_clear(&info);
}

static void test_remove(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("rm1", HELLO, 2);
    create_ok(f, &s);
    start_ok(f, "rm1");
    wk_engine_info info = inspect(f, "rm1");
    int64_t pid = info.pid;
    wk_engine_info_clear(&info);
    pv_status st;
    assert_int_equal(wk_engine_remove(f->e, "rm1", false, &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "rm1"));
    assert_true(proc_alive(pid));
    assert_int_equal(wk_engine_remove(f->e, "rm1", true, &st), PV_OK);
    assert_false(proc_alive(pid));
    char dir[400];
    snprintf(dir, sizeof dir, "%s/rm1", f->state_dir);
    assert_int_equal(access(dir, F_OK), -1);
    assert_int_equal(wk_engine_inspect(f->e, "rm1", &info, &st), PV_NOT_FOUND);
    assert_int_equal(wk_engine_remove(f->e, "rm1", true, &st), PV_NOT_FOUND);
    /* a stopped one goes without force, and its id can be used again */
    create_ok(f, &s);
    assert_int_equal(wk_engine_remove(f->e, "rm1", false, &st), PV_OK);
    assert_int_equal(access(dir, F_OK), -1);
}

static void test_exec(void **state) {
    fixture *f = *state;
    const char *env[] = {"GREETING=world"};
    wk_workload_spec s = spec_for("ex", HELLO_SUB, 2);
    s.env = env;
    s.nenv = 1;
    s.dir = "sub";
    create_ok(f, &s);
    pv_status st;
    int code;
    char *out = NULL;
    size_t len = 0;
    const char *sh[] = {"sh", "-c", "echo out $GREETING; echo err >&2; cat data.txt; exit 4"};
    /* not running yet */
    assert_int_equal(wk_engine_exec(f->e, "ex", sh, 3, 5000, &code, &out, &len, &st),
                     PV_FAILED_PRECONDITION);
    start_ok(f, "ex");
    assert_int_equal(wk_engine_exec(f->e, "ex", sh, 3, 5000, &code, &out, &len, &st), PV_OK);
    assert_int_equal(code, 4);
    assert_non_null(strstr(out, "out world\n"));
    assert_non_null(strstr(out, "err\n"));
    assert_non_null(strstr(out, "data in sub\n"));
    assert_int_equal(len, strlen(out));
    free(out);
    /* output is capped at 1 MiB */
    const char *big[] = {"sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"};
    assert_int_equal(wk_engine_exec(f->e, "ex", big, 3, 10000, &code, &out, &len, &st), PV_OK);
    assert_int_equal(code, 0);
    assert_int_equal(len, 1 << 20);
    free(out);
    /* a timeout kills the whole group */
    const char *slow[] = {"sh", "-c", "echo before; sleep 30 & sleep 30"};
    int64_t t0 = now_ms();
    assert_int_equal(wk_engine_exec(f->e, "ex", slow, 3, 300, &code, &out, &len, &st),
                     PV_DEADLINE_EXCEEDED);
    assert_true(now_ms() - t0 < 3000);
    assert_int_equal(code, 128 + SIGKILL);
    assert_non_null(strstr(out, "before"));
    assert_non_null(strstr(st.msg, "300 ms"));
    free(out);
    const char *missing[] = {"./no-such-program"};
    assert_int_equal(wk_engine_exec(f->e, "ex", missing, 1, 1000, &code, &out, &len, &st),
                     PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "no-such-program"));
    assert_int_equal(wk_engine_exec(f->e, "nope", sh, 3, 1000, &code, &out, &len, &st),
                     PV_NOT_FOUND);
}

static void test_after_start_hook(void **state) {
    fixture *f = *state;
    const char *env[] = {"GREETING=hooked"};
    const char *hooks[] = {"echo $GREETING > hook_out; pwd >> hook_out", "exit 3"};
    wk_workload_spec s = spec_for("hk", HELLO_SUB, 2);
    s.env = env;
    s.nenv = 1;
    s.dir = "sub";
    s.after_start = hooks;
    s.nafter_start = 2;
    create_ok(f, &s);
    start_ok(f, "hk");
    char path[400], want[500];
    snprintf(path, sizeof path, "%s/hk/root/hook_out", f->state_dir);
    char *text = slurp(path);
    snprintf(want, sizeof want, "hooked\n%s/hk/root\n", f->state_dir);
    assert_string_equal(text, want);
    free(text);
    wait_log(f, "hk", "hook after_start[1] exited with 3", 1000);
    wk_engine_info info = inspect(f, "hk");
    assert_int_equal(info.state, WK_STATE_RUNNING);
    wk_engine_info_clear(&info);
}

static void test_before_stop_hook(void **state) {
    fixture *f = *state;
    const char *hooks[] = {"echo stopping > stopped_by_hook"};
    wk_workload_spec s = spec_for("bs", HELLO, 2);
    s.before_stop = hooks;
    s.nbefore_stop = 1;
    create_ok(f, &s);
    start_ok(f, "bs");
    char path[400];
    snprintf(path, sizeof path, "%s/bs/root/stopped_by_hook", f->state_dir);
    assert_int_equal(access(path, F_OK), -1);
    pv_status st;
    assert_int_equal(wk_engine_stop(f->e, "bs", 2, false, &st), PV_OK);
    char *text = slurp(path);
    assert_string_equal(text, "stopping\n");
    free(text);
    unlink(path);
    start_ok(f, "bs");
    assert_int_equal(wk_engine_stop(f->e, "bs", 2, true, &st), PV_OK);
    assert_int_equal(access(path, F_OK), -1);
    wk_engine_info info = inspect(f, "bs");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    wk_engine_info_clear(&info);
}

static void test_reopen_adopts(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("a-run", TERM_SH, 2);
    create_ok(f, &s);
    start_ok(f, "a-run");
    s = spec_for("b-created", HELLO, 2);
    create_ok(f, &s);
    s = spec_for("c-gone-no", HELLO, 2);
    create_ok(f, &s);
    start_ok(f, "c-gone-no");
    s = spec_for("d-gone-always", HELLO, 2);
    s.restart = "always";
    create_ok(f, &s);
    start_ok(f, "d-gone-always");
    wait_log(f, "a-run", "ready", 5000);
    wk_engine_info a = inspect(f, "a-run"), c = inspect(f, "c-gone-no"),
                   d = inspect(f, "d-gone-always");

    wk_engine_close(f->e); /* leaves them running */
    f->e = NULL;
    assert_true(proc_alive(a.pid));
    kill(-(pid_t)c.pid, SIGKILL);
    kill(-(pid_t)d.pid, SIGKILL);
    pv_test_sleep_ms(100);
    /* a create the old agent never finished: a root but no record */
    char half[400];
    snprintf(half, sizeof half, "%s/half", f->state_dir);
    assert_int_equal(mkdir(half, 0755), 0);
    snprintf(half, sizeof half, "%s/half/root", f->state_dir);
    assert_int_equal(mkdir(half, 0755), 0);
    /* one killed before its root was made: its home alone */
    snprintf(half, sizeof half, "%s/bare", f->state_dir);
    assert_int_equal(mkdir(half, 0755), 0);

    wk_engine_opts opts = {
        .state_dir = f->state_dir, .image_dir = image_dir, .stop_grace_seconds = 3};
    pv_status st;
    assert_int_equal(wk_engine_open("process://", &opts, &f->e, &st), PV_OK);
    wk_engine_info *all = NULL;
    size_t n = 0;
    assert_int_equal(wk_engine_list(f->e, &all, &n, &st), PV_OK);
    assert_int_equal(n, 4);
    assert_string_equal(all[0].id, "a-run");
    assert_int_equal(all[0].state, WK_STATE_RUNNING);
    assert_int_equal(all[0].pid, a.pid);
    assert_string_equal(all[1].id, "b-created");
    assert_int_equal(all[1].state, WK_STATE_CREATED);
    assert_string_equal(all[2].id, "c-gone-no");
    assert_int_equal(all[2].state, WK_STATE_STOPPED);
    assert_int_equal(all[2].pid, 0);
    assert_string_equal(all[3].id, "d-gone-always");
    assert_int_equal(all[3].state, WK_STATE_RUNNING);
    assert_int_equal(all[3].restarts, 1);
    assert_true(all[3].pid > 0 && all[3].pid != d.pid);
    assert_true(proc_alive(all[3].pid));
    wk_engine_info_array_free(all, n);
    assert_false(proc_alive(c.pid));
    snprintf(half, sizeof half, "%s/half", f->state_dir);
    assert_int_equal(access(half, F_OK), -1);
    snprintf(half, sizeof half, "%s/bare", f->state_dir);
    assert_int_equal(access(half, F_OK), -1);
    s = spec_for("bare", HELLO, 2); /* its id is free again */
    create_ok(f, &s);

    /* the adopted process is still under control: it stops gracefully */
    assert_int_equal(wk_engine_stop(f->e, "a-run", 3, false, &st), PV_OK);
    wk_engine_info info = inspect(f, "a-run");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    wk_engine_info_clear(&info);
    assert_false(proc_alive(a.pid));
    wait_log(f, "a-run", "got TERM", 1000);
    wk_engine_info_clear(&a);
    wk_engine_info_clear(&c);
    wk_engine_info_clear(&d);
}

/* hold_restarts (a node agent's engine): a workload with restart policy whose process is gone
 * at open is left STOPPED, marked held, not restarted; a start (the agent's, once the registry
 * said it is still the node's) lifts the hold, a stop drops it. */
static void test_reopen_holds_restarts(void **state) {
    fixture *f = *state;
    run_with_restart(f, "h-always", "always");
    run_with_restart(f, "h-failure", "on-failure");
    wk_engine_info a = inspect(f, "h-always"), b = inspect(f, "h-failure");
    wk_engine_close(f->e);
    f->e = NULL;
    kill(-(pid_t)a.pid, SIGKILL);
    kill(-(pid_t)b.pid, SIGKILL);
    pv_test_sleep_ms(100);
    wk_engine_opts opts = {.state_dir = f->state_dir,
                           .image_dir = image_dir,
                           .stop_grace_seconds = 3,
                           .hold_restarts = true};
    pv_status st;
    assert_int_equal(wk_engine_open("process://", &opts, &f->e, &st), PV_OK);
    pv_test_sleep_ms(300); /* a restart would have come by now (backoff 100 ms) */
    wk_engine_info *all = NULL;
    size_t n = 0;
    assert_int_equal(wk_engine_list(f->e, &all, &n, &st), PV_OK);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(all[i].state, WK_STATE_STOPPED);
        assert_int_equal(all[i].pid, 0);
        assert_int_equal(all[i].restarts, 0);
        assert_true(all[i].restart_held);
    }
    wk_engine_info_array_free(all, n);
    wait_log(f, "h-always", "the restart waits until the agent knows", 1000);
    start_ok(f, "h-always");
    wk_engine_info info = inspect(f, "h-always");
    assert_int_equal(info.state, WK_STATE_RUNNING);
    assert_false(info.restart_held);
    wk_engine_info_clear(&info);
    assert_int_equal(wk_engine_stop(f->e, "h-failure", 0, true, &st), PV_OK); /* not running */
    info = inspect(f, "h-failure");
    assert_false(info.restart_held);
    wk_engine_info_clear(&info);
    wk_engine_info_clear(&a);
    wk_engine_info_clear(&b);
}

typedef struct gate_arg {
    atomic_bool open;
    atomic_int asked;
} gate_arg;

static bool test_gate(void *arg, const char *id, const char *labels_json) {
    (void)id, (void)labels_json;
    gate_arg *g = arg;
    atomic_fetch_add(&g->asked, 1);
    return atomic_load(&g->open);
}

/* The restart gate (the agent's fence while the node's lease is not current) closed: a
 * restart-policy workload killed from outside (a guard's fence) is not restarted, across many
 * restart delays, but held for the agent; the gate open again, a kill is restarted as before. */
static void test_restart_gate_holds(void **state) {
    fixture *f = *state;
    gate_arg g = {false, 0};
    wk_engine_set_restart_gate(f->e, test_gate, &g);
    run_with_restart(f, "g-always", "always");
    wk_engine_info info = inspect(f, "g-always");
    kill(-(pid_t)info.pid, SIGKILL);
    wk_engine_info_clear(&info);
    wait_log(f, "g-always", "the restart waits for the agent", 5000);
    pv_test_sleep_ms(1000); /* ten first restart delays (100 ms) */
    info = inspect(f, "g-always");
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.restarts, 0);
    assert_true(info.restart_held);
    assert_int_equal(atomic_load(&g.asked), 1);
    wk_engine_info_clear(&info);
    start_ok(f, "g-always"); /* the agent's word: started again */
    info = inspect(f, "g-always");
    assert_false(info.restart_held);
    atomic_store(&g.open, true);
    kill(-(pid_t)info.pid, SIGKILL);
    wk_engine_info_clear(&info);
    info = wait_state(f, "g-always", WK_STATE_RUNNING, 1, 5000);
    assert_int_equal(info.restarts, 1);
    wk_engine_info_clear(&info);
    wk_engine_set_restart_gate(f->e, NULL, NULL);
}

static void test_rlimit_memory(void **state) {
    fixture *f = *state;
    if (strcmp(wk_engine_process_limits(), "rlimit") != 0) skip();
    const char *small[] = {"/usr/bin/python3", "mem.py", "16"};
    const char *large[] = {"/usr/bin/python3", "mem.py", "600"};
    wk_workload_spec s = spec_for("mem-ok", small, 3);
    s.memory_limit = 300 << 20;
    s.cpu_limit = 0.5;
    create_ok(f, &s);
    s = spec_for("mem-over", large, 3);
    s.memory_limit = 300 << 20;
    create_ok(f, &s);
    start_ok(f, "mem-ok");
    start_ok(f, "mem-over");
    wk_engine_info ok = wait_state(f, "mem-ok", WK_STATE_STOPPED, -1, 10000);
    wk_engine_info over = wait_state(f, "mem-over", WK_STATE_STOPPED, -1, 10000);
    assert_int_equal(ok.exit_code, 0);
    assert_int_not_equal(over.exit_code, 0);
    wk_engine_info_clear(&ok);
    wk_engine_info_clear(&over);
    wait_log(f, "mem-ok", "allocated 16777216", 1000);
    wait_log(f, "mem-over", "MemoryError", 1000);
    /* the log says which limits are in force, and that cpu_limit is not */
    wait_log(f, "mem-ok", "RLIMIT_AS", 1000);
    wait_log(f, "mem-ok", "cpu_limit is NOT enforced", 1000);
}

static void test_rlimit_cpuset(void **state) {
    fixture *f = *state;
    if (strcmp(wk_engine_process_limits(), "rlimit") != 0) skip();
    const int cpus[] = {0};
    wk_workload_spec s = spec_for("pinned", HELLO, 2);
    s.cpuset = cpus;
    s.ncpuset = 1;
    create_ok(f, &s);
    start_ok(f, "pinned");
    wk_engine_info info = inspect(f, "pinned");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)info.pid);
    wk_engine_info_clear(&info);
    char *status = slurp(path);
    assert_non_null(strstr(status, "Cpus_allowed_list:\t0\n"));
    free(status);
}

static void test_bad_input(void **state) {
    fixture *f = *state;
    wk_engine_info info;
    pv_status st;
    wk_workload_spec s = spec_for("noimg", HELLO, 2);
    s.image = "test/missing:v9";
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_NOT_FOUND);
    assert_non_null(strstr(st.msg, "test/missing:v9"));
    char dir[400];
    snprintf(dir, sizeof dir, "%s/noimg", f->state_dir);
    assert_int_equal(access(dir, F_OK), -1);

    s = spec_for("dup", HELLO, 2);
    create_ok(f, &s);
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_ALREADY_EXISTS);
    assert_non_null(strstr(st.msg, "dup"));

    const char *sysctls[] = {"net.core.somaxconn=1024"};
    s = spec_for("sys", HELLO, 2);
    s.sysctls = sysctls;
    s.nsysctls = 1;
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "sysctls: the process engine cannot set sysctls"));

    s = spec_for("badid/..", HELLO, 2);
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_INVALID_ARGUMENT);
    s = spec_for("norestart", HELLO, 2);
    s.restart = "sometimes";
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "sometimes"));
    const char *pub[] = {"http"};
    s = spec_for("badpub", HELLO, 2);
    s.publish = pub;
    s.npublish = 1;
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "publish http"));
    s = spec_for("nouser", HELLO, 2);
    s.user = "no-such-user-pv";
    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "no-such-user-pv"));

    /* a command missing from the image fails the start with its name */
    const char *missing[] = {"./not-there"};
    s = spec_for("nocmd", missing, 1);
    create_ok(f, &s);
    assert_int_equal(wk_engine_start(f->e, "nocmd", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "./not-there"));
    info = inspect(f, "nocmd");
    assert_int_equal(info.state, WK_STATE_CREATED);
    wk_engine_info_clear(&info);
}

static void test_user(void **state) {
    fixture *f = *state;
    if (geteuid() != 0) skip();
    /* one line: the engine's own "started" line may land between two lines of the command's */
    const char *cmd[] = {"/bin/sh", "-c", "echo \"$(id -u):$(id -g)\"; touch mine; sleep 30"};
    wk_workload_spec s = spec_for("asuser", cmd, 3);
    s.user = "65534:65534";
    create_ok(f, &s);
    start_ok(f, "asuser");
    wait_log(f, "asuser", "65534:65534\n", 5000);
    char path[400];
    snprintf(path, sizeof path, "%s/asuser/root/mine", f->state_dir);
    struct stat sb;
    int64_t deadline = now_ms() + 3000;
    while (stat(path, &sb) != 0 && now_ms() < deadline)
        pv_test_sleep_ms(20);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_uid, 65534);
}

/* Without a user in its spec, a workload of an engine whose default is "dynamic" runs as a
 * uid of its own: two such workloads can neither signal each other nor read each other's
 * tree, and the uid goes back to the pool when its workload goes. */
static void test_dynamic_users(void **state) {
    fixture *f = *state;
    if (geteuid() != 0) skip();
    wk_engine_close(f->e);
    char uid_dir[400];
    snprintf(uid_dir, sizeof uid_dir, "%s/uids", f->state_dir);
    wk_engine_opts opts = {.state_dir = f->state_dir,
                           .image_dir = image_dir,
                           .stop_grace_seconds = 3,
                           .default_user = "dynamic",
                           .dynamic_uids = "62000-62001",
                           .uid_dir = uid_dir};
    pv_status st;
    if (wk_engine_open("process://", &opts, &f->e, &st) != PV_OK) fail_msg("open: %s", st.msg);
    wk_workload_spec a = spec_for("dyn-a", HELLO, 2), b = spec_for("dyn-b", HELLO, 2);
    create_ok(f, &a);
    create_ok(f, &b);
    start_ok(f, "dyn-a");
    start_ok(f, "dyn-b");
    wk_engine_info ia = wait_state(f, "dyn-a", WK_STATE_RUNNING, 0, 5000);
    wk_engine_info ib = wait_state(f, "dyn-b", WK_STATE_RUNNING, 0, 5000);
    struct stat sa, sb;
    assert_int_equal(stat(ia.root, &sa), 0);
    assert_int_equal(stat(ib.root, &sb), 0);
    assert_true(sa.st_uid >= 62000 && sa.st_uid <= 62001);
    assert_true(sb.st_uid >= 62000 && sb.st_uid <= 62001);
    assert_int_not_equal(sa.st_uid, sb.st_uid);
    assert_int_equal(sa.st_mode & 0777, 0700);
    /* what runs in b: its own uid, and a's process and files out of its reach */
    char script[1200];
    snprintf(script, sizeof script,
             "id -u; kill -0 %lld 2>/dev/null && echo kill=ok || echo kill=refused; cat "
             "%s/hello.sh >/dev/null 2>&1 && echo read=ok || echo read=refused; (echo x "
             ">%s/planted) 2>/dev/null && echo write=ok || echo write=refused",
             (long long)ia.pid, ia.root, ia.root);
    const char *argv[] = {"/bin/sh", "-c", script};
    int code = -1;
    char *out = NULL;
    size_t len = 0;
    if (wk_engine_exec(f->e, "dyn-b", argv, 3, 5000, &code, &out, &len, &st) != PV_OK)
        fail_msg("exec: %s", st.msg);
    char want[200];
    snprintf(want, sizeof want, "%u\nkill=refused\nread=refused\nwrite=refused\n",
             (unsigned)sb.st_uid);
    assert_string_equal(out, want);
    free(out);
    char planted[500];
    snprintf(planted, sizeof planted, "%s/planted", ia.root);
    assert_int_not_equal(access(planted, F_OK), 0);
    /* both uids of the range are taken: a third workload waits for one */
    wk_workload_spec c = spec_for("dyn-c", HELLO, 2);
    wk_engine_info ic;
    assert_int_equal(wk_engine_create(f->e, &c, &ic, &st), PV_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(st.msg, "62000-62001"));
    assert_int_equal(wk_engine_remove(f->e, "dyn-a", true, &st), PV_OK);
    if (wk_engine_create(f->e, &c, &ic, &st) != PV_OK) fail_msg("create dyn-c: %s", st.msg);
    struct stat sc;
    assert_int_equal(stat(ic.root, &sc), 0);
    assert_int_equal(sc.st_uid, sa.st_uid); /* a's uid, given back */
    wk_engine_info_clear(&ia);
    wk_engine_info_clear(&ib);
    wk_engine_info_clear(&ic);
}

/* Claims whose owner is gone are taken over; live ones are not. */
static void test_uid_claims(void **state) {
    fixture *f = *state;
    char dir[400], live[400];
    snprintf(dir, sizeof dir, "%s/claims", f->state_dir);
    snprintf(live, sizeof live, "%s/live-owner", f->state_dir);
    assert_int_equal(mkdir(live, 0700), 0);
    uid_t min = 0, max = 0, u1 = 0, u2 = 0;
    pv_status st;
    assert_int_equal(wk_uids_parse_range("100-101", &min, &max, &st), PV_OK);
    assert_int_equal(wk_uids_parse_range("0-5", &min, &max, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(wk_uids_parse_range("9-3", &min, &max, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(wk_uids_parse_range("7", &min, &max, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "\"7\""));
    assert_int_equal(wk_uids_claim(dir, 100, 101, "a", live, &u1, &st), PV_OK);
    assert_int_equal(wk_uids_claim(dir, 100, 101, "a", "/nonexistent/owner", &u2, &st), PV_OK);
    assert_int_not_equal(u1, u2);
    /* u2's owner does not exist, but its claim is young: still held */
    assert_int_equal(wk_uids_claim(dir, 100, 101, "b", "/other", &u2, &st), PV_RESOURCE_EXHAUSTED);
    /* aged past its grace, the claim of a missing owner is stale */
    char path[500];
    snprintf(path, sizeof path, "%s/%u", dir, (unsigned)(u1 == 100 ? 101 : 100));
    struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    assert_int_equal(utimensat(AT_FDCWD, path, old, 0), 0);
    uid_t u3 = 0;
    assert_int_equal(wk_uids_claim(dir, 100, 101, "b", "/other", &u3, &st), PV_OK);
    assert_int_not_equal(u3, u1);
    assert_int_equal(wk_uids_reclaim(dir, u1, "/other", &st), PV_FAILED_PRECONDITION);
    assert_int_equal(wk_uids_reclaim(dir, u1, live, &st), PV_OK);
    wk_uids_release(dir, u1, "/other"); /* not its owner: nothing */
    snprintf(path, sizeof path, "%s/%u", dir, (unsigned)u1);
    assert_int_equal(access(path, F_OK), 0);
    wk_uids_release(dir, u1, live);
    assert_int_not_equal(access(path, F_OK), 0);
}

static void test_endpoints(void **state) {
    fixture *f = *state;
    wk_engine_opts opts = {.state_dir = f->state_dir, .image_dir = image_dir};
    wk_engine *e = NULL;
    pv_status st;
    /* tcp:// and unix:// open the docker engine whether or not its daemon answers yet; one that
     * does not is UNAVAILABLE naming its address (the agent's node is then NOT_READY) */
    const char *docker[] = {"tcp://127.0.0.1:1", "unix:///nonexistent/docker.sock"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(wk_engine_open(docker[i], &opts, &e, &st), PV_OK);
        assert_string_equal(wk_engine_type(e), "docker");
        assert_int_equal(wk_engine_ping(e, &st), PV_UNAVAILABLE);
        assert_non_null(strstr(st.msg, docker[i]));
        wk_engine_close(e);
    }
    assert_int_equal(wk_engine_open("tcp://", &opts, &e, &st), PV_INVALID_ARGUMENT);
    assert_null(e);
    /* libev's default loop is one per process: so is the process engine */
    assert_int_equal(wk_engine_open("process://", &opts, &e, &st), PV_FAILED_PRECONDITION);
    assert_null(e);
}

/* Compressed images are read by the agent itself (libarchive), which refuses the device nodes
 * they hold as it does in plain ones. A plain compressed image still deploys. */
static void test_compressed_images_without_devices(void **state) {
    fixture *f = *state;
    wk_workload_spec s = spec_for("gz1", HELLO, 2);
    s.image = "test/gz:v1";
    create_ok(f, &s);
    wk_workload_spec d = spec_for("dev1", HELLO, 2);
    d.image = "test/dev:v1";
    wk_engine_info info;
    pv_status st;
    assert_int_equal(wk_engine_create(f->e, &d, &info, &st), PV_FAILED_PRECONDITION);
    if (!strstr(st.msg, "device file")) fail_msg("unexpected refusal: %s", st.msg);
    assert_non_null(strstr(st.msg, "kmem"));
}

static void test_image_names(void **state) {
    (void)state;
    char *path = NULL;
    pv_status st;
    assert_int_equal(wk_image_path("/img", "hub.example.com/ns/app:v1", &path, &st), PV_OK);
    assert_string_equal(path, "/img/hub.example.com/ns/app/v1.tar");
    free(path);
    assert_int_equal(wk_image_path("/img", "app", &path, &st), PV_OK);
    assert_string_equal(path, "/img/app/latest.tar");
    free(path);
    assert_int_equal(wk_image_path("/img", "hub:5000/ns/app", &path, &st), PV_OK);
    assert_string_equal(path, "/img/hub:5000/ns/app/latest.tar");
    free(path);
    const char *bad[] = {
        "", "../etc/app:v1", "ns//app", "app:", "app:../x", "app@sha256:ab", "a/./b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (wk_image_path("/img", bad[i], &path, &st) != PV_INVALID_ARGUMENT)
            fail_msg("image %s: accepted as %s", bad[i], path);
        assert_null(path);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_start_inspect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compressed_images_without_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_env_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exit_code, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_graceful, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_kill_after_grace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pause_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_always, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_no, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_on_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_volumes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec, setup, teardown),
        cmocka_unit_test_setup_teardown(test_after_start_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_before_stop_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen_adopts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen_holds_restarts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_gate_holds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rlimit_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rlimit_cpuset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_user, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dynamic_users, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uid_claims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endpoints, setup, teardown),
        cmocka_unit_test(test_image_names),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
