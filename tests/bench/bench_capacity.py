#!/usr/bin/python3
"""bench capacity: CalculateCapacity through the gateway for a 1,000-node pod (goal: p99 <= 20 ms).

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/bench_capacity.py [--nodes N] [--calls C]

(`./ops/pivirt bench scheduler` runs it after the pure plan benchmark, on the release build.) It
starts its own Redis, gateway and schedulers with the e2e harness (tests/e2e/pvtest.py), registers
a pod of N process:// nodes with cpumem and storage resources through CoreRPC, marks them alive,
then times C sequential CalculateCapacity calls (DUMMY, then AUTO for 1,000 instances) and the
same number of GetPod calls through the same gateway as the baseline of one gateway round trip
that touches Redis; then the same DUMMY calls from 4 client threads at once. Prints p50, p99 and
max per phase, and the ratio of CalculateCapacity's p99 to the baseline's.

Exit status 0 when every phase ran (the goal is reported, not enforced), 1 otherwise.
"""
import argparse
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import pvtest  # noqa: E402

sys.path.insert(0, os.path.join(pvtest.BUILD_DIR, "py"))
from pb import core_pb2, core_pb2_grpc  # noqa: E402

GOAL_MS = 20.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def line(name, xs):
    return "%-36s n=%-5d p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms" % (
        name, len(xs), pct(xs, 50), pct(xs, 99), max(xs))


def timed(fn, calls):
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--schedulers", type=int, default=2)
    args = ap.parse_args()

    stack = pvtest.Stack(gateways=1, schedulers=args.schedulers,
                         config={"log": {"level": "warn"}, "gateway": {"threads": 4}})
    stack.start()
    try:
        core = core_pb2_grpc.CoreRPCStub(stack.channel(0))
        core.AddPod(core_pb2.AddPodOptions(name="bench"), timeout=10)
        t0 = time.monotonic()
        for i in range(args.nodes):
            name = "bn-%05d" % i
            core.AddNode(core_pb2.AddNodeOptions(
                nodename=name, endpoint="process://", podname="bench",
                resources={"cpumem": json.dumps({"cpu": 8 + i % 8,
                                                 "memory": "%dG" % (16 + i % 16)}).encode(),
                           "storage": b'{"storage": "500G"}'}), timeout=10)
            core.SetNodeStatus(core_pb2.SetNodeStatusOptions(nodename=name, ttl=3600), timeout=10)
        print("registered %d nodes in %.1f s" % (args.nodes, time.monotonic() - t0))

        res = {"cpumem": b'{"cpu-request": 0.5, "memory-request": "1G"}',
               "storage": b'{"storage-request": "10G"}'}

        def opts(strategy, count):
            return core_pb2.DeployOptions(
                name="app", entrypoint=core_pb2.EntrypointOptions(name="web"), podname="bench",
                deploy_strategy=strategy, count=count, resources=res)

        dummy, auto = opts(99, 0), opts(0, 1000)
        total = core.CalculateCapacity(dummy, timeout=30).total
        print("pod capacity for the request: %d instances" % total)
        # Warm-up: connections, caches, the schedulers' first requests.
        timed(lambda: core.CalculateCapacity(dummy, timeout=30), 20)

        base = timed(lambda: core.GetPod(core_pb2.GetPodOptions(name="bench"), timeout=30),
                     args.calls)
        cap = timed(lambda: core.CalculateCapacity(dummy, timeout=30), args.calls)
        plan = timed(lambda: core.CalculateCapacity(auto, timeout=30), args.calls)

        par, lock = [], threading.Lock()

        def worker():
            xs = timed(lambda: core.CalculateCapacity(dummy, timeout=30), args.calls // 4)
            with lock:
                par.extend(xs)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        print()
        print("bench capacity: %d-node pod, %d scheduler(s), one gateway (4 threads)" %
              (args.nodes, args.schedulers))
        print(line("GetPod (baseline round trip)", base))
        print(line("CalculateCapacity DUMMY", cap))
        print(line("CalculateCapacity AUTO x1000", plan))
        print(line("CalculateCapacity DUMMY, 4 clients", par))
        p99 = max(pct(cap, 99), pct(plan, 99))
        print("p99 ratio to the baseline: DUMMY %.1fx, AUTO %.1fx" %
              (pct(cap, 99) / pct(base, 99), pct(plan, 99) / pct(base, 99)))
        print("goal p99 <= %.0f ms (sequential): %s (%.2f ms)" %
              (GOAL_MS, "met" if p99 <= GOAL_MS else "MISSED", p99))
        return 0
    finally:
        stack.stop(check=False)


if __name__ == "__main__":
    sys.exit(main())
