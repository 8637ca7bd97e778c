/*
 * wk_node_files: Send and Copy on a node agent, confined to each workload's root (wk_files.h).
 *
 *   workload.send_on_node  params {"ids": [...], "files": [{"path", "data" (base64), "mode",
 *                          "uid", "gid"}]}: each file is written into each workload; one output
 *                          entry per (workload, file): {type=sent, id, path, error}.
 *   workload.copy_on_node  params {"targets": {"<id>": ["<path>", ...]}}: a tar archive of each
 *                          path, in 4 KiB chunks: {type=copied, id, name, path, error, data
 *                          (base64 chunk)}; a path that cannot be read gives one entry with its
 *                          error.
 * On a virt node the files are in the guest: the engine writes and archives them through its
 * guest agent (wk_engine_put_file, wk_engine_get_tar).
 */
#ifndef WK_NODE_FILES_H
#define WK_NODE_FILES_H

#include "pv_status.h"
#include "wk_handler.h"

#define WK_COPY_CHUNK 4096

int wk_node_files_send(wk_op *op, pv_status *st);
int wk_node_files_copy(wk_op *op, pv_status *st);

#endif
