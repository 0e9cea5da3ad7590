"""Read throughput by reader threads (IMCa §5.5, IOzone; Panache §7, parallel ingest).

One large file (1 GiB, as in the seeds) read by T = 1, 2, 4, 8 readers at once, each reading its own contiguous 1/T of the file in 1 MiB preads, as separate processes.
Cold: every system on a fresh mount with an empty cache, home behind the link (its bandwidth is the limit).
Warm: the same read again after the page cache is dropped, so the figure is the system's own cache (the
limit: the same file read from the local disk, page cache dropped). Aggregate MiB/s = file size / the
slowest reader's time.
"""
import os

import harness as H
from harness import MiB, log

TITLE = "Read throughput by reader count (IMCa §5.5, Panache §7)"
READERS = [1, 2, 4, 8]
REL = "throughput/big"


def read_with(ctx, root, readers, size):
    part = size // readers
    cmds = [["read", os.path.join(root, REL), str(i * part), str(part if i < readers - 1 else size - i * part)]
            for i in range(readers)]
    out = ctx.workers(cmds)
    secs = max(o["seconds"] for o in out)
    got = sum(o["bytes"] for o in out)
    if got != size:
        H.note(f"throughput: {got} of {size} bytes read")
    return {"MiB_s": round(size / MiB / secs, 1), "seconds": round(secs, 3), "bytes": got}


def add_args(ap):
    ap.add_argument("--throughput-size", type=H.parse_size, default=1 << 30, help="throughput: file size [1GiB]")


def run(ctx):
    size = ctx.args.throughput_size
    path = os.path.join(ctx.subhome("throughput"), "big")
    if not os.path.exists(path) or os.path.getsize(path) != size:
        log(f"throughput: writing a {size / MiB:.0f} MiB file at home")
        H.write_random(path, size)
    res = {"size": size, "link": ctx.wan.describe(), "limit_cold_MiB_s": ctx.wan.bandwidth / MiB,
           "cold": {}, "warm": {}}
    for s in ctx.systems:
        cold, warm = res["cold"].setdefault(s.name, {}), res["warm"].setdefault(s.name, {})
        for n in READERS:
            t = str(n)
            link = None if s.name == "direct" else ctx.wan
            with s.mount(ctx, f"tput{t}", link=link) as m:
                ctx.drop_caches()
                log(f"throughput: {s.name}, {n} reader(s), cold")
                cold[t] = read_with(ctx, m.root, n, size)
                ctx.drop_caches()
                log(f"throughput: {s.name}, {t} reader(s), warm")
                warm[t] = read_with(ctx, m.root, n, size)
                if m.status():
                    warm[t]["home_bytes_read"] = H.get(m.status(), "home", "bytes_read")
    return res


def report(r, ctx):
    md_table = H.md_table
    systems = list(r["warm"])
    lines = [f"File {r['size'] / MiB:.0f} MiB; MiB/s over all readers (this machine). Cold: a fresh mount, "
             f"home behind the link ({r['link']}; direct reads the local disk with the page cache dropped). "
             "Warm: read again, page cache dropped.", ""]
    direct_w = r["warm"].get("direct", {})
    header = ["readers"] + [f"{s} cold" for s in systems if s != "direct"] + \
             [f"{s} warm" for s in systems] + ["larder cold ÷ link", "larder warm ÷ direct"]
    rows = []
    for t in map(str, READERS):
        row = [t]
        row += [H.get(r["cold"], s, t, "MiB_s") for s in systems if s != "direct"]
        row += [H.get(r["warm"], s, t, "MiB_s") for s in systems]
        row.append(H.ratio(H.get(r["cold"], "larder", t, "MiB_s"), r["limit_cold_MiB_s"]))
        row.append(H.ratio(H.get(r["warm"], "larder", t, "MiB_s"), H.get(direct_w, t, "MiB_s")))
        rows.append(row)
    lines.append(md_table(header, rows))
    peers = [s for s in systems if s not in ("direct", "larder")]
    for p in peers:
        cw = [H.ratio(H.get(r["warm"], "larder", t, "MiB_s"), H.get(r["warm"], p, t, "MiB_s")) for t in r["warm"]["larder"]]
        cc = [H.ratio(H.get(r["cold"], "larder", t, "MiB_s"), H.get(r["cold"], p, t, "MiB_s")) for t in r["cold"]["larder"]]
        lines.append("")
        lines.append(f"larder ÷ {p}: cold {', '.join(H.fmt(x, 2) for x in cc)}; warm {', '.join(H.fmt(x, 2) for x in cw)} "
                     f"(readers {', '.join(str(t) for t in r['warm']['larder'])}).")
    path = ctx.plot("throughput") if ctx else None
    if path:
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, phase in zip(axes, ("cold", "warm")):
            for s in systems:
                pts = r[phase].get(s, {})
                if not pts or (phase == "cold" and s == "direct"):
                    continue
                xs = sorted(int(k) for k in pts)
                ax.plot(xs, [pts[str(k)]["MiB_s"] for k in xs], marker="o", label=s,
                        color=f"C{systems.index(s)}")
            if phase == "cold":
                ax.axhline(r["limit_cold_MiB_s"], color="grey", linestyle="--", label="link bandwidth")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("readers")
            ax.set_ylabel("MiB/s (this machine)")
            ax.set_title(f"{phase} read of {r['size'] / MiB:.0f} MiB")
            ax.legend()
        lines += ["", H.save_plot(fig, path, "throughput")]
    return "\n".join(lines)
