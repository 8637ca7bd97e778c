/*
 * pv_validate: checks on what callers send, shared by every service.
 *
 * Each check returns PV_OK or PV_INVALID_ARGUMENT with a message naming the field and the value
 * ("name: \"a/b\" must not contain '/'"), so handlers can return the status as it is.
 */
#ifndef PV_VALIDATE_H
#define PV_VALIDATE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

#include "pv_status.h"

#define PV_NAME_MAX 63

/* A plain name: 1..PV_NAME_MAX bytes of [A-Za-z0-9._-], not starting with '-' or '.', no "..",
 * no '/'. Empty is "field is required". */
int pv_validate_name(const char *field, const char *value, pv_status *st);

/* value is not NULL and not empty. */
int pv_validate_required(const char *field, const char *value, pv_status *st);

/* Walks m recursively (sub-messages, repeated fields, map entries) and checks that every enum
 * field holds a value its enum declares. The message names the path ("strategy.type: unknown
 * value 7 for pivirt.cluster.v1.UpgradeType"). */
int pv_validate_enums(const ProtobufCMessage *m, pv_status *st);

#endif
