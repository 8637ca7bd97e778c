/* Fuzz target: image archives (wk_untar). The bytes are an archive in any format and compression
 * libarchive reads; wk_untar_check and wk_untar_extract unpack it into a root inside a box
 * directory of its own, and afterwards nothing may have landed beside the root (the box holds
 * exactly what the target put there, its sentinel unchanged), the check's scratch directory is
 * gone, and the root holds no device node, fifo or socket. Each input starts from an empty
 * root; the box is made once per process and removed at exit. */
#include <fcntl.h>
#include <ftw.h>
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_untar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) __builtin_trap();                                                             \
    } while (0)

#define SENTINEL "the box's own file"

static char box[64];
static char in[128], root[128], work[128], sentinel[128];

/* Directories may have come out read-only: opened up on the way down, removed on the way up. */
static int open_up(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)ftw;
    if (flag == FTW_D && !S_ISLNK(sb->st_mode)) chmod(path, 0700);
    return 0;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) * 0; /* best effort: go on */
}

static void rm_tree(const char *dir) {
    nftw(dir, open_up, 32, FTW_PHYS | FTW_MOUNT);
    nftw(dir, remove_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

static void remove_box(void) {
    rm_tree(box);
}

static void make_box(void) {
    snprintf(box, sizeof box, "/tmp/pv-fuzz-untar-XXXXXX");
    CHECK(mkdtemp(box));
    snprintf(in, sizeof in, "%s/in", box);
    snprintf(root, sizeof root, "%s/root", box);
    snprintf(work, sizeof work, "%s/work", box);
    snprintf(sentinel, sizeof sentinel, "%s/sentinel", box);
    CHECK(mkdir(work, 0700) == 0);
    FILE *f = fopen(sentinel, "w");
    CHECK(f && fputs(SENTINEL, f) >= 0 && fclose(f) == 0);
    atexit(remove_box);
}

static void write_input(const uint8_t *data, size_t size) {
    int fd = open(in, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    for (size_t off = 0; off < size;) {
        ssize_t n = write(fd, data + off, size - off);
        CHECK(n > 0);
        off += (size_t)n;
    }
    CHECK(close(fd) == 0);
}

/* How many entries dir holds; *other when one is not among the names given (NULL-terminated). */
static int count_entries(const char *dir, const char *const *known, bool *other) {
    DIR *d = opendir(dir);
    CHECK(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        bool found = false;
        for (size_t i = 0; known && known[i]; i++)
            found = found || strcmp(e->d_name, known[i]) == 0;
        if (!found) *other = true;
        n++;
    }
    closedir(d);
    return n;
}

/* Nothing in the root may be what images may not hold. */
static int no_special(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)path;
    (void)flag;
    (void)ftw;
    CHECK(!S_ISCHR(sb->st_mode) && !S_ISBLK(sb->st_mode) && !S_ISFIFO(sb->st_mode) &&
          !S_ISSOCK(sb->st_mode));
    return 0;
}

static void check_box(void) {
    static const char *const known[] = {"in", "root", "work", "sentinel", NULL};
    bool other = false;
    CHECK(count_entries(box, known, &other) == 4 && !other);
    other = false;
    CHECK(count_entries(work, NULL, &other) == 0); /* the check's scratch is gone */
    char got[sizeof SENTINEL + 8] = "";
    FILE *f = fopen(sentinel, "r");
    CHECK(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    CHECK(n == strlen(SENTINEL) && memcmp(got, SENTINEL, n) == 0);
    nftw(root, no_special, 32, FTW_PHYS | FTW_MOUNT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!box[0]) make_box();
    write_input(data, size);
    CHECK(mkdir(root, 0755) == 0);
    pv_status st = {0};
    int rc = wk_untar_check(in, work, &st);
    CHECK(rc == PV_OK || st.msg[0]);
    rc = wk_untar_extract(in, root, false, &st);
    CHECK(rc == PV_OK || st.msg[0]);
    check_box();
    rm_tree(root);
    return 0;
}
