"""Stat storm through a shared bank: K larder mounts of one home each stat every file (IMCa §5.2, with
IMCa's shared memcached holding the stat cache).

N empty files at home (2,000 by default, 20,000 with --full) in D directories (20), created once, untimed.
For K = 2, 4, 8: K fresh larder mounts of that home (mountpoints and cache directories of their own, each
its home calls behind its own `--emulate-wan latency=...`, 10 ms by default, `--validity-lag 60s`,
read-only), then one bench/statbench.c process per mount, all released together, each stat'ing every
file once through its own mount. The storm's time is the slowest process's (they start together, so it is
the wall time of the whole storm); home's calls are summed over the mounts (`home.ops_by_kind` in each
mount's status, before and after the storm). Configurations, each on fresh mounts:
- no bank: every mount asks home for every file (K home stats per file);
- bank: the mounts share one memcached (`--bank memcache://...`, `-m 256`), started afresh for the run so
  it begins empty; the first mount to miss a file's attributes asks home and leaves them in the bank for
  the lag, the others find them there. Each process starts at its own place in the list (process i of K at
  file i·N/K, going round), as independent clients would;
- bank, same order: the same, every process stat'ing the files in the same order, so the mounts come to
  each file at the same moment.
"""
import os
import subprocess

import banks
import harness as H
from harness import log
from wanproxy import parse_duration

TITLE = "Stat storm through a shared bank: K mounts stat every file (IMCa §5.2)"
KS = [2, 4, 8]
SUB = "bank_stat"
CONFIGS = ["no bank", "bank", "bank, same order"]
MEMCACHED_MIB = 256


def add_args(ap):
    ap.add_argument("--bank-stat-files", type=int, default=None,
                    help="bank_stat: files at home [2000; 20000 with --full]")
    ap.add_argument("--bank-stat-dirs", type=int, default=20, help="bank_stat: directories they are in [20]")
    ap.add_argument("--bank-stat-latency", default="10ms", help="bank_stat: round trip of each mount's link [10ms]")


def make_tree(ctx, n, dirs):
    """N empty files spread over `dirs` directories of the home (missing ones created); their paths."""
    per = -(-n // dirs)
    rels = [f"{SUB}/d{i // per:03d}/f{i:06d}" for i in range(n)]
    H.empty_files(ctx.home, rels, "bank_stat")
    return rels


def lists(ctx, rels, k, staggered):
    """One list file per process: the same order for all, or process i starting at file i·N/K."""
    out = []
    for i in range(k):
        start = i * len(rels) // k if staggered else 0
        path = os.path.join(ctx.work, f"bank_stat-{k}-{i}-{'s' if staggered else 'o'}.list")
        with open(path, "w") as f:
            f.write("\n".join(rels[start:] + rels[:start]) + "\n")
        out.append(path)
    return out


def storm(ctx, ms, listfiles, n, timeout):
    """One statbench process per mount over its list, released together; figures of the storm."""
    exe = ctx.setup.get("STATBENCH")
    if not exe:
        raise RuntimeError("statbench was not built (scripts/bench-setup.sh)")
    cmds = [[exe, m.mnt, lf, "1", "--barrier"] for m, lf in zip(ms, listfiles)]
    ctx.drop_caches()
    before = banks.snapshot(ms)
    ran = ctx.together(cmds, 1, timeout, lambda c: f"statbench {c[1]}")
    after = banks.snapshot(ms)
    secs, errors = [], 0
    for (lines, stderr, code), c in zip(ran, cmds):
        if code != 0 or not lines:
            raise RuntimeError(f"statbench {c[1]} failed ({code}): {stderr.strip()[-300:]}")
        secs.append(lines[-1]["seconds"])
        errors += lines[-1]["errors"]
    r = {"seconds": round(max(secs), 3), "clients_s": [round(s, 3) for s in secs],
         "stats_s": round(len(ms) * n / max(secs)) if max(secs) else None}
    if errors:
        r["errors"] = errors
        H.note(f"bank_stat: {errors} failed stats")
    per_mount = [banks.delta(b, a) for b, a in zip(before, after)]
    tot = banks.total(per_mount)
    kinds = tot["home_by_kind"]
    r.update(home_ops=tot["home_ops"], home_by_kind=kinds, home_stat=kinds.get("stat", 0),
             home_list=kinds.get("list", 0), home_stat_per_file=round(kinds.get("stat", 0) / n, 3),
             home_stat_list_per_file=round((kinds.get("stat", 0) + kinds.get("list", 0)) / n, 3),
             home_stat_by_mount=[d["home_by_kind"].get("stat", 0) for d in per_mount])
    if "bank" in tot:
        r["bank"] = tot["bank"]
    return r


def one(ctx, config, k, rels, n, flags, timeout):
    """Config `config` with K mounts: a fresh memcached (for the bank configurations), K fresh mounts, the
    storm; the memcached's own figures after it."""
    staggered = config != "bank, same order"
    listfiles = lists(ctx, rels, k, staggered)
    log(f"bank_stat: {config}, K={k}")
    if config == "no bank":
        with banks.mounts(ctx, f"bstat{k}", k, flags) as ms:
            return storm(ctx, ms, listfiles, n, timeout)
    with banks.server(ctx, "memcache", MEMCACHED_MIB, tag=f"stat{k}") as srv:
        with banks.mounts(ctx, f"bstat{k}", k, flags + ["--bank", srv.url]) as ms:
            r = storm(ctx, ms, listfiles, n, timeout)
            r["bank_mount_cmd"] = " ".join(ms[0].cmd)
        r["server"] = srv.figures()
        r["server_cmd"] = " ".join(srv.cmd)
    return r


def run(ctx):
    a = ctx.args
    n = a.bank_stat_files or (20000 if a.full else 2000)
    dirs = max(1, min(a.bank_stat_dirs, n))
    rtt = parse_duration(a.bank_stat_latency)
    why = banks.available("memcache")
    if why:
        raise RuntimeError(why)
    rels = make_tree(ctx, n, dirs)
    flags = ["--read-only", "--validity-lag", "60s", "--cache-size", str(a.cache_size),
             "--emulate-wan", f"latency={a.bank_stat_latency}"]
    # A storm pays at most a few round trips per file and mount; anything slower has gone wrong.
    timeout = 120 + n * max(rtt, 1e-3) * 10
    res = {"files": n, "dirs": dirs, "latency": a.bank_stat_latency, "rtt_s": rtt, "ks": KS,
           "memcached_MiB": MEMCACHED_MIB, "mount_flags": flags, "configs": {c: {} for c in CONFIGS}}
    for k in KS:
        for config in CONFIGS:
            try:
                res["configs"][config][str(k)] = one(ctx, config, k, rels, n, flags, timeout)
            except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as e:
                H.note(f"bank_stat: {config}, K={k}: {e}")
                res["configs"][config][str(k)] = {"error": str(e)[-300:]}
    return res


def fig(r, config, k, key):
    return H.get(r["configs"], config, str(k), key)


def plot(r, ctx):
    path = ctx.plot("bank_stat") if ctx else None
    if not path:
        return None
    import matplotlib.pyplot as plt
    fig_, axes = plt.subplots(1, 2, figsize=(10, 4))
    for i, c in enumerate(CONFIGS):
        ks = [k for k in r["ks"] if fig(r, c, k, "seconds") is not None]
        if not ks:
            continue
        axes[0].plot(ks, [fig(r, c, k, "seconds") for k in ks], marker="o", label=c, color=f"C{i}")
        axes[1].plot(ks, [fig(r, c, k, "home_stat_per_file") for k in ks], marker="o", label=c, color=f"C{i}")
    axes[1].plot(r["ks"], r["ks"], linestyle=":", color="grey", label="K (one per mount)")
    for ax, title, ylabel in ((axes[0], "storm's time", "seconds (this machine)"),
                              (axes[1], "home stat calls per file", "home stats ÷ N")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(r["ks"], [str(k) for k in r["ks"]])
        ax.set_xlabel("mounts (K)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}, {r['files']:,} files")
        ax.legend(fontsize=8)
    return H.save_plot(fig_, path, "bank stat storm")


def report(r, ctx):
    lines = [f"{r['files']:,} empty files in {r['dirs']} directories at home; K fresh larder mounts of it (each "
             f"its own cache and its own emulated link, {r['latency']} round trip, `--validity-lag 60s`), one "
             "bench/statbench.c process per mount, released together, each stat'ing every file once. Time: the "
             "slowest process's seconds (the storm's wall time). Home calls: summed over the mounts. Bank: one "
             f"memcached (`-m {r['memcached_MiB']}`) started empty for each run; its processes start at "
             "different places in the list (process i of K at file i·N/K); \"same order\": every process in the "
             "list's order. A mount also stats the directories on the way (the tree's top and its "
             f"{r['dirs']} directories) and lists the mount's root, which statbench opens, once: a mount that "
             f"asks home once per name makes {(r['files'] + r['dirs'] + 1) / r['files']:.3f} stats per file, K "
             "mounts K times that.", ""]
    header = ["K", "no bank s", "bank s", "bank ÷ no bank", "same order s", "same order ÷ no bank",
              "home stats/file, no bank", "bank", "same order", "home lists, no bank", "bank", "same order"]
    rows = []
    for k in r["ks"]:
        nb, b, so = (fig(r, c, k, "seconds") for c in CONFIGS)
        rows.append([k, nb, b, H.ratio(b, nb), so, H.ratio(so, nb)]
                    + [fig(r, c, k, "home_stat_per_file") for c in CONFIGS]
                    + [fig(r, c, k, "home_list") for c in CONFIGS])
    lines.append(H.md_table(header, rows))
    lines += ["", "Bank counters summed over the mounts (gets, hits, misses, puts, dropped), and the home calls "
              "by kind:", ""]
    rows = []
    for k in r["ks"]:
        for c in CONFIGS[1:]:
            b = fig(r, c, k, "bank") or {}
            kinds = fig(r, c, k, "home_by_kind") or {}
            rows.append([k, c, b.get("gets"), b.get("hits"), b.get("misses"), b.get("puts"), b.get("dropped"),
                         b.get("errors"), ", ".join(f"{x} {v:,}" for x, v in sorted(kinds.items()))])
        kinds = fig(r, "no bank", k, "home_by_kind") or {}
        rows.append([k, "no bank", None, None, None, None, None, None,
                     ", ".join(f"{x} {v:,}" for x, v in sorted(kinds.items()))])
    lines.append(H.md_table(["K", "config", "gets", "hits", "misses", "puts", "dropped", "errors", "home calls"],
                            rows))
    errs = [f"{c}, K={k}: {v['error']}" for c in CONFIGS for k, v in r["configs"][c].items() if "error" in v]
    if errs:
        lines += ["", "Failed: " + "; ".join(errs)]
    pic = plot(r, ctx)
    if pic:
        lines += ["", pic]
    return "\n".join(lines)
