/*
 * op_convert: an Operation record (shared/pv_op) as the pivirt.operations.v1.Operation message.
 *
 * Every service whose long calls answer with an Operation uses this, so the record looks the
 * same whichever call returns it. Times become google.protobuf.Timestamp (absent while the ms
 * field is 0), the metadata JSON object becomes the string map, error is set only for FAILED
 * and CANCELLED.
 *
 * Ownership: op_convert_msg borrows the strings of the pv_op it was filled from (the pv_op must
 * outlive it) and owns the small pieces it allocates itself; op_convert_free releases those.
 */
#ifndef OP_CONVERT_H
#define OP_CONVERT_H

#include "gw_server.h"
#include "pivirt/operations/v1/operations.pb-c.h"
#include "pv_op.h"
#include "pv_redis.h"

typedef struct op_convert_msg {
    Pivirt__Operations__V1__Operation msg;
    Pivirt__Operations__V1__OperationError error;
    Google__Protobuf__Timestamp created, updated, started, finished;
    Pivirt__Operations__V1__Operation__MetadataEntry *entries; /* n_metadata of them */
    Pivirt__Operations__V1__Operation__MetadataEntry **entry_ptrs;
    void *json; /* the parsed metadata (json_t *): the entries point into it */
} op_convert_msg;

/* Fills out from op. Returns PV_OK or PV_INTERNAL (out of memory). Metadata that is not a JSON
 * object of strings is shown as far as it is (non-string values skipped), never an error: the
 * record is the truth and must stay readable. */
int op_convert_fill(const pv_op *op, op_convert_msg *out, pv_status *st);
void op_convert_free(op_convert_msg *m);

/* Converts and queues op on c (gw_call_send). Returns 0, or -1 when the call is gone or
 * memory ran out. */
int op_convert_send(gw_call *c, const pv_op *op);

/* Waits for operation id to end, at most max_ms and a little less than the call's deadline, or
 * until the client goes; *rec is the record as it is then (done or not). For calls that answer
 * once a short operation ended, submitted with notify_end: the wait blocks on the operation's
 * output stream, whose end entry wakes it the moment the operation ends (at most 250 ms a read,
 * then the record and the client are looked at again). */
int op_convert_wait(gw_call *c, pv_redis *r, const pv_keys *k, const char *id, int64_t max_ms,
                    pv_op *rec, pv_status *st);

/* The whole of a unary answer: op then OK (INTERNAL if it cannot be converted). */
void op_convert_reply(gw_call *c, const pv_op *op);

#endif
