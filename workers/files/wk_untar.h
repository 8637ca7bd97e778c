/*
 * wk_untar: unpacks an image (an archive) into a workload's root inside the agent, with
 * libarchive and without a child process. libarchive reads every archive format it knows (tar
 * in all its dialects, cpio, zip, 7-Zip, ISO 9660, ...) under every compression it decodes
 * itself (gzip, bzip2, xz, lzma, lzip, zstd, lz4, compress, ...). Compressions for which
 * libarchive would start an external program (lrzip, grzip, and lzop when built without
 * liblzo2) are not read: the engine's event loop reaps every child, and an image is no reason to
 * run a decompressor of the archive's choosing.
 *
 * Untrusted input: an image comes from whoever may build one. Entries are confined to the
 * destination, checked here first and then again by libarchive (ARCHIVE_EXTRACT_SECURE_NODOTDOT,
 * _SECURE_SYMLINKS, _SECURE_NOABSOLUTEPATHS):
 * - a leading "/" is dropped when extracting (as tar does) and refused when checking;
 * - a name or hard-link target with a ".." component is refused;
 * - no component of a name or hard-link target may be a symbolic link or a file, even one the
 *   archive made itself ("a symbolic link or a file is in the way"), so nothing is written
 *   outside the root and hard links only link files inside it;
 * - device nodes, fifos and sockets are refused (FAILED_PRECONDITION naming the entry): a device
 *   in a workload's root would give it the host's hardware;
 * - headers that only describe the next entry (long names, pax) over 1 MiB are refused by
 *   libarchive ("Special header too large"), and names over PATH_MAX or 256 components deep
 *   here, so a small archive cannot make the agent allocate without bound;
 * - extended attributes, ACLs and file flags are never restored (a security.capability
 *   attribute would hand out capabilities).
 */
#ifndef WK_UNTAR_H
#define WK_UNTAR_H

#include <stdbool.h>

#include "pv_status.h"

/* Extracts the archive at path into dest, an existing directory. Modes (set-id bits included)
 * and modification times are restored; owners too (numeric ids) when set_owner. Directory modes
 * are applied last, so a read-only directory still receives its entries.
 * Errors: FAILED_PRECONDITION naming the entry for a corrupt or hostile archive, or one that is
 * not an archive libarchive reads (dest may hold part of it); NOT_FOUND when the archive does
 * not exist; INTERNAL when the machine fails (no space, I/O). */
int wk_untar_extract(const char *path, const char *dest, bool set_owner, pv_status *st);

/* Checks that the archive at path is an image the agent would unpack, without unpacking it
 * anywhere that matters: it is extracted (names and links only: no data, owners or modes) into
 * a scratch directory made in workdir and removed afterwards. Stricter than wk_untar_extract:
 * an absolute entry name is refused too (an image's names are relative to its root).
 * Errors as for wk_untar_extract, except UNIMPLEMENTED when the file is no archive that
 * libarchive recognises (a disk image, say: engines that do not unpack images may store it). */
int wk_untar_check(const char *path, const char *workdir, pv_status *st);

#endif
