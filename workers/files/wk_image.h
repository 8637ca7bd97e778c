/*
 * wk_image: the node's image store for the process engine. An image is a tar archive of the
 * workload's root directory; the store is a directory tree that mirrors the reference:
 *
 *   hub.example.com/ns/app:v1   ->  <image_dir>/hub.example.com/ns/app/v1.tar
 *   app                         ->  <image_dir>/app/latest.tar
 *
 * The tag is what follows the last ':' after the last '/' ("latest" when there is none), so a
 * registry port ("hub:5000/ns/app") stays part of the name. Name components are 1-128 of
 * [A-Za-z0-9._-] (the first may also be host:port, the port digits), never "." or ".."; a tag is
 * Docker's [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. Digests ("@sha256:...") are refused. A name and a tag
 * never collide on disk: names are directories, tags are files ending in ".tar". The
 * references themselves are pv_image's (shared/pv_image.h).
 */
#ifndef WK_IMAGE_H
#define WK_IMAGE_H

#include "pv_status.h"

/* The archive path of ref in image_dir (allocated, caller frees), whether or not it exists. */
int wk_image_path(const char *image_dir, const char *ref, char **path, pv_status *st);

/* As wk_image_path, but NOT_FOUND naming the image when the archive is not in the store. */
int wk_image_find(const char *image_dir, const char *ref, char **path, pv_status *st);

#endif
