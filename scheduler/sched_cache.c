/*
 * sched_cache: node records kept between plan requests (see sched_cache.h).
 *
 * An open-addressing table of entry pointers keyed by node id (entries never move, so pointers
 * handed out survive a resize), the change index's epoch and seq last read, per pod its
 * entries in name order, rebuilt only when the set of entries changed (gen), and per app the
 * deploy counts read, indexed by the entries' slots.
 */
#include "sched_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_id.h"
#include "pv_log.h"
#include "pv_record.h"
#include "pv_resv.h"
#include "sched_strategy.h"

/* Records read per call of pv_sched_nodes_since: a cold cache of 10,000 nodes takes 40 calls. */
#define READ_BATCH 256

/* One node's deploy count of an app, as read at the node's usage_rev (rev -1: not read). */
typedef struct count_slot {
    int64_t count;
    int64_t rev;
} count_slot;

/* The deploy counts of one app/entrypoint, by entry slot. */
typedef struct count_app {
    char *app, *entry;
    count_slot *s;
    size_t cap;      /* slots s holds */
    uint64_t resets; /* the cache's resets when s was last valid */
    uint64_t used;   /* the cache's clock when last asked: the least recent one goes */
} count_app;

/* A pod's entries in name order, as of the cache's gen. */
typedef struct pod_list {
    char *name;
    uint64_t gen;
    sched_cache_entry **e;
    size_t n;
} pod_list;

struct sched_cache {
    sched_cache_entry **slots;
    size_t cap; /* power of two */
    size_t n;
    uint64_t gen; /* bumped when an entry is added or dropped: pod lists are rebuilt */
    char epoch[64];
    char seq[32]; /* the change index's seq last read, as Redis wrote it */
    uint64_t view_no;
    pod_list *pods;
    size_t npods;
    uint64_t reads, views;
    uint64_t usage_reads; /* of the reads, those of a node's usage alone (pv_sched_nodes_since) */
    /* entry slots: the next never given, and those given back by dropped entries */
    uint32_t next_slot;
    uint32_t *free_slots;
    size_t nfree, free_cap;
    uint64_t resets; /* bumped when cached counts can no longer be trusted (see refresh) */
    count_app apps[SCHED_COUNT_APPS];
    size_t napps;
    uint64_t clock;
    uint64_t count_reads;
    bool batch;       /* sched_cache_batch: requests read together share a view */
    bool batch_fresh; /* a view of this batch followed the change index, and nothing since says
                       * the cache is behind */
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
    snprintf(c->seq, sizeof c->seq, "0");
    if (!(c->slots = calloc(c->cap, sizeof *c->slots))) {
        free(c);
        return NULL;
    }
    return c;
}

static void count_app_clear(count_app *a) {
    free(a->app);
    free(a->entry);
    free(a->s);
    memset(a, 0, sizeof *a);
}

void sched_cache_free(sched_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++)
        entry_free(c->slots[i]);
    for (size_t i = 0; i < c->napps; i++)
        count_app_clear(&c->apps[i]);
    free(c->free_slots);
    for (size_t i = 0; i < c->npods; i++) {
        free(c->pods[i].name);
        free(c->pods[i].e);
    }
    free(c->pods);
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

/* Rebuilds the table without the entries drop() names (freed). */
static int drop_where(sched_cache *c, bool (*drop)(const sched_cache_entry *, const void *),
                      const void *arg) {
    sched_cache_entry **keep = calloc(c->cap, sizeof *keep);
    if (!keep) return -1;
    if (c->free_cap < c->next_slot) { /* room for every slot ever given */
        uint32_t *more = realloc(c->free_slots, c->next_slot * sizeof *more);
        if (!more) {
            free(keep);
            return -1;
        }
        c->free_slots = more;
        c->free_cap = c->next_slot;
    }
    size_t kept = 0;
    for (size_t i = 0; i < c->cap; i++) {
        sched_cache_entry *e = c->slots[i];
        if (!e) continue;
        if (drop(e, arg)) {
            /* a slot given back may name another node next: counts read by slot go too */
            if (c->nfree < c->free_cap) c->free_slots[c->nfree++] = e->slot;
            c->resets++;
            entry_free(e);
            continue;
        }
        keep[find_slot(keep, c->cap, e->rec.id)] = e;
        kept++;
    }
    free(c->slots);
    c->slots = keep;
    if (kept != c->n) c->gen++;
    c->n = kept;
    return 0;
}

static bool has_id(const sched_cache_entry *e, const void *id) {
    return strcmp(e->rec.id, id) == 0;
}

/* e->res from e->rec's resources and usage (freed first). */
static void parse_res(sched_cache_entry *e) {
    pv_res_node_free(&e->res);
    pv_status pst;
    e->res_ok = pv_res_node_parse(e->rec.resources, e->rec.usage, NULL, &e->res, &pst) == PV_OK;
    e->res_err[0] = '\0';
    if (!e->res_ok) {
        memcpy(e->res_err, pst.msg, sizeof e->res_err);
        e->res_err[sizeof e->res_err - 1] = '\0';
        pv_warn("node %s (rev %lld) takes no part in plans: %s", e->rec.name, (long long)e->rec.rev,
                pst.msg);
    }
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
        if (posix_memalign((void **)&e, 64, sizeof *e) != 0) {
            pv_status_set(st, PV_INTERNAL, "out of memory");
            return NULL;
        }
        memset(e, 0, sizeof *e);
        e->slot = c->nfree > 0 ? c->free_slots[--c->nfree] : c->next_slot++;
        c->slots[i] = e;
        c->n++;
        c->gen++;
    } else {
        pv_node_clear(&e->rec);
        pv_res_node_free(&e->res);
    }
    e->rec = *rec;
    memset(rec, 0, sizeof *rec);
    const char *name = e->rec.name ? e->rec.name : "";
    e->name_key = sched_name_key(name);
    size_t len = strlen(name);
    e->name = len < sizeof e->name_buf ? memcpy(e->name_buf, name, len + 1) : name;
    e->bypass = e->rec.bypass;
    e->alive = e->rec.alive;
    e->usage_rev = e->rec.usage_rev;
    parse_res(e);
    c->reads++;
    return e;
}

/* ------------------------------------------------------------------------------------------ */
/* the change feed                                                                             */

/* What pv_sched_changes answered: {epoch, seq, full, {id, seq, ...}, {dead id, ...}}. */
typedef struct changes {
    redisReply *rep;
    const char *epoch, *seq;
    bool full;
    const redisReply *changed, *dead;
} changes;

static bool is_str(const redisReply *r) {
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

/* Whether the last view held a node of pod (its list is as of the cache's entries, not empty):
 * pv_sched_changes then skips reading the pod when no node changed since. */
static bool pod_known(const sched_cache *c, const char *pod) {
    for (size_t i = 0; pod && *pod && i < c->npods; i++)
        if (strcmp(c->pods[i].name, pod) == 0) return c->pods[i].gen == c->gen && c->pods[i].n > 0;
    return false;
}

static int read_changes(sched_cache *c, pv_redis *r, const pv_keys *k, const char *base,
                        const char *pod, changes *ch, pv_status *st) {
    char pods[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_PODS, NULL, pods, sizeof pods, st) != PV_OK) return st->code;
    const char *keys[] = {pods},
               *args[] = {base, c->seq, c->epoch, pod ? pod : "", pod_known(c, pod) ? "1" : "0"};
    memset(ch, 0, sizeof *ch);
    if (pv_redis_fcall(r, "pv_sched_changes", 1, keys, 5, args, &ch->rep, st) != PV_OK)
        return st->code;
    const redisReply *x = ch->rep;
    if (x->type != REDIS_REPLY_ARRAY || x->elements != 5 || !is_str(x->element[0]) ||
        !is_str(x->element[1]) || x->element[2]->type != REDIS_REPLY_INTEGER ||
        x->element[3]->type != REDIS_REPLY_ARRAY || x->element[3]->elements % 2 != 0 ||
        x->element[4]->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(ch->rep);
        ch->rep = NULL;
        return pv_status_set(st, PV_INTERNAL, "pv_sched_changes: unexpected reply");
    }
    ch->epoch = x->element[0]->str;
    ch->seq = x->element[1]->str;
    ch->full = x->element[2]->integer != 0;
    ch->changed = x->element[3];
    ch->dead = x->element[4];
    return PV_OK;
}

/* Builds the index when there is none (records written before it existed, or a Redis that
 * restarted empty); another scheduler may have built it first: its epoch is taken. */
static int build_index(pv_redis *r, const pv_keys *k, const char *base, pv_status *st) {
    char nodes[PV_KEY_MAX], epoch[PV_ID_MAX];
    if (pv_key(k, PV_KEY_NODES, NULL, nodes, sizeof nodes, st) != PV_OK) return st->code;
    if (pv_id_new("idx", epoch, sizeof epoch) != 0)
        return pv_status_set(st, PV_INTERNAL, "cannot make an id");
    const char *keys[] = {nodes}, *args[] = {base, epoch};
    redisReply *rep = NULL;
    if (pv_redis_fcall(r, "pv_sched_index", 1, keys, 2, args, &rep, st) != PV_OK) return st->code;
    pv_info("node change index: epoch %s", is_str(rep) ? rep->str : "?");
    freeReplyObject(rep);
    return PV_OK;
}

/* Takes a usage read alone ({'=', usage, usage_rev, rev, updated_ms}: only usage writes since
 * the entry's revisions) into e: the rest of its record is current. */
static int take_usage(sched_cache *c, sched_cache_entry *e, const redisReply *v, int64_t seq,
                      pv_status *st) {
    for (size_t i = 1; i < 5; i++)
        if (!is_str(v->element[i]))
            return pv_status_set(st, PV_INTERNAL, "pv_sched_nodes_since: unexpected reply");
    char *usage = strdup(v->element[1]->str);
    if (!usage) return pv_status_set(st, PV_INTERNAL, "out of memory");
    free(e->rec.usage);
    e->rec.usage = usage;
    e->rec.usage_rev = strtoll(v->element[2]->str, NULL, 10);
    e->rec.rev = strtoll(v->element[3]->str, NULL, 10);
    e->rec.updated_ms = strtoll(v->element[4]->str, NULL, 10);
    e->usage_rev = e->rec.usage_rev;
    e->seq = seq;
    parse_res(e);
    c->reads++;
    c->usage_reads++;
    return PV_OK;
}

static bool is_usage_reply(const redisReply *v) {
    return v->type == REDIS_REPLY_ARRAY && v->elements == 5 && is_str(v->element[0]) &&
           strcmp(v->element[0]->str, "=") == 0;
}

/* Reads what changed of the nodes ids[0..n) (with their index seqs) and stores it: the usage
 * alone of a cached node that only usage writes touched since, else the whole record (every
 * record when whole: a full answer, whose revisions may repeat with other contents); gone ones
 * are dropped. */
static int read_batch(sched_cache *c, pv_redis *r, const pv_keys *k, const char *base,
                      const char **ids, const int64_t *seqs, size_t n, bool whole, pv_status *st) {
    const char *args[3 * READ_BATCH + 1];
    char revs[READ_BATCH][2][24];
    sched_cache_entry *held[READ_BATCH];
    args[0] = base;
    for (size_t i = 0; i < n; i++) {
        held[i] = whole ? NULL : lookup(c, ids[i]);
        revs[i][0][0] = revs[i][1][0] = '\0';
        if (held[i]) {
            snprintf(revs[i][0], sizeof revs[i][0], "%lld", (long long)held[i]->rec.rev);
            snprintf(revs[i][1], sizeof revs[i][1], "%lld", (long long)held[i]->rec.usage_rev);
        }
        args[3 * i + 1] = ids[i];
        args[3 * i + 2] = revs[i][0];
        args[3 * i + 3] = revs[i][1];
    }
    redisReply *rep = NULL;
    if (pv_redis_fcall(r, "pv_sched_nodes_since", 0, NULL, 3 * (int)n + 1, args, &rep, st) != PV_OK)
        return st->code;
    int rc = PV_OK;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n)
        rc = pv_status_set(st, PV_INTERNAL, "pv_sched_nodes_since: unexpected reply");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const redisReply *flat = rep->element[i];
        if (held[i] && is_usage_reply(flat)) {
            rc = take_usage(c, held[i], flat, seqs[i], st);
            continue;
        }
        if (flat->type == REDIS_REPLY_ARRAY && flat->elements == 0) {
            if (drop_where(c, has_id, ids[i]) != 0)
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
            continue;
        }
        char key[PV_KEY_MAX];
        pv_node rec = {0};
        sched_cache_entry *e = NULL;
        if (pv_key(k, PV_KEY_NODE, ids[i], key, sizeof key, st) != PV_OK ||
            pv_record_decode(&pv_node_schema, key, flat, &rec, st) != PV_OK ||
            !(e = store(c, &rec, st)))
            rc = st->code;
        else
            e->seq = seqs[i];
        pv_node_clear(&rec);
    }
    freeReplyObject(rep);
    return rc;
}

static bool not_listed(const sched_cache_entry *e, const void *arg) {
    (void)arg;
    return !e->listed;
}

/* A full answer lists every node: entries it does not list left the registry. */
static int prune(sched_cache *c, const redisReply *changed, pv_status *st) {
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i]) c->slots[i]->listed = false;
    for (size_t i = 0; i + 1 < changed->elements; i += 2) {
        sched_cache_entry *e = lookup(c, changed->element[i]->str);
        if (e) e->listed = true;
    }
    if (drop_where(c, not_listed, NULL) != 0)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    return PV_OK;
}

/* Reads what changed since the last refresh and marks the nodes not alive now. */
static int refresh(sched_cache *c, pv_redis *r, const pv_keys *k, const char *pod, pv_status *st) {
    char base[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_REG, NULL, base, sizeof base, st) != PV_OK) return st->code;
    changes ch;
    if (read_changes(c, r, k, base, pod, &ch, st) != PV_OK) return st->code;
    if (!*ch.epoch) {
        freeReplyObject(ch.rep);
        if (build_index(r, k, base, st) != PV_OK ||
            read_changes(c, r, k, base, pod, &ch, st) != PV_OK)
            return st->code;
    }
    /* A full answer: another index (whose usage_revs may repeat with other counts: a Redis
     * restored from an older state), or a node removed. Counts cached by usage_rev go. */
    if (ch.full) c->resets++;
    int rc = ch.full ? prune(c, ch.changed, st) : PV_OK;
    const char *ids[READ_BATCH];
    int64_t seqs[READ_BATCH];
    size_t n = 0;
    for (size_t i = 0; rc == PV_OK && i + 1 < ch.changed->elements; i += 2) {
        const char *id = ch.changed->element[i]->str;
        int64_t seq = strtoll(ch.changed->element[i + 1]->str, NULL, 10);
        sched_cache_entry *e = lookup(c, id);
        if (e && e->seq == seq) continue;
        ids[n] = id;
        seqs[n++] = seq;
        if (n == READ_BATCH) {
            rc = read_batch(c, r, k, base, ids, seqs, n, ch.full, st);
            n = 0;
        }
    }
    if (rc == PV_OK && n > 0) rc = read_batch(c, r, k, base, ids, seqs, n, ch.full, st);
    if (rc == PV_OK) {
        snprintf(c->epoch, sizeof c->epoch, "%s", ch.epoch);
        snprintf(c->seq, sizeof c->seq, "%s", ch.seq);
        c->view_no++;
        for (size_t i = 0; i < ch.dead->elements; i++) {
            sched_cache_entry *e =
                is_str(ch.dead->element[i]) ? lookup(c, ch.dead->element[i]->str) : NULL;
            if (e) e->dead_view = c->view_no;
        }
    }
    freeReplyObject(ch.rep);
    return rc;
}

int sched_cache_refresh(sched_cache *c, pv_redis *r, const pv_keys *k, pv_status *st) {
    return refresh(c, r, k, "", st);
}

/* ------------------------------------------------------------------------------------------ */
/* pods                                                                                        */

static int by_name(const void *a, const void *b) {
    return strcmp((*(sched_cache_entry *const *)a)->name, (*(sched_cache_entry *const *)b)->name);
}

/* The pod's list, rebuilt when entries came or went since it was made. */
static pod_list *pod_of(sched_cache *c, const char *pod, pv_status *st) {
    pod_list *p = NULL;
    for (size_t i = 0; !p && i < c->npods; i++)
        if (strcmp(c->pods[i].name, pod) == 0) p = &c->pods[i];
    if (!p) {
        pod_list *more = realloc(c->pods, (c->npods + 1) * sizeof *more);
        if (!more) goto oom;
        c->pods = more;
        p = &c->pods[c->npods];
        *p = (pod_list){.name = strdup(pod), .gen = c->gen - 1};
        if (!p->name) goto oom;
        c->npods++;
    }
    if (p->gen == c->gen) return p;
    sched_cache_entry **e = calloc(c->n ? c->n : 1, sizeof *e);
    if (!e) goto oom;
    size_t n = 0;
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i] && c->slots[i]->rec.pod_name && strcmp(c->slots[i]->rec.pod_name, pod) == 0)
            e[n++] = c->slots[i];
    qsort(e, n, sizeof *e, by_name);
    free(p->e);
    p->e = e;
    p->n = n;
    p->gen = c->gen;
    return p;
oom:
    pv_status_set(st, PV_INTERNAL, "out of memory");
    return NULL;
}

/* Whether the cache holds nodes of pod with its entries as they are (a pod without nodes is
 * read every time: its removal must be seen). */
static bool pod_held(const sched_cache *c, const char *pod) {
    for (size_t i = 0; i < c->npods; i++)
        if (strcmp(c->pods[i].name, pod) == 0) return c->pods[i].gen == c->gen && c->pods[i].n > 0;
    return false;
}

void sched_cache_batch(sched_cache *c, bool on) {
    c->batch = on;
    c->batch_fresh = false;
}

void sched_cache_behind(sched_cache *c) {
    c->batch_fresh = false;
}

int sched_cache_view(sched_cache *c, pv_redis *r, const pv_keys *k, const char *pod,
                     sched_cache_entry ***out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    bool shared = c->batch && c->batch_fresh && pod_held(c, pod);
    if (!shared && refresh(c, r, k, pod, st) != PV_OK) return st->code;
    if (c->batch) c->batch_fresh = true;
    pod_list *p = pod_of(c, pod, st);
    if (!p) return st->code;
    sched_cache_entry **list = calloc(p->n ? p->n : 1, sizeof *list);
    if (!list) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < p->n; i++) {
        if (i + SCHED_PREFETCH < p->n) SCHED_PREFETCH_LINE(p->e[i + SCHED_PREFETCH], 0);
        p->e[i]->alive = p->e[i]->dead_view != c->view_no;
        list[i] = p->e[i];
    }
    c->views++;
    *out = list;
    *n = p->n;
    return PV_OK;
}

int sched_cache_node(sched_cache *c, pv_redis *r, const pv_keys *k, const char *name,
                     sched_cache_entry **out, pv_status *st) {
    *out = NULL;
    pv_node rec = {0};
    if (pv_registry_get_node(r, k, PV_REG_BY_NAME, name, &rec, st) != PV_OK) return st->code;
    sched_cache_entry *e = lookup(c, rec.id);
    if (e && e->rec.rev >= rec.rev) {
        e->alive = e->rec.alive = rec.alive;
    } else {
        int64_t seq = e ? e->seq : 0;
        if ((e = store(c, &rec, st))) e->seq = seq;
    }
    pv_node_clear(&rec);
    if (!e) return st->code;
    *out = e;
    return PV_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* deploy counts                                                                               */

/* The counts of app/entry, made (taking the place of the least recently used) when not held;
 * with room for every slot, and emptied when the cache was reset since they were read. */
static count_app *count_app_of(sched_cache *c, const char *app, const char *entry, pv_status *st) {
    count_app *a = NULL;
    for (size_t i = 0; !a && i < c->napps; i++)
        if (strcmp(c->apps[i].app, app) == 0 && strcmp(c->apps[i].entry, entry) == 0)
            a = &c->apps[i];
    if (!a) {
        if (c->napps < SCHED_COUNT_APPS) {
            a = &c->apps[c->napps++];
        } else {
            a = &c->apps[0];
            for (size_t i = 1; i < c->napps; i++)
                if (c->apps[i].used < a->used) a = &c->apps[i];
            count_app_clear(a);
        }
        a->resets = c->resets;
        if (!(a->app = strdup(app)) || !(a->entry = strdup(entry))) goto oom;
    }
    a->used = ++c->clock;
    if (a->cap < c->next_slot) {
        size_t cap = c->next_slot + c->next_slot / 4 + 64;
        count_slot *more = realloc(a->s, cap * sizeof *more);
        if (!more) goto oom;
        for (size_t i = a->cap; i < cap; i++)
            more[i] = (count_slot){0, -1};
        a->s = more;
        a->cap = cap;
    }
    if (a->resets != c->resets) {
        for (size_t i = 0; i < a->cap; i++)
            a->s[i] = (count_slot){0, -1};
        a->resets = c->resets;
    }
    return a;
oom:
    count_app_clear(a);
    *a = c->apps[--c->napps]; /* the last one takes its place (or it was the last) */
    memset(&c->apps[c->napps], 0, sizeof c->apps[c->napps]);
    pv_status_set(st, PV_INTERNAL, "out of memory");
    return NULL;
}

int sched_cache_deploy_counts(sched_cache *c, pv_redis *r, const pv_keys *k, const char *app,
                              const char *entry, sched_cache_entry *const *e, size_t n,
                              int64_t *counts, pv_status *st) {
    for (size_t i = 0; i < n; i++)
        counts[i] = 0;
    if (!app || !*app || n == 0) return PV_OK;
    count_app *a = count_app_of(c, app, entry ? entry : "", st);
    if (!a) return st->code;
    /* the nodes whose usage moved since their count was read: usually the few the last plans
     * took, all of them the first time */
    size_t *stale = malloc(n * sizeof *stale), m = 0;
    const char **names = malloc(n * sizeof *names);
    int64_t *read = malloc(n * sizeof *read);
    int rc = stale && names && read ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (a->s[e[i]->slot].rev == e[i]->usage_rev) continue;
        stale[m] = i;
        names[m++] = e[i]->name;
    }
    if (rc == PV_OK && m > 0)
        rc = pv_resv_deploy_counts(r, k, app, entry ? entry : "", names, m, read, st);
    for (size_t j = 0; rc == PV_OK && j < m; j++)
        a->s[e[stale[j]]->slot] = (count_slot){read[j], e[stale[j]]->usage_rev};
    if (rc == PV_OK) c->count_reads += m;
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        counts[i] = a->s[e[i]->slot].count;
    free(stale);
    free(names);
    free(read);
    return rc;
}

void sched_cache_reparse(sched_cache_entry *e) {
    parse_res(e);
}

void sched_cache_wrote(sched_cache *c, sched_cache_entry *e, char *usage, int64_t rev_before,
                       int64_t seq_after, int64_t written_ms, const char *app, const char *entry,
                       int64_t added) {
    if (e->rec.rev != rev_before) {
        /* written in Redis since it was read: the next view reads it (its seq moved) */
        free(usage);
        parse_res(e);
        c->batch_fresh = false;
        return;
    }
    int64_t was = e->rec.usage_rev;
    free(e->rec.usage);
    e->rec.usage = usage;
    e->rec.usage_rev++;
    e->rec.rev++;
    e->rec.updated_ms = written_ms;
    e->usage_rev = e->rec.usage_rev;
    e->seq = seq_after;
    for (size_t i = 0; app && *app && i < c->napps; i++) {
        count_app *a = &c->apps[i];
        if (strcmp(a->app, app) != 0 || strcmp(a->entry, entry ? entry : "") != 0) continue;
        if (a->resets == c->resets && e->slot < a->cap && a->s[e->slot].rev == was)
            a->s[e->slot] = (count_slot){a->s[e->slot].count + added, e->usage_rev};
    }
}

uint64_t sched_cache_count_reads(const sched_cache *c) {
    return c->count_reads;
}

uint64_t sched_cache_usage_reads(const sched_cache *c) {
    return c->usage_reads;
}

void sched_cache_stats(const sched_cache *c, size_t *entries, uint64_t *reads, uint64_t *views) {
    *entries = c->n;
    *reads = c->reads;
    *views = c->views;
}
