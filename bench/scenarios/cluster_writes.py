"""Writes across a cluster (design note 016): what node A wrote and closed, seen by node B at its next
open; what a close and an open cost in a cluster against a node alone; a file's write token handed
between two writers.

Nodes are larder daemons in network namespaces of their own, on the cluster scenario's private network
(bench/scenarios/cluster.py: the bridge, the blackhole route, an etcd on the bridge, mutual TLS). Every
mount is writable, write-back with `--sync-lag 1h` (nothing reaches home while it is measured unless a
token handoff pushes it), `--validity-lag 1h`, its home the suite's home directory itself, without an
emulated link. A single Python process in the root namespace uses the mounts, one call after another, and
times each call with perf_counter. Each cluster is a fresh pair of mounts with empty caches: A (n0) and
B (n1). Files are 4 KiB.

1. Close on A → new content on B, with `--close-to-open on` (the default) and `off`, first thing on a
   fresh pair (the only held records are this measurement's own): each round writes a new 4 KiB content
   (open, write, close) through A's mount, then opens and reads the file through B's mount, again every
   0.2 ms until B returns the new content (at most 5 s). The figure is the time from A's close
   returning to B's read returning the new content. Two cases: "rewrite", a set of 20 files rewritten
   round-robin (existing at home; one warm-up pass over them, not counted, takes A's tokens and opens
   B's connection to A), and "new", a new file each round. What B's first read got is counted: the new
   content, the old one (stale), an empty file (A's truncation at its open, a version A published before
   its data), no such file (a new name B did not see yet), or anything else (a bug).
2. Extra latency of a close and of an open: on A, 1,000 new files written (create, write 4 KiB, close),
   rewritten (open with O_TRUNC, write, close) and read back (open, read, close); 1,000 files at home
   read once untimed, read again (cached), then rewritten (A's first change of each: in a cluster the
   open takes its write token). Each call is timed apart. The same on a node alone with the same options
   (no cluster), in the same run, and on a cluster with close-to-open off. Every change stays held
   meanwhile, so the records in etcd grow by thousands; node B opens 200 files it has cached before and
   after A's passes (the probe), with the count of records.
3. Token handoff: A and B append a line to one file in turns (50 turns each). Each turn's first append
   takes the token from the other node, which first pushes its changes to home; a second append by the
   same node, holding the token, is the same-run baseline. The file is checked through both mounts and,
   once drained, at home. Then the same with home away (both mounts' `--fault-file` present while they
   append): each handoff hands the giver's changes over peer to peer, a copy of the file; home is back
   before the drain.
4. Locks across nodes (design note 017): on a fresh pair, A and B take and drop an exclusive `flock` of one
   file in turns (every lock follows the other node's unlock), each call timed, against the same pair
   taking it again on one node (no other node's change to take in). A counter file incremented under
   `flock -x` by three processes for --cw-seconds/3 s each run: one on each of three nodes, three on one
   cluster node, and three on a node alone (the kernel's own locks): increments a second. What a lock adds
   to an uncontended write: on A, files written (open, write 4 KiB, close) bare and inside an exclusive
   `flock` (open, lock, write, unlock, close).
"""
import base64
import contextlib
import errno
import http.client
import json
import os
import time

import harness as H
from harness import log, note
from scenarios import cluster as C

TITLE = "Cluster writes: close on one node to open on another, close and open costs, token handoff (design 016)"

SIZE = 4096
ROOT = "cluster-writes"
HOME_SET = f"{ROOT}/home"  # files at home, read once, then timed read again (cached)
PROBE_SET = f"{ROOT}/probe"  # files at home B reads again as the held records grow
PROBE_FILES = 200
REWRITE_SET = 20
POLL_LIMIT = 5.0  # seconds B may take to show the new content before a round counts as never visible
POLL_SLEEP = 0.0002
TARGET_VISIBLE_P99_MS = 5.0
# How the nodes reach home: the home directory itself, write-back, changes kept an hour.
ACCESS = ["--write-mode", "write-back", "--sync-lag", "1h"]
A, B, ALONE = 0, 1, 2  # namespaces of the nodes


def add_args(ap):
    ap.add_argument("--cw-rounds", type=int, default=300,
                    help="cluster_writes: close-to-visible rounds per case [300]")
    ap.add_argument("--cw-files", type=int, default=1000,
                    help="cluster_writes: files written and read for close and open latency [1000]")
    ap.add_argument("--cw-turns", type=int, default=50,
                    help="cluster_writes: turns of each node appending to one file [50]")
    ap.add_argument("--cw-seconds", type=float, default=30,
                    help="cluster_writes: most seconds of each measured loop [30]")


def stats(lat):
    """Count, median, 90th and 99th percentiles, maximum and mean of seconds, in ms."""
    s = sorted(lat)
    if not s:
        return {"n": 0}

    def q(p):
        return round(s[min(len(s) - 1, int(p * len(s)))] * 1e3, 4)
    return {"n": len(s), "p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "max_ms": round(s[-1] * 1e3, 4),
            "mean_ms": round(sum(s) / len(s) * 1e3, 4)}


def content(tag, i):
    """4 KiB no other round writes: a readable head, then random bytes."""
    head = f"{tag} round {i} {time.time_ns()}\n".encode()
    return head + os.urandom(SIZE - len(head))


def write_file(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    """Open, write, close; the seconds of each."""
    t0 = time.perf_counter()
    fd = os.open(path, flags, 0o644)
    t1 = time.perf_counter()
    try:
        n = os.write(fd, data)
    finally:
        t2 = time.perf_counter()
        os.close(fd)
        t3 = time.perf_counter()
    if n != len(data):
        raise RuntimeError(f"short write to {path}: {n} of {len(data)} bytes")
    return t1 - t0, t2 - t1, t3 - t2


def read_file(path):
    """Open, read to the end, close; the bytes and the seconds of each."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    t1 = time.perf_counter()
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
    finally:
        t2 = time.perf_counter()
        os.close(fd)
        t3 = time.perf_counter()
    return b"".join(chunks), (t1 - t0, t2 - t1, t3 - t2)


def make_data(ctx, files):
    """At home: the files read for the cached-read figures, and the probe's."""
    out = []
    for rel, prefix, count in ((HOME_SET, "h", files), (PROBE_SET, "p", PROBE_FILES)):
        names = [f"{prefix}{i:05d}" for i in range(count)]
        H.random_files(ctx.subhome(rel), names, SIZE)
        out.append(names)
    return out


def fresh_dir(ctx, rel, rewrite_files=0):
    """A new directory at home for one measurement, with `rewrite_files` 4 KiB files in it."""
    d = ctx.subhome(rel)
    old = {}
    for i in range(rewrite_files):
        data = content("home", i)
        with open(os.path.join(d, f"r{i:02d}"), "wb") as f:
            f.write(data)
        old[f"r{i:02d}"] = data
    return old


# 1. Close on A, new content on B.

def visible(a, b, rel, case, rounds, seconds, old, inspect):
    """Rounds of: write a new content through A, then read through B until it shows it. Each round whose
    first read on B was not the new content is listed; for one that never showed it, what `inspect(path)`
    finds (etcd's record of the path) and what each node sees then."""
    names = sorted(old) if case == "rewrite" else None
    prev = dict(old)
    lat, writes, first_states, b_open, b_read = [], [], {}, [], []
    never, warm, odd = [], [], []
    tries_total, read_again = 0, 0
    deadline = time.monotonic() + seconds

    def one(i, name):
        nonlocal tries_total, read_again
        data = content(case, i)
        pa, pb = os.path.join(a.path(rel), name), os.path.join(b.path(rel), name)
        w = write_file(pa, data)
        t_close = time.perf_counter()
        first, tries, parts = None, 0, None
        while True:
            tries += 1
            try:
                got, parts = read_file(pb)
                if got == data:
                    state = "new"
                elif got == prev.get(name):
                    state = "old"
                elif not got:
                    state = "empty"  # A's truncation at its open (O_TRUNC), published before its data
                else:
                    state = "other"
                if state == "other" and first is None:
                    note(f"cluster_writes: {case}: B read {len(got)} bytes of neither version of {name} "
                         f"(head {got[:40]!r})")
            except FileNotFoundError:
                state = "missing"
            except OSError as e:
                state = f"error {errno.errorcode.get(e.errno, e.errno)}"
            t = time.perf_counter()
            if first is None:
                first = state
            if state == "new":
                break
            if t - t_close > POLL_LIMIT:
                break
            time.sleep(POLL_SLEEP)
        tries_total += tries
        read_again += tries > 1
        if first != "new":
            x = {"round": i, "name": name, "first_read": first, "reads": tries,
                 "visible_ms": round((t - t_close) * 1e3, 3) if state == "new" else None}
            if state != "new":
                x["last_read"] = state
                x["etcd"] = inspect(f"{rel}/{name}")
                for node, path in (("A", pa), ("B", pb)):
                    try:
                        got, _ = read_file(path)
                        x[f"{node}_reads"] = {"bytes": len(got), "new_content": got == data,
                                              "stat_size": os.stat(path).st_size}
                    except OSError as e:
                        x[f"{node}_reads"] = str(e)
                note(f"cluster_writes: {case}, round {i}: B never read the new content of {name} within "
                     f"{POLL_LIMIT:g} s ({tries} reads, first {first}, last {state}); then: {x}")
            odd.append(x)
        prev[name] = data
        return sum(w), parts, first, (t - t_close) if state == "new" else None

    if case == "rewrite":
        for i, name in enumerate(names):  # A takes the tokens, B connects to A: not counted
            _, _, first, dt = one(-1 - i, name)
            warm.append(dt)
    for i in range(rounds):
        name = names[i % len(names)] if case == "rewrite" else f"n{i:05d}"
        w, parts, first, dt = one(i, name)
        writes.append(w)
        first_states[first] = first_states.get(first, 0) + 1
        if dt is None:
            never.append(name)
        else:
            lat.append(dt)
            b_open.append(parts[0])
            b_read.append(parts[1])
        if time.monotonic() > deadline:
            note(f"cluster_writes: close to visible ({case}) stopped after {i + 1} rounds ({seconds:g} s)")
            break
    r = dict(stats(lat), rounds=len(writes), first_read=first_states, never_visible=len(never),
             rounds_read_again=read_again, reads=tries_total, not_new_first=odd,
             write_ms=stats(writes), b_open_ms=stats(b_open), b_read_ms=stats(b_read),
             latencies_us=[round(x * 1e6) for x in lat])
    if warm:
        r["warmup_ms"] = [None if x is None else round(x * 1e3, 3) for x in warm]
    return r


# 2. Close and open latency on one node.

def op_latencies(node, rel, files, home_names, seconds):
    """On `node`, each call timed apart: `files` new files written (create, write, close), rewritten,
    read back; files at home read once untimed, then read again (cached), then rewritten (this node's
    first change of a file that was at home)."""
    d = node.path(rel)
    names = [f"w{i:05d}" for i in range(files)]
    out = {}

    def timed(label, paths, fn):
        parts = []
        deadline = time.monotonic() + seconds
        for p in paths:
            parts.append(fn(p))
            if time.monotonic() > deadline:
                note(f"cluster_writes: {label} on {node.name} stopped after {len(parts)} files")
                break
        out[label] = {"open": stats([x[0] for x in parts]), "io": stats([x[1] for x in parts]),
                      "close": stats([x[2] for x in parts]), "total": stats([sum(x) for x in parts])}
        return len(parts)

    paths = [os.path.join(d, n) for n in names]
    n = timed("create", paths, lambda p: write_file(p, content("create", 0), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    paths = paths[:n]
    timed("rewrite", paths, lambda p: write_file(p, content("rewrite", 0)))
    sizes = {}

    def read_back(p):
        data, t = read_file(p)
        sizes[p] = len(data)
        return t
    timed("read_written", paths, read_back)
    home = [os.path.join(node.path(HOME_SET), x) for x in home_names]
    for p in home:  # into the cache, untimed
        read_file(p)
    timed("read_cached", home, read_back)
    timed("rewrite_home", home, lambda p: write_file(p, content("rewrite-home", 0)))
    short = sum(1 for v in sizes.values() if v != SIZE)
    if short:
        note(f"cluster_writes: {short} files read back short on {node.name}")
    return out


# 3. Token handoff.

def handoff(a, b, rel, turns, seconds, before_drain=None):
    """A and B append to one file in turns: per turn, an append that takes the token, then one that
    holds it. `before_drain` is called once the appends are read back, before the nodes drain."""
    name = "log"
    take, hold, take_open = [], [], []
    expect = []
    deadline = time.monotonic() + seconds * 2
    first = None
    errors = []
    for t in range(turns):
        for node in (a, b):
            p = os.path.join(node.path(rel), name)
            for k, out in ((0, take), (1, hold)):
                line = f"{node.name} turn {t} append {k}\n".encode()
                try:
                    w = write_file(p, line, os.O_WRONLY | os.O_APPEND)
                except OSError as e:
                    errors.append(f"{node.name} turn {t} append {k}: {e}")
                    continue
                expect.append(line)
                if t == 0 and node is a and k == 0:
                    first = sum(w)  # the token is free: nobody to take it from
                    continue
                out.append(sum(w))
                if k == 0:
                    take_open.append(w[0])
        if time.monotonic() > deadline:
            note(f"cluster_writes: the handoff stopped after {t + 1} turns")
            break
    want = b"".join(expect)
    r = {"turns": t + 1, "appends": len(expect), "take": stats(take), "take_open": stats(take_open),
         "hold": stats(hold), "first_append_ms": None if first is None else round(first * 1e3, 3),
         "take_latencies_us": [round(x * 1e6) for x in take]}
    if errors:
        r["errors"] = errors[:20]
        note(f"cluster_writes: {len(errors)} appends failed: {errors[0]}")
    checks, lost = {}, {}

    def check(where, got):
        checks[where] = got == want
        if got != want:
            have = got.splitlines(keepends=True)
            lost[where] = {"bytes": len(got), "expected": len(want),
                           "missing": [x.decode().strip() for x in expect if x not in have],
                           "unexpected": [x.decode(errors="replace").strip() for x in have if x not in expect],
                           "rest_in_order": [x for x in expect if x in have] == have}
            note(f"cluster_writes: the appended file {where} differs: {lost[where]}")
    for node in (a, b):
        try:
            check(f"read on {node.name}", read_file(os.path.join(node.path(rel), name))[0])
        except OSError as e:
            checks[f"read on {node.name}"] = f"error: {e}"
    if before_drain:
        before_drain()
    for node in (b, a):  # B holds the last changes
        H.run([H.LARDER, "drain", node.mnt, "--timeout", "120s"], timeout=180, check=False)
    with open(os.path.join(a.ctx.home, rel, name), "rb") as f:
        check("at home, drained", f.read())
    r["content_ok"] = checks
    if lost:
        r["content_lost"] = lost
    return r


def node_figures(n):
    st = n.status()
    out = {"home_ops_by_kind": H.get(st, "home", "ops_by_kind"), "home_bytes_written": H.get(st, "home", "bytes_written")}
    for k in ("peers", "journal", "writeback"):
        if H.get(st, k) is not None:
            out[k] = st[k]
    return out


COUNTER = r"""
import fcntl, os, sys, time
p, until = sys.argv[1], time.monotonic() + float(sys.argv[2])
n = 0
while time.monotonic() < until:
    fd = os.open(p, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    v = int(os.pread(fd, 32, 0) or b"0")
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(v + 1).encode(), 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    n += 1
print(n)
"""


def lock_turns(a, b, rel, rounds, seconds):
    """A and B take and drop an exclusive flock of one file in turns; then A alone, again and again."""
    import fcntl
    name = "locked"
    for n in (a, b):
        write_file(os.path.join(n.path(rel), name), b"0")
    fds = {n.name: os.open(os.path.join(n.path(rel), name), os.O_RDWR) for n in (a, b)}
    out = {"turns": {"lock": [], "unlock": []}, "one_node": {"lock": [], "unlock": []}}
    deadline = time.monotonic() + seconds
    for case, order in (("turns", (a, b)), ("one_node", (a, a))):
        for i in range(rounds):
            for n in order:
                fd = fds[n.name]
                t0 = time.perf_counter()
                fcntl.flock(fd, fcntl.LOCK_EX)
                t1 = time.perf_counter()
                fcntl.flock(fd, fcntl.LOCK_UN)
                t2 = time.perf_counter()
                if i > 0:  # the first round opens connections
                    out[case]["lock"].append(t1 - t0)
                    out[case]["unlock"].append(t2 - t1)
            if time.monotonic() > deadline:
                break
    for fd in fds.values():
        os.close(fd)
    return {case: {k: stats(v) for k, v in d.items()} for case, d in out.items()}


def counter_rate(paths, seconds):
    """Processes incrementing one counter under flock for `seconds`, one on each of `paths`."""
    import subprocess
    with open(paths[0], "wb") as f:
        f.write(b"0")
    t0 = time.monotonic()
    procs = [subprocess.Popen(["python3", "-c", COUNTER, p, str(seconds)], stdout=subprocess.PIPE, text=True)
             for p in paths]
    counts = [int(p.communicate(timeout=seconds + 120)[0].strip() or 0) for p in procs]
    elapsed = time.monotonic() - t0
    with open(paths[0], "rb") as f:
        final = int(f.read().strip() or 0)
    return {"processes": len(paths), "increments": sum(counts), "final": final, "lost": sum(counts) - final,
            "seconds": round(elapsed, 3), "per_second": round(sum(counts) / elapsed, 1)}


def locked_writes(node, rel, files, seconds):
    """Files written bare, then inside an exclusive flock, on one node: each whole call sequence timed."""
    import fcntl
    bare, locked = [], []
    deadline = time.monotonic() + seconds
    for i in range(files):
        data = content("w", i)
        for kind, out in (("bare", bare), ("locked", locked)):
            p = os.path.join(node.path(rel), f"{kind}{i}")
            t0 = time.perf_counter()
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            if kind == "locked":
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, data)
            if kind == "locked":
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            out.append(time.perf_counter() - t0)
        if time.monotonic() > deadline:
            break
    b, l = stats(bare), stats(locked)
    return {"bare": b, "locked": l,
            "added_p50_ms": None if not b.get("n") else round(l["p50_ms"] - b["p50_ms"], 4)}


@contextlib.contextmanager
def pair(ctx, shared, tag, c2o="on"):
    with C.nodes(ctx, shared, tag, [A, B], access=ACCESS, flags=["--close-to-open", c2o]) as ns:
        yield ns


def etcd_range(shared, key, prefix=False, count_only=False):
    """etcd's answer to a range read of `key` (bytes), or of every key below it (through its JSON gateway);
    None if it does not answer."""
    host, port = shared["etcd"].split("://", 1)[1].rsplit(":", 1)
    body = {"key": base64.b64encode(key).decode(), "count_only": count_only}
    if prefix:
        body["range_end"] = base64.b64encode(key[:-1] + bytes([key[-1] + 1])).decode()
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.request("POST", "/v3/kv/range", json.dumps(body))
        return json.loads(c.getresponse().read())
    except (OSError, ValueError) as e:
        note(f"cluster_writes: etcd's gateway did not answer: {e}")
        return None


def held_count(shared, cluster):
    """How many held records cluster `cluster` has in etcd."""
    r = etcd_range(shared, f"/larder/{cluster}/held/".encode(), prefix=True, count_only=True)
    return None if r is None else int(r.get("count", 0))


def held_record(shared, cluster, path):
    """etcd's record of `path` (below home's root) in cluster `cluster`, its revisions, and etcd's."""
    r = etcd_range(shared, f"/larder/{cluster}/held/{path}".encode())
    if r is None:
        return None
    out = {"etcd_revision": H.get(r, "header", "revision")}
    for kv in r.get("kvs", []):
        out.update(record=json.loads(base64.b64decode(kv["value"])), mod_revision=kv.get("mod_revision"),
                   create_revision=kv.get("create_revision"), record_version=kv.get("version"))
    return out


def probe(node, names, shared, cluster):
    """Open, read, close of files `node` has cached (each read once before), with the cluster's count of
    held records: what an open's read of the records costs as they grow."""
    paths = [os.path.join(node.path(PROBE_SET), x) for x in names]
    lat = [sum(read_file(p)[1]) for p in paths]
    opens = [read_file(p)[1][0] for p in paths]
    return {"held_records": held_count(shared, cluster), "open": stats(opens), "total": stats(lat)}


def run(ctx):
    a = ctx.args
    C.require("cluster_writes")
    home_names, probe_names = make_data(ctx, a.cw_files)
    res = {"size": SIZE, "rounds": a.cw_rounds, "files": a.cw_files, "turns": a.cw_turns,
           "rewrite_set": REWRITE_SET, "access": ACCESS + ["--validity-lag", "1h"],
           "network": f"bridge {C.BRIDGE} {C.BRIDGE_IP}/{C.PREFIX}, blackhole {C.BLACKHOLE}, a namespace per node",
           "visible": {}, "ops": {}, "probe": {}, "held_records": {}, "nodes": {}}
    olds = {}
    for d in ("ops-alone", "ops-on", "ops-off", "handoff", "handoff-away", "locks", "locks-alone"):
        fresh_dir(ctx, f"{ROOT}/{d}")
    for c2o in ("on", "off"):
        for case in ("rewrite", "new"):
            olds[c2o, case] = fresh_dir(ctx, f"{ROOT}/visible-{c2o}-{case}", REWRITE_SET if case == "rewrite" else 0)
    for d in ("handoff", "handoff-away"):
        with open(os.path.join(ctx.home, ROOT, d, "log"), "wb"):
            pass
    away = os.path.join(ctx.work, "cluster-writes-home-away")
    with contextlib.suppress(FileNotFoundError):
        os.remove(away)
    with C.network(ctx, 3) as shared:
        with C.nodes(ctx, shared, "cw-alone", [ALONE], cluster=False, access=ACCESS) as (n,):
            log(f"cluster_writes: a node alone: {a.cw_files} files written, rewritten, read; cached files")
            res["ops"]["alone"] = op_latencies(n, f"{ROOT}/ops-alone", a.cw_files, home_names, a.cw_seconds)
            res["nodes"]["alone"] = node_figures(n)
        for c2o in ("on", "off"):
            tag = f"cw-{c2o}"
            with pair(ctx, shared, tag, c2o) as (na, nb):
                cluster = f"bench-{tag}"
                res["visible"][c2o] = {}
                for case in ("rewrite", "new"):
                    rel = f"{ROOT}/visible-{c2o}-{case}"
                    held = held_count(shared, cluster)
                    log(f"cluster_writes: close-to-open {c2o}, {case}: {a.cw_rounds} rounds of a close on A, "
                        f"then B reads ({held} held records)")
                    res["visible"][c2o][case] = visible(na, nb, rel, case, a.cw_rounds, a.cw_seconds,
                                                        olds[c2o, case],
                                                        lambda path: held_record(shared, cluster, path))
                    res["visible"][c2o][case]["held_records_before"] = held
                for p in probe_names:  # into B's cache, untimed
                    read_file(os.path.join(nb.path(PROBE_SET), p))
                res["probe"][c2o] = [probe(nb, probe_names, shared, cluster)]
                res["held_records"][f"cluster_{c2o}"] = {"before_ops": held_count(shared, cluster)}
                log(f"cluster_writes: close-to-open {c2o}: {a.cw_files} files written, rewritten, read; "
                    "cached files, on A")
                res["ops"][f"cluster_{c2o}"] = op_latencies(na, f"{ROOT}/ops-{c2o}", a.cw_files, home_names,
                                                            a.cw_seconds)
                res["held_records"][f"cluster_{c2o}"]["after_ops"] = held_count(shared, cluster)
                res["probe"][c2o].append(probe(nb, probe_names, shared, cluster))
                res["nodes"][f"cluster_{c2o}"] = {x.name: node_figures(x) for x in (na, nb)}
        rel = f"{ROOT}/handoff"
        with pair(ctx, shared, "cw-handoff") as (na, nb):
            log(f"cluster_writes: A and B append to one file in turns ({a.cw_turns} turns)")
            res["handoff"] = handoff(na, nb, rel, a.cw_turns, a.cw_seconds)
            res["nodes"]["handoff"] = {x.name: node_figures(x) for x in (na, nb)}
        rel = f"{ROOT}/handoff-away"
        with C.nodes(ctx, shared, "cw-away", [A, B], access=ACCESS, flags=["--fault-file", away]) as (na, nb):
            log(f"cluster_writes: A and B append to one file in turns with home away ({a.cw_turns} turns)")
            for n in (na, nb):  # the file in both caches before home goes
                read_file(os.path.join(n.path(rel), "log"))
            with open(away, "wb"):
                pass
            try:
                res["handoff_away"] = handoff(na, nb, rel, a.cw_turns, a.cw_seconds, lambda: os.remove(away))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(away)
            res["nodes"]["handoff_away"] = {x.name: node_figures(x) for x in (na, nb)}
        res["locks"] = {}
        rel = f"{ROOT}/locks"
        with pair(ctx, shared, "cw-locks") as (na, nb):
            log(f"cluster_writes: locks taken in turns by A and B, then by A alone ({a.cw_rounds} rounds)")
            res["locks"]["latency"] = lock_turns(na, nb, rel, a.cw_rounds, a.cw_seconds)
            log(f"cluster_writes: a lock around each of {a.cw_files} writes on A")
            res["locks"]["write"] = locked_writes(na, rel, a.cw_files, a.cw_seconds)
        third = max(a.cw_seconds / 3, 2)
        with C.nodes(ctx, shared, "cw-locks3", [A, B, ALONE], access=ACCESS) as ns:
            log(f"cluster_writes: a flock counter on three nodes, then three processes on one ({third:g} s each)")
            res["locks"]["counter_three_nodes"] = counter_rate([n.path(f"{rel}/counter") for n in ns], third)
            res["locks"]["counter_one_node"] = counter_rate([ns[0].path(f"{rel}/counter1")] * 3, third)
        with C.nodes(ctx, shared, "cw-locks-alone", [ALONE], cluster=False, access=ACCESS) as (n,):
            log("cluster_writes: a flock counter of three processes on a node alone (the kernel's locks)")
            res["locks"]["counter_alone"] = counter_rate([n.path(f"{ROOT}/locks-alone/counter")] * 3, third)
        res["commands"] = shared.get("commands", {})
    res["targets"] = targets(res)
    return res


TARGET_LOCK_P50_MS = 2.0


def targets(r):
    out = []
    p50 = H.get(r, "locks", "latency", "turns", "lock", "p50_ms")
    out.append({"what": "a lock following another node's unlock, between namespaces: median ms", "value": p50,
                "target": f"≤ {TARGET_LOCK_P50_MS:g} ms", "met": None if p50 is None else p50 <= TARGET_LOCK_P50_MS})
    for c2o in ("on", "off"):
        for case in ("rewrite", "new"):
            p99 = H.get(r, "visible", c2o, case, "p99_ms")
            out.append({"what": f"close on A → new content on B, close-to-open {c2o}, {case}: p99 ms",
                        "value": p99, "target": f"≤ {TARGET_VISIBLE_P99_MS:g} ms",
                        "met": None if p99 is None else p99 <= TARGET_VISIBLE_P99_MS})
    return out


OPS = [("create", "total", "new file: open (create) + write + close"),
       ("create", "open", "new file: the open (create)"),
       ("create", "io", "new file: the write (the token, in a cluster)"),
       ("create", "close", "new file: the close"),
       ("rewrite", "total", "rewrite of a file written here: open (O_TRUNC) + write + close"),
       ("rewrite", "open", "rewrite: the open (O_TRUNC)"),
       ("rewrite", "close", "rewrite: the close"),
       ("rewrite_home", "total", "first rewrite of a cached file from home: open + write + close"),
       ("rewrite_home", "open", "first rewrite: the open (O_TRUNC; the token, in a cluster)"),
       ("read_cached", "total", "cached file from home: open + read + close"),
       ("read_cached", "open", "cached file from home: the open"),
       ("read_written", "total", "file written here: open + read + close"),
       ("read_written", "open", "file written here: the open"),
       ("read_written", "close", "file written here: the close")]


def plot(r, ctx):
    path = ctx.plot("cluster_writes") if ctx else None
    if not path:
        return None
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4))
    i, right = 0, 0.0
    for c2o in ("on", "off"):
        for case in ("rewrite", "new"):
            lat = sorted(H.get(r, "visible", c2o, case, "latencies_us") or [])
            if not lat:
                continue
            ys = [(k + 1) / len(lat) for k in range(len(lat))]
            ax.plot([x / 1e3 for x in lat], ys, label=f"close-to-open {c2o}, {case}", color=f"C{i}")
            right = max(right, H.get(r, "visible", c2o, case, "p99_ms") or 0)
            i += 1
    ax.axvline(TARGET_VISIBLE_P99_MS, linestyle=":", color="grey", label="target p99")
    ax.set_xlim(0, max(right, TARGET_VISIBLE_P99_MS) * 1.3)  # the slowest 1 % of each case runs off the right
    ax.set_xlabel("close on A → new content read on B (ms)")
    ax.set_ylabel("fraction of rounds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return H.save_plot(fig, path, "close to visible")


def fmt_first(d):
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items(), key=lambda kv: -kv[1])) or "—"


def report(r, ctx):
    md = H.md_table
    lines = ["Two nodes A and B in network namespaces of their own (etcd and mutual TLS on a private bridge), "
             "and a node alone in a third; every mount writable, `" + " ".join(r["access"]) + "`, home the "
             "suite's home directory without an emulated link. One Python process in the root namespace "
             f"uses the mounts, call after call. Files of {r['size'] // 1024} KiB. Figures are this machine's; "
             "ratios are of figures of this run.", ""]
    rows = []
    for c2o in ("on", "off"):
        for case in ("rewrite", "new"):
            x = H.get(r, "visible", c2o, case) or {}
            rows.append([c2o, f"{case} ({r['rewrite_set']} files)" if case == "rewrite" else case,
                         x.get("rounds"), x.get("p50_ms"), x.get("p90_ms"), x.get("p99_ms"), x.get("max_ms"),
                         fmt_first(x.get("first_read")), x.get("never_visible"), x.get("rounds_read_again"),
                         H.get(x, "b_open_ms", "p50_ms"), H.get(x, "b_read_ms", "p50_ms"),
                         H.get(x, "write_ms", "p50_ms")])
    lines += ["**Close on A → new content on B**: the time from A's close returning to B's open+read "
              "returning the new content (B reads again every 0.2 ms until it does, at most "
              f"{POLL_LIMIT:g} s). \"first read\" is what B's first open+read got: new content, old content, "
              "empty (A's truncation at its open, published before its data), no such file (missing), "
              "or an error.", "",
              md(["close-to-open", "files", "rounds", "median ms", "p90 ms", "p99 ms", "max ms", "first read",
                  "never visible", "rounds B read again", "B's open, median ms", "B's read, median ms",
                  "A's open+write+close, median ms"], rows), ""]
    for c2o in ("on", "off"):
        for case in ("rewrite", "new"):
            for x in H.get(r, "visible", c2o, case, "not_new_first") or []:
                if x.get("visible_ms") is not None:
                    lines.append(f"- close-to-open {c2o}, {case}, round {x['round']} ({x['name']}): B's first read "
                                 f"got {x['first_read']}; the new content after {x['reads']} reads, "
                                 f"{H.fmt(x['visible_ms'])} ms.")
                else:
                    rec = H.get(x, "etcd", "record", "attr") or {}
                    lines.append(f"- close-to-open {c2o}, {case}, round {x['round']} ({x['name']}): B's first read "
                                 f"got {x['first_read']}, and B never read the new content in {POLL_LIMIT:g} s "
                                 f"({x['reads']} reads). Then etcd's record of the file said size "
                                 f"{rec.get('size')} (mod revision {H.get(x, 'etcd', 'mod_revision')}, etcd at "
                                 f"{H.get(x, 'etcd', 'etcd_revision')}); B read {H.get(x, 'B_reads', 'bytes')} "
                                 f"bytes (stat size {H.get(x, 'B_reads', 'stat_size')}); A read the new content: "
                                 f"{H.get(x, 'A_reads', 'new_content')}.")
    if lines[-1] != "":
        lines.append("")
    rows = [[t["what"], t["value"], t["target"], "—" if t["met"] is None else ("yes" if t["met"] else "**no**")]
            for t in r.get("targets", [])]
    lines += [md(["target", "value", "target", "met"], rows), ""]
    pic = plot(r, ctx)
    if pic:
        lines += [pic, ""]
    ops = r.get("ops", {})
    rows = []
    for op, part, label in OPS:
        al = H.get(ops, "alone", op, part) or {}
        on = H.get(ops, "cluster_on", op, part) or {}
        off = H.get(ops, "cluster_off", op, part) or {}
        rows.append([label, al.get("p50_ms"), on.get("p50_ms"), H.ratio(on.get("p50_ms"), al.get("p50_ms")),
                     al.get("p99_ms"), on.get("p99_ms"), H.ratio(on.get("p99_ms"), al.get("p99_ms")),
                     off.get("p50_ms"), off.get("p99_ms")])
    n = H.get(ops, "cluster_on", "create", "total", "n")
    lines += [f"**A close and an open in a cluster against a node alone**: on node A, {n} new files written, "
              "rewritten and read back; files at home read once, then read again (cached) and rewritten. The "
              "same on a node alone with the same options, and on a cluster with `--close-to-open off`. Each "
              "call timed apart (ms).", "",
              md(["operation", "alone median", "cluster median", "÷ alone", "alone p99", "cluster p99", "÷ alone",
                  "close-to-open off: median", "p99"], rows), ""]
    hr = r.get("held_records") or {}
    rows = []
    for c2o in ("on", "off"):
        for x, when in zip(H.get(r, "probe", c2o) or [], ("before A's files", "after A's files")):
            rows.append([c2o, when, x.get("held_records"), H.get(x, "open", "p50_ms"), H.get(x, "open", "p99_ms"),
                         H.get(x, "total", "p50_ms")])
    lines += [f"In the cluster, A's passes ran with {H.fmt(H.get(hr, 'cluster_on', 'before_ops'))} held records "
              f"in etcd at their start and {H.fmt(H.get(hr, 'cluster_on', 'after_ops'))} at their end (every "
              "change stays held: nothing reaches home within the sync lag). An open with close-to-open reads "
              "whether it has the records written before it: one read of one key. Node B, opening "
              f"{PROBE_FILES} files it has cached, before and after A's passes:", "",
              md(["close-to-open", "when", "held records", "B's open, median ms", "p99 ms",
                  "open+read+close, median ms"], rows), ""]
    h, ha = r.get("handoff") or {}, r.get("handoff_away") or {}
    rows = []
    for what, x in (("home there: the giver pushes", h), ("home away: the giver hands its changes over", ha)):
        if not x:
            continue
        for call, key in (("append taking the token (open+write+close)", "take"), ("of which the open", "take_open"),
                          ("append holding the token", "hold")):
            rows.append([what, call, H.get(x, key, "n"), H.get(x, key, "p50_ms"), H.get(x, key, "p90_ms"),
                         H.get(x, key, "p99_ms"), H.get(x, key, "max_ms")])
    ratio = None
    if H.get(ha, "take", "p50_ms") and H.get(h, "take", "p50_ms"):
        ratio = round(H.get(ha, "take", "p50_ms") / H.get(h, "take", "p50_ms"), 2)
    lines += [f"**Token handoff**: A and B append a line to one file in turns ({h.get('turns')} turns each), "
              "two appends a turn: the first takes the token from the other node, the second holds it. With "
              "home there the giver pushes its changes to home first; with home away (`--fault-file`) it "
              "hands them over peer to peer, and the taker copies the file. The very first append (nobody to "
              f"take the token from, {H.fmt(h.get('first_append_ms'))} ms) is left out. A take with home away "
              f"÷ with home there, medians: {H.fmt(ratio)}.", "",
              md(["case", "append", "count", "median ms", "p90 ms", "p99 ms", "max ms"], rows), ""]
    for what, x in (("home there", h), ("home away", ha)):
        if not x:
            continue
        ok = ", ".join(f"{k}: {'yes' if v is True else ('**no**' if v is False else v)}"
                       for k, v in (x.get("content_ok") or {}).items())
        lines.append(f"The file as expected, {what}: {ok}." + (f" {len(x['errors'])} appends failed." if x.get("errors") else ""))
        for where, lost in (x.get("content_lost") or {}).items():
            lines.append(f"- {where}: {lost['bytes']} bytes of {lost['expected']}; missing appends: "
                         f"{', '.join(lost['missing']) or 'none'}; unexpected lines: {len(lost['unexpected'])}; "
                         f"the rest in order: {'yes' if lost['rest_in_order'] else 'no'}.")
    lk = r.get("locks") or {}
    rows = []
    for case, what in (("turns", "in turns: each lock follows the other node's unlock"),
                       ("one_node", "again on one node")):
        for call in ("lock", "unlock"):
            x = H.get(lk, "latency", case, call) or {}
            rows.append([what, call, x.get("n"), x.get("p50_ms"), x.get("p99_ms"), x.get("max_ms")])
    lines += ["", "**Locks across nodes** (design note 017): an exclusive `flock` of one file taken and dropped "
              "by A and B in turns, then by A alone; each call timed.", "",
              md(["case", "call", "count", "median ms", "p99 ms", "max ms"], rows), ""]
    rows = []
    alone = H.get(lk, "counter_alone", "per_second")
    for key, what in (("counter_three_nodes", "one process on each of three nodes"),
                      ("counter_one_node", "three processes on one cluster node"),
                      ("counter_alone", "three processes on a node alone (the kernel's locks)")):
        x = lk.get(key) or {}
        ratio = None if not alone or x.get("per_second") is None else round(x["per_second"] / alone, 3)
        rows.append([what, x.get("increments"), x.get("final"), x.get("lost"), x.get("per_second"), ratio])
    lines += ["A counter file incremented under `flock -x` (open, lock, read, write, unlock, close) by three "
              "processes at once:", "",
              md(["processes", "increments", "counter at the end", "lost", "increments/s", "÷ alone"], rows), ""]
    w = lk.get("write") or {}
    lines += [f"What a lock adds to an uncontended write on A ({H.get(w, 'bare', 'n')} files of "
              f"{r['size'] // 1024} KiB each way): open+write+close median {H.get(w, 'bare', 'p50_ms')} ms bare, "
              f"{H.get(w, 'locked', 'p50_ms')} ms inside an exclusive flock (+{H.fmt(w.get('added_p50_ms'))} ms; "
              f"p99 {H.get(w, 'bare', 'p99_ms')} and {H.get(w, 'locked', 'p99_ms')} ms)."]
    return "\n".join(lines)
