/*
 * wk_node_image: the image RPCs' part on a node agent, over its image store (wk_image.h):
 *
 *   image.list_on_node    params {"filter"}: one entry per image {type=image, ref, id} where id
 *                         is the SHA-256 of the archive and ref "name:tag"; filter is a glob on
 *                         ref ("" = every image);
 *   image.remove_on_node  params {"images", "prune"}: deletes each archive; prune also removes
 *                         the directories left empty; {type=image_removed, image, success,
 *                         message};
 *   image.cache_on_node   params {"images"}: copies each image from the registry directory
 *                         (worker.registry_dir) into the store, atomically (a temporary file
 *                         renamed in place); {type=image_cached, image, success, message}.
 * Reads and writes files only: no child processes (the engine reaps every child).
 */
#ifndef WK_NODE_IMAGE_H
#define WK_NODE_IMAGE_H

#include "pv_status.h"
#include "wk_handler.h"

wk_op_handler wk_node_image_list, wk_node_image_remove, wk_node_image_cache;

/* image.build_on_node  params {"refs": ["name:tag", ...], "tar": base64 (RAW) | "exist_id":
 * workload id (EXIST: its root as it is now)}: the archive is stored under every ref in the
 * node's store and pushed to the registry directory; {type=built, ref, id (SHA-256), stream}. */
wk_op_handler wk_node_image_build;

#endif
