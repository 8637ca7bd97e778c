/*
 * pv_strv: a growable vector of strings, the one every module that collects names, arguments or
 * ids uses (an argv for a child, the keys of one Redis call, a set of ids to look up).
 *
 * v is NULL-terminated whenever it is allocated (v[n] == NULL), so it is execv-ready. An add that
 * runs out of memory returns -1 and also sets oom, which stays set: a caller adding many strings
 * may check once at the end.
 *
 * Ownership: the vector owns its strings; pv_strv_free frees them and the array, leaving the
 * vector empty and reusable. pv_strv_take hands a malloc'd string over (freed on failure too).
 */
#ifndef PV_STRV_H
#define PV_STRV_H

#include <stdbool.h>
#include <stddef.h>

typedef struct pv_strv {
    char **v;
    size_t n, cap;
    bool oom;
} pv_strv;

/* Adds a copy of str (NULL adds ""). 0, or -1 out of memory. */
int pv_strv_add(pv_strv *s, const char *str);

/* Adds owned (malloc'd; NULL counts as out of memory), which the vector then frees. */
int pv_strv_take(pv_strv *s, char *owned);

/* Adds a formatted string. */
int pv_strv_addf(pv_strv *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* out (empty) gets copies of v[0..n) (NULL items as ""), its array allocated even for none, so
 * out->v is an empty argv rather than NULL. */
int pv_strv_copy(pv_strv *out, const char *const *v, size_t n);

/* Drops (and frees) the strings past the first n. */
void pv_strv_truncate(pv_strv *s, size_t n);

/* Sorts in strcmp order; pv_strv_has then finds a string by binary search. */
void pv_strv_sort(pv_strv *s);
bool pv_strv_has(const pv_strv *s, const char *x);

void pv_strv_free(pv_strv *s);

#endif
