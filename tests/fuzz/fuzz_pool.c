/* Fuzz target: a CreatePool's type and config as a client sends them, through the checks and
 * the libvirt XML: whatever passes the checks yields XML with no unescaped markup from the
 * config (every value is checked for <>&'"), a path that passed is canonical (no "..", no
 * empty component) and a ratio that passed is finite and at most 1000. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pv_path.h"
#include "pv_storage.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    json_t *config = json_loadb((const char *)data + 1, size - 1, 0, NULL);
    if (!config) return 0;
    char *xml = NULL;
    pv_status st;
    if (pv_storage_pool_xml("p", NULL, 1 + data[0] % 5, config, &xml, &st) == PV_OK) {
        /* one <pool ...> root, opened and closed once */
        if (strncmp(xml, "<pool type='", 12) != 0 || strstr(xml + 1, "<pool") ||
            strcmp(xml + strlen(xml) - 7, "</pool>") != 0)
            __builtin_trap();
        const char *path = json_string_value(json_object_get(config, "path"));
        if (path && (strstr(path, "/../") || strstr(path, "//") || strlen(path) > PV_PATH_MAX ||
                     pv_path_check_abs("path", path, NULL) != PV_OK))
            __builtin_trap();
        const char *ratio = json_string_value(json_object_get(config, "max_overcommit"));
        if (ratio && !(strtod(ratio, NULL) >= 1.0 && strtod(ratio, NULL) <= 1000.0))
            __builtin_trap();
        free(xml);
    }
    json_decref(config);
    return 0;
}
