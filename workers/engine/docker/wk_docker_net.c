/*
 * wk_docker_net: the daemon's networks for ListNetworks, ConnectNetwork and DisconnectNetwork
 * (see wk_engine.h "networks of the engine's own"): GET /networks, POST
 * /networks/{name}/connect with the workload's container and the address asked for, POST
 * /networks/{name}/disconnect. A network is named by its name or id, as Docker takes either.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wk_engine_docker.h"

/* name and subnets of a network's inspect (IPAM.Config[].Subnet). */
static int network_of(json_t *j, wk_engine_network *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    json_t *configs = json_object_get(json_object_get(j, "IPAM"), "Config");
    out->name = strdup(json_string_value(json_object_get(j, "Name")) ?: "");
    out->subnets = calloc(json_array_size(configs) + 1, sizeof *out->subnets);
    if (!out->name || !out->subnets) {
        wk_engine_network_clear(out);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    size_t i;
    json_t *c;
    json_array_foreach(configs, i, c) {
        const char *subnet = json_string_value(json_object_get(c, "Subnet"));
        if (subnet && (out->subnets[out->nsubnets] = strdup(subnet))) out->nsubnets++;
    }
    return PV_OK;
}

int wk_docker_networks(void *impl, wk_engine_network **out, size_t *n, pv_status *st) {
    wk_docker *d = impl;
    *out = NULL;
    *n = 0;
    json_t *list = NULL;
    if (wk_docker_json(d->api, "GET", "/networks", NULL, &list, "list networks", st) != PV_OK)
        return st->code;
    wk_engine_network *v = calloc(json_array_size(list) + 1, sizeof *v);
    int rc = v ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t i;
    json_t *j;
    json_array_foreach(list, i, j) {
        if (rc != PV_OK) break;
        if ((rc = network_of(j, &v[*n], st)) == PV_OK) (*n)++;
    }
    json_decref(list);
    if (rc != PV_OK) {
        wk_engine_network_array_free(v, *n);
        *n = 0;
        return rc;
    }
    *out = v;
    return PV_OK;
}

/* POST /networks/{network}/<verb> with body; what names the call in errors. */
static int network_call(wk_docker *d, const char *network, const char *verb, json_t *body,
                        pv_status *st) {
    char *esc = wk_docker_escape(network), path[600], what[600];
    snprintf(path, sizeof path, "/networks/%s/%s", esc ? esc : "", verb);
    free(esc);
    snprintf(what, sizeof what, "%s network %s", verb, network);
    int rc = wk_docker_json(d->api, "POST", path, body, NULL, what, st);
    json_decref(body);
    return rc;
}

int wk_docker_connect(void *impl, const char *id, const char *network, const char *ipv4,
                      const char *ipv6, wk_engine_network *out, pv_status *st) {
    wk_docker *d = impl;
    memset(out, 0, sizeof *out);
    char cid[72];
    if (!network || !*network) return pv_status_set(st, PV_INVALID_ARGUMENT, "network: required");
    if (wk_docker_resolve(d, id, cid, st) != PV_OK) return st->code;
    json_t *ipam = json_object();
    if (ipv4 && *ipv4) json_object_set_new(ipam, "IPv4Address", json_string(ipv4));
    if (ipv6 && *ipv6) json_object_set_new(ipam, "IPv6Address", json_string(ipv6));
    json_t *body =
        json_pack("{s:s, s:{s:o}}", "Container", cid, "EndpointConfig", "IPAMConfig", ipam);
    if (network_call(d, network, "connect", body, st) != PV_OK) return st->code;
    wk_docker_refresh(d, id, cid); /* a network event: the stream follows containers only */
    char *esc = wk_docker_escape(network), path[600];
    snprintf(path, sizeof path, "/networks/%s", esc ? esc : "");
    free(esc);
    json_t *j = NULL;
    if (wk_docker_json(d->api, "GET", path, NULL, &j, "inspect network", st) != PV_OK)
        return st->code;
    int rc = network_of(j, out, st);
    json_decref(j);
    return rc;
}

int wk_docker_disconnect(void *impl, const char *id, const char *network, bool force,
                         pv_status *st) {
    wk_docker *d = impl;
    char cid[72];
    if (!network || !*network) return pv_status_set(st, PV_INVALID_ARGUMENT, "network: required");
    if (wk_docker_resolve(d, id, cid, st) != PV_OK) return st->code;
    int rc = network_call(d, network, "disconnect",
                          json_pack("{s:s, s:b}", "Container", cid, "Force", force), st);
    if (rc == PV_OK) wk_docker_refresh(d, id, cid);
    return rc;
}
