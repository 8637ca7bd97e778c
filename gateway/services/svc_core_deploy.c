/*
 * svc_core_deploy: CreateWorkload (see svc_core_deploy.h).
 *
 * The relay follows the parent operation's output for the announcements of its children
 * ({type=node, node, op}; repeated announcements after a redelivery are the same child) and each
 * child's output for its instances. It polls, with short blocking reads, from the handler's pool
 * thread: a deploy holds one gateway thread while it runs.
 */
#include "svc_core_deploy.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pb/core.pb-c.h"
#include "pv_b64.h"
#include "pv_deploy.h"
#include "pv_id.h"
#include "pv_log.h"
#include "pv_op.h"
#include "pv_resv.h"
#include "pv_workload.h"
#include "svc_eru.h"
#include "svc_nodeop.h"
#include "pv_time.h"

#define N_METHODS 9
#define MAX_CHILDREN 4096
/* How long a relay sleeps in XREAD for news of its operations. Their streams' end entries wake
 * it when they finish; this bounds the wait for an operation that ends without output (its
 * status is read again each time). */
#define WAIT_MS 200

struct svc_core_deploy {
    gw_app *app;
    atomic_int sessions; /* interactive ExecuteWorkload sessions running */
    gw_method methods[N_METHODS];
    gw_method run_and_wait, execute, send_large_file;
};

svc_core_deploy *svc_core_deploy_new(gw_app *app) {
    svc_core_deploy *s = calloc(1, sizeof *s);
    if (s) s->app = app;
    return s;
}

void svc_core_deploy_free(svc_core_deploy *s) {
    free(s);
}

typedef enum {
    CHILD_DEPLOY = 0,
    CHILD_REMOVE,
    CHILD_CONTROL,
    CHILD_SEND,
    CHILD_COPY,
    CHILD_REPLACE,
} child_kind;

/* One node's part of the deploy (or removal) as the relay follows it. */
typedef struct child {
    char id[PV_ID_MAX];
    char node[256];
    char after[32]; /* last output entry relayed */
    size_t reported, expected;
    json_t *pending; /* per-id calls: the ids not answered yet (id -> true); else NULL */
    json_t *seen;    /* deploys: the instances (allocation ids) told already */
    int kind;        /* child_kind: what a lost id is answered with */
    bool done;
    bool checked;      /* its record was read at least once (expected is known) */
    bool ended;        /* its output's end entry came: its record is final */
    bool idle;         /* the last wait saw nothing new in its output: no need to read it */
    pv_op_output *pre; /* what the last wait read of its output: relayed instead of a read */
    size_t npre;
    bool fetched; /* pre is all its output had after `after` when the wait read it */
} child;

typedef struct relay {
    gw_call *call;
    pv_redis *r;
    const pv_keys *k;
    char parent[PV_ID_MAX];
    char parent_after[32];
    /* what the last wait saw of the parent: nothing new in its output (no announcement to
     * read), its end entry (its record is final: read it) */
    bool parent_idle, parent_ended, parent_checked;
    pv_op_output *parent_pre; /* what the last wait read of the parent's output */
    size_t parent_npre;
    bool parent_fetched; /* parent_pre is all of it after parent_after (as child.fetched) */
    const char *pod;
    child *children;
    size_t n;
    size_t sent, failed;
    size_t plan_nodes; /* creates: the nodes of the plan, as the announcements tell (0: not told) */
    bool quiet;        /* RunAndWait: nothing goes to the client; created instances are kept */
    json_t *created;   /* quiet: [{"id", "node"}] of the instances created */
    json_t *failures;  /* quiet: the errors of the instances that failed */
} relay;

/* Sends m to the client, or keeps quiet (RunAndWait drives its own messages). */
static int relay_send(relay *rl, const ProtobufCMessage *m) {
    return rl->quiet ? 0 : gw_call_send(rl->call, m);
}

/* One instance's message: the fields the agent wrote. */
static int send_instance(relay *rl, const pv_op_output *e) {
    Pb__CreateWorkloadMessage m = PB__CREATE_WORKLOAD_MESSAGE__INIT;
    m.podname = (char *)svc_nodeop_value(e, "podname");
    m.nodename = (char *)svc_nodeop_value(e, "nodename");
    m.id = (char *)svc_nodeop_value(e, "id");
    m.name = (char *)svc_nodeop_value(e, "name");
    m.error = (char *)svc_nodeop_value(e, "error");
    m.success = strcmp(svc_nodeop_value(e, "success"), "1") == 0;
    if (rl->quiet) {
        if (m.success)
            json_array_append_new(rl->created,
                                  json_pack("{s:s, s:s}", "id", m.id, "node", m.nodename));
        else
            json_array_append_new(rl->failures, json_string(m.error));
    }
    m.resources = (char *)svc_nodeop_value(e, "resources");
    const char *hook = svc_nodeop_value(e, "hook");
    m.hook.data = (uint8_t *)hook;
    m.hook.len = strlen(hook);
    json_t *publish = json_loads(svc_nodeop_value(e, "publish"), 0, NULL);
    size_t np = json_is_object(publish) ? json_object_size(publish) : 0;
    Pb__CreateWorkloadMessage__PublishEntry *entries = np ? calloc(np, sizeof *entries) : NULL;
    Pb__CreateWorkloadMessage__PublishEntry **ptrs = np ? calloc(np, sizeof *ptrs) : NULL;
    if (np && entries && ptrs) {
        const char *key;
        json_t *v;
        json_object_foreach(publish, key, v) {
            if (!json_is_string(v)) continue;
            Pb__CreateWorkloadMessage__PublishEntry *pe = &entries[m.n_publish];
            pb__create_workload_message__publish_entry__init(pe);
            pe->key = (char *)key;
            pe->value = (char *)json_string_value(v);
            ptrs[m.n_publish++] = pe;
        }
        m.publish = ptrs;
    }
    int rc = relay_send(rl, &m.base);
    free(entries);
    free(ptrs);
    json_decref(publish);
    rl->sent++;
    if (!m.success) rl->failed++;
    return rc;
}

/* success=false for an instance its node never reported (the node's part failed whole). */
static int send_lost(relay *rl, const child *c, const char *why) {
    Pb__CreateWorkloadMessage m = PB__CREATE_WORKLOAD_MESSAGE__INIT;
    m.podname = (char *)rl->pod;
    m.nodename = (char *)c->node;
    m.error = (char *)why;
    rl->sent++;
    rl->failed++;
    return relay_send(rl, &m.base);
}

static int send_removed(relay *rl, const char *id, bool success, const char *hook) {
    Pb__RemoveWorkloadMessage m = PB__REMOVE_WORKLOAD_MESSAGE__INIT;
    m.id = (char *)id;
    m.success = success;
    m.hook = (char *)hook;
    rl->sent++;
    if (!success) rl->failed++;
    return relay_send(rl, &m.base);
}

static int send_controlled(relay *rl, const char *id, const char *error) {
    Pb__ControlWorkloadMessage m = PB__CONTROL_WORKLOAD_MESSAGE__INIT;
    m.id = (char *)id;
    m.error = (char *)error;
    rl->sent++;
    if (*error) rl->failed++;
    return relay_send(rl, &m.base);
}

static int send_copied(relay *rl, const pv_op_output *e) {
    Pb__CopyMessage m = PB__COPY_MESSAGE__INIT;
    m.id = (char *)svc_nodeop_value(e, "id");
    m.name = (char *)svc_nodeop_value(e, "name");
    m.path = (char *)svc_nodeop_value(e, "path");
    m.error = (char *)svc_nodeop_value(e, "error");
    unsigned char *data = NULL;
    size_t len = 0;
    pv_status st;
    if (*m.error == '\0' &&
        pv_b64_decode("data", svc_nodeop_value(e, "data"), &data, &len, &st) != PV_OK)
        m.error = "the node sent a chunk that is not base64";
    m.data.data = data;
    m.data.len = len;
    rl->sent++;
    if (*m.error) rl->failed++;
    int rc = relay_send(rl, &m.base);
    free(data);
    return rc;
}

/* One replacement: the new workload's CreateWorkloadMessage and the old one's removal. */
static int send_replaced(relay *rl, const pv_op_output *e) {
    Pb__CreateWorkloadMessage c = PB__CREATE_WORKLOAD_MESSAGE__INIT;
    Pb__RemoveWorkloadMessage rm = PB__REMOVE_WORKLOAD_MESSAGE__INIT;
    Pb__ReplaceWorkloadMessage m = PB__REPLACE_WORKLOAD_MESSAGE__INIT;
    c.podname = (char *)svc_nodeop_value(e, "podname");
    c.nodename = (char *)svc_nodeop_value(e, "nodename");
    c.id = (char *)svc_nodeop_value(e, "id");
    c.name = (char *)svc_nodeop_value(e, "name");
    c.error = (char *)svc_nodeop_value(e, "error");
    c.success = strcmp(svc_nodeop_value(e, "success"), "1") == 0;
    rm.id = (char *)svc_nodeop_value(e, "old");
    rm.success = c.success;
    m.create = &c;
    m.remove = &rm;
    m.error = c.error;
    rl->sent++;
    if (!c.success) rl->failed++;
    return relay_send(rl, &m.base);
}

/* An id whose node's part ended without answering for it. */
static int send_lost_id(relay *rl, int kind, const char *id, const char *why) {
    if (kind == CHILD_REPLACE) {
        Pb__RemoveWorkloadMessage rm = PB__REMOVE_WORKLOAD_MESSAGE__INIT;
        Pb__ReplaceWorkloadMessage m = PB__REPLACE_WORKLOAD_MESSAGE__INIT;
        rm.id = (char *)id;
        m.remove = &rm;
        m.error = (char *)why;
        rl->sent++;
        rl->failed++;
        return relay_send(rl, &m.base);
    }
    if (kind == CHILD_CONTROL) return send_controlled(rl, id, why);
    if (kind == CHILD_SEND || kind == CHILD_COPY) {
        rl->sent++;
        rl->failed++;
        if (kind == CHILD_SEND) {
            Pb__SendMessage m = PB__SEND_MESSAGE__INIT;
            m.id = (char *)id;
            m.error = (char *)why;
            return relay_send(rl, &m.base);
        }
        Pb__CopyMessage m = PB__COPY_MESSAGE__INIT;
        m.id = (char *)id;
        m.error = (char *)why;
        return relay_send(rl, &m.base);
    }
    return send_removed(rl, id, false, why);
}

/* How many instances a child was given (its params' allocations). */
static size_t expected_of(const pv_op *rec) {
    json_t *p = json_loads(rec->params, 0, NULL);
    size_t n = json_array_size(json_object_get(p, "allocations"));
    json_decref(p);
    return n;
}

/* A node's part as the parent announced it; instances and nodes ("" when the announcement
 * does not tell: an older worker) make its record's first read needless. */
static int add_child(relay *rl, const char *id, const char *node, const char *instances,
                     const char *nodes, pv_status *st) {
    for (size_t i = 0; i < rl->n; i++)
        if (strcmp(rl->children[i].id, id) == 0) return PV_OK; /* announced again */
    if (rl->n == MAX_CHILDREN)
        return pv_status_set(st, PV_INTERNAL, "too many nodes in one deploy");
    child *cs = realloc(rl->children, (rl->n + 1) * sizeof *cs);
    if (!cs) return pv_status_set(st, PV_INTERNAL, "out of memory");
    rl->children = cs;
    child *c = &cs[rl->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->node, sizeof c->node, "%s", node);
    snprintf(c->after, sizeof c->after, "0");
    if (*instances && *nodes) {
        c->expected = strtoul(instances, NULL, 10);
        c->checked = true;
        rl->plan_nodes = strtoul(nodes, NULL, 10);
    }
    return PV_OK;
}

/* A create whose every instance on every node of the plan has been told, all of them created:
 * nothing more can come, so the client has its answer. What is left of the operations (the
 * node parts' and the deploy's ends, handing back an unused reservation: none when all
 * succeeded) goes on without it. With a failure the relay waits for the ends, so that the
 * failed instances' resources are back before the client hears the last word. */
static bool create_answered(const relay *rl) {
    if (rl->plan_nodes == 0 || rl->n != rl->plan_nodes || rl->failed > 0) return false;
    for (size_t i = 0; i < rl->n; i++) {
        const child *c = &rl->children[i];
        if (!c->checked || c->kind != CHILD_DEPLOY || c->pending || c->reported < c->expected)
            return false;
    }
    return true;
}

/* An operation's output after `after`: what the last wait read of it (*pre, taken over: the
 * caller frees *out) when that was all of it (*fetched), else a read. */
static int take_output(relay *rl, const char *op_id, const char *after, pv_op_output **pre,
                       size_t *npre, bool *fetched, pv_op_output **out, size_t *n, pv_status *st) {
    *out = *pre;
    *n = *npre;
    bool had = *fetched;
    *pre = NULL;
    *npre = 0;
    *fetched = false;
    if (had) return PV_OK;
    pv_op_output_free(*out, *n);
    *out = NULL;
    *n = 0;
    return pv_op_output_read(rl->r, rl->k, op_id, after, 100, 0, out, n, st);
}

static int read_announcements(relay *rl, pv_status *st) {
    pv_op_output *out = NULL;
    size_t n = 0;
    if (take_output(rl, rl->parent, rl->parent_after, &rl->parent_pre, &rl->parent_npre,
                    &rl->parent_fetched, &out, &n, st) != PV_OK)
        return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        snprintf(rl->parent_after, sizeof rl->parent_after, "%s", out[i].id);
        if (strcmp(svc_nodeop_value(&out[i], "type"), "node") == 0)
            rc = add_child(rl, svc_nodeop_value(&out[i], "op"), svc_nodeop_value(&out[i], "node"),
                           svc_nodeop_value(&out[i], "instances"),
                           svc_nodeop_value(&out[i], "nodes"), st);
    }
    pv_op_output_free(out, n);
    return rc;
}

/* Relays what a child has written; marks it done when it has finished and nothing is left. */
static int follow_child(relay *rl, child *c, bool check, pv_status *st) {
    pv_op rec = {0};
    bool over = false;
    /* Nothing new since the last read, as the wait saw: nothing to read (check: read anyway) */
    if (!check && c->idle && !c->fetched && c->checked && !c->ended) return PV_OK;
    /* The record matters only once (how many instances) and at the end; in between the output
     * says everything. check: read it anyway (a child may end without output). */
    if (check || c->ended || !c->checked) {
        if (pv_op_get(rl->r, rl->k, c->id, &rec, st) != PV_OK) return st->code;
        over = rec.status == PV_OP_SUCCEEDED || rec.status == PV_OP_FAILED ||
               rec.status == PV_OP_CANCELLED;
        if (!c->checked) c->expected = expected_of(&rec);
        c->checked = true;
    }
    pv_op_output *out = NULL;
    size_t n = 0;
    int rc = take_output(rl, c->id, c->after, &c->pre, &c->npre, &c->fetched, &out, &n, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        snprintf(c->after, sizeof c->after, "%s", out[i].id);
        const char *type = svc_nodeop_value(&out[i], "type");
        int sent = 0;
        if (strcmp(type, "workload") == 0) {
            /* a redelivered child may write an instance's entry again: it is told once */
            const char *alloc = svc_nodeop_value(&out[i], "alloc");
            if (*alloc) {
                if (!c->seen) c->seen = json_object();
                if (json_object_get(c->seen, alloc)) continue;
                json_object_set_new(c->seen, alloc, json_true());
            }
            sent = send_instance(rl, &out[i]);
        } else if (strcmp(type, "controlled") == 0 && c->pending) {
            const char *wid = svc_nodeop_value(&out[i], "id");
            if (!json_object_get(c->pending, wid)) continue;
            json_object_del(c->pending, wid);
            sent = send_controlled(rl, wid, svc_nodeop_value(&out[i], "error"));
        } else if (strcmp(type, "sent") == 0 && c->pending) {
            json_object_del(c->pending, svc_nodeop_value(&out[i], "id"));
            Pb__SendMessage m = PB__SEND_MESSAGE__INIT;
            m.id = (char *)svc_nodeop_value(&out[i], "id");
            m.path = (char *)svc_nodeop_value(&out[i], "path");
            m.error = (char *)svc_nodeop_value(&out[i], "error");
            rl->sent++;
            if (*m.error) rl->failed++;
            sent = relay_send(rl, &m.base);
        } else if (strcmp(type, "replaced") == 0 && c->pending) {
            const char *old = svc_nodeop_value(&out[i], "old");
            if (!json_object_get(c->pending, old)) continue;
            json_object_del(c->pending, old);
            sent = send_replaced(rl, &out[i]);
        } else if (strcmp(type, "copied") == 0 && c->pending) {
            json_object_del(c->pending, svc_nodeop_value(&out[i], "id"));
            sent = send_copied(rl, &out[i]);
        } else if (strcmp(type, "removed") == 0 && c->pending) {
            const char *wid = svc_nodeop_value(&out[i], "id");
            if (!json_object_get(c->pending, wid)) continue; /* told already */
            json_object_del(c->pending, wid);
            sent = send_removed(rl, wid, strcmp(svc_nodeop_value(&out[i], "success"), "1") == 0,
                                svc_nodeop_value(&out[i], "hook"));
        } else {
            continue;
        }
        c->reported++;
        if (sent != 0) rc = pv_status_set(st, PV_CANCELLED, "client gone");
    }
    pv_op_output_free(out, n);
    c->idle = !(over && n > 0); /* over but not drained: read again at once */
    if (rc == PV_OK && over && n == 0) {
        /* Finished and drained: instances it never reported failed with it. */
        char why[PV_STATUS_MSG_MAX + 64];
        snprintf(why, sizeof why, "node %s: %s", c->node,
                 rec.error_message && *rec.error_message ? rec.error_message
                                                         : "the node's part of the deploy ended "
                                                           "without reporting this instance");
        if (c->pending) {
            const char *wid;
            json_t *v;
            json_object_foreach(c->pending, wid, v) {
                int sent = send_lost_id(rl, c->kind, wid, why);
                if (rc == PV_OK && sent != 0) rc = pv_status_set(st, PV_CANCELLED, "client gone");
            }
            json_object_clear(c->pending);
        } else {
            for (; rc == PV_OK && c->reported < c->expected; c->reported++)
                if (send_lost(rl, c, why) != 0) rc = pv_status_set(st, PV_CANCELLED, "client gone");
        }
        c->done = true;
    }
    pv_op_clear(&rec);
    return rc;
}

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

/* Sleeps until the parent (when with_parent) or a child not done yet writes something or ends,
 * WAIT_MS at most: the relay's cursors stay where they are, the reads that follow move them. */
static int wait_news(relay *rl, bool with_parent, bool *woke, pv_status *st) {
    size_t n = 0;
    const char **ids = calloc(rl->n + 1, sizeof *ids);
    char(*cursors)[PV_OP_CURSOR_MAX] = calloc(rl->n + 1, sizeof *cursors);
    bool *ended = calloc(rl->n + 1, sizeof *ended);
    size_t *idx = calloc(rl->n + 1, sizeof *idx);
    pv_op_output **got = calloc(rl->n + 1, sizeof *got);
    size_t *ngot = calloc(rl->n + 1, sizeof *ngot);
    *woke = false;
    if (!ids || !cursors || !ended || !idx || !got || !ngot) {
        free(ids);
        free(cursors);
        free(ended);
        free(idx);
        free(got);
        free(ngot);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (with_parent) {
        ids[n] = rl->parent;
        snprintf(cursors[n++], PV_OP_CURSOR_MAX, "%s", rl->parent_after);
    }
    size_t first_child = n;
    for (size_t i = 0; i < rl->n; i++)
        if (!rl->children[i].done) {
            ids[n] = rl->children[i].id;
            idx[n] = i;
            snprintf(cursors[n++], PV_OP_CURSOR_MAX, "%s", rl->children[i].after);
        }
    int rc = n ? pv_op_output_wait_entries(rl->r, rl->k, n, ids, cursors, WAIT_MS, woke, ended, got,
                                           ngot, st)
               : PV_OK;
    /* the wait moved the cursors of the streams that had news, and read their entries: the
     * reads that follow take those, the streams without news need no read */
    if (rc == PV_OK && with_parent) {
        rl->parent_idle = strcmp(cursors[0], rl->parent_after) == 0;
        rl->parent_ended = rl->parent_ended || ended[0];
        pv_op_output_free(rl->parent_pre, rl->parent_npre);
        rl->parent_pre = got[0];
        rl->parent_npre = ngot[0];
        rl->parent_fetched = !rl->parent_idle && ngot[0] < 100;
        got[0] = NULL;
    }
    for (size_t j = first_child; rc == PV_OK && j < n; j++) {
        child *c = &rl->children[idx[j]];
        c->ended = c->ended || ended[j];
        c->idle = strcmp(cursors[j], c->after) == 0;
        pv_op_output_free(c->pre, c->npre);
        c->pre = got[j];
        c->npre = ngot[j];
        c->fetched = !c->idle && ngot[j] < 100;
        got[j] = NULL;
    }
    for (size_t j = 0; j < n; j++)
        pv_op_output_free(got[j], ngot[j]);
    free(got);
    free(ngot);
    free(ids);
    free(cursors);
    free(ended);
    free(idx);
    return rc;
}

/* Relays until the deploy and every node's part are over. PV_OK: the call is finished with OK;
 * else the call's error in st (a deploy that failed before asking any node). */
static int relay_all(relay *rl, pv_status *st) {
    bool check = true; /* read every child's record: no news came, or a second passed */
    int64_t last_check = 0;
    for (;;) {
        if (gw_call_is_closed(rl->call)) return pv_status_set(st, PV_CANCELLED, "client gone");
        pv_op parent = {0};
        bool over = true, has_parent = rl->parent[0] != '\0';
        /* the parent's record says whether it is over: read when its end entry came (or at a
         * check), not on every news of its children */
        if (has_parent && (check || rl->parent_ended || !rl->parent_checked)) {
            if (pv_op_get(rl->r, rl->k, rl->parent, &parent, st) != PV_OK) return st->code;
            over = parent.status == PV_OP_SUCCEEDED || parent.status == PV_OP_FAILED ||
                   parent.status == PV_OP_CANCELLED;
            rl->parent_checked = true;
        } else if (has_parent) {
            over = false;
        }
        int rc = has_parent && (check || !rl->parent_idle) ? read_announcements(rl, st) : PV_OK;
        rl->parent_idle = true;
        bool all_done = true;
        for (size_t i = 0; rc == PV_OK && i < rl->n; i++)
            if (!rl->children[i].done) {
                rc = follow_child(rl, &rl->children[i], check, st);
                all_done = all_done && rl->children[i].done;
            }
        if (rc == PV_OK && !all_done && create_answered(rl)) {
            pv_op_clear(&parent);
            return PV_OK;
        }
        if (rc == PV_OK && over && all_done) {
            if (has_parent && parent.status != PV_OP_SUCCEEDED && rl->n == 0)
                rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s",
                                   parent.error_message && *parent.error_message
                                       ? parent.error_message
                                       : "deploy failed");
            pv_op_clear(&parent);
            return rc;
        }
        pv_op_clear(&parent);
        if (rc != PV_OK) return rc;
        if (check) last_check = mono_ms();
        bool woke;
        if (wait_news(rl, has_parent && !over, &woke, st) != PV_OK) return st->code;
        check = !woke || mono_ms() - last_check >= 1000;
    }
}

static int submit(gw_call *call, const Pb__DeployOptions *o, char *op_id, pv_status *st) {
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    size_t len = pb__deploy_options__get_packed_size(o);
    uint8_t *bytes = malloc(len ? len : 1);
    if (!bytes) return pv_status_set(st, PV_INTERNAL, "out of memory");
    pb__deploy_options__pack(o, bytes);
    char *b64 = NULL;
    int rc = pv_b64_encode(bytes, len, &b64, st);
    free(bytes);
    if (rc != PV_OK) return rc;
    json_t *params = json_pack("{s:s}", "deploy", b64);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    free(b64);
    char target[PV_ID_MAX];
    pv_id_new("deploy", target, sizeof target);
    pv_op_submit_req req = {
        .kind = "workload.create",
        .target = target,
        .queue = "ops",
        .params_json = text,
        .request_id = gw_call_has_client_request_id(call) ? gw_call_request_id(call) : NULL,
    };
    gw_app_count_client(call, &req);
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    pv_op rec;
    bool existed = false;
    rc = text ? pv_op_submit(gw_app_redis(call), &app->keys, &oo, &req, &rec, &existed, st)
              : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(text);
    if (rc != PV_OK) return rc;
    snprintf(op_id, PV_ID_MAX, "%s", rec.id);
    pv_info("CreateWorkload app=%s pod=%s count=%d operation=%s%s", o->name, o->podname,
            (int)o->count, rec.id, existed ? " (existing, same x-request-id)" : "");
    pv_op_clear(&rec);
    return PV_OK;
}

static void relay_free(relay *rl) {
    for (size_t i = 0; i < rl->n; i++) {
        json_decref(rl->children[i].pending);
        json_decref(rl->children[i].seen);
        pv_op_output_free(rl->children[i].pre, rl->children[i].npre);
    }
    free(rl->children);
    pv_op_output_free(rl->parent_pre, rl->parent_npre);
    rl->parent_pre = NULL;
}

static void on_create_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__DeployOptions *o = (const Pb__DeployOptions *)req;
    pv_status st;
    if (pv_deploy_check(o, &st) != PV_OK) {
        gw_call_finishf(call, ERU_CREATE_WORKLOAD, "%s", st.msg);
        return;
    }
    pv_redis *r = gw_app_redis(call);
    if (!r) {
        gw_call_finish(call, ERU_CREATE_WORKLOAD, "no Redis connection on this gateway thread");
        return;
    }
    relay rl = {.call = call, .r = r, .pod = o->podname};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
    snprintf(rl.parent_after, sizeof rl.parent_after, "0");
    int rc = submit(call, o, rl.parent, &st);
    if (rc == PV_OK) rc = relay_all(&rl, &st);
    if (rc == PV_OK) {
        pv_info("CreateWorkload operation=%s: %zu instance(s) answered, %zu failed", rl.parent,
                rl.sent, rl.failed);
        gw_call_finish(call, PV_OK, NULL);
    } else if (rc != PV_CANCELLED) {
        gw_call_finishf(call, ERU_CREATE_WORKLOAD, "%s", st.msg);
    }
    relay_free(&rl);
}

/* One node's part of a call: an operation of kind on that node's queue with params (borrowed),
 * followed like a deploy's child; ids (borrowed) are the workloads it answers for. */
static int submit_child(gw_call *call, relay *rl, const char *kind, const char *node,
                        json_t *params, json_t *ids, child_kind ck, pv_status *st) {
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    char *text = json_dumps(params, JSON_COMPACT);
    char queue[300], target[PV_ID_MAX];
    snprintf(queue, sizeof queue, "node:%s", node);
    pv_id_new("wlop", target, sizeof target);
    pv_op_submit_req req = {.kind = kind, .target = target, .queue = queue, .params_json = text};
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    pv_op rec;
    bool existed = false;
    int rc = text ? pv_op_submit(rl->r, rl->k, &oo, &req, &rec, &existed, st)
                  : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(text);
    if (rc == PV_OK) rc = add_child(rl, rec.id, node, "", "", st);
    if (rc == PV_OK) {
        child *c = &rl->children[rl->n - 1];
        c->pending = json_object();
        size_t i;
        json_t *v;
        json_array_foreach(ids, i, v)
            json_object_set(c->pending, json_string_value(v), json_true());
        c->expected = json_array_size(ids);
        c->kind = ck;
        pv_op_clear(&rec);
    }
    return rc;
}

/* Removal or control of the ids on one node. type NULL: a removal. */
static int submit_node_op(gw_call *call, relay *rl, const char *kind, const char *node, json_t *ids,
                          const char *type, bool force, pv_status *st) {
    json_t *params = json_pack("{s:O, s:b}", "ids", ids, "force", force);
    if (!params) return pv_status_set(st, PV_INTERNAL, "out of memory");
    if (type) json_object_set_new(params, "type", json_string(type));
    int rc =
        submit_child(call, rl, kind, node, params, ids, type ? CHILD_CONTROL : CHILD_REMOVE, st);
    json_decref(params);
    return rc;
}

/* Eru looks every workload up first: an unknown id fails the call before anything changes.
 * *by_node: node name -> array of the ids there. */
static int group_by_node(relay *rl, char **ids, size_t n, json_t **by_node, pv_status *st) {
    *by_node = json_object();
    int rc = *by_node ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        pv_workload w;
        if ((rc = pv_workload_get(rl->r, rl->k, ids[i], &w, st)) != PV_OK) break;
        json_t *list = json_object_get(*by_node, w.node);
        if (!list) json_object_set_new(*by_node, w.node, list = json_array());
        json_array_append_new(list, json_string(w.id));
        pv_workload_clear(&w);
    }
    return rc;
}

/* Finishes a per-node call after its children are submitted (or it failed submitting). */
static void finish_relay(gw_call *call, relay *rl, int rc, pv_status *st, int eru,
                         const char *what) {
    if (rc == PV_OK) rc = relay_all(rl, st);
    if (rc == PV_OK) {
        pv_info("%s: %zu answered, %zu failed", what, rl->sent, rl->failed);
        gw_call_finish(call, PV_OK, NULL);
    } else if (rc != PV_CANCELLED) {
        gw_call_finishf(call, eru, "%s", st->msg);
    }
    relay_free(rl);
}

/* RemoveWorkload and ControlWorkload: the ids grouped by node (an unknown id fails the call
 * first), one operation of kind per node, one answer per id. type NULL: a removal. */
static void ids_on_nodes(gw_call *call, char **ids, size_t n_ids, const char *kind,
                         const char *type, bool force, int eru, const char *what) {
    if (n_ids == 0) {
        gw_call_finish(call, eru, "IDs: no workload ids given");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    if (!r) {
        gw_call_finish(call, eru, "no Redis connection on this gateway thread");
        return;
    }
    relay rl = {.call = call, .r = r};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
    json_t *by_node = NULL;
    pv_status st;
    int rc = group_by_node(&rl, ids, n_ids, &by_node, &st);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        rc = submit_node_op(call, &rl, kind, node, node_ids, type, force, &st);
    }
    json_decref(by_node);
    finish_relay(call, &rl, rc, &st, eru, what);
}

static void on_control_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ControlWorkloadOptions *o = (const Pb__ControlWorkloadOptions *)req;
    static const char *const types[] = {"start", "stop", "restart", "suspend", "resume"};
    bool known = false;
    for (size_t i = 0; o->type && i < sizeof types / sizeof types[0]; i++)
        known = known || strcmp(o->type, types[i]) == 0;
    if (!known) {
        gw_call_finishf(call, ERU_CONTROL_WORKLOAD,
                        "type: \"%s\" is not start, stop, restart, suspend or resume",
                        o->type ? o->type : "");
        return;
    }
    ids_on_nodes(call, o->ids, o->n_ids, "workload.control_on_node", o->type, o->force,
                 ERU_CONTROL_WORKLOAD, "ControlWorkload");
}

static void on_remove_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__RemoveWorkloadOptions *o = (const Pb__RemoveWorkloadOptions *)req;
    ids_on_nodes(call, o->ids, o->n_ids, "workload.remove_on_node", NULL, o->force,
                 ERU_REMOVE_WORKLOAD, "RemoveWorkload");
}

/* Sends files (borrowed: [{path, data (base64), mode, uid, gid}]) into the workloads ids, one
 * operation per node, relaying one SendMessage per workload and file; finishes the call. */
static void send_files(gw_call *call, relay *rl, int rc, pv_status *st, char **ids, size_t n_ids,
                       json_t *files, int eru) {
    json_t *by_node = NULL;
    if (rc == PV_OK) rc = group_by_node(rl, ids, n_ids, &by_node, st);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        json_t *params = json_pack("{s:O, s:O}", "ids", node_ids, "files", files);
        rc = params ? submit_child(call, rl, "workload.send_on_node", node, params, node_ids,
                                   CHILD_SEND, st)
                    : pv_status_set(st, PV_INTERNAL, "out of memory");
        json_decref(params);
    }
    json_decref(by_node);
    finish_relay(call, rl, rc, st, eru, "Send");
}

/* Send: every file into every workload; a file without a mode is written 0755 (Eru's). */
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
    if (!r) {
        gw_call_finish(call, ERU_SEND, "no Redis connection on this gateway thread");
        return;
    }
    relay rl = {.call = call, .r = r};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
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
 * files are held in memory until then, so each is bounded by gateway.max_request_bytes in
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
        size_t limit =
            ((svc_core_deploy *)gw_call_method_data(call))->app->cfg.gateway.max_request_bytes;
        if (!err && ls->total + f->chunk.len > limit)
            err = "files larger than gateway.max_request_bytes";
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
    if (!r) {
        gw_call_finish(call, ERU_SEND_LARGE_FILE, "no Redis connection on this gateway thread");
        return;
    }
    relay rl = {.call = call, .r = r};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
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

/* Copy: a tar archive of each path of each workload, relayed in the node's 4 KiB chunks. */
static void on_copy(gw_call *call, const ProtobufCMessage *req) {
    const Pb__CopyOptions *o = (const Pb__CopyOptions *)req;
    if (o->n_targets == 0) {
        gw_call_finish(call, ERU_COPY, "targets: no files to copy");
        return;
    }
    pv_redis *r = gw_app_redis(call);
    if (!r) {
        gw_call_finish(call, ERU_COPY, "no Redis connection on this gateway thread");
        return;
    }
    relay rl = {.call = call, .r = r};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
    char **ids = calloc(o->n_targets, sizeof *ids);
    json_t *by_node = NULL;
    pv_status st;
    int rc = ids ? PV_OK : pv_status_set(&st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < o->n_targets; i++) {
        ids[i] = o->targets[i]->key;
        if (!o->targets[i]->value || o->targets[i]->value->n_paths == 0)
            rc = pv_status_set(&st, PV_INVALID_ARGUMENT, "targets[%s]: no paths to copy", ids[i]);
    }
    if (rc == PV_OK) rc = group_by_node(&rl, ids, o->n_targets, &by_node, &st);
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
        rc = params ? submit_child(call, &rl, "workload.copy_on_node", node, params, node_ids,
                                   CHILD_COPY, &st)
                    : pv_status_set(&st, PV_INTERNAL, "out of memory");
        json_decref(params);
    }
    json_decref(by_node);
    free(ids);
    finish_relay(call, &rl, rc, &st, ERU_COPY, "Copy");
}

/* The deltas that take allocation `to` back to `from` (numbers: realloc's own documents). */
static char *inverse_delta(const char *from, const char *to) {
    static const char *const cpumem[][2] = {{"cpu-request", "cpu_request"},
                                            {"cpu-limit", "cpu_limit"},
                                            {"memory-request", "memory_request"},
                                            {"memory-limit", "memory_limit"}};
    json_t *a = json_loads(from, 0, NULL), *b = json_loads(to, 0, NULL);
    json_t *d = json_pack("{s:{}, s:{}}", "cpumem", "storage");
    for (size_t i = 0; d && i < 4; i++) {
        double x = json_number_value(json_object_get(json_object_get(a, "cpumem"), cpumem[i][1]));
        double y = json_number_value(json_object_get(json_object_get(b, "cpumem"), cpumem[i][1]));
        json_object_set_new(json_object_get(d, "cpumem"), cpumem[i][0], json_real(x - y));
    }
    static const char *const storage[][2] = {{"storage-request", "storage_request"},
                                             {"storage-limit", "storage_limit"}};
    for (size_t i = 0; d && i < 2; i++) {
        double x = json_number_value(json_object_get(json_object_get(a, "storage"), storage[i][1]));
        double y = json_number_value(json_object_get(json_object_get(b, "storage"), storage[i][1]));
        json_object_set_new(json_object_get(d, "storage"), storage[i][0], json_real(x - y));
    }
    char *text = d ? json_dumps(d, JSON_COMPACT) : NULL;
    json_decref(a);
    json_decref(b);
    json_decref(d);
    return text;
}

/* ReallocResource in place: the accounting first (it is the capacity check), then the engine's
 * limits on the node; when the node cannot apply them, the accounting is put back. */
static void on_realloc_resource(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ReallocOptions *o = (const Pb__ReallocOptions *)req;
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *delta = NULL, *fresh = NULL;
    pv_workload w = {0};
    int rc = r ? pv_workload_get(r, &app->keys, o->id, &w, &st)
               : pv_status_set(&st, PV_UNAVAILABLE, "no Redis connection");
    if (rc == PV_OK)
        rc = svc_eru_resources_json("resources", (void *const *)o->resources, o->n_resources,
                                    &delta, &st);
    if (rc == PV_OK) rc = pv_resv_realloc_workload(r, &app->keys, w.id, delta, &fresh, &st);
    if (rc == PV_OK) {
        json_t *j = json_loads(fresh, 0, NULL), *cm = json_object_get(j, "cpumem");
        json_t *params =
            json_pack("{s:s, s:f, s:I}", "id", w.id, "cpu_limit",
                      json_number_value(json_object_get(cm, "cpu_limit")), "memory_limit",
                      json_integer_value(json_object_get(cm, "memory_limit")));
        char op_id[PV_ID_MAX];
        pv_op rec = {0};
        pv_status nst;
        int nrc =
            svc_nodeop_submit(app, r, w.node, "workload.realloc_on_node", params, 1, op_id, &nst);
        if (nrc == PV_OK) nrc = svc_nodeop_wait(call, r, &app->keys, op_id, &rec, &nst);
        if (nrc == PV_OK && rec.status != PV_OP_SUCCEEDED)
            nrc = pv_status_set(
                &nst, rec.error_code > 0 && rec.error_code <= 16 ? rec.error_code : PV_INTERNAL,
                "%s", rec.error_message ? rec.error_message : "failed");
        if (nrc != PV_OK) {
            char *back = inverse_delta(w.resources, fresh);
            pv_status bst;
            if (!back || pv_resv_realloc_workload(r, &app->keys, w.id, back, NULL, &bst) != PV_OK)
                pv_warn("ReallocResource %s: putting the accounting back failed: %s", w.id,
                        back ? bst.msg : "out of memory");
            free(back);
            rc = nrc;
            st = nst;
        }
        pv_op_clear(&rec);
        json_decref(params);
        json_decref(j);
    }
    if (rc == PV_OK) {
        pv_info("ReallocResource id=%s: %s", w.id, fresh);
        Pb__ReallocResourceMessage m = PB__REALLOC_RESOURCE_MESSAGE__INIT;
        m.error = "";
        gw_call_reply(call, &m.base);
    } else if (rc != PV_CANCELLED) {
        gw_call_finishf(call, ERU_REALLOC_RESOURCE, "%s", st.msg);
    }
    free(delta);
    free(fresh);
    pv_workload_clear(&w);
}

/* ReplaceWorkload: each old workload (the IDs, or every one of the app's entrypoint in the pod
 * carrying filter_labels) is replaced on its node by a new one from deployOpt that keeps its
 * resources; the old one runs on when the new one fails. */
static void on_replace_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__ReplaceOptions *o = (const Pb__ReplaceOptions *)req;
    Pb__DeployOptions *d = o->deployopt;
    pv_status st;
    if (!d) {
        gw_call_finish(call, ERU_REPLACE_WORKLOAD, "deployOpt: required");
        return;
    }
    int32_t count = d->count;
    d->count = 1; /* each replacement is one instance; Eru's count does not apply */
    int rc = pv_deploy_check(d, &st);
    pv_redis *r = gw_app_redis(call);
    if (rc == PV_OK && !r) rc = pv_status_set(&st, PV_UNAVAILABLE, "no Redis connection");
    relay rl = {.call = call, .r = r, .pod = d->podname};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
    char **ids = NULL, *labels = NULL;
    size_t n = 0;
    pv_workload *found = NULL;
    if (rc == PV_OK && o->n_ids > 0) {
        ids = o->ids;
        n = o->n_ids;
    } else if (rc == PV_OK) {
        rc = svc_eru_labels_json("filter_labels", (void *const *)o->filter_labels,
                                 o->n_filter_labels, &labels, &st);
        if (rc == PV_OK)
            rc = pv_workload_list(r, rl.k, d->name, d->entrypoint->name, "", labels, &found, &n,
                                  &st);
        ids = n ? calloc(n, sizeof *ids) : NULL;
        for (size_t i = 0; ids && i < n; i++)
            ids[i] = found[i].id;
    }
    json_t *copy = json_object();
    for (size_t i = 0; copy && i < o->n_copy; i++)
        json_object_set_new(copy, o->copy[i]->key, json_string(o->copy[i]->value));
    char *b64 = NULL;
    if (rc == PV_OK) {
        size_t len = pb__deploy_options__get_packed_size(d);
        uint8_t *bytes = malloc(len ? len : 1);
        if (!bytes) rc = pv_status_set(&st, PV_INTERNAL, "out of memory");
        if (bytes) {
            pb__deploy_options__pack(d, bytes);
            rc = pv_b64_encode(bytes, len, &b64, &st);
            free(bytes);
        }
    }
    d->count = count;
    json_t *by_node = NULL;
    if (rc == PV_OK) rc = group_by_node(&rl, ids, n, &by_node, &st);
    const char *node;
    json_t *node_ids;
    json_object_foreach(by_node, node, node_ids) {
        if (rc != PV_OK) break;
        json_t *params = json_pack("{s:s, s:s, s:O, s:O}", "deploy", b64, "pod", d->podname, "ids",
                                   node_ids, "copy", copy);
        rc = params ? submit_child(call, &rl, "workload.replace_on_node", node, params, node_ids,
                                   CHILD_REPLACE, &st)
                    : pv_status_set(&st, PV_INTERNAL, "out of memory");
        json_decref(params);
    }
    json_decref(by_node);
    json_decref(copy);
    free(b64);
    free(labels);
    if (ids != o->ids) free(ids);
    pv_workload_array_free(found, found ? n : 0);
    finish_relay(call, &rl, rc, &st, ERU_REPLACE_WORKLOAD, "ReplaceWorkload");
}

/* DissociateWorkload: the control plane forgets the workload and takes its resources back; the
 * engine's workload is left as it is (Eru's meaning), so no node is asked anything. */
static void on_dissociate_workload(gw_call *call, const ProtobufCMessage *req) {
    const Pb__DissociateWorkloadOptions *o = (const Pb__DissociateWorkloadOptions *)req;
    pv_redis *r = gw_app_redis(call);
    if (!r) {
        gw_call_finish(call, ERU_DISSOCIATE_WORKLOAD, "no Redis connection on this gateway thread");
        return;
    }
    const pv_keys *k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
    for (size_t i = 0; i < o->n_ids; i++) {
        pv_status st;
        Pb__DissociateWorkloadMessage m = PB__DISSOCIATE_WORKLOAD_MESSAGE__INIT;
        m.id = o->ids[i];
        m.error = pv_resv_return_workload(r, k, o->ids[i], &st) == PV_OK ? "" : st.msg;
        if (*m.error == '\0') {
            pv_info("DissociateWorkload id=%s", o->ids[i]);
            /* marked so the audit (pivirt-check) knows the engine's workload without a record
             * was let go on purpose; best effort: unmarked, the audit reports an orphan */
            redisReply *rep = NULL;
            if (pv_redis_command(r, &rep, &st, "SET %s{reg}:dissociated:%s 1", k->prefix,
                                 o->ids[i]) != PV_OK)
                pv_warn("DissociateWorkload id=%s: not marked dissociated: %s", o->ids[i], st.msg);
            if (rep) freeReplyObject(rep);
        }
        if (gw_call_send(call, &m.base) != 0) return; /* the client has gone */
    }
    gw_call_finish(call, PV_OK, NULL);
}

/* LogStream: one operation on the workload's node; its output lines are relayed as they come,
 * and the operation is cancelled when the client goes (a followed log never ends otherwise). */
static void on_log_stream(gw_call *call, const ProtobufCMessage *req) {
    const Pb__LogStreamOptions *o = (const Pb__LogStreamOptions *)req;
    int64_t since_ms = 0, until_ms = 0, now = pv_time_now_ms();
    pv_status tst;
    if ((o->since && *o->since &&
         pv_time_parse("since", o->since, now, &since_ms, &tst) != PV_OK) ||
        (o->until && *o->until &&
         pv_time_parse("until", o->until, now, &until_ms, &tst) != PV_OK)) {
        gw_call_finishf(call, ERU_LOG_STREAM, "%s", tst.msg);
        return;
    }
    if (since_ms > 0 && until_ms > 0 && until_ms < since_ms) {
        gw_call_finishf(call, ERU_LOG_STREAM, "until: \"%s\" is before since \"%s\"", o->until,
                        o->since);
        return;
    }
    pv_redis *r = gw_app_redis(call);
    if (!r) {
        gw_call_finish(call, ERU_LOG_STREAM, "no Redis connection on this gateway thread");
        return;
    }
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    pv_workload w;
    pv_status st;
    if (pv_workload_get(r, &app->keys, o->id, &w, &st) != PV_OK) {
        gw_call_finishf(call, ERU_LOG_STREAM, "%s", st.msg);
        return;
    }
    json_t *params = json_pack("{s:s, s:s, s:b, s:I, s:I}", "id", w.id, "tail",
                               o->tail && *o->tail ? o->tail : "all", "follow", o->follow,
                               "since_ms", (json_int_t)since_ms, "until_ms", (json_int_t)until_ms);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    char queue[300], target[PV_ID_MAX];
    snprintf(queue, sizeof queue, "node:%s", w.node);
    pv_id_new("logs", target, sizeof target);
    pv_op_submit_req sub = {.kind = "workload.log_on_node",
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .max_attempts = 1};
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    pv_op rec;
    bool existed = false;
    int rc = text ? pv_op_submit(r, &app->keys, &oo, &sub, &rec, &existed, &st)
                  : pv_status_set(&st, PV_INTERNAL, "out of memory");
    free(text);
    char op_id[PV_ID_MAX] = "", after[32] = "0";
    if (rc == PV_OK) {
        snprintf(op_id, sizeof op_id, "%s", rec.id);
        pv_op_clear(&rec);
    }
    for (bool over = false; rc == PV_OK;) {
        if (gw_call_is_closed(call)) {
            pv_op out;
            if (pv_op_cancel(r, &app->keys, &oo, op_id, &out, &st) == PV_OK) pv_op_clear(&out);
            rc = PV_CANCELLED;
            break;
        }
        pv_op_output *entries = NULL;
        size_t n = 0;
        if ((rc = pv_op_output_read(r, &app->keys, op_id, after, 200, over ? 0 : 200, &entries, &n,
                                    &st)) != PV_OK)
            break;
        for (size_t i = 0; rc == PV_OK && i < n; i++) {
            snprintf(after, sizeof after, "%s", entries[i].id);
            if (strcmp(svc_nodeop_value(&entries[i], "type"), "log") != 0) continue; /* exit, ... */
            const char *data = svc_nodeop_value(&entries[i], "data");
            Pb__LogStreamMessage m = PB__LOG_STREAM_MESSAGE__INIT;
            m.id = w.id;
            m.data.data = (uint8_t *)data;
            m.data.len = strlen(data);
            m.std_stream_type = PB__STD_STREAM_TYPE__STDOUT;
            if (gw_call_send(call, &m.base) != 0) rc = PV_CANCELLED;
        }
        pv_op_output_free(entries, n);
        if (rc != PV_OK || (over && n == 0)) break;
        pv_op now;
        if ((rc = pv_op_get(r, &app->keys, op_id, &now, &st)) != PV_OK) break;
        over = now.status == PV_OP_SUCCEEDED || now.status == PV_OP_FAILED ||
               now.status == PV_OP_CANCELLED;
        if (over && now.status == PV_OP_FAILED) {
            /* Eru reports a log's failure in the stream's own error field. */
            Pb__LogStreamMessage m = PB__LOG_STREAM_MESSAGE__INIT;
            m.id = w.id;
            m.error = now.error_message;
            m.std_stream_type = PB__STD_STREAM_TYPE__ERUERROR;
            if (gw_call_send(call, &m.base) != 0) rc = PV_CANCELLED;
        }
        pv_op_clear(&now);
    }
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_LOG_STREAM, "%s", st.msg);
    pv_workload_clear(&w);
}

/* ---- RunAndWait ---------------------------------------------------------------------------- */

static int attach_send(gw_call *call, const char *id, const char *data, size_t len,
                       Pb__StdStreamType type) {
    Pb__AttachWorkloadMessage m = PB__ATTACH_WORKLOAD_MESSAGE__INIT;
    m.workload_id = (char *)id;
    m.data.data = (uint8_t *)data;
    m.data.len = len;
    m.std_stream_type = type;
    return gw_call_send(call, &m.base);
}

/* One workload's followed log, relayed until it ends; *code gets its exit code. */
typedef struct lambda_log {
    const char *id;
    char op[PV_ID_MAX], after[32];
    int code;
    bool done;
} lambda_log;

/* Sleeps until a log not done yet has news (a line, its end), WAIT_MS at most. */
static int wait_logs(relay *rl, const lambda_log *logs, size_t n, pv_status *st) {
    const char **ids = calloc(n, sizeof *ids);
    char(*cursors)[PV_OP_CURSOR_MAX] = calloc(n, sizeof *cursors);
    size_t m = 0;
    int rc = ids && cursors ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        if (!logs[i].done) {
            ids[m] = logs[i].op;
            snprintf(cursors[m++], PV_OP_CURSOR_MAX, "%s", logs[i].after);
        }
    bool woke;
    if (rc == PV_OK && m)
        rc = pv_op_output_wait(rl->r, rl->k, m, ids, cursors, WAIT_MS, &woke, NULL, st);
    free(ids);
    free(cursors);
    return rc;
}

/* Relays the logs to the client; detached (async), they go to the gateway's log instead, until
 * deadline_ms (monotonic; 0 = none). */
static int follow_logs(gw_call *call, relay *rl, lambda_log *logs, size_t n, bool detached,
                       int64_t deadline_ms, pv_status *st) {
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    for (size_t left = n; left > 0;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        bool late = deadline_ms > 0 && now.tv_sec * 1000LL + now.tv_nsec / 1000000 > deadline_ms;
        if ((!detached && gw_call_is_closed(call)) || late) {
            for (size_t i = 0; i < n; i++) {
                pv_op out;
                if (!logs[i].done && pv_op_cancel(rl->r, rl->k, &oo, logs[i].op, &out, st) == PV_OK)
                    pv_op_clear(&out);
            }
            return late ? pv_status_set(st, PV_DEADLINE_EXCEEDED, "async_timeout passed")
                        : pv_status_set(st, PV_CANCELLED, "client gone");
        }
        for (size_t i = 0; i < n; i++) {
            lambda_log *l = &logs[i];
            if (l->done) continue;
            pv_op rec;
            if (pv_op_get(rl->r, rl->k, l->op, &rec, st) != PV_OK) return st->code;
            bool over = rec.status == PV_OP_SUCCEEDED || rec.status == PV_OP_FAILED ||
                        rec.status == PV_OP_CANCELLED;
            pv_op_clear(&rec);
            pv_op_output *out = NULL;
            size_t got = 0;
            if (pv_op_output_read(rl->r, rl->k, l->op, l->after, 200, 0, &out, &got, st) != PV_OK)
                return st->code;
            int rc = PV_OK;
            for (size_t j = 0; rc == PV_OK && j < got; j++) {
                snprintf(l->after, sizeof l->after, "%s", out[j].id);
                const char *type = svc_nodeop_value(&out[j], "type");
                if (strcmp(type, "exit") == 0) {
                    l->code = atoi(svc_nodeop_value(&out[j], "code"));
                } else if (strcmp(type, "log") == 0 && detached) {
                    pv_info("RunAndWait async %s: %s", l->id, svc_nodeop_value(&out[j], "data"));
                } else if (strcmp(type, "log") == 0) {
                    char *line = NULL;
                    int len = asprintf(&line, "%s\n", svc_nodeop_value(&out[j], "data"));
                    if (len < 0 || attach_send(call, l->id, line, (size_t)len,
                                               PB__STD_STREAM_TYPE__STDOUT) != 0)
                        rc = pv_status_set(st, PV_CANCELLED, "client gone");
                    free(line);
                }
            }
            pv_op_output_free(out, got);
            if (rc != PV_OK) return rc;
            if (over && got == 0) {
                l->done = true;
                left--;
            }
        }
        if (left > 0 && wait_logs(rl, logs, n, st) != PV_OK) return st->code;
    }
    return PV_OK;
}

static int submit_log(gw_call *call, relay *rl, const char *id, const char *node, char *op_id,
                      pv_status *st) {
    json_t *params = json_pack("{s:s, s:s, s:b}", "id", id, "tail", "all", "follow", 1);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    char queue[300], target[PV_ID_MAX];
    snprintf(queue, sizeof queue, "node:%s", node);
    pv_id_new("logs", target, sizeof target);
    pv_op_submit_req req = {.kind = "workload.log_on_node",
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .max_attempts = 1};
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    pv_op rec;
    bool existed = false;
    int rc = text ? pv_op_submit(rl->r, rl->k, &oo, &req, &rec, &existed, st)
                  : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(text);
    if (rc == PV_OK) {
        snprintf(op_id, PV_ID_MAX, "%s", rec.id);
        pv_op_clear(&rec);
    }
    return rc;
}

/* Creates, follows to the end, reports "[exitcode] N" and removes the workloads. */
static int lambda_run(gw_call *call, relay *rl, const Pb__DeployOptions *o, bool async,
                      int async_timeout_s, pv_status *st) {
    int rc = submit(call, o, rl->parent, st);
    if (rc == PV_OK) rc = relay_all(rl, st);
    size_t n = json_array_size(rl->created);
    if (rc == PV_OK && n == 0)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "no workload was created: %s",
                           json_string_value(json_array_get(rl->failures, 0))
                               ? json_string_value(json_array_get(rl->failures, 0))
                               : "deploy failed");
    lambda_log *logs = n ? calloc(n, sizeof *logs) : NULL;
    if (rc == PV_OK && !logs) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        json_t *c = json_array_get(rl->created, i);
        logs[i].id = json_string_value(json_object_get(c, "id"));
        snprintf(logs[i].after, sizeof logs[i].after, "0");
        if (attach_send(call, logs[i].id, logs[i].id, strlen(logs[i].id),
                        PB__STD_STREAM_TYPE__TYPEWORKLOADID) != 0)
            rc = pv_status_set(st, PV_CANCELLED, "client gone");
        else
            rc = submit_log(call, rl, logs[i].id, json_string_value(json_object_get(c, "node")),
                            logs[i].op, st);
    }
    int64_t deadline = 0;
    if (rc == PV_OK && async) {
        /* Detached: the client has its IDs; the gateway follows the output into its log for at
         * most async_timeout seconds, then removes the workloads as always. */
        gw_call_finish(call, PV_OK, NULL);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        deadline = now.tv_sec * 1000LL + now.tv_nsec / 1000000 +
                   1000LL * (async_timeout_s > 0 ? async_timeout_s : 600);
    }
    if (rc == PV_OK) rc = follow_logs(call, rl, logs, n, async, deadline, st);
    for (size_t i = 0; rc == PV_OK && !async && i < n; i++) {
        char line[64];
        int len = snprintf(line, sizeof line, "[exitcode] %d", logs[i].code);
        if (attach_send(call, logs[i].id, line, (size_t)len, PB__STD_STREAM_TYPE__STDOUT) != 0)
            rc = pv_status_set(st, PV_CANCELLED, "client gone");
    }
    /* RunAndWait always removes its workloads, whatever happened above. */
    if (n > 0) {
        relay rm = {.call = call, .r = rl->r, .k = rl->k, .quiet = true};
        json_t *by_node = json_object();
        for (size_t i = 0; by_node && i < n; i++) {
            json_t *c = json_array_get(rl->created, i);
            const char *node = json_string_value(json_object_get(c, "node"));
            json_t *list = json_object_get(by_node, node);
            if (!list) json_object_set_new(by_node, node, list = json_array());
            json_array_append(list, json_object_get(c, "id"));
        }
        const char *node;
        json_t *ids;
        pv_status rst;
        int rrc = PV_OK;
        json_object_foreach(by_node, node, ids) {
            if (rrc == PV_OK)
                rrc = submit_node_op(call, &rm, "workload.remove_on_node", node, ids, NULL, true,
                                     &rst);
        }
        json_decref(by_node);
        if (rrc == PV_OK) rrc = relay_all(&rm, &rst);
        if (rrc != PV_OK && rrc != PV_CANCELLED)
            pv_warn("RunAndWait operation=%s: removing its workloads: %s", rl->parent, rst.msg);
        relay_free(&rm);
    }
    free(logs);
    return rc;
}

static void lambda_free(void *p) {
    free(p);
}

/* The first message carries the options; later ones would be stdin, which the process engine
 * does not take (open_stdin), so they are read and dropped. */
static void on_run_and_wait(gw_call *call, const ProtobufCMessage *msg) {
    if (gw_call_user(call)) return; /* started: stdin or the half-close */
    if (!msg) {
        gw_call_finish(call, ERU_RUN_AND_WAIT, "RunAndWait: no options were sent");
        return;
    }
    gw_call_set_user(call, calloc(1, 1), lambda_free);
    const Pb__RunAndWaitOptions *o = (const Pb__RunAndWaitOptions *)msg;
    Pb__DeployOptions *d = o->deploy_options;
    pv_status st;
    if (!d) {
        gw_call_finish(call, ERU_RUN_AND_WAIT, "deploy_options: required");
        return;
    }
    /* cmd replaces the entrypoint's command, split on blanks as Eru does. */
    char *cmd = o->cmd.len ? strndup((const char *)o->cmd.data, o->cmd.len) : strdup(""),
         *save = NULL;
    char *argv[256];
    size_t argc = 0;
    for (char *t = cmd ? strtok_r(cmd, " \t\n", &save) : NULL; t && argc < 256;
         t = strtok_r(NULL, " \t\n", &save))
        argv[argc++] = t;
    char **old_commands = NULL;
    size_t old_n = 0;
    if (argc > 0 && d->entrypoint) {
        old_commands = d->entrypoint->commands;
        old_n = d->entrypoint->n_commands;
        d->entrypoint->commands = argv;
        d->entrypoint->n_commands = argc;
    }
    int rc = pv_deploy_check(d, &st);
    pv_redis *r = gw_app_redis(call);
    if (rc == PV_OK && !r) rc = pv_status_set(&st, PV_UNAVAILABLE, "no Redis connection");
    relay rl = {.call = call, .r = r, .pod = d->podname, .quiet = true};
    rl.k = &((svc_core_deploy *)gw_call_method_data(call))->app->keys;
    rl.created = json_array();
    rl.failures = json_array();
    snprintf(rl.parent_after, sizeof rl.parent_after, "0");
    if (rc == PV_OK) rc = lambda_run(call, &rl, d, o->async, o->async_timeout, &st);
    if (o->async && rc != PV_OK) pv_warn("RunAndWait async operation=%s: %s", rl.parent, st.msg);
    if (d->entrypoint && argc > 0) {
        d->entrypoint->commands = old_commands;
        d->entrypoint->n_commands = old_n;
    }
    free(cmd);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_RUN_AND_WAIT, "%s", st.msg);
    json_decref(rl.created);
    json_decref(rl.failures);
    relay_free(&rl);
}

/* ---- ExecuteWorkload ------------------------------------------------------------------------ */

/* Submits the exec of o on its workload's node: op_id (PV_ID_MAX) names it; *w is the workload
 * (pv_workload_clear). interactive: the command's input and output stream while it runs. */
static int submit_exec(gw_call *call, const Pb__ExecuteWorkloadOptions *o, bool interactive,
                       char *op_id, pv_workload *w, pv_status *st) {
    memset(w, 0, sizeof *w);
    if (o->n_commands == 0) return pv_status_set(st, PV_INVALID_ARGUMENT, "commands: required");
    pv_redis *r = gw_app_redis(call);
    if (!r) return pv_status_set(st, PV_UNAVAILABLE, "no Redis connection on this gateway thread");
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    if (pv_workload_get(r, &app->keys, o->workload_id, w, st) != PV_OK) return st->code;
    json_t *cmds = json_array(), *envs = json_array();
    for (size_t i = 0; cmds && i < o->n_commands; i++)
        json_array_append_new(cmds, json_string(o->commands[i]));
    for (size_t i = 0; envs && i < o->n_envs; i++)
        json_array_append_new(envs, json_string(o->envs[i]));
    json_t *params =
        json_pack("{s:s, s:o, s:o, s:s, s:b}", "id", w->id, "commands", cmds, "envs", envs,
                  "workdir", o->workdir ? o->workdir : "", "interactive", interactive);
    char *text = params ? json_dumps(params, JSON_COMPACT) : NULL;
    json_decref(params);
    char queue[300], target[PV_ID_MAX];
    snprintf(queue, sizeof queue, "node:%s", w->node);
    pv_id_new("exec", target, sizeof target);
    /* One attempt: a command is not run twice behind the client's back. */
    pv_op_submit_req req = {.kind = "workload.exec_on_node",
                            .target = target,
                            .queue = queue,
                            .params_json = text,
                            .max_attempts = 1};
    gw_app_count_client(call, &req);
    pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                     .events_maxlen = app->cfg.ops.events_maxlen};
    pv_op rec = {0};
    bool existed = false;
    int rc = text ? pv_op_submit(r, &app->keys, &oo, &req, &rec, &existed, st)
                  : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(text);
    if (rc == PV_OK) snprintf(op_id, PV_ID_MAX, "%s", rec.id);
    pv_op_clear(&rec);
    return rc;
}

/* A command without input: submitted, waited for, its output and exit code sent. */
static int execute(gw_call *call, const Pb__ExecuteWorkloadOptions *o, pv_status *st) {
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    pv_workload w;
    char op_id[PV_ID_MAX] = "";
    pv_op rec = {0};
    int rc = submit_exec(call, o, false, op_id, &w, st);
    pv_redis *r = gw_app_redis(call);
    if (rc == PV_OK) rc = svc_nodeop_wait(call, r, &app->keys, op_id, &rec, st);
    if (rc == PV_OK && rec.status != PV_OP_SUCCEEDED)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s",
                           rec.error_message && *rec.error_message ? rec.error_message
                                                                   : "exec did not run");
    pv_op_clear(&rec);
    pv_op_output *out = NULL;
    size_t n = 0;
    if (rc == PV_OK) rc = pv_op_output_read(r, &app->keys, op_id, "0", 10, 0, &out, &n, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (strcmp(svc_nodeop_value(&out[i], "type"), "exec") != 0) continue;
        unsigned char *data = NULL;
        size_t len = 0;
        if (pv_b64_decode("data", svc_nodeop_value(&out[i], "data"), &data, &len, st) != PV_OK) {
            rc = st->code;
            break;
        }
        char line[64];
        int ll = snprintf(line, sizeof line, "[exitcode] %s", svc_nodeop_value(&out[i], "code"));
        if ((len &&
             attach_send(call, w.id, (const char *)data, len, PB__STD_STREAM_TYPE__STDOUT) != 0) ||
            attach_send(call, w.id, line, (size_t)ll, PB__STD_STREAM_TYPE__STDOUT) != 0)
            rc = pv_status_set(st, PV_CANCELLED, "client gone");
        free(data);
    }
    pv_op_output_free(out, n);
    pv_workload_clear(&w);
    return rc;
}

/* What an ExecuteWorkload call has read: its options (packed: the framework frees the message)
 * and, with open_stdin, the input of the later messages (repl_cmd). */
typedef struct exec_call {
    bool open_stdin;
    char op_id[PV_ID_MAX]; /* interactive: the running exec ("" until submitted) */
    size_t input_total;    /* interactive: bytes of input streamed so far */
} exec_call;

static void exec_call_free(void *p) {
    free(p);
}

static void exec_now(gw_call *call, const Pb__ExecuteWorkloadOptions *o) {
    pv_status st;
    int rc = execute(call, o, &st);
    if (rc == PV_OK)
        gw_call_finish(call, PV_OK, NULL);
    else if (rc != PV_CANCELLED)
        gw_call_finishf(call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
}

/* ---- interactive exec: a relay thread per session ----
 * The input (later messages' repl_cmd) goes to the operation's input stream as it comes, from
 * the call's own handler; a thread of the session relays the output stream to the client as it
 * comes, ends the call with "[exitcode] N", and cancels the operation if the client leaves. At
 * most MAX_SESSIONS run at once on a gateway (each holds a thread and a Redis connection). */

#define MAX_SESSIONS 64

typedef struct exec_relay {
    gw_call *call; /* a reference of its own */
    svc_core_deploy *svc;
    char op_id[PV_ID_MAX];
    char wid[PV_WORKLOAD_ID_LEN + 1];
} exec_relay;

static void relay_session(exec_relay *er, pv_redis *r) {
    gw_app *app = er->svc->app;
    char cursor[PV_OP_CURSOR_MAX] = "0";
    for (;;) {
        pv_status st;
        if (gw_call_is_closed(er->call)) {
            pv_op_opts oo = {.retention_seconds = app->cfg.ops.retention_seconds,
                             .events_maxlen = app->cfg.ops.events_maxlen};
            pv_op out;
            if (pv_op_cancel(r, &app->keys, &oo, er->op_id, &out, &st) == PV_OK) pv_op_clear(&out);
            return;
        }
        pv_op_output *out = NULL;
        size_t n = 0;
        if (pv_op_output_read(r, &app->keys, er->op_id, cursor, 100, WAIT_MS, &out, &n, &st) !=
            PV_OK) {
            gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
            return;
        }
        bool ended = false;
        for (size_t i = 0; i < n && !ended; i++) {
            snprintf(cursor, sizeof cursor, "%s", out[i].id);
            const char *type = svc_nodeop_value(&out[i], "type");
            if (strcmp(type, "data") == 0) {
                unsigned char *data = NULL;
                size_t len = 0;
                if (pv_b64_decode("data", svc_nodeop_value(&out[i], "data"), &data, &len, &st) ==
                        PV_OK &&
                    len)
                    attach_send(er->call, er->wid, (const char *)data, len,
                                PB__STD_STREAM_TYPE__STDOUT);
                free(data);
            } else if (strcmp(type, "exit") == 0) {
                char line[64];
                int ll =
                    snprintf(line, sizeof line, "[exitcode] %s", svc_nodeop_value(&out[i], "code"));
                attach_send(er->call, er->wid, line, (size_t)ll, PB__STD_STREAM_TYPE__STDOUT);
                gw_call_finish(er->call, PV_OK, NULL);
                ended = true;
            }
        }
        pv_op_output_free(out, n);
        if (ended) return;
        if (n > 0) continue;
        pv_op rec;
        if (pv_op_get(r, &app->keys, er->op_id, &rec, &st) != PV_OK) {
            gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
            return;
        }
        bool over = pv_op_done(&rec);
        if (over) /* finished without an exit entry: it never ran, or its node failed it */
            gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s",
                            rec.error_message && *rec.error_message ? rec.error_message
                                                                    : "exec ended without "
                                                                      "an exit code");
        pv_op_clear(&rec);
        if (over) return;
    }
}

static void *exec_relay_main(void *arg) {
    exec_relay *er = arg;
    pv_redis_opts ro;
    pv_redis_opts_from_config(&er->svc->app->cfg, &ro);
    pv_redis *r = NULL;
    pv_status st;
    if (pv_redis_new(&ro, &r, &st) == PV_OK)
        relay_session(er, r);
    else
        gw_call_finishf(er->call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
    pv_redis_free(r);
    atomic_fetch_sub(&er->svc->sessions, 1);
    gw_call_unref(er->call);
    free(er);
    return NULL;
}

/* Submits the interactive exec and starts its relay. */
static int start_session(gw_call *call, const Pb__ExecuteWorkloadOptions *o, exec_call *x,
                         pv_status *st) {
    svc_core_deploy *svc = gw_call_method_data(call);
    if (atomic_fetch_add(&svc->sessions, 1) >= MAX_SESSIONS) {
        atomic_fetch_sub(&svc->sessions, 1);
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                             "open_stdin: %d interactive sessions run on this gateway already",
                             MAX_SESSIONS);
    }
    exec_relay *er = calloc(1, sizeof *er);
    pv_workload w;
    int rc = er ? submit_exec(call, o, true, x->op_id, &w, st)
                : pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) {
        er->call = call;
        er->svc = svc;
        snprintf(er->op_id, sizeof er->op_id, "%s", x->op_id);
        snprintf(er->wid, sizeof er->wid, "%s", w.id);
        gw_call_ref(call);
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, exec_relay_main, er) != 0) {
            gw_call_unref(call);
            rc = pv_status_set(st, PV_INTERNAL, "open_stdin: cannot start the session's thread");
        } else {
            er = NULL; /* the thread's */
        }
        pthread_attr_destroy(&attr);
    }
    pv_workload_clear(&w);
    if (er) {
        free(er);
        atomic_fetch_sub(&svc->sessions, 1);
    }
    return rc;
}

/* One chunk of input (or its end) for the running session. */
static void session_input(gw_call *call, exec_call *x, const ProtobufCBinaryData *data, bool eof) {
    gw_app *app = ((svc_core_deploy *)gw_call_method_data(call))->app;
    pv_redis *r = gw_app_redis(call);
    pv_status st;
    char *b64 = NULL;
    if (!r) return; /* the relay ends the call when the command ends */
    if (!eof && (x->input_total += data->len) > (size_t)app->cfg.gateway.max_request_bytes * 16) {
        pv_warn("ExecuteWorkload %s: input past 16x gateway.max_request_bytes dropped", x->op_id);
        return;
    }
    if (!eof && pv_b64_encode(data->data, data->len, &b64, &st) != PV_OK) return;
    if (pv_op_input_add(r, &app->keys, x->op_id, b64, eof, app->cfg.ops.retention_seconds, &st) !=
        PV_OK)
        pv_warn("ExecuteWorkload %s: input lost: %s", x->op_id, st.msg);
    free(b64);
}

/* The first message names the workload and the command. Without open_stdin the command runs at
 * once; with it, the session is interactive: the repl_cmd of the first and later messages is
 * its standard input as it comes, the half-close its end, and its output streams back as it
 * comes (no terminal: a program that insists on a tty sees pipes). */
static void on_execute_workload(gw_call *call, const ProtobufCMessage *msg) {
    exec_call *x = gw_call_user(call);
    const Pb__ExecuteWorkloadOptions *o = (const Pb__ExecuteWorkloadOptions *)msg;
    if (x && x->op_id[0]) {
        if (o && o->repl_cmd.len) session_input(call, x, &o->repl_cmd, false);
        if (!o) session_input(call, x, NULL, true);
        return;
    }
    if (x && x->open_stdin) return; /* the session could not start: answered already */
    if (!x && msg && o->open_stdin) {
        if (!(x = calloc(1, sizeof *x))) {
            gw_call_finish(call, ERU_EXECUTE_WORKLOAD, "out of memory");
            return;
        }
        gw_call_set_user(call, x, exec_call_free);
        x->open_stdin = true;
        pv_status st;
        if (start_session(call, o, x, &st) != PV_OK) {
            gw_call_finishf(call, ERU_EXECUTE_WORKLOAD, "%s", st.msg);
            return;
        }
        if (o->repl_cmd.len) session_input(call, x, &o->repl_cmd, false);
        return;
    }
    if (x) return; /* ran already: later messages are not input */
    if (!msg) {
        gw_call_finish(call, ERU_EXECUTE_WORKLOAD, "ExecuteWorkload: no options were sent");
        return;
    }
    if (!(x = calloc(1, sizeof *x))) {
        gw_call_finish(call, ERU_EXECUTE_WORKLOAD, "out of memory");
        return;
    }
    gw_call_set_user(call, x, exec_call_free);
    exec_now(call, o);
}

static const svc_eru_method k_methods[N_METHODS] = {
    {"/pb.CoreRPC/CreateWorkload", GW_SERVER_STREAM, &pb__deploy_options__descriptor,
     on_create_workload, ERU_CREATE_WORKLOAD},
    {"/pb.CoreRPC/RemoveWorkload", GW_SERVER_STREAM, &pb__remove_workload_options__descriptor,
     on_remove_workload, ERU_REMOVE_WORKLOAD},
    {"/pb.CoreRPC/ControlWorkload", GW_SERVER_STREAM, &pb__control_workload_options__descriptor,
     on_control_workload, ERU_CONTROL_WORKLOAD},
    {"/pb.CoreRPC/LogStream", GW_SERVER_STREAM, &pb__log_stream_options__descriptor, on_log_stream,
     ERU_LOG_STREAM},
    {"/pb.CoreRPC/DissociateWorkload", GW_SERVER_STREAM,
     &pb__dissociate_workload_options__descriptor, on_dissociate_workload, ERU_DISSOCIATE_WORKLOAD},
    {"/pb.CoreRPC/Send", GW_SERVER_STREAM, &pb__send_options__descriptor, on_send, ERU_SEND},
    {"/pb.CoreRPC/Copy", GW_SERVER_STREAM, &pb__copy_options__descriptor, on_copy, ERU_COPY},
    {"/pb.CoreRPC/ReallocResource", GW_UNARY, &pb__realloc_options__descriptor, on_realloc_resource,
     ERU_REALLOC_RESOURCE},
    {"/pb.CoreRPC/ReplaceWorkload", GW_SERVER_STREAM, &pb__replace_options__descriptor,
     on_replace_workload, ERU_REPLACE_WORKLOAD},
};

int svc_core_deploy_register(svc_core_deploy *s, gw_server *server) {
    if (svc_eru_register(server, k_methods, N_METHODS, s->methods, s) != 0) return -1;
    /* The one bidi call: its messages come one by one (gw_message_fn). */
    s->run_and_wait = (gw_method){.path = "/pb.CoreRPC/RunAndWait",
                                  .kind = GW_BIDI_STREAM,
                                  .request = &pb__run_and_wait_options__descriptor,
                                  .on_message = on_run_and_wait,
                                  .bad_request_code = ERU_RUN_AND_WAIT,
                                  .data = s};
    s->execute = (gw_method){.path = "/pb.CoreRPC/ExecuteWorkload",
                             .kind = GW_BIDI_STREAM,
                             .request = &pb__execute_workload_options__descriptor,
                             .on_message = on_execute_workload,
                             .bad_request_code = ERU_EXECUTE_WORKLOAD,
                             .data = s};
    s->send_large_file = (gw_method){.path = "/pb.CoreRPC/SendLargeFile",
                                     .kind = GW_BIDI_STREAM,
                                     .request = &pb__file_options__descriptor,
                                     .on_message = on_send_large_file,
                                     .bad_request_code = ERU_SEND_LARGE_FILE,
                                     .data = s};
    if (gw_server_add_method(server, &s->run_and_wait) != 0 ||
        gw_server_add_method(server, &s->send_large_file) != 0)
        return -1;
    return gw_server_add_method(server, &s->execute);
}
