/*
 * pv_pbmap: the map<string, string> fields of protobuf-c's generated messages. protobuf-c
 * generates one entry type per map field (Pb__DeployOptions__LabelsEntry, ...), all laid out as
 * base, key, value: pv_pbmap_entry reads any of them, so one function serves every such map.
 *
 * Ownership: pv_pbmap_add copies the message's keys and values into obj; pv_pbmap_entries makes
 * entries that point into obj (which must outlive them) and are freed with pv_pbmap_entries_free.
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

/* A new object (the caller's to json_decref; NULL when out of memory) of the n entries, as
 * pv_pbmap_add sets them. */
json_t *pv_pbmap_object(void *const *entries, size_t n);

/* The other way: entries of descriptor d (a map<string, string> field's entry message) for the
 * members of obj (NULL: none) whose values are strings, others passed over, in obj's order.
 * *out is an array of *n pointers to them, NULL when there are none. 0, or -1 when out of
 * memory (*out NULL, *n 0). */
int pv_pbmap_entries(json_t *obj, const ProtobufCMessageDescriptor *d, void ***out, size_t *n);
void pv_pbmap_entries_free(void **entries);

#endif
