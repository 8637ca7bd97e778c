/*
 * pv_cluster: see pv_cluster.h.
 */
#include "pv_cluster.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <jansson.h>
#include <string.h>

/* a decimal number without a leading zero (0 itself is fine); advances *p */
static bool number(const char **p) {
    const char *s = *p;
    if (!isdigit((unsigned char)*s)) return false;
    if (*s == '0' && isdigit((unsigned char)s[1])) return false;
    int n = 0;
    while (isdigit((unsigned char)*s) && n < 9)
        s++, n++;
    if (isdigit((unsigned char)*s)) return false;
    *p = s;
    return true;
}

int pv_cluster_check_version(const char *field, const char *v, pv_status *st) {
    const char *p = v ? v : "";
    if (*p == 'v' && (p++, number(&p)) && *p++ == '.' && number(&p) && *p++ == '.' && number(&p) &&
        *p == '\0')
        return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: \"%s\" is not a version like v1.2.3 (vMAJOR.MINOR.PATCH)", field,
                         v ? v : "");
}

int pv_cluster_check_ip(const char *field, const char *ip, pv_status *st) {
    unsigned char buf[16];
    if (ip && (inet_pton(AF_INET, ip, buf) == 1 || inet_pton(AF_INET6, ip, buf) == 1)) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: \"%s\" is not an IPv4 or IPv6 address",
                         field, ip ? ip : "");
}

pv_node_state pv_cluster_node_state(const pv_node *n) {
    if (n->bypass) return PV_NODE_CORDONED;
    return n->alive ? PV_NODE_READY : PV_NODE_NOT_READY;
}

pv_cluster_state pv_cluster_state_of(const pv_pod *p, const pv_node *nodes, size_t n) {
    int cp_up = 0, workers_up = 0, up = 0, down = 0;
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].alive) {
            down++;
            continue;
        }
        up++;
        if (nodes[i].role && strcmp(nodes[i].role, "control-plane") == 0)
            cp_up++;
        else
            workers_up++;
    }
    bool complete = up > 0 && cp_up >= p->cp_nodes && workers_up >= p->worker_nodes;
    if (!complete) return p->formed_ms > 0 ? PV_CLUSTER_DEGRADED : PV_CLUSTER_CREATING;
    return down ? PV_CLUSTER_DEGRADED : PV_CLUSTER_RUNNING;
}

bool pv_cluster_complete(const pv_pod *p, const pv_node *nodes, size_t n) {
    int cp_up = 0, workers_up = 0;
    for (size_t i = 0; i < n; i++) {
        if (!nodes[i].alive) continue;
        if (nodes[i].role && strcmp(nodes[i].role, "control-plane") == 0)
            cp_up++;
        else
            workers_up++;
    }
    return cp_up + workers_up > 0 && cp_up >= p->cp_nodes && workers_up >= p->worker_nodes;
}

bool pv_cluster_labels_match(const char *have, const char *want) {
    if (!want || !*want || strcmp(want, "{}") == 0) return true;
    json_t *h = json_loads(have ? have : "{}", 0, NULL), *w = json_loads(want, 0, NULL);
    bool ok = json_is_object(w);
    const char *key;
    json_t *v;
    json_object_foreach(w, key, v) {
        const char *got = json_string_value(json_object_get(h, key));
        if (!got || !json_is_string(v) || strcmp(got, json_string_value(v)) != 0) ok = false;
    }
    json_decref(h);
    json_decref(w);
    return ok;
}
