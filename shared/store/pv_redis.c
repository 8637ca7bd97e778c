/*
 * pv_redis: one synchronous hiredis connection per handle, made on first use and remade after
 * any failure, so that callers never manage connections themselves.
 *
 * Why it looks the way it does:
 * - hiredis 0.14 has no async command timeouts, so each handle is a blocking context with socket
 *   timeouts (SO_RCVTIMEO/SO_SNDTIMEO via redisSetTimeout). A timeout leaves the connection in an
 *   unknown state (the reply may still come), so any I/O error or timeout frees the context; the
 *   next call connects again. Nothing is retried here: only the caller knows whether a command may
 *   run twice.
 * - Before a command is sent on an idle connection, a zero-timeout poll() looks for a hang-up from
 *   the server (restart, CLIENT KILL, idle timeout). Such a connection is replaced before
 *   anything is written, so a Redis restart fails only the commands that were in flight.
 * - Every (re)connect runs the handshake: AUTH, SELECT, and FUNCTION LOAD REPLACE of each
 *   embedded library that Redis does not hold in this very version (a marker function named
 *   after the text's digest tells; see load_libraries). A Redis that restarted empty therefore
 *   has our functions again before the first FCALL reaches it.
 * - Pipelined replies are counted. When the connection drops mid-pipeline the replies still owed
 *   become "lost" and are failed one by one without touching the network, so the caller's read
 *   loop stays in step. A new append or command after that starts afresh (the lost replies are
 *   forgotten), and a command issued while pipelined replies are still unread reads and discards
 *   them first, so an abandoned pipeline never shifts later replies.
 * - hiredis writes with write(2); writing to a socket the server reset raises SIGPIPE, which would
 *   kill the process. SIGPIPE is blocked on the calling thread around hiredis I/O and a SIGPIPE
 *   raised there is consumed, so the library is safe whatever the program's signal setup. The
 *   guard costs four system calls per command, so it is skipped when the process ignores SIGPIPE
 *   (the daemons do, before they talk to Redis): the disposition is looked up when a handle is
 *   made and on every (re)connect, which are rare, and never per command. (A program that
 *   ignores SIGPIPE and later restores it would have to reconnect its handles; none does.)
 */
#include "pv_redis.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

extern const unsigned char pv_redis_functions_lua[];
extern const size_t pv_redis_functions_lua_len;
extern const unsigned char pv_redis_registry_lua[];
extern const size_t pv_redis_registry_lua_len;
extern const unsigned char pv_redis_sched_lua[];
extern const size_t pv_redis_sched_lua_len;
extern const unsigned char pv_redis_workload_lua[];
extern const size_t pv_redis_workload_lua_len;

/* The libraries loaded on every (re)connect. Each changes on its own (operations, the registry,
 * the scheduler's reservations, workloads), so each is a library of its own. */
static const struct {
    const unsigned char *text;
    const size_t *len;
} k_libraries[] = {
    {pv_redis_functions_lua, &pv_redis_functions_lua_len},
    {pv_redis_registry_lua, &pv_redis_registry_lua_len},
    {pv_redis_sched_lua, &pv_redis_sched_lua_len},
    {pv_redis_workload_lua, &pv_redis_workload_lua_len},
};

struct pv_redis {
    char *addr;     /* as given, for messages */
    char *host;     /* NULL for a unix socket */
    int port;       /* 0 for a unix socket */
    char *username; /* NULL: AUTH <password> (the default user); else AUTH <user> <password> */
    char *password; /* NULL when no AUTH */
    int db;
    int connect_timeout_ms;
    int command_timeout_ms;
    int load_functions;
    char **sentinels; /* NULL when Sentinel is not used */
    size_t n_sentinels;
    char *master_name;
    int wait_replicas;
    int wait_timeout_ms;

    int sigpipe_ignored; /* SIGPIPE was SIG_IGN at the last (re)connect: no guard needed */

    redisContext *ctx;    /* NULL while disconnected */
    int io_timeout_ms;    /* the socket timeout set on ctx now, for messages */
    int pending;          /* pipelined replies owed by ctx */
    int lost;             /* pipelined replies owed by a connection that dropped */
    uint64_t connections; /* connections made so far (pv_redis_connections) */
};

/* ---- SIGPIPE guard ---- */

typedef struct io_guard {
    sigset_t old_mask;
    int was_pending; /* a SIGPIPE was already pending before us: not ours to consume */
    int active;      /* 0: the process ignores SIGPIPE, nothing was changed */
} io_guard;

static int sigpipe_is_ignored(void) {
    struct sigaction sa;
    return sigaction(SIGPIPE, NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
           sa.sa_handler == SIG_IGN;
}

static void io_begin(const pv_redis *r, io_guard *g) {
    g->active = !r->sigpipe_ignored;
    if (!g->active) return;
    sigset_t pipe_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &g->old_mask);
}

static void io_end(io_guard *g) {
    if (!g->active) return;
    if (!g->was_pending) {
        sigset_t pipe_set, pending;
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) {
            const struct timespec zero = {0, 0};
            while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
            }
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old_mask, NULL);
}

/* ---- helpers ---- */

static struct timeval ms_to_tv(int ms) {
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static char *dup_or_null(const char *s) {
    return (s == NULL || s[0] == '\0') ? NULL : strdup(s);
}

int pv_redis_parse_addr(const char *a, char *host, size_t hostlen, int *port, pv_status *st) {
    if (a[0] == '/') {
        if (strlen(a) >= hostlen)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "redis addr \"%s\": path too long", a);
        memcpy(host, a, strlen(a) + 1);
        *port = 0;
        return PV_OK;
    }
    const char *colon = strrchr(a, ':');
    if (colon == NULL || colon == a || colon[1] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis addr \"%s\": expected host:port or a unix socket path", a);
    char *end = NULL;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno != 0 || *end != '\0' || p < 1 || p > 65535)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis addr \"%s\": port must be a number from 1 to 65535", a);
    const char *h = a;
    size_t hlen = (size_t)(colon - a);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    if (hlen >= hostlen)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis addr \"%s\": host too long", a);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (int)p;
    return PV_OK;
}

void pv_redis_opts_from_config(const pv_config *c, pv_redis_opts *o) {
    memset(o, 0, sizeof *o);
    o->addr = c->redis.addr;
    o->db = c->redis.db;
    o->username = c->redis.username;
    o->password = c->redis.password;
    o->connect_timeout_ms = c->redis.connect_timeout_ms;
    o->command_timeout_ms = c->redis.command_timeout_ms;
    o->load_functions = 1;
    o->sentinels = (const char *const *)c->redis.sentinels;
    o->n_sentinels = c->redis.n_sentinels;
    o->master_name = c->redis.master_name;
    if (c->redis.durability && strcmp(c->redis.durability, "replicated") == 0) {
        o->wait_replicas = c->redis.wait_replicas;
        o->wait_timeout_ms = c->redis.wait_timeout_ms;
    }
}

/* The handle keeps the host (NULL for a unix socket, whose path is the address itself). */
static int parse_addr(pv_redis *r, pv_status *st) {
    char host[256];
    int rc = pv_redis_parse_addr(r->addr, host, sizeof host, &r->port, st);
    if (rc != PV_OK || r->port == 0) return rc;
    r->host = strdup(host);
    return r->host ? PV_OK : pv_status_set(st, PV_INTERNAL, "redis: out of memory");
}

int pv_redis_sentinel_master(const char *const *sentinels, size_t n, const char *name,
                             int timeout_ms, char *host, size_t hostlen, int *port, pv_status *st) {
    char why[256] = "no sentinel configured";
    for (size_t i = 0; i < n; i++) {
        char shost[256];
        int sport = 0;
        pv_status pst;
        if (pv_redis_parse_addr(sentinels[i], shost, sizeof shost, &sport, &pst) != PV_OK ||
            sport == 0) {
            snprintf(why, sizeof why, "sentinel %s: not host:port", sentinels[i]);
            continue;
        }
        struct timeval tv = ms_to_tv(timeout_ms > 0 ? timeout_ms : 1000);
        redisContext *c = redisConnectWithTimeout(shost, sport, tv);
        if (!c || c->err) {
            snprintf(why, sizeof why, "sentinel %s: %s", sentinels[i], c ? c->errstr : "no memory");
            if (c) redisFree(c);
            continue;
        }
        redisSetTimeout(c, tv);
        redisReply *rep = redisCommand(c, "SENTINEL get-master-addr-by-name %s", name);
        bool ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                  rep->element[0]->type == REDIS_REPLY_STRING &&
                  rep->element[1]->type == REDIS_REPLY_STRING;
        if (ok) {
            snprintf(host, hostlen, "%s", rep->element[0]->str);
            *port = atoi(rep->element[1]->str);
        } else {
            snprintf(why, sizeof why, "sentinel %s: no master named %s (%s)", sentinels[i], name,
                     rep && rep->type == REDIS_REPLY_ERROR ? rep->str : "no address");
        }
        if (rep) freeReplyObject(rep);
        redisFree(c);
        if (ok && *port > 0) return PV_OK;
    }
    return pv_status_set(st, PV_UNAVAILABLE, "redis master %s: %s", name, why);
}

/* With Sentinel: the current master's address becomes the handle's. */
static int resolve_master(pv_redis *r, pv_status *st) {
    char host[256];
    int port = 0;
    if (pv_redis_sentinel_master((const char *const *)r->sentinels, r->n_sentinels, r->master_name,
                                 r->connect_timeout_ms, host, sizeof host, &port, st) != PV_OK)
        return st->code;
    char addr[300];
    snprintf(addr, sizeof addr, "%s:%d", host, port);
    char *h = strdup(host), *a = strdup(addr);
    if (!h || !a) {
        free(h);
        free(a);
        return pv_status_set(st, PV_INTERNAL, "redis: out of memory");
    }
    free(r->host);
    free(r->addr);
    r->host = h;
    r->addr = a;
    r->port = port;
    return PV_OK;
}

/* Frees the context; replies it still owed become lost. */
static void drop(pv_redis *r) {
    if (r->ctx != NULL) redisFree(r->ctx);
    r->ctx = NULL;
    r->lost += r->pending;
    r->pending = 0;
}

/* Status for a failed hiredis call on r->ctx (saved_errno: errno right after the call), then
 * drops the connection, which is unusable once ctx->err is set. */
static int io_failure(pv_redis *r, int saved_errno, pv_status *st) {
    int code = PV_UNAVAILABLE;
    if (r->ctx->err == REDIS_ERR_OOM || r->ctx->err == REDIS_ERR_OTHER) code = PV_INTERNAL;
    if (r->ctx->err == REDIS_ERR_IO && (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK))
        pv_status_set(st, code, "redis %s: no reply within %d ms", r->addr, r->io_timeout_ms);
    else
        pv_status_set(st, code, "redis %s: %s", r->addr, r->ctx->errstr);
    drop(r);
    return code;
}

/* True when the server has hung up on an idle connection. Plain readable data does not count: a
 * subscriber's messages may be waiting. */
static int peer_closed(redisContext *c) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* ---- connecting ---- */

/* Runs one handshake command. An error reply is reported with what was sent; a refused
 * password is UNAUTHENTICATED (the reply never contains the password). */
static int handshake_step(pv_redis *r, const char *what, int argc, const char **argv,
                          const size_t *argvlen, pv_status *st) {
    redisReply *reply = redisCommandArgv(r->ctx, argc, argv, argvlen);
    if (reply == NULL) return io_failure(r, errno, st);
    int code = PV_OK;
    if (reply->type == REDIS_REPLY_ERROR) {
        int auth = strcmp(what, "AUTH") == 0 || strncmp(reply->str, "NOAUTH", 6) == 0 ||
                   strncmp(reply->str, "WRONGPASS", 9) == 0;
        code = auth ? PV_UNAUTHENTICATED : pv_redis_error_status(reply->str, reply->len, NULL);
        pv_status_set(st, code, "redis %s: %s: %s", r->addr, what, reply->str);
    }
    freeReplyObject(reply);
    return code;
}

/* Each library as loaded: its text plus a marker function named after the text's digest
 * (pvlib_<FNV-1a 64 of the text>), so that one FCALL tells whether Redis has this very text. */
#define N_LIBRARIES (sizeof k_libraries / sizeof *k_libraries)
static struct {
    char *text;
    size_t len;
    char marker[32];
} g_loadable[N_LIBRARIES];
static pthread_once_t g_loadable_once = PTHREAD_ONCE_INIT;

static void make_loadable(void) {
    for (size_t i = 0; i < N_LIBRARIES; i++) {
        uint64_t h = 1469598103934665603ULL;
        for (size_t j = 0; j < *k_libraries[i].len; j++)
            h = (h ^ k_libraries[i].text[j]) * 1099511628211ULL;
        snprintf(g_loadable[i].marker, sizeof g_loadable[i].marker, "pvlib_%016" PRIx64, h);
        char *text = NULL;
        int n = asprintf(&text,
                         "%.*s\nredis.register_function{function_name='%s', "
                         "callback=function() return 1 end, flags={'no-writes'}}\n",
                         (int)*k_libraries[i].len, (const char *)k_libraries[i].text,
                         g_loadable[i].marker);
        g_loadable[i].text = n < 0 ? NULL : text;
        g_loadable[i].len = n < 0 ? 0 : (size_t)n;
    }
}

/* Loads the libraries this build carries, unless Redis has them already: a FUNCTION LOAD
 * compiles the whole library (milliseconds of the server's single thread), and every new
 * connection of every process would pay it. One pipelined FCALL per library asks for its
 * marker; only the libraries whose marker is missing (a Redis that restarted empty, another
 * build's text) are loaded. */
static int load_libraries(pv_redis *r, pv_status *st) {
    pthread_once(&g_loadable_once, make_loadable);
    for (size_t i = 0; i < N_LIBRARIES; i++) {
        if (!g_loadable[i].text) return pv_status_set(st, PV_INTERNAL, "out of memory");
        const char *argv[] = {"FCALL", g_loadable[i].marker, "0"};
        if (redisAppendCommandArgv(r->ctx, 3, argv, NULL) != REDIS_OK)
            return io_failure(r, errno, st);
    }
    bool missing[N_LIBRARIES];
    for (size_t i = 0; i < N_LIBRARIES; i++) {
        redisReply *reply = NULL;
        if (redisGetReply(r->ctx, (void **)&reply) != REDIS_OK || !reply)
            return io_failure(r, errno, st);
        missing[i] = reply->type == REDIS_REPLY_ERROR;
        freeReplyObject(reply);
    }
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < N_LIBRARIES; i++) {
        if (!missing[i]) continue;
        const char *argv[] = {"FUNCTION", "LOAD", "REPLACE", g_loadable[i].text};
        const size_t len[] = {8, 4, 7, g_loadable[i].len};
        rc = handshake_step(r, "FUNCTION LOAD", 4, argv, len, st);
    }
    return rc;
}

static int handshake(pv_redis *r, pv_status *st) {
    int rc = PV_OK;
    if (r->password != NULL && r->username != NULL) {
        const char *argv[] = {"AUTH", r->username, r->password};
        rc = handshake_step(r, "AUTH", 3, argv, NULL, st);
    } else if (r->password != NULL) {
        const char *argv[] = {"AUTH", r->password};
        rc = handshake_step(r, "AUTH", 2, argv, NULL, st);
    } else {
        /* Redis refuses arguments over 16 KB from an unauthenticated client with a protocol
         * error, and the function library is larger: a PING first turns a Redis that wants a
         * password into a clear NOAUTH (UNAUTHENTICATED) instead. */
        const char *argv[] = {"PING"};
        rc = handshake_step(r, "PING", 1, argv, NULL, st);
    }
    if (rc == PV_OK && r->db != 0) {
        char db[16];
        snprintf(db, sizeof(db), "%d", r->db);
        const char *argv[] = {"SELECT", db};
        rc = handshake_step(r, "SELECT", 2, argv, NULL, st);
    }
    if (rc == PV_OK && r->n_sentinels > 0) {
        /* right after a failover the sentinels may still name the old master, now a replica */
        redisReply *role = redisCommand(r->ctx, "ROLE");
        if (!role) return io_failure(r, errno, st);
        bool master = role->type == REDIS_REPLY_ARRAY && role->elements > 0 &&
                      role->element[0]->type == REDIS_REPLY_STRING &&
                      strcmp(role->element[0]->str, "master") == 0;
        freeReplyObject(role);
        if (!master)
            rc = pv_status_set(st, PV_UNAVAILABLE,
                               "redis %s: not a master (a failover of %s is under way)", r->addr,
                               r->master_name);
    }
    if (rc == PV_OK && r->load_functions) rc = load_libraries(r, st);
    return rc;
}

static int set_timeout(pv_redis *r, int ms, pv_status *st) {
    if (redisSetTimeout(r->ctx, ms_to_tv(ms)) != REDIS_OK) return io_failure(r, errno, st);
    r->io_timeout_ms = ms;
    return PV_OK;
}

int pv_redis_connect(pv_redis *r, pv_status *st) {
    if (r->ctx != NULL && r->pending == 0 && peer_closed(r->ctx)) drop(r);
    if (r->ctx != NULL) return PV_OK;
    if (r->n_sentinels > 0 && resolve_master(r, st) != PV_OK) return st->code;

    struct timeval tv = ms_to_tv(r->connect_timeout_ms);
    if (r->host == NULL)
        r->ctx = r->connect_timeout_ms > 0 ? redisConnectUnixWithTimeout(r->addr, tv)
                                           : redisConnectUnix(r->addr);
    else
        r->ctx = r->connect_timeout_ms > 0 ? redisConnectWithTimeout(r->host, r->port, tv)
                                           : redisConnect(r->host, r->port);
    if (r->ctx == NULL) return pv_status_set(st, PV_INTERNAL, "redis %s: out of memory", r->addr);
    if (r->ctx->err) {
        pv_status_set(st, PV_UNAVAILABLE, "redis %s: %s", r->addr, r->ctx->errstr);
        drop(r);
        return PV_UNAVAILABLE;
    }

    r->sigpipe_ignored = sigpipe_is_ignored();
    /* The handshake is part of connecting: it is bounded by the connect timeout, so that even a
     * blocking reader (command timeout 0) does not hang on a server that accepts and stalls. */
    io_guard g;
    io_begin(r, &g);
    int rc = set_timeout(r, r->connect_timeout_ms, st);
    if (rc == PV_OK) rc = handshake(r, st);
    if (rc == PV_OK) rc = set_timeout(r, r->command_timeout_ms, st);
    io_end(&g);
    if (rc != PV_OK) drop(r);
    if (rc == PV_OK) r->connections++;
    return rc;
}

uint64_t pv_redis_connections(const pv_redis *r) {
    return r->ctx ? r->connections : 0;
}

/* ---- handle ---- */

int pv_redis_new(const pv_redis_opts *opts, pv_redis **out, pv_status *st) {
    *out = NULL;
    if (opts == NULL || opts->addr == NULL || opts->addr[0] == '\0')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis addr: must not be empty");
    if (opts->connect_timeout_ms < 0 || opts->command_timeout_ms < 0 || opts->db < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis %s: timeouts and db must not be negative (connect %d ms, "
                             "command %d ms, db %d)",
                             opts->addr, opts->connect_timeout_ms, opts->command_timeout_ms,
                             opts->db);
    pv_redis *r = calloc(1, sizeof(*r));
    if (r == NULL) return pv_status_set(st, PV_INTERNAL, "redis: out of memory");
    r->addr = strdup(opts->addr);
    r->password = dup_or_null(opts->password);
    /* A user name without a password cannot log in: ignored, as no AUTH at all. */
    r->username = r->password ? dup_or_null(opts->username) : NULL;
    r->db = opts->db;
    r->connect_timeout_ms = opts->connect_timeout_ms;
    r->command_timeout_ms = opts->command_timeout_ms;
    r->load_functions = opts->load_functions;
    r->wait_replicas = opts->wait_replicas > 0 ? opts->wait_replicas : 0;
    r->wait_timeout_ms = opts->wait_timeout_ms > 0 ? opts->wait_timeout_ms : 1000;
    if (opts->n_sentinels > 0) {
        r->sentinels = calloc(opts->n_sentinels, sizeof *r->sentinels);
        r->master_name = strdup(opts->master_name ? opts->master_name : "");
        for (size_t i = 0; r->sentinels && i < opts->n_sentinels; i++)
            r->sentinels[i] = strdup(opts->sentinels[i]);
        r->n_sentinels = r->sentinels ? opts->n_sentinels : 0;
    }
    r->sigpipe_ignored = sigpipe_is_ignored();
    if (r->addr == NULL || (opts->password != NULL && opts->password[0] && r->password == NULL) ||
        (r->password && opts->username && opts->username[0] && !r->username)) {
        pv_redis_free(r);
        return pv_status_set(st, PV_INTERNAL, "redis: out of memory");
    }
    int rc = parse_addr(r, st);
    if (rc != PV_OK) {
        pv_redis_free(r);
        return rc;
    }
    *out = r;
    return PV_OK;
}

void pv_redis_free(pv_redis *r) {
    if (r == NULL) return;
    if (r->ctx != NULL) redisFree(r->ctx);
    if (r->password != NULL) {
        /* The password should not outlive the handle in freed heap memory. */
        explicit_bzero(r->password, strlen(r->password));
        free(r->password);
    }
    free(r->username);
    for (size_t i = 0; i < r->n_sentinels; i++)
        free(r->sentinels[i]);
    free(r->sentinels);
    free(r->master_name);
    free(r->addr);
    free(r->host);
    free(r);
}

int pv_redis_command_timeout_ms(const pv_redis *r) {
    return r->command_timeout_ms;
}

const char *pv_redis_addr(const pv_redis *r) {
    return r->addr;
}

/* ---- commands ---- */

/* Turns what hiredis returned for one command into the public contract: PV_OK with a non-error
 * reply, or a status with *reply NULL. */
static int finish(pv_redis *r, redisReply *reply, int saved_errno, redisReply **out,
                  pv_status *st) {
    if (out != NULL) *out = NULL;
    if (reply == NULL) return io_failure(r, saved_errno, st);
    if (reply->type == REDIS_REPLY_ERROR) {
        if (strncmp(reply->str, "READONLY", 8) == 0) { /* a master demoted by a failover */
            pv_status_set(st, PV_UNAVAILABLE, "redis %s is a replica now: %s", r->addr, reply->str);
            freeReplyObject(reply);
            drop(r);
            return PV_UNAVAILABLE;
        }
        int code = pv_redis_error_status(reply->str, reply->len, st);
        freeReplyObject(reply);
        return code;
    }
    if (out != NULL)
        *out = reply;
    else
        freeReplyObject(reply);
    return PV_OK;
}

/* Gets r ready for a request/response command: replies of an abandoned pipeline are read and
 * discarded (or forgotten, if their connection is gone), then the connection is made. */
static int prepare_command(pv_redis *r, pv_status *st) {
    r->lost = 0;
    while (r->pending > 0) {
        redisReply *reply = NULL;
        if (pv_redis_get_reply(r, &reply, NULL) == PV_OK) freeReplyObject(reply);
    }
    r->lost = 0;
    return pv_redis_connect(r, st);
}

int pv_redis_command(pv_redis *r, redisReply **reply, pv_status *st, const char *fmt, ...) {
    if (reply != NULL) *reply = NULL;
    int rc = prepare_command(r, st);
    if (rc != PV_OK) return rc;
    va_list ap;
    va_start(ap, fmt);
    io_guard g;
    io_begin(r, &g);
    redisReply *rep = redisvCommand(r->ctx, fmt, ap);
    int saved_errno = errno;
    io_end(&g);
    va_end(ap);
    return finish(r, rep, saved_errno, reply, st);
}

int pv_redis_commandv(pv_redis *r, redisReply **reply, pv_status *st, int argc, const char **argv,
                      const size_t *argvlen) {
    if (reply != NULL) *reply = NULL;
    if (argc < 1 || argv == NULL)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis command: argc must be >= 1, got %d",
                             argc);
    int rc = prepare_command(r, st);
    if (rc != PV_OK) return rc;
    io_guard g;
    io_begin(r, &g);
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, argvlen);
    int saved_errno = errno;
    io_end(&g);
    return finish(r, rep, saved_errno, reply, st);
}

int pv_redis_append(pv_redis *r, int argc, const char **argv, const size_t *argvlen,
                    pv_status *st) {
    if (argc < 1 || argv == NULL)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "redis command: argc must be >= 1, got %d",
                             argc);
    r->lost = 0;
    int rc = pv_redis_connect(r, st);
    if (rc != PV_OK) return rc;
    /* Only buffers: the commands are written by the first pv_redis_get_reply. */
    if (redisAppendCommandArgv(r->ctx, argc, argv, argvlen) != REDIS_OK)
        return io_failure(r, errno, st);
    r->pending++;
    return PV_OK;
}

int pv_redis_get_reply(pv_redis *r, redisReply **reply, pv_status *st) {
    if (reply != NULL) *reply = NULL;
    if (r->lost > 0) {
        r->lost--;
        return pv_status_set(st, PV_UNAVAILABLE, "redis %s: connection lost before this reply",
                             r->addr);
    }
    if (r->ctx == NULL)
        return pv_status_set(st, PV_UNAVAILABLE, "redis %s: not connected", r->addr);
    /* With nothing pending this still reads: a subscriber waits for pushed messages this way. */
    if (r->pending > 0) r->pending--;
    void *rep = NULL;
    io_guard g;
    io_begin(r, &g);
    int ok = redisGetReply(r->ctx, &rep);
    int saved_errno = errno;
    io_end(&g);
    if (ok != REDIS_OK && rep != NULL) {
        freeReplyObject(rep);
        rep = NULL;
    }
    return finish(r, rep, saved_errno, reply, st);
}

int pv_redis_fcall(pv_redis *r, const char *fn, int nkeys, const char **keys, int nargs,
                   const char **args, redisReply **reply, pv_status *st) {
    if (reply != NULL) *reply = NULL;
    if (fn == NULL || nkeys < 0 || nargs < 0 || nkeys > INT_MAX / 2 - 3 || nargs > INT_MAX / 2)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "redis FCALL %s: nkeys %d or nargs %d out of range",
                             fn ? fn : "(null)", nkeys, nargs);
    int argc = 3 + nkeys + nargs;
    const char **argv = calloc((size_t)argc, sizeof(*argv));
    if (argv == NULL) return pv_status_set(st, PV_INTERNAL, "redis FCALL %s: out of memory", fn);
    char nk[16];
    snprintf(nk, sizeof(nk), "%d", nkeys);
    argv[0] = "FCALL";
    argv[1] = fn;
    argv[2] = nk;
    for (int i = 0; i < nkeys; i++)
        argv[3 + i] = keys[i];
    for (int i = 0; i < nargs; i++)
        argv[3 + nkeys + i] = args[i];
    int rc = pv_redis_commandv(r, reply, st, argc, argv, NULL);
    free(argv);
    return rc;
}

/* ---- error replies ---- */

int pv_redis_confirm_durable(pv_redis *r, pv_status *st) {
    if (r->wait_replicas <= 0) return PV_OK;
    redisReply *rep = NULL;
    int rc = pv_redis_command(r, &rep, st, "WAIT %d %d", r->wait_replicas, r->wait_timeout_ms);
    if (rc != PV_OK) return rc;
    long long acked = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    freeReplyObject(rep);
    if (acked >= r->wait_replicas) return PV_OK;
    return pv_status_set(st, PV_UNAVAILABLE,
                         "redis %s: the write reached %lld of %d replica(s) within %d ms "
                         "(redis.durability replicated); retry with the same request id",
                         r->addr, acked < 0 ? 0 : acked, r->wait_replicas, r->wait_timeout_ms);
}

int pv_redis_error_status(const char *err, size_t len, pv_status *st) {
    if (err == NULL) {
        err = "";
        len = 0;
    }
    const char *space = memchr(err, ' ', len);
    int code;
    /* Only an upper-case word can be a code name, and OK is not an error. */
    if (space != NULL && space > err && pv_code_parse(err, (size_t)(space - err), &code) == 0 &&
        code != PV_OK) {
        const char *msg = space + 1;
        return pv_status_set(st, code, "%.*s", (int)(len - (size_t)(msg - err)), msg);
    }
    /* An ACL refusal (NOPERM: the user may not run the command or touch the key): a
     * configuration problem to name plainly, never retried. */
    if (len >= 6 && memcmp(err, "NOPERM", 6) == 0)
        return pv_status_set(st, PV_PERMISSION_DENIED, "redis: %.*s", (int)len, err);
    /* Redis's own "not now" answers: a restarting server replaying its AOF (LOADING), a script
     * running too long (BUSY), a replica or a primary without its replicas (READONLY,
     * MASTERDOWN, NOREPLICAS), a cluster in flux (TRYAGAIN, CLUSTERDOWN). The command may work a
     * moment later: UNAVAILABLE, so callers retry instead of failing for good. */
    static const char *const transient[] = {"LOADING",    "BUSY ",    "READONLY",   "MASTERDOWN",
                                            "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN"};
    for (size_t i = 0; i < sizeof transient / sizeof transient[0]; i++) {
        size_t n = strlen(transient[i]);
        if (len >= n && memcmp(err, transient[i], n) == 0)
            return pv_status_set(st, PV_UNAVAILABLE, "redis: %.*s", (int)len, err);
    }
    return pv_status_set(st, PV_INTERNAL, "redis: %.*s", (int)len, err);
}
