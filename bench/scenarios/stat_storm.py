"""Stat storm: K clients stat every one of N files (IMCa §5.2, its stat benchmark).

N files at home (20,000 by default, IMCa's 262,144 with --full), in directories of 1000, created once,
untimed. Then K = 1, 2, 4, 8 client processes (bench/statbench.c, released together) each stat every file;
the figure is the slowest client's time, as IMCa reports it (stats/s = N / that time). Configurations:
- direct: the home directory itself, kernel caches warm and after drop_caches (the local limit);
- the link without larder: a WebDAV PROPFIND (Depth 0) per file to `rclone serve webdav` of the home behind
  bench/wanproxy.py with --stat-latency round trips, K worker processes (IMCa's "NoCache": every stat asks the
  server; the baseline larder's cold pass is held to), over every few files (--stat-link-files, 2,000 by
  default; all with --full), the time scaled to N (without a cache every file costs the same); the same sample
  against the server without the proxy gauges the proxy's real round trip;
- larder cold: a fresh mount over the same emulated link, empty cache (larder looks up per path, so one round
  trip per file);
- larder warm: the same mount after that first pass, kernel caches warm (the kernel answers, not larder) and
  after drop_caches (larder answers every lookup from its cache: the figure that is larder's own);
- the peers (rclone mount, s3fs when available) cold and warm the same way.
Cold passes of the link and of each mount run for K = 1 and 8 only by default (every K with --full); warm
passes for every K. Warm and direct figures are the faster of two passes (they last a second or less, so one
busy moment of the machine would dominate).
"""
import os
import subprocess

import harness as H
from harness import log
from wanproxy import parse_duration

TITLE = "Stat storm: K clients stat every file (IMCa §5.2)"
KS = [1, 2, 4, 8]
PER_DIR = 1000
SUB = "stat_storm"


def add_args(ap):
    ap.add_argument("--stat-files", type=int, default=None,
                    help="stat_storm: files at home [20000; 262144 with --full]")
    ap.add_argument("--stat-link-files", type=int, default=2000,
                    help="stat_storm: files the link without larder stats, its time scaled to all of them "
                         "(each costs the same there) [2000; every file with --full]")


def make_tree(ctx, n):
    """N empty files in directories of PER_DIR under the home (missing ones created); their paths."""
    rels = [f"{SUB}/d{i // PER_DIR:04d}/f{i:06d}" for i in range(n)]
    H.empty_files(ctx.home, rels, "stat_storm")
    return rels


def write_list(ctx, rels, name):
    listfile = os.path.join(ctx.work, f"stat_storm-{name}.list")
    with open(listfile, "w") as f:
        f.write("\n".join(rels) + "\n")
    return listfile


def summary(n, seconds, errors):
    slowest = max(seconds)
    r = {"seconds": round(slowest, 3), "stats_s": round(n / slowest) if slowest else None,
         "clients_s": [round(s, 3) for s in seconds]}
    if errors:
        r["errors"] = errors
        H.note(f"stat_storm: {errors} failed stats")
    return r


def stat_pass(ctx, root, listfile, k, n, timeout, passes=1):
    """K statbench clients, `passes` passes each; the fastest pass (by its slowest client)."""
    out = ctx.statbench(root, listfile, k, passes=passes, timeout=timeout * passes)
    runs = [summary(n, [c[p]["seconds"] for c in out], sum(c[p]["errors"] for c in out)) for p in range(passes)]
    best = min(runs, key=lambda x: x["seconds"])
    if passes > 1:
        best["runs_s"] = [x["seconds"] for x in runs]
    return best


def dropped_pass(ctx, root, listfile, k, n, timeout, repeats=2):
    """The fastest of `repeats` passes, each right after drop_caches."""
    runs = []
    for _ in range(repeats):
        ctx.drop_caches()
        runs.append(stat_pass(ctx, root, listfile, k, n, timeout))
    best = dict(min(runs, key=lambda x: x["seconds"]))
    best["runs_s"] = [x["seconds"] for x in runs]
    return best


def propfind_pass(ctx, url, listfile, k, sample, n, timeout):
    """K workers each PROPFIND every file of the sample; seconds scaled from the sample to N files."""
    out = ctx.workers([["propfind", url, listfile]] * k, timeout=timeout)
    r = summary(n, [o["seconds"] * n / sample for o in out], sum(o["errors"] for o in out))
    r.update(sample_files=sample, sample_seconds=round(max(o["seconds"] for o in out), 3))
    return r


def home_ops(m):
    """larder's home calls so far (None for other systems)."""
    st = m.status()
    return H.get(st, "home", "ops") if st else None


def measured(label, fn, m=None):
    """fn()'s figure, with the home calls larder made meanwhile; a failed pass is recorded, not fatal."""
    log(f"stat_storm: {label}")
    before = home_ops(m) if m else None
    try:
        r = fn()
    except (RuntimeError, OSError, ValueError, subprocess.SubprocessError) as e:
        H.note(f"stat_storm: {label}: {e}")
        return {"error": str(e)[-300:]}
    after = home_ops(m) if m else None
    if before is not None and after is not None:
        r["home_ops"] = after - before
    return r


def run_direct(ctx, listfile, n, timeout, res):
    dropped, warm = res.setdefault("direct, caches dropped", {}), res.setdefault("direct", {})
    for k in KS:
        dropped[str(k)] = measured(f"direct, caches dropped, K={k}",
                                   lambda: dropped_pass(ctx, ctx.home, listfile, k, n, timeout))
        warm[str(k)] = measured(f"direct, K={k}", lambda: stat_pass(ctx, ctx.home, listfile, k, n, timeout, 2))


def run_link(ctx, link, rels, n, sample_n, cold_ks, timeout, res):
    """The link without larder over a sample of the files (every few), its time scaled to N; and, to gauge
    the emulated link, the same sample against the WebDAV server without it (one client)."""
    sample = rels[::max(1, n // sample_n)][:sample_n]
    listfile = write_list(ctx, sample, f"sample-{len(sample)}")
    out = res["configs"].setdefault("link without larder", {})
    url = ctx.webdav_url(link)
    for k in cold_ks:
        out[str(k)] = measured(f"link without larder, K={k} ({len(sample)} files)",
                               lambda: propfind_pass(ctx, url, listfile, k, len(sample), n, timeout))
    bare = measured(f"WebDAV server without the link, K=1 ({len(sample)} files)",
                    lambda: propfind_pass(ctx, ctx.webdav_url(None), listfile, 1, len(sample), n, timeout))
    res["server_only"] = bare
    if "seconds" in bare and "seconds" in out.get("1", {}):
        res["link_effective_rtt_ms"] = round((out["1"]["sample_seconds"] - bare["sample_seconds"])
                                             / len(sample) * 1e3, 2)


def run_mounted(ctx, s, link, listfile, n, cold_ks, timeout, res):
    """Cold passes on fresh mounts (one per K in cold_ks); on the last one, warm passes for every K."""
    cold = res.setdefault(f"{s.name} cold", {})
    warm = res.setdefault(f"{s.name} warm", {})
    dropped = res.setdefault(f"{s.name} warm, caches dropped", {})
    for i, k in enumerate(cold_ks):
        with s.mount(ctx, f"stat{k}", link=link) as m:
            ctx.drop_caches()
            cold[str(k)] = measured(f"{s.name} cold, K={k}", lambda: stat_pass(ctx, m.root, listfile, k, n, timeout), m)
            if i < len(cold_ks) - 1 or "error" in cold[str(k)]:
                continue
            for kw in KS:
                warm[str(kw)] = measured(f"{s.name} warm, K={kw}",
                                         lambda: stat_pass(ctx, m.root, listfile, kw, n, timeout, 2), m)
                dropped[str(kw)] = measured(f"{s.name} warm, caches dropped, K={kw}",
                                            lambda: dropped_pass(ctx, m.root, listfile, kw, n, timeout), m)


def run(ctx):
    n = ctx.args.stat_files or (262144 if ctx.args.full else 20000)
    cold_ks = KS if ctx.args.full else [KS[0], KS[-1]]
    sample_n = n if ctx.args.full else max(1, min(n, ctx.args.stat_link_files))
    link = ctx.link(ctx.args.stat_latency)
    rtt = parse_duration(ctx.args.stat_latency)
    # A pass of N stats pays at most a few round trips per file; anything slower has gone wrong.
    timeout = 120 + n * max(rtt, 1e-3) * 20
    rels = make_tree(ctx, n)
    listfile = write_list(ctx, rels, str(n))
    res = {"files": n, "dirs": -(-n // PER_DIR), "link": link.describe(), "rtt_s": rtt, "ks": KS,
           "cold_ks": cold_ks, "configs": {}}
    run_direct(ctx, listfile, n, timeout, res["configs"])
    run_link(ctx, link, rels, n, sample_n, cold_ks, timeout, res)
    for s in ctx.systems:
        if s.name == "direct":
            continue
        try:
            run_mounted(ctx, s, link, listfile, n, cold_ks, timeout, res["configs"])
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            H.note(f"stat_storm: {s.name}: {e}")
            res.setdefault("errors", {})[s.name] = str(e)[-300:]
    return res


def secs(r, config, k):
    return H.get(r["configs"], config, str(k), "seconds")


def ratio_rows(r, peers):
    floor = r["files"] * r["rtt_s"]
    header = ["K", "larder warm ÷ direct", "larder warm, dropped ÷ direct, dropped", "larder cold ÷ link",
              "larder cold ÷ N round trips"]
    for p in peers:
        header += [f"larder cold ÷ {p} cold", f"larder warm, dropped ÷ {p} warm, dropped"]
    rows = []
    for k in r["ks"]:
        row = [k, H.ratio(secs(r, "larder warm", k), secs(r, "direct", k)),
               H.ratio(secs(r, "larder warm, caches dropped", k), secs(r, "direct, caches dropped", k)),
               H.ratio(secs(r, "larder cold", k), secs(r, "link without larder", k)),
               H.ratio(secs(r, "larder cold", k), floor)]
        for p in peers:
            row += [H.ratio(secs(r, "larder cold", k), secs(r, f"{p} cold", k)),
                    H.ratio(secs(r, "larder warm, caches dropped", k), secs(r, f"{p} warm, caches dropped", k))]
        rows.append(row)
    return header, rows


def home_ops_line(r):
    """How many home calls larder's passes made, per file stat'd."""
    parts = []
    for config in ("larder cold", "larder warm, caches dropped"):
        for k, v in r["configs"].get(config, {}).items():
            if v.get("home_ops") is not None:
                per = v["home_ops"] / r["files"] / len(v.get("runs_s", [0]))
                parts.append(f"{config}, K={k}: {per:.2f}")
    return ("larder's home calls per file and pass: " + "; ".join(parts) + ".") if parts else ""


def link_line(r):
    link = r["configs"].get("link without larder", {})
    one = next((v for v in link.values() if v.get("sample_files")), None)
    if not one:
        return ""
    line = (f"The link without larder stat'd {one['sample_files']:,} of the {r['files']:,} files (spread over "
            "every directory), its time scaled to all of them: without a cache every file costs the same.")
    bare, eff = r.get("server_only", {}), r.get("link_effective_rtt_ms")
    if eff is not None:
        served = bare["sample_seconds"] / one["sample_files"] * 1e3
        line += (f" Against the WebDAV server directly a PROPFIND took {served:.2f} ms; through bench/wanproxy.py "
                 f"{eff:.2f} ms more, where the nominal round trip is {r['rtt_s'] * 1e3:g} ms (the proxy's timers "
                 "are coarser than a millisecond), so that column is slower than the nominal link would be. The "
                 "floor of any system that asks home once per file is N round trips "
                 f"({r['files'] * r['rtt_s']:.1f} s).")
    return line


def plot(r, ctx, configs):
    path = ctx.plot("stat_storm") if ctx else None
    if not path:
        return None
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 5))
    systems = []
    for c in configs:
        system = c.split(",")[0].replace(" cold", "").replace(" warm", "")
        systems += [] if system in systems else [system]
        ks = [k for k in r["ks"] if secs(r, c, k)]
        if ks:
            style = "--" if "cold" in c or "link" in c else (":" if "dropped" in c else "-")
            ax.plot(ks, [secs(r, c, k) for k in ks], marker="o", label=c, linestyle=style,
                    color=f"C{systems.index(system)}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(r["ks"], [str(k) for k in r["ks"]])
    ax.set_xlabel("clients (K)")
    ax.set_ylabel("slowest client's seconds (log)")
    ax.set_title(f"stat of {r['files']:,} files by each of K clients")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return H.save_plot(fig, path, "stat storm")


def report(r, ctx):
    configs = [c for c in r["configs"] if r["configs"][c]]
    peers = sorted({c[: -len(" cold")] for c in configs if c.endswith(" cold")} - {"larder"})
    lines = [f"{r['files']:,} empty files in {r['dirs']} directories of {PER_DIR}; K client processes "
             "(bench/statbench.c, released together) each stat every file; each cell is the slowest client's "
             f"seconds (this machine). The link: {r['link']} (larder `--emulate-wan`; the link without larder "
             "and the peers through bench/wanproxy.py), no larder: one WebDAV PROPFIND (Depth 0) per file. "
             "Cold: a fresh mount, empty cache. Warm: the same mount after the cold pass, kernel caches warm or "
             "dropped (drop_caches) before the pass; warm and direct figures are the faster of two passes. "
             + ("Cold passes and the link without larder ran for every K." if r["cold_ks"] == r["ks"] else
                "Cold passes and the link without larder ran for "
                f"K = {', '.join(map(str, r['cold_ks']))} only (every K with --full)."), ""]
    lines.append(H.md_table(["K"] + configs, [[k] + [secs(r, c, k) for c in configs] for k in r["ks"]]))
    lines += ["", "Stats per second (N ÷ the slowest client's seconds):", ""]
    lines.append(H.md_table(["K"] + configs, [[k] + [H.get(r["configs"], c, str(k), "stats_s") for c in configs]
                                              for k in r["ks"]]))
    lines += ["", "Ratios of times (below 1: larder is faster):", ""]
    lines.append(H.md_table(*ratio_rows(r, peers)))
    for extra in (link_line(r), home_ops_line(r)):
        if extra:
            lines += ["", extra]
    if r.get("errors"):
        lines += ["", "Failed: " + "; ".join(f"{k}: {v}" for k, v in r["errors"].items())]
    pic = plot(r, ctx, configs)
    if pic:
        lines += ["", pic]
    return "\n".join(lines)
