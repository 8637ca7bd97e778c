"""`pivirt-scheduler plan` end to end: the real binary, JSON on stdin, for every one of Eru's 47
reference strategy cases (tests/fixtures/strategy_cases.json): exact plan objects (in the order of
`nodes`, FILL's explicit zeros included) with exit 0, or the error kind and message with exit 1.
Then input that is not a request: exit 2 and a message naming the field, nothing on stdout."""
import json
import os
import subprocess
import unittest

SOURCE_DIR = os.environ.get("PV_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_DIR = os.environ.get("PV_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
BIN = os.path.join(BUILD_DIR, "bin", "pivirt-scheduler")


def plan(text):
    if not isinstance(text, str):
        text = json.dumps(text)
    p = subprocess.run([BIN, "plan"], input=text, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


class PlanCli(unittest.TestCase):
    def test_reference_cases(self):
        with open(os.path.join(SOURCE_DIR, "tests", "fixtures", "strategy_cases.json")) as f:
            cases = json.load(f)["cases"]
        self.assertEqual(len(cases), 47)
        for i, c in enumerate(cases):
            req = {k: c[k] for k in ("strategy", "need", "limit", "total", "nodes")}
            rc, out, err = plan(req)
            with self.subTest(case=i, strategy=c["strategy"]):
                self.assertNotIn("runtime error", err)
                self.assertNotIn("Sanitizer", err)
                if "expect" in c:
                    self.assertEqual(rc, 0, err)
                    got = json.loads(out)
                    self.assertEqual(got, {"plan": c["expect"]})
                    order = [n["name"] for n in c["nodes"] if n["name"] in c["expect"]]
                    self.assertEqual(list(got["plan"]), order)
                    if "expect_final_counts_sorted" in c:
                        final = sorted(n["count"] + got["plan"].get(n["name"], 0)
                                       for n in c["nodes"])
                        self.assertEqual(final, c["expect_final_counts_sorted"])
                else:
                    self.assertEqual(rc, 1, out + err)
                    e = json.loads(out)["error"]
                    self.assertEqual(e["kind"], c["expect_error"]["kind"])
                    self.assertIn(c["expect_error"]["contains"], e["message"])

    def test_output_format(self):
        rc, out, _ = plan({"strategy": "AUTO", "need": 3, "limit": 0, "total": 10,
                           "nodes": [{"name": "n1", "capacity": 10, "count": 2,
                                      "usage": 0.5, "rate": 0.1}]})
        self.assertEqual((rc, out), (0, '{"plan":{"n1":3}}\n'))
        rc, out, _ = plan({"strategy": "AUTO", "need": 30, "total": 10,
                           "nodes": [{"name": "n1", "capacity": 10}]})
        self.assertEqual(rc, 1)
        self.assertEqual(json.loads(out), {"error": {
            "kind": "ErrInsufficientResource",
            "message": "need: 30, available: 10: cannot alloc a plan, not enough resource"}})

    def test_total_defaults_to_sum_of_capacities(self):
        nodes = [{"name": "a", "capacity": 2}, {"name": "b", "capacity": 1}]
        rc, out, _ = plan({"strategy": "DRAINED", "need": 3, "nodes": nodes})
        self.assertEqual((rc, json.loads(out)), (0, {"plan": {"a": 2, "b": 1}}))
        rc, out, _ = plan({"strategy": "DRAINED", "need": 4, "nodes": nodes})
        self.assertEqual(rc, 1)
        self.assertIn("need: 4, available: 3", json.loads(out)["error"]["message"])

    def test_unknown_strategy_names_it(self):
        rc, out, _ = plan({"strategy": "SPREAD", "need": 1, "nodes": []})
        self.assertEqual(rc, 1)
        self.assertEqual(json.loads(out)["error"], {
            "kind": "ErrInvaildDeployStrategy",
            "message": 'strategy: "SPREAD": deploy method not support yet'})

    def test_bad_input(self):
        node = {"name": "n1", "capacity": 1}
        cases = [
            ("{", "input: not valid JSON"),
            ("[]", "input: must be a JSON object"),
            ({"need": 1, "nodes": []}, "strategy: must be a string"),
            ({"strategy": "AUTO", "nodes": []}, "need: is required"),
            ({"strategy": "AUTO", "need": "3", "nodes": []}, "need: must be an integer"),
            ({"strategy": "AUTO", "need": 1}, "nodes: must be an array"),
            ({"strategy": "AUTO", "need": 1, "nodes_limit": 1, "nodes": []},
             "nodes_limit: unknown field"),
            ({"strategy": "AUTO", "need": 1, "limit": -1, "nodes": []},
             "limit: -1 must not be negative"),
            ({"strategy": "AUTO", "need": 1, "nodes": [{"capacity": 1}]},
             "nodes[0].name: must be a non-empty string"),
            ({"strategy": "AUTO", "need": 1, "nodes": [{"name": "a"}]},
             "nodes[0].capacity: is required"),
            ({"strategy": "AUTO", "need": 1, "nodes": [{"name": "a", "capacity": -2}]},
             "nodes[0].capacity: -2 must not be negative"),
            ({"strategy": "AUTO", "need": 1, "nodes": [{"name": "a", "capacity": 1, "cpu": 1}]},
             "nodes[0].cpu: unknown field"),
            ({"strategy": "AUTO", "need": 1, "nodes": [node, dict(node)]},
             'nodes: name "n1" appears twice'),
            ('{"strategy":"AUTO","strategy":"FILL","need":1,"nodes":[]}', "duplicate"),
        ]
        for req, msg in cases:
            with self.subTest(req=req):
                rc, out, err = plan(req)
                self.assertEqual(rc, 2)
                self.assertEqual(out, "")
                self.assertIn(msg, err)

    def test_help(self):
        p = subprocess.run([BIN, "plan", "--help"], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0)
        self.assertIn("usage: pivirt-scheduler plan", p.stdout)


if __name__ == "__main__":
    unittest.main()
