/*
 * pv_deploy: DeployOptions checks and plan requests (see pv_deploy.h).
 */
#include "pv_deploy.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pv_res.h"

static int empty(const char *s) {
    return !s || !*s;
}

/* The resources map (plugin -> JSON document) as one object; documents must be JSON objects and
 * pass the plugin's own parser. *out is a new reference. */
static int resources_object(const Pb__DeployOptions *o, json_t **out, pv_status *st) {
    json_t *j = json_object();
    if (!j) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < o->n_resources; i++) {
        const Pb__DeployOptions__ResourcesEntry *e = o->resources[i];
        json_error_t err;
        json_t *doc = json_loadb((const char *)e->value.data, e->value.len, 0, &err);
        int rc = PV_OK;
        if (!doc)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "resources[%s]: not valid JSON: %s", e->key,
                               err.text);
        else if (!json_is_object(doc))
            rc =
                pv_status_set(st, PV_INVALID_ARGUMENT,
                              "resources[%s]: the plugin's document must be a JSON object", e->key);
        else if (json_object_set(j, e->key, doc) != 0)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "resources: plugin name is not UTF-8");
        json_decref(doc);
        if (rc != PV_OK) {
            json_decref(j);
            return rc;
        }
    }
    char *text = json_dumps(j, JSON_COMPACT);
    pv_res_req check = {0};
    int rc =
        text ? pv_res_req_parse(text, &check, st) : pv_status_set(st, PV_INTERNAL, "out of memory");
    pv_res_req_free(&check);
    free(text);
    if (rc != PV_OK) {
        json_decref(j);
        return rc;
    }
    *out = j;
    return PV_OK;
}

/* A port of a healthcheck: a decimal number 1..65535. */
static bool port_ok(const char *p) {
    if (empty(p) || strlen(p) > 5) return false;
    for (const char *c = p; *c; c++)
        if (*c < '0' || *c > '9') return false;
    long v = strtol(p, NULL, 10);
    return v >= 1 && v <= 65535;
}

/* Eru's healthcheck: what the node agent will check, so it must make sense now. */
static int check_healthcheck(const Pb__HealthCheckOptions *h, pv_status *st) {
    if (!h) return PV_OK;
    for (size_t i = 0; i < h->n_tcp_ports; i++)
        if (!port_ok(h->tcp_ports[i]))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "entrypoint.healthcheck.tcp_ports[%zu]: \"%s\" is not a port "
                                 "(1-65535)",
                                 i, h->tcp_ports[i] ? h->tcp_ports[i] : "");
    if (!empty(h->http_port) && !port_ok(h->http_port))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.healthcheck.http_port: \"%s\" is not a port (1-65535)",
                             h->http_port);
    if (!empty(h->url) && empty(h->http_port))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.healthcheck.url: \"%s\" needs http_port", h->url);
    if (!empty(h->url) && h->url[0] != '/')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.healthcheck.url: \"%s\" must start with '/'", h->url);
    if (!empty(h->url) && strpbrk(h->url, " \r\n"))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.healthcheck.url: \"%s\" has a space or a line break",
                             h->url);
    if (h->code != 0 && (h->code < 100 || h->code > 599))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.healthcheck.code: %d is not an HTTP status (100-599, or 0 "
                             "for any below 500)",
                             (int)h->code);
    return PV_OK;
}

int pv_deploy_check(const Pb__DeployOptions *o, pv_status *st) {
    if (empty(o->name)) return pv_status_set(st, PV_INVALID_ARGUMENT, "name: app name is empty");
    if (empty(o->podname))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "podname: pod name is empty");
    if (empty(o->image)) return pv_status_set(st, PV_INVALID_ARGUMENT, "image: image is empty");
    if (o->count <= 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "count: count is 0 (got %d)", (int)o->count);
    if (o->count > PV_DEPLOY_MAX_COUNT)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "count: %d is more than one deploy may ask for (%d)", (int)o->count,
                             PV_DEPLOY_MAX_COUNT);
    if (!o->entrypoint || empty(o->entrypoint->name))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "entrypoint.name: entrypoint name is empty");
    if (strchr(o->entrypoint->name, '_'))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.name: entrypoint name has '_' character (\"%s\")",
                             o->entrypoint->name);
    if (check_healthcheck(o->entrypoint->healthcheck, st) != PV_OK) return st->code;
    json_t *res = NULL;
    int rc = resources_object(o, &res, st);
    json_decref(res);
    return rc;
}

static int add_strings(json_t *arr, char **v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(arr, json_string(v[i])) != 0) return -1;
    return 0;
}

/* Every map<string,string> entry of core.proto is laid out as base, key, value. */
typedef struct str_entry {
    ProtobufCMessage base;
    char *key;
    char *value;
} str_entry;

static int add_labels(json_t *obj, void *const *entries, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const str_entry *e = entries[i];
        if (json_object_set_new(obj, e->key, json_string(e->value)) != 0) return -1;
    }
    return 0;
}

int pv_deploy_plan_body(const Pb__DeployOptions *o, const char *owner, char **body, pv_status *st) {
    *body = NULL;
    json_t *res = NULL;
    if (resources_object(o, &res, st) != PV_OK) return st->code;
    json_t *includes = json_array(), *excludes = json_array(), *labels = json_object();
    const Pb__NodeFilter *f = o->node_filter;
    int bad = !includes || !excludes || !labels ||
              add_strings(includes, o->nodenames, o->n_nodenames) != 0 ||
              (f && add_strings(includes, f->includes, f->n_includes) != 0) ||
              (f && add_strings(excludes, f->excludes, f->n_excludes) != 0) ||
              add_labels(labels, (void *const *)o->nodelabels, o->n_nodelabels) != 0 ||
              (f && add_labels(labels, (void *const *)f->labels, f->n_labels) != 0);
    json_t *j =
        bad ? NULL
            : json_pack("{s:s, s:O, s:O, s:O, s:b, s:O, s:i, s:i, s:i, s:s, s:s, s:s}", "pod",
                        o->podname ? o->podname : "", "includes", includes, "excludes", excludes,
                        "labels", labels, "all", f && f->all, "resources", res, "strategy",
                        (int)o->deploy_strategy, "count", (int)o->count, "nodes_limit",
                        (int)o->nodes_limit, "app", o->name ? o->name : "", "entrypoint",
                        o->entrypoint && o->entrypoint->name ? o->entrypoint->name : "", "owner",
                        owner ? owner : "");
    *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    json_decref(res);
    json_decref(includes);
    json_decref(excludes);
    json_decref(labels);
    if (!*body)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "labels or node names: not valid UTF-8");
    return PV_OK;
}
