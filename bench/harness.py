"""What the benchmarks share: running and cleaning up mounts and processes, measuring, gauging how busy
the machine was, and describing it.

Every mount made through here is listed in `_mounts` and every process in `_procs`; `cleanup()` unmounts and
stops them in reverse order, and each script calls it from a `finally` clause (SIGTERM is turned into
KeyboardInterrupt by `on_signals()`), so an interrupted run leaves nothing behind.
"""
import argparse
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The larder binary the run uses; a script may point it at a copy (a rebuild meanwhile cannot mix two
# builds in one table).
LARDER = os.environ.get("LARDER_BIN", os.path.join(ROOT, "target", "release", "larder"))
PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "bench"
MiB = 1 << 20

# How the rclone peer mounts (the benchmarks add --read-only where they only read): the full VFS cache,
# 16 MiB reads, and attributes and listings trusted for an hour, as larder's validity lag in the benchmarks.
RCLONE_FLAGS = [
    "--vfs-cache-mode", "full",
    "--vfs-read-chunk-size", "16M",
    "--buffer-size", "16M",
    "--dir-cache-time", "1h",
    "--attr-timeout", "1h",
    "--vfs-cache-max-age", "24h",
    "--vfs-cache-max-size", "16G",
    "--max-read-ahead", "1M",
    "--poll-interval", "0",
]

_mounts = []  # (kind, mountpoint), unmounted in reverse order on exit
_procs = []  # Popen objects, stopped in reverse order on exit (after the mounts)
_notes = []  # problems worth reporting
_disturbed = []  # figures whose best run shared the CPUs with much other work
DISTURBED = 0.25  # share of the CPUs busy outside the measured processes that marks a run as disturbed
WAIT_QUIET = [0.0]  # seconds best_of may wait for quiet before measuring a disturbed run again


def on_signals():
    """SIGTERM and SIGHUP end the run the way Ctrl-C does: through the caller's `finally` and cleanup()."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def log(msg):
    print(f"[{PROG} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def note(msg):
    log("note: " + msg)
    _notes.append(msg)


def parse_size(s):
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?b?)\s*", s.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s}")
    return int(float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)])


def run(cmd, timeout=120, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout, **kw)


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        if "drop_caches" not in " ".join(_notes):
            note(f"cannot drop the page cache ({e}); 'dropped' figures are not cold")
        return False


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def wait_mounted(path, seconds, proc=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if is_mounted(path):
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def unmount(kind, mnt):
    """Unmount `mnt` the way its kind wants, falling back to a lazy unmount; never raises on a timeout."""
    if not is_mounted(mnt):
        return
    def attempt(cmd, timeout):
        try:
            return run(cmd, timeout=timeout, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            log(f"{' '.join(cmd)}: no answer in {timeout} s")
            return False
    if kind == "larder":
        if not attempt([LARDER, "unmount", mnt], 120):
            attempt([LARDER, "unmount", mnt, "--leave-pending"], 60)
    else:
        attempt(["fusermount3", "-u", mnt], 60)
    if is_mounted(mnt):
        attempt(["fusermount3", "-uz", mnt], 60)
    if is_mounted(mnt):
        attempt(["umount", "-l", mnt], 60)


def forget_mount(mnt):
    for i, (_, m) in enumerate(_mounts):
        if m == mnt:
            del _mounts[i]
            return


def stop_proc(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    if p in _procs:
        _procs.remove(p)


def unmount_all():
    """Unmount every mount made through here, newest first."""
    for kind, mnt in reversed(list(_mounts)):
        try:
            unmount(kind, mnt)
        except Exception as e:  # noqa: BLE001 - keep cleaning up
            log(f"unmount {mnt}: {e}")
    _mounts.clear()


def cleanup():
    """Unmount everything, then stop every process, newest first."""
    unmount_all()
    for p in reversed(list(_procs)):
        try:
            stop_proc(p)
        except Exception as e:  # noqa: BLE001
            log(f"stop pid {p.pid}: {e}")


def spawn(cmd, logpath, preexec_fn=None):
    """A child in its own session (Ctrl-C reaches only this script, which then stops it in order)."""
    out = open(logpath, "ab")
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                         start_new_session=True, preexec_fn=preexec_fn)
    out.close()
    _procs.append(p)
    return p


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_busy(seconds=2.0):
    """Fraction of the machine's CPU time that was busy over the next `seconds`."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return round(1 - (i1 - i0) / max(t1 - t0, 1), 3)


def wait_quiet(max_seconds):
    """Wait, at most max_seconds, until other work leaves the CPUs at least 85% idle; the busy fraction."""
    deadline = time.monotonic() + max_seconds
    busy = cpu_busy()
    while busy > 0.15 and time.monotonic() < deadline:
        log(f"CPUs {busy:.0%} busy with other work; waiting (at most {deadline - time.monotonic():.0f} s more)")
        time.sleep(5)
        busy = cpu_busy()
    return busy


def machine_busy_seconds():
    """CPU time spent running tasks (kernel threads included), not interrupts, which are charged to no task."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2]) / os.sysconf("SC_CLK_TCK")  # user, nice, system


def with_cpu(pids, fn, *args):
    """fn(*args), with the CPU seconds each named process spent meanwhile under "cpu_s", and under
    "other_busy" the share of the machine's CPUs busy with anything else (this script, its children and the
    named processes excluded; kernel threads working for them included): a gauge of interference."""
    before = {k: cpu_seconds(p) for k, p in pids.items() if p}
    t0, busy0, own0 = time.monotonic(), machine_busy_seconds(), os.times()
    r = fn(*args)
    elapsed, busy, own = time.monotonic() - t0, machine_busy_seconds() - busy0, os.times()
    own_s = sum(getattr(own, f) - getattr(own0, f) for f in ("user", "system", "children_user", "children_system"))
    cpu = {}
    for k, b in before.items():
        a = cpu_seconds(pids[k])
        if a is not None and b is not None:
            cpu[k] = round(a - b, 2)
    if cpu:
        r["cpu_s"] = cpu
    other = max(0.0, busy - own_s - sum(cpu.values())) / max(elapsed * os.cpu_count(), 1e-9)
    r["other_busy"] = round(min(other, 1.0), 3)
    return r


def disturbed(r):
    return (r.get("other_busy") or 0) > DISTURBED and (r.get("seconds") or 0) >= 0.5  # jiffies are coarse


def best_of(label, n, key, measure, prepare=None):
    """The best of n runs of measure() (prepare() before each), with every run's figure under "runs". A run
    that shared the CPUs with much other work is done again (after waiting for quiet), up to n times."""
    runs, redone = [], []
    while len(runs) < max(1, n):
        if prepare:
            prepare()
        r = measure()
        if disturbed(r) and len(redone) < n and WAIT_QUIET[0] > 0:
            redone.append(r.get(key))
            log(f"{label}: {r['other_busy']:.0%} of the CPUs busy with other work; measuring again")
            wait_quiet(WAIT_QUIET[0])
            continue
        runs.append(r)
    best = dict(max(runs, key=lambda r: r.get(key) or 0))
    best["runs"] = [r.get(key) for r in runs]
    best["other_busy_runs"] = [r.get("other_busy") for r in runs]
    if redone:
        best["disturbed_runs_redone"] = redone
    if disturbed(best):
        _disturbed.append(f"{label} ({best['other_busy']:.0%})")
    return best


def seq_read(path, max_seconds):
    """One fresh open, 1 MiB preads into one buffer to the end (or max_seconds)."""
    buf = bytearray(MiB)
    mv = [memoryview(buf)]
    start = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    try:
        off = 0
        while True:
            n = os.preadv(fd, mv, off)
            if n <= 0:
                break
            off += n
            if time.monotonic() - start > max_seconds:
                note(f"sequential read of {path} stopped at {off} bytes after {max_seconds} s")
                break
    finally:
        os.close(fd)
    elapsed = time.monotonic() - start
    return {"bytes": off, "seconds": round(elapsed, 3), "MiB_s": round(off / MiB / elapsed, 1)}


def rand_read(path, offsets, max_seconds):
    """4 KiB preads at the given offsets, one fresh open, stopped early after max_seconds."""
    buf = bytearray(4096)
    mv = [memoryview(buf)]
    start = time.monotonic()
    fd = os.open(path, os.O_RDONLY)
    n = short = 0
    try:
        for off in offsets:
            if os.preadv(fd, mv, off) != 4096:
                short += 1
            n += 1
            if n & 255 == 0 and time.monotonic() - start > max_seconds:
                break
    finally:
        os.close(fd)
    elapsed = time.monotonic() - start
    r = {"ops": n, "seconds": round(elapsed, 3), "ops_s": round(n / elapsed, 1)}
    if short:
        r["short_reads"] = short
    return r


def stat_passes(statbench, root, listfile, passes, timeout):
    """Stat every listed path under root, `passes` times; one dict per pass."""
    if statbench:
        r = run([statbench, root, listfile, str(passes)], timeout=timeout)
        out = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        for o in out:
            o["tool"] = "statbench"
        return out
    with open(listfile) as f:
        paths = [os.path.join(root, line.rstrip("\n")) for line in f if line.strip()]
    out = []
    deadline = time.monotonic() + timeout
    for p in range(1, passes + 1):
        errors, start = 0, time.monotonic()
        for path in paths:
            try:
                os.stat(path)
            except OSError:
                errors += 1
        elapsed = time.monotonic() - start
        out.append({"pass": p, "files": len(paths), "errors": errors, "seconds": round(elapsed, 6),
                    "per_s": round(len(paths) / elapsed, 1), "tool": "python os.stat"})
        if time.monotonic() > deadline:
            break
    return out


def same_bytes(a, b, size, samples=8):
    """Compare sampled 1 MiB blocks of two files (after the measurements, so their cost is not timed)."""
    rng = random.Random(7)
    blocks = max(1, size // MiB)
    picks = {0, blocks - 1} | {rng.randrange(blocks) for _ in range(samples)}
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for blk in sorted(picks):
            fa.seek(blk * MiB)
            fb.seek(blk * MiB)
            if fa.read(MiB) != fb.read(MiB):
                return False
    return True


def larder_help():
    try:
        return run([LARDER, "mount", "--help"]).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise RuntimeError(f"cannot run {LARDER}: {e}")


def larder_mount(home, mnt, cache, flags):
    os.makedirs(mnt, exist_ok=True)
    cmd = [LARDER, "mount", home, mnt, "--cache-dir", cache] + flags
    _mounts.append(("larder", mnt))
    r = run(cmd, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"larder mount failed: {r.stderr.strip() or r.stdout.strip()}")
    if not wait_mounted(mnt, 30):
        raise RuntimeError(f"larder did not mount {mnt}")
    return cmd


def larder_status(mnt):
    r = run([LARDER, "status", mnt, "--json"], timeout=60, check=False)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": (r.stderr or r.stdout).strip()}


def rclone_mount(cfg, mnt, cache, logpath, flags):
    os.makedirs(mnt, exist_ok=True)
    cmd = ["rclone", "mount", "--config", cfg, "home:", mnt, "--cache-dir", cache] + flags
    p = spawn(cmd, logpath)
    _mounts.append(("rclone", mnt))
    if not wait_mounted(mnt, 60, p):
        raise RuntimeError(f"rclone mount did not come up (see {logpath})")
    return p, cmd


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, seconds, proc=None):
    import socket
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            if proc is not None and proc.poll() is not None:
                return False
            time.sleep(0.1)
    return False


def bench_setup(record, suite=False, peers=True):
    """Run scripts/bench-setup.sh (with --suite: also what only the suite needs, the peers unless not
    `peers`); its KEY=VALUE lines."""
    cmd = ["bash", os.path.join(ROOT, "scripts", "bench-setup.sh")] + (["--suite"] if suite else []) + \
        ([] if peers or not suite else ["--skip-peers"])
    r = subprocess.run(cmd, capture_output=True,
                       text=True, timeout=1800)
    if r.stderr.strip():
        log(r.stderr.strip())
    vals = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    record["bench_setup_exit"] = r.returncode
    if r.returncode != 0:
        sys.exit(f"scripts/bench-setup.sh failed ({r.returncode}): {r.stderr.strip()}")
    return vals


def environment():
    env = {"kernel": platform.release(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo") as f:
            env["mem_GiB"] = round(int(f.readline().split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    for key, cmd in (("larder", [LARDER, "--version"]), ("rclone", ["rclone", "version"]),
                     ("git", ["git", "-C", ROOT, "describe", "--always", "--dirty"])):
        try:
            env[key] = run(cmd, timeout=30).stdout.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError, IndexError):
            env[key] = None
    try:
        env["larder_binary"] = os.path.abspath(LARDER)
        env["larder_binary_mtime"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(os.stat(LARDER).st_mtime))
    except OSError:
        pass
    return env


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def fmt(v, digits=1):
    if v is None:
        return "—"
    if isinstance(v, float) and abs(v) < 10 and digits == 1:
        return f"{v:.2f}"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


def raise_nofile():
    """For passthrough_hp, which holds a descriptor per inode it knows."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # raising the hard limit needs privilege


def rclone_config(path, port):
    with open(path, "w") as f:
        f.write(f"[home]\ntype = webdav\nurl = http://127.0.0.1:{port}/\nvendor = other\n")
    return path


def write_random(path, size):
    """A file of `size` random bytes."""
    with open(path, "wb") as f:
        left = size
        while left > 0:
            chunk = os.urandom(min(left, 8 * MiB))
            f.write(chunk)
            left -= len(chunk)


def random_files(d, names, size):
    """The files `names` in directory `d`, each of `size` random bytes, made where missing."""
    for n in names:
        p = os.path.join(d, n)
        if not os.path.exists(p):
            write_random(p, size)


def empty_files(home, rels, label):
    """The empty files `rels` (paths below `home`), made where missing with their directories; logged as
    `label`'s."""
    made = 0
    for rel in rels:
        path = os.path.join(home, rel)
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            made += 1
    if made:
        log(f"{label}: created {made} empty files under {home}")


def md_table(header, rows):
    """A Markdown table; numbers formatted by harness.fmt."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(fmt(v) if isinstance(v, (int, float)) or v is None else str(v) for v in r) + " |")
    return "\n".join(out)


def save_plot(fig, path, alt, **layout):
    """Lay out, save and close a matplotlib figure; the Markdown that embeds it in a report beside the
    plots' directory."""
    import matplotlib.pyplot as plt
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"![{alt}]({os.path.basename(os.path.dirname(path))}/{os.path.basename(path)})"


def save_results(out, res, lines):
    """`res` as JSON at `out` and `lines` as Markdown beside it (the same name, .md); the lines printed."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    md = os.path.splitext(out)[0] + ".md"
    with open(md, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    print(f"JSON: {out}\nMarkdown: {md}")
