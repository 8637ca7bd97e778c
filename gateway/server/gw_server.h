/*
 * gw_server: a small gRPC server framework on the gRPC C core completion-queue API.
 *
 * One completion queue, a pool of threads calling grpc_completion_queue_next on it, and a
 * dispatch table from method path to handler. The framework owns the call: it decodes the
 * request with protobuf-c, checks auth and size, runs the handler, and sends what the handler
 * produced one message at a time (the core allows one SEND_MESSAGE in flight per call). Methods
 * not in the table are answered UNIMPLEMENTED at once.
 *
 * Kinds of method:
 *   unary / server-stream  handler(call, req): answer with gw_call_send (0..n messages, unary
 *                          exactly one) and gw_call_finish. The handler may keep the call
 *                          (gw_call_ref) and answer later from another thread: every gw_call_*
 *                          function is thread-safe.
 *   client-stream / bidi   on_message(call, msg) for each message the client sends, then
 *                          on_message(call, NULL) once at half-close. Reads are sequential:
 *                          the next read starts when on_message returns.
 *
 * Lifetime: a call is freed once the client side is closed, no batch is in flight and no
 * reference is held. A handler that returns without finishing and without taking a reference
 * would leave the client hanging; the framework answers INTERNAL instead and logs it.
 *
 * Shutdown (gw_server_shutdown): stops accepting, lets in-flight calls finish for the grace
 * period, then cancels what remains and joins the threads.
 */
#ifndef GW_SERVER_H
#define GW_SERVER_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_server gw_server;
typedef struct gw_call gw_call;

typedef enum {
    GW_UNARY,
    GW_SERVER_STREAM,
    GW_CLIENT_STREAM,
    GW_BIDI_STREAM,
} gw_method_kind;

/* req is owned by the framework and freed when the handler returns: copy what you keep. */
typedef void (*gw_handler_fn)(gw_call *call, const ProtobufCMessage *req);
/* msg is NULL at half-close; otherwise owned by the framework, freed when on_message returns. */
typedef void (*gw_message_fn)(gw_call *call, const ProtobufCMessage *msg);
/* Per-thread state (e.g. a Redis connection): made once per pool thread, freed at exit. */
typedef void *(*gw_thread_init_fn)(void *app);
typedef void (*gw_thread_free_fn)(void *thread_state);

typedef struct gw_method {
    const char *path; /* "/pkg.Service/Method" (static storage) */
    gw_method_kind kind;
    const ProtobufCMessageDescriptor *request; /* decoder for the client's messages */
    gw_handler_fn handler;                     /* unary and server-stream */
    gw_message_fn on_message;                  /* client-stream and bidi */
    bool no_auth;                              /* skip the auth check (health, if configured) */
    /* The request is an upload (an image's tar, files): bounded by max_upload_bytes instead of
     * max_request_bytes. */
    bool upload;
    /* Overrides the error code used when the request cannot be decoded or is too large
     * (Eru answers its own per-call codes); 0 = INVALID_ARGUMENT. */
    int bad_request_code;
    /* The handler uses its thread's state (gw_call_thread_state: the gateway's Redis
     * connection). On a thread whose thread_init made none the framework answers, before any
     * handler runs, with bad_request_code (else UNAVAILABLE) and opts.state_missing, so no
     * handler checks for it. */
    bool needs_state;
    void *data; /* the module's own state: gw_call_method_data */
} gw_method;

typedef struct gw_server_opts {
    const char *const *listen; /* addresses "host:port"; at least one */
    size_t n_listen;
    int threads;               /* completion-queue threads (>= 1) */
    const char *tls_cert_path; /* PEM; NULL/"" = plaintext */
    const char *tls_key_path;
    const char *tls_client_ca_path; /* PEM of the CA signing client certificates; NULL/"" =
                                       none asked; set = mutual TLS, required and verified */
    int max_concurrent_streams;     /* per connection; <= 0 = 1000 */
    int max_streams_per_client;     /* streaming calls (not unary) one client (gw_call_client)
                                       may have open on this server at once; one more is
                                       RESOURCE_EXHAUSTED naming the limit; <= 0 = no bound */
    const char *auth_username;      /* NULL/"" = no auth; else one metadata entry with this key
                                       whose value is auth_password must come with every call */
    const char *auth_password;
    long max_request_bytes; /* larger requests get RESOURCE_EXHAUSTED naming the limit */
    long max_upload_bytes;  /* the same for an upload method's request (gw_method.upload);
                               <= 0: max_request_bytes. The transport takes no message larger
                               than the largest of both (plus slack), for any method: with
                               auth_username set, a request is read only once its credentials
                               were checked, so a client without them makes the server hold
                               no more than HTTP/2's flow-control window of its message */
    int shutdown_grace_ms;
    void *app; /* handed to handlers through gw_call_app */
    /* Says whether a path the server has no handler for is part of the declared API, so the
     * UNIMPLEMENTED answer can tell "not served by this build" from "no such method". */
    int (*is_declared)(void *arg, const char *path);
    void *is_declared_arg;
    gw_thread_init_fn thread_init;
    gw_thread_free_fn thread_free;
    /* The answer to a needs_state call on a thread without state; NULL: a generic one. */
    const char *state_missing;
    /* Observers of calls to served methods (metrics), any thread, may be NULL: a call started;
     * a call ended with its status code after seconds. */
    void (*on_call_start)(void *arg, const char *path);
    void (*on_call_end)(void *arg, const char *path, int code, double seconds);
    void *observer_arg;
} gw_server_opts;

/* --- server --- */

/* Creates the server and binds every address. On failure returns NULL and writes a message
 * naming the cause (e.g. the address that could not be bound) into err. Copies opts' strings. */
gw_server *gw_server_new(const gw_server_opts *opts, char *err, size_t errlen);

/* Adds a method; m must stay valid for the server's life. Only before gw_server_start.
 * Returns 0, or -1 when the path is already registered. */
int gw_server_add_method(gw_server *s, const gw_method *m);

/* A served method of a service table (gw_server_add_service). */
typedef struct gw_method_spec {
    const char *name; /* "GetPool" */
    gw_method_kind kind;
    const ProtobufCMessageDescriptor *request;
    gw_handler_fn handler;
    bool needs_state; /* gw_method.needs_state */
} gw_method_spec;

#define GW_PATH_MAX 128

/* Adds n unary or server-stream methods "/<service>/<name>" with data as their module state.
 * methods and paths (n each) are the caller's storage and must live as long as the server.
 * Returns 0 or -1 (as gw_server_add_method). */
int gw_server_add_service(gw_server *s, const char *service, const gw_method_spec *specs, size_t n,
                          void *data, gw_method *methods, char (*paths)[GW_PATH_MAX]);

/* Starts the threads. Returns 0 or -1. */
int gw_server_start(gw_server *s);

/* Graceful shutdown as described above; blocks until every thread has exited. */
void gw_server_shutdown(gw_server *s);

/* Frees a server that was shut down (or never started). */
void gw_server_free(gw_server *s);

/* Registers fn(arg) to run when shutdown begins, before the grace period, so long-lived
 * streams can end themselves cleanly. At most 8; only before gw_server_start. */
int gw_server_on_shutdown(gw_server *s, void (*fn)(void *arg), void *arg);

/* True once gw_server_shutdown has begun. */
bool gw_server_shutting_down(const gw_server *s);

/* Number of calls accepted and not yet freed (for tests and metrics). */
int gw_server_live_calls(const gw_server *s);

/* The port bound for listen address i (useful with port 0). */
int gw_server_bound_port(const gw_server *s, size_t i);

/* --- calls (all thread-safe) --- */

/* Queues a message (packed now; m may be freed at once). Returns 0, or -1 when the call is
 * already finished or the client has gone (the message is dropped). */
int gw_call_send(gw_call *c, const ProtobufCMessage *m);

/* Queues the final status after the queued messages. code is a gRPC code (or an Eru code).
 * details may be NULL. Only the first finish counts. */
void gw_call_finish(gw_call *c, int code, const char *details);
void gw_call_finishf(gw_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sends one message then OK: the whole of a successful unary answer. */
void gw_call_reply(gw_call *c, const ProtobufCMessage *m);

/* References for handlers that answer later. */
void gw_call_ref(gw_call *c);
void gw_call_unref(gw_call *c);

/* True once the client cancelled, the deadline passed or the call finished. */
bool gw_call_is_closed(gw_call *c);

/* fn(c, arg) runs once (on a pool thread) when the call closes: cancellation, deadline, or
 * after the status was sent. Returns 0, or -1 when the call had already closed (fn will never
 * run). A NULL fn clears it. */
int gw_call_on_close(gw_call *c, void (*fn)(gw_call *c, void *arg), void *arg);

/* Opaque state a handler attaches to the call; free_fn (may be NULL) runs when the call is
 * freed. */
void gw_call_set_user(gw_call *c, void *user, void (*free_fn)(void *));
void *gw_call_user(gw_call *c);

const char *gw_call_method(const gw_call *c);     /* "/pkg.Service/Method" */
const char *gw_call_request_id(const gw_call *c); /* x-request-id, or a generated id */
bool gw_call_has_client_request_id(const gw_call *c);
void *gw_call_app(const gw_call *c);
void *gw_call_method_data(const gw_call *c); /* the gw_method's data; NULL for unknown methods */
/* The per-thread state of the thread running the handler; NULL outside pool threads. */
void *gw_call_thread_state(const gw_call *c);

/* Who is calling, for per-client limits: "cert:<CN>" (verified TLS client certificate), else
 * "user:<auth user>" when auth is on, else "host:<peer address without port>". Valid while the
 * call lives; "unknown" before the handler runs. */
const char *gw_call_client(const gw_call *c);

/* Metadata value for key (lowercase) or NULL; valid while the call lives. *len gets its length. */
const char *gw_call_metadata(const gw_call *c, const char *key, size_t *len);

/* Milliseconds until the client's deadline; INT64_MAX when it set none. */
int64_t gw_call_deadline_ms(const gw_call *c);

#endif
