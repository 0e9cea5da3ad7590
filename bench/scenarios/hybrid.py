"""Small and large files under concurrency: hybrid cache units vs per-block LRU (HCCache §6.1, Fig. 8 and
10, the httpd trace).

What: a synthetic trace in the spirit of httpd's: a population of files, 90% small (log-uniform 1 KiB to
256 KiB) and 10% large (log-uniform 512 KiB to 8 MiB), requested with Zipf popularity (seeded, so every run
replays the same trace), each request reading one file whole. 8 clients (processes) replay their shares of
the trace (request i goes to client i mod 8) at once, against a cache a third the size of the distinct files
the trace touches, home behind the link.

Compared: configurations of larder, all with 64 KiB blocks so that a small file spans several blocks
(with 1 MiB blocks every small file would be one block, and per-file and per-block units would coincide):
  larder-hybrid      the default: files <= 256 KiB fetched, kept and evicted whole; S3-FIFO eviction;
  larder-block-lru   `--small-file-threshold 0 --eviction lru`: every file per block, plain LRU (HCCache's
                     block-indexed baseline, BICache);
  larder-hybrid-lru  the hybrid units with plain LRU, which splits the difference between the two: the
                     units' share (hybrid-lru vs block-lru) and the eviction policy's (hybrid vs hybrid-lru).
All with `--no-passthrough`, and each client drops a file's pages from the kernel's page cache after
reading it: so every request reaches larder, whose store counts its hits and misses and times its reads
(the kernel would otherwise serve repeated requests from memory, or read cached files itself, unseen).
Each configuration on a fresh mount with an empty cache. Figures: larder's own (`status --json`: block
hit rate, ABD, ECDAL, ECDAB, evictions, bytes fetched from home) and the clients' (bandwidth = bytes read /
wall time; mean and p99 request latency, overall and for small and large files).
Limit: direct, the home on the local disk read by the same clients (page cache dropped before, and each
file's pages after each request). Peers: rclone on the same trace, its cache bounded to the same size
(`--vfs-cache-max-size`, enforced every 5 s, open files excepted), and JuiceFS, its cache bounded to the same
size (`--cache-size`, in MiB). s3fs is left out: its cache has no size bound, so it would not run short of
space as the others do.
"""
import contextlib
import math
import os
import random
import threading

import harness as H
from harness import MiB, log

TITLE = "Small and large files under concurrency: hybrid units vs per-block LRU (HCCache §6)"
KiB = 1 << 10
SUB = "hybrid"
SEED = 2
SMALL = (1 * KiB, 256 * KiB)  # log-uniform sizes of small files
LARGE = (512 * KiB, 8 * MiB)  # and of large ones
THRESHOLD = 256 * KiB  # larder's --small-file-threshold: the split between small and large
COMMON = ["--block-size", "64KiB", "--no-passthrough"]
CONFIGS = [
    ("larder-hybrid", COMMON + ["--small-file-threshold", "256KiB", "--eviction", "s3fifo"]),
    ("larder-hybrid-lru", COMMON + ["--small-file-threshold", "256KiB", "--eviction", "lru"]),
    ("larder-block-lru", COMMON + ["--small-file-threshold", "0", "--eviction", "lru"]),
]
ORDER = ["direct"] + [name for name, _ in CONFIGS]
# larder-hybrid again, its cache as large as rclone's grew to at its peak (when that passed the bound).
AT_PEER_SIZE = "larder-hybrid-at-rclone-peak"


def add_args(ap):
    ap.add_argument("--hybrid-files", type=int, help="hybrid: files in the population [1500; --full 10000]")
    ap.add_argument("--hybrid-requests", type=int, help="hybrid: requests in the trace [8000; --full 50000]")
    ap.add_argument("--hybrid-clients", type=int, default=8, help="hybrid: concurrent clients [8]")
    ap.add_argument("--hybrid-alpha", type=float, default=0.9, help="hybrid: Zipf exponent of popularity [0.9]")
    ap.add_argument("--hybrid-cache-fraction", type=float, default=1 / 3,
                    help="hybrid: cache size as a share of the bytes of the distinct files requested [1/3]")


def log_uniform(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def population(n):
    """Relative path and size of each file: 10% large, the rest small, placed at random."""
    rng = random.Random(SEED)
    large = set(rng.sample(range(n), n // 10))
    return [(f"{SUB}/f{i:05d}", log_uniform(rng, *(LARGE if i in large else SMALL))) for i in range(n)]


def ensure_files(ctx, files):
    ctx.subhome(SUB)
    def present(rel, size):
        path = os.path.join(ctx.home, rel)
        return os.path.exists(path) and os.path.getsize(path) == size
    missing = [(rel, size) for rel, size in files if not present(rel, size)]
    if missing:
        log(f"hybrid: writing {len(missing)} files ({sum(s for _, s in missing) / MiB:.0f} MiB) at home")
    for rel, size in missing:
        H.write_random(os.path.join(ctx.home, rel), size)


def make_trace(n, requests, alpha):
    """File indexes requested, Zipf(alpha) over a random ranking of the files."""
    rng = random.Random(SEED + 1)
    ranked = list(range(n))
    rng.shuffle(ranked)
    cum, total = [], 0.0
    for k in range(1, n + 1):
        total += k ** -alpha
        cum.append(total)
    return rng.choices(ranked, cum_weights=cum, k=requests)


def write_traces(ctx, files, trace, clients):
    paths = []
    for c in range(clients):
        path = os.path.join(ctx.work, f"hybrid-trace-{c}")
        with open(path, "w") as f:
            f.writelines(files[i][0] + "\n" for i in trace[c::clients])
        paths.append(path)
    return paths


def merge_latency(parts):
    """(requests, latency_ms) of each client: the mean weighted by requests, the largest p99."""
    parts = [(n, lat) for n, lat in parts if n]
    n = sum(k for k, _ in parts)
    return {"requests": n, "mean_ms": sum(k * lat["mean"] for k, lat in parts) / n if n else None,
            "p99_ms": max((lat["p99"] for _, lat in parts), default=None)}


def replay(ctx, root, traces):
    outs = ctx.workers([["trace-uncached", root, t, str(THRESHOLD)] for t in traces])
    secs = max(o["seconds"] for o in outs)
    got = sum(o["bytes"] for o in outs)
    errors = sum(o["errors"] for o in outs)
    if errors:
        H.note(f"hybrid: {errors} requests failed under {root}")
    r = {"bytes": got, "seconds": round(secs, 3), "MiB_s": round(got / MiB / secs, 1), "errors": errors,
         "all": merge_latency((o["requests"], o["latency_ms"]) for o in outs)}
    for part in ("small", "large"):
        r[part] = merge_latency((o[part]["requests"], o[part]["latency_ms"]) for o in outs)
    return r


def disk_bytes(path):
    """Bytes `path` takes on disk (blocks allocated: a peer's cache files may be sparse)."""
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                pass
    return total


@contextlib.contextmanager
def peak_of(path, every=0.25):
    """While the block runs, the most `path` took on disk, sampled every `every` s: `got["peak"]`."""
    got, stop = {"peak": 0}, threading.Event()

    def sample():
        while not stop.wait(every):
            got["peak"] = max(got["peak"], disk_bytes(path))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield got
    finally:
        stop.set()
        t.join()
        got["peak"] = max(got["peak"], disk_bytes(path))


def cache_figures(st):
    """What larder's status says about the run."""
    def g(*k):
        return H.get(st, *k)
    return {"hits": g("cache", "hits"), "misses": g("cache", "misses"), "hit_rate": g("efficiency", "hit_rate"),
            "abd": g("efficiency", "abd"), "ecdal": g("efficiency", "ecdal"), "ecdab": g("efficiency", "ecdab"),
            "evictions": g("cache", "evictions"), "home_bytes_read": g("home", "bytes_read"),
            "home_reads": g("home", "ops_by_kind", "read"),
            "cache_inserted_bytes": g("efficiency", "cache_inserted_bytes"),
            "daemon_read_seconds": g("efficiency", "read_seconds"), "bytes_used": g("cache", "bytes_used"),
            "bytes_limit": g("cache", "bytes_limit")}


def systems(ctx, cache_size):
    """(system, extra mount flags) of each run: the limit, larder's configurations, rclone and JuiceFS (each
    with its cache bounded to the same size; a later flag overrides the suite's)."""
    out = [(ctx.system("direct"), [])] + [(ctx.larder(name, flags, cache_size), []) for name, flags in CONFIGS]
    size = {"rclone": ["--vfs-cache-max-size", str(cache_size), "--vfs-cache-poll-interval", "5s"],
            "juicefs": ["--cache-size", str(max(1, cache_size // MiB))]}
    return out + [(p, size[p.name]) for p in ctx.peers() if p.name in size]


def run(ctx):
    a = ctx.args
    n = a.hybrid_files or (10000 if a.full else 1500)
    requests = a.hybrid_requests or (50000 if a.full else 8000)
    files = population(n)
    ensure_files(ctx, files)
    trace = make_trace(n, requests, a.hybrid_alpha)
    traces = write_traces(ctx, files, trace, a.hybrid_clients)
    touched = set(trace)
    touched_bytes = sum(files[i][1] for i in touched)
    cache_size = int(touched_bytes * a.hybrid_cache_fraction)
    small = sum(1 for i in trace if files[i][1] <= THRESHOLD)
    res = {"files": n, "small_files": sum(1 for _, s in files if s <= THRESHOLD),
           "bytes": sum(s for _, s in files), "requests": requests, "small_requests": small,
           "clients": a.hybrid_clients, "alpha": a.hybrid_alpha, "touched_files": len(touched),
           "touched_bytes": touched_bytes, "cache_size": cache_size, "link": ctx.wan.describe(),
           "configs": dict(CONFIGS), "runs": {}}
    log(f"hybrid: {requests} requests over {len(touched)} files ({touched_bytes / MiB:.0f} MiB), "
        f"cache {cache_size / MiB:.0f} MiB")
    runs = systems(ctx, cache_size)
    while runs:
        s, flags = runs.pop(0)
        with s.mount(ctx, "hybrid", link=None if s.name == "direct" else ctx.wan, flags=flags) as m:
            ctx.drop_caches()
            log(f"hybrid: {s.name}, {a.hybrid_clients} clients")
            with (peak_of(m.cache_dir) if m.cache_dir else contextlib.nullcontext({})) as peak:
                r = H.with_cpu(m.pids, replay, ctx, m.root, traces)
            if m.status():
                r["cache"] = cache_figures(m.status())
            if peak.get("peak"):
                # rclone enforces its bound every few seconds and spares files in use: what it held.
                r["cache_peak_bytes"] = peak["peak"]
                if peak["peak"] > cache_size and s.name == "rclone":
                    res["rclone_cache_peak"] = peak["peak"]
                    runs.append((ctx.larder(AT_PEER_SIZE, dict(CONFIGS)["larder-hybrid"], peak["peak"]), []))
            res["runs"][s.name] = r
    return res


def sci(v):
    return "—" if v is None else f"{v:.3g}"


def metric_rows(r, names):
    """(label, [value per system], formatter) of each figure of the table."""
    def run(n, *k):
        return H.get(r["runs"], n, *k)
    mib = (lambda v: None if v is None else round(v / MiB, 1))
    pct = (lambda v: None if v is None else round(100 * v, 1))
    return [
        ("block hit rate (%)", [pct(run(n, "cache", "hit_rate")) for n in names], None),
        ("ABD (units apart per block)", [run(n, "cache", "abd") for n in names], sci),
        ("ECDAL (1/(s·B))", [run(n, "cache", "ecdal") for n in names], sci),
        ("ECDAB (1/s)", [run(n, "cache", "ecdab") for n in names], sci),
        ("MiB fetched from home", [mib(run(n, "cache", "home_bytes_read")) for n in names], None),
        ("home read calls", [run(n, "cache", "home_reads") for n in names], None),
        ("MiB put into the cache", [mib(run(n, "cache", "cache_inserted_bytes")) for n in names], None),
        ("evictions (blocks)", [run(n, "cache", "evictions") for n in names], None),
        ("cache on disk at its peak (MiB, peers)", [mib(run(n, "cache_peak_bytes")) for n in names], None),
        ("bandwidth (MiB/s)", [run(n, "MiB_s") for n in names], None),
        ("mean latency (ms)", [run(n, "all", "mean_ms") for n in names], None),
        ("p99 latency (ms, worst client)", [run(n, "all", "p99_ms") for n in names], None),
        ("small files: mean latency (ms)", [run(n, "small", "mean_ms") for n in names], None),
        ("large files: mean latency (ms)", [run(n, "large", "mean_ms") for n in names], None),
        ("wall time (s)", [run(n, "seconds") for n in names], None),
    ]


def table(r, names):
    header = ["figure"] + names + ["hybrid ÷ block-lru"]
    rows = []
    for label, vals, f in metric_rows(r, names):
        h, b = (vals[names.index(x)] if x in names else None for x in ("larder-hybrid", "larder-block-lru"))
        row = [label] + [f(v) if f else (round(v, 2) if isinstance(v, float) else v) for v in vals]
        rows.append(row + [H.ratio(h, b)])
    return H.md_table(header, rows)


def ratios(r, a, b):
    """Bandwidth, mean latency and hit rate of run a ÷ run b, as a phrase."""
    x, y = r["runs"].get(a, {}), r["runs"].get(b, {})
    figs = [("bandwidth", ("MiB_s",)), ("mean latency", ("all", "mean_ms")),
            ("small-file latency", ("small", "mean_ms")), ("block hit rate", ("cache", "hit_rate"))]
    got = [f"{label} {H.fmt(H.ratio(H.get(x, *k), H.get(y, *k)), 2)}" for label, k in figs
           if H.get(x, *k) is not None and H.get(y, *k) is not None]
    return f"{a} ÷ {b}: {', '.join(got)}" if got else None


def plot(r, names, path):
    """The bar charts; the Markdown that embeds them."""
    import matplotlib.pyplot as plt
    runs = r["runs"]
    panels = [("block hit rate (%)", False, lambda n: 100 * H.get(runs, n, "cache", "hit_rate")),
              ("bandwidth (MiB/s)", True, lambda n: H.get(runs, n, "MiB_s")),
              ("mean request latency (ms)", True, lambda n: H.get(runs, n, "all", "mean_ms")),
              ("MiB fetched from home", False, lambda n: H.get(runs, n, "cache", "home_bytes_read") / MiB)]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.8))
    for ax, (title, everyone, val) in zip(axes, panels):
        shown = [n for n in names if everyone or H.get(runs, n, "cache")]
        vals = [val(n) for n in shown]
        bars = ax.bar(range(len(shown)), vals, color=[f"C{names.index(n)}" for n in shown])
        ax.bar_label(bars, labels=[H.fmt(round(v, 1)) for v in vals], fontsize=7)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(shown, rotation=20, ha="right", fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"{r['requests']} requests by {r['clients']} clients, cache {r['cache_size'] / MiB:.0f} MiB "
                 f"of {r['touched_bytes'] / MiB:.0f} MiB requested", fontsize=10)
    return H.save_plot(fig, path, "hybrid")


def report(r, ctx):
    names = [n for n in ORDER if n in r["runs"]] + [n for n in r["runs"] if n not in ORDER]
    lines = [
        f"{r['files']:,} files ({r['small_files']:,} of at most 256 KiB, log-uniform 1-256 KiB; the rest "
        f"512 KiB-8 MiB; {r['bytes'] / MiB:.0f} MiB), {r['requests']:,} whole-file requests with Zipf "
        f"popularity (alpha {r['alpha']:g}; {r['small_requests']:,} of small files) replayed by "
        f"{r['clients']} client processes at once; {r['touched_files']:,} distinct files requested "
        f"({r['touched_bytes'] / MiB:.0f} MiB), cache {r['cache_size'] / MiB:.0f} MiB; home behind the link "
        f"({r['link']}). "
        "larder-hybrid (the default): small files (<= 256 KiB) fetched, kept and evicted whole, S3-FIFO eviction;"
        " larder-block-lru: every file per block, plain LRU (HCCache's BICache); larder-hybrid-lru: the hybrid "
        "units with plain LRU, to tell the units' share from the policy's. All with 64 KiB blocks, so that a "
        "small file spans up to 4 blocks (at the default 1 MiB every small file is one block and the units "
        "coincide), and `--no-passthrough`; each client drops a file's pages from the kernel's page cache after "
        "reading it, so every request reaches larder's store (larder's cache files stay in the host's page "
        "cache). direct: the same clients on the local disk, page cache dropped before the run and each file's "
        "pages after each request: the limit. Block hit rate = cache hits / lookups, one lookup per block read; "
        "home read calls: larder's round trips for data. ABD (average block distance): for each file with several"
        " blocks in the cache, how far apart they lie in eviction order, per block (1 = together; at the end of "
        "the run; under S3-FIFO the order runs through the small queue, then the main one, so a file whose blocks"
        " sit in both scores far). ECDAL = 1 / (Σ read time in larder × Σ bytes put into the cache); ECDAB = Σ "
        "bytes read / (Σ read time in larder × Σ bytes put into the cache): larger is better, the same latency or"
        " bandwidth bought with less cache traffic. Bandwidth = bytes the clients read / the slowest client's "
        "time; request latency: mean weighted over the clients, p99 the worst client's.",
        "", table(r, names), ""]
    if "rclone" in names:
        lines[0] += (" rclone: `rclone mount --vfs-cache-mode full` over WebDAV behind the link, its cache "
                     "bounded to the same size (`--vfs-cache-max-size`, enforced every 5 s, files in use "
                     "excepted); its cache figures are not known but for the space its cache directory took at "
                     "its peak (sampled every 0.25 s).")
    if "juicefs" in names:
        lines[0] += (" juicefs: JuiceFS over its Redis and a bucket of s3s-fs, both behind the link, its cache "
                     "bounded to the same size (`--cache-size`); its cache figures are not known but for the "
                     "space its cache directory took at its peak.")
    if r.get("rclone_cache_peak"):
        lines[0] += (f" rclone's cache grew to {r['rclone_cache_peak'] / MiB:.0f} MiB against the bound of "
                     f"{r['cache_size'] / MiB:.0f} MiB; {AT_PEER_SIZE} is larder-hybrid run again with a cache of "
                     "that size.")
    pairs = [("larder-hybrid", "larder-block-lru"), ("larder-hybrid-lru", "larder-block-lru"),
             ("larder-hybrid", "larder-hybrid-lru"), ("larder-hybrid", "direct"), ("larder-block-lru", "direct")]
    pairs += [("larder-hybrid", n) for n in names if not n.startswith("larder") and n != "direct"]
    pairs += [(AT_PEER_SIZE, n) for n in names if not n.startswith("larder") and n != "direct" and AT_PEER_SIZE in names]
    lines += [f"- {x}." for x in (ratios(r, a, b) for a, b in pairs) if x]
    busy = {n: r["runs"][n].get("other_busy") for n in names}
    lines += ["", "Share of the CPUs busy with other work during each run: "
              + ", ".join(f"{n} {100 * v:.0f}%" for n, v in busy.items() if v is not None) + "."]
    path = ctx.plot("hybrid") if ctx else None
    if path:
        lines += ["", plot(r, names, path)]
    return "\n".join(lines)
