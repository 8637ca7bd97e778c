/*
 * svc_core_files: Send, SendLargeFile and Copy (see svc_core_files.h). SendLargeFile holds the
 * client's chunks in memory until the half-close, bounded by gateway.max_upload_bytes in all.
 */
#include "svc_core_files.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_deploy.h"
#include "pv_kinds.h"
#include "svc_eru.h"
#include "svc_relay.h"

#define N_METHODS 3

struct svc_core_files {
    gw_app *app;
    gw_method methods[N_METHODS];
};

svc_core_files *svc_core_files_new(gw_app *app) {
    svc_core_files *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_files_free(svc_core_files *s) {
    free(s);
}

/* One failure of the stream's own, counted as the relay counts its failures. */
static int send_failure(gw_call *call, svc_relay *rl, const ProtobufCMessage *m, int rc,
                        pv_status *st) {
    rl->sent++;
    rl->failed++;
    if (rc == PV_OK && gw_call_send(call, m) != 0)
        rc = pv_status_set(st, PV_CANCELLED, "client gone");
    return rc;
}

/* Answers each [id, why] of unknown (an id that names no workload) as Eru's per-workload
 * lookup does: a Send's one message {id, error}, without a path; a Copy's (copy: its request,
 * NULL for a Send) one {id, path, error} per path asked. */
static int answer_unknown(gw_call *call, svc_relay *rl, json_t *unknown,
                          const Pb__CopyOptions *copy, int rc, pv_status *st) {
    size_t i;
    json_t *u;
    json_array_foreach(unknown, i, u) {
        char *id = (char *)json_string_value(json_array_get(u, 0));
        char *why = (char *)json_string_value(json_array_get(u, 1));
        if (!copy) {
            Pb__SendMessage m = PB__SEND_MESSAGE__INIT;
            m.id = id;
            m.error = why;
            rc = send_failure(call, rl, &m.base, rc, st);
            continue;
        }
        size_t t = 0;
        while (t < copy->n_targets && strcmp(copy->targets[t]->key, id) != 0)
            t++;
        for (size_t p = 0; t < copy->n_targets && p < copy->targets[t]->value->n_paths; p++) {
            Pb__CopyMessage m = PB__COPY_MESSAGE__INIT;
            m.id = id;
            m.path = copy->targets[t]->value->paths[p];
            m.error = why;
            rc = send_failure(call, rl, &m.base, rc, st);
        }
    }
    return rc;
}

/* Sends files (borrowed: [{path, data (base64), mode, uid, gid}]) into the workloads ids, one
 * operation per node, relaying one SendMessage per workload and file (an unknown workload: one
 * with its error); finishes the call. */
static void send_files(gw_call *call, svc_relay *rl, int rc, pv_status *st, char **ids,
                       size_t n_ids, json_t *files, int eru) {
    json_t *by_node = NULL, *unknown = json_array();
    if (rc == PV_OK && !unknown) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) rc = svc_relay_group_by_node(rl, ids, n_ids, &by_node, unknown, st);
    if (rc == PV_OK) rc = answer_unknown(call, rl, unknown, NULL, rc, st);
    json_decref(unknown);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        json_t *params = json_pack("{s:O, s:O}", "ids", node_ids, "files", files);
        rc = params ? svc_relay_submit_child(call, rl, PV_KIND_SEND_NODE, node, params, node_ids,
                                             SVC_RELAY_SEND, st)
                    : pv_status_set(st, PV_INTERNAL, "out of memory");
        json_decref(params);
    }
    json_decref(by_node);
    svc_relay_finish(call, rl, rc, st, eru, "Send");
}

/* Send: every file into every workload; a file without a mode is written 0755 (Eru's).
 * Follows Eru's calcium.Send: a workload it cannot get is its message's error, the call OK. */
static void on_send(gw_call *call, const ProtobufCMessage *req) {
    const Pb__SendOptions *o = (const Pb__SendOptions *)req;
    if (o->n_ids == 0 || o->n_data == 0) {
        gw_call_finish(call, ERU_SEND,
                       o->n_ids ? "data: no files to send" : "IDs: no workload ids given");
        return;
    }
    pv_status st;
    for (size_t i = 0; i < o->n_modes; i++)
        if (o->modes[i]->value &&
            pv_deploy_check_mode("modes", o->modes[i]->value->mode, &st) != PV_OK) {
            gw_call_finishf(call, ERU_SEND, "%s (file %s)", st.msg, o->modes[i]->key);
            return;
        }
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, NULL);
    json_t *files = json_array();
    int rc = files ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < o->n_data; i++) {
        const Pb__SendOptions__DataEntry *d = o->data[i];
        char *b64 = NULL;
        if ((rc = pv_b64_encode(d->value.data, d->value.len, &b64, &st)) != PV_OK) break;
        json_t *f = json_pack("{s:s, s:s, s:i}", "path", d->key, "data", b64, "mode", 0755);
        free(b64);
        for (size_t j = 0; f && j < o->n_modes; j++) {
            const Pb__SendOptions__ModesEntry *m = o->modes[j];
            if (strcmp(m->key, d->key) == 0 && m->value)
                json_object_set_new(f, "mode", json_integer(m->value->mode));
        }
        for (size_t j = 0; f && j < o->n_owners; j++) {
            const Pb__SendOptions__OwnersEntry *w = o->owners[j];
            if (strcmp(w->key, d->key) == 0 && w->value) {
                json_object_set_new(f, "uid", json_integer(w->value->uid));
                json_object_set_new(f, "gid", json_integer(w->value->gid));
            }
        }
        if (!f || json_array_append_new(files, f) != 0)
            rc = pv_status_set(&st, PV_INTERNAL, "out of memory");
    }
    send_files(call, &rl, rc, &st, o->ids, o->n_ids, files, ERU_SEND);
    json_decref(files);
}

/* SendLargeFile: the client streams each file in chunks (FileOptions: ids, dst, size, mode,
 * owner, chunk); at the half-close every file is sent as Send sends (default mode 0755). The
 * files are held in memory until then, so each is bounded by gateway.max_upload_bytes in
 * total. */
typedef struct large_send {
    char **ids;
    size_t n_ids;
    char **paths;
    unsigned char **bufs;
    size_t *lens, *caps;
    int *modes, *uids, *gids;
    size_t n;
    size_t total;
    bool failed;
} large_send;

static void large_send_free(void *p) {
    large_send *ls = p;
    if (!ls) return;
    for (size_t i = 0; i < ls->n_ids; i++)
        free(ls->ids[i]);
    for (size_t i = 0; i < ls->n; i++) {
        free(ls->paths[i]);
        free(ls->bufs[i]);
    }
    free(ls->ids);
    free(ls->paths);
    free(ls->bufs);
    free(ls->lens);
    free(ls->caps);
    free(ls->modes);
    free(ls->uids);
    free(ls->gids);
    free(ls);
}

static int large_file(large_send *ls, const char *dst) {
    for (size_t i = 0; i < ls->n; i++)
        if (strcmp(ls->paths[i], dst) == 0) return (int)i;
    size_t n = ls->n + 1;
    char **paths = realloc(ls->paths, n * sizeof *paths);
    if (paths) ls->paths = paths;
    unsigned char **bufs = realloc(ls->bufs, n * sizeof *bufs);
    if (bufs) ls->bufs = bufs;
    size_t *lens = realloc(ls->lens, n * sizeof *lens);
    if (lens) ls->lens = lens;
    size_t *caps = realloc(ls->caps, n * sizeof *caps);
    if (caps) ls->caps = caps;
    int *modes = realloc(ls->modes, n * sizeof *modes);
    if (modes) ls->modes = modes;
    int *uids = realloc(ls->uids, n * sizeof *uids);
    if (uids) ls->uids = uids;
    int *gids = realloc(ls->gids, n * sizeof *gids);
    if (gids) ls->gids = gids;
    if (!paths || !bufs || !lens || !caps || !modes || !uids || !gids) return -1;
    if (!(ls->paths[ls->n] = strdup(dst))) return -1;
    ls->bufs[ls->n] = NULL;
    ls->lens[ls->n] = ls->caps[ls->n] = 0;
    ls->modes[ls->n] = 0755;
    ls->uids[ls->n] = -1;
    ls->gids[ls->n] = -1;
    return (int)ls->n++;
}

/* Follows Eru's calcium.SendLargeFile: a workload it cannot get is its message's error. */
static void on_send_large_file(gw_call *call, const ProtobufCMessage *msg) {
    large_send *ls = gw_call_user(call);
    if (!ls) {
        if (!(ls = calloc(1, sizeof *ls))) {
            gw_call_finish(call, ERU_SEND_LARGE_FILE, "out of memory");
            return;
        }
        gw_call_set_user(call, ls, large_send_free);
    }
    if (ls->failed) return;
    if (msg) {
        const Pb__FileOptions *f = (const Pb__FileOptions *)msg;
        if (ls->n_ids == 0 && f->n_ids > 0) {
            ls->ids = calloc(f->n_ids, sizeof *ls->ids);
            for (size_t i = 0; ls->ids && i < f->n_ids; i++)
                ls->ids[ls->n_ids++] = strdup(f->ids[i]);
        }
        int i = f->dst && *f->dst ? large_file(ls, f->dst) : -2;
        const char *err = i == -2 ? "dst: required in every chunk" : i < 0 ? "out of memory" : NULL;
        size_t limit = ((gw_app *)gw_call_app(call))->cfg.gateway.max_upload_bytes;
        if (!err && ls->total + f->chunk.len > limit)
            err = "files larger than gateway.max_upload_bytes";
        pv_status mst;
        if (!err && f->mode && pv_deploy_check_mode("mode", f->mode->mode, &mst) != PV_OK)
            err = mst.msg;
        if (!err && f->mode) ls->modes[i] = (int)f->mode->mode;
        if (!err && f->owner) {
            ls->uids[i] = f->owner->uid;
            ls->gids[i] = f->owner->gid;
        }
        if (!err && ls->lens[i] + f->chunk.len > ls->caps[i]) {
            size_t cap = ls->caps[i] ? ls->caps[i] : 65536;
            while (cap < ls->lens[i] + f->chunk.len)
                cap *= 2;
            unsigned char *b = realloc(ls->bufs[i], cap);
            if (!b)
                err = "out of memory";
            else {
                ls->bufs[i] = b;
                ls->caps[i] = cap;
            }
        }
        if (err) {
            ls->failed = true;
            gw_call_finishf(call, ERU_SEND_LARGE_FILE, "%s", err);
            return;
        }
        if (f->chunk.len) memcpy(ls->bufs[i] + ls->lens[i], f->chunk.data, f->chunk.len);
        ls->lens[i] += f->chunk.len;
        ls->total += f->chunk.len;
        return;
    }
    /* half-close: send what came */
    if (ls->n_ids == 0 || ls->n == 0) {
        gw_call_finish(call, ERU_SEND_LARGE_FILE,
                       ls->n_ids ? "no files to send" : "ids: no workload ids given");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, NULL);
    json_t *files = json_array();
    pv_status st;
    int rc = files ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < ls->n; i++) {
        char *b64 = NULL;
        if ((rc = pv_b64_encode(ls->bufs[i] ? (const void *)ls->bufs[i] : "", ls->lens[i], &b64,
                                &st)) != PV_OK)
            break;
        json_t *f =
            json_pack("{s:s, s:s, s:i}", "path", ls->paths[i], "data", b64, "mode", ls->modes[i]);
        free(b64);
        if (f && ls->uids[i] >= 0) {
            json_object_set_new(f, "uid", json_integer(ls->uids[i]));
            json_object_set_new(f, "gid", json_integer(ls->gids[i]));
        }
        if (!f || json_array_append_new(files, f) != 0)
            rc = pv_status_set(&st, PV_INTERNAL, "out of memory");
    }
    send_files(call, &rl, rc, &st, ls->ids, ls->n_ids, files, ERU_SEND_LARGE_FILE);
    json_decref(files);
}

/* Copy: a tar archive of each path of each workload, relayed in the node's 4 KiB chunks.
 * Follows Eru's calcium.Copy: a workload it cannot get is an error message per path asked. */
static void on_copy(gw_call *call, const ProtobufCMessage *req) {
    const Pb__CopyOptions *o = (const Pb__CopyOptions *)req;
    if (o->n_targets == 0) {
        gw_call_finish(call, ERU_COPY, "targets: no files to copy");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    svc_relay rl;
    svc_relay_init(&rl, call, r, NULL);
    char **ids = calloc(o->n_targets, sizeof *ids);
    json_t *by_node = NULL;
    pv_status st;
    int rc = ids ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < o->n_targets; i++) {
        ids[i] = o->targets[i]->key;
        if (!o->targets[i]->value || o->targets[i]->value->n_paths == 0)
            rc = pv_status_set(&st, PV_INVALID_ARGUMENT, "targets[%s]: no paths to copy", ids[i]);
    }
    json_t *unknown = json_array();
    if (rc == PV_OK && !unknown) rc = pv_status_set(&st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) rc = svc_relay_group_by_node(&rl, ids, o->n_targets, &by_node, unknown, &st);
    if (rc == PV_OK) rc = answer_unknown(call, &rl, unknown, o, rc, &st);
    json_decref(unknown);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        json_t *targets = json_object();
        size_t i;
        json_t *id;
        json_array_foreach(node_ids, i, id) {
            for (size_t t = 0; t < o->n_targets; t++) {
                if (strcmp(o->targets[t]->key, json_string_value(id)) != 0) continue;
                json_t *paths = json_array();
                for (size_t p = 0; p < o->targets[t]->value->n_paths; p++)
                    json_array_append_new(paths, json_string(o->targets[t]->value->paths[p]));
                json_object_set_new(targets, json_string_value(id), paths);
            }
        }
        json_t *params = json_pack("{s:o}", "targets", targets);
        rc = params ? svc_relay_submit_child(call, &rl, PV_KIND_COPY_NODE, node, params, node_ids,
                                             SVC_RELAY_COPY, &st)
                    : pv_status_set(&st, PV_INTERNAL, "out of memory");
        json_decref(params);
    }
    json_decref(by_node);
    free(ids);
    svc_relay_finish(call, &rl, rc, &st, ERU_COPY, "Copy");
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/Send", GW_SERVER_STREAM, &pb__send_options__descriptor, on_send, ERU_SEND, true},
    {"/pb.CoreRPC/Copy", GW_SERVER_STREAM, &pb__copy_options__descriptor, on_copy, ERU_COPY, true},
    {"/pb.CoreRPC/SendLargeFile", GW_BIDI_STREAM, &pb__file_options__descriptor, on_send_large_file,
     ERU_SEND_LARGE_FILE, true},
};

int svc_core_files_register(svc_core_files *s, gw_server *server) {
    if (svc_eru_register(server, k_methods, N_METHODS, s->methods, s) != 0) return -1;
    s->methods[0].upload = true; /* Send: its files, bounded by gateway.max_upload_bytes */
    return 0;
}
