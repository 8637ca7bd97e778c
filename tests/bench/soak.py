#!/usr/bin/python3
"""soak: mixed load across the three APIs with SIGKILLs at random, then an account of what was
acknowledged and what survived.

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/soak.py [--seconds S] [--clients C]
        [--no-chaos] [--seed N]

(`./ops/pivirt soak MINUTES` runs it on the release build; e2e.test_soak runs a short form on
the sanitizer build.) It starts its own stack with the e2e harness (loopback only): Redis, two
gateways, two schedulers, two ops workers and two node agents (process engine, pod "soak"),
the agent of node sa holding the DIR storage pool on the system libvirtd. C clients (default 4)
then pick actions at random until the time is up:

  deploy    CreateWorkload of 1-3 instances (x-request-id; retried on UNAVAILABLE through the
            other gateway, which answers the same operation)
  remove    RemoveWorkload (force) of up to 3 live workloads
  volume    CreateVolume (qcow2), CreateSnapshot, CloneVolume, then DeleteVolume of both
  cluster   CordonNode and UncordonNode of a node, GetHealth
  operation CreateTestOperation and WaitOperation

and a chaos thread SIGKILLs a random gateway, scheduler, ops worker or node agent every 1-4 s
and starts it again. Every call that failed is counted with its code and reason. At the end,
once the operations in flight ended, every acknowledged workload, volume and operation that was
not removed must still be there: those missing are "lost" (goal 0). Prints the counts and each
process's resident memory at start and end (goal: growth under 5% for a long run; the first
minutes include each process's warm-up), then audits the state with pivirt-check. Exit status
1 when anything was lost, an operation never ended or the audit found a difference.
"""
import argparse
import collections
import json
import os
import random
import sys
import tarfile
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import pvtest  # noqa: E402

sys.path.insert(0, os.path.join(pvtest.BUILD_DIR, "py"))
import grpc  # noqa: E402
from pb import core_pb2, core_pb2_grpc  # noqa: E402
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc  # noqa: E402
from pivirt.operations.v1 import operations_pb2, operations_pb2_grpc  # noqa: E402
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc  # noqa: E402

NODES = ["sa", "sb"]
POD = "soak"
RETRIABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def make_image(data_dir):
    path = os.path.join(data_dir, "images", "soak", "1.tar")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexec sleep 3600\n")
        os.chmod(script, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(script, arcname="run.sh")


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Soak:
    def __init__(self, stack, seconds, clients=4, chaos=True, seed=None, log=print,
                 spare=()):
        self.stack = stack
        self.seconds = seconds
        self.clients = clients
        self.chaos = chaos
        self.rnd = random.Random(seed)
        self.log = log
        self.spare = set(spare)  # process names the chaos never kills
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.done = collections.Counter()  # action -> count of successes
        self.failed = collections.Counter()  # (action, code, reason) -> count
        self.kills = collections.Counter()  # process kind -> SIGKILLs
        self.restart_rss = {}  # process name -> resident KiB once ready after its last restart
        # resident KiB once warm: at the warm-up mark (a fifth of the run, at most a minute:
        # allocator arenas, connection pools and caches have grown by then), or once ready
        # after a restart since; growth is judged from here
        self.base_rss = {}
        self.restarted_since_warm = set()
        self.workloads = set()  # acknowledged, not removed
        self.removed = set()
        self.volumes = set()  # acknowledged volume ids, not deleted
        self.operations = set()  # acknowledged operation ids
        self.seq = 0
        n = len(stack.gateways)
        self.core = [core_pb2_grpc.CoreRPCStub(stack.channel(i)) for i in range(n)]
        self.sto = [storage_pb2_grpc.StorageServiceStub(stack.channel(i)) for i in range(n)]
        self.cls = [cluster_pb2_grpc.ClusterServiceStub(stack.channel(i)) for i in range(n)]
        self.ops = [operations_pb2_grpc.OperationServiceStub(stack.channel(i)) for i in range(n)]

    # -- bookkeeping

    def fail(self, action, err):
        code = err.code().name if isinstance(err, grpc.RpcError) else type(err).__name__
        reason = err.details() if isinstance(err, grpc.RpcError) else str(err)
        if getattr(err, "method", None):
            action = "%s/%s" % (action, err.method)
        with self.lock:
            self.failed[(action, code, (reason or "")[:90])] += 1

    def ok(self, action):
        with self.lock:
            self.done[action] += 1

    def next_name(self, what):
        with self.lock:
            self.seq += 1
            return "%s-%d" % (what, self.seq)

    def call(self, stubs, method, req, rid=None, stream=False, timeout=60):
        """Calls method on a random gateway; on UNAVAILABLE (a gateway killed) again on
        another with the same x-request-id, for up to 60 s."""
        md = (("x-request-id", rid),) if rid else None
        deadline = time.monotonic() + 60
        i = self.rnd.randrange(len(stubs))
        while True:
            try:
                fn = getattr(stubs[i], method)
                return list(fn(req, timeout=timeout, metadata=md)) if stream else \
                    fn(req, timeout=timeout, metadata=md)
            except grpc.RpcError as e:
                if e.code() not in RETRIABLE or time.monotonic() > deadline:
                    e.method = method
                    raise
                i = (i + 1) % len(stubs)
                time.sleep(0.2)

    # -- actions

    def deploy(self):
        opts = core_pb2.DeployOptions(
            name="soak", entrypoint=core_pb2.EntrypointOptions(name="w",
                                                               commands=["/bin/sh", "run.sh"]),
            podname=POD, image="soak:1", count=self.rnd.randint(1, 3),
            resources={"cpumem": json.dumps({"memory-request": "8M"}).encode()})
        msgs = self.call(self.core, "CreateWorkload", opts, rid=str(uuid.uuid4()), stream=True,
                         timeout=120)
        with self.lock:
            for m in msgs:
                if m.success:
                    self.workloads.add(m.id)
        bad = [m.error for m in msgs if not m.success]
        if bad:
            raise RuntimeError("CreateWorkload: " + bad[0])

    def remove(self):
        with self.lock:
            ids = self.rnd.sample(sorted(self.workloads), min(3, len(self.workloads)))
            self.workloads.difference_update(ids)  # no other client picks them
        if not ids:
            return
        msgs = self.call(self.core, "RemoveWorkload",
                         core_pb2.RemoveWorkloadOptions(IDs=ids, force=True), stream=True,
                         timeout=120)
        gone = {m.id for m in msgs if m.success or "not found" in m.hook.decode("utf-8", "replace")}
        with self.lock:
            self.removed.update(gone)
            self.workloads.update(set(ids) - gone)
        if gone != set(ids):
            raise RuntimeError("RemoveWorkload: %d of %d removed" % (len(gone), len(ids)))

    def volume(self):
        S = storage_pb2
        vol = self.call(self.sto, "CreateVolume", S.CreateVolumeRequest(
            name=self.next_name("v"), pool="default", size_bytes=64 << 20,
            format=S.VOLUME_FORMAT_QCOW2), rid=str(uuid.uuid4()))
        with self.lock:
            self.volumes.add(vol.id)
        self.call(self.sto, "CreateSnapshot", S.CreateSnapshotRequest(
            volume_id=vol.id, name=self.next_name("s")), rid=str(uuid.uuid4()))
        clone = self.call(self.sto, "CloneVolume", S.CloneVolumeRequest(
            source_id=vol.id, name=self.next_name("c")), rid=str(uuid.uuid4()))
        with self.lock:
            self.volumes.add(clone.id)
        for v in (clone.id, vol.id):
            self.call(self.sto, "DeleteVolume", S.DeleteVolumeRequest(id=v),
                      rid=str(uuid.uuid4()))
            with self.lock:
                self.volumes.discard(v)

    def cluster(self):
        C = cluster_pb2
        node = self.rnd.choice(NODES)
        self.call(self.cls, "CordonNode", C.CordonNodeRequest(cluster_id=POD, node_id=node),
                  rid=str(uuid.uuid4()))
        self.call(self.cls, "UncordonNode", C.UncordonNodeRequest(cluster_id=POD, node_id=node),
                  rid=str(uuid.uuid4()))
        self.call(self.cls, "GetHealth", C.GetHealthRequest(cluster_id=POD))

    def operation(self):
        O = operations_pb2
        op = self.call(self.ops, "CreateTestOperation", O.CreateTestOperationRequest(
            kind="test.sleep", target=self.next_name("t"), params={"ms": "20"}),
            rid=str(uuid.uuid4()))
        with self.lock:
            self.operations.add(op.id)
        got = self.call(self.ops, "WaitOperation",
                        O.WaitOperationRequest(id=op.id, timeout_seconds=30), timeout=40)
        if got.status != O.OPERATION_STATUS_SUCCEEDED:
            raise RuntimeError("test operation ended %s" % O.OperationStatus.Name(got.status))

    ACTIONS = (("deploy", 4), ("remove", 3), ("volume", 2), ("cluster", 1), ("operation", 2))

    def client(self):
        names = [a for a, w in self.ACTIONS for _ in range(w)]
        while not self.stop.is_set():
            action = self.rnd.choice(names)
            try:
                getattr(self, action)()
                self.ok(action)
            except (grpc.RpcError, RuntimeError) as e:
                self.fail(action, e)

    def chaos_loop(self):
        while not self.stop.wait(self.rnd.uniform(1.0, 4.0)):
            kind = self.rnd.choice(["gateway", "scheduler", "worker", "agent"])
            victims = {"gateway": [g.proc for g in self.stack.gateways],
                       "scheduler": self.stack.schedulers, "worker": self.stack.workers,
                       "agent": self.stack.agents}[kind]
            victims = [v for v in victims if v.name not in self.spare]
            if not victims:
                continue
            p = self.rnd.choice(victims)
            p.kill9()
            with self.lock:
                self.kills[kind] += 1
            p.start()
            try:
                self.stack.wait_ready([p])
                with self.lock:
                    self.restart_rss[p.name] = rss_kb(p.pid)
                    self.base_rss[p.name] = self.restart_rss[p.name]
                    self.restarted_since_warm.add(p.name)
            except AssertionError as e:
                self.fail("chaos", e)

    # -- the run

    def rss(self):
        out = {"redis": rss_kb(self.stack.redis.proc.pid)}
        for p in self.stack.procs:
            out[p.name] = rss_kb(p.pid) if p.alive() else None
        return out

    def settle(self, timeout=120):
        """Waits until no operation is pending or running."""
        O = operations_pb2
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            busy = 0
            for status in (O.OPERATION_STATUS_PENDING, O.OPERATION_STATUS_RUNNING):
                busy += len(self.call(self.ops, "ListOperations", O.ListOperationsRequest(
                    status=status, limit=1), stream=True))
            if not busy:
                return True
            time.sleep(0.5)
        return False

    def lost(self):
        """Acknowledged things that should exist and do not."""
        missing = []
        for wid in sorted(self.workloads):
            try:
                self.call(self.core, "GetWorkload", core_pb2.WorkloadID(id=wid))
            except grpc.RpcError as e:
                missing.append(("workload", wid, e.code().name))
        for vid in sorted(self.volumes):
            try:
                self.call(self.sto, "GetVolume", storage_pb2.GetVolumeRequest(id=vid))
            except grpc.RpcError as e:
                missing.append(("volume", vid, e.code().name))
        for oid in sorted(self.operations):
            try:
                self.call(self.ops, "GetOperation", operations_pb2.GetOperationRequest(id=oid))
            except grpc.RpcError as e:
                missing.append(("operation", oid, e.code().name))
        return missing

    def run(self):
        start_rss = self.rss()
        threads = [threading.Thread(target=self.client) for _ in range(self.clients)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        # The kills and restarts run on this thread: a process the harness starts dies with the
        # thread that started it (PR_SET_PDEATHSIG follows the thread), so restarts from a
        # thread that ends would die with it.
        timer = threading.Timer(self.seconds, self.stop.set)
        timer.start()

        def warm():
            now = self.rss()
            with self.lock:
                self.base_rss = now
                self.restarted_since_warm = set()
        warm_timer = threading.Timer(min(60.0, self.seconds / 5.0), warm)
        warm_timer.start()
        if self.chaos:
            self.chaos_loop()
        self.stop.wait()
        timer.cancel()
        warm_timer.cancel()
        for t in threads:
            t.join(300)
        elapsed = time.monotonic() - t0
        settled = self.settle()
        missing = self.lost()
        end_rss = self.rss()
        self.report(elapsed, settled, missing, start_rss, end_rss)
        return missing, settled

    def report(self, elapsed, settled, missing, start_rss, end_rss):
        log = self.log
        log("soak: %.0f s, %d clients, chaos %s" % (elapsed, self.clients,
                                                     "on" if self.chaos else "off"))
        log("  SIGKILLs: %s" % (", ".join("%s %d" % kv for kv in sorted(self.kills.items()))
                                or "none"))
        log("  done: %d (%s)" % (sum(self.done.values()), ", ".join(
            "%s %d" % kv for kv in sorted(self.done.items()))))
        log("  failed with a reason: %d" % sum(self.failed.values()))
        for (action, code, reason), n in self.failed.most_common(12):
            log("    %4d  %-24s %-18s %s" % (n, action, code, reason))
        log("  live at the end: %d workloads, %d volumes; %d workloads removed; %d test "
            "operations" % (len(self.workloads), len(self.volumes), len(self.removed),
                            len(self.operations)))
        log("  operations all ended: %s" % ("yes" if settled else "NO"))
        log("  lost: %d%s" % (len(missing), "" if not missing else " " + repr(missing[:10])))
        log("  resident memory (KiB): start, warm (after warm-up, or after the last restart "
            "since), end; growth from warm")
        worst = 0.0
        for name in start_rss:
            a, w, b = start_rss[name], self.base_rss.get(name), end_rss.get(name)
            growth = "%+.1f%%" % (100.0 * (b - w) / w) if w and b else "gone"
            restarted = name in self.restarted_since_warm
            if w and b and not restarted and name != "redis":
                worst = max(worst, 100.0 * (b - w) / w)
            log("    %-16s %8s  %8s -> %8s  %-8s%s" % (
                name, a, w, b, growth,
                " (restarted since warm-up)" if restarted else
                " (holds the data: records are kept ops.retention_seconds)" if name == "redis"
                else ""))
        log("  largest growth of a program not restarted since warm-up: %+.1f%% (goal: under "
            "5%%)" % worst)


def make_stack():
    why = pvtest.ensure_libvirtd()
    if why:
        raise RuntimeError(why)
    return pvtest.Stack(gateways=2, workers=2, schedulers=2,
                        agents=[(NODES[0], POD), (NODES[1], POD)],
                        config={"storage": {"default_node": NODES[0]},
                                "log": {"level": "warn"},
                                "scheduler": {"claim_idle_ms": 1000},
                                "worker": {"heartbeat_seconds": 1, "lease_ms": 2000,
                                           "memory_pressure_percent": 100,
                                           "disk_pressure_percent": 100,
                                           "pid_pressure_percent": 100}})


def prepare(stack):
    """The image and the DIR pool the load uses."""
    make_image(stack.data_dir)
    sto = storage_pb2_grpc.StorageServiceStub(stack.channel(0))
    pool = sto.CreatePool(storage_pb2.CreatePoolRequest(
        name="default", type=storage_pb2.POOL_TYPE_DIR,
        config={"path": os.path.join(stack.data_dir, "pools", "default")}), timeout=60)
    if pool.status != storage_pb2.POOL_STATUS_ACTIVE:
        raise RuntimeError("pool default: %s" % pool)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--no-chaos", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    stack = make_stack()
    stack.start()
    try:
        prepare(stack)
        soak = Soak(stack, a.seconds, clients=a.clients, chaos=not a.no_chaos, seed=a.seed,
                    log=lambda s: print(s, flush=True))
        missing, settled = soak.run()
        differences = stack.check()
        print("  audit (pivirt-check): %d difference(s)" % len(differences), flush=True)
        for line in differences[:20]:
            print("    " + line, flush=True)
    finally:
        stack.stop(check=False)
    return 0 if not missing and settled and not differences else 1


if __name__ == "__main__":
    sys.exit(main())
