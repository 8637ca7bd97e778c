/*
 * pv_test_redis: starts, crashes, restarts and cleans up a private redis-server for integration
 * tests, so that every test runs against the real thing and never against a shared instance.
 *
 * Choices that matter:
 * - The port is found by binding port 0 and closing the socket. Another process may take it
 *   before redis-server binds it, so a server that exits during start-up is retried on a new
 *   port (a restart keeps its port: that is the point of a restart).
 * - Readiness is a PING over the unix socket in our own directory: only our server can answer
 *   there, whereas a TCP PING could be answered by a stranger that owns the port. Redis binds
 *   TCP before the unix socket and answers LOADING until the AOF is read, so a PONG there means
 *   the whole server is up with its data.
 * - Everything the child needs is prepared before fork(); the child only makes async-signal-safe
 *   calls (the test may have threads) before exec.
 */
#include "pv_test_redis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READY_TIMEOUT_MS 10000
#define STOP_TIMEOUT_MS 10000
#define START_ATTEMPTS 5
#define MAX_EXTRA_ARGS 64

struct pv_test_redis {
    pid_t pid; /* 0 when not running */
    int port;
    char addr[32];
    char dir[64];
    char sock[PATH_MAX];
    char log[PATH_MAX];
    char out[PATH_MAX];
    char *extra_buf;                 /* extra_args, split in place */
    char *extra[MAX_EXTRA_ARGS + 1]; /* NULL-terminated tokens pointing into extra_buf */
};

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Splits extra_args into t->extra: tokens separated by spaces, "..." keeps spaces and allows an
 * empty token. */
static int split_args(pv_test_redis *t, const char *extra_args) {
    if (extra_args == NULL) return 0;
    t->extra_buf = strdup(extra_args);
    if (t->extra_buf == NULL) return -1;
    char *p = t->extra_buf;
    int n = 0;
    for (;;) {
        while (*p == ' ')
            p++;
        if (*p == '\0') break;
        if (n == MAX_EXTRA_ARGS) {
            fprintf(stderr, "pv_test_redis: more than %d extra args\n", MAX_EXTRA_ARGS);
            return -1;
        }
        char *end;
        if (*p == '"') {
            end = strchr(p + 1, '"');
            if (end == NULL) {
                fprintf(stderr, "pv_test_redis: unbalanced quote in extra args: %s\n", extra_args);
                return -1;
            }
            t->extra[n++] = p + 1;
        } else {
            end = p + strcspn(p, " ");
            t->extra[n++] = p;
        }
        if (*end == '\0') break;
        *end = '\0';
        p = end + 1;
    }
    t->extra[n] = NULL;
    return 0;
}

/* A port nobody is bound to right now (the kernel's pick for port 0). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* Copies the last few KB of a file to stderr: the reason a server did not come up. */
static void dump_tail(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
    fseek(f, size > 4096 ? size - 4096 : 0, SEEK_SET);
    fprintf(stderr, "---- %s ----\n", path);
    char buf[1024];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end ----\n");
    fclose(f);
}

/* Reaps the child if it has exited; returns 1 when it is gone. */
static int reap_if_exited(pv_test_redis *t) {
    if (t->pid == 0) return 1;
    int status;
    pid_t r;
    while ((r = waitpid(t->pid, &status, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r == t->pid || (r < 0 && errno == ECHILD)) {
        t->pid = 0;
        return 1;
    }
    return 0;
}

static int spawn(pv_test_redis *t) {
    const char *server = getenv("PV_REDIS_SERVER");
    if (server == NULL || server[0] == '\0') server = "redis-server";
    char port[16];
    snprintf(port, sizeof(port), "%d", t->port);
    snprintf(t->addr, sizeof(t->addr), "127.0.0.1:%d", t->port);

    const char *argv[40 + MAX_EXTRA_ARGS] = {
        server,      "--bind",
        "127.0.0.1", "--port",
        port,        "--unixsocket",
        t->sock,     "--unixsocketperm",
        "700",       "--dir",
        t->dir,      "--logfile",
        t->log,      "--daemonize",
        "no",        "--save",
        "",          "--appendonly",
        "yes",       "--appendfsync",
        "always",    "--enable-debug-command",
        "local",
    };
    int argc = 0;
    while (argv[argc] != NULL)
        argc++;
    for (int i = 0; t->extra[i] != NULL; i++)
        argv[argc++] = t->extra[i];
    argv[argc] = NULL;

    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pv_test_redis: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        /* Die with the test, even if it is killed before it can clean up. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int fd = open(t->out, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        if (strchr(server, '/') != NULL)
            execv(server, (char *const *)argv);
        else
            execvp(server, (char *const *)argv);
        static const char msg[] = "pv_test_redis: exec of redis-server failed\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(127);
    }
    t->pid = pid;
    return 0;
}

enum { READY = 0, EXITED = 1, TIMED_OUT = 2 };

/* One PING over our unix socket: 1 when the server answers with anything but LOADING. */
static int ping_once(const pv_test_redis *t) {
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectUnixWithTimeout(t->sock, tv);
    int ok = 0;
    if (c != NULL && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        redisReply *r = redisCommand(c, "PING");
        /* An error such as NOAUTH (requirepass) still proves the server is serving. */
        ok = r != NULL && !(r->type == REDIS_REPLY_ERROR && strncmp(r->str, "LOADING", 7) == 0);
        if (r != NULL) freeReplyObject(r);
    }
    if (c != NULL) redisFree(c);
    return ok;
}

static int wait_ready(pv_test_redis *t) {
    long long deadline = now_ms() + READY_TIMEOUT_MS;
    while (now_ms() < deadline) {
        if (reap_if_exited(t)) return EXITED;
        if (ping_once(t)) return READY;
        sleep_ms(10);
    }
    return TIMED_OUT;
}

static void report_failure(const pv_test_redis *t, const char *what) {
    fprintf(stderr, "pv_test_redis: %s (port %d, dir %s)\n", what, t->port, t->dir);
    dump_tail(t->out);
    dump_tail(t->log);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0) fprintf(stderr, "pv_test_redis: remove %s: %s\n", path, strerror(errno));
    return 0;
}

int pv_test_redis_start(pv_test_redis **out, const char *extra_args) {
    *out = NULL;
    pv_test_redis *t = calloc(1, sizeof(*t));
    if (t == NULL) return -1;
    /* mkdtemp's template: the prefix then six 'X' that it replaces. */
    int n = snprintf(t->dir, sizeof(t->dir), "/tmp/pv-redis-");
    memset(t->dir + n, 'X', 6);
    t->dir[n + 6] = '\0';
    if (mkdtemp(t->dir) == NULL) {
        fprintf(stderr, "pv_test_redis: mkdtemp: %s\n", strerror(errno));
        free(t);
        return -1;
    }
    snprintf(t->sock, sizeof(t->sock), "%s/redis.sock", t->dir);
    snprintf(t->log, sizeof(t->log), "%s/redis.log", t->dir);
    snprintf(t->out, sizeof(t->out), "%s/redis.out", t->dir);
    if (split_args(t, extra_args) != 0) {
        pv_test_redis_free(t);
        return -1;
    }

    for (int attempt = 1; attempt <= START_ATTEMPTS; attempt++) {
        t->port = free_port();
        if (t->port < 0 || spawn(t) != 0) break;
        int r = wait_ready(t);
        if (r == READY) {
            *out = t;
            return 0;
        }
        if (r == TIMED_OUT) {
            report_failure(t, "no answer to PING within 10 s");
            break;
        }
        if (attempt == START_ATTEMPTS) report_failure(t, "redis-server exited during start-up");
        /* Most likely the port was taken meanwhile: try another one. */
    }
    pv_test_redis_free(t);
    return -1;
}

int pv_test_redis_port(const pv_test_redis *t) {
    return t->port;
}

const char *pv_test_redis_addr(const pv_test_redis *t) {
    return t->addr;
}

const char *pv_test_redis_socket(const pv_test_redis *t) {
    return t->sock;
}

const char *pv_test_redis_dir(const pv_test_redis *t) {
    return t->dir;
}

pid_t pv_test_redis_pid(const pv_test_redis *t) {
    return t->pid;
}

pv_redis *pv_test_redis_client(const pv_test_redis *t, int command_timeout_ms) {
    pv_redis_opts o = {.addr = pv_test_redis_addr(t),
                       .connect_timeout_ms = 1000,
                       .command_timeout_ms = command_timeout_ms,
                       .load_functions = 1};
    pv_redis *r = NULL;
    pv_status st;
    if (pv_redis_new(&o, &r, &st) != PV_OK) {
        fprintf(stderr, "pv_test_redis_client: %s\n", st.msg);
        return NULL;
    }
    return r;
}

redisContext *pv_test_redis_connect(const pv_test_redis *t) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", t->port, tv);
    if (c == NULL) return NULL;
    if (c->err || redisSetTimeout(c, tv) != REDIS_OK) {
        fprintf(stderr, "pv_test_redis: connect %s: %s\n", t->addr, c->errstr);
        redisFree(c);
        return NULL;
    }
    return c;
}

int pv_test_redis_stop(pv_test_redis *t) {
    if (reap_if_exited(t)) return 0;
    kill(t->pid, SIGTERM);
    kill(t->pid, SIGCONT); /* a paused server would never handle SIGTERM */
    long long deadline = now_ms() + STOP_TIMEOUT_MS;
    while (now_ms() < deadline) {
        if (reap_if_exited(t)) return 0;
        sleep_ms(5);
    }
    fprintf(stderr, "pv_test_redis: pid %d ignored SIGTERM for 10 s, killing it\n", (int)t->pid);
    return pv_test_redis_kill9(t);
}

int pv_test_redis_kill9(pv_test_redis *t) {
    if (reap_if_exited(t)) return 0;
    kill(t->pid, SIGKILL);
    int status;
    while (waitpid(t->pid, &status, 0) < 0 && errno == EINTR) {
    }
    t->pid = 0;
    return 0;
}

int pv_test_redis_restart(pv_test_redis *t) {
    pv_test_redis_stop(t);
    if (spawn(t) != 0) return -1;
    int r = wait_ready(t);
    if (r == READY) return 0;
    report_failure(t, r == EXITED ? "redis-server exited during restart"
                                  : "no answer to PING within 10 s after restart");
    pv_test_redis_kill9(t);
    return -1;
}

void pv_test_redis_free(pv_test_redis *t) {
    if (t == NULL) return;
    pv_test_redis_kill9(t); /* the data is thrown away: no need to stop gracefully */
    nftw(t->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(t->extra_buf);
    free(t);
}
