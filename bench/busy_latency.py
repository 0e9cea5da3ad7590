#!/usr/bin/env python3
"""Request latency while the mount is busy with small scattered writes.

A probe process does one small request cycle every 20 ms (create or open a 1-byte file, write it, stat it,
close it: four requests to the file system) and records how long each cycle took, while writer processes
do what xfstests' `fstest` does (generic/074): each writes files of --size in 512-byte pieces at a 1 KiB
stride (so that no two pieces touch and every file holds --size / 1 KiB separate written ranges), closes
them, reads them back and checks every byte, for --loops rounds. The same runs on the local disk (the
baseline: a directory beside the cache) and on a larder mount whose home is a local directory; ratios
compare figures of the same run.

    bench/busy_latency.py [--writers 3] [--files 3] [--size 16MiB] [--loops 2] [--label NAME]
                          [--out bench/results/busy-latency-NAME.json]

Reports, for each target: the probe's cycles, p50, p99 and worst cycle time, and the writers' wall time.
Results: JSON, a table on stdout and as Markdown beside the JSON. Bounded: every writer run stops after
--max-seconds, and the probe with it.
"""
import argparse
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LARDER = os.environ.get("LARDER_BIN", os.path.join(ROOT, "target", "release", "larder"))
PIECE, STRIDE = 512, 1024


def piece(loop, child, fnum, offset):
    """The bytes of the piece at `offset`: different for every loop, writer, file and offset."""
    b = bytes([(loop * 7 + child * 13 + fnum * 29 + offset // STRIDE) % 251 + 1])
    return b * PIECE


def writer(d, child, files, size, loops, deadline):
    os.makedirs(d, exist_ok=True)
    for loop in range(loops):
        for fnum in range(files):
            path = os.path.join(d, f"file{fnum}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            for off in range(0, size, STRIDE):
                os.pwrite(fd, piece(loop, child, fnum, off), off)
            os.close(fd)
            if time.monotonic() > deadline:
                sys.exit(3)
        for fnum in range(files):
            fd = os.open(os.path.join(d, f"file{fnum}"), os.O_RDONLY)
            for off in range(0, size, STRIDE):
                if os.pread(fd, PIECE, off) != piece(loop, child, fnum, off):
                    sys.exit(f"writer {child}: file{fnum} differs at {off} in loop {loop}")
            os.close(fd)


def probe(d, stop, out):
    os.makedirs(d, exist_ok=True)
    times, i = [], 0
    while not stop.is_set() and i < 100_000:
        path = os.path.join(d, f"p{i % 64}")
        t = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"x")
        os.fstat(fd)
        os.close(fd)
        times.append(time.perf_counter() - t)
        i += 1
        time.sleep(0.02)
    out.put(times)


def pct(sorted_times, q):
    return sorted_times[min(len(sorted_times) - 1, int(len(sorted_times) * q))]


def measure(target, a):
    stop, out = mp.Event(), mp.Queue()
    p = mp.Process(target=probe, args=(os.path.join(target, "probe"), stop, out))
    p.start()
    time.sleep(1.0)
    deadline = time.monotonic() + a.max_seconds
    start = time.monotonic()
    ws = [mp.Process(target=writer, args=(os.path.join(target, f"w{c}"), c, a.files, a.size, a.loops, deadline))
          for c in range(a.writers)]
    for w in ws:
        w.start()
    for w in ws:
        w.join(max(1.0, deadline - time.monotonic() + 30))
    wall = time.monotonic() - start
    codes = [w.exitcode for w in ws]
    for w in ws:
        if w.is_alive():
            w.kill()
    stop.set()
    times = sorted(out.get(timeout=60))
    p.join(30)
    return {
        "writers_seconds": round(wall, 2),
        "writers_ok": all(c == 0 for c in codes),
        "writer_exit_codes": codes,
        "probe_cycles": len(times),
        "probe_p50_ms": round(pct(times, 0.50) * 1e3, 2),
        "probe_p99_ms": round(pct(times, 0.99) * 1e3, 2),
        "probe_max_ms": round(times[-1] * 1e3, 2),
    }


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.lower().removesuffix("ib").removesuffix("b")
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--files", type=int, default=3)
    ap.add_argument("--size", default="16MiB")
    ap.add_argument("--loops", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--label", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--out")
    a = ap.parse_args()
    a.size = parse_size(a.size)
    out = a.out or os.path.join(ROOT, "bench", "results", f"busy-latency-{a.label}.json")
    if not os.path.exists(LARDER):
        sys.exit(f"{LARDER} is missing: cargo build --release -p larder (or set LARDER_BIN)")
    results = {
        "larder": LARDER,
        "writers": a.writers, "files": a.files, "size": a.size, "loops": a.loops,
        "command": " ".join(sys.argv),
    }
    with tempfile.TemporaryDirectory(prefix="larder-bench-busy-", dir="/var/tmp") as work:
        local = os.path.join(work, "local")
        os.makedirs(local)
        results["local_disk"] = measure(local, a)
        home, mnt, cache = (os.path.join(work, x) for x in ("home", "mnt", "cache"))
        for d in (home, mnt):
            os.makedirs(d)
        subprocess.run([LARDER, "mount", home, mnt, "--cache-dir", cache], check=True)
        try:
            results["larder"] = measure(mnt, a)
            results["larder_status"] = json.loads(subprocess.run(
                [LARDER, "status", mnt, "--json"], capture_output=True, text=True, check=True).stdout).get("cache")
        finally:
            subprocess.run([LARDER, "unmount", mnt, "--leave-pending"], check=False)
    loc, lar = results["local_disk"], results["larder"]
    results["ratios"] = {k: round(lar[k] / loc[k], 2) if loc[k] else None
                         for k in ("writers_seconds", "probe_p50_ms", "probe_p99_ms", "probe_max_ms")}
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)
    rows = [("", "local disk", "larder", "larder / local")]
    for k, label in (("writers_seconds", "writers' time (s)"), ("probe_p50_ms", "probe p50 (ms)"),
                     ("probe_p99_ms", "probe p99 (ms)"), ("probe_max_ms", "probe worst (ms)"),
                     ("probe_cycles", "probe cycles")):
        rows.append((label, str(loc[k]), str(lar[k]), str(results["ratios"].get(k, ""))))
    table = "\n".join("| " + " | ".join(r) + " |" + ("\n| --- | --- | --- | --- |" if i == 0 else "")
                      for i, r in enumerate(rows))
    md = (f"# Request latency under scattered small writes ({a.label})\n\n"
          f"`{results['command']}`: {a.writers} writers, {a.files} files each of {a.size} bytes in 512-byte "
          f"pieces at a 1 KiB stride, {a.loops} loops; a probe cycle (create/open, write 1 byte, fstat, "
          f"close) every 20 ms. Writers verified every byte: local {loc['writers_ok']}, larder "
          f"{lar['writers_ok']}.\n\n{table}\n")
    with open(out.removesuffix(".json") + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    main()
