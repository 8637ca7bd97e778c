"""End-to-end tests of which pb.CoreRPC streams report per item and which fail the whole call,
as Eru's rpc/rpc.go and cluster/calcium do.

Eru fails a streaming call only when the request as a whole is unusable; what goes wrong for one
workload goes into that workload's message (its error field) and the call ends OK. Read through
`buf curl` (pvtest.buf_curl), which shows the messages and Eru's non-canonical status codes
(code_1077) alike. Real processes: redis-server, a gateway, a scheduler, an ops worker and a node
agent (process engine, pod "sp") running the workloads from an image the test writes.

Classes:
  PerItem     CreateWorkload with no plan that fits: one message, error only ("need: 2,
              available: N ... not enough resource"), status OK; RunAndWait likewise: an empty
              TYPEWORKLOADID then ERUERROR "Create workload failed ...". An id that names no
              workload: ControlWorkload {id, error} beside the known ids' answers; Send {id,
              error} (no path) beside the known ones' {id, path}; SendLargeFile {id, error};
              Copy one {id, path, error} per path asked; ExecuteWorkload {workload_id, data: the
              error}; LogStream {id, error}: every one status OK.
  WholeCall   DissociateWorkload looks every id up first: an unknown id fails the call with 1077
              naming it, also beside known ids (which stay: record and resources), and so does
              an empty list; known ids each get {id}. (RemoveWorkload, which also looks every
              id up first, answers 1076: test_core_deploy.)
  Pvcli       pvcli counts those per-item failures: exit 1 with "N of M failed" for a deploy
              with no plan; `workload logs` and `workload exec` of an unknown id exit 1 naming it.
"""
import base64
import json
import os
import subprocess
import unittest

import pvtest
from pb import core_pb2, core_pb2_grpc
from test_core_deploy import make_image  # demo:1, the image those tests deploy

_stack = None
POD, NODE = "sp", "spa"
UNKNOWN = "f" * 64
NOT_FOUND = "workload %s not found" % UNKNOWN


def setUpModule():
    global _stack
    _stack = pvtest.Stack(gateways=1, workers=1, schedulers=1, agents=[(NODE, POD)])
    _stack.start()
    make_image(os.path.join(_stack.data_dir, "images", "demo", "1.tar"))


def tearDownModule():
    _stack.stop()


def deploy_json(name, count=1, memory="16M", commands=("/bin/sh", "-c", "sleep 300")):
    return {"name": name, "podname": POD, "image": "demo:1", "count": count,
            "entrypoint": {"name": "web", "commands": list(commands)},
            "resources": {"cpumem": base64.b64encode(
                json.dumps({"memory-request": memory}).encode()).decode()}}


def call(method, *bodies):
    """Calls pb.CoreRPC/METHOD with the BODIES (one message each); returns (code, messages,
    message): code 0 and every message of an OK stream, or Eru's code (1077, ...) and the
    status message of a failed call."""
    data = "".join(json.dumps(b) for b in bodies)
    rc, out, err = _stack.buf_curl("-d", "@-", _stack.url(0, "/pb.CoreRPC/" + method),
                                   check=False, data=data)
    if rc != 0:
        status = json.loads(err)
        return int(status["code"].replace("code_", "")), [], status.get("message", "")
    msgs, dec, i = [], json.JSONDecoder(), 0
    while out[i:].strip():
        i += len(out[i:]) - len(out[i:].lstrip())
        m, i = dec.raw_decode(out, i)
        msgs.append(m)
    return 0, msgs, ""


def b64(text):
    return base64.b64encode(text.encode()).decode()


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.core = core_pb2_grpc.CoreRPCStub(_stack.channel(0))

    def deploy(self, name):
        code, msgs, _ = call("CreateWorkload", deploy_json(name))
        self.assertEqual(code, 0)
        self.assertTrue(msgs[0].get("success"), msgs)
        return msgs[0]["id"]

    def remove(self, *ids):
        list(self.core.RemoveWorkload(core_pb2.RemoveWorkloadOptions(IDs=list(ids), force=True),
                                      timeout=60))


class PerItem(Base):
    def test_create_without_a_plan_is_one_failed_message(self):
        code, msgs, _ = call("CreateWorkload", deploy_json("noplan", count=2, memory="1P"))
        self.assertEqual(code, 0)
        self.assertEqual(len(msgs), 1, msgs)
        self.assertEqual(list(msgs[0]), ["error"])  # success false, no id, node, pod
        self.assertIn("need: 2, available: 0", msgs[0]["error"])
        self.assertIn("cannot alloc a plan, not enough resource", msgs[0]["error"])

    def test_run_and_wait_without_a_plan_tells_it_in_the_stream(self):
        code, msgs, _ = call("RunAndWait", {"deployOptions": deploy_json("noplanrun", count=1,
                                                                         memory="1P")})
        self.assertEqual(code, 0)
        self.assertEqual(len(msgs), 2, msgs)
        self.assertEqual(msgs[0], {"stdStreamType": "TYPEWORKLOADID"})
        self.assertEqual(sorted(msgs[1]), ["data", "stdStreamType"])
        self.assertEqual(msgs[1]["stdStreamType"], "ERUERROR")
        text = base64.b64decode(msgs[1]["data"]).decode()
        self.assertTrue(text.startswith("Create workload failed need: 1, available: 0"), text)

    def test_control_answers_an_unknown_id_beside_the_known(self):
        wid = self.deploy("ctl")
        try:
            code, msgs, _ = call("ControlWorkload", {"IDs": [UNKNOWN, wid], "type": "stop"})
            self.assertEqual(code, 0)
            self.assertEqual(msgs, [{"id": UNKNOWN, "error": NOT_FOUND}, {"id": wid}])
        finally:
            self.remove(wid)

    def test_send_answers_an_unknown_id_without_a_path(self):
        wid = self.deploy("snd")
        try:
            code, msgs, _ = call("Send", {"IDs": [UNKNOWN, wid],
                                          "data": {"/etc/a": b64("x"), "/etc/b": b64("y")}})
            self.assertEqual(code, 0)
            self.assertEqual(msgs[0], {"id": UNKNOWN, "error": NOT_FOUND})
            self.assertEqual(sorted(m["path"] for m in msgs[1:]), ["/etc/a", "/etc/b"])
            self.assertEqual([sorted(m) for m in msgs[1:]], [["id", "path"]] * 2)
        finally:
            self.remove(wid)

    def test_send_large_file_answers_an_unknown_id(self):
        code, msgs, _ = call("SendLargeFile",
                             {"ids": [UNKNOWN], "dst": "/big", "size": 4, "chunk": b64("abcd")})
        self.assertEqual(code, 0)
        self.assertEqual(msgs, [{"id": UNKNOWN, "error": NOT_FOUND}])

    def test_copy_answers_each_path_of_an_unknown_id(self):
        code, msgs, _ = call("Copy", {"targets": {UNKNOWN: {"paths": ["/a", "/b"]}}})
        self.assertEqual(code, 0)
        self.assertEqual(msgs, [{"id": UNKNOWN, "path": "/a", "error": NOT_FOUND},
                                {"id": UNKNOWN, "path": "/b", "error": NOT_FOUND}])

    def test_execute_answers_an_unknown_id_in_its_data(self):
        code, msgs, _ = call("ExecuteWorkload", {"workloadId": UNKNOWN, "commands": ["/bin/true"]})
        self.assertEqual(code, 0)
        self.assertEqual(msgs, [{"workloadId": UNKNOWN, "data": b64(NOT_FOUND)}])
        code, msgs, _ = call("ExecuteWorkload", {"workloadId": UNKNOWN, "commands": ["/bin/cat"],
                                                 "openStdin": True})
        self.assertEqual(code, 0)
        self.assertEqual(msgs, [{"workloadId": UNKNOWN, "data": b64(NOT_FOUND)}])

    def test_log_stream_answers_an_unknown_id(self):
        code, msgs, _ = call("LogStream", {"id": UNKNOWN, "tail": "all"})
        self.assertEqual(code, 0)
        self.assertEqual(msgs, [{"id": UNKNOWN, "error": NOT_FOUND}])


class WholeCall(Base):
    def test_dissociate_fails_on_any_unknown_id(self):
        code, _, msg = call("DissociateWorkload", {"IDs": [UNKNOWN]})
        self.assertEqual((code, msg), (1077, NOT_FOUND))
        code, _, msg = call("DissociateWorkload", {"IDs": []})
        self.assertEqual((code, msg), (1077, "IDs: no workload ids given"))
        wid = self.deploy("dis")
        before = self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=NODE)), timeout=10).resource_usage
        code, _, msg = call("DissociateWorkload", {"IDs": [wid, UNKNOWN]})
        self.assertEqual((code, msg), (1077, NOT_FOUND))
        # nothing was let go: the known one keeps its record and its resources
        self.assertEqual(self.core.GetWorkload(core_pb2.WorkloadID(id=wid), timeout=10).id, wid)
        self.assertEqual(self.core.GetNodeResource(core_pb2.GetNodeResourceOptions(
            opts=core_pb2.GetNodeOptions(nodename=NODE)), timeout=10).resource_usage, before)
        code, msgs, _ = call("DissociateWorkload", {"IDs": [wid]})
        self.assertEqual((code, msgs), (0, [{"id": wid}]))
        code, _, msg = call("GetWorkload", {"id": wid})
        self.assertEqual((code, msg), (1051, "workload %s not found" % wid))
        # its process runs on, let go of: ended here through the engine's state
        with open(os.path.join(_stack.data_dir, "engine", NODE, wid, "record.json")) as f:
            os.kill(json.load(f)["pid"], 9)


class Pvcli(Base):
    def pvcli(self, *args):
        """(exit status, stdout, stderr) of pvcli ARGS against the stack's gateway."""
        r = subprocess.run([os.path.join(pvtest.BIN_DIR, "pvcli"), "--endpoint",
                            _stack.gateways[0].addrs[0], *args], capture_output=True, text=True,
                           timeout=120)
        return r.returncode, r.stdout, r.stderr

    def test_per_item_failures_exit_1(self):
        rc, out, err = self.pvcli("workload", "deploy", "cli", "--image", "demo:1", "--count", "2",
                             "--podname", POD, "--entrypoint.name", "web",
                             "--entrypoint.commands", "/bin/true",
                             "--resources", 'cpumem={"memory-request":"1P"}')
        self.assertEqual(rc, 1, (out, err))
        self.assertIn("pvcli: 1 of 1 failed", err)
        self.assertIn("need: 2, available: 0", out)
        rc, out, err = self.pvcli("workload", "logs", UNKNOWN)
        self.assertEqual((rc, out), (1, ""), err)
        self.assertIn("pvcli: %s: %s" % (UNKNOWN, NOT_FOUND), err)
        rc, out, err = self.pvcli("workload", "exec", UNKNOWN, "/bin/true")
        self.assertEqual((rc, out), (1, NOT_FOUND), err)
        self.assertIn("pvcli: no exit code came: the command did not run", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
