/*
 * pv_image: what an image reference is, for every part that reads one (CreateWorkload's checks
 * in the gateway, the node agents' image stores).
 *
 * "hub.example.com:5000/ns/app:v1": the tag is what follows the last ':' after the last '/'
 * ("latest" when there is none), so a registry port stays part of the name. Name components are
 * 1-128 of [A-Za-z0-9._-] (the first of several may also be host:port, the port digits), never
 * "." or ".."; a tag is Docker's [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}. Digests ("@sha256:...") are
 * refused. So a reference names a file under an image store and nothing outside it.
 */
#ifndef PV_IMAGE_H
#define PV_IMAGE_H

#include "pv_status.h"

#define PV_IMAGE_PART_MAX 128

/* Splits ref into its name and tag (both allocated, caller frees) after validating it;
 * INVALID_ARGUMENT naming the reference otherwise. */
int pv_image_parse(const char *ref, char **name, char **tag, pv_status *st);

#endif
