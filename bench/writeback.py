#!/usr/bin/env python3
"""Write-back versus write-through at the mount, home behind an emulated WAN.

Measures creates/s (open O_CREAT|O_EXCL + close of empty files) and 4 KiB fsync'd writes/s (pwrite + fsync
in one file) on: a plain local directory (the machine's baseline), larder write-back, larder write-through.
Home is a local directory behind `--emulate-wan latency=30ms` (per home call).

    bench/writeback.py [--latency 30ms] [--seconds 5] [--out bench/results/writeback.json]

Each figure is the count completed in a fixed time window (bounded in count too). Results: JSON plus a
table on stdout and as Markdown beside the JSON.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LARDER = os.environ.get("LARDER_BIN", os.path.join(ROOT, "target", "release", "larder"))


def creates(d, seconds, cap):
    os.makedirs(d, exist_ok=True)
    n, start = 0, time.monotonic()
    while n < cap and time.monotonic() - start < seconds:
        fd = os.open(os.path.join(d, f"f{n:06d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        n += 1
    return n / (time.monotonic() - start), n


def fsync_writes(path, seconds, cap):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    buf = os.urandom(4096)
    n, start = 0, time.monotonic()
    while n < cap and time.monotonic() - start < seconds:
        os.pwrite(fd, buf, (n % 256) * 4096)
        os.fsync(fd)
        n += 1
    elapsed = time.monotonic() - start
    os.close(fd)
    return n / elapsed, n


def run_larder(args, **kw):
    return subprocess.run([LARDER] + args, check=True, capture_output=True, text=True, **kw)


def measure(target, seconds, cap):
    c, cn = creates(os.path.join(target, "creates"), seconds, cap)
    w, wn = fsync_writes(os.path.join(target, "fsync.bin"), seconds, cap)
    return {"creates_per_s": round(c, 1), "creates": cn, "fsync_writes_per_s": round(w, 1), "fsync_writes": wn}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", default="30ms")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--cap", type=int, default=20000)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "writeback.json"))
    a = ap.parse_args()
    if not os.path.exists(LARDER):
        sys.exit(f"{LARDER} is missing: cargo build --release (or set LARDER_BIN)")
    results = {"latency": a.latency, "seconds": a.seconds}
    with tempfile.TemporaryDirectory(prefix="larder-bench-wb-", dir="/var/tmp") as work:
        plain = os.path.join(work, "plain")
        os.makedirs(plain)
        results["local_disk"] = measure(plain, a.seconds, a.cap)
        for mode in ["write-back", "write-through"]:
            home, mnt, cache = (os.path.join(work, f"{x}-{mode}") for x in ("home", "mnt", "cache"))
            for d in (home, mnt):
                os.makedirs(d)
            run_larder(["mount", home, mnt, "--cache-dir", cache, "--write-mode", mode,
                        "--emulate-wan", f"latency={a.latency}"])
            try:
                results[mode] = measure(mnt, a.seconds, a.cap)
                if mode == "write-back":
                    t0 = time.monotonic()
                    run_larder(["drain", mnt, "--timeout", "600s"])
                    results[mode]["drain_seconds"] = round(time.monotonic() - t0, 2)
            finally:
                subprocess.run([LARDER, "unmount", mnt, "--drain", "--timeout", "600s"], capture_output=True)
    wb, wt, ld = results["write-back"], results["write-through"], results["local_disk"]
    results["ratios"] = {
        "creates_write_back_over_write_through": round(wb["creates_per_s"] / max(wt["creates_per_s"], 1e-9), 1),
        "fsync_write_back_over_write_through": round(wb["fsync_writes_per_s"] / max(wt["fsync_writes_per_s"], 1e-9), 1),
        "creates_write_back_over_local_disk": round(wb["creates_per_s"] / max(ld["creates_per_s"], 1e-9), 3),
        "fsync_write_back_over_local_disk": round(wb["fsync_writes_per_s"] / max(ld["fsync_writes_per_s"], 1e-9), 3),
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print(f"home behind --emulate-wan latency={a.latency}; {a.seconds:.0f} s per figure")
    print(f"{'target':<16} {'creates/s':>12} {'4KiB fsync writes/s':>22}")
    for name in ["local_disk", "write-back", "write-through"]:
        r = results[name]
        print(f"{name:<16} {r['creates_per_s']:>12.1f} {r['fsync_writes_per_s']:>22.1f}")
    for k, v in results["ratios"].items():
        print(f"{k:<42} {v}")
    print(f"write-back drain after the run: {wb.get('drain_seconds')} s")
    print(f"JSON: {a.out}")
    md = os.path.splitext(a.out)[0] + ".md"
    with open(md, "w") as f:
        f.write(f"# Write-back vs write-through\n\nHome behind `--emulate-wan latency={a.latency}`; "
                f"{a.seconds:.0f} s per figure; `bench/writeback.py --seconds {a.seconds:.0f}`.\n\n")
        f.write("| target | creates/s | 4 KiB fsync'd writes/s |\n|---|---:|---:|\n")
        for name in ["local_disk", "write-back", "write-through"]:
            r = results[name]
            f.write(f"| {name} | {r['creates_per_s']:.1f} | {r['fsync_writes_per_s']:.1f} |\n")
        f.write("\n| ratio | value |\n|---|---:|\n")
        for k, v in results["ratios"].items():
            f.write(f"| {k} | {v} |\n")
        f.write(f"\nThe write-back queue reached home {wb.get('drain_seconds')} s after the run.\n")
    print(f"Markdown: {md}")


if __name__ == "__main__":
    main()
