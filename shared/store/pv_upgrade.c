/*
 * pv_upgrade: batches, versions and the upgrade record (see pv_upgrade.h).
 */
#include "pv_upgrade.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_mem.h"
#include "pv_time.h"

void pv_upgrade_batches(const pv_upgrade_strategy *s, size_t n, int *batch, int *nbatches) {
    size_t kept = s->partition > 0 ? (size_t)s->partition : 0;
    if (kept > n) kept = n;
    size_t group = s->max_unavailable > 1 ? (size_t)s->max_unavailable : 1;
    size_t m = n - kept; /* upgradable */
    int last = 0;
    for (size_t i = 0; i < n; i++) {
        if (i < kept) {
            batch[i] = 0;
            continue;
        }
        size_t j = i - kept; /* place among the upgradable */
        switch (s->type) {
        case PV_UPGRADE_BLUE_GREEN:
            batch[i] = j < (m + 1) / 2 ? 1 : 2;
            break;
        case PV_UPGRADE_CANARY:
            batch[i] = j == 0 ? 1 : 2 + (int)((j - 1) / group);
            break;
        default:
            batch[i] = 1 + (int)(j / group);
            break;
        }
        if (batch[i] > last) last = batch[i];
    }
    *nbatches = last;
}

int pv_upgrade_check_strategy(const pv_upgrade_strategy *s, size_t n, pv_status *st) {
    static const char *const names[] = {"max_surge", "max_unavailable", "partition"};
    const int values[] = {s->max_surge, s->max_unavailable, s->partition};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        if (values[i] < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "strategy.%s: %d is negative", names[i],
                                 values[i]);
        if ((size_t)values[i] > n)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "strategy.%s: %d is more than the cluster's %zu node(s)", names[i],
                                 values[i], n);
    }
    return PV_OK;
}

static void parse_version(const char *v, long out[3]) {
    out[0] = out[1] = out[2] = 0;
    if (!v || (*v != 'v' && *v != 'V')) return;
    long a, b, c;
    if (sscanf(v + 1, "%ld.%ld.%ld", &a, &b, &c) == 3) {
        out[0] = a;
        out[1] = b;
        out[2] = c;
    }
}

int pv_version_compare(const char *a, const char *b) {
    long x[3], y[3];
    parse_version(a, x);
    parse_version(b, y);
    for (int i = 0; i < 3; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}

bool pv_upgrade_phase_done(int phase) {
    return phase == PV_UPGRADE_SUCCEEDED || phase == PV_UPGRADE_ROLLED_BACK ||
           phase == PV_UPGRADE_CANCELLED || phase == PV_UPGRADE_FAILED;
}

/* ---- the record ---- */

_Static_assert(sizeof(pv_upgrade_type) == sizeof(int), "strategy.type is read as an int");

#define F(T, f, ty)                                                                                \
    { .name = #f, .type = ty, .off = offsetof(T, f) }

static const pv_field k_node_fields[] = {
    F(pv_upgrade_node, id, PV_FIELD_STR),
    F(pv_upgrade_node, name, PV_FIELD_STR),
    F(pv_upgrade_node, state, PV_FIELD_INT),
    F(pv_upgrade_node, message, PV_FIELD_STR),
    F(pv_upgrade_node, batch, PV_FIELD_INT),
    F(pv_upgrade_node, was_cordoned, PV_FIELD_BOOL),
    F(pv_upgrade_node, started_ms, PV_FIELD_I64),
    F(pv_upgrade_node, finished_ms, PV_FIELD_I64),
    {.name = "hooked",
     .type = PV_FIELD_BOOL,
     .off = offsetof(pv_upgrade_node, hooked),
     .optional = true},
    {.name = "drained",
     .type = PV_FIELD_JSON,
     .off = offsetof(pv_upgrade_node, drained),
     .optional = true},
};

/* The strategy's document: the counts and what this build does not know of it. */
typedef struct strategy_doc {
    pv_upgrade_strategy s;
    json_t *extra;
} strategy_doc;

static const pv_field k_strategy_fields[] = {
    {.name = "type", .type = PV_FIELD_INT, .off = offsetof(strategy_doc, s.type)},
    {.name = "max_surge", .type = PV_FIELD_INT, .off = offsetof(strategy_doc, s.max_surge)},
    {.name = "max_unavailable",
     .type = PV_FIELD_INT,
     .off = offsetof(strategy_doc, s.max_unavailable)},
    {.name = "partition", .type = PV_FIELD_INT, .off = offsetof(strategy_doc, s.partition)},
};

/* The record's own fields; "strategy" (after downgrade) and "nodes" (last) are its two
 * documents inside, read and written by their own schemas. */
static const pv_field k_rec_fields[] = {
    F(pv_upgrade_rec, cluster_id, PV_FIELD_STR), F(pv_upgrade_rec, operation_id, PV_FIELD_STR),
    F(pv_upgrade_rec, phase, PV_FIELD_INT),      F(pv_upgrade_rec, from, PV_FIELD_STR),
    F(pv_upgrade_rec, to, PV_FIELD_STR),         F(pv_upgrade_rec, downgrade, PV_FIELD_BOOL),
    F(pv_upgrade_rec, message, PV_FIELD_STR),    F(pv_upgrade_rec, started_ms, PV_FIELD_I64),
    F(pv_upgrade_rec, updated_ms, PV_FIELD_I64), F(pv_upgrade_rec, finished_ms, PV_FIELD_I64),
};

static const pv_record_schema k_node_schema = {.what = "upgrade",
                                               .fields = k_node_fields,
                                               .nfields = PV_RECORD_NFIELDS(k_node_fields),
                                               .size = sizeof(pv_upgrade_node),
                                               .extra_off = offsetof(pv_upgrade_node, extra)};
static const pv_record_schema k_strategy_schema = {.what = "upgrade",
                                                   .fields = k_strategy_fields,
                                                   .nfields = PV_RECORD_NFIELDS(k_strategy_fields),
                                                   .size = sizeof(strategy_doc),
                                                   .extra_off = offsetof(strategy_doc, extra)};
static const pv_record_schema k_rec_schema = {.what = "upgrade",
                                              .fields = k_rec_fields,
                                              .nfields = PV_RECORD_NFIELDS(k_rec_fields),
                                              .size = sizeof(pv_upgrade_rec),
                                              .extra_off = offsetof(pv_upgrade_rec, extra)};

void pv_upgrade_rec_free(pv_upgrade_rec *rec) {
    if (!rec) return;
    pv_record_array_free(&k_node_schema, rec->nodes, rec->n_nodes);
    json_decref(rec->strategy_extra);
    pv_record_free(&k_rec_schema, rec); /* zeroes it, nodes included */
}

int pv_upgrade_new_record(const char *op_id, const char *cluster_id, const char *from,
                          const char *to, const pv_upgrade_strategy *s, const char *const *ids,
                          const char *const *names, const bool *cordoned, size_t n, int64_t now_ms,
                          pv_upgrade_rec *out) {
    memset(out, 0, sizeof *out);
    int *batch = calloc(n ? n : 1, sizeof *batch), nbatches = 0;
    out->nodes = calloc(n ? n : 1, sizeof *out->nodes);
    out->n_nodes = out->nodes ? n : 0;
    out->phase = PV_UPGRADE_PENDING;
    out->downgrade = pv_version_compare(to, from) < 0;
    out->strategy = *s;
    if (!s->type) out->strategy.type = PV_UPGRADE_ROLLING;
    out->started_ms = out->updated_ms = now_ms;
    bool ok = batch && out->nodes && pv_record_set_str(&out->cluster_id, cluster_id) == 0 &&
              pv_record_set_str(&out->operation_id, op_id) == 0 &&
              pv_record_set_str(&out->from, from) == 0 && pv_record_set_str(&out->to, to) == 0 &&
              pv_record_set_str(&out->message, "accepted; no node touched yet") == 0;
    if (ok) pv_upgrade_batches(s, n, batch, &nbatches);
    for (size_t i = 0; ok && i < n; i++) {
        pv_upgrade_node *x = &out->nodes[i];
        x->state = batch[i] ? PV_NODE_UPGRADE_PENDING : PV_NODE_UPGRADE_SKIPPED;
        x->batch = batch[i];
        x->was_cordoned = cordoned[i];
        ok = pv_record_set_str(&x->id, ids[i]) == 0 && pv_record_set_str(&x->name, names[i]) == 0 &&
             pv_record_set_str(&x->message,
                               batch[i] ? "waiting for its batch" : "kept by the partition") == 0;
    }
    free(batch);
    if (ok) return 0;
    pv_upgrade_rec_free(out);
    return -1;
}

/* Takes the record's documents inside (strategy, nodes) out of what decode kept in extra. */
static int decode_inner(const char *key, pv_upgrade_rec *rec, pv_status *st) {
    json_t *js = json_object_get(rec->extra, "strategy"),
           *jn = json_object_get(rec->extra, "nodes");
    char where[PV_KEY_MAX + 32];
    snprintf(where, sizeof where, "%s strategy", key);
    json_t *none = js ? NULL : json_object(); /* a record without one: every count 0 */
    strategy_doc sd;
    int rc = pv_record_decode_json(&k_strategy_schema, where, js ? js : none, &sd, st);
    json_decref(none);
    if (rc != PV_OK) return rc;
    rec->strategy = sd.s;
    rec->strategy_extra = sd.extra;
    if (jn && !json_is_array(jn))
        return pv_status_set(st, PV_DATA_LOSS, "upgrade record %s: field nodes: not an array", key);
    size_t n = json_array_size(jn);
    rec->nodes = calloc(n ? n : 1, sizeof *rec->nodes);
    if (!rec->nodes) return pv_status_set(st, PV_INTERNAL, "upgrade record: out of memory");
    for (size_t i = 0; i < n; i++) {
        snprintf(where, sizeof where, "%s nodes[%zu]", key, i);
        if (pv_record_decode_json(&k_node_schema, where, json_array_get(jn, i), &rec->nodes[i],
                                  st) != PV_OK)
            return st->code;
        rec->n_nodes++;
    }
    json_object_del(rec->extra, "strategy");
    json_object_del(rec->extra, "nodes");
    return PV_OK;
}

static int decode_rec(const char *key, json_t *doc, pv_upgrade_rec *rec, pv_status *st) {
    if (pv_record_decode_json(&k_rec_schema, key, doc, rec, st) != PV_OK) return st->code;
    if (decode_inner(key, rec, st) == PV_OK) return PV_OK;
    pv_upgrade_rec_free(rec);
    return st->code;
}

/* The record's document with its fields in their order: strategy after downgrade, nodes
 * last. */
static json_t *encode_rec(const pv_upgrade_rec *rec) {
    json_t *flat = pv_record_encode_json(&k_rec_schema, rec), *nodes = json_array();
    json_t *doc = json_object();
    const char *name;
    json_t *v;
    bool ok = flat && nodes && doc;
    json_object_foreach(ok ? flat : NULL, name, v) {
        ok = ok && json_object_set(doc, name, v) == 0;
        strategy_doc sd = {rec->strategy, rec->strategy_extra};
        if (ok && strcmp(name, "downgrade") == 0)
            ok = json_object_set_new(doc, "strategy",
                                     pv_record_encode_json(&k_strategy_schema, &sd)) == 0;
    }
    for (size_t i = 0; ok && i < rec->n_nodes; i++)
        ok = json_array_append_new(nodes, pv_record_encode_json(&k_node_schema, &rec->nodes[i])) ==
             0;
    json_decref(flat);
    if (ok && json_object_set_new(doc, "nodes", nodes) == 0) return doc;
    if (!ok) json_decref(nodes);
    json_decref(doc);
    return NULL;
}

char *pv_upgrade_dumps(const pv_upgrade_rec *rec) {
    json_t *doc = encode_rec(rec);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

int pv_upgrade_new_record_of(const char *op_id, const char *cluster_id, const char *from,
                             const char *to, const pv_upgrade_strategy *s, const pv_node *nodes,
                             size_t n, int64_t now_ms, pv_upgrade_rec *out) {
    memset(out, 0, sizeof *out);
    const char **ids = calloc(n ? n : 1, sizeof *ids), **names = calloc(n ? n : 1, sizeof *names);
    bool *cordoned = calloc(n ? n : 1, sizeof *cordoned);
    for (size_t i = 0; ids && names && cordoned && i < n; i++) {
        ids[i] = nodes[i].id;
        names[i] = nodes[i].name;
        cordoned[i] = nodes[i].bypass;
    }
    int rc = ids && names && cordoned ? pv_upgrade_new_record(op_id, cluster_id, from, to, s, ids,
                                                              names, cordoned, n, now_ms, out)
                                      : -1;
    PV_FREE(ids, names, cordoned);
    return rc;
}

static int record_key(const pv_keys *k, const char *cluster_id, char *key, size_t cap,
                      pv_status *st) {
    if (pv_key(k, PV_KEY_UPGRADE, cluster_id, key, cap, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "cluster id too long");
    return PV_OK;
}

int pv_upgrade_get(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_upgrade_rec *out,
                   pv_status *st) {
    memset(out, 0, sizeof *out);
    char key[PV_KEY_MAX];
    if (record_key(k, cluster_id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "GET %s", key) != PV_OK) return st->code;
    int rc = PV_OK;
    json_t *doc = NULL;
    if (rep->type != REDIS_REPLY_STRING)
        rc = pv_status_set(st, PV_NOT_FOUND, "cluster %s has never been upgraded", cluster_id);
    else if (!(doc = json_loads(rep->str, 0, NULL)))
        rc = pv_status_set(st, PV_DATA_LOSS, "upgrade record %s: not JSON", key);
    else
        rc = decode_rec(key, doc, out, st);
    json_decref(doc);
    freeReplyObject(rep);
    return rc;
}

int pv_upgrade_put(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_upgrade_rec *rec,
                   pv_status *st) {
    char key[PV_KEY_MAX];
    if (record_key(k, cluster_id, key, sizeof key, st) != PV_OK) return st->code;
    rec->updated_ms = pv_time_now_ms();
    char *text = pv_upgrade_dumps(rec);
    if (!text) return pv_status_set(st, PV_INTERNAL, "upgrade record: out of memory");
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "SET %s %s", key, text);
    free(text);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_upgrade_delete(pv_redis *r, const pv_keys *k, const char *cluster_id, pv_status *st) {
    char key[PV_KEY_MAX];
    if (record_key(k, cluster_id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "DEL %s", key);
    if (rep) freeReplyObject(rep);
    return rc;
}
