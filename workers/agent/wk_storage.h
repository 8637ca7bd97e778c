/*
 * wk_storage: StorageService's mutations on the node agent of the host that holds the pool
 * (queue node:<name>), through libvirt (storage.libvirt_uri) and qemu-img. Each kind writes the
 * records of shared/pv_storage.h when it is done; the gateway waits for the operation and
 * answers the record.
 *
 *   storage.pool_create     {name, type, config}: defines the pool (libvirt name
 *                           "<prefix>-<name>", so several pivirt systems share one libvirtd),
 *                           builds (dir, netfs), starts and autostarts it; one libvirt cannot
 *                           define or start is recorded ERROR with the reason in
 *                           config.status_message. The pool's capacity, allocation and
 *                           available space are recorded after every change in it.
 *   storage.pool_delete     {name}: destroys and undefines it (the directory stays).
 *   storage.volume_create   {id, name, pool, size, format, labels}: thin volumes (allocation 0)
 *                           may overcommit the pool up to config.max_overcommit (20) times its
 *                           capacity, thick ones (LVM) must fit what is available.
 *   storage.volume_resize   {id, size}: grow only.
 *   storage.volume_clone    {source_id, id, name, pool}: an independent sparse copy: FICLONE
 *                           (reflink) where the file system has it, else only the data extents
 *                           (SEEK_DATA/SEEK_HOLE with copy_file_range), into a temporary file
 *                           renamed into place; other pool types through libvirt's copy.
 *   storage.volume_delete   {id}: the volume, its snapshots' records and its name.
 *   storage.snapshot_create {id, volume_id, name}: qcow2 volumes `qemu-img snapshot -c <id>`
 *                           (storage.qemu_img; not again when a redelivery finds it made),
 *                           volumes of LVM and RBD pools their own snapshot commands
 *                           (pv_storage_snapshot_argv); parent = the snapshot the volume is at.
 *   storage.snapshot_restore {snapshot_id}: `qemu-img snapshot -a`, LVM's dd, `rbd snap
 *                           rollback`; journaled on the volume's record (restoring, restore_op)
 *                           so that an agent killed at any point leaves the record at the old
 *                           snapshot and the next delivery completes it (see the .c).
 *   storage.snapshot_delete {id}: `qemu-img snapshot -d`, lvremove, `rbd snap rm`; its
 *                           children take its parent.
 * Snapshot commands die with the agent (setpriv --pdeathsig): a redelivery never races one.
 * A volume IN_USE refuses resize, delete, snapshot and restore (FAILED_PRECONDITION).
 * After every change in a pool (and when it starts) the volumes libvirt finds there without a
 * record are recorded: an iSCSI target's LUNs, an image copied into a directory pool.
 */
#ifndef WK_STORAGE_H
#define WK_STORAGE_H

#include "pv_status.h"
#include "wk_handler.h"

/* The handler of every storage.* kind (wk_op_context(op) is the node's wk_agent). */
int wk_storage_run(wk_op *op, pv_status *st);

/* Copies src to dst (created, mode 0600) as a sparse copy: a reflink where the file system
 * can, else only the data extents; *copied gets the bytes of data copied (0 for a reflink). */
int wk_storage_sparse_copy(const char *src, const char *dst, int64_t *copied, pv_status *st);

#endif
