/*
 * wk_xml: libvirt's XML read through libxml2 (see wk_xml.h for the parser's options and why).
 *
 * Strings libxml2 returns come from xmlMalloc; they are copied into malloc'd ones here, so that
 * callers free everything with free() whatever allocator libxml2 was given.
 */
#include "wk_xml.h"

#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xmlerror.h>
#include <libxml/xmlsave.h>
#include <libxml/xpath.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* No network, nothing printed; entities are not substituted and no DTD is loaded because the
 * options that would (XML_PARSE_NOENT, XML_PARSE_DTDLOAD, XML_PARSE_HUGE) are left out. */
#define PARSE_OPTIONS (XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING)

struct wk_xml {
    xmlDocPtr doc;
    xmlXPathContextPtr xp;
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

/* libxml2 wants its first initialisation done once before threads use it. */
static void init_parser(void) {
    xmlInitParser();
}

/* XPath errors would go to stderr; the callers' expressions are constants, and a failure shows
 * as "no nodes" or -1. */
static void quiet(void *user, xmlErrorPtr err) {
    (void)user;
    (void)err;
}

/* A few libxml2 errors (an entity redeclared, a save that fails) bypass the parser's
 * XML_PARSE_NOERROR and go to the thread's generic handler, which prints; it is swapped for a
 * silent one around each call that can raise them, and put back, as libvirt shares the library. */
typedef struct quiet_state {
    xmlGenericErrorFunc fn;
    void *ctx;
} quiet_state;

static void quiet_generic(void *ctx, const char *msg, ...) {
    (void)ctx;
    (void)msg;
}

static quiet_state quiet_begin(void) {
    quiet_state q = {xmlGenericError, xmlGenericErrorContext};
    xmlSetGenericErrorFunc(NULL, quiet_generic);
    return q;
}

static void quiet_end(quiet_state q) {
    xmlSetGenericErrorFunc(q.ctx, q.fn);
}

static char *own(xmlChar *s) {
    char *out = s ? strdup((const char *)s) : NULL;
    xmlFree(s);
    return out;
}

static int parse_error(pv_status *st) {
    const xmlError *e = xmlGetLastError();
    if (!e || !e->message) return pv_status_set(st, PV_INVALID_ARGUMENT, "XML: not well-formed");
    size_t n = strlen(e->message);
    while (n > 0 && (e->message[n - 1] == '\n' || e->message[n - 1] == ' '))
        n--;
    return pv_status_set(st, PV_INVALID_ARGUMENT, "XML: line %d: %.*s", e->line, (int)n,
                         e->message);
}

int wk_xml_parse(const char *text, wk_xml **out, pv_status *st) {
    *out = NULL;
    size_t len = text ? strlen(text) : 0;
    if (len > WK_XML_MAX_BYTES)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "XML: %zu bytes, more than %d", len,
                             WK_XML_MAX_BYTES);
    pthread_once(&init_once, init_parser);
    xmlResetLastError();
    quiet_state q = quiet_begin();
    xmlDocPtr doc = xmlReadMemory(text ? text : "", (int)len, NULL, NULL, PARSE_OPTIONS);
    quiet_end(q);
    if (!doc) return parse_error(st);
    wk_xml *x = NULL;
    int rc;
    if (doc->intSubset || doc->extSubset) {
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "XML: a DOCTYPE is not accepted");
        goto fail;
    }
    if (!(x = calloc(1, sizeof *x)) || !(x->xp = xmlXPathNewContext(doc))) {
        rc = pv_status_set(st, PV_INTERNAL, "XML: out of memory");
        goto fail;
    }
    x->doc = doc;
    x->xp->error = quiet;
    *out = x;
    return PV_OK;
fail:
    free(x);
    xmlFreeDoc(doc);
    return rc;
}

void wk_xml_free(wk_xml *x) {
    if (!x) return;
    xmlXPathFreeContext(x->xp);
    xmlFreeDoc(x->doc);
    free(x);
}

/* xpath evaluated at `at` (NULL: the document); NULL on an error or a result that is no node
 * set. */
static xmlXPathObjectPtr eval(wk_xml *x, const wk_xml_node *at, const char *xpath) {
    x->xp->node = at ? (xmlNodePtr)at : (xmlNodePtr)x->doc;
    xmlXPathObjectPtr o = xmlXPathEvalExpression(BAD_CAST xpath, x->xp);
    if (o && o->type != XPATH_NODESET) {
        xmlXPathFreeObject(o);
        return NULL;
    }
    return o;
}

int wk_xml_find(wk_xml *x, const wk_xml_node *at, const char *xpath, wk_xml_node ***nodes,
                size_t *n) {
    *nodes = NULL;
    *n = 0;
    xmlXPathObjectPtr o = eval(x, at, xpath);
    if (!o) return -1;
    size_t count = o->nodesetval ? (size_t)o->nodesetval->nodeNr : 0;
    int rc = 0;
    if (count > 0 && !(*nodes = malloc(count * sizeof **nodes))) rc = -1;
    for (size_t i = 0; rc == 0 && i < count; i++)
        (*nodes)[i] = o->nodesetval->nodeTab[i];
    if (rc == 0) *n = count;
    xmlXPathFreeObject(o);
    return rc;
}

wk_xml_node *wk_xml_first(wk_xml *x, const wk_xml_node *at, const char *xpath) {
    xmlXPathObjectPtr o = eval(x, at, xpath);
    xmlNodePtr n =
        o && o->nodesetval && o->nodesetval->nodeNr > 0 ? o->nodesetval->nodeTab[0] : NULL;
    xmlXPathFreeObject(o);
    return n;
}

char *wk_xml_text(wk_xml *x, const wk_xml_node *at, const char *xpath) {
    wk_xml_node *n = wk_xml_first(x, at, xpath);
    return n ? own(xmlNodeGetContent(n)) : NULL;
}

char *wk_xml_text_of(const char *text, const char *xpath) {
    wk_xml *x;
    pv_status st;
    if (wk_xml_parse(text, &x, &st) != PV_OK) return NULL;
    char *out = wk_xml_text(x, NULL, xpath);
    wk_xml_free(x);
    return out;
}

int wk_xml_append(wk_xml *x, wk_xml_node *parent, const char *fragment, pv_status *st) {
    wk_xml *f;
    int rc = wk_xml_parse(fragment, &f, st);
    if (rc != PV_OK) return rc;
    xmlNodePtr copy = xmlDocCopyNode(xmlDocGetRootElement(f->doc), x->doc, 1);
    wk_xml_free(f);
    if (!copy || !xmlAddChild(parent, copy)) {
        xmlFreeNode(copy);
        return pv_status_set(st, PV_INTERNAL, "XML: out of memory");
    }
    return PV_OK;
}

void wk_xml_remove(wk_xml_node *node) {
    xmlUnlinkNode(node);
    xmlFreeNode(node);
}

char *wk_xml_dump(wk_xml *x, const wk_xml_node *node) {
    xmlNodePtr n = node ? (xmlNodePtr)node : xmlDocGetRootElement(x->doc);
    xmlBufferPtr buf = xmlBufferCreate();
    quiet_state q = quiet_begin();
    xmlSaveCtxtPtr save = buf ? xmlSaveToBuffer(buf, "UTF-8", XML_SAVE_NO_DECL) : NULL;
    long r = save && n ? xmlSaveTree(save, n) : -1;
    if (save && xmlSaveClose(save) < 0) r = -1;
    quiet_end(q);
    char *out = r >= 0 ? strdup((const char *)xmlBufferContent(buf)) : NULL;
    xmlBufferFree(buf);
    return out;
}

void wk_xml_put_escaped(FILE *f, const char *s) {
    static const char *const entity[] = {
        ['&'] = "&amp;", ['<'] = "&lt;", ['>'] = "&gt;", ['\''] = "&apos;", ['"'] = "&quot;"};
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < sizeof entity / sizeof entity[0] && entity[c])
            fputs(entity[c], f);
        else
            fputc(c, f);
    }
}
