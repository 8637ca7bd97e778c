"""End-to-end tests of faults under real VMs (label vm): what fails says why, holds nothing, and
never hangs. A virt://qemu:///system node (vmtest.py: the test guest, TCG), one guest at a time.

  test_no_memory        a VM asking more memory than the host has (the node's capacity raised
                        with SetNode so that the scheduler places it): CreateWorkload fails its
                        instance with libvirt's reason (QEMU's "Cannot allocate memory"), no
                        domain, record or overlay is left and the node's usage is back to what
                        it was
  test_never_boots      an image with a blank disk and no kernel: the domain runs (its BIOS
                        finds nothing to boot), exec fails within the guest agent's bounded
                        wait naming the workload, and it is removed cleanly
  test_qemu_killed      QEMU killed with SIGKILL under a running VM: libvirt says it crashed,
                        the workload's status goes to not running, pivirt check reports
                        WL_NOT_RUNNING; a start brings it back
  test_libvirt_connection_closed
                        every libvirt connection of the node agent closed on libvirtd's side
                        (virt-admin client-disconnect: what a restart does to a client, to this
                        agent alone): the guest runs on, the agent reconnects (exec and
                        suspend/resume work again, its log says "reconnected")
A real restart of the system libvirtd is test_vm_libvirtd_restart.py's (run alone: RUN_SERIAL).
"""
import io
import json
import os
import re
import signal
import subprocess
import tarfile
import tempfile
import time

import grpc

import pvtest
import vmtest
from vmtest import Base
from pb import core_pb2

POD = "vfp"
NODE = "vfq1"
MIB = 1 << 20


setUpModule, tearDownModule = vmtest.fixtures(POD, NODE, "vft")


class Faults(Base):
    def usage_memory(self):
        got = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=NODE)), timeout=10)
        return json.loads(got.resource_usage)["cpumem"]["memory"]

    def set_memory(self, delta):
        self.core.SetNode(core_pb2.SetNodeOptions(
            nodename=NODE, delta=True,
            resources={"cpumem": json.dumps({"memory": delta}).encode()}), timeout=10)

    def overlays(self):
        d = os.path.join(self.stack.data_dir, "engine", NODE, "disks")
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def test_no_memory(self):
        before, disks = self.usage_memory(), self.overlays()
        self.set_memory(256 << 30)
        try:
            msgs = list(self.core.CreateWorkload(vmtest.deploy("vfthuge", memory="200G"),
                                                 timeout=120))
        finally:
            self.set_memory(-(256 << 30))
        self.assertEqual(len(msgs), 1, msgs)
        self.assertFalse(msgs[0].success)
        self.assertIn("Cannot allocate memory", msgs[0].error)
        self.assertIn("virDomainCreate", msgs[0].error)
        self.assertEqual(vmtest.domains("vfthuge"), [])
        self.assertEqual(self.overlays(), disks)
        self.assertEqual(self.usage_memory(), before)
        listed = list(self.core.ListWorkloads(core_pb2.ListWorkloadsOptions(appname="vfthuge"),
                                              timeout=10))
        self.assertEqual(listed, [])

    def build_blank_image(self):
        with tempfile.TemporaryDirectory() as d:
            disk = os.path.join(d, "disk.qcow2")
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", disk, "16M"], check=True)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as t:
                t.add(disk, arcname="disk.qcow2")
        got = list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name="vfimg/blank", tags=["v1"], build_method=core_pb2.BuildImageOptions.RAW,
            tar=buf.getvalue()), timeout=60))
        self.assertEqual([m.status for m in got], ["finished"], got)
        return "vfimg/blank:v1"

    def test_never_boots(self):
        msg, _ = self.create("vftblank", image=self.build_blank_image())
        try:
            self.assertTrue(self.domstate(msg.name).startswith("running"))
            t0 = time.monotonic()
            with self.assertRaises(grpc.RpcError) as e:
                self.execute(msg.id, ["true"], timeout=60)
            self.assertIn(msg.id, e.exception.details())
            self.assertIn("guest agent", e.exception.details())
            self.assertLess(time.monotonic() - t0, 30)
        finally:
            self.remove(msg.id)
        self.assertEqual(vmtest.domains("vftblank"), [])

    def status(self, wid):
        got = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[wid]), timeout=10)
        return got.status[0]

    def running(self, wid):
        """Whether the agent reports wid running; False before its first report (Eru answers a
        workload without a status key with an error, not with running=false)."""
        try:
            return self.status(wid).running
        except grpc.RpcError as e:
            if "not found" not in (e.details() or ""):
                raise
            return False

    def until(self, what, fn, timeout=30):
        deadline = time.monotonic() + timeout
        while not fn():
            if time.monotonic() > deadline:
                self.fail(what)
            time.sleep(0.3)

    def test_qemu_killed(self):
        msg, _ = self.create("vftkilled")
        wid = msg.id
        self.wait_agent(wid)
        self.until("status running", lambda: self.running(wid))
        with open("/run/libvirt/qemu/%s.pid" % msg.name) as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)
        self.until("libvirt sees the domain shut off",
                   lambda: (self.domstate(msg.name) or "").startswith("shut off"))
        say_state = self.domstate(msg.name)
        self.assertIn("crashed", say_state)
        self.until("status not running", lambda: not self.running(wid))
        deadline = time.monotonic() + 20
        diffs = []
        while time.monotonic() < deadline:
            diffs = [d for d in self.stack.check() if wid in d]
            if diffs:
                break
            time.sleep(0.5)
        self.assertEqual(len(diffs), 1, diffs)
        self.assertTrue(diffs[0].startswith("WL_NOT_RUNNING workload %s" % wid), diffs)
        self.assertIn("QEMU died", diffs[0])
        self.control(wid, "start")
        self.wait_agent(wid)
        self.until("status running again", lambda: self.running(wid))
        self.remove(wid)

    def disconnect_agent(self):
        """Closes, on libvirtd's side, every connection the node agent has (virt-admin): what a
        libvirtd restart does to its clients, without touching anyone else's."""
        pid = self.stack.agents[0].pid
        listed = subprocess.run(["virt-admin", "srv-clients-list", "libvirtd"],
                                capture_output=True, text=True, check=True).stdout.split("\n")
        closed = 0
        for line in listed:
            cid = line.split()[0] if line.split() else ""
            if not cid.isdigit():
                continue
            info = subprocess.run(["virt-admin", "client-info", "libvirtd", cid],
                                  capture_output=True, text=True).stdout
            if re.search(r"unix_process_id\s*:\s*%d$" % pid, info, re.M):
                subprocess.run(["virt-admin", "client-disconnect", "libvirtd", cid],
                               capture_output=True, check=True)
                closed += 1
        return closed

    def test_libvirt_connection_closed(self):
        msg, _ = self.create("vftclosed")
        wid = msg.id
        self.wait_agent(wid)
        # the engine's connection, the guest agents' and the second handle's (networks)
        self.assertGreaterEqual(self.disconnect_agent(), 2)
        self.assertTrue(self.domstate(msg.name).startswith("running"))
        # the first call on a closed connection may fail; the next ones run on a new one
        self.usable_after_reconnect(wid, msg.name)
        self.remove(wid)


if __name__ == "__main__":
    pvtest.main()
