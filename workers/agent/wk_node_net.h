/*
 * wk_node_net: the network RPCs and RawEngine on a virt node's agent (wk_engine_virt.h):
 *   net.list_on_node        {}                           -> {type=network, name, subnets (JSON)}*
 *   net.connect_on_node     {id, network, ipv4, ipv6}     -> {type=network, name, subnets, live}
 *   net.disconnect_on_node  {id, network, force}          -> {type=done, live}
 *   raw.on_node             {id, op, params}              -> {type=raw, data}
 * A failure fails the operation with the engine's code and message (one attempt: the gateway
 * submits them with max_attempts 1). Agents of other engines fail them UNIMPLEMENTED.
 */
#ifndef WK_NODE_NET_H
#define WK_NODE_NET_H

#include "pv_status.h"
#include "wk_handler.h"

wk_op_handler wk_node_net_list, wk_node_net_connect, wk_node_net_disconnect, wk_node_net_raw;

#endif
