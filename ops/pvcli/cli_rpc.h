/*
 * cli_rpc: pvcli's gRPC calls on the gRPC C core client API: one channel, blocking calls that
 * send one request and hand every response message to a callback (unary and server-streaming
 * alike).
 *
 * Ownership: cli_conn_open copies what it keeps; cli_conn_close frees it. Messages handed to
 * the callback live until it returns.
 */
#ifndef CLI_RPC_H
#define CLI_RPC_H

#include <stddef.h>
#include <stdint.h>

typedef struct cli_conn cli_conn;

typedef struct cli_conn_opts {
    const char *endpoint; /* host:port */
    const char *tls_ca;   /* PEM file of the CA; NULL/"" = plaintext */
    const char *tls_cert; /* PEM file of the client's certificate (mutual TLS), with tls_key;
                             NULL/"" = none shown; only with tls_ca */
    const char *tls_key;
    const char *auth_user; /* NULL/"" = no auth metadata */
    const char *auth_password;
} cli_conn_opts;

/* NULL with a message in err when the channel cannot be made. */
cli_conn *cli_conn_open(const cli_conn_opts *o, char *err, size_t errlen);
void cli_conn_close(cli_conn *c);

/* Called for each response message; non-zero stops the call (it is cancelled). */
typedef int (*cli_msg_fn)(void *arg, const uint8_t *data, size_t len);

/* Calls method ("/pkg.Service/Method") with the request bytes, waiting at most timeout_s.
 * Returns the gRPC status code (0 = OK) with its message in details. */
int cli_call(cli_conn *c, const char *method, const uint8_t *req, size_t len, int timeout_s,
             cli_msg_fn on_msg, void *arg, char *details, size_t dlen);

#endif
