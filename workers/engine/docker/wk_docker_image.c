/*
 * wk_docker_image: the daemon's images (see wk_engine.h "images the engine holds itself"):
 * list (GET /images/json), pull (POST /images/create), remove (DELETE /images/{ref}), build
 * (POST /build with the context tar, the classic builder: BuildKit's RUN needs a bridge) or
 * commit (POST /commit) of a workload, then tag and push (POST /images/{name}/push).
 *
 * Pull, build and push answer HTTP 200 and stream NDJSON progress; a failure is a line
 * {"errorDetail": ..., "error": "..."} (often the last), unless it fails up front with an error
 * status: both are checked. A registry named in registry.auths gets its credentials (pull and
 * push: X-Registry-Auth of the reference's registry; build: X-Registry-Config of them all, for
 * its FROM pulls), as base64url JSON with padding (the daemon reads a header that does not
 * decode as anonymous, silently); others are reached anonymously (X-Registry-Auth "{}").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pv_b64.h"
#include "pv_log.h"
#include "wk_engine_docker.h"

#define PULL_TIMEOUT_MS 600000
#define BUILD_TIMEOUT_MS 1800000
#define ANONYMOUS "X-Registry-Auth: e30="
/* Docker Hub's references name no host; its credentials are under this one. */
#define HUB_HOST "docker.io"

/* A reference split into repository and tag ("latest" when it has none). */
static void split_ref(const char *ref, char *repo, size_t rcap, char *tag, size_t tcap) {
    const char *colon = strrchr(ref, ':'), *slash = strrchr(ref, '/');
    bool tagged = colon && (!slash || colon > slash);
    snprintf(repo, rcap, "%.*s", (int)(tagged ? colon - ref : (long)strlen(ref)), ref);
    snprintf(tag, tcap, "%s", tagged ? colon + 1 : "latest");
}

/* Whether ref's first component is a registry's host (it has a '.' or a ':', or is localhost),
 * as Docker reads references. */
static bool names_registry(const char *ref) {
    const char *slash = strchr(ref, '/');
    if (!slash) return false;
    size_t n = (size_t)(slash - ref);
    return memchr(ref, '.', n) || memchr(ref, ':', n) || (n == 9 && !strncmp(ref, "localhost", 9));
}

/* ---- credentials ---- */

json_t *wk_docker_auths(const char *const *entries, size_t n) {
    json_t *out = json_object();
    for (size_t i = 0; out && i < n; i++) {
        const char *e = entries[i], *eq = strchr(e, '='), *colon = eq ? strchr(eq + 1, ':') : NULL;
        if (!eq || eq == e || !colon || colon == eq + 1) {
            pv_warn("registry.auths[%zu]: not HOST=USERNAME:PASSWORD; skipped", i);
            continue;
        }
        char host[512], user[512];
        snprintf(host, sizeof host, "%.*s", (int)(eq - e), e);
        snprintf(user, sizeof user, "%.*s", (int)(colon - eq - 1), eq + 1);
        json_object_set_new(out, host,
                            json_pack("{s:s, s:s, s:s}", "username", user, "password", colon + 1,
                                      "serveraddress", host));
    }
    return out;
}

/* "NAME: " + j as base64url with padding (a new string), NULL when out of memory. */
static char *b64url_header(const char *name, const json_t *j) {
    char *text = json_dumps(j, JSON_COMPACT), *b64 = NULL, *line = NULL;
    pv_status st;
    if (text && pv_b64_encode(text, strlen(text), &b64, &st) == PV_OK) {
        for (char *c = b64; *c; c++)
            *c = *c == '+' ? '-' : *c == '/' ? '_' : *c;
        if (asprintf(&line, "%s: %s", name, b64) < 0) line = NULL;
    }
    free(text);
    free(b64);
    return line;
}

/* The X-Registry-Auth line for a pull or push of ref (a new string; NULL: anonymous). */
static char *auth_header(const wk_docker *d, const char *ref) {
    char host[512] = HUB_HOST;
    if (names_registry(ref)) snprintf(host, sizeof host, "%.*s", (int)strcspn(ref, "/"), ref);
    const json_t *a = json_object_get(d->auths, host);
    return a ? b64url_header("X-Registry-Auth", a) : NULL;
}

/* ---- NDJSON progress ---- */

typedef struct progress {
    wk_docker_ndjson lines;
    char error[PV_STATUS_MSG_MAX]; /* the first error line's words */
    char id[160];                  /* a build's aux.ID */
    wk_engine_line_fn log;
    void *ctx;
} progress;

static int progress_object(void *ctx, json_t *j, pv_status *st) {
    progress *p = ctx;
    const char *err = json_string_value(json_object_get(j, "error"));
    if (err && !p->error[0]) snprintf(p->error, sizeof p->error, "%s", err);
    const char *aux = json_string_value(json_object_get(json_object_get(j, "aux"), "ID"));
    if (aux) snprintf(p->id, sizeof p->id, "%s", aux);
    const char *text = json_string_value(json_object_get(j, "stream"));
    if (!text) text = json_string_value(json_object_get(j, "status"));
    if (!p->log || !text) return PV_OK;
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        n--;
    if (n == 0) return PV_OK;
    return p->log(p->ctx, 1, text, n, st) == 0 ? PV_OK : (st->code ? st->code : PV_CANCELLED);
}

static int progress_data(void *ctx, const char *data, size_t len, pv_status *st) {
    progress *p = ctx;
    return wk_docker_ndjson_feed(&p->lines, data, len, st) == PV_OK ? 0 : 1;
}

/* A streaming call with progress: PV_OK only when the status is 2xx and no line failed. */
static int progress_call(wk_docker *d, wk_docker_req *req, progress *p, const char *what,
                         pv_status *st) {
    req->on_data = progress_data;
    req->ctx = p;
    p->lines = (wk_docker_ndjson){.fn = progress_object, .ctx = p};
    wk_docker_resp r;
    int rc = wk_docker_call(d->api, req, &r, st);
    if (rc == PV_OK) rc = wk_docker_check(&r, what, st);
    wk_docker_resp_clear(&r);
    pv_status est;
    int erc = wk_docker_ndjson_end(&p->lines, &est); /* a last line without its newline */
    if (rc == PV_OK && erc != PV_OK) rc = pv_status_set(st, erc, "%s", est.msg);
    if (rc == PV_OK && p->error[0])
        rc = pv_status_set(st,
                           strstr(p->error, "not found") || strstr(p->error, "unknown")
                               ? PV_NOT_FOUND
                               : PV_FAILED_PRECONDITION,
                           "%s: %s", what, p->error);
    return rc;
}

/* ---- list, pull, remove ---- */

int wk_docker_image_list(void *impl, wk_engine_image **out, size_t *n, pv_status *st) {
    wk_docker *d = impl;
    *out = NULL;
    *n = 0;
    json_t *list = NULL;
    if (wk_docker_json(d->api, "GET", "/images/json", NULL, &list, "list images", st) != PV_OK)
        return st->code;
    size_t cap = 0, i, j;
    json_t *img, *tag;
    json_array_foreach(list, i, img) cap += json_array_size(json_object_get(img, "RepoTags"));
    wk_engine_image *v = calloc(cap + 1, sizeof *v);
    if (!v) {
        json_decref(list);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    json_array_foreach(list, i, img) {
        json_array_foreach(json_object_get(img, "RepoTags"), j, tag) {
            const char *ref = json_string_value(tag);
            if (!ref || strcmp(ref, "<none>:<none>") == 0) continue;
            v[*n].ref = strdup(ref);
            v[*n].id = strdup(json_string_value(json_object_get(img, "Id")) ?: "");
            (*n)++;
        }
    }
    json_decref(list);
    *out = v;
    return PV_OK;
}

/* before, ref's repository, between, its tag (both escaped). */
static void repo_tag_path(char *path, size_t cap, const char *before, const char *between,
                          const char *ref) {
    char repo[1024], tag[256];
    split_ref(ref, repo, sizeof repo, tag, sizeof tag);
    char *er = wk_docker_escape(repo), *et = wk_docker_escape(tag);
    snprintf(path, cap, "%s%s%s%s", before, er ? er : "", between, et ? et : "");
    free(er);
    free(et);
}

/* A pull or a push of ref: POST path with the registry's credentials (anonymous when it has
 * none), its progress checked. */
static int registry_call(wk_docker *d, const char *before, const char *between, const char *verb,
                         const char *ref, progress *p, pv_status *st) {
    char path[1600], what[1100];
    repo_tag_path(path, sizeof path, before, between, ref);
    snprintf(what, sizeof what, "%s %s", verb, ref);
    char *auth = auth_header(d, ref);
    const char *headers[] = {auth ? auth : ANONYMOUS, NULL};
    wk_docker_req req = {
        .method = "POST", .path = path, .headers = headers, .timeout_ms = PULL_TIMEOUT_MS};
    int rc = progress_call(d, &req, p, what, st);
    free(auth);
    return rc;
}

int wk_docker_pull(void *impl, const char *image, pv_status *st) {
    progress p = {0};
    return registry_call(impl, "/images/create?fromImage=", "&tag=", "pull", image, &p, st);
}

int wk_docker_image_remove(void *impl, const char *ref, bool prune, pv_status *st) {
    wk_docker *d = impl;
    char *esc = wk_docker_escape(ref), path[1200], what[1100];
    snprintf(path, sizeof path, "/images/%s?noprune=%d", esc ? esc : "", prune ? 0 : 1);
    free(esc);
    snprintf(what, sizeof what, "remove image %s", ref);
    return wk_docker_json(d->api, "DELETE", path, NULL, NULL, what, st);
}

/* ---- build ---- */

static int tag_image(wk_docker *d, const char *id, const char *ref, pv_status *st) {
    char before[300], path[1800], what[1100];
    char *ei = wk_docker_escape(id);
    snprintf(before, sizeof before, "/images/%s/tag?repo=", ei ? ei : "");
    free(ei);
    repo_tag_path(path, sizeof path, before, "&tag=", ref);
    snprintf(what, sizeof what, "tag %s", ref);
    return wk_docker_json(d->api, "POST", path, NULL, NULL, what, st);
}

/* POST /build of the context, tagged refs[0]: the new image's id into p->id. */
static int build_context(wk_docker *d, const void *tar, size_t len, const char *ref, progress *p,
                         pv_status *st) {
    char *et = wk_docker_escape(ref), path[1200];
    snprintf(path, sizeof path, "/build?t=%s&rm=1&forcerm=1", et ? et : "");
    free(et);
    /* every registry's credentials, for the FROM lines' pulls: {host: {username, password}} */
    char *config = json_object_size(d->auths) ? b64url_header("X-Registry-Config", d->auths) : NULL;
    const char *headers[] = {config, NULL};
    wk_docker_req req = {.method = "POST",
                         .path = path,
                         .body = tar,
                         .body_len = len,
                         .content_type = "application/x-tar",
                         .headers = config ? headers : NULL,
                         .timeout_ms = BUILD_TIMEOUT_MS};
    int rc = progress_call(d, &req, p, "build", st);
    free(config);
    if (rc != PV_OK) return st->code;
    if (!p->id[0]) return pv_status_set(st, PV_INTERNAL, "build: the daemon named no image");
    return PV_OK;
}

/* POST /commit of the workload's container as refs[0]. */
static int commit(wk_docker *d, const char *exist_id, const char *ref, progress *p, pv_status *st) {
    char cid[72], before[200], path[1600];
    if (wk_docker_resolve(d, exist_id, cid, st) != PV_OK) return st->code;
    snprintf(before, sizeof before, "/commit?container=%s&repo=", cid);
    repo_tag_path(path, sizeof path, before, "&tag=", ref);
    json_t *out = NULL;
    if (wk_docker_json(d->api, "POST", path, NULL, &out, "commit", st) != PV_OK) return st->code;
    snprintf(p->id, sizeof p->id, "%s", json_string_value(json_object_get(out, "Id")) ?: "");
    json_decref(out);
    return PV_OK;
}

int wk_docker_image_build(void *impl, const void *tar, size_t len, const char *exist_id,
                          const char *const *refs, size_t nrefs, wk_engine_line_fn log, void *ctx,
                          char **id, pv_status *st) {
    wk_docker *d = impl;
    *id = NULL;
    if (nrefs == 0) return pv_status_set(st, PV_INVALID_ARGUMENT, "refs: no tag to build");
    progress p = {.log = log, .ctx = ctx};
    int rc = exist_id && *exist_id ? commit(d, exist_id, refs[0], &p, st)
                                   : build_context(d, tar, len, refs[0], &p, st);
    for (size_t i = 1; rc == PV_OK && i < nrefs; i++)
        rc = tag_image(d, p.id, refs[i], st);
    for (size_t i = 0; rc == PV_OK && i < nrefs; i++) {
        if (!names_registry(refs[i])) continue;
        progress pp = {.log = log, .ctx = ctx};
        rc = registry_call(d, "/images/", "/push?tag=", "push", refs[i], &pp, st);
    }
    if (rc == PV_OK && !(*id = strdup(p.id))) rc = pv_status_set(st, PV_INTERNAL, "oom");
    return rc;
}
