/* Fuzz target: JSON from a client (pvcli's request bodies, anything read with pv_pbjson) into
 * messages of every API and back. Whatever the bytes, no crash, no leak, and a message that
 * was read writes back to JSON that reads again. Cluster and deploy requests then go through
 * the gateway's checks of their counts (any int32, 2^31-1 included): what passes makes an
 * upgrade plan whose batches stay within the cluster's nodes. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "pb/core.pb-c.h"
#include "pivirt/cluster/v1/cluster.pb-c.h"
#include "pivirt/storage/v1/storage.pb-c.h"
#include "pv_cluster.h"
#include "pv_deploy.h"
#include "pv_pbjson.h"
#include "pv_upgrade.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NODES 8 /* the cluster an upgrade is checked against */

static void check_upgrade(const Pivirt__Cluster__V1__UpgradeClusterRequest *r) {
    const Pivirt__Cluster__V1__UpgradeStrategy *s = r->strategy;
    if (!s) return;
    pv_upgrade_strategy us = {.type = (pv_upgrade_type)s->type,
                              .max_surge = s->max_surge,
                              .max_unavailable = s->max_unavailable,
                              .partition = s->partition};
    pv_status st;
    if (pv_upgrade_check_strategy(&us, NODES, &st) != PV_OK) return;
    int batch[NODES], nbatches = 0;
    pv_upgrade_batches(&us, NODES, batch, &nbatches);
    if (nbatches < 0 || nbatches > NODES) __builtin_trap();
    for (size_t i = 0; i < NODES; i++)
        if (batch[i] < 0 || batch[i] > nbatches) __builtin_trap();
}

/* The gateway's checks of what was read; they must answer, never crash or overflow. */
static void check_message(const ProtobufCMessage *m) {
    pv_status st;
    if (m->descriptor == &pivirt__cluster__v1__upgrade_cluster_request__descriptor) {
        check_upgrade((const void *)m);
    } else if (m->descriptor == &pivirt__cluster__v1__create_cluster_request__descriptor) {
        const Pivirt__Cluster__V1__CreateClusterRequest *r = (const void *)m;
        if (r->topology)
            pv_cluster_check_topology(r->topology->control_plane_count, r->topology->worker_count,
                                      &st);
    } else if (m->descriptor == &pb__deploy_options__descriptor) {
        pv_deploy_check((const Pb__DeployOptions *)m, &st);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const ProtobufCMessageDescriptor *const types[] = {
        &pivirt__cluster__v1__upgrade_cluster_request__descriptor,
        &pivirt__cluster__v1__create_cluster_request__descriptor,
        &pivirt__storage__v1__create_pool_request__descriptor,
        &pivirt__storage__v1__volume__descriptor,
        &pb__deploy_options__descriptor,
    };
    if (size < 1) return 0;
    const ProtobufCMessageDescriptor *d = types[data[0] % (sizeof types / sizeof types[0])];
    json_t *j = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    if (!j) return 0;
    ProtobufCMessage *m = NULL;
    pv_status st;
    if (pv_pbjson_from_json(d, j, &m, &st) == PV_OK) {
        check_message(m);
        json_t *back = pv_pbjson_to_json(m);
        ProtobufCMessage *again = NULL;
        if (pv_pbjson_from_json(d, back, &again, &st) != PV_OK) __builtin_trap();
        protobuf_c_message_free_unpacked(again, NULL);
        json_decref(back);
        protobuf_c_message_free_unpacked(m, NULL);
    }
    json_decref(j);
    return 0;
}
