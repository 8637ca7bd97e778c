"""Statuses of a docker node come from the daemon's event stream, not from the agent's passes.

Real processes: a private dockerd (pvtest.DockerDaemon), redis-server, a gateway, a scheduler,
an ops worker and one node agent "dke" on that daemon (unix://) whose status pass runs only every
60 s (worker.status_interval_seconds 60): a status that changes within a second or two of a
change made behind pivirt's back (straight through the Engine API) can only have come from the
agent's events follower (GET /events).

Classes:
  Events        pause, unpause, kill, start and stop of a workload's container through the
                Engine API: GetWorkloadsStatus says so within 2 s each, and so does a
                WorkloadStatusStream follower.
  DaemonRestart dockerd stopped (its containers stop with it) and started again under the
                agent: the agent lists again on reconnecting, so the workload is reported not
                running (the daemon sent no event of that: its API closed first), and the
                stream is followed again (a start through the API shows within 2 s).
"""
import json
import threading
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc

POD = "evp"
PROMPT = 2.0  # seconds: a change through the API shows in the status within this

_env = None


def setUpModule():
    global _env
    _env = pvtest.DockerSetup(
        lambda dk: [{"node": "dke", "pod": POD, "endpoint": dk.endpoint}],
        config={"worker": {"status_interval_seconds": 60}}, alive=("dke",))


def tearDownModule():
    if _env:
        _env.stop()


class Watch:
    """One WorkloadStatusStream read by a thread: running() is what it said of id, in order."""

    def __init__(self, test, core, **opts):
        self.stream = core.WorkloadStatusStream(core_pb2.WorkloadStatusStreamOptions(**opts),
                                                timeout=120)
        test.addCleanup(self.stream.cancel)
        self.got, self.lock = [], threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for m in self.stream:
                with self.lock:
                    self.got.append(m)
        except grpc.RpcError:
            pass

    def running(self, wid):
        with self.lock:
            return [m.status.running for m in self.got if m.id == wid and not m.delete]


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack, cls.dk = _env.stack, _env.daemon
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def deploy(self, name):
        opts = core_pb2.DeployOptions(
            name=name, entrypoint=core_pb2.EntrypointOptions(
                name="w", commands=["/bin/sh", "-c", "sleep 300"]),
            podname=POD, nodenames=["dke"], image="demo:1", count=1,
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})
        msgs = list(self.core.CreateWorkload(opts, timeout=90))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id
        self.addCleanup(lambda: list(self.core.RemoveWorkload(
            core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True), timeout=60)))
        return wid, self.dk.containers("pivirt.id=" + wid)[0]["Id"]

    def running(self, wid):
        """GetWorkloadsStatus's running; None while there is no status (Eru's error then)."""
        try:
            st = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[wid]), timeout=10)
        except grpc.RpcError as e:
            if "not found" not in (e.details() or ""):
                raise
            return None
        return st.status[0].running

    def wait_running(self, wid, want, within):
        """Seconds until GetWorkloadsStatus says running == WANT (fails past WITHIN)."""
        t0 = time.monotonic()
        while self.running(wid) != want:
            self.assertLess(time.monotonic() - t0, within,
                            "workload %s: running is not %s after %.1fs" % (wid, want, within))
            time.sleep(0.05)
        return time.monotonic() - t0


class Events(Base):
    def test_changes_behind_pivirts_back_show_at_once(self):
        wid, cid = self.deploy("evapp")
        watch = Watch(self, self.core, appname="evapp")
        self.wait_running(wid, True, 10)
        time.sleep(1.0)  # the stream is registered with its follower by then
        took = {}
        for what, path, want in (("pause", "/pause", False), ("unpause", "/unpause", True),
                                 ("kill", "/kill?signal=KILL", False), ("start", "/start", True),
                                 ("stop", "/stop?t=1", False)):
            self.dk.api("POST", "/containers/%s%s" % (cid, path))
            t0 = time.monotonic()
            took[what] = self.wait_running(wid, want, PROMPT)
            # the stream's follower sees it too (its last message about the workload)
            while (watch.running(wid) or [None])[-1] != want:
                self.assertLess(time.monotonic() - t0, PROMPT, (what, watch.running(wid)))
                time.sleep(0.05)
        print("status after a change through the API (s):",
              {k: round(v, 2) for k, v in took.items()})


class DaemonRestart(Base):
    def test_daemon_restart_under_the_agent(self):
        wid, cid = self.deploy("evrestart")
        self.wait_running(wid, True, 10)
        self.dk.proc.stop(timeout=30)  # its API closes, then its containers stop
        self.dk.start()
        self.assertFalse(self.dk.inspect(cid)["State"]["Running"])
        # the listing on reconnecting (backoff at most 2 s) finds it stopped
        self.wait_running(wid, False, 8)
        # and the stream is followed again
        self.dk.api("POST", "/containers/%s/start" % cid)
        self.wait_running(wid, True, PROMPT)
        self.dk.api("POST", "/containers/%s/kill?signal=KILL" % cid)
        self.wait_running(wid, False, PROMPT)
        agent = self.stack.agents[0]
        self.assertIn("followed again", agent.log())


if __name__ == "__main__":
    pvtest.main()
