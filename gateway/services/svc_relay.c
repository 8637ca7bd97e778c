/*
 * svc_relay: following a call's operations to the client (see svc_relay.h).
 *
 * The relay follows the parent operation's output for the announcements of its children
 * ({type=node, node, op}; repeated announcements after a redelivery are the same child) and each
 * child's output for its instances. Between reads it sleeps in one XREAD on every stream not
 * finished yet (wait_news), so news wakes it at once and a quiet deploy costs no busy polling.
 */
#include "svc_relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_b64.h"
#include "pv_time.h"
#include "pv_id.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "pv_mem.h"
#include "pv_workload.h"
#include "svc_nodeop.h"

#define MAX_CHILDREN 4096

/* One node's part of the deploy (or removal) as the relay follows it. */
struct svc_relay_child {
    char id[PV_ID_MAX];
    char node[256];
    char after[32]; /* last output entry relayed */
    size_t reported, expected;
    json_t *pending; /* per-id calls: the ids not answered yet (id -> true); else NULL */
    json_t *seen;    /* deploys: the instances (allocation ids) told already */
    int kind;        /* svc_relay_kind: what a lost id is answered with */
    bool done;
    bool checked;      /* its record was read at least once (expected is known) */
    bool ended;        /* its output's end entry came: its record is final */
    bool idle;         /* the last wait saw nothing new in its output: no need to read it */
    pv_op_output *pre; /* what the last wait read of its output: relayed instead of a read */
    size_t npre;
    bool fetched; /* pre is all its output had after `after` when the wait read it */
};

typedef struct svc_relay_child child;

/* Sends m to the client, or keeps quiet (RunAndWait drives its own messages). */
static int relay_send(svc_relay *rl, const ProtobufCMessage *m) {
    return rl->quiet ? 0 : gw_call_send(rl->call, m);
}

/* The fields of an instance the agent wrote (the strings stay e's). */
static void fill_created(Pb__CreateWorkloadMessage *m, const pv_op_output *e) {
    m->podname = (char *)svc_nodeop_value(e, "podname");
    m->nodename = (char *)svc_nodeop_value(e, "nodename");
    m->id = (char *)svc_nodeop_value(e, "id");
    m->name = (char *)svc_nodeop_value(e, "name");
    m->error = (char *)svc_nodeop_value(e, "error");
    m->success = strcmp(svc_nodeop_value(e, "success"), "1") == 0;
}

/* One instance's message: the fields the agent wrote. */
static int send_instance(svc_relay *rl, const pv_op_output *e) {
    Pb__CreateWorkloadMessage m = PB__CREATE_WORKLOAD_MESSAGE__INIT;
    fill_created(&m, e);
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
static int send_lost(svc_relay *rl, const child *c, const char *why) {
    Pb__CreateWorkloadMessage m = PB__CREATE_WORKLOAD_MESSAGE__INIT;
    m.podname = (char *)rl->pod;
    m.nodename = (char *)c->node;
    m.error = (char *)why;
    rl->sent++;
    rl->failed++;
    if (rl->quiet) json_array_append_new(rl->failures, json_string(why)); /* as send_instance */
    return relay_send(rl, &m.base);
}

static int send_removed(svc_relay *rl, const char *id, bool success, const char *hook) {
    Pb__RemoveWorkloadMessage m = PB__REMOVE_WORKLOAD_MESSAGE__INIT;
    m.id = (char *)id;
    m.success = success;
    m.hook = (char *)hook;
    rl->sent++;
    if (!success) rl->failed++;
    return relay_send(rl, &m.base);
}

static int send_controlled(svc_relay *rl, const char *id, const char *error) {
    Pb__ControlWorkloadMessage m = PB__CONTROL_WORKLOAD_MESSAGE__INIT;
    m.id = (char *)id;
    m.error = (char *)error;
    rl->sent++;
    if (*error) rl->failed++;
    return relay_send(rl, &m.base);
}

static int send_copied(svc_relay *rl, const pv_op_output *e) {
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
static int send_replaced(svc_relay *rl, const pv_op_output *e) {
    Pb__CreateWorkloadMessage c = PB__CREATE_WORKLOAD_MESSAGE__INIT;
    Pb__RemoveWorkloadMessage rm = PB__REMOVE_WORKLOAD_MESSAGE__INIT;
    Pb__ReplaceWorkloadMessage m = PB__REPLACE_WORKLOAD_MESSAGE__INIT;
    fill_created(&c, e);
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
static int send_lost_id(svc_relay *rl, int kind, const char *id, const char *why) {
    if (kind == SVC_RELAY_REPLACE) {
        Pb__RemoveWorkloadMessage rm = PB__REMOVE_WORKLOAD_MESSAGE__INIT;
        Pb__ReplaceWorkloadMessage m = PB__REPLACE_WORKLOAD_MESSAGE__INIT;
        rm.id = (char *)id;
        m.remove = &rm;
        m.error = (char *)why;
        rl->sent++;
        rl->failed++;
        return relay_send(rl, &m.base);
    }
    if (kind == SVC_RELAY_CONTROL) return send_controlled(rl, id, why);
    if (kind == SVC_RELAY_SEND || kind == SVC_RELAY_COPY) {
        rl->sent++;
        rl->failed++;
        if (kind == SVC_RELAY_SEND) {
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
static int add_child(svc_relay *rl, const char *id, const char *node, const char *instances,
                     const char *nodes, pv_status *st) {
    for (size_t i = 0; i < rl->n; i++)
        if (strcmp(rl->children[i].id, id) == 0) return PV_OK; /* announced again */
    if (rl->n == MAX_CHILDREN)
        return pv_status_set(st, PV_INTERNAL, "too many nodes in one deploy");
    if (strcmp(id, rl->parent) == 0) rl->folded = true;
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
static bool create_answered(const svc_relay *rl) {
    if (rl->plan_nodes == 0 || rl->n != rl->plan_nodes || rl->failed > 0) return false;
    for (size_t i = 0; i < rl->n; i++) {
        const child *c = &rl->children[i];
        if (!c->checked || c->kind != SVC_RELAY_DEPLOY || c->pending || c->reported < c->expected)
            return false;
    }
    return true;
}

/* An operation's output after `after`: what the last wait read of it (*pre, taken over: the
 * caller frees *out) when that was all of it (*fetched), else a read. */
static int take_output(svc_relay *rl, const char *op_id, const char *after, pv_op_output **pre,
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

static int read_announcements(svc_relay *rl, pv_status *st) {
    pv_op_output *out = NULL;
    size_t n = 0;
    if (take_output(rl, rl->parent, rl->parent_after, &rl->parent_pre, &rl->parent_npre,
                    &rl->parent_fetched, &out, &n, st) != PV_OK)
        return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        snprintf(rl->parent_after, sizeof rl->parent_after, "%s", out[i].id);
        if (strcmp(svc_nodeop_value(&out[i], "type"), "node") != 0) continue;
        rc = add_child(rl, svc_nodeop_value(&out[i], "op"), svc_nodeop_value(&out[i], "node"),
                       svc_nodeop_value(&out[i], "instances"), svc_nodeop_value(&out[i], "nodes"),
                       st);
        child *c = rc == PV_OK && rl->folded ? &rl->children[rl->n - 1] : NULL;
        if (c && strcmp(c->id, rl->parent) == 0 && strcmp(c->after, "0") == 0) {
            /* the deploy announced itself: its stream up to here is read (plumbing and this
             * announcement), and when this was the last of all it had, nothing is left to read
             * before the next wait brings news (a read less) */
            snprintf(c->after, sizeof c->after, "%s", out[i].id);
            c->idle = i + 1 == n && n < 100;
        }
    }
    pv_op_output_free(out, n);
    return rc;
}

/* Whether what the last wait read of c's output, its end entry included, answers every
 * instance c still owes, each of them created: the relay then ends on create_answered without
 * reading c's record, which would only confirm it (a read less at the end of most creates). A
 * repeat of an instance counted twice here only costs that read later: create_answered counts
 * what was really told. */
static bool pre_answers_all(const svc_relay *rl, const child *c) {
    if (!c->ended || !c->fetched || !c->checked || c->kind != SVC_RELAY_DEPLOY || c->pending ||
        rl->failed > 0)
        return false;
    size_t told = c->reported;
    for (size_t i = 0; i < c->npre; i++) {
        const pv_op_output *e = &c->pre[i];
        if (strcmp(svc_nodeop_value(e, "type"), "workload") != 0) continue;
        if (strcmp(svc_nodeop_value(e, "success"), "1") != 0) return false;
        const char *alloc = svc_nodeop_value(e, "alloc");
        if (!*alloc || !c->seen || !json_object_get(c->seen, alloc)) told++;
    }
    return told >= c->expected;
}

/* Relays what a child has written; marks it done when it has finished and nothing is left. */
static int follow_child(svc_relay *rl, child *c, bool check, pv_status *st) {
    pv_op rec = {0};
    bool over = false;
    /* Nothing new since the last read, as the wait saw: nothing to read (check: read anyway) */
    if (!check && c->idle && !c->fetched && c->checked && !c->ended) return PV_OK;
    /* The record matters only once (how many instances) and at the end; in between the output
     * says everything. check: read it anyway (a child may end without output). */
    if (check || (c->ended && !pre_answers_all(rl, c)) || !c->checked) {
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

/* Sleeps until the parent (when with_parent) or a child not done yet writes something or ends,
 * SVC_RELAY_WAIT_MS at most: the relay's cursors stay where they are, the reads that follow move
 * them. */
static int wait_news(svc_relay *rl, bool with_parent, bool *woke, pv_status *st) {
    size_t n = 0;
    const char **ids = calloc(rl->n + 1, sizeof *ids);
    char(*cursors)[PV_OP_CURSOR_MAX] = calloc(rl->n + 1, sizeof *cursors);
    bool *ended = calloc(rl->n + 1, sizeof *ended);
    size_t *idx = calloc(rl->n + 1, sizeof *idx);
    pv_op_output **got = calloc(rl->n + 1, sizeof *got);
    size_t *ngot = calloc(rl->n + 1, sizeof *ngot);
    *woke = false;
    int rc = PV_OK;
    if (!ids || !cursors || !ended || !idx || !got || !ngot) {
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        goto out;
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
    rc = n ? pv_op_output_wait_entries(rl->r, rl->k, n, ids, cursors, SVC_RELAY_WAIT_MS, woke,
                                       ended, got, ngot, st)
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
out:
    PV_FREE(got, ngot, ids, cursors, ended, idx);
    return rc;
}

/* Relays until the deploy and every node's part are over. PV_OK: the call is finished with OK;
 * else the call's error in st (a deploy that failed before asking any node). */
int svc_relay_run(svc_relay *rl, pv_status *st) {
    /* read every child's record: no news came, or a second passed (a fresh parent: nothing to
     * read before the first wait) */
    bool check = !rl->parent_fresh;
    int64_t last_check = rl->parent_fresh ? pv_time_mono_ms() : 0;
    for (;;) {
        if (gw_call_is_closed(rl->call)) return pv_status_set(st, PV_CANCELLED, "client gone");
        pv_op parent = {0};
        bool over = true, has_parent = rl->parent[0] != '\0' && !rl->folded;
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
        if (check) last_check = pv_time_mono_ms();
        bool woke;
        /* folded just now: the parent's stream is the child's, waited on as the child's */
        if (wait_news(rl, has_parent && !rl->folded && !over, &woke, st) != PV_OK) return st->code;
        check = !woke || pv_time_mono_ms() - last_check >= 1000;
    }
}

int svc_relay_submit_deploy(gw_call *call, const Pb__DeployOptions *o, svc_relay *rl,
                            pv_status *st) {
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
    pv_op_submit_req req = {.kind = PV_KIND_DEPLOY,
                            .target = target,
                            .queue = "ops",
                            .params_json = text,
                            .target_unlocked = true}; /* minted just above */
    pv_op rec;
    bool existed = false;
    rc = text ? gw_app_submit(call, GW_SUBMIT_IDEMPOTENT, &req, &rec, &existed, st)
              : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(text);
    if (rc != PV_OK) return rc;
    snprintf(rl->parent, sizeof rl->parent, "%s", rec.id);
    /* just created: PENDING, nothing written yet (the first wait sees what comes) */
    rl->parent_fresh = !existed;
    rl->parent_checked = rl->parent_idle = rl->parent_fresh;
    pv_info("CreateWorkload app=%s pod=%s count=%d operation=%s%s", o->name, o->podname,
            (int)o->count, rec.id, existed ? " (existing, same x-request-id)" : "");
    pv_op_clear(&rec);
    return PV_OK;
}

void svc_relay_free(svc_relay *rl) {
    for (size_t i = 0; i < rl->n; i++) {
        json_decref(rl->children[i].pending);
        json_decref(rl->children[i].seen);
        pv_op_output_free(rl->children[i].pre, rl->children[i].npre);
    }
    free(rl->children);
    pv_op_output_free(rl->parent_pre, rl->parent_npre);
    rl->parent_pre = NULL;
}

/* One node's part of a call: an operation of kind on that node's queue with params (borrowed),
 * followed like a deploy's child; ids (borrowed) are the workloads it answers for. */
int svc_relay_submit_child(gw_call *call, svc_relay *rl, const char *kind, const char *node,
                           json_t *params, json_t *ids, svc_relay_kind ck, pv_status *st) {
    /* the first node's part may be refused (the client's bound): nothing changed yet; the
     * others are parts of a call let through, counted but never refused */
    svc_nodeop_req q = {.node = node,
                        .kind = kind,
                        .target_prefix = "wlop",
                        .params = params,
                        .flags = rl->part || rl->n > 0 ? GW_SUBMIT_PART : 0};
    char op_id[PV_ID_MAX];
    int rc = svc_nodeop_submit_req(call, &q, op_id, st);
    if (rc != PV_OK) return rc;
    rc = add_child(rl, op_id, node, "", "", st);
    if (rc == PV_OK) {
        child *c = &rl->children[rl->n - 1];
        c->pending = json_object();
        size_t i;
        json_t *v;
        json_array_foreach(ids, i, v)
            json_object_set(c->pending, json_string_value(v), json_true());
        c->expected = json_array_size(ids);
        c->kind = ck;
    }
    return rc;
}

/* Removal or control of the ids on one node. type NULL: a removal. */
int svc_relay_submit_node_op(gw_call *call, svc_relay *rl, const char *kind, const char *node,
                             json_t *ids, const char *type, bool force, pv_status *st) {
    json_t *params = json_pack("{s:O, s:b}", "ids", ids, "force", force);
    if (!params) return pv_status_set(st, PV_INTERNAL, "out of memory");
    if (type) json_object_set_new(params, "type", json_string(type));
    int rc = svc_relay_submit_child(call, rl, kind, node, params, ids,
                                    type ? SVC_RELAY_CONTROL : SVC_RELAY_REMOVE, st);
    json_decref(params);
    return rc;
}

/* Every workload looked up first; an unknown one fails the call, or goes to unknown.
 * *by_node: node name -> array of the ids there. */
int svc_relay_group_by_node(svc_relay *rl, char **ids, size_t n, json_t **by_node, json_t *unknown,
                            pv_status *st) {
    *by_node = json_object();
    int rc = *by_node ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        char *node = NULL;
        rc = pv_workload_node(rl->r, rl->k, ids[i], &node, st);
        if (unknown && (rc == PV_NOT_FOUND || rc == PV_INVALID_ARGUMENT)) {
            rc = json_array_append_new(unknown, json_pack("[s, s]", ids[i], st->msg)) == 0
                     ? PV_OK
                     : pv_status_set(st, PV_INTERNAL, "out of memory");
            continue;
        }
        if (rc != PV_OK) break;
        json_t *list = json_object_get(*by_node, node);
        if (!list) json_object_set_new(*by_node, node, list = json_array());
        json_array_append_new(list, json_string(ids[i]));
        free(node);
    }
    return rc;
}

/* Finishes a per-node call after its children are submitted (or it failed submitting). */
void svc_relay_finish(gw_call *call, svc_relay *rl, int rc, pv_status *st, int eru,
                      const char *what) {
    if (rc == PV_OK) rc = svc_relay_run(rl, st);
    if (rc == PV_OK) {
        pv_info("%s: %zu answered, %zu failed", what, rl->sent, rl->failed);
        gw_call_finish(call, PV_OK, NULL);
    } else if (rc != PV_CANCELLED) {
        gw_call_finishf(call, eru, "%s", st->msg);
    }
    svc_relay_free(rl);
}

void svc_relay_init(svc_relay *rl, gw_call *call, pv_redis *r, const char *pod) {
    memset(rl, 0, sizeof *rl);
    rl->call = call;
    rl->r = r;
    rl->k = &((gw_app *)gw_call_app(call))->keys;
    rl->pod = pod;
    snprintf(rl->parent_after, sizeof rl->parent_after, "0");
}
