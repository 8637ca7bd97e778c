/*
 * bench_history: fills a Redis with finished operations, as a long-running system retains them,
 * for the large-history figures of `./ops/pivirt bench ops` (tests/bench/bench_ops.py): the
 * restart time with a million retained operations and the latency of a filtered ListOperations.
 *
 * Every operation goes through the same Redis functions the gateway calls (FCALL pv_op_submit,
 * then pv_op_cancel, which ends it and starts its retention), pipelined in batches so that a
 * million take a minute rather than an hour of round trips. Kinds and targets repeat as they
 * do in a real system: operation i has kind "<tag>.k<i mod kinds>" and target
 * "<tag>-t<i mod targets>" (one at a time per target: its lock is held until the cancel, which
 * comes before the next submit of the pipeline). Their queue, "history", has no workers; its
 * stream is deleted at the end, as workers would have consumed and trimmed it.
 *
 *   bench_history --redis HOST:PORT --prefix P --count N [--kinds K] [--targets T] [--tag T]
 *                 [--retention S] [--batch B]
 *
 * With --gateway it measures instead: --calls ListOperations calls in a row through the gateway
 * (the gRPC C core API, one call at a time, every message of the stream read), filtered by
 * --list-target and/or --list-kind, with --list-limit; a client in C, so the figure is the
 * gateway's and Redis's, not a Python client's per-message cost.
 *
 *   bench_history --gateway HOST:PORT --calls N [--list-target T] [--list-kind K]
 *                 [--list-limit L]
 *
 * Output: "key=value" lines for the driver: loaded, seconds, rate per second; or list_p50_ms,
 * list_p99_ms, list_page. Exit status 0, or 1 when a call failed (the first error is printed).
 */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pivirt/operations/v1/operations.pb-c.h"
#include "pv_id.h"

#define QUEUE "history"
#define ARG_MAX 32
#define M_LIST "/pivirt.operations.v1.OperationService/ListOperations"

typedef struct opts {
    const char *redis, *prefix, *tag;
    long count, kinds, targets, batch;
    int retention;
    const char *gateway, *list_target, *list_kind;
    long calls, list_limit;
} opts;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The argument strings of one command, owned by the struct (cmd_clear). */
typedef struct cmd {
    int argc;
    char *argv[ARG_MAX];
} cmd;

static int cmd_add(cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cmd_add(cmd *c, const char *fmt, ...) {
    if (c->argc >= ARG_MAX) return -1;
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&c->argv[c->argc], fmt, ap);
    va_end(ap);
    if (rc < 0) return -1;
    c->argc++;
    return 0;
}

static void cmd_clear(cmd *c) {
    for (int i = 0; i < c->argc; i++)
        free(c->argv[i]);
    c->argc = 0;
}

static int cmd_append(redisContext *rc, cmd *c) {
    int r = redisAppendCommandArgv(rc, c->argc, (const char **)c->argv, NULL);
    cmd_clear(c);
    return r == REDIS_OK ? 0 : -1;
}

/* FCALL pv_op_submit and pv_op_cancel of operation i, as pv_op_submit and pv_op_cancel
 * (shared/store/pv_op.c) call them. */
static int append_op(redisContext *rc, const opts *o, long i) {
    char id[PV_ID_MAX], kind[96], target[96];
    if (pv_id_new("op", id, sizeof id) != 0) return -1;
    snprintf(kind, sizeof kind, "%s.k%ld", o->tag, i % o->kinds);
    snprintf(target, sizeof target, "%s-t%ld", o->tag, i % o->targets);
    const char *p = o->prefix;
    cmd c = {0};
    int bad = 0;
    bad |= cmd_add(&c, "FCALL") | cmd_add(&c, "pv_op_submit") | cmd_add(&c, "5");
    bad |= cmd_add(&c, "%s{ops}:op:%s", p, id) | cmd_add(&c, "%s{ops}:q:" QUEUE, p);
    bad |= cmd_add(&c, "%s{ops}:index", p) | cmd_add(&c, "%s{ops}:events", p);
    bad |= cmd_add(&c, "%s{ops}:lock:%s", p, target);
    bad |= cmd_add(&c, "%s{ops}:", p) | cmd_add(&c, "%s", id) | cmd_add(&c, "%s", kind);
    bad |= cmd_add(&c, "%s", target) | cmd_add(&c, QUEUE) | cmd_add(&c, "{\"ms\":\"0\"}");
    bad |= cmd_add(&c, "{}") | cmd_add(&c, "%s", "") | cmd_add(&c, "5") | cmd_add(&c, "[]");
    bad |= cmd_add(&c, "100000") | cmd_add(&c, "1") | cmd_add(&c, "86400") | cmd_add(&c, "%s", "");
    bad |= cmd_add(&c, "0") | cmd_add(&c, "limit") | cmd_add(&c, "0");
    bad |= cmd_add(&c, "%d", o->retention);
    if (bad || cmd_append(rc, &c) != 0) {
        cmd_clear(&c);
        return -1;
    }
    bad |= cmd_add(&c, "FCALL") | cmd_add(&c, "pv_op_cancel") | cmd_add(&c, "4");
    bad |= cmd_add(&c, "%s{ops}:op:%s", p, id) | cmd_add(&c, "%s{ops}:delayed", p);
    bad |= cmd_add(&c, "%s{ops}:events", p) | cmd_add(&c, "%s{ops}:lock:%s", p, target);
    bad |= cmd_add(&c, "%s{ops}:", p) | cmd_add(&c, "%s", id) | cmd_add(&c, "100000");
    bad |= cmd_add(&c, "%d", o->retention);
    if (bad || cmd_append(rc, &c) != 0) {
        cmd_clear(&c);
        return -1;
    }
    return 0;
}

/* Reads n replies; the first error reply is printed. Returns the number of errors. */
static long read_replies(redisContext *rc, long n) {
    long errors = 0;
    for (long i = 0; i < n; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(rc, (void **)&rep) != REDIS_OK || !rep) {
            fprintf(stderr, "bench_history: %s\n", rc->errstr);
            return errors + n - i;
        }
        if (rep->type == REDIS_REPLY_ERROR && errors++ == 0) printf("first_error=%s\n", rep->str);
        freeReplyObject(rep);
    }
    return errors;
}

static redisContext *connect_to(const char *addr) {
    char host[256];
    snprintf(host, sizeof host, "%s", addr);
    char *colon = strrchr(host, ':');
    if (!colon) return NULL;
    *colon = '\0';
    redisContext *rc = redisConnect(host, atoi(colon + 1));
    if (!rc || rc->err) {
        fprintf(stderr, "bench_history: cannot connect to %s: %s\n", addr,
                rc ? rc->errstr : "out of memory");
        redisFree(rc);
        return NULL;
    }
    return rc;
}

/* --- measuring: ListOperations through the gateway ---------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool run_batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n,
                      void *tag) {
    if (grpc_call_start_batch(call, ops, n, tag, NULL) != GRPC_CALL_OK) return false;
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* One call, every message of its stream read; *n = messages. 0 when it ended OK, else -1 (the
 * status is printed once, as first_error). */
static int list_once(grpc_channel *ch, grpc_completion_queue *cq, grpc_byte_buffer *req, long *n) {
    *n = 0;
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(30, GPR_TIMESPAN));
    grpc_call *call =
        grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                 grpc_slice_from_static_string(M_LIST), NULL, deadline, NULL);
    grpc_metadata_array md_init, md_trail;
    grpc_metadata_array_init(&md_init);
    grpc_metadata_array_init(&md_trail);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = req;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_init;
    bool ok = run_batch(call, cq, ops, 4, (void *)1);
    while (ok) {
        grpc_byte_buffer *bb = NULL;
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_RECV_MESSAGE;
        ops[0].data.recv_message.recv_message = &bb;
        ok = run_batch(call, cq, ops, 1, (void *)2);
        if (!bb) break;
        (*n)++;
        grpc_byte_buffer_destroy(bb);
    }
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &md_trail;
    ops[0].data.recv_status_on_client.status = &status;
    ops[0].data.recv_status_on_client.status_details = &details;
    run_batch(call, cq, ops, 1, (void *)3);
    static bool told;
    if (status != GRPC_STATUS_OK && !told) {
        told = true;
        printf("first_error=%d %.*s\n", (int)status, (int)GRPC_SLICE_LENGTH(details),
               (const char *)GRPC_SLICE_START_PTR(details));
    }
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&md_init);
    grpc_metadata_array_destroy(&md_trail);
    grpc_call_unref(call);
    return status == GRPC_STATUS_OK ? 0 : -1;
}

static grpc_byte_buffer *list_request(const opts *o) {
    Pivirt__Operations__V1__ListOperationsRequest m =
        PIVIRT__OPERATIONS__V1__LIST_OPERATIONS_REQUEST__INIT;
    m.target = (char *)(o->list_target ? o->list_target : "");
    m.kind = (char *)(o->list_kind ? o->list_kind : "");
    m.limit = (int32_t)o->list_limit;
    size_t len = protobuf_c_message_get_packed_size(&m.base);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(&m.base, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static int measure(const opts *o) {
    grpc_init();
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(o->gateway, creds, NULL);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_byte_buffer *req = list_request(o);
    double *lat = calloc((size_t)o->calls, sizeof *lat);
    long failures = 0, page = 0;
    for (long i = 0; lat && i < o->calls; i++) {
        double t0 = mono_s();
        if (list_once(ch, cq, req, &page) != 0) failures++;
        lat[i] = (mono_s() - t0) * 1000;
    }
    if (lat) {
        qsort(lat, (size_t)o->calls, sizeof *lat, cmp_double);
        printf("list_calls=%ld\nlist_failures=%ld\nlist_page=%ld\n", o->calls, failures, page);
        printf("list_p50_ms=%.2f\nlist_p99_ms=%.2f\n", lat[o->calls / 2],
               lat[(o->calls * 99) / 100 < o->calls ? (o->calls * 99) / 100 : o->calls - 1]);
    }
    int rc = lat && failures == 0 ? 0 : 1;
    free(lat);
    grpc_byte_buffer_destroy(req);
    grpc_channel_destroy(ch);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    grpc_shutdown_blocking();
    return rc;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_history --redis HOST:PORT --prefix P --count N [--kinds K] "
                    "[--targets T] [--tag T] [--retention S] [--batch B]\n"
                    "       bench_history --gateway HOST:PORT --calls N [--list-target T] "
                    "[--list-kind K] [--list-limit L]\n");
    exit(2);
}

static void parse(int argc, char **argv, opts *o) {
    *o = (opts){
        .tag = "hist", .kinds = 10, .targets = 10000, .batch = 500, .retention = 7 * 24 * 3600};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (strcmp(a, "--redis") == 0)
            o->redis = v;
        else if (strcmp(a, "--prefix") == 0)
            o->prefix = v;
        else if (strcmp(a, "--tag") == 0)
            o->tag = v;
        else if (strcmp(a, "--count") == 0)
            o->count = atol(v);
        else if (strcmp(a, "--kinds") == 0)
            o->kinds = atol(v);
        else if (strcmp(a, "--targets") == 0)
            o->targets = atol(v);
        else if (strcmp(a, "--batch") == 0)
            o->batch = atol(v);
        else if (strcmp(a, "--retention") == 0)
            o->retention = atoi(v);
        else if (strcmp(a, "--gateway") == 0)
            o->gateway = v;
        else if (strcmp(a, "--calls") == 0)
            o->calls = atol(v);
        else if (strcmp(a, "--list-target") == 0)
            o->list_target = v;
        else if (strcmp(a, "--list-kind") == 0)
            o->list_kind = v;
        else if (strcmp(a, "--list-limit") == 0)
            o->list_limit = atol(v);
        else
            usage();
    }
    if (argc % 2 != 1) usage();
    if (o->gateway) {
        if (o->calls <= 0 || o->list_limit < 0) usage();
        return;
    }
    if (!o->redis || !o->prefix || o->count <= 0 || o->kinds <= 0 || o->targets <= 0 ||
        o->batch <= 0 || o->retention <= 0)
        usage();
}

int main(int argc, char **argv) {
    opts o;
    parse(argc, argv, &o);
    if (o.gateway) return measure(&o);
    redisContext *rc = connect_to(o.redis);
    if (!rc) return 1;
    double t0 = mono_s();
    long errors = 0;
    for (long i = 0; i < o.count && errors == 0; i += o.batch) {
        long n = o.count - i < o.batch ? o.count - i : o.batch;
        for (long j = 0; j < n; j++)
            if (append_op(rc, &o, i + j) != 0) {
                fprintf(stderr, "bench_history: cannot build the commands of operation %ld\n",
                        i + j);
                redisFree(rc);
                return 1;
            }
        errors += read_replies(rc, 2 * n);
    }
    double secs = mono_s() - t0;
    redisReply *rep = redisCommand(rc, "DEL %s{ops}:q:" QUEUE, o.prefix);
    if (rep) freeReplyObject(rep);
    redisFree(rc);
    printf("loaded=%ld\nseconds=%.3f\nrate=%.0f\nerrors=%ld\n", errors ? 0 : o.count, secs,
           (double)o.count / secs, errors);
    return errors ? 1 : 0;
}
