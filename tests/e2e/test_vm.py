"""End-to-end tests of real virtual machines: a virt://qemu:///system node whose guests boot.

Real processes only: redis-server, a pivirt-gateway, a pivirt-scheduler, an ops worker and a
node agent whose engine is the system libvirtd's QEMU driver (TCG: <domain type='qemu'>), driven
by Debian's python3-grpcio. The guest is tests/guest/build-guest.sh's, built from Debian
packages into the build directory (cached): the cloud kernel, a busybox initramfs printing
PIVIRT-GUEST-READY on its serial console, qemu-guest-agent on its virtio-serial channel, and a
16 MiB qcow2 disk whose first bytes are PIVIRT-DISK-v1. It reaches the node's image store as
an operator sends it: BuildImage RAW, the whole 18 MB tar in one message (under
gateway.max_upload_bytes); the other images are copied into the registry directory, then
CacheImage.

What libvirt needs on a machine without systemd is done here as `./ops/pivirt up` does it, and
said on stderr: virtlogd started, /dev/kvm given to group libvirt-qemu.

At most two guests run at once, 192 MiB each. The cases of VM share one guest, in order:
  test_01  CreateWorkload answers once the domain runs (vcpus and memory of the allocation);
           its serial console (LogStream) shows the guest's boot marker; the guest agent
           answers (the two times are printed: create -> running, create -> agent);
  test_02  ExecuteWorkload through the guest agent: `echo hi` gives "hi" and "[exitcode] 0",
           `false` "[exitcode] 1", a missing program 127; the root disk is a qcow2 overlay of
           the image's disk (the guest reads the image's marker from /dev/vda, the overlay's
           backing file is the unpacked image) and writes to it stay in the overlay;
  test_02b ExecuteWorkload with open_stdin: the input streamed in pieces is the command's stdin
           once the client half-closes (cat gives it back, wc -c counts 96 KiB, the exit code
           comes as "[exitcode] N"); one byte past 96 KiB is refused RESOURCE_EXHAUSTED naming
           the limit, and the command never runs;
  test_03  Send writes a file into the guest (read back with exec cat, mode applied),
           SendLargeFile one of 3 MiB in chunks (its checksum in the guest), Copy gives a tar
           archive of a guest path;
  test_04  LogStream tail N gives the last N lines of the console; since and until split it
           around a time between two lines the guest wrote there (the console's time index);
           follow brings a line the guest writes while the stream is open;
  test_05  RemoveImage refuses the image the VM's disk is based on, naming the workload;
  test_06  ControlWorkload suspend/resume (libvirt's state follows), stop (an ACPI shutdown:
           the domain shuts off, not destroyed), start (it boots again, the console log keeps
           the first boot), exec works again, what the guest wrote on its disk is still there;
           restart boots it a third time;
  test_07  the node agent restarted: the guest runs on, its console log (and the lines
           written before) and its guest agent are found again, new lines come in;
  test_09  RemoveWorkload: no domain left (virsh list --all), the overlay and the log gone.
NoAgent: a guest without a guest agent (the same image told not to start it) fails exec with an
error naming the workload within the bounded wait, never hanging.
Images: BuildImage RAW takes a VM image (vm.json + disk), refuses a tar that is none and a
qcow2 disk with a backing file.
"""
import hashlib
import io
import json
import os
import queue
import subprocess
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

import grpc

import pvtest
from pb import core_pb2

import vmtest
from vmtest import GUEST_DIR, IMAGE, NOAGENT_IMAGE, VIRSH, Base, marker, say

POD = "vmp"
NODE = "vmq1"


# the guest's image goes onto the node through BuildImage RAW (18 MB in one message)
setUpModule, tearDownModule = vmtest.fixtures(POD, NODE, "vmt", build=(IMAGE,))


class VM(Base):
    wid = None
    name = None

    def test_01_boot(self):
        msg, create_s = self.create("vmtboot")
        VM.wid, VM.name = msg.id, msg.name
        t_running = time.monotonic()
        # the stream answered once the domain ran
        self.assertTrue(self.domstate(msg.name).startswith("running"), self.domstate(msg.name))
        info = json.loads(self.raw(msg.id, "dominfo"))
        self.assertEqual((info["vcpus"], info["max_memory_kib"]), (1, 192 * 1024))
        xml = self.raw(msg.id, "domain_xml").replace('"', "'")
        self.assertIn("<domain type='qemu'", xml)
        self.assertIn("org.qemu.guest_agent.0", xml)
        self.assertIn("<interface type='user'>", xml)
        self.wait_agent(msg.id)
        agent_s = create_s + (time.monotonic() - t_running)
        say("figures: create -> domain running %.2f s, create -> guest agent answering %.2f s "
            "(load average %.1f)" % (create_s, agent_s, os.getloadavg()[0]))
        self.wait_log(msg.id, marker("ready-marker"))
        boot = self.log_lines(msg.id)
        self.assertTrue(any("Linux version" in l for l in boot), boot[:5])

    def test_02_exec(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        out, code = self.execute(VM.wid, ["echo", "hi"])
        self.assertEqual((out, code), ("hi\n", "[exitcode] 0"))
        self.assertEqual(self.execute(VM.wid, ["false"])[1], "[exitcode] 1")
        out, code = self.execute(VM.wid, ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual((out, code), ("out\nerr\n", "[exitcode] 3"))
        out, code = self.execute(VM.wid, ["no-such-program"])
        self.assertEqual(code, "[exitcode] 127")
        self.assertIn("no-such-program", out)
        # the root disk: a linked clone of the image's disk
        out, code = self.execute(VM.wid, ["head", "-c", "14", "/dev/vda"])
        self.assertEqual((out, code), (marker("disk-marker"), "[exitcode] 0"))
        overlay = self.overlay(VM.wid)
        info = json.loads(subprocess.run(["qemu-img", "info", "-U", "--output=json", overlay],
                                         capture_output=True, text=True, check=True).stdout)
        self.assertEqual(info["format"], "qcow2")
        backing = info["full-backing-filename"]
        self.assertTrue(backing.startswith(os.path.join(self.stack.data_dir, "engine", NODE,
                                                        "images")), backing)
        self.assertLess(os.path.getsize(overlay), 2 * 2**20)  # a clone, not a copy
        with open(backing, "rb") as f:
            before = f.read()
        out, code = self.execute(VM.wid, ["/bin/sh", "-c",
                                          "echo WRITTEN-IN-GUEST | dd of=/dev/vda bs=512 seek=100"
                                          " conv=fsync 2>/dev/null; dd if=/dev/vda bs=512 skip=100"
                                          " count=1 2>/dev/null | head -c 16"])
        self.assertEqual((out, code), ("WRITTEN-IN-GUEST", "[exitcode] 0"))
        with open(backing, "rb") as f:
            self.assertEqual(f.read(), before)  # the image's disk is untouched

    def test_02b_exec_with_stdin(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")

        def run(commands, *chunks):
            first = core_pb2.ExecuteWorkloadOptions(workload_id=VM.wid, open_stdin=True,
                                                    commands=commands)
            feed = [core_pb2.ExecuteWorkloadOptions(repl_cmd=c) for c in chunks]
            got = [m.data for m in self.core.ExecuteWorkload(iter([first] + feed), timeout=90)]
            return b"".join(got[:-1]), got[-1].decode()

        # the input, sent in pieces, is the command's whole stdin once the client half-closes
        self.assertEqual(run(["cat"], b"one\n", b"two\n"), (b"one\ntwo\n", "[exitcode] 0"))
        data = os.urandom(96 * 1024)  # the most a VM's command takes
        self.assertEqual(run(["wc", "-c"], data[:50000], data[50000:]),
                         (b"%d\n" % len(data), "[exitcode] 0"))
        self.assertEqual(run(["/bin/sh", "-c", "read a; exit $a"], b"5\n"),
                         (b"", "[exitcode] 5"))
        # no input at all: stdin is empty
        self.assertEqual(run(["wc", "-c"]), (b"0\n", "[exitcode] 0"))
        # one byte more is refused, naming the limit, and nothing runs
        with self.assertRaises(grpc.RpcError) as e:
            run(["/bin/sh", "-c", "touch /root/ran"], data, b"x")
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                         e.exception.details())
        self.assertIn("at most 98304 bytes of input", e.exception.details())
        self.assertEqual(self.execute(VM.wid, ["test", "-e", "/root/ran"])[1], "[exitcode] 1")

    def overlay(self, wid):
        dom = ET.fromstring(self.raw(wid, "domain_xml", b'{"inactive": true}'))
        disk = [d for d in dom.iter("disk") if d.find("target").get("dev") == "vda"]
        return disk[0].find("source").get("file")

    def test_03_files(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        got = list(self.core.Send(core_pb2.SendOptions(
            IDs=[VM.wid], data={"/root/sent/hello.txt": b"hello from the host\n"},
            modes={"/root/sent/hello.txt": core_pb2.FileMode(mode=0o640)}), timeout=60))
        self.assertEqual([(m.id, m.path, m.error) for m in got],
                         [(VM.wid, "/root/sent/hello.txt", "")])
        self.assertEqual(self.execute(VM.wid, ["cat", "/root/sent/hello.txt"]),
                         ("hello from the host\n", "[exitcode] 0"))
        self.assertEqual(self.execute(VM.wid, ["stat", "-c", "%a", "/root/sent/hello.txt"])[0],
                         "640\n")
        # SendLargeFile: 3 MiB in 512 KiB chunks, written through the agent in 1 MiB pieces
        big = os.urandom(3 * 2**20)

        def chunks():
            for off in range(0, len(big), 512 * 1024):
                yield core_pb2.FileOptions(ids=[VM.wid], dst="/tmp/big.bin", size=len(big),
                                           mode=core_pb2.FileMode(mode=0o600),
                                           chunk=big[off:off + 512 * 1024])
        got = list(self.core.SendLargeFile(chunks(), timeout=120))
        self.assertEqual([m.error for m in got], [""], got)
        out, code = self.execute(VM.wid, ["sha256sum", "/tmp/big.bin"])
        self.assertEqual((out.split()[0], code), (hashlib.sha256(big).hexdigest(), "[exitcode] 0"))
        # Copy: a tar archive of a guest path
        got = list(self.core.Copy(core_pb2.CopyOptions(
            targets={VM.wid: core_pb2.CopyPaths(paths=["/root/sent"])}), timeout=60))
        self.assertEqual({m.error for m in got}, {""}, got[:1])
        with tarfile.open(fileobj=io.BytesIO(b"".join(m.data for m in got))) as t:
            self.assertEqual(t.extractfile("sent/hello.txt").read(), b"hello from the host\n")
        got = list(self.core.Copy(core_pb2.CopyOptions(
            targets={VM.wid: core_pb2.CopyPaths(paths=["/no/such/path"])}), timeout=60))
        self.assertEqual(len(got), 1)
        self.assertIn("/no/such/path", got[0].error)

    def console(self, text):
        """Writes a line on the guest's serial console (its log), from inside the guest."""
        self.assertEqual(self.execute(VM.wid, ["/bin/sh", "-c", "echo %s > /dev/console" % text]),
                         ("", "[exitcode] 0"))

    def ranged(self, since="", until=""):
        got = list(self.core.LogStream(core_pb2.LogStreamOptions(
            id=VM.wid, tail="all", since=since, until=until), timeout=30))
        return "\n".join(m.data.decode(errors="replace") for m in got if not m.error)

    def test_04_logs(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        everything = self.log_lines(VM.wid)
        self.assertGreater(len(everything), 20)
        self.assertEqual(self.log_lines(VM.wid, tail="3"), everything[-3:])
        # since and until, to the second of the console's time index
        self.console("PIVIRT-MARK-ONE")
        time.sleep(2.5)
        between = time.time()
        time.sleep(2.5)
        self.console("PIVIRT-MARK-TWO")
        time.sleep(1.5)  # one tick of the index
        after = self.ranged(since="%.3f" % between)
        self.assertIn("PIVIRT-MARK-TWO", after)
        self.assertNotIn("PIVIRT-MARK-ONE", after)
        before = self.ranged(until="%.3f" % between)
        self.assertIn("PIVIRT-MARK-ONE", before)
        self.assertNotIn("PIVIRT-MARK-TWO", before)
        self.assertIn(marker("ready-marker"), before)
        # follow: a line the guest writes now comes down the open stream
        stream = self.core.LogStream(core_pb2.LogStreamOptions(id=VM.wid, tail="1", follow=True),
                                     timeout=60)
        seen = queue.Queue()
        def read():
            try:
                for m in stream:
                    seen.put(m.data)
            except pvtest.grpc.RpcError:
                pass  # cancelled below
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(1)
        self.console("PIVIRT-MARK-FOLLOWED")
        deadline = time.monotonic() + 20
        got = b""
        while b"PIVIRT-MARK-FOLLOWED" not in got and time.monotonic() < deadline:
            try:
                got += seen.get(timeout=1) + b"\n"
            except queue.Empty:
                pass
        stream.cancel()
        self.assertIn(b"PIVIRT-MARK-FOLLOWED", got)

    def test_05_image_in_use(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname=POD, nodenames=[NODE], images=[IMAGE]), timeout=60))
        self.assertEqual([(m.image, m.success) for m in got], [(IMAGE, False)])
        self.assertIn(VM.wid, " ".join(got[0].messages))
        self.assertIn("in use", " ".join(got[0].messages))
        listed = list(self.core.ListImage(core_pb2.ListImageOptions(
            podname=POD, nodenames=[NODE], filter="pivirt/test/*"), timeout=60))
        self.assertEqual(sorted(t for i in listed[0].images for t in i.tags),
                         sorted(ref for ref, _ in vmtest.IMAGES))

    def control(self, kind):
        Base.control(self, VM.wid, kind)

    def test_06_control(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        self.control("suspend")
        self.assertTrue(self.domstate(VM.name).startswith("paused"), self.domstate(VM.name))
        self.control("resume")
        self.assertTrue(self.domstate(VM.name).startswith("running"), self.domstate(VM.name))
        t0 = time.monotonic()
        self.control("stop")
        stop_s = time.monotonic() - t0
        # an ACPI shutdown the guest obeyed: shut off by itself, not destroyed
        self.assertEqual(self.domstate(VM.name), "shut off (shutdown)")
        self.assertLess(stop_s, 15)
        say("figures: ControlWorkload stop (ACPI shutdown) %.2f s" % stop_s)
        boots = sum(marker("ready-marker") in l for l in self.log_lines(VM.wid))
        self.control("start")
        self.assertTrue(self.domstate(VM.name).startswith("running"), self.domstate(VM.name))
        deadline = time.monotonic() + 60
        while (sum(marker("ready-marker") in l for l in self.log_lines(VM.wid)) <= boots and
               time.monotonic() < deadline):
            time.sleep(0.3)
        self.assertEqual(sum(marker("ready-marker") in l for l in self.log_lines(VM.wid)),
                         boots + 1)
        self.wait_agent(VM.wid)
        # the overlay kept what the guest wrote before the stop
        probe = subprocess.run(["qemu-io", "-U", "-r", "-f", "qcow2", "-c", "read -v 51200 16",
                                self.overlay(VM.wid)], capture_output=True, text=True).stdout
        out, code = self.execute(VM.wid, ["/bin/sh", "-c", "dd if=/dev/vda bs=512 skip=100"
                                          " count=1 2>/dev/null | head -c 16"])
        self.assertEqual((out, code), ("WRITTEN-IN-GUEST", "[exitcode] 0"), probe)
        # restart: a stop and a start, a third boot
        self.control("restart")
        self.assertTrue(self.domstate(VM.name).startswith("running"), self.domstate(VM.name))
        deadline = time.monotonic() + 60
        while (sum(marker("ready-marker") in l for l in self.log_lines(VM.wid)) <= boots + 1 and
               time.monotonic() < deadline):
            time.sleep(0.3)
        self.assertEqual(sum(marker("ready-marker") in l for l in self.log_lines(VM.wid)),
                         boots + 2)
        self.wait_agent(VM.wid)

    def test_07_agent_restart(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        agent = self.stack.agents[0]
        agent.restart()
        self.stack.wait_ready([agent])
        # the guest ran on; its console log, its index and its agent are found again
        self.assertTrue(self.domstate(VM.name).startswith("running"), self.domstate(VM.name))
        self.assertIn("PIVIRT-MARK-FOLLOWED", "\n".join(self.log_lines(VM.wid)))
        self.wait_agent(VM.wid)
        self.console("PIVIRT-MARK-AFTER-RESTART")
        deadline = time.monotonic() + 10
        while ("PIVIRT-MARK-AFTER-RESTART" not in "\n".join(self.log_lines(VM.wid)) and
               time.monotonic() < deadline):
            time.sleep(0.3)
        self.assertIn("PIVIRT-MARK-AFTER-RESTART", "\n".join(self.log_lines(VM.wid)))

    def test_09_remove(self):
        self.assertIsNotNone(VM.wid, "test_01 did not boot the guest")
        overlay = self.overlay(VM.wid)
        log = os.path.join(self.stack.data_dir, "engine", NODE, "logs", VM.wid + ".log")
        self.assertTrue(os.path.exists(overlay) and os.path.exists(log))
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[VM.wid], force=True), timeout=120))
        self.assertTrue(got[0].success, got)
        names = subprocess.run(VIRSH + ["list", "--all", "--name"], capture_output=True,
                               text=True, check=True).stdout.split()
        self.assertNotIn(VM.name, names)
        self.assertFalse(os.path.exists(overlay), overlay)
        self.assertFalse(os.path.exists(log), log)
        # the image is no longer in use: it can go
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname=POD, nodenames=[NODE], images=[IMAGE]), timeout=60))
        self.assertEqual([(m.image, m.success) for m in got], [(IMAGE, True)], got)


class NoAgent(Base):
    def test_exec_without_agent_fails_naming_the_workload(self):
        msg, _ = self.create("vmtnoagent", NOAGENT_IMAGE)
        try:
            self.wait_log(msg.id, marker("ready-marker"))
            t0 = time.monotonic()
            try:
                out = self.execute(msg.id, ["echo", "hi"], timeout=60)
                self.fail("exec in a guest without an agent answered %s" % (out,))
            except pvtest.grpc.RpcError as e:
                self.assertIn(msg.id, e.details())
                self.assertIn("guest agent", e.details())
            self.assertLess(time.monotonic() - t0, 30)
        finally:
            self.remove(msg.id)


class Images(Base):
    def build(self, name, tar_bytes):
        return list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name=name, tags=["v1"], build_method=core_pb2.BuildImageOptions.RAW, tar=tar_bytes),
            timeout=60))

    def tar_of(self, files):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def test_build_raw_vm_images(self):
        with open(os.path.join(GUEST_DIR, "disk.qcow2"), "rb") as f:
            disk = f.read()
        got = self.build("vmimg/disk", self.tar_of({"disk.qcow2": disk}))
        self.assertEqual([(m.progress, m.status) for m in got], [("vmimg/disk:v1", "finished")])
        listed = list(self.core.ListImage(core_pb2.ListImageOptions(
            podname=POD, nodenames=[NODE], filter="vmimg/*"), timeout=60))
        self.assertEqual([list(i.tags) for i in listed[0].images], [["vmimg/disk:v1"]])
        # refused: neither a kernel nor a disk; a qcow2 disk with a backing file
        with self.assertRaises(pvtest.grpc.RpcError) as cm:
            self.build("vmimg/empty", self.tar_of({"README": b"no vm here"}))
        self.assertIn("not a VM image", cm.exception.details())
        with tempfile.TemporaryDirectory() as d:
            child = os.path.join(d, "child.qcow2")
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                            "/etc/hostname", child], check=True)
            with open(child, "rb") as f, self.assertRaises(pvtest.grpc.RpcError) as cm:
                self.build("vmimg/backed", f.read())
            self.assertIn("backing file", cm.exception.details())
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname=POD, nodenames=[NODE], images=["vmimg/disk:v1"]), timeout=60))
        self.assertEqual([(m.image, m.success) for m in got], [("vmimg/disk:v1", True)])


if __name__ == "__main__":
    pvtest.main()
