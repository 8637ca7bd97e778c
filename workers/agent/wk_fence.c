/*
 * wk_fence: self-fencing of a node agent's HA workloads (see wk_fence.h).
 *
 * The page shared with the guard is a file, so that it outlives the agent that wrote it: a
 * restarted agent finds the deadline its predecessor's renewals set, and the guard still
 * running. Its slots (the HA workloads' main processes) change under a sequence counter (odd
 * while written), so the guard never acts on a half-written list. A pid is only killed when
 * /proc says the process with that pid started at the recorded time: pids are reused.
 * The page carries the boot id: monotonic times of another boot mean nothing here.
 */
#include "wk_fence.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pv_log.h"
#include "pv_time.h"
#include "pv_workload.h"
#include "wk_docker_api.h"

#define PAGE_MAGIC 0x70766663u /* "pvfc" */
#define SLOTS 128
#define REFRESH_TICKS 3 /* the slots are refreshed every third tick */
#define GUARD_POLL_MS 50
/* The restart gate holds a restart this close to the deadline too: the guard learns a
 * restarted workload's new pid at the next refresh (REFRESH_TICKS ticks), before the deadline. */
#define RESTART_MARGIN_MS (2 * REFRESH_TICKS * WK_FENCE_TICK_MS)
/* The Engine API's kill of one container: a daemon that does not answer this soon is taken for
 * gone (the container's process is then killed, where it is on this machine). */
#define DOCKER_KILL_MS 1000

typedef struct slot {
    char id[PV_WORKLOAD_ID_LEN + 1];
    int32_t pid;         /* 0: none on this machine (a container of a remote daemon) */
    int64_t start_ticks; /* /proc/<pid>/stat field 22 */
    int64_t epoch;
    char cid[72]; /* docker engine: the container, killed through the Engine API; else "" */
} slot;

typedef struct page {
    uint32_t magic;
    char boot_id[40];
    _Atomic int64_t renewed_ms; /* CLOCK_MONOTONIC ms the last successful renewal was sent */
    _Atomic int64_t fence_ms;
    _Atomic int32_t agent_pid, guard_pid;
    _Atomic uint32_t seq; /* odd while the slots are written */
    _Atomic int32_t nslots;
    slot slots[SLOTS];
    /* docker engine: the daemon the guard kills containers through (unix:// or tcp:// without
     * TLS: the guard carries no client certificate); "" for other engines. After the slots, so
     * that an older guard still finds the fields it polls where it knew them. */
    char docker_endpoint[256];
} page;

struct wk_fence {
    wk_engine *engine;
    page *pg;
    char node[256];
    char log_path[PATH_MAX];
    int64_t fence_ms;
    bool docker, docker_local; /* a docker engine; its daemon on this machine (unix://) */
    pthread_mutex_t mu;
    _Atomic bool fenced;   /* stopped, not renewed since (read by the restart gate unlocked) */
    _Atomic bool held_new; /* the restart gate held a restart: collect it (collect_held) */
    bool renewed;    /* this agent renewed its liveness once: the registry's word can be acted on */
    json_t *stopped; /* id -> epoch: fenced or held, waiting for the registry's word */
    pthread_t thread;
    bool started;
    _Atomic bool stop;
};

/* ---- shared helpers (agent and guard) ---- */

static void boot_id(char *out, size_t cap) {
    snprintf(out, cap, "?");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f && fgets(out, (int)cap, f)) out[strcspn(out, "\n")] = '\0';
    if (f) fclose(f);
}

/* Field 22 of /proc/<pid>/stat (start time in clock ticks), -1 when there is no such process
 * or it is a zombie (it runs nothing any more; only its parent's wait removes it). */
static int64_t start_ticks(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!p) return -1;
    long long v = -1;
    /* after ") ": state(3) ... starttime(22): 19 fields to skip */
    if (sscanf(p + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
               "%*d %lld",
               &v) != 1)
        return -1;
    return v;
}

static bool pid_alive(pid_t pid) {
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

static void log_line(const char *path, const char *what, const char *id, int64_t epoch,
                     const char *how) {
    char line[512];
    int n = snprintf(line, sizeof line, "%lld %s %s epoch %lld %s\n", (long long)pv_time_now_ms(),
                     what, id, (long long)epoch, how);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (n > 0 && write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) {
    }
    close(fd);
}

static page *map_page(const char *path, bool *fresh) {
    *fresh = false;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || ((size_t)sb.st_size != sizeof(page) && ftruncate(fd, 0) == 0 &&
                                ftruncate(fd, sizeof(page)) != 0)) {
        close(fd);
        return NULL;
    }
    if ((size_t)sb.st_size != sizeof(page)) *fresh = true;
    void *m = mmap(NULL, sizeof(page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

/* ---- the guard ---- */

/* The slots as a consistent copy; -1 while the agent writes them. */
static int read_slots(page *pg, slot *out) {
    uint32_t s1 = atomic_load(&pg->seq);
    if (s1 & 1) return -1;
    int n = atomic_load(&pg->nslots);
    if (n < 0 || n > SLOTS) return -1;
    memcpy(out, pg->slots, (size_t)n * sizeof *out);
    return atomic_load(&pg->seq) == s1 ? n : -1;
}

/* SIGKILLs the process group of s if it still runs what was recorded (a SIGKILL ends a stopped
 * process too, without letting it run first). */
static bool kill_pid(const slot *s) {
    if (s->pid <= 0 || start_ticks(s->pid) != s->start_ticks) return false; /* gone, or reused */
    return kill(-s->pid, SIGKILL) == 0 || kill(s->pid, SIGKILL) == 0;
}

/* A container is killed through its daemon, not by a signal from outside: the daemon restarts a
 * container whose process died by its restart policy, but one it killed itself it marks as
 * stopped by hand (a kill sets HasBeenManuallyStopped), which no policy restarts. *api is opened
 * on first use (the caller closes it). 1: killed; 0: it was not running (409); -1: the daemon
 * did not kill it (unreachable, slow, no endpoint: the caller falls back to the pid). */
static int kill_container(const slot *s, const char *endpoint, wk_docker_api **api) {
    pv_status st;
    if (!*endpoint || (!*api && wk_docker_api_open(endpoint, NULL, api, &st) != PV_OK)) return -1;
    char path[128];
    snprintf(path, sizeof path, "/containers/%s/kill?signal=SIGKILL", s->cid);
    wk_docker_req req = {.method = "POST", .path = path, .timeout_ms = DOCKER_KILL_MS};
    wk_docker_resp r = {0};
    bool ok = wk_docker_call(*api, &req, &r, &st) == PV_OK && r.status / 100 == 2;
    long status = r.status;
    wk_docker_resp_clear(&r);
    if (ok || status == 409) return ok ? 1 : 0;
    fprintf(stderr, "pivirt fence: container %.12s of %s not killed through %s: %s\n", s->cid,
            s->id, endpoint, status ? "the daemon refused" : st.msg);
    return -1;
}

/* Kills what the n slots recorded that still runs: a container through its daemon (docker
 * engine; its process where the daemon does not answer), else the process group; logs each
 * killed as how. endpoint: the page's docker_endpoint (a copy: the agent may write the page).
 * The process groups go first and the journal last: resumed from a freeze of the whole host,
 * the workloads run on the other cores while this one waits on a daemon or writes. */
static void kill_slots(const slot *s, int n, const char *log_path, const char *how,
                       const char *endpoint) {
    wk_docker_api *api = NULL;
    bool killed[SLOTS], by_daemon[SLOTS];
    n = n < SLOTS ? n : SLOTS;
    for (int i = 0; i < n; i++) {
        by_daemon[i] = false;
        killed[i] = !s[i].cid[0] && kill_pid(&s[i]);
    }
    for (int i = 0; i < n; i++) {
        if (!s[i].cid[0]) continue;
        int rc = kill_container(&s[i], endpoint, &api);
        by_daemon[i] = rc > 0;
        killed[i] = rc > 0 || (rc < 0 && kill_pid(&s[i]));
    }
    wk_docker_api_close(api);
    for (int i = 0; i < n; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s%s", how, by_daemon[i] ? " (docker kill)" : "");
        if (killed[i]) log_line(log_path, "fence", s[i].id, s[i].epoch, what);
    }
}

/* Each poll past the deadline kills again what still runs (a qemu killed takes a while to go),
 * but journals a process once; a container once its daemon killed it. */
static void guard_fence(page *pg, const char *log_path) {
    static slot killed[SLOTS];
    static int nkilled;
    slot s[SLOTS];
    char endpoint[sizeof pg->docker_endpoint];
    memcpy(endpoint, pg->docker_endpoint, sizeof endpoint);
    endpoint[sizeof endpoint - 1] = '\0';
    int n = read_slots(pg, s), fresh = 0;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < nkilled && !seen; j++)
            seen = killed[j].pid == s[i].pid && killed[j].start_ticks == s[i].start_ticks &&
                   strcmp(killed[j].cid, s[i].cid) == 0;
        if (seen) {
            if (s[i].pid > 0 && start_ticks(s[i].pid) == s[i].start_ticks) kill(s[i].pid, SIGKILL);
            continue;
        }
        s[fresh++] = s[i];
        if (nkilled < SLOTS) killed[nkilled++] = s[i];
    }
    kill_slots(s, fresh, log_path, "guard SIGKILL (agent silent)", endpoint);
}

/* The guard runs at a real-time priority where it may (root, CAP_SYS_NICE): when a whole host
 * resumes from a freeze (everything stopped past the deadline, then continued), it is scheduled
 * the moment it is continued, ahead of the workloads it kills, so they do not run first. It
 * sleeps nearly all the time: the priority costs the machine nothing. */
static void guard_priority(void) {
    struct sched_param sp = {.sched_priority = 1};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0)
        fprintf(stderr,
                "pivirt fence guard: no real-time priority (%s): after a freeze of the "
                "whole host its workloads may run a moment before they are killed\n",
                strerror(errno));
}

int wk_fence_guard_main(const char *page_path, const char *log_path) {
    bool fresh;
    page *pg = map_page(page_path, &fresh);
    if (!pg || fresh) return 2;
    guard_priority();
    for (;;) {
        struct timespec ts = {0, GUARD_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
        if (atomic_load(&pg->guard_pid) != (int32_t)getpid()) return 0; /* replaced */
        bool agent = pid_alive(atomic_load(&pg->agent_pid));
        int64_t renewed = atomic_load(&pg->renewed_ms);
        int64_t due = renewed + atomic_load(&pg->fence_ms) + WK_FENCE_GUARD_LAG_MS;
        if (pv_time_mono_ms() >= due) {
            guard_fence(pg, log_path);
            if (!agent) break;
        } else if (!agent && atomic_load(&pg->nslots) == 0) {
            break;
        }
    }
    atomic_store(&pg->guard_pid, 0);
    return 0;
}

static void spawn_guard(wk_fence *f, const char *page_path) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        pv_error("fence node=%s: cannot find this program to run its guard", f->node);
        return;
    }
    exe[n] = '\0';
    char *argv[] = {exe, "--fence-guard", (char *)page_path, f->log_path, NULL};
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    pid_t pid;
    extern char **environ;
    int err = posix_spawn(&pid, exe, NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (err != 0) {
        pv_error("fence node=%s: guard: %s", f->node, strerror(err));
        return;
    }
    atomic_store(&f->pg->guard_pid, (int32_t)pid);
    pv_info("fence node=%s: guard pid %d watches %s", f->node, (int)pid, page_path);
}

/* A guard of an earlier agent that still runs (its pid is a --fence-guard of this page). */
static bool guard_running(page *pg) {
    pid_t pid = atomic_load(&pg->guard_pid);
    if (!pid_alive(pid)) return false;
    char path[64], cmd[512] = "";
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    FILE *fp = fopen(path, "r");
    size_t n = fp ? fread(cmd, 1, sizeof cmd - 1, fp) : 0;
    if (fp) fclose(fp);
    for (size_t i = 0; i < n; i++)
        if (cmd[i] == '\0') cmd[i] = ' ';
    cmd[n] = '\0';
    return strstr(cmd, "--fence-guard") != NULL;
}

/* ---- the agent's side ---- */

int64_t wk_fence_epoch_of(const char *labels_json) {
    json_t *labels = json_loads(labels_json ? labels_json : "{}", 0, NULL);
    const char *v = json_string_value(json_object_get(labels, WK_EPOCH_LABEL));
    int64_t e = v ? atoll(v) : 1;
    json_decref(labels);
    return e > 0 ? e : 1;
}

/* The refusal's words for node's instance of id at epoch, the record at incarnation now. */
void wk_fence_replaced_why(const char *node, const char *id, int64_t epoch, int64_t now, char *why,
                           size_t cap) {
    snprintf(why, cap,
             "workload %s was replaced while node %s was away: the registry holds its "
             "incarnation %lld elsewhere, this node's instance is incarnation %lld (stale: it "
             "is removed, not acted on)",
             id, node, (long long)now, (long long)epoch);
}

bool wk_fence_replaced_at(pv_redis *r, const pv_keys *k, const char *node, const char *id,
                          int64_t epoch, char *why, size_t cap) {
    pv_incarnation v;
    int64_t now = 0;
    pv_status st;
    if (pv_workload_ha_check(r, k, id, node, epoch, &v, &now, &st) != PV_OK || v != PV_INC_MOVED)
        return false;
    wk_fence_replaced_why(node, id, epoch, now, why, cap);
    return true;
}

bool wk_fence_replaced(wk_engine *engine, pv_redis *r, const pv_keys *k, const char *node,
                       const char *id, char *why, size_t cap) {
    wk_engine_info info = {0};
    pv_status st;
    if (!engine || wk_engine_inspect(engine, id, &info, &st) != PV_OK) return false;
    int64_t epoch = wk_fence_epoch_of(info.labels_json);
    wk_engine_info_clear(&info);
    return wk_fence_replaced_at(r, k, node, id, epoch, why, cap);
}

int wk_fence_refuse_replaced(wk_engine *engine, pv_redis *r, const pv_keys *k, const char *node,
                             const char *id, pv_status *st) {
    char why[PV_STATUS_MSG_MAX];
    if (!id || !node || !*node || !wk_fence_replaced(engine, r, k, node, id, why, sizeof why))
        return PV_OK;
    pv_warn("node %s: %s", node, why);
    return pv_status_set(st, PV_FAILED_PRECONDITION, "%s", why);
}

void wk_fence_log(wk_fence *f, const char *what, const char *id, int64_t epoch, const char *how) {
    log_line(f->log_path, what, id, epoch, how);
}

/* The HA workloads the engine runs now (main pid known). */
static void refresh_slots(wk_fence *f);

void wk_fence_refresh(wk_fence *f) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (!f->fenced) refresh_slots(f);
    pthread_mutex_unlock(&f->mu);
}

static void refresh_slots(wk_fence *f) {
    wk_engine_info *infos = NULL;
    size_t n = 0;
    pv_status st;
    if (wk_engine_list(f->engine, &infos, &n, &st) != PV_OK) return;
    slot s[SLOTS];
    int m = 0;
    for (size_t i = 0; i < n && m < SLOTS; i++) {
        const wk_engine_info *w = &infos[i];
        if (w->state != WK_STATE_RUNNING && w->state != WK_STATE_PAUSED) continue;
        if (!pv_workload_is_ha(w->labels_json, NULL)) continue;
        memset(&s[m], 0, sizeof s[m]);
        snprintf(s[m].id, sizeof s[m].id, "%s", w->id);
        s[m].epoch = wk_fence_epoch_of(w->labels_json);
        /* a container's pid is the daemon's host's: on this machine only with a unix:// one */
        if (f->docker && w->engine_id) snprintf(s[m].cid, sizeof s[m].cid, "%s", w->engine_id);
        int64_t ticks = w->pid > 0 && (!f->docker || f->docker_local) ? start_ticks(w->pid) : -1;
        if (ticks > 0) {
            s[m].pid = (int32_t)w->pid;
            s[m].start_ticks = ticks;
        }
        /* only what the guard can kill: a container of a daemon it cannot reach (TLS) and
         * whose pid means nothing here is the agent's fence's alone */
        if (s[m].start_ticks > 0 || (s[m].cid[0] && f->pg->docker_endpoint[0])) m++;
    }
    wk_engine_info_array_free(infos, n);
    atomic_fetch_add(&f->pg->seq, 1);
    memcpy(f->pg->slots, s, (size_t)m * sizeof *s);
    atomic_store(&f->pg->nslots, m);
    atomic_fetch_add(&f->pg->seq, 1);
}

static void clear_slots(wk_fence *f) {
    atomic_fetch_add(&f->pg->seq, 1);
    atomic_store(&f->pg->nslots, 0);
    atomic_fetch_add(&f->pg->seq, 1);
}

/* Stops every HA workload that runs, or that the guard was told of (it may have killed them
 * while this agent was stopped: stopping them through the engine keeps their restart policy
 * from bringing them back). Caller holds mu. */
static void fence_locked(wk_fence *f, const char *why) {
    slot s[SLOTS];
    int ns = read_slots(f->pg, s);
    /* at once, before the engine's round trip: resumed from a freeze, they would run meanwhile */
    char endpoint[sizeof f->pg->docker_endpoint];
    memcpy(endpoint, f->pg->docker_endpoint, sizeof endpoint);
    kill_slots(s, ns, f->log_path, "SIGKILL", endpoint);
    clear_slots(f);
    f->fenced = true;
    wk_engine_info *infos = NULL;
    size_t n = 0;
    pv_status st;
    if (wk_engine_list(f->engine, &infos, &n, &st) != PV_OK) {
        pv_error("fence node=%s: cannot list the engine's workloads: %s", f->node, st.msg);
        n = 0;
    }
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        const wk_engine_info *w = &infos[i];
        bool listed = false;
        for (int j = 0; j < ns && !listed; j++)
            listed = strcmp(s[j].id, w->id) == 0;
        bool live = w->state == WK_STATE_RUNNING || w->state == WK_STATE_PAUSED;
        /* held: its restart waits (the gate, or the engine at open); the stop makes the
         * registry's word, not the policy, decide whether it runs again */
        if (!pv_workload_is_ha(w->labels_json, NULL) || !(live || listed || w->restart_held))
            continue;
        int64_t epoch = wk_fence_epoch_of(w->labels_json);
        int rc = wk_engine_stop(f->engine, w->id, 0, true, &st);
        if (rc != PV_OK && rc != PV_FAILED_PRECONDITION)
            pv_error("fence node=%s: workload %s not stopped: %s", f->node, w->id, st.msg);
        log_line(f->log_path, "fence", w->id, epoch,
                 live ? "stopped" : "stopped (guard killed it)");
        json_object_set_new(f->stopped, w->id, json_integer(epoch));
        count++;
    }
    wk_engine_info_array_free(infos, n);
    pv_warn("event=node_fenced node=%s workloads=%zu why=\"%s\": no liveness renewal for %lld ms "
            "(ha.fence_seconds); its HA workloads are stopped before the cluster recreates them",
            f->node, count, why, (long long)f->fence_ms);
}

static bool due(wk_fence *f, int64_t now) {
    return now - atomic_load(&f->pg->renewed_ms) >= f->fence_ms;
}

static void collect_held(wk_fence *f);

static void *run(void *arg) {
    wk_fence *f = arg;
    unsigned tick = 0;
    while (!atomic_load(&f->stop)) {
        pthread_mutex_lock(&f->mu);
        if (!f->fenced && due(f, pv_time_mono_ms()))
            fence_locked(f, "timer");
        else if (!f->fenced && tick % REFRESH_TICKS == 0)
            refresh_slots(f);
        if (atomic_exchange(&f->held_new, false)) collect_held(f);
        pthread_mutex_unlock(&f->mu);
        tick++;
        struct timespec ts = {0, WK_FENCE_TICK_MS * 1000000L};
        clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
    }
    return NULL;
}

int64_t wk_fence_gate(wk_fence *f) {
    int64_t now = pv_time_mono_ms();
    if (!f) return now;
    pthread_mutex_lock(&f->mu);
    if (!f->fenced && due(f, now)) fence_locked(f, "late renewal (stopped or cut off)");
    pthread_mutex_unlock(&f->mu);
    return now;
}

void wk_fence_renewed(wk_fence *f, int64_t sent_mono_ms) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (sent_mono_ms > atomic_load(&f->pg->renewed_ms))
        atomic_store(&f->pg->renewed_ms, sent_mono_ms);
    f->renewed = true;
    if (f->fenced) {
        f->fenced = false;
        pv_info("fence node=%s lifted: liveness renewed; %zu fenced workload(s) to settle with "
                "the registry",
                f->node, json_object_size(f->stopped));
        refresh_slots(f);
    }
    pthread_mutex_unlock(&f->mu);
}

bool wk_fence_current(wk_fence *f) {
    if (!f) return true;
    pthread_mutex_lock(&f->mu);
    bool ok = !f->fenced && !due(f, pv_time_mono_ms());
    pthread_mutex_unlock(&f->mu);
    return ok;
}

json_t *wk_fence_lifted(wk_fence *f) {
    if (!f) return json_object();
    pthread_mutex_lock(&f->mu);
    /* before a renewal of its own a failover may still claim what the registry calls ours: a
     * claim needs the alive key gone, which a renewal rules out until the fence stops it */
    json_t *out = f->fenced || !f->renewed ? json_object() : json_deep_copy(f->stopped);
    pthread_mutex_unlock(&f->mu);
    return out ? out : json_object();
}

void wk_fence_settled(wk_fence *f, const char *id) {
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    json_object_del(f->stopped, id);
    pthread_mutex_unlock(&f->mu);
    if (f->engine) refresh_slots(f);
}

/* The workloads whose restart the engine held (at open, wk_engine_opts.hold_restarts, or since,
 * by the restart gate): they are settled with the registry as fenced ones are, once this agent
 * has renewed (wk_health). Caller holds mu, or is alone (wk_fence_start). */
static void collect_held(wk_fence *f) {
    wk_engine_info *infos = NULL;
    size_t n = 0;
    pv_status st;
    if (wk_engine_list(f->engine, &infos, &n, &st) != PV_OK) return;
    for (size_t i = 0; i < n; i++) {
        if (!infos[i].restart_held || json_object_get(f->stopped, infos[i].id)) continue;
        int64_t epoch = wk_fence_epoch_of(infos[i].labels_json);
        json_object_set_new(f->stopped, infos[i].id, json_integer(epoch));
        log_line(f->log_path, "held", infos[i].id, epoch, "restart waits for the registry");
        pv_info("fence node=%s: the restart of %s (epoch %lld) waits until the registry says it "
                "was not replaced elsewhere",
                f->node, infos[i].id, (long long)epoch);
    }
    wk_engine_info_array_free(infos, n);
}

/* The engine asks before it restarts a workload by its policy (wk_engine_restart_gate; on its
 * thread, its lock held: nothing here locks or calls it). An HA workload is restarted only while
 * the lease is current, with RESTART_MARGIN_MS to spare: past the deadline the cluster may be
 * about to recreate it elsewhere, and a guard's kill must not be undone by the policy. */
static bool restart_gate(void *arg, const char *id, const char *labels_json) {
    (void)id;
    wk_fence *f = arg;
    if (!pv_workload_is_ha(labels_json, NULL)) return true;
    int64_t age = pv_time_mono_ms() - atomic_load(&f->pg->renewed_ms);
    if (!atomic_load(&f->fenced) && age < f->fence_ms - RESTART_MARGIN_MS) return true;
    atomic_store(&f->held_new, true);
    return false;
}

/* The page of node: adopted (same boot, a guard running) or made new. */
static int open_page(wk_fence *f, const pv_config *cfg, char *path, size_t cap, bool *adopted,
                     pv_status *st) {
    char dir[PATH_MAX - 32];
    snprintf(dir, sizeof dir, "%.3000s/node/%.255s", cfg->data_dir, f->node);
    char mk[PATH_MAX];
    snprintf(mk, sizeof mk, "%.3000s/node", cfg->data_dir);
    mkdir(cfg->data_dir, 0755);
    mkdir(mk, 0755);
    mkdir(dir, 0755);
    snprintf(path, cap, "%s/fence.page", dir);
    snprintf(f->log_path, sizeof f->log_path, "%s/fence.log", dir);
    bool fresh;
    f->pg = map_page(path, &fresh);
    if (!f->pg)
        return pv_status_set(st, PV_INTERNAL, "fence: cannot map %s: %s", path, strerror(errno));
    char boot[40];
    boot_id(boot, sizeof boot);
    *adopted = !fresh && f->pg->magic == PAGE_MAGIC && strcmp(f->pg->boot_id, boot) == 0 &&
               guard_running(f->pg);
    if (!*adopted) {
        /* a page of another boot or without a guard: what it says is of no use; the first
         * renewal is due within the fence time from now */
        memset(f->pg, 0, sizeof *f->pg);
        f->pg->magic = PAGE_MAGIC;
        snprintf(f->pg->boot_id, sizeof f->pg->boot_id, "%s", boot);
        atomic_store(&f->pg->renewed_ms, pv_time_mono_ms());
    }
    atomic_store(&f->pg->fence_ms, f->fence_ms);
    atomic_store(&f->pg->agent_pid, (int32_t)getpid());
    /* the guard speaks to the daemon without a client certificate: a tcp:// daemon with TLS
     * (elsewhere: its containers' pids mean nothing here) is fenced by the agent only */
    const char *ep = cfg->worker.endpoint ? cfg->worker.endpoint : "";
    bool tls = cfg->worker.tls_cert && *cfg->worker.tls_cert;
    f->docker_local = f->docker && strncmp(ep, "unix://", 7) == 0;
    snprintf(f->pg->docker_endpoint, sizeof f->pg->docker_endpoint, "%s",
             f->docker && (f->docker_local || !tls) ? ep : "");
    return PV_OK;
}

int wk_fence_start(const pv_config *cfg, wk_engine *engine, wk_fence **out, pv_status *st) {
    *out = NULL;
    wk_fence *f = calloc(1, sizeof *f);
    if (!f || !(f->stopped = json_object())) {
        free(f);
        return pv_status_set(st, PV_INTERNAL, "fence: out of memory");
    }
    f->engine = engine;
    f->docker = engine && strcmp(wk_engine_type(engine), "docker") == 0;
    f->fence_ms = (int64_t)cfg->ha.fence_seconds * 1000;
    snprintf(f->node, sizeof f->node, "%s", cfg->worker.node);
    pthread_mutex_init(&f->mu, NULL);
    char path[PATH_MAX];
    bool adopted = false;
    if (open_page(f, cfg, path, sizeof path, &adopted, st) != PV_OK) {
        wk_fence_stop(f);
        return st->code;
    }
    collect_held(f);
    wk_engine_set_restart_gate(engine, restart_gate, f);
    if (adopted)
        pv_info("fence node=%s: adopted guard pid %d; last renewal %lld ms ago", f->node,
                (int)atomic_load(&f->pg->guard_pid),
                (long long)(pv_time_mono_ms() - atomic_load(&f->pg->renewed_ms)));
    else
        spawn_guard(f, path);
    if (pthread_create(&f->thread, NULL, run, f) != 0) {
        wk_fence_stop(f);
        return pv_status_set(st, PV_INTERNAL, "fence: cannot start its thread");
    }
    f->started = true;
    *out = f;
    return PV_OK;
}

bool wk_fence_guarding(wk_fence *f) {
    return f && f->pg && atomic_load(&f->pg->nslots) > 0;
}

/* A clean stop with nothing to guard takes the guard along (it would leave by itself within a
 * poll, but a stopped stack should leave nothing behind); with HA workloads it stays: they run
 * on without the agent. */
static void dismiss_guard(wk_fence *f) {
    pid_t pid = atomic_load(&f->pg->guard_pid);
    if (atomic_load(&f->pg->nslots) > 0 || !guard_running(f->pg)) return;
    atomic_store(&f->pg->guard_pid, 0);
    kill(pid, SIGKILL);
    for (int i = 0; i < 50 && waitpid(pid, NULL, WNOHANG) == 0; i++) {
        struct timespec ts = {0, 2000000L};
        nanosleep(&ts, NULL);
    }
}

void wk_fence_stop(wk_fence *f) {
    if (!f) return;
    if (f->engine && f->pg) wk_engine_set_restart_gate(f->engine, NULL, NULL);
    if (f->started) {
        atomic_store(&f->stop, true);
        pthread_join(f->thread, NULL);
    }
    if (f->started && f->pg) dismiss_guard(f);
    if (f->pg) munmap(f->pg, sizeof *f->pg);
    json_decref(f->stopped);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
