#!/usr/bin/python3
"""Losing a machine, on several hosts (issue 20): network namespaces made by the test (pvnet:
veth pairs on a bridge, addresses only inside them, all torn down after). Host "ctl" holds
Redis, the gateway, two ops workers and the scheduler; hosts h1, h2, h3 each a node agent with
its own data directory. Short timeouts: beat 1 s, fence 3 s, node timeout 6 s.

One trial per fault, each on the node that holds two HA workloads (and one without the label):
  crash      SIGKILL of everything on the host (agent, guard, workloads);
  partition  `ip link set eth0 down` in the host's namespace (everything runs on, cut off);
  freeze     SIGSTOP of the agent past the node timeout (its workloads run on), then SIGCONT.
Each asserts: the node seen NOT_READY; every HA workload running again elsewhere (same id, next
epoch); zero overlap: the old instance stopped (the host's fence log, or the crash) before the
replacement started (the new host's engine record), in ms; after the heal (link up, SIGCONT, the
agent started again) the old node keeps nothing that was replaced, the workload without the
label is still its own, and `pivirt check` is clean. Figures are printed per trial.

The test body runs inside the "ctl" host (re-executed there), so it talks only to the hosts it
made. Skipped without root or ip(8).
"""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

import pvnet
import pvtest

HOSTS = ("h1", "h2", "h3")
FENCE, TIMEOUT = 3, 6


def trial_stats(t0, seen_down, back):
    return {"not_ready_s": round(seen_down - t0, 2), "recovered_s": round(back - t0, 2)}


class Cluster:
    """The stack on the Net and what a trial needs of it."""

    def __init__(self, net):
        from pb import core_pb2, core_pb2_grpc
        from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc
        self.core_pb2, self.C = core_pb2, cluster_pb2
        self.net = net
        self.stack = pvnet.NetStack(net, HOSTS, "ha", config={
            "worker": {"heartbeat_seconds": 1, "lease_ms": 2000, "status_interval_seconds": 1,
                       "stop_grace_seconds": 1},
            "ha": {"node_timeout_seconds": TIMEOUT, "fence_seconds": FENCE}})
        self.stack.start()
        self.stack.write_image("tick", "1", "while :; do sleep 0.2; done\n")
        ch = self.stack.channel(0)
        self.cs = cluster_pb2_grpc.ClusterServiceStub(ch)
        self.core = core_pb2_grpc.CoreRPCStub(ch)
        pvnet.wait_for("every node READY", lambda: all(self.ready(h) for h in HOSTS), 30)

    def ready(self, host):
        return self.cs.GetNode(self.C.GetNodeRequest(cluster_id="ha", node_id=host),
                               timeout=10).status == self.C.NODE_STATUS_READY

    def deploy(self, name, count, host, ha=True):
        o = self.core_pb2.DeployOptions(
            name=name, entrypoint=self.core_pb2.EntrypointOptions(
                name="web", commands=["/bin/sh", "run.sh"]),
            podname="ha", image="tick:1", count=count, nodenames=[host],
            labels={"pivirt.io/ha": "restart"} if ha else {},
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        msgs = list(self.core.CreateWorkload(o, timeout=60))
        assert all(m.success for m in msgs), msgs
        return [m.id for m in msgs]

    def remove(self, ids):
        list(self.core.RemoveWorkload(self.core_pb2.RemoveWorkloadOptions(IDs=ids, force=True),
                                      timeout=60))

    def rec(self, wid):
        flat = self.stack.redis.cmd("HGETALL", self.stack.key("{reg}:wl:" + wid))
        return dict(zip(flat[::2], flat[1::2]))

    def running(self, wid):
        text = self.stack.redis.cmd("GET", self.stack.key("{reg}:wl-status:" + wid))
        return bool(text and json.loads(text).get("running"))

    def check(self):
        r = subprocess.run([os.path.join(pvtest.BIN_DIR, "pivirt-check"), "--config",
                            self.stack.config_path, "--confirm-ms", "500"],
                           capture_output=True, text=True, timeout=60)
        return r if r.returncode == 0 else None

    def trial(self, fault, victim):
        """One trial of FAULT on VICTIM; its figures. Raises AssertionError on a violation."""
        ha_ids = self.deploy("t-" + fault, 2, victim)
        plain = self.deploy("p-" + fault, 1, victim, ha=False)[0]
        epochs = {w: int(self.rec(w).get("epoch", "1")) for w in ha_ids}
        agent = self.stack.agent(victim)
        crash_ms = None
        t0 = time.monotonic()
        if fault == "crash":
            crash_ms = int(time.time() * 1000)
            self.net.kill_all(victim)
            agent.stop()  # reap it
        elif fault == "partition":
            self.net.link(victim, False)
        elif fault == "freeze":
            agent.send_signal(signal.SIGSTOP)
        try:
            pvnet.wait_for(victim + " NOT_READY", lambda: not self.ready(victim), TIMEOUT + 6)
            seen_down = time.monotonic()

            def moved():
                recs = {w: self.rec(w) for w in ha_ids}
                return all(r.get("node") not in (None, victim) and
                           int(r.get("epoch", "1")) == epochs[w] + 1 and self.running(w)
                           for w, r in recs.items()) and recs
            recs = pvnet.wait_for("every HA workload running again elsewhere", moved, 40)
            back = time.monotonic()
        finally:
            if fault == "partition":
                self.net.link(victim, True)
            elif fault == "freeze":
                agent.send_signal(signal.SIGCONT)
            elif fault == "crash":
                agent.start()
        overlaps = []
        for w, r in recs.items():
            started = self.stack.engine_record(r["node"], w)["started_ms"]
            if crash_ms is not None:
                stopped = crash_ms
            else:
                stops = [int(f[0]) for f in self.stack.fence_log(victim)
                         if f[1] == "fence" and f[2] == w and int(f[4]) == epochs[w]]
                assert stops, "no fence of %s on %s: %s" % (w, victim, self.stack.fence_log(victim))
                stopped = min(stops)
            overlaps.append(max(0, stopped - started))
        # the heal: the old node comes back, keeps nothing replaced, the rest is its own
        pvnet.wait_for(victim + " READY again", lambda: self.ready(victim), 30)
        pvnet.wait_for("the replaced instances gone from " + victim, lambda: all(
            self.stack.engine_record(victim, w) is None for w in ha_ids), 20)
        assert self.rec(plain)["node"] == victim
        assert self.stack.engine_record(victim, plain) is not None
        # a record lost: a workload deployed that the registry no longer has
        lost = sum(1 for w in ha_ids + [plain] if not self.rec(w))
        self.remove(ha_ids + [plain])
        audit = pvnet.wait_for("a clean audit", self.check, 30, step=1)
        assert audit.returncode == 0
        out = trial_stats(t0, seen_down, back)
        out.update(fault=fault, overlap_ms=max(overlaps), lost=lost)
        return out


class HANetns(unittest.TestCase):
    def test_faults(self):
        net = pvnet.Net.inside()
        c = Cluster(net)
        try:
            results = [c.trial(f, v) for f, v in (("crash", "h1"), ("partition", "h2"),
                                                  ("freeze", "h3"))]
        finally:
            c.stack.stop()
        for r in results:
            print("\n%(fault)s: NOT_READY after %(not_ready_s).1f s, every HA workload running "
                  "again after %(recovered_s).1f s, overlap %(overlap_ms)d ms" % r)
            self.assertEqual(r["overlap_ms"], 0, r)
            self.assertEqual(r["lost"], 0, r)
            self.assertLessEqual(r["not_ready_s"], 15, r)
            self.assertLessEqual(r["recovered_s"], 30, r)


def outer():
    why = pvnet.available()
    if why:
        print("skipped: " + why)
        return 0
    net = pvnet.Net(("ctl",) + HOSTS).create()
    try:
        return net.reexec_inside("ctl", os.path.abspath(__file__), ["HANetns"] + sys.argv[1:])
    finally:
        net.destroy()


if __name__ == "__main__":
    if pvnet.Net.inside():
        pvtest.main()
    else:
        sys.exit(outer())
