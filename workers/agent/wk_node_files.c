/*
 * wk_node_files: Send and Copy on the agent (see wk_node_files.h). Each report of Send is a
 * journaled step, so a redelivered operation writes its files again (harmless) but tells the
 * client once; Copy only reads and is simply run again.
 */
#include "wk_node_files.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_b64.h"
#include "wk_agent.h"
#include "wk_engine.h"
#include "wk_fence.h"
#include "wk_files.h"

/* A workload's files are behind its engine (a guest's agent, a container's archive calls:
 * wk_engine_put_file and wk_engine_get_tar), not on this machine. */
#define IN_GUEST ""

/* The workload's root on this machine (IN_GUEST for an engine that reaches its files itself),
 * or the reason there is none (in *why, caller frees): an instance replaced elsewhere while this
 * node was away has none (wk_fence_replaced: an operation queued before does not touch it). */
static char *root_of(wk_op *op, const char *id, char **name, char **why) {
    *why = NULL;
    wk_agent *agent = wk_op_context(op);
    wk_engine_info info = {0};
    pv_status st;
    char *root = NULL;
    const char *type = wk_engine_type(wk_agent_engine(agent));
    bool engine_has_files = strcmp(type, "virt") == 0 || strcmp(type, "docker") == 0;
    if (wk_fence_refuse_replaced(wk_agent_engine(agent), wk_op_redis(op), wk_op_keys(op),
                                 wk_agent_node(agent), id, &st) != PV_OK) {
        *why = strdup(st.msg);
    } else if (wk_engine_inspect(wk_agent_engine(agent), id, &info, &st) != PV_OK) {
        *why = strdup(st.msg);
    } else if (!info.root && engine_has_files) {
        root = strdup(IN_GUEST);
        if (name) *name = strdup(info.name ? info.name : "");
    } else if (!info.root) {
        if (asprintf(why, "workload %s: the %s engine has no files on this machine", id,
                     wk_engine_type(wk_agent_engine(agent))) < 0)
            *why = NULL;
    } else {
        root = strdup(info.root);
        if (name) *name = strdup(info.name ? info.name : "");
    }
    wk_engine_info_clear(&info);
    return root;
}

static int no_engine(wk_op *op, pv_status *st) {
    wk_agent *agent = wk_op_context(op);
    if (agent && wk_agent_engine(agent)) return PV_OK;
    return pv_status_set(st, PV_FAILED_PRECONDITION,
                         "this worker runs no engine: %s needs the node agent",
                         wk_op_record(op)->kind);
}

typedef struct sent {
    const char *id, *path, *error;
} sent;

static int step_sent(wk_op *op, void *arg, char **result, pv_status *st) {
    const sent *s = arg;
    const char *fields[] = {"type", "id", "path", "error"};
    const char *values[] = {"sent", s->id, s->path, s->error};
    if (wk_op_output(op, 4, fields, values, st) != PV_OK) return st->code;
    *result = strdup("");
    return *result ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}

static int send_one(wk_op *op, const char *root, const char *id, json_t *file, pv_status *st) {
    const char *path = json_string_value(json_object_get(file, "path"));
    const char *b64 = json_string_value(json_object_get(file, "data"));
    json_t *mode = json_object_get(file, "mode"), *uid = json_object_get(file, "uid");
    unsigned char *data = NULL;
    size_t len = 0;
    pv_status fst;
    int rc = path && b64
                 ? pv_b64_decode("data", b64, &data, &len, &fst)
                 : pv_status_set(&fst, PV_INVALID_ARGUMENT, "files: path and data required");
    int m = mode ? (int)json_integer_value(mode) : 0755,
        u = uid ? (int)json_integer_value(uid) : -1;
    int g = (int)json_integer_value(json_object_get(file, "gid"));
    if (rc == PV_OK && strcmp(root, IN_GUEST) == 0)
        rc = wk_engine_put_file(wk_agent_engine(wk_op_context(op)), id, path, data, len, m, u, g,
                                &fst);
    else if (rc == PV_OK)
        rc = wk_files_put(root, path, data, len, m, u, g, &fst);
    free(data);
    sent s = {id, path ? path : "", rc == PV_OK ? "" : fst.msg};
    char step[600];
    snprintf(step, sizeof step, "sent:%s:%.500s", id, s.path);
    return wk_op_step(op, step, step_sent, &s, NULL, st);
}

int wk_node_files_send(wk_op *op, pv_status *st) {
    if (no_engine(op, st) != PV_OK) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    json_t *ids = json_object_get(params, "ids"), *files = json_object_get(params, "files");
    int rc = json_is_array(ids) && json_is_array(files)
                 ? PV_OK
                 : pv_status_set(st, PV_INVALID_ARGUMENT, "params: ids and files are required");
    size_t i, j;
    json_t *v, *file;
    json_array_foreach(ids, i, v) {
        if (rc != PV_OK) break;
        const char *id = json_string_value(v);
        char *why = NULL, *root = id ? root_of(op, id, NULL, &why) : NULL;
        json_array_foreach(files, j, file) {
            if (rc != PV_OK) break;
            if (root) {
                rc = send_one(op, root, id, file, st);
            } else {
                const char *path = json_string_value(json_object_get(file, "path"));
                sent s = {id ? id : "", path ? path : "", why ? why : "workload not found"};
                char step[600];
                snprintf(step, sizeof step, "sent:%s:%.500s", s.id, s.path);
                rc = wk_op_step(op, step, step_sent, &s, NULL, st);
            }
        }
        free(root);
        free(why);
    }
    json_decref(params);
    return rc;
}

static int copied(wk_op *op, const char *id, const char *name, const char *path, const char *error,
                  const char *data, pv_status *st) {
    const char *fields[] = {"type", "id", "name", "path", "error", "data"};
    const char *values[] = {"copied", id, name, path, error, data};
    return wk_op_output(op, 6, fields, values, st);
}

static int copy_path(wk_op *op, const char *root, const char *id, const char *name,
                     const char *path, pv_status *st) {
    char *tar = NULL;
    size_t len = 0;
    pv_status fst;
    int trc = strcmp(root, IN_GUEST) == 0 ? wk_engine_get_tar(wk_agent_engine(wk_op_context(op)),
                                                              id, path, &tar, &len, &fst)
                                          : wk_files_tar(root, path, &tar, &len, &fst);
    if (trc != PV_OK) return copied(op, id, name, path, fst.msg, "", st);
    int rc = PV_OK;
    for (size_t off = 0; rc == PV_OK && off < len; off += WK_COPY_CHUNK) {
        size_t n = len - off < WK_COPY_CHUNK ? len - off : WK_COPY_CHUNK;
        char *b64 = NULL;
        if ((rc = pv_b64_encode(tar + off, n, &b64, st)) == PV_OK)
            rc = copied(op, id, name, path, "", b64, st);
        free(b64);
    }
    free(tar);
    return rc;
}

int wk_node_files_copy(wk_op *op, pv_status *st) {
    if (no_engine(op, st) != PV_OK) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    json_t *targets = json_object_get(params, "targets");
    int rc = json_is_object(targets)
                 ? PV_OK
                 : pv_status_set(st, PV_INVALID_ARGUMENT, "params.targets: must be an object");
    const char *id;
    json_t *paths;
    json_object_foreach(targets, id, paths) {
        if (rc != PV_OK) break;
        char *why = NULL, *name = NULL, *root = root_of(op, id, &name, &why);
        size_t i;
        json_t *p;
        json_array_foreach(paths, i, p) {
            if (rc != PV_OK) break;
            const char *path = json_string_value(p) ? json_string_value(p) : "";
            rc = root ? copy_path(op, root, id, name ? name : "", path, st)
                      : copied(op, id, "", path, why ? why : "workload not found", "", st);
        }
        free(root);
        free(name);
        free(why);
    }
    json_decref(params);
    return rc;
}
