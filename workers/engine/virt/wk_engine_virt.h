/*
 * wk_virt: the virt engine (workloads are libvirt domains) and what only it has: libvirt
 * networks (ListNetworks, ConnectNetwork, DisconnectNetwork) and named raw operations
 * (RawEngine).
 *
 * A wk_virt handle holds one libvirt connection for its lifetime and serialises its use with a
 * mutex; every function may be called from any thread. The lifecycle (create, start, ...) is
 * reached through wk_engine.h (wk_engine_open("virt://<uri>")), whose virt implementation is a
 * wk_virt; the functions below take a wk_virt of their own, opened with wk_virt_open on the same
 * URI: libvirt keeps the domains and networks in its driver, so both handles see the same ones.
 *
 * A workload's domain is found through its <metadata> element in the namespace WK_VIRT_XMLNS,
 * which holds a JSON object: {"id", "owner", "image", "labels", "started", "started_ms",
 * "finished_ms"}. Domains without it (another tool's, or the test driver's own "test") are
 * never touched, nor those whose owner (the creating engine's state directory) is not this
 * handle's: another agent's on the same libvirtd.
 *
 * Errors: pv_status codes as wk_engine.h says, the message holding libvirt's own message.
 * A call that loses its connection (libvirtd restarted or stopped: wk_virt_conn.h) runs again
 * on a new one once libvirtd answers, up to 4 times within 10 s of the first loss (a list and
 * the facts, asked every few seconds, take a new connection only if libvirtd answers at once,
 * without waiting); an attempt after the first takes what an earlier one did before its answer
 * was lost (a domain defined, started, stopped, suspended, resumed or undefined) as done.
 * libvirtd away longer fails it UNAVAILABLE naming the URI. Not run again: ConnectNetwork,
 * DisconnectNetwork and the raw "reboot" and "reset" (twice is not once); a lost connection fails
 * them UNAVAILABLE.
 */
#ifndef WK_ENGINE_VIRT_H
#define WK_ENGINE_VIRT_H

#include <stdbool.h>
#include <stddef.h>

#include "pv_status.h"
#include "wk_engine.h"

#define WK_VIRT_XMLNS "https://pivirt.io/xmlns/workload/1"
#define WK_VIRT_XMLNS_PREFIX "pivirt"

typedef struct wk_virt wk_virt;

/* Opens uri ("test:///default", "qemu:///system"); opts may be NULL (stop grace: 10 s). */
int wk_virt_open(const char *uri, const wk_engine_opts *opts, wk_virt **out, pv_status *st);
void wk_virt_close(wk_virt *v); /* leaves the domains as they are */

/* The workload state of a domain in libvirt's state vs (virDomainState) for reason (its
 * virDomain*Reason); started: the domain ever ran (a shut off domain that never did is CREATED).
 * A domain whose start is under way (paused, "starting up") is RUNNING: it runs as soon as
 * libvirt resumes it, and Eru's status says so (running), not paused. */
wk_state wk_virt_state_of(int vs, int reason, bool started);

/* A libvirt network. Owned by the array that holds it (wk_virt_network_array_free). */
typedef struct wk_virt_network {
    char *name;
    bool active;
    char *bridge;   /* "" when the network has no bridge of its own */
    char **subnets; /* CIDR of each <ip> of the network: "192.168.122.0/24" */
    size_t nsubnets;
} wk_virt_network;

/* Every network of the connection, active or not, in libvirt's order. */
int wk_virt_list_networks(wk_virt *v, wk_virt_network **out, size_t *n, pv_status *st);
void wk_virt_network_array_free(wk_virt_network *nets, size_t n);

/* What a connect or disconnect did. Filled by the call; wk_virt_link_clear frees it. */
typedef struct wk_virt_link {
    char *network;
    char *mac;      /* the interface's MAC address */
    bool live;      /* applied to the running domain now; false: in the persistent definition
                       only, the change applies at the domain's next start */
    char **subnets; /* the network's subnets (CIDR), as ConnectNetwork answers */
    size_t nsubnets;
} wk_virt_link;
void wk_virt_link_clear(wk_virt_link *l);

/* Adds an interface on network to workload id's domain: hot-plugged (live and persistent) when
 * the domain runs and the driver can hot-plug; otherwise only the persistent definition changes
 * (through virDomainAttachDeviceFlags CONFIG, or by redefining the domain when the driver has no
 * device attach at all, as test:///default). ipv4 (NULL or "": any) reserves that address for
 * the interface's MAC in the network's DHCP hosts. ipv6 is refused (INVALID_ARGUMENT): libvirt's
 * DHCPv6 hosts are not keyed by MAC. NOT_FOUND for an unknown workload or network,
 * ALREADY_EXISTS when the domain already has an interface on network. */
int wk_virt_connect_network(wk_virt *v, const char *id, const char *network, const char *ipv4,
                            const char *ipv6, wk_virt_link *out, pv_status *st);

/* Removes workload id's interfaces on network, the same way connect adds them, and the DHCP
 * host reservations of their MACs. NOT_FOUND when the domain has none on network, unless force
 * (then PV_OK with out->mac ""). */
int wk_virt_disconnect_network(wk_virt *v, const char *id, const char *network, bool force,
                               wk_virt_link *out, pv_status *st);

/* A named operation on workload id's domain, params a JSON object (NULL or "" = {}):
 *   "domain_xml" {"inactive": bool}  -> the domain's XML
 *   "dominfo"                        -> {"state", "max_memory_kib", "memory_kib", "vcpus",
 *                                        "cpu_time_ns"} (virDomainGetInfo)
 *   "reboot", "reset"                -> {"op": op, "done": true}
 * INVALID_ARGUMENT for any other op or params that are not a JSON object. *out is NUL-terminated
 * text the caller frees. */
int wk_virt_raw(wk_virt *v, const char *id, const char *op, const char *params_json, char **out,
                pv_status *st);

#endif
