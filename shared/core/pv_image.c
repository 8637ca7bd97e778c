/*
 * pv_image: image references (see pv_image.h). The gateway refuses a malformed reference before a
 * deploy starts, and the node agents map the same parse to their image store, so the two can
 * never disagree on what a reference is.
 */
#include "pv_image.h"

#include <stdlib.h>
#include <string.h>

static int is_name_char(char c, int allow_colon) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || (allow_colon && c == ':');
}

/* One component of a name: [first, first+len). The first of several may carry a port. */
static int valid_component(const char *s, size_t len, int allow_colon) {
    if (len == 0 || len > PV_IMAGE_PART_MAX) return 0;
    if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.')) return 0;
    size_t colon = len;
    for (size_t i = 0; i < len; i++) {
        if (!is_name_char(s[i], allow_colon)) return 0;
        if (s[i] == ':' && colon == len) colon = i;
    }
    if (colon == len) return 1;
    /* host:port: a port is digits only */
    if (colon == 0 || colon == len - 1) return 0;
    for (size_t i = colon + 1; i < len; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int valid_name(const char *name) {
    const char *p = name;
    int first = 1;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        /* a port only makes sense on a registry host, i.e. when more components follow */
        if (!valid_component(p, len, first && slash != NULL)) return 0;
        if (!slash) return 1;
        p = slash + 1;
        first = 0;
    }
}

static int valid_tag(const char *tag) {
    size_t len = strlen(tag);
    if (len == 0 || len > PV_IMAGE_PART_MAX || tag[0] == '.' || tag[0] == '-') return 0;
    for (size_t i = 0; i < len; i++)
        if (!is_name_char(tag[i], 0)) return 0;
    return 1;
}

int pv_image_parse(const char *ref, char **name, char **tag, pv_status *st) {
    *name = *tag = NULL;
    if (!ref || !*ref) return pv_status_set(st, PV_INVALID_ARGUMENT, "image: empty reference");
    if (strchr(ref, '@'))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "image %s: digests are not supported, name a tag", ref);
    const char *last_slash = strrchr(ref, '/');
    const char *colon = strrchr(last_slash ? last_slash : ref, ':');
    size_t name_len = colon ? (size_t)(colon - ref) : strlen(ref);
    char *n = strndup(ref, name_len);
    char *t = strdup(colon ? colon + 1 : "latest");
    if (!n || !t) {
        free(n);
        free(t);
        return pv_status_set(st, PV_INTERNAL, "image %s: out of memory", ref);
    }
    if (!valid_name(n) || !valid_tag(t)) {
        free(n);
        free(t);
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "image %s: not a valid reference (hub/namespace/app:tag, components "
                             "of [A-Za-z0-9._-], no '.' or '..')",
                             ref);
    }
    *name = n;
    *tag = t;
    return PV_OK;
}
