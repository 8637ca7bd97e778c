/*
 * wk_docker_files: Send and Copy on the docker engine (see wk_engine_docker.h): a file goes in
 * as a one-entry tar (libarchive, in memory) with its mode and owner through PUT
 * /containers/{id}/archive into its directory; the directories missing on its way are made by
 * the same archive, from the deepest one that exists (HEAD archive tells), so existing
 * directories keep their own modes and owners. Copy is GET archive as the daemon gives it.
 */
#include <archive.h>
#include <archive_entry.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wk_engine_docker.h"

static int add_entry(struct archive *a, const char *name, bool dir, const void *data, size_t len,
                     int mode, int uid, int gid) {
    struct archive_entry *e = archive_entry_new();
    if (!e) return -1;
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, dir ? AE_IFDIR : AE_IFREG);
    archive_entry_set_perm(e, (mode_t)(mode & 07777));
    archive_entry_set_uid(e, uid < 0 ? 0 : uid);
    archive_entry_set_gid(e, uid < 0 || gid < 0 ? 0 : gid);
    archive_entry_set_size(e, dir ? 0 : (la_int64_t)len);
    archive_entry_set_mtime(e, time(NULL), 0);
    int rc = archive_write_header(a, e) == ARCHIVE_OK ? 0 : -1;
    if (rc == 0 && !dir && len > 0 && archive_write_data(a, data, len) != (la_ssize_t)len) rc = -1;
    archive_entry_free(e);
    return rc;
}

/* A tar of rel (relative to the directory it is unpacked in, which exists): the directories of
 * rel before its last component 0755, then the file. */
static int make_tar(const char *rel, const void *data, size_t len, int mode, int uid, int gid,
                    char **out, size_t *out_len, pv_status *st) {
    /* room for the file, a header (and a pax header) per entry, padding and the end blocks */
    size_t entries = 1;
    for (const char *c = rel; *c; c++)
        entries += *c == '/';
    size_t cap = len + entries * 4096 + 8192;
    *out = malloc(cap);
    struct archive *a = *out ? archive_write_new() : NULL;
    if (!a) return pv_status_set(st, PV_INTERNAL, "out of memory");
    archive_write_set_format_pax_restricted(a);
    archive_write_set_bytes_in_last_block(a, 1);
    int rc = archive_write_open_memory(a, *out, cap, out_len) == ARCHIVE_OK ? 0 : -1;
    char dir[4096];
    for (const char *slash = strchr(rel, '/'); rc == 0 && slash; slash = strchr(slash + 1, '/')) {
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - rel), rel);
        rc = add_entry(a, dir, true, NULL, 0, 0755, uid, gid);
    }
    if (rc == 0) rc = add_entry(a, rel, false, data, len, mode, uid, gid);
    if (rc == 0 && archive_write_close(a) != ARCHIVE_OK) rc = -1;
    if (rc != 0) pv_status_set(st, PV_INTERNAL, "tar: %s", archive_error_string(a) ?: "failed");
    archive_write_free(a);
    return rc == 0 ? PV_OK : st->code;
}

/* Whether path exists inside container cid (HEAD archive: 200 or 404). */
static int exists(wk_docker *d, const char *cid, const char *path, bool *yes, pv_status *st) {
    char *esc = wk_docker_escape(path), url[4600];
    snprintf(url, sizeof url, "/containers/%s/archive?path=%s", cid, esc ? esc : "");
    free(esc);
    wk_docker_req req = {.method = "HEAD", .path = url};
    wk_docker_resp r;
    if (wk_docker_call(d->api, &req, &r, st) != PV_OK) return st->code;
    *yes = r.status / 100 == 2;
    int rc = *yes || r.status == 404 ? PV_OK : wk_docker_check(&r, "archive stat", st);
    wk_docker_resp_clear(&r);
    return rc;
}

/* The deepest directory of path that exists ("/" at least): its length in path. */
static int existing_prefix(wk_docker *d, const char *cid, const char *path, size_t *at,
                           pv_status *st) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *slash = strrchr(dir, '/'); slash && slash > dir; slash = strrchr(dir, '/')) {
        *slash = '\0';
        bool yes = false;
        if (exists(d, cid, dir, &yes, st) != PV_OK) return st->code;
        if (yes) {
            *at = strlen(dir);
            return PV_OK;
        }
    }
    *at = 0;
    return PV_OK;
}

int wk_docker_put_file(void *impl, const char *id, const char *path, const void *data, size_t len,
                       int mode, int uid, int gid, pv_status *st) {
    wk_docker *d = impl;
    char abs[4096]; /* a relative path is taken from the root, as the process engine does */
    int n = snprintf(abs, sizeof abs, "%s%s", path && path[0] == '/' ? "" : "/", path ? path : "");
    if (!path || n >= 4000 || abs[n - 1] == '/' || strstr(abs, "/../") || strstr(abs, "/./") ||
        (n >= 3 && strcmp(abs + n - 3, "/..") == 0) || (n >= 2 && strcmp(abs + n - 2, "/.") == 0))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "path \"%.200s\": not a file path without . or .. components",
                             path ? path : "");
    path = abs;
    char cid[72];
    size_t at = 0;
    if (wk_docker_resolve(d, id, cid, st) != PV_OK ||
        existing_prefix(d, cid, path, &at, st) != PV_OK)
        return st->code;
    char base[4096];
    snprintf(base, sizeof base, "%.*s", (int)(at ? at : 1), at ? path : "/");
    char *tar = NULL;
    size_t tar_len = 0;
    if (make_tar(path + at + 1, data, len, mode, uid, gid, &tar, &tar_len, st) != PV_OK) {
        free(tar);
        return st->code;
    }
    char *esc = wk_docker_escape(base), url[4600];
    snprintf(url, sizeof url, "/containers/%s/archive?path=%s&noOverwriteDirNonDir=0", cid,
             esc ? esc : "");
    free(esc);
    wk_docker_req req = {.method = "PUT",
                         .path = url,
                         .body = tar,
                         .body_len = tar_len,
                         .content_type = "application/x-tar"};
    wk_docker_resp r;
    int rc = wk_docker_call(d->api, &req, &r, st);
    char what[4200];
    snprintf(what, sizeof what, "workload %.64s: put %s", id, path);
    if (rc == PV_OK) rc = wk_docker_check(&r, what, st);
    wk_docker_resp_clear(&r);
    free(tar);
    return rc;
}

int wk_docker_get_tar(void *impl, const char *id, const char *path, char **tar, size_t *len,
                      pv_status *st) {
    wk_docker *d = impl;
    *tar = NULL;
    *len = 0;
    char cid[72];
    if (wk_docker_resolve(d, id, cid, st) != PV_OK) return st->code;
    char *esc = wk_docker_escape(path ? path : ""), url[4600];
    snprintf(url, sizeof url, "/containers/%s/archive?path=%s", cid, esc ? esc : "");
    free(esc);
    wk_docker_req req = {.method = "GET", .path = url};
    wk_docker_resp r;
    if (wk_docker_call(d->api, &req, &r, st) != PV_OK) return st->code;
    char what[4200];
    snprintf(what, sizeof what, "workload %.64s: copy %s", id, path ? path : "");
    int rc = wk_docker_check(&r, what, st);
    if (rc == PV_OK) {
        *tar = r.body ? r.body : strdup("");
        *len = r.len;
        r.body = NULL;
    }
    wk_docker_resp_clear(&r);
    return rc;
}

/* The archive's first entry, which GET archive names after the path's last component. */
int wk_docker_get_file(void *impl, const char *id, const char *path, char **data, size_t *len,
                       int *mode, int *uid, int *gid, pv_status *st) {
    *data = NULL;
    *len = 0;
    char *tar = NULL;
    size_t tar_len = 0;
    if (wk_docker_get_tar(impl, id, path, &tar, &tar_len, st) != PV_OK) return st->code;
    struct archive *a = archive_read_new();
    struct archive_entry *e = NULL;
    int rc = a ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK) {
        archive_read_support_format_tar(a);
        if (archive_read_open_memory(a, tar, tar_len) != ARCHIVE_OK ||
            archive_read_next_header(a, &e) != ARCHIVE_OK)
            rc = pv_status_set(st, PV_INTERNAL, "workload %.64s: copy %s: %s", id, path,
                               archive_error_string(a) ?: "not an archive");
    }
    if (rc == PV_OK && archive_entry_filetype(e) != AE_IFREG)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "workload %.64s: %s is not a regular file",
                           id, path);
    la_int64_t size = rc == PV_OK ? archive_entry_size(e) : 0;
    if (rc == PV_OK && !(*data = malloc((size_t)size + 1)))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK && size > 0 && archive_read_data(a, *data, (size_t)size) != size)
        rc = pv_status_set(st, PV_INTERNAL, "workload %.64s: copy %s: short archive", id, path);
    if (rc == PV_OK) {
        *len = (size_t)size;
        *mode = (int)(archive_entry_perm(e) & 07777);
        *uid = (int)archive_entry_uid(e);
        *gid = (int)archive_entry_gid(e);
    } else {
        free(*data);
        *data = NULL;
    }
    if (a) archive_read_free(a);
    free(tar);
    return rc;
}
