/*
 * wk_engine_process: the process engine (process:// nodes). A workload is a supervised process
 * tree started by the node agent on its own machine:
 *
 *   <state_dir>/<id>/root/         the image (a tar archive from wk_image's store), unpacked
 *   <state_dir>/<id>/record.json   the spec and the state, rewritten on every change, so that a
 *                                  restarted agent finds its workloads again (see pe_open)
 *   <state_dir>/<id>/log           stdout and stderr of every process, plus "pivirt:" lines
 *
 * The main process runs the entrypoint's commands (argv, no shell) in root/<dir> with the spec's
 * env (PATH added when the spec has none), in its own session and process group, as the spec's
 * user (root agents only). Restart policies "always" and "on-failure" restart it with a backoff
 * from 100 ms doubling to 10 s (reset once a run lasted 10 s), each restart first asking the
 * restart gate (wk_engine_set_restart_gate: the agent's fence holds HA workloads' restarts while
 * the node's lease is not current, so a fenced node never brings one back by itself). Hooks and
 * exec run inside the workload too (same root, env, user and limits) in process groups of their
 * own; whatever a hook or an exec leaves behind in its group is killed when it ends, as is whatever
 * the main process leaves in its group when it exits: a workload never outlives its main process.
 *
 * Limits: cgroup v2 when the machine has a writable cgroup2 mount with the cpu, memory and
 * cpuset controllers (each workload gets <mount>/pivirt/<id> with cpu.max, memory.max and
 * cpuset.cpus), else rlimits: RLIMIT_AS from memory_limit, sched_setaffinity from cpuset, and
 * cpu_limit is not enforced (said at open in the agent's log and at each start in the
 * workload's log). wk_engine_process_limits tells which one this machine gets.
 *
 * Threads: libev's child watchers work only in its default loop, so the engine runs
 * ev_default_loop in a thread of its own and every libev call happens on that thread; the
 * callers' threads hand it work through one ev_async (pe_call_on_loop) and wait on a condition
 * variable. Every fork happens on the loop thread, and the child watcher is started before the
 * loop runs again, so no exit is ever missed. One mutex guards the workloads; an operation that
 * changes a workload marks it busy so start, stop and remove of one workload never interleave.
 * Because libev reaps every child of the process (waitpid(-1)) while the engine is open, one
 * process engine at most is open per process, and nothing else in the process may wait for
 * children of its own in that time.
 */
#include "wk_engine.h"
#include "wk_proc.h"
#include "wk_uids.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "pv_mem.h"
#include "pv_time.h"
#include "pv_log.h"
#include "pv_json.h"
#include "pv_strv.h"
#include "wk_engine_impl.h"
#include "wk_log_index.h"
#include "wk_image.h"
#include "wk_files.h"
#include "wk_untar.h"

#define PE_BACKOFF_MIN_MS 100
#define PE_BACKOFF_MAX_MS 10000
#define PE_BACKOFF_RESET_MS 10000 /* a run this long resets the backoff */
#define PE_DEFAULT_GRACE_S 10
/* a range systemd leaves unused (not its DynamicUser range, which services of the host may
 * hold), and a claim directory every agent of the host shares */
#define PE_DEFAULT_UIDS "1879048192-1879113727"
#define PE_DEFAULT_UID_DIR "/run/pivirt/uids"
#define PE_HOOK_TIMEOUT_MS 60000
#define PE_TAR_TIMEOUT_MS 600000
#define PE_KILL_WAIT_MS 10000 /* after SIGKILL: how long stop waits for the exit */
#define PE_ADOPT_POLL_S 0.2   /* adopted processes (not our children) are polled */
#define PE_OUTPUT_MAX (1 << 20)
#define PE_DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

extern char **environ;

/* --- small helpers ---------------------------------------------------------------------------- */

static char *xstrdup(const char *s) {
    return strdup(s ? s : "");
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void rm_rf(const char *path) {
    nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* Gives dirfd's tree (itself included) to uid:gid, links as links: in-process, as a chown(1)
 * child per create cost a fork and an exec. Descends by descriptor (O_NOFOLLOW), so a link
 * the image holds never leads the walk outside. Closes dirfd; -1 with errno on the first
 * failure. */
static int chown_tree(int dirfd, uid_t uid, gid_t gid, int depth) {
    if (fchown(dirfd, uid, gid) != 0 || depth > 256) {
        int err = depth > 256 ? ELOOP : errno;
        close(dirfd);
        errno = err;
        return -1;
    }
    DIR *d = fdopendir(dirfd);
    if (!d) {
        int err = errno;
        close(dirfd);
        errno = err;
        return -1;
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        struct stat sb;
        bool dir =
            de->d_type == DT_DIR ||
            (de->d_type == DT_UNKNOWN &&
             fstatat(dirfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sb.st_mode));
        if (dir) {
            int sub = openat(dirfd, de->d_name, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            rc = sub < 0 ? -1 : chown_tree(sub, uid, gid, depth + 1);
        } else {
            rc = fchownat(dirfd, de->d_name, uid, gid, AT_SYMLINK_NOFOLLOW);
        }
    }
    int err = errno;
    closedir(d);
    errno = err;
    return rc;
}

static int write_string(const char *path, const char *s) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, s, strlen(s));
    int err = errno;
    close(fd);
    errno = err;
    return n == (ssize_t)strlen(s) ? 0 : -1;
}

static int read_small(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0) return -1;
    buf[n] = '\0';
    return 0;
}

/* Start time (clock ticks since boot) and parent of a live, non-zombie process; -1 when gone.
 * The start time tells a process from a later one that got the same pid. */
static int proc_stat(pid_t pid, unsigned long long *start, pid_t *ppid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_small(path, buf, sizeof buf) != 0) return -1;
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    if (!p) return -1;
    char state;
    int pp;
    unsigned long long st = 0;
    /* fields after ')': state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
     * utime stime cutime cstime priority nice threads itrealvalue starttime */
    if (sscanf(p + 1,
               " %c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
               &state, &pp, &st) != 3)
        return -1;
    if (state == 'Z' || state == 'X') return -1;
    if (start) *start = st;
    if (ppid) *ppid = pp;
    return 0;
}

/* --- the engine and its workloads ------------------------------------------------------------ */

typedef struct pe pe;

typedef struct pe_wl {
    struct pe_wl *next;
    pe *e;
    /* the spec, owned */
    char *id, *name, *image, *dir, *user, *restart, *labels_json;
    pv_strv commands, env, publish, after_start, before_stop, volumes;
    bool privileged;
    double cpu_limit;
    int64_t memory_limit;
    int *cpuset;
    size_t ncpuset;
    /* where it lives */
    char *home, *root, *cwd, *log_path, *record_path;
    char *cgroup; /* its cgroup v2 directory; NULL with rlimits */
    bool switch_user;
    bool dynamic_uid; /* uid is claimed in e->uid_dir for this workload (given back at removal) */
    uid_t uid;
    gid_t gid;
    /* state */
    wk_state state;
    int exit_code;
    pid_t pid;
    unsigned long long pid_start;
    int64_t created_ms, started_ms, finished_ms;
    int restarts;
    int backoff_ms;
    bool want_running; /* the restart policy is in force: started and not stopped since */
    bool stopping;     /* a stop is under way: an exit now is not a failure to restart from */
    bool busy;         /* create, start, stop, pause, resume or remove under way */
    bool held;         /* its restart at open waits for the agent (wk_engine_opts.hold_restarts) */
    /* loop thread only */
    ev_child child;
    ev_timer restart_timer;
    ev_timer poll_timer;
    int64_t indexed_size; /* the log's size at its last index entry; -1: not read yet */
} pe_wl;

typedef struct pe_call {
    void (*fn)(pe *e, void *arg);
    void *arg;
    bool done;
    struct pe_call *next;
} pe_call;

struct pe {
    char *state_dir, *image_dir;
    int grace_s;
    char *default_user; /* a spec without user runs as this ("" = the agent's) */
    bool dynamic_users; /* ... or, instead, as a uid of its own out of [uid_min, uid_max] */
    char *uid_dir;
    uid_t uid_min, uid_max;
    bool hold_restarts;          /* wk_engine_opts.hold_restarts */
    wk_engine_restart_gate gate; /* asked before every restart by policy (under mu) */
    void *gate_arg;
    char host_ip[INET_ADDRSTRLEN];
    char *cg_base; /* <cgroup2 mount>/pivirt when cgroup v2 limits are in force */
    char limits_note[256];
    pthread_mutex_t mu;
    pthread_cond_t cv; /* any change: a call done, an exit, a busy flag cleared */
    pe_wl *wls;
    pe_call *calls;
    bool quit, ready;
    struct ev_loop *loop;
    ev_async wake;
    ev_timer index_timer; /* the logs' time index (log_index_tick) */
    pthread_t thread;
};

static void index_append(const char *home, int64_t ms, int64_t size);

/* libev has one default loop per process: one process engine at a time. */
static atomic_int pe_is_open;

static const char *state_name(wk_state s) {
    switch (s) {
    case WK_STATE_CREATED:
        return "created";
    case WK_STATE_RUNNING:
        return "running";
    case WK_STATE_PAUSED:
        return "paused";
    case WK_STATE_STOPPED:
        return "stopped";
    }
    return "stopped";
}

static wk_state state_parse(const char *s) {
    if (s && strcmp(s, "running") == 0) return WK_STATE_RUNNING;
    if (s && strcmp(s, "paused") == 0) return WK_STATE_PAUSED;
    if (s && strcmp(s, "created") == 0) return WK_STATE_CREATED;
    return WK_STATE_STOPPED;
}

static bool is_live(const pe_wl *w) {
    return w->state == WK_STATE_RUNNING || w->state == WK_STATE_PAUSED;
}

static pe_wl *wl_find(pe *e, const char *id) {
    for (pe_wl *w = e->wls; w; w = w->next)
        if (strcmp(w->id, id) == 0) return w;
    return NULL;
}

/* With e->mu held: the workload id names, or NULL with NOT_FOUND in st. */
static pe_wl *wl_lookup(pe *e, const char *id, pv_status *st) {
    pe_wl *w = id ? wl_find(e, id) : NULL;
    if (!w)
        pv_status_set(st, PV_NOT_FOUND, "workload %s: not found on this node", id ? id : "(null)");
    return w;
}

static void wl_unlink(pe *e, pe_wl *w) {
    for (pe_wl **pp = &e->wls; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            return;
        }
}

static void wl_free(pe_wl *w) {
    if (!w) return;
    pv_strv_free(&w->commands);
    pv_strv_free(&w->env);
    pv_strv_free(&w->publish);
    pv_strv_free(&w->after_start);
    pv_strv_free(&w->before_stop);
    pv_strv_free(&w->volumes);
    PV_FREE(w->id, w->name, w->image, w->dir, w->user, w->restart, w->labels_json, w->cpuset,
            w->home, w->root, w->cwd, w->log_path, w->record_path, w->cgroup, w);
}

/* Appends one "<time> pivirt: ..." line to the workload's log. */
static void wl_log(const pe_wl *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wl_log(const pe_wl *w, const char *fmt, ...) {
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%SZ pivirt: ", &tm);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2) len = sizeof line - 2;
    line[len++] = '\n';
    int fd = open(w->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) return;
    if (write(fd, line, len) < 0) pv_warn("event=wl_log_failed id=%s err=%d", w->id, errno);
    close(fd);
}

/* --- the record: spec and state as JSON --------------------------------------------------------
 */

static json_t *strv_json(const pv_strv *s) {
    json_t *a = json_array();
    for (size_t i = 0; i < s->n; i++)
        json_array_append_new(a, json_string(s->v[i]));
    return a;
}

/* Rewrites record.json atomically (temp file, rename). Caller holds e->mu. */
static int wl_save(const pe_wl *w) {
    json_t *cpus = json_array();
    for (size_t i = 0; i < w->ncpuset; i++)
        json_array_append_new(cpus, json_integer(w->cpuset[i]));
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:b, s:f, s:I, s:o,"
        " s:b, s:i, s:i}",
        "id", w->id, "name", w->name, "image", w->image, "dir", w->dir, "user", w->user, "restart",
        w->restart, "labels", w->labels_json, "commands", strv_json(&w->commands), "env",
        strv_json(&w->env), "publish", strv_json(&w->publish), "after_start",
        strv_json(&w->after_start), "before_stop", strv_json(&w->before_stop), "volumes",
        strv_json(&w->volumes), "privileged", w->privileged, "cpu_limit", w->cpu_limit,
        "memory_limit", (json_int_t)w->memory_limit, "cpuset", cpus, "switch_user", w->switch_user,
        "uid", (int)w->uid, "gid", (int)w->gid);
    if (o) json_object_set_new(o, "dynamic_uid", json_boolean(w->dynamic_uid));
    if (!o) return -1;
    json_object_set_new(o, "state", json_string(state_name(w->state)));
    json_object_set_new(o, "exit_code", json_integer(w->exit_code));
    json_object_set_new(o, "pid", json_integer(w->pid));
    json_object_set_new(o, "pid_start", json_integer((json_int_t)w->pid_start));
    json_object_set_new(o, "created_ms", json_integer(w->created_ms));
    json_object_set_new(o, "started_ms", json_integer(w->started_ms));
    json_object_set_new(o, "finished_ms", json_integer(w->finished_ms));
    json_object_set_new(o, "restarts", json_integer(w->restarts));
    json_object_set_new(o, "want_running", json_boolean(w->want_running));
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", w->record_path);
    int rc = json_dump_file(o, tmp, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (rc != 0 || rename(tmp, w->record_path) != 0) {
        pv_warn("event=record_write_failed id=%s path=%s err=%s", w->id, w->record_path,
                strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* --- spec checks ------------------------------------------------------------------------------ */

static int valid_id(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return strcmp(id, ".") != 0 && strcmp(id, "..") != 0;
}

/* A relative path that stays inside the root: no ".." component. */
static int inside_root(const char *p) {
    const char *s = p;
    while (*s) {
        while (*s == '/')
            s++;
        size_t len = strcspn(s, "/");
        if (len == 2 && s[0] == '.' && s[1] == '.') return 0;
        s += len;
    }
    return 1;
}

/* "80", "80/tcp", "53/udp" -> "port/proto" in out. */
static int parse_publish(const char *p, char *out, size_t cap) {
    char *end;
    errno = 0;
    long port = strtol(p, &end, 10);
    if (errno || end == p || port < 1 || port > 65535) return -1;
    const char *proto = "tcp";
    if (*end == '/') {
        proto = end + 1;
        if (strcmp(proto, "tcp") != 0 && strcmp(proto, "udp") != 0 && strcmp(proto, "sctp") != 0)
            return -1;
    } else if (*end != '\0') {
        return -1;
    }
    snprintf(out, cap, "%ld/%s", port, proto);
    return 0;
}

static int check_spec(const wk_workload_spec *s, pv_status *st) {
    if (!valid_id(s->id))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "id %s: want 1-64 of [A-Za-z0-9._-]",
                             s->id ? s->id : "(null)");
    if (s->nsysctls > 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "sysctls: the process engine cannot set sysctls (%s)",
                             s->sysctls[0] ? s->sysctls[0] : "");
    if (s->ncommands == 0 || !s->commands || !s->commands[0] || !*s->commands[0])
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "commands: the entrypoint of workload %s has no command", s->id);
    const char *r = s->restart ? s->restart : "";
    if (*r && strcmp(r, "no") != 0 && strcmp(r, "always") != 0 && strcmp(r, "on-failure") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "restart %s: want \"no\", \"always\" or \"on-failure\"", r);
    if (s->dir && !inside_root(s->dir))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "dir %s: must stay inside the workload's root (no \"..\")", s->dir);
    for (size_t i = 0; i < s->npublish; i++) {
        char buf[32];
        if (!s->publish[i] || parse_publish(s->publish[i], buf, sizeof buf) != 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "publish %s: want \"port/proto\" (80/tcp, 53/udp)",
                                 s->publish[i] ? s->publish[i] : "(null)");
    }
    for (size_t i = 0; i < s->nenv; i++)
        if (!s->env[i] || !strchr(s->env[i], '=') || s->env[i][0] == '=')
            return pv_status_set(st, PV_INVALID_ARGUMENT, "env %s: want KEY=VALUE",
                                 s->env[i] ? s->env[i] : "(null)");
    for (size_t i = 0; i < s->nvolumes; i++) {
        const char *v = s->volumes[i] ? s->volumes[i] : "";
        const char *c = strchr(v, ':');
        if (v[0] != '/' || !c || c[1] == '\0' || !inside_root(c + 1))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "volumes %s: want \"/host/path:path[:rw]\" inside the root", v);
        /* a volume is a link into the host's tree: nothing could keep the workload from
         * writing through it, so read-only is refused rather than promised */
        const char *mode = strchr(c + 1, ':');
        if (mode && strncmp(mode + 1, "ro", 2) == 0 && (mode[3] == '\0' || mode[3] == ':'))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "volumes %s: the process engine cannot make a volume read-only "
                                 "(its workloads share the host's mounts)",
                                 v);
    }
    if (s->cpu_limit < 0 || s->memory_limit < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "cpu_limit %g, memory_limit %" PRId64 ": must not be negative",
                             s->cpu_limit, s->memory_limit);
    for (size_t i = 0; i < s->ncpuset; i++)
        if (s->cpuset[i] < 0 || s->cpuset[i] >= CPU_SETSIZE)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "cpuset %d: not a cpu number",
                                 s->cpuset[i]);
    return PV_OK;
}

static int parse_uint(const char *s, unsigned *out) {
    if (!*s) return -1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v > UINT_MAX - 1) return -1;
    *out = (unsigned)v;
    return 0;
}

/* user: "" (the agent's), "name", "uid", "name:group", "uid:gid". Only a root agent switches. */
static int resolve_user(const char *user, bool *sw, uid_t *uid, gid_t *gid, pv_status *st) {
    *sw = false;
    *uid = geteuid();
    *gid = getegid();
    if (!user || !*user) return PV_OK;
    char u[256];
    snprintf(u, sizeof u, "%s", user);
    char *g = strchr(u, ':');
    if (g) *g++ = '\0';
    char buf[4096];
    struct passwd pw, *pwp = NULL;
    unsigned n;
    if (parse_uint(u, &n) == 0) {
        *uid = n;
        if (getpwuid_r(n, &pw, buf, sizeof buf, &pwp) == 0 && pwp)
            *gid = pwp->pw_gid;
        else
            *gid = n;
    } else {
        if (getpwnam_r(u, &pw, buf, sizeof buf, &pwp) != 0 || !pwp)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "user %s: no such user on this node",
                                 user);
        *uid = pwp->pw_uid;
        *gid = pwp->pw_gid;
    }
    if (g && *g) {
        struct group gr, *grp = NULL;
        if (parse_uint(g, &n) == 0) {
            *gid = n;
        } else if (getgrnam_r(g, &gr, buf, sizeof buf, &grp) == 0 && grp) {
            *gid = grp->gr_gid;
        } else {
            return pv_status_set(st, PV_INVALID_ARGUMENT, "user %s: no such group %s on this node",
                                 user, g);
        }
    }
    if (*uid == geteuid() && *gid == getegid()) return PV_OK;
    if (geteuid() != 0)
        return pv_status_set(st, PV_PERMISSION_DENIED,
                             "user %s: the node agent runs as uid %d, not root, and cannot run "
                             "workloads as another user",
                             user, (int)geteuid());
    *sw = true;
    return PV_OK;
}

/* --- limits: cgroup v2 or rlimits ------------------------------------------------------------- */

static int cgroup2_mount(char *out, size_t cap) {
    FILE *f = fopen("/proc/self/mounts", "re");
    if (!f) return -1;
    char line[1024];
    int found = -1;
    while (found != 0 && fgets(line, sizeof line, f)) {
        char dev[256], mnt[512], type[64];
        if (sscanf(line, "%255s %511s %63s", dev, mnt, type) == 3 && strcmp(type, "cgroup2") == 0)
            found = snprintf(out, cap, "%s", mnt) < (int)cap ? 0 : -1;
    }
    fclose(f);
    return found;
}

static bool has_words(const char *list, const char *const *words, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(words[i]);
        bool found = false;
        for (const char *p = list; (p = strstr(p, words[i])) != NULL; p += len)
            if ((p == list || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\n' || !p[len])) {
                found = true;
                break;
            }
        if (!found) return false;
    }
    return true;
}

static const char *const pe_controllers[] = {"cpu", "memory", "cpuset"};

/* Whether cgroup v2 limits can be used; *mnt gets the mount, note why not. No side effects. */
static bool cgroup2_usable(char *mnt, size_t cap, char *note, size_t ncap) {
    char path[PATH_MAX], ctl[512];
    if (cgroup2_mount(mnt, cap) != 0) {
        snprintf(note, ncap, "no cgroup2 mount");
        return false;
    }
    snprintf(path, sizeof path, "%s/cgroup.controllers", mnt);
    if (read_small(path, ctl, sizeof ctl) != 0) {
        snprintf(note, ncap, "cannot read %.200s", path);
        return false;
    }
    if (!has_words(ctl, pe_controllers, 3)) {
        ctl[strcspn(ctl, "\n")] = '\0';
        snprintf(note, ncap,
                 "cgroup2 at %.100s has controllers [%.80s], not cpu, memory and cpuset", mnt, ctl);
        return false;
    }
    if (access(mnt, W_OK) != 0) {
        snprintf(note, ncap, "cgroup2 at %.200s is not writable", mnt);
        return false;
    }
    return true;
}

const char *wk_engine_process_limits(void) {
    char mnt[512], note[256];
    return cgroup2_usable(mnt, sizeof mnt, note, sizeof note) ? "cgroup2" : "rlimit";
}

/* Picks the limits at open: <mount>/pivirt with the controllers delegated to its children. */
static void pe_setup_limits(pe *e) {
    char mnt[512], path[PATH_MAX], base[600];
    if (!cgroup2_usable(mnt, sizeof mnt, e->limits_note, sizeof e->limits_note)) return;
    snprintf(base, sizeof base, "%.512s/pivirt", mnt);
    snprintf(path, sizeof path, "%.512s/cgroup.subtree_control", mnt);
    if ((mkdir(base, 0755) != 0 && errno != EEXIST) ||
        write_string(path, "+cpu +memory +cpuset") != 0) {
        snprintf(e->limits_note, sizeof e->limits_note,
                 "cannot delegate controllers in %.150s: %.60s", mnt, strerror(errno));
        return;
    }
    snprintf(path, sizeof path, "%.600s/cgroup.subtree_control", base);
    if (write_string(path, "+cpu +memory +cpuset") != 0) {
        snprintf(e->limits_note, sizeof e->limits_note,
                 "cannot delegate controllers in %.150s: %.60s", base, strerror(errno));
        return;
    }
    e->cg_base = strdup(base);
    snprintf(e->limits_note, sizeof e->limits_note,
             "cgroup v2 under %.180s (cpu.max, memory.max, cpuset.cpus)", base);
}

/* The workload's cgroup with its limits written (cgroup v2 only). */
static int wl_setup_cgroup(pe *e, pe_wl *w, pv_status *st) {
    if (!e->cg_base) return PV_OK;
    char path[PATH_MAX], val[4096];
    if (asprintf(&w->cgroup, "%s/%s", e->cg_base, w->id) < 0) {
        w->cgroup = NULL;
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (mkdir(w->cgroup, 0755) != 0 && errno != EEXIST)
        return pv_status_set(st, PV_INTERNAL, "cgroup %s: mkdir: %s", w->cgroup, strerror(errno));
    struct {
        const char *file;
        bool set;
    } items[3] = {{"cpu.max", w->cpu_limit > 0},
                  {"memory.max", w->memory_limit > 0},
                  {"cpuset.cpus", w->ncpuset > 0}};
    for (int i = 0; i < 3; i++) {
        if (!items[i].set) continue;
        if (i == 0) {
            long quota = (long)(w->cpu_limit * 100000.0);
            snprintf(val, sizeof val, "%ld 100000", quota < 1000 ? 1000 : quota);
        } else if (i == 1) {
            snprintf(val, sizeof val, "%" PRId64, w->memory_limit);
        } else {
            size_t off = 0;
            val[0] = '\0';
            for (size_t k = 0; k < w->ncpuset && off < sizeof val - 16; k++)
                off += (size_t)snprintf(val + off, sizeof val - off, "%s%d", k ? "," : "",
                                        w->cpuset[k]);
        }
        snprintf(path, sizeof path, "%s/%s", w->cgroup, items[i].file);
        if (write_string(path, val) != 0)
            return pv_status_set(st, PV_INTERNAL, "cgroup %s: %s=%s: %s", w->cgroup, items[i].file,
                                 val, strerror(errno));
    }
    return PV_OK;
}

static void wl_log_limits(pe *e, const pe_wl *w) {
    if (w->cpu_limit <= 0 && w->memory_limit <= 0 && w->ncpuset == 0) return;
    if (w->cgroup) {
        wl_log(w, "limits: cgroup v2 %s (cpu_limit %g, memory_limit %" PRId64 ", %zu bound cpus)",
               w->cgroup, w->cpu_limit, w->memory_limit, w->ncpuset);
        return;
    }
    wl_log(w,
           "limits: rlimits (%s): memory_limit %" PRId64 " as RLIMIT_AS, %zu bound cpus by "
           "affinity%s",
           e->limits_note, w->memory_limit, w->ncpuset,
           w->cpu_limit > 0 ? "; cpu_limit is NOT enforced without cgroup v2" : "");
}

/* --- the host's address ----------------------------------------------------------------------- */

/* The primary IPv4: the source address of the default route (a UDP connect sends nothing),
 * else the first non-loopback interface address, else 127.0.0.1. */
static void host_ipv4(char *out, size_t cap) {
    snprintf(out, cap, "127.0.0.1");
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(53)};
        inet_pton(AF_INET, "192.0.2.1", &dst.sin_addr);
        struct sockaddr_in src;
        socklen_t len = sizeof src;
        int ok = connect(fd, (struct sockaddr *)&dst, sizeof dst) == 0 &&
                 getsockname(fd, (struct sockaddr *)&src, &len) == 0;
        close(fd);
        if (ok && src.sin_addr.s_addr != htonl(INADDR_ANY)) {
            inet_ntop(AF_INET, &src.sin_addr, out, (socklen_t)cap);
            return;
        }
    }
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        struct sockaddr_in *a = (struct sockaddr_in *)i->ifa_addr;
        if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
        inet_ntop(AF_INET, &a->sin_addr, out, (socklen_t)cap);
        break;
    }
    freeifaddrs(ifs);
}

/* --- fork and exec ---------------------------------------------------------------------------- */

/* Everything a child needs, prepared before fork (between fork and exec only async-signal-safe
 * calls are allowed, since the agent has threads). Owned strings. */
typedef struct pe_spawn {
    pv_strv argv;
    pv_strv env; /* env.v NULL: the agent's environment */
    char *cwd;
    char *cgroup_procs; /* join this cgroup (v2) */
    int out_fd;         /* stdout and stderr; -1: /dev/null. Borrowed. */
    bool switch_user;
    uid_t uid;
    gid_t gid;
    int64_t memory_limit; /* RLIMIT_AS when > 0 */
    bool bind_cpus;
    cpu_set_t cpus;
} pe_spawn;

static void spawn_clear(pe_spawn *sp) {
    pv_strv_free(&sp->argv);
    pv_strv_free(&sp->env);
    free(sp->cwd);
    free(sp->cgroup_procs);
    memset(sp, 0, sizeof *sp);
    sp->out_fd = -1;
}

enum {
    STEP_SETSID = 1,
    STEP_STDIO,
    STEP_CGROUP,
    STEP_AFFINITY,
    STEP_RLIMIT,
    STEP_CHDIR,
    STEP_SETGROUPS,
    STEP_SETGID,
    STEP_SETUID,
    STEP_EXEC,
};

static const char *step_name(int step) {
    static const char *const names[] = {"",         "setsid",    "stdio",  "cgroup",
                                        "affinity", "setrlimit", "chdir",  "setgroups",
                                        "setgid",   "setuid",    "execute"};
    return step > 0 && step <= STEP_EXEC ? names[step] : "start";
}

static void __attribute__((noreturn)) child_fail(int errfd, int step) {
    int msg[2] = {step, errno};
    ssize_t n = write(errfd, msg, sizeof msg);
    (void)n;
    _exit(127);
}

/* Runs in the vfork child, which shares the agent's memory until exec: it only makes system
 * calls and writes nothing but its own stack. Signal handlers are reset before signals are
 * unblocked (the parent blocked them all), so no agent handler ever runs here. Credentials
 * change through raw system calls: glibc's setuid family would signal every thread of the
 * agent to change theirs too (setxid broadcast), and those threads are not the child's. */
static void __attribute__((noreturn)) child_exec(const pe_spawn *sp, int errfd) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setsid() < 0) child_fail(errfd, STEP_SETSID);
    int devnull = open("/dev/null", O_RDWR);
    int out = sp->out_fd >= 0 ? sp->out_fd : devnull;
    if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0)
        child_fail(errfd, STEP_STDIO);
    /* nothing of the agent's (Redis sockets, other workloads' pipes) leaks into the workload;
     * errfd is close-on-exec already and closes only once exec succeeded */
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    if (sp->cgroup_procs) {
        int fd = open(sp->cgroup_procs, O_WRONLY);
        if (fd < 0 || write(fd, "0", 1) != 1) child_fail(errfd, STEP_CGROUP);
        close(fd);
    }
    if (sp->bind_cpus && sched_setaffinity(0, sizeof sp->cpus, &sp->cpus) != 0)
        child_fail(errfd, STEP_AFFINITY);
    if (sp->memory_limit > 0) {
        struct rlimit rl = {(rlim_t)sp->memory_limit, (rlim_t)sp->memory_limit};
        if (setrlimit(RLIMIT_AS, &rl) != 0) child_fail(errfd, STEP_RLIMIT);
    }
    if (sp->cwd && chdir(sp->cwd) != 0) child_fail(errfd, STEP_CHDIR);
    if (sp->switch_user) {
        if (syscall(SYS_setgroups, 1, &sp->gid) != 0) child_fail(errfd, STEP_SETGROUPS);
        if (syscall(SYS_setresgid, sp->gid, sp->gid, sp->gid) != 0) child_fail(errfd, STEP_SETGID);
        if (syscall(SYS_setresuid, sp->uid, sp->uid, sp->uid) != 0) child_fail(errfd, STEP_SETUID);
    }
    execvpe(sp->argv.v[0], sp->argv.v, sp->env.v ? sp->env.v : environ);
    child_fail(errfd, STEP_EXEC);
}

/* Starts sp (vfork + exec); returns once the exec succeeded or failed. Loop thread only, so that
 * the caller can start the child watcher before libev sees the exit. */
static int pe_fork(const pe_spawn *sp, pid_t *pid, pv_status *st) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return pv_status_set(st, PV_INTERNAL, "start %s: pipe: %s", sp->argv.v[0], strerror(errno));
    /* vfork, not fork: copying the agent's page tables (libvirt, threads, heap) cost a few
     * milliseconds of CPU per start, most of a workload's creation. The parent thread sleeps
     * until the child has exec'd or failed; every signal stays blocked meanwhile so that no
     * handler of the agent runs in the child, which shares its memory. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t c = vfork();
    if (c == 0) child_exec(sp, p[1]);
    int err = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (c < 0) {
        close(p[0]);
        close(p[1]);
        return pv_status_set(st, PV_UNAVAILABLE, "start %s: vfork: %s", sp->argv.v[0],
                             strerror(err));
    }
    close(p[1]);
    int msg[2];
    ssize_t n;
    do
        n = read(p[0], msg, sizeof msg);
    while (n < 0 && errno == EINTR);
    close(p[0]);
    if (n != (ssize_t)sizeof msg) {
        *pid = c;
        return PV_OK;
    }
    /* the failed child exits 127 and libev reaps it; nobody waits for it */
    int code = PV_INTERNAL;
    if (msg[0] == STEP_EXEC || msg[0] == STEP_CHDIR) code = PV_FAILED_PRECONDITION;
    if (msg[0] >= STEP_SETGROUPS && msg[0] <= STEP_SETUID) code = PV_PERMISSION_DENIED;
    return pv_status_set(st, code, "%s %s: %s", step_name(msg[0]),
                         msg[0] == STEP_CHDIR ? sp->cwd : sp->argv.v[0], strerror(msg[1]));
}

/* The spawn of argv inside workload w: its env (PATH added if missing), user and limits.
 * Caller holds e->mu. */
static int wl_spawn_init(const pe_wl *w, pe_spawn *sp, const char *const *argv, size_t argc,
                         const char *cwd) {
    memset(sp, 0, sizeof *sp);
    sp->out_fd = -1;
    bool has_path = false;
    for (size_t i = 0; i < w->env.n; i++)
        if (strncmp(w->env.v[i], "PATH=", 5) == 0) has_path = true;
    if (pv_strv_copy(&sp->argv, argv, argc) != 0) goto oom;
    sp->env.v = calloc(w->env.n + 2, sizeof *sp->env.v);
    if (!sp->env.v) goto oom;
    for (size_t i = 0; i < w->env.n; i++) {
        if (!(sp->env.v[sp->env.n] = strdup(w->env.v[i]))) goto oom;
        sp->env.n++;
    }
    if (!has_path) {
        if (!(sp->env.v[sp->env.n] = strdup(PE_DEFAULT_PATH))) goto oom;
        sp->env.n++;
    }
    if (!(sp->cwd = strdup(cwd))) goto oom;
    if (w->cgroup) {
        if (asprintf(&sp->cgroup_procs, "%s/cgroup.procs", w->cgroup) < 0) {
            sp->cgroup_procs = NULL;
            goto oom;
        }
    } else {
        sp->memory_limit = w->memory_limit;
        if (w->ncpuset > 0) {
            sp->bind_cpus = true;
            CPU_ZERO(&sp->cpus);
            for (size_t i = 0; i < w->ncpuset; i++)
                CPU_SET(w->cpuset[i], &sp->cpus);
        }
    }
    sp->switch_user = w->switch_user;
    sp->uid = w->uid;
    sp->gid = w->gid;
    return 0;
oom:
    spawn_clear(sp);
    return -1;
}

/* --- the loop thread -------------------------------------------------------------------------- */

/* Runs fn(e, arg) on the loop thread and waits until it returned. Caller must not hold e->mu. */
static void pe_call_on_loop(pe *e, void (*fn)(pe *, void *), void *arg) {
    pe_call c = {fn, arg, false, NULL};
    pthread_mutex_lock(&e->mu);
    pe_call **pp = &e->calls;
    while (*pp)
        pp = &(*pp)->next;
    *pp = &c;
    pthread_mutex_unlock(&e->mu);
    ev_async_send(e->loop, &e->wake);
    pthread_mutex_lock(&e->mu);
    while (!c.done)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
}

static void on_wake(struct ev_loop *loop, ev_async *a, int revents) {
    (void)revents;
    pe *e = a->data;
    pthread_mutex_lock(&e->mu);
    pe_call *list = e->calls;
    e->calls = NULL;
    bool quit = e->quit;
    pthread_mutex_unlock(&e->mu);
    while (list) {
        pe_call *next = list->next; /* list lives on the caller's stack until done is set */
        list->fn(e, list->arg);
        pthread_mutex_lock(&e->mu);
        list->done = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        list = next;
    }
    if (quit) ev_break(loop, EVBREAK_ALL);
}

static void wl_stop_watchers(pe *e, pe_wl *w) {
    ev_child_stop(e->loop, &w->child);
    ev_timer_stop(e->loop, &w->restart_timer);
    ev_timer_stop(e->loop, &w->poll_timer);
}

/* --- the logs' time index (wk_log_index.h): <home>/log.idx --------------------------------- */

static void index_path(const char *home, char *out, size_t cap) {
    snprintf(out, cap, "%s/log.idx", home);
}

static void index_append(const char *home, int64_t ms, int64_t size) {
    char path[PATH_MAX];
    index_path(home, path, sizeof path);
    wk_log_index_append(path, ms, size);
}

static void log_index_tick(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop;
    (void)revents;
    pe *e = t->data;
    int64_t now = pv_time_now_ms();
    pthread_mutex_lock(&e->mu);
    for (pe_wl *w = e->wls; w; w = w->next) {
        struct stat sb;
        if (!w->log_path || stat(w->log_path, &sb) != 0) continue;
        if (w->indexed_size < 0) {
            char idx[PATH_MAX];
            index_path(w->home, idx, sizeof idx);
            w->indexed_size = wk_log_index_last_size(idx);
        }
        if ((int64_t)sb.st_size == w->indexed_size) continue;
        index_append(w->home, now, (int64_t)sb.st_size);
        w->indexed_size = (int64_t)sb.st_size;
    }
    pthread_mutex_unlock(&e->mu);
}

static void *pe_thread(void *arg) {
    pe *e = arg;
    struct ev_loop *loop = ev_default_loop(0);
    pthread_mutex_lock(&e->mu);
    e->loop = loop;
    if (loop) {
        ev_async_init(&e->wake, on_wake);
        e->wake.data = e;
        ev_async_start(loop, &e->wake);
        double every = WK_ENGINE_LOG_INDEX_MS / 1000.0;
        ev_timer_init(&e->index_timer, log_index_tick, every, every);
        e->index_timer.data = e;
        ev_timer_start(loop, &e->index_timer);
    }
    e->ready = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (!loop) return NULL;
    ev_run(loop, 0);
    pthread_mutex_lock(&e->mu);
    for (pe_wl *w = e->wls; w; w = w->next)
        wl_stop_watchers(e, w);
    pthread_mutex_unlock(&e->mu);
    ev_async_stop(loop, &e->wake);
    ev_timer_stop(loop, &e->index_timer);
    ev_loop_destroy(loop); /* gives SIGCHLD back to the process */
    return NULL;
}

/* --- supervision of the main process (loop thread, e->mu held) ------------------------------- */

static void on_main_exit(struct ev_loop *loop, ev_child *c, int revents);
static void on_restart_timer(struct ev_loop *loop, ev_timer *t, int revents);
static void on_poll_timer(struct ev_loop *loop, ev_timer *t, int revents);

static void wl_init_watchers(pe_wl *w) {
    ev_child_init(&w->child, on_main_exit, 0, 0);
    w->child.data = w;
    ev_timer_init(&w->restart_timer, on_restart_timer, 0., 0.);
    w->restart_timer.data = w;
    ev_timer_init(&w->poll_timer, on_poll_timer, PE_ADOPT_POLL_S, PE_ADOPT_POLL_S);
    w->poll_timer.data = w;
    w->indexed_size = -1;
}

static int wl_spawn_main(pe *e, pe_wl *w, pv_status *st) {
    pe_spawn sp;
    if (wl_spawn_init(w, &sp, (const char *const *)w->commands.v, w->commands.n, w->cwd) != 0)
        return pv_status_set(st, PV_INTERNAL, "start %s: out of memory", w->id);
    int log = open(w->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (log < 0) {
        spawn_clear(&sp);
        return pv_status_set(st, PV_INTERNAL, "start %s: log %s: %s", w->id, w->log_path,
                             strerror(errno));
    }
    sp.out_fd = log;
    pid_t pid = 0;
    int rc = pe_fork(&sp, &pid, st);
    close(log);
    spawn_clear(&sp);
    if (rc != PV_OK) {
        wl_log(w, "start failed: %s", st->msg);
        return pv_status_prefix(st, "start %s", w->id);
    }
    ev_child_set(&w->child, pid, 0);
    ev_child_start(e->loop, &w->child);
    w->pid = pid;
    w->pid_start = 0;
    proc_stat(pid, &w->pid_start, NULL);
    w->state = WK_STATE_RUNNING;
    w->exit_code = 0;
    w->started_ms = pv_time_now_ms();
    w->finished_ms = 0;
    wl_log(w, "started %s (pid %d, restart policy %s)", w->commands.v[0], (int)pid,
           *w->restart ? w->restart : "no");
    wl_log_limits(e, w);
    wl_save(w);
    return PV_OK;
}

static bool policy_restarts(const pe_wl *w, int exit_code) {
    if (strcmp(w->restart, "always") == 0) return true;
    return strcmp(w->restart, "on-failure") == 0 && exit_code != 0;
}

/* The main process is gone: status known (a wait status) or not (adopted, exit unseen). */
static void wl_exited(pe *e, pe_wl *w, int status, bool known) {
    pid_t pid = w->pid;
    int code = -1;
    if (known && WIFEXITED(status)) code = WEXITSTATUS(status);
    if (known && WIFSIGNALED(status)) code = 128 + WTERMSIG(status);
    ev_child_stop(e->loop, &w->child);
    ev_timer_stop(e->loop, &w->poll_timer);
    /* whatever the main process left in its group goes with it */
    if (pid > 0) kill(-pid, SIGKILL);
    if (w->cgroup) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/cgroup.kill", w->cgroup);
        write_string(path, "1");
    }
    w->pid = 0;
    w->pid_start = 0;
    w->state = WK_STATE_STOPPED;
    w->exit_code = code;
    w->finished_ms = pv_time_now_ms();
    if (known)
        wl_log(w, "main process %d exited with %d", (int)pid, code);
    else
        wl_log(w, "main process %d is gone (exit status unknown)", (int)pid);
    if (w->want_running && !w->stopping && policy_restarts(w, code)) {
        if (w->finished_ms - w->started_ms >= PE_BACKOFF_RESET_MS)
            w->backoff_ms = PE_BACKOFF_MIN_MS;
        int delay = w->backoff_ms < PE_BACKOFF_MIN_MS ? PE_BACKOFF_MIN_MS : w->backoff_ms;
        w->backoff_ms = delay * 2 > PE_BACKOFF_MAX_MS ? PE_BACKOFF_MAX_MS : delay * 2;
        ev_timer_set(&w->restart_timer, delay / 1000.0, 0.);
        ev_timer_start(e->loop, &w->restart_timer);
        wl_log(w, "restart policy %s: restarting in %d ms", w->restart, delay);
    }
    wl_save(w);
    pthread_cond_broadcast(&e->cv);
}

static void on_main_exit(struct ev_loop *loop, ev_child *c, int revents) {
    (void)loop, (void)revents;
    pe_wl *w = c->data;
    pthread_mutex_lock(&w->e->mu);
    if (w->pid == c->rpid)
        wl_exited(w->e, w, c->rstatus, true);
    else
        ev_child_stop(loop, c);
    pthread_mutex_unlock(&w->e->mu);
}

static void on_restart_timer(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop, (void)revents;
    pe_wl *w = t->data;
    pe *e = w->e;
    pthread_mutex_lock(&e->mu);
    if (w->want_running && !w->stopping && w->state == WK_STATE_STOPPED && e->gate &&
        !e->gate(e->gate_arg, w->id, w->labels_json)) {
        /* the node may have been declared lost (its lease is not current): the agent decides,
         * once the registry said whether the workload was recreated elsewhere meanwhile */
        w->held = true;
        wl_log(w, "restart policy %s: the restart waits for the agent (its lease is not current)",
               w->restart);
        pv_warn("event=restart_held id=%s: the node's liveness lease is not current", w->id);
        pthread_cond_broadcast(&e->cv);
    } else if (w->want_running && !w->stopping && w->state == WK_STATE_STOPPED) {
        pv_status st;
        if (wl_spawn_main(e, w, &st) == PV_OK) {
            w->restarts++;
            wl_save(w);
        } else {
            /* a command that cannot start now will not start on the next try either */
            w->want_running = false;
            wl_save(w);
            pv_warn("event=restart_failed id=%s msg=\"%s\"", w->id, st.msg);
        }
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
}

/* Adopted processes: the agent that started them is gone, so their exit may never come as
 * SIGCHLD; /proc tells whether they still run. */
static void on_poll_timer(struct ev_loop *loop, ev_timer *t, int revents) {
    (void)loop, (void)revents;
    pe_wl *w = t->data;
    pe *e = w->e;
    pthread_mutex_lock(&e->mu);
    unsigned long long start = 0;
    if (w->pid > 0 && (proc_stat(w->pid, &start, NULL) != 0 || start != w->pid_start)) {
        int status = 0;
        bool known = waitpid(w->pid, &status, WNOHANG) == w->pid; /* when it is our child */
        wl_exited(e, w, status, known);
    } else if (w->pid <= 0) {
        ev_timer_stop(e->loop, t);
    }
    pthread_mutex_unlock(&e->mu);
}

/* At open: running workloads whose process is alive are adopted, the others restarted when
 * their policy says so (held for the agent's word instead with hold_restarts: the node may
 * have been lost meanwhile and the workload recreated elsewhere), else marked STOPPED. */
static void adopt_all(pe *e, void *arg) {
    (void)arg;
    pthread_mutex_lock(&e->mu);
    for (pe_wl *w = e->wls; w; w = w->next) {
        if (!is_live(w)) continue;
        unsigned long long start = 0;
        pid_t ppid = 0;
        if (w->pid > 0 && proc_stat(w->pid, &start, &ppid) == 0 && start == w->pid_start) {
            if (ppid == getpid()) {
                ev_child_set(&w->child, w->pid, 0);
                ev_child_start(e->loop, &w->child);
            }
            ev_timer_start(e->loop, &w->poll_timer);
            wl_log(w, "adopted main process %d by a new agent", (int)w->pid);
            continue;
        }
        int old = (int)w->pid;
        if (old > 0) waitpid(old, NULL, WNOHANG); /* our own zombie, when this process started it */
        w->pid = 0;
        w->state = WK_STATE_STOPPED;
        w->exit_code = -1;
        w->finished_ms = pv_time_now_ms();
        wl_log(w, "main process %d is gone since the agent stopped", old);
        if (w->want_running && policy_restarts(w, -1) && e->hold_restarts) {
            w->held = true;
            wl_log(w,
                   "restart policy %s: the restart waits until the agent knows whether the "
                   "workload was replaced elsewhere meanwhile",
                   w->restart);
        } else if (w->want_running && policy_restarts(w, -1)) {
            pv_status st;
            w->backoff_ms = PE_BACKOFF_MIN_MS;
            if (wl_spawn_main(e, w, &st) == PV_OK)
                w->restarts++;
            else
                w->want_running = false;
        }
        wl_save(w);
    }
    pthread_mutex_unlock(&e->mu);
}

/* --- auxiliary processes: tar, hooks, exec ---------------------------------------------------- */

typedef struct pe_job {
    pe *e;
    pe_spawn sp;
    pid_t pid;
    int status;
    bool done;
    int rc;
    pv_status st;
    ev_child child;
} pe_job;

static void on_job_exit(struct ev_loop *loop, ev_child *c, int revents) {
    (void)revents;
    pe_job *job = c->data;
    pe *e = job->e;
    ev_child_stop(loop, c);
    pthread_mutex_lock(&e->mu);
    job->status = c->rstatus;
    job->done = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void job_spawn(pe *e, void *arg) {
    pe_job *job = arg;
    job->rc = pe_fork(&job->sp, &job->pid, &job->st);
    if (job->rc != PV_OK) return;
    ev_child_init(&job->child, on_job_exit, job->pid, 0);
    job->child.data = job;
    ev_child_start(e->loop, &job->child);
}

static bool job_done(pe *e, pe_job *job) {
    pthread_mutex_lock(&e->mu);
    bool d = job->done;
    pthread_mutex_unlock(&e->mu);
    return d;
}

/* Waits for job until deadline_ms (monotonic; <= 0: forever). Returns whether it is done. */
static bool job_wait(pe *e, pe_job *job, int64_t deadline_ms) {
    pthread_mutex_lock(&e->mu);
    while (!job->done) {
        if (deadline_ms <= 0) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        int64_t left = deadline_ms - pv_time_mono_ms();
        if (left <= 0) break;
        struct timespec ts = pv_time_mono_after(left);
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    bool d = job->done;
    pthread_mutex_unlock(&e->mu);
    return d;
}

/* Keeps at most PE_OUTPUT_MAX bytes; reads and drops the rest so the child never blocks. */
static void out_append(char **buf, size_t *len, size_t *cap, const char *data, size_t n) {
    if (*len >= PE_OUTPUT_MAX) return;
    if (n > PE_OUTPUT_MAX - *len) n = PE_OUTPUT_MAX - *len;
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 4096;
        while (nc < *len + n + 1)
            nc *= 2;
        char *nb = realloc(*buf, nc);
        if (!nb) return;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, data, n);
    *len += n;
    (*buf)[*len] = '\0';
}

/* Runs job->sp (its spawn filled by the caller; job->sp is cleared here) to the end.
 * capture_fd: the read end of the pipe the child writes to (closed here), or -1.
 * timeout_ms <= 0: no limit. On timeout the job's process group is killed and *timed_out set.
 * The exit: *exit_code (128+signal when killed). Output (capture only) is NUL-terminated. */
static int job_run(pe *e, pe_job *job, int capture_fd, int timeout_ms, int *exit_code, char **out,
                   size_t *out_len, bool *timed_out, pv_status *st) {
    *timed_out = false;
    *exit_code = -1;
    if (out) *out = NULL, *out_len = 0;
    job->e = e;
    job->done = false;
    pe_call_on_loop(e, job_spawn, job);
    if (job->sp.out_fd >= 0 && capture_fd >= 0) close(job->sp.out_fd);
    job->sp.out_fd = -1;
    spawn_clear(&job->sp);
    if (job->rc != PV_OK) {
        if (capture_fd >= 0) close(capture_fd);
        *st = job->st;
        return job->rc;
    }
    int64_t deadline = timeout_ms > 0 ? pv_time_mono_ms() + timeout_ms : 0;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (capture_fd >= 0) {
        bool eof = false;
        int64_t exited_at = 0;
        while (!eof) {
            if (deadline && pv_time_mono_ms() >= deadline && !*timed_out) {
                kill(-job->pid, SIGKILL);
                *timed_out = true;
            }
            bool d = job_done(e, job);
            if (d && !exited_at) exited_at = pv_time_mono_ms();
            /* something in the background may keep the pipe open: stop reading soon after
             * the process itself is gone */
            if (exited_at && pv_time_mono_ms() - exited_at > 100) break;
            struct pollfd pfd = {capture_fd, POLLIN, 0};
            int pr = poll(&pfd, 1, 20);
            if (pr <= 0) continue;
            char chunk[16384];
            ssize_t n = read(capture_fd, chunk, sizeof chunk);
            if (n > 0)
                out_append(&buf, &len, &cap, chunk, (size_t)n);
            else if (n == 0 || (errno != EINTR && errno != EAGAIN))
                eof = true;
        }
        close(capture_fd);
    }
    if (!job_wait(e, job, deadline)) {
        kill(-job->pid, SIGKILL);
        *timed_out = true;
        job_wait(e, job, 0);
    }
    kill(-job->pid, SIGKILL); /* what it left behind in its group */
    if (WIFEXITED(job->status))
        *exit_code = WEXITSTATUS(job->status);
    else if (WIFSIGNALED(job->status))
        *exit_code = 128 + WTERMSIG(job->status);
    if (out) {
        if (!buf) buf = calloc(1, 1);
        *out = buf;
        *out_len = len;
    } else {
        free(buf);
    }
    return PV_OK;
}

/* Hooks run one after the other with sh -c in the workload's root, output to its log. A
 * failing hook is logged and does not stop the others nor the operation. */
static void wl_run_hooks(pe *e, pe_wl *w, const char *which) {
    pthread_mutex_lock(&e->mu);
    pv_strv lines = {0};
    bool ok =
        pv_strv_copy(&lines,
                     (const char *const *)(strcmp(which, "after_start") == 0 ? w->after_start.v
                                                                             : w->before_stop.v),
                     strcmp(which, "after_start") == 0 ? w->after_start.n : w->before_stop.n) == 0;
    pthread_mutex_unlock(&e->mu);
    for (size_t i = 0; ok && i < lines.n; i++) {
        pe_job job;
        memset(&job, 0, sizeof job);
        const char *argv[] = {"/bin/sh", "-c", lines.v[i]};
        pthread_mutex_lock(&e->mu);
        int irc = wl_spawn_init(w, &job.sp, argv, 3, w->root);
        if (irc == 0) wl_log(w, "hook %s[%zu]: %s", which, i, lines.v[i]);
        pthread_mutex_unlock(&e->mu);
        if (irc != 0) break;
        int log = open(w->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
        job.sp.out_fd = log;
        int code;
        bool timed_out;
        pv_status st;
        int rc = job_run(e, &job, -1, PE_HOOK_TIMEOUT_MS, &code, NULL, NULL, &timed_out, &st);
        if (log >= 0) close(log);
        pthread_mutex_lock(&e->mu);
        if (rc != PV_OK)
            wl_log(w, "hook %s[%zu] failed: %s", which, i, st.msg);
        else if (timed_out)
            wl_log(w, "hook %s[%zu] killed after %d ms", which, i, PE_HOOK_TIMEOUT_MS);
        else if (code != 0)
            wl_log(w, "hook %s[%zu] exited with %d", which, i, code);
        pthread_mutex_unlock(&e->mu);
    }
    pv_strv_free(&lines);
}

/* --- building a workload ---------------------------------------------------------------------- */

static pe_wl *wl_new(pe *e, const wk_workload_spec *s) {
    pe_wl *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->e = e;
    wl_init_watchers(w);
    w->id = xstrdup(s->id);
    w->name = xstrdup(s->name);
    w->image = xstrdup(s->image);
    w->dir = xstrdup(s->dir);
    w->user = xstrdup(s->user);
    w->restart = xstrdup(s->restart && strcmp(s->restart, "no") != 0 ? s->restart : "");
    w->labels_json = xstrdup(s->labels_json && *s->labels_json ? s->labels_json : "{}");
    w->privileged = s->privileged;
    w->cpu_limit = s->cpu_limit;
    w->memory_limit = s->memory_limit;
    w->backoff_ms = PE_BACKOFF_MIN_MS;
    int bad =
        !w->id || !w->name || !w->image || !w->dir || !w->user || !w->restart || !w->labels_json;
    bad |= pv_strv_copy(&w->commands, s->commands, s->ncommands);
    bad |= pv_strv_copy(&w->env, s->env, s->nenv);
    bad |= pv_strv_copy(&w->after_start, s->after_start, s->nafter_start);
    bad |= pv_strv_copy(&w->before_stop, s->before_stop, s->nbefore_stop);
    bad |= pv_strv_copy(&w->volumes, s->volumes, s->nvolumes);
    bad |= pv_strv_copy(&w->publish, NULL, 0);
    if (!bad) {
        free(w->publish.v);
        w->publish.v = calloc(s->npublish + 1, sizeof *w->publish.v);
        for (size_t i = 0; w->publish.v && i < s->npublish; i++) {
            char buf[32];
            if (parse_publish(s->publish[i], buf, sizeof buf) != 0) snprintf(buf, 32, "invalid");
            if (!(w->publish.v[i] = strdup(buf))) break;
            w->publish.n++;
        }
        bad |= w->publish.n != s->npublish;
    }
    if (s->ncpuset > 0) {
        w->cpuset = malloc(s->ncpuset * sizeof *w->cpuset);
        if (w->cpuset) memcpy(w->cpuset, s->cpuset, s->ncpuset * sizeof *w->cpuset);
        w->ncpuset = w->cpuset ? s->ncpuset : 0;
        bad |= !w->cpuset;
    }
    const char *dir = w->dir ? w->dir : "";
    while (*dir == '/')
        dir++;
    if (asprintf(&w->home, "%s/%s", e->state_dir, w->id) < 0) w->home = NULL;
    if (w->home && asprintf(&w->root, "%s/root", w->home) < 0) w->root = NULL;
    if (w->root && asprintf(&w->cwd, "%s%s%s", w->root, *dir ? "/" : "", dir) < 0) w->cwd = NULL;
    if (w->home && asprintf(&w->log_path, "%s/log", w->home) < 0) w->log_path = NULL;
    if (w->home && asprintf(&w->record_path, "%s/record.json", w->home) < 0) w->record_path = NULL;
    bad |= !w->home || !w->root || !w->cwd || !w->log_path || !w->record_path;
    if (bad) {
        wl_free(w);
        return NULL;
    }
    return w;
}

/* Volumes: the process engine has no mount namespace, so "src:dst" becomes a symlink at
 * root/dst; ":ro" cannot be enforced and is logged as such. */
static int wl_link_volumes(pe_wl *w, pv_status *st) {
    for (size_t i = 0; i < w->volumes.n; i++) {
        char spec[PATH_MAX], link[PATH_MAX];
        snprintf(spec, sizeof spec, "%s", w->volumes.v[i]);
        char *dst = strchr(spec, ':');
        *dst++ = '\0';
        char *mode = strchr(dst, ':');
        if (mode) *mode++ = '\0';
        while (*dst == '/')
            dst++;
        snprintf(link, sizeof link, "%s/%s", w->root, dst);
        char *slash = strrchr(link, '/');
        *slash = '\0';
        int rc = wk_files_mkdir_p(link, 0755);
        *slash = '/';
        if (rc != 0 || symlink(spec, link) != 0)
            return pv_status_set(st, PV_INTERNAL, "volumes %s: link %s: %s", w->volumes.v[i], link,
                                 strerror(errno));
    }
    return PV_OK;
}

/* Runs a tool of the node (tar, chown) as the agent, FAILED_PRECONDITION with its output when it
 * fails. On PV_OK *output (when not NULL) is what it printed (malloc'd, the caller frees). */
static int pe_run_tool_output(pe *e, const char *const *argv, size_t argc, const char *cwd,
                              char **output, pv_status *st) {
    if (output) *output = NULL;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return pv_status_set(st, PV_INTERNAL, "%s: pipe: %s", argv[0], strerror(errno));
    pe_job job;
    memset(&job, 0, sizeof job);
    if (pv_strv_copy(&job.sp.argv, argv, argc) != 0 || !(job.sp.cwd = strdup(cwd))) {
        spawn_clear(&job.sp);
        close(p[0]);
        close(p[1]);
        return pv_status_set(st, PV_INTERNAL, "%s: out of memory", argv[0]);
    }
    job.sp.out_fd = p[1];
    int code;
    bool timed_out;
    char *out = NULL;
    size_t out_len = 0;
    if (job_run(e, &job, p[0], PE_TAR_TIMEOUT_MS, &code, &out, &out_len, &timed_out, st) != PV_OK)
        return st->code;
    int rc = PV_OK;
    if (timed_out || code != 0) {
        if (out_len > 300) out[300] = '\0';
        for (char *c = out; *c; c++)
            if (*c == '\n') *c = ' ';
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s %s failed (%s %d): %s", argv[0],
                           argv[argc - 1], timed_out ? "killed after timeout, exit" : "exit", code,
                           out);
    }
    if (rc == PV_OK && output) {
        *output = out;
        out = NULL;
    }
    free(out);
    return rc;
}

static int pe_run_tool(pe *e, const char *const *argv, size_t argc, const char *cwd,
                       pv_status *st) {
    return pe_run_tool_output(e, argv, argc, cwd, NULL, st);
}

/* Unpacks the image into root and makes the rest of the workload's files. */
static int wl_prepare(pe *e, pe_wl *w, const char *image_path, pv_status *st) {
    if (mkdir(w->home, 0755) != 0)
        return pv_status_set(st, errno == EEXIST ? PV_ALREADY_EXISTS : PV_INTERNAL,
                             "workload %s: mkdir %s: %s", w->id, w->home, strerror(errno));
    if (mkdir(w->root, 0755) != 0)
        return pv_status_set(st, PV_INTERNAL, "workload %s: mkdir %s: %s", w->id, w->root,
                             strerror(errno));
    /* in the agent, compressed or not: no child for the loop to reap */
    if (wk_untar_extract(image_path, w->root, geteuid() == 0, st) != PV_OK)
        return pv_status_prefix(st, "image %s", w->image);
    if (wk_files_mkdir_p(w->cwd, 0755) != 0)
        return pv_status_set(st, PV_INTERNAL, "dir %s: mkdir %s: %s", w->dir, w->cwd,
                             strerror(errno));
    int log = open(w->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (log < 0)
        return pv_status_set(st, PV_INTERNAL, "workload %s: log %s: %s", w->id, w->log_path,
                             strerror(errno));
    close(log);
    index_append(w->home, pv_time_now_ms(), 0); /* since a time before any output: from the start */
    if (wl_link_volumes(w, st) != PV_OK) return st->code;
    if (w->switch_user) {
        /* the tree is its user's alone (0700): another workload's user can neither read nor
         * change it */
        int fd = open(w->root, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || chown_tree(fd, w->uid, w->gid, 0) != 0 || chmod(w->root, 0700) != 0)
            return pv_status_set(st, PV_INTERNAL, "workload %s: giving %s to uid %u: %s", w->id,
                                 w->root, (unsigned)w->uid, strerror(errno));
    }
    if (wl_setup_cgroup(e, w, st) != PV_OK) return st->code;
    if (w->privileged) wl_log(w, "privileged: no effect on the process engine");
    wl_log(w, "created from image %s (%s)", w->image, image_path);
    return PV_OK;
}

/* --- info ------------------------------------------------------------------------------------- */

static int wl_info(const pe *e, const pe_wl *w, wk_engine_info *out) {
    memset(out, 0, sizeof *out);
    out->id = xstrdup(w->id);
    out->name = xstrdup(w->name);
    out->image = xstrdup(w->image);
    out->log_path = xstrdup(w->log_path);
    out->root = xstrdup(w->root);
    out->labels_json = xstrdup(w->labels_json);
    out->state = w->state;
    out->exit_code = w->exit_code;
    out->pid = w->pid;
    char pid[24] = "";
    if (w->pid > 0) snprintf(pid, sizeof pid, "%d", (int)w->pid);
    out->engine_id = xstrdup(pid);
    json_t *net = json_pack("{s:s}", "host", e->host_ip);
    out->networks_json = net ? json_dumps(net, JSON_COMPACT) : NULL;
    json_decref(net);
    json_t *pub = json_object();
    for (size_t i = 0; pub && i < w->publish.n; i++) {
        char addr[64];
        snprintf(addr, sizeof addr, "%s:%d", e->host_ip, atoi(w->publish.v[i]));
        json_object_set_new(pub, w->publish.v[i], json_pack("[s]", addr));
    }
    out->publish_json = pub ? json_dumps(pub, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(pub);
    out->started_ms = w->started_ms;
    out->finished_ms = w->finished_ms;
    out->restarts = w->restarts;
    out->restart_held = w->held;
    if (!out->id || !out->name || !out->image || !out->engine_id || !out->networks_json ||
        !out->publish_json || !out->log_path || !out->labels_json) {
        wk_engine_info_clear(out);
        return -1;
    }
    return 0;
}

/* --- loading records at open ------------------------------------------------------------------ */

static const char **json_strs(json_t *a, size_t *n) {
    *n = json_is_array(a) ? json_array_size(a) : 0;
    const char **v = calloc(*n + 1, sizeof *v);
    for (size_t i = 0; v && i < *n; i++)
        v[i] =
            json_string_value(json_array_get(a, i)) ? json_string_value(json_array_get(a, i)) : "";
    return v;
}

static pe_wl *wl_load(pe *e, const char *path) {
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr);
    if (!json_is_object(o)) {
        pv_warn("event=record_unreadable path=%s err=\"%s\"", path, jerr.text);
        json_decref(o);
        return NULL;
    }
    wk_workload_spec s;
    memset(&s, 0, sizeof s);
    s.id = pv_json_str(o, "id");
    s.name = pv_json_str(o, "name");
    s.image = pv_json_str(o, "image");
    s.dir = pv_json_str(o, "dir");
    s.user = pv_json_str(o, "user");
    s.restart = pv_json_str(o, "restart");
    s.labels_json = pv_json_str(o, "labels");
    s.privileged = json_is_true(json_object_get(o, "privileged"));
    s.cpu_limit = json_number_value(json_object_get(o, "cpu_limit"));
    s.memory_limit = json_integer_value(json_object_get(o, "memory_limit"));
    const char **cmds = json_strs(json_object_get(o, "commands"), &s.ncommands);
    const char **env = json_strs(json_object_get(o, "env"), &s.nenv);
    const char **pub = json_strs(json_object_get(o, "publish"), &s.npublish);
    const char **as = json_strs(json_object_get(o, "after_start"), &s.nafter_start);
    const char **bs = json_strs(json_object_get(o, "before_stop"), &s.nbefore_stop);
    const char **vol = json_strs(json_object_get(o, "volumes"), &s.nvolumes);
    json_t *cpus = json_object_get(o, "cpuset");
    s.ncpuset = json_is_array(cpus) ? json_array_size(cpus) : 0;
    int *cpuset = calloc(s.ncpuset + 1, sizeof *cpuset);
    for (size_t i = 0; cpuset && i < s.ncpuset; i++)
        cpuset[i] = (int)json_integer_value(json_array_get(cpus, i));
    s.commands = cmds, s.env = env, s.publish = pub, s.after_start = as, s.before_stop = bs;
    s.volumes = vol, s.cpuset = cpuset;
    pe_wl *w = NULL;
    pv_status st;
    if (!cmds || !env || !pub || !as || !bs || !vol || !cpuset) {
        pv_warn("event=record_load_failed path=%s err=\"out of memory\"", path);
    } else if (check_spec(&s, &st) != PV_OK) {
        pv_warn("event=record_invalid path=%s err=\"%s\"", path, st.msg);
    } else if ((w = wl_new(e, &s)) != NULL) {
        w->switch_user = json_is_true(json_object_get(o, "switch_user"));
        w->dynamic_uid = json_is_true(json_object_get(o, "dynamic_uid"));
        w->uid = (uid_t)json_integer_value(json_object_get(o, "uid"));
        w->gid = (gid_t)json_integer_value(json_object_get(o, "gid"));
        w->state = state_parse(pv_json_str(o, "state"));
        w->exit_code = (int)json_integer_value(json_object_get(o, "exit_code"));
        w->pid = (pid_t)json_integer_value(json_object_get(o, "pid"));
        w->pid_start = (unsigned long long)json_integer_value(json_object_get(o, "pid_start"));
        w->created_ms = json_integer_value(json_object_get(o, "created_ms"));
        w->started_ms = json_integer_value(json_object_get(o, "started_ms"));
        w->finished_ms = json_integer_value(json_object_get(o, "finished_ms"));
        w->restarts = (int)json_integer_value(json_object_get(o, "restarts"));
        w->want_running = json_is_true(json_object_get(o, "want_running"));
        if (e->cg_base && asprintf(&w->cgroup, "%s/%s", e->cg_base, w->id) < 0) w->cgroup = NULL;
    }
    PV_FREE(cmds, env, pub, as, bs, vol, cpuset);
    json_decref(o);
    return w;
}

static void pe_load_all(pe *e) {
    DIR *d = opendir(e->state_dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || !valid_id(de->d_name)) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/record.json", e->state_dir, de->d_name);
        if (access(path, F_OK) != 0) {
            /* a create the agent did not finish (the record is written last): its root, or its
             * home alone when the kill came before the root was made. Nothing of it ran, so it
             * goes, and its id is free again for the redelivered create. */
            snprintf(path, sizeof path, "%s/%s/root", e->state_dir, de->d_name);
            bool half = access(path, F_OK) == 0;
            snprintf(path, sizeof path, "%s/%s", e->state_dir, de->d_name);
            if (!half) half = rmdir(path) == 0; /* empty: only its home was made */
            if (half && strcmp(path, e->image_dir) != 0) {
                pv_warn("event=half_created_removed path=%s", path);
                rm_rf(path);
            }
            continue;
        }
        pe_wl *w = wl_load(e, path);
        if (!w) continue;
        if (strcmp(w->id, de->d_name) != 0 || wl_find(e, w->id)) {
            pv_warn("event=record_mismatch path=%s id=%s", path, w->id);
            wl_free(w);
            continue;
        }
        pv_status st;
        /* a reboot empties /run: the workload's uid is claimed again before anything else
         * can take it */
        if (w->dynamic_uid && wk_uids_reclaim(e->uid_dir, w->uid, w->home, &st) != PV_OK)
            pv_warn("event=uid_conflict id=%s uid=%u err=\"%s\"", w->id, (unsigned)w->uid, st.msg);
        w->next = e->wls;
        e->wls = w;
    }
    closedir(d);
}

/* --- the vtbl --------------------------------------------------------------------------------- */

/* A workload of a uid of its own reaches its tree through every directory above it: one that
 * others cannot search leaves it only its working directory (absolute paths fail, so does an
 * exec's I/O). Said at open, as the agent does not change directories it did not make. */
static void warn_unsearchable(const char *state_dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", state_dir);
    for (char *slash = strrchr(path, '/'); slash; slash = strrchr(path, '/')) {
        struct stat sb;
        if (stat(*path ? path : "/", &sb) == 0 && !(sb.st_mode & S_IXOTH))
            pv_warn("event=state_dir_not_searchable dir=%s mode=%03o note=\"workloads of dynamic "
                    "users cannot reach their trees through it: make it searchable (chmod o+x)\"",
                    *path ? path : "/", (unsigned)(sb.st_mode & 0777));
        *slash = '\0';
    }
}

static void pe_free(pe *e) {
    while (e->wls) {
        pe_wl *w = e->wls;
        e->wls = w->next;
        wl_free(w);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    PV_FREE(e->state_dir, e->image_dir, e->default_user, e->uid_dir, e->cg_base, e);
}

static int pe_open(const char *uri, const wk_engine_opts *opts, void **impl, pv_status *st) {
    (void)uri;
    *impl = NULL;
    if (!opts || !opts->state_dir || !*opts->state_dir)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "state_dir: the process engine needs one");
    if (atomic_exchange(&pe_is_open, 1))
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "process engine: one is open in this process already (libev's "
                             "default loop reaps every child of the process)");
    pe *e = calloc(1, sizeof *e);
    if (!e) {
        atomic_store(&pe_is_open, 0);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    e->state_dir = strdup(opts->state_dir);
    if (opts->image_dir && *opts->image_dir)
        e->image_dir = strdup(opts->image_dir);
    else if (asprintf(&e->image_dir, "%s/images", opts->state_dir) < 0)
        e->image_dir = NULL;
    e->grace_s = opts->stop_grace_seconds > 0 ? opts->stop_grace_seconds : PE_DEFAULT_GRACE_S;
    e->default_user = strdup(opts->default_user ? opts->default_user : "");
    e->uid_dir = strdup(opts->uid_dir && *opts->uid_dir ? opts->uid_dir : PE_DEFAULT_UID_DIR);
    e->hold_restarts = opts->hold_restarts;
    pthread_mutex_init(&e->mu, NULL);
    pv_time_cond_init(&e->cv);
    if (!e->state_dir || !e->image_dir || !e->default_user || !e->uid_dir) {
        pe_free(e);
        atomic_store(&pe_is_open, 0);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (strcmp(e->default_user, "dynamic") == 0) {
        if (wk_uids_parse_range(opts->dynamic_uids && *opts->dynamic_uids ? opts->dynamic_uids
                                                                          : PE_DEFAULT_UIDS,
                                &e->uid_min, &e->uid_max, st) != PV_OK) {
            pe_free(e);
            atomic_store(&pe_is_open, 0);
            return st->code;
        }
        /* only root can give a process another uid: a non-root agent runs them as itself */
        e->dynamic_users = geteuid() == 0;
        e->default_user[0] = '\0';
    }
    if (wk_files_mkdir_p(e->state_dir, 0755) != 0) {
        pv_status_set(st, PV_INTERNAL, "state_dir %s: %s", opts->state_dir, strerror(errno));
        pe_free(e);
        atomic_store(&pe_is_open, 0);
        return st->code;
    }
    host_ipv4(e->host_ip, sizeof e->host_ip);
    pe_setup_limits(e);
    pe_load_all(e);
    int rc = pthread_create(&e->thread, NULL, pe_thread, e);
    if (rc == 0) {
        pthread_mutex_lock(&e->mu);
        while (!e->ready)
            pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
        if (!e->loop) pthread_join(e->thread, NULL);
    }
    if (rc != 0 || !e->loop) {
        pe_free(e);
        atomic_store(&pe_is_open, 0);
        return pv_status_set(st, PV_INTERNAL, "process engine: cannot start its event loop");
    }
    pe_call_on_loop(e, adopt_all, NULL);
    size_t n = 0;
    for (pe_wl *w = e->wls; w; w = w->next)
        n++;
    if (e->dynamic_users) warn_unsearchable(e->state_dir);
    char users[128];
    if (e->dynamic_users)
        snprintf(users, sizeof users, "dynamic:%u-%u", (unsigned)e->uid_min, (unsigned)e->uid_max);
    else
        snprintf(users, sizeof users, "%s", *e->default_user ? e->default_user : "agent");
    pv_info("event=process_engine_open state_dir=%s image_dir=%s workloads=%zu host_ip=%s "
            "limits=%s users=%s note=\"%s\"",
            e->state_dir, e->image_dir, n, e->host_ip, e->cg_base ? "cgroup2" : "rlimit", users,
            e->limits_note);
    *impl = e;
    return PV_OK;
}

static void pe_close(void *impl) {
    pe *e = impl;
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->quit = true;
    pthread_mutex_unlock(&e->mu);
    ev_async_send(e->loop, &e->wake);
    pthread_join(e->thread, NULL);
    pe_free(e);
    atomic_store(&pe_is_open, 0);
}

/* Marks the workload busy (waiting while another operation has it). */
static int wl_acquire(pe *e, const char *id, pe_wl **out, pv_status *st) {
    pthread_mutex_lock(&e->mu);
    for (;;) {
        pe_wl *w = wl_lookup(e, id, st);
        if (!w) {
            pthread_mutex_unlock(&e->mu);
            return PV_NOT_FOUND;
        }
        if (!w->busy) {
            w->busy = true;
            *out = w;
            break;
        }
        pthread_cond_wait(&e->cv, &e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return PV_OK;
}

static void wl_release(pe *e, pe_wl *w) {
    pthread_mutex_lock(&e->mu);
    w->busy = false;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static int pe_create(void *impl, const wk_workload_spec *spec, wk_engine_info *out, pv_status *st) {
    pe *e = impl;
    memset(out, 0, sizeof *out);
    if (check_spec(spec, st) != PV_OK) return st->code;
    char *image_path = NULL;
    if (wk_image_find(e->image_dir, spec->image, &image_path, st) != PV_OK) return st->code;
    bool sw = false;
    uid_t uid = 0;
    gid_t gid = 0;
    bool named = spec->user && *spec->user;
    if ((named || !e->dynamic_users) &&
        resolve_user(named ? spec->user : e->default_user, &sw, &uid, &gid, st) != PV_OK) {
        free(image_path);
        return st->code;
    }
    pe_wl *w = wl_new(e, spec);
    if (!w) {
        free(image_path);
        return pv_status_set(st, PV_INTERNAL, "workload %s: out of memory", spec->id);
    }
    if (strcmp(w->home, e->image_dir) == 0) {
        pv_status_set(st, PV_INVALID_ARGUMENT, "id %s: names the image store %s", w->id,
                      e->image_dir);
        wl_free(w);
        free(image_path);
        return st->code;
    }
    w->switch_user = sw;
    w->uid = uid;
    w->gid = gid;
    w->created_ms = pv_time_now_ms();
    w->state = WK_STATE_CREATED;
    pthread_mutex_lock(&e->mu);
    if (wl_find(e, w->id) || access(w->home, F_OK) == 0) {
        pthread_mutex_unlock(&e->mu);
        pv_status_set(st, PV_ALREADY_EXISTS, "workload %s: exists on this node already", w->id);
        wl_free(w);
        free(image_path);
        return st->code;
    }
    w->busy = true;
    w->next = e->wls;
    e->wls = w;
    pthread_mutex_unlock(&e->mu);
    int rc = PV_OK;
    if (!named && e->dynamic_users) {
        rc = wk_uids_claim(e->uid_dir, e->uid_min, e->uid_max, w->id, w->home, &w->uid, st);
        w->switch_user = w->dynamic_uid = rc == PV_OK;
        w->gid = (gid_t)w->uid;
    }
    if (rc == PV_OK) rc = wl_prepare(e, w, image_path, st);
    free(image_path);
    pthread_mutex_lock(&e->mu);
    if (rc == PV_OK) {
        wl_save(w);
        w->busy = false;
        if (wl_info(e, w, out) != 0) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    wl_unlink(e, w);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (rc != PV_ALREADY_EXISTS) rm_rf(w->home);
    if (w->cgroup) rmdir(w->cgroup);
    if (w->dynamic_uid) wk_uids_release(e->uid_dir, w->uid, w->home);
    wl_free(w);
    return rc;
}

typedef struct start_arg {
    pe_wl *w;
    int rc;
    pv_status st;
} start_arg;

static void start_on_loop(pe *e, void *arg) {
    start_arg *a = arg;
    pthread_mutex_lock(&e->mu);
    a->rc = wl_spawn_main(e, a->w, &a->st);
    pthread_mutex_unlock(&e->mu);
}

static int pe_start(void *impl, const char *id, pv_status *st) {
    pe *e = impl;
    pe_wl *w;
    if (wl_acquire(e, id, &w, st) != PV_OK) return st->code;
    pthread_mutex_lock(&e->mu);
    if (is_live(w)) {
        pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s: already %s (pid %d)", id,
                      state_name(w->state), (int)w->pid);
        w->busy = false;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        return st->code;
    }
    w->want_running = true;
    w->stopping = false;
    w->held = false;
    w->backoff_ms = PE_BACKOFF_MIN_MS;
    pthread_mutex_unlock(&e->mu);
    start_arg a = {w, PV_OK, {0}};
    pe_call_on_loop(e, start_on_loop, &a);
    if (a.rc != PV_OK) {
        pthread_mutex_lock(&e->mu);
        w->want_running = false;
        wl_save(w);
        pthread_mutex_unlock(&e->mu);
        *st = a.st;
        wl_release(e, w);
        return a.rc;
    }
    wl_run_hooks(e, w, "after_start");
    wl_release(e, w);
    return PV_OK;
}

static void cancel_restart(pe *e, void *arg) {
    ev_timer_stop(e->loop, &((pe_wl *)arg)->restart_timer);
}

/* Waits until w's main process is no longer pid, up to ms. Caller holds e->mu. */
static bool wl_wait_gone(pe *e, pe_wl *w, pid_t pid, int ms) {
    int64_t deadline = pv_time_mono_ms() + ms;
    while (w->pid == pid) {
        int64_t left = deadline - pv_time_mono_ms();
        if (left <= 0) return false;
        struct timespec ts = pv_time_mono_after(left);
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    return true;
}

/* Stops a busy workload: hooks unless force, SIGTERM (and SIGCONT, for a paused one) to its
 * group, SIGKILL after grace_s. */
static int wl_stop(pe *e, pe_wl *w, int grace_s, bool force, pv_status *st) {
    pthread_mutex_lock(&e->mu);
    w->want_running = false;
    w->stopping = true;
    w->held = false;
    pid_t pid = w->pid;
    bool live = is_live(w) && pid > 0;
    if (!live) wl_save(w);
    pthread_mutex_unlock(&e->mu);
    pe_call_on_loop(e, cancel_restart, w);
    if (live) {
        if (!force) wl_run_hooks(e, w, "before_stop");
        pthread_mutex_lock(&e->mu);
        if (w->pid == pid) {
            wl_log(w, "stopping pid %d: SIGTERM, SIGKILL after %d s%s", (int)pid, grace_s,
                   force ? " (forced: no hooks)" : "");
            kill(-pid, SIGTERM);
            kill(-pid, SIGCONT);
            if (!wl_wait_gone(e, w, pid, grace_s * 1000)) {
                wl_log(w, "pid %d still running after %d s: SIGKILL", (int)pid, grace_s);
                kill(-pid, SIGKILL);
                if (!wl_wait_gone(e, w, pid, PE_KILL_WAIT_MS)) {
                    w->stopping = false;
                    pthread_mutex_unlock(&e->mu);
                    return pv_status_set(st, PV_INTERNAL,
                                         "stop %s: pid %d survived SIGKILL for %d ms", w->id,
                                         (int)pid, PE_KILL_WAIT_MS);
                }
            }
        }
        pthread_mutex_unlock(&e->mu);
    }
    pthread_mutex_lock(&e->mu);
    w->stopping = false;
    pthread_mutex_unlock(&e->mu);
    return PV_OK;
}

static int pe_stop(void *impl, const char *id, int grace_seconds, bool force, pv_status *st) {
    pe *e = impl;
    pe_wl *w;
    if (wl_acquire(e, id, &w, st) != PV_OK) return st->code;
    int rc = wl_stop(e, w, grace_seconds < 0 ? e->grace_s : grace_seconds, force, st);
    wl_release(e, w);
    return rc;
}

/* kill() only queues a SIGSTOP: the process stops when it next runs, which on a busy machine
 * comes after the caller was told "paused". Waits (up to five seconds: a process in D takes the
 * signal only when it wakes) until it has. */
static void wait_stopped(pid_t pid) {
    for (int i = 0; i < 1000 && !wk_proc_stopped(pid); i++)
        usleep(5000);
}

static int pe_signal(pe *e, const char *id, wk_state from, wk_state to, int sig, pv_status *st) {
    pe_wl *w;
    if (wl_acquire(e, id, &w, st) != PV_OK) return st->code;
    pthread_mutex_lock(&e->mu);
    pid_t pid = w->pid;
    wk_state was = w->state;
    pthread_mutex_unlock(&e->mu);
    int rc = PV_OK;
    /* the signal goes out with the lock released: a SIGSTOP is waited for (the workload is
     * ours, busy, so no other operation runs on it meanwhile), and the reaper may need the lock
     * if the process ends now */
    if (was != from || pid <= 0)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s: %s, not %s", id,
                           state_name(was), state_name(from));
    else if (kill(-pid, sig) != 0)
        rc = pv_status_set(st, PV_INTERNAL, "workload %s: signal %d to group %d: %s", id, sig,
                           (int)pid, strerror(errno));
    else if (sig == SIGSTOP)
        wait_stopped(pid);
    pthread_mutex_lock(&e->mu);
    if (rc == PV_OK && w->pid == pid && w->state == from) { /* not ended in between */
        w->state = to;
        wl_log(w, "%s", to == WK_STATE_PAUSED ? "paused (SIGSTOP)" : "resumed (SIGCONT)");
        wl_save(w);
    }
    w->busy = false;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int pe_pause(void *impl, const char *id, pv_status *st) {
    return pe_signal(impl, id, WK_STATE_RUNNING, WK_STATE_PAUSED, SIGSTOP, st);
}

static int pe_resume(void *impl, const char *id, pv_status *st) {
    return pe_signal(impl, id, WK_STATE_PAUSED, WK_STATE_RUNNING, SIGCONT, st);
}

/* ReallocResource in place: the new limits apply now (cgroup files, or the running process's
 * RLIMIT_AS through prlimit) and at every later start (the record). */
static int pe_log_range(void *impl, const char *id, int64_t since_ms, int64_t until_ms,
                        int64_t *start, int64_t *end, pv_status *st) {
    pe *e = impl;
    *start = 0;
    *end = -1;
    pthread_mutex_lock(&e->mu);
    pe_wl *w = wl_find(e, id);
    char *home = w && w->home ? strdup(w->home) : NULL;
    pthread_mutex_unlock(&e->mu);
    if (!w) return pv_status_set(st, PV_NOT_FOUND, "workload %s not found", id);
    if (!home) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char idx[PATH_MAX];
    index_path(home, idx, sizeof idx);
    int rc = wk_log_index_range(idx, since_ms, until_ms, start, end, st);
    if (rc != PV_OK) pv_status_prefix(st, "workload %s", id);
    free(home);
    return rc;
}

static int pe_set_limits(void *impl, const char *id, double cpu_limit, int64_t memory_limit,
                         pv_status *st) {
    pe *e = impl;
    pe_wl *w;
    if (cpu_limit < 0 || memory_limit < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "limits must not be negative");
    if (wl_acquire(e, id, &w, st) != PV_OK) return st->code;
    pthread_mutex_lock(&e->mu);
    double old_cpu = w->cpu_limit;
    int64_t old_memory = w->memory_limit;
    w->cpu_limit = cpu_limit;
    w->memory_limit = memory_limit;
    pid_t pid = is_live(w) ? w->pid : 0;
    pthread_mutex_unlock(&e->mu);
    int rc = PV_OK;
    if (w->cgroup) {
        free(w->cgroup); /* written again from the new limits */
        w->cgroup = NULL;
        rc = wl_setup_cgroup(e, w, st);
    } else if (pid > 0) {
        struct rlimit rl = {memory_limit > 0 ? (rlim_t)memory_limit : RLIM_INFINITY,
                            memory_limit > 0 ? (rlim_t)memory_limit : RLIM_INFINITY};
        int err = prlimit(pid, RLIMIT_AS, &rl, NULL) == 0 ? 0 : errno;
        if (err == EPERM && w->switch_user) {
            /* without CAP_SYS_RESOURCE only a process of the same uid may change another's
             * limits: prlimit(1) as the workload's user lowers them (raising the hard limit
             * needs the capability still) */
            char uid[16], gid[16], spid[16], as[48];
            snprintf(uid, sizeof uid, "%u", (unsigned)w->uid);
            snprintf(gid, sizeof gid, "%u", (unsigned)w->gid);
            snprintf(spid, sizeof spid, "%d", (int)pid);
            if (memory_limit > 0)
                snprintf(as, sizeof as, "--as=%" PRId64 ":%" PRId64, memory_limit, memory_limit);
            else
                snprintf(as, sizeof as, "--as=unlimited:unlimited");
            const char *argv[] = {
                "/usr/bin/setpriv", "--reuid", uid,  "--regid", gid, "--clear-groups", "--",
                "prlimit",          "--pid",   spid, as};
            pv_status ignored;
            if (pe_run_tool(e, argv, sizeof argv / sizeof *argv, "/", &ignored) == PV_OK) err = 0;
        }
        if (err != 0)
            rc =
                err == EPERM
                    ? pv_status_set(st, PV_FAILED_PRECONDITION,
                                    "workload %s: raising a running process's memory limit "
                                    "needs CAP_SYS_RESOURCE without cgroup v2, and this agent "
                                    "lacks it (lowering works; a restart applies any limit)",
                                    id)
                    : pv_status_set(st, PV_INTERNAL, "workload %s: prlimit: %s", id, strerror(err));
    }
    if (rc != PV_OK) { /* not applied: the workload keeps what it had */
        pthread_mutex_lock(&e->mu);
        w->cpu_limit = old_cpu;
        w->memory_limit = old_memory;
        pthread_mutex_unlock(&e->mu);
    }
    if (rc == PV_OK && wl_save(w) != 0)
        rc = pv_status_set(st, PV_INTERNAL, "workload %s: cannot save its record", id);
    if (rc == PV_OK)
        wl_log(w, "limits changed: cpu_limit %g, memory_limit %" PRId64 "%s", cpu_limit,
               memory_limit, w->cgroup ? "" : (cpu_limit > 0 ? " (cpu_limit not enforced)" : ""));
    wl_release(e, w);
    return rc;
}

static void forget_on_loop(pe *e, void *arg) {
    pe_wl *w = arg;
    wl_stop_watchers(e, w);
    pthread_mutex_lock(&e->mu);
    wl_unlink(e, w);
    pthread_mutex_unlock(&e->mu);
}

static int pe_remove(void *impl, const char *id, bool force, pv_status *st) {
    pe *e = impl;
    pe_wl *w;
    if (wl_acquire(e, id, &w, st) != PV_OK) return st->code;
    pthread_mutex_lock(&e->mu);
    bool live = is_live(w);
    pid_t pid = w->pid;
    pthread_mutex_unlock(&e->mu);
    if (live && !force) {
        wl_release(e, w);
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "workload %s: running (pid %d); stop it first or remove with force",
                             id, (int)pid);
    }
    if (live && wl_stop(e, w, 0, true, st) != PV_OK) {
        wl_release(e, w);
        return st->code;
    }
    pe_call_on_loop(e, forget_on_loop, w);
    rm_rf(w->home);
    if (w->cgroup) rmdir(w->cgroup);
    if (w->dynamic_uid) wk_uids_release(e->uid_dir, w->uid, w->home);
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->cv); /* those waiting for it find it gone */
    pthread_mutex_unlock(&e->mu);
    wl_free(w);
    return PV_OK;
}

static int pe_inspect(void *impl, const char *id, wk_engine_info *out, pv_status *st) {
    pe *e = impl;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&e->mu);
    pe_wl *w = wl_lookup(e, id, st);
    int rc = w ? PV_OK : PV_NOT_FOUND;
    if (w && wl_info(e, w, out) != 0) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int info_cmp(const void *a, const void *b) {
    return strcmp(((const wk_engine_info *)a)->id, ((const wk_engine_info *)b)->id);
}

static int pe_list(void *impl, wk_engine_info **out, size_t *n, pv_status *st) {
    pe *e = impl;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&e->mu);
    size_t count = 0;
    for (pe_wl *w = e->wls; w; w = w->next)
        count++;
    wk_engine_info *v = calloc(count + 1, sizeof *v);
    size_t i = 0;
    for (pe_wl *w = e->wls; v && w; w = w->next, i++)
        if (wl_info(e, w, &v[i]) != 0) break;
    pthread_mutex_unlock(&e->mu);
    if (!v || i != count) {
        wk_engine_info_array_free(v, i);
        return pv_status_set(st, PV_INTERNAL, "list: out of memory");
    }
    qsort(v, count, sizeof *v, info_cmp);
    *out = v;
    *n = count;
    return PV_OK;
}

static int pe_exec(void *impl, const char *id, const char *const *argv, size_t argc, int timeout_ms,
                   int *exit_code, char **output, size_t *output_len, pv_status *st) {
    pe *e = impl;
    *exit_code = -1;
    *output = NULL;
    *output_len = 0;
    if (argc == 0 || !argv || !argv[0] || !*argv[0])
        return pv_status_set(st, PV_INVALID_ARGUMENT, "exec in %s: empty command",
                             id ? id : "(null)");
    pe_job job;
    memset(&job, 0, sizeof job);
    pthread_mutex_lock(&e->mu);
    pe_wl *w = wl_lookup(e, id, st);
    int rc = w ? PV_OK : PV_NOT_FOUND;
    if (w && w->state != WK_STATE_RUNNING)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "exec in %s: workload is %s, not running",
                           id, state_name(w->state));
    else if (w && wl_spawn_init(w, &job.sp, argv, argc, w->cwd) != 0)
        rc = pv_status_set(st, PV_INTERNAL, "exec in %s: out of memory", id);
    pthread_mutex_unlock(&e->mu);
    if (rc != PV_OK) return rc;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        spawn_clear(&job.sp);
        return pv_status_set(st, PV_INTERNAL, "exec in %s: pipe: %s", id, strerror(errno));
    }
    job.sp.out_fd = p[1];
    bool timed_out;
    rc = job_run(e, &job, p[0], timeout_ms, exit_code, output, output_len, &timed_out, st);
    if (rc != PV_OK) return pv_status_prefix(st, "exec in %s", id);
    if (timed_out)
        return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                             "exec in %s: %s still running after %d ms; its process group was "
                             "killed",
                             id, argv[0], timeout_ms);
    return PV_OK;
}

static int pe_run(void *impl, const char *const *argv, size_t argc, const char *const *env,
                  const char *cwd, int timeout_ms, int *exit_code, char **output,
                  size_t *output_len, pv_status *st) {
    pe *e = impl;
    if (argc == 0 || !argv || !argv[0] || !*argv[0])
        return pv_status_set(st, PV_INVALID_ARGUMENT, "run: empty command");
    pe_job job;
    memset(&job, 0, sizeof job);
    size_t nenv = 0;
    while (env && env[nenv])
        nenv++;
    const char *path_only[] = {PE_DEFAULT_PATH};
    if (pv_strv_copy(&job.sp.argv, argv, argc) != 0 ||
        pv_strv_copy(&job.sp.env, env ? env : path_only, env ? nenv : 1) != 0 ||
        !(job.sp.cwd = strdup(cwd ? cwd : "/"))) {
        spawn_clear(&job.sp);
        return pv_status_set(st, PV_INTERNAL, "%s: out of memory", argv[0]);
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        spawn_clear(&job.sp);
        return pv_status_set(st, PV_INTERNAL, "%s: pipe: %s", argv[0], strerror(errno));
    }
    job.sp.out_fd = p[1];
    bool timed_out;
    int rc = job_run(e, &job, p[0], timeout_ms, exit_code, output, output_len, &timed_out, st);
    if (rc != PV_OK) return rc;
    if (timed_out)
        return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                             "%s still running after %d ms; its process group was killed", argv[0],
                             timeout_ms);
    return PV_OK;
}

static void pe_set_restart_gate(void *impl, wk_engine_restart_gate fn, void *arg) {
    pe *e = impl;
    pthread_mutex_lock(&e->mu); /* the loop thread asks the gate under mu */
    e->gate = fn;
    e->gate_arg = arg;
    pthread_mutex_unlock(&e->mu);
}

const wk_engine_vtbl wk_engine_process_vtbl = {
    .type = "process",
    WK_ENGINE_OPS(pe),
    .set_limits = pe_set_limits,
    .log_range = pe_log_range,
    .run = pe_run,
    .set_restart_gate = pe_set_restart_gate,
};
