/*
 * wk_storage: pools, volumes and snapshots on the node agent (see wk_storage.h).
 *
 * Each operation opens its own libvirt connection: the calls are rare next to the cost of the
 * work, and a connection per operation keeps the agent's threads from sharing one.
 */
#include "wk_storage.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <linux/fs.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "pv_time.h"
#include "pv_kinds.h"
#include "pv_id.h"
#include "pv_json.h"
#include "pv_log.h"
#include "pv_path.h"
#include "pv_storage.h"
#include "wk_agent.h"
#include "wk_virt_disk.h"
#include "wk_xml.h"

/* How long a snapshot command may run: qemu-img and the LVM and RBD commands change metadata
 * (rbd's rollback writes the image back, as LVM's restore copies the origin: those get a day,
 * as their time follows the volume's size) */
#define SNAPSHOT_CMD_TIMEOUT_MS 600000
#define SNAPSHOT_COPY_TIMEOUT_MS (24 * 3600 * 1000)

static void quiet(void *user, virErrorPtr err) {
    (void)user;
    (void)err;
}

/* The operation's context: its libvirt connection, opened on first use, and the node's storage
 * roots. */
typedef struct sctx {
    wk_op *op;
    virConnectPtr conn;
    char prefix[64]; /* libvirt pool names: "<redis prefix, sanitized>-" */
    pv_roots roots;
} sctx;

__attribute__((format(printf, 3, 4))) static int vir_fail(pv_status *st, int code, const char *fmt,
                                                          ...) {
    const char *why = virGetLastErrorMessage();
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return pv_status_set(st, code, "%s: %s", what, why ? why : "unknown libvirt error");
}

static int conn_of(sctx *c, pv_status *st) {
    if (c->conn) return PV_OK;
    const pv_config *cfg = wk_op_config(c->op);
    const char *uri = cfg && cfg->storage.libvirt_uri ? cfg->storage.libvirt_uri : "qemu:///system";
    virSetErrorFunc(NULL, quiet);
    c->conn = virConnectOpen(uri);
    if (!c->conn) return vir_fail(st, PV_UNAVAILABLE, "libvirt %s", uri);
    return PV_OK;
}

static void libvirt_name(sctx *c, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s%s", c->prefix, name);
}

static const char *param(wk_op *op, const char *key) {
    const char *v = wk_op_param(op, key);
    return v ? v : "";
}

/* ---- pools ---- */

/* Sets a record's string to a copy of v; false out of memory (a record then fails to be
 * written: pv_storage_put refuses one without its id, and the caller checks the others). */
static bool set_text(char **slot, const char *v) {
    return pv_record_set_str(slot, v) == 0;
}

/* Reads the pool's figures from libvirt into its record. */
static void pool_figures(virStoragePoolPtr p, pv_pool *rec) {
    virStoragePoolInfo info;
    virStoragePoolRefresh(p, 0); /* a failed refresh leaves the last figures: still worth them */
    if (virStoragePoolGetInfo(p, &info) == 0) {
        rec->capacity = (int64_t)info.capacity;
        rec->used = (int64_t)info.allocation;
        rec->available = (int64_t)info.available;
    }
}

/* The volume's path, allocation and capacity from libvirt into its record. libvirt answers
 * from its pool's list, which another operation's refresh of the same pool empties and refills:
 * a lookup in that moment fails, and a record written then would name no file. So it asks again
 * (after a refresh of its own) for up to 2 s, and fails rather than record a volume without its
 * path. */
static int vol_figures(virStorageVolPtr v, pv_volume *rec, pv_status *st) {
    for (int tries = 0; tries < 40; tries++) {
        if (tries) {
            usleep(50 * 1000);
            virStoragePoolPtr p = virStoragePoolLookupByVolume(v);
            if (p) {
                virStoragePoolRefresh(p, 0);
                virStoragePoolFree(p);
            }
        }
        virStorageVolInfo info;
        char *path = virStorageVolGetPath(v);
        if (path && virStorageVolGetInfo(v, &info) == 0) {
            rec->size = (int64_t)info.capacity;
            rec->used = (int64_t)info.allocation;
            free(rec->path);
            rec->path = path;
            return PV_OK;
        }
        free(path);
    }
    return vir_fail(st, PV_INTERNAL, "volume %s: libvirt does not give its path and size",
                    virStorageVolGetName(v) ?: "?");
}

/* The volume's format as the API's number; 0 for one pivirt does not serve (iso, qed, ...) or
 * none named (an LV, a LUN: raw to a guest). */
static int volume_format(virStorageVolPtr v) {
    char *xml = virStorageVolGetXMLDesc(v, 0);
    /* the volume's own format: a <backingStore> has one too */
    char *type = xml ? wk_xml_text_of(xml, "/volume/target/format/@type") : NULL;
    free(xml);
    int f = 0;
    for (int k = PV_VOL_RAW; type && k <= PV_VOL_VDI; k++)
        if (strcmp(type, pv_storage_format_name(k)) == 0) f = k;
    free(type);
    return f;
}

/* Whether a pool of this type keeps its volumes as files of its directory. */
static bool file_pool(int type) {
    return type == PV_POOL_DIR || type == PV_POOL_NFS;
}

/* Whether a volume libvirt lists in a file pool is one pivirt may serve: a regular file of its
 * directory (not a link, a device, a fifo, a directory), in a format pivirt serves. libvirt
 * itself follows links and reads any file as raw; a pool's directory may hold what an operator
 * put there. */
static bool importable(sctx *c, virStorageVolPtr v, int pool_type) {
    if (!file_pool(pool_type)) return true; /* LUNs, LVs, RBD images: the pool's own kind */
    virStorageVolInfo info;
    if (virStorageVolGetInfo(v, &info) != 0 || info.type != VIR_STORAGE_VOL_FILE) return false;
    if (volume_format(v) == 0) return false;
    char *path = virStorageVolGetPath(v);
    pv_status st;
    bool ok = path && pv_path_confine_file("path", path, &c->roots, &st) == PV_OK;
    if (path && !ok) pv_info("volume %s of a pool left alone: %s", path, st.msg);
    free(path);
    return ok;
}

/* A new READY volume's record (labels: a new reference, or NULL for none): false out of
 * memory. */
static bool new_volume(pv_volume *rec, const char *id, const char *name, const char *pool,
                       int64_t size, int format, json_t *labels) {
    memset(rec, 0, sizeof *rec);
    rec->size = size;
    rec->format = format;
    rec->status = PV_VOL_READY;
    rec->labels = labels ? labels : json_object();
    rec->created_ms = pv_time_now_ms();
    return rec->labels && set_text(&rec->id, id) && set_text(&rec->name, name) &&
           set_text(&rec->pool, pool) && set_text(&rec->current_snapshot, "");
}

/* Records one volume found in the pool (its name claimed for a new id first). */
static void import_one(sctx *c, const char *pool, virStorageVolPtr v, const char *name) {
    pv_status st;
    char id[PV_ID_MAX];
    pv_id_new("vol", id, sizeof id);
    if (pv_storage_claim_name(wk_op_redis(c->op), wk_op_keys(c->op), pool, name, id, &st) != PV_OK)
        return;
    pv_volume rec;
    bool made = new_volume(&rec, id, name, pool, 0, volume_format(v) ?: PV_VOL_RAW, NULL);
    rec.imported = true;
    /* listed before a DeleteVolume removed its file, claimed after that released its name (it
     * does so last): libvirt may still list it, the disk no longer has it */
    int frc = made ? vol_figures(v, &rec, &st) : PV_INTERNAL;
    struct stat sb;
    bool gone = frc != PV_OK || (rec.path && rec.path[0] == '/' && stat(rec.path, &sb) != 0);
    if (gone)
        pv_storage_release_name(wk_op_redis(c->op), wk_op_keys(c->op), pool, name, &st);
    else if (pv_storage_put(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_VOL, &rec, &st) == PV_OK)
        pv_info("pool %s: volume %s found by libvirt, recorded as %s", pool, name, id);
    pv_storage_free(PV_STO_VOL, &rec);
}

/* Records the volumes libvirt sees in the pool that nobody made through this API: an iSCSI
 * target's LUNs, an image an operator copied into a directory pool. Names already claimed (a
 * volume being made), pivirt's own temporary files, the LVs of its LVM snapshots and what a
 * file pool must not serve (importable) are left alone. The claimed names are read once, so a
 * refresh costs no round trip per known volume; a name claimed since that read is still
 * refused by the claim itself. */
static void import_unknown(sctx *c, const char *pool, int pool_type, virStoragePoolPtr p) {
    json_t *claimed = NULL;
    pv_status nst;
    if (pv_storage_claimed_names(wk_op_redis(c->op), wk_op_keys(c->op), pool, &claimed, &nst) !=
        PV_OK)
        return; /* Redis away: the next refresh imports them */
    virStorageVolPtr *vols = NULL;
    int n = virStoragePoolListAllVolumes(p, &vols, 0);
    for (int i = 0; i < n; i++) {
        const char *name = virStorageVolGetName(vols[i]);
        pv_status st;
        pv_snapshot snap = {0}; /* an LVM pool lists our snapshot LVs (named by their ids) */
        bool skip = !name || json_object_get(claimed, name) || name[0] == '.' ||
                    pv_storage_check_name("name", name, &st) != PV_OK ||
                    pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_SNAP, name, &snap,
                                   &st) == PV_OK;
        pv_storage_free(PV_STO_SNAP, &snap);
        if (!skip && importable(c, vols[i], pool_type)) import_one(c, pool, vols[i], name);
        virStorageVolFree(vols[i]);
    }
    free(vols);
    json_decref(claimed);
}

/* The pool's record refreshed from libvirt (after a change in it), and the volumes libvirt
 * found there that have no record yet. */
static int refresh_pool(sctx *c, const char *pool, pv_status *st) {
    pv_pool rec;
    if (pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_POOL, pool, &rec, st) != PV_OK)
        return st->code;
    char lname[256];
    libvirt_name(c, pool, lname, sizeof lname);
    virStoragePoolPtr p =
        conn_of(c, st) == PV_OK ? virStoragePoolLookupByName(c->conn, lname) : NULL;
    int rc = PV_OK;
    if (p) {
        pool_figures(p, &rec);
        import_unknown(c, pool, rec.type, p);
        virStoragePoolFree(p);
        rc = pv_storage_put(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_POOL, &rec, st);
    }
    pv_storage_free(PV_STO_POOL, &rec);
    return rc;
}

/* The UUID this system gives the libvirt pool its operation defines: derived from the key
 * prefix and the operation's id, so a redelivery of the same operation recognises the
 * definition an earlier delivery left, while a pool another system (another stack on this
 * libvirtd, an operator) defined under the same name has another UUID and is never touched. */
static void pool_uuid(sctx *c, char out[VIR_UUID_STRING_BUFLEN]) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    char seed[PV_ID_MAX + 128];
    snprintf(seed, sizeof seed, "pivirt pool %s%s", wk_op_keys(c->op)->prefix,
             wk_op_record(c->op)->id);
    SHA256((const unsigned char *)seed, strlen(seed), md);
    md[6] = (unsigned char)((md[6] & 0x0f) | 0x50); /* RFC 4122 version 5 (name-based, SHA) */
    md[8] = (unsigned char)((md[8] & 0x3f) | 0x80);
    snprintf(out, VIR_UUID_STRING_BUFLEN,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", md[0], md[1],
             md[2], md[3], md[4], md[5], md[6], md[7], md[8], md[9], md[10], md[11], md[12], md[13],
             md[14], md[15]);
}

/* Whether libvirt's pool p is the one whose UUID is uuid. */
static bool pool_is(virStoragePoolPtr p, const char *uuid) {
    char have[VIR_UUID_STRING_BUFLEN];
    return uuid && *uuid && virStoragePoolGetUUIDString(p, have) == 0 && strcmp(have, uuid) == 0;
}

/* Clears the way for this operation's definition of lname: one an earlier delivery of it left
 * (its UUID) is stopped and undefined; one this system did not define is refused,
 * FAILED_PRECONDITION naming it, and left as it is. */
static int clear_own_definition(sctx *c, const char *lname, const char *uuid, pv_status *st) {
    virStoragePoolPtr old = virStoragePoolLookupByName(c->conn, lname);
    if (!old) return PV_OK;
    int rc = PV_OK;
    if (pool_is(old, uuid)) {
        if (virStoragePoolIsActive(old) == 1) virStoragePoolDestroy(old);
        virStoragePoolUndefine(old);
    } else {
        char have[VIR_UUID_STRING_BUFLEN] = "?";
        virStoragePoolGetUUIDString(old, have);
        rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                           "libvirt already has a pool named %s (uuid %s) that this system did "
                           "not define: it is left as it is (another pivirt stack on this "
                           "libvirtd needs its own redis.prefix)",
                           lname, have);
    }
    virStoragePoolFree(old);
    return rc;
}

/* Defines the pool in libvirt, builds and starts it. *why gets what failed (the pool is then
 * recorded with status ERROR and the reason); *out the pool when it was defined. */
static void define_pool(sctx *c, int type, json_t *config, const char *lname, const char *uuid,
                        virStoragePoolPtr *out, char *why, size_t cap) {
    *out = NULL;
    char *lxml = NULL;
    pv_status xst;
    pv_storage_pool_xml(lname, uuid, type, config, &lxml, &xst);
    virStoragePoolPtr p = lxml ? virStoragePoolDefineXML(c->conn, lxml, 0) : NULL;
    free(lxml);
    if (!p) {
        snprintf(why, cap, "libvirt cannot define it: %s", virGetLastErrorMessage());
        return;
    }
    if (file_pool(type) && virStoragePoolBuild(p, 0) != 0)
        pv_warn("pool %s: build: %s", lname, virGetLastErrorMessage());
    if (virStoragePoolCreate(p, 0) != 0)
        snprintf(why, cap, "libvirt cannot start it: %s", virGetLastErrorMessage());
    else
        virStoragePoolSetAutostart(p, 1);
    *out = p;
}

static int pool_create(sctx *c, pv_status *st) {
    wk_op *op = c->op;
    const char *name = param(op, "name");
    json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
    json_t *config = json_deep_copy(json_object_get(params, "config"));
    int type = (int)json_integer_value(json_object_get(params, "type"));
    json_decref(params);
    if (!config) config = json_object();
    char lname[256], uuid[VIR_UUID_STRING_BUFLEN];
    libvirt_name(c, name, lname, sizeof lname);
    pool_uuid(c, uuid);
    char *xml = NULL;
    int rc = pv_storage_pool_xml(name, NULL, type, config, &xml, st);
    free(xml);
    /* A file pool's directory (a DIR pool's path, an NFS mount point) lives in the node's
     * storage roots, reached without a link, and is made when missing, as the API promises:
     * all of it before libvirt hears of the pool. */
    if (rc == PV_OK && file_pool(type))
        rc = pv_path_confine_dir("config.path", json_string_value(json_object_get(config, "path")),
                                 &c->roots, PV_PATH_MKDIR, st);
    if (rc == PV_OK) rc = conn_of(c, st);
    if (rc == PV_OK) rc = clear_own_definition(c, lname, uuid, st);
    if (rc != PV_OK) {
        json_decref(config);
        return rc;
    }
    pv_pool rec = {.type = type, .config = config, .created_ms = pv_time_now_ms()};
    if (!set_text(&rec.name, name) || !set_text(&rec.node, param(op, "node")) ||
        !set_text(&rec.libvirt_uuid, uuid)) {
        pv_storage_free(PV_STO_POOL, &rec);
        return pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    virStoragePoolPtr p = NULL;
    char why[PV_STATUS_MSG_MAX] = "";
    define_pool(c, type, config, lname, uuid, &p, why, sizeof why);
    if (why[0]) {
        rec.status = PV_POOL_ERROR;
        json_object_set_new(config, "status_message", json_string(why));
        pv_warn("pool %s (%s): %s", name, lname, why);
    } else {
        rec.status = PV_POOL_ACTIVE;
        pool_figures(p, &rec);
        import_unknown(c, name, type, p); /* an iSCSI target's LUNs, a directory's images */
        pv_info("pool %s (%s) active", name, lname);
    }
    if (p) virStoragePoolFree(p);
    rc = pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_POOL, &rec, st);
    pv_storage_free(PV_STO_POOL, &rec); /* config with it */
    return rc;
}

static int pool_delete(sctx *c, pv_status *st) {
    const char *name = param(c->op, "name");
    pv_pool rec;
    int rc = pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_POOL, name, &rec, st);
    if (rc == PV_NOT_FOUND) return PV_OK; /* an earlier delivery deleted it */
    if (rc == PV_OK) rc = conn_of(c, st);
    if (rc == PV_OK) {
        char lname[256];
        libvirt_name(c, name, lname, sizeof lname);
        virStoragePoolPtr p = virStoragePoolLookupByName(c->conn, lname);
        const char *uuid = rec.libvirt_uuid;
        /* a definition of this name that is not the one this pool made (another stack's,
         * since): not ours to stop; records made before UUIDs were kept go by name */
        if (p && uuid && !pool_is(p, uuid)) {
            pv_warn("pool %s: libvirt's %s is not the pool this system defined: left as it is",
                    name, lname);
            virStoragePoolFree(p);
            p = NULL;
        }
        if (p) {
            if (virStoragePoolIsActive(p) == 1 && virStoragePoolDestroy(p) != 0)
                rc = vir_fail(st, PV_FAILED_PRECONDITION, "stopping pool %s", name);
            if (rc == PV_OK && virStoragePoolUndefine(p) != 0)
                rc = vir_fail(st, PV_INTERNAL, "undefining pool %s", name);
            virStoragePoolFree(p);
        }
    }
    if (rc == PV_OK)
        rc = pv_storage_del(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_POOL, &rec, st);
    pv_storage_free(PV_STO_POOL, &rec);
    return rc;
}

/* ---- volumes ---- */

/* A text of the pool's config; NULL when it has none. */
static const char *pool_cfg(const pv_pool *pool, const char *key) {
    return json_string_value(json_object_get(pool->config, key));
}

/* The pool (its record in *rec, for the caller to free, set even on a refusal), active, its
 * directory confined, and libvirt's handle of it in *p. */
static int active_pool(sctx *c, const char *pool, pv_pool *rec, virStoragePoolPtr *p,
                       pv_status *st) {
    *p = NULL;
    if (pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_POOL, pool, rec, st) != PV_OK)
        return st->code;
    if (rec->status != PV_POOL_ACTIVE)
        return pv_status_set(st, PV_FAILED_PRECONDITION, "pool: pool %s is not active (%s)", pool,
                             pool_cfg(rec, "status_message") ?: "inactive");
    char field[200];
    snprintf(field, sizeof field, "pool %s", pool);
    if (file_pool(rec->type) &&
        pv_path_confine_dir(field, pool_cfg(rec, "path"), &c->roots, 0, st) != PV_OK) {
        pv_status keep = *st;
        return pv_status_set(st, PV_FAILED_PRECONDITION, "%s", keep.msg);
    }
    if (conn_of(c, st) != PV_OK) return st->code;
    char lname[256];
    libvirt_name(c, pool, lname, sizeof lname);
    *p = virStoragePoolLookupByName(c->conn, lname);
    if (!*p) return vir_fail(st, PV_FAILED_PRECONDITION, "pool %s is not defined in libvirt", pool);
    virStoragePoolRefresh(*p, 0);
    return PV_OK;
}

static double overcommit_of(const pv_pool *pool) {
    const char *v = pool_cfg(pool, "max_overcommit");
    double d = v ? strtod(v, NULL) : 20.0;
    return d >= 1.0 ? d : 20.0;
}

/* Whether size more bytes fit: thick (LVM) volumes in what is available; thin ones while the
 * sum of the pool's volume sizes stays within max_overcommit times its capacity. Sizes come
 * from clients: every sum is checked (a size near INT64_MAX must be RESOURCE_EXHAUSTED, not a
 * sum that wraps and passes). */
static int check_room(sctx *c, const char *field, const pv_pool *pool, virStoragePoolPtr p,
                      int64_t size, pv_status *st) {
    virStoragePoolInfo info;
    if (virStoragePoolGetInfo(p, &info) != 0) return vir_fail(st, PV_INTERNAL, "pool %s", "info");
    const char *name = pool->name;
    if (pool->type == PV_POOL_LVM) {
        if ((uint64_t)size > info.available)
            return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                                 "%s: %lld more bytes do not fit in pool %s (%llu available)",
                                 field, (long long)size, name, (unsigned long long)info.available);
        return PV_OK;
    }
    pv_volume *vols = NULL;
    size_t n = 0;
    if (pv_storage_list(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_VOL, name, (void **)&vols, &n,
                        st) != PV_OK)
        return st->code;
    int64_t promised = 0, total = 0;
    bool wrapped = false;
    for (size_t i = 0; i < n; i++) {
        int64_t one = vols[i].size;
        wrapped = wrapped || one < 0 || __builtin_add_overflow(promised, one, &promised);
    }
    pv_storage_array_free(PV_STO_VOL, vols, n);
    wrapped = wrapped || __builtin_add_overflow(promised, size, &total);
    double limit = overcommit_of(pool) * (double)info.capacity;
    if (wrapped || (double)total > limit)
        return pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                             "%s: pool %s cannot hold %lld more bytes: its volumes "
                             "already promise %lld of at most %.0f (%.4g x its capacity %llu)",
                             field, name, (long long)size, (long long)promised, limit,
                             overcommit_of(pool), (unsigned long long)info.capacity);
    return PV_OK;
}

/* Whether the record of kind named id exists (made by an earlier delivery of the operation). */
static bool record_exists(sctx *c, pv_sto_kind kind, const char *id) {
    union {
        pv_volume vol;
        pv_snapshot snap;
    } rec;
    pv_status st;
    bool found =
        pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), kind, id, &rec, &st) == PV_OK;
    pv_storage_free(kind, &rec);
    return found;
}

static int volume_create(sctx *c, pv_status *st) {
    wk_op *op = c->op;
    const char *id = param(op, "id"), *name = param(op, "name"), *pool = param(op, "pool");
    long size = 0, format = 0;
    if (wk_op_param_int(op, "size", 0, 1, INT64_MAX, &size, st) != PV_OK ||
        wk_op_param_int(op, "format", PV_VOL_QCOW2, 1, 4, &format, st) != PV_OK)
        return st->code;
    if (record_exists(c, PV_STO_VOL, id)) return PV_OK; /* an earlier delivery made it */
    pv_pool prec = {0};
    virStoragePoolPtr p = NULL;
    int rc = active_pool(c, pool, &prec, &p, st);
    if (rc == PV_OK && prec.type == PV_POOL_ISCSI)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                           "pool: %s is an iSCSI pool: its volumes are the target's LUNs, made on "
                           "the target (they appear here after a refresh)",
                           pool);
    if (rc == PV_OK) rc = check_room(c, "size_bytes", &prec, p, size, st);
    if (rc == PV_OK)
        rc = pv_storage_claim_name(wk_op_redis(op), wk_op_keys(op), pool, name, id, st);
    virStorageVolPtr v = NULL;
    if (rc == PV_OK) {
        char xml[1024];
        snprintf(xml, sizeof xml,
                 "<volume><name>%s</name><capacity unit='bytes'>%ld</capacity>"
                 "<allocation unit='bytes'>0</allocation><target><format type='%s'/></target>"
                 "</volume>",
                 name, size, pv_storage_format_name((int)format));
        v = virStorageVolLookupByName(p, name);
        if (!v) v = virStorageVolCreateXML(p, xml, 0);
        if (!v) {
            rc = vir_fail(st, PV_INTERNAL, "creating volume %s", name);
            pv_storage_release_name(wk_op_redis(op), wk_op_keys(op), pool, name, NULL);
        }
    }
    if (rc == PV_OK) {
        json_t *params = json_loads(wk_op_record(op)->params, 0, NULL);
        json_t *labels = json_object_get(params, "labels");
        pv_volume rec;
        rc = new_volume(&rec, id, name, pool, size, (int)format,
                        json_is_object(labels) ? json_incref(labels) : NULL)
                 ? vol_figures(v, &rec, st)
                 : pv_status_set(st, PV_INTERNAL, "out of memory");
        json_decref(params);
        if (rc == PV_OK) rc = pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, &rec, st);
        pv_storage_free(PV_STO_VOL, &rec);
    }
    if (v) virStorageVolFree(v);
    if (p) virStoragePoolFree(p);
    pv_storage_free(PV_STO_POOL, &prec);
    if (rc == PV_OK) refresh_pool(c, pool, st);
    return rc;
}

/* A volume's file, in a pool that keeps files, is checked again before the agent acts on it: a
 * pool made before storage roots were enforced, or a file swapped for a link since, must not
 * make the agent copy, resize, snapshot or unlink a host file. FAILED_PRECONDITION naming it.
 * *pool_out (may be NULL) gets the pool's record, read for the check, for the caller to decref. */
static int confined_volume(sctx *c, const pv_volume *vol, pv_pool *pool_out, pv_status *st) {
    pv_pool pool;
    if (pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_POOL, vol->pool, &pool, st) !=
        PV_OK)
        return st->code;
    int type = pool.type;
    if (pool_out)
        *pool_out = pool;
    else
        pv_storage_free(PV_STO_POOL, &pool);
    if (!file_pool(type)) return PV_OK;
    char field[200];
    snprintf(field, sizeof field, "volume %s", vol->name);
    int rc = pv_path_confine_file(field, vol->path, &c->roots, st);
    /* a file already gone from a confined directory (a delete redelivered after its unlink)
     * leaves nothing outside to act on: the operation goes on as before */
    if (rc == PV_OK || rc == PV_NOT_FOUND) {
        pv_status_clear(st);
        return PV_OK;
    }
    if (st->code != PV_FAILED_PRECONDITION) { /* no path: not the client's to fix */
        pv_status keep = *st;
        pv_status_set(st, PV_FAILED_PRECONDITION, "%s", keep.msg);
    }
    return st->code;
}

/* A volume to act on: its record, not in use, its file confined; *pool (may be NULL) its pool's
 * record (caller frees both, set even on a refusal). */
static int load_volume(sctx *c, const char *id, pv_volume *rec, pv_pool *pool, pv_status *st) {
    if (pool) memset(pool, 0, sizeof *pool);
    if (pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_VOL, id, rec, st) != PV_OK)
        return st->code;
    if (rec->status == PV_VOL_IN_USE)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "volume %s is in use by a running workload", id);
    return confined_volume(c, rec, pool, st);
}

/* Snapshots, restores and clones act on the volume's image outside any domain (qemu-img, a
 * copy): never while a running domain holds it open (FAILED_PRECONDITION naming the workload
 * and its domain; libvirt is asked, as any domain of the host counts). A volume IN_USE by a
 * workload whose domain is shut off is that VM's disk between two runs and may be acted on;
 * IN_USE by anything that is no domain's disk stays refused. */
static int not_held_open(sctx *c, const pv_volume *vol, pv_status *st) {
    const char *path = vol->path ? vol->path : "", *name = vol->name ? vol->name : "";
    const char *user = vol->in_use_by ? vol->in_use_by : "";
    wk_virt_disk_holder h = {0};
    if (*path &&
        (conn_of(c, st) != PV_OK || wk_virt_disk_holder_of(c->conn, path, &h, st) != PV_OK))
        return st->code;
    if (h.running)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "volume %s is a disk of workload %s (domain %s), which is running: "
                             "stop it first",
                             name, h.workload[0] ? h.workload : (*user ? user : "(none)"),
                             h.domain);
    if (vol->status == PV_VOL_IN_USE && !h.found)
        return pv_status_set(st, PV_FAILED_PRECONDITION, "volume %s is in use by workload %s", name,
                             *user ? user : "?");
    return PV_OK;
}

static virStorageVolPtr vol_handle(sctx *c, const pv_volume *rec, pv_status *st) {
    if (conn_of(c, st) != PV_OK) return NULL;
    const char *path = rec->path;
    virStorageVolPtr v = path ? virStorageVolLookupByPath(c->conn, path) : NULL;
    if (!v) vir_fail(st, PV_INTERNAL, "volume at %s", path ? path : "?");
    return v;
}

/* A volume grows by what its pool still has room for, as a new volume of that size would. */
static int check_growth(sctx *c, const pv_volume *vol, int64_t size, pv_status *st) {
    pv_pool prec;
    virStoragePoolPtr p = NULL;
    int rc = active_pool(c, vol->pool, &prec, &p, st);
    if (rc == PV_OK && size > vol->size)
        rc = check_room(c, "new_size_bytes", &prec, p, size - vol->size, st);
    if (p) virStoragePoolFree(p);
    pv_storage_free(PV_STO_POOL, &prec);
    return rc;
}

static int volume_resize(sctx *c, pv_status *st) {
    pv_volume rec = {0};
    long size = 0;
    int rc = wk_op_param_int(c->op, "size", 0, 1, INT64_MAX, &size, st);
    if (rc == PV_OK) rc = load_volume(c, param(c->op, "id"), &rec, NULL, st);
    if (rc == PV_OK && size < rec.size)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT,
                           "new_size_bytes: %ld is smaller than the volume (%lld): volumes only "
                           "grow",
                           size, (long long)rec.size);
    if (rc == PV_OK) rc = check_growth(c, &rec, size, st);
    virStorageVolPtr v = rc == PV_OK ? vol_handle(c, &rec, st) : NULL;
    if (rc == PV_OK && !v) rc = st->code;
    if (rc == PV_OK && virStorageVolResize(v, (unsigned long long)size, 0) != 0)
        rc = vir_fail(st, PV_FAILED_PRECONDITION, "resizing volume %s", rec.name);
    if (rc == PV_OK) {
        rc = vol_figures(v, &rec, st);
        if (rc == PV_OK)
            rc = pv_storage_put(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_VOL, &rec, st);
    }
    if (v) virStorageVolFree(v);
    if (rc == PV_OK) refresh_pool(c, rec.pool, st);
    pv_storage_free(PV_STO_VOL, &rec);
    return rc;
}

int wk_storage_sparse_copy(const char *src, const char *dst, int64_t *copied, pv_status *st) {
    *copied = 0;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return pv_status_set(st, PV_INTERNAL, "open %s: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) {
        int e = errno;
        close(in);
        return pv_status_set(st, PV_INTERNAL, "create %s: %s", dst, strerror(e));
    }
    int rc = PV_OK;
    if (ioctl(out, FICLONE, in) != 0) { /* no reflink here: copy the data extents only */
        struct stat sb;
        fstat(in, &sb);
        off_t pos = 0;
        while (rc == PV_OK && pos < sb.st_size) {
            off_t data = lseek(in, pos, SEEK_DATA);
            if (data < 0) break; /* only a hole is left */
            off_t hole = lseek(in, data, SEEK_HOLE);
            if (hole < 0) hole = sb.st_size;
            off_t off_in = data, off_out = data;
            while (rc == PV_OK && off_in < hole) {
                ssize_t n = copy_file_range(in, &off_in, out, &off_out, (size_t)(hole - off_in), 0);
                if (n <= 0)
                    rc = pv_status_set(st, PV_INTERNAL, "copying %s: %s", src,
                                       n < 0 ? strerror(errno) : "short copy");
                else
                    *copied += n;
            }
            pos = hole;
        }
        if (rc == PV_OK && ftruncate(out, sb.st_size) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "truncate %s: %s", dst, strerror(errno));
    }
    if (rc == PV_OK && fsync(out) != 0)
        rc = pv_status_set(st, PV_INTERNAL, "fsync %s: %s", dst, strerror(errno));
    close(in);
    if (close(out) != 0 && rc == PV_OK)
        rc = pv_status_set(st, PV_INTERNAL, "close %s: %s", dst, strerror(errno));
    return rc;
}

static int volume_clone(sctx *c, pv_status *st) {
    wk_op *op = c->op;
    const char *id = param(op, "id"), *name = param(op, "name"), *pool = param(op, "pool");
    if (record_exists(c, PV_STO_VOL, id)) return PV_OK;
    pv_volume src;
    pv_pool prec = {0};
    virStoragePoolPtr p = NULL;
    int rc = pv_storage_get(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, param(op, "source_id"),
                            &src, st);
    if (rc == PV_OK) rc = not_held_open(c, &src, st);
    if (rc == PV_OK) rc = confined_volume(c, &src, NULL, st);
    if (rc == PV_OK) rc = active_pool(c, pool, &prec, &p, st);
    if (rc == PV_OK) rc = check_room(c, "source_id", &prec, p, src.size, st);
    if (rc == PV_OK)
        rc = pv_storage_claim_name(wk_op_redis(op), wk_op_keys(op), pool, name, id, st);
    virStorageVolPtr v = NULL;
    int64_t copied = 0;
    if (rc == PV_OK && prec.type == PV_POOL_DIR) {
        const char *dir = pool_cfg(&prec, "path");
        char dst[4096], tmp[4200];
        snprintf(dst, sizeof dst, "%s/%s", dir, name);
        snprintf(tmp, sizeof tmp, "%s/.pvtmp-%s", dir, id);
        rc = wk_storage_sparse_copy(src.path, tmp, &copied, st);
        if (rc == PV_OK && rename(tmp, dst) != 0)
            rc = pv_status_set(st, PV_INTERNAL, "rename to %s: %s", dst, strerror(errno));
        if (rc != PV_OK) unlink(tmp);
        if (rc == PV_OK) {
            /* another operation's refresh of the same pool may be under way: libvirt then
             * refuses this one or has not listed the new file yet */
            for (int tries = 0; !v && tries < 40; tries++) {
                if (tries) usleep(50 * 1000);
                virStoragePoolRefresh(p, 0);
                v = virStorageVolLookupByPath(c->conn, dst);
            }
            if (!v) rc = vir_fail(st, PV_INTERNAL, "clone %s not seen by libvirt", name);
        }
    } else if (rc == PV_OK) {
        virStorageVolPtr from = vol_handle(c, &src, st);
        char xml[512];
        snprintf(xml, sizeof xml,
                 "<volume><name>%s</name><capacity unit='bytes'>%lld</capacity>"
                 "<target><format type='%s'/></target></volume>",
                 name, (long long)src.size, pv_storage_format_name(src.format));
        v = from ? virStorageVolCreateXMLFrom(p, xml, from, 0) : NULL;
        if (!v) rc = from ? vir_fail(st, PV_INTERNAL, "cloning into %s", name) : st->code;
        if (from) virStorageVolFree(from);
    }
    if (rc != PV_OK && prec.name) /* the pool was read: the name may be this clone's */
        pv_storage_release_name(wk_op_redis(op), wk_op_keys(op), pool, name, NULL);
    if (rc == PV_OK) {
        pv_volume rec;
        bool made = new_volume(&rec, id, name, pool, src.size, src.format,
                               json_is_object(src.labels) ? json_deep_copy(src.labels) : NULL) &&
                    set_text(&rec.cloned_from, src.id);
        rc = made ? vol_figures(v, &rec, st) : pv_status_set(st, PV_INTERNAL, "out of memory");
        if (rc == PV_OK) rc = pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, &rec, st);
        if (rc == PV_OK)
            pv_info("volume %s cloned from %s as %s: %lld bytes of data copied%s", name, src.name,
                    id, (long long)copied, copied == 0 ? " (reflink or empty)" : "");
        pv_storage_free(PV_STO_VOL, &rec);
    }
    if (v) virStorageVolFree(v);
    if (p) virStoragePoolFree(p);
    pv_storage_free(PV_STO_VOL, &src);
    pv_storage_free(PV_STO_POOL, &prec);
    if (rc == PV_OK) refresh_pool(c, pool, st);
    return rc;
}

/* ---- snapshots ---- */

/* setpriv(1) of util-linux (essential on Debian): ties a command's life to the agent's */
#define SETPRIV "/usr/bin/setpriv"

/* Runs a command of the node for a snapshot, tied to the agent: through `setpriv --pdeathsig
 * KILL`, the command dies with the agent that started it, so that the redelivered operation
 * never races a leftover one on the same volume (an orphaned qemu-img would hold the image's
 * lock; an orphaned dd would go on writing an origin the new delivery writes too). *code and
 * *out (caller frees) as wk_agent_run gives them, within timeout_ms; FAILED_PRECONDITION
 * naming the program when the node does not have it. */
static int run_tool(sctx *c, const char *const *argv, int timeout_ms, int *code, char **out,
                    pv_status *st) {
    *out = NULL;
    if (access(argv[0], X_OK) != 0)
        return pv_status_set(st, PV_FAILED_PRECONDITION, "%s is not installed on node %s: %s",
                             argv[0], wk_agent_node(wk_op_context(c->op)), strerror(errno));
    const char *full[PV_ARGV_MAX + 8];
    size_t n = 0;
    if (access(SETPRIV, X_OK) == 0) {
        full[n++] = SETPRIV;
        full[n++] = "--pdeathsig";
        full[n++] = "KILL";
        full[n++] = "--";
    } else {
        pv_warn("%s is missing: %s runs untied to the agent (it may outlive a killed agent)",
                SETPRIV, argv[0]);
    }
    for (size_t i = 0; argv[i] && n + 1 < sizeof full / sizeof full[0]; i++)
        full[n++] = argv[i];
    full[n] = NULL;
    const char *env[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", NULL};
    return wk_agent_run(wk_op_context(c->op), full, env, timeout_ms, code, out, st);
}

/* The output of a failed command on one line, without its trailing blanks, for a message. */
static const char *trimmed(char *out) {
    size_t n = out ? strlen(out) : 0;
    while (n && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = '\0';
    for (char *p = out; p && *p; p++)
        if (*p == '\n') *p = ' ';
    return out && *out ? out : "no output";
}

static const char *qemu_img_bin(sctx *c) {
    const pv_config *cfg = wk_op_config(c->op);
    return cfg && cfg->storage.qemu_img && *cfg->storage.qemu_img ? cfg->storage.qemu_img
                                                                  : "/usr/bin/qemu-img";
}

/* `qemu-img snapshot <verb> [tag] <path>`; *listing (when not NULL) gets the output. Another
 * process holding the image's lock is UNAVAILABLE: a passing state worth a retry. */
static int qemu_img(sctx *c, const char *verb, const char *tag, const char *path, char **listing,
                    pv_status *st) {
    const char *argv[] = {qemu_img_bin(c),  "snapshot",        verb,
                          tag ? tag : path, tag ? path : NULL, NULL};
    int code = -1;
    char *out = NULL;
    int rc = run_tool(c, argv, SNAPSHOT_CMD_TIMEOUT_MS, &code, &out, st);
    if (rc == PV_OK && code != 0) {
        bool locked = out && strstr(out, "Failed to get") && strstr(out, "lock");
        bool gone = strcmp(verb, "-d") == 0 &&
                    pv_storage_snapshot_done_before(PV_SNAPS_QCOW2, PV_SNAP_DELETE, out);
        if (gone)
            pv_info("qemu-img snapshot -d %s %s: already gone (an earlier delivery deleted it)",
                    tag, path);
        else
            rc = pv_status_set(st, locked ? PV_UNAVAILABLE : PV_FAILED_PRECONDITION,
                               "qemu-img snapshot %s %s: %s", verb, tag ? tag : "", trimmed(out));
    }
    if (rc == PV_OK && listing) {
        *listing = out;
        out = NULL;
    }
    free(out);
    return rc;
}

/* Whether the qcow2 image already has an internal snapshot tagged tag (`qemu-img snapshot
 * -l`: one line per snapshot, "ID TAG ..."), so that a redelivered create does not make a
 * second one (qemu-img takes duplicate tags). */
static int qcow2_has(sctx *c, const char *tag, const char *path, bool *has, pv_status *st) {
    char *list = NULL;
    *has = false;
    if (qemu_img(c, "-l", NULL, path, &list, st) != PV_OK) return st->code;
    for (char *save = NULL, *line = strtok_r(list, "\n", &save); line && !*has;
         line = strtok_r(NULL, "\n", &save)) {
        char id[64], name[256];
        *has = sscanf(line, "%63s %255s", id, name) == 2 && strcmp(name, tag) == 0;
    }
    free(list);
    return PV_OK;
}

/* `qemu-img check -r leaks`: the clusters a qemu-img killed in the middle of a change leaves
 * allocated but unused (qcow2 orders its writes so that an interruption leaks, never
 * corrupts) are freed. Corruption it cannot repair fails the operation. */
static int qcow2_repair_leaks(sctx *c, const char *path, pv_status *st) {
    const char *argv[] = {qemu_img_bin(c), "check", "-q", "-r", "leaks", "-f", "qcow2", path, NULL};
    int code = -1;
    char *out = NULL;
    int rc = run_tool(c, argv, SNAPSHOT_CMD_TIMEOUT_MS, &code, &out, st);
    if (rc == PV_OK && code != 0)
        rc = pv_status_set(st, code == 2 ? PV_FAILED_PRECONDITION : PV_UNAVAILABLE,
                           "qemu-img check -r leaks %s (exit %d): %s", path, code, trimmed(out));
    free(out);
    return rc;
}

/* A snapshot command of an LVM or RBD pool (pv_storage_snapshot_argv): FAILED_PRECONDITION
 * with the command's own output when it fails, unless the failure says an earlier delivery did
 * the work already. */
static int block_snapshot(sctx *c, int method, int what, const pv_pool *pool, const pv_volume *vol,
                          const char *snap_id, pv_status *st) {
    pv_argv a;
    if (pv_storage_snapshot_argv(what, pool, vol, snap_id, &a, st) != PV_OK) return st->code;
    int code = -1;
    char *out = NULL;
    int rc = run_tool(c, (const char *const *)a.v,
                      what == PV_SNAP_RESTORE ? SNAPSHOT_COPY_TIMEOUT_MS : SNAPSHOT_CMD_TIMEOUT_MS,
                      &code, &out, st);
    if (rc == PV_OK && code != 0) {
        if (pv_storage_snapshot_done_before(method, what, out))
            pv_info("%s for snapshot %s: done by an earlier delivery (%s)", a.v[0], snap_id,
                    trimmed(out));
        else
            rc = pv_status_set(st, PV_FAILED_PRECONDITION, "%s %s (exit %d): %s", a.v[0],
                               a.v[a.n - 1], code, trimmed(out));
    }
    free(out);
    pv_argv_clear(&a);
    return rc;
}

/* Creates (restores, deletes) snapshot snap_id of volume vol by the method of its pool. */
static int snapshot_cmd(sctx *c, int method, int what, const pv_pool *pool, const pv_volume *vol,
                        const char *snap_id, pv_status *st) {
    if (method == PV_SNAPS_LVM || method == PV_SNAPS_RBD)
        return block_snapshot(c, method, what, pool, vol, snap_id, st);
    const char *path = vol->path;
    if (!path) return pv_status_set(st, PV_INTERNAL, "volume %s has no path", vol->id);
    if (what == PV_SNAP_CREATE) {
        bool has = false;
        if (qcow2_has(c, snap_id, path, &has, st) != PV_OK) return st->code;
        if (has) {
            pv_info("snapshot %s of %s: made by an earlier delivery", snap_id, path);
            return PV_OK;
        }
    }
    static const char *const verbs[] = {"", "-c", "-a", "-d"};
    return qemu_img(c, verbs[what], snap_id, path, NULL, st);
}

static int64_t allocated(const char *path) {
    struct stat sb;
    return path && stat(path, &sb) == 0 ? (int64_t)sb.st_blocks * 512 : 0;
}

/* A volume no running domain holds (not_held_open), its pool's record and how its snapshots are
 * made: FAILED_PRECONDITION for a volume that takes none. The caller frees *vol and *pool (set
 * even on a refusal). */
static int snapshot_target(sctx *c, const char *vol_id, pv_volume *vol, pv_pool *pool, int *method,
                           pv_status *st) {
    memset(pool, 0, sizeof *pool);
    if (pv_storage_get(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_VOL, vol_id, vol, st) !=
            PV_OK ||
        not_held_open(c, vol, st) != PV_OK || confined_volume(c, vol, pool, st) != PV_OK)
        return st->code;
    *method = pv_storage_snapshot_method(pool->type, vol->format);
    if (*method == PV_SNAPS_NONE)
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "volume_id: volume %s is not qcow2: snapshots are qcow2 internal "
                             "snapshots, or LVM and RBD snapshots in those pools",
                             vol->name);
    return PV_OK;
}

/* What a new snapshot holds: a qcow2 image's allocation, an LVM snapshot's copy-on-write room
 * (its share of the origin), an RBD image's data when it was taken. */
static int64_t snapshot_bytes(int method, const pv_pool *pool, const pv_volume *vol) {
    if (method == PV_SNAPS_QCOW2) return allocated(vol->path);
    if (method == PV_SNAPS_LVM) {
        const char *pct = pool_cfg(pool, "snapshot_percent");
        return vol->size / 100 * (pct ? atoi(pct) : 100);
    }
    return vol->used;
}

/* Writes the new snapshot id's record (made by method from vol), then the volume's, whose
 * current snapshot it becomes. */
static int record_snapshot(sctx *c, const char *id, int method, const pv_pool *pool, pv_volume *vol,
                           pv_status *st) {
    wk_op *op = c->op;
    pv_snapshot rec = {.size = snapshot_bytes(method, pool, vol),
                       .status = PV_SNAP_READY,
                       .created_ms = pv_time_now_ms()};
    int rc = set_text(&rec.id, id) && set_text(&rec.name, param(op, "name")) &&
                     set_text(&rec.volume_id, param(op, "volume_id")) &&
                     set_text(&rec.parent, vol->current_snapshot)
                 ? pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_SNAP, &rec, st)
                 : pv_status_set(st, PV_INTERNAL, "out of memory");
    pv_storage_free(PV_STO_SNAP, &rec);
    if (rc == PV_OK && !set_text(&vol->current_snapshot, id))
        rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    if (rc == PV_OK && method == PV_SNAPS_QCOW2) vol->used = allocated(vol->path);
    if (rc == PV_OK) rc = pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, vol, st);
    return rc;
}

static int snapshot_create(sctx *c, pv_status *st) {
    wk_op *op = c->op;
    const char *id = param(op, "id");
    if (record_exists(c, PV_STO_SNAP, id)) return PV_OK;
    pv_volume vol = {0};
    pv_pool pool = {0};
    int method = PV_SNAPS_NONE;
    int rc = snapshot_target(c, param(op, "volume_id"), &vol, &pool, &method, st);
    if (rc == PV_OK && vol.restoring && *vol.restoring)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION,
                           "volume %s: its restore to snapshot %s did not finish; restore a "
                           "snapshot first",
                           vol.name, vol.restoring);
    if (rc == PV_OK) rc = snapshot_cmd(c, method, PV_SNAP_CREATE, &pool, &vol, id, st);
    if (rc == PV_OK) rc = record_snapshot(c, id, method, &pool, &vol, st);
    pv_storage_free(PV_STO_VOL, &vol);
    pv_storage_free(PV_STO_POOL, &pool);
    return rc;
}

/* A restore is journaled on the volume's record, whose writes are atomic: first `restoring`
 * (the snapshot) and `restore_op` (this operation), then the data is changed, then one write
 * sets current_snapshot and drops `restoring`. So the record is at the old snapshot or the new
 * one, never between; `restoring` says the data may already be the new one's. A delivery that
 * finds `restoring` completes the restore (after freeing what a killed qemu-img leaked); one
 * that finds this operation's restore finished (restore_op, no `restoring`) does nothing, so
 * that writes made since are not thrown away a second time. */
static int snapshot_restore(sctx *c, pv_status *st) {
    wk_op *op = c->op;
    const char *op_id = wk_op_record(op)->id;
    pv_snapshot snap;
    pv_volume vol = {0};
    pv_pool pool = {0};
    int method = PV_SNAPS_NONE;
    int rc = pv_storage_get(wk_op_redis(op), wk_op_keys(op), PV_STO_SNAP, param(op, "snapshot_id"),
                            &snap, st);
    if (rc == PV_OK) rc = snapshot_target(c, snap.volume_id, &vol, &pool, &method, st);
    const char *sid = snap.id;
    bool restoring = vol.restoring && *vol.restoring;
    bool done = rc == PV_OK && vol.restore_op && strcmp(vol.restore_op, op_id) == 0 && !restoring;
    if (rc == PV_OK && !done && restoring) {
        pv_warn("volume %s: the restore to snapshot %s by operation %s did not finish; "
                "completing it now",
                vol.name, vol.restoring, vol.restore_op ? vol.restore_op : "");
        if (method == PV_SNAPS_QCOW2) rc = qcow2_repair_leaks(c, vol.path, st);
    }
    if (rc == PV_OK && !done) {
        if (!set_text(&vol.restoring, sid) || !set_text(&vol.restore_op, op_id))
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        if (rc == PV_OK) rc = pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, &vol, st);
    }
    if (rc == PV_OK && !done) rc = snapshot_cmd(c, method, PV_SNAP_RESTORE, &pool, &vol, sid, st);
    if (rc == PV_OK && !done) {
        if (!set_text(&vol.current_snapshot, sid))
            rc = pv_status_set(st, PV_INTERNAL, "out of memory");
        set_text(&vol.restoring, NULL);
        if (method == PV_SNAPS_QCOW2) vol.used = allocated(vol.path);
        if (rc == PV_OK) rc = pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, &vol, st);
    }
    if (rc == PV_OK)
        wk_op_progress(op, 100, "volume %s restored to snapshot %s", vol.name, snap.name);
    pv_storage_free(PV_STO_SNAP, &snap);
    pv_storage_free(PV_STO_VOL, &vol);
    pv_storage_free(PV_STO_POOL, &pool);
    return rc;
}

/* The snapshots of volume vid that branch from snapshot id branch from its parent now. */
static int reparent_children(sctx *c, const char *vid, const char *id, const char *parent,
                             pv_status *st) {
    pv_snapshot *all = NULL;
    size_t n = 0;
    int rc = pv_storage_list(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_SNAP, vid, (void **)&all,
                             &n, st);
    for (size_t i = 0; rc == PV_OK && i < n; i++) {
        if (strcmp(all[i].parent, id) != 0) continue;
        rc = set_text(&all[i].parent, parent)
                 ? pv_storage_put(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_SNAP, &all[i], st)
                 : pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    pv_storage_array_free(PV_STO_SNAP, all, n);
    return rc;
}

static int snapshot_delete(sctx *c, pv_status *st) {
    wk_op *op = c->op;
    pv_snapshot snap;
    pv_volume vol = {0};
    pv_pool pool = {0};
    int rc =
        pv_storage_get(wk_op_redis(op), wk_op_keys(op), PV_STO_SNAP, param(op, "id"), &snap, st);
    if (rc == PV_NOT_FOUND) return PV_OK;
    const char *vid = snap.volume_id;
    int method = PV_SNAPS_NONE;
    if (rc == PV_OK) rc = snapshot_target(c, vid, &vol, &pool, &method, st);
    const char *id = snap.id, *parent = snap.parent;
    if (rc == PV_OK) rc = snapshot_cmd(c, method, PV_SNAP_DELETE, &pool, &vol, id, st);
    if (rc == PV_OK) rc = reparent_children(c, vid, id, parent, st);
    if (rc == PV_OK && strcmp(vol.current_snapshot, id) == 0) {
        rc = set_text(&vol.current_snapshot, parent)
                 ? pv_storage_put(wk_op_redis(op), wk_op_keys(op), PV_STO_VOL, &vol, st)
                 : pv_status_set(st, PV_INTERNAL, "out of memory");
    }
    if (rc == PV_OK) rc = pv_storage_del(wk_op_redis(op), wk_op_keys(op), PV_STO_SNAP, &snap, st);
    pv_storage_free(PV_STO_SNAP, &snap);
    pv_storage_free(PV_STO_VOL, &vol);
    pv_storage_free(PV_STO_POOL, &pool);
    return rc;
}

/* The volume, its snapshots' records and its name. The snapshots of LVM and RBD volumes are
 * things of their own (an LV; an image's snapshot, without which rbd will not remove the
 * image): removed first, with their own commands; qcow2 ones go with the file. */
static int volume_delete(sctx *c, pv_status *st) {
    pv_volume rec;
    pv_pool pool = {0};
    pv_snapshot *snaps = NULL;
    size_t n = 0;
    int rc = load_volume(c, param(c->op, "id"), &rec, &pool, st);
    if (rc == PV_NOT_FOUND) {
        pv_storage_free(PV_STO_POOL, &pool);
        return PV_OK;
    }
    if (rc == PV_OK)
        rc = pv_storage_list(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_SNAP, rec.id,
                             (void **)&snaps, &n, st);
    int method = PV_SNAPS_NONE;
    if (rc == PV_OK && n > 0) method = pv_storage_snapshot_method(pool.type, rec.format);
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        if (method == PV_SNAPS_LVM || method == PV_SNAPS_RBD)
            rc = block_snapshot(c, method, PV_SNAP_DELETE, &pool, &rec, snaps[i].id, st);
    virStorageVolPtr v = rc == PV_OK ? vol_handle(c, &rec, st) : NULL;
    if (rc == PV_OK && v && virStorageVolDelete(v, 0) != 0)
        rc = vir_fail(st, PV_INTERNAL, "deleting volume %s", rec.name);
    if (v) virStorageVolFree(v);
    for (size_t i = 0; rc == PV_OK && i < n; i++)
        rc = pv_storage_del(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_SNAP, &snaps[i], st);
    if (rc == PV_OK)
        rc = pv_storage_del(wk_op_redis(c->op), wk_op_keys(c->op), PV_STO_VOL, &rec, st);
    if (rc == PV_OK) refresh_pool(c, rec.pool, st);
    pv_storage_array_free(PV_STO_SNAP, snaps, n);
    pv_storage_free(PV_STO_POOL, &pool);
    pv_storage_free(PV_STO_VOL, &rec);
    return rc;
}

/* ---- dispatch ---- */

int wk_storage_run(wk_op *op, pv_status *st) {
    if (!wk_op_context(op))
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "%s needs the node agent (pivirt-worker --set worker.node=NAME)",
                             wk_op_record(op)->kind);
    sctx c = {.op = op};
    const char *prefix = wk_op_keys(op)->prefix;
    size_t n = 0;
    for (; prefix[n] && n + 2 < sizeof c.prefix; n++)
        c.prefix[n] = (char)(isalnum((unsigned char)prefix[n]) ? prefix[n] : '-');
    if (n == 0 || c.prefix[n - 1] != '-') c.prefix[n++] = '-';
    c.prefix[n] = '\0';
    const pv_config *cfg = wk_op_config(op);
    if (pv_path_roots_init(&c.roots, cfg ? cfg->storage.roots : NULL,
                           cfg ? cfg->storage.n_roots : 0, cfg ? cfg->data_dir : NULL, st) != PV_OK)
        return st->code;
    static const struct {
        const char *kind;
        int (*fn)(sctx *, pv_status *);
    } k[] = {
        {PV_KIND_POOL_CREATE, pool_create},         {PV_KIND_POOL_DELETE, pool_delete},
        {PV_KIND_VOLUME_CREATE, volume_create},     {PV_KIND_VOLUME_RESIZE, volume_resize},
        {PV_KIND_VOLUME_CLONE, volume_clone},       {PV_KIND_VOLUME_DELETE, volume_delete},
        {PV_KIND_SNAPSHOT_CREATE, snapshot_create}, {PV_KIND_SNAPSHOT_RESTORE, snapshot_restore},
        {PV_KIND_SNAPSHOT_DELETE, snapshot_delete},
    };
    int rc =
        pv_status_set(st, PV_INVALID_ARGUMENT, "no storage handler for %s", wk_op_record(op)->kind);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(k[i].kind, wk_op_record(op)->kind) == 0) rc = k[i].fn(&c, st);
    if (c.conn) virConnectClose(c.conn);
    pv_path_roots_clear(&c.roots);
    /* an answer of the storage (no room, not qcow2, shrinking) is final, not a passing fault */
    if (rc == PV_RESOURCE_EXHAUSTED) {
        pv_status keep = *st;
        return wk_op_fail_final(op, st, rc, "%s", keep.msg);
    }
    return rc;
}
