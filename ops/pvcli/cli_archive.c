/*
 * cli_archive: a directory as a tar in memory, with libarchive's disk reader and pax writer
 * (see cli_archive.h).
 *
 * The archive is written into a growable buffer through libarchive's callbacks, so a tree of
 * any shape becomes one request body without a temporary file.
 */
#include "cli_archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct membuf {
    unsigned char *data;
    size_t len, cap;
} membuf;

static la_ssize_t mem_write(struct archive *a, void *arg, const void *buf, size_t n) {
    (void)a;
    membuf *m = arg;
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < m->len + n)
            cap *= 2;
        unsigned char *d = realloc(m->data, cap);
        if (!d) return -1;
        m->data = d;
        m->cap = cap;
    }
    memcpy(m->data + m->len, buf, n);
    m->len += n;
    return (la_ssize_t)n;
}

static int read_file(const char *path, unsigned char **out, size_t *len, char *err, size_t cap) {
    FILE *f = fopen(path, "rb");
    membuf m = {0};
    if (!f) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        if (mem_write(NULL, &m, buf, n) < 0) break;
    int bad = ferror(f) || !feof(f);
    fclose(f);
    if (bad) {
        free(m.data);
        snprintf(err, cap, "%s: cannot read it", path);
        return -1;
    }
    *out = m.data;
    *len = m.len;
    return 0;
}

/* Copies the data of the entry the disk reader is on into the archive being written (holes
 * read as zeros: a tar member is its whole content). */
static int copy_data(struct archive *disk, struct archive *w) {
    char buf[65536];
    la_ssize_t n;
    while ((n = archive_read_data(disk, buf, sizeof buf)) > 0)
        if (archive_write_data(w, buf, (size_t)n) != n) return -1;
    return n == 0 ? 0 : -1;
}

/* Names the entry relative to the directory dir (dir itself: ""), refusing what an image may
 * not hold. 1: skip it (the directory itself), 0: write it, -1: refused (err set). */
static int relative_entry(struct archive_entry *e, const char *dir, char *err, size_t cap) {
    const char *p = archive_entry_pathname(e);
    size_t n = strlen(dir);
    if (strncmp(p, dir, n) != 0) {
        snprintf(err, cap, "%s: outside %s", p, dir);
        return -1;
    }
    p += n;
    while (*p == '/')
        p++;
    if (!*p) return 1;
    mode_t type = archive_entry_filetype(e);
    if (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
        snprintf(err, cap, "%s/%s: devices, fifos and sockets cannot go into an image", dir, p);
        return -1;
    }
    char *rel = strdup(p);
    if (!rel) return -1;
    archive_entry_copy_pathname(e, rel);
    free(rel);
    archive_entry_set_uname(e, NULL); /* the node gives the files its own owner */
    archive_entry_set_gname(e, NULL);
    return 0;
}

static int archive_dir(const char *dir, unsigned char **out, size_t *len, char *err, size_t cap) {
    membuf m = {0};
    struct archive *disk = archive_read_disk_new();
    struct archive *w = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    int rc = -1;
    if (!disk || !w || !e) {
        snprintf(err, cap, "out of memory");
        goto done;
    }
    archive_read_disk_set_symlink_physical(disk); /* links are stored, never followed */
    archive_write_set_format_pax_restricted(w);
    archive_write_set_bytes_in_last_block(w, 1);
    if (archive_write_open2(w, &m, NULL, mem_write, NULL, NULL) != ARCHIVE_OK ||
        archive_read_disk_open(disk, dir) != ARCHIVE_OK) {
        snprintf(err, cap, "%s: %s", dir,
                 archive_error_string(disk) ?: archive_error_string(w) ?: "cannot archive it");
        goto done;
    }
    int r;
    while ((r = archive_read_next_header2(disk, e)) == ARCHIVE_OK) {
        archive_read_disk_descend(disk);
        int what = relative_entry(e, dir, err, cap);
        if (what < 0) goto done;
        if (what > 0) continue;
        if (archive_write_header(w, e) != ARCHIVE_OK ||
            (archive_entry_filetype(e) == AE_IFREG && copy_data(disk, w) != 0)) {
            snprintf(err, cap, "%s: %s", archive_entry_pathname(e),
                     archive_error_string(w) ?: archive_error_string(disk) ?: "write failed");
            goto done;
        }
    }
    if (r != ARCHIVE_EOF || archive_write_close(w) != ARCHIVE_OK) {
        snprintf(err, cap, "%s: %s", dir, archive_error_string(disk) ?: "cannot archive it");
        goto done;
    }
    *out = m.data;
    *len = m.len;
    m.data = NULL;
    rc = 0;
done:
    if (e) archive_entry_free(e);
    if (w) archive_write_free(w); /* may still write its last block into m */
    if (disk) archive_read_free(disk);
    free(m.data);
    return rc;
}

int cli_archive_load(const char *path, unsigned char **out, size_t *len, char *err, size_t cap) {
    struct stat sb;
    *out = NULL;
    *len = 0;
    if (stat(path, &sb) != 0) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(sb.st_mode)) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--)
            dir[n - 1] = '\0';
        return archive_dir(dir, out, len, err, cap);
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, cap, "%s: neither a directory nor an archive file", path);
        return -1;
    }
    return read_file(path, out, len, err, cap);
}
