/*
 * gw_reflection: gRPC server reflection (grpc.reflection.v1 and v1alpha) from the descriptor
 * set embedded at build time, so grpcurl and `buf curl` work with no .proto at hand.
 *
 * Ownership: gw_reflection_new copies nothing from desc (it must stay valid: it is the embedded
 * array); the returned object owns its index and is freed with gw_reflection_free after the
 * server that uses it is gone.
 */
#ifndef GW_REFLECTION_H
#define GW_REFLECTION_H

#include <stddef.h>

#include "gw_server.h"

typedef struct gw_reflection gw_reflection;

/* Parses a serialized FileDescriptorSet. Returns NULL and a message in err on failure. */
gw_reflection *gw_reflection_new(const unsigned char *desc, size_t len, char *err, size_t errlen);
void gw_reflection_free(gw_reflection *r);

/* Fully qualified names of the services declared in the set ("pb.CoreRPC", ...). */
size_t gw_reflection_service_count(const gw_reflection *r);
const char *gw_reflection_service(const gw_reflection *r, size_t i);

/* True when name is a method path "/pkg.Service/Method" the set declares. */
int gw_reflection_has_method(const gw_reflection *r, const char *path);

/* Registers ServerReflectionInfo of v1 and v1alpha. no_auth exempts them from auth. */
int gw_reflection_register(gw_reflection *r, gw_server *s, int no_auth);

#endif
