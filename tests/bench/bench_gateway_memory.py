"""The gateway's resident memory before, during and after a burst of large requests.

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/bench_gateway_memory.py [--rounds N]

A private Redis and one gateway (the release build, its 16 default pool threads). Idle RSS is
read after a warm-up of small calls; then 8 client threads send, per round, 1 MiB requests
(UpdateCluster with 1 MiB of labels, decoded and answered NOT_FOUND) and 10,000-entry requests
(ListClusters filtering on 10,000 labels, each turned into JSON), so every pool thread decodes
large messages at once (--set KEY=VALUE changes the gateway's configuration, e.g.
gateway.malloc_arenas=0 gateway.memory_trim_idle_ms=0 for glibc's behaviour). RSS is sampled every 20 ms during the burst (peak) and read again
--settle seconds after the last answer (after). Goal: after <= 50 MB, about what it was idle.
Figures come from /proc/<pid>/status (VmRSS, VmHWM)."""
import argparse
import os
import sys
import threading
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import pvtest  # noqa: E402
sys.path.insert(0, os.path.join(pvtest.BUILD_DIR, "py"))
from pivirt.cluster.v1 import cluster_pb2 as C, cluster_pb2_grpc as CG  # noqa: E402

GOAL_MB = 50.0


def status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def mb(kb):
    return kb / 1024.0


def burst(stub, rounds, errors):
    big = C.UpdateClusterRequest(cluster_id="nope", update_labels=True,
                                 labels={"k%d" % i: "v" * 1000 for i in range(1024)})
    many = C.ListClustersRequest(labels={"k%d" % i: "v%d" % i for i in range(10000)})
    for _ in range(rounds):
        try:
            stub.UpdateCluster(big, timeout=30)
            errors.append("UpdateCluster of an unknown cluster answered OK")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                errors.append("UpdateCluster: %s %s" % (e.code(), e.details()))
        try:
            list(stub.ListClusters(many, timeout=30))
        except grpc.RpcError as e:
            errors.append("ListClusters: %s %s" % (e.code(), e.details()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50, help="rounds per client thread (8 threads)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds idle before 'after'")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a gateway configuration key, e.g. gateway.malloc_arenas=0 (repeatable)")
    args = ap.parse_args()
    config = {"log.level": "warn"}
    for kv in args.set:
        key, _, value = kv.partition("=")
        config[key] = int(value) if value.lstrip("-").isdigit() else value
    stack = pvtest.Stack(gateways=1, config=config)
    stack.start()
    try:
        pid = stack.gateways[0].proc.pid
        stub = CG.ClusterServiceStub(stack.channel(0))
        for _ in range(50):
            list(stub.ListClusters(C.ListClustersRequest(), timeout=10))
        time.sleep(1)
        idle = status_kb(pid, "VmRSS")
        peak, done, errors = [idle], threading.Event(), []

        def sample():
            while not done.is_set():
                peak.append(status_kb(pid, "VmRSS"))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        clients = [threading.Thread(target=burst, args=(CG.ClusterServiceStub(
            stack.channel(0)), args.rounds, errors)) for _ in range(8)]
        t0 = time.monotonic()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        took = time.monotonic() - t0
        done.set()
        sampler.join()
        time.sleep(args.settle)
        after = status_kb(pid, "VmRSS")
        hwm = status_kb(pid, "VmHWM")
        if errors:
            print("bench gateway-memory: error: %s" % errors[0], file=sys.stderr)
            return 1
        n = 8 * args.rounds
        print("bench gateway-memory: %d x 1 MiB UpdateCluster + %d x 10,000-label ListClusters "
              "from 8 clients in %.1f s" % (n, n, took))
        print("  RSS idle     %7.1f MB" % mb(idle))
        print("  RSS peak     %7.1f MB  (sampled; VmHWM %.1f MB)" % (mb(max(peak)), mb(hwm)))
        print("  RSS after    %7.1f MB  %.0f s after the burst (goal <= %.0f MB: %s)"
              % (mb(after), args.settle, GOAL_MB, "met" if mb(after) <= GOAL_MB else "NOT met"))
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
