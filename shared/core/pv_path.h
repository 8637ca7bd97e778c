/*
 * pv_path: host paths that clients name, held to the directories an operator allowed.
 *
 * A storage pool's directory comes from CreatePool's config.path, and everything pivirt does
 * with a pool (import its files as volumes, clone, resize, delete them) follows from it; so a
 * path is accepted only inside the node's storage roots (storage.roots) and only when it can be
 * reached without following a symbolic link: a link below a root could lead anywhere.
 *
 * Two levels: pv_path_check_abs and pv_path_within are lexical (no file system access; the
 * gateway and the audit use them), pv_path_confine_dir and pv_path_confine_file walk the node's
 * file system from the root down, one component at a time with O_NOFOLLOW, as the node agent
 * does before anything reaches libvirt.
 *
 * Ownership: a pv_roots owns its strings; pv_path_roots_clear frees them.
 */
#ifndef PV_PATH_H
#define PV_PATH_H

#include <stddef.h>

#include "pv_status.h"

/* Longest path a client may name (a pool's directory, a mount point, a device). */
#define PV_PATH_MAX 1024

typedef struct pv_roots {
    char **v; /* absolute, without a trailing '/', resolved when they exist */
    size_t n;
} pv_roots;

/* An absolute path in canonical form: starts with '/', at most PV_PATH_MAX bytes, no empty,
 * "." or ".." component, no trailing '/', no control character. INVALID_ARGUMENT naming field
 * and the (quoted, cut) value otherwise. */
int pv_path_check_abs(const char *field, const char *path, pv_status *st);

/* The storage roots: list[0..n) when n > 0 (each must be an absolute path), else the defaults
 * <data_dir>/pools and /var/lib/libvirt/images. A relative data_dir is taken from the current
 * directory. Each root that exists is resolved (realpath), so the roots themselves may be
 * links an operator made; below them nothing may be. INVALID_ARGUMENT naming storage.roots. */
int pv_path_roots_init(pv_roots *r, char *const *list, size_t n, const char *data_dir,
                       pv_status *st);
void pv_path_roots_clear(pv_roots *r);

/* "a, b" into buf (cut to cap). */
void pv_path_roots_text(const pv_roots *r, char *buf, size_t cap);

/* Whether the canonical path is one of the roots or below one (lexically, no file system
 * access). INVALID_ARGUMENT '<field>: "<path>" is outside the storage roots of this node (a,
 * b)' otherwise. */
int pv_path_within(const char *field, const char *path, const pv_roots *r, pv_status *st);

enum { PV_PATH_MKDIR = 1 << 0 };

/* pv_path_check_abs, pv_path_within, then on this host: each component below the root that
 * exists is a directory reached without following a link (INVALID_ARGUMENT naming the
 * component that is a link or no directory). With PV_PATH_MKDIR the missing components are
 * made (mode 0711), each under the directory already opened, so no link can be slipped in
 * between the check and the mkdir; without it a missing component is INVALID_ARGUMENT. */
int pv_path_confine_dir(const char *field, const char *path, const pv_roots *r, int flags,
                        pv_status *st);

/* A file of a confined directory: its directory passes pv_path_confine_dir (no mkdir) and the
 * file itself is a regular file, not a link, a device, a fifo or a socket. FAILED_PRECONDITION
 * naming field and path otherwise (the file is there already: the state, not the request, is
 * wrong); NOT_FOUND when it does not exist. */
int pv_path_confine_file(const char *field, const char *path, const pv_roots *r, pv_status *st);

#endif
