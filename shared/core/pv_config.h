/*
 * pv_config: the configuration every pivirt program reads.
 *
 * Sources, each overriding the one before: built-in defaults, a JSON file (nested objects map to
 * dotted keys: {"redis": {"addr": "..."}} is redis.addr), environment variables (PIVIRT_ + the
 * key upper-cased with '.' as '_': PIVIRT_REDIS_ADDR), then command-line `--set key=value`.
 * Every key goes through one table (pv_config_set), so the three sources accept the same keys
 * and give the same errors. Unknown keys are errors: a typo must not be silently ignored.
 *
 * Ownership: a pv_config owns every string and array in it; pv_config_free releases them.
 */
#ifndef PV_CONFIG_H
#define PV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "pv_log.h"
#include "pv_status.h"

typedef struct pv_config {
    char *data_dir;         /* data_dir: where daemons keep state and logs ("./.data") */
    pv_log_level log_level; /* log.level: debug|info|warn|error ("info") */

    struct {
        char *addr;     /* redis.addr: "host:port" or a unix socket path ("127.0.0.1:6390") */
        int db;         /* redis.db (0) */
        char *username; /* redis.username: the ACL user ("" = AUTH with the password alone,
                           as the default user); needs redis.password */
        char *password; /* redis.password ("" = none); never logged */
        char *prefix;   /* redis.prefix: prepended to every key ("pv:") */
        int connect_timeout_ms; /* redis.connect_timeout_ms (1000) */
        int command_timeout_ms; /* redis.command_timeout_ms (2000) */
        char **sentinels;       /* redis.sentinels: Redis Sentinel addresses (host:port, JSON
                                   array or comma-separated); none = redis.addr directly */
        size_t n_sentinels;
        char *master_name;   /* redis.master_name: the master the sentinels watch ("") */
        char *durability;    /* redis.durability: "async" (default) or "replicated": a submitted
                                operation is acknowledged only once redis.wait_replicas replicas
                                hold it (WAIT), so a failover cannot lose it */
        int wait_replicas;   /* redis.wait_replicas (1) */
        int wait_timeout_ms; /* redis.wait_timeout_ms (1000) */
    } redis;

    struct {
        char **listen; /* gateway.listen: addresses, JSON array or comma-separated
                          ("localhost:8443,localhost:9002,localhost:5001") */
        size_t n_listen;
        int threads;                /* gateway.threads: completion-queue threads (16: handlers wait
                                       on Redis round trips, and streaming calls that relay a node's
                                       operation (LogStream follow, RunAndWait, deploys) hold their
                                       thread while they last) */
        char *tls_cert;             /* gateway.tls_cert: PEM path ("" = plaintext) */
        char *tls_key;              /* gateway.tls_key: PEM path, required with tls_cert */
        char *tls_client_ca;        /* gateway.tls_client_ca: PEM path of the CA that signs the
                                       clients' certificates; set = mutual TLS, a client without a
                                       certificate it signed is refused at the handshake ("" =
                                       no client certificates) */
        int max_concurrent_streams; /* gateway.max_concurrent_streams: calls one client
                                       connection may have open at once (HTTP/2
                                       SETTINGS_MAX_CONCURRENT_STREAMS) (1000) */
        int max_streams_per_client; /* gateway.max_streams_per_client: streaming calls one
                                       client may have open on one gateway (1000; 0 = none) */
        int max_pending_ops_per_client; /* gateway.max_pending_ops_per_client: unfinished
                                           operations one client (the authenticated user, else
                                           the peer's address) may have; more are refused
                                           RESOURCE_EXHAUSTED (10000; 0 = no bound) */
        long max_request_bytes;         /* gateway.max_request_bytes (4194304) */
        long max_upload_bytes;   /* gateway.max_upload_bytes: one message of BuildImage and Send,
                                    and SendLargeFile's files in all (67108864; at most 256 MiB:
                                    a message is held whole, and a BuildImage tar goes through
                                    Redis, pv_upload.h) */
        int heartbeat_seconds;   /* gateway.heartbeat_seconds: presence key refresh (2); the
                                    key lives 3x that */
        char *metrics_listen;    /* gateway.metrics_listen: host:port of its Prometheus
                                    /metrics ("" = none) */
        int shutdown_grace_ms;   /* gateway.shutdown_grace_ms: in-flight calls may finish (5000) */
        char *advertise;         /* gateway.advertise: address reported by WatchServiceStatus
                                    ("" = the first listen address) */
        int malloc_arenas;       /* gateway.malloc_arenas: glibc malloc arenas at most (4; 0 =
                                    glibc's default, 8 per core); see gateway/gw_memory.h */
        int memory_trim_idle_ms; /* gateway.memory_trim_idle_ms: free memory goes back to the
                                    kernel once no call started for this long (1000; 0 = never) */
    } gateway;

    struct {
        char *username;         /* auth.username ("" = no auth); must be lowercase */
        char *password;         /* auth.password */
        bool exempt_health;     /* auth.exempt_health: grpc.health.v1.Health answers without
                                   the credentials, so load balancers can probe (true) */
        bool exempt_reflection; /* auth.exempt_reflection: server reflection answers without
                                   them (false) */
    } auth;

    struct {
        int heartbeat_seconds;  /* worker.heartbeat_seconds (2) */
        char *node;             /* worker.node: node name for the node role ("" = ops role) */
        char *pod;              /* worker.pod: pod/cluster of the node ("local") */
        int concurrency;        /* worker.concurrency: operations run at once (8) */
        int lease_ms;           /* worker.lease_ms: an operation's lease; redelivery after a
                                   worker's death comes within about 1.5x this (10000) */
        int max_attempts;       /* worker.max_attempts: default deliveries before an
                                   operation fails for good (5) */
        int backoff_base_ms;    /* worker.backoff_base_ms: first retry delay, doubled per
                                   attempt, with jitter (200) */
        int backoff_max_ms;     /* worker.backoff_max_ms: retry delay cap (30000) */
        int shutdown_ms;        /* worker.shutdown_ms: on SIGTERM, running operations may
                                   finish this long before they are handed back (10000) */
        int node_op_timeout_ms; /* worker.node_op_timeout_ms: a node's part of a deploy that no
                                   agent has taken after this is cancelled (60000) */
        char *endpoint;         /* worker.endpoint: the agent's engine ("process://") */
        char *tls_ca;           /* worker.tls_ca, tls_cert, tls_key: a tcp:// docker engine's */
        char *tls_cert;         /* CA, client certificate and key (PEM files, or PEM text); */
        char *tls_key;          /* "" = plain HTTP ("") */
        char *image_dir;    /* worker.image_dir: the agent's image store ("" = <data_dir>/images) */
        char *registry_dir; /* worker.registry_dir: the cluster's image registry CacheImage
                               copies from ("" = <data_dir>/registry) */
        char *build_pod;    /* worker.build_pod: BuildImage runs on this pod's most idle
                               node ("local") */
        int status_interval_seconds; /* worker.status_interval_seconds: the agent checks its
                                        workloads' health and reports their statuses this often;
                                        statuses live three times as long (5) */
        char *metrics_listen;        /* worker.metrics_listen: host:port of the worker's
                                        Prometheus /metrics ("" = none) */
        int memory_pressure_percent; /* worker.memory_pressure_percent: the node reports
                                        memory pressure from this much memory in use (90) */
        int disk_pressure_percent;   /* worker.disk_pressure_percent: disk pressure from this
                                        much of its data directory's file system in use (90) */
        int pid_pressure_percent;    /* worker.pid_pressure_percent: pid pressure from this many
                                        tasks, in percent of kernel.pid_max (90) */
        char *default_user;     /* worker.default_user: a process workload whose deploy names no
                                   user runs as "dynamic" (a uid of its own), "" (the agent's
                                   user) or this name or uid[:gid] ("dynamic") */
        char *dynamic_uids;     /* worker.dynamic_uids: the uids "dynamic" takes
                                   ("1879048192-1879113727") */
        char *uid_dir;          /* worker.uid_dir: where the host's agents claim them
                                   ("/run/pivirt/uids") */
        int stop_grace_seconds; /* worker.stop_grace_seconds: a stop that names no grace
                                   (RemoveWorkload, RemoveNode, DeleteCluster) waits this long
                                   between SIGTERM (a domain's shutdown) and SIGKILL (10) */
        char *virt_domain_type; /* worker.virt_domain_type: <domain type> of a virt node on QEMU:
                                   "qemu" (TCG, works everywhere) or "kvm" ("qemu") */
    } worker;

    struct {
        char **auths; /* registry.auths: credentials for image registries, each
                         "HOST=USERNAME:PASSWORD" (HOST as image references name it:
                         "127.0.0.1:5000"); the docker engine sends them with its pushes, pulls
                         and builds (X-Registry-Auth, X-Registry-Config); secret (none) */
        size_t n_auths;
    } registry;

    struct {
        char *scm_type;    /* git.scm_type: BuildImage's SCM method clones with git(1) when set
                              ("git", or Eru's "github"/"gitlab"); "" refuses SCM builds ("") */
        char *private_key; /* git.private_key: the SSH key the build nodes clone with ("") */
    } git;

    struct {
        char *libvirt_uri;  /* storage.libvirt_uri: the connection a node agent manages its
                               host's pools through ("qemu:///system") */
        char *default_node; /* storage.default_node: the node whose agent holds a pool created
                               without config.node ("" = this machine's host name) */
        char *qemu_img;     /* storage.qemu_img: the qemu-img a node agent runs for qcow2
                               snapshots ("/usr/bin/qemu-img") */
        char **roots;       /* storage.roots: the directories a node agent's pools may live in
                               (DIR paths, NFS mount points), absolute, JSON array or
                               comma-separated; nothing below a root may be a link (none =
                               <data_dir>/pools and /var/lib/libvirt/images) */
        size_t n_roots;
    } storage;

    struct {
        char *hook;               /* upgrade.hook: what a node agent runs to upgrade its node,
                                     with the target version as its argument ("" = the
                                     project's ops/hooks/node-upgrade) */
        int node_timeout_seconds; /* upgrade.node_timeout_seconds: a node's hook, and its
                                     coming back READY at the target version, each within
                                     this (300) */
        int settle_seconds;       /* upgrade.settle_seconds: how long CANARY and BLUE_GREEN
                                     watch upgraded nodes stay READY before going on (30) */
    } upgrade;

    struct {
        int node_timeout_seconds; /* ha.node_timeout_seconds: a node whose agent has not renewed
                                     its liveness for this long is NOT_READY, and its HA
                                     workloads are recreated elsewhere (8) */
        int fence_seconds;        /* ha.fence_seconds: an agent that has not renewed its
                                     liveness for this long stops its HA workloads itself; at
                                     most node_timeout_seconds - PV_HA_FENCE_MARGIN_SECONDS,
                                     and more than worker.heartbeat_seconds (5) */
    } ha;

    struct {
        int retention_seconds; /* ops.retention_seconds: finished operations expire (7 d) */
        int events_maxlen;     /* ops.events_maxlen: approximate cap of the events stream
                                  (100000) */
    } ops;

    struct {
        int heartbeat_seconds;       /* scheduler.heartbeat_seconds (2) */
        int request_timeout_ms;      /* scheduler.request_timeout_ms: how long a caller without
                                        a deadline waits for a plan (10000) */
        int claim_idle_ms;           /* scheduler.claim_idle_ms: a request pending this long on
                                        a scheduler is taken over by another (2000) */
        int reservation_ttl_seconds; /* scheduler.reservation_ttl_seconds: a reservation nobody
                                        took over is released after this (600) */
    } scheduler;

    bool test_operations; /* test_operations: accept test.* operation kinds (false) */
} pv_config;

/* What ha.fence_seconds must stay below ha.node_timeout_seconds by: the time an agent may need
 * to notice its fence is due and stop its HA workloads, plus the drift of its clock against
 * Redis's over one timeout (README "HA and node failure"). */
#define PV_HA_FENCE_MARGIN_SECONDS 2

/* Fills c with the defaults above. Returns PV_OK or PV_INTERNAL (out of memory). */
int pv_config_init(pv_config *c, pv_status *st);

/* Sets one dotted key from its text form ("2000", "true", "a,b"). Unknown key, bad number or
 * bad value: PV_INVALID_ARGUMENT naming the key and the value. */
int pv_config_set(pv_config *c, const char *key, const char *value, pv_status *st);

/* Merges a JSON file over c. Missing file, bad JSON (with line and column), unknown key or a
 * value of the wrong type: PV_INVALID_ARGUMENT naming the file and key. */
int pv_config_load_file(pv_config *c, const char *path, pv_status *st);

/* Applies every PIVIRT_* variable of envp (NULL = environ) that names a key. Variables with the
 * PIVIRT_ prefix that name no key are errors (PIVIRT_CONFIG, the file path, is skipped). */
int pv_config_apply_env(pv_config *c, char **envp, pv_status *st);

/* Cross-field checks (auth.username lowercase and with a password, tls key with cert, client
 * CA with both, redis.username with redis.password, positive timeouts and thread counts, at
 * least one listen address). */
int pv_config_validate(const pv_config *c, pv_status *st);

/* The usual start of a program: init, the file (path from --config, else $PIVIRT_CONFIG, else
 * none), the environment, every --set k=v, validate. Recognises and removes "--config FILE" and
 * "--set k=v" from argv (updating *argc); other arguments are left for the program. */
int pv_config_load(pv_config *c, int *argc, char **argv, pv_status *st);

/* Writes the effective configuration as JSON (passwords shown as "***"). Caller frees. */
char *pv_config_dump_json(const pv_config *c);

void pv_config_free(pv_config *c);

#endif
