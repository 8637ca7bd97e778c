/*
 * sched_place: plan requests against the registry (see sched_place.h).
 *
 * Every request works on a snapshot: the nodes read in one registry call, each parsed with its
 * recorded usage. Capacity answers from the snapshot alone. A reservation allocates on the
 * snapshot's parsed nodes and commits with the usage revisions the snapshot read, so a commit
 * that lost a race to another scheduler is refused whole and planned again from a new snapshot.
 */
#include "sched_place.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_buf.h"
#include "pv_log.h"
#include "pv_json.h"
#include "pv_registry.h"
#include "pv_res.h"
#include "pv_resv.h"
#include "pv_sched.h"
#include "sched_cache.h"

#define COMMIT_TRIES 16

/* ------------------------------------------------------------------------------------------ */
/* the request                                                                                 */

static void strv_free(char **v, size_t n) {
    if (!v) return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void sched_request_free(sched_request *req) {
    if (!req) return;
    free(req->pod);
    strv_free(req->includes, req->nincludes);
    strv_free(req->excludes, req->nexcludes);
    strv_free(req->label_keys, req->nlabels);
    strv_free(req->label_values, req->nlabels);
    free(req->resources);
    free(req->app);
    free(req->entry);
    free(req->owner);
    memset(req, 0, sizeof *req);
}

static int bad(pv_status *st, const char *field, const char *what) {
    return pv_status_set(st, PV_INVALID_ARGUMENT, "plan request: %s: %s", field, what);
}

static int take_string(json_t *j, const char *field, char **out, pv_status *st) {
    json_t *v = json_object_get(j, field);
    if (v && !json_is_string(v)) return bad(st, field, "must be a string");
    if (!(*out = strdup(v ? json_string_value(v) : "")))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    return PV_OK;
}

static int take_int(json_t *j, const char *field, int64_t dflt, int64_t *out, pv_status *st) {
    json_t *v = json_object_get(j, field);
    if (v && !json_is_integer(v)) return bad(st, field, "must be an integer");
    *out = v ? (int64_t)json_integer_value(v) : dflt;
    return PV_OK;
}

static int take_strings(json_t *j, const char *field, char ***out, size_t *n, pv_status *st) {
    json_t *v = json_object_get(j, field);
    if (!v) return PV_OK;
    if (!json_is_array(v)) return bad(st, field, "must be an array of strings");
    size_t count = json_array_size(v);
    if (count == 0) return PV_OK;
    if (!(*out = calloc(count, sizeof **out)))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s) return bad(st, field, "must be an array of strings");
        if (!((*out)[i] = strdup(s))) return pv_status_set(st, PV_INTERNAL, "out of memory");
        (*n)++;
    }
    return PV_OK;
}

static int take_labels(json_t *j, sched_request *req, pv_status *st) {
    json_t *v = json_object_get(j, "labels");
    if (!v) return PV_OK;
    if (!json_is_object(v)) return bad(st, "labels", "must be an object of strings");
    size_t count = json_object_size(v);
    if (count == 0) return PV_OK;
    req->label_keys = calloc(count, sizeof *req->label_keys);
    req->label_values = calloc(count, sizeof *req->label_values);
    if (!req->label_keys || !req->label_values)
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (!json_is_string(val)) return bad(st, "labels", "must be an object of strings");
        req->label_keys[req->nlabels] = strdup(key);
        req->label_values[req->nlabels] = strdup(json_string_value(val));
        req->nlabels++;
        if (!req->label_keys[req->nlabels - 1] || !req->label_values[req->nlabels - 1])
            return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    return PV_OK;
}

static int parse_fields(json_t *j, sched_request *req, pv_status *st) {
    int64_t strategy = 0, all = 0;
    json_t *res = json_object_get(j, "resources");
    if (res && !json_is_object(res)) return bad(st, "resources", "must be an object");
    json_t *a = json_object_get(j, "all");
    if (a && !json_is_boolean(a)) return bad(st, "all", "must be a boolean");
    all = a && json_is_true(a);
    int rc;
    if ((rc = take_string(j, "pod", &req->pod, st)) != PV_OK ||
        (rc = take_strings(j, "includes", &req->includes, &req->nincludes, st)) != PV_OK ||
        (rc = take_strings(j, "excludes", &req->excludes, &req->nexcludes, st)) != PV_OK ||
        (rc = take_labels(j, req, st)) != PV_OK ||
        (rc = take_int(j, "strategy", 0, &strategy, st)) != PV_OK ||
        (rc = take_int(j, "count", 0, &req->count, st)) != PV_OK ||
        (rc = take_int(j, "nodes_limit", 0, &req->nodes_limit, st)) != PV_OK ||
        (rc = take_string(j, "app", &req->app, st)) != PV_OK ||
        (rc = take_string(j, "entrypoint", &req->entry, st)) != PV_OK ||
        (rc = take_string(j, "owner", &req->owner, st)) != PV_OK ||
        (rc = take_int(j, "ttl_seconds", 600, &req->ttl_seconds, st)) != PV_OK)
        return rc;
    req->strategy = (int)strategy;
    req->all = (int)all;
    req->resources = res ? pv_json_dumps(res, 0) : strdup("{}");
    if (!req->resources) return pv_status_set(st, PV_INTERNAL, "out of memory");
    /* The request's documents are checked here too, so a bad one never reaches the plugins'
     * capacity code with half its fields. */
    pv_res_req check = {0};
    rc = pv_res_req_parse(req->resources, &check, st);
    pv_res_req_free(&check);
    return rc;
}

int sched_request_parse(const char *text, sched_request *req, pv_status *st) {
    memset(req, 0, sizeof *req);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    if (!json_is_object(j)) {
        json_decref(j);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "plan request: not a JSON object (%s)",
                             jerr.text);
    }
    int rc = parse_fields(j, req, st);
    json_decref(j);
    if (rc != PV_OK) sched_request_free(req);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* the snapshot                                                                                */

typedef struct snapshot {
    sched_cache *cache;
    sched_cache *own;      /* the cache made for this call when the caller gave none */
    sched_cache_entry **e; /* the nodes taking part, in name order (or includes order) */
    size_t n;
    sched_node *sn;     /* what the strategies see; names borrowed from the entries */
    bool in_name_order; /* e is (a pod's view) */
} snapshot;

static void snapshot_free(snapshot *s) {
    free(s->e);
    free(s->sn);
    sched_cache_free(s->own);
    memset(s, 0, sizeof *s);
}

static int in_list(char *const *v, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], name) == 0) return 1;
    return 0;
}

static int labels_match(const pv_node *node, const sched_request *req) {
    if (req->nlabels == 0) return 1;
    json_t *labels = json_loads(node->labels, 0, NULL);
    int ok = 1;
    for (size_t i = 0; ok && i < req->nlabels; i++) {
        const char *v = json_string_value(json_object_get(labels, req->label_keys[i]));
        ok = v && strcmp(v, req->label_values[i]) == 0;
    }
    json_decref(labels);
    return ok;
}

static int set_err(sched_error *err, const pv_status *st) {
    err->kind = SCHED_KIND_NONE;
    err->status = *st;
    return st->code;
}

/* Finds the nodes that take part. */
static int snapshot_nodes(pv_redis *r, const pv_keys *k, const sched_request *req, snapshot *s,
                          pv_status *st) {
    if (req->nincludes > 0) {
        if (!(s->e = calloc(req->nincludes, sizeof *s->e)))
            return pv_status_set(st, PV_INTERNAL, "out of memory");
        for (size_t i = 0; i < req->nincludes; i++) {
            if (in_list(req->excludes, req->nexcludes, req->includes[i])) continue;
            if (sched_cache_node(s->cache, r, k, req->includes[i], &s->e[s->n], st) != PV_OK)
                return st->code;
            s->n++;
        }
        return PV_OK;
    }
    if (!req->pod || !*req->pod)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "podname: required when no nodes are named");
    size_t n = 0;
    if (sched_cache_view(s->cache, r, k, req->pod, &s->e, &n, st) != PV_OK) return st->code;
    s->in_name_order = true;
    for (size_t i = 0; i < n; i++) {
        /* the entry's own fields (pv_node_down's), not its record's: one cache line per node */
        const sched_cache_entry *e = s->e[i];
        if ((req->all || (!e->bypass && e->alive)) && labels_match(&e->rec, req) &&
            (req->nexcludes == 0 || !in_list(req->excludes, req->nexcludes, e->name)))
            s->e[s->n++] = s->e[i];
    }
    return PV_OK;
}

/* Keeps only the nodes where at least one instance fits, in order, as Eru does: its plugins list
 * only those, so neither DUMMY's answer nor the strategies ever see a full node. */
static void snapshot_keep_fitting(snapshot *s) {
    size_t kept = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->sn[i].capacity <= 0) continue;
        s->e[kept] = s->e[i];
        s->sn[kept] = s->sn[i];
        kept++;
    }
    s->n = kept;
}

/* Computes what fits on every node. A node whose record does not parse takes no part (its
 * cache entry logged why when it was read): one damaged record must not stop every deploy. */
static int snapshot_load(sched_cache *cache, pv_redis *r, const pv_keys *k,
                         const sched_request *req, const pv_res_req *rq, snapshot *s,
                         pv_status *st) {
    memset(s, 0, sizeof *s);
    if (!cache && !(cache = s->own = sched_cache_new()))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    s->cache = cache;
    if (snapshot_nodes(r, k, req, s, st) != PV_OK) return st->code;
    if (s->n == 0) return PV_OK;
    s->sn = calloc(s->n, sizeof *s->sn);
    const char **names = calloc(s->n, sizeof *names);
    int64_t *counts = calloc(s->n, sizeof *counts);
    int rc = PV_OK;
    if (!s->sn || !names || !counts) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && !s->in_name_order && i < s->n; i++)
        names[i] = s->e[i]->name;
    /* A pod's view: the counts the cache holds, read again only where a node's usage moved.
     * Named nodes (few, read now by name) have theirs read now too. DUMMY's answer (each node's
     * capacity) does not depend on them: none are read. */
    const char *app = req->strategy == SCHED_DUMMY ? "" : req->app;
    if (rc == PV_OK && s->in_name_order)
        rc = sched_cache_deploy_counts(s->cache, r, k, app, req->entry, s->e, s->n, counts, st);
    else if (rc == PV_OK)
        rc = pv_resv_deploy_counts(r, k, app, req->entry, names, s->n, counts, st);
    for (size_t i = 0; rc == PV_OK && i < s->n; i++) {
        if (i + SCHED_PREFETCH < s->n) {
            for (int line = 1; line < 4; line++) /* the name, the parsed resources */
                SCHED_PREFETCH_LINE(s->e[i + SCHED_PREFETCH], line);
        }
        sched_node *sn = &s->sn[i];
        sn->name = s->e[i]->name;
        sn->tie = sched_tie(req->seed, s->e[i]->name_key);
        sn->count = counts[i];
        pv_status nst;
        pv_res_cap cap = {0};
        if (!s->e[i]->res_ok || pv_res_node_capacity(&s->e[i]->res, rq, &cap, &nst) != PV_OK)
            continue;
        sn->capacity = cap.capacity == PV_RES_UNBOUNDED ? INT64_MAX / 4 : cap.capacity;
        sn->usage = cap.usage;
        sn->rate = cap.rate;
    }
    free(names);
    free(counts);
    if (rc == PV_OK) snapshot_keep_fitting(s);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* capacity                                                                                    */

typedef struct name_count {
    const char *name;
    int64_t count;
    size_t at;
} name_count;

static int by_name_count(const void *a, const void *b) {
    const name_count *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* The reply in pv_sched.h's capacity format. A pod's nodes come in name order already; named
 * nodes (includes order) are sorted, so every answer lists its nodes by name. */
static int capacity_body(const snapshot *s, const sched_plan *plan, char **body, pv_status *st) {
    size_t cap = s->n ? s->n : 1;
    name_count *nc = s->in_name_order ? NULL : malloc(cap * sizeof *nc);
    const char **names = malloc(cap * sizeof *names);
    int64_t *counts = malloc(cap * sizeof *counts);
    int rc = PV_OK;
    if (!names || !counts || (!s->in_name_order && !nc))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; rc == PV_OK && i < s->n; i++) {
        if (!plan->listed[i]) continue;
        if (nc) nc[n] = (name_count){s->e[i]->name, plan->deploy[i], i};
        names[n] = s->e[i]->name;
        counts[n++] = plan->deploy[i];
    }
    if (rc == PV_OK && nc) {
        /* a node named twice is listed once, with its last value (as a JSON object's key) */
        qsort(nc, n, sizeof *nc, by_name_count);
        size_t kept = 0;
        for (size_t j = 0; j < n; j++) {
            if (j + 1 < n && strcmp(nc[j].name, nc[j + 1].name) == 0) continue;
            names[kept] = nc[j].name;
            counts[kept++] = nc[j].count;
        }
        n = kept;
    }
    if (rc == PV_OK) rc = pv_sched_capacity_write(names, counts, n, plan->total, body, st);
    free(nc);
    free(names);
    free(counts);
    return rc;
}

int sched_place_capacity(sched_cache *cache, pv_redis *r, const pv_keys *k,
                         const sched_request *req, char **reply, sched_error *err) {
    *reply = NULL;
    pv_status st;
    pv_res_req rq = {0};
    if (pv_res_req_parse(req->resources, &rq, &st) != PV_OK) return set_err(err, &st);
    snapshot s;
    int rc = snapshot_load(cache, r, k, req, &rq, &s, &st);
    pv_res_req_free(&rq);
    if (rc != PV_OK) {
        snapshot_free(&s);
        return set_err(err, &st);
    }
    sched_plan plan = {0};
    if (req->strategy == SCHED_DUMMY)
        rc = sched_dummy(s.sn, s.n, &plan, err);
    else
        rc = sched_plan_make(req->strategy, s.sn, s.n, req->count, sched_total(s.sn, s.n),
                             req->nodes_limit, &plan, err);
    if (rc == PV_OK && capacity_body(&s, &plan, reply, &st) != PV_OK) rc = set_err(err, &st);
    sched_plan_free(&plan);
    snapshot_free(&s);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* reservations                                                                                */

/* Allocates the plan's instances on one node's parsed entry in place: the cache takes the result
 * when the commit is made, else parses the entry again (allocated_done). */
static int allocate_node(sched_cache_entry *e, int64_t count, const pv_res_req *rq, pv_resv *rv,
                         size_t *seq, pv_status *st) {
    pv_resv_node *rn = pv_resv_add_node(rv, e->rec.id, e->rec.name, e->rec.usage_rev);
    if (!rn) return pv_status_set(st, PV_INTERNAL, "out of memory");
    pv_res_node *node = &e->res;
    int rc = PV_OK;
    for (int64_t j = 0; rc == PV_OK && j < count; j++) {
        char *alloc = NULL;
        if ((rc = pv_res_node_alloc(node, rq, &alloc, st)) != PV_OK) break;
        rc = pv_resv_node_add_alloc(rn, rv->id, (*seq)++, alloc, st);
        free(alloc);
    }
    if (rc == PV_OK) rc = pv_res_node_usage_dump(node, &rn->usage, st);
    if (rc != PV_OK) pv_status_prefix(st, "node %s", e->rec.name);
    return rc;
}

/* Allocates the plan on its nodes and fills rv; *touched (one per node of rv, in its order; the
 * caller frees it) gets the entries allocated on, even when it fails half way. */
static int allocate(const snapshot *s, const sched_plan *plan, const pv_res_req *rq, pv_resv *rv,
                    sched_cache_entry ***touched, pv_status *st) {
    size_t seq = 0;
    if (!(*touched = calloc(s->n ? s->n : 1, sizeof **touched)))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < s->n; i++) {
        if (plan->deploy[i] <= 0) continue;
        (*touched)[rv->nnodes] = s->e[i];
        int rc = allocate_node(s->e[i], plan->deploy[i], rq, rv, &seq, st);
        /* a node entry added to rv (or not, out of memory) before the allocation failed */
        if (rc != PV_OK) {
            if (rv->nnodes == 0 || (*touched)[rv->nnodes - 1] != s->e[i])
                sched_cache_reparse(s->e[i]);
            return rc;
        }
    }
    return PV_OK;
}

/* Appends text as a JSON string; false when it is not one (not UTF-8) or out of memory. */
static bool add_json_string(pv_buf *b, const char *text) {
    json_t *j = json_string(text);
    char *quoted = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    if (!quoted) return false;
    pv_buf_addf(b, "%s", quoted);
    free(quoted);
    return true;
}

/* The reservation's reply, written as text: its allocations are JSON documents already (pv_res)
 * and go in as they are, where parsing each one into a tree to dump it again was a fifth of a
 * 50-instance reservation's CPU. Nodes by name; a node named twice (includes) once, with its
 * last entry, as a JSON object's key would be. */
static int reply_body(const pv_resv *rv, int64_t total, char **out, pv_status *st) {
    *out = NULL;
    name_count *nc = malloc((rv->nnodes ? rv->nnodes : 1) * sizeof *nc);
    if (!nc) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t j = 0; j < rv->nnodes; j++)
        nc[j] = (name_count){rv->nodes[j].name, (int64_t)rv->nodes[j].nallocs, j};
    qsort(nc, rv->nnodes, sizeof *nc, by_name_count);
    size_t n = 0;
    for (size_t j = 0; j < rv->nnodes; j++)
        if (j + 1 == rv->nnodes || strcmp(nc[j].name, nc[j + 1].name) != 0) nc[n++] = nc[j];
    pv_buf b = {0};
    bool ok = true;
    pv_buf_addf(&b, "{\"allocations\": {");
    for (size_t j = 0; ok && j < n; j++) {
        const pv_resv_node *rn = &rv->nodes[nc[j].at];
        pv_buf_addf(&b, "%s", j ? ", " : "");
        ok = add_json_string(&b, rn->name);
        pv_buf_addf(&b, ": [");
        for (size_t a = 0; ok && a < rn->nallocs; a++) {
            pv_buf_addf(&b, "%s{\"id\": ", a ? ", " : "");
            ok = add_json_string(&b, rn->alloc_ids[a]);
            pv_buf_addf(&b, ", \"resources\": %s}", rn->allocs[a]);
        }
        pv_buf_addf(&b, "]");
    }
    pv_buf_addf(&b, "}, \"plan\": {");
    for (size_t j = 0; ok && j < n; j++) {
        pv_buf_addf(&b, "%s", j ? ", " : "");
        ok = add_json_string(&b, nc[j].name);
        pv_buf_addf(&b, ": %lld", (long long)nc[j].count);
    }
    pv_buf_addf(&b, "}, \"reservation\": ");
    ok = ok && add_json_string(&b, rv->id);
    pv_buf_addf(&b, ", \"total\": %lld}", (long long)total);
    free(nc);
    if (!ok || b.oom) {
        pv_buf_free(&b);
        return pv_status_set(st, PV_INTERNAL, "reservation %s: cannot write its reply", rv->id);
    }
    *out = b.s;
    return PV_OK;
}

/* The cache's entries allocated on take the committed usage, or are parsed again from their
 * records when nothing was committed (sched_cache.h). */
static void allocated_done(sched_cache *cache, sched_cache_entry **touched, pv_resv *rv,
                           bool committed) {
    for (size_t j = 0; touched && j < rv->nnodes; j++) {
        pv_resv_node *n = &rv->nodes[j];
        if (!committed || !n->usage) {
            sched_cache_reparse(touched[j]);
            continue;
        }
        sched_cache_wrote(cache, touched[j], n->usage, n->rev_before, n->seq_after, n->written_ms,
                          rv->app, rv->entry, (int64_t)n->nallocs);
        n->usage = NULL; /* taken over */
    }
}

/* One attempt: snapshot, plan, allocate, commit. *outcome says how the commit went. */
static int reserve_once(sched_cache *cache, pv_redis *r, const pv_keys *k, const sched_request *req,
                        const pv_res_req *rq, const char *request_id, const char *resv_id,
                        int64_t now_ms, pv_resv_outcome *outcome, char **reply_out,
                        sched_error *err) {
    pv_status st;
    snapshot s;
    if (snapshot_load(cache, r, k, req, rq, &s, &st) != PV_OK) {
        snapshot_free(&s);
        return set_err(err, &st);
    }
    sched_plan plan = {0};
    int rc = sched_plan_make(req->strategy, s.sn, s.n, req->count, sched_total(s.sn, s.n),
                             req->nodes_limit, &plan, err);
    pv_resv rv = {0};
    char *body = NULL;
    sched_cache_entry **touched = NULL;
    if (rc == PV_OK) {
        snprintf(rv.id, sizeof rv.id, "%s", resv_id);
        rv.pod = strdup(req->pod ? req->pod : "");
        rv.owner = strdup(req->owner ? req->owner : "");
        rv.app = strdup(req->app ? req->app : "");
        rv.entry = strdup(req->entry ? req->entry : "");
        rv.expires_ms = req->ttl_seconds > 0 ? now_ms + req->ttl_seconds * 1000 : 0;
        if (!rv.pod || !rv.owner || !rv.app || !rv.entry)
            rc = set_err(err, (pv_status_set(&st, PV_INTERNAL, "out of memory"), &st));
    }
    if (rc == PV_OK && (allocate(&s, &plan, rq, &rv, &touched, &st) != PV_OK ||
                        reply_body(&rv, plan.total, &body, &st) != PV_OK))
        rc = set_err(err, &st);
    if (rc == PV_OK) {
        char moved[256] = "";
        const pv_resv_ack *ack = req->ack.stream ? &req->ack : NULL;
        if (pv_resv_commit_acking(r, k, &rv, request_id, body, 0, ack, outcome, moved, sizeof moved,
                                  &st) != PV_OK)
            rc = set_err(err, &st);
        else if (*outcome == PV_RESV_COMMITTED && ack && req->acked)
            *req->acked = true;
        else if (*outcome == PV_RESV_CONFLICT)
            pv_debug("reservation %s: node %s moved; planning again", resv_id, moved);
        /* planned again on a fresh view, even within a batch */
        if (*outcome == PV_RESV_CONFLICT) sched_cache_behind(s.cache);
    }
    allocated_done(s.cache, touched, &rv, rc == PV_OK && *outcome == PV_RESV_COMMITTED);
    free(touched);
    if (rc == PV_OK && *outcome == PV_RESV_COMMITTED && reply_out) {
        *reply_out = body;
        body = NULL;
    }
    free(body);
    pv_resv_clear(&rv);
    sched_plan_free(&plan);
    snapshot_free(&s);
    return rc;
}

int sched_place_reserve(sched_cache *cache, pv_redis *r, const pv_keys *k, const sched_request *req,
                        const char *request_id, int64_t now_ms, char **reply_out,
                        sched_error *err) {
    if (reply_out) *reply_out = NULL;
    pv_status st;
    char resv_id[PV_ID_MAX];
    /* "plan-<ulid>" -> "resv-<ulid>": the same request always names the same reservation. */
    const char *dash = request_id ? strchr(request_id, '-') : NULL;
    if (dash)
        snprintf(resv_id, sizeof resv_id, "resv%s", dash);
    else if (pv_id_new("resv", resv_id, sizeof resv_id) != 0)
        return set_err(err, (pv_status_set(&st, PV_INTERNAL, "cannot make an id"), &st));
    pv_res_req rq = {0};
    if (pv_res_req_parse(req->resources, &rq, &st) != PV_OK) return set_err(err, &st);
    int rc = PV_OK;
    pv_resv_outcome outcome = PV_RESV_CONFLICT;
    for (int attempt = 0; rc == PV_OK && outcome == PV_RESV_CONFLICT && attempt < COMMIT_TRIES;
         attempt++)
        rc = reserve_once(cache, r, k, req, &rq, request_id, resv_id, now_ms, &outcome, reply_out,
                          err);
    pv_res_req_free(&rq);
    if (rc != PV_OK) return rc;
    if (outcome == PV_RESV_CONFLICT) {
        pv_status_set(&st, PV_ABORTED,
                      "reservation %s: the nodes kept changing under %d plans; try again", resv_id,
                      COMMIT_TRIES);
        return set_err(err, &st);
    }
    if (outcome == PV_RESV_DUPLICATE) {
        /* The same request again (a requester retrying with its id, or a takeover after the
         * commit): the reservation stands as made; the requester reads it with pv_resv_get. */
        pv_status_set(&st, PV_ALREADY_EXISTS, "reservation %s was made for this request already",
                      resv_id);
        return set_err(err, &st);
    }
    if (outcome == PV_RESV_ABANDONED)
        pv_info("reservation %s: its requester gave up before the commit; nothing reserved",
                resv_id);
    return PV_OK;
}
