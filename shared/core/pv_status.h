/*
 * pv_status: how every pivirt function reports failure.
 *
 * A function that can fail returns an int code (PV_OK on success) and fills a caller-owned
 * pv_status with the same code and a message that names what was wrong and the value. The codes
 * are the canonical status codes of gRPC (same numbers), so the gateway passes them through, but
 * nothing in shared/ depends on gRPC. The message lives in the struct: no allocation, nothing to
 * free on any path.
 */
#ifndef PV_STATUS_H
#define PV_STATUS_H

#include <stddef.h>

enum {
    PV_OK = 0,
    PV_CANCELLED = 1,
    PV_UNKNOWN = 2,
    PV_INVALID_ARGUMENT = 3,
    PV_DEADLINE_EXCEEDED = 4,
    PV_NOT_FOUND = 5,
    PV_ALREADY_EXISTS = 6,
    PV_PERMISSION_DENIED = 7,
    PV_RESOURCE_EXHAUSTED = 8,
    PV_FAILED_PRECONDITION = 9,
    PV_ABORTED = 10,
    PV_OUT_OF_RANGE = 11,
    PV_UNIMPLEMENTED = 12,
    PV_INTERNAL = 13,
    PV_UNAVAILABLE = 14,
    PV_DATA_LOSS = 15,
    PV_UNAUTHENTICATED = 16,
};

#define PV_STATUS_MSG_MAX 512

typedef struct pv_status {
    int code;                    /* PV_OK or one of the codes above (or an Eru code, >1000) */
    char msg[PV_STATUS_MSG_MAX]; /* NUL-terminated; truncated, never overflowed */
} pv_status;

/* Sets st (if not NULL) to code and the formatted message; returns code. */
int pv_status_set(pv_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resets st to PV_OK with an empty message. */
void pv_status_clear(pv_status *st);

/* Prefixes the message already in st with "prefix: " (keeps the code); returns st->code. */
int pv_status_prefix(pv_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Room for a value quoted by pv_quote: PV_QUOTE_MAX characters, the quotes and the NUL. */
#define PV_QUOTE_MAX 80
#define PV_QUOTE_BUF (PV_QUOTE_MAX + 8)

/* value as a double-quoted string for a message: '"' and '\\' escaped, bytes below 0x20 and
 * from 0x7f as \xNN, cut with "..." after about PV_QUOTE_MAX characters, so that a client's
 * value can neither flood nor forge a message or a log line. buf has size bytes (at least 8). */
void pv_quote(const char *value, char *buf, size_t size);

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN" for anything else. Static storage. */
const char *pv_code_name(int code);

/* Parses a code name ("NOT_FOUND") into *code; returns 0, or -1 when the name is not a code. */
int pv_code_parse(const char *name, size_t len, int *code);

#endif
