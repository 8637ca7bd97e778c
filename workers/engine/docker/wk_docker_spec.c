/*
 * wk_docker_spec: the body of POST /containers/create for a workload spec, as Eru's docker
 * engine makes it (see wk_engine_docker.h for what goes where).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_engine_docker.h"

#define MIN_MEMORY (4LL << 20)

static json_t *strings(const char *const *v, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_string(v[i] ? v[i] : ""));
    return a;
}

/* cpumem as Eru's makeResourceSetting: a quota of cpu_limit cores (NanoCpus), or the bound
 * cores without one; memory hard, its swap the same, half of it reserved. */
static void resources(const wk_workload_spec *s, json_t *host) {
    if (s->ncpuset > 0) {
        char cpus[4096] = "";
        for (size_t i = 0; i < s->ncpuset; i++) {
            size_t used = strlen(cpus);
            snprintf(cpus + used, sizeof cpus - used, "%s%d", i ? "," : "", s->cpuset[i]);
        }
        json_object_set_new(host, "CpusetCpus", json_string(cpus));
    } else if (s->cpu_limit > 0) {
        json_object_set_new(host, "NanoCpus", json_integer((json_int_t)(s->cpu_limit * 1e9)));
    }
    if (s->memory_limit > 0) {
        json_int_t reserve = s->memory_limit / 2 < MIN_MEMORY ? MIN_MEMORY : s->memory_limit / 2;
        json_object_set_new(host, "Memory", json_integer(s->memory_limit));
        json_object_set_new(host, "MemorySwap", json_integer(s->memory_limit));
        json_object_set_new(host, "MemoryReservation", json_integer(reserve));
    }
}

/* Eru's restart: "policy[:retries]". */
static int restart_policy(const char *restart, json_t *host, pv_status *st) {
    char name[32] = "";
    int retries = 0;
    const char *colon = strchr(restart, ':');
    size_t n = colon ? (size_t)(colon - restart) : strlen(restart);
    if (n >= sizeof name)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.restart: \"%.40s\" is not a "
                             "restart policy",
                             restart);
    memcpy(name, restart, n);
    name[n] = '\0';
    if (colon) retries = atoi(colon + 1);
    if (*name && strcmp(name, "no") != 0 && strcmp(name, "always") != 0 &&
        strcmp(name, "on-failure") != 0 && strcmp(name, "unless-stopped") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "entrypoint.restart: \"%s\" is not no, always, on-failure or "
                             "unless-stopped",
                             name);
    json_object_set_new(host, "RestartPolicy",
                        json_pack("{s:s, s:i}", "Name", name, "MaximumRetryCount", retries));
    return PV_OK;
}

/* publish: "port[/proto]" each bound to the same port of the node, and exposed. */
static void ports(const wk_workload_spec *s, json_t *config, json_t *host) {
    if (s->npublish == 0) return;
    json_t *exposed = json_object(), *bindings = json_object();
    for (size_t i = 0; i < s->npublish; i++) {
        char port[64];
        snprintf(port, sizeof port, "%s%s", s->publish[i],
                 strchr(s->publish[i], '/') ? "" : "/tcp");
        char host_port[64];
        snprintf(host_port, sizeof host_port, "%.*s", (int)strcspn(port, "/"), port);
        json_object_set_new(exposed, port, json_object());
        json_object_set_new(bindings, port, json_pack("[{s:s}]", "HostPort", host_port));
    }
    json_object_set_new(config, "ExposedPorts", exposed);
    json_object_set_new(host, "PortBindings", bindings);
}

/* Eru's RawArgs, each key to its HostConfig field. */
static int raw_args(const wk_workload_spec *s, json_t *host, pv_status *st) {
    if (!s->raw_args || s->raw_args_len == 0) return PV_OK;
    json_error_t e;
    json_t *raw = json_loadb(s->raw_args, s->raw_args_len, 0, &e);
    if (!json_is_object(raw)) {
        json_decref(raw);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "raw_args: not a JSON object (%s)",
                             raw ? "another JSON value" : e.text);
    }
    static const struct {
        const char *raw, *field;
        json_type type;
    } keys[] = {{"pid_mod", "PidMode", JSON_STRING}, {"storage_opt", "StorageOpt", JSON_OBJECT},
                {"cap_add", "CapAdd", JSON_ARRAY},   {"cap_drop", "CapDrop", JSON_ARRAY},
                {"ulimits", "Ulimits", JSON_ARRAY},  {"runtime", "Runtime", JSON_STRING}};
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(raw, keys[i].raw);
        if (!v || json_is_null(v)) continue;
        if (json_typeof(v) != keys[i].type) {
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "raw_args.%s: wrong type", keys[i].raw);
            break;
        }
        if (strcmp(keys[i].raw, "ulimits") == 0) { /* Eru: {"name","soft","hard"} */
            json_t *out = json_array(), *u;
            size_t j;
            json_array_foreach(v, j, u) {
                json_array_append_new(
                    out, json_pack("{s:O?, s:O?, s:O?}", "Name", json_object_get(u, "name"), "Soft",
                                   json_object_get(u, "soft"), "Hard", json_object_get(u, "hard")));
            }
            json_object_set_new(host, "Ulimits", out);
        } else if (strcmp(keys[i].raw, "cap_add") == 0) {
            json_t *caps = json_object_get(host, "CapAdd");
            json_array_extend(caps, v);
        } else {
            json_object_set(host, keys[i].field, v);
        }
    }
    json_decref(raw);
    return rc;
}

/* networks: the first one is the network mode, each an endpoint (with its IPv4 when given). */
static int networks(const wk_workload_spec *s, json_t *body, json_t *host, pv_status *st) {
    if (!s->networks_json || !*s->networks_json) return PV_OK;
    json_t *nets = json_loads(s->networks_json, 0, NULL);
    if (!json_is_object(nets)) {
        json_decref(nets);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "networks: not a JSON object");
    }
    json_t *endpoints = json_object();
    const char *name;
    json_t *ip;
    json_object_foreach(nets, name, ip) {
        if (!json_object_get(host, "NetworkMode"))
            json_object_set_new(host, "NetworkMode", json_string(name));
        const char *v4 = json_string_value(ip);
        json_object_set_new(endpoints, name,
                            v4 && *v4 && strcmp(name, "host") != 0
                                ? json_pack("{s:{s:s}}", "IPAMConfig", "IPv4Address", v4)
                                : json_object());
    }
    json_object_set_new(body, "NetworkingConfig", json_pack("{s:o}", "EndpointsConfig", endpoints));
    json_decref(nets);
    return PV_OK;
}

static json_t *labels(const wk_workload_spec *s) {
    json_t *l = s->labels_json ? json_loads(s->labels_json, 0, NULL) : NULL;
    if (!json_is_object(l)) {
        json_decref(l);
        l = json_object();
    }
    json_object_set_new(l, WK_DOCKER_ID_LABEL, json_string(s->id));
    if (s->nafter_start || s->nbefore_stop) { /* run by start and stop, whoever created it */
        json_t *hooks =
            json_pack("{s:o, s:o}", "after_start", strings(s->after_start, s->nafter_start),
                      "before_stop", strings(s->before_stop, s->nbefore_stop));
        char *text = hooks ? json_dumps(hooks, JSON_COMPACT) : NULL;
        json_decref(hooks);
        if (text) json_object_set_new(l, WK_DOCKER_HOOKS_LABEL, json_string(text));
        free(text);
    }
    return l;
}

static json_t *sysctls(const wk_workload_spec *s) {
    json_t *o = json_object();
    for (size_t i = 0; o && i < s->nsysctls; i++) {
        const char *eq = strchr(s->sysctls[i], '=');
        if (!eq) continue;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - s->sysctls[i]), s->sysctls[i]);
        json_object_set_new(o, key, json_string(eq + 1));
    }
    return o;
}

json_t *wk_docker_create_body(const wk_docker *d, const wk_workload_spec *s, pv_status *st) {
    const char *user = s->privileged ? "root" : (s->user ? s->user : "");
    json_t *host =
        json_pack("{s:b, s:b, s:o, s:o, s:o, s:o, s:o}", "Init", 1, "Privileged", s->privileged,
                  "CapAdd", s->privileged ? json_pack("[s]", "SYS_ADMIN") : json_array(), "Binds",
                  strings(s->volumes, s->nvolumes), "Dns", strings(s->dns, s->ndns), "ExtraHosts",
                  strings(s->extra_hosts, s->nextra_hosts), "Sysctls", sysctls(s));
    json_t *body = json_pack(
        "{s:s, s:o, s:o, s:s, s:s, s:o, s:i}", "Image", s->image ? s->image : "", "Cmd",
        strings(s->commands, s->ncommands), "Env", strings(s->env, s->nenv), "User", user,
        "WorkingDir", s->dir ? s->dir : "", "Labels", labels(s), "StopTimeout", d->grace_seconds);
    if (!host || !body) {
        json_decref(host);
        json_decref(body);
        pv_status_set(st, PV_INTERNAL, "out of memory");
        return NULL;
    }
    resources(s, host);
    ports(s, body, host);
    int rc = restart_policy(s->restart ? s->restart : "", host, st);
    if (rc == PV_OK) rc = raw_args(s, host, st);
    if (rc == PV_OK) rc = networks(s, body, host, st);
    json_object_set_new(body, "HostConfig", host);
    if (rc != PV_OK) {
        json_decref(body);
        return NULL;
    }
    return body;
}
