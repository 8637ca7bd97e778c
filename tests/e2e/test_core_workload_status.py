"""End-to-end tests of pb.CoreRPC's workload statuses: SetWorkloadsStatus, GetWorkloadsStatus and
WorkloadStatusStream.

Real processes only: a redis-server and pivirt-gateways, driven by Debian's python3-grpcio with
stubs generated from proto/ (build/py). Eru's per-call codes (1055, 1056) are read at the HTTP/2
level (pvtest.grpc_trailers) because grpcio hangs on codes that are not canonical.

Workload records cannot be created through gRPC yet (CreateWorkload is a later issue), so the
tests seed them with the Redis function that pv_workload_add calls, FCALL pv_wl_add, through
the harness's Redis client (stack.redis.cmd); removals likewise call pv_wl_remove. Everything
else, SetNode workloads_down included, goes through the gateways.

Classes:
  SetGet        statuses stored with their TTL (0 = none), answered with app/node/entrypoint from
                the record; networks and binary extension round-trip; expiry ends a status.
  Errors        unknown workload -> 1056 naming it and nothing written (all or nothing); bad
                ids and negative TTLs -> 1056; no live status -> 1055 naming the id.
  Stream        streams on both gateways with every filter (app, entrypoint, node, labels) see
                each change of the workloads they match: set (with the record as pb.Workload),
                deletion when the workload is removed (record gone: still sent, filtered by
                whose it was), expiry, a node's workloads marked down, and {id, error} for a
                status whose record cannot be read.
  Reconnect     changes made while the follower's connection is down are reported after it
                subscribes again.
  Lifecycle     the follower starts with the first stream (one more pattern subscription on that
                gateway only); gateway shutdown ends the stream with UNAVAILABLE and exit 0.
"""
import itertools
import os
import threading
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc

SLACK = float(os.environ.get("PV_TIME_SLACK", "1.0"))
_counter = itertools.count(1)
_stack = None


def uniq(prefix):
    return "%s-%d-%d" % (prefix, os.getpid(), next(_counter))


def wait_for(pred, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=2)
    _stack.start()


def tearDownModule():
    _stack.stop()


def base(stack):
    return stack.prefix + "{reg}:"


def seed(stack, node, app="app", entry="web", labels="{}", env='["A=1"]',
         publish='{"net":["10.0.0.1:80","10.0.0.1:81"]}'):
    """A workload record on NODE (pod from the node), as pv_workload_add writes it. Its id."""
    wid = os.urandom(32).hex()
    stack.redis.cmd("FCALL", "pv_wl_add", 1, base(stack) + "nodes", base(stack), wid,
                    "%s_%s_qwerty" % (app, entry), app, entry, "", node, "img:1", "0", labels, env,
                    publish, '{"cpumem":{"memory":1024}}', "", "4242")
    return wid


def remove(stack, wid):
    stack.redis.cmd("FCALL", "pv_wl_remove", 0, base(stack), wid)


def status(wid, running=True, healthy=True, ttl=0, **kw):
    return core_pb2.WorkloadStatus(id=wid, running=running, healthy=healthy, ttl=ttl, **kw)


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))
        cls.core2 = core_pb2_grpc.CoreRPCStub(cls.stack.channel(1))
        cls.addr = cls.stack.gateways[0].addrs[0]

    def pod_nodes(self, n=2):
        pod = uniq("pod")
        self.core.AddPod(core_pb2.AddPodOptions(name=pod), timeout=10)
        names = []
        for i in range(n):
            name = "%s-n%d" % (pod, i)
            self.core.AddNode(core_pb2.AddNodeOptions(
                nodename=name, endpoint="process://", podname=pod,
                resources={"cpumem": b'{"cpu": 4, "memory": "8G"}'}), timeout=10)
            names.append(name)
        return pod, names

    def set(self, *statuses, core=None):
        return (core or self.core).SetWorkloadsStatus(
            core_pb2.SetWorkloadsStatusOptions(status=list(statuses)), timeout=10)

    def eru(self, method, msg):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/" + method, msg.SerializeToString())
        return int(t.get("grpc-status", "-1")), t.get("grpc-message", "")

    def status_key(self, wid):
        return base(self.stack) + "wl-status:" + wid


class SetGet(Base):
    def test_set_then_get(self):
        pod, (n0, n1) = self.pod_nodes()
        a = seed(self.stack, n0, app="api", entry="web")
        b = seed(self.stack, n1, app="api", entry="cron")
        got = self.set(status(a, True, False, ttl=30, networks={"calico": "10.1.0.5"},
                              extension=b"\x00\x01\xffext"),
                       status(b, False, True, ttl=0))
        self.assertEqual([s.id for s in got.status], [a, b])
        s = got.status[0]
        self.assertEqual((s.running, s.healthy, s.ttl), (True, False, 30))
        self.assertEqual((s.appname, s.entrypoint, s.nodename), ("api", "web", n0))
        self.assertEqual(dict(s.networks), {"calico": "10.1.0.5"})
        self.assertEqual(s.extension, b"\x00\x01\xffext")
        self.assertEqual((got.status[1].entrypoint, got.status[1].nodename), ("cron", n1))

        # The TTL is the key's in Redis; 0 means none.
        ttl = self.stack.redis.cmd("TTL", self.status_key(a))
        self.assertTrue(25 < ttl <= 30, ttl)
        self.assertEqual(self.stack.redis.cmd("TTL", self.status_key(b)), -1)

        # Either gateway reads them back, in the order asked.
        got = self.core2.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[b, a]), timeout=10)
        self.assertEqual([s.id for s in got.status], [b, a])
        self.assertEqual((got.status[0].running, got.status[0].healthy), (False, True))
        self.assertEqual(got.status[1].extension, b"\x00\x01\xffext")
        self.assertEqual(dict(got.status[1].networks), {"calico": "10.1.0.5"})
        self.assertEqual(got.status[1].appname, "api")

        # Set again without a TTL: the expiry is gone; an empty call is an empty answer.
        self.set(status(a, ttl=0))
        self.assertEqual(self.stack.redis.cmd("TTL", self.status_key(a)), -1)
        self.assertEqual(len(self.set().status), 0)
        self.assertEqual(len(self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(), timeout=10).status), 0)

    def test_expiry(self):
        pod, (n0, _) = self.pod_nodes()
        a = seed(self.stack, n0)
        self.set(status(a, ttl=1))
        self.assertEqual(len(self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[a]),
                                                          timeout=10).status), 1)

        # (Waited for in Redis: nghttp's output of a successful answer is binary.)
        self.assertTrue(wait_for(lambda: self.stack.redis.cmd("EXISTS", self.status_key(a)) == 0,
                                 4 * SLACK))
        code, msg = self.eru("GetWorkloadsStatus", core_pb2.WorkloadIDs(IDs=[a]))
        self.assertEqual((code, msg), (1055, "status of workload %s not found" % a))


class Errors(Base):
    def test_set_unknown_workload_writes_nothing(self):
        pod, (n0, _) = self.pod_nodes()
        a = seed(self.stack, n0)
        ghost = os.urandom(32).hex()
        code, msg = self.eru("SetWorkloadsStatus", core_pb2.SetWorkloadsStatusOptions(
            status=[status(a), status(ghost)]))
        self.assertEqual((code, msg), (1056, "workload %s not found" % ghost))
        self.assertEqual(self.stack.redis.cmd("EXISTS", self.status_key(a)), 0)

    def test_set_bad_entries(self):
        pod, (n0, _) = self.pod_nodes()
        a = seed(self.stack, n0)
        code, msg = self.eru("SetWorkloadsStatus", core_pb2.SetWorkloadsStatusOptions(
            status=[status(a, ttl=-5)]))
        self.assertEqual(code, 1056)
        self.assertIn("ttl: -5", msg)
        self.assertIn(a, msg)
        code, msg = self.eru("SetWorkloadsStatus", core_pb2.SetWorkloadsStatusOptions(
            status=[status(a), status("x/../y")]))
        self.assertEqual(code, 1056)
        self.assertIn('status[1].id: "x/../y"', msg)
        code, msg = self.eru("SetWorkloadsStatus", core_pb2.SetWorkloadsStatusOptions(
            status=[status("")]))
        self.assertEqual((code, msg), (1056, "status[0].id: field is required"))
        self.assertEqual(self.stack.redis.cmd("EXISTS", self.status_key(a)), 0)
        # A request that is not a SetWorkloadsStatusOptions answers the call's code too.
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/SetWorkloadsStatus", b"\xff\xff")
        self.assertEqual(t.get("grpc-status"), "1056")

    def test_get_without_status(self):
        pod, (n0, _) = self.pod_nodes()
        a, b = seed(self.stack, n0), seed(self.stack, n0)
        self.set(status(a))
        code, msg = self.eru("GetWorkloadsStatus", core_pb2.WorkloadIDs(IDs=[a, b]))
        self.assertEqual((code, msg), (1055, "status of workload %s not found" % b))
        code, msg = self.eru("GetWorkloadsStatus", core_pb2.WorkloadIDs(IDs=["nope"]))
        self.assertEqual((code, msg), (1055, "status of workload nope not found"))


class Watch:
    """One WorkloadStatusStream read by a thread: seen() is every message so far."""

    def __init__(self, test, core, **opts):
        self.stream = core.WorkloadStatusStream(core_pb2.WorkloadStatusStreamOptions(**opts),
                                                timeout=120)
        test.addCleanup(self.stream.cancel)  # also when an assertion fails
        self.got, self.lock, self.code = [], threading.Lock(), None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for m in self.stream:
                with self.lock:
                    self.got.append(m)
        except grpc.RpcError as e:
            self.code = e.code()

    def seen(self, ids=None):
        with self.lock:
            return [m for m in self.got if ids is None or m.id in ids]

    def events(self, ids):
        """(id, kind) per message about IDS: kind is 'set', 'delete' or 'error'."""
        out = []
        for m in self.seen(ids):
            kind = "delete" if m.delete else "error" if m.error else "set"
            out.append((m.id, kind))
        return out


class Stream(Base):
    def test_filters_and_every_kind_of_change(self):
        pod, (n0, n1) = self.pod_nodes()
        app_a, app_b = uniq("appa"), uniq("appb")
        w1 = seed(self.stack, n0, app=app_a, entry="web", labels='{"tier":"front"}')
        w2 = seed(self.stack, n1, app=app_a, entry="cron", labels='{"tier":"db"}')
        w3 = seed(self.stack, n0, app=app_b, entry="web", labels='{"tier":"db","zone":"x"}')
        ids = {w1, w2, w3}
        every = Watch(self, self.core)
        by_app = Watch(self, self.core2, appname=app_a)
        narrow = Watch(self, self.core, appname=app_a, entrypoint="web", nodename=n0)
        by_labels = Watch(self, self.core2, labels={"tier": "db"})
        by_node = Watch(self, self.core2, nodename=n1)
        time.sleep(1.0)  # the streams are registered and their followers have read by then

        self.set(status(w1, True, True, networks={"net": "10.0.0.7"}, extension=b"x"),
                 status(w2, True, False, ttl=3), status(w3, False, False))
        # A notification carries no value: a set is read when its notification arrives, so
        # the removal waits until w3's set has been streamed (else only its deletion is).
        self.assertTrue(wait_for(lambda: (w3, "set") in every.events(ids), 5 * SLACK))
        remove(self.stack, w3)  # the record goes with its status: still reported, filtered
        # w2 expires three seconds after it was set (long enough for a loaded follower to read
        # it first: a status that expires before its set is read is seen only as a deletion).
        want = {
            every: [(w1, "set"), (w2, "set"), (w3, "set"), (w3, "delete"), (w2, "delete")],
            by_app: [(w1, "set"), (w2, "set"), (w2, "delete")],
            narrow: [(w1, "set")],
            by_labels: [(w2, "set"), (w3, "set"), (w3, "delete"), (w2, "delete")],
            by_node: [(w2, "set"), (w2, "delete")],
        }
        for w, evs in want.items():
            self.assertTrue(wait_for(lambda: len(w.events(ids)) >= len(evs), 8 * SLACK),
                            (w.events(ids), evs))
        time.sleep(0.3)  # nothing more arrives
        for w, evs in want.items():
            self.assertEqual(sorted(w.events(ids)), sorted(evs))
            got = w.events(ids)
            for wid in ids:  # per workload, in the order of the changes
                self.assertEqual([e for e in got if e[0] == wid], [e for e in evs if e[0] == wid])

        # A set carries the status and the record as pb.Workload.
        m = next(m for m in every.seen({w1}) if not m.delete)
        self.assertEqual((m.status.id, m.status.running, m.status.healthy), (w1, True, True))
        self.assertEqual((m.status.appname, m.status.entrypoint, m.status.nodename),
                         (app_a, "web", n0))
        self.assertEqual(dict(m.status.networks), {"net": "10.0.0.7"})
        self.assertEqual(m.status.extension, b"x")
        wl = m.workload
        self.assertEqual((wl.id, wl.podname, wl.nodename, wl.name, wl.image),
                         (w1, pod, n0, app_a + "_web_qwerty", "img:1"))
        self.assertEqual(dict(wl.labels), {"tier": "front"})
        self.assertEqual(dict(wl.publish), {"net": "10.0.0.1:80,10.0.0.1:81"})
        self.assertEqual(list(wl.env), ["A=1"])
        self.assertEqual(wl.resources, '{"cpumem":{"memory":1024}}')
        self.assertTrue(abs(wl.create_time - time.time()) < 60, wl.create_time)
        self.assertEqual(wl.status.id, w1)
        # Deleted with its record: the id and the flag; expired: the record is still there.
        d3 = next(m for m in every.seen({w3}) if m.delete)
        self.assertFalse(d3.HasField("workload"))
        self.assertFalse(d3.HasField("status"))
        d2 = next(m for m in every.seen({w2}) if m.delete)
        self.assertEqual(d2.workload.id, w2)

        # SetNode workloads_down marks every workload of the node not running, not healthy.
        self.core.SetNode(core_pb2.SetNodeOptions(nodename=n0, workloads_down=True), timeout=10)
        self.assertTrue(wait_for(lambda: len(narrow.events(ids)) >= 2, 5 * SLACK),
                        narrow.events(ids))
        m = narrow.seen(ids)[-1]
        self.assertEqual((m.id, m.status.running, m.status.healthy, m.delete),
                         (w1, False, False, False))
        self.assertEqual(dict(m.status.networks), {"net": "10.0.0.7"})

    def test_unreadable_record_is_an_error(self):
        pod, (n0, _) = self.pod_nodes()
        every = Watch(self, self.core)
        by_app = Watch(self, self.core2, appname=uniq("app"))
        time.sleep(1.0)
        ghost = os.urandom(32).hex()
        # A status nobody could have set through the API: its record does not exist.
        self.stack.redis.cmd("SET", self.status_key(ghost), '{"running":true,"healthy":true}')
        for w in (every, by_app):  # an error whose owner is unknown reaches every stream
            self.assertTrue(wait_for(lambda: w.events({ghost}) == [(ghost, "error")], 5 * SLACK),
                            w.events({ghost}))
        self.assertEqual(every.seen({ghost})[0].error, "workload %s not found" % ghost)
        # Its deletion matches no filter: only unfiltered streams get it.
        self.stack.redis.cmd("DEL", self.status_key(ghost))
        self.assertTrue(wait_for(lambda: len(every.events({ghost})) == 2, 5 * SLACK))
        self.assertEqual(every.events({ghost}), [(ghost, "error"), (ghost, "delete")])
        time.sleep(0.3)
        self.assertEqual(by_app.events({ghost}), [(ghost, "error")])


class Reconnect(Base):
    def test_changes_while_disconnected_are_reported(self):
        pod, (n0, _) = self.pod_nodes()
        a, b = seed(self.stack, n0), seed(self.stack, n0)
        w = Watch(self, self.core)
        time.sleep(1.0)
        self.set(status(a), status(b))
        self.assertTrue(wait_for(lambda: len(w.events({a, b})) == 2, 5 * SLACK))
        redis = self.stack.redis
        # Every follower's connection drops; they reconnect after half a second. The changes
        # made in between are only seen by their read after subscribing again.
        redis.cmd("CLIENT", "KILL", "TYPE", "pubsub")
        redis.cmd("FCALL", "pv_wl_set_status", 0, base(self.stack), 1, a,
                  '{"running":false,"healthy":false,"networks":{},"extension":"","ttl":0}', 0)
        redis.cmd("DEL", self.status_key(b))
        self.assertTrue(wait_for(lambda: len(w.events({a, b})) >= 4, 8 * SLACK), w.events({a, b}))
        time.sleep(0.3)
        self.assertEqual(w.events({a, b})[2:], [(a, "set"), (b, "delete")]
                         if w.events({a, b})[2][0] == a else [(b, "delete"), (a, "set")])
        m = [m for m in w.seen({a}) if not m.delete][-1]
        self.assertEqual((m.status.running, m.status.healthy), (False, False))


class Lifecycle(unittest.TestCase):
    def test_follower_starts_with_first_stream_and_shutdown_ends_it(self):
        stack = pvtest.Stack(gateways=1)
        stack.start()
        try:
            core = core_pb2_grpc.CoreRPCStub(stack.channel(0))

            def psubs():
                clients = stack.redis.cmd("CLIENT", "LIST", "TYPE", "pubsub").splitlines()
                return sum(1 for c in clients if " psub=1 " in c + " ")

            # NodeStatusStream's follower only, until a workload stream asks.
            self.assertTrue(wait_for(lambda: psubs() == 1, 5 * SLACK), psubs())
            core.AddPod(core_pb2.AddPodOptions(name="p"), timeout=10)
            core.AddNode(core_pb2.AddNodeOptions(
                nodename="n", endpoint="process://", podname="p",
                resources={"cpumem": b'{"cpu": 1, "memory": "1G"}'}), timeout=10)
            wid = seed(stack, "n")
            w = Watch(self, core)
            self.assertTrue(wait_for(lambda: psubs() == 2, 5 * SLACK), psubs())
            core.SetWorkloadsStatus(core_pb2.SetWorkloadsStatusOptions(status=[status(wid)]),
                                    timeout=10)
            self.assertTrue(wait_for(lambda: w.events({wid}) == [(wid, "set")], 5 * SLACK))
            # A second stream reuses the same follower.
            Watch(self, core, appname="app")
            time.sleep(0.5)
            self.assertEqual(psubs(), 2)

            self.assertEqual(stack.gateways[0].stop(), 0)
            w.thread.join(10)
            self.assertEqual(w.code, grpc.StatusCode.UNAVAILABLE)
        finally:
            stack.stop()


if __name__ == "__main__":
    pvtest.main()
