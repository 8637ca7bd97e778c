/*
 * pv_storage: StorageService's model away from gRPC and libvirt: the checks of names and pool
 * configurations, the libvirt XML of each pool type, and the records of pools, volumes and
 * snapshots in Redis.
 *
 * Records are JSON documents (one writer at a time: the agent of the pool's node, holding the
 * operation's lock), with indexes kept in the same MULTI/EXEC:
 *   <prefix>{sto}:pool:<name>            pv_pool
 *   <prefix>{sto}:pools                  zset of pool names
 *   <prefix>{sto}:vol:<id>               pv_volume
 *   <prefix>{sto}:pool-vols:<pool>       zset of the pool's volume ids
 *   <prefix>{sto}:pool-names:<pool>      hash volume name -> id (names are unique in a pool)
 *   <prefix>{sto}:snap:<id>              pv_snapshot
 *   <prefix>{sto}:vol-snaps:<volume id>  zset of the volume's snapshot ids by creation time
 * Numbers are bytes; types, statuses and formats are the API's enum numbers. A document is
 * printed compact with sorted keys; the fields below are its keys, and one a record holds only
 * sometimes ("optional") is absent when unset. Each kind is decoded by pv_record through its
 * schema (pv_pool_schema, ...): a damaged field is PV_DATA_LOSS naming the key and the field,
 * and fields this build does not know are kept in `extra` and written back.
 *
 * Ownership: a record filled by pv_storage_get/list/find_volume owns its strings and JSON
 * values; pv_storage_free (pv_storage_array_free for a list) releases them.
 */
#ifndef PV_STORAGE_H
#define PV_STORAGE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "pv_keys.h"
#include "pv_record.h"
#include "pv_redis.h"
#include "pv_status.h"

enum { PV_POOL_DIR = 1, PV_POOL_LVM = 2, PV_POOL_ISCSI = 3, PV_POOL_NFS = 4, PV_POOL_RBD = 5 };
enum { PV_POOL_ACTIVE = 1, PV_POOL_INACTIVE = 2, PV_POOL_ERROR = 3 };
enum { PV_VOL_RAW = 1, PV_VOL_QCOW2 = 2, PV_VOL_VMDK = 3, PV_VOL_VDI = 4 };
enum { PV_VOL_CREATING = 1, PV_VOL_READY = 2, PV_VOL_IN_USE = 3, PV_VOL_ERROR = 4 };
enum { PV_SNAP_CREATING = 1, PV_SNAP_READY = 2, PV_SNAP_ERROR = 3 };

/* The largest max_overcommit a pool takes: past it "thin" means "unbounded". */
#define PV_STORAGE_OVERCOMMIT_MAX 1000.0

/* ---- the records ---- */

typedef struct pv_pool {
    char *name;
    int type, status;
    json_t *config; /* the checked config, an object of strings (and config.status_message:
                       why an ERROR pool failed); NULL when absent */
    char *node;     /* the node whose agent holds it */
    int64_t capacity, used, available;
    int64_t created_ms, updated_ms;
    char *libvirt_uuid; /* optional: the UUID of its libvirt definition (NULL: a record made
                           before they were kept) */
    json_t *extra;
} pv_pool;

typedef struct pv_volume {
    char *id, *name, *pool;
    int64_t size, used;
    int format, status;
    json_t *labels;         /* object of strings; NULL when absent */
    char *current_snapshot; /* "" before the first snapshot */
    int64_t created_ms, updated_ms;
    /* optional (NULL, false when absent): */
    char *path;        /* its file or device, as libvirt names it */
    bool imported;     /* found in the pool by libvirt, not made through the API */
    char *cloned_from; /* the source volume of a clone */
    char *in_use_by;   /* the workload that holds it (IN_USE) */
    char *restoring;   /* a restore to this snapshot is running or did not finish */
    char *restore_op;  /* the operation of the last restore */
    json_t *extra;
} pv_volume;

typedef struct pv_snapshot {
    char *id, *name, *volume_id;
    int64_t size;
    int status;
    char *parent; /* the snapshot it branches from, "" for none */
    int64_t created_ms, updated_ms;
    json_t *extra;
} pv_snapshot;

extern const pv_record_schema pv_pool_schema, pv_volume_schema, pv_snapshot_schema;

/* The record kinds: the struct a void *rec below is (pv_pool, pv_volume, pv_snapshot). */
typedef enum pv_sto_kind { PV_STO_POOL, PV_STO_VOL, PV_STO_SNAP } pv_sto_kind;

/* A plain name: [A-Za-z0-9._-], not starting with '-' or '.', at most 128 bytes, so no path
 * made from it leaves its pool. INVALID_ARGUMENT naming field and value. */
int pv_storage_check_name(const char *field, const char *name, pv_status *st);

/* The pool type's config keys: required ones present and well formed, no key the type does
 * not know (INVALID_ARGUMENT "config.<key>: ..."). Keys every type takes: node (the agent that
 * holds it), max_overcommit (a ratio >= 1, thin volumes' limit), status_message (ours). */
int pv_storage_check_pool(int type, json_t *config, pv_status *st);

/* libvirt's <pool> XML for the checked config (caller frees), with <uuid> when uuid (may be
 * NULL) is one. */
int pv_storage_pool_xml(const char *name, const char *uuid, int type, json_t *config, char **xml,
                        pv_status *st);

/* libvirt's name of a format ("raw", "qcow2", "vmdk", "vdi"); NULL when unknown. */
const char *pv_storage_format_name(int format);

/* ---- snapshots of each pool type ---- */

/* How a volume's snapshots are made: in an LVM pool with LVM snapshots, in an RBD pool with
 * RBD snapshots (whatever the volume's format: both work on the block device); elsewhere qcow2
 * volumes with qcow2 internal snapshots (qemu-img); PV_SNAPS_NONE for the rest (a RAW volume in
 * a DIR or NFS pool), which are refused FAILED_PRECONDITION. */
enum { PV_SNAPS_NONE = 0, PV_SNAPS_QCOW2 = 1, PV_SNAPS_LVM = 2, PV_SNAPS_RBD = 3 };
int pv_storage_snapshot_method(int pool_type, int format);

enum { PV_SNAP_CREATE = 1, PV_SNAP_RESTORE = 2, PV_SNAP_DELETE = 3 };

/* A command line: v[0..n-1] malloc'd strings, v[n] NULL (execv-ready); pv_argv_clear frees. */
#define PV_ARGV_MAX 16
typedef struct pv_argv {
    char *v[PV_ARGV_MAX + 1];
    size_t n;
    bool failed; /* a string could not be made (the builder then fails) */
} pv_argv;
void pv_argv_clear(pv_argv *a);

/* The command that does `what` (PV_SNAP_*) to snapshot snap_id of volume vol in pool (its
 * type and config), for LVM and RBD pools; pure: nothing runs.
 *   LVM  create   /sbin/lvcreate --snapshot --name <snap> --extents <P>%ORIGIN <vg>/<lv>
 *                 (P: the pool's config.snapshot_percent, 1..100; 100 by default: the
 *                 origin's size)
 *        restore  /bin/dd if=/dev/<vg>/<snap> of=/dev/<vg>/<lv> bs=4M conv=fsync status=none
 *                 (a copy, not lvconvert --merge, which would consume the snapshot: see .c)
 *        delete   /sbin/lvremove --yes <vg>/<snap>
 *   RBD  /usr/bin/rbd --id <user> -m <monitors> --no-progress snap create|rollback|rm
 *                 <pool>/<image>@<snap>   (the node's keyring for client.<user>)
 * Every name must be a plain name (FAILED_PRECONDITION naming it otherwise); another pool type
 * is FAILED_PRECONDITION. *out is the caller's to clear (zeroed on failure). */
int pv_storage_snapshot_argv(int what, const pv_pool *pool, const pv_volume *vol,
                             const char *snap_id, pv_argv *out, pv_status *st);

/* Whether a snapshot command that failed with this output had found its work done by an
 * earlier delivery of the operation (create: the snapshot exists; delete: it is gone), which
 * makes a retried create or delete idempotent (qcow2: a delete finding no such snapshot). Snapshot
 * names are their unique ids, so an existing one can only be this operation's. */
bool pv_storage_snapshot_done_before(int method, int what, const char *output);

/* ---- records ---- */

/* Fills *rec (zeroed first). NOT_FOUND "<what> <id> not found" (what: pool, volume,
 * snapshot); DATA_LOSS naming the key and field of a damaged record. */
int pv_storage_get(pv_redis *r, const pv_keys *k, pv_sto_kind kind, const char *id, void *rec,
                   pv_status *st);

/* Writes a record (its updated_ms set) and its index entries: a pool in pools; a volume in its
 * pool's set and name index; a snapshot in its volume's set. */
int pv_storage_put(pv_redis *r, const pv_keys *k, pv_sto_kind kind, void *rec, pv_status *st);

/* Removes a record and its index entries (missing is fine). */
int pv_storage_del(pv_redis *r, const pv_keys *k, pv_sto_kind kind, const void *rec, pv_status *st);

/* Releases what a record owns and zeroes it (a zeroed one is fine). */
void pv_storage_free(pv_sto_kind kind, void *rec);

/* Frees n records of a list, then the array. */
void pv_storage_array_free(pv_sto_kind kind, void *recs, size_t n);

/* The document of a record as it is stored (compact, sorted keys), for the caller to free;
 * NULL out of memory. */
char *pv_storage_dumps(pv_sto_kind kind, const void *rec);

/* Reserves a volume name in a pool for id: ALREADY_EXISTS naming the pool when another volume
 * has it (the same id again is fine). */
int pv_storage_claim_name(pv_redis *r, const pv_keys *k, const char *pool, const char *name,
                          const char *id, pv_status *st);
int pv_storage_release_name(pv_redis *r, const pv_keys *k, const char *pool, const char *name,
                            pv_status *st);

/* The names claimed in a pool as they are now, in one read: *names (caller decrefs) is an
 * object name -> id. */
int pv_storage_claimed_names(pv_redis *r, const pv_keys *k, const char *pool, json_t **names,
                             pv_status *st);

/* A volume by id, or by name when exactly one pool holds a volume of that name (NOT_FOUND
 * otherwise; INVALID_ARGUMENT asking for the id when several do). */
int pv_storage_find_volume(pv_redis *r, const pv_keys *k, const char *ref, pv_volume *out,
                           pv_status *st);

/* ---- volumes attached to workloads ---- */

/* Attaches volume vol_id to workload wl_id: the volume must be READY (or already this
 * workload's: a redelivery), and becomes IN_USE with in_use_by = wl_id. FAILED_PRECONDITION
 * naming the workload that holds it, or the snapshot a restore is taking it to. Keys:
 * <prefix>{sto}:vol-user:<vol id> (the holder, SET NX) and <prefix>{sto}:wl-vols:<wl id> (the
 * workload's volumes). */
int pv_storage_attach(pv_redis *r, const pv_keys *k, const char *vol_id, const char *wl_id,
                      pv_status *st);

/* Detaches every volume of workload wl_id (READY again). Nothing attached is fine. */
int pv_storage_detach_all(pv_redis *r, const pv_keys *k, const char *wl_id, pv_status *st);

/* Records listed by an index: every pool (owner NULL), the volumes of pool owner, the
 * snapshots of volume owner. *recs is an array of *n records of the kind in index order (NULL
 * when none), for pv_storage_array_free. */
int pv_storage_list(pv_redis *r, const pv_keys *k, pv_sto_kind kind, const char *owner, void **recs,
                    size_t *n, pv_status *st);

#endif
