/* For builds without libFuzzer (gcc, the sanitizer build of ./ops/pivirt test): runs a fuzz
 * target over the files given (the seed corpus and the regressions found earlier), then, when
 * PV_FUZZ_SECONDS is set, on random mutations of them for that long: bit flips, byte and
 * integer overwrites, insertions, deletions and splices of two seeds. No coverage steers it
 * (that is `./ops/pivirt fuzz` with libFuzzer); it keeps every target exercised under ASan and
 * UBSan in each test run. An input that crashes is written to fuzz-crash-<target>-<n> in the
 * working directory before the process dies, and its path printed. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SEEDS 256
#define FUZZ_MAX_INPUT 65536

typedef struct seed {
    uint8_t *data;
    size_t size;
} seed;

static seed seeds[MAX_SEEDS];
static size_t n_seeds;

/* The input being run, for the crash handler (written with write(2) only). */
static const uint8_t *current;
static size_t current_size;
static char crash_path[512];

static void save_current(void) {
    if (!current) return;
    int fd = creat(crash_path, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, current, current_size);
    (void)w;
    close(fd);
    static const char msg[] = "fuzz: the crashing input is in ";
    w = write(2, msg, sizeof msg - 1);
    w = write(2, crash_path, strlen(crash_path));
    w = write(2, "\n", 1);
    current = NULL;
}

static void on_fatal_signal(int sig) {
    save_current();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Sanitizers report and exit through their own death path, not a signal. */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static void run(const uint8_t *data, size_t size) {
    current = data;
    current_size = size;
    LLVMFuzzerTestOneInput(data, size);
    current = NULL;
}

static int load_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t cap = n > 0 ? (size_t)n : 0;
    if (cap > FUZZ_MAX_INPUT) cap = FUZZ_MAX_INPUT;
    uint8_t *buf = malloc(cap ? cap : 1);
    size_t got = buf ? fread(buf, 1, cap, f) : 0;
    fclose(f);
    if (!buf) return -1;
    run(buf, got);
    if (n_seeds < MAX_SEEDS) {
        seeds[n_seeds].data = buf;
        seeds[n_seeds++].size = got;
    } else {
        free(buf);
    }
    return 0;
}

/* xorshift64*: reproducible from the seed printed at start. */
static uint64_t rng_state;
static uint64_t rnd(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}
static size_t below(size_t n) {
    return n ? (size_t)(rnd() % n) : 0;
}

/* One mutation of buf (size *n, capacity FUZZ_MAX_INPUT) in place. */
static void mutate(uint8_t *buf, size_t *n) {
    static const int64_t interesting[] = {
        0,         1,        -1,     0x7f,       0x80,
        0xff,      0x7fff,   0xffff, 0x7fffffff, (int64_t)0x80000000LL,
        INT64_MAX, INT64_MIN};
    switch (below(7)) {
    case 0: /* flip a bit */
        if (*n) buf[below(*n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* set a byte */
        if (*n) buf[below(*n)] = (uint8_t)rnd();
        break;
    case 2: { /* an interesting integer over some bytes */
        int64_t v = interesting[below(sizeof interesting / sizeof interesting[0])];
        size_t w = (size_t)1 << below(4);
        if (*n >= w) memcpy(buf + below(*n - w + 1), &v, w);
        break;
    }
    case 3: { /* insert random bytes */
        size_t k = 1 + below(8);
        if (*n + k > FUZZ_MAX_INPUT) break;
        size_t at = below(*n + 1);
        memmove(buf + at + k, buf + at, *n - at);
        for (size_t i = 0; i < k; i++)
            buf[at + i] = (uint8_t)rnd();
        *n += k;
        break;
    }
    case 4: { /* delete a run */
        if (!*n) break;
        size_t at = below(*n), k = 1 + below(*n - at);
        memmove(buf + at, buf + at + k, *n - at - k);
        *n -= k;
        break;
    }
    case 5: { /* duplicate a run (grows repetitions: nesting, long names) */
        if (!*n) break;
        size_t at = below(*n), k = 1 + below(*n - at);
        if (*n + k > FUZZ_MAX_INPUT) break;
        memmove(buf + at + k, buf + at, *n - at);
        *n += k;
        break;
    }
    default: { /* splice: the tail of another seed */
        const seed *o = &seeds[below(n_seeds)];
        size_t at = below(*n + 1), from = below(o->size + 1), k = o->size - from;
        if (at + k > FUZZ_MAX_INPUT) k = FUZZ_MAX_INPUT - at;
        memcpy(buf + at, o->data + from, k);
        *n = at + k;
        break;
    }
    }
}

static long mutate_for(double seconds) {
    uint8_t *buf = malloc(FUZZ_MAX_INPUT);
    if (!buf) return 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long runs = 0;
    for (;;) {
        if ((runs & 63) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 >= seconds) break;
        }
        const seed *s = &seeds[below(n_seeds)];
        size_t n = s->size;
        memcpy(buf, s->data, n);
        for (size_t k = 1 + below(4); k-- > 0;)
            mutate(buf, &n);
        run(buf, n);
        runs++;
    }
    free(buf);
    return runs;
}

int main(int argc, char **argv) {
    const char *base = strrchr(argv[0], '/');
    snprintf(crash_path, sizeof crash_path, "fuzz-crash-%s-%ld", base ? base + 1 : argv[0],
             (long)getpid());
    static const int fatal[] = {SIGILL, SIGABRT, SIGSEGV, SIGFPE, SIGBUS, SIGTRAP};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        signal(fatal[i], on_fatal_signal);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(save_current);

    int files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) continue;
        if (!S_ISDIR(sb.st_mode)) {
            files += load_file(argv[i]) == 0;
            continue;
        }
        DIR *d = opendir(argv[i]);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            files += load_file(path) == 0;
        }
        if (d) closedir(d);
    }
    printf("%d inputs replayed\n", files);
    const char *secs = getenv("PV_FUZZ_SECONDS");
    if (files > 0 && secs && atof(secs) > 0) {
        const char *fixed = getenv("PV_FUZZ_SEED");
        rng_state = fixed ? strtoull(fixed, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
        if (!rng_state) rng_state = 1;
        printf("mutating for %s s (PV_FUZZ_SEED=%llu)\n", secs, (unsigned long long)rng_state);
        fflush(stdout);
        long runs = mutate_for(atof(secs));
        printf("%ld mutated inputs, no crash\n", runs);
    }
    for (size_t i = 0; i < n_seeds; i++)
        free(seeds[i].data);
    return files > 0 ? 0 : 1;
}
