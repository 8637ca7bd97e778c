/*
 * pv_metrics: Prometheus metrics of a process: counters and histograms kept in memory, rendered
 * in the text exposition format (version 0.0.4) and served on an HTTP port by libmicrohttpd
 * (/metrics), with a collector callback for the gauges read at scrape time (from Redis, say).
 *
 * Names follow Prometheus conventions: base units (seconds, bytes), `_total` for counters. A
 * family is created on first use with its help text; series are told apart by their label text,
 * rendered once by the caller with pv_metrics_labels (escaped as the format wants).
 *
 * Threads: every call may come from any thread (one mutex). The HTTP server runs its own thread;
 * the collector runs on it.
 *
 * Ownership: pv_metrics_new / pv_metrics_free; pv_metrics_render's text is the caller's to free;
 * pv_metrics_serve borrows the registry (it must outlive the server) and copies nothing else.
 */
#ifndef PV_METRICS_H
#define PV_METRICS_H

#include <stddef.h>

#include "pv_buf.h"
#include "pv_status.h"

typedef struct pv_metrics pv_metrics;

pv_metrics *pv_metrics_new(void);
void pv_metrics_free(pv_metrics *m);

/* Renders n label pairs (kv[2i] = name, kv[2i+1] = value) as `a="x",b="y"` into buf, escaping
 * backslashes, quotes and newlines. Truncates rather than overflows. */
void pv_metrics_labels(char *buf, size_t cap, size_t n, const char *const *kv);

/* Adds v (>= 0) to the counter series name{labels}. */
void pv_metrics_count(pv_metrics *m, const char *name, const char *help, const char *labels,
                      double v);

/* Observes v in the histogram name{labels} (buckets 5 ms .. 60 s, the usual latency ladder). */
void pv_metrics_observe(pv_metrics *m, const char *name, const char *help, const char *labels,
                        double v);

/* Appends a gauge family with its series to a text being built (for collectors): help and type
 * once, then one line per value. */
typedef pv_buf pv_metrics_text;
void pv_metrics_text_family(pv_metrics_text *t, const char *name, const char *type,
                            const char *help);
void pv_metrics_text_value(pv_metrics_text *t, const char *name, const char *labels, double v);

/* The registry's text, then what collect (may be NULL) appends. *out is malloc'd. */
typedef void (*pv_metrics_collect_fn)(void *arg, pv_metrics_text *t);
int pv_metrics_render(pv_metrics *m, pv_metrics_collect_fn collect, void *arg, char **out,
                      size_t *len, pv_status *st);

/* Serves GET /metrics on listen ("host:port"; host an IPv4 address or "localhost"). */
typedef struct pv_metrics_server pv_metrics_server;
int pv_metrics_serve(pv_metrics *m, const char *listen, pv_metrics_collect_fn collect, void *arg,
                     pv_metrics_server **out, pv_status *st);
void pv_metrics_server_stop(pv_metrics_server *srv);

#endif
