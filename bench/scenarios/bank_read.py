"""Read throughput through a shared bank: fresh larder mounts reading a data set another mount left in the
bank (IMCa §5.5, its clients reading through the shared memcached).

The data set at home: one large file (256 MiB by default) and 200 files of 64 KiB, written once, untimed.
Every mount is read-only with `--validity-lag 1h`, a fresh empty cache directory of its own, and its home
calls behind its own `--emulate-wan` link (10 ms round trip, 100 MiB/s by default). Each reader is a
process (bench/worker.py trace) reading every file of the set whole, once, through its own mount; the page
cache is dropped before each timed read.
1. memcached (`-m 1024 -I 4m`, started empty): a warmer mount with `--bank memcache://...` reads the set
   (from home over its link), and its fills are let finish (its bank puts unchanged for a second); it is
   unmounted. Then C = 1, 2, 4 fresh client mounts with the same bank read the set at the same time
   (released together). Aggregate MiB/s = C × the set ÷ the slowest reader's time; home's bytes and calls
   are the clients' (summed over their mounts). Each C is run twice, on fresh mounts each time, the faster
   reported (both kept in the JSON): a read from the bank lasts a second or two.
2. The baseline: C = 1, 2, 4 fresh mounts without a bank, reading the set from home over their links. Each
   mount has a link of its own (so C of them have C times the bandwidth of one: the baseline is what C
   clients with separate links reach, an upper bound for clients sharing one).
3. Redis (`--maxmemory 1024mb`, allkeys-lru, started empty): a warmer as in 1, then one fresh client.
"""
import os
import subprocess
import sys

import banks
import harness as H
from harness import MiB, log

TITLE = "Read throughput through a shared bank: fresh mounts reading what another left (IMCa §5.5)"
CLIENTS = [1, 2, 4]
SUB = "bank_read"
SMALL_SIZE = 64 << 10
MEMCACHED_MIB = 1024
MEMCACHED_ITEM = "4m"
REDIS_MIB = 1024
REPEATS = 2  # each client read on fresh mounts; the best is reported, every run kept
WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "worker.py")


def add_args(ap):
    ap.add_argument("--bank-read-size", type=H.parse_size, default=256 * MiB,
                    help="bank_read: the large file's size [256MiB]")
    ap.add_argument("--bank-read-small", type=int, default=200, help="bank_read: files of 64 KiB [200]")
    ap.add_argument("--bank-read-latency", default="10ms", help="bank_read: round trip of each mount's link [10ms]")
    ap.add_argument("--bank-read-bandwidth", type=H.parse_size, default=100 * MiB,
                    help="bank_read: bandwidth of each mount's link [100MiB]")


def make_set(ctx, size, small):
    """The data set at home (what is missing or of another size written); its paths and bytes."""
    d = ctx.subhome(SUB)
    big = os.path.join(d, "big")
    if not os.path.exists(big) or os.path.getsize(big) != size:
        log(f"bank_read: writing a {size / MiB:.0f} MiB file at home")
        H.write_random(big, size)
    os.makedirs(os.path.join(d, "small"), exist_ok=True)
    rels = [f"{SUB}/big"] + [f"{SUB}/small/s{i:04d}" for i in range(small)]
    for rel in rels[1:]:
        path = os.path.join(ctx.home, rel)
        if not os.path.exists(path) or os.path.getsize(path) != SMALL_SIZE:
            H.write_random(path, SMALL_SIZE)
    return rels, size + small * SMALL_SIZE


def read_set(ctx, ms, trace, set_bytes, timeout):
    """One reader process per mount, each reading the whole set, released together after a cache drop."""
    cmds = [[sys.executable, WORKER, "trace", m.mnt, trace] for m in ms]
    ctx.drop_caches()
    before = banks.snapshot(ms)
    ran = ctx.together(cmds, 1, timeout, lambda c: f"reader of {c[3]}")
    after = banks.snapshot(ms)
    secs, got, errors = [], 0, 0
    for (lines, stderr, code), c in zip(ran, cmds):
        if code != 0 or not lines:
            raise RuntimeError(f"reader of {c[3]} failed ({code}): {stderr.strip()[-300:]}")
        secs.append(lines[-1]["seconds"])
        got += lines[-1]["bytes"]
        errors += lines[-1]["errors"]
    slowest = max(secs)
    r = {"clients": len(ms), "seconds": round(slowest, 3), "clients_s": [round(s, 3) for s in secs],
         "MiB_s": round(len(ms) * set_bytes / MiB / slowest, 1), "bytes": got}
    if got != len(ms) * set_bytes or errors:
        r["errors"] = errors
        H.note(f"bank_read: {got} of {len(ms) * set_bytes} bytes read, {errors} failed files")
    tot = banks.total([banks.delta(b, a) for b, a in zip(before, after)])
    r.update(home_bytes_read=tot["home_bytes_read"], home_ops=tot["home_ops"], home_by_kind=tot["home_by_kind"])
    if "bank" in tot:
        r["bank"] = tot["bank"]
    return r


def warm(ctx, srv, flags, trace, set_bytes, timeout):
    """A warmer mount reads the set into the bank; its read and its fills."""
    log(f"bank_read: warming {srv.kind}")
    with banks.mounts(ctx, f"bread-warm-{srv.kind}", 1, flags + ["--bank", srv.url]) as ms:
        r = read_set(ctx, ms, trace, set_bytes, timeout)
        r["bank_after_fills"] = banks.settle(ms[0])
        r["mount_cmd"] = " ".join(ms[0].cmd)
    r["server"] = srv.figures()
    if r["bank_after_fills"].get("dropped") or r["bank_after_fills"].get("put_errors"):
        H.note(f"bank_read: the {srv.kind} warmer dropped {r['bank_after_fills']['dropped']} fills and "
               f"{r['bank_after_fills']['put_errors']} failed")
    return r


def clients(ctx, tag, c, flags, trace, set_bytes, timeout):
    """C fresh mounts reading the set together, REPEATS times (fresh mounts each time); the best run."""
    runs = []
    for i in range(REPEATS):
        log(f"bank_read: {tag}, C={c}, run {i + 1} of {REPEATS}")
        with banks.mounts(ctx, f"bread-{tag}-{c}", c, flags) as ms:
            runs.append(read_set(ctx, ms, trace, set_bytes, timeout))
    best = dict(max(runs, key=lambda x: x["MiB_s"]))
    best["runs_MiB_s"] = [x["MiB_s"] for x in runs]
    best["runs_home_bytes_read"] = [x["home_bytes_read"] for x in runs]
    return best


def guarded(label, fn, *args):
    try:
        return fn(*args)
    except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
        H.note(f"bank_read: {label}: {e}")
        return {"error": str(e)[-300:]}


def run(ctx):
    a = ctx.args
    for kind in ("memcache", "redis"):
        why = banks.available(kind)
        if why:
            raise RuntimeError(why)
    rels, set_bytes = make_set(ctx, a.bank_read_size, a.bank_read_small)
    trace = os.path.join(ctx.work, "bank_read.trace")
    with open(trace, "w") as f:
        f.write("\n".join(rels) + "\n")
    link = ctx.link(a.bank_read_latency, a.bank_read_bandwidth)
    flags = ["--read-only", "--validity-lag", "1h", "--cache-size", str(a.cache_size),
             "--emulate-wan", link.larder_spec()]
    # The slowest read: C sets over one link's bandwidth, with room for a slow machine.
    timeout = 300 + max(CLIENTS) * set_bytes / a.bank_read_bandwidth * 4
    res = {"set_bytes": set_bytes, "large_bytes": a.bank_read_size, "small_files": a.bank_read_small,
           "small_bytes": SMALL_SIZE, "link": link.describe(), "link_MiB_s": a.bank_read_bandwidth / MiB,
           "clients": CLIENTS, "mount_flags": flags, "memcached": {}, "no bank": {}, "redis": {}}
    with banks.server(ctx, "memcache", MEMCACHED_MIB, MEMCACHED_ITEM, "read") as srv:
        res["memcached_cmd"] = " ".join(srv.cmd)
        res["memcached warmer"] = guarded("memcached warmer", warm, ctx, srv, flags, trace, set_bytes, timeout)
        if "error" not in res["memcached warmer"]:
            for c in CLIENTS:
                res["memcached"][str(c)] = guarded(f"memcached, C={c}", clients, ctx, "memcache", c,
                                                   flags + ["--bank", srv.url], trace, set_bytes, timeout)
        res["memcached_server_end"] = srv.figures()
    for c in CLIENTS:
        res["no bank"][str(c)] = guarded(f"no bank, C={c}", clients, ctx, "nobank", c, flags, trace, set_bytes,
                                         timeout)
    with banks.server(ctx, "redis", REDIS_MIB, tag="read") as srv:
        res["redis_cmd"] = " ".join(srv.cmd)
        res["redis warmer"] = guarded("redis warmer", warm, ctx, srv, flags, trace, set_bytes, timeout)
        if "error" not in res["redis warmer"]:
            res["redis"]["1"] = guarded("redis, C=1", clients, ctx, "redis", 1, flags + ["--bank", srv.url],
                                        trace, set_bytes, timeout)
        res["redis_server_end"] = srv.figures()
    return res


def plot(r, ctx):
    path = ctx.plot("bank_read") if ctx else None
    if not path:
        return None
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (cfg, label) in enumerate((("memcached", "memcached bank"), ("no bank", "no bank (each its own link)"),
                                      ("redis", "Redis bank"))):
        pts = {int(c): v["MiB_s"] for c, v in r[cfg].items() if "MiB_s" in v}
        if pts:
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=label, color=f"C{i}")
    ax.axhline(r["link_MiB_s"], color="grey", linestyle="--", label="one link's bandwidth")
    ax.set_xscale("log", base=2)
    ax.set_xticks(r["clients"], [str(c) for c in r["clients"]])
    ax.set_xlabel("client mounts (C)")
    ax.set_ylabel("aggregate MiB/s (this machine)")
    ax.set_title(f"fresh mounts reading {r['set_bytes'] / MiB:.1f} MiB")
    ax.legend(fontsize=8)
    return H.save_plot(fig, path, "bank read throughput")


def report(r, ctx):
    mib = r["set_bytes"] / MiB
    lines = [f"The set: {r['large_bytes'] / MiB:.0f} MiB in one file and {r['small_files']} files of "
             f"{r['small_bytes'] >> 10} KiB ({mib:.1f} MiB). Every mount fresh, with an empty cache and its own "
             f"link to home ({r['link']}); each reader a process reading the whole set through its own mount, "
             "page cache dropped first, C readers released together. Aggregate MiB/s = C × the set ÷ the slowest "
             "reader's seconds, the faster of two runs on fresh mounts. Bank: a warmer mount read the set "
             "first (its fills let finish), then fresh client mounts read it; no bank: fresh mounts read it "
             "from home, each over a link of its own (so the baseline's C links carry C times one link's "
             "bandwidth). Bank hits and misses count units, attributes and listings.", ""]
    header = ["C", "memcached MiB/s", "no bank MiB/s", "memcached ÷ no bank", "memcached ÷ one link",
              "clients' home MiB, memcached", "home MiB, no bank", "bank hits", "bank misses"]
    rows = []
    for c in map(str, r["clients"]):
        b, nb = r["memcached"].get(c, {}), r["no bank"].get(c, {})
        rows.append([c, b.get("MiB_s"), nb.get("MiB_s"), H.ratio(b.get("MiB_s"), nb.get("MiB_s")),
                     H.ratio(b.get("MiB_s"), r["link_MiB_s"]),
                     round(b["home_bytes_read"] / MiB, 2) if "home_bytes_read" in b else None,
                     round(nb["home_bytes_read"] / MiB, 1) if "home_bytes_read" in nb else None,
                     H.get(b, "bank", "hits"), H.get(b, "bank", "misses")])
    lines.append(H.md_table(header, rows))
    lines += ["", "memcached against Redis, one client (and the warmer's read from home, filling the bank):", ""]
    rows = []
    for kind, cfg in (("memcached", "memcached"), ("Redis", "redis")):
        w, one = r.get(f"{cfg} warmer", {}), r[cfg].get("1", {})
        srv = r.get(f"{cfg}_server_end") or {}
        rows.append([kind, one.get("MiB_s"), round(one["home_bytes_read"] / MiB, 2) if "home_bytes_read" in one
                     else None, H.get(one, "bank", "hits"), H.get(one, "bank", "misses"), w.get("MiB_s"),
                     H.get(w, "bank_after_fills", "puts"), H.get(w, "bank_after_fills", "dropped"),
                     round(srv["bytes"] / MiB, 1) if srv.get("bytes") else None])
    lines.append(H.md_table(["bank", "C=1 MiB/s", "client's home MiB", "bank hits", "bank misses",
                             "warmer MiB/s", "warmer's puts", "dropped fills", "server MiB held"], rows))
    errs = [f"{cfg}, C={c}: {v['error']}" for cfg in ("memcached", "no bank", "redis")
            for c, v in r[cfg].items() if "error" in v]
    errs += [f"{w}: {r[w]['error']}" for w in ("memcached warmer", "redis warmer") if "error" in r.get(w, {})]
    if errs:
        lines += ["", "Failed: " + "; ".join(errs)]
    pic = plot(r, ctx)
    if pic:
        lines += ["", pic]
    return "\n".join(lines)
