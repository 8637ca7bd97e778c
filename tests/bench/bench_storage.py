#!/usr/bin/python3
"""bench storage: sparse clones against cp, and CreateVolume/CreateSnapshot latency.

    PV_BUILD_DIR=<build dir> /usr/bin/python3 tests/bench/bench_storage.py [--calls N]

(`./ops/pivirt bench storage` runs it on the release build.) It starts its own Redis, gateway,
ops worker and node agent with the e2e harness, and a DIR pool on the system libvirtd, then:

  1. for a 100 GiB qcow2 volume holding 0, 100 MiB and 1 GiB of data (written with qemu-io),
     times CloneVolume through the gateway and `cp --sparse=always` of the same file in the same
     run (medians of 3 rounds, alternating), and reports the bytes each allocates. Goal: the empty clone <= 100 ms, the others
     <= 1.2 x the cp (cost follows the data, not the virtual size);
  2. times N (default 50) CreateVolume calls (1 GiB qcow2) and N CreateSnapshot calls, one
     after another, and prints p50/p99.
Figures are printed, not enforced: this machine is shared and noisy.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))
import pvtest  # noqa: E402

sys.path.insert(0, os.path.join(pvtest.BUILD_DIR, "py"))
from pivirt.storage.v1 import storage_pb2 as S, storage_pb2_grpc  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20
ROUNDS = 3


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def allocated(path):
    return os.stat(path).st_blocks * 512


def fill(path, nbytes):
    """Writes nbytes of non-zero data from the start, in 64 MiB requests."""
    off = 0
    while off < nbytes:
        n = min(64 * MiB, nbytes - off)
        r = subprocess.run(["qemu-io", "-f", "qcow2", "-c",
                            "write -P 0x5a %d %d" % (off, n), path], capture_output=True)
        if r.returncode != 0:
            raise RuntimeError("qemu-io: %s" % r.stderr.decode())
        off += n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    why = pvtest.ensure_libvirtd()
    if why:
        print("bench storage: %s" % why, file=sys.stderr)
        return 1
    stack = pvtest.Stack(gateways=1, workers=1, agents=[("bs1", "bench")],
                         config={"storage": {"default_node": "bs1"},
                                 "log": {"level": "warn"}})
    stack.start()
    pool_dir = os.path.join(stack.data_dir, "pools", "bench")
    st = storage_pb2_grpc.StorageServiceStub(stack.channel(0))
    made = []
    try:
        st.CreatePool(S.CreatePoolRequest(name="bench", type=S.POOL_TYPE_DIR,
                                          config={"path": pool_dir}), timeout=60)
        print("bench storage: clone of a 100 GiB qcow2 volume vs cp --sparse=always "
              "(same file, same run)")
        print("%-10s %12s %12s %14s %14s %8s" % ("data", "clone ms", "cp ms", "clone alloc",
                                                 "cp alloc", "ratio"))
        for label, data in (("0", 0), ("100 MiB", 100 * MiB), ("1 GiB", GiB)):
            src = st.CreateVolume(S.CreateVolumeRequest(
                name="src-%d" % data, pool="bench", size_bytes=100 * GiB,
                format=S.VOLUME_FORMAT_QCOW2), timeout=60)
            made.append(src.id)
            path = os.path.join(pool_dir, src.name)
            fill(path, data)
            clone_runs, cp_runs = [], []
            # The disk is shared and noisy: each is timed ROUNDS times, alternating, and the
            # medians are compared.
            for rnd in range(ROUNDS):
                subprocess.run(["sync"])
                t0 = time.monotonic()
                c = st.CloneVolume(S.CloneVolumeRequest(
                    source_id=src.id, name="clone-%d-%d" % (data, rnd)), timeout=300)
                clone_runs.append((time.monotonic() - t0) * 1000)
                made.append(c.id)
                clone_alloc = allocated(os.path.join(pool_dir, c.name))
                cp_dst = os.path.join(stack.tmpdir, "cp-%d" % data)
                subprocess.run(["sync"])
                t0 = time.monotonic()
                subprocess.run(["cp", "--sparse=always", path, cp_dst], check=True)
                subprocess.run(["sync", cp_dst])
                cp_runs.append((time.monotonic() - t0) * 1000)
                cp_alloc = allocated(cp_dst)
                os.unlink(cp_dst)
                st.DeleteVolume(S.DeleteVolumeRequest(id=c.id), timeout=60)
                made.remove(c.id)
            clone_ms, cp_ms = pct(clone_runs, 50), pct(cp_runs, 50)
            print("%-10s %12.1f %12.1f %14d %14d %8.2f" % (label, clone_ms, cp_ms, clone_alloc,
                                                         cp_alloc, clone_ms / max(cp_ms, 0.001)))
        print("(medians of %d rounds, clone and cp alternating)" % ROUNDS)
        print("goal: the empty clone <= 100 ms; the others <= 1.2 x cp")
        create, snap = [], []
        vol = None
        for i in range(args.calls):
            t0 = time.monotonic()
            vol = st.CreateVolume(S.CreateVolumeRequest(
                name="lat-%d" % i, pool="bench", size_bytes=GiB,
                format=S.VOLUME_FORMAT_QCOW2), timeout=60)
            create.append((time.monotonic() - t0) * 1000)
            made.append(vol.id)
        for i in range(args.calls):
            t0 = time.monotonic()
            st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=vol.id, name="s%d" % i),
                              timeout=60)
            snap.append((time.monotonic() - t0) * 1000)
        print("\nthrough the gateway, %d calls each, one at a time:" % args.calls)
        print("  CreateVolume   p50 %7.1f ms   p99 %7.1f ms" % (pct(create, 50), pct(create, 99)))
        print("  CreateSnapshot p50 %7.1f ms   p99 %7.1f ms" % (pct(snap, 50), pct(snap, 99)))
        return 0
    finally:
        for vid in made:
            try:
                st.DeleteVolume(S.DeleteVolumeRequest(id=vid), timeout=60)
            except Exception:
                pass
        try:
            st.DeletePool(S.DeletePoolRequest(name="bench"), timeout=60)
        except Exception:
            pass
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
