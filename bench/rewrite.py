#!/usr/bin/env python3
"""A 1 MiB rewrite inside a large S3 object: what the push moves, against the object's size.

    bench/rewrite.py [--size 600MiB] [--out FILE.json]

The server is moto (started here, scripts/s3-server.sh's kind). The object is uploaded with boto3; a larder
write-back mount (sync lag an hour) writes 1 MiB in its middle, then `larder drain` pushes it. Reported: the
drain's time, and `larder status`'s home.rewrites (bytes sent and received over the link, bytes the server
copied) against the object's size. Results: JSON at --out and a Markdown table beside it.
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
sys.path.insert(0, BENCH)
import harness as H  # noqa: E402

MiB = 1 << 20
BUCKET = "rewrite"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="600MiB")
    ap.add_argument("--out", default=os.path.join(
        BENCH, "results", f"rewrite-{datetime.date.today().isoformat()}.json"))
    a = ap.parse_args()
    size = H.parse_size(a.size)
    H.on_signals()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    env.pop("AWS_CA_BUNDLE", None)
    res = {"size": size, "command": " ".join(["bench/rewrite.py"] + sys.argv[1:]), "env": H.environment()}
    with tempfile.TemporaryDirectory(prefix="larder-bench-rewrite-", dir="/var/tmp") as work:
        try:
            port = H.free_port()
            srv = H.spawn([shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1", "-p", str(port)],
                          os.path.join(work, "moto.log"))
            if not H.wait_port(port, 60, srv):
                raise RuntimeError("moto_server did not come up")
            endpoint = f"http://127.0.0.1:{port}"
            src = os.path.join(work, "big.bin")
            H.write_random(src, size)
            subprocess.run([sys.executable, "-c", (
                "import boto3, sys\n"
                "s3 = boto3.client('s3', endpoint_url=sys.argv[1])\n"
                "s3.create_bucket(Bucket=sys.argv[2])\n"
                "s3.upload_file(sys.argv[3], sys.argv[2], 'home/big.bin')"), endpoint, BUCKET, src],
                check=True, env=env, timeout=1800)
            mnt, cache = os.path.join(work, "mnt"), os.path.join(work, "cache")
            os.makedirs(mnt)
            r = subprocess.run([H.LARDER, "mount", f"s3://{BUCKET}/home", mnt, "--cache-dir", cache,
                                "--s3-endpoint", endpoint, "--sync-lag", "1h", "--validity-lag", "1h"],
                               env=env, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"larder mount failed: {r.stderr.strip()}")
            H._mounts.append(("larder", mnt))
            try:
                at = size // 2 // MiB * MiB
                with open(os.path.join(mnt, "big.bin"), "r+b") as f:
                    f.seek(at)
                    f.write(os.urandom(MiB))
                t = time.monotonic()
                H.run([H.LARDER, "drain", mnt, "--timeout", "1800s"], timeout=1900)
                res["drain_s"] = round(time.monotonic() - t, 2)
                res["rewrites"] = H.larder_status(mnt)["home"].get("rewrites")
            finally:
                H.unmount("larder", mnt)
            H.stop_proc(srv)
        finally:
            H.cleanup()
    rw = res["rewrites"] or {}
    part = 8 * MiB
    res["sent_parts"] = round(rw.get("sent", 0) / part, 2)
    lines = [f"# A 1 MiB rewrite inside a {size // MiB} MiB S3 object (moto)", "", f"`{res['command']}`", "",
             "| drain (s) | sent | received | copied at the server | sent, in 8 MiB parts |",
             "|---:|---:|---:|---:|---:|",
             f"| {res['drain_s']} | {rw.get('sent', 0) / MiB:.0f} MiB | {rw.get('received', 0) / MiB:.0f} MiB | "
             f"{rw.get('copied', 0) / MiB:.0f} MiB | {res['sent_parts']} |", "",
             "Target: at most 2 parts' bytes sent.", ""]
    H.save_results(a.out, res, lines)


if __name__ == "__main__":
    main()
