/*
 * svc_operations: the OperationService handlers.
 *
 * Thin on purpose: decode and validate, call shared/pv_op, convert (op_convert), answer. Status
 * codes from pv_op pass through unchanged: they are gRPC codes already (NOT_FOUND naming the id,
 * ABORTED naming the operation that holds a resource, UNAVAILABLE when Redis is down).
 *
 * WaitOperation and WatchOperation must not keep a completion-queue thread: they read the
 * record once (one HGETALL) so that unknown ids, a down Redis and finished operations are
 * answered at once, and hand everything else to the waiter. The waiter subscribes before it
 * reads again, so a completion between this read and the subscription is not lost.
 *
 * WaitOperation's wait ends at the earliest of timeout_seconds, the server's maximum (300 s) and
 * shortly before the call's deadline (so the client gets the state, not DEADLINE_EXCEEDED).
 */
#include "svc_operations.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "op_convert.h"
#include "pivirt/operations/v1/operations.pb-c.h"
#include "pv_log.h"
#include "pv_op.h"
#include "pv_status.h"
#include "pv_validate.h"

#define TEST_KIND_PREFIX "test."
#define OPS_QUEUE "ops"

struct svc_operations {
    gw_app *app;
    gw_waiter *waiter;
    pv_op_opts opts;
    gw_method methods[6];
    char paths[6][GW_PATH_MAX];
};

svc_operations *svc_operations_new(gw_app *app, gw_waiter *waiter) {
    svc_operations *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->app = app;
    s->waiter = waiter;
    s->opts = gw_app_op_opts(app);
    return s;
}

void svc_operations_free(svc_operations *s) {
    free(s);
}

static void finish_status(gw_call *call, const pv_status *st) {
    gw_call_finish(call, st->code, st->msg);
}

/* ---------------------------------------------------------------------------------------- */
/* GetOperation, CancelOperation, ListOperations                                             */

/* GetOperation and CancelOperation: an id in, the record (after the call) out. */
static void answer_by_id(gw_call *call, const char *id, bool cancel) {
    svc_operations *s = gw_call_method_data(call);
    pv_status st;
    if (pv_validate_name("id", id, &st) != PV_OK) {
        finish_status(call, &st);
        return;
    }
    pv_redis *r = gw_app_redis(call);
    pv_op op;
    memset(&op, 0, sizeof op);
    int rc = cancel ? pv_op_cancel(r, &s->app->keys, &s->opts, id, &op, &st)
                    : pv_op_get(r, &s->app->keys, id, &op, &st);
    if (rc == PV_OK)
        op_convert_reply(call, &op);
    else
        finish_status(call, &st);
    pv_op_clear(&op);
}

static void on_get(gw_call *call, const ProtobufCMessage *msg) {
    answer_by_id(call, ((const Pivirt__Operations__V1__GetOperationRequest *)msg)->id, false);
}

static void on_cancel(gw_call *call, const ProtobufCMessage *msg) {
    answer_by_id(call, ((const Pivirt__Operations__V1__CancelOperationRequest *)msg)->id, true);
}

static void on_list(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Operations__V1__ListOperationsRequest *req = (const void *)msg;
    svc_operations *s = gw_call_method_data(call);
    pv_status st;
    if (req->limit < 0) {
        gw_call_finishf(call, PV_INVALID_ARGUMENT, "limit: must not be negative, got %d",
                        req->limit);
        return;
    }
    if ((*req->kind && pv_validate_name("kind", req->kind, &st) != PV_OK) ||
        (*req->target && pv_validate_name("target", req->target, &st) != PV_OK)) {
        finish_status(call, &st);
        return;
    }
    pv_op_filter f = {
        .kind = req->kind,
        .target = req->target,
        .status = (pv_op_status)req->status,
        .limit = req->limit == 0                        ? SVC_OPERATIONS_LIST_DEFAULT
                 : req->limit > SVC_OPERATIONS_LIST_MAX ? SVC_OPERATIONS_LIST_MAX
                                                        : req->limit,
    };
    pv_redis *r = gw_app_redis(call);
    pv_op *ops = NULL;
    size_t n = 0;
    if (pv_op_list(r, &s->app->keys, &f, &ops, &n, &st) != PV_OK) {
        finish_status(call, &st);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (op_convert_send(call, &ops[i]) != 0) break; /* the client went away */
    pv_op_array_free(ops, n);
    gw_call_finish(call, PV_OK, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* WaitOperation, WatchOperation                                                             */

/* How long WaitOperation may wait, in ms (<= 0: answer now). */
static int64_t wait_budget_ms(gw_call *call, int timeout_seconds) {
    int64_t max = (int64_t)SVC_OPERATIONS_MAX_WAIT_S * 1000;
    int64_t t = timeout_seconds > 0 ? (int64_t)timeout_seconds * 1000 : max;
    if (t > max) t = max;
    int64_t deadline = gw_call_deadline_ms(call);
    if (deadline != INT64_MAX) {
        /* Answer a little before the deadline so the state reaches the client in time. */
        int64_t margin = deadline / 10 < 100 ? deadline / 10 : 100;
        if (deadline - margin < t) t = deadline - margin;
    }
    return t;
}

/* Reads the record for Wait/Watch; answers the call and returns false when it cannot. */
static bool read_for_wait(gw_call *call, svc_operations *s, const char *id, pv_op *op) {
    pv_status st;
    if (pv_validate_name("id", id, &st) != PV_OK) {
        finish_status(call, &st);
        return false;
    }
    pv_redis *r = gw_app_redis(call);
    if (pv_op_get(r, &s->app->keys, id, op, &st) != PV_OK) {
        finish_status(call, &st);
        return false;
    }
    return true;
}

static void on_wait(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Operations__V1__WaitOperationRequest *req = (const void *)msg;
    svc_operations *s = gw_call_method_data(call);
    if (req->timeout_seconds < 0) {
        gw_call_finishf(call, PV_INVALID_ARGUMENT, "timeout_seconds: must not be negative, got %d",
                        req->timeout_seconds);
        return;
    }
    pv_op op;
    memset(&op, 0, sizeof op);
    if (!read_for_wait(call, s, req->id, &op)) return;
    int64_t budget = wait_budget_ms(call, req->timeout_seconds);
    if (pv_op_done(&op) || budget <= 0)
        op_convert_reply(call, &op);
    else if (gw_waiter_add(s->waiter, call, op.id, GW_WAITER_WAIT, budget, NULL) != 0)
        gw_call_finish(call, PV_INTERNAL, "out of memory registering the wait");
    pv_op_clear(&op);
}

static void on_watch(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Operations__V1__WatchOperationRequest *req = (const void *)msg;
    svc_operations *s = gw_call_method_data(call);
    pv_op op;
    memset(&op, 0, sizeof op);
    if (!read_for_wait(call, s, req->id, &op)) return;
    if (op_convert_send(call, &op) != 0) {
        /* The client is gone (or memory ran out): nothing to watch for. */
        gw_call_finish(call, PV_INTERNAL, "could not send the operation");
    } else if (pv_op_done(&op)) {
        gw_call_finish(call, PV_OK, NULL);
    } else if (gw_waiter_add(s->waiter, call, op.id, GW_WAITER_WATCH, 0, &op) != 0) {
        gw_call_finish(call, PV_INTERNAL, "out of memory registering the watch");
    }
    pv_op_clear(&op);
}

/* ---------------------------------------------------------------------------------------- */
/* CreateTestOperation                                                                       */

/* Parameters the test handlers read as numbers. */
static const char *const numeric_params[] = {"ms", "steps", "failures"};

static int check_param(const char *key, const char *value, pv_status *st) {
    if (!*key) return pv_status_set(st, PV_INVALID_ARGUMENT, "params: a key is empty");
    for (size_t i = 0; i < sizeof numeric_params / sizeof *numeric_params; i++) {
        if (strcmp(key, numeric_params[i]) != 0) continue;
        size_t n = strlen(value);
        if (n == 0 || n > 9 || strspn(value, "0123456789") != n)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "params.%s: \"%.40s\" is not a non-negative integer", key, value);
    }
    return PV_OK;
}

/* The params map as a JSON object text (malloc'd), or NULL with st set. */
static char *params_json(const Pivirt__Operations__V1__CreateTestOperationRequest *req,
                         pv_status *st) {
    json_t *obj = json_object();
    if (!obj) {
        pv_status_set(st, PV_INTERNAL, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < req->n_params; i++) {
        const char *key = req->params[i]->key, *value = req->params[i]->value;
        if (check_param(key, value, st) != PV_OK) {
            json_decref(obj);
            return NULL;
        }
        json_t *v = json_string(value);
        if (!v || json_object_set_new(obj, key, v) != 0) {
            json_decref(obj);
            pv_status_set(st, PV_INVALID_ARGUMENT, "params.%.60s: not valid UTF-8", key);
            return NULL;
        }
    }
    char *text = json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(obj);
    if (!text) pv_status_set(st, PV_INTERNAL, "out of memory");
    return text;
}

static int check_test_request(const svc_operations *s,
                              const Pivirt__Operations__V1__CreateTestOperationRequest *req,
                              pv_status *st) {
    if (!s->app->cfg.test_operations)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "test operations are disabled on this gateway "
                             "(configuration key test_operations is false)");
    if (pv_validate_name("kind", req->kind, st) != PV_OK) return st->code;
    if (strncmp(req->kind, TEST_KIND_PREFIX, strlen(TEST_KIND_PREFIX)) != 0 ||
        !req->kind[strlen(TEST_KIND_PREFIX)])
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "kind: \"%s\" is not a test kind (test.sleep, test.fail, test.flaky)",
                             req->kind);
    if (pv_validate_name("target", req->target, st) != PV_OK) return st->code;
    if (req->max_attempts < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "max_attempts: must not be negative, got %d",
                             req->max_attempts);
    return PV_OK;
}

/* The client's x-request-id into buf ("" when none). */
static int request_id(gw_call *call, char *buf, size_t len, pv_status *st) {
    buf[0] = '\0';
    size_t n = 0;
    const char *v = gw_call_metadata(call, "x-request-id", &n);
    if (!v || n == 0) return PV_OK;
    if (n >= len)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "x-request-id: %zu bytes, at most %zu", n,
                             len - 1);
    memcpy(buf, v, n);
    buf[n] = '\0';
    return PV_OK;
}

static void on_create_test(gw_call *call, const ProtobufCMessage *msg) {
    const Pivirt__Operations__V1__CreateTestOperationRequest *req = (const void *)msg;
    svc_operations *s = gw_call_method_data(call);
    pv_status st;
    char rid[SVC_OPERATIONS_REQUEST_ID_MAX + 1];
    if (check_test_request(s, req, &st) != PV_OK ||
        request_id(call, rid, sizeof rid, &st) != PV_OK) {
        finish_status(call, &st);
        return;
    }
    char *params = params_json(req, &st);
    if (!params) {
        finish_status(call, &st);
        return;
    }
    pv_op_submit_req sub = {
        .kind = req->kind,
        .target = req->target,
        .queue = OPS_QUEUE,
        .params_json = params,
        .metadata_json = params, /* the parameters are what is worth showing of a test */
        .request_id = rid,
        .max_attempts = req->max_attempts > 0 ? req->max_attempts : s->app->cfg.worker.max_attempts,
    };
    pv_op op;
    /* the request id is the one read and checked above (its own bound on length) */
    if (gw_app_submit(call, 0, &sub, &op, NULL, &st) == PV_OK)
        op_convert_reply(call, &op);
    else
        finish_status(call, &st);
    pv_op_clear(&op);
    free(params);
}

/* ---------------------------------------------------------------------------------------- */

int svc_operations_register(svc_operations *s, gw_server *server) {
    /* every OperationService method reads Redis */
#define M(name, kind, req, fn)                                                                     \
    { name, kind, &pivirt__operations__v1__##req##__descriptor, fn, true }
    static const gw_method_spec k[] = {
        M("GetOperation", GW_UNARY, get_operation_request, on_get),
        M("ListOperations", GW_SERVER_STREAM, list_operations_request, on_list),
        M("WaitOperation", GW_UNARY, wait_operation_request, on_wait),
        M("CancelOperation", GW_UNARY, cancel_operation_request, on_cancel),
        M("WatchOperation", GW_SERVER_STREAM, watch_operation_request, on_watch),
        M("CreateTestOperation", GW_UNARY, create_test_operation_request, on_create_test),
    };
#undef M
    _Static_assert(sizeof k / sizeof k[0] == sizeof s->methods / sizeof s->methods[0],
                   "one gw_method a method");
    return gw_server_add_service(server, "pivirt.operations.v1.OperationService", k,
                                 sizeof k / sizeof k[0], s, s->methods, s->paths);
}
