"""End-to-end tests of pb.CoreRPC on a virt:// node: workloads as libvirt domains, networks and
RawEngine, through a real gRPC client.

Real processes only: redis-server, a pivirt-gateway, a pivirt-scheduler, an ops worker, a node
agent whose engine is libvirt's test driver (worker.endpoint=virt://test:///default: libvirt's
in-process driver, held by the agent for its lifetime; qemu:///system runs unchanged where a
hypervisor exists) and a process:// agent for the engine that has no networks.

Classes:
  Virt   CreateWorkload defines and starts a domain (RawEngine dominfo shows it running, with the
         vcpus and memory of the allocation); ListNetworks lists libvirt's "default" network with
         its subnet; ControlWorkload stops the domain; DisconnectNetwork and ConnectNetwork
         change its definition (the domain XML through RawEngine shows it); an unknown raw op is 1057; on the process node
         ConnectNetwork and RawEngine answer UNIMPLEMENTED naming the engine; RemoveWorkload
         removes the domain. A StorageService volume named in the storage request's volumes
         becomes the domain's disk (its path in the domain XML) and IN_USE: not deleted, resized
         or attached twice, READY again once the workload is removed.
"""
import json
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.storage.v1 import storage_pb2, storage_pb2_grpc

_stack = None


def setUpModule():
    global _stack
    why = pvtest.ensure_libvirtd()  # the volumes' DIR pool lives on the system libvirtd
    if why:
        raise RuntimeError(why)
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1,
                          agents=[{"node": "vm1", "pod": "vp",
                                   "endpoint": "virt://test:///default"},
                                  {"node": "pr1", "pod": "pp"}],
                          config={"worker": {"status_interval_seconds": 1}})
    _stack.start()


def tearDownModule():
    _stack.stop()


def deploy(pod, name):
    return core_pb2.DeployOptions(
        name=name, entrypoint=core_pb2.EntrypointOptions(name="vm", commands=["boot"]),
        podname=pod, image="disk:1", count=1,
        resources={"cpumem": json.dumps({"cpu-request": 2, "memory-request": "256M",
                                         "memory-limit": "256M"}).encode()})


class Virt(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))
        cls.addr = cls.stack.gateways[0].addrs[0]
        # the process node's image: a script that sleeps
        image = pvtest.os.path.join(cls.stack.data_dir, "images", "disk", "1.tar")
        pvtest.os.makedirs(pvtest.os.path.dirname(image), exist_ok=True)
        import tarfile
        import tempfile
        with tempfile.TemporaryDirectory() as root:
            with open(pvtest.os.path.join(root, "boot"), "w") as f:
                f.write("#!/bin/sh\nsleep 30\n")
            pvtest.os.chmod(pvtest.os.path.join(root, "boot"), 0o755)
            with tarfile.open(image, "w") as t:
                t.add(pvtest.os.path.join(root, "boot"), arcname="boot")

    def raw(self, wid, op, params=b""):
        return self.core.RawEngine(core_pb2.RawEngineOptions(id=wid, op=op, params=params),
                                   timeout=30).data.decode()

    def trailers(self, method, msg):
        return pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/" + method, msg.SerializeToString())

    def test_domain_networks_raw(self):
        msgs = list(self.core.CreateWorkload(deploy("vp", "vmapp"), timeout=60))
        self.assertEqual(len(msgs), 1)
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id
        info = json.loads(self.raw(wid, "dominfo"))
        self.assertEqual(info["vcpus"], 2)
        self.assertEqual(info["max_memory_kib"], 256 * 1024)
        self.assertIn(info["state"], ("running", "RUNNING", 1))

        nets = self.core.ListNetworks(core_pb2.ListNetworkOptions(podname="vp"), timeout=30)
        default = [n for n in nets.networks if n.name == "default"]
        self.assertEqual(len(default), 1)
        self.assertEqual(list(default[0].subnets), ["192.168.122.0/24"])

        # The test driver cannot hot-plug: with the domain stopped, both changes are plain
        # edits of its definition (running, they would apply at the next start).
        got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[wid], type="stop", force=True), timeout=60))
        self.assertEqual([(g.id, g.error) for g in got], [(wid, "")])
        self.core.DisconnectNetwork(core_pb2.DisconnectNetworkOptions(
            network="default", target=wid), timeout=30)
        self.assertNotIn("network='default'",
                         self.raw(wid, "domain_xml", b'{"inactive": true}').replace('"', "'"))
        got = self.core.ConnectNetwork(core_pb2.ConnectNetworkOptions(
            network="default", target=wid), timeout=30)
        self.assertEqual((got.name, list(got.subnets)), ("default", ["192.168.122.0/24"]))
        self.assertIn("network='default'",
                      self.raw(wid, "domain_xml", b'{"inactive": true}').replace('"', "'"))
        t = self.trailers("RawEngine", core_pb2.RawEngineOptions(id=wid, op="explode"))
        self.assertEqual(t.get("grpc-status"), "1057")
        self.assertIn("explode", t.get("grpc-message", ""))

        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid],
                                                                           force=True),
                                            timeout=60))
        self.assertTrue(got[0].success, got)
        t = self.trailers("RawEngine", core_pb2.RawEngineOptions(id=wid, op="dominfo"))
        self.assertEqual(t.get("grpc-status"), "1057")  # the workload is gone

    def inventory(self, node):
        got = self.stack.redis.cmd("GET", self.stack.prefix + "{reg}:engine-inv:" + node)
        return json.loads(got) if got else None

    def wait_inventory(self, node, pred):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            inv = self.inventory(node)
            if inv and pred(inv):
                return inv
            time.sleep(0.2)
        self.fail("the agent of %s never reported the expected inventory: %s" %
                  (node, self.inventory(node)))

    def test_z_audit_checks_the_virt_engine_through_its_agent(self):
        # pivirt-check cannot open the agent's test:///default connection: it checks the
        # records of a virt node against the inventory its agent reports
        msgs = list(self.core.CreateWorkload(deploy("vp", "auditvm"), timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        lost = msgs[0].id
        self.wait_inventory("vm1", lambda inv: lost in inv["ids"])
        report = self.stack.check(raw=True)
        self.assertEqual(report["differences"], [])
        self.assertFalse([n for n in report.get("notes", []) if "vm1" in n], report)
        # The agent restarts: the test driver's domains lived in its connection and are gone
        # (a host that lost its domains). The record stays, the engine does not have it.
        agent = [a for a in self.stack.agents if a.name == "agent-vm1"]
        agent[0].kill9()
        restarted = time.time() * 1000
        agent[0].start()
        self.stack.wait_ready(agent)
        self.wait_inventory("vm1", lambda inv: inv["at_ms"] > restarted + 1500)
        diffs = self.stack.check()
        self.assertIn("WL_NO_ENGINE workload %s" % lost, "\n".join(diffs))
        self.assertTrue([d for d in diffs if lost in d and "does not have it" in d], diffs)
        # A domain whose record went behind the system's back: the agent still reports it.
        msgs = list(self.core.CreateWorkload(deploy("vp", "auditvm2"), timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        orphan = msgs[0].id
        self.wait_inventory("vm1", lambda inv: orphan in inv["ids"])
        self.stack.redis.cmd("DEL", self.stack.prefix + "{reg}:wl:" + orphan)
        diffs = self.stack.check()
        self.assertTrue([d for d in diffs if d.startswith("WL_ORPHAN workload %s" % orphan) and
                         "as its agent reports" in d], diffs)

    def test_storage_volumes_as_disks(self):
        st = storage_pb2_grpc.StorageServiceStub(self.stack.channel(0))
        pool_dir = pvtest.os.path.join(self.stack.data_dir, "pools", "vpool")
        p = st.CreatePool(storage_pb2.CreatePoolRequest(
            name="vpool", type=storage_pb2.POOL_TYPE_DIR,
            config={"path": pool_dir, "node": "vm1"}), timeout=60)
        self.assertEqual(p.status, storage_pb2.POOL_STATUS_ACTIVE)
        vol = st.CreateVolume(storage_pb2.CreateVolumeRequest(
            name="disk-a", pool="vpool", size_bytes=1 << 30,
            format=storage_pb2.VOLUME_FORMAT_QCOW2), timeout=60)
        opts = deploy("vp", "vmdisk")
        opts.resources["storage"] = json.dumps({"volumes": ["disk-a:vdb"]}).encode()
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id
        xml = self.raw(wid, "domain_xml", b'{"inactive": true}').replace('"', "'")
        self.assertIn("<source file='%s'/>" % pvtest.os.path.join(pool_dir, "disk-a"), xml)
        self.assertIn("type='qcow2'", xml)
        got = st.GetVolume(storage_pb2.GetVolumeRequest(id=vol.id), timeout=10)
        self.assertEqual(got.status, storage_pb2.VOLUME_STATUS_IN_USE)
        # in use: not deleted, not resized, not snapshot-restored, not attached twice
        for fn, req in ((st.DeleteVolume, storage_pb2.DeleteVolumeRequest(id=vol.id)),
                        (st.ResizeVolume, storage_pb2.ResizeVolumeRequest(
                            id=vol.id, new_size_bytes=2 << 30))):
            with self.assertRaises(pvtest.grpc.RpcError) as e:
                fn(req, timeout=30)
            self.assertEqual(e.exception.code(), pvtest.grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("in use", e.exception.details())
        twice = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertFalse(twice[0].success)
        self.assertIn("in use by workload %s" % wid, twice[0].error)
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid],
                                                                           force=True),
                                            timeout=60))
        self.assertTrue(got[0].success, got)
        self.assertEqual(st.GetVolume(storage_pb2.GetVolumeRequest(id=vol.id), timeout=10).status,
                         storage_pb2.VOLUME_STATUS_READY)
        st.DeleteVolume(storage_pb2.DeleteVolumeRequest(id=vol.id), timeout=30)
        st.DeletePool(storage_pb2.DeletePoolRequest(name="vpool"), timeout=30)

    def test_process_volumes_are_links(self):
        host = pvtest.tempfile.mkdtemp(prefix="pvvol-")
        opts = deploy("pp", "prvol")
        opts.entrypoint.commands[:] = ["/bin/sh", "boot"]
        opts.resources["storage"] = json.dumps({"volumes": ["%s:/data" % host]}).encode()
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        link = pvtest.os.path.join(self.stack.data_dir, "engine", "pr1", msgs[0].id, "root",
                                   "data")
        self.assertEqual(pvtest.os.readlink(link), host)
        # read-only cannot be enforced by links: refused, not promised
        opts.resources["storage"] = json.dumps({"volumes": ["%s:/data:ro" % host]}).encode()
        msgs2 = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertFalse(msgs2[0].success)
        self.assertIn("cannot make a volume read-only", msgs2[0].error)
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[msgs[0].id],
                                                                     force=True), timeout=60))

    def test_scm_build_needs_git_scm_type(self):
        t = self.trailers("BuildImage", core_pb2.BuildImageOptions(
            name="x", build_method=core_pb2.BuildImageOptions.SCM,
            builds=core_pb2.Builds(stages=["a"])))
        self.assertEqual(t.get("grpc-status"), "1071")
        self.assertIn("no SCM is configured on this control plane (set git.scm_type)",
                      t.get("grpc-message", ""))

    def test_process_node_has_no_networks(self):
        opts = deploy("pp", "prapp")
        opts.entrypoint.commands[:] = ["/bin/sh", "boot"]
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id
        t = self.trailers("ConnectNetwork", core_pb2.ConnectNetworkOptions(network="default",
                                                                           target=wid))
        self.assertEqual(t.get("grpc-status"), "12")
        self.assertIn("process engine", t.get("grpc-message", ""))
        t = self.trailers("RawEngine", core_pb2.RawEngineOptions(id=wid, op="dominfo"))
        self.assertEqual(t.get("grpc-status"), "12")
        t = self.trailers("ListNetworks", core_pb2.ListNetworkOptions(podname="pp"))
        self.assertEqual(t.get("grpc-status"), "12")
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                      timeout=60))


if __name__ == "__main__":
    unittest.main(verbosity=2)
