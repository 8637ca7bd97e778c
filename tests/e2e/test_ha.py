#!/usr/bin/python3
"""End-to-end tests of losing a node (issue 20) on one machine: three node agents (ha1, ha2,
ha3) in cluster "ha", two ops workers, a scheduler, short timeouts (beat 1 s, fence 3 s, node
timeout 6 s). The multi-host forms (network namespaces, partitions) are test_ha_netns.py.

  test_a  a deploy with an unknown HA policy is refused INVALID_ARGUMENT naming the label and
          the value; nothing is created. A failover's claim of a workload whose node is alive is
          refused and changes nothing.
  test_b  crash: the agent of the node holding HA workloads and its workloads are SIGKILLed.
          The node is NOT_READY (ClusterService, CoreRPC GetNodeStatus), GetHealth is DEGRADED
          naming it, node.not_ready is on the events stream; a node.failover operation
          recreates each HA workload on another node (same id, epoch 2, running there, its
          resources given back to the lost node); the workload without the label stays there,
          down. The agent started again keeps nothing replaced (its old instances are removed),
          the node is READY (node.ready event) and `pivirt check` is clean.
  test_c  freeze: the agent alone is SIGSTOPped while its HA workload runs; its guard kills the
          workload at the fence time, before the node is NOT_READY; the workload is recreated
          elsewhere and the old one stopped before the new one started (fence log against the
          replacement's start, both in ms). After SIGCONT the node's stale instance is removed,
          a status it writes for it is refused, and the audit is clean.
  test_d  the whole host down (agent and workloads killed), an HA workload with restart policy
          "always" recreated elsewhere: the agent started again does not let the process engine
          restart it (held until the registry answers: replaced, so removed); the one without
          the label is started again.
  test_e  a ControlWorkload start queued for a frozen node before it was declared dead is
          refused when the agent resumes (the workload was recreated elsewhere: epoch check),
          and the old instance is removed, not started.
  test_f  the calls that act on one workload's instance (ExecuteWorkload, LogStream,
          ReallocResource, Send, Copy), made while its node's agent is frozen (queued for that
          node), are answered with the same refusal once the agent resumes after the workload
          was recreated elsewhere: none acts on the old instance (the realloc changes nothing,
          no file is written into it).
"""
import json
import os
import signal
import subprocess
import threading
import time
import unittest

import grpc

import pvtest
from pvnet import wait_for
from pb import core_pb2, core_pb2_grpc
from pivirt.cluster.v1 import cluster_pb2, cluster_pb2_grpc

C = cluster_pb2
NODES = ("ha1", "ha2", "ha3")
FENCE, TIMEOUT = 3, 6
_stack = None


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=2, schedulers=1,
                          agents=[(n, "ha") for n in NODES],
                          config={"worker": {"heartbeat_seconds": 1, "lease_ms": 2000,
                                             "status_interval_seconds": 1,
                                             "stop_grace_seconds": 1},
                                  "ha": {"node_timeout_seconds": TIMEOUT,
                                         "fence_seconds": FENCE}})
    _stack.start()
    pvtest.write_script_image(_stack.data_dir, "tick", "1", "while :; do sleep 0.2; done\n")


def tearDownModule():
    _stack.stop()


def proc_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


class HA(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        ch = cls.stack.channel(0)
        cls.cs = cluster_pb2_grpc.ClusterServiceStub(ch)
        cls.core = core_pb2_grpc.CoreRPCStub(ch)
        wait_for("the nodes READY", lambda: all(
            cls.node(n).status == C.NODE_STATUS_READY for n in NODES), timeout=30)

    @classmethod
    def node(cls, name):
        return cls.cs.GetNode(C.GetNodeRequest(cluster_id="ha", node_id=name), timeout=10)

    def opts(self, name, count, nodes=(), labels=None, restart=""):
        return core_pb2.DeployOptions(
            name=name, entrypoint=core_pb2.EntrypointOptions(name="web", restart=restart,
                                                             commands=["/bin/sh", "run.sh"]),
            podname="ha", image="tick:1", count=count, nodenames=list(nodes),
            labels=labels or {},
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})

    def deploy(self, name, count, nodes=(), ha=True, restart=""):
        msgs = list(self.core.CreateWorkload(
            self.opts(name, count, nodes, {"pivirt.io/ha": "restart"} if ha else {}, restart),
            timeout=60))
        self.assertTrue(all(m.success for m in msgs), msgs)
        return [m.id for m in msgs]

    def record(self, wid):
        return self.stack.redis.cmd("HGETALL", self.stack.key("{reg}:wl:" + wid))

    def rec(self, wid):
        flat = self.record(wid)
        return dict(zip(flat[::2], flat[1::2]))

    def engine_record(self, node, wid):
        path = os.path.join(self.stack.data_dir, "engine", node, wid, "record.json")
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def status(self, wid):
        text = self.stack.redis.cmd("GET", self.stack.key("{reg}:wl-status:" + wid))
        return json.loads(text) if text else None

    def events(self, kind):
        out = []
        for _id, fields in self.stack.redis.cmd("XRANGE", self.stack.key("{ops}:events"),
                                                "-", "+"):
            f = dict(zip(fields[::2], fields[1::2]))
            if f.get("kind") == kind:
                out.append(f)
        return out

    def fence_log(self, node):
        try:
            with open(os.path.join(self.stack.data_dir, "node", node, "fence.log")) as f:
                return [line.split() for line in f]
        except FileNotFoundError:
            return []

    def check(self):
        return subprocess.run([os.path.join(pvtest.BIN_DIR, "pivirt-check"), "--config",
                               self.stack.config_path, "--confirm-ms", "500"],
                              capture_output=True, text=True, timeout=60)

    def wait_recovered(self, ids, lost, timeout=30):
        def done():
            recs = {w: self.rec(w) for w in ids}
            return all(r.get("node") not in (None, lost) and r.get("epoch") == "2" and
                       (self.status(w) or {}).get("running") for w, r in recs.items()) and recs
        return wait_for("every HA workload running again elsewhere", done, timeout)

    def agent(self, name):
        return self.stack.agents[self.stack.agent_nodes.index(name)]

    def clean_audit(self):
        last = []

        def clean():
            r = self.check()
            last[:] = [r]
            return r if r.returncode == 0 else None
        try:
            wait_for("a clean audit", clean, timeout=20, step=1)
        except AssertionError:
            r = last[0] if last else None
            self.fail("no clean audit within 20 s; the last said:\n%s" %
                      ((r.stdout + r.stderr) if r else "(no audit ran)"))

    def remove(self, ids):
        removed = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=ids),
                                                timeout=30))
        self.assertTrue(all(m.success for m in removed), removed)

    def node_ops(self, kind, wid):
        """The operations of kind whose parameters name workload wid: {id: record}."""
        out = {}
        for key in self.stack.scan(self.stack.key("{ops}:op:*")):
            flat = self.stack.redis.cmd("HGETALL", key)
            rec = dict(zip(flat[::2], flat[1::2]))
            if rec.get("kind") == kind and wid in rec.get("params", ""):
                out[rec["id"]] = rec
        return out

    def op_output(self, op_id):
        return [dict(zip(f[::2], f[1::2])) for _i, f in self.stack.redis.cmd(
            "XRANGE", self.stack.key("{ops}:out:" + op_id), "-", "+")]

    def test_a_unknown_policy_refused(self):
        with self.assertRaises(grpc.RpcError) as e:
            list(self.core.CreateWorkload(self.opts("bad", 1, labels={"pivirt.io/ha": "maybe"}),
                                          timeout=30))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn('labels[pivirt.io/ha]: "maybe" is not an HA policy', e.exception.details())
        self.assertEqual(list(self.core.ListWorkloads(core_pb2.ListWorkloadsOptions(
            appname="bad"), timeout=10)), [])
        # a failover cannot take a workload from a node that is alive: it fenced nothing
        wid = self.deploy("alive", 1, nodes=("ha3",))[0]
        with self.assertRaises(pvtest.RedisError) as e:
            self.stack.redis.cmd("FCALL", "pv_wl_ha_claim", 0, self.stack.key("{reg}:"), wid,
                                 "ha3", "op-test")
        self.assertIn("FAILED_PRECONDITION node ha3 is alive: workload %s stays there" % wid,
                      str(e.exception))
        self.assertEqual((self.rec(wid)["epoch"], self.rec(wid)["placing"]), ("1", ""))
        removed = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid]),
                                                timeout=30))
        self.assertTrue(all(m.success for m in removed), removed)

    def test_b_crash(self):
        ha_ids = self.deploy("crash", 2, nodes=("ha1",))
        plain = self.deploy("plain", 1, nodes=("ha1",), ha=False)[0]
        for w in ha_ids + [plain]:
            self.assertEqual(self.rec(w)["epoch"], "1")
        usage_before = self.node("ha1").resources.memory_used_bytes
        pids = [self.engine_record("ha1", w)["pid"] for w in ha_ids + [plain]]
        agent = self.agent("ha1")
        t0 = time.monotonic()
        agent.kill9()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_for("ha1 NOT_READY", lambda: self.node("ha1").status == C.NODE_STATUS_NOT_READY,
                 timeout=TIMEOUT + 5)
        t_down = time.monotonic() - t0
        self.assertGreaterEqual(t_down, TIMEOUT - 1.5)
        with self.assertRaises(grpc.RpcError) as e:
            self.core.GetNodeStatus(core_pb2.GetNodeStatusOptions(nodename="ha1"), timeout=10)
        self.assertIn("ha1", e.exception.details())
        h = self.cs.GetHealth(C.GetHealthRequest(cluster_id="ha"), timeout=10)
        self.assertEqual(h.status, C.HEALTH_STATUS_DEGRADED)
        self.assertEqual(h.message, "1 of its 3 nodes are down: ha1")
        wait_for("node.not_ready event", lambda: [e for e in self.events("node.not_ready")
                                                  if e["target"] == "ha1"], timeout=5)
        recs = self.wait_recovered(ha_ids, "ha1")
        t_back = time.monotonic() - t0
        self.assertLessEqual(t_back, 30)
        for w, r in recs.items():
            self.assertIn(r["node"], ("ha2", "ha3"))
            self.assertEqual(r["placing"], "")
            self.assertEqual(self.engine_record(r["node"], w)["state"], "running")
        self.assertEqual(len([e for e in self.events("workload.recovered")
                              if e["target"] in ha_ids]), 2)
        # without the label: still on ha1, down
        self.assertEqual(self.rec(plain)["node"], "ha1")
        # marked down by the scheduler's tick once its own report expired (a read between the
        # two finds no status)
        wait_for("the workload without the label marked down",
                 lambda: (self.status(plain) or {}).get("running") is False, timeout=10)
        # the lost node's usage is what the plain workload holds
        self.assertLess(self.node("ha1").resources.memory_used_bytes, usage_before)
        # back: nothing replaced stays on ha1
        agent.start()
        wait_for("ha1 READY", lambda: self.node("ha1").status == C.NODE_STATUS_READY)
        wait_for("the replaced instances removed from ha1", lambda: all(
            self.engine_record("ha1", w) is None for w in ha_ids), timeout=15)
        self.assertIsNotNone(self.engine_record("ha1", plain))
        wait_for("node.ready event", lambda: [e for e in self.events("node.ready")
                                              if e["target"] == "ha1"], timeout=5)
        removed = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[plain]),
                                                timeout=30))
        self.assertTrue(all(m.success for m in removed), removed)
        res = wait_for("a clean audit", lambda: (lambda r: r if r.returncode == 0 else None)(
            self.check()), timeout=20, step=1)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        print("\ncrash: NOT_READY after %.1f s, every HA workload running again after %.1f s"
              % (t_down, t_back))

    def test_c_freeze(self):
        wid = self.deploy("freeze", 1, nodes=("ha2",))[0]
        agent = self.agent("ha2")
        t0 = time.monotonic()
        agent.send_signal(signal.SIGSTOP)
        try:
            pid = self.engine_record("ha2", wid)["pid"]
            # the guard fences before the cluster may recreate it
            wait_for("the guard's fence", lambda: not proc_alive(pid), timeout=FENCE + 2)
            t_fenced = time.monotonic() - t0
            self.assertLess(t_fenced, TIMEOUT)
            recs = self.wait_recovered([wid], "ha2")
            t_back = time.monotonic() - t0
        finally:
            agent.send_signal(signal.SIGCONT)
        new_node = recs[wid]["node"]
        started = self.engine_record(new_node, wid)["started_ms"]
        stops = [int(f[0]) for f in self.fence_log("ha2") if f[1] == "fence" and f[2] == wid]
        self.assertTrue(stops, self.fence_log("ha2"))
        self.assertLess(min(stops), started)  # zero overlap: old stopped before new started
        # the resumed agent removes its stale instance
        wait_for("the stale instance removed from ha2",
                 lambda: self.engine_record("ha2", wid) is None, timeout=15)
        self.assertEqual(self.node("ha2").status, C.NODE_STATUS_READY)
        # a stale status of the old incarnation is refused, and changes nothing
        rec = self.rec(wid)
        self.assertEqual((rec["node"], rec["epoch"]), (new_node, "2"))
        before = self.status(wid)
        with self.assertRaises(pvtest.RedisError) as e:
            self.stack.redis.cmd("FCALL", "pv_wl_report_status", 0, self.stack.key("{reg}:"), 1,
                                 wid, '{"running":false,"healthy":false,"networks":{},'
                                 '"extension":"","ttl":0}', 0, "ha2", 1)
        self.assertIn("stale report: workload %s is incarnation 2 on node %s (MOVED)"
                      % (wid, new_node), str(e.exception))
        self.assertEqual(self.status(wid), before)
        res = wait_for("a clean audit", lambda: (lambda r: r if r.returncode == 0 else None)(
            self.check()), timeout=20, step=1)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        print("\nfreeze: fenced after %.1f s, running again after %.1f s, old stopped %d ms "
              "before the new one started" % (t_fenced, t_back, started - min(stops)))

    def test_d_restart_policy_after_host_down(self):
        """The whole host down (agent and workloads), an HA workload with restart policy
        "always" recreated elsewhere meanwhile: the agent started again holds the engine's
        restarts until the registry answered, so the replaced one is removed, never started;
        the one without the label (still the node's) is started again."""
        ha = self.deploy("reboot", 1, nodes=("ha3",), restart="always")[0]
        plain = self.deploy("rplain", 1, nodes=("ha3",), ha=False, restart="always")[0]
        pids = [self.engine_record("ha3", w)["pid"] for w in (ha, plain)]
        agent = self.agent("ha3")
        agent.kill9()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        recs = self.wait_recovered([ha], "ha3")
        new_node = recs[ha]["node"]
        agent.start()
        wait_for("ha3 READY", lambda: self.node("ha3").status == C.NODE_STATUS_READY)
        wait_for("the replaced instance removed from ha3",
                 lambda: self.engine_record("ha3", ha) is None, timeout=15)
        wait_for("the workload without the label running again on ha3", lambda: (
            (self.engine_record("ha3", plain) or {}).get("state") == "running" and
            (self.status(plain) or {}).get("running")), timeout=15)
        log = [(f[1], f[2], f[4]) for f in self.fence_log("ha3")]
        self.assertIn(("held", ha, "1"), log)
        self.assertIn(("held", plain, "1"), log)
        self.assertIn(("removed", ha, "1"), log)
        self.assertNotIn(("resumed", ha, "1"), log)
        self.assertIn(("resumed", plain, "1"), log)
        self.assertEqual(self.engine_record(new_node, ha)["state"], "running")
        self.assertEqual((self.rec(ha)["node"], self.rec(ha)["epoch"]), (new_node, "2"))
        self.remove([ha, plain])
        self.clean_audit()

    def test_e_queued_operation_of_a_replaced_instance(self):
        """A ControlWorkload start queued for a frozen node before it was declared dead runs when
        the agent resumes, after the workload was recreated elsewhere: it is refused (the
        instance's epoch against the registry's), the old instance is removed, not started."""
        wid = self.deploy("queued", 1, nodes=("ha1",))[0]
        agent = self.agent("ha1")
        pid = self.engine_record("ha1", wid)["pid"]
        agent.send_signal(signal.SIGSTOP)
        try:
            wait_for("the guard's fence", lambda: not proc_alive(pid), timeout=FENCE + 2)
            with self.assertRaises(grpc.RpcError) as e:
                list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
                    IDs=[wid], type="start"), timeout=2))
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            queued = self.node_ops("workload.control_on_node", wid)
            self.assertEqual(len(queued), 1, queued)
            op_id = list(queued)[0]
            self.assertEqual(queued[op_id]["status"], "PENDING")
            recs = self.wait_recovered([wid], "ha1")
        finally:
            agent.send_signal(signal.SIGCONT)
        new_node = recs[wid]["node"]
        done = wait_for("the queued start answered", lambda: [
            o for o in self.op_output(op_id) if o.get("type") == "controlled"], timeout=20)
        self.assertEqual(done[0]["id"], wid)
        self.assertIn("workload %s was replaced while node ha1 was away: the registry holds its "
                      "incarnation 2 elsewhere, this node's instance is incarnation 1"
                      % wid, done[0]["error"])
        wait_for("the stale instance removed from ha1",
                 lambda: self.engine_record("ha1", wid) is None, timeout=15)
        self.assertNotIn("resumed", [f[1] for f in self.fence_log("ha1") if f[2] == wid])
        self.assertEqual(self.engine_record(new_node, wid)["state"], "running")
        self.assertEqual((self.rec(wid)["node"], self.rec(wid)["epoch"]), (new_node, "2"))
        self.remove([wid])
        self.clean_audit()

    def test_f_queued_calls_of_a_replaced_instance(self):
        """Exec, logs, realloc, send and copy queued for a frozen node are refused once the
        agent resumes, the workload having been recreated elsewhere meanwhile."""
        wid = self.deploy("qcalls", 1, nodes=("ha3",))[0]
        agent = self.agent("ha3")
        root = os.path.join(self.stack.data_dir, "engine", "ha3", wid, "root")
        resources_before = self.rec(wid)["resources"]
        calls = {
            "exec": lambda: list(self.core.ExecuteWorkload(iter([
                core_pb2.ExecuteWorkloadOptions(workload_id=wid, commands=["/bin/true"])]),
                timeout=90)),
            "logs": lambda: list(self.core.LogStream(core_pb2.LogStreamOptions(
                id=wid, tail="all"), timeout=90)),
            "realloc": lambda: self.core.ReallocResource(core_pb2.ReallocOptions(
                id=wid, resources={"cpumem": b'{"memory-request": "-8M"}'}), timeout=90),
            "send": lambda: list(self.core.Send(core_pb2.SendOptions(
                IDs=[wid], data={"/stale-marker": b"x"}), timeout=90)),
            "copy": lambda: list(self.core.Copy(core_pb2.CopyOptions(targets={
                wid: core_pb2.CopyPaths(paths=["/run.sh"])}), timeout=90)),
        }
        out = {}

        def run(name):
            try:
                out[name] = calls[name]()
            except grpc.RpcError as e:
                out[name] = e
        agent.send_signal(signal.SIGSTOP)
        threads = [threading.Thread(target=run, args=(n,)) for n in calls]
        try:
            # the agent's reader, blocked in Redis when frozen, takes the first operation queued
            # and holds it past its lease: one that is not retried (exec, logs, realloc) would
            # then end "its workers were lost". A ControlWorkload start (retried) goes first.
            with self.assertRaises(grpc.RpcError) as e:
                list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
                    IDs=[wid], type="start"), timeout=2))
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
            for t in threads:
                t.start()
            recs = self.wait_recovered([wid], "ha3")
        finally:
            agent.send_signal(signal.SIGCONT)
        for t in threads:
            t.join(90)
        why = ("workload %s was replaced while node ha3 was away: the registry holds its "
               "incarnation 2 elsewhere, this node's instance is incarnation 1" % wid)
        for name in calls:
            got = out.get(name)
            if isinstance(got, grpc.RpcError):
                # ExecuteWorkload ends with Eru's own code (ERU_EXECUTE_WORKLOAD, outside
                # gRPC's: grpcio says UNKNOWN), the others with FAILED_PRECONDITION
                self.assertIn(got.code(), (grpc.StatusCode.FAILED_PRECONDITION,
                                           grpc.StatusCode.UNKNOWN), (name, got))
                self.assertIn(why, got.details(), name)
            elif name == "realloc":
                self.assertIn(why, got.error, name)
            else:  # per-id answers: Send's and Copy's errors, one per path
                self.assertTrue(got, (name, got))
                for m in got:
                    self.assertIn(why, m.error, (name, m))
        self.assertFalse(os.path.exists(os.path.join(root, "stale-marker")))
        # the refused realloc's accounting is not put back onto the new incarnation's record:
        # it holds what its deploy reserved
        self.assertEqual(json.loads(self.rec(wid)["resources"]), json.loads(resources_before))
        wait_for("the stale instance removed from ha3",
                 lambda: self.engine_record("ha3", wid) is None, timeout=15)
        self.assertEqual(self.engine_record(recs[wid]["node"], wid)["state"], "running")
        self.remove([wid])
        self.clean_audit()


if __name__ == "__main__":
    pvtest.main()
