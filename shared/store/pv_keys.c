/*
 * pv_keys: builds key names (see pv_keys.h for the schema). One table row per kind, in the
 * order of pv_key_kind: a name is the prefix, the row's stem, then the kind's names joined by
 * ':'. Plain concatenation, so an operator reading pv_keys.h knows exactly what redis-cli shows.
 */
#include "pv_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *stem;
    int arity;
} k_kinds[PV_KEY_KIND_COUNT] = {
    [PV_KEY_OPS] = {"{ops}:", 0},
    [PV_KEY_OP] = {"{ops}:op:", 1},
    [PV_KEY_OP_QUEUE] = {"{ops}:q:", 1},
    [PV_KEY_OP_INDEX] = {"{ops}:index", 0},
    [PV_KEY_OP_BY_KIND] = {"{ops}:by-kind:", 1},
    [PV_KEY_OP_BY_TARGET] = {"{ops}:by-target:", 1},
    [PV_KEY_OP_DELAYED] = {"{ops}:delayed", 0},
    [PV_KEY_OP_EVENTS] = {"{ops}:events", 0},
    [PV_KEY_OP_DEAD] = {"{ops}:dead", 0},
    [PV_KEY_OP_FENCE] = {"{ops}:fence", 0},
    [PV_KEY_OP_LOCK] = {"{ops}:lock:", 1},
    [PV_KEY_OP_IDEM] = {"{ops}:idem:", 1},
    [PV_KEY_OP_PENDING_BY] = {"{ops}:pending-by:", 1},
    [PV_KEY_OP_OUT] = {"{ops}:out:", 1},
    [PV_KEY_OP_IN] = {"{ops}:in:", 1},
    [PV_KEY_OP_CHAN] = {"{ops}:chan:", 1},
    [PV_KEY_OP_UPLOAD] = {"{ops}:upload:", 1},
    [PV_KEY_REG] = {"{reg}:", 0},
    [PV_KEY_PODS] = {"{reg}:pods", 0},
    [PV_KEY_POD] = {"{reg}:pod:", 1},
    [PV_KEY_POD_NODES] = {"{reg}:pod-nodes:", 1},
    [PV_KEY_NODES] = {"{reg}:nodes", 0},
    [PV_KEY_NODE] = {"{reg}:node:", 1},
    [PV_KEY_NODE_WORKLOADS] = {"{reg}:node-workloads:", 1},
    [PV_KEY_NODE_ALLOCS] = {"{reg}:node-allocs:", 1},
    [PV_KEY_ALIVE] = {"{reg}:alive:", 1},
    [PV_KEY_ENGINE_INFO] = {"{reg}:engine-info:", 1},
    [PV_KEY_ENGINE_INV] = {"{reg}:engine-inv:", 1},
    [PV_KEY_RESV] = {"{reg}:resv:", 1},
    [PV_KEY_RESVS] = {"{reg}:resvs", 0},
    [PV_KEY_DEPLOY_COUNT] = {"{reg}:deploy-count:", 2},
    [PV_KEY_SCHED_REQUESTS] = {"{reg}:sched:requests", 0},
    [PV_KEY_SCHED_REPLY] = {"{reg}:sched:reply:", 1},
    [PV_KEY_SCHED_GONE] = {"{reg}:sched:gone:", 1},
    [PV_KEY_UPGRADE] = {"{reg}:upgrade:", 1},
    [PV_KEY_WL] = {"{reg}:wl:", 1},
    [PV_KEY_WLS] = {"{reg}:wls", 0},
    [PV_KEY_APP_WORKLOADS] = {"{reg}:app-workloads:", 1},
    [PV_KEY_WL_STATUS] = {"{reg}:wl-status:", 1},
    [PV_KEY_WL_DEPLOY] = {"{reg}:wl-deploy:", 1},
    [PV_KEY_DISSOCIATED] = {"{reg}:dissociated:", 1},
    [PV_KEY_POOL] = {"{sto}:pool:", 1},
    [PV_KEY_VOL] = {"{sto}:vol:", 1},
    [PV_KEY_SNAP] = {"{sto}:snap:", 1},
    [PV_KEY_POOLS] = {"{sto}:pools", 0},
    [PV_KEY_POOL_VOLS] = {"{sto}:pool-vols:", 1},
    [PV_KEY_POOL_NAMES] = {"{sto}:pool-names:", 1},
    [PV_KEY_VOL_SNAPS] = {"{sto}:vol-snaps:", 1},
    [PV_KEY_VOL_USER] = {"{sto}:vol-user:", 1},
    [PV_KEY_WL_VOLS] = {"{sto}:wl-vols:", 1},
    [PV_KEY_PRESENCE] = {"presence:", 2},
    [PV_KEY_PRESENCE_INDEX] = {"presence:", 1},
    [PV_KEY_TEST_RUNS] = {"test:runs:", 1},
};

int pv_keys_init(pv_keys *k, const char *prefix, pv_status *st) {
    if (!prefix) prefix = "";
    size_t n = strlen(prefix);
    if (n >= sizeof k->prefix)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix: longer than %d bytes",
                             PV_KEY_PREFIX_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if (prefix[i] <= ' ' || prefix[i] > '~')
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "redis.prefix: \"%s\" must be printable without spaces", prefix);
    memcpy(k->prefix, prefix, n + 1);
    return PV_OK;
}

int pv_key_arity(pv_key_kind kind) {
    return (unsigned)kind < PV_KEY_KIND_COUNT ? k_kinds[kind].arity : -1;
}

/* The parts of a name in order (NULL ends them): prefix, stem, names. */
static void parts_of(const pv_keys *k, pv_key_kind kind, const char *a, const char *b,
                     const char *parts[6]) {
    int arity = k_kinds[kind].arity, n = 0;
    parts[n++] = k->prefix;
    parts[n++] = k_kinds[kind].stem;
    if (arity >= 1) parts[n++] = a ? a : "";
    if (arity >= 2) {
        parts[n++] = ":";
        parts[n++] = b ? b : "";
    }
    parts[n] = NULL;
}

static size_t parts_len(const char *const *parts) {
    size_t n = 0;
    for (; *parts; parts++)
        n += strlen(*parts);
    return n;
}

static void parts_copy(const char *const *parts, char *out) {
    for (; *parts; parts++) {
        size_t n = strlen(*parts);
        memcpy(out, *parts, n);
        out += n;
    }
    *out = '\0';
}

int pv_key2(const pv_keys *k, pv_key_kind kind, const char *a, const char *b, char *buf, size_t len,
            pv_status *st) {
    if ((unsigned)kind >= PV_KEY_KIND_COUNT)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "key kind %d: unknown", (int)kind);
    const char *parts[6];
    parts_of(k, kind, a, b, parts);
    size_t n = parts_len(parts);
    if (len == 0 || n >= len)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "key name longer than %zu bytes",
                             len ? len - 1 : 0);
    parts_copy(parts, buf);
    return PV_OK;
}

int pv_key(const pv_keys *k, pv_key_kind kind, const char *name, char *buf, size_t len,
           pv_status *st) {
    return pv_key2(k, kind, name, NULL, buf, len, st);
}

char *pv_key_new(const pv_keys *k, pv_key_kind kind, const char *name) {
    if ((unsigned)kind >= PV_KEY_KIND_COUNT) return NULL;
    const char *parts[6];
    parts_of(k, kind, name, NULL, parts);
    char *key = malloc(parts_len(parts) + 1);
    if (key) parts_copy(parts, key);
    return key;
}

int pv_key_add(const pv_keys *k, pv_key_kind kind, const char *name, pv_strv *out) {
    return pv_strv_take(out, pv_key_new(k, kind, name));
}

int pv_key_keyspace_pattern(const pv_keys *k, pv_key_kind kind, int db, char *buf, size_t len,
                            pv_status *st) {
    char prefix[PV_KEY_MAX], escaped[2 * PV_KEY_MAX];
    if (pv_key(k, kind, "", prefix, sizeof prefix, st) != PV_OK) return st->code;
    /* The prefix is matched literally: its glob characters ({reg}'s braces are not among
     * them) get a backslash. */
    size_t at = 0;
    for (const char *p = prefix; *p; p++) {
        if (strchr("*?[]\\", *p)) escaped[at++] = '\\';
        escaped[at++] = *p;
    }
    escaped[at] = '\0';
    int n = snprintf(buf, len, "__keyspace@%d__:%s*", db, escaped);
    if (n < 0 || (size_t)n >= len)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "key pattern longer than %zu bytes",
                             len ? len - 1 : 0);
    return PV_OK;
}

int pv_key_presence(const pv_keys *k, const char *kind, const char *instance, char *buf, size_t len,
                    pv_status *st) {
    return pv_key2(k, PV_KEY_PRESENCE, kind, instance, buf, len, st);
}

int pv_key_presence_index(const pv_keys *k, const char *kind, char *buf, size_t len,
                          pv_status *st) {
    return pv_key(k, PV_KEY_PRESENCE_INDEX, kind, buf, len, st);
}
