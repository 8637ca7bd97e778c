/*
 * wk_untar: unpacks an image (a tar archive) into a workload's root inside the agent, without a
 * child process. Starting tar(1) cost more CPU than everything else the agent does to create a
 * workload (a fork, an exec and its dynamic loading for an archive of a few kilobytes), so the
 * common formats are read here: ustar, GNU (long names and link names) and pax (path, linkpath,
 * size, uid, gid, mtime), with regular files, directories, symbolic and hard links.
 *
 * Entries are confined to the destination: a leading "/" is dropped (as tar does), ".." is
 * refused, and no path component is followed through a symbolic link (O_NOFOLLOW at each step),
 * so an archive cannot make the agent write outside the root, even through links it made itself.
 *
 * Device nodes and fifos are refused (FAILED_PRECONDITION): a device in a workload's root would
 * give it the host's hardware. Anything else (compressed archives, sparse files) answers
 * UNIMPLEMENTED, and the caller hands the archive to tar(1) after checking its listing for
 * devices (wk_untar_listing_has_device).
 */
#ifndef WK_UNTAR_H
#define WK_UNTAR_H

#include <stdbool.h>

#include "pv_status.h"

/* Extracts the archive at path into dest, an existing directory. Modes and modification times
 * are restored; owners too (numeric ids) when set_owner. Directory modes are applied last, so a
 * read-only directory still receives its entries.
 * Errors: UNIMPLEMENTED (the archive needs tar(1); dest may hold part of it, and tar overwrites
 * it), FAILED_PRECONDITION naming the entry for a corrupt or hostile archive, NOT_FOUND when the
 * archive does not exist, INTERNAL for I/O errors. */
int wk_untar_extract(const char *path, const char *dest, bool set_owner, pv_status *st);

/* Checks that the archive at path is an image the agent would unpack, without unpacking it
 * anywhere that matters: it is extracted (names and links only, no data) into a scratch
 * directory made in workdir and removed afterwards. Stricter than wk_untar_extract: an absolute
 * entry name is refused too (an image's names are relative to its root). Errors as for
 * wk_untar_extract, each FAILED_PRECONDITION naming the entry; UNIMPLEMENTED when the archive
 * needs tar(1) (compressed). */
int wk_untar_check(const char *path, const char *workdir, pv_status *st);

/* The check of a `tar -tvf` listing before tar(1) unpacks an archive (as root it would make
 * the device nodes the archive lists): FAILED_PRECONDITION naming the line of a device or fifo,
 * or saying that a listing of max bytes or more (the caller's capture was cut) cannot be
 * checked. */
int wk_untar_listing_check(const char *listing, size_t max, pv_status *st);

/* Whether `tar -tvf` output (one entry a line, each starting with its mode string) lists a
 * character or block device or a fifo; *line (may be NULL) gets that line's offset. */
bool wk_untar_listing_has_device(const char *listing, size_t *line);

#endif
