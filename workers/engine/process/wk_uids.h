/*
 * wk_uids: user ids of their own for process workloads ("dynamic" users, as systemd's
 * DynamicUser), so that two workloads can neither signal each other nor read each other's
 * files.
 *
 * A uid is claimed host-wide, not per agent: several agents may run on one machine, each with
 * its own engine. A claim is a file <dir>/<uid> holding its owner's path (the workload's home
 * directory); it is taken and given back under flock(<dir>/.lock). A claim whose owner path
 * no longer exists is stale (an agent killed between removing a workload and releasing its
 * uid, or a data directory wiped) and is taken over, so claims never leak for good.
 *
 * No threads or child processes of its own; callers may call from any thread (the lock is
 * the file's).
 */
#ifndef WK_UIDS_H
#define WK_UIDS_H

#include <sys/types.h>

#include "pv_status.h"

/* "1879048192-1879113727" into [*min, *max]: INVALID_ARGUMENT naming the value unless 0 < min <=
 * max. */
int wk_uids_parse_range(const char *range, uid_t *min, uid_t *max, pv_status *st);

/* Claims a free uid of [min, max] for owner (an absolute path), starting from a place derived
 * from key (the workload id) so that ids spread over the range; *uid is the one claimed.
 * RESOURCE_EXHAUSTED when every uid is held by a live owner. dir is created (0700) when
 * missing. */
int wk_uids_claim(const char *dir, uid_t min, uid_t max, const char *key, const char *owner,
                  uid_t *uid, pv_status *st);

/* Claims uid again for owner (an agent adopting its workloads after a restart, or a reboot
 * that emptied /run): PV_OK when it is owner's or free, FAILED_PRECONDITION naming the other
 * owner when another live owner holds it. */
int wk_uids_reclaim(const char *dir, uid_t uid, const char *owner, pv_status *st);

/* Gives uid back when owner holds it (nothing otherwise). */
void wk_uids_release(const char *dir, uid_t uid, const char *owner);

#endif
