/*
 * wk_docker_api: the Engine API over libcurl (see wk_docker_api.h).
 *
 * Each call takes an easy handle of its own; a share handle keeps the open connections (and,
 * for TLS, the sessions) between calls, so a busy agent does not reconnect for every request.
 * A call that streams (logs followed, a pull) runs as long as its callbacks want: the progress
 * callback gives the caller a tick while nothing comes, so a client that went away is noticed.
 */
#include "wk_docker_api.h"

#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API_VERSION "v1.41"
#define DEFAULT_TIMEOUT_MS 120000
#define CONNECT_TIMEOUT_MS 3000
#define BODY_MAX (256u << 20)

struct wk_docker_api {
    char *endpoint;    /* as the node has it, for messages */
    char *socket_path; /* unix:// */
    char *base_url;    /* "http://localhost/v1.41" or "https://host:port/v1.41" */
    /* tcp://: TLS (wk_docker_api_set_tls may change it while calls run: cfg_mu) */
    pthread_mutex_t cfg_mu; /* base_url, tls, the PEMs */
    struct curl_blob ca, cert, key;
    char *ca_file, *cert_file, *key_file; /* the same given as paths */
    bool tls;
    CURLSH *share;
    pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static void global_init(void) {
    curl_global_init(CURL_GLOBAL_ALL);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg) {
    (void)h;
    (void)access;
    wk_docker_api *api = arg;
    pthread_mutex_lock(&api->locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg) {
    (void)h;
    wk_docker_api *api = arg;
    pthread_mutex_unlock(&api->locks[data]);
}

/* A PEM value: a path (starts with '/') kept as a file name, else the text itself as a blob. */
static int take_pem(const char *value, struct curl_blob *blob, char **file) {
    if (!value || !*value) return 0;
    if (value[0] == '/') {
        *file = strdup(value);
        return *file ? 0 : -1;
    }
    blob->data = strdup(value);
    blob->len = strlen(value);
    blob->flags = CURL_BLOB_COPY;
    return blob->data ? 0 : -1;
}

static void drop_tls(wk_docker_api *api) {
    free(api->ca.data);
    free(api->cert.data);
    free(api->key.data);
    free(api->ca_file);
    free(api->cert_file);
    free(api->key_file);
    memset(&api->ca, 0, sizeof api->ca);
    memset(&api->cert, 0, sizeof api->cert);
    memset(&api->key, 0, sizeof api->key);
    api->ca_file = api->cert_file = api->key_file = NULL;
    api->tls = false;
}

/* tcp://: the TLS (certificate and key given: https) and the base URL that follows from it.
 * Caller holds cfg_mu, or is alone. */
static int load_tls(wk_docker_api *api, const wk_docker_tls *tls, pv_status *st) {
    drop_tls(api);
    api->tls = tls && tls->cert && *tls->cert && tls->key && *tls->key;
    free(api->base_url);
    if (asprintf(&api->base_url, "%s://%s/" API_VERSION, api->tls ? "https" : "http",
                 api->endpoint + 6) < 0)
        api->base_url = NULL;
    if (!api->base_url || (api->tls && (take_pem(tls->ca, &api->ca, &api->ca_file) != 0 ||
                                        take_pem(tls->cert, &api->cert, &api->cert_file) != 0 ||
                                        take_pem(tls->key, &api->key, &api->key_file) != 0)))
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    return PV_OK;
}

int wk_docker_api_set_tls(wk_docker_api *api, const wk_docker_tls *tls, pv_status *st) {
    if (!api->endpoint || strncmp(api->endpoint, "tcp://", 6) != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "endpoint %s: TLS is for tcp:// only",
                             api->endpoint);
    pthread_mutex_lock(&api->cfg_mu);
    int rc = load_tls(api, tls, st);
    pthread_mutex_unlock(&api->cfg_mu);
    return rc;
}

int wk_docker_api_open(const char *endpoint, const wk_docker_tls *tls, wk_docker_api **out,
                       pv_status *st) {
    *out = NULL;
    pthread_once(&global_once, global_init);
    wk_docker_api *api = calloc(1, sizeof *api);
    if (!api) return pv_status_set(st, PV_INTERNAL, "out of memory");
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&api->locks[i], NULL);
    pthread_mutex_init(&api->cfg_mu, NULL);
    api->endpoint = strdup(endpoint ? endpoint : "");
    int rc = PV_OK;
    if (!api->endpoint) {
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    } else if (strncmp(api->endpoint, "unix://", 7) == 0 && api->endpoint[7] == '/') {
        api->socket_path = strdup(api->endpoint + 7);
        api->base_url = strdup("http://localhost/" API_VERSION);
    } else if (strncmp(api->endpoint, "tcp://", 6) == 0 && api->endpoint[6]) {
        rc = load_tls(api, tls, st);
    } else {
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           "endpoint %s: not unix:///path/docker.sock or tcp://host:port",
                           api->endpoint);
    }
    if (rc == PV_OK && !api->base_url) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK && !(api->share = curl_share_init()))
        rc = pv_status_set(st, PV_INTERNAL, "curl_share_init failed");
    if (rc != PV_OK) {
        wk_docker_api_close(api);
        return rc;
    }
    curl_share_setopt(api->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(api->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(api->share, CURLSHOPT_USERDATA, api);
    curl_share_setopt(api->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    curl_share_setopt(api->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    *out = api;
    return PV_OK;
}

void wk_docker_api_close(wk_docker_api *api) {
    if (!api) return;
    if (api->share) curl_share_cleanup(api->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&api->locks[i]);
    pthread_mutex_destroy(&api->cfg_mu);
    drop_tls(api);
    free(api->endpoint);
    free(api->socket_path);
    free(api->base_url);
    free(api);
}

const char *wk_docker_api_endpoint(const wk_docker_api *api) {
    return api->endpoint;
}

void wk_docker_resp_clear(wk_docker_resp *r) {
    if (!r) return;
    free(r->body);
    free(r->path_stat);
    memset(r, 0, sizeof *r);
}

typedef struct transfer {
    const wk_docker_req *req;
    wk_docker_resp *resp;
    size_t cap;
    pv_status cb_st; /* what a callback said when it stopped the transfer */
    bool stopped;
} transfer;

static size_t on_write(char *data, size_t size, size_t n, void *arg) {
    transfer *t = arg;
    size_t len = size * n;
    if (t->req->on_data && t->resp->status / 100 == 2) {
        if (t->req->on_data(t->req->ctx, data, len, &t->cb_st) != 0) {
            t->stopped = true;
            return 0;
        }
        return len;
    }
    /* collected: the answer, or an error's body even when streaming */
    if (t->resp->len + len + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        while (cap < t->resp->len + len + 1)
            cap *= 2;
        char *grown = cap <= BODY_MAX ? realloc(t->resp->body, cap) : NULL;
        if (!grown) return 0;
        t->resp->body = grown;
        t->cap = cap;
    }
    memcpy(t->resp->body + t->resp->len, data, len);
    t->resp->len += len;
    t->resp->body[t->resp->len] = '\0';
    return len;
}

static size_t on_header(char *data, size_t size, size_t n, void *arg) {
    transfer *t = arg;
    size_t len = size * n;
    long code = 0;
    if (len > 5 && strncmp(data, "HTTP/", 5) == 0 && sscanf(data, "HTTP/%*s %ld", &code) == 1)
        t->resp->status = code; /* known before the body: the write callback needs it */
    static const char stat_name[] = "X-Docker-Container-Path-Stat:";
    if (len > sizeof stat_name && strncasecmp(data, stat_name, sizeof stat_name - 1) == 0) {
        const char *v = data + sizeof stat_name - 1;
        size_t vl = len - (sizeof stat_name - 1);
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        free(t->resp->path_stat);
        t->resp->path_stat = strndup(v, vl);
    }
    return len;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    transfer *t = arg;
    if (!t->req->on_tick) return 0;
    if (t->req->on_tick(t->req->ctx, &t->cb_st) != 0) {
        t->stopped = true;
        return 1;
    }
    return 0;
}

static void set_tls(wk_docker_api *api, CURL *h) {
    if (!api->tls) return;
    if (api->ca.data) curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &api->ca);
    if (api->ca_file) curl_easy_setopt(h, CURLOPT_CAINFO, api->ca_file);
    if (api->cert.data) curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &api->cert);
    if (api->cert_file) curl_easy_setopt(h, CURLOPT_SSLCERT, api->cert_file);
    if (api->key.data) curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &api->key);
    if (api->key_file) curl_easy_setopt(h, CURLOPT_SSLKEY, api->key_file);
    curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
    curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
}

/* The header list of a request (NULL when out of memory with headers to send). */
static struct curl_slist *make_headers(const wk_docker_req *req) {
    struct curl_slist *h = NULL, *next;
    char line[256];
    /* a POST without a body is still JSON to the daemon: curl would say form-urlencoded */
    if (req->body || req->content_type || strcmp(req->method, "POST") == 0 ||
        strcmp(req->method, "PUT") == 0) {
        snprintf(line, sizeof line, "Content-Type: %s",
                 req->content_type ? req->content_type : "application/json");
        if (!(next = curl_slist_append(h, line))) goto fail;
        h = next;
    }
    if (!(next = curl_slist_append(h, "Expect:"))) goto fail; /* no 100-continue round trip */
    h = next;
    for (size_t i = 0; req->headers && req->headers[i]; i++) {
        if (!(next = curl_slist_append(h, req->headers[i]))) goto fail;
        h = next;
    }
    return h;
fail:
    curl_slist_free_all(h);
    return NULL;
}

/* The request's URL (caller frees; NULL when out of memory) and h's TLS, as they are now. */
static char *url_of(wk_docker_api *api, CURL *h, const char *path, bool *tls) {
    char *url = NULL;
    pthread_mutex_lock(&api->cfg_mu);
    if (asprintf(&url, "%s%s", api->base_url, path) < 0) url = NULL;
    if (h) set_tls(api, h); /* the blobs are copied (CURL_BLOB_COPY) */
    if (tls) *tls = api->tls;
    pthread_mutex_unlock(&api->cfg_mu);
    return url;
}

int wk_docker_call(wk_docker_api *api, const wk_docker_req *req, wk_docker_resp *r, pv_status *st) {
    memset(r, 0, sizeof *r);
    char *url = url_of(api, NULL, req->path, NULL);
    if (!url) return pv_status_set(st, PV_INTERNAL, "out of memory");
    CURL *h = curl_easy_init();
    struct curl_slist *headers = make_headers(req);
    if (!h || !headers) {
        if (h) curl_easy_cleanup(h);
        curl_slist_free_all(headers);
        free(url);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    transfer t = {.req = req, .resp = r};
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_SHARE, api->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (api->socket_path) curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, api->socket_path);
    free(url_of(api, h, "", NULL));
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    if (strcmp(req->method, "HEAD") == 0) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (req->body || strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body ? req->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
    if (req->timeout_ms >= 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                         (long)(req->timeout_ms ? req->timeout_ms : DEFAULT_TIMEOUT_MS));
    if (req->on_tick) {
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
    }
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    CURLcode cc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (status) r->status = status;
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    free(url);
    if (t.stopped) {
        wk_docker_resp_clear(r);
        if (t.cb_st.code != PV_OK) return pv_status_set(st, t.cb_st.code, "%s", t.cb_st.msg);
        return pv_status_set(st, PV_CANCELLED, "%s %s: stopped", req->method, req->path);
    }
    if (cc == CURLE_OK) return PV_OK;
    wk_docker_resp_clear(r);
    int code = cc == CURLE_OPERATION_TIMEDOUT && status ? PV_DEADLINE_EXCEEDED : PV_UNAVAILABLE;
    return pv_status_set(st, code, "docker daemon at %s: %s %s: %s", api->endpoint, req->method,
                         req->path, err[0] ? err : curl_easy_strerror(cc));
}

int wk_docker_check(const wk_docker_resp *r, const char *what, pv_status *st) {
    if (r->status / 100 == 2) return PV_OK;
    json_t *j = r->body ? json_loads(r->body, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(j, "message"));
    char text[PV_STATUS_MSG_MAX];
    snprintf(text, sizeof text, "%s", msg ? msg : (r->body && r->status != 304 ? r->body : ""));
    text[strcspn(text, "\r\n")] = '\0';
    json_decref(j);
    int code = PV_INTERNAL;
    switch (r->status) {
    case 304:
        code = PV_FAILED_PRECONDITION;
        snprintf(text, sizeof text, "already in that state");
        break;
    case 400:
        code = PV_INVALID_ARGUMENT;
        break;
    case 401:
    case 403:
        code = PV_PERMISSION_DENIED;
        break;
    case 404:
        code = PV_NOT_FOUND;
        break;
    case 409:
        code = strstr(what, "create") ? PV_ALREADY_EXISTS : PV_FAILED_PRECONDITION;
        break;
    default:
        break;
    }
    return pv_status_set(st, code, "%s: %s (HTTP %ld)", what, text, r->status);
}

int wk_docker_json(wk_docker_api *api, const char *method, const char *path, json_t *body,
                   json_t **out, const char *what, pv_status *st) {
    if (out) *out = NULL;
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    wk_docker_req req = {
        .method = method, .path = path, .body = text, .body_len = text ? strlen(text) : 0};
    wk_docker_resp r;
    int rc = wk_docker_call(api, &req, &r, st);
    free(text);
    if (rc != PV_OK) return rc;
    rc = wk_docker_check(&r, what, st);
    if (rc == PV_OK && out && r.body && r.len) {
        json_error_t e;
        *out = json_loadb(r.body, r.len, 0, &e);
        if (!*out)
            rc = pv_status_set(st, PV_INTERNAL, "%s: the daemon's answer is not JSON: %s", what,
                               e.text);
    }
    wk_docker_resp_clear(&r);
    return rc;
}

/* ---- hijacked connections ---- */

struct wk_docker_conn {
    CURL *h;
    curl_socket_t fd;
    bool tls;
    char *pending; /* bytes of the stream read together with the answer's headers */
    size_t npending;
};

static int conn_wait(wk_docker_conn *c, short events, int wait_ms) {
    struct pollfd p = {.fd = c->fd, .events = events};
    int n = poll(&p, 1, wait_ms);
    return n > 0 ? 1 : 0;
}

int wk_docker_conn_write(wk_docker_conn *c, const char *data, size_t len, pv_status *st) {
    while (len > 0) {
        size_t sent = 0;
        CURLcode cc = curl_easy_send(c->h, data, len, &sent);
        if (cc == CURLE_AGAIN) {
            conn_wait(c, POLLOUT, 1000);
            continue;
        }
        if (cc != CURLE_OK)
            return pv_status_set(st, PV_UNAVAILABLE, "docker stream: send: %s",
                                 curl_easy_strerror(cc));
        data += sent;
        len -= sent;
    }
    return PV_OK;
}

int wk_docker_conn_read(wk_docker_conn *c, char *buf, size_t cap, int wait_ms, size_t *got,
                        bool *eof, pv_status *st) {
    *got = 0;
    *eof = false;
    if (c->npending) {
        size_t n = c->npending < cap ? c->npending : cap;
        memcpy(buf, c->pending, n);
        memmove(c->pending, c->pending + n, c->npending - n);
        c->npending -= n;
        *got = n;
        return PV_OK;
    }
    for (int tries = 0; tries < 2; tries++) {
        CURLcode cc = curl_easy_recv(c->h, buf, cap, got);
        if (cc == CURLE_OK) {
            *eof = *got == 0;
            return PV_OK;
        }
        if (cc != CURLE_AGAIN)
            return pv_status_set(st, PV_UNAVAILABLE, "docker stream: recv: %s",
                                 curl_easy_strerror(cc));
        if (tries == 0 && !conn_wait(c, POLLIN, wait_ms)) return PV_OK;
    }
    return PV_OK;
}

void wk_docker_conn_close_write(wk_docker_conn *c) {
    if (!c->tls) shutdown(c->fd, SHUT_WR);
}

void wk_docker_conn_close(wk_docker_conn *c) {
    if (!c) return;
    curl_easy_cleanup(c->h);
    free(c->pending);
    free(c);
}

/* Reads the answer's status line and headers; what came after them is kept as pending. */
static int conn_answer(wk_docker_conn *c, const char *path, pv_status *st) {
    char head[8192];
    size_t len = 0;
    int64_t waited = 0;
    while (len < sizeof head - 1) {
        size_t got = 0;
        bool eof = false;
        if (wk_docker_conn_read(c, head + len, sizeof head - 1 - len, 1000, &got, &eof, st) !=
            PV_OK)
            return st->code;
        if (eof) break;
        if (got == 0 && (waited += 1000) > DEFAULT_TIMEOUT_MS) break;
        len += got;
        head[len] = '\0';
        char *end = strstr(head, "\r\n\r\n");
        if (!end) continue;
        long status = 0;
        sscanf(head, "HTTP/%*s %ld", &status);
        size_t body = (size_t)(end + 4 - head);
        if (status == 101 || status == 200) {
            c->npending = len - body;
            c->pending = c->npending ? malloc(c->npending) : NULL;
            if (c->npending && !c->pending) return pv_status_set(st, PV_INTERNAL, "oom");
            if (c->npending) memcpy(c->pending, head + body, c->npending);
            return PV_OK;
        }
        json_t *j = json_loads(head + body, 0, NULL);
        const char *msg = json_string_value(json_object_get(j, "message"));
        int code = status == 404   ? PV_NOT_FOUND
                   : status == 409 ? PV_FAILED_PRECONDITION
                                   : PV_INTERNAL;
        pv_status_set(st, code, "POST %s: %s (HTTP %ld)", path, msg ? msg : "", status);
        json_decref(j);
        return code;
    }
    return pv_status_set(st, PV_UNAVAILABLE, "POST %s: no answer from the daemon", path);
}

int wk_docker_hijack(wk_docker_api *api, const char *path, const char *body, wk_docker_conn **out,
                     pv_status *st) {
    *out = NULL;
    char *url = NULL;
    wk_docker_conn *c = calloc(1, sizeof *c);
    if (!c || !(c->h = curl_easy_init()) || !(url = url_of(api, c->h, path, &c->tls))) {
        if (c && c->h) curl_easy_cleanup(c->h);
        free(c);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(c->h, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
    if (api->socket_path) curl_easy_setopt(c->h, CURLOPT_UNIX_SOCKET_PATH, api->socket_path);
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, err);
    CURLcode cc = curl_easy_perform(c->h);
    free(url);
    if (cc == CURLE_OK) cc = curl_easy_getinfo(c->h, CURLINFO_ACTIVESOCKET, &c->fd);
    if (cc != CURLE_OK) {
        pv_status_set(st, PV_UNAVAILABLE, "docker daemon at %s: POST %s: %s", api->endpoint, path,
                      err[0] ? err : curl_easy_strerror(cc));
        wk_docker_conn_close(c);
        return st->code;
    }
    char *request = NULL;
    int n = asprintf(&request,
                     "POST /" API_VERSION "%s HTTP/1.1\r\nHost: docker\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n%s",
                     path, strlen(body), body);
    int rc = n < 0 ? pv_status_set(st, PV_INTERNAL, "out of memory")
                   : wk_docker_conn_write(c, request, (size_t)n, st);
    free(request);
    if (rc == PV_OK) rc = conn_answer(c, path, st);
    if (rc != PV_OK) {
        wk_docker_conn_close(c);
        return rc;
    }
    *out = c;
    return PV_OK;
}

void wk_docker_demux_init(wk_docker_demux *d, wk_docker_frame_fn fn, void *ctx) {
    memset(d, 0, sizeof *d);
    d->fn = fn;
    d->ctx = ctx;
}

int wk_docker_demux_feed(wk_docker_demux *d, const char *data, size_t len, pv_status *st) {
    while (len > 0) {
        if (d->remain == 0) {
            size_t take = sizeof d->head - d->have < len ? sizeof d->head - d->have : len;
            memcpy(d->head + d->have, data, take);
            d->have += take;
            data += take;
            len -= take;
            if (d->have < sizeof d->head) return PV_OK;
            d->have = 0;
            d->stream = d->head[0];
            d->remain = (uint32_t)d->head[4] << 24 | (uint32_t)d->head[5] << 16 |
                        (uint32_t)d->head[6] << 8 | (uint32_t)d->head[7];
            continue;
        }
        size_t take = d->remain < len ? d->remain : len;
        int rc = d->fn(d->ctx, d->stream, data, take, st);
        if (rc != PV_OK) return rc;
        d->remain -= (uint32_t)take;
        data += take;
        len -= take;
    }
    return PV_OK;
}

int wk_docker_ndjson_feed(wk_docker_ndjson *n, const char *data, size_t len, pv_status *st) {
    char *grown = realloc(n->line, n->len + len + 1);
    if (!grown) return pv_status_set(st, PV_INTERNAL, "out of memory");
    n->line = grown;
    memcpy(n->line + n->len, data, len);
    n->len += len;
    n->line[n->len] = '\0';
    char *start = n->line, *nl;
    int rc = PV_OK;
    while (rc == PV_OK && (nl = memchr(start, '\n', n->len - (size_t)(start - n->line)))) {
        json_t *j = json_loadb(start, (size_t)(nl - start), 0, NULL);
        if (j) rc = n->fn(n->ctx, j, st);
        json_decref(j);
        start = nl + 1;
    }
    n->len -= (size_t)(start - n->line);
    memmove(n->line, start, n->len);
    return rc;
}

int wk_docker_ndjson_end(wk_docker_ndjson *n, pv_status *st) {
    json_t *j = n->len ? json_loadb(n->line, n->len, 0, NULL) : NULL;
    int rc = j ? n->fn(n->ctx, j, st) : PV_OK;
    json_decref(j);
    free(n->line);
    n->line = NULL;
    n->len = 0;
    return rc;
}

char *wk_docker_escape(const char *s) {
    pthread_once(&global_once, global_init);
    char *e = curl_easy_escape(NULL, s, 0);
    char *copy = e ? strdup(e) : NULL;
    curl_free(e);
    return copy;
}

int64_t wk_docker_time_ms(const char *text) {
    struct tm tm = {0};
    if (!text) return 0;
    const char *rest = strptime(text, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest || tm.tm_year < 70) return 0;
    int64_t ms = (int64_t)timegm(&tm) * 1000;
    if (*rest == '.') {
        int64_t frac = 0, scale = 100;
        for (rest++; *rest >= '0' && *rest <= '9'; rest++, scale /= 10)
            if (scale > 0) frac += (*rest - '0') * scale;
        ms += frac;
    }
    return ms;
}
