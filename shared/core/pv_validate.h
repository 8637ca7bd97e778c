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
#include <stdint.h>

#include "pv_status.h"

#define PV_NAME_MAX 63

/* A plain name: 1..PV_NAME_MAX bytes of [A-Za-z0-9._-], not starting with '-' or '.', no "..",
 * no '/'. Empty is "field is required". */
int pv_validate_name(const char *field, const char *value, pv_status *st);

/* value is not NULL and not empty. */
int pv_validate_required(const char *field, const char *value, pv_status *st);

/* Walks m recursively (sub-messages, repeated fields, map entries) and checks that every enum
 * field holds a value its enum declares and every string is valid UTF-8 (proto3 requires it;
 * protobuf-c does not check, and JSON records cannot hold anything else). The message names the
 * path ("strategy.type: unknown value 7 for pivirt.cluster.v1.UpgradeType", "labels.value: is
 * not valid UTF-8 (at byte 2)"). */
int pv_validate_message(const ProtobufCMessage *m, pv_status *st);

/* Walks the encoded message buf[0..len) of type d (sub-messages and map entries included) and
 * refuses a string field that holds a NUL byte, which protobuf-c's decoding would cut there
 * without a word: "name: holds a NUL byte (at byte 7) ...", repeated items named "[index]".
 * bytes fields keep their NULs. Call it on bytes protobuf-c decoded without error (it refuses
 * malformed wire data too, as INVALID_ARGUMENT). */
int pv_validate_wire(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                     pv_status *st);

/* Whether the NUL-terminated s is valid UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF); *valid (may be NULL) gets the length of its longest valid prefix. */
int pv_validate_utf8_prefix(const char *s, size_t *valid);

#endif
