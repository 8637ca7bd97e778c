/*
 * wk_xml: the XML libvirt hands back (domain, network, volume and metadata XML), read with
 * libxml2 and XPath: "the text of the first node matching P" (an element's text, or an
 * attribute's value when P ends in @name), "the nodes matching P", and the two edits the virt
 * engine makes to a definition whose driver cannot attach devices (append one, remove one).
 *
 * Why a library and these options: that XML carries client text (a domain's name, the pivirt
 * metadata, other tools' metadata), which a parser fuzzed continuously reads more safely than a
 * scanner trusting libvirt's formatting. No network (XML_PARSE_NONET), no entity substitution
 * (no XML_PARSE_NOENT), no DTD loaded, and a document with a DOCTYPE is refused: libvirt never
 * writes one, so one means the text is not libvirt's, and with none no entity beyond the five
 * predefined ones can be declared. libxml2's default limits stay (no XML_PARSE_HUGE: depth,
 * text node size) and a document is at most WK_XML_MAX_BYTES. Errors are kept in the
 * pv_status, never printed.
 *
 * Ownership: a wk_xml owns its nodes; a wk_xml_node pointer is valid until that node is removed
 * or the document freed. Every char * returned belongs to the caller (free). XPath expressions
 * are the callers' constants, never client text: client values are compared in C.
 * Threads: one document is used by one thread at a time; documents are independent.
 */
#ifndef WK_XML_H
#define WK_XML_H

#include <stddef.h>
#include <stdio.h>

#include "pv_status.h"

#define WK_XML_MAX_BYTES (32 * 1024 * 1024)

typedef struct wk_xml wk_xml;
typedef struct _xmlNode wk_xml_node; /* libxml2's xmlNode, opaque here */

/* Parses the NUL-terminated text into *out (free with wk_xml_free). INVALID_ARGUMENT naming the
 * line and libxml2's message when it is not well-formed, has a DOCTYPE or is too big. */
int wk_xml_parse(const char *text, wk_xml **out, pv_status *st);

void wk_xml_free(wk_xml *x);

/* The nodes matching xpath, evaluated at node `at` (NULL: the document), in document order,
 * into *nodes (caller frees the array, not the nodes). 0, or -1 when out of memory or xpath is
 * not an expression giving nodes. */
int wk_xml_find(wk_xml *x, const wk_xml_node *at, const char *xpath, wk_xml_node ***nodes,
                size_t *n);

/* The first node matching xpath at `at` (NULL: the document), or NULL. */
wk_xml_node *wk_xml_first(wk_xml *x, const wk_xml_node *at, const char *xpath);

/* The text of the first node matching xpath at `at` (NULL: the document): an element's text
 * (its descendants' text joined), an attribute's value ("source/@network"). NULL when nothing
 * matches (or out of memory). */
char *wk_xml_text(wk_xml *x, const wk_xml_node *at, const char *xpath);

/* wk_xml_text of xpath in the document text, for a one-off read. NULL also when text is not a
 * document wk_xml_parse takes. */
char *wk_xml_text_of(const char *text, const char *xpath);

/* Parses fragment (one element) and appends it as the last child of parent. */
int wk_xml_append(wk_xml *x, wk_xml_node *parent, const char *fragment, pv_status *st);

/* Removes node (and what it holds) from its document and frees it. */
void wk_xml_remove(wk_xml_node *node);

/* node (NULL: the root element) and what it holds as XML text in UTF-8, without an XML
 * declaration; NULL when out of memory. */
char *wk_xml_dump(wk_xml *x, const wk_xml_node *node);

/* Writes s to f with the five XML special characters escaped: a client value inside an
 * attribute (either quote) or an element's text. */
void wk_xml_put_escaped(FILE *f, const char *s);

#endif
