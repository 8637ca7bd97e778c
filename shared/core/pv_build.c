/*
 * pv_build: the SCM build request's checks and its JSON form (see pv_build.h).
 */
#include "pv_build.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "pv_pbmap.h"

static bool stage_name_ok(const char *s) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64) return false;
    for (const char *c = s; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '.' || *c == '_' || *c == '-'))
            return false;
    return strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* No ".." component: the path stays inside the stage's root. */
static bool path_ok(const char *p) {
    if (!p) return true;
    for (const char *c = p; (c = strstr(c, "..")); c += 2) {
        bool starts = c == p || c[-1] == '/';
        bool ends = c[2] == '\0' || c[2] == '/';
        if (starts && ends) return false;
    }
    return true;
}

static const Pb__Build *build_of(const Pb__Builds *b, const char *stage) {
    for (size_t i = 0; i < b->n_builds; i++)
        if (b->builds[i]->key && strcmp(b->builds[i]->key, stage) == 0) return b->builds[i]->value;
    return NULL;
}

static int check_build(const char *stage, const Pb__Build *b, bool first, pv_status *st) {
    if (first && (!b->repo || !*b->repo))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "builds.builds[%s].repo: the first stage of an SCM build needs a "
                             "repository",
                             stage);
    if (b->repo && b->repo[0] == '-')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "builds.builds[%s].repo: \"%s\" looks like "
                             "an option",
                             stage, b->repo);
    if (b->version && b->version[0] == '-')
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "builds.builds[%s].version: \"%s\" looks like an option", stage,
                             b->version);
    if (!path_ok(b->dir))
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "builds.builds[%s].dir: \"%s\" leaves the stage's root", stage,
                             b->dir);
    for (size_t i = 0; i < b->n_artifacts; i++) {
        const char *from = b->artifacts[i]->key, *to = b->artifacts[i]->value;
        if (!from || !*from || !to || !*to || !path_ok(from) || !path_ok(to))
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "builds.builds[%s].artifacts: \"%s\" -> \"%s\" must name paths "
                                 "inside the stages' roots",
                                 stage, from ? from : "", to ? to : "");
    }
    return PV_OK;
}

int pv_build_scm_params(const Pb__Builds *builds, json_t **out, pv_status *st) {
    *out = NULL;
    if (!builds || builds->n_stages == 0)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "builds.stages: an SCM build needs at least one stage");
    json_t *stages = json_array(), *all = json_object();
    int rc = stages && all ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < builds->n_stages; i++) {
        const char *stage = builds->stages[i];
        const Pb__Build *b = stage_name_ok(stage) ? build_of(builds, stage) : NULL;
        if (!stage_name_ok(stage))
            rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                               "builds.stages[%zu]: \"%s\" is not a stage name (1-64 of "
                               "A-Z a-z 0-9 . _ -)",
                               i, stage ? stage : "");
        else if (json_object_get(all, stage))
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "builds.stages[%zu]: \"%s\" twice", i,
                               stage);
        else if (!b)
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "builds.builds: no build for stage \"%s\"",
                               stage);
        else
            rc = check_build(stage, b, i == 0, st);
        if (rc != PV_OK) break;
        json_t *cmds = json_array();
        for (size_t j = 0; cmds && j < b->n_commands; j++)
            json_array_append_new(cmds, json_string(b->commands[j] ? b->commands[j] : ""));
        json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:o, s:o}", "base",
                              b->base_image ? b->base_image : "", "repo", b->repo ? b->repo : "",
                              "version", b->version ? b->version : "", "dir", b->dir ? b->dir : "",
                              "submodule", b->submodule, "commands", cmds ? cmds : json_array(),
                              "envs", pv_pbmap_object((void *const *)b->envs, b->n_envs), "args",
                              pv_pbmap_object((void *const *)b->args, b->n_args), "artifacts",
                              pv_pbmap_object((void *const *)b->artifacts, b->n_artifacts));
        if (!j || json_object_set_new(all, stage, j) != 0 ||
            json_array_append_new(stages, json_string(stage)) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (rc != PV_OK) {
        json_decref(stages);
        json_decref(all);
        return rc;
    }
    *out = json_pack("{s:o, s:o}", "stages", stages, "builds", all);
    return *out ? PV_OK : pv_status_set(st, PV_INTERNAL, "out of memory");
}
