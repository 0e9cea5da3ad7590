"""Read latency by record size, one client and eight (IMCa §5.3 single client, §5.4 multiple clients).

IMCa's latency benchmark, read phase: for each record size r from 1 byte up in multiples of 4 (1 B, 4 B, ...
1 MiB), 1024 sequential reads of r bytes (preads) from the start of a file of 1024 r bytes; the figure is the
mean time of the 1024 reads. With 8 clients each process reads its own files (as §5.4), the clients are
released together by a barrier before each size, and the figure is the mean over clients of each client's
mean. Files at home: latency/c<client>/r<size>, random bytes, created once. Single client: sizes up to
1 MiB; 8 clients: up to 64 KiB by default, 1 MiB with --full (--latency-max-multi).
Every system is measured cold (a fresh mount over the link, empty cache; direct: the local disk, page cache
dropped) and warm (read again after drop_caches, so the figure is the system's own cache; direct: the local
disk again, the limit), and for direct and larder also warm with the page cache kept (the reads that never
leave the kernel, or larder's passthrough to its cache file). Ratio: larder warm ÷ direct warm per size.
IMCa's write phase is not reproduced (larder's writes are the metadata and shared scenarios' subject).
"""
import os
import subprocess

import harness as H
from harness import MiB, log

TITLE = "Read latency by record size, 1 and 8 clients (IMCa §5.3, §5.4)"
SUB = "latency"
CLIENTS = 8
SIZES = [4 ** i for i in range(11)]  # 1 B .. 1 MiB
RECORDS = 1024
PAGE_CACHE_SYSTEMS = ("direct", "larder")


def add_args(ap):
    ap.add_argument("--latency-max-single", type=H.parse_size, default=MiB,
                    help="latency: largest record of the single client [1MiB]")
    ap.add_argument("--latency-max-multi", type=H.parse_size, default=None,
                    help="latency: largest record of the 8 clients [64KiB; 1MiB with --full]")


def label(size):
    for unit, mult in (("MiB", MiB), ("KiB", 1024)):
        if size >= mult:
            return f"{size // mult} {unit}"
    return f"{size} B"


def make_files(ctx, single, multi):
    """latency/c<c>/r<r> at home for every client and size it reads (missing or wrong-sized ones written)."""
    base = ctx.subhome(SUB)
    written = 0
    for c in range(CLIENTS):
        d = os.path.join(base, f"c{c}")
        os.makedirs(d, exist_ok=True)
        for r in sorted(set(multi) | (set(single) if c == 0 else set())):
            path = os.path.join(d, f"r{r}")
            if not os.path.exists(path) or os.path.getsize(path) != RECORDS * r:
                H.write_random(path, RECORDS * r)
                written += RECORDS * r
    if written:
        log(f"latency: wrote {written / MiB:.0f} MiB of files at home")


def measure(ctx, root, clients, sizes):
    """Each client's 1024 reads per size; per size, the mean over clients of each client's mean µs."""
    cmds = [["records", os.path.join(root, SUB, f"c{c}")] + [str(r) for r in sizes] for c in range(clients)]
    out = ctx.workers(cmds, phases=len(sizes), timeout=900)
    res = {}
    for r in sizes:
        per = [o["records"][str(r)] for o in out]
        res[str(r)] = {"mean_us": round(sum(p["mean_us"] for p in per) / len(per), 3),
                       "clients_us": [p["mean_us"] for p in per]}
        short = sum(p["short"] for p in per)
        if short:
            res[str(r)]["short"] = short
            H.note(f"latency: {short} short reads of {r} bytes")
    return res


def with_larder_counts(m, fn):
    """fn()'s figures, and for larder what the pass cost it: home calls and bytes, and the bytes its daemon
    served (reads the kernel answered itself, from the page cache or by passthrough, are not counted)."""
    st0 = m.status()
    r = {"sizes": fn()}
    st1 = m.status()
    keys = {"home_ops": ("home", "ops"), "home_bytes_read": ("home", "bytes_read"),
            "daemon_bytes_from_cache": ("tiers", "cache", "bytes_served")}
    for name, path in keys.items():
        a, b = H.get(st0, *path), H.get(st1, *path)
        if a is not None and b is not None:
            r[name] = b - a
    return r


def run_system(ctx, s, clients, sizes):
    link = None if s.name == "direct" else ctx.wan
    out = {}
    with s.mount(ctx, f"lat{clients}", link=link) as m:
        for phase in ("cold", "warm"):
            ctx.drop_caches()
            log(f"latency: {s.name}, {clients} client(s), {phase}")
            out[phase] = with_larder_counts(m, lambda: measure(ctx, m.root, clients, sizes))
        if s.name in PAGE_CACHE_SYSTEMS:
            log(f"latency: {s.name}, {clients} client(s), warm, page cache")
            out["warm, page cache"] = with_larder_counts(m, lambda: measure(ctx, m.root, clients, sizes))
    return out


def run(ctx):
    a = ctx.args
    max_multi = a.latency_max_multi or (MiB if a.full else 64 << 10)
    single = [r for r in SIZES if r <= a.latency_max_single]
    multi = [r for r in SIZES if r <= max_multi]
    make_files(ctx, single, multi)
    res = {"records": RECORDS, "link": ctx.wan.describe(), "sizes": {"1": single, str(CLIENTS): multi},
           "systems": {}}
    for s in ctx.systems:
        by = res["systems"].setdefault(s.name, {})
        for clients, sizes in ((1, single), (CLIENTS, multi)):
            try:
                by[str(clients)] = run_system(ctx, s, clients, sizes)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                H.note(f"latency: {s.name}, {clients} client(s): {e}")
                by[str(clients)] = {"error": str(e)[-300:]}
    return res


def us(r, system, clients, phase, size):
    return H.get(r["systems"], system, clients, phase, "sizes", str(size), "mean_us")


def columns(r, clients):
    """(system, phase) pairs measured for this client count, in the systems' order."""
    cols = []
    for s, by in r["systems"].items():
        cols += [(s, p) for p in ("cold", "warm", "warm, page cache") if p in by.get(clients, {})]
    return cols


def tables(r, clients):
    sizes = r["sizes"][clients]
    cols = columns(r, clients)
    lat = H.md_table(["record"] + [f"{s} {p}" for s, p in cols],
                     [[label(z)] + [us(r, s, clients, p, z) for s, p in cols] for z in sizes])
    peers = [s for s in r["systems"] if s not in PAGE_CACHE_SYSTEMS]
    header = ["record", "larder warm ÷ direct warm", "larder warm, page cache ÷ direct warm, page cache"]
    for p in peers:
        header += [f"larder cold ÷ {p} cold", f"larder warm ÷ {p} warm"]
    rows = []
    for z in sizes:
        row = [label(z)] + [H.ratio(us(r, "larder", clients, ph, z), us(r, "direct", clients, ph, z))
                            for ph in ("warm", "warm, page cache")]
        for p in peers:
            row += [H.ratio(us(r, "larder", clients, ph, z), us(r, p, clients, ph, z)) for ph in ("cold", "warm")]
        rows.append(row)
    return lat, H.md_table(header, rows)


def larder_line(r):
    parts = []
    for clients, by in r["systems"].get("larder", {}).items():
        for phase in ("warm", "warm, page cache"):
            v = by.get(phase, {})
            if v.get("home_ops") is not None:
                parts.append(f"{clients} client(s), {phase}: {v['home_ops']} home calls, "
                             f"{v.get('home_bytes_read') or 0:,} bytes from home, "
                             f"{(v.get('daemon_bytes_from_cache') or 0) / MiB:,.1f} MiB served by its daemon "
                             "from the cache")
    return ("larder's warm passes (what the kernel reads itself, page cache or passthrough, is not counted): "
            + "; ".join(parts) + ".") if parts else ""


def plot(r, ctx):
    path = ctx.plot("latency") if ctx else None
    if not path:
        return None
    import matplotlib.pyplot as plt
    styles = {"cold": "--", "warm": "-", "warm, page cache": ":"}
    panels = list(r["sizes"])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, clients in zip(axes[0], panels):
        for i, s in enumerate(r["systems"]):
            for p, style in styles.items():
                sizes = [z for z in r["sizes"][clients] if us(r, s, clients, p, z)]
                if sizes:
                    ax.plot(sizes, [us(r, s, clients, p, z) for z in sizes], linestyle=style, marker=".",
                            color=f"C{i}", label=f"{s} {p}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = r["sizes"][clients][::2]
        ax.set_xticks(ticks, [label(z) for z in ticks])
        ax.set_xlabel("record size")
        ax.set_ylabel("mean µs per read (log)")
        ax.set_title(f"{clients} client{'s' if clients != '1' else ''}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8)
    return H.save_plot(fig, path, "latency", rect=(0, 0.12, 1, 1))


def report(r, ctx):
    lines = [f"Mean µs per read of {r['records']} sequential preads of each record size (this machine); with "
             f"{CLIENTS} clients, the mean over clients of each client's mean, each client reading its own files. "
             f"Cold: a fresh mount over the link ({r['link']}), empty cache; direct: the local disk, page cache "
             "dropped. Warm: read again after drop_caches. Warm, page cache: read a third time, page cache kept.",
             ""]
    for clients in r["sizes"]:
        if not any(clients in by for by in r["systems"].values()):
            continue
        lat, ratios = tables(r, clients)
        title = f"**{clients} client{'s' if clients != '1' else ''}**"
        lines += [title, "", lat, "", "Ratios (below 1: larder is faster):", "", ratios, ""]
    errors = [f"{s}, {c} client(s): {v['error']}" for s, by in r["systems"].items() for c, v in by.items()
              if "error" in v]
    if errors:
        lines += ["Failed: " + "; ".join(errors), ""]
    ll = larder_line(r)
    if ll:
        lines += [ll, ""]
    pic = plot(r, ctx)
    if pic:
        lines.append(pic)
    return "\n".join(lines).rstrip()
