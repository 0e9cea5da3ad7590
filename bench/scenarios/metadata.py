"""Metadata updates: file creates per second, write-through and write-back (Panache §7, mdtest).

C = 1 and 4 client processes, each in its own directory, create empty files (open O_CREAT|O_EXCL, close)
for a fixed window (5 s; at most 20,000 files per client), released together; creates/s = all files / the
slowest client's time. Home is behind 30 ms round trips (no bandwidth cap: every create is small). Systems:
direct (the local disk, the limit), larder write-through (each create returns once home has it: the
round trip is the floor), larder write-back (creates land in the cache and are pushed in the background,
as Panache's gateways queue them), and the writable peers. For larder write-back the time the queue takes to
reach home after the window is measured (`larder drain`, as Panache's Figure 8 measures flushing creates),
and for both larder modes every created name must then be at home; for the peers the names missing at home
once they are unmounted are counted (their own business, reported, not an error; JuiceFS's home is its Redis
and bucket, read through a new mount of its volume).

A second figure is the one a user at a shell sees: 100 files created by a shell loop (`: > f$i`, one
process, one create after the other) in a directory that exists at home with 200 files in it and that the
mount never listed, home 30 ms away.
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
        with ctx.home_view(s) as home:
            r["missing_at_home"] = missing_at_home(os.path.join(home, rel), counts)
        if r["missing_at_home"] and not s.peer:
            H.note(f"metadata: {s.name}, {clients} client(s): {r['missing_at_home']} created names not at home")
    shutil.rmtree(home_dir, ignore_errors=True)
    return r


SHELL_FILES = 100


def shell_loop(ctx, s, link):
    """Creates/s of a shell loop making SHELL_FILES files in an existing directory nobody listed."""
    rel = f"metadata/{s.name}-shell"
    home_dir = os.path.join(ctx.home, rel)
    shutil.rmtree(home_dir, ignore_errors=True)
    os.makedirs(home_dir)
    for j in range(200):
        with open(os.path.join(home_dir, f"old{j:03d}"), "w") as f:
            f.write("x")
    with s.mount(ctx, "mdsh", link=None if s.name == "direct" else link, writable=True) as m:
        d = m.path(rel)
        t0 = time.monotonic()
        H.run(["sh", "-c", f'cd "$1" && i=0; while [ $i -lt {SHELL_FILES} ]; do : > new$i; i=$((i+1)); done',
               "sh", d], timeout=600)
        secs = time.monotonic() - t0
        st = m.status()
        r = {"files": SHELL_FILES, "seconds": round(secs, 3), "per_s": round(SHELL_FILES / secs, 1)}
        if st:
            r["home_listings"] = H.get(st, "metadata", "listings")
            r["home_lookups"] = H.get(st, "metadata", "lookups")
    shutil.rmtree(home_dir, ignore_errors=True)
    return r


def run(ctx):
    seconds = ctx.args.metadata_seconds
    link = ctx.link(ctx.args.latency)
    ctx.subhome("metadata")
    res = {"seconds": seconds, "cap": CAP, "link": link.describe(), "systems": {}}
    for s in systems(ctx):
        res["systems"][s.name] = {str(c): run_one(ctx, s, c, seconds, link) for c in CLIENTS}
        if s.name != "larder-wt":
            log(f"metadata: {s.name}, a shell loop of {SHELL_FILES} creates")
            res["systems"][s.name]["shell"] = shell_loop(ctx, s, link)
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


def shell_table(r, systems):
    rows = []
    for s in systems:
        d = H.get(r["systems"], s, "shell") or {}
        if d:
            rows.append([s, d.get("per_s"), d.get("seconds"), d.get("home_listings", "—"),
                         d.get("home_lookups", "—"), H.ratio(d.get("per_s"), H.get(r["systems"], "direct", "shell", "per_s"))])
    return H.md_table(["system", "creates/s", "s", "home listings", "home lookups", "÷ direct"], rows)


def report(r, ctx):
    systems = list(r["systems"])
    lines = [f"C clients, each in its own directory, create empty files for {r['seconds']:g} s (at most "
             f"{r['cap']:,} each); home behind {r['link']} (direct: the local disk). creates/s = all files / "
             "the slowest client's time (this machine). Queue at home: how long `larder drain` took after "
             "the window (write-back); names missing at home: created names not at home once the system was "
             "unmounted (larder drains on unmount; a peer pushes what it pushes).", "", table(r, systems), "", ratios(r, systems),
             "", f"A shell loop creating {SHELL_FILES} files, one after the other, in a directory of 200 files that exists "
             "at home and that the mount never listed (target for larder write-back: at least 300/s):", "",
             shell_table(r, systems)]
    return "\n".join(lines + plot(r, systems, ctx))
