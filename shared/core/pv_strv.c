/*
 * pv_strv: a growable vector of strings (see pv_strv.h).
 */
#include "pv_strv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for one more string and the NULL after it. */
static int grow(pv_strv *s) {
    if (s->n + 1 < s->cap) return 0;
    size_t cap = s->cap ? s->cap * 2 : 8;
    char **v = realloc(s->v, cap * sizeof *v);
    if (!v) {
        s->oom = true;
        return -1;
    }
    s->v = v;
    s->cap = cap;
    return 0;
}

int pv_strv_take(pv_strv *s, char *owned) {
    if (!owned || grow(s) != 0) {
        free(owned);
        s->oom = true;
        return -1;
    }
    s->v[s->n++] = owned;
    s->v[s->n] = NULL;
    return 0;
}

int pv_strv_add(pv_strv *s, const char *str) {
    return pv_strv_take(s, strdup(str ? str : ""));
}

int pv_strv_addf(pv_strv *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *str = NULL;
    if (vasprintf(&str, fmt, ap) < 0) str = NULL;
    va_end(ap);
    return pv_strv_take(s, str);
}

int pv_strv_copy(pv_strv *out, const char *const *v, size_t n) {
    if (grow(out) != 0) return -1;
    out->v[out->n] = NULL;
    for (size_t i = 0; i < n; i++)
        if (pv_strv_add(out, v ? v[i] : NULL) != 0) return -1;
    return 0;
}

void pv_strv_truncate(pv_strv *s, size_t n) {
    while (s->n > n)
        free(s->v[--s->n]);
    if (s->v) s->v[s->n] = NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void pv_strv_sort(pv_strv *s) {
    if (s->n > 1) qsort(s->v, s->n, sizeof *s->v, cmp_str);
}

bool pv_strv_has(const pv_strv *s, const char *x) {
    return s->n && bsearch(&x, s->v, s->n, sizeof *s->v, cmp_str) != NULL;
}

void pv_strv_free(pv_strv *s) {
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}
