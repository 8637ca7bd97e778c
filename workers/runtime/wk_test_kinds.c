/*
 * wk_test_kinds: test.sleep, test.fail and test.flaky (see wk_test_kinds.h).
 *
 * They exist to exercise the pipeline, so they use the handler API the way real handlers will:
 * journaled steps, progress, prompt stops. The side effect of test.sleep is made idempotent the
 * way a real one must be (a per-operation marker checked and set atomically with the effect), so
 * "exactly once in effect" holds even when a worker dies between the effect and its journal
 * entry; the separate run counter shows how often that window was actually hit. The check and the
 * increment run as one Redis function (pv_test_effect) because they must be atomic.
 */
#include "wk_test_kinds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_keys.h"
#include "pv_log.h"
#include "wk_handler.h"

#define NAME_MAX_LEN 128
#define MARKER_SECONDS "604800"

/* A name parameter that becomes part of a key: absent is fine (NULL), too long is not. */
static int name_param(wk_op *op, const char *key, const char **out, pv_status *st) {
    *out = wk_op_param(op, key);
    if (*out && (strlen(*out) == 0 || strlen(*out) > NAME_MAX_LEN))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "params.%s: must be 1 to %d characters, got %zu", key, NAME_MAX_LEN,
                             strlen(*out));
    return PV_OK;
}

/* Counts a delivery that ran, when the operation asks for it (param runs). */
static int count_run(wk_op *op, pv_status *st) {
    const char *name = NULL;
    if (name_param(op, "runs", &name, st) != PV_OK) return st->code;
    if (!name) return PV_OK;
    char key[PV_KEY_MAX];
    if (pv_key(wk_op_keys(op), PV_KEY_TEST_RUNS, name, key, sizeof key, st) != PV_OK)
        return st->code;
    redisReply *reply = NULL;
    int rc = pv_redis_command(wk_op_redis(op), &reply, st, "INCR %s", key);
    if (reply) freeReplyObject(reply);
    return rc;
}

static int sleep_step(wk_op *op, void *arg, char **result, pv_status *st) {
    int rc = wk_op_sleep(op, *(const int *)arg, st);
    if (rc == PV_OK) *result = strdup("slept");
    return rc;
}

static int effect_step(wk_op *op, void *arg, char **result, pv_status *st) {
    const char *name = arg;
    const char *prefix = wk_op_keys(op)->prefix;
    char counter[PV_KEY_MAX], marker[PV_KEY_MAX], runs[PV_KEY_MAX];
    snprintf(counter, sizeof counter, "%stest:effect:%s", prefix, name);
    snprintf(marker, sizeof marker, "%stest:effect:%s:op:%s", prefix, name, wk_op_record(op)->id);
    snprintf(runs, sizeof runs, "%stest:effect_runs:%s", prefix, name);
    redisReply *reply = NULL;
    const char *keys[] = {counter, marker, runs};
    const char *args[] = {wk_op_record(op)->id, MARKER_SECONDS};
    int rc = pv_redis_fcall(wk_op_redis(op), "pv_test_effect", 3, keys, 2, args, &reply, st);
    if (rc != PV_OK) return rc;
    char text[64];
    if (reply->type == REDIS_REPLY_INTEGER && reply->integer > 0)
        snprintf(text, sizeof text, "applied, counter %lld", reply->integer);
    else
        snprintf(text, sizeof text, "already applied");
    freeReplyObject(reply);
    *result = strdup(text);
    return *result ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}

int wk_test_sleep(wk_op *op, pv_status *st) {
    long ms = 0, steps = 0;
    const char *effect = NULL;
    if (wk_op_param_int(op, "ms", 1000, 0, 3600000, &ms, st) != PV_OK ||
        wk_op_param_int(op, "steps", ms > 0 ? 10 : 0, 0, 1000, &steps, st) != PV_OK ||
        name_param(op, "effect", &effect, st) != PV_OK || count_run(op, st) != PV_OK)
        return st->code;
    if (steps == 0 && ms > 0) steps = 1;
    int per_step = steps > 0 ? (int)(ms / steps) : 0;
    long effect_at = steps / 2; /* halfway, so redeliveries land on both sides of it */
    for (long i = 0; i <= steps; i++) {
        if (effect && i == effect_at &&
            wk_op_step(op, "effect", effect_step, (void *)effect, NULL, st) != PV_OK)
            return st->code;
        if (i == steps) break;
        char name[32];
        snprintf(name, sizeof name, "sleep:%ld", i);
        if (wk_op_step(op, name, sleep_step, &per_step, NULL, st) != PV_OK) return st->code;
        int rc = wk_op_progress(op, (int)((i + 1) * 100 / steps), "slept %ld of %ld steps", i + 1,
                                steps);
        if (rc != PV_OK) return wk_op_stop_code(op, st);
    }
    return PV_OK;
}

int wk_test_fail(wk_op *op, pv_status *st) {
    if (count_run(op, st) != PV_OK) return st->code;
    return pv_status_set(st, PV_UNAVAILABLE, "test.fail always fails");
}

int wk_test_flaky(wk_op *op, pv_status *st) {
    long failures = 0;
    if (wk_op_param_int(op, "failures", 1, 0, 1000, &failures, st) != PV_OK ||
        count_run(op, st) != PV_OK)
        return st->code;
    int attempt = wk_op_record(op)->attempts;
    if (attempt <= failures)
        return pv_status_set(st, PV_UNAVAILABLE, "test.flaky failure %d of %ld", attempt, failures);
    return PV_OK;
}
