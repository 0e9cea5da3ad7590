"""Local-disk speed on the default (write-back) mount: warm reads and rewrites against the local disk.

On the mount users get by default (write-back, passthrough on), after a cold fill over the link:
- sequential read of a large file (1 GiB), the page cache dropped before each read: the first warm read
  after the cold fill, and the second;
- 4 KiB reads at random offsets of it, page cache dropped first;
- rewriting a cached file (256 MiB) in place in 1 MiB writes, then `fsync`.
The limit is the same on the local disk (`direct`: the home directory, on the disk the cache uses), in
the same run. larder's status says how many reads the daemon served (0: the kernel read the cache file).

"First warm read" is a read of a file just written to the disk: larder's cache file right after the cold
fill wrote it, and for `direct` a copy of the file written just before, as fast as the disk takes it
(and, reported beside it, a copy written at the link's pace in 1 MiB writes, as the cold fill writes:
this disk may read a file written over seconds back slower the first time: by hand, 1 GiB written at
200 MiB/s read back at 776 and 996 MiB/s in two runs, against 1,107 and 2,069 for 1 GiB written in one
go, and the cache file itself, read directly rather than through the mount, at 788-1,055 MiB/s). A disk still busy with the
writeback of a file just written reads it slower (measured here: 1.2-2.6 GB/s against 3.5-4.0 GB/s a few
seconds later, for the cache file read with `dd` and for a file written with `head`), so both sides pay
it. The second warm read comes 5 s later on both sides.

Each figure is taken ROUNDS times, in turns (direct, then larder; larder's copy evicted and filled again
over the link before each of its first warm reads), and the median is reported with every sample: single
readings of this disk varied by half between runs a minute apart.
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


def write_paced(path, size, bandwidth):
    """A file of `size` random bytes written in 1 MiB writes at `bandwidth` bytes/s (as fast as it goes
    without one): as a file arriving over the link is."""
    chunk = os.urandom(MiB)
    start = time.monotonic()
    with open(path, "wb") as f:
        off = 0
        while off < size:
            if bandwidth:
                ahead = start + off / bandwidth - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            off += f.write(chunk[:min(MiB, size - off)])


def daemon_reads(m):
    st = m.status()
    return H.get(st, "efficiency", "reads") if st else None


ROUNDS = 3


def median_of(samples, key):
    vals = sorted(x[key] for x in samples)
    return vals[len(vals) // 2]


def run(ctx):
    size, rsize = ctx.args.local_read_size, ctx.args.local_rewrite_size
    home = ctx.subhome("local")
    big, small = os.path.join(home, "big"), os.path.join(home, "rewrite")
    # direct reads and rewrites copies of its own: larder's mount of the same home must not find its
    # cached files changed at home behind it.
    for path, n in [(big, size), (small, rsize), (big + "-direct", size), (small + "-direct", rsize)]:
        if not os.path.exists(path) or os.path.getsize(path) != n:
            log(f"local_speed: writing a {n / MiB:.0f} MiB file at home")
            H.write_random(path, n)
    rng = random.Random(7)
    offsets = [rng.randrange(0, size // 4096) * 4096 for _ in range(RAND_OPS)]
    res = {"size": size, "rewrite_size": rsize, "link": ctx.wan.describe(), "rounds": ROUNDS, "systems": {}}
    direct, larder = ctx.system("direct"), ctx.system("larder")
    # Both mounted at once, and each figure taken in turns, direct then larder, ROUNDS times: this disk's
    # speed moves by half between runs a minute apart, and turns let both sides meet the same moments.
    with direct.mount(ctx, "local", writable=True) as dm, larder.mount(ctx, "local", link=ctx.wan, writable=True) as lm:
        mounts = {"direct": dm, "larder": lm}
        samples = {name: {k: [] for k in ("warm1", "warm1_paced", "warm2", "random", "rewrite", "rewrite_again",
                                          "cold")}
                   for name in mounts}
        reads = daemon_reads(lm)
        served = 0
        for i in range(ROUNDS):
            for name, m in mounts.items():
                mine = "-direct" if name == "direct" else ""
                path, rpath = m.path(f"local/big{mine}"), m.path(f"local/rewrite{mine}")
                sm = samples[name]
                if name == "direct":
                    # A file just written, as larder's cache file is just after its cold fill: once at the
                    # link's pace, as the cold fill writes the cache file (reported beside), and once as fast
                    # as the disk takes it (the baseline).
                    paced = m.path("local/big-fresh-paced")
                    write_paced(paced, size, ctx.wan.bandwidth)
                    ctx.drop_caches()
                    sm["warm1_paced"].append(H.seq_read(paced, 600))
                    os.unlink(paced)
                    first = m.path("local/big-fresh")
                    H.write_random(first, size)
                else:
                    # The cached copy dropped, then filled again over the link.
                    first = path
                    if i > 0:
                        H.run([H.LARDER, "evict", path, rpath], timeout=120)
                    ctx.drop_caches()
                    log(f"local_speed: larder, cold fill over the link (round {i + 1})")
                    sm["cold"].append(H.seq_read(path, 600))
                    H.seq_read(rpath, 600)
                    before = daemon_reads(m)
                ctx.drop_caches()
                log(f"local_speed: {name}, first warm sequential read (round {i + 1})")
                sm["warm1"].append(H.seq_read(first, 600))
                if first != path:
                    os.unlink(first)
                time.sleep(5)
                ctx.drop_caches()
                sm["warm2"].append(H.seq_read(path, 600))
                ctx.drop_caches()
                sm["random"].append(H.rand_read(path, offsets, RAND_SECONDS))
                if name == "larder" and before is not None:
                    served += daemon_reads(m) - before
                ctx.drop_caches()
                sm["rewrite"].append(rewrite(rpath, rsize))
                sm["rewrite_again"].append(rewrite(rpath, rsize))
        for name, sm in samples.items():
            r = res["systems"].setdefault(name, {})
            for k, xs in sm.items():
                if not xs:
                    continue
                unit = "ops_s" if k == "random" else "MiB_s"
                r[k] = {unit: median_of(xs, unit), "samples": [x[unit] for x in xs]}
        if reads is not None:
            res["systems"]["larder"]["daemon_reads_while_warm"] = served
    return res


def report(r, ctx):
    sy = r["systems"]
    g = lambda s, *k: H.get(sy, s, *k)
    rows = [
        ["sequential read, first warm (just written: after the cold fill; direct: a fresh copy), MiB/s",
         g("direct", "warm1", "MiB_s"),
         g("larder", "warm1", "MiB_s"), H.ratio(g("larder", "warm1", "MiB_s"), g("direct", "warm1", "MiB_s")), "0.95"],
        ["the same against a fresh copy written at the link's pace, MiB/s", g("direct", "warm1_paced", "MiB_s"),
         g("larder", "warm1", "MiB_s"), H.ratio(g("larder", "warm1", "MiB_s"), g("direct", "warm1_paced", "MiB_s")), ""],
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
             f"Medians of {r.get('rounds', 1)} rounds taken in turns; every sample, direct / larder:", ""]
    for k, label in [("warm1", "first warm read"), ("warm1_paced", "first warm read, direct's copy written at the link's pace"),
                     ("warm2", "5 s later"), ("random", "random reads"),
                     ("rewrite", "rewrite"), ("rewrite_again", "rewrite again")]:
        lines.append(f"- {label}: {g('direct', k, 'samples')} / {g('larder', k, 'samples')}")
    lines += ["", f"Cold fill over the link: {g('larder', 'cold', 'MiB_s')} MiB/s. Reads the daemon served during "
              f"the warm reads: {g('larder', 'daemon_reads_while_warm')} (0: the kernel read the cache file)."]
    return "\n".join(lines)
