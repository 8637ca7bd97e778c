#!/usr/bin/python3
"""The short form of `./ops/pivirt soak`: 25 s of mixed load on the three APIs (deploys and
removals of process workloads, volumes with snapshots and clones, cordons, test operations)
from four clients through two gateways, while gateways, schedulers, ops workers and node agents
are SIGKILLed at random and started again. Nothing acknowledged may be lost, every operation
must end, every failed call must carry a reason, and the audit (pivirt-check) must find no
difference afterwards.
"""
import os
import sys
import unittest

import pvtest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import soak  # noqa: E402


class Soak(unittest.TestCase):
    def test_mixed_load_with_kills_loses_nothing(self):
        stack = soak.make_stack()
        stack.start()
        try:
            soak.prepare(stack)
            s = soak.Soak(stack, 25, clients=4, chaos=True, seed=11,
                          log=lambda line: print(line, flush=True))
            missing, settled = s.run()
            differences = stack.check()
        finally:
            stack.stop(check=False)
        self.assertEqual(missing, [])
        self.assertEqual(differences, [])
        self.assertTrue(settled, "operations still pending or running at the end")
        self.assertGreater(sum(s.kills.values()), 0)
        for kind in ("deploy", "remove", "volume", "operation"):
            self.assertGreater(s.done[kind], 0, kind)
        for (action, code, reason), n in s.failed.items():
            self.assertTrue(reason, (action, code))
        # failures are the exception, not the rule
        self.assertLess(sum(s.failed.values()), sum(s.done.values()) / 4, dict(s.failed))


if __name__ == "__main__":
    pvtest.main()
