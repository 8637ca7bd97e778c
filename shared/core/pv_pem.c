/*
 * pv_pem: PEM checks through OpenSSL (see pv_pem.h).
 *
 * OpenSSL reports why a read failed on its per-thread error queue; the reason goes into the
 * message and the queue is emptied on every path, so a later TLS call on the same gateway
 * thread never sees a stale error.
 */
#include "pv_pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>

/* A passphrase callback that has none to give: an encrypted key fails to load, never prompts. */
static int no_passphrase(char *buf, int size, int rwflag, void *u) {
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return -1;
}

static BIO *bio_of(const char *pem) {
    return BIO_new_mem_buf(pem, (int)strnlen(pem, (size_t)0x7fffffff));
}

/* OpenSSL's reason for the last failure, then an empty error queue. */
static const char *reason(char *buf, size_t size) {
    unsigned long e = ERR_peek_last_error();
    if (e)
        ERR_error_string_n(e, buf, size);
    else
        snprintf(buf, size, "no PEM data");
    ERR_clear_error();
    return buf;
}

/* Whether the error queue holds only "no start line": the end of a PEM bundle. */
static int at_end(void) {
    unsigned long e = ERR_peek_last_error();
    return ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
}

int pv_pem_check_certs(const char *field, const char *pem, pv_status *st) {
    if (!pem || !*pem) return PV_OK;
    BIO *b = bio_of(pem);
    if (!b) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", field);
    int n = 0, rc = PV_OK;
    char why[256];
    for (;;) {
        X509 *x = PEM_read_bio_X509(b, NULL, no_passphrase, NULL);
        if (!x) {
            if (n > 0 && at_end()) {
                ERR_clear_error();
                break;
            }
            rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not a PEM certificate (%s)", field,
                               reason(why, sizeof why));
            break;
        }
        X509_free(x);
        n++;
    }
    BIO_free(b);
    return rc;
}

int pv_pem_check_key(const char *field, const char *pem, pv_status *st) {
    if (!pem || !*pem) return PV_OK;
    BIO *b = bio_of(pem);
    if (!b) return pv_status_set(st, PV_INTERNAL, "%s: out of memory", field);
    EVP_PKEY *k = PEM_read_bio_PrivateKey(b, NULL, no_passphrase, NULL);
    BIO_free(b);
    char why[256];
    if (!k)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not an unencrypted PEM private key (%s)",
                             field, reason(why, sizeof why));
    EVP_PKEY_free(k);
    ERR_clear_error();
    return PV_OK;
}

int pv_pem_check_pair(const char *cert_field, const char *cert, const char *key_field,
                      const char *key, pv_status *st) {
    if (!cert || !*cert || !key || !*key) return PV_OK;
    BIO *cb = bio_of(cert), *kb = bio_of(key);
    X509 *x = cb ? PEM_read_bio_X509(cb, NULL, no_passphrase, NULL) : NULL;
    EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, no_passphrase, NULL) : NULL;
    int rc = PV_OK;
    if (!x || !k)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s, %s: unreadable", cert_field, key_field);
    else if (X509_check_private_key(x, k) != 1)
        rc = pv_status_set(st, PV_INVALID_ARGUMENT, "%s: is not the private key of %s", key_field,
                           cert_field);
    ERR_clear_error();
    X509_free(x);
    EVP_PKEY_free(k);
    BIO_free(cb);
    BIO_free(kb);
    return rc;
}
