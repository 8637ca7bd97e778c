/*
 * pv_storage: names, pool configurations and their libvirt XML, and the storage records (see
 * pv_storage.h).
 */
#include "pv_storage.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "pv_buf.h"
#include "pv_json.h"
#include "pv_path.h"
#include "pv_time.h"

int pv_storage_check_name(const char *field, const char *name, pv_status *st) {
    if (!name || !*name) return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: required", field);
    size_t n = strlen(name);
    /* no ".." anywhere, not only as a whole component: the rule stays one an operator can
     * read off a name (found by fuzz_wire: "a..b" passed, against what the API promises) */
    bool ok = n <= 128 && name[0] != '-' && name[0] != '.' && !strstr(name, "..");
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)name[i]) || name[i] == '.' || name[i] == '_' || name[i] == '-';
    if (ok) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT,
                         "%s: \"%.64s\" is not a plain name (letters, digits, '.', '_', '-'; "
                         "not starting with '-' or '.'; no \"..\"; at most 128)",
                         field, name);
}

/* ---- pool configurations ---- */

typedef struct key_rule {
    const char *key;
    bool required;
    char kind; /* 'p' absolute path, 'L' list of device paths, 'h' host[:port], 'l' list of
                  those, 'n' plain name, 'q' iSCSI name, 's' string, 'u' uuid, '%' a whole
                  percentage 1..100, 'r' overcommit ratio */
} key_rule;

static const key_rule k_common[] = {
    {"node", false, 's'}, {"max_overcommit", false, 'r'}, {"status_message", false, 's'}};
static const key_rule k_dir[] = {{"path", true, 'p'}};
static const key_rule k_lvm[] = {{"volume_group", true, 'n'},
                                 {"devices", false, 'L'},
                                 {"thin_pool", false, 'n'},
                                 {"snapshot_percent", false, '%'}};
static const key_rule k_nfs[] = {{"server", true, 'h'}, {"export", true, 'p'}, {"path", true, 'p'}};
static const key_rule k_iscsi[] = {{"portal", true, 'h'},
                                   {"target", true, 'q'},
                                   {"chap_username", false, 's'},
                                   {"chap_secret", false, 's'}};
static const key_rule k_rbd[] = {
    {"monitors", true, 'l'}, {"pool", true, 'n'}, {"user", true, 'n'}, {"secret_uuid", true, 'u'}};

static const key_rule *rules_of(int type, size_t *n) {
    switch (type) {
    case PV_POOL_DIR:
        *n = sizeof k_dir / sizeof k_dir[0];
        return k_dir;
    case PV_POOL_LVM:
        *n = sizeof k_lvm / sizeof k_lvm[0];
        return k_lvm;
    case PV_POOL_NFS:
        *n = sizeof k_nfs / sizeof k_nfs[0];
        return k_nfs;
    case PV_POOL_ISCSI:
        *n = sizeof k_iscsi / sizeof k_iscsi[0];
        return k_iscsi;
    case PV_POOL_RBD:
        *n = sizeof k_rbd / sizeof k_rbd[0];
        return k_rbd;
    }
    *n = 0;
    return NULL;
}

static bool safe_text(const char *v) {
    for (; *v; v++)
        if ((unsigned char)*v < 0x20 || *v == '<' || *v == '>' || *v == '&' || *v == '\'' ||
            *v == '"')
            return false;
    return true;
}

static bool host_port(const char *v) {
    if (!*v || !safe_text(v) || strchr(v, '/') || strchr(v, ' ')) return false;
    const char *colon = strrchr(v, ':');
    if (colon && v[0] != '[') {
        char *end;
        long port = strtol(colon + 1, &end, 10);
        return colon > v && *end == '\0' && port > 0 && port < 65536;
    }
    return true;
}

static bool is_uuid(const char *v) {
    if (strlen(v) != 36) return false;
    for (int i = 0; i < 36; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? v[i] != '-' : !isxdigit((unsigned char)v[i])) return false;
    }
    return true;
}

/* Each item of a comma-separated list passes ok. */
static bool each_item(const char *v, bool (*ok)(const char *)) {
    char buf[PV_PATH_MAX + 1];
    snprintf(buf, sizeof buf, "%s", v);
    bool any = false;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (!ok(tok)) return false;
        any = true;
    }
    return any;
}

/* A canonical absolute path (pv_path_check_abs) without XML metacharacters. Whether it lies in
 * the node's storage roots is the node agent's to check: the roots are the node's. */
static bool abs_path(const char *v) {
    return safe_text(v) && pv_path_check_abs("", v, NULL) == PV_OK;
}

/* A device path: canonical and under /dev (an LVM pool's physical volumes). */
static bool dev_path(const char *v) {
    return abs_path(v) && strncmp(v, "/dev/", 5) == 0;
}

/* A name libvirt puts in a path or a command line: the plain names of volumes. */
static bool plain(const char *v) {
    return pv_storage_check_name("", v, NULL) == PV_OK;
}

/* An iSCSI qualified name (iqn.2004-04.com.example:disk1, eui., naa.): no '/' nor space. */
static bool iqn(const char *v) {
    if (!*v) return false;
    for (; *v; v++)
        if (!isalnum((unsigned char)*v) && !strchr(".:-_", *v)) return false;
    return true;
}

static bool host_list(const char *v) {
    return each_item(v, host_port);
}

static bool dev_list(const char *v) {
    return each_item(v, dev_path);
}

static bool percent(const char *v) {
    char *end;
    long p = strtol(v, &end, 10);
    return *v && *end == '\0' && p >= 1 && p <= 100;
}

static bool ratio(const char *v) {
    char *end;
    double d = strtod(v, &end);
    return *v && *end == '\0' && isfinite(d) && d >= 1.0 && d <= PV_STORAGE_OVERCOMMIT_MAX;
}

static bool any_text(const char *v) {
    return *v && safe_text(v);
}

/* What each kind of key_rule takes, and how a refusal names it. */
static const struct value_kind {
    char kind;
    bool (*ok)(const char *);
    const char *want;
} k_value_kinds[] = {
    {'p', safe_text, "a path without <>&'\" or control characters"},
    {'h', host_port, "a host or host:port"},
    {'l', host_list, "a comma-separated list of host or host:port"},
    {'L', dev_list, "a comma-separated list of device paths under /dev"},
    {'n', plain, "a plain name (letters, digits, '.', '_', '-')"},
    {'q', iqn, "an iSCSI qualified name (letters, digits, '.', ':', '-', '_')"},
    {'u', is_uuid, "a UUID"},
    {'%', percent, "a whole percentage from 1 to 100"},
    {'r', ratio, "a ratio from 1 to 1000"},
    {'s', any_text, "a non-empty value without <>&'\" or control characters"},
};

static int check_value(const key_rule *r, const char *v, pv_status *st) {
    if (strlen(v) > PV_PATH_MAX)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "config.%s: %zu bytes, longer than %d",
                             r->key, strlen(v), PV_PATH_MAX);
    char field[80];
    snprintf(field, sizeof field, "config.%s", r->key);
    /* a path is canonical and absolute first (pv_path's own message), then free of XML */
    if (r->kind == 'p' && pv_path_check_abs(field, v, st) != PV_OK) return st->code;
    const struct value_kind *k = &k_value_kinds[sizeof k_value_kinds / sizeof k_value_kinds[0] - 1];
    for (size_t i = 0; i < sizeof k_value_kinds / sizeof k_value_kinds[0]; i++)
        if (k_value_kinds[i].kind == r->kind) k = &k_value_kinds[i];
    if (k->ok(v)) return PV_OK;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "config.%s: \"%.100s\" is not %s", r->key, v,
                         k->want);
}

static const key_rule *find_rule(const key_rule *rules, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(rules[i].key, key) == 0) return &rules[i];
    return NULL;
}

int pv_storage_check_pool(int type, json_t *config, pv_status *st) {
    size_t n;
    const key_rule *rules = rules_of(type, &n);
    if (!rules) return pv_status_set(st, PV_INVALID_ARGUMENT, "type: %d is not a pool type", type);
    const char *key;
    json_t *v;
    json_object_foreach(config, key, v) {
        const key_rule *r = find_rule(rules, n, key);
        if (!r) r = find_rule(k_common, sizeof k_common / sizeof k_common[0], key);
        if (!r) {
            char known[256] = "";
            for (size_t i = 0; i < n; i++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                         rules[i].key);
            return pv_status_set(st, PV_INVALID_ARGUMENT,
                                 "config.%s: not a key of this pool type (it takes %s; and node, "
                                 "max_overcommit)",
                                 key, known);
        }
        if (!json_is_string(v))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "config.%s: not a string", key);
        if (strcmp(key, "status_message") != 0 && check_value(r, json_string_value(v), st) != PV_OK)
            return st->code;
    }
    for (size_t i = 0; i < n; i++)
        if (rules[i].required && !json_object_get(config, rules[i].key))
            return pv_status_set(st, PV_INVALID_ARGUMENT, "config.%s: required for this pool type",
                                 rules[i].key);
    return PV_OK;
}

/* ---- pool XML ---- */

static const char *cfg(json_t *config, const char *key) {
    const char *v = json_string_value(json_object_get(config, key));
    return v ? v : "";
}

/* host[:port] split into <host name='' port=''/>. */
static void sb_host(pv_buf *b, const char *hp) {
    char host[256];
    snprintf(host, sizeof host, "%s", hp);
    char *colon = host[0] != '[' ? strrchr(host, ':') : NULL;
    if (colon) {
        *colon = '\0';
        pv_buf_addf(b, "<host name='%s' port='%s'/>", host, colon + 1);
    } else {
        pv_buf_addf(b, "<host name='%s'/>", host);
    }
}

int pv_storage_pool_xml(const char *name, const char *uuid, int type, json_t *config, char **xml,
                        pv_status *st) {
    *xml = NULL;
    if (pv_storage_check_name("name", name, st) != PV_OK ||
        pv_storage_check_pool(type, config, st) != PV_OK)
        return st->code;
    static const char *const kinds[] = {"", "dir", "logical", "iscsi", "netfs", "rbd"};
    pv_buf b = {0};
    pv_buf_addf(&b, "<pool type='%s'><name>%s</name>", kinds[type], name);
    if (uuid && is_uuid(uuid)) pv_buf_addf(&b, "<uuid>%s</uuid>", uuid);
    char list[PV_PATH_MAX + 1];
    switch (type) {
    case PV_POOL_DIR:
        pv_buf_addf(&b, "<target><path>%s</path></target>", cfg(config, "path"));
        break;
    case PV_POOL_LVM:
        pv_buf_addf(&b, "<source><name>%s</name>", cfg(config, "volume_group"));
        snprintf(list, sizeof list, "%s", cfg(config, "devices"));
        for (char *save = NULL, *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save))
            pv_buf_addf(&b, "<device path='%s'/>", d);
        pv_buf_addf(&b, "<format type='lvm2'/></source><target><path>/dev/%s</path></target>",
                    cfg(config, "volume_group"));
        break;
    case PV_POOL_NFS:
        pv_buf_addf(&b, "<source>");
        sb_host(&b, cfg(config, "server"));
        pv_buf_addf(&b, "<dir path='%s'/><format type='nfs'/></source>", cfg(config, "export"));
        pv_buf_addf(&b, "<target><path>%s</path></target>", cfg(config, "path"));
        break;
    case PV_POOL_ISCSI:
        pv_buf_addf(&b, "<source>");
        sb_host(&b, cfg(config, "portal"));
        pv_buf_addf(&b, "<device path='%s'/>", cfg(config, "target"));
        if (*cfg(config, "chap_username"))
            pv_buf_addf(&b, "<auth type='chap' username='%s'><secret usage='%s'/></auth>",
                        cfg(config, "chap_username"), cfg(config, "chap_secret"));
        pv_buf_addf(&b, "</source><target><path>/dev/disk/by-path</path></target>");
        break;
    case PV_POOL_RBD:
        pv_buf_addf(&b, "<source><name>%s</name>", cfg(config, "pool"));
        snprintf(list, sizeof list, "%s", cfg(config, "monitors"));
        for (char *save = NULL, *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save))
            sb_host(&b, m);
        pv_buf_addf(&b, "<auth type='ceph' username='%s'><secret uuid='%s'/></auth></source>",
                    cfg(config, "user"), cfg(config, "secret_uuid"));
        break;
    }
    pv_buf_addf(&b, "</pool>");
    if (b.oom) {
        pv_buf_free(&b);
        return pv_status_set(st, PV_INTERNAL, "pool XML: out of memory");
    }
    *xml = b.s;
    return PV_OK;
}

const char *pv_storage_format_name(int format) {
    switch (format) {
    case PV_VOL_RAW:
        return "raw";
    case PV_VOL_QCOW2:
        return "qcow2";
    case PV_VOL_VMDK:
        return "vmdk";
    case PV_VOL_VDI:
        return "vdi";
    }
    return NULL;
}

/* ---- snapshots of each pool type ---- */

int pv_storage_snapshot_method(int pool_type, int format) {
    if (pool_type == PV_POOL_LVM) return PV_SNAPS_LVM;
    if (pool_type == PV_POOL_RBD) return PV_SNAPS_RBD;
    return format == PV_VOL_QCOW2 ? PV_SNAPS_QCOW2 : PV_SNAPS_NONE;
}

void pv_argv_clear(pv_argv *a) {
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    memset(a, 0, sizeof *a);
}

static void argv_add(pv_argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void argv_add(pv_argv *a, const char *fmt, ...) {
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    /* the builders below stay well under PV_ARGV_MAX: reaching it is a bug, reported as such */
    if (a->n >= PV_ARGV_MAX || vasprintf(&s, fmt, ap) < 0) {
        s = NULL;
        a->failed = true;
    }
    va_end(ap);
    if (s) a->v[a->n++] = s;
}

/* A value that goes into a command line as (part of) one argument: a plain name, so that it
 * can neither be read as an option nor name another volume group, pool or device. */
static int arg_name(const char *what, const char *v, pv_status *st) {
    if (pv_storage_check_name(what, v, st) == PV_OK) return PV_OK;
    return pv_status_set(st, PV_FAILED_PRECONDITION,
                         "%s: \"%.64s\" cannot go into a snapshot command (not a plain name)", what,
                         v ? v : "");
}

int pv_storage_snapshot_argv(int what, const pv_pool *pool, const pv_volume *vol,
                             const char *snap_id, pv_argv *out, pv_status *st) {
    memset(out, 0, sizeof *out);
    json_t *config = pool->config;
    int type = pool->type;
    const char *image = vol->name ? vol->name : "";
    if (what < PV_SNAP_CREATE || what > PV_SNAP_DELETE)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "snapshot command %d: unknown", what);
    if (arg_name("volume", image, st) != PV_OK || arg_name("snapshot", snap_id, st) != PV_OK)
        return st->code;
    if (type == PV_POOL_LVM) {
        const char *vg = pv_json_str_or(config, "volume_group", "");
        if (arg_name("config.volume_group", vg, st) != PV_OK) return st->code;
        if (what == PV_SNAP_CREATE) {
            /* a thick (copy-on-write) snapshot: its space is a share of its origin's; at 100%
             * it holds a complete rewrite of the origin */
            argv_add(out, "/sbin/lvcreate");
            argv_add(out, "--snapshot");
            argv_add(out, "--name");
            argv_add(out, "%s", snap_id);
            argv_add(out, "--extents");
            argv_add(out, "%s%%ORIGIN", pv_json_str_or(config, "snapshot_percent", "100"));
            argv_add(out, "%s/%s", vg, image);
        } else if (what == PV_SNAP_RESTORE) {
            /* the snapshot's blocks copied over its origin, not `lvconvert --merge`: a merge
             * consumes the snapshot it merges (and waits for the origin to be closed), while
             * writing the origin keeps every snapshot whole: each one copies the blocks about
             * to change into its own space first, the one read from included */
            argv_add(out, "/bin/dd");
            argv_add(out, "if=/dev/%s/%s", vg, snap_id);
            argv_add(out, "of=/dev/%s/%s", vg, image);
            argv_add(out, "bs=4M");
            argv_add(out, "conv=fsync");
            argv_add(out, "status=none");
        } else {
            argv_add(out, "/sbin/lvremove");
            argv_add(out, "--yes");
            argv_add(out, "%s/%s", vg, snap_id);
        }
    } else if (type == PV_POOL_RBD) {
        const char *rpool = pv_json_str_or(config, "pool", ""),
                   *user = pv_json_str_or(config, "user", "");
        const char *mons = pv_json_str_or(config, "monitors", "");
        if (arg_name("config.pool", rpool, st) != PV_OK ||
            arg_name("config.user", user, st) != PV_OK)
            return st->code;
        if (!*mons || mons[0] == '-')
            return pv_status_set(st, PV_FAILED_PRECONDITION,
                                 "config.monitors: \"%.64s\" cannot go into a snapshot command",
                                 mons);
        static const char *const verbs[] = {"", "create", "rollback", "rm"};
        argv_add(out, "/usr/bin/rbd");
        argv_add(out, "--id");
        argv_add(out, "%s", user);
        argv_add(out, "-m");
        argv_add(out, "%s", mons);
        argv_add(out, "--no-progress");
        argv_add(out, "snap");
        argv_add(out, "%s", verbs[what]);
        argv_add(out, "%s/%s@%s", rpool, image, snap_id);
    } else {
        return pv_status_set(st, PV_FAILED_PRECONDITION,
                             "pool type %d takes no snapshot commands (qcow2 volumes use qemu-img)",
                             type);
    }
    if (out->failed) {
        pv_argv_clear(out);
        return pv_status_set(st, PV_INTERNAL, "snapshot command: out of memory or too long");
    }
    out->v[out->n] = NULL;
    return PV_OK;
}

bool pv_storage_snapshot_done_before(int method, int what, const char *output) {
    if (!output) return false;
    if (method == PV_SNAPS_QCOW2) /* qemu-img snapshot -d */
        return what == PV_SNAP_DELETE && strstr(output, "snapshot not found");
    if (method == PV_SNAPS_LVM)
        return (what == PV_SNAP_CREATE && strstr(output, "already exists")) ||
               (what == PV_SNAP_DELETE && strstr(output, "Failed to find logical volume"));
    if (method == PV_SNAPS_RBD)
        return (what == PV_SNAP_CREATE && strstr(output, "(17) File exists")) ||
               (what == PV_SNAP_DELETE && strstr(output, "(2) No such file or directory"));
    return false;
}

/* ---- records ---- */

#define STR(T, f)                                                                                  \
    { .name = #f, .type = PV_FIELD_STR, .off = offsetof(T, f) }
#define OPT_STR(T, f)                                                                              \
    { .name = #f, .type = PV_FIELD_STR, .off = offsetof(T, f), .optional = true }
#define INT(T, f)                                                                                  \
    { .name = #f, .type = PV_FIELD_INT, .off = offsetof(T, f) }
#define I64(T, f)                                                                                  \
    { .name = #f, .type = PV_FIELD_I64, .off = offsetof(T, f) }
#define JSON(T, f)                                                                                 \
    { .name = #f, .type = PV_FIELD_JSON, .off = offsetof(T, f) }

static const pv_field k_pool_fields[] = {
    STR(pv_pool, name),
    INT(pv_pool, type),
    INT(pv_pool, status),
    JSON(pv_pool, config),
    STR(pv_pool, node),
    I64(pv_pool, capacity),
    I64(pv_pool, used),
    I64(pv_pool, available),
    I64(pv_pool, created_ms),
    I64(pv_pool, updated_ms),
    OPT_STR(pv_pool, libvirt_uuid),
};

static const pv_field k_volume_fields[] = {
    STR(pv_volume, id),
    STR(pv_volume, name),
    STR(pv_volume, pool),
    I64(pv_volume, size),
    I64(pv_volume, used),
    INT(pv_volume, format),
    INT(pv_volume, status),
    JSON(pv_volume, labels),
    STR(pv_volume, current_snapshot),
    I64(pv_volume, created_ms),
    I64(pv_volume, updated_ms),
    OPT_STR(pv_volume, path),
    {.name = "imported",
     .type = PV_FIELD_BOOL,
     .off = offsetof(pv_volume, imported),
     .optional = true},
    OPT_STR(pv_volume, cloned_from),
    OPT_STR(pv_volume, in_use_by),
    OPT_STR(pv_volume, restoring),
    OPT_STR(pv_volume, restore_op),
};

static const pv_field k_snapshot_fields[] = {
    STR(pv_snapshot, id),         STR(pv_snapshot, name),       STR(pv_snapshot, volume_id),
    I64(pv_snapshot, size),       INT(pv_snapshot, status),     STR(pv_snapshot, parent),
    I64(pv_snapshot, created_ms), I64(pv_snapshot, updated_ms),
};

#define SCHEMA(what_, T, table)                                                                    \
    {                                                                                              \
        .what = what_, .fields = table, .nfields = PV_RECORD_NFIELDS(table), .size = sizeof(T),    \
        .extra_off = offsetof(T, extra)                                                            \
    }

const pv_record_schema pv_pool_schema = SCHEMA("pool", pv_pool, k_pool_fields);
const pv_record_schema pv_volume_schema = SCHEMA("volume", pv_volume, k_volume_fields);
const pv_record_schema pv_snapshot_schema = SCHEMA("snapshot", pv_snapshot, k_snapshot_fields);

/* What the code below needs of a kind: its schema, its key, its index (pools, pool-vols:<pool>,
 * vol-snaps:<volume>) and where its id and its owner in that index live in the struct. */
typedef struct sto_kind {
    const pv_record_schema *schema;
    pv_key_kind key, index;
    size_t id_off, owner_off, name_off, created_off, updated_off;
    bool has_owner;
} sto_kind;

static const sto_kind k_kinds[] = {
    [PV_STO_POOL] = {&pv_pool_schema, PV_KEY_POOL, PV_KEY_POOLS, offsetof(pv_pool, name), 0,
                     offsetof(pv_pool, name), offsetof(pv_pool, created_ms),
                     offsetof(pv_pool, updated_ms), false},
    [PV_STO_VOL] = {&pv_volume_schema, PV_KEY_VOL, PV_KEY_POOL_VOLS, offsetof(pv_volume, id),
                    offsetof(pv_volume, pool), offsetof(pv_volume, name),
                    offsetof(pv_volume, created_ms), offsetof(pv_volume, updated_ms), true},
    [PV_STO_SNAP] = {&pv_snapshot_schema, PV_KEY_SNAP, PV_KEY_VOL_SNAPS, offsetof(pv_snapshot, id),
                     offsetof(pv_snapshot, volume_id), offsetof(pv_snapshot, name),
                     offsetof(pv_snapshot, created_ms), offsetof(pv_snapshot, updated_ms), true},
};

static const sto_kind *kind_of(pv_sto_kind kind) {
    return &k_kinds[kind <= PV_STO_SNAP ? kind : PV_STO_POOL];
}

static const char *str_at(const void *rec, size_t off) {
    return *(char *const *)((const char *)rec + off);
}

static int64_t *i64_at(void *rec, size_t off) {
    return (int64_t *)((char *)rec + off);
}

void pv_storage_free(pv_sto_kind kind, void *rec) {
    pv_record_free(kind_of(kind)->schema, rec);
}

void pv_storage_array_free(pv_sto_kind kind, void *recs, size_t n) {
    pv_record_array_free(kind_of(kind)->schema, recs, n);
}

char *pv_storage_dumps(pv_sto_kind kind, const void *rec) {
    json_t *doc = pv_record_encode_json(kind_of(kind)->schema, rec);
    char *text = doc ? json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    return text;
}

/* A key whose name came from a record or a checked request, into buf (PV_KEY_MAX * 2 bytes:
 * room for any plain name). */
static int sto_key(const pv_keys *k, pv_key_kind kind, const char *name, char *buf, pv_status *st) {
    return pv_key(k, kind, name, buf, 2 * PV_KEY_MAX, st);
}

int pv_storage_get(pv_redis *r, const pv_keys *k, pv_sto_kind kind, const char *id, void *rec,
                   pv_status *st) {
    const sto_kind *sk = kind_of(kind);
    memset(rec, 0, sk->schema->size);
    const char *what = sk->schema->what;
    if (!id || !*id) return pv_status_set(st, PV_NOT_FOUND, "%s \"\" not found", what);
    char key[2 * PV_KEY_MAX];
    if (sto_key(k, sk->key, id, key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "GET %s", key) != PV_OK) return st->code;
    int rc = PV_OK;
    json_t *doc = NULL;
    if (rep->type != REDIS_REPLY_STRING)
        rc = pv_status_set(st, PV_NOT_FOUND, "%s %.128s not found", what, id);
    else if (!(doc = json_loads(rep->str, 0, NULL)))
        rc = pv_status_set(st, PV_DATA_LOSS, "%s record %s: not JSON", what, key);
    else
        rc = pv_record_decode_json(sk->schema, key, doc, rec, st);
    json_decref(doc);
    freeReplyObject(rep);
    return rc;
}

/* The commands of one MULTI/EXEC, their replies dropped; the first failure stays in rc. */
typedef struct multi {
    pv_redis *r;
    pv_status *st;
    int rc;
} multi;

#define MULTI_RUN(m, ...)                                                                          \
    multi_run(m, sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *),                     \
              (const char *[]){__VA_ARGS__})

static void multi_run(multi *m, int argc, const char **argv) {
    if (m->rc != PV_OK) return;
    redisReply *rep = NULL;
    m->rc = pv_redis_commandv(m->r, &rep, m->st, argc, argv, NULL);
    if (rep) freeReplyObject(rep);
}

int pv_storage_put(pv_redis *r, const pv_keys *k, pv_sto_kind kind, void *rec, pv_status *st) {
    const sto_kind *sk = kind_of(kind);
    const char *id = str_at(rec, sk->id_off);
    if (!id || !*id)
        return pv_status_set(st, PV_INTERNAL, "%s record without id", sk->schema->what);
    *i64_at(rec, sk->updated_off) = pv_time_now_ms();
    char key[PV_KEY_MAX * 2], index[PV_KEY_MAX * 2];
    if (sto_key(k, sk->key, id, key, st) != PV_OK ||
        sto_key(k, sk->index, sk->has_owner ? str_at(rec, sk->owner_off) : NULL, index, st) !=
            PV_OK)
        return st->code;
    char *text = pv_storage_dumps(kind, rec);
    if (!text) return pv_status_set(st, PV_INTERNAL, "out of memory");
    double score = kind == PV_STO_SNAP ? (double)*i64_at(rec, sk->created_off) : 0;
    char sc[32];
    snprintf(sc, sizeof sc, "%.0f", score);
    multi m = {r, st, PV_OK};
    MULTI_RUN(&m, "MULTI");
    MULTI_RUN(&m, "SET", key, text);
    MULTI_RUN(&m, "ZADD", index, sc, id);
    redisReply *rep = NULL;
    if (m.rc == PV_OK) m.rc = pv_redis_command(r, &rep, st, "EXEC");
    if (m.rc == PV_OK && rep->type != REDIS_REPLY_ARRAY)
        m.rc = pv_status_set(st, PV_UNAVAILABLE, "%s %s: not written", sk->schema->what, id);
    if (rep) freeReplyObject(rep);
    free(text);
    return m.rc;
}

int pv_storage_del(pv_redis *r, const pv_keys *k, pv_sto_kind kind, const void *rec,
                   pv_status *st) {
    const sto_kind *sk = kind_of(kind);
    const char *id = str_at(rec, sk->id_off);
    if (!id || !*id) return PV_OK;
    const char *name = str_at(rec, sk->name_off);
    const char *owner = sk->has_owner ? str_at(rec, sk->owner_off) : NULL;
    char key[PV_KEY_MAX * 2], index[PV_KEY_MAX * 2], names[PV_KEY_MAX * 2], snaps[PV_KEY_MAX * 2];
    if (sto_key(k, sk->key, id, key, st) != PV_OK ||
        sto_key(k, sk->index, owner, index, st) != PV_OK ||
        sto_key(k, PV_KEY_POOL_NAMES, kind == PV_STO_POOL ? id : owner, names, st) != PV_OK ||
        sto_key(k, PV_KEY_VOL_SNAPS, id, snaps, st) != PV_OK)
        return st->code;
    multi m = {r, st, PV_OK};
    MULTI_RUN(&m, "MULTI");
    MULTI_RUN(&m, "DEL", key);
    MULTI_RUN(&m, "ZREM", index, id);
    if (kind == PV_STO_POOL) {
        MULTI_RUN(&m, "DEL", names);
    } else if (kind == PV_STO_VOL) {
        MULTI_RUN(&m, "HDEL", names, name ? name : "");
        MULTI_RUN(&m, "DEL", snaps);
    }
    MULTI_RUN(&m, "EXEC");
    return m.rc;
}

int pv_storage_claim_name(pv_redis *r, const pv_keys *k, const char *pool, const char *name,
                          const char *id, pv_status *st) {
    char names[PV_KEY_MAX * 2];
    if (sto_key(k, PV_KEY_POOL_NAMES, pool, names, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HSETNX %s %s %s", names, name, id) != PV_OK) return st->code;
    freeReplyObject(rep);
    if (pv_redis_command(r, &rep, st, "HGET %s %s", names, name) != PV_OK) return st->code;
    int rc = rep->type == REDIS_REPLY_STRING && strcmp(rep->str, id) == 0
                 ? PV_OK
                 : pv_status_set(st, PV_ALREADY_EXISTS,
                                 "name: pool %s already has a volume named %s", pool, name);
    freeReplyObject(rep);
    return rc;
}

int pv_storage_claimed_names(pv_redis *r, const pv_keys *k, const char *pool, json_t **names,
                             pv_status *st) {
    *names = NULL;
    char key[PV_KEY_MAX * 2];
    if (sto_key(k, PV_KEY_POOL_NAMES, pool, key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HGETALL %s", key) != PV_OK) return st->code;
    json_t *o = json_object();
    for (size_t i = 0; o && rep->type == REDIS_REPLY_ARRAY && i + 1 < rep->elements; i += 2)
        if (rep->element[i]->str && rep->element[i + 1]->str)
            json_object_set_new(o, rep->element[i]->str, json_string(rep->element[i + 1]->str));
    freeReplyObject(rep);
    if (!o) return pv_status_set(st, PV_INTERNAL, "out of memory");
    *names = o;
    return PV_OK;
}

int pv_storage_release_name(pv_redis *r, const pv_keys *k, const char *pool, const char *name,
                            pv_status *st) {
    char key[PV_KEY_MAX * 2];
    if (sto_key(k, PV_KEY_POOL_NAMES, pool, key, st) != PV_OK) return st->code;
    redisReply *rep = NULL;
    if (pv_redis_command(r, &rep, st, "HDEL %s %s", key, name) != PV_OK) return st->code;
    freeReplyObject(rep);
    return PV_OK;
}

int pv_storage_list(pv_redis *r, const pv_keys *k, pv_sto_kind kind, const char *owner, void **recs,
                    size_t *n, pv_status *st) {
    const sto_kind *sk = kind_of(kind);
    *recs = NULL;
    *n = 0;
    redisReply *rep = NULL;
    char index[PV_KEY_MAX * 2];
    int rc = sto_key(k, sk->index, owner, index, st);
    if (rc == PV_OK) rc = pv_redis_command(r, &rep, st, "ZRANGE %s 0 -1", index);
    size_t cap = rc == PV_OK && rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
    char *out = cap ? calloc(cap, sk->schema->size) : NULL;
    if (cap && !out) rc = pv_status_set(st, PV_INTERNAL, "out of memory");
    for (size_t i = 0; rc == PV_OK && i < cap; i++) {
        int grc = pv_storage_get(r, k, kind, rep->element[i]->str, out + *n * sk->schema->size, st);
        if (grc == PV_OK)
            (*n)++;
        else if (grc != PV_NOT_FOUND) /* NOT_FOUND: removed meanwhile */
            rc = grc;
    }
    if (rep) freeReplyObject(rep);
    if (rc != PV_OK) {
        pv_storage_array_free(kind, out, *n);
        *n = 0;
        return rc;
    }
    if (*n)
        *recs = out;
    else
        free(out);
    return PV_OK;
}

int pv_storage_find_volume(pv_redis *r, const pv_keys *k, const char *ref, pv_volume *out,
                           pv_status *st) {
    int rc = pv_storage_get(r, k, PV_STO_VOL, ref, out, st);
    if (rc != PV_NOT_FOUND) return rc;
    char key[PV_KEY_MAX * 2];
    if (sto_key(k, PV_KEY_POOLS, NULL, key, st) != PV_OK) return st->code;
    redisReply *pools = NULL;
    if (pv_redis_command(r, &pools, st, "ZRANGE %s 0 -1", key) != PV_OK) return st->code;
    char found[PV_KEY_MAX] = "";
    size_t hits = 0;
    for (size_t i = 0; rc == PV_NOT_FOUND && i < pools->elements; i++) {
        redisReply *id = NULL;
        if (sto_key(k, PV_KEY_POOL_NAMES, pools->element[i]->str, key, st) != PV_OK ||
            pv_redis_command(r, &id, st, "HGET %s %s", key, ref) != PV_OK) {
            rc = st->code;
            break;
        }
        if (id->type == REDIS_REPLY_STRING) {
            hits++;
            snprintf(found, sizeof found, "%s", id->str);
        }
        freeReplyObject(id);
    }
    freeReplyObject(pools);
    if (rc != PV_NOT_FOUND) return rc;
    if (hits > 1)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "id: %zu pools hold a volume named %.128s: give its id", hits, ref);
    if (hits == 1) return pv_storage_get(r, k, PV_STO_VOL, found, out, st);
    return pv_status_set(st, PV_NOT_FOUND, "volume %.128s not found", ref);
}

static int set_str(char **slot, const char *v, pv_status *st) {
    if (pv_record_set_str(slot, v) != 0) return pv_status_set(st, PV_INTERNAL, "out of memory");
    return PV_OK;
}

int pv_storage_attach(pv_redis *r, const pv_keys *k, const char *vol_id, const char *wl_id,
                      pv_status *st) {
    pv_volume vol;
    if (pv_storage_get(r, k, PV_STO_VOL, vol_id, &vol, st) != PV_OK) return st->code;
    if (vol.restoring && *vol.restoring) { /* its data may be the old snapshot's or the new one's */
        pv_status_set(st, PV_FAILED_PRECONDITION,
                      "volume %s: a restore to snapshot %s is running or did not finish (its "
                      "data may be either snapshot's): wait for it, or restore a snapshot",
                      vol.name, vol.restoring);
        pv_storage_free(PV_STO_VOL, &vol);
        return st->code;
    }
    redisReply *rep = NULL;
    char user[PV_KEY_MAX * 2], vols[PV_KEY_MAX * 2];
    int rc = sto_key(k, PV_KEY_VOL_USER, vol_id, user, st);
    if (rc == PV_OK) rc = sto_key(k, PV_KEY_WL_VOLS, wl_id, vols, st);
    if (rc == PV_OK) rc = pv_redis_command(r, &rep, st, "SET %s %s NX", user, wl_id);
    if (rep) freeReplyObject(rep);
    rep = NULL;
    if (rc == PV_OK) rc = pv_redis_command(r, &rep, st, "GET %s", user);
    if (rc == PV_OK && (rep->type != REDIS_REPLY_STRING || strcmp(rep->str, wl_id) != 0))
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "volume %s is in use by workload %.64s",
                           vol.name, rep->type == REDIS_REPLY_STRING ? rep->str : "?");
    if (rep) freeReplyObject(rep);
    rep = NULL;
    if (rc == PV_OK) {
        vol.status = PV_VOL_IN_USE;
        rc = set_str(&vol.in_use_by, wl_id, st);
    }
    if (rc == PV_OK) rc = pv_storage_put(r, k, PV_STO_VOL, &vol, st);
    if (rc == PV_OK) rc = pv_redis_command(r, &rep, st, "SADD %s %s", vols, vol_id);
    if (rep) freeReplyObject(rep);
    pv_storage_free(PV_STO_VOL, &vol);
    return rc;
}

int pv_storage_detach_all(pv_redis *r, const pv_keys *k, const char *wl_id, pv_status *st) {
    char vols[PV_KEY_MAX * 2], user[PV_KEY_MAX * 2];
    if (sto_key(k, PV_KEY_WL_VOLS, wl_id, vols, st) != PV_OK) return st->code;
    redisReply *ids = NULL;
    if (pv_redis_command(r, &ids, st, "SMEMBERS %s", vols) != PV_OK) return st->code;
    int rc = PV_OK;
    for (size_t i = 0; rc == PV_OK && i < ids->elements; i++) {
        const char *vid = ids->element[i]->str;
        pv_volume vol;
        int grc = pv_storage_get(r, k, PV_STO_VOL, vid, &vol, st);
        if (grc == PV_OK && strcmp(vol.in_use_by ? vol.in_use_by : "", wl_id) == 0) {
            vol.status = PV_VOL_READY;
            set_str(&vol.in_use_by, NULL, st);
            rc = pv_storage_put(r, k, PV_STO_VOL, &vol, st);
        } else if (grc != PV_OK && grc != PV_NOT_FOUND) {
            rc = grc;
        }
        pv_storage_free(PV_STO_VOL, &vol);
        redisReply *rep = NULL;
        if (rc == PV_OK) rc = sto_key(k, PV_KEY_VOL_USER, vid, user, st);
        if (rc == PV_OK && pv_redis_command(r, &rep, st, "EVAL %s 1 %s %s",
                                            "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                            "return redis.call('DEL', KEYS[1]) end return 0",
                                            user, wl_id) != PV_OK)
            rc = st->code;
        if (rep) freeReplyObject(rep);
    }
    /* an empty set is no key: nothing to delete (a workload without volumes, most of them) */
    bool any = ids->elements > 0;
    freeReplyObject(ids);
    redisReply *rep = NULL;
    if (rc == PV_OK && any) rc = pv_redis_command(r, &rep, st, "DEL %s", vols);
    if (rep) freeReplyObject(rep);
    return rc;
}
