/*
 * pv_config: defaults, a JSON file, the environment and --set flags, in that order.
 *
 * One static table lists every key with its type, where it lives in struct pv_config, its
 * default and its range. Every source goes through the same typed setters, so a key accepted by
 * the file is accepted by the environment and by --set with the same checks and the same error
 * message, and the dump shows exactly the keys the loaders accept. Adding a key is one line in
 * the table plus the struct field.
 *
 * A setter replaces a value only once the new one is known to be good, so a failed set leaves
 * the configuration as it was and still fully owned (pv_config_free stays correct on every
 * path).
 */
#include "pv_config.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "pv_path.h"

#define ENV_PREFIX "PIVIRT_"
#define ENV_CONFIG "PIVIRT_CONFIG"
#define KEY_MAX 64
#define SHOWN_MAX 64 /* bytes of a value quoted in a message */

typedef enum {
    KEY_STRING, /* char * */
    KEY_INT,    /* int, within [min, max] */
    KEY_LONG,   /* long, within [min, max] */
    KEY_BOOL,   /* bool */
    KEY_LEVEL,  /* pv_log_level */
    KEY_LIST,   /* char ** plus a size_t count at count_offset */
} key_type;

enum {
    KEY_SECRET = 1 << 0,   /* dumped as "***" */
    KEY_REQUIRED = 1 << 1, /* must not be empty */
};

typedef struct key_def {
    const char *name;
    key_type type;
    size_t offset;
    size_t count_offset;
    const char *def; /* default in text form, parsed by the same code as --set values */
    long min, max;
    unsigned flags;
} key_def;

#define OFF(field) offsetof(pv_config, field)
#define STR(name, field, def, flags)                                                               \
    { name, KEY_STRING, OFF(field), 0, def, 0, 0, flags }
#define INT(name, field, def, min, max)                                                            \
    { name, KEY_INT, OFF(field), 0, def, min, max, 0 }

static const key_def keys[] = {
    STR("data_dir", data_dir, "./.data", KEY_REQUIRED),
    {"log.level", KEY_LEVEL, OFF(log_level), 0, "info", 0, 0, 0},
    STR("redis.addr", redis.addr, "127.0.0.1:6390", KEY_REQUIRED),
    INT("redis.db", redis.db, "0", 0, INT_MAX),
    STR("redis.username", redis.username, "", 0),
    STR("redis.password", redis.password, "", KEY_SECRET),
    STR("redis.prefix", redis.prefix, "pv:", 0),
    INT("redis.connect_timeout_ms", redis.connect_timeout_ms, "1000", 1, INT_MAX),
    INT("redis.command_timeout_ms", redis.command_timeout_ms, "2000", 1, INT_MAX),
    {"redis.sentinels", KEY_LIST, OFF(redis.sentinels), OFF(redis.n_sentinels), "", 0, 0, 0},
    STR("redis.master_name", redis.master_name, "", 0),
    STR("redis.durability", redis.durability, "async", 0),
    INT("redis.wait_replicas", redis.wait_replicas, "1", 1, 64),
    INT("redis.wait_timeout_ms", redis.wait_timeout_ms, "1000", 1, INT_MAX),
    {"gateway.listen", KEY_LIST, OFF(gateway.listen), OFF(gateway.n_listen),
     "localhost:8443,localhost:9002,localhost:5001", 0, 0, 0},
    INT("gateway.threads", gateway.threads, "16", 1, 256),
    STR("gateway.tls_cert", gateway.tls_cert, "", 0),
    STR("gateway.tls_key", gateway.tls_key, "", 0),
    STR("gateway.tls_client_ca", gateway.tls_client_ca, "", 0),
    INT("gateway.max_concurrent_streams", gateway.max_concurrent_streams, "1000", 1, 1000000),
    INT("gateway.max_streams_per_client", gateway.max_streams_per_client, "1000", 0, 1000000),
    INT("gateway.max_pending_ops_per_client", gateway.max_pending_ops_per_client, "10000", 0,
        INT_MAX),
    {"gateway.max_request_bytes", KEY_LONG, OFF(gateway.max_request_bytes), 0, "4194304", 1,
     INT_MAX, 0},
    {"gateway.max_upload_bytes", KEY_LONG, OFF(gateway.max_upload_bytes), 0, "67108864", 1,
     268435456, 0},
    INT("gateway.heartbeat_seconds", gateway.heartbeat_seconds, "2", 1, INT_MAX),
    INT("gateway.shutdown_grace_ms", gateway.shutdown_grace_ms, "5000", 0, INT_MAX),
    STR("gateway.advertise", gateway.advertise, "", 0),
    STR("gateway.metrics_listen", gateway.metrics_listen, "", 0),
    INT("gateway.malloc_arenas", gateway.malloc_arenas, "4", 0, 1024),
    INT("gateway.memory_trim_idle_ms", gateway.memory_trim_idle_ms, "1000", 0, INT_MAX),
    STR("auth.username", auth.username, "", 0),
    STR("auth.password", auth.password, "", KEY_SECRET),
    {"auth.exempt_health", KEY_BOOL, OFF(auth.exempt_health), 0, "true", 0, 0, 0},
    {"auth.exempt_reflection", KEY_BOOL, OFF(auth.exempt_reflection), 0, "false", 0, 0, 0},
    INT("worker.heartbeat_seconds", worker.heartbeat_seconds, "2", 1, INT_MAX),
    STR("worker.node", worker.node, "", 0),
    STR("worker.pod", worker.pod, "local", 0),
    STR("worker.endpoint", worker.endpoint, "process://", 0),
    STR("worker.tls_ca", worker.tls_ca, "", 0),
    STR("worker.tls_cert", worker.tls_cert, "", 0),
    STR("worker.tls_key", worker.tls_key, "", KEY_SECRET),
    STR("worker.image_dir", worker.image_dir, "", 0),
    STR("worker.registry_dir", worker.registry_dir, "", 0),
    {"registry.auths", KEY_LIST, OFF(registry.auths), OFF(registry.n_auths), "", 0, 0, KEY_SECRET},
    STR("worker.build_pod", worker.build_pod, "local", 0),
    STR("git.scm_type", git.scm_type, "", 0),
    STR("git.private_key", git.private_key, "", 0),
    INT("worker.status_interval_seconds", worker.status_interval_seconds, "5", 1, 3600),
    STR("worker.metrics_listen", worker.metrics_listen, "", 0),
    INT("worker.memory_pressure_percent", worker.memory_pressure_percent, "90", 1, 100),
    INT("worker.disk_pressure_percent", worker.disk_pressure_percent, "90", 1, 100),
    INT("worker.pid_pressure_percent", worker.pid_pressure_percent, "90", 1, 100),
    INT("worker.stop_grace_seconds", worker.stop_grace_seconds, "10", 1, 3600),
    STR("worker.virt_domain_type", worker.virt_domain_type, "qemu", 0),
    STR("worker.default_user", worker.default_user, "dynamic", 0),
    STR("worker.dynamic_uids", worker.dynamic_uids, "1879048192-1879113727", 0),
    STR("worker.uid_dir", worker.uid_dir, "/run/pivirt/uids", 0),
    INT("worker.concurrency", worker.concurrency, "8", 1, 256),
    INT("worker.lease_ms", worker.lease_ms, "10000", 100, INT_MAX),
    INT("worker.max_attempts", worker.max_attempts, "5", 1, 1000),
    INT("worker.backoff_base_ms", worker.backoff_base_ms, "200", 1, INT_MAX),
    INT("worker.backoff_max_ms", worker.backoff_max_ms, "30000", 1, INT_MAX),
    INT("worker.shutdown_ms", worker.shutdown_ms, "10000", 0, INT_MAX),
    INT("worker.node_op_timeout_ms", worker.node_op_timeout_ms, "60000", 100, INT_MAX),
    STR("storage.libvirt_uri", storage.libvirt_uri, "qemu:///system", 0),
    STR("storage.default_node", storage.default_node, "", 0),
    STR("storage.qemu_img", storage.qemu_img, "/usr/bin/qemu-img", 0),
    {"storage.roots", KEY_LIST, OFF(storage.roots), OFF(storage.n_roots), "", 0, 0, 0},
    STR("upgrade.hook", upgrade.hook, "", 0),
    INT("upgrade.node_timeout_seconds", upgrade.node_timeout_seconds, "300", 1, 86400),
    INT("upgrade.settle_seconds", upgrade.settle_seconds, "30", 0, 86400),
    INT("ha.node_timeout_seconds", ha.node_timeout_seconds, "8", 2, 86400),
    INT("ha.fence_seconds", ha.fence_seconds, "5", 1, 86400),
    INT("ops.retention_seconds", ops.retention_seconds, "604800", 1, INT_MAX),
    INT("ops.events_maxlen", ops.events_maxlen, "100000", 100, INT_MAX),
    INT("scheduler.heartbeat_seconds", scheduler.heartbeat_seconds, "2", 1, INT_MAX),
    INT("scheduler.request_timeout_ms", scheduler.request_timeout_ms, "10000", 1, INT_MAX),
    INT("scheduler.claim_idle_ms", scheduler.claim_idle_ms, "2000", 10, INT_MAX),
    INT("scheduler.reservation_ttl_seconds", scheduler.reservation_ttl_seconds, "600", 1, INT_MAX),
    {"test_operations", KEY_BOOL, OFF(test_operations), 0, "false", 0, 0, 0},
};

#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

/* Typed access to the field a key describes. */
#define FIELD(c, k, type) ((type *)((char *)(c) + (k)->offset))
#define CFIELD(c, k, type) ((const type *)((const char *)(c) + (k)->offset))

static const key_def *find_key(const char *name) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].name, name) == 0) return &keys[i];
    return NULL;
}

/* "\"value\"" cut to SHOWN_MAX bytes, for messages; config values are the operator's own, so
 * cutting is enough (no escaping). */
#define SHOWN(v)                                                                                   \
    (int)(strlen(v) > SHOWN_MAX ? SHOWN_MAX : strlen(v)), (v), (strlen(v) > SHOWN_MAX ? "..." : "")

/* ---- typed setters: the only code that writes a field ---- */

static int store_string(pv_config *c, const key_def *k, const char *v, pv_status *st) {
    char *dup = strdup(v);
    if (dup == NULL) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", k->name);
    char **slot = FIELD(c, k, char *);
    free(*slot);
    *slot = dup;
    return PV_OK;
}

/* Keys bounded only below read better as "at least"; INT_MAX is the limit of the field. */
static int range_error(const key_def *k, long long v, pv_status *st) {
    if (k->max != INT_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %lld is out of range %ld..%ld", k->name,
                             v, k->min, k->max);
    if (v < k->min)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %lld must be at least %ld", k->name, v,
                             k->min);
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %lld is larger than %ld", k->name, v,
                         k->max);
}

static int store_number(pv_config *c, const key_def *k, long long v, pv_status *st) {
    if (v < k->min || v > k->max) return range_error(k, v, st);
    if (k->type == KEY_INT)
        *FIELD(c, k, int) = (int)v;
    else
        *FIELD(c, k, long) = (long)v;
    return PV_OK;
}

static int store_level(pv_config *c, const key_def *k, const char *v, pv_status *st) {
    pv_log_level level;
    if (pv_log_level_parse(v, &level) != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: \"%.*s%s\" is not one of debug, info, warn, error", k->name,
                             SHOWN(v));
    *FIELD(c, k, pv_log_level) = level;
    return PV_OK;
}

static void free_list(char **items, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(items[i]);
    free(items);
}

/* Takes ownership of items (n entries) in every case. */
static void store_list(pv_config *c, const key_def *k, char **items, size_t n) {
    char ***slot = FIELD(c, k, char **);
    size_t *count = (size_t *)((char *)c + k->count_offset);
    free_list(*slot, *count);
    *slot = items;
    *count = n;
}

/* ---- text values (defaults, environment, --set) ---- */

static int parse_number(const key_def *k, const char *v, long long *out, pv_status *st) {
    char *end = NULL;
    errno = 0;
    long long n = v[0] != '\0' && !isspace((unsigned char)v[0]) ? strtoll(v, &end, 10) : 0;
    if (end == NULL || end == v || *end != '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%.*s%s\" is not an integer", k->name,
                             SHOWN(v));
    if (errno == ERANGE)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%.*s%s\" is out of range", k->name,
                             SHOWN(v));
    *out = n;
    return PV_OK;
}

static int parse_bool(const key_def *k, const char *v, bool *out, pv_status *st) {
    static const char *const yes[] = {"true", "1", "yes"};
    static const char *const no[] = {"false", "0", "no"};
    for (size_t i = 0; i < 3; i++) {
        if (strcasecmp(v, yes[i]) == 0 || strcasecmp(v, no[i]) == 0) {
            *out = strcasecmp(v, yes[i]) == 0;
            return PV_OK;
        }
    }
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: \"%.*s%s\" is not a boolean (true/false, 1/0, yes/no)", k->name,
                         SHOWN(v));
}

/* Splits "a, b,c" into trimmed, non-empty items. */
static int split_list(const key_def *k, const char *v, char ***out, size_t *n_out, pv_status *st) {
    size_t cap = 1;
    for (const char *p = v; *p != '\0'; p++)
        cap += *p == ',';
    char **items = calloc(cap, sizeof(char *));
    if (items == NULL) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", k->name);
    size_t n = 0;
    const char *p = v;
    for (;;) {
        const char *end = strchr(p, ',');
        if (end == NULL) end = p + strlen(p);
        const char *b = p, *e = end;
        while (b < e && isspace((unsigned char)*b))
            b++;
        while (e > b && isspace((unsigned char)e[-1]))
            e--;
        if (e > b) {
            items[n] = strndup(b, (size_t)(e - b));
            if (items[n] == NULL) {
                free_list(items, n);
                return pv_status_set(st, PV_INTERNAL, "%s: out of memory", k->name);
            }
            n++;
        }
        if (*end == '\0') break;
        p = end + 1;
    }
    *out = items;
    *n_out = n;
    return PV_OK;
}

static int set_text(pv_config *c, const key_def *k, const char *v, pv_status *st) {
    long long n = 0;
    bool b = false;
    char **items = NULL;
    size_t n_items = 0;
    int rc;
    switch (k->type) {
    case KEY_STRING:
        return store_string(c, k, v, st);
    case KEY_INT:
    case KEY_LONG:
        rc = parse_number(k, v, &n, st);
        return rc != PV_OK ? rc : store_number(c, k, n, st);
    case KEY_BOOL:
        rc = parse_bool(k, v, &b, st);
        if (rc == PV_OK) *FIELD(c, k, bool) = b;
        return rc;
    case KEY_LEVEL:
        return store_level(c, k, v, st);
    case KEY_LIST:
        rc = split_list(k, v, &items, &n_items, st);
        if (rc == PV_OK) store_list(c, k, items, n_items);
        return rc;
    }
    return pv_status_set(st, PV_INTERNAL, "%s: key of unknown type", k->name);
}

int pv_config_set(pv_config *c, const char *key, const char *value, pv_status *st) {
    const key_def *k = find_key(key);
    if (k == NULL)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "unknown configuration key \"%.*s%s\"",
                             SHOWN(key));
    if (value == NULL) value = "";
    return set_text(c, k, value, st);
}

/* ---- defaults and release ---- */

void pv_config_free(pv_config *c) {
    if (c == NULL) return;
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        if (k->type == KEY_STRING) {
            free(*FIELD(c, k, char *));
        } else if (k->type == KEY_LIST) {
            free_list(*FIELD(c, k, char **), *(size_t *)((char *)c + k->count_offset));
        }
    }
    /* Zeroed, a freed config can be freed again: callers need not track which path they took. */
    memset(c, 0, sizeof(*c));
}

int pv_config_init(pv_config *c, pv_status *st) {
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < N_KEYS; i++) {
        int rc = set_text(c, &keys[i], keys[i].def, st);
        if (rc != PV_OK) {
            pv_config_free(c);
            return pv_status_prefix(st, "defaults");
        }
    }
    pv_status_clear(st);
    return PV_OK;
}

/* ---- JSON file ---- */

/* A JSON value for a message: compact, cut to SHOWN_MAX bytes. */
static void json_shown(const json_t *v, char *buf, size_t size) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (s == NULL) {
        snprintf(buf, size, "(value)");
        return;
    }
    snprintf(buf, size, "%.*s%s", SHOWN(s));
    free(s);
}

static int json_type_error(const key_def *k, const json_t *v, const char *want, pv_status *st) {
    char shown[SHOWN_MAX + 8];
    json_shown(v, shown, sizeof(shown));
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: expected %s, got %s", k->name, want, shown);
}

static int set_json_list(pv_config *c, const key_def *k, const json_t *v, pv_status *st) {
    size_t n = json_array_size(v);
    char **items = calloc(n > 0 ? n : 1, sizeof(char *));
    if (items == NULL) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", k->name);
    for (size_t i = 0; i < n; i++) {
        const json_t *item = json_array_get(v, i);
        if (!json_is_string(item)) {
            free_list(items, i);
            return json_type_error(k, v, "an array of strings", st);
        }
        items[i] = strdup(json_string_value(item));
        if (items[i] == NULL) {
            free_list(items, i);
            return pv_status_set(st, PV_INTERNAL, "%s: out of memory", k->name);
        }
    }
    store_list(c, k, items, n);
    return PV_OK;
}

static int set_json(pv_config *c, const key_def *k, const json_t *v, pv_status *st) {
    switch (k->type) {
    case KEY_STRING:
        if (!json_is_string(v)) return json_type_error(k, v, "a string", st);
        return store_string(c, k, json_string_value(v), st);
    case KEY_INT:
    case KEY_LONG:
        if (!json_is_integer(v)) return json_type_error(k, v, "an integer", st);
        return store_number(c, k, json_integer_value(v), st);
    case KEY_BOOL:
        if (!json_is_boolean(v)) return json_type_error(k, v, "true or false", st);
        *FIELD(c, k, bool) = json_is_true(v);
        return PV_OK;
    case KEY_LEVEL:
        if (!json_is_string(v)) return json_type_error(k, v, "a string", st);
        return store_level(c, k, json_string_value(v), st);
    case KEY_LIST:
        /* A single string is the same comma-separated form the environment uses. */
        if (json_is_string(v)) return set_text(c, k, json_string_value(v), st);
        if (!json_is_array(v)) return json_type_error(k, v, "an array of strings", st);
        return set_json_list(c, k, v, st);
    }
    return pv_status_set(st, PV_INTERNAL, "%s: key of unknown type", k->name);
}

/* Nested objects become dotted keys: {"redis": {"addr": ...}} sets redis.addr. */
static int merge_object(pv_config *c, const json_t *obj, const char *prefix, pv_status *st) {
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)obj, name, v) {
        char key[KEY_MAX * 2];
        int len = snprintf(key, sizeof(key), "%s%s%s", prefix, prefix[0] != '\0' ? "." : "", name);
        if (len < 0 || (size_t)len >= sizeof(key))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "unknown key \"%.*s%s\"", SHOWN(name));
        int rc;
        const key_def *k = find_key(key);
        if (k != NULL)
            rc = set_json(c, k, v, st);
        else if (json_is_object(v))
            rc = merge_object(c, v, key, st);
        else
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "unknown key \"%s\"", key);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

int pv_config_load_file(pv_config *c, const char *path, pv_status *st) {
    json_error_t err;
    /* A key given twice is almost always an edit gone wrong: refuse rather than pick one. */
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (root == NULL) {
        if (json_error_code(&err) == json_error_cannot_open_file) /* text names path, errno */
            return pv_status_set(st, PV_INVALID_ARGUMENT, "config %s: %s", path, err.text);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "config %s: line %d column %d: %s", path,
                             err.line, err.column, err.text);
    }
    int rc;
    if (!json_is_object(root))
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "config %s: the top level must be an object",
                           path);
    else if ((rc = merge_object(c, root, "", st)) != PV_OK)
        pv_status_prefix(st, "config %s", path);
    json_decref(root);
    return rc;
}

/* ---- environment ---- */

/* PIVIRT_ + the key upper-cased with '.' as '_'. */
static void env_name(const key_def *k, char *buf, size_t size) {
    size_t o = snprintf(buf, size, "%s", ENV_PREFIX);
    for (const char *p = k->name; *p != '\0' && o + 1 < size; p++)
        buf[o++] = *p == '.' ? '_' : (char)toupper((unsigned char)*p);
    buf[o] = '\0';
}

static const key_def *find_env_key(const char *name, size_t len) {
    char buf[KEY_MAX + sizeof(ENV_PREFIX)];
    for (size_t i = 0; i < N_KEYS; i++) {
        env_name(&keys[i], buf, sizeof(buf));
        if (strlen(buf) == len && memcmp(buf, name, len) == 0) return &keys[i];
    }
    return NULL;
}

int pv_config_apply_env(pv_config *c, char **envp, pv_status *st) {
    if (envp == NULL) envp = environ;
    for (char **e = envp; *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, ENV_PREFIX, strlen(ENV_PREFIX)) != 0 || eq == NULL) continue;
        size_t len = (size_t)(eq - *e);
        if (len == strlen(ENV_CONFIG) && memcmp(*e, ENV_CONFIG, len) == 0) continue;
        const key_def *k = find_env_key(*e, len);
        if (k == NULL)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "environment: %.*s names no configuration key", (int)len, *e);
        int rc = set_text(c, k, eq + 1, st);
        if (rc != PV_OK) return pv_status_prefix(st, "environment %.*s", (int)len, *e);
    }
    return PV_OK;
}

/* ---- validation ---- */

/* gRPC metadata keys: lowercase letters, digits, '-', '_' and '.'. */
static int metadata_key_char(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
           ch == '.';
}

static int validate_auth(const pv_config *c, pv_status *st) {
    const char *u = c->auth.username;
    if (u == NULL || u[0] == '\0') return PV_OK;
    size_t len = strlen(u);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)u[i];
        if (ch >= 'A' && ch <= 'Z')
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "auth.username: \"%.*s%s\" must be lowercase (it is sent as a "
                                 "gRPC metadata key, and those are lowercase)",
                                 SHOWN(u));
        if (!metadata_key_char(ch))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "auth.username: \"%.*s%s\" has a character not allowed in a gRPC "
                                 "metadata key (only a-z, 0-9, '-', '_', '.')",
                                 SHOWN(u));
    }
    /* grpc-* keys are reserved by gRPC and *-bin values are base64 binary, not a password. */
    if (strncmp(u, "grpc-", 5) == 0 || (len >= 4 && strcmp(u + len - 4, "-bin") == 0))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "auth.username: \"%.*s%s\" is a reserved metadata key (grpc-* or "
                             "*-bin)",
                             SHOWN(u));
    const char *p = c->auth.password;
    if (p == NULL || p[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "auth.password: is required when auth.username is set (\"%.*s%s\")",
                             SHOWN(u));
    /* The value never appears in a message: it is a secret. */
    for (const unsigned char *q = (const unsigned char *)p; *q != '\0'; q++)
        if (*q < 0x20 || *q > 0x7e)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "auth.password: must be printable ASCII (a gRPC metadata value)");
    return PV_OK;
}

/* The fence must fire before the cluster may recreate what it stops, and not between two healthy
 * beats. */
static int validate_ha(const pv_config *c, pv_status *st) {
    if (c->ha.fence_seconds > c->ha.node_timeout_seconds - PV_HA_FENCE_MARGIN_SECONDS)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "ha.fence_seconds: %d must be at most ha.node_timeout_seconds (%d) "
                             "minus a safety margin of %d s, so that a node stops its HA "
                             "workloads before the cluster recreates them elsewhere",
                             c->ha.fence_seconds, c->ha.node_timeout_seconds,
                             PV_HA_FENCE_MARGIN_SECONDS);
    if (c->ha.fence_seconds <= c->worker.heartbeat_seconds)
        return pv_status_set(
            st, PV_INVALID_ARGUMENT,
            "ha.fence_seconds: %d must be more than worker.heartbeat_seconds (%d), "
            "else a healthy node fences itself between two beats",
            c->ha.fence_seconds, c->worker.heartbeat_seconds);
    return PV_OK;
}

static int validate_keys(const pv_config *c, pv_status *st) {
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        long long v;
        switch (k->type) {
        case KEY_STRING: {
            const char *s = *CFIELD(c, k, char *);
            if ((k->flags & KEY_REQUIRED) && (s == NULL || s[0] == '\0'))
                return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is required", k->name);
            break;
        }
        case KEY_INT:
        case KEY_LONG:
            v = k->type == KEY_INT ? *CFIELD(c, k, int) : *CFIELD(c, k, long);
            if (v < k->min || v > k->max) return range_error(k, v, st);
            break;
        case KEY_LEVEL: {
            pv_log_level l = *CFIELD(c, k, pv_log_level);
            if (l < PV_LOG_DEBUG || l > PV_LOG_ERROR)
                return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %d is not a level", k->name,
                                     (int)l);
            break;
        }
        case KEY_BOOL:
        case KEY_LIST:
            break;
        }
    }
    return PV_OK;
}

int pv_config_validate(const pv_config *c, pv_status *st) {
    int rc = validate_keys(c, st);
    if (rc != PV_OK) return rc;
    if (c->gateway.n_listen == 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "gateway.listen: at least one address is required");
    for (size_t i = 0; i < c->storage.n_roots; i++)
        if (pv_path_check_abs("storage.roots", c->storage.roots[i], st) != PV_OK) return st->code;
    if (c->redis.n_sentinels > 0 && (!c->redis.master_name || !c->redis.master_name[0]))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis.master_name: required with redis.sentinels (the name the "
                             "sentinels monitor)");
    const char *dur = c->redis.durability ? c->redis.durability : "";
    if (strcmp(dur, "async") != 0 && strcmp(dur, "replicated") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis.durability: \"%.*s%s\" is not one of async, replicated",
                             SHOWN(dur));
    for (size_t i = 0; i < c->gateway.n_listen; i++)
        if (c->gateway.listen[i] == NULL || c->gateway.listen[i][0] == '\0')
            return pv_status_set(st, PV_INVALID_ARGUMENT, "gateway.listen[%zu]: is empty", i);
    const char *cert = c->gateway.tls_cert ? c->gateway.tls_cert : "";
    const char *key = c->gateway.tls_key ? c->gateway.tls_key : "";
    if (cert[0] != '\0' && key[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "gateway.tls_key: is required with gateway.tls_cert (\"%.*s%s\")",
                             SHOWN(cert));
    if (key[0] != '\0' && cert[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "gateway.tls_cert: is required with gateway.tls_key (\"%.*s%s\")",
                             SHOWN(key));
    const char *ca = c->gateway.tls_client_ca ? c->gateway.tls_client_ca : "";
    if (ca[0] != '\0' && cert[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "gateway.tls_client_ca: needs gateway.tls_cert and gateway.tls_key "
                             "(client certificates are checked only over TLS) (\"%.*s%s\")",
                             SHOWN(ca));
    const char *ru = c->redis.username ? c->redis.username : "";
    const char *rp = c->redis.password ? c->redis.password : "";
    if (ru[0] != '\0' && rp[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis.password: is required with redis.username (\"%.*s%s\")",
                             SHOWN(ru));
    const char *scm = c->git.scm_type ? c->git.scm_type : "";
    if (*scm && strcmp(scm, "git") != 0 && strcmp(scm, "github") != 0 && strcmp(scm, "gitlab") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "git.scm_type: \"%.*s%s\" is not git, github or gitlab (or empty: "
                             "no SCM builds)",
                             SHOWN(scm));
    for (size_t i = 0; i < c->registry.n_auths; i++) {
        const char *a = c->registry.auths[i], *eq = strchr(a, '=');
        if (!eq || eq == a || !strchr(eq + 1, ':') || strchr(eq + 1, ':') == eq + 1)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "registry.auths[%zu]: \"%.*s=...\" is not HOST=USERNAME:PASSWORD",
                                 i, eq ? (int)(eq - a) : 0, a);
    }
    if (validate_ha(c, st) != PV_OK) return st->code;
    return validate_auth(c, st);
}

/* ---- the usual start of a program ---- */

/* Splits "k=v" in place of a copy; returns -1 when there is no '=' or no key. */
static int split_kv(const char *arg, char *key, size_t size, const char **value) {
    const char *eq = strchr(arg, '=');
    if (eq == NULL || eq == arg || (size_t)(eq - arg) >= size) return -1;
    memcpy(key, arg, (size_t)(eq - arg));
    key[eq - arg] = '\0';
    *value = eq + 1;
    return 0;
}

static int apply_sets(pv_config *c, const char **sets, size_t n, pv_status *st) {
    for (size_t i = 0; i < n; i++) {
        char key[KEY_MAX * 2];
        const char *value;
        if (split_kv(sets[i], key, sizeof(key), &value) != 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "--set: \"%.*s%s\" is not key=value",
                                 SHOWN(sets[i]));
        int rc = pv_config_set(c, key, value, st);
        if (rc != PV_OK) return pv_status_prefix(st, "--set");
    }
    return PV_OK;
}

/* Removes --config/--set (both "--opt v" and "--opt=v") from argv, up to a "--" which ends
 * options. sets must have room for *argc entries. */
static int take_args(int *argc, char **argv, const char **config, const char **sets, size_t *n_sets,
                     pv_status *st) {
    int out = 1, i = 1, rc = PV_OK;
    for (; i < *argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) break;
        const char *value = NULL;
        int is_config = 0;
        if (strcmp(a, "--config") == 0 || strcmp(a, "--set") == 0) {
            if (i + 1 >= *argc) {
                /* Only the last argument can lack its value: argv is still rewritten whole. */
                rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s: needs a value", a);
                i++;
                break;
            }
            is_config = a[2] == 'c';
            value = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            is_config = 1;
            value = a + 9;
        } else if (strncmp(a, "--set=", 6) == 0) {
            value = a + 6;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        if (is_config)
            *config = value; /* the last one wins, like any repeated flag */
        else
            sets[(*n_sets)++] = value;
    }
    for (; i < *argc; i++)
        argv[out++] = argv[i];
    argv[out] = NULL;
    *argc = out;
    return rc;
}

static int load_all(pv_config *c, int *argc, char **argv, const char **sets, pv_status *st) {
    const char *config = NULL;
    size_t n_sets = 0;
    int rc = pv_config_init(c, st);
    if (rc == PV_OK && argc != NULL && argv != NULL)
        rc = take_args(argc, argv, &config, sets, &n_sets, st);
    if (rc != PV_OK) return rc;
    if (config == NULL) config = getenv(ENV_CONFIG);
    if (config != NULL && config[0] != '\0' && (rc = pv_config_load_file(c, config, st)) != PV_OK)
        return rc;
    if ((rc = pv_config_apply_env(c, NULL, st)) != PV_OK) return rc;
    if ((rc = apply_sets(c, sets, n_sets, st)) != PV_OK) return rc;
    return pv_config_validate(c, st);
}

int pv_config_load(pv_config *c, int *argc, char **argv, pv_status *st) {
    size_t max_sets = argc != NULL && *argc > 0 ? (size_t)*argc : 1;
    const char **sets = calloc(max_sets, sizeof(*sets));
    if (sets == NULL) {
        memset(c, 0, sizeof(*c));
        return pv_status_set(st, PV_INTERNAL, "config: out of memory");
    }
    int rc = load_all(c, argc, argv, sets, st);
    free(sets);
    /* On failure the program exits; leave nothing that would need freeing. */
    if (rc != PV_OK) pv_config_free(c);
    return rc;
}

/* ---- dump ---- */

static json_t *dump_value(const pv_config *c, const key_def *k) {
    switch (k->type) {
    case KEY_STRING: {
        const char *s = *CFIELD(c, k, char *);
        if (s == NULL) s = "";
        return json_string((k->flags & KEY_SECRET) && s[0] != '\0' ? "***" : s);
    }
    case KEY_INT:
        return json_integer(*CFIELD(c, k, int));
    case KEY_LONG:
        return json_integer(*CFIELD(c, k, long));
    case KEY_BOOL:
        return json_boolean(*CFIELD(c, k, bool));
    case KEY_LEVEL: {
        char name[16];
        snprintf(name, sizeof(name), "%s", pv_log_level_name(*CFIELD(c, k, pv_log_level)));
        for (char *p = name; *p != '\0'; p++)
            *p = (char)tolower((unsigned char)*p);
        return json_string(name);
    }
    case KEY_LIST: {
        json_t *arr = json_array();
        char *const *items = *(char **const *)((const char *)c + k->offset);
        size_t n = *(const size_t *)((const char *)c + k->count_offset);
        for (size_t i = 0; arr != NULL && i < n; i++) {
            if (json_array_append_new(arr, json_string(k->flags & KEY_SECRET ? "***" : items[i])) !=
                0) {
                json_decref(arr);
                arr = NULL;
            }
        }
        return arr;
    }
    }
    return NULL;
}

/* Puts v (stolen) at the dotted key inside root, creating the objects on the way. */
static int dump_put(json_t *root, const char *dotted, json_t *v) {
    json_t *obj = root;
    const char *p = dotted;
    const char *dot;
    while ((dot = strchr(p, '.')) != NULL) {
        char part[KEY_MAX];
        snprintf(part, sizeof(part), "%.*s", (int)(dot - p), p);
        json_t *next = json_object_get(obj, part);
        if (next == NULL) {
            next = json_object();
            if (json_object_set_new(obj, part, next) != 0) {
                json_decref(v);
                return -1;
            }
        }
        obj = next;
        p = dot + 1;
    }
    return json_object_set_new(obj, p, v);
}

char *pv_config_dump_json(const pv_config *c) {
    json_t *root = json_object();
    if (root == NULL) return NULL;
    for (size_t i = 0; i < N_KEYS; i++) {
        json_t *v = dump_value(c, &keys[i]);
        if (v == NULL || dump_put(root, keys[i].name, v) != 0) {
            json_decref(root);
            return NULL;
        }
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}
