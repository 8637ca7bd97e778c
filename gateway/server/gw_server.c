/*
 * gw_server: the gRPC C-core server framework of the gateway (see gw_server.h for the model).
 *
 * Every outstanding operation has its own tag pointing into a call context, and every
 * completion arrives on the single completion queue that the pool threads poll. A call context
 * is reference counted: one reference for the RECV_CLOSE_ON_SERVER op (which tells us about
 * cancellation), one for each batch in flight, one while a handler runs and one for each
 * gw_call_ref. The send side is a small state machine under the call's mutex: one batch in
 * flight at a time, carrying the initial metadata with the first message and the status with
 * the last, so a unary answer is a single batch.
 *
 * The trap this design avoids (found by ASan in the spike): once grpc_call_start_batch returns,
 * another thread may already be running the completion. State is updated before the batch
 * starts, and the batch's own reference keeps the context alive.
 */
#include "gw_server.h"

#include <ctype.h>
#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_id.h"
#include "pv_log.h"
#include "pv_mem.h"
#include "pv_status.h"
#include "pv_validate.h"

#define GW_MAX_METHODS 256
#define GW_PREREQUESTS 8 /* accept requests kept outstanding per method */
#define GW_MAX_SHUTDOWN_HOOKS 8
#define GW_STREAM_BUCKETS 256 /* clients with streams open, hashed */
#define GW_REQUEST_ID_MAX                                                                          \
    129 /* x-request-id up to 128 bytes; longer ones are the service's to refuse */

typedef enum { TAG_NEW_CALL, TAG_SEND, TAG_RECV, TAG_CLOSE, TAG_SHUTDOWN } tag_kind;

typedef struct gw_tag {
    tag_kind kind;
    void *ptr; /* gw_call, or gw_server for TAG_SHUTDOWN */
} gw_tag;

typedef struct reg_method {
    const gw_method *m;
    void *handle;  /* from grpc_server_register_method */
    bool pre_read; /* the core reads the single request before the call comes (c->payload) */
} reg_method;

typedef struct out_msg {
    grpc_byte_buffer *bb;
    struct out_msg *next;
} out_msg;

/* One client's open streaming calls on this gateway (gw_server_opts.max_streams_per_client). */
typedef struct client_streams {
    struct client_streams *next;
    int open;
    char client[];
} client_streams;

typedef struct shutdown_hook {
    void (*fn)(void *arg);
    void *arg;
} shutdown_hook;

struct gw_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t *threads;
    int n_threads;
    bool started;

    char **listen;
    size_t n_listen;
    int *ports;
    char *auth_username;
    char *auth_password;
    long max_request_bytes;
    long max_upload_bytes;
    bool read_after_auth;       /* requests are read once the call passed its checks (auth on) */
    int max_streams_per_client; /* 0 = no bound */
    pthread_mutex_t streams_mu;
    struct client_streams *streams[GW_STREAM_BUCKETS];
    int shutdown_grace_ms;
    void *app;
    int (*is_declared)(void *arg, const char *path);
    void *is_declared_arg;
    gw_thread_init_fn thread_init;
    char *state_missing; /* the answer to a needs_state call without state */
    gw_thread_free_fn thread_free;
    void (*on_call_start)(void *arg, const char *path);
    void (*on_call_end)(void *arg, const char *path, int code, double seconds);
    void *observer_arg;

    reg_method methods[GW_MAX_METHODS];
    size_t n_methods;
    shutdown_hook hooks[GW_MAX_SHUTDOWN_HOOKS];
    size_t n_hooks;

    gw_tag shutdown_tag;
    atomic_bool shutting_down;
    atomic_bool shutdown_notified;
    atomic_bool cq_shut;
    atomic_int live_calls;
};

struct gw_call {
    gw_server *s;
    const reg_method *rm; /* NULL: generic (unknown method) */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_call_details details; /* generic calls */
    grpc_metadata_array md;
    grpc_byte_buffer *payload; /* unary/server-stream: the request, pre-read by core */
    gw_tag t_new, t_send, t_recv, t_close;
    char *path; /* generic calls: gpr-allocated copy of details.method */

    atomic_int refs;
    atomic_int user_refs;
    pthread_mutex_t mu;

    /* send side, under mu */
    out_msg *out_head, *out_tail;
    grpc_byte_buffer *inflight;
    bool send_busy, md_sent, finish_queued, status_sent, broken;
    int status_code;
    grpc_slice status_slice;

    /* receive side: one read at a time, driven by its own completions */
    grpc_byte_buffer *recv_bb;

    int cancelled; /* written by RECV_CLOSE_ON_SERVER */
    atomic_bool closed;
    bool close_ran; /* under mu: the close callback was taken (or there was none) */
    void (*close_fn)(gw_call *c, void *arg);
    void *close_arg;

    void *user;
    void (*user_free)(void *);

    /* The client's x-request-id, or one minted on first use (most calls never need one, and
     * minting costs randomness): rid_state 0 = none yet, 1 = being minted, 2 = ready. */
    char request_id[GW_REQUEST_ID_MAX];
    atomic_int rid_state;
    bool client_request_id;
    struct timespec started;
    char *client;        /* who is calling (gw_call_client), set before the handler runs */
    bool stream_counted; /* counted in s->streams under client until released */
};

/* Per-thread state of the pool thread running a handler (gw_call_thread_state). */
static __thread void *tls_thread_state;

static void request_call(gw_server *s, const reg_method *rm);

/* ---------------------------------------------------------------------------------------- */
/* byte buffers                                                                               */

/* Decodes bb as d. NULL with *wire_st set: decoded, but the bytes hold what decoding hides (a
 * NUL inside a string, pv_validate_wire); NULL with *wire_st clear: not a d at all. */
static ProtobufCMessage *unpack_bb(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb,
                                   size_t *len_out, pv_status *wire_st) {
    pv_status_clear(wire_st);
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
    grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    *len_out = GRPC_SLICE_LENGTH(sl);
    ProtobufCMessage *m =
        protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    if (m &&
        pv_validate_wire(d, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl), wire_st) != PV_OK) {
        protobuf_c_message_free_unpacked(m, NULL);
        m = NULL;
    }
    grpc_slice_unref(sl);
    return m;
}

static grpc_byte_buffer *pack_bb(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

/* ---------------------------------------------------------------------------------------- */
/* call lifecycle                                                                             */

static gw_call *call_new(gw_server *s, const reg_method *rm) {
    gw_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->s = s;
    c->rm = rm;
    c->t_new = (gw_tag){TAG_NEW_CALL, c};
    c->t_send = (gw_tag){TAG_SEND, c};
    c->t_recv = (gw_tag){TAG_RECV, c};
    c->t_close = (gw_tag){TAG_CLOSE, c};
    grpc_metadata_array_init(&c->md);
    grpc_call_details_init(&c->details);
    c->status_slice = grpc_empty_slice();
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void maybe_shutdown_cq(gw_server *s) {
    /* Only after the server's shutdown notification and once every accepted call is freed can
     * no new batch be started on the queue; then it is safe to shut it down. */
    if (atomic_load(&s->shutdown_notified) && atomic_load(&s->live_calls) == 0 &&
        !atomic_exchange(&s->cq_shut, true))
        grpc_completion_queue_shutdown(s->cq);
}

static void call_destroy(gw_call *c) {
    if (c->user_free && c->user) c->user_free(c->user);
    for (out_msg *o = c->out_head, *next; o; o = next) {
        next = o->next;
        grpc_byte_buffer_destroy(o->bb);
        free(o);
    }
    if (c->inflight) grpc_byte_buffer_destroy(c->inflight);
    if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
    if (c->payload) grpc_byte_buffer_destroy(c->payload);
    grpc_slice_unref(c->status_slice);
    grpc_metadata_array_destroy(&c->md);
    grpc_call_details_destroy(&c->details);
    if (c->path) gpr_free(c->path);
    free(c->client);
    if (c->call) grpc_call_unref(c->call);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static double elapsed_ms(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - since->tv_sec) * 1e3 +
           (double)(now.tv_nsec - since->tv_nsec) / 1e6;
}

/* ---------------------------------------------------------------------------------------- */
/* streams per client                                                                         */

static unsigned streams_bucket(const char *client) {
    unsigned h = 2166136261u;
    for (const char *p = client; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h % GW_STREAM_BUCKETS;
}

/* Counts one more open stream of client; false (nothing counted) when it has the maximum
 * open already, *open then saying how many. */
static bool streams_enter(gw_server *s, const char *client, int *open) {
    unsigned b = streams_bucket(client);
    pthread_mutex_lock(&s->streams_mu);
    client_streams *e = s->streams[b];
    while (e && strcmp(e->client, client) != 0)
        e = e->next;
    if (!e && (e = calloc(1, sizeof *e + strlen(client) + 1)) != NULL) {
        strcpy(e->client, client);
        e->next = s->streams[b];
        s->streams[b] = e;
    }
    bool ok = e && e->open < s->max_streams_per_client;
    if (ok) e->open++;
    *open = e ? e->open : 0;
    pthread_mutex_unlock(&s->streams_mu);
    return ok;
}

static void streams_leave(gw_server *s, const char *client) {
    unsigned b = streams_bucket(client);
    pthread_mutex_lock(&s->streams_mu);
    for (client_streams **pp = &s->streams[b]; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->client, client) != 0) continue;
        client_streams *e = *pp;
        if (--e->open <= 0) { /* a client without streams costs nothing */
            *pp = e->next;
            free(e);
        }
        break;
    }
    pthread_mutex_unlock(&s->streams_mu);
}

static void call_release(gw_call *c) {
    gw_server *s = c->s;
    if (c->status_code != 0 || pv_log_enabled(PV_LOG_DEBUG)) {
        pv_log_write(c->status_code == 0 ? PV_LOG_DEBUG : PV_LOG_INFO,
                     "call method=%s req=%s code=%s ms=%.2f%s", gw_call_method(c),
                     gw_call_request_id(c), pv_code_name(c->status_code), elapsed_ms(&c->started),
                     c->cancelled ? " cancelled=1" : "");
    }
    if (c->rm && s->on_call_end)
        s->on_call_end(s->observer_arg, c->rm->m->path, c->status_code,
                       elapsed_ms(&c->started) / 1e3);
    if (c->stream_counted) streams_leave(s, c->client);
    call_destroy(c);
    atomic_fetch_sub(&s->live_calls, 1);
    maybe_shutdown_cq(s);
}

static void call_unref_internal(gw_call *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) call_release(c);
}

static void start_batch(gw_call *c, grpc_op *ops, size_t n, gw_tag *tag) {
    atomic_fetch_add(&c->refs, 1);
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        /* Only a programming error gets here (two sends in flight, ops after status). */
        pv_error("grpc_call_start_batch method=%s req=%s: %s", gw_call_method(c),
                 gw_call_request_id(c), grpc_call_error_to_string(e));
        abort();
    }
}

/* ---------------------------------------------------------------------------------------- */
/* send side                                                                                  */

static void send_next_locked(gw_call *c) {
    if (c->send_busy || c->status_sent || c->broken) return;
    out_msg *o = c->out_head;
    if (!o && !c->finish_queued) return;

    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
        c->md_sent = true;
    }
    if (o) {
        c->out_head = o->next;
        if (!c->out_head) c->out_tail = NULL;
        c->inflight = o->bb;
        free(o);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = c->inflight;
        n++;
    }
    if (c->finish_queued && !c->out_head) {
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = (grpc_status_code)c->status_code;
        ops[n].data.send_status_from_server.status_details = &c->status_slice;
        ops[n].data.send_status_from_server.trailing_metadata_count = 0;
        n++;
        c->status_sent = true;
    }
    c->send_busy = true;
    start_batch(c, ops, n, &c->t_send);
}

static void on_send_done(gw_call *c, bool ok) {
    pthread_mutex_lock(&c->mu);
    c->send_busy = false;
    if (c->inflight) {
        grpc_byte_buffer_destroy(c->inflight);
        c->inflight = NULL;
    }
    if (!ok)
        c->broken = true; /* the client is gone: drop whatever is queued */
    else
        send_next_locked(c);
    pthread_mutex_unlock(&c->mu);
    call_unref_internal(c);
}

int gw_call_send(gw_call *c, const ProtobufCMessage *m) {
    if (atomic_load(&c->closed)) return -1;
    out_msg *o = malloc(sizeof *o);
    if (!o) return -1;
    o->bb = pack_bb(m);
    o->next = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->finish_queued || c->broken) {
        pthread_mutex_unlock(&c->mu);
        grpc_byte_buffer_destroy(o->bb);
        free(o);
        return -1;
    }
    if (c->out_tail)
        c->out_tail->next = o;
    else
        c->out_head = o;
    c->out_tail = o;
    send_next_locked(c);
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void gw_call_finish(gw_call *c, int code, const char *details) {
    /* An HTTP/2 field value must not begin or end with whitespace: clients (nghttp2 among them)
     * drop a grpc-message that does, and with it the cause. */
    size_t len = details ? strlen(details) : 0;
    while (len && isspace((unsigned char)*details))
        details++, len--;
    while (len && isspace((unsigned char)details[len - 1]))
        len--;
    pthread_mutex_lock(&c->mu);
    if (!c->finish_queued) {
        c->finish_queued = true;
        c->status_code = code;
        grpc_slice_unref(c->status_slice);
        c->status_slice = len ? grpc_slice_from_copied_buffer(details, len) : grpc_empty_slice();
        send_next_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

void gw_call_finishf(gw_call *c, int code, const char *fmt, ...) {
    char buf[PV_STATUS_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    gw_call_finish(c, code, buf);
}

void gw_call_reply(gw_call *c, const ProtobufCMessage *m) {
    gw_call_send(c, m);
    gw_call_finish(c, 0, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* accessors                                                                                  */

void gw_call_ref(gw_call *c) {
    atomic_fetch_add(&c->user_refs, 1);
    atomic_fetch_add(&c->refs, 1);
}

void gw_call_unref(gw_call *c) {
    atomic_fetch_sub(&c->user_refs, 1);
    call_unref_internal(c);
}

bool gw_call_is_closed(gw_call *c) {
    return atomic_load(&c->closed);
}

int gw_call_on_close(gw_call *c, void (*fn)(gw_call *, void *), void *arg) {
    pthread_mutex_lock(&c->mu);
    bool ran = c->close_ran;
    if (!ran) {
        c->close_fn = fn;
        c->close_arg = arg;
    }
    pthread_mutex_unlock(&c->mu);
    return ran ? -1 : 0;
}

void gw_call_set_user(gw_call *c, void *user, void (*free_fn)(void *)) {
    c->user = user;
    c->user_free = free_fn;
}

void *gw_call_user(gw_call *c) {
    return c->user;
}

const char *gw_call_method(const gw_call *c) {
    if (c->rm) return c->rm->m->path;
    return c->path ? c->path : "?";
}

const char *gw_call_request_id(const gw_call *c) {
    if (atomic_load_explicit(&c->rid_state, memory_order_acquire) == 2) return c->request_id;
    /* Minted lazily, once, even when two threads of the call ask at the same moment; the
     * handle is const for callers because the id, once there, never changes. */
    gw_call *m = (gw_call *)c;
    int expected = 0;
    if (atomic_compare_exchange_strong(&m->rid_state, &expected, 1)) {
        if (pv_id_new("req", m->request_id, sizeof m->request_id) != 0)
            snprintf(m->request_id, sizeof m->request_id, "req-unknown");
        atomic_store_explicit(&m->rid_state, 2, memory_order_release);
    } else {
        while (atomic_load_explicit(&m->rid_state, memory_order_acquire) != 2)
            sched_yield();
    }
    return c->request_id;
}

bool gw_call_has_client_request_id(const gw_call *c) {
    return c->client_request_id;
}

void *gw_call_app(const gw_call *c) {
    return c->s->app;
}

void *gw_call_method_data(const gw_call *c) {
    return c->rm ? c->rm->m->data : NULL;
}

void *gw_call_thread_state(const gw_call *c) {
    (void)c;
    return tls_thread_state;
}

const char *gw_call_metadata(const gw_call *c, const char *key, size_t *len) {
    for (size_t i = 0; i < c->md.count; i++) {
        if (grpc_slice_str_cmp(c->md.metadata[i].key, key) == 0) {
            if (len) *len = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
            return (const char *)GRPC_SLICE_START_PTR(c->md.metadata[i].value);
        }
    }
    return NULL;
}

int64_t gw_call_deadline_ms(const gw_call *c) {
    gpr_timespec dl = c->rm ? c->deadline : c->details.deadline;
    if (dl.tv_sec == INT64_MAX) return INT64_MAX;
    gpr_timespec left =
        gpr_time_sub(gpr_convert_clock_type(dl, GPR_CLOCK_MONOTONIC), gpr_now(GPR_CLOCK_MONOTONIC));
    return gpr_time_to_millis(left);
}

/* ---------------------------------------------------------------------------------------- */
/* dispatch                                                                                   */

static void set_request_id(gw_call *c) {
    size_t len = 0;
    const char *rid = gw_call_metadata(c, "x-request-id", &len);
    if (rid && len > 0 && len < sizeof c->request_id) {
        memcpy(c->request_id, rid, len);
        c->request_id[len] = '\0';
        c->client_request_id = true;
        /* The id goes into log lines: keep it printable. */
        for (size_t i = 0; i < len; i++)
            if (c->request_id[i] <= ' ' || c->request_id[i] > '~') c->request_id[i] = '_';
        atomic_store_explicit(&c->rid_state, 2, memory_order_release);
    }
    /* Otherwise gw_call_request_id mints one when something asks. */
}

/* Constant-time comparison: the time taken must not tell how much of a password matched. */
static bool secret_equal(const char *a, size_t alen, const char *b) {
    size_t blen = strlen(b);
    unsigned char diff = (unsigned char)(alen != blen);
    for (size_t i = 0; i < alen; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (blen ? blen : 1)]);
    return diff == 0;
}

static bool check_auth(gw_call *c) {
    gw_server *s = c->s;
    if (!s->auth_username || (c->rm && c->rm->m->no_auth)) return true;
    size_t len = 0;
    const char *v = gw_call_metadata(c, s->auth_username, &len);
    if (!v) {
        gw_call_finishf(c, PV_UNAUTHENTICATED,
                        "authentication required: send metadata \"%s\" with the password",
                        s->auth_username);
        return false;
    }
    if (!secret_equal(v, len, s->auth_password)) {
        gw_call_finishf(c, PV_UNAUTHENTICATED, "wrong password for user \"%s\"", s->auth_username);
        return false;
    }
    return true;
}

/* The host part of a core peer string: "ipv4:127.0.0.1:5000" -> "127.0.0.1",
 * "ipv6:[::1]:5000" -> "::1", "unix:/path" -> "unix:/path". Caller frees. */
static char *peer_host(const char *peer) {
    if (strncmp(peer, "ipv4:", 5) == 0) {
        const char *h = peer + 5, *colon = strrchr(h, ':');
        return strndup(h, colon ? (size_t)(colon - h) : strlen(h));
    }
    if (strncmp(peer, "ipv6:", 5) == 0) {
        const char *h = peer + 5;
        if (*h == '[') {
            const char *end = strchr(h, ']');
            if (end) return strndup(h + 1, (size_t)(end - h - 1));
        }
        /* Without brackets a port cannot be told from the address: keep it whole. */
        return strdup(h);
    }
    return strdup(peer);
}

/* The client a call counts against (limits): the common name of its verified TLS client
 * certificate, else the configured auth user when auth is on (the metadata carried it, or
 * check_auth refused the call), else the host it connects from. The port is left out: one
 * client opens many connections. Bytes outside printable ASCII become '_' (the name goes into
 * a Redis key and error messages). */
static char *call_client(gw_call *c) {
    char *out = NULL;
    grpc_auth_context *ctx = grpc_call_auth_context(c->call);
    if (ctx) {
        grpc_auth_property_iterator it =
            grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
        const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
        if (p && p->value_length > 0) {
            size_t n = p->value_length < 128 ? p->value_length : 128;
            char *cn = strndup(p->value, n);
            if (cn && asprintf(&out, "cert:%s", cn) < 0) out = NULL;
            free(cn);
        }
        grpc_auth_context_release(ctx);
    }
    if (!out && c->s->auth_username) {
        if (asprintf(&out, "user:%s", c->s->auth_username) < 0) out = NULL;
    }
    if (!out) {
        char *peer = grpc_call_get_peer(c->call);
        char *host = peer ? peer_host(peer) : NULL;
        if (host && asprintf(&out, "host:%s", host) < 0) out = NULL;
        free(host);
        if (peer) gpr_free(peer);
    }
    if (out)
        for (char *q = out; *q; q++)
            if (*q <= ' ' || *q > '~') *q = '_';
    return out;
}

const char *gw_call_client(const gw_call *c) {
    return c->client ? c->client : "unknown";
}

static int bad_request_code(const gw_call *c) {
    int code = c->rm->m->bad_request_code;
    return code ? code : PV_INVALID_ARGUMENT;
}

/* Decodes and validates one client message. On failure the call is finished with the method's
 * bad-request code and NULL is returned. */
static ProtobufCMessage *decode_request(gw_call *c, grpc_byte_buffer *bb) {
    const ProtobufCMessageDescriptor *d = c->rm->m->request;
    if (!bb) {
        gw_call_finishf(c, bad_request_code(c), "request: missing %s message", d->name);
        return NULL;
    }
    size_t raw = grpc_byte_buffer_length(bb);
    bool upload = c->rm->m->upload && c->s->max_upload_bytes > 0;
    long limit = upload ? c->s->max_upload_bytes : c->s->max_request_bytes;
    if (limit > 0 && (long)raw > limit) {
        /* A limit, not a malformed request: RESOURCE_EXHAUSTED, as the core itself answers
         * past its own bound, whatever code the method uses for bad input. */
        gw_call_finishf(c, PV_RESOURCE_EXHAUSTED,
                        "request: %s is %zu bytes, over the limit of %ld bytes (gateway.%s)",
                        d->name, raw, limit, upload ? "max_upload_bytes" : "max_request_bytes");
        return NULL;
    }
    size_t len = 0;
    pv_status st;
    ProtobufCMessage *m = unpack_bb(d, bb, &len, &st);
    if (!m && st.code != PV_OK) {
        gw_call_finishf(c, bad_request_code(c), "%s", st.msg);
        return NULL;
    }
    if (!m) {
        gw_call_finishf(c, bad_request_code(c), "request: cannot decode %s from %zu bytes", d->name,
                        len);
        return NULL;
    }
    if (pv_validate_message(m, &st) != PV_OK) {
        gw_call_finishf(c, bad_request_code(c), "%s", st.msg);
        protobuf_c_message_free_unpacked(m, NULL);
        return NULL;
    }
    return m;
}

/* A handler must answer or keep the call; otherwise the client would wait forever. */
static void ensure_answered(gw_call *c) {
    pthread_mutex_lock(&c->mu);
    bool answered = c->finish_queued;
    pthread_mutex_unlock(&c->mu);
    if (!answered && atomic_load(&c->user_refs) == 0 && !atomic_load(&c->closed)) {
        pv_error("handler returned without answering method=%s req=%s", gw_call_method(c),
                 gw_call_request_id(c));
        gw_call_finish(c, PV_INTERNAL, "internal error: the handler did not answer");
    }
}

static void start_recv(gw_call *c) {
    if (c->recv_bb) {
        grpc_byte_buffer_destroy(c->recv_bb);
        c->recv_bb = NULL;
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_bb;
    start_batch(c, &op, 1, &c->t_recv);
}

/* A needs_state method on a thread whose thread_init made no state: answered here, once for
 * every method, so that handlers can take their state as given. */
static bool state_missing(gw_call *c) {
    if (!c->rm->m->needs_state || tls_thread_state) return false;
    int code = c->rm->m->bad_request_code;
    gw_call_finish(c, code ? code : PV_UNAVAILABLE, c->s->state_missing);
    return true;
}

static void on_recv_done(gw_call *c, bool ok) {
    const gw_method *m = c->rm->m;
    if (!ok || atomic_load(&c->closed)) {
        call_unref_internal(c);
        return;
    }
    /* each message may come on another pool thread: each is checked */
    if (state_missing(c)) {
        call_unref_internal(c);
        return;
    }
    if (!m->on_message) { /* the single request of a unary or server-stream call */
        ProtobufCMessage *req = decode_request(c, c->recv_bb);
        if (req) {
            m->handler(c, req);
            protobuf_c_message_free_unpacked(req, NULL);
            ensure_answered(c);
        }
        call_unref_internal(c);
        return;
    }
    if (!c->recv_bb) { /* half-close */
        m->on_message(c, NULL);
        ensure_answered(c);
        call_unref_internal(c);
        return;
    }
    ProtobufCMessage *msg = decode_request(c, c->recv_bb);
    if (msg) {
        m->on_message(c, msg);
        protobuf_c_message_free_unpacked(msg, NULL);
        pthread_mutex_lock(&c->mu);
        bool more = !c->finish_queued && !c->broken;
        pthread_mutex_unlock(&c->mu);
        if (more) start_recv(c);
    }
    call_unref_internal(c);
}

static void answer_unknown(gw_call *c) {
    c->path = grpc_slice_to_c_string(c->details.method);
    if (c->s->is_declared && c->s->is_declared(c->s->is_declared_arg, c->path))
        gw_call_finishf(c, PV_UNIMPLEMENTED,
                        "%s is part of the pivirt API but this gateway build does not serve it",
                        c->path);
    else
        gw_call_finishf(c, PV_UNIMPLEMENTED, "unknown method %s", c->path);
}

static void on_new_call(gw_call *c, bool ok) {
    gw_server *s = c->s;
    if (!ok) { /* server shutting down: the accept request was cancelled */
        call_destroy(c);
        return;
    }
    atomic_fetch_add(&s->live_calls, 1);
    clock_gettime(CLOCK_MONOTONIC, &c->started);
    request_call(s, c->rm);

    /* refs: the close op, plus the dispatch until this function ends */
    atomic_store(&c->refs, 1);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    start_batch(c, &op, 1, &c->t_close);

    set_request_id(c);
    if (c->rm && s->on_call_start) s->on_call_start(s->observer_arg, c->rm->m->path);
    if (!c->rm) {
        answer_unknown(c);
    } else if (check_auth(c)) {
        const gw_method *m = c->rm->m;
        c->client = call_client(c);
        int open = 0;
        if (m->kind != GW_UNARY && s->max_streams_per_client > 0 && c->client &&
            !(c->stream_counted = streams_enter(s, c->client, &open))) {
            /* a limit, as max_request_bytes: RESOURCE_EXHAUSTED whatever the method's codes */
            gw_call_finishf(c, PV_RESOURCE_EXHAUSTED,
                            "client %.200s has %d streams open on this gateway, the limit "
                            "(gateway.max_streams_per_client)",
                            c->client, open);
        } else if (state_missing(c)) {
            /* answered */
        } else if (c->rm->pre_read) {
            ProtobufCMessage *req = decode_request(c, c->payload);
            if (req) {
                m->handler(c, req);
                protobuf_c_message_free_unpacked(req, NULL);
                ensure_answered(c);
            }
        } else {
            start_recv(c);
        }
    }
    call_unref_internal(c);
}

static void on_close(gw_call *c) {
    atomic_store(&c->closed, true);
    pthread_mutex_lock(&c->mu);
    c->close_ran = true;
    void (*fn)(gw_call *, void *) = c->close_fn;
    void *arg = c->close_arg;
    c->close_fn = NULL;
    pthread_mutex_unlock(&c->mu);
    if (fn) fn(c, arg);
    call_unref_internal(c);
}

static void request_call(gw_server *s, const reg_method *rm) {
    if (atomic_load(&s->shutting_down)) return;
    gw_call *c = call_new(s, rm);
    if (!c) {
        pv_error("out of memory accepting calls");
        return;
    }
    grpc_call_error e;
    if (rm)
        e = grpc_server_request_registered_call(s->server, rm->handle, &c->call, &c->deadline,
                                                &c->md, rm->pre_read ? &c->payload : NULL, s->cq,
                                                s->cq, &c->t_new);
    else
        e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md, s->cq, s->cq,
                                     &c->t_new);
    if (e != GRPC_CALL_OK) {
        pv_error("grpc_server_request_call: %s", grpc_call_error_to_string(e));
        call_destroy(c);
    }
}

static void *pool_thread(void *arg) {
    gw_server *s = arg;
    if (s->thread_init) tls_thread_state = s->thread_init(s->app);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type != GRPC_OP_COMPLETE) continue;
        gw_tag *t = ev.tag;
        switch (t->kind) {
        case TAG_NEW_CALL:
            on_new_call(t->ptr, ev.success);
            break;
        case TAG_SEND:
            on_send_done(t->ptr, ev.success);
            break;
        case TAG_RECV:
            on_recv_done(t->ptr, ev.success);
            break;
        case TAG_CLOSE:
            on_close(t->ptr);
            break;
        case TAG_SHUTDOWN:
            atomic_store(&s->shutdown_notified, true);
            maybe_shutdown_cq(s);
            break;
        }
    }
    if (s->thread_free && tls_thread_state) s->thread_free(tls_thread_state);
    tls_thread_state = NULL;
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* server                                                                                     */

static char *read_file(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = (cap + 4096) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                snprintf(err, errlen, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

static grpc_server_credentials *make_credentials(const gw_server_opts *o, char *err,
                                                 size_t errlen) {
    if (!o->tls_cert_path || !*o->tls_cert_path) return grpc_insecure_server_credentials_create();
    char *cert = read_file(o->tls_cert_path, err, errlen);
    if (!cert) return NULL;
    char *key = read_file(o->tls_key_path, err, errlen);
    if (!key) {
        free(cert);
        return NULL;
    }
    char *ca = NULL;
    if (o->tls_client_ca_path && *o->tls_client_ca_path) {
        ca = read_file(o->tls_client_ca_path, err, errlen);
        if (!ca) {
            free(cert);
            free(key);
            return NULL;
        }
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    /* With a client CA the handshake itself refuses a client that shows no certificate or one
     * the CA did not sign: such a client never reaches a handler. */
    grpc_server_credentials *creds = grpc_ssl_server_credentials_create_ex(
        ca, &pair, 1,
        ca ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
    free(cert);
    explicit_bzero(key, strlen(key));
    free(key);
    free(ca);
    if (!creds)
        snprintf(err, errlen, "invalid TLS certificate, key or client CA (%s)", o->tls_cert_path);
    return creds;
}

static char *dup_or_null(const char *s) {
    return s && *s ? strdup(s) : NULL;
}

gw_server *gw_server_new(const gw_server_opts *o, char *err, size_t errlen) {
    if (o->n_listen == 0 || o->threads < 1) {
        snprintf(err, errlen, "a server needs at least one address and one thread");
        return NULL;
    }
    gw_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->streams_mu, NULL);
    s->n_threads = o->threads;
    s->auth_username = dup_or_null(o->auth_username);
    s->auth_password = strdup(o->auth_password ? o->auth_password : "");
    s->max_request_bytes = o->max_request_bytes;
    s->max_upload_bytes = o->max_upload_bytes;
    s->read_after_auth = s->auth_username != NULL;
    s->max_streams_per_client = o->max_streams_per_client;
    s->shutdown_grace_ms = o->shutdown_grace_ms;
    s->app = o->app;
    s->is_declared = o->is_declared;
    s->is_declared_arg = o->is_declared_arg;
    s->thread_init = o->thread_init;
    s->state_missing =
        strdup(o->state_missing ? o->state_missing : "no per-thread state on this server thread");
    s->thread_free = o->thread_free;
    s->on_call_start = o->on_call_start;
    s->on_call_end = o->on_call_end;
    s->observer_arg = o->observer_arg;
    s->shutdown_tag = (gw_tag){TAG_SHUTDOWN, s};
    s->listen = calloc(o->n_listen, sizeof *s->listen);
    s->ports = calloc(o->n_listen, sizeof *s->ports);
    s->n_listen = o->n_listen;
    for (size_t i = 0; i < o->n_listen; i++)
        s->listen[i] = strdup(o->listen[i]);

    /* The core's own limit sits well above ours so that oversized requests reach us and get a
     * message naming the limit instead of a bare RESOURCE_EXHAUSTED from the transport. It is
     * one for every method (the core has no per-method bound on a server): uploads raise it. */
    long core_limit = o->max_request_bytes > 0 ? o->max_request_bytes * 4 : 64L << 20;
    if (core_limit < (16L << 20)) core_limit = 16L << 20;
    if (o->max_upload_bytes > 0 && o->max_upload_bytes + core_limit / 4 > core_limit)
        core_limit = o->max_upload_bytes + core_limit / 4;
    if (core_limit > INT32_MAX) core_limit = INT32_MAX;
    grpc_arg args[] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_CONCURRENT_STREAMS,
         .value.integer = o->max_concurrent_streams > 0 ? o->max_concurrent_streams : 1000},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)core_limit},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = 64 << 20},
    };
    grpc_channel_args chargs = {sizeof args / sizeof args[0], args};
    s->cq = grpc_completion_queue_create_for_next(NULL);
    s->server = grpc_server_create(&chargs, NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);

    grpc_server_credentials *creds = make_credentials(o, err, errlen);
    if (!creds) {
        gw_server_free(s);
        return NULL;
    }
    for (size_t i = 0; i < o->n_listen; i++) {
        s->ports[i] = grpc_server_add_http2_port(s->server, o->listen[i], creds);
        if (s->ports[i] == 0) {
            snprintf(err, errlen, "cannot listen on %s (address in use or not resolvable)",
                     o->listen[i]);
            grpc_server_credentials_release(creds);
            gw_server_free(s);
            return NULL;
        }
    }
    grpc_server_credentials_release(creds);
    return s;
}

int gw_server_add_service(gw_server *s, const char *service, const gw_method_spec *specs, size_t n,
                          void *data, gw_method *methods, char (*paths)[GW_PATH_MAX]) {
    for (size_t i = 0; i < n; i++) {
        snprintf(paths[i], GW_PATH_MAX, "/%s/%s", service, specs[i].name);
        methods[i] = (gw_method){.path = paths[i],
                                 .kind = specs[i].kind,
                                 .request = specs[i].request,
                                 .handler = specs[i].handler,
                                 .needs_state = specs[i].needs_state,
                                 .data = data};
        if (gw_server_add_method(s, &methods[i]) != 0) return -1;
    }
    return 0;
}

int gw_server_add_method(gw_server *s, const gw_method *m) {
    if (s->started || s->n_methods == GW_MAX_METHODS) return -1;
    for (size_t i = 0; i < s->n_methods; i++)
        if (strcmp(s->methods[i].m->path, m->path) == 0) return -1;
    /* With auth on, the request is read only after the credentials were checked: the core
     * reads a pre-read request whole before the call comes to us. */
    bool pre_read = (m->kind == GW_UNARY || m->kind == GW_SERVER_STREAM) && !s->read_after_auth;
    void *h = grpc_server_register_method(
        s->server, m->path, NULL,
        pre_read ? GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER : GRPC_SRM_PAYLOAD_NONE, 0);
    if (!h) return -1;
    s->methods[s->n_methods++] = (reg_method){m, h, pre_read};
    return 0;
}

int gw_server_on_shutdown(gw_server *s, void (*fn)(void *), void *arg) {
    if (s->started || s->n_hooks == GW_MAX_SHUTDOWN_HOOKS) return -1;
    s->hooks[s->n_hooks++] = (shutdown_hook){fn, arg};
    return 0;
}

int gw_server_start(gw_server *s) {
    grpc_server_start(s->server);
    s->started = true;
    for (size_t i = 0; i < s->n_methods; i++)
        for (int k = 0; k < GW_PREREQUESTS; k++)
            request_call(s, &s->methods[i]);
    for (int k = 0; k < GW_PREREQUESTS; k++)
        request_call(s, NULL);
    s->threads = calloc((size_t)s->n_threads, sizeof *s->threads);
    if (!s->threads) return -1;
    for (int i = 0; i < s->n_threads; i++) {
        if (pthread_create(&s->threads[i], NULL, pool_thread, s) != 0) {
            s->n_threads = i;
            return -1;
        }
    }
    return 0;
}

bool gw_server_shutting_down(const gw_server *s) {
    return atomic_load(&s->shutting_down);
}

void gw_server_shutdown(gw_server *s) {
    if (!s->started || atomic_exchange(&s->shutting_down, true)) return;
    for (size_t i = 0; i < s->n_hooks; i++)
        s->hooks[i].fn(s->hooks[i].arg);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    /* The core's notification also waits for every client connection to close, and an idle
     * client may keep its connection long after the GOAWAY. In-flight calls are what the grace
     * period is for: once none is left, cancelling disconnects the idle connections at once. */
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (int waited = 0; waited < s->shutdown_grace_ms && !atomic_load(&s->shutdown_notified) &&
                         atomic_load(&s->live_calls) > 0;
         waited += 10)
        nanosleep(&tick, NULL);
    if (!atomic_load(&s->shutdown_notified)) {
        int live = atomic_load(&s->live_calls);
        if (live > 0)
            pv_warn("shutdown grace of %d ms over: cancelling %d remaining calls",
                    s->shutdown_grace_ms, live);
        grpc_server_cancel_all_calls(s->server);
    }
    for (int i = 0; i < s->n_threads; i++)
        pthread_join(s->threads[i], NULL);
}

void gw_server_free(gw_server *s) {
    if (!s) return;
    if (s->server) {
        if (!s->started) {
            /* A server that never started still has to be shut down before destroy. */
            grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
            grpc_completion_queue_shutdown(s->cq);
            for (;;) {
                grpc_event ev =
                    grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
            }
        }
        grpc_server_destroy(s->server);
    }
    if (s->cq) grpc_completion_queue_destroy(s->cq);
    for (size_t i = 0; i < s->n_listen; i++)
        free(s->listen[i]);
    PV_FREE(s->listen, s->ports, s->threads, s->auth_username, s->auth_password, s->state_missing);
    for (size_t b = 0; b < GW_STREAM_BUCKETS; b++)
        while (s->streams[b]) {
            client_streams *e = s->streams[b];
            s->streams[b] = e->next;
            free(e);
        }
    pthread_mutex_destroy(&s->streams_mu);
    free(s);
}

int gw_server_live_calls(const gw_server *s) {
    return atomic_load(&s->live_calls);
}

int gw_server_bound_port(const gw_server *s, size_t i) {
    return i < s->n_listen ? s->ports[i] : 0;
}
