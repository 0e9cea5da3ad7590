#!/usr/bin/env python3
"""How fast a write-back mount's queue reaches a far home: a tree of new small files, pushed by `larder drain`.

    bench/push.py [--latency 30ms] [--files 2000] [--dirs 20] [--size 1024] [--skip-s3] [--out FILE.json]

1. A directory home behind `--emulate-wan latency=...` (per home call). The tree is written with the sync lag
   at an hour, so nothing leaves during the writing; then `larder drain` is timed. Run twice in the same run:
   with `--flush-threads 8` (a fixed 8 pushers: the window cannot grow past them) and with the default
   (64: the window grows while home keeps up). Reported: files/s of the drain, home calls per file.
2. An S3 home (moto, started here) behind bench/wanproxy.py at the same latency: the same tree written to a
   larder mount of the bucket, then drained, against `rclone copy` of the same tree from a local directory to
   the same server through the same proxy.

Results: JSON at --out and a Markdown table beside it (default bench/results/push-<date>.json).
Every mount, server and proxy started here is stopped at the end.
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
import harness as H  # noqa: E402

BUCKET = "pushbench"
KEYS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


def write_tree(root, files, dirs, size):
    """`files` files of `size` bytes spread over `dirs` directories; seconds taken."""
    start = time.monotonic()
    per = files // dirs
    body = os.urandom(size)
    for d in range(dirs):
        p = os.path.join(root, f"d{d:03d}")
        os.makedirs(p, exist_ok=True)
        for f in range(per):
            with open(os.path.join(p, f"f{f:05d}"), "wb") as fh:
                fh.write(body)
    return time.monotonic() - start


def same_tree(a, b):
    """Whether the trees at a and b hold the same names and bytes."""
    for dirpath, dirnames, filenames in os.walk(a):
        rel = os.path.relpath(dirpath, a)
        other = os.path.join(b, rel)
        if sorted(os.listdir(other)) != sorted(dirnames + filenames):
            return False
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as x, open(os.path.join(other, f), "rb") as y:
                if x.read() != y.read():
                    return False
    return True


def home_ops(mnt):
    st = H.larder_status(mnt)
    return st.get("home", {}).get("ops_by_kind", {})


def drained(mnt, tree_files, label):
    """`larder drain` of mnt, timed; home calls it made by kind."""
    before = home_ops(mnt)
    t0 = time.monotonic()
    r = H.run([H.LARDER, "drain", mnt, "--timeout", "900s"], timeout=1000, check=False)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{label}: drain failed: {(r.stderr or r.stdout).strip()[-300:]}")
    after = home_ops(mnt)
    calls = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    total = sum(calls.values())
    return {"drain_s": round(took, 2), "files_per_s": round(tree_files / took, 1), "home_calls": calls,
            "home_calls_per_file": round(total / tree_files, 2)}


def directory_home(work, a, flush_threads):
    tag = f"dir-{flush_threads or 'default'}"
    home, mnt, cache = (os.path.join(work, f"{x}-{tag}") for x in ("home", "mnt", "cache"))
    os.makedirs(home)
    flags = ["--emulate-wan", f"latency={a.latency}", "--sync-lag", "1h"]
    if flush_threads:
        flags += ["--flush-threads", str(flush_threads)]
    H.larder_mount(home, mnt, cache, flags)
    try:
        wrote = write_tree(mnt, a.files, a.dirs, a.size)
        r = drained(mnt, a.files, tag)
        r["write_s"] = round(wrote, 2)
        r["home_equal"] = same_tree(mnt, home)
        r["flags"] = flags
        return r
    finally:
        H.unmount("larder", mnt)


def start_moto(work):
    port = H.free_port()
    p = H.spawn([shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)],
                os.path.join(work, "moto.log"))
    if not H.wait_port(port, 60, p):
        raise RuntimeError("moto_server did not come up")
    env = dict(os.environ, **KEYS)
    subprocess.run([sys.executable, "-c", (
        "import boto3,sys; boto3.client('s3', endpoint_url=sys.argv[1]).create_bucket(Bucket=sys.argv[2])"),
        f"http://127.0.0.1:{port}", BUCKET], check=True, env=env, timeout=60)
    return p, port


def start_proxy(work, port, latency):
    listen = H.free_port()
    p = H.spawn([sys.executable, os.path.join(BENCH, "wanproxy.py"), "--listen", f"127.0.0.1:{listen}",
                 "--target", f"127.0.0.1:{port}", "--latency", latency], os.path.join(work, "wanproxy.log"))
    if not H.wait_port(listen, 30, p):
        raise RuntimeError("wanproxy did not come up")
    return p, listen


def s3_home(work, a):
    moto, port = start_moto(work)
    proxy, via = start_proxy(work, port, a.latency)
    env = dict(os.environ, **KEYS)
    # A custom CA bundle (a machine's proxy) makes rclone's S3 backend refuse to start; the server is plain HTTP.
    env.pop("AWS_CA_BUNDLE", None)
    out = {"server": "moto", "link": f"bench/wanproxy.py --latency {a.latency}"}
    try:
        # rclone copy of the same tree, from a local directory.
        src = os.path.join(work, "s3-src")
        write_tree(src, a.files, a.dirs, a.size)
        conf = os.path.join(work, "rclone.conf")
        with open(conf, "w") as f:
            f.write(f"[s3]\ntype = s3\nprovider = Other\naccess_key_id = test\nsecret_access_key = test\n"
                    f"endpoint = http://127.0.0.1:{via}\nregion = us-east-1\n")
        t0 = time.monotonic()
        r = subprocess.run(["rclone", "--config", conf, "copy", src, f"s3:{BUCKET}/rclone"], env=env,
                           timeout=1800, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"rclone copy failed: {r.stderr.strip()[-500:]}")
        out["rclone_copy_s"] = round(time.monotonic() - t0, 2)
        # larder: the same tree written to a mount of the bucket, then drained.
        mnt, cache = os.path.join(work, "mnt-s3"), os.path.join(work, "cache-s3")
        flags = ["--s3-endpoint", f"http://127.0.0.1:{via}", "--sync-lag", "1h"]
        os.makedirs(mnt, exist_ok=True)
        cmd = [H.LARDER, "mount", f"s3://{BUCKET}/larder", mnt, "--cache-dir", cache] + flags
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"larder mount of S3 failed: {r.stderr.strip()}")
        H._mounts.append(("larder", mnt))
        try:
            out["larder_write_s"] = round(write_tree(mnt, a.files, a.dirs, a.size), 2)
            out["larder"] = drained(mnt, a.files, "s3")
            out["larder"]["flags"] = flags
        finally:
            H.unmount("larder", mnt)
        out["larder_over_rclone"] = round(out["larder"]["drain_s"] / max(out["rclone_copy_s"], 1e-9), 2)
        return out
    finally:
        H.stop_proc(proxy)
        H.stop_proc(moto)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency", default="30ms")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--dirs", type=int, default=20)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--skip-s3", action="store_true")
    ap.add_argument("--out", default=os.path.join(
        BENCH, "results", f"push-{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    if not os.path.exists(H.LARDER):
        sys.exit(f"{H.LARDER} is missing: cargo build --release -p larder (or set LARDER_BIN)")
    H.on_signals()
    res = {"latency": a.latency, "files": a.files, "dirs": a.dirs, "size": a.size,
           "command": " ".join(["bench/push.py"] + sys.argv[1:]), "env": H.environment()}
    with tempfile.TemporaryDirectory(prefix="larder-bench-push-", dir="/var/tmp") as work:
        try:
            res["directory"] = {"fixed_8": directory_home(work, a, 8), "window": directory_home(work, a, None)}
            d = res["directory"]
            d["window_over_fixed_8"] = round(d["window"]["files_per_s"] / max(d["fixed_8"]["files_per_s"], 1e-9), 2)
            if not a.skip_s3:
                res["s3"] = s3_home(work, a)
        finally:
            H.cleanup()
    d = res["directory"]
    lines = [f"# Pushing {a.files} new {a.size}-byte files in {a.dirs} directories to a home {a.latency} away",
             "", f"`{res['command']}`", "",
             "| home | pushers | drain (s) | files/s | home calls per file | home equal |", "|---|---|---:|---:|---:|---|"]
    for key, label in (("fixed_8", "8, fixed"), ("window", "window, up to 64")):
        r = d[key]
        lines.append(f"| directory | {label} | {r['drain_s']} | {r['files_per_s']} | {r['home_calls_per_file']} | "
                     f"{r['home_equal']} |")
    if "s3" in res:
        s = res["s3"]
        lines.append(f"| S3 (moto) | window, up to 64 | {s['larder']['drain_s']} | {s['larder']['files_per_s']} | "
                     f"{s['larder']['home_calls_per_file']} | |")
        lines += ["", f"`rclone copy` of the same tree to the same server through the same link: "
                  f"{s['rclone_copy_s']} s; larder's drain ÷ rclone copy: **{s['larder_over_rclone']}**"]
    lines += ["", f"Window ÷ 8 fixed pushers (files/s): **{d['window_over_fixed_8']}**", ""]
    H.save_results(a.out, res, lines)


if __name__ == "__main__":
    main()
