"""End-to-end tests of pivirt.operations.v1.OperationService.

Real processes only: a redis-server, pivirt-gateway and (where the operation has to run)
pivirt-worker, driven by Debian's python3-grpcio with stubs generated from proto/ (build/py).
Test operations (test.sleep, test.fail) are enabled by the harness's config (test_operations).

Classes:
  Pending      gateways only: nothing ever runs, so every state change comes from the API
               itself (validation, NOT_FOUND, ABORTED, idempotency, cancel of a PENDING
               operation, WaitOperation timeouts, 200 waiting calls, shutdown).
  Running      with workers: operations really run (Wait, Watch, Cancel of a running one,
               max_attempts, List ordering and filters).
  Disabled     test_operations false: FAILED_PRECONDITION.
  RedisOutage  Redis killed and restarted under a gateway with waiting calls.
"""
import itertools
import os
import signal
import threading
import time
import unittest
from concurrent import futures

import grpc

import pvtest
from pivirt.operations.v1 import operations_pb2 as opb
from pivirt.operations.v1 import operations_pb2_grpc as opg

PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED = 1, 2, 3, 4, 5
STATUS_NAMES = {0: "UNSPECIFIED", 1: "PENDING", 2: "RUNNING", 3: "SUCCEEDED", 4: "FAILED",
                5: "CANCELLED"}
# Sanitizer builds are slow; none of these bounds is tight for a release build.
SLACK = float(os.environ.get("PV_TIME_SLACK", "1.0"))

_counter = itertools.count(1)


def uniq(prefix):
    """A plain name never used before in this run (targets, request ids)."""
    return "%s-%d-%d-%d" % (prefix, os.getpid(), int(time.time() * 1000) % 100000, next(_counter))


def stub(ch):
    return opg.OperationServiceStub(ch)


def create(s, kind="test.sleep", target=None, params=None, max_attempts=0, rid=None, timeout=10):
    md = [("x-request-id", rid)] if rid else None
    req = opb.CreateTestOperationRequest(kind=kind, target=uniq("t") if target is None else target,
                                         params=params or {}, max_attempts=max_attempts)
    return s.CreateTestOperation(req, metadata=md, timeout=timeout)


def rpc_error(fn, *args, **kwargs):
    """Calls fn; returns the grpc.RpcError it raised (fails the test when it did not)."""
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e
    raise AssertionError("%s did not fail" % getattr(fn, "__name__", fn))


def subscribers(stack, op_id):
    """How many connections are subscribed to the operation's channel (the waiters')."""
    reply = stack.redis.cmd("PUBSUB", "NUMSUB", stack.key("{ops}:chan:" + op_id))
    return int(reply[1])


def eventually(fn, seconds=3.0):
    """fn() once it is true, polled every 50 ms; its last value when time ran out."""
    deadline = time.monotonic() + seconds
    while True:
        value = fn()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


def thread_count(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no Threads line for pid %d" % pid)


# ---------------------------------------------------------------------------------------------

class Pending(unittest.TestCase):
    """No worker: operations stay PENDING unless the API itself ends them."""

    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=2)
        cls.stack.start()
        cls.s = stub(cls.stack.channel(0))
        cls.s2 = stub(cls.stack.channel(1))

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def test_get_unknown_is_not_found_naming_the_id(self):
        e = rpc_error(self.s.GetOperation, opb.GetOperationRequest(id="op-doesnotexist"), timeout=5)
        self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("op-doesnotexist", e.details())

    def test_empty_or_malformed_id_is_invalid_argument(self):
        for name, call, req in [
                ("GetOperation", self.s.GetOperation, opb.GetOperationRequest(id="")),
                ("CancelOperation", self.s.CancelOperation, opb.CancelOperationRequest(id="")),
                ("WaitOperation", self.s.WaitOperation, opb.WaitOperationRequest(id="")),
                ("GetOperation", self.s.GetOperation, opb.GetOperationRequest(id="../x"))]:
            e = rpc_error(call, req, timeout=5)
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, name)
            self.assertIn("id", e.details(), name)
        e = rpc_error(lambda: list(self.s.WatchOperation(opb.WatchOperationRequest(id=""),
                                                         timeout=5)))
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("id", e.details())

    def test_create_returns_pending_record(self):
        t0 = time.time()
        target = uniq("node")
        op = create(self.s, target=target, params={"ms": "10"}, max_attempts=3)
        self.assertRegex(op.id, r"^op-")
        self.assertEqual(op.kind, "test.sleep")
        self.assertEqual(op.target, target)
        self.assertEqual(op.status, PENDING)
        self.assertFalse(op.done)
        self.assertEqual(op.max_attempts, 3)
        self.assertEqual(op.attempts, 0)
        self.assertEqual(dict(op.metadata), {"ms": "10"})
        self.assertFalse(op.HasField("error"))
        self.assertFalse(op.HasField("started_at"))
        self.assertFalse(op.HasField("finished_at"))
        self.assertAlmostEqual(op.created_at.ToMilliseconds() / 1000.0, t0, delta=5)
        got = self.s.GetOperation(opb.GetOperationRequest(id=op.id), timeout=5)
        self.assertEqual(got.id, op.id)
        self.assertEqual(got.status, PENDING)
        self.assertEqual(got.created_at, op.created_at)
        # The other gateway sees the same record: the state lives in Redis.
        self.assertEqual(self.s2.GetOperation(opb.GetOperationRequest(id=op.id), timeout=5).id,
                         op.id)
        self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)

    def test_create_validates_its_fields(self):
        cases = [
            (dict(kind="node.drain"), "kind"),
            (dict(kind=""), "kind"),
            (dict(kind="test."), "kind"),
            (dict(target=""), "target"),
            (dict(target="a/b"), "target"),
            (dict(target=".."), "target"),
            (dict(max_attempts=-1), "max_attempts"),
            (dict(params={"ms": "soon"}), "params.ms"),
        ]
        for kwargs, field in cases:
            kwargs.setdefault("target", uniq("v"))
            e = rpc_error(create, self.s, **kwargs)
            self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT, kwargs)
            self.assertIn(field, e.details(), kwargs)

    def test_same_request_id_returns_the_same_operation(self):
        rid = uniq("rid")
        a = create(self.s, target=uniq("idem"), rid=rid)
        # Different body, same request id: still the first operation, whatever its state.
        b = create(self.s, target=uniq("idem"), rid=rid)
        self.assertEqual(a.id, b.id)
        self.assertEqual(b.request_id, rid)
        self.s.CancelOperation(opb.CancelOperationRequest(id=a.id), timeout=5)
        c = create(self.s2, target=uniq("idem"), rid=rid)
        self.assertEqual(c.id, a.id)
        self.assertEqual(c.status, CANCELLED)

    def test_same_request_id_across_two_gateways_at_once_is_one_operation(self):
        rid = uniq("race")
        target = uniq("race-target")
        ids, errors = [], []
        barrier = threading.Barrier(16)

        def one(i):
            barrier.wait()
            try:
                ids.append(create(self.s if i % 2 else self.s2, target=target, rid=rid).id)
            except grpc.RpcError as e:
                errors.append((e.code(), e.details()))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(ids), 16)
        self.assertEqual(len(set(ids)), 1, ids)
        listed = list(self.s.ListOperations(opb.ListOperationsRequest(target=target), timeout=5))
        self.assertEqual([o.id for o in listed], [ids[0]])
        self.s.CancelOperation(opb.CancelOperationRequest(id=ids[0]), timeout=5)

    def test_second_operation_on_a_held_target_is_aborted_naming_the_holder(self):
        target = uniq("held")
        first = create(self.s, target=target)
        e = rpc_error(create, self.s2, target=target)
        self.assertEqual(e.code(), grpc.StatusCode.ABORTED)
        self.assertIn(first.id, e.details())
        self.assertIn(target, e.details())
        # Once the holder is done the target is free again.
        self.s.CancelOperation(opb.CancelOperationRequest(id=first.id), timeout=5)
        second = create(self.s2, target=target)
        self.assertNotEqual(second.id, first.id)
        self.s.CancelOperation(opb.CancelOperationRequest(id=second.id), timeout=5)

    def test_list_limit_default_and_maximum(self):
        made = []
        for _ in range(105):
            made.append(create(self.s).id)
            time.sleep(0.002)  # distinct created ms: ties would list in id order
        default = list(self.s.ListOperations(opb.ListOperationsRequest(), timeout=10))
        self.assertEqual(len(default), 100)
        # Newest first: the last 100 made are the first 100 listed, in reverse.
        self.assertEqual([o.id for o in default], made[::-1][:100])
        capped = list(self.s.ListOperations(opb.ListOperationsRequest(limit=1000000), timeout=10))
        self.assertGreaterEqual(len(capped), 105)
        self.assertLessEqual(len(capped), 1000)
        three = list(self.s.ListOperations(opb.ListOperationsRequest(limit=3), timeout=5))
        self.assertEqual([o.id for o in three], made[::-1][:3])
        for op_id in made:
            self.s.CancelOperation(opb.CancelOperationRequest(id=op_id), timeout=5)
        cancelled = list(self.s.ListOperations(
            opb.ListOperationsRequest(status=CANCELLED, limit=1000), timeout=10))
        self.assertTrue(set(made) <= {o.id for o in cancelled})
        self.assertTrue(all(o.status == CANCELLED for o in cancelled))

    def test_cancel_pending_ends_cancelled_at_once(self):
        op = create(self.s)
        got = self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        self.assertEqual(got.status, CANCELLED)
        self.assertTrue(got.done)
        self.assertTrue(got.cancel_requested)
        self.assertEqual(got.error.code, 1)
        self.assertTrue(got.HasField("finished_at"))
        # Cancelling again is not an error and changes nothing.
        again = self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        self.assertEqual(again.status, CANCELLED)
        self.assertEqual(again.finished_at, got.finished_at)

    def test_cancel_unknown_is_not_found(self):
        e = rpc_error(self.s.CancelOperation, opb.CancelOperationRequest(id="op-nosuchone"),
                      timeout=5)
        self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("op-nosuchone", e.details())

    def test_wait_times_out_with_current_state(self):
        op = create(self.s)
        t0 = time.monotonic()
        got = self.s.WaitOperation(opb.WaitOperationRequest(id=op.id, timeout_seconds=1),
                                   timeout=10)
        elapsed = time.monotonic() - t0
        self.assertFalse(got.done)
        self.assertEqual(got.status, PENDING)
        self.assertGreaterEqual(elapsed, 0.95)
        self.assertLess(elapsed, 1.0 + SLACK)
        self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)

    def test_wait_without_timeout_answers_before_the_deadline(self):
        op = create(self.s)
        t0 = time.monotonic()
        got = self.s.WaitOperation(opb.WaitOperationRequest(id=op.id), timeout=1.5)
        elapsed = time.monotonic() - t0
        self.assertEqual(got.id, op.id)
        self.assertFalse(got.done)
        self.assertGreater(elapsed, 1.0)
        self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)

    def test_wait_negative_timeout_is_invalid_argument(self):
        e = rpc_error(self.s.WaitOperation, opb.WaitOperationRequest(id="op-x", timeout_seconds=-1),
                      timeout=5)
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("timeout_seconds", e.details())

    def test_wait_unknown_is_not_found(self):
        e = rpc_error(self.s.WaitOperation, opb.WaitOperationRequest(id="op-nope", timeout_seconds=5),
                      timeout=5)
        self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("op-nope", e.details())

    def test_wait_is_woken_by_a_cancel_through_the_other_gateway(self):
        op = create(self.s)
        fut = self.s.WaitOperation.future(opb.WaitOperationRequest(id=op.id, timeout_seconds=30),
                                          timeout=40)
        time.sleep(0.5)
        self.assertFalse(fut.done())
        t0 = time.monotonic()
        self.s2.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        got = fut.result(timeout=10)
        self.assertLess(time.monotonic() - t0, 0.5 * SLACK + 0.5)
        self.assertTrue(got.done)
        self.assertEqual(got.status, CANCELLED)
        self.assertEqual(got.error.code, 1)

    def test_watch_sends_current_state_then_the_end(self):
        op = create(self.s)
        stream = self.s.WatchOperation(opb.WatchOperationRequest(id=op.id), timeout=20)
        first = next(stream)
        self.assertEqual((first.id, first.status, first.done), (op.id, PENDING, False))
        self.s2.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        rest = list(stream)  # ends by itself after the done message
        self.assertTrue(rest)
        self.assertTrue(rest[-1].done)
        self.assertEqual(rest[-1].status, CANCELLED)
        self.assertTrue(all(not m.done for m in rest[:-1]))
        # Watching a finished operation sends that one state and ends.
        again = list(self.s.WatchOperation(opb.WatchOperationRequest(id=op.id), timeout=5))
        self.assertEqual([(m.status, m.done) for m in again], [(CANCELLED, True)])

    def test_client_that_goes_away_is_dropped(self):
        op = create(self.s)
        futs = [self.s.WaitOperation.future(opb.WaitOperationRequest(id=op.id), timeout=30)
                for _ in range(20)]
        time.sleep(0.3)
        for f in futs:
            f.cancel()
        for f in futs:
            self.assertTrue(f.cancelled())
        # Subscribed while someone waits, unsubscribed once nobody does.
        self.assertTrue(eventually(lambda: subscribers(self.stack, op.id) == 0),
                        "still subscribed after every waiter left")
        # The gateway still answers waits on the same operation after its watchers left.
        fut = self.s.WaitOperation.future(opb.WaitOperationRequest(id=op.id, timeout_seconds=20),
                                          timeout=30)
        time.sleep(0.3)
        self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        self.assertEqual(fut.result(timeout=10).status, CANCELLED)

    def test_200_waiting_calls_complete_with_bounded_threads(self):
        gw_pid = self.stack.gateways[0].proc.pid
        before = thread_count(gw_pid)
        ops = [create(self.s) for _ in range(50)]
        futs = [self.s.WaitOperation.future(
            opb.WaitOperationRequest(id=ops[i % len(ops)].id, timeout_seconds=60), timeout=90)
            for i in range(200)]
        time.sleep(1.0)
        during = thread_count(gw_pid)
        # One subscription per operation however many calls wait on it.
        self.assertTrue(eventually(lambda: [subscribers(self.stack, op.id) for op in ops] ==
                                   [1] * len(ops)), "not one subscription per operation")
        self.assertFalse(any(f.done() for f in futs))
        # Waiting calls hold no thread: the gateway's pool (gateway.threads) does not grow.
        self.assertLessEqual(during, before + 2, "threads while 200 calls wait: %d (before: %d)" %
                             (during, before))
        t0 = time.monotonic()
        for op in ops:
            self.s2.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        results = [f.result(timeout=30) for f in futs]
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(len(results), 200)
        for i, r in enumerate(results):
            self.assertEqual(r.id, ops[i % len(ops)].id)
            self.assertEqual(r.status, CANCELLED)
            self.assertTrue(r.done)
        self.assertTrue(eventually(lambda: all(subscribers(self.stack, op.id) == 0
                                               for op in ops)), "subscriptions left behind")


class Running(unittest.TestCase):
    """Two gateways, two workers: operations really run."""

    @classmethod
    def setUpClass(cls):
        cls.stack = pvtest.Stack(gateways=2, workers=2)
        cls.stack.start()
        cls.s = stub(cls.stack.channel(0))
        cls.s2 = stub(cls.stack.channel(1))

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def wait(self, op_id, seconds=30):
        return self.s.WaitOperation(opb.WaitOperationRequest(id=op_id, timeout_seconds=seconds),
                                    timeout=seconds + 10)

    def test_sleep_succeeds_and_wait_returns_it(self):
        op = create(self.s, params={"ms": "300", "steps": "3"})
        t0 = time.monotonic()
        got = self.wait(op.id)
        self.assertTrue(got.done, got)
        self.assertEqual(got.status, SUCCEEDED, got)
        self.assertEqual(got.progress_percent, 100)
        self.assertFalse(got.HasField("error"))
        self.assertEqual(got.attempts, 1)
        self.assertTrue(got.worker)
        self.assertTrue(got.HasField("started_at"))
        self.assertTrue(got.HasField("finished_at"))
        self.assertLessEqual(got.created_at.ToMilliseconds(), got.started_at.ToMilliseconds())
        self.assertLessEqual(got.started_at.ToMilliseconds(), got.finished_at.ToMilliseconds())
        self.assertGreaterEqual(got.finished_at.ToMilliseconds() - got.started_at.ToMilliseconds(),
                                300)
        self.assertGreaterEqual(time.monotonic() - t0, 0.25)
        # The other gateway reads the same final record.
        again = self.s2.GetOperation(opb.GetOperationRequest(id=op.id), timeout=5)
        self.assertEqual((again.status, again.progress_percent), (SUCCEEDED, 100))

    def test_wait_with_timeout_on_a_long_operation(self):
        op = create(self.s, params={"ms": "5000", "steps": "5"})
        t0 = time.monotonic()
        got = self.s.WaitOperation(opb.WaitOperationRequest(id=op.id, timeout_seconds=1),
                                   timeout=10)
        elapsed = time.monotonic() - t0
        self.assertFalse(got.done)
        self.assertIn(got.status, (PENDING, RUNNING))
        self.assertGreaterEqual(elapsed, 0.95)
        self.assertLess(elapsed, 1.0 + SLACK)
        self.s.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)

    def test_watch_sees_every_stage_in_order(self):
        op = create(self.s, params={"ms": "1600", "steps": "4"})
        seen = list(self.s.WatchOperation(opb.WatchOperationRequest(id=op.id), timeout=30))
        statuses = [m.status for m in seen]
        progress = [m.progress_percent for m in seen]
        trace = [(STATUS_NAMES[m.status], m.progress_percent, m.message) for m in seen]
        self.assertEqual(statuses[0] in (PENDING, RUNNING), True, trace)
        self.assertIn(RUNNING, statuses, trace)
        self.assertEqual(statuses[-1], SUCCEEDED, trace)
        self.assertTrue(seen[-1].done)
        self.assertTrue(all(not m.done for m in seen[:-1]), trace)
        self.assertEqual(statuses, sorted(statuses), trace)
        self.assertEqual(progress, sorted(progress), trace)
        self.assertTrue(any(0 < p < 100 for p in progress), trace)
        self.assertEqual(progress[-1], 100)
        # No message repeats the one before it: every message is a change.
        for a, b in zip(seen, seen[1:]):
            self.assertNotEqual(a.SerializeToString(deterministic=True),
                                b.SerializeToString(deterministic=True), trace)

    def test_cancel_running_ends_cancelled_within_a_second(self):
        op = create(self.s, params={"ms": "20000", "steps": "200"})
        deadline = time.monotonic() + 15
        while True:
            cur = self.s.GetOperation(opb.GetOperationRequest(id=op.id), timeout=5)
            if cur.status == RUNNING:
                break
            self.assertLess(time.monotonic(), deadline, "never RUNNING: %s" % cur)
            time.sleep(0.05)
        t0 = time.monotonic()
        got = self.s2.CancelOperation(opb.CancelOperationRequest(id=op.id), timeout=5)
        self.assertTrue(got.cancel_requested)
        self.assertIn(got.status, (RUNNING, CANCELLED))
        done = self.wait(op.id, 10)
        elapsed = time.monotonic() - t0
        self.assertEqual(done.status, CANCELLED, done)
        self.assertTrue(done.done)
        self.assertEqual(done.error.code, 1)
        self.assertLess(elapsed, 1.0 + 0.5 * SLACK, "cancel took %.2fs" % elapsed)

    def test_failing_operation_ends_failed_after_max_attempts(self):
        op = create(self.s, kind="test.fail", max_attempts=2)
        got = self.wait(op.id, 60)
        self.assertEqual(got.status, FAILED, got)
        self.assertTrue(got.done)
        self.assertEqual(got.attempts, 2)
        self.assertEqual(got.max_attempts, 2)
        self.assertNotEqual(got.error.code, 0)
        self.assertTrue(got.error.message)

    def test_list_filters_and_newest_first(self):
        tag = uniq("list")
        made = []
        for i in range(3):
            made.append(create(self.s, target="%s-%d" % (tag, i), params={"ms": "0"}))
            time.sleep(0.01)
        for op in made:
            self.assertEqual(self.wait(op.id).status, SUCCEEDED)
        failed = create(self.s, kind="test.fail", target=tag + "-f", max_attempts=1)
        self.assertEqual(self.wait(failed.id).status, FAILED)

        one = list(self.s.ListOperations(opb.ListOperationsRequest(target=made[1].target),
                                         timeout=5))
        self.assertEqual([o.id for o in one], [made[1].id])

        every = list(self.s.ListOperations(opb.ListOperationsRequest(limit=1000), timeout=10))
        ids = [o.id for o in every]
        for op in made + [failed]:
            self.assertIn(op.id, ids)
        pos = [ids.index(op.id) for op in [failed] + made[::-1]]
        self.assertEqual(pos, sorted(pos), "not newest first")
        created = [o.created_at.ToMilliseconds() for o in every]
        self.assertEqual(created, sorted(created, reverse=True))

        fails = list(self.s.ListOperations(opb.ListOperationsRequest(status=FAILED, limit=1000),
                                           timeout=5))
        self.assertIn(failed.id, [o.id for o in fails])
        self.assertTrue(all(o.status == FAILED for o in fails))
        sleeps = list(self.s.ListOperations(opb.ListOperationsRequest(kind="test.sleep",
                                                                      limit=2), timeout=5))
        self.assertEqual(len(sleeps), 2)
        self.assertTrue(all(o.kind == "test.sleep" for o in sleeps))
        both = list(self.s.ListOperations(
            opb.ListOperationsRequest(kind="test.fail", target=failed.target), timeout=5))
        self.assertEqual([o.id for o in both], [failed.id])
        none = list(self.s.ListOperations(
            opb.ListOperationsRequest(kind="test.sleep", target=failed.target), timeout=5))
        self.assertEqual(none, [])

    def test_list_rejects_bad_filters(self):
        e = rpc_error(lambda: list(self.s.ListOperations(opb.ListOperationsRequest(limit=-1),
                                                         timeout=5)))
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("limit", e.details())
        e = rpc_error(lambda: list(self.s.ListOperations(opb.ListOperationsRequest(status=42),
                                                         timeout=5)))
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("status", e.details())
        e = rpc_error(lambda: list(self.s.ListOperations(
            opb.ListOperationsRequest(target="a/b"), timeout=5)))
        self.assertEqual(e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("target", e.details())

    def test_many_waits_on_running_operations(self):
        ops = [create(self.s, params={"ms": "200", "steps": "2"}) for _ in range(20)]
        futs = [(self.s if i % 2 else self.s2).WaitOperation.future(
            opb.WaitOperationRequest(id=ops[i % 20].id, timeout_seconds=60), timeout=90)
            for i in range(100)]
        for i, f in enumerate(futs):
            got = f.result(timeout=90)
            self.assertEqual((got.id, got.status, got.progress_percent),
                             (ops[i % 20].id, SUCCEEDED, 100))


class Disabled(unittest.TestCase):
    def test_create_is_failed_precondition_when_test_operations_are_off(self):
        with pvtest.Stack(gateways=1, config={"test_operations": False}) as st:
            s = stub(st.channel(0))
            e = rpc_error(create, s)
            self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("test_operations", e.details())
            e = rpc_error(s.GetOperation, opb.GetOperationRequest(id="op-none"), timeout=5)
            self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)


class Shutdown(unittest.TestCase):
    def test_sigterm_ends_waiting_calls_with_unavailable_and_exits_zero(self):
        stack = pvtest.Stack(gateways=1)
        stack.start()
        try:
            s = stub(stack.channel(0))
            op = create(s)
            wait = s.WaitOperation.future(opb.WaitOperationRequest(id=op.id), timeout=60)
            watch = s.WatchOperation(opb.WatchOperationRequest(id=op.id), timeout=60)
            self.assertEqual(next(watch).status, PENDING)
            time.sleep(0.3)
            gw = stack.gateways[0]
            t0 = time.monotonic()
            gw.proc.send_signal(signal.SIGTERM)
            e = wait.exception(timeout=15)
            self.assertIsNotNone(e)
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("shutting down", e.details())
            e = rpc_error(lambda: list(watch))
            self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("shutting down", e.details())
            # Ended at the start of the shutdown, not by the grace period's cancellation.
            self.assertLess(time.monotonic() - t0, 2)
            self.assertEqual(gw.proc.wait(timeout=15), 0)
        finally:
            stack.stop()


    def test_sigterm_while_redis_is_down(self):
        stack = pvtest.Stack(gateways=1)
        stack.start()
        try:
            s = stub(stack.channel(0))
            op = create(s)
            waits = [s.WaitOperation.future(opb.WaitOperationRequest(id=op.id), timeout=60)
                     for _ in range(5)]
            time.sleep(0.3)
            stack.redis.kill9()
            time.sleep(0.5)  # the waiter has noticed and is trying to reconnect
            gw = stack.gateways[0]
            gw.proc.send_signal(signal.SIGTERM)
            for w in waits:
                e = w.exception(timeout=15)
                self.assertIsNotNone(e)
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertEqual(gw.proc.wait(timeout=15), 0)
            stack.redis.restart()
        finally:
            stack.stop()


class RedisOutage(unittest.TestCase):
    def test_calls_fail_fast_while_redis_is_down_and_work_after_restart(self):
        stack = pvtest.Stack(gateways=1, workers=1)
        stack.redis.appendfsync = "always"
        stack.start()
        try:
            s = stub(stack.channel(0))
            # A waiting call whose operation finishes only after Redis came back.
            long_op = create(s, params={"ms": "4000", "steps": "4"})
            waiting = s.WaitOperation.future(
                opb.WaitOperationRequest(id=long_op.id, timeout_seconds=60), timeout=70)
            time.sleep(0.5)
            stack.redis.kill9()
            for name, fn in [
                    ("GetOperation", lambda: s.GetOperation(
                        opb.GetOperationRequest(id=long_op.id), timeout=10)),
                    ("CreateTestOperation", lambda: create(s)),
                    ("WaitOperation", lambda: s.WaitOperation(
                        opb.WaitOperationRequest(id=long_op.id, timeout_seconds=5), timeout=10)),
                    ("ListOperations", lambda: list(s.ListOperations(
                        opb.ListOperationsRequest(), timeout=10))),
                    ("CancelOperation", lambda: s.CancelOperation(
                        opb.CancelOperationRequest(id=long_op.id), timeout=10))]:
                t0 = time.monotonic()
                e = rpc_error(fn)
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE, name)
                self.assertLess(time.monotonic() - t0, 1.5, name)
            self.assertFalse(waiting.done())
            stack.redis.restart()
            # Working again: a fresh operation runs and its wait is woken.
            deadline = time.monotonic() + 15
            while True:
                try:
                    op = create(s, params={"ms": "100"})
                    break
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
                    self.assertLess(time.monotonic(), deadline, "gateway never recovered")
                    time.sleep(0.2)
            got = s.WaitOperation(opb.WaitOperationRequest(id=op.id, timeout_seconds=30),
                                  timeout=40)
            self.assertEqual(got.status, SUCCEEDED, got)
            # The call that waited through the outage is answered once its operation ends.
            old = waiting.result(timeout=70)
            self.assertEqual(old.id, long_op.id)
            self.assertTrue(old.done, old)
            self.assertEqual(old.status, SUCCEEDED, old)
        finally:
            stack.stop()


if __name__ == "__main__":
    pvtest.main()
