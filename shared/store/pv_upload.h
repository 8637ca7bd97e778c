/*
 * pv_upload: a large request body handed from a gateway to the node operation that takes it
 * (BuildImage RAW's tar), in a Redis string of its own (<p>{ops}:upload:<id>, raw bytes, with a
 * TTL) instead of the operation's params: a params field is base64 in a JSON text (4/3 the
 * size, built and parsed whole several times over) and stays in the record for
 * ops.retention_seconds, where an upload is needed once.
 *
 * The gateway puts it before it submits the operation and drops it once the operation is done;
 * the TTL (PV_UPLOAD_TTL_SECONDS) takes it away when the gateway could not (its client left, it
 * died). Ownership: pv_upload_get's *data is the caller's to free.
 */
#ifndef PV_UPLOAD_H
#define PV_UPLOAD_H

#include <stddef.h>

#include "pv_id.h"
#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"

/* An operation that has not taken its upload within this long fails naming it. */
#define PV_UPLOAD_TTL_SECONDS 3600

/* Stores data (len bytes) under a new id, written into id (PV_ID_MAX bytes). */
int pv_upload_put(pv_redis *r, const pv_keys *k, const void *data, size_t len, char *id,
                  pv_status *st);

/* The upload id: FAILED_PRECONDITION naming it when it is gone (expired, or dropped). */
int pv_upload_get(pv_redis *r, const pv_keys *k, const char *id, unsigned char **data, size_t *len,
                  pv_status *st);

/* Deletes the upload id (best effort: the TTL does it otherwise). */
void pv_upload_drop(pv_redis *r, const pv_keys *k, const char *id);

#endif
