#!/usr/bin/python3
"""Node failure on docker nodes (issue 20): two node agents, hd1 and hd2 of pod "hdp", each on a
private dockerd of its own (pvtest.DockerDaemon: two hosts' daemons; one daemon shared by both
would hold both incarnations of a workload, and a create of the new one removes an older one it
finds), short timeouts (beat 1 s, fence 3 s, node timeout 6 s).

  test_frozen_agent  an HA container with restart policy "always" and one without the label on
                     hd1; hd1's agent SIGSTOPped. Its fence guard, needing neither Redis nor the
                     agent, kills the HA container through the Engine API within the fence time
                     plus a second (fence log: "guard SIGKILL (agent silent) (docker kill)"), and
                     the daemon does not restart it by its policy (a container killed through the
                     API counts as stopped by hand: exited, RestartCount unchanged). The workload
                     is recreated on hd2 (same id, epoch 2) and its container started there after
                     the old one finished (zero overlap, both times the daemon's). The container
                     without the label runs on throughout. After SIGCONT hd1 removes its stale
                     container and the audit is clean.
  test_redis_frozen  Redis SIGSTOPped: hd1's agent runs on but cannot renew; after the fence time
                     the HA container is stopped through the Engine API (the agent's fence, or its
                     guard), the one without the label runs on; once Redis is back, exactly one
                     instance of the HA workload runs again (on hd1 when the registry still
                     places it there, else recreated on hd2) and the audit is clean.
"""
import json
import os
import signal
import subprocess
import time
import unittest

import pvtest
from pvnet import wait_for
from pb import core_pb2, core_pb2_grpc
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc

C = cluster_pb2
POD = "hdp"
FENCE, TIMEOUT = 3, 6
_env = None
_dk2 = None


def ns(text):
    """Docker's RFC 3339 time (UTC, up to 9 digits of fraction, trailing zeros cut) in ns."""
    import calendar
    day, _, frac = text.rstrip("Z").partition(".")
    secs = calendar.timegm(time.strptime(day, "%Y-%m-%dT%H:%M:%S"))
    return secs * 10**9 + int((frac + "000000000")[:9])


def setUpModule():
    global _env, _dk2
    why = pvtest.docker_missing()
    if why:
        raise unittest.SkipTest(why)
    _dk2 = pvtest.DockerDaemon().start()
    _dk2.import_busybox("demo:1")
    _env = pvtest.DockerSetup(
        lambda dk: [{"node": "hd1", "pod": POD, "endpoint": dk.endpoint},
                    {"node": "hd2", "pod": POD, "endpoint": _dk2.endpoint}],
        config={"worker": {"heartbeat_seconds": 1, "lease_ms": 2000,
                           "status_interval_seconds": 1, "stop_grace_seconds": 1},
                "ha": {"node_timeout_seconds": TIMEOUT, "fence_seconds": FENCE}},
        alive=("hd1", "hd2"))


def tearDownModule():
    try:
        if _env:
            _env.stop()
    finally:
        if _dk2:
            _dk2.stop()


class DockerHA(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _env.stack
        cls.dks = {"hd1": _env.daemon, "hd2": _dk2}
        ch = cls.stack.channel(0)
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(ch)
        cls.core = core_pb2_grpc.CoreRPCStub(ch)
        wait_for("the nodes READY", lambda: all(cls.ready(n) for n in ("hd1", "hd2")), 30)

    @classmethod
    def ready(cls, node):
        return cls.cs.GetNode(C.GetNodeRequest(cluster_id=POD, node_id=node),
                              timeout=10).status == C.NODE_STATUS_READY

    def deploy(self, name, ha):
        o = core_pb2.DeployOptions(
            name=name, entrypoint=core_pb2.EntrypointOptions(
                name="w", restart="always", commands=["/bin/sh", "-c", "sleep 300"]),
            podname=POD, image="demo:1", count=1, nodenames=["hd1"],
            labels={"pivirt.io/ha": "restart"} if ha else {},
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        msgs = list(self.core.CreateWorkload(o, timeout=120))
        self.assertTrue(all(m.success for m in msgs), msgs)
        return msgs[0].id

    def rec(self, wid):
        flat = self.stack.redis.cmd("HGETALL", self.stack.key("{reg}:wl:" + wid))
        return dict(zip(flat[::2], flat[1::2]))

    def running(self, wid):
        text = self.stack.redis.cmd("GET", self.stack.key("{reg}:wl-status:" + wid))
        return bool(text and json.loads(text).get("running"))

    def container(self, wid, node):
        """The inspect of workload wid's container on node, or None."""
        for c in self.dks[node].containers("pivirt.id=" + wid):
            return self.dks[node].inspect(c["Id"])
        return None

    def fence_log(self, node):
        try:
            with open(os.path.join(self.stack.data_dir, "node", node, "fence.log")) as f:
                return [line.split(None, 5) for line in f]
        except FileNotFoundError:
            return []

    def check(self):
        r = subprocess.run([os.path.join(pvtest.BIN_DIR, "pivirt-check"), "--config",
                            self.stack.config_path, "--confirm-ms", "500"],
                           capture_output=True, text=True, timeout=60)
        return r if r.returncode == 0 else None

    def test_frozen_agent(self):
        wid = self.deploy("hdha", ha=True)
        plain = self.deploy("hdplain", ha=False)
        old = self.container(wid, "hd1")
        self.assertTrue(old["State"]["Running"], old["State"])
        plain_started = self.container(plain, "hd1")["State"]["StartedAt"]
        agent = self.stack.agents[self.stack.agent_nodes.index("hd1")]
        time.sleep(1.5)  # the guard has learnt the container (the fence refreshes its page)
        t0 = time.monotonic()
        agent.send_signal(signal.SIGSTOP)
        try:
            wait_for("the HA container stopped by the guard", lambda: not self.dks["hd1"].inspect(
                old["Id"])["State"]["Running"], FENCE + 3, step=0.05)
            t_fenced = time.monotonic() - t0
            self.assertLess(t_fenced, FENCE + 1.5)
            wait_for("hd1 NOT_READY", lambda: not self.ready("hd1"), TIMEOUT + 6)

            def moved():
                r = self.rec(wid)
                return r.get("node") == "hd2" and r.get("epoch") == "2" and \
                    self.running(wid) and r
            wait_for("the HA workload running on hd2", moved, 40)
            t_back = time.monotonic() - t0
            # the policy did not bring the old one back, all this time
            st = self.dks["hd1"].inspect(old["Id"])["State"]
            self.assertEqual((st["Status"], st["Running"]), ("exited", False), st)
            self.assertEqual(self.dks["hd1"].inspect(old["Id"])["RestartCount"], old["RestartCount"])
            # the one without the label runs on, never restarted
            p = self.container(plain, "hd1")
            self.assertTrue(p["State"]["Running"], p["State"])
            self.assertEqual(p["State"]["StartedAt"], plain_started)
        finally:
            agent.send_signal(signal.SIGCONT)
        fenced = [f for f in self.fence_log("hd1") if f[1] == "fence" and f[2] == wid]
        self.assertTrue(fenced, self.fence_log("hd1"))
        self.assertIn("guard SIGKILL (agent silent) (docker kill)", fenced[0][5])
        new = self.container(wid, "hd2")
        self.assertTrue(new["State"]["Running"], new["State"])
        finished = self.dks["hd1"].inspect(old["Id"])["State"]["FinishedAt"]
        self.assertLess(ns(finished), ns(new["State"]["StartedAt"]))
        # the resumed agent removes its stale container; the audit is clean
        wait_for("the stale container removed from hd1",
                 lambda: self.dks["hd1"].inspect(old["Id"]) is None, 20)
        wait_for("hd1 READY again", lambda: self.ready("hd1"), 30)
        self.assertTrue(self.container(plain, "hd1")["State"]["Running"])
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid, plain]),
                                      timeout=60))
        wait_for("a clean audit", self.check, 30, step=1)
        print("\ndocker, agent frozen: container killed by the guard after %.1f s, running on "
              "hd2 after %.1f s, old finished %s, new started %s"
              % (t_fenced, t_back, finished, new["State"]["StartedAt"]))


    def test_redis_frozen(self):
        wid = self.deploy("hdrha", ha=True)
        plain = self.deploy("hdrplain", ha=False)
        old = self.container(wid, "hd1")
        plain_started = self.container(plain, "hd1")["State"]["StartedAt"]
        wait_for("hd1 READY", lambda: self.ready("hd1"), 30)
        n_before = len(self.fence_log("hd1"))
        time.sleep(1.5)  # the fence has learnt the container
        redis = self.stack.redis.proc
        t0 = time.monotonic()
        redis.send_signal(signal.SIGSTOP)
        try:
            wait_for("the HA container fenced", lambda: not self.dks["hd1"].inspect(
                old["Id"])["State"]["Running"], FENCE + 3, step=0.05)
            t_fenced = time.monotonic() - t0
            self.assertLess(t_fenced, FENCE + 1.5)
            p = self.container(plain, "hd1")
            self.assertTrue(p["State"]["Running"], p["State"])
            self.assertEqual(p["State"]["StartedAt"], plain_started)
        finally:
            redis.send_signal(signal.SIGCONT)
        log = self.fence_log("hd1")[n_before:]
        self.assertTrue([f for f in log if f[1] == "fence" and f[2] == wid], log)
        self.assertEqual([f for f in log if f[1] == "fence" and f[2] == plain], [])

        def once():
            on = [n for n in ("hd1", "hd2")
                  if (c := self.container(wid, n)) and c["State"]["Running"]]
            return len(on) == 1 and self.running(wid) and self.rec(wid).get("node") == on[0] \
                and on
        where = wait_for("the HA workload running again, once", once, 40)
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid, plain]),
                                      timeout=60))
        wait_for("a clean audit", self.check, 30, step=1)
        print("\ndocker, Redis frozen: container fenced after %.1f s, running again on %s"
              % (t_fenced, where[0]))

if __name__ == "__main__":
    pvtest.main()
