/*
 * wk_uids: host-wide claims of dynamic user ids (see wk_uids.h).
 *
 * Claims are small files rather than Redis keys: the uids belong to the machine, not to the
 * cluster, and the agents that share a machine may serve different clusters (or none may
 * reach Redis when a workload is removed).
 */
#include "wk_uids.h"

#include "wk_files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wk_files.h"

int wk_uids_parse_range(const char *range, uid_t *min, uid_t *max, pv_status *st) {
    unsigned long a = 0, b = 0;
    int used = 0;
    if (!range || sscanf(range, "%lu-%lu%n", &a, &b, &used) != 2 || range[used] != '\0' || a == 0 ||
        a > b || b >= 4294967295UL)
        return pv_status_set(st, PV_INVALID_ARGUMENT,
                             "worker.dynamic_uids: \"%.64s\" is not a range \"MIN-MAX\" of uids "
                             "above 0",
                             range ? range : "");
    *min = (uid_t)a;
    *max = (uid_t)b;
    return PV_OK;
}

/* The lock over every claim in dir; -1 with st set when it cannot be had. */
static int lock_dir(const char *dir, pv_status *st) {
    char path[4200];
    snprintf(path, sizeof path, "%s/.lock", dir);
    if (wk_files_mkdir_p(dir, 0700) != 0) {
        pv_status_set(st, PV_INTERNAL, "dynamic uids: mkdir %s: %s", dir, strerror(errno));
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        pv_status_set(st, PV_INTERNAL, "dynamic uids: %s: %s", path, strerror(errno));
        return -1;
    }
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            pv_status_set(st, PV_INTERNAL, "dynamic uids: flock %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
    return fd;
}

static void unlock_dir(int fd) {
    close(fd); /* releases the flock */
}

/* Who holds uid: 1 with its owner in out, 0 when nobody (or only a stale owner) does. A claim
 * younger than CLAIM_GRACE_S is live even before its owner's directory exists: the claim comes
 * first, the directory next. */
#define CLAIM_GRACE_S 120
static int holder(const char *dir, uid_t uid, char *out, size_t cap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%" PRIuMAX, dir, (uintmax_t)uid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat sb;
    bool young = fstat(fd, &sb) == 0 && time(NULL) - sb.st_mtime < CLAIM_GRACE_S;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n <= 0) return 0;
    out[n] = '\0';
    out[strcspn(out, "\n")] = '\0';
    return out[0] == '/' && (young || access(out, F_OK) == 0);
}

static int write_claim(const char *dir, uid_t uid, const char *owner, pv_status *st) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%" PRIuMAX, dir, (uintmax_t)uid);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (!f || fprintf(f, "%s\n", owner) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return pv_status_set(st, PV_INTERNAL, "dynamic uids: claiming %s: %s", path, strerror(err));
    }
    return PV_OK;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; s && *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

int wk_uids_claim(const char *dir, uid_t min, uid_t max, const char *key, const char *owner,
                  uid_t *uid, pv_status *st) {
    int lock = lock_dir(dir, st);
    if (lock < 0) return st->code;
    uint64_t size = (uint64_t)max - min + 1, start = fnv1a(key) % size;
    int rc =
        pv_status_set(st, PV_RESOURCE_EXHAUSTED,
                      "dynamic uids: all %" PRIu64 " of %u-%u are in use (worker.dynamic_uids)",
                      size, (unsigned)min, (unsigned)max);
    char held[4096];
    for (uint64_t i = 0; i < size; i++) {
        uid_t u = (uid_t)(min + (start + i) % size);
        if (holder(dir, u, held, sizeof held) && strcmp(held, owner) != 0) continue;
        rc = write_claim(dir, u, owner, st);
        if (rc == PV_OK) *uid = u;
        break;
    }
    unlock_dir(lock);
    return rc;
}

int wk_uids_reclaim(const char *dir, uid_t uid, const char *owner, pv_status *st) {
    int lock = lock_dir(dir, st);
    if (lock < 0) return st->code;
    char held[4096];
    int rc;
    if (holder(dir, uid, held, sizeof held) && strcmp(held, owner) != 0)
        rc = pv_status_set(st, PV_FAILED_PRECONDITION, "dynamic uid %u: held by %.200s, not %.200s",
                           (unsigned)uid, held, owner);
    else
        rc = write_claim(dir, uid, owner, st);
    unlock_dir(lock);
    return rc;
}

void wk_uids_release(const char *dir, uid_t uid, const char *owner) {
    pv_status st;
    int lock = lock_dir(dir, &st);
    if (lock < 0) return;
    char held[4096], path[4200];
    snprintf(path, sizeof path, "%s/%" PRIuMAX, dir, (uintmax_t)uid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, held, sizeof held - 1) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) {
        held[n] = '\0';
        held[strcspn(held, "\n")] = '\0';
        if (strcmp(held, owner) == 0) unlink(path);
    }
    unlock_dir(lock);
}
