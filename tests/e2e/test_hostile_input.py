#!/usr/bin/python3
"""End-to-end tests of hostile input (issue 22) through real clients, on a stack whose node agent
hn1 holds real DIR pools through the system libvirtd:

  test_a  pools outside the node's storage roots (/, /etc, /dev, /proc, a directory of /tmp; an
          NFS mount point on /etc) are INVALID_ARGUMENT naming config.path, the value and the
          roots, and libvirt never hears of them (no pool of this run's prefix, no pool of any
          name at those paths); the same path inside the roots works.
  test_b  paths that are not canonical, too long, or reached through a symbolic link made below
          a root; overcommit ratios that are not finite or past 1000.
  test_c  a pool whose directory was swapped for a link to a host directory after it was made
          (as a pool made before roots existed would be): no file there can be read (cloned),
          resized, snapshotted or deleted through the API, nor written by a clone or a create into
          that pool; the host files are unchanged; the audit reports POOL_OUTSIDE_ROOTS.
  test_d  a pool's directory holding a link to a host file, a fifo, a character device, a
          directory and a qcow2 image: only the image becomes a volume.
  test_e  NUL bytes inside strings (top-level fields, map keys and values, repeated fields) are
          refused INVALID_ARGUMENT (or the call's Eru code) naming the field, on every API; no
          pool named after the part before the NUL appears. bytes fields keep their NULs.
  test_f  sizes at INT64_MAX: CreateVolume and ResizeVolume are RESOURCE_EXHAUSTED naming the
          field, the volume's file untouched.
  test_h  malformed names and ids (with '/', "..", 1 MiB long) are INVALID_ARGUMENT naming the
          field, not NOT_FOUND echoing them; a well-formed unknown one stays NOT_FOUND.
  test_g  a libvirt pool of the name CreatePool would use that this system did not define (another
          stack's, an operator's) is never stopped, undefined or repointed: FAILED_PRECONDITION
          naming it; a pool this system made and another definition replaced behind its back is
          left to its owner when DeletePool runs.
"""
import os
import shutil
import stat
import subprocess
import tempfile
import unittest

import grpc

import pvtest
from pb import core_pb2
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc

S = storage_pb2
INT64_MAX = (1 << 63) - 1
_stack = None
_outside = None  # a host directory outside every root, with a file that must stay as it is
SECRET = b"host secret: must never be read, changed or removed through the API\n"


def setUpModule():
    global _stack, _outside
    why = pvtest.ensure_libvirtd()
    if why:
        raise RuntimeError(why)
    _outside = tempfile.mkdtemp(prefix="pvtest-outside-")
    with open(os.path.join(_outside, "secret"), "wb") as f:
        f.write(SECRET)
    prefix = "pvh%d:" % os.getpid()
    _stack = pvtest.Stack(gateways=1, workers=1, agents=[("hn1", "hostile")],
                          config={"storage": {"default_node": "hn1"},
                                  "redis": {"prefix": prefix}})
    _stack.prefix = prefix
    _stack.start()


def tearDownModule():
    try:
        if _stack:
            _stack.delete_storage(strict=False)
            _stack.stop()
    finally:
        if _outside:
            shutil.rmtree(_outside, ignore_errors=True)


def virsh(*args):
    r = subprocess.run(["virsh", "-c", "qemu:///system"] + list(args), capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stdout


def libvirt_pool_paths():
    """name -> target path of every pool the system libvirtd has."""
    out = {}
    _, names = virsh("pool-list", "--all", "--name")
    for name in names.split():
        rc, xml = virsh("pool-dumpxml", name)
        if rc == 0 and "<path>" in xml:
            out[name] = xml.split("<path>", 1)[1].split("</path>", 1)[0]
    return out


def outside_state():
    return sorted((n, open(os.path.join(_outside, n), "rb").read())
                  for n in os.listdir(_outside))


class Hostile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.st = storage_pb2_grpc.StorageServiceStub(cls.stack.channel(0))
        cls.roots = os.path.join(cls.stack.data_dir, "pools")
        cls.lv_prefix = cls.stack.prefix.replace(":", "-")

    def err(self, fn, req, timeout=60):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=timeout)
        return e.exception.code(), e.exception.details()

    def assert_refused(self, fn, req, code, *parts):
        got, msg = self.err(fn, req)
        self.assertEqual(got, code, msg)
        for p in parts:
            self.assertIn(p, msg)
        return msg

    def pool(self, name):
        path = os.path.join(self.roots, name)
        p = self.st.CreatePool(S.CreatePoolRequest(name=name, type=S.POOL_TYPE_DIR,
                                                   config={"path": path}), timeout=60)
        self.assertEqual(p.status, S.POOL_STATUS_ACTIVE, p.config.get("status_message"))
        return path

    def test_a_pools_only_in_the_storage_roots(self):
        before = libvirt_pool_paths()
        hostile = ("/", "/etc", "/dev", "/proc", _outside, "/var/lib/libvirt")
        for path in hostile:
            self.assert_refused(
                self.st.CreatePool, S.CreatePoolRequest(
                    name="evil", type=S.POOL_TYPE_DIR, config={"path": path}),
                grpc.StatusCode.INVALID_ARGUMENT,
                'config.path: "%s" is outside the storage roots of this node' % path,
                self.roots, "/var/lib/libvirt/images", "storage.roots")
        self.assert_refused(
            self.st.CreatePool, S.CreatePoolRequest(
                name="evil", type=S.POOL_TYPE_NFS,
                config={"server": "nfs.example", "export": "/srv", "path": "/etc"}),
            grpc.StatusCode.INVALID_ARGUMENT,
            'config.path: "/etc" is outside the storage roots')
        self.assertEqual([p.name for p in self.st.ListPools(S.ListPoolsRequest(), timeout=10)
                          if p.name == "evil"], [])
        after = libvirt_pool_paths()
        self.assertFalse([n for n in after if n.startswith(self.lv_prefix)], after)
        # no pool of any name points at a refused path (other tests, running at the same time
        # on the same libvirtd, may define pools of their own meanwhile)
        self.assertEqual({n: p for n, p in after.items()
                          if n not in before and os.path.normpath(p) in hostile}, {})
        self.assertEqual(oct(os.stat("/etc").st_mode & 0o7777), oct(0o755))
        # inside the roots, made when missing (parents too)
        deep = os.path.join(self.roots, "a", "b")
        p = self.st.CreatePool(S.CreatePoolRequest(name="deep", type=S.POOL_TYPE_DIR,
                                                   config={"path": deep}), timeout=60)
        self.assertEqual(p.status, S.POOL_STATUS_ACTIVE, p.config.get("status_message"))
        self.assertTrue(os.path.isdir(deep))
        self.assertEqual(libvirt_pool_paths().get(self.lv_prefix + "deep"), deep)
        self.st.DeletePool(S.DeletePoolRequest(name="deep"), timeout=30)

    def test_b_paths_links_and_ratios(self):
        link = os.path.join(self.roots, "sneaky")
        os.makedirs(self.roots, exist_ok=True)
        os.symlink(_outside, link)
        try:
            for path in (link, os.path.join(link, "sub")):
                self.assert_refused(
                    self.st.CreatePool, S.CreatePoolRequest(
                        name="sneaky", type=S.POOL_TYPE_DIR, config={"path": path}),
                    grpc.StatusCode.INVALID_ARGUMENT,
                    'config.path: "%s"' % path[:60], "is a symbolic link or not a directory")
            self.assertFalse(os.path.exists(os.path.join(_outside, "sub")))
        finally:
            os.unlink(link)
        for path, part in ((self.roots + "/x/../../../../etc", "not in canonical form"),
                           (self.roots + "//x", "not in canonical form"),
                           (self.roots + "/x/", "not in canonical form"),
                           (self.roots + "/" + "x" * 65536, "longer than 1024")):
            self.assert_refused(
                self.st.CreatePool, S.CreatePoolRequest(
                    name="odd", type=S.POOL_TYPE_DIR, config={"path": path}),
                grpc.StatusCode.INVALID_ARGUMENT, "config.path: ", part)
        for ratio in ("1e400", "inf", "nan", "1001", "0.5"):
            self.assert_refused(
                self.st.CreatePool, S.CreatePoolRequest(
                    name="odd", type=S.POOL_TYPE_DIR,
                    config={"path": self.roots + "/odd", "max_overcommit": ratio}),
                grpc.StatusCode.INVALID_ARGUMENT,
                'config.max_overcommit: "%s" is not a ratio from 1 to 1000' % ratio)
        self.assert_refused(
            self.st.CreatePool, S.CreatePoolRequest(
                name="odd", type=S.POOL_TYPE_LVM,
                config={"volume_group": "../etc", "devices": "/etc/passwd"}),
            grpc.StatusCode.INVALID_ARGUMENT, "config.")

    def test_c_nothing_outside_through_a_swapped_pool(self):
        victim = self.pool("victim")
        self.pool("safe")
        v = self.st.CreateVolume(S.CreateVolumeRequest(
            name="v1", pool="victim", size_bytes=1 << 20, format=S.VOLUME_FORMAT_RAW),
            timeout=60)
        # the pool's directory becomes a link to a host directory holding a file named as the
        # volume: what the API does to "v1" would now be done to a host file
        shutil.move(victim, victim + ".away")
        with open(os.path.join(_outside, "v1"), "wb") as f:
            f.write(SECRET)
        os.symlink(_outside, victim)
        host = outside_state()
        try:
            for fn, req, field in (
                    (self.st.CloneVolume, S.CloneVolumeRequest(
                        source_id=v.id, name="stolen", pool="safe"), "volume v1"),
                    (self.st.ResizeVolume, S.ResizeVolumeRequest(
                        id=v.id, new_size_bytes=1 << 30), "volume v1"),
                    (self.st.DeleteVolume, S.DeleteVolumeRequest(id=v.id), "volume v1"),
                    (self.st.CreateVolume, S.CreateVolumeRequest(
                        name="planted", pool="victim", size_bytes=1 << 20,
                        format=S.VOLUME_FORMAT_RAW), "pool victim"),
                    (self.st.CloneVolume, S.CloneVolumeRequest(
                        source_id=v.id, name="planted", pool="victim"), "volume v1")):
                msg = self.assert_refused(fn, req, grpc.StatusCode.FAILED_PRECONDITION, field,
                                          "is a symbolic link or not a directory")
                self.assertIn(victim, msg)
            self.assertEqual(outside_state(), host)
            self.assertFalse([x for x in self.st.ListVolumes(S.ListVolumesRequest(pool="safe"),
                                                             timeout=10) if x.name == "stolen"])
            self.assertFalse(os.path.exists(os.path.join(self.roots, "safe", "stolen")))
            self.assertEqual(self.st.GetVolume(S.GetVolumeRequest(id=v.id), timeout=10).size_bytes,
                             1 << 20)
            diffs = self.stack.check()
            self.assertTrue([d for d in diffs if d.startswith("POOL_OUTSIDE_ROOTS victim:") and
                             "is a symbolic link" in d], diffs)
        finally:
            os.unlink(victim)
            shutil.move(victim + ".away", victim)
            os.unlink(os.path.join(_outside, "v1"))
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=60)
        self.assertFalse(os.path.exists(os.path.join(victim, "v1")))
        self.assertEqual(outside_state(), [("secret", SECRET)])
        self.st.DeletePool(S.DeletePoolRequest(name="victim"), timeout=30)
        self.assertEqual(self.stack.check(), [])

    def test_d_only_regular_image_files_are_imported(self):
        d = self.pool("mixed")
        os.symlink("/etc/hostname", os.path.join(d, "hostname"))
        os.symlink(os.path.join(_outside, "secret"), os.path.join(d, "secret"))
        os.mkfifo(os.path.join(d, "pipe"))
        os.mknod(os.path.join(d, "null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        os.mkdir(os.path.join(d, "subdir"))
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", os.path.join(d, "disk"),
                        "1M"], check=True)
        # a change in the pool refreshes it, and the refresh imports what it may
        made = self.st.CreateVolume(S.CreateVolumeRequest(name="made", pool="mixed",
                                                          size_bytes=1 << 20,
                                                          format=S.VOLUME_FORMAT_RAW), timeout=60)
        names = sorted(v.name for v in self.st.ListVolumes(S.ListVolumesRequest(pool="mixed"),
                                                           timeout=10))
        self.assertEqual(names, ["disk", "made"])
        for v in self.st.ListVolumes(S.ListVolumesRequest(pool="mixed"), timeout=10):
            self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=60)
        self.assertEqual(sorted(os.listdir(d)), ["hostname", "null", "pipe", "secret", "subdir"])
        self.assertEqual(outside_state(), [("secret", SECRET)])
        self.assertNotEqual(made.id, "")

    def test_e_nul_bytes_are_refused_where_decoded(self):
        bad = grpc.StatusCode.INVALID_ARGUMENT
        self.pool("default")
        self.assert_refused(self.st.GetPool, S.GetPoolRequest(name="default\x00zzz"), bad,
                            "name: holds a NUL byte (at byte 7)")
        self.assert_refused(self.st.CreatePool, S.CreatePoolRequest(
            name="a\x00b", type=S.POOL_TYPE_DIR, config={"path": self.roots + "/a"}), bad,
            "name: holds a NUL byte")
        self.assert_refused(self.st.CreatePool, S.CreatePoolRequest(
            name="a", type=S.POOL_TYPE_DIR, config={"path": self.roots + "/a\x00/../x"}), bad,
            "config.value: holds a NUL byte")
        self.assert_refused(self.st.CreatePool, S.CreatePoolRequest(
            name="a", type=S.POOL_TYPE_DIR, config={"pa\x00th": self.roots + "/a"}), bad,
            "config.key: holds a NUL byte")
        self.assertFalse([p for p in self.st.ListPools(S.ListPoolsRequest(), timeout=10)
                          if p.name == "a"])
        cl = cluster_pb2_grpc.ClusterServiceStub(self.stack.channel(0))
        self.assert_refused(cl.GetCluster, cluster_pb2.GetClusterRequest(
            cluster_id="local\x00/../evil"), bad, "cluster_id: holds a NUL byte")
        # pb.CoreRPC answers each call's own Eru code (read from the HTTP/2 trailers)
        addr = self.stack.gateways[0].addrs[0]
        for method, msg, code, field in (
                ("GetPod", core_pb2.GetPodOptions(name="local\x00x"), 1023, "name"),
                ("CreateWorkload", core_pb2.DeployOptions(name="app\x00x", podname="local",
                                                          count=1), 1074, "name"),
                ("Send", core_pb2.SendOptions(IDs=["a", "b\x00c"], data={"/f": b"x"}), 1062,
                 "IDs[1]"),
                ("Send", core_pb2.SendOptions(IDs=["a"], data={"/f\x00/../../etc": b"x"}), 1062,
                 "data.key")):
            t = pvtest.grpc_trailers(addr, "/pb.CoreRPC/" + method, msg.SerializeToString())
            self.assertEqual(t.get("grpc-status"), str(code), (method, t))
            self.assertIn("%s: holds a NUL byte" % field, t.get("grpc-message", ""))
        # bytes keep their NULs: Send's data reaches the service (which finds no workload and
        # says so in the stream, the call OK, as Eru's Send)
        t = pvtest.grpc_trailers(addr, "/pb.CoreRPC/Send", core_pb2.SendOptions(
            IDs=["nope"], data={"/f": b"a\x00b"}).SerializeToString())
        self.assertNotIn("NUL", t.get("grpc-message", ""), t)
        self.assertEqual(t.get("grpc-status"), "0", t)

    def test_f_sizes_at_int64_max(self):
        self.pool("sizes")
        self.assert_refused(self.st.CreateVolume, S.CreateVolumeRequest(
            name="huge", pool="sizes", size_bytes=INT64_MAX, format=S.VOLUME_FORMAT_QCOW2),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "size_bytes: pool sizes cannot hold %d more bytes" % INT64_MAX)
        v = self.st.CreateVolume(S.CreateVolumeRequest(name="small", pool="sizes",
                                                       size_bytes=1 << 20,
                                                       format=S.VOLUME_FORMAT_RAW), timeout=60)
        path = os.path.join(self.roots, "sizes", "small")
        self.assert_refused(self.st.ResizeVolume, S.ResizeVolumeRequest(
            id=v.id, new_size_bytes=INT64_MAX), grpc.StatusCode.RESOURCE_EXHAUSTED,
            "new_size_bytes: pool sizes cannot hold")
        self.assertEqual(os.stat(path).st_size, 1 << 20)
        self.assertEqual(self.st.GetVolume(S.GetVolumeRequest(id=v.id), timeout=10).size_bytes,
                         1 << 20)
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=v.id), timeout=60)

    def foreign_pool(self, lname, path):
        os.makedirs(path, exist_ok=True)
        xml = os.path.join(_outside, "..", os.path.basename(path) + ".xml")
        with open(xml, "w") as f:
            f.write("<pool type='dir'><name>%s</name><target><path>%s</path></target></pool>"
                    % (lname, path))
        try:
            self.assertEqual(virsh("pool-define", xml)[0], 0)
            self.assertEqual(virsh("pool-start", lname)[0], 0)
        finally:
            os.unlink(xml)

    def test_g_a_pool_this_system_did_not_define_is_never_replaced(self):
        theirs = tempfile.mkdtemp(prefix="pvtest-theirs-")
        lname = self.lv_prefix + "theirs"
        try:
            self.foreign_pool(lname, theirs)
            _, uuid = virsh("pool-uuid", lname)
            self.assert_refused(self.st.CreatePool, S.CreatePoolRequest(
                name="theirs", type=S.POOL_TYPE_DIR, config={"path": self.roots + "/theirs"}),
                grpc.StatusCode.FAILED_PRECONDITION,
                "libvirt already has a pool named %s (uuid %s) that this system did not define"
                % (lname, uuid.strip()))
            self.assertEqual(libvirt_pool_paths().get(lname), theirs)
            self.assertIn("running", virsh("pool-info", lname)[1])
            self.assertFalse([p for p in self.st.ListPools(S.ListPoolsRequest(), timeout=10)
                              if p.name == "theirs"])
            virsh("pool-destroy", lname)
            virsh("pool-undefine", lname)
            # ours, then redefined behind our back by someone else: DeletePool forgets ours and
            # leaves theirs running
            self.pool("mine")
            mine = self.lv_prefix + "mine"
            virsh("pool-destroy", mine)
            virsh("pool-undefine", mine)
            self.foreign_pool(mine, theirs)
            self.st.DeletePool(S.DeletePoolRequest(name="mine"), timeout=30)
            self.assertEqual(libvirt_pool_paths().get(mine), theirs)
            self.assertIn("running", virsh("pool-info", mine)[1])
            virsh("pool-destroy", mine)
            virsh("pool-undefine", mine)
        finally:
            for n in (lname, self.lv_prefix + "mine"):
                virsh("pool-destroy", n)
                virsh("pool-undefine", n)
            shutil.rmtree(theirs, ignore_errors=True)

    def test_h_malformed_ids_are_invalid_not_unknown(self):
        bad = grpc.StatusCode.INVALID_ARGUMENT
        huge = "v" * (1 << 20)
        for fn, mk, field in (
                (self.st.GetVolume, lambda v: S.GetVolumeRequest(id=v), "id"),
                (self.st.DeleteVolume, lambda v: S.DeleteVolumeRequest(id=v), "id"),
                (self.st.ResizeVolume, lambda v: S.ResizeVolumeRequest(id=v, new_size_bytes=1),
                 "id"),
                (self.st.CloneVolume, lambda v: S.CloneVolumeRequest(source_id=v, name="c"),
                 "source_id"),
                (self.st.ListSnapshots, lambda v: S.ListSnapshotsRequest(volume_id=v),
                 "volume_id"),
                (self.st.GetSnapshot, lambda v: S.GetSnapshotRequest(id=v), "id"),
                (self.st.RestoreSnapshot, lambda v: S.RestoreSnapshotRequest(snapshot_id=v),
                 "snapshot_id"),
                (self.st.GetPool, lambda v: S.GetPoolRequest(name=v), "name"),
                (self.st.GetPoolStats, lambda v: S.GetPoolStatsRequest(name=v), "name")):
            for value in ("a/b", "x..y", huge):
                def call(req, timeout):
                    r = fn(req, timeout=timeout)
                    return list(r) if hasattr(r, "__iter__") and not hasattr(r, "id") else r
                msg = self.assert_refused(call, mk(value), bad, "%s: \"" % field)
                self.assertLess(len(msg), 400)  # the value is cut, not echoed whole
        for fn, req in ((self.st.GetVolume, S.GetVolumeRequest(id="vol-nope")),
                        (self.st.GetPool, S.GetPoolRequest(name="nope"))):
            self.assertEqual(self.err(fn, req)[0], grpc.StatusCode.NOT_FOUND)


if __name__ == "__main__":
    pvtest.main()
