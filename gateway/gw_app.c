/*
 * gw_app: per-thread Redis connections for the gateway's handlers.
 */
#include "gw_app.h"

#include <stdlib.h>

#include "pv_log.h"

pv_redis *gw_app_redis(gw_call *call) {
    return gw_call_thread_state(call);
}
