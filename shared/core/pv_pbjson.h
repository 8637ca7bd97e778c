/*
 * pv_pbjson: protobuf messages to JSON and back, driven by protobuf-c's descriptors, so one
 * converter serves every message of every API (pvcli's -o json and its request bodies, tests,
 * anything that needs JSON).
 *
 * The mapping is protobuf's JSON mapping with the .proto's own field names: enums by name,
 * 64-bit integers as strings, bytes as base64, google.protobuf.Timestamp as RFC 3339 text in
 * UTC, maps as objects, repeated fields as arrays. To JSON, scalar fields are always written
 * (scripts find every field, zero or not); unset messages are left out. From JSON, a field is
 * found by its .proto name or its lowerCamelCase JSON name, enums by name (or number), 64-bit
 * integers from strings or numbers; an unknown field or a value of the wrong kind is
 * INVALID_ARGUMENT naming the field's path ("strategy.max_surge").
 *
 * Ownership: pv_pbjson_to_json returns a new reference (json_decref); pv_pbjson_from_json
 * returns a message allocated with the system allocator, freed with
 * protobuf_c_message_free_unpacked(msg, NULL).
 */
#ifndef PV_PBJSON_H
#define PV_PBJSON_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "pv_status.h"

json_t *pv_pbjson_to_json(const ProtobufCMessage *m);

int pv_pbjson_from_json(const ProtobufCMessageDescriptor *d, json_t *j, ProtobufCMessage **out,
                        pv_status *st);

#endif
