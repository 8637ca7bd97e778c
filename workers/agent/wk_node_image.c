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
#include <stdbool.h>
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
#include "wk_uids.h"
#include "wk_untar.h"
#include "wk_vm_image.h"
#include "pv_log.h"
#include "pv_upload.h"

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

/* Whether image ref ("hub/ns/app:tag") passes ListImage's filter, as Eru's Docker engine reads
 * one: a glob on the whole reference, and a repository without a tag ("hub/ns/app", globs too)
 * matching every tag of it. */
static bool image_matches(const char *filter, const char *ref) {
    if (!filter || !*filter || fnmatch(filter, ref, 0) == 0) return true;
    const char *slash = strrchr(filter, '/'), *colon = strrchr(filter, ':');
    if (colon && (!slash || colon > slash)) return false; /* it names a tag: the whole ref */
    const char *tag = strrchr(ref, ':');
    char repo[PATH_MAX];
    snprintf(repo, sizeof repo, "%.*s", (int)(tag ? tag - ref : (long)strlen(ref)), ref);
    return fnmatch(filter, repo, 0) == 0;
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
        if (!image_matches(filter, name)) continue;
        char id[65];
        file_digest(path, id);
        const char *fields[] = {"type", "ref", "id"}, *values[] = {"image", name, id};
        rc = wk_op_output(op, 3, fields, values, st);
    }
    closedir(d);
    return rc;
}

/* ---- engines that hold their images themselves (docker) ---- */

static bool engine_images(wk_agent *a) {
    return wk_agent_engine(a) && strcmp(wk_engine_type(wk_agent_engine(a)), "docker") == 0;
}

static int engine_list(wk_op *op, wk_agent *a, const char *filter, pv_status *st) {
    wk_engine_image *v = NULL;
    size_t n = 0;
    if (wk_engine_image_list(wk_agent_engine(a), &v, &n, st) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (!image_matches(filter, v[i].ref)) continue;
        const char *fields[] = {"type", "ref", "id"}, *values[] = {"image", v[i].ref, v[i].id};
        rc = wk_op_output(op, 3, fields, values, st);
    }
    wk_engine_image_array_free(v, n);
    return rc;
}

int wk_node_image_list(wk_op *op, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    if (engine_images(a)) return engine_list(op, a, wk_op_param(op, "filter"), st);
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

/* Why ref may not be removed from a virt node's store: the workloads whose domains boot from it
 * (their root disks are overlays on it); NULL when none does (malloc'd message otherwise). */
static char *vm_users(wk_agent *a, const char *ref) {
    wk_engine *e = wk_agent_engine(a);
    wk_engine_info *infos = NULL;
    size_t n = 0;
    pv_status st;
    if (!e || strcmp(wk_engine_type(e), "virt") != 0 || wk_engine_list(e, &infos, &n, &st) != PV_OK)
        return NULL;
    char *msg = NULL;
    size_t len = 0, users = 0;
    FILE *f = open_memstream(&msg, &len);
    for (size_t i = 0; f && i < n; i++)
        if (infos[i].image && strcmp(infos[i].image, ref) == 0)
            fprintf(f, "%s%s", users++ ? ", " : "", infos[i].id);
    if (f) fclose(f);
    wk_engine_info_array_free(infos, n);
    if (users == 0 || !msg) {
        free(msg);
        return NULL;
    }
    char *out = NULL;
    if (asprintf(&out, "image %s is in use: the root disks of workload%s %s are based on it", ref,
                 users > 1 ? "s" : "", msg) < 0)
        out = NULL;
    free(msg);
    return out;
}

/* What image.remove_on_node and image.cache_on_node do to one image of params.images (ref ""
 * for an entry that is not a string); a failure the entry reports is not one of the op's. */
typedef int (*image_step)(wk_op *op, wk_agent *a, const json_t *params, const char *ref,
                          pv_status *st);

/* Runs step for each of params.images in order, until one fails: PV_OK or its code. */
static int each_image(wk_op *op, image_step step, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    size_t i;
    json_t *v;
    int rc = PV_OK;
    json_array_foreach(json_object_get(params, "images"), i, v) {
        if (rc != PV_OK) break;
        rc = step(op, a, params, json_string_value(v) ? json_string_value(v) : "", st);
    }
    json_decref(params);
    return rc;
}

static int remove_image(wk_op *op, wk_agent *a, const json_t *params, const char *ref,
                        pv_status *st) {
    char *path = NULL, *users = NULL;
    pv_status ist;
    int rc;
    bool prune_dirs = json_is_true(json_object_get(params, "prune"));
    if (engine_images(a)) {
        bool ok = wk_engine_image_remove(wk_agent_engine(a), ref, prune_dirs, &ist) == PV_OK;
        rc = report(op, "image_removed", ref, ok, ok ? "removed" : ist.msg, st);
    } else if (wk_image_find(wk_agent_image_dir(a), ref, &path, &ist) != PV_OK) {
        rc = report(op, "image_removed", ref, 0, ist.msg, st);
    } else if ((users = vm_users(a, ref))) {
        rc = report(op, "image_removed", ref, 0, users, st);
        free(users);
    } else if (unlink(path) != 0) {
        char msg[PV_STATUS_MSG_MAX];
        snprintf(msg, sizeof msg, "remove %s: %s", ref, strerror(errno));
        rc = report(op, "image_removed", ref, 0, msg, st);
    } else {
        if (prune_dirs) prune(wk_agent_image_dir(a), path);
        rc = report(op, "image_removed", ref, 1, "removed", st);
    }
    free(path);
    return rc;
}

int wk_node_image_remove(wk_op *op, pv_status *st) {
    return each_image(op, remove_image, st);
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

/* Ends a write of tmp that is to replace dst: renamed in place when ok, else removed, with
 * "<verb> <dst>: <strerror(err)>" in msg (err: the errno of the step that failed). Returns
 * whether dst now has the new content. */
static int replace_with(const char *tmp, const char *dst, int ok, int err, const char *verb,
                        char *msg, size_t len) {
    if (ok && rename(tmp, dst) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlink(tmp);
        snprintf(msg, len, "%s %s: %s", verb, dst, strerror(err));
    }
    return ok;
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
    return replace_with(tmp, dst, ok, err, "copy to", msg, len);
}

static int cache_image(wk_op *op, wk_agent *a, const json_t *params, const char *ref,
                       pv_status *st) {
    (void)params;
    char *src = NULL, *dst = NULL, msg[PV_STATUS_MSG_MAX];
    pv_status ist;
    int rc;
    if (engine_images(a)) {
        bool ok = wk_engine_image_pull(wk_agent_engine(a), ref, &ist) == PV_OK;
        rc = report(op, "image_cached", ref, ok, ok ? "cached" : ist.msg, st);
    } else if (wk_image_find(wk_agent_registry_dir(a), ref, &src, &ist) != PV_OK ||
               wk_image_path(wk_agent_image_dir(a), ref, &dst, &ist) != PV_OK)
        rc = report(op, "image_cached", ref, 0, ist.msg, st);
    else if (!copy_file(src, dst, msg, sizeof msg))
        rc = report(op, "image_cached", ref, 0, msg, st);
    else
        rc = report(op, "image_cached", ref, 1, "cached", st);
    free(src);
    free(dst);
    return rc;
}

int wk_node_image_cache(wk_op *op, pv_status *st) {
    return each_image(op, cache_image, st);
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
    return replace_with(tmp, path, ok, err, "write", msg, mlen);
}

/* ---- SCM builds ----
 * Each stage of builds.stages runs in a root of its own under <data_dir>/build/<op>/<stage>:
 * the base image unpacked (an image of this node's store; none or "scratch": empty), the repo
 * cloned at version and copied into <root>/<dir> without its .git, then each command run with
 * sh -c in <root>/<dir> with envs and args in its environment. A stage's artifacts (path in its
 * root -> path in the next stage's root) are copied into the next stage; the last stage's root
 * is the image. Every program's output goes to the operation's output as build log lines. */

#define BUILD_STEP_TIMEOUT_MS (10 * 60 * 1000)
#define BUILD_LOG_LINES_MAX 2000

typedef struct build_ctx {
    wk_op *op;
    wk_agent *agent;
    wk_engine *engine;
    char work[PATH_MAX];
    size_t log_lines;
    /* the build's commands run as a uid of their own (worker.default_user "dynamic", a root
     * agent): they can write their stage roots and what the host leaves open, nothing of the
     * agent's */
    bool confined;
    uid_t uid;
    char uid_dir[PATH_MAX];
} build_ctx;

static int build_log(build_ctx *b, const char *text, size_t len, pv_status *st) {
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (b->log_lines++ < BUILD_LOG_LINES_MAX) {
            char *line = strndup(p, n);
            if (!line) return pv_status_set(st, PV_INTERNAL, "out of memory");
            const char *fields[] = {"type", "stream"}, *values[] = {"log", line};
            int rc = wk_op_output(b->op, 2, fields, values, st);
            free(line);
            if (rc != PV_OK) return rc;
        }
        p += n + 1;
    }
    return PV_OK;
}

/* Runs one build step; a non-zero exit fails the build with the end of its output. */
static int build_run(build_ctx *b, const char *what, const char *const *argv, size_t argc,
                     const char *const *env, const char *cwd, pv_status *st) {
    int code = -1;
    char *out = NULL;
    size_t len = 0;
    int rc = wk_engine_run(b->engine, argv, argc, env, cwd, BUILD_STEP_TIMEOUT_MS, &code, &out,
                           &len, st);
    if (out && len && build_log(b, out, len, st) != PV_OK) rc = st->code;
    if (rc == PV_OK && code != 0) {
        /* the end of its output, on one line */
        char *tail = out && len > 300 ? out + len - 300 : out ? out : "";
        for (char *c = tail; *c; c++)
            if (*c == '\n' || *c == '\r' || *c == '\t') *c = ' ';
        while (*tail == ' ')
            tail++;
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s exited with %d%s%s", what, code,
                           *tail ? ": " : "", tail);
    } else if (rc != PV_OK && rc != PV_ABORTED) {
        pv_status_prefix(st, "%s", what);
    }
    free(out);
    return rc;
}

/* Runs argv as the build's own user when the build is confined (setpriv(1) of util-linux,
 * essential on Debian: no supplementary groups, no way back), else as the agent. */
static int build_run_as_builder(build_ctx *b, const char *what, const char *const *argv,
                                size_t argc, const char *const *env, const char *cwd,
                                pv_status *st) {
    if (!b->confined) return build_run(b, what, argv, argc, env, cwd, st);
    const char **wrapped = calloc(argc + 7, sizeof *wrapped);
    if (!wrapped) return pv_status_set(st, PV_INTERNAL, "out of memory");
    char id[16];
    snprintf(id, sizeof id, "%u", (unsigned)b->uid);
    const char *prefix[] = {"/usr/bin/setpriv", "--reuid", id, "--regid", id,
                            "--clear-groups",   "--"};
    memcpy(wrapped, prefix, sizeof prefix);
    memcpy(wrapped + 7, argv, argc * sizeof *argv);
    int rc = build_run(b, what, wrapped, argc + 7, env, cwd, st);
    free(wrapped);
    return rc;
}

/* Gives path (a stage's root, what the agent unpacked or cloned there) to the build's user. */
static int give_to_builder(build_ctx *b, const char *path, pv_status *st) {
    if (!b->confined) return PV_OK;
    char owner[40];
    snprintf(owner, sizeof owner, "%u:%u", (unsigned)b->uid, (unsigned)b->uid);
    const char *argv[] = {"chown", "-R", "-h", "--", owner, path};
    return build_run(b, "chown", argv, 6, NULL, "/", st);
}

static int build_shell(build_ctx *b, const char *what, const char *script, const char *cwd,
                       const char *const *env, pv_status *st) {
    const char *argv[] = {"/bin/sh", "-c", script};
    return build_run_as_builder(b, what, argv, 3, env, cwd, st);
}

/* A path inside root: rel without leading '/' (".." was refused by the gateway). */
static void inside(char *out, size_t cap, const char *root, const char *rel) {
    while (rel && *rel == '/')
        rel++;
    snprintf(out, cap, "%s/%s", root, rel && *rel ? rel : "");
}

/* envs and args of a build as "KEY=VALUE" (PATH first unless they set it); NULL-terminated. */
static char **build_env(json_t *build) {
    json_t *all = json_object();
    json_object_set_new(
        all, "PATH", json_string("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
    json_object_update(all, json_object_get(build, "args"));
    json_object_update(all, json_object_get(build, "envs"));
    char **env = calloc(json_object_size(all) + 1, sizeof *env);
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(all, k, v) {
        if (env &&
            asprintf(&env[n], "%s=%s", k, json_string_value(v) ? json_string_value(v) : "") >= 0)
            n++;
    }
    json_decref(all);
    return env;
}

static void env_free(char **env) {
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

static int build_stage(build_ctx *b, const char *stage, json_t *build, const char *root,
                       const char *next_root, pv_status *st) {
    char path[PATH_MAX], dir[PATH_MAX];
    const char *base = json_string_value(json_object_get(build, "base"));
    const char *repo = json_string_value(json_object_get(build, "repo"));
    const char *version = json_string_value(json_object_get(build, "version"));
    const char *subdir = json_string_value(json_object_get(build, "dir"));
    bool submodule = json_is_true(json_object_get(build, "submodule"));
    int rc = PV_OK;
    if (base && *base && strcmp(base, "scratch") != 0) {
        char *image = NULL;
        rc = wk_image_path(wk_agent_image_dir(b->agent), base, &image, st);
        if (rc == PV_OK) {
            rc = wk_untar_extract(image, root, false, st);
            if (rc != PV_OK && rc != PV_NOT_FOUND) pv_status_prefix(st, "base image %s", base);
            if (rc == PV_NOT_FOUND)
                pv_status_set(st, PV_FAILED_PRECONDITION,
                              "stage %s: base image %s is not in node %s's store", stage, base,
                              wk_agent_node(b->agent));
        }
        free(image);
        if (rc != PV_OK) return rc;
    }
    inside(dir, sizeof dir, root, subdir);
    if (rc == PV_OK) {
        const char *argv[] = {"mkdir", "-p", dir};
        rc = build_run(b, "mkdir", argv, 3, NULL, root, st);
    }
    if (rc == PV_OK && repo && *repo) {
        if (snprintf(path, sizeof path, "%s/%s.src", b->work, stage) >= (int)sizeof path)
            return pv_status_set(st, PV_INVALID_ARGUMENT, "stage %s: name too long", stage);
        char ssh[PATH_MAX + 64] = "";
        if (*wk_agent_git_key(b->agent))
            snprintf(ssh, sizeof ssh, "GIT_SSH_COMMAND=ssh -i %s -o IdentitiesOnly=yes",
                     wk_agent_git_key(b->agent));
        const char *git_env[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "GIT_TERMINAL_PROMPT=0",
                                 ssh[0] ? ssh : NULL, NULL};
        const char *clone[] = {
            "git",     "clone",
            "--quiet", submodule ? "--recurse-submodules" : "--no-recurse-submodules",
            "--",      repo,
            path};
        rc = build_run(b, "git clone", clone, 7, git_env, b->work, st);
        if (rc == PV_OK && version && *version) {
            const char *co[] = {"git", "-C", path, "checkout", "--quiet", "--detach", version};
            rc = build_run(b, "git checkout", co, 7, git_env, b->work, st);
            if (rc == PV_OK && submodule) {
                const char *sm[] = {"git",     "-C",     path,     "submodule",
                                    "--quiet", "update", "--init", "--recursive"};
                rc = build_run(b, "git submodule update", sm, 8, git_env, b->work, st);
            }
        }
        if (rc == PV_OK) {
            char script[3 * PATH_MAX];
            snprintf(script, sizeof script, "cp -a -- \"$0\"/. \"$1\"/ && rm -rf -- \"$1\"/.git");
            const char *argv[] = {"/bin/sh", "-c", script, path, dir};
            rc = build_run(b, "copying the source", argv, 5, NULL, b->work, st);
        }
    }
    /* what the agent put there (base image, source) becomes the build's, for its commands */
    if (rc == PV_OK) rc = give_to_builder(b, root, st);
    char **env = rc == PV_OK ? build_env(build) : NULL;
    size_t i;
    json_t *cmd;
    json_array_foreach(json_object_get(build, "commands"), i, cmd) {
        if (rc != PV_OK) break;
        char what[128];
        snprintf(what, sizeof what, "stage %s command %zu", stage, i + 1);
        rc = build_shell(b, what, json_string_value(cmd) ? json_string_value(cmd) : "true", dir,
                         (const char *const *)env, st);
    }
    env_free(env);
    const char *from;
    json_t *to;
    json_object_foreach(json_object_get(build, "artifacts"), from, to) {
        if (rc != PV_OK || !next_root) break;
        char src[PATH_MAX], dst[PATH_MAX];
        inside(src, sizeof src, root, from);
        inside(dst, sizeof dst, next_root, json_string_value(to));
        const char *argv[] = {"/bin/sh", "-c",
                              "mkdir -p -- \"$(dirname -- \"$1\")\" && cp -a -- \"$0\" \"$1\"", src,
                              dst};
        char what[PATH_MAX + 32];
        snprintf(what, sizeof what, "stage %s artifact %s", stage, from);
        /* as the build's user: a link its commands left in the way leads nowhere it may not
         * write */
        rc = build_run_as_builder(b, what, argv, 5, NULL, root, st);
    }
    return rc;
}

/* The image of an SCM build: a tar of the last stage's root (*tar malloc'd). */
static int build_scm(wk_op *op, wk_agent *a, json_t *builds, char **tar, size_t *len,
                     pv_status *st) {
    build_ctx b = {.op = op, .agent = a, .engine = wk_agent_engine(a)};
    if (!b.engine)
        return pv_status_set(st, PV_FAILED_PRECONDITION, "node %s has no engine", wk_agent_node(a));
    json_t *stages = json_object_get(builds, "stages");
    size_t n = json_array_size(stages);
    if (n == 0) return pv_status_set(st, PV_INVALID_ARGUMENT, "builds.stages: empty");
    snprintf(b.work, sizeof b.work, "%s/build/%s", wk_agent_data_dir(a), wk_op_record(op)->id);
    char clean[PATH_MAX + 16];
    snprintf(clean, sizeof clean, "%s", b.work);
    const char *rm[] = {"rm", "-rf", "--", clean};
    const char *mk[] = {"mkdir", "-p", b.work};
    int rc = build_run(&b, "cleaning the build directory", rm, 4, NULL, "/", st);
    if (rc == PV_OK) rc = build_run(&b, "mkdir", mk, 3, NULL, "/", st);
    char(*roots)[PATH_MAX] = calloc(n, sizeof *roots);
    if (!roots) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (snprintf(roots[i], PATH_MAX, "%s/%s.root", b.work,
                     json_string_value(json_array_get(stages, i))) >= PATH_MAX) {
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "builds.stages[%zu]: name too long", i);
            break;
        }
        const char *argv[] = {"mkdir", "-p", roots[i]};
        rc = build_run(&b, "mkdir", argv, 3, NULL, "/", st);
    }
    const pv_config *cfg = wk_op_config(op);
    if (rc == PV_OK && cfg && geteuid() == 0 && cfg->worker.default_user &&
        strcmp(cfg->worker.default_user, "dynamic") == 0) {
        uid_t min = 0, max = 0;
        snprintf(b.uid_dir, sizeof b.uid_dir, "%s", cfg->worker.uid_dir);
        rc = wk_uids_parse_range(cfg->worker.dynamic_uids, &min, &max, st);
        if (rc == PV_OK)
            rc = wk_uids_claim(b.uid_dir, min, max, wk_op_record(op)->id, b.work, &b.uid, st);
        b.confined = rc == PV_OK;
        if (rc == PV_OK) rc = give_to_builder(&b, b.work, st);
    }
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        const char *stage = json_string_value(json_array_get(stages, i));
        json_t *build = json_object_get(json_object_get(builds, "builds"), stage);
        rc = build_stage(&b, stage, build, roots[i], i + 1 < n ? roots[i + 1] : NULL, st);
        if (rc != PV_OK && rc != PV_ABORTED) pv_status_prefix(st, "stage %s", stage);
    }
    if (rc == PV_OK) rc = wk_files_tar_root(roots[n - 1], tar, len, st);
    free(roots);
    pv_status cst;
    if (build_run(&b, "cleaning the build directory", rm, 4, NULL, "/", &cst) != PV_OK)
        pv_warn("build %s: %s", wk_op_record(op)->id, cst.msg);
    if (b.confined) wk_uids_release(b.uid_dir, b.uid, b.work);
    return rc;
}

/* A RAW build's archive must be an image the engine would unpack: checked in
 * <data_dir>/build/<op> before anything is stored, so a refused archive leaves no image behind.
 * wk_untar_check reads every archive libarchive reads, compressed or not. A file that is no
 * archive at all is refused on the process engine; a virt node takes VM images only
 * (wk_vm_image.h: an archive with vm.json and/or a disk, or a bare qcow2 disk). */
static int check_raw(wk_op *op, wk_agent *a, const unsigned char *tar, size_t len, pv_status *st) {
    build_ctx b = {.op = op, .agent = a, .engine = wk_agent_engine(a)};
    char archive[PATH_MAX + 16], msg[PV_STATUS_MSG_MAX];
    snprintf(b.work, sizeof b.work, "%s/build/%s", wk_agent_data_dir(a), wk_op_record(op)->id);
    snprintf(archive, sizeof archive, "%s/raw.tar", b.work);
    if (!write_file(archive, tar, len, msg, sizeof msg))
        return pv_status_set(st, PV_INTERNAL, "%s", msg);
    bool virt = b.engine && strcmp(wk_engine_type(b.engine), "virt") == 0;
    int rc = virt ? wk_vm_image_check(archive, st) : wk_untar_check(archive, b.work, st);
    if (rc == PV_OK && virt) rc = wk_untar_check(archive, b.work, st);
    if (rc == PV_UNIMPLEMENTED && virt) rc = PV_OK; /* a bare qcow2 disk */
    if (rc == PV_UNIMPLEMENTED) {
        bool unpacks = b.engine && strcmp(wk_engine_type(b.engine), "process") == 0;
        rc = unpacks ? (st->code = PV_FAILED_PRECONDITION) : PV_OK;
    }
    if (rc != PV_OK && rc != PV_ABORTED) pv_status_prefix(st, "tar");
    char clean[PATH_MAX + 16];
    snprintf(clean, sizeof clean, "%s", b.work);
    const char *rm[] = {"rm", "-rf", "--", clean};
    pv_status cst;
    int code = -1;
    char *out = NULL;
    size_t out_len = 0;
    if (!b.engine ||
        wk_engine_run(b.engine, rm, 4, NULL, "/", BUILD_STEP_TIMEOUT_MS, &code, &out, &out_len,
                      &cst) != PV_OK ||
        code != 0) {
        /* without an engine to run rm: what wk_untar_check left (its scratch is gone) */
        unlink(archive);
        rmdir(b.work);
    }
    free(out);
    return rc;
}

static int engine_log(void *ctx, int stream, const char *line, size_t len, pv_status *st) {
    (void)stream;
    build_ctx *b = ctx;
    return line && build_log(b, line, len, st) != PV_OK;
}

/* RAW's tar: the gateway's upload (params "upload", pv_upload.h), or base64 in "tar" (as
 * gateways before uploads send it). *has: the params hold one. */
static int raw_tar(wk_op *op, json_t *params, unsigned char **tar, size_t *len, bool *has,
                   pv_status *st) {
    const char *upload = json_string_value(json_object_get(params, "upload"));
    const char *b64 = json_string_value(json_object_get(params, "tar"));
    *has = upload || b64;
    if (upload) return pv_upload_get(wk_op_redis(op), wk_op_keys(op), upload, tar, len, st);
    return b64 ? pv_b64_decode("tar", b64, tar, len, st) : PV_OK;
}

/* RAW (the tar is a build context with a Dockerfile) or EXIST (the workload committed) on an
 * engine that builds itself: every ref tagged, those naming a registry pushed there. */
static int engine_build(wk_op *op, wk_agent *a, json_t *params, pv_status *st) {
    const char *exist = json_string_value(json_object_get(params, "exist_id"));
    json_t *refs = json_object_get(params, "refs");
    if (json_object_get(params, "builds"))
        return pv_status_set(st, PV_UNIMPLEMENTED,
                             "build_method SCM: node %s runs the docker engine, which builds "
                             "from a tar (RAW) or a workload (EXIST)",
                             wk_agent_node(a));
    unsigned char *tar = NULL;
    size_t len = 0;
    bool raw = false;
    int rc = raw_tar(op, params, &tar, &len, &raw, st);
    if (rc == PV_OK && !raw && !exist)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "params: tar or exist_id is required");
    const char **v = calloc(json_array_size(refs) + 1, sizeof *v);
    if (rc == PV_OK && !v) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < json_array_size(refs); i++)
        v[i] = json_string_value(json_array_get(refs, i)) ?: "";
    build_ctx b = {.op = op, .agent = a, .engine = wk_agent_engine(a)};
    char *id = NULL;
    if (rc == PV_OK)
        rc = wk_engine_image_build(b.engine, tar, len, raw ? NULL : exist, v, json_array_size(refs),
                                   engine_log, &b, &id, st);
    for (size_t i = 0; rc == PV_OK && i < json_array_size(refs); i++) {
        char stream[PV_STATUS_MSG_MAX];
        snprintf(stream, sizeof stream, "built %s on %s", v[i], wk_agent_node(a));
        const char *fields[] = {"type", "ref", "id", "stream"};
        const char *values[] = {"built", v[i], id, stream};
        rc = wk_op_output(op, 4, fields, values, st);
    }
    free(id);
    free(v);
    free(tar);
    return rc;
}

int wk_node_image_build(wk_op *op, pv_status *st) {
    wk_agent *a = agent_of(op, st);
    if (!a) return st->code;
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    if (engine_images(a)) {
        int rc = engine_build(op, a, params, st);
        json_decref(params);
        return rc;
    }
    const char *exist = json_string_value(json_object_get(params, "exist_id"));
    unsigned char *tar = NULL;
    size_t len = 0;
    bool raw = false;
    int rc = raw_tar(op, params, &tar, &len, &raw, st);
    json_t *builds = json_object_get(params, "builds");
    if (rc != PV_OK) {
        /* the upload is gone: said in st */
    } else if (raw) {
        rc = check_raw(op, a, tar, len, st);
    } else if (builds) {
        rc = build_scm(op, a, builds, (char **)&tar, &len, st);
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
