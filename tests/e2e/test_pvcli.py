#!/usr/bin/python3
"""End-to-end tests of pvcli against a running stack: its table and JSON output, sizes and
ages for people, operations followed to their end (plain progress lines off a terminal) or
detached, the server's refusals (exit code 1, status and message) and usage errors (exit 2).
"""
import json
import os
import subprocess
import unittest

import pvtest

_stack = None


def setUpModule():
    global _stack
    why = pvtest.ensure_libvirtd()
    if why:
        raise RuntimeError(why)
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[("pc1", "local")],
                          config={"storage": {"default_node": "pc1"},
                                  "worker": {"heartbeat_seconds": 1}})
    _stack.start()


def tearDownModule():
    if _stack:
        for v in ("v1-clone", "v1"):
            pvcli("volume", "delete", v)
        pvcli("pool", "delete", "p1")
        _stack.stop()


def pvcli(*args):
    env = dict(os.environ, PIVIRT_ENDPOINT=_stack.gateways[0].addrs[0])
    r = subprocess.run([os.path.join(pvtest.BIN_DIR, "pvcli")] + list(args), env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def table(text):
    lines = [l for l in text.splitlines() if l.strip()]
    return [l.split() for l in lines]


class Pvcli(unittest.TestCase):
    def ok(self, *args):
        rc, out, err = pvcli(*args)
        self.assertEqual(rc, 0, "pvcli %s: %s %s" % (" ".join(args), out, err))
        return out, err

    def test_a_clusters_and_nodes(self):
        out, _ = self.ok("cluster", "create", "blue", "--version", "v1.0.0", "--labels", "env=prod")
        fields = dict(l.split(None, 1) for l in out.splitlines() if len(l.split(None, 1)) == 2)
        self.assertEqual((fields["name"], fields["status"], fields["version"]),
                         ("blue", "CREATING", "v1.0.0"))
        self.assertEqual(fields["labels"], "env=prod")
        out, _ = self.ok("cluster", "list")
        rows = table(out)
        self.assertEqual(rows[0], ["NAME", "STATUS", "VERSION", "AGE"])
        self.assertIn(["blue", "CREATING", "v1.0.0"], [r[:3] for r in rows[1:]])
        out, _ = self.ok("cluster", "list", "-o", "json")
        got = {j["name"]: j for j in map(json.loads, out.splitlines())}
        self.assertEqual(got["blue"]["status"], "CLUSTER_STATUS_CREATING")
        self.assertEqual(got["blue"]["labels"], {"env": "prod"})
        # a node operation followed to its end: plain progress lines off a terminal
        out, err = self.ok("node", "cordon", "local", "pc1")
        self.assertIn("[100%] node pc1 cordoned", err)
        out, _ = self.ok("node", "get", "local", "pc1", "-o", "json")
        self.assertEqual(json.loads(out)["status"], "NODE_STATUS_CORDONED")
        out, _ = self.ok("node", "uncordon", "local", "pc1", "--detach")
        self.assertTrue(out.strip().startswith("op-"), out)
        out, err = self.ok("op", "wait", out.strip())
        self.assertIn("[100%]", err)

    def test_b_storage(self):
        pool_dir = os.path.join(_stack.data_dir, "pools", "p1")
        out, _ = self.ok("pool", "create", "p1", "--type", "dir", "--config", "path=" + pool_dir)
        self.assertIn("ACTIVE", out)
        out, _ = self.ok("volume", "create", "v1", "--pool", "p1", "--size-bytes", "1G",
                         "--format", "qcow2", "--labels", "app=db")
        self.assertRegex(out, r"size_bytes\s+1 GiB")
        out, _ = self.ok("volume", "list", "p1")
        rows = table(out)
        self.assertEqual(rows[0], ["ID", "NAME", "POOL", "SIZE", "USED", "FORMAT", "STATUS"])
        row = [r for r in rows if "v1" in r][0]
        self.assertEqual(row[2:6], ["p1", "1", "GiB", row[5]])
        self.assertEqual(row[-2:], ["QCOW2", "READY"])
        out, _ = self.ok("volume", "resize", "v1", "2GiB")
        self.assertRegex(out, r"size_bytes\s+2 GiB")
        out, _ = self.ok("snapshot", "create", "v1", "s1", "-o", "json")
        snap = json.loads(out)
        self.assertEqual(snap["status"], "SNAPSHOT_STATUS_READY")
        out, err = self.ok("snapshot", "restore", snap["id"])
        self.assertIn("[100%]", err)
        self.ok("volume", "clone", "v1", "v1-clone")
        out, _ = self.ok("pool", "stats", "p1", "-o", "json")
        stats = json.loads(out)
        self.assertEqual((stats["volume_count"], stats["snapshot_count"]), (2, 1))

    def test_d_workloads(self):
        import tempfile
        with tempfile.TemporaryDirectory() as root:
            os.mkdir(os.path.join(root, "bin"))
            with open(os.path.join(root, "run.sh"), "w") as f:
                f.write("#!/bin/sh\necho hello from $APP_NAME\nsleep 300\n")
            os.chmod(os.path.join(root, "run.sh"), 0o755)
            with open(os.path.join(root, "hello.sh"), "w") as f:
                f.write("#!/bin/sh\necho linked\n")
            os.symlink("../hello.sh", os.path.join(root, "bin", "start"))
            # the directory archived by pvcli, sent as BuildImage RAW
            out, _ = self.ok("image", "build", "hi:1", root)
            self.assertEqual(table(out)[0], ["ID", "STATUS", "PROGRESS", "ERROR"])
            os.mkfifo(os.path.join(root, "fifo"))
            rc, _, err = pvcli("image", "build", "bad:1", root)
            self.assertEqual(rc, 2, err)
            self.assertIn("fifo: devices, fifos and sockets cannot go into an image", err)
        out, _ = self.ok("image", "list", "local")
        rows = table(out)
        self.assertEqual(rows[0], ["NODENAME", "TAGS", "ID", "ERR"])
        self.assertIn(["pc1", "hi:1"], [r[:2] for r in rows[1:]])
        out, _ = self.ok("image", "list", "local", "--filter", "nope*", "-o", "json")
        self.assertEqual(out, "")
        # a repository without a tag matches its every tag (as Eru's Docker engine filters)
        for f, want in (("hi", ["hi:1"]), ("h*", ["hi:1"]), ("hi:1", ["hi:1"]), ("hi:2", []),
                        ("hi/x", [])):
            out, _ = self.ok("image", "list", "local", "--filter", f, "-o", "json")
            got = [t for l in out.splitlines() for t in json.loads(l).get("tags", [])]
            self.assertEqual(got, want, f)
        # every instance failing (no such image on the node) is a failure of the command
        rc, out, err = pvcli("workload", "deploy", "hi", "--image", "nothere:1", "--count", "1",
                             "--podname", "local", "--entrypoint.name", "web",
                             "--entrypoint.commands", "/bin/true")
        self.assertEqual(rc, 1, (out, err))
        self.assertIn("pvcli: 1 of 1 failed", err)
        self.assertEqual([r[3] for r in table(out)[1:]], ["false"], out)
        deploy = ("--podname", "local", "--entrypoint.name", "web", "--resources",
                  'cpumem={"memory-request":"16M"}')
        out, _ = self.ok("capacity", "hi", "--count", "1", *deploy, "-o", "json")
        self.assertGreaterEqual(int(json.loads(out)["total"]), 1)
        out, _ = self.ok("workload", "deploy", "hi", "--image", "hi:1", "--count", "2",
                         "--entrypoint.commands", "/bin/sh", "--entrypoint.commands", "run.sh",
                         *deploy)
        rows = table(out)
        self.assertEqual(rows[0], ["ID", "NAME", "NODENAME", "SUCCESS", "ERROR"])
        self.assertEqual([r[3] for r in rows[1:]], ["true", "true"], out)
        ids = [r[0] for r in rows[1:]]
        out, _ = self.ok("workload", "list", "hi", "-o", "json")
        self.assertEqual(sorted(json.loads(l)["id"] for l in out.splitlines()), sorted(ids))
        deadline = pvtest.time.monotonic() + 10
        while pvtest.time.monotonic() < deadline:
            out, _ = self.ok("workload", "logs", ids[0], "--tail", "all")
            if "hello from hi" in out:
                break
            pvtest.time.sleep(0.2)
        self.assertEqual(out, "hello from hi\n")
        out, _ = self.ok("workload", "exec", ids[0], "/bin/sh", "-c", "echo $APP_NAME; pwd",
                         "--workdir", "/")
        self.assertEqual(out, "hi\n/\n")  # the command's output, nothing of pvcli's
        rc, out, _ = pvcli("workload", "exec", ids[0], "/bin/sh", "-c", "echo x; exit 3")
        self.assertEqual((rc, out), (3, "x\n"))
        out, _ = self.ok("workload", "exec", ids[0], "/bin/sh", "bin/start")  # the link kept
        self.assertEqual(out, "linked\n")
        out, _ = self.ok("workload", "remove", *ids)
        self.assertEqual(sorted(r[0] for r in table(out)[1:]), sorted(ids))
        out, _ = self.ok("workload", "list", "hi")
        self.assertEqual(len(table(out)), 1)  # the header only
        out, _ = self.ok("image", "remove", "local", "hi:1")
        self.assertEqual(table(out)[1][:2], ["hi:1", "true"])
        out, _ = self.ok("image", "list", "local", "-o", "json")
        self.assertNotIn("hi:1", out)
        out, _ = self.ok("image", "cache", "local", "hi:1")  # back from the registry
        self.assertEqual(table(out)[1][:3], ["hi:1", "pc1", "true"])
        out, _ = self.ok("image", "list", "local")
        self.assertIn(["pc1", "hi:1"], [r[:2] for r in table(out)[1:]])
        rc, out, err = pvcli("image", "cache", "local", "never:1")
        self.assertEqual(rc, 1, (out, err))
        self.assertEqual(table(out)[1][:3], ["never:1", "pc1", "false"])

    def test_c_refusals_and_usage(self):
        rc, out, err = pvcli("volume", "get", "nope")
        self.assertEqual(rc, 1)
        self.assertIn("NOT_FOUND: volume nope not found", err)
        rc, _, err = pvcli("volume", "create", "x", "--colour", "red")
        self.assertEqual(rc, 2)
        self.assertIn("has no field colour", err)
        rc, _, err = pvcli("volume", "create", "x", "--size-bytes", "10Q")
        self.assertEqual(rc, 2)
        self.assertIn("is not a size", err)
        rc, _, err = pvcli("volume", "create", "x", "--format", "floppy")
        self.assertEqual(rc, 2)
        self.assertIn("is not a value of pivirt.storage.v1.VolumeFormat", err)
        rc, _, _ = pvcli("volume")
        self.assertEqual(rc, 2)
        rc, _, _ = pvcli("frobnicate", "now")
        self.assertEqual(rc, 2)
        rc, out, _ = pvcli("--help")
        self.assertEqual(rc, 0)
        self.assertIn("Nouns: cluster, node, pool, volume, snapshot, op, pod, workload, image, capacity", out)
        rc, out, _ = pvcli("node", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("pvcli node drain", out)
        # the bash completion knows every verb pvcli has
        import re
        script = open(os.path.join(pvtest.SOURCE_DIR, "ops", "pvcli", "pvcli.bash")).read()
        for noun, verbs in re.findall(r'\[(\w+)\]="([^"]*)"', script):
            rc, out, _ = pvcli(noun, "--help")
            have = re.findall(r"pvcli %s (\S+)" % noun, out)
            self.assertEqual(sorted(have), sorted(verbs.split()), noun)

    def test_e_ctrl_c_detaches(self):
        # a long operation followed by `op wait`: SIGINT detaches and says how to go on
        from pivirt.operations.v1 import operations_pb2, operations_pb2_grpc
        ops = operations_pb2_grpc.OperationServiceStub(_stack.channel(0))
        op = ops.CreateTestOperation(operations_pb2.CreateTestOperationRequest(
            kind="test.sleep", target="ctrlc", params={"ms": "5000"}), timeout=10)
        env = dict(os.environ, PIVIRT_ENDPOINT=_stack.gateways[0].addrs[0])
        p = subprocess.Popen([os.path.join(pvtest.BIN_DIR, "pvcli"), "op", "wait", op.id],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # its first progress line comes after it set its SIGINT handler (a fixed pause was too
        # short on a loaded machine: the signal killed it before it had one)
        first = p.stderr.readline()
        self.assertRegex(first, r"^\[ *[0-9]+%\] ")
        p.send_signal(pvtest.signal.SIGINT)
        out, err = p.communicate(timeout=20)
        err = first + err
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("detached: operation %s goes on" % op.id, err)
        self.assertIn("pvcli op cancel %s" % op.id, err)
        got = ops.GetOperation(operations_pb2.GetOperationRequest(id=op.id), timeout=10)
        self.assertNotEqual(got.status, operations_pb2.OPERATION_STATUS_CANCELLED)


class PvcliAuth(unittest.TestCase):
    def test_credentials(self):
        stack = pvtest.Stack(gateways=1, config={"auth": {"username": "admin",
                                                          "password": "s3cret"}})
        stack.start(auth=("admin", "s3cret"))
        try:
            env = dict(os.environ, PIVIRT_ENDPOINT=stack.gateways[0].addrs[0])
            binary = os.path.join(pvtest.BIN_DIR, "pvcli")
            r = subprocess.run([binary, "pool", "list"], env=env, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("UNAUTHENTICATED", r.stderr)
            r = subprocess.run([binary, "pool", "list", "--user", "admin", "--password", "s3cret"],
                               env=env, capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split()[:3], ["NAME", "TYPE", "STATUS"])
            env.update(PIVIRT_USER="admin", PIVIRT_PASSWORD="nope")
            r = subprocess.run([binary, "pool", "list"], env=env, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertNotIn("s3cret", r.stderr)
        finally:
            stack.stop()


class PvcliTLS(unittest.TestCase):
    def test_tls_ca(self):
        key, crt, root = pvtest.make_tls_cert()
        stack = pvtest.Stack(gateways=1, config={"gateway": {"tls_cert": crt, "tls_key": key}})
        stack.start(tls_root=root)
        try:
            port = stack.gateways[0].addrs[0].rsplit(":", 1)[1]
            env = dict(os.environ, PIVIRT_ENDPOINT="localhost:" + port)
            binary = os.path.join(pvtest.BIN_DIR, "pvcli")
            r = subprocess.run([binary, "pool", "list", "--tls-ca", crt], env=env,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            env["PIVIRT_TLS_CA"] = crt
            r = subprocess.run([binary, "pool", "list"], env=env, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            # plaintext against a TLS port: the call fails, saying so, exit 1
            r = subprocess.run([binary, "pool", "list", "--timeout", "5"],
                               env=dict(env, PIVIRT_TLS_CA=""), capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn("UNAVAILABLE", r.stderr)
        finally:
            stack.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
