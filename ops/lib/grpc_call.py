#!/usr/bin/python3
"""Make one unary gRPC call with raw bytes and report its status.

Usage: grpc_call.py [--data-hex HEX] [--timeout S] [--wait S] [-H key:value]... ADDR METHOD

METHOD is the full path (/pb.CoreRPC/Info); the request body is the message bytes (empty by
default: an empty message). Prints "OK <n> bytes <hex>" and exits 0 when the call returns
grpc-status 0; prints the status code and message and exits 1 otherwise. With --wait the call is
retried while the server is UNAVAILABLE (still starting). No generated stubs are needed. Run it
with /usr/bin/python3 (Debian's grpc).
"""
import argparse
import sys
import time

import grpc


def call(addr, method, body, timeout, metadata):
    with grpc.insecure_channel(addr) as channel:
        fn = channel.unary_unary(method)
        return fn(body, timeout=timeout, metadata=metadata or None)


def main():
    p = argparse.ArgumentParser(description="one raw unary gRPC call")
    p.add_argument("--data-hex", default="", help="request message bytes in hex")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--wait", type=float, default=0.0,
                   help="retry for up to this many seconds while UNAVAILABLE")
    p.add_argument("-H", dest="headers", action="append", default=[], help="metadata key:value")
    p.add_argument("addr")
    p.add_argument("method")
    args = p.parse_args()

    metadata = []
    for h in args.headers:
        key, sep, value = h.partition(":")
        if not sep:
            p.error("-H wants key:value, got %r" % h)
        metadata.append((key.strip().lower(), value.strip()))
    body = bytes.fromhex(args.data_hex)
    deadline = time.monotonic() + args.wait
    while True:
        try:
            reply = call(args.addr, args.method, body, args.timeout, metadata)
            print("OK %d bytes %s" % (len(reply), reply.hex()))
            return 0
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            print("%s (%d): %s" % (e.code().name, e.code().value[0], e.details()), file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
