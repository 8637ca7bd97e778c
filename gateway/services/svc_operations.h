/*
 * svc_operations: pivirt.operations.v1.OperationService.
 *
 * GetOperation, ListOperations, CancelOperation and CreateTestOperation are one Redis call each
 * on the handler's thread (shared/pv_op does the work). WaitOperation and WatchOperation read
 * the record once, answer at once when it is already done, and otherwise hand the call to the
 * gateway's waiter (gw_waiter), so no completion-queue thread ever waits on Redis.
 *
 * Ownership: the service borrows app and waiter; both must outlive it.
 */
#ifndef SVC_OPERATIONS_H
#define SVC_OPERATIONS_H

#include "gw_app.h"
#include "gw_server.h"
#include "gw_waiter.h"

/* The longest WaitOperation, whatever the request or the deadline says (seconds). */
#define SVC_OPERATIONS_MAX_WAIT_S 300
#define SVC_OPERATIONS_LIST_DEFAULT 100
#define SVC_OPERATIONS_LIST_MAX 1000
/* Longest x-request-id kept for idempotency (bytes). */
#define SVC_OPERATIONS_REQUEST_ID_MAX 128

typedef struct svc_operations svc_operations;

svc_operations *svc_operations_new(gw_app *app, gw_waiter *waiter);
void svc_operations_free(svc_operations *s);

/* Registers the six methods. Returns 0 or -1. */
int svc_operations_register(svc_operations *s, gw_server *server);

#endif
