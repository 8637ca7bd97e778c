/*
 * svc_core_net: pb.CoreRPC's ListNetworks, ConnectNetwork, DisconnectNetwork and RawEngine.
 * They exist on virt:// nodes (libvirt networks, named raw operations: workers/wk_node_net.h),
 * one operation on the node's agent each; on the process engine, which uses the host's network
 * only, they answer UNIMPLEMENTED saying so, as Eru's engines that lack them do.
 *
 * Ownership: svc_core_net_new allocates, svc_core_net_free frees; it outlives the server.
 */
#ifndef SVC_CORE_NET_H
#define SVC_CORE_NET_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_net svc_core_net;

svc_core_net *svc_core_net_new(gw_app *app);
void svc_core_net_free(svc_core_net *s);
int svc_core_net_register(svc_core_net *s, gw_server *server);

#endif
