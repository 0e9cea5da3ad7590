#!/usr/bin/env python3
"""The workload driver of scripts/soak.sh: a seeded random workload on one larder mount, SIGKILLs of the
daemon and home outages between its calls, and a model of what was acknowledged to compare with.

    soak.py run --bin LARDER --home HOME --work DIR --kills N --seed S [--s3-endpoint URL] [...]
    soak.py sqlwriter DB LEDGER WRITER GEN SECONDS MAX      (started by `run`: one SQLite writer process)

`run` mounts HOME (a directory or s3://bucket/prefix) at DIR/mnt with the cache DIR/cache and repeats,
N times: a burst of random calls (sometimes while home is away, sometimes with two SQLite writers at
work), `kill -9` of the daemon, `larder mount` again on the same cache dir, and a check that the mount
shows exactly the model; every --drain-every kills and at the end it drains and checks home. The model
holds only what was acknowledged: a call counts once it returned success (file data once close or fsync
returned, which larder's default durability keeps through `kill -9`). A SQLite commit counts once COMMIT
returned in its writer, which then appends it to a ledger outside the mount.

With --cache-fs-mib and --home-fs-mib the cache dir (and a directory home) live on tmpfs file systems of
their own, and --full-disks fills them at times: a **full cache disk** (a file beside the cache dir takes
all but a few MiB: writes that need room may fail with ENOSPC, and the files they touched are then
uncertain, taken out of the model and removed through the mount once room is back; nothing else may
fail) and a **full home** (its disk full for a burst, a kill and a remount: nothing may fail on the mount,
and the drain after it must land everything). --home-renames renames, at home, a directory holding
changes queued in the cache: those changes must be set aside as conflicts whose copies hold their bytes,
and the mount must end as home has it.

Any difference prints what differs and the last calls before it, keeps the work dir, and exits 1; a
summary (JSON) goes to --results. Every loop is bounded by a count and by time.
"""

import argparse
import errno
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections import Counter, deque

MIB = 1 << 20
SQL_DIR = "sql"  # the SQLite databases live here, outside the model (SQLite checks them itself)
DBS = ("a.db", "b.db")


class Failure(Exception):
    """A difference between larder and the model, or a larder command that failed: the soak fails."""


# --- the model ------------------------------------------------------------------------------------------


class File:
    kind = "file"

    def __init__(self, data, mode, mtime=None):
        self.data = bytearray(data)
        self.mode = mode
        self.mtime = mtime  # ns; known only after an explicit utime, until the data changes again
        self.old_modes = set()  # modes it had before a chmod: see --tolerate-stale-mode


class Dir:
    kind = "dir"

    def __init__(self, mode):
        self.mode = mode
        self.old_modes = set()


class Link:
    kind = "symlink"

    def __init__(self, target):
        self.target = target


def describe(n):
    if n is None:
        return "nothing"
    if n.kind == "file":
        h = hashlib.sha256(bytes(n.data)).hexdigest()[:16]
        mt = "" if n.mtime is None else f" mtime {n.mtime}"
        return f"file of {len(n.data)} bytes (sha256 {h}) mode {n.mode:o}{mt}"
    if n.kind == "dir":
        return f"dir mode {n.mode:o}"
    return f"symlink -> {n.target}"


def parent_of(rel):
    return rel.rsplit("/", 1)[0] if "/" in rel else ""


def join(parent, name):
    return f"{parent}/{name}" if parent else name


def lost_bytes(want, got):
    """Bytes of `want` (acknowledged data) that `got` does not hold at the same offset."""
    if got is None:
        return len(want)
    if want == got:
        return 0
    lost = max(0, len(want) - len(got))
    n = min(len(want), len(got))
    step = 4096
    for off in range(0, n, step):
        a, b = want[off : min(n, off + step)], got[off : min(n, off + step)]
        if a != b:
            lost += sum(1 for x, y in zip(a, b) if x != y)
    return lost


def snapshot(root, with_mtime=True):
    """Every object under `root` except the SQLite directory, as model nodes (file data read whole)."""
    out = {}
    stack = [""]
    while stack:
        d = stack.pop()
        for name in os.listdir(os.path.join(root, d) if d else root):
            rel = join(d, name)
            if rel == SQL_DIR:
                continue
            p = os.path.join(root, rel)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = Dir(stat.S_IMODE(st.st_mode))
                stack.append(rel)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = Link(os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    data = f.read()
                if len(data) != st.st_size:
                    raise Failure(f"{rel}: stat says {st.st_size} bytes, read returned {len(data)}")
                out[rel] = File(data, stat.S_IMODE(st.st_mode), st.st_mtime_ns if with_mtime else None)
            else:
                out[rel] = Link(f"<unexpected file type {stat.S_IFMT(st.st_mode):o}>")
    return out


def diff(model, got, where, stale_modes=None):
    """Differences between the model and a snapshot, one line each, and the acknowledged bytes missing.
    With `stale_modes` (a list), a file or directory showing a mode it had before a chmod, everything else
    right, goes there instead of being a difference (known faults: see docs/reliability.md)."""
    lines, lost = [], 0
    for rel in sorted(set(model) | set(got)):
        m, g = model.get(rel), got.get(rel)
        if m is None:
            lines.append(f"{where}: {rel} is {describe(g)}, the model has nothing")
            continue
        if g is None or g.kind != m.kind:
            lines.append(f"{where}: {rel} is {describe(g)}, the model has {describe(m)}")
            if m.kind == "file":
                lost += len(m.data)
            continue
        if m.kind == "file":
            if m.data != g.data:
                l = lost_bytes(m.data, g.data)
                lost += l
                first = next((i for i, (x, y) in enumerate(zip(m.data, g.data)) if x != y), min(len(m.data), len(g.data)))
                lines.append(
                    f"{where}: {rel} holds {describe(g)}, the model {describe(m)}; first difference at byte {first}; "
                    f"{l} acknowledged bytes missing"
                )
            elif m.mode != g.mode:
                if stale_modes is not None and g.mode in m.old_modes:
                    stale_modes.append(f"{where}: {rel} shows mode {g.mode:o} (it had before a chmod), the model {m.mode:o}")
                else:
                    lines.append(f"{where}: {rel} has mode {g.mode:o}, the model {m.mode:o}")
            elif m.mtime is not None and m.mtime != g.mtime:
                lines.append(f"{where}: {rel} has mtime {g.mtime}, the model {m.mtime} (set by utime)")
        elif m.kind == "dir":
            if m.mode != g.mode:
                if stale_modes is not None and g.mode in m.old_modes:
                    stale_modes.append(f"{where}: directory {rel} shows mode {g.mode:o} (it had before a chmod), the model {m.mode:o}")
                else:
                    lines.append(f"{where}: directory {rel} has mode {g.mode:o}, the model {m.mode:o}")
        elif m.target != g.target:
            lines.append(f"{where}: symlink {rel} -> {g.target}, the model -> {m.target}")
    return lines, lost


# --- SQLite ---------------------------------------------------------------------------------------------


def payload(writer, gen, seq):
    """The row a writer commits: derived from its key, so a damaged row is told from a right one."""
    seed = hashlib.sha256(f"{writer}/{gen}/{seq}".encode()).digest()
    n = 40 + (seq * 37 + gen * 11) % 400
    return (seed * (n // len(seed) + 1))[:n]


def sqlwriter(db, ledger, writer, gen, seconds, most):
    """Commit rows one transaction at a time until time or count runs out or a call fails (the daemon was
    killed): each commit that returned goes to the ledger, outside the mount."""
    os.umask(0o022)
    deadline = time.monotonic() + seconds
    try:
        con = sqlite3.connect(db, timeout=20, isolation_level=None)
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            print(f"sqlwriter {writer}: journal_mode is {mode}, not wal", file=sys.stderr)
            return 4
        # FULL: every commit fsyncs the WAL, so a commit that returned is acknowledged by larder.
        con.execute("PRAGMA synchronous=FULL")
        with open(ledger, "a") as led:
            for seq in range(most):
                if time.monotonic() > deadline:
                    break
                con.execute("BEGIN IMMEDIATE")
                con.execute("INSERT INTO t(writer, gen, seq, payload) VALUES (?, ?, ?, ?)", (writer, gen, seq, payload(writer, gen, seq)))
                con.execute("COMMIT")
                led.write(f"{writer} {gen} {seq} {time.time():.6f}\n")
                led.flush()
                # Paced, so that the commits of a run spread over the second in which the kill comes.
                time.sleep(random.uniform(0, 0.008))
        con.close()
    except (sqlite3.Error, OSError) as e:
        print(f"sqlwriter {writer} gen {gen}: stopped by {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    return 0


def read_ledgers(paths):
    """(writer, gen, seq) -> time of every commit a writer saw return."""
    acked = {}
    for p in paths:
        if not os.path.exists(p):
            continue
        with open(p) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue  # a writer killed mid-line: that commit was never recorded
                w, g, s, t = line.split()
                acked[(int(w), int(g), int(s))] = float(t)
    return acked


def check_db(path, acked, where):
    """integrity_check, every acknowledged row present and whole, no damaged row; the number of rows."""
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        res = [r[0] for r in con.execute("PRAGMA integrity_check").fetchall()]
        if res != ["ok"]:
            raise Failure(f"{where}: PRAGMA integrity_check: {res[:10]}")
        rows = con.execute("SELECT writer, gen, seq, payload FROM t").fetchall()
    except sqlite3.Error as e:
        raise Failure(f"{where}: {type(e).__name__}: {e}")
    finally:
        con.close()
    have = {}
    for w, g, s, p in rows:
        if bytes(p) != payload(w, g, s):
            raise Failure(f"{where}: row ({w}, {g}, {s}) has a damaged payload")
        have[(w, g, s)] = True
    missing = [k for k in acked if k not in have]
    if missing or len(rows) < len(acked):
        raise Failure(
            f"{where}: {len(rows)} rows, {len(acked)} acknowledged commits; {len(missing)} acknowledged rows "
            f"missing, e.g. {sorted(missing)[:10]}"
        )
    return len(rows)


# --- the run --------------------------------------------------------------------------------------------


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.s3 = a.home.startswith("s3://")
        self.work = os.path.abspath(a.work)
        self.mnt = os.path.join(self.work, "mnt")
        # With --cache-fs-mib, the cache dir is on a tmpfs of its own, with room beside it for a filler.
        self.cachefs = os.path.join(self.work, "cachefs") if a.cache_fs_mib else None
        self.cache = os.path.join(self.cachefs or self.work, "cache")
        # With --home-fs-mib, a directory home is a directory on a tmpfs of its own (its filler beside it).
        self.homefs = os.path.join(self.work, "homefs") if (a.home_fs_mib and not self.s3) else None
        self.home = os.path.join(self.homefs, "home") if self.homefs else a.home
        self.fault = os.path.join(self.work, "home-is-away")
        # Fillers: while one exists its disk is full (see the module doc).
        self.cache_filler = os.path.join(self.cachefs, "filler") if self.cachefs else None
        self.home_filler = None
        self.uncertain = set()
        self.touching = None
        self.expected_conflicts = 0
        self.log = open(os.path.join(self.work, "soak.log"), "a", buffering=1)
        self.model = {}
        self.pid = None
        self.opts = []
        self.small_cache = False
        self.history = deque(maxlen=300)
        self.gen = 0
        self.writers = []
        self.stats = Counter()
        self.ops = Counter()
        self.pending_at_kill = []
        self.started = time.monotonic()
        # Sizes: moto keeps objects in memory and answers slowly, so an S3 home gets smaller files.
        if self.s3:
            self.max_files, self.max_bytes, self.big = 40, 16 * MIB, (MIB + 1, MIB + MIB // 2)
            self.commits_per_writer = 40
        else:
            self.max_files, self.max_bytes, self.big = 80, 40 * MIB, (MIB + 1, 3 * MIB)
            self.commits_per_writer = 150
        for d in ("mnt",):
            os.makedirs(os.path.join(self.work, d), exist_ok=True)

    # --- disks of their own, and filling them ---

    def mount_tmpfs(self, path, mib):
        os.makedirs(path, exist_ok=True)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "tmpfs", path], capture_output=True, text=True)
        if p.returncode != 0:
            raise Failure(f"mount -t tmpfs {path}: {p.stderr}")

    def unmount_tmpfs(self, path):
        subprocess.run(["umount", "-l", path], capture_output=True)

    def fill(self, filler, leave):
        """Take all the room of `filler`'s file system but `leave` bytes with the file `filler`."""
        st = os.statvfs(os.path.dirname(filler))
        free = st.f_bavail * st.f_frsize
        size = max(0, free - leave)
        chunk = b"\xff" * MIB
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while size > 0:
                try:
                    size -= os.write(fd, chunk[: min(size, MIB)])
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        finally:
            os.close(fd)
        return free

    def cache_disk_full(self):
        return self.cache_filler is not None and os.path.exists(self.cache_filler)

    def home_full(self):
        return self.home_filler is not None and os.path.exists(self.home_filler)

    def end_home_full(self):
        if self.home_full():
            os.unlink(self.home_filler)
            self.note("-- home has room again")

    def end_cache_disk_full(self):
        """Room on the cache disk again; the files writes left uncertain are removed through the mount."""
        if self.cache_disk_full():
            os.unlink(self.cache_filler)
            self.note("-- the cache disk has room again")
        self.clean_uncertain()

    def clean_uncertain(self):
        """Remove through the mount the files writes refused for want of room left in an unknown state."""
        for rel in sorted(self.uncertain):
            try:
                os.unlink(self.path(rel))
                self.note(f"remove uncertain {rel}")
            except FileNotFoundError:
                pass
            except OSError as e:
                raise Failure(f"removing {rel}, which a write cut short by a full cache disk left uncertain: {e}")
        self.uncertain.clear()

    # --- larder commands ---

    def larder(self, *args, timeout=120, check=True):
        cmd = [self.a.bin, *args]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"`{' '.join(cmd)}` did not finish within {timeout} s")
        if check and p.returncode != 0:
            raise Failure(f"`{' '.join(cmd)}` exited {p.returncode}:\n{p.stdout}{p.stderr}")
        return p

    def status(self, mnt=None):
        return json.loads(self.larder("status", mnt or self.mnt, "--json", timeout=30).stdout)

    def note(self, what):
        self.history.append(what)
        self.log.write(what + "\n")

    def choose_opts(self, small_cache_ok=True):
        r = self.rng
        opts = ["--sync-lag", r.choice(["200ms", "200ms", "0s", "1s", "5s"])]
        if r.random() < 0.5:
            opts += ["--validity-lag", "1s"]
        if r.random() < 0.1:
            opts += ["--durability", "power"]
        self.small_cache = r.random() < 0.15 and small_cache_ok and not self.a.no_small_cache
        if self.small_cache:
            opts += ["--cache-size", "16MiB"]
        return opts

    def mount(self, opts, first=False):
        args = ["mount", self.home, self.mnt, "--cache-dir", self.cache, "--write-mode", "write-back",
                "--fault-file", self.fault, *opts]
        if self.s3:
            args += ["--s3-endpoint", self.a.s3_endpoint]
        t0 = time.monotonic()
        p = self.larder(*args, timeout=120, check=False)
        if p.returncode != 0:
            raise Failure(
                f"larder mount (over the {'fresh dir' if first else 'dead mount'}) failed, exit {p.returncode}:\n"
                f"{p.stdout}{p.stderr}"
            )
        self.stats["mount_seconds_total_ms"] += int((time.monotonic() - t0) * 1000)
        m = re.search(r"\(pid (\d+)\)", p.stdout)
        self.pid = int(m.group(1)) if m else int(self.status()["pid"])
        self.opts = opts
        self.note(f"-- mounted (pid {self.pid}) with {' '.join(opts)}")

    def kill(self):
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except FileNotFoundError:
                break
            time.sleep(0.01)
        else:
            raise Failure(f"daemon {pid} survived SIGKILL for 10 s")
        self.pid = None
        return time.time()

    def unmount(self, mnt, pid=None):
        p = self.larder("unmount", mnt, "--leave-pending", "--timeout", "60s", check=False, timeout=90)
        if p.returncode != 0:
            subprocess.run(["umount", "-l", mnt], capture_output=True)
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # --- the workload: each call updates the model only once it returned ---

    def path(self, rel):
        return os.path.join(self.mnt, rel)

    def files(self):
        return [k for k, v in self.model.items() if v.kind == "file"]

    def any_file(self):
        """A file of the model drawn at random, or None if there is none."""
        files = self.files()
        return self.rng.choice(files) if files else None

    def dirs(self):
        return [""] + [k for k, v in self.model.items() if v.kind == "dir"]

    def total_bytes(self):
        return sum(len(v.data) for v in self.model.values() if v.kind == "file")

    def new_name(self, prefix):
        r = self.rng
        for _ in range(20):
            rel = join(r.choice(self.dirs()), f"{prefix}{r.randrange(60)}")
            if rel not in self.model and rel not in self.uncertain and rel.count("/") < 4:
                return rel
        return None

    def size(self):
        r = self.rng.random()
        if r < 0.1:
            return 0
        if r < 0.6:
            return self.rng.randint(1, 8192)
        if r < 0.85:
            return self.rng.randint(8193, 300_000)
        if r < 0.96:
            return self.rng.randint(300_001, MIB)
        return self.rng.randint(*self.big)

    def write_all(self, fd, data, offset):
        # Writes of random sizes, as programs do; the data counts only once close (or fsync) returned.
        i = 0
        while i < len(data):
            n = self.rng.choice([4096, 65536, 131072, 1 << 20])
            w = os.pwrite(fd, data[i : i + n], offset + i)
            if w <= 0:
                raise OSError(errno.EIO, "short write")
            i += w

    def write_closed(self, path, flags, write, mode=0o666):
        """Open `path` with `flags` (and `mode`, for a create), `write(fd)`, and close it as `finish` does
        (the close is the acknowledgement); the descriptor is closed on any error too."""
        fd = os.open(path, flags, mode)
        try:
            write(fd)
        except BaseException:
            os.close(fd)
            raise
        self.finish(fd)

    def finish(self, fd):
        if self.rng.random() < 0.3:
            os.fsync(fd)
        os.close(fd)

    def op_create(self):
        rel = self.new_name("f")
        if rel is None:
            return None
        self.touching = rel
        mode = self.rng.choice([0o644, 0o600, 0o640, 0o755])
        data = self.rng.randbytes(self.size())
        self.write_closed(self.path(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, lambda fd: self.write_all(fd, data, 0), mode)
        self.model[rel] = File(data, mode)
        return f"create {rel} {len(data)} bytes mode {mode:o}"

    def op_rewrite(self):
        rel = self.any_file()
        if rel is None:
            return None
        self.touching = rel
        data = self.rng.randbytes(self.size())
        self.write_closed(self.path(rel), os.O_WRONLY | os.O_TRUNC, lambda fd: self.write_all(fd, data, 0))
        f = self.model[rel]
        f.data, f.mtime = bytearray(data), None
        return f"rewrite {rel} with {len(data)} bytes (O_TRUNC)"

    def op_overwrite(self):
        rel = self.any_file()
        if rel is None:
            return None
        self.touching = rel
        f = self.model[rel]
        off = self.rng.randint(0, len(f.data) + 70_000)
        data = self.rng.randbytes(self.rng.choice([1, self.rng.randint(1, 5000), self.rng.randint(1, 200_000)]))
        self.write_closed(self.path(rel), os.O_WRONLY, lambda fd: self.write_all(fd, data, off))
        if len(f.data) < off:
            f.data.extend(bytes(off - len(f.data)))
        f.data[off : off + len(data)] = data
        f.mtime = None
        return f"overwrite {rel} [{off}, +{len(data)})"

    def op_append(self):
        rel = self.any_file()
        if rel is None:
            return None
        self.touching = rel
        data = self.rng.randbytes(self.rng.randint(1, 100_000))
        def write(fd):
            i = 0
            while i < len(data):
                i += os.write(fd, data[i : i + 32768])

        self.write_closed(self.path(rel), os.O_WRONLY | os.O_APPEND, write)
        f = self.model[rel]
        f.data.extend(data)
        f.mtime = None
        return f"append {len(data)} bytes to {rel}"

    def op_truncate(self):
        rel = self.any_file()
        if rel is None:
            return None
        self.touching = rel
        f = self.model[rel]
        n = len(f.data)
        new = self.rng.randint(0, n) if (n and self.rng.random() < 0.6) else n + self.rng.randint(1, 300_000)
        if self.rng.random() < 0.5:
            os.truncate(self.path(rel), new)
            how = "truncate"
        else:
            fd = os.open(self.path(rel), os.O_WRONLY)
            try:
                os.ftruncate(fd, new)
            except BaseException:
                os.close(fd)
                raise
            self.finish(fd)
            how = "ftruncate"
        if new < n:
            del f.data[new:]
        else:
            f.data.extend(bytes(new - n))
        f.mtime = None
        return f"{how} {rel} {n} -> {new}"

    def op_sparse(self):
        # 10 MiB of hole with a few bytes far in.
        rel = self.new_name("s")
        if rel is None:
            return None
        self.touching = rel
        size = 10 * MIB
        fd = os.open(self.path(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        writes = []
        try:
            os.ftruncate(fd, size)
            for _ in range(self.rng.randint(1, 4)):
                off = self.rng.randint(5 * MIB, size - 200)
                data = self.rng.randbytes(self.rng.randint(1, 100))
                os.pwrite(fd, data, off)
                writes.append((off, data))
        except BaseException:
            os.close(fd)
            raise
        self.finish(fd)
        f = File(bytes(size), 0o644)
        for off, data in writes:
            f.data[off : off + len(data)] = data
        self.model[rel] = f
        return f"sparse {rel} 10 MiB, writes at {[o for o, _ in writes]}"

    def op_rename_file(self):
        srcs = [k for k, v in self.model.items() if v.kind in ("file", "symlink")]
        if not srcs:
            return None
        src = self.rng.choice(srcs)
        over = [k for k in srcs if k != src and self.model[k].kind == "file"]
        if over and self.rng.random() < 0.4:
            dst = self.rng.choice(over)
        else:
            dst = self.new_name("f")
            if dst is None:
                return None
        os.rename(self.path(src), self.path(dst))
        self.model[dst] = self.model.pop(src)
        return f"rename {src} -> {dst}"

    def op_rename_dir(self):
        dirs = [k for k, v in self.model.items() if v.kind == "dir"]
        if not dirs:
            return None
        src = self.rng.choice(dirs)
        for _ in range(10):
            dst = self.new_name("d")
            if dst and dst != src and not dst.startswith(src + "/"):
                break
        else:
            return None
        os.rename(self.path(src), self.path(dst))
        moved = {k: v for k, v in self.model.items() if k == src or k.startswith(src + "/")}
        for k in moved:
            del self.model[k]
        for k, v in moved.items():
            self.model[dst + k[len(src) :]] = v
        return f"rename dir {src} -> {dst} ({len(moved) - 1} entries below)"

    def _remove(self, candidates, remove, what):
        """Remove one of `candidates` (model paths) with `remove` (os.unlink, os.rmdir)."""
        if not candidates:
            return None
        rel = self.rng.choice(candidates)
        remove(self.path(rel))
        del self.model[rel]
        return f"{what} {rel}"

    def op_unlink(self):
        return self._remove([k for k, v in self.model.items() if v.kind in ("file", "symlink")], os.unlink, "unlink")

    def op_mkdir(self):
        rel = self.new_name("d")
        if rel is None:
            return None
        mode = self.rng.choice([0o755, 0o700, 0o750, 0o775])
        os.mkdir(self.path(rel), mode)
        self.model[rel] = Dir(mode)
        return f"mkdir {rel} {mode:o}"

    def op_rmdir(self):
        empty = [k for k, v in self.model.items() if v.kind == "dir" and not any(p.startswith(k + "/") for p in self.model)]
        return self._remove(empty, os.rmdir, "rmdir")

    def op_symlink(self):
        rel = self.new_name("l")
        if rel is None:
            return None
        existing = list(self.model)
        target = self.rng.choice(
            [self.rng.choice(existing) if existing else "x", f"../nowhere/{self.rng.randrange(1000)}", "/etc/hostname", "t" * self.rng.randint(1, 200)]
        )
        os.symlink(target, self.path(rel))
        self.model[rel] = Link(target)
        return f"symlink {rel} -> {target}"

    def op_chmod(self):
        c = [k for k, v in self.model.items() if v.kind in ("file", "dir")]
        if not c:
            return None
        rel = self.rng.choice(c)
        n = self.model[rel]
        mode = self.rng.choice([0o755, 0o700, 0o750, 0o711] if n.kind == "dir" else [0o644, 0o600, 0o640, 0o755, 0o444, 0o664])
        os.chmod(self.path(rel), mode)
        if mode != n.mode:
            n.old_modes.add(n.mode)
        n.mode = mode
        return f"chmod {rel} {mode:o}"

    def op_utime(self):
        rel = self.any_file()
        if rel is None:
            return None
        # Times with nanoseconds, from 2001 to 2033.
        mtime = self.rng.randint(10**18, 2 * 10**18)
        atime = self.rng.randint(10**18, 2 * 10**18)
        os.utime(self.path(rel), ns=(atime, mtime))
        self.model[rel].mtime = mtime
        return f"utime {rel} mtime {mtime}"

    def op_read(self):
        rel = self.any_file()
        if rel is None:
            return None
        with open(self.path(rel), "rb") as f:
            got = f.read()
        want = self.model[rel].data
        if got != want:
            raise Failure(
                f"reading {rel} through the mount: {len(got)} bytes, the model {len(want)}; "
                f"{lost_bytes(want, got)} acknowledged bytes missing"
            )
        self.stats["files_read_during_workload"] += 1
        return f"read {rel} ({len(got)} bytes, as the model)"

    def op_list(self):
        d = self.rng.choice(self.dirs())
        got = sorted(n for n in os.listdir(self.path(d) if d else self.mnt)
                     if join(d, n) != SQL_DIR and join(d, n) not in self.uncertain)
        want = sorted(k.rsplit("/", 1)[-1] for k in self.model if parent_of(k) == d)
        if got != want:
            raise Failure(f"listing '{d}' through the mount: {got}, the model {want}")
        return f"list '{d}' ({len(got)} entries, as the model)"

    WEIGHTS = {
        "create": 30, "rewrite": 5, "overwrite": 15, "append": 8, "truncate": 8, "sparse": 1,
        "rename_file": 8, "rename_dir": 2, "unlink": 7, "mkdir": 5, "rmdir": 3, "symlink": 4,
        "chmod": 5, "utime": 5, "read": 5, "list": 3,
    }

    def step(self):
        w = dict(self.WEIGHTS)
        nfiles = len(self.files())
        if self.s3:
            w["sparse"] = 0.3
        if self.a.no_dir_renames:
            w["rename_dir"] = 0
        if nfiles > self.max_files or self.total_bytes() > self.max_bytes:
            # Keep the tree bounded: remove and shrink instead of growing.
            for k in ("create", "sparse", "append", "symlink", "mkdir"):
                w[k] = 0
            w["unlink"] = 40
            w["rewrite"] = 0
        if sum(1 for v in self.model.values() if v.kind == "file" and len(v.data) >= 10 * MIB) >= (1 if self.s3 else 3):
            w["sparse"] = 0
        if self.uncertain or self.cache_disk_full():
            # Files left uncertain are not in the model: no directory moves or removals around them.
            w["rename_dir"] = w["rmdir"] = 0
        return self.do(self.rng.choices(list(w), weights=list(w.values()))[0])

    DATA_OPS = ("create", "rewrite", "overwrite", "append", "truncate", "sparse")

    def do(self, kind):
        self.touching = None
        try:
            what = getattr(self, "op_" + kind)()
        except OSError as e:
            if e.errno == errno.ENOSPC and (self.cache_disk_full() or self.home_full()) and kind in self.DATA_OPS \
                    and self.touching:
                # A write that needed room the cache does not have (its disk full, or its room for changes
                # not yet at home full while home's disk is): refused, as promised, and the file it touched
                # is in an unknown state (part written): out of the model until it is removed.
                self.uncertain.add(self.touching)
                self.model.pop(self.touching, None)
                self.stats["writes_refused_for_a_full_disk"] += 1
                self.note(f"{kind} {self.touching}: ENOSPC (a disk is full); uncertain")
                return None
            raise Failure(f"a call failed ({kind}): {e} (home {'away' if os.path.exists(self.fault) else 'there'}"
                          f"{', cache disk full' if self.cache_disk_full() else ''}{', home full' if self.home_full() else ''})")
        if what is not None:
            self.ops[kind] += 1
            self.note(what)
        return what

    def run_ops(self, count, seconds):
        deadline = time.monotonic() + seconds
        done = 0
        for _ in range(count * 3):
            if done >= count or time.monotonic() > deadline:
                break
            if self.step() is not None:
                done += 1
        return done

    # --- SQLite writers ---

    def ledger(self, db, writer):
        return os.path.join(self.work, f"ledger-{db}-{writer}.txt")

    def ledger_lines(self, db):
        n = []
        for w in (1, 2):
            try:
                with open(self.ledger(db, w), "rb") as f:
                    n.append(f.read().count(b"\n"))
            except FileNotFoundError:
                n.append(0)
        return n

    def start_writers(self, db, seconds):
        for w in (1, 2):
            self.gen += 1
            log = os.fdopen(os.open(os.path.join(self.work, "sqlwriters.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), "a")
            p = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "sqlwriter", self.path(f"{SQL_DIR}/{db}"),
                 self.ledger(db, w), str(w), str(self.gen), str(seconds), str(self.commits_per_writer)],
                stdout=log, stderr=log, cwd="/",
            )
            self.writers.append(p)
        self.note(f"-- two SQLite writers on {db} (gens {self.gen - 1}, {self.gen})")

    def wait_writers(self, seconds):
        deadline = time.monotonic() + seconds
        for p in self.writers:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
                self.stats["sqlite_writers_killed_after_timeout"] += 1
        self.writers = []

    def init_dbs(self):
        os.mkdir(self.path(SQL_DIR), 0o755)
        for db in DBS:
            con = sqlite3.connect(self.path(f"{SQL_DIR}/{db}"), isolation_level=None)
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=FULL")
            con.execute("CREATE TABLE t(writer INTEGER, gen INTEGER, seq INTEGER, payload BLOB)")
            con.close()

    def check_dbs(self, root, where, kill_time=None):
        total = 0
        for db in DBS:
            acked = read_ledgers([self.ledger(db, 1), self.ledger(db, 2)])
            if kill_time is not None:
                # Commits whose writer saw them return after the daemon was dead (the kernel can serve a
                # file whole in the cache without the daemon): acknowledged all the same.
                self.stats["sqlite_commits_acknowledged_after_the_kill"] += sum(
                    1 for t in acked.values() if t > kill_time + 0.05)
            check_db(os.path.join(root, SQL_DIR, db), acked, f"{where}: {db}")
            total += len(acked)
        return total

    # --- checks ---

    def diff_mount(self, got, where):
        stale = [] if self.a.tolerate_stale_mode else None
        lines, lost = diff(self.model, got, where, stale)
        for line in stale or []:
            self.note("-- tolerated: " + line)
            self.stats["stale_modes_tolerated"] += 1
        return lines, lost

    def wait_online(self, seconds=20):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.status()["home"]["state"] == "online":
                return
            time.sleep(0.1)
        raise Failure(f"home did not come back online within {seconds} s of the fault file's removal")

    def check_mount_by_name(self, where):
        """Every object of the model through its path (lstat, read, readlink), without listing."""
        got = {}
        try:
            for rel in self.model:
                p = self.path(rel)
                st = os.lstat(p)
                if stat.S_ISDIR(st.st_mode):
                    got[rel] = Dir(stat.S_IMODE(st.st_mode))
                elif stat.S_ISLNK(st.st_mode):
                    got[rel] = Link(os.readlink(p))
                else:
                    with open(p, "rb") as f:
                        got[rel] = File(f.read(), stat.S_IMODE(st.st_mode), st.st_mtime_ns)
        except OSError as e:
            raise Failure(f"{where}: {e}")
        lines, lost = self.diff_mount(got, where)
        self.stats["bytes_lost_mount"] += lost
        if lines:
            raise Failure("\n".join(lines[:40]) + f"\n({len(lines)} differences)")
        self.stats["objects_compared"] += len(self.model)

    def check_mount(self, where):
        try:
            got = snapshot(self.mnt)
        except OSError as e:
            raise Failure(f"{where}: walking the mount: {e}")
        lines, lost = self.diff_mount(got, where)
        self.stats["bytes_lost_mount"] += lost
        if lines:
            raise Failure("\n".join(lines[:40]) + f"\n({len(lines)} differences)")
        self.stats["mount_checks"] += 1
        self.stats["objects_compared"] += len(self.model)

    def check_home(self, where):
        if os.path.exists(self.fault):
            os.unlink(self.fault)
        self.end_home_full()
        t0 = time.monotonic()
        p = self.larder("drain", self.mnt, "--timeout", "300s", check=False, timeout=360)
        if p.returncode != 0:
            st = self.larder("status", self.mnt, "--json", check=False).stdout
            raise Failure(f"larder drain exited {p.returncode}:\n{p.stdout}{p.stderr}\nstatus: {st}")
        self.stats["drain_seconds_total_ms"] += int((time.monotonic() - t0) * 1000)
        j = self.status()["journal"]
        if j.get("pending_ops") or j.get("failed_ops") or j.get("conflicts", 0) != self.expected_conflicts:
            raise Failure(f"{where}: after a drain the journal is {j} ({self.expected_conflicts} conflicts expected)")
        if self.s3:
            root = os.path.join(self.work, "fresh-mnt")
            fresh_cache = os.path.join(self.work, "fresh-cache")
            os.makedirs(root, exist_ok=True)
            subprocess.run(["rm", "-rf", fresh_cache])
            p = self.larder("mount", self.home, root, "--cache-dir", fresh_cache, "--read-only",
                            "--s3-endpoint", self.a.s3_endpoint, check=False)
            if p.returncode != 0:
                raise Failure(f"mounting home fresh (read-only) failed:\n{p.stdout}{p.stderr}")
            m = re.search(r"\(pid (\d+)\)", p.stdout)
            fresh_pid = int(m.group(1)) if m else self.status(root).get("pid")
        try:
            try:
                got = snapshot(self.home if not self.s3 else root)
            except OSError as e:
                raise Failure(f"{where}: walking home: {e}")
            lines, lost = diff(self.model, got, where)
            self.stats["bytes_lost_home"] += lost
            if lines:
                raise Failure("\n".join(lines[:40]) + f"\n({len(lines)} differences)")
            if self.s3:
                self.check_objects(where)
            # The databases as home has them, checked on a copy (SQLite may write beside a database).
            copy = os.path.join(self.work, "home-db-copy")
            subprocess.run(["rm", "-rf", copy])
            os.makedirs(os.path.join(copy, SQL_DIR), mode=0o755)
            src = self.home if not self.s3 else root
            for db in DBS:
                for suffix in ("", "-wal"):
                    s = os.path.join(src, SQL_DIR, db + suffix)
                    if os.path.exists(s):
                        fd = os.open(os.path.join(copy, SQL_DIR, db + suffix), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                        with open(s, "rb") as fi, os.fdopen(fd, "wb") as fo:
                            fo.write(fi.read())
            self.stats["sqlite_commits_checked_at_home"] = self.check_dbs(copy, f"{where} (home's copy)")
        finally:
            if self.s3:
                self.unmount(root, fresh_pid)
                subprocess.run(["rm", "-rf", fresh_cache])
        self.stats["drains_compared"] += 1
        self.stats["home_objects_compared"] += len(self.model)
        self.note(f"-- {where}: home matches the model ({len(self.model)} objects, {self.total_bytes()} bytes)")

    def check_objects(self, where):
        """The bucket itself, without larder: each file's object holds its bytes, no stray objects."""
        import boto3
        from botocore.config import Config

        bucket, _, prefix = self.a.home[len("s3://") :].partition("/")
        prefix = prefix.strip("/") + "/"
        s3 = boto3.client("s3", endpoint_url=self.a.s3_endpoint, config=Config(s3={"addressing_style": "path"}))
        keys = set()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys.update(o["Key"][len(prefix) :] for o in page.get("Contents", []))
        for rel, n in self.model.items():
            if n.kind == "dir":
                continue
            if rel not in keys:
                raise Failure(f"{where}: no object for {rel} ({describe(n)}) in the bucket")
            body = s3.get_object(Bucket=bucket, Key=prefix + rel)["Body"].read()
            want = bytes(n.data) if n.kind == "file" else n.target.encode()
            if body != want:
                self.stats["bytes_lost_home"] += lost_bytes(want, body) if n.kind == "file" else 0
                raise Failure(f"{where}: object {rel} holds {len(body)} bytes, not those of {describe(n)}")
        allowed = set(self.model) | {k + "/" for k, v in self.model.items() if v.kind == "dir"} | {"", SQL_DIR + "/"}
        stray = [k for k in keys if k not in allowed and not k.startswith(SQL_DIR + "/")]
        if stray:
            raise Failure(f"{where}: objects the model does not have: {sorted(stray)[:20]}")

    # --- a directory renamed at home under queued changes ---

    def rename_at_home(self, src, dst):
        """Rename directory `src` to `dst` at home, behind larder's back (as another client would)."""
        if not self.s3:
            os.rename(os.path.join(self.home, src), os.path.join(self.home, dst))
            return
        import boto3
        from botocore.config import Config

        bucket, _, prefix = self.a.home[len("s3://") :].partition("/")
        prefix = prefix.strip("/") + "/"
        s3 = boto3.client("s3", endpoint_url=self.a.s3_endpoint, config=Config(s3={"addressing_style": "path"}))
        keys = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + src + "/"):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        for k in keys:
            s3.copy_object(Bucket=bucket, Key=prefix + dst + k[len(prefix + src):], CopySource={"Bucket": bucket, "Key": k})
        for k in keys:
            s3.delete_object(Bucket=bucket, Key=k)

    def home_rename(self):
        """A directory renamed at home while changes made below it here wait (home away for larder, so
        that they do): once home is back, those changes cannot land where they were made and are set aside
        as conflicts whose copies hold their bytes; the mount ends as home has it."""
        r = self.rng
        cands = [k for k, v in self.model.items() if v.kind == "dir" and k.count("/") < 3
                 and not any(m.startswith(k + "/") and m in self.uncertain for m in self.uncertain)]
        if not cands:
            return
        d = r.choice(cands)
        parent = parent_of(d)
        for _ in range(20):
            dst = join(parent, f"r{r.randrange(1000)}")
            if dst not in self.model and not any(k.startswith(dst + "/") for k in self.model):
                break
        else:
            return
        self.check_home(f"before {d} is renamed at home")
        self.larder("prefetch", "-r", self.path(d), timeout=300)
        with open(self.fault, "w"):
            pass
        self.note(f"-- home goes away (for larder) while changes are made in {d}")
        changed, modes = {}, {}
        for _ in range(r.randint(1, 4)):
            below = [k for k, v in self.model.items() if v.kind == "file" and k.startswith(d + "/") and k not in changed]
            if below and r.random() < 0.5:
                rel = r.choice(below)
                modes[rel] = self.model[rel].mode
                data = bytearray(self.model[rel].data)
                off = r.randint(0, len(data))
                new = r.randbytes(r.randint(1, 5000))
                if len(data) < off:
                    data.extend(bytes(off - len(data)))
                data[off : off + len(new)] = new
                self.write_closed(self.path(rel), os.O_WRONLY, lambda fd: self.write_all(fd, new, off))
            else:
                rel = join(d, f"n{r.randrange(10**6)}")
                if rel in self.model or rel in changed:
                    continue
                data = r.randbytes(r.randint(0, 200_000))
                self.write_closed(self.path(rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                  lambda fd: self.write_all(fd, data, 0), 0o644)
            changed[rel] = bytes(data)
            self.note(f"change {rel} ({len(data)} bytes) below {d}, home away")
        self.rename_at_home(d, dst)
        self.note(f"-- {d} renamed to {dst} at home")
        # (Counted while home is away for larder: nothing is settled yet.)
        before = self.status()["journal"].get("conflicts", 0)
        os.unlink(self.fault)
        self.wait_online()
        # Each drain tries the refused changes once more; past the refusals allowed they are set aside.
        for _ in range(20):
            if self.larder("drain", self.mnt, "--timeout", "10s", check=False, timeout=60).returncode == 0:
                break
        else:
            raise Failure(f"the changes made in {d} (renamed at home) were never set aside: {self.status()['journal']}")
        listed = json.loads(self.larder("conflicts", self.mnt, "--json").stdout)["conflicts"][before:]
        # Each change landed, or was kept as a conflict with exactly the bytes written: a copy in the cache
        # dir's conflicts area (a directory home: the directory it was made in is gone), or, under the
        # keep-both policy, beside home's version at home; an object store has no directories, so a create
        # there lands at its own key (the directory comes back holding it). What landed at home joins the
        # model (with its directories, as an object store shows them).
        landed = {}
        for rel, want in changed.items():
            mode = modes.get(rel, 0o644)
            found = [c for c in listed if c["path"] == rel]
            if not found:
                if not self.s3:
                    raise Failure(f"{rel}, changed in {d} while home renamed it, is not a conflict: {listed}")
                landed[rel] = File(want, mode)
                continue
            kept = found[-1]["kept_at"]
            if not os.path.isabs(kept):
                landed[kept] = File(want, mode)
                continue
            try:
                with open(kept, "rb") as f:
                    got = f.read()
            except OSError as e:
                raise Failure(f"the copy of {rel} kept as a conflict: {e}")
            if got != want:
                self.stats["bytes_lost_mount"] += lost_bytes(want, got)
                raise Failure(f"the copy of {rel} kept as a conflict holds {len(got)} bytes, not the {len(want)} written")
        after = self.status()["journal"].get("conflicts", 0)
        kept = sum(1 for rel in changed if any(c["path"] == rel for c in listed))
        if after - before != kept:
            raise Failure(f"{kept} changes kept as conflicts made {after - before} conflicts: {listed}")
        self.expected_conflicts = after
        moved = {k: v for k, v in self.model.items() if k == d or k.startswith(d + "/")}
        for k in moved:
            del self.model[k]
        for k, v in moved.items():
            self.model[dst + k[len(d):]] = v
        for rel, f in landed.items():
            self.model[rel] = f
            up = parent_of(rel)
            while up and up not in self.model:
                self.model[up] = Dir(0o755)
                up = parent_of(up)
        self.stats["changes_landed_at_home_after_a_home_rename"] += len(landed)
        self.stats["home_renames_under_queued_changes"] += 1
        self.stats["changes_kept_as_conflicts"] += len(changed)
        self.note(f"-- {len(changed)} changes in {d} kept as conflicts; the model follows home ({d} -> {dst})")

    # --- the loop ---

    def run(self):
        a = self.a
        os.umask(0)
        if os.path.exists(self.fault):
            os.unlink(self.fault)
        if self.cachefs:
            self.mount_tmpfs(self.cachefs, a.cache_fs_mib)
        if self.homefs:
            self.mount_tmpfs(self.homefs, a.home_fs_mib)
            os.makedirs(self.home, exist_ok=True)
            # The filler goes beside the home, on its file system but outside what larder sees.
            self.home_filler = os.path.join(self.homefs, "filler")
        self.mount(self.choose_opts(), first=True)
        self.init_dbs()
        self.note("-- databases made")
        kills = outages = 0
        deadline = self.started + a.minutes * 60
        stopped_by_time = False
        try:
            while kills < a.kills:
                if time.monotonic() > deadline:
                    stopped_by_time = True
                    break
                r = self.rng
                quiet = not (os.path.exists(self.fault) or self.home_full() or self.cache_disk_full())
                if a.full_disks and quiet:
                    if self.cachefs and r.random() < 0.06:
                        free = self.fill(self.cache_filler, 3 * MIB)
                        self.stats["cache_disk_fills"] += 1
                        self.note(f"-- the cache disk fills up ({free // MIB} MiB taken but 3)")
                    if self.homefs and r.random() < 0.06:
                        free = self.fill(self.home_filler, 0)
                        self.stats["home_disk_fills"] += 1
                        self.note(f"-- home's disk fills up ({free // MIB} MiB taken)")
                was_away = os.path.exists(self.fault)
                full = self.home_full() or self.cache_disk_full()
                away = not self.small_cache and not full and (r.random() < 0.15 or (was_away and r.random() < 0.5))
                if away and not was_away:
                    # Everything in the cache first: while home is away only what is cached can be read.
                    self.larder("prefetch", "-r", self.mnt, timeout=300)
                    with open(self.fault, "w"):
                        pass
                    outages += 1
                    self.note("-- home goes away")
                elif was_away and not away:
                    os.unlink(self.fault)
                    self.note("-- home is back")
                style = r.choices(["between", "sqlite", "burst"], weights=[45, 0 if self.cache_disk_full() else 20, 35])[0]
                self.stats[f"kills_{style}"] += 1
                kill_time = None
                if style == "sqlite":
                    db = r.choice(DBS)
                    before = self.ledger_lines(db)
                    self.start_writers(db, 30)
                    # Other calls beside the writers, and the kill while they commit: once each has
                    # committed (at most 10 s), a little later.
                    self.run_ops(r.randint(1, 20), r.uniform(0.05, 0.8))
                    wait_until = time.monotonic() + 10
                    while time.monotonic() < wait_until and any(p.poll() is None for p in self.writers):
                        now = self.ledger_lines(db)
                        if now[0] > before[0] and now[1] > before[1]:
                            break
                        time.sleep(0.01)
                    time.sleep(r.uniform(0, 0.3))
                    if all(p.poll() is None for p in self.writers):
                        self.stats["kills_with_both_sqlite_writers_running"] += 1
                elif style == "burst":
                    self.run_ops(r.randint(5, 40), 4)
                    # A burst of writes, then the kill while their pushes are under way.
                    for _ in range(r.randint(3, 10)):
                        self.do(r.choice(["create", "overwrite", "append", "rewrite"]))
                else:
                    self.run_ops(r.randint(1, 40), 4)
                if away and r.random() < 0.6:
                    # Home comes back before the kill: the queued changes start moving.
                    os.unlink(self.fault)
                    self.note("-- home is back")
                    time.sleep(r.uniform(0, 1.2))
                elif style == "burst":
                    time.sleep(r.uniform(0, 0.5))
                if self.cache_disk_full() and r.random() < 0.5:
                    # Room again before the kill (else after the remount, which then starts on a full disk).
                    self.end_cache_disk_full()
                if a.home_renames and kills % 25 == 12 and not self.writers \
                        and not (os.path.exists(self.fault) or self.home_full() or self.cache_disk_full()):
                    # Right before the kill: the remount then lists afresh, and the mount shows home's
                    # tree without waiting for the validity lag.
                    self.home_rename()
                try:
                    pending = self.status()["journal"].get("pending_ops", 0)
                except (Failure, ValueError, KeyError):
                    pending = 0
                self.pending_at_kill.append(pending)
                kill_time = self.kill()
                kills += 1
                self.note(f"-- kill -9 #{kills} ({style}, home {'away' if os.path.exists(self.fault) else 'there'}, "
                          f"{pending} changes pending)")
                if self.writers:
                    self.wait_writers(30)
                away = os.path.exists(self.fault)
                # `larder mount` starts offline only with changes queued (nothing can drain while home is
                # away); with none it refuses, as for any unreachable home.
                if away and (pending == 0 or r.random() < 0.4):
                    os.unlink(self.fault)
                    self.note("-- home is back")
                    away = False
                opts = self.choose_opts(small_cache_ok=not away)
                self.mount(opts)
                if away:
                    # Started offline: listings are not kept across a restart, so only what the cache knows
                    # by name can be checked until home is back.
                    self.check_mount_by_name(f"after kill #{kills}, mounted while home is away")
                    self.stats["remounts_while_home_away"] += 1
                    os.unlink(self.fault)
                    self.note("-- home is back")
                    self.wait_online()
                if self.cache_disk_full():
                    self.stats["remounts_on_a_full_cache_disk"] += 1
                    self.end_cache_disk_full()
                self.clean_uncertain()
                self.check_mount(f"after kill #{kills}")
                if self.home_full() and r.random() < 0.5:
                    self.end_home_full()
                self.stats["sqlite_commits_checked_at_mount"] = self.check_dbs(self.mnt, f"after kill #{kills}", kill_time)
                if kills % a.drain_every == 0:
                    self.check_home(f"drain after kill #{kills}")
                if kills % 10 == 0:
                    el = time.monotonic() - self.started
                    print(f"soak ({'s3' if self.s3 else 'posix'}): {kills} kills, {outages} outages, "
                          f"{sum(self.ops.values())} ops, {el:.0f} s", file=sys.stderr, flush=True)
            if os.path.exists(self.fault):
                os.unlink(self.fault)
            self.end_cache_disk_full()
            self.end_home_full()
            self.check_mount("at the end")
            self.check_home("final drain")
        except Failure as e:
            self.report_failure(e, kills, outages)
            raise
        finally:
            if self.writers:
                self.wait_writers(30)
        self.unmount(self.mnt, self.pid)
        for fs in (self.cachefs, self.homefs):
            if fs:
                self.unmount_tmpfs(fs)
        return self.results(kills, outages, stopped_by_time, ok=True)

    def results(self, kills, outages, stopped_by_time, ok, error=None):
        acked = sum(len(read_ledgers([self.ledger(d, 1), self.ledger(d, 2)])) for d in DBS)
        pend = self.pending_at_kill
        return {
            "home": "s3" if self.s3 else "posix",
            "ok": ok,
            "error": error,
            "seed": self.a.seed,
            "tolerate_stale_mode": self.a.tolerate_stale_mode,
            "no_dir_renames": self.a.no_dir_renames,
            "no_small_cache": self.a.no_small_cache,
            "full_disks": self.a.full_disks,
            "home_renames": self.a.home_renames,
            "kills": kills,
            "kills_asked": self.a.kills,
            "stopped_by_time_budget": stopped_by_time,
            "outages": outages,
            "ops_acknowledged": sum(self.ops.values()),
            "ops_by_kind": dict(self.ops),
            "sqlite_commits_acknowledged": acked,
            "kills_with_pending_changes": sum(1 for p in pend if p > 0),
            "pending_ops_at_kill_max": max(pend) if pend else 0,
            "seconds": round(time.monotonic() - self.started),
            **dict(self.stats),
            "model_objects_at_end": len(self.model),
            "model_bytes_at_end": self.total_bytes(),
        }

    def report_failure(self, e, kills, outages):
        print(f"\nSOAK FAILURE after {kills} kills (seed {self.a.seed}, home {self.a.home}):\n{e}", file=sys.stderr)
        print("last calls and events:\n  " + "\n  ".join(self.history), file=sys.stderr)
        logp = os.path.join(self.cache, "larder.log")
        if os.path.exists(logp):
            with open(logp, errors="replace") as f:
                tail = f.readlines()[-60:]
            print(f"--- {logp} (end) ---\n" + "".join(tail), file=sys.stderr)
        print(f"evidence kept in {self.work}", file=sys.stderr)
        with open(os.path.join(self.work, "failure.txt"), "w") as f:
            f.write(f"seed {self.a.seed}, home {self.a.home}, after {kills} kills\n{e}\n\n")
            f.write("\n".join(self.history) + "\n")
        # The model at the failure, for comparing by hand.
        with open(os.path.join(self.work, "model.txt"), "w") as f:
            for k in sorted(self.model):
                f.write(f"{k}\t{describe(self.model[k])}\n")
        if self.a.results:
            with open(self.a.results, "w") as f:
                json.dump(self.results(kills, outages, False, ok=False, error=str(e)[:2000]), f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bin", required=True)
    r.add_argument("--home", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--kills", type=int, default=1000)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--drain-every", type=int, default=50)
    r.add_argument("--minutes", type=float, default=600, help="time budget: stop at the next kill past it")
    r.add_argument("--s3-endpoint")
    r.add_argument("--results")
    r.add_argument("--no-small-cache", action="store_true", help="never mount with --cache-size 16MiB")
    r.add_argument("--no-dir-renames", action="store_true",
                   help="leave directory renames out of the workload (see docs/reliability.md)")
    r.add_argument("--cache-fs-mib", type=int, default=0, help="keep the cache dir on a tmpfs of this size")
    r.add_argument("--home-fs-mib", type=int, default=0, help="keep a directory home on a tmpfs of this size")
    r.add_argument("--full-disks", action="store_true", help="fill the cache's and home's tmpfs at times")
    r.add_argument("--home-renames", action="store_true",
                   help="rename directories at home while changes made in them are queued")
    r.add_argument("--tolerate-stale-mode", action="store_true",
                   help="on the mount (not at home), count instead of failing an object showing a mode it had before a chmod")
    w = sub.add_parser("sqlwriter")
    w.add_argument("db")
    w.add_argument("ledger")
    w.add_argument("writer", type=int)
    w.add_argument("gen", type=int)
    w.add_argument("seconds", type=float)
    w.add_argument("most", type=int)
    a = ap.parse_args()
    if a.cmd == "sqlwriter":
        sys.exit(sqlwriter(a.db, a.ledger, a.writer, a.gen, a.seconds, a.most))
    s = Soak(a)
    try:
        res = s.run()
    except Failure:
        sys.exit(1)
    if a.results:
        with open(a.results, "w") as f:
            json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
