#!/usr/bin/env python3
"""What checking the cache's blocks before the kernel is given a cache file costs (design note 002,
"Checksums"): every block is checked once per daemon life, before its first read and before the first
passthrough open of its file, at the open up to --verify-at-open (256 MiB by default), in the background
past it while the daemon serves that open.

    bench/verify.py [--size 1GiB] [--files 10] [--out bench/results/verify-DATE]

With LARDER_BIN (default target/release/larder). A home of --files files of --size bytes on the local
disk; one mount reads them all (the cold fill, no link emulation), then, each figure after an unmount,
a mount again and the page cache dropped (so that every byte comes from the disk, as after a reboot):
  1. the first open of one cached file after the restart, and its first whole read: by default (the file
     is past 256 MiB: checked in the background, that open served by the daemon) and with the check made
     at the open (--verify-at-open above the file's size), against the same file read straight from the
     disk (direct) in the same run;
  2. a restarted mount of the whole cache (--files × --size): every file read once in turn, then once
     more (page cache dropped): how long until the mount reads at the local disk's speed, against the same
     reads straight from the disk.
Results: JSON and a Markdown table (OUT.json, OUT.md), also printed. Every loop is bounded in count and
time; every mount is cleaned up on exit.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import harness as H
from harness import MiB, cleanup, drop_caches, larder_mount, log, parse_size, run, seq_read, unmount

ROUNDS = 3


def open_seconds(path):
    t0 = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    secs = time.monotonic() - t0
    os.close(fd)
    return round(secs, 4)


def restart(home, mnt, cache, flags):
    unmount("larder", mnt)
    larder_mount(home, mnt, cache, flags)
    drop_caches()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=1 << 30)
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--work", default="/var/tmp/larder-bench-verify")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 time.strftime("verify-%Y-%m-%d")))
    a = ap.parse_args()
    H.on_signals()
    home, mnt, cache = (os.path.join(a.work, d) for d in ("home", "mnt", "cache"))
    os.makedirs(home, exist_ok=True)
    names = [f"f{i}" for i in range(a.files)]
    for n in names:
        p = os.path.join(home, n)
        if not os.path.exists(p) or os.path.getsize(p) != a.size:
            log(f"verify: writing {a.size / MiB:.0f} MiB at home ({n})")
            H.write_random(p, a.size)
    run(["rm", "-rf", cache])
    base = ["--validity-lag", "1h", "--cache-size", f"{a.files * a.size * 2 // MiB}MiB"]
    sync = base + ["--verify-at-open", f"{2 * a.size // MiB}MiB"]
    res = {"size": a.size, "files": a.files, "rounds": ROUNDS, "env": H.environment()}
    try:
        larder_mount(home, mnt, cache, base)
        log("verify: the cold fill")
        for n in names:
            seq_read(os.path.join(mnt, n), 600)
        one = os.path.join(mnt, names[0])
        samples = {k: [] for k in ("direct", "open_background", "read_background", "open_at_open", "read_at_open",
                                   "read_again")}
        for i in range(ROUNDS):
            drop_caches()
            samples["direct"].append(seq_read(os.path.join(home, names[0]), 600)["MiB_s"])
            for flags, key in [(base, "background"), (sync, "at_open")]:
                restart(home, mnt, cache, flags)
                samples[f"open_{key}"].append(open_seconds(one))
                samples[f"read_{key}"].append(seq_read(one, 600)["MiB_s"])
            # Checked by now: the kernel reads it from the cache file.
            drop_caches()
            samples["read_again"].append(seq_read(one, 600)["MiB_s"])
        res["one_file"] = {k: {"median": median(v), "samples": v} for k, v in samples.items()}
        # The whole cache after a restart, file by file, twice; and the same straight from the disk.
        log("verify: the whole cache after a restart")
        drop_caches()
        t0 = time.monotonic()
        direct = [seq_read(os.path.join(home, n), 600)["MiB_s"] for n in names]
        direct_secs = time.monotonic() - t0
        restart(home, mnt, cache, base)
        t0 = time.monotonic()
        first = []
        for n in names:
            first.append(seq_read(os.path.join(mnt, n), 600)["MiB_s"])
        first_secs = time.monotonic() - t0
        drop_caches()
        t0 = time.monotonic()
        second = [seq_read(os.path.join(mnt, n), 600)["MiB_s"] for n in names]
        second_secs = time.monotonic() - t0
        st = H.larder_status(mnt) or {}
        res["whole_cache"] = {
            "direct_MiB_s": direct, "direct_seconds": round(direct_secs, 2),
            "first_pass_MiB_s": first, "first_pass_seconds": round(first_secs, 2),
            "second_pass_MiB_s": second, "second_pass_seconds": round(second_secs, 2),
            "daemon_reads": H.get(st, "efficiency", "reads"),
            "corrupt_blocks": H.get(st, "cache", "corrupt_blocks"),
        }
    finally:
        cleanup()
    o, w = res["one_file"], res["whole_cache"]
    d = o["direct"]["median"]

    def together(key):
        # The open's check reads the file, through the page cache: the read after it is served from
        # memory, so the open and the read are counted together, median of the rounds.
        per_round = [a.size / MiB / (op + a.size / MiB / rd)
                     for op, rd in zip(o[f"open_{key}"]["samples"], o[f"read_{key}"]["samples"])]
        return round(median(per_round), 1)

    rows = [
        [f"first open after a restart, checked in the background (default), s", o["open_background"]["median"], "", ""],
        [f"first open after a restart, checked at the open, s", o["open_at_open"]["median"], "", ""],
        ["first read of the file, background check, MiB/s", o["read_background"]["median"], d,
         H.ratio(o["read_background"]["median"], d)],
        ["first read of the file, checked at the open, MiB/s", o["read_at_open"]["median"], d,
         H.ratio(o["read_at_open"]["median"], d)],
        ["first open and first read together, background check, MiB/s", together("background"), d,
         H.ratio(together("background"), d)],
        ["first open and first read together, checked at the open, MiB/s", together("at_open"), d,
         H.ratio(together("at_open"), d)],
        ["the next read (page cache dropped), MiB/s", o["read_again"]["median"], d, H.ratio(o["read_again"]["median"], d)],
        [f"the whole cache ({a.files} × {a.size / MiB:.0f} MiB), first pass after a restart, s", w["first_pass_seconds"],
         w["direct_seconds"], H.ratio(w["direct_seconds"], w["first_pass_seconds"])],
        ["the whole cache, second pass, s", w["second_pass_seconds"], w["direct_seconds"],
         H.ratio(w["direct_seconds"], w["second_pass_seconds"])],
    ]
    md = [f"# Checking cached blocks before passthrough: {a.files} files of {a.size / MiB:.0f} MiB", "",
          "Page cache dropped before every read; direct: the same files read straight from the disk, in the "
          "same run. Ratios are larder ÷ direct in speed (for times: direct ÷ larder). A check at the open "
          "reads the file through the page cache, so the read after it comes from memory: compare the open "
          "and the read together.", "",
          H.md_table(["figure", "larder", "direct", "ratio"], rows), "",
          f"Medians of {ROUNDS} rounds; samples: {json.dumps({k: v['samples'] for k, v in o.items()})}", "",
          f"Whole cache, per file (MiB/s): direct {w['direct_MiB_s']}; first pass {w['first_pass_MiB_s']}; "
          f"second pass {w['second_pass_MiB_s']}. Reads the daemon served: {w['daemon_reads']}; corrupt blocks: "
          f"{w['corrupt_blocks']}."]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
