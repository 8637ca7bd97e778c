/*
 * pv_upload: request bodies in Redis strings of their own (see pv_upload.h).
 */
#include "pv_upload.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int pv_upload_put(pv_redis *r, const pv_keys *k, const void *data, size_t len, char *id,
                  pv_status *st) {
    char key[PV_KEY_MAX], ttl[24];
    if (pv_id_new("up", id, PV_ID_MAX) != 0)
        return pv_status_set(st, PV_INTERNAL, "cannot make an upload id");
    if (pv_key(k, PV_KEY_OP_UPLOAD, id, key, sizeof key, st) != PV_OK) return st->code;
    snprintf(ttl, sizeof ttl, "%d", PV_UPLOAD_TTL_SECONDS);
    const char *argv[] = {"SET", key, data, "EX", ttl};
    const size_t argvlen[] = {3, strlen(key), len, 2, strlen(ttl)};
    redisReply *rep = NULL;
    if (pv_redis_commandv(r, &rep, st, 5, argv, argvlen) != PV_OK) return st->code;
    freeReplyObject(rep);
    return PV_OK;
}

int pv_upload_get(pv_redis *r, const pv_keys *k, const char *id, unsigned char **data, size_t *len,
                  pv_status *st) {
    *data = NULL;
    *len = 0;
    char key[PV_KEY_MAX];
    if (pv_id_check("upload", id, st) != PV_OK ||
        pv_key(k, PV_KEY_OP_UPLOAD, id, key, sizeof key, st) != PV_OK)
        return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "GET %s", key) != PV_OK) return st->code;
    int rc = PV_OK;
    if (rep->type != REDIS_REPLY_STRING)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                           "upload %s is gone: it expired (%d s after its request) or its "
                           "request ended",
                           id, PV_UPLOAD_TTL_SECONDS);
    else if (!(*data = malloc(rep->len ? rep->len : 1)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    else {
        memcpy(*data, rep->str, rep->len);
        *len = rep->len;
    }
    freeReplyObject(rep);
    return rc;
}

void pv_upload_drop(pv_redis *r, const pv_keys *k, const char *id) {
    char key[PV_KEY_MAX];
    pv_status st;
    redisReply *rep = NULL;
    if (pv_key(k, PV_KEY_OP_UPLOAD, id, key, sizeof key, &st) == PV_OK &&
        pv_redis_command(r, &rep, &st, "DEL %s", key) == PV_OK)
        freeReplyObject(rep);
}
