/*
 * Unit tests of pv_pem: a certificate and key made here with OpenSSL pass, alone and as a pair;
 * text that is not PEM, a truncated certificate, a key given as a certificate (and the reverse),
 * an encrypted key and a key that is not the certificate's are refused naming the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <string.h>

#include "pv_pem.h"

/* BIO's contents as a NUL-terminated string (caller frees). */
static char *text_of(BIO *b) {
    char *data;
    long n = BIO_get_mem_data(b, &data);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    memcpy(s, data, (size_t)n);
    s[n] = '\0';
    BIO_free(b);
    return s;
}

static char *key_pem(EVP_PKEY *k, const char *pass) {
    BIO *b = BIO_new(BIO_s_mem());
    const EVP_CIPHER *c = pass ? EVP_aes_128_cbc() : NULL;
    assert_int_equal(PEM_write_bio_PrivateKey(b, k, c, (unsigned char *)pass,
                                              pass ? (int)strlen(pass) : 0, NULL, NULL),
                     1);
    return text_of(b);
}

/* A self-signed certificate for k. */
static char *cert_pem(EVP_PKEY *k) {
    X509 *x = X509_new();
    assert_non_null(x);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"node", -1, -1, 0);
    X509_set_issuer_name(x, n);
    assert_true(X509_sign(x, k, EVP_sha256()) > 0);
    BIO *b = BIO_new(BIO_s_mem());
    assert_int_equal(PEM_write_bio_X509(b, x), 1);
    X509_free(x);
    return text_of(b);
}

static void test_pem(void **state) {
    (void)state;
    EVP_PKEY *k = EVP_EC_gen("P-256"), *other = EVP_EC_gen("P-256");
    assert_non_null(k);
    assert_non_null(other);
    char *cert = cert_pem(k), *key = key_pem(k, NULL), *enc = key_pem(k, "secret");
    char *other_key = key_pem(other, NULL);
    pv_status st;
    assert_int_equal(pv_pem_check_certs("ca", "", &st), PV_OK); /* not given */
    assert_int_equal(pv_pem_check_certs("ca", cert, &st), PV_OK);
    size_t n = strlen(cert);
    char *bundle = malloc(2 * n + 1);
    assert_non_null(bundle);
    memcpy(bundle, cert, n);
    memcpy(bundle + n, cert, n + 1);
    assert_int_equal(pv_pem_check_certs("ca", bundle, &st), PV_OK);
    assert_int_equal(pv_pem_check_key("key", key, &st), PV_OK);
    assert_int_equal(pv_pem_check_pair("cert", cert, "key", key, &st), PV_OK);

    assert_int_equal(pv_pem_check_certs("ca", "hello", &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "ca: not a PEM certificate ("));
    cert[n / 2] = '\0'; /* cut in the middle */
    assert_int_equal(pv_pem_check_certs("cert", cert, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "cert: not a PEM certificate"));
    assert_int_equal(pv_pem_check_certs("cert", key, &st), PV_INVALID_ARGUMENT);
    assert_int_equal(pv_pem_check_key("key", bundle, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "key: not an unencrypted PEM private key"));
    assert_int_equal(pv_pem_check_key("key", enc, &st), PV_INVALID_ARGUMENT);
    assert_null(strstr(st.msg, "PRIVATE KEY-----")); /* the key's text is never echoed */
    assert_int_equal(pv_pem_check_pair("cert", bundle, "key", other_key, &st), PV_INVALID_ARGUMENT);
    assert_string_equal(st.msg, "key: is not the private key of cert");
    free(bundle);
    free(cert);
    free(key);
    free(enc);
    free(other_key);
    EVP_PKEY_free(k);
    EVP_PKEY_free(other);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
