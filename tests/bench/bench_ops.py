#!/usr/bin/python3
"""bench ops: the operation pipeline's figures, side by side, in one run.

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/bench_ops.py [--seconds S]

(`./ops/pivirt bench ops` runs it on the release build.) It starts its own Redis, gateway and
workers on free ports in a temporary directory with the e2e harness (tests/e2e/pvtest.py),
drives them with tests/bench/bench_ops.c (build/bin/bench_ops) and redis-benchmark, and prints:

  1. the submit rate of test operations through the gateway (CreateTestOperation, test.sleep with
     ms=0, each on its own target, 200 calls in flight over raw HTTP/2), next to redis-benchmark
     calling the same Redis function (FCALL pv_op_submit, same keys and arguments, 50
     connections) on the same Redis: the ceiling, and the ratio; no worker runs meanwhile. Once
     with appendfsync always (ops/redis.conf: an acknowledged operation survives a Redis crash)
     and once with everysec (the previous default: a crash loses up to a second or more of
     acknowledged operations), so the cost of durability is measured in the same run;
  2. end-to-end no-op operations per second (submit -> worker -> SUCCEEDED) with two workers,
     and the p99 of submit->done at 5,000/s (or below, when the machine cannot submit that fast);
  3. the WaitOperation wake-up: from the record's finished_at to the answer at the client;
  4. dispatch at 1,000/s: from the submit (created_ms) to a worker holding it (started_ms);
  5. a large history: --history operations (1,000,000) retained, loaded through the same Redis
     functions by build/bin/bench_history (pipelined FCALL pv_op_submit + pv_op_cancel, kinds
     and targets repeating; appendfsync everysec during the load only); then ListOperations
     through the gateway (bench_history's C client, one call at a time) filtered by target and by
     kind (a page of 100 each; p50 and p99 of 200 calls, goal p99 <= 20 ms), and the time
     Redis takes to come back after a SIGKILL with that history (from the start of
     redis-server to its first PONG; goal <= 5 s), with the sizes of its append-only files;
     and how long ./ops/pivirt status takes to find a process's presence among those keys
     (its presence_ok, next to the SCAN it did before).

Times 2 to 4 come from the records (Redis's clock, ms resolution) and the client's clock, both
on this machine. Target names are unique per submit because a target is locked while its
operation is unfinished: a fixed h2load body would measure ABORTED answers. redis-benchmark can
only randomize with __rand_int__, so its keys are random 10-digit names under their own prefix;
a rare collision makes it stop on ALREADY_EXISTS or ABORTED, and that attempt is repeated.

Exit status 0 when every phase ran (the goals are reported, not enforced), 1 otherwise.
"""
import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import pvtest  # noqa: E402

BENCH = os.path.join(pvtest.BIN_DIR, "bench_ops")
HISTORY = os.path.join(pvtest.BIN_DIR, "bench_history")
PIVIRT = os.path.join(pvtest.SOURCE_DIR, "ops", "pivirt")
REDIS_BENCHMARK = (shutil.which("redis-benchmark", path=os.path.dirname(pvtest.REDIS_SERVER))
                   or shutil.which("redis-benchmark") or "redis-benchmark")
# One load generator submits tens of thousands of operations that no worker takes in phase 1:
# the per-client bound on unfinished operations (10000 by default) is lifted for it.
CONFIG = {"log": {"level": "warn"}, "gateway": {"max_pending_ops_per_client": 0}}

GOAL_SUBMIT = 10000
GOAL_RATIO = 0.40
GOAL_E2E = 5000
GOAL_E2E_P99 = 50.0
GOAL_WAKE_P99 = 20.0
GOAL_DISPATCH_P99 = 5.0
GOAL_LIST_P99 = 20.0
GOAL_RESTART = 5.0
HISTORY_TARGETS = 10000
HISTORY_KINDS = 10
LIST_CALLS = 200


class BenchError(Exception):
    pass


def run_bench(stack, *args, tag):
    argv = [BENCH, "--gateway", stack.gateways[0].addrs[0], "--redis", stack.redis.addr,
            "--prefix", stack.prefix, "--tag", tag] + [str(a) for a in args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = {}
    for line in r.stdout.splitlines():
        key, _, value = line.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    if r.returncode != 0:
        raise BenchError("bench_ops %s failed (exit %d): %s %s" %
                         (" ".join(map(str, args)), r.returncode, out.get("first_error", ""),
                          r.stderr.strip()[-500:]))
    return out


def redis_benchmark_once(port, attempt, requests):
    k = "pvceil%d:{ops}:" % attempt
    argv = [REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", str(port), "-n", str(requests), "-c", "50",
            "-r", "2147483647", "--csv",
            "FCALL", "pv_op_submit", "5",
            k + "op:op-__rand_int__", k + "q:ops", k + "index", k + "events",
            k + "lock:bench-__rand_int__",
            k, "op-__rand_int__", "test.sleep", "bench-__rand_int__", "ops", '{"ms":"0"}',
            '{"ms":"0"}', "", "1", "[]", "100000", "1", "86400"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    rows = [row for row in csv.reader(io.StringIO(r.stdout)) if row and row[0] != "test"]
    if r.returncode != 0 or not rows:
        return None, (r.stderr or r.stdout).strip()[-300:]
    return float(rows[-1][1]), None


def redis_benchmark(stack, requests):
    """The best of two clean runs (a run that hit a random-key collision is repeated)."""
    rates, last_err = [], None
    for attempt in range(8):
        rate, err = redis_benchmark_once(stack.redis.port, attempt, requests)
        if rate is None:
            last_err = err
            continue
        rates.append(rate)
        if len(rates) == 2:
            break
    if not rates:
        raise BenchError("redis-benchmark FCALL pv_op_submit never completed: %s" % last_err)
    return max(rates)


def verdict(ok):
    return "meets the goal" if ok else "MISSES the goal"


def phase_submit(seconds, appendfsync):
    # bench_ops reads the records straight from Redis without logging in: no ACL users here.
    with pvtest.Stack(gateways=1, config=CONFIG, redis_acl=False,
                      redis_appendfsync=appendfsync) as st:
        got = st.redis.cmd("CONFIG", "GET", "appendfsync")[1]
        if got != appendfsync:
            raise BenchError("Redis runs with appendfsync %s, not %s" % (got, appendfsync))
        run_bench(st, "--count", 3000, tag="warm")
        gw = run_bench(st, "--seconds", seconds, tag="submit")
        ceiling = redis_benchmark(st, max(20000, int(gw["submit_rate"] * seconds)))
        threads = st.config.get("gateway", {}).get("threads", "default (4)")
    return gw, ceiling, threads


def list_latency(stack, n, target="", kind=""):
    """p50, p99 (ms) of n ListOperations calls with the filter (a page of the default 100) from
    build/bin/bench_history's C client, and the page size."""
    argv = [HISTORY, "--gateway", stack.gateways[0].addrs[0], "--calls", str(n)]
    if target:
        argv += ["--list-target", target]
    if kind:
        argv += ["--list-kind", kind]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    out = dict(line.partition("=")[::2] for line in r.stdout.splitlines())
    if r.returncode != 0:
        raise BenchError("ListOperations failed (exit %d): %s %s" %
                         (r.returncode, out.get("first_error", ""), r.stderr.strip()[-300:]))
    return float(out["list_p50_ms"]), float(out["list_p99_ms"]), int(out["list_page"])


def aof_sizes(redis):
    """Bytes of the base (RDB preamble) and incremental files of the append-only directory."""
    d = os.path.join(redis.dir, "appendonlydir")
    base = incr = 0
    for name in os.listdir(d):
        size = os.path.getsize(os.path.join(d, name))
        if ".base." in name:
            base += size
        elif ".incr." in name:
            incr += size
    return base, incr


def wait_rewrite_done(redis, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = redis.cmd("INFO", "persistence")
        if "aof_rewrite_in_progress:0" in info and "aof_rewrite_scheduled:0" in info:
            return
        time.sleep(0.2)
    raise BenchError("an AOF rewrite still runs after %d s" % timeout)


def restart_seconds(redis):
    """SIGKILL, then the time from starting redis-server on the same files to its first PONG."""
    redis.kill9()
    t0 = time.monotonic()
    redis.start(timeout=300)
    return time.monotonic() - t0


def status_check_ms(stack, worker, by_scan):
    """How long ./ops/pivirt status takes to find the worker's presence, in ms, and whether it
    did: its own presence_ok (the script sourced, pointed at this stack's Redis and prefix), or
    with by_scan what it did before, redis-cli --scan over the keyspace for the kind's keys
    (under the same 5 s timeout: on a big keyspace it gives up, and status said "down")."""
    env = dict(pvtest._clean_env(), PIVIRT_REDIS_PORT=str(stack.redis.port),
               PIVIRT_KEY_PREFIX=stack.prefix, PIVIRT_DATA_DIR=os.path.join(stack.tmpdir, "none"))
    if by_scan:
        script = ('source "$1"; redis_cli --scan --pattern "${KEY_PREFIX}presence:worker:*" '
                  '| grep -q presence')
    else:
        script = 'source "$1"; presence_ok worker "$2"'
    argv = ["bash", "-c", script, "bash", PIVIRT, str(worker.pid)]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    ms = (time.monotonic() - t0) * 1000
    if r.returncode != 0 and not by_scan:
        raise BenchError("status's presence check did not find worker pid %d: %s" %
                         (worker.pid, r.stderr.strip()))
    return ms, r.returncode == 0


def phase_history(count):
    # The worker is there for status's presence check; it reads a queue the history is not on.
    with pvtest.Stack(gateways=1, workers=1, config=CONFIG, redis_acl=False) as st:
        argv = [HISTORY, "--redis", st.redis.addr, "--prefix", st.prefix, "--count", str(count),
                "--targets", str(HISTORY_TARGETS), "--kinds", str(HISTORY_KINDS)]
        # The load is not what is measured: an fsync per pass of a pipelined load would make
        # it take many minutes. Everything after it runs with the shipped setting.
        st.redis.cmd("CONFIG", "SET", "appendfsync", "everysec")
        r = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
        st.redis.cmd("CONFIG", "SET", "appendfsync", "always")
        out = dict(line.partition("=")[::2] for line in r.stdout.splitlines())
        if r.returncode != 0:
            raise BenchError("bench_history failed (exit %d): %s %s" %
                             (r.returncode, out.get("first_error", ""), r.stderr.strip()[-500:]))
        retained = int(st.redis.cmd("ZCARD", st.key("{ops}:index")))
        lists = {
            "target": list_latency(st, LIST_CALLS, target="hist-t%d" % (HISTORY_TARGETS // 2)),
            "kind": list_latency(st, LIST_CALLS, kind="hist.k%d" % (HISTORY_KINDS // 2)),
            "none": list_latency(st, LIST_CALLS),
        }
        keys = int(st.redis.cmd("DBSIZE"))
        status_ms = (status_check_ms(st, st.workers[0], False),
                     status_check_ms(st, st.workers[0], True))
        mem = [ln for ln in st.redis.cmd("INFO", "memory").split("\r\n")
               if ln.startswith("used_memory_human:")][0].split(":")[1]
        wait_rewrite_done(st.redis)
        sizes = aof_sizes(st.redis)
        restart = restart_seconds(st.redis)
        # The worst case the rewrite thresholds allow: the incremental file just below the
        # share of the base that starts a rewrite (auto-aof-rewrite-percentage), all of it to
        # replay. Made by a rewrite now, then more operations in small batches until the file
        # passes 80% of that share, then the kill at once.
        pct = int(st.redis.cmd("CONFIG", "GET", "auto-aof-rewrite-percentage")[1])
        wait_rewrite_done(st.redis)
        try:
            st.redis.cmd("BGREWRITEAOF")
        except pvtest.RedisError as e:
            if "already in progress" not in str(e):
                raise
        wait_rewrite_done(st.redis)
        base = aof_sizes(st.redis)[0]
        step = max(1000, count // 400)
        extra = 0
        st.redis.cmd("CONFIG", "SET", "appendfsync", "everysec")
        while aof_sizes(st.redis)[1] < base * pct / 100 * 0.8 and extra < count:
            more = argv[:]
            more[more.index("--count") + 1] = str(step)
            subprocess.run(more + ["--tag", "late%d" % extra], capture_output=True, text=True,
                           timeout=600, check=True)
            extra += step
        st.redis.cmd("CONFIG", "SET", "appendfsync", "always")
        worst_sizes = aof_sizes(st.redis)
        worst = restart_seconds(st.redis)
        retained_after = int(st.redis.cmd("ZCARD", st.key("{ops}:index")))
    return (float(out["seconds"]), float(out["rate"]), retained, lists, mem, sizes, restart,
            worst_sizes, worst, retained_after, keys, status_ms)


def phase_pipeline(seconds):
    with pvtest.Stack(gateways=1, workers=2, config=CONFIG, redis_acl=False) as st:
        run_bench(st, "--count", 2000, "--collect", 60, tag="warm")
        sat = run_bench(st, "--seconds", seconds, "--collect", 120, tag="sat")
        rate = min(GOAL_E2E, int(sat["e2e_rate"] * 0.9))
        paced = run_bench(st, "--seconds", seconds, "--rate", rate, "--collect", 60, tag="paced")
        disp = run_bench(st, "--seconds", seconds, "--rate", 1000, "--collect", 60, tag="disp")
        wake = run_bench(st, "--count", 1000, "--rate", 200, "--ms", 50, "--wait",
                         "--concurrency", 400, tag="wake")
    return sat, rate, paced, disp, wake


def main():
    ap = argparse.ArgumentParser(description="operation pipeline benchmark")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each timed phase")
    ap.add_argument("--history", type=int, default=1000000,
                    help="retained operations of phase 5 (0: skip it)")
    a = ap.parse_args()
    for path in (BENCH, HISTORY, os.path.join(pvtest.BIN_DIR, "pivirt-gateway"),
                 os.path.join(pvtest.BIN_DIR, "pivirt-worker")):
        if not os.access(path, os.X_OK):
            print("bench ops: %s is not built" % path, file=sys.stderr)
            return 1
    load = os.getloadavg()[0]
    try:
        print("bench ops: phase 1/3, submit rate (gateway, then redis-benchmark), "
              "appendfsync always then everysec ...", file=sys.stderr)
        gw, ceiling, threads = phase_submit(a.seconds, "always")
        gw_es, ceiling_es, _ = phase_submit(a.seconds, "everysec")
        print("bench ops: phase 2/3, pipeline with 2 workers ...", file=sys.stderr)
        sat, paced_rate, paced, disp, wake = phase_pipeline(a.seconds)
        hist = None
        if a.history > 0:
            print("bench ops: phase 3/3, %d retained operations (loading them takes a while) ..."
                  % a.history, file=sys.stderr)
            hist = phase_history(a.history)
    except (BenchError, AssertionError, RuntimeError, subprocess.TimeoutExpired) as e:
        print("bench ops: error: %s" % e, file=sys.stderr)
        return 1

    ratio = gw["submit_rate"] / ceiling if ceiling else 0
    print()
    print("bench ops: %d CPUs (load %.1f at start), gateway threads %s, 2 workers, %.0f s per "
          "phase" % (os.cpu_count() or 0, load, threads, a.seconds))
    print("  1. submit: CreateTestOperation through the gateway vs. the Redis function alone")
    print("     appendfsync always (shipped: an acknowledged operation survives a Redis crash)")
    print("     gateway                %9.0f /s   p50 %.1f ms, p99 %.1f ms, 200 in flight" %
          (gw["submit_rate"], gw["submit_p50_ms"], gw["submit_p99_ms"]))
    print("     redis-benchmark FCALL  %9.0f /s   pv_op_submit, same keys and args, -c 50" %
          ceiling)
    print("     appendfsync everysec (a crash loses what was acknowledged in the last second+)")
    print("     gateway                %9.0f /s   p50 %.1f ms, p99 %.1f ms, 200 in flight" %
          (gw_es["submit_rate"], gw_es["submit_p50_ms"], gw_es["submit_p99_ms"]))
    print("     redis-benchmark FCALL  %9.0f /s" % ceiling_es)
    print("     always / everysec      %9.2f      of the gateway's submit rate" %
          (gw["submit_rate"] / gw_es["submit_rate"] if gw_es["submit_rate"] else 0))
    print("     ratio                  %9.2f      goal >= %d/s and >= %.2f of the ceiling: %s" %
          (ratio, GOAL_SUBMIT, GOAL_RATIO,
           verdict(gw["submit_rate"] >= GOAL_SUBMIT and ratio >= GOAL_RATIO)))
    print("  2. end to end (submit -> worker -> SUCCEEDED), test.sleep ms=0")
    print("     saturated              %9.0f /s   %d of %d succeeded; goal >= %d/s: %s" %
          (sat["e2e_rate"], sat["ops_succeeded"], sat["ops_total"], GOAL_E2E,
           verdict(sat["e2e_rate"] >= GOAL_E2E)))
    print("     submit->done at %5d/s %7.1f ms p99 (p50 %.1f ms, %.0f/s submitted); "
          "goal <= %.0f ms at %d/s: %s" %
          (paced_rate, paced["e2e_p99_ms"], paced["e2e_p50_ms"], paced["submit_rate"],
           GOAL_E2E_P99, GOAL_E2E,
           verdict(paced_rate >= GOAL_E2E and paced["e2e_p99_ms"] <= GOAL_E2E_P99)))
    print("  3. WaitOperation wake-up (finished_at -> answer at the client), %d waits" %
          wake["waits_woken"])
    print("     p99                    %7.1f ms   p50 %.1f ms; goal <= %.0f ms: %s" %
          (wake["wake_p99_ms"], wake["wake_p50_ms"], GOAL_WAKE_P99,
           verdict(wake["wake_p99_ms"] <= GOAL_WAKE_P99)))
    print("  4. dispatch (submit acknowledged -> a worker holds it) at 1000/s")
    print("     p99                    %7.1f ms   p50 %.1f ms (%.0f/s submitted); goal <= %.0f ms: %s"
          % (disp["dispatch_p99_ms"], disp["dispatch_p50_ms"], disp["submit_rate"],
             GOAL_DISPATCH_P99, verdict(disp["dispatch_p99_ms"] <= GOAL_DISPATCH_P99)))
    if hist:
        (load_s, load_rate, retained, lists, mem, sizes, restart, worst_sizes, worst,
         retained_after, keys, status_ms) = hist
        print("  5. history: %d operations retained (loaded in %.0f s, %.0f/s, through "
              "pv_op_submit + pv_op_cancel), Redis used_memory %s" %
              (retained, load_s, load_rate, mem))
        for name, what in (("target", "by target (%d operations each)" %
                            (a.history // HISTORY_TARGETS)),
                           ("kind", "by kind (%d operations each)" % (a.history // HISTORY_KINDS)),
                           ("none", "unfiltered")):
            p50, p99, size = lists[name]
            goal = (" goal p99 <= %.0f ms: %s" % (GOAL_LIST_P99, verdict(p99 <= GOAL_LIST_P99))
                    if name != "none" else "")
            print("     ListOperations %-34s p50 %5.1f ms, p99 %5.1f ms, page %d;%s" %
                  (what, p50, p99, size, goal))
        (by_name, _), (by_scan, scan_found) = status_ms
        print("     ops/pivirt status finds a worker's presence in %.0f ms by its key's name; a "
              "SCAN of the %d keys, as it did before: %s after %.1f s" %
              (by_name, keys, "found" if scan_found else "NOT found (timed out)", by_scan / 1000))
        print("     Redis back after SIGKILL  %5.2f s   append-only files: base %.0f MB, "
              "incremental %.0f MB; goal <= %.0f s: %s" %
              (restart, sizes[0] / 1e6, sizes[1] / 1e6, GOAL_RESTART,
               verdict(restart <= GOAL_RESTART)))
        print("     ... just before a rewrite %5.2f s   base %.0f MB, incremental %.0f MB "
              "(the most the rewrite thresholds leave to replay), %d retained; goal <= %.0f s: "
              "%s" % (worst, worst_sizes[0] / 1e6, worst_sizes[1] / 1e6, retained_after,
                      GOAL_RESTART, verdict(worst <= GOAL_RESTART)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
