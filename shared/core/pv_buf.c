/*
 * pv_buf: a growable printf-appended text (see pv_buf.h).
 */
#include "pv_buf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pv_buf_vaddf(pv_buf *b, const char *fmt, va_list ap) {
    if (b->oom) return;
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) {
        b->oom = true; /* a format that cannot be printed: the text would be wrong */
        return;
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    b->len += (size_t)n;
}

void pv_buf_addf(pv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pv_buf_vaddf(b, fmt, ap);
    va_end(ap);
}

void pv_buf_free(pv_buf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}
