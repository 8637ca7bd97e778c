/* Fuzz target: the configuration file an operator writes (JSON), loaded and validated as every
 * program does at start; then the effective configuration is written out again. No crash, no
 * leak, and a file that loads and validates writes a dump that parses as JSON. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pv_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the loader reads a path; a memory file keeps the fuzzer off the disk */
    static int fd = -1;
    if (fd < 0) fd = memfd_create("pvconfig", 0);
    if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    pv_config c;
    pv_status st;
    if (pv_config_init(&c, &st) != PV_OK) return 0;
    if (pv_config_load_file(&c, path, &st) == PV_OK && pv_config_validate(&c, &st) == PV_OK) {
        char *dump = pv_config_dump_json(&c);
        if (dump) {
            json_t *j = json_loads(dump, 0, NULL);
            if (!j) __builtin_trap();
            json_decref(j);
            free(dump);
        }
    } else if (!st.msg[0]) {
        __builtin_trap(); /* a refusal always says why */
    }
    pv_config_free(&c);
    return 0;
}
