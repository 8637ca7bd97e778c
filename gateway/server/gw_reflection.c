/*
 * gw_reflection: server reflection over the embedded descriptor set.
 *
 * At start the FileDescriptorSet is unpacked once and indexed: every file by name, and every
 * symbol a client may ask for (messages and enums with their nested types, services, methods)
 * by fully qualified name, sorted for binary search. A file is answered with its transitive
 * imports, each file sent at most once per stream except the one asked for, as grpc-go does, so
 * a client can build its descriptor pool from the answers alone.
 *
 * v1 and v1alpha are the same messages on the wire under two package names: one set of
 * protobuf-c types serves both.
 */
#include "gw_reflection.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "pv_status.h"

typedef Google__Protobuf__FileDescriptorProto file_proto;
typedef Google__Protobuf__DescriptorProto msg_proto;
typedef Grpc__Reflection__V1alpha__ServerReflectionRequest refl_request;
typedef Grpc__Reflection__V1alpha__ServerReflectionResponse refl_response;

typedef struct refl_file {
    const char *name;
    file_proto *fd;
    ProtobufCBinaryData raw; /* the file re-serialized: what clients receive */
    size_t *deps;            /* indices of imported files */
    size_t n_deps;
} refl_file;

typedef struct refl_symbol {
    char *name;
    size_t file;
} refl_symbol;

struct gw_reflection {
    Google__Protobuf__FileDescriptorSet *set;
    refl_file *files;
    size_t n_files;
    refl_symbol *symbols;
    size_t n_symbols, cap_symbols;
    char **services;
    size_t n_services;
    char **methods; /* "/pkg.Service/Method", sorted */
    size_t n_methods;
    gw_method m_v1, m_v1alpha;
};

/* Per-stream state: which files this client already has. */
typedef struct refl_stream {
    gw_reflection *r;
    unsigned char *sent;
} refl_stream;

static int cmp_symbol(const void *a, const void *b) {
    return strcmp(((const refl_symbol *)a)->name, ((const refl_symbol *)b)->name);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static char *qualify(const char *scope, const char *name) {
    size_t n = strlen(scope) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s", scope, *scope ? "." : "", name);
    return s;
}

static int add_symbol(gw_reflection *r, char *name, size_t file) {
    if (!name) return -1;
    if (r->n_symbols == r->cap_symbols) {
        size_t cap = r->cap_symbols ? r->cap_symbols * 2 : 256;
        refl_symbol *ns = realloc(r->symbols, cap * sizeof *ns);
        if (!ns) {
            free(name);
            return -1;
        }
        r->symbols = ns;
        r->cap_symbols = cap;
    }
    r->symbols[r->n_symbols++] = (refl_symbol){name, file};
    return 0;
}

static int index_message(gw_reflection *r, const char *scope, const msg_proto *m, size_t file) {
    char *full = qualify(scope, m->name);
    if (!full) return -1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < m->n_nested_type; i++)
        rc = index_message(r, full, m->nested_type[i], file);
    for (size_t i = 0; rc == 0 && i < m->n_enum_type; i++)
        rc = add_symbol(r, qualify(full, m->enum_type[i]->name), file);
    if (rc == 0) return add_symbol(r, full, file);
    free(full);
    return rc;
}

static int add_string(char ***arr, size_t *n, char *s) {
    if (!s) return -1;
    char **na = realloc(*arr, (*n + 1) * sizeof *na);
    if (!na) {
        free(s);
        return -1;
    }
    na[(*n)++] = s;
    *arr = na;
    return 0;
}

static int index_service(gw_reflection *r, const char *pkg,
                         const Google__Protobuf__ServiceDescriptorProto *sv, size_t file) {
    char *full = qualify(pkg, sv->name);
    if (!full || add_string(&r->services, &r->n_services, strdup(full)) != 0) {
        free(full);
        return -1;
    }
    for (size_t i = 0; i < sv->n_method; i++) {
        if (add_symbol(r, qualify(full, sv->method[i]->name), file) != 0) {
            free(full);
            return -1;
        }
        size_t n = strlen(full) + strlen(sv->method[i]->name) + 3;
        char *path = malloc(n);
        if (path) snprintf(path, n, "/%s/%s", full, sv->method[i]->name);
        if (add_string(&r->methods, &r->n_methods, path) != 0) {
            free(full);
            return -1;
        }
    }
    return add_symbol(r, full, file);
}

static long find_file(const gw_reflection *r, const char *name) {
    for (size_t i = 0; i < r->n_files; i++)
        if (strcmp(r->files[i].name, name) == 0) return (long)i;
    return -1;
}

static int index_file(gw_reflection *r, size_t i) {
    refl_file *f = &r->files[i];
    file_proto *fd = f->fd;
    const char *pkg = fd->package ? fd->package : "";
    f->raw.len = google__protobuf__file_descriptor_proto__get_packed_size(fd);
    f->raw.data = malloc(f->raw.len ? f->raw.len : 1);
    if (!f->raw.data) return -1;
    google__protobuf__file_descriptor_proto__pack(fd, f->raw.data);
    f->deps = calloc(fd->n_dependency ? fd->n_dependency : 1, sizeof *f->deps);
    if (!f->deps) return -1;
    for (size_t d = 0; d < fd->n_dependency; d++) {
        long k = find_file(r, fd->dependency[d]);
        if (k >= 0) f->deps[f->n_deps++] = (size_t)k;
    }
    for (size_t j = 0; j < fd->n_message_type; j++)
        if (index_message(r, pkg, fd->message_type[j], i) != 0) return -1;
    for (size_t j = 0; j < fd->n_enum_type; j++)
        if (add_symbol(r, qualify(pkg, fd->enum_type[j]->name), i) != 0) return -1;
    for (size_t j = 0; j < fd->n_service; j++)
        if (index_service(r, pkg, fd->service[j], i) != 0) return -1;
    return 0;
}

gw_reflection *gw_reflection_new(const unsigned char *desc, size_t len, char *err, size_t errlen) {
    gw_reflection *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->set = google__protobuf__file_descriptor_set__unpack(NULL, len, desc);
    if (!r->set) {
        snprintf(err, errlen, "the embedded descriptor set (%zu bytes) does not decode", len);
        gw_reflection_free(r);
        return NULL;
    }
    r->n_files = r->set->n_file;
    r->files = calloc(r->n_files ? r->n_files : 1, sizeof *r->files);
    if (!r->files) goto oom;
    for (size_t i = 0; i < r->n_files; i++) {
        r->files[i].fd = r->set->file[i];
        r->files[i].name = r->set->file[i]->name;
    }
    for (size_t i = 0; i < r->n_files; i++)
        if (index_file(r, i) != 0) goto oom;
    qsort(r->symbols, r->n_symbols, sizeof *r->symbols, cmp_symbol);
    qsort(r->methods, r->n_methods, sizeof *r->methods, cmp_str);
    return r;
oom:
    snprintf(err, errlen, "out of memory indexing the descriptor set");
    gw_reflection_free(r);
    return NULL;
}

void gw_reflection_free(gw_reflection *r) {
    if (!r) return;
    for (size_t i = 0; r->files && i < r->n_files; i++) {
        free(r->files[i].raw.data);
        free(r->files[i].deps);
    }
    free(r->files);
    for (size_t i = 0; i < r->n_symbols; i++)
        free(r->symbols[i].name);
    free(r->symbols);
    for (size_t i = 0; i < r->n_services; i++)
        free(r->services[i]);
    free(r->services);
    for (size_t i = 0; i < r->n_methods; i++)
        free(r->methods[i]);
    free(r->methods);
    if (r->set) google__protobuf__file_descriptor_set__free_unpacked(r->set, NULL);
    free(r);
}

size_t gw_reflection_service_count(const gw_reflection *r) {
    return r->n_services;
}

const char *gw_reflection_service(const gw_reflection *r, size_t i) {
    return i < r->n_services ? r->services[i] : NULL;
}

int gw_reflection_has_method(const gw_reflection *r, const char *path) {
    return bsearch(&path, r->methods, r->n_methods, sizeof *r->methods, cmp_str) != NULL;
}

static long find_symbol(const gw_reflection *r, const char *name) {
    refl_symbol key = {(char *)name, 0};
    const refl_symbol *s = bsearch(&key, r->symbols, r->n_symbols, sizeof key, cmp_symbol);
    return s ? (long)s->file : -1;
}

/* ---------------------------------------------------------------------------------------- */
/* the stream                                                                                 */

/* Collects file i and its imports (breadth first) into out; the asked-for file always, the
 * imports only when this stream has not had them yet. */
static size_t collect_files(refl_stream *st, size_t i, ProtobufCBinaryData *out) {
    gw_reflection *r = st->r;
    size_t *queue = malloc(r->n_files * sizeof *queue);
    unsigned char *queued = calloc(r->n_files, 1);
    size_t n_out = 0, head = 0, tail = 0;
    if (!queue || !queued) goto out; /* nothing collected: the caller answers without */
    queue[tail++] = i;
    queued[i] = 1;
    while (head < tail) {
        size_t f = queue[head++];
        if (n_out == 0 || !st->sent[f]) {
            st->sent[f] = 1;
            out[n_out++] = r->files[f].raw;
        }
        for (size_t d = 0; d < r->files[f].n_deps; d++) {
            size_t dep = r->files[f].deps[d];
            if (!queued[dep]) {
                queued[dep] = 1;
                queue[tail++] = dep;
            }
        }
    }
out:
    free(queue);
    free(queued);
    return n_out;
}

static void answer(gw_call *call, refl_stream *st, const refl_request *req) {
    gw_reflection *r = st->r;
    refl_response resp = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__FileDescriptorResponse fdr =
        GRPC__REFLECTION__V1ALPHA__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ListServiceResponse lsr =
        GRPC__REFLECTION__V1ALPHA__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ErrorResponse er = GRPC__REFLECTION__V1ALPHA__ERROR_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ServiceResponse *svc = NULL, **svcp = NULL;
    ProtobufCBinaryData *files = NULL;
    char msg[300];
    long file = -1;
    int err_code = PV_NOT_FOUND;

    resp.valid_host = req->host;
    resp.original_request = (refl_request *)req;
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        svc = calloc(r->n_services ? r->n_services : 1, sizeof *svc);
        svcp = calloc(r->n_services ? r->n_services : 1, sizeof *svcp);
        if (!svc || !svcp) break;
        for (size_t i = 0; i < r->n_services; i++) {
            grpc__reflection__v1alpha__service_response__init(&svc[i]);
            svc[i].name = r->services[i];
            svcp[i] = &svc[i];
        }
        lsr.n_service = r->n_services;
        lsr.service = svcp;
        resp.message_response_case =
            GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        resp.list_services_response = &lsr;
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        file = find_symbol(r, req->file_containing_symbol);
        snprintf(msg, sizeof msg, "symbol not found: %.200s", req->file_containing_symbol);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        file = find_file(r, req->file_by_filename);
        snprintf(msg, sizeof msg, "file not found: %.200s", req->file_by_filename);
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        /* No file of ours declares extensions: the honest answer is "none found". */
        snprintf(msg, sizeof msg, "no extensions are declared by this server");
        break;
    default:
        err_code = PV_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "empty reflection request");
        break;
    }
    if (file >= 0) {
        files = calloc(r->n_files, sizeof *files);
        if (files) {
            fdr.n_file_descriptor_proto = collect_files(st, (size_t)file, files);
            fdr.file_descriptor_proto = files;
            resp.message_response_case =
                GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
            resp.file_descriptor_response = &fdr;
        }
    }
    if (resp.message_response_case ==
        GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE__NOT_SET) {
        er.error_code = err_code;
        er.error_message = msg;
        resp.message_response_case =
            GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        resp.error_response = &er;
    }
    gw_call_send(call, &resp.base);
    free(files);
    free(svc);
    free(svcp);
}

static void stream_free(void *p) {
    refl_stream *st = p;
    free(st->sent);
    free(st);
}

static void on_reflection_message(gw_call *call, const ProtobufCMessage *msg) {
    if (!msg) {
        gw_call_finish(call, PV_OK, NULL);
        return;
    }
    refl_stream *st = gw_call_user(call);
    if (!st) {
        gw_reflection *r = gw_call_method_data(call);
        st = calloc(1, sizeof *st);
        if (st) st->sent = calloc(r->n_files ? r->n_files : 1, 1);
        if (!st || !st->sent) {
            free(st);
            gw_call_finish(call, PV_RESOURCE_EXHAUSTED, "out of memory");
            return;
        }
        st->r = r;
        gw_call_set_user(call, st, stream_free);
    }
    answer(call, st, (const refl_request *)msg);
}

int gw_reflection_register(gw_reflection *r, gw_server *s, int no_auth) {
    const gw_method base = {
        .kind = GW_BIDI_STREAM,
        .request = &grpc__reflection__v1alpha__server_reflection_request__descriptor,
        .on_message = on_reflection_message,
        .no_auth = no_auth != 0,
        .data = r,
    };
    r->m_v1 = base;
    r->m_v1.path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
    r->m_v1alpha = base;
    r->m_v1alpha.path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
    if (gw_server_add_method(s, &r->m_v1) != 0) return -1;
    return gw_server_add_method(s, &r->m_v1alpha);
}
