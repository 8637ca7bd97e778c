/*
 * wk_vm_image: VM images in the node's image store (wk_image.h: <image_dir>/<name>/<tag>.tar),
 * named like every image ("hub/ns/app:tag"). A VM image is either
 *
 *   - a tar archive holding, at its root, vm.json and/or a disk:
 *       vm.json     {"kernel": "vmlinuz", "initrd": "initrd.img", "cmdline": "console=ttyS0",
 *                    "disk": "disk.qcow2"}: direct kernel boot (initrd and cmdline need a
 *                   kernel; every name is a regular file of the archive, relative, no "..");
 *       disk.qcow2  the root disk as qcow2 (or the file vm.json's "disk" names: qcow2 when its
 *       disk.raw    name ends in .qcow2, else raw), or as raw
 *     at least a kernel or a disk; or
 *   - a bare qcow2 disk image (the store file starts with qcow2's magic): the root disk alone.
 *
 * A qcow2 disk must stand alone: a backing file or an external data file in its header would
 * make QEMU open a file of the image's choosing on the host, so both are refused.
 *
 * The virt engine does not boot the store's file: each version of an image (the store file's
 * device, inode, size and modification time: BuildImage and CacheImage replace it by rename)
 * is unpacked once into <cache_dir>/<key>/, and the VMs' root disks are qcow2 overlays on the
 * disk there (linked clones), so a later push of the same tag leaves running VMs on the version
 * they were made from. A bare qcow2 is hard-linked there (copied across file systems).
 *
 * Ownership: wk_vm_image strings are malloc'd, freed by wk_vm_image_clear.
 * Threads: no state; callers serialise the unpack and the collection of one cache_dir.
 */
#ifndef WK_VM_IMAGE_H
#define WK_VM_IMAGE_H

#include <stdbool.h>

#include "pv_status.h"

typedef struct wk_vm_image {
    char *dir;               /* <cache_dir>/<key>: the unpacked version */
    char *kernel, *initrd;   /* absolute paths, NULL when the image has none */
    char *cmdline;           /* NULL when none */
    char *disk;              /* the root disk to overlay, absolute; NULL when none */
    const char *disk_format; /* "qcow2" or "raw" (static), NULL without a disk */
} wk_vm_image;

void wk_vm_image_clear(wk_vm_image *im);

/* Checks that the file at path is a VM image as above. INVALID_ARGUMENT saying what is wrong
 * (naming the entry or the vm.json field), NOT_FOUND when there is no file. */
int wk_vm_image_check(const char *path, pv_status *st);

/* The unpacked version of image ref of image_dir, unpacking it into cache_dir (made when
 * missing, searchable by QEMU's user) when that version is not there yet. NOT_FOUND naming the
 * image when the store has no such image; INVALID_ARGUMENT when it is no VM image. */
int wk_vm_image_open(const char *image_dir, const char *ref, const char *cache_dir,
                     wk_vm_image *out, pv_status *st);

/* Deletes the unpacked versions under cache_dir that no VM uses (in_use(dir, arg) false) and
 * that are no longer the store's version of their image (the image was pushed again or
 * removed), and what an interrupted unpack left. */
void wk_vm_image_collect(const char *image_dir, const char *cache_dir,
                         bool (*in_use)(const char *dir, void *arg), void *arg);

#endif
