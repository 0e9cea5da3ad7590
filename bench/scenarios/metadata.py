"""Metadata updates: file creates per second, write-through and write-back (Panache §7, mdtest).

C = 1 and 4 client processes, each in its own directory, create empty files (open O_CREAT|O_EXCL, close)
for a fixed window (5 s; at most 20,000 files per client), released together; creates/s = all files / the
slowest client's time. Home is behind 30 ms round trips (no bandwidth cap: every create is small). Systems:
direct (the local disk, the limit), larder write-through (each create returns once home has it: the
round trip is the floor), larder write-back (creates land in the cache and are pushed in the background,
as Panache's gateways queue them), and the writable peers. For larder write-back the time the queue takes to
reach home after the window is measured (`larder drain`, as Panache's Figure 8 measures flushing creates),
and for both larder modes every created name must then be at home; for the peers the names missing at home
once they are unmounted are counted (their own business, reported, not an error).
"""
import os
import shutil
import time

import harness as H
from harness import log

TITLE = "Metadata: creates/s, write-through and write-back (Panache §7, mdtest)"
CLIENTS = [1, 4]
CAP = 20000  # files per client


def add_args(ap):
    ap.add_argument("--metadata-seconds", type=float, default=5.0,
                    help="metadata: seconds of creates per figure [5]")


def systems(ctx):
    return [ctx.system("direct"),
            ctx.larder("larder-wt", ["--write-mode", "write-through"]),
            ctx.larder("larder-wb", ["--write-mode", "write-back"])] + ctx.peers()


def drain(mnt):
    t0 = time.monotonic()
    r = H.run([H.LARDER, "drain", mnt, "--timeout", "600s"], timeout=700, check=False)
    if r.returncode != 0:
        H.note(f"metadata: drain of {mnt} failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return round(time.monotonic() - t0, 2)


def missing_at_home(home_dir, counts):
    """How many of the names the clients created are not at home."""
    missing = 0
    for i, n in enumerate(counts):
        d = os.path.join(home_dir, f"c{i}")
        have = set(os.listdir(d)) if os.path.isdir(d) else set()
        missing += sum(1 for j in range(n) if f"f{j:06d}" not in have)
    return missing


def run_one(ctx, s, clients, seconds, link):
    rel = f"metadata/{s.name}-{clients}"
    home_dir = os.path.join(ctx.home, rel)
    shutil.rmtree(home_dir, ignore_errors=True)
    r = {}
    with s.mount(ctx, f"md{clients}", link=None if s.name == "direct" else link, writable=True) as m:
        log(f"metadata: {s.name}, {clients} client(s)")
        out = ctx.workers([["creates", m.path(f"{rel}/c{i}"), str(seconds), str(CAP)] for i in range(clients)])
        counts = [o["creates"] for o in out]
        secs = max(o["seconds"] for o in out)
        r.update(creates=sum(counts), seconds=round(secs, 3), per_s=round(sum(counts) / secs, 1))
        st = m.status()
        if st:
            r["pending_after_window"] = H.get(st, "journal", "pending_ops")
            if s.name == "larder-wb":
                r["drain_s"] = drain(m.root)
    if s.name != "direct":
        r["missing_at_home"] = missing_at_home(home_dir, counts)
        if r["missing_at_home"] and not s.peer:
            H.note(f"metadata: {s.name}, {clients} client(s): {r['missing_at_home']} created names not at home")
    shutil.rmtree(home_dir, ignore_errors=True)
    return r


def run(ctx):
    seconds = ctx.args.metadata_seconds
    link = ctx.link(ctx.args.latency)
    ctx.subhome("metadata")
    res = {"seconds": seconds, "cap": CAP, "link": link.describe(), "systems": {}}
    for s in systems(ctx):
        res["systems"][s.name] = {str(c): run_one(ctx, s, c, seconds, link) for c in CLIENTS}
    return res


def rate(r, s, c):
    return H.get(r["systems"], s, str(c), "per_s")


def table(r, systems):
    rows = []
    for s in systems:
        row = [s]
        for c in CLIENTS:
            d = H.get(r["systems"], s, str(c)) or {}
            row += [d.get("per_s"), d.get("creates")]
        wb = [H.get(r["systems"], s, str(c), "drain_s") for c in CLIENTS]
        miss = [H.get(r["systems"], s, str(c), "missing_at_home") for c in CLIENTS]
        row.append(" / ".join(H.fmt(x) for x in wb) if any(x is not None for x in wb) else "—")
        row.append(" / ".join(H.fmt(x) for x in miss) if any(x is not None for x in miss) else "—")
        rows.append(row)
    header = ["system"]
    for c in CLIENTS:
        header += [f"{c} client{'s' if c > 1 else ''}: creates/s", "files"]
    header += [f"queue at home after, s ({' / '.join(map(str, CLIENTS))})", "names missing at home"]
    return H.md_table(header, rows)


def ratios(r, systems):
    pairs = [("larder-wb", "larder-wt"), ("larder-wb", "direct")] + \
            [("larder-wb", s) for s in systems if s not in ("direct", "larder-wt", "larder-wb")]
    rows = [[f"{a} ÷ {b}"] + [H.ratio(rate(r, a, c), rate(r, b, c)) for c in CLIENTS] for a, b in pairs]
    return H.md_table(["creates/s ratio"] + [f"{c} client{'s' if c > 1 else ''}" for c in CLIENTS], rows)


def plot(r, systems, ctx):
    path = ctx.plot("metadata") if ctx else None
    if not path:
        return []
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(CLIENTS)
    for i, c in enumerate(CLIENTS):
        xs = [j + (i - (len(CLIENTS) - 1) / 2) * width for j in range(len(systems))]
        ax.bar(xs, [rate(r, s, c) or 0 for s in systems], width, label=f"{c} client{'s' if c > 1 else ''}")
    ax.set_xticks(range(len(systems)))
    ax.set_xticklabels(systems)
    ax.set_yscale("log")
    ax.set_ylabel("creates/s (log scale, this machine)")
    ax.set_title(f"File creates, home behind {r['link']}")
    ax.legend()
    return ["", H.save_plot(fig, path, "metadata")]


def report(r, ctx):
    systems = list(r["systems"])
    lines = [f"C clients, each in its own directory, create empty files for {r['seconds']:g} s (at most "
             f"{r['cap']:,} each); home behind {r['link']} (direct: the local disk). creates/s = all files / "
             "the slowest client's time (this machine). Queue at home: how long `larder drain` took after "
             "the window (write-back); names missing at home: created names not at home once the system was "
             "unmounted (larder drains on unmount; a peer pushes what it pushes).", "", table(r, systems), "", ratios(r, systems)]
    return "\n".join(lines + plot(r, systems, ctx))
