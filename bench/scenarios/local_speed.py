"""Local-disk speed on the default (write-back) mount: warm reads and rewrites against the local disk.

On the mount users get by default (write-back, passthrough on), after a cold fill over the link:
- sequential read of a large file (1 GiB), the page cache dropped before each read: the first warm read
  after the cold fill, and the second;
- 4 KiB reads at random offsets of it, page cache dropped first;
- rewriting a cached file (256 MiB) in place in 1 MiB writes, then `fsync`.
The limit is the same on the local disk (`direct`: the home directory, on the disk the cache uses), in
the same run. larder's status says how many reads the daemon served (0: the kernel read the cache file).

"First warm read" is a read of a file just written to the disk: larder's cache file right after the cold
fill wrote it, and for `direct` a copy of the file written just before. A disk still busy with the
writeback of a file just written reads it slower (measured here: 1.2-2.6 GB/s against 3.5-4.0 GB/s a few
seconds later, for the cache file read with `dd` and for a file written with `head`), so both sides pay
it. The second warm read comes 5 s later on both sides.
"""
import os
import random
import time

import harness as H
from harness import MiB, log

TITLE = "Local-disk speed on the default mount (warm reads, rewrites)"
RAND_OPS = 20000
RAND_SECONDS = 60


def add_args(ap):
    ap.add_argument("--local-read-size", type=H.parse_size, default=1 << 30,
                    help="local_speed: file read sequentially and at random [1GiB]")
    ap.add_argument("--local-rewrite-size", type=H.parse_size, default=256 * MiB,
                    help="local_speed: file rewritten in place [256MiB]")


def rewrite(path, size):
    """Rewrite `path` in place in 1 MiB writes, then fsync; seconds."""
    chunk = os.urandom(MiB)
    fd = os.open(path, os.O_WRONLY)
    t0 = time.monotonic()
    try:
        off = 0
        while off < size:
            off += os.pwrite(fd, chunk, off)
        os.fsync(fd)
    finally:
        os.close(fd)
    secs = time.monotonic() - t0
    return {"seconds": round(secs, 3), "MiB_s": round(size / MiB / secs, 1)}


def daemon_reads(m):
    st = m.status()
    return H.get(st, "efficiency", "reads") if st else None


def run(ctx):
    size, rsize = ctx.args.local_read_size, ctx.args.local_rewrite_size
    home = ctx.subhome("local")
    big, small = os.path.join(home, "big"), os.path.join(home, "rewrite")
    for path, n in [(big, size), (small, rsize)]:
        if not os.path.exists(path) or os.path.getsize(path) != n:
            log(f"local_speed: writing a {n / MiB:.0f} MiB file at home")
            H.write_random(path, n)
    rng = random.Random(7)
    offsets = [rng.randrange(0, size // 4096) * 4096 for _ in range(RAND_OPS)]
    res = {"size": size, "rewrite_size": rsize, "link": ctx.wan.describe(), "systems": {}}
    for s in [ctx.system("direct"), ctx.system("larder")]:
        r = res["systems"].setdefault(s.name, {})
        link = None if s.name == "direct" else ctx.wan
        with s.mount(ctx, "local", link=link, writable=True) as m:
            path, rpath = m.path("local/big"), m.path("local/rewrite")
            if s.name != "direct":
                ctx.drop_caches()
                log("local_speed: larder, cold fill over the link")
                r["cold"] = H.seq_read(path, 600)
                H.seq_read(rpath, 600)
            reads = daemon_reads(m)
            first = path
            if s.name == "direct":
                # A file just written, as larder's cache file is just after its cold fill.
                first = m.path("local/big-fresh")
                H.write_random(first, size)
            ctx.drop_caches()
            log(f"local_speed: {s.name}, first warm sequential read")
            r["warm1"] = H.seq_read(first, 600)
            if first != path:
                os.unlink(first)
            time.sleep(5)
            ctx.drop_caches()
            log(f"local_speed: {s.name}, second warm sequential read")
            r["warm2"] = H.seq_read(path, 600)
            ctx.drop_caches()
            log(f"local_speed: {s.name}, 4 KiB random reads")
            r["random"] = H.rand_read(path, offsets, RAND_SECONDS)
            if reads is not None:
                r["daemon_reads_while_warm"] = daemon_reads(m) - reads
            ctx.drop_caches()
            log(f"local_speed: {s.name}, rewrite in place and fsync")
            r["rewrite"] = rewrite(rpath, rsize)
            r["rewrite_again"] = rewrite(rpath, rsize)
    return res


def report(r, ctx):
    sy = r["systems"]
    g = lambda s, *k: H.get(sy, s, *k)
    rows = [
        ["sequential read, first warm (just written: after the cold fill; direct: a fresh copy), MiB/s", g("direct", "warm1", "MiB_s"),
         g("larder", "warm1", "MiB_s"), H.ratio(g("larder", "warm1", "MiB_s"), g("direct", "warm1", "MiB_s")), "0.95"],
        ["sequential read, 5 s later, MiB/s", g("direct", "warm2", "MiB_s"), g("larder", "warm2", "MiB_s"),
         H.ratio(g("larder", "warm2", "MiB_s"), g("direct", "warm2", "MiB_s")), "0.95"],
        ["4 KiB random reads, ops/s", g("direct", "random", "ops_s"), g("larder", "random", "ops_s"),
         H.ratio(g("larder", "random", "ops_s"), g("direct", "random", "ops_s")), "0.9"],
        ["rewrite in place + fsync, MiB/s", g("direct", "rewrite", "MiB_s"), g("larder", "rewrite", "MiB_s"),
         H.ratio(g("larder", "rewrite", "MiB_s"), g("direct", "rewrite", "MiB_s")), "0.8"],
        ["the same, again (the file is dirty now), MiB/s", g("direct", "rewrite_again", "MiB_s"),
         g("larder", "rewrite_again", "MiB_s"),
         H.ratio(g("larder", "rewrite_again", "MiB_s"), g("direct", "rewrite_again", "MiB_s")), "0.8"],
    ]
    lines = [f"The default mount (write-back, passthrough on), the cache filled over {r['link']} first; "
             f"{r['size'] / MiB:.0f} MiB read, {r['rewrite_size'] / MiB:.0f} MiB rewritten; page cache dropped "
             "before each read. direct: the same files on the local disk, in the same run.", "",
             H.md_table(["figure", "direct", "larder", "larder ÷ direct", "target"], rows), "",
             f"Cold fill over the link: {g('larder', 'cold', 'MiB_s')} MiB/s. Reads the daemon served during "
             f"the warm reads: {g('larder', 'daemon_reads_while_warm')} (0: the kernel read the cache file)."]
    return "\n".join(lines)
