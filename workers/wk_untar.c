/*
 * wk_untar: tar extraction inside the agent (see wk_untar.h for what and why).
 *
 * The archive is read with pread at known offsets: a 512-byte header, then the entry's data
 * rounded up to 512 bytes. File data is moved with copy_file_range, so it never passes through
 * user space. Headers that only modify the next entry (GNU 'L' and 'K', pax 'x') are collected
 * in ux_next and consumed by that entry; pax global headers ('g') are skipped.
 */
#include "wk_untar.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 512
#define META_MAX (1u << 20) /* a long name or pax header larger than this is refused */
#define DEPTH_MAX 256

/* What the headers before an entry say about it (pax 'x', GNU 'L'/'K'). */
typedef struct ux_next {
    char *name, *link;
    bool has_size, has_uid, has_gid, has_mtime;
    uint64_t size;
    int64_t uid, gid, mtime;
} ux_next;

/* A directory whose metadata is applied once everything is in. */
typedef struct ux_dir {
    char *name;
    mode_t mode;
    int64_t uid, gid, mtime;
} ux_dir;

typedef struct ux {
    int afd, dest;
    off_t size; /* of the archive */
    const char *path;
    bool set_owner;
    bool check; /* wk_untar_check: absolute names refused, no data, owners or directory modes */
    ux_next next;
    ux_dir *dirs;
    size_t ndirs, capdirs;
    pv_status *st;
} ux;

static void next_clear(ux_next *n) {
    free(n->name);
    free(n->link);
    memset(n, 0, sizeof *n);
}

/* A numeric header field: octal (spaces and NULs around it) or GNU base-256 when the high bit
 * of its first byte is set. -1 when it is neither. */
static int parse_num(const unsigned char *f, size_t width, uint64_t *out) {
    uint64_t v = 0;
    if (f[0] & 0x80) {
        if (f[0] & 0x40) return -1; /* negative */
        v = f[0] & 0x3f;
        for (size_t i = 1; i < width; i++) {
            if (v >> 56) return -1;
            v = (v << 8) | f[i];
        }
        *out = v;
        return 0;
    }
    size_t i = 0;
    while (i < width && f[i] == ' ')
        i++;
    bool any = false;
    for (; i < width && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v >> 61) return -1;
        v = v * 8 + (uint64_t)(f[i] - '0');
        any = true;
    }
    for (; i < width; i++)
        if (f[i] != ' ' && f[i] != '\0') return -1;
    *out = any ? v : 0;
    return 0;
}

static bool checksum_ok(const unsigned char *h) {
    uint64_t want;
    if (parse_num(h + 148, 8, &want) != 0) return false;
    uint64_t usum = 0;
    int64_t ssum = 0;
    for (int i = 0; i < BLOCK; i++) {
        unsigned char c = (i >= 148 && i < 156) ? ' ' : h[i];
        usum += c;
        ssum += (signed char)c;
    }
    return want == usum || (int64_t)want == ssum;
}

static bool all_zero(const unsigned char *h) {
    for (int i = 0; i < BLOCK; i++)
        if (h[i]) return false;
    return true;
}

static bool compressed(const unsigned char *h) {
    static const struct {
        const char *magic;
        size_t len;
    } k[] = {{"\x1f\x8b", 2},
             {"\x1f\x9d", 2},
             {"BZh", 3},
             {"\xfd"
              "7zXZ",
              5},
             {"\x28\xb5\x2f\xfd", 4},
             {"LZIP", 4},
             {"\x89LZO", 4}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (memcmp(h, k[i].magic, k[i].len) == 0) return true;
    return false;
}

static int io_fail(ux *u, const char *what, const char *name, int err) {
    if (err == ELOOP || err == ENOTDIR)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: entry %s: a symbolic link or a file is in the way (%s)", u->path,
                             name, what);
    return pv_status_set(u->st, PV_INTERNAL, "%s: entry %s: %s: %s", u->path, name, what,
                         strerror(err));
}

/* Reads an entry's data (a long name or a pax header) into a NUL-terminated buffer. */
static int read_meta(ux *u, off_t at, uint64_t size, char **out) {
    if (size > META_MAX)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: a metadata entry of %" PRIu64 " bytes at offset %lld", u->path,
                             size, (long long)at);
    char *b = malloc(size + 1);
    if (!b) return pv_status_set(u->st, PV_INTERNAL, "%s: out of memory", u->path);
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(u->afd, b + got, size - got, at + (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(b);
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: truncated at offset %lld",
                                 u->path, (long long)(at + (off_t)got));
        }
        got += (size_t)n;
    }
    b[size] = '\0';
    *out = b;
    return PV_OK;
}

static int set_str(ux *u, char **dst, const char *v, size_t len) {
    free(*dst);
    *dst = strndup(v, len);
    return *dst ? PV_OK : pv_status_set(u->st, PV_INTERNAL, "%s: out of memory", u->path);
}

/* pax records: "<len> <key>=<value>\n", each len counting the whole record. */
static int parse_pax(ux *u, const char *b, size_t size) {
    size_t i = 0;
    while (i < size && b[i]) {
        char *end;
        unsigned long len = strtoul(b + i, &end, 10);
        if (end == b + i || *end != ' ' || len == 0 || len > size - i || b[i + len - 1] != '\n')
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: a malformed pax header",
                                 u->path);
        const char *key = end + 1, *rec_end = b + i + len - 1;
        const char *eq = memchr(key, '=', (size_t)(rec_end - key));
        if (!eq)
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: a malformed pax record",
                                 u->path);
        size_t klen = (size_t)(eq - key), vlen = (size_t)(rec_end - eq - 1);
        const char *v = eq + 1;
        char num[32];
        snprintf(num, sizeof num, "%.*s", (int)(vlen < 31 ? vlen : 31), v);
        if (klen == 4 && memcmp(key, "path", 4) == 0) {
            if (set_str(u, &u->next.name, v, vlen) != PV_OK) return u->st->code;
        } else if (klen == 8 && memcmp(key, "linkpath", 8) == 0) {
            if (set_str(u, &u->next.link, v, vlen) != PV_OK) return u->st->code;
        } else if (klen == 4 && memcmp(key, "size", 4) == 0) {
            u->next.size = strtoull(num, NULL, 10);
            u->next.has_size = true;
        } else if (klen == 3 && memcmp(key, "uid", 3) == 0) {
            u->next.uid = strtoll(num, NULL, 10);
            u->next.has_uid = true;
        } else if (klen == 3 && memcmp(key, "gid", 3) == 0) {
            u->next.gid = strtoll(num, NULL, 10);
            u->next.has_gid = true;
        } else if (klen == 5 && memcmp(key, "mtime", 5) == 0) {
            u->next.mtime = strtoll(num, NULL, 10);
            u->next.has_mtime = true;
        } else if (klen >= 11 && memcmp(key, "GNU.sparse.", 11) == 0) {
            return pv_status_set(u->st, PV_UNIMPLEMENTED, "%s: sparse files", u->path);
        }
        i += len;
    }
    return PV_OK;
}

/* Cleans an entry name: leading "/" and "." components dropped (refused when checking: an
 * image's names are relative to its root), ".." refused. The result is relative and may be
 * empty (the archive's "./"). what says which name it is in messages ("entry", "link target"). */
static int clean_name(ux *u, const char *raw, const char *what, char *out, size_t cap) {
    char name[4096];
    snprintf(name, sizeof name, "%s", raw);
    if (u->check && raw[0] == '/')
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: %s \"%.200s\" is an absolute path: an image's names are "
                             "relative to its root",
                             u->path, what, raw);
    size_t o = 0;
    char *save = NULL;
    for (char *c = strtok_r(name, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (strcmp(c, ".") == 0) continue;
        if (strcmp(c, "..") == 0)
            return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                                 "%s: %s \"%.200s\" names \"..\": it would leave the root", u->path,
                                 what, raw);
        size_t l = strlen(c);
        if (o + l + 2 > cap)
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: an entry name too long",
                                 u->path);
        if (o) out[o++] = '/';
        memcpy(out + o, c, l);
        o += l;
    }
    out[o] = '\0';
    return PV_OK;
}

/* Opens the directory that holds name's last component, walking from dest without following
 * links; creates missing parents (0755) when create. *base points into name. */
static int walk_parent(ux *u, char *name, bool create, int *dir, const char **base) {
    int fd = dup(u->dest);
    if (fd < 0) return io_fail(u, "dup", name, errno);
    char *comp = name;
    int depth = 0;
    for (char *slash; (slash = strchr(comp, '/')); comp = slash + 1) {
        if (++depth > DEPTH_MAX) {
            close(fd);
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: entry %s: too deep", u->path,
                                 name);
        }
        *slash = '\0';
        if (create && mkdirat(fd, comp, 0755) != 0 && errno != EEXIST) {
            int err = errno;
            *slash = '/';
            close(fd);
            return io_fail(u, "create its directory", name, err);
        }
        int next = openat(fd, comp, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        *slash = '/';
        close(fd);
        if (next < 0) return io_fail(u, "open its directory", name, err);
        fd = next;
    }
    *dir = fd;
    *base = comp;
    return PV_OK;
}

/* Makes room for a new file, link or symlink: an old non-directory of that name goes. */
static int clear_slot(ux *u, int dir, const char *base, const char *name) {
    if (unlinkat(dir, base, 0) == 0 || errno == ENOENT) return PV_OK;
    return io_fail(u, "replace", name, errno);
}

static int copy_data(ux *u, off_t at, uint64_t size, int out, const char *name) {
    off_t in_off = at;
    uint64_t left = size;
    bool plain = false;
    char buf[65536];
    while (left > 0) {
        ssize_t n;
        size_t want = left > (1u << 30) ? (1u << 30) : (size_t)left;
        if (!plain) {
            n = copy_file_range(u->afd, &in_off, out, NULL, want, 0);
            if (n < 0 &&
                (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
                plain = true;
                continue;
            }
        } else {
            n = pread(u->afd, buf, want < sizeof buf ? want : sizeof buf, in_off);
            if (n > 0) {
                for (ssize_t w = 0; w < n;) {
                    ssize_t m = write(out, buf + w, (size_t)(n - w));
                    if (m < 0 && errno == EINTR) continue;
                    if (m < 0) return io_fail(u, "write", name, errno);
                    w += m;
                }
                in_off += n;
            }
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return io_fail(u, "write", name, errno);
        if (n == 0)
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: entry %s: truncated", u->path,
                                 name);
        left -= (uint64_t)n;
    }
    return PV_OK;
}

typedef struct ux_entry {
    char *name; /* cleaned, relative */
    char type;
    mode_t mode;
    int64_t uid, gid, mtime;
    uint64_t size;
    off_t data;
    const char *link; /* raw link target */
} ux_entry;

static void times_of(int64_t mtime, struct timespec ts[2]) {
    ts[0].tv_sec = ts[1].tv_sec = (time_t)mtime;
    ts[0].tv_nsec = ts[1].tv_nsec = 0;
}

static int put_file(ux *u, const ux_entry *e, int dir, const char *base) {
    if (clear_slot(u, dir, base, e->name) != PV_OK) return u->st->code;
    int fd = openat(dir, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return io_fail(u, "create", e->name, errno);
    int rc = u->check ? PV_OK : copy_data(u, e->data, e->size, fd, e->name);
    struct timespec ts[2];
    times_of(e->mtime, ts);
    /* chown before chmod: changing the owner clears set-id bits */
    if (rc == PV_OK && u->set_owner && fchown(fd, (uid_t)e->uid, (gid_t)e->gid) != 0)
        rc = io_fail(u, "chown", e->name, errno);
    if (rc == PV_OK && fchmod(fd, e->mode & 07777) != 0) rc = io_fail(u, "chmod", e->name, errno);
    if (rc == PV_OK && futimens(fd, ts) != 0) rc = io_fail(u, "set times of", e->name, errno);
    close(fd);
    return rc;
}

static int put_symlink(ux *u, const ux_entry *e, int dir, const char *base) {
    if (clear_slot(u, dir, base, e->name) != PV_OK) return u->st->code;
    if (symlinkat(e->link, dir, base) != 0) return io_fail(u, "symlink", e->name, errno);
    if (u->set_owner && fchownat(dir, base, (uid_t)e->uid, (gid_t)e->gid, AT_SYMLINK_NOFOLLOW) != 0)
        return io_fail(u, "chown", e->name, errno);
    struct timespec ts[2];
    times_of(e->mtime, ts);
    utimensat(dir, base, ts, AT_SYMLINK_NOFOLLOW);
    return PV_OK;
}

static int put_hardlink(ux *u, const ux_entry *e, int dir, const char *base) {
    char target[4096];
    if (clean_name(u, e->link, "hard link target", target, sizeof target) != PV_OK)
        return u->st->code;
    if (!*target)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: entry %s: links to the root",
                             u->path, e->name);
    int tdir;
    const char *tbase;
    if (walk_parent(u, target, false, &tdir, &tbase) != PV_OK) return u->st->code;
    int rc = clear_slot(u, dir, base, e->name);
    if (rc == PV_OK && linkat(tdir, tbase, dir, base, 0) != 0)
        rc = io_fail(u, "link", e->name, errno);
    close(tdir);
    return rc;
}

static int put_dir(ux *u, const ux_entry *e, int dir, const char *base) {
    if (mkdirat(dir, base, 0700) != 0) {
        struct stat sb;
        if (errno != EEXIST || fstatat(dir, base, &sb, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(sb.st_mode))
            return io_fail(u, "mkdir", e->name, errno == EEXIST ? ENOTDIR : errno);
    }
    if (u->ndirs == u->capdirs) {
        size_t cap = u->capdirs ? u->capdirs * 2 : 16;
        ux_dir *d = realloc(u->dirs, cap * sizeof *d);
        if (!d) return pv_status_set(u->st, PV_INTERNAL, "%s: out of memory", u->path);
        u->dirs = d;
        u->capdirs = cap;
    }
    ux_dir *d = &u->dirs[u->ndirs];
    if (!(d->name = strdup(e->name)))
        return pv_status_set(u->st, PV_INTERNAL, "%s: out of memory", u->path);
    d->mode = e->mode;
    d->uid = e->uid;
    d->gid = e->gid;
    d->mtime = e->mtime;
    u->ndirs++;
    return PV_OK;
}

/* Directory metadata, deepest last-made first, so that a parent's mtime survives its children. */
static int finish_dirs(ux *u) {
    for (size_t i = u->ndirs; i-- > 0;) {
        ux_dir *d = &u->dirs[i];
        int dir = -1;
        const char *base = NULL;
        if (walk_parent(u, d->name, false, &dir, &base) != PV_OK) return u->st->code;
        int fd = openat(dir, base, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        int err = errno;
        close(dir);
        if (fd < 0) return io_fail(u, "open", d->name, err);
        int rc = PV_OK;
        struct timespec ts[2];
        times_of(d->mtime, ts);
        if (u->set_owner && fchown(fd, (uid_t)d->uid, (gid_t)d->gid) != 0)
            rc = io_fail(u, "chown", d->name, errno);
        if (rc == PV_OK && fchmod(fd, d->mode & 07777) != 0)
            rc = io_fail(u, "chmod", d->name, errno);
        if (rc == PV_OK) futimens(fd, ts);
        close(fd);
        if (rc != PV_OK) return rc;
    }
    return PV_OK;
}

static int put_entry(ux *u, ux_entry *e) {
    if (!*e->name) return PV_OK; /* the archive's "./": the root is ours */
    int dir = -1;
    const char *base = NULL;
    if (walk_parent(u, e->name, true, &dir, &base) != PV_OK) return u->st->code;
    int rc;
    switch (e->type) {
    case '5':
        rc = put_dir(u, e, dir, base);
        break;
    case '2':
        rc = put_symlink(u, e, dir, base);
        break;
    case '1':
        rc = put_hardlink(u, e, dir, base);
        break;
    default:
        rc = put_file(u, e, dir, base);
        break;
    }
    close(dir);
    return rc;
}

/* One header at u's offset; *end at the archive's end. */
static int step(ux *u, off_t *off, bool first, bool *end) {
    unsigned char h[BLOCK];
    ssize_t n = pread(u->afd, h, BLOCK, *off);
    if (n == 0 && !first) {
        *end = true; /* no end-of-archive blocks: tar accepts that too */
        return PV_OK;
    }
    if (n != BLOCK) {
        if (n >= 6 && first && compressed(h))
            return pv_status_set(u->st, PV_UNIMPLEMENTED, "%s: a compressed archive", u->path);
        return pv_status_set(u->st, first ? PV_UNIMPLEMENTED : PV_FAILED_PRECONDITION,
                             "%s: truncated at offset %lld", u->path, (long long)*off);
    }
    if (all_zero(h)) {
        *end = true;
        return PV_OK;
    }
    if (!checksum_ok(h)) {
        if (first) /* compressed, or not a tar archive: tar(1) says which */
            return pv_status_set(u->st, PV_UNIMPLEMENTED, "%s: not a plain tar archive", u->path);
        return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: a corrupt header at offset %lld",
                             u->path, (long long)*off);
    }
    uint64_t size, mode, uid, gid, mtime;
    if (parse_num(h + 124, 12, &size) != 0 || parse_num(h + 100, 8, &mode) != 0 ||
        parse_num(h + 108, 8, &uid) != 0 || parse_num(h + 116, 8, &gid) != 0 ||
        parse_num(h + 136, 12, &mtime) != 0)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: a header with a malformed number at offset %lld", u->path,
                             (long long)*off);
    char type = (char)h[156];
    if (u->next.has_size && type != 'x' && type != 'g') size = u->next.size;
    off_t data = *off + BLOCK;
    if (size > (uint64_t)(u->size - data))
        return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: truncated at offset %lld", u->path,
                             (long long)*off);
    *off = data + (off_t)((size + BLOCK - 1) / BLOCK * BLOCK);

    if (type == 'L' || type == 'K' || type == 'x') {
        char *meta = NULL;
        if (read_meta(u, data, size, &meta) != PV_OK) return u->st->code;
        int rc = PV_OK;
        if (type == 'x')
            rc = parse_pax(u, meta, size);
        else if (type == 'L')
            rc = set_str(u, &u->next.name, meta, strlen(meta));
        else
            rc = set_str(u, &u->next.link, meta, strlen(meta));
        free(meta);
        return rc;
    }
    if (type == 'g') return PV_OK;

    char raw[4096], name[4096], link[4096];
    if (u->next.name) {
        snprintf(raw, sizeof raw, "%s", u->next.name);
    } else if (memcmp(h + 257, "ustar\0", 6) == 0 && h[345]) {
        snprintf(raw, sizeof raw, "%.155s/%.100s", (const char *)h + 345, (const char *)h);
    } else {
        snprintf(raw, sizeof raw, "%.100s", (const char *)h);
    }
    /* a device node in a workload's root would open the host's hardware to it */
    if (type == '3' || type == '4' || type == '6')
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: entry \"%.200s\" is a %s: images may not hold device files or "
                             "fifos",
                             u->path, raw,
                             type == '3'   ? "character device"
                             : type == '4' ? "block device"
                                           : "fifo");
    if (type != '0' && type != '\0' && type != '7' && type != '5' && type != '2' && type != '1')
        return pv_status_set(u->st, PV_UNIMPLEMENTED, "%s: an entry of type '%c'", u->path, type);
    snprintf(link, sizeof link, "%s", u->next.link ? u->next.link : "");
    if (!u->next.link) snprintf(link, sizeof link, "%.100s", (const char *)h + 157);
    if (clean_name(u, raw, "entry", name, sizeof name) != PV_OK) return u->st->code;
    if (type == '0' || type == '\0' || type == '7') {
        size_t l = strlen(name);
        if (l && name[l - 1] == '/') type = '5'; /* old archives mark directories so */
    }
    ux_entry e = {
        .name = name,
        .type = type,
        .mode = (mode_t)(mode & 07777),
        .uid = u->next.has_uid ? u->next.uid : (int64_t)uid,
        .gid = u->next.has_gid ? u->next.gid : (int64_t)gid,
        .mtime = u->next.has_mtime ? u->next.mtime : (int64_t)mtime,
        .size = type == '5' || type == '2' || type == '1' ? 0 : size,
        .data = data,
        .link = link,
    };
    next_clear(&u->next);
    return put_entry(u, &e);
}

static int untar(const char *path, const char *dest, bool set_owner, bool check, pv_status *st) {
    ux u;
    memset(&u, 0, sizeof u);
    u.path = path;
    u.set_owner = set_owner && !check;
    u.check = check;
    u.st = st;
    u.dest = -1;
    u.afd = open(path, O_RDONLY | O_CLOEXEC);
    if (u.afd < 0)
        return pv_status_set(st, errno == ENOENT ? PV_NOT_FOUND : PV_INTERNAL, "%s: %s", path,
                             strerror(errno));
    int rc = PV_OK;
    struct stat sb;
    if (fstat(u.afd, &sb) != 0 || !S_ISREG(sb.st_mode))
        rc = pv_status_set(st, PV_UNIMPLEMENTED, "%s: not a regular file", path);
    u.size = sb.st_size;
    if (rc == PV_OK && (u.dest = open(dest, O_DIRECTORY | O_RDONLY | O_CLOEXEC)) < 0)
        rc = pv_status_set(st, PV_INTERNAL, "%s: open %s: %s", path, dest, strerror(errno));
    off_t off = 0;
    bool end = false;
    for (bool first = true; rc == PV_OK && !end; first = false)
        rc = step(&u, &off, first, &end);
    if (rc == PV_OK && !check) rc = finish_dirs(&u);
    next_clear(&u.next);
    for (size_t i = 0; i < u.ndirs; i++)
        free(u.dirs[i].name);
    free(u.dirs);
    if (u.dest >= 0) close(u.dest);
    close(u.afd);
    return rc;
}

int wk_untar_extract(const char *path, const char *dest, bool set_owner, pv_status *st) {
    return untar(path, dest, set_owner, false, st);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0; /* best effort: go on with the rest */
}

int wk_untar_check(const char *path, const char *workdir, pv_status *st) {
    char scratch[4096];
    if ((size_t)snprintf(scratch, sizeof scratch, "%s/untar-check-XXXXXX", workdir) >=
            sizeof scratch ||
        !mkdtemp(scratch))
        return pv_status_set(st, PV_INTERNAL, "%s: a scratch directory in %s: %s", path, workdir,
                             strerror(errno));
    int rc = untar(path, scratch, false, true, st);
    /* directory modes were not applied and files are empty, so this removes everything */
    nftw(scratch, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    return rc;
}

int wk_untar_listing_check(const char *listing, size_t max, pv_status *st) {
    size_t at = 0;
    if (listing && strlen(listing) >= max)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "a compressed archive listing more than %zu bytes of entries cannot "
                             "be checked for device files: store the image uncompressed",
                             max);
    if (wk_untar_listing_has_device(listing, &at)) {
        int len = (int)strcspn(listing + at, "\n");
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "an entry is a device file or fifo (%.*s): images may not hold them",
                             len > 120 ? 120 : len, listing + at);
    }
    return PV_OK;
}

bool wk_untar_listing_has_device(const char *listing, size_t *line) {
    for (const char *l = listing; l && *l;) {
        if (*l == 'c' || *l == 'b' || *l == 'p') {
            if (line) *line = (size_t)(l - listing);
            return true;
        }
        l = strchr(l, '\n');
        if (l) l++;
    }
    return false;
}
