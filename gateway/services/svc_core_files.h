/*
 * svc_core_files: pb.CoreRPC's files: Send (files into workloads), SendLargeFile (the same,
 * streamed by the client in chunks) and Copy (a tar of paths out of workloads, in chunks).
 * Each is one operation per node of the workloads, relayed one answer per workload and file
 * (svc_relay).
 *
 * Ownership: svc_core_files_new allocates, svc_core_files_free frees; it outlives the server.
 */
#ifndef SVC_CORE_FILES_H
#define SVC_CORE_FILES_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_files svc_core_files;

svc_core_files *svc_core_files_new(gw_app *app);
void svc_core_files_free(svc_core_files *s);

int svc_core_files_register(svc_core_files *s, gw_server *server);

#endif
