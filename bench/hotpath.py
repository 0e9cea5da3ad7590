#!/usr/bin/env python3
"""The hit path through the daemon: warm lookups and warm 4 KiB random reads by several clients.

    bench/hotpath.py [--files 20000] [--big 256MiB] [--seconds 3] [--clients 1,2,4,8] [--threads 1,2,4,8]
                     [--label NAME] [--out bench/results/hotpath-NAME.json]

1. Lookups: 1/2/4/8 client processes (bench/statbench.c) stat every one of --files cached files, split among
   them, with the kernel's dentry and inode caches dropped before each run (`drop_caches` 2), so that every
   lookup reaches the daemon; the baseline is the same on the home directory itself (local disk, its
   dentries dropped too).
2. Reads: 1/2/4/8 threads (bench/randread.c) read random 4 KiB blocks of one cached --big file opened
   O_DIRECT, so that every read reaches the daemon (`--no-passthrough`: the kernel does not read the cache
   file itself); baselines: the same file on local disk read O_DIRECT (the disk) and read through the page
   cache.
For each: operations per second in all, the mean time per operation a client saw, and the daemon's CPU time
per operation. Ratios compare figures of the same run. Results: JSON, a table on stdout and as Markdown.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
from harness import log  # noqa: E402

PER_DIR = 200


def drop_dentries():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def lookups(statbench, root, paths, clients, work):
    """stat every path once, split among `clients` processes started together; dentries dropped first."""
    lists = []
    for c in range(clients):
        lf = os.path.join(work, f"list-{clients}-{c}")
        with open(lf, "w") as f:
            f.write("\n".join(paths[c::clients]) + "\n")
        lists.append(lf)
    drop_dentries()
    procs = [subprocess.Popen([statbench, root, lf, "1", "--barrier"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for lf in lists]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("statbench did not start")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        outs.append(json.loads(out.strip().splitlines()[-1]))
    files = sum(o["files"] for o in outs)
    errors = sum(o["errors"] for o in outs)
    wall = max(o["seconds"] for o in outs)
    per_op_us = sum(o["seconds"] for o in outs) / max(files, 1) * 1e6
    return {"clients": clients, "ops": files, "errors": errors, "seconds": round(wall, 4),
            "ops_s": round(files / wall, 1), "us_per_op": round(per_op_us, 2)}


def reads(randread, path, threads, seconds, direct):
    cmd = [randread, path, str(threads), str(seconds)] + (["--direct"] if direct else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode != 0:
        raise RuntimeError(f"randread failed: {r.stderr.strip() or r.stdout.strip()}")
    o = json.loads(r.stdout.strip())
    return {"threads": threads, "ops": o["ops"], "seconds": round(o["seconds"], 4), "ops_s": o["per_s"],
            "us_per_op": round(o["seconds"] * threads / max(o["ops"], 1) * 1e6, 2)}


def with_daemon_cpu(pid, fn, *args):
    before = H.cpu_seconds(pid)
    r = fn(*args)
    after = H.cpu_seconds(pid)
    if before is not None and after is not None and r["ops"]:
        r["daemon_cpu_us_per_op"] = round((after - before) / r["ops"] * 1e6, 2)
    return r


def daemon_pid(mnt):
    st = H.larder_status(mnt)
    return st.get("pid") or st.get("daemon", {}).get("pid")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--big", type=H.parse_size, default=H.parse_size("256MiB"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--label", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--out")
    a = ap.parse_args()
    out = a.out or os.path.join(H.ROOT, "bench", "results", f"hotpath-{a.label}.json")
    if not os.path.exists(H.LARDER):
        sys.exit(f"{H.LARDER} is missing: cargo build --release (or set LARDER_BIN)")
    H.on_signals()
    record = {"label": a.label, "files": a.files, "big_bytes": a.big, "seconds": a.seconds,
              "environment": H.environment()}
    setup = H.bench_setup(record)
    statbench, randread = setup.get("STATBENCH"), setup.get("RANDREAD")
    if not statbench or not randread:
        sys.exit("bench-setup.sh did not build statbench and randread")
    clients = [int(c) for c in a.clients.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    try:
        with tempfile.TemporaryDirectory(prefix="larder-bench-hot-", dir="/var/tmp") as work:
            home, mnt, cache = (os.path.join(work, x) for x in ("home", "mnt", "cache"))
            paths = []
            for i in range(a.files):
                rel = f"d{i // PER_DIR:03d}/f{i % PER_DIR:04d}"
                os.makedirs(os.path.join(home, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(home, rel), "wb") as f:
                    f.write(b"x" * 1024)
                paths.append(rel)
            big = os.path.join(home, "big.bin")
            H.write_random(big, a.big)
            log(f"home: {a.files} files and a {a.big >> 20} MiB file")
            record["local_lookups"] = [lookups(statbench, home, paths, c, work) for c in clients]
            H.drop_caches()
            record["local_reads_direct"] = [reads(randread, big, t, a.seconds, True) for t in threads]
            with open(big, "rb") as f:
                while f.read(1 << 20):
                    pass
            record["local_reads_page_cache"] = [reads(randread, big, t, a.seconds, False) for t in threads]
            record["larder_flags"] = ["--no-passthrough", "--validity-lag", "1h"]
            record["mount"] = H.larder_mount(home, mnt, cache, record["larder_flags"])
            pid = daemon_pid(mnt)
            # Warm: every file's attributes and the big file's blocks in the cache.
            lookups(statbench, mnt, paths, 1, work)
            with open(os.path.join(mnt, "big.bin"), "rb") as f:
                while f.read(1 << 20):
                    pass
            log("warm")
            record["larder_lookups"] = [with_daemon_cpu(pid, lookups, statbench, mnt, paths, c, work)
                                        for c in clients]
            record["larder_reads"] = [with_daemon_cpu(pid, reads, randread, os.path.join(mnt, "big.bin"), t,
                                                      a.seconds, True) for t in threads]
            st = H.larder_status(mnt)
            record["larder_status_reads"] = st.get("reads") or st.get("fs")
            H.unmount("larder", mnt)
    finally:
        H.cleanup()
    rows = []
    for ll, lo in zip(record["larder_lookups"], record["local_lookups"]):
        rows.append(["lookups", ll["clients"], ll["ops_s"], lo["ops_s"], H.ratio(ll["ops_s"], lo["ops_s"]),
                     ll["us_per_op"], lo["us_per_op"], ll.get("daemon_cpu_us_per_op")])
    for lr, ld, lp in zip(record["larder_reads"], record["local_reads_direct"], record["local_reads_page_cache"]):
        rows.append(["4 KiB reads", lr["threads"], lr["ops_s"], ld["ops_s"], H.ratio(lr["ops_s"], ld["ops_s"]),
                     lr["us_per_op"], ld["us_per_op"], lr.get("daemon_cpu_us_per_op")])
        rows.append(["  (page cache)", lp["threads"], None, lp["ops_s"], None, None, lp["us_per_op"], None])
    first = {r[0]: r for r in rows if r[1] == 1}
    record["scaling"] = {
        "lookups": {r[1]: H.ratio(r[2], first["lookups"][2]) for r in rows if r[0] == "lookups"},
        "reads": {r[1]: H.ratio(r[2], first["4 KiB reads"][2]) for r in rows if r[0] == "4 KiB reads"},
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=2)
    header = ["op", "clients/threads", "larder ops/s", "local ops/s", "larder/local", "larder µs/op",
              "local µs/op", "daemon CPU µs/op"]
    table = H.md_table(header, rows)
    scaling = "\n".join(f"- {k}: " + ", ".join(f"{n}: {v}×" for n, v in s.items())
                        for k, s in record["scaling"].items())
    md = (f"# Hit path through the daemon ({a.label})\n\n{a.files} cached files (lookups, dentries dropped "
          f"before each run) and a {a.big >> 20} MiB cached file (4 KiB random reads, O_DIRECT, "
          f"`--no-passthrough`); {a.seconds:g} s per read figure; `bench/hotpath.py --label {a.label}`.\n\n"
          f"{table}\n\nScaling over one client/thread:\n{scaling}\n")
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(md)
    print(md)
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
