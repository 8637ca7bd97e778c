"""End-to-end tests of a real VM's resources and lifecycle beyond test_vm.py (label vm).

A virt://qemu:///system node (vmtest.py: the test guest, TCG), one guest at a time, 192 MiB.

  Realloc.test_live_then_next_start
      ReallocResource on a running VM: memory down to 128 MiB (within what it was started with:
      through its balloon; the guest's MemTotal drops) and 2 vcpus (hot-plugged, onlined through
      the guest agent: /sys/devices/system/cpu/online says 0-1) apply live, and the
      node operation says "live"; memory up to 256 MiB (above the 192 MiB the domain started
      with) applies at the next start and says so (the running domain keeps 192 MiB, its
      definition has 256, and GetNodeResource's diffs name the domain's 128 MiB, ballooned,
      against the allocation's 256); after a stop and a start the guest has 256 MiB (no diff
      left); 1 vcpu asked of the stopped VM says "at the next start" for both and holds after
      the start.
  Audit.test_real_domains
      GetNodeEngineInfo says virt; Node.info's "virt" section has libvirt's versions and the
      node's real domains (the running VM with its vcpus and memory); pivirt check finds the VM
      clean; its domain destroyed and undefined behind pivirt's back (virsh) -> WL_NO_ENGINE;
      a second VM whose record is deleted -> WL_ORPHAN, "as its agent reports".
  Lambda.test_run_and_wait_follows_the_console_to_the_poweroff
      RunAndWait on a one-shot guest (it writes three lines on its console once booted, then
      powers off): the workload id first, then its console as it boots, the three lines, and
      "[exitcode] 0" (a guest that powered itself off); its record and domain are gone after.
"""
import json
import subprocess
import time

import pvtest
import vmtest
from vmtest import VIRSH, Base
from pb import core_pb2
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc

POD = "vlp"
NODE = "vlq1"
MIB = 1 << 20


setUpModule, tearDownModule = vmtest.fixtures(POD, NODE, "vlt")


class Realloc(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ops = operations_pb2_grpc.OperationServiceStub(cls.stack.channel(0))

    def realloc(self, wid, body):
        got = self.core.ReallocResource(core_pb2.ReallocOptions(id=wid, resources={
            "cpumem": json.dumps(body).encode()}), timeout=120)
        self.assertEqual(got.error, "")
        ops = list(self.ops.ListOperations(O.ListOperationsRequest(
            kind="workload.realloc_on_node"), timeout=10))
        last = max(ops, key=lambda o: (o.created_at.seconds, o.created_at.nanos))
        self.assertEqual(last.status, O.OPERATION_STATUS_SUCCEEDED, last)
        return last.message

    def guest(self, wid, cmd):
        out, code = self.execute(wid, ["/bin/sh", "-c", cmd])
        self.assertEqual(code, "[exitcode] 0", out)
        return out.strip()

    def mem_total_kib(self, wid):
        return int(self.guest(wid, "grep MemTotal /proc/meminfo").split()[1])

    def until(self, what, fn, want, timeout=30):
        deadline = time.monotonic() + timeout
        got = fn()
        while got != want and time.monotonic() < deadline:
            time.sleep(0.5)
            got = fn()
        self.assertEqual(got, want, what)

    def node_diffs(self):
        got = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=NODE)), timeout=10)
        return list(got.diffs)

    def dominfo(self, wid):
        return json.loads(self.raw(wid, "dominfo"))

    def test_live_then_next_start(self):
        msg, _ = self.create("vltrealloc")
        wid = msg.id
        self.wait_agent(wid)
        before = self.mem_total_kib(wid)
        self.assertEqual(self.guest(wid, "cat /sys/devices/system/cpu/online"), "0")
        how = self.realloc(wid, {"cpu-request": 1, "memory-request": "-64M",
                                 "memory-limit": "-64M"})
        self.assertEqual(how, "workload %s: memory 128 MiB live, 2 vcpus live" % wid)
        self.until("the balloon's memory", lambda: self.dominfo(wid)["memory_kib"], 128 * 1024)
        self.assertEqual(self.dominfo(wid)["vcpus"], 2)
        self.until("the guest's online CPUs",
                   lambda: self.guest(wid, "cat /sys/devices/system/cpu/online"), "0-1")
        self.until("the guest's MemTotal after the balloon took 64 MiB",
                   lambda: self.mem_total_kib(wid) <= before - 60 * 1024, True)
        # above what the running domain was started with: its definition only
        how = self.realloc(wid, {"memory-request": "128M", "memory-limit": "128M"})
        self.assertEqual(how, "workload %s: memory 256 MiB at the next start (above the 192 MiB "
                         "the running domain has room for), 2 vcpus live" % wid)
        self.assertEqual(self.dominfo(wid)["max_memory_kib"], 192 * 1024)
        # GetNodeResource sees the real domain against its allocation
        diff = ("workload %s: its domain %s runs with 2 vcpus and 128 MiB, its allocation gives "
                "2 vcpus and 256 MiB" % (wid, msg.name))
        self.until("GetNodeResource's diffs", lambda: diff in self.node_diffs(), True)
        inactive = self.raw(wid, "domain_xml", b'{"inactive": true}').replace('"', "'")
        self.assertIn("<memory unit='KiB'>%d</memory>" % (256 * 1024), inactive)
        self.control(wid, "stop")
        how = self.realloc(wid, {"cpu-request": -1, "cpu-limit": -1})
        self.assertEqual(how, "workload %s: memory 256 MiB at the next start, 1 vcpus at the "
                         "next start" % wid)
        self.control(wid, "start")
        self.wait_agent(wid)
        info = self.dominfo(wid)
        self.assertEqual((info["max_memory_kib"], info["vcpus"]), (256 * 1024, 1))
        self.assertGreater(self.mem_total_kib(wid), 200 * 1024)
        self.until("GetNodeResource's diffs", lambda: [d for d in self.node_diffs() if wid in d],
                   [])
        self.remove(wid)


class Audit(Base):
    def inventory(self):
        got = self.stack.redis.cmd("GET", self.stack.prefix + "{reg}:engine-inv:" + NODE)
        return json.loads(got) if got else None

    def wait_inventory(self, pred):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            inv = self.inventory()
            if inv and pred(inv):
                return inv
            time.sleep(0.2)
        self.fail("the agent never reported the expected inventory: %s" % self.inventory())

    def virt_info(self):
        node = self.core.GetNode(core_pb2.GetNodeOptions(nodename=NODE), timeout=10)
        return json.loads(node.info)["virt"]

    def test_real_domains(self):
        eng = self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename=NODE), timeout=10)
        self.assertEqual(eng.type, "virt")
        msg, _ = self.create("vltaudit")
        lost = msg.id
        # the facts are a snapshot of each status pass: wait for one that has the new domain
        # (one taken while libvirt starts it, "paused (starting up)", says running too)
        deadline = time.monotonic() + 20
        info = self.virt_info()
        while (info["workloads"].get(lost, {}).get("state") != "running" and
               time.monotonic() < deadline):
            time.sleep(0.5)
            info = self.virt_info()
        self.assertEqual((info["uri"], info["driver"], info["domain_type"]),
                         ("qemu:///system", "QEMU", "qemu"))
        self.assertRegex(info["libvirt_version"], r"^\d+\.\d+\.\d+$")
        self.assertEqual(info["workloads"][lost], {"domain": msg.name, "state": "running",
                                                   "vcpus": 1, "memory": 192 * MIB,
                                                   "exit_code": 0, "stopped_by_api": False})
        self.assertGreaterEqual((info["running"], info["running_vcpus"]), (1, 1))
        self.wait_inventory(lambda inv: lost in inv["ids"])
        self.assertFalse([d for d in self.stack.check() if lost in d])
        # behind pivirt's back: the domain is gone from libvirt, the record stays
        for verb in ("destroy", "undefine"):
            subprocess.run(VIRSH + [verb, msg.name], check=True, capture_output=True)
        gone = time.time() * 1000
        self.wait_inventory(lambda inv: inv["at_ms"] > gone + 1500)
        # the audit sees it once the agent's reports have caught up (under load, a beat later)
        deadline = time.monotonic() + 15
        while True:
            diffs = self.stack.check()
            found = [d for d in diffs if d.startswith("WL_NO_ENGINE workload %s" % lost) and
                     "does not have it" in d]
            if found or time.monotonic() > deadline:
                break
            time.sleep(1)
        self.assertTrue(found, diffs)
        self.remove(lost)
        self.assertFalse([d for d in self.stack.check() if lost in d])
        # a pivirt domain whose record went behind the system's back
        msg, _ = self.create("vltorphan")
        orphan = msg.id
        self.wait_inventory(lambda inv: orphan in inv["ids"])
        self.stack.redis.cmd("DEL", self.stack.prefix + "{reg}:wl:" + orphan)
        diffs = self.stack.check()
        self.assertTrue([d for d in diffs if d.startswith("WL_ORPHAN workload %s" % orphan) and
                         "as its agent reports" in d], diffs)
        for verb in ("destroy", "undefine"):
            subprocess.run(VIRSH + [verb, msg.name], check=True, capture_output=True)


class Lambda(Base):
    def test_run_and_wait_follows_the_console_to_the_poweroff(self):
        opts = vmtest.deploy("vltlambda", image=vmtest.ONESHOT_IMAGE)
        t0 = time.monotonic()
        msgs = list(self.core.RunAndWait(iter([core_pb2.RunAndWaitOptions(
            deploy_options=opts, cmd=b"boot")]), timeout=180))
        vmtest.say("figures: RunAndWait of a one-shot guest (create, boot, poweroff, remove) "
                   "%.1f s" % (time.monotonic() - t0))
        ids = [m.workload_id for m in msgs if m.std_stream_type == core_pb2.TYPEWORKLOADID]
        self.assertEqual(len(ids), 1, msgs)
        self.assertEqual(msgs[0].std_stream_type, core_pb2.TYPEWORKLOADID)
        out = [m.data.decode(errors="replace").rstrip("\n") for m in msgs
               if m.workload_id == ids[0] and m.std_stream_type == core_pb2.STDOUT]
        self.assertTrue(any("Linux version" in l for l in out), out[:5])
        marks = [l for l in out if l.startswith("PIVIRT-ONESHOT-")]
        self.assertEqual([m.split()[0] for m in marks],
                         ["PIVIRT-ONESHOT-BEGIN", "PIVIRT-ONESHOT-KERNEL", "PIVIRT-ONESHOT-END"])
        self.assertEqual(out[-1], "[exitcode] 0")
        self.assertEqual(self.stack.redis.cmd("EXISTS", self.stack.prefix + "{reg}:wl:" + ids[0]),
                         0)
        self.assertEqual(vmtest.domains("vltlambda"), [])


if __name__ == "__main__":
    pvtest.main()
