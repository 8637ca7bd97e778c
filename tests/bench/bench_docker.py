#!/usr/bin/python3
"""bench docker: containers created, started and removed through pivirt next to the same
containers straight through the Engine API, in the same run on the same daemon.

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/bench_docker.py [--count N]
        [--clients 1,4]

(`./ops/pivirt bench docker` runs it on the release build.) It starts a dockerd of its own and
a stack of one gateway, scheduler, ops worker and node agent on that daemon (unix://, the
docker engine) with the e2e harness (pvtest.DockerSetup: busybox-static imported as demo:1),
then, for each number of clients C (default 1 and 4):

  1. pivirt: COUNT (default 50) CreateWorkload calls of count 1, C at a time (a container of
     busybox `sleep 300`, 32 MiB, 0.1 cpu; the answer means "the container runs"), then a
     RemoveWorkload (force) of each, C at a time;
  2. Engine API: the same straight on the daemon's socket: POST /containers/create with the
     body the pivirt container was made with (read back from its inspect: image, command, env,
     labels but pivirt.id, user, dir, Init, the limits, the restart policy) and POST start,
     then DELETE ?force=1 of each.

A warm-up container goes through pivirt first (it is also the direct round's template).
Prints both rates (containers created, started and removed per second: COUNT over the round's
wall time; and of the creates alone), their ratio (goal >= 0.8: the daemon's own work
dominates), p50/p99 of the create latency (request until running: pivirt's CreateWorkload
answer, the direct create + start), the control plane's CPU per create and per remove (gateway,
ops worker, scheduler, node agent and Redis) and the daemon's (dockerd, containerd) in both.
Exit status 0 when every container was made and removed in every round, 1 otherwise.
"""
import argparse
import json
import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
sys.path.insert(0, HERE)
import pvtest  # noqa: E402
from bench_workloads import cpu_seconds, parallel, pct  # noqa: E402

sys.path.insert(0, os.path.join(pvtest.BUILD_DIR, "py"))
from pb import core_pb2, core_pb2_grpc  # noqa: E402

POD, NODE = "bdp", "bdk"
# What of the pivirt container's HostConfig the direct round repeats.
HOST_KEYS = ("Init", "Privileged", "CapAdd", "Memory", "MemorySwap", "MemoryReservation",
             "NanoCpus", "CpusetCpus", "RestartPolicy", "NetworkMode", "Sysctls")


def deploy(name):
    return core_pb2.DeployOptions(
        name=name, entrypoint=core_pb2.EntrypointOptions(
            name="w", commands=["/bin/sh", "-c", "sleep 300"]),
        podname=POD, nodenames=[NODE], image="demo:1", count=1,
        resources={"cpumem": json.dumps({"memory-request": "32M", "cpu-request": 0.1}).encode()})


def daemon_pids(dk):
    """dockerd and the processes it started itself (containerd); the shims re-parent away."""
    pids = [dk.proc.pid]
    try:
        for task in os.listdir("/proc/%d/task" % dk.proc.pid):
            with open("/proc/%d/task/%s/children" % (dk.proc.pid, task)) as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def cpu_of(pids):
    return sum(cpu_seconds(p) or 0 for p in pids)


def control_plane_pids(stack):
    procs = [g.proc for g in stack.gateways] + stack.workers + stack.schedulers + stack.agents
    return [p.pid for p in procs if p is not None and p.pid] + [stack.redis.proc.pid]


def template_of(inspect):
    """The create body that remakes the pivirt container INSPECT straight on the daemon."""
    cfg, host = inspect["Config"], inspect["HostConfig"]
    labels = {k: v for k, v in (cfg.get("Labels") or {}).items() if k != "pivirt.id"}
    labels["pvbench"] = "1"
    body = {k: cfg.get(k) for k in ("Image", "Cmd", "Env", "User", "WorkingDir", "StopTimeout")}
    body["Labels"] = labels
    body["HostConfig"] = {k: host[k] for k in HOST_KEYS if host.get(k) is not None}
    return body


def pivirt_ops(core):
    def create(i):
        t0 = time.perf_counter()
        try:
            msgs = list(core.CreateWorkload(deploy("bdpv%d" % i), timeout=120))
        except Exception as e:  # noqa: BLE001 - reported with the figures
            return None, None, "create %d: %s" % (i, e)
        if len(msgs) != 1 or not msgs[0].success:
            return None, None, "create %d: %s" % (i, msgs[0].error if msgs else "no answer")
        return time.perf_counter() - t0, msgs[0].id, None

    def remove(wid):
        try:
            got = list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                           timeout=120))
        except Exception as e:  # noqa: BLE001
            return "remove %s: %s" % (wid, e)
        return None if len(got) == 1 and got[0].success else "remove %s: %s" % (wid, got)
    return create, remove


def direct_ops(dk, body, tag):
    def create(i):
        t0 = time.perf_counter()
        try:
            made = dk.api("POST", "/containers/create?name=bdapi%s_%d" % (tag, i), body=body)
            dk.api("POST", "/containers/%s/start" % made["Id"])
        except (OSError, AssertionError) as e:
            return None, None, "container %d: %s" % (i, e)
        return time.perf_counter() - t0, made["Id"], None

    def remove(cid):
        try:
            dk.api("DELETE", "/containers/%s?force=1&v=1" % cid)
        except (OSError, AssertionError) as e:
            return "remove %s: %s" % (cid[:12], e)
        return None
    return create, remove


def timed_round(clients, count, ops, pids):
    """COUNT creates, CLIENTS at a time, then their removes: {rate (created, started and removed
    per second), create_rate, lat (create latencies), errors, create_cpu and remove_cpu (CPU
    seconds of each PIDS group in each phase), removed}."""
    create, remove = ops
    cpu0 = [cpu_of(p) for p in pids]
    t0 = time.perf_counter()
    made = parallel(clients, list(range(count)), create)
    t1 = time.perf_counter()
    cpu1 = [cpu_of(p) for p in pids]
    ids = [m[1] for m in made if m[1]]
    gone = parallel(clients, ids, remove)
    t2 = time.perf_counter()
    cpu2 = [cpu_of(p) for p in pids]
    errors = [m[2] for m in made if m[2]] + [g for g in gone if g]
    return {"rate": count / (t2 - t0), "create_rate": count / (t1 - t0),
            "lat": [m[0] for m in made if m[0] is not None], "errors": errors,
            "create_cpu": [b - a for a, b in zip(cpu0, cpu1)],
            "remove_cpu": [b - a for a, b in zip(cpu1, cpu2)],
            "removed": sum(1 for g in gone if g is None)}


def print_round(label, count, r, control_plane):
    lat = r["lat"]
    ms = lambda p: pct(lat, p) * 1000.0 if lat else float("nan")  # noqa: E731
    print("  %-10s %5.2f containers/s created+started+removed (creates alone %5.2f/s) | "
          "create -> running p50 %6.1f ms p99 %6.1f ms" % (label, r["rate"], r["create_rate"],
                                                           ms(50), ms(99)))
    cpu = lambda key, i: r[key][i] * 1000.0 / count  # noqa: E731
    cp = ("control plane %5.1f ms per create, %5.1f ms per remove; " % (
        cpu("create_cpu", 0), cpu("remove_cpu", 0))) if control_plane else ""
    print("  %-10s CPU: %sdaemon %5.1f ms per create, %5.1f ms per remove" % (
        "", cp, cpu("create_cpu", 1), cpu("remove_cpu", 1)))
    for e in r["errors"]:
        print("  %-10s error: %s" % (label, e))


def leftovers(dk):
    return dk.containers("pvbench") + dk.containers("pivirt.id")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--clients", default="1,4", help="comma-separated client counts")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    try:
        env = pvtest.DockerSetup(
            lambda dk: [{"node": NODE, "pod": POD, "endpoint": dk.endpoint}],
            config={"worker": {"stop_grace_seconds": 1}, "log": {"level": "warn"}})
    except unittest.SkipTest as e:
        print("bench docker: cannot run here: %s" % e, file=sys.stderr)
        return 1
    ok = True
    try:
        core = core_pb2_grpc.CoreRPCStub(env.stack.channel(0))
        warm = list(core.CreateWorkload(deploy("bdwarm"), timeout=120))
        if not warm or not warm[0].success:
            raise RuntimeError("warm-up container: %s" % (warm[0].error if warm else "no answer"))
        found = env.daemon.containers("pivirt.id=" + warm[0].id)
        body = template_of(env.daemon.inspect(found[0]["Id"]))
        list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[warm[0].id], force=True),
                                 timeout=120))
        cp, dd = control_plane_pids(env.stack), daemon_pids(env.daemon)
        print("\nbench docker: %d containers (busybox sleep, 32 MiB, 0.1 cpu) created, started "
              "and removed per round, Engine API %s (load average %.1f before)" % (
                  args.count, env.daemon.endpoint, os.getloadavg()[0]))
        for c in clients:
            pv = timed_round(c, args.count, pivirt_ops(core), [cp, dd])
            api = timed_round(c, args.count, direct_ops(env.daemon, body, str(c)), [[], dd])
            print(" %d client%s at a time:" % (c, "" if c == 1 else "s"))
            print_round("pivirt", args.count, pv, True)
            print_round("engine API", args.count, api, False)
            print("  %-10s %.2f pivirt/engine API (goal >= 0.8)" % (
                "ratio", pv["rate"] / api["rate"] if api["rate"] else 0.0))
            for r in (pv, api):
                ok = ok and not r["errors"] and len(r["lat"]) == r["removed"] == args.count
        left = leftovers(env.daemon)
        if left:
            print("  left behind: %s" % [c["Names"] for c in left])
            ok = False
    finally:
        env.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
