#!/usr/bin/python3
"""bench virt: real VMs created at once through pivirt next to the same domains through libvirt.

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/bench_virt.py [--count N]
        [--memory 192M]

(`./ops/pivirt bench virt` runs it on the release build, after installing python3-libvirt when
it is missing.) It starts its own Redis, gateway, scheduler, ops worker and one node agent on
virt://qemu:///system (tests/e2e/vmtest.py: the VM tests' guest, TCG), then, in the same run:

  1. pivirt: N CreateWorkload calls at once (default 8; one VM each, --memory of RAM, one
     vcpu); each call's answer is "the domain runs" (create -> running), then each guest's agent
     is pinged through libvirt until it answers (create -> agent);
  2. libvirt: the same domains (the pivirt domains' definitions, renamed, each with a root-disk
     overlay of its own made with qemu-img and a console log of its own) defined and started
     straight through libvirt (python3-libvirt, a connection per VM), N at once, timed the same
     way; the overlay is made inside the timed part, as pivirt makes it inside its create.

A warm-up domain is started and destroyed first, so that neither round pays libvirt's first
probe of QEMU. Prints both rates (VMs running per second: N over the time until the last runs),
their ratio (goal >= 0.8), create -> running and create -> agent p50/p99 for both, and the
resident memory of each QEMU (VmRSS, once every agent answered). At most N guests run at once.
Exit status 0 when every VM ran and answered in both rounds, 1 otherwise.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import pvtest  # noqa: E402

sys.path.insert(0, os.path.join(pvtest.BUILD_DIR, "py"))
import libvirt  # noqa: E402
import libvirt_qemu  # noqa: E402
import vmtest  # noqa: E402

libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # polls fail until agents answer
from pb import core_pb2, core_pb2_grpc  # noqa: E402

URI = "qemu:///system"
POD, NODE, PREFIX = "bvp", "bvq1", "bvt"
AGENT_WAIT_S = 120


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def agent_answers(conn, name):
    try:
        dom = conn.lookupByName(name)
        libvirt_qemu.qemuAgentCommand(dom, '{"execute": "guest-ping"}', 1, 0)
        return True
    except libvirt.libvirtError:
        return False


def wait_agent(name, t0, out, key):
    """out[key] = seconds from t0 until name's guest agent answers (None: never)."""
    conn = libvirt.open(URI)
    deadline = time.monotonic() + AGENT_WAIT_S
    while time.monotonic() < deadline:
        if agent_answers(conn, name):
            out[key] = time.monotonic() - t0
            break
        time.sleep(0.1)
    conn.close()


def qemu_rss_mib(name):
    try:
        with open("/run/libvirt/qemu/%s.pid" % name) as f:
            pid = int(f.read().strip())
        with open("/proc/%d/status" % pid) as f:
            kib = [int(l.split()[1]) for l in f if l.startswith("VmRSS:")][0]
        return kib / 1024.0
    except (OSError, ValueError, IndexError):
        return None


def run_parallel(n, fn):
    """Runs fn(i, t0) in n threads released together; returns t0."""
    gate = threading.Barrier(n + 1)
    t0 = [0.0]

    def body(i):
        gate.wait()
        fn(i, t0[0])
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    t0[0] = time.monotonic()
    gate.wait()
    for t in threads:
        t.join()
    return t0[0]


def pivirt_round(core, count, memory):
    running, agent, names, errors = {}, {}, {}, []

    def create(i, t0):
        try:
            msgs = list(core.CreateWorkload(vmtest.deploy("%spv%d" % (PREFIX, i), memory=memory,
                                                          cpus=0.2), timeout=300))
            if not msgs or not msgs[0].success:
                errors.append("VM %d: %s" % (i, msgs[0].error if msgs else "no answer"))
                return
            running[i] = time.monotonic() - t0
            names[i] = (msgs[0].id, msgs[0].name)
            wait_agent(msgs[0].name, t0, agent, i)
        except Exception as e:  # noqa: BLE001 - reported with the figures
            errors.append("VM %d: %s" % (i, e))
    run_parallel(count, create)
    rss = [qemu_rss_mib(name) for _, name in names.values()]
    return running, agent, names, rss, errors


def direct_xml(template, name, overlay, log):
    """The pivirt domain's definition as a plain libvirt domain of its own."""
    xml = re.sub(r"<uuid>[^<]*</uuid>", "", template)
    xml = re.sub(r"<metadata>.*?</metadata>", "", xml, flags=re.S)
    xml = re.sub(r"<mac address=[^/]*/>", "", xml)
    xml = re.sub(r"<name>[^<]*</name>", "<name>%s</name>" % name, xml, count=1)
    xml = re.sub(r"(<disk[^>]*>.*?<source file=)'[^']*'", r"\1'%s'" % overlay, xml, count=1,
                 flags=re.S)
    xml = re.sub(r'(<disk[^>]*>.*?<source file=)"[^"]*"', r'\1"%s"' % overlay, xml, count=1,
                 flags=re.S)
    return re.sub(r"<log file=(['\"])[^'\"]*\1", "<log file='%s'" % log, xml)


def direct_round(template, backing, workdir, count, tag):
    running, agent, names, errors = {}, {}, {}, []

    def create(i, t0):
        name = "%sdirect%s%d" % (PREFIX, tag, i)
        overlay = os.path.join(workdir, name + ".qcow2")
        try:
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b",
                            backing, overlay], check=True, capture_output=True)
            conn = libvirt.open(URI)
            dom = conn.defineXML(direct_xml(template, name, overlay,
                                            os.path.join(workdir, name + ".log")))
            names[i] = name
            dom.create()
            running[i] = time.monotonic() - t0
            conn.close()
            wait_agent(name, t0, agent, i)
        except (libvirt.libvirtError, subprocess.CalledProcessError) as e:
            errors.append("%s: %s" % (name, e))
    run_parallel(count, create)
    rss = [qemu_rss_mib(name) for name in names.values()]
    return running, agent, names, rss, errors


def drop_direct(names):
    conn = libvirt.open(URI)
    for name in names:
        try:
            dom = conn.lookupByName(name)
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        except libvirt.libvirtError:
            pass
    conn.close()


def figures(label, count, running, agent, rss):
    rate = count / max(running.values()) if len(running) == count else 0.0
    run_s, agent_s = list(running.values()), list(agent.values())
    print("  %-8s %5.2f VMs/s running | create -> running p50 %5.2f s p99 %5.2f s | "
          "create -> agent p50 %5.2f s p99 %5.2f s" % (
              label, rate, pct(run_s, 50) if run_s else float("nan"),
              pct(run_s, 99) if run_s else float("nan"),
              pct(agent_s, 50) if agent_s else float("nan"),
              pct(agent_s, 99) if agent_s else float("nan")))
    print("  %-8s QEMU resident memory (MiB): %s" % (
        "", " ".join("%.0f" % r if r is not None else "?" for r in rss)))
    return rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--memory", default="192M")
    args = ap.parse_args()
    stack = vmtest.start_stack(POD, NODE, PREFIX)
    workdir = tempfile.mkdtemp(prefix="pv-bench-virt-", dir=stack.data_dir)
    os.chmod(workdir, 0o755)
    ok = True
    try:
        core = core_pb2_grpc.CoreRPCStub(stack.channel(0))
        # warm-up: one VM through pivirt, whose definition is the direct round's template
        running, agent, names, _, errors = pivirt_round(core, 1, args.memory)
        if errors or not agent:
            raise RuntimeError("warm-up VM: %s" % (errors or "its agent never answered"))
        wid, name = names[0]
        conn = libvirt.open(URI)
        template = conn.lookupByName(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        conn.close()
        backing = json.loads(subprocess.run(
            ["qemu-img", "info", "-U", "--output=json",
             re.search(r"<source file=['\"]([^'\"]*)['\"]", template).group(1)],
            capture_output=True, text=True, check=True).stdout)["full-backing-filename"]
        list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                 timeout=120))
        load = os.getloadavg()[0]
        pv = pivirt_round(core, args.count, args.memory)
        list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[w for w, _ in pv[2].values()], force=True), timeout=300))
        lv = direct_round(template, backing, workdir, args.count, "")
        drop_direct(lv[2].values())
        print("\nbench virt: %d VMs of %s created at once, TCG (load average %.1f before)" % (
            args.count, args.memory, load))
        pv_rate = figures("pivirt", args.count, pv[0], pv[1], pv[3])
        lv_rate = figures("libvirt", args.count, lv[0], lv[1], lv[3])
        ratio = pv_rate / lv_rate if lv_rate else 0.0
        print("  ratio pivirt/libvirt %.2f (goal >= 0.8)" % ratio)
        for what, r in (("pivirt", pv), ("libvirt", lv)):
            for e in r[4]:
                print("  %s error: %s" % (what, e))
            if r[4] or len(r[0]) != args.count or len(r[1]) != args.count:
                ok = False
    finally:
        conn = libvirt.open(URI)
        left = [d.name() for d in conn.listAllDomains() if d.name().startswith(PREFIX + "direct")]
        conn.close()
        drop_direct(left)
        vmtest.stop_stack()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
