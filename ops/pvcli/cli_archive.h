/*
 * cli_archive: what `pvcli image build` sends as BuildImage RAW's tar: a directory archived
 * with libarchive (ustar/pax, names relative to the directory, links stored as links, never
 * followed; devices, fifos and sockets refused, as the node's image reader refuses them), or an
 * archive file read as it is.
 *
 * Ownership: *out is malloc'd, the caller frees it.
 */
#ifndef CLI_ARCHIVE_H
#define CLI_ARCHIVE_H

#include <stddef.h>

/* The tar bytes of path: a directory's tree, or a regular file's content. 0, or -1 with a
 * message naming the path in err. */
int cli_archive_load(const char *path, unsigned char **out, size_t *len, char *err, size_t cap);

#endif
