/*
 * sched_plan_cli: `pivirt-scheduler plan` (see sched_plan_cli.h).
 *
 * A thin shell around sched_strategy for tests and operators: it validates the request strictly
 * (unknown fields, wrong types, negative numbers and duplicate names are input errors, exit 2, so
 * that a typo like "nodes_limit" never silently plans with defaults), runs the strategy and
 * prints either the plan or Eru's error kind and message. Nodes a strategy does not name are left
 * out of the plan; FILL's deliberate zeros stay in, as Eru returns them.
 */
#include "sched_plan_cli.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched_strategy.h"

typedef struct cli_request {
    const char *strategy_name;
    int strategy;
    int64_t need;
    int64_t limit;
    int64_t total;
    int has_total;
    size_t n;
    sched_node *nodes; /* owned; names borrowed from the parsed document */
} cli_request;

__attribute__((format(printf, 3, 4))) static int bad(char *msg, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, size, fmt, ap);
    va_end(ap);
    return SCHED_CLI_BAD_INPUT;
}

/* Reads an optional non-negative integer member; 0 when absent, -1 (msg set) when invalid. */
static int get_count(const json_t *obj, const char *where, const char *key, int required,
                     int64_t *out, char *msg, size_t size) {
    const json_t *v = json_object_get(obj, key);
    *out = 0;
    if (!v) {
        if (required) {
            bad(msg, size, "%s%s: is required", where, key);
            return -1;
        }
        return 0;
    }
    if (!json_is_integer(v)) {
        bad(msg, size, "%s%s: must be an integer", where, key);
        return -1;
    }
    *out = (int64_t)json_integer_value(v);
    return 0;
}

static int get_nonneg(const json_t *obj, const char *where, const char *key, int required,
                      int64_t *out, char *msg, size_t size) {
    if (get_count(obj, where, key, required, out, msg, size) != 0) return -1;
    if (*out < 0) {
        bad(msg, size, "%s%s: %lld must not be negative", where, key, (long long)*out);
        return -1;
    }
    return 0;
}

static int get_real(const json_t *obj, const char *where, const char *key, double *out, char *msg,
                    size_t size) {
    const json_t *v = json_object_get(obj, key);
    *out = 0;
    if (!v) return 0;
    if (!json_is_number(v)) {
        bad(msg, size, "%s%s: must be a number", where, key);
        return -1;
    }
    *out = json_number_value(v);
    return 0;
}

/* Fails on the first member of obj whose name is not in allowed (NULL-terminated). */
static int only_known(const json_t *obj, const char *where, const char *const *allowed, char *msg,
                      size_t size) {
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        int known = 0;
        for (size_t i = 0; allowed[i] && !known; i++)
            known = strcmp(key, allowed[i]) == 0;
        if (!known) {
            bad(msg, size, "%s%s: unknown field", where, key);
            return -1;
        }
    }
    return 0;
}

static int parse_node(const json_t *o, size_t i, sched_node *node, char *msg, size_t size) {
    static const char *const k_fields[] = {"name", "capacity", "count", "usage", "rate", NULL};
    char where[48];
    snprintf(where, sizeof where, "nodes[%zu].", i);
    if (!json_is_object(o)) {
        bad(msg, size, "nodes[%zu]: must be an object", i);
        return -1;
    }
    if (only_known(o, where, k_fields, msg, size) != 0) return -1;
    const json_t *name = json_object_get(o, "name");
    if (!json_is_string(name) || json_string_length(name) == 0) {
        bad(msg, size, "%sname: must be a non-empty string", where);
        return -1;
    }
    node->name = json_string_value(name);
    if (get_nonneg(o, where, "capacity", 1, &node->capacity, msg, size) != 0 ||
        get_nonneg(o, where, "count", 0, &node->count, msg, size) != 0 ||
        get_real(o, where, "usage", &node->usage, msg, size) != 0 ||
        get_real(o, where, "rate", &node->rate, msg, size) != 0)
        return -1;
    return 0;
}

/* Duplicate names would collide in the plan object; found by sorting pointers to the names. */
static int name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_unique(const sched_node *nodes, size_t n, char *msg, size_t size) {
    if (n < 2) return 0;
    const char **names = malloc(n * sizeof *names);
    if (!names) {
        bad(msg, size, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        names[i] = nodes[i].name;
    qsort(names, n, sizeof *names, name_cmp);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            bad(msg, size, "nodes: name \"%s\" appears twice", names[i]);
            rc = -1;
        }
    }
    free(names);
    return rc;
}

static int parse_request(const json_t *root, cli_request *req, char *msg, size_t size) {
    static const char *const k_fields[] = {"strategy", "need", "limit", "total", "nodes", NULL};
    memset(req, 0, sizeof *req);
    if (!json_is_object(root)) return bad(msg, size, "input: must be a JSON object");
    if (only_known(root, "", k_fields, msg, size) != 0) return SCHED_CLI_BAD_INPUT;
    const json_t *strategy = json_object_get(root, "strategy");
    if (!json_is_string(strategy)) return bad(msg, size, "strategy: must be a string");
    req->strategy_name = json_string_value(strategy);
    req->strategy = sched_strategy_parse(req->strategy_name);
    /* need may be <= 0 here: that is Eru's "invalid deploy count", a plan error, not bad input */
    if (get_count(root, "", "need", 1, &req->need, msg, size) != 0 ||
        get_nonneg(root, "", "limit", 0, &req->limit, msg, size) != 0)
        return SCHED_CLI_BAD_INPUT;
    if (json_object_get(root, "total")) {
        if (get_count(root, "", "total", 0, &req->total, msg, size) != 0)
            return SCHED_CLI_BAD_INPUT;
        req->has_total = 1;
    }
    const json_t *nodes = json_object_get(root, "nodes");
    if (!json_is_array(nodes)) return bad(msg, size, "nodes: must be an array");
    req->n = json_array_size(nodes);
    req->nodes = calloc(req->n ? req->n : 1, sizeof *req->nodes);
    if (!req->nodes) return bad(msg, size, "out of memory");
    for (size_t i = 0; i < req->n; i++)
        if (parse_node(json_array_get(nodes, i), i, &req->nodes[i], msg, size) != 0)
            return SCHED_CLI_BAD_INPUT;
    if (check_unique(req->nodes, req->n, msg, size) != 0) return SCHED_CLI_BAD_INPUT;
    if (!req->has_total) req->total = sched_total(req->nodes, req->n);
    return SCHED_CLI_OK;
}

static json_t *error_json(const char *kind, const char *message) {
    return json_pack("{s:{s:s,s:s}}", "error", "kind", kind, "message", message);
}

static json_t *plan_json(const cli_request *req, const sched_plan *plan) {
    json_t *entries = json_object();
    if (!entries) return NULL;
    for (size_t i = 0; i < plan->n; i++) {
        if (!plan->listed[i]) continue;
        if (json_object_set_new(entries, req->nodes[i].name,
                                json_integer((json_int_t)plan->deploy[i])) != 0) {
            json_decref(entries);
            return NULL;
        }
    }
    return json_pack("{s:o}", "plan", entries);
}

/* Runs the parsed request; returns the answer document and sets *status. */
static json_t *run_request(const cli_request *req, int *status) {
    if (req->strategy < 0) {
        char message[PV_STATUS_MSG_MAX];
        snprintf(message, sizeof message, "strategy: \"%s\": deploy method not support yet",
                 req->strategy_name);
        *status = SCHED_CLI_PLAN_ERROR;
        return error_json(sched_kind_name(SCHED_KIND_INVALID_STRATEGY), message);
    }
    sched_plan plan;
    sched_error err;
    if (sched_plan_make(req->strategy, req->nodes, req->n, req->need, req->total, req->limit, &plan,
                        &err) != PV_OK) {
        *status = SCHED_CLI_PLAN_ERROR;
        return error_json(sched_kind_name(err.kind), err.status.msg);
    }
    *status = SCHED_CLI_OK;
    json_t *doc = plan_json(req, &plan);
    sched_plan_free(&plan);
    return doc;
}

int sched_plan_cli_eval(const char *input, size_t len, char **out, char *msg, size_t msg_size) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(input, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return bad(msg, msg_size, "input: not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    cli_request req;
    int status = parse_request(root, &req, msg, msg_size);
    if (status == SCHED_CLI_OK) {
        json_t *doc = run_request(&req, &status);
        if (doc) *out = json_dumps(doc, JSON_COMPACT);
        json_decref(doc);
        if (!*out) status = bad(msg, msg_size, "out of memory");
    }
    free(req.nodes);
    json_decref(root);
    return status;
}

/* Reads all of f into a malloc'ed buffer; NULL when out of memory or on a read error. */
static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            return NULL;
        }
        buf = bigger;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static const char *k_plan_usage =
    "usage: pivirt-scheduler plan < request.json\n"
    "  request: {\"strategy\":\"AUTO\",\"need\":3,\"limit\":0,\"total\":10,\n"
    "            \"nodes\":[{\"name\":\"n1\",\"capacity\":10,\"count\":2,\"usage\":0.5,"
    "\"rate\":0.1}]}\n"
    "  prints {\"plan\":{...}} (exit 0) or {\"error\":{\"kind\":...,\"message\":...}} (exit 1);\n"
    "  input that is not such a request: a message on stderr, exit 2\n";

int sched_plan_cli_main(int argc, char **argv) {
    if (argc > 1) {
        int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        fputs(k_plan_usage, help ? stdout : stderr);
        return help ? SCHED_CLI_OK : SCHED_CLI_BAD_INPUT;
    }
    size_t len = 0;
    char *input = read_all(stdin, &len);
    if (!input) {
        fprintf(stderr, "pivirt-scheduler plan: cannot read stdin\n");
        return SCHED_CLI_BAD_INPUT;
    }
    char *out = NULL;
    char msg[PV_STATUS_MSG_MAX];
    int status = sched_plan_cli_eval(input, len, &out, msg, sizeof msg);
    free(input);
    if (status == SCHED_CLI_BAD_INPUT) {
        fprintf(stderr, "pivirt-scheduler plan: %s\n", msg);
        return status;
    }
    printf("%s\n", out);
    free(out);
    return fflush(stdout) == 0 ? status : SCHED_CLI_BAD_INPUT;
}
