#!/usr/bin/python3
"""Ask gRPC servers whether they are SERVING (grpc.health.v1.Health/Check).

Usage: grpc_health.py [--service NAME] [--timeout SECONDS] [--wait SECONDS] [-q] ADDR...

Uses raw bytes so no generated stubs are needed: the request is a
HealthCheckRequest (field 1 = service name, empty for the whole server), the
reply b'\\x08\\x01' is {status: SERVING}. With --wait the check is retried until
every address is SERVING or the time is up. Exit status: 0 when every address
is SERVING, 1 otherwise (one line per address says what was wrong), 2 on bad
usage. Must run with /usr/bin/python3: Debian's grpc only imports there.
"""
import argparse
import sys
import time

import grpc

METHOD = "/grpc.health.v1.Health/Check"
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def varint(n):
    """n as a protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_request(service):
    """HealthCheckRequest{service} on the wire (empty message for '')."""
    if not service:
        return b""
    raw = service.encode()
    return b"\x0a" + varint(len(raw)) + raw


def decode_status(reply):
    """HealthCheckResponse.status from its wire form (field 1, varint)."""
    if not reply:
        return 0
    if reply[0] != 0x08:
        raise ValueError("unexpected health reply %r" % reply)
    value, shift = 0, 0
    for b in reply[1:]:
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return value


def check(addr, service="", timeout=2.0):
    """Returns (ok, text) for one address."""
    with grpc.insecure_channel(addr) as channel:
        call = channel.unary_unary(METHOD)
        try:
            reply = call(encode_request(service), timeout=timeout)
        except grpc.RpcError as e:
            return False, "%s: %s" % (e.code().name, e.details())
    status = decode_status(reply)
    name = STATUS_NAMES.get(status, str(status))
    return status == 1, name


def main():
    p = argparse.ArgumentParser(description="gRPC health check (raw bytes, no stubs)")
    p.add_argument("--service", default="", help="service name ('' = the whole server)")
    p.add_argument("--timeout", type=float, default=2.0, help="per-call deadline in seconds")
    p.add_argument("--wait", type=float, default=0.0,
                   help="retry until SERVING for up to this many seconds")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    p.add_argument("addrs", nargs="+", metavar="ADDR", help="host:port")
    args = p.parse_args()

    deadline = time.monotonic() + args.wait
    pending = list(args.addrs)
    results = {}
    while True:
        still = []
        for addr in pending:
            ok, text = check(addr, args.service, args.timeout)
            results[addr] = text
            if not ok:
                still.append(addr)
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.2)

    for addr in args.addrs:
        ok = addr not in pending
        if not ok or not args.quiet:
            what = args.service or '""'
            print("%s %s %s" % (addr, what, results[addr]),
                  file=sys.stdout if ok else sys.stderr)
    return 0 if not pending else 1


if __name__ == "__main__":
    sys.exit(main())
