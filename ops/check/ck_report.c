/*
 * ck_report: the findings of an audit and their two output forms (see ck_report.h).
 */
#include "ck_report.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const AREA_NAMES[CK_AREA_COUNT] = {"ops", "reservations", "workloads", "storage",
                                                      "clusters"};

int ck_report_add(ck_report *r, ck_area area, const char *kind, const char *subject,
                  const char *fmt, ...) {
    if (r->ndiffs == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        ck_diff *v = realloc(r->diffs, cap * sizeof *v);
        if (!v) return -1;
        r->diffs = v;
        r->cap = cap;
    }
    ck_diff d = {.area = area, .kind = strdup(kind), .subject = strdup(subject)};
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&d.detail, fmt, ap) < 0) d.detail = NULL;
    va_end(ap);
    if (!d.kind || !d.subject || !d.detail) {
        free(d.kind);
        free(d.subject);
        free(d.detail);
        return -1;
    }
    r->diffs[r->ndiffs++] = d;
    return 0;
}

int ck_report_note(ck_report *r, const char *fmt, ...) {
    char *line = NULL;
    va_list ap;
    va_start(ap, fmt);
    int len = vasprintf(&line, fmt, ap);
    va_end(ap);
    if (len < 0) return -1;
    char **v = realloc(r->notes, (r->nnotes + 1) * sizeof *v);
    if (!v) {
        free(line);
        return -1;
    }
    r->notes = v;
    v[r->nnotes++] = line;
    return 0;
}

static void diff_free(ck_diff *d) {
    free(d->kind);
    free(d->subject);
    free(d->detail);
}

void ck_report_keep_seen(ck_report *r, const ck_report *other) {
    size_t kept = 0;
    for (size_t i = 0; i < r->ndiffs; i++) {
        bool seen = false;
        for (size_t j = 0; !seen && j < other->ndiffs; j++)
            seen = strcmp(r->diffs[i].kind, other->diffs[j].kind) == 0 &&
                   strcmp(r->diffs[i].subject, other->diffs[j].subject) == 0;
        if (seen)
            r->diffs[kept++] = r->diffs[i];
        else
            diff_free(&r->diffs[i]);
    }
    r->ndiffs = kept;
}

static int diff_cmp(const void *a, const void *b) {
    const ck_diff *x = a, *y = b;
    if (x->area != y->area) return (int)x->area - (int)y->area;
    int c = strcmp(x->kind, y->kind);
    if (c == 0) c = strcmp(x->subject, y->subject);
    return c != 0 ? c : strcmp(x->detail, y->detail);
}

void ck_report_sort(ck_report *r) {
    if (r->ndiffs > 1) qsort(r->diffs, r->ndiffs, sizeof *r->diffs, diff_cmp);
}

static void area_counts(const ck_report *r, long counts[CK_AREA_COUNT]) {
    for (int a = 0; a < CK_AREA_COUNT; a++)
        counts[a] = 0;
    for (size_t i = 0; i < r->ndiffs; i++)
        counts[r->diffs[i].area]++;
}

void ck_report_print_text(const ck_report *r, FILE *out, int64_t elapsed_ms) {
    for (size_t i = 0; i < r->ndiffs; i++)
        fprintf(out, "%s %s: %s\n", r->diffs[i].kind, r->diffs[i].subject, r->diffs[i].detail);
    for (size_t i = 0; i < r->nnotes; i++)
        fprintf(out, "note: %s\n", r->notes[i]);
    long counts[CK_AREA_COUNT];
    area_counts(r, counts);
    fprintf(out, "check: %zu difference%s (", r->ndiffs, r->ndiffs == 1 ? "" : "s");
    for (int a = 0; a < CK_AREA_COUNT; a++)
        fprintf(out, "%s%s %ld", a ? ", " : "", AREA_NAMES[a], counts[a]);
    fprintf(out,
            "); checked %ld operations on %ld queues, %ld nodes (%ld on this machine), %ld "
            "workloads (%ld in local engines), %ld reservations, %ld pools, %ld volumes, %ld "
            "snapshots, %ld clusters in %lld ms\n",
            r->ops, r->queues, r->nodes, r->local_nodes, r->workloads, r->engine_workloads,
            r->reservations, r->pools, r->volumes, r->snapshots, r->clusters,
            (long long)elapsed_ms);
}

void ck_report_print_json(const ck_report *r, FILE *out, int64_t elapsed_ms) {
    json_t *diffs = json_array(), *notes = json_array(), *counts = json_object();
    for (size_t i = 0; i < r->ndiffs; i++)
        json_array_append_new(diffs,
                              json_pack("{s:s, s:s, s:s, s:s}", "kind", r->diffs[i].kind, "subject",
                                        r->diffs[i].subject, "detail", r->diffs[i].detail, "area",
                                        AREA_NAMES[r->diffs[i].area]));
    for (size_t i = 0; i < r->nnotes; i++)
        json_array_append_new(notes, json_string(r->notes[i]));
    long c[CK_AREA_COUNT];
    area_counts(r, c);
    for (int a = 0; a < CK_AREA_COUNT; a++)
        json_object_set_new(counts, AREA_NAMES[a], json_integer(c[a]));
    json_t *checked = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "operations", (json_int_t)r->ops,
        "queues", (json_int_t)r->queues, "nodes", (json_int_t)r->nodes, "local_nodes",
        (json_int_t)r->local_nodes, "workloads", (json_int_t)r->workloads, "engine_workloads",
        (json_int_t)r->engine_workloads, "reservations", (json_int_t)r->reservations, "pools",
        (json_int_t)r->pools, "volumes", (json_int_t)r->volumes, "snapshots",
        (json_int_t)r->snapshots, "clusters", (json_int_t)r->clusters);
    json_t *doc = json_pack("{s:o, s:o, s:o, s:o, s:I, s:I}", "differences", diffs, "notes", notes,
                            "counts", counts, "checked", checked, "total", (json_int_t)r->ndiffs,
                            "elapsed_ms", (json_int_t)elapsed_ms);
    if (doc) {
        json_dumpf(doc, out, JSON_INDENT(2) | JSON_SORT_KEYS);
        fputc('\n', out);
    }
    json_decref(doc);
}

void ck_report_free(ck_report *r) {
    if (!r) return;
    for (size_t i = 0; i < r->ndiffs; i++)
        diff_free(&r->diffs[i]);
    free(r->diffs);
    for (size_t i = 0; i < r->nnotes; i++)
        free(r->notes[i]);
    free(r->notes);
    memset(r, 0, sizeof *r);
}
