/*
 * op_convert: pv_op -> pivirt.operations.v1.Operation.
 *
 * The message is built on the stack of the caller around the record's own strings: nothing is
 * copied but the metadata map, which has to be parsed out of its JSON text. gw_call_send packs
 * the message at once, so the borrowed pieces only have to live until it returns.
 */
#include "op_convert.h"

#include <time.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "pv_time.h"
#include "pv_log.h"
#include "pv_status.h"

static char *text(char *s) {
    return s ? s : (char *)protobuf_c_empty_string;
}

static Google__Protobuf__Timestamp *timestamp(int64_t ms, Google__Protobuf__Timestamp *ts) {
    if (ms <= 0) return NULL;
    google__protobuf__timestamp__init(ts);
    ts->seconds = ms / 1000;
    ts->nanos = (int32_t)(ms % 1000) * 1000000;
    return ts;
}

static int fill_metadata(const char *json, op_convert_msg *out, pv_status *st) {
    if (!json || !*json) return PV_OK;
    json_t *obj = json_loads(json, 0, NULL);
    if (!json_is_object(obj)) {
        json_decref(obj);
        return PV_OK;
    }
    size_t n = json_object_size(obj);
    if (n == 0) {
        json_decref(obj);
        return PV_OK;
    }
    out->entries = calloc(n, sizeof *out->entries);
    out->entry_ptrs = calloc(n, sizeof *out->entry_ptrs);
    if (!out->entries || !out->entry_ptrs) {
        json_decref(obj);
        return pv_status_set(st, PV_INTERNAL, "out of memory converting operation metadata");
    }
    out->json = obj;
    const char *key;
    json_t *value;
    size_t k = 0;
    json_object_foreach(obj, key, value) {
        if (!json_is_string(value)) continue;
        Pivirt__Operations__V1__Operation__MetadataEntry *e = &out->entries[k];
        pivirt__operations__v1__operation__metadata_entry__init(e);
        e->key = (char *)key;
        e->value = (char *)json_string_value(value);
        out->entry_ptrs[k++] = e;
    }
    out->msg.n_metadata = k;
    out->msg.metadata = out->entry_ptrs;
    return PV_OK;
}

int op_convert_fill(const pv_op *op, op_convert_msg *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    Pivirt__Operations__V1__Operation *m = &out->msg;
    pivirt__operations__v1__operation__init(m);
    m->id = (char *)op->id;
    m->kind = text(op->kind);
    m->target = text(op->target);
    m->status = (Pivirt__Operations__V1__OperationStatus)op->status;
    m->done = pv_op_done(op);
    m->progress_percent = op->progress;
    m->message = text(op->message);
    if (op->status == PV_OP_FAILED || op->status == PV_OP_CANCELLED) {
        pivirt__operations__v1__operation_error__init(&out->error);
        out->error.code = op->error_code;
        out->error.message = text(op->error_message);
        m->error = &out->error;
    }
    m->created_at = timestamp(op->created_ms, &out->created);
    m->updated_at = timestamp(op->updated_ms, &out->updated);
    m->started_at = timestamp(op->started_ms, &out->started);
    m->finished_at = timestamp(op->finished_ms, &out->finished);
    m->attempts = op->attempts;
    m->max_attempts = op->max_attempts;
    m->worker = text(op->worker);
    m->request_id = text(op->request_id);
    m->cancel_requested = op->cancel_requested;
    return fill_metadata(op->metadata, out, st);
}

void op_convert_free(op_convert_msg *m) {
    if (!m) return;
    free(m->entries);
    free(m->entry_ptrs);
    json_decref(m->json);
    m->entries = NULL;
    m->entry_ptrs = NULL;
    m->json = NULL;
}

int op_convert_send(gw_call *c, const pv_op *op) {
    op_convert_msg m;
    pv_status st;
    if (op_convert_fill(op, &m, &st) != PV_OK) {
        pv_error("operation id=%s: %s", op->id, st.msg);
        op_convert_free(&m);
        return -1;
    }
    int rc = gw_call_send(c, &m.msg.base);
    op_convert_free(&m);
    return rc;
}

void op_convert_reply(gw_call *c, const pv_op *op) {
    op_convert_msg m;
    pv_status st;
    if (op_convert_fill(op, &m, &st) != PV_OK) {
        op_convert_free(&m);
        gw_call_finishf(c, PV_INTERNAL, "operation %s: %s", op->id, st.msg);
        return;
    }
    gw_call_reply(c, &m.msg.base);
    op_convert_free(&m);
}

/* The longest op_convert_wait blocks in one read before it looks at the record and the
 * client again: an operation submitted without notify_end is seen done at this pace. */
#define WAIT_SLICE_MS 250

int op_convert_wait(gw_call *c, pv_redis *r, const pv_keys *k, const char *id, int64_t max_ms,
                    pv_op *rec, pv_status *st) {
    int64_t budget = max_ms, left = gw_call_deadline_ms(c);
    if (left != INT64_MAX && left - 200 < budget) budget = left - 200;
    int64_t until = pv_time_mono_ms() + budget;
    /* a blocked read stays well under the connection's command timeout, and short enough to
     * notice a client that went away */
    int64_t slice = WAIT_SLICE_MS, ct = pv_redis_command_timeout_ms(r);
    if (ct > 0 && ct / 2 < slice) slice = ct / 2 > 0 ? ct / 2 : 1;
    char cursor[1][PV_OP_CURSOR_MAX] = {"0"};
    for (;;) {
        if (pv_op_get(r, k, id, rec, st) != PV_OK) return st->code;
        int64_t now = pv_time_mono_ms();
        if (pv_op_done(rec) || now >= until || gw_call_is_closed(c)) return PV_OK;
        pv_op_clear(rec);
        bool woke = false;
        int64_t block = until - now < slice ? until - now : slice;
        if (pv_op_output_wait(r, k, 1, (const char *const[]){id}, cursor, (int)block, &woke, NULL,
                              st) != PV_OK)
            return st->code;
    }
}
