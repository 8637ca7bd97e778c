/*
 * wk_virt_conn: a libvirt connection that outlives its daemon. libvirtd restarted (an upgrade, a
 * crash, an operator) closes every client's socket; the domains run on (their QEMU processes do
 * not depend on libvirtd), but each call on the old connection fails "client socket is closed"
 * from then on. The virt engine and its guest agent connection revive theirs before each use,
 * and the engine runs a call that lost its connection (wk_virt_conn_lost says which errors
 * mean that) again on a new one once libvirtd answers (wk_engine_virt.c, with_conn).
 *
 * wk_virt_conn_open gives a connection of its own to a call that may run long (a domain's
 * start), so that it does not hold up the calls queued behind it on a shared one.
 *
 * Ownership: *conn is the caller's; a revived one replaces it (the old one closed here).
 */
#ifndef WK_VIRT_CONN_H
#define WK_VIRT_CONN_H

#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <stdbool.h>

/* When *conn is no longer alive, opens uri again and puts the new connection, with error
 * handler fn(arg) installed, in its place. true when it did (logged); false when *conn was
 * alive or the daemon does not answer yet (*conn left as it was: its calls fail as before). */
bool wk_virt_conn_revive(virConnectPtr *conn, const char *uri, virErrorFunc fn, void *arg);

/* A new connection to uri with error handler fn(arg) installed (caller closes), or NULL. */
virConnectPtr wk_virt_conn_open(const char *uri, virErrorFunc fn, void *arg);

/* Whether err says the connection to the daemon is gone (not that the call was refused): an
 * error of libvirt's RPC layer (VIR_FROM_RPC) that is a system error (a socket's read or write
 * failed: "End of file while reading data", "Cannot write data: Broken pipe", "Cannot recv
 * data: Connection reset by peer") or an internal one ("client socket is closed": the
 * connection was closed before), or VIR_ERR_NO_CONNECT. Not the RPC layer's other errors
 * (VIR_ERR_RPC: a message too large to encode), which a new connection would meet again. */
bool wk_virt_conn_lost(const virError *err);

#endif
