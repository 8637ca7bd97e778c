/*
 * wk_virt_disk: which libvirt domain of a connection has a disk image as one of its disks, and
 * whether that domain runs. The storage agent asks before it snapshots, restores or clones a
 * volume (wk_storage.c): qemu-img and a file copy must never touch an image a running QEMU
 * holds open (a torn snapshot, a restore under a live guest's page cache), while a volume
 * attached to a domain that is shut off is the VM's disk between two runs, safe to act on.
 *
 * Every domain is looked at, pivirt's or not: any running QEMU with the image open matters.
 * A domain that runs is read in its live definition (which holds hot-plugged disks), one that
 * is shut off in its persistent one. Paths are compared as given and, when both exist, by
 * device and inode (a link or another spelling of the same file).
 *
 * Ownership: conn is borrowed; *out is filled in place (no allocation).
 */
#ifndef WK_VIRT_DISK_H
#define WK_VIRT_DISK_H

#include <libvirt/libvirt.h>
#include <stdbool.h>

#include "pv_status.h"

typedef struct wk_virt_disk_holder {
    bool found;        /* some domain has path as a disk */
    bool running;      /* ... and one of those runs (or is paused: QEMU holds the image open) */
    char domain[256];  /* that domain's name (a running one first) */
    char workload[72]; /* its pivirt workload id, "" when it is not a pivirt domain */
} wk_virt_disk_holder;

/* Fills *out for the disk image path on conn. UNAVAILABLE naming libvirt's reason when the
 * domains cannot be listed; PV_OK otherwise (*out->found false when no domain has it). */
int wk_virt_disk_holder_of(virConnectPtr conn, const char *path, wk_virt_disk_holder *out,
                           pv_status *st);

#endif
