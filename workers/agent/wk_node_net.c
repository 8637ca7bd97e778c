/*
 * wk_node_net: libvirt networks and raw operations on a virt node (see wk_node_net.h).
 */
#include "wk_node_net.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "wk_agent.h"
#include "wk_engine.h"
#include "wk_engine_virt.h"

/* The docker engine has networks of its own (wk_engine_networks and the others). */
static wk_engine *docker_of(wk_op *op) {
    wk_agent *a = wk_op_context(op);
    wk_engine *e = a ? wk_agent_engine(a) : NULL;
    return e && strcmp(wk_engine_type(e), "docker") == 0 ? e : NULL;
}

static wk_virt *virt_of(wk_op *op, pv_status *st) {
    wk_agent *a = wk_op_context(op);
    wk_virt *v = wk_agent_virt(a);
    if (!v)
        pv_status_set(st, PV_UNIMPLEMENTED,
                      "node %s runs the %s engine: networks and raw operations need a virt:// "
                      "node",
                      a ? wk_agent_node(a) : "?",
                      a && wk_agent_engine(a) ? wk_engine_type(wk_agent_engine(a)) : "no");
    return v;
}

static char *subnets_json(char **subnets, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_string(subnets[i]));
    char *text = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    return text;
}

static int network_entry(wk_op *op, const char *name, char **subnets, size_t n, const char *live,
                         pv_status *st) {
    char *sj = subnets_json(subnets, n);
    const char *fields[] = {"type", "name", "subnets", "live"};
    const char *values[] = {"network", name, sj ? sj : "[]", live};
    int rc = wk_op_output(op, 4, fields, values, st);
    free(sj);
    return rc;
}

int wk_node_net_list(wk_op *op, pv_status *st) {
    wk_engine *docker = docker_of(op);
    wk_virt *v = docker ? NULL : virt_of(op, st);
    if (!docker && !v) return st->code;
    wk_engine_network *dn = NULL; /* the docker engine's networks, or libvirt's */
    wk_virt_network *vn = NULL;
    size_t n = 0;
    if ((docker ? wk_engine_networks(docker, &dn, &n, st)
                : wk_virt_list_networks(v, &vn, &n, st)) != PV_OK)
        return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        rc = dn ? network_entry(op, dn[i].name, dn[i].subnets, dn[i].nsubnets, "", st)
                : network_entry(op, vn[i].name, vn[i].subnets, vn[i].nsubnets, "", st);
    if (dn)
        wk_engine_network_array_free(dn, n);
    else
        wk_virt_network_array_free(vn, n);
    return rc;
}

int wk_node_net_connect(wk_op *op, pv_status *st) {
    if (docker_of(op)) {
        wk_engine_network net;
        if (wk_engine_connect(docker_of(op), wk_op_param(op, "id"), wk_op_param(op, "network"),
                              wk_op_param(op, "ipv4"), wk_op_param(op, "ipv6"), &net, st) != PV_OK)
            return st->code;
        int rc = network_entry(op, net.name, net.subnets, net.nsubnets, "1", st);
        wk_engine_network_clear(&net);
        return rc;
    }
    wk_virt *v = virt_of(op, st);
    if (!v) return st->code;
    wk_virt_link l = {0};
    if (wk_virt_connect_network(v, wk_op_param(op, "id"), wk_op_param(op, "network"),
                                wk_op_param(op, "ipv4"), wk_op_param(op, "ipv6"), &l, st) != PV_OK)
        return st->code;
    int rc = network_entry(op, l.network, l.subnets, l.nsubnets, l.live ? "1" : "0", st);
    wk_virt_link_clear(&l);
    return rc;
}

int wk_node_net_disconnect(wk_op *op, pv_status *st) {
    const char *force = wk_op_param(op, "force");
    if (docker_of(op)) {
        if (wk_engine_disconnect(docker_of(op), wk_op_param(op, "id"), wk_op_param(op, "network"),
                                 force && strcmp(force, "true") == 0, st) != PV_OK)
            return st->code;
        const char *fields[] = {"type", "live"}, *values[] = {"done", "1"};
        return wk_op_output(op, 2, fields, values, st);
    }
    wk_virt *v = virt_of(op, st);
    if (!v) return st->code;
    wk_virt_link l = {0};
    if (wk_virt_disconnect_network(v, wk_op_param(op, "id"), wk_op_param(op, "network"),
                                   force && strcmp(force, "true") == 0, &l, st) != PV_OK)
        return st->code;
    const char *fields[] = {"type", "live"}, *values[] = {"done", l.live ? "1" : "0"};
    int rc = wk_op_output(op, 2, fields, values, st);
    wk_virt_link_clear(&l);
    return rc;
}

int wk_node_net_raw(wk_op *op, pv_status *st) {
    if (docker_of(op)) /* as Eru's docker engine: ErrEngineNotImplemented */
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "RawEngine: engine not implemented (the docker engine has no raw "
                             "operations)");
    wk_virt *v = virt_of(op, st);
    if (!v) return st->code;
    char *out = NULL;
    if (wk_virt_raw(v, wk_op_param(op, "id"), wk_op_param(op, "op"), wk_op_param(op, "params"),
                    &out, st) != PV_OK)
        return st->code;
    const char *fields[] = {"type", "data"}, *values[] = {"raw", out};
    int rc = wk_op_output(op, 2, fields, values, st);
    free(out);
    return rc;
}
