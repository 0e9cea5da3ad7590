"""Input files read again and again by 4 processes (Coopc-PVFS §4.1, the matrix multiplication program).

Two input files at home (64 MiB each; 256 MiB with --full) are read whole, in 1 MiB preads, again and again
(5 passes; 10 with --full) by 4 processes at once, released together, as the seed's 4 clients read the two
input matrices. Every system starts on a fresh mount with an empty cache and the page cache dropped, home
behind the link, so the first pass pays the link and the later ones should hit the cache (the seed's
"read time approximately zero" once cached). Baseline: direct, the same reads of the local disk. Figures:
total read time (the slowest process), first pass, and the mean of the later passes (each the slowest
process's), plus for larder the bytes fetched from home (the limit: each input once).
"""
import os

import harness as H
from harness import MiB, log

TITLE = "Re-read input files, 4 processes (Coopc-PVFS §4.1)"
PROCESSES = 4
FILES = ["reread/in1", "reread/in2"]


def add_args(ap):
    ap.add_argument("--reread-size", type=H.parse_size, default=None,
                    help="reread: size of each of the two input files [64MiB; 256MiB with --full]")
    ap.add_argument("--reread-passes", type=int, default=None, help="reread: passes over the inputs [5; 10 with --full]")


def make_inputs(ctx, size):
    ctx.subhome("reread")
    for rel in FILES:
        path = os.path.join(ctx.home, rel)
        if not os.path.exists(path) or os.path.getsize(path) != size:
            log(f"reread: writing a {size / MiB:.0f} MiB input at home")
            H.write_random(path, size)


def measure(ctx, s, size, passes):
    with s.mount(ctx, "reread", link=None if s.name == "direct" else ctx.wan) as m:
        ctx.drop_caches()
        log(f"reread: {s.name}, {PROCESSES} processes, {passes} passes")
        out = ctx.workers([["reread", str(passes)] + [m.path(f) for f in FILES]] * PROCESSES)
        st = m.status()
    want = passes * len(FILES) * size
    if any(o["bytes"] != want for o in out):
        H.note(f"reread: {s.name}: a process read {min(o['bytes'] for o in out)} of {want} bytes")
    per_pass = [max(o["pass_seconds"][p] for o in out) for p in range(passes)]
    r = {"total_s": round(max(o["seconds"] for o in out), 3), "first_s": round(per_pass[0], 3),
         "later_mean_s": round(sum(per_pass[1:]) / len(per_pass[1:]), 4) if passes > 1 else None,
         "pass_s": [round(x, 4) for x in per_pass]}
    if st:
        r["home_bytes_read"] = H.get(st, "home", "bytes_read")
    return r


def run(ctx):
    a = ctx.args
    size = a.reread_size or ((256 if a.full else 64) * MiB)
    passes = a.reread_passes or (10 if a.full else 5)
    make_inputs(ctx, size)
    bw = ctx.wan.bandwidth
    res = {"size": size, "passes": passes, "processes": PROCESSES, "link": ctx.wan.describe(), "systems": {},
           "link_limit_first_s": round(len(FILES) * size / bw, 3) if bw else None}
    for s in ctx.systems:
        res["systems"][s.name] = measure(ctx, s, size, passes)
    return res


def plot(r, systems, ctx):
    path = ctx.plot("reread") if ctx else None
    if not path:
        return []
    import matplotlib.pyplot as plt
    first = [r["systems"][s]["first_s"] for s in systems]
    rest = [max(0.0, r["systems"][s]["total_s"] - r["systems"][s]["first_s"]) for s in systems]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(systems, first, label="first pass")
    ax.bar(systems, rest, bottom=first, label=f"the other {r['passes'] - 1} passes")
    ax.set_ylabel("seconds (slowest of 4 processes, this machine)")
    ax.set_title(f"2 × {r['size'] / MiB:.0f} MiB read {r['passes']} times by 4 processes")
    ax.legend()
    return ["", H.save_plot(fig, path, "reread")]


def report(r, ctx):
    systems = list(r["systems"])
    sy = r["systems"]
    lb = H.get(sy, "larder", "total_s")
    inputs = len(FILES) * r["size"]
    rows = []
    for s in systems:
        d = sy[s]
        hb = d.get("home_bytes_read")
        rows.append([s, d["total_s"], d["first_s"], d["later_mean_s"],
                     H.ratio(hb, inputs) if hb is not None else "—",
                     "—" if s == "larder" else H.ratio(lb, d["total_s"])])
    lines = [f"{r['processes']} processes each read two {r['size'] / MiB:.0f} MiB files whole, {r['passes']} "
             f"times, from a fresh mount (empty cache, page cache dropped), home behind the link "
             f"({r['link']}; direct: the local disk). Times are the slowest process's (this machine).", "",
             H.md_table(["system", "total s", "first pass s", "later passes, mean s",
                         "home bytes ÷ inputs", "larder total ÷ this"], rows)]
    if r.get("link_limit_first_s"):
        lines += ["", f"The link's bandwidth alone needs {r['link_limit_first_s']:.2f} s to bring the inputs once "
                      "(the first pass's limit over the link)."]
    return "\n".join(lines + plot(r, systems, ctx))
