#!/usr/bin/env python3
"""A cold sequential read of one large S3 object through larder, against one GET of it through the same server
and link.

    bench/cold_read.py [--size 600MiB] [--latency 30ms] [--bandwidth 200MiB/s] [--runs 2] [--out FILE.json]

The server is s3s-fs (built by scripts/bench-setup.sh --suite), the object uploaded through it (so it keeps
its ETag and does not hash the file on every request). The link is bench/wanproxy.py. The baseline is one
GET of the whole object, streamed and thrown away (boto3); larder's figure is `dd bs=1M` of the object from a
fresh mount with an empty cache (`--validity-lag 1h`), after a `stat` of it. Each figure is the best of
--runs. Also counted: larder's home read calls for the read (its ranged GETs).

Results: JSON at --out and a Markdown table beside it (default bench/results/cold-read-<date>.json).
"""
import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import harness as H  # noqa: E402

KEY, SECRET, BUCKET = "larderbench", "larderbench-secret", "cold"
MiB = 1 << 20


def boto(endpoint, code, *args):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_CA_BUNDLE", None)
    prog = ("import boto3, sys, time\n"
            "s3 = boto3.client('s3', endpoint_url=sys.argv[1])\n" + code)
    r = subprocess.run([sys.executable, "-c", prog, endpoint] + list(args), env=env, capture_output=True,
                       text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip()[-500:])
    return r.stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="600MiB")
    ap.add_argument("--latency", default="30ms")
    ap.add_argument("--bandwidth", default="200MiB/s")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(
        BENCH, "results", f"cold-read-{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    size = H.parse_size(a.size)
    H.on_signals()
    res = {"size": size, "latency": a.latency, "bandwidth": a.bandwidth, "runs": a.runs,
           "command": " ".join(["bench/cold_read.py"] + sys.argv[1:]), "env": H.environment()}
    setup = H.bench_setup(res, suite=True, peers=True)
    s3s = setup.get("S3S_FS")
    if not s3s:
        sys.exit(f"s3s-fs is not installed: {setup.get('S3S_FS_ERROR')}")
    with tempfile.TemporaryDirectory(prefix="larder-bench-cold-", dir="/var/tmp") as work:
        try:
            root = os.path.join(work, "s3root")
            os.makedirs(os.path.join(root, BUCKET))
            port = H.free_port()
            srv = H.spawn([s3s, "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY,
                           "--secret-key", SECRET, root], os.path.join(work, "s3s-fs.log"))
            if not H.wait_port(port, 60, srv):
                raise RuntimeError("s3s-fs did not come up")
            src = os.path.join(work, "big.bin")
            H.write_random(src, size)
            direct = f"http://127.0.0.1:{port}"
            boto(direct, "s3.upload_file(sys.argv[2], sys.argv[3], 'big.bin')", src, BUCKET)
            os.remove(src)
            via = H.free_port()
            proxy = H.spawn([sys.executable, os.path.join(BENCH, "wanproxy.py"), "--listen", f"127.0.0.1:{via}",
                             "--target", f"127.0.0.1:{port}", "--latency", a.latency, "--bandwidth", a.bandwidth],
                            os.path.join(work, "wanproxy.log"))
            if not H.wait_port(via, 30, proxy):
                raise RuntimeError("wanproxy did not come up")
            endpoint = f"http://127.0.0.1:{via}"
            gets = []
            for _ in range(a.runs):
                took = boto(endpoint, (
                    "t = time.monotonic(); body = s3.get_object(Bucket=sys.argv[2], Key='big.bin')['Body']\n"
                    "n = 0\n"
                    "for chunk in body.iter_chunks(1 << 20): n += len(chunk)\n"
                    "assert n == int(sys.argv[3]), n\n"
                    "print(time.monotonic() - t)"), BUCKET, str(size))
                gets.append(round(float(took), 2))
            reads, calls = [], []
            for i in range(a.runs):
                mnt, cache = os.path.join(work, f"mnt{i}"), os.path.join(work, f"cache{i}")
                os.makedirs(mnt)
                env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
                r = subprocess.run([H.LARDER, "mount", f"s3://{BUCKET}", mnt, "--cache-dir", cache,
                                    "--s3-endpoint", endpoint, "--validity-lag", "1h"], env=env,
                                   capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    raise RuntimeError(f"larder mount failed: {r.stderr.strip()}")
                H._mounts.append(("larder", mnt))
                try:
                    os.stat(os.path.join(mnt, "big.bin"))
                    before = H.larder_status(mnt)["home"]["ops_by_kind"].get("read", 0)
                    H.drop_caches()
                    t = time.monotonic()
                    subprocess.run(["dd", f"if={os.path.join(mnt, 'big.bin')}", "of=/dev/null", "bs=1M"],
                                   check=True, capture_output=True, timeout=3600)
                    reads.append(round(time.monotonic() - t, 2))
                    calls.append(H.larder_status(mnt)["home"]["ops_by_kind"].get("read", 0) - before)
                finally:
                    H.unmount("larder", mnt)
            H.stop_proc(proxy)
            H.stop_proc(srv)
        finally:
            H.cleanup()
    res["one_get_s"], res["larder_s"], res["larder_home_reads"] = gets, reads, calls
    best_get, best_read = min(gets), min(reads)
    res["larder_over_one_get"] = round(best_read / best_get, 2)
    lines = [f"# A cold sequential read of a {size // MiB} MiB S3 object, {a.latency} and {a.bandwidth} away",
             "", f"`{res['command']}` (s3s-fs behind bench/wanproxy.py; best of {a.runs})", "",
             "| reader | seconds | MiB/s | home reads |", "|---|---:|---:|---:|",
             f"| one GET of the object (boto3) | {best_get} | {size / MiB / best_get:.0f} | 1 |",
             f"| larder, cold cache, `dd bs=1M` | {best_read} | {size / MiB / best_read:.0f} | "
             f"{calls[reads.index(best_read)]} |", "",
             f"larder ÷ one GET: **{res['larder_over_one_get']}** (target: at most 1.25)", ""]
    H.save_results(a.out, res, lines)


if __name__ == "__main__":
    main()
