/*
 * wk_virt_conn: reopening a libvirt connection whose daemon went away (see wk_virt_conn.h).
 */
#include "wk_virt_conn.h"

#include <stddef.h>

#include "pv_log.h"

virConnectPtr wk_virt_conn_open(const char *uri, virErrorFunc fn, void *arg) {
    virConnectPtr c = virConnectOpen(uri);
    if (c)
        virConnSetErrorFunc(c, arg, fn);
    else
        virResetLastError();
    return c;
}

bool wk_virt_conn_revive(virConnectPtr *conn, const char *uri, virErrorFunc fn, void *arg) {
    if (!*conn || virConnectIsAlive(*conn) == 1) return false;
    virConnectPtr fresh = wk_virt_conn_open(uri, fn, arg);
    if (!fresh) return false;
    virConnSetErrorFunc(*conn, NULL, NULL);
    virConnectClose(*conn);
    *conn = fresh;
    virResetLastError();
    pv_info("libvirt %s: the connection was closed (libvirtd restarted?): reconnected", uri);
    return true;
}

bool wk_virt_conn_lost(const virError *err) {
    if (!err) return false;
    if (err->code == VIR_ERR_NO_CONNECT) return true;
    return err->domain == VIR_FROM_RPC &&
           (err->code == VIR_ERR_SYSTEM_ERROR || err->code == VIR_ERR_INTERNAL_ERROR);
}
