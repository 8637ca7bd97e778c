/*
 * wk_vm_image: VM images (see wk_vm_image.h). An archive is read twice with libarchive: once
 * for its table (names, vm.json, the headers of its qcow2 disks) to check it without writing
 * anything, then unpacked by wk_untar (whose confinement rules apply) into a scratch directory
 * renamed into place with the resolved layout beside it (vm-image.json), so a half-unpacked
 * version is never taken for one.
 */
#include "wk_vm_image.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_id.h"
#include "wk_image.h"
#include "wk_storage.h"
#include "wk_untar.h"

#define VM_JSON_MAX (64 * 1024)
#define QCOW2_HEADER 104
#define LAYOUT "vm-image.json"

void wk_vm_image_clear(wk_vm_image *im) {
    if (!im) return;
    free(im->dir);
    free(im->kernel);
    free(im->initrd);
    free(im->cmdline);
    free(im->disk);
    memset(im, 0, sizeof *im);
}

static uint64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* NULL when the qcow2 header h (n bytes) stands alone, else why it does not. */
static const char *qcow2_refusal(const unsigned char *h, size_t n) {
    if (n < 72 || memcmp(h, "QFI\xfb", 4) != 0) return "is not a qcow2 image";
    uint32_t version = (uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 | (uint32_t)h[6] << 8 | h[7];
    if (version < 2 || version > 3) return "has a qcow2 version this engine does not know";
    if (be64(h + 8) != 0) return "has a backing file (a VM image's disk must stand alone)";
    if (version >= 3 && (n < 80 || (be64(h + 72) & 4) != 0))
        return "has an external data file (a VM image's disk must stand alone)";
    return NULL;
}

/* ---- the archive's table ------------------------------------------------------------------ */

typedef struct table {
    json_t *files; /* name -> true: the regular files */
    json_t *qcow2; /* name -> null, or the refusal of its header: files named *.qcow2 */
    char *vm_json; /* vm.json's text, NULL when the archive has none */
} table;

static void table_free(table *t) {
    json_decref(t->files);
    json_decref(t->qcow2);
    free(t->vm_json);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The entry's name without "./" or "/" in front. */
static const char *entry_name(struct archive_entry *e) {
    const char *n = archive_entry_pathname(e);
    while (n && (n[0] == '/' || (n[0] == '.' && n[1] == '/')))
        n += n[0] == '/' ? 1 : 2;
    return n ? n : "";
}

/* Up to cap bytes of the current entry's data into buf; the count read, -1 on error. */
static ssize_t read_head(struct archive *a, void *buf, size_t cap) {
    size_t got = 0;
    while (got < cap) {
        la_ssize_t r = archive_read_data(a, (char *)buf + got, cap - got);
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int table_entry(struct archive *a, struct archive_entry *e, table *t, pv_status *st) {
    const char *name = entry_name(e);
    if (archive_entry_filetype(e) != AE_IFREG) return PV_OK;
    json_object_set_new(t->files, name, json_true());
    if (strcmp(name, "vm.json") == 0) {
        char *buf = calloc(1, VM_JSON_MAX + 1);
        if (!buf) return pv_status_set(st, PV_INTERNAL, "out of memory");
        ssize_t n = read_head(a, buf, VM_JSON_MAX + 1);
        if (n < 0 || n > VM_JSON_MAX) {
            free(buf);
            return pv_status_set(st, PV_INVALID_ARGUMENT, "vm.json: %s",
                                 n < 0 ? archive_error_string(a) : "larger than 64 KiB");
        }
        free(t->vm_json);
        t->vm_json = buf;
    } else if (ends_with(name, ".qcow2")) {
        unsigned char h[QCOW2_HEADER];
        ssize_t n = read_head(a, h, sizeof h);
        const char *why = n < 0 ? "cannot be read" : qcow2_refusal(h, (size_t)n);
        json_object_set_new(t->qcow2, name, why ? json_string(why) : json_null());
    }
    return PV_OK;
}

/* The table of the archive at path. INVALID_ARGUMENT when it is no archive libarchive reads. */
static int table_read(const char *path, table *t, pv_status *st) {
    memset(t, 0, sizeof *t);
    t->files = json_object();
    t->qcow2 = json_object();
    struct archive *a = archive_read_new();
    if (!a || !t->files || !t->qcow2) {
        archive_read_free(a);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    archive_read_support_format_tar(a);
    archive_read_support_format_gnutar(a);
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_xz(a);
    archive_read_support_filter_zstd(a);
    int rc = PV_OK;
    if (archive_read_open_filename(a, path, 65536) != ARCHIVE_OK) {
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "not a tar archive or a qcow2 disk: %s",
                           archive_error_string(a));
    } else {
        struct archive_entry *e;
        int r;
        while (rc == PV_OK && (r = archive_read_next_header(a, &e)) != ARCHIVE_EOF) {
            if (r != ARCHIVE_OK && r != ARCHIVE_WARN)
                rc = pv_status_set(st, PV_INVALID_ARGUMENT, "not a tar archive or a qcow2 disk: %s",
                                   archive_error_string(a));
            else
                rc = table_entry(a, e, t, st);
        }
    }
    archive_read_free(a);
    return rc;
}

/* ---- the layout: what boots --------------------------------------------------------------- */

/* A vm.json name: a relative name of a regular file of the archive, without "..". */
static int member(const table *t, const json_t *vm, const char *field, const char **out,
                  pv_status *st) {
    *out = NULL;
    json_t *v = json_object_get(vm, field);
    if (!v || json_is_null(v)) return PV_OK;
    const char *s = json_string_value(v);
    if (!s || !*s || s[0] == '/' || strstr(s, "..") || !json_object_get(t->files, s))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "vm.json: %s must name a regular file of the image (\"%.200s\")",
                             field, s ? s : "not a string");
    *out = s;
    return PV_OK;
}

/* The layout of a checked archive: {kernel, initrd, cmdline, disk, format} (names relative to
 * the image's root), or INVALID_ARGUMENT saying what is wrong. */
static int layout_of(const table *t, json_t **out, pv_status *st) {
    *out = NULL;
    json_t *vm = NULL;
    if (t->vm_json) {
        json_error_t je;
        vm = json_loads(t->vm_json, 0, &je);
        if (!json_is_object(vm)) {
            json_decref(vm);
            return pv_status_set(st, PV_INVALID_ARGUMENT, "vm.json: not a JSON object (%s)",
                                 je.text);
        }
    }
    const char *kernel = NULL, *initrd = NULL, *disk = NULL;
    json_t *cmdline = json_object_get(vm, "cmdline");
    int rc = member(t, vm, "kernel", &kernel, st);
    if (rc == PV_OK) rc = member(t, vm, "initrd", &initrd, st);
    if (rc == PV_OK) rc = member(t, vm, "disk", &disk, st);
    if (rc == PV_OK && cmdline && !json_is_string(cmdline))
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "vm.json: cmdline must be a string");
    if (rc == PV_OK && !kernel && (initrd || cmdline))
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           "vm.json: %s needs a kernel (direct kernel boot)",
                           initrd ? "initrd" : "cmdline");
    if (rc == PV_OK && !disk)
        disk = json_object_get(t->files, "disk.qcow2") ? "disk.qcow2"
               : json_object_get(t->files, "disk.raw") ? "disk.raw"
                                                       : NULL;
    bool qcow2 = disk && ends_with(disk, ".qcow2");
    const char *why = qcow2 ? json_string_value(json_object_get(t->qcow2, disk)) : NULL;
    if (rc == PV_OK && why) rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%.200s %s", disk, why);
    if (rc == PV_OK && !kernel && !disk)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           "not a VM image: no vm.json naming a kernel, no disk.qcow2 or "
                           "disk.raw (README \"Virtual machines\")");
    if (rc == PV_OK) {
        *out = json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?}", "kernel", kernel, "initrd", initrd,
                         "cmdline", json_string_value(cmdline), "disk", disk, "format",
                         disk ? (qcow2 ? "qcow2" : "raw") : NULL);
        if (!*out) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    json_decref(vm);
    return rc;
}

/* Whether the file at path starts with qcow2's magic (a bare disk image). */
static bool starts_qcow2(const char *path, unsigned char h[QCOW2_HEADER], size_t *n) {
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t r = read(fd, h, QCOW2_HEADER);
    close(fd);
    *n = r > 0 ? (size_t)r : 0;
    return *n >= 4 && memcmp(h, "QFI\xfb", 4) == 0;
}

/* The layout of the store file at path (bare qcow2 or archive); *bare for a bare disk. */
static int check_file(const char *path, json_t **layout, bool *bare, pv_status *st) {
    *layout = NULL;
    *bare = false;
    if (access(path, R_OK) != 0)
        return pv_status_set(st, errno == ENOENT ? PV_NOT_FOUND : PV_INTERNAL, "%s: %s", path,
                             strerror(errno));
    unsigned char h[QCOW2_HEADER];
    size_t n;
    if (starts_qcow2(path, h, &n)) {
        const char *why = qcow2_refusal(h, n);
        if (why) return pv_status_set(st, PV_INVALID_ARGUMENT, "the qcow2 disk %s", why);
        *bare = true;
        *layout = json_pack("{s:s, s:s}", "disk", "disk.qcow2", "format", "qcow2");
        return *layout ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    table t;
    int rc = table_read(path, &t, st);
    if (rc == PV_OK) rc = layout_of(&t, layout, st);
    table_free(&t);
    return rc;
}

int wk_vm_image_check(const char *path, pv_status *st) {
    json_t *layout = NULL;
    bool bare;
    int rc = check_file(path, &layout, &bare, st);
    json_decref(layout);
    return rc;
}

/* ---- the unpacked versions ---------------------------------------------------------------- */

/* "dev ino size mtime" of the store file: what changes when BuildImage or CacheImage replaces
 * it (a rename of a new file). */
static int identity(const char *path, char *out, size_t cap) {
    struct stat sb;
    if (stat(path, &sb) != 0) return -1;
    snprintf(out, cap, "%ju %ju %jd %jd.%09ld", (uintmax_t)sb.st_dev, (uintmax_t)sb.st_ino,
             (intmax_t)sb.st_size, (intmax_t)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0; /* best effort: the rest goes on */
}

static void rm_tree(const char *dir) {
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

static char *join(const char *dir, const char *name) {
    char *p = NULL;
    return name && asprintf(&p, "%s/%s", dir, name) >= 0 ? p : NULL;
}

/* The unpacked version in dir (its vm-image.json) into *out. */
static int load_version(const char *dir, wk_vm_image *out, pv_status *st) {
    char *path = join(dir, LAYOUT);
    json_t *l = path ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    if (!json_is_object(l)) {
        json_decref(l);
        return pv_status_set(st, PV_NOT_FOUND, "%s: no %s", dir, LAYOUT);
    }
    const char *cmdline = json_string_value(json_object_get(l, "cmdline"));
    const char *format = json_string_value(json_object_get(l, "format"));
    out->dir = strdup(dir);
    out->kernel = join(dir, json_string_value(json_object_get(l, "kernel")));
    out->initrd = join(dir, json_string_value(json_object_get(l, "initrd")));
    out->cmdline = cmdline ? strdup(cmdline) : NULL;
    out->disk = join(dir, json_string_value(json_object_get(l, "disk")));
    out->disk_format = !out->disk ? NULL : format && strcmp(format, "raw") == 0 ? "raw" : "qcow2";
    json_decref(l);
    return out->dir ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}

/* Puts the bare qcow2 at store into tmp as disk.qcow2: a hard link, or a copy across file
 * systems. */
static int place_bare(const char *store, const char *tmp, pv_status *st) {
    char *disk = join(tmp, "disk.qcow2");
    if (!disk) return pv_status_set(st, PV_INTERNAL, "out of memory");
    int rc = PV_OK;
    if (link(store, disk) != 0) {
        int64_t copied = 0;
        rc = errno == EXDEV ? wk_storage_sparse_copy(store, disk, &copied, st)
                            : pv_status_set(st, PV_INTERNAL, "link %s: %s", disk, strerror(errno));
        if (rc == PV_OK) chmod(disk, 0644);
    }
    free(disk);
    return rc;
}

/* Unpacks the store file into <cache_dir>/<key>, its layout beside it. */
static int unpack(const char *store, const char *ref, const char *ident, const char *final,
                  const char *cache_dir, pv_status *st) {
    json_t *layout = NULL;
    bool bare = false;
    int rc = check_file(store, &layout, &bare, st);
    if (rc != PV_OK) return pv_status_prefix(st, "image %s", ref);
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.tmp-XXXXXX", cache_dir);
    if (!mkdtemp(tmp)) {
        json_decref(layout);
        return pv_status_set(st, PV_INTERNAL, "image %s: mkdtemp in %s: %s", ref, cache_dir,
                             strerror(errno));
    }
    chmod(tmp, 0711); /* QEMU's user reaches the kernel and the disk through it */
    rc = bare ? place_bare(store, tmp, st) : wk_untar_extract(store, tmp, false, st);
    if (rc != PV_OK) pv_status_prefix(st, "image %s: unpacking", ref);
    json_object_set_new(layout, "ref", json_string(ref));
    json_object_set_new(layout, "source", json_string(ident));
    char *lpath = join(tmp, LAYOUT);
    if (rc == PV_OK && (!lpath || json_dump_file(layout, lpath, JSON_COMPACT) != 0))
        rc = pv_status_set(st, PV_INTERNAL, "image %s: writing %s", ref, LAYOUT);
    free(lpath);
    json_decref(layout);
    if (rc == PV_OK && rename(tmp, final) != 0)
        rc = pv_status_set(st, PV_INTERNAL, "image %s: rename to %s: %s", ref, final,
                           strerror(errno));
    if (rc != PV_OK) rm_tree(tmp);
    return rc;
}

int wk_vm_image_open(const char *image_dir, const char *ref, const char *cache_dir,
                     wk_vm_image *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    char *store = NULL, ident[160], key[65], final[PATH_MAX];
    int rc = wk_image_find(image_dir, ref, &store, st);
    if (rc != PV_OK) return rc;
    if (identity(store, ident, sizeof ident) != 0) {
        rc = pv_status_set(st, PV_NOT_FOUND, "image %s: %s", ref, strerror(errno));
        goto done;
    }
    char *keyed = NULL;
    if (asprintf(&keyed, "%s\n%s", ref, ident) < 0) {
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        goto done;
    }
    pv_sha256_hex(keyed, strlen(keyed), key);
    free(keyed);
    key[24] = '\0';
    snprintf(final, sizeof final, "%s/%s", cache_dir, key);
    if (mkdir(cache_dir, 0711) != 0 && errno != EEXIST) {
        rc = pv_status_set(st, PV_INTERNAL, "mkdir %s: %s", cache_dir, strerror(errno));
        goto done;
    }
    if (load_version(final, out, st) == PV_OK) goto done;
    rm_tree(final); /* a directory without its layout is no version */
    rc = unpack(store, ref, ident, final, cache_dir, st);
    if (rc == PV_OK) rc = load_version(final, out, st);
done:
    free(store);
    if (rc != PV_OK) wk_vm_image_clear(out);
    return rc;
}

/* Whether the version in dir is still the store's version of its image. */
static bool current(const char *image_dir, const char *dir) {
    char *path = join(dir, LAYOUT), *store = NULL, ident[160];
    json_t *l = path ? json_load_file(path, 0, NULL) : NULL;
    free(path);
    const char *ref = json_string_value(json_object_get(l, "ref"));
    const char *source = json_string_value(json_object_get(l, "source"));
    pv_status st;
    bool same = ref && source && wk_image_find(image_dir, ref, &store, &st) == PV_OK &&
                identity(store, ident, sizeof ident) == 0 && strcmp(ident, source) == 0;
    free(store);
    json_decref(l);
    return same;
}

void wk_vm_image_collect(const char *image_dir, const char *cache_dir,
                         bool (*in_use)(const char *dir, void *arg), void *arg) {
    DIR *d = opendir(cache_dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char dir[PATH_MAX];
        if ((size_t)snprintf(dir, sizeof dir, "%s/%s", cache_dir, e->d_name) >= sizeof dir)
            continue;
        bool scratch = strncmp(e->d_name, ".tmp-", 5) == 0;
        if (scratch || (!in_use(dir, arg) && !current(image_dir, dir))) rm_tree(dir);
    }
    closedir(d);
}
