/*
 * pv_json: field reads of JSON records with defaults, and a compact writer that prints each real
 * in its shortest exact form (see pv_json.h).
 *
 * The writer walks the tree itself because jansson has no hook for one value's text: its
 * precision is per document. Everything else follows jansson's compact output, so swapping
 * json_dumps(v, JSON_COMPACT) for pv_json_dumps(v, 0) changes only how reals look.
 */
#include "pv_json.h"

#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 2048

const char *pv_json_str_or(const json_t *o, const char *key, const char *def) {
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : def;
}

const char *pv_json_str(const json_t *o, const char *key) {
    return pv_json_str_or(o, key, "");
}

int64_t pv_json_int(const json_t *o, const char *key) {
    return (int64_t)json_integer_value(json_object_get(o, key));
}

/* ---- reals ---- */

/* jansson's spelling of a printed real: '.' whatever the locale, ".0" when neither a point nor
 * an exponent shows it is a real, no '+' and no leading zeros in the exponent. */
static int real_spelling(char *buf, size_t len) {
    char point = *localeconv()->decimal_point;
    char *p = point && point != '.' ? strchr(buf, point) : NULL;
    if (p) *p = '.';
    size_t n = strlen(buf);
    if (!strchr(buf, '.') && !strchr(buf, 'e')) {
        if (n + 3 > len) return -1;
        memcpy(buf + n, ".0", 3);
        n += 2;
    }
    char *e = strchr(buf, 'e');
    if (e) {
        char *from = e + 1, *to = e + 1;
        if (*from == '+')
            from++;
        else if (*from == '-')
            from++, to++;
        while (from[0] == '0' && from[1])
            from++;
        memmove(to, from, strlen(from) + 1);
        n = strlen(buf);
    }
    return (int)n;
}

int pv_json_real_text(double d, char *buf, size_t len) {
    if (!isfinite(d) || len < 32) return -1;
    int digits = 17, exp10 = 0;
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, len, "%.*e", p - 1, d);
        if (strtod(buf, NULL) == d) { /* 17 digits always read back */
            digits = p;
            break;
        }
    }
    exp10 = atoi(strchr(buf, 'e') + 1);
    /* Plain notation where %g would use it with enough digits for the integer part (10.0, not
     * 1e1), exponents beyond: the same digits either way. */
    if (exp10 >= -4 && exp10 < 17)
        snprintf(buf, len, "%.*g", digits > exp10 + 1 ? digits : exp10 + 1, d);
    return real_spelling(buf, len);
}

/* ---- the writer ---- */

/* The text grows in a memory stream; a write that fails (memory) marks the stream's error. */
typedef struct out {
    FILE *f;
    int failed; /* something could not be written at all (a depth or a value) */
} out;

static void put(out *o, const char *s, size_t n) {
    if (!o->failed && n > 0 && fwrite(s, 1, n, o->f) != n) o->failed = 1;
}

/* A JSON string as jansson writes it by default: '"' and '\\' escaped, control characters as
 * \b \f \n \r \t or \u00XX, everything else (UTF-8 included) as it is. */
static void put_string(out *o, const char *s, size_t n) {
    put(o, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(o, s + run, i - run);
        run = i + 1;
        char esc[8];
        const char *short_form = c == '"'    ? "\\\""
                                 : c == '\\' ? "\\\\"
                                 : c == '\b' ? "\\b"
                                 : c == '\f' ? "\\f"
                                 : c == '\n' ? "\\n"
                                 : c == '\r' ? "\\r"
                                 : c == '\t' ? "\\t"
                                             : NULL;
        if (!short_form) snprintf(esc, sizeof esc, "\\u%04X", c);
        put(o, short_form ? short_form : esc, strlen(short_form ? short_form : esc));
    }
    put(o, s + run, n - run);
    put(o, "\"", 1);
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void put_value(out *o, const json_t *v, size_t flags, int depth);

static void put_object(out *o, const json_t *v, size_t flags, int depth) {
    size_t n = json_object_size(v), i = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys) {
        o->failed = 1;
        return;
    }
    const char *key;
    json_t *member;
    json_object_foreach((json_t *)v, key, member) keys[i++] = key;
    if (flags & JSON_SORT_KEYS) qsort(keys, n, sizeof *keys, key_cmp);
    put(o, "{", 1);
    for (i = 0; i < n && !o->failed; i++) {
        if (i) put(o, ",", 1);
        put_string(o, keys[i], strlen(keys[i]));
        put(o, ":", 1);
        put_value(o, json_object_get(v, keys[i]), flags, depth + 1);
    }
    put(o, "}", 1);
    free(keys);
}

static void put_value(out *o, const json_t *v, size_t flags, int depth) {
    char num[64];
    int n;
    if (o->failed) return;
    if (depth > MAX_DEPTH) {
        o->failed = 1;
        return;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        put_object(o, v, flags, depth);
        break;
    case JSON_ARRAY:
        put(o, "[", 1);
        for (size_t i = 0; i < json_array_size(v) && !o->failed; i++) {
            if (i) put(o, ",", 1);
            put_value(o, json_array_get(v, i), flags, depth + 1);
        }
        put(o, "]", 1);
        break;
    case JSON_STRING:
        put_string(o, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        n = snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        put(o, num, (size_t)n);
        break;
    case JSON_REAL:
        n = pv_json_real_text(json_real_value(v), num, sizeof num);
        if (n < 0)
            o->failed = 1;
        else
            put(o, num, (size_t)n);
        break;
    case JSON_TRUE:
        put(o, "true", 4);
        break;
    case JSON_FALSE:
        put(o, "false", 5);
        break;
    case JSON_NULL:
        put(o, "null", 4);
        break;
    }
}

char *pv_json_dumps(const json_t *v, size_t flags) {
    if (!v || (flags & ~(size_t)(JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY))) return NULL;
    if (!(flags & JSON_ENCODE_ANY) && !json_is_object(v) && !json_is_array(v)) return NULL;
    char *text = NULL;
    size_t len = 0;
    out o = {.f = open_memstream(&text, &len)};
    if (!o.f) return NULL;
    put_value(&o, v, flags, 0);
    int failed = o.failed | ferror(o.f);
    if (fclose(o.f) != 0) failed = 1;
    if (failed) {
        free(text);
        return NULL;
    }
    return text;
}
