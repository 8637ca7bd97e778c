/*
 * bench_echo_server: the baseline of `./ops/pivirt bench gateway`.
 *
 * A bare server on the same framework as the gateway (gw_server) that answers /pb.CoreRPC/Info
 * by echoing the request message back: no auth, no Redis, no services. The benchmark compares
 * the gateway's Info rate with this one's in the same run, so the ratio measures what the
 * gateway adds on top of the framework, not how noisy the machine is.
 *
 * usage: bench_echo_server --listen HOST:PORT [--threads N]; SIGTERM stops it.
 */
#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_server.h"
#include "pb/core.pb-c.h"
#include "pv_log.h"

static void on_echo(gw_call *call, const ProtobufCMessage *req) {
    gw_call_reply(call, req);
}

int main(int argc, char **argv) {
    const char *listen = "127.0.0.1:0";
    int threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--listen") == 0)
            listen = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[i + 1]);
    }
    pv_log_init("bench-echo", PV_LOG_WARN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    grpc_init();
    const char *addrs[] = {listen};
    gw_server_opts o = {.listen = addrs,
                        .n_listen = 1,
                        .threads = threads,
                        .max_request_bytes = 4 << 20,
                        .shutdown_grace_ms = 1000};
    char err[256];
    gw_server *s = gw_server_new(&o, err, sizeof err);
    if (!s) {
        fprintf(stderr, "bench_echo_server: %s\n", err);
        return 1;
    }
    static const gw_method echo = {.path = "/pb.CoreRPC/Info",
                                   .kind = GW_UNARY,
                                   .request = &pb__empty__descriptor,
                                   .handler = on_echo};
    gw_server_add_method(s, &echo);
    gw_server_start(s);
    printf("listening %s port %d\n", listen, gw_server_bound_port(s, 0));
    fflush(stdout);
    int sig;
    sigwait(&sigs, &sig);
    gw_server_shutdown(s);
    gw_server_free(s);
    grpc_shutdown_blocking();
    return 0;
}
