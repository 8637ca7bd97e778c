#!/usr/bin/python3
"""End-to-end tests of the audit, pivirt-check (`./ops/pivirt check`), on a real stack: Redis, a
gateway, a scheduler, an ops worker and the node agent of ck1 (process engine), plus a DIR pool
of the system libvirtd with qcow2 and raw volumes and a snapshot tree.

  test_a  after deploys, a stop through the API and storage operations the audit reports no
          difference (exit 0).
  test_b  the state damaged on purpose, one thing at a time, each reported exactly (one line,
          exit 1) and clean again once repaired: a workload's process killed behind the
          system's back, a node's recorded usage changed in Redis, a volume's file deleted, a
          snapshot's tag deleted from its qcow2 file, an orphan process workload in the
          engine's directory (a dissociated workload is not one, unless its mark is deleted), an
          operation left PENDING without a queue entry, a lock held by
          no operation, the status of a workload that is gone, a volume's holder key naming a
          workload while its record says not in use.
  test_c  100 workloads more: still clean; prints how long the audit took.
  test_d  chaos: deploys from several clients in flight while the scheduler, the ops worker,
          the node agent and the gateway are killed with SIGKILL and started again; once every operation has ended the
          audit finds no difference, and none after the survivors are removed.
"""
import json
import os
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc

S = storage_pb2
GiB = 1 << 30
NODE = "ck1"
_stack = None
_storage = None  # why storage is not tested, or None


def setUpModule():
    global _stack, _storage
    _storage = pvtest.ensure_libvirtd()
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[(NODE, "ckp")],
                          config={"storage": {"default_node": NODE},
                                  "worker": {"heartbeat_seconds": 1, "lease_ms": 2000}})
    _stack.start()
    path = os.path.join(_stack.data_dir, "images", "ck", "1.tar")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nwhile :; do sleep 1; done\n")
        os.chmod(script, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(script, arcname="run.sh")


def tearDownModule():
    if _stack:
        if _storage is None:
            st = storage_pb2_grpc.StorageServiceStub(_stack.channel(0))
            for v in st.ListVolumes(S.ListVolumesRequest(pool="ckpool"), timeout=10):
                st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=30)
            st.DeletePool(S.DeletePoolRequest(name="ckpool"), timeout=30)
        _stack.stop()


def proc_start(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


class Check(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))
        cls.st = storage_pb2_grpc.StorageServiceStub(cls.stack.channel(0))
        cls.engine = os.path.join(cls.stack.data_dir, "engine", NODE)
        cls.ids = cls.deploy("ck", 4)
        # one stopped on purpose: not a difference
        got = list(cls.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[cls.ids[3]], type="stop", force=True), timeout=60))
        assert all(g.error == "" for g in got), got
        if _storage is None:
            cls.pool_dir = os.path.join(cls.stack.data_dir, "pools", "ckpool")
            cls.st.CreatePool(S.CreatePoolRequest(name="ckpool", type=S.POOL_TYPE_DIR,
                                                  config={"path": cls.pool_dir}), timeout=60)
            cls.qcow = cls.st.CreateVolume(S.CreateVolumeRequest(
                name="q1", pool="ckpool", size_bytes=GiB, format=S.VOLUME_FORMAT_QCOW2),
                timeout=60)
            cls.raw = cls.st.CreateVolume(S.CreateVolumeRequest(
                name="r1", pool="ckpool", size_bytes=1 << 20, format=S.VOLUME_FORMAT_RAW),
                timeout=60)
            cls.s1 = cls.st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=cls.qcow.id,
                                                                   name="s1"), timeout=60)
            cls.s2 = cls.st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=cls.qcow.id,
                                                                   name="s2"), timeout=60)

    @classmethod
    def deploy(cls, name, count, memory="16M"):
        opts = core_pb2.DeployOptions(
            name=name, entrypoint=core_pb2.EntrypointOptions(name="w",
                                                             commands=["/bin/sh", "run.sh"]),
            podname="ckp", image="ck:1", count=count,
            resources={"cpumem": json.dumps({"memory-request": memory}).encode()})
        msgs = list(cls.core.CreateWorkload(opts, timeout=300))
        assert len(msgs) == count and all(m.success for m in msgs), [m.error for m in msgs]
        return sorted(m.id for m in msgs)

    def remove(self, ids):
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=ids, force=True),
                                            timeout=120))
        self.assertEqual(sum(1 for g in got if g.success), len(ids), got)

    def record(self, wid):
        with open(os.path.join(self.engine, wid, "record.json")) as f:
            return json.load(f)

    def assert_clean(self):
        self.assertEqual(self.stack.check(), [])
        self.assertEqual(self.stack.last_check["total"], 0)

    def test_a_clean(self):
        report = self.stack.check(raw=True)
        self.assertEqual(report["differences"], [])
        checked = report["checked"]
        self.assertEqual(checked["workloads"], 4)
        self.assertEqual(checked["engine_workloads"], 4)  # ids[3] stopped on purpose included
        self.assertEqual(checked["local_nodes"], 1)
        self.assertGreaterEqual(checked["operations"], 2)  # the deploy and its node's part
        if _storage is None:
            self.assertEqual((checked["volumes"], checked["snapshots"]), (2, 2))
        # ./ops/pivirt check's exit code and text
        p = subprocess.run([os.path.join(pvtest.BIN_DIR, "pivirt-check"), "--config",
                            self.stack.config_path], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertTrue(p.stdout.startswith("check: 0 differences (ops 0, reservations 0, "),
                        p.stdout)

    def test_b_damage(self):
        # 1. a workload's process killed behind the system's back: its agent records the exit
        victim = self.ids[0]
        pid = self.record(victim)["pid"]
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self.record(victim)["state"] != "stopped" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.stack.check(), [
            "WL_NOT_RUNNING workload %s: should run on node %s (started, never stopped through "
            "the API) but its process was killed" % (victim, NODE)])
        p = subprocess.run([os.path.join(pvtest.BIN_DIR, "pivirt-check"), "--config",
                            self.stack.config_path, "--confirm-ms", "0"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("check: 1 difference (ops 0, reservations 0, workloads 1, ", p.stdout)
        self.remove([victim])
        self.assert_clean()

        # 2. a node's recorded usage changed in Redis
        node_id = self.stack.redis.cmd("HGET", self.stack.key("{reg}:nodes"), NODE)
        key = self.stack.key("{reg}:node:" + node_id)
        usage = self.stack.redis.cmd("HGET", key, "usage")
        doc = json.loads(usage)
        want = doc["cpumem"]["memory_request"]
        doc["cpumem"]["memory_request"] = want + 12345
        self.stack.redis.cmd("HSET", key, "usage", json.dumps(doc))
        self.assertEqual(self.stack.check(), [
            "RESV_USAGE node %s: cpumem.memory_request: recorded %d, allocations add up to %d" %
            (NODE, want + 12345, want)])
        self.stack.redis.cmd("HSET", key, "usage", usage)
        self.assert_clean()

        # 3. an orphan: a process workload in the engine's directory that no record names
        orphan = "0" * 63 + "1"
        proc = subprocess.Popen(["sleep", "300"])
        try:
            rec = self.record(self.ids[1])
            rec.update(id=orphan, pid=proc.pid, pid_start=proc_start(proc.pid))
            os.makedirs(os.path.join(self.engine, orphan))
            with open(os.path.join(self.engine, orphan, "record.json"), "w") as f:
                json.dump(rec, f)
            self.assertEqual(self.stack.check(), [
                "WL_ORPHAN workload %s: the engine of node %s has it (runs as pid %d) but there "
                "is no record of it" % (orphan, NODE, proc.pid)])
        finally:
            proc.kill()
            proc.wait()
        os.remove(os.path.join(self.engine, orphan, "record.json"))
        os.rmdir(os.path.join(self.engine, orphan))
        self.assert_clean()

        # 3b. DissociateWorkload lets a workload go on without a record, on purpose: not an
        # orphan; without its mark it would be one
        let_go = self.ids[2]
        got = list(self.core.DissociateWorkload(core_pb2.DissociateWorkloadOptions(
            IDs=[let_go]), timeout=30))
        self.assertEqual([(g.id, g.error) for g in got], [(let_go, "")])
        self.assert_clean()
        mark = self.stack.key("{reg}:dissociated:" + let_go)
        self.stack.redis.cmd("DEL", mark)
        pid = self.record(let_go)["pid"]
        self.assertEqual(self.stack.check(), [
            "WL_ORPHAN workload %s: the engine of node %s has it (runs as pid %d) but there is "
            "no record of it" % (let_go, NODE, pid)])
        self.stack.redis.cmd("SET", mark, "1")
        self.assert_clean()

        # 4. an operation PENDING with no queue entry and no retry waiting; a lock of nobody
        op_key = self.stack.key("{ops}:op:op-ckfake")
        self.stack.redis.cmd("HSET", op_key, "id", "op-ckfake", "kind", "test.sleep", "queue",
                             "ops", "status", "PENDING", "entry", "")
        lock_key = self.stack.key("{ops}:lock:node-ckfake")
        self.stack.redis.cmd("SET", lock_key, "op-gone")
        # and the status of a workload that is gone
        gone = "f" * 64
        status_key = self.stack.key("{reg}:wl-status:" + gone)
        self.stack.redis.cmd("SET", status_key, '{"running": true}')
        # an operation RUNNING on an entry its queue no longer has; an entry of no operation
        # waiting on a queue nobody reads
        op2_key = self.stack.key("{ops}:op:op-ckfake2")
        self.stack.redis.cmd("HSET", op2_key, "id", "op-ckfake2", "kind", "node.drain", "queue",
                             "ops", "status", "RUNNING", "entry", "1-1")
        ghost_q = self.stack.key("{ops}:q:node:ghost")
        entry = self.stack.redis.cmd("XADD", ghost_q, "*", "op", "op-ghost", "kind", "x")
        self.assertEqual(self.stack.check(), [
            "OP_LOST op op-ckfake: PENDING test.sleep on queue ops has no queue entry and waits "
            "for no retry: no worker will ever run it",
            "OP_LOST op op-ckfake2: RUNNING node.drain: its entry 1-1 on queue ops is neither "
            "waiting nor pending (acknowledged or trimmed): no worker will ever run it",
            "OP_ORPHAN_ENTRY queue node:ghost entry %s: waiting entry of operation op-ghost, "
            "which has no record" % entry,
            "OP_STALE_LOCK lock node-ckfake: held by operation op-gone, which has no record",
            "WL_LEFTOVER workload %s: its status remains (%s) but the workload has no record" %
            (gone, status_key)])
        self.stack.redis.cmd("DEL", op_key, op2_key, ghost_q, lock_key, status_key)
        self.assert_clean()

        if _storage is not None:
            self.skipTest("storage damage not tested: " + _storage)
        # 5. a volume's file deleted
        path = os.path.join(self.pool_dir, "r1")
        with open(path, "rb") as f:
            data = f.read()
        os.remove(path)
        self.assertEqual(self.stack.check(), [
            "VOL_MISSING volume %s: r1 in pool ckpool: its file %s does not exist" %
            (self.raw.id, path)])
        with open(path, "wb") as f:
            f.write(data)
        self.assert_clean()

        # 6. a volume claimed by a workload that does not exist, its record still READY
        user_key = self.stack.key("{sto}:vol-user:" + self.raw.id)
        self.stack.redis.cmd("SET", user_key, gone)
        self.assertEqual(self.stack.check(), [
            "VOL_HOLDER volume %s: its holder key names %s but its record says not in use" %
            (self.raw.id, gone)])
        self.stack.redis.cmd("DEL", user_key)
        self.assert_clean()

        # 7. a snapshot's tag deleted from the qcow2 file (s2's parent is s1)
        qpath = os.path.join(self.pool_dir, "q1")
        subprocess.run(["qemu-img", "snapshot", "-d", self.s2.id, qpath], check=True)
        self.assertEqual(self.stack.check(), [
            "SNAP_TAG snapshot %s: volume %s's file %s has no internal snapshot of that tag" %
            (self.s2.id, self.qcow.id, qpath)])
        subprocess.run(["qemu-img", "snapshot", "-c", self.s2.id, qpath], check=True)
        self.assert_clean()

    def test_c_hundred_workloads(self):
        more = self.deploy("ckmany", 100, memory="4M")
        try:
            report = self.stack.check(raw=True)
            self.assertEqual(report["differences"], [])
            self.assertGreaterEqual(report["checked"]["workloads"], 100)
            one = self.stack.check(confirm_ms=0, raw=True)  # one pass, nothing to confirm
            print("pivirt-check: %d workloads, %d operations: %d ms (one pass: %d ms)" % (
                report["checked"]["workloads"], report["checked"]["operations"],
                report["elapsed_ms"], one["elapsed_ms"]))
        finally:
            self.remove(more)
        self.assert_clean()

    def unfinished_ops(self):
        left = []
        for key in self.stack.scan(self.stack.key("{ops}:op:*")):
            status = self.stack.redis.cmd("HGET", key, "status")
            if status in ("PENDING", "RUNNING"):
                left.append((key, status))
        return left

    def test_d_chaos(self):
        errors, made = [], []
        addr = self.stack.gateways[0].addrs[1]

        def burst(i):
            ch = grpc.insecure_channel(addr)
            try:
                core = core_pb2_grpc.CoreRPCStub(ch)
                opts = core_pb2.DeployOptions(
                    name="chaos%d" % i, entrypoint=core_pb2.EntrypointOptions(
                        name="w", commands=["/bin/sh", "run.sh"]),
                    podname="ckp", image="ck:1", count=8,
                    resources={"cpumem": json.dumps({"memory-request": "4M"}).encode()})
                for m in core.CreateWorkload(opts, timeout=120):
                    made.append(m.id) if m.success else errors.append(m.error)
            except grpc.RpcError as e:
                errors.append("%s %s" % (e.code(), e.details()))
            finally:
                ch.close()

        before = len(self.stack.scan(self.stack.key("{ops}:op:*")))
        threads = [threading.Thread(target=burst, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        # the scheduler as soon as the first deploy is submitted, the gateway once the first
        # instance is answered (streams open)
        deadline = time.monotonic() + 10
        while (len(self.stack.scan(self.stack.key("{ops}:op:*"))) == before and
               time.monotonic() < deadline):
            time.sleep(0.005)
        sched = self.stack.schedulers[0]
        sched.kill9()
        time.sleep(0.5)
        sched.start()
        # the ops worker running the deploys too (another takes its operations over after the
        # lease: here the same one started again)
        worker = self.stack.workers[0]
        worker.kill9()
        worker.start()
        while not made and time.monotonic() < deadline + 20:
            time.sleep(0.005)
        # the node's agent while it makes the instances, the gateway while it streams them
        agent = self.stack.agents[0]
        agent.kill9()
        agent.start()
        gw = self.stack.gateways[0]
        streaming = sum(1 for t in threads if t.is_alive())
        gw.proc.kill9()
        gw.start()
        self.stack.wait_ready()
        for t in threads:
            t.join(180)
            self.assertFalse(t.is_alive())
        # every operation ends (retries included), then nothing may be left behind
        deadline = time.monotonic() + 150
        while self.unfinished_ops() and time.monotonic() < deadline:
            time.sleep(0.5)
        self.assertEqual(self.unfinished_ops(), [])
        self.assertEqual(self.stack.check(), [])
        apps = ["chaos%d" % i for i in range(6)]
        ids = [w.id for a in apps for w in self.core.ListWorkloads(
            core_pb2.ListWorkloadsOptions(appname=a), timeout=10)]
        print("chaos: %d clients streaming at the gateway's kill; %d instances answered, %d "
              "errors, %d workloads exist" % (streaming, len(made), len(errors), len(ids)))
        self.assertGreater(streaming, 0, "the gateway was killed after every deploy ended: %s" % errors)
        self.assertTrue(set(made) <= set(ids), set(made) - set(ids))
        if ids:
            self.remove(ids)
        self.assert_clean()


if __name__ == "__main__":
    pvtest.main()
