/*
 * ck_audit: one pass over the whole state of a pivirt system, reporting every place where two
 * things that must agree do not:
 *   ops           operation records vs their queue streams: an unfinished operation whose entry
 *                 is neither waiting nor delivered-unacknowledged (and that waits for no retry)
 *                 is lost; a waiting or pending entry of an operation without a record; a
 *                 finished operation's entry still pending past the grace; a lock held by a
 *                 finished or missing operation
 *   reservations  each node's recorded usage vs the sum of its reserved allocations and its
 *                 workloads' resources (pv_resv_check_node, GetNodeResource's diff; a document
 *                 that does not parse is a difference too); reserved allocations of no
 *                 reservation; reservations expired past the grace and not released; a
 *                 workload's allocation still reserved (counted twice)
 *   workloads     records vs indexes (all, per node) and nodes; per-workload keys (status,
 *                 deploy options, volume set) left without a record; on nodes whose process
 *                 engine keeps its state on this machine (<data_dir>/engine/<node>): each record
 *                 has an engine workload, each engine workload in state running has its process
 *                 (pid and start time) and none that should run was killed behind the system's
 *                 back, each engine workload has a record (orphans; unregistered nodes' engine
 *                 directories too; a workload DissociateWorkload marked is let go on purpose)
 *   storage       volumes IN_USE have an existing holder and their holder key agrees with the
 *                 record; snapshots' volumes, parents and a volume's current snapshot exist; in
 *                 DIR pools of nodes on this machine: each volume's file exists with the
 *                 recorded format and each snapshot's qcow2 tag exists in it (qemu-img
 *                 snapshot -l); DIR and NFS pools of nodes on this machine whose directory is
 *                 outside the storage roots or reached through a link (POOL_OUTSIDE_ROOTS)
 *   clusters      pods' index and node sets vs node records, nodes' pods; unfinished upgrades'
 *                 nodes exist and their operation is still unfinished
 * What needs a node's machine is checked only for nodes whose agent keeps its data in data_dir
 * here; the others get a note saying so.
 *
 * The pass reads without locking anything: a change in flight can show as a difference, which
 * is why callers confirm with a second pass (ck_report_keep_seen). Nothing is written. Only a
 * failure to read Redis ends a pass with an error; what does not parse is a difference.
 */
#ifndef CK_AUDIT_H
#define CK_AUDIT_H

#include <stdint.h>

#include "ck_report.h"
#include "pv_config.h"
#include "pv_keys.h"
#include "pv_redis.h"
#include "pv_status.h"

typedef struct ck_opts {
    const pv_config *cfg; /* data_dir, storage.default_node (borrowed) */
    int64_t grace_ms;     /* how long a finished operation's entry may stay pending and an
                             expired reservation unreleased before it is a difference */
} ck_opts;

/* Fills out (zeroed by the caller) with what one pass finds. PV_OK, or the code of a failure to
 * read (Redis away): then out holds what was found so far and the caller reports the error. */
int ck_audit_run(pv_redis *r, const pv_keys *k, const ck_opts *o, ck_report *out, pv_status *st);

#endif
