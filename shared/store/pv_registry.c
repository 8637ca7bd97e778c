/*
 * pv_registry: the C side of the registry functions (shared/store/redis/registry.lua).
 *
 * Each public call checks its input here (names, endpoint scheme, JSON shapes), so a bad request
 * is answered without a round trip and the Lua functions only check what Redis alone knows
 * (existence, uniqueness, emptiness). Replies are flat field/value arrays; they are decoded
 * through one table per record type, so a field added to the schema is one line here.
 */
#include "pv_registry.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_res.h"
#include "pv_time.h"
#include "pv_validate.h"

#define ARGS_MAX 16

/* ---- records (pv_record.h: one table per kind) ---- */

static const pv_field k_pod_fields[] = {
    {.name = "id", .type = PV_FIELD_CHARS, .off = offsetof(pv_pod, id), .cap = PV_ID_MAX},
    {.name = "name", .type = PV_FIELD_STR, .off = offsetof(pv_pod, name)},
    {.name = "desc", .type = PV_FIELD_STR, .off = offsetof(pv_pod, desc)},
    {.name = "version", .type = PV_FIELD_STR, .off = offsetof(pv_pod, version)},
    {.name = "cp_nodes", .type = PV_FIELD_INT, .off = offsetof(pv_pod, cp_nodes)},
    {.name = "worker_nodes", .type = PV_FIELD_INT, .off = offsetof(pv_pod, worker_nodes)},
    {.name = "labels", .type = PV_FIELD_STR, .off = offsetof(pv_pod, labels), .dflt = "{}"},
    {.name = "annotations",
     .type = PV_FIELD_STR,
     .off = offsetof(pv_pod, annotations),
     .dflt = "{}"},
    {.name = "created_ms", .type = PV_FIELD_I64, .off = offsetof(pv_pod, created_ms)},
    {.name = "updated_ms", .type = PV_FIELD_I64, .off = offsetof(pv_pod, updated_ms)},
    {.name = "formed_ms", .type = PV_FIELD_I64, .off = offsetof(pv_pod, formed_ms)},
    {.name = "n_nodes", .type = PV_FIELD_LONG, .off = offsetof(pv_pod, n_nodes)},
};

static const pv_field k_node_fields[] = {
    {.name = "id", .type = PV_FIELD_CHARS, .off = offsetof(pv_node, id), .cap = PV_ID_MAX},
    {.name = "name", .type = PV_FIELD_STR, .off = offsetof(pv_node, name)},
    {.name = "pod_id", .type = PV_FIELD_STR, .off = offsetof(pv_node, pod_id)},
    {.name = "pod_name", .type = PV_FIELD_STR, .off = offsetof(pv_node, pod_name)},
    {.name = "role", .type = PV_FIELD_STR, .off = offsetof(pv_node, role), .dflt = "worker"},
    {.name = "ip", .type = PV_FIELD_STR, .off = offsetof(pv_node, ip)},
    {.name = "endpoint", .type = PV_FIELD_STR, .off = offsetof(pv_node, endpoint)},
    {.name = "engine", .type = PV_FIELD_STR, .off = offsetof(pv_node, engine)},
    {.name = "labels", .type = PV_FIELD_STR, .off = offsetof(pv_node, labels), .dflt = "{}"},
    {.name = "resources", .type = PV_FIELD_STR, .off = offsetof(pv_node, resources), .dflt = "{}"},
    {.name = "bypass", .type = PV_FIELD_BOOL, .off = offsetof(pv_node, bypass)},
    {.name = "usage", .type = PV_FIELD_STR, .off = offsetof(pv_node, usage), .dflt = "{}"},
    {.name = "usage_rev", .type = PV_FIELD_I64, .off = offsetof(pv_node, usage_rev)},
    {.name = "rev", .type = PV_FIELD_I64, .off = offsetof(pv_node, rev)},
    {.name = "created_ms", .type = PV_FIELD_I64, .off = offsetof(pv_node, created_ms)},
    {.name = "updated_ms", .type = PV_FIELD_I64, .off = offsetof(pv_node, updated_ms)},
    {.name = "alive", .type = PV_FIELD_BOOL, .off = offsetof(pv_node, alive)},
    {.name = "workloads", .type = PV_FIELD_LONG, .off = offsetof(pv_node, workloads)},
    {.name = "allocs", .type = PV_FIELD_LONG, .off = offsetof(pv_node, allocs)},
    {.name = "engine_info", .type = PV_FIELD_STR, .off = offsetof(pv_node, engine_info)},
};

const pv_record_schema pv_pod_schema = {"pod", k_pod_fields, PV_RECORD_NFIELDS(k_pod_fields),
                                        sizeof(pv_pod), 0};
const pv_record_schema pv_node_schema = {"node", k_node_fields, PV_RECORD_NFIELDS(k_node_fields),
                                         sizeof(pv_node), 0};

void pv_pod_clear(pv_pod *p) {
    pv_record_free(&pv_pod_schema, p);
}

void pv_node_clear(pv_node *n) {
    pv_record_free(&pv_node_schema, n);
}

void pv_pod_array_free(pv_pod *pods, size_t n) {
    pv_record_array_free(&pv_pod_schema, pods, n);
}

void pv_node_array_free(pv_node *nodes, size_t n) {
    pv_record_array_free(&pv_node_schema, nodes, n);
}

void pv_registry_names_free(char **names, size_t n) {
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

bool pv_node_down(const pv_node *n) {
    return n->bypass || !n->alive;
}

/* Decodes a record of kind s from a function's reply; its key (for messages) is made from the
 * reply's id field, as the reply names no key. */
static int decode_rec(const pv_keys *k, pv_key_kind kind, const pv_record_schema *s,
                      const redisReply *rep, void *out, pv_status *st) {
    char key[PV_KEY_MAX] = "?";
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i + 1 < rep->elements; i += 2)
        if (rep->element[i]->type == REDIS_REPLY_STRING &&
            strcmp(rep->element[i]->str, "id") == 0 &&
            rep->element[i + 1]->type == REDIS_REPLY_STRING &&
            pv_key(k, kind, rep->element[i + 1]->str, key, sizeof key, NULL) != PV_OK)
            snprintf(key, sizeof key, "?");
    return pv_record_decode(s, key, rep, out, st);
}

/* What the calls that name one pod or one node differ in. */
typedef struct reg_kind {
    pv_key_kind index, rec; /* the kind's index key, a record's key */
    const pv_record_schema *schema;
    const char *name_field; /* what a name is called in messages */
    const char *get_fn, *remove_fn;
} reg_kind;

static const reg_kind k_pods = {.index = PV_KEY_PODS,
                                .rec = PV_KEY_POD,
                                .schema = &pv_pod_schema,
                                .name_field = "name",
                                .get_fn = "pv_reg_get_pod",
                                .remove_fn = "pv_reg_remove_pod"};
static const reg_kind k_nodes = {.index = PV_KEY_NODES,
                                 .rec = PV_KEY_NODE,
                                 .schema = &pv_node_schema,
                                 .name_field = "nodename",
                                 .get_fn = "pv_reg_get_node",
                                 .remove_fn = "pv_reg_remove_node"};

/* ---- calls ---- */

/* One FCALL: keys are the registry's indexes, args[0] is always the base <p>{reg}:. */
typedef struct call {
    const pv_keys *k;
    char base[PV_KEY_MAX];
    char keys[2][PV_KEY_MAX];
    const char *keyv[2];
    int nkeys;
    const char *argv[ARGS_MAX];
    int nargs;
} call;

static int call_init(call *c, const pv_keys *k, pv_status *st) {
    memset(c, 0, sizeof *c);
    c->k = k;
    if (pv_key(k, PV_KEY_REG, NULL, c->base, sizeof c->base, st) != PV_OK) return st->code;
    c->argv[c->nargs++] = c->base;
    return PV_OK;
}

/* index: a fixed key (pods, nodes), which fits whenever the base did. */
static void call_key(call *c, pv_key_kind index) {
    pv_key(c->k, index, NULL, c->keys[c->nkeys], PV_KEY_MAX, NULL);
    c->keyv[c->nkeys] = c->keys[c->nkeys];
    c->nkeys++;
}

static void call_arg(call *c, const char *a) {
    if (c->nargs < ARGS_MAX) c->argv[c->nargs++] = a ? a : "";
}

static int call_run(pv_redis *r, call *c, const char *fn, redisReply **reply, pv_status *st) {
    return pv_redis_fcall(r, fn, c->nkeys, c->keyv, c->nargs, c->argv, reply, st);
}

/* ---- checks ---- */

static bool has_prefix(const char *s, const char *p) {
    return strncmp(s, p, strlen(p)) == 0;
}

int pv_registry_engine_of(const char *endpoint, const char **engine, pv_status *st) {
    if (!endpoint || !*endpoint)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "endpoint: field is required "
                             "(process://, virt://<uri>, tcp:// or "
                             "unix://)");
    if (has_prefix(endpoint, "process://")) {
        *engine = "process";
        return PV_OK;
    }
    if (has_prefix(endpoint, "virt://")) {
        if (!endpoint[strlen("virt://")])
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "endpoint: \"%s\" needs a libvirt URI after virt:// "
                                 "(virt://qemu:///system)",
                                 endpoint);
        *engine = "virt";
        return PV_OK;
    }
    if (has_prefix(endpoint, "tcp://") || has_prefix(endpoint, "unix://")) {
        const char *rest = strstr(endpoint, "://") + 3;
        if (!*rest)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "endpoint: \"%s\" has no address",
                                 endpoint);
        *engine = "docker";
        return PV_OK;
    }
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "endpoint: \"%s\" has an unknown scheme (want process://, "
                         "virt://<uri>, tcp:// or unix://)",
                         endpoint);
}

int pv_registry_check_labels(const char *field, const char *text, pv_status *st) {
    json_error_t e;
    json_t *j = json_loads(text ? text : "", 0, &e);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not a JSON object", field);
    }
    const char *key;
    json_t *v;
    int rc = PV_OK;
    json_object_foreach(j, key, v) {
        if (!json_is_string(v)) {
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s[%s]: value must be a string", field,
                               key);
            break;
        }
    }
    json_decref(j);
    return rc;
}

/* One plugin's node document, checked by the plugin itself (shared/core/pv_res): the same parse
 * the scheduler runs later, so a document stored here is one it can use. */
static int check_plugin(const char *plugin, json_t *doc, const pv_res_engine_info *info,
                        pv_status *st) {
    bool cpumem = strcmp(plugin, "cpumem") == 0;
    if (!cpumem && strcmp(plugin, "storage") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "resources: unknown plugin \"%s\" (known: cpumem, storage)", plugin);
    char *text = json_dumps(doc, JSON_COMPACT);
    if (!text) return pv_status_set(st, PV_INTERNAL, "resources[%s]: out of memory", plugin);
    int rc;
    if (cpumem) {
        pv_res_cpumem node;
        memset(&node, 0, sizeof node);
        rc = pv_res_cpumem_node_parse(text, strlen(text), info, &node, st);
        pv_res_cpumem_free(&node);
    } else {
        pv_res_storage node;
        memset(&node, 0, sizeof node);
        rc = pv_res_storage_node_parse(text, strlen(text), info, &node, st);
        pv_res_storage_free(&node);
    }
    free(text);
    return rc == PV_OK ? PV_OK : pv_status_prefix(st, "resources");
}

int pv_registry_check_resources(const char *text, pv_status *st) {
    return pv_registry_check_resources_with(text, NULL, st);
}

int pv_registry_check_resources_with(const char *text, const pv_res_engine_info *info,
                                     pv_status *st) {
    json_error_t e;
    json_t *j = json_loads(text ? text : "", 0, &e);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "resources: not a JSON object");
    }
    const char *key;
    json_t *v;
    int rc = PV_OK;
    json_object_foreach(j, key, v) {
        if (!json_is_object(v)) {
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               "resources[%s]: the plugin's document must be a JSON object", key);
            break;
        }
        if ((rc = check_plugin(key, v, info, st)) != PV_OK) break;
    }
    json_decref(j);
    return rc;
}

bool pv_registry_resources_complete(const char *text) {
    json_t *j = json_loads(text ? text : "{}", 0, NULL);
    json_t *cpumem = json_object_get(j, "cpumem");
    bool complete = json_is_object(cpumem) && json_object_get(cpumem, "cpu") &&
                    json_object_get(cpumem, "memory");
    json_decref(j);
    return complete;
}

/* ---- pods ---- */

/* A call's reply that is one record of kind rk, decoded into out (NULL: not wanted) and
 * freed. */
static int rec_reply(const pv_keys *k, const reg_kind *rk, int rc, redisReply *rep, void *out,
                     pv_status *st) {
    if (rc == PV_OK && out) rc = decode_rec(k, rk->rec, rk->schema, rep, out, st);
    freeReplyObject(rep);
    return rc;
}

/* Removes the pod or node name (the Lua function refuses while it is in use). */
static int remove_rec(pv_redis *r, const pv_keys *k, const reg_kind *rk, const char *name,
                      pv_status *st) {
    if (pv_validate_name(rk->name_field, name, st) != PV_OK) return st->code;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, rk->index);
    call_arg(&c, name);
    redisReply *rep = NULL;
    int rc = call_run(r, &c, rk->remove_fn, &rep, st);
    freeReplyObject(rep);
    return rc;
}

static int get_rec(pv_redis *r, const pv_keys *k, const reg_kind *rk, pv_reg_by by,
                   const char *value, void *out, pv_status *st) {
    if (pv_validate_name(by == PV_REG_BY_ID ? "id" : rk->name_field, value, st) != PV_OK)
        return st->code;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, rk->index);
    call_arg(&c, by == PV_REG_BY_ID ? "id" : "name");
    call_arg(&c, value);
    redisReply *rep = NULL;
    int rc = call_run(r, &c, rk->get_fn, &rep, st);
    return rec_reply(k, rk, rc, rep, out, st);
}

int pv_registry_get_pod(pv_redis *r, const pv_keys *k, pv_reg_by by, const char *value, pv_pod *out,
                        pv_status *st) {
    return get_rec(r, k, &k_pods, by, value, out, st);
}

int pv_registry_get_node(pv_redis *r, const pv_keys *k, pv_reg_by by, const char *value,
                         pv_node *out, pv_status *st) {
    return get_rec(r, k, &k_nodes, by, value, out, st);
}

int pv_registry_remove_pod(pv_redis *r, const pv_keys *k, const char *name, pv_status *st) {
    return remove_rec(r, k, &k_pods, name, st);
}

int pv_registry_remove_node(pv_redis *r, const pv_keys *k, const char *name, pv_status *st) {
    return remove_rec(r, k, &k_nodes, name, st);
}

int pv_registry_add_pod(pv_redis *r, const pv_keys *k, const pv_pod_spec *spec, pv_pod *out,
                        pv_status *st) {
    if (pv_validate_name("name", spec->name, st) != PV_OK) return st->code;
    if (spec->cp_nodes < 0 || spec->worker_nodes < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "topology: node counts must be >= 0 (control plane %d, workers %d)",
                             spec->cp_nodes, spec->worker_nodes);
    if (spec->labels && pv_registry_check_labels("labels", spec->labels, st) != PV_OK)
        return st->code;
    if (spec->annotations &&
        pv_registry_check_labels("annotations", spec->annotations, st) != PV_OK)
        return st->code;
    char id[PV_ID_MAX], cp[16], workers[16];
    if (pv_id_new("cluster", id, sizeof id) != 0)
        return pv_status_set(st, PV_INTERNAL, "cannot make a pod id");
    snprintf(cp, sizeof cp, "%d", spec->cp_nodes);
    snprintf(workers, sizeof workers, "%d", spec->worker_nodes);
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_PODS);
    call_arg(&c, id);
    call_arg(&c, spec->name);
    call_arg(&c, spec->desc);
    call_arg(&c, spec->version);
    call_arg(&c, cp);
    call_arg(&c, workers);
    call_arg(&c, spec->labels ? spec->labels : "{}");
    call_arg(&c, spec->annotations ? spec->annotations : "{}");
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_add_pod", &rep, st);
    return rec_reply(k, &k_pods, rc, rep, out, st);
}

int pv_registry_update_pod(pv_redis *r, const pv_keys *k, const pv_pod_update *u, pv_pod *out,
                           pv_status *st) {
    if (pv_validate_name("name", u->name, st) != PV_OK) return st->code;
    if (u->labels && pv_registry_check_labels("labels", u->labels, st) != PV_OK) return st->code;
    if (u->annotations && pv_registry_check_labels("annotations", u->annotations, st) != PV_OK)
        return st->code;
    char cp[16] = "", workers[16] = "";
    if (u->cp_nodes >= 0) snprintf(cp, sizeof cp, "%d", u->cp_nodes);
    if (u->worker_nodes >= 0) snprintf(workers, sizeof workers, "%d", u->worker_nodes);
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_PODS);
    call_arg(&c, u->name);
    call_arg(&c, u->labels ? u->labels : "");
    call_arg(&c, u->annotations ? u->annotations : "");
    call_arg(&c, cp);
    call_arg(&c, workers);
    call_arg(&c, u->mark_formed ? "1" : "");
    call_arg(&c, u->version ? u->version : "");
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_update_pod", &rep, st);
    return rec_reply(k, &k_pods, rc, rep, out, st);
}

/* Decodes an array of records of kind s into a new array. */
static int decode_list(const pv_keys *k, pv_key_kind kind, const pv_record_schema *s,
                       redisReply *rep, void **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    if (rep->type != REDIS_REPLY_ARRAY)
        return pv_status_set(st, PV_INTERNAL, "registry: unexpected list reply (type %d)",
                             rep->type);
    if (rep->elements == 0) return PV_OK;
    char *arr = calloc(rep->elements, s->size);
    if (!arr) return pv_status_set(st, PV_INTERNAL, "registry: out of memory");
    for (size_t i = 0; i < rep->elements; i++) {
        if (decode_rec(k, kind, s, rep->element[i], arr + i * s->size, st) != PV_OK) {
            pv_record_array_free(s, arr, i);
            return st->code;
        }
    }
    *out = arr;
    *n = rep->elements;
    return PV_OK;
}

int pv_registry_list_pods(pv_redis *r, const pv_keys *k, pv_pod **pods, size_t *n, pv_status *st) {
    *pods = NULL;
    *n = 0;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_PODS);
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_list_pods", &rep, st);
    if (rc == PV_OK) rc = decode_list(k, PV_KEY_POD, &pv_pod_schema, rep, (void **)pods, n, st);
    freeReplyObject(rep);
    return rc;
}

/* ---- nodes ---- */

int pv_registry_add_node(pv_redis *r, const pv_keys *k, const pv_node_spec *spec, pv_node *out,
                         pv_status *st) {
    const char *engine = NULL;
    if (pv_validate_name("nodename", spec->name, st) != PV_OK ||
        pv_validate_name("podname", spec->pod_name, st) != PV_OK ||
        pv_registry_engine_of(spec->endpoint, &engine, st) != PV_OK)
        return st->code;
    if (spec->role && *spec->role && strcmp(spec->role, "worker") != 0 &&
        strcmp(spec->role, "control-plane") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "role: \"%s\" is neither worker nor control-plane", spec->role);
    if (spec->labels && pv_registry_check_labels("labels", spec->labels, st) != PV_OK)
        return st->code;
    if (spec->resources && pv_registry_check_resources(spec->resources, st) != PV_OK)
        return st->code;
    char id[PV_ID_MAX];
    if (pv_id_new("node", id, sizeof id) != 0)
        return pv_status_set(st, PV_INTERNAL, "cannot make a node id");
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    call_key(&c, PV_KEY_PODS);
    call_arg(&c, id);
    call_arg(&c, spec->name);
    call_arg(&c, spec->pod_name);
    call_arg(&c, spec->role && *spec->role ? spec->role : "worker");
    call_arg(&c, spec->ip);
    call_arg(&c, spec->endpoint);
    call_arg(&c, engine);
    call_arg(&c, spec->labels ? spec->labels : "{}");
    call_arg(&c, spec->resources ? spec->resources : "{}");
    call_arg(&c, spec->tls_ca ? spec->tls_ca : "");
    call_arg(&c, spec->tls_cert ? spec->tls_cert : "");
    call_arg(&c, spec->tls_key ? spec->tls_key : "");
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_add_node", &rep, st);
    return rec_reply(k, &k_nodes, rc, rep, out, st);
}

int pv_registry_list_nodes(pv_redis *r, const pv_keys *k, const char *pod_name, pv_node **nodes,
                           size_t *n, pv_status *st) {
    *nodes = NULL;
    *n = 0;
    if (pod_name && *pod_name && pv_validate_name("podname", pod_name, st) != PV_OK)
        return st->code;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    call_key(&c, PV_KEY_PODS);
    call_arg(&c, pod_name ? pod_name : "");
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_list_nodes", &rep, st);
    if (rc == PV_OK) rc = decode_list(k, PV_KEY_NODE, &pv_node_schema, rep, (void **)nodes, n, st);
    freeReplyObject(rep);
    return rc;
}

int pv_registry_set_node(pv_redis *r, const pv_keys *k, const pv_node_update *u, pv_node *out,
                         pv_status *st) {
    const char *engine = "";
    if (pv_validate_name("nodename", u->name, st) != PV_OK) return st->code;
    if (u->endpoint && *u->endpoint && pv_registry_engine_of(u->endpoint, &engine, st) != PV_OK)
        return st->code;
    if (u->labels && pv_registry_check_labels("labels", u->labels, st) != PV_OK) return st->code;
    if (u->resources && pv_registry_check_resources(u->resources, st) != PV_OK) return st->code;
    if (u->bypass != PV_TRI_KEEP && u->bypass != PV_TRI_TRUE && u->bypass != PV_TRI_FALSE)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "bypass: unknown value %d", (int)u->bypass);
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    call_arg(&c, u->name);
    call_arg(&c, u->endpoint && *u->endpoint ? u->endpoint : "");
    call_arg(&c, engine);
    call_arg(&c, !u->labels ? "keep" : u->labels_merge ? "merge" : "replace");
    call_arg(&c, u->labels ? u->labels : "{}");
    call_arg(&c, u->resources ? "replace" : "keep");
    call_arg(&c, u->resources ? u->resources : "{}");
    call_arg(&c, u->bypass == PV_TRI_KEEP ? "keep" : u->bypass == PV_TRI_TRUE ? "1" : "0");
    char rev[32] = "";
    if (u->resources && u->check_usage_rev)
        snprintf(rev, sizeof rev, "%lld", (long long)u->usage_rev);
    call_arg(&c, rev);
    call_arg(&c, u->tls_ca ? u->tls_ca : "");
    call_arg(&c, u->tls_cert ? u->tls_cert : "");
    call_arg(&c, u->tls_key ? u->tls_key : "");
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_set_node", &rep, st);
    return rec_reply(k, &k_nodes, rc, rep, out, st);
}

int pv_registry_get_node_tls(pv_redis *r, const pv_keys *k, const char *name, char **ca,
                             char **cert, char **key, pv_status *st) {
    char **out[] = {ca, cert, key};
    for (int i = 0; i < 3; i++)
        *out[i] = NULL;
    if (pv_validate_name("nodename", name, st) != PV_OK) return st->code;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    call_arg(&c, name);
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_get_node_tls", &rep, st);
    if (rc == PV_OK && (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3))
        rc = pv_status_set(st, PV_INTERNAL, "registry: unexpected node TLS reply");
    for (int i = 0; rc == PV_OK && i < 3; i++) {
        const redisReply *e = rep->element[i];
        if (!(*out[i] = strdup(e->type == REDIS_REPLY_STRING ? e->str : "")))
            rc = pv_status_set(st, PV_INTERNAL, "registry: out of memory");
    }
    freeReplyObject(rep);
    for (int i = 0; rc != PV_OK && i < 3; i++) {
        free(*out[i]);
        *out[i] = NULL;
    }
    return rc;
}

/* ---- liveness ---- */

int pv_registry_set_alive(pv_redis *r, const pv_keys *k, const char *node, long long ttl_seconds,
                          const char *value, pv_status *st) {
    if (pv_validate_name("nodename", node, st) != PV_OK) return st->code;
    if (ttl_seconds == 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "ttl: 0 is not a valid status ttl (seconds > 0 sets, < 0 deletes)");
    if (ttl_seconds > PV_TTL_MAX_SECONDS)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "ttl: %lld seconds is longer than a status may live (%lld)",
                             ttl_seconds, PV_TTL_MAX_SECONDS);
    char ttl[32];
    snprintf(ttl, sizeof ttl, "%lld", ttl_seconds);
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    call_arg(&c, node);
    call_arg(&c, ttl);
    call_arg(&c, value && *value ? value : "1");
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_set_alive", &rep, st);
    freeReplyObject(rep);
    return rc;
}

int pv_registry_get_alive(pv_redis *r, const pv_keys *k, const char *node, bool *alive,
                          char **pod_name, pv_status *st) {
    *alive = false;
    if (pod_name) *pod_name = NULL;
    if (pv_validate_name("nodename", node, st) != PV_OK) return st->code;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    call_arg(&c, node);
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_get_alive", &rep, st);
    if (rc == PV_OK) {
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_INTEGER ||
            rep->element[1]->type != REDIS_REPLY_STRING) {
            rc = pv_status_set(st, PV_INTERNAL, "registry: unexpected status reply");
        } else {
            *alive = rep->element[0]->integer == 1;
            if (pod_name && !(*pod_name = strdup(rep->element[1]->str)))
                rc = pv_status_set(st, PV_INTERNAL, "registry: out of memory");
        }
    }
    freeReplyObject(rep);
    return rc;
}

/* The string elements of an array reply as a new array of copies. */
static int copy_names(const redisReply *rep, char ***names, size_t *n, pv_status *st) {
    char **v = calloc(rep->elements, sizeof *v);
    if (!v) return pv_status_set(st, PV_INTERNAL, "registry: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        if (rep->element[i]->type != REDIS_REPLY_STRING) continue;
        if (!(v[m] = strdup(rep->element[i]->str))) {
            pv_registry_names_free(v, m);
            return pv_status_set(st, PV_INTERNAL, "registry: out of memory");
        }
        m++;
    }
    *names = v;
    *n = m;
    return PV_OK;
}

int pv_registry_alive_nodes(pv_redis *r, const pv_keys *k, char ***names, size_t *n,
                            pv_status *st) {
    *names = NULL;
    *n = 0;
    call c;
    if (call_init(&c, k, st) != PV_OK) return st->code;
    call_key(&c, PV_KEY_NODES);
    redisReply *rep = NULL;
    int rc = call_run(r, &c, "pv_reg_alive_nodes", &rep, st);
    if (rc == PV_OK && rep->type != REDIS_REPLY_ARRAY)
        rc = pv_status_set(st, PV_INTERNAL, "registry: unexpected alive list reply");
    if (rc == PV_OK && rep->elements > 0) rc = copy_names(rep, names, n, st);
    freeReplyObject(rep);
    return rc;
}

/* ---- engine info ---- */

static int engine_info_key(const pv_keys *k, const char *node, char *buf, size_t len,
                           pv_status *st) {
    if (pv_key(k, PV_KEY_ENGINE_INFO, node, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "engine info key of node %s is too long",
                             node);
    return PV_OK;
}

int pv_registry_set_engine_info(pv_redis *r, const pv_keys *k, const char *node, const char *json,
                                long long ttl_seconds, pv_status *st) {
    char key[PV_KEY_MAX];
    if (pv_validate_name("nodename", node, st) != PV_OK ||
        engine_info_key(k, node, key, sizeof key, st) != PV_OK)
        return st->code;
    if (ttl_seconds == 0)
        return pv_status_set(
            st, PV_INVALID_ARGUMENT,
            "ttl: 0 is not a valid engine info ttl (seconds > 0 sets, < 0 deletes)");
    redisReply *rep = NULL;
    int rc;
    if (ttl_seconds < 0) {
        rc = pv_redis_command(r, &rep, st, "DEL %s", key);
        freeReplyObject(rep);
        return rc;
    }
    json_t *j = json_loads(json ? json : "", 0, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    bool ok = json_is_object(j) && type && *type;
    json_decref(j);
    if (!ok)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "engine info of node %s: want a JSON object with a \"type\"", node);
    rc = pv_redis_command(r, &rep, st, "SET %s %s EX %lld", key, json, ttl_seconds);
    freeReplyObject(rep);
    return rc;
}

int pv_registry_get_engine_info(pv_redis *r, const pv_keys *k, const char *node, char **json,
                                pv_status *st) {
    *json = NULL;
    char key[PV_KEY_MAX];
    if (pv_validate_name("nodename", node, st) != PV_OK ||
        engine_info_key(k, node, key, sizeof key, st) != PV_OK)
        return st->code;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "GET %s", key);
    if (rc == PV_OK) {
        if (rep->type != REDIS_REPLY_STRING)
            rc = pv_status_set(st, PV_NOT_FOUND, "no agent has reported engine info for node %s",
                               node);
        else if (!(*json = strdup(rep->str)))
            rc = pv_status_set(st, PV_INTERNAL, "registry: out of memory");
    }
    freeReplyObject(rep);
    return rc;
}

/* A fact of a report: a non-negative integer, else 0 (unknown). */
static int64_t fact(json_t *j, const char *name) {
    json_t *v = json_object_get(j, name);
    json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;
    return n > 0 ? (int64_t)n : 0;
}

int pv_registry_engine_facts(const char *json, pv_res_engine_info *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    json_t *j = json_loads(json ? json : "", 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "engine info: not a JSON object");
    }
    out->cpu_count = fact(j, "cpu_count");
    out->mem_total = fact(j, "mem_total");
    out->storage_total = fact(j, "storage_total");
    json_decref(j);
    return PV_OK;
}

int pv_registry_alive_key(const pv_keys *k, const char *node, char *buf, size_t len,
                          pv_status *st) {
    if (pv_key(k, PV_KEY_ALIVE, node, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "alive key of node %s is too long", node);
    return PV_OK;
}

int pv_registry_alive_prefix(const pv_keys *k, char *buf, size_t len, pv_status *st) {
    if (pv_key(k, PV_KEY_ALIVE, "", buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix %s is too long", k->prefix);
    return PV_OK;
}

int pv_registry_alive_pattern(const pv_keys *k, int db, char *buf, size_t len, pv_status *st) {
    if (pv_key_keyspace_pattern(k, PV_KEY_ALIVE, db, buf, len, NULL) != PV_OK)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis.prefix %s is too long", k->prefix);
    return PV_OK;
}

/* ---- keyspace notifications ---- */

/* Adds to have the flags of want it lacks; 'A' in have stands for "g$lshzxet". */
static void merge_flags(const char *have, const char *want, char *out, size_t len) {
    snprintf(out, len, "%s", have);
    bool all = strchr(have, 'A') != NULL;
    for (const char *w = want; *w; w++) {
        if (strchr(out, *w)) continue;
        if (all && strchr("g$lshzxet", *w)) continue;
        size_t n = strlen(out);
        if (n + 1 < len) {
            out[n] = *w;
            out[n + 1] = '\0';
        }
    }
}

int pv_registry_ensure_notify(pv_redis *r, bool *changed, pv_status *st) {
    if (changed) *changed = false;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "CONFIG GET notify-keyspace-events");
    if (rc != PV_OK) return pv_status_prefix(st, "reading notify-keyspace-events");
    const char *have = "";
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_STRING)
        have = rep->element[1]->str;
    char merged[64];
    merge_flags(have, PV_REGISTRY_NOTIFY_FLAGS, merged, sizeof merged);
    bool same = strcmp(merged, have) == 0;
    freeReplyObject(rep);
    if (same) return PV_OK;
    rc = pv_redis_command(r, &rep, st, "CONFIG SET notify-keyspace-events %s", merged);
    freeReplyObject(rep);
    if (rc != PV_OK) return pv_status_prefix(st, "setting notify-keyspace-events to %s", merged);
    if (changed) *changed = true;
    return PV_OK;
}
