/*
 * wk_xml, the libxml2 reader of libvirt's XML: texts and attributes by XPath (absolute and
 * relative to a node), the edits the virt engine makes, and hostile input: metadata text holding
 * markup, character references and CDATA read back as the text it stands for; DOCTYPEs with
 * internal, external and parameter entities and an exponential entity bomb refused without
 * expanding anything; undefined entities, a document over WK_XML_MAX_BYTES and nesting past
 * libxml2's depth limit refused with a message and nothing printed; a large legal document read
 * whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "wk_xml.h"

static const char *const DOMAIN =
    "<domain type='test'>\n"
    "  <name>vm &amp; co</name>\n"
    "  <metadata><other:x xmlns:other='urn:other'><devices><interface type='network'/>"
    "</devices></other:x></metadata>\n"
    "  <devices>\n"
    "    <interface type='network'><mac address='52:54:00:aa:bb:01'/>"
    "<source network='default'/></interface>\n"
    "    <interface type='bridge'><mac address='52:54:00:aa:bb:02'/>"
    "<source bridge='br0'/></interface>\n"
    "    <interface type=\"user\"/>\n"
    "  </devices>\n"
    "</domain>\n";

static wk_xml *parse_ok(const char *text) {
    wk_xml *x = NULL;
    pv_status st;
    if (wk_xml_parse(text, &x, &st) != PV_OK) fail_msg("parse: %s", st.msg);
    return x;
}

/* wk_xml_parse refuses text with INVALID_ARGUMENT and a message holding want. */
static void refused(const char *text, const char *want) {
    wk_xml *x = NULL;
    pv_status st;
    assert_int_equal(wk_xml_parse(text, &x, &st), PV_INVALID_ARGUMENT);
    assert_null(x);
    if (!strstr(st.msg, want)) fail_msg("\"%s\" not in \"%s\"", want, st.msg);
    assert_null(wk_xml_text_of(text, "/*"));
}

static void assert_text(wk_xml *x, const wk_xml_node *at, const char *xpath, const char *want) {
    char *got = wk_xml_text(x, at, xpath);
    if (!want) {
        assert_null(got);
        return;
    }
    if (!got) fail_msg("%s: nothing, want \"%s\"", xpath, want);
    assert_string_equal(got, want);
    free(got);
}

static void test_read(void **state) {
    (void)state;
    wk_xml *x = parse_ok(DOMAIN);
    assert_text(x, NULL, "/domain/name", "vm & co");
    assert_text(x, NULL, "/domain/@type", "test");
    assert_text(x, NULL, "/domain/@missing", NULL);
    assert_text(x, NULL, "/domain/nothing", NULL);
    wk_xml_node **ifs;
    size_t n;
    /* the interfaces of <devices>, not the look-alike another tool left in <metadata> */
    assert_int_equal(wk_xml_find(x, NULL, "/domain/devices/interface", &ifs, &n), 0);
    assert_int_equal(n, 3);
    assert_text(x, ifs[0], "@type", "network");
    assert_text(x, ifs[0], "mac/@address", "52:54:00:aa:bb:01");
    assert_text(x, ifs[0], "source/@network", "default");
    assert_text(x, ifs[1], "source/@bridge", "br0");
    assert_text(x, ifs[1], "source/@network", NULL);
    assert_text(x, ifs[2], "@type", "user");
    assert_text(x, ifs[2], "mac/@address", NULL);
    free(ifs);
    assert_int_equal(wk_xml_find(x, NULL, "/domain/nothing", &ifs, &n), 0);
    assert_int_equal(n, 0);
    assert_null(ifs);
    /* not an expression, or not one giving nodes */
    assert_int_equal(wk_xml_find(x, NULL, "/domain/[", &ifs, &n), -1);
    assert_int_equal(wk_xml_find(x, NULL, "count(/domain)", &ifs, &n), -1);
    assert_null(wk_xml_first(x, NULL, "/domain/["));
    assert_non_null(wk_xml_first(x, NULL, "/domain/devices"));
    wk_xml_free(x);
    char *v = wk_xml_text_of(DOMAIN, "/domain/devices/interface[2]/mac/@address");
    assert_string_equal(v, "52:54:00:aa:bb:02");
    free(v);
    wk_xml_free(NULL);
}

static void test_edit(void **state) {
    (void)state;
    wk_xml *x = parse_ok("<domain><name>v\xc3\xa9</name><devices/></domain>");
    wk_xml_node *dev = wk_xml_first(x, NULL, "/domain/devices");
    pv_status st;
    assert_int_equal(wk_xml_append(x, dev,
                                   "<interface type='network'><source network='a'/>"
                                   "</interface>",
                                   &st),
                     PV_OK);
    assert_int_equal(wk_xml_append(x, dev, "<interface type='user'/>", &st), PV_OK);
    assert_int_equal(wk_xml_append(x, dev, "<a><b></a>", &st), PV_INVALID_ARGUMENT);
    assert_int_equal(wk_xml_append(x, dev, "<a/><b/>", &st), PV_INVALID_ARGUMENT);
    char *out = wk_xml_dump(x, NULL);
    assert_string_equal(out, "<domain><name>v\xc3\xa9</name><devices><interface type=\"network\">"
                             "<source network=\"a\"/></interface><interface type=\"user\"/>"
                             "</devices></domain>");
    free(out);
    wk_xml_remove(wk_xml_first(x, NULL, "/domain/devices/interface[@type='network']"));
    out = wk_xml_dump(x, wk_xml_first(x, NULL, "/domain/devices"));
    assert_string_equal(out, "<devices><interface type=\"user\"/></devices>");
    free(out);
    wk_xml_free(x);

    /* text that needs escaping comes out escaped, and reads back the same */
    x = parse_ok("<m a='&lt;&quot;&apos;&amp;'>&lt;/m&gt;&amp;lt;]]&gt;</m>");
    out = wk_xml_dump(x, NULL);
    wk_xml_free(x);
    x = parse_ok(out);
    free(out);
    assert_text(x, NULL, "/m", "</m>&lt;]]>");
    assert_text(x, NULL, "/m/@a", "<\"'&");
    wk_xml_free(x);
}

/* Metadata as virDomainGetMetadata gives it: the client's JSON as the element's text. */
static void test_metadata_markup(void **state) {
    (void)state;
    char *t = wk_xml_text_of("<workload xmlns='https://pivirt.io/xmlns/workload/1'>"
                             "{&quot;a&quot;:&quot;&lt;b&gt;x&lt;/b&gt;&amp;amp;&#x41;&#66;"
                             "&#x1F600;&quot;}</workload>",
                             "/*");
    assert_string_equal(t, "{\"a\":\"<b>x</b>&amp;AB\xf0\x9f\x98\x80\"}");
    free(t);
    /* markup that was not escaped is markup: its text is what the element holds, tags dropped */
    t = wk_xml_text_of("<workload>{\"a\":<b>\"x\"</b><!-- c -->}<?pi z?></workload>", "/*");
    assert_string_equal(t, "{\"a\":\"x\"}");
    free(t);
    t = wk_xml_text_of("<workload><![CDATA[<b>&amp;]]></workload>", "/*");
    assert_string_equal(t, "<b>&amp;");
    free(t);
    t = wk_xml_text_of("<workload/>", "/*");
    assert_string_equal(t, "");
    free(t);
    refused("<workload>&#0;</workload>", "XML: line 1");
    refused("<workload>&#x110000;</workload>", "XML: line 1");
    refused("<workload>&foo;</workload>", "foo");
    refused("<workload>a</workload><second/>", "XML: line 1");
    refused("<workload>a", "XML: line 1");
    refused("", "XML");
    refused("\xff\xfe<a/>", "XML");
}

static void test_entities(void **state) {
    (void)state;
    refused("<!DOCTYPE w [<!ENTITY e 'injected'>]><w>&e;</w>", "DOCTYPE");
    /* refused for their DOCTYPE: had /etc/passwd been loaded as a DTD, its text would have
     * failed the parse with another message */
    refused("<!DOCTYPE w [<!ENTITY e SYSTEM 'file:///etc/passwd'>]><w>&e;</w>", "DOCTYPE");
    refused("<!DOCTYPE w SYSTEM 'http://127.0.0.1:1/x.dtd'><w/>", "DOCTYPE");
    refused("<!DOCTYPE w [<!ENTITY % p SYSTEM 'file:///etc/passwd'> %p;]><w/>", "DOCTYPE");
    /* an exponential bomb: 10^9 'lol's if expanded; libxml2 stops it before the DOCTYPE check */
    char bomb[2048];
    int k = snprintf(bomb, sizeof bomb, "<!DOCTYPE w [<!ENTITY l0 'lol'>");
    for (int i = 1; i < 10; i++)
        k += snprintf(bomb + k, sizeof bomb - (size_t)k,
                      "<!ENTITY l%d '&l%d;&l%d;&l%d;&l%d;&l%d;&l%d;&l%d;&l%d;&l%d;&l%d;'>", i,
                      i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1);
    snprintf(bomb + k, sizeof bomb - (size_t)k, "]><w>&l9;</w>");
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    refused(bomb, "entity reference loop");
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_true(b.tv_sec - a.tv_sec < 5);
}

/* Nothing libxml2 says reaches stderr, not even what bypasses XML_PARSE_NOERROR. */
static void test_silent(void **state) {
    (void)state;
    char path[] = "/tmp/pv-wk-xml-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    refused("<!DOCTYPE w [<!ENTITY lt 'x'><!ENTITY amp 'y'>]><w>&lt;</w>", "DOCTYPE");
    refused("<w>&nope;<x></w>", "XML: line 1");
    wk_xml *x = parse_ok("<w/>");
    assert_null(wk_xml_first(x, NULL, "///"));
    wk_xml_free(x);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    close(fd);
    unlink(path);
    assert_int_equal(sb.st_size, 0);
}

static char *repeat(const char *head, const char *unit, size_t times, const char *tail) {
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * times + tl + 1);
    assert_non_null(s);
    memcpy(s, head, hl);
    for (size_t i = 0; i < times; i++)
        memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * times, tail, tl + 1);
    return s;
}

static void test_huge(void **state) {
    (void)state;
    /* over the cap: refused before libxml2 sees it */
    char *s = repeat("<w>", "x", WK_XML_MAX_BYTES, "</w>");
    refused(s, "bytes, more than");
    free(s);
    /* nesting far past libxml2's depth limit: refused, the stack untouched */
    s = repeat("", "<d>", 100000, "");
    refused(s, "XML: line 1");
    free(s);
    /* a large legal document is read whole */
    s = repeat("<domain><devices>", "<interface type='network'><mac address='m'/></interface>",
               20000, "</devices></domain>");
    wk_xml *x = parse_ok(s);
    free(s);
    wk_xml_node **ifs;
    size_t n;
    assert_int_equal(wk_xml_find(x, NULL, "/domain/devices/interface", &ifs, &n), 0);
    assert_int_equal(n, 20000);
    assert_text(x, ifs[19999], "mac/@address", "m");
    free(ifs);
    wk_xml_free(x);
    /* 4 MiB of escaped metadata text */
    s = repeat("<workload>", "&lt;", 1 << 20, "</workload>");
    char *t = wk_xml_text_of(s, "/*");
    free(s);
    assert_non_null(t);
    assert_int_equal(strlen(t), 1 << 20);
    assert_int_equal(strspn(t, "<"), 1 << 20);
    free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_edit),
        cmocka_unit_test(test_metadata_markup),
        cmocka_unit_test(test_entities),
        cmocka_unit_test(test_silent),
        cmocka_unit_test(test_huge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
