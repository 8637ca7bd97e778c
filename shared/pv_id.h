/*
 * pv_id: identifiers and digests.
 *
 * Ids are "<prefix>-<26 chars>": a ULID (48-bit milliseconds + 80 random bits, Crockford base32,
 * lower case), so ids sort by creation time and never repeat.
 */
#ifndef PV_ID_H
#define PV_ID_H

#include <stddef.h>

#define PV_ID_MAX 64

/* Writes "<prefix>-<ulid>" into out (at least PV_ID_MAX bytes). Returns 0, or -1 when prefix is
 * too long or randomness is unavailable. */
int pv_id_new(const char *prefix, char *out, size_t outlen);

/* SHA-256 of data as 64 lowercase hex digits plus NUL. */
void pv_sha256_hex(const void *data, size_t len, char out[65]);

#endif
