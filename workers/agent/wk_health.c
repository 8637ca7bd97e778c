/*
 * wk_health: the agent's status reporter (see wk_health.h).
 *
 * What the last pass wrote for each workload is kept in memory as a signature (running, healthy,
 * networks): the next pass writes only when the signature changed, and otherwise renews the
 * status key's TTL with a pipelined EXPIRE. An EXPIRE that finds no key (the status expired,
 * or a client deleted it) forgets the signature, so the following pass writes it again. A
 * restarted agent knows no signature and writes every status once.
 */
#include "wk_health.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pv_buf.h"
#include "pv_time.h"
#include "pv_keys.h"
#include "pv_log.h"
#include "pv_workload.h"
#include "wk_fence.h"

#define CHECK_TIMEOUT_MS 1000
/* A change reported before its workload's record exists is asked again every RETRY_MS for at
 * most UNKNOWN_RETRY_MS. */
#define RETRY_MS 200
#define UNKNOWN_RETRY_MS 30000

struct wk_health {
    const pv_config *cfg; /* borrowed: the process's configuration outlives the agent */
    wk_engine *engine;
    wk_fence *fence; /* borrowed, may be NULL: reports are fenced writes when set */
    pv_keys keys;
    int interval_seconds;
    json_t *written; /* id -> signature of the status last written */
    /* what the engine said changed since the last pass (wk_engine_set_watch): ids, or all */
    json_t *pending;
    bool pending_all;
    json_t *unknown; /* id -> when a change of it found no record yet (monotonic ms) */
    char *inventory; /* the ids last put as the node's inventory, joined */
    pthread_t thread;
    bool started, stopping;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* ---- the checks ---- */

/* A connected TCP socket to host:port within the deadline, or -1 (why says so). */
static int dial(const char *host, const char *port, int64_t deadline, char *why, size_t cap) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(why, cap, "%s:%s: %s", host, port, gai_strerror(gai));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    if (fd < 0) {
        snprintf(why, cap, "socket: %s", strerror(errno));
        return -1;
    }
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int left = (int)(deadline - pv_time_mono_ms());
        int err = 0;
        socklen_t len = sizeof err;
        if (left <= 0 || poll(&p, 1, left) != 1)
            err = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        rc = err ? -1 : 0;
        errno = err;
    }
    if (rc != 0) {
        snprintf(why, cap, "tcp %s:%s: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* GET url on host:port; the answer's status code, or -1. */
static int http_status(const char *host, const char *port, const char *url, char *why, size_t cap) {
    int64_t deadline = pv_time_mono_ms() + CHECK_TIMEOUT_MS;
    int fd = dial(host, port, deadline, why, cap);
    if (fd < 0) return -1;
    char req[2048];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.0\r\nHost: %s:%s\r\nUser-Agent: pivirt-agent\r\n\r\n",
                     url && *url ? url : "/", host, port);
    if (n < 0 || (size_t)n >= sizeof req || send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        snprintf(why, cap, "http %s:%s: could not send the request", host, port);
        close(fd);
        return -1;
    }
    char head[64];
    size_t got = 0;
    while (got < sizeof head - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left = (int)(deadline - pv_time_mono_ms());
        if (left <= 0 || poll(&p, 1, left) != 1) break;
        ssize_t r = recv(fd, head + got, sizeof head - 1 - got, 0);
        if (r <= 0) break;
        got += (size_t)r;
        if (memchr(head, '\n', got)) break;
    }
    close(fd);
    head[got] = '\0';
    int code = -1;
    if (strncmp(head, "HTTP/", 5) != 0 || sscanf(head, "HTTP/%*s %d", &code) != 1) {
        snprintf(why, cap, "http %s:%s%s: no HTTP answer within %d ms", host, port,
                 url && *url ? url : "/", CHECK_TIMEOUT_MS);
        return -1;
    }
    return code;
}

/* The address to check: the first address of the workload's networks, else loopback. */
static void check_host(const char *networks_json, char *out, size_t cap) {
    snprintf(out, cap, "127.0.0.1");
    json_t *nets = json_loads(networks_json ? networks_json : "{}", 0, NULL);
    const char *name;
    json_t *v;
    json_object_foreach(nets, name, v) {
        const char *ip = json_string_value(v); /* process: {"host": "10.0.0.5"} */
        if (!ip) ip = json_string_value(json_array_get(json_object_get(v, "addresses"), 0));
        if (ip && *ip) {
            snprintf(out, cap, "%s", ip);
            break;
        }
    }
    json_decref(nets);
}

static json_t *healthcheck_of(const char *labels_json) {
    json_t *labels = json_loads(labels_json ? labels_json : "{}", 0, NULL);
    const char *meta_text = json_string_value(json_object_get(labels, "ERU_META"));
    json_t *meta = meta_text ? json_loads(meta_text, 0, NULL) : NULL;
    json_t *hc = json_object_get(meta, "healthcheck");
    if (hc) json_incref(hc);
    json_decref(meta);
    json_decref(labels);
    return json_is_object(hc) ? hc : (json_decref(hc), NULL);
}

static bool has_healthcheck(const char *labels_json) {
    json_t *hc = healthcheck_of(labels_json);
    bool has = hc != NULL;
    json_decref(hc);
    return has;
}

bool wk_health_check(const char *labels_json, const char *networks_json, char *why, size_t cap) {
    char scratch[256];
    if (!why) {
        why = scratch;
        cap = sizeof scratch;
    }
    *why = '\0';
    json_t *hc = healthcheck_of(labels_json);
    if (!hc) return true;
    char host[INET6_ADDRSTRLEN + 1];
    check_host(networks_json, host, sizeof host);
    bool ok = true;
    size_t i;
    json_t *port;
    json_array_foreach(json_object_get(hc, "tcp_ports"), i, port) {
        if (!ok || !json_is_string(port)) continue;
        int fd =
            dial(host, json_string_value(port), pv_time_mono_ms() + CHECK_TIMEOUT_MS, why, cap);
        if (fd < 0)
            ok = false;
        else
            close(fd);
    }
    const char *hport = json_string_value(json_object_get(hc, "http_port"));
    if (ok && hport && *hport) {
        const char *url = json_string_value(json_object_get(hc, "url"));
        int want = (int)json_integer_value(json_object_get(hc, "code"));
        int code = http_status(host, hport, url, why, cap);
        if (code < 0) {
            ok = false;
        } else if (want ? code != want : code >= 500) {
            snprintf(why, cap, "http %s:%s%s answered %d, not %s%d", host, hport,
                     url && *url ? url : "/", code, want ? "" : "below ", want ? want : 500);
            ok = false;
        }
    }
    json_decref(hc);
    return ok;
}

/* ---- the pass ---- */

/* Eru's status networks: name -> address (virt interfaces give their first address). */
static char *status_networks(const char *networks_json) {
    json_t *nets = json_loads(networks_json ? networks_json : "{}", 0, NULL);
    json_t *out = json_object();
    const char *name;
    json_t *v;
    json_object_foreach(nets, name, v) {
        const char *ip = json_string_value(v);
        if (!ip) ip = json_string_value(json_array_get(json_object_get(v, "addresses"), 0));
        json_object_set_new(out, name, json_string(ip ? ip : ""));
    }
    char *text = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(out);
    json_decref(nets);
    return text;
}

/* Renews the TTL of the statuses in ids (pipelined); forgets those whose key is gone. */
static int renew(wk_health *h, pv_redis *r, json_t *ids, int ttl, size_t *renewed, pv_status *st) {
    size_t n = json_array_size(ids);
    char secs[24];
    snprintf(secs, sizeof secs, "%d", ttl);
    for (size_t i = 0; i < n; i++) {
        char key[PV_KEY_MAX];
        if (pv_workload_status_key(&h->keys, json_string_value(json_array_get(ids, i)), key,
                                   sizeof key, st) != PV_OK)
            return st->code;
        const char *argv[] = {"EXPIRE", key, secs};
        if (pv_redis_append(r, 3, argv, NULL, st) != PV_OK) return st->code;
    }
    int rc = PV_OK;
    for (size_t i = 0; i < n; i++) {
        redisReply *rep = NULL;
        if (pv_redis_get_reply(r, &rep, st) != PV_OK) {
            rc = st->code;
            continue; /* the lost replies fail one by one: keep the loop in step */
        }
        if (rep->type == REDIS_REPLY_INTEGER && rep->integer == 1) {
            if (renewed) (*renewed)++;
        } else {
            json_object_del(h->written, json_string_value(json_array_get(ids, i)));
        }
        freeReplyObject(rep);
    }
    return rc;
}

/* Whether w is still in the state it was listed in: checks take time (up to a second each),
 * and a status written from a stale state would undo what a control call just reported. */
static bool still(wk_health *h, const wk_engine_info *w) {
    wk_engine_info now = {0};
    pv_status st;
    bool same = wk_engine_inspect(h->engine, w->id, &now, &st) == PV_OK && now.state == w->state &&
                now.pid == w->pid;
    wk_engine_info_clear(&now);
    return same;
}

/* Removes this node's instance of id at epoch when the registry says it was replaced (recreated
 * on another node, or at a later incarnation); true when it did. */
static bool drop_if_replaced(wk_health *h, pv_redis *r, const char *id, int64_t epoch,
                             const char *node) {
    pv_incarnation v;
    pv_status st;
    if (pv_workload_ha_check(r, &h->keys, id, node, epoch, &v, NULL, &st) != PV_OK ||
        v != PV_INC_MOVED)
        return false;
    wk_engine_stop(h->engine, id, 0, true, &st);
    int rc = wk_engine_remove(h->engine, id, true, &st);
    if (h->fence) wk_fence_log(h->fence, "removed", id, epoch, "replaced elsewhere");
    if (rc == PV_OK || rc == PV_NOT_FOUND)
        pv_info("event=workload_replaced id=%s epoch=%lld node=%s: recreated elsewhere while "
                "this node was away; its old instance is removed",
                id, (long long)epoch, node);
    else
        pv_warn("workload %s: old instance not removed: %s", id, st.msg);
    json_object_del(h->written, id);
    return true;
}

/* After a fence is lifted: each stopped workload is this node's again (started), replaced
 * (removed), or still being placed by a failover (asked again next pass). */
static void settle_fenced(wk_health *h, pv_redis *r, const char *node) {
    json_t *ids = wk_fence_lifted(h->fence);
    const char *id;
    json_t *e;
    json_object_foreach(ids, id, e) {
        int64_t epoch = json_integer_value(e);
        pv_incarnation v;
        pv_status st;
        if (pv_workload_ha_check(r, &h->keys, id, node, epoch, &v, NULL, &st) != PV_OK) continue;
        if (v == PV_INC_PLACING) continue;
        if (v == PV_INC_OWN) {
            int rc = wk_engine_start(h->engine, id, &st);
            wk_fence_log(h->fence, "resumed", id, epoch, rc == PV_OK ? "started" : st.msg);
            pv_info("event=workload_resumed id=%s node=%s: still this node's after the fence", id,
                    node);
        } else if (!drop_if_replaced(h, r, id, epoch, node)) {
            wk_fence_log(h->fence, "left", id, epoch, "no record: left stopped");
        }
        wk_fence_settled(h->fence, id);
    }
    json_decref(ids);
}

/* Reports w's status when it changed since the last one written (else w's id joins
 * unchanged, to have its TTL renewed). */
static int report_one(wk_health *h, pv_redis *r, const wk_engine_info *w, json_t *unchanged,
                      size_t *written, bool *unknown, pv_status *st) {
    const char *node = h->cfg->worker.node;
    bool running = w->state == WK_STATE_RUNNING;
    char why[256] = "";
    bool healthy = running && wk_health_check(w->labels_json, w->networks_json, why, sizeof why);
    char *nets = status_networks(w->networks_json);
    char *sig = NULL;
    if (!nets || asprintf(&sig, "%d%d%s", running, healthy, nets) < 0) sig = NULL;
    const char *last = json_string_value(json_object_get(h->written, w->id));
    int rc = PV_OK;
    if (sig && last && strcmp(last, sig) == 0) {
        if (unchanged) json_array_append_new(unchanged, json_string(w->id));
    } else if (sig && running && has_healthcheck(w->labels_json) && !still(h, w)) {
        /* it changed while its health was checked (a control call, an exit): what was
         * checked is stale, the next pass reports the new state (no check, no time taken:
         * nothing to look at again) */
    } else if (sig) {
        pv_workload_status s = {0};
        snprintf(s.id, sizeof s.id, "%s", w->id);
        s.running = running;
        s.healthy = healthy;
        s.networks = nets;
        s.ttl = 3 * h->interval_seconds;
        s.reporter = node;
        s.epoch = wk_fence_epoch_of(w->labels_json);
        pv_status wst;
        int wrc = pv_workload_set_status(r, &h->keys, &s, NULL, &wst);
        if (wrc == PV_OK) {
            json_object_set_new(h->written, w->id, json_string(sig));
            if (written) (*written)++;
            if (running && !healthy)
                pv_info("event=workload_unhealthy id=%s why=\"%s\"", w->id, why);
        } else if (wrc == PV_NOT_FOUND) {
            /* engine's, not the registry's (half-created, or removed while the agent was
             * away): nothing to report */
            *unknown = true;
        } else if (wrc == PV_FAILED_PRECONDITION && node && *node) {
            /* an old incarnation: the workload was recreated elsewhere meanwhile */
            drop_if_replaced(h, r, w->id, s.epoch, node);
        } else {
            rc = pv_status_set(st, wst.code, "%s", wst.msg);
        }
    }
    free(sig);
    free(nets);
    return rc;
}

/* What the engine holds, for the audit (pivirt check) of engines it cannot see itself: put
 * when it differs from the last put, or always (a full pass: its TTL). */
static int put_inventory(wk_health *h, pv_redis *r, const wk_engine_info *infos, size_t n,
                         bool always, pv_status *st) {
    const char *node = h->cfg->worker.node;
    if (!node || !*node) return PV_OK;
    pv_buf joined = {0};
    for (size_t i = 0; i < n; i++)
        pv_buf_addf(&joined, "%s\n", infos[i].id);
    const char *now = joined.s ? joined.s : "", *last = h->inventory ? h->inventory : "";
    if (!always && !joined.oom && strcmp(now, last) == 0) {
        pv_buf_free(&joined);
        return PV_OK;
    }
    const char **ids = calloc(n + 1, sizeof *ids);
    for (size_t i = 0; ids && i < n; i++)
        ids[i] = infos[i].id;
    int rc = ids ? pv_workload_inventory_put(r, &h->keys, node, ids, n, 3 * h->interval_seconds, st)
                 : pv_status_set(st, PV_INTERNAL, "out of memory");
    free(ids);
    free(h->inventory);
    h->inventory = NULL;
    if (rc == PV_OK && !joined.oom) { /* taken: an unchanged set is not put again */
        h->inventory = joined.s;
        joined.s = NULL;
    }
    pv_buf_free(&joined);
    return rc;
}

/* A pass over every workload (only NULL), or over the ids of only (what the engine said
 * changed: no TTL renewed, the inventory put only when it changed). */
static int pass(wk_health *h, pv_redis *r, json_t *only, size_t *written, size_t *renewed,
                pv_status *st) {
    if (written) *written = 0;
    if (renewed) *renewed = 0;
    const char *node = h->cfg->worker.node;
    if (h->fence && !wk_fence_current(h->fence)) {
        /* not renewed within the fence time: this node's word may be stale; once renewed,
         * every status is written again through the fenced path */
        json_object_clear(h->written);
        return PV_OK;
    }
    if (!only && h->fence && node && *node) settle_fenced(h, r, node);
    wk_engine_info *infos = NULL;
    size_t n = 0;
    if (wk_engine_list(h->engine, &infos, &n, st) != PV_OK) return st->code;
    json_t *seen = json_object(), *unchanged = json_array();
    int rc = seen && unchanged ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    int64_t now = pv_time_mono_ms();
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const char *id = infos[i].id;
        json_object_set_new(seen, id, json_true());
        if (only && !json_object_get(only, id)) continue;
        bool unknown = false;
        rc = report_one(h, r, &infos[i], only ? NULL : unchanged, written, &unknown, st);
        /* a change the engine told of before the workload's record was written (a deploy
         * records its instances once they run): asked again shortly, for a while */
        json_t *since = json_object_get(h->unknown, id);
        if (!unknown || !only)
            json_object_del(h->unknown, id);
        else if (!since)
            json_object_set_new(h->unknown, id, json_integer(now));
        else if (now - json_integer_value(since) > UNKNOWN_RETRY_MS)
            json_object_del(h->unknown, id);
    }
    if (rc == PV_OK && !only) rc = renew(h, r, unchanged, 3 * h->interval_seconds, renewed, st);
    if (rc == PV_OK) rc = put_inventory(h, r, infos, n, !only, st);
    /* forget the workloads that are gone */
    const char *id;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(h->written, tmp, id, v) {
        if (!json_object_get(seen, id)) json_object_del(h->written, id);
    }
    json_object_foreach_safe(h->unknown, tmp, id, v) {
        if (!json_object_get(seen, id)) json_object_del(h->unknown, id);
    }
    json_decref(seen);
    json_decref(unchanged);
    wk_engine_info_array_free(infos, n);
    return rc;
}

int wk_health_pass(wk_health *h, pv_redis *r, size_t *written, size_t *renewed, pv_status *st) {
    return pass(h, r, NULL, written, renewed, st);
}

/* ---- the thread ---- */

wk_health *wk_health_new(const pv_config *cfg, wk_engine *engine) {
    wk_health *h = calloc(1, sizeof *h);
    pv_status st;
    if (!h || !(h->written = json_object()) || !(h->pending = json_object()) ||
        !(h->unknown = json_object()) || pv_keys_init(&h->keys, cfg->redis.prefix, &st) != PV_OK) {
        if (h) json_decref(h->written);
        if (h) json_decref(h->pending);
        if (h) json_decref(h->unknown);
        free(h);
        return NULL;
    }
    h->cfg = cfg;
    h->engine = engine;
    h->interval_seconds =
        cfg->worker.status_interval_seconds > 0 ? cfg->worker.status_interval_seconds : 5;
    pthread_mutex_init(&h->mu, NULL);
    pv_time_cond_init(&h->cv);
    return h;
}

void wk_health_free(wk_health *h) {
    if (!h) return;
    json_decref(h->written);
    json_decref(h->pending);
    json_decref(h->unknown);
    free(h->inventory);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

/* The engine's word that id changed (NULL: anything): the thread reports it now. */
static void on_change(void *arg, const char *id) {
    wk_health *h = arg;
    pthread_mutex_lock(&h->mu);
    if (id)
        json_object_set_new(h->pending, id, json_true());
    else
        h->pending_all = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static void *run(void *arg) {
    wk_health *h = arg;
    pv_redis_opts ro;
    pv_redis_opts_from_config(h->cfg, &ro);
    pv_redis *r = NULL;
    pv_status st;
    if (pv_redis_new(&ro, &r, &st) != PV_OK) {
        pv_error("status reporter: %s; workloads' statuses are not reported", st.msg);
        return NULL;
    }
    bool failing = false;
    int64_t next = 0; /* the next full pass (monotonic ms) */
    pthread_mutex_lock(&h->mu);
    while (!h->stopping) {
        /* a full pass every interval; in between, what the engine said changed */
        json_t *only = NULL;
        if (pv_time_mono_ms() < next && !h->pending_all) {
            only = h->pending;
            h->pending = json_object();
            json_object_update_missing(only, h->unknown); /* the thread's own: no lock needed */
        } else {
            json_object_clear(h->pending);
            next = pv_time_mono_ms() + h->interval_seconds * 1000LL;
        }
        h->pending_all = false;
        pthread_mutex_unlock(&h->mu);
        size_t written = 0, renewed = 0;
        int rc =
            only && json_object_size(only) == 0 ? PV_OK : pass(h, r, only, &written, &renewed, &st);
        json_decref(only);
        if (rc != PV_OK && !failing) pv_warn("status reporter: %s (retrying)", st.msg);
        if (rc == PV_OK && failing) pv_info("status reporter: reporting again");
        failing = rc != PV_OK;
        int64_t left = next - pv_time_mono_ms();
        if (json_object_size(h->unknown) > 0 && left > RETRY_MS) left = RETRY_MS;
        struct timespec until = pv_time_mono_after(left > 0 ? left : 0);
        pthread_mutex_lock(&h->mu);
        while (!h->stopping && !h->pending_all && json_object_size(h->pending) == 0 &&
               pthread_cond_timedwait(&h->cv, &h->mu, &until) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&h->mu);
    pv_redis_free(r);
    return NULL;
}

int wk_health_start(const pv_config *cfg, wk_engine *engine, wk_fence *fence, wk_health **out,
                    pv_status *st) {
    *out = NULL;
    wk_health *h = wk_health_new(cfg, engine);
    if (!h) return pv_status_set(st, PV_INTERNAL, "out of memory");
    h->fence = fence;
    if (pthread_create(&h->thread, NULL, run, h) != 0) {
        wk_health_free(h);
        return pv_status_set(st, PV_INTERNAL, "status reporter: cannot start its thread");
    }
    h->started = true;
    wk_engine_set_watch(engine, on_change, h);
    *out = h;
    return PV_OK;
}

void wk_health_stop(wk_health *h) {
    if (!h) return;
    if (h->started) {
        wk_engine_set_watch(h->engine, NULL, NULL);
        pthread_mutex_lock(&h->mu);
        h->stopping = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
    }
    wk_health_free(h);
}
