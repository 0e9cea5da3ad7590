"""Read/write sharing: one writer, then K readers of the same file (IMCa §5.6).

One writer writes a file (256 MiB; 1 GiB with --full) through a writable mount in 1 MiB writes, fsync,
close; then K = 1, 2, 4, 8 readers, separate processes released together, each read the whole file in 1 MiB
preads, the page cache dropped before each K, so the figure is the system's own cache. Home is behind the
link; larder runs write-back, so its readers are served by the cache the writer filled (the bytes larder
read from home are recorded: the limit is 0). Aggregate MiB/s = K × size / the slowest reader's time. The
baseline is direct: the same write and reads on the local disk. Afterwards the bytes at home must be the
bytes written: larder pushes them on unmount, the peers in their own time (waited for, bounded). JuiceFS's
home is its Redis and bucket: it is done when its write-back staging is empty, and the bytes are read back
through a new mount of its volume.
"""
import hashlib
import os
import random
import time

import harness as H
from harness import MiB, log

TITLE = "Read/write sharing: one writer, K readers (IMCa §5.6)"
READERS = [1, 2, 4, 8]
UPLOAD_WAIT_S = 180  # the longest a peer may take to bring the written file home


def add_args(ap):
    ap.add_argument("--shared-size", type=H.parse_size, default=None,
                    help="shared: size of the written file [256MiB; 1GiB with --full]")


def sample(path, size, samples=8):
    """Digests of the first, last and a few random 1 MiB blocks of a file."""
    rng = random.Random(11)
    blocks = max(1, (size + MiB - 1) // MiB)
    picks = sorted({0, blocks - 1} | {rng.randrange(blocks) for _ in range(samples)})
    out = {}
    with open(path, "rb") as f:
        for b in picks:
            f.seek(b * MiB)
            out[b] = hashlib.sha256(f.read(MiB)).hexdigest()
    return out


def wait_home(path, size, seconds):
    """Seconds until the file at home has `size` bytes and stays unchanged for a second; None on timeout."""
    t0, last = time.monotonic(), None
    while time.monotonic() - t0 < seconds:
        try:
            st = os.stat(path)
            cur = (st.st_size, st.st_mtime_ns)
        except OSError:
            cur = None
        if cur and cur[0] == size and cur == last:
            return round(time.monotonic() - t0 - 1, 1)
        last = cur
        time.sleep(1)
    return None


def readers(ctx, path, k, size):
    ctx.drop_caches()
    out = ctx.workers([["read", path, "0", str(size)] for _ in range(k)])
    secs = max(o["seconds"] for o in out)
    short = [o["bytes"] for o in out if o["bytes"] != size]
    if short:
        H.note(f"shared: {k} readers: a reader got {short[0]} of {size} bytes")
    return {"seconds": round(secs, 3), "MiB_s": round(k * size / MiB / secs, 1)}


def check_home(name, home_path, size, seen):
    """Whether home holds what the writer wrote: its size, and the sampled blocks the mount served (the
    writer wrote one random MiB over and over, so all whole sampled blocks must also be equal)."""
    got = os.path.getsize(home_path) if os.path.exists(home_path) else None
    whole = [d for b, d in seen.items() if (b + 1) * MiB <= size]
    if got != size:
        H.note(f"shared: {name}: home has {got} bytes of the {size} written")
        return False
    if len(set(whole)) > 1 or sample(home_path, size) != seen:
        H.note(f"shared: {name}: the bytes at home differ from the bytes written")
        return False
    return True


def run_system(ctx, s, size):
    rel = f"shared/{s.name}.bin"
    home_path = os.path.join(ctx.home, rel)
    if os.path.exists(home_path):
        os.remove(home_path)
    link = None if s.name == "direct" else ctx.wan
    r = {"readers": {}}
    with s.mount(ctx, "shared", link=link, writable=True) as m:
        path = m.path(rel)
        ctx.drop_caches()
        log(f"shared: {s.name}: writing {size / MiB:.0f} MiB")
        w = ctx.workers([["write", path, str(size)]])[0]
        r["write"] = {"seconds": round(w["seconds"], 3), "MiB_s": round(size / MiB / w["seconds"], 1)}
        for k in READERS:
            log(f"shared: {s.name}: {k} reader(s)")
            r["readers"][str(k)] = readers(ctx, path, k, size)
            if m.status():
                r["readers"][str(k)]["home_bytes_written"] = H.get(m.status(), "home", "bytes_written")
        st = m.status()
        if st:
            r["home_bytes_read"] = H.get(st, "home", "bytes_read")
        if s.name != "direct":
            seen = sample(path, size)
        if s.peer:
            pushed = getattr(m, "wait_pushed", None)
            r["home_complete_after_s"] = pushed(UPLOAD_WAIT_S) if pushed else wait_home(home_path, size,
                                                                                       UPLOAD_WAIT_S)
    if s.name != "direct":
        with ctx.home_view(s) as home:
            r["home_ok"] = check_home(s.name, os.path.join(home, rel), size, seen)
    if os.path.exists(home_path):
        os.remove(home_path)
    return r


def run(ctx):
    a = ctx.args
    size = a.shared_size or ((1 << 30) if a.full else 256 * MiB)
    ctx.subhome("shared")
    res = {"size": size, "link": ctx.wan.describe(), "systems": {}}
    for s in ctx.systems:
        res["systems"][s.name] = run_system(ctx, s, size)
    return res


def reader_table(r, systems):
    header = ["readers"] + [f"{s} MiB/s" for s in systems] + [f"{s} slowest s" for s in systems] + \
             [f"larder ÷ {s}" for s in systems if s != "larder"]
    rows = []
    for k in map(str, READERS):
        mibs = {s: H.get(r["systems"], s, "readers", k, "MiB_s") for s in systems}
        rows.append([k] + [mibs[s] for s in systems] +
                    [H.get(r["systems"], s, "readers", k, "seconds") for s in systems] +
                    [H.ratio(mibs.get("larder"), mibs[s]) for s in systems if s != "larder"])
    return H.md_table(header, rows)


def writer_table(r, systems):
    rows = []
    for s in systems:
        d = r["systems"][s]
        ok = d.get("home_ok")
        rows.append([s, H.get(d, "write", "seconds"), H.get(d, "write", "MiB_s"),
                     "—" if ok is None else ("yes" if ok else "**no**"),
                     d.get("home_complete_after_s"),
                     H.fmt(d["home_bytes_read"] / MiB, 2) if d.get("home_bytes_read") is not None else "—"])
    return H.md_table(["system", "write+fsync s", "write MiB/s", "home has the bytes",
                       "home complete after readers, s", "MiB read from home"], rows)


def plot(r, systems, ctx):
    path = ctx.plot("shared") if ctx else None
    if not path:
        return []
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in systems:
        ax.plot(READERS, [H.get(r["systems"], s, "readers", str(k), "MiB_s") or 0 for k in READERS],
                marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(READERS)
    ax.set_xticklabels([str(k) for k in READERS])
    ax.set_xlabel("readers")
    ax.set_ylabel("aggregate MiB/s (this machine)")
    ax.set_title(f"K readers of a {r['size'] / MiB:.0f} MiB file one writer wrote")
    ax.legend()
    return ["", H.save_plot(fig, path, "shared")]


def report(r, ctx):
    systems = list(r["systems"])
    lines = [f"One writer writes {r['size'] / MiB:.0f} MiB through a writable mount (home behind the link, "
             f"{r['link']}; larder write-back; direct: the local disk), fsync, close; then K readers read it "
             "whole at once, page cache dropped before each K. Aggregate MiB/s = K × size / slowest reader "
             "(this machine).", "", writer_table(r, systems), "", reader_table(r, systems)]
    lb = H.get(r["systems"], "larder", "home_bytes_read")
    if lb is not None:
        lines += ["", f"larder's readers took {lb:,} bytes from home (the limit is 0: the writer's cache "
                      "serves them)."]
        pushed = [H.get(r["systems"], "larder", "readers", str(k), "home_bytes_written") for k in READERS]
        if all(p is not None for p in pushed):
            lines.append("Its write-back had pushed " + ", ".join(f"{p / MiB:.0f}" for p in pushed) +
                         f" MiB home by the end of K = {', '.join(map(str, READERS))} (the push, after the sync "
                         "lag, shares the machine with the readers).")
    return "\n".join(lines + plot(r, systems, ctx))
