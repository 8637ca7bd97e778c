/*
 * ck_report: what an audit found: differences (one line each, `KIND subject: what differs`),
 * notes (what was not checked and why) and counts of what was checked.
 *
 * A difference's kind is one of a fixed set of upper-case words (CK_* below name the areas they
 * belong to, for the summary); its subject names the record (`op <id>`, `node <name>`,
 * `workload <id>`, ...). Two reports are compared by kind and subject only (ck_report_keep_seen):
 * a detail may hold figures that move between two passes (an idle time) while the difference
 * stays the same.
 *
 * Ownership: a ck_report owns every string in it; ck_report_free releases them (safe on a zeroed
 * report).
 */
#ifndef CK_REPORT_H
#define CK_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CK_AREA_OPS = 0,
    CK_AREA_RESERVATIONS,
    CK_AREA_WORKLOADS,
    CK_AREA_STORAGE,
    CK_AREA_CLUSTERS,
    CK_AREA_COUNT,
} ck_area;

typedef struct ck_diff {
    ck_area area;
    char *kind, *subject, *detail;
} ck_diff;

typedef struct ck_report {
    ck_diff *diffs;
    size_t ndiffs, cap;
    char **notes;
    size_t nnotes;
    /* what was looked at */
    long ops, queues, nodes, local_nodes, workloads, engine_workloads, reservations, pools, volumes,
        snapshots, clusters;
} ck_report;

/* Adds a difference (printf-style detail). Returns 0, or -1 when out of memory. */
int ck_report_add(ck_report *r, ck_area area, const char *kind, const char *subject,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
int ck_report_note(ck_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Drops from r every difference whose kind and subject are not in other: what a second pass no
 * longer sees was a change in flight, not a difference. */
void ck_report_keep_seen(ck_report *r, const ck_report *other);

/* Differences in a stable order (area, kind, subject). */
void ck_report_sort(ck_report *r);

/* Text: one line per difference, the notes ("note: ..."), then the summary line
 * "check: N differences (ops a, reservations b, ...); checked ... in T ms".
 * JSON: {"differences": [{"kind", "subject", "detail", "area"}], "notes": [...],
 * "counts": {area: n}, "checked": {...}, "total": N, "elapsed_ms": T}. */
void ck_report_print_text(const ck_report *r, FILE *out, int64_t elapsed_ms);
void ck_report_print_json(const ck_report *r, FILE *out, int64_t elapsed_ms);

void ck_report_free(ck_report *r);

#endif
