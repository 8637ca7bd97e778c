/*
 * pv_upgrade: batches, versions and the upgrade record (see pv_upgrade.h).
 */
#include "pv_upgrade.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

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

json_t *pv_upgrade_new_record(const char *op_id, const char *cluster_id, const char *from,
                              const char *to, const pv_upgrade_strategy *s, const char *const *ids,
                              const char *const *names, const bool *cordoned, size_t n,
                              int64_t now_ms) {
    int *batch = calloc(n ? n : 1, sizeof *batch), nbatches = 0;
    json_t *nodes = json_array();
    json_t *rec =
        json_pack("{s:s, s:s, s:i, s:s, s:s, s:b, s:{s:i, s:i, s:i, s:i}, s:s, s:I, s:I, s:I}",
                  "cluster_id", cluster_id, "operation_id", op_id, "phase", PV_UPGRADE_PENDING,
                  "from", from, "to", to, "downgrade", pv_version_compare(to, from) < 0, "strategy",
                  "type", s->type ? (int)s->type : PV_UPGRADE_ROLLING, "max_surge", s->max_surge,
                  "max_unavailable", s->max_unavailable, "partition", s->partition, "message",
                  "accepted; no node touched yet", "started_ms", (json_int_t)now_ms, "updated_ms",
                  (json_int_t)now_ms, "finished_ms", (json_int_t)0);
    if (!batch || !nodes || !rec) {
        free(batch);
        json_decref(nodes);
        json_decref(rec);
        return NULL;
    }
    pv_upgrade_batches(s, n, batch, &nbatches);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(
            nodes,
            json_pack("{s:s, s:s, s:i, s:s, s:i, s:b, s:I, s:I}", "id", ids[i], "name", names[i],
                      "state", batch[i] ? PV_NODE_UPGRADE_PENDING : PV_NODE_UPGRADE_SKIPPED,
                      "message", batch[i] ? "waiting for its batch" : "kept by the partition",
                      "batch", batch[i], "was_cordoned", cordoned[i], "started_ms", (json_int_t)0,
                      "finished_ms", (json_int_t)0));
    json_object_set_new(rec, "nodes", nodes);
    free(batch);
    return rec;
}

json_t *pv_upgrade_new_record_of(const char *op_id, const char *cluster_id, const char *from,
                                 const char *to, const pv_upgrade_strategy *s, const pv_node *nodes,
                                 size_t n, int64_t now_ms) {
    const char **ids = calloc(n ? n : 1, sizeof *ids), **names = calloc(n ? n : 1, sizeof *names);
    bool *cordoned = calloc(n ? n : 1, sizeof *cordoned);
    for (size_t i = 0; ids && names && cordoned && i < n; i++) {
        ids[i] = nodes[i].id;
        names[i] = nodes[i].name;
        cordoned[i] = nodes[i].bypass;
    }
    json_t *rec = ids && names && cordoned ? pv_upgrade_new_record(op_id, cluster_id, from, to, s,
                                                                   ids, names, cordoned, n, now_ms)
                                           : NULL;
    free(ids);
    free(names);
    free(cordoned);
    return rec;
}

static int record_key(const pv_keys *k, const char *cluster_id, char *key, size_t cap,
                      pv_status *st) {
    if (pv_key(k, PV_KEY_UPGRADE, cluster_id, key, cap, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "cluster id too long");
    return PV_OK;
}

int pv_upgrade_get(pv_redis *r, const pv_keys *k, const char *cluster_id, json_t **out,
                   pv_status *st) {
    *out = NULL;
    char key[PV_KEY_MAX];
    if (record_key(k, cluster_id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "GET %s", key) != PV_OK) return st->code;
    int rc = PV_OK;
    if (rep->type != REDIS_REPLY_STRING) {
        rc = pv_status_set(st, PV_NOT_FOUND, "cluster %s has never been upgraded", cluster_id);
    } else if (!(*out = json_loads(rep->str, 0, NULL)) || !json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        rc = pv_status_set(st, PV_INTERNAL, "the upgrade record of cluster %s is unreadable",
                           cluster_id);
    }
    freeReplyObject(rep);
    return rc;
}

int pv_upgrade_put(pv_redis *r, const pv_keys *k, const char *cluster_id, json_t *rec,
                   pv_status *st) {
    char key[PV_KEY_MAX];
    if (record_key(k, cluster_id, key, sizeof key, st) != PV_OK) return st->code;
    struct timeval tv;
    gettimeofday(&tv, NULL);
    json_object_set_new(rec, "updated_ms",
                        json_integer((json_int_t)tv.tv_sec * 1000 + tv.tv_usec / 1000));
    char *text = json_dumps(rec, JSON_COMPACT);
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
