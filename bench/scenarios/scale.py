"""Scale: many small files cached, and what they cost the daemon.

For each size N (10,000 and 100,000 by default; `--scale-files 10000,100000,1000000` adds a million), a
home tree of N small files (64-1,024 bytes, 1,000 per directory) is mounted by larder (the default
write-back mount, validity lag 1 h, no link) with an empty cache, then:
1. `ls -lR` of the tree, the kernel's caches dropped first (cold: every directory listed from home);
2. every file read (`find -type f | xargs cat`);
3. the daemon's RSS (VmRSS and its peak VmHWM), within `--max-inodes` while the kernel holds every
   inode, then after the kernel's caches are dropped (it forgets every inode, and they leave the daemon's
   memory for the index), and the index's size on disk;
4. `ls -lR` again with the kernel's caches dropped: home calls made (target 0) and time;
5. an unmount and a remount over the same cache: seconds until the mount is ready;
6. `ls -lR` after the remount, the kernel's caches dropped: home calls and time; RSS after it, and after
   the kernel's caches are dropped once more.
`direct` is `ls -lR` of the home directory itself (the local disk, caches dropped), in the same run.
Home calls are larder's own count of calls to home (status `home.ops`).
"""
import os
import random
import shutil
import subprocess
import time

import harness as H
from harness import MiB, log

TITLE = "Scale: RSS, index size, remount and ls -lR with 10k-1M files cached"
PER_DIR = 1000


def add_args(ap):
    ap.add_argument("--scale-files", default="10000,100000",
                    help="scale: tree sizes, comma-separated [10000,100000]; 1000000 takes about 20 minutes")


def make_tree(root, n):
    """N small files under root, PER_DIR per directory; reused when already there."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(n)
    blob = rng.randbytes(1024)
    for i in range(n):
        d = os.path.join(root, f"d{i // PER_DIR:04d}")
        if i % PER_DIR == 0:
            os.makedirs(d)
        with open(os.path.join(d, f"f{i % PER_DIR:04d}"), "wb") as f:
            f.write(blob[: rng.randrange(64, 1025)])
    open(done, "w").close()


def timed(cmd, timeout=7200):
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout, shell=isinstance(cmd, str))
    if r.returncode != 0:
        raise RuntimeError(f"{cmd}: exit {r.returncode}: {r.stderr.decode(errors='replace')[-300:]}")
    return round(time.monotonic() - t0, 2)


def proc_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def home_ops(mnt):
    return H.get(H.larder_status(mnt), "home", "ops")


def index_bytes(cache):
    return sum(os.path.getsize(os.path.join(cache, f)) for f in os.listdir(cache) if f.startswith("index.redb"))


def rss_after_drop(pid):
    """RSS once the kernel forgot every inode (caches dropped) and the daemon let them go."""
    H.drop_caches()
    time.sleep(3)
    return round(proc_kib(pid, "VmRSS") / 1024, 1)


def ls_cold(mnt, rel):
    """`ls -lR` with the kernel's caches dropped: seconds and home calls."""
    H.drop_caches()
    before = home_ops(mnt)
    secs = timed(["ls", "-lR", os.path.join(mnt, rel)])
    return {"seconds": secs, "home_calls": home_ops(mnt) - before}


def one_size(ctx, n):
    rel = f"scale-{n}"
    tree = os.path.join(ctx.subhome("scale"), rel)
    log(f"scale: making {n} files")
    make_tree(tree, n)
    r = {"files": n, "dirs": (n + PER_DIR - 1) // PER_DIR}
    H.drop_caches()
    r["direct_ls_seconds"] = timed(["ls", "-lR", tree])
    mnt, cache = ctx.scratch(f"mnt-scale-{n}"), ctx.scratch(f"cache-scale-{n}")
    flags = ["--cache-size", "64GiB", "--validity-lag", "1h", "--write-mode", "write-back"]
    H.larder_mount(os.path.join(ctx.home, "scale"), mnt, cache, flags)
    try:
        pid = H.larder_status(mnt).get("pid")
        log(f"scale {n}: ls -lR cold")
        r["ls_cold"] = ls_cold(mnt, rel)
        log(f"scale {n}: reading every file")
        r["read_all_seconds"] = timed(f"find {mnt}/{rel} -type f -print0 | xargs -0 -n 1000 cat")
        r["rss_mib"] = round(proc_kib(pid, "VmRSS") / 1024, 1)
        r["rss_peak_mib"] = round(proc_kib(pid, "VmHWM") / 1024, 1)
        r["inodes"] = H.get(H.larder_status(mnt), "fs", "inodes")
        r["rss_dropped_mib"] = rss_after_drop(pid)
        r["inodes_dropped"] = H.get(H.larder_status(mnt), "fs", "inodes")
        log(f"scale {n}: ls -lR, kernel caches dropped")
        r["ls_warm"] = ls_cold(mnt, rel)
        r["rss_after_ls_mib"] = round(proc_kib(pid, "VmRSS") / 1024, 1)
        H.run([H.LARDER, "drain", mnt, "--timeout", "600s"], timeout=700, check=False)
        H.unmount("larder", mnt)
        r["index_mib"] = round(index_bytes(cache) / MiB, 1)
        log(f"scale {n}: remount")
        t0 = time.monotonic()
        H.larder_mount(os.path.join(ctx.home, "scale"), mnt, cache, flags)
        os.stat(os.path.join(mnt, rel))
        r["remount_seconds"] = round(time.monotonic() - t0, 2)
        pid = H.larder_status(mnt).get("pid")
        r["rss_after_remount_mib"] = round(proc_kib(pid, "VmRSS") / 1024, 1)
        r["ls_after_remount"] = ls_cold(mnt, rel)
        r["rss_after_remount_ls_mib"] = round(proc_kib(pid, "VmRSS") / 1024, 1)
        r["rss_after_remount_dropped_mib"] = rss_after_drop(pid)
    finally:
        H.unmount("larder", mnt)
        H.forget_mount(mnt)
        shutil.rmtree(cache, ignore_errors=True)
    log(f"scale {n}: {r}")
    return r


def run(ctx):
    sizes = [int(x) for x in ctx.args.scale_files.split(",") if x.strip()]
    return {"sizes": [one_size(ctx, n) for n in sizes], "per_dir": PER_DIR}


def report(r, ctx):
    rows = []
    for s in r["sizes"]:
        g = lambda *k: H.get(s, *k)
        rows.append([f"{s['files']:,}", g("rss_mib"), g("rss_dropped_mib"), g("rss_peak_mib"),
                     g("rss_after_remount_ls_mib"), g("rss_after_remount_dropped_mib"), g("index_mib"),
                     g("remount_seconds"), g("direct_ls_seconds"), g("ls_cold", "seconds"), g("ls_cold", "home_calls"),
                     g("ls_warm", "seconds"), g("ls_warm", "home_calls"), g("ls_after_remount", "seconds"),
                     g("ls_after_remount", "home_calls"), g("read_all_seconds")])
    head = ["files", "RSS MiB (all read)", "RSS MiB, kernel caches dropped", "peak RSS MiB",
            "RSS MiB after remount + ls -lR", "the same, kernel caches dropped", "index MiB",
            "remount s", "ls -lR direct s", "ls -lR cold s", "home calls", "ls -lR, caches dropped s", "home calls",
            "ls -lR after remount s", "home calls", "read all s"]
    return "\n".join([
        f"Small files (64-1,024 bytes), {r['per_dir']:,} per directory, on the default write-back mount; the kernel's "
        "caches dropped before each ls -lR. Targets: RSS at most 256 MiB at 1M files, a remount in seconds, no "
        "home calls for ls -lR of a cached tree. While the kernel holds an inode the daemon keeps it; past "
        "--max-inodes (131,072) the kernel is asked to forget idle ones.", "",
        H.md_table(head, rows)])
