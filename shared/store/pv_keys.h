/*
 * pv_keys: every Redis key name of pivirt, in one place: the key schema.
 *
 * Every key starts with the configured prefix (redis.prefix, "pv:" by default), so several
 * pivirt systems, or the tests, can share one Redis. The names below are part of the stored
 * data and of the Lua functions (the libraries in shared/store/redis/ build the same names from
 * the bases <p>{ops}:, <p>{reg}:, <p>{sto}:): they never change. <p> = the prefix.
 *
 * Operations (hash tag {ops}: they change together in one function call; pv_op.h):
 *   <p>{ops}:                       the base the op functions take (ARGV[1])
 *   <p>{ops}:op:<id>                hash: the record (pv_op.h), journal fields "j:<step>"
 *   <p>{ops}:q:<queue>              stream: the queue's entries {op, kind}; group "workers"
 *   <p>{ops}:index                  zset: op id -> created ms
 *   <p>{ops}:by-kind:<kind>         zset: the same, for one kind
 *   <p>{ops}:by-target:<target>     zset: the same, for one target
 *   <p>{ops}:delayed                zset: op id -> due ms (retries in backoff)
 *   <p>{ops}:events                 stream: every status change, for operators
 *   <p>{ops}:dead                   stream: dead letters
 *   <p>{ops}:fence                  string counter: fencing tokens
 *   <p>{ops}:lock:<resource>        string: op id holding the resource
 *   <p>{ops}:idem:<request id>      string: op id of a request id (expires)
 *   <p>{ops}:pending-by:<client>    set: unfinished op ids a gateway client submitted
 *   <p>{ops}:out:<id>               stream: the operation's output
 *   <p>{ops}:in:<id>                stream: input sent to a running operation
 *   <p>{ops}:chan:<id>              pub/sub channel: the new status name on every change
 *   <p>{ops}:upload:<id>            string with a TTL: a BuildImage RAW tar its node operation
 *                                   takes (pv_upload.h)
 * Registry (hash tag {reg}; pv_registry.h, pv_workload.h, pv_resv.h, pv_sched.h):
 *   <p>{reg}:                       the base the registry, workload and sched functions take
 *   <p>{reg}:pods                   hash: pod name -> pod id
 *   <p>{reg}:pod:<id>               hash: the pod record
 *   <p>{reg}:pod-nodes:<pod id>     set: the pod's node ids
 *   <p>{reg}:nodes                  hash: node name -> node id
 *   <p>{reg}:node:<id>              hash: the node record
 *   <p>{reg}:node-workloads:<id>    set: workload ids on the node
 *   <p>{reg}:node-allocs:<id>       hash: allocation id -> allocation JSON
 *   <p>{reg}:alive:<node name>      string with a TTL: the node is alive while it exists
 *   <p>{reg}:engine-info:<node>     string with a TTL: the engine info JSON the agent reports
 *   <p>{reg}:engine-inv:<node>      string with a TTL: {"at_ms", "ids"} the engine listed
 *   <p>{reg}:resv:<id>              hash: a reservation
 *   <p>{reg}:resvs                  zset: reservation id -> expires ms
 *   <p>{reg}:deploy-count:<app>:<entry>  hash: node name -> instances reserved there
 *   <p>{reg}:sched:requests         stream: scheduling requests (group PV_SCHED_GROUP)
 *   <p>{reg}:sched:reply:<id>       list: the one reply body of a request (expires)
 *   <p>{reg}:sched:gone:<id>        string: the requester gave up waiting
 *   <p>{reg}:upgrade:<cluster id>   string: the cluster's upgrade record, JSON (pv_upgrade.h)
 *   <p>{reg}:wl:<id>                hash: the workload record
 *   <p>{reg}:wls                    zset: every workload id, score 0
 *   <p>{reg}:app-workloads:<app>    set: the app's workload ids
 *   <p>{reg}:wl-status:<id>         string with an optional TTL: the status JSON
 *   <p>{reg}:wl-deploy:<id>         string: base64 pb.DeployOptions that made the workload
 *   <p>{reg}:dissociated:<id>       string "1": DissociateWorkload forgot the workload
 * Storage (hash tag {sto}; pv_storage.h):
 *   <p>{sto}:pool:<name>            string: the pool record, JSON
 *   <p>{sto}:vol:<id>               string: the volume record, JSON
 *   <p>{sto}:snap:<id>              string: the snapshot record, JSON
 *   <p>{sto}:pools                  zset: pool names
 *   <p>{sto}:pool-vols:<pool>       zset: the pool's volume ids
 *   <p>{sto}:pool-names:<pool>      hash: volume name -> id
 *   <p>{sto}:vol-snaps:<volume id>  zset: the volume's snapshot ids by creation ms
 *   <p>{sto}:vol-user:<volume id>   string: the workload holding the volume
 *   <p>{sto}:wl-vols:<workload id>  set: the workload's volume ids
 * Presence (TTL'd keys of live processes; pv_presence.h):
 *   <p>presence:<kind>:<instance>   string (JSON about the process), expires
 *   <p>presence:<kind>              zset: instance -> expiry (ms), the live index
 * kinds: gateway, worker, scheduler, agent (instance = node name for an agent).
 * Test operation kinds (workers/runtime/wk_test_kinds.h; the tests read them):
 *   <p>test:runs:<name>             string counter: deliveries of the test kinds that ran
 *
 * A key of a kind that takes a name with name "" is the kind's prefix (what a SCAN pattern or a
 * keyspace subscription starts from); name "*" makes the pattern itself.
 *
 * Functions write into a caller buffer and return PV_OK, or PV_INVALID_ARGUMENT "key name longer
 * than N bytes" when the name does not fit (PV_KEY_MAX is plenty for validated names);
 * pv_key_new and pv_key_add make a malloc'd name of any length (alone, or appended to a string
 * vector).
 */
#ifndef PV_KEYS_H
#define PV_KEYS_H

#include <stdbool.h>
#include <stddef.h>

#include "pv_status.h"
#include "pv_strv.h"

#define PV_KEY_MAX 256
#define PV_KEY_PREFIX_MAX 64

typedef struct pv_keys {
    char prefix[PV_KEY_PREFIX_MAX];
} pv_keys;

typedef enum pv_key_kind {
    PV_KEY_OPS,
    PV_KEY_OP,
    PV_KEY_OP_QUEUE,
    PV_KEY_OP_INDEX,
    PV_KEY_OP_BY_KIND,
    PV_KEY_OP_BY_TARGET,
    PV_KEY_OP_DELAYED,
    PV_KEY_OP_EVENTS,
    PV_KEY_OP_DEAD,
    PV_KEY_OP_FENCE,
    PV_KEY_OP_LOCK,
    PV_KEY_OP_IDEM,
    PV_KEY_OP_PENDING_BY,
    PV_KEY_OP_OUT,
    PV_KEY_OP_IN,
    PV_KEY_OP_CHAN,
    PV_KEY_OP_UPLOAD,
    PV_KEY_REG,
    PV_KEY_PODS,
    PV_KEY_POD,
    PV_KEY_POD_NODES,
    PV_KEY_NODES,
    PV_KEY_NODE,
    PV_KEY_NODE_WORKLOADS,
    PV_KEY_NODE_ALLOCS,
    PV_KEY_ALIVE,
    PV_KEY_ENGINE_INFO,
    PV_KEY_ENGINE_INV,
    PV_KEY_RESV,
    PV_KEY_RESVS,
    PV_KEY_DEPLOY_COUNT, /* two names: <app>:<entry> */
    PV_KEY_SCHED_REQUESTS,
    PV_KEY_SCHED_REPLY,
    PV_KEY_SCHED_GONE,
    PV_KEY_UPGRADE,
    PV_KEY_WL,
    PV_KEY_WLS,
    PV_KEY_APP_WORKLOADS,
    PV_KEY_WL_STATUS,
    PV_KEY_WL_DEPLOY,
    PV_KEY_DISSOCIATED,
    PV_KEY_POOL,
    PV_KEY_VOL,
    PV_KEY_SNAP,
    PV_KEY_POOLS,
    PV_KEY_POOL_VOLS,
    PV_KEY_POOL_NAMES,
    PV_KEY_VOL_SNAPS,
    PV_KEY_VOL_USER,
    PV_KEY_WL_VOLS,
    PV_KEY_PRESENCE,       /* two names: <kind>:<instance> */
    PV_KEY_PRESENCE_INDEX, /* presence:<kind> */
    PV_KEY_TEST_RUNS,
    PV_KEY_KIND_COUNT
} pv_key_kind;

/* prefix: printable, no spaces, at most PV_KEY_PREFIX_MAX-1 bytes (may be empty). */
int pv_keys_init(pv_keys *k, const char *prefix, pv_status *st);

/* How many names a kind takes after its stem: 0 (a fixed key), 1 or 2 (joined by ':'). */
int pv_key_arity(pv_key_kind kind);

/* The key of `kind` named `name` (ignored by fixed keys; NULL is ""). A two-name kind takes
 * pv_key2. INVALID_ARGUMENT when it does not fit in len bytes or kind is unknown. */
int pv_key(const pv_keys *k, pv_key_kind kind, const char *name, char *buf, size_t len,
           pv_status *st);
int pv_key2(const pv_keys *k, pv_key_kind kind, const char *a, const char *b, char *buf, size_t len,
            pv_status *st);

/* The key (one name) as a new string the caller frees; NULL out of memory (or unknown kind). */
char *pv_key_new(const pv_keys *k, pv_key_kind kind, const char *name);

/* Appends pv_key_new's key to out: 0, or -1 out of memory (out->oom set). */
int pv_key_add(const pv_keys *k, pv_key_kind kind, const char *name, pv_strv *out);

/* The keyspace-notification pattern of every key of a one-name kind in database db:
 * "__keyspace@<db>__:<the kind's prefix, glob characters escaped>*". */
int pv_key_keyspace_pattern(const pv_keys *k, pv_key_kind kind, int db, char *buf, size_t len,
                            pv_status *st);

int pv_key_presence(const pv_keys *k, const char *kind, const char *instance, char *buf, size_t len,
                    pv_status *st);
int pv_key_presence_index(const pv_keys *k, const char *kind, char *buf, size_t len, pv_status *st);

#endif
