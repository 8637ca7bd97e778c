/*
 * pv_op: Operation records on Redis streams (see pv_op.h for the contract and the key schema).
 *
 * Every write is one call of a function of shared/store/redis/functions.lua, so a record, its
 * stream entry, its locks, the index and the events stream never disagree, and the fencing check of
 * a worker's write happens in the same atomic step as the write. This file stays thin: it builds
 * the key names from the prefix, passes arguments as strings and parses the replies; every
 * decision about state lives in the functions, where it is atomic.
 *
 * Two conventions of the functions matter here:
 * - A record comes back as a flat field/value array (as HGETALL gives it), so one table-driven
 *   parser fills a pv_op from any reply.
 * - A function that must release the locks of an operation whose holds the caller did not know
 *   (it had only the id, or only the target) writes nothing and answers {need_locks, target,
 *   holds}; fcall_locked then calls again with every lock key declared.
 */
#include "pv_op.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_RETENTION_SECONDS (7 * 24 * 3600)
#define DEFAULT_EVENTS_MAXLEN 100000
#define LIST_PAGE 100
#define LIST_DEFAULT_LIMIT 100
#define LIST_MAX_LIMIT 1000
#define PROMOTE_BATCH 100
#define PROMOTE_MAX_ROUNDS 100

/* ---- statuses ---- */

/* NULL-terminated for the record's field table (PV_FIELD_ENUM). */
static const char *const status_names[] = {"UNSPECIFIED", "PENDING",   "RUNNING", "SUCCEEDED",
                                           "FAILED",      "CANCELLED", NULL};

const char *pv_op_status_name(pv_op_status s) {
    if ((int)s < 0 || (size_t)s >= sizeof status_names / sizeof status_names[0] - 1)
        return status_names[0];
    return status_names[s];
}

int pv_op_status_parse(const char *name, pv_op_status *out) {
    for (int s = PV_OP_PENDING; s <= PV_OP_CANCELLED; s++)
        if (name && strcmp(name, status_names[s]) == 0) {
            *out = (pv_op_status)s;
            return 0;
        }
    return -1;
}

bool pv_op_done(const pv_op *op) {
    return op->status == PV_OP_SUCCEEDED || op->status == PV_OP_FAILED ||
           op->status == PV_OP_CANCELLED;
}

/* ---- records ---- */

/* The record fields a pv_op carries; the others (token, lease, holds, ...) stay in Redis. */
static const pv_field k_op_fields[] = {
    {.name = "id",
     .type = PV_FIELD_CHARS,
     .off = offsetof(pv_op, id),
     .cap = PV_ID_MAX,
     .required = true},
    {.name = "kind", .type = PV_FIELD_STR, .off = offsetof(pv_op, kind)},
    {.name = "target", .type = PV_FIELD_STR, .off = offsetof(pv_op, target)},
    {.name = "queue", .type = PV_FIELD_STR, .off = offsetof(pv_op, queue)},
    {.name = "status",
     .type = PV_FIELD_ENUM,
     .off = offsetof(pv_op, status),
     .names = status_names},
    {.name = "progress", .type = PV_FIELD_INT, .off = offsetof(pv_op, progress)},
    {.name = "message", .type = PV_FIELD_STR, .off = offsetof(pv_op, message)},
    {.name = "error_code", .type = PV_FIELD_INT, .off = offsetof(pv_op, error_code)},
    {.name = "error_message", .type = PV_FIELD_STR, .off = offsetof(pv_op, error_message)},
    {.name = "created_ms", .type = PV_FIELD_I64, .off = offsetof(pv_op, created_ms)},
    {.name = "updated_ms", .type = PV_FIELD_I64, .off = offsetof(pv_op, updated_ms)},
    {.name = "started_ms", .type = PV_FIELD_I64, .off = offsetof(pv_op, started_ms)},
    {.name = "finished_ms", .type = PV_FIELD_I64, .off = offsetof(pv_op, finished_ms)},
    {.name = "attempts", .type = PV_FIELD_INT, .off = offsetof(pv_op, attempts)},
    {.name = "max_attempts", .type = PV_FIELD_INT, .off = offsetof(pv_op, max_attempts)},
    {.name = "worker", .type = PV_FIELD_STR, .off = offsetof(pv_op, worker)},
    {.name = "request_id", .type = PV_FIELD_STR, .off = offsetof(pv_op, request_id)},
    {.name = "cancel_requested", .type = PV_FIELD_BOOL, .off = offsetof(pv_op, cancel_requested)},
    {.name = "params", .type = PV_FIELD_STR, .off = offsetof(pv_op, params), .dflt = "{}"},
    {.name = "metadata", .type = PV_FIELD_STR, .off = offsetof(pv_op, metadata), .dflt = "{}"},
    {.name = "entry", .type = PV_FIELD_STR, .off = offsetof(pv_op, entry)},
    {.name = "unjournaled", .type = PV_FIELD_BOOL, .off = offsetof(pv_op, unjournaled)},
};

const pv_record_schema pv_op_schema = {"operation", k_op_fields, PV_RECORD_NFIELDS(k_op_fields),
                                       sizeof(pv_op), 0};

void pv_op_clear(pv_op *op) {
    pv_record_free(&pv_op_schema, op);
}

void pv_op_array_free(pv_op *ops, size_t n) {
    pv_record_array_free(&pv_op_schema, ops, n);
}

static int parse_i64(const char *s, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') return -1;
    *out = v;
    return 0;
}

/* Fills *out from a flat field/value array (the record of operation id, named in messages).
 * Unknown fields (journal "j:<step>", the lease, the token, ...) are skipped. */
static int parse_record(const pv_keys *k, const char *id, const redisReply *a, pv_op *out,
                        pv_status *st) {
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_OP, id, key, sizeof key, NULL) != PV_OK) snprintf(key, sizeof key, "?");
    return pv_record_decode(&pv_op_schema, key, a, out, st);
}

/* ---- the keys and arguments of one call (pv_strv: an add that fails sets oom) ---- */

/* Whether s holds str past index from (lock keys are few: a linear look). */
static bool strv_has(const pv_strv *s, size_t from, const char *str) {
    for (size_t i = from; i < s->n; i++)
        if (strcmp(s->v[i], str) == 0) return true;
    return false;
}

/* ---- calls ---- */

static int opts_retention(const pv_op_opts *o) {
    return o && o->retention_seconds > 0 ? o->retention_seconds : DEFAULT_RETENTION_SECONDS;
}

static int opts_maxlen(const pv_op_opts *o) {
    return o && o->events_maxlen > 0 ? o->events_maxlen : DEFAULT_EVENTS_MAXLEN;
}

static int fcall(pv_redis *r, const char *fn, pv_strv *keys, pv_strv *args, redisReply **reply,
                 pv_status *st) {
    *reply = NULL;
    if (keys->oom || args->oom) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", fn);
    return pv_redis_fcall(r, fn, (int)keys->n, (const char **)keys->v, (int)args->n,
                          (const char **)args->v, reply, st);
}

/* fcall, then keys and args freed; *reply is the caller's (NULL when the call failed). */
static int fcall_done(pv_redis *r, const char *fn, pv_strv *keys, pv_strv *args, redisReply **reply,
                      pv_status *st) {
    int rc = fcall(r, fn, keys, args, reply, st);
    pv_strv_free(keys);
    pv_strv_free(args);
    return rc;
}

/* fcall_done for a call whose reply is not wanted. */
static int fcall_void(pv_redis *r, const char *fn, pv_strv *keys, pv_strv *args, pv_status *st) {
    redisReply *rep = NULL;
    int rc = fcall_done(r, fn, keys, args, &rep, st);
    if (rep) freeReplyObject(rep);
    return rc;
}

/* fcall_done for a call that answers an integer (*out); what names its subject in the error of
 * any other reply. */
static int fcall_int(pv_redis *r, const char *fn, pv_strv *keys, pv_strv *args, const char *what,
                     long long *out, pv_status *st) {
    redisReply *rep = NULL;
    int rc = fcall_done(r, fn, keys, args, &rep, st);
    if (rc != PV_OK) return rc;
    if (rep->type == REDIS_REPLY_INTEGER)
        *out = rep->integer;
    else
        rc = pv_status_set(st, PV_INTERNAL, "%s %s: unexpected reply", fn, what);
    freeReplyObject(rep);
    return rc;
}

/* Appends the lock key of res unless keys from index `from` on already hold it. */
static void add_lock(pv_strv *keys, size_t from, const pv_keys *k, const char *res) {
    size_t n = keys->n;
    if (pv_key_add(k, PV_KEY_OP_LOCK, res, keys) != 0) return;
    keys->n = n; /* looked up among the keys before it */
    bool repeat = strv_has(keys, from, keys->v[n]);
    keys->n = n + 1;
    if (repeat) pv_strv_truncate(keys, n);
}

/* Appends the lock key of the target and of each resource of holds_json (a JSON array of
 * strings; NULL = none), without repeats among the keys from index `from`. */
static int add_locks(pv_strv *keys, size_t from, const pv_keys *k, const char *target,
                     const char *holds_json, pv_status *st) {
    if (target && target[0]) add_lock(keys, from, k, target);
    if (!holds_json || !holds_json[0] || strcmp(holds_json, "[]") == 0) return PV_OK;
    json_error_t jerr;
    json_t *holds = json_loads(holds_json, 0, &jerr);
    if (!json_is_array(holds)) {
        json_decref(holds);
        return pv_status_set(st, PV_INTERNAL, "operation holds: not a JSON array: %s", holds_json);
    }
    size_t i;
    json_t *h;
    json_array_foreach(holds, i, h) {
        if (json_is_string(h) && json_string_length(h) > 0)
            add_lock(keys, from, k, json_string_value(h));
    }
    json_decref(holds);
    if (keys->oom) return pv_status_set(st, PV_INTERNAL, "lock keys: out of memory");
    return PV_OK;
}

static bool is_need_locks(const redisReply *rep) {
    return rep->type == REDIS_REPLY_ARRAY && rep->elements == 3 &&
           rep->element[0]->type == REDIS_REPLY_STRING &&
           strcmp(rep->element[0]->str, "need_locks") == 0 &&
           rep->element[1]->type == REDIS_REPLY_STRING &&
           rep->element[2]->type == REDIS_REPLY_STRING;
}

/* Calls fn with keys + the lock keys of `target` (NULL when unknown); when the function asks
 * for lock keys it was not given, calls once more with the ones it named. */
static int fcall_locked(pv_redis *r, const pv_keys *k, const char *fn, pv_strv *keys, pv_strv *args,
                        const char *target, redisReply **reply, pv_status *st) {
    size_t nfixed = keys->n;
    char *t = target ? strdup(target) : NULL, *h = NULL;
    int rc = PV_OK;
    for (int round = 0;; round++) {
        pv_strv_truncate(keys, nfixed);
        rc = add_locks(keys, nfixed, k, t, h, st);
        if (rc == PV_OK) rc = fcall(r, fn, keys, args, reply, st);
        if (rc != PV_OK || !is_need_locks(*reply)) break;
        if (round > 0) {
            rc = pv_status_set(st, PV_INTERNAL, "%s: still asks for lock keys of %s %s", fn,
                               (*reply)->element[1]->str, (*reply)->element[2]->str);
            freeReplyObject(*reply);
            *reply = NULL;
            break;
        }
        free(t);
        free(h);
        t = strdup((*reply)->element[1]->str);
        h = strdup((*reply)->element[2]->str);
        freeReplyObject(*reply);
        *reply = NULL;
        if (!t || !h) {
            rc = pv_status_set(st, PV_INTERNAL, "%s: out of memory", fn);
            break;
        }
    }
    free(t);
    free(h);
    return rc;
}

/* A reply {tag, ...}: the tag, or NULL when the reply has another shape. */
static const char *reply_tag(const redisReply *rep, size_t min_elements) {
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < min_elements || rep->elements == 0 ||
        rep->element[0]->type != REDIS_REPLY_STRING)
        return NULL;
    return rep->element[0]->str;
}

/* ---- argument checks ---- */

static int check_id(const char *id, pv_status *st) {
    if (!id || !id[0]) return pv_status_set(st, PV_INVALID_ARGUMENT, "operation id: empty");
    if (strlen(id) >= PV_ID_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "operation id \"%.80s\": longer than %d", id,
                             PV_ID_MAX - 1);
    return PV_OK;
}

static int check_text(const char *what, const char *v, pv_status *st) {
    if (!v || !v[0]) return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: empty", what);
    return PV_OK;
}

/* A worker's view of its operation must name it and its queue. */
static int check_leased(const pv_op *op, int64_t token, pv_status *st) {
    if (!op) return pv_status_set(st, PV_INVALID_ARGUMENT, "operation: NULL");
    if (check_id(op->id, st) != PV_OK) return st->code;
    if (check_text("operation queue", op->queue, st) != PV_OK) return st->code;
    if (token <= 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "operation %s: fencing token must be positive, got %" PRId64, op->id,
                             token);
    return PV_OK;
}

static int check_json_object(const char *what, const char *text, pv_status *st) {
    if (!text) return PV_OK;
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
    bool ok = json_is_object(j);
    json_decref(j);
    if (!ok)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not a JSON object: %.200s", what, text);
    return PV_OK;
}

/* The holds of a request as a JSON array, without the target and without repeats. */
static int holds_json(const pv_op_submit_req *req, char **out, pv_status *st) {
    *out = NULL;
    if (req->n_holds == 0) { /* the usual case: no JSON library round trip for "[]" */
        *out = strdup("[]");
        return *out ? PV_OK : pv_status_set(st, PV_INTERNAL, "holds: out of memory");
    }
    json_t *a = json_array();
    if (!a) return pv_status_set(st, PV_INTERNAL, "holds: out of memory");
    for (size_t i = 0; i < req->n_holds; i++) {
        const char *h = req->holds[i];
        if (!h || !h[0]) {
            json_decref(a);
            return pv_status_set(st, PV_INVALID_ARGUMENT, "holds[%zu]: empty", i);
        }
        bool seen = strcmp(h, req->target) == 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(h, req->holds[j]) == 0;
        if (!seen && json_array_append_new(a, json_string(h)) != 0) {
            json_decref(a);
            return pv_status_set(st, PV_INVALID_ARGUMENT, "holds[%zu]: not UTF-8: %.80s", i, h);
        }
    }
    *out = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    if (!*out) return pv_status_set(st, PV_INTERNAL, "holds: out of memory");
    return PV_OK;
}

/* ---- the gateway's side ---- */

int pv_op_submit(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op_submit_req *req,
                 pv_op *out, bool *existed, pv_status *st) {
    memset(out, 0, sizeof *out);
    *existed = false;
    if (check_text("operation kind", req->kind, st) != PV_OK ||
        check_text("operation target", req->target, st) != PV_OK ||
        check_text("operation queue", req->queue, st) != PV_OK ||
        check_json_object("operation params", req->params_json, st) != PV_OK ||
        (req->metadata_json != req->params_json &&
         check_json_object("operation metadata", req->metadata_json, st) != PV_OK))
        return st->code;
    if (req->n_holds > 0 && !req->holds)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "holds: NULL with n_holds %zu", req->n_holds);
    char id[PV_ID_MAX];
    if (pv_id_new("op", id, sizeof id) != 0)
        return pv_status_set(st, PV_INTERNAL, "operation id: no randomness available");
    char *holds = NULL;
    if (holds_json(req, &holds, st) != PV_OK) return st->code;
    const char *rid = req->request_id ? req->request_id : "";

    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP, id, &keys);
    pv_key_add(k, PV_KEY_OP_QUEUE, req->queue, &keys);
    pv_key_add(k, PV_KEY_OP_INDEX, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    int rc = add_locks(&keys, 4, k, req->target_unlocked ? NULL : req->target, holds, st);
    size_t nlocks = keys.n - 4;
    if (rid[0]) pv_key_add(k, PV_KEY_OP_IDEM, rid, &keys);
    const char *client = req->client ? req->client : "";
    if (client[0]) pv_key_add(k, PV_KEY_OP_PENDING_BY, client, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, id);
    pv_strv_add(&args, req->kind);
    pv_strv_add(&args, req->target);
    pv_strv_add(&args, req->queue);
    pv_strv_add(&args, req->params_json ? req->params_json : "{}");
    pv_strv_add(&args, req->metadata_json ? req->metadata_json : "{}");
    pv_strv_add(&args, rid);
    pv_strv_addf(&args, "%d",
                 req->max_attempts > 0 ? req->max_attempts : PV_OP_DEFAULT_MAX_ATTEMPTS);
    pv_strv_add(&args, holds);
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    pv_strv_addf(&args, "%zu", nlocks);
    pv_strv_addf(&args, "%d", PV_OP_IDEMPOTENCY_SECONDS);
    pv_strv_add(&args, client);
    pv_strv_addf(&args, "%d", req->client_max_pending > 0 ? req->client_max_pending : 0);
    pv_strv_add(&args, req->limit_name ? req->limit_name : "limit");
    pv_strv_addf(&args, "%d", req->notify_end ? 1 : 0);
    pv_strv_addf(&args, "%d", opts_retention(o));
    pv_strv_add(&args, req->target_unlocked ? "1" : "0");
    free(holds);

    redisReply *rep = NULL;
    if (rc == PV_OK) rc = fcall(r, "pv_op_submit", &keys, &args, &rep, st);
    pv_strv_free(&keys);
    pv_strv_free(&args);
    if (rc != PV_OK) return rc;
    const char *tag = reply_tag(rep, 2);
    if (!tag)
        rc = pv_status_set(st, PV_INTERNAL, "pv_op_submit: unexpected reply");
    else
        rc = parse_record(k, id, rep->element[1], out, st);
    if (rc == PV_OK) *existed = strcmp(tag, "existed") == 0;
    freeReplyObject(rep);
    if (rc == PV_OK) rc = pv_redis_confirm_durable(r, st);
    if (rc != PV_OK) pv_op_clear(out);
    return rc;
}

/* The id (PV_ID_MAX bytes; "" when there is none) stored at the key of kind for name. */
static int get_id(pv_redis *r, const pv_keys *k, pv_key_kind kind, const char *name, char *out,
                  pv_status *st) {
    out[0] = '\0';
    char key[PV_KEY_MAX];
    if (pv_key(k, kind, name, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "GET %s", key) != PV_OK) return st->code;
    if (rep->type == REDIS_REPLY_STRING) snprintf(out, PV_ID_MAX, "%s", rep->str);
    freeReplyObject(rep);
    return PV_OK;
}

int pv_op_lock_holder(pv_redis *r, const pv_keys *k, const char *res, char *holder, pv_status *st) {
    return get_id(r, k, PV_KEY_OP_LOCK, res, holder, st);
}

int pv_op_find_request(pv_redis *r, const pv_keys *k, const char *request_id, char *id,
                       pv_status *st) {
    id[0] = '\0';
    if (!request_id || !request_id[0]) return PV_OK;
    return get_id(r, k, PV_KEY_OP_IDEM, request_id, id, st);
}

int pv_op_get(pv_redis *r, const pv_keys *k, const char *id, pv_op *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    if (check_id(id, st) != PV_OK) return st->code;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_OP, id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "HGETALL %s", key);
    if (rc != PV_OK) return rc;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 0)
        rc = pv_status_set(st, PV_NOT_FOUND, "operation %s not found", id);
    else
        rc = parse_record(k, id, rep, out, st);
    freeReplyObject(rep);
    return rc;
}

static bool filter_match(const pv_op_filter *f, const pv_op *op) {
    if (f->kind && f->kind[0] && strcmp(f->kind, op->kind) != 0) return false;
    if (f->target && f->target[0] && strcmp(f->target, op->target) != 0) return false;
    return f->status == PV_OP_ANY || f->status == op->status;
}

/* The index a listing walks: the target's or the kind's when the filter names one (the target
 * first: a target has few operations, a kind may have most of them), else every operation's.
 * The functions keep each in step with the records, so a filtered page reads only what may
 * match. The key is malloc'd (NULL: out of memory). */
static char *list_index(const pv_keys *k, const pv_op_filter *f) {
    if (f->target && f->target[0]) return pv_key_new(k, PV_KEY_OP_BY_TARGET, f->target);
    if (f->kind && f->kind[0]) return pv_key_new(k, PV_KEY_OP_BY_KIND, f->kind);
    return pv_key_new(k, PV_KEY_OP_INDEX, NULL);
}

/* One page of `want` members of index below (or at) score *max, skipping the *offset members
 * at exactly *max already seen; then reads their records in one pipeline. Matches go to ops
 * (up to limit), ids whose record expired to gone. Advances *max and *offset; *more = a full
 * page was read. */
static int list_page(pv_redis *r, const pv_keys *k, const char *index, const pv_op_filter *f,
                     int limit, long want, char *max, size_t maxlen, long *offset, pv_op *ops,
                     size_t *n, pv_strv *gone, bool *more, pv_status *st) {
    *more = false;
    redisReply *page = NULL;
    int rc = pv_redis_command(r, &page, st, "ZREVRANGEBYSCORE %s %s -inf WITHSCORES LIMIT %ld %ld",
                              index, max, *offset, want);
    if (rc != PV_OK) return rc;
    size_t m = page->type == REDIS_REPLY_ARRAY ? page->elements / 2 : 0, sent = 0;
    for (; sent < m && rc == PV_OK; sent++) {
        char key[PV_KEY_MAX];
        if (pv_key(k, PV_KEY_OP, page->element[2 * sent]->str, key, sizeof key, st) != PV_OK) {
            rc = st->code;
            break;
        }
        const char *argv[] = {"HGETALL", key};
        rc = pv_redis_append(r, 2, argv, NULL, st);
        if (rc != PV_OK) break;
    }
    for (size_t i = 0; i < sent; i++) {
        redisReply *rec = NULL;
        /* Every appended reply is read, even after a failure, to keep the pipeline in step. */
        int rrc = pv_redis_get_reply(r, &rec, rc == PV_OK ? st : NULL);
        if (rc == PV_OK) rc = rrc;
        if (rrc != PV_OK || rc != PV_OK) {
            if (rec) freeReplyObject(rec);
            continue;
        }
        if (rec->elements == 0) {
            pv_strv_add(gone, page->element[2 * i]->str);
        } else if (*n < (size_t)limit) {
            rc = parse_record(k, page->element[2 * i]->str, rec, &ops[*n], st);
            if (rc == PV_OK && filter_match(f, &ops[*n]))
                (*n)++;
            else
                pv_op_clear(&ops[*n]);
        }
        freeReplyObject(rec);
    }
    if (rc == PV_OK && m > 0) {
        const char *last = page->element[2 * m - 1]->str;
        long same = 0;
        for (size_t i = 0; i < m; i++)
            if (strcmp(page->element[2 * i + 1]->str, last) == 0) same++;
        *offset = strcmp(last, max) == 0 ? *offset + same : same;
        snprintf(max, maxlen, "%s", last);
        *more = (long)m == want;
    }
    freeReplyObject(page);
    return rc;
}

int pv_op_list(pv_redis *r, const pv_keys *k, const pv_op_filter *f, pv_op **ops, size_t *n,
               pv_status *st) {
    *ops = NULL;
    *n = 0;
    int limit = f->limit <= 0 ? LIST_DEFAULT_LIMIT : f->limit;
    if (limit > LIST_MAX_LIMIT) limit = LIST_MAX_LIMIT;
    pv_op *out = calloc((size_t)limit, sizeof *out);
    if (!out) return pv_status_set(st, PV_INTERNAL, "list operations: out of memory");
    char max[64] = "+inf";
    long offset = 0;
    size_t count = 0;
    pv_strv gone = {0};
    bool more = true;
    int rc = PV_OK;
    char *index = list_index(k, f);
    if (!index) {
        free(out);
        return pv_status_set(st, PV_INTERNAL, "list operations: out of memory");
    }
    /* When the index is the whole filter, every member whose record lives matches: pages no
     * larger than what is still wanted, so a small limit costs a small read. */
    bool exact = f->status == PV_OP_ANY && !(f->target && f->target[0] && f->kind && f->kind[0]);
    while (rc == PV_OK && more && count < (size_t)limit) {
        long want = LIST_PAGE;
        if (exact && (long)limit - (long)count < want) want = (long)limit - (long)count;
        rc = list_page(r, k, index, f, limit, want, max, sizeof max, &offset, out, &count, &gone,
                       &more, st);
    }
    if (rc == PV_OK && gone.n > 0 && !gone.oom) {
        /* Records expire on their own; the submits trim their index members, and the ones a
         * listing meets first are removed here. */
        pv_strv cmd = {0};
        pv_strv_add(&cmd, "ZREM");
        pv_strv_add(&cmd, index);
        for (size_t i = 0; i < gone.n; i++)
            pv_strv_add(&cmd, gone.v[i]);
        if (!cmd.oom) pv_redis_commandv(r, NULL, NULL, (int)cmd.n, (const char **)cmd.v, NULL);
        pv_strv_free(&cmd);
    }
    pv_strv_free(&gone);
    free(index);
    if (rc != PV_OK) {
        pv_op_array_free(out, count);
        return rc;
    }
    *ops = out;
    *n = count;
    return PV_OK;
}

int pv_op_cancel(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *id, pv_op *out,
                 pv_status *st) {
    memset(out, 0, sizeof *out);
    if (check_id(id, st) != PV_OK) return st->code;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP, id, &keys);
    pv_key_add(k, PV_KEY_OP_DELAYED, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, id);
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    pv_strv_addf(&args, "%d", opts_retention(o));
    redisReply *rep = NULL;
    int rc = fcall_locked(r, k, "pv_op_cancel", &keys, &args, NULL, &rep, st);
    pv_strv_free(&keys);
    pv_strv_free(&args);
    if (rc != PV_OK) return rc;
    if (!reply_tag(rep, 2))
        rc = pv_status_set(st, PV_INTERNAL, "pv_op_cancel: unexpected reply");
    else
        rc = parse_record(k, id, rep->element[1], out, st);
    freeReplyObject(rep);
    return rc;
}

/* ---- the worker's side ---- */

static const struct {
    const char *name;
    pv_op_acquire_result res;
} acquire_results[] = {
    {"RUN", PV_OP_ACQ_RUN},   {"DONE", PV_OP_ACQ_DONE}, {"CANCELLED", PV_OP_ACQ_CANCELLED},
    {"DEAD", PV_OP_ACQ_DEAD}, {"BUSY", PV_OP_ACQ_BUSY}, {"GONE", PV_OP_ACQ_GONE},
};

static int parse_acquire(const pv_keys *k, const redisReply *rep, const char *op_id, pv_op *out,
                         int64_t *token, pv_op_acquire_result *res, pv_status *st) {
    const char *tag = reply_tag(rep, 3);
    size_t i = 0, n = sizeof acquire_results / sizeof acquire_results[0];
    while (tag && i < n && strcmp(tag, acquire_results[i].name) != 0)
        i++;
    if (!tag || i == n || rep->element[1]->type != REDIS_REPLY_STRING ||
        parse_i64(rep->element[1]->str, token) != 0)
        return pv_status_set(st, PV_INTERNAL, "pv_op_acquire %s: unexpected reply", op_id);
    *res = acquire_results[i].res;
    if (*res == PV_OP_ACQ_GONE) { /* no record: the id alone, every other field its default */
        json_t *gone = json_pack("{s:s}", "id", op_id);
        int rc = gone ? pv_record_decode_json(&pv_op_schema, op_id, gone, out, st)
                      : pv_status_set(st, PV_INTERNAL, "pv_op_acquire %s: out of memory", op_id);
        json_decref(gone);
        return rc;
    }
    return parse_record(k, op_id, rep->element[2], out, st);
}

/* The keys and arguments of one pv_op_acquire call (the lock keys come later, if needed). */
static int acquire_call(const pv_keys *k, const pv_op_opts *o, const char *queue,
                        const char *consumer, const char *entry, const char *op_id, int lease_ms,
                        pv_strv *keys, pv_strv *args, pv_status *st) {
    if (check_id(op_id, st) != PV_OK || check_text("queue", queue, st) != PV_OK ||
        check_text("consumer", consumer, st) != PV_OK ||
        check_text("stream entry", entry, st) != PV_OK)
        return st->code;
    if (lease_ms <= 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "lease_ms: must be positive, got %d",
                             lease_ms);
    pv_key_add(k, PV_KEY_OP, op_id, keys);
    pv_key_add(k, PV_KEY_OP_QUEUE, queue, keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, keys);
    pv_key_add(k, PV_KEY_OP_DEAD, NULL, keys);
    pv_key_add(k, PV_KEY_OP_FENCE, NULL, keys);
    pv_key_add(k, PV_KEY_OPS, NULL, args);
    pv_strv_add(args, op_id);
    pv_strv_add(args, entry);
    pv_strv_add(args, consumer);
    pv_strv_addf(args, "%d", lease_ms);
    pv_strv_addf(args, "%d", opts_maxlen(o));
    pv_strv_addf(args, "%d", opts_retention(o));
    if (keys->oom || args->oom) return pv_status_set(st, PV_INTERNAL, "acquire: out of memory");
    return PV_OK;
}

int pv_op_acquire(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *queue,
                  const char *consumer, const char *entry, const char *op_id, int lease_ms,
                  pv_op *out, int64_t *token, pv_op_acquire_result *res, pv_status *st) {
    memset(out, 0, sizeof *out);
    *token = 0;
    *res = PV_OP_ACQ_GONE;
    pv_strv keys = {0}, args = {0};
    redisReply *rep = NULL;
    int rc = acquire_call(k, o, queue, consumer, entry, op_id, lease_ms, &keys, &args, st);
    if (rc == PV_OK) rc = fcall_locked(r, k, "pv_op_acquire", &keys, &args, NULL, &rep, st);
    pv_strv_free(&keys);
    pv_strv_free(&args);
    if (rc != PV_OK) return rc;
    rc = parse_acquire(k, rep, op_id, out, token, res, st);
    freeReplyObject(rep);
    if (rc != PV_OK) *token = 0;
    return rc;
}

/* Queues FCALL fn on r's pipeline. */
static int fcall_append(pv_redis *r, const char *fn, const pv_strv *keys, const pv_strv *args,
                        pv_status *st) {
    size_t argc = 3 + keys->n + args->n;
    const char **argv = malloc(argc * sizeof *argv);
    if (!argv) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", fn);
    char nk[24];
    snprintf(nk, sizeof nk, "%zu", keys->n);
    argv[0] = "FCALL";
    argv[1] = fn;
    argv[2] = nk;
    memcpy(argv + 3, keys->v, keys->n * sizeof *argv);
    memcpy(argv + 3 + keys->n, args->v, args->n * sizeof *argv);
    int rc = pv_redis_append(r, (int)argc, argv, NULL, st);
    free(argv);
    return rc;
}

int pv_op_acquire_batch(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *queue,
                        const char *consumer, size_t n, const char *const *entries,
                        const char *const *op_ids, int lease_ms, pv_op *out, int64_t *tokens,
                        pv_op_acquire_result *res, int *rcs, pv_status *sts) {
    memset(out, 0, n * sizeof *out);
    bool *sent = calloc(n ? n : 1, sizeof *sent);
    if (!sent) {
        for (size_t i = 0; i < n; i++)
            rcs[i] = pv_status_set(&sts[i], PV_INTERNAL, "acquire: out of memory");
        return PV_OK;
    }
    for (size_t i = 0; i < n; i++) {
        tokens[i] = 0;
        res[i] = PV_OP_ACQ_GONE;
        pv_strv keys = {0}, args = {0};
        rcs[i] = acquire_call(k, o, queue, consumer, entries[i], op_ids[i], lease_ms, &keys, &args,
                              &sts[i]);
        if (rcs[i] == PV_OK) rcs[i] = fcall_append(r, "pv_op_acquire", &keys, &args, &sts[i]);
        sent[i] = rcs[i] == PV_OK;
        pv_strv_free(&keys);
        pv_strv_free(&args);
    }
    /* Every queued call is read, in order, even after a failure, so the pipeline stays in step
     * (a dropped connection fails the remaining reads without touching the network). */
    for (size_t i = 0; i < n; i++) {
        if (!sent[i]) continue;
        redisReply *rep = NULL;
        rcs[i] = pv_redis_get_reply(r, &rep, &sts[i]);
        if (rcs[i] != PV_OK) continue;
        sent[i] = is_need_locks(rep); /* answered later, alone, with its lock keys */
        if (!sent[i])
            rcs[i] = parse_acquire(k, rep, op_ids[i], &out[i], &tokens[i], &res[i], &sts[i]);
        if (rcs[i] != PV_OK) tokens[i] = 0;
        freeReplyObject(rep);
    }
    /* A call that must end the operation here (cancelled, dead) wrote nothing without its lock
     * keys: it runs again on its own, and fcall_locked supplies them. */
    for (size_t i = 0; i < n; i++)
        if (sent[i] && rcs[i] == PV_OK)
            rcs[i] = pv_op_acquire(r, k, o, queue, consumer, entries[i], op_ids[i], lease_ms,
                                   &out[i], &tokens[i], &res[i], &sts[i]);
    free(sent);
    return PV_OK;
}

/* One element {entry, op id, acquire reply} of a pv_op_take reply into *t; *again = the
 * acquisition asks for lock keys and must run alone. */
static void parse_taken(const pv_keys *k, const redisReply *e, pv_op_taken *t, bool *again) {
    *again = false;
    t->rc = PV_OK;
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 3 ||
        e->element[0]->type != REDIS_REPLY_STRING || e->element[1]->type != REDIS_REPLY_STRING ||
        e->element[0]->len >= sizeof t->entry || e->element[1]->len >= sizeof t->op_id) {
        t->rc = pv_status_set(&t->st, PV_INTERNAL, "pv_op_take: unexpected entry in the reply");
        return;
    }
    memcpy(t->entry, e->element[0]->str, e->element[0]->len + 1);
    memcpy(t->op_id, e->element[1]->str, e->element[1]->len + 1);
    if (!t->op_id[0]) return; /* carried no operation: acked */
    if (is_need_locks(e->element[2])) {
        *again = true;
        return;
    }
    t->rc = parse_acquire(k, e->element[2], t->op_id, &t->rec, &t->token, &t->res, &t->st);
    if (t->rc != PV_OK) t->token = 0;
}

int pv_op_take(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *queue,
               const char *consumer, int count, int lease_ms, pv_op_taken *out, size_t *n,
               pv_status *st) {
    *n = 0;
    if (check_text("queue", queue, st) != PV_OK || check_text("consumer", consumer, st) != PV_OK)
        return st->code;
    if (count <= 0 || lease_ms <= 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "count and lease_ms: must be positive, got %d and %d", count,
                             lease_ms);
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP_QUEUE, queue, &keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_DEAD, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_FENCE, NULL, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, consumer);
    pv_strv_addf(&args, "%d", count);
    pv_strv_addf(&args, "%d", lease_ms);
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    pv_strv_addf(&args, "%d", opts_retention(o));
    redisReply *rep = NULL;
    int rc = fcall_done(r, "pv_op_take", &keys, &args, &rep, st);
    if (rc != PV_OK) return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements > (size_t)count) {
        freeReplyObject(rep);
        return pv_status_set(st, PV_INTERNAL, "pv_op_take %s: unexpected reply", queue);
    }
    bool *again = calloc(rep->elements ? rep->elements : 1, sizeof *again);
    if (!again) {
        freeReplyObject(rep);
        return pv_status_set(st, PV_INTERNAL, "pv_op_take: out of memory");
    }
    for (size_t i = 0; i < rep->elements; i++) {
        memset(&out[i], 0, sizeof out[i]);
        parse_taken(k, rep->element[i], &out[i], &again[i]);
    }
    *n = rep->elements;
    freeReplyObject(rep);
    /* Ending one here (cancelled, dead) needs its lock keys declared: it runs again alone. */
    for (size_t i = 0; i < *n; i++)
        if (again[i])
            out[i].rc =
                pv_op_acquire(r, k, o, queue, consumer, out[i].entry, out[i].op_id, lease_ms,
                              &out[i].rec, &out[i].token, &out[i].res, &out[i].st);
    free(again);
    return PV_OK;
}

/* The keys and arguments every fenced call starts with: record + queue, base + id + token. */
static void fenced_start(const pv_keys *k, const pv_op *op, int64_t token, pv_strv *keys,
                         pv_strv *args) {
    pv_key_add(k, PV_KEY_OP, op->id, keys);
    pv_key_add(k, PV_KEY_OP_QUEUE, op->queue, keys);
    pv_key_add(k, PV_KEY_OPS, NULL, args);
    pv_strv_add(args, op->id);
    pv_strv_addf(args, "%" PRId64, token);
}

int pv_op_renew(pv_redis *r, const pv_keys *k, const pv_op *op, const char *consumer, int64_t token,
                int lease_ms, bool *cancel_requested, pv_status *st) {
    *cancel_requested = false;
    if (check_leased(op, token, st) != PV_OK || check_text("consumer", consumer, st) != PV_OK)
        return st->code;
    if (lease_ms <= 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "lease_ms: must be positive, got %d",
                             lease_ms);
    pv_strv keys = {0}, args = {0};
    fenced_start(k, op, token, &keys, &args);
    pv_strv_add(&args, consumer);
    pv_strv_addf(&args, "%d", lease_ms);
    long long cancel = 0;
    int rc = fcall_int(r, "pv_op_renew", &keys, &args, op->id, &cancel, st);
    if (rc == PV_OK) *cancel_requested = cancel != 0;
    return rc;
}

int pv_op_progress(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                   int64_t token, int percent, const char *message, pv_status *st) {
    if (check_leased(op, token, st) != PV_OK) return st->code;
    if (percent < 0) percent = 0;
    if (percent > 100) percent = 100;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP, op->id, &keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, op->id);
    pv_strv_addf(&args, "%" PRId64, token);
    pv_strv_addf(&args, "%d", percent);
    pv_strv_add(&args, message ? message : "");
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    return fcall_void(r, "pv_op_progress", &keys, &args, st);
}

int pv_op_journal_get(pv_redis *r, const pv_keys *k, const char *op_id, const char *step,
                      char **value, pv_status *st) {
    *value = NULL;
    if (check_id(op_id, st) != PV_OK || check_text("journal step", step, st) != PV_OK)
        return st->code;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_OP, op_id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "HMGET %s id j:%s", key, step);
    if (rc != PV_OK) return rc;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
        rc = pv_status_set(st, PV_INTERNAL, "journal of %s: unexpected reply", op_id);
    else if (rep->element[0]->type != REDIS_REPLY_STRING)
        rc = pv_status_set(st, PV_NOT_FOUND, "operation %s not found", op_id);
    else if (rep->element[1]->type == REDIS_REPLY_STRING &&
             !(*value = strndup(rep->element[1]->str, rep->element[1]->len)))
        rc = pv_status_set(st, PV_INTERNAL, "journal of %s: out of memory", op_id);
    freeReplyObject(rep);
    return rc;
}

int pv_op_journal_put(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token,
                      const char *step, const char *value, pv_status *st) {
    if (check_leased(op, token, st) != PV_OK || check_text("journal step", step, st) != PV_OK)
        return st->code;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP, op->id, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, op->id);
    pv_strv_addf(&args, "%" PRId64, token);
    pv_strv_add(&args, step);
    pv_strv_add(&args, value ? value : "");
    return fcall_void(r, "pv_op_journal_put", &keys, &args, st);
}

/* pv_op_output_add with m journal entries (steps[i], jvalues[i]) written in the same call. */
static int output_add(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token, size_t m,
                      const char *const *steps, const char *const *jvalues, size_t n,
                      const char *const *fields, const char *const *values, char *entry_id,
                      pv_status *st) {
    if (check_leased(op, token, st) != PV_OK) return st->code;
    if (n == 0) return pv_status_set(st, PV_INVALID_ARGUMENT, "output of %s: no fields", op->id);
    for (size_t i = 0; i < m; i++)
        if (check_text("journal step", steps[i], st) != PV_OK) return st->code;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP, op->id, &keys);
    pv_key_add(k, PV_KEY_OP_OUT, op->id, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, op->id);
    pv_strv_addf(&args, "%" PRId64, token);
    pv_strv_addf(&args, "%d", PV_OP_OUTPUT_MAXLEN);
    if (m > 0) pv_strv_addf(&args, "%zu", m);
    for (size_t i = 0; i < m; i++) {
        pv_strv_add(&args, steps[i]);
        pv_strv_add(&args, jvalues[i] ? jvalues[i] : "");
    }
    for (size_t i = 0; i < n; i++) {
        pv_strv_add(&args, fields[i]);
        pv_strv_add(&args, values[i] ? values[i] : "");
    }
    redisReply *rep = NULL;
    int rc = fcall(r, m > 0 ? "pv_op_output_journal" : "pv_op_output", &keys, &args, &rep, st);
    if (rc == PV_OK && entry_id)
        snprintf(entry_id, 32, "%s", rep->type == REDIS_REPLY_STRING ? rep->str : "");
    pv_strv_free(&keys);
    pv_strv_free(&args);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_op_output_add(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token, size_t n,
                     const char *const *fields, const char *const *values, char *entry_id,
                     pv_status *st) {
    return output_add(r, k, op, token, 0, NULL, NULL, n, fields, values, entry_id, st);
}

int pv_op_output_journal(pv_redis *r, const pv_keys *k, const pv_op *op, int64_t token, size_t m,
                         const char *const *steps, const char *const *jvalues, size_t n,
                         const char *const *fields, const char *const *values, pv_status *st) {
    return output_add(r, k, op, token, m, steps, jvalues, n, fields, values, NULL, st);
}

void pv_op_output_free(pv_op_output *entries, size_t n) {
    for (size_t i = 0; entries && i < n; i++) {
        for (size_t j = 0; j < entries[i].n; j++) {
            free(entries[i].fields[j]);
            free(entries[i].values[j]);
        }
        free(entries[i].fields);
        free(entries[i].values);
    }
    free(entries);
}

/* One stream entry [id, [field, value, ...]] into e. */
static int output_entry(const redisReply *x, pv_op_output *e, pv_status *st) {
    if (x->type != REDIS_REPLY_ARRAY || x->elements != 2 ||
        x->element[0]->type != REDIS_REPLY_STRING)
        return pv_status_set(st, PV_INTERNAL, "operation output: unexpected entry");
    snprintf(e->id, sizeof e->id, "%s", x->element[0]->str);
    const redisReply *f = x->element[1];
    size_t pairs = f->type == REDIS_REPLY_ARRAY ? f->elements / 2 : 0;
    if (pairs == 0) return PV_OK;
    e->fields = calloc(pairs, sizeof *e->fields);
    e->values = calloc(pairs, sizeof *e->values);
    if (!e->fields || !e->values) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t j = 0; j < pairs; j++) {
        e->fields[j] = strdup(f->element[2 * j]->str ? f->element[2 * j]->str : "");
        e->values[j] = strdup(f->element[2 * j + 1]->str ? f->element[2 * j + 1]->str : "");
        e->n++;
        if (!e->fields[j] || !e->values[j]) return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    return PV_OK;
}

/* A plumbing entry of type `type` (exactly the fields type and status): "end", appended when
 * the operation finishes, or "open", written at submission for notify_end. */
static bool is_plumbing(const redisReply *e, const char *type) {
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2) return false;
    const redisReply *f = e->element[1];
    return f->type == REDIS_REPLY_ARRAY && f->elements == 4 && f->element[0]->str &&
           strcmp(f->element[0]->str, "type") == 0 && f->element[1]->str &&
           strcmp(f->element[1]->str, type) == 0;
}

static bool is_end_entry(const redisReply *e) {
    return is_plumbing(e, "end");
}

/* What readers never see. */
static bool is_hidden_entry(const redisReply *e) {
    return is_plumbing(e, "end") || is_plumbing(e, "open");
}

int pv_op_output_wait(pv_redis *r, const pv_keys *k, size_t n, const char *const *op_ids,
                      char (*cursors)[PV_OP_CURSOR_MAX], int block_ms, bool *woke, bool *ended,
                      pv_status *st) {
    return pv_op_output_wait_entries(r, k, n, op_ids, cursors, block_ms, woke, ended, NULL, NULL,
                                     st);
}

/* Stream s's entries (end entries left out) into a malloc'd array. */
static int wait_entries(const redisReply *list, pv_op_output **entries, size_t *count,
                        pv_status *st) {
    *entries = calloc(list->elements, sizeof **entries);
    if (!*entries) return pv_status_set(st, PV_INTERNAL, "out of memory");
    int rc = PV_OK;
    for (size_t e = 0; rc == PV_OK && e < list->elements; e++) {
        if (is_hidden_entry(list->element[e])) continue;
        rc = output_entry(list->element[e], &(*entries)[(*count)++], st);
    }
    if (rc != PV_OK || *count == 0) {
        pv_op_output_free(*entries, *count);
        *entries = NULL;
        *count = 0;
    }
    return rc;
}

int pv_op_output_wait_entries(pv_redis *r, const pv_keys *k, size_t n, const char *const *op_ids,
                              char (*cursors)[PV_OP_CURSOR_MAX], int block_ms, bool *woke,
                              bool *ended, pv_op_output **entries, size_t *counts, pv_status *st) {
    *woke = false;
    for (size_t i = 0; ended && i < n; i++)
        ended[i] = false;
    for (size_t i = 0; entries && i < n; i++) {
        entries[i] = NULL;
        counts[i] = 0;
    }
    if (n == 0) return PV_OK;
    for (size_t i = 0; i < n; i++)
        if (check_id(op_ids[i], st) != PV_OK) return st->code;
    size_t argc = 6 + 2 * n;
    const char **argv = calloc(argc, sizeof *argv);
    char(*keys)[PV_KEY_MAX] = calloc(n, sizeof *keys);
    if (!argv || !keys) {
        free(argv);
        free(keys);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    char blk[24];
    snprintf(blk, sizeof blk, "%d", block_ms > 0 ? block_ms : 1);
    argv[0] = "XREAD";
    argv[1] = "COUNT";
    argv[2] = "100";
    argv[3] = "BLOCK";
    argv[4] = blk;
    argv[5] = "STREAMS";
    for (size_t i = 0; i < n; i++) {
        pv_key(k, PV_KEY_OP_OUT, op_ids[i], keys[i], PV_KEY_MAX, NULL); /* checked ids fit */
        argv[6 + i] = keys[i];
        argv[6 + n + i] = cursors[i][0] ? cursors[i] : "0";
    }
    redisReply *rep = NULL;
    int rc = pv_redis_commandv(r, &rep, st, (int)argc, argv, NULL);
    /* nil when the block ran out, else [[key, [entries]], ...] for the streams that had some */
    for (size_t i = 0; rc == PV_OK && rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        const redisReply *s = rep->element[i];
        if (s->type != REDIS_REPLY_ARRAY || s->elements != 2 || !s->element[0]->str ||
            s->element[1]->type != REDIS_REPLY_ARRAY || s->element[1]->elements == 0)
            continue;
        const redisReply *last = s->element[1]->element[s->element[1]->elements - 1];
        if (last->type != REDIS_REPLY_ARRAY || last->elements < 1 || !last->element[0]->str)
            continue;
        bool end = false;
        for (size_t e = 0; e < s->element[1]->elements; e++)
            end = end || is_end_entry(s->element[1]->element[e]);
        for (size_t j = 0; j < n; j++)
            if (strcmp(keys[j], s->element[0]->str) == 0) {
                snprintf(cursors[j], PV_OP_CURSOR_MAX, "%s", last->element[0]->str);
                if (ended) ended[j] = ended[j] || end;
                if (entries && !entries[j] && rc == PV_OK)
                    rc = wait_entries(s->element[1], &entries[j], &counts[j], st);
            }
        *woke = true;
    }
    if (rep) freeReplyObject(rep);
    if (rc != PV_OK && entries)
        for (size_t i = 0; i < n; i++) {
            pv_op_output_free(entries[i], counts[i]);
            entries[i] = NULL;
            counts[i] = 0;
        }
    free(argv);
    free(keys);
    return rc;
}

/* XREAD of key after `after` (see pv_op_output_read); end entries are skipped. */
static int read_stream(pv_redis *r, const char *key, const char *after, size_t count, int block_ms,
                       pv_op_output **entries, size_t *n, pv_status *st) {
    char cnt[24], blk[24];
    snprintf(cnt, sizeof cnt, "%zu", count ? count : 100);
    snprintf(blk, sizeof blk, "%d", block_ms);
    const char *with_block[] = {"XREAD", "COUNT",   cnt, "BLOCK",
                                blk,     "STREAMS", key, after && *after ? after : "0"};
    const char *no_block[] = {"XREAD", "COUNT", cnt, "STREAMS", key, after && *after ? after : "0"};
    redisReply *rep = NULL;
    int rc = block_ms > 0 ? pv_redis_commandv(r, &rep, st, 8, with_block, NULL)
                          : pv_redis_commandv(r, &rep, st, 6, no_block, NULL);
    if (rc != PV_OK) return rc;
    /* nil (nothing new) or [[key, [entries]]] */
    const redisReply *list =
        (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 && rep->element[0]->elements == 2)
            ? rep->element[0]->element[1]
            : NULL;
    if (list && list->elements > 0) {
        *entries = calloc(list->elements, sizeof **entries);
        if (!*entries) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        for (size_t i = 0; rc == PV_OK && i < list->elements; i++) {
            if (is_hidden_entry(list->element[i])) continue;
            rc = output_entry(list->element[i], &(*entries)[(*n)++], st);
        }
        if (rc == PV_OK && *n == 0) {
            free(*entries);
            *entries = NULL;
        }
        if (rc != PV_OK) {
            pv_op_output_free(*entries, *n);
            *entries = NULL;
            *n = 0;
        }
    }
    freeReplyObject(rep);
    return rc;
}

int pv_op_output_read(pv_redis *r, const pv_keys *k, const char *op_id, const char *after,
                      size_t count, int block_ms, pv_op_output **entries, size_t *n,
                      pv_status *st) {
    *entries = NULL;
    *n = 0;
    if (check_id(op_id, st) != PV_OK) return st->code;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_OP_OUT, op_id, key, sizeof key, st) != PV_OK) return st->code;
    return read_stream(r, key, after, count, block_ms, entries, n, st);
}

int pv_op_input_add(pv_redis *r, const pv_keys *k, const char *op_id, const char *data_b64,
                    bool eof, int ttl_seconds, pv_status *st) {
    if (check_id(op_id, st) != PV_OK) return st->code;
    char key[PV_KEY_MAX], ttl[24];
    if (pv_key(k, PV_KEY_OP_IN, op_id, key, sizeof key, st) != PV_OK) return st->code;
    snprintf(ttl, sizeof ttl, "%d", ttl_seconds > 0 ? ttl_seconds : 86400);
    const char *add[] = {"XADD", key, "*", eof ? "eof" : "data", eof ? "1" : data_b64};
    const char *expire[] = {"EXPIRE", key, ttl};
    if (pv_redis_append(r, 5, add, NULL, st) != PV_OK) return st->code;
    if (pv_redis_append(r, 3, expire, NULL, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (int i = 0; i < 2; i++) {
        redisReply *rep = NULL;
        if (pv_redis_get_reply(r, &rep, st) != PV_OK) {
            rc = st->code;
            continue;
        }
        if (rep->type == REDIS_REPLY_ERROR && rc == PV_OK)
            rc = pv_status_set(st, PV_INTERNAL, "input of %s: %s", op_id, rep->str);
        freeReplyObject(rep);
    }
    return rc;
}

int pv_op_input_read(pv_redis *r, const pv_keys *k, const char *op_id, const char *after,
                     size_t count, int block_ms, pv_op_output **entries, size_t *n, pv_status *st) {
    *entries = NULL;
    *n = 0;
    if (check_id(op_id, st) != PV_OK) return st->code;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_OP_IN, op_id, key, sizeof key, st) != PV_OK) return st->code;
    return read_stream(r, key, after, count, block_ms, entries, n, st);
}

int pv_op_finish(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op, int64_t token,
                 pv_op_status status, int error_code, const char *error_message, pv_status *st) {
    return pv_op_finish_output(r, k, o, op, token, status, error_code, error_message, 0, NULL, NULL,
                               st);
}

int pv_op_finish_output(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                        int64_t token, pv_op_status status, int error_code,
                        const char *error_message, size_t n, const char *const *fields,
                        const char *const *values, pv_status *st) {
    if (check_leased(op, token, st) != PV_OK) return st->code;
    if (status != PV_OP_SUCCEEDED && status != PV_OP_FAILED && status != PV_OP_CANCELLED)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "finish %s: status must be SUCCEEDED, FAILED or CANCELLED, got %s",
                             op->id, pv_op_status_name(status));
    if (status == PV_OP_SUCCEEDED) error_code = 0;
    if (status == PV_OP_CANCELLED) error_code = PV_CANCELLED;
    if (status == PV_OP_FAILED && error_code == PV_OK) error_code = PV_UNKNOWN;
    const char *msg = error_message ? error_message : "";
    if (status == PV_OP_CANCELLED && !msg[0]) msg = "cancelled";
    pv_strv keys = {0}, args = {0};
    fenced_start(k, op, token, &keys, &args);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_strv_add(&args, pv_op_status_name(status));
    pv_strv_addf(&args, "%d", error_code);
    pv_strv_add(&args, msg);
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    pv_strv_addf(&args, "%d", opts_retention(o));
    if (n > 0) pv_strv_addf(&args, "%d", PV_OP_OUTPUT_MAXLEN);
    for (size_t i = 0; i < n; i++) {
        pv_strv_add(&args, fields[i]);
        pv_strv_add(&args, values[i] ? values[i] : "");
    }
    redisReply *rep = NULL;
    int rc = fcall_locked(r, k, "pv_op_finish", &keys, &args, op->target, &rep, st);
    pv_strv_free(&keys);
    pv_strv_free(&args);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_op_retry_later(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                      int64_t token, int delay_ms, int error_code, const char *error_message,
                      bool *dead, pv_status *st) {
    *dead = false;
    if (check_leased(op, token, st) != PV_OK) return st->code;
    if (delay_ms < 0) delay_ms = 0;
    if (error_code == PV_OK) error_code = PV_UNKNOWN;
    pv_strv keys = {0}, args = {0};
    fenced_start(k, op, token, &keys, &args);
    pv_key_add(k, PV_KEY_OP_DELAYED, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_DEAD, NULL, &keys);
    pv_strv_addf(&args, "%d", delay_ms);
    pv_strv_addf(&args, "%d", error_code);
    pv_strv_add(&args, error_message ? error_message : "");
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    pv_strv_addf(&args, "%d", opts_retention(o));
    redisReply *rep = NULL;
    int rc = fcall_locked(r, k, "pv_op_retry_later", &keys, &args, op->target, &rep, st);
    pv_strv_free(&keys);
    pv_strv_free(&args);
    if (rc != PV_OK) return rc;
    const char *tag = reply_tag(rep, 2);
    if (!tag)
        rc = pv_status_set(st, PV_INTERNAL, "pv_op_retry_later %s: unexpected reply", op->id);
    else
        *dead = strcmp(tag, "DEAD") == 0;
    freeReplyObject(rep);
    return rc;
}

int pv_op_release(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                  int64_t token, pv_status *st) {
    if (check_leased(op, token, st) != PV_OK) return st->code;
    pv_strv keys = {0}, args = {0};
    fenced_start(k, op, token, &keys, &args);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    return fcall_void(r, "pv_op_release", &keys, &args, st);
}

/* What both hand-overs send after the record, its queue and their first three arguments (the
 * Lua handover's KEYS[3..6] and ARGV[4..8]), then by when not NULL (pv_op_handover_pending's
 * ARGV[9]) and the output entry's fields. */
static void handover_rest(const pv_keys *k, const pv_op_opts *o, const char *op_id,
                          const char *queue, const char *params_json, int timeout_ms,
                          const char *by, size_t n, const char *const *fields,
                          const char *const *values, pv_strv *keys, pv_strv *args) {
    pv_key_add(k, PV_KEY_OP_QUEUE, queue, keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, keys);
    pv_key_add(k, PV_KEY_OP_OUT, op_id, keys);
    pv_key_add(k, PV_KEY_OP_DELAYED, NULL, keys);
    pv_strv_add(args, queue);
    pv_strv_add(args, params_json);
    pv_strv_addf(args, "%d", opts_maxlen(o));
    pv_strv_addf(args, "%d", PV_OP_OUTPUT_MAXLEN);
    pv_strv_addf(args, "%d", timeout_ms > 0 ? timeout_ms : 0);
    if (by) pv_strv_add(args, by);
    for (size_t i = 0; i < n; i++) {
        pv_strv_add(args, fields[i]);
        pv_strv_add(args, values[i] ? values[i] : "");
    }
}

int pv_op_handover(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const pv_op *op,
                   int64_t token, const char *queue, const char *params_json, int timeout_ms,
                   size_t n, const char *const *fields, const char *const *values, pv_status *st) {
    /* params_json is the caller's own json_dumps: not parsed again here */
    if (check_leased(op, token, st) != PV_OK || check_text("queue", queue, st) != PV_OK ||
        check_text("params", params_json, st) != PV_OK)
        return st->code;
    pv_strv keys = {0}, args = {0};
    fenced_start(k, op, token, &keys, &args);
    handover_rest(k, o, op->id, queue, params_json, timeout_ms, NULL, n, fields, values, &keys,
                  &args);
    return fcall_void(r, "pv_op_handover", &keys, &args, st);
}

int pv_op_handover_pending(pv_redis *r, const pv_keys *k, const pv_op_opts *o, const char *op_id,
                           const char *from_queue, const char *entry, const char *by,
                           const char *queue, const char *params_json, int timeout_ms, size_t n,
                           const char *const *fields, const char *const *values, bool *moved,
                           pv_status *st) {
    *moved = false;
    if (check_text("operation id", op_id, st) != PV_OK ||
        check_text("queue", from_queue, st) != PV_OK || check_text("entry", entry, st) != PV_OK ||
        check_text("queue", queue, st) != PV_OK || check_text("params", params_json, st) != PV_OK)
        return st->code;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP, op_id, &keys);
    pv_key_add(k, PV_KEY_OP_QUEUE, from_queue, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_add(&args, op_id);
    pv_strv_add(&args, entry);
    handover_rest(k, o, op_id, queue, params_json, timeout_ms, by ? by : "", n, fields, values,
                  &keys, &args);
    redisReply *rep = NULL;
    int rc = fcall_done(r, "pv_op_handover_pending", &keys, &args, &rep, st);
    if (rc == PV_OK && rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "MOVED") == 0)
        *moved = true;
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_op_promote_due(pv_redis *r, const pv_keys *k, const pv_op_opts *o, int *moved,
                      pv_status *st) {
    *moved = 0;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP_DELAYED, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_EVENTS, NULL, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    pv_strv_addf(&args, "%d", PROMOTE_BATCH);
    pv_strv_addf(&args, "%d", opts_maxlen(o));
    int rc = PV_OK;
    /* Batches keep each call short (Redis runs nothing else meanwhile); a full batch means
     * more may be due. */
    for (int round = 0; rc == PV_OK && round < PROMOTE_MAX_ROUNDS; round++) {
        redisReply *rep = NULL;
        rc = fcall(r, "pv_op_promote_due", &keys, &args, &rep, st);
        if (rc != PV_OK) break;
        long long n = rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
        freeReplyObject(rep);
        *moved += (int)n;
        if (n < PROMOTE_BATCH) break;
    }
    pv_strv_free(&keys);
    pv_strv_free(&args);
    return rc;
}

int pv_op_ensure_group(pv_redis *r, const pv_keys *k, const char *queue, pv_status *st) {
    if (check_text("queue", queue, st) != PV_OK) return st->code;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_OP_QUEUE, queue, key, sizeof key, st) != PV_OK) return st->code;
    int rc = pv_redis_command(r, NULL, st, "XGROUP CREATE %s %s 0 MKSTREAM", key, PV_OP_GROUP);
    if (rc != PV_OK && strstr(st->msg, "BUSYGROUP")) {
        pv_status_clear(st);
        rc = PV_OK;
    }
    return rc;
}

int pv_op_trim(pv_redis *r, const pv_keys *k, const char *queue, long long *trimmed,
               pv_status *st) {
    *trimmed = 0;
    if (check_text("queue", queue, st) != PV_OK) return st->code;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP_QUEUE, queue, &keys);
    return fcall_int(r, "pv_op_trim", &keys, &args, queue, trimmed, st);
}

int pv_op_check(pv_redis *r, const pv_keys *k, char **report, int *problems, pv_status *st) {
    *report = NULL;
    *problems = 0;
    pv_strv keys = {0}, args = {0};
    pv_key_add(k, PV_KEY_OP_INDEX, NULL, &keys);
    pv_key_add(k, PV_KEY_OP_DELAYED, NULL, &keys);
    pv_key_add(k, PV_KEY_OPS, NULL, &args);
    redisReply *rep = NULL;
    int rc = fcall_done(r, "pv_op_check", &keys, &args, &rep, st);
    if (rc != PV_OK) return rc;
    if (rep->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(rep);
        return pv_status_set(st, PV_INTERNAL, "pv_op_check: unexpected reply");
    }
    size_t len = 1;
    for (size_t i = 0; i < rep->elements; i++)
        len += rep->element[i]->len + 1;
    char *out = malloc(len), *p = out;
    if (!out) {
        freeReplyObject(rep);
        return pv_status_set(st, PV_INTERNAL, "pv_op_check: out of memory");
    }
    for (size_t i = 0; i < rep->elements; i++) {
        memcpy(p, rep->element[i]->str, rep->element[i]->len);
        p += rep->element[i]->len;
        *p++ = '\n';
    }
    *p = '\0';
    *report = out;
    *problems = (int)rep->elements;
    freeReplyObject(rep);
    return PV_OK;
}

/* ---- key names for consumers, operators and tests ---- */

int pv_op_queue_key(const pv_keys *k, const char *queue, char *buf, size_t len, pv_status *st) {
    if (check_text("queue", queue, st) != PV_OK) return st->code;
    return pv_key(k, PV_KEY_OP_QUEUE, queue, buf, len, st);
}

int pv_op_events_key(const pv_keys *k, char *buf, size_t len, pv_status *st) {
    return pv_key(k, PV_KEY_OP_EVENTS, NULL, buf, len, st);
}

int pv_op_channel(const pv_keys *k, const char *op_id, char *buf, size_t len, pv_status *st) {
    if (check_id(op_id, st) != PV_OK) return st->code;
    return pv_key(k, PV_KEY_OP_CHAN, op_id, buf, len, st);
}
