"""The chaos tool's own logic, without processes (CTest chaos_selftest, label
unit): the schedule is a function of the seed, steps lost and the replica's
lag are told apart, survivors re-formed in place are counted, and the
comparison names the first differing tensor."""
import json
import os
import struct
import sys
import tempfile
import unittest
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos  # noqa: E402


def args(seed, faults=10, steps=200, kinds=("worker", "agent")):
    return SimpleNamespace(seed=seed, faults=faults, steps=steps, kinds=list(kinds))


class FakeJob:
    """rank<R>.log lines in memory."""

    def __init__(self, logs):
        self.logs = logs

    def log_lines(self, rank):
        return self.logs[rank]


class ScheduleTest(unittest.TestCase):
    def test_same_seed_same_schedule(self):
        self.assertEqual(chaos.make_schedule(args(7)), chaos.make_schedule(args(7)))
        self.assertNotEqual(chaos.make_schedule(args(7)), chaos.make_schedule(args(8)))

    def test_bounded_spaced_and_spread(self):
        s = chaos.make_schedule(args(3, faults=20, steps=100))
        steps = [x[0] for x in s]
        self.assertEqual(len(s), 20)
        self.assertTrue(all(4 <= x < 96 for x in steps))
        self.assertTrue(all(b - a >= 2 for a, b in zip(steps, steps[1:])))
        self.assertEqual(sum(1 for x in s if x[2] == "worker"), 10)
        self.assertTrue(all(0 <= x[1] < 1 and 0 <= x[3] < 1 for x in s))

    def test_too_few_steps_is_an_error(self):
        with self.assertRaises(SystemExit):
            chaos.make_schedule(args(1, faults=30, steps=50))


class StepsLostTest(unittest.TestCase):
    # Two ranks commit 0..5; the job restarts at t=1000 (a fault at t=900).
    def logs(self, resumed, rank1_last=5):
        r0 = ["start 0 1 -1"] + ["commit %d %d" % (s, 100 + s) for s in range(6)]
        r1 = ["start 0 2 -1"] + ["commit %d %d" % (s, 100 + s) for s in range(rank1_last + 1)]
        r0.append("start 1000 3 %d" % resumed)
        r1.append("start 1000 4 %d" % resumed)
        return FakeJob([r0, r1])

    def test_resume_from_the_newest_common_step_loses_nothing(self):
        self.assertEqual(chaos.steps_lost(self.logs(5), 2, [(900, "worker")], False),
                         ([], [], 1))
        # rank 1 one step behind: the common step is 4
        self.assertEqual(chaos.steps_lost(self.logs(4, 4), 2, [(900, "worker")], False),
                         ([], [], 1))

    def test_worker_fault_loses_a_step(self):
        self.assertEqual(chaos.steps_lost(self.logs(4), 2, [(900, "worker")], False),
                         ([(5, 4, "worker")], [], 1))

    def test_agent_fault_one_step_is_the_replica_lag(self):
        self.assertEqual(chaos.steps_lost(self.logs(4), 2, [(900, "agent")], False),
                         ([], [(5, 4)], 1))
        # with a spare, a worker fault restores from the replica too
        self.assertEqual(chaos.steps_lost(self.logs(4), 2, [(900, "worker")], True),
                         ([], [(5, 4)], 1))

    def test_fresh_start_after_an_agent_fault_is_lost(self):
        self.assertEqual(chaos.steps_lost(self.logs(-1), 2, [(900, "agent")], False),
                         ([(5, -1, "agent")], [], 1))


class InPlaceTest(unittest.TestCase):
    # Four ranks, two per node; a worker fault kills rank 1, then an agent
    # fault the node of ranks 2 and 3. Each start line: "start <ns> <pid> <step>".
    def job(self, rank0_pids):
        pids = [rank0_pids, ["11", "12", "12"], ["21", "21", "22"], ["31", "31", "32"]]
        return FakeJob([["start %d %s 0" % (i, p) for i, p in enumerate(ps)] for ps in pids])

    def test_survivors_kept_their_processes(self):
        got = chaos.in_place(self.job(["1", "1", "1"]), 4, [(5, "worker"), (9, "agent")], 2)
        self.assertEqual(got, (5, 3, 5, 3))

    def test_a_survivor_restarted_as_a_process_is_seen(self):
        kept, fresh, survivors, victims = chaos.in_place(
            self.job(["1", "1", "2"]), 4, [(5, "worker"), (9, "agent")], 2)
        self.assertLess(kept, survivors)
        self.assertGreater(fresh, victims)
        self.assertEqual(chaos.in_place(FakeJob([[]] * 4), 4, [(5, "replica")], 2), (0, 0, 0, 0))


class CompareTest(unittest.TestCase):
    def write(self, d, rank, tensors):
        with open(os.path.join(d, "final_rank%d.json" % rank), "w") as f:
            json.dump({"step": 9, "tensors": tensors}, f)

    def test_names_the_first_difference(self):
        def t(name, values):
            return {"name": name, "dtype": "float32", "shape": [len(values)],
                    "hex": struct.pack("<%df" % len(values), *values).hex()}
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            for d in (a, b):
                self.write(d, 0, [t("w", [1, 2]), t("b", [3])])
            self.write(a, 1, [t("w", [1, 2]), t("b", [3])])
            self.write(b, 1, [t("w", [1, 2.5]), t("b", [4])])
            self.assertIsNone(chaos.compare(a, a, 2))
            diff = chaos.compare(a, b, 2)
            self.assertEqual(diff, "rank 1 tensor 'w' (float32 [2]) differs at element 1: "
                                   "2.0 (with faults) vs 2.5 (without)")
            self.assertIn("rank 2 wrote no final parameters", chaos.compare(a, a, 3))


if __name__ == "__main__":
    unittest.main()
