/* Fuzz target: wk_xml, the reader of libvirt's XML, on any bytes: a document it accepts answers
 * the XPaths the engine and storage code ask without fault, and its dump (what a rewritten
 * definition hands libvirt) parses again to a root with the same text. A document it refuses
 * says why. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wk_xml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

/* What the virt engine and the storage agent read. */
static void read_all(wk_xml *x) {
    static const char *const each[] = {"@type", "mac/@address", "source/@network",
                                       "source/@bridge"};
    wk_xml_node **nodes;
    size_t n;
    if (wk_xml_find(x, NULL, "/domain/devices/interface | /network/ip | /network/ip/dhcp/host",
                    &nodes, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            for (size_t k = 0; k < sizeof each / sizeof each[0]; k++)
                free(wk_xml_text(x, nodes[i], each[k]));
        free(nodes);
    }
    free(wk_xml_text(x, NULL, "/volume/target/format/@type"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    wk_xml *x = NULL, *again = NULL;
    pv_status st;
    if (wk_xml_parse(text, &x, &st) != PV_OK) {
        CHECK(st.code == PV_INVALID_ARGUMENT && st.msg[0] && !x);
        free(text);
        return 0;
    }
    read_all(x);
    char *root = wk_xml_text(x, NULL, "/*"), *dump = wk_xml_dump(x, NULL);
    CHECK(root && dump);
    CHECK(wk_xml_parse(dump, &again, &st) == PV_OK);
    char *root2 = wk_xml_text(again, NULL, "/*");
    CHECK(root2 && strcmp(root, root2) == 0);
    free(root2);
    free(root);
    free(dump);
    wk_xml_free(again);
    wk_xml_free(x);
    free(text);
    return 0;
}
