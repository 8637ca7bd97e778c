/*
 * wk_untar: image extraction with libarchive (see wk_untar.h for what and why).
 *
 * archive_write_disk resolves names against the working directory, and chdir(2) would move it
 * for every thread of the agent (libarchive also sets the umask to 0 for a moment to read it).
 * So each extraction runs in a thread of its own that unshares its filesystem context
 * (CLONE_FS: working directory and umask become its own) and enters the destination: names stay
 * relative, as ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS wants, and no other thread sees a change.
 *
 * Each entry is vetted before libarchive writes it (vet_entry): its type refused or allowed, its
 * name and hard-link target cleaned, and the directories above both walked with O_NOFOLLOW, so
 * a link or file in the way is refused with the entry's name and the same words whatever
 * libarchive's version says. libarchive's secure flags then check the same again: one mistake
 * here is not an escape.
 */
#include "wk_untar.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Names stay below PATH_MAX, so libarchive opens each in one call (a longer one it would reach
 * by chdir(2) down its directories, edit_deep_directories). */
#define NAME_CAP 4096
#define DEPTH_MAX 256
#define READ_BLOCK 65536

/* One extraction: what its thread needs and what it answers. */
typedef struct ux {
    const char *path; /* the archive, for messages */
    const char *dest;
    bool set_owner;
    bool check;               /* wk_untar_check: absolute names refused; no data, owners or modes */
    int afd, dfd;             /* the archive and the destination, owned by untar() */
    struct archive *in, *out; /* owned by the thread (extract_all) */
    pv_status *st;
    int rc;
} ux;

/* --- which compressions ----------------------------------------------------------------------- */

static int filters[ARCHIVE_FILTER_ZSTD + 1];
static size_t nfilters;
static pthread_once_t filters_once = PTHREAD_ONCE_INIT;

/* The compressions libarchive decodes itself. Registering one it would hand to an external
 * program answers ARCHIVE_WARN, so each is tried on a reader of its own first. */
static void probe_filters(void) {
    for (int code = ARCHIVE_FILTER_GZIP; code <= ARCHIVE_FILTER_ZSTD; code++) {
        if (code == ARCHIVE_FILTER_PROGRAM) continue;
        struct archive *a = archive_read_new();
        if (a && archive_read_support_filter_by_code(a, code) == ARCHIVE_OK)
            filters[nfilters++] = code;
        archive_read_free(a);
    }
}

/* --- messages --------------------------------------------------------------------------------- */

/* Whether a libarchive answer is a failure (ARCHIVE_RETRY too: the header was damaged). */
static bool failed(int r) {
    return r != ARCHIVE_OK && r != ARCHIVE_WARN;
}

static const char *errstr(struct archive *a) {
    const char *s = archive_error_string(a);
    return s ? s : "failed";
}

static int oom(ux *u) {
    return pv_status_set(u->st, PV_INTERNAL, "%s: out of memory", u->path);
}

/* A directory above an entry could not be opened: a link or file in the way is the archive's
 * doing, anything else the machine's. */
static int in_the_way(ux *u, const char *what, const char *name, int err) {
    if (err == ELOOP || err == ENOTDIR)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: %s %s: a symbolic link or a file is in the way", u->path, what,
                             name);
    return pv_status_set(u->st, PV_INTERNAL, "%s: %s %s: open its directory: %s", u->path, what,
                         name, strerror(err));
}

/* libarchive could not write an entry: out of space or I/O is the machine's fault (INTERNAL),
 * anything else (its own secure checks, a link to nothing) the archive's. */
static int write_fail(ux *u, const char *name) {
    int err = archive_errno(u->out);
    bool machine = err == ENOSPC || err == EDQUOT || err == EIO || err == EROFS || err == ENOMEM ||
                   err == EMFILE || err == ENFILE;
    return pv_status_set(u->st, machine ? PV_INTERNAL : PV_FAILED_PRECONDITION, "%s: entry %s: %s",
                         u->path, name, errstr(u->out));
}

/* The next header could not be read: the archive is corrupt or refused by libarchive. */
static int read_fail(ux *u) {
    la_int64_t at = archive_read_header_position(u->in);
    if (at >= 0)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: a corrupt header at offset %lld: %s", u->path, (long long)at,
                             errstr(u->in));
    return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: a corrupt header: %s", u->path,
                         errstr(u->in));
}

/* --- vetting an entry ------------------------------------------------------------------------- */

/* Cleans a name into out (NAME_CAP bytes): leading "/" and "." components dropped (an absolute
 * name refused when checking: an image's names are relative to its root), ".." refused. The
 * result is relative and may be empty (the archive's "./"). what says which name it is in
 * messages ("entry", "hard link target"). */
static int clean_name(ux *u, const char *raw, const char *what, char *out) {
    if (u->check && raw[0] == '/')
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: %s \"%.200s\" is an absolute path: an image's names are "
                             "relative to its root",
                             u->path, what, raw);
    char name[NAME_CAP];
    if (strlen(raw) >= sizeof name)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: %s \"%.200s...\" is too long",
                             u->path, what, raw);
    memcpy(name, raw, strlen(raw) + 1);
    size_t o = 0;
    int depth = 0;
    char *save = NULL;
    for (char *c = strtok_r(name, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (strcmp(c, ".") == 0) continue;
        if (strcmp(c, "..") == 0)
            return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                                 "%s: %s \"%.200s\" names \"..\": it would leave the root", u->path,
                                 what, raw);
        if (++depth > DEPTH_MAX)
            return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: %s \"%.200s\" is too deep",
                                 u->path, what, raw);
        size_t l = strlen(c);
        if (o) out[o++] = '/';
        memcpy(out + o, c, l); /* never longer than raw, which fits */
        o += l;
    }
    out[o] = '\0';
    return PV_OK;
}

/* Refuses name (cleaned, relative) when a directory above it is a symbolic link or a file:
 * walks from dest without following links, as far as directories exist (libarchive makes the
 * rest, and nothing beyond a missing one can be a link). */
static int confine(ux *u, const char *what, const char *name) {
    char buf[NAME_CAP];
    snprintf(buf, sizeof buf, "%s", name);
    int fd = dup(u->dfd);
    if (fd < 0) return in_the_way(u, what, name, errno);
    int rc = PV_OK;
    char *comp = buf;
    for (char *slash; (slash = strchr(comp, '/')); comp = slash + 1) {
        *slash = '\0';
        int next = openat(fd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            if (errno != ENOENT) rc = in_the_way(u, what, name, errno);
            break;
        }
        close(fd);
        fd = next;
    }
    close(fd);
    return rc;
}

/* What a refused type is called; NULL when the type is allowed. */
static const char *refused_kind(mode_t type) {
    switch (type) {
    case AE_IFCHR:
        return "character device";
    case AE_IFBLK:
        return "block device";
    case AE_IFIFO:
        return "fifo";
    case AE_IFSOCK:
        return "socket";
    default:
        return NULL;
    }
}

/* A hard link may only link a file inside the root, reached without a link on the way. */
static int vet_hardlink(ux *u, struct archive_entry *e, const char *name) {
    char target[NAME_CAP];
    if (clean_name(u, archive_entry_hardlink(e), "hard link target", target) != PV_OK)
        return u->st->code;
    if (!*target)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: entry %s: links to the root",
                             u->path, name);
    if (confine(u, "hard link target", target) != PV_OK) return u->st->code;
    archive_entry_copy_hardlink(e, target);
    return PV_OK;
}

/* When checking, an entry keeps its name, type and link but no data, and modes that let the
 * scratch directory be removed whatever the archive says. */
static void make_inert(struct archive_entry *e) {
    bool dir = archive_entry_filetype(e) == AE_IFDIR;
    archive_entry_sparse_clear(e);
    archive_entry_set_size(e, 0);
    archive_entry_set_perm(e, dir ? 0700 : 0600);
}

/* Refuses what may not be in an image and rewrites the entry's names to their cleaned,
 * relative form (name, NAME_CAP bytes); *skip for the root itself. */
static int vet_entry(ux *u, struct archive_entry *e, char *name, bool *skip) {
    const char *raw = archive_entry_pathname(e);
    if (!raw)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: an entry without a readable name",
                             u->path);
    mode_t type = archive_entry_filetype(e);
    const char *kind = refused_kind(type);
    /* a device node in a workload's root would open the host's hardware to it */
    if (kind)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: entry \"%.200s\" is a %s: images may not hold device files, "
                             "fifos or sockets",
                             u->path, raw, kind);
    bool hard = archive_entry_hardlink(e) != NULL;
    if (!hard && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
        return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                             "%s: entry \"%.200s\" has a type images may not hold (0%o)", u->path,
                             raw, (unsigned)type);
    if (clean_name(u, raw, "entry", name) != PV_OK) return u->st->code;
    *skip = !*name; /* the archive's "./": the root is ours */
    if (*skip) return PV_OK;
    if (confine(u, "entry", name) != PV_OK) return u->st->code;
    if (hard && vet_hardlink(u, e, name) != PV_OK) return u->st->code;
    archive_entry_copy_pathname(e, name);
    if (u->check) make_inert(e);
    return PV_OK;
}

/* --- writing ---------------------------------------------------------------------------------- */

/* Moves an entry's data, block by block (holes of sparse files stay holes). */
static int copy_data(ux *u, const char *name) {
    for (;;) {
        const void *buf;
        size_t len;
        la_int64_t off;
        int r = archive_read_data_block(u->in, &buf, &len, &off);
        if (r == ARCHIVE_EOF) return PV_OK;
        if (failed(r))
            return pv_status_set(u->st, PV_FAILED_PRECONDITION,
                                 "%s: entry %s: its data is truncated or damaged: %s", u->path,
                                 name, errstr(u->in));
        /* ARCHIVE_OK in libarchive 3, the bytes written in 4: only a failure is below WARN */
        if (archive_write_data_block(u->out, buf, len, off) < ARCHIVE_WARN)
            return write_fail(u, name);
    }
}

static int put_entry(ux *u, struct archive_entry *e, const char *name) {
    if (failed(archive_write_header(u->out, e))) return write_fail(u, name);
    int rc = u->check ? PV_OK : copy_data(u, name);
    /* modes and times of files now; of directories at archive_write_close */
    if (failed(archive_write_finish_entry(u->out)) && rc == PV_OK) rc = write_fail(u, name);
    return rc;
}

/* One entry; *end at the archive's end. */
static int step(ux *u, bool *end) {
    struct archive_entry *e = NULL;
    int r = archive_read_next_header(u->in, &e);
    if (r == ARCHIVE_EOF) {
        *end = true;
        return PV_OK;
    }
    if (failed(r)) return read_fail(u);
    char name[NAME_CAP];
    bool skip = false;
    if (vet_entry(u, e, name, &skip) != PV_OK) return u->st->code;
    return skip ? PV_OK : put_entry(u, e, name);
}

/* --- the extraction thread -------------------------------------------------------------------- */

static int open_reader(ux *u) {
    pthread_once(&filters_once, probe_filters);
    if (!(u->in = archive_read_new())) return oom(u);
    archive_read_support_format_all(u->in);
    for (size_t i = 0; i < nfilters; i++)
        archive_read_support_filter_by_code(u->in, filters[i]);
    if (archive_read_open_fd(u->in, u->afd, READ_BLOCK) != ARCHIVE_OK)
        return pv_status_set(u->st, u->check ? PV_UNIMPLEMENTED : PV_FAILED_PRECONDITION,
                             "%s: not an archive the agent reads: %s", u->path, errstr(u->in));
    return PV_OK;
}

/* Numeric owners (no lookup functions set); no extended attributes, ACLs or file flags. */
static int open_writer(ux *u) {
    int flags = ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
                ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS;
    if (!u->check) flags |= ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME;
    if (u->set_owner) flags |= ARCHIVE_EXTRACT_OWNER;
    if (!(u->out = archive_write_disk_new())) return oom(u);
    if (archive_write_disk_set_options(u->out, flags) != ARCHIVE_OK)
        return pv_status_set(u->st, PV_INTERNAL, "%s: %s", u->path, errstr(u->out));
    return PV_OK;
}

/* Runs in the extraction thread: everything relative to dest happens here, closing the writer
 * too (it applies directory modes and times by name). */
static int extract_all(ux *u) {
    int rc = PV_OK;
    if (unshare(CLONE_FS) != 0 || fchdir(u->dfd) != 0) {
        rc = pv_status_set(u->st, PV_INTERNAL, "%s: entering %s: %s", u->path, u->dest,
                           strerror(errno));
        goto cleanup;
    }
    umask(022); /* the thread's own: directories libarchive makes for parents are 0755 */
    if (open_reader(u) != PV_OK || open_writer(u) != PV_OK) {
        rc = u->st->code;
        goto cleanup;
    }
    for (bool end = false; rc == PV_OK && !end;)
        rc = step(u, &end);
    if (rc == PV_OK && failed(archive_write_close(u->out)))
        rc = pv_status_set(u->st, PV_FAILED_PRECONDITION, "%s: finishing directories: %s", u->path,
                           errstr(u->out));
cleanup:
    archive_write_free(u->out);
    archive_read_free(u->in);
    return rc;
}

static void *extract_thread(void *arg) {
    ux *u = arg;
    u->rc = extract_all(u);
    return NULL;
}

/* Starts the thread with every signal blocked (signals stay with the agent's own threads) and
 * waits for it. */
static int run_thread(ux *u) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int err = pthread_create(&t, NULL, extract_thread, u);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0)
        return pv_status_set(u->st, PV_INTERNAL, "%s: a thread to extract it: %s", u->path,
                             strerror(err));
    pthread_join(t, NULL);
    return u->rc;
}

static int untar(const char *path, const char *dest, bool set_owner, bool check, pv_status *st) {
    ux u = {.path = path,
            .dest = dest,
            .set_owner = set_owner && !check,
            .check = check,
            .afd = -1,
            .dfd = -1,
            .st = st};
    struct stat sb;
    int rc;
    if ((u.afd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        rc = pv_status_set(st, errno == ENOENT ? PV_NOT_FOUND : PV_INTERNAL, "%s: %s", path,
                           strerror(errno));
        goto cleanup;
    }
    if (fstat(u.afd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s: not a regular file", path);
        goto cleanup;
    }
    if ((u.dfd = open(dest, O_DIRECTORY | O_RDONLY | O_CLOEXEC)) < 0) {
        rc = pv_status_set(st, PV_INTERNAL, "%s: open %s: %s", path, dest, strerror(errno));
        goto cleanup;
    }
    rc = run_thread(&u);
cleanup:
    if (u.dfd >= 0) close(u.dfd);
    if (u.afd >= 0) close(u.afd);
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
    /* modes were not applied and files are empty, so this removes everything */
    nftw(scratch, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
    return rc;
}
