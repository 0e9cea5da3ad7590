#!/usr/bin/env python3
"""One client of a benchmark scenario, run as its own process by bench/suite.py so that K clients are K
processes (as the seeds' experiments ran them), each printing one JSON line of results.

    worker.py records DIR SIZE...          read 1024 records of each size from DIR/r<SIZE>, the mean µs per
                                          read of each size
    worker.py read FILE OFFSET LENGTH      1 MiB preads over the range
    worker.py write FILE SIZE              write SIZE bytes in 1 MiB writes, fsync, close
    worker.py trace ROOT TRACE             read each file listed in TRACE (relative to ROOT) whole, in order
    worker.py trace-uncached ROOT TRACE SPLIT   the same, dropping each file's pages from the kernel's page
                                          cache after its read (so the next request for it reaches the file
                                          system), with latencies also of files <= SPLIT bytes and larger
    worker.py creates DIR SECONDS CAP      create empty files (open O_CREAT|O_EXCL, close) for SECONDS
    worker.py propfind URL LIST            a WebDAV PROPFIND (Depth 0) of every path in LIST, one connection
    worker.py reread PASSES FILE...        read every FILE whole, PASSES times
    worker.py tcp-recv ADDR PORT SECONDS   accept one TCP connection at ADDR:PORT and read it to its end (or
                                          SECONDS): the raw TCP throughput a sender reaches
    worker.py tcp-send ADDR PORT BYTES SECONDS   send BYTES (or for SECONDS) over one connection to ADDR:PORT

Barrier: before each timed phase the worker prints "ready" and waits for a line on stdin ("go"), so the
clients of a run start together; `records` waits before each record size, as IMCa separates sizes with
barriers. Every loop is bounded (by its input, CAP or SECONDS).
"""
import json
import os
import sys
import time

MiB = 1 << 20


def barrier():
    print("ready", flush=True)
    if not sys.stdin.readline():
        sys.exit("no go from the suite")


def records(d, sizes):
    out = {}
    for size in sizes:
        barrier()
        buf = bytearray(size)
        mv = [memoryview(buf)]
        fd = os.open(os.path.join(d, f"r{size}"), os.O_RDONLY)
        short = 0
        t0 = time.perf_counter()
        for i in range(1024):
            if os.preadv(fd, mv, i * size) != size:
                short += 1
        dt = time.perf_counter() - t0
        os.close(fd)
        out[str(size)] = {"mean_us": round(dt / 1024 * 1e6, 3), "short": short}
    return {"records": out}


def read_range(path, offset, length):
    buf = bytearray(MiB)
    mv = [memoryview(buf)]
    barrier()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    done = 0
    while done < length:
        n = os.preadv(fd, [mv[0][: min(MiB, length - done)]], offset + done)
        if n <= 0:
            break
        done += n
    os.close(fd)
    return {"bytes": done, "seconds": time.perf_counter() - t0}


def write_file(path, size):
    chunk = os.urandom(MiB)
    barrier()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    done = 0
    while done < size:
        done += os.write(fd, chunk[: min(MiB, size - done)])
    t_written = time.perf_counter() - t0
    os.fsync(fd)
    os.close(fd)
    return {"bytes": done, "seconds": time.perf_counter() - t0, "write_seconds": t_written}


def latency_stats(lat):
    """Mean, median and 99th percentile of the latencies `lat` (seconds), in ms."""
    lat = sorted(lat)
    pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: None)
    return {"mean": sum(lat) / max(len(lat), 1) * 1e3, "p50": pick(0.5), "p99": pick(0.99)}


def trace(root, tracefile, uncached=False, split=None):
    with open(tracefile) as f:
        paths = [line.rstrip("\n") for line in f if line.strip()]
    buf = bytearray(MiB)
    mv = memoryview(buf)
    lat, sizes = [], []
    total = errors = 0
    barrier()
    t0 = time.perf_counter()
    for rel in paths:
        s = time.perf_counter()
        off = 0
        try:
            fd = os.open(os.path.join(root, rel), os.O_RDONLY)
            try:
                while True:
                    n = os.preadv(fd, [mv], off)
                    if n <= 0:
                        break
                    off += n
            finally:
                if uncached:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            total += off
        except OSError:
            errors += 1
        lat.append(time.perf_counter() - s)
        sizes.append(off)
    dt = time.perf_counter() - t0
    r = {"requests": len(paths), "errors": errors, "bytes": total, "seconds": dt, "latency_ms": latency_stats(lat)}
    if split is not None:
        small = [t for t, n in zip(lat, sizes) if n <= split]
        r["small"] = {"requests": len(small), "latency_ms": latency_stats(small)}
        r["large"] = {"requests": len(lat) - len(small),
                      "latency_ms": latency_stats([t for t, n in zip(lat, sizes) if n > split])}
    return r


def creates(d, seconds, cap):
    os.makedirs(d, exist_ok=True)
    barrier()
    n, t0 = 0, time.perf_counter()
    while n < cap and time.perf_counter() - t0 < seconds:
        os.close(os.open(os.path.join(d, f"f{n:06d}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        n += 1
    return {"creates": n, "seconds": time.perf_counter() - t0}


def propfind(url, listfile):
    import http.client
    import urllib.parse
    u = urllib.parse.urlsplit(url)
    with open(listfile) as f:
        paths = [line.rstrip("\n") for line in f if line.strip()]
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = b'<?xml version="1.0"?><propfind xmlns="DAV:"><prop><getcontentlength/><getlastmodified/>' \
           b'<resourcetype/></prop></propfind>'
    errors = 0
    barrier()
    t0 = time.perf_counter()
    for p in paths:
        conn.request("PROPFIND", u.path.rstrip("/") + "/" + urllib.parse.quote(p), body=body,
                     headers={"Depth": "0", "Content-Type": "application/xml"})
        r = conn.getresponse()
        r.read()
        if r.status != 207:
            errors += 1
    return {"files": len(paths), "errors": errors, "seconds": time.perf_counter() - t0}


def reread(passes, files):
    buf = bytearray(MiB)
    mv = [memoryview(buf)]
    per_pass = []
    total = 0
    barrier()
    t0 = time.perf_counter()
    for _ in range(passes):
        s = time.perf_counter()
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            off = 0
            while True:
                n = os.preadv(fd, mv, off)
                if n <= 0:
                    break
                off += n
            os.close(fd)
            total += off
        per_pass.append(time.perf_counter() - s)
    return {"bytes": total, "seconds": time.perf_counter() - t0, "pass_seconds": per_pass}


def tcp_recv(addr, port, seconds):
    import socket
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(1)
    srv.settimeout(60)
    barrier()
    conn, _ = srv.accept()
    conn.settimeout(60)
    buf = bytearray(4 * MiB)
    mv = memoryview(buf)
    got = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n = conn.recv_into(mv)
        if n <= 0:
            break
        got += n
    dt = time.perf_counter() - t0
    conn.close()
    srv.close()
    return {"bytes": got, "seconds": dt, "MiB_s": got / MiB / dt}


def tcp_send(addr, port, size, seconds):
    import socket
    chunk = memoryview(os.urandom(4 * MiB))
    barrier()
    deadline = time.monotonic() + 60
    while True:  # the receiver listens before it says ready; a refused connect is retried a moment
        try:
            conn = socket.create_connection((addr, port), timeout=60)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    sent = 0
    t0 = time.perf_counter()
    while sent < size and time.perf_counter() - t0 < seconds:
        conn.sendall(chunk[: min(len(chunk), size - sent)])
        sent += min(len(chunk), size - sent)
    conn.close()
    return {"bytes": sent, "seconds": time.perf_counter() - t0}


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "records":
        r = records(args[0], [int(x) for x in args[1:]])
    elif cmd == "read":
        r = read_range(args[0], int(args[1]), int(args[2]))
    elif cmd == "write":
        r = write_file(args[0], int(args[1]))
    elif cmd == "trace":
        r = trace(args[0], args[1])
    elif cmd == "trace-uncached":
        r = trace(args[0], args[1], uncached=True, split=int(args[2]))
    elif cmd == "creates":
        r = creates(args[0], float(args[1]), int(args[2]))
    elif cmd == "propfind":
        r = propfind(args[0], args[1])
    elif cmd == "reread":
        r = reread(int(args[0]), args[1:])
    elif cmd == "tcp-recv":
        r = tcp_recv(args[0], int(args[1]), float(args[2]))
    elif cmd == "tcp-send":
        r = tcp_send(args[0], int(args[1]), int(args[2]), float(args[3]))
    else:
        sys.exit(f"unknown command {cmd}")
    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
