/*
 * pv_sched: the plan-request protocol (see pv_sched.h).
 *
 * The requester blocks with BLPOP in slices shorter than the connection's command timeout, so a
 * long deadline never looks like a dead Redis, and so that a cancelled call stops waiting within
 * a slice. A scheduler that crashes mid-request leaves the entry pending in the group; another
 * scheduler claims it (see scheduler/sched_server.c) while its deadline has not passed.
 */
#include "pv_time.h"
#include "pv_sched.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "pv_id.h"
#include "pv_presence.h"

#define SLICE_MS 500

int pv_sched_key_requests(const pv_keys *k, char *buf, size_t len, pv_status *st) {
    return pv_key(k, PV_KEY_SCHED_REQUESTS, NULL, buf, len, st);
}

int pv_sched_key_reply(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st) {
    return pv_key(k, PV_KEY_SCHED_REPLY, id, buf, len, st);
}

int pv_sched_key_gone(const pv_keys *k, const char *id, char *buf, size_t len, pv_status *st) {
    return pv_key(k, PV_KEY_SCHED_GONE, id, buf, len, st);
}

char *pv_sched_error_body(const pv_status *err, const char *kind) {
    json_t *j = json_pack("{s:{s:i, s:s, s:s}}", "error", "code", err->code, "kind",
                          kind ? kind : "", "message", err->msg);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return text;
}

/* ------------------------------------------------------------------------------------------ */
/* capacity replies                                                                            */

/* Writes v (>= 0) in decimal at p; returns the end. snprintf per node was most of the cost. */
static char *put_uint(char *p, uint64_t v) {
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

int pv_sched_capacity_write(const char *const *names, const int64_t *counts, size_t n,
                            int64_t total, char **body, pv_status *st) {
    *body = NULL;
    if (total < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "capacity: total %lld < 0", (long long)total);
    size_t size = strlen(PV_SCHED_CAPACITY_START) + 2 * 21 + 2;
    for (size_t i = 0; i < n; i++) {
        /* the names of a 10,000-node answer are cold and far apart: ask for one ahead */
        if (i + 8 < n) __builtin_prefetch(names[i + 8]);
        size_t len = strlen(names[i]);
        if (len == 0 || len > PV_SCHED_NAME_MAX || memchr(names[i], '\n', len))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "capacity: node name \"%.64s\" cannot be written (1..%d bytes, "
                                 "no newline)",
                                 names[i], PV_SCHED_NAME_MAX);
        if (counts[i] < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "capacity: node %s: count %lld < 0",
                                 names[i], (long long)counts[i]);
        size += len + 21 + 2;
    }
    char *p = malloc(size);
    if (!p) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char *w = p;
    memcpy(w, PV_SCHED_CAPACITY_START, strlen(PV_SCHED_CAPACITY_START));
    w += strlen(PV_SCHED_CAPACITY_START);
    w = put_uint(w, (uint64_t)total);
    *w++ = ' ';
    w = put_uint(w, (uint64_t)n);
    *w++ = '\n';
    for (size_t i = 0; i < n; i++) {
        w = put_uint(w, (uint64_t)counts[i]);
        *w++ = ' ';
        size_t len = strlen(names[i]);
        memcpy(w, names[i], len);
        w += len;
        *w++ = '\n';
    }
    *w = '\0';
    *body = p;
    return PV_OK;
}

void pv_sched_capacity_clear(pv_sched_capacity *c) {
    if (!c) return;
    free(c->names);
    free(c->counts);
    memset(c, 0, sizeof *c);
}

/* A decimal int64 >= 0 at *p ending with `end`; *p moves past that byte. */
static bool take_uint(char **p, char end, int64_t *out) {
    char *e = NULL;
    if (**p < '0' || **p > '9') return false;
    errno = 0;
    long long v = strtoll(*p, &e, 10);
    if (errno || *e != end) return false;
    *out = v;
    *p = e + 1;
    return true;
}

int pv_sched_capacity_parse(char *body, pv_sched_capacity *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    size_t start = strlen(PV_SCHED_CAPACITY_START);
    char *p = strncmp(body, PV_SCHED_CAPACITY_START, start) == 0 ? body + start : NULL;
    int64_t n = 0;
    if (!p || !take_uint(&p, ' ', &out->total) || !take_uint(&p, '\n', &n))
        return pv_status_set(st, PV_INTERNAL,
                             "capacity reply: the first line is not \"%s<total> "
                             "<n>\"",
                             PV_SCHED_CAPACITY_START);
    /* n comes from the body: no more lines than its bytes can hold */
    if ((size_t)n > strlen(p) / 4)
        return pv_status_set(st, PV_INTERNAL, "capacity reply: %lld lines announced, fewer sent",
                             (long long)n);
    if (n > 0 && (!(out->names = malloc((size_t)n * sizeof *out->names)) ||
                  !(out->counts = malloc((size_t)n * sizeof *out->counts)))) {
        pv_sched_capacity_clear(out);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    for (size_t i = 0; i < (size_t)n; i++) {
        char *nl = NULL;
        if (!take_uint(&p, ' ', &out->counts[i]) || *p == '\n' || !(nl = strchr(p, '\n')) ||
            nl - p > PV_SCHED_NAME_MAX) {
            pv_sched_capacity_clear(out);
            return pv_status_set(st, PV_INTERNAL,
                                 "capacity reply: line %zu is not \"<count> "
                                 "<node name>\"",
                                 i + 2);
        }
        *nl = '\0';
        out->names[i] = p;
        p = nl + 1;
    }
    if (*p != '\0') {
        pv_sched_capacity_clear(out);
        return pv_status_set(st, PV_INTERNAL, "capacity reply: more than %lld lines", (long long)n);
    }
    out->n = (size_t)n;
    return PV_OK;
}

/* ------------------------------------------------------------------------------------------ */

/* PV_OK with the body kept, or the error the body carries. */
static int take_reply(char *body, char **reply, pv_status *st) {
    /* Only a failure is parsed here (it starts as pv_sched_error_body writes it): a capacity
     * answer for a 10,000-node pod is parsed once, by its reader, not twice. */
    if ((body[0] == '{' &&
         strncmp(body, PV_SCHED_ERROR_START, strlen(PV_SCHED_ERROR_START)) != 0) ||
        strncmp(body, PV_SCHED_CAPACITY_START, strlen(PV_SCHED_CAPACITY_START)) == 0) {
        *reply = body;
        return PV_OK;
    }
    json_t *j = json_loads(body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    int rc = PV_OK;
    if (!json_is_object(j)) {
        rc = pv_status_set(st, PV_INTERNAL, "scheduler reply is not a JSON object");
    } else if (e) {
        json_int_t code = json_integer_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        rc = pv_status_set(st, code > 0 && code <= 16 ? (int)code : PV_INTERNAL, "%s",
                           msg ? msg : "scheduler failed without a message");
    }
    json_decref(j);
    if (rc == PV_OK) {
        *reply = body;
        return PV_OK;
    }
    free(body);
    return rc;
}

/* Whether a scheduler is registered, so that a call with none fails soon instead of waiting
 * out its timeout. It costs four commands (the presence index, its clock and the records), so a
 * call asks only when no reply came within PROBE_MS of its request: a live scheduler answers
 * most plans sooner, and then nobody asks. A thread that saw one alive trusts that for a second
 * (for the same connection and prefix): a scheduler that dies in that second makes a call wait
 * for its timeout, as one dying just after the check always could. */
#define PROBE_MS 100
#define LIVE_TRUST_MS 1000
static __thread struct {
    const pv_redis *r;
    char prefix[PV_KEY_MAX];
    int64_t until_ms;
} g_live;

static int scheduler_live(pv_redis *r, const pv_keys *k, pv_status *st) {
    int64_t now = pv_time_now_ms();
    if (g_live.r == r && now < g_live.until_ms && strcmp(g_live.prefix, k->prefix) == 0)
        return PV_OK;
    char **values = NULL;
    size_t n = 0;
    if (pv_presence_list(r, k, "scheduler", &values, &n, st) != PV_OK) return st->code;
    pv_presence_values_free(values, n);
    if (n == 0)
        return pv_status_set(st, PV_UNAVAILABLE,
                             "no scheduler is running: start pivirt-scheduler (./ops/pivirt up "
                             "starts one)");
    g_live.r = r;
    snprintf(g_live.prefix, sizeof g_live.prefix, "%s", k->prefix);
    g_live.until_ms = now + LIVE_TRUST_MS;
    return PV_OK;
}

/* The requester gives up: the reply if it arrived after all, else the request marked gone. */
static int abandon(pv_redis *r, const char *reply_key, const char *gone_key, char **late,
                   pv_status *st) {
    *late = NULL;
    char ttl[16];
    snprintf(ttl, sizeof ttl, "%d", PV_SCHED_GONE_TTL_S);
    const char *keys[] = {reply_key, gone_key}, *args[] = {ttl};
    redisReply *rep = NULL;
    if (pv_redis_fcall(r, "pv_sched_abandon", 2, keys, 1, args, &rep, st) != PV_OK) return st->code;
    int rc = PV_OK;
    if (rep->type == REDIS_REPLY_STRING && !(*late = strdup(rep->str)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    freeReplyObject(rep);
    return rc;
}

/* A BLPOP's reply: the list's element in *reply (PV_OK; NULL when it timed out). rep is freed. */
static int popped(redisReply *rep, char **reply, pv_status *st) {
    *reply = NULL;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
        char *text = strdup(rep->element[1]->str);
        freeReplyObject(rep);
        if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
        return take_reply(text, reply, st);
    }
    freeReplyObject(rep);
    return PV_OK;
}

/* Waits for the reply of a request sent: PV_OK with *reply set, or PV_OK with *reply NULL when
 * the deadline passed, the caller cancelled, or (*none) no scheduler is registered; the status
 * of a Redis failure otherwise. first_waited: its first wait (PROBE_MS, sent with the request)
 * came back empty already, so the presence check comes first. */
static int wait_reply(pv_redis *r, const pv_keys *k, const char *reply_key, int64_t deadline,
                      const pv_sched_call_opts *opts, bool first_waited, char **reply, bool *none,
                      pv_status *st) {
    int cmd_timeout = pv_redis_command_timeout_ms(r);
    int64_t slice_max =
        (cmd_timeout == 0 || cmd_timeout > 2 * SLICE_MS) ? SLICE_MS : cmd_timeout / 2;
    if (slice_max < 10) slice_max = 10;
    bool waited = first_waited, probed = false;
    for (;;) {
        if (waited && !probed) { /* the first wait came back empty: is a scheduler there? */
            probed = true;
            int rc = scheduler_live(r, k, st);
            if (rc == PV_UNAVAILABLE) {
                *none = true;
                return PV_OK;
            }
            if (rc != PV_OK) return rc;
        }
        int64_t left = deadline - pv_time_now_ms();
        if (left <= 0) return PV_OK;
        if (opts->cancelled && opts->cancelled(opts->arg)) return PV_OK;
        int64_t slice = left < slice_max ? left : slice_max;
        if (!probed && slice > PROBE_MS) slice = PROBE_MS;
        char secs[32];
        snprintf(secs, sizeof secs, "%.3f", (double)slice / 1000.0);
        redisReply *rep = NULL;
        if (pv_redis_command(r, &rep, st, "BLPOP %s %s", reply_key, secs) != PV_OK) return st->code;
        int prc = popped(rep, reply, st);
        if (prc != PV_OK || *reply) return prc;
        waited = true;
    }
}

/* Sends the request (argv: the XADD of 14 words) and its reply's first wait (a BLPOP of
 * PROBE_MS, cut to the call's timeout) together: one round trip for the usual quick answer. The
 * request's entry id into entry (64 bytes); *first_waited when that wait was made (and came back
 * empty unless *reply is set). */
static int send_and_wait(pv_redis *r, const char **argv, const char *reply_key,
                         const pv_sched_call_opts *opts, char *entry, bool *first_waited,
                         char **reply, pv_status *st) {
    int64_t slice = opts->timeout_ms < PROBE_MS ? opts->timeout_ms : PROBE_MS;
    int cmd_timeout = pv_redis_command_timeout_ms(r);
    if (cmd_timeout > 0 && slice > cmd_timeout / 2) slice = cmd_timeout / 2;
    char secs[32];
    snprintf(secs, sizeof secs, "%.3f", (double)(slice > 0 ? slice : 1) / 1000.0);
    const char *blpop[] = {"BLPOP", reply_key, secs};
    redisReply *rep = NULL;
    int rc = pv_redis_append(r, 14, argv, NULL, st);
    bool waited = rc == PV_OK && pv_redis_append(r, 3, blpop, NULL, st) == PV_OK;
    if (rc == PV_OK) rc = pv_redis_get_reply(r, &rep, st);
    if (rc == PV_OK && rep->type == REDIS_REPLY_STRING) snprintf(entry, 64, "%s", rep->str);
    if (rep) freeReplyObject(rep);
    rep = NULL;
    /* the wait's reply is read whatever the request's was: the connection stays in step */
    pv_status wst;
    int wrc = waited ? pv_redis_get_reply(r, &rep, &wst) : PV_OK;
    if (rc != PV_OK) {
        if (rep) freeReplyObject(rep);
        return rc;
    }
    if (wrc != PV_OK) {
        *st = wst;
        return wrc;
    }
    *first_waited = waited;
    return waited ? popped(rep, reply, st) : PV_OK;
}

int pv_sched_call(pv_redis *r, const pv_keys *k, const char *kind, const char *body,
                  const pv_sched_call_opts *opts, char **reply, pv_status *st) {
    *reply = NULL;
    char id[PV_ID_MAX], stream[PV_KEY_MAX], reply_key[PV_KEY_MAX], gone_key[PV_KEY_MAX];
    if (opts->timeout_ms <= 0)
        return pv_status_set(st, PV_DEADLINE_EXCEEDED, "no time left to ask a scheduler");
    if (opts->request_id && *opts->request_id) {
        if (strncmp(opts->request_id, "plan-", 5) != 0 || strlen(opts->request_id) >= sizeof id)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "request id %s: must start with \"plan-\" and be shorter than "
                                 "%zu bytes",
                                 opts->request_id, sizeof id);
        snprintf(id, sizeof id, "%s", opts->request_id);
    } else if (pv_id_new("plan", id, sizeof id) != 0) {
        return pv_status_set(st, PV_INTERNAL, "cannot make a request id");
    }
    if (pv_sched_key_requests(k, stream, sizeof stream, st) != PV_OK ||
        pv_sched_key_reply(k, id, reply_key, sizeof reply_key, st) != PV_OK ||
        pv_sched_key_gone(k, id, gone_key, sizeof gone_key, st) != PV_OK)
        return st->code;
    int64_t start = pv_time_now_ms(), deadline = start + opts->timeout_ms;
    char deadline_s[24];
    snprintf(deadline_s, sizeof deadline_s, "%lld", (long long)deadline);
    redisReply *rep = NULL;
    /* The schedulers trim the stream below what their group still needs on their tick; MAXLEN
     * bounds it when none runs for a while. */
    const char *argv[] = {"XADD", stream, "MAXLEN", "~",    "100000", "*",           "id",
                          id,     "kind", kind,     "body", body,     "deadline_ms", deadline_s};
    char entry[64] = "";
    bool first_waited = false;
    int rc = send_and_wait(r, argv, reply_key, opts, entry, &first_waited, reply, st);
    if (rc != PV_OK || *reply) return rc;
    bool none = false;
    rc = wait_reply(r, k, reply_key, deadline, opts, first_waited, reply, &none, st);
    if (rc != PV_OK || *reply) return rc;
    char *late = NULL;
    if (abandon(r, reply_key, gone_key, &late, st) != PV_OK) return st->code;
    if (late) return take_reply(late, reply, st);
    if (none) {
        /* nobody will take the entry: it goes (best effort; a scheduler that comes finds it
         * abandoned, and its deadline drops it anyway) */
        const char *del[] = {"XDEL", stream, entry};
        if (*entry && pv_redis_commandv(r, &rep, st, 3, del, NULL) == PV_OK) freeReplyObject(rep);
        return pv_status_set(st, PV_UNAVAILABLE,
                             "no scheduler is running: start pivirt-scheduler (./ops/pivirt up "
                             "starts one)");
    }
    if (opts->cancelled && opts->cancelled(opts->arg))
        return pv_status_set(st, PV_CANCELLED, "the caller went away before a scheduler answered");
    return pv_status_set(st, PV_DEADLINE_EXCEEDED,
                         "no scheduler answered within %lld ms (schedulers busy or stuck?)",
                         (long long)opts->timeout_ms);
}

int pv_sched_reply(pv_redis *r, const pv_keys *k, const char *id, const char *body, pv_status *st) {
    char reply_key[PV_KEY_MAX], gone_key[PV_KEY_MAX], ttl[16];
    if (pv_sched_key_reply(k, id, reply_key, sizeof reply_key, st) != PV_OK ||
        pv_sched_key_gone(k, id, gone_key, sizeof gone_key, st) != PV_OK)
        return st->code;
    snprintf(ttl, sizeof ttl, "%d", PV_SCHED_REPLY_TTL_S);
    const char *keys[] = {reply_key, gone_key}, *args[] = {body, ttl};
    redisReply *rep = NULL;
    if (pv_redis_fcall(r, "pv_sched_reply", 2, keys, 2, args, &rep, st) != PV_OK) return st->code;
    freeReplyObject(rep);
    return PV_OK;
}
