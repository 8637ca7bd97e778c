/*
 * svc_relay: the relay the streaming CoreRPC calls share (CreateWorkload, RemoveWorkload,
 * ControlWorkload, ReplaceWorkload, Send, SendLargeFile, Copy, RunAndWait). A call submits one
 * operation per node (or a deploy whose ops worker announces its per-node children) and the
 * relay follows their output streams, answering the client one message per instance or id as
 * they come, and for every id a node's part ended without answering, a failure naming the cause.
 *
 * It polls, with short blocking reads, from the handler's pool thread: a relayed call holds one
 * gateway thread while it runs.
 *
 * Ownership: a svc_relay lives on the caller's stack; svc_relay_free frees what the relay
 * gathered (children, their buffers), not the relay itself; created and failures, when the
 * caller sets them (quiet relays), stay the caller's.
 */
#ifndef SVC_RELAY_H
#define SVC_RELAY_H

#include <jansson.h>

#include "gw_app.h"
#include "pb/core.pb-c.h"
#include "pv_op.h"

/* What a node's part answers for, so that an id it never answered gets the right message. */
typedef enum {
    SVC_RELAY_DEPLOY = 0,
    SVC_RELAY_REMOVE,
    SVC_RELAY_CONTROL,
    SVC_RELAY_SEND,
    SVC_RELAY_COPY,
    SVC_RELAY_REPLACE,
} svc_relay_kind;

/* How long a relay sleeps in XREAD for news of its operations. Their streams' end entries wake
 * it when they finish; this bounds the wait for an operation that ends without output (its
 * status is read again each time). */
#define SVC_RELAY_WAIT_MS 200

typedef struct svc_relay_child svc_relay_child;

typedef struct svc_relay {
    gw_call *call;
    pv_redis *r;
    const pv_keys *k;
    char parent[PV_ID_MAX];
    char parent_after[32];
    /* what the last wait saw of the parent: nothing new in its output (no announcement to
     * read), its end entry (its record is final: read it) */
    bool parent_idle, parent_ended, parent_checked;
    /* the parent was created by this call (not found by its x-request-id): its record and
     * its empty output are known without reading them */
    bool parent_fresh;
    pv_op_output *parent_pre; /* what the last wait read of the parent's output */
    size_t parent_npre;
    bool parent_fetched; /* parent_pre is all of it after parent_after (as child.fetched) */
    /* the parent announced itself as its one node's part (a plan on one node: the deploy went
     * on on that node's agent): from then on it is followed as that child only */
    bool folded;
    const char *pod;
    svc_relay_child *children;
    size_t n;
    size_t sent, failed;
    size_t plan_nodes; /* creates: the nodes of the plan, as the announcements tell (0: not told) */
    bool quiet;        /* RunAndWait: nothing goes to the client; created instances are kept */
    json_t *created;   /* quiet: [{"id", "node"}] of the instances created */
    json_t *failures;  /* quiet: the errors of the instances that failed */
    bool part;         /* its call has submitted already: every node's part is GW_SUBMIT_PART */
} svc_relay;

/* A relay of call's operations through r (the call's thread's connection); pod (borrowed)
 * names the pod in the failures of instances never reported. */
void svc_relay_init(svc_relay *rl, gw_call *call, pv_redis *r, const char *pod);

/* Submits the deploy o as the operation `workload.create` (the request's bytes), idempotent
 * with the client's x-request-id; rl->parent gets its id (rl->parent_fresh: created now). */
int svc_relay_submit_deploy(gw_call *call, const Pb__DeployOptions *o, svc_relay *rl,
                            pv_status *st);

/* Relays until the deploy and every node's part are over. PV_OK: everything was answered;
 * else the call's error in st (a deploy that failed before asking any node, PV_CANCELLED when
 * the client left). */
int svc_relay_run(svc_relay *rl, pv_status *st);

/* One node's part of a call: an operation of kind on that node's queue with params (borrowed),
 * followed like a deploy's child; ids (borrowed) are the workloads it answers for. */
int svc_relay_submit_child(gw_call *call, svc_relay *rl, const char *kind, const char *node,
                           json_t *params, json_t *ids, svc_relay_kind ck, pv_status *st);

/* Removal or control of the ids (borrowed) on one node. type NULL: a removal. */
int svc_relay_submit_node_op(gw_call *call, svc_relay *rl, const char *kind, const char *node,
                             json_t *ids, const char *type, bool force, pv_status *st);

/* Looks every workload up first. unknown NULL: an id that names no workload fails the call
 * before anything changes (Eru's groupWorkloadsByNode, as RemoveWorkload does); else
 * each such id is appended to unknown (borrowed array) as [id, why] and the others go on (Eru's
 * per-workload lookup: ControlWorkload, Send, Copy), the caller answering those per item.
 * *by_node (the caller's: json_decref): node name -> array of the ids there. */
int svc_relay_group_by_node(svc_relay *rl, char **ids, size_t n, json_t **by_node, json_t *unknown,
                            pv_status *st);

/* Finishes a per-node call after its children are submitted (rc: how submitting went): relays
 * them, ends the call (eru: the error code of a failure; what: the call's name in the log) and
 * frees the relay. */
void svc_relay_finish(gw_call *call, svc_relay *rl, int rc, pv_status *st, int eru,
                      const char *what);

void svc_relay_free(svc_relay *rl);

#endif
