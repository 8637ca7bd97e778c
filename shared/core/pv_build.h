/*
 * pv_build: BuildImage's SCM request checked and turned into what the build node runs (the
 * "builds" parameter of image.build_on_node, read by workers/agent/wk_node_image.c). Checked here,
 * before any node is asked: stage names (1-64 of [A-Za-z0-9._-], each once, each with a build),
 * a repo on the first stage, no option-looking repo or version, and paths (dir, artifacts) that
 * stay inside the stage's root (no ".." component).
 */
#ifndef PV_BUILD_H
#define PV_BUILD_H

#include <jansson.h>

#include "pb/core.pb-c.h"
#include "pv_status.h"

/* *out (the caller's reference): {"stages": [...], "builds": {stage: {"base", "repo",
 * "version", "dir", "submodule", "commands", "envs", "args", "artifacts"}}}. INVALID_ARGUMENT
 * naming the field otherwise. */
int pv_build_scm_params(const Pb__Builds *builds, json_t **out, pv_status *st);

#endif
