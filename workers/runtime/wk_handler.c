/*
 * wk_handler: the handler table and the running-operation context (see wk_handler.h).
 *
 * The context is where at-least-once delivery is made safe for handlers: every write goes
 * through a fenced pv_op call, a refused write (PV_ABORTED "lease lost") marks the op lost so the
 * handler stops and the consumer writes nothing more, and journaled steps turn a redelivery into
 * a resume. The stop flags live behind the op's own lock and condition variable, so a handler
 * sleeping in wk_op_sleep wakes the moment a cancel, a lost lease or a shutdown is noticed; that
 * is what makes "CANCELLED within 1 s" hold for long sleeps.
 */
#include "wk_handler.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pv_time.h"
#include "pv_kinds.h"
#include "pv_log.h"
#include "wk_cluster.h"
#include "wk_ha.h"
#include "wk_storage.h"
#include "wk_upgrade.h"
#include "wk_deploy.h"
#include "wk_node_deploy.h"
#include "wk_node_files.h"
#include "wk_node_image.h"
#include "wk_node_net.h"
#include "wk_test_kinds.h"

typedef struct wk_str {
    struct wk_str *next;
    char text[];
} wk_str;

struct wk_op {
    pv_op rec;
    int64_t token;
    wk_env env;

    json_t *params; /* parsed on first use; NULL when not an object */
    bool params_parsed;
    wk_str *texts;     /* parameter texts handed out by wk_op_param */
    json_t *journaled; /* steps this delivery journaled: step -> value (NULL: none yet) */
    /* a step's answer not journaled yet (wk_op_step_pending): the next wk_op_output_step
     * writes it with its output; NULL when none */
    char *pending_step, *pending_value;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    bool cancel, lost, shutdown;
    bool final; /* the handler's failure is its answer, whatever its code (wk_op_fail_final) */
    char *end_message; /* the record's last message when it succeeds (wk_op_set_end_message) */
    bool cleanup;      /* a cancel no longer stops the handler (wk_op_begin_cleanup) */
    bool handed;       /* handed over to another queue (wk_op_handover): no outcome to write */
    /* the output entry told with the end (wk_op_output_at_end): end_n fields, its step */
    char **end_fields, **end_values, *end_step;
    size_t end_n;
    char lost_why[PV_STATUS_MSG_MAX];
};

static int flush_end_output(wk_op *op, pv_status *st);

typedef struct wk_handler_entry {
    const char *kind;
    wk_handler_fn fn;
    bool test_only; /* runnable only with test_operations */
} wk_handler_entry;

static const wk_handler_entry k_handlers[] = {
    {PV_KIND_TEST_SLEEP, wk_test_sleep, true},
    {PV_KIND_TEST_FAIL, wk_test_fail, true},
    {PV_KIND_TEST_FLAKY, wk_test_flaky, true},
    {PV_KIND_DEPLOY, wk_deploy_create, false},
    {PV_KIND_DEPLOY_NODE, wk_node_deploy_create, false},
    {PV_KIND_REMOVE_NODE, wk_node_deploy_remove, false},
    {PV_KIND_CONTROL_NODE, wk_node_deploy_control, false},
    {PV_KIND_LOG_NODE, wk_node_deploy_log, false},
    {PV_KIND_EXEC_NODE, wk_node_deploy_exec, false},
    {PV_KIND_REALLOC_NODE, wk_node_deploy_realloc, false},
    {PV_KIND_REPLACE_NODE, wk_node_deploy_replace, false},
    {PV_KIND_SEND_NODE, wk_node_files_send, false},
    {PV_KIND_COPY_NODE, wk_node_files_copy, false},
    {PV_KIND_IMAGE_LIST_NODE, wk_node_image_list, false},
    {PV_KIND_IMAGE_REMOVE_NODE, wk_node_image_remove, false},
    {PV_KIND_IMAGE_CACHE_NODE, wk_node_image_cache, false},
    {PV_KIND_IMAGE_BUILD_NODE, wk_node_image_build, false},
    {PV_KIND_NET_LIST_NODE, wk_node_net_list, false},
    {PV_KIND_NET_CONNECT_NODE, wk_node_net_connect, false},
    {PV_KIND_NET_DISCONNECT_NODE, wk_node_net_disconnect, false},
    {PV_KIND_RAW_NODE, wk_node_net_raw, false},
    {PV_KIND_CORDON, wk_cluster_cordon, false},
    {PV_KIND_UNCORDON, wk_cluster_cordon, false},
    {PV_KIND_DRAIN, wk_cluster_drain, false},
    {PV_KIND_NODE_REMOVE, wk_cluster_remove_node, false},
    {PV_KIND_FAILOVER, wk_ha_failover, false},
    {PV_KIND_CLUSTER_DELETE, wk_cluster_delete, false},
    {PV_KIND_UPGRADE, wk_upgrade_cluster, false},
    {PV_KIND_UPGRADE_NODE, wk_upgrade_node, false},
    {PV_KIND_POOL_CREATE, wk_storage_run, false},
    {PV_KIND_POOL_DELETE, wk_storage_run, false},
    {PV_KIND_VOLUME_CREATE, wk_storage_run, false},
    {PV_KIND_VOLUME_RESIZE, wk_storage_run, false},
    {PV_KIND_VOLUME_CLONE, wk_storage_run, false},
    {PV_KIND_VOLUME_DELETE, wk_storage_run, false},
    {PV_KIND_SNAPSHOT_CREATE, wk_storage_run, false},
    {PV_KIND_SNAPSHOT_RESTORE, wk_storage_run, false},
    {PV_KIND_SNAPSHOT_DELETE, wk_storage_run, false},
};

/* --- construction ---------------------------------------------------------------------------- */

int wk_op_new(const wk_env *env, pv_op *rec, int64_t token, wk_op **out, pv_status *st) {
    *out = NULL;
    wk_op *op = calloc(1, sizeof *op);
    if (!op) return pv_status_set(st, PV_INTERNAL, "out of memory");
    op->rec = *rec;
    memset(rec, 0, sizeof *rec);
    op->token = token;
    op->env = *env;
    pthread_mutex_init(&op->mu, NULL);
    pv_time_cond_init(&op->cv);
    op->cancel = op->rec.cancel_requested;
    *out = op;
    return PV_OK;
}

static void end_output_free(wk_op *op) {
    for (size_t i = 0; i < op->end_n; i++) {
        free(op->end_fields[i]);
        free(op->end_values[i]);
    }
    free(op->end_fields);
    free(op->end_values);
    free(op->end_step);
    op->end_fields = op->end_values = NULL;
    op->end_step = NULL;
    op->end_n = 0;
}

void wk_op_free(wk_op *op) {
    if (!op) return;
    end_output_free(op);
    pv_op_clear(&op->rec);
    if (op->params) json_decref(op->params);
    json_decref(op->journaled);
    free(op->pending_step);
    free(op->pending_value);
    free(op->end_message);
    while (op->texts) {
        wk_str *next = op->texts->next;
        free(op->texts);
        op->texts = next;
    }
    pthread_mutex_destroy(&op->mu);
    pthread_cond_destroy(&op->cv);
    free(op);
}

int64_t wk_op_token(const wk_op *op) {
    return op->token;
}

const pv_op *wk_op_record(const wk_op *op) {
    return &op->rec;
}

pv_redis *wk_op_redis(wk_op *op) {
    return op->env.redis;
}

const pv_keys *wk_op_keys(const wk_op *op) {
    return op->env.keys;
}

const pv_op_opts *wk_op_opts(const wk_op *op) {
    return op->env.opts;
}

void *wk_op_context(const wk_op *op) {
    return op->env.context;
}

const pv_config *wk_op_config(const wk_op *op) {
    return op->env.cfg;
}

int wk_op_output(wk_op *op, size_t n, const char *const *fields, const char *const *values,
                 pv_status *st) {
    if (flush_end_output(op, st) != PV_OK) return st->code;
    if (pv_op_output_add(op->env.redis, op->env.keys, &op->rec, op->token, n, fields, values, NULL,
                         st) == PV_OK)
        return PV_OK;
    if (st->code == PV_ABORTED) wk_op_set_lost(op, st->msg);
    return st->code;
}

/* --- stop flags ------------------------------------------------------------------------------ */

static void set_flag(wk_op *op, bool *flag) {
    pthread_mutex_lock(&op->mu);
    *flag = true;
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
}

static bool get_flag(wk_op *op, const bool *flag) {
    pthread_mutex_lock(&op->mu);
    bool v = *flag;
    pthread_mutex_unlock(&op->mu);
    return v;
}

void wk_op_set_cancel(wk_op *op) {
    set_flag(op, &op->cancel);
}

void wk_op_set_shutdown(wk_op *op) {
    set_flag(op, &op->shutdown);
}

void wk_op_set_lost(wk_op *op, const char *why) {
    pthread_mutex_lock(&op->mu);
    if (!op->lost) snprintf(op->lost_why, sizeof op->lost_why, "%s", why ? why : "lease lost");
    op->lost = true;
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
}

bool wk_op_is_lost(wk_op *op) {
    return get_flag(op, &op->lost);
}

bool wk_op_is_cancelled(wk_op *op) {
    return get_flag(op, &op->cancel);
}

/* Called with op->mu held. A lost lease wins over a cancel: a worker without the lease must not
 * write the CANCELLED outcome either. */
static int stop_code_locked(wk_op *op, pv_status *st) {
    if (op->lost) return pv_status_set(st, PV_ABORTED, "%s", op->lost_why);
    if (op->cancel && !op->cleanup)
        return pv_status_set(st, PV_CANCELLED, "operation %s cancelled", op->rec.id);
    if (op->shutdown) return pv_status_set(st, PV_UNAVAILABLE, "worker shutting down");
    return PV_OK;
}

int wk_op_stop_code(wk_op *op, pv_status *st) {
    pthread_mutex_lock(&op->mu);
    int rc = stop_code_locked(op, st);
    pthread_mutex_unlock(&op->mu);
    return rc;
}

void wk_op_begin_cleanup(wk_op *op) {
    pthread_mutex_lock(&op->mu);
    op->cleanup = true;
    pthread_mutex_unlock(&op->mu);
}

bool wk_op_should_stop(wk_op *op) {
    return wk_op_stop_code(op, NULL) != PV_OK;
}

int wk_op_sleep(wk_op *op, int ms, pv_status *st) {
    struct timespec until = pv_time_mono_after(ms);
    pthread_mutex_lock(&op->mu);
    int rc;
    while ((rc = stop_code_locked(op, st)) == PV_OK &&
           pthread_cond_timedwait(&op->cv, &op->mu, &until) != ETIMEDOUT) {
    }
    if (rc == PV_OK) rc = stop_code_locked(op, st);
    pthread_mutex_unlock(&op->mu);
    return rc;
}

/* --- parameters ------------------------------------------------------------------------------ */

static json_t *param_value(wk_op *op, const char *key) {
    if (!op->params_parsed) {
        op->params_parsed = true;
        json_error_t err;
        const char *text = op->rec.params && *op->rec.params ? op->rec.params : "{}";
        op->params = json_loads(text, 0, &err);
        if (op->params && !json_is_object(op->params)) {
            json_decref(op->params);
            op->params = NULL;
        }
    }
    return op->params ? json_object_get(op->params, key) : NULL;
}

static const char *keep_text(wk_op *op, const char *text) {
    size_t n = strlen(text);
    wk_str *s = malloc(sizeof *s + n + 1);
    if (!s) return NULL;
    memcpy(s->text, text, n + 1);
    s->next = op->texts;
    op->texts = s;
    return s->text;
}

const char *wk_op_param(wk_op *op, const char *key) {
    json_t *v = param_value(op, key);
    char buf[64];
    if (!v) return NULL;
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_integer(v))
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
    else if (json_is_boolean(v))
        snprintf(buf, sizeof buf, "%s", json_is_true(v) ? "true" : "false");
    else
        return NULL;
    return keep_text(op, buf);
}

int wk_op_param_int(wk_op *op, const char *key, long def, long min, long max, long *out,
                    pv_status *st) {
    *out = def;
    const char *text = wk_op_param(op, key);
    if (!text) return PV_OK;
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "params.%s: must be an integer from %ld to %ld, got \"%s\"", key, min,
                             max, text);
    *out = v;
    return PV_OK;
}

/* --- fenced writes --------------------------------------------------------------------------- */

int wk_op_progress(wk_op *op, int percent, const char *fmt, ...) {
    int rc = wk_op_stop_code(op, NULL);
    if (rc != PV_OK) return rc; /* nothing to format: the op stops */
    char msg[PV_STATUS_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pv_status st;
    rc = pv_op_progress(op->env.redis, op->env.keys, op->env.opts, &op->rec, op->token, percent,
                        msg, &st);
    if (rc == PV_ABORTED)
        wk_op_set_lost(op, st.msg);
    else if (rc != PV_OK)
        pv_debug("op progress id=%s not recorded: %s", op->rec.id, st.msg);
    return wk_op_stop_code(op, NULL);
}

/* Waits out a Redis outage between tries of a journal call: PV_OK when it is worth trying
 * again, else the code to give up with (in st): the outage outlasted a lease, or the op should
 * stop. */
static int outage_wait(wk_op *op, int *waited_ms, pv_status *st) {
    if (*waited_ms >= op->env.lease_ms) return st->code;
    int ms = wk_random_between(100, 500);
    *waited_ms += ms;
    return wk_op_sleep(op, ms, st);
}

/* A step's value: what this delivery journaled itself, nothing when the record had no journal
 * when it was leased (so only this delivery's entries can exist: no read), else Redis's. */
static int journal_get(wk_op *op, const char *step, char **value, pv_status *st) {
    *value = NULL;
    json_t *mine = op->journaled ? json_object_get(op->journaled, step) : NULL;
    if (mine) {
        *value = strndup(json_string_value(mine), json_string_length(mine));
        return *value ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (op->rec.unjournaled) return PV_OK;
    int waited = 0;
    for (;;) {
        int rc = pv_op_journal_get(op->env.redis, op->env.keys, op->rec.id, step, value, st);
        if (rc != PV_UNAVAILABLE || outage_wait(op, &waited, st) != PV_OK)
            return rc == PV_OK ? PV_OK : st->code;
    }
}

/* Remembers that this delivery journaled step = value (else the next read asks Redis). */
static void remember(wk_op *op, const char *step, const char *value) {
    if (!op->journaled) op->journaled = json_object();
    json_t *v = json_stringn_nocheck(value, strlen(value));
    if (!op->journaled || !v || json_object_set_new(op->journaled, step, v) != 0)
        op->rec.unjournaled = false;
}

/* One fenced write of m journal entries, with the output entry of n fields when n > 0 (else
 * m must be 1: a plain journal entry). Redis being briefly unreachable is waited out. */
static int journal_write(wk_op *op, size_t m, const char *const *steps, const char *const *values,
                         size_t n, const char *const *fields, const char *const *out_values,
                         pv_status *st) {
    int waited = 0;
    for (;;) {
        int rc = n > 0 ? pv_op_output_journal(op->env.redis, op->env.keys, &op->rec, op->token, m,
                                              steps, values, n, fields, out_values, st)
                       : pv_op_journal_put(op->env.redis, op->env.keys, &op->rec, op->token,
                                           steps[0], values[0], st);
        if (rc == PV_ABORTED) wk_op_set_lost(op, st->msg);
        if (rc == PV_OK)
            for (size_t i = 0; i < m; i++)
                remember(op, steps[i], values[i]);
        if (rc != PV_UNAVAILABLE || outage_wait(op, &waited, st) != PV_OK)
            return rc == PV_OK ? PV_OK : st->code;
    }
}

static int journal_put(wk_op *op, const char *step, const char *value, pv_status *st) {
    return journal_write(op, 1, &step, &value, 0, NULL, NULL, st);
}

/* Journals the pending answer (wk_op_step_pending) on its own, if there is one. */
static int flush_pending(wk_op *op, pv_status *st) {
    if (!op->pending_step) return PV_OK;
    int rc = journal_put(op, op->pending_step, op->pending_value, st);
    free(op->pending_step);
    free(op->pending_value);
    op->pending_step = op->pending_value = NULL;
    return rc;
}

/* Writes the entry wk_op_output_at_end held for the end now, as wk_op_output_step would: a step
 * or an output of the run comes after it. */
static int flush_end_output(wk_op *op, pv_status *st) {
    if (!op->end_n) return PV_OK;
    size_t n = op->end_n;
    op->end_n = 0; /* taken: wk_op_output_step below does not come back here */
    int rc = wk_op_output_step(op, op->end_step, n, (const char *const *)op->end_fields,
                               (const char *const *)op->end_values, st);
    op->end_n = n;
    end_output_free(op);
    return rc;
}

/* wk_op_step, the new answer journaled now or (pending) held for the next wk_op_output_step. */
static int step_run(wk_op *op, const char *step, wk_step_fn fn, void *arg, bool pending,
                    char **result, pv_status *st) {
    if (result) *result = NULL;
    char *value = NULL;
    int rc = flush_end_output(op, st);
    if (rc == PV_OK) rc = flush_pending(op, st);
    if (rc == PV_OK) rc = journal_get(op, step, &value, st);
    if (rc != PV_OK) return rc;
    if (!value) {
        rc = wk_op_stop_code(op, st);
        if (rc == PV_OK) rc = fn(op, arg, &value, st);
        if (rc == PV_OK && !value) value = strdup("");
        if (rc == PV_OK && !value) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        if (rc == PV_OK && pending) {
            op->pending_step = strdup(step);
            op->pending_value = strdup(value);
            if (!op->pending_step || !op->pending_value) rc = flush_pending(op, st);
        } else if (rc == PV_OK) {
            rc = journal_put(op, step, value, st);
        }
        if (rc != PV_OK) {
            free(value);
            return rc;
        }
    }
    if (result)
        *result = value;
    else
        free(value);
    return PV_OK;
}

int wk_op_step(wk_op *op, const char *step, wk_step_fn fn, void *arg, char **result,
               pv_status *st) {
    return step_run(op, step, fn, arg, false, result, st);
}

int wk_op_step_pending(wk_op *op, const char *step, wk_step_fn fn, void *arg, char **result,
                       pv_status *st) {
    return step_run(op, step, fn, arg, true, result, st);
}

int wk_op_journaled(wk_op *op, const char *step, bool *has, pv_status *st) {
    char *value = NULL;
    int rc = journal_get(op, step, &value, st);
    *has = rc == PV_OK && value;
    free(value);
    return rc;
}

int wk_op_output_step(wk_op *op, const char *step, size_t n, const char *const *fields,
                      const char *const *values, pv_status *st) {
    char *done = NULL;
    int rc = flush_end_output(op, st);
    if (rc != PV_OK) return rc;
    rc = journal_get(op, step, &done, st);
    if (rc != PV_OK || done) {
        free(done);
        return rc == PV_OK ? flush_pending(op, st) : rc;
    }
    const char *steps[2], *jvalues[2];
    size_t m = 0;
    if (op->pending_step) {
        steps[m] = op->pending_step;
        jvalues[m++] = op->pending_value;
    }
    steps[m] = step;
    jvalues[m++] = "";
    rc = journal_write(op, m, steps, jvalues, n, fields, values, st);
    free(op->pending_step);
    free(op->pending_value);
    op->pending_step = op->pending_value = NULL;
    return rc;
}

int wk_op_handover(wk_op *op, const char *queue, const char *params_json, int timeout_ms, size_t n,
                   const char *const *fields, const char *const *values, pv_status *st) {
    if (flush_end_output(op, st) != PV_OK) return st->code;
    free(op->pending_step);
    free(op->pending_value);
    op->pending_step = op->pending_value = NULL;
    int waited = 0;
    for (;;) {
        int rc = pv_op_handover(op->env.redis, op->env.keys, op->env.opts, &op->rec, op->token,
                                queue, params_json, timeout_ms, n, fields, values, st);
        if (rc == PV_ABORTED) wk_op_set_lost(op, st->msg);
        if (rc == PV_OK) op->handed = true;
        if (rc != PV_UNAVAILABLE || outage_wait(op, &waited, st) != PV_OK)
            return rc == PV_OK ? PV_OK : st->code;
    }
}

int wk_op_output_at_end(wk_op *op, const char *step, size_t n, const char *const *fields,
                        const char *const *values, pv_status *st) {
    char *done = NULL;
    int rc = flush_end_output(op, st);
    if (rc == PV_OK) rc = journal_get(op, step, &done, st);
    if (rc != PV_OK || done) { /* told by an earlier delivery */
        free(done);
        return rc == PV_OK ? flush_pending(op, st) : rc;
    }
    op->end_fields = calloc(n ? n : 1, sizeof *op->end_fields);
    op->end_values = calloc(n ? n : 1, sizeof *op->end_values);
    op->end_step = strdup(step);
    bool oom = !op->end_fields || !op->end_values || !op->end_step;
    for (size_t i = 0; !oom && i < n; i++) {
        op->end_fields[i] = strdup(fields[i]);
        op->end_values[i] = strdup(values[i] ? values[i] : "");
        op->end_n = i + 1;
        oom = !op->end_fields[i] || !op->end_values[i];
    }
    if (!oom) return PV_OK;
    end_output_free(op);
    return wk_op_output_step(op, step, n, fields, values, st); /* told now, then */
}

size_t wk_op_end_output(const wk_op *op, const char *const **fields, const char *const **values) {
    *fields = (const char *const *)op->end_fields;
    *values = (const char *const *)op->end_values;
    return op->end_n;
}

bool wk_op_handed_over(const wk_op *op) {
    return op->handed;
}

/* --- dispatch -------------------------------------------------------------------------------- */

int wk_random_between(int lo, int hi) {
    static __thread uint64_t state;
    if (state == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        state = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)pthread_self() ^
                ((uint64_t)getpid() << 40);
        state |= 1; /* xorshift must not start at 0 */
    }
    /* xorshift64: cheap, per thread, and good enough to spread retries apart. */
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    if (hi <= lo) return lo;
    return lo + (int)(state % (uint64_t)(hi - lo + 1));
}

int wk_op_fail_final(wk_op *op, pv_status *st, int code, const char *fmt, ...) {
    op->final = true;
    va_list ap;
    va_start(ap, fmt);
    char msg[PV_STATUS_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pv_status_set(st, code, "%s", msg);
}

void wk_op_set_end_message(wk_op *op, const char *fmt, ...) {
    free(op->end_message);
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&op->end_message, fmt, ap) < 0) op->end_message = NULL;
    va_end(ap);
}

const char *wk_op_end_message(const wk_op *op) {
    return op->end_message ? op->end_message : "";
}

bool wk_op_failure_final(const wk_op *op) {
    return op->final;
}

bool wk_code_transient(int code) {
    return code == PV_UNAVAILABLE || code == PV_DEADLINE_EXCEEDED || code == PV_ABORTED ||
           code == PV_RESOURCE_EXHAUSTED;
}

int wk_handler_run(wk_op *op, pv_status *st) {
    const char *kind = op->rec.kind ? op->rec.kind : "";
    for (size_t i = 0; i < sizeof k_handlers / sizeof k_handlers[0]; i++) {
        const wk_handler_entry *h = &k_handlers[i];
        if (strcmp(h->kind, kind) != 0) continue;
        if (h->test_only && !op->env.test_operations)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "no handler for kind %s (test operations are disabled)", kind);
        pv_status_clear(st);
        return h->fn(op, st);
    }
    return pv_status_set(st, PV_INVALID_ARGUMENT, "no handler for kind %s", kind);
}
