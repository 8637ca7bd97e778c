#!/usr/bin/python3
"""Two stacks side by side keep their own pools and volumes.

Two whole stacks as `./ops/pivirt up` starts them on one machine, each in its own data
directory, on its own ports and with its own key prefix (PIVIRT_DATA_DIR, PIVIRT_REDIS_PORT,
PIVIRT_GATEWAY_LISTEN, PIVIRT_METRICS_PORT, PIVIRT_KEY_PREFIX), share the system libvirtd. Each
has a pool `default` (up creates it) and one the test creates under the same name in both; each
libvirt pool must point at its own stack's directory, each stack must list only its own
volumes (libvirt's view of the pool too), a volume deleted in one must leave the other's
volume of the same name whole, and `down` of both must leave nothing of either running.
"""
import os
import socket
import time
import unittest
import xml.etree.ElementTree as ET

import grpc

import pvtest


def target_path(xml):
    return ET.fromstring(xml).findtext("./target/path")


class TwoStacks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        err = pvtest.ensure_libvirtd()
        if err:
            raise unittest.SkipTest(err)
        from pivirt.storage.v1 import storage_pb2
        cls.S = storage_pb2
        cls.stacks = [pvtest.OpsStack("a"), pvtest.OpsStack("b")]

    @classmethod
    def tearDownClass(cls):
        for st in cls.stacks:
            st.close()

    def run(self, result=None):
        # A failing test keeps both stacks' files for inspection.
        before = len(result.failures) + len(result.errors) if result else 0
        out = super().run(result)
        if result and len(result.failures) + len(result.errors) > before:
            for st in self.stacks:
                st.failed = True
        return out

    def pool_dir(self, st, name):
        return os.path.join(st.data, "pools", name)

    def volumes(self, st, pool):
        return sorted(v.name for v in st.storage.ListVolumes(self.S.ListVolumesRequest(pool=pool),
                                                             timeout=30))

    def libvirt_volumes(self, st, pool):
        """{path: libvirt's volume name} of the stack's pool POOL, as libvirt lists them."""
        lv = st.libvirt_pool(pool)
        pvtest.virsh("pool-refresh", lv)
        out = pvtest.virsh("vol-list", lv)
        rows = [ln.split() for ln in out.splitlines()[2:] if ln.strip()]
        return {r[1]: r[0] for r in rows}

    def test_two_stacks_keep_their_own_pools_and_volumes(self):
        a, b = self.stacks
        for st in self.stacks:
            st.up()
        # Both stacks live at once, every process up, none of them shared.
        pids = [st.pids() for st in self.stacks]
        self.assertEqual(sorted(pids[0]), sorted(pids[1]))
        self.assertEqual(len(pids[0]), 6, pids[0])
        self.assertFalse(set(pids[0].values()) & set(pids[1].values()))
        for st in self.stacks:
            r = st.pivirt("status", timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

        # The same pool names in both: `default` from up, `scratch` created here.
        for st in self.stacks:
            st.storage.CreatePool(self.S.CreatePoolRequest(
                name="scratch", type=self.S.POOL_TYPE_DIR,
                config={"path": self.pool_dir(st, "scratch")}), timeout=60)
        for st in self.stacks:
            names = sorted(p.name for p in st.storage.ListPools(self.S.ListPoolsRequest(),
                                                                 timeout=30))
            self.assertEqual(names, ["default", "scratch"], st.prefix)
            for pool in ("default", "scratch"):
                p = st.storage.GetPool(self.S.GetPoolRequest(name=pool), timeout=30)
                self.assertEqual(p.status, self.S.POOL_STATUS_ACTIVE, (st.prefix, pool))
                self.assertEqual(p.config["path"], self.pool_dir(st, pool))
                # libvirt's definition of this stack's pool points at this stack's directory
                xml = pvtest.virsh("pool-dumpxml", st.libvirt_pool(pool))
                self.assertEqual(target_path(xml), self.pool_dir(st, pool), xml)
                info = pvtest.virsh("pool-info", st.libvirt_pool(pool))
                self.assertRegex(info, r"State:\s+running", info)
        self.assertNotEqual(a.libvirt_pool("default"), b.libvirt_pool("default"))

        # Volumes: one of its own in each stack, and one named alike in both.
        gib = 1 << 30
        made = {}
        for st, own in ((a, "only-a"), (b, "only-b")):
            for name in (own, "shared"):
                v = st.storage.CreateVolume(self.S.CreateVolumeRequest(
                    name=name, pool="default", size_bytes=gib,
                    format=self.S.VOLUME_FORMAT_QCOW2), timeout=60)
                made[(st.prefix, name)] = v.id
        self.assertEqual(self.volumes(a, "default"), ["only-a", "shared"])
        self.assertEqual(self.volumes(b, "default"), ["only-b", "shared"])
        self.assertEqual(self.volumes(a, "scratch"), [])
        for st in self.stacks:
            files = self.libvirt_volumes(st, "default")
            self.assertEqual(len(files), 2, files)
            for path in files:
                self.assertEqual(os.path.dirname(path), self.pool_dir(st, "default"), files)
                self.assertTrue(os.path.isfile(path), path)
        # One stack's id means nothing to the other.
        with self.assertRaises(grpc.RpcError) as cm:
            b.storage.GetVolume(self.S.GetVolumeRequest(id=made[(a.prefix, "only-a")]), timeout=30)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

        # Deleting a's `shared` leaves b's `shared` (and its file) as it was.
        b_files = self.libvirt_volumes(b, "default")
        a.storage.DeleteVolume(self.S.DeleteVolumeRequest(id=made[(a.prefix, "shared")]),
                               timeout=60)
        self.assertEqual(self.volumes(a, "default"), ["only-a"])
        self.assertEqual(self.volumes(b, "default"), ["only-b", "shared"])
        self.assertEqual(len(self.libvirt_volumes(a, "default")), 1)
        self.assertEqual(self.libvirt_volumes(b, "default"), b_files)
        for path in b_files:
            self.assertTrue(os.path.isfile(path), path)
        v = b.storage.GetVolume(self.S.GetVolumeRequest(id=made[(b.prefix, "shared")]),
                                timeout=30)
        self.assertEqual((v.name, v.size_bytes), ("shared", gib))
        # And a pool deleted in b leaves a's pool of the same name running.
        b.storage.DeletePool(self.S.DeletePoolRequest(name="scratch"), timeout=60)
        self.assertIsNone(pvtest.virsh("pool-info", b.libvirt_pool("scratch"), check=False))
        xml = pvtest.virsh("pool-dumpxml", a.libvirt_pool("scratch"))
        self.assertEqual(target_path(xml), self.pool_dir(a, "scratch"))
        self.assertEqual(a.storage.GetPool(self.S.GetPoolRequest(name="scratch"),
                                           timeout=30).status, self.S.POOL_STATUS_ACTIVE)

        # down of both: nothing of either keeps running, and status says so.
        for st, before in zip(self.stacks, pids):
            r = st.pivirt("down", timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            for name, pid in before.items():
                self.assertFalse(alive(pid), "%s %s (pid %d) still runs" % (st.prefix, name, pid))
            self.assertEqual(st.pids(), {})
            r = st.pivirt("status", timeout=60)
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            self.assertEqual([ln.split()[-1] for ln in r.stdout.split("\n") if ln.strip()],
                             ["down"] * 6, r.stdout)
            # nothing listens on its Redis port or its gateway's any more
            for port in (st.redis_port, int(st.addr.rsplit(":", 1)[1])):
                with self.assertRaises(ConnectionRefusedError):
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
            self.assertEqual(st.logs_with_sanitizer_reports(), [])


def alive(pid):
    """True while PID runs (a zombie does not count); gives it a few seconds to go."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return False
        except (OSError, IndexError):
            return False
        time.sleep(0.05)
    return True


if __name__ == "__main__":
    pvtest.main()
