"""End-to-end tests of the docker engine: pb.CoreRPC on a node whose endpoint is unix:// (a
private dockerd started here: pvtest.DockerDaemon), beside a process node in one pod.

Real processes only: dockerd (its own socket, data root, exec root; no iptables, no bridge),
redis-server, a gateway, a scheduler, an ops worker and two node agents: "dk" (docker engine,
unix:///.../docker.sock) and "pr" (process engine), pod "dkp". The image demo:1 is busybox-static
imported into the daemon at test time (and a tar of the same name in the process node's store).
What the engine did is read back from the daemon itself through the Engine API.

Classes:
  Lifecycle  CreateWorkload on the docker node: a running container per instance, named as the
             workload, with Eru's labels (ERU=1, ERU_META, eru.nodename, eru.coreid) and
             pivirt.id, the four env variables, the entrypoint's commands, dir and user, Init,
             memory as Memory/MemorySwap (half reserved) and cpu as NanoCpus, or CpusetCpus
             with cpu-bind; restart policy; ControlWorkload suspend (Paused) / resume / stop (at
             once despite sh ignoring SIGTERM) / start / restart, the workload status following;
             RemoveWorkload leaves no container; a deploy over the pod spreads over both nodes;
             an agent restarted finds its containers again by label; raw_args merged (cap_add)
             and bad raw_args refused naming the field.
             The node's engine info (Node.info "docker"): GET /info's figures and each
             container's limits as inspected; GetNodeResource's diffs name a container whose
             limits are not its allocation's (a docker update behind pivirt's back), and its
             fix makes the allocation and the node's usage what the container has.
  Exec       ExecuteWorkload: output, env, workdir, "[exitcode] N"; RunAndWait; LogStream with
             tail, follow (to the end with the exit), since/until, stdout and stderr apart.
  Files      Send (modes and owners kept, parents made), SendLargeFile, Copy (a tar in 4 KiB
             chunks that unpacks to what was sent), DeployOptions data placed before start.
  Images     BuildImage RAW and EXIST pushed to the registry, which asks for credentials
             (htpasswd): the stack's registry.auths go with pushes, pulls (CacheImage, a deploy
             of an image the daemon lacks) and a build's FROM pulls; an anonymous push is
             refused. ListImage, RemoveImage, a missing image failing its instance.
"""
import io
import itertools
import json
import os
import queue
import subprocess
import tarfile
import tempfile
import time
import unittest

import grpc

import pvtest
from pb import core_pb2, core_pb2_grpc

_env = None
_dk = _reg = _stack = None
_counter = itertools.count(1)
POD = "dkp"
# The registry asks for these (htpasswd); the stack has them as registry.auths.
REG_USER, REG_PASSWORD = "pvuser", "pv-secret:1"


def setUpModule():
    global _env, _dk, _reg, _stack
    _env = pvtest.DockerSetup(
        lambda dk: [{"node": "dk", "pod": POD, "endpoint": dk.endpoint}, ("pr", POD)],
        config={"worker": {"status_interval_seconds": 1, "stop_grace_seconds": 5,
                           "build_pod": POD}},
        registry=(REG_USER, REG_PASSWORD), alive=("dk", "pr"))
    _dk, _reg, _stack = _env.daemon, _env.registry, _env.stack
    make_process_image(os.path.join(_stack.data_dir, "images", "demo", "1.tar"))


def tearDownModule():
    if _env:
        _env.stop()


def make_process_image(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        with open(os.path.join(root, "README"), "w") as f:
            f.write("demo\n")
        with tarfile.open(path, "w") as t:
            t.add(os.path.join(root, "README"), arcname="README")


def deploy(count=1, node="dk", commands=("/bin/sh", "-c", "echo started $APP_NAME; sleep 300"),
           memory="64M", cpu=None, bind=False, **kw):
    req = {"memory-request": memory}
    if cpu is not None:
        req["cpu-request"] = cpu
    if bind:
        req["cpu-bind"] = True
    entry = kw.pop("entrypoint", {})
    return core_pb2.DeployOptions(
        name=kw.pop("name", "dapp%d" % next(_counter)),
        entrypoint=core_pb2.EntrypointOptions(name="web", commands=list(commands), **entry),
        podname=POD, nodenames=[node] if node else [], image="demo:1", count=count,
        resources={"cpumem": json.dumps(req).encode()}, **kw)


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = _stack
        cls.dk = _dk
        cls.core = core_pb2_grpc.CoreRPCStub(cls.stack.channel(0))

    def create(self, opts):
        msgs = list(self.core.CreateWorkload(opts, timeout=90))
        for m in msgs:
            self.assertTrue(m.success, m.error)
        return msgs

    def remove(self, ids):
        got = list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=ids, force=True),
                                            timeout=90))
        self.assertTrue(all(g.success for g in got), got)

    def container(self, wid):
        """The daemon's inspect of workload WID's container (None when there is none)."""
        found = self.dk.containers("pivirt.id=" + wid)
        self.assertLessEqual(len(found), 1)
        return self.dk.inspect(found[0]["Id"]) if found else None

    def control(self, wid, kind, force=False):
        got = list(self.core.ControlWorkload(core_pb2.ControlWorkloadOptions(
            IDs=[wid], type=kind, force=force), timeout=90))
        self.assertEqual([(g.id, g.error) for g in got], [(wid, "")], got)

    def running(self, wid):
        st = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[wid]), timeout=10)
        return st.status[0].running


class Lifecycle(Base):
    def test_create_runs_a_container_as_eru_does(self):
        opts = deploy(2, cpu=0.5, memory="64M",
                      entrypoint={"dir": "/tmp", "restart": "on-failure"}, user="nobody",
                      env=["EXTRA=1"], labels={"team": "blue"})
        msgs = self.create(opts)
        self.assertEqual(len(msgs), 2)
        seqs = set()
        for m in msgs:
            self.assertEqual(m.nodename, "dk")
            self.assertRegex(m.name, r"^%s_web_[a-z]{6}$" % opts.name)
            c = self.container(m.id)
            self.assertIsNotNone(c, m)
            self.assertEqual(c["Name"], "/" + m.name)
            self.assertEqual(c["State"]["Status"], "running")
            self.assertTrue(c["State"]["Running"])
            labels = c["Config"]["Labels"]
            self.assertEqual((labels["ERU"], labels["eru.nodename"], labels["eru.coreid"],
                              labels["pivirt.id"], labels["team"]),
                             ("1", "dk", "pivirt", m.id, "blue"))
            self.assertIn("publish", json.loads(labels["ERU_META"]))
            env = dict(e.split("=", 1) for e in c["Config"]["Env"])
            self.assertEqual((env["APP_NAME"], env["ERU_POD"], env["ERU_NODE_NAME"], env["EXTRA"]),
                             (opts.name, POD, "dk", "1"))
            seqs.add(env["ERU_WORKLOAD_SEQ"])
            self.assertEqual(c["Config"]["Cmd"], ["/bin/sh", "-c",
                                                   "echo started $APP_NAME; sleep 300"])
            self.assertEqual((c["Config"]["WorkingDir"], c["Config"]["User"]), ("/tmp", "nobody"))
            hc = c["HostConfig"]
            self.assertTrue(hc["Init"])
            self.assertEqual(hc["Memory"], 64 << 20)
            self.assertEqual(hc["MemorySwap"], 64 << 20)
            self.assertEqual(hc["MemoryReservation"], 32 << 20)
            self.assertEqual(hc["NanoCpus"], 500000000)
            self.assertEqual(hc["RestartPolicy"], {"Name": "on-failure", "MaximumRetryCount": 0})
            # the registry's record carries the container's id
            w = self.core.GetWorkload(core_pb2.WorkloadID(id=m.id), timeout=10)
            self.assertEqual((w.nodename, w.image), ("dk", "demo:1"))
        self.assertEqual(seqs, {"0", "1"})
        self.remove([m.id for m in msgs])
        for m in msgs:
            self.assertIsNone(self.container(m.id))

    def test_cpu_bind_sets_a_cpuset(self):
        msgs = self.create(deploy(1, cpu=1, bind=True))
        hc = self.container(msgs[0].id)["HostConfig"]
        self.assertRegex(hc["CpusetCpus"], r"^\d+$")
        self.assertEqual(hc["NanoCpus"], 0)
        # reported as inspected, and what the allocation (its bound core) gives: no diff
        deadline = time.monotonic() + 20
        while msgs[0].id not in self.reported().get("workloads", {}) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(self.reported()["workloads"][msgs[0].id]["cpuset"], hc["CpusetCpus"])
        self.assertEqual(self.diffs_of(msgs[0].id), [])
        self.remove([msgs[0].id])

    def test_control_and_status(self):
        wid = self.create(deploy(1))[0].id
        self.control(wid, "suspend")
        c = self.container(wid)
        self.assertEqual((c["State"]["Status"], c["State"]["Paused"]), ("paused", True))
        self.control(wid, "resume")
        self.assertEqual(self.container(wid)["State"]["Status"], "running")
        started = self.container(wid)["State"]["StartedAt"]
        t0 = time.monotonic()
        self.control(wid, "stop")  # sh ignores SIGTERM as PID 1; Init makes it stop at once
        self.assertLess(time.monotonic() - t0, 4.0)
        self.assertEqual(self.container(wid)["State"]["Status"], "exited")
        self.assertFalse(self.running(wid))
        self.control(wid, "stop")  # a stopped workload stops again without error
        self.control(wid, "start")
        self.assertEqual(self.container(wid)["State"]["Status"], "running")
        self.assertTrue(self.running(wid))
        second = self.container(wid)["State"]["StartedAt"]
        self.assertNotEqual(second, started)
        self.control(wid, "restart", force=True)
        c = self.container(wid)
        self.assertEqual(c["State"]["Status"], "running")
        self.assertNotEqual(c["State"]["StartedAt"], second)
        self.remove([wid])
        self.assertIsNone(self.container(wid))

    def reported(self):
        """The docker engine's part of node dk's engine info (Node.info)."""
        node = self.core.GetNode(core_pb2.GetNodeOptions(nodename="dk"), timeout=10)
        return json.loads(node.info or "{}").get("docker", {})

    def node_resource(self, fix=False):
        return self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename="dk"), fix=fix), timeout=30)

    def diffs_of(self, wid):
        return [d for d in self.node_resource().diffs if wid in d]

    def test_engine_info_and_resource_diffs(self):
        m = self.create(deploy(1, cpu=0.5, memory="64M"))[0]
        deadline = time.monotonic() + 20  # the agent's next beat reports it as it runs
        while self.reported().get("workloads", {}).get(m.id, {}).get("state") != "running" and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        info, daemon = self.reported(), self.dk.api("GET", "/info")
        self.assertEqual((info["server_version"], info["cpus"], info["mem_total"],
                          info["storage_driver"], info["endpoint"]),
                         (daemon["ServerVersion"], daemon["NCPU"], daemon["MemTotal"],
                          "overlay2", self.dk.endpoint))
        self.assertEqual(info["workloads"][m.id], {"container": m.name, "state": "running",
                                                   "cpu": 0.5, "cpuset": "", "memory": 64 << 20})
        self.assertEqual(self.core.GetNodeEngineInfo(core_pb2.GetNodeOptions(nodename="dk"),
                                                     timeout=10).type, "docker")
        self.assertEqual(self.diffs_of(m.id), [])
        # limits changed behind pivirt's back: GetNodeResource's diff names both sides
        cid = self.container(m.id)["Id"]
        self.dk.api("POST", "/containers/%s/update" % cid, {
            "NanoCpus": 250000000, "Memory": 48 << 20, "MemorySwap": 48 << 20})
        deadline = time.monotonic() + 20
        while not self.diffs_of(m.id) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(self.diffs_of(m.id), [
            "workload %s: its container %s runs with cpu 0.25, cpuset \"\" and memory 48 MiB, "
            "its allocation gives cpu 0.5, no cpuset and memory 64 MiB" % (m.id, m.name)])
        # fix: the allocation and the node's usage become what the container has
        before = json.loads(self.node_resource().resource_usage)["cpumem"]
        fixed = self.node_resource(fix=True)
        self.assertEqual([d for d in fixed.diffs if m.id in d], [])
        self.assertEqual(self.diffs_of(m.id), [])
        after = json.loads(fixed.resource_usage)["cpumem"]
        self.assertAlmostEqual(after["cpu"], before["cpu"] - 0.25, places=6)
        self.assertEqual(after["memory"], before["memory"] - (16 << 20))
        self.assertEqual(json.loads(self.node_resource().resource_usage)["cpumem"], after)
        self.remove([m.id])
        self.assertEqual(json.loads(self.node_resource().resource_usage)["cpumem"]["memory"],
                         before["memory"] - (64 << 20))

    def test_spread_over_docker_and_process_nodes(self):
        opts = deploy(2, node=None, commands=("/bin/sh", "-c", "sleep 300"))
        msgs = self.create(opts)
        self.assertEqual(sorted(m.nodename for m in msgs), ["dk", "pr"])
        on_dk = [m for m in msgs if m.nodename == "dk"][0]
        self.assertTrue(self.container(on_dk.id)["State"]["Running"])
        self.remove([m.id for m in msgs])
        self.assertIsNone(self.container(on_dk.id))

    def test_agent_restart_finds_its_containers(self):
        wid = self.create(deploy(1))[0].id
        agent = self.stack.agents[self.stack.agent_nodes.index("dk")]
        agent.restart()
        self.stack.wait_ready([agent])
        self.control(wid, "suspend")  # the new agent knows the container only by its label
        self.assertEqual(self.container(wid)["State"]["Status"], "paused")
        self.control(wid, "resume")
        self.remove([wid])
        self.assertIsNone(self.container(wid))

    def test_replace_dissociate_realloc(self):
        opts = deploy(1, memory="64M")
        old = self.create(opts)[0].id
        list(self.core.Send(core_pb2.SendOptions(
            IDs=[old], data={"/state/kept": b"k"}, modes={"/state/kept": core_pb2.FileMode(
                mode=0o600)}, owners={"/state/kept": core_pb2.FileOwner(uid=65534, gid=65534)}),
            timeout=60))
        # ReplaceWorkload: a new container with the file copied (mode and owner kept), the old
        # one gone
        new_opts = deploy(1, name=opts.name, commands=("/bin/sh", "-c", "sleep 301"))
        got = list(self.core.ReplaceWorkload(core_pb2.ReplaceOptions(
            deployOpt=new_opts, IDs=[old], copy={"/state/kept": "/state/copied"}), timeout=90))
        self.assertEqual([(g.remove.id, g.create.success, g.error) for g in got], [(old, True, "")])
        new = got[0].create.id
        self.assertIsNone(self.container(old))
        c = self.container(new)
        self.assertEqual(c["Config"]["Cmd"][-1], "sleep 301")
        status, data = self.dk.raw("GET", "/containers/%s/archive?path=/state/copied" % c["Id"])
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            m = t.getmembers()[0]
            self.assertEqual((t.extractfile(m).read(), m.mode & 0o777, m.uid, m.gid),
                             (b"k", 0o600, 65534, 65534))
        # a replacement that fails leaves the one it would replace running
        bad = deploy(1, name=opts.name)
        bad.image = "%s/pivirt/absent:1" % _reg.addr
        failed = list(self.core.ReplaceWorkload(core_pb2.ReplaceOptions(deployOpt=bad, IDs=[new]),
                                                timeout=90))
        self.assertFalse(failed[0].create.success)
        self.assertTrue(self.container(new)["State"]["Running"])
        # ReallocResource: the container's limits updated in place
        got = self.core.ReallocResource(core_pb2.ReallocOptions(id=new, resources={
            "cpumem": b'{"memory-request": "-32M", "memory-limit": "-32M"}'}), timeout=60)
        self.assertEqual(got.error, "")
        hc = self.container(new)["HostConfig"]
        self.assertEqual((hc["Memory"], hc["MemorySwap"]), (32 << 20, 32 << 20))
        self.assertTrue(self.container(new)["State"]["Running"])
        # DissociateWorkload: the record goes, the container runs on
        got = list(self.core.DissociateWorkload(core_pb2.DissociateWorkloadOptions(IDs=[new]),
                                                timeout=60))
        self.assertEqual([(g.id, g.error) for g in got], [(new, "")])
        self.assertTrue(self.container(new)["State"]["Running"])
        self.dk.api("DELETE", "/containers/%s?force=1" % self.container(new)["Id"])

    def test_audit_compares_records_with_the_daemon(self):
        wid = self.create(deploy(1))[0].id
        # behind the engine's back: its container removed, and a stranger with pivirt's labels
        self.dk.api("DELETE", "/containers/%s?force=1" % self.container(wid)["Id"])
        stranger = "f" * 64
        c = self.dk.api("POST", "/containers/create?name=stranger", {
            "Image": "demo:1", "Cmd": ["sleep", "300"], "HostConfig": {"Init": True},
            "Labels": {"pivirt.id": stranger, "eru.nodename": "dk", "ERU": "1"}})
        self.dk.api("POST", "/containers/%s/start" % c["Id"])
        want = {"WL_NO_ENGINE workload " + wid, "WL_ORPHAN workload " + stranger}
        deadline = time.monotonic() + 15
        while True:  # the agent's next inventory (every status interval) shows both
            found = {l.split(":")[0] for l in self.stack.check(confirm_ms=200)}
            if want <= found:
                break
            self.assertLess(time.monotonic(), deadline, found)
            time.sleep(0.5)
        self.dk.api("DELETE", "/containers/%s?force=1" % c["Id"])
        self.remove([wid])  # the engine has nothing of it: the record and resources go

    def test_raw_args_merged_and_refused(self):
        msgs = self.create(deploy(1, raw_args=json.dumps({"cap_add": ["NET_ADMIN"]}).encode()))
        self.assertIn("NET_ADMIN", self.container(msgs[0].id)["HostConfig"]["CapAdd"])
        self.remove([msgs[0].id])
        before = len(self.dk.containers())
        t = pvtest.grpc_trailers(self.stack.gateways[0].addrs[0], "/pb.CoreRPC/CreateWorkload",
                                 deploy(1, raw_args=b"{not json").SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1074")
        self.assertIn("raw_args", t.get("grpc-message", ""))
        self.assertEqual(len(self.dk.containers()), before)  # nothing was created


class Exec(Base):
    def test_execute_output_env_workdir_exit_code(self):
        wid = self.create(deploy(1))[0].id
        req = core_pb2.ExecuteWorkloadOptions(
            workload_id=wid, commands=["/bin/sh", "-c",
                                       "pwd; echo $GREETING $APP_NAME; echo oops >&2; exit 4"],
            envs=["GREETING=hello"], workdir="/tmp")
        got = list(self.core.ExecuteWorkload(iter([req]), timeout=60))
        out = b"".join(m.data for m in got[:-1]).decode()
        app = self.container(wid)["Config"]["Labels"]["ERU_META"] and \
            dict(e.split("=", 1) for e in self.container(wid)["Config"]["Env"])["APP_NAME"]
        self.assertEqual(sorted(out.splitlines()), sorted(["/tmp", "hello " + app, "oops"]))
        self.assertEqual(got[-1].data.decode(), "[exitcode] 4")
        self.assertTrue(all(m.workload_id == wid for m in got))
        # the exec ran in the container: its processes are not the node's
        req = core_pb2.ExecuteWorkloadOptions(workload_id=wid, commands=["/bin/cat",
                                                                         "/etc/passwd"])
        out = b"".join(m.data for m in list(self.core.ExecuteWorkload(iter([req]),
                                                                      timeout=60))[:-1])
        self.assertEqual(out.splitlines()[0], b"root:x:0:0:root:/root:/bin/sh")
        self.remove([wid])

    def test_execute_with_stdin(self):
        wid = self.create(deploy(1))[0].id
        # the input's end (the client's half-close) ends the command's stdin: sort can answer
        first = core_pb2.ExecuteWorkloadOptions(workload_id=wid, open_stdin=True,
                                                commands=["/bin/sort", "-r"])
        feed = [core_pb2.ExecuteWorkloadOptions(repl_cmd=w) for w in (b"b\na\n", b"c\n")]
        got = [m.data for m in self.core.ExecuteWorkload(iter([first] + feed), timeout=60)]
        self.assertEqual(b"".join(got[:-1]), b"c\nb\na\n")
        self.assertEqual(got[-1], b"[exitcode] 0")
        # interactive: each reply comes back before the next line is sent (tr uppercases it)
        replies = queue.Queue()
        script = "while read line; do echo \"$line\" | tr a-z A-Z; done; exit 3"

        def lines_then_wait():
            yield core_pb2.ExecuteWorkloadOptions(workload_id=wid, open_stdin=True,
                                                  commands=["/bin/sh", "-c", script])
            for word in ("alpha", "beta"):
                yield core_pb2.ExecuteWorkloadOptions(repl_cmd=word.encode() + b"\n")
                self.assertEqual(replies.get(timeout=20), word.upper().encode() + b"\n")

        got = []
        for m in self.core.ExecuteWorkload(lines_then_wait(), timeout=60):
            got.append(m.data)
            replies.put(m.data)
        self.assertEqual(got, [b"ALPHA\n", b"BETA\n", b"[exitcode] 3"])
        # a client that leaves ends the command, not just the call
        stream = self.core.ExecuteWorkload(iter([core_pb2.ExecuteWorkloadOptions(
            workload_id=wid, open_stdin=True,
            commands=["/bin/sh", "-c", "echo started; exec sleep 318"])]), timeout=60)
        self.assertEqual(next(stream).data, b"started\n")
        stream.cancel()

        def sleeping():
            return subprocess.run(["pgrep", "-f", "^sleep 318$"],
                                  capture_output=True).returncode == 0
        deadline = time.monotonic() + 15
        while sleeping() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertFalse(sleeping())
        self.remove([wid])

    def test_execute_on_a_stopped_workload_fails(self):
        wid = self.create(deploy(1))[0].id
        self.control(wid, "stop")
        t = pvtest.grpc_trailers(self.stack.gateways[0].addrs[0], "/pb.CoreRPC/ExecuteWorkload",
                                 core_pb2.ExecuteWorkloadOptions(
                                     workload_id=wid, commands=["/bin/true"]).SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1079", t)
        self.assertIn("not running", t.get("grpc-message", ""))
        self.remove([wid])

    def test_run_and_wait(self):
        req = core_pb2.RunAndWaitOptions(deploy_options=deploy(1), cmd=b"/bin/echo hello there")
        msgs = list(self.core.RunAndWait(iter([req]), timeout=90))
        self.assertEqual(msgs[0].std_stream_type, core_pb2.TYPEWORKLOADID)
        wid = msgs[0].workload_id
        out = [m.data.decode() for m in msgs[1:]]
        self.assertEqual(out, ["hello there\n", "[exitcode] 0"])  # lines, as for the others
        self.assertIsNone(self.container(wid))  # removed at the end
        req = core_pb2.RunAndWaitOptions(deploy_options=deploy(1), cmd=b"/bin/false")
        msgs = list(self.core.RunAndWait(iter([req]), timeout=90))
        self.assertEqual(msgs[-1].data.decode(), "[exitcode] 1")
        self.assertIsNone(self.container(msgs[0].workload_id))

    def test_log_stream_tail_streams_follow(self):
        script = "echo out1; echo err1 >&2; echo out2; sleep 300"
        wid = self.create(deploy(1, commands=("/bin/sh", "-c", script)))[0].id

        def lines(**kw):
            return [(m.data.decode(), m.std_stream_type) for m in self.core.LogStream(
                core_pb2.LogStreamOptions(id=wid, **kw), timeout=30)]

        deadline = time.monotonic() + 10
        while len(lines(tail="all")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        got = lines(tail="all")
        self.assertEqual([d for d, t in got if t == core_pb2.STDOUT], ["out1", "out2"])
        self.assertEqual([d for d, t in got if t == core_pb2.STDERR], ["err1"])
        self.assertEqual(len(lines(tail="1")), 1)
        self.remove([wid])
        # follow: the lines as they come, to the workload's end
        wid = self.create(deploy(1, commands=("/bin/sh", "-c",
                                              "echo a; sleep 1; echo b; exit 3")))[0].id
        t0 = time.monotonic()
        got = [d for d, _ in lines(tail="all", follow=True)]
        self.assertEqual(got, ["a", "b"])
        self.assertGreater(time.monotonic() - t0, 0.5)
        self.assertEqual(self.container(wid)["State"]["ExitCode"], 3)
        self.remove([wid])

    def test_log_stream_since_until(self):
        wid = self.create(deploy(1, commands=("/bin/sh", "-c",
                                              "echo a1; sleep 2; echo b1; sleep 300")))[0].id
        deadline = time.monotonic() + 10
        while [m.data for m in self.core.LogStream(core_pb2.LogStreamOptions(id=wid),
                                                   timeout=30)] != [b"a1", b"b1"]:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.2)
        started = self.container(wid)["State"]["StartedAt"]
        base = time.mktime(time.strptime(started[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        # the daemon trims trailing zeros of the nanoseconds ("...:05.10881154Z")
        mid = base + float("0." + started[20:].rstrip("Z")) + 1.0

        def lines(**kw):
            return [m.data.decode() for m in self.core.LogStream(
                core_pb2.LogStreamOptions(id=wid, **kw), timeout=30)]

        self.assertEqual(lines(since="%.3f" % mid), ["b1"])
        self.assertEqual(lines(until="%.3f" % mid), ["a1"])
        self.assertEqual(lines(since="1h"), ["a1", "b1"])
        self.remove([wid])


class Files(Base):
    def read_back(self, wid, path):
        """(content, mode, uid, gid) of a file (content None: a directory) in the container,
        from its archive as the daemon gives it."""
        status, data = self.dk.raw("GET", "/containers/%s/archive?path=%s" % (
            self.container(wid)["Id"], path))
        self.assertEqual(status, 200, data[:300])
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            m = t.getmembers()[0]
            f = t.extractfile(m)  # None for a directory
            return f.read() if f else None, m.mode & 0o7777, m.uid, m.gid

    def test_send_copy_and_large_file(self):
        msgs = self.create(deploy(2))
        ids = [m.id for m in msgs]
        big = os.urandom(10000)
        got = list(self.core.Send(core_pb2.SendOptions(
            IDs=ids, data={"/etc/app/conf.ini": b"a=1\n", "/bin/tool": b"#!/bin/sh\necho t\n",
                           "/tmp/owned": b"x", "/etc/app/big": big},
            modes={"/etc/app/conf.ini": core_pb2.FileMode(mode=0o600)},
            owners={"/tmp/owned": core_pb2.FileOwner(uid=65534, gid=65534)}), timeout=60))
        self.assertEqual(sorted((g.id, g.path, g.error) for g in got),
                         sorted((i, p, "") for i in ids
                                for p in ("/etc/app/conf.ini", "/bin/tool", "/tmp/owned",
                                          "/etc/app/big")))
        for wid in ids:
            self.assertEqual(self.read_back(wid, "/etc/app/conf.ini"), (b"a=1\n", 0o600, 0, 0))
            self.assertEqual(self.read_back(wid, "/bin/tool")[1], 0o755)
            self.assertEqual(self.read_back(wid, "/tmp/owned")[1:], (0o755, 65534, 65534))
        # directories that were there keep their modes; the new one is 0755
        c = self.container(ids[0])["Id"]
        listing = self.dk.raw("GET", "/containers/%s/archive?path=/tmp" % c)[1]
        with tarfile.open(fileobj=io.BytesIO(listing)) as t:
            self.assertEqual(t.getmember("tmp").mode & 0o7777, 0o1777)
        self.assertEqual(self.read_back(ids[0], "/etc/app")[1], 0o755)
        # the file runs in the container
        req = core_pb2.ExecuteWorkloadOptions(workload_id=ids[0], commands=["/bin/tool"])
        got = [m.data for m in self.core.ExecuteWorkload(iter([req]), timeout=60)]
        self.assertEqual(got, [b"t\n", b"[exitcode] 0"])
        # Copy: the daemon's archive of a directory in 4 KiB chunks, named after the workload
        chunks = list(self.core.Copy(core_pb2.CopyOptions(targets={
            ids[0]: core_pb2.CopyPaths(paths=["/etc/app", "/nope"])}), timeout=60))
        data = b"".join(c.data for c in chunks if c.path == "/etc/app" and not c.error)
        self.assertGreater(len([c for c in chunks if c.path == "/etc/app"]), 1)
        self.assertTrue(all(len(c.data) <= 4096 for c in chunks))
        self.assertEqual({c.name for c in chunks if not c.error}, {msgs[0].name})
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            self.assertEqual(t.extractfile("app/conf.ini").read(), b"a=1\n")
            self.assertEqual(t.getmember("app/conf.ini").mode & 0o777, 0o600)
            self.assertEqual(t.extractfile("app/big").read(), big)
        nope = [c for c in chunks if c.path == "/nope"]
        self.assertEqual(len(nope), 1)
        self.assertIn("/nope", nope[0].error)
        # SendLargeFile: one file streamed in chunks, to both workloads
        blob = os.urandom(300 * 1024)
        reqs = [core_pb2.FileOptions(ids=ids, dst="/data/blob.bin", size=len(blob),
                                     mode=core_pb2.FileMode(mode=0o640),
                                     owner=core_pb2.FileOwner(uid=65534, gid=65534),
                                     chunk=blob[i:i + 65536])
                for i in range(0, len(blob), 65536)]
        got = list(self.core.SendLargeFile(iter(reqs), timeout=60))
        self.assertEqual(sorted((g.id, g.path, g.error) for g in got),
                         sorted((i, "/data/blob.bin", "") for i in ids))
        for wid in ids:
            self.assertEqual(self.read_back(wid, "/data/blob.bin"), (blob, 0o640, 65534, 65534))
        # a relative path is taken from the root
        got = list(self.core.Send(core_pb2.SendOptions(IDs=ids[:1], data={"relative": b"r"}),
                                  timeout=60))
        self.assertEqual([(g.path, g.error) for g in got], [("relative", "")])
        self.assertEqual(self.read_back(ids[0], "/relative")[0], b"r")
        self.remove(ids)

    def test_deploy_data_is_placed_before_start(self):
        opts = deploy(1, commands=("/bin/sh", "-c", "cat /conf/app.conf; ls -ln /conf; sleep 300"),
                      data={"/conf/app.conf": b"port=80\n"},
                      modes={"/conf/app.conf": core_pb2.FileMode(mode=0o640)},
                      owners={"/conf/app.conf": core_pb2.FileOwner(uid=65534, gid=65534)})
        wid = self.create(opts)[0].id
        self.assertEqual(self.read_back(wid, "/conf/app.conf"), (b"port=80\n", 0o640, 65534,
                                                                  65534))
        deadline = time.monotonic() + 10
        out = []
        while len(out) < 3 and time.monotonic() < deadline:
            out = [m.data.decode() for m in self.core.LogStream(
                core_pb2.LogStreamOptions(id=wid), timeout=30)]
            time.sleep(0.1)
        self.assertEqual(out[0], "port=80")  # the main process saw it when it started
        self.assertRegex(out[-1], r"^-rw-r----- +1 65534 +65534 +8 .* app\.conf$")
        self.remove([wid])


def build_context(files):
    """A build context tar of FILES {name: bytes} (a Dockerfile among them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Images(Base):
    def images_on(self, node, filt=""):
        got = list(self.core.ListImage(core_pb2.ListImageOptions(
            podname=POD, nodenames=[node], filter=filt), timeout=60))
        self.assertEqual([(m.nodename, m.err) for m in got], [(node, "")])
        return {t: i.id for i in got[0].images for t in i.tags}

    def busy_process_node(self):
        """A workload on the process node: the build pod's idlest node is then the docker one."""
        return self.create(deploy(1, node="pr", commands=("/bin/sh", "-c", "sleep 300")))[0].id

    def test_build_push_list_remove_cache_deploy(self):
        name = "%s/pivirt/app" % _reg.addr
        ctx = build_context({
            "Dockerfile": b"FROM demo:1\nRUN echo built > /built.txt\nCOPY hello /hello\n",
            "hello": b"hello from the context\n"})
        blocker = self.busy_process_node()
        msgs = list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name=name, tags=["v1", "v2"], build_method=core_pb2.BuildImageOptions.RAW, tar=ctx),
            timeout=120))
        self.remove([blocker])
        done = [m for m in msgs if m.status == "finished"]
        self.assertEqual(sorted(m.progress for m in done), [name + ":v1", name + ":v2"], msgs)
        self.assertEqual(len({m.id for m in done}), 1)
        self.assertTrue(done[0].id.startswith("sha256:"))
        self.assertTrue(any("Step 2/3 : RUN echo built" in m.stream for m in msgs), msgs)
        self.assertEqual(_reg.tags("pivirt/app"), ["v1", "v2"])  # pushed
        # ListImage on the docker node: the daemon's images, filtered
        listed = self.images_on("dk", name)
        self.assertEqual(sorted(listed), [name + ":v1", name + ":v2"])
        self.assertEqual(listed[name + ":v1"], done[0].id)
        self.assertIn("demo:1", self.images_on("dk"))
        # RemoveImage on the node leaves the registry's copy
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname=POD, nodenames=["dk"], images=[name + ":v2", name + ":nope"]), timeout=60))
        by = {m.image: m for m in got}
        self.assertTrue(by[name + ":v2"].success, got)
        self.assertFalse(by[name + ":nope"].success)
        self.assertNotIn(name + ":v2", self.images_on("dk"))
        self.assertEqual(_reg.tags("pivirt/app"), ["v1", "v2"])
        # CacheImage pulls it back from the registry
        got = list(self.core.CacheImage(core_pb2.CacheImageOptions(
            podname=POD, nodenames=["dk"], images=[name + ":v2"]), timeout=60))
        self.assertEqual([(m.image, m.success, m.nodename) for m in got],
                         [(name + ":v2", True, "dk")], got)
        self.assertEqual(self.images_on("dk", name + ":v2"), {name + ":v2": done[0].id})
        # a deploy of an image the node lacks pulls it first
        got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
            podname=POD, nodenames=["dk"], images=[name + ":v1"]), timeout=60))
        self.assertEqual([(m.image, m.success) for m in got], [(name + ":v1", True)])
        opts = deploy(1)
        opts.image = name + ":v1"
        wid = self.create(opts)[0].id
        req = core_pb2.ExecuteWorkloadOptions(workload_id=wid, commands=["/bin/cat", "/built.txt",
                                                                         "/hello"])
        got = [m.data for m in self.core.ExecuteWorkload(iter([req]), timeout=60)]
        self.assertEqual(b"".join(got[:-1]), b"built\nhello from the context\n")
        self.remove([wid])

    def test_exist_build_and_missing_image(self):
        wid = self.create(deploy(1))[0].id
        list(self.core.Send(core_pb2.SendOptions(IDs=[wid], data={"/state": b"kept\n"}),
                            timeout=60))
        name = "%s/pivirt/snap" % _reg.addr
        msgs = list(self.core.BuildImage(core_pb2.BuildImageOptions(
            name=name, tags=["s1"], build_method=core_pb2.BuildImageOptions.EXIST, exist_id=wid),
            timeout=120))
        self.assertEqual([m.progress for m in msgs if m.status == "finished"], [name + ":s1"])
        self.assertEqual(_reg.tags("pivirt/snap"), ["s1"])
        self.remove([wid])
        opts = deploy(1, commands=("/bin/sh", "-c", "cat /state; sleep 300"))
        opts.image = name + ":s1"
        wid = self.create(opts)[0].id
        req = core_pb2.ExecuteWorkloadOptions(workload_id=wid, commands=["/bin/cat", "/state"])
        self.assertEqual([m.data for m in self.core.ExecuteWorkload(iter([req]), timeout=60)],
                         [b"kept\n", b"[exitcode] 0"])
        self.remove([wid])
        # an image that is not in the registry fails its instance with the registry's answer
        opts = deploy(1)
        opts.image = "%s/pivirt/absent:1" % _reg.addr
        got = list(self.core.CreateWorkload(opts, timeout=60))
        self.assertEqual(len(got), 1)
        self.assertFalse(got[0].success)
        self.assertIn("absent", got[0].error)
        self.assertIn("not found", got[0].error)
        # a failing build step answers 1071 with the daemon's words
        bad = build_context({"Dockerfile": b"FROM demo:1\nRUN exit 3\n"})
        blocker = self.busy_process_node()
        t = pvtest.grpc_trailers(self.stack.gateways[0].addrs[0], "/pb.CoreRPC/BuildImage",
                                 core_pb2.BuildImageOptions(
                                     name=name, tags=["bad"], tar=bad,
                                     build_method=core_pb2.BuildImageOptions.RAW)
                                 .SerializeToString())
        self.remove([blocker])
        self.assertEqual(t.get("grpc-status"), "1071", t)
        self.assertIn("returned a non-zero code: 3", t.get("grpc-message", ""))


    def test_registry_credentials_are_sent(self):
        # the registry refuses an anonymous push straight through the daemon...
        anon = "%s/pivirt/anon" % _reg.addr
        self.dk.api("POST", "/images/demo:1/tag?repo=%s&tag=1" % anon)
        status, out = self.dk.raw("POST", "/images/%s/push?tag=1" % anon,
                                  headers={"X-Registry-Auth": "e30="})
        self.assertIn(b"no basic auth credentials", out, status)
        self.assertEqual(_reg.tags("pivirt/anon"), [])
        # ...pivirt's pushes carry registry.auths (X-Registry-Auth), and a build's FROM of an
        # image only the registry holds pulls with them (X-Registry-Config)
        base, top = "%s/pivirt/base" % _reg.addr, "%s/pivirt/top" % _reg.addr
        for name, dockerfile in ((base, b"FROM demo:1\nRUN echo base > /base.txt\n"),
                                 (top, ("FROM %s:b1\nRUN cat /base.txt\n" % base).encode())):
            blocker = self.busy_process_node()
            msgs = list(self.core.BuildImage(core_pb2.BuildImageOptions(
                name=name, tags=["b1"], build_method=core_pb2.BuildImageOptions.RAW,
                tar=build_context({"Dockerfile": dockerfile})), timeout=120))
            self.remove([blocker])
            self.assertEqual([m.progress for m in msgs if m.status == "finished"],
                             [name + ":b1"], msgs)
            if name == base:
                got = list(self.core.RemoveImage(core_pb2.RemoveImageOptions(
                    podname=POD, nodenames=["dk"], images=[base + ":b1"]), timeout=60))
                self.assertEqual([(m.image, m.success) for m in got], [(base + ":b1", True)])
        self.assertTrue(any("Pulling from pivirt/base" in m.stream for m in msgs), msgs)
        self.assertEqual((_reg.tags("pivirt/base"), _reg.tags("pivirt/top")), (["b1"], ["b1"]))


class Networks(Base):
    SUBNET = "172.29.7.0/24"

    def ping(self, wid, target):
        req = core_pb2.ExecuteWorkloadOptions(workload_id=wid, commands=[
            "/bin/ping", "-c", "1", "-W", "3", target])
        return [m.data for m in self.core.ExecuteWorkload(iter([req]), timeout=60)][-1]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        have = {n["Name"] for n in cls.dk.api("GET", "/networks")}
        for name, subnet in (("pvnet", cls.SUBNET), ("pvside", "172.29.8.0/24")):
            if name not in have:
                cls.dk.api("POST", "/networks/create", {
                    "Name": name, "IPAM": {"Config": [{"Subnet": subnet}]}})

    def test_publish_and_healthcheck(self):
        port = pvtest.free_port()
        script = ("mkdir -p /www; echo hello > /www/index.html; exec httpd -f -p %d -h /www"
                  % port)
        hc = core_pb2.HealthCheckOptions(http_port=str(port), url="/", code=200)
        m = self.create(deploy(1, commands=("/bin/sh", "-c", script), networks={"pvnet": ""},
                               entrypoint={"publish": [str(port)], "healthcheck": hc}))[0]
        ip = self.container(m.id)["NetworkSettings"]["Networks"]["pvnet"]["IPAddress"]
        key = "%d/tcp" % port
        # the container's address on its network, then the node's binding (and IPv6's, when
        # the daemon binds one: "[::]:PORT")
        self.assertEqual(m.publish[key].split(",")[:2], ["%s:%d" % (ip, port),
                                                         "0.0.0.0:%d" % port], m.publish)
        self.assertTrue(all(a.endswith(":%d" % port) for a in m.publish[key].split(",")))
        import urllib.request
        deadline = time.monotonic() + 10
        while True:  # the node's port, through docker-proxy
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=2) as r:
                    self.assertEqual(r.read(), b"hello\n")
                    break
            except OSError:
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.2)
        # the agent's healthcheck reaches it at its address on the network
        deadline = time.monotonic() + 10
        st = None
        while not (st and st.status and st.status[0].healthy):
            self.assertLess(time.monotonic(), deadline, st)
            time.sleep(0.2)
            try:
                st = self.core.GetWorkloadsStatus(core_pb2.WorkloadIDs(IDs=[m.id]), timeout=10)
            except grpc.RpcError as e:  # no status reported yet
                self.assertIn("not found", e.details())
        self.assertEqual(dict(st.status[0].networks), {"pvnet": ip})
        self.remove([m.id])

    def test_networks_list_connect_disconnect_and_reach(self):
        nets = self.core.ListNetworks(core_pb2.ListNetworkOptions(podname=POD), timeout=60)
        by = {n.name: list(n.subnets) for n in nets.networks}
        self.assertEqual(by.get("pvnet"), [self.SUBNET], by)
        self.assertIn("none", by)
        # two workloads deployed on the network reach each other, by address and by name
        msgs = self.create(deploy(2, networks={"pvnet": ""}))
        a, b = (self.container(m.id) for m in msgs)
        ip_b = b["NetworkSettings"]["Networks"]["pvnet"]["IPAddress"]
        self.assertTrue(ip_b.startswith("172.29.7."), ip_b)
        self.assertEqual(a["HostConfig"]["NetworkMode"], "pvnet")
        self.assertEqual(self.ping(msgs[0].id, ip_b), b"[exitcode] 0")
        self.assertEqual(self.ping(msgs[0].id, msgs[1].name), b"[exitcode] 0")
        # ConnectNetwork: a third one (on another network: a daemon without a default bridge
        # cannot plug a network into a container that started with none), with the address
        # asked for; DisconnectNetwork
        third = self.create(deploy(1, networks={"pvside": ""}))[0].id
        self.assertNotIn("pvnet", self.container(third)["NetworkSettings"]["Networks"])
        net = self.core.ConnectNetwork(core_pb2.ConnectNetworkOptions(
            network="pvnet", target=third, ipv4="172.29.7.50"), timeout=60)
        self.assertEqual((net.name, list(net.subnets)), ("pvnet", [self.SUBNET]))
        self.assertEqual(self.container(third)["NetworkSettings"]["Networks"]["pvnet"]
                         ["IPAddress"], "172.29.7.50")
        self.assertEqual(self.ping(msgs[0].id, "172.29.7.50"), b"[exitcode] 0")
        self.core.DisconnectNetwork(core_pb2.DisconnectNetworkOptions(
            network="pvnet", target=third), timeout=60)
        self.assertNotIn("pvnet", self.container(third)["NetworkSettings"]["Networks"])
        t = pvtest.grpc_trailers(self.stack.gateways[0].addrs[0], "/pb.CoreRPC/ConnectNetwork",
                                 core_pb2.ConnectNetworkOptions(network="nonet", target=third)
                                 .SerializeToString())
        self.assertEqual(t.get("grpc-status"), "1012", t)
        self.assertIn("nonet", t.get("grpc-message", ""))
        # RawEngine: not implemented by the docker engine, as Eru's
        t = pvtest.grpc_trailers(self.stack.gateways[0].addrs[0], "/pb.CoreRPC/RawEngine",
                                 core_pb2.RawEngineOptions(id=third, op="x").SerializeToString())
        self.assertEqual(t.get("grpc-status"), "12", t)
        self.assertIn("not implemented", t.get("grpc-message", ""))
        self.remove([m.id for m in msgs] + [third])


if __name__ == "__main__":
    pvtest.main()
