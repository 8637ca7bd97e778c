/*
 * wk_virt_conn: reopening a libvirt connection whose daemon went away (see wk_virt_conn.h).
 */
#include "wk_virt_conn.h"

#include <stddef.h>

#include "pv_log.h"

bool wk_virt_conn_revive(virConnectPtr *conn, const char *uri, virErrorFunc fn, void *arg) {
    if (!*conn || virConnectIsAlive(*conn) == 1) return false;
    virConnectPtr fresh = virConnectOpen(uri);
    if (!fresh) {
        virResetLastError();
        return false;
    }
    virConnSetErrorFunc(fresh, arg, fn);
    virConnSetErrorFunc(*conn, NULL, NULL);
    virConnectClose(*conn);
    *conn = fresh;
    virResetLastError();
    pv_info("libvirt %s: the connection was closed (libvirtd restarted?): reconnected", uri);
    return true;
}
