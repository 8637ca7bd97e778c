/*
 * svc_core_image: pb.CoreRPC's ListImage, RemoveImage and CacheImage over the nodes' image
 * stores: one operation per node on its agent (workers/wk_node_image.h), answered per node
 * (ListImage) or per image and node (RemoveImage, CacheImage). The nodes are the pod's, or the
 * named ones of it; a node whose agent is not alive is answered with an error rather than
 * waited for.
 *
 * Ownership: svc_core_image_new allocates, svc_core_image_free frees; it outlives the server.
 */
#ifndef SVC_CORE_IMAGE_H
#define SVC_CORE_IMAGE_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_image svc_core_image;

svc_core_image *svc_core_image_new(gw_app *app);
void svc_core_image_free(svc_core_image *s);
int svc_core_image_register(svc_core_image *s, gw_server *server);

#endif
