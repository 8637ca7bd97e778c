/*
 * pvcli: the operator's command line for pivirt's APIs.
 *
 *   pvcli [--endpoint HOST:PORT] [-o table|json] [-q] [--detach] [--timeout S] NOUN VERB [ARGS]
 *         [--FIELD VALUE]...
 *
 * Every command is one RPC. Its request is built from the command's positional arguments and
 * from --FIELD flags named after the request message's fields (dashes for underscores, dots
 * into nested messages: --strategy.type canary), typed by the message's descriptor: sizes
 * accept 100G or 512MiB on *_bytes fields, enums their value names or a short suffix (qcow2),
 * maps KEY=VALUE (repeatable), repeated fields repeat. The answer prints as a table (lists), as
 * "field: value" lines (one resource), or with -o json as the protobuf JSON mapping (one object
 * per line for lists); -q prints a list's first column alone (the ids a later command takes:
 * pvcli workload logs $(pvcli -q workload list APP | head -n 1)). Calls that start an operation
 * wait for it with a live progress line, unless --detach; Ctrl-C while waiting only detaches.
 *
 * Exit codes: 0 done; 1 the server said no (its status and message printed), the operation
 * failed, or any item of a stream failed (a deploy's instance, an image on a node: its message
 * says success false or carries an error, a workload's output an error in place of its lines);
 * 2 usage. `workload exec` exits with the command's own status, 1 when none came (it did not
 * run: an unknown workload, say, whose error is the stream's data).
 */
#include <ctype.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_archive.h"
#include "cli_rpc.h"
#include "pb/core.pb-c.h"
#include "pivirt/cluster/v1/cluster.pb-c.h"
#include "pivirt/operations/v1/operations.pb-c.h"
#include "pivirt/storage/v1/storage.pb-c.h"
#include "pv_b64.h"
#include "pv_pbjson.h"
#include "pv_res.h"

#define CLUSTER "/pivirt.cluster.v1.ClusterService/"
#define STORAGE "/pivirt.storage.v1.StorageService/"
#define OPS "/pivirt.operations.v1.OperationService/"
#define CORE "/pb.CoreRPC/"

typedef struct command {
    const char *noun, *verb, *method;
    const ProtobufCMessageDescriptor *req, *resp;
    const char *positional[3]; /* request fields the positional arguments fill, in order */
    const char *columns;       /* table columns (response fields), for lists */
    bool waits;                /* answers an Operation to follow */
    const char *help;
    const char *list_field; /* a unary answer whose repeated field holds the table's rows */
    const char *raw_field;  /* bytes printed as they are, one message after another (logs) */
    bool live;              /* each message printed as it comes (watch) */
    /* builds the request from the positional arguments itself (image build: NAME:TAG DIR) */
    int (*prepare)(json_t *req, char *const *args, size_t n, char *err, size_t cap);
} command;

static int prepare_build(json_t *req, char *const *args, size_t n, char *err, size_t cap);

#define D(x) &pivirt__cluster__v1__##x##__descriptor
#define S(x) &pivirt__storage__v1__##x##__descriptor
#define O(x) &pivirt__operations__v1__##x##__descriptor
#define E(x) &pb__##x##__descriptor

// clang-format off
static const command k_commands[] = {
    {"cluster", "create", CLUSTER "CreateCluster", D(create_cluster_request), D(cluster), {"name"}, NULL, false,
     "create a cluster: NAME --version vX.Y.Z"},
    {"cluster", "get", CLUSTER "GetCluster", D(get_cluster_request), D(cluster), {"cluster_id"}, NULL, false,
     "show a cluster: CLUSTER"},
    {"cluster", "list", CLUSTER "ListClusters", D(list_clusters_request), D(cluster), {NULL}, "name,status,version,created_at", false,
     "list clusters [--labels K=V]"},
    {"cluster", "update", CLUSTER "UpdateCluster", D(update_cluster_request), D(cluster), {"cluster_id"}, NULL, false,
     "change labels, annotations, topology: CLUSTER"},
    {"cluster", "delete", CLUSTER "DeleteCluster", D(delete_cluster_request), O(operation), {"cluster_id"}, NULL, true,
     "delete a cluster and its nodes: CLUSTER [--force]"},
    {"cluster", "health", CLUSTER "GetHealth", D(get_health_request), D(cluster_health), {"cluster_id"}, NULL, false,
     "health of the control plane and the nodes: CLUSTER"},
    {"cluster", "metrics", CLUSTER "GetMetrics", D(get_metrics_request), D(cluster_metrics), {"cluster_id"}, NULL, false,
     "a cluster's figures: CLUSTER"},
    {"cluster", "upgrade", CLUSTER "UpgradeCluster", D(upgrade_cluster_request), O(operation), {"cluster_id", "target_version"}, NULL, true,
     "upgrade: CLUSTER VERSION [--strategy.type rolling|canary|blue-green] [--strategy.max-unavailable N] [--strategy.partition N]"},
    {"cluster", "upgrade-status", CLUSTER "GetUpgradeStatus", D(get_upgrade_status_request), D(upgrade_status), {"cluster_id"}, NULL, false,
     "the current or last upgrade: CLUSTER"},
    {"node", "add", CLUSTER "AddNode", D(add_node_request), D(node), {"cluster_id", "name"}, NULL, false,
     "add a node: CLUSTER NAME --role worker --ip ADDR"},
    {"node", "get", CLUSTER "GetNode", D(get_node_request), D(node), {"cluster_id", "node_id"}, NULL, false,
     "show a node: CLUSTER NODE"},
    {"node", "list", CLUSTER "ListNodes", D(list_nodes_request), D(node), {"cluster_id"}, "name,role,status,ip,created_at", false,
     "list nodes: [CLUSTER] [--role R] [--status S]"},
    {"node", "remove", CLUSTER "RemoveNode", D(remove_node_request), O(operation), {"cluster_id", "node_id"}, NULL, true,
     "drain and remove a node: CLUSTER NODE [--force]"},
    {"node", "drain", CLUSTER "DrainNode", D(drain_node_request), O(operation), {"cluster_id", "node_id"}, NULL, true,
     "move every workload off a node: CLUSTER NODE [--grace-period-seconds N] [--ignore-daemonsets] [--force]"},
    {"node", "cordon", CLUSTER "CordonNode", D(cordon_node_request), O(operation), {"cluster_id", "node_id"}, NULL, true,
     "take a node out of scheduling: CLUSTER NODE"},
    {"node", "uncordon", CLUSTER "UncordonNode", D(uncordon_node_request), O(operation), {"cluster_id", "node_id"}, NULL, true,
     "put a node back into scheduling: CLUSTER NODE"},
    {"pool", "create", STORAGE "CreatePool", S(create_pool_request), S(storage_pool), {"name"}, NULL, false,
     "create a pool: NAME --type dir --config path=/srv/pool"},
    {"pool", "get", STORAGE "GetPool", S(get_pool_request), S(storage_pool), {"name"}, NULL, false,
     "show a pool: NAME"},
    {"pool", "list", STORAGE "ListPools", S(list_pools_request), S(storage_pool), {NULL}, "name,type,status,capacity_bytes,used_bytes,available_bytes", false,
     "list pools [--type T]"},
    {"pool", "delete", STORAGE "DeletePool", S(delete_pool_request), NULL, {"name"}, NULL, false,
     "delete an empty pool: NAME"},
    {"pool", "stats", STORAGE "GetPoolStats", S(get_pool_stats_request), S(pool_stats), {"name"}, NULL, false,
     "a pool's figures: NAME"},
    {"volume", "create", STORAGE "CreateVolume", S(create_volume_request), S(volume), {"name"}, NULL, false,
     "create a volume: NAME --pool P --size-bytes 100G --format qcow2"},
    {"volume", "get", STORAGE "GetVolume", S(get_volume_request), S(volume), {"id"}, NULL, false,
     "show a volume: ID|NAME"},
    {"volume", "list", STORAGE "ListVolumes", S(list_volumes_request), S(volume), {"pool"}, "id,name,pool,size_bytes,used_bytes,format,status", false,
     "list volumes: [POOL] [--labels K=V]"},
    {"volume", "resize", STORAGE "ResizeVolume", S(resize_volume_request), S(volume), {"id", "new_size_bytes"}, NULL, false,
     "grow a volume: ID|NAME SIZE"},
    {"volume", "clone", STORAGE "CloneVolume", S(clone_volume_request), S(volume), {"source_id", "name"}, NULL, false,
     "sparse copy: SOURCE NAME [--pool P]"},
    {"volume", "delete", STORAGE "DeleteVolume", S(delete_volume_request), NULL, {"id"}, NULL, false,
     "delete a volume: ID|NAME"},
    {"snapshot", "create", STORAGE "CreateSnapshot", S(create_snapshot_request), S(snapshot), {"volume_id", "name"}, NULL, false,
     "snapshot a qcow2 volume: VOLUME NAME"},
    {"snapshot", "get", STORAGE "GetSnapshot", S(get_snapshot_request), S(snapshot), {"id"}, NULL, false,
     "show a snapshot: ID"},
    {"snapshot", "list", STORAGE "ListSnapshots", S(list_snapshots_request), S(snapshot), {"volume_id"}, "id,name,parent_snapshot_id,size_bytes,status,created_at", false,
     "a volume's snapshot tree, parents first: VOLUME"},
    {"snapshot", "restore", STORAGE "RestoreSnapshot", S(restore_snapshot_request), O(operation), {"snapshot_id"}, NULL, true,
     "restore a volume to a snapshot: ID"},
    {"snapshot", "delete", STORAGE "DeleteSnapshot", S(delete_snapshot_request), NULL, {"id"}, NULL, false,
     "delete a snapshot (its children take its parent): ID"},
    {"op", "get", OPS "GetOperation", O(get_operation_request), O(operation), {"id"}, NULL, false,
     "show an operation: ID"},
    {"op", "list", OPS "ListOperations", O(list_operations_request), O(operation), {NULL}, "id,kind,status,progress_percent,message,created_at", false,
     "list operations [--kind K] [--target T] [--status S]"},
    {"op", "wait", OPS "GetOperation", O(get_operation_request), O(operation), {"id"}, NULL, true,
     "wait for an operation to end: ID"},
    {"op", "cancel", OPS "CancelOperation", O(cancel_operation_request), O(operation), {"id"}, NULL, false,
     "cancel an operation: ID"},
    {"op", "watch", OPS "WatchOperation", O(watch_operation_request), O(operation), {"id"}, "status,progress_percent,message", false,
     "every change of an operation as it happens: ID", NULL, NULL, true},
    {"pod", "add", CORE "AddPod", E(add_pod_options), E(pod), {"name"}, NULL, false,
     "add an Eru pod: NAME [--desc TEXT]"},
    {"pod", "get", CORE "GetPod", E(get_pod_options), E(pod), {"name"}, NULL, false,
     "show a pod: NAME"},
    {"pod", "list", CORE "ListPods", E(empty), E(pods), {NULL}, "name,desc", false,
     "list pods", "pods"},
    {"pod", "remove", CORE "RemovePod", E(remove_pod_options), NULL, {"name"}, NULL, false,
     "remove an empty pod: NAME"},
    {"workload", "deploy", CORE "CreateWorkload", E(deploy_options), E(create_workload_message), {"name"}, "id,name,nodename,success,error", false,
     "deploy: APP --podname P --image I --count N --entrypoint.name E --entrypoint.commands ARG (repeat) --resources cpumem=JSON"},
    {"workload", "list", CORE "ListWorkloads", E(list_workloads_options), E(workload), {"appname"}, "id,name,nodename,podname,image", false,
     "list workloads: [APP] [--nodename N] [--labels K=V]"},
    {"workload", "get", CORE "GetWorkload", E(workload_id), E(workload), {"id"}, NULL, false,
     "show a workload: ID"},
    {"workload", "remove", CORE "RemoveWorkload", E(remove_workload_options), E(remove_workload_message), {"IDs"}, "id,success,hook", false,
     "remove workloads: ID... [--force]"},
    {"workload", "logs", CORE "LogStream", E(log_stream_options), E(log_stream_message), {"id"}, NULL, false,
     "a workload's output: ID [--tail N|all] [--follow] [--since T]", NULL, "data"},
    {"workload", "exec", CORE "ExecuteWorkload", E(execute_workload_options), E(attach_workload_message), {"workload_id", "commands"}, NULL, false,
     "run a command in a running workload: ID CMD [ARG]... [--envs K=V] [--workdir D]", NULL, "data"},
    {"image", "build", CORE "BuildImage", E(build_image_options), E(build_image_message), {NULL}, "id,status,progress,error", false,
     "build an image from a directory or a tar (BuildImage RAW): NAME:TAG DIR|TAR", NULL, NULL, false, prepare_build},
    {"image", "list", CORE "ListImage", E(list_image_options), E(list_image_message), {"podname"}, "nodename,tags,id,err", false,
     "the images on a pod's nodes: POD [--nodenames N] [--filter GLOB]", "images"},
    {"image", "cache", CORE "CacheImage", E(cache_image_options), E(cache_image_message), {"podname", "images"}, "image,nodename,success,message", false,
     "copy images from the registry onto a pod's nodes: POD IMAGE... [--nodenames N]"},
    {"image", "remove", CORE "RemoveImage", E(remove_image_options), E(remove_image_message), {"podname", "images"}, "image,success,messages", false,
     "remove images from a pod's nodes: POD IMAGE... [--nodenames N] [--prune]"},
    {"capacity", "calc", CORE "CalculateCapacity", E(deploy_options), E(capacity_message), {"name"}, NULL, false,
     "how many instances fit and where: APP --podname P --entrypoint.name E --resources cpumem=JSON"},
};
// clang-format on
#define N_COMMANDS (sizeof k_commands / sizeof k_commands[0])

/* ---- options ---- */

typedef struct opts {
    const char *endpoint, *output, *tls_ca, *tls_cert, *tls_key, *user, *password;
    bool detach, quiet;
    int timeout_s;
} opts;

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *f, const char *noun) {
    if (!noun)
        fprintf(
            f, "usage: pvcli [--endpoint HOST:PORT] [-o table|json] [-q] [--detach] [--timeout S]\n"
               "             NOUN VERB [ARGS] [--FIELD VALUE]...\n\n"
               "Endpoint: --endpoint or PIVIRT_ENDPOINT (localhost:8443). Auth: --user/--password\n"
               "or PIVIRT_USER/PIVIRT_PASSWORD. TLS: --tls-ca FILE or PIVIRT_TLS_CA; a client\n"
               "certificate (mutual TLS): --tls-cert FILE --tls-key FILE or PIVIRT_TLS_CERT,\n"
               "PIVIRT_TLS_KEY.\n"
               "Output: tables, or -o json; -q prints a list's first column alone (its ids).\n"
               "Exit codes: 0 done, 1 the server said no (or the operation failed, or an item\n"
               "of a stream did), 2 usage; workload exec: the command's own.\n\n"
               "Nouns: cluster, node, pool, volume, snapshot, op, pod, workload, image, capacity\n"
               "(pvcli NOUN --help).\n");
    const char *last = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const command *c = &k_commands[i];
        if (noun && strcmp(noun, c->noun) != 0) continue;
        if (!noun && last && strcmp(last, c->noun) == 0) continue;
        if (noun) fprintf(f, "  pvcli %s %-15s %s\n", c->noun, c->verb, c->help);
        last = c->noun;
    }
    if (noun)
        fprintf(f, "\nAny field of the request message is also a flag: --field-name VALUE "
                   "(nested: --a.b VALUE).\n");
}

/* ---- building the request ---- */

static const ProtobufCFieldDescriptor *field_named(const ProtobufCMessageDescriptor *d,
                                                   const char *name) {
    for (unsigned i = 0; i < d->n_fields; i++)
        if (strcmp(d->fields[i].name, name) == 0) return &d->fields[i];
    return NULL;
}

/* An enum value by its name, or by a case-insensitive suffix ("qcow2" for
 * VOLUME_FORMAT_QCOW2, "blue-green" for UPGRADE_TYPE_BLUE_GREEN). */
static const char *enum_value(const ProtobufCEnumDescriptor *e, const char *text) {
    char want[128];
    size_t n = 0;
    for (; text[n] && n + 1 < sizeof want; n++)
        want[n] = text[n] == '-' ? '_' : (char)toupper((unsigned char)text[n]);
    want[n] = '\0';
    const char *found = NULL;
    for (unsigned i = 0; i < e->n_values; i++) {
        const char *name = e->values[i].name;
        size_t len = strlen(name);
        if (strcmp(name, want) == 0) return name;
        if (len > n && name[len - n - 1] == '_' && strcmp(name + len - n, want) == 0) {
            if (found) return NULL; /* ambiguous */
            found = name;
        }
    }
    return found;
}

/* A map field's KEY=VALUE into its JSON object (map<string, bytes>: the text as its bytes). */
static int put_map_entry(json_t *req, const ProtobufCFieldDescriptor *f, const char *path,
                         const char *value, char *err, size_t errlen) {
    const char *eq = strchr(value, '=');
    if (!eq) {
        snprintf(err, errlen, "--%s: want KEY=VALUE, not \"%s\"", path, value);
        return -1;
    }
    json_t *obj = json_object_get(req, f->name);
    if (!obj) json_object_set_new(req, f->name, obj = json_object());
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)(eq - value), value);
    const ProtobufCMessageDescriptor *ed = f->descriptor;
    if (ed->n_fields == 2 && ed->fields[1].type == PROTOBUF_C_TYPE_BYTES) {
        char *b64 = NULL;
        pv_status st;
        if (pv_b64_encode(eq + 1, strlen(eq + 1), &b64, &st) != PV_OK) return -1;
        json_object_set_new(obj, key, json_string(b64));
        free(b64);
    } else {
        json_object_set_new(obj, key, json_string(eq + 1));
    }
    return 0;
}

/* An integer field's value: sizes (100G, 512MiB) on *_bytes fields, else a plain integer. */
static json_t *integer_value(const ProtobufCFieldDescriptor *f, const char *path, const char *value,
                             char *err, size_t errlen) {
    size_t n = strlen(f->name);
    bool bytes = n > 6 && strcmp(f->name + n - 6, "_bytes") == 0;
    int64_t x = 0;
    pv_status st;
    if (bytes && pv_res_size_parse(value, &x, &st) == PV_OK) return json_integer(x);
    char *end;
    long long y = strtoll(value, &end, 10);
    if (!*value || *end) {
        snprintf(err, errlen, "--%s: \"%s\" is not %s", path, value,
                 bytes ? "a size (100G, 512MiB, bytes)" : "an integer");
        return NULL;
    }
    return json_integer(y);
}

/* VALUE (text) as the JSON of a scalar field of f's type; NULL with err set when it is not one. */
static json_t *scalar_value(const ProtobufCFieldDescriptor *f, const char *path, const char *value,
                            char *err, size_t errlen) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        if (strcmp(value, "true") && strcmp(value, "false")) {
            snprintf(err, errlen, "--%s: want true or false, not \"%s\"", path, value);
            return NULL;
        }
        return json_boolean(strcmp(value, "true") == 0);
    case PROTOBUF_C_TYPE_ENUM: {
        const char *name_of = enum_value(f->descriptor, value);
        if (!name_of)
            snprintf(err, errlen, "--%s: \"%s\" is not a value of %s", path, value,
                     ((const ProtobufCEnumDescriptor *)f->descriptor)->name);
        return name_of ? json_string(name_of) : NULL;
    }
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SINT64:
        return integer_value(f, path, value, err, errlen);
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_FLOAT:
        return json_real(strtod(value, NULL));
    default:
        return json_string(value);
    }
}

/* Puts VALUE (text) for the field path (dotted) into the request JSON, typed by descriptor. */
static int put_field(json_t *req, const ProtobufCMessageDescriptor *d, const char *path,
                     const char *value, char *err, size_t errlen) {
    char name[128];
    const char *dot = strchr(path, '.');
    snprintf(name, sizeof name, "%.*s", (int)(dot ? dot - path : (long)strlen(path)), path);
    for (char *p = name; *p; p++)
        if (*p == '-') *p = '_';
    const ProtobufCFieldDescriptor *f = field_named(d, name);
    if (!f) {
        snprintf(err, errlen, "--%s: %s has no field %s", path, d->name, name);
        return -1;
    }
    if (dot) {
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
            snprintf(err, errlen, "--%s: %s is not a message", path, name);
            return -1;
        }
        json_t *sub = json_object_get(req, f->name);
        if (!sub) json_object_set_new(req, f->name, sub = json_object());
        return put_field(sub, f->descriptor, dot + 1, value, err, errlen);
    }
    if (f->label == PROTOBUF_C_LABEL_REPEATED && f->type == PROTOBUF_C_TYPE_MESSAGE)
        return put_map_entry(req, f, path, value, err, errlen);
    json_t *v = scalar_value(f, path, value, err, errlen);
    if (!v) return -1;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        json_t *arr = json_object_get(req, f->name);
        if (!arr) json_object_set_new(req, f->name, arr = json_array());
        json_array_append_new(arr, v);
    } else {
        json_object_set_new(req, f->name, v);
    }
    return 0;
}

/* ---- output ---- */

static void human_size(double b, char *out, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (b >= 1024 && u < 5) {
        b /= 1024;
        u++;
    }
    if (u == 0 || b >= 100 || b == (long long)b)
        snprintf(out, cap, "%.0f %s", b, units[u]);
    else
        snprintf(out, cap, "%.1f %s", b, units[u]);
}

static void human_age(const char *rfc3339, char *out, size_t cap) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    if (!strptime(rfc3339, "%Y-%m-%dT%H:%M:%S", &tm)) {
        snprintf(out, cap, "%s", rfc3339);
        return;
    }
    long long age = (long long)(time(NULL) - timegm(&tm));
    if (age < 0) age = 0;
    if (age < 120)
        snprintf(out, cap, "%llds", age);
    else if (age < 7200)
        snprintf(out, cap, "%lldm", age / 60);
    else if (age < 172800)
        snprintf(out, cap, "%lldh", age / 3600);
    else
        snprintf(out, cap, "%lldd", age / 86400);
}

/* One field's value for people: sizes in binary units, enums without their type's prefix,
 * times as ages, maps as k=v lists. */
static void human(const char *field, json_t *v, char *out, size_t cap) {
    size_t n = strlen(field);
    const char *s = json_string_value(v);
    if (n > 6 && strcmp(field + n - 6, "_bytes") == 0 && (s || json_is_integer(v))) {
        human_size(s ? strtod(s, NULL) : (double)json_integer_value(v), out, cap);
    } else if (n > 3 && strcmp(field + n - 3, "_at") == 0 && s) {
        human_age(s, out, cap);
    } else if (s && isupper((unsigned char)s[0]) && strchr(s, '_')) {
        /* an enum: VOLUME_STATUS_READY -> READY (its type's words are dropped) */
        static const char *const types[] = {
            "CLUSTER_STATUS_",    "NODE_STATUS_",   "NODE_ROLE_",     "POOL_TYPE_",
            "POOL_STATUS_",       "VOLUME_FORMAT_", "VOLUME_STATUS_", "SNAPSHOT_STATUS_",
            "OPERATION_STATUS_",  "HEALTH_STATUS_", "UPGRADE_PHASE_", "UPGRADE_TYPE_",
            "NODE_UPGRADE_STATE_"};
        const char *shown = s;
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            if (strncmp(s, types[i], strlen(types[i])) == 0) shown = s + strlen(types[i]);
        snprintf(out, cap, "%s", shown);
    } else if (s) {
        snprintf(out, cap, "%s", s);
    } else if (json_is_object(v)) {
        size_t used = 0;
        const char *k;
        json_t *x;
        out[0] = '\0';
        json_object_foreach(v, k, x) {
            if (!json_is_string(x)) {
                char *t = json_dumps(v, JSON_COMPACT);
                snprintf(out, cap, "%s", t ? t : "");
                free(t);
                return;
            }
            int w = snprintf(out + used, cap - used, "%s%s=%s", used ? "," : "", k,
                             json_string_value(x));
            if (w < 0 || (size_t)w >= cap - used) break;
            used += (size_t)w;
        }
    } else if (json_is_array(v) && json_is_string(json_array_get(v, 0))) {
        size_t used = 0, k;
        json_t *x;
        out[0] = '\0';
        json_array_foreach(v, k, x) { /* tags, messages: a, b */
            int w = snprintf(out + used, cap - used, "%s%s", k ? "," : "", json_string_value(x));
            if (w < 0 || (size_t)w >= cap - used) break;
            used += (size_t)w;
        }
    } else {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        snprintf(out, cap, "%s", t ? t : "");
        free(t);
    }
}

/* ---- images ---- */

/* image build NAME:TAG DIR|TAR: BuildImage RAW with the directory archived (or the archive as
 * it is), the tag after the last ':' past the last '/' ("latest" without one). */
static int prepare_build(json_t *req, char *const *args, size_t n, char *err, size_t cap) {
    if (n != 2) {
        snprintf(err, cap, "image build: want NAME:TAG and a directory or tar file");
        return -1;
    }
    char name[512];
    snprintf(name, sizeof name, "%s", args[0]);
    char *slash = strrchr(name, '/'), *colon = strrchr(name, ':');
    const char *tag = "latest";
    if (colon && (!slash || colon > slash)) {
        *colon = '\0';
        tag = colon + 1;
    }
    unsigned char *tar = NULL;
    size_t len = 0;
    char *b64 = NULL;
    pv_status st;
    if (cli_archive_load(args[1], &tar, &len, err, cap) != 0) return -1;
    int rc = pv_b64_encode(tar, len, &b64, &st);
    free(tar);
    if (rc != PV_OK) {
        snprintf(err, cap, "%s", st.msg);
        return -1;
    }
    json_object_set_new(req, "name", json_string(name));
    json_object_set_new(req, "tags", json_pack("[s]", tag));
    json_object_set_new(req, "build_method", json_string("RAW"));
    json_object_set_new(req, "tar", json_string(b64));
    free(b64);
    return 0;
}

typedef struct printer {
    const command *cmd;
    const opts *o;
    json_t *rows; /* table output: every message first, printed at the end */
    json_t *last; /* the last message (an Operation to follow) */
    int n;
    int failed;    /* messages that report an item's failure */
    int exit_code; /* exec: the command's status ("[exitcode] N"), -1 before it came */
} printer;

#define EXIT_PREFIX "[exitcode] "

/* Whether a stream message reports its item failed: a bool `success` not true, or a
 * non-empty `error`/`err` string. */
static bool item_failed(const ProtobufCMessageDescriptor *d, json_t *j) {
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        json_t *v = json_object_get(j, f->name);
        if (f->type == PROTOBUF_C_TYPE_BOOL && strcmp(f->name, "success") == 0 && !json_is_true(v))
            return true;
        if (f->type == PROTOBUF_C_TYPE_STRING &&
            (strcmp(f->name, "error") == 0 || strcmp(f->name, "err") == 0) &&
            json_string_length(v) > 0)
            return true;
    }
    return false;
}

/* A raw message: its bytes as they are, but for exec's closing "[exitcode] N", which becomes
 * pvcli's own exit status. */
static void print_raw(printer *p, const ProtobufCMessage *m) {
    for (unsigned i = 0; i < m->descriptor->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &m->descriptor->fields[i];
        if (strcmp(f->name, p->cmd->raw_field) != 0 || f->type != PROTOBUF_C_TYPE_BYTES) continue;
        const ProtobufCBinaryData *b = (const void *)((const char *)m + f->offset);
        size_t pre = strlen(EXIT_PREFIX);
        if (p->cmd->resp == E(attach_workload_message) && b->len > pre && b->len < pre + 12 &&
            memcmp(b->data, EXIT_PREFIX, pre) == 0) {
            char code[16];
            snprintf(code, sizeof code, "%.*s", (int)(b->len - pre), (const char *)b->data + pre);
            p->exit_code = atoi(code) & 0xff;
            continue;
        }
        if (b->len) fwrite(b->data, 1, b->len, stdout);
        /* LogStream sends lines without their newline; exec sends the output as it comes */
        if (p->cmd->resp == E(log_stream_message) && b->len && b->data[b->len - 1] != '\n')
            putchar('\n');
        fflush(stdout);
    }
}

/* The rows of a message's repeated field, each with the message's own scalar fields it lacks
 * (ListImage: each image with its node). */
static void add_list_rows(printer *p, json_t *j) {
    json_t *rows = json_object_get(j, p->cmd->list_field);
    size_t k;
    json_t *row;
    json_array_foreach(rows, k, row) {
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            if (!json_is_array(v) && !json_is_object(v) && !json_object_get(row, key))
                json_object_set(row, key, v);
        }
        if (strcmp(p->o->output, "json") == 0) {
            char *t = json_dumps(row, JSON_COMPACT);
            printf("%s\n", t ? t : "{}");
            free(t);
        } else {
            json_array_append(p->rows, row);
        }
    }
    if (json_array_size(rows) == 0 && json_string_length(json_object_get(j, "err")) > 0)
        json_array_append(p->rows, j); /* a node that answered only an error */
}

/* A raw stream's message that carries an error instead of output (LogStream of an unknown
 * workload): a failed item, told on stderr. */
static void raw_error(printer *p, const ProtobufCMessage *m) {
    const ProtobufCFieldDescriptor *e =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "error");
    const ProtobufCFieldDescriptor *id =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "id");
    if (!e || e->type != PROTOBUF_C_TYPE_STRING) return;
    const char *text = *(char *const *)(const void *)((const char *)m + e->offset);
    if (!text || !*text) return;
    const char *who = id && id->type == PROTOBUF_C_TYPE_STRING
                          ? *(char *const *)(const void *)((const char *)m + id->offset)
                          : NULL;
    fprintf(stderr, "pvcli: %s: %s\n", who && *who ? who : "error", text);
    p->n++;
    p->failed++;
}

static int on_message(void *arg, const uint8_t *data, size_t len) {
    printer *p = arg;
    if (!p->cmd->resp) return 0;
    ProtobufCMessage *m = protobuf_c_message_unpack(p->cmd->resp, NULL, len, data);
    if (!m) {
        fprintf(stderr, "pvcli: an answer that is not a %s\n", p->cmd->resp->name);
        return 1;
    }
    if (p->cmd->raw_field) { /* the bytes as they are: a workload's output */
        print_raw(p, m);
        raw_error(p, m);
        protobuf_c_message_free_unpacked(m, NULL);
        return 0;
    }
    json_t *j = pv_pbjson_to_json(m);
    protobuf_c_message_free_unpacked(m, NULL);
    p->n++;
    if (j && item_failed(p->cmd->resp, j)) p->failed++;
    if (p->cmd->live && strcmp(p->o->output, "table") == 0) {
        char status[64];
        human("status", json_object_get(j, "status"), status, sizeof status);
        printf("[%3d%%] %-10s %s\n",
               (int)json_integer_value(json_object_get(j, "progress_percent")), status,
               json_string_value(json_object_get(j, "message")));
        fflush(stdout);
        json_decref(j);
        return 0;
    }
    if (p->cmd->list_field) { /* the rows are a repeated field of the answer */
        add_list_rows(p, j);
        json_decref(j);
        return 0;
    }
    if (p->cmd->columns) {
        if (strcmp(p->o->output, "json") == 0) {
            char *t = json_dumps(j, JSON_COMPACT);
            printf("%s\n", t ? t : "{}");
            free(t);
            json_decref(j);
        } else {
            json_array_append_new(p->rows, j);
        }
        return 0;
    }
    json_decref(p->last);
    p->last = j;
    return 0;
}

static void print_table(const char *columns, json_t *rows) {
    char cols[512];
    snprintf(cols, sizeof cols, "%s", columns);
    const char *names[16];
    size_t nc = 0;
    for (char *save = NULL, *t = strtok_r(cols, ",", &save); t && nc < 16;
         t = strtok_r(NULL, ",", &save))
        names[nc++] = t;
    size_t nr = json_array_size(rows);
    char **cells = calloc((nr + 1) * nc, sizeof *cells);
    size_t width[16] = {0};
    for (size_t c = 0; cells && c < nc; c++) {
        char head[64];
        size_t k = 0;
        const char *from = names[c];
        const char *alias = strcmp(from, "created_at") == 0 ? "AGE" : NULL;
        for (; from[k] && k + 1 < sizeof head; k++)
            head[k] = from[k] == '_' ? ' ' : (char)toupper((unsigned char)from[k]);
        head[k] = '\0';
        char *end = strstr(head, " BYTES");
        if (end) *end = '\0';
        cells[c] = strdup(alias ? alias : head);
        width[c] = strlen(cells[c]);
        for (size_t r = 0; r < nr; r++) {
            char buf[512];
            json_t *v = json_object_get(json_array_get(rows, r), names[c]);
            if (v) human(names[c], v, buf, sizeof buf);
            if (!v || !buf[0]) snprintf(buf, sizeof buf, "-"); /* columns stay aligned */
            cells[(r + 1) * nc + c] = strdup(buf);
            size_t w = strlen(buf);
            if (w > width[c]) width[c] = w;
        }
    }
    for (size_t r = 0; cells && r <= nr; r++) {
        for (size_t c = 0; c < nc; c++)
            printf(c + 1 < nc ? "%-*s  " : "%-*s", c + 1 < nc ? (int)width[c] : 0,
                   cells[r * nc + c] ? cells[r * nc + c] : "");
        printf("\n");
    }
    for (size_t i = 0; cells && i < (nr + 1) * nc; i++)
        free(cells[i]);
    free(cells);
}

/* -q: the first column of a table alone, one value a line and no header, for a shell to take
 * (the ids of workloads, volumes, operations; the names of clusters, nodes, pools). */
static void print_first_column(const char *columns, json_t *rows) {
    char first[64];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(columns, ","), columns);
    size_t r;
    json_t *row;
    json_array_foreach(rows, r, row) {
        char buf[512];
        json_t *v = json_object_get(row, first);
        if (!v) continue;
        human(first, v, buf, sizeof buf);
        printf("%s\n", buf);
    }
}

static void print_one(const opts *o, json_t *j) {
    if (strcmp(o->output, "json") == 0) {
        char *t = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", t ? t : "{}");
        free(t);
        return;
    }
    size_t w = 0;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) if (strlen(k) > w) w = strlen(k);
    json_object_foreach(j, k, v) {
        char buf[2048];
        if (json_is_array(v)) {
            char *t = json_dumps(v, JSON_COMPACT);
            snprintf(buf, sizeof buf, "%s", t ? t : "[]");
            free(t);
        } else {
            human(k, v, buf, sizeof buf);
        }
        printf("%-*s  %s\n", (int)w + 1, k, buf);
    }
}

/* ---- operations ---- */

/* Follows operation id until it ends (or Ctrl-C detaches): a progress line redrawn in place on
 * a terminal, one line per change otherwise. Returns the exit code. */
static int follow(cli_conn *c, const opts *o, const char *id) {
    bool tty = isatty(STDERR_FILENO);
    time_t t0 = time(NULL);
    char last[600] = "";
    signal(SIGINT, on_sigint);
    for (;;) {
        Pivirt__Operations__V1__GetOperationRequest req =
            PIVIRT__OPERATIONS__V1__GET_OPERATION_REQUEST__INIT;
        req.id = (char *)id;
        uint8_t buf[512];
        size_t len = pivirt__operations__v1__get_operation_request__pack(&req, buf);
        command cmd = {.resp = O(operation)};
        printer p = {.cmd = &cmd, .o = o};
        char details[1024];
        int code = cli_call(c, OPS "GetOperation", buf, len, o->timeout_s, on_message, &p, details,
                            sizeof details);
        if (code != 0) {
            fprintf(stderr, "\npvcli: following %s: %d %s\n", id, code, details);
            json_decref(p.last);
            return 1;
        }
        json_t *op = p.last;
        const char *status = json_string_value(json_object_get(op, "status"));
        char line[600];
        snprintf(line, sizeof line, "[%3d%%] %s (%lds)",
                 (int)json_integer_value(json_object_get(op, "progress_percent")),
                 json_string_value(json_object_get(op, "message")), (long)(time(NULL) - t0));
        if (tty)
            fprintf(stderr, "\r\033[K%.*s", 200, line);
        else if (strncmp(line, last, strcspn(line, "(")) != 0)
            fprintf(stderr, "%s\n", line);
        snprintf(last, sizeof last, "%s", line);
        if (json_is_true(json_object_get(op, "done"))) {
            if (tty) fprintf(stderr, "\n");
            int rc = strcmp(status, "OPERATION_STATUS_SUCCEEDED") == 0 ? 0 : 1;
            if (rc) {
                json_t *e = json_object_get(op, "error");
                fprintf(stderr, "pvcli: operation %s ended %s: %s\n", id, status + 17,
                        json_string_value(json_object_get(e, "message")));
            }
            print_one(o, op);
            json_decref(op);
            return rc;
        }
        json_decref(op);
        for (int i = 0; i < 5 && !g_interrupted; i++)
            usleep(100000);
        if (g_interrupted) {
            fprintf(stderr,
                    "%sdetached: operation %s goes on. Follow it with `pvcli op wait "
                    "%s`, cancel it with `pvcli op cancel %s`.\n",
                    tty ? "\n" : "", id, id, id);
            return 0;
        }
    }
}

/* ---- main ---- */

/* Under LeakSanitizer (the test build): c-ares, which gRPC's resolver uses, keeps a few bytes
 * of its own until exit. Not pvcli's memory; without sanitizers this is never called. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:libcares.so\n";
}
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) {
    return "print_suppressions=0";
}

static const command *find_command(const char *noun, const char *verb) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(k_commands[i].noun, noun) == 0 && strcmp(k_commands[i].verb, verb) == 0)
            return &k_commands[i];
    return NULL;
}

/* The command of a noun that has a single verb, else NULL. */
static const command *only_verb(const char *noun) {
    const command *found = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(k_commands[i].noun, noun) != 0) continue;
        if (found) return NULL;
        found = &k_commands[i];
    }
    return found;
}

/* Whether the positional arguments past the last one still go to it (a repeated field). */
static bool repeats_last(const command *cmd, size_t pos) {
    if (pos == 0 || (pos < 3 && cmd->positional[pos])) return false;
    const ProtobufCFieldDescriptor *f = field_named(cmd->req, cmd->positional[pos - 1]);
    return f && f->label == PROTOBUF_C_LABEL_REPEATED;
}

static bool known_noun(const char *noun) {
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(k_commands[i].noun, noun) == 0) return true;
    return false;
}

/* Takes a global option at argv[*i] (they may come anywhere): true when it was one, *i then on
 * its last word. */
static bool global_option(opts *o, int argc, char **argv, int *i) {
    const char *a = argv[*i];
    const char *next = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--detach")) {
        o->detach = true;
        return true;
    }
    if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
        o->quiet = true;
        return true;
    }
    static const char *const valued[] = {"--endpoint", "-o",       "--output",
                                         "--timeout",  "--tls-ca", "--tls-cert",
                                         "--tls-key",  "--user",   "--password"};
    for (size_t k = 0; next && k < sizeof valued / sizeof valued[0]; k++) {
        if (strcmp(a, valued[k]) != 0) continue;
        const char **slots[] = {&o->endpoint, &o->output,  &o->output, NULL,        &o->tls_ca,
                                &o->tls_cert, &o->tls_key, &o->user,   &o->password};
        if (slots[k])
            *slots[k] = next;
        else
            o->timeout_s = atoi(next);
        (*i)++;
        return true;
    }
    return false;
}

/* The command named by argv[*i] (NOUN VERB, or a noun of one verb); NULL with *exit_code set
 * (usage printed, or help asked for). *i ends past the verb. */
static const command *pick_command(int argc, char **argv, int *i, int *exit_code) {
    *exit_code = 2;
    if (*i >= argc) {
        usage(stderr, NULL);
        return NULL;
    }
    const char *noun = argv[(*i)++];
    if (!known_noun(noun)) {
        fprintf(stderr, "pvcli: unknown noun %s\n", noun);
        usage(stderr, NULL);
        return NULL;
    }
    if (*i >= argc || !strcmp(argv[*i], "--help") || !strcmp(argv[*i], "-h")) {
        usage(*i >= argc ? stderr : stdout, noun);
        *exit_code = *i >= argc ? 2 : 0;
        return NULL;
    }
    const command *cmd = find_command(noun, argv[*i]);
    if (!cmd && only_verb(noun)) { /* a noun with one verb needs none: pvcli capacity APP ... */
        cmd = only_verb(noun);
        (*i)--;
    }
    if (!cmd) {
        fprintf(stderr, "pvcli: %s has no verb %s\n", noun, argv[*i]);
        usage(stderr, noun);
        return NULL;
    }
    (*i)++;
    return cmd;
}

/* One --FIELD[=VALUE] argument at argv[*i] into req (a bare flag is a boolean). */
static int put_flag(const command *cmd, json_t *req, int argc, char **argv, int *i, char *err,
                    size_t cap) {
    const char *a = argv[*i];
    char name[256];
    const char *eq = strchr(a + 2, '=');
    const char *value = "true";
    snprintf(name, sizeof name, "%.*s", (int)(eq ? eq - a - 2 : (long)strlen(a + 2)), a + 2);
    if (eq)
        value = eq + 1;
    else if (*i + 1 < argc && strncmp(argv[*i + 1], "--", 2) != 0)
        value = argv[++*i];
    return put_field(req, cmd->req, name, value, err, cap);
}

/* The request's JSON from the command's arguments argv[i..]: 0, 1 when help was printed, -1 on
 * a usage error (printed). */
static int parse_request(const command *cmd, opts *o, int argc, char **argv, int i, json_t *req) {
    char err[512];
    size_t pos = 0, n_args = 0;
    char *args[8];
    for (; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("pvcli %s %s: %s\nrequest %s, fields:", cmd->noun, cmd->verb, cmd->help,
                   cmd->req->name);
            for (unsigned f = 0; f < cmd->req->n_fields; f++)
                printf(" --%s", cmd->req->fields[f].name);
            printf("\n");
            return 1;
        }
        if (global_option(o, argc, argv, &i)) continue;
        if (strncmp(a, "--", 2) == 0) {
            bad = put_flag(cmd, req, argc, argv, &i, err, sizeof err);
        } else if (cmd->prepare && n_args < 8) {
            args[n_args++] = argv[i];
        } else if ((pos < 3 && cmd->positional[pos]) || repeats_last(cmd, pos)) {
            const char *field =
                pos < 3 && cmd->positional[pos] ? cmd->positional[pos++] : cmd->positional[pos - 1];
            bad = put_field(req, cmd->req, field, a, err, sizeof err);
        } else {
            bad = -1;
            snprintf(err, sizeof err, "%s %s: unexpected argument %s", cmd->noun, cmd->verb, a);
        }
        if (bad) {
            fprintf(stderr, "pvcli: %s\n", err);
            return -1;
        }
    }
    if (cmd->prepare && cmd->prepare(req, args, n_args, err, sizeof err) != 0) {
        fprintf(stderr, "pvcli: %s\n", err);
        return -1;
    }
    return 0;
}

/* The request message, packed (caller frees *bytes): 0, or the exit code of a usage error. */
static int pack_request(const command *cmd, opts *o, int argc, char **argv, int i, uint8_t **bytes,
                        size_t *len, int *help) {
    json_t *req = json_object();
    int rc = parse_request(cmd, o, argc, argv, i, req);
    *help = rc == 1;
    if (rc == 0 && strcmp(o->output, "json") != 0 && strcmp(o->output, "table") != 0) {
        fprintf(stderr, "pvcli: -o %s: want table or json\n", o->output);
        rc = -1;
    }
    ProtobufCMessage *msg = NULL;
    pv_status st;
    if (rc == 0 && pv_pbjson_from_json(cmd->req, req, &msg, &st) != PV_OK) {
        fprintf(stderr, "pvcli: %s\n", st.msg);
        rc = -1;
    }
    json_decref(req);
    if (rc != 0) return rc < 0 ? 2 : 0;
    *len = protobuf_c_message_get_packed_size(msg);
    *bytes = malloc(*len ? *len : 1);
    protobuf_c_message_pack(msg, *bytes);
    protobuf_c_message_free_unpacked(msg, NULL);
    return 0;
}

/* Calls the command's method and prints what comes back; the exit code. */
static int run_command(const command *cmd, const opts *o, const uint8_t *bytes, size_t len) {
    cli_conn_opts co = {.endpoint = o->endpoint,
                        .tls_ca = o->tls_ca,
                        .tls_cert = o->tls_cert,
                        .tls_key = o->tls_key,
                        .auth_user = o->user,
                        .auth_password = o->password};
    char err[512];
    cli_conn *c = cli_conn_open(&co, err, sizeof err);
    if (!c) {
        fprintf(stderr, "pvcli: %s\n", err);
        return 1;
    }
    printer p = {.cmd = cmd, .o = o, .rows = json_array(), .exit_code = -1};
    char details[2048];
    int code =
        cli_call(c, cmd->method, bytes, len, o->timeout_s, on_message, &p, details, sizeof details);
    int rc = 0;
    if (code != 0) {
        if (code > 0 && code <= 16)
            fprintf(stderr, "pvcli: %s: %s\n", pv_code_name(code), details);
        else
            fprintf(stderr, "pvcli: status %d: %s\n", code, details);
        rc = 1;
    } else if (cmd->columns && !cmd->live) {
        if (strcmp(o->output, "table") == 0 && o->quiet)
            print_first_column(cmd->columns, p.rows);
        else if (strcmp(o->output, "table") == 0)
            print_table(cmd->columns, p.rows);
    } else if (cmd->live || cmd->raw_field) {
        /* printed as it came */
    } else if (cmd->waits && !o->detach && p.last) {
        rc = follow(c, o, json_string_value(json_object_get(p.last, "id")));
    } else if (cmd->waits && o->detach && p.last && strcmp(o->output, "table") == 0) {
        printf("%s\n", json_string_value(json_object_get(p.last, "id")));
    } else if (p.last) {
        print_one(o, p.last);
    }
    if (rc == 0 && p.failed) {
        fprintf(stderr, "pvcli: %d of %d failed\n", p.failed, p.n);
        rc = 1;
    }
    if (rc == 0 && p.exit_code >= 0) rc = p.exit_code;
    if (rc == 0 && cmd->resp == E(attach_workload_message) && p.exit_code < 0) {
        fprintf(stderr, "pvcli: no exit code came: the command did not run\n");
        rc = 1;
    }
    json_decref(p.rows);
    json_decref(p.last);
    cli_conn_close(c);
    return rc;
}

int main(int argc, char **argv) {
    opts o = {.endpoint = getenv("PIVIRT_ENDPOINT"),
              .output = "table",
              .tls_ca = getenv("PIVIRT_TLS_CA"),
              .tls_cert = getenv("PIVIRT_TLS_CERT"),
              .tls_key = getenv("PIVIRT_TLS_KEY"),
              .user = getenv("PIVIRT_USER"),
              .password = getenv("PIVIRT_PASSWORD"),
              .timeout_s = 60};
    if (!o.endpoint || !*o.endpoint) o.endpoint = "localhost:8443";
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, NULL);
            return 0;
        }
        if (!global_option(&o, argc, argv, &i)) {
            fprintf(stderr, "pvcli: unknown option %s\n", argv[i]);
            usage(stderr, NULL);
            return 2;
        }
    }
    int rc;
    const command *cmd = pick_command(argc, argv, &i, &rc);
    if (!cmd) return rc;
    uint8_t *bytes = NULL;
    size_t len = 0;
    int help = 0;
    rc = pack_request(cmd, &o, argc, argv, i, &bytes, &len, &help);
    if (rc != 0 || help) return rc;
    rc = run_command(cmd, &o, bytes, len);
    free(bytes);
    return rc;
}
