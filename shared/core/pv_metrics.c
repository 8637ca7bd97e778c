/*
 * pv_metrics: an in-memory registry rendered as Prometheus text, served by libmicrohttpd (see
 * pv_metrics.h). The registry is small (tens of families, hundreds of series): linear searches
 * under one mutex cost less than a scrape's HTTP round trip.
 */
#include "pv_metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double k_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define N_BUCKETS (sizeof k_buckets / sizeof k_buckets[0])

typedef struct series {
    char *labels;
    double value; /* counter */
    unsigned long long buckets[N_BUCKETS], count;
    double sum;
} series;

typedef struct family {
    char *name, *help;
    int histogram;
    series *s;
    size_t n, cap;
} family;

struct pv_metrics {
    pthread_mutex_t mu;
    family *f;
    size_t n, cap;
};

pv_metrics *pv_metrics_new(void) {
    pv_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void pv_metrics_free(pv_metrics *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n; i++) {
        for (size_t j = 0; j < m->f[i].n; j++)
            free(m->f[i].s[j].labels);
        free(m->f[i].s);
        free(m->f[i].name);
        free(m->f[i].help);
    }
    free(m->f);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void pv_metrics_labels(char *buf, size_t cap, size_t n, const char *const *kv) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used + 1 < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%s=\"", i ? "," : "", kv[2 * i]);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
        for (const char *v = kv[2 * i + 1] ? kv[2 * i + 1] : ""; *v && used + 3 < cap; v++) {
            if (*v == '\\' || *v == '"') buf[used++] = '\\';
            if (*v == '\n') {
                buf[used++] = '\\';
                buf[used++] = 'n';
                continue;
            }
            buf[used++] = *v;
        }
        if (used + 1 < cap) buf[used++] = '"';
        buf[used] = '\0';
    }
}

/* The series of name{labels}, made when missing. Called with m->mu held; NULL when out of
 * memory or when name is known with the other kind. */
static series *find(pv_metrics *m, const char *name, const char *help, int histogram,
                    const char *labels) {
    family *f = NULL;
    for (size_t i = 0; i < m->n && !f; i++)
        if (strcmp(m->f[i].name, name) == 0) f = &m->f[i];
    if (!f) {
        if (m->n == m->cap) {
            size_t cap = m->cap ? 2 * m->cap : 16;
            family *nf = realloc(m->f, cap * sizeof *nf);
            if (!nf) return NULL;
            m->f = nf;
            m->cap = cap;
        }
        f = &m->f[m->n];
        memset(f, 0, sizeof *f);
        f->name = strdup(name);
        f->help = strdup(help ? help : "");
        f->histogram = histogram;
        if (!f->name || !f->help) {
            free(f->name);
            free(f->help);
            return NULL;
        }
        m->n++;
    }
    if (f->histogram != histogram) return NULL;
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->s[i].labels, labels ? labels : "") == 0) return &f->s[i];
    if (f->n == f->cap) {
        size_t cap = f->cap ? 2 * f->cap : 8;
        series *ns = realloc(f->s, cap * sizeof *ns);
        if (!ns) return NULL;
        f->s = ns;
        f->cap = cap;
    }
    series *s = &f->s[f->n];
    memset(s, 0, sizeof *s);
    if (!(s->labels = strdup(labels ? labels : ""))) return NULL;
    f->n++;
    return s;
}

void pv_metrics_count(pv_metrics *m, const char *name, const char *help, const char *labels,
                      double v) {
    if (!m || v < 0) return;
    pthread_mutex_lock(&m->mu);
    series *s = find(m, name, help, 0, labels);
    if (s) s->value += v;
    pthread_mutex_unlock(&m->mu);
}

void pv_metrics_observe(pv_metrics *m, const char *name, const char *help, const char *labels,
                        double v) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    series *s = find(m, name, help, 1, labels);
    if (s) {
        for (size_t i = 0; i < N_BUCKETS; i++)
            if (v <= k_buckets[i]) s->buckets[i]++;
        s->count++;
        s->sum += v;
    }
    pthread_mutex_unlock(&m->mu);
}

/* ---- text ---- */

void pv_metrics_text_family(pv_metrics_text *t, const char *name, const char *type,
                            const char *help) {
    pv_buf_addf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void pv_metrics_text_value(pv_metrics_text *t, const char *name, const char *labels, double v) {
    if (labels && *labels)
        pv_buf_addf(t, "%s{%s} %.17g\n", name, labels, v);
    else
        pv_buf_addf(t, "%s %.17g\n", name, v);
}

static void render_histogram(pv_metrics_text *t, const family *f, const series *s) {
    const char *sep = s->labels[0] ? "," : "";
    for (size_t i = 0; i < N_BUCKETS; i++)
        pv_buf_addf(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", f->name, s->labels, sep, k_buckets[i],
                    s->buckets[i]);
    pv_buf_addf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name, s->labels, sep, s->count);
    if (s->labels[0]) {
        pv_buf_addf(t, "%s_sum{%s} %.17g\n%s_count{%s} %llu\n", f->name, s->labels, s->sum, f->name,
                    s->labels, s->count);
    } else {
        pv_buf_addf(t, "%s_sum %.17g\n%s_count %llu\n", f->name, s->sum, f->name, s->count);
    }
}

int pv_metrics_render(pv_metrics *m, pv_metrics_collect_fn collect, void *arg, char **out,
                      size_t *len, pv_status *st) {
    pv_metrics_text t = {0};
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->n; i++) {
        const family *f = &m->f[i];
        pv_metrics_text_family(&t, f->name, f->histogram ? "histogram" : "counter", f->help);
        for (size_t j = 0; j < f->n; j++) {
            if (f->histogram)
                render_histogram(&t, f, &f->s[j]);
            else
                pv_metrics_text_value(&t, f->name, f->s[j].labels, f->s[j].value);
        }
    }
    pthread_mutex_unlock(&m->mu);
    if (collect) collect(arg, &t);
    pv_buf_addf(&t, "%s", "");
    if (t.oom || !t.s) {
        free(t.s);
        return pv_status_set(st, PV_INTERNAL, "metrics: out of memory");
    }
    *out = t.s;
    *len = t.len;
    return PV_OK;
}

/* ---- HTTP ---- */

struct pv_metrics_server {
    struct MHD_Daemon *d;
    pv_metrics *m;
    pv_metrics_collect_fn collect;
    void *arg;
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **state) {
    (void)version;
    (void)upload_data;
    (void)upload_size;
    (void)state;
    pv_metrics_server *srv = cls;
    struct MHD_Response *r;
    unsigned code = MHD_HTTP_OK;
    char *text = NULL;
    size_t len = 0;
    pv_status st;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char msg[] = "only GET\n";
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    } else if (strcmp(url, "/metrics") != 0) {
        static const char msg[] = "not found: the metrics are at /metrics\n";
        code = MHD_HTTP_NOT_FOUND;
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    } else if (pv_metrics_render(srv->m, srv->collect, srv->arg, &text, &len, &st) != PV_OK) {
        static const char msg[] = "metrics: out of memory\n";
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
        r = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    } else {
        r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        if (r) MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    }
    if (!r) {
        free(text);
        return MHD_NO;
    }
    enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

int pv_metrics_serve(pv_metrics *m, const char *listen, pv_metrics_collect_fn collect, void *arg,
                     pv_metrics_server **out, pv_status *st) {
    *out = NULL;
    char host[128];
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (!colon || (size_t)(colon - listen) >= sizeof host)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "metrics listen \"%s\": want host:port",
                             listen ? listen : "");
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    char *end;
    long port = strtol(colon + 1, &end, 10);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (strcmp(host, "localhost") == 0) snprintf(host, sizeof host, "127.0.0.1");
    if (*end || port <= 0 || port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "metrics listen \"%s\": want an IPv4 address (or localhost):port",
                             listen);
    pv_metrics_server *srv = calloc(1, sizeof *srv);
    if (!srv) return pv_status_set(st, PV_INTERNAL, "out of memory");
    srv->m = m;
    srv->collect = collect;
    srv->arg = arg;
    srv->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                              on_request, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!srv->d) {
        free(srv);
        return pv_status_set(st, PV_UNAVAILABLE, "metrics: cannot listen on %s", listen);
    }
    *out = srv;
    return PV_OK;
}

void pv_metrics_server_stop(pv_metrics_server *srv) {
    if (!srv) return;
    MHD_stop_daemon(srv->d);
    free(srv);
}
