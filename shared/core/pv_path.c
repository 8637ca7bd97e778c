/*
 * pv_path: storage roots and the paths confined to them (see pv_path.h).
 *
 * The walk opens the root, then each component below it with openat(O_PATH | O_NOFOLLOW |
 * O_DIRECTORY) from the directory opened before: a component that is a link fails to open as a
 * directory (ELOOP or ENOTDIR), whatever the link points at, and no later rename of a parent can
 * move the walk elsewhere. realpath() would answer where a link leads; the point here is to
 * refuse the link.
 */
#include "pv_path.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LIBVIRT_IMAGES "/var/lib/libvirt/images"

int pv_path_check_abs(const char *field, const char *path, pv_status *st) {
    char q[PV_QUOTE_BUF];
    if (!path || !*path) return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is required", field);
    pv_quote(path, q, sizeof q);
    size_t n = strlen(path);
    if (n > PV_PATH_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s is %zu bytes, longer than %d", field,
                             q, n, PV_PATH_MAX);
    if (path[0] != '/')
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: %s is not an absolute path", field, q);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)path[i] < 0x20 || path[i] == 0x7f)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "%s: %s holds a control character at byte %zu", field, q, i);
    if (n == 1) return PV_OK; /* "/" is canonical; whether it is allowed is the roots' say */
    for (const char *c = path + 1;; c = strchr(c, '/') + 1) {
        size_t len = strcspn(c, "/");
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "%s: %s is not in canonical form (an empty, \".\" or \"..\" "
                                 "component, or a trailing '/')",
                                 field, q);
        if (c[len] == '\0') break;
    }
    return PV_OK;
}

void pv_path_roots_clear(pv_roots *r) {
    for (size_t i = 0; i < r->n; i++)
        free(r->v[i]);
    free(r->v);
    r->v = NULL;
    r->n = 0;
}

/* Adds root (absolute, or relative to the current directory), resolved when it exists, with
 * no trailing '/' (but "/" itself). */
static int roots_add(pv_roots *r, const char *root) {
    char *abs = NULL;
    char cwd[PATH_MAX];
    if (root[0] != '/') {
        if (!getcwd(cwd, sizeof cwd) || asprintf(&abs, "%s/%s", cwd, root) < 0) return -1;
        root = abs;
    }
    char *real = realpath(root, NULL);
    char *keep = real ? real : strdup(root);
    free(abs);
    if (!keep) return -1;
    for (size_t n = strlen(keep); n > 1 && keep[n - 1] == '/'; n--)
        keep[n - 1] = '\0';
    char **v = realloc(r->v, (r->n + 1) * sizeof *v);
    if (!v) {
        free(keep);
        return -1;
    }
    r->v = v;
    r->v[r->n++] = keep;
    return 0;
}

int pv_path_roots_init(pv_roots *r, char *const *list, size_t n, const char *data_dir,
                       pv_status *st) {
    r->v = NULL;
    r->n = 0;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (pv_path_check_abs("storage.roots", list[i], st) != PV_OK) {
            pv_path_roots_clear(r);
            return st->code;
        }
        rc = roots_add(r, list[i]);
    }
    if (n == 0) {
        char *pools = NULL;
        rc = asprintf(&pools, "%s/pools", data_dir && *data_dir ? data_dir : ".") < 0 ? -1 : 0;
        if (rc == 0) rc = roots_add(r, pools);
        if (rc == 0) rc = roots_add(r, LIBVIRT_IMAGES);
        free(pools);
    }
    if (rc != 0) {
        pv_path_roots_clear(r);
        return pv_status_set(st, PV_INTERNAL, "storage.roots: %s", strerror(errno));
    }
    return PV_OK;
}

void pv_path_roots_text(const pv_roots *r, char *buf, size_t cap) {
    size_t o = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < r->n && o + 1 < cap; i++) {
        int w = snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", r->v[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
    if (r->n == 0) snprintf(buf, cap, "none");
}

/* The root path lies in, or NULL. */
static const char *root_of(const char *path, const pv_roots *r) {
    for (size_t i = 0; i < r->n; i++) {
        const char *root = r->v[i];
        size_t n = strlen(root);
        if (n == 1) return root; /* "/": an operator's explicit choice */
        if (strncmp(path, root, n) == 0 && (path[n] == '\0' || path[n] == '/')) return root;
    }
    return NULL;
}

static int outside(const char *field, const char *path, const pv_roots *r, pv_status *st) {
    char q[PV_QUOTE_BUF], roots[512];
    pv_quote(path, q, sizeof q);
    pv_path_roots_text(r, roots, sizeof roots);
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: %s is outside the storage roots of this node (%s; storage.roots)",
                         field, q, roots);
}

int pv_path_within(const char *field, const char *path, const pv_roots *r, pv_status *st) {
    if (pv_path_check_abs(field, path, st) != PV_OK) return st->code;
    return root_of(path, r) ? PV_OK : outside(field, path, r, st);
}

/* Opens the component name under dir as a directory without following a link,
 * making it first when it is missing and mkdir is set. -1 with errno. */
static int open_component(int dir, const char *name, int mkdir_missing) {
    int fd = openat(dir, name, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && mkdir_missing) {
        if (mkdirat(dir, name, 0711) != 0 && errno != EEXIST) return -1;
        fd = openat(dir, name, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
    }
    return fd;
}

static int walk_failed(const char *field, const char *path, const char *upto, int err,
                       pv_status *st) {
    char q[PV_QUOTE_BUF], at[PV_QUOTE_BUF];
    pv_quote(path, q, sizeof q);
    pv_quote(upto, at, sizeof at);
    const char *why = err == ELOOP || err == ENOTDIR ? "is a symbolic link or not a directory"
                      : err == ENOENT                ? "does not exist"
                                                     : strerror(err);
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: %s: %s %s (links are not followed below a storage root)", field, q,
                         at, why);
}

/* The walk of pv_path_confine_dir; *out gets the last directory's descriptor (caller closes). */
static int walk(const char *field, const char *path, const pv_roots *r, int flags, int *out,
                pv_status *st) {
    *out = -1;
    if (pv_path_within(field, path, r, st) != PV_OK) return st->code;
    const char *root = root_of(path, r);
    int dir = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0 && errno == ENOENT && (flags & PV_PATH_MKDIR)) {
        /* a default root not made yet (a fresh data directory): its own parents are the
         * operator's, so it is made as named */
        if (mkdir(root, 0711) == 0 || errno == EEXIST)
            dir = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (dir < 0) return walk_failed(field, path, root, errno, st);
    char buf[PV_PATH_MAX + 1];
    snprintf(buf, sizeof buf, "%s", path);
    size_t root_len = strlen(root) == 1 ? 0 : strlen(root);
    char *c = buf[root_len] == '/' ? buf + root_len + 1 : buf + root_len; /* "" at the root */
    while (*c) {
        char *slash = strchr(c, '/');
        if (slash) *slash = '\0';
        int next = open_component(dir, c, flags & PV_PATH_MKDIR);
        int err = errno;
        close(dir);
        if (next < 0) return walk_failed(field, path, buf, err, st);
        dir = next;
        if (!slash) break;
        *slash = '/';
        c = slash + 1;
    }
    *out = dir;
    return PV_OK;
}

int pv_path_confine_dir(const char *field, const char *path, const pv_roots *r, int flags,
                        pv_status *st) {
    int dir;
    if (walk(field, path, r, flags, &dir, st) != PV_OK) return st->code;
    close(dir);
    return PV_OK;
}

int pv_path_confine_file(const char *field, const char *path, const pv_roots *r, pv_status *st) {
    if (pv_path_check_abs(field, path, st) != PV_OK) return st->code;
    const char *slash = strrchr(path, '/');
    char dir_path[PV_PATH_MAX + 1];
    snprintf(dir_path, sizeof dir_path, "%.*s", (int)(slash == path ? 1 : slash - path), path);
    int dir;
    if (walk(field, dir_path, r, 0, &dir, st) != PV_OK) {
        pv_status keep = *st;
        return pv_status_set(st, PV_FAILED_PRECONDITION, "%s", keep.msg);
    }
    struct stat sb;
    char q[PV_QUOTE_BUF];
    pv_quote(path, q, sizeof q);
    int rc = fstatat(dir, slash + 1, &sb, AT_SYMLINK_NOFOLLOW);
    int err = errno;
    close(dir);
    if (rc != 0)
        return pv_status_set(st, err == ENOENT ? PV_NOT_FOUND : PV_FAILED_PRECONDITION,
                             "%s: %s: %s", field, q, strerror(err));
    if (!S_ISREG(sb.st_mode))
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "%s: %s is not a regular file (a link, device, fifo, socket or "
                             "directory is never a volume)",
                             field, q);
    return PV_OK;
}
