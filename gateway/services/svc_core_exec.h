/*
 * svc_core_exec: pb.CoreRPC's commands and their output: LogStream (a workload's log, followed
 * as it comes), RunAndWait (deploy, follow the logs to the exit codes, remove) and
 * ExecuteWorkload (a command in a workload: at once, or interactive with its input streamed).
 * Each is an operation on the workload's node whose output stream is relayed to the client; the
 * operation is cancelled when the client goes.
 *
 * Ownership: svc_core_exec_new allocates, svc_core_exec_free frees; it outlives the server.
 */
#ifndef SVC_CORE_EXEC_H
#define SVC_CORE_EXEC_H

#include "gw_app.h"
#include "gw_server.h"

typedef struct svc_core_exec svc_core_exec;

svc_core_exec *svc_core_exec_new(gw_app *app);
void svc_core_exec_free(svc_core_exec *s);

int svc_core_exec_register(svc_core_exec *s, gw_server *server);

#endif
