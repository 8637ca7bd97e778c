/*
 * wk_node_image: images on a node (see wk_node_image.h).
 */
#include "wk_node_image.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_b64.h"
#include "pv_id.h"
#include "wk_agent.h"
#include "wk_engine.h"
#include "wk_files.h"
#include "wk_image.h"

static wk_agent *agent_of(wk_op *op, pv_status *st) {
    wk_agent *a = wk_op_context(op);
    if (!a)
        pv_status_set(st, PV_FAILED_PRECONDITION, "%s needs the node agent",
                      wk_op_record(op)->kind);
    return a;
}

/* SHA-256 of a file's content (hex), or "" when it cannot be read. */
static void file_digest(const char *path, char out[65]) {
    out[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *buf = size >= 0 && size < (1L << 30) ? malloc((size_t)size + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)size, f) == (size_t)size)
        pv_sha256_hex(buf, (size_t)size, out);
    free(buf);
    fclose(f);
}

/* Walks dir (relative name rel) and reports every "<name>/<tag>.tar" as "name:tag". */
static int walk(wk_op *op, const char *dir, const char *rel, const char *filter, pv_status *st) {
    DIR *d = opendir(dir);
    if (!d) return PV_OK; /* no store yet: no images */
    int rc = PV_OK;
    for (struct dirent *e; rc == PV_OK && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX], name[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= sizeof path) continue;
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode)) {
            snprintf(name, sizeof name, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
            rc = walk(op, path, name, filter, st);
            continue;
        }
        size_t len = strlen(e->d_name);
        if (!S_ISREG(sb.st_mode) || len < 5 || strcmp(e->d_name + len - 4, ".tar") != 0 || !*rel)
            continue;
        snprintf(name, sizeof name, "%s:%.*s", rel, (int)(len - 4), e->d_name);
        if (filter && *filter && fnmatch(filter, name, 0) != 0) continue;
        char id[65];
        file_digest(path, id);
        const char *fields[] = {"type", "ref", "id"}, *values[] = {"image", name, id};
        rc = wk_op_output(op, 3, fields, values, st);
    }
    closedir(d);
    return rc;
}

int wk_node_image_list(wk_op *op, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    return walk(op, wk_agent_image_dir(a), "", wk_op_param(op, "filter"), st);
}

static int report(wk_op *op, const char *type, const char *image, int ok, const char *message,
                  pv_status *st) {
    const char *fields[] = {"type", "image", "success", "message"};
    const char *values[] = {type, image, ok ? "1" : "0", message};
    return wk_op_output(op, 4, fields, values, st);
}

/* Removes the directories between path's directory and root that are left empty. */
static void prune(const char *root, const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *slash = strrchr(dir, '/'); slash && slash > dir; slash = strrchr(dir, '/')) {
        *slash = '\0';
        if (strcmp(dir, root) == 0 || strlen(dir) <= strlen(root) || rmdir(dir) != 0) break;
    }
}

int wk_node_image_remove(wk_op *op, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    bool prune_dirs = json_is_true(json_object_get(params, "prune"));
    size_t i;
    json_t *v;
    int rc = PV_OK;
    json_array_foreach(json_object_get(params, "images"), i, v) {
        if (rc != PV_OK) break;
        const char *ref = json_string_value(v) ? json_string_value(v) : "";
        char *path = NULL;
        pv_status ist;
        if (wk_image_find(wk_agent_image_dir(a), ref, &path, &ist) != PV_OK) {
            rc = report(op, "image_removed", ref, 0, ist.msg, st);
        } else if (unlink(path) != 0) {
            char msg[PV_STATUS_MSG_MAX];
            snprintf(msg, sizeof msg, "remove %s: %s", ref, strerror(errno));
            rc = report(op, "image_removed", ref, 0, msg, st);
        } else {
            if (prune_dirs) prune(wk_agent_image_dir(a), path);
            rc = report(op, "image_removed", ref, 1, "removed", st);
        }
        free(path);
    }
    json_decref(params);
    return rc;
}

/* mkdir -p of path's directory. */
static int make_parents(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}

static int copy_file(const char *src, const char *dst, char *msg, size_t len) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.part-%d", dst, (int)getpid());
    int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, ok = 0;
    if (in >= 0 && make_parents(dst) == 0)
        out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (in >= 0 && out >= 0) {
        char buf[65536];
        ssize_t n;
        ok = 1;
        while (ok && (n = read(in, buf, sizeof buf)) != 0) {
            if (n < 0 && errno == EINTR) continue;
            ok = n > 0 && write(out, buf, (size_t)n) == n;
        }
        ok = ok && fsync(out) == 0;
    }
    int err = errno;
    if (out >= 0) close(out);
    if (in >= 0) close(in);
    if (ok && rename(tmp, dst) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        snprintf(msg, len, "copy to %s: %s", dst, strerror(err));
    }
    return ok;
}

int wk_node_image_cache(wk_op *op, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    size_t i;
    json_t *v;
    int rc = PV_OK;
    json_array_foreach(json_object_get(params, "images"), i, v) {
        if (rc != PV_OK) break;
        const char *ref = json_string_value(v) ? json_string_value(v) : "";
        char *src = NULL, *dst = NULL, msg[PV_STATUS_MSG_MAX];
        pv_status ist;
        if (wk_image_find(wk_agent_registry_dir(a), ref, &src, &ist) != PV_OK ||
            wk_image_path(wk_agent_image_dir(a), ref, &dst, &ist) != PV_OK)
            rc = report(op, "image_cached", ref, 0, ist.msg, st);
        else if (!copy_file(src, dst, msg, sizeof msg))
            rc = report(op, "image_cached", ref, 0, msg, st);
        else
            rc = report(op, "image_cached", ref, 1, "cached", st);
        free(src);
        free(dst);
    }
    json_decref(params);
    return rc;
}

/* Writes data to path atomically (a temporary file renamed in place). */
static int write_file(const char *path, const void *data, size_t len, char *msg, size_t mlen) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.part-%d", path, (int)getpid());
    int fd =
        make_parents(path) == 0 ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    int ok = fd >= 0 && write(fd, data, len) == (ssize_t)len && fsync(fd) == 0;
    int err = errno;
    if (fd >= 0) close(fd);
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        snprintf(msg, mlen, "write %s: %s", path, strerror(err));
    }
    return ok;
}

int wk_node_image_build(wk_op *op, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    const char *b64 = json_string_value(json_object_get(params, "tar"));
    const char *exist = json_string_value(json_object_get(params, "exist_id"));
    unsigned char *tar = NULL;
    size_t len = 0;
    int rc = PV_OK;
    if (b64) {
        rc = pv_b64_decode("tar", b64, &tar, &len, st);
    } else if (exist && wk_agent_engine(a)) {
        wk_engine_info info = {0};
        rc = wk_engine_inspect(wk_agent_engine(a), exist, &info, st);
        if (rc == PV_OK && !info.root)
            rc = pv_status_set(st, PV_UNIMPLEMENTED, "workload %s: its engine has no files here",
                               exist);
        if (rc == PV_OK) rc = wk_files_tar_root(info.root, (char **)&tar, &len, st);
        wk_engine_info_clear(&info);
    } else {
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "params: tar or exist_id is required");
    }
    char id[65] = "";
    if (rc == PV_OK) pv_sha256_hex(tar, len, id);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(params, "refs"), i, v) {
        if (rc != PV_OK) break;
        const char *ref = json_string_value(v) ? json_string_value(v) : "";
        char *store = NULL, *registry = NULL, msg[PV_STATUS_MSG_MAX] = "";
        pv_status ist;
        if (wk_image_path(wk_agent_image_dir(a), ref, &store, &ist) != PV_OK ||
            wk_image_path(wk_agent_registry_dir(a), ref, &registry, &ist) != PV_OK) {
            rc = pv_status_set(st, ist.code, "%s", ist.msg);
        } else if (!write_file(store, tar, len, msg, sizeof msg) ||
                   !write_file(registry, tar, len, msg, sizeof msg)) {
            rc = pv_status_set(st, PV_INTERNAL, "%s", msg);
        } else {
            char stream[PV_STATUS_MSG_MAX];
            snprintf(stream, sizeof stream, "stored %s (%zu bytes) on %s and in the registry", ref,
                     len, wk_agent_node(a));
            const char *fields[] = {"type", "ref", "id", "stream"};
            const char *values[] = {"built", ref, id, stream};
            rc = wk_op_output(op, 4, fields, values, st);
        }
        free(store);
        free(registry);
    }
    free(tar);
    json_decref(params);
    return rc;
}
