/*
 * Unit tests of pv_path: the canonical form of absolute paths, the storage roots (defaults,
 * resolution, containment by whole components), and the confined walks on a real directory
 * tree made here: links anywhere below a root refused, missing directories made only when
 * asked, files that are not regular refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pv_path.h"

static char top[256]; /* a temporary directory: top/root is the only root */
static char root[300];

static int setup(void **state) {
    (void)state;
    snprintf(top, sizeof top, "/tmp/pv-test-path-XXXXXX");
    if (!mkdtemp(top)) return -1;
    snprintf(root, sizeof root, "%s/root", top);
    return mkdir(root, 0755);
}

static int teardown(void **state) {
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    return system(cmd) == 0 ? 0 : -1;
}

static void roots_one(pv_roots *r) {
    char *list[] = {root};
    pv_status st;
    assert_int_equal(pv_path_roots_init(r, list, 1, NULL, &st), PV_OK);
}

static void expect(int rc, int code, const pv_status *st, const char *part) {
    assert_int_equal(rc, code);
    if (!strstr(st->msg, part)) fail_msg("\"%s\" not in \"%s\"", part, st->msg);
}

static void test_canonical_form(void **state) {
    (void)state;
    pv_status st;
    const char *ok[] = {"/", "/a", "/a/b.c", "/a/.b", "/a/b..c"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_int_equal(pv_path_check_abs("p", ok[i], &st), PV_OK);
    const char *bad[] = {"a", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/../etc", "/a/."};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect(pv_path_check_abs("p", bad[i], &st), PV_INVALID_ARGUMENT, &st, "p: \"");
    expect(pv_path_check_abs("p", "rel", &st), PV_INVALID_ARGUMENT, &st,
           "p: \"rel\" is not an absolute path");
    expect(pv_path_check_abs("p", "/a\nb", &st), PV_INVALID_ARGUMENT, &st,
           "holds a control character at byte 2");
    expect(pv_path_check_abs("p", "", &st), PV_INVALID_ARGUMENT, &st, "p: is required");
    char *longp = malloc(PV_PATH_MAX + 2);
    memset(longp, 'a', PV_PATH_MAX + 1);
    longp[0] = '/';
    longp[PV_PATH_MAX + 1] = '\0';
    expect(pv_path_check_abs("p", longp, &st), PV_INVALID_ARGUMENT, &st, "longer than 1024");
    free(longp);
}

static void test_default_roots_and_containment(void **state) {
    (void)state;
    pv_roots r;
    pv_status st;
    assert_int_equal(pv_path_roots_init(&r, NULL, 0, top, &st), PV_OK);
    assert_int_equal(r.n, 2);
    char want[400];
    snprintf(want, sizeof want, "%s/pools", top);
    assert_string_equal(r.v[0], want); /* not made yet: kept as named */
    assert_string_equal(r.v[1], "/var/lib/libvirt/images");
    snprintf(want, sizeof want, "%s/pools/a", top);
    assert_int_equal(pv_path_within("p", want, &r, &st), PV_OK);
    snprintf(want, sizeof want, "%s/poolsx", top); /* a prefix, not a component */
    expect(pv_path_within("p", want, &r, &st), PV_INVALID_ARGUMENT, &st,
           "is outside the storage roots of this node (");
    expect(pv_path_within("p", "/etc", &r, &st), PV_INVALID_ARGUMENT, &st,
           "/var/lib/libvirt/images; storage.roots)");
    pv_path_roots_clear(&r);
    char *bad[] = {"rel"};
    expect(pv_path_roots_init(&r, bad, 1, NULL, &st), PV_INVALID_ARGUMENT, &st, "storage.roots");
}

static void test_roots_are_resolved(void **state) {
    (void)state;
    char link[400];
    snprintf(link, sizeof link, "%s/root-link", top);
    assert_int_equal(symlink(root, link), 0);
    char *list[] = {link};
    pv_roots r;
    pv_status st;
    assert_int_equal(pv_path_roots_init(&r, list, 1, NULL, &st), PV_OK);
    assert_string_equal(r.v[0], root); /* an operator's link to the root is theirs */
    pv_path_roots_clear(&r);
    unlink(link);
}

static void test_confine_dir_refuses_links_and_makes_dirs(void **state) {
    (void)state;
    pv_roots r;
    roots_one(&r);
    pv_status st;
    char p[600], link[400];
    snprintf(p, sizeof p, "%s/a/b", root);
    expect(pv_path_confine_dir("config.path", p, &r, 0, &st), PV_INVALID_ARGUMENT, &st,
           "does not exist");
    assert_int_equal(pv_path_confine_dir("config.path", p, &r, PV_PATH_MKDIR, &st), PV_OK);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(pv_path_confine_dir("config.path", root, &r, 0, &st), PV_OK);
    /* a link below the root, to a directory outside it or inside it: refused either way */
    snprintf(link, sizeof link, "%s/l", root);
    assert_int_equal(symlink(top, link), 0);
    snprintf(p, sizeof p, "%s/l/root", root);
    expect(pv_path_confine_dir("config.path", p, &r, PV_PATH_MKDIR, &st), PV_INVALID_ARGUMENT, &st,
           "is a symbolic link or not a directory");
    snprintf(p, sizeof p, "%s/l/new", root);
    expect(pv_path_confine_dir("config.path", p, &r, PV_PATH_MKDIR, &st), PV_INVALID_ARGUMENT, &st,
           "is a symbolic link");
    snprintf(p, sizeof p, "%s/new", top);
    assert_int_not_equal(stat(p, &sb), 0); /* nothing made through the link */
    unlink(link);
    snprintf(link, sizeof link, "%s/file", root);
    FILE *f = fopen(link, "w");
    fclose(f);
    snprintf(p, sizeof p, "%s/file/x", root);
    expect(pv_path_confine_dir("config.path", p, &r, PV_PATH_MKDIR, &st), PV_INVALID_ARGUMENT, &st,
           "not a directory");
    unlink(link);
    pv_path_roots_clear(&r);
}

static void test_confine_file(void **state) {
    (void)state;
    pv_roots r;
    roots_one(&r);
    pv_status st;
    char p[600], q[600];
    snprintf(p, sizeof p, "%s/img", root);
    FILE *f = fopen(p, "w");
    fclose(f);
    assert_int_equal(pv_path_confine_file("volume", p, &r, &st), PV_OK);
    snprintf(q, sizeof q, "%s/to-img", root);
    assert_int_equal(symlink(p, q), 0);
    expect(pv_path_confine_file("volume", q, &r, &st), PV_FAILED_PRECONDITION, &st,
           "is not a regular file");
    snprintf(q, sizeof q, "%s/fifo", root);
    assert_int_equal(mkfifo(q, 0600), 0);
    expect(pv_path_confine_file("volume", q, &r, &st), PV_FAILED_PRECONDITION, &st,
           "is not a regular file");
    snprintf(q, sizeof q, "%s/gone", root);
    expect(pv_path_confine_file("volume", q, &r, &st), PV_NOT_FOUND, &st, "No such file");
    expect(pv_path_confine_file("volume", "/etc/hostname", &r, &st), PV_FAILED_PRECONDITION, &st,
           "is outside the storage roots");
    pv_path_roots_clear(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_canonical_form),
        cmocka_unit_test(test_default_roots_and_containment),
        cmocka_unit_test(test_roots_are_resolved),
        cmocka_unit_test(test_confine_dir_refuses_links_and_makes_dirs),
        cmocka_unit_test(test_confine_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
