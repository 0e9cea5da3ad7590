"""What the bank scenarios (bench/scenarios/bank_stat.py, bank_read.py) share: memcached and Redis servers of
the run's own on loopback, each started empty and stopped when its block ends (and by the harness's cleanup
on any exit), and groups of fresh larder mounts of the home with flags of the scenario's choosing.
"""
import contextlib
import os
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import harness as H

MEMCACHED = shutil.which("memcached") or "/usr/bin/memcached"
REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
# The bank's counters in `larder status --json`, summed over mounts.
BANK_COUNTS = ["gets", "hits", "misses", "errors", "bad", "puts", "put_errors", "dropped", "deletes",
               "bytes_read", "bytes_written"]


def available(kind):
    """None when the server `kind` ("memcache" or "redis") can be started, else why not."""
    exe = MEMCACHED if kind == "memcache" else REDIS
    return None if os.access(exe, os.X_OK) else f"{exe} is not installed"


def bulk_done(data):
    """Whether `data` holds a whole RESP bulk string ($LEN CRLF, LEN bytes, CRLF)."""
    head, sep, rest = data.partition(b"\r\n")
    if not sep:
        return False
    if not head.startswith(b"$"):
        return True  # an error or another reply: one line
    return len(rest) >= int(head[1:]) + 2


class Server:
    """A bank server's process, its URL for `--bank`, and its own figures."""

    def __init__(self, kind, proc, port, cmd):
        self.kind, self.proc, self.port, self.cmd = kind, proc, port, cmd
        self.url = f"{kind}://127.0.0.1:{port}"

    def _ask(self, request, done):
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(request)
            data = b""
            while not done(data):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data.decode(errors="replace")

    def figures(self):
        """Items and bytes the server holds (memcached's `stats`, Redis's INFO); {} if it does not answer."""
        try:
            if self.kind == "memcache":
                text = self._ask(b"stats\r\n", lambda d: d.endswith(b"END\r\n"))
                st = dict(line.split()[1:3] for line in text.splitlines() if line.startswith("STAT "))
                return {"items": int(st.get("curr_items", 0)), "bytes": int(st.get("bytes", 0)),
                        "evictions": int(st.get("evictions", 0)), "limit_bytes": int(st.get("limit_maxbytes", 0))}
            text = self._ask(b"INFO\r\n", bulk_done)
            st = dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))
            keys = 0
            for k, v in st.items():
                if k.startswith("db") and "keys=" in v:
                    keys += int(v.split("keys=")[1].split(",")[0])
            return {"items": keys, "bytes": int(st.get("used_memory", 0)),
                    "evictions": int(st.get("evicted_keys", 0)), "limit_bytes": int(st.get("maxmemory", 0))}
        except (OSError, ValueError, IndexError) as e:
            return {"error": str(e)}


@contextlib.contextmanager
def server(ctx, kind, memory_mib, item_max=None, tag=""):
    """A fresh (empty) memcached or Redis on 127.0.0.1, `memory_mib` MiB of memory, evicting the least
    recently used when full; memcached's item limit `item_max` ("4m") if given. Stopped on exit."""
    why = available(kind)
    if why:
        raise RuntimeError(why)
    port = H.free_port()
    if kind == "memcache":
        cmd = [MEMCACHED, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", str(memory_mib), "-t", "2"]
        if item_max:
            cmd += ["-I", item_max]
        if os.geteuid() == 0:
            cmd += ["-u", "nobody"]  # memcached refuses to run as root without -u
    elif kind == "redis":
        cmd = [REDIS, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
               "--protected-mode", "no", "--maxmemory", f"{memory_mib}mb", "--maxmemory-policy", "allkeys-lru",
               "--dir", ctx.work]
    else:
        raise ValueError(f"unknown bank server kind {kind}")
    logname = os.path.join(ctx.work, f"bank-{kind}{'-' + tag if tag else ''}.log")
    p = H.spawn(cmd, logname)
    try:
        if not H.wait_port(port, 30, p):
            raise RuntimeError(f"{os.path.basename(cmd[0])} did not come up (see {logname})")
        yield Server(kind, p, port, cmd)
    finally:
        H.stop_proc(p)


class Mount:
    """One larder mount of a group: its mountpoint, command and pid."""

    def __init__(self, mnt, cache, cmd=None, pid=None):
        self.mnt, self.cache, self.cmd, self.pid = mnt, cache, cmd, pid

    def status(self):
        return H.larder_status(self.mnt)

    def path(self, rel):
        return os.path.join(self.mnt, rel)


def _unmount(m):
    try:
        H.unmount("larder", m.mnt)
    except Exception as e:  # noqa: BLE001 - the others still go; cleanup() tries again
        H.log(f"unmount {m.mnt}: {e}")


@contextlib.contextmanager
def mounts(ctx, tag, count, flags):
    """`count` fresh larder mounts of the home, each with an empty cache directory of its own and `flags`;
    unmounted and their caches removed on exit."""
    made = []
    try:
        for i in range(count):
            mnt, cache = ctx.scratch(f"mnt-{tag}-{i}"), ctx.scratch(f"cache-{tag}-{i}")
            m = Mount(mnt, cache)
            made.append(m)
            m.cmd = H.larder_mount(ctx.home, mnt, cache, list(flags))
            m.pid = m.status().get("pid")
        yield made
    finally:
        # Together: an unmount waits about a second for its daemon to end.
        with ThreadPoolExecutor(max(1, len(made))) as pool:
            list(pool.map(_unmount, made))
        for m in made:
            H.forget_mount(m.mnt)
            shutil.rmtree(m.cache, ignore_errors=True)


def counters(st):
    """The figures of one status the bank scenarios compare: home calls by kind, home bytes, bank counts."""
    home = st.get("home") or {}
    bank = st.get("bank") or {}
    return {"home_ops": home.get("ops") or 0, "home_bytes_read": home.get("bytes_read") or 0,
            "home_by_kind": dict(home.get("ops_by_kind") or {}),
            "bank": {k: bank.get(k) or 0 for k in BANK_COUNTS} if bank else None}


def delta(before, after):
    """after - before, of two `counters`."""
    d = {"home_ops": after["home_ops"] - before["home_ops"],
         "home_bytes_read": after["home_bytes_read"] - before["home_bytes_read"],
         "home_by_kind": {k: v - before["home_by_kind"].get(k, 0) for k, v in after["home_by_kind"].items()
                          if v - before["home_by_kind"].get(k, 0)}}
    if after["bank"] is not None:
        d["bank"] = {k: after["bank"][k] - (before["bank"] or {}).get(k, 0) for k in BANK_COUNTS}
    return d


def total(deltas):
    """The sum of several `delta`s (one per mount)."""
    out = {"home_ops": 0, "home_bytes_read": 0, "home_by_kind": {}}
    for d in deltas:
        out["home_ops"] += d["home_ops"]
        out["home_bytes_read"] += d["home_bytes_read"]
        for k, v in d["home_by_kind"].items():
            out["home_by_kind"][k] = out["home_by_kind"].get(k, 0) + v
        if d.get("bank") is not None:
            b = out.setdefault("bank", {k: 0 for k in BANK_COUNTS})
            for k in BANK_COUNTS:
                b[k] += d["bank"][k]
    return out


def snapshot(ms):
    return [counters(m.status()) for m in ms]


def settle(m, seconds=60, quiet=1.0):
    """Wait until the mount's bank fills have stopped (its puts, failed puts and drops unchanged for `quiet`
    seconds: the background writer's queue is empty), at most `seconds`; its bank counters then."""
    deadline = time.monotonic() + seconds
    def sig():
        b = counters(m.status())["bank"] or {}
        return (b.get("puts"), b.get("put_errors"), b.get("dropped"), b.get("bytes_written"))
    last, since = sig(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = sig()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    else:
        H.note(f"bank fills of {m.mnt} still going after {seconds} s")
    return counters(m.status())["bank"]
