/*
 * wk_virt_vm: what a real virtual machine of the virt engine (the QEMU driver) has on the node
 * beside its libvirt domain, under the engine's state directory:
 *
 *   images/<key>/            the unpacked version of its VM image (wk_vm_image.h), shared
 *   disks/<id>-<nonce>.qcow2 its root disk: a qcow2 overlay on the image's disk (qemu-img
 *                            create -b <disk> -F <format>: a linked clone, whatever the disk's
 *                            size); the nonce makes every create's overlay its own, so a failed
 *                            or repeated create never touches another's
 *   logs/<id>.log            its serial console, written by virtlogd (<serial type='pty'> with
 *                            <log file=... append='on'/>: kept across restarts of the domain,
 *                            of libvirtd and of the agent)
 *   logs/<id>.idx            that log's time index (wk_log_index.h), written by the engine
 *
 * and the domain XML that boots it: direct kernel boot when the image has a kernel, the overlay
 * as vda, ACPI (for a shutdown), the console, the guest agent's virtio-serial channel
 * (org.qemu.guest_agent.0) and a user-mode network interface (no bridge needed).
 *
 * Runs qemu-img as a child and waits for that child alone: the virt engine's process has no
 * reaper of every child (only the process engine has one, and an agent runs one engine).
 * Ownership: a wk_virt_vm owns its image; wk_virt_vm_clear frees it (files stay).
 */
#ifndef WK_VIRT_VM_H
#define WK_VIRT_VM_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "pv_status.h"
#include "wk_vm_image.h"

typedef struct wk_virt_vm {
    wk_vm_image image;
    char overlay[PATH_MAX]; /* "" when the image has no disk */
    char log[PATH_MAX];
} wk_virt_vm;

/* Where the engine keeps its files, and the qemu-img it runs ("" = PATH's). */
typedef struct wk_virt_dirs {
    const char *state_dir, *image_dir, *qemu_img;
    pthread_mutex_t *image_mu; /* held while unpacking and collecting images */
} wk_virt_dirs;

/* Unpacks image (when that version is not yet) and makes workload id's overlay on its disk.
 * image "" gives a VM with no image (nothing to boot from but its volumes). Errors name the
 * image: NOT_FOUND when the node's store has no such image, INVALID_ARGUMENT when it is no VM
 * image, the qemu-img message when the overlay cannot be made. */
int wk_virt_vm_prepare(const wk_virt_dirs *d, const char *id, const char *image, wk_virt_vm *out,
                       pv_status *st);
void wk_virt_vm_clear(wk_virt_vm *vm);

/* The console log of workload id (its path, whether or not it exists) and its index. */
void wk_virt_vm_log_path(const char *state_dir, const char *id, char *out, size_t cap);
void wk_virt_vm_index_path(const char *log_path, char *out, size_t cap);

/* The <os> children after <type> and the devices of vm for its domain XML (values escaped). */
void wk_virt_vm_os_xml(FILE *f, const wk_virt_vm *vm);
void wk_virt_vm_devices_xml(FILE *f, const wk_virt_vm *vm);

/* One tick of the console logs' time index (wk_log_index.h): each log under <state_dir>/logs
 * that grew since the last tick gets an entry now. sizes (a JSON object the caller keeps
 * between ticks, log name -> size) remembers what each log held. */
struct json_t;
void wk_virt_vm_index_tick(const char *state_dir, struct json_t *sizes, int64_t now_ms);

/* Notes the log's size now in its index: a start, so that since finds where this boot began. */
void wk_virt_vm_index_now(const char *log_path, int64_t now_ms);

/* Deletes a VM's files: its overlay and its log with its index (NULL or "": none). */
void wk_virt_vm_remove_files(const char *overlay, const char *log);

/* Deletes what a VM left under state_dir when its domain is gone: each root disk overlay
 * (disks/) and console log with its index and rotations (logs/) whose path kept() does not
 * keep. What an agent killed mid-create (an overlay made, no domain defined yet) or mid-remove
 * (the domain undefined, its files not yet deleted) leaves; run before any create of the
 * process, so that no overlay of a create in progress is taken for one (a node has one agent
 * at a time: its state directory is no other agent's). */
void wk_virt_vm_sweep(const char *state_dir, bool (*kept)(const char *path, void *arg), void *arg);

#endif
