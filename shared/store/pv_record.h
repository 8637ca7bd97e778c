/*
 * pv_record: the one codec of pivirt's stored records, driven by a table of fields per record
 * kind (operations, pods, nodes, workloads, storage pools/volumes/snapshots, upgrades).
 *
 * A kind is a pv_record_schema: the struct's size and a table of its fields (name, type,
 * offset, default, required). The same table decodes a Redis hash (a flat field/value array,
 * as HGETALL or a function gives it) or a JSON document into the struct, encodes the struct
 * back (HSET's field/value arguments, or a JSON object), and frees what the struct owns.
 *
 * Stored text is checked, never guessed: a number that does not parse or does not fit its
 * type, a boolean other than 0/1 (true/false in JSON), an enum name the table does not know, a
 * fixed-size text longer than its buffer, a value of the wrong JSON type, or a required field
 * that is absent is PV_DATA_LOSS (the stored record is damaged: retrying cannot help, and it
 * is not the caller's fault), with a message naming the record's key, the field and the value:
 *   <what> record <key>: field <name>: bad value "<value>" (want <type>)
 *   <what> record <key>: field <name>: absent
 * Fields the table does not name are skipped (journal fields of an operation, fields a newer
 * build wrote), and a JSON document keeps them in `extra` when the schema has a place for it, so
 * a read-modify-write never drops what this build does not know.
 *
 * Ownership: the struct owns its PV_FIELD_STR strings (malloc'd) and PV_FIELD_JSON values (one
 * reference each); pv_record_free releases them and zeroes the struct (safe on a zeroed one).
 * Decoding starts by zeroing the struct and frees everything again when it fails.
 */
#ifndef PV_RECORD_H
#define PV_RECORD_H

#include <hiredis/hiredis.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "pv_status.h"
#include "pv_strv.h"

typedef enum pv_field_type {
    PV_FIELD_STR,    /* char *: malloc'd text, never NULL after a decode ("" or dflt) */
    PV_FIELD_CHARS,  /* char[cap] inside the struct: text shorter than cap */
    PV_FIELD_INT,    /* int */
    PV_FIELD_LONG,   /* long */
    PV_FIELD_I64,    /* int64_t */
    PV_FIELD_BOOL,   /* bool: "0"/"1" in a hash, false/true in JSON */
    PV_FIELD_ENUM,   /* int: the index of its name in names (a hash or JSON holds the name) */
    PV_FIELD_DOUBLE, /* double (JSON: any number) */
    PV_FIELD_JSON,   /* json_t *: any JSON value (a hash holds its text); NULL when absent */
} pv_field_type;

typedef struct pv_field {
    const char *name;
    pv_field_type type;
    size_t off;
    const char *dflt; /* the stored text taken when the field is absent (NULL: 0, "", NULL) */
    bool required;    /* absent is damage */
    size_t cap;       /* PV_FIELD_CHARS: the buffer's size */
    const char *const *names; /* PV_FIELD_ENUM: NULL-terminated, names[i] is value i */
    bool optional; /* absent is left unset (0, false, NULL: no default), and an unset value
                      (a NULL string or JSON value, false, 0) is left out when encoding: for
                      fields a record holds only sometimes, so that it is written back as
                      it was */
} pv_field;

typedef struct pv_record_schema {
    const char *what; /* "operation", "pod", ...: the start of every message */
    const pv_field *fields;
    size_t nfields;
    size_t size;      /* sizeof the struct */
    size_t extra_off; /* where a json_t * of unknown JSON fields lives; 0: none kept */
} pv_record_schema;

#define PV_RECORD_NFIELDS(a) (sizeof(a) / sizeof((a)[0]))

/* Fills rec (zeroed first) from a flat field/value array reply. key names the record in
 * messages. PV_INTERNAL when the reply is not such an array; PV_DATA_LOSS as above. */
int pv_record_decode(const pv_record_schema *s, const char *key, const redisReply *flat, void *rec,
                     pv_status *st);

/* Fills rec (zeroed first) from a JSON object (borrowed). */
int pv_record_decode_json(const pv_record_schema *s, const char *key, json_t *obj, void *rec,
                          pv_status *st);

/* Appends "name value" for every field of rec to argv (HSET's arguments after the key); an
 * absent JSON value or a NULL string is written as its default text, or "" without one.
 * 0, or -1 out of memory (argv->oom set). */
int pv_record_encode(const pv_record_schema *s, const void *rec, pv_strv *argv);

/* A new JSON object of rec's fields (and the unknown ones kept in extra); NULL out of memory.
 * A NULL string or JSON value is left out. */
json_t *pv_record_encode_json(const pv_record_schema *s, const void *rec);

void pv_record_free(const pv_record_schema *s, void *rec);

/* Sets a PV_FIELD_STR slot to a copy of v (NULL: no string), freeing what it held: 0, or -1
 * out of memory (the slot unchanged). */
int pv_record_set_str(char **slot, const char *v);

/* Frees n records of an array, then the array. */
void pv_record_array_free(const pv_record_schema *s, void *recs, size_t n);

#endif
