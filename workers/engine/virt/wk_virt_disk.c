/*
 * wk_virt_disk: the domain that has a disk image as a disk (see wk_virt_disk.h).
 */
#include "wk_virt_disk.h"

#include <jansson.h>
#include <libvirt/virterror.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "wk_engine_virt.h"
#include "wk_xml.h"

/* Whether a and b name the same file: the same text, or the same device and inode. */
static bool same_file(const char *a, const char *b, const struct stat *bst) {
    if (strcmp(a, b) == 0) return true;
    struct stat ast;
    return bst && stat(a, &ast) == 0 && ast.st_dev == bst->st_dev && ast.st_ino == bst->st_ino;
}

/* Whether domain XML xml has path as the source of one of its disks (file or block device). */
static bool xml_has_disk(const char *xml, const char *path, const struct stat *pst) {
    wk_xml *x;
    pv_status st;
    if (!xml || wk_xml_parse(xml, &x, &st) != PV_OK) return false;
    wk_xml_node **srcs;
    size_t n;
    bool has = false;
    if (wk_xml_find(x, NULL, "/domain/devices/disk/source", &srcs, &n) == 0) {
        for (size_t i = 0; !has && i < n; i++) {
            char *f = wk_xml_text(x, srcs[i], "@file");
            if (!f) f = wk_xml_text(x, srcs[i], "@dev");
            has = f && same_file(f, path, pst);
            free(f);
        }
        free(srcs);
    }
    wk_xml_free(x);
    return has;
}

/* The pivirt workload id in d's metadata into out ("" when d is not a pivirt domain). */
static void workload_of(virDomainPtr d, char *out, size_t cap) {
    out[0] = '\0';
    char *xml = virDomainGetMetadata(d, VIR_DOMAIN_METADATA_ELEMENT, WK_VIRT_XMLNS, 0);
    char *text = xml ? wk_xml_text_of(xml, "/*") : NULL;
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(j, "id"));
    if (id) snprintf(out, cap, "%s", id);
    json_decref(j);
    free(text);
    free(xml);
}

int wk_virt_disk_holder_of(virConnectPtr conn, const char *path, wk_virt_disk_holder *out,
                           pv_status *st) {
    memset(out, 0, sizeof *out);
    struct stat pst;
    bool have_st = stat(path, &pst) == 0;
    virDomainPtr *doms = NULL;
    int n = virConnectListAllDomains(conn, &doms, 0);
    if (n < 0)
        return pv_status_set(st, PV_UNAVAILABLE,
                             "which domain has %s: virConnectListAllDomains: %s", path,
                             virGetLastErrorMessage());
    for (int i = 0; i < n; i++) {
        bool active = virDomainIsActive(doms[i]) == 1;
        char *xml = out->running || (out->found && !active)
                        ? NULL
                        : virDomainGetXMLDesc(doms[i], active ? 0 : VIR_DOMAIN_XML_INACTIVE);
        if (xml && xml_has_disk(xml, path, have_st ? &pst : NULL)) {
            out->found = true;
            out->running = active;
            snprintf(out->domain, sizeof out->domain, "%s", virDomainGetName(doms[i]));
            workload_of(doms[i], out->workload, sizeof out->workload);
        }
        free(xml);
        virDomainFree(doms[i]);
    }
    free(doms);
    virResetLastError(); /* a domain undefined while listed is no error of the caller's */
    return PV_OK;
}
