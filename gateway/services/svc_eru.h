/*
 * svc_eru: what every pb.CoreRPC handler shares: Eru's per-call status codes (shared/eru NOTES:
 * each failing call answers with the code that identifies the call) and the conversions of its
 * map fields (labels: map<string,string>; resources: map<string,bytes>, one JSON document per
 * plugin) into the JSON objects the registry and the scheduler take.
 *
 * Ownership: the *_json functions return malloc'd strings the caller frees.
 */
#ifndef SVC_ERU_H
#define SVC_ERU_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>

#include "gw_server.h"
#include "pv_status.h"

enum {
    ERU_WATCH_SERVICE_STATUS = 1001,
    ERU_LIST_NETWORKS = 1011,
    ERU_CONNECT_NETWORK = 1012,
    ERU_DISCONNECT_NETWORK = 1013,
    ERU_ADD_POD = 1021,
    ERU_REMOVE_POD = 1022,
    ERU_GET_POD = 1023,
    ERU_LIST_PODS = 1024,
    ERU_GET_POD_RESOURCE = 1025,
    ERU_ADD_NODE = 1031,
    ERU_REMOVE_NODE = 1032,
    ERU_LIST_POD_NODES = 1033,
    ERU_GET_NODE = 1034,
    ERU_SET_NODE = 1035,
    ERU_SET_NODE_STATUS = 1036,
    ERU_GET_NODE_RESOURCE = 1037,
    ERU_GET_NODE_STATUS = 1038, /* also GetNodeEngineInfo */
    ERU_CALCULATE_CAPACITY = 1041,
    ERU_GET_WORKLOAD = 1051,
    ERU_GET_WORKLOADS = 1052,
    ERU_LIST_WORKLOADS = 1053,
    ERU_LIST_NODE_WORKLOADS = 1054,
    ERU_GET_WORKLOADS_STATUS = 1055,
    ERU_SET_WORKLOADS_STATUS = 1056,
    ERU_RAW_ENGINE = 1057,
    ERU_COPY = 1061,
    ERU_SEND = 1062,
    ERU_SEND_LARGE_FILE = 1063,
    ERU_BUILD_IMAGE = 1071,
    ERU_CACHE_IMAGE = 1072,
    ERU_REMOVE_IMAGE = 1073,
    ERU_CREATE_WORKLOAD = 1074,
    ERU_REPLACE_WORKLOAD = 1075,
    ERU_REMOVE_WORKLOAD = 1076,
    ERU_DISSOCIATE_WORKLOAD = 1077,
    ERU_CONTROL_WORKLOAD = 1078,
    ERU_EXECUTE_WORKLOAD = 1079,
    ERU_REALLOC_RESOURCE = 10710,
    ERU_LOG_STREAM = 10711,
    ERU_RUN_AND_WAIT = 10712,
    ERU_LIST_IMAGE = 10713,
};

/* Map fields arrive as protobuf-c's generated *_Entry messages (base, key, value); entries is the
 * field's array of pointers to them, whichever message they belong to (a map<string,string>
 * entry read as pv_pbmap_entry). */

/* A map<string,string> as a compact JSON object with
 * sorted keys. field names the field in messages. */
int svc_eru_labels_json(const char *field, void *const *entries, size_t n, char **out,
                        pv_status *st);

/* A map<string,bytes> of plugin -> JSON document as one JSON object; each document must be a
 * JSON object (the plugins check their own fields later). */
int svc_eru_resources_json(const char *field, void *const *entries, size_t n, char **out,
                           pv_status *st);

/* One served CoreRPC call: a bad request answers eru (0: the call is not in Eru's table, so the
 * standard INVALID_ARGUMENT). */
typedef struct svc_eru_method {
    const char *path;
    gw_method_kind kind;
    const ProtobufCMessageDescriptor *request;
    gw_handler_fn handler; /* client-stream and bidi calls: their gw_message_fn */
    int eru;
    /* the handler reads Redis (all but Info and the streams fed by followers with their own
     * connections): on a thread without one the framework answers (gw_method.needs_state) */
    bool needs_redis;
} svc_eru_method;

/* Registers the n calls of table with data as their method data. methods (n entries) is where
 * the server's gw_method records live: the caller's storage, as long-lived as the server.
 * Returns 0 or -1. */
int svc_eru_register(gw_server *server, const svc_eru_method *table, size_t n, gw_method *methods,
                     void *data);

/* Whether every wanted label (map<string,string> entries) is in labels_json (a JSON object of
 * strings) with the same value. No wanted labels: true. */
bool svc_eru_labels_match(const char *labels_json, void *const *want, size_t n_want);

#endif
