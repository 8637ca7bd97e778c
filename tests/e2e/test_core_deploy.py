"""End-to-end tests of pb.CoreRPC's CreateWorkload on the process engine.

Real processes only: redis-server, two pivirt-gateways, two pivirt-schedulers, two ops workers and two
node agents (pivirt-worker --set worker.node=N, pod "dp") whose process engines run the
workloads, driven by Debian's python3-grpcio. The image is a tar archive the test writes into the
agents' image store (<data_dir>/images/demo/1.tar). Eru's per-call code 1074 is read at the
HTTP/2 level (pvtest.grpc_trailers).

Classes:
  Deploy   three instances spread over two nodes: one message each with a 64-hex id, Eru's
           name (app_entry_xxxxxx), the node and pod; each instance ran with APP_NAME, ERU_POD,
           ERU_NODE_NAME, ERU_WORKLOAD_SEQ in its environment (it writes them to its log in the
           engine's state, <data_dir>/engine/<node>/<id>/log); the
           workload records exist with their allocations and read back through GetWorkload,
           GetWorkloads, ListWorkloads (app, limit) and ListNodeWorkloads; the nodes' usage is
           exactly what the workloads hold (GetNodeResource: no diffs). A one-instance create
           (MONITOR): the last instance's record ends the reservation (no pv_sched_release) and
           the gateway ends the call without reading the operation's record; the ops worker
           planned it and handed it to the node's agent without a lease of its own.
  Remove   RemoveWorkload stops running instances (their processes end), removes them from the
           engine and the registry, and gives their resources back (usage as before, no diffs,
           deploy count back to zero); an unknown id answers 1076 before anything stops.
           ControlWorkload suspends (state T), resumes, stops, starts (a new process), restarts,
           the workload status following; an unknown type answers 1078. LogStream gives the
           workload's lines (tail N, all, follow until the client leaves, which cancels the
           node's operation); since/until answer 10711 (the process logs have no timestamps).
           DissociateWorkload forgets a workload and frees its resources, its process running on;
           an unknown id beside it fails the call (1077) and lets nothing go.
           Send writes files (mode 0755 unless given) into each workload's root, refusing ".."
           and symbolic links on the way; SendLargeFile takes a file in chunks; Copy returns a
           tar archive of a path in 4 KiB chunks. ReallocResource lowers a running workload's
           memory in place (its process's RLIMIT_AS), the node's usage following; raising needs
           CAP_SYS_RESOURCE without cgroup v2 (applied, or refused saying so, nothing changed);
           a change that does not fit or goes negative is refused and changes nothing.
           ReplaceWorkload replaces every workload of an app's entrypoint by a new one that
           keeps its resources (usage unchanged) and gets the copied files (mode kept); a
           replacement that fails leaves the old workload running. DeployOptions data/modes are
           written before start, after_create runs in the started workload (a failing one fails
           the instance), raw_args, dns and extra_hosts are refused on the process engine.
  Lambda   RunAndWait (bidi): the workload IDs first, then each one's output, then
           "[exitcode] N"; the workloads are removed at the end; a bad deploy fails the call;
           async: the IDs only, the call ends at once, the workloads removed when they end.
  Execute  ExecuteWorkload runs a command in a running workload (extra env, workdir) and ends
           with "[exitcode] N"; with open_stdin the later messages are its input.
  Images   ListImage per node (ids are the archives' SHA-256, filter is a glob), CacheImage from
           the registry directory, RemoveImage with prune; failures per image. BuildImage RAW
           (on the build pod's most idle node, every tag, pushed to the registry) and EXIST (a
           workload's tree as it is) and SCM (git.scm_type set: stages cloned from a local repository at
           a tag, built with commands, artifacts carried to the next stage), then deploys from
           the built images; bad SCM requests and failing steps answer 1071 naming the cause.
  Race     deploys raced from both gateways at once never overcommit: exactly the pod's capacity
           for the request is created, every other deploy answers one message, success false,
           "need: 1, available: 0" (status OK, as Eru's), and afterwards nothing more fits.
  Failures a missing image: every instance answers success=false naming the image and the
           reserved resources go back; count 0, an entrypoint with '_': code 1074 with Eru's
           words; not enough resource: one message, success false, "need: N", status OK.
"""
import grpc
import itertools
import json
import socket
import subprocess
import os
import queue
import select
import tarfile
import tempfile
import time
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc

_stack = None
_counter = itertools.count(1)
NODES = ("dpa", "dpb")


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=2, workers=2, schedulers=2,
                          agents=[(n, "dp") for n in NODES],
                          config={"worker": {"build_pod": "dp", "status_interval_seconds": 1},
                                  "git": {"scm_type": "git"}})
    _stack.start()
    make_image(os.path.join(_stack.data_dir, "images", "demo", "1.tar"))


def tearDownModule():
    _stack.stop()


def make_image(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        script = os.path.join(root, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\necho \"started $APP_NAME $ERU_POD $ERU_NODE_NAME "
                    "$ERU_WORKLOAD_SEQ\"\nsleep 2\n")
        os.chmod(script, 0o755)
        with tarfile.open(path, "w") as t:
            t.add(script, arcname="run.sh")


def deploy(count=3, image="demo:1", entry="web", memory="64M", name=None,
           commands=("/bin/sh", "run.sh")):
    return core_pb2.DeployOptions(
        name=name or "demo%d" % next(_counter),
        entrypoint=core_pb2.EntrypointOptions(name=entry, commands=list(commands)),
        podname="dp", image=image, count=count,
        resources={"cpumem": json.dumps({"memory-request": memory}).encode()})


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))
        cls.addr = cls.stack.gateways[0].addrs[0]

    def usage(self, node):
        r = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=node)), timeout=10)
        return r

    def eru(self, msg):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/CreateWorkload",
                                 msg.SerializeToString())
        return int(t.get("grpc-status", "-1")), t.get("grpc-message", "")


class Deploy(Base):
    def test_three_instances_over_two_nodes(self):
        opts = deploy(3)
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertEqual(len(msgs), 3, msgs)
        for m in msgs:
            self.assertTrue(m.success, m.error)
            self.assertEqual(len(m.id), 64)
            self.assertRegex(m.name, r"^%s_web_[a-z]{6}$" % opts.name)
            self.assertIn(m.nodename, NODES)
            self.assertEqual(m.podname, "dp")
            self.assertIn("cpumem", json.loads(m.resources))
        self.assertEqual(len({m.id for m in msgs}), 3)
        self.assertEqual(len({m.nodename for m in msgs}), 2)  # AUTO spreads them
        # The deploy announced each node's part with its instances and the plan's nodes: what
        # lets the gateway answer once every instance was told, before the operations end.
        ops = self.stack.prefix + "{ops}:"
        creates = [(int(self.stack.redis.cmd("HGET", k, "created_ms")), k[len(ops + "op:"):])
                   for k in self.stack.scan(ops + "op:*")
                   if self.stack.redis.cmd("HGET", k, "kind") == "workload.create"]
        newest = max(creates)[1]  # this test's deploy: the last one made
        announced = {}
        for _, flat in self.stack.redis.cmd("XRANGE", ops + "out:" + newest, "-", "+"):
            f = dict(zip(flat[::2], flat[1::2]))
            if f.get("type") == "node":
                self.assertEqual(f.get("nodes"), "2", f)
                announced[f["node"]] = int(f["instances"])
        self.assertEqual(sorted(announced), sorted({m.nodename for m in msgs}))
        self.assertEqual(sum(announced.values()), 3)
        base = self.stack.prefix + "{reg}:"
        for m in msgs:
            rec = self.stack.redis.cmd("HGET", base + "wl:" + m.id, "name")
            self.assertEqual(rec, m.name)
        # The reads: GetWorkload, GetWorkloads, ListWorkloads, ListNodeWorkloads.
        w = self.core.GetWorkload(core_pb2.WorkloadID(id=msgs[0].id), timeout=10)
        self.assertEqual((w.id, w.name, w.podname, w.nodename, w.image),
                         (msgs[0].id, msgs[0].name, "dp", msgs[0].nodename, "demo:1"))
        self.assertEqual(w.labels["ERU"], "1")
        self.assertEqual(w.labels["eru.nodename"], msgs[0].nodename)
        self.assertIn("APP_NAME=%s" % opts.name, list(w.env))
        self.assertIn("cpumem", json.loads(w.resources))
        got = self.core.GetWorkloads(core_pb2.WorkloadIDs(IDs=[m.id for m in msgs]), timeout=10)
        self.assertEqual(sorted(x.id for x in got.workloads), sorted(m.id for m in msgs))
        listed = list(self.core.ListWorkloads(core_pb2.ListWorkloadsOptions(appname=opts.name),
                                              timeout=10))
        self.assertEqual(sorted(x.id for x in listed), sorted(m.id for m in msgs))
        limited = list(self.core.ListWorkloads(core_pb2.ListWorkloadsOptions(
            appname=opts.name, limit=2), timeout=10))
        self.assertEqual(len(limited), 2)
        on_node = self.core.ListNodeWorkloads(core_pb2.GetNodeOptions(
            nodename=msgs[0].nodename), timeout=10)
        self.assertIn(msgs[0].id, [x.id for x in on_node.workloads])
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/GetWorkload",
                                 core_pb2.WorkloadID(id="e" * 64).SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1051")
        self.assertIn("not found", t.get("grpc-message", ""))
        # Each instance ran with Eru's environment (its log under the node's engine state).
        seqs = set()
        deadline = time.monotonic() + 10
        for m in msgs:
            log = self.find_log(m.nodename, m.id)
            text = ""
            while time.monotonic() < deadline:
                text = open(log).read() if log and os.path.exists(log) else ""
                if "started" in text:
                    break
                time.sleep(0.1)
            line = next((l for l in text.splitlines() if l.startswith("started ")), "")
            words = line.split()
            self.assertEqual(words[:4], ["started", opts.name, "dp", m.nodename], text)
            seqs.add(words[4])
        self.assertEqual(seqs, {"0", "1", "2"})
        # The nodes' usage is what their workloads hold: no diffs, memory counted.
        for node in NODES:
            r = self.usage(node)
            self.assertEqual(list(r.diffs), [])
        total = sum(json.loads(self.usage(n).resource_usage)["cpumem"]["memory"] for n in NODES)
        self.assertGreaterEqual(total, 3 * 64 * 2**20)

    def test_one_node_create_ends_with_few_reads(self):
        # A create planned on one node is one operation that its node's agent ends: the last
        # instance's record ends the reservation in the same call (no release, no read of the
        # reservation), and the gateway, told every instance by the output it waited on, ends
        # the call without reading the operation's record (MONITOR sees all of Redis's calls).
        mon = subprocess.Popen([pvtest.REDIS_CLI, "-p", str(self.stack.redis.port)] +
                               self.stack.redis.cli_auth_args() + ["MONITOR"],
                               stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(mon.stdout.readline().strip(), "OK")
            msgs = list(self.core.CreateWorkload(deploy(1), timeout=60))
            self.assertEqual(len(msgs), 1, msgs)
            self.assertTrue(msgs[0].success, msgs[0].error)
            ops = self.stack.prefix + "{ops}:"
            # the call is over, so is everything its gateway did: what MONITOR wrote until
            # half a second after the operation's end holds all of it
            op_id, lines, ended = None, [], None
            deadline = time.monotonic() + 10
            while time.monotonic() < min(deadline, ended or deadline):
                if not select.select([mon.stdout], [], [], 0.1)[0]:
                    continue
                line = mon.stdout.readline()
                lines.append(line)
                if op_id is None and '"pv_op_submit"' in line and "workload.create" in line:
                    op_id = line.split('"' + ops + "op:")[1].split('"')[0]
                if op_id and ended is None and '"pv_op_finish' in line and op_id in line:
                    ended = time.monotonic() + 0.5
        finally:
            mon.terminate()
            mon.wait()
        self.assertIsNotNone(op_id, "no submit of the create seen")
        self.assertIsNotNone(ended, "the operation's end not seen")
        resv = "resv-" + op_id
        self.assertEqual([l for l in lines if resv in l and '"pv_sched_release"' in l], [])
        self.assertTrue(any(resv in l and '"DEL"' in l for l in lines), "reservation kept")
        record = '"%sop:%s"' % (ops, op_id)
        end = next(i for i, l in enumerate(lines) if '"pv_op_finish' in l and op_id in l)
        self.assertEqual([l for l in lines[end:] if "lua]" not in l and
                          '"HGETALL" ' + record in l], [])
        # The ops worker planned it without a lease and handed it over from PENDING: the only
        # lease is the agent's.
        self.assertEqual(len([l for l in lines if '"pv_op_acquire"' in l and record in l]), 1)
        self.assertEqual(len([l for l in lines if '"pv_op_handover_pending"' in l and
                              record in l]), 1)
        base = self.stack.prefix + "{reg}:"
        self.assertEqual(self.stack.redis.cmd("EXISTS", base + "resv:" + resv), 0)
        self.assertIsNone(self.stack.redis.cmd("ZSCORE", base + "resvs", resv))
        self.assertEqual(self.stack.redis.cmd("HGET", ops + "op:" + op_id, "status"), "SUCCEEDED")

    def find_log(self, node, wid):
        return os.path.join(self.stack.data_dir, "engine", node, wid, "log")


class Lambda(Base):
    def test_run_and_wait(self):
        base = self.stack.prefix + "{reg}:"
        opts = deploy(2, commands=("/bin/true",))
        # cmd replaces the entrypoint's command, split on blanks as Eru does (no shell quoting).
        req = core_pb2.RunAndWaitOptions(deploy_options=opts, cmd=b"/bin/sh run.sh")
        msgs = list(self.core.RunAndWait(iter([req]), timeout=60))
        ids = [m.workload_id for m in msgs if m.std_stream_type == core_pb2.TYPEWORKLOADID]
        self.assertEqual(len(ids), 2, msgs)
        for wid in ids:
            own = [m.data.decode() for m in msgs
                   if m.workload_id == wid and m.std_stream_type == core_pb2.STDOUT]
            self.assertTrue(own[0].startswith("started %s dp" % opts.name), own)
            self.assertEqual(own[-1], "[exitcode] 0")
            # RunAndWait removes its workloads at the end.
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 0)
        # The IDs come first.
        self.assertEqual([m.std_stream_type for m in msgs[:2]], [core_pb2.TYPEWORKLOADID] * 2)

    def test_run_and_wait_async_detaches(self):
        base = self.stack.prefix + "{reg}:"
        req = core_pb2.RunAndWaitOptions(deploy_options=deploy(1), cmd=b"/bin/sh run.sh",
                                         async_timeout=30)
        setattr(req, "async", True)
        t0 = time.monotonic()
        msgs = list(self.core.RunAndWait(iter([req]), timeout=60))
        self.assertLess(time.monotonic() - t0, 2.0)  # run.sh sleeps 2 s: the call did not wait
        self.assertEqual([m.std_stream_type for m in msgs], [core_pb2.TYPEWORKLOADID])
        wid = msgs[0].workload_id
        # The gateway follows it to the end, then removes it, as always.
        deadline = time.monotonic() + 30
        while self.stack.redis.cmd("EXISTS", base + "wl:" + wid) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 0)

    def test_run_and_wait_exit_code_and_errors(self):
        req = core_pb2.RunAndWaitOptions(deploy_options=deploy(1), cmd=b"/bin/false")
        msgs = list(self.core.RunAndWait(iter([req]), timeout=60))
        self.assertEqual(msgs[-1].data.decode(), "[exitcode] 1")
        req = core_pb2.RunAndWaitOptions(deploy_options=deploy(0), cmd=b"/bin/true")
        try:
            list(self.core.RunAndWait(iter([req]), timeout=30))
            self.fail("count 0 accepted")
        except Exception as e:  # noqa: BLE001 - 10712 is not a canonical code for grpcio
            self.assertIn("count is 0", str(e))


class Execute(Base):
    def test_execute_workload(self):
        msgs = list(self.core.CreateWorkload(deploy(1, commands=("/bin/sh", "-c", "sleep 30")),
                                             timeout=60))
        wid = msgs[0].id
        req = core_pb2.ExecuteWorkloadOptions(
            workload_id=wid, commands=["/bin/sh", "-c", "pwd; echo $GREETING $APP_NAME; exit 4"],
            envs=["GREETING=hello"], workdir="/")
        got = list(self.core.ExecuteWorkload(iter([req]), timeout=60))
        out = b"".join(m.data for m in got[:-1]).decode()
        self.assertIn("hello %s" % msgs[0].name.split("_")[0], out)
        self.assertEqual(got[-1].data.decode(), "[exitcode] 4")
        self.assertTrue(all(m.workload_id == wid for m in got))
        # open_stdin: the later messages' repl_cmd is the command's input, and its end the
        # half-close
        reqs = [core_pb2.ExecuteWorkloadOptions(workload_id=wid, commands=["/bin/sh", "-c",
                                                                           "wc -l; cat"],
                                                open_stdin=True),
                core_pb2.ExecuteWorkloadOptions(repl_cmd=b"one\n"),
                core_pb2.ExecuteWorkloadOptions(repl_cmd=b"two\n")]
        got = list(self.core.ExecuteWorkload(iter(reqs), timeout=60))
        out = b"".join(m.data for m in got[:-1]).decode()
        self.assertEqual(out.split(), ["2"])  # wc read both lines; cat had nothing left
        self.assertEqual(got[-1].data.decode(), "[exitcode] 0")
        # ... and it is interactive: each answer comes back before the next question is sent
        answers = queue.Queue()

        def questions():
            yield core_pb2.ExecuteWorkloadOptions(
                workload_id=wid, open_stdin=True, commands=[
                    "/bin/sh", "-c", "while read q; do echo \"answer to $q\"; done; exit 3"])
            for q in ("one", "two", "three"):
                yield core_pb2.ExecuteWorkloadOptions(repl_cmd=(q + "\n").encode())
                seen = b""
                while b"answer to " + q.encode() not in seen:
                    seen += answers.get(timeout=20)

        stream = self.core.ExecuteWorkload(questions(), timeout=60)
        out = b""
        for m in stream:
            out += m.data
            answers.put(m.data)
        self.assertEqual(out.decode(), "answer to one\nanswer to two\nanswer to three\n"
                                       "[exitcode] 3")
        # a client that leaves ends the command (its process group), not just the call
        stream = self.core.ExecuteWorkload(iter([core_pb2.ExecuteWorkloadOptions(
            workload_id=wid, open_stdin=True,
            commands=["/bin/sh", "-c", "echo started; exec sleep 317"])] + [None] * 0),
            timeout=60)
        first = next(stream)
        self.assertEqual(first.data, b"started\n")
        stream.cancel()
        deadline = time.monotonic() + 15
        def sleeping():
            # a duration no other test runs: the tests beside this one have their own sleeps
            return subprocess.run(["pgrep", "-f", "^sleep 317$"],
                                  capture_output=True).returncode == 0
        while sleeping() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertFalse(sleeping())
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                      timeout=60))


class Images(Base):
    def test_list_cache_remove(self):
        listed = list(self.core.ListImage(core_pb2.ListImageOptions(podname="dp"), timeout=60))
        self.assertEqual(sorted(m.nodename for m in listed), sorted(NODES))
        for m in listed:
            self.assertEqual(m.err, "")
            demo = [i for i in m.images if "demo:1" in i.tags]
            self.assertEqual(len(demo), 1, m)
            self.assertEqual(len(demo[0].id), 64)
        # CacheImage copies from the registry directory into the node's store.
        make_image(os.path.join(self.stack.data_dir, "registry", "cached", "app", "2.tar"))
        got = list(self.core.CacheImage(core_pb2.CacheImageOptions(
            podname="dp", nodenames=[NODES[0]], images=["cached/app:2", "nope:1"]), timeout=60))
        self.assertEqual([(m.image, m.success, m.nodename) for m in got],
                         [("cached/app:2", True, NODES[0]), ("nope:1", False, NODES[0])])
        self.assertIn("nope", got[1].message)
        listed = list(self.core.ListImage(core_pb2.ListImageOptions(
            podname="dp", nodenames=[NODES[0]], filter="cached/*"), timeout=60))
        self.assertEqual([list(i.tags) for i in listed[0].images], [["cached/app:2"]])
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname="dp", nodenames=[NODES[0]], images=["cached/app:2"], prune=True), timeout=60))
        self.assertEqual([(m.image, m.success) for m in got], [("cached/app:2", True)])
        self.assertFalse(os.path.exists(os.path.join(self.stack.data_dir, "images", "cached")))
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname="dp", nodenames=[NODES[0]], images=["cached/app:2"]), timeout=60))
        self.assertFalse(got[0].success)

    def test_build_raw_and_exist_then_deploy(self):
        make_image(os.path.join(self.stack.data_dir, "tmp-raw.tar"))
        raw = open(os.path.join(self.stack.data_dir, "tmp-raw.tar"), "rb").read()
        got = list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name="built/app", tags=["v1", "v2"], build_method=core_pb2.BuildImageOptions.RAW,
            tar=raw), timeout=60))
        self.assertEqual([m.progress for m in got], ["built/app:v1", "built/app:v2"])
        self.assertTrue(all(len(m.id) == 64 and m.status == "finished" for m in got))
        self.assertTrue(os.path.exists(os.path.join(self.stack.data_dir, "registry", "built",
                                                    "app", "v1.tar")))
        # the tar went to the node in an upload of its own, gone once the build was done,
        # and not into the operation's record (kept for ops.retention_seconds)
        self.assertEqual(self.stack.scan(self.stack.key("{ops}:upload:*")), [])
        ops = self.stack.scan(self.stack.key("{ops}:op:*"))
        builds = [json.loads(self.stack.redis.cmd("HGET", k, "params")) for k in ops
                  if self.stack.redis.cmd("HGET", k, "kind") == "image.build_on_node"]
        raws = [b for b in builds if "upload" in b or "tar" in b]
        self.assertEqual(len(raws), 1, builds)
        self.assertNotIn("tar", raws[0])
        self.assertTrue(raws[0]["upload"].startswith("up-"), raws[0])
        msgs = list(self.core.CreateWorkload(deploy(1, image="built/app:v2"), timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        # EXIST: the workload's tree as it is now, a file sent into it included.
        list(self.core.Send(core_pb2.SendOptions(IDs=[msgs[0].id], data={"/marker": b"m"}),
                            timeout=60))
        got = list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name="snap/app", build_method=core_pb2.BuildImageOptions.EXIST,
            exist_id=msgs[0].id), timeout=60))
        self.assertEqual([m.progress for m in got], ["snap/app:latest"])
        with tarfile.open(os.path.join(self.stack.data_dir, "registry", "snap", "app",
                                       "latest.tar")) as t:
            self.assertEqual(t.extractfile("marker").read(), b"m")
            self.assertIn("run.sh", t.getnames())
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/BuildImage", core_pb2.BuildImageOptions(
            name="x", build_method=core_pb2.BuildImageOptions.SCM).SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1071")
        self.assertIn("builds.stages: an SCM build needs at least one stage",
                      t.get("grpc-message", ""))

    def make_repo(self):
        """A git repository with tag v1 (app.sh prints its build's files) and a later commit."""
        repo = tempfile.mkdtemp(prefix="pv-scm-", dir=self.stack.tmpdir)
        def git(*args):
            subprocess.run(["git", "-C", repo] + list(args), check=True, capture_output=True,
                           env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e",
                                    GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@e"))
        git("init", "-q", "-b", "main")
        with open(os.path.join(repo, "app.sh"), "w") as f:
            f.write("cat app/out.txt app/greet.txt\nsleep 30\n")
        git("add", "app.sh")
        git("commit", "-q", "-m", "v1")
        git("tag", "v1")
        with open(os.path.join(repo, "app.sh"), "w") as f:
            f.write("echo this is v2\nsleep 30\n")
        git("commit", "-q", "-am", "v2")
        return repo

    def scm(self, name, stages):
        builds = core_pb2.Builds(stages=[s for s, _ in stages])
        for stage, b in stages:
            builds.builds[stage].CopyFrom(b)
        return core_pb2.BuildImageOptions(name=name, tags=["v1"], builds=builds,
                                          build_method=core_pb2.BuildImageOptions.SCM)

    def test_build_scm_in_stages_then_deploy(self):
        repo = self.make_repo()
        compile_stage = core_pb2.Build(
            repo="file://" + repo, version="v1", dir="src",
            commands=["echo built > out.txt", "echo $GREETING > greet.txt", "echo compiling"],
            envs={"GREETING": "hi"},
            artifacts={"/src/out.txt": "/app/out.txt", "/src/greet.txt": "/app/greet.txt",
                       "/src/app.sh": "/app/app.sh"})
        run_stage = core_pb2.Build(commands=["test -f app/out.txt", "test ! -e src"])
        got = list(self.core.BuildImage(self.scm("scm/app", [("compile", compile_stage),
                                                             ("run", run_stage)]), timeout=120))
        self.assertIn("compiling", [m.stream for m in got if m.status == "building"])
        self.assertEqual([m.progress for m in got if m.status == "finished"], ["scm/app:v1"])
        with tarfile.open(os.path.join(self.stack.data_dir, "registry", "scm", "app",
                                       "v1.tar")) as t:
            names = t.getnames()
        self.assertIn("app/app.sh", names)
        self.assertFalse([n for n in names if n.startswith("src") or ".git" in n], names)
        msgs = list(self.core.CreateWorkload(deploy(1, image="scm/app:v1",
                                                    commands=("/bin/sh", "app/app.sh")),
                                             timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        deadline = time.monotonic() + 10
        lines = []
        while lines != ["built", "hi"] and time.monotonic() < deadline:
            lines = [m.data.decode() for m in self.core.LogStream(
                core_pb2.LogStreamOptions(id=msgs[0].id), timeout=30)]
            time.sleep(0.1)
        self.assertEqual(lines, ["built", "hi"])  # v1's app.sh, not v2's
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[msgs[0].id],
                                                                     force=True), timeout=60))

    def test_build_scm_failures(self):
        repo = self.make_repo()
        failing = core_pb2.Build(repo="file://" + repo, commands=["echo before", "exit 7"])
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/BuildImage",
                                 self.scm("scm/bad", [("only", failing)]).SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1071")
        self.assertIn("stage only: stage only command 2 exited with 7", t.get("grpc-message", ""), t)
        for stages, want in (
                ([("a", core_pb2.Build(commands=["true"]))], "needs a repository"),
                ([("a", core_pb2.Build(repo="file://" + repo, dir="../up"))], "leaves"),
                ([("a/b", core_pb2.Build(repo="file://" + repo))], "is not a stage name"),
                ([("a", core_pb2.Build(repo="--upload-pack=x"))], "looks like an option")):
            t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/BuildImage",
                                     self.scm("scm/bad", stages).SerializeToString())
            self.assertEqual(t.get("grpc-status"), "1071", stages)
            self.assertIn(want, t.get("grpc-message", ""))
        missing = core_pb2.Build(repo="file://" + repo + "-missing")
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/BuildImage",
                                 self.scm("scm/bad", [("a", missing)]).SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1071")
        self.assertIn("git clone exited with", t.get("grpc-message", ""))


class Race(Base):
    def test_deploys_from_two_gateways_never_overcommit(self):
        import threading
        big = "2G"
        probe = deploy(1, memory=big)
        probe.deploy_strategy = core_pb2.DeployOptions.DUMMY
        cap = self.core.CalculateCapacity(probe, timeout=30).total
        self.assertGreater(cap, 0)
        stubs = [core_pb2_grpc.CoreRPCStub(self.stack.channel(i)) for i in (0, 1)]
        results, lock = [], threading.Lock()

        def one(i):
            stub = stubs[i % 2]
            try:
                msgs = list(stub.CreateWorkload(deploy(1, memory=big, name="race%d" % i),
                                                timeout=60))
                ok = sum(1 for m in msgs if m.success)
                # a deploy that does not fit is its one message, success false (Eru's)
                if not ok and (len(msgs) != 1 or "need: 1, available: 0" not in msgs[0].error):
                    ok = -1
            except Exception:  # noqa: BLE001 - a deploy ends OK, fitting or not
                ok = -1
            with lock:
                results.append(ok)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(cap + 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertNotIn(-1, results, results)
        self.assertEqual(sum(results), cap, results)
        msgs = list(self.core.CreateWorkload(deploy(1, memory=big), timeout=60))
        self.assertEqual([(m.success, m.id, m.nodename) for m in msgs], [(False, "", "")])
        self.assertIn("need: 1, available: 0", msgs[0].error)
        for node in NODES:
            self.assertEqual(list(self.usage(node).diffs), [])


class Remove(Base):
    def test_remove_stops_and_gives_back(self):
        base = self.stack.prefix + "{reg}:"
        before = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        opts = deploy(2, commands=("/bin/sh", "-c", "sleep 60"))
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertEqual([m.success for m in msgs], [True, True], msgs)
        pids = {}
        for m in msgs:
            rec = json.load(open(os.path.join(self.stack.data_dir, "engine", m.nodename, m.id,
                                              "record.json")))
            pid = rec.get("pid") or rec.get("main_pid")
            self.assertTrue(pid and os.path.exists("/proc/%d" % pid), rec)
            pids[m.id] = pid
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[m.id for m in msgs]), timeout=60))
        self.assertEqual(sorted((g.id, g.success) for g in got),
                         sorted((m.id, True) for m in msgs), got)
        for m in msgs:
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + m.id), 0)
            self.assertFalse(os.path.exists(os.path.join(self.stack.data_dir, "engine",
                                                         m.nodename, m.id)))
            self.assertFalse(pid_alive(pids[m.id]), m.id)
        after = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        self.assertEqual(after, before)
        for node in NODES:
            self.assertEqual(list(self.usage(node).diffs), [])
        self.assertEqual(self.stack.redis.cmd("HLEN", base + "deploy-count:%s:web" % opts.name), 0)

    def test_control_stop_start_suspend_resume(self):
        base = self.stack.prefix + "{reg}:"
        msgs = list(self.core.CreateWorkload(deploy(1, commands=("/bin/sh", "-c", "sleep 60")),
                                             timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid, node = msgs[0].id, msgs[0].nodename
        record = os.path.join(self.stack.data_dir, "engine", node, wid, "record.json")

        def control(kind, force=False):
            got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
                IDs=[wid], type=kind, force=force), timeout=60))
            self.assertEqual([(g.id, g.error) for g in got], [(wid, "")], got)

        def state():
            st = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[wid]), timeout=10)
            return st.status[0].running

        pid = json.load(open(record))["pid"]
        control("suspend")
        self.assertTrue(pvtest.proc_stopped(pid), pvtest.proc_state(pid))
        control("resume")
        control("stop", force=True)
        self.assertFalse(pid_alive(pid))
        self.assertFalse(state())
        control("stop")  # stopping a stopped workload is fine
        control("start")
        self.assertTrue(state())
        pid2 = json.load(open(record))["pid"]
        self.assertNotEqual(pid2, pid)
        self.assertTrue(pid_alive(pid2))
        control("restart", force=True)
        self.assertTrue(pid_alive(json.load(open(record))["pid"]))
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/ControlWorkload",
                                 core_pb2.ControlWorkloadOptions(IDs=[wid], type="explode")
                                 .SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1078")
        self.assertIn("explode", t.get("grpc-message", ""))
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                            timeout=60))
        self.assertTrue(got[0].success)
        self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + wid), 0)

    def test_log_stream(self):
        script = "for i in 1 2 3; do echo line $i; done; sleep 1; echo late; sleep 30"
        msgs = list(self.core.CreateWorkload(deploy(1, commands=("/bin/sh", "-c", script)),
                                             timeout=60))
        wid = msgs[0].id
        self.assertTrue(msgs[0].success, msgs[0].error)
        time.sleep(0.5)

        def lines(**kw):
            return [m.data.decode() for m in self.core.LogStream(
                core_pb2.LogStreamOptions(id=wid, **kw), timeout=30)]

        self.assertEqual(lines()[:3], ["line 1", "line 2", "line 3"])  # engine notes left out
        deadline = time.monotonic() + 10
        while lines()[-1:] != ["late"] and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(lines(), ["line 1", "line 2", "line 3", "late"])
        self.assertEqual(lines(tail="2"), ["line 3", "late"])
        # follow: what comes later arrives; the client leaving ends the node's operation.
        stream = self.core.LogStream(core_pb2.LogStreamOptions(id=wid, tail="all", follow=True),
                                     timeout=30)
        seen = []
        for m in stream:
            seen.append(m.data.decode())
            if seen[-1] == "late":
                break
        stream.cancel()
        self.assertEqual(seen[-1], "late")
        base = self.stack.prefix + "{ops}:"
        def log_ops_over():
            ids = self.stack.scan(base + "op:*")
            kinds = [self.stack.redis.cmd("HMGET", k, "kind", "status") for k in ids]
            return all(s in ("SUCCEEDED", "FAILED", "CANCELLED")
                       for k, s in kinds if k == "workload.log_on_node")
        deadline = time.monotonic() + 10
        while not log_ops_over() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertTrue(log_ops_over())
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/LogStream",
                                 core_pb2.LogStreamOptions(id=wid, since="2026-01-01")
                                 .SerializeToString())
        self.assertEqual(t.get("grpc-status"), "10711")
        self.assertIn('since: "2026-01-01" is not a time', t.get("grpc-message", ""))
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                      timeout=60))

    def test_log_stream_since_until(self):
        script = "echo a1; echo a2; sleep 4; echo b1; echo b2; sleep 30"
        msgs = list(self.core.CreateWorkload(deploy(1, commands=("/bin/sh", "-c", script)),
                                             timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        wid = msgs[0].id

        def lines(**kw):
            return [m.data.decode() for m in self.core.LogStream(
                core_pb2.LogStreamOptions(id=wid, **kw), timeout=30)]

        deadline = time.monotonic() + 10
        while lines() != ["a1", "a2"] and time.monotonic() < deadline:
            time.sleep(0.1)
        # a moment after the a-lines (their index tick has passed), well before the b-lines
        mid = time.time() + 1.5
        deadline = time.monotonic() + 15
        while lines()[-1:] != ["b2"] and time.monotonic() < deadline:
            time.sleep(0.2)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mid)) + \
            ".%03dZ" % int((mid % 1) * 1000)
        idx = open(os.path.join(self.stack.data_dir, "engine", msgs[0].nodename, wid,
                                "log.idx")).read()
        self.assertEqual(lines(since=stamp), ["b1", "b2"], (stamp, mid, idx))
        self.assertEqual(lines(until=stamp), ["a1", "a2"], (stamp, mid, idx))
        self.assertEqual(lines(since="%.3f" % mid, tail="1"), ["b2"])
        self.assertEqual(lines(since="1h"), ["a1", "a2", "b1", "b2"])
        self.assertEqual(lines(until="1h"), [])
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/LogStream",
                                 core_pb2.LogStreamOptions(id=wid, since="1m", until="2h")
                                 .SerializeToString())
        self.assertEqual(t.get("grpc-status"), "10711")
        self.assertIn("is before since", t.get("grpc-message", ""))
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[wid], force=True),
                                      timeout=60))

    def test_dissociate_leaves_the_process_and_frees_the_resources(self):
        base = self.stack.prefix + "{reg}:"
        before = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        msgs = list(self.core.CreateWorkload(deploy(1, commands=("/bin/sh", "-c", "sleep 30")),
                                             timeout=60))
        m = msgs[0]
        pid = json.load(open(os.path.join(self.stack.data_dir, "engine", m.nodename, m.id,
                                          "record.json")))["pid"]
        # Eru looks every id up first: an unknown one fails the call (1077), nothing let go
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/DissociateWorkload",
                                 core_pb2.DissociateWorkloadOptions(IDs=[m.id, "0" * 64])
                                 .SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1077", t)
        self.assertEqual(t.get("grpc-message"), "workload %s not found" % ("0" * 64))
        self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + m.id), 1)
        got = list(self.core.DissociateWorkload(core_pb2.DissociateWorkloadOptions(
            IDs=[m.id]), timeout=30))
        self.assertEqual([(g.id, g.error) for g in got], [(m.id, "")])
        self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + m.id), 0)
        self.assertTrue(pid_alive(pid))  # the engine's workload is left as it is
        after = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        self.assertEqual(after, before)
        os.kill(pid, 9)

    def test_send_and_copy(self):
        msgs = list(self.core.CreateWorkload(deploy(2, commands=("/bin/sh", "-c", "sleep 30")),
                                             timeout=60))
        ids = [m.id for m in msgs]
        got = list(self.core.Send(core_pb2.SendOptions(
            IDs=ids, data={"/etc/app/conf.ini": b"a=1\n", "/bin/tool": b"#!/bin/sh\n"},
            modes={"/etc/app/conf.ini": core_pb2.FileMode(mode=0o600)}), timeout=60))
        self.assertEqual(sorted((g.id, g.path, g.error) for g in got),
                         sorted((i, p, "") for i in ids for p in ("/etc/app/conf.ini", "/bin/tool")))
        for m in msgs:
            root = os.path.join(self.stack.data_dir, "engine", m.nodename, m.id, "root")
            conf = os.path.join(root, "etc/app/conf.ini")
            self.assertEqual(open(conf, "rb").read(), b"a=1\n")
            self.assertEqual(os.stat(conf).st_mode & 0o777, 0o600)
            self.assertEqual(os.stat(os.path.join(root, "bin/tool")).st_mode & 0o777, 0o755)
        # Escapes are refused: "..", and a symbolic link on the way.
        root = os.path.join(self.stack.data_dir, "engine", msgs[0].nodename, ids[0], "root")
        os.symlink("/tmp", os.path.join(root, "out"))
        got = list(self.core.Send(core_pb2.SendOptions(
            IDs=[ids[0]], data={"../escape": b"x", "/out/escape": b"x"}), timeout=60))
        self.assertTrue(all(g.error for g in got), got)
        self.assertFalse(os.path.exists("/tmp/escape"))
        # Copy: a tar archive of a directory, in chunks, that unpacks to what was sent.
        chunks = list(self.core.Copy(core_pb2.CopyOptions(targets={
            ids[0]: core_pb2.CopyPaths(paths=["/etc/app", "/nope"])}), timeout=60))
        data = b"".join(c.data for c in chunks if c.path == "/etc/app" and not c.error)
        self.assertTrue(all(len(c.data) <= 4096 for c in chunks))
        self.assertEqual({c.name for c in chunks if not c.error}, {msgs[0].name})
        import io
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            self.assertEqual(t.extractfile("app/conf.ini").read(), b"a=1\n")
        self.assertTrue(any(c.path == "/nope" and "No such file" in c.error for c in chunks))
        # SendLargeFile: one file streamed in chunks, to both workloads.
        blob = os.urandom(300 * 1024)
        reqs = [core_pb2.FileOptions(ids=ids, dst="/data/blob.bin", size=len(blob),
                                     mode=core_pb2.FileMode(mode=0o640),
                                     chunk=blob[i:i + 65536])
                for i in range(0, len(blob), 65536)]
        got = list(self.core.SendLargeFile(iter(reqs), timeout=60))
        self.assertEqual(sorted((g.id, g.path, g.error) for g in got),
                         sorted((i, "/data/blob.bin", "") for i in ids))
        for m in msgs:
            path = os.path.join(self.stack.data_dir, "engine", m.nodename, m.id, "root",
                                "data/blob.bin")
            self.assertEqual(open(path, "rb").read(), blob)
            self.assertEqual(os.stat(path).st_mode & 0o777, 0o640)
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=ids, force=True),
                                      timeout=60))

    def test_realloc_in_place(self):
        msgs = list(self.core.CreateWorkload(deploy(1, commands=("/bin/sh", "-c", "sleep 60")),
                                             timeout=60))
        m = msgs[0]
        self.assertTrue(m.success, m.error)
        pid = json.load(open(os.path.join(self.stack.data_dir, "engine", m.nodename, m.id,
                                          "record.json")))["pid"]

        def address_limit():
            return [l.split()[3] for l in open("/proc/%d/limits" % pid).read().splitlines()
                    if l.startswith("Max address space")][0]

        def used():
            return json.loads(self.usage(m.nodename).resource_usage)["cpumem"]["memory"]

        # Lowering applies in place (the running process's RLIMIT_AS).
        before = used()
        got = self.core.ReallocResource(core_pb2.ReallocOptions(id=m.id, resources={
            "cpumem": b'{"memory-request": "-32M", "memory-limit": "-32M"}'}), timeout=60)
        self.assertEqual(got.error, "")
        w = self.core.GetWorkload(core_pb2.WorkloadID(id=m.id), timeout=10)
        self.assertEqual(json.loads(w.resources)["cpumem"]["memory_request"], 32 * 2**20)
        self.assertEqual(before - used(), 32 * 2**20)
        self.assertEqual(address_limit(), str(32 * 2**20))
        self.assertEqual(list(self.usage(m.nodename).diffs), [])
        # Raising needs CAP_SYS_RESOURCE without cgroup v2: either it applies, or it is refused
        # saying so and nothing changes.
        after = used()
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/ReallocResource",
                                 core_pb2.ReallocOptions(id=m.id, resources={
                                     "cpumem": b'{"memory-request": "32M"}'})
                                 .SerializeToString())
        if t.get("grpc-status") == "0":
            self.assertEqual(address_limit(), str(64 * 2**20))
            self.assertEqual(used() - after, 32 * 2**20)
            after = used()
        else:
            self.assertEqual(t.get("grpc-status"), "10710")
            self.assertIn("CAP_SYS_RESOURCE", t.get("grpc-message", ""))
            self.assertEqual(used(), after)
            self.assertEqual(address_limit(), str(32 * 2**20))
        self.assertEqual(list(self.usage(m.nodename).diffs), [])
        for body, word in ((b'{"memory-request": "100P"}', "not enough"),
                           (b'{"memory-request": "-1G"}', "negative")):
            t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/ReallocResource",
                                     core_pb2.ReallocOptions(id=m.id, resources={
                                         "cpumem": body}).SerializeToString())
            self.assertEqual(t.get("grpc-status"), "10710")
            self.assertIn(word, t.get("grpc-message", ""))
        self.assertEqual(used(), after)  # refused changes change nothing
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[m.id], force=True),
                                      timeout=60))

    def test_replace_keeps_resources_and_copies(self):
        base = self.stack.prefix + "{reg}:"
        opts = deploy(2, commands=("/bin/sh", "-c", "sleep 60"))
        olds = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(all(m.success for m in olds), olds)
        list(self.core.Send(core_pb2.SendOptions(IDs=[m.id for m in olds],
                                                 data={"/state/kept": b"k"},
                                                 modes={"/state/kept": core_pb2.FileMode(
                                                     mode=0o600)}), timeout=60))
        before = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        # Every workload of the app and entrypoint (no IDs), with a new command.
        new_opts = deploy(1, name=opts.name, commands=("/bin/sh", "-c", "sleep 61"))
        got = list(self.core.ReplaceWorkload(core_pb2.ReplaceOptions(
            deployOpt=new_opts, copy={"/state/kept": "/state/kept"}), timeout=60))
        self.assertEqual(sorted(g.remove.id for g in got), sorted(m.id for m in olds), got)
        for g in got:
            self.assertTrue(g.create.success, g.error)
            self.assertTrue(g.remove.success)
            self.assertEqual(g.error, "")
            self.assertNotIn(g.create.id, [m.id for m in olds])
            self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + g.remove.id), 0)
            root = os.path.join(self.stack.data_dir, "engine", g.create.nodename, g.create.id,
                                "root")
            self.assertEqual(open(os.path.join(root, "state/kept"), "rb").read(), b"k")
            self.assertEqual(os.stat(os.path.join(root, "state/kept")).st_mode & 0o777, 0o600)
            self.assertFalse(os.path.exists(os.path.join(self.stack.data_dir, "engine",
                                                         g.create.nodename, g.remove.id)))
        # The new ones hold exactly what the old ones held.
        after = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        self.assertEqual(after, before)
        for node in NODES:
            self.assertEqual(list(self.usage(node).diffs), [])
        # A replacement that fails (no such image) leaves the old one running.
        keep = got[0].create.id
        bad = deploy(1, name=opts.name, image="nope:0")
        failed = list(self.core.ReplaceWorkload(core_pb2.ReplaceOptions(deployOpt=bad, IDs=[keep]),
                                                timeout=60))
        self.assertFalse(failed[0].create.success)
        self.assertIn("nope", failed[0].error)
        self.assertEqual(self.stack.redis.cmd("EXISTS", base + "wl:" + keep), 1)
        st = self.core.GetWorkload(core_pb2.WorkloadID(id=keep), timeout=10)
        pid = json.load(open(os.path.join(self.stack.data_dir, "engine", st.nodename, keep,
                                          "record.json")))["pid"]
        self.assertTrue(pid_alive(pid))
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(
            IDs=[g.create.id for g in got], force=True), timeout=60))

    def test_deploy_files_and_after_create(self):
        opts = deploy(1, commands=("/bin/sh", "-c", "sleep 30"))
        opts.data["/conf/app.ini"] = b"mode=prod\n"
        opts.modes["/conf/app.ini"].mode = 0o600
        opts.after_create.append("echo created > created.txt")
        msgs = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertTrue(msgs[0].success, msgs[0].error)
        root = os.path.join(self.stack.data_dir, "engine", msgs[0].nodename, msgs[0].id, "root")
        conf = os.path.join(root, "conf/app.ini")
        self.assertEqual(open(conf, "rb").read(), b"mode=prod\n")
        self.assertEqual(os.stat(conf).st_mode & 0o777, 0o600)
        self.assertEqual(open(os.path.join(root, "created.txt")).read(), "created\n")
        bad = deploy(1, commands=("/bin/sh", "-c", "sleep 30"))
        bad.after_create.append("exit 3")
        failed = list(self.core.CreateWorkload(bad, timeout=60))
        self.assertFalse(failed[0].success)
        self.assertIn("exited with 3", failed[0].error)
        raw = deploy(1)
        raw.raw_args = b'{"x": 1}'
        failed = list(self.core.CreateWorkload(raw, timeout=60))
        self.assertIn("raw_args", failed[0].error)
        for field, value in (("dns", "10.0.0.53"), ("extra_hosts", "db:10.0.0.7")):
            opts = deploy(1)
            getattr(opts, field).append(value)
            failed = list(self.core.CreateWorkload(opts, timeout=60))
            self.assertFalse(failed[0].success)
            self.assertIn("%s: the process engine cannot set" % field, failed[0].error)
            self.assertIn(value, failed[0].error)
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=[msgs[0].id],
                                                                     force=True), timeout=60))

    def test_unknown_id_fails_before_anything_stops(self):
        t = pvtest.grpc_trailers(self.addr, "/pb.CoreRPC/RemoveWorkload",
                                 core_pb2.RemoveWorkloadOptions(IDs=["f" * 64])
                                 .SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1076")
        self.assertIn("workload %s not found" % ("f" * 64), t.get("grpc-message", ""))


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


class Failures(Base):
    def test_missing_image_fails_each_instance_and_returns_resources(self):
        before = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        msgs = list(self.core.CreateWorkload(deploy(2, image="nosuch:9"), timeout=60))
        self.assertEqual(len(msgs), 2, msgs)
        for m in msgs:
            self.assertFalse(m.success)
            self.assertIn("nosuch", m.error)
            self.assertEqual(m.id, "")
        after = {n: json.loads(self.usage(n).resource_usage) for n in NODES}
        self.assertEqual(after, before)

    def test_healthcheck_makes_the_agent_report_health(self):
        def free_port():
            with socket.socket() as s:
                s.bind(("", 0))
                return s.getsockname()[1]
        port, closed = free_port(), free_port()
        server = ("/usr/bin/python3", "-m", "http.server", str(port), "--bind", "0.0.0.0")
        good = deploy(1, commands=server)
        good.entrypoint.healthcheck.tcp_ports.append(str(port))
        good.entrypoint.healthcheck.http_port = str(port)
        good.entrypoint.healthcheck.url = "/run.sh"
        good.entrypoint.healthcheck.code = 200
        bad = deploy(1, commands=("/bin/sh", "-c", "sleep 60"))
        bad.entrypoint.healthcheck.tcp_ports.append(str(closed))
        ids = []
        for opts in (good, bad):
            msgs = list(self.core.CreateWorkload(opts, timeout=60))
            self.assertTrue(msgs[0].success, msgs[0].error)
            ids.append(msgs[0].id)
        meta = json.loads(self.core.GetWorkload(core_pb2.WorkloadID(id=ids[0]), timeout=10)
                          .labels["ERU_META"])
        self.assertEqual(meta["healthcheck"], {"tcp_ports": [str(port)], "http_port": str(port),
                                               "url": "/run.sh", "code": 200})
        deadline = time.time() + 20
        got = {}
        while time.time() < deadline:
            try:  # 1055 until the agent's first report (within an interval)
                st = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=ids), timeout=10)
            except grpc.RpcError:
                time.sleep(0.2)
                continue
            got = {s.id: (s.running, s.healthy) for s in st.status}
            if got.get(ids[0]) == (True, True) and got.get(ids[1]) == (True, False):
                break
            time.sleep(0.2)
        self.assertEqual(got, {ids[0]: (True, True), ids[1]: (True, False)})
        # the agent's statuses live three intervals (1 s here) and are renewed
        key = self.stack.prefix + "{reg}:wl-status:" + ids[0]
        ttl = self.stack.redis.cmd("TTL", key)
        self.assertTrue(0 < ttl <= 3, ttl)
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=ids, force=True),
                                            timeout=60))
        self.assertEqual(sorted(g.id for g in got if g.success), sorted(ids))

    def test_bad_healthcheck_answers_1074(self):
        opts = deploy(1)
        opts.entrypoint.healthcheck.tcp_ports.append("80x")
        code, msg = self.eru(opts)
        self.assertEqual(code, 1074)
        self.assertIn("entrypoint.healthcheck.tcp_ports[0]", msg)
        opts = deploy(1)
        opts.entrypoint.healthcheck.url = "/health"
        code, msg = self.eru(opts)
        self.assertEqual(code, 1074)
        self.assertIn("needs http_port", msg)

    def test_bad_requests_answer_1074(self):
        code, msg = self.eru(deploy(0))
        self.assertEqual(code, 1074)
        self.assertIn("count is 0", msg)
        code, msg = self.eru(deploy(1, entry="bad_entry"))
        self.assertEqual(code, 1074)
        self.assertIn("entrypoint name has '_' character", msg)
        # not enough resource is no bad request: the stream's one message says it, status OK
        code, msg = self.eru(deploy(3, memory="1P"))
        self.assertEqual((code, msg), (0, ""))
        msgs = list(self.core.CreateWorkload(deploy(3, memory="1P"), timeout=60))
        self.assertEqual([(m.success, m.id) for m in msgs], [(False, "")])
        self.assertIn("need: 3", msgs[0].error)


if __name__ == "__main__":
    unittest.main(verbosity=2)
