/*
 * pv_pem: checks of the PEM documents a client hands over (Eru's AddNode/SetNode `ca`, `cert`
 * and `key`, the TLS material of a node's engine), made with OpenSSL's own PEM reader so that
 * what is accepted here is exactly what a TLS client could later load.
 *
 * No state; nothing to free. Encrypted keys are refused: nothing could ever ask for their
 * passphrase.
 */
#ifndef PV_PEM_H
#define PV_PEM_H

#include "pv_status.h"

/* "" or NULL: nothing given, PV_OK. Otherwise one or more PEM certificates (a CA bundle or a
 * certificate with its chain), else INVALID_ARGUMENT naming field and OpenSSL's reason. */
int pv_pem_check_certs(const char *field, const char *pem, pv_status *st);

/* "" or NULL: PV_OK. Otherwise one unencrypted PEM private key (PKCS#8, RSA or EC), else
 * INVALID_ARGUMENT naming field. The key's text is never quoted in the message. */
int pv_pem_check_key(const char *field, const char *pem, pv_status *st);

/* Both given: whether the key is the certificate's (INVALID_ARGUMENT naming both fields). Either
 * empty: PV_OK. Call after the two checks above. */
int pv_pem_check_pair(const char *cert_field, const char *cert, const char *key_field,
                      const char *key, pv_status *st);

#endif
