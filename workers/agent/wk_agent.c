/*
 * wk_agent: engine info, node registration and liveness of the node agent (see wk_agent.h).
 *
 * The engine info is what Eru's core asks a node's engine for (its type, CPUs, memory, storage,
 * host): the agent reports it into Redis on every beat instead, with the alive key's TTL, so the
 * gateway answers Node.info and GetNodeEngineInfo without a round trip to the node and takes
 * AddNode's default resources from it. It is written before anything else and whether or not the
 * node is registered: an operator may start the agent first and AddNode the node afterwards.
 *
 * Resources of a node the agent registers itself come from the same facts with the plugins'
 * defaults (Eru's): cpumem every online CPU (100 pieces each) and 80% of MemTotal, storage 80% of
 * the file system holding the data directory. An existing node keeps what an operator set
 * (SetNode), so restarting an agent never undoes a change.
 */
#include "wk_agent.h"
#include "wk_engine_virt.h"
#include "wk_fence.h"

#include <limits.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <net/if.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "pv_time.h"
#include "pv_cluster.h"
#include "pv_keys.h"
#include "pv_log.h"
#include "pv_registry.h"
#include "pv_version.h"

struct wk_agent {
    pv_keys keys;
    char *node;
    char *pod; /* "" = the agent registers nothing */
    char *data_dir;
    int ttl_seconds;       /* the engine info's: three beats */
    int alive_ttl_seconds; /* the alive key's: ha.node_timeout_seconds */
    wk_fence *fence;       /* NULL until wk_agent_start_fence (and without an engine) */
    bool registered;
    bool resources_checked; /* fill_resources looked at the node once it existed */
    bool alive_set;         /* an alive write succeeded: a clean stop deletes the key */
    bool failing;
    bool info_failing;
    bool engine_down;   /* its daemon (docker) did not answer the last beat's ping */
    wk_engine *engine;  /* NULL when it could not be opened (deploys then fail saying why) */
    wk_virt *virt;      /* virt nodes: networks and raw operations (wk_engine_virt.h) */
    char endpoint[512]; /* worker.endpoint: what the node is registered with */
    char image_dir[PATH_MAX], registry_dir[PATH_MAX];
    char git_key[PATH_MAX];        /* git.private_key */
    char version_file[PATH_MAX];   /* <data_dir>/node/<node>/version: what the upgrade hook
                                      writes and the agent reports as the node's version */
    char upgrade_hook[PATH_MAX];   /* upgrade.hook, or the default ops/hooks/node-upgrade */
    pv_pressure_limits limits;     /* worker.*_pressure_percent */
    pthread_mutex_t cpu_mu;        /* the CPU sample: beats and an upgrade's report both read */
    long long cpu_busy, cpu_total; /* /proc/stat at the last sample */
    double cpu_busy_cores;         /* in use between the last two samples */
    char engine_error[PV_STATUS_MSG_MAX];
    /* a tcp:// docker node whose configuration has no worker.tls_*: the TLS of its record
     * (AddNode/SetNode's ca, cert, key), the PEMs last applied */
    bool tls_from_node;
    char *tls_applied[3];
};

/* The engine of the node's endpoint, with its state under <data_dir>/engine/<node> and the image
 * store in worker.image_dir (default <data_dir>/images). */
static void open_engine(wk_agent *a, const pv_config *cfg) {
    char state[PATH_MAX];
    snprintf(a->git_key, sizeof a->git_key, "%s", cfg->git.private_key ? cfg->git.private_key : "");
    char *images = a->image_dir;
    snprintf(a->endpoint, sizeof a->endpoint, "%s", cfg->worker.endpoint);
    snprintf(state, sizeof state, "%s/engine/%s", cfg->data_dir, a->node);
    if (cfg->worker.image_dir && *cfg->worker.image_dir)
        snprintf(a->image_dir, sizeof a->image_dir, "%s", cfg->worker.image_dir);
    else
        snprintf(a->image_dir, sizeof a->image_dir, "%s/images", cfg->data_dir);
    if (cfg->worker.registry_dir && *cfg->worker.registry_dir)
        snprintf(a->registry_dir, sizeof a->registry_dir, "%s", cfg->worker.registry_dir);
    else
        snprintf(a->registry_dir, sizeof a->registry_dir, "%s/registry", cfg->data_dir);
    wk_engine_opts o = {.state_dir = state,
                        .image_dir = images,
                        .stop_grace_seconds = cfg->worker.stop_grace_seconds,
                        .default_user = cfg->worker.default_user,
                        .dynamic_uids = cfg->worker.dynamic_uids,
                        .uid_dir = cfg->worker.uid_dir,
                        .virt_domain_type = cfg->worker.virt_domain_type,
                        .qemu_img = cfg->storage.qemu_img,
                        .tls_ca = cfg->worker.tls_ca,
                        .tls_cert = cfg->worker.tls_cert,
                        .tls_key = cfg->worker.tls_key,
                        .node = a->node,
                        /* a restart waits for the registry's word (wk_fence.h) */
                        .hold_restarts = true,
                        .registry_auths = (const char *const *)cfg->registry.auths,
                        .n_registry_auths = cfg->registry.n_auths};
    pv_status st;
    if (wk_engine_open(cfg->worker.endpoint, &o, &a->engine, &st) != PV_OK) {
        snprintf(a->engine_error, sizeof a->engine_error, "%s", st.msg);
        pv_error("agent node=%s: engine %s: %s", a->node, cfg->worker.endpoint, st.msg);
        return;
    }
    a->tls_from_node = strcmp(wk_engine_type(a->engine), "docker") == 0 &&
                       strncmp(a->endpoint, "tcp://", 6) == 0 &&
                       !(cfg->worker.tls_ca && *cfg->worker.tls_ca) &&
                       !(cfg->worker.tls_cert && *cfg->worker.tls_cert) &&
                       !(cfg->worker.tls_key && *cfg->worker.tls_key);
    if (strcmp(wk_engine_type(a->engine), "virt") == 0 &&
        wk_virt_open(cfg->worker.endpoint + strlen("virt://"), &o, &a->virt, &st) != PV_OK)
        pv_error("agent node=%s: libvirt networks: %s", a->node, st.msg);
    pv_info("agent node=%s: engine %s (state %s, images %s)", a->node, wk_engine_type(a->engine),
            state, images);
}

wk_engine *wk_agent_engine(wk_agent *a) {
    return a ? a->engine : NULL;
}

const char *wk_agent_node(const wk_agent *a) {
    return a->node;
}

wk_virt *wk_agent_virt(wk_agent *a) {
    return a ? a->virt : NULL;
}

const char *wk_agent_data_dir(const wk_agent *a) {
    return a->data_dir;
}

const char *wk_agent_git_key(const wk_agent *a) {
    return a->git_key;
}

const char *wk_agent_image_dir(const wk_agent *a) {
    return a->image_dir;
}

const char *wk_agent_registry_dir(const wk_agent *a) {
    return a->registry_dir;
}

const char *wk_agent_version_file(const wk_agent *a) {
    return a->version_file;
}

const char *wk_agent_upgrade_hook(const wk_agent *a) {
    return a->upgrade_hook;
}

void wk_agent_version(const wk_agent *a, char *out, size_t cap) {
    snprintf(out, cap, "v%s", PV_VERSION);
    FILE *f = fopen(a->version_file, "r");
    if (!f) return;
    char line[128];
    if (fgets(line, sizeof line, f)) {
        line[strcspn(line, " \t\r\n")] = '\0';
        if (line[0]) snprintf(out, cap, "%s", line);
    }
    fclose(f);
}

wk_agent *wk_agent_new(const pv_config *cfg) {
    wk_agent *a = calloc(1, sizeof *a);
    pv_status st;
    if (!a || pv_keys_init(&a->keys, cfg->redis.prefix, &st) != PV_OK) {
        free(a);
        return NULL;
    }
    a->node = strdup(cfg->worker.node);
    a->pod = strdup(cfg->worker.pod ? cfg->worker.pod : "");
    a->data_dir = strdup(cfg->data_dir);
    a->ttl_seconds = 3 * cfg->worker.heartbeat_seconds;
    a->alive_ttl_seconds = cfg->ha.node_timeout_seconds;
    a->limits =
        (pv_pressure_limits){cfg->worker.memory_pressure_percent, cfg->worker.disk_pressure_percent,
                             cfg->worker.pid_pressure_percent};
    pthread_mutex_init(&a->cpu_mu, NULL);
    snprintf(a->version_file, sizeof a->version_file, "%s/node/%s/version", cfg->data_dir,
             cfg->worker.node);
    if (cfg->upgrade.hook && *cfg->upgrade.hook)
        snprintf(a->upgrade_hook, sizeof a->upgrade_hook, "%s", cfg->upgrade.hook);
    else
        snprintf(a->upgrade_hook, sizeof a->upgrade_hook, "%s/node-upgrade", PV_HOOKS_DIR);
    if (!a->node || !a->pod || !a->data_dir) {
        wk_agent_free(a);
        return NULL;
    }
    if (!*a->pod)
        pv_info("agent node=%s: worker.pod is empty, so the node is not registered by its agent: "
                "AddNode it (its engine info is reported meanwhile)",
                a->node);
    open_engine(a, cfg);
    return a;
}

int wk_agent_start_fence(wk_agent *a, const pv_config *cfg, pv_status *st) {
    if (!a->engine) return PV_OK; /* no workloads, nothing to fence */
    return wk_fence_start(cfg, a->engine, &a->fence, st);
}

wk_fence *wk_agent_fence(wk_agent *a) {
    return a ? a->fence : NULL;
}

void wk_agent_free(wk_agent *a) {
    if (!a) return;
    wk_fence_stop(a->fence);
    wk_virt_close(a->virt);
    wk_engine_close(a->engine);
    free(a->node);
    free(a->pod);
    free(a->data_dir);
    for (int i = 0; i < 3; i++)
        free(a->tls_applied[i]);
    pthread_mutex_destroy(&a->cpu_mu);
    free(a);
}

/* ---- engine facts ---- */

static long long mem_total_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    long long kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* Size of the file system holding path; "/" when path is not there (yet). */
static long long fs_bytes(const char *path) {
    struct statvfs v;
    if (statvfs(path, &v) != 0 && statvfs("/", &v) != 0) return 0;
    return (long long)v.f_blocks * (long long)v.f_frsize;
}

static long cpu_count(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 ? cpus : 1;
}

static long long meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    long long kb = 0;
    char line[256], name[64];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "%63[^:]: %lld kB", name, &kb) == 2 && strcmp(name, key) == 0) break;
    if (f) fclose(f);
    return kb;
}

static long long read_number(const char *path) {
    FILE *f = fopen(path, "r");
    long long v = 0;
    if (f && fscanf(f, "%lld", &v) != 1) v = 0;
    if (f) fclose(f);
    return v;
}

/* CPU time in use since the previous sample, in cores (0 on the first). */
static double cpu_sample(wk_agent *a) {
    FILE *f = fopen("/proc/stat", "r");
    long long v[8] = {0};
    int got = f ? fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2],
                         &v[3], &v[4], &v[5], &v[6], &v[7])
                : 0;
    if (f) fclose(f);
    if (got < 4) return 0;
    long long total = 0;
    for (int i = 0; i < 8; i++)
        total += v[i];
    long long busy = total - v[3] - v[4]; /* idle, iowait */
    pthread_mutex_lock(&a->cpu_mu);
    if (a->cpu_total > 0 && total > a->cpu_total)
        a->cpu_busy_cores =
            (double)(busy - a->cpu_busy) / (double)(total - a->cpu_total) * (double)cpu_count();
    a->cpu_busy = busy;
    a->cpu_total = total;
    double cores = a->cpu_busy_cores;
    pthread_mutex_unlock(&a->cpu_mu);
    return cores;
}

static bool network_up(void) {
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0) return true; /* unknown: claim nothing */
    bool up = false;
    for (struct ifaddrs *i = list; i && !up; i = i->ifa_next)
        up = i->ifa_addr && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK) &&
             (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6);
    freeifaddrs(list);
    return up;
}

/* What the engine runs its workloads on: the machine's cores and memory, or, for an engine
 * with a daemon of its own that says (docker: GET /info's NCPU and MemTotal under "cpus" and
 * "mem_total" of its facts), the daemon's, which need not be this machine. facts may be NULL. */
static void engine_size(json_t *facts, long *cpus, long long *mem) {
    *cpus = cpu_count();
    *mem = mem_total_bytes();
    json_int_t c = json_integer_value(json_object_get(facts, "cpus"));
    json_int_t m = json_integer_value(json_object_get(facts, "mem_total"));
    if (c > 0 && m > 0) {
        *cpus = (long)c;
        *mem = (long long)m;
    }
}

/* What the engine says of itself (virt: libvirt's versions and the node's real domains;
 * docker: the daemon's, whose cores and memory are the node's), or NULL. Caller decrefs. */
static json_t *engine_facts(const wk_agent *a) {
    char *text = NULL;
    pv_status st;
    json_t *facts = NULL;
    if (a->engine && wk_engine_facts(a->engine, &text, &st) == PV_OK && text)
        facts = json_loads(text, 0, NULL);
    free(text);
    return facts;
}

/* engine_size, asking the engine for its facts (registration: before the first report). */
static void engine_size_now(wk_agent *a, long *cpus, long long *mem) {
    json_t *facts = engine_facts(a);
    engine_size(facts, cpus, mem);
    json_decref(facts);
}

/* The machine's figures now, and the conditions they make. */
static void read_machine(wk_agent *a, pv_machine *m) {
    memset(m, 0, sizeof *m);
    m->mem_total = meminfo_kb("MemTotal") * 1024;
    m->mem_available = meminfo_kb("MemAvailable") * 1024;
    struct statvfs v;
    if (statvfs(a->data_dir, &v) == 0 || statvfs("/", &v) == 0) {
        m->disk_total = (int64_t)v.f_blocks * (int64_t)v.f_frsize;
        m->disk_free = (int64_t)v.f_bavail * (int64_t)v.f_frsize;
    }
    FILE *f = fopen("/proc/loadavg", "r");
    long long running = 0, tasks = 0;
    if (f && fscanf(f, "%*f %*f %*f %lld/%lld", &running, &tasks) == 2) m->tasks = tasks;
    if (f) fclose(f);
    m->pid_max = read_number("/proc/sys/kernel/pid_max");
    m->cpu_busy_cores = cpu_sample(a);
    m->network_up = network_up();
}

/* The engine info document (pv_registry.h lists its fields). Caller frees; NULL when out of
 * memory. */
static char *engine_info_json(const wk_agent *a) {
    struct utsname u;
    bool named = uname(&u) == 0;
    char version[128];
    wk_agent_version(a, version, sizeof version);
    pv_machine m;
    read_machine((wk_agent *)a, &m);
    pv_node_conditions c;
    pv_cluster_conditions_of(&m, &a->limits, &c);
    json_t *facts = engine_facts(a);
    long cpus;
    long long mem;
    engine_size(facts, &cpus, &mem);
    json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:s, s:s, s:s}", "type",
                          a->engine ? wk_engine_type(a->engine) : "process", "cpu_count",
                          (json_int_t)cpus, "mem_total", (json_int_t)mem, "storage_total",
                          (json_int_t)fs_bytes(a->data_dir), "hostname", named ? u.nodename : "",
                          "version", version, "kernel", named ? u.release : "");
    if (j) {
        json_object_set_new(
            j, "machine",
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:b}", "mem_total",
                      (json_int_t)m.mem_total, "mem_available", (json_int_t)m.mem_available,
                      "disk_total", (json_int_t)m.disk_total, "disk_free", (json_int_t)m.disk_free,
                      "tasks", (json_int_t)m.tasks, "pid_max", (json_int_t)m.pid_max,
                      "cpu_busy_cores", m.cpu_busy_cores, "network_up", m.network_up));
        json_object_set_new(j, "conditions",
                            json_pack("{s:b, s:b, s:b, s:b}", "memory_pressure", c.memory_pressure,
                                      "disk_pressure", c.disk_pressure, "pid_pressure",
                                      c.pid_pressure, "network_unavailable",
                                      c.network_unavailable));
    }
    if (j && facts) json_object_set(j, wk_engine_type(a->engine), facts);
    json_decref(facts);
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return text;
}

static int report_engine_info(wk_agent *a, pv_redis *r, pv_status *st) {
    char *info = engine_info_json(a);
    if (!info) return pv_status_set(st, PV_INTERNAL, "engine info: out of memory");
    int rc = pv_registry_set_engine_info(r, &a->keys, a->node, info, a->ttl_seconds, st);
    free(info);
    return rc;
}

int wk_agent_report(wk_agent *a, pv_redis *r, pv_status *st) {
    return report_engine_info(a, r, st);
}

/* ---- commands of the node ---- */

#define RUN_OUTPUT_MAX 4096

/* Where no process engine runs (virt nodes, or no engine) nothing else in the process reaps
 * children, so a plain spawn and waitpid are safe. */
static int spawn_wait(const char *const *argv, const char *const *env, int timeout_ms,
                      int *exit_code, char **output, pv_status *st) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return pv_status_set(st, PV_INTERNAL, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    posix_spawnattr_init(&attr);
    sigset_t none, dflt;
    sigemptyset(&none);
    sigfillset(&dflt);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &dflt);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int err = posix_spawn(&pid, argv[0], &fa, &attr, (char *const *)argv, (char *const *)env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(p[1]);
    if (err != 0) {
        close(p[0]);
        return pv_status_set(st, PV_FAILED_PRECONDITION, "%s: %s", argv[0], strerror(err));
    }
    char *buf = calloc(1, RUN_OUTPUT_MAX + 1);
    size_t len = 0;
    int64_t until = pv_time_now_ms() + timeout_ms;
    bool timed_out = false;
    for (;;) {
        int left = (int)(until - pv_time_now_ms());
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = {p[0], POLLIN, 0};
        if (poll(&pfd, 1, left) <= 0) continue;
        char chunk[1024];
        ssize_t got = read(p[0], chunk, sizeof chunk);
        if (got <= 0) break;
        for (ssize_t i = 0; buf && i < got; i++) { /* keep the tail */
            if (len == RUN_OUTPUT_MAX) memmove(buf, buf + 1, --len);
            buf[len++] = chunk[i];
        }
    }
    close(p[0]);
    if (timed_out) kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (buf) buf[len] = '\0';
    *output = buf;
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (timed_out)
        return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                             "%s still running after %d ms; its process group was killed", argv[0],
                             timeout_ms);
    return PV_OK;
}

int wk_agent_run(wk_agent *a, const char *const *argv, const char *const *env, int timeout_ms,
                 int *exit_code, char **output, pv_status *st) {
    *output = NULL;
    size_t argc = 0, len = 0;
    while (argv[argc])
        argc++;
    int rc = a->engine ? wk_engine_run(a->engine, argv, argc, env, "/", timeout_ms, exit_code,
                                       output, &len, st)
                       : PV_UNIMPLEMENTED;
    if (rc != PV_UNIMPLEMENTED) return rc;
    free(*output);
    *output = NULL;
    return spawn_wait(argv, env, timeout_ms, exit_code, output, st);
}

/* ---- registration ---- */

static int register_node(wk_agent *a, pv_redis *r, pv_status *st) {
    pv_pod pod;
    memset(&pod, 0, sizeof pod);
    pv_pod_spec ps = {.name = a->pod, .desc = "created by the node agent of a member node"};
    int rc = pv_registry_add_pod(r, &a->keys, &ps, &pod, st);
    pv_pod_clear(&pod);
    if (rc != PV_OK && rc != PV_ALREADY_EXISTS) return rc;

    pv_node node;
    memset(&node, 0, sizeof node);
    rc = pv_registry_get_node(r, &a->keys, PV_REG_BY_NAME, a->node, &node, st);
    if (rc == PV_OK) {
        if (strcmp(node.pod_name, a->pod) != 0)
            pv_warn("agent node=%s is registered in pod %s, not %s: keeping the registry's",
                    a->node, node.pod_name, a->pod);
        pv_node_clear(&node);
        return PV_OK;
    }
    if (rc != PV_NOT_FOUND) return rc;

    char resources[512];
    long cpus;
    long long mem;
    engine_size_now(a, &cpus, &mem);
    snprintf(resources, sizeof resources,
             "{\"cpumem\":{\"cpu\":%ld,\"memory\":%lld},\"storage\":{\"storage\":%lld}}", cpus,
             mem / 10 * 8, fs_bytes(a->data_dir) / 10 * 8);
    pv_node_spec ns = {
        .name = a->node, .pod_name = a->pod, .endpoint = a->endpoint, .resources = resources};
    rc = pv_registry_add_node(r, &a->keys, &ns, &node, st);
    if (rc == PV_OK)
        pv_info("agent registered node=%s id=%s pod=%s resources=%s", a->node, node.id, a->pod,
                resources);
    pv_node_clear(&node);
    return rc == PV_ALREADY_EXISTS ? PV_OK : rc; /* another agent of the same name raced us */
}

/* A node added without resources (ClusterService's AddNode before the agent ever reported)
 * gets the machine's defaults on its agent's first beat; a node with resources keeps them. */
static int fill_resources(wk_agent *a, pv_redis *r, pv_status *st) {
    pv_node node;
    memset(&node, 0, sizeof node);
    int rc = pv_registry_get_node(r, &a->keys, PV_REG_BY_NAME, a->node, &node, st);
    if (rc == PV_NOT_FOUND) return PV_OK; /* not added yet: the next beat looks again */
    if (rc != PV_OK) return rc;
    bool empty = !node.resources || !*node.resources || strcmp(node.resources, "{}") == 0;
    pv_node_clear(&node);
    a->resources_checked = true;
    if (!empty) return PV_OK;
    char resources[512];
    long cpus;
    long long mem;
    engine_size_now(a, &cpus, &mem);
    snprintf(resources, sizeof resources,
             "{\"cpumem\":{\"cpu\":%ld,\"memory\":%lld},\"storage\":{\"storage\":%lld}}", cpus,
             mem / 10 * 8, fs_bytes(a->data_dir) / 10 * 8);
    pv_node_update u = {.name = a->node, .resources = resources};
    rc = pv_registry_set_node(r, &a->keys, &u, NULL, st);
    if (rc == PV_OK) pv_info("agent node=%s: resources from the machine: %s", a->node, resources);
    return rc;
}

/* ---- presence callbacks ---- */

/* Whether the engine's daemon answers (docker; the other engines have none to lose). When it
 * does not, the node's alive key goes at once: the node is NOT_READY, deploys pass it over, and
 * its workloads' calls fail fast naming the daemon's address. */
static bool engine_answers(wk_agent *a, pv_redis *r) {
    pv_status st;
    if (!a->engine || wk_engine_ping(a->engine, &st) == PV_OK) {
        if (a->engine_down) pv_info("agent node=%s: engine answers again", a->node);
        a->engine_down = false;
        return true;
    }
    if (!a->engine_down) pv_warn("agent node=%s: not ready: %s", a->node, st.msg);
    a->engine_down = true;
    pv_status dst;
    if (a->alive_set && pv_registry_set_alive(r, &a->keys, a->node, -1, NULL, &dst) == PV_OK)
        a->alive_set = false;
    return false;
}

/* The TLS of the node's record applied to the engine when it changed (tls_from_node). The
 * PEMs are secrets: never logged. */
static void node_tls(wk_agent *a, pv_redis *r) {
    char *v[3] = {NULL, NULL, NULL};
    pv_status st;
    if (pv_registry_get_node_tls(r, &a->keys, a->node, &v[0], &v[1], &v[2], &st) != PV_OK)
        return; /* not added yet, or Redis away: the next beat asks again */
    bool same = true;
    for (int i = 0; i < 3; i++)
        same = same && strcmp(v[i], a->tls_applied[i] ? a->tls_applied[i] : "") == 0;
    if (!same && wk_engine_set_tls(a->engine, v[0], v[1], v[2], &st) == PV_OK) {
        pv_info("agent node=%s: engine TLS from the node's record: %s", a->node,
                *v[1] && *v[2] ? (*v[0] ? "its CA, certificate and key" : "its certificate and key")
                               : "none (plain HTTP)");
        for (int i = 0; i < 3; i++) {
            free(a->tls_applied[i]);
            a->tls_applied[i] = v[i];
            v[i] = NULL;
        }
    } else if (!same) {
        pv_warn("agent node=%s: engine TLS from the node's record: %s", a->node, st.msg);
    }
    for (int i = 0; i < 3; i++)
        free(v[i]);
}

void wk_agent_beat(void *arg, pv_redis *r) {
    wk_agent *a = arg;
    pv_status st;
    int rc = PV_OK;
    /* registration first: an engine's first info can take seconds (libvirt probes QEMU once on
     * a fresh machine), and the node should be in its pod as soon as the agent is present */
    if (!a->registered && *a->pod) {
        rc = register_node(a, r, &st);
        if (rc == PV_OK) a->registered = true;
    }
    pv_status ist;
    int irc = report_engine_info(a, r, &ist);
    if (irc != PV_OK && !a->info_failing)
        pv_warn("agent node=%s: engine info: %s", a->node, ist.msg);
    a->info_failing = irc != PV_OK;
    if (rc == PV_OK && !a->resources_checked) {
        pv_status fst;
        if (fill_resources(a, r, &fst) != PV_OK)
            pv_warn("agent node=%s: resources: %s", a->node, fst.msg);
    }
    /* the fence first: an agent resumed past its fence time stops its HA workloads before it
     * says it is alive again */
    int64_t sent = wk_fence_gate(a->fence);
    if (a->tls_from_node) node_tls(a, r);
    if (rc == PV_OK && !engine_answers(a, r)) return; /* NOT_READY until the daemon is back */
    if (rc == PV_OK)
        rc = pv_registry_set_alive(r, &a->keys, a->node, a->alive_ttl_seconds, NULL, &st);
    if (rc == PV_OK) {
        a->alive_set = true;
        wk_fence_renewed(a->fence, sent);
    }
    if (rc != PV_OK && !a->failing) {
        if (rc == PV_NOT_FOUND && !*a->pod)
            pv_info("agent node=%s: not registered yet: it is alive once AddNode adds it", a->node);
        else
            pv_warn("agent node=%s: %s", a->node, st.msg);
    }
    if (rc == PV_OK && a->failing) pv_info("agent node=%s: alive", a->node);
    a->failing = rc != PV_OK;
}

void wk_agent_leave(void *arg, pv_redis *r) {
    wk_agent *a = arg;
    pv_status st;
    if (pv_registry_set_engine_info(r, &a->keys, a->node, NULL, -1, &st) != PV_OK)
        pv_warn("agent node=%s could not delete its engine info: %s", a->node, st.msg);
    if (a->alive_set && wk_fence_guarding(a->fence)) {
        /* HA workloads keep running without their agent: the key expires on its own, after
         * the guard has fenced them unless an agent is back in time */
        pv_info("agent node=%s leaves its alive key to expire: its HA workloads are guarded",
                a->node);
        return;
    }
    if (a->alive_set && pv_registry_set_alive(r, &a->keys, a->node, -1, NULL, &st) != PV_OK)
        pv_warn("agent node=%s could not delete its alive key: %s", a->node, st.msg);
}
