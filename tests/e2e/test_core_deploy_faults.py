"""Faults during CreateWorkload: the node agent is killed with SIGKILL in the middle of a deploy.

Real processes: redis-server, a gateway, a scheduler, an ops worker and one node agent (process
engine) with a short lease (worker.lease_ms 1500), so the node's operation is redelivered soon
after its agent dies. The agent is started again at once (a new consumer of the node's queue).

What must hold afterwards: the client's one CreateWorkload call still answers every instance,
each exactly once; every instance exists once (in the registry and in the engine's state); the
node's recorded usage is exactly what its workloads hold (GetNodeResource: no diffs), so nothing
was leaked or counted twice; the audit (pivirt-check) reports no difference, with the
workloads and after their removal. Instance ids derive from the reservation's allocation ids and every
step of the node's operation is journaled, which is what makes the redelivery safe.

A plan on one node makes the deploy one operation (wk_deploy.h: handed over to the node's agent,
not a deploy and a node part), so these are also the edges of that hand-over:
  - a cancel while the ops worker plans it (before any lease): it ends CANCELLED at once, the
    hand-over finds it moved and writes nothing, and the reservation made meanwhile goes back;
  - the kill above: the one operation is redelivered to the restarted agent and still creates
    each instance once; no `workload.create_on_node` operation is written;
  - a cancel while the agent runs it: the instances already sent are finished (every one told
    created), the operation ends CANCELLED, the reservation is given back, usage exact;
  - no agent takes it (the agent is dead): a cancel hands it back to the ops workers, which give
    the reservation back; one left alone is handed back the same way after
    worker.node_op_timeout_ms; either ends CANCELLED, its instances told failed, nothing made,
    usage back to zero, and the restarted agent skips the stale entries.
"""
import grpc
import json
import os
import signal
import tarfile
import tempfile
import threading
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc
from pivirt.operations.v1 import operations_pb2 as opb
from pivirt.operations.v1 import operations_pb2_grpc as opg

COUNT = 24


class AgentKilled(unittest.TestCase):
    def setUp(self):
        self.stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[("fa", "fp")],
                                  config={"worker": {"lease_ms": 1500,
                                                     "node_op_timeout_ms": 3000}})
        self.stack.start()
        path = os.path.join(self.stack.data_dir, "images", "slow", "1.tar")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.TemporaryDirectory() as root:
            script = os.path.join(root, "run.sh")
            with open(script, "w") as f:
                f.write("#!/bin/sh\nexec sleep 120\n")
            os.chmod(script, 0o755)
            # A few megabytes, so unpacking takes a moment and the kill lands mid-deploy.
            with open(os.path.join(root, "pad.bin"), "wb") as f:
                f.write(os.urandom(4 << 20))
            with tarfile.open(path, "w") as t:
                t.add(script, arcname="run.sh")
                t.add(os.path.join(root, "pad.bin"), arcname="pad.bin")

    def tearDown(self):
        self.stack.stop(check=False)

    def ops_of(self, kind):
        """{op id: record} of the operations of kind."""
        base = self.stack.prefix + "{ops}:op:"
        out = {}
        for k in self.stack.scan(base + "*"):
            flat = self.stack.redis.cmd("HGETALL", k)
            rec = dict(zip(flat[::2], flat[1::2]))
            if rec.get("kind") == kind:
                out[k[len(base):]] = rec
        return out

    def wait_op(self, op_id, pred, timeout=30):
        key = self.stack.prefix + "{ops}:op:" + op_id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            flat = self.stack.redis.cmd("HGETALL", key)
            rec = dict(zip(flat[::2], flat[1::2]))
            if pred(rec):
                return rec
            time.sleep(0.02)
        self.fail("operation %s: %s" % (op_id, rec))

    def memory_used(self, core):
        res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="fa")), timeout=30)
        self.assertEqual(list(res.diffs), [])
        return json.loads(res.resource_usage)["cpumem"].get("memory", 0)

    def deploy_opts(self, name, count):
        return core_pb2.DeployOptions(
            name=name, entrypoint=core_pb2.EntrypointOptions(name="w",
                                                             commands=["/bin/sh", "run.sh"]),
            podname="fp", image="slow:1", count=count,
            resources={"cpumem": json.dumps({"memory-request": "16M"}).encode()})

    def deploy_until(self, opts, ready, timeout=30):
        """CreateWorkload(opts) on a thread, returned once ready(instances in the engine) or
        after timeout: (its result dict, whose "msgs" it fills, and the thread)."""
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        result = {}

        def deploy():
            result["msgs"] = list(core.CreateWorkload(opts, timeout=120))

        t = threading.Thread(target=deploy)
        t.start()
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready(len(os.listdir(engine) if os.path.isdir(engine) else [])):
                break
            time.sleep(0.005)
        return result, t

    def test_kill_agent_mid_deploy(self):
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        result, t = self.deploy_until(self.deploy_opts("fault", COUNT),
                                      lambda made: 2 <= made < COUNT - 2)
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        agent = self.stack.agents[0]
        agent.kill9()
        killed_at = len(os.listdir(engine))
        agent.start()
        t.join(150)
        self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        self.assertLess(killed_at, COUNT, "the kill came after the deploy ended")
        msgs = result["msgs"]
        self.assertEqual(len(msgs), COUNT, [m.error for m in msgs if not m.success])
        self.assertTrue(all(m.success for m in msgs), [m.error for m in msgs])
        ids = {m.id for m in msgs}
        self.assertEqual(len(ids), COUNT)
        base = self.stack.prefix + "{reg}:"
        for wid in ids:
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 1)
        self.assertEqual(sorted(os.listdir(engine)), sorted(ids))
        res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="fa")), timeout=30)
        self.assertEqual(list(res.diffs), [])
        usage = json.loads(res.resource_usage)["cpumem"]
        self.assertEqual(usage["memory"], COUNT * 16 * 2**20)
        # the audit of the whole state (records, streams, reservations, the engine's processes)
        # finds nothing the kill left behind
        self.assertEqual(self.stack.check(), [])
        # one operation: the deploy went on on the node's agent, no node part of its own
        self.assertEqual(len(self.ops_of("workload.create")), 1)
        self.assertEqual(self.ops_of("workload.create_on_node"), {})
        self.remove_with_kill(core, ids)

    def remove_with_kill(self, core, ids):
        """The agent killed again while it removes them (the ids given twice over, as a client
        retrying inside one call might): the node's part lets the engine go of each, then gives
        all back in one step, then reports each; killed in between, its redelivery finds some
        gone from the engine but still recorded, gives those back too and tells each id once."""
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        result = {}

        def remove():
            result["got"] = list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
                IDs=sorted(ids) + sorted(ids)[:3], force=True), timeout=120))

        t = threading.Thread(target=remove)
        t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and t.is_alive():
            if 2 <= COUNT - len(os.listdir(engine)) < COUNT - 2:
                break
            time.sleep(0.005)
        self.stack.agents[0].kill9()
        left_at = len(os.listdir(engine))
        self.stack.agents[0].start()
        t.join(150)
        self.assertFalse(t.is_alive(), "RemoveWorkload did not end")
        got = result["got"]
        self.assertGreater(left_at, 0, "the kill came after the engine let them all go")
        self.assertEqual(sorted(g.id for g in got), sorted(ids), got)
        self.assertTrue(all(g.success for g in got), [g.hook for g in got if not g.success])
        base = self.stack.prefix + "{reg}:"
        for wid in ids:
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 0)
        self.assertEqual(os.listdir(engine), [])
        res = core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="fa")), timeout=30)
        self.assertEqual(list(res.diffs), [])
        self.assertEqual(json.loads(res.resource_usage).get("cpumem", {}).get("memory", 0), 0)
        self.assertEqual(self.stack.redis.cmd("HLEN", base + "deploy-count:fault:w"), 0)
        self.assertEqual(self.stack.check(), [])

    def cancel_while_running(self, ops, name, seen):
        """A deploy of COUNT cancelled once its agent has started two instances: (its operation
        as it ended, the client's messages). seen: the create operations of earlier trials."""
        # each instance's start waits on its after_start hook: the deploy lasts seconds, past
        # the agent's next lease renewal (where it learns of the cancel)
        opts = self.deploy_opts(name, COUNT)
        opts.entrypoint.hook.after_start.append("sleep 0.2")
        result, t = self.deploy_until(opts, lambda made: made >= 2)
        (op_id, rec), = [(i, r) for i, r in self.ops_of("workload.create").items()
                         if i not in seen]
        self.assertEqual(rec["queue"], "node:fa")  # handed over: running on the agent
        ops.CancelOperation(opb.CancelOperationRequest(id=op_id), timeout=10)
        t.join(150)
        self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        seen.add(op_id)
        done = self.wait_op(op_id, lambda r: r.get("status") not in ("PENDING", "RUNNING"))
        return done, result["msgs"]

    def test_cancel_while_the_agent_runs_it(self):
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        ops = opg.OperationServiceStub(self.stack.channel(0))
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        seen = set()
        for trial in range(3):
            done, msgs = self.cancel_while_running(ops, "cancel%d" % trial, seen)
            if done["status"] != "SUCCEEDED":
                break
            # a cancel is best effort: the agent learns of it at its lease's next renewal, and
            # this one had sent every instance by then (nothing left to stop: the operation
            # SUCCEEDED, rightly); the workloads go and it is tried again
            got = list(core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
                IDs=[m.id for m in msgs if m.success], force=True), timeout=120))
            self.assertTrue(all(g.success for g in got), got)
        self.assertEqual(done["status"], "CANCELLED", done)
        # the instances already sent to the node were finished, each told once
        self.assertEqual(len(msgs), COUNT)
        self.assertTrue(all(m.success for m in msgs), [m.error for m in msgs])
        self.assertEqual(sorted(os.listdir(engine)), sorted(m.id for m in msgs))
        # the reservation is gone and the usage is exactly what the workloads hold
        resvs = self.stack.scan(self.stack.prefix + "{reg}:resv:*")
        self.assertEqual(resvs, [])
        self.assertEqual(self.memory_used(core), COUNT * 16 * 2**20)
        self.assertEqual(self.stack.check(), [])

    def test_cancel_while_it_is_planned(self):
        # The ops worker plans a fresh deploy before any lease (wk_deploy_prelease). The scheduler
        # is stopped (SIGSTOP) so the plan waits; a cancel then ends the PENDING deploy at once,
        # and when the scheduler goes on and reserves, the worker finds the record moved: the
        # hand-over writes nothing and the reservation goes back at once, not at its expiry.
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        ops = opg.OperationServiceStub(self.stack.channel(0))
        sched = self.stack.schedulers[0]
        requests = self.stack.prefix + "{reg}:sched:requests"
        before = self.stack.redis.cmd("XLEN", requests)
        result = {}

        def deploy():
            try:
                result["msgs"] = list(core.CreateWorkload(self.deploy_opts("planned", 2),
                                                          timeout=60))
            except grpc.RpcError as e:
                result["error"] = e.code()

        sched.send_signal(signal.SIGSTOP)
        try:
            t = threading.Thread(target=deploy)
            t.start()
            deadline = time.monotonic() + 20
            while (time.monotonic() < deadline and
                   self.stack.redis.cmd("XLEN", requests) == before):
                time.sleep(0.01)
            (op_id, rec), = self.ops_of("workload.create").items()
            self.assertEqual((rec["status"], rec["queue"]), ("PENDING", "ops"), rec)
            ops.CancelOperation(opb.CancelOperationRequest(id=op_id), timeout=10)
            self.assertEqual(self.wait_op(op_id, lambda r: True)["status"], "CANCELLED")
        finally:
            sched.send_signal(signal.SIGCONT)
        t.join(60)
        self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        self.assertFalse(any(m.success for m in result.get("msgs", [])), result)
        resv = self.stack.prefix + "{reg}:resv:resv-" + op_id
        made = self.stack.prefix + "{reg}:resv-made:resv-" + op_id
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
                self.stack.redis.cmd("EXISTS", made) and
                not self.stack.redis.cmd("EXISTS", resv)):
            time.sleep(0.02)
        self.assertEqual(self.stack.redis.cmd("EXISTS", made), 1)  # it was reserved, then
        self.assertEqual(self.stack.redis.cmd("EXISTS", resv), 0)  # given back
        done = self.wait_op(op_id, lambda r: True)
        self.assertEqual((done["status"], done["queue"]), ("CANCELLED", "ops"), done)
        self.assertEqual(self.memory_used(core), 0)
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        self.assertEqual(os.listdir(engine) if os.path.isdir(engine) else [], [])
        self.assertEqual(self.stack.check(), [])

    def test_reservation_of_an_ended_operation_goes_back(self):
        # An operation that ends without giving its reservation back (a one-node create
        # dead-lettered on its node's queue) leaves it to the schedulers: a minute after the
        # end, their sweep (every 5 s) gives it back instead of its expiry (600 s). Here its
        # owner has no record at all and it was made two minutes ago (created_ms moved back).
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        redis = self.stack.redis
        rid = "plan-op-GONE%d" % os.getpid()
        body = json.dumps({"pod": "fp", "strategy": 0, "count": 2, "app": "gone",
                           "entrypoint": "w", "owner": rid[len("plan-"):], "ttl_seconds": 600,
                           "resources": {"cpumem": {"memory-request": "16M"}}})
        redis.cmd("XADD", self.stack.prefix + "{reg}:sched:requests", "*", "id", rid,
                  "kind", "reserve", "body", body,
                  "deadline_ms", str(int(time.time() * 1000) + 30000))
        reply = redis.cmd("BLPOP", self.stack.prefix + "{reg}:sched:reply:" + rid, "30")
        self.assertTrue(reply and "reservation" in reply[1], reply)
        resv = self.stack.prefix + "{reg}:resv:resv-op-GONE%d" % os.getpid()
        self.assertEqual(self.memory_used(core), 2 * 16 << 20)
        redis.cmd("HSET", resv, "created_ms", str(int(time.time() * 1000) - 120000))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and redis.cmd("EXISTS", resv):
            time.sleep(0.1)
        self.assertEqual(redis.cmd("EXISTS", resv), 0)
        self.assertEqual(self.memory_used(core), 0)
        self.assertEqual(self.stack.check(), [])

    def test_no_agent_takes_it(self):
        core = core_pb2_grpc.CoreRPCStub(self.stack.channel(0))
        ops = opg.OperationServiceStub(self.stack.channel(0))
        agent = self.stack.agents[0]
        agent.kill9()  # its node still looks alive for a few seconds: plans still pick it
        results = {}

        def deploy(name):
            results[name] = list(core.CreateWorkload(self.deploy_opts(name, 3), timeout=60))

        threads = [threading.Thread(target=deploy, args=(n,)) for n in ("cancelled", "timed")]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            waiting = {i: r for i, r in self.ops_of("workload.create").items()
                       if r.get("queue") == "node:fa" and r.get("status") == "PENDING"}
            if len(waiting) == 2:
                break
            time.sleep(0.02)
        self.assertEqual(len(waiting), 2, self.ops_of("workload.create"))
        by_name = {}
        for i, r in waiting.items():
            by_name["cancelled" if "cancelled" in self.stack.redis.cmd(
                "HGET", self.stack.prefix + "{reg}:resv:resv-" + i, "app") else "timed"] = i
        self.assertEqual(sorted(by_name), ["cancelled", "timed"])
        ops.CancelOperation(opb.CancelOperationRequest(id=by_name["cancelled"]), timeout=10)
        for name in ("cancelled", "timed"):
            done = self.wait_op(by_name[name],
                                lambda r: r.get("status") not in ("PENDING", "RUNNING"))
            self.assertEqual(done["status"], "CANCELLED", done)
            self.assertEqual(done["queue"], "ops", done)  # handed back and undone there
        # the cancel acts at once; the other waited out worker.node_op_timeout_ms (3 s)
        for t in threads:
            t.join(60)
            self.assertFalse(t.is_alive(), "CreateWorkload did not end")
        for name in ("cancelled", "timed"):
            msgs = results[name]
            self.assertEqual(len(msgs), 3, msgs)
            self.assertFalse(any(m.success for m in msgs), msgs)
        self.assertEqual(self.stack.scan(self.stack.prefix + "{reg}:resv:*"), [])
        agent.start()  # the stale entries on its queue are skipped, nothing is made
        self.stack.wait_ready([agent])
        self.assertEqual(self.memory_used(core), 0)
        engine = os.path.join(self.stack.data_dir, "engine", "fa")
        self.assertEqual(os.listdir(engine) if os.path.isdir(engine) else [], [])
        self.assertEqual(self.stack.check(), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
