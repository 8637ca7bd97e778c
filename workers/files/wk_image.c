/*
 * wk_image: maps image references to archives in the node's image store (see wk_image.h). The
 * mapping is a plain directory tree so an operator can look at the store with ls, and so
 * ListImage can rebuild every reference from the paths alone.
 */
#include "wk_image.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pv_image.h"

int wk_image_path(const char *image_dir, const char *ref, char **path, pv_status *st) {
    *path = NULL;
    char *name, *tag;
    if (pv_image_parse(ref, &name, &tag, st) != PV_OK) return st->code;
    int rc = asprintf(path, "%s/%s/%s.tar", image_dir ? image_dir : ".", name, tag);
    free(name);
    free(tag);
    if (rc < 0) {
        *path = NULL;
        return pv_status_set(st, PV_INTERNAL, "image %s: out of memory", ref);
    }
    return PV_OK;
}

int wk_image_find(const char *image_dir, const char *ref, char **path, pv_status *st) {
    if (wk_image_path(image_dir, ref, path, st) != PV_OK) return st->code;
    struct stat sb;
    int found = stat(*path, &sb) == 0;
    if (found && S_ISREG(sb.st_mode)) return PV_OK;
    pv_status_set(st, PV_NOT_FOUND, "image %s: not in the node's image store (%s: %s)", ref, *path,
                  found ? "not a regular file" : strerror(errno));
    free(*path);
    *path = NULL;
    return st->code;
}
