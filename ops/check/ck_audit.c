/*
 * ck_audit: the checks of `pivirt check` (see ck_audit.h). Each area is one function reading
 * what it needs; they share the node and workload lists read once at the start.
 */
#include "ck_audit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pv_time.h"
#include "pv_domains.h"
#include "pv_op.h"
#include "pv_registry.h"
#include "pv_resv.h"
#include "pv_path.h"
#include "pv_json.h"
#include "pv_strv.h"
#include "pv_storage.h"
#include "pv_upgrade.h"
#include "pv_workload.h"

extern char **environ;

/* Adding a difference fails only when out of memory: rc (the caller's) says so, and the loops
 * that check rc stop. */
#define ADD(...)                                                                                   \
    do {                                                                                           \
        if (ck_report_add(__VA_ARGS__) != 0) rc = pv_status_set(st, PV_INTERNAL, "out of memory"); \
    } while (0)

/* Every key matching pattern (SCAN), the part after strip_len bytes added to out. */
static int scan_keys(pv_redis *r, const char *pattern, size_t strip_len, pv_strv *out,
                     pv_status *st) {
    char cursor[32] = "0";
    do {
        redisReply *rep = NULL;
        if (pv_redis_command(r, &rep, st, "SCAN %s MATCH %s COUNT 1000", cursor, pattern) != PV_OK)
            return st->code;
        int rc = PV_OK;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
            rc = pv_status_set(st, PV_INTERNAL, "SCAN: unexpected reply");
        else {
            snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
            redisReply *keys = rep->element[1];
            for (size_t i = 0; rc == PV_OK && i < keys->elements; i++)
                if (strlen(keys->element[i]->str) >= strip_len &&
                    pv_strv_add(out, keys->element[i]->str + strip_len) != 0)
                    rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        }
        freeReplyObject(rep);
        if (rc != PV_OK) return rc;
    } while (strcmp(cursor, "0") != 0);
    pv_strv_sort(out);
    return PV_OK;
}

/* ---- what every area shares ----------------------------------------------------------------- */

typedef struct ck_ctx {
    pv_redis *r;
    const pv_keys *k;
    const ck_opts *o;
    ck_report *rep;
    pv_node *nodes;
    size_t nnodes;
    pv_workload *wls;
    size_t nwls;
    pv_strv node_ids, wl_ids;
    bool *local; /* per node: its engine keeps its state on this machine */
} ck_ctx;

/* Runs "<cmd> <the key of kind named name> <args...>" (args NULL-terminated): every key the
 * audit reads is named by pv_keys. */
static int key_cmd(ck_ctx *c, redisReply **rep, pv_status *st, const char *cmd, pv_key_kind kind,
                   const char *name, const char *const *args) {
    char key[2 * PV_KEY_MAX];
    if (pv_key(c->k, kind, name, key, sizeof key, st) != PV_OK) return st->code;
    const char *argv[8] = {cmd, key};
    int argc = 2;
    for (; args && *args && argc < 8; args++)
        argv[argc++] = *args;
    return pv_redis_commandv(c->r, rep, st, argc, argv, NULL);
}

#define KEY_CMD(c, rep, st, cmd, kind, ...)                                                        \
    key_cmd(c, rep, st, cmd, kind, (const char *[]){__VA_ARGS__, NULL}[0],                         \
            (const char *[]){__VA_ARGS__, NULL} + 1)

/* The names of every key of kind (SCAN of its "<key>*" pattern), sorted into out. */
static int scan_kind(ck_ctx *c, pv_key_kind kind, pv_strv *out, pv_status *st) {
    char pattern[PV_KEY_MAX];
    if (pv_key(c->k, kind, "*", pattern, sizeof pattern, st) != PV_OK) return st->code;
    return scan_keys(c->r, pattern, strlen(pattern) - 1, out, st);
}

static const pv_node *node_by_id(const ck_ctx *c, const char *id) {
    for (size_t i = 0; id && i < c->nnodes; i++)
        if (strcmp(c->nodes[i].id, id) == 0) return &c->nodes[i];
    return NULL;
}

static const pv_node *node_by_name(const ck_ctx *c, const char *name) {
    for (size_t i = 0; name && i < c->nnodes; i++)
        if (strcmp(c->nodes[i].name, name) == 0) return &c->nodes[i];
    return NULL;
}

static bool node_local(const ck_ctx *c, const pv_node *n) {
    return n && c->local[n - c->nodes];
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* ---- operations ------------------------------------------------------------------------------ */

typedef struct op_rec {
    char *id, *queue, *status, *entry, *kind;
    bool done;
} op_rec;

typedef struct q_entry {
    char *queue, *id, *op;
    bool pending; /* delivered, not acknowledged (else: not delivered yet) */
    long long idle_ms;
} q_entry;

typedef struct ops_state {
    op_rec *ops;
    size_t nops;
    q_entry *entries;
    size_t nentries, cap;
} ops_state;

static void ops_state_free(ops_state *s) {
    for (size_t i = 0; i < s->nops; i++) {
        free(s->ops[i].id);
        free(s->ops[i].queue);
        free(s->ops[i].status);
        free(s->ops[i].entry);
        free(s->ops[i].kind);
    }
    free(s->ops);
    for (size_t i = 0; i < s->nentries; i++) {
        free(s->entries[i].queue);
        free(s->entries[i].id);
        free(s->entries[i].op);
    }
    free(s->entries);
}

static const char *field_of(const redisReply *fields, const char *name) {
    for (size_t i = 0; fields->type == REDIS_REPLY_ARRAY && i + 1 < fields->elements; i += 2)
        if (strcmp(fields->element[i]->str, name) == 0) return fields->element[i + 1]->str;
    return NULL;
}

static int add_entry(ops_state *s, const char *queue, const char *id, const char *op, bool pending,
                     long long idle_ms, pv_status *st) {
    if (s->nentries == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        q_entry *v = realloc(s->entries, cap * sizeof *v);
        if (!v) return pv_status_set(st, PV_INTERNAL, "out of memory");
        s->entries = v;
        s->cap = cap;
    }
    q_entry e = {strdup(queue), strdup(id), strdup(op ? op : ""), pending, idle_ms};
    if (!e.queue || !e.id || !e.op) {
        free(e.queue);
        free(e.id);
        free(e.op);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    s->entries[s->nentries++] = e;
    return PV_OK;
}

/* The entries of one queue stream that are not done with: those delivered to the group and not
 * acknowledged (XPENDING, with their idle time) and those not delivered yet (after the group's
 * last-delivered-id). A stream without the group has every entry waiting. */
static int read_queue(ck_ctx *c, ops_state *s, const char *queue, pv_status *st) {
    char key[PV_KEY_MAX];
    if (pv_key(c->k, PV_KEY_OP_QUEUE, queue, key, sizeof key, st) != PV_OK) return st->code;
    redisReply *groups = NULL;
    char last[64] = "0-0";
    int rc = pv_redis_command(c->r, &groups, st, "XINFO GROUPS %s", key);
    if (rc != PV_OK) return rc;
    bool has_group = false;
    for (size_t i = 0; groups->type == REDIS_REPLY_ARRAY && i < groups->elements; i++) {
        const char *name = field_of(groups->element[i], "name");
        const char *ld = field_of(groups->element[i], "last-delivered-id");
        if (name && strcmp(name, PV_OP_GROUP) == 0 && ld) {
            snprintf(last, sizeof last, "%s", ld);
            has_group = true;
        }
    }
    freeReplyObject(groups);
    if (has_group) {
        redisReply *pel = NULL;
        rc = pv_redis_command(c->r, &pel, st, "XPENDING %s %s - + 1000000", key, PV_OP_GROUP);
        for (size_t i = 0; rc == PV_OK && pel->type == REDIS_REPLY_ARRAY && i < pel->elements;
             i++) {
            const redisReply *e = pel->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 4) continue;
            redisReply *one = NULL;
            rc = pv_redis_command(c->r, &one, st, "XRANGE %s %s %s", key, e->element[0]->str,
                                  e->element[0]->str);
            const char *op = NULL;
            if (rc == PV_OK && one->type == REDIS_REPLY_ARRAY && one->elements == 1)
                op = field_of(one->element[0]->element[1], "op");
            /* a pending id whose entry was deleted carries nothing: op stays "" */
            if (rc == PV_OK)
                rc = add_entry(s, queue, e->element[0]->str, op, true, e->element[2]->integer, st);
            if (one) freeReplyObject(one);
        }
        if (pel) freeReplyObject(pel);
        if (rc != PV_OK) return rc;
    }
    char from[80];
    snprintf(from, sizeof from, "(%s", last);
    redisReply *rest = NULL;
    rc = pv_redis_command(c->r, &rest, st, "XRANGE %s %s +", key, has_group ? from : "-");
    for (size_t i = 0; rc == PV_OK && rest->type == REDIS_REPLY_ARRAY && i < rest->elements; i++)
        rc = add_entry(s, queue, rest->element[i]->element[0]->str,
                       field_of(rest->element[i]->element[1], "op"), false, 0, st);
    if (rest) freeReplyObject(rest);
    return rc;
}

static const op_rec *op_find(const ops_state *s, const char *id) {
    /* ops are sorted by id (read from a sorted id set) */
    size_t lo = 0, hi = s->nops;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int cmp = strcmp(s->ops[mid].id, id);
        if (cmp == 0) return &s->ops[mid];
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int cmp_entry(const void *a, const void *b) {
    const q_entry *x = a, *y = b;
    int c = strcmp(x->queue, y->queue);
    return c != 0 ? c : strcmp(x->id, y->id);
}

/* Entries are sorted by queue and id once read (check_ops), so a lookup is a bsearch. */
static const q_entry *entry_find(const ops_state *s, const char *queue, const char *id) {
    q_entry key = {.queue = (char *)queue, .id = (char *)id};
    return s->nentries ? bsearch(&key, s->entries, s->nentries, sizeof key, cmp_entry) : NULL;
}

static char *dup_field(const redisReply *rep, size_t i) {
    const redisReply *e = rep->element[i];
    return strdup(e->type == REDIS_REPLY_STRING ? e->str : "");
}

/* Reads every record (id, queue, status, entry) with one pipelined HMGET per record. */
static int read_ops(ck_ctx *c, ops_state *s, const pv_strv *ids, pv_status *st) {
    s->ops = calloc(ids->n ? ids->n : 1, sizeof *s->ops);
    if (!s->ops) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; i < ids->n; i++) {
        char key[PV_KEY_MAX];
        if (pv_key(c->k, PV_KEY_OP, ids->v[i], key, sizeof key, st) != PV_OK) return st->code;
        const char *argv[] = {"HMGET", key, "queue", "status", "entry", "kind"};
        if (pv_redis_append(c->r, 6, argv, NULL, st) != PV_OK) return st->code;
    }
    int rc = PV_OK;
    for (size_t i = 0; i < ids->n; i++) {
        redisReply *rep = NULL;
        int grc = pv_redis_get_reply(c->r, &rep, st); /* read every reply, even after a failure */
        if (grc != PV_OK) {
            rc = grc;
            continue;
        }
        if (rc == PV_OK && rep->type == REDIS_REPLY_ARRAY && rep->elements == 4 &&
            rep->element[1]->type == REDIS_REPLY_STRING) { /* gone meanwhile: no status */
            op_rec *o = &s->ops[s->nops];
            o->id = strdup(ids->v[i]);
            o->queue = dup_field(rep, 0);
            o->status = dup_field(rep, 1);
            o->entry = dup_field(rep, 2);
            o->kind = dup_field(rep, 3);
            s->nops++;
            if (!o->id || !o->queue || !o->status || !o->entry || !o->kind)
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
            else
                o->done = strcmp(o->status, "PENDING") != 0 && strcmp(o->status, "RUNNING") != 0;
        }
        freeReplyObject(rep);
    }
    return rc;
}

static int check_ops(ck_ctx *c, pv_status *st) {
    ops_state s = {0};
    pv_strv ids = {0}, queues = {0}, locks = {0};
    int rc = scan_kind(c, PV_KEY_OP, &ids, st);
    if (rc == PV_OK) rc = read_ops(c, &s, &ids, st);
    if (rc == PV_OK) rc = scan_kind(c, PV_KEY_OP_QUEUE, &queues, st);
    for (size_t i = 0; rc == PV_OK && i < queues.n; i++)
        rc = read_queue(c, &s, queues.v[i], st);
    if (s.nentries > 1) qsort(s.entries, s.nentries, sizeof *s.entries, cmp_entry);
    c->rep->ops = (long)s.nops;
    c->rep->queues = (long)queues.n;

    /* unfinished operations: an entry on their queue still to be worked, or a retry waiting */
    for (size_t i = 0; rc == PV_OK && i < s.nops; i++) {
        const op_rec *o = &s.ops[i];
        if (o->done) continue;
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "op %s", o->id);
        if (!*o->entry) {
            redisReply *score = NULL;
            rc = KEY_CMD(c, &score, st, "ZSCORE", PV_KEY_OP_DELAYED, NULL, o->id);
            bool waits = rc == PV_OK && score->type == REDIS_REPLY_STRING;
            if (score) freeReplyObject(score);
            if (rc == PV_OK && !waits)
                ADD(c->rep, CK_AREA_OPS, "OP_LOST", subject,
                    "%s %s on queue %s has no queue entry and waits for no retry: no worker will "
                    "ever run it",
                    o->status, o->kind, o->queue);
        } else if (!entry_find(&s, o->queue, o->entry)) {
            ADD(c->rep, CK_AREA_OPS, "OP_LOST", subject,
                "%s %s: its entry %s on queue %s is neither waiting nor pending (acknowledged or "
                "trimmed): no worker will ever run it",
                o->status, o->kind, o->entry, o->queue);
        }
    }
    /* entries still to be worked: their operation must exist; a finished one's must not stay
     * delivered and unacknowledged (the worker acks when it finishes, or on redelivery) */
    for (size_t i = 0; rc == PV_OK && i < s.nentries; i++) {
        const q_entry *e = &s.entries[i];
        char subject[PV_KEY_MAX * 2];
        snprintf(subject, sizeof subject, "queue %s entry %s", e->queue, e->id);
        if (!*e->op) continue; /* carries no operation: acked on delivery */
        const op_rec *o = op_find(&s, e->op);
        if (!o)
            ADD(c->rep, CK_AREA_OPS, "OP_ORPHAN_ENTRY", subject,
                "%s entry of operation %s, which has no record", e->pending ? "pending" : "waiting",
                e->op);
        else if (o->done && e->pending && e->idle_ms > c->o->grace_ms)
            ADD(c->rep, CK_AREA_OPS, "OP_UNACKED", subject,
                "operation %s ended %s but its entry is still pending, unacknowledged for %lld ms",
                o->id, o->status, e->idle_ms);
    }
    /* locks: held by an unfinished operation (finishing releases them) */
    if (rc == PV_OK) rc = scan_kind(c, PV_KEY_OP_LOCK, &locks, st);
    for (size_t i = 0; rc == PV_OK && i < locks.n; i++) {
        redisReply *holder = NULL;
        rc = KEY_CMD(c, &holder, st, "GET", PV_KEY_OP_LOCK, locks.v[i]);
        if (rc == PV_OK && holder->type == REDIS_REPLY_STRING) {
            const op_rec *o = op_find(&s, holder->str);
            char subject[PV_KEY_MAX];
            snprintf(subject, sizeof subject, "lock %s", locks.v[i]);
            if (!o || o->done)
                ADD(c->rep, CK_AREA_OPS, "OP_STALE_LOCK", subject,
                    "held by operation %s, which %s%s", holder->str, o ? "ended " : "has no record",
                    o ? o->status : "");
        }
        if (holder) freeReplyObject(holder);
    }
    ops_state_free(&s);
    pv_strv_free(&ids);
    pv_strv_free(&queues);
    pv_strv_free(&locks);
    return rc;
}

/* ---- reservations ------------------------------------------------------------------------------
 */

static int check_reservations(ck_ctx *c, pv_status *st) {
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < c->nnodes; i++) {
        const pv_node *n = &c->nodes[i];
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "node %s", n->name);
        /* GetNodeResource's comparison: recorded usage vs allocations + workloads */
        pv_resv_check chk = {0};
        rc = pv_resv_check_node(c->r, c->k, n->name, 0, &chk, st);
        if (rc == PV_NOT_FOUND) { /* removed since the list was read */
            rc = PV_OK;
            continue;
        }
        /* a document that does not parse (a resources object no plugin knows): the usage
         * cannot be verified, which is a difference of its own; the audit goes on */
        if (rc != PV_OK && rc != PV_UNAVAILABLE) {
            rc = PV_OK;
            ADD(c->rep, CK_AREA_RESERVATIONS, "RESV_UNREADABLE", subject,
                "its usage cannot be added up: %s", st->msg);
        }
        for (size_t d = 0; rc == PV_OK && d < chk.ndiffs; d++)
            ADD(c->rep, CK_AREA_RESERVATIONS, "RESV_USAGE", subject, "%s", chk.diffs[d]);
        pv_resv_check_clear(&chk);
        /* every reserved allocation belongs to a reservation that will take it over or give
         * it back; one without is held for ever */
        redisReply *allocs = NULL;
        if (rc == PV_OK) rc = KEY_CMD(c, &allocs, st, "HKEYS", PV_KEY_NODE_ALLOCS, n->id);
        for (size_t a = 0; rc == PV_OK && allocs->type == REDIS_REPLY_ARRAY && a < allocs->elements;
             a++) {
            const char *aid = allocs->element[a]->str;
            const char *dot = strrchr(aid, '.');
            char resv[PV_ID_MAX];
            snprintf(resv, sizeof resv, "%.*s", dot ? (int)(dot - aid) : (int)strlen(aid), aid);
            redisReply *ex = NULL;
            rc = KEY_CMD(c, &ex, st, "EXISTS", PV_KEY_RESV, resv);
            if (rc == PV_OK && ex->integer == 0) {
                char asub[PV_KEY_MAX];
                snprintf(asub, sizeof asub, "allocation %s", aid);
                ADD(c->rep, CK_AREA_RESERVATIONS, "RESV_LEAK", asub,
                    "reserved on node %s for reservation %s, which does not exist: nothing will "
                    "ever take it over or give it back",
                    n->name, resv);
            }
            if (ex) freeReplyObject(ex);
        }
        if (allocs) freeReplyObject(allocs);
    }
    /* a workload took its allocation over: the node must not hold it reserved as well */
    for (size_t i = 0; rc == PV_OK && i < c->nwls; i++) {
        const pv_workload *w = &c->wls[i];
        if (!w->alloc_id || !*w->alloc_id || !w->node_id) continue;
        redisReply *ex = NULL;
        rc = KEY_CMD(c, &ex, st, "HEXISTS", PV_KEY_NODE_ALLOCS, w->node_id, w->alloc_id);
        if (rc == PV_OK && ex->integer == 1) {
            char subject[PV_KEY_MAX];
            snprintf(subject, sizeof subject, "workload %s", w->id);
            ADD(c->rep, CK_AREA_RESERVATIONS, "RESV_DOUBLE", subject,
                "its allocation %s is still reserved on node %s: counted twice", w->alloc_id,
                w->node ? w->node : "?");
        }
        if (ex) freeReplyObject(ex);
    }
    /* reservations the reaper should have released by now */
    redisReply *all = NULL, *late = NULL;
    if (rc == PV_OK) rc = KEY_CMD(c, &all, st, "ZCARD", PV_KEY_RESVS, NULL);
    if (rc == PV_OK) c->rep->reservations = (long)all->integer;
    char upto[32];
    int64_t now = pv_time_now_ms();
    snprintf(upto, sizeof upto, "%lld", (long long)(now - c->o->grace_ms));
    if (rc == PV_OK)
        rc = KEY_CMD(c, &late, st, "ZRANGEBYSCORE", PV_KEY_RESVS, NULL, "-inf", upto, "WITHSCORES");
    for (size_t i = 0; rc == PV_OK && late->type == REDIS_REPLY_ARRAY && i + 1 < late->elements;
         i += 2) {
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "reservation %s", late->element[i]->str);
        long long expired = now - strtoll(late->element[i + 1]->str, NULL, 10);
        ADD(c->rep, CK_AREA_RESERVATIONS, "RESV_EXPIRED", subject,
            "expired %lld ms ago and is not released", expired);
    }
    if (all) freeReplyObject(all);
    if (late) freeReplyObject(late);
    return rc;
}

/* ---- workloads ---------------------------------------------------------------------------------
 */

/* One workload of a local process engine, from <state>/<id>/record.json. */
typedef struct eng_wl {
    char id[PV_WORKLOAD_ID_LEN + 1];
    char state[16];
    long long pid;
    unsigned long long pid_start;
    int exit_code;
    bool want_running; /* started and not stopped through the engine since */
} eng_wl;

/* Start time (clock ticks since boot) of a live, non-zombie process; -1 when gone. The process
 * engine records the same figure, so a pid reused by another process does not pass for it. */
static int proc_start(long long pid, unsigned long long *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) return -1;
    buf[len] = 0;
    char *p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
    char state;
    if (!p || sscanf(p + 1,
                     " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d "
                     "%llu",
                     &state, start) != 2)
        return -1;
    return state == 'Z' || state == 'X' ? -1 : 0;
}

/* The engine's workloads under dir (those with a record.json: a directory without one is a
 * create the agent did not finish, which it removes when it starts). */
static int read_engine(const char *dir, eng_wl **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return pv_status_set(st, PV_INTERNAL, "opendir %s: %s", dir, strerror(errno));
    size_t cap = 0;
    int rc = PV_OK;
    struct dirent *de;
    while (rc == PV_OK && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || strlen(de->d_name) > PV_WORKLOAD_ID_LEN) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/record.json", dir, de->d_name);
        json_t *o = json_load_file(path, 0, NULL);
        if (!o) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 32;
            eng_wl *v = realloc(*out, cap * sizeof *v);
            if (!v) {
                json_decref(o);
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
                break;
            }
            *out = v;
        }
        eng_wl *w = &(*out)[(*n)++];
        memset(w, 0, sizeof *w);
        memcpy(w->id, de->d_name, strlen(de->d_name)); /* length checked above */
        snprintf(w->state, sizeof w->state, "%s",
                 json_string_value(json_object_get(o, "state")) ?: "");
        w->pid = json_integer_value(json_object_get(o, "pid"));
        w->pid_start = (unsigned long long)json_integer_value(json_object_get(o, "pid_start"));
        w->exit_code = (int)json_integer_value(json_object_get(o, "exit_code"));
        w->want_running = json_is_true(json_object_get(o, "want_running"));
        json_decref(o);
    }
    closedir(d);
    return rc;
}

/* Orphans: what the engine of node `name` (node_id NULL: not registered) has that no record
 * places on that node. */
static int report_orphans(ck_ctx *c, const char *name, const char *node_id, const eng_wl *eng,
                          size_t neng, pv_status *st) {
    int rc = PV_OK;
    for (size_t j = 0; rc == PV_OK && j < neng; j++) {
        const pv_workload *w = NULL;
        for (size_t i = 0; !w && i < c->nwls; i++)
            if (strcmp(c->wls[i].id, eng[j].id) == 0) w = &c->wls[i];
        if (w && node_id && w->node_id && strcmp(w->node_id, node_id) == 0) continue;
        if (!w) { /* DissociateWorkload lets the engine's workload go on without a record */
            redisReply *ex = NULL;
            rc = KEY_CMD(c, &ex, st, "EXISTS", PV_KEY_DISSOCIATED, eng[j].id);
            bool let_go = rc == PV_OK && ex->integer == 1;
            if (ex) freeReplyObject(ex);
            if (rc != PV_OK) break;
            if (let_go) continue;
        }
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", eng[j].id);
        unsigned long long start = 0;
        bool runs =
            eng[j].pid > 0 && proc_start(eng[j].pid, &start) == 0 && start == eng[j].pid_start;
        char how[64];
        if (runs)
            snprintf(how, sizeof how, "runs as pid %lld", eng[j].pid);
        else
            snprintf(how, sizeof how, "is %s, no process", eng[j].state);
        ADD(c->rep, CK_AREA_WORKLOADS, "WL_ORPHAN", subject,
            "the engine of node %s%s has it (%s) but %s", name, node_id ? "" : " (not registered)",
            how, w ? "its record places it on another node" : "there is no record of it");
    }
    return rc;
}

/* One local process node: records vs the engine's own state and the processes that run. */
static int check_engine(ck_ctx *c, const pv_node *n, pv_status *st) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/engine/%s", c->o->cfg->data_dir, n->name);
    eng_wl *eng = NULL;
    size_t neng = 0;
    int rc = read_engine(dir, &eng, &neng, st);
    c->rep->engine_workloads += (long)neng;
    for (size_t i = 0; rc == PV_OK && i < c->nwls; i++) {
        const pv_workload *w = &c->wls[i];
        if (!w->node_id || strcmp(w->node_id, n->id) != 0) continue;
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", w->id);
        const eng_wl *e = NULL;
        for (size_t j = 0; !e && j < neng; j++)
            if (strcmp(eng[j].id, w->id) == 0) e = &eng[j];
        if (!e) {
            ADD(c->rep, CK_AREA_WORKLOADS, "WL_NO_ENGINE", subject,
                "recorded on node %s, but its engine has no such workload (no %s/%s/record.json)",
                n->name, dir, w->id);
            continue;
        }
        bool live_state = strcmp(e->state, "running") == 0 || strcmp(e->state, "paused") == 0;
        unsigned long long start = 0;
        if (live_state && e->pid > 0 && (proc_start(e->pid, &start) != 0 || start != e->pid_start))
            ADD(c->rep, CK_AREA_WORKLOADS, "WL_NOT_RUNNING", subject,
                "its engine on node %s says %s with pid %lld, but no such process runs", n->name,
                e->state, e->pid);
        /* killed by a signal, or gone while no agent watched (-1), with nobody having stopped
         * it through the API: not what its record and its engine want. A process that exited
         * by itself (a job done, an app that failed) is the workload's own business, which its
         * status reports. */
        else if (strcmp(e->state, "stopped") == 0 && e->want_running &&
                 (e->exit_code >= 128 || e->exit_code == -1))
            ADD(c->rep, CK_AREA_WORKLOADS, "WL_NOT_RUNNING", subject,
                "should run on node %s (started, never stopped through the API) but its process "
                "%s",
                n->name, e->exit_code == -1 ? "ended while no agent watched it" : "was killed");
    }
    if (rc == PV_OK) rc = report_orphans(c, n->name, n->id, eng, neng, st);
    free(eng);
    return rc;
}

/* A node whose engine this machine cannot look at (a virt node: libvirt's connection is its
 * agent's; a process node of another machine): its records against the inventory its agent
 * reports every status interval (pv_workload_inventory_get). Records younger than the
 * inventory are not judged: the agent has not listed them yet. */
static int check_inventory(ck_ctx *c, const pv_node *n, pv_status *st) {
    json_t *ids = NULL;
    int64_t at_ms = 0;
    int rc = pv_workload_inventory_get(c->r, c->k, n->name, &ids, &at_ms, st);
    if (rc == PV_NOT_FOUND) {
        bool any = false;
        for (size_t i = 0; !any && i < c->nwls; i++)
            any = c->wls[i].node_id && strcmp(c->wls[i].node_id, n->id) == 0;
        if (any && ck_report_note(c->rep,
                                  "node %s (%s engine): its agent reports no inventory (away "
                                  "for three status intervals or more): its workloads are not "
                                  "checked against its engine",
                                  n->name, n->engine ? n->engine : "?") != 0)
            return pv_status_set(st, PV_INTERNAL, "out of memory");
        return PV_OK;
    }
    if (rc != PV_OK) return rc;
    pv_strv have = {0};
    size_t i;
    json_t *v;
    json_array_foreach(ids, i, v) {
        if (rc == PV_OK && json_string_value(v) && pv_strv_add(&have, json_string_value(v)) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    pv_strv_sort(&have);
    c->rep->engine_workloads += (long)have.n;
    for (size_t j = 0; rc == PV_OK && j < c->nwls; j++) {
        const pv_workload *w = &c->wls[j];
        if (!w->node_id || strcmp(w->node_id, n->id) != 0 || pv_strv_has(&have, w->id)) continue;
        if (w->created_ms >= at_ms - 1000) continue; /* newer than the agent's last listing */
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", w->id);
        ADD(c->rep, CK_AREA_WORKLOADS, "WL_NO_ENGINE", subject,
            "recorded on node %s, but its agent's engine (%s) does not have it (inventory of "
            "%.1f s ago)",
            n->name, n->engine ? n->engine : "?", (double)(pv_time_now_ms() - at_ms) / 1000.0);
    }
    for (size_t j = 0; rc == PV_OK && j < have.n; j++) {
        const pv_workload *w = NULL;
        for (size_t x = 0; !w && x < c->nwls; x++)
            if (strcmp(c->wls[x].id, have.v[j]) == 0) w = &c->wls[x];
        if (w && w->node_id && strcmp(w->node_id, n->id) == 0) continue;
        if (!w) { /* DissociateWorkload lets the engine's workload go on without a record */
            redisReply *ex = NULL;
            rc = KEY_CMD(c, &ex, st, "EXISTS", PV_KEY_DISSOCIATED, have.v[j]);
            bool let_go = rc == PV_OK && ex->integer == 1;
            if (ex) freeReplyObject(ex);
            if (rc != PV_OK || let_go) continue;
        }
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", have.v[j]);
        ADD(c->rep, CK_AREA_WORKLOADS, "WL_ORPHAN", subject,
            "the engine of node %s (%s) has it, as its agent reports, but %s", n->name,
            n->engine ? n->engine : "?",
            w ? "its record places it on another node" : "there is no record of it");
    }
    pv_strv_free(&have);
    json_decref(ids);
    return rc;
}

/* A virt node's domains as its agent reports them (engine info "virt": wk_engine_facts): a
 * recorded workload whose domain was started and is now shut off without a stop through the
 * API, killed (destroyed behind pivirt's back, QEMU gone: exit code not 0), is not what its
 * record and its engine want. A guest that powered itself off (exit code 0) is its own
 * business, as a process that exited by itself. Nothing for nodes without that report. */
static int check_domains(ck_ctx *c, const pv_node *n, pv_status *st) {
    json_t *j = NULL;
    int rc = pv_domains_get(c->r, c->k, n->name, &j, st);
    const char *id;
    json_t *d;
    json_object_foreach(j, id, d) {
        const char *state = json_string_value(json_object_get(d, "state"));
        int code = (int)json_integer_value(json_object_get(d, "exit_code"));
        if (!state || strcmp(state, "stopped") != 0 || code == 0 ||
            json_is_true(json_object_get(d, "stopped_by_api")))
            continue;
        const pv_workload *w = NULL;
        for (size_t i = 0; !w && i < c->nwls; i++)
            if (strcmp(c->wls[i].id, id) == 0) w = &c->wls[i];
        if (!w || !w->node_id || strcmp(w->node_id, n->id) != 0) continue; /* WL_ORPHAN's */
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", id);
        ADD(c->rep, CK_AREA_WORKLOADS, "WL_NOT_RUNNING", subject,
            "should run on node %s (started, never stopped through the API) but its domain %s "
            "was %s",
            n->name, json_string_value(json_object_get(d, "domain")),
            code == 137 ? "destroyed" : "lost (crashed, or its QEMU died)");
    }
    json_decref(j);
    return rc;
}

/* Engine directories of nodes that are not registered (removed, or a cluster deleted, while
 * their agent's data stayed here): whatever they hold has no record on that node. */
static int check_unregistered_engines(ck_ctx *c, pv_status *st) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/engine", c->o->cfg->data_dir);
    DIR *d = opendir(root);
    if (!d) return PV_OK; /* no process engine ever ran with this data directory */
    int rc = PV_OK;
    struct dirent *de;
    while (rc == PV_OK && (de = readdir(d)) != NULL) {
        char dir[PATH_MAX + 256];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        if (de->d_name[0] == '.' || node_by_name(c, de->d_name) || !is_dir(dir)) continue;
        eng_wl *eng = NULL;
        size_t neng = 0;
        rc = read_engine(dir, &eng, &neng, st);
        c->rep->engine_workloads += (long)neng;
        if (rc == PV_OK) rc = report_orphans(c, de->d_name, NULL, eng, neng, st);
        free(eng);
    }
    closedir(d);
    return rc;
}

static int check_workloads(ck_ctx *c, pv_status *st) {
    int rc = PV_OK;
    c->rep->workloads = (long)c->nwls;
    for (size_t i = 0; rc == PV_OK && i < c->nwls; i++) {
        const pv_workload *w = &c->wls[i];
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", w->id);
        if (!node_by_id(c, w->node_id)) {
            ADD(c->rep, CK_AREA_WORKLOADS, "WL_NODE", subject,
                "recorded on node %s (%s), which does not exist", w->node ? w->node : "?",
                w->node_id ? w->node_id : "?");
            continue;
        }
        redisReply *in = NULL;
        rc = KEY_CMD(c, &in, st, "SISMEMBER", PV_KEY_NODE_WORKLOADS, w->node_id, w->id);
        if (rc == PV_OK && in->integer == 0)
            ADD(c->rep, CK_AREA_WORKLOADS, "WL_INDEX", subject,
                "recorded on node %s but missing from that node's workload set", w->node);
        if (in) freeReplyObject(in);
    }
    /* the indexes name only workloads that exist */
    for (size_t i = 0; rc == PV_OK && i < c->nnodes; i++) {
        redisReply *members = NULL;
        rc = KEY_CMD(c, &members, st, "SMEMBERS", PV_KEY_NODE_WORKLOADS, c->nodes[i].id);
        for (size_t m = 0;
             rc == PV_OK && members->type == REDIS_REPLY_ARRAY && m < members->elements; m++) {
            if (pv_strv_has(&c->wl_ids, members->element[m]->str)) continue;
            char subject[PV_KEY_MAX];
            snprintf(subject, sizeof subject, "workload %s", members->element[m]->str);
            ADD(c->rep, CK_AREA_WORKLOADS, "WL_INDEX", subject,
                "listed on node %s but has no record", c->nodes[i].name);
        }
        if (members) freeReplyObject(members);
    }
    pv_strv recs = {0};
    if (rc == PV_OK) rc = scan_kind(c, PV_KEY_WL, &recs, st);
    for (size_t i = 0; rc == PV_OK && i < recs.n; i++) {
        if (pv_strv_has(&c->wl_ids, recs.v[i])) continue;
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "workload %s", recs.v[i]);
        ADD(c->rep, CK_AREA_WORKLOADS, "WL_INDEX", subject,
            "has a record but is missing from the index of all workloads");
    }
    pv_strv_free(&recs);
    /* keys kept per workload, removed with its record */
    static const struct {
        pv_key_kind kind;
        const char *what;
        ck_area area;
    } per_wl[] = {{PV_KEY_WL_STATUS, "its status", CK_AREA_WORKLOADS},
                  {PV_KEY_WL_DEPLOY, "its deploy options", CK_AREA_WORKLOADS},
                  {PV_KEY_WL_VOLS, "its volume set", CK_AREA_STORAGE}};
    for (size_t p = 0; rc == PV_OK && p < sizeof per_wl / sizeof per_wl[0]; p++) {
        pv_strv left = {0};
        rc = scan_kind(c, per_wl[p].kind, &left, st);
        for (size_t i = 0; rc == PV_OK && i < left.n; i++) {
            if (pv_strv_has(&c->wl_ids, left.v[i])) continue;
            char subject[PV_KEY_MAX], key[2 * PV_KEY_MAX];
            snprintf(subject, sizeof subject, "workload %s", left.v[i]);
            if (pv_key(c->k, per_wl[p].kind, left.v[i], key, sizeof key, st) != PV_OK) {
                rc = st->code;
                break;
            }
            ADD(c->rep, per_wl[p].area, "WL_LEFTOVER", subject,
                "%s remains (%s) but the workload has no record", per_wl[p].what, key);
        }
        pv_strv_free(&left);
    }
    /* the machine: local process engines, registered or not */
    if (rc == PV_OK) rc = check_unregistered_engines(c, st);
    for (size_t i = 0; rc == PV_OK && i < c->nnodes; i++) {
        const pv_node *n = &c->nodes[i];
        if (c->local[i]) {
            rc = check_engine(c, n, st);
        } else {
            rc = check_inventory(c, n, st);
            if (rc == PV_OK) rc = check_domains(c, n, st);
        }
    }
    return rc;
}

/* ---- storage -----------------------------------------------------------------------------------
 */

/* The format a file's first bytes say (pv_storage's numbers): qcow2 "QFI\xfb", vmdk "KDMV",
 * vdi's signature 0xbeda107f at offset 64; anything else is raw. -1 when unreadable. */
static int file_format(const char *path) {
    unsigned char b[72] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t len = read(fd, b, sizeof b);
    close(fd);
    if (len < 0) return -1;
    if (len >= 4 && memcmp(b, "QFI\xfb", 4) == 0) return PV_VOL_QCOW2;
    if (len >= 4 && memcmp(b, "KDMV", 4) == 0) return PV_VOL_VMDK;
    if (len >= 68 && b[64] == 0x7f && b[65] == 0x10 && b[66] == 0xda && b[67] == 0xbe)
        return PV_VOL_VDI;
    return PV_VOL_RAW;
}

/* The snapshot tags of a qcow2 file (`qemu-img snapshot -l -U`: -U because a running guest may
 * hold the file's lock) into tags. PV_INTERNAL naming the file when qemu-img fails. */
static int qcow2_tags(const char *path, pv_strv *tags, pv_status *st) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return pv_status_set(st, PV_INTERNAL, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char *const argv[] = {"qemu-img", "snapshot", "-l", "-U", (char *)path, NULL};
    pid_t pid = 0;
    int err = posix_spawnp(&pid, "qemu-img", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err != 0) {
        close(fds[0]);
        return pv_status_set(st, PV_INTERNAL, "qemu-img: %s", strerror(err));
    }
    FILE *f = fdopen(fds[0], "r");
    int rc = PV_OK;
    char line[1024];
    /* "Snapshot list:", a header "ID TAG ...", then one line per snapshot: id, tag, ... */
    while (f && fgets(line, sizeof line, f))
        if (rc == PV_OK) {
            char id[256], tag[512];
            if (sscanf(line, "%255s %511s", id, tag) == 2 && strcmp(id, "ID") != 0 &&
                strcmp(id, "Snapshot") != 0 && pv_strv_add(tags, tag) != 0)
                rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        }
    if (f)
        fclose(f);
    else
        close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (rc == PV_OK && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = pv_status_set(st, PV_INTERNAL, "qemu-img snapshot -l %s failed", path);
    pv_strv_sort(tags);
    return rc;
}

/* One volume and its snapshots. on_disk: its pool is a DIR pool of a node on this machine. */
static int check_volume(ck_ctx *c, const pv_volume *vol, bool on_disk, pv_status *st) {
    const char *id = vol->id, *path = vol->path ? vol->path : "";
    int status = vol->status, format = vol->format;
    char subject[PV_KEY_MAX];
    snprintf(subject, sizeof subject, "volume %s", id);
    int rc = PV_OK;
    if (status == PV_VOL_IN_USE) {
        const char *holder = vol->in_use_by ? vol->in_use_by : "";
        if (!*holder)
            ADD(c->rep, CK_AREA_STORAGE, "VOL_HOLDER", subject, "IN_USE but names no holder");
        else if (!pv_strv_has(&c->wl_ids, holder))
            ADD(c->rep, CK_AREA_STORAGE, "VOL_HOLDER", subject,
                "IN_USE by workload %s, which does not exist", holder);
    }
    /* the holder key (what attach claims first) and the record agree */
    redisReply *user = NULL;
    if (rc == PV_OK) rc = KEY_CMD(c, &user, st, "GET", PV_KEY_VOL_USER, id);
    if (rc == PV_OK) {
        const char *held = user->type == REDIS_REPLY_STRING ? user->str : "";
        const char *recorded = status == PV_VOL_IN_USE && vol->in_use_by ? vol->in_use_by : "";
        if (strcmp(held, recorded) != 0)
            ADD(c->rep, CK_AREA_STORAGE, "VOL_HOLDER", subject,
                "its holder key names %s but its record says %s%s", *held ? held : "nobody",
                status == PV_VOL_IN_USE ? "IN_USE by " : "not in use",
                status == PV_VOL_IN_USE ? (*recorded ? recorded : "nobody") : "");
    }
    if (user) freeReplyObject(user);
    bool settled = status == PV_VOL_READY || status == PV_VOL_IN_USE;
    bool file_ok = false;
    if (rc == PV_OK && on_disk && settled) {
        struct stat sb;
        if (!*path || stat(path, &sb) != 0) {
            ADD(c->rep, CK_AREA_STORAGE, "VOL_MISSING", subject,
                "%s in pool %s: its file %s does not exist", vol->name, vol->pool,
                *path ? path : "(no path recorded)");
        } else {
            int have = file_format(path);
            file_ok = true;
            if (have > 0 && have != format)
                ADD(c->rep, CK_AREA_STORAGE, "VOL_FORMAT", subject,
                    "recorded as %s, but its file %s is %s", pv_storage_format_name(format) ?: "?",
                    path, pv_storage_format_name(have) ?: "?");
        }
    }
    pv_snapshot *snaps = NULL;
    size_t n = 0;
    if (rc == PV_OK) rc = pv_storage_list(c->r, c->k, PV_STO_SNAP, id, (void **)&snaps, &n, st);
    pv_strv snap_ids = {0}, tags = {0};
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        if (pv_strv_add(&snap_ids, snaps[i].id) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    pv_strv_sort(&snap_ids);
    c->rep->snapshots += (long)snap_ids.n;
    const char *cur = vol->current_snapshot;
    if (rc == PV_OK && *cur && !pv_strv_has(&snap_ids, cur))
        ADD(c->rep, CK_AREA_STORAGE, "VOL_SNAPSHOT", subject,
            "its current snapshot %s does not exist", cur);
    bool have_tags = false;
    if (rc == PV_OK && file_ok && format == PV_VOL_QCOW2 && snap_ids.n > 0) {
        pv_status qst = {0};
        if (qcow2_tags(path, &tags, &qst) == PV_OK)
            have_tags = true;
        else if (ck_report_note(c->rep, "volume %s: snapshot tags not checked: %s", id, qst.msg) !=
                 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const pv_snapshot *s = &snaps[i];
        char ssub[PV_KEY_MAX];
        snprintf(ssub, sizeof ssub, "snapshot %s", s->id);
        if (strcmp(s->volume_id, id) != 0)
            ADD(c->rep, CK_AREA_STORAGE, "SNAP_VOLUME", ssub,
                "listed under volume %s but records volume %s", id, s->volume_id);
        if (*s->parent && !pv_strv_has(&snap_ids, s->parent))
            ADD(c->rep, CK_AREA_STORAGE, "SNAP_PARENT", ssub,
                "its parent %s does not exist in volume %s", s->parent, id);
        if (have_tags && s->status == PV_SNAP_READY && !pv_strv_has(&tags, s->id))
            ADD(c->rep, CK_AREA_STORAGE, "SNAP_TAG", ssub,
                "volume %s's file %s has no internal snapshot of that tag", id, path);
    }
    pv_strv_free(&snap_ids);
    pv_strv_free(&tags);
    pv_storage_array_free(PV_STO_SNAP, snaps, n);
    return rc;
}

/* A file pool (DIR, NFS) of a node on this machine whose directory is not in the storage roots
 * or is reached through a link: made before the roots were enforced, or changed on the disk
 * since. The agent refuses to act on it; the operator decides what becomes of it. */
static int check_pool_root(ck_ctx *c, const pv_pool *pool, const pv_roots *roots, pv_status *st) {
    int rc = PV_OK;
    const char *path = pv_json_str(pool->config, "path");
    pv_status why;
    if (pv_path_confine_dir("config.path", path, roots, 0, &why) != PV_OK)
        ADD(c->rep, CK_AREA_STORAGE, "POOL_OUTSIDE_ROOTS", pool->name, "pool %s: %s", pool->name,
            why.msg);
    return rc;
}

static int check_storage(ck_ctx *c, pv_status *st) {
    pv_pool *pools = NULL;
    size_t np = 0;
    pv_roots roots;
    if (pv_path_roots_init(&roots, c->o->cfg->storage.roots, c->o->cfg->storage.n_roots,
                           c->o->cfg->data_dir, st) != PV_OK)
        return st->code;
    int rc = pv_storage_list(c->r, c->k, PV_STO_POOL, NULL, (void **)&pools, &np, st);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char *dot = strchr(host, '.');
    if (dot) *dot = 0;
    for (size_t i = 0; rc == PV_OK && i < np; i++) {
        const pv_pool *p = &pools[i];
        c->rep->pools++;
        const char *name = p->name, *node = p->node;
        if (!*node)
            node = *c->o->cfg->storage.default_node ? c->o->cfg->storage.default_node : host;
        const pv_node *n = node_by_name(c, node);
        int type = p->type;
        bool dir = type == PV_POOL_DIR;
        bool on_disk = dir && node_local(c, n);
        if ((type == PV_POOL_DIR || type == PV_POOL_NFS) && node_local(c, n))
            rc = check_pool_root(c, p, &roots, st);
        pv_volume *vols = NULL;
        size_t nv = 0;
        rc = pv_storage_list(c->r, c->k, PV_STO_VOL, name, (void **)&vols, &nv, st);
        if (rc == PV_OK && nv > 0 && !on_disk &&
            ck_report_note(c->rep, "pool %s: its volumes' files are not checked (%s)", name,
                           !dir ? "not a DIR pool" : "its node's agent is not on this machine") !=
                0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        for (size_t j = 0; rc == PV_OK && j < nv; j++) {
            c->rep->volumes++;
            rc = check_volume(c, &vols[j], on_disk, st);
        }
        pv_storage_array_free(PV_STO_VOL, vols, nv);
    }
    pv_storage_array_free(PV_STO_POOL, pools, np);
    pv_path_roots_clear(&roots);
    return rc;
}

/* ---- clusters ----------------------------------------------------------------------------------
 */

static int check_upgrade(ck_ctx *c, const char *cluster_id, const char *cluster_name,
                         pv_status *st) {
    pv_upgrade_rec up;
    int rc = pv_upgrade_get(c->r, c->k, cluster_id, &up, st);
    if (rc == PV_NOT_FOUND) return PV_OK;
    if (rc != PV_OK) return rc;
    /* a finished upgrade is history: its nodes may have been removed since */
    if (!pv_upgrade_phase_done(up.phase)) {
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "cluster %s", cluster_name);
        for (size_t i = 0; rc == PV_OK && i < up.n_nodes; i++) {
            const pv_upgrade_node *n = &up.nodes[i];
            if (!pv_strv_has(&c->node_ids, n->id))
                ADD(c->rep, CK_AREA_CLUSTERS, "UPGRADE_NODE", subject,
                    "its upgrade %s (batch %lld) names node %s (%s), which does not exist",
                    up.operation_id, (long long)n->batch, n->name, n->id);
        }
        pv_op op = {0};
        pv_status ost = {0};
        int orc = pv_op_get(c->r, c->k, up.operation_id, &op, &ost);
        if (rc == PV_OK && (orc == PV_NOT_FOUND || (orc == PV_OK && pv_op_done(&op))))
            ADD(c->rep, CK_AREA_CLUSTERS, "UPGRADE_STALE", subject,
                "its upgrade is still in phase %d but its operation %s %s%s", up.phase,
                up.operation_id, orc == PV_OK ? "ended " : "has no record",
                orc == PV_OK ? pv_op_status_name(op.status) : "");
        else if (rc == PV_OK && orc != PV_OK)
            rc = pv_status_set(st, orc, "%s", ost.msg);
        pv_op_clear(&op);
    }
    pv_upgrade_rec_free(&up);
    return rc;
}

static int check_clusters(ck_ctx *c, pv_status *st) {
    redisReply *pods = NULL;
    int rc = KEY_CMD(c, &pods, st, "HGETALL", PV_KEY_PODS, NULL);
    pv_strv pod_ids = {0};
    for (size_t i = 0; rc == PV_OK && pods->type == REDIS_REPLY_ARRAY && i + 1 < pods->elements;
         i += 2) {
        const char *name = pods->element[i]->str, *id = pods->element[i + 1]->str;
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "cluster %s", name);
        c->rep->clusters++;
        if (pv_strv_add(&pod_ids, id) != 0) {
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
            break;
        }
        redisReply *ex = NULL, *members = NULL;
        rc = KEY_CMD(c, &ex, st, "EXISTS", PV_KEY_POD, id);
        if (rc == PV_OK && ex->integer == 0)
            ADD(c->rep, CK_AREA_CLUSTERS, "CLUSTER_INDEX", subject,
                "indexed as %s, which has no record", id);
        if (rc == PV_OK) rc = KEY_CMD(c, &members, st, "SMEMBERS", PV_KEY_POD_NODES, id);
        for (size_t m = 0;
             rc == PV_OK && members->type == REDIS_REPLY_ARRAY && m < members->elements; m++)
            if (!pv_strv_has(&c->node_ids, members->element[m]->str))
                ADD(c->rep, CK_AREA_CLUSTERS, "CLUSTER_NODE", subject,
                    "lists node %s, which does not exist", members->element[m]->str);
        if (ex) freeReplyObject(ex);
        if (members) freeReplyObject(members);
        if (rc == PV_OK) rc = check_upgrade(c, id, name, st);
    }
    if (pods) freeReplyObject(pods);
    pv_strv_sort(&pod_ids);
    for (size_t i = 0; rc == PV_OK && i < c->nnodes; i++) {
        const pv_node *n = &c->nodes[i];
        char subject[PV_KEY_MAX];
        snprintf(subject, sizeof subject, "node %s", n->name);
        if (!n->pod_id || !pv_strv_has(&pod_ids, n->pod_id))
            ADD(c->rep, CK_AREA_CLUSTERS, "NODE_CLUSTER", subject,
                "belongs to cluster %s (%s), which does not exist", n->pod_name ?: "?",
                n->pod_id ?: "?");
    }
    pv_strv_free(&pod_ids);
    return rc;
}

/* ---- the pass ----------------------------------------------------------------------------------
 */

int ck_audit_run(pv_redis *r, const pv_keys *k, const ck_opts *o, ck_report *out, pv_status *st) {
    ck_ctx c = {.r = r, .k = k, .o = o, .rep = out};
    int rc = pv_registry_list_nodes(r, k, NULL, &c.nodes, &c.nnodes, st);
    if (rc == PV_OK) rc = pv_workload_list(r, k, NULL, NULL, NULL, NULL, &c.wls, &c.nwls, st);
    if (rc == PV_OK && !(c.local = calloc(c.nnodes ? c.nnodes : 1, sizeof *c.local)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < c.nnodes; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/engine/%s", o->cfg->data_dir, c.nodes[i].name);
        c.local[i] = c.nodes[i].engine && strcmp(c.nodes[i].engine, "process") == 0 && is_dir(dir);
        out->local_nodes += c.local[i];
        if (pv_strv_add(&c.node_ids, c.nodes[i].id) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    out->nodes = (long)c.nnodes;
    for (size_t i = 0; rc == PV_OK && i < c.nwls; i++)
        if (pv_strv_add(&c.wl_ids, c.wls[i].id) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    pv_strv_sort(&c.node_ids);
    pv_strv_sort(&c.wl_ids);
    if (rc == PV_OK) rc = check_ops(&c, st);
    if (rc == PV_OK) rc = check_reservations(&c, st);
    if (rc == PV_OK) rc = check_workloads(&c, st);
    if (rc == PV_OK) rc = check_storage(&c, st);
    if (rc == PV_OK) rc = check_clusters(&c, st);
    pv_strv_free(&c.node_ids);
    pv_strv_free(&c.wl_ids);
    free(c.local);
    pv_workload_array_free(c.wls, c.nwls);
    pv_node_array_free(c.nodes, c.nnodes);
    return rc;
}
