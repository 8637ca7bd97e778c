/*
 * sched_cache: node records kept between plan requests (see sched_cache.h).
 *
 * An open-addressing table of entry pointers keyed by node id (entries never move, so pointers
 * handed out survive a resize). A view with many stale entries (a cold cache, a pod-wide change)
 * reads the whole pod in one call instead of node by node.
 */
#include "sched_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "pv_time.h"
#include "pv_log.h"

/* Above this many stale entries one whole-pod read is cheaper than reading them one by one. */
#define BULK_READ_AT 32

struct sched_cache {
    sched_cache_entry **slots;
    size_t cap; /* power of two */
    size_t n;
    uint64_t reads, views;
};

static uint64_t hash_id(const char *s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static void entry_free(sched_cache_entry *e) {
    if (!e) return;
    pv_node_clear(&e->rec);
    pv_res_node_free(&e->res);
    free(e);
}

sched_cache *sched_cache_new(void) {
    sched_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cap = 256;
    if (!(c->slots = calloc(c->cap, sizeof *c->slots))) {
        free(c);
        return NULL;
    }
    return c;
}

void sched_cache_free(sched_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++)
        entry_free(c->slots[i]);
    free(c->slots);
    free(c);
}

static size_t find_slot(sched_cache_entry **slots, size_t cap, const char *id) {
    size_t i = (size_t)hash_id(id) & (cap - 1);
    while (slots[i] && strcmp(slots[i]->rec.id, id) != 0)
        i = (i + 1) & (cap - 1);
    return i;
}

static int grow(sched_cache *c) {
    size_t cap = c->cap * 2;
    sched_cache_entry **slots = calloc(cap, sizeof *slots);
    if (!slots) return -1;
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i]) slots[find_slot(slots, cap, c->slots[i]->rec.id)] = c->slots[i];
    free(c->slots);
    c->slots = slots;
    c->cap = cap;
    return 0;
}

static sched_cache_entry *lookup(sched_cache *c, const char *id) {
    return c->slots[find_slot(c->slots, c->cap, id)];
}

/* Takes rec (moved in: the caller's copy is zeroed) as the entry of its id, parsed. */
static sched_cache_entry *store(sched_cache *c, pv_node *rec, pv_status *st) {
    if ((c->n + 1) * 4 > c->cap * 3 && grow(c) != 0) {
        pv_status_set(st, PV_INTERNAL, "out of memory");
        return NULL;
    }
    size_t i = find_slot(c->slots, c->cap, rec->id);
    sched_cache_entry *e = c->slots[i];
    if (!e) {
        if (!(e = calloc(1, sizeof *e))) {
            pv_status_set(st, PV_INTERNAL, "out of memory");
            return NULL;
        }
        c->slots[i] = e;
        c->n++;
    } else {
        pv_node_clear(&e->rec);
        pv_res_node_free(&e->res);
    }
    e->rec = *rec;
    memset(rec, 0, sizeof *rec);
    pv_status pst;
    e->res_ok = pv_res_node_parse(e->rec.resources, e->rec.usage, NULL, &e->res, &pst) == PV_OK;
    e->res_err[0] = '\0';
    if (!e->res_ok) {
        memcpy(e->res_err, pst.msg, sizeof e->res_err);
        e->res_err[sizeof e->res_err - 1] = '\0';
        pv_warn("node %s (rev %lld) takes no part in plans: %s", e->rec.name, (long long)e->rec.rev,
                pst.msg);
    }
    e->last_used_ms = pv_time_now_ms();
    c->reads++;
    return e;
}

/* One row of a view: id name rev alive. */
typedef struct view_row {
    const char *id, *name;
    int64_t rev;
    bool alive;
} view_row;

static int read_view(pv_redis *r, const pv_keys *k, const char *pod, redisReply **rep,
                     pv_status *st) {
    char nodes[PV_KEY_MAX], pods[PV_KEY_MAX], base[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_NODES, NULL, nodes, sizeof nodes, st) != PV_OK ||
        pv_key(k, PV_KEY_PODS, NULL, pods, sizeof pods, st) != PV_OK ||
        pv_key(k, PV_KEY_REG, NULL, base, sizeof base, st) != PV_OK)
        return st->code;
    const char *keys[] = {nodes, pods}, *args[] = {base, pod};
    if (pv_redis_fcall(r, "pv_sched_view", 2, keys, 2, args, rep, st) != PV_OK) return st->code;
    if ((*rep)->type != REDIS_REPLY_ARRAY || (*rep)->elements % 4 != 0) {
        freeReplyObject(*rep);
        *rep = NULL;
        return pv_status_set(st, PV_INTERNAL, "pv_sched_view: unexpected reply");
    }
    return PV_OK;
}

static view_row row_at(const redisReply *rep, size_t i) {
    view_row v = {
        .id = rep->element[4 * i]->str,
        .name = rep->element[4 * i + 1]->str,
        .rev = strtoll(rep->element[4 * i + 2]->str, NULL, 10),
        .alive = strcmp(rep->element[4 * i + 3]->str, "1") == 0,
    };
    return v;
}

/* Re-reads the whole pod and stores every record. */
static int bulk_read(sched_cache *c, pv_redis *r, const pv_keys *k, const char *pod,
                     pv_status *st) {
    pv_node *nodes = NULL;
    size_t n = 0;
    if (pv_registry_list_nodes(r, k, pod, &nodes, &n, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        if (!store(c, &nodes[i], st)) rc = st->code;
    pv_node_array_free(nodes, n);
    return rc;
}

int sched_cache_view(sched_cache *c, pv_redis *r, const pv_keys *k, const char *pod,
                     sched_cache_entry ***out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    redisReply *rep = NULL;
    if (read_view(r, k, pod, &rep, st) != PV_OK) return st->code;
    size_t rows = rep->elements / 4, stale = 0;
    for (size_t i = 0; i < rows; i++) {
        view_row v = row_at(rep, i);
        sched_cache_entry *e = lookup(c, v.id);
        if (!e || e->rec.rev != v.rev) stale++;
    }
    int rc = PV_OK;
    if (stale >= BULK_READ_AT) rc = bulk_read(c, r, k, pod, st);
    sched_cache_entry **list = rows ? calloc(rows, sizeof *list) : NULL;
    if (rows && !list) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    int64_t now = pv_time_now_ms();
    for (size_t i = 0; rc == PV_OK && i < rows; i++) {
        view_row v = row_at(rep, i);
        sched_cache_entry *e = lookup(c, v.id);
        if (!e || e->rec.rev < v.rev) {
            pv_node rec = {0};
            rc = pv_registry_get_node(r, k, PV_REG_BY_ID, v.id, &rec, st);
            if (rc == PV_NOT_FOUND) { /* removed since the view: it takes no part */
                rc = PV_OK;
                continue;
            }
            if (rc == PV_OK && !(e = store(c, &rec, st))) rc = st->code;
            pv_node_clear(&rec);
            if (rc != PV_OK) break;
        }
        e->rec.alive = v.alive;
        e->last_used_ms = now;
        list[(*n)++] = e;
    }
    freeReplyObject(rep);
    if (rc != PV_OK) {
        free(list);
        *n = 0;
        return rc;
    }
    c->views++;
    *out = list;
    return PV_OK;
}

int sched_cache_node(sched_cache *c, pv_redis *r, const pv_keys *k, const char *name,
                     sched_cache_entry **out, pv_status *st) {
    *out = NULL;
    pv_node rec = {0};
    if (pv_registry_get_node(r, k, PV_REG_BY_NAME, name, &rec, st) != PV_OK) return st->code;
    sched_cache_entry *e = lookup(c, rec.id);
    if (e && e->rec.rev == rec.rev) {
        e->rec.alive = rec.alive;
        e->last_used_ms = pv_time_now_ms();
    } else {
        e = store(c, &rec, st);
    }
    pv_node_clear(&rec);
    if (!e) return st->code;
    *out = e;
    return PV_OK;
}

void sched_cache_sweep(sched_cache *c, int64_t max_idle_ms) {
    int64_t cutoff = pv_time_now_ms() - max_idle_ms;
    sched_cache_entry **keep = calloc(c->cap, sizeof *keep);
    if (!keep) return; /* try again at the next sweep */
    size_t kept = 0;
    for (size_t i = 0; i < c->cap; i++) {
        sched_cache_entry *e = c->slots[i];
        if (!e) continue;
        if (e->last_used_ms < cutoff) {
            entry_free(e);
            continue;
        }
        keep[find_slot(keep, c->cap, e->rec.id)] = e;
        kept++;
    }
    free(c->slots);
    c->slots = keep;
    c->n = kept;
}

void sched_cache_stats(const sched_cache *c, size_t *entries, uint64_t *reads, uint64_t *views) {
    *entries = c->n;
    *reads = c->reads;
    *views = c->views;
}
