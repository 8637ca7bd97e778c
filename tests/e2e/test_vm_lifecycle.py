"""End-to-end tests of a real VM's resources and lifecycle beyond test_vm.py (label vm).

A virt://qemu:///system node (vmtest.py: the test guest, TCG), one guest at a time, 192 MiB.

  Realloc.test_live_then_next_start
      ReallocResource on a running VM: memory down to 128 MiB (within what it was started with:
      through its balloon; the guest's MemTotal drops) and 2 vcpus (hot-plugged, onlined through
      the guest agent: /sys/devices/system/cpu/online says 0-1) apply live, and the
      node operation says "live"; memory up to 256 MiB (above the 192 MiB the domain started
      with) applies at the next start and says so (the running domain keeps 192 MiB, its
      definition has 256); after a stop and a start the guest has 256 MiB; 1 vcpu asked of the
      stopped VM says "at the next start" for both and holds after the start.
"""
import json
import time

import pvtest
import vmtest
from vmtest import Base
from pb import core_pb2
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc

POD = "vlp"
NODE = "vlq1"
MIB = 1 << 20


def setUpModule():
    vmtest.start_stack(POD, NODE, "vlt")


def tearDownModule():
    vmtest.stop_stack()


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
        self.remove(wid)


if __name__ == "__main__":
    pvtest.main()
