/* Fuzz target: a CreateWorkload request as the gateway receives it (protobuf bytes), through
 * the checks every deploy passes (enums, then Eru's deploy checks and the plan body). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "pb/core.pb-c.h"
#include "pv_deploy.h"
#include "pv_validate.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Pb__DeployOptions *o = pb__deploy_options__unpack(NULL, size, data);
    if (!o) return 0;
    pv_status st;
    if (pv_validate_message(&o->base, &st) == PV_OK && pv_deploy_check(o, &st) == PV_OK) {
        char *body = NULL;
        if (pv_deploy_plan_body(o, "fuzz", &body, &st) == PV_OK) free(body);
    }
    pb__deploy_options__free_unpacked(o, NULL);
    return 0;
}
