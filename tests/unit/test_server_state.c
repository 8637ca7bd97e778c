/*
 * gw_server's "needs state" property, through a real gRPC client on the loopback: a method that
 * needs its thread's state (the gateway's Redis connection) is answered by the framework, with
 * the method's own code (UNAVAILABLE when it has none) and the server's message, before its
 * handler runs, when the thread has none; a method that does not need it runs as always; with
 * state, the handler runs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <string.h>

#include "google/protobuf/empty.pb-c.h"
#include "gw_server.h"

static int handled;

static void on_call(gw_call *call, const ProtobufCMessage *req) {
    (void)req;
    handled++;
    Google__Protobuf__Empty e = GOOGLE__PROTOBUF__EMPTY__INIT;
    gw_call_reply(call, &e.base);
}

static void *no_state(void *app) {
    (void)app;
    return NULL;
}

static void *some_state(void *app) {
    (void)app;
    return &handled; /* any non-NULL pointer: the handler does not read it */
}

/* One unary call of path with an empty request; *details gets the status message. */
static grpc_status_code call_once(int port, const char *path, char *details, size_t len) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(target, creds, NULL);
    grpc_channel_credentials_release(creds);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(10, GPR_TIMESPAN));
    grpc_slice method = grpc_slice_from_static_string(path);
    grpc_call *c = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                            deadline, NULL);
    grpc_slice empty = grpc_empty_slice();
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&empty, 1), *recv = NULL;
    grpc_metadata_array md_init, md_trail;
    grpc_metadata_array_init(&md_init);
    grpc_metadata_array_init(&md_trail);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice got = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_init;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md_trail;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &got;
    assert_int_equal(grpc_call_start_batch(c, ops, 6, (void *)1, NULL), GRPC_CALL_OK);
    grpc_event ev = grpc_completion_queue_pluck(cq, (void *)1, deadline, NULL);
    assert_int_equal(ev.type, GRPC_OP_COMPLETE);
    char *text = grpc_slice_to_c_string(got);
    snprintf(details, len, "%s", text);
    gpr_free(text);
    grpc_slice_unref(got);
    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_metadata_array_destroy(&md_init);
    grpc_metadata_array_destroy(&md_trail);
    grpc_call_unref(c);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    grpc_channel_destroy(ch);
    return status;
}

static gw_method methods[3] = {
    {.path = "/t.S/Needs", .kind = GW_UNARY, .handler = on_call, .needs_state = true},
    {.path = "/t.S/NeedsWithCode",
     .kind = GW_UNARY,
     .handler = on_call,
     .needs_state = true,
     .bad_request_code = 1074},
    {.path = "/t.S/Free", .kind = GW_UNARY, .handler = on_call},
};

static gw_server *serve(gw_thread_init_fn init) {
    static const char *const listen[] = {"127.0.0.1:0"};
    gw_server_opts o = {.listen = listen,
                        .n_listen = 1,
                        .threads = 1,
                        .shutdown_grace_ms = 100,
                        .thread_init = init,
                        .state_missing = "no Redis connection on this gateway thread"};
    char err[256];
    gw_server *s = gw_server_new(&o, err, sizeof err);
    assert_non_null(s);
    for (size_t i = 0; i < 3; i++) {
        methods[i].request = &google__protobuf__empty__descriptor;
        assert_int_equal(gw_server_add_method(s, &methods[i]), 0);
    }
    assert_int_equal(gw_server_start(s), 0);
    return s;
}

static void stop(gw_server *s) {
    gw_server_shutdown(s);
    gw_server_free(s);
}

static void test_without_state_the_framework_answers(void **state) {
    (void)state;
    gw_server *s = serve(no_state);
    int port = gw_server_bound_port(s, 0);
    char details[256];
    handled = 0;
    assert_int_equal(call_once(port, "/t.S/Needs", details, sizeof details),
                     GRPC_STATUS_UNAVAILABLE);
    assert_string_equal(details, "no Redis connection on this gateway thread");
    assert_int_equal((int)call_once(port, "/t.S/NeedsWithCode", details, sizeof details), 1074);
    assert_int_equal(handled, 0);
    assert_int_equal(call_once(port, "/t.S/Free", details, sizeof details), GRPC_STATUS_OK);
    assert_int_equal(handled, 1);
    stop(s);
}

static void test_with_state_the_handler_runs(void **state) {
    (void)state;
    gw_server *s = serve(some_state);
    char details[256];
    handled = 0;
    assert_int_equal(call_once(gw_server_bound_port(s, 0), "/t.S/Needs", details, sizeof details),
                     GRPC_STATUS_OK);
    assert_int_equal(handled, 1);
    stop(s);
}

int main(void) {
    grpc_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_without_state_the_framework_answers),
        cmocka_unit_test(test_with_state_the_handler_runs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    grpc_shutdown_blocking();
    return rc;
}
