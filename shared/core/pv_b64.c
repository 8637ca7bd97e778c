/*
 * pv_b64: base64 through OpenSSL's EVP block coders (see pv_b64.h). EVP_DecodeBlock counts the
 * padding as zero bytes, so the decoded length is corrected for the '=' characters.
 */
#include "pv_b64.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

int pv_b64_encode(const void *data, size_t len, char **out, pv_status *st) {
    *out = NULL;
    if (len > (size_t)1 << 30) return pv_status_set(st, PV_INVALID_ARGUMENT, "value too large");
    char *buf = malloc(4 * ((len + 2) / 3) + 1);
    if (!buf) return pv_status_set(st, PV_INTERNAL, "out of memory");
    EVP_EncodeBlock((unsigned char *)buf, data, (int)len);
    *out = buf;
    return PV_OK;
}

int pv_b64_decode(const char *field, const char *text, unsigned char **out, size_t *out_len,
                  pv_status *st) {
    *out = NULL;
    *out_len = 0;
    size_t n = text ? strlen(text) : 0;
    if (n % 4 != 0 || n > (size_t)1 << 30)
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not base64 (length %zu)", field, n);
    unsigned char *buf = malloc(n / 4 * 3 + 1);
    if (!buf) return pv_status_set(st, PV_INTERNAL, "out of memory");
    int got = n ? EVP_DecodeBlock(buf, (const unsigned char *)text, (int)n) : 0;
    if (got < 0) {
        free(buf);
        return pv_status_set(st, PV_INVALID_ARGUMENT, "%s: not base64", field);
    }
    size_t pad = (n >= 1 && text[n - 1] == '=') + (n >= 2 && text[n - 2] == '=');
    *out_len = (size_t)got - pad;
    buf[*out_len] = '\0';
    *out = buf;
    return PV_OK;
}
