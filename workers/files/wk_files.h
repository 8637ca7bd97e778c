/*
 * wk_files: files in and out of a workload's root directory (Send and Copy on the process
 * engine), confined to that root: every path is taken relative to it, "." and ".." components
 * are refused, and no component is followed through a symbolic link (O_NOFOLLOW at each step),
 * so a workload cannot make the agent write or read outside its own tree.
 *
 * No child processes (the agent's engine reaps every child of the process): the tar archive is
 * written here, in ustar format (regular files, directories, symbolic links).
 *
 * Ownership: *tar is malloc'd for the caller.
 */
#ifndef WK_FILES_H
#define WK_FILES_H

#include <stddef.h>

#include "pv_status.h"

#define WK_FILES_TAR_MAX (64u << 20) /* an archive larger than this is refused */

/* Creates directory path and its missing parents: the parents 0755, path itself with mode (an
 * existing one is left as it is). 0, or -1 with errno. */
int wk_files_mkdir_p(const char *path, int mode);

/* Writes data to path inside root (parents created 0755), with mode and owner uid:gid; uid < 0
 * means root's own owner (the workload's user), for the file and the parents it creates.
 * INVALID_ARGUMENT naming the path for a path that leaves the root or crosses a link. */
int wk_files_put(const char *root, const char *path, const void *data, size_t len, int mode,
                 int uid, int gid, pv_status *st);

/* A tar archive of path inside root (a file, a link, or a directory with what it holds), named
 * from path's last component. NOT_FOUND naming the path when it does not exist. */
int wk_files_tar(const char *root, const char *path, char **tar, size_t *len, pv_status *st);

/* Reads a regular file at path inside root (at most WK_FILES_TAR_MAX bytes): *data is malloc'd,
 * *mode its permission bits. */
int wk_files_get(const char *root, const char *path, char **data, size_t *len, int *mode,
                 pv_status *st);

/* A tar archive of everything in root (entries named relative to it), for committing a
 * workload's tree as an image. */
int wk_files_tar_root(const char *root, char **tar, size_t *len, pv_status *st);

#endif
