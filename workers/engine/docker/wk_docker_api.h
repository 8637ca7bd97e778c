/*
 * wk_docker_api: a client of the Docker Engine API (v1.41, Debian's docker 20.10) over libcurl:
 * unix:///path/docker.sock through CURLOPT_UNIX_SOCKET_PATH, tcp://host:port with TLS from the
 * node's CA, certificate and key (PEM text, as Eru's AddNode carries them). Bodies go out as
 * given (JSON text, a tar); answers are collected, or handed to a write callback as they come
 * for the streams (logs, exec output, pulls). No HTTP is written here: libcurl speaks it.
 *
 * Errors: the daemon unreachable is PV_UNAVAILABLE naming the daemon's address, whatever the
 * call; an HTTP error status maps to a code (404 NOT_FOUND, 409 ALREADY_EXISTS on create and
 * FAILED_PRECONDITION otherwise, 304 FAILED_PRECONDITION: already in that state, 400
 * INVALID_ARGUMENT, 401/403 PERMISSION_DENIED, 5xx INTERNAL) with the daemon's {"message"}.
 *
 * Threads: a wk_docker_api may be used from any number of threads at once (one curl easy
 * handle per call, connections shared under a lock).
 * Ownership: wk_docker_resp.body is malloc'd for the caller (wk_docker_resp_clear); json_t
 * answers are the caller's reference.
 */
#ifndef WK_DOCKER_API_H
#define WK_DOCKER_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pv_status.h"

typedef struct wk_docker_api wk_docker_api;

/* PEM text of the node (NULL or "" = none): all three for tcp:// with TLS; tcp:// without a
 * certificate speaks plain HTTP (a daemon on loopback). */
typedef struct wk_docker_tls {
    const char *ca, *cert, *key;
} wk_docker_tls;

/* endpoint: "unix:///path/docker.sock" or "tcp://host:port". */
int wk_docker_api_open(const char *endpoint, const wk_docker_tls *tls, wk_docker_api **out,
                       pv_status *st);
void wk_docker_api_close(wk_docker_api *api);
/* tcp:// only: the TLS of the calls from now on (a node's stored CA, certificate and key);
 * calls under way keep theirs. */
int wk_docker_api_set_tls(wk_docker_api *api, const wk_docker_tls *tls, pv_status *st);
const char *wk_docker_api_endpoint(const wk_docker_api *api);

/* A piece of an answer's body as it comes; non-zero stops the transfer (the call then answers
 * CANCELLED unless the callback set another code in *st). */
typedef int (*wk_docker_data_fn)(void *ctx, const char *data, size_t len, pv_status *st);
/* Called about every second while a streaming call waits; non-zero stops it as above. */
typedef int (*wk_docker_tick_fn)(void *ctx, pv_status *st);

typedef struct wk_docker_req {
    const char *method; /* "GET", "POST", "PUT", "DELETE", "HEAD" */
    const char *path;   /* after /v1.41: "/containers/create?name=x" (query escaped) */
    const void *body;
    size_t body_len;
    const char *content_type;   /* default application/json when there is a body */
    const char *const *headers; /* more "Name: value" lines, NULL-terminated, or NULL */
    int timeout_ms;             /* 0 = 120 s; < 0 = none (streams that follow) */
    wk_docker_data_fn on_data;  /* NULL: the body is collected into the answer */
    wk_docker_tick_fn on_tick;  /* may be NULL */
    void *ctx;
} wk_docker_req;

typedef struct wk_docker_resp {
    long status; /* HTTP status */
    char *body;  /* NUL-terminated (collected answers); NULL when streamed or empty */
    size_t len;
    char *path_stat; /* X-Docker-Container-Path-Stat of a GET archive (base64 JSON) or NULL */
} wk_docker_resp;

void wk_docker_resp_clear(wk_docker_resp *r);

/* Makes the request. PV_OK whatever the HTTP status (in r->status): check it, or use
 * wk_docker_check. Failures to talk to the daemon at all: UNAVAILABLE naming its address. */
int wk_docker_call(wk_docker_api *api, const wk_docker_req *req, wk_docker_resp *r, pv_status *st);

/* PV_OK for a 2xx status, else the code of the table above, the message "<what>: <daemon's
 * message> (HTTP N)". */
int wk_docker_check(const wk_docker_resp *r, const char *what, pv_status *st);

/* A JSON call: body (borrowed, may be NULL) sent as JSON; a 2xx answer parsed into *out (NULL
 * when out is NULL or the answer empty), anything else an error as wk_docker_check. */
int wk_docker_json(wk_docker_api *api, const char *method, const char *path, json_t *body,
                   json_t **out, const char *what, pv_status *st);

/* A hijacked connection: POST path with a JSON body, after which the daemon's answer is a raw
 * stream both ways (exec start with stdin). libcurl opens the connection (unix socket or TLS)
 * and carries the bytes; it cannot hand over an upgraded HTTP connection, so this one request
 * is framed here (its headers: Host, Content-Type, Content-Length, Connection: Upgrade,
 * Upgrade: tcp) and the status line of the answer checked. */
typedef struct wk_docker_conn wk_docker_conn;
int wk_docker_hijack(wk_docker_api *api, const char *path, const char *body, wk_docker_conn **out,
                     pv_status *st);
/* Waits at most wait_ms for bytes, reads what there is: *got 0 and *eof at the end. */
int wk_docker_conn_read(wk_docker_conn *c, char *buf, size_t cap, int wait_ms, size_t *got,
                        bool *eof, pv_status *st);
int wk_docker_conn_write(wk_docker_conn *c, const char *data, size_t len, pv_status *st);
/* The end of what is written (the command's stdin ends): a half-close of the socket; over TLS,
 * which has no half-close libcurl can send, nothing (the input then ends with the command). */
void wk_docker_conn_close_write(wk_docker_conn *c);
void wk_docker_conn_close(wk_docker_conn *c);

/* The multiplexed stream of logs, attach and exec without a TTY: frames of an 8-byte header
 * (byte 0: 1 stdout, 2 stderr, 0 stdin; bytes 4-7 the big-endian length) and their payload.
 * Feed it what comes in any pieces; each payload is handed on, possibly in several calls, with
 * its stream number. */
typedef int (*wk_docker_frame_fn)(void *ctx, int stream, const char *data, size_t len,
                                  pv_status *st);
typedef struct wk_docker_demux {
    unsigned char head[8];
    size_t have;     /* header bytes gathered */
    uint32_t remain; /* payload bytes still to come of the current frame */
    int stream;
    wk_docker_frame_fn fn;
    void *ctx;
} wk_docker_demux;

void wk_docker_demux_init(wk_docker_demux *d, wk_docker_frame_fn fn, void *ctx);
int wk_docker_demux_feed(wk_docker_demux *d, const char *data, size_t len, pv_status *st);

/* NDJSON as it streams (pulls, builds, pushes, events): feed it the answer's pieces as they
 * come; each complete line that parses as JSON is handed to fn (borrowed for the call), lines
 * that do not are passed over. A non-zero code from fn stops the feed and is returned (its
 * words in *st). wk_docker_ndjson_end hands over a last line without its newline and frees
 * what the splitter holds (call it whatever happened). */
typedef int (*wk_docker_json_fn)(void *ctx, json_t *j, pv_status *st);
typedef struct wk_docker_ndjson {
    char *line;
    size_t len;
    wk_docker_json_fn fn;
    void *ctx;
} wk_docker_ndjson;
int wk_docker_ndjson_feed(wk_docker_ndjson *n, const char *data, size_t len, pv_status *st);
int wk_docker_ndjson_end(wk_docker_ndjson *n, pv_status *st);

/* s escaped for a URL query or path component (caller frees); NULL when out of memory. */
char *wk_docker_escape(const char *s);

/* RFC 3339 time as Docker writes it ("2026-12-04T21:41:43.039057402Z") in ms since the epoch;
 * 0 for Docker's zero time (0001-01-01...) or what does not parse. */
int64_t wk_docker_time_ms(const char *text);

#endif
