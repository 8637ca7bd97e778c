/*
 * wk_engine: what a node agent does with workloads on its own machine, whatever runs them. Three
 * engines implement it: the process engine (wk_engine_process.c: supervised process trees),
 * the virt engine (wk_engine_virt.c: libvirt domains) and the docker engine (wk_engine_docker.c:
 * containers of a Docker daemon, through its Engine API). The agent picks one from its node's
 * endpoint (process://, virt://<libvirt URI>, unix:// or tcp://) and drives it from the operations
 * the ops workers queue for the node (a later step); everything here is local to the machine: no
 * Redis, no gRPC.
 *
 * A workload is created (prepared, not running), started, stopped, and removed; the engine keeps
 * what it needs to find a workload again under its state directory, so an agent that restarts
 * finds the workloads it created (wk_engine_list) and, for the process engine, adopts or restarts
 * them according to their restart policy. The virt engine needs no record of its own to find
 * them: each domain carries its workload id, image, labels and "ever started" flag in its
 * libvirt <metadata> (wk_engine_virt.h), so libvirt alone is enough to find workloads again;
 * domains without that metadata (another tool's) are never listed nor touched.
 *
 * The virt engine keeps a workload's root disk (a qcow2 overlay on its image's disk), its serial
 * console log and that log's time index under its state directory, and the VM images it
 * unpacked from the node's image store (wk_vm_image.h); libvirt keeps everything else.
 *
 * Errors: PV_NOT_FOUND (no such workload), PV_ALREADY_EXISTS (create with a used id),
 * PV_FAILED_PRECONDITION (wrong state: start of a running workload, remove of a running one
 * without force), PV_INVALID_ARGUMENT naming the field for what this engine cannot do (e.g.
 * sysctls on either engine), PV_UNIMPLEMENTED for an operation the engine does not have,
 * PV_INTERNAL/PV_UNAVAILABLE for the machine's failures, the message saying which call failed.
 *
 * Threads: every function may be called from any thread; an engine serialises what must be.
 * The process engine reaps children with libev's default loop, which waits for EVERY child of the
 * process (waitpid(-1)): while one is open (at most one per process), nothing else in the agent
 * may fork children and wait for them itself.
 * Ownership: specs are borrowed for the call; info structs filled by the engine own their strings
 * (wk_engine_info_clear); lists with wk_engine_info_array_free.
 */
#ifndef WK_ENGINE_H
#define WK_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_status.h"

typedef struct wk_engine wk_engine;

/* Asked by an engine that restarts workloads by their restart policy itself (the process
 * engine), before each such restart, on the engine's own thread with its lock held: it must not
 * call the engine, nor wait. false: the restart is not made; the workload is left STOPPED with
 * wk_engine_info.restart_held (as hold_restarts leaves it at open), for the agent to start
 * (wk_engine_start) or remove. The node agent's fence (wk_fence.h) says false for its HA
 * workloads while its liveness lease is not current. */
typedef bool (*wk_engine_restart_gate)(void *arg, const char *id, const char *labels_json);

typedef struct wk_engine_opts {
    const char *state_dir;  /* the engine's own files (workload dirs, logs, records); created;
                               virt on QEMU: VM images, root disks, console logs */
    const char *image_dir;  /* the node's image store (tar archives; VM images for virt) */
    const char *uri;        /* virt engine: the libvirt URI ("test:///default", ...) */
    int stop_grace_seconds; /* default grace between SIGTERM (or shutdown) and SIGKILL (destroy);
                               virt: <= 0 means 10 s */
    /* process engine: the user of a workload whose spec names none. NULL or "" = the agent's;
     * "dynamic" = a uid (and gid) of its own out of dynamic_uids ("MIN-MAX"), claimed
     * host-wide in uid_dir (wk_uids.h), when the agent runs as root (else the agent's); any
     * other value = that user, as a spec's user. */
    const char *default_user;
    const char *dynamic_uids;
    const char *uid_dir;
    /* virt engine on QEMU: <domain type=...>, "qemu" (TCG, the default: works everywhere) or
     * "kvm" (hardware virtualisation where it works); drivers other than QEMU's use their own */
    const char *virt_domain_type;
    const char *qemu_img; /* virt engine: the qemu-img that makes root disk overlays (PATH's) */
    /* docker engine, tcp:// endpoints: the node's CA, certificate and key (PEM text, or a
     * path starting with '/'); NULL or "" = plain HTTP */
    const char *tls_ca, *tls_cert, *tls_key;
    /* docker engine: the node it serves; only containers labelled eru.nodename=<node> are its
     * own (several nodes may share one daemon). NULL or "" = every container with pivirt.id */
    const char *node;
    /* process engine: a workload whose restart policy would restart it at open (its process
     * gone: the agent or the host was down) is not restarted but left STOPPED with
     * wk_engine_info.restart_held, for the agent to start (wk_engine_start) or remove once the
     * registry said whether it was replaced elsewhere meanwhile. false: restarted at open. */
    bool hold_restarts;
    /* docker engine: registry credentials, each "HOST=USERNAME:PASSWORD" (registry.auths) */
    const char *const *registry_auths;
    size_t n_registry_auths;
} wk_engine_opts;

/* Publish: a port the workload serves, "port/proto" ("80/tcp"); the engine answers with the
 * addresses where it is reachable (host network: the node's IP and the same port). */
typedef struct wk_workload_spec {
    const char *id;   /* 1-64 of [A-Za-z0-9._-]: the workload's id (pv_workload) */
    const char *name; /* "<app>_<entry>_<6 letters>" */
    const char *image;
    /* entrypoint: the process engine's; the virt engine ignores these (the guest boots its own
     * init from its disks) except sysctls, which both refuse */
    const char *const *commands; /* argv of the main process; run as given, no shell */
    size_t ncommands;
    const char *dir;     /* working directory inside the workload's root ("" = its root) */
    const char *user;    /* "" = the engine's default_user; else a name or uid[:gid] */
    const char *restart; /* "" or "no", "always", "on-failure" (Eru's restart policy) */
    bool privileged;
    const char *const *env; /* "KEY=VALUE" */
    size_t nenv;
    const char *const *publish;
    size_t npublish;
    const char *const *after_start; /* hooks: each an argv line, run with sh -c */
    size_t nafter_start;
    const char *const *before_stop;
    size_t nbefore_stop;
    const char *const *sysctls; /* "key=value"; the process engine refuses any */
    size_t nsysctls;
    /* resources (what the reservation's allocation gave it) */
    double cpu_limit;     /* cores; 0 = none (virt: vcpus = ceil(cpu_limit), 1 when 0) */
    int64_t memory_limit; /* bytes; 0 = none (virt: the domain's memory, 512 MiB when 0) */
    const int *cpuset;    /* bound cores (cpu_map keys), NULL/0 = not bound (virt: vcpu cpuset) */
    size_t ncpuset;
    /* virt: absolute disk image paths, attached as virtio disks vda, vdb, ... (after the
     * image's root disk, when it has one: vdb, ...; qcow2 when the file has qcow2's magic,
     * else raw); process: "src:dst[:ro]" */
    const char *const *volumes;
    size_t nvolumes;
    const char *labels_json; /* JSON object of strings kept with the workload */
    /* docker engine only (the agent refuses them on the others): Eru's raw_args JSON merged
     * into the container's create body, name servers, "host:ip" lines, and the networks to
     * join as a JSON object {"name": "ipv4 or \"\""} */
    const char *raw_args;
    size_t raw_args_len;
    const char *const *dns;
    size_t ndns;
    const char *const *extra_hosts;
    size_t nextra_hosts;
    const char *networks_json;
} wk_workload_spec;

typedef enum {
    WK_STATE_CREATED = 0, /* prepared, never started */
    WK_STATE_RUNNING,
    WK_STATE_PAUSED,
    WK_STATE_STOPPED, /* exited or stopped; exit_code says how */
} wk_state;

typedef struct wk_engine_info {
    char *id, *name, *image;
    wk_state state;
    int exit_code;       /* STOPPED: the main process's exit status (128+signal when killed; -1 when
                          * unknown: a process that ended while no agent watched it); virt: 0
                          * after a shutdown, 137 after a destroy, 1 after a crash */
    int64_t pid;         /* process engine: the main process; virt on qemu:///system: the
                          * domain's qemu process; 0 when not running or unknown */
    char *engine_id;     /* the engine's handle: pid for processes, the domain UUID for virt */
    char *networks_json; /* {"host": "10.0.0.5"} for the process engine; virt: one key per
                          * interface, the libvirt network's name ("bridge:<br>" for a bridge):
                          * {"default": {"mac": "52:54:00:..", "type": "network", "addresses":
                          * ["192.168.122.23"]}} (addresses from DHCP leases, when the domain
                          * runs and the driver has them) */
    char *publish_json;  /* {"80/tcp": ["10.0.0.5:80"]}; virt: {} (no port publishing) */
    char *log_path;      /* the combined stdout/stderr log ("" when the engine has none) */
    char *root;          /* the workload's root directory on this machine (process engine; NULL
                            when the engine has none: files go through the guest) */
    char *labels_json;
    int64_t started_ms, finished_ms;
    int restarts;      /* times the restart policy restarted it */
    bool restart_held; /* process engine: its restart waits for the agent (hold_restarts) */
} wk_engine_info;

void wk_engine_info_clear(wk_engine_info *info);
void wk_engine_info_array_free(wk_engine_info *infos, size_t n);

/* The engine for an endpoint: "process://..." or "virt://<uri>" (opts->uri is then taken from
 * the endpoint when NULL), "unix:///path/docker.sock" or "tcp://host:port" (the docker engine:
 * wk_engine_docker.h). */
int wk_engine_open(const char *endpoint, const wk_engine_opts *opts, wk_engine **out,
                   pv_status *st);
void wk_engine_close(wk_engine *e); /* leaves workloads running: the agent may restart */

const char *wk_engine_type(const wk_engine *e); /* "process", "virt" or "docker" */

int wk_engine_create(wk_engine *e, const wk_workload_spec *spec, wk_engine_info *out,
                     pv_status *st);
int wk_engine_start(wk_engine *e, const char *id, pv_status *st);
/* Runs the before_stop hooks (unless force), then stops: SIGTERM to the process group and
 * SIGKILL after grace_seconds (< 0: the engine's default); virt: shutdown, then destroy after
 * grace_seconds (at once when force, when grace_seconds is 0, or when the domain is paused). */
int wk_engine_stop(wk_engine *e, const char *id, int grace_seconds, bool force, pv_status *st);
int wk_engine_pause(wk_engine *e, const char *id, pv_status *st);  /* SIGSTOP / suspend */
int wk_engine_resume(wk_engine *e, const char *id, pv_status *st); /* SIGCONT / resume */
/* Removes what the workload has on the machine. A running one: FAILED_PRECONDITION unless
 * force (then it is stopped with no grace first). */
int wk_engine_remove(wk_engine *e, const char *id, bool force, pv_status *st);
int wk_engine_inspect(wk_engine *e, const char *id, wk_engine_info *out, pv_status *st);
int wk_engine_list(wk_engine *e, wk_engine_info **out, size_t *n, pv_status *st);

/* Runs argv inside the workload (its root, env and user), waits at most timeout_ms, and returns
 * its exit code and combined output (caller frees *output; at most 1 MiB kept). The process
 * engine runs it in the workload's working directory (root/dir), within its limits, in a process
 * group of its own, and needs the workload RUNNING (else FAILED_PRECONDITION). timeout_ms <= 0:
 * no limit; past it the group is killed and the call answers DEADLINE_EXCEEDED, still giving the
 * output so far and *exit_code 137 (caller frees *output in that case too). The virt engine runs
 * it through the guest's QEMU guest agent (guest-exec): stdout then stderr, not interleaved; a
 * guest whose agent does not answer within WK_ENGINE_AGENT_WAIT_MS fails UNAVAILABLE naming the
 * workload; past timeout_ms the command is left running in the guest (DEADLINE_EXCEEDED, no
 * output: the agent gives none before the command exits). */
#define WK_ENGINE_AGENT_WAIT_MS 15000
int wk_engine_exec(wk_engine *e, const char *id, const char *const *argv, size_t argc,
                   int timeout_ms, int *exit_code, char **output, size_t *output_len,
                   pv_status *st);

/* The process engine's resource limits on this machine: "cgroup2" (a writable cgroup2 mount
 * with the cpu, memory and cpuset controllers: cpu.max, memory.max, cpuset.cpus) or "rlimit"
 * (RLIMIT_AS from memory_limit, CPU affinity from cpuset, cpu_limit NOT enforced). Static
 * storage; looks at the machine without changing it. The engine logs the same at open and in
 * each workload's log when it starts. */
const char *wk_engine_process_limits(void);

/* Runs a program of the node itself, outside any workload (BuildImage's git and build steps):
 * argv in cwd with env ("KEY=VALUE", NULL-terminated; NULL = PATH only) as the agent's user, in
 * a process group of its own, waiting at most timeout_ms (<= 0: no limit). *exit_code and the
 * combined output (caller frees *output; at most 1 MiB kept) as for wk_engine_exec; past the
 * timeout the group is killed and the call answers DEADLINE_EXCEEDED. Engines that leave the
 * node's processes to nobody (virt) answer UNIMPLEMENTED. */
int wk_engine_run(wk_engine *e, const char *const *argv, size_t argc, const char *const *env,
                  const char *cwd, int timeout_ms, int *exit_code, char **output,
                  size_t *output_len, pv_status *st);

/* LogStream's since/until: the byte range of the workload's log written between since_ms and
 * until_ms (wall-clock ms; <= 0 = open), at the engine's index granularity
 * (WK_ENGINE_LOG_INDEX_MS: a range may take in up to that much more on each side). *start is a
 * byte offset, *end one too or -1 (to the end). UNIMPLEMENTED for engines without a log. */
#define WK_ENGINE_LOG_INDEX_MS 1000
int wk_engine_log_range(wk_engine *e, const char *id, int64_t since_ms, int64_t until_ms,
                        int64_t *start, int64_t *end, pv_status *st);

/* Send's part in engines whose workloads have no root on this machine (virt: through the guest
 * agent's guest-file-*): writes data to the absolute path inside the workload, created or
 * truncated, then sets mode (and owner, uid/gid >= 0). Engines with a root on the machine write
 * there themselves (wk_files.h): UNIMPLEMENTED here. */
int wk_engine_put_file(wk_engine *e, const char *id, const char *path, const void *data, size_t len,
                       int mode, int uid, int gid, pv_status *st);

/* Copy's part in the same engines: a tar archive of path (a file or a directory) inside the
 * workload, as tar(1) in the guest makes it (*tar malloc'd, caller frees). UNIMPLEMENTED where
 * the workload's root is on the machine. */
int wk_engine_get_tar(wk_engine *e, const char *id, const char *path, char **tar, size_t *len,
                      pv_status *st);

/* ReallocResource in place: new limits for a workload (cpu_limit in cores, memory_limit in
 * bytes; 0 = none), applied now and at later starts. UNIMPLEMENTED for engines that cannot. */
int wk_engine_set_limits(wk_engine *e, const char *id, double cpu_limit, int64_t memory_limit,
                         pv_status *st);

/* Whether the engine's daemon answers now (docker: GET /_ping): UNAVAILABLE naming its address
 * when not. PV_OK for engines that have no daemon of their own to lose. */
int wk_engine_ping(wk_engine *e, pv_status *st);

/* ---- engines whose workloads have no root on this machine (docker) ----
 * Each answers UNIMPLEMENTED on engines without it; the agent then uses info.root. */

/* Writes one file at absolute path inside the workload (parents created), with mode and
 * owner uid:gid (uid < 0: root's). */
int wk_engine_put_file(wk_engine *e, const char *id, const char *path, const void *data, size_t len,
                       int mode, int uid, int gid, pv_status *st);
/* A tar archive of path inside the workload (a file or a directory), as the engine gives it;
 * *tar malloc'd for the caller. NOT_FOUND naming the path when it does not exist. */
int wk_engine_get_tar(wk_engine *e, const char *id, const char *path, char **tar, size_t *len,
                      pv_status *st);

/* One regular file at path inside the workload: *data malloc'd for the caller, its mode
 * (permission bits), uid and gid. NOT_FOUND naming the path when it does not exist,
 * FAILED_PRECONDITION when it is not a regular file. */
int wk_engine_get_file(wk_engine *e, const char *id, const char *path, char **data, size_t *len,
                       int *mode, int *uid, int *gid, pv_status *st);

/* LogStream from the engine's own log: each line (without its newline) of stream 1 (stdout)
 * or 2 (stderr) handed to fn; fn is also called about every second with line NULL while
 * nothing comes (to notice a cancel). Non-zero from fn stops the call (its code in *st).
 * tail < 0 = all; since_ms/until_ms <= 0 = open; follow: until the workload stops, when
 * *exit_code is its exit code (else -1). */
typedef int (*wk_engine_line_fn)(void *ctx, int stream, const char *line, size_t len,
                                 pv_status *st);
typedef struct wk_engine_log_opts {
    long tail;
    int64_t since_ms, until_ms;
    bool follow;
} wk_engine_log_opts;
int wk_engine_logs(wk_engine *e, const char *id, const wk_engine_log_opts *o, wk_engine_line_fn fn,
                   void *ctx, int *exit_code, pv_status *st);

/* An exec whose output streams as it comes (output: stream 1 stdout, 2 stderr; non-zero stops)
 * with extra env ("K=V") and a working directory ("" = the workload's), waiting at most
 * timeout_ms (<= 0: none). With input set, the command's stdin is open: input is called for
 * more and answers the bytes put in buf, 0 when none is there yet (it may wait up to wait_ms
 * for some), -1 at the end of the input, below -1 to stop the exec (its process is ended; st
 * says why). It is called on after the end of the input, until the command has ended. */
typedef struct wk_exec_io {
    const char *const *argv;
    size_t argc;
    const char *const *env;
    size_t nenv;
    const char *workdir;
    int timeout_ms;
    int (*output)(void *ctx, int stream, const char *data, size_t len, pv_status *st);
    long (*input)(void *ctx, char *buf, size_t cap, int wait_ms, pv_status *st);
    void *ctx;
} wk_exec_io;
int wk_engine_exec_io(wk_engine *e, const char *id, const wk_exec_io *io, int *exit_code,
                      pv_status *st);

/* An output for wk_exec_io that collects stdout and stderr together into a wk_exec_buf (its
 * ctx), at most WK_EXEC_BUF_MAX bytes: the tail is kept. data (NUL-terminated, NULL until
 * something came) is the caller's to free. */
#define WK_EXEC_BUF_MAX (1u << 20)
typedef struct wk_exec_buf {
    char *data;
    size_t len;
} wk_exec_buf;
int wk_exec_buf_collect(void *ctx, int stream, const char *data, size_t len, pv_status *st);

/* ---- images the engine holds itself (docker: the daemon's images, a registry's pushes) ----
 * Each answers UNIMPLEMENTED on engines whose images are the agent's files (wk_image.h). A
 * reference that names a registry ("host:port/ns/app:tag", "host.domain/app:tag",
 * "localhost/app:tag") is pulled from and pushed to it. */
typedef struct wk_engine_image {
    char *ref, *id;
} wk_engine_image;
void wk_engine_image_array_free(wk_engine_image *v, size_t n);
int wk_engine_image_list(wk_engine *e, wk_engine_image **out, size_t *n, pv_status *st);
/* NOT_FOUND with the registry's answer when it has no such image. */
int wk_engine_image_pull(wk_engine *e, const char *ref, pv_status *st);
/* prune: also the untagged parents it leaves. NOT_FOUND when there is no such image. */
int wk_engine_image_remove(wk_engine *e, const char *ref, bool prune, pv_status *st);
/* Builds an image tagged with every ref, from a build context (tar: an archive with a
 * Dockerfile) or, with exist_id, from that workload as it is (a commit); each ref that names a
 * registry is pushed to it. log gets the build's and the pushes' progress lines (stream 1).
 * *id: the image's id (caller frees). A failing step: FAILED_PRECONDITION with the daemon's
 * or the registry's words. */
int wk_engine_image_build(wk_engine *e, const void *tar, size_t len, const char *exist_id,
                          const char *const *refs, size_t nrefs, wk_engine_line_fn log, void *ctx,
                          char **id, pv_status *st);

/* ---- networks of the engine's own (docker: the daemon's networks) ----
 * UNIMPLEMENTED on engines without (the process engine shares the host's; virt nodes have
 * wk_engine_virt.h's). */
typedef struct wk_engine_network {
    char *name;
    char **subnets; /* CIDR */
    size_t nsubnets;
} wk_engine_network;
void wk_engine_network_clear(wk_engine_network *n);
void wk_engine_network_array_free(wk_engine_network *v, size_t n);
int wk_engine_networks(wk_engine *e, wk_engine_network **out, size_t *n, pv_status *st);
/* Connects workload id to network (ipv4/ipv6 NULL or "": any address); *out the network with
 * its subnets, as ConnectNetwork answers. */
int wk_engine_connect(wk_engine *e, const char *id, const char *network, const char *ipv4,
                      const char *ipv6, wk_engine_network *out, pv_status *st);
int wk_engine_disconnect(wk_engine *e, const char *id, const char *network, bool force,
                         pv_status *st);

/* wk_engine_set_limits, saying in how (a sentence, at most how_cap bytes with its NUL) when each
 * limit applies: engines that apply them at once say so; the virt engine applies memory and
 * vcpus to a running domain where the domain allows it (within the maximums it was started
 * with: memory through its balloon, vcpus hot-plugged and onlined through the guest agent, or
 * "(not onlined in the guest: <why>)") and otherwise to its definition only, for
 * the next start, and says which, e.g. "memory 128 MiB live, 2 vcpus live" or "memory 256 MiB at
 * the next start (above the 192 MiB the running domain has room for), 1 vcpus live". */
int wk_engine_set_limits_how(wk_engine *e, const char *id, double cpu_limit, int64_t memory_limit,
                             char *how, size_t how_cap, pv_status *st);

/* What the engine has to say about itself in its node's engine info (Node.info), as a JSON
 * object text (*json malloc'd, caller frees). The virt engine: {"uri", "driver",
 * "hypervisor_version", "libvirt_version", "domain_type", "domains", "running",
 * "running_vcpus", "running_memory" (bytes), "workloads": {id: {"domain", "state", "vcpus",
 * "memory", "exit_code" (wk_engine_info's), "stopped_by_api"}}}, the domains as libvirt has
 * them now. *json NULL (PV_OK) for engines with
 * nothing to say. */
int wk_engine_facts(wk_engine *e, char **json, pv_status *st);

/* The engine's TLS to its daemon from now on (docker on tcp://: the node's CA, certificate and
 * key as PEM text, as AddNode/SetNode stored them; all NULL or "": plain). UNIMPLEMENTED for
 * engines without a daemon reached over TLS. */
int wk_engine_set_tls(wk_engine *e, const char *ca, const char *cert, const char *key,
                      pv_status *st);

/* Engines that learn of their workloads' changes by themselves (docker: the daemon's event
 * stream, whoever made the change: pivirt or someone straight through the daemon) call the
 * watch with the workload's id after each change they learn of, on a thread of their own; id
 * NULL: anything may have changed (the engine lost its source and caught up with a listing).
 * fn must be quick and must not call the engine. The other engines never call it: their
 * statuses come from the agent's periodic pass (wk_health.h). */
typedef void (*wk_engine_watch_fn)(void *arg, const char *id);
/* Sets the watch (fn NULL: none); once this returns, the previous one is not called any more. */
void wk_engine_set_watch(wk_engine *e, wk_engine_watch_fn fn, void *arg);

/* Sets the restart gate (fn NULL: none, every restart is made); once this returns, the previous
 * gate is not called any more. Engines that restart nothing by themselves ignore it. */
void wk_engine_set_restart_gate(wk_engine *e, wk_engine_restart_gate fn, void *arg);

#endif
