#!/usr/bin/env python3
"""Cached reads and metadata through larder, each figure against its limit measured in the same run, and
against rclone (`rclone mount --vfs-cache-mode full` over `rclone serve webdav` of the same home).

    bench/cache.py [--quick] [--size 1GiB] [--files 100000] [--repeat 3] [--out bench/results/cache.json]

Scenarios (page caches are dropped with /proc/sys/vm/drop_caches where a figure says "dropped"):
  1. sequential read of one large file whose data is all in the cache (read once through the mount first),
     1 MiB preads into one buffer, a fresh open per figure: page cache dropped, and page cache warm (read
     again at once). Limit: the same file read straight from the disk the cache lives on, the same two ways.
  2. 4 KiB random preads at aligned offsets (the same offsets everywhere), page cache dropped first, bounded
     in count and time. Limit: the same reads on the file straight from the disk.
  3. sequential read of the large file cold, with home behind an emulated link (larder's --emulate-wan;
     for rclone, bench/wanproxy.py between the mount and the webdav server, the same latency and bandwidth).
     Limit: the emulated bandwidth.
  4. stat of every file of a tree (--files, spread over --dirs directories), bench/statbench.c in a tight
     loop: a warm-up pass, then the measured passes; also passes after dropping the kernel's caches (the
     file systems' own caches stay warm). Limit: the same tree on the local disk; libfuse's passthrough_hp
     (built by scripts/bench-setup.sh) is the reference for a FUSE file system that adds nothing.
Each figure is the best of --repeat runs (all are kept in the JSON with a gauge of how busy other work
kept the CPUs; before each phase the script waits, bounded by --wait-quiet, for the CPUs to go idle).
The home is a plain directory on the disk the caches use; scenarios 1, 2 and 4 read it without a link
emulation (every figure comes from the caches), scenario 3 with one. Every loop is bounded in count and
time; every mount and process is cleaned up on exit (Ctrl-C included). Misses are reported, never raised.

Results: JSON (figures, ratios, flags, versions, daemon CPU time, `larder status --json` after each phase)
and a Markdown table beside it, also printed. Runs scripts/bench-setup.sh first (installs rclone, fuse3,
meson; builds statbench and passthrough_hp into /var/tmp/larder-bench-build).
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import harness as H
from harness import (
    DISTURBED, MiB, WAIT_QUIET, _disturbed, _mounts, _notes, best_of, bench_setup, cleanup, drop_caches,
    environment, fmt, forget_mount, free_port, get, larder_help, larder_mount, larder_status, log, note,
    parse_size, raise_nofile, ratio, rclone_config, rclone_mount, run, same_bytes, seq_read, rand_read, spawn,
    stat_passes, stop_proc, unmount, wait_mounted, wait_port, wait_quiet, with_cpu,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Mount options larder may or may not have (the script passes those `larder mount --help` lists, and
# records the rest as skipped). Per phase: "warm" (scenarios 1, 2, 4), "wan" (scenario 3). Add more with
# --larder-flag PHASE:--name[=value].
LARDER_EXTRA = {
    "warm": [],
    "wan": [],
}

RCLONE_FLAGS = H.RCLONE_FLAGS + ["--read-only"]











# ---------------------------------------------------------------------------------------------- helpers































# ------------------------------------------------------------------------------------------ measurements









def cached_run(name, root, big_rel, ctx, pids=None):
    """Scenarios 1, 2 and 4 on one tree (a mount or the plain directory), each figure the best of --repeat."""
    a = ctx["args"]
    pids = pids or {}
    big = os.path.join(root, big_rel)
    listfile = ctx.get("stat_list", ctx["listfile"])
    n = a.repeat
    r = {}
    log(f"{name}: first read of the large file (fills the cache)")
    drop_caches()
    r["first_read"] = with_cpu(pids, seq_read, big, a.seq_seconds)
    if ctx.get("after_populate"):
        ctx["after_populate"](r)

    def stat_once():
        p = stat_passes(ctx["statbench"], root, listfile, 1, a.stat_timeout)[0]
        if p.get("errors"):
            note(f"{name}: stat failed on {p['errors']} of {p['files']} files")
        return p
    log(f"{name}: stat, a warm-up pass then {n} measured")
    r["stat_warmup"] = stat_once()
    r["stat"] = best_of(f"{name} stat", n, "per_s", lambda: with_cpu(pids, stat_once))
    log(f"{name}: sequential read, page cache dropped (x{n})")
    r["seq_dropped"] = best_of(f"{name} sequential, dropped", n, "MiB_s",
                               lambda: with_cpu(pids, seq_read, big, a.seq_seconds), drop_caches)
    log(f"{name}: sequential read, page cache warm (x{n})")
    r["seq_page_cache"] = best_of(f"{name} sequential, page cache", n, "MiB_s",
                                  lambda: with_cpu(pids, seq_read, big, a.seq_seconds))
    log(f"{name}: 4 KiB random reads, page cache dropped (x{n})")
    r["rand4k"] = best_of(f"{name} random", n, "ops_s",
                          lambda: with_cpu(pids, rand_read, big, ctx["offsets"], a.random_seconds), drop_caches)
    log(f"{name}: stat after dropping the kernel's caches (x{n})")
    r["stat_dropped"] = best_of(f"{name} stat, dropped", n, "per_s", lambda: with_cpu(pids, stat_once), drop_caches)
    if root != ctx["home"]:
        r["data_matches_home"] = same_bytes(big, os.path.join(ctx["home"], big_rel), a.size)
        if not r["data_matches_home"]:
            note(f"{name}: data read through the mount differs from home")
    return r


# ---------------------------------------------------------------------------------------------- systems



def larder_flags(phase, help_text, extra, record):
    """The extra flags for a phase that this larder knows; the rest recorded as skipped."""
    out = []
    for flag, value in LARDER_EXTRA.get(phase, []) + extra.get(phase, []):
        if re.search(r"(^|\s)" + re.escape(flag) + r"([\s=,]|$)", help_text, re.M):
            out += [flag] + ([value] if value is not None else [])
        else:
            record.setdefault("skipped_flags", []).append(flag)
    record["extra_flags"] = out
    return out








def wait_rclone_cached(cache, size, seconds=60):
    path = os.path.join(cache, "vfs", "home", "big")
    deadline = time.monotonic() + seconds
    held = 0
    while time.monotonic() < deadline:
        try:
            held = os.stat(path).st_blocks * 512
        except OSError:
            held = 0
        if held >= size:
            break
        time.sleep(0.2)
    return held






# ----------------------------------------------------------------------------------------------- setup



def make_home(home, size, files, dirs):
    os.makedirs(home)
    log(f"home: writing a {size / MiB:.0f} MiB file and {files} small files in {dirs} directories")
    with open(os.path.join(home, "big"), "wb") as f:
        left = size
        while left > 0:
            chunk = os.urandom(min(left, 8 * MiB))
            f.write(chunk)
            left -= len(chunk)
    per_dir = -(-files // dirs)
    rels = []
    for i in range(files):
        d = os.path.join("tree", f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(os.path.join(home, d))
        rel = os.path.join(d, f"f{i % per_dir:05d}")
        with open(os.path.join(home, rel), "wb") as f:
            f.write(b"%d\n" % i)
        rels.append(rel)
    os.sync()
    return rels




# ---------------------------------------------------------------------------------------------- report



def verdict(r, target):
    if target is None or r is None:
        return ""
    return "pass" if r >= target else "miss"




def build_rows(res, a):
    L, R, D, P, W = (res.get(k, {}) for k in ("larder", "rclone", "direct", "passthrough_hp", "wan"))
    size = f"{a.size / MiB:.0f} MiB"
    specs = [
        ("1a", f"sequential read {size}, cache warm, page cache dropped", "MiB/s", ("seq_dropped", "MiB_s"),
         "direct from disk, page cache dropped", 0.9),
        ("1b", f"sequential read {size}, page cache warm", "MiB/s", ("seq_page_cache", "MiB_s"),
         "direct, page cache warm", 0.9),
        ("2", "4 KiB random reads, cache warm, page cache dropped", "ops/s", ("rand4k", "ops_s"),
         "direct from disk, page cache dropped", None),
        ("4", f"stat {a.files} cached files, after a warm-up pass", "stats/s", ("stat", "per_s"),
         "local disk, after a warm-up pass", 0.5),
        ("4b", f"stat {a.files} cached files, kernel caches dropped", "stats/s", ("stat_dropped", "per_s"),
         "local disk, caches dropped", None),
    ]
    rows = []
    for rid, what, unit, key, limit_name, target in specs:
        lim, lv, rv, pv = get(D, *key), get(L, *key), get(R, *key), get(P, *key)
        rows.append({"id": rid, "scenario": what, "unit": unit, "limit_name": limit_name, "limit": lim,
                     "larder": lv, "larder_over_limit": ratio(lv, lim), "target_over_limit": target,
                     "rclone": rv, "larder_over_rclone": ratio(lv, rv), "target_over_rclone": 2.0,
                     "passthrough_hp": pv})
    bw = a.bandwidth / MiB
    lv, rv = get(W, "larder", "read", "MiB_s"), get(W, "rclone", "read", "MiB_s")
    rows.insert(3, {"id": "3", "scenario": f"cold sequential read {size}, home behind latency={a.latency},"
                    f"bandwidth={bw:.0f}MiB/s", "unit": "MiB/s", "limit_name": "emulated bandwidth",
                    "limit": bw, "larder": lv, "larder_over_limit": ratio(lv, bw), "target_over_limit": 0.8,
                    "rclone": rv, "larder_over_rclone": ratio(lv, rv), "target_over_rclone": 2.0,
                    "passthrough_hp": None})
    for row in rows:
        row["vs_limit"] = verdict(row["larder_over_limit"], row["target_over_limit"])
        row["vs_rclone"] = verdict(row["larder_over_rclone"], row["target_over_rclone"])
        row["rclone_over_limit"] = ratio(row["rclone"], row["limit"])
        if row["id"] in ("4", "4b") and P.get("stat_files"):
            row["passthrough_hp_files"] = P["stat_files"]
    return rows




def markdown(res, a, cmdline):
    out = ["# Cached reads and metadata: larder against its limits and rclone", ""]
    env = res["environment"]
    out.append(f"`{cmdline}` on {env.get('cpus')} CPUs ({env.get('cpu', '?')}), {env.get('mem_GiB')} GiB RAM, "
               f"kernel {env.get('kernel')}; larder binary built {env.get('larder_binary_mtime')} (repository at "
               f"{env.get('git')} during the run), "
               f"{env.get('rclone')}; CPUs {env.get('cpu_busy_at_start', 0):.0%} busy with other work at the start, "
               f"load average {env.get('loadavg_start', [0])[0]:.2f} at the start, "
               f"{env.get('loadavg_end', [0])[0]:.2f} at the end. Every ratio's two figures come from this run.")
    out.append("")
    out.append("| # | scenario | unit | limit (what) | larder | ÷ limit | target | rclone | larder ÷ rclone (≥2) "
               "| passthrough_hp |")
    out.append("|---|---|---|---:|---:|---:|---|---:|---:|---:|")
    for r in res["rows"]:
        tgt = f"≥{r['target_over_limit']} {r['vs_limit']}" if r["target_over_limit"] else "—"
        lim = f"{fmt(r['limit'])} ({r['limit_name']})"
        rc = f"{fmt(r['larder_over_rclone'], 2) if r['larder_over_rclone'] is not None else '—'} {r['vs_rclone']}"
        star = "*" if r.get("passthrough_hp_files") and r["passthrough_hp"] is not None else ""
        out.append(f"| {r['id']} | {r['scenario']} | {r['unit']} | {lim} | {fmt(r['larder'])} | "
                   f"{fmt(r['larder_over_limit'], 3) if r['larder_over_limit'] is not None else '—'} | {tgt} | "
                   f"{fmt(r['rclone'])} | {rc.strip()} | {fmt(r['passthrough_hp'])}{star} |")
    out.append("")
    out.append(f"How: each figure is the best of {a.repeat} run(s) (all runs, and how busy other work kept the "
               "CPUs, are in the JSON); 1 MiB preads into one buffer, a fresh open per run; 4 KiB random reads at "
               f"{a.random_ops:,} aligned offsets (at most {a.random_seconds:.0f} s); stat with "
               "bench/statbench.c (a warm-up pass, then the measured passes). Scenarios 1, 2 and 4 read through a "
               "cache filled by one earlier read; scenario 3 is a cold read on a fresh mount with an empty cache, "
               "larder with `--emulate-wan`, rclone through bench/wanproxy.py (the same latency per round trip, "
               "the same shared bandwidth).")
    out.append("")
    work = res.get("work_dir", "")

    def show(cmd):
        return " ".join([os.path.basename(cmd[0])] + [x.replace(work, "$WORK") if work else x for x in cmd[1:]])
    for label, cmd in (("larder (1, 2, 4)", get(res, "larder", "mount_cmd")),
                       ("larder (3)", get(res, "wan", "larder", "mount_cmd"))):
        if cmd:
            out.append(f"- {label}: `{show(cmd)}`")
    for label, rec in (("1, 2, 4", get(res, "larder")), ("3", get(res, "wan", "larder"))):
        if isinstance(rec, dict) and rec.get("skipped_flags"):
            out.append(f"- larder flags for {label} that this build does not have, left out: "
                       f"`{' '.join(rec['skipped_flags'])}`")
    out.append(f"- rclone mount flags: `{' '.join(RCLONE_FLAGS)}`; home served by `rclone serve webdav --read-only`")
    sc = res.get("wan", {}).get("proxy_selfcheck")
    if sc:
        out.append(f"- wanproxy self-check: {get(sc, 'capped', 'MiB_s')} MiB/s through the capped link, "
                   f"{get(sc, 'uncapped', 'MiB_s')} MiB/s uncapped")
    beyond = [f"{r['id']} (rclone at {r['rclone_over_limit']:.2f} of the limit)" for r in res["rows"]
              if r.get("rclone_over_limit") and r["rclone_over_limit"] > 0.5]
    if beyond:
        out.append(f"- rows where twice rclone's figure lies beyond the limit itself: {', '.join(beyond)}")
    pr = res.get("passthrough_hp", {})
    if pr.get("stat_files"):
        out.append(f"- \\* passthrough_hp's stat figures are over the first {pr['stat_files']:,} files (see the note)")
    if pr.get("skipped"):
        out.append(f"- passthrough_hp skipped: {pr['skipped']}")
    for n in res.get("notes", []):
        out.append(f"- note: {n}")
    out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- phases

def phase_direct(ctx, res):
    """The limits: the plain home directory, on the disk the caches use."""
    res["direct"] = cached_run("direct", ctx["home"], "big", ctx)


def phase_larder(ctx, res):
    a, home, work = ctx["args"], ctx["home"], ctx["work"]
    mnt, cache = os.path.join(work, "mnt-larder"), os.path.join(work, "cache-larder")
    rec = {}
    res["larder"] = rec
    flags = ["--read-only", "--cache-size", a.cache_size, "--validity-lag", a.validity_lag]
    flags += larder_flags("warm", ctx["help_text"], ctx["extra"], rec)
    rec["mount_cmd"] = larder_mount(home, mnt, cache, flags)
    pids = {"larder": larder_status(mnt).get("pid")}

    def populated(r):
        r["cached_bytes"] = get(larder_status(mnt), "cache", "bytes_used")
        if (r["cached_bytes"] or 0) < a.size:
            note(f"larder holds {r['cached_bytes']} bytes after the first read, less than the file")
    rec.update(cached_run("larder", mnt, "big", dict(ctx, after_populate=populated), pids))
    rec["status"] = larder_status(mnt)
    unmount("larder", mnt)
    forget_mount(mnt)
    shutil.rmtree(cache, ignore_errors=True)




def phase_passthrough(ctx, res):
    """libfuse's passthrough_hp: a FUSE file system that adds nothing (kernel caches on, 86400 s timeouts)."""
    a, home, work = ctx["args"], ctx["home"], ctx["work"]
    if a.skip_passthrough:
        res["passthrough_hp"] = {"skipped": "--skip-passthrough"}
        return
    if not ctx["passthrough_hp"]:
        res["passthrough_hp"] = {"skipped": res["setup"].get("PASSTHROUGH_HP_ERROR") or "not built"}
        note(f"passthrough_hp: {res['passthrough_hp']['skipped']}")
        return
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    run_ctx = dict(ctx)
    rec = {}
    if hard != resource.RLIM_INFINITY and a.files + 2000 > hard:
        # passthrough_hp holds a descriptor per inode the kernel remembers; past the limit, lookups fail.
        files = max(1000, hard - 2000)
        with open(ctx["listfile"]) as f:
            lines = f.readlines()[:files]
        run_ctx["stat_list"] = os.path.join(work, "stat-list-passthrough")
        with open(run_ctx["stat_list"], "w") as f:
            f.writelines(lines)
        rec["stat_files"] = len(lines)
        note(f"passthrough_hp holds a descriptor per inode and this machine caps descriptors at {hard} "
             f"(RLIMIT_NOFILE, which cannot be raised here): its stat figures are over the first "
             f"{len(lines)} files")
    mnt = os.path.join(work, "mnt-passthrough")
    os.makedirs(mnt)
    cmd = [ctx["passthrough_hp"], "--foreground", home, mnt]
    rec["cmd"] = cmd
    res["passthrough_hp"] = rec
    p = spawn(cmd, os.path.join(work, "passthrough_hp.log"), preexec_fn=raise_nofile)
    _mounts.append(("fuse", mnt))
    if not wait_mounted(mnt, 30, p):
        raise RuntimeError("passthrough_hp did not mount")
    rec.update(cached_run("passthrough_hp", mnt, "big", run_ctx, {"passthrough_hp": p.pid}))
    unmount("fuse", mnt)
    forget_mount(mnt)
    stop_proc(p)


def start_serve(ctx):
    """rclone serve webdav of home, shared by the rclone phases."""
    if ctx.get("serve") and ctx["serve"].poll() is None:
        return ctx["serve"], ctx["serve_port"]
    port = free_port()
    serve = spawn(["rclone", "serve", "webdav", ctx["home"], "--addr", f"127.0.0.1:{port}", "--read-only"],
                  os.path.join(ctx["work"], "rclone-serve.log"))
    if not wait_port(port, 30, serve):
        raise RuntimeError("rclone serve webdav did not come up")
    ctx["serve"], ctx["serve_port"] = serve, port
    return serve, port




def phase_rclone(ctx, res):
    a, work = ctx["args"], ctx["work"]
    if a.skip_rclone:
        res["rclone"] = {"skipped": "--skip-rclone"}
        return
    serve, port = start_serve(ctx)
    cfg = rclone_config(os.path.join(work, "rclone.conf"), port)
    mnt, cache = os.path.join(work, "mnt-rclone"), os.path.join(work, "cache-rclone")
    p, cmd = rclone_mount(cfg, mnt, cache, os.path.join(work, "rclone-mount.log"), RCLONE_FLAGS)
    rec = {"cmd": cmd}
    res["rclone"] = rec

    def populated(r):
        r["cached_bytes"] = wait_rclone_cached(cache, a.size)
        if r["cached_bytes"] < a.size:
            note(f"rclone holds {r['cached_bytes']} bytes after the first read, less than the file")
    rec.update(cached_run("rclone", mnt, "big", dict(ctx, after_populate=populated),
                          {"rclone_mount": p.pid, "rclone_serve": serve.pid}))
    unmount("rclone", mnt)
    forget_mount(mnt)
    stop_proc(p)
    shutil.rmtree(cache, ignore_errors=True)


def phase_wan(ctx, res):
    """Scenario 3: a cold read with home behind the emulated link, best of --repeat, each on a fresh mount
    with an empty cache. Home's file sits in the page cache (read just before), so only the link limits."""
    a, home, work = ctx["args"], ctx["home"], ctx["work"]
    wan = {"limit_MiB_s": a.bandwidth / MiB}
    res["wan"] = wan
    bw_spec = f"{a.bandwidth / MiB:g}MiB/s"
    home_big = os.path.join(home, "big")
    seq_read(home_big, a.seq_seconds)

    rec = {}
    wan["larder"] = rec
    flags = ["--read-only", "--cache-size", a.cache_size, "--emulate-wan", f"latency={a.latency},bandwidth={bw_spec}"]
    flags += larder_flags("wan", ctx["help_text"], ctx["extra"], rec)
    statuses = []

    def larder_cold():
        mnt, cache = os.path.join(work, "mnt-larder-wan"), os.path.join(work, "cache-larder-wan")
        rec["mount_cmd"] = larder_mount(home, mnt, cache, flags)
        try:
            pid = larder_status(mnt).get("pid")
            log("larder: cold read over the emulated link")
            r = with_cpu({"larder": pid}, seq_read, os.path.join(mnt, "big"), a.seq_seconds)
            r["status"] = larder_status(mnt)
            statuses.append(r["status"])
            r["data_matches_home"] = same_bytes(os.path.join(mnt, "big"), home_big, a.size)
            if not r["data_matches_home"]:
                note("larder (scenario 3): data read through the mount differs from home")
        finally:
            unmount("larder", mnt)
            forget_mount(mnt)
            shutil.rmtree(cache, ignore_errors=True)
        return r
    rec["read"] = best_of("larder cold over the link", a.repeat, "MiB_s", larder_cold)

    if a.skip_rclone:
        return
    proxy_cmd = [sys.executable, os.path.join(ROOT, "bench", "wanproxy.py"), "--latency", a.latency,
                 "--bandwidth", bw_spec]
    log("wanproxy: self-check")
    r = run(proxy_cmd + ["--selfcheck", "--bytes", str(min(a.size, 1 << 30))], timeout=600, check=False)
    try:
        wan["proxy_selfcheck"] = json.loads(r.stdout)
    except ValueError:
        wan["proxy_selfcheck"] = {"error": r.stderr.strip()[-500:]}
    capped = get(wan, "proxy_selfcheck", "capped", "MiB_s")
    if capped is not None and capped < 0.9 * a.bandwidth / MiB:
        note(f"wanproxy carries only {capped} MiB/s through its capped link, below the emulated bandwidth")
    serve, port = start_serve(ctx)
    rec = {}
    wan["rclone"] = rec

    def rclone_cold():
        pport = free_port()
        proxy = spawn(proxy_cmd + ["--listen", f"127.0.0.1:{pport}", "--target", f"127.0.0.1:{port}"],
                      os.path.join(work, "wanproxy.log"))
        mnt, cache = os.path.join(work, "mnt-rclone-wan"), os.path.join(work, "cache-rclone-wan")
        p = None
        try:
            if not wait_port(pport, 30, proxy):
                raise RuntimeError("wanproxy did not come up")
            cfg = rclone_config(os.path.join(work, "rclone-wan.conf"), pport)
            p, rec["cmd"] = rclone_mount(cfg, mnt, cache, os.path.join(work, "rclone-mount-wan.log"),
                                          RCLONE_FLAGS)
            log("rclone: cold read over the emulated link")
            r = with_cpu({"rclone_mount": p.pid, "rclone_serve": serve.pid, "wanproxy": proxy.pid},
                         seq_read, os.path.join(mnt, "big"), a.seq_seconds)
            r["data_matches_home"] = same_bytes(os.path.join(mnt, "big"), home_big, a.size)
            if not r["data_matches_home"]:
                note("rclone (scenario 3): data read through the mount differs from home")
        finally:
            unmount("rclone", mnt)
            forget_mount(mnt)
            if p is not None:
                stop_proc(p)
            stop_proc(proxy)
            shutil.rmtree(cache, ignore_errors=True)
        return r
    rec["read"] = best_of("rclone cold over the link", a.repeat, "MiB_s", rclone_cold)
    stop_proc(serve)


# ------------------------------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a short smoke run: 64 MiB file, 5000 files")
    ap.add_argument("--size", type=parse_size, help="large file size [1GiB; --quick 64MiB]")
    ap.add_argument("--files", type=int, help="small files to stat [100000; --quick 5000]")
    ap.add_argument("--dirs", type=int, help="directories the small files spread over [100; --quick 50]")
    ap.add_argument("--random-ops", type=int, help="4 KiB random reads [20000; --quick 2000]")
    ap.add_argument("--random-seconds", type=float, help="time bound of the random reads [10; --quick 3]")
    ap.add_argument("--repeat", type=int, help="runs per figure, the best reported [3; --quick 1]")
    ap.add_argument("--seq-seconds", type=float, default=300, help="time bound of one sequential read")
    ap.add_argument("--stat-timeout", type=float, default=900, help="time bound of one stat run")
    ap.add_argument("--latency", default="30ms", help="emulated link latency (round trip), scenario 3")
    ap.add_argument("--bandwidth", type=parse_size, default=200 * MiB, help="emulated bandwidth per s [200MiB]")
    ap.add_argument("--validity-lag", default="1h", help="larder's --validity-lag for 1, 2, 4 (rclone: 1h)")
    ap.add_argument("--cache-size", default="4GiB", help="larder's --cache-size")
    ap.add_argument("--larder-flag", action="append", default=[], metavar="PHASE:--FLAG[=VALUE]",
                    help="extra larder mount flag for phase warm or wan, passed if larder has it")
    ap.add_argument("--skip-rclone", action="store_true")
    ap.add_argument("--skip-passthrough", action="store_true")
    ap.add_argument("--wait-quiet", type=float, metavar="SECONDS",
                    help="before each phase wait, at most this long, for the CPUs to be idle [300; --quick 0]")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cache.json"))
    a = ap.parse_args()
    quick = a.quick
    a.size = a.size or (64 * MiB if quick else 1 << 30)
    a.files = a.files or (5000 if quick else 100000)
    a.dirs = a.dirs or (50 if quick else 100)
    a.random_ops = a.random_ops or (2000 if quick else 20000)
    a.random_seconds = a.random_seconds or (3.0 if quick else 10.0)
    a.repeat = a.repeat or (1 if quick else 3)
    if a.wait_quiet is None:
        a.wait_quiet = 0 if quick else 300
    WAIT_QUIET[0] = min(a.wait_quiet, 120)
    a.size -= a.size % 4096
    if a.size < 4 * 4096:
        sys.exit("--size is too small")
    extra = {}
    for spec in a.larder_flag:
        phase, _, flag = spec.partition(":")
        name, eq, value = flag.partition("=")
        extra.setdefault(phase, []).append((name, value if eq else None))
    if not os.path.exists(H.LARDER):
        sys.exit(f"{H.LARDER} is missing: cargo build --release -p larder (or set LARDER_BIN)")
    if os.geteuid() != 0:
        note("not root: page caches cannot be dropped")

    H.on_signals()

    cmdline = "bench/cache.py" + ("".join(" " + x for x in sys.argv[1:]))
    res = {"config": {"quick": quick, "size": a.size, "files": a.files, "dirs": a.dirs,
                      "random_ops": a.random_ops, "random_seconds": a.random_seconds, "repeat": a.repeat,
                      "latency": a.latency,
                      "bandwidth_MiB_s": a.bandwidth / MiB, "validity_lag": a.validity_lag,
                      "cache_size": a.cache_size, "rclone_flags": RCLONE_FLAGS}}
    res["setup"] = bench_setup(res["config"])
    statbench = res["setup"].get("STATBENCH") or None
    passthrough_hp = res["setup"].get("PASSTHROUGH_HP") or None
    if not statbench:
        note("statbench was not built; stat uses Python's os.stat")
    work = tempfile.mkdtemp(prefix="larder-bench-cache-", dir="/var/tmp")
    res["work_dir"] = work
    try:
        # The run uses a copy of the binary: a rebuild meanwhile cannot mix two builds in one table.
        res["environment"] = environment()
        copy = os.path.join(work, "larder")
        shutil.copy2(H.LARDER, copy)
        H.LARDER = copy
        help_text = larder_help()
        fstype = run(["stat", "-f", "-c", "%T", work]).stdout.strip()
        res["environment"]["work_fs"] = fstype
        if fstype == "tmpfs":
            note(f"{work} is on tmpfs: 'disk' figures are memory figures")
        st = os.statvfs(work)
        need = a.size * 6 + a.files * 8192 + (1 << 30)
        if st.f_bavail * st.f_frsize < need:
            sys.exit(f"{work}: need {need / (1 << 30):.1f} GiB free")
        home = os.path.join(work, "home")
        rels = make_home(home, a.size, a.files, a.dirs)
        listfile = os.path.join(work, "stat-list")
        with open(listfile, "w") as f:
            f.write("\n".join(rels) + "\n")
        rng = random.Random(1)
        offsets = [rng.randrange(a.size // 4096) * 4096 for _ in range(a.random_ops)]
        res["environment"]["cpu_busy_at_start"] = busy = wait_quiet(a.wait_quiet)
        if busy > 0.15:
            note(f"the CPUs were {busy:.0%} busy with other work when the measurements started")
        res["environment"]["loadavg_start"] = os.getloadavg()
        ctx = {"args": a, "statbench": statbench, "listfile": listfile, "offsets": offsets, "home": home,
               "extra": extra, "help_text": help_text, "passthrough_hp": passthrough_hp, "work": work}
        phases = [("direct", phase_direct), ("larder", phase_larder), ("passthrough_hp", phase_passthrough),
                  ("rclone", phase_rclone), ("wan", phase_wan)]
        for name, fn in phases:
            try:
                if a.wait_quiet:
                    res["environment"].setdefault("cpu_busy_before_phase", {})[name] = wait_quiet(a.wait_quiet)
                fn(ctx, res)
            except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as e:
                note(f"{name}: failed: {e}")
                res.setdefault(name, {})["error"] = str(e)
                cleanup()  # whatever the phase left mounted or running
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        sys.exit(130)  # after the finally clause below
    finally:
        cleanup()
        if a.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    res["environment"]["loadavg_end"] = os.getloadavg()
    if _disturbed:
        note(f"over {DISTURBED:.0%} of the CPUs were busy outside the measured processes (other work, or "
             f"kernel threads working for them) during the best run of: {', '.join(_disturbed)}")
    res["rows"] = build_rows(res, a)
    res["notes"] = _notes
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    md = markdown(res, a, cmdline)
    mdpath = os.path.splitext(a.out)[0] + ".md"
    with open(mdpath, "w") as f:
        f.write(md)
    print(md)
    print(f"JSON: {a.out}\nMarkdown: {mdpath}")


if __name__ == "__main__":
    main()
