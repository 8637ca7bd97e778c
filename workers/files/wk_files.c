/*
 * wk_files: confined file access in a workload's root (see wk_files.h).
 *
 * Paths are walked one component at a time from a descriptor of the root with openat and
 * O_NOFOLLOW, so neither a symbolic link nor ".." can lead outside; the archive is built in
 * memory (bounded by WK_FILES_TAR_MAX) in the POSIX ustar layout: a 512-byte header per entry,
 * the data padded to 512, two zero blocks at the end.
 */
#include "wk_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int wk_files_mkdir_p(const char *path, int mode) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return errno = ENAMETOOLONG, -1;
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, (mode_t)mode) != 0 && errno != EEXIST ? -1 : 0;
}

#define BLOCK 512

/* Splits path into components; refuses empty results, "." and "..". *parts point into copy. */
static int split(const char *path, char *copy, size_t cap, char **parts, size_t max, size_t *n,
                 pv_status *st) {
    *n = 0;
    if (!path || !*path || strlen(path) >= cap)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "path \"%s\": empty or too long",
                             path ? path : "");
    snprintf(copy, cap, "%s", path);
    char *save = NULL;
    for (char *c = strtok_r(copy, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (strcmp(c, ".") == 0 || strcmp(c, "..") == 0)
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "path \"%s\": \".\" and \"..\" are not allowed", path);
        if (*n == max) return pv_status_set(st, PV_INVALID_ARGUMENT, "path \"%s\": too deep", path);
        parts[(*n)++] = c;
    }
    if (*n == 0) return pv_status_set(st, PV_INVALID_ARGUMENT, "path \"%s\": names no file", path);
    return PV_OK;
}

/* What a file of mode m is, for messages. */
static const char *kind_of(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISFIFO(m) ? "a fifo"
           : S_ISSOCK(m) ? "a socket"
           : S_ISLNK(m)  ? "a symbolic link"
                         : "a regular file";
}

static int io_error(pv_status *st, const char *what, const char *path, int err) {
    int code = err == ENOENT                      ? PV_NOT_FOUND
               : (err == ELOOP || err == ENOTDIR) ? PV_INVALID_ARGUMENT
                                                  : PV_INTERNAL;
    if (err == ELOOP)
        return pv_status_set(st, code, "%s %s: a symbolic link is in the way", what, path);
    return pv_status_set(st, code, "%s %s: %s", what, path, strerror(err));
}

/* The directory holding the last component, walked from root (created when create, owned by
 * the root's owner: the workload's user). */
static int walk_parent(const char *root, char **parts, size_t n, int create, const char *path,
                       int *out, pv_status *st) {
    int fd = open(root, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error(st, "workload root", root, errno);
    struct stat rsb;
    if (create && fstat(fd, &rsb) != 0) {
        int err = errno;
        close(fd);
        return io_error(st, "workload root", root, err);
    }
    for (size_t i = 0; i + 1 < n; i++) {
        int made = create ? mkdirat(fd, parts[i], 0755) : -1;
        if (create && made != 0 && errno != EEXIST) {
            int err = errno;
            close(fd);
            return io_error(st, "create directory for", path, err);
        }
        if (made == 0 && fchownat(fd, parts[i], rsb.st_uid, rsb.st_gid, AT_SYMLINK_NOFOLLOW) != 0) {
            int err = errno;
            close(fd);
            return io_error(st, "chown directory for", path, err);
        }
        int next = openat(fd, parts[i], O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        close(fd);
        if (next < 0) return io_error(st, "open", path, err);
        fd = next;
    }
    *out = fd;
    return PV_OK;
}

/* A path under a root, split, with the directory that holds its last component open. */
typedef struct leaf {
    char copy[4096], *parts[256];
    size_t n;
    const char *name; /* the last component */
    int dir;          /* its directory; the caller closes it */
} leaf;

/* Splits path and opens the directory of its last component, walked from root (created when
 * create, as walk_parent). */
static int open_leaf(const char *root, const char *path, int create, leaf *l, pv_status *st) {
    l->n = 0;
    l->dir = -1;
    if (split(path, l->copy, sizeof l->copy, l->parts, 256, &l->n, st) != PV_OK) return st->code;
    if (walk_parent(root, l->parts, l->n, create, path, &l->dir, st) != PV_OK) return st->code;
    l->name = l->parts[l->n - 1];
    return PV_OK;
}

/* INVALID_ARGUMENT "<verb> <path>: <kind> <refusal>", with the leaf's directory closed, when
 * the leaf is there as neither a regular file nor a symbolic link (nor, with dirs, a
 * directory); else PV_OK. */
static int refuse_special(leaf *l, int dirs, const char *verb, const char *path,
                          const char *refusal, pv_status *st) {
    struct stat sb;
    if (fstatat(l->dir, l->name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || S_ISREG(sb.st_mode) ||
        S_ISLNK(sb.st_mode) || (dirs && S_ISDIR(sb.st_mode)))
        return PV_OK;
    close(l->dir);
    l->dir = -1;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "%s %s: %s %s", verb, path, kind_of(sb.st_mode),
                         refusal);
}

int wk_files_put(const char *root, const char *path, const void *data, size_t len, int mode,
                 int uid, int gid, pv_status *st) {
    leaf l;
    if (open_leaf(root, path, 1, &l, st) != PV_OK) return st->code;
    /* Only a regular file is replaced: opening a fifo for writing would block the agent until
     * a reader came, and writing a device node would write the host's hardware. O_NONBLOCK
     * (no effect on regular files) and the fstat below cover one swapped in after this check. */
    if (refuse_special(&l, 0, "write", path, "is there, not a regular file", st) != PV_OK)
        return st->code;
    int fd =
        openat(l.dir, l.name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
               mode & 07777);
    int err = errno;
    close(l.dir);
    if (fd < 0) return io_error(st, "write", path, err);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "write %s: not a regular file", path);
    }
    const char *p = data;
    size_t left = len;
    int rc = PV_OK;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            rc = io_error(st, "write", path, errno);
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (rc == PV_OK && fchmod(fd, (mode_t)(mode & 07777)) != 0)
        rc = io_error(st, "chmod", path, errno);
    if (rc == PV_OK && uid < 0) { /* no owner given: the workload's user, who owns its root */
        struct stat rsb;
        if (stat(root, &rsb) != 0) {
            rc = io_error(st, "workload root", root, errno);
        } else {
            uid = (int)rsb.st_uid;
            gid = (int)rsb.st_gid;
        }
    }
    if (rc == PV_OK && fchown(fd, (uid_t)uid, (gid_t)gid) != 0)
        rc = io_error(st, "chown", path, errno);
    close(fd);
    return rc;
}

/* ---- tar ---- */

typedef struct tarbuf {
    char *data;
    size_t len, cap;
    int too_big;
} tarbuf;

static int tb_reserve(tarbuf *t, size_t more) {
    if (t->len + more > WK_FILES_TAR_MAX) {
        t->too_big = 1;
        return -1;
    }
    if (t->len + more <= t->cap) return 0;
    size_t cap = t->cap ? t->cap : 65536;
    while (cap < t->len + more)
        cap *= 2;
    char *d = realloc(t->data, cap);
    if (!d) return -1;
    t->data = d;
    t->cap = cap;
    return 0;
}

/* A NUL-terminated octal field of width bytes; a value too large for it is written as the
 * largest it holds (uids past 2097151 in an 8-byte field, say). */
static void octal(char *field, size_t width, unsigned long long v) {
    unsigned long long max = (1ULL << (3 * (width - 1))) - 1;
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%0*llo", (int)width - 1, v > max ? max : v);
    memcpy(field, tmp, width - 1);
    field[width - 1] = '\0';
}

/* One header block; name longer than 100 bytes goes into the ustar prefix. */
static int tb_header(tarbuf *t, const char *name, const struct stat *sb, char type,
                     const char *link, size_t size) {
    if (tb_reserve(t, BLOCK) != 0) return -1;
    char *h = t->data + t->len;
    memset(h, 0, BLOCK);
    size_t nl = strlen(name);
    if (nl > 100) {
        const char *cut = name + nl - 100;
        const char *slash = strchr(cut, '/');
        if (!slash || (size_t)(slash - name) > 155) return -1;
        memcpy(h + 345, name, (size_t)(slash - name));
        memcpy(h, slash + 1, strlen(slash + 1));
    } else {
        memcpy(h, name, nl);
    }
    octal(h + 100, 8, sb->st_mode & 07777);
    octal(h + 108, 8, sb->st_uid);
    octal(h + 116, 8, sb->st_gid);
    octal(h + 124, 12, size);
    octal(h + 136, 12, (unsigned long long)sb->st_mtime);
    memset(h + 148, ' ', 8);
    h[156] = type;
    if (link) memcpy(h + 157, link, strnlen(link, 100));
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    unsigned sum = 0;
    for (int i = 0; i < BLOCK; i++)
        sum += (unsigned char)h[i];
    snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    t->len += BLOCK;
    return 0;
}

static int tb_file(tarbuf *t, int fd, const char *name, const struct stat *sb) {
    size_t size = (size_t)sb->st_size;
    if (tb_header(t, name, sb, '0', NULL, size) != 0) return -1;
    size_t padded = (size + BLOCK - 1) / BLOCK * BLOCK;
    if (tb_reserve(t, padded) != 0) return -1;
    memset(t->data + t->len, 0, padded);
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, t->data + t->len + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* shrank while read: the rest stays zeroes */
        got += (size_t)r;
    }
    t->len += padded;
    return 0;
}

/* Adds the entry `comp` of directory dir under archive name `name`, recursing into directories. */
static int tb_add(tarbuf *t, int dir, const char *comp, const char *name, pv_status *st) {
    struct stat sb;
    if (fstatat(dir, comp, &sb, AT_SYMLINK_NOFOLLOW) != 0) return io_error(st, "stat", name, errno);
    if (S_ISLNK(sb.st_mode)) {
        char link[4096];
        ssize_t n = readlinkat(dir, comp, link, sizeof link - 1);
        if (n < 0) return io_error(st, "readlink", name, errno);
        link[n] = '\0';
        if (tb_header(t, name, &sb, '2', link, 0) != 0) goto full;
        return PV_OK;
    }
    if (S_ISREG(sb.st_mode)) {
        /* O_NONBLOCK: a fifo swapped in since the fstatat must not block the agent */
        int fd = openat(dir, comp, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) return io_error(st, "open", name, errno);
        struct stat now;
        if (fstat(fd, &now) != 0 || !S_ISREG(now.st_mode)) {
            close(fd);
            return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: changed while archived", name);
        }
        int r = tb_file(t, fd, name, &sb);
        close(fd);
        if (r != 0) goto full;
        return PV_OK;
    }
    if (!S_ISDIR(sb.st_mode)) return PV_OK; /* devices, sockets, fifos: not archived */
    char dname[4200];
    snprintf(dname, sizeof dname, "%s/", name);
    if (tb_header(t, dname, &sb, '5', NULL, 0) != 0) goto full;
    int fd = openat(dir, comp, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return io_error(st, "open", name, errno);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return io_error(st, "read directory", name, errno);
    }
    int rc = PV_OK;
    for (struct dirent *e; rc == PV_OK && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char child[4200];
        if ((size_t)snprintf(child, sizeof child, "%s/%s", name, e->d_name) >= 4096) continue;
        rc = tb_add(t, dirfd(d), e->d_name, child, st);
    }
    closedir(d);
    return rc;
full:
    return t->too_big
               ? pv_status_set(st, PV_RESOURCE_EXHAUSTED, "%s: the archive would exceed %u MiB",
                               name, WK_FILES_TAR_MAX >> 20)
               : pv_status_set(st, PV_INTERNAL,
                               "%s: cannot archive (out of memory or a "
                               "name too long for ustar)",
                               name);
}

/* Ends archive t (rc: how adding its entries went; name: what it is of, for messages) with its
 * two zero blocks and hands it over in *tar and *len; frees it on failure. */
static int tb_finish(tarbuf *t, int rc, const char *name, char **tar, size_t *len, pv_status *st) {
    if (rc == PV_OK && tb_reserve(t, 2 * BLOCK) != 0)
        rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, "%s: the archive is too large", name);
    if (rc != PV_OK) {
        free(t->data);
        return rc;
    }
    memset(t->data + t->len, 0, 2 * BLOCK);
    t->len += 2 * BLOCK;
    *tar = t->data;
    *len = t->len;
    return PV_OK;
}

int wk_files_tar(const char *root, const char *path, char **tar, size_t *len, pv_status *st) {
    *tar = NULL;
    *len = 0;
    leaf l;
    if (open_leaf(root, path, 0, &l, st) != PV_OK) return st->code;
    /* inside a directory they are left out; asked for by name they are refused, not answered
     * with an empty archive */
    if (refuse_special(&l, 1, "copy", path, "is not copied", st) != PV_OK) return st->code;
    tarbuf t = {0};
    int rc = tb_add(&t, l.dir, l.name, l.name, st);
    close(l.dir);
    return tb_finish(&t, rc, path, tar, len, st);
}

int wk_files_tar_root(const char *root, char **tar, size_t *len, pv_status *st) {
    *tar = NULL;
    *len = 0;
    int fd = open(root, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (fd < 0) return io_error(st, "workload root", root, errno);
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return io_error(st, "read directory", root, errno);
    }
    tarbuf t = {0};
    int rc = PV_OK;
    for (struct dirent *e; rc == PV_OK && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        rc = tb_add(&t, dirfd(d), e->d_name, e->d_name, st);
    }
    closedir(d);
    return tb_finish(&t, rc, root, tar, len, st);
}

int wk_files_get(const char *root, const char *path, char **data, size_t *len, int *mode,
                 pv_status *st) {
    *data = NULL;
    *len = 0;
    leaf l;
    if (open_leaf(root, path, 0, &l, st) != PV_OK) return st->code;
    /* O_NONBLOCK: opening a fifo must not block the agent (it is refused below) */
    int fd = openat(l.dir, l.name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int err = errno;
    close(l.dir);
    if (fd < 0) return io_error(st, "read", path, err);
    struct stat sb;
    int rc = PV_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "read %s: not a regular file", path);
    else if ((size_t)sb.st_size > WK_FILES_TAR_MAX)
        rc = pv_status_set(st, PV_RESOURCE_EXHAUSTED, "read %s: larger than %u MiB", path,
                           WK_FILES_TAR_MAX >> 20);
    char *buf = rc == PV_OK ? malloc((size_t)sb.st_size + 1) : NULL;
    if (rc == PV_OK && !buf) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    size_t got = 0;
    while (rc == PV_OK && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (rc != PV_OK) {
        free(buf);
        return rc;
    }
    *data = buf;
    *len = got;
    *mode = (int)(sb.st_mode & 07777);
    return PV_OK;
}
