/*
 * wk_node_deploy: a node agent's instances of a deploy (see wk_node_deploy.h).
 *
 * Each instance is one journaled step whose result is the instance's answer ({"id", "name",
 * "publish"} or {"error"}); the engine calls and the record inside it are made idempotent by the
 * derived workload id: create on an existing id is taken as done, a recorded workload likewise.
 */
#include "wk_node_deploy.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_id.h"
#include "pv_json.h"
#include "pv_log.h"
#include "pv_mem.h"
#include "pv_pbmap.h"
#include "pv_strv.h"
#include "pv_res.h"
#include "pv_storage.h"
#include "pv_time.h"
#include "pv_resv.h"
#include "pv_workload.h"
#include "wk_agent.h"
#include "wk_engine.h"
#include "wk_fence.h"
#include "wk_files.h"

/* The most allocations of a one-node deploy whose last instance still ends the reservation
 * itself (its call names all the others); a bigger one leaves it to the release. */
#define MAX_RESV_OTHERS 256

typedef struct instance {
    wk_op *op;
    wk_agent *agent;
    const Pb__DeployOptions *o;
    const char *pod, *node;
    json_t *alloc; /* {"id", "seq", "resources"} */
    /* ReplaceWorkload: the resources are the old workload's, not a reservation's allocation to
     * take over; before_start copies files from the old one into the new root. */
    bool keep_resources;
    int (*before_start)(const struct instance *in, const char *new_id, const char *new_root,
                        pv_status *st);
    const char *old_id, *old_root; /* roots NULL: the engine's files (docker) */
    json_t *copy;
    /* a failover's next incarnation (wk_ha.h): this id at this epoch, not a new workload */
    const char *inc_id;
    int64_t inc_epoch;
    /* the last instance of a one-node deploy whose others all succeeded: the reservation it
     * ends with its record when their allocations are gone too (pv_workload_add_ending) */
    const char *end_resv;
    const char *const *resv_others;
    size_t nresv_others;
    bool *resv_ended;
} instance;

/* The argv of the main process: entrypoint.commands, else the older single string (with
 * extra_args) split on blanks, as Eru does without a shell. */
static int build_commands(const Pb__DeployOptions *o, pv_strv *argv) {
    const Pb__EntrypointOptions *e = o->entrypoint;
    for (size_t i = 0; i < e->n_commands; i++)
        if (pv_strv_take(argv, strdup(e->commands[i])) != 0) return -1;
    if (argv->n > 0) return 0;
    char *line = NULL;
    if (asprintf(&line, "%s %s", e->command ? e->command : "", o->extra_args ? o->extra_args : "") <
        0)
        return -1;
    char *save = NULL;
    for (char *tok = strtok_r(line, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
        if (pv_strv_take(argv, strdup(tok)) != 0) {
            free(line);
            return -1;
        }
    free(line);
    return 0;
}

/* Labels: the deploy's, then Eru's own. */
static char *build_labels(const instance *in) {
    json_t *l = json_object();
    if (l) pv_pbmap_add(l, (void *const *)in->o->labels, in->o->n_labels);
    json_t *publish = json_array();
    for (size_t i = 0; publish && i < in->o->entrypoint->n_publish; i++)
        json_array_append_new(publish, json_string(in->o->entrypoint->publish[i]));
    json_t *meta = json_pack("{s:o}", "publish", publish ? publish : json_array());
    /* Eru keeps the healthcheck in ERU_META too: the node agent's status reporter reads it
     * there (wk_health) */
    const Pb__HealthCheckOptions *hc = in->o->entrypoint->healthcheck;
    if (meta && hc && (hc->n_tcp_ports || (hc->http_port && *hc->http_port))) {
        json_t *ports = json_array();
        for (size_t i = 0; ports && i < hc->n_tcp_ports; i++)
            json_array_append_new(ports, json_string(hc->tcp_ports[i]));
        json_object_set_new(meta, "healthcheck",
                            json_pack("{s:o, s:s, s:s, s:i}", "tcp_ports",
                                      ports ? ports : json_array(), "http_port",
                                      hc->http_port ? hc->http_port : "", "url",
                                      hc->url ? hc->url : "", "code", (int)hc->code));
    }
    char *meta_text = meta ? json_dumps(meta, JSON_COMPACT) : NULL;
    json_decref(meta);
    if (l) {
        json_object_set_new(l, "ERU", json_string("1"));
        json_object_set_new(l, "ERU_META", json_string(meta_text ? meta_text : "{}"));
        json_object_set_new(l, "eru.nodename", json_string(in->node));
        json_object_set_new(l, "eru.coreid", json_string("pivirt"));
    }
    free(meta_text);
    char *text = l ? json_dumps(l, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(l);
    return text;
}

/* Limits from the allocation's cpumem document: cpu_limit, memory_limit, the bound cores. */
static void limits_of(json_t *resources, wk_workload_spec *spec, int *cores, size_t max) {
    json_t *cm = json_object_get(resources, "cpumem");
    spec->cpu_limit = json_number_value(json_object_get(cm, "cpu_limit"));
    spec->memory_limit = (int64_t)json_integer_value(json_object_get(cm, "memory_limit"));
    const char *core;
    json_t *pieces;
    spec->ncpuset = 0;
    json_object_foreach(json_object_get(cm, "cpu_map"), core, pieces) {
        if (spec->ncpuset < max) cores[spec->ncpuset++] = atoi(core);
    }
    spec->cpuset = spec->ncpuset ? cores : NULL;
}

static char *answer_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *answer_error(const char *fmt, ...) {
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if (n < 0) return NULL;
    json_t *j = json_pack("{s:s}", "error", msg);
    free(msg);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

/* DeployOptions.data: files written into the new workload's root before it starts, with
 * modes (default 0755, as Send) and owners. */
static int deploy_files(const Pb__DeployOptions *o, wk_engine *engine, const char *id,
                        const char *root, pv_status *st) {
    for (size_t i = 0; i < o->n_data; i++) {
        const Pb__DeployOptions__DataEntry *d = o->data[i];
        int mode = 0755, uid = -1, gid = -1;
        for (size_t j = 0; j < o->n_modes; j++)
            if (strcmp(o->modes[j]->key, d->key) == 0 && o->modes[j]->value)
                mode = (int)o->modes[j]->value->mode;
        for (size_t j = 0; j < o->n_owners; j++)
            if (strcmp(o->owners[j]->key, d->key) == 0 && o->owners[j]->value) {
                uid = o->owners[j]->value->uid;
                gid = o->owners[j]->value->gid;
            }
        const void *data = d->value.data ? (const void *)d->value.data : "";
        int rc =
            root ? wk_files_put(root, d->key, data, d->value.len, mode, uid, gid, st)
                 : wk_engine_put_file(engine, id, d->key, data, d->value.len, mode, uid, gid, st);
        if (rc != PV_OK) return pv_status_prefix(st, "data[%s]", d->key);
    }
    return PV_OK;
}

/* DeployOptions.after_create: each command run (sh -c) in the started workload; a failing one
 * fails the instance, as Eru's does. */
static int after_create(wk_engine *engine, const Pb__DeployOptions *o, const char *id,
                        pv_status *st) {
    for (size_t i = 0; i < o->n_after_create; i++) {
        const char *argv[] = {"/bin/sh", "-c", o->after_create[i]};
        int code = -1;
        char *out = NULL;
        size_t len = 0;
        if (wk_engine_exec(engine, id, argv, 3, 60000, &code, &out, &len, st) != PV_OK)
            return pv_status_prefix(st, "after_create[%zu]", i);
        free(out);
        if (code != 0)
            return pv_status_set(st, PV_FAILED_PRECONDITION,
                                 "after_create[%zu] \"%s\" exited with %d", i, o->after_create[i],
                                 code);
    }
    return PV_OK;
}

/* The engine's volumes of an instance, from the deploy's storage request: each binding
 * src:dst[:flags][:size], an AUTO source replaced by the host volume the reservation planned for
 * it. The process engine takes "src:dst:flags" (a link into the host's tree); the virt engine
 * disk images: an absolute path as it is, anything else a StorageService volume (id or name) on
 * this node's pools, attached to workload id (IN_USE until it is removed). An answer for the
 * client (a volume that cannot be used) comes back in *why, with PV_OK. */
static int instance_volumes(const instance *in, json_t *resources, const char *id, pv_strv *out,
                            char *why, size_t why_cap, pv_status *st) {
    why[0] = '\0';
    const Pb__DeployOptions *o = in->o;
    const char *json = NULL;
    size_t len = 0;
    for (size_t i = 0; i < o->n_resources; i++)
        if (o->resources[i]->key && strcmp(o->resources[i]->key, "storage") == 0) {
            json = (const char *)o->resources[i]->value.data;
            len = o->resources[i]->value.len;
        }
    if (!json || len == 0) return PV_OK;
    pv_res_storage_req req = {0};
    if (pv_res_storage_req_parse(json, len, &req, st) != PV_OK) return st->code;
    json_t *plan = json_object_get(json_object_get(resources, "storage"), "volume_plan");
    bool virt = strcmp(wk_engine_type(wk_agent_engine(in->agent)), "virt") == 0;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && !why[0] && i < req.nvolumes; i++) {
        const pv_res_binding *b = &req.volumes[i];
        size_t n = strlen(b->src);
        char src[4096];
        snprintf(src, sizeof src, "%s", b->src);
        if (n == 0 || (n >= 4 && strcmp(b->src + n - 4, "AUTO") == 0)) {
            char key[4096];
            snprintf(key, sizeof key, "%s:%s:%s:%lld", b->src, b->dst, b->flags,
                     (long long)b->size);
            const char *host = NULL;
            json_t *v;
            json_object_foreach(json_object_get(plan, key), host, v) break;
            if (!host) {
                snprintf(why, why_cap, "volumes[%zu] %.200s: the reservation planned no volume", i,
                         key);
                break;
            }
            snprintf(src, sizeof src, "%s", host);
        }
        if (!virt) {
            char *spec = NULL;
            /* the plugin keeps flags as sorted letters ("or" for ro): without 'w' it is ro */
            const char *mode = strchr(b->flags, 'w') ? "rw" : "ro";
            rc = asprintf(&spec, "%s:%s:%s", src, b->dst, mode) >= 0 && pv_strv_take(out, spec) == 0
                     ? PV_OK
                     : pv_status_set(st, PV_INTERNAL, "out of memory");
            continue;
        }
        if (src[0] == '/') {
            rc = pv_strv_take(out, strdup(src)) == 0
                     ? PV_OK
                     : pv_status_set(st, PV_INTERNAL, "out of memory");
            continue;
        }
        pv_volume vol = {0};
        pv_pool pool = {0};
        pv_status vst;
        int vrc = pv_storage_find_volume(wk_op_redis(in->op), wk_op_keys(in->op), src, &vol, &vst);
        if (vrc == PV_OK)
            vrc = pv_storage_get(wk_op_redis(in->op), wk_op_keys(in->op), PV_STO_POOL, vol.pool,
                                 &pool, &vst);
        const char *pool_node = pool.node;
        if (vrc == PV_OK && (!pool_node || strcmp(pool_node, in->node) != 0))
            vrc = pv_status_set(&vst, PV_FAILED_PRECONDITION,
                                "volume %s is in pool %s on node %s, not on %s", src, vol.pool,
                                pool_node ? pool_node : "?", in->node);
        if (vrc == PV_OK)
            vrc = pv_storage_attach(wk_op_redis(in->op), wk_op_keys(in->op), vol.id, id, &vst);
        if (vrc == PV_OK)
            rc = pv_strv_take(out, strdup(vol.path ? vol.path : "")) == 0
                     ? PV_OK
                     : pv_status_set(st, PV_INTERNAL, "out of memory");
        else if (vrc == PV_UNAVAILABLE)
            rc = pv_status_set(st, vrc, "%s", vst.msg);
        else
            snprintf(why, why_cap, "volumes[%zu] %.200s: %.250s", i, src, vst.msg);
        pv_storage_free(PV_STO_VOL, &vol);
        pv_storage_free(PV_STO_POOL, &pool);
    }
    pv_res_storage_req_free(&req);
    return rc;
}

/* What one instance is made of, built from the deploy's options: the engine's spec and the
 * strings it points into (owned here, freed by build_free). */
typedef struct build {
    char id[65], name[256];
    pv_strv argv, env, sysctls, vols;
    char *labels, *res_text, *env_text, *networks;
    char *engine_labels; /* an incarnation's: labels plus its epoch (wk_fence.h) */
    int cores[1024];
    wk_workload_spec spec;
} build;

static void build_free(build *b) {
    pv_strv_free(&b->argv);
    pv_strv_free(&b->env);
    pv_strv_free(&b->sysctls);
    pv_strv_free(&b->vols);
    free(b->labels);
    free(b->engine_labels);
    free(b->res_text);
    free(b->env_text);
    free(b->networks);
}

/* The instance's id (from its allocation: a redelivery finds the same one) and its Eru name
 * app_entry_xxxxxx. */
static void build_names(const instance *in, const char *alloc_id, build *b) {
    if (in->inc_id)
        snprintf(b->id, sizeof b->id, "%s", in->inc_id);
    else
        pv_sha256_hex(alloc_id, strlen(alloc_id), b->id);
    char letters[7];
    for (int i = 0; i < 6; i++)
        letters[i] = (char)('a' + (b->id[i] % 26));
    letters[6] = '\0';
    snprintf(b->name, sizeof b->name, "%s_%s_%s", in->o->name, in->o->entrypoint->name, letters);
}

/* The environment: Eru's own variables, then the deploy's; as a list and as JSON text. */
static int build_env(const instance *in, build *b) {
    const Pb__DeployOptions *o = in->o;
    char seq[24];
    snprintf(seq, sizeof seq, "%lld",
             (long long)json_integer_value(json_object_get(in->alloc, "seq")));
    if (pv_strv_addf(&b->env, "APP_NAME=%s%s", o->name, "") != 0 ||
        pv_strv_addf(&b->env, "ERU_POD=%s%s", in->pod, "") != 0 ||
        pv_strv_addf(&b->env, "ERU_NODE_NAME=%s%s", in->node, "") != 0 ||
        pv_strv_addf(&b->env, "ERU_WORKLOAD_SEQ=%s%s", seq, "") != 0)
        return -1;
    for (size_t i = 0; i < o->n_env; i++)
        if (pv_strv_take(&b->env, strdup(o->env[i])) != 0) return -1;
    json_t *env_j = json_array();
    for (size_t i = 0; env_j && i < b->env.n; i++)
        json_array_append_new(env_j, json_string(b->env.v[i]));
    b->env_text = env_j ? json_dumps(env_j, JSON_COMPACT) : NULL;
    json_decref(env_j);
    return b->env_text ? 0 : -1;
}

/* Everything of the spec but its volumes; -1 when memory ran out. */
static int build_spec(const instance *in, json_t *resources, build *b) {
    const Pb__DeployOptions *o = in->o;
    const Pb__EntrypointOptions *e = o->entrypoint;
    b->labels = build_labels(in);
    b->res_text = resources ? pv_json_dumps(resources, 0) : strdup("{}");
    if (!b->labels || !b->res_text || build_commands(o, &b->argv) != 0 || build_env(in, b) != 0)
        return -1;
    for (size_t i = 0; i < e->n_sysctls; i++) {
        const pv_pbmap_entry *kv = (const pv_pbmap_entry *)e->sysctls[i];
        if (pv_strv_addf(&b->sysctls, "%s=%s", kv->key, kv->value) != 0) return -1;
    }
    bool hooks = !o->ignore_hook && e->hook;
    b->spec = (wk_workload_spec){
        .id = b->id,
        .name = b->name,
        .image = o->image,
        .commands = (const char *const *)b->argv.v,
        .ncommands = b->argv.n,
        .dir = e->dir ? e->dir : "",
        .user = o->user ? o->user : "",
        .restart = e->restart ? e->restart : "",
        .privileged = e->privileged,
        .env = (const char *const *)b->env.v,
        .nenv = b->env.n,
        .publish = (const char *const *)e->publish,
        .npublish = e->n_publish,
        .after_start = hooks ? (const char *const *)e->hook->after_start : NULL,
        .nafter_start = hooks ? e->hook->n_after_start : 0,
        .before_stop = hooks ? (const char *const *)e->hook->before_stop : NULL,
        .nbefore_stop = hooks ? e->hook->n_before_stop : 0,
        .sysctls = (const char *const *)b->sysctls.v,
        .nsysctls = b->sysctls.n,
        .labels_json = b->labels,
        .raw_args = (const char *)o->raw_args.data,
        .raw_args_len = o->raw_args.len,
        .dns = (const char *const *)o->dns,
        .ndns = o->n_dns,
        .extra_hosts = (const char *const *)o->extra_hosts,
        .nextra_hosts = o->n_extra_hosts,
    };
    if (in->inc_id) {
        json_t *l = json_loads(b->labels, 0, NULL);
        char epoch[24];
        snprintf(epoch, sizeof epoch, "%lld", (long long)in->inc_epoch);
        if (l) json_object_set_new(l, WK_EPOCH_LABEL, json_string(epoch));
        b->engine_labels = l ? json_dumps(l, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(l);
        if (!b->engine_labels) return -1;
        b->spec.labels_json = b->engine_labels;
    }
    if (o->n_networks > 0) { /* the docker engine's networks to join: {"name": "ipv4"} */
        json_t *nets = json_object();
        if (nets) pv_pbmap_add(nets, (void *const *)o->networks, o->n_networks);
        b->networks = nets ? json_dumps(nets, JSON_COMPACT) : NULL;
        json_decref(nets);
        if (!b->networks) return -1;
        b->spec.networks_json = b->networks;
    }
    limits_of(resources, &b->spec, b->cores, sizeof b->cores / sizeof b->cores[0]);
    return 0;
}

/* What this node's engine refuses of the options, as an instance's error answer; NULL when
 * nothing is refused. */
static char *refused_options(const instance *in, const build *b, wk_engine *engine) {
    const Pb__DeployOptions *o = in->o;
    if (b->argv.n == 0)
        return answer_error("entrypoint %s of %s: no command to run", o->entrypoint->name, o->name);
    bool docker = strcmp(wk_engine_type(engine), "docker") == 0;
    if (o->raw_args.len > 0 && strcmp(wk_engine_type(engine), "process") == 0)
        return answer_error("raw_args: the %s engine takes no raw engine arguments%s",
                            wk_engine_type(engine), "");
    if (!docker &&
        (o->n_dns > 0 || o->n_extra_hosts > 0)) /* process workloads share the host's network and
                                      files; a domain's resolver is its guest's own */
        return answer_error("%s: the %s engine cannot set a workload's %s (\"%s\")",
                            o->n_dns ? "dns" : "extra_hosts", wk_engine_type(engine),
                            o->n_dns ? "name servers" : "hosts file",
                            o->n_dns ? o->dns[0] : o->extra_hosts[0]);
    return NULL;
}

/* Whether an engine call's failure is handed back to the operation machinery (a transient
 * code: retried later, the redelivery finding what this one did) rather than answered: the
 * virt engine's UNAVAILABLE, libvirtd away for longer than the engine waits for it (restarted,
 * upgraded: it comes back). A docker daemon that does not answer is the node's fault instead:
 * the node goes NOT_READY and its calls fail fast naming the daemon (test_docker_tcp). */
static bool retried_later(wk_engine *e, int rc) {
    return rc == PV_UNAVAILABLE && strcmp(wk_engine_type(e), "virt") == 0;
}

/* An incarnation lands where an older one of the same workload was left (this node was lost
 * with it, and is back): the old one goes first. */
static void drop_stale_instance(wk_engine *engine, const char *id, int64_t epoch) {
    wk_engine_info old = {0};
    pv_status st;
    if (wk_engine_inspect(engine, id, &old, &st) == PV_OK &&
        wk_fence_epoch_of(old.labels_json) != epoch) {
        wk_engine_stop(engine, id, 0, true, &st);
        if (wk_engine_remove(engine, id, true, &st) == PV_OK)
            pv_info("workload %s: an older incarnation was still here; removed", id);
    }
    wk_engine_info_clear(&old);
}

/* Creates (or finds, on a redelivery) and starts the instance in the engine: its files, the
 * hook before start, the after-create commands; *info as the engine sees it at the end. */
static int start_instance(const instance *in, const build *b, wk_engine *engine,
                          wk_engine_info *info, pv_status *st) {
    const char *id = b->id;
    if (in->inc_id) drop_stale_instance(engine, id, in->inc_epoch);
    int rc = wk_engine_create(engine, &b->spec, info, st);
    if (rc == PV_ALREADY_EXISTS) {
        /* a redelivery finds its own instance; none of this id: the create's answer says what
         * was in the way (a name taken), not the lookup's */
        pv_status cst = *st;
        rc = wk_engine_inspect(engine, id, info, st);
        if (rc == PV_NOT_FOUND) {
            *st = cst;
            rc = PV_ALREADY_EXISTS;
        }
    }
    bool fresh = rc == PV_OK && info->state != WK_STATE_RUNNING;
    if (fresh && (info->root || in->o->n_data > 0))
        rc = deploy_files(in->o, engine, id, info->root, st);
    bool files = info->root || strcmp(wk_engine_type(engine), "docker") == 0;
    if (rc == PV_OK && fresh && in->before_start && files)
        rc = in->before_start(in, id, info->root, st);
    if (rc == PV_OK && fresh) rc = wk_engine_start(engine, id, st);
    /* a guest agent that does not answer fails the instance (not a passing fault to retry) */
    if (rc == PV_OK && in->o->n_after_create > 0 &&
        (rc = after_create(engine, in->o, id, st)) == PV_UNAVAILABLE)
        rc = PV_FAILED_PRECONDITION;
    if (rc == PV_OK) {
        wk_engine_info_clear(info);
        rc = wk_engine_inspect(engine, id, info, st);
    }
    return rc;
}

/* The instance's record in the registry (a redelivery finds it recorded). */
static int record_instance(const instance *in, const build *b, const char *alloc_id,
                           const wk_engine_info *info, pv_status *st) {
    pv_workload w = {0};
    snprintf(w.id, sizeof w.id, "%s", b->id);
    w.name = (char *)b->name;
    w.app = in->o->name;
    w.entry = in->o->entrypoint->name;
    w.pod = (char *)in->pod;
    w.node = (char *)in->node;
    w.image = in->o->image;
    w.privileged = in->o->entrypoint->privileged;
    w.labels = b->labels;
    w.env = b->env_text;
    w.resources = b->res_text;
    w.alloc_id = in->keep_resources ? "" : (char *)alloc_id;
    w.engine_id = info->engine_id ? info->engine_id : "";
    w.deploy = wk_op_param(in->op, "deploy");
    if (in->inc_id)
        return pv_resv_reincarnate_workload(wk_op_redis(in->op), wk_op_keys(in->op), b->id,
                                            in->node, in->inc_epoch, alloc_id, w.engine_id,
                                            b->labels, st);
    /* kept resources take no allocation over: nothing of a reservation to end */
    int rc = pv_workload_add_ending(wk_op_redis(in->op), wk_op_keys(in->op), &w,
                                    in->keep_resources ? NULL : in->end_resv, in->resv_others,
                                    in->nresv_others, in->resv_ended, st);
    return rc == PV_ALREADY_EXISTS ? PV_OK : rc;
}

/* A created instance's answer: {id, name, publish}, publish in Eru's shape ("port/proto" ->
 * "ip:port,ip:port"). */
static char *created_answer(const build *b, const wk_engine_info *info) {
    json_t *pub = json_loads(info->publish_json ? info->publish_json : "{}", 0, NULL);
    json_t *flat = json_object();
    const char *port;
    json_t *addrs;
    json_object_foreach(pub, port, addrs) {
        char joined[1024] = "";
        size_t i;
        json_t *a;
        json_array_foreach(addrs, i, a) {
            if (i) strncat(joined, ",", sizeof joined - strlen(joined) - 1);
            strncat(joined, json_string_value(a) ? json_string_value(a) : "",
                    sizeof joined - strlen(joined) - 1);
        }
        json_object_set_new(flat, port, json_string(joined));
    }
    json_t *j = json_pack("{s:s, s:s, s:o}", "id", b->id, "name", b->name, "publish", flat);
    char *answer = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    json_decref(pub);
    return answer;
}

/* Creates, starts and records one instance; the answer is the step's result: the instance's
 * {id, name, publish}, or {error} for an instance that failed (which then holds nothing: its
 * engine workload is removed, its volumes detached). */
static int step_instance(wk_op *op, void *arg, char **result, pv_status *st) {
    instance *in = arg;
    wk_engine *engine = wk_agent_engine(in->agent);
    const char *alloc_id = json_string_value(json_object_get(in->alloc, "id"));
    json_t *resources = json_object_get(in->alloc, "resources");
    build b = {0};
    build_names(in, alloc_id, &b);
    if (build_spec(in, resources, &b) != 0) {
        build_free(&b);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    char why[PV_STATUS_MSG_MAX] = "";
    int rc = instance_volumes(in, resources, b.id, &b.vols, why, sizeof why, st);
    if (rc != PV_OK) {
        build_free(&b);
        return rc;
    }
    b.spec.volumes = (const char *const *)b.vols.v;
    b.spec.nvolumes = b.vols.n;
    char *answer = why[0] ? answer_error("%s%s", why, "") : refused_options(in, &b, engine);
    bool failed = answer != NULL;
    if (!answer) {
        wk_engine_info info = {0};
        pv_status est;
        int crc = start_instance(in, &b, engine, &info, &est);
        if (crc == PV_OK) wk_fence_refresh(wk_agent_fence(in->agent));
        if (crc == PV_OK) crc = record_instance(in, &b, alloc_id, &info, &est);
        if (crc == PV_OK) {
            answer = created_answer(&b, &info);
        } else if (retried_later(engine, crc)) { /* a create finds its domain again */
            pv_warn("deploy %s on %s: instance %s: %s (retried later)", wk_op_record(op)->id,
                    in->node, b.name, est.msg);
            wk_engine_info_clear(&info);
            build_free(&b);
            return pv_status_set(st, crc, "%s", est.msg);
        } else {
            pv_warn("deploy %s on %s: instance %s failed: %s", wk_op_record(op)->id, in->node,
                    b.name, est.msg);
            pv_status rst;
            wk_engine_remove(engine, b.id, true, &rst);
            answer = answer_error("%s%s", est.msg, "");
            failed = true;
        }
        wk_engine_info_clear(&info);
    }
    if (failed) { /* a failed instance holds no volume */
        pv_status dst;
        if (pv_storage_detach_all(wk_op_redis(op), wk_op_keys(op), b.id, &dst) != PV_OK)
            pv_warn("instance %s: volumes not detached: %s", b.id, dst.msg);
    }
    build_free(&b);
    if (!answer) return pv_status_set(st, PV_INTERNAL, "out of memory");
    *result = answer;
    return PV_OK;
}

/* The instance's output entry, from its journaled answer. Journaled itself, so a redelivered
 * operation does not tell the client twice. */
static int report(wk_op *op, const instance *in, const char *answer, const char *step, bool last,
                  pv_status *st) {
    json_t *a = json_loads(answer, 0, NULL);
    const char *err = json_string_value(json_object_get(a, "error"));
    json_t *pub = json_object_get(a, "publish"), *res = json_object_get(in->alloc, "resources");
    char *publish = pub ? json_dumps(pub, JSON_COMPACT) : NULL;
    char *resources = res ? pv_json_dumps(res, 0) : NULL;
    const char *alloc = json_string_value(json_object_get(in->alloc, "id"));
    /* alloc: which instance this is, so a reader drops the repeat a redelivery may write */
    const char *fields[] = {"type",    "id",      "name",  "nodename",  "podname",
                            "publish", "success", "error", "resources", "alloc"};
    const char *values[] = {"workload",
                            err ? "" : json_string_value(json_object_get(a, "id")),
                            err ? "" : json_string_value(json_object_get(a, "name")),
                            in->node,
                            in->pod,
                            publish ? publish : "{}",
                            err ? "0" : "1",
                            err ? err : "",
                            resources ? resources : "{}",
                            alloc ? alloc : ""};
    /* the last one is told with the operation's end: a call less */
    int rc = last ? wk_op_output_at_end(op, step, 10, fields, values, st)
                  : wk_op_output_step(op, step, 10, fields, values, st);
    free(publish);
    free(resources);
    json_decref(a);
    return rc;
}

/* The node agent this op runs on, with its engine; else NULL with FAILED_PRECONDITION naming
 * the op's kind. */
static wk_agent *engine_agent(wk_op *op, pv_status *st) {
    wk_agent *agent = wk_op_context(op);
    if (agent && wk_agent_engine(agent)) return agent;
    pv_status_set(st, PV_FAILED_PRECONDITION,
                  "this worker runs no engine: %s needs the node agent (pivirt-worker --set "
                  "worker.node=NAME)",
                  wk_op_record(op)->kind);
    return NULL;
}

/* An operation on one workload's instance queued for this node before it was lost does not act
 * on the instance once it was replaced elsewhere (wk_fence_replaced). */
static int refuse_replaced(wk_op *op, wk_agent *agent, const char *id, pv_status *st) {
    return wk_fence_refuse_replaced(wk_agent_engine(agent), wk_op_redis(op), wk_op_keys(op),
                                    wk_agent_node(agent), id, st);
}

/* What a node's part of a deploy or a replace starts from: this agent (with an engine), the pod
 * and the deploy's options carried in the parameters (protobuf, base64). *o is the caller's to
 * free (pb__deploy_options__free_unpacked). */
static int load_deploy(wk_op *op, wk_agent **agent, const char **pod, Pb__DeployOptions **o,
                       pv_status *st) {
    *o = NULL;
    if (!(*agent = engine_agent(op, st))) return PV_FAILED_PRECONDITION;
    const char *b64 = wk_op_param(op, "deploy");
    *pod = wk_op_param(op, "pod");
    if (!b64 || !*pod)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "params: deploy and pod are required");
    unsigned char *bytes = NULL;
    size_t len = 0;
    if (pv_b64_decode("params.deploy", b64, &bytes, &len, st) != PV_OK) return st->code;
    *o = pb__deploy_options__unpack(NULL, len, bytes);
    free(bytes);
    if (*o && (*o)->entrypoint) return PV_OK;
    if (*o) pb__deploy_options__free_unpacked(*o, NULL);
    *o = NULL;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "params.deploy: not a usable DeployOptions");
}

/* Whether a journaled instance answer tells a failure ({"error"}). */
static bool answer_failed(const char *answer) {
    json_t *a = json_loads(answer, 0, NULL);
    bool failed = !a || json_object_get(a, "error") != NULL;
    json_decref(a);
    return failed;
}

/* The allocation ids of allocs but the last (borrowed from allocs; the array is the caller's to
 * free), for the last instance to end the reservation with (instance.resv_others); NULL when
 * there are too many for one call (the release does it then) or on a malformed entry. */
static const char **other_alloc_ids(json_t *allocs, size_t *n) {
    size_t total = json_array_size(allocs);
    *n = total ? total - 1 : 0;
    if (total == 0 || *n > MAX_RESV_OTHERS) return NULL;
    const char **ids = calloc(*n + 1, sizeof *ids);
    for (size_t i = 0; ids && i < *n; i++)
        if (!(ids[i] = json_string_value(json_object_get(json_array_get(allocs, i), "id")))) {
            free(ids);
            return NULL;
        }
    return ids;
}

int wk_node_deploy_create(wk_op *op, pv_status *st) {
    return wk_node_deploy_create_ending(op, NULL, NULL, st);
}

int wk_node_deploy_create_ending(wk_op *op, const char *resv_id, bool *resv_ended, pv_status *st) {
    if (resv_ended) *resv_ended = false;
    wk_agent *agent;
    const char *pod;
    Pb__DeployOptions *o;
    if (load_deploy(op, &agent, &pod, &o, st) != PV_OK) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    json_t *allocs = json_object_get(params, "allocations");
    int rc = json_is_array(allocs)
                 ? PV_OK
                 : pv_status_set(st, PV_INVALID_ARGUMENT, "params.allocations: must be an array");
    size_t nothers = 0;
    const char **others = resv_id && rc == PV_OK ? other_alloc_ids(allocs, &nothers) : NULL;
    bool all_ok = others != NULL; /* every instance so far succeeded */
    size_t i;
    json_t *alloc;
    json_array_foreach(allocs, i, alloc) {
        if (rc != PV_OK) break;
        const char *alloc_id = json_string_value(json_object_get(alloc, "id"));
        if (!alloc_id) {
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "params.allocations[%zu].id: required", i);
            break;
        }
        json_t *inc = json_object_get(params, "incarnate");
        instance in = {.op = op,
                       .agent = agent,
                       .o = o,
                       .pod = pod,
                       .node = wk_agent_node(agent),
                       .alloc = alloc,
                       .inc_id = json_string_value(json_object_get(inc, "id")),
                       .inc_epoch = json_integer_value(json_object_get(inc, "epoch"))};
        if (all_ok && i + 1 == json_array_size(allocs)) {
            in.end_resv = resv_id;
            in.resv_others = others;
            in.nresv_others = nothers;
            in.resv_ended = resv_ended;
        }
        char step[256], *answer = NULL;
        snprintf(step, sizeof step, "instance:%s", alloc_id);
        /* the answer is journaled with its report: one fenced call for both */
        rc = wk_op_step_pending(op, step, step_instance, &in, &answer, st);
        if (rc == PV_OK) all_ok = all_ok && !answer_failed(answer);
        if (rc == PV_OK) {
            snprintf(step, sizeof step, "reported:%s", alloc_id);
            rc = report(op, &in, answer, step, i + 1 == json_array_size(allocs), st);
        }
        free(answer);
        /* the last one's is said by the end itself (progress 100): a round trip less */
        if (rc == PV_OK && i + 1 < json_array_size(allocs))
            wk_op_progress(op, (int)(100 * (i + 1) / json_array_size(allocs)),
                           "%zu of %zu instance(s) answered", i + 1, json_array_size(allocs));
    }
    free(others);
    json_decref(params);
    pb__deploy_options__free_unpacked(o, NULL);
    return rc;
}

/* ---- removal ---- */

/* One workload of a removal or control: the step functions' argument. */
typedef struct id_job {
    wk_agent *agent;
    const char *id, *type; /* type: control only */
    bool force;
    int grace_seconds; /* between SIGTERM and SIGKILL; < 0: the engine's default */
} id_job;

typedef struct removal_report {
    const char *id, *answer;
    const char *step; /* "reported:<id>": journaled with the output (wk_op_output_step) */
} removal_report;

/* Writes the output entry of a step's answer (journaled: told once). */
typedef int (*report_fn)(wk_op *op, const removal_report *rr, pv_status *st);

typedef struct gated_step {
    wk_step_fn fn;
    void *job;
    const char *id;
} gated_step;

/* An operation queued for this node before it was lost does not act on an instance that was
 * replaced elsewhere meanwhile (wk_fence_replaced): its answer is the refusal. */
static int step_unless_replaced(wk_op *op, void *arg, char **result, pv_status *st) {
    const gated_step *g = arg;
    wk_agent *agent = wk_op_context(op);
    char why[PV_STATUS_MSG_MAX];
    if (!agent || !wk_fence_replaced(wk_agent_engine(agent), wk_op_redis(op), wk_op_keys(op),
                                     wk_agent_node(agent), g->id, why, sizeof why))
        return g->fn(op, g->job, result, st);
    pv_warn("%s %s: %s", wk_op_record(op)->kind, wk_op_record(op)->id, why);
    json_t *j = json_pack("{s:s}", "error", why);
    *result = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return *result ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}

/* The journaled step "<prefix>:<id>" (do_step with job), then its journaled report
 * ("reported:<id>", report_step with a removal_report of id and the step's answer). With
 * pending, the answer is journaled with its report, one fenced call for both (a removal: one that
 * finds no answer runs again, as after a crash before its journal entry, and finds nothing left
 * to remove); else on its own first. */
static int step_and_report(wk_op *op, const char *prefix, const char *id, wk_step_fn do_step,
                           void *job, report_fn report_step, bool pending, pv_status *st) {
    char step[160], *answer = NULL;
    snprintf(step, sizeof step, "%s:%s", prefix, id);
    gated_step g = {do_step, job, id};
    int rc = pending ? wk_op_step_pending(op, step, step_unless_replaced, &g, &answer, st)
                     : wk_op_step(op, step, step_unless_replaced, &g, &answer, st);
    if (rc == PV_OK) {
        snprintf(step, sizeof step, "reported:%s", id);
        removal_report rr = {id, answer, step};
        rc = report_step(op, &rr, st);
    }
    free(answer);
    return rc;
}

/* The parameters of a removal or control: params.ids (checked: workload ids) and the job every
 * id shares (agent, type, force, grace_seconds; id left NULL). *params is the caller's to
 * decref; *ids is borrowed from it. */
static int id_params(wk_op *op, wk_agent *agent, json_t **params, json_t **ids, id_job *job,
                     pv_status *st) {
    *params = json_loads(wk_op_record(op)->params, 0, NULL);
    *ids = json_object_get(*params, "ids");
    const char *type = json_string_value(json_object_get(*params, "type"));
    json_t *grace = json_object_get(*params, "grace_seconds");
    int grace_seconds = json_is_integer(grace) && json_integer_value(grace) >= 0 &&
                                json_integer_value(grace) <= 86400
                            ? (int)json_integer_value(grace)
                            : -1;
    *job = (id_job){agent, NULL, type ? type : "", json_is_true(json_object_get(*params, "force")),
                    grace_seconds};
    if (!json_is_array(*ids))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "params.ids: must be an array of workload ids");
    size_t i;
    json_t *v;
    json_array_foreach(*ids, i, v) {
        if (!json_string_value(v))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "params.ids[%zu]: not a string", i);
        if (pv_workload_check_id("params.ids", json_string_value(v), st) != PV_OK) return st->code;
    }
    return PV_OK;
}

/* For each id of params.ids: the journaled step `do_step` ("<prefix>:<id>"), then its journaled
 * report (`report_step`, "reported:<id>"). */
static int each_id(wk_op *op, const char *prefix, wk_step_fn do_step, report_fn report_step,
                   bool pending, pv_status *st) {
    wk_agent *agent = engine_agent(op, st);
    if (!agent) return PV_FAILED_PRECONDITION;
    json_t *params, *ids;
    id_job job;
    int rc = id_params(op, agent, &params, &ids, &job, st);
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
        if (rc != PV_OK) break;
        job.id = json_string_value(v);
        rc = step_and_report(op, prefix, job.id, do_step, &job, report_step, pending, st);
    }
    json_decref(params);
    return rc;
}

/* One workload of a removal: what the engine, the give-back and the volumes answered. */
typedef struct rm_item {
    const char *id;   /* borrowed from the params */
    int64_t epoch;    /* the instance's incarnation (its labels); 0: no instance */
    bool skip;        /* told already (a redelivery), or a repeat in the ids */
    bool engine_done; /* the engine has nothing of it any more */
    char *error;      /* the answer's error (malloc'd); NULL: removed */
} rm_item;

static void rm_fail(rm_item *it, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rm_fail(rm_item *it, const char *fmt, ...) {
    if (it->error) return;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&it->error, fmt, ap) < 0) it->error = NULL;
    va_end(ap);
    if (!it->error) it->error = strdup("out of memory");
}

/* The engine's part of one workload: the instance's epoch read (an HA one that was replaced
 * elsewhere meanwhile is refused before anything is done to it: wk_fence_replaced), then it is
 * stopped and removed. PV_OK with it->error or it->engine_done; a code the operation machinery
 * retries later (retried_later) otherwise. */
static int rm_engine(wk_op *op, const id_job *job, rm_item *it, pv_status *st) {
    wk_engine *engine = wk_agent_engine(job->agent);
    wk_engine_info info = {0};
    pv_status est;
    bool ha = false;
    if (wk_engine_inspect(engine, it->id, &info, &est) == PV_OK) {
        it->epoch = wk_fence_epoch_of(info.labels_json);
        ha = pv_workload_is_ha(info.labels_json, NULL);
    }
    wk_engine_info_clear(&info);
    char why[PV_STATUS_MSG_MAX];
    /* only an HA workload is ever recreated elsewhere: for the others the give-back's own check
     * of the epoch (atomic with the removal) is the fence, and costs no round trip */
    if (ha && wk_fence_replaced_at(wk_op_redis(op), wk_op_keys(op), wk_agent_node(job->agent),
                                   it->id, it->epoch, why, sizeof why)) {
        pv_warn("%s %s: %s", wk_op_record(op)->kind, wk_op_record(op)->id, why);
        rm_fail(it, "%s", why);
        return PV_OK;
    }
    int rc = wk_engine_stop(engine, it->id, job->grace_seconds, job->force, &est);
    if (rc == PV_OK || rc == PV_FAILED_PRECONDITION) /* FAILED_PRECONDITION: not running */
        rc = wk_engine_remove(engine, it->id, true, &est);
    if (rc == PV_NOT_FOUND) rc = PV_OK; /* the engine has nothing of it (left, or never made) */
    if (retried_later(engine, rc)) return pv_status_set(st, rc, "remove %s: %s", it->id, est.msg);
    if (rc == PV_OK)
        it->engine_done = true;
    else
        rm_fail(it, "%s", est.msg);
    return PV_OK;
}

/* What the workloads the engine let go held goes back to the node, one compare-and-set for all
 * of them (pv_resv_return_workloads), then their volumes are detached. A failure is the
 * answer of the workloads it hit; PV_OK, or a code the operation machinery retries later. */
static int rm_give_back(wk_op *op, wk_agent *agent, rm_item *items, size_t n, pv_status *st) {
    pv_resv_return *w = calloc(n ? n : 1, sizeof *w);
    size_t *idx = calloc(n ? n : 1, sizeof *idx), m = 0;
    if (!w || !idx) {
        PV_FREE(w, idx);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < n; i++)
        if (items[i].engine_done && !items[i].error) {
            w[m] = (pv_resv_return){.id = items[i].id, .epoch = items[i].epoch};
            idx[m++] = i;
        }
    wk_engine *engine = wk_agent_engine(agent);
    pv_status gst;
    int rc = m ? pv_resv_return_workloads(wk_op_redis(op), wk_op_keys(op), wk_agent_node(agent), w,
                                          m, &gst)
               : PV_OK;
    if (retried_later(engine, rc)) {
        PV_FREE(w, idx);
        return pv_status_set(st, rc, "remove: %s", gst.msg);
    }
    for (size_t j = 0; j < m; j++) {
        rm_item *it = &items[idx[j]];
        char why[PV_STATUS_MSG_MAX];
        if (w[j].outcome == PV_RESV_UNSETTLED) {
            rm_fail(it, "%s", gst.msg);
        } else if (w[j].outcome == PV_FAILED_PRECONDITION) {
            wk_fence_replaced_why(wk_agent_node(agent), it->id, it->epoch, w[j].moved_epoch, why,
                                  sizeof why);
            pv_warn("%s %s: %s", wk_op_record(op)->kind, wk_op_record(op)->id, why);
            rm_fail(it, "%s", why);
        } else if (pv_storage_detach_all(wk_op_redis(op), wk_op_keys(op), it->id, &gst) != PV_OK) {
            if (retried_later(engine, gst.code)) {
                PV_FREE(w, idx);
                return pv_status_set(st, gst.code, "remove %s: %s", it->id, gst.msg);
            }
            rm_fail(it, "%s", gst.msg);
        }
    }
    PV_FREE(w, idx);
    return PV_OK;
}

/* The output entry of each workload handled ({type=removed, id, success, hook}), journaled
 * ("reported:<id>") so that a redelivery neither tells its client twice nor acts again on a
 * workload it told about. */
static int rm_report(wk_op *op, rm_item *items, size_t n, pv_status *st) {
    for (size_t i = 0; i < n; i++) {
        rm_item *it = &items[i];
        if (it->skip || (!it->engine_done && !it->error)) continue; /* not reached */
        if (it->error) pv_warn("remove %s: %s", it->id, it->error);
        char step[160];
        snprintf(step, sizeof step, "reported:%s", it->id);
        const char *fields[] = {"type", "id", "success", "hook"};
        const char *values[] = {"removed", it->id, it->error ? "0" : "1",
                                it->error ? it->error : ""};
        if (wk_op_output_step(op, step, 4, fields, values, st) != PV_OK) return st->code;
    }
    return PV_OK;
}

/* A node's part of a removal in three passes, so that the registry is written once for all of
 * its workloads rather than once each: the engine lets each go, what they held goes back in one
 * step, then each is reported. Each pass is idempotent (a workload already gone from the engine
 * or the registry is removed), so a redelivery after a crash anywhere redoes what was not
 * reported; the workloads it reported are skipped. */
int wk_node_deploy_remove(wk_op *op, pv_status *st) {
    wk_agent *agent = engine_agent(op, st);
    if (!agent) return PV_FAILED_PRECONDITION;
    json_t *params, *ids;
    id_job job;
    int rc = id_params(op, agent, &params, &ids, &job, st);
    size_t n = rc == PV_OK ? json_array_size(ids) : 0;
    rm_item *items = calloc(n ? n : 1, sizeof *items);
    if (rc == PV_OK && !items) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        items[i].id = json_string_value(json_array_get(ids, i));
        char step[160];
        snprintf(step, sizeof step, "reported:%s", items[i].id);
        for (size_t j = 0; j < i && !items[i].skip; j++)
            items[i].skip = strcmp(items[j].id, items[i].id) == 0;
        if (!items[i].skip) rc = wk_op_journaled(op, step, &items[i].skip, st);
    }
    /* a stop or a retried engine failure ends the engine pass: what it did is still given back
     * and reported before the code goes back to the operation machinery */
    int stop = PV_OK;
    pv_status sst;
    for (size_t i = 0; rc == PV_OK && stop == PV_OK && i < n; i++)
        if (!items[i].skip && (stop = wk_op_stop_code(op, &sst)) == PV_OK)
            stop = rm_engine(op, &job, &items[i], &sst);
    if (rc == PV_OK) rc = rm_give_back(op, agent, items, n, st);
    if (rc == PV_OK) rc = rm_report(op, items, n, st);
    if (rc == PV_OK && stop != PV_OK) rc = pv_status_set(st, stop, "%s", sst.msg);
    for (size_t i = 0; i < n; i++)
        free(items[i].error);
    free(items);
    json_decref(params);
    return rc;
}

/* ---- control ---- */

static int control_engine(wk_engine *e, const id_job *c, pv_status *st) {
    int rc;
    if (strcmp(c->type, "start") == 0) {
        rc = wk_engine_start(e, c->id, st);
        return rc == PV_FAILED_PRECONDITION ? PV_OK : rc; /* running already */
    }
    if (strcmp(c->type, "stop") == 0) {
        rc = wk_engine_stop(e, c->id, -1, c->force, st);
        return rc == PV_FAILED_PRECONDITION ? PV_OK : rc; /* stopped already */
    }
    if (strcmp(c->type, "restart") == 0) {
        rc = wk_engine_stop(e, c->id, -1, c->force, st);
        if (rc != PV_OK && rc != PV_FAILED_PRECONDITION) return rc;
        return wk_engine_start(e, c->id, st);
    }
    if (strcmp(c->type, "suspend") == 0) return wk_engine_pause(e, c->id, st);
    if (strcmp(c->type, "resume") == 0) return wk_engine_resume(e, c->id, st);
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "type: \"%s\" is not start, stop, restart, suspend or resume", c->type);
}

static int step_control(wk_op *op, void *arg, char **result, pv_status *st) {
    id_job *c = arg;
    wk_engine *engine = wk_agent_engine(c->agent);
    pv_status est;
    int rc = control_engine(engine, c, &est);
    if (retried_later(engine, rc))
        return pv_status_set(st, rc, "%s %s: %s", c->type, c->id, est.msg);
    wk_engine_info info = {0};
    if (rc == PV_OK && wk_engine_inspect(engine, c->id, &info, &est) == PV_OK) {
        pv_workload_status s = {0};
        snprintf(s.id, sizeof s.id, "%s", c->id);
        s.running = s.healthy = info.state == WK_STATE_RUNNING;
        s.networks = info.networks_json ? info.networks_json : "{}";
        pv_status sst;
        if (pv_workload_set_status(wk_op_redis(op), wk_op_keys(op), &s, NULL, &sst) != PV_OK)
            pv_warn("control %s %s: status not updated: %s", c->type, c->id, sst.msg);
    }
    wk_engine_info_clear(&info);
    json_t *j =
        rc == PV_OK ? json_pack("{s:s}", "error", "") : json_pack("{s:s}", "error", est.msg);
    *result = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return *result ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}

static int step_report_control(wk_op *op, const removal_report *rr, pv_status *st) {
    json_t *a = json_loads(rr->answer, 0, NULL);
    const char *err = json_string_value(json_object_get(a, "error"));
    const char *fields[] = {"type", "id", "error", "hook"};
    const char *values[] = {"controlled", rr->id, err ? err : "", ""};
    int rc = wk_op_output_step(op, rr->step, 4, fields, values, st);
    json_decref(a);
    return rc;
}

int wk_node_deploy_control(wk_op *op, pv_status *st) {
    const char *type = wk_op_param(op, "type");
    if (!type) return pv_status_set(st, PV_INVALID_ARGUMENT, "params.type: required");
    return each_id(op, "control", step_control, step_report_control, false, st);
}

/* ---- logs ---- */

#define LOG_POLL_MS 200
#define LOG_MAX_LINE 65536

/* The engine's own notes in a workload's log: "<YYYY-MM-DDTHH:MM:SSZ> pivirt: ...". */
static bool engine_note(const char *line) {
    return strlen(line) > 29 && line[4] == '-' && line[10] == 'T' && line[19] == 'Z' &&
           strncmp(line + 20, " pivirt: ", 9) == 0;
}

static int emit_line(wk_op *op, const char *line, pv_status *st) {
    if (engine_note(line)) return PV_OK;
    const char *fields[] = {"type", "data"}, *values[] = {"log", line};
    return wk_op_output(op, 2, fields, values, st);
}

/* How many of the workload's own lines (engine notes do not count) from f's position to end
 * (-1: the end of the file) to skip for "tail N"; f is back where it was. */
static long lines_to_skip(FILE *f, long tail, int64_t end, char *buf, size_t len) {
    if (tail < 0) return 0;
    off_t at = ftello(f);
    long lines = 0;
    while ((end < 0 || ftello(f) < end) && fgets(buf, (int)len, f))
        if (!engine_note(buf)) lines++;
    fseeko(f, at, SEEK_SET);
    return lines > tail ? lines - tail : 0;
}

/* Puts f at the first whole line at or after byte start. */
static void seek_line(FILE *f, int64_t start, char *buf, size_t len) {
    if (start <= 0) return;
    if (fseeko(f, (off_t)start - 1, SEEK_SET) != 0) return;
    if (fgetc(f) != '\n') {
        char *got = fgets(buf, (int)len, f); /* the rest of a line that began before start */
        (void)got;
    }
}

/* A log line of an engine that streams its own (docker), with its stream; a tick (line NULL)
 * notices a cancel. */
static int engine_line(void *ctx, int stream, const char *line, size_t len, pv_status *st) {
    wk_op *op = ctx;
    if (!line) return wk_op_sleep(op, 0, st) == PV_OK ? 0 : 1;
    char *text = strndup(line, len);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    const char *fields[] = {"type", "data", "stream"};
    const char *values[] = {"log", text, stream == 2 ? "stderr" : "stdout"};
    int rc = wk_op_output(op, 3, fields, values, st);
    free(text);
    return rc == PV_OK ? 0 : 1;
}

static int log_from_engine(wk_op *op, wk_engine *engine, const char *id,
                           const wk_engine_log_opts *lo, pv_status *st) {
    int exit_code = -1;
    if (wk_engine_logs(engine, id, lo, engine_line, op, &exit_code, st) != PV_OK) return st->code;
    if (!lo->follow || exit_code < 0) return PV_OK;
    char code[16];
    snprintf(code, sizeof code, "%d", exit_code);
    const char *fields[] = {"type", "code"}, *values[] = {"exit", code};
    return wk_op_output(op, 2, fields, values, st);
}

int wk_node_deploy_log(wk_op *op, pv_status *st) {
    wk_agent *agent = engine_agent(op, st);
    if (!agent) return PV_FAILED_PRECONDITION;
    const char *id = wk_op_param(op, "id"), *tail_text = wk_op_param(op, "tail");
    const char *follow_text = wk_op_param(op, "follow");
    bool follow = follow_text && strcmp(follow_text, "true") == 0;
    const char *since_text = wk_op_param(op, "since_ms"), *until_text = wk_op_param(op, "until_ms");
    int64_t since_ms = since_text ? strtoll(since_text, NULL, 10) : 0;
    int64_t until_ms = until_text ? strtoll(until_text, NULL, 10) : 0;
    long tail = -1;
    if (tail_text && *tail_text && strcmp(tail_text, "all") != 0) {
        char *end = NULL;
        tail = strtol(tail_text, &end, 10);
        if (!end || *end || tail < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "tail: \"%s\" is not \"all\" or a number of lines", tail_text);
    }
    if (!id) return pv_status_set(st, PV_INVALID_ARGUMENT, "params.id: required");
    if (refuse_replaced(op, agent, id, st) != PV_OK) return st->code;
    wk_engine *engine = wk_agent_engine(agent);
    wk_engine_info info = {0};
    if (wk_engine_inspect(engine, id, &info, st) != PV_OK) return st->code;
    if (!info.log_path || !*info.log_path) {
        wk_engine_info_clear(&info);
        wk_engine_log_opts lo = {tail, since_ms, until_ms, follow};
        if (strcmp(wk_engine_type(engine), "docker") == 0)
            return log_from_engine(op, engine, id, &lo, st);
        return pv_status_set(st, PV_UNIMPLEMENTED, "workload %s: the %s engine keeps no log", id,
                             wk_engine_type(engine));
    }
    int64_t start = 0, end = -1;
    if ((since_ms > 0 || until_ms > 0) &&
        wk_engine_log_range(engine, id, since_ms, until_ms, &start, &end, st) != PV_OK) {
        wk_engine_info_clear(&info);
        return st->code;
    }
    FILE *f = fopen(info.log_path, "r");
    wk_engine_info_clear(&info);
    if (!f) return pv_status_set(st, PV_NOT_FOUND, "workload %s has no log yet", id);
    char *line = malloc(LOG_MAX_LINE);
    int rc = line ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    if (line) seek_line(f, start, line, LOG_MAX_LINE);
    long skip = line ? lines_to_skip(f, tail, end, line, LOG_MAX_LINE) : 0, n = 0;
    bool exited = false;
    int exit_code = 0;
    while (rc == PV_OK) {
        off_t at = ftello(f);
        if (end >= 0 && at >= end) break; /* until */
        char *got = fgets(line, LOG_MAX_LINE, f);
        size_t len = got ? strlen(line) : 0;
        /* a line still being written (a guest's console writes as it goes): read it whole later */
        bool partial = got && follow && len < LOG_MAX_LINE - 1 && line[len - 1] != '\n';
        if (partial) fseeko(f, at, SEEK_SET);
        if (got && !partial) {
            if (len && line[len - 1] == '\n') line[len - 1] = '\0';
            if (engine_note(line)) continue;
            if (n++ >= skip) rc = emit_line(op, line, st);
            continue;
        }
        if (!follow) break;
        /* following up to until: the lines of the tick after it may still come in */
        if (until_ms > 0 && pv_time_now_ms() > until_ms + WK_ENGINE_LOG_INDEX_MS) break;
        clearerr(f);
        /* Follow while the workload runs; what it wrote before stopping is read first. */
        wk_engine_info now = {0};
        bool running = wk_engine_inspect(engine, id, &now, st) == PV_OK &&
                       (now.state == WK_STATE_RUNNING || now.state == WK_STATE_PAUSED);
        if (!running) {
            follow = false; /* one more pass reads what it wrote last, then the loop ends */
            exited = true;
            exit_code = now.exit_code;
        } else {
            rc = wk_op_sleep(op, LOG_POLL_MS, st);
        }
        wk_engine_info_clear(&now);
    }
    free(line);
    fclose(f);
    if (rc == PV_OK && exited) {
        /* A followed log ends with how the workload ended (RunAndWait's "[exitcode] N"). */
        char code[16];
        snprintf(code, sizeof code, "%d", exit_code);
        const char *fields[] = {"type", "code"}, *values[] = {"exit", code};
        rc = wk_op_output(op, 2, fields, values, st);
    }
    return rc;
}

/* ---- exec ---- */

#define EXEC_DEFAULT_TIMEOUT_MS 600000

/* ---- interactive exec ----
 * ExecuteWorkload with open_stdin: the command runs inside the workload with its standard input
 * and output on two FIFOs in the workload's root (sh -c 'exec "$@" < in > out 2>&1'), while
 * this handler feeds the input the gateway streams to the operation (pv_op_input_*) into the
 * one and relays what comes out of the other as output entries {type: data, data: base64},
 * as it comes. The engine's exec (which waits) runs on a thread of its own; the handler ends
 * with {type: exit, code} once the command has exited and its output is drained. A cancel (the
 * client gone) closes both FIFOs: the command sees the end of its input and a broken pipe. */

#define INPUT_WAIT_MS 50

typedef struct ix_exec {
    wk_engine *engine;
    const char *id;
    const char **argv;
    size_t argc;
    int timeout_ms;
    int code;
    int rc;
    pv_status st;
    bool done;
    pthread_mutex_t mu;
} ix_exec;

static void *ix_exec_thread(void *arg) {
    ix_exec *x = arg;
    char *out = NULL;
    size_t len = 0;
    int code = -1;
    int rc = wk_engine_exec(x->engine, x->id, x->argv, x->argc, x->timeout_ms, &code, &out, &len,
                            &x->st);
    free(out); /* redirected to the FIFO: nothing here */
    pthread_mutex_lock(&x->mu);
    x->rc = rc;
    x->code = code;
    x->done = true;
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

static bool ix_done(ix_exec *x) {
    pthread_mutex_lock(&x->mu);
    bool d = x->done;
    pthread_mutex_unlock(&x->mu);
    return d;
}

/* Relays what the command wrote; *eof once every writer has closed. */
static int ix_relay_output(wk_op *op, int fd, bool *eof, pv_status *st) {
    char buf[16384];
    *eof = false;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0) {
            *eof = true;
            return PV_OK;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return PV_OK; /* EAGAIN: nothing more for now */
        char *b64 = NULL;
        if (pv_b64_encode(buf, (size_t)n, &b64, st) != PV_OK) return st->code;
        const char *fields[] = {"type", "data"}, *values[] = {"data", b64};
        int rc = wk_op_output(op, 2, fields, values, st);
        free(b64);
        if (rc != PV_OK) return rc;
    }
}

/* Feeds the input that has come; closes *in_fd at its end. Input the command does not read is
 * kept in *pending until the FIFO takes it. */
static int ix_feed_input(wk_op *op, int *in_fd, char *cursor, unsigned char **pending,
                         size_t *npending, int block_ms, pv_status *st) {
    if (*in_fd < 0) return PV_OK;
    if (*npending == 0) {
        pv_op_output *in = NULL;
        size_t n = 0;
        if (pv_op_input_read(wk_op_redis(op), wk_op_keys(op), wk_op_record(op)->id, cursor, 100,
                             block_ms, &in, &n, st) != PV_OK)
            return st->code;
        bool eof = false;
        for (size_t i = 0; i < n; i++) {
            snprintf(cursor, PV_OP_CURSOR_MAX, "%s", in[i].id);
            for (size_t f = 0; f < in[i].n; f++) {
                if (strcmp(in[i].fields[f], "eof") == 0) eof = true;
                if (strcmp(in[i].fields[f], "data") != 0) continue;
                unsigned char *d = NULL;
                size_t dl = 0;
                if (pv_b64_decode("stdin", in[i].values[f], &d, &dl, st) != PV_OK) {
                    pv_op_output_free(in, n);
                    return st->code;
                }
                unsigned char *grown = realloc(*pending, *npending + dl + 1);
                if (!grown) {
                    free(d);
                    pv_op_output_free(in, n);
                    return pv_status_set(st, PV_INTERNAL, "out of memory");
                }
                memcpy(grown + *npending, d, dl);
                *pending = grown;
                *npending += dl;
                free(d);
            }
        }
        pv_op_output_free(in, n);
        if (eof && *npending == 0) {
            close(*in_fd);
            *in_fd = -1;
            return PV_OK;
        }
        if (eof) cursor[0] = '!'; /* the end came: close once the rest is written */
    }
    while (*npending > 0) {
        ssize_t w = write(*in_fd, *pending, *npending);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) return PV_OK; /* the command is not reading yet */
        if (w < 0) { /* it closed its input: the rest has nowhere to go */
            *npending = 0;
            close(*in_fd);
            *in_fd = -1;
            return PV_OK;
        }
        memmove(*pending, *pending + w, *npending - (size_t)w);
        *npending -= (size_t)w;
    }
    if (cursor[0] == '!') {
        close(*in_fd);
        *in_fd = -1;
    }
    return PV_OK;
}

/* Whether pid leads a process group of its own and is a child of this agent: what an exec
 * the engine started is. The pid comes from a file in the workload's root, which the
 * workload can write: without this, it could make the agent signal any process group. */
static bool ix_is_our_exec(long pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    long ppid = 0, pgrp = 0;
    char state;
    return p && sscanf(p + 1, " %c %ld %ld", &state, &ppid, &pgrp) == 3 && ppid == (long)getpid() &&
           pgrp == pid;
}

/* Ends the command's process group: TERM, then KILL after a second. */
static void ix_kill(ix_exec *x, const char *pid_path) {
    char buf[32] = "";
    int fd = open(pid_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    ssize_t n =
        fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    buf[n > 0 ? n : 0] = '\0';
    long pid = strtol(buf, NULL, 10);
    if (pid <= 1 || !ix_is_our_exec(pid)) {
        if (pid > 1)
            pv_warn("exec: pid %ld from %s is not an exec of this agent: not signalled", pid,
                    pid_path);
        return;
    }
    kill(-(pid_t)pid, SIGTERM);
    for (int i = 0; i < 20 && !ix_done(x); i++)
        usleep(50 * 1000);
    if (!ix_done(x)) kill(-(pid_t)pid, SIGKILL);
}

/* A FIFO at path (in the workload's root) for the command, held by an O_PATH descriptor
 * (*ref) whose /proc/self/fd name (proc) every later chmod and open goes through: the root is
 * the workload's, and a name swapped for a symbolic link there must not make the agent open,
 * chmod or write anything else. */
static int ix_make_fifo(const char *path, int *ref, char *proc, size_t cap, pv_status *st) {
    *ref = -1;
    unlink(path);
    if (mkfifo(path, 0600) != 0)
        return pv_status_set(st, PV_INTERNAL, "open_stdin: mkfifo %s: %s", path, strerror(errno));
    int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISFIFO(sb.st_mode)) {
        if (fd >= 0) close(fd);
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "open_stdin: %s was replaced by something not a FIFO", path);
    }
    snprintf(proc, cap, "/proc/self/fd/%d", fd);
    if (chmod(proc, 0666) != 0) { /* 0666: the command runs as the workload's user */
        int err = errno;
        close(fd);
        return pv_status_set(st, PV_INTERNAL, "open_stdin: chmod %s: %s", path, strerror(err));
    }
    *ref = fd;
    return PV_OK;
}

/* Relays the command's output and the client's input until the command ends, the operation is
 * cancelled or a relay fails; closes the input FIFO at the end, so the command sees it end. */
static int ix_pump(wk_op *op, ix_exec *x, int out_fd, const char *in_proc, pv_status *st) {
    int rc = PV_OK;
    int in_fd = -1;
    char cursor[PV_OP_CURSOR_MAX] = "0";
    unsigned char *pending = NULL;
    size_t npending = 0;
    bool out_eof = false, writer_seen = false; /* out_eof: only what the last read saw */
    while (rc == PV_OK) {
        /* the command opens its input when it starts; until then the FIFO has no reader */
        if (in_fd < 0 && cursor[0] != '!' && !writer_seen) {
            in_fd = open(in_proc, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
            if (in_fd >= 0) writer_seen = true;
        }
        /* done is read first: whatever the command wrote before it exited is then read now */
        bool done = ix_done(x);
        rc = ix_relay_output(op, out_fd, &out_eof, st);
        if (rc != PV_OK || done) break;
        if (writer_seen)
            rc = ix_feed_input(op, &in_fd, cursor, &pending, &npending,
                               npending || done ? 0 : INPUT_WAIT_MS, st);
        if (rc == PV_OK && (!writer_seen || in_fd < 0 || npending)) {
            struct pollfd p = {.fd = out_fd, .events = POLLIN};
            poll(&p, 1, INPUT_WAIT_MS);
        }
        if (rc == PV_OK) rc = wk_op_sleep(op, 0, st); /* cancelled: stop feeding */
    }
    if (in_fd >= 0) close(in_fd);
    free(pending);
    return rc;
}

/* Closes the fifos' holding ends that are open and removes the fifos. */
static void ix_drop_fifos(int in_ref, int out_ref, const char *in_path, const char *out_path) {
    if (in_ref >= 0) close(in_ref);
    if (out_ref >= 0) close(out_ref);
    unlink(in_path);
    unlink(out_path);
}

static int exec_interactive(wk_op *op, wk_engine *engine, const char *id, const char **argv,
                            size_t argc, int timeout_ms, pv_status *st) {
    wk_engine_info info = {0};
    if (wk_engine_inspect(engine, id, &info, st) != PV_OK) return st->code;
    if (!info.root) {
        wk_engine_info_clear(&info);
        return pv_status_set(st, PV_UNIMPLEMENTED, "open_stdin: the %s engine has no files here",
                             wk_engine_type(engine));
    }
    char in_path[PATH_MAX], out_path[PATH_MAX], pid_path[PATH_MAX];
    snprintf(in_path, sizeof in_path, "%s/.pivirt-in-%s", info.root, wk_op_record(op)->id);
    snprintf(out_path, sizeof out_path, "%s/.pivirt-out-%s", info.root, wk_op_record(op)->id);
    snprintf(pid_path, sizeof pid_path, "%s/.pivirt-pid-%s", info.root, wk_op_record(op)->id);
    wk_engine_info_clear(&info);
    int in_ref = -1, out_ref = -1;
    char in_proc[64], out_proc[64];
    if (ix_make_fifo(in_path, &in_ref, in_proc, sizeof in_proc, st) != PV_OK ||
        ix_make_fifo(out_path, &out_ref, out_proc, sizeof out_proc, st) != PV_OK) {
        ix_drop_fifos(in_ref, out_ref, in_path, out_path);
        return st->code;
    }
    const char **wrapped = calloc(argc + 6, sizeof *wrapped);
    if (!wrapped) {
        ix_drop_fifos(in_ref, out_ref, in_path, out_path);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    wrapped[0] = "/bin/sh";
    wrapped[1] = "-c";
    /* its pid (the command's, after exec) lets a cancel end its process group */
    wrapped[2] = "echo $$ >\"$2\"; exec >\"$1\" 2>&1 <\"$0\"; shift 2; exec \"$@\"";
    wrapped[3] = in_path;
    wrapped[4] = out_path;
    wrapped[5] = pid_path;
    memcpy(wrapped + 6, argv, argc * sizeof *argv);
    /* the reading end first: the command's open of its output then never waits */
    int out_fd = open(out_proc, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ix_exec x = {.engine = engine,
                 .id = id,
                 .argv = wrapped,
                 .argc = argc + 6,
                 .timeout_ms = timeout_ms,
                 .code = -1};
    pthread_mutex_init(&x.mu, NULL);
    pthread_t th;
    int rc = out_fd >= 0
                 ? PV_OK
                 : pv_status_set(st, PV_INTERNAL, "open_stdin: %s: %s", out_path, strerror(errno));
    bool started = rc == PV_OK && pthread_create(&th, NULL, ix_exec_thread, &x) == 0;
    if (rc == PV_OK && !started) rc = pv_status_set(st, PV_INTERNAL, "open_stdin: no thread");
    if (rc == PV_OK) rc = ix_pump(op, &x, out_fd, in_proc, st);
    /* stopping (the end, a cancel, an error): the command sees its input end and its output
     * break, and the exec thread returns */
    if (out_fd >= 0) close(out_fd);
    if (started && rc != PV_OK) ix_kill(&x, pid_path);
    if (started) pthread_join(th, NULL);
    unlink(pid_path);
    ix_drop_fifos(in_ref, out_ref, in_path, out_path);
    free(wrapped);
    pthread_mutex_destroy(&x.mu);
    if (rc == PV_OK && x.rc != PV_OK) rc = pv_status_set(st, x.st.code, "%s", x.st.msg);
    if (rc == PV_OK) {
        char code[16];
        snprintf(code, sizeof code, "%d", x.code);
        const char *fields[] = {"type", "code"}, *values[] = {"exit", code};
        rc = wk_op_output(op, 2, fields, values, st);
    }
    return rc;
}

/* An interactive exec of the docker engine: the operation's input stream is the command's
 * stdin, its output goes out as data entries as it comes (the FIFOs above are for engines whose
 * workloads have a root here). */
typedef struct ix_stream {
    wk_op *op;
    char cursor[PV_OP_CURSOR_MAX];
    unsigned char *pending;
    size_t npending, at;
    bool eof;
} ix_stream;

static int ix_stream_output(void *ctx, int stream, const char *data, size_t len, pv_status *st) {
    (void)stream;
    ix_stream *x = ctx;
    char *b64 = NULL;
    if (pv_b64_encode(data, len, &b64, st) != PV_OK) return st->code;
    const char *fields[] = {"type", "data"}, *values[] = {"data", b64};
    int rc = wk_op_output(x->op, 2, fields, values, st);
    free(b64);
    return rc;
}

/* Reads what came of the input (waiting up to wait_ms) into pending. */
static int ix_stream_take(ix_stream *x, int wait_ms, pv_status *st) {
    pv_op_output *in = NULL;
    size_t n = 0;
    if (pv_op_input_read(wk_op_redis(x->op), wk_op_keys(x->op), wk_op_record(x->op)->id, x->cursor,
                         100, wait_ms, &in, &n, st) != PV_OK)
        return st->code;
    int rc = PV_OK;
    free(x->pending);
    x->pending = NULL;
    x->npending = x->at = 0;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        snprintf(x->cursor, sizeof x->cursor, "%s", in[i].id);
        for (size_t f = 0; rc == PV_OK && f < in[i].n; f++) {
            if (strcmp(in[i].fields[f], "eof") == 0) x->eof = true;
            if (strcmp(in[i].fields[f], "data") != 0) continue;
            unsigned char *d = NULL, *grown = NULL;
            size_t dl = 0;
            rc = pv_b64_decode("stdin", in[i].values[f], &d, &dl, st);
            if (rc == PV_OK && !(grown = realloc(x->pending, x->npending + dl + 1)))
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
            if (rc == PV_OK) {
                memcpy(grown + x->npending, d, dl);
                x->pending = grown;
                x->npending += dl;
            }
            free(d);
        }
    }
    pv_op_output_free(in, n);
    return rc;
}

static long ix_stream_input(void *ctx, char *buf, size_t cap, int wait_ms, pv_status *st) {
    ix_stream *x = ctx;
    if (wk_op_sleep(x->op, 0, st) != PV_OK) return -2; /* cancelled: the client left */
    if (x->at == x->npending && !x->eof && ix_stream_take(x, wait_ms, st) != PV_OK) return -2;
    if (x->at == x->npending) return x->eof ? -1 : 0;
    size_t n = x->npending - x->at < cap ? x->npending - x->at : cap;
    memcpy(buf, x->pending + x->at, n);
    x->at += n;
    return (long)n;
}

/* The docker engine takes the env and the working directory itself (its images need not have
 * an env that knows -C): the output collected into one exec entry, as for the others, or with
 * interactive streamed as data entries and ended with an exit entry. */
static int exec_io_entry(wk_op *op, wk_engine *engine, const char *id, json_t *params,
                         bool interactive, pv_status *st) {
    json_t *cmds = json_object_get(params, "commands"), *envs = json_object_get(params, "envs");
    size_t ncmd = json_array_size(cmds), nenv = json_array_size(envs);
    const char **argv = calloc(ncmd + nenv + 1, sizeof *argv), **env = argv + ncmd;
    if (!argv) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < ncmd; i++)
        argv[i] = json_string_value(json_array_get(cmds, i)) ?: "";
    for (size_t i = 0; i < nenv; i++)
        env[i] = json_string_value(json_array_get(envs, i)) ?: "";
    json_int_t timeout = json_integer_value(json_object_get(params, "timeout_ms"));
    wk_exec_buf out = {0};
    wk_exec_io io = {.argv = argv,
                     .argc = ncmd,
                     .env = env,
                     .nenv = nenv,
                     .workdir = json_string_value(json_object_get(params, "workdir")) ?: "",
                     .timeout_ms = timeout > 0 ? (int)timeout : EXEC_DEFAULT_TIMEOUT_MS,
                     .output = wk_exec_buf_collect,
                     .ctx = &out};
    ix_stream x = {.op = op, .cursor = "0"};
    if (interactive) {
        io.output = ix_stream_output;
        io.input = ix_stream_input;
        io.ctx = &x;
    }
    int code = -1;
    pv_status est;
    int rc = wk_engine_exec_io(engine, id, &io, &code, &est);
    if (rc != PV_OK) rc = pv_status_set(st, est.code, "%s", est.msg);
    free(x.pending);
    char *b64 = NULL, codes[16];
    snprintf(codes, sizeof codes, "%d", code);
    if (rc == PV_OK && interactive) {
        const char *fields[] = {"type", "code"}, *values[] = {"exit", codes};
        rc = wk_op_output(op, 2, fields, values, st);
    } else if (rc == PV_OK) {
        rc = pv_b64_encode(out.data ? out.data : "", out.len, &b64, st);
    }
    if (rc == PV_OK && !interactive) {
        const char *fields[] = {"type", "data", "code"}, *values[] = {"exec", b64, codes};
        rc = wk_op_output(op, 3, fields, values, st);
    }
    free(b64);
    free(out.data);
    free(argv);
    return rc;
}

int wk_node_deploy_exec(wk_op *op, pv_status *st) {
    wk_agent *agent = engine_agent(op, st);
    if (!agent) return PV_FAILED_PRECONDITION;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    const char *id = json_string_value(json_object_get(params, "id"));
    const char *workdir = json_string_value(json_object_get(params, "workdir"));
    json_t *cmds = json_object_get(params, "commands"), *envs = json_object_get(params, "envs");
    json_int_t timeout = json_integer_value(json_object_get(params, "timeout_ms"));
    size_t ncmd = json_array_size(cmds), nenv = json_array_size(envs);
    int rc = id && ncmd > 0
                 ? PV_OK
                 : pv_status_set(st, PV_INVALID_ARGUMENT, "params: id and commands are required");
    if (rc == PV_OK) rc = refuse_replaced(op, agent, id, st);
    /* docker takes the env and the workdir itself; a VM's guest agent takes the input whole
     * (no FIFOs in a guest): both through the engine's exec_io */
    const char *type = wk_engine_type(wk_agent_engine(agent));
    bool interactive = json_is_true(json_object_get(params, "interactive"));
    if (rc == PV_OK &&
        (strcmp(type, "docker") == 0 || (interactive && strcmp(type, "virt") == 0))) {
        rc = exec_io_entry(op, wk_agent_engine(agent), id, params, interactive, st);
        json_decref(params);
        return rc;
    }
    /* env -C workdir K=V ... cmd...: the extras without a shell in between. */
    const char **argv = calloc(ncmd + nenv + 4, sizeof *argv);
    size_t argc = 0;
    if (rc == PV_OK && !argv) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK && (nenv > 0 || (workdir && *workdir))) {
        argv[argc++] = "env";
        if (workdir && *workdir) {
            argv[argc++] = "-C";
            argv[argc++] = workdir;
        }
        for (size_t i = 0; i < nenv; i++)
            argv[argc++] = json_string_value(json_array_get(envs, i)) ?: "";
    }
    for (size_t i = 0; rc == PV_OK && i < ncmd; i++)
        argv[argc++] = json_string_value(json_array_get(cmds, i)) ?: "";
    if (rc == PV_OK && interactive) {
        rc = exec_interactive(op, wk_agent_engine(agent), id, argv, argc,
                              timeout > 0 ? (int)timeout : EXEC_DEFAULT_TIMEOUT_MS, st);
        free(argv);
        json_decref(params);
        return rc;
    }
    int code = -1;
    char *output = NULL;
    size_t len = 0;
    pv_status est;
    if (rc == PV_OK && wk_engine_exec(wk_agent_engine(agent), id, argv, argc,
                                      timeout > 0 ? (int)timeout : EXEC_DEFAULT_TIMEOUT_MS, &code,
                                      &output, &len, &est) != PV_OK)
        rc = pv_status_set(st, est.code, "%s", est.msg);
    char *b64 = NULL, codes[16];
    if (rc == PV_OK) rc = pv_b64_encode(output ? output : "", len, &b64, st);
    if (rc == PV_OK) {
        snprintf(codes, sizeof codes, "%d", code);
        const char *fields[] = {"type", "data", "code"}, *values[] = {"exec", b64, codes};
        rc = wk_op_output(op, 3, fields, values, st);
    }
    PV_FREE(b64, output, argv);
    json_decref(params);
    return rc;
}

/* ---- realloc ---- */

int wk_node_deploy_realloc(wk_op *op, pv_status *st) {
    wk_agent *agent = engine_agent(op, st);
    if (!agent) return PV_FAILED_PRECONDITION;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    const char *id = json_string_value(json_object_get(params, "id"));
    char how[256] = "";
    int rc = id ? refuse_replaced(op, agent, id, st)
                : pv_status_set(st, PV_INVALID_ARGUMENT, "params.id: required");
    if (rc == PV_OK)
        rc = wk_engine_set_limits_how(
            wk_agent_engine(agent), id, json_number_value(json_object_get(params, "cpu_limit")),
            (int64_t)json_integer_value(json_object_get(params, "memory_limit")), how, sizeof how,
            st);
    /* when the limits apply (now, or at the next start) is the operation's last message */
    if (rc == PV_OK && how[0]) rc = wk_op_progress(op, 100, "workload %s: %s", id, how);
    json_decref(params);
    return rc;
}

/* ---- replace ---- */

/* Copies each "old path" -> "new path" of in->copy from the old root, mode kept (and owner, as
 * the files are written by the agent with their uid/gid); without roots (docker) from the old
 * container's archive into the new one's, mode and owner kept. */
static int copy_from_old(const instance *in, const char *new_id, const char *new_root,
                         pv_status *st) {
    wk_engine *engine = wk_agent_engine(in->agent);
    const char *src;
    json_t *dst;
    json_object_foreach(in->copy, src, dst) {
        char *data = NULL;
        size_t len = 0;
        int mode = 0644, uid = -1, gid = -1;
        const char *to = json_string_value(dst) ? json_string_value(dst) : src;
        int rc = in->old_root ? wk_files_get(in->old_root, src, &data, &len, &mode, st)
                              : wk_engine_get_file(engine, in->old_id, src, &data, &len, &mode,
                                                   &uid, &gid, st);
        if (rc == PV_OK)
            rc = new_root ? wk_files_put(new_root, to, data, len, mode, -1, -1, st)
                          : wk_engine_put_file(engine, new_id, to, data, len, mode, uid, gid, st);
        free(data);
        if (rc != PV_OK) return pv_status_prefix(st, "copy %s", src);
    }
    return PV_OK;
}

typedef struct replace_job {
    wk_agent *agent;
    const Pb__DeployOptions *o;
    const char *pod, *old_id;
    json_t *copy;
} replace_job;

/* Stops the old workload, creates and starts the new one with the old one's resources (copying
 * the files asked for), records it and drops the old record and the old workload; when the new
 * one fails, it is removed and the old one started again. The answer is journaled. */
static int step_replace(wk_op *op, void *arg, char **result, pv_status *st) {
    replace_job *rj = arg;
    wk_engine *engine = wk_agent_engine(rj->agent);
    pv_workload old = {0};
    wk_engine_info oldinfo = {0};
    pv_status est;
    char *answer = NULL;
    if (pv_workload_get(wk_op_redis(op), wk_op_keys(op), rj->old_id, &old, &est) != PV_OK ||
        wk_engine_inspect(engine, rj->old_id, &oldinfo, &est) != PV_OK) {
        json_t *j = json_pack("{s:s, s:s}", "error", est.msg, "old", rj->old_id);
        *result = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        pv_workload_clear(&old);
        return *result ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    wk_engine_stop(engine, rj->old_id, -1, false, &est); /* not running: nothing to stop */
    char alloc_id[PV_ID_MAX + 80];
    snprintf(alloc_id, sizeof alloc_id, "replace:%s:%s", rj->old_id, wk_op_record(op)->id);
    json_t *res = json_loads(old.resources ? old.resources : "{}", 0, NULL);
    json_t *alloc = json_pack("{s:s, s:i, s:o}", "id", alloc_id, "seq", 0, "resources",
                              res ? res : json_object());
    instance in = {.op = op,
                   .agent = rj->agent,
                   .o = rj->o,
                   .pod = rj->pod,
                   .node = wk_agent_node(rj->agent),
                   .alloc = alloc,
                   .keep_resources = true,
                   .before_start = rj->copy ? copy_from_old : NULL,
                   .old_id = rj->old_id,
                   .old_root = oldinfo.root,
                   .copy = rj->copy};
    int rc = step_instance(op, &in, &answer, st);
    json_t *a = rc == PV_OK ? json_loads(answer, 0, NULL) : NULL;
    if (rc == PV_OK && !json_object_get(a, "error")) {
        /* The new one holds the resources now: the old record goes without giving them back. */
        pv_workload_remove(wk_op_redis(op), wk_op_keys(op), rj->old_id, &est);
        wk_engine_remove(engine, rj->old_id, true, &est);
    } else if (rc == PV_OK) {
        wk_engine_start(engine, rj->old_id, &est); /* the old one runs on */
    }
    if (a) json_object_set_new(a, "old", json_string(rj->old_id));
    free(answer);
    *result = rc == PV_OK && a ? json_dumps(a, JSON_COMPACT) : NULL;
    if (rc == PV_OK && !*result) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    json_decref(a);
    json_decref(alloc);
    wk_engine_info_clear(&oldinfo);
    pv_workload_clear(&old);
    return rc;
}

static int step_report_replace(wk_op *op, const removal_report *rr, pv_status *st) {
    wk_agent *agent = wk_op_context(op);
    json_t *a = json_loads(rr->answer, 0, NULL);
    const char *err = json_string_value(json_object_get(a, "error"));
    json_t *pub = json_object_get(a, "publish");
    char *publish = pub ? json_dumps(pub, JSON_COMPACT) : NULL;
    const char *fields[] = {"type",    "id",      "name",  "nodename", "podname",
                            "publish", "success", "error", "old"};
    const char *values[] = {"replaced",
                            err ? "" : json_string_value(json_object_get(a, "id")),
                            err ? "" : json_string_value(json_object_get(a, "name")),
                            wk_agent_node(agent),
                            wk_op_param(op, "pod") ? wk_op_param(op, "pod") : "",
                            publish ? publish : "{}",
                            err ? "0" : "1",
                            err ? err : "",
                            rr->id};
    int rc = wk_op_output_step(op, rr->step, 9, fields, values, st);
    free(publish);
    json_decref(a);
    return rc;
}

int wk_node_deploy_replace(wk_op *op, pv_status *st) {
    wk_agent *agent;
    const char *pod;
    Pb__DeployOptions *o;
    if (load_deploy(op, &agent, &pod, &o, st) != PV_OK) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    json_t *copy = json_object_get(params, "copy");
    int rc = PV_OK;
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(params, "ids"), i, v) {
        if (rc != PV_OK) break;
        const char *old_id = json_string_value(v);
        if (!old_id) continue;
        replace_job rj = {agent, o, pod, old_id, json_object_size(copy) ? copy : NULL};
        rc = step_and_report(op, "replace", old_id, step_replace, &rj, step_report_replace, false,
                             st);
    }
    json_decref(params);
    pb__deploy_options__free_unpacked(o, NULL);
    return rc;
}
