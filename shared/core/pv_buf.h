/*
 * pv_buf: a growable text buffer appended to with printf formats, for the texts built piece by
 * piece (the metrics exposition, a storage pool's libvirt XML). An allocation failure sets oom
 * and makes every later append a no-op, so a builder checks once at the end.
 *
 * Ownership: the buffer owns s (NUL-terminated once anything was appended); the caller frees
 * it with pv_buf_free, or takes it (s) and frees it itself.
 */
#ifndef PV_BUF_H
#define PV_BUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct pv_buf {
    char *s;
    size_t len, cap;
    bool oom;
} pv_buf;

/* Appends the formatted text (the first allocation is 512 bytes, then doubling). */
void pv_buf_addf(pv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pv_buf_vaddf(pv_buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Frees s and zeroes the buffer. */
void pv_buf_free(pv_buf *b);

#endif
