#!/usr/bin/python3
"""End-to-end tests of pivirt.storage.v1.StorageService on a real DIR pool: the system libvirtd
(started when none runs), qemu-img, and the node agent of node sn1 that holds the pools.

  test_a  pools: a DIR pool made ACTIVE with the file system's figures; the seed's LVM
          fast-pool kept with status ERROR and libvirt's reason; bad configs named by key.
  test_b  volumes: the seed's 100 GiB qcow2 allocates almost nothing; names unique in a pool;
          overcommit beyond max_overcommit is RESOURCE_EXHAUSTED; resize grows, shrinking is
          refused; a raw volume refuses snapshots.
  test_c  a snapshot tree: data written with qemu-io, snapshots taken, an older one restored and
          snapshotted again (a branch), the middle one restored and its data read back with
          qemu-io; ListSnapshots gives parents before children; deleting a snapshot re-parents
          its children and leaves the others' data intact.
  test_d  clones: a sparse copy with the same data, independent of its source (the source
          written and deleted afterwards, the clone unchanged); pool stats agree with the lists;
          a pool with volumes cannot be deleted.
  test_f  the agent killed with SIGKILL in the middle of a clone: no half-written volume (no
          record, no file of that name); the restarted agent takes the operation over and the
          client's call ends with the complete clone, the temporary file gone.
  test_h  the agent killed with SIGKILL in the middle of a restore, twice: while the restore's
          qemu-img runs (the file untouched yet), and after it applied the snapshot but before
          the volume's record says so. Each time the record is still at the old snapshot (with
          the restore journaled on it), the qemu-img the agent ran died with it, and the
          restarted agent completes the restore: the operation SUCCEEDED, the volume READY with
          the snapshot's data (qemu-io), the image clean (qemu-img check), the record at the
          restored snapshot (a new snapshot's parent) and no journal left; the tree is whole.
  test_i  the agent killed with SIGKILL after qemu-img made a snapshot, before its record: the
          restarted agent finds the snapshot made (no second one of the same id) and the
          client's CreateSnapshot ends with it READY, a child of the one before.
  test_g  an image put into the pool's directory by hand is recorded at the next refresh (as an
          iSCSI target's LUNs would be), with its format and size, and can be deleted.
  test_j  retried calls (the same x-request-id) answered from their first operation: the same
          volume, snapshot and clone, a second delete that succeeds, a reused id refused.
  test_e  the seed's examples as written (CreateVolume, ResizeVolume, CloneVolume,
          CreateSnapshot, GetPoolStats) through buf curl and reflection.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import grpc

import pvtest
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc
from pivirt.operations.v1 import operations_pb2, operations_pb2_grpc

S = storage_pb2
O = operations_pb2
GiB = 1 << 30
_stack = None
_ctl = None  # the control directory of the qemu-img wrapper

# The agent's qemu-img (storage.qemu_img) in these tests: the real one, which does all the work,
# behind a shell script that can stop a `snapshot -a` (or -c) before the real qemu-img starts
# (CTL/hold-before-a) or after it finished (CTL/hold-after-a), saying so in CTL/waiting-*, so
# that a test can kill the agent at exactly that point. Without those files it is the real
# qemu-img.
WRAPPER = """#!/bin/sh
ctl=%(ctl)s
v=${2#-}
if [ "$1" = snapshot ] && { [ "$v" = a ] || [ "$v" = c ]; }; then
  if [ -e "$ctl/hold-before-$v" ]; then
    echo $$ > "$ctl/waiting.tmp" && mv "$ctl/waiting.tmp" "$ctl/waiting-before-$v"
    while [ -e "$ctl/hold-before-$v" ]; do sleep 0.05; done
  fi
  if [ -e "$ctl/hold-after-$v" ]; then
    /usr/bin/qemu-img "$@"
    rc=$?
    echo $$ > "$ctl/waiting.tmp" && mv "$ctl/waiting.tmp" "$ctl/waiting-after-$v"
    while [ -e "$ctl/hold-after-$v" ]; do sleep 0.05; done
    exit $rc
  fi
fi
exec /usr/bin/qemu-img "$@"
"""


def setUpModule():
    global _stack, _ctl
    why = pvtest.ensure_libvirtd()
    if why:
        raise RuntimeError(why)
    _ctl = tempfile.mkdtemp(prefix="pvtest-qemu-img-")
    wrapper = os.path.join(_ctl, "qemu-img")
    with open(wrapper, "w") as f:
        f.write(WRAPPER % {"ctl": _ctl})
    os.chmod(wrapper, 0o755)
    # libvirt names pools after the Redis prefix and the system's libvirtd is shared: a prefix
    # of this run's own keeps two runs at once (two worktrees) off each other's pools
    prefix = "pvt%d:" % os.getpid()
    _stack = pvtest.Stack(gateways=1, workers=1, agents=[("sn1", "sto")],
                          config={"storage": {"default_node": "sn1", "qemu_img": wrapper},
                                  "redis": {"prefix": prefix},
                                  "worker": {"heartbeat_seconds": 1, "lease_ms": 2000}})
    _stack.prefix = prefix
    _stack.start()


def tearDownModule():
    try:
        if _stack:
            _stack.delete_storage()
            _stack.stop()
    finally:
        if _ctl:
            shutil.rmtree(_ctl, ignore_errors=True)


def qemu_io(path, cmd):
    r = subprocess.run(["qemu-io", "-f", "qcow2", "-c", cmd, path], capture_output=True,
                       text=True)
    return r.returncode == 0 and "Pattern verification failed" not in r.stdout, r.stdout


class Storage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.st = storage_pb2_grpc.StorageServiceStub(cls.stack.channel(0))
        cls.ops = operations_pb2_grpc.OperationServiceStub(cls.stack.channel(0))
        cls.pool_dir = os.path.join(cls.stack.data_dir, "pools", "default")

    def err(self, fn, req):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=30)
        return e.exception.code(), e.exception.details()

    def path(self, vol):
        return os.path.join(self.pool_dir, vol.name)

    def volume(self, name, size=GiB, fmt=S.VOLUME_FORMAT_QCOW2, **kw):
        return self.st.CreateVolume(S.CreateVolumeRequest(name=name, pool="default",
                                                          size_bytes=size, format=fmt, **kw),
                                    timeout=60)

    def test_a_pools(self):
        p = self.st.CreatePool(S.CreatePoolRequest(name="default", type=S.POOL_TYPE_DIR,
                                                   config={"path": self.pool_dir}), timeout=60)
        self.assertEqual((p.name, p.type, p.status), ("default", S.POOL_TYPE_DIR,
                                                       S.POOL_STATUS_ACTIVE))
        self.assertGreater(p.capacity_bytes, 0)
        self.assertTrue(os.path.isdir(self.pool_dir))  # made when missing
        self.assertEqual(self.st.GetPool(S.GetPoolRequest(name="default"), timeout=10).status,
                         S.POOL_STATUS_ACTIVE)
        # the seed's LVM pool, on a machine without that volume group
        f = self.st.CreatePool(S.CreatePoolRequest(
            name="fast-pool", type=S.POOL_TYPE_LVM,
            config={"volume_group": "pivirtd-vg", "thin_pool": "pivirtd-thin"}), timeout=60)
        self.assertEqual(f.status, S.POOL_STATUS_ERROR)
        self.assertIn("libvirt cannot", f.config["status_message"])
        self.assertEqual(f.config["thin_pool"], "pivirtd-thin")
        self.assertEqual([x.name for x in self.st.ListPools(
            S.ListPoolsRequest(type=S.POOL_TYPE_LVM), timeout=10)], ["fast-pool"])
        for req, code, part in (
                (S.CreatePoolRequest(name="x", type=S.POOL_TYPE_DIR, config={"pth": "/tmp/x"}),
                 grpc.StatusCode.INVALID_ARGUMENT, "config.pth: not a key"),
                (S.CreatePoolRequest(name="x", type=S.POOL_TYPE_DIR),
                 grpc.StatusCode.INVALID_ARGUMENT, "config.path: required"),
                (S.CreatePoolRequest(name="x", type=S.POOL_TYPE_DIR, config={"path": "rel"}),
                 grpc.StatusCode.INVALID_ARGUMENT, "config.path: \"rel\" is not an absolute"),
                (S.CreatePoolRequest(name="../x", type=S.POOL_TYPE_DIR,
                                     config={"path": "/tmp/x"}),
                 grpc.StatusCode.INVALID_ARGUMENT, "name: \"../x\" is not a plain name"),
                (S.CreatePoolRequest(name="x", config={"path": "/tmp/x"}),
                 grpc.StatusCode.INVALID_ARGUMENT, "type: required"),
                (S.CreatePoolRequest(name="r", type=S.POOL_TYPE_RBD,
                                     config={"monitors": "mon1:6789", "pool": "rbd"}),
                 grpc.StatusCode.INVALID_ARGUMENT, "config.user: required"),
                (S.CreatePoolRequest(name="default", type=S.POOL_TYPE_DIR,
                                     config={"path": "/tmp/y"}),
                 grpc.StatusCode.ALREADY_EXISTS, "a pool named default already exists")):
            got, msg = self.err(self.st.CreatePool, req)
            self.assertEqual(got, code, msg)
            self.assertIn(part, msg)
        got, _ = self.err(self.st.GetPool, S.GetPoolRequest(name="nope"))
        self.assertEqual(got, grpc.StatusCode.NOT_FOUND)
        # a pool on a node without a running agent: refused at once, nothing left pending
        got, msg = self.err(self.st.CreatePool, S.CreatePoolRequest(
            name="far", type=S.POOL_TYPE_DIR, config={"path": "/tmp/far", "node": "ghost"}))
        self.assertEqual(got, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("node ghost (which holds the pool) is not registered", msg)
        self.st.DeletePool(S.DeletePoolRequest(name="fast-pool"), timeout=30)

    def test_b_volumes(self):
        v = self.volume("data-01", 100 * GiB, labels={"app": "db"})
        self.assertTrue(v.id.startswith("vol-"))
        self.assertEqual((v.name, v.pool, v.size_bytes, v.format, v.status),
                         ("data-01", "default", 100 * GiB, S.VOLUME_FORMAT_QCOW2,
                          S.VOLUME_STATUS_READY))
        self.assertLess(v.used_bytes, 16 << 20)  # thin: almost nothing allocated
        self.assertTrue(os.path.exists(self.path(v)))
        self.assertEqual(self.st.GetVolume(S.GetVolumeRequest(id=v.id), timeout=10).name,
                         "data-01")
        self.assertEqual([x.name for x in self.st.ListVolumes(S.ListVolumesRequest(
            pool="default", labels={"app": "db"}), timeout=10)], ["data-01"])
        capacity = self.st.GetPool(S.GetPoolRequest(name="default"), timeout=10).capacity_bytes
        for req, code, part in (
                (S.CreateVolumeRequest(name="data-01", pool="default", size_bytes=GiB,
                                       format=S.VOLUME_FORMAT_RAW),
                 grpc.StatusCode.ALREADY_EXISTS, "already has a volume named data-01"),
                (S.CreateVolumeRequest(name="z", pool="default", size_bytes=0,
                                       format=S.VOLUME_FORMAT_RAW),
                 grpc.StatusCode.INVALID_ARGUMENT, "size_bytes: 0 is not > 0"),
                (S.CreateVolumeRequest(name="z", pool="default", size_bytes=GiB),
                 grpc.StatusCode.INVALID_ARGUMENT, "format: required"),
                (S.CreateVolumeRequest(name="a/b", pool="default", size_bytes=GiB,
                                       format=S.VOLUME_FORMAT_RAW),
                 grpc.StatusCode.INVALID_ARGUMENT, "name: \"a/b\" is not a plain name"),
                (S.CreateVolumeRequest(name="z", pool="nope", size_bytes=GiB,
                                       format=S.VOLUME_FORMAT_RAW),
                 grpc.StatusCode.NOT_FOUND, "pool: pool nope not found"),
                (S.CreateVolumeRequest(name="huge", pool="default", size_bytes=21 * capacity,
                                       format=S.VOLUME_FORMAT_QCOW2),
                 grpc.StatusCode.RESOURCE_EXHAUSTED, "cannot hold")):
            got, msg = self.err(self.st.CreateVolume, req)
            self.assertEqual(got, code, msg)
            self.assertIn(part, msg)
        r = self.st.ResizeVolume(S.ResizeVolumeRequest(id=v.id, new_size_bytes=200 * GiB),
                                 timeout=60)
        self.assertEqual(r.size_bytes, 200 * GiB)
        got, msg = self.err(self.st.ResizeVolume, S.ResizeVolumeRequest(id=v.id,
                                                                        new_size_bytes=GiB))
        self.assertEqual(got, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("only grow", msg)
        raw = self.volume("raw-01", GiB, S.VOLUME_FORMAT_RAW)
        got, msg = self.err(self.st.CreateSnapshot, S.CreateSnapshotRequest(volume_id=raw.id,
                                                                            name="s"))
        self.assertEqual(got, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("not qcow2", msg)
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=raw.id), timeout=30)
        self.assertFalse(os.path.exists(self.path(raw)))
        got, _ = self.err(self.st.GetVolume, S.GetVolumeRequest(id=raw.id))
        self.assertEqual(got, grpc.StatusCode.NOT_FOUND)

    def snap(self, vol, name):
        s = self.st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=vol.id, name=name),
                                   timeout=60)
        self.assertEqual(s.status, S.SNAPSHOT_STATUS_READY)
        return s

    def restore(self, s):
        op = self.st.RestoreSnapshot(S.RestoreSnapshotRequest(snapshot_id=s.id), timeout=10)
        self.assertEqual(op.kind, "storage.snapshot_restore")
        done = self.ops.WaitOperation(O.WaitOperationRequest(id=op.id, timeout_seconds=60),
                                      timeout=65)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)

    def test_c_snapshot_tree(self):
        v = self.volume("tree", GiB)
        path = self.path(v)
        self.assertTrue(qemu_io(path, "write -P 0x11 0 1M")[0])
        s1 = self.snap(v, "s1")
        self.assertEqual(s1.parent_snapshot_id, "")
        self.assertTrue(qemu_io(path, "write -P 0x22 0 1M")[0])
        s2 = self.snap(v, "s2")
        self.assertEqual(s2.parent_snapshot_id, s1.id)
        self.assertGreater(s2.size_bytes, 0)
        # back to s1 and a new branch from it
        self.restore(s1)
        self.assertTrue(qemu_io(path, "read -P 0x11 0 1M")[0])
        self.assertTrue(qemu_io(path, "write -P 0x33 0 1M")[0])
        s3 = self.snap(v, "s3")
        self.assertEqual(s3.parent_snapshot_id, s1.id)  # a branch
        # the middle snapshot, restored: its data, read back with qemu-io
        self.restore(s2)
        self.assertTrue(qemu_io(path, "read -P 0x22 0 1M")[0])
        listed = list(self.st.ListSnapshots(S.ListSnapshotsRequest(volume_id=v.id), timeout=10))
        self.assertEqual([x.name for x in listed], ["s1", "s2", "s3"])
        order = [x.id for x in listed]
        for x in listed:
            if x.parent_snapshot_id:
                self.assertLess(order.index(x.parent_snapshot_id), order.index(x.id))
        # deleting s1: its children take its parent (none); the others' data stays
        self.st.DeleteSnapshot(S.DeleteSnapshotRequest(id=s1.id), timeout=60)
        got = {x.name: x.parent_snapshot_id for x in self.st.ListSnapshots(
            S.ListSnapshotsRequest(volume_id=v.id), timeout=10)}
        self.assertEqual(got, {"s2": "", "s3": ""})
        self.restore(s3)
        self.assertTrue(qemu_io(path, "read -P 0x33 0 1M")[0])
        self.restore(self.st.GetSnapshot(S.GetSnapshotRequest(id=s2.id), timeout=10))
        self.assertTrue(qemu_io(path, "read -P 0x22 0 1M")[0])
        out = subprocess.run(["qemu-img", "snapshot", "-l", path], capture_output=True,
                             text=True).stdout
        self.assertNotIn(s1.id, out)
        self.assertIn(s2.id, out)
        got, _ = self.err(self.st.GetSnapshot, S.GetSnapshotRequest(id=s1.id))
        self.assertEqual(got, grpc.StatusCode.NOT_FOUND)

    def test_d_clone_and_stats(self):
        src = self.volume("src", 10 * GiB)
        self.assertTrue(qemu_io(self.path(src), "write -P 0x44 0 4M")[0])
        c = self.st.CloneVolume(S.CloneVolumeRequest(source_id=src.id, name="src-clone"),
                                timeout=60)
        self.assertEqual((c.pool, c.size_bytes, c.format, c.status),
                         ("default", 10 * GiB, S.VOLUME_FORMAT_QCOW2, S.VOLUME_STATUS_READY))
        self.assertNotEqual(c.id, src.id)
        # sparse: the clone holds about what the source holds, not its virtual size
        self.assertLess(c.used_bytes, 64 << 20)
        self.assertTrue(qemu_io(self.path(c), "read -P 0x44 0 4M")[0])
        # the source changes and goes: the clone keeps its data
        self.assertTrue(qemu_io(self.path(src), "write -P 0x55 0 4M")[0])
        self.assertTrue(qemu_io(self.path(c), "read -P 0x44 0 4M")[0])
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=src.id), timeout=30)
        self.assertTrue(qemu_io(self.path(c), "read -P 0x44 0 4M")[0])
        stats = self.st.GetPoolStats(S.GetPoolStatsRequest(name="default"), timeout=10)
        vols = list(self.st.ListVolumes(S.ListVolumesRequest(pool="default"), timeout=10))
        snaps = sum(len(list(self.st.ListSnapshots(S.ListSnapshotsRequest(volume_id=v.id),
                                                   timeout=10))) for v in vols)
        self.assertEqual((stats.volume_count, stats.snapshot_count), (len(vols), snaps))
        self.assertGreater(stats.capacity_bytes, 0)
        self.assertAlmostEqual(stats.usage_percent,
                               100.0 * stats.used_bytes / stats.capacity_bytes, places=3)
        got, msg = self.err(self.st.DeletePool, S.DeletePoolRequest(name="default"))
        self.assertEqual(got, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("still holds", msg)

    def test_e_seed_examples_through_reflection(self):
        url = "http://%s/pivirt.storage.v1.StorageService/" % self.stack.gateways[0].addrs[0]

        def call(method, body):
            rc, out, err = pvtest.buf_curl("--protocol", "grpc", "--http2-prior-knowledge",
                                           "-d", json.dumps(body), url + method, check=False)
            self.assertEqual(rc, 0, err)
            return json.loads(out)

        # volumes are named by id or by their (unique) name: the seed's "vol-abc123"
        self.volume("vol-abc123", 100 * GiB)
        v = call("CreateVolume", {"name": "data-02", "pool": "default",
                                  "size_bytes": 107374182400, "format": "VOLUME_FORMAT_QCOW2"})
        self.assertEqual((v["status"], v["sizeBytes"]), ("VOLUME_STATUS_READY", "107374182400"))
        r = call("ResizeVolume", {"id": "vol-abc123", "new_size_bytes": 214748364800})
        self.assertEqual(r["sizeBytes"], "214748364800")
        c = call("CloneVolume", {"source_id": "vol-abc123", "name": "data-01-clone",
                                 "pool": "default"})
        self.assertEqual((c["name"], c["status"]), ("data-01-clone", "VOLUME_STATUS_READY"))
        s = call("CreateSnapshot", {"volume_id": "vol-abc123", "name": "backup-01"})
        self.assertEqual((s["name"], s["status"]), ("backup-01", "SNAPSHOT_STATUS_READY"))
        stats = call("GetPoolStats", {"name": "default"})
        self.assertEqual(stats["name"], "default")
        self.assertGreaterEqual(stats["volumeCount"], 4)
        self.assertGreaterEqual(stats["snapshotCount"], 1)

    def test_f_agent_killed_mid_clone(self):
        # a clone big enough to take a while; its agent is killed while it copies
        src = self.volume("big", 10 * GiB)
        fill = subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 0x66 0 768M",
                               self.path(src)], capture_output=True)
        self.assertEqual(fill.returncode, 0, fill.stderr)
        agent = self.stack.agents[0]
        fut = self.st.CloneVolume.future(S.CloneVolumeRequest(source_id=src.id, name="big-copy"),
                                         timeout=120)
        tmp = None
        deadline = pvtest.time.monotonic() + 20
        while tmp is None and not fut.done() and pvtest.time.monotonic() < deadline:
            found = [f for f in os.listdir(self.pool_dir) if f.startswith(".pvtmp-")]
            tmp = found[0] if found else None
            pvtest.time.sleep(0.01)
        if tmp is None and fut.done():
            # a file system with reflinks clones at once: there is no middle to kill it in
            c = fut.result()
            self.assertTrue(qemu_io(self.path(c), "read -P 0x66 0 768M")[0])
            for v in (c, src):
                self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=30)
            self.skipTest("the clone was a reflink, done before it could be interrupted")
        self.assertIsNotNone(tmp, "the clone never started copying")
        agent.kill9()
        # no half-written volume: no record, no volume file of that name
        names = [v.name for v in self.st.ListVolumes(S.ListVolumesRequest(pool="default"),
                                                     timeout=10)]
        self.assertNotIn("big-copy", names)
        self.assertFalse(os.path.exists(os.path.join(self.pool_dir, "big-copy")))
        agent.start()
        # the operation is redelivered to the restarted agent, which copies again from the start
        c = fut.result()
        self.assertEqual((c.name, c.status), ("big-copy", S.VOLUME_STATUS_READY))
        self.assertTrue(qemu_io(self.path(c), "read -P 0x66 0 768M")[0])
        self.assertEqual([f for f in os.listdir(self.pool_dir) if f.startswith(".pvtmp-")], [])
        for v in (c, src):
            self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=30)

    def record(self, vol_id):
        """The volume's record as the agent wrote it in Redis."""
        return json.loads(self.stack.redis_cli("GET", self.stack.key("{sto}:vol:" + vol_id)))

    def wait_file(self, path, what, timeout=20):
        deadline = pvtest.time.monotonic() + timeout
        while not os.path.exists(path):
            self.assertLess(pvtest.time.monotonic(), deadline, what)
            pvtest.time.sleep(0.02)
        with open(path) as f:
            return int(f.read().strip())

    def gone(self, pid, timeout=10):
        """Whether process pid is gone (or only a zombie) within timeout seconds."""
        deadline = pvtest.time.monotonic() + timeout
        while pvtest.time.monotonic() < deadline:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return True
            except FileNotFoundError:
                return True
            pvtest.time.sleep(0.05)
        return False

    def killed_mid_restore(self, vol, path, snap, old_snap, hold, data_then):
        """Restores vol to snap with the wrapper holding at `hold`, SIGKILLs the agent there,
        checks the state it left (the data: the pattern data_then), restarts the agent and
        checks the completed restore."""
        agent = self.stack.agents[0]
        flag = os.path.join(_ctl, hold)
        waiting = os.path.join(_ctl, hold.replace("hold", "waiting"))
        open(flag, "w").close()
        try:
            op = self.st.RestoreSnapshot(S.RestoreSnapshotRequest(snapshot_id=snap.id),
                                         timeout=10)
            pid = self.wait_file(waiting, "the restore never ran qemu-img")
            agent.kill9()
            # the qemu-img the agent ran dies with it: nothing left to race the next delivery
            self.assertTrue(self.gone(pid), "qemu-img (pid %d) outlived its agent" % pid)
        finally:
            os.unlink(flag)
        os.unlink(waiting)
        self.assertTrue(qemu_io(path, "read -P %s 0 2M" % data_then)[0])
        rec = self.record(vol.id)
        # the record is whole and still at the old snapshot; the restore is journaled on it
        self.assertEqual((rec["current_snapshot"], rec["restoring"], rec["restore_op"]),
                         (old_snap.id, snap.id, op.id))
        self.assertEqual(rec["status"], S.VOLUME_STATUS_READY)
        cur = self.ops.GetOperation(O.GetOperationRequest(id=op.id), timeout=10)
        self.assertFalse(cur.done)
        self.assertEqual(cur.status, O.OPERATION_STATUS_RUNNING)
        agent.start()
        done = self.ops.WaitOperation(O.WaitOperationRequest(id=op.id, timeout_seconds=60),
                                      timeout=65)
        self.assertEqual((done.status, done.done), (O.OPERATION_STATUS_SUCCEEDED, True), done)
        rec = self.record(vol.id)
        self.assertEqual(rec["current_snapshot"], snap.id)
        self.assertNotIn("restoring", rec)
        self.assertEqual(self.st.GetVolume(S.GetVolumeRequest(id=vol.id), timeout=10).status,
                         S.VOLUME_STATUS_READY)
        chk = subprocess.run(["qemu-img", "check", "-f", "qcow2", path], capture_output=True,
                             text=True)
        self.assertEqual(chk.returncode, 0, chk.stdout + chk.stderr)  # no leaks, no corruption

    def test_h_agent_killed_mid_restore(self):
        v = self.volume("restore-me", GiB)
        path = self.path(v)
        self.assertTrue(qemu_io(path, "write -P 0x11 0 2M")[0])
        s1 = self.snap(v, "r1")
        self.assertTrue(qemu_io(path, "write -P 0x22 0 2M")[0])
        s2 = self.snap(v, "r2")
        self.assertEqual(s2.parent_snapshot_id, s1.id)
        self.assertTrue(qemu_io(path, "write -P 0x77 0 2M")[0])  # live data, in no snapshot

        # killed while the restore's qemu-img runs, before it changed anything
        self.killed_mid_restore(v, path, s1, s2, "hold-before-a", data_then="0x77")  # untouched
        self.assertTrue(qemu_io(path, "read -P 0x11 0 2M")[0])
        s3 = self.snap(v, "r3")
        self.assertEqual(s3.parent_snapshot_id, s1.id)  # the record was at s1: a branch

        # killed after qemu-img applied s2, before the record said so
        self.assertTrue(qemu_io(path, "write -P 0x33 0 2M")[0])
        self.killed_mid_restore(v, path, s2, s3, "hold-after-a", data_then="0x22")  # s2's already
        self.assertTrue(qemu_io(path, "read -P 0x22 0 2M")[0])
        s4 = self.snap(v, "r4")
        self.assertEqual(s4.parent_snapshot_id, s2.id)

        # the tree is whole: every snapshot listed once with its parent, each restorable
        got = {x.name: x.parent_snapshot_id for x in self.st.ListSnapshots(
            S.ListSnapshotsRequest(volume_id=v.id), timeout=10)}
        self.assertEqual(got, {"r1": "", "r2": s1.id, "r3": s1.id, "r4": s2.id})
        listing = subprocess.run(["qemu-img", "snapshot", "-l", path], capture_output=True,
                                 text=True).stdout
        self.assertEqual(sorted(x for x in (s1.id, s2.id, s3.id, s4.id) if x in listing),
                         sorted((s1.id, s2.id, s3.id, s4.id)))
        self.assertEqual(listing.count("snap-"), 4)  # no snapshot taken twice
        self.restore(s3)
        self.assertTrue(qemu_io(path, "read -P 0x11 0 2M")[0])
        self.restore(s2)
        self.assertTrue(qemu_io(path, "read -P 0x22 0 2M")[0])
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=30)

    def test_i_agent_killed_mid_snapshot(self):
        v = self.volume("snap-me", GiB)
        path = self.path(v)
        self.assertTrue(qemu_io(path, "write -P 0x44 0 1M")[0])
        c0 = self.snap(v, "c0")
        self.assertTrue(qemu_io(path, "write -P 0x55 0 1M")[0])
        agent = self.stack.agents[0]
        flag, waiting = os.path.join(_ctl, "hold-after-c"), os.path.join(_ctl, "waiting-after-c")
        open(flag, "w").close()
        try:
            fut = self.st.CreateSnapshot.future(S.CreateSnapshotRequest(volume_id=v.id, name="c1"),
                                                timeout=120)
            pid = self.wait_file(waiting, "the snapshot never ran qemu-img")
            agent.kill9()
            self.assertTrue(self.gone(pid), "qemu-img (pid %d) outlived its agent" % pid)
        finally:
            os.unlink(flag)
        os.unlink(waiting)
        # qemu-img made it; nothing recorded it yet
        listing = subprocess.run(["qemu-img", "snapshot", "-l", path], capture_output=True,
                                 text=True).stdout
        self.assertEqual(listing.count("snap-"), 2, listing)
        self.assertEqual([x.name for x in self.st.ListSnapshots(
            S.ListSnapshotsRequest(volume_id=v.id), timeout=10)], ["c0"])
        self.assertEqual(self.record(v.id)["current_snapshot"], c0.id)
        agent.start()
        c1 = fut.result()
        self.assertEqual((c1.name, c1.status, c1.parent_snapshot_id),
                         ("c1", S.SNAPSHOT_STATUS_READY, c0.id))
        listing = subprocess.run(["qemu-img", "snapshot", "-l", path], capture_output=True,
                                 text=True).stdout
        self.assertEqual((listing.count("snap-"), listing.count(c1.id)), (2, 1), listing)
        self.assertEqual(self.record(v.id)["current_snapshot"], c1.id)
        self.restore(c0)
        self.assertTrue(qemu_io(path, "read -P 0x44 0 1M")[0])
        self.restore(c1)
        self.assertTrue(qemu_io(path, "read -P 0x55 0 1M")[0])
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=30)

    def test_j_retried_calls_are_answered_from_their_first_operation(self):
        """A call whose answer was lost (a gateway killed, a connection cut) is retried with the
        same x-request-id: it gets the first call's result, never a second resource, and a
        retried delete succeeds although the first already removed the volume."""
        def md(rid):
            return (("x-request-id", rid),)
        req = S.CreateVolumeRequest(name="retried", pool="default", size_bytes=GiB,
                                    format=S.VOLUME_FORMAT_QCOW2)
        first = self.st.CreateVolume(req, timeout=60, metadata=md("j-create"))
        again = self.st.CreateVolume(req, timeout=60, metadata=md("j-create"))
        self.assertEqual(again.id, first.id)
        self.assertEqual(again.status, S.VOLUME_STATUS_READY)
        names = [v.name for v in self.st.ListVolumes(S.ListVolumesRequest(pool="default"),
                                                       timeout=10)]
        self.assertEqual(names.count("retried"), 1)
        snap = self.st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=first.id, name="s1"),
                                      timeout=60, metadata=md("j-snap"))
        snap2 = self.st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=first.id, name="s1"),
                                       timeout=60, metadata=md("j-snap"))
        self.assertEqual(snap2.id, snap.id)
        self.assertEqual(len(list(self.st.ListSnapshots(
            S.ListSnapshotsRequest(volume_id=first.id), timeout=10))), 1)
        clone = self.st.CloneVolume(S.CloneVolumeRequest(source_id=first.id, name="retried-c"),
                                    timeout=60, metadata=md("j-clone"))
        clone2 = self.st.CloneVolume(S.CloneVolumeRequest(source_id=first.id, name="retried-c"),
                                     timeout=60, metadata=md("j-clone"))
        self.assertEqual(clone2.id, clone.id)
        # a request id names one call: reusing it for another call is refused
        code, msg = self.err_md(self.st.DeleteVolume, S.DeleteVolumeRequest(id=clone.id),
                                md("j-clone"))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("x-request-id", msg)
        self.assertIn("storage.volume_clone", msg)
        for vid, rid in ((clone.id, "j-del-c"), (first.id, "j-del")):
            self.st.DeleteVolume(S.DeleteVolumeRequest(id=vid), timeout=60, metadata=md(rid))
            self.st.DeleteVolume(S.DeleteVolumeRequest(id=vid), timeout=60, metadata=md(rid))
        # without the request id a second delete is an honest NOT_FOUND
        code, _ = self.err(self.st.DeleteVolume, S.DeleteVolumeRequest(id=first.id))
        self.assertEqual(code, grpc.StatusCode.NOT_FOUND)

    def err_md(self, fn, req, metadata):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=30, metadata=metadata)
        return e.exception.code(), e.exception.details()

    def test_g_volumes_found_in_the_pool_are_recorded(self):
        # an image an operator put into the pool's directory (as an iSCSI target's LUNs appear
        # in its pool): recorded at the pool's next refresh, after any change in it
        found = os.path.join(self.pool_dir, "found.qcow2")
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", found, "1G"], check=True)
        trigger = self.volume("trigger", GiB)
        got = {v.name: v for v in self.st.ListVolumes(S.ListVolumesRequest(pool="default"),
                                                      timeout=10)}
        self.assertIn("found.qcow2", got)
        v = got["found.qcow2"]
        self.assertEqual((v.size_bytes, v.format, v.status),
                         (GiB, S.VOLUME_FORMAT_QCOW2, S.VOLUME_STATUS_READY))
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=30)
        self.assertFalse(os.path.exists(found))
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=trigger.id), timeout=30)


if __name__ == "__main__":
    unittest.main(verbosity=2)
