/*
 * Unit tests of pv_id: the id format, the time carried in a ULID, uniqueness over 100k ids,
 * ordering across milliseconds, prefix limits, and SHA-256 against published vectors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pv_id.h"

static const char alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";

static uint64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The 48-bit millisecond time in the first 10 characters of a ULID. */
static uint64_t ulid_ms(const char *ulid) {
    uint64_t ms = 0;
    for (int i = 0; i < 10; i++) {
        const char *p = strchr(alphabet, ulid[i]);
        assert_non_null(p);
        ms = (ms << 5) | (uint64_t)(p - alphabet);
    }
    return ms;
}

static void test_format(void **state) {
    (void)state;
    char id[PV_ID_MAX];
    assert_int_equal(pv_id_new("op", id, sizeof(id)), 0);
    assert_int_equal(strlen(id), 3 + 26);
    assert_memory_equal(id, "op-", 3);
    for (int i = 3; i < 29; i++)
        assert_non_null(strchr(alphabet, id[i]));
    assert_true(id[3] <= '7'); /* 48 bits in 50: the first character holds 3 bits */
}

static void test_time_part_is_now(void **state) {
    (void)state;
    uint64_t before = wall_ms();
    char id[PV_ID_MAX];
    assert_int_equal(pv_id_new("vol", id, sizeof(id)), 0);
    uint64_t after = wall_ms();
    uint64_t ms = ulid_ms(id + 4);
    assert_true(ms >= before && ms <= after);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp((const char *)a, (const char *)b);
}

#define N_IDS 100000

static void test_unique_and_time_ordered(void **state) {
    (void)state;
    char(*ids)[PV_ID_MAX] = calloc(N_IDS, PV_ID_MAX);
    assert_non_null(ids);
    for (int i = 0; i < N_IDS; i++)
        assert_int_equal(pv_id_new("n", ids[i], PV_ID_MAX), 0);
    /* In creation order the time part never goes back. */
    for (int i = 1; i < N_IDS; i++)
        assert_true(memcmp(ids[i - 1] + 2, ids[i] + 2, 10) <= 0);
    qsort(ids, N_IDS, PV_ID_MAX, cmp_str);
    int dups = 0;
    for (int i = 1; i < N_IDS; i++)
        dups += strcmp(ids[i - 1], ids[i]) == 0;
    assert_int_equal(dups, 0);
    free(ids);
}

static void test_sorts_across_milliseconds(void **state) {
    (void)state;
    for (int round = 0; round < 20; round++) {
        char a[PV_ID_MAX], b[PV_ID_MAX];
        assert_int_equal(pv_id_new("op", a, sizeof(a)), 0);
        struct timespec two_ms = {0, 2 * 1000 * 1000};
        nanosleep(&two_ms, NULL);
        assert_int_equal(pv_id_new("op", b, sizeof(b)), 0);
        assert_true(ulid_ms(b + 3) > ulid_ms(a + 3));
        assert_true(strcmp(a, b) < 0);
    }
}

static void test_prefix_limits(void **state) {
    (void)state;
    char id[PV_ID_MAX];
    char prefix[64];
    memset(prefix, 'p', 36);
    prefix[36] = '\0';
    assert_int_equal(pv_id_new(prefix, id, sizeof(id)), 0); /* 36 + 1 + 26 + NUL = 64 */
    assert_int_equal(strlen(id), 63);
    prefix[36] = 'p';
    prefix[37] = '\0';
    assert_int_equal(pv_id_new(prefix, id, sizeof(id)), -1);
    char small[20];
    assert_int_equal(pv_id_new("op", small, sizeof(small)), -1);
    char exact[30];
    assert_int_equal(pv_id_new("op", exact, sizeof(exact)), 0);
}

static void test_empty_prefix_is_bare_ulid(void **state) {
    (void)state;
    char id[PV_ID_MAX];
    assert_int_equal(pv_id_new("", id, sizeof(id)), 0);
    assert_int_equal(strlen(id), 26);
    assert_int_equal(pv_id_new(NULL, id, sizeof(id)), 0);
    assert_int_equal(strlen(id), 26);
}

static void test_sha256_vectors(void **state) {
    (void)state;
    char hex[65];
    pv_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    pv_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    pv_sha256_hex(two_blocks, strlen(two_blocks), hex);
    assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    size_t n = 1000000;
    char *million = malloc(n);
    assert_non_null(million);
    memset(million, 'a', n);
    pv_sha256_hex(million, n, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

/* Client references: what could be an id or a name passes, anything else is refused naming the
 * field with the value quoted and cut, never echoed whole. */
static void test_id_check(void **state) {
    (void)state;
    pv_status st;
    assert_int_equal(pv_id_check("cluster_id", "cluster-01jabcdefghjkmnpqrstvwxyz0", &st), PV_OK);
    char hex[65];
    memset(hex, 'e', 64);
    hex[64] = '\0';
    assert_int_equal(pv_id_check("id", hex, &st), PV_OK);
    assert_int_equal(pv_id_check("cluster_id", "", &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "cluster_id: is required");
    assert_int_equal(pv_id_check("cluster_id", NULL, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(pv_id_check("cluster_id", "a/b", &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "cluster_id: \"a/b\" must not contain '/'");
    assert_int_equal(pv_id_check("node_id", "x..y", &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "node_id: \"x..y\" must not contain \"..\"");
    assert_int_equal(pv_id_check("node_id", "-rf", &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "node_id: \"-rf\" must not start with '-'");
    assert_int_equal(pv_id_check("node_id", "a\nb", &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "node_id: \"a\\x0ab\" has a character other than letters, "
                                "digits, '.', '_' and '-' at byte 1");
    size_t big = 1u << 20;
    char *huge = malloc(big + 1);
    assert_non_null(huge);
    memset(huge, 'a', big);
    huge[big] = '\0';
    assert_int_equal(pv_id_check("cluster_id", huge, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "(1048576 bytes) is longer than 128 bytes"));
    assert_true(strlen(st.msg) < 200); /* cut, not echoed */
    huge[PV_ID_REF_MAX] = '\0';
    assert_int_equal(pv_id_check("cluster_id", huge, &st), PV_OK);
    free(huge);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_id_check),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_time_part_is_now),
        cmocka_unit_test(test_unique_and_time_ordered),
        cmocka_unit_test(test_sorts_across_milliseconds),
        cmocka_unit_test(test_prefix_limits),
        cmocka_unit_test(test_empty_prefix_is_bare_ulid),
        cmocka_unit_test(test_sha256_vectors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
