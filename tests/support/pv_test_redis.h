/*
 * pv_test_redis: a real, private redis-server for one integration test.
 *
 * Each handle runs its own redis-server (the binary in $PV_REDIS_SERVER, else "redis-server" on
 * the PATH) in a fresh directory under /tmp, listening on 127.0.0.1 at a free port and on a unix
 * socket in that directory, with durable AOF (appendonly yes, appendfsync always, no RDB saves)
 * and DEBUG allowed from local connections. The server's log is <dir>/redis.log, its own
 * stdout/stderr go to <dir>/redis.out; both are copied to stderr when it fails to start.
 *
 * The server dies with the test: the child sets PR_SET_PDEATHSIG to SIGKILL, so a crashed or
 * killed test leaves no server behind. PR_SET_PDEATHSIG fires when the *thread* that started the
 * server exits, so start servers from the main thread (or one that outlives them).
 *
 * Typical use:
 *
 *   pv_test_redis *srv;
 *   assert_int_equal(pv_test_redis_start(&srv, NULL), 0);
 *   ... connect to pv_test_redis_addr(srv) ...
 *   pv_test_redis_kill9(srv);     // crash
 *   pv_test_redis_restart(srv);   // same port, same dir: the AOF brings the data back
 *   pv_test_redis_free(srv);      // stops it and removes the directory
 *
 * Failures return -1 after printing the reason on stderr (the test asserts 0).
 * Ownership: pv_test_redis_start allocates the handle; pv_test_redis_free releases it. Strings
 * returned by the accessors live as long as the handle.
 */
#ifndef PV_TEST_REDIS_H
#define PV_TEST_REDIS_H

#include <hiredis/hiredis.h>
#include <sys/types.h>

#include "pv_redis.h"

typedef struct pv_test_redis pv_test_redis;

/* Starts a server and waits (at most 10 s) until it answers PING. extra_args (NULL or "") are
 * more redis-server options, split on spaces; a token in double quotes may hold spaces or be
 * empty: "--requirepass s3cret --maxmemory-policy noeviction --save \"\"". A port taken by
 * someone else between choosing and binding it is retried with another port. */
int pv_test_redis_start(pv_test_redis **out, const char *extra_args);

int pv_test_redis_port(const pv_test_redis *t);
const char *pv_test_redis_addr(const pv_test_redis *t);   /* "127.0.0.1:PORT" */
const char *pv_test_redis_socket(const pv_test_redis *t); /* unix socket path */
const char *pv_test_redis_dir(const pv_test_redis *t);    /* data directory */
pid_t pv_test_redis_pid(const pv_test_redis *t);          /* 0 when not running */

/* A plain hiredis connection over TCP, independent of the code under test (NULL if the server
 * does not answer within 1 s). The caller frees it with redisFree. No AUTH is sent. */
redisContext *pv_test_redis_connect(const pv_test_redis *t);

/* A pv_redis handle on the server as every pivirt program makes one (the project's functions
 * loaded on connect; connect timeout 1 s), with the given command timeout. NULL after printing
 * why when it cannot be made. The caller frees it with pv_redis_free. */
pv_redis *pv_test_redis_client(const pv_test_redis *t, int command_timeout_ms);

/* Graceful stop: SIGTERM (and SIGCONT, in case a test paused it), then waits for the exit;
 * SIGKILL if it has not exited after 10 s. Returns 0 (also when it was not running). */
int pv_test_redis_stop(pv_test_redis *t);

/* Crash: SIGKILL and wait. Returns 0 (also when it was not running). */
int pv_test_redis_kill9(pv_test_redis *t);

/* Starts the server again on the same port and directory with the same options (stops it
 * first if it runs) and waits until it answers PING. */
int pv_test_redis_restart(pv_test_redis *t);

/* Stops the server if it runs, removes the directory, frees the handle. NULL is allowed. */
void pv_test_redis_free(pv_test_redis *t);

#endif
