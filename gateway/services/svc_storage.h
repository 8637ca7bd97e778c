/*
 * svc_storage: pivirt.storage.v1.StorageService, all 16 calls. Reads come from the records of
 * shared/pv_storage.h; each mutation is an operation on the queue of the agent of the pool's
 * node (workers/wk_storage.h), which the call waits for up to its deadline (60 s at most) and
 * answers with the resource as it then stands: READY/ACTIVE when done, a pool INACTIVE or a
 * volume CREATING when it is not yet. RestoreSnapshot answers its Operation at once.
 *
 * Volumes are named by id, or by name when one pool only holds that name.
 *
 * Ownership: svc_storage_new borrows app (it must outlive the service).
 */
#ifndef SVC_STORAGE_H
#define SVC_STORAGE_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_storage svc_storage;

svc_storage *svc_storage_new(gw_app *app);
void svc_storage_free(svc_storage *s);

/* Adds the methods to server (before gw_server_start). Returns 0 or -1. */
int svc_storage_register(svc_storage *s, gw_server *server);

#endif
