/*
 * wk_engine_virt: the virt engine. A workload is a persistent libvirt domain on the node's
 * connection (virt://<libvirt URI>); libvirt is the only store, so an agent that restarts finds
 * its workloads again from the domains alone: each of ours carries a <metadata> element in the
 * pivirt namespace holding its workload id, image, labels and whether it was ever started (a
 * domain that is shut off but never ran is CREATED, not STOPPED; libvirt cannot tell them apart).
 *
 * One connection per handle, opened at open and closed at close, used under one mutex: the
 * brief's rule, and it also keeps the error handler's stored message tied to the call that made
 * it. libvirt prints errors to stderr by default; the handlers installed here keep the message
 * instead, and every failure puts it in the pv_status.
 *
 * Drivers differ in what they can do: test:///default has no device hot-plug at all and its
 * shutdown is immediate; qemu:///system has both. Where a driver lacks device attach, the
 * persistent definition is rewritten (virDomainDefineXML on the inactive XML), which every
 * driver has, and the change applies at the next start.
 *
 * The XML libvirt hands back is read with libxml2 through wk_xml (XPath, no entities, no
 * network): it holds client text, so no reading of it relies on libvirt's formatting. The XML
 * written here (domain_xml, meta_element) escapes every client value with wk_xml_put_escaped.
 */
#include "wk_engine_virt.h"
#include "pv_time.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "pv_log.h"
#include "pv_mem.h"
#include "wk_engine_impl.h"
#include "wk_files.h"
#include "wk_guest.h"
#include "wk_log_index.h"
#include "wk_virt_conn.h"
#include "wk_virt_vm.h"
#include "wk_xml.h"

#define DEFAULT_GRACE_SECONDS 10
#define DEFAULT_MEMORY_BYTES (512LL * 1024 * 1024)
#define DEFAULT_NETWORK "default"
#define MAX_DISKS 26 /* vda .. vdz */
#define STOP_POLL_NS (50 * 1000 * 1000L)

struct wk_virt {
    pthread_mutex_t mu;
    virConnectPtr conn;
    char uri[PATH_MAX]; /* conn's, to reopen it (wk_virt_conn.h) */
    char dom_type[16];  /* <domain type=...>: "test", "kvm", "qemu", ... */
    bool qemu;          /* QEMU's driver: real guests (images, root disks, consoles, agent) */
    int host_cpus;      /* on QEMU: the most vcpus a domain is defined for (hot-plug room) */
    int grace_seconds;
    char state_dir[PATH_MAX], image_dir[PATH_MAX], qemu_img[PATH_MAX];
    pthread_mutex_t image_mu; /* unpacking and collecting VM images (wk_virt_vm.h) */
    wk_guest *guest;          /* engine handles on QEMU: the guest agents' connection */
    /* engine handles on QEMU: the thread that keeps the console logs' time index */
    pthread_t indexer;
    bool indexing, stopping; /* stopping under index_mu */
    pthread_mutex_t index_mu;
    pthread_cond_t index_cv;
};

/* ---- errors ---------------------------------------------------------------------------- */

/* The last error libvirt reported to the calling thread on an engine connection (on_conn_error:
 * libvirt calls it in the thread whose call failed). Kept here rather than read from libvirt's
 * own per-thread last error because every libvirt call resets that one, even
 * virDomainGetName() in a failure's message; per thread, so that calls made without the engine's
 * lock (a domain's start) cannot mix up each other's messages. */
static __thread int tl_err_code;
static __thread char tl_err_msg[PV_STATUS_MSG_MAX];
/* The calling thread's last error meant that the connection is gone (wk_virt_conn_lost). */
static __thread bool tl_err_lost;
/* Some libvirt call of the calling thread lost its connection since with_conn's attempt began,
 * even one whose error was then dropped (a domain whose metadata could not be read is skipped
 * as not ours: after a lost connection, that answer cannot be trusted). Only with_conn clears
 * it. */
static __thread bool tl_conn_lost;

/* Also keeps libvirt from printing the error on stderr. */
static void on_conn_error(void *user, virErrorPtr err) {
    (void)user;
    if (!err) return;
    tl_err_code = err->code;
    tl_err_lost = wk_virt_conn_lost(err);
    if (tl_err_lost) tl_conn_lost = true;
    snprintf(tl_err_msg, sizeof tl_err_msg, "%s", err->message ? err->message : "unknown error");
}

/* Errors raised before a connection exists (virConnectOpen) have no connection handler. */
static void on_global_error(void *user, virErrorPtr err) {
    (void)user;
    (void)err;
}

static void err_reset(wk_virt *v) {
    (void)v;
    tl_err_code = VIR_ERR_OK;
    tl_err_lost = false;
    tl_err_msg[0] = '\0';
    virResetLastError();
}

/* The code of the calling thread's last libvirt error on an engine connection (VIR_ERR_OK). */
static int err_code(void) {
    return tl_err_code;
}

static int map_code(int vir) {
    switch (vir) {
    case VIR_ERR_NO_DOMAIN:
    case VIR_ERR_NO_NETWORK:
        return PV_NOT_FOUND;
    case VIR_ERR_DOM_EXIST:
    case VIR_ERR_NETWORK_EXIST:
        return PV_ALREADY_EXISTS;
    case VIR_ERR_OPERATION_INVALID:
        return PV_FAILED_PRECONDITION;
    case VIR_ERR_NO_SUPPORT:
    case VIR_ERR_OPERATION_UNSUPPORTED:
        return PV_UNIMPLEMENTED;
    case VIR_ERR_INVALID_ARG:
    case VIR_ERR_XML_ERROR:
    case VIR_ERR_XML_DETAIL:
    case VIR_ERR_CONFIG_UNSUPPORTED:
        return PV_INVALID_ARGUMENT;
    case VIR_ERR_OPERATION_DENIED:
    case VIR_ERR_ACCESS_DENIED:
        return PV_PERMISSION_DENIED;
    case VIR_ERR_NO_CONNECT:
    case VIR_ERR_RPC:
    case VIR_ERR_AUTH_FAILED:
    case VIR_ERR_OPERATION_TIMEOUT:
        return PV_UNAVAILABLE;
    default:
        return PV_INTERNAL;
    }
}

/* Fails st with the code and message of libvirt's last error, prefixed by what was being done. */
static int lv_fail(wk_virt *v, pv_status *st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int lv_fail(wk_virt *v, pv_status *st, const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)v;
    int code = tl_err_lost                ? PV_UNAVAILABLE
               : err_code() != VIR_ERR_OK ? map_code(err_code())
                                          : PV_INTERNAL;
    const char *msg = tl_err_msg[0] ? tl_err_msg : virGetLastErrorMessage();
    return pv_status_set(st, code, "%s: %s", what, msg);
}

static int no_memory(pv_status *st) {
    return pv_status_set(st, PV_INTERNAL, "out of memory");
}

static void lock(wk_virt *v) {
    pthread_mutex_lock(&v->mu);
    wk_virt_conn_revive(&v->conn, v->uri, on_conn_error, v);
    err_reset(v);
}

static void unlock(wk_virt *v) {
    pthread_mutex_unlock(&v->mu);
}

/* ---- calls that outlive a libvirtd restart ------------------------------------------------- */

/* A call that lost its libvirt connection (libvirtd restarted or stopped under it: an upgrade)
 * runs again on a new one, at most RECONNECT_TRIES times in all, once libvirtd answers again;
 * libvirtd that does not answer within RECONNECT_WAIT_MS of the first loss fails the call
 * UNAVAILABLE, which the node operation's machinery retries later (a transient code). */
#define RECONNECT_TRIES 4
#define RECONNECT_WAIT_MS 10000
#define RECONNECT_POLL_MS 100

/* One attempt of a call, run with the lock held (it may release it in between and take it
 * again). attempt counts from 0: an attempt after the first may find done what the one before
 * did before its answer was lost (a domain defined, destroyed, undefined, started), and takes
 * that as its own result. */
typedef int (*conn_fn)(wk_virt *v, void *arg, int attempt, pv_status *st);

/* Reopens the engine's connection until libvirtd answers on it or deadline_ms (monotonic)
 * passes; true when it answers. Sleeps without the lock. */
static bool reconnect_by(wk_virt *v, int64_t deadline_ms) {
    for (int pause = RECONNECT_POLL_MS;; pause = pause < 1000 ? pause * 2 : 1000) {
        pthread_mutex_lock(&v->mu);
        wk_virt_conn_revive(&v->conn, v->uri, on_conn_error, v);
        bool up = virConnectIsAlive(v->conn) == 1;
        pthread_mutex_unlock(&v->mu);
        int64_t left = deadline_ms - pv_time_mono_ms();
        if (up || left <= 0) return up;
        if (pause > left) pause = (int)left;
        struct timespec ts = {pause / 1000, (long)(pause % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Runs fn(v, arg) under the lock, again on a new connection when it lost libvirt's (see
 * RECONNECT_TRIES), waiting up to wait_ms for libvirtd to answer again. what names the call in
 * the log and in the UNAVAILABLE message. */
static int with_conn_wait(wk_virt *v, conn_fn fn, void *arg, const char *what, int wait_ms,
                          pv_status *st) {
    int64_t deadline = 0;
    for (int attempt = 0;; attempt++) {
        lock(v);
        tl_conn_lost = false;
        int rc = fn(v, arg, attempt, st);
        bool lost = tl_conn_lost || virConnectIsAlive(v->conn) == 0;
        unlock(v);
        if (!lost) return rc;
        char why[PV_STATUS_MSG_MAX];
        snprintf(why, sizeof why, "%s", rc != PV_OK && st ? st->msg : "connection closed");
        if (!deadline) deadline = pv_time_mono_ms() + wait_ms;
        if (attempt + 1 >= RECONNECT_TRIES)
            return pv_status_set(st, PV_UNAVAILABLE,
                                 "libvirt %s: %s lost its connection %d times (%.300s)", v->uri,
                                 what, attempt + 1, why);
        if (wait_ms > 0) /* a call that does not wait is the caller's to report */
            pv_warn("libvirt %s: %s lost its connection (%s): running it again once libvirtd "
                    "answers",
                    v->uri, what, why);
        if (reconnect_by(v, deadline)) continue;
        if (wait_ms == 0)
            return pv_status_set(st, PV_UNAVAILABLE,
                                 "libvirt %s: %s lost its connection (%.300s) and libvirtd does "
                                 "not answer",
                                 v->uri, what, why);
        return pv_status_set(st, PV_UNAVAILABLE,
                             "libvirt %s: %s lost its connection (%.300s) and libvirtd did not "
                             "answer again within %.1f s",
                             v->uri, what, why, wait_ms / 1000.0);
    }
}

static int with_conn(wk_virt *v, conn_fn fn, void *arg, const char *what, pv_status *st) {
    return with_conn_wait(v, fn, arg, what, RECONNECT_WAIT_MS, st);
}

/* ---- small helpers ------------------------------------------------------------------------ */

static char *xstrdup(const char *s) {
    return strdup(s ? s : "");
}

/* One <interface> of a domain's devices. */
typedef struct iface {
    wk_xml_node *node;
    char *type, *mac, *source; /* NULL when the XML has none */
} iface;

static void ifaces_free(iface *fs, size_t n) {
    for (size_t i = 0; fs && i < n; i++) {
        free(fs[i].type);
        free(fs[i].mac);
        free(fs[i].source);
    }
    free(fs);
}

/* The source an interface is keyed by: its network, bridge or host device, in that order. */
static char *iface_source(wk_xml *x, const wk_xml_node *node) {
    static const char *const kinds[] = {"source/@network", "source/@bridge", "source/@dev"};
    char *s = NULL;
    for (size_t i = 0; !s && i < sizeof kinds / sizeof kinds[0]; i++)
        s = wk_xml_text(x, node, kinds[i]);
    return s;
}

/* The interfaces of domain XML x, in order, into *fs (caller frees with ifaces_free). */
static int ifaces_read(wk_xml *x, iface **fs, size_t *n, pv_status *st) {
    *fs = NULL;
    *n = 0;
    wk_xml_node **nodes;
    size_t nn;
    if (wk_xml_find(x, NULL, "/domain/devices/interface", &nodes, &nn) < 0) return no_memory(st);
    iface *arr = calloc(nn ? nn : 1, sizeof *arr);
    if (!arr) {
        free(nodes);
        return no_memory(st);
    }
    for (size_t i = 0; i < nn; i++) {
        arr[i].node = nodes[i];
        arr[i].type = wk_xml_text(x, nodes[i], "@type");
        arr[i].mac = wk_xml_text(x, nodes[i], "mac/@address");
        arr[i].source = iface_source(x, nodes[i]);
    }
    free(nodes);
    *fs = arr;
    *n = nn;
    return PV_OK;
}

/* Is f an interface on libvirt network `network`? */
static bool iface_on(const iface *f, const char *network) {
    return f->type && strcmp(f->type, "network") == 0 && f->source &&
           strcmp(f->source, network) == 0;
}

/* "192.168.122.0/24" for a network's <ip> element (caller frees); NULL when it has no address. */
static char *ip_cidr(wk_xml *x, const wk_xml_node *ip) {
    char *family = wk_xml_text(x, ip, "@family"), *addr = wk_xml_text(x, ip, "@address");
    char *netmask = wk_xml_text(x, ip, "@netmask"), *prefix = wk_xml_text(x, ip, "@prefix");
    char *out = NULL;
    bool v6 = (family && strcmp(family, "ipv6") == 0) || (addr && strchr(addr, ':'));
    unsigned char a[16];
    int bits = prefix ? atoi(prefix) : (v6 ? 64 : 24);
    if (!addr || inet_pton(v6 ? AF_INET6 : AF_INET, addr, a) != 1) goto done;
    if (!v6 && netmask && !prefix) {
        struct in_addr m;
        if (inet_pton(AF_INET, netmask, &m) == 1) bits = __builtin_popcount(ntohl(m.s_addr));
    }
    int len = v6 ? 16 : 4;
    if (bits < 0 || bits > len * 8) goto done;
    for (int i = 0; i < len; i++) {
        int keep = bits - i * 8;
        if (keep <= 0)
            a[i] = 0;
        else if (keep < 8)
            a[i] &= (unsigned char)(0xFF << (8 - keep));
    }
    char text[INET6_ADDRSTRLEN];
    if (inet_ntop(v6 ? AF_INET6 : AF_INET, a, text, sizeof text) &&
        asprintf(&out, "%s/%d", text, bits) < 0)
        out = NULL;
done:
    free(family);
    free(addr);
    free(netmask);
    free(prefix);
    return out;
}

static void strv_free(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

/* The subnets of a network XML into *out (caller frees with strv_free). */
static int network_subnets(const char *xml, char ***out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    wk_xml *x;
    int rc = wk_xml_parse(xml, &x, st);
    if (rc != PV_OK) return rc;
    wk_xml_node **ips;
    size_t nips;
    if (wk_xml_find(x, NULL, "/network/ip", &ips, &nips) < 0) rc = no_memory(st);
    for (size_t i = 0; rc == PV_OK && i < nips; i++) {
        char *c = ip_cidr(x, ips[i]);
        if (!c) continue;
        char **grown = realloc(*out, (*n + 1) * sizeof *grown);
        if (!grown) {
            free(c);
            rc = no_memory(st);
            break;
        }
        *out = grown;
        (*out)[(*n)++] = c;
    }
    free(ips);
    wk_xml_free(x);
    return rc;
}

/* A locally administered MAC in the range libvirt uses for its guests (52:54:00). */
static void random_mac(char out[18]) {
    unsigned char r[3] = {0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        unsigned long x = (unsigned long)pv_time_now_ms() ^ (unsigned long)getpid();
        r[0] = (unsigned char)x, r[1] = (unsigned char)(x >> 8), r[2] = (unsigned char)(x >> 16);
    }
    snprintf(out, 18, "52:54:00:%02x:%02x:%02x", r[0], r[1], r[2]);
}

/* ---- metadata ---------------------------------------------------------------------------- */

/* The pivirt metadata of d (flags: 0 = live when running), or NULL when d is not a workload of
 * this engine. A domain without it is a normal case, so its libvirt error is dropped. A domain
 * whose metadata names another owner (the state directory of the agent that created it) is
 * another agent's on the same libvirtd (two nodes, or two stacks, on one host): not ours
 * either, nor one without an owner (made by a build before owners were recorded, which cannot
 * say whose it is). */
static json_t *meta_load(wk_virt *v, virDomainPtr d, unsigned int flags) {
    char *xml = virDomainGetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, WK_VIRT_XMLNS, flags);
    if (!xml) {
        err_reset(v);
        return NULL;
    }
    /* meta_element's JSON is the element's text; whatever else made it fails json_loads */
    char *text = wk_xml_text_of(xml, "/*");
    free(xml);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    const char *owner = json_string_value(json_object_get(j, "owner"));
    if (!json_is_object(j) || !json_is_string(json_object_get(j, "id")) || !owner ||
        strcmp(owner, v->state_dir) != 0) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* open_memstream into *buf; when it fails, frees held (what the caller made for the text) and
 * answers NULL. */
static FILE *memstream_or_free(char **buf, size_t *len, char *held) {
    *buf = NULL;
    *len = 0;
    FILE *f = open_memstream(buf, len);
    if (!f) free(held);
    return f;
}

/* The <pivirt:workload> element for meta (caller frees), or NULL when out of memory. The JSON is
 * ASCII (\uXXXX beyond it): a client's valid UTF-8 may hold characters XML 1.0 does not allow
 * (U+FFFE, U+FFFF), which libvirt would refuse the whole definition for. */
static char *meta_element(const json_t *meta, bool with_ns) {
    char *text = json_dumps(meta, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
    if (!text) return NULL;
    char *buf;
    size_t len;
    FILE *f = memstream_or_free(&buf, &len, text);
    if (!f) return NULL;
    if (with_ns)
        fprintf(f, "<" WK_VIRT_XMLNS_PREFIX ":workload xmlns:" WK_VIRT_XMLNS_PREFIX "='%s'>",
                WK_VIRT_XMLNS);
    else
        fputs("<workload>", f);
    wk_xml_put_escaped(f, text);
    fputs(with_ns ? "</" WK_VIRT_XMLNS_PREFIX ":workload>" : "</workload>", f);
    free(text);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Writes meta into d's persistent definition, and into the live one when d runs. */
static int meta_save(wk_virt *v, virDomainPtr d, const json_t *meta, pv_status *st) {
    char *el = meta_element(meta, false);
    if (!el) return no_memory(st);
    unsigned int flags = VIR_DOMAIN_AFFECT_CONFIG;
    if (virDomainIsActive(d) == 1) flags |= VIR_DOMAIN_AFFECT_LIVE;
    int r = virDomainSetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, el, WK_VIRT_XMLNS_PREFIX,
                                 WK_VIRT_XMLNS, flags);
    free(el);
    if (r < 0) return lv_fail(v, st, "domain %s: virDomainSetMetadata", virDomainGetName(d));
    return PV_OK;
}

/* ---- finding a workload's domain ------------------------------------------------------------ */

/* The domain of workload id (caller frees with virDomainFree) and, when meta is not NULL, its
 * metadata (caller decrefs). NOT_FOUND when no domain of ours has this id. */
static int find_domain(wk_virt *v, const char *id, virDomainPtr *dom, json_t **meta,
                       pv_status *st) {
    *dom = NULL;
    if (meta) *meta = NULL;
    if (!id || !*id) return pv_status_set(st, PV_INVALID_ARGUMENT, "id: required");
    virDomainPtr *doms = NULL;
    int n = virConnectListAllDomains(v->conn, &doms, 0);
    if (n < 0) return lv_fail(v, st, "workload %s: virConnectListAllDomains", id);
    for (int i = 0; i < n; i++) {
        json_t *m = *dom ? NULL : meta_load(v, doms[i], 0);
        if (m && strcmp(json_string_value(json_object_get(m, "id")), id) == 0) {
            *dom = doms[i];
            if (meta)
                *meta = m;
            else
                json_decref(m);
            continue;
        }
        json_decref(m);
        virDomainFree(doms[i]);
    }
    free(doms);
    if (!*dom)
        return pv_status_set(st, PV_NOT_FOUND, "workload %s: no domain with this workload id", id);
    return PV_OK;
}

/* ---- workload info ----------------------------------------------------------------------------
 */

wk_state wk_virt_state_of(int vs, int reason, bool started) {
    switch (vs) {
    case VIR_DOMAIN_RUNNING:
    case VIR_DOMAIN_BLOCKED:
    case VIR_DOMAIN_SHUTDOWN: /* being shut down: still running */
        return WK_STATE_RUNNING;
    case VIR_DOMAIN_PAUSED:
        /* QEMU starts with its vcpus stopped until libvirt has set it up and resumes it: a
         * domain being started, not one anybody paused */
        return reason == VIR_DOMAIN_PAUSED_STARTING_UP ? WK_STATE_RUNNING : WK_STATE_PAUSED;
    case VIR_DOMAIN_PMSUSPENDED:
        return WK_STATE_PAUSED;
    default:
        return started ? WK_STATE_STOPPED : WK_STATE_CREATED;
    }
}

static wk_state map_state(int vs, int reason, const json_t *meta) {
    return wk_virt_state_of(vs, reason, json_is_true(json_object_get(meta, "started")));
}

/* A domain has no exit status; the shutoff reason stands in for it: a clean shutdown is 0, a
 * destroy is what a SIGKILL would give (137), a crash or a failed start 1. */
static int exit_code_of(int vs, int reason) {
    if (vs == VIR_DOMAIN_CRASHED) return 1;
    if (vs != VIR_DOMAIN_SHUTOFF) return 0;
    switch (reason) {
    case VIR_DOMAIN_SHUTOFF_DESTROYED:
        return 137;
    case VIR_DOMAIN_SHUTOFF_CRASHED:
    case VIR_DOMAIN_SHUTOFF_FAILED:
        return 1;
    default:
        return 0;
    }
}

/* Adds the addresses libvirt knows for the interface with MAC mac to the array addrs. */
static void add_addresses(virDomainInterfacePtr *ifs, int nifs, const char *mac, json_t *addrs) {
    for (int i = 0; i < nifs; i++) {
        if (!ifs[i]->hwaddr || strcasecmp(ifs[i]->hwaddr, mac) != 0) continue;
        for (unsigned int k = 0; k < ifs[i]->naddrs; k++)
            if (ifs[i]->addrs[k].addr)
                json_array_append_new(addrs, json_string(ifs[i]->addrs[k].addr));
    }
}

/* Sets root[key] for interface f: key is its network, "bridge:<name>" or its type, with "#2",
 * "#3"... when already used. */
static void add_iface(json_t *root, const iface *f, virDomainInterfacePtr *ifs, int nifs) {
    char key[256];
    if (f->type && strcmp(f->type, "network") == 0 && f->source)
        snprintf(key, sizeof key, "%s", f->source);
    else if (f->type && strcmp(f->type, "bridge") == 0 && f->source)
        snprintf(key, sizeof key, "bridge:%s", f->source);
    else
        snprintf(key, sizeof key, "%s", f->type ? f->type : "interface");
    size_t base = strlen(key);
    for (int k = 2; json_object_get(root, key); k++)
        snprintf(key + base, sizeof key - base, "#%d", k);
    json_t *addrs = json_array();
    if (f->mac) add_addresses(ifs, nifs, f->mac, addrs);
    json_object_set_new(root, key,
                        json_pack("{s:s, s:s, s:o}", "mac", f->mac ? f->mac : "", "type",
                                  f->type ? f->type : "", "addresses", addrs));
}

/* Calls fn(f, arg) for each interface f of domain XML xml, in order; none when xml is NULL or
 * does not parse. */
static void each_iface(const char *xml, void (*fn)(const iface *f, void *arg), void *arg) {
    wk_xml *x;
    pv_status st;
    if (!xml || wk_xml_parse(xml, &x, &st) != PV_OK) return;
    iface *fs;
    size_t n;
    if (ifaces_read(x, &fs, &n, &st) == PV_OK) {
        for (size_t i = 0; i < n; i++)
            fn(&fs[i], arg);
        ifaces_free(fs, n);
    }
    wk_xml_free(x);
}

typedef struct ifaces_arg {
    json_t *root;
    virDomainInterfacePtr *ifs;
    int nifs;
} ifaces_arg;

static void add_iface_to(const iface *f, void *arg) {
    ifaces_arg *a = arg;
    add_iface(a->root, f, a->ifs, a->nifs);
}

/* The interfaces of domain XML xml into root; none when it does not parse. */
static void add_ifaces(json_t *root, const char *xml, virDomainInterfacePtr *ifs, int nifs) {
    each_iface(xml, add_iface_to, &(ifaces_arg){root, ifs, nifs});
}

/* {"<network>": {"mac": "...", "type": "network", "addresses": [...]}, ...} from the domain's
 * interfaces (add_iface says how they are keyed). Addresses come from the network's DHCP leases
 * when the domain runs and the driver has them. */
static char *networks_json(wk_virt *v, virDomainPtr d, bool active) {
    json_t *root = json_object();
    char *xml = virDomainGetXMLDesc(d, 0);
    virDomainInterfacePtr *ifs = NULL;
    int nifs = 0;
    if (active) {
        nifs = virDomainInterfaceAddresses(d, &ifs, VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0);
        if (nifs < 0) {
            err_reset(v);
            nifs = 0;
        }
    }
    if (root) add_ifaces(root, xml, ifs, nifs);
    for (int i = 0; i < nifs; i++)
        virDomainInterfaceFree(ifs[i]);
    free(ifs);
    free(xml);
    char *out = root ? json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    return out;
}

/* The qemu process of a running domain of qemu:///system, from the pid file libvirtd keeps; 0
 * when unknown. The fence's guard kills it when the agent cannot destroy the domain
 * (wk_fence.h): it needs nothing from libvirtd then. */
static int64_t qemu_pid(wk_virt *v, virDomainPtr d) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/run/libvirt/qemu/%s.pid", virDomainGetName(d));
    FILE *f = v->qemu ? fopen(path, "r") : NULL;
    long long pid = 0;
    if (f && fscanf(f, "%lld", &pid) != 1) pid = 0;
    if (f) fclose(f);
    return pid > 0 ? pid : 0;
}

static int dom_info(wk_virt *v, virDomainPtr d, const json_t *meta, wk_engine_info *out,
                    pv_status *st) {
    wk_engine_info_clear(out); /* zeroed by the caller, or filled by an earlier attempt */
    int vs = 0, reason = 0;
    if (virDomainGetState(d, &vs, &reason, 0) < 0)
        return lv_fail(v, st, "domain %s: virDomainGetState", virDomainGetName(d));
    char uuid[VIR_UUID_STRING_BUFLEN];
    if (virDomainGetUUIDString(d, uuid) < 0)
        return lv_fail(v, st, "domain %s: virDomainGetUUIDString", virDomainGetName(d));
    out->state = map_state(vs, reason, meta);
    out->exit_code = out->state == WK_STATE_STOPPED ? exit_code_of(vs, reason) : 0;
    out->id = xstrdup(json_string_value(json_object_get(meta, "id")));
    out->name = xstrdup(virDomainGetName(d));
    out->image = xstrdup(json_string_value(json_object_get(meta, "image")));
    out->engine_id = xstrdup(uuid);
    bool active = out->state == WK_STATE_RUNNING || out->state == WK_STATE_PAUSED;
    out->pid = active ? qemu_pid(v, d) : 0;
    out->networks_json = networks_json(v, d, active);
    out->publish_json = xstrdup("{}");
    out->log_path = xstrdup(json_string_value(json_object_get(meta, "log")));
    json_t *labels = json_object_get(meta, "labels");
    out->labels_json =
        json_is_object(labels) ? json_dumps(labels, JSON_COMPACT | JSON_SORT_KEYS) : xstrdup("{}");
    out->started_ms = json_integer_value(json_object_get(meta, "started_ms"));
    out->finished_ms = json_integer_value(json_object_get(meta, "finished_ms"));
    if (!out->id || !out->name || !out->image || !out->engine_id || !out->networks_json ||
        !out->publish_json || !out->log_path || !out->labels_json) {
        wk_engine_info_clear(out);
        return no_memory(st);
    }
    return PV_OK;
}

/* ---- open / close --------------------------------------------------------------------------- */

/* <domain type=...> for the connection's driver: on QEMU's, worker.virt_domain_type ("qemu",
 * TCG, by default: it works on every machine, including those where libvirt advertises a KVM
 * that cannot run a guest; "kvm" where KVM works); other drivers their own name. */
static int pick_dom_type(wk_virt *v, const wk_engine_opts *opts, pv_status *st) {
    const char *t = virConnectGetType(v->conn);
    if (!t) {
        err_reset(v);
        t = "qemu";
    }
    size_t i;
    for (i = 0; t[i] && i + 1 < sizeof v->dom_type; i++)
        v->dom_type[i] = (char)tolower((unsigned char)t[i]);
    v->dom_type[i] = '\0';
    v->qemu = strcmp(v->dom_type, "qemu") == 0;
    if (!v->qemu) return PV_OK;
    const char *want =
        opts && opts->virt_domain_type && *opts->virt_domain_type ? opts->virt_domain_type : "qemu";
    if (strcmp(want, "qemu") != 0 && strcmp(want, "kvm") != 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "worker.virt_domain_type: \"%s\" is not qemu (TCG) or kvm", want);
    snprintf(v->dom_type, sizeof v->dom_type, "%s", want);
    virNodeInfo node;
    if (virNodeGetInfo(v->conn, &node) == 0)
        v->host_cpus = (int)node.cpus;
    else
        err_reset(v);
    return PV_OK;
}

int wk_virt_open(const char *uri, const wk_engine_opts *opts, wk_virt **out, pv_status *st) {
    *out = NULL;
    if (!uri || !*uri)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "uri: empty (virt://<libvirt URI>, e.g. virt://test:///default)");
    if (virInitialize() < 0)
        return pv_status_set(st, PV_INTERNAL, "virInitialize: %s", virGetLastErrorMessage());
    virSetErrorFunc(NULL, on_global_error);
    wk_virt *v = calloc(1, sizeof *v);
    if (!v) return no_memory(st);
    v->conn = virConnectOpen(uri);
    if (!v->conn) {
        pv_status_set(st, PV_UNAVAILABLE, "virConnectOpen %s: %s", uri, virGetLastErrorMessage());
        free(v);
        return st ? st->code : PV_UNAVAILABLE;
    }
    virConnSetErrorFunc(v->conn, v, on_conn_error);
    snprintf(v->uri, sizeof v->uri, "%s", uri);
    pthread_mutex_init(&v->mu, NULL);
    pthread_mutex_init(&v->image_mu, NULL);
    v->grace_seconds =
        opts && opts->stop_grace_seconds > 0 ? opts->stop_grace_seconds : DEFAULT_GRACE_SECONDS;
    snprintf(v->state_dir, sizeof v->state_dir, "%s",
             opts && opts->state_dir ? opts->state_dir : "");
    snprintf(v->image_dir, sizeof v->image_dir, "%s",
             opts && opts->image_dir ? opts->image_dir : "");
    snprintf(v->qemu_img, sizeof v->qemu_img, "%s", opts && opts->qemu_img ? opts->qemu_img : "");
    if (pick_dom_type(v, opts, st) != PV_OK) {
        wk_virt_close(v);
        return st->code;
    }
    *out = v;
    return PV_OK;
}

static void stop_indexer(wk_virt *v);

void wk_virt_close(wk_virt *v) {
    if (!v) return;
    stop_indexer(v);
    wk_guest_close(v->guest);
    virConnSetErrorFunc(v->conn, NULL, NULL);
    virConnectClose(v->conn);
    pthread_mutex_destroy(&v->mu);
    pthread_mutex_destroy(&v->image_mu);
    free(v);
}

/* ---- create ---------------------------------------------------------------------------------- */

static bool valid_id(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n < 1 || n > 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && !strchr("._-", id[i])) return false;
    return true;
}

static bool valid_network_name(const char *s);

/* The deploy's networks ({"name": "ipv4 or \"\""}, the agent's networks_json) into *nets (a new
 * reference; an empty object when there are none): each one becomes an interface of the domain.
 * A fixed address is ConnectNetwork's (it reserves it on the network's DHCP); a deploy's
 * interfaces take what the network gives them. */
static int spec_networks(const wk_workload_spec *s, json_t **nets, pv_status *st) {
    *nets = NULL;
    json_error_t je;
    json_t *n = s->networks_json && *s->networks_json ? json_loads(s->networks_json, 0, &je)
                                                      : json_object();
    if (!json_is_object(n)) {
        json_decref(n);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "networks: not a JSON object of names");
    }
    const char *name;
    json_t *ipv4;
    json_object_foreach(n, name, ipv4) {
        int rc = PV_OK;
        if (!valid_network_name(name))
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "networks: \"%s\" is not a network name",
                               name);
        else if (!json_is_string(ipv4) || json_string_length(ipv4) > 0)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               "networks[%s]: \"%s\": the virt engine gives a deploy's interfaces "
                               "no fixed address (ConnectNetwork with ipv4 reserves one)",
                               name, json_is_string(ipv4) ? json_string_value(ipv4) : "?");
        if (rc != PV_OK) {
            json_decref(n);
            return rc;
        }
    }
    *nets = n;
    return PV_OK;
}

static int check_spec(const wk_workload_spec *s, json_t **labels, pv_status *st) {
    *labels = NULL;
    if (!valid_id(s->id))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "id: \"%s\" must be 1-64 of [A-Za-z0-9._-]",
                             s->id ? s->id : "");
    if (!s->name || !*s->name || strchr(s->name, '/'))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "name: \"%s\" must be a non-empty domain name without '/'",
                             s->name ? s->name : "");
    if (s->nsysctls > 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "sysctls: \"%s\": the virt engine cannot set sysctls (a domain runs "
                             "its own kernel; set them inside the guest)",
                             s->sysctls[0]);
    if (!(s->cpu_limit >= 0) || s->cpu_limit > 4096)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "cpu_limit: %g out of range [0, 4096]",
                             s->cpu_limit);
    if (s->memory_limit < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "memory_limit: %lld must not be negative",
                             (long long)s->memory_limit);
    if (s->nvolumes > MAX_DISKS)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "volumes: %zu disks, at most %d (vda-vdz)",
                             s->nvolumes, MAX_DISKS);
    for (size_t i = 0; i < s->nvolumes; i++)
        if (!s->volumes[i] || s->volumes[i][0] != '/')
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "volumes[%zu]: \"%s\" must be an absolute disk image path", i,
                                 s->volumes[i] ? s->volumes[i] : "");
    for (size_t i = 0; i < s->ncpuset; i++)
        if (s->cpuset[i] < 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "cpuset[%zu]: %d is not a CPU", i,
                                 s->cpuset[i]);
    if (s->labels_json && *s->labels_json) {
        json_error_t je;
        *labels = json_loads(s->labels_json, 0, &je);
        if (!json_is_object(*labels)) {
            json_decref(*labels);
            *labels = NULL;
            return pv_status_set(st, PV_INVALID_ARGUMENT, "labels_json: not a JSON object (%s)",
                                 je.text);
        }
    } else if (!(*labels = json_object())) {
        return no_memory(st);
    }
    return PV_OK;
}

/* qcow2 when the image starts with its magic, raw otherwise (also when unreadable here: the
 * hypervisor reports a missing disk at start, with its own message). */
static const char *disk_format(const char *path) {
    unsigned char magic[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "raw";
    ssize_t n = read(fd, magic, sizeof magic);
    close(fd);
    return n == 4 && memcmp(magic, "QFI\xfb", 4) == 0 ? "qcow2" : "raw";
}

/* A workload's vcpus and memory (KiB) from its limits, as create and ReallocResource take
 * them: ceil(cpu_limit) vcpus, 1 when 0; memory_limit, DEFAULT_MEMORY_BYTES when 0. */
static int vcpus_of(double cpu_limit) {
    return cpu_limit > 0 ? (int)ceil(cpu_limit) : 1;
}

static int64_t memory_kib_of(int64_t memory_limit) {
    return ((memory_limit > 0 ? memory_limit : DEFAULT_MEMORY_BYTES) + 1023) / 1024;
}

/* One virtio interface on libvirt network `network` per name of nets, with a MAC of its own. */
static void put_net_ifaces(FILE *f, const json_t *nets) {
    const char *name;
    json_t *ipv4;
    json_object_foreach((json_t *)nets, name, ipv4) {
        char mac[18];
        random_mac(mac);
        fprintf(f, "    <interface type='network'><mac address='%s'/><source network='", mac);
        wk_xml_put_escaped(f, name);
        fputs("'/><model type='virtio'/></interface>\n", f);
    }
}

/* The domain of spec s; vm (NULL on drivers without real guests) adds what a real guest boots
 * from and talks through (wk_virt_vm.h); nets: the deploy's networks (spec_networks). */
static char *domain_xml(const wk_virt *v, const wk_workload_spec *s, const json_t *meta,
                        const json_t *nets, bool with_network, const wk_virt_vm *vm) {
    char *el = meta_element(meta, true);
    if (!el) return NULL;
    char *buf;
    size_t len;
    FILE *f = memstream_or_free(&buf, &len, el);
    if (!f) return NULL;
    int vcpus = vcpus_of(s->cpu_limit);
    fprintf(f, "<domain type='%s'>\n  <name>", v->dom_type);
    wk_xml_put_escaped(f, s->name);
    fprintf(f, "</name>\n  <metadata>%s</metadata>\n", el);
    fprintf(f, "  <memory unit='KiB'>%lld</memory>\n", (long long)memory_kib_of(s->memory_limit));
    fputs("  <vcpu placement='static'", f);
    /* room to hot-plug vcpus up to the host's CPUs (ReallocResource): the ones beyond current
     * are not there for the guest until plugged */
    if (vm && v->host_cpus > vcpus) fprintf(f, " current='%d'", vcpus);
    if (s->ncpuset > 0) {
        fputs(" cpuset='", f);
        for (size_t i = 0; i < s->ncpuset; i++)
            fprintf(f, "%s%d", i ? "," : "", s->cpuset[i]);
        fputc('\'', f);
    }
    fprintf(f, ">%d</vcpu>\n", vm && v->host_cpus > vcpus ? v->host_cpus : vcpus);
    fputs("  <os><type>hvm</type>", f);
    if (vm)
        wk_virt_vm_os_xml(f, vm);
    else
        fputs("<boot dev='hd'/>", f);
    fputs("</os>\n", f);
    if (vm) fputs("  <features><acpi/></features>\n", f); /* a shutdown is an ACPI event */
    fputs("  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n"
          "  <on_crash>destroy</on_crash>\n  <devices>\n",
          f);
    size_t first = vm && vm->overlay[0] ? 1 : 0; /* vda is the root disk */
    for (size_t i = 0; i < s->nvolumes; i++) {
        fprintf(f,
                "    <disk type='file' device='disk'><driver name='qemu' type='%s'/><source file='",
                disk_format(s->volumes[i]));
        wk_xml_put_escaped(f, s->volumes[i]);
        fprintf(f, "'/><target dev='vd%c' bus='virtio'/></disk>\n", (char)('a' + first + i));
    }
    put_net_ifaces(f, nets);
    if (vm)
        wk_virt_vm_devices_xml(f, vm);
    else if (with_network && json_object_size(nets) == 0)
        fputs("    <interface type='network'><source network='" DEFAULT_NETWORK
              "'/><model type='virtio'/></interface>\n",
              f);
    fputs("  </devices>\n</domain>\n", f);
    free(el);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int ensure_unused(wk_virt *v, const wk_workload_spec *s, pv_status *st) {
    virDomainPtr d = NULL;
    int rc = find_domain(v, s->id, &d, NULL, st);
    if (rc == PV_OK) {
        char uuid[VIR_UUID_STRING_BUFLEN] = "";
        virDomainGetUUIDString(d, uuid);
        virDomainFree(d);
        return pv_status_set(st, PV_ALREADY_EXISTS, "id: workload %s already exists (domain %s)",
                             s->id, uuid);
    }
    if (rc != PV_NOT_FOUND) return rc;
    d = virDomainLookupByName(v->conn, s->name);
    if (d) {
        virDomainFree(d);
        return pv_status_set(st, PV_ALREADY_EXISTS, "name: a domain named \"%s\" already exists",
                             s->name);
    }
    err_reset(v);
    pv_status_clear(st);
    return PV_OK;
}

static bool has_network(wk_virt *v, const char *name) {
    virNetworkPtr n = virNetworkLookupByName(v->conn, name);
    if (!n) {
        err_reset(v);
        return false;
    }
    virNetworkFree(n);
    return true;
}

/* Fails NOT_FOUND naming the first of the deploy's networks that libvirt does not have (a
 * domain on it would be defined, then fail at its start). */
static int check_networks(wk_virt *v, const json_t *nets, pv_status *st) {
    const char *name;
    json_t *ipv4;
    json_object_foreach((json_t *)nets, name, ipv4) {
        if (!has_network(v, name))
            return pv_status_set(st, PV_NOT_FOUND, "networks: no libvirt network \"%s\"", name);
    }
    return PV_OK;
}

/* The domain's name: the workload's, with ".<epoch>" after it for a later incarnation (a
 * failover's: label pivirt.io/epoch, wk_fence.h's WK_EPOCH_LABEL, above 1). The lost node's
 * domain of the earlier incarnation may still be defined on the same libvirtd (two nodes on
 * one host) under the workload's name, which the next incarnation keeps. */
static void domain_name(const wk_workload_spec *s, char *out, size_t cap) {
    json_t *labels = json_loads(s->labels_json ? s->labels_json : "{}", 0, NULL);
    const char *e = json_string_value(json_object_get(labels, "pivirt.io/epoch"));
    long long epoch = e ? atoll(e) : 1;
    if (epoch > 1)
        snprintf(out, cap, "%s.%lld", s->name, epoch);
    else
        snprintf(out, cap, "%s", s->name);
    json_decref(labels);
}

static int create_locked(wk_virt *v, const wk_workload_spec *s, const json_t *meta,
                         const json_t *nets, const wk_virt_vm *vm, wk_engine_info *out,
                         pv_status *st) {
    int rc = ensure_unused(v, s, st);
    if (rc == PV_OK) rc = check_networks(v, nets, st);
    if (rc != PV_OK) return rc;
    char *xml = domain_xml(v, s, meta, nets, !vm && has_network(v, DEFAULT_NETWORK), vm);
    if (!xml) return no_memory(st);
    virDomainPtr d = virDomainDefineXML(v->conn, xml);
    free(xml);
    if (!d) return lv_fail(v, st, "workload %s: virDomainDefineXML %s", s->id, s->name);
    rc = dom_info(v, d, meta, out, st);
    virDomainFree(d);
    return rc;
}

/* A create's attempts (with_conn). */
typedef struct create_call {
    const wk_workload_spec *s;
    const json_t *meta, *nets;
    const wk_virt_vm *vm; /* NULL: no real guest */
    wk_engine_info *out;
    bool defining; /* an attempt went for the define: the domain may exist on its overlay */
} create_call;

static int unused_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    return ensure_unused(v, ((create_call *)arg)->s, st);
}

/* After the first attempt, the domain an earlier one defined before its answer was lost is
 * this create's: its metadata names this create's root disk overlay (its nonce is this call's
 * alone). Any other domain of the workload is another create's: ALREADY_EXISTS, as at first. */
static int create_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    create_call *c = arg;
    virDomainPtr d = NULL;
    json_t *meta = NULL;
    int rc = attempt > 0 ? find_domain(v, c->s->id, &d, &meta, st) : PV_NOT_FOUND;
    if (rc == PV_NOT_FOUND) {
        pv_status_clear(st);
        c->defining = true;
        return create_locked(v, c->s, c->meta, c->nets, c->vm, c->out, st);
    }
    if (rc != PV_OK) return rc;
    const char *overlay = json_string_value(json_object_get(meta, "overlay"));
    if (strcmp(overlay ? overlay : "", c->vm ? c->vm->overlay : "") == 0)
        rc = dom_info(v, d, meta, c->out, st);
    else
        rc = pv_status_set(st, PV_ALREADY_EXISTS, "id: workload %s already exists", c->s->id);
    json_decref(meta);
    virDomainFree(d);
    return rc;
}

/* A real guest's image, root disk and console (wk_virt_vm.h), recorded in meta. Checked for an
 * unused id first, so a repeated create never unpacks nor makes an overlay for nothing. */
static int prepare_vm(wk_virt *v, const wk_workload_spec *s, json_t *meta, wk_virt_vm *vm,
                      pv_status *st) {
    create_call c = {.s = s};
    int rc = with_conn(v, unused_try, &c, "create", st);
    if (rc != PV_OK) return rc;
    if (!v->state_dir[0])
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "workload %s: the virt engine has no state directory for its disks",
                             s->id);
    wk_virt_dirs dirs = {v->state_dir, v->image_dir, v->qemu_img, &v->image_mu};
    if ((rc = wk_virt_vm_prepare(&dirs, s->id, s->image, vm, st)) != PV_OK)
        return pv_status_prefix(st, "workload %s", s->id);
    if (vm->overlay[0] && s->nvolumes >= MAX_DISKS)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           "volumes: %zu disks beside the image's root disk, at most %d",
                           s->nvolumes, MAX_DISKS - 1);
    json_object_set_new(meta, "image_dir", json_string(vm->image.dir ? vm->image.dir : ""));
    json_object_set_new(meta, "overlay", json_string(vm->overlay));
    json_object_set_new(meta, "log", json_string(vm->log));
    return rc;
}

static int virt_create(void *impl, const wk_workload_spec *spec, wk_engine_info *out,
                       pv_status *st) {
    wk_virt *v = impl;
    memset(out, 0, sizeof *out);
    char name[512];
    domain_name(spec, name, sizeof name);
    wk_workload_spec named = *spec;
    named.name = name;
    const wk_workload_spec *s = &named;
    json_t *labels = NULL, *nets = NULL;
    int rc = check_spec(s, &labels, st);
    if (rc == PV_OK && (rc = spec_networks(s, &nets, st)) != PV_OK) json_decref(labels);
    if (rc != PV_OK) return rc;
    json_t *meta =
        json_pack("{s:s, s:s, s:s, s:o, s:b, s:I, s:I}", "id", s->id, "owner", v->state_dir,
                  "image", s->image ? s->image : "", "labels", labels, "started", 0, "started_ms",
                  (json_int_t)0, "finished_ms", (json_int_t)0);
    if (!meta) {
        json_decref(nets);
        return no_memory(st);
    }
    wk_virt_vm vm = {0};
    if (v->qemu) rc = prepare_vm(v, s, meta, &vm, st);
    bool maybe_defined = false;
    if (rc == PV_OK) {
        create_call c = {s, meta, nets, v->qemu ? &vm : NULL, out, false};
        rc = with_conn(v, create_try, &c, "create", st);
        maybe_defined = c.defining && rc == PV_UNAVAILABLE;
    }
    /* ours alone (its nonce), unless a domain defined before libvirtd went away has it: the
     * redelivered create finds that domain, and the sweep of a later start of the engine
     * deletes the overlay if no domain has it */
    if (rc != PV_OK && !maybe_defined) wk_virt_vm_remove_files(vm.overlay, NULL);
    wk_virt_vm_clear(&vm);
    json_decref(nets);
    json_decref(meta);
    return rc;
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static const char *state_name(wk_state s) {
    static const char *const names[] = {"created", "running", "paused", "stopped"};
    return (unsigned)s < 4 ? names[s] : "unknown";
}

/* The workload's domain, metadata and state, under the lock. */
static int lookup_state(wk_virt *v, const char *id, virDomainPtr *d, json_t **meta, wk_state *ws,
                        pv_status *st) {
    int rc = find_domain(v, id, d, meta, st);
    if (rc != PV_OK) return rc;
    int vs = 0, reason = 0;
    if (virDomainGetState(*d, &vs, &reason, 0) < 0) {
        rc = lv_fail(v, st, "workload %s: virDomainGetState", id);
        virDomainFree(*d);
        json_decref(*meta);
        *d = NULL;
        *meta = NULL;
        return rc;
    }
    *ws = map_state(vs, reason, *meta);
    return PV_OK;
}

/* The start itself (QEMU's: 0.2-2 s, longer on a loaded host), without the engine's lock and on
 * a connection of its own, so that domains start side by side as they do straight through
 * libvirt: libvirtd runs at most max_client_requests (5) calls of one connection at once, and
 * starts queued on the engine's connection would hold up every call behind them (the status
 * pass's, under the lock, and so every workload's). A failure's message is this thread's
 * (tl_err_msg). The engine's connection when no other opens. */
static int start_apart(wk_virt *v, const char *id, virDomainPtr d, pv_status *st) {
    unsigned char uuid[VIR_UUID_BUFLEN];
    virConnectPtr own =
        virDomainGetUUID(d, uuid) == 0 ? wk_virt_conn_open(v->uri, on_conn_error, v) : NULL;
    virDomainPtr od = own ? virDomainLookupByUUID(own, uuid) : NULL;
    int rc = PV_OK;
    if (virDomainCreate(od ? od : d) < 0)
        rc = lv_fail(v, st, "workload %s: virDomainCreate %s", id, virDomainGetName(d));
    if (od) virDomainFree(od);
    if (own) virConnectClose(own);
    return rc;
}

/* A stop's, start's, suspend's or resume's attempts (with_conn). begun: an attempt got as far
 * as the shutdown, the start, the suspend or the resume, so a later one that finds it done
 * takes that as the call's result. */
typedef struct control_call {
    const char *id;
    int grace_seconds;
    bool force, pause, begun;
} control_call;

/* Called with the lock held; releases it for the domain's start itself (start_apart). */
static int start_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    control_call *c = arg;
    const char *id = c->id;
    virDomainPtr d;
    json_t *meta;
    wk_state ws = WK_STATE_CREATED;
    int rc = lookup_state(v, id, &d, &meta, &ws, st);
    if (rc != PV_OK) return rc;
    json_t *before = json_deep_copy(meta);
    if (ws == WK_STATE_RUNNING && attempt > 0 && c->begun) /* started by an earlier attempt */
        goto done;
    if (ws == WK_STATE_RUNNING || ws == WK_STATE_PAUSED) {
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s is already %s", id,
                           state_name(ws));
        goto done;
    }
    /* Marked started before the start, so a domain that runs is never taken for CREATED. */
    json_object_set_new(meta, "started", json_true());
    json_object_set_new(meta, "started_ms", json_integer(pv_time_now_ms()));
    json_object_set_new(meta, "finished_ms", json_integer(0));
    if ((rc = meta_save(v, d, meta, st)) != PV_OK) goto done;
    const char *log = json_string_value(json_object_get(meta, "log"));
    if (log && *log) wk_virt_vm_index_now(log, pv_time_now_ms());
    c->begun = true;
    unlock(v);
    rc = start_apart(v, id, d, st);
    lock(v);
    if (rc != PV_OK) {
        pv_status keep;
        if (before) meta_save(v, d, before, &keep);
    }
done:
    json_decref(before);
    json_decref(meta);
    virDomainFree(d);
    return rc;
}

static int virt_start(void *impl, const char *id, pv_status *st) {
    control_call c = {.id = id};
    return with_conn(impl, start_try, &c, "start", st);
}

static bool dom_active(wk_virt *v, virDomainPtr d) {
    int vs = 0, reason = 0;
    if (virDomainGetState(d, &vs, &reason, 0) < 0) {
        err_reset(v);
        return false;
    }
    return vs != VIR_DOMAIN_SHUTOFF && vs != VIR_DOMAIN_CRASHED && vs != VIR_DOMAIN_NOSTATE;
}

/* Polls d until it is shut off or grace_seconds pass, without holding the lock in between, so
 * other workloads are not held up by one guest's shutdown. Returns with the lock held. */
static void wait_shutoff(wk_virt *v, virDomainPtr d, int grace_seconds) {
    struct timespec now, end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += grace_seconds;
    for (;;) {
        if (!dom_active(v, d)) return;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
            return;
        unlock(v);
        struct timespec pause = {0, STOP_POLL_NS};
        nanosleep(&pause, NULL);
        lock(v);
    }
}

/* Shuts d down (destroy at once when force, grace 0 or paused: a paused guest cannot answer),
 * destroys it after grace, and records when it finished. Called with the lock held. */
static int stop_domain(wk_virt *v, const char *id, virDomainPtr d, json_t *meta, wk_state ws,
                       int grace_seconds, bool force, pv_status *st) {
    bool now = force || grace_seconds == 0 || ws == WK_STATE_PAUSED;
    if (!now && virDomainShutdown(d) < 0) {
        err_reset(v); /* no ACPI or no guest support: the destroy below does it */
        now = true;
    }
    if (!now) wait_shutoff(v, d, grace_seconds);
    if (dom_active(v, d) && virDomainDestroy(d) < 0 && dom_active(v, d))
        return lv_fail(v, st, "workload %s: virDomainDestroy %s", id, virDomainGetName(d));
    json_object_set_new(meta, "finished_ms", json_integer(pv_time_now_ms()));
    return meta_save(v, d, meta, st);
}

static int stop_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    control_call *c = arg;
    virDomainPtr d;
    json_t *meta;
    wk_state ws = WK_STATE_CREATED;
    int rc = lookup_state(v, c->id, &d, &meta, &ws, st);
    if (rc != PV_OK) return rc;
    if (ws == WK_STATE_RUNNING || ws == WK_STATE_PAUSED) {
        c->begun = true;
        rc = stop_domain(v, c->id, d, meta, ws, c->grace_seconds, c->force, st);
    } else if (attempt > 0 && c->begun) { /* stopped by an earlier attempt: note when */
        json_object_set_new(meta, "finished_ms", json_integer(pv_time_now_ms()));
        rc = meta_save(v, d, meta, st);
    } else {
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s is not running (%s)", c->id,
                           state_name(ws));
    }
    json_decref(meta);
    virDomainFree(d);
    return rc;
}

static int virt_stop(void *impl, const char *id, int grace_seconds, bool force, pv_status *st) {
    wk_virt *v = impl;
    control_call c = {.id = id,
                      .grace_seconds = grace_seconds < 0 ? v->grace_seconds : grace_seconds,
                      .force = force};
    return with_conn(v, stop_try, &c, "stop", st);
}

/* Suspends (pause) or resumes the domain when it is in the state that needs. */
static int pause_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    control_call *c = arg;
    wk_state need = c->pause ? WK_STATE_RUNNING : WK_STATE_PAUSED;
    virDomainPtr d;
    json_t *meta;
    wk_state ws = WK_STATE_CREATED;
    int rc = lookup_state(v, c->id, &d, &meta, &ws, st);
    if (rc != PV_OK) return rc;
    if (attempt > 0 && c->begun && ws == (c->pause ? WK_STATE_PAUSED : WK_STATE_RUNNING)) {
        rc = PV_OK; /* done by an earlier attempt */
    } else if (ws != need) {
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %s is %s, not %s", c->id,
                           state_name(ws), state_name(need));
    } else {
        c->begun = true;
        if ((c->pause ? virDomainSuspend(d) : virDomainResume(d)) < 0)
            rc = lv_fail(v, st, "workload %s: %s %s", c->id,
                         c->pause ? "virDomainSuspend" : "virDomainResume", virDomainGetName(d));
    }
    json_decref(meta);
    virDomainFree(d);
    return rc;
}

static int virt_pause(void *impl, const char *id, pv_status *st) {
    control_call c = {.id = id, .pause = true};
    return with_conn(impl, pause_try, &c, "suspend", st);
}

static int virt_resume(void *impl, const char *id, pv_status *st) {
    control_call c = {.id = id};
    return with_conn(impl, pause_try, &c, "resume", st);
}

/* Undefines d with what libvirt keeps beside it (managed save, snapshot metadata); drivers
 * that do not know those flags get a plain undefine. The disks stay: they are volumes of the
 * storage service. */
static int undefine(wk_virt *v, const char *id, virDomainPtr d, pv_status *st) {
    unsigned int flags = VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA;
    if (virDomainUndefineFlags(d, flags) == 0) return PV_OK;
    if (err_code() != VIR_ERR_INVALID_ARG && err_code() != VIR_ERR_NO_SUPPORT)
        return lv_fail(v, st, "workload %s: virDomainUndefineFlags %s", id, virDomainGetName(d));
    err_reset(v);
    if (virDomainUndefine(d) < 0)
        return lv_fail(v, st, "workload %s: virDomainUndefine %s", id, virDomainGetName(d));
    return PV_OK;
}

/* Whether an unpacked image (dir), an overlay or a console log is some domain's
 * (wk_vm_image_collect's and wk_virt_vm_sweep's question). */
static bool image_in_use(const char *dir, void *arg) {
    return json_object_get(arg, dir) != NULL;
}

static void use_path(json_t *used, const json_t *meta, const char *key) {
    const char *p = json_string_value(json_object_get(meta, key));
    if (p && *p) json_object_set_new(used, p, json_true());
}

/* Whether d's metadata could not be read (not: it has none, or another agent's): then no file
 * can be told not to be its. */
static bool meta_unreadable(wk_virt *v, virDomainPtr d) {
    char *xml = virDomainGetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, WK_VIRT_XMLNS, 0);
    bool bad = !xml && err_code() != VIR_ERR_NO_DOMAIN_METADATA && err_code() != VIR_ERR_NO_DOMAIN;
    free(xml);
    err_reset(v);
    return bad;
}

typedef struct collect_call {
    json_t *used;
    bool sweep;
} collect_call;

/* What the domains use (with_conn: a domain whose metadata a lost connection kept from being
 * read must not have its files taken for nobody's). */
static int collect_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    collect_call *c = arg;
    json_object_clear(c->used);
    virDomainPtr *doms = NULL;
    int n = virConnectListAllDomains(v->conn, &doms, 0);
    if (n < 0) return lv_fail(v, st, "virConnectListAllDomains");
    for (int i = 0; i < n; i++) {
        json_t *m = meta_load(v, doms[i], 0);
        if (!m && c->sweep) c->sweep = !meta_unreadable(v, doms[i]);
        use_path(c->used, m, "image_dir");
        use_path(c->used, m, "overlay");
        use_path(c->used, m, "log");
        json_decref(m);
        virDomainFree(doms[i]);
    }
    free(doms);
    return PV_OK;
}

/* Deletes the unpacked images no domain uses any longer and the store has replaced or lost;
 * with sweep (at open, before any create) also the overlays and logs of domains that are gone
 * (wk_virt_vm_sweep). */
static void collect_images(wk_virt *v, bool sweep) {
    char cache[PATH_MAX + 8];
    snprintf(cache, sizeof cache, "%s/images", v->state_dir);
    json_t *used = json_object();
    collect_call c = {used, sweep};
    pv_status st;
    if (used && with_conn(v, collect_try, &c, "image collection", &st) == PV_OK) {
        sweep = c.sweep;
        pthread_mutex_lock(&v->image_mu);
        wk_vm_image_collect(v->image_dir, cache, image_in_use, used);
        pthread_mutex_unlock(&v->image_mu);
        if (sweep) wk_virt_vm_sweep(v->state_dir, image_in_use, used);
    }
    json_decref(used);
}

static json_t *network_macs(wk_virt *v, virDomainPtr d);
static void release_addresses(wk_virt *v, const char *id, const json_t *macs);

/* A remove's attempts (with_conn): the domain's files, once an attempt found it. */
typedef struct remove_call {
    const char *id;
    bool force;
    char *overlay, *log;
    bool found;
} remove_call;

static int remove_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    remove_call *c = arg;
    const char *id = c->id;
    bool force = c->force;
    virDomainPtr d;
    json_t *meta;
    wk_state ws = WK_STATE_CREATED;
    int rc = lookup_state(v, id, &d, &meta, &ws, st);
    if (rc == PV_NOT_FOUND && attempt > 0 && c->found) {
        /* undefined by an earlier attempt, whose answer was lost with the connection */
        pv_status_clear(st);
        wk_virt_vm_remove_files(c->overlay, c->log);
        return PV_OK;
    }
    if (rc == PV_OK && !c->found) {
        c->found = true;
        c->overlay = xstrdup(json_string_value(json_object_get(meta, "overlay")));
        c->log = xstrdup(json_string_value(json_object_get(meta, "log")));
    }
    if (rc == PV_OK) {
        bool active = ws == WK_STATE_RUNNING || ws == WK_STATE_PAUSED;
        /* read before the destroy: an interface only the running domain has goes with it */
        json_t *macs = network_macs(v, d);
        if (active && !force)
            rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                               "workload %s is %s: stop it first or remove with force", id,
                               state_name(ws));
        else if (active && virDomainDestroy(d) < 0 && dom_active(v, d))
            rc = lv_fail(v, st, "workload %s: virDomainDestroy %s", id, virDomainGetName(d));
        /* before the undefine, so that a remove redelivered after a crash between the two finds
         * the domain and releases again (a no-op), rather than no domain and a reservation left */
        if (rc == PV_OK) release_addresses(v, id, macs);
        json_decref(macs);
        if (rc == PV_OK) rc = undefine(v, id, d, st);
        /* the domain is gone: what it had on the node goes too */
        if (rc == PV_OK)
            wk_virt_vm_remove_files(json_string_value(json_object_get(meta, "overlay")),
                                    json_string_value(json_object_get(meta, "log")));
        json_decref(meta);
        virDomainFree(d);
    }
    return rc;
}

static int virt_remove(void *impl, const char *id, bool force, pv_status *st) {
    wk_virt *v = impl;
    remove_call c = {.id = id, .force = force};
    int rc = with_conn(v, remove_try, &c, "remove", st);
    free(c.overlay);
    free(c.log);
    if (rc == PV_OK && v->qemu && v->state_dir[0]) collect_images(v, false);
    return rc;
}

/* A call that reads (with_conn): any attempt may run again. */
typedef struct read_call {
    const char *id;
    wk_engine_info *info;
    wk_engine_info **infos;
    size_t *n;
    char **text;
    char *path; /* PATH_MAX */
} read_call;

static int inspect_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    read_call *c = arg;
    virDomainPtr d;
    json_t *meta;
    int rc = find_domain(v, c->id, &d, &meta, st);
    if (rc == PV_OK) {
        rc = dom_info(v, d, meta, c->info, st);
        json_decref(meta);
        virDomainFree(d);
    }
    return rc;
}

static int virt_inspect(void *impl, const char *id, wk_engine_info *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    read_call c = {.id = id, .info = out};
    int rc = with_conn(impl, inspect_try, &c, "inspect", st);
    if (rc != PV_OK) wk_engine_info_clear(out);
    return rc;
}

static int list_locked(wk_virt *v, wk_engine_info **out, size_t *n, pv_status *st) {
    virDomainPtr *doms = NULL;
    int nd = virConnectListAllDomains(v->conn, &doms, 0);
    if (nd < 0) return lv_fail(v, st, "virConnectListAllDomains");
    int rc = PV_OK;
    wk_engine_info *infos = calloc(nd > 0 ? (size_t)nd : 1, sizeof *infos);
    if (!infos) rc = no_memory(st);
    for (int i = 0; i < nd; i++) {
        json_t *meta = rc == PV_OK ? meta_load(v, doms[i], 0) : NULL;
        if (meta) {
            int r = dom_info(v, doms[i], meta, &infos[*n], st);
            if (r == PV_OK)
                (*n)++;
            else if (r != PV_NOT_FOUND) /* NOT_FOUND: undefined since the listing */
                rc = r;
            json_decref(meta);
        }
        virDomainFree(doms[i]);
    }
    free(doms);
    if (rc != PV_OK) {
        wk_engine_info_array_free(infos, *n);
        *n = 0;
        return rc;
    }
    pv_status_clear(st);
    *out = infos;
    return PV_OK;
}

static int list_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    read_call *c = arg;
    wk_engine_info_array_free(*c->infos, *c->n); /* an earlier attempt's */
    *c->infos = NULL;
    *c->n = 0;
    return list_locked(v, c->infos, c->n, st);
}

static int virt_list(void *impl, wk_engine_info **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    read_call c = {.infos = out, .n = n};
    /* the status pass and the fence ask every few seconds: a new connection if libvirtd
     * answers at once, no waiting for it (they ask again soon) */
    int rc = with_conn_wait(impl, list_try, &c, "list", 0, st);
    if (rc != PV_OK) {
        wk_engine_info_array_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- ReallocResource ----------------------------------------------------------------------- */

/* Sets d's memory to kib: on a running domain within the memory it was started with, through
 * its balloon, now and in its definition (*live); otherwise in the definition only, its maximum
 * raised or lowered to kib, for the next start. *room: the running domain's maximum (KiB). */
static int realloc_memory(wk_virt *v, const char *id, virDomainPtr d, bool active, int64_t kib,
                          bool *live, unsigned long *room, pv_status *st) {
    *live = false;
    *room = active ? virDomainGetMaxMemory(d) : 0;
    if (active && *room > 0 && (unsigned long)kib <= *room) {
        unsigned int f = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG;
        if (virDomainSetMemoryFlags(d, (unsigned long)kib, f) == 0) {
            *live = true;
            return PV_OK;
        }
        err_reset(v); /* no balloon: the definition below takes it */
    }
    err_reset(v);
    unsigned int f = VIR_DOMAIN_AFFECT_CONFIG;
    if (virDomainSetMemoryFlags(d, (unsigned long)kib, f | VIR_DOMAIN_MEM_MAXIMUM) < 0 ||
        virDomainSetMemoryFlags(d, (unsigned long)kib, f) < 0)
        return lv_fail(v, st, "workload %s: memory %lld KiB in its definition", id, (long long)kib);
    return PV_OK;
}

/* Onlines n vcpus in the running guest through its agent (VIR_DOMAIN_VCPU_GUEST): a Linux guest
 * without udev leaves a hot-added CPU offline, and the CPU reaches the guest a moment after the
 * plug (the agent lists it only then), so this is tried for up to VCPU_ONLINE_WAIT_MS, the lock
 * released in between. false with why (libvirt's last reason) when it never took; at once for a
 * guest whose agent does not answer. Called with the lock held; returns with it held. */
#define VCPU_ONLINE_WAIT_MS 8000
static bool online_vcpus(wk_virt *v, virDomainPtr d, int n, char *why, size_t cap) {
    int64_t until = pv_time_mono_ms() + VCPU_ONLINE_WAIT_MS;
    for (;;) {
        if (virDomainSetVcpusFlags(d, (unsigned int)n, VIR_DOMAIN_VCPU_GUEST) == 0) return true;
        snprintf(why, cap, "%.180s", tl_err_msg[0] ? tl_err_msg : "unknown error");
        bool agentless = err_code() == VIR_ERR_AGENT_UNRESPONSIVE;
        err_reset(v);
        if (agentless || pv_time_mono_ms() >= until) return false;
        unlock(v);
        struct timespec pause = {0, 4 * STOP_POLL_NS};
        nanosleep(&pause, NULL);
        lock(v);
    }
}

/* Sets d's vcpus to n: on a running domain within the vcpus it was defined for, hot-plugged (or
 * unplugged) now and in its definition (*live), then onlined in the guest (online_vcpus: *why
 * says why not); otherwise in the definition only (its maximum raised when n is above it), for
 * the next start. */
static int realloc_vcpus(wk_virt *v, const char *id, virDomainPtr d, bool active, int n, bool *live,
                         char *why, size_t cap, pv_status *st) {
    *live = false;
    int room = virDomainGetVcpusFlags(
        d, VIR_DOMAIN_VCPU_MAXIMUM | (active ? VIR_DOMAIN_AFFECT_LIVE : VIR_DOMAIN_AFFECT_CONFIG));
    if (active && room >= n) {
        unsigned int f = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG;
        if (virDomainSetVcpusFlags(d, (unsigned int)n, f) == 0) {
            *live = true;
            char reason[200] = "";
            if (!online_vcpus(v, d, n, reason, sizeof reason))
                snprintf(why, cap, " (not onlined in the guest: %s)", reason);
            return PV_OK;
        }
        err_reset(v); /* the guest did not let a vcpu go, or no hot-plug: at the next start */
    }
    err_reset(v);
    int max = virDomainGetVcpusFlags(d, VIR_DOMAIN_VCPU_MAXIMUM | VIR_DOMAIN_AFFECT_CONFIG);
    unsigned int f = VIR_DOMAIN_AFFECT_CONFIG;
    if ((max < n && virDomainSetVcpusFlags(d, (unsigned int)n, f | VIR_DOMAIN_VCPU_MAXIMUM) < 0) ||
        virDomainSetVcpusFlags(d, (unsigned int)n, f) < 0)
        return lv_fail(v, st, "workload %s: %d vcpus in its definition", id, n);
    return PV_OK;
}

/* A realloc's attempts (with_conn): setting the same memory and vcpus again is harmless. */
typedef struct limits_call {
    const char *id;
    int64_t kib;
    int n;
    bool active, mem_live, cpu_live;
    unsigned long room;
    char offline[256];
} limits_call;

static int limits_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    limits_call *c = arg;
    virDomainPtr d;
    json_t *meta;
    wk_state ws = WK_STATE_CREATED;
    int rc = lookup_state(v, c->id, &d, &meta, &ws, st);
    if (rc != PV_OK) return rc;
    c->active = ws == WK_STATE_RUNNING || ws == WK_STATE_PAUSED;
    c->cpu_live = false;
    c->offline[0] = '\0';
    rc = realloc_memory(v, c->id, d, c->active, c->kib, &c->mem_live, &c->room, st);
    if (rc == PV_OK)
        rc = realloc_vcpus(v, c->id, d, c->active, c->n, &c->cpu_live, c->offline,
                           sizeof c->offline, st);
    json_decref(meta);
    virDomainFree(d);
    return rc;
}

static int virt_set_limits_how(void *impl, const char *id, double cpu_limit, int64_t memory_limit,
                               char *how, size_t how_cap, pv_status *st) {
    wk_virt *v = impl;
    if (!(cpu_limit >= 0) || cpu_limit > 4096)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "cpu_limit: %g out of range [0, 4096]",
                             cpu_limit);
    if (memory_limit < 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "memory_limit: %lld must not be negative",
                             (long long)memory_limit);
    limits_call c = {.id = id, .kib = memory_kib_of(memory_limit), .n = vcpus_of(cpu_limit)};
    int rc = with_conn(v, limits_try, &c, "realloc", st);
    if (rc != PV_OK) return rc;
    int64_t kib = c.kib;
    int n = c.n;
    bool active = c.active, mem_live = c.mem_live, cpu_live = c.cpu_live;
    unsigned long room = c.room;
    const char *offline = c.offline;
    char why[96] = "";
    if (active && !mem_live && room > 0 && (unsigned long)kib > room)
        snprintf(why, sizeof why, " (above the %lu MiB the running domain has room for)",
                 room / 1024);
    snprintf(how, how_cap, "memory %lld MiB %s%s, %d vcpus %s%s", (long long)(kib / 1024),
             mem_live ? "live" : "at the next start", why, n,
             cpu_live ? "live" : "at the next start", offline);
    return PV_OK;
}

static int virt_set_limits(void *impl, const char *id, double cpu_limit, int64_t memory_limit,
                           pv_status *st) {
    char how[256];
    return virt_set_limits_how(impl, id, cpu_limit, memory_limit, how, sizeof how, st);
}

/* guest_target's attempts (with_conn). */
typedef struct guest_call {
    const char *id;
    char *uuid; /* VIR_UUID_STRING_BUFLEN */
    wk_guest_target *t;
} guest_call;

static int guest_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    guest_call *c = arg;
    const char *id = c->id;
    char *uuid = c->uuid;
    wk_guest_target *t = c->t;
    virDomainPtr d = NULL;
    json_t *meta = NULL;
    wk_state ws = WK_STATE_CREATED;
    int rc = lookup_state(v, id, &d, &meta, &ws, st);
    if (rc == PV_OK && ws != WK_STATE_RUNNING)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                           "workload %s is %s: its guest agent answers only while it runs", id,
                           state_name(ws));
    if (rc == PV_OK && virDomainGetUUIDString(d, uuid) < 0)
        rc = lv_fail(v, st, "workload %s: virDomainGetUUIDString", id);
    if (rc == PV_OK) {
        int64_t started = json_integer_value(json_object_get(meta, "started_ms"));
        int64_t left = started + WK_ENGINE_AGENT_WAIT_MS - pv_time_now_ms();
        if (left > WK_ENGINE_AGENT_WAIT_MS) left = WK_ENGINE_AGENT_WAIT_MS;
        if (left < 1000) left = 1000;
        *t = (wk_guest_target){
            .id = id, .uuid = uuid, .agent_deadline_ms = pv_time_mono_ms() + left};
    }
    json_decref(meta);
    if (d) virDomainFree(d);
    return rc;
}

/* The running guest of workload id, for its agent: domain UUID and how long an agent that is
 * not connected yet is waited for (until WK_ENGINE_AGENT_WAIT_MS after the start, at least a
 * second: a guest that booted long ago and has no agent fails fast). */
static int guest_target(wk_virt *v, const char *id, char uuid[VIR_UUID_STRING_BUFLEN],
                        wk_guest_target *t, pv_status *st) {
    if (!v->guest)
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "workload %s: the %s driver's domains have no guest agent", id,
                             v->dom_type);
    guest_call c = {id, uuid, t};
    return with_conn(v, guest_try, &c, "guest agent target", st);
}

static int virt_exec(void *impl, const char *id, const char *const *argv, size_t argc,
                     int timeout_ms, int *exit_code, char **output, size_t *output_len,
                     pv_status *st) {
    wk_virt *v = impl;
    *exit_code = -1;
    *output = NULL;
    *output_len = 0;
    char uuid[VIR_UUID_STRING_BUFLEN];
    wk_guest_target t;
    if (guest_target(v, id, uuid, &t, st) != PV_OK) return st->code;
    return wk_guest_exec(v->guest, &t, argv, argc, NULL, 0, timeout_ms, exit_code, output,
                         output_len, st);
}

/* The input of an exec_io up to its end (the client's half-close), at most WK_GUEST_INPUT_MAX
 * bytes, before deadline_ms (monotonic; 0: none). *in is the caller's to free. */
static int collect_input(const wk_exec_io *io, int64_t deadline_ms, char **in, size_t *len,
                         pv_status *st) {
    char *buf = malloc(WK_GUEST_INPUT_MAX + 1);
    if (!buf) return pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t n = 0;
    int rc = PV_OK;
    for (;;) {
        if (deadline_ms > 0 && pv_time_mono_ms() >= deadline_ms) {
            rc = pv_status_set(st, PV_DEADLINE_EXCEEDED,
                               "open_stdin: the input did not end (the client's half-close) "
                               "within the exec's timeout");
            break;
        }
        /* one byte past the limit tells "exactly the limit" from "more" */
        long got = io->input(io->ctx, buf + n, WK_GUEST_INPUT_MAX + 1 - n, 200, st);
        if (got == -1) break;
        if (got < -1) {
            rc = st->code != PV_OK ? st->code : pv_status_set(st, PV_CANCELLED, "cancelled");
            break;
        }
        n += (size_t)got;
        if (n > WK_GUEST_INPUT_MAX) {
            rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                               "open_stdin: a command in a VM takes at most %d bytes of input "
                               "(the guest agent's guest-exec carries it whole), more came",
                               WK_GUEST_INPUT_MAX);
            break;
        }
    }
    if (rc != PV_OK) {
        free(buf);
        return rc;
    }
    *in = buf;
    *len = n;
    return PV_OK;
}

/* ExecuteWorkload with open_stdin: the guest agent cannot stream (guest-exec takes the whole
 * input when it starts the command and gives the output once it has exited), so the input is
 * collected until its end, the command runs with it, and its output (stdout then stderr) goes
 * out in one piece. The extras as the other engines' exec: env -C workdir K=V ... */
static int virt_exec_io(void *impl, const char *id, const wk_exec_io *io, int *exit_code,
                        pv_status *st) {
    wk_virt *v = impl;
    *exit_code = -1;
    int64_t deadline = io->timeout_ms > 0 ? pv_time_mono_ms() + io->timeout_ms : 0;
    char *in = NULL;
    size_t in_len = 0;
    if (io->input && collect_input(io, deadline, &in, &in_len, st) != PV_OK) return st->code;
    const char **argv = calloc(io->argc + io->nenv + 4, sizeof *argv);
    size_t argc = 0;
    bool workdir = io->workdir && *io->workdir;
    if (argv && (io->nenv > 0 || workdir)) {
        argv[argc++] = "env";
        if (workdir) {
            argv[argc++] = "-C";
            argv[argc++] = io->workdir;
        }
        for (size_t i = 0; i < io->nenv; i++)
            argv[argc++] = io->env[i];
    }
    for (size_t i = 0; argv && i < io->argc; i++)
        argv[argc++] = io->argv[i];
    char uuid[VIR_UUID_STRING_BUFLEN];
    wk_guest_target t;
    char *out = NULL;
    size_t out_len = 0;
    int rc =
        argv ? guest_target(v, id, uuid, &t, st) : pv_status_set(st, PV_INTERNAL, "out of memory");
    int left = deadline > 0 ? (int)(deadline - pv_time_mono_ms()) : 0;
    if (rc == PV_OK)
        rc = wk_guest_exec(v->guest, &t, argv, argc, in, in_len,
                           deadline > 0 && left < 1 ? 1 : left, exit_code, &out, &out_len, st);
    if (rc == PV_OK && out_len > 0) rc = io->output(io->ctx, 1, out, out_len, st);
    PV_FREE(out, in, argv);
    return rc;
}

/* Runs argv in the guest; a non-zero exit fails with code and the command's output. */
static int guest_run(wk_virt *v, const wk_guest_target *t, const char *const *argv, size_t argc,
                     int code_on_failure, pv_status *st) {
    int exit_code = -1;
    char *out = NULL;
    size_t len = 0;
    int rc = wk_guest_exec(v->guest, t, argv, argc, NULL, 0, WK_ENGINE_AGENT_WAIT_MS, &exit_code,
                           &out, &len, st);
    if (rc == PV_OK && exit_code != 0) {
        if (out) out[strcspn(out, "\n")] = '\0';
        rc = pv_status_set(st, code_on_failure, "workload %s: %s exited with %d: %.300s", t->id,
                           argv[0], exit_code, out ? out : "");
    }
    free(out);
    return rc;
}

static int virt_put_file(void *impl, const char *id, const char *path, const void *data, size_t len,
                         int mode, int uid, int gid, pv_status *st) {
    wk_virt *v = impl;
    if (!path || path[0] != '/')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "path \"%s\": a file in a guest is named by its absolute path",
                             path ? path : "");
    char uuid[VIR_UUID_STRING_BUFLEN], octal[16], owner[40];
    wk_guest_target t;
    if (guest_target(v, id, uuid, &t, st) != PV_OK) return st->code;
    int rc = wk_guest_write_file(v->guest, &t, path, data, len, st);
    snprintf(octal, sizeof octal, "%o", (unsigned)mode & 07777);
    const char *chmod_argv[] = {"chmod", octal, path};
    if (rc == PV_OK) rc = guest_run(v, &t, chmod_argv, 3, PV_INTERNAL, st);
    snprintf(owner, sizeof owner, "%d:%d", uid, gid < 0 ? uid : gid);
    const char *chown_argv[] = {"chown", owner, path};
    if (rc == PV_OK && uid >= 0) rc = guest_run(v, &t, chown_argv, 3, PV_INTERNAL, st);
    return rc;
}

/* Copy: tar(1) in the guest into a scratch file there, read back in chunks, then removed. */
static int virt_get_tar(void *impl, const char *id, const char *path, char **tar, size_t *len,
                        pv_status *st) {
    wk_virt *v = impl;
    if (!path || path[0] != '/' || strcmp(path, "/") == 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "path \"%s\": a file or directory in a guest is named by its "
                             "absolute path",
                             path ? path : "");
    char uuid[VIR_UUID_STRING_BUFLEN], scratch[64], dir[PATH_MAX], base[PATH_MAX];
    wk_guest_target t;
    if (guest_target(v, id, uuid, &t, st) != PV_OK) return st->code;
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(base, sizeof base, "%s", path);
    unsigned int nonce = (unsigned int)pv_time_now_ms() ^ (unsigned int)getpid();
    snprintf(scratch, sizeof scratch, "/tmp/.pivirt-copy-%08x.tar", nonce);
    const char *tar_argv[] = {"tar", "-c", "-f", scratch, "-C", dirname(dir), basename(base)};
    int rc = guest_run(v, &t, tar_argv, 7, PV_NOT_FOUND, st);
    if (rc == PV_NOT_FOUND) pv_status_prefix(st, "path %s", path);
    if (rc == PV_OK) rc = wk_guest_read_file(v->guest, &t, scratch, WK_FILES_TAR_MAX, tar, len, st);
    const char *rm_argv[] = {"rm", "-f", scratch};
    pv_status rst;
    guest_run(v, &t, rm_argv, 3, PV_INTERNAL, &rst);
    return rc;
}

/* The console logs' time index, one tick per WK_ENGINE_LOG_INDEX_MS until close. */
static void *index_thread(void *arg) {
    wk_virt *v = arg;
    json_t *sizes = json_object();
    pthread_mutex_lock(&v->index_mu);
    while (!v->stopping) {
        pthread_mutex_unlock(&v->index_mu);
        wk_virt_vm_index_tick(v->state_dir, sizes, pv_time_now_ms());
        int64_t at = pv_time_mono_ms() + WK_ENGINE_LOG_INDEX_MS;
        struct timespec until = {(time_t)(at / 1000), (long)(at % 1000) * 1000000L};
        pthread_mutex_lock(&v->index_mu);
        while (!v->stopping && pthread_cond_timedwait(&v->index_cv, &v->index_mu, &until) == 0)
            ;
    }
    pthread_mutex_unlock(&v->index_mu);
    json_decref(sizes);
    return NULL;
}

static int start_indexer(wk_virt *v, pv_status *st) {
    pthread_mutex_init(&v->index_mu, NULL);
    if (pv_time_cond_init(&v->index_cv) != 0 ||
        pthread_create(&v->indexer, NULL, index_thread, v) != 0) {
        pthread_mutex_destroy(&v->index_mu);
        return pv_status_set(st, PV_INTERNAL, "the console logs' index thread: %s",
                             strerror(errno));
    }
    v->indexing = true;
    return PV_OK;
}

static void stop_indexer(wk_virt *v) {
    if (!v->indexing) return;
    pthread_mutex_lock(&v->index_mu);
    v->stopping = true;
    pthread_cond_signal(&v->index_cv);
    pthread_mutex_unlock(&v->index_mu);
    pthread_join(v->indexer, NULL);
    pthread_cond_destroy(&v->index_cv);
    pthread_mutex_destroy(&v->index_mu);
    v->indexing = false;
}

/* The path of the console log's index of workload c->id into c->path. */
static int log_index_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    read_call *c = arg;
    char *idx = c->path;
    idx[0] = '\0';
    virDomainPtr d = NULL;
    json_t *meta = NULL;
    int rc = find_domain(v, c->id, &d, &meta, st);
    const char *log = json_string_value(json_object_get(meta, "log"));
    if (log && *log) wk_virt_vm_index_path(log, idx, PATH_MAX);
    json_decref(meta);
    if (d) virDomainFree(d);
    return rc;
}

static int virt_log_range(void *impl, const char *id, int64_t since_ms, int64_t until_ms,
                          int64_t *start, int64_t *end, pv_status *st) {
    *start = 0;
    *end = -1;
    char idx[PATH_MAX] = "";
    read_call c = {.id = id, .path = idx};
    int rc = with_conn(impl, log_index_try, &c, "log", st);
    if (rc == PV_OK && !idx[0])
        rc = pv_status_set(st, PV_UNIMPLEMENTED, "workload %s has no console log", id);
    if (rc == PV_OK && wk_log_index_range(idx, since_ms, until_ms, start, end, st) != PV_OK)
        rc = pv_status_prefix(st, "workload %s", id);
    return rc;
}

/* ---- facts ------------------------------------------------------------------------------ */

static void bump(json_t *o, const char *key, json_int_t by) {
    json_object_set_new(o, key, json_integer(json_integer_value(json_object_get(o, key)) + by));
}

/* One domain of ours into facts: its state, live vcpus and memory (bytes) under workloads[id],
 * and the totals of the running ones. */
static void add_domain_fact(virDomainPtr d, const json_t *meta, json_t *facts, json_t *wls) {
    virDomainInfo info;
    int vs = 0, reason = 0;
    if (virDomainGetInfo(d, &info) < 0 || virDomainGetState(d, &vs, &reason, 0) < 0) return;
    wk_state ws = map_state(vs, reason, meta);
    /* stopped through the API (virt_stop records when) or by itself (a guest's poweroff: exit
     * code 0), or killed (destroyed behind pivirt's back, QEMU gone: the audit's
     * WL_NOT_RUNNING) */
    json_int_t started = json_integer_value(json_object_get(meta, "started_ms"));
    json_int_t finished = json_integer_value(json_object_get(meta, "finished_ms"));
    json_object_set_new(wls, json_string_value(json_object_get(meta, "id")),
                        json_pack("{s:s, s:s, s:i, s:I, s:i, s:b}", "domain", virDomainGetName(d),
                                  "state", state_name(ws), "vcpus", (int)info.nrVirtCpu, "memory",
                                  (json_int_t)info.memory * 1024, "exit_code",
                                  ws == WK_STATE_STOPPED ? exit_code_of(vs, reason) : 0,
                                  "stopped_by_api",
                                  ws == WK_STATE_STOPPED && finished > 0 && finished >= started));
    bump(facts, "domains", 1);
    if (ws != WK_STATE_RUNNING && ws != WK_STATE_PAUSED) return;
    bump(facts, "running", 1);
    bump(facts, "running_vcpus", (json_int_t)info.nrVirtCpu);
    bump(facts, "running_memory", (json_int_t)info.memory * 1024);
}

/* What the node's agent reports of its libvirt (Node.info's "virt"): the driver and versions,
 * the domain type, and the domains of this engine as libvirt has them now. */
static int facts_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    char **out = ((read_call *)arg)->text;
    free(*out); /* an earlier attempt's */
    *out = NULL;
    unsigned long hv = 0, lib = 0;
    if (virConnectGetVersion(v->conn, &hv) < 0 || virConnectGetLibVersion(v->conn, &lib) < 0)
        err_reset(v);
    char *uri = virConnectGetURI(v->conn);
    const char *driver = virConnectGetType(v->conn);
    json_t *wls = json_object();
    json_t *facts =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:o}", "uri", uri ? uri : "",
                  "driver", driver ? driver : "", "hypervisor_version", "", "libvirt_version", "",
                  "domain_type", v->dom_type, "domains", 0, "running", 0, "running_vcpus", 0,
                  "running_memory", (json_int_t)0, "workloads", wls);
    free(uri);
    char ver[32];
    for (int i = 0; facts && i < 2; i++) {
        unsigned long x = i ? lib : hv;
        snprintf(ver, sizeof ver, "%lu.%lu.%lu", x / 1000000, x / 1000 % 1000, x % 1000);
        json_object_set_new(facts, i ? "libvirt_version" : "hypervisor_version", json_string(ver));
    }
    virDomainPtr *doms = NULL;
    int n = facts ? virConnectListAllDomains(v->conn, &doms, 0) : 0;
    int rc = !facts ? no_memory(st) : n < 0 ? lv_fail(v, st, "virConnectListAllDomains") : PV_OK;
    for (int i = 0; i < n; i++) {
        json_t *meta = meta_load(v, doms[i], 0);
        if (meta) add_domain_fact(doms[i], meta, facts, wls);
        json_decref(meta);
        virDomainFree(doms[i]);
    }
    free(doms);
    err_reset(v); /* a domain undefined while listed is not a failure of the report */
    if (rc == PV_OK && !(*out = json_dumps(facts, JSON_COMPACT | JSON_SORT_KEYS)))
        rc = no_memory(st);
    json_decref(facts);
    return rc;
}

static int virt_facts(void *impl, char **out, pv_status *st) {
    *out = NULL;
    read_call c = {.text = out};
    /* the agent's heartbeat asks: it must not wait for libvirtd (the next beat asks again) */
    int rc = with_conn_wait(impl, facts_try, &c, "facts", 0, st);
    if (rc != PV_OK) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* The engine's handle: on QEMU also a connection for the guest agents and the console logs'
 * index, and the unpacked images the domains no longer use are collected. */
static int virt_open(const char *uri, const wk_engine_opts *opts, void **impl, pv_status *st) {
    wk_virt *v = NULL;
    *impl = NULL;
    int rc = wk_virt_open(uri, opts, &v, st);
    if (rc == PV_OK && v->qemu && (rc = wk_guest_open(uri, &v->guest, st)) != PV_OK) {
        wk_virt_close(v);
        return rc;
    }
    /* before the indexer, which writes the logs' indexes */
    if (rc == PV_OK && v->qemu && v->state_dir[0]) collect_images(v, true);
    if (rc == PV_OK && v->qemu && v->state_dir[0] && (rc = start_indexer(v, st)) != PV_OK) {
        wk_virt_close(v);
        return rc;
    }
    *impl = v;
    return rc;
}

static void virt_close(void *impl) {
    wk_virt_close(impl);
}

const wk_engine_vtbl wk_engine_virt_vtbl = {
    .type = "virt",
    .open = virt_open,
    .close = virt_close,
    .create = virt_create,
    .start = virt_start,
    .stop = virt_stop,
    .pause = virt_pause,
    .resume = virt_resume,
    .remove = virt_remove,
    .inspect = virt_inspect,
    .list = virt_list,
    .exec = virt_exec,
    .exec_io = virt_exec_io,
    .set_limits = virt_set_limits,
    .set_limits_how = virt_set_limits_how,
    .put_file = virt_put_file,
    .get_tar = virt_get_tar,
    .log_range = virt_log_range,
    .facts = virt_facts,
};

/* ---- networks ------------------------------------------------------------------------------ */

void wk_virt_network_array_free(wk_virt_network *nets, size_t n) {
    for (size_t i = 0; nets && i < n; i++) {
        free(nets[i].name);
        free(nets[i].bridge);
        strv_free(nets[i].subnets, nets[i].nsubnets);
    }
    free(nets);
}

void wk_virt_link_clear(wk_virt_link *l) {
    if (!l) return;
    free(l->network);
    free(l->mac);
    strv_free(l->subnets, l->nsubnets);
    memset(l, 0, sizeof *l);
}

/* The subnets of network net (named name) from its XML. */
static int net_subnets(wk_virt *v, virNetworkPtr net, const char *name, char ***subnets, size_t *n,
                       pv_status *st) {
    char *xml = virNetworkGetXMLDesc(net, 0);
    if (!xml) return lv_fail(v, st, "network %s: virNetworkGetXMLDesc", name);
    int rc = network_subnets(xml, subnets, n, st);
    free(xml);
    return rc != PV_OK ? pv_status_prefix(st, "network %s", name) : PV_OK;
}

static int fill_network(wk_virt *v, virNetworkPtr net, wk_virt_network *out, pv_status *st) {
    const char *name = virNetworkGetName(net);
    out->name = xstrdup(name);
    out->active = virNetworkIsActive(net) == 1;
    char *bridge = virNetworkGetBridgeName(net);
    if (!bridge) err_reset(v); /* forward modes such as macvtap have no bridge of their own */
    out->bridge = xstrdup(bridge);
    free(bridge);
    if (net_subnets(v, net, name, &out->subnets, &out->nsubnets, st) != PV_OK) return st->code;
    if (!out->name || !out->bridge) return no_memory(st);
    return PV_OK;
}

typedef struct networks_call {
    wk_virt_network **out;
    size_t *n;
} networks_call;

static int networks_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    networks_call *c = arg;
    wk_virt_network_array_free(*c->out, *c->n); /* an earlier attempt's */
    wk_virt_network **out = c->out;
    size_t *n = c->n;
    *out = NULL;
    *n = 0;
    virNetworkPtr *nets = NULL;
    int nn = virConnectListAllNetworks(v->conn, &nets, 0);
    int rc = nn < 0 ? lv_fail(v, st, "virConnectListAllNetworks") : PV_OK;
    wk_virt_network *arr = rc == PV_OK ? calloc(nn > 0 ? (size_t)nn : 1, sizeof *arr) : NULL;
    if (rc == PV_OK && !arr) rc = no_memory(st);
    size_t filled = 0;
    for (int i = 0; i < nn; i++) {
        if (rc == PV_OK) {
            rc = fill_network(v, nets[i], &arr[i], st);
            filled = (size_t)i + 1;
        }
        virNetworkFree(nets[i]);
    }
    free(nets);
    if (rc != PV_OK) {
        wk_virt_network_array_free(arr, filled);
        return rc;
    }
    *out = arr;
    *n = (size_t)nn;
    return PV_OK;
}

int wk_virt_list_networks(wk_virt *v, wk_virt_network **out, size_t *n, pv_status *st) {
    *out = NULL;
    *n = 0;
    networks_call c = {out, n};
    int rc = with_conn(v, networks_try, &c, "list networks", st);
    if (rc != PV_OK) {
        wk_virt_network_array_free(*out, *n);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

/* The domain's XML: the persistent definition (inactive) or the running one. */
static char *dom_xml(wk_virt *v, virDomainPtr d, bool inactive) {
    unsigned int flags = inactive ? VIR_DOMAIN_XML_INACTIVE : 0;
    char *xml = virDomainGetXMLDesc(d, flags | VIR_DOMAIN_XML_SECURE);
    if (!xml) {
        err_reset(v); /* a read-only user may not see secrets; the plain XML is enough */
        xml = virDomainGetXMLDesc(d, flags);
    }
    return xml;
}

/* The MACs of the interfaces on network in domain XML xml (NULL: none) into *macs (caller frees
 * with strv_free). */
static int macs_on(const char *xml, const char *network, char ***macs, size_t *n, pv_status *st) {
    *macs = NULL;
    *n = 0;
    if (!xml) return PV_OK;
    wk_xml *x;
    int rc = wk_xml_parse(xml, &x, st);
    if (rc != PV_OK) return rc;
    iface *fs = NULL;
    size_t nf = 0;
    rc = ifaces_read(x, &fs, &nf, st);
    if (rc == PV_OK && nf > 0 && !(*macs = calloc(nf, sizeof **macs))) rc = no_memory(st);
    for (size_t i = 0; rc == PV_OK && i < nf; i++) {
        if (!iface_on(&fs[i], network) || !fs[i].mac) continue;
        (*macs)[(*n)++] = fs[i].mac;
        fs[i].mac = NULL;
    }
    ifaces_free(fs, nf);
    wk_xml_free(x);
    return rc;
}

static bool strv_has(char **v, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(v[i], s) == 0) return true;
    return false;
}

/* An edit of a domain's XML; *changed when it changed anything. */
typedef int (*dom_edit)(wk_xml *x, const char *arg, bool *changed, pv_status *st);

/* Rewrites d's persistent definition with edit(arg) applied: what every driver can do
 * (virDomainDefineXML), for drivers without device attach/detach. */
static int redefine_with(wk_virt *v, const char *id, virDomainPtr d, dom_edit edit, const char *arg,
                         pv_status *st) {
    char *xml = dom_xml(v, d, true);
    if (!xml) return lv_fail(v, st, "workload %s: virDomainGetXMLDesc", id);
    wk_xml *x = NULL;
    char *nx = NULL;
    bool changed = false;
    int rc = wk_xml_parse(xml, &x, st);
    free(xml);
    if (rc == PV_OK) rc = edit(x, arg, &changed, st);
    if (rc != PV_OK) {
        pv_status_prefix(st, "workload %s", id);
        goto done;
    }
    if (!changed) goto done;
    if (!(nx = wk_xml_dump(x, NULL))) {
        rc = no_memory(st);
        goto done;
    }
    virDomainPtr nd = virDomainDefineXML(v->conn, nx);
    if (!nd) {
        rc = lv_fail(v, st, "workload %s: virDomainDefineXML (updated definition)", id);
        goto done;
    }
    virDomainFree(nd);
done:
    free(nx);
    wk_xml_free(x);
    return rc;
}

/* dom_edit: appends the device XML dev to <devices>. */
static int add_device(wk_xml *x, const char *dev, bool *changed, pv_status *st) {
    wk_xml_node *devices = wk_xml_first(x, NULL, "/domain/devices");
    if (!devices) return pv_status_set(st, PV_INTERNAL, "no <devices> in its XML");
    *changed = true;
    return wk_xml_append(x, devices, dev, st);
}

/* dom_edit: removes the interfaces on network. */
static int cut_ifaces(wk_xml *x, const char *network, bool *changed, pv_status *st) {
    iface *fs;
    size_t n;
    int rc = ifaces_read(x, &fs, &n, st);
    if (rc != PV_OK) return rc;
    for (size_t i = 0; i < n; i++) {
        if (!iface_on(&fs[i], network)) continue;
        wk_xml_remove(fs[i].node);
        *changed = true;
    }
    ifaces_free(fs, n);
    return PV_OK;
}

/* Adds the device ifxml to d's persistent definition. */
static int persist_attach(wk_virt *v, const char *id, virDomainPtr d, const char *ifxml,
                          pv_status *st) {
    if (virDomainAttachDeviceFlags(d, ifxml, VIR_DOMAIN_AFFECT_CONFIG) == 0) return PV_OK;
    if (err_code() != VIR_ERR_NO_SUPPORT && err_code() != VIR_ERR_OPERATION_UNSUPPORTED)
        return lv_fail(v, st, "workload %s: virDomainAttachDeviceFlags (config)", id);
    err_reset(v);
    return redefine_with(v, id, d, add_device, ifxml, st);
}

/* The DHCP <host> of network XML nxml whose mac is mac, as XML (caller frees), or NULL. */
static char *dhcp_host_of(const char *nxml, const char *mac) {
    wk_xml *x;
    pv_status st;
    if (wk_xml_parse(nxml, &x, &st) != PV_OK) return NULL;
    wk_xml_node **hosts;
    size_t n;
    char *out = NULL;
    if (wk_xml_find(x, NULL, "/network/ip/dhcp/host", &hosts, &n) == 0) {
        for (size_t i = 0; !out && i < n; i++) {
            char *m = wk_xml_text(x, hosts[i], "@mac");
            if (m && strcasecmp(m, mac) == 0) out = wk_xml_dump(x, hosts[i]);
            free(m);
        }
        free(hosts);
    }
    wk_xml_free(x);
    return out;
}

static unsigned int net_flags(virNetworkPtr net) {
    unsigned int f = VIR_NETWORK_UPDATE_AFFECT_CONFIG;
    if (virNetworkIsActive(net) == 1) f |= VIR_NETWORK_UPDATE_AFFECT_LIVE;
    return f;
}

static int reserve_ipv4(wk_virt *v, virNetworkPtr net, const char *mac, const char *ipv4,
                        pv_status *st) {
    char *host = NULL;
    if (asprintf(&host, "<host mac='%s' ip='%s'/>", mac, ipv4) < 0) return no_memory(st);
    int r = virNetworkUpdate(net, VIR_NETWORK_UPDATE_COMMAND_ADD_LAST,
                             VIR_NETWORK_SECTION_IP_DHCP_HOST, -1, host, net_flags(net));
    free(host);
    if (r < 0)
        return lv_fail(v, st, "ipv4: reserving %s on network %s", ipv4, virNetworkGetName(net));
    return PV_OK;
}

/* The network's persistent XML; drivers without that flag (test:///default) keep one
 * definition, so their plain XML is the same thing. */
static char *net_xml_inactive(wk_virt *v, virNetworkPtr net) {
    char *xml = virNetworkGetXMLDesc(net, VIR_NETWORK_XML_INACTIVE);
    if (!xml && (err_code() == VIR_ERR_INVALID_ARG || err_code() == VIR_ERR_NO_SUPPORT)) {
        err_reset(v);
        xml = virNetworkGetXMLDesc(net, 0);
    }
    return xml;
}

/* Drops the DHCP host reservation of mac on net, if it has one. */
static int release_mac(wk_virt *v, virNetworkPtr net, const char *mac, pv_status *st) {
    char *nxml = net_xml_inactive(v, net);
    if (!nxml) return lv_fail(v, st, "network %s: virNetworkGetXMLDesc", virNetworkGetName(net));
    char *host = dhcp_host_of(nxml, mac);
    free(nxml);
    if (!host) return PV_OK;
    int r = virNetworkUpdate(net, VIR_NETWORK_UPDATE_COMMAND_DELETE,
                             VIR_NETWORK_SECTION_IP_DHCP_HOST, -1, host, net_flags(net));
    free(host);
    if (r < 0)
        return lv_fail(v, st, "network %s: releasing the address of %s", virNetworkGetName(net),
                       mac);
    return PV_OK;
}

/* each_iface: {mac: network} into out (a json object) for an interface on a libvirt network. */
static void add_network_mac(const iface *f, void *out) {
    if (f->type && strcmp(f->type, "network") == 0 && f->mac && f->source)
        json_object_set_new(out, f->mac, json_string(f->source));
}

/* {mac: network} of d's interfaces on libvirt networks, persistent and live (a new reference;
 * NULL when out of memory). */
static json_t *network_macs(wk_virt *v, virDomainPtr d) {
    json_t *out = json_object();
    for (int pass = 0; out && pass < (dom_active(v, d) ? 2 : 1); pass++) {
        char *xml = dom_xml(v, d, pass == 0);
        if (!xml) err_reset(v);
        each_iface(xml, add_network_mac, out);
        free(xml);
    }
    return out;
}

/* Drops the DHCP host reservations (ConnectNetwork's ipv4) of the interfaces macs
 * (network_macs) of workload id's domain, which is going away. A network that is gone took its
 * reservations with it; a release that fails is logged, and the remove goes on: the domain's
 * removal is what was asked. */
static void release_addresses(wk_virt *v, const char *id, const json_t *macs) {
    const char *mac;
    json_t *network;
    json_object_foreach((json_t *)macs, mac, network) {
        virNetworkPtr net = virNetworkLookupByName(v->conn, json_string_value(network));
        pv_status st;
        if (!net)
            err_reset(v);
        else if (release_mac(v, net, mac, &st) != PV_OK)
            pv_warn("workload %s: the address reserved for %s on network %s stays: %s", id, mac,
                    json_string_value(network), st.msg);
        if (net) virNetworkFree(net);
    }
}

static int link_fill(virNetworkPtr net, const char *network, const char *mac, bool live,
                     wk_virt_link *out, wk_virt *v, pv_status *st) {
    out->live = live;
    out->network = xstrdup(network);
    out->mac = xstrdup(mac);
    if (net_subnets(v, net, network, &out->subnets, &out->nsubnets, st) != PV_OK) return st->code;
    if (!out->network || !out->mac) return no_memory(st);
    return PV_OK;
}

/* Fails with ALREADY_EXISTS when d has an interface on network, live or persistent. */
static int check_not_connected(wk_virt *v, const char *id, virDomainPtr d, const char *network,
                               bool active, pv_status *st) {
    for (int pass = 0; pass < (active ? 2 : 1); pass++) {
        char *xml = dom_xml(v, d, pass == 0);
        if (!xml) return lv_fail(v, st, "workload %s: virDomainGetXMLDesc", id);
        char **macs;
        size_t n;
        int rc = macs_on(xml, network, &macs, &n, st);
        free(xml);
        if (rc != PV_OK) return pv_status_prefix(st, "workload %s", id);
        strv_free(macs, n);
        if (n > 0)
            return pv_status_set(st, PV_ALREADY_EXISTS,
                                 "workload %s is already connected to network %s", id, network);
    }
    return PV_OK;
}

static int attach_iface(wk_virt *v, const char *id, virDomainPtr d, const char *ifxml, bool active,
                        bool *live, pv_status *st) {
    *live = false;
    if (active) {
        unsigned int f = VIR_DOMAIN_AFFECT_LIVE | VIR_DOMAIN_AFFECT_CONFIG;
        if (virDomainAttachDeviceFlags(d, ifxml, f) == 0) {
            *live = true;
            return PV_OK;
        }
        if (err_code() != VIR_ERR_NO_SUPPORT && err_code() != VIR_ERR_OPERATION_UNSUPPORTED)
            return lv_fail(v, st, "workload %s: virDomainAttachDeviceFlags (hot-plug)", id);
        err_reset(v); /* no hot-plug here: the next start picks the interface up */
    }
    return persist_attach(v, id, d, ifxml, st);
}

static int connect_locked(wk_virt *v, const char *id, virDomainPtr d, virNetworkPtr net,
                          const char *network, const char *ipv4, wk_virt_link *out, pv_status *st) {
    bool active = dom_active(v, d);
    int rc = check_not_connected(v, id, d, network, active, st);
    if (rc != PV_OK) return rc;
    char mac[18];
    random_mac(mac);
    bool reserved = ipv4 && *ipv4;
    if (reserved && (rc = reserve_ipv4(v, net, mac, ipv4, st)) != PV_OK) return rc;
    char *ifxml = NULL;
    if (asprintf(&ifxml,
                 "<interface type='network'><mac address='%s'/><source network='%s'/>"
                 "<model type='virtio'/></interface>",
                 mac, network) < 0)
        return no_memory(st);
    bool live = false;
    rc = attach_iface(v, id, d, ifxml, active, &live, st);
    free(ifxml);
    if (rc != PV_OK) {
        pv_status keep;
        if (reserved) release_mac(v, net, mac, &keep);
        return rc;
    }
    return link_fill(net, network, mac, live, out, v, st);
}

static bool valid_network_name(const char *s) {
    return s && *s && !strchr(s, '\'') && !strchr(s, '<') && !strchr(s, '&');
}

static int disconnect_locked(wk_virt *v, const char *id, virDomainPtr d, virNetworkPtr net,
                             const char *network, bool force, wk_virt_link *out, pv_status *st);

/* What ConnectNetwork or DisconnectNetwork asks of on_network. */
typedef struct net_call {
    bool connect;
    const char *ipv4; /* connect: the address asked for, or NULL */
    bool force;       /* disconnect: answer even when not connected */
} net_call;

/* Runs a connect or disconnect of workload id's domain on network under the engine's lock;
 * *out cleared on failure. */
static int on_network(wk_virt *v, const char *id, const char *network, const net_call *c,
                      wk_virt_link *out, pv_status *st) {
    lock(v);
    virDomainPtr d = NULL;
    int rc = find_domain(v, id, &d, NULL, st);
    virNetworkPtr net = NULL;
    if (rc == PV_OK && !(net = virNetworkLookupByName(v->conn, network)))
        rc = lv_fail(v, st, "network %s", network);
    if (rc == PV_OK)
        rc = c->connect ? connect_locked(v, id, d, net, network, c->ipv4, out, st)
                        : disconnect_locked(v, id, d, net, network, c->force, out, st);
    if (net) virNetworkFree(net);
    if (d) virDomainFree(d);
    unlock(v);
    if (rc != PV_OK) wk_virt_link_clear(out);
    return rc;
}

int wk_virt_connect_network(wk_virt *v, const char *id, const char *network, const char *ipv4,
                            const char *ipv6, wk_virt_link *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    if (!valid_network_name(network))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "network: \"%s\" is not a network name",
                             network ? network : "");
    if (ipv6 && *ipv6)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "ipv6: %s: the virt engine cannot reserve IPv6 addresses (libvirt's "
                             "DHCPv6 hosts are not keyed by MAC)",
                             ipv6);
    unsigned char a4[4];
    if (ipv4 && *ipv4 && inet_pton(AF_INET, ipv4, a4) != 1)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "ipv4: \"%s\" is not an IPv4 address", ipv4);
    return on_network(v, id, network, &(net_call){.connect = true, .ipv4 = ipv4}, out, st);
}

/* Cuts the interfaces on network out of d's persistent definition. */
static int persist_detach(wk_virt *v, const char *id, virDomainPtr d, const char *network,
                          pv_status *st) {
    return redefine_with(v, id, d, cut_ifaces, network, st);
}

/* Detaches the interface mac (of type network) with flags; *unsupported when the driver has
 * no device detach. */
static int detach_mac(wk_virt *v, const char *id, virDomainPtr d, const char *network,
                      const char *mac, unsigned int flags, bool *unsupported, pv_status *st) {
    char *ifxml = NULL;
    *unsupported = false;
    /* QEMU's driver parses the device before matching it: a network interface needs its source */
    if (asprintf(&ifxml,
                 "<interface type='network'><mac address='%s'/><source network='%s'/></interface>",
                 mac, network) < 0)
        return no_memory(st);
    int r = virDomainDetachDeviceFlags(d, ifxml, flags);
    free(ifxml);
    if (r == 0) return PV_OK;
    if (err_code() == VIR_ERR_NO_SUPPORT || err_code() == VIR_ERR_OPERATION_UNSUPPORTED) {
        err_reset(v);
        *unsupported = true;
        return PV_OK;
    }
    return lv_fail(v, st, "workload %s: virDomainDetachDeviceFlags %s", id, mac);
}

static int disconnect_locked(wk_virt *v, const char *id, virDomainPtr d, virNetworkPtr net,
                             const char *network, bool force, wk_virt_link *out, pv_status *st) {
    bool active = dom_active(v, d);
    char *pxml = dom_xml(v, d, true), *lxml = active ? dom_xml(v, d, false) : NULL;
    char **pm = NULL, **lm = NULL;
    size_t np = 0, nl = 0;
    int rc = PV_OK;
    if (!pxml || (active && !lxml))
        rc = lv_fail(v, st, "workload %s: virDomainGetXMLDesc", id);
    else if (macs_on(pxml, network, &pm, &np, st) != PV_OK ||
             macs_on(lxml, network, &lm, &nl, st) != PV_OK)
        rc = pv_status_prefix(st, "workload %s", id);
    free(pxml);
    free(lxml);
    if (rc == PV_OK && np == 0 && nl == 0) {
        if (force)
            rc = link_fill(net, network, "", false, out, v, st);
        else
            rc = pv_status_set(st, PV_NOT_FOUND, "workload %s is not connected to network %s", id,
                               network);
        goto done;
    }
    bool live = false, unsupported = false, persist_left = np > 0;
    for (size_t i = 0; rc == PV_OK && i < nl; i++) {
        bool in_config = strv_has(pm, np, lm[i]);
        unsigned int f = VIR_DOMAIN_AFFECT_LIVE | (in_config ? VIR_DOMAIN_AFFECT_CONFIG : 0);
        rc = detach_mac(v, id, d, network, lm[i], f, &unsupported, st);
        if (rc == PV_OK && !unsupported) live = true;
    }
    /* Either nothing was hot-unplugged (the next start drops it) or some were only persistent:
     * what is left in the definition is cut out of it */
    if (rc == PV_OK && persist_left) rc = persist_detach(v, id, d, network, st);
    for (size_t i = 0; rc == PV_OK && i < np; i++)
        rc = release_mac(v, net, pm[i], st);
    for (size_t i = 0; rc == PV_OK && i < nl; i++)
        if (!strv_has(pm, np, lm[i])) rc = release_mac(v, net, lm[i], st);
    if (rc == PV_OK) rc = link_fill(net, network, nl ? lm[0] : pm[0], live, out, v, st);
done:
    strv_free(pm, np);
    strv_free(lm, nl);
    return rc;
}

int wk_virt_disconnect_network(wk_virt *v, const char *id, const char *network, bool force,
                               wk_virt_link *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    if (!valid_network_name(network))
        return pv_status_set(st, PV_INVALID_ARGUMENT, "network: \"%s\" is not a network name",
                             network ? network : "");
    return on_network(v, id, network, &(net_call){.force = force}, out, st);
}

/* ---- raw operations ---------------------------------------------------------------------- */

static const char *dom_state_name(int s) {
    static const char *const names[] = {"nostate",  "running", "blocked", "paused",
                                        "shutdown", "shutoff", "crashed", "pmsuspended"};
    return s >= 0 && s < (int)(sizeof names / sizeof names[0]) ? names[s] : "unknown";
}

static int raw_dominfo(wk_virt *v, const char *id, virDomainPtr d, char **out, pv_status *st) {
    virDomainInfo info;
    if (virDomainGetInfo(d, &info) < 0) return lv_fail(v, st, "workload %s: virDomainGetInfo", id);
    char uuid[VIR_UUID_STRING_BUFLEN] = "";
    virDomainGetUUIDString(d, uuid);
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:I, s:i, s:I}", "name", virDomainGetName(d),
                          "uuid", uuid, "state", dom_state_name(info.state), "max_memory_kib",
                          (json_int_t)info.maxMem, "memory_kib", (json_int_t)info.memory, "vcpus",
                          (int)info.nrVirtCpu, "cpu_time_ns", (json_int_t)info.cpuTime);
    *out = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return *out ? PV_OK : no_memory(st);
}

typedef struct raw_call {
    const char *id, *op;
    const json_t *params;
    char **out;
} raw_call;

static int raw_try(wk_virt *v, void *arg, int attempt, pv_status *st) {
    (void)attempt;
    raw_call *c = arg;
    const char *id = c->id, *op = c->op;
    const json_t *params = c->params;
    char **out = c->out;
    free(*out); /* an earlier attempt's */
    *out = NULL;
    virDomainPtr d;
    int rc = find_domain(v, id, &d, NULL, st);
    if (rc != PV_OK) return rc;
    if (strcmp(op, "domain_xml") == 0) {
        *out = dom_xml(v, d, json_is_true(json_object_get(params, "inactive")));
        if (!*out) rc = lv_fail(v, st, "workload %s: virDomainGetXMLDesc", id);
    } else if (strcmp(op, "dominfo") == 0) {
        rc = raw_dominfo(v, id, d, out, st);
    } else {
        bool reboot = strcmp(op, "reboot") == 0;
        if ((reboot ? virDomainReboot(d, 0) : virDomainReset(d, 0)) < 0)
            rc = lv_fail(v, st, "workload %s: %s", id,
                         reboot ? "virDomainReboot" : "virDomainReset");
        else if (asprintf(out, "{\"done\":true,\"op\":\"%s\"}", op) < 0)
            rc = no_memory(st);
    }
    virDomainFree(d);
    return rc;
}

int wk_virt_raw(wk_virt *v, const char *id, const char *op, const char *params_json, char **out,
                pv_status *st) {
    *out = NULL;
    static const char *const ops[] = {"domain_xml", "dominfo", "reboot", "reset"};
    size_t k;
    for (k = 0; op && k < sizeof ops / sizeof ops[0]; k++)
        if (strcmp(op, ops[k]) == 0) break;
    if (!op || k == sizeof ops / sizeof ops[0])
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "op: unknown raw operation \"%s\" (domain_xml, dominfo, reboot, "
                             "reset)",
                             op ? op : "");
    json_error_t je;
    json_t *params = params_json && *params_json ? json_loads(params_json, 0, &je) : json_object();
    if (!json_is_object(params)) {
        json_decref(params);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "params: not a JSON object (%s)",
                             params_json && *params_json ? je.text : "out of memory");
    }
    raw_call c = {id, op, params, out};
    int rc;
    if (k < 2) { /* reads: any attempt may run again */
        rc = with_conn(v, raw_try, &c, op, st);
    } else { /* a reboot or a reset done twice is not one: a lost connection fails it */
        lock(v);
        rc = raw_try(v, &c, 0, st);
        unlock(v);
    }
    if (rc != PV_OK) {
        free(*out);
        *out = NULL;
    }
    json_decref(params);
    return rc;
}
