/*
 * pv_id: identifiers and digests.
 *
 * Ids are "<prefix>-<26 chars>": a ULID (48-bit milliseconds + 80 random bits, Crockford base32,
 * lower case), so ids sort by creation time and never repeat.
 *
 * pv_id_check is the one check of an id a client sends (a cluster, node, operation, pool or
 * volume reference): what cannot name a record is INVALID_ARGUMENT naming the field, so that
 * nothing hostile reaches a key, a path or a NOT_FOUND message.
 */
#ifndef PV_ID_H
#define PV_ID_H

#include <stddef.h>

#include "pv_status.h"

#define PV_ID_MAX 64

/* The longest id or name reference a client may send: every id pivirt mints (PV_ID_MAX),
 * Eru's 64-hex workload ids and every plain name (PV_NAME_MAX) fit. */
#define PV_ID_REF_MAX 128

/* Writes "<prefix>-<ulid>" into out (at least PV_ID_MAX bytes). Returns 0, or -1 when prefix is
 * too long or randomness is unavailable. */
int pv_id_new(const char *prefix, char *out, size_t outlen);

/* A reference to a record by id or name: 1..PV_ID_REF_MAX bytes of [A-Za-z0-9._-], not
 * starting with '-' or '.', no "..". PV_OK, else PV_INVALID_ARGUMENT with a message naming
 * field and the value, quoted, escaped and cut ("cluster_id: \"a/b\" must not contain '/'").
 * Empty is "field: is required". A reference that passes may still name nothing: NOT_FOUND is
 * the lookup's to say. */
int pv_id_check(const char *field, const char *value, pv_status *st);

/* SHA-256 of data as 64 lowercase hex digits plus NUL. */
void pv_sha256_hex(const void *data, size_t len, char out[65]);

#endif
