/*
 * pv_pbmap: the map<string, string> fields of protobuf-c's generated messages. protobuf-c
 * generates one entry type per map field (Pb__DeployOptions__LabelsEntry, ...), all laid out as
 * base, key, value: pv_pbmap_entry reads any of them, so one function serves every such map.
 *
 * Ownership: the entries are the message's; pv_pbmap_add copies keys and values into obj.
 */
#ifndef PV_PBMAP_H
#define PV_PBMAP_H

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct pv_pbmap_entry {
    ProtobufCMessage base;
    char *key;
    char *value;
} pv_pbmap_entry;

/* Sets each of the n entries' key to its value (a JSON string) in obj, later entries winning;
 * an unset key or value reads as "", as protobuf reads an unset string. 0, or -1 when a set
 * failed (a key or value not UTF-8, out of memory): the other entries are set all the same. */
int pv_pbmap_add(json_t *obj, void *const *entries, size_t n);

#endif
