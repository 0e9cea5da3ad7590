#!/usr/bin/env python3
"""A tiny S3 client for larder's tests (boto3), against the endpoint in $S3_ENDPOINT.

    s3tool.py mb BUCKET                      make a bucket (no error if it exists)
    s3tool.py put BUCKET KEY FILE            store FILE's bytes as KEY ('-' reads stdin)
    s3tool.py get BUCKET KEY FILE            write KEY's bytes to FILE ('-' writes stdout)
    s3tool.py ls BUCKET [PREFIX]             every key under PREFIX: "KEY<TAB>SIZE<TAB>ETAG" per line
    s3tool.py rm BUCKET KEY                  delete KEY
    s3tool.py etag BUCKET KEY                KEY's ETag (without quotes)
    s3tool.py put-many BUCKET PREFIX N SIZE  N objects PREFIX/f00000.. of SIZE bytes each
    s3tool.py put-dir BUCKET PREFIX DIR      every file under DIR as PREFIX/<relative path>
    s3tool.py get-dir BUCKET PREFIX DIR      every object under PREFIX/ into DIR/<rest of key>

put-many's object i holds the decimal i, zero-padded to 5 digits and repeated, cut to SIZE bytes.
Credentials and region come from the usual AWS variables (default test/test, us-east-1). Errors print
a message and exit non-zero; a missing key or bucket exits 2, other failures 1.
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError:  # pragma: no cover
    sys.exit("s3tool: boto3 is not installed (python3 -m pip install boto3)")

THREADS = 16


def die(msg, code=1):
    print(f"s3tool: {msg}", file=sys.stderr)
    sys.exit(code)


def client():
    endpoint = os.environ.get("S3_ENDPOINT")
    if not endpoint:
        die("S3_ENDPOINT is not set (eval \"$(scripts/s3-server.sh start)\")")
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=5,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=THREADS * 2,
        ),
    )


def join(prefix, name):
    if not prefix or prefix.endswith("/"):
        return prefix + name
    return prefix + "/" + name


def put_many_body(i, size):
    unit = f"{i:05d}".encode()
    return (unit * (size // len(unit) + 1))[:size]


def run_pool(fn, items):
    """Run fn over items on a thread pool; the first error fails the whole command."""
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for _ in pool.map(fn, items):
            pass


def list_keys(s3, bucket, prefix):
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            yield o


def cmd_mb(s3, bucket):
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def cmd_put(s3, bucket, key, path):
    data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    s3.put_object(Bucket=bucket, Key=key, Body=data)


def cmd_get(s3, bucket, key, path):
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    out = sys.stdout.buffer if path == "-" else open(path, "wb")
    try:
        for chunk in body.iter_chunks(1 << 20):
            out.write(chunk)
    finally:
        if path != "-":
            out.close()
        else:
            out.flush()


def cmd_ls(s3, bucket, prefix=""):
    for o in list_keys(s3, bucket, prefix):
        print(f"{o['Key']}\t{o['Size']}\t{o['ETag'].strip(chr(34))}")


def cmd_rm(s3, bucket, key):
    s3.delete_object(Bucket=bucket, Key=key)


def cmd_etag(s3, bucket, key):
    print(s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"'))


def cmd_meta(s3, bucket, key):
    """The object's user metadata (x-amz-meta-*), a KEY=VALUE line each, sorted."""
    meta = s3.head_object(Bucket=bucket, Key=key)["Metadata"]
    for k in sorted(meta):
        print(f"{k}={meta[k]}")


def cmd_put_many(s3, bucket, prefix, n, size):
    n, size = int(n), int(size)
    if n < 0 or size < 0 or n > 100000:
        die("put-many: N must be 0..100000 and SIZE >= 0")

    def one(i):
        s3.put_object(Bucket=bucket, Key=join(prefix, f"f{i:05d}"), Body=put_many_body(i, size))

    run_pool(one, range(n))


def cmd_put_dir(s3, bucket, prefix, root):
    if not os.path.isdir(root):
        die(f"put-dir: {root} is not a directory")
    files = []
    for d, _, names in os.walk(root):
        for name in names:
            full = os.path.join(d, name)
            files.append((full, os.path.relpath(full, root)))

    def one(item):
        full, rel = item
        with open(full, "rb") as f:
            s3.put_object(Bucket=bucket, Key=join(prefix, rel), Body=f.read())

    run_pool(one, files)


def cmd_get_dir(s3, bucket, prefix, root):
    pfx = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    keys = [o["Key"] for o in list_keys(s3, bucket, pfx)]

    def one(key):
        rel = key[len(pfx):]
        if not rel or rel.endswith("/"):
            return  # a directory marker
        dest = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        cmd_get(s3, bucket, key, dest)

    os.makedirs(root, exist_ok=True)
    run_pool(one, keys)


COMMANDS = {
    "mb": (cmd_mb, ["BUCKET"]),
    "put": (cmd_put, ["BUCKET", "KEY", "FILE"]),
    "get": (cmd_get, ["BUCKET", "KEY", "FILE"]),
    "ls": (cmd_ls, ["BUCKET", "[PREFIX]"]),
    "rm": (cmd_rm, ["BUCKET", "KEY"]),
    "etag": (cmd_etag, ["BUCKET", "KEY"]),
    "meta": (cmd_meta, ["BUCKET", "KEY"]),
    "put-many": (cmd_put_many, ["BUCKET", "PREFIX", "N", "SIZE"]),
    "put-dir": (cmd_put_dir, ["BUCKET", "PREFIX", "DIR"]),
    "get-dir": (cmd_get_dir, ["BUCKET", "PREFIX", "DIR"]),
}


def usage(code=2):
    lines = [f"  s3tool.py {name} {' '.join(args)}" for name, (_, args) in COMMANDS.items()]
    print("usage:\n" + "\n".join(lines), file=sys.stderr)
    sys.exit(code)


def main(argv):
    if len(argv) < 1 or argv[0] not in COMMANDS:
        usage()
    fn, params = COMMANDS[argv[0]]
    args = argv[1:]
    required = sum(1 for p in params if not p.startswith("["))
    if not required <= len(args) <= len(params):
        die(f"usage: s3tool.py {argv[0]} {' '.join(params)}", 2)
    try:
        fn(client(), *args)
    except ClientError as e:
        err = e.response.get("Error", {})
        code = err.get("Code", "?")
        missing = code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound")
        die(f"{argv[0]} {' '.join(args)}: {code}: {err.get('Message', e)}", 2 if missing else 1)
    except (BotoCoreError, OSError) as e:
        die(f"{argv[0]} {' '.join(args)}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
