/*
 * cli_rpc: blocking client calls on a pluck completion queue (see cli_rpc.h). One batch sends
 * the metadata, the request and the half-close and asks for the initial metadata; then one
 * RECV_MESSAGE at a time until the stream ends; then the status.
 */
#include "cli_rpc.h"

#include <stdbool.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cli_conn {
    grpc_channel *ch;
    char *user, *password;
};

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

cli_conn *cli_conn_open(const cli_conn_opts *o, char *err, size_t errlen) {
    grpc_init();
    cli_conn *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    grpc_channel_credentials *creds;
    if (o->tls_ca && *o->tls_ca) {
        char *pem = read_file(o->tls_ca);
        if (!pem) {
            snprintf(err, errlen, "cannot read the TLS CA file %s", o->tls_ca);
            free(c);
            return NULL;
        }
        grpc_ssl_pem_key_cert_pair pair = {0};
        bool mutual = o->tls_cert && *o->tls_cert;
        if (mutual) {
            pair.cert_chain = read_file(o->tls_cert);
            pair.private_key = o->tls_key && *o->tls_key ? read_file(o->tls_key) : NULL;
            if (!pair.cert_chain || !pair.private_key) {
                snprintf(err, errlen, "cannot read the TLS client %s %s",
                         pair.cert_chain ? "key file" : "certificate file",
                         pair.cert_chain ? (o->tls_key && *o->tls_key ? o->tls_key : "(none)")
                                         : o->tls_cert);
                free((char *)pair.cert_chain);
                free((char *)pair.private_key);
                free(pem);
                free(c);
                return NULL;
            }
        }
        creds = grpc_ssl_credentials_create(pem, mutual ? &pair : NULL, NULL, NULL);
        free(pem);
        free((char *)pair.cert_chain);
        if (pair.private_key) explicit_bzero((char *)pair.private_key, strlen(pair.private_key));
        free((char *)pair.private_key);
    } else {
        creds = grpc_insecure_credentials_create();
    }
    c->ch = grpc_channel_create(o->endpoint, creds, NULL);
    grpc_channel_credentials_release(creds);
    if (o->auth_user && *o->auth_user) {
        c->user = strdup(o->auth_user);
        c->password = strdup(o->auth_password ? o->auth_password : "");
    }
    return c;
}

void cli_conn_close(cli_conn *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    free(c->user);
    free(c->password);
    free(c);
    grpc_shutdown();
}

/* Runs a batch and waits for it. */
static int run_batch(grpc_call *call, grpc_completion_queue *cq, grpc_op *ops, size_t n,
                     void *tag) {
    if (grpc_call_start_batch(call, ops, n, tag, NULL) != GRPC_CALL_OK) return 0;
    grpc_event ev = grpc_completion_queue_pluck(cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int cli_call(cli_conn *c, const char *method, const uint8_t *req, size_t len, int timeout_s,
             cli_msg_fn on_msg, void *arg, char *details, size_t dlen) {
    details[0] = '\0';
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice path = grpc_slice_from_copied_string(method);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(timeout_s, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, path, NULL,
                                               deadline, NULL);
    grpc_slice_unref(path);

    grpc_metadata md;
    memset(&md, 0, sizeof md);
    if (c->user) {
        md.key = grpc_slice_from_copied_string(c->user);
        md.value = grpc_slice_from_copied_string(c->password);
    }
    grpc_slice body = grpc_slice_from_copied_buffer((const char *)req, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice status_details = grpc_empty_slice();

    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = c->user ? 1 : 0;
    ops[0].data.send_initial_metadata.metadata = c->user ? &md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    int tag = 0;
    bool stopped = false;
    if (run_batch(call, cq, ops, 4, &tag)) {
        for (;;) {
            grpc_byte_buffer *recv = NULL;
            grpc_op rop;
            memset(&rop, 0, sizeof rop);
            rop.op = GRPC_OP_RECV_MESSAGE;
            rop.data.recv_message.recv_message = &recv;
            if (!run_batch(call, cq, &rop, 1, &tag) || !recv) break;
            grpc_byte_buffer_reader reader;
            grpc_byte_buffer_reader_init(&reader, recv);
            grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
            grpc_byte_buffer_reader_destroy(&reader);
            grpc_byte_buffer_destroy(recv);
            int stop = on_msg ? on_msg(arg, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all)) : 0;
            grpc_slice_unref(all);
            if (stop) {
                grpc_call_cancel(call, NULL);
                stopped = true;
                break;
            }
        }
    }
    grpc_op sop;
    memset(&sop, 0, sizeof sop);
    sop.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    sop.data.recv_status_on_client.trailing_metadata = &trailing;
    sop.data.recv_status_on_client.status = &code;
    sop.data.recv_status_on_client.status_details = &status_details;
    run_batch(call, cq, &sop, 1, &tag);
    if (stopped) code = GRPC_STATUS_OK;
    snprintf(details, dlen, "%.*s", (int)GRPC_SLICE_LENGTH(status_details),
             (const char *)GRPC_SLICE_START_PTR(status_details));

    grpc_slice_unref(status_details);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_byte_buffer_destroy(send);
    if (c->user) {
        grpc_slice_unref(md.key);
        grpc_slice_unref(md.value);
    }
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return (int)code;
}
