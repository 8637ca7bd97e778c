/*
 * pv_deploy: DeployOptions checks and plan requests (see pv_deploy.h).
 *
 * Every check that does not depend on the node an instance lands on is made here, before the
 * deploy starts, so a bad request fails the whole call (1074) as Eru's does, instead of each
 * instance failing on its node after resources were reserved. What only a node can tell (whether
 * a user exists there, what its engine can apply) stays the node's.
 */
#include "pv_deploy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_image.h"
#include "pv_json.h"
#include "pv_pbmap.h"
#include "pv_res.h"
#include "pv_validate.h"

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
    char *text = pv_json_dumps(j, 0);
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

/* A relative path that stays inside the workload's root: no ".." component. */
static bool inside_root(const char *p) {
    while (*p) {
        while (*p == '/')
            p++;
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.') return false;
        p += len;
    }
    return true;
}

/* "80", "80/tcp", "53/udp", "132/sctp": what the engines publish. */
static bool publish_ok(const char *p) {
    char *end;
    errno = 0;
    long port = strtol(p, &end, 10);
    if (errno || end == p || *p == '-' || *p == '+' || port < 1 || port > 65535) return false;
    return *end == '\0' || strcmp(end, "/tcp") == 0 || strcmp(end, "/udp") == 0 ||
           strcmp(end, "/sctp") == 0;
}

/* Docker's log drivers, which Eru hands to the engine as they are; "" is the engine's default. */
static bool log_type_ok(const char *t) {
    static const char *const known[] = {"",         "none",    "local",     "json-file", "syslog",
                                        "journald", "gelf",    "fluentd",   "awslogs",   "splunk",
                                        "etwlogs",  "gcplogs", "logentries"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(t, known[i]) == 0) return true;
    return false;
}

static int bad(pv_status *st, const char *field, const char *value, const char *why) {
    char q[PV_QUOTE_BUF];
    pv_quote(value, q, sizeof q);
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s %s", field, q, why);
}

/* The entrypoint: Eru's name rule, then what every engine reads of it. */
static int check_entrypoint(const Pb__EntrypointOptions *e, pv_status *st) {
    if (!e || empty(e->name))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "entrypoint.name: entrypoint name is empty");
    if (strchr(e->name, '_'))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.name: entrypoint name has '_' character (\"%s\")",
                             e->name);
    if (pv_validate_name("entrypoint.name", e->name, st) != PV_OK) return st->code;
    if (!empty(e->dir) && (strlen(e->dir) > PATH_MAX || !inside_root(e->dir)))
        return bad(st, "entrypoint.dir", e->dir,
                   "must stay inside the workload's root (no \"..\")");
    if (!empty(e->restart) && strcmp(e->restart, "no") != 0 && strcmp(e->restart, "always") != 0 &&
        strcmp(e->restart, "on-failure") != 0)
        return bad(st, "entrypoint.restart", e->restart,
                   "is not a restart policy (\"no\", \"always\" or \"on-failure\")");
    for (size_t i = 0; i < e->n_publish; i++)
        if (!publish_ok(e->publish[i]))
            return bad(st, "entrypoint.publish", e->publish[i],
                       "is not \"port/proto\" (80, 80/tcp, 53/udp, 132/sctp)");
    if (e->log && !log_type_ok(e->log->type ? e->log->type : ""))
        return bad(st, "entrypoint.log.type", e->log->type,
                   "is not a log driver (none, local, json-file, syslog, journald, gelf, fluentd, "
                   "awslogs, splunk, etwlogs, gcplogs, logentries)");
    return check_healthcheck(e->healthcheck, st);
}

/* user: "name", "uid", "name:group" or "uid:gid"; whether they exist is the node's to say. */
static bool user_ok(const char *u) {
    size_t len = strlen(u), colon = strcspn(u, ":");
    if (len > 65 || colon == 0 || colon + 1 == len) return false;
    if (colon < len && strchr(u + colon + 1, ':')) return false;
    for (size_t i = 0; i < len; i++) {
        char c = u[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-' || (c == ':' && i == colon);
        if (!ok || (c == '-' && (i == 0 || i == colon + 1))) return false;
    }
    return true;
}

static bool ip_ok(const char *ip) {
    unsigned char buf[16];
    return inet_pton(AF_INET, ip, buf) == 1 || inet_pton(AF_INET6, ip, buf) == 1;
}

/* extra_hosts: Docker's "host:ip" (the address may be IPv6, so split at the first ':'). */
static bool extra_host_ok(const char *h) {
    size_t n = strcspn(h, ":");
    if (n == 0 || n > 253 || h[n] != ':') return false;
    for (size_t i = 0; i < n; i++)
        if (!((h[i] >= 'a' && h[i] <= 'z') || (h[i] >= 'A' && h[i] <= 'Z') ||
              (h[i] >= '0' && h[i] <= '9') || h[i] == '.' || h[i] == '-'))
            return false;
    return h[0] != '-' && ip_ok(h + n + 1);
}

/* What the deploy gives its instances' environment and the engine: user, env, dns, hosts, the
 * engine's raw arguments (a JSON object, as Eru's engines read them) and file modes. */
static int check_instance(const Pb__DeployOptions *o, pv_status *st) {
    if (!empty(o->user) && !user_ok(o->user))
        return bad(st, "user", o->user, "is not \"user\", \"uid\", \"user:group\" or \"uid:gid\"");
    for (size_t i = 0; i < o->n_env; i++)
        if (!o->env[i][0] || o->env[i][0] == '=' || !strchr(o->env[i], '='))
            return bad(st, "env", o->env[i], "is not KEY=VALUE");
    for (size_t i = 0; i < o->n_dns; i++)
        if (!ip_ok(o->dns[i])) return bad(st, "dns", o->dns[i], "is not an IPv4 or IPv6 address");
    for (size_t i = 0; i < o->n_extra_hosts; i++)
        if (!extra_host_ok(o->extra_hosts[i]))
            return bad(st, "extra_hosts", o->extra_hosts[i], "is not \"host:ip\"");
    if (o->raw_args.len > 0) {
        json_t *j = json_loadb((const char *)o->raw_args.data, o->raw_args.len, 0, NULL);
        bool ok = json_is_object(j);
        json_decref(j);
        if (!ok)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "raw_args: %zu bytes that are not a JSON object", o->raw_args.len);
    }
    for (size_t i = 0; i < o->n_modes; i++) {
        char field[PV_QUOTE_BUF + 16];
        char q[PV_QUOTE_BUF];
        pv_quote(o->modes[i]->key, q, sizeof q);
        snprintf(field, sizeof field, "modes[%s]", q);
        if (o->modes[i]->value &&
            pv_deploy_check_mode(field, o->modes[i]->value->mode, st) != PV_OK)
            return st->code;
    }
    return PV_OK;
}

int pv_deploy_check_mode(const char *field, int64_t mode, pv_status *st) {
    if (mode < 0 || mode > 07777)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "%s: %" PRId64 " (0%" PRIo64 ") is not a file mode (0 to 07777)",
                             field, mode, (uint64_t)mode);
    return PV_OK;
}

int pv_deploy_check_ha(const Pb__DeployOptions *o, pv_status *st) {
    for (size_t i = 0; i < o->n_labels; i++) {
        const pv_pbmap_entry *kv = (const pv_pbmap_entry *)o->labels[i];
        if (!kv->key || strcmp(kv->key, PV_HA_LABEL) != 0) continue;
        if (kv->value && strcmp(kv->value, PV_HA_RESTART) == 0) return PV_OK;
        char q[PV_QUOTE_BUF];
        pv_quote(kv->value ? kv->value : "", q, sizeof q);
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "labels[%s]: %s is not an HA policy (the one there is: %s)",
                             PV_HA_LABEL, q, PV_HA_RESTART);
    }
    return PV_OK;
}

int pv_deploy_check(const Pb__DeployOptions *o, pv_status *st) {
    if (pv_deploy_check_ha(o, st) != PV_OK) return st->code;
    if (empty(o->name)) return pv_status_set(st, PV_INVALID_ARGUMENT, "name: app name is empty");
    if (pv_validate_name("name", o->name, st) != PV_OK) return st->code;
    if (empty(o->podname))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "podname: pod name is empty");
    if (empty(o->image)) return pv_status_set(st, PV_INVALID_ARGUMENT, "image: image is empty");
    char *name = NULL, *tag = NULL;
    int rc = pv_image_parse(o->image, &name, &tag, st);
    free(name);
    free(tag);
    if (rc != PV_OK) return rc;
    if (o->count <= 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "count: count is 0 (got %d)", (int)o->count);
    if (o->count > PV_DEPLOY_MAX_COUNT)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "count: %d is more than one deploy may ask for (%d)", (int)o->count,
                             PV_DEPLOY_MAX_COUNT);
    if (o->nodes_limit < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "nodes_limit: %d is negative (0 is no limit)",
                             (int)o->nodes_limit);
    if (check_entrypoint(o->entrypoint, st) != PV_OK || check_instance(o, st) != PV_OK)
        return st->code;
    json_t *res = NULL;
    rc = resources_object(o, &res, st);
    json_decref(res);
    return rc;
}

static int add_strings(json_t *arr, char **v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(arr, json_string(v[i])) != 0) return -1;
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
              pv_pbmap_add(labels, (void *const *)o->nodelabels, o->n_nodelabels) != 0 ||
              (f && pv_pbmap_add(labels, (void *const *)f->labels, f->n_labels) != 0);
    json_t *j =
        bad ? NULL
            : json_pack("{s:s, s:O, s:O, s:O, s:b, s:O, s:i, s:i, s:i, s:s, s:s, s:s}", "pod",
                        o->podname ? o->podname : "", "includes", includes, "excludes", excludes,
                        "labels", labels, "all", f && f->all, "resources", res, "strategy",
                        (int)o->deploy_strategy, "count", (int)o->count, "nodes_limit",
                        (int)o->nodes_limit, "app", o->name ? o->name : "", "entrypoint",
                        o->entrypoint && o->entrypoint->name ? o->entrypoint->name : "", "owner",
                        owner ? owner : "");
    *body = j ? pv_json_dumps(j, 0) : NULL;
    json_decref(j);
    json_decref(res);
    json_decref(includes);
    json_decref(excludes);
    json_decref(labels);
    if (!*body)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "labels or node names: not valid UTF-8");
    return PV_OK;
}
