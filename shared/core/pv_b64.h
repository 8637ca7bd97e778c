/*
 * pv_b64: standard base64 (with padding), for binary values carried inside JSON: a serialized
 * request in an operation's parameters, a workload status extension.
 *
 * Ownership: the output is malloc'd and NUL-terminated (decode too, for convenience); the caller
 * frees it.
 */
#ifndef PV_B64_H
#define PV_B64_H

#include <stddef.h>

#include "pv_status.h"

int pv_b64_encode(const void *data, size_t len, char **out, pv_status *st);

/* INVALID_ARGUMENT naming `field` when text is not base64. */
int pv_b64_decode(const char *field, const char *text, unsigned char **out, size_t *out_len,
                  pv_status *st);

#endif
