"""End-to-end tests of a node agent killed (SIGKILL) in the middle of a VM's create and remove
(label vm): the redelivered node operation finishes, and nothing is left behind.

A virt://qemu:///system node (vmtest.py: the test guest, TCG), one guest at a time, 192 MiB; a
short lease (worker.lease_ms 1500) so that the restarted agent takes the dead one's operation
soon, and a stop grace of 8 s.

  test_kill_mid_create
      the agent dies as soon as the VM's root disk overlay appears (before or while its domain
      is defined and started; where it landed is printed); started again, it finishes the
      redelivered create: the client's one CreateWorkload call answers success once, there is
      exactly one domain and one overlay (the domain's vda; an overlay of the dead agent's try
      is swept at the agent's start), the guest answers, GetNodeResource has no diffs and the
      audit (pivirt check) is clean; removed, no domain, overlay or console log is left and the
      audit is clean.
  test_kill_after_define
      the same, the agent killed once the domain is defined (its definition in
      /etc/libvirt/qemu/), before or while it starts: the redelivered create finds the domain
      and starts it (or finds it running).
  test_kill_mid_remove
      a VM whose guest ignores shutdowns (its power-button handler and /sbin/shutdown made
      no-ops through its agent): RemoveWorkload without force waits the grace in the node
      agent's stop, and the agent dies there (the domain still runs); started again, it
      finishes the redelivered remove: the call answers success, no domain, overlay or console
      log is left, the node's usage is back to nothing and the audit is clean.
  test_stray_files_swept
      an overlay and a console log (with its index and a rotation) of a workload whose domain
      is gone, as an agent killed between a remove's undefine and its file deletion leaves
      them: the agent's next start deletes them and keeps the files of a VM that exists.
"""
import glob
import json
import os
import threading
import time
import xml.etree.ElementTree as ET

import pvtest
import vmtest
from vmtest import Base, say
from pb import core_pb2
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc

POD = "vkp"
NODE = "vkq1"


def setUpModule():
    vmtest.start_stack(POD, NODE, "vkt", config={
        "worker": {"lease_ms": 1500, "stop_grace_seconds": 8}})


def tearDownModule():
    vmtest.stop_stack()


class AgentKilled(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ops = operations_pb2_grpc.OperationServiceStub(cls.stack.channel(0))
        cls.engine = os.path.join(cls.stack.data_dir, "engine", NODE)

    def files(self, sub):
        d = os.path.join(self.engine, sub)
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def usage(self):
        got = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=NODE)), timeout=30)
        return json.loads(got.resource_usage)["cpumem"], list(got.diffs)

    def settled_check(self, timeout=30):
        """The audit, again until clean or timeout: the restarted agent reports its workloads'
        status a moment after its start."""
        deadline = time.monotonic() + timeout
        while True:
            diffs = self.stack.check()
            if not diffs or time.monotonic() > deadline:
                return diffs
            time.sleep(0.5)

    def restart_agent_after_kill(self):
        agent = self.stack.agents[0]
        self.assertEqual(agent.kill9(), -9)
        agent.start()

    def run_bg(self, fn):
        result = {}

        def run():
            try:
                result["msgs"] = fn()
            except Exception as e:  # noqa: BLE001 - reported by the test
                result["error"] = e

        t = threading.Thread(target=run)
        t.start()
        return t, result

    def assert_nothing_left(self, app):
        self.assertEqual(vmtest.domains(app), [])
        self.assertEqual(self.files("disks"), [])
        self.assertEqual(self.files("logs"), [])
        usage, diffs = self.usage()
        self.assertEqual((usage["memory"], diffs), (0, []))
        self.assertEqual(self.settled_check(), [])

    def kill_mid_create(self, app, when, what):
        """Creates a VM of app, kills the agent once when() holds, starts it again; the VM once
        the redelivered create has answered."""
        self.assertEqual(self.files("disks"), [])
        t, result = self.run_bg(lambda: list(self.core.CreateWorkload(
            vmtest.deploy(app), timeout=240)))
        deadline = time.monotonic() + 120
        while not when() and time.monotonic() < deadline:
            time.sleep(0.005)
        self.assertTrue(when(), "no %s within 120 s" % what)
        self.restart_agent_after_kill()
        landed = [(n, self.domstate(n)) for n in vmtest.domains(app)]
        say("agent killed mid-create at the %s: domains then %s, overlays %s" % (
            what, landed, self.files("disks")))
        t.join(240)
        self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        self.assertNotIn("error", result)
        msgs = result["msgs"]
        self.assertEqual([(m.success, m.error) for m in msgs], [(True, "")])
        self.assertEqual(vmtest.domains(app), [msgs[0].name])
        return msgs[0].id, msgs[0].name

    def test_kill_mid_create(self):
        wid, name = self.kill_mid_create("vktcreate", lambda: self.files("disks"),
                                         "root disk overlay's appearance")
        self.assert_created(wid, name, "vktcreate")

    def test_kill_after_define(self):
        # libvirt writes a persistent domain's definition when it defines it, before the start
        wid, name = self.kill_mid_create(
            "vktdefine", lambda: glob.glob("/etc/libvirt/qemu/vktdefine_*.xml"),
            "domain's definition")
        self.assert_created(wid, name, "vktdefine")

    def assert_created(self, wid, name, app):
        self.assertTrue(self.domstate(name).startswith("running"), self.domstate(name))
        vda = [d.find("source").get("file") for d in
               ET.fromstring(self.raw(wid, "domain_xml")).iter("disk")
               if d.find("target").get("dev") == "vda"]
        self.assertEqual([os.path.join(self.engine, "disks", f) for f in self.files("disks")],
                         vda)
        self.wait_agent(wid)
        usage, diffs = self.usage()
        self.assertEqual((usage["memory"], diffs), (192 << 20, []))
        self.assertEqual(self.settled_check(), [])
        self.remove(wid)
        self.assert_nothing_left(app)

    def deafen(self, wid):
        """The guest ignores shutdowns: its ACPI power-button handler and the /sbin/shutdown
        the guest agent's guest-shutdown runs do nothing."""
        out, code = self.execute(wid, ["/bin/sh", "-c",
                                       "for f in /etc/acpi/PWRF/00000080 /sbin/shutdown; do "
                                       "rm -f $f && printf '#!/bin/sh\\nexit 0\\n' > $f && "
                                       "chmod 0755 $f || exit 1; done"])
        self.assertEqual((out, code), ("", "[exitcode] 0"))

    def remove_running(self):
        """Whether a workload.remove_on_node operation is running now."""
        got = list(self.ops.ListOperations(O.ListOperationsRequest(
            kind="workload.remove_on_node"), timeout=10))
        return any(o.status == O.OPERATION_STATUS_RUNNING for o in got)

    def test_kill_mid_remove(self):
        msg, _ = self.create("vktremove")
        wid, name = msg.id, msg.name
        self.wait_agent(wid)
        self.deafen(wid)
        t, result = self.run_bg(lambda: list(self.core.RemoveWorkload(
            core_pb2.RemoveWorkloadOptions(IDs=[wid], force=False), timeout=240)))
        deadline = time.monotonic() + 60
        while not self.remove_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertTrue(self.remove_running(), "the remove's node operation never ran")
        self.restart_agent_after_kill()
        # killed inside the stop's grace: the guest ignored the shutdown, the domain runs
        self.assertTrue(self.domstate(name).startswith("running"), self.domstate(name))
        t.join(240)
        self.assertFalse(t.is_alive(), "RemoveWorkload did not end")
        self.assertNotIn("error", result)
        self.assertEqual([(m.id, m.success) for m in result["msgs"]], [(wid, True)])
        self.assertIsNone(self.domstate(name))
        self.assert_nothing_left("vktremove")

    def test_stray_files_swept(self):
        msg, _ = self.create("vktstray")
        wid = msg.id
        try:
            kept = (self.files("disks"), self.files("logs"))
            self.assertEqual(len(kept[0]), 1, kept)
            stray = [os.path.join(self.engine, "disks", "vktghost-0badc0de.qcow2")] + [
                os.path.join(self.engine, "logs", "vktghost" + ext)
                for ext in (".log", ".idx", ".log.0")]
            for p in stray:
                with open(p, "w") as f:
                    f.write("left by an agent killed mid-remove\n")
            self.restart_agent_after_kill()
            deadline = time.monotonic() + 60
            while any(os.path.exists(p) for p in stray) and time.monotonic() < deadline:
                time.sleep(0.2)
            self.assertEqual([p for p in stray if os.path.exists(p)], [])
            self.assertEqual(self.files("disks"), kept[0])
            self.assertTrue(set(kept[1]) <= set(self.files("logs")), (kept, self.files("logs")))
            self.wait_agent(wid)
        finally:
            self.remove(wid)
        self.assert_nothing_left("vktstray")


if __name__ == "__main__":
    pvtest.main()
