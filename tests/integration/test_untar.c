/*
 * wk_untar (libarchive) against GNU tar: archives of one tree in the gnu, posix (pax), ustar and
 * v7 formats, and compressed with gzip, bzip2, xz, zstd and lz4, are extracted by wk_untar and by
 * tar(1) itself, and the two results must match in every entry's type, mode, size, content, link
 * target, hard-link count and modification time. Then the archives wk_untar must refuse (leaving
 * the root, writing or linking through a link of its own, devices and fifos plain or compressed,
 * oversized headers, corrupt or truncated, not an archive).
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "pv_test_util.h"

#include "wk_untar.h"

typedef struct fixture {
    char dir[64];
} fixture;

/* Everything find and md5sum say about the tree under dir (its root excluded). */
static char *manifest(const char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && { find . -mindepth 1 -printf '%%y %%m %%s %%Ts %%n %%p -> %%l\\n' | "
             "LC_ALL=C sort; find . -type f -exec md5sum {} + | LC_ALL=C sort; }",
             dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t n;
    while ((n = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 4096) out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    assert_int_equal(pclose(p), 0);
    return out;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/pv-untar-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    /* The tree: nested directories, modes, an empty file, a larger random file, links of both
     * kinds (one dangling), a read-only directory with a file in it, names past the 100-byte
     * header field and a path past 255 bytes. */
    pv_test_sh("cd %s && mkdir -p src/a/b/c src/ro && cd src && "
               "echo hello > a/f1 && echo two > a/b/f2 && : > a/empty && chmod 600 a/f1 && "
               "head -c 1100000 /dev/urandom > a/b/c/big && printf '#!/bin/sh\\n' > run.sh && "
               "chmod 4755 run.sh && ln -s a/f1 l1 && ln -s ../nowhere a/dangling && "
               "ln a/b/f2 a/hard && echo ro > ro/x && chmod 555 ro && "
               "touch -d '2020-01-02 03:04:05' a/f1 a/b && "
               "mkdir -p long && cd long && "
               "n=$(printf 'n%%.0s' $(seq 1 120)) && mkdir -p $n/$n && echo deep > $n/$n/$n",
               f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    pv_test_sh("chmod -R u+w %s; rm -rf %s", f->dir, f->dir);
    free(f);
    return 0;
}

/* Extracts archive both ways and compares. */
static void same_as_tar(fixture *f, const char *archive) {
    pv_test_sh("rm -rf %s/x1 %s/x2 2>/dev/null; chmod -R u+w %s/x1 %s/x2 2>/dev/null; "
               "rm -rf %s/x1 %s/x2; mkdir %s/x1 %s/x2",
               f->dir, f->dir, f->dir, f->dir, f->dir, f->dir, f->dir, f->dir);
    char path[256], x1[256];
    snprintf(path, sizeof path, "%s/%s", f->dir, archive);
    snprintf(x1, sizeof x1, "%s/x1", f->dir);
    pv_status st;
    int rc = wk_untar_extract(path, x1, geteuid() == 0, &st);
    if (rc != PV_OK) fail_msg("%s: %s", archive, st.msg);
    pv_test_sh("tar -xf %s -C %s/x2", path, f->dir);
    char x2[256];
    snprintf(x2, sizeof x2, "%s/x2", f->dir);
    char *m1 = manifest(x1), *m2 = manifest(x2);
    if (strcmp(m1, m2) != 0) {
        fprintf(stderr, "--- wk_untar (%s)\n%s--- tar\n%s", archive, m1, m2);
        fail_msg("%s: wk_untar and tar(1) disagree", archive);
    }
    assert_non_null(strstr(m1, "big"));
    free(m1);
    free(m2);
}

static void test_formats_match_tar(void **state) {
    fixture *f = *state;
    pv_test_sh("cd %s && tar --format=gnu -cf gnu.tar -C src . && "
               "tar --format=posix -cf posix.tar -C src . && "
               "tar --format=gnu -cf names.tar -C src a l1 run.sh ro long",
               f->dir);
    same_as_tar(f, "gnu.tar");
    same_as_tar(f, "posix.tar");
    same_as_tar(f, "names.tar");
}

static void test_short_formats_match_tar(void **state) {
    fixture *f = *state;
    /* ustar and v7 cannot hold the long names */
    pv_test_sh("cd %s && tar --format=ustar -cf ustar.tar -C src a l1 run.sh ro && "
               "tar --format=v7 -cf v7.tar -C src a l1 run.sh",
               f->dir);
    same_as_tar(f, "ustar.tar");
    same_as_tar(f, "v7.tar");
}

static int extract(fixture *f, const char *archive, const char *into, pv_status *st) {
    char path[256], dest[256];
    snprintf(path, sizeof path, "%s/%s", f->dir, archive);
    snprintf(dest, sizeof dest, "%s/%s", f->dir, into);
    pv_test_sh("rm -rf %s && mkdir -p %s", dest, dest);
    return wk_untar_extract(path, dest, false, st);
}

static void test_absolute_names_stay_inside(void **state) {
    fixture *f = *state;
    pv_test_sh("cd %s && tar -cPf abs.tar %s/src/a/f1 2>/dev/null", f->dir, f->dir);
    pv_status st;
    assert_int_equal(extract(f, "abs.tar", "xa", &st), PV_OK);
    char p[512];
    snprintf(p, sizeof p, "%s/xa%s/src/a/f1", f->dir, f->dir);
    assert_int_equal(access(p, F_OK), 0);
}

static void test_dotdot_refused(void **state) {
    fixture *f = *state;
    pv_test_sh(
        "mkdir -p %s/up/in && echo evil > %s/up/evil && cd %s/up/in && tar -cPf %s/dd.tar ../evil",
        f->dir, f->dir, f->dir, f->dir);
    pv_status st;
    assert_int_equal(extract(f, "dd.tar", "up/in/x", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "\"..\""));
}

static void test_no_write_through_own_symlink(void **state) {
    fixture *f = *state;
    /* first entry: esc -> <outside>; second: esc/pwned, a file that would land outside */
    pv_test_sh("cd %s && mkdir -p outside t1 t2/esc && ln -s %s/outside t1/esc && echo x > "
               "t2/esc/pwned && "
               "tar -cf esc.tar -C t1 esc && tar -rf esc.tar -C t2 esc/pwned",
               f->dir, f->dir);
    pv_status st;
    assert_int_equal(extract(f, "esc.tar", "xe", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "esc/pwned"));
    char p[256];
    snprintf(p, sizeof p, "%s/outside/pwned", f->dir);
    assert_int_equal(access(p, F_OK), -1);
}

/* A device node in a workload's root would give it the host's hardware: refused, whether read
 * here or listed by tar(1) for a compressed archive. */
static void test_devices_refused(void **state) {
    fixture *f = *state;
    pv_test_sh("cd %s && /usr/bin/python3 -c \"import tarfile, io\n"
               "t = tarfile.open('dev.tar', 'w')\n"
               "i = tarfile.TarInfo('ok.txt'); i.size = 2; t.addfile(i, io.BytesIO(b'ok'))\n"
               "d = tarfile.TarInfo('mem'); d.type = tarfile.CHRTYPE; d.devmajor = 1; "
               "d.devminor = 1; t.addfile(d)\n"
               "b = tarfile.TarInfo('sda'); b.type = tarfile.BLKTYPE; b.devmajor = 8; "
               "t.addfile(b)\n"
               "t.close()\"",
               f->dir);
    pv_status st;
    assert_int_equal(extract(f, "dev.tar", "xd", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "character device"));
    char p[256];
    snprintf(p, sizeof p, "%s/xd/mem", f->dir);
    assert_int_equal(access(p, F_OK), -1);
    /* compressed, the same: libarchive reads it, no listing of tar(1) to trust */
    pv_test_sh("cd %s && gzip -c dev.tar > devgz.tgz", f->dir);
    assert_int_equal(extract(f, "devgz.tgz", "xdz", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "entry \"mem\" is a character device"));
    snprintf(p, sizeof p, "%s/xdz/mem", f->dir);
    assert_int_equal(access(p, F_OK), -1);
}

/* Compressed archives are read directly, as tar(1) reads them; what is no archive is refused. */
static void test_compressed_fifos_and_junk(void **state) {
    fixture *f = *state;
    pv_test_sh("cd %s && tar -czf z.tgz -C src . && tar -cjf z.tbz -C src . && "
               "tar -cJf z.txz -C src . && tar --zstd -cf z.tzst -C src . && "
               "tar -I lz4 -cf z.tlz4 -C src . && mkdir -p fifo && mkfifo fifo/p && "
               "tar -cf fifo.tar -C fifo p && echo 'not a tar archive at all' > junk.tar",
               f->dir);
    same_as_tar(f, "z.tgz");
    same_as_tar(f, "z.tbz");
    same_as_tar(f, "z.txz");
    same_as_tar(f, "z.tzst");
    pv_status st; /* tar(1) cannot tell lz4 by itself */
    assert_int_equal(extract(f, "z.tlz4", "x4", &st), PV_OK);
    char p[256];
    snprintf(p, sizeof p, "%s/x4/a/b/c/big", f->dir);
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(extract(f, "fifo.tar", "xf", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "entry \"p\" is a fifo"));
    assert_int_equal(extract(f, "junk.tar", "xj", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "not an archive"));
    assert_int_equal(extract(f, "missing.tar", "xm", &st), PV_NOT_FOUND);
}

/* A hard link may not reach outside through a link the archive made, nor link a host file by an
 * absolute target (its leading "/" is dropped, as for names). */
static void test_hard_links_stay_inside(void **state) {
    fixture *f = *state;
    pv_test_sh("cd %s && mkdir -p hl && echo secret > hl/secret && /usr/bin/python3 -c \"import "
               "tarfile\n"
               "t = tarfile.open('hl.tar', 'w')\n"
               "l = tarfile.TarInfo('l'); l.type = tarfile.SYMTYPE; l.linkname = '%s/hl'; "
               "t.addfile(l)\n"
               "h = tarfile.TarInfo('h'); h.type = tarfile.LNKTYPE; h.linkname = 'l/secret'; "
               "t.addfile(h)\n"
               "t.close()\n"
               "t = tarfile.open('habs.tar', 'w')\n"
               "h = tarfile.TarInfo('h'); h.type = tarfile.LNKTYPE; h.linkname = '%s/hl/secret'; "
               "t.addfile(h)\n"
               "t.close()\"",
               f->dir, f->dir, f->dir);
    pv_status st;
    assert_int_equal(extract(f, "hl.tar", "xh", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "hard link target l/secret: a symbolic link or a file is in"));
    assert_int_equal(extract(f, "habs.tar", "xh", &st), PV_FAILED_PRECONDITION);
    struct stat sb;
    char p[256];
    snprintf(p, sizeof p, "%s/hl/secret", f->dir);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_nlink, 1); /* linked nowhere */
}

/* Headers that only describe the next entry are refused past 1 MiB (libarchive's limit, the
 * agent's META_MAX of before), names past PATH_MAX here; an mtree archive cannot pull a host
 * file's content in (libarchive reads the file system for it only when told to). */
static void test_limits_and_mtree(void **state) {
    fixture *f = *state;
    pv_test_sh(
        "cd %s && /usr/bin/python3 -c \"import tarfile, io\n"
        "t = tarfile.open('bigpax.tar', 'w', format=tarfile.PAX_FORMAT)\n"
        "i = tarfile.TarInfo('f'); i.size = 1; i.pax_headers = {'comment': 'c' * (2 << 20)}\n"
        "t.addfile(i, io.BytesIO(b'z')); t.close()\n"
        "t = tarfile.open('longname.tar', 'w', format=tarfile.PAX_FORMAT)\n"
        "i = tarfile.TarInfo('d/' * 2500 + 'f'); i.size = 1\n"
        "t.addfile(i, io.BytesIO(b'z')); t.close()\" && "
        "printf '#mtree\\nstolen type=file size=5 contents=%s/src/a/f1\\n' > m.mtree",
        f->dir, f->dir);
    pv_status st;
    assert_int_equal(extract(f, "bigpax.tar", "xp", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "Special header too large"));
    assert_int_equal(extract(f, "longname.tar", "xl", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "is too long"));
    if (extract(f, "m.mtree", "xmt", &st) == PV_OK) {
        char p[256], got[16] = "";
        snprintf(p, sizeof p, "%s/xmt/stolen", f->dir);
        FILE *in = fopen(p, "r");
        if (in) {
            if (!fgets(got, sizeof got, in)) got[0] = '\0';
            fclose(in);
        }
        assert_null(strstr(got, "hello"));
    }
}

static void test_corrupt_and_truncated(void **state) {
    fixture *f = *state;
    /* a/f1's header, its one data block, then a/b/c/big's header at offset 1024 */
    pv_test_sh(
        "cd %s && tar --format=gnu -cf two.tar -C src a/f1 a/b/c/big && cp two.tar trunc.tar && "
        "truncate -s 500000 trunc.tar && cp two.tar corrupt.tar && "
        "printf 'Z' | dd of=corrupt.tar bs=1 seek=1030 conv=notrunc status=none",
        f->dir);
    pv_status st;
    assert_int_equal(extract(f, "trunc.tar", "xt", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "truncated"));
    assert_int_equal(extract(f, "corrupt.tar", "xc", &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "corrupt header at offset 1024"));
}

/* How many entries dir holds. */
static int entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

/* wk_untar_check (BuildImage RAW): the archives extract refuses, and absolute names too; the
 * scratch directory it unpacks into is gone afterwards, whatever the outcome. Runs after the
 * tests above, which made the archives. */
static void test_check(void **state) {
    fixture *f = *state;
    char path[256], work[256];
    snprintf(work, sizeof work, "%s/checkwork", f->dir);
    pv_test_sh("rm -rf %s && mkdir %s", work, work);
    struct {
        const char *archive;
        int code;
        const char *want;
    } cases[] = {
        {"gnu.tar", PV_OK, NULL}, /* a read-only directory, links, long names: all fine */
        {"posix.tar", PV_OK, NULL},
        {"abs.tar", PV_FAILED_PRECONDITION, "is an absolute path"},
        {"dd.tar", PV_FAILED_PRECONDITION, "entry \"../evil\" names \"..\""},
        {"esc.tar", PV_FAILED_PRECONDITION, "entry esc/pwned: a symbolic link"},
        {"dev.tar", PV_FAILED_PRECONDITION, "entry \"mem\" is a character device"},
        {"fifo.tar", PV_FAILED_PRECONDITION, "entry \"p\" is a fifo"},
        {"z.tgz", PV_OK, NULL}, /* read directly */
        {"devgz.tgz", PV_FAILED_PRECONDITION, "entry \"mem\" is a character device"},
        {"hl.tar", PV_FAILED_PRECONDITION, "hard link target l/secret: a symbolic link"},
        {"junk.tar", PV_UNIMPLEMENTED, "not an archive"}, /* another engine's image, maybe */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pv_status st = {0};
        snprintf(path, sizeof path, "%s/%s", f->dir, cases[i].archive);
        int rc = wk_untar_check(path, work, &st);
        if (rc != cases[i].code) fail_msg("%s: %d (%s)", cases[i].archive, rc, st.msg);
        if (cases[i].want && !strstr(st.msg, cases[i].want))
            fail_msg("%s: %s", cases[i].archive, st.msg);
        if (entries(work) != 0)
            fail_msg("%s: the scratch directory is left in %s", cases[i].archive, work);
    }
    char p[256];
    snprintf(p, sizeof p, "%s/outside/pwned", f->dir);
    assert_int_equal(access(p, F_OK), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_formats_match_tar),
        cmocka_unit_test(test_short_formats_match_tar),
        cmocka_unit_test(test_absolute_names_stay_inside),
        cmocka_unit_test(test_dotdot_refused),
        cmocka_unit_test(test_no_write_through_own_symlink),
        cmocka_unit_test(test_devices_refused),
        cmocka_unit_test(test_compressed_fifos_and_junk),
        cmocka_unit_test(test_hard_links_stay_inside),
        cmocka_unit_test(test_limits_and_mtree),
        cmocka_unit_test(test_corrupt_and_truncated),
        cmocka_unit_test(test_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
