"""What the VM test modules (test_vm*.py, label vm) share: the host's preparation, the test
guest, a stack with one virt://qemu:///system node whose image store holds the guest, and a
base class of client helpers.

Each module runs in a process of its own (ctest), with its own stack, node and domain-name
prefix (its deploys' app names start with it), so that two modules at once (ctest -j2) never
touch each other's domains. Each module keeps at most one guest at a time: two modules at once
make the two 192 MiB guests the machine takes.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

GUEST_DIR = os.path.join(pvtest.BUILD_DIR, "guest")
IMAGE = "pivirt/test/guest:v1"
NOAGENT_IMAGE = "pivirt/test/guest-noagent:v1"
ONESHOT_IMAGE = "pivirt/test/guest-oneshot:v1"
IMAGES = ((IMAGE, "guest.tar"), (NOAGENT_IMAGE, "guest-noagent.tar"),
          (ONESHOT_IMAGE, "guest-oneshot.tar"))
VIRSH = ["virsh", "-c", "qemu:///system"]
XMLNS = "https://pivirt.io/xmlns/workload/1"  # the virt engine's domain metadata
STACK = None  # the module's stack (start_stack)
POD = NODE = PREFIX = None


def say(msg):
    print("%s: %s" % (os.path.basename(sys.argv[0]).rsplit(".", 1)[0], msg), file=sys.stderr,
          flush=True)


VIRTLOGD_SOCK = "/run/libvirt/virtlogd-sock"


def virtlogd_answers():
    """Whether virtlogd accepts on its socket: a virtlogd that died leaves the socket file
    behind, and every domain start then fails "Connection refused"."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(VIRTLOGD_SOCK)
            return True
        except OSError:
            return False


def ensure_virtlogd(timeout=10.0):
    if virtlogd_answers():
        return
    if os.path.exists(VIRTLOGD_SOCK):
        say("virtlogd's socket refuses connections (virtlogd died or was killed): starting it "
            "again")
    else:
        say("starting virtlogd (QEMU domains log through it; no systemd starts it here)")
    subprocess.run(["virtlogd", "-d"], check=True)
    deadline = time.monotonic() + timeout
    while not virtlogd_answers():
        if time.monotonic() >= deadline:
            raise RuntimeError("virtlogd started but does not accept on %s" % VIRTLOGD_SOCK)
        time.sleep(0.1)


def prepare_host():
    """What QEMU domains need here, as ops/pivirt's ensure_qemu_host does it."""
    why = pvtest.ensure_libvirtd()
    if why:
        raise RuntimeError(why)
    ensure_virtlogd()
    if os.path.exists("/dev/kvm") and subprocess.run(
            ["runuser", "-u", "libvirt-qemu", "--", "test", "-r", "/dev/kvm", "-a", "-w",
             "/dev/kvm"], capture_output=True).returncode != 0:
        say("giving /dev/kvm to group libvirt-qemu, mode 0660 (libvirt checks KVM as that user)")
        subprocess.run(["chgrp", "libvirt-qemu", "/dev/kvm"], check=True)
        os.chmod("/dev/kvm", 0o660)


def wait_available(core, node, timeout=60.0):
    """Waits until node's agent is alive: the stack's start waits for its registration, which
    comes before its first engine report (seconds on a loaded host) and only then the alive key
    that node calls need."""
    deadline = time.monotonic() + timeout
    while not core.GetNode(core_pb2.GetNodeOptions(nodename=node), timeout=10).available:
        if time.monotonic() >= deadline:
            raise RuntimeError("the agent of node %s is not alive %.0f s after its start" %
                               (node, timeout))
        time.sleep(0.2)


def build_image(core, ref, tar):
    """BuildImage RAW of the guest's tar (guest.tar: ~18 MB, one message, as an operator sends a
    VM image; its build pod is the module's, so it lands on the module's node and in the
    registry). Returns the seconds it took."""
    name, tag = ref.rsplit(":", 1)
    with open(os.path.join(GUEST_DIR, tar), "rb") as f:
        data = f.read()
    t0 = time.monotonic()
    got = list(core.BuildImage(core_pb2.BuildImageOptions(
        name=name, tags=[tag], build_method=core_pb2.BuildImageOptions.RAW, tar=data),
        timeout=180))
    if [m.progress for m in got if m.status == "finished"] != [ref]:
        raise RuntimeError("BuildImage %s (%d bytes): %s" % (ref, len(data), got))
    return time.monotonic() - t0


def cache_images(stack, pod, node, images=IMAGES, build=()):
    """Puts the guest's VM images into the registry directory and CacheImage's them onto node;
    those named in build go through BuildImage RAW instead of the copy (build_image)."""
    core = core_pb2_grpc.CoreRPCStub(stack.channel(0))
    wait_available(core, node)
    for ref, tar in images:
        name, tag = ref.rsplit(":", 1)
        if ref in build:
            say("BuildImage RAW of %s (%d bytes): %.1f s" % (
                tar, os.path.getsize(os.path.join(GUEST_DIR, tar)), build_image(core, ref, tar)))
            continue
        dst = os.path.join(stack.data_dir, "registry", name, tag + ".tar")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(GUEST_DIR, tar), dst)
        got = list(core.CacheImage(core_pb2.CacheImageOptions(
            podname=pod, nodenames=[node], images=[ref]), timeout=120))
        if [(m.image, m.success) for m in got] != [(ref, True)]:
            raise RuntimeError("CacheImage %s: %s" % (ref, got))


def start_stack(pod, node, prefix, config=None, storage=False, more_nodes=(), build=(),
                uri="qemu:///system"):
    """The module's stack: one node agent of node in pod on qemu:///system, the guest's images
    cached there. prefix: the module's domain names (its apps) start with it. storage: the
    node also holds StorageService pools (storage.default_node). more_nodes: the names of more
    nodes of pod, each an agent of its own on the same libvirtd with the images cached too.
    uri: the agents' libvirt URI (qemu:///system?socket=... reaches the same libvirtd through
    another socket)."""
    global STACK, POD, NODE, PREFIX
    POD, NODE, PREFIX = pod, node, prefix
    prepare_host()
    subprocess.run([os.path.join(pvtest.SOURCE_DIR, "tests", "guest", "build-guest.sh"),
                    GUEST_DIR], check=True)
    cfg = {"worker": {"status_interval_seconds": 1, "build_pod": pod, "stop_grace_seconds": 20}}
    if storage:
        cfg["storage"] = {"default_node": node}
    for k, v in (config or {}).items():
        cfg.setdefault(k, {}).update(v)
    STACK = pvtest.Stack(gateways=1, workers=1, schedulers=1,
                         agents=[{"node": n, "pod": pod, "endpoint": "virt://" + uri}
                                 for n in (node,) + tuple(more_nodes)],
                         config=cfg)
    STACK.start()
    for n in (node,) + tuple(more_nodes):
        cache_images(STACK, pod, n, build=build if n == node else ())
    return STACK


def fixtures(pod, node, prefix, storage=False, build=()):
    """A module's setUpModule and tearDownModule: its stack (start_stack), and at the end its
    domains and the stack gone (stop_stack)."""
    return (lambda: start_stack(pod, node, prefix, storage=storage, build=build),
            lambda: stop_stack(storage=storage))


def domains(prefix):
    """The names of this module's domains (any state): starting with prefix, and created by its
    stack's agent (their pivirt metadata's owner is under the stack's data directory; another
    run's test guests on the same libvirtd are not this module's)."""
    names = subprocess.run(VIRSH + ["list", "--all", "--name"], capture_output=True,
                           text=True).stdout.split()
    mine = []
    for n in names:
        if not n.startswith(prefix):
            continue
        meta = subprocess.run(VIRSH + ["metadata", n, "--uri", XMLNS], capture_output=True,
                              text=True).stdout
        if STACK is not None and STACK.data_dir in meta:
            mine.append(n)
    return mine


def stop_stack(storage=False):
    """Whatever a failed case left: no domain of this module outlives it; then the stack."""
    if STACK is None:
        return
    for n in domains(PREFIX):
        subprocess.run(VIRSH + ["destroy", n], capture_output=True)
        subprocess.run(VIRSH + ["undefine", n], capture_output=True)
    if storage:
        STACK.delete_storage(strict=False)
        # a failed case may leave a volume in use (its workload's record): the libvirt pools of
        # this stack go anyway (the system libvirtd outlives it)
        base = pvtest.libvirt_pool_name(STACK.prefix, "")
        pools = subprocess.run(VIRSH + ["pool-list", "--all", "--name"], capture_output=True,
                               text=True).stdout.split()
        for p in pools:
            if p.startswith(base):
                subprocess.run(VIRSH + ["pool-destroy", p], capture_output=True)
                subprocess.run(VIRSH + ["pool-undefine", p], capture_output=True)
    STACK.stop()


def deploy(name, image=IMAGE, memory="192M", cpus=1, pod=None):
    return core_pb2.DeployOptions(
        name=name, entrypoint=core_pb2.EntrypointOptions(name="vm", commands=["boot"]),
        podname=pod or POD, image=image, count=1,
        resources={"cpumem": json.dumps({"cpu-request": cpus, "memory-request": memory,
                                         "memory-limit": memory}).encode()})


def marker(name):
    with open(os.path.join(GUEST_DIR, name)) as f:
        return f.read().strip()


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = STACK
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def create(self, name, image=IMAGE, opts=None):
        t0 = time.monotonic()
        msgs = list(self.core.CreateWorkload(opts or deploy(name, image), timeout=180))
        elapsed = time.monotonic() - t0
        self.assertEqual(len(msgs), 1, msgs)
        self.assertTrue(msgs[0].success, msgs[0].error)
        return msgs[0], elapsed

    def remove(self, wid):
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[wid], force=True), timeout=120))
        self.assertTrue(got[0].success, got)

    def raw(self, wid, op, params=b""):
        return self.core.RawEngine(core_pb2.RawEngineOptions(id=wid, op=op, params=params),
                                   timeout=30).data.decode()

    def domstate(self, name):
        r = subprocess.run(VIRSH + ["domstate", "--reason", name], capture_output=True,
                           text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    def control(self, wid, kind):
        got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[wid], type=kind), timeout=120))
        self.assertEqual([(g.id, g.error) for g in got], [(wid, "")])

    def execute(self, wid, commands, timeout=60):
        got = list(self.core.ExecuteWorkload(iter([core_pb2.ExecuteWorkloadOptions(
            workload_id=wid, commands=list(commands))]), timeout=timeout))
        out = b"".join(m.data for m in got[:-1]).decode(errors="replace")
        return out, got[-1].data.decode()

    def log_lines(self, wid, tail="all"):
        got = list(self.core.LogStream(core_pb2.LogStreamOptions(id=wid, tail=tail),
                                       timeout=30))
        return [m.data.decode(errors="replace") for m in got if not m.error]

    def wait_log(self, wid, text, timeout=60):
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            lines = self.log_lines(wid)
            if any(text in l for l in lines):
                return lines
            time.sleep(0.3)
        self.fail("%s never showed %r on its console; last lines: %s" % (wid, text, lines[-10:]))

    def usable_after_reconnect(self, wid, name):
        """After the agent's libvirt connections were lost: the first call may fail, then the
        agent reconnects (and says so) and exec, suspend and resume work on domain name."""
        self.wait_agent(wid, timeout=30)
        self.control(wid, "suspend")
        self.assertTrue(self.domstate(name).startswith("paused"))
        self.control(wid, "resume")
        self.wait_agent(wid)
        with open(self.stack.agents[0].log_path) as f:
            self.assertIn("reconnected", f.read())

    def wait_agent(self, wid, timeout=60):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                out, code = self.execute(wid, ["true"], timeout=30)
                if code == "[exitcode] 0":
                    return
                last = (out, code)
            except Exception as e:  # noqa: BLE001 - the agent not connected yet: try again
                last = e
            time.sleep(0.3)
        self.fail("the guest agent of %s never answered: %s" % (wid, last))
