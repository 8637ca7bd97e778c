/*
 * pv_redis: one synchronous Redis connection with timeouts, reconnection and the project's
 * Redis function library.
 *
 * hiredis 0.14 (Debian) has no async command timeouts, so every pivirt thread that talks to
 * Redis owns one pv_redis (a handle is used by one thread at a time; it has no lock). The
 * connection is made on first use and remade after any I/O error, so a Redis restart costs the
 * commands in flight at that moment (PV_UNAVAILABLE, fast) and nothing after. On every (re)connect
 * the handle authenticates, selects the db and loads the function library (FUNCTION LOAD
 * REPLACE of shared/store/redis/functions.lua, embedded at build time), so FCALL always finds the
 * functions of this build, even on a Redis that restarted empty.
 *
 * Errors: a dropped or refused connection or a timeout is PV_UNAVAILABLE naming the address.
 * A Redis error reply whose text starts with a status code name ("NOT_FOUND no cluster x",
 * "ABORTED op-... holds node-1") maps to that code with the rest as message: that is how the Lua
 * functions report domain errors. Any other error reply is PV_INTERNAL with Redis's text.
 *
 * Ownership: replies handed out are the caller's (freeReplyObject). The handle copies its options.
 */
#ifndef PV_REDIS_H
#define PV_REDIS_H

#include <hiredis/hiredis.h>
#include <stddef.h>

#include "pv_config.h"
#include "pv_status.h"

typedef struct pv_redis_opts {
    const char *addr; /* "host:port" or a unix socket path (starts with '/') */
    int db;
    const char *username; /* NULL or "" = AUTH with the password alone (the default user) */
    const char *password; /* NULL or "" = no AUTH */
    int connect_timeout_ms;
    int command_timeout_ms; /* 0 = block forever (only for dedicated blocking readers) */
    int load_functions;     /* non-zero: FUNCTION LOAD REPLACE on every connect */
    /* Redis Sentinel: when n_sentinels > 0, addr is only a fallback for messages; every
     * (re)connect asks the sentinels (host:port, in order) for master_name's address and checks
     * the server it reaches is a master, so a failover costs the commands in flight at that
     * moment. A READONLY reply (the old master, now a replica) drops the connection too. */
    const char *const *sentinels;
    size_t n_sentinels;
    const char *master_name;
    /* Durability of acknowledged writes: with wait_replicas > 0, pv_redis_confirm_durable waits
     * (WAIT) until that many replicas hold this connection's writes, at most wait_timeout_ms.
     * Redis replicates asynchronously; without this a failover loses what the master had not
     * yet sent on, even after a client was told it was accepted. */
    int wait_replicas;
    int wait_timeout_ms;
} pv_redis_opts;

typedef struct pv_redis pv_redis;

/* The options every pivirt connection uses, from the configuration (functions loaded). The
 * strings stay owned by c. */
void pv_redis_opts_from_config(const pv_config *c, pv_redis_opts *o);

/* Splits an address: "host:port" ("[v6]:port" loses its brackets) or a unix socket path (then
 * host = the path and *port = 0). PV_INVALID_ARGUMENT naming the address otherwise. */
int pv_redis_parse_addr(const char *addr, char *host, size_t hostlen, int *port, pv_status *st);

/* Asks the sentinels, in order, for the address of master `name` (SENTINEL
 * get-master-addr-by-name) into host and *port; each within timeout_ms. PV_UNAVAILABLE naming
 * the sentinels when none answers with an address. */
int pv_redis_sentinel_master(const char *const *sentinels, size_t n, const char *name,
                             int timeout_ms, char *host, size_t hostlen, int *port, pv_status *st);

/* Allocates a handle; does not connect (the first command does). Returns PV_OK or PV_INTERNAL. */
int pv_redis_new(const pv_redis_opts *opts, pv_redis **out, pv_status *st);
void pv_redis_free(pv_redis *r);

/* Connects now if not connected (useful at start-up to fail early). */
int pv_redis_connect(pv_redis *r, pv_status *st);

/* How many connections this handle has made, 0 while it has none: what a connection-scoped
 * value (its CLIENT ID) was read on, so that it is read again only on a new one. */
uint64_t pv_redis_connections(const pv_redis *r);

/* The address this handle talks to (for messages). */
const char *pv_redis_addr(const pv_redis *r);

/* The command timeout it was made with (0 = none): blocking commands must wait less than it. */
int pv_redis_command_timeout_ms(const pv_redis *r);

/* Runs one command. On PV_OK *reply (if reply is not NULL) is the reply, never an error reply;
 * on failure *reply is NULL. Nothing is retried: the caller decides whether a command may be
 * sent twice. */
int pv_redis_command(pv_redis *r, redisReply **reply, pv_status *st, const char *fmt, ...);
int pv_redis_commandv(pv_redis *r, redisReply **reply, pv_status *st, int argc, const char **argv,
                      const size_t *argvlen);

/* Pipelining: append n commands, then read n replies in order. An I/O error while reading drops
 * the connection and fails the remaining reads with PV_UNAVAILABLE. */
int pv_redis_append(pv_redis *r, int argc, const char **argv, const size_t *argvlen, pv_status *st);
int pv_redis_get_reply(pv_redis *r, redisReply **reply, pv_status *st);

/* FCALL fn with keys then args (NUL-terminated strings). */
int pv_redis_fcall(pv_redis *r, const char *fn, int nkeys, const char **keys, int nargs,
                   const char **args, redisReply **reply, pv_status *st);

/* Makes this connection's writes so far durable as configured (redis.durability): a no-op for
 * "async"; for "replicated", WAIT for wait_replicas replicas. PV_UNAVAILABLE saying how many
 * replicas confirmed when fewer did within the timeout: the write happened on the master but
 * may not survive a failover, so the caller must not report it accepted (a retry with the same
 * request id finds it). */
int pv_redis_confirm_durable(pv_redis *r, pv_status *st);

/* Maps an error reply's text to a code and message as described above (exposed for tests and
 * for callers that read pipelined replies themselves). Returns the code. */
int pv_redis_error_status(const char *err, size_t len, pv_status *st);

#endif
