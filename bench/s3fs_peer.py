"""The s3fs-fuse peer of bench/suite.py: s3fs with its local file cache (`use_cache`), reading the home as an S3
bucket.

The server is s3s-fs (built by scripts/bench-setup.sh --suite), which serves each subdirectory of a directory
as a bucket: the suite keeps its home at <work>/s3root/home, so s3s-fs serving <work>/s3root shows the bucket
"home", the very files the other systems read. It is started once per run; over "the link", s3fs reaches it
through bench/wanproxy.py. s3fs mounts the bucket in the foreground with the options of S3FS_OPTIONS, the ones
a tuned read-mostly deployment sets (see the comment there), read-only unless the mount is writable.

s3s-fs keeps what S3 stores beside an object (its ETag, its headers) in side files of the served directory,
written when the object is uploaded through it. The home's files were not, and for them s3s-fs falls short
of a real S3 store in two ways that would measure the server, not s3fs: it computes an object's MD5 over
the whole file on every HEAD and GET (a 16 MiB ranged GET of a 1 GiB file hashes 1 GiB), and it answers
HEAD of a key that is a directory with 500, which s3fs retries. So before each mount the peer stores, once,
what an upload of the home would have left: the MD5 ETag of every file of LARGE bytes or more, and a
directory object ("dir/", Content-Type application/x-directory, x-amz-meta-mode) for every directory, as s3fs
itself writes them. Small files keep the MD5 computed per request: it costs microseconds.

A directory made while s3fs is mounted, through it (s3fs's PUT of "dir/" makes a plain directory) or at home,
would answer HEAD with 500 too, which s3fs retries after 4, 8, 16... seconds: while a mount is up, an inotify
watch on the home's directories stores the directory object of each new one as it appears. Over the link the
watch is first by far (s3fs's next request pays the link's latency); on a mount without it, s3fs now and then
asks first and waits a few seconds for its retry.

Systems of bench/suite.py are duck-typed here (name, peer, available(ctx), mount(ctx, tag, link, writable,
flags) yielding an object with system, root, pids, cmd, path(rel), status()): suite.py runs as __main__, so
importing its System and Mount would load a second copy of it.
"""
import base64
import contextlib
import ctypes
import hashlib
import json
import os
import select
import shutil
import stat
import struct
import threading

import harness as H
from harness import MiB, log

ACCESS_KEY, SECRET_KEY = "larderbench", "larderbench-secret"
EMPTY_MD5 = hashlib.md5(b"").hexdigest()  # the ETag of a directory object, which has no bytes
LARGE = MiB  # files this large or larger get their ETag stored once (smaller ones: hashed per request)

# s3fs's options besides the endpoint, credentials and cache directory:
#   stat_cache_expire=3600     attributes trusted for an hour (larder --validity-lag 1h, rclone --attr-timeout 1h)
#   max_stat_cache_size=1000000  room for every file of the largest stat storm (262,144; the default is 100,000)
#   enable_noobj_cache         remember absent names (no HEAD of "x", "x/" again on each lookup of a new file)
#   notsup_compat_dir          directories are "dir/" objects only: no listing to find implicit directories
#   parallel_count=8, multipart_size=16   16 MiB ranges, 8 at a time (rclone reads 16 MiB chunks; larder 8 streams)
#   kernel_cache               the page cache is kept across opens (larder keeps it for unchanged files)
# (Each mount gets a fresh cache directory, removed at unmount.)
S3FS_OPTIONS = [
    "stat_cache_expire=3600",
    "max_stat_cache_size=1000000",
    "enable_noobj_cache",
    "notsup_compat_dir",
    "parallel_count=8",
    "multipart_size=16",
    "kernel_cache",
]

_stored = {}  # (served root, key) -> (size, mtime_ns) of the file whose ETag is stored, or None for a directory


class S3fsMount:
    """What a mount of bench/suite.py offers: the view of the home at `root`."""

    def __init__(self, system, root, pids, cmd):
        self.system, self.root, self.pids, self.cmd = system, root, pids, cmd

    def path(self, rel):
        return os.path.join(self.root, rel)

    def status(self):
        return None


class S3fs:
    """s3fs-fuse with `use_cache` over s3s-fs serving the home as the bucket "home"."""
    name = "s3fs"
    peer = True

    def available(self, ctx):
        for key, what in (("S3FS", "s3fs"), ("S3S_FS", "s3s-fs")):
            if not ctx.setup.get(key):
                return ctx.setup.get(key + "_ERROR") or f"{what} is not installed (scripts/bench-setup.sh --suite)"
        if not shutil.which("fusermount3"):
            return "fusermount3 is missing"
        return None

    def server_port(self, ctx):
        """s3s-fs serving the directory above the home, started once per run."""
        port = H.free_port()
        cmd = [ctx.setup["S3S_FS"], "--host", "127.0.0.1", "--port", str(port),
               "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, os.path.dirname(ctx.home)]
        return ctx.start("s3s-fs", cmd, port, "s3s-fs.log")

    @contextlib.contextmanager
    def mount(self, ctx, tag, link=None, writable=False, flags=()):
        port = self.server_port(ctx)
        if link:
            port = ctx.proxy(port, link)
        root, bucket = os.path.dirname(ctx.home), os.path.basename(ctx.home)
        store_object_metadata(root, bucket, ctx.home)
        mnt, cache = ctx.scratch(f"mnt-s3fs-{tag}"), ctx.scratch(f"cache-s3fs-{tag}")
        cmd = [ctx.setup["S3FS"], bucket, mnt, "-f", "-o", f"url=http://127.0.0.1:{port}",
               "-o", "use_path_request_style", "-o", f"passwd_file={passwd_file(ctx)}", "-o", f"use_cache={cache}",
               "-o", "dbglevel=err"]
        for opt in S3FS_OPTIONS + ([] if writable else ["ro"]):
            cmd += ["-o", opt]
        cmd += list(flags)
        logpath = os.path.join(ctx.work, f"s3fs-{tag}.log")
        watch = DirectoryWatch(root, bucket, ctx.home)
        p = None
        try:
            p = H.spawn(cmd, logpath)
            H._mounts.append(("fuse", mnt))
            if not H.wait_mounted(mnt, 60, p):
                raise RuntimeError(f"s3fs did not mount {mnt}: {tail(logpath)}")
            yield S3fsMount(self, mnt, {"s3fs": p.pid}, cmd)
        finally:
            H.unmount("fuse", mnt)
            H.forget_mount(mnt)
            if p:
                H.stop_proc(p)
            watch.stop()
            shutil.rmtree(cache, ignore_errors=True)


def passwd_file(ctx):
    path = os.path.join(ctx.work, "s3fs-passwd")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{ACCESS_KEY}:{SECRET_KEY}\n")
    os.chmod(path, 0o600)  # s3fs refuses a password file others can read
    return path


def tail(path, n=800):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip() or "(empty log)"
    except OSError as e:
        return str(e)


def side_file(root, bucket, key, kind):
    """Where s3s-fs keeps an object's `internal` (ETag) or `metadata` (headers) JSON; None when the name would
    be too long for the file system (s3s-fs then does without, as for any object not uploaded through it)."""
    def enc(s):
        return base64.urlsafe_b64encode(s.encode()).decode().rstrip("=")
    name = f".bucket-{enc(bucket)}.object-{enc(key)}.{kind}.json"
    return os.path.join(root, name) if len(name) <= 240 else None


def write_json(path, value):
    """Replace `path` at once (s3s-fs may read it meanwhile); plain os calls, as the directory watch races s3fs."""
    if path is None:
        return
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, json.dumps(value).encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)


def md5_hex(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 * MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def store_directory(root, bucket, key, st):
    """The directory object s3fs would have written for `key`, stored under "key" (which s3fs asks for first)
    and "key/"; each with its headers before its ETag, so s3s-fs never shows the directory as a file."""
    headers = {"content_type": "application/x-directory", "user_metadata": {
        "mode": str(stat.S_IFDIR | stat.S_IMODE(st.st_mode)), "uid": str(st.st_uid), "gid": str(st.st_gid),
        "mtime": str(int(st.st_mtime))}}
    for k in (key, key + "/"):
        write_json(side_file(root, bucket, k, "metadata"), headers)
        write_json(side_file(root, bucket, k, "internal"), {"e_tag": EMPTY_MD5})


def store_object_metadata(root, bucket, home):
    """Store, for the objects of `home` (served as `bucket` from `root`) that lack it, what an upload would have
    left in s3s-fs: directory objects, and the ETags of large files (again when a file changed)."""
    hashed = 0
    for dirpath, _, filenames in os.walk(home):
        rel = os.path.relpath(dirpath, home)
        prefix = "" if rel == "." else rel + "/"
        if prefix and (root, prefix) not in _stored:
            store_directory(root, bucket, rel, os.stat(dirpath))
            _stored[(root, prefix)] = None
        for name in filenames:
            path, key = os.path.join(dirpath, name), prefix + name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size < LARGE:
                continue
            if _stored.get((root, key)) != (st.st_size, st.st_mtime_ns):
                write_json(side_file(root, bucket, key, "internal"), {"e_tag": md5_hex(path)})
                _stored[(root, key)] = (st.st_size, st.st_mtime_ns)
                hashed += 1
    if hashed:
        log(f"s3fs: stored the ETags of {hashed} large file(s) in s3s-fs, as an upload would have")


class DirectoryWatch:
    """Stores the directory object of every directory made under `home` while it runs (inotify, one watch per
    directory, in a thread)."""
    EVENTS = 0x100 | 0x80 | 0x1000000  # IN_CREATE | IN_MOVED_TO | IN_ONLYDIR
    IN_ISDIR, IN_Q_OVERFLOW = 0x40000000, 0x4000
    HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len, then the name

    def __init__(self, root, bucket, home):
        self.root, self.bucket, self.home = root, bucket, home
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.dirs = {}  # watch descriptor -> directory
        self.full = False
        self.done = threading.Event()
        self.thread = None
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:  # out of inotify instances: directories made during this mount stay plain to s3s-fs
            H.note(f"s3fs: no watch for new directories: {os.strerror(ctypes.get_errno())}")
            return
        self.watch_tree(home, store=False)
        self.thread = threading.Thread(target=self.run, name="s3fs-dirwatch", daemon=True)
        self.thread.start()

    def watch_tree(self, top, store=True):
        """Watch `top` and the directories below it; store their directory objects when `store`."""
        for dirpath, _, _ in os.walk(top):
            if store and dirpath != self.home:
                store_directory(self.root, self.bucket, os.path.relpath(dirpath, self.home), os.stat(dirpath))
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(dirpath), self.EVENTS)
            if wd >= 0:
                self.dirs[wd] = dirpath
            elif not self.full:  # out of watches (fs.inotify.max_user_watches): new directories there are not seen
                self.full = True
                log(f"s3fs: cannot watch {dirpath} for new directories: {os.strerror(ctypes.get_errno())}")

    def run(self):
        while not self.done.is_set():
            if not select.select([self.fd], [], [], 0.2)[0]:
                continue
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                continue
            for path in self.new_directories(buf):
                try:
                    self.watch_tree(path)
                except OSError:  # gone again
                    pass

    def new_directories(self, buf):
        off, out = 0, []
        while off + self.HEADER.size <= len(buf):
            wd, mask, _, n = self.HEADER.unpack_from(buf, off)
            name = buf[off + self.HEADER.size: off + self.HEADER.size + n].rstrip(b"\0")
            off += self.HEADER.size + n
            if mask & self.IN_Q_OVERFLOW:
                out.append(self.home)  # events were lost: look at every directory again
            elif mask & self.IN_ISDIR and wd in self.dirs:
                out.append(os.path.join(self.dirs[wd], os.fsdecode(name)))
        return out

    def stop(self):
        if self.thread:
            self.done.set()
            self.thread.join(5)
            os.close(self.fd)
