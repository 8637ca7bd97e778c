/*
 * pv_resv: reservations of node resources (see pv_resv.h for the model and the keys).
 *
 * The C side owns the arithmetic and Redis owns the atomicity: commit and release send the
 * complete new usage of every node they touch together with the usage_rev it was computed from,
 * and the Lua functions refuse the whole change when any node moved. Release and fix re-read and
 * recompute on a conflict, since they have nothing to re-plan: a bounded number of retries, each
 * after a jittered wait that doubles (a burst of removals on one node moves its usage under
 * every one of them: retried at once, eight in a row could all lose, and a remove failed).
 */
#include "pv_resv.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_log.h"
#include "pv_mem.h"
#include "pv_json.h"
#include "pv_registry.h"
#include "pv_res.h"

#define RETRIES 16
#define BACKOFF_MAX_US 64000

/* Before retry number attempt (1..): a random wait in [b/2, b), b = 500 us doubled per attempt
 * up to BACKOFF_MAX_US, so racing writers spread out instead of colliding again; the whole
 * budget stays under a second. */
static void cas_backoff(int attempt) {
    if (attempt <= 0) return;
    int64_t b = 500;
    for (int i = 1; i < attempt && b < BACKOFF_MAX_US; i++)
        b *= 2;
    if (b > BACKOFF_MAX_US) b = BACKOFF_MAX_US;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t x = ((uint64_t)now.tv_nsec ^ (uint64_t)(uintptr_t)&now) * 0x9E3779B97F4A7C15ull;
    int64_t us = b / 2 + (int64_t)((x >> 17) % (uint64_t)(b / 2));
    struct timespec d = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&d, &d) != 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------------------------------ */
/* records                                                                                     */

static void strv_free(char **v, size_t n) {
    if (!v) return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void pv_resv_ids_free(char **ids, size_t n) {
    strv_free(ids, n);
}

static void node_clear(pv_resv_node *n) {
    free(n->name);
    free(n->usage);
    strv_free(n->alloc_ids, n->nallocs);
    strv_free(n->allocs, n->nallocs);
    memset(n, 0, sizeof *n);
}

void pv_resv_clear(pv_resv *rv) {
    if (!rv) return;
    for (size_t i = 0; i < rv->nnodes; i++)
        node_clear(&rv->nodes[i]);
    free(rv->nodes);
    free(rv->pod);
    free(rv->owner);
    free(rv->app);
    free(rv->entry);
    memset(rv, 0, sizeof *rv);
}

pv_resv_node *pv_resv_add_node(pv_resv *rv, const char *id, const char *name, int64_t rev) {
    pv_resv_node *nodes = realloc(rv->nodes, (rv->nnodes + 1) * sizeof *nodes);
    if (!nodes) return NULL;
    rv->nodes = nodes;
    pv_resv_node *n = &nodes[rv->nnodes];
    memset(n, 0, sizeof *n);
    snprintf(n->id, sizeof n->id, "%s", id);
    n->rev = rev;
    if (!(n->name = strdup(name))) return NULL;
    rv->nnodes++;
    return n;
}

int pv_resv_node_add_alloc(pv_resv_node *n, const char *resv_id, size_t seq, const char *alloc,
                           pv_status *st) {
    char **ids = realloc(n->alloc_ids, (n->nallocs + 1) * sizeof *ids);
    if (ids) n->alloc_ids = ids;
    char **bodies = realloc(n->allocs, (n->nallocs + 1) * sizeof *bodies);
    if (bodies) n->allocs = bodies;
    if (!ids || !bodies) return pv_status_set(st, PV_INTERNAL, "reservation: out of memory");
    char id[PV_ID_MAX + 24];
    snprintf(id, sizeof id, "%s.%zu", resv_id, seq);
    ids[n->nallocs] = strdup(id);
    bodies[n->nallocs] = strdup(alloc);
    if (!ids[n->nallocs] || !bodies[n->nallocs]) {
        free(ids[n->nallocs]);
        free(bodies[n->nallocs]);
        return pv_status_set(st, PV_INTERNAL, "reservation: out of memory");
    }
    n->nallocs++;
    return PV_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* the argument vector of the Lua functions                                                    */

typedef struct argv_buf {
    const char **v;
    char **owned; /* numbers formatted here */
    size_t n, cap, nowned;
    int oom;
} argv_buf;

static void argv_push(argv_buf *a, const char *s) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 32;
        const char **v = realloc(a->v, cap * sizeof *v);
        char **o = realloc(a->owned, cap * sizeof *o);
        if (v) a->v = v;
        if (o) a->owned = o;
        if (!v || !o) {
            a->oom = 1;
            return;
        }
        a->cap = cap;
    }
    a->v[a->n++] = s ? s : "";
}

static void argv_push_i64(argv_buf *a, int64_t x) {
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)x);
    char *s = strdup(buf);
    if (!s) {
        a->oom = 1;
        return;
    }
    argv_push(a, s);
    if (a->oom) {
        free(s);
        return;
    }
    a->owned[a->nowned++] = s;
}

static void argv_free(argv_buf *a) {
    for (size_t i = 0; i < a->nowned; i++)
        free(a->owned[i]);
    free(a->owned);
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* The node list the Lua functions read: n, then per node id name rev usage count (id body)*. */
static void argv_push_nodes(argv_buf *a, const pv_resv *rv, int with_bodies) {
    argv_push_i64(a, (int64_t)rv->nnodes);
    for (size_t i = 0; i < rv->nnodes; i++) {
        const pv_resv_node *n = &rv->nodes[i];
        argv_push(a, n->id);
        argv_push(a, n->name);
        argv_push_i64(a, n->rev);
        argv_push(a, n->usage ? n->usage : "{}");
        argv_push_i64(a, (int64_t)n->nallocs);
        for (size_t j = 0; j < n->nallocs; j++) {
            argv_push(a, n->alloc_ids[j]);
            argv_push(a, with_bodies ? n->allocs[j] : "");
        }
    }
}

static int key_base(const pv_keys *k, char *buf, size_t len, pv_status *st) {
    if (pv_key(k, PV_KEY_REG, NULL, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "key too long");
    return PV_OK;
}

static int resv_key(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st) {
    if (pv_key(k, PV_KEY_RESV, id, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "reservation id %s: too long", id);
    return PV_OK;
}

static int64_t int_of(const redisReply *r) {
    if (r->type == REDIS_REPLY_INTEGER) return (int64_t)r->integer;
    return r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
}

/* A commit's {'OK', now, (rev before, seq after) per node}: sets them in each node. */
static int read_committed(const redisReply *rep, pv_resv *rv, pv_status *st) {
    if (rep->elements != 2 + 2 * rv->nnodes)
        return pv_status_set(st, PV_INTERNAL, "reservation: %zu fields in the commit's reply",
                             rep->elements);
    for (size_t i = 0; i < rv->nnodes; i++) {
        rv->nodes[i].written_ms = int_of(rep->element[1]);
        rv->nodes[i].rev_before = int_of(rep->element[2 + 2 * i]);
        rv->nodes[i].seq_after = int_of(rep->element[3 + 2 * i]);
    }
    return PV_OK;
}

/* Reads the Lua functions' answer: a status string, {'OK', ...} (a commit, rv not NULL), or
 * {'CONFLICT', node}. */
static int read_outcome(const redisReply *rep, pv_resv *rv, pv_resv_outcome *out, char *conflict,
                        size_t conflict_len, pv_status *st) {
    if (rv && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 2 &&
        rep->element[0]->type == REDIS_REPLY_STRING && strcmp(rep->element[0]->str, "OK") == 0) {
        *out = PV_RESV_COMMITTED;
        return read_committed(rep, rv, st);
    }
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_STRING) {
        *out = PV_RESV_CONFLICT;
        if (conflict) snprintf(conflict, conflict_len, "%s", rep->element[1]->str);
        return PV_OK;
    }
    if (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_STATUS)
        return pv_status_set(st, PV_INTERNAL, "reservation: unexpected reply type %d", rep->type);
    if (strcmp(rep->str, "OK") == 0)
        *out = PV_RESV_COMMITTED;
    else if (strcmp(rep->str, "DUPLICATE") == 0)
        *out = PV_RESV_DUPLICATE;
    else if (strcmp(rep->str, "ABANDONED") == 0)
        *out = PV_RESV_ABANDONED;
    else if (strcmp(rep->str, "NOT_FOUND") == 0)
        return pv_status_set(st, PV_NOT_FOUND, "reservation not found");
    else
        return pv_status_set(st, PV_INTERNAL, "reservation: unexpected reply %s", rep->str);
    return PV_OK;
}

/* {"<node id>": {"name": .., "allocs": [..]}, ...}: what release needs to find everything. */
static char *nodes_json(const pv_resv *rv) {
    json_t *o = json_object();
    for (size_t i = 0; o && i < rv->nnodes; i++) {
        json_t *ids = json_array();
        for (size_t j = 0; ids && j < rv->nodes[i].nallocs; j++)
            json_array_append_new(ids, json_string(rv->nodes[i].alloc_ids[j]));
        json_object_set_new(
            o, rv->nodes[i].id,
            json_pack("{s:s, s:o}", "name", rv->nodes[i].name, "allocs", ids ? ids : json_array()));
    }
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return text;
}

int pv_resv_commit(pv_redis *r, const pv_keys *k, pv_resv *rv, const char *request_id,
                   const char *reply_body, int reply_ttl_s, pv_resv_outcome *out, char *conflict,
                   size_t conflict_len, pv_status *st) {
    return pv_resv_commit_acking(r, k, rv, request_id, reply_body, reply_ttl_s, NULL, out, conflict,
                                 conflict_len, st);
}

int pv_resv_commit_acking(pv_redis *r, const pv_keys *k, pv_resv *rv, const char *request_id,
                          const char *reply_body, int reply_ttl_s, const pv_resv_ack *ack,
                          pv_resv_outcome *out, char *conflict, size_t conflict_len,
                          pv_status *st) {
    char base[PV_KEY_MAX], key[PV_KEY_MAX];
    if (key_base(k, base, sizeof base, st) != PV_OK ||
        resv_key(k, rv->id, key, sizeof key, st) != PV_OK)
        return st->code;
    char *nodes = nodes_json(rv);
    if (!nodes) return pv_status_set(st, PV_INTERNAL, "reservation: out of memory");
    argv_buf a = {0};
    argv_push(&a, base);
    argv_push(&a, rv->id);
    argv_push(&a, rv->pod);
    argv_push(&a, rv->owner);
    argv_push(&a, rv->app);
    argv_push(&a, rv->entry);
    argv_push_i64(&a, rv->expires_ms);
    argv_push(&a, nodes);
    argv_push(&a, request_id);
    argv_push(&a, reply_body);
    argv_push_i64(&a, reply_ttl_s > 0 ? reply_ttl_s : 60);
    argv_push_nodes(&a, rv, 1);
    argv_push(&a, "seqs"); /* the nodes' revs and seqs with the answer (sched.lua) */
    if (ack && ack->stream && ack->group && ack->entry) {
        argv_push(&a, "ack");
        argv_push(&a, ack->stream);
        argv_push(&a, ack->group);
        argv_push(&a, ack->entry);
    }
    int rc;
    if (a.oom) {
        rc = pv_status_set(st, PV_INTERNAL, "reservation: out of memory");
    } else {
        const char *keys[] = {key};
        redisReply *rep = NULL;
        rc = pv_redis_fcall(r, "pv_sched_commit", 1, keys, (int)a.n, a.v, &rep, st);
        if (rc == PV_OK) rc = read_outcome(rep, rv, out, conflict, conflict_len, st);
        if (rep) freeReplyObject(rep);
    }
    argv_free(&a);
    free(nodes);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* reading a reservation back                                                                  */

static const char *field_of(const redisReply *rep, const char *name) {
    for (size_t i = 0; i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING && strcmp(rep->element[i]->str, name) == 0)
            return rep->element[i + 1]->type == REDIS_REPLY_STRING ? rep->element[i + 1]->str : "";
    return "";
}

static int dup_into(char **dst, const char *src, pv_status *st) {
    if (!(*dst = strdup(src ? src : ""))) return pv_status_set(st, PV_INTERNAL, "out of memory");
    return PV_OK;
}

/* Loads the reservation record: ids, app/entry and per node its allocation ids (no bodies). */
static int resv_load(pv_redis *r, const pv_keys *k, const char *id, pv_resv *rv, pv_status *st) {
    char key[PV_KEY_MAX];
    if (resv_key(k, id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HGETALL %s", key) != PV_OK) return st->code;
    int rc = PV_OK;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
        rc = pv_status_set(st, PV_NOT_FOUND, "reservation %s not found", id);
        goto out;
    }
    snprintf(rv->id, sizeof rv->id, "%s", id);
    if ((rc = dup_into(&rv->pod, field_of(rep, "pod"), st)) != PV_OK ||
        (rc = dup_into(&rv->owner, field_of(rep, "owner"), st)) != PV_OK ||
        (rc = dup_into(&rv->app, field_of(rep, "app"), st)) != PV_OK ||
        (rc = dup_into(&rv->entry, field_of(rep, "entry"), st)) != PV_OK)
        goto out;
    json_t *nodes = json_loads(field_of(rep, "nodes"), 0, NULL);
    if (!json_is_object(nodes)) {
        json_decref(nodes);
        rc = pv_status_set(st, PV_DATA_LOSS, "reservation %s: its nodes field is not JSON", id);
        goto out;
    }
    const char *node_id;
    json_t *v;
    json_object_foreach(nodes, node_id, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        pv_resv_node *n = pv_resv_add_node(rv, node_id, name ? name : "", 0);
        if (!n) {
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
            break;
        }
        size_t i;
        json_t *aid;
        json_array_foreach(json_object_get(v, "allocs"), i, aid) {
            char **ids = realloc(n->alloc_ids, (n->nallocs + 1) * sizeof *ids);
            char **bodies = ids ? realloc(n->allocs, (n->nallocs + 1) * sizeof *bodies) : NULL;
            if (ids) n->alloc_ids = ids;
            if (bodies) n->allocs = bodies;
            if (!ids || !bodies || !(ids[n->nallocs] = strdup(json_string_value(aid) ?: ""))) {
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
                break;
            }
            bodies[n->nallocs++] = NULL;
        }
        if (rc != PV_OK) break;
    }
    json_decref(nodes);
out:
    freeReplyObject(rep);
    return rc;
}

int pv_resv_get(pv_redis *r, const pv_keys *k, const char *resv_id, pv_resv *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    int rc = resv_load(r, k, resv_id, out, st);
    for (size_t i = 0; rc == PV_OK && i < out->nnodes; i++) {
        pv_resv_node *n = &out->nodes[i];
        char allocs[PV_KEY_MAX];
        rc = pv_key(k, PV_KEY_NODE_ALLOCS, n->id, allocs, sizeof allocs, st);
        for (size_t j = 0; rc == PV_OK && j < n->nallocs; j++) {
            redisReply *rep = NULL;
            rc = pv_redis_command(r, &rep, st, "HGET %s %s", allocs, n->alloc_ids[j]);
            if (rc == PV_OK && rep->type == REDIS_REPLY_STRING &&
                !(n->allocs[j] = strdup(rep->str)))
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
            if (rep) freeReplyObject(rep);
        }
    }
    if (rc != PV_OK) pv_resv_clear(out);
    return rc;
}

/* What a give-back or a realloc computes with of node id's record (name, resources, usage,
 * usage_rev): one HMGET, not the whole record with its liveness, counts and engine report that
 * pv_registry_get_node reads (five commands more per removal). PV_NOT_FOUND when it is gone.
 * The caller clears *out (pv_node_clear). */
static int node_usage_get(pv_redis *r, const pv_keys *k, const char *id, pv_node *out,
                          pv_status *st) {
    memset(out, 0, sizeof *out);
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_NODE, id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HMGET %s name resources usage usage_rev", key) != PV_OK)
        return st->code;
    int rc = PV_OK;
    redisReply **v = rep->element;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 4 || v[0]->type != REDIS_REPLY_STRING) {
        rc = pv_status_set(st, PV_NOT_FOUND, "node %s not found", id);
    } else {
        snprintf(out->id, sizeof out->id, "%s", id);
        out->name = strdup(v[0]->str);
        out->resources = strdup(v[1]->type == REDIS_REPLY_STRING ? v[1]->str : "{}");
        out->usage = strdup(v[2]->type == REDIS_REPLY_STRING ? v[2]->str : "{}");
        out->usage_rev = v[3]->type == REDIS_REPLY_STRING ? strtoll(v[3]->str, NULL, 10) : 0;
        if (!out->name || !out->resources || !out->usage)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    freeReplyObject(rep);
    if (rc != PV_OK) pv_node_clear(out);
    return rc;
}

/* Reads the node (resources, usage, rev) and subtracts the reservation's allocations there. */
static int node_minus_allocs(pv_redis *r, const pv_keys *k, pv_resv_node *n, pv_status *st) {
    pv_node rec = {0};
    int rc = node_usage_get(r, k, n->id, &rec, st);
    if (rc != PV_OK) return rc;
    pv_res_node res = {0};
    rc = pv_res_node_parse(rec.resources, rec.usage, NULL, &res, st);
    n->rev = rec.usage_rev;
    char allocs_key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_NODE_ALLOCS, n->id, allocs_key, sizeof allocs_key, st) != PV_OK)
        return st->code;
    for (size_t i = 0; rc == PV_OK && i < n->nallocs; i++) {
        redisReply *rep = NULL;
        rc = pv_redis_command(r, &rep, st, "HGET %s %s", allocs_key, n->alloc_ids[i]);
        /* An allocation already gone was handed over or released: nothing to subtract. */
        if (rc == PV_OK && rep->type == REDIS_REPLY_STRING)
            rc = pv_res_node_usage_add(&res, rep->str, -1, st);
        if (rep) freeReplyObject(rep);
    }
    free(n->usage);
    n->usage = NULL;
    if (rc == PV_OK) rc = pv_res_node_usage_dump(&res, &n->usage, st);
    if (rc != PV_OK) pv_status_prefix(st, "%s", n->name);
    pv_res_node_free(&res);
    pv_node_clear(&rec);
    return rc;
}

/* Whether any of n's allocations is still on its node (none when workloads took them all over,
 * the usual end of a deploy). One HMGET. */
static int allocs_left(pv_redis *r, const pv_keys *k, const pv_resv_node *n, bool *any,
                       pv_status *st) {
    *any = false;
    if (n->nallocs == 0) return PV_OK;
    char allocs_key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_NODE_ALLOCS, n->id, allocs_key, sizeof allocs_key, st) != PV_OK)
        return st->code;
    const char **argv = calloc(n->nallocs + 2, sizeof *argv);
    if (!argv) return pv_status_set(st, PV_INTERNAL, "out of memory");
    argv[0] = "HMGET";
    argv[1] = allocs_key;
    for (size_t i = 0; i < n->nallocs; i++)
        argv[2 + i] = n->alloc_ids[i];
    redisReply *rep = NULL;
    int rc = pv_redis_commandv(r, &rep, st, (int)n->nallocs + 2, argv, NULL);
    for (size_t i = 0; rc == PV_OK && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++)
        *any = *any || rep->element[i]->type == REDIS_REPLY_STRING;
    if (rep) freeReplyObject(rep);
    free(argv);
    return rc;
}

int pv_resv_release(pv_redis *r, const pv_keys *k, const char *resv_id, pv_status *st) {
    char base[PV_KEY_MAX], key[PV_KEY_MAX];
    if (key_base(k, base, sizeof base, st) != PV_OK ||
        resv_key(k, resv_id, key, sizeof key, st) != PV_OK)
        return st->code;
    for (int attempt = 0; attempt < RETRIES; attempt++) {
        cas_backoff(attempt);
        pv_resv rv = {0};
        int rc = resv_load(r, k, resv_id, &rv, st);
        for (size_t i = 0; rc == PV_OK && i < rv.nnodes; i++) {
            /* A node whose allocations all went to workloads has nothing to give back: it is
             * left alone (no usage rewrite, no revision bump for the schedulers' caches). */
            bool any = true;
            rc = allocs_left(r, k, &rv.nodes[i], &any, st);
            if (rc == PV_OK && any) rc = node_minus_allocs(r, k, &rv.nodes[i], st);
            /* A node removed since cannot hold anything any more. */
            if (rc == PV_NOT_FOUND || (rc == PV_OK && !any)) {
                node_clear(&rv.nodes[i]);
                rv.nodes[i] = rv.nodes[--rv.nnodes];
                i--;
                rc = PV_OK;
            }
        }
        argv_buf a = {0};
        if (rc == PV_OK) {
            argv_push(&a, base);
            argv_push(&a, resv_id);
            argv_push(&a, rv.app);
            argv_push(&a, rv.entry);
            argv_push_nodes(&a, &rv, 0);
            if (a.oom) rc = pv_status_set(st, PV_INTERNAL, "reservation: out of memory");
        }
        pv_resv_outcome out = PV_RESV_COMMITTED;
        if (rc == PV_OK) {
            const char *keys[] = {key};
            redisReply *rep = NULL;
            rc = pv_redis_fcall(r, "pv_sched_release", 1, keys, (int)a.n, a.v, &rep, st);
            if (rc == PV_OK) rc = read_outcome(rep, NULL, &out, NULL, 0, st);
            if (rc == PV_NOT_FOUND)
                pv_status_set(st, PV_NOT_FOUND, "reservation %s not found", resv_id);
            if (rep) freeReplyObject(rep);
        }
        argv_free(&a);
        pv_resv_clear(&rv);
        if (rc != PV_OK) return rc;
        if (out == PV_RESV_COMMITTED) return PV_OK;
    }
    return pv_status_set(st, PV_ABORTED,
                         "reservation %s: its nodes kept changing; release gave up after %d tries",
                         resv_id, RETRIES);
}

/* The node's usage minus the resources of n workloads (NULL or "{}": none). */
static int usage_without(const pv_node *node, const char *const *resources, size_t n, char **usage,
                         pv_status *st) {
    pv_res_node res = {0};
    int rc = pv_res_node_parse(node->resources, node->usage, NULL, &res, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (!resources[i] || strcmp(resources[i], "{}") == 0) continue;
        pv_status ust;
        if (pv_res_node_usage_add(&res, resources[i], -1, &ust) != PV_OK)
            pv_warn("node %s: giving back a workload's resources: %s; its usage is left as it "
                    "was for that part (GetNodeResource fix repairs drift)",
                    node->name, ust.msg);
    }
    if (rc == PV_OK) rc = pv_res_node_usage_dump(&res, usage, st);
    pv_res_node_free(&res);
    return rc;
}

/* Where workload id runs and what it holds (its record's node_id and resources): *node_id NULL
 * when the record is gone, *resources NULL when it has none. */
static int wl_placement(pv_redis *r, const pv_keys *k, const char *id, char **node_id,
                        char **resources, pv_status *st) {
    *node_id = *resources = NULL;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_WL, id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HMGET %s node_id resources", key) != PV_OK) return st->code;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
        if (rep->element[0]->type == REDIS_REPLY_STRING) *node_id = strdup(rep->element[0]->str);
        if (rep->element[1]->type == REDIS_REPLY_STRING) *resources = strdup(rep->element[1]->str);
    }
    freeReplyObject(rep);
    return PV_OK;
}

/* Calls fn(KEYS: key1 when not NULL; ARGV: base, id, <node's usage_rev>, <its usage without the
 * workload's resources>, extra...) with the usage of the node the workload is on, again while the
 * node's usage moved under it (the function answers CONFLICT). The reply is freed; NOT_FOUND when
 * the workload is gone. */
static int give_back_cas(pv_redis *r, const pv_keys *k, const char *workload_id, const char *fn,
                         const char *key1, const char *const *extra, int nextra, pv_status *st) {
    char base[PV_KEY_MAX];
    if (key_base(k, base, sizeof base, st) != PV_OK) return st->code;
    for (int attempt = 0; attempt < RETRIES; attempt++) {
        cas_backoff(attempt);
        char *node_id = NULL, *resources = NULL;
        if (wl_placement(r, k, workload_id, &node_id, &resources, st) != PV_OK) return st->code;
        pv_node node = {0};
        char *usage = NULL, rev[24] = "0";
        int rc = PV_OK;
        if (!node_id) {
            rc = pv_status_set(st, PV_NOT_FOUND, "workload %s not found", workload_id);
        } else if (node_usage_get(r, k, node_id, &node, st) == PV_OK) {
            snprintf(rev, sizeof rev, "%lld", (long long)node.usage_rev);
            rc = usage_without(&node, (const char *const *)&resources, 1, &usage, st);
        } else if (st->code != PV_NOT_FOUND) {
            rc = st->code;
        }
        free(node_id);
        free(resources);
        pv_node_clear(&node);
        if (rc != PV_OK) {
            free(usage);
            return rc;
        }
        const char *args[12] = {base, workload_id, rev, usage ? usage : "{}"};
        for (int i = 0; i < nextra && i < 8; i++)
            args[4 + i] = extra[i];
        redisReply *rep = NULL;
        const char *keys[] = {key1};
        rc = pv_redis_fcall(r, fn, key1 ? 1 : 0, keys, 4 + (nextra < 8 ? nextra : 8), args, &rep,
                            st);
        free(usage);
        bool conflict =
            rc == PV_OK && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "CONFLICT") == 0;
        if (rep) freeReplyObject(rep);
        if (rc != PV_OK) return rc;
        if (!conflict) return PV_OK;
    }
    return pv_status_set(st, PV_ABORTED,
                         "workload %s: its node's usage kept changing; gave up after %d tries",
                         workload_id, RETRIES);
}

/* The placements of the workloads of w not settled yet (node_ids[i], resources[i]: NULL when not
 * read); one not recorded any more is settled NOT_FOUND. One HMGET each. */
static int read_placements(pv_redis *r, const pv_keys *k, pv_resv_return *w, size_t n,
                           char **node_ids, char **resources, pv_status *st) {
    for (size_t i = 0; i < n; i++) {
        free(node_ids[i]);
        free(resources[i]);
        node_ids[i] = resources[i] = NULL;
        if (w[i].outcome != PV_RESV_UNSETTLED) continue;
        if (wl_placement(r, k, w[i].id, &node_ids[i], &resources[i], st) != PV_OK) return st->code;
        if (!node_ids[i]) w[i].outcome = PV_NOT_FOUND;
    }
    return PV_OK;
}

/* The function's ARGV for the workloads of w on node_id (the first PV_RESV_RETURN_BATCH): base,
 * node_id, rev, usage, node, then id, resources, epoch ("" = unchecked) each; grp[j] = their
 * indexes in w (*ngrp of them). */
static void give_back_args(argv_buf *a, const char *base, const char *node_id, const char *rev,
                           const char *usage, const char *node, const pv_resv_return *w,
                           char *const *node_ids, char *const *resources, size_t n, size_t *grp,
                           size_t *ngrp) {
    argv_push(a, base);
    argv_push(a, node_id);
    argv_push(a, rev);
    argv_push(a, usage);
    argv_push(a, node ? node : "");
    *ngrp = 0;
    for (size_t i = 0; i < n && *ngrp < PV_RESV_RETURN_BATCH; i++) {
        if (w[i].outcome != PV_RESV_UNSETTLED || !node_ids[i] || strcmp(node_ids[i], node_id) != 0)
            continue;
        grp[(*ngrp)++] = i;
        argv_push(a, w[i].id);
        argv_push(a, resources[i] ? resources[i] : "{}");
        if (w[i].epoch > 0)
            argv_push_i64(a, w[i].epoch);
        else
            argv_push(a, "");
    }
}

/* One compare-and-set of the workloads of w on node_id (the first unsettled one's node):
 * *conflict when the node or a record moved under it (read again). */
static int give_back_node(pv_redis *r, const pv_keys *k, const char *base, const char *node,
                          pv_resv_return *w, size_t n, char **node_ids, char **resources,
                          bool *conflict, pv_status *st) {
    *conflict = false;
    const char *node_id = NULL;
    for (size_t i = 0; !node_id && i < n; i++)
        if (w[i].outcome == PV_RESV_UNSETTLED && node_ids[i]) node_id = node_ids[i];
    if (!node_id) return PV_OK;
    size_t *grp = calloc(n, sizeof *grp), ngrp = 0;
    const char **res = calloc(n, sizeof *res);
    argv_buf a = {0};
    pv_node rec = {0};
    char *usage = NULL, rev[24] = "0";
    int rc = grp && res ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    /* a node gone: nothing to give back to, the records are just removed */
    if (rc == PV_OK && node_usage_get(r, k, node_id, &rec, st) != PV_OK && st->code != PV_NOT_FOUND)
        rc = st->code;
    if (rc == PV_OK) {
        snprintf(rev, sizeof rev, "%lld", (long long)rec.usage_rev);
        give_back_args(&a, base, node_id, rev, "", node, w, node_ids, resources, n, grp, &ngrp);
        for (size_t j = 0; j < ngrp; j++)
            res[j] = resources[grp[j]];
        if (rec.name) rc = usage_without(&rec, res, ngrp, &usage, st);
        if (rc == PV_OK && a.oom) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    redisReply *rep = NULL;
    if (rc == PV_OK) {
        a.v[3] = usage ? usage : "{}";
        rc = pv_redis_fcall(r, "pv_wl_remove_release", 0, NULL, (int)a.n, a.v, &rep, st);
    }
    if (rc == PV_OK && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "CONFLICT") == 0) {
        *conflict = true;
    } else if (rc == PV_OK && rep->type == REDIS_REPLY_ARRAY && rep->elements == 3 &&
               rep->element[1]->type == REDIS_REPLY_STRING) {
        /* MOVED: that one is refused, the others go again */
        for (size_t j = 0; j < ngrp; j++)
            if (strcmp(w[grp[j]].id, rep->element[1]->str) == 0) {
                w[grp[j]].outcome = PV_FAILED_PRECONDITION;
                w[grp[j]].moved_epoch = rep->element[2]->type == REDIS_REPLY_STRING
                                            ? strtoll(rep->element[2]->str, NULL, 10)
                                            : 0;
            }
    } else if (rc == PV_OK) {
        for (size_t j = 0; j < ngrp; j++)
            w[grp[j]].outcome = PV_OK;
    }
    if (rep) freeReplyObject(rep);
    argv_free(&a);
    pv_node_clear(&rec);
    PV_FREE(usage, grp, res);
    return rc;
}

int pv_resv_return_workloads(pv_redis *r, const pv_keys *k, const char *node, pv_resv_return *w,
                             size_t n, pv_status *st) {
    char base[PV_KEY_MAX];
    if (key_base(k, base, sizeof base, st) != PV_OK) return st->code;
    for (size_t i = 0; i < n; i++)
        w[i].outcome = PV_RESV_UNSETTLED;
    char **node_ids = calloc(n ? n : 1, sizeof *node_ids);
    char **resources = calloc(n ? n : 1, sizeof *resources);
    int rc = node_ids && resources ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    /* each round settles one node's workloads (or a refused one), or loses a race to a writer of
     * that node: those rounds are bounded by RETRIES, the others by n */
    int conflicts = 0;
    bool left = rc == PV_OK;
    while (rc == PV_OK && left) {
        bool conflict = false;
        rc = read_placements(r, k, w, n, node_ids, resources, st);
        if (rc == PV_OK)
            rc = give_back_node(r, k, base, node, w, n, node_ids, resources, &conflict, st);
        left = false;
        for (size_t i = 0; i < n; i++)
            left = left || w[i].outcome == PV_RESV_UNSETTLED;
        if (rc == PV_OK && conflict && ++conflicts >= RETRIES)
            rc = pv_status_set(st, PV_ABORTED,
                               "workloads of node %s: its usage kept changing; gave up after %d "
                               "tries",
                               node && *node ? node : "?", RETRIES);
        if (rc == PV_OK && conflict) cas_backoff(conflicts);
    }
    for (size_t i = 0; node_ids && resources && i < n; i++) {
        free(node_ids[i]);
        free(resources[i]);
    }
    PV_FREE(node_ids, resources);
    return rc;
}

int pv_resv_return_workload(pv_redis *r, const pv_keys *k, const char *workload_id, pv_status *st) {
    pv_resv_return w = {.id = workload_id};
    if (pv_resv_return_workloads(r, k, NULL, &w, 1, st) != PV_OK) return st->code;
    if (w.outcome == PV_NOT_FOUND)
        return pv_status_set(st, PV_NOT_FOUND, "workload %s not found", workload_id);
    return PV_OK;
}

int pv_resv_reincarnate_workload(pv_redis *r, const pv_keys *k, const char *workload_id,
                                 const char *node, int64_t epoch, const char *alloc_id,
                                 const char *engine_id, const char *labels, pv_status *st) {
    char e[24], nodes[PV_KEY_MAX];
    snprintf(e, sizeof e, "%lld", (long long)epoch);
    if (pv_key(k, PV_KEY_NODES, NULL, nodes, sizeof nodes, st) != PV_OK) return st->code;
    const char *extra[] = {node, e, alloc_id ? alloc_id : "", engine_id ? engine_id : "",
                           labels ? labels : ""};
    return give_back_cas(r, k, workload_id, "pv_wl_reincarnate", nodes, extra, 5, st);
}

/* A delta value: a number, or a size string with an optional leading '-' ("-512M"). */
static int delta_value(const char *plugin, const char *field, json_t *v, int sized, double *out,
                       pv_status *st) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return PV_OK;
    }
    const char *text = json_string_value(v);
    if (!text || !sized)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s: must be a number%s", plugin, field,
                             sized ? " or a size" : "");
    int neg = text[0] == '-';
    int64_t bytes = 0;
    if (pv_res_size_parse(text + neg, &bytes, st) != PV_OK)
        return pv_status_prefix(st, "%s: %s", plugin, field);
    *out = neg ? -(double)bytes : (double)bytes;
    return PV_OK;
}

/* old allocation + deltas -> the new allocation (the same document shape). */
static int realloc_doc(const char *old_alloc, const char *delta_json, char **out, pv_status *st) {
    static const struct {
        const char *plugin, *delta, *field;
        int sized, integer;
    } k_fields[] = {
        {"cpumem", "cpu-request", "cpu_request", 0, 0},
        {"cpumem", "cpu-limit", "cpu_limit", 0, 0},
        {"cpumem", "memory-request", "memory_request", 1, 1},
        {"cpumem", "memory-limit", "memory_limit", 1, 1},
        {"storage", "storage-request", "storage_request", 1, 1},
        {"storage", "storage-limit", "storage_limit", 1, 1},
    };
    json_t *alloc = json_loads(old_alloc ? old_alloc : "{}", 0, NULL);
    json_t *delta = json_loads(delta_json ? delta_json : "{}", 0, NULL);
    int rc = json_is_object(alloc) && json_is_object(delta)
                 ? PV_OK
                 : pv_status_set(st, PV_INVALID_ARGUMENT, "resources: not a JSON object");
    const char *plugin;
    json_t *doc;
    json_object_foreach(delta, plugin, doc) {
        if (rc != PV_OK) break;
        const char *field;
        json_t *v;
        json_object_foreach(doc, field, v) {
            size_t i = 0, n = sizeof k_fields / sizeof k_fields[0];
            while (i < n && (strcmp(k_fields[i].plugin, plugin) != 0 ||
                             strcmp(k_fields[i].delta, field) != 0))
                i++;
            if (i == n) {
                rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                                   "%s: %s: not a field ReallocResource can change", plugin, field);
                break;
            }
            double d = 0;
            if ((rc = delta_value(plugin, field, v, k_fields[i].sized, &d, st)) != PV_OK) break;
            json_t *pdoc = json_object_get(alloc, plugin);
            if (!pdoc) json_object_set_new(alloc, plugin, pdoc = json_object());
            if (strcmp(plugin, "cpumem") == 0 && strncmp(field, "cpu", 3) == 0 && d != 0 &&
                json_object_size(json_object_get(pdoc, "cpu_map")) > 0) {
                rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                                   "cpumem: %s: the workload is bound to cores; its cpu cannot "
                                   "change in place",
                                   field);
                break;
            }
            double now = json_number_value(json_object_get(pdoc, k_fields[i].field)) + d;
            if (now < 0) {
                rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                                   "%s: %s: the result %g would be negative", plugin, field, now);
                break;
            }
            json_object_set_new(pdoc, k_fields[i].field,
                                k_fields[i].integer ? json_integer((json_int_t)now)
                                                    : json_real(now));
        }
    }
    /* Eru's rule again: a limit below the request is raised to it. */
    json_t *cm = json_object_get(alloc, "cpumem");
    if (rc == PV_OK && cm) {
        if (json_number_value(json_object_get(cm, "cpu_limit")) <
            json_number_value(json_object_get(cm, "cpu_request")))
            json_object_set(cm, "cpu_limit", json_object_get(cm, "cpu_request"));
        if (json_integer_value(json_object_get(cm, "memory_limit")) <
            json_integer_value(json_object_get(cm, "memory_request")))
            json_object_set(cm, "memory_limit", json_object_get(cm, "memory_request"));
    }
    *out = rc == PV_OK ? pv_json_dumps(alloc, 0) : NULL;
    if (rc == PV_OK && !*out) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    json_decref(alloc);
    json_decref(delta);
    return rc;
}

int pv_resv_realloc_workload(pv_redis *r, const pv_keys *k, const char *workload_id,
                             const char *delta_json, char **new_alloc, pv_status *st) {
    if (new_alloc) *new_alloc = NULL;
    char base[PV_KEY_MAX];
    if (key_base(k, base, sizeof base, st) != PV_OK) return st->code;
    for (int attempt = 0; attempt < RETRIES; attempt++) {
        cas_backoff(attempt);
        char *node_id = NULL, *old = NULL;
        if (wl_placement(r, k, workload_id, &node_id, &old, st) != PV_OK) return st->code;
        if (node_id && !old) old = strdup("{}");
        pv_node node = {0};
        pv_res_node res = {0};
        char *fresh = NULL, *usage = NULL, *check = NULL, rev[24];
        int rc =
            node_id ? PV_OK : pv_status_set(st, PV_NOT_FOUND, "workload %s not found", workload_id);
        if (rc == PV_OK) rc = realloc_doc(old, delta_json, &fresh, st);
        if (rc == PV_OK) rc = node_usage_get(r, k, node_id, &node, st);
        if (rc == PV_OK) rc = pv_res_node_parse(node.resources, node.usage, NULL, &res, st);
        if (rc == PV_OK) rc = pv_res_node_usage_add(&res, old, -1, st);
        if (rc == PV_OK) rc = pv_res_node_usage_add(&res, fresh, 1, st);
        if (rc == PV_OK) rc = pv_res_node_usage_dump(&res, &usage, st);
        if (rc == PV_OK && pv_res_node_delta(node.resources, "{}", usage, &check, st) != PV_OK)
            rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, "node %s: not enough resource: %s",
                               node.name, st->msg);
        snprintf(rev, sizeof rev, "%lld", (long long)node.usage_rev);
        bool conflict = false;
        if (rc == PV_OK) {
            const char *args[] = {base, workload_id, rev, usage, fresh};
            redisReply *rep = NULL;
            rc = pv_redis_fcall(r, "pv_wl_realloc", 0, NULL, 5, args, &rep, st);
            conflict =
                rc == PV_OK && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "CONFLICT") == 0;
            if (rep) freeReplyObject(rep);
        }
        if (rc == PV_OK && !conflict && new_alloc) {
            *new_alloc = fresh;
            fresh = NULL;
        }
        free(node_id);
        free(old);
        free(fresh);
        free(usage);
        free(check);
        pv_res_node_free(&res);
        pv_node_clear(&node);
        if (rc != PV_OK) return rc;
        if (!conflict) return PV_OK;
    }
    return pv_status_set(st, PV_ABORTED,
                         "workload %s: its node's usage kept changing; gave up after %d tries",
                         workload_id, RETRIES);
}

int pv_resv_expired(pv_redis *r, const pv_keys *k, int64_t now_ms, size_t max, char ***ids,
                    size_t *n, pv_status *st) {
    *ids = NULL;
    *n = 0;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_RESVS, NULL, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "ZRANGEBYSCORE %s 1 %lld LIMIT 0 %lld", key,
                         (long long)now_ms, (long long)max) != PV_OK)
        return st->code;
    int rc = PV_OK;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements > 0) {
        *ids = calloc(rep->elements, sizeof **ids);
        for (size_t i = 0; *ids && i < rep->elements; i++) {
            if (!((*ids)[i] = strdup(rep->element[i]->str ? rep->element[i]->str : ""))) break;
            (*n)++;
        }
        if (*n != rep->elements) {
            pv_resv_ids_free(*ids, *n);
            *ids = NULL;
            *n = 0;
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        }
    }
    freeReplyObject(rep);
    return rc;
}

/* ---- reservations whose owner ended ---- */

/* HMGET <key of kind for names[i]> f1 f2 for each i in one pipeline; reps[i] set (caller frees
 * them) on PV_OK. A name that makes no key gets no command and reps[i] NULL. */
static int hmget_each(pv_redis *r, const pv_keys *k, pv_key_kind kind, char *const *names, size_t n,
                      const char *f1, const char *f2, redisReply **reps, pv_status *st) {
    bool *sent = calloc(n ? n : 1, sizeof *sent);
    if (!sent) return pv_status_set(st, PV_INTERNAL, "out of memory");
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        char key[PV_KEY_MAX];
        pv_status kst;
        if (!names[i] || pv_key(k, kind, names[i], key, sizeof key, &kst) != PV_OK) continue;
        const char *argv[] = {"HMGET", key, f1, f2};
        rc = pv_redis_append(r, 4, argv, NULL, st);
        sent[i] = rc == PV_OK;
    }
    /* every appended command's reply is read, whatever failed: the connection stays in step */
    for (size_t i = 0; i < n; i++) {
        reps[i] = NULL;
        if (!sent[i]) continue;
        pv_status gst;
        if (pv_redis_get_reply(r, &reps[i], &gst) != PV_OK && rc == PV_OK) {
            *st = gst;
            rc = gst.code;
        }
    }
    free(sent);
    for (size_t i = 0; rc != PV_OK && i < n; i++) {
        if (reps[i]) freeReplyObject(reps[i]);
        reps[i] = NULL;
    }
    return rc;
}

/* A two-field HMGET reply's field i as text, or NULL. */
static const char *field(const redisReply *rep, size_t i) {
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements <= i) return NULL;
    const redisReply *v = rep->element[i];
    return v->type == REDIS_REPLY_STRING ? v->str : NULL;
}

/* Whether an owner operation, as its status and finished_ms were read (op: that HMGET's reply),
 * lets its reservation go: it has no record (every record stores its status), or it ended more
 * than grace_ms before now_ms. */
static bool owner_gone(const redisReply *op, int64_t now_ms, int64_t grace_ms) {
    const char *status = field(op, 0), *finished = field(op, 1);
    if (!status) return op && op->type == REDIS_REPLY_ARRAY;
    bool done = strcmp(status, "SUCCEEDED") == 0 || strcmp(status, "FAILED") == 0 ||
                strcmp(status, "CANCELLED") == 0;
    return done && finished && strtoll(finished, NULL, 10) + grace_ms < now_ms;
}

int pv_resv_orphaned(pv_redis *r, const pv_keys *k, int64_t now_ms, int64_t grace_ms,
                     size_t *cursor, size_t max, char ***ids, size_t *n, pv_status *st) {
    *ids = NULL;
    *n = 0;
    char key[PV_KEY_MAX];
    if (max == 0 || pv_key(k, PV_KEY_RESVS, NULL, key, sizeof key, st) != PV_OK)
        return max == 0 ? PV_OK : st->code;
    redisReply *list = NULL;
    if (pv_redis_command(r, &list, st, "ZRANGE %s %lld %lld", key, (long long)*cursor,
                         (long long)(*cursor + max - 1)) != PV_OK)
        return st->code;
    size_t m = list->type == REDIS_REPLY_ARRAY ? list->elements : 0;
    *cursor = m < max ? 0 : *cursor + m; /* the sweep starts again after its last page */
    char **resv_ids = calloc(m ? m : 1, sizeof *resv_ids),
         **owners = calloc(m ? m : 1, sizeof *owners);
    redisReply **resvs = calloc(m ? m : 1, sizeof *resvs), **ops = calloc(m ? m : 1, sizeof *ops);
    int rc = resv_ids && owners && resvs && ops ? PV_OK
                                                : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < m; i++)
        resv_ids[i] = list->element[i]->type == REDIS_REPLY_STRING ? list->element[i]->str : NULL;
    if (rc == PV_OK)
        rc = hmget_each(r, k, PV_KEY_RESV, resv_ids, m, "owner", "created_ms", resvs, st);
    /* only operations' reservations made more than grace_ms ago: others are someone else's, and
     * a fresh one's operation may still be on its way */
    for (size_t i = 0; rc == PV_OK && i < m; i++) {
        const char *owner = field(resvs[i], 0), *created = field(resvs[i], 1);
        if (owner && strncmp(owner, "op-", 3) == 0 && created &&
            strtoll(created, NULL, 10) + grace_ms < now_ms)
            owners[i] = (char *)owner;
    }
    if (rc == PV_OK) rc = hmget_each(r, k, PV_KEY_OP, owners, m, "status", "finished_ms", ops, st);
    for (size_t i = 0; rc == PV_OK && i < m; i++) {
        if (!owners[i] || !owner_gone(ops[i], now_ms, grace_ms)) continue;
        if (!*ids && !(*ids = calloc(m, sizeof **ids))) {
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        } else if (!((*ids)[*n] = strdup(resv_ids[i]))) {
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        } else {
            (*n)++;
        }
    }
    if (rc != PV_OK) {
        pv_resv_ids_free(*ids, *n);
        *ids = NULL;
        *n = 0;
    }
    for (size_t i = 0; i < m; i++) {
        if (resvs && resvs[i]) freeReplyObject(resvs[i]);
        if (ops && ops[i]) freeReplyObject(ops[i]);
    }
    free(resv_ids);
    free(owners);
    free(resvs);
    free(ops);
    freeReplyObject(list);
    return rc;
}

/* qsort has no argument: the names by_sorted_name compares, set just before the one sort. */
static _Thread_local const char *const *sort_names;

static int by_sorted_name(const void *a, const void *b) {
    return strcmp(sort_names[*(const size_t *)a], sort_names[*(const size_t *)b]);
}

/* Fills counts from an HGETALL of the whole hash: names sorted once, each counted node found by
 * bsearch (an app on most of a 10,000-node pod is n log n, not n squared). */
static int counts_from_all(const redisReply *rep, const char *const *names, size_t n,
                           int64_t *counts, pv_status *st) {
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) return PV_OK;
    size_t *order = calloc(n, sizeof *order);
    if (!order) return pv_status_set(st, PV_INTERNAL, "out of memory");
    bool sorted = true; /* a pod's nodes come in name order already: no sort then */
    for (size_t i = 0; i < n; i++) {
        order[i] = i;
        if (i > 0 && sorted && strcmp(names[i - 1], names[i]) > 0) sorted = false;
    }
    sort_names = names;
    if (!sorted) qsort(order, n, sizeof *order, by_sorted_name);
    for (size_t j = 0; j + 1 < rep->elements; j += 2) {
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(names[order[mid]], rep->element[j]->str);
            if (c == 0) {
                counts[order[mid]] = strtoll(rep->element[j + 1]->str, NULL, 10);
                break;
            }
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
    }
    free(order);
    return PV_OK;
}

/* Fills counts from an HMGET of the names themselves. */
static int counts_of_names(pv_redis *r, const char *key, const char *const *names, size_t n,
                           int64_t *counts, pv_status *st) {
    const char **argv = malloc((n + 2) * sizeof *argv);
    if (!argv) return pv_status_set(st, PV_INTERNAL, "out of memory");
    argv[0] = "HMGET";
    argv[1] = key;
    memcpy(argv + 2, names, n * sizeof *names);
    redisReply *rep = NULL;
    int rc = pv_redis_commandv(r, &rep, st, (int)n + 2, argv, NULL);
    free(argv);
    if (rc != PV_OK) return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)
        rc = pv_status_set(st, PV_INTERNAL, "HMGET %s: unexpected reply", key);
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        if (rep->element[i]->type == REDIS_REPLY_STRING)
            counts[i] = strtoll(rep->element[i]->str, NULL, 10);
    freeReplyObject(rep);
    return rc;
}

int pv_resv_deploy_counts(pv_redis *r, const pv_keys *k, const char *app, const char *entry,
                          const char *const *names, size_t n, int64_t *counts, pv_status *st) {
    for (size_t i = 0; i < n; i++)
        counts[i] = 0;
    if (!app || !*app || n == 0) return PV_OK;
    char key[PV_KEY_MAX];
    if (pv_key2(k, PV_KEY_DEPLOY_COUNT, app, entry, key, sizeof key, st) != PV_OK) return st->code;
    if (n <= PV_RESV_COUNTS_BY_NAME) return counts_of_names(r, key, names, n, counts, st);
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HGETALL %s", key) != PV_OK) return st->code;
    int rc = counts_from_all(rep, names, n, counts, st);
    freeReplyObject(rep);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* GetNodeResource                                                                             */

void pv_resv_check_clear(pv_resv_check *c) {
    if (!c) return;
    free(c->resources);
    free(c->usage);
    strv_free(c->diffs, c->ndiffs);
    memset(c, 0, sizeof *c);
}

static int add_diff(pv_resv_check *c, const char *plugin, const char *field, const json_t *have,
                    const json_t *want, pv_status *st) {
    char *h = have ? pv_json_dumps(have, JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    char *w = want ? pv_json_dumps(want, JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    char *line = NULL;
    int len = asprintf(&line, "%s.%s: recorded %s, allocations add up to %s", plugin, field,
                       h ? h : "0", w ? w : "0");
    free(h);
    free(w);
    char **d = len >= 0 ? realloc(c->diffs, (c->ndiffs + 1) * sizeof *d) : NULL;
    if (!d) {
        free(line);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    c->diffs = d;
    d[c->ndiffs++] = line;
    return PV_OK;
}

/* One diff per plugin field whose recorded value is not what the allocations add up to. Both
 * sides are canonical dumps of pv_res, so equal usage compares equal whatever was written. */
static int compare_usage(pv_resv_check *c, const char *recorded, const char *summed,
                         pv_status *st) {
    json_t *a = json_loads(recorded, 0, NULL), *b = json_loads(summed, 0, NULL);
    int rc = PV_OK;
    json_t *sides[2] = {a, b};
    for (int s = 0; rc == PV_OK && s < 2; s++) {
        const char *plugin;
        json_t *doc;
        json_object_foreach(sides[s], plugin, doc) {
            json_t *other_doc = json_object_get(sides[1 - s], plugin);
            const char *field;
            json_t *v;
            json_object_foreach(doc, field, v) {
                json_t *o = json_object_get(other_doc, field);
                if (s == 1 && o) continue; /* both present: compared in the first pass */
                if (o && json_equal(v, o)) continue;
                rc = s == 0 ? add_diff(c, plugin, field, v, o, st)
                            : add_diff(c, plugin, field, NULL, v, st);
                if (rc != PV_OK) break;
            }
            if (rc != PV_OK) break;
        }
    }
    json_decref(a);
    json_decref(b);
    return rc;
}

/* Adds the allocation documents of a reply (an array of strings; nil entries skipped). */
static int add_docs(pv_res_node *sum, const redisReply *rep, pv_status *st) {
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_STRING) continue;
        if (pv_res_node_usage_add(sum, e->str, 1, st) != PV_OK) return st->code;
    }
    return PV_OK;
}

/* The node's usage as what it holds adds it up: the allocations still reserved there plus the
 * resources of the workloads created on it (pv_workload.h), which took theirs over. */
static int summed_usage(pv_redis *r, const pv_keys *k, const pv_node *rec, char **out,
                        pv_status *st) {
    pv_res_node sum = {0};
    int rc = pv_res_node_parse(rec->resources, NULL, NULL, &sum, st);
    redisReply *rep = NULL;
    char key[PV_KEY_MAX];
    if (rc == PV_OK) rc = pv_key(k, PV_KEY_NODE_ALLOCS, rec->id, key, sizeof key, st);
    if (rc == PV_OK) rc = pv_redis_command(r, &rep, st, "HVALS %s", key);
    if (rc == PV_OK) rc = add_docs(&sum, rep, st);
    if (rep) freeReplyObject(rep);
    rep = NULL;
    if (rc == PV_OK) rc = pv_key(k, PV_KEY_NODE_WORKLOADS, rec->id, key, sizeof key, st);
    if (rc == PV_OK) rc = pv_redis_command(r, &rep, st, "SMEMBERS %s", key);
    for (size_t i = 0; rc == PV_OK && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        redisReply *res = NULL;
        rc = pv_key(k, PV_KEY_WL, rep->element[i]->str, key, sizeof key, st);
        if (rc == PV_OK) rc = pv_redis_command(r, &res, st, "HGET %s resources", key);
        if (rc == PV_OK && res->type == REDIS_REPLY_STRING && strcmp(res->str, "{}") != 0)
            rc = pv_res_node_usage_add(&sum, res->str, 1, st);
        if (res) freeReplyObject(res);
        if (rc != PV_OK) pv_status_prefix(st, "workload %s", rep->element[i]->str);
    }
    if (rep) freeReplyObject(rep);
    if (rc == PV_OK) rc = pv_res_node_usage_dump(&sum, out, st);
    pv_res_node_free(&sum);
    return rc;
}

int pv_resv_check_node(pv_redis *r, const pv_keys *k, const char *node_name, int fix,
                       pv_resv_check *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    for (int attempt = 0; attempt < RETRIES; attempt++) {
        cas_backoff(attempt);
        pv_node rec = {0};
        pv_res_node res = {0};
        char *recorded = NULL, *summed = NULL;
        int rc = pv_registry_get_node(r, k, PV_REG_BY_NAME, node_name, &rec, st);
        if (rc == PV_OK) rc = pv_res_node_parse(rec.resources, rec.usage, NULL, &res, st);
        if (rc == PV_OK) rc = pv_res_node_usage_dump(&res, &recorded, st);
        if (rc == PV_OK) rc = pv_res_node_resources_dump(&res, &out->resources, st);
        if (rc == PV_OK) rc = summed_usage(r, k, &rec, &summed, st);
        if (rc == PV_OK) rc = compare_usage(out, recorded, summed, st);
        int moved = 0;
        if (rc == PV_OK && fix && out->ndiffs > 0) {
            char key[PV_KEY_MAX], rev[24];
            rc = pv_key(k, PV_KEY_NODE, rec.id, key, sizeof key, st);
            snprintf(rev, sizeof rev, "%lld", (long long)rec.usage_rev);
            const char *keys[] = {key}, *args[] = {rev, summed};
            redisReply *rep = NULL;
            if (rc == PV_OK)
                rc = pv_redis_fcall(r, "pv_sched_set_usage", 1, keys, 2, args, &rep, st);
            moved = rc == PV_OK && rep->type == REDIS_REPLY_INTEGER && rep->integer == 0;
            if (rep) freeReplyObject(rep);
            if (rc == PV_OK && !moved) {
                pv_res_node_free(&res);
                rc = pv_res_node_parse(rec.resources, summed, NULL, &res, st);
            }
        }
        if (rc == PV_OK && !moved) {
            pv_res_percent p;
            pv_res_node_percent(&res, &p);
            out->cpu_percent = p.cpu;
            out->memory_percent = p.memory;
            out->storage_percent = p.storage;
            out->volume_percent = p.volume;
            out->usage = (fix && out->ndiffs > 0) ? summed : recorded;
            if (out->usage == summed)
                summed = NULL;
            else
                recorded = NULL;
        }
        free(recorded);
        free(summed);
        pv_res_node_free(&res);
        pv_node_clear(&rec);
        if (rc != PV_OK) {
            pv_resv_check_clear(out);
            return rc;
        }
        if (!moved) return PV_OK;
        pv_resv_check_clear(out);
    }
    return pv_status_set(st, PV_ABORTED,
                         "node %s: its usage kept changing; fix gave up after %d tries", node_name,
                         RETRIES);
}
