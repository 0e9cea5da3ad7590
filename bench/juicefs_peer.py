"""The JuiceFS peer of bench/suite.py: JuiceFS (`juicefs mount --writeback`) run as its users run it, its
metadata in a Redis server and its data in an S3 bucket.

Redis is the run's own: a redis-server on loopback at a free port, nothing saved to disk, its directory under
the run's work directory, started at the first mount and stopped with the run. The bucket is "juicefs" on the
S3 server the s3fs peer reads (s3s-fs, bench/s3fs_peer.py), which serves the directory above the home: the
bucket is the home's sibling, never inside it. Over "the link" both go through bench/wanproxy.py with the
link's latency and bandwidth: the blocks through the proxy in front of s3s-fs, the metadata through a second
proxy in front of Redis, so each lookup, create or open that asks Redis pays the round trip, as larder's home
calls do. (Each proxy has the link's bandwidth to itself; what the metadata moves is small.)

JuiceFS keeps files in a format of its own (each file in 4 MiB blocks in the bucket, their layout in Redis), so
it cannot read the home's files where they are: as a user copies a data set in, before each mount the peer
copies into its volume the files of the home it has not copied yet or that changed since, and removes those
that left the home, through a mount of its own without the link (not timed). That mount is unmounted and its
cache directory removed; every measured mount is a new JuiceFS process with an empty cache directory, so a
cold figure starts with nothing of the data on this side of the link but what Redis and the bucket hold.

What a writable mount writes stays in the volume: JuiceFS's home is Redis and the bucket, not the home
directory. A scenario that checks what reached home reads `home_view(ctx)`, a new mount of the volume without
the link, which sees only what reached Redis and the bucket; a mount's `wait_pushed(seconds)` waits until its
write-back staging (blocks written, not yet uploaded) is empty. A writable mount is unmounted with
`juicefs umount --flush`, which uploads what is staged first (larder is drained before it is unmounted).
Each home (the programs scenario moves the home onto a disk of its own) gets a volume of its own: another
Redis database, and a bucket beside that home.

Systems of bench/suite.py are duck-typed here, as in bench/s3fs_peer.py.
"""
import contextlib
import os
import shutil
import signal
import stat
import time
from concurrent.futures import ThreadPoolExecutor

import harness as H
from harness import MiB, log
from s3fs_peer import ACCESS_KEY, SECRET_KEY, S3fs, tail

BUCKET = "juicefs"
VOLUME = "larder-bench"
COPIERS = 8  # files copied into the volume at once

# juicefs mount's options besides the metadata URL, the bucket's endpoint and the cache directory:
#   --attr-cache 1h --entry-cache 1h --dir-entry-cache 1h   attributes and names trusted for an hour (larder
#                        --validity-lag 1h, rclone --attr-timeout 1h and --dir-cache-time 1h, s3fs
#                        stat_cache_expire=3600)
#   --negative-entry-cache 1h   absent names remembered (s3fs enable_noobj_cache; larder keeps absent names)
#   --open-cache 1h      a file opened again is not checked with Redis, and its page cache is kept across opens
#                        (s3fs kernel_cache; larder keeps it for unchanged files)
#   --writeback          blocks written are staged in the cache directory and uploaded in the background
#   --free-space-ratio 0.01   the cache is bounded by its size (--cache-size: the suite's, as larder's), not by
#                        JuiceFS's default of leaving a tenth of the disk free, which a benchmark machine's
#                        disk may not have (JuiceFS then stops caching)
#   --backup-meta 0      no hourly copy of the metadata into the bucket in the middle of a figure
#   --no-usage-report    nothing sent off the machine
# The rest is JuiceFS's defaults: 4 MiB blocks, 300 MiB of read and write buffers, one block prefetched.
JUICEFS_OPTIONS = [
    "--attr-cache", "1h", "--entry-cache", "1h", "--dir-entry-cache", "1h", "--negative-entry-cache", "1h",
    "--open-cache", "1h",
    "--writeback",
    "--free-space-ratio", "0.01",
    "--backup-meta", "0",
    "--no-usage-report",
]


class JuiceFSMount:
    """What a mount of bench/suite.py offers: the view of the home at `root`, the cache directory at
    `cache_dir`."""

    def __init__(self, system, root, pids, cmd, cache_dir):
        self.system, self.root, self.pids, self.cmd, self.cache_dir = system, root, pids, cmd, cache_dir

    def path(self, rel):
        return os.path.join(self.root, rel)

    def status(self):
        return None

    def wait_pushed(self, seconds):
        """Seconds until no written block is left staged in the cache directory (all uploaded), stable for a
        second; None on timeout."""
        t0, empty_since = time.monotonic(), None
        while time.monotonic() - t0 < seconds:
            if staged_files(self.cache_dir):
                empty_since = None
            elif empty_since is None:
                empty_since = time.monotonic()
            elif time.monotonic() - empty_since >= 1:
                return round(empty_since - t0, 1)
            time.sleep(0.25)
        return None


class Volume:
    """One JuiceFS file system for one home: its Redis database, its bucket, and what of the home it holds."""

    def __init__(self, home, db):
        self.home, self.db = home, db
        self.root = os.path.dirname(home)  # what s3s-fs serves: the home's bucket and this one
        self.copied = {}  # relative path -> None (a directory) or (size, mtime_ns) of the file copied in


class JuiceFS:
    """JuiceFS with write-back and its local cache, over a Redis of the run's own and a bucket of s3s-fs."""
    name = "juicefs"
    peer = True

    def __init__(self):
        self.redis = None  # (process, port)
        self.volumes = {}  # home -> Volume
        self.s3 = S3fs()  # its s3s-fs server, started once per run

    def available(self, ctx):
        if not ctx.setup.get("JUICEFS"):
            return ctx.setup.get("JUICEFS_ERROR") or "juicefs is not installed (scripts/bench-setup.sh --suite)"
        if not ctx.setup.get("S3S_FS"):
            return ctx.setup.get("S3S_FS_ERROR") or "s3s-fs is not installed (scripts/bench-setup.sh --suite)"
        if not shutil.which("redis-server"):
            return "redis-server is not installed"
        if not shutil.which("fusermount3"):
            return "fusermount3 is missing"
        return None

    def exe(self, ctx):
        return ctx.setup["JUICEFS"]

    def redis_port(self, ctx):
        """The run's Redis, started at the first call (not one of the servers restarted between scenarios:
        it holds the volumes)."""
        if self.redis and self.redis[0].poll() is None:
            return self.redis[1]
        d = os.path.join(ctx.run_work, "juicefs-redis")
        os.makedirs(d, exist_ok=True)
        port = H.free_port()
        cmd = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
               "--protected-mode", "no", "--dir", d]
        logpath = os.path.join(ctx.run_work, "juicefs-redis.log")
        p = H.spawn(cmd, logpath)
        if not H.wait_port(port, 30, p):
            raise RuntimeError(f"redis-server did not come up: {tail(logpath)}")
        self.redis = (p, port)
        self.volumes.clear()  # a new Redis holds none of them
        return port

    def endpoints(self, ctx, vol, link):
        """The metadata URL and the bucket's URL, behind `link` if given."""
        redis, s3 = self.redis_port(ctx), self.s3.server_port(ctx)
        if link:
            redis, s3 = ctx.proxy(redis, link), ctx.proxy(s3, link)
        return f"redis://127.0.0.1:{redis}/{vol.db}", f"http://127.0.0.1:{s3}/{BUCKET}"

    def volume(self, ctx):
        """The volume of the current home, formatted at its first use."""
        self.redis_port(ctx)
        vol = self.volumes.get(ctx.home)
        if vol:
            return vol
        vol = Volume(ctx.home, len(self.volumes) + 1)
        if vol.db > 15:
            raise RuntimeError("juicefs: Redis has no database left for another volume")
        os.makedirs(os.path.join(vol.root, BUCKET), exist_ok=True)  # s3s-fs: a directory of its root is a bucket
        meta, bucket = self.endpoints(ctx, vol, None)
        cmd = [self.exe(ctx), "--no-agent", "format", "--storage", "s3", "--bucket", bucket,
               "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, meta, VOLUME]
        r = H.run(cmd, timeout=120, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"juicefs format failed: {(r.stderr or r.stdout).strip()[-500:]}")
        self.volumes[ctx.home] = vol
        return vol

    @contextlib.contextmanager
    def _mounted(self, ctx, vol, tag, link, options, flush):
        """A juicefs mount of `vol` in the foreground, with an empty cache directory; unmounted (after
        uploading what is staged, with `flush`) and its cache directory removed on exit."""
        meta, bucket = self.endpoints(ctx, vol, link)
        mnt, cache = ctx.scratch(f"mnt-juicefs-{tag}"), ctx.scratch(f"cache-juicefs-{tag}")
        cmd = [self.exe(ctx), "--no-agent", "mount", meta, mnt, "--bucket", bucket, "--cache-dir", cache,
               "--no-syslog"] + options
        logpath = os.path.join(ctx.work, f"juicefs-{tag}.log")
        p = server = None
        try:
            p = H.spawn(cmd, logpath)
            H._mounts.append(("fuse", mnt))
            if not H.wait_mounted(mnt, 60, p):
                raise RuntimeError(f"juicefs did not mount {mnt}: {tail(logpath)}")
            server = serving_pid(p.pid)
            yield JuiceFSMount(self, mnt, {"juicefs": server}, cmd, cache)
            if flush:  # not when interrupted
                r = H.run([self.exe(ctx), "umount", "--flush", mnt], timeout=900, check=False)
                if r.returncode != 0:
                    H.note(f"juicefs: umount --flush {mnt}: {(r.stderr or r.stdout).strip()[-300:]}")
        finally:
            H.unmount("fuse", mnt)
            H.forget_mount(mnt)
            if p:
                H.stop_proc(p)
            if server and server != p.pid:
                # The supervisor's end does not end the process that serves the mount: after an interrupted
                # program it may wait on Redis for good, and the program on it.
                stop_pid(server)
            shutil.rmtree(cache, ignore_errors=True)

    def copy_in(self, ctx, vol):
        """Bring the volume to the home's files: copy in what is new or changed there, remove what left it."""
        want = home_tree(vol.home)
        todo = sorted(rel for rel, v in want.items() if rel not in vol.copied or vol.copied[rel] != v)
        gone = sorted((rel for rel in vol.copied if rel not in want), reverse=True)
        if not todo and not gone:
            return
        t0 = time.monotonic()
        options = ["--cache-size", "0", "--no-usage-report", "--backup-meta", "0"]
        with self._mounted(ctx, vol, "copy-in", None, options, flush=True) as m:
            for rel in gone:
                path = m.path(rel)
                if vol.copied.pop(rel) is None:
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.lexists(path):
                    os.remove(path)
            files = [rel for rel in todo if want[rel] is not None]
            for rel in todo:
                if want[rel] is None:
                    os.makedirs(m.path(rel), exist_ok=True)
                    vol.copied[rel] = None
            with ThreadPoolExecutor(COPIERS) as pool:
                list(pool.map(lambda rel: shutil.copyfile(os.path.join(vol.home, rel), m.path(rel)), files))
            vol.copied.update((rel, want[rel]) for rel in files)
        size = sum(want[rel][0] for rel in files)
        log(f"juicefs: copied {len(files):,} files ({size / MiB:,.0f} MiB) of the home into its volume"
            f"{f' and removed {len(gone):,}' if gone else ''} in {time.monotonic() - t0:.1f} s")

    @contextlib.contextmanager
    def mount(self, ctx, tag, link=None, writable=False, flags=()):
        vol = self.volume(ctx)
        self.copy_in(ctx, vol)
        options = list(JUICEFS_OPTIONS)
        if "--cache-size" not in flags:
            options += ["--cache-size", str(H.parse_size(ctx.args.cache_size) // MiB)]
        options += ([] if writable else ["--read-only"]) + list(flags)
        with self._mounted(ctx, vol, tag, link, options, flush=writable) as m:
            yield m

    @contextlib.contextmanager
    def home_view(self, ctx):
        """Where what reached this system's home can be read: a new mount of the volume without the link
        (nothing cached), which sees only what reached Redis and the bucket."""
        vol = self.volume(ctx)
        with self._mounted(ctx, vol, "home", None, ["--no-usage-report", "--backup-meta", "0"], flush=True) as m:
            yield m.root


def home_tree(home):
    """The home's directories and regular files: relative path -> None (a directory) or (size, mtime_ns)."""
    out = {}
    for dirpath, dirs, files in os.walk(home):
        rel = os.path.relpath(dirpath, home)
        prefix = "" if rel == "." else rel + "/"
        for d in dirs:
            out[prefix + d] = None
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[prefix + name] = (st.st_size, st.st_mtime_ns)
    return out


def staged_files(cache):
    """Whether any block is staged for upload in a juicefs cache directory (<cache>/<volume uuid>/rawstaging)."""
    try:
        uuids = os.listdir(cache)
    except OSError:
        return False
    for u in uuids:
        for _, _, files in os.walk(os.path.join(cache, u, "rawstaging")):
            if files:
                return True
    return False


def alive(pid):
    """Whether a process runs (a zombie, ended but not yet reaped by whoever adopted it, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_pid(pid):
    """SIGTERM to a process that is not our child, SIGKILL if it still runs 10 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not alive(pid):
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def serving_pid(pid):
    """The process that serves the mount: `juicefs mount` in the foreground runs it as its child."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return pid
    return int(kids[0]) if kids else pid
