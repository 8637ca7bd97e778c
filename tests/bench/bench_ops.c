/*
 * bench_ops: the load generator of `./ops/pivirt bench ops` (driven by tests/bench/bench_ops.py).
 *
 * Submits test operations through a gateway with CreateTestOperation, each on its own target:
 * a target is locked while its operation is unfinished, so a fixed request body as h2load sends
 * it would measure ABORTED answers, not submits. Two transports:
 *   h2    (default for submits) a minimal HTTP/2 client in the spirit of h2load: one static
 *         HPACK header block (literal, no dynamic table, nothing to decode), one DATA frame per
 *         request with its own target, several connections, many streams each. Replies are not
 *         HPACK-decoded: a unary gRPC answer carries a DATA frame only when it succeeded, and
 *         that message (the Operation) is decoded for its id. The client costs a few
 *         microseconds per call, so on a 2-core machine the gateway and Redis get the CPU.
 *   grpc  the gRPC C core API (about ten times the client CPU per call), used for WaitOperation
 *         and when --transport grpc is given.
 * Optionally it waits for each operation with WaitOperation, and afterwards it reads every record
 * from Redis to get what only the records know: when a worker started it and when it was done.
 *
 *   bench_ops --gateway HOST:PORT --redis HOST:PORT --prefix P [options]
 *     --seconds S       submit for S seconds (default 5)
 *     --count N         ... or exactly N operations
 *     --rate R          paced at R submits per second (default 0: as fast as possible)
 *     --concurrency C   calls in flight at most (default 200)
 *     --ms M            test.sleep duration of each operation (default 0)
 *     --wait            after each submit, WaitOperation on it; reports the wake-up latency
 *                       (reply received - finished_at) of the answers that were woken
 *     --collect S       after the run, wait up to S seconds for every operation to be done and
 *                       report dispatch (started - created) and submit->done (finished -
 *                       created) latencies and the completion rate
 *     --tag T           target names are T-<n> (default: bench-<pid>)
 *     --transport X     h2 (default) or grpc, for the submits
 *     --connections N   HTTP/2 connections of the h2 transport (default 4)
 *
 * Output: one "key=value" per line (rates per second, latencies in ms), for the driver.
 * Exit status 0, or 1 when a call failed or an operation did not end SUCCEEDED.
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pivirt/operations/v1/operations.pb-c.h"

#define M_CREATE "/pivirt.operations.v1.OperationService/CreateTestOperation"
#define M_WAIT "/pivirt.operations.v1.OperationService/WaitOperation"
#define ID_MAX 64

typedef struct opts {
    const char *gateway, *redis, *prefix, *tag;
    double seconds, rate, collect;
    long count;
    int concurrency, ms, connections;
    bool wait, h2;
} opts;

typedef enum { CALL_CREATE, CALL_WAIT } call_kind;

typedef struct bcall {
    grpc_call *call;
    call_kind kind;
    grpc_metadata_array md_init, md_trail;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_status_code status;
    grpc_slice details;
    double started; /* monotonic s */
    struct bcall *next_free;
} bcall;

typedef struct bench {
    opts o;
    grpc_channel *ch;
    grpc_completion_queue *cq;
    bcall *free_calls;
    int in_flight;
    long submitted, created_ok, failures, next_target;
    char **ids; /* ids of created operations */
    size_t n_ids, cap_ids;
    double *submit_lat, *wake_lat;
    size_t n_submit_lat, n_wake_lat;
    long waits_ok, waits_not_done;
    char first_error[256];
} bench;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double real_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) {
        fprintf(stderr, "bench_ops: out of memory\n");
        exit(1);
    }
    return q;
}

/* Appends to an array that grows at each power of two from 1024 on. */
static void push_double(double **arr, size_t *n, double v) {
    if (*n == 0 || (*n >= 1024 && (*n & (*n - 1)) == 0))
        *arr = xrealloc(*arr, (*n ? *n * 2 : 1024) * sizeof **arr);
    (*arr)[(*n)++] = v;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
    if (n == 0) return -1;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static grpc_byte_buffer *pack(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static Pivirt__Operations__V1__Operation *unpack_op(grpc_byte_buffer *bb) {
    if (!bb) return NULL;
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    Pivirt__Operations__V1__Operation *op = pivirt__operations__v1__operation__unpack(
        NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return op;
}

static bcall *call_get(bench *b) {
    bcall *c = b->free_calls;
    if (c)
        b->free_calls = c->next_free;
    else
        c = xrealloc(NULL, sizeof *c);
    memset(c, 0, sizeof *c);
    return c;
}

static void call_put(bench *b, bcall *c) {
    c->next_free = b->free_calls;
    b->free_calls = c;
}

static void start_unary(bench *b, bcall *c, const char *method, const ProtobufCMessage *req) {
    c->call = grpc_channel_create_call(b->ch, NULL, GRPC_PROPAGATE_DEFAULTS, b->cq,
                                       grpc_slice_from_static_string(method), NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_metadata_array_init(&c->md_init);
    grpc_metadata_array_init(&c->md_trail);
    c->send_bb = pack(req);
    c->started = mono_s();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send_bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_init;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv_bb;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->md_trail;
    ops[5].data.recv_status_on_client.status = &c->status;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    if (grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK) {
        fprintf(stderr, "bench_ops: grpc_call_start_batch failed\n");
        exit(1);
    }
    b->in_flight++;
}

/* The CreateTestOperation request of the next target; fills *req (borrowing the buffers). */
typedef struct create_req {
    char target[96], ms[16];
    Pivirt__Operations__V1__CreateTestOperationRequest__ParamsEntry param;
    Pivirt__Operations__V1__CreateTestOperationRequest__ParamsEntry *params[1];
    Pivirt__Operations__V1__CreateTestOperationRequest msg;
} create_req;

static void next_create(bench *b, create_req *r) {
    snprintf(r->target, sizeof r->target, "%s-%ld", b->o.tag, b->next_target++);
    snprintf(r->ms, sizeof r->ms, "%d", b->o.ms);
    pivirt__operations__v1__create_test_operation_request__params_entry__init(&r->param);
    r->param.key = "ms";
    r->param.value = r->ms;
    r->params[0] = &r->param;
    pivirt__operations__v1__create_test_operation_request__init(&r->msg);
    r->msg.kind = "test.sleep";
    r->msg.target = r->target;
    r->msg.n_params = 1;
    r->msg.params = r->params;
    r->msg.max_attempts = 1;
}

static void created(bench *b, const char *id, double started) {
    b->created_ok++;
    push_double(&b->submit_lat, &b->n_submit_lat, (mono_s() - started) * 1e3);
    if (b->n_ids == b->cap_ids) {
        b->cap_ids = b->cap_ids ? b->cap_ids * 2 : 4096;
        b->ids = xrealloc(b->ids, b->cap_ids * sizeof *b->ids);
    }
    b->ids[b->n_ids++] = strdup(id);
}

static void submit_one(bench *b) {
    create_req r;
    next_create(b, &r);
    bcall *c = call_get(b);
    c->kind = CALL_CREATE;
    start_unary(b, c, M_CREATE, &r.msg.base);
    b->submitted++;
}

static void wait_one(bench *b, const char *id) {
    Pivirt__Operations__V1__WaitOperationRequest req =
        PIVIRT__OPERATIONS__V1__WAIT_OPERATION_REQUEST__INIT;
    req.id = (char *)id;
    req.timeout_seconds = 60;
    bcall *c = call_get(b);
    c->kind = CALL_WAIT;
    start_unary(b, c, M_WAIT, &req.base);
}

static void note_error(bench *b, bcall *c) {
    b->failures++;
    if (!b->first_error[0]) {
        char *d = grpc_slice_to_c_string(c->details);
        snprintf(b->first_error, sizeof b->first_error, "%s: status %d: %s",
                 c->kind == CALL_CREATE ? "CreateTestOperation" : "WaitOperation", c->status, d);
        gpr_free(d);
    }
}

static void on_done(bench *b, bcall *c) {
    b->in_flight--;
    double now_real = real_ms();
    Pivirt__Operations__V1__Operation *op = NULL;
    if (c->status != GRPC_STATUS_OK) {
        note_error(b, c);
    } else if (!(op = unpack_op(c->recv_bb))) {
        snprintf(b->first_error, sizeof b->first_error, "undecodable Operation");
        b->failures++;
    } else if (c->kind == CALL_CREATE) {
        created(b, op->id, c->started);
        if (b->o.wait) wait_one(b, op->id);
    } else {
        if (op->done && op->finished_at) {
            double fin = (double)op->finished_at->seconds * 1e3 + op->finished_at->nanos / 1e6;
            /* finished_at has ms resolution: a wake-up inside the same ms reads as 0..1 ms. */
            push_double(&b->wake_lat, &b->n_wake_lat, now_real - fin);
            b->waits_ok++;
        } else {
            b->waits_not_done++;
        }
    }
    if (op) pivirt__operations__v1__operation__free_unpacked(op, NULL);
    grpc_byte_buffer_destroy(c->send_bb);
    if (c->recv_bb) grpc_byte_buffer_destroy(c->recv_bb);
    grpc_metadata_array_destroy(&c->md_init);
    grpc_metadata_array_destroy(&c->md_trail);
    grpc_slice_unref(c->details);
    grpc_call_unref(c->call);
    call_put(b, c);
}

static bool more_to_submit(const bench *b, double t0, double now) {
    if (b->o.count > 0) return b->submitted < b->o.count;
    return now - t0 < b->o.seconds;
}

/* The submit phase: keeps up to concurrency calls in flight, paced when a rate is given. */
static double run(bench *b) {
    double t0 = mono_s();
    for (;;) {
        double now = mono_s();
        bool more = more_to_submit(b, t0, now);
        if (!more && b->in_flight == 0) break;
        while (more && b->in_flight < b->o.concurrency) {
            if (b->o.rate > 0 && now < t0 + (double)b->submitted / b->o.rate) break;
            submit_one(b);
            more = more_to_submit(b, t0, now);
        }
        gpr_timespec dl =
            gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                         gpr_time_from_micros(b->o.rate > 0 ? 200 : 100000, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(b->cq, dl, NULL);
        while (ev.type == GRPC_OP_COMPLETE) {
            on_done(b, ev.tag);
            ev = grpc_completion_queue_next(b->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
        }
    }
    return mono_s() - t0;
}

/* --- the h2 transport -------------------------------------------------------------------- */

#define H2_SLOTS 4096 /* streams in flight per connection, at most */
#define H2_WINDOW 0x7fffffff

enum {
    F_DATA = 0,
    F_HEADERS = 1,
    F_RST = 3,
    F_SETTINGS = 4,
    F_PING = 6,
    F_GOAWAY = 7,
    F_WINUP = 8
};
enum { FL_END_STREAM = 1, FL_ACK = 1, FL_END_HEADERS = 4, FL_PADDED = 8, FL_PRIORITY = 0x20 };

typedef struct h2stream {
    uint32_t id; /* 0: free slot */
    double started;
    uint8_t *data;
    size_t len, cap;
} h2stream;

typedef struct buf {
    uint8_t *p;
    size_t len, cap;
} buf;

typedef struct h2conn {
    int fd;
    uint32_t next_id;
    int64_t send_window;
    uint64_t unacked; /* received DATA bytes not yet given back with WINDOW_UPDATE */
    buf out, in;
    int in_flight;
    h2stream slots[H2_SLOTS];
} h2conn;

static void buf_put(buf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void frame_head(buf *b, size_t len, int type, int flags, uint32_t stream) {
    uint8_t h[9] = {(uint8_t)(len >> 16),    (uint8_t)(len >> 8),    (uint8_t)len,
                    (uint8_t)type,           (uint8_t)flags,         (uint8_t)(stream >> 24 & 0x7f),
                    (uint8_t)(stream >> 16), (uint8_t)(stream >> 8), (uint8_t)stream};
    buf_put(b, h, 9);
}

static void put_u32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    buf_put(b, x, 4);
}

/* HPACK string literal, no Huffman; n < 127. */
static void hpack_str(buf *b, const char *s) {
    uint8_t n = (uint8_t)strlen(s);
    buf_put(b, &n, 1);
    buf_put(b, s, n);
}

/* The one header block every request carries (RFC 7541 static table indexes). */
static void header_block(buf *b, const char *authority) {
    static const uint8_t post_http[] = {0x83, 0x86}; /* :method POST, :scheme http */
    buf_put(b, post_http, 2);
    uint8_t path = 0x04; /* literal without indexing, name :path (4) */
    buf_put(b, &path, 1);
    hpack_str(b, M_CREATE);
    uint8_t auth = 0x01; /* :authority (1) */
    buf_put(b, &auth, 1);
    hpack_str(b, authority);
    static const uint8_t ctype[] = {0x0f, 0x10}; /* content-type (31) */
    buf_put(b, ctype, 2);
    hpack_str(b, "application/grpc");
    uint8_t lit = 0x00; /* literal name */
    buf_put(b, &lit, 1);
    hpack_str(b, "te");
    hpack_str(b, "trailers");
}

static int h2_connect(const char *addr, h2conn *c) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0) return -1;
    c->fd = socket(ai->ai_family, SOCK_STREAM, 0);
    int rc = c->fd >= 0 ? connect(c->fd, ai->ai_addr, ai->ai_addrlen) : -1;
    freeaddrinfo(ai);
    if (rc != 0) return -1;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    c->next_id = 1;
    c->send_window = 65535;
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    buf_put(&c->out, preface, sizeof preface - 1);
    frame_head(&c->out, 12, F_SETTINGS, 0, 0);
    static const uint8_t settings[] = {0, 2, 0,    0,    0,    0,     /* ENABLE_PUSH 0 */
                                       0, 4, 0x7f, 0xff, 0xff, 0xff}; /* INITIAL_WINDOW */
    buf_put(&c->out, settings, sizeof settings);
    frame_head(&c->out, 4, F_WINUP, 0, 0);
    put_u32(&c->out, H2_WINDOW - 65535);
    return 0;
}

static int h2_flush(h2conn *c) {
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t n = write(c->fd, c->out.p + off, c->out.len - off);
        if (n < 0 && errno == EAGAIN) break;
        if (n <= 0) return -1;
        off += (size_t)n;
    }
    memmove(c->out.p, c->out.p + off, c->out.len - off);
    c->out.len -= off;
    return 0;
}

/* Queues one CreateTestOperation; false when the connection cannot take one now. */
static bool h2_submit(bench *b, h2conn *c, const buf *headers) {
    h2stream *s = &c->slots[(c->next_id >> 1) % H2_SLOTS];
    if (s->id) return false;
    create_req r;
    next_create(b, &r);
    size_t n = protobuf_c_message_get_packed_size(&r.msg.base);
    if (c->send_window < (int64_t)n + 5) {
        b->next_target--;
        return false;
    }
    s->id = c->next_id;
    c->next_id += 2;
    s->started = mono_s();
    s->len = 0;
    frame_head(&c->out, headers->len, F_HEADERS, FL_END_HEADERS, s->id);
    buf_put(&c->out, headers->p, headers->len);
    frame_head(&c->out, n + 5, F_DATA, FL_END_STREAM, s->id);
    uint8_t prefix[5] = {0, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    buf_put(&c->out, prefix, 5);
    if (c->out.len + n > c->out.cap) {
        c->out.cap = (c->out.len + n) * 2;
        c->out.p = xrealloc(c->out.p, c->out.cap);
    }
    protobuf_c_message_pack(&r.msg.base, c->out.p + c->out.len);
    c->out.len += n;
    c->send_window -= (int64_t)n + 5;
    c->in_flight++;
    b->in_flight++;
    b->submitted++;
    return true;
}

static h2stream *h2_stream(h2conn *c, uint32_t id) {
    h2stream *s = &c->slots[(id >> 1) % H2_SLOTS];
    return s->id == id ? s : NULL;
}

static void h2_done(bench *b, h2conn *c, h2stream *s) {
    Pivirt__Operations__V1__Operation *op = NULL;
    if (s->len > 5) op = pivirt__operations__v1__operation__unpack(NULL, s->len - 5, s->data + 5);
    if (op) {
        created(b, op->id, s->started);
        pivirt__operations__v1__operation__free_unpacked(op, NULL);
    } else {
        b->failures++;
        if (!b->first_error[0])
            snprintf(b->first_error, sizeof b->first_error,
                     "CreateTestOperation on stream %u answered no Operation (an error status)",
                     s->id);
    }
    s->id = 0;
    c->in_flight--;
    b->in_flight--;
}

/* Parses the complete frames in c->in. Returns -1 on a connection error (GOAWAY). */
static int h2_read_frames(bench *b, h2conn *c) {
    size_t off = 0;
    while (c->in.len - off >= 9) {
        uint8_t *h = c->in.p + off;
        size_t len = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
        if (c->in.len - off < 9 + len) break;
        int type = h[3], flags = h[4];
        uint32_t sid =
            ((uint32_t)h[5] & 0x7f) << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8];
        uint8_t *p = h + 9;
        h2stream *s = sid ? h2_stream(c, sid) : NULL;
        if (type == F_DATA) {
            size_t pad = (flags & FL_PADDED) && len ? p[0] + 1u : 0;
            c->unacked += len;
            if (s && len >= pad) {
                size_t n = len - pad;
                if (s->len + n > s->cap) {
                    s->cap = (s->len + n) * 2;
                    s->data = xrealloc(s->data, s->cap);
                }
                memcpy(s->data + s->len, p + ((flags & FL_PADDED) ? 1 : 0), n);
                s->len += n;
            }
            if (s && (flags & FL_END_STREAM)) h2_done(b, c, s);
        } else if (type == F_HEADERS) {
            if (s && (flags & FL_END_STREAM)) h2_done(b, c, s);
        } else if (type == F_RST) {
            if (s) {
                s->len = 0;
                h2_done(b, c, s);
            }
        } else if (type == F_SETTINGS) {
            if (!(flags & FL_ACK)) frame_head(&c->out, 0, F_SETTINGS, FL_ACK, 0);
        } else if (type == F_PING) {
            if (!(flags & FL_ACK) && len == 8) {
                frame_head(&c->out, 8, F_PING, FL_ACK, 0);
                buf_put(&c->out, p, 8);
            }
        } else if (type == F_GOAWAY) {
            snprintf(b->first_error, sizeof b->first_error, "the gateway sent GOAWAY");
            return -1;
        } else if (type == F_WINUP && sid == 0 && len == 4) {
            c->send_window += (int64_t)(((uint32_t)p[0] & 0x7f) << 24 | (uint32_t)p[1] << 16 |
                                        (uint32_t)p[2] << 8 | p[3]);
        }
        off += 9 + len;
    }
    memmove(c->in.p, c->in.p + off, c->in.len - off);
    c->in.len -= off;
    if (c->unacked > (1u << 30)) {
        frame_head(&c->out, 4, F_WINUP, 0, 0);
        put_u32(&c->out, (uint32_t)c->unacked);
        c->unacked = 0;
    }
    return 0;
}

static int h2_read(bench *b, h2conn *c) {
    for (;;) {
        if (c->in.cap - c->in.len < 65536) {
            c->in.cap = c->in.len + 262144;
            c->in.p = xrealloc(c->in.p, c->in.cap);
        }
        ssize_t n = read(c->fd, c->in.p + c->in.len, c->in.cap - c->in.len);
        if (n < 0 && errno == EAGAIN) return 0;
        if (n <= 0) {
            snprintf(b->first_error, sizeof b->first_error, "the gateway closed the connection");
            return -1;
        }
        c->in.len += (size_t)n;
        if (h2_read_frames(b, c) != 0) return -1;
    }
}

/* The submit phase over raw HTTP/2: like run(), with the h2 transport. */
static double run_h2(bench *b) {
    int nc = b->o.connections;
    h2conn *conns = calloc((size_t)nc, sizeof *conns);
    struct pollfd *pfd = calloc((size_t)nc, sizeof *pfd);
    buf headers = {0};
    header_block(&headers, b->o.gateway);
    for (int i = 0; i < nc; i++) {
        if (h2_connect(b->o.gateway, &conns[i]) != 0) {
            fprintf(stderr, "bench_ops: cannot connect to %s\n", b->o.gateway);
            exit(1);
        }
    }
    int per_conn = (b->o.concurrency + nc - 1) / nc;
    if (per_conn > H2_SLOTS / 2) per_conn = H2_SLOTS / 2;
    double t0 = mono_s();
    bool broken = false;
    for (;;) {
        double now = mono_s();
        bool more = !broken && more_to_submit(b, t0, now);
        if (!more && b->in_flight == 0) break;
        for (int i = 0; more && i < nc; i++) {
            h2conn *c = &conns[(i + b->submitted) % nc];
            while (more && c->in_flight < per_conn && b->in_flight < b->o.concurrency) {
                if (b->o.rate > 0 && now < t0 + (double)b->submitted / b->o.rate) {
                    more = false;
                    break;
                }
                if (!h2_submit(b, c, &headers)) break;
                more = more_to_submit(b, t0, now);
            }
        }
        for (int i = 0; i < nc; i++) {
            if (conns[i].out.len && h2_flush(&conns[i]) != 0) broken = true;
            pfd[i] = (struct pollfd){conns[i].fd, POLLIN | (conns[i].out.len ? POLLOUT : 0), 0};
        }
        if (broken) break;
        int wait_ms = b->o.rate > 0 ? 1 : 100;
        if (poll(pfd, (nfds_t)nc, wait_ms) < 0 && errno != EINTR) break;
        for (int i = 0; i < nc; i++) {
            if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) && h2_read(b, &conns[i]) != 0)
                broken = true;
        }
        if (broken) break;
    }
    double secs = mono_s() - t0;
    if (broken) b->failures += b->in_flight;
    for (int i = 0; i < nc; i++) {
        close(conns[i].fd);
        free(conns[i].out.p);
        free(conns[i].in.p);
        for (int k = 0; k < H2_SLOTS; k++)
            free(conns[i].slots[k].data);
    }
    free(headers.p);
    free(conns);
    free(pfd);
    return secs;
}

/* --- after the run: the records ------------------------------------------------------------ */

static redisContext *redis_connect(const char *addr) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= sizeof host) return NULL;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout(host, atoi(colon + 1), tv);
    if (!c || c->err) {
        fprintf(stderr, "bench_ops: redis %s: %s\n", addr, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    return c;
}

typedef struct rec_times {
    int64_t created, started, finished;
    bool done, succeeded;
} rec_times;

/* Reads status and times of every operation (pipelined HMGET). */
static int read_records(bench *b, redisContext *rc, rec_times *out) {
    for (size_t i = 0; i < b->n_ids; i++)
        redisAppendCommand(rc, "HMGET %s{ops}:op:%s status created_ms started_ms finished_ms",
                           b->o.prefix, b->ids[i]);
    for (size_t i = 0; i < b->n_ids; i++) {
        redisReply *r = NULL;
        if (redisGetReply(rc, (void **)&r) != REDIS_OK || !r) return -1;
        memset(&out[i], 0, sizeof out[i]);
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 4 && r->element[0]->str) {
            const char *st = r->element[0]->str;
            out[i].succeeded = strcmp(st, "SUCCEEDED") == 0;
            out[i].done =
                out[i].succeeded || strcmp(st, "FAILED") == 0 || strcmp(st, "CANCELLED") == 0;
            out[i].created = r->element[1]->str ? atoll(r->element[1]->str) : 0;
            out[i].started = r->element[2]->str ? atoll(r->element[2]->str) : 0;
            out[i].finished = r->element[3]->str ? atoll(r->element[3]->str) : 0;
        }
        freeReplyObject(r);
    }
    return 0;
}

static int collect(bench *b) {
    redisContext *rc = redis_connect(b->o.redis);
    if (!rc) return -1;
    rec_times *t = xrealloc(NULL, (b->n_ids ? b->n_ids : 1) * sizeof *t);
    double deadline = mono_s() + b->o.collect;
    size_t done = 0;
    for (;;) {
        if (read_records(b, rc, t) != 0) {
            fprintf(stderr, "bench_ops: reading the records failed: %s\n", rc->errstr);
            redisFree(rc);
            free(t);
            return -1;
        }
        done = 0;
        for (size_t i = 0; i < b->n_ids; i++)
            done += t[i].done;
        if (done == b->n_ids || mono_s() > deadline) break;
        usleep(100 * 1000);
    }
    redisFree(rc);
    double *dispatch = NULL, *e2e = NULL;
    size_t nd = 0, ne = 0, succeeded = 0;
    int64_t first_created = INT64_MAX, last_finished = 0;
    for (size_t i = 0; i < b->n_ids; i++) {
        if (t[i].succeeded) succeeded++;
        if (t[i].created && t[i].created < first_created) first_created = t[i].created;
        if (t[i].started) push_double(&dispatch, &nd, (double)(t[i].started - t[i].created));
        if (t[i].done && t[i].finished) {
            push_double(&e2e, &ne, (double)(t[i].finished - t[i].created));
            if (t[i].finished > last_finished) last_finished = t[i].finished;
        }
    }
    double span = last_finished > first_created ? (double)(last_finished - first_created) : 1;
    printf("ops_done=%zu\nops_succeeded=%zu\nops_total=%zu\n", done, succeeded, b->n_ids);
    printf("e2e_rate=%.0f\n", (double)done / span * 1e3);
    printf("dispatch_p50_ms=%.1f\ndispatch_p99_ms=%.1f\n", pct(dispatch, nd, 50),
           pct(dispatch, nd, 99));
    printf("e2e_p50_ms=%.1f\ne2e_p99_ms=%.1f\n", pct(e2e, ne, 50), pct(e2e, ne, 99));
    free(dispatch);
    free(e2e);
    free(t);
    return succeeded == b->n_ids ? 0 : 1;
}

/* ---------------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr, "usage: bench_ops --gateway HOST:PORT --redis HOST:PORT --prefix P "
                    "[--seconds S | --count N] [--rate R] [--concurrency C] [--ms M] [--wait] "
                    "[--collect S] [--tag T] [--transport h2|grpc] [--connections N]\n");
    exit(2);
}

static void parse(int argc, char **argv, opts *o) {
    static char tag[64];
    snprintf(tag, sizeof tag, "bench-%d", (int)getpid());
    *o = (opts){.seconds = 5,
                .concurrency = 200,
                .tag = tag,
                .prefix = "pv:",
                .h2 = true,
                .connections = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--wait") == 0) {
            o->wait = true;
            continue;
        }
        if (!v) usage();
        i++;
        if (strcmp(a, "--gateway") == 0)
            o->gateway = v;
        else if (strcmp(a, "--redis") == 0)
            o->redis = v;
        else if (strcmp(a, "--prefix") == 0)
            o->prefix = v;
        else if (strcmp(a, "--tag") == 0)
            o->tag = v;
        else if (strcmp(a, "--seconds") == 0)
            o->seconds = atof(v);
        else if (strcmp(a, "--count") == 0)
            o->count = atol(v);
        else if (strcmp(a, "--rate") == 0)
            o->rate = atof(v);
        else if (strcmp(a, "--concurrency") == 0)
            o->concurrency = atoi(v);
        else if (strcmp(a, "--ms") == 0)
            o->ms = atoi(v);
        else if (strcmp(a, "--collect") == 0)
            o->collect = atof(v);
        else if (strcmp(a, "--connections") == 0)
            o->connections = atoi(v);
        else if (strcmp(a, "--transport") == 0 && strcmp(v, "h2") == 0)
            o->h2 = true;
        else if (strcmp(a, "--transport") == 0 && strcmp(v, "grpc") == 0)
            o->h2 = false;
        else
            usage();
    }
    if (!o->gateway || (o->collect > 0 && !o->redis) || o->concurrency < 1 || o->connections < 1)
        usage();
    if (o->wait) o->h2 = false; /* WaitOperation needs the status of every answer */
}

int main(int argc, char **argv) {
    bench b;
    memset(&b, 0, sizeof b);
    parse(argc, argv, &b.o);
    grpc_init();
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    b.ch = grpc_channel_create(b.o.gateway, creds, NULL);
    grpc_channel_credentials_release(creds);
    b.cq = grpc_completion_queue_create_for_next(NULL);

    double secs = b.o.h2 ? run_h2(&b) : run(&b);
    printf("submitted=%ld\ncreated=%ld\nfailures=%ld\nseconds=%.3f\n", b.submitted, b.created_ok,
           b.failures, secs);
    printf("submit_rate=%.0f\n", (double)b.created_ok / secs);
    printf("submit_p50_ms=%.2f\nsubmit_p99_ms=%.2f\n", pct(b.submit_lat, b.n_submit_lat, 50),
           pct(b.submit_lat, b.n_submit_lat, 99));
    if (b.o.wait)
        printf("waits_woken=%ld\nwaits_not_done=%ld\nwake_p50_ms=%.1f\nwake_p99_ms=%.1f\n",
               b.waits_ok, b.waits_not_done, pct(b.wake_lat, b.n_wake_lat, 50),
               pct(b.wake_lat, b.n_wake_lat, 99));
    if (b.first_error[0]) printf("first_error=%s\n", b.first_error);
    int rc = b.failures ? 1 : 0;
    if (b.o.collect > 0 && collect(&b) != 0) rc = 1;
    fflush(stdout);

    grpc_channel_destroy(b.ch);
    grpc_completion_queue_shutdown(b.cq);
    while (grpc_completion_queue_next(b.cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(b.cq);
    for (bcall *c = b.free_calls, *next; c; c = next) {
        next = c->next_free;
        free(c);
    }
    for (size_t i = 0; i < b.n_ids; i++)
        free(b.ids[i]);
    free(b.ids);
    free(b.submit_lat);
    free(b.wake_lat);
    grpc_shutdown_blocking();
    return rc;
}
