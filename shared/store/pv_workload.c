/*
 * pv_workload: the C side of the workload functions (shared/store/redis/workload.lua).
 *
 * Input is checked here (ids, names, JSON shapes) so a bad request is answered without a round
 * trip and the Lua functions only check what Redis alone knows (existence, uniqueness). A status
 * travels as a JSON text; its opaque extension bytes ride inside it as base64, because function
 * arguments are C strings on this side. Records come back as flat field/value arrays and are
 * decoded through one table of their string fields, so a new field is one line here.
 */
#include "pv_workload.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "pv_registry.h"
#include "pv_time.h"
#include "pv_validate.h"

/* Statuses read per FCALL when a watcher reads them all: small enough to keep each call short. */
#define STATUS_PAGE_MAX 10000

static int oom(pv_status *st) {
    return pv_status_set(st, PV_INTERNAL, "workload: out of memory");
}

static int bad_reply(const char *what, pv_status *st) {
    return pv_status_set(st, PV_INTERNAL, "workload: unexpected reply to %s", what);
}

/* ---- records ---- */

static const pv_field k_wl_fields[] = {
    {.name = "id",
     .type = PV_FIELD_CHARS,
     .off = offsetof(pv_workload, id),
     .cap = PV_WORKLOAD_ID_LEN + 1},
    {.name = "name", .type = PV_FIELD_STR, .off = offsetof(pv_workload, name)},
    {.name = "app", .type = PV_FIELD_STR, .off = offsetof(pv_workload, app)},
    {.name = "entry", .type = PV_FIELD_STR, .off = offsetof(pv_workload, entry)},
    {.name = "pod", .type = PV_FIELD_STR, .off = offsetof(pv_workload, pod)},
    {.name = "node", .type = PV_FIELD_STR, .off = offsetof(pv_workload, node)},
    {.name = "node_id", .type = PV_FIELD_STR, .off = offsetof(pv_workload, node_id)},
    {.name = "image", .type = PV_FIELD_STR, .off = offsetof(pv_workload, image)},
    {.name = "privileged", .type = PV_FIELD_BOOL, .off = offsetof(pv_workload, privileged)},
    {.name = "labels", .type = PV_FIELD_STR, .off = offsetof(pv_workload, labels), .dflt = "{}"},
    {.name = "env", .type = PV_FIELD_STR, .off = offsetof(pv_workload, env), .dflt = "[]"},
    {.name = "publish", .type = PV_FIELD_STR, .off = offsetof(pv_workload, publish), .dflt = "{}"},
    {.name = "resources",
     .type = PV_FIELD_STR,
     .off = offsetof(pv_workload, resources),
     .dflt = "{}"},
    {.name = "alloc_id", .type = PV_FIELD_STR, .off = offsetof(pv_workload, alloc_id)},
    {.name = "engine_id", .type = PV_FIELD_STR, .off = offsetof(pv_workload, engine_id)},
    {.name = "created_ms", .type = PV_FIELD_I64, .off = offsetof(pv_workload, created_ms)},
    {.name = "epoch", .type = PV_FIELD_I64, .off = offsetof(pv_workload, epoch), .dflt = "1"},
    {.name = "placing", .type = PV_FIELD_STR, .off = offsetof(pv_workload, placing)},
};

const pv_record_schema pv_workload_schema = {
    "workload", k_wl_fields, PV_RECORD_NFIELDS(k_wl_fields), sizeof(pv_workload), 0};

void pv_workload_clear(pv_workload *w) {
    pv_record_free(&pv_workload_schema, w);
}

void pv_workload_array_free(pv_workload *w, size_t n) {
    pv_record_array_free(&pv_workload_schema, w, n);
}

/* Decodes a record from a function's reply, named by its key (made from the id it was asked
 * for, or the one the reply carries). */
static int decode_record(const pv_keys *k, const char *id, const redisReply *rep, pv_workload *w,
                         pv_status *st) {
    char key[PV_KEY_MAX] = "?";
    for (size_t i = 0; !id && rep->type == REDIS_REPLY_ARRAY && i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            strcmp(rep->element[i]->str, "id") == 0 &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING)
            id = rep->element[i + 1]->str;
    if (id && pv_key(k, PV_KEY_WL, id, key, sizeof key, NULL) != PV_OK)
        snprintf(key, sizeof key, "?");
    return pv_record_decode(&pv_workload_schema, key, rep, w, st);
}

/* ---- calls ---- */

/* The arguments of one FCALL: the key base first, then what the function takes. */
typedef struct fargs {
    char base[PV_KEY_MAX];
    char nodes[PV_KEY_MAX]; /* the registry's node index, for functions that look nodes up */
    const char **v;
    int n, cap;
    bool oom;
} fargs;

static int fargs_init(fargs *a, const pv_keys *k, pv_status *st) {
    memset(a, 0, sizeof *a);
    if (pv_key(k, PV_KEY_REG, NULL, a->base, sizeof a->base, NULL) != PV_OK ||
        pv_key(k, PV_KEY_NODES, NULL, a->nodes, sizeof a->nodes, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix %s is too long", k->prefix);
    return PV_OK;
}

static void fargs_add(fargs *a, const char *s) {
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        const char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = s ? s : "";
}

/* Runs fn with the base as ARGV[1] (and the node index as KEYS[1] when with_nodes), then the
 * arguments added; frees the argument array. */
static int fargs_run(fargs *a, pv_redis *r, const char *fn, bool with_nodes, redisReply **rep,
                     pv_status *st) {
    *rep = NULL;
    int rc;
    if (a->oom) {
        rc = oom(st);
    } else {
        const char *keys[] = {a->nodes};
        const char **argv = calloc((size_t)a->n + 1, sizeof *argv);
        if (!argv) {
            rc = oom(st);
        } else {
            argv[0] = a->base;
            if (a->n) memcpy(argv + 1, a->v, (size_t)a->n * sizeof *argv);
            rc = pv_redis_fcall(r, fn, with_nodes ? 1 : 0, keys, a->n + 1, argv, rep, st);
            free(argv);
        }
    }
    free(a->v);
    a->v = NULL;
    return rc;
}

/* ---- checks ---- */

int pv_workload_check_id(const char *field, const char *id, pv_status *st) {
    if (!id || !*id) return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: field is required", field);
    size_t len = strlen(id);
    if (len > PV_WORKLOAD_ID_LEN)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%.80s\" is longer than %d characters",
                             field, id, PV_WORKLOAD_ID_LEN);
    if (strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != len)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: \"%s\" may only hold letters, digits, '.', '_' and '-'", field,
                             id);
    return PV_OK;
}

/* Runs one of the functions that take a workload id after the base. */
static int by_id(pv_redis *r, const pv_keys *k, const char *fn, const char *id, redisReply **rep,
                 pv_status *st) {
    *rep = NULL;
    fargs a;
    if (pv_workload_check_id("id", id, st) != PV_OK || fargs_init(&a, k, st) != PV_OK)
        return st->code;
    fargs_add(&a, id);
    return fargs_run(&a, r, fn, false, rep, st);
}

static int check_json(const char *field, const char *text, bool array, pv_status *st) {
    json_t *j = json_loads(text, 0, NULL);
    bool ok = array ? json_is_array(j) : json_is_object(j);
    size_t i;
    json_t *v;
    if (ok && array) json_array_foreach(j, i, v) ok = ok && json_is_string(v);
    json_decref(j);
    if (ok) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not a JSON %s", field,
                         array ? "array of strings" : "object");
}

static int check_workload(const pv_workload *w, pv_status *st) {
    if (pv_workload_check_id("id", w->id, st) != PV_OK ||
        pv_validate_name("app", w->app, st) != PV_OK ||
        pv_validate_name("entry", w->entry, st) != PV_OK ||
        pv_validate_name("node", w->node, st) != PV_OK ||
        pv_validate_required("name", w->name, st) != PV_OK)
        return st->code;
    if (w->pod && *w->pod && pv_validate_name("pod", w->pod, st) != PV_OK) return st->code;
    if (w->labels && pv_registry_check_labels("labels", w->labels, st) != PV_OK) return st->code;
    if (w->env && check_json("env", w->env, true, st) != PV_OK) return st->code;
    if (w->publish && check_json("publish", w->publish, false, st) != PV_OK) return st->code;
    if (w->resources && *w->resources && check_json("resources", w->resources, false, st) != PV_OK)
        return st->code;
    return PV_OK;
}

/* ---- records: add, remove, get, list ---- */

int pv_workload_new_id(char out[PV_WORKLOAD_ID_LEN + 1], pv_status *st) {
    unsigned char raw[PV_WORKLOAD_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n <= 0) return pv_status_set(st, PV_INTERNAL, "workload id: no random source");
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[PV_WORKLOAD_ID_LEN] = '\0';
    return PV_OK;
}

/* Whether pv_wl_add's reply (the record's field/value pairs) says it ended the reservation. */
static bool reply_ended_resv(const redisReply *rep) {
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements < 2) return false;
    const redisReply *f = rep->element[rep->elements - 2], *v = rep->element[rep->elements - 1];
    return f->type == REDIS_REPLY_STRING && strcmp(f->str, "resv_ended") == 0 &&
           v->type == REDIS_REPLY_STRING && strcmp(v->str, "1") == 0;
}

int pv_workload_add(pv_redis *r, const pv_keys *k, const pv_workload *w, pv_status *st) {
    return pv_workload_add_ending(r, k, w, NULL, NULL, 0, NULL, st);
}

int pv_workload_add_ending(pv_redis *r, const pv_keys *k, const pv_workload *w, const char *resv_id,
                           const char *const *others, size_t nothers, bool *resv_ended,
                           pv_status *st) {
    if (resv_ended) *resv_ended = false;
    if (check_workload(w, st) != PV_OK) return st->code;
    fargs a;
    if (fargs_init(&a, k, st) != PV_OK) return st->code;
    const char *fields[] = {w->id,
                            w->name,
                            w->app,
                            w->entry,
                            w->pod,
                            w->node,
                            w->image,
                            w->privileged ? "1" : "0",
                            w->labels ? w->labels : "{}",
                            w->env ? w->env : "[]",
                            w->publish ? w->publish : "{}",
                            w->resources,
                            w->alloc_id,
                            w->engine_id,
                            w->deploy ? w->deploy : ""};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        fargs_add(&a, fields[i]);
    if (resv_id && *resv_id && w->alloc_id && *w->alloc_id) {
        fargs_add(&a, resv_id);
        for (size_t i = 0; i < nothers; i++)
            fargs_add(&a, others[i]);
    }
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_wl_add", true, &rep, st);
    if (rc == PV_OK && resv_ended) *resv_ended = reply_ended_resv(rep);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_remove(pv_redis *r, const pv_keys *k, const char *id, pv_status *st) {
    redisReply *rep = NULL;
    int rc = by_id(r, k, "pv_wl_remove", id, &rep, st);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_get(pv_redis *r, const pv_keys *k, const char *id, pv_workload *out,
                    pv_status *st) {
    memset(out, 0, sizeof *out);
    redisReply *rep = NULL;
    int rc = by_id(r, k, "pv_wl_get", id, &rep, st);
    if (rc == PV_OK) rc = decode_record(k, id, rep, out, st);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_node(pv_redis *r, const pv_keys *k, const char *id, char **node, pv_status *st) {
    *node = NULL;
    char key[PV_KEY_MAX];
    redisReply *rep = NULL;
    if (pv_workload_check_id("id", id, st) != PV_OK ||
        pv_key(k, PV_KEY_WL, id, key, sizeof key, st) != PV_OK ||
        pv_redis_command(r, &rep, st, "HGET %s node", key) != PV_OK)
        return st->code;
    int rc = rep->type == REDIS_REPLY_STRING
                 ? PV_OK
                 : pv_status_set(st, PV_NOT_FOUND, "workload %s not found", id);
    if (rc == PV_OK && !(*node = strdup(rep->str)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    freeReplyObject(rep);
    return rc;
}

int pv_workload_deploy(pv_redis *r, const pv_keys *k, const char *id, char **out, pv_status *st) {
    *out = NULL;
    redisReply *rep = NULL;
    int rc = by_id(r, k, "pv_wl_deploy", id, &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_STRING) rc = bad_reply("a deploy", st);
    if (rc == PV_OK && !(*out = strdup(rep->str)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_list(pv_redis *r, const pv_keys *k, const char *app, const char *entry,
                     const char *node, const char *labels_json, pv_workload **out, size_t *n,
                     pv_status *st) {
    *out = NULL;
    *n = 0;
    if ((app && *app && pv_validate_name("app", app, st) != PV_OK) ||
        (entry && *entry && pv_validate_name("entry", entry, st) != PV_OK) ||
        (node && *node && pv_validate_name("node", node, st) != PV_OK) ||
        (labels_json && pv_registry_check_labels("labels", labels_json, st) != PV_OK))
        return st->code;
    fargs a;
    if (fargs_init(&a, k, st) != PV_OK) return st->code;
    fargs_add(&a, app);
    fargs_add(&a, entry);
    fargs_add(&a, node);
    fargs_add(&a, labels_json ? labels_json : "{}");
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_wl_list", true, &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_ARRAY) rc = bad_reply("pv_wl_list", st);
    if (rc == PV_OK && rep->elements > 0) {
        pv_workload *v = calloc(rep->elements, sizeof *v);
        size_t got = 0;
        if (!v) rc = oom(st);
        while (rc == PV_OK && got < rep->elements) {
            rc = decode_record(k, NULL, rep->element[got], &v[got], st);
            if (rc == PV_OK) got++;
        }
        if (rc == PV_OK) {
            *out = v;
            *n = got;
        } else {
            pv_workload_array_free(v, got);
        }
    }
    if (rep) freeReplyObject(rep);
    return rc;
}

/* ---- statuses ---- */

void pv_workload_status_clear(pv_workload_status *s) {
    if (!s) return;
    free(s->networks);
    free(s->extension);
    free(s->app);
    free(s->entry);
    free(s->node);
    memset(s, 0, sizeof *s);
}

static const char k_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const unsigned char *in, size_t len) {
    char *out = malloc(4 * ((len + 2) / 3) + 1), *p = out;
    if (!out) return NULL;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < len) v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < len) v |= in[i + 2];
        *p++ = k_b64[(v >> 18) & 63];
        *p++ = k_b64[(v >> 12) & 63];
        *p++ = i + 1 < len ? k_b64[(v >> 6) & 63] : '=';
        *p++ = i + 2 < len ? k_b64[v & 63] : '=';
    }
    *p = '\0';
    return out;
}

/* Decodes what b64_encode wrote; -1 on anything else. *out NULL when empty. */
static int b64_decode(const char *in, unsigned char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    size_t n = strlen(in);
    if (n % 4 != 0) return -1;
    if (n == 0) return 0;
    unsigned char *buf = malloc(n / 4 * 3), *p = buf;
    if (!buf) return -1;
    for (size_t i = 0; i < n; i += 4) {
        unsigned v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            const char *c = in[i + j] == '=' ? NULL : strchr(k_b64, in[i + j]);
            if (in[i + j] == '=' && i + 4 == n && j >= 2) {
                pad++;
            } else if (!c || !in[i + j] || pad) {
                free(buf);
                return -1;
            }
            v = v << 6 | (c ? (unsigned)(c - k_b64) : 0);
        }
        *p++ = (unsigned char)(v >> 16);
        if (pad < 2) *p++ = (unsigned char)(v >> 8);
        if (pad < 1) *p++ = (unsigned char)v;
    }
    *out = buf;
    *len = (size_t)(p - buf);
    return 0;
}

/* The JSON text a status is stored as (without updated_ms: Redis adds it). */
static int status_json(const pv_workload_status *s, char **out, pv_status *st) {
    *out = NULL;
    if (pv_workload_check_id("id", s->id, st) != PV_OK) return st->code;
    if (s->ttl < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "ttl: %lld is not a valid status ttl of workload %s (seconds, 0 = "
                             "no expiry)",
                             (long long)s->ttl, s->id);
    if (s->ttl > PV_TTL_MAX_SECONDS)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "ttl: %lld seconds is longer than a status may live (%lld), workload "
                             "%s",
                             (long long)s->ttl, PV_TTL_MAX_SECONDS, s->id);
    const char *networks = s->networks && *s->networks ? s->networks : "{}";
    if (pv_registry_check_labels("networks", networks, st) != PV_OK)
        return pv_status_prefix(st, "workload %s", s->id);
    char *ext = b64_encode(s->extension, s->extension ? s->extension_len : 0);
    json_t *j = ext ? json_pack("{s:b, s:b, s:o, s:s, s:I}", "running", (int)s->running, "healthy",
                                (int)s->healthy, "networks", json_loads(networks, 0, NULL),
                                "extension", ext, "ttl", (json_int_t)s->ttl)
                    : NULL;
    *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    free(ext);
    return *out ? PV_OK : oom(st);
}

/* A string element of a reply, "" for anything else. */
static const char *str_of(const redisReply *r) {
    return r->type == REDIS_REPLY_STRING ? r->str : "";
}

/* A status as stored (text) with its owner's app, entry and node. */
static int status_parse(const char *id, const char *text, const char *app, const char *entry,
                        const char *node, pv_workload_status *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", id);
    json_t *j = json_loads(text, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return pv_status_set(st, PV_INTERNAL, "status of workload %s: not a JSON object", id);
    }
    out->running = json_is_true(json_object_get(j, "running"));
    out->healthy = json_is_true(json_object_get(j, "healthy"));
    out->ttl = (int64_t)json_number_value(json_object_get(j, "ttl"));
    out->updated_ms = (int64_t)json_number_value(json_object_get(j, "updated_ms"));
    json_t *net = json_object_get(j, "networks");
    out->networks = json_is_object(net) && json_object_size(net) > 0
                        ? json_dumps(net, JSON_COMPACT | JSON_SORT_KEYS)
                        : strdup("{}");
    const char *ext = json_string_value(json_object_get(j, "extension"));
    int bad = ext && b64_decode(ext, &out->extension, &out->extension_len) != 0;
    json_decref(j);
    if (bad) {
        pv_workload_status_clear(out);
        return pv_status_set(st, PV_INTERNAL, "status of workload %s: extension is not base64", id);
    }
    out->app = strdup(app);
    out->entry = strdup(entry);
    out->node = strdup(node);
    if (out->networks && out->app && out->entry && out->node) return PV_OK;
    pv_workload_status_clear(out);
    return oom(st);
}

static bool is_string(const redisReply *r) {
    return r->type == REDIS_REPLY_STRING;
}

int pv_workload_set_statuses(pv_redis *r, const pv_keys *k, const pv_workload_status *in, size_t n,
                             pv_workload_status *out, pv_status *st) {
    if (out) memset(out, 0, n * sizeof *out);
    if (n == 0) return PV_OK;
    char **texts = calloc(n, sizeof *texts);
    char(*ttls)[24] = calloc(n, sizeof *ttls);
    char(*epochs)[24] = calloc(n, sizeof *epochs);
    /* a node agent's report (one entry) goes through the fenced function */
    bool fenced = n == 1 && in[0].reporter && *in[0].reporter;
    char count[24];
    snprintf(count, sizeof count, "%zu", n);
    fargs a;
    int rc = texts && ttls && epochs ? fargs_init(&a, k, st) : oom(st);
    if (rc == PV_OK) fargs_add(&a, count);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        rc = status_json(&in[i], &texts[i], st);
        snprintf(ttls[i], sizeof ttls[i], "%lld", (long long)in[i].ttl);
        snprintf(epochs[i], sizeof epochs[i], "%lld",
                 (long long)(in[i].epoch > 0 ? in[i].epoch : 1));
        fargs_add(&a, in[i].id);
        fargs_add(&a, texts[i]);
        fargs_add(&a, ttls[i]);
        if (fenced) {
            fargs_add(&a, in[i].reporter);
            fargs_add(&a, epochs[i]);
        }
    }
    redisReply *rep = NULL;
    if (rc == PV_OK)
        rc = fargs_run(&a, r, fenced ? "pv_wl_report_status" : "pv_wl_set_status", false, &rep, st);
    else if (texts && ttls && epochs)
        free(a.v);
    if (rc == PV_OK && (rep->type != REDIS_REPLY_ARRAY || rep->elements != n))
        rc = bad_reply("pv_wl_set_status", st);
    for (size_t i = 0; rc == PV_OK && out && i < n; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 5 || !is_string(e->element[1])) {
            rc = bad_reply("pv_wl_set_status", st);
            break;
        }
        rc = status_parse(in[i].id, e->element[1]->str, str_of(e->element[2]),
                          str_of(e->element[3]), str_of(e->element[4]), &out[i], st);
    }
    if (rc != PV_OK && out)
        for (size_t i = 0; i < n; i++)
            pv_workload_status_clear(&out[i]);
    if (rep) freeReplyObject(rep);
    for (size_t i = 0; texts && i < n; i++)
        free(texts[i]);
    free(texts);
    free(ttls);
    free(epochs);
    return rc;
}

int pv_workload_set_status(pv_redis *r, const pv_keys *k, const pv_workload_status *s,
                           pv_workload_status *out, pv_status *st) {
    return pv_workload_set_statuses(r, k, s, 1, out, st);
}

int pv_workload_get_status(pv_redis *r, const pv_keys *k, const char *id, pv_workload_status *out,
                           pv_status *st) {
    memset(out, 0, sizeof *out);
    redisReply *rep = NULL;
    int rc = by_id(r, k, "pv_wl_get_status", id, &rep, st);
    if (rc == PV_OK &&
        (rep->type != REDIS_REPLY_ARRAY || rep->elements != 4 || !is_string(rep->element[0])))
        rc = bad_reply("pv_wl_get_status", st);
    if (rc == PV_OK)
        rc = status_parse(id, rep->element[0]->str, str_of(rep->element[1]),
                          str_of(rep->element[2]), str_of(rep->element[3]), out, st);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_mark_node_down(pv_redis *r, const pv_keys *k, const char *node, size_t *count,
                               pv_status *st) {
    if (count) *count = 0;
    fargs a;
    if (pv_validate_name("nodename", node, st) != PV_OK || fargs_init(&a, k, st) != PV_OK)
        return st->code;
    fargs_add(&a, node);
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_wl_mark_node_down", true, &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_INTEGER) rc = bad_reply("pv_wl_mark_node_down", st);
    if (rc == PV_OK && count) *count = (size_t)rep->integer;
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_mark_dead_nodes(pv_redis *r, const pv_keys *k, size_t *count, pv_status *st) {
    if (count) *count = 0;
    fargs a;
    if (fargs_init(&a, k, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_wl_mark_dead_nodes", true, &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_INTEGER)
        rc = bad_reply("pv_wl_mark_dead_nodes", st);
    if (rc == PV_OK && count) *count = (size_t)rep->integer;
    if (rep) freeReplyObject(rep);
    return rc;
}

/* ---- following statuses ---- */

int pv_workload_status_view(pv_redis *r, const pv_keys *k, const char *id,
                            pv_workload_status *out_status, bool *has_status, pv_workload *out_rec,
                            bool *has_record, pv_status *st) {
    *has_status = *has_record = false;
    redisReply *rep = NULL;
    int rc = by_id(r, k, "pv_wl_status_view", id, &rep, st);
    if (rc == PV_OK && (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
                        !is_string(rep->element[0]) || rep->element[1]->type != REDIS_REPLY_ARRAY))
        rc = bad_reply("pv_wl_status_view", st);
    const redisReply *rec = rc == PV_OK ? rep->element[1] : NULL;
    if (rc == PV_OK && rec->elements > 0) {
        rc = decode_record(k, id, rec, out_rec, st);
        *has_record = rc == PV_OK;
    }
    if (rc == PV_OK && rep->element[0]->len > 0) {
        /* The owner comes from the record just read (none when it is gone). */
        bool h = *has_record;
        rc = status_parse(id, rep->element[0]->str, h ? out_rec->app : "", h ? out_rec->entry : "",
                          h ? out_rec->node : "", out_status, st);
        *has_status = rc == PV_OK;
    }
    if (rc != PV_OK && *has_record) {
        pv_workload_clear(out_rec);
        *has_record = false;
    }
    if (rep) freeReplyObject(rep);
    return rc;
}

void pv_workload_status_refs_free(pv_workload_status_ref *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) {
        free(v[i].app);
        free(v[i].entry);
        free(v[i].node);
        free(v[i].labels);
    }
    free(v);
}

/* One entry of a status page: {id, updated_ms, app, entry, node, labels}. */
static int ref_parse(const redisReply *e, pv_workload_status_ref *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 6) return bad_reply("pv_wl_status_page", st);
    for (size_t i = 0; i < 6; i++)
        if (!is_string(e->element[i])) return bad_reply("pv_wl_status_page", st);
    snprintf(out->id, sizeof out->id, "%s", e->element[0]->str);
    out->updated_ms = strtoll(e->element[1]->str, NULL, 10);
    out->app = strdup(e->element[2]->str);
    out->entry = strdup(e->element[3]->str);
    out->node = strdup(e->element[4]->str);
    out->labels = strdup(e->element[5]->str);
    return out->app && out->entry && out->node && out->labels ? PV_OK : oom(st);
}

int pv_workload_status_page(pv_redis *r, const pv_keys *k, const char *after, size_t limit,
                            pv_workload_status_ref **out, size_t *n,
                            char next[PV_WORKLOAD_ID_LEN + 1], pv_status *st) {
    *out = NULL;
    *n = 0;
    if (after && *after && pv_workload_check_id("after", after, st) != PV_OK) return st->code;
    char from[PV_WORKLOAD_ID_LEN + 1]; /* after may be next itself: the usual loop passes it */
    snprintf(from, sizeof from, "%s", after ? after : "");
    next[0] = '\0';
    if (limit == 0 || limit > STATUS_PAGE_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "limit: %zu is not in 1..%d", limit,
                             STATUS_PAGE_MAX);
    char lim[24];
    snprintf(lim, sizeof lim, "%zu", limit);
    fargs a;
    if (fargs_init(&a, k, st) != PV_OK) return st->code;
    fargs_add(&a, from);
    fargs_add(&a, lim);
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_wl_status_page", false, &rep, st);
    if (rc == PV_OK && (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
                        !is_string(rep->element[0]) || rep->element[1]->type != REDIS_REPLY_ARRAY))
        rc = bad_reply("pv_wl_status_page", st);
    const redisReply *list = rc == PV_OK ? rep->element[1] : NULL;
    if (rc == PV_OK && list->elements > 0) {
        pv_workload_status_ref *v = calloc(list->elements, sizeof *v);
        size_t got = 0;
        if (!v) rc = oom(st);
        while (rc == PV_OK && got < list->elements) {
            rc = ref_parse(list->element[got], &v[got], st);
            got++; /* a half-filled entry is freed with the others */
        }
        if (rc == PV_OK) {
            *out = v;
            *n = got;
        } else {
            pv_workload_status_refs_free(v, got);
        }
    }
    if (rc == PV_OK) snprintf(next, PV_WORKLOAD_ID_LEN + 1, "%s", rep->element[0]->str);
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_mark_dissociated(pv_redis *r, const pv_keys *k, const char *id, pv_status *st) {
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_DISSOCIATED, id, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "SET %s 1", key);
    if (rep) freeReplyObject(rep);
    return rc;
}

/* ---- key names ---- */

int pv_workload_status_prefix(const pv_keys *k, char *buf, size_t len, pv_status *st) {
    if (pv_key(k, PV_KEY_WL_STATUS, "", buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix %s is too long", k->prefix);
    return PV_OK;
}

int pv_workload_status_key(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st) {
    if (pv_workload_check_id("id", id, st) != PV_OK ||
        pv_workload_status_prefix(k, buf, len, st) != PV_OK)
        return st->code;
    if (pv_key(k, PV_KEY_WL_STATUS, id, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "status key of workload %s is too long", id);
    return PV_OK;
}

int pv_workload_status_pattern(const pv_keys *k, int db, char *buf, size_t len, pv_status *st) {
    if (pv_key_keyspace_pattern(k, PV_KEY_WL_STATUS, db, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix %s is too long", k->prefix);
    return PV_OK;
}

/* ---- engine inventories ---- */

static int64_t inventory_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int pv_workload_inventory_put(pv_redis *r, const pv_keys *k, const char *node,
                              const char *const *ids, size_t n, int ttl, pv_status *st) {
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++)
        json_array_append_new(list, json_string(ids[i]));
    json_t *doc =
        list ? json_pack("{s:I, s:o}", "at_ms", (json_int_t)inventory_now_ms(), "ids", list) : NULL;
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char key[PV_KEY_MAX], ex[24];
    if (pv_key(k, PV_KEY_ENGINE_INV, node, key, sizeof key, st) != PV_OK) {
        free(text);
        return st->code;
    }
    snprintf(ex, sizeof ex, "%d", ttl > 0 ? ttl : 15);
    const char *argv[] = {"SET", key, text, "EX", ex};
    redisReply *rep = NULL;
    int rc = pv_redis_commandv(r, &rep, st, 5, argv, NULL);
    if (rep) freeReplyObject(rep);
    free(text);
    return rc;
}

int pv_workload_inventory_get(pv_redis *r, const pv_keys *k, const char *node, json_t **ids,
                              int64_t *at_ms, pv_status *st) {
    *ids = NULL;
    *at_ms = 0;
    char key[PV_KEY_MAX];
    if (pv_key(k, PV_KEY_ENGINE_INV, node, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "GET %s", key) != PV_OK) return st->code;
    int rc = PV_OK;
    json_t *doc = rep->type == REDIS_REPLY_STRING ? json_loads(rep->str, 0, NULL) : NULL;
    json_t *list = json_object_get(doc, "ids");
    if (rep->type != REDIS_REPLY_STRING)
        rc = pv_status_set(st, PV_NOT_FOUND, "node %s: no engine inventory", node);
    else if (!json_is_array(list) || !json_is_integer(json_object_get(doc, "at_ms")))
        rc = pv_status_set(st, PV_INTERNAL, "node %s: its engine inventory is unreadable", node);
    if (rc == PV_OK) {
        *ids = json_incref(list);
        *at_ms = json_integer_value(json_object_get(doc, "at_ms"));
    }
    json_decref(doc);
    freeReplyObject(rep);
    return rc;
}

/* ---- high availability ---- */

static const char *const k_verdicts[] = {"OWN", "PLACING", "MOVED", "GONE"};

int pv_workload_ha_check(pv_redis *r, const pv_keys *k, const char *id, const char *node,
                         int64_t epoch, pv_incarnation *verdict, int64_t *record_epoch,
                         pv_status *st) {
    *verdict = PV_INC_GONE;
    if (record_epoch) *record_epoch = 0;
    fargs a;
    if (pv_workload_check_id("id", id, st) != PV_OK || fargs_init(&a, k, st) != PV_OK)
        return st->code;
    char e[24];
    snprintf(e, sizeof e, "%lld", (long long)(epoch > 0 ? epoch : 1));
    fargs_add(&a, id);
    fargs_add(&a, node);
    fargs_add(&a, e);
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_wl_ha_check", false, &rep, st);
    if (rc == PV_OK && (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3))
        rc = bad_reply("pv_wl_ha_check", st);
    for (size_t i = 0; rc == PV_OK && i < sizeof k_verdicts / sizeof *k_verdicts; i++)
        if (strcmp(str_of(rep->element[0]), k_verdicts[i]) == 0) *verdict = (pv_incarnation)i;
    if (rc == PV_OK && record_epoch) *record_epoch = atoll(str_of(rep->element[2]));
    if (rep) freeReplyObject(rep);
    return rc;
}

/* Runs fn(base, id, more...) and returns its integer answer in *out. */
static int id_call_int(pv_redis *r, const pv_keys *k, const char *fn, const char *id,
                       const char *const *more, int nmore, int64_t *out, pv_status *st) {
    fargs a;
    if (pv_workload_check_id("id", id, st) != PV_OK || fargs_init(&a, k, st) != PV_OK)
        return st->code;
    fargs_add(&a, id);
    for (int i = 0; i < nmore; i++)
        fargs_add(&a, more[i]);
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, fn, false, &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_INTEGER) rc = bad_reply(fn, st);
    if (rc == PV_OK && out) *out = rep->integer;
    if (rep) freeReplyObject(rep);
    return rc;
}

int pv_workload_ha_claim(pv_redis *r, const pv_keys *k, const char *id, const char *node,
                         const char *op_id, int64_t *epoch, pv_status *st) {
    const char *more[] = {node, op_id};
    return id_call_int(r, k, "pv_wl_ha_claim", id, more, 2, epoch, st);
}

int pv_workload_ha_unclaim(pv_redis *r, const pv_keys *k, const char *id, const char *op_id,
                           bool *undone, pv_status *st) {
    const char *more[] = {op_id};
    int64_t v = 0;
    int rc = id_call_int(r, k, "pv_wl_ha_unclaim", id, more, 1, &v, st);
    if (undone) *undone = rc == PV_OK && v == 1;
    return rc;
}

void pv_ha_changes_free(pv_ha_change *c, size_t n) {
    for (size_t i = 0; c && i < n; i++) {
        free(c[i].node);
        free(c[i].node_id);
    }
    free(c);
}

int pv_workload_ha_scan(pv_redis *r, const pv_keys *k, pv_ha_change **out, size_t *n,
                        pv_status *st) {
    *out = NULL;
    *n = 0;
    fargs a;
    if (fargs_init(&a, k, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_ha_scan", true, &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_ARRAY) rc = bad_reply("pv_ha_scan", st);
    pv_ha_change *c = rc == PV_OK && rep->elements ? calloc(rep->elements, sizeof *c) : NULL;
    if (rc == PV_OK && rep->elements && !c) rc = oom(st);
    size_t m = 0;
    for (size_t i = 0; rc == PV_OK && i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 5) {
            rc = bad_reply("pv_ha_scan", st);
            break;
        }
        const char *what = str_of(e->element[2]);
        c[m].change = strcmp(what, "up") == 0     ? PV_HA_UP
                      : strcmp(what, "down") == 0 ? PV_HA_DOWN
                                                  : PV_HA_PENDING;
        c[m].node = strdup(str_of(e->element[0]));
        c[m].node_id = strdup(str_of(e->element[1]));
        c[m].ha_workloads = e->element[3]->type == REDIS_REPLY_INTEGER ? e->element[3]->integer : 0;
        c[m].downs = e->element[4]->type == REDIS_REPLY_INTEGER ? e->element[4]->integer : 0;
        if (!c[m].node || !c[m].node_id) rc = oom(st);
        m++;
    }
    if (rep) freeReplyObject(rep);
    if (rc != PV_OK) {
        pv_ha_changes_free(c, m);
        return rc;
    }
    *out = c;
    *n = m;
    return PV_OK;
}

int pv_workload_ha_ack(pv_redis *r, const pv_keys *k, const char *node_id, pv_status *st) {
    fargs a;
    if (fargs_init(&a, k, st) != PV_OK) return st->code;
    fargs_add(&a, node_id);
    redisReply *rep = NULL;
    int rc = fargs_run(&a, r, "pv_ha_ack", false, &rep, st);
    if (rep) freeReplyObject(rep);
    return rc;
}

bool pv_workload_is_ha(const char *labels_json, pv_status *st) {
    json_t *labels = json_loads(labels_json ? labels_json : "{}", 0, NULL);
    const char *v = json_string_value(json_object_get(labels, PV_HA_LABEL));
    bool yes = v && strcmp(v, PV_HA_RESTART) == 0;
    if (v && !yes && st)
        pv_status_set(st, PV_INVALID_ARGUMENT,
                      "labels: %s=\"%.100s\" is not an HA policy (the one there is: %s)",
                      PV_HA_LABEL, v, PV_HA_RESTART);
    json_decref(labels);
    return yes;
}
