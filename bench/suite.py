#!/usr/bin/env python3
"""larder's benchmark suite: the seed papers' experiments, larder beside its baselines and its peers, each
scenario measuring everything it compares in the same run.

    bench/suite.py [--full] [--only NAME,...] [--skip-peers] [--keep] [--out-dir bench/results]

Scenarios (bench/scenarios/, in this order; each names the experiment it reproduces):
  stat_storm   IMCa §5.2    K clients stat every one of N files
  latency      IMCa §5.3-4  mean read latency by record size, 1 and 8 clients, cold and warm
  throughput   IMCa §5.5, Panache §7   a 1 GiB file read by 1/2/4/8 threads, cold over the link and warm
  shared       IMCa §5.6    one writer, then K readers of the same file
  hybrid       HCCache §6   a skewed small/large-file trace: hybrid units + S3-FIFO vs per-block LRU
  metadata     Panache §7 (mdtest)   creates/s, write-through and write-back, home behind 30 ms
  reread       Coopc-PVFS §4.1   two input files read again and again by 4 processes
  cluster      design 013, IMCa §5.5   larder nodes in network namespaces of their own: a large file and
               4 KiB files read from peers, N = 1, 2, 4 nodes reading one data set together, a cold read
               by one node of four (larder only; needs root and etcd)
  cluster_writes  design 016   two writable nodes in namespaces: a close on one to the new content read
               on the other (close-to-open on and off), close and open latency in a cluster against a node
               alone, a file's write token handed between two appenders (larder only; needs root and etcd)
  bank_stat    IMCa §5.2    K = 2, 4, 8 larder mounts of one home each stat every file, with a shared memcached
               bank and without (larder only; needs memcached)
  bank_read    IMCa §5.5    C = 1, 2, 4 fresh mounts read a data set a warmer mount left in the bank, against
               fresh mounts reading home; memcached against Redis (larder only; needs memcached, redis-server)
  local_speed  design 009   the default (write-back) mount against the local disk: warm sequential reads
               (the first after a cold fill, and the next), 4 KiB random reads, a rewrite in place + fsync
  programs     design 003   tar x, git clone, cp -a and rm -rf at 10 ms against the local disk; home calls
               per directory of find | xargs cat past the validity lag
  scale        design 003   10k-1M small files cached: the daemon's RSS, the index's size, a remount, and
               home calls of ls -lR with the kernel's caches dropped (larder and direct only)
Systems: the home directory itself ("direct", the local-disk limit), larder, and the peers
`rclone mount --vfs-cache-mode full` over `rclone serve webdav` of the same home, s3fs-fuse with
`use_cache` over an S3 server (s3s-fs) serving the same home as a bucket, and JuiceFS with write-back, its
metadata in a Redis of the run's own and its blocks in a bucket of the same s3s-fs (the home's files copied
in through a mount of its own before it is measured; bench/juicefs_peer.py). Over "the link", larder's home
calls go through its `--emulate-wan`, the peers' (JuiceFS's Redis requests too) through bench/wanproxy.py
with the same latency and bandwidth.

Output: bench/results/<date>-<host>.json (every figure and run, the commands, the machine), a Markdown
report beside it, and PNG plots in bench/results/<date>-<host>/. Absolute figures are this machine's; the
report's ratios compare figures of the same run. Every mount and process the suite starts is stopped on
exit, Ctrl-C and SIGTERM included. The default size finishes in under 25 minutes on 2 cores; --full is the
seeds' sizes (262,144 files for the stat storm, 1 MiB records for 8 clients, more passes).
"""
import argparse
import contextlib
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
from harness import MiB, log, note  # noqa: E402

SCENARIOS = ["stat_storm", "latency", "throughput", "shared", "hybrid", "metadata", "reread", "cluster",
             "cluster_writes", "bank_stat", "bank_read", "local_speed", "programs", "scale"]
BENCH = os.path.dirname(os.path.abspath(__file__))

RCLONE_FLAGS = H.RCLONE_FLAGS


class Link:
    """An emulated link: latency per round trip, bandwidth shared by both directions (None: uncapped)."""

    def __init__(self, latency, bandwidth=None):
        self.latency, self.bandwidth = latency, bandwidth

    def larder_spec(self):
        spec = f"latency={self.latency}"
        if self.bandwidth:
            spec += f",bandwidth={self.bandwidth / MiB:g}MiB/s"
        return spec

    def proxy_args(self):
        args = ["--latency", self.latency]
        if self.bandwidth:
            args += ["--bandwidth", f"{self.bandwidth / MiB:g}MiB/s"]
        return args

    def key(self):
        return (self.latency, self.bandwidth)

    def describe(self):
        bw = f", {self.bandwidth / MiB:g} MiB/s" if self.bandwidth else ""
        return f"{self.latency} round trip{bw}"


class Mount:
    """A view of the home: `root` is the directory that shows home's tree."""

    def __init__(self, system, root, pids=None, status=None, cmd=None, cache_dir=None):
        self.system, self.root, self.pids, self._status, self.cmd = system, root, pids or {}, status, cmd
        # A peer's own cache directory, where a scenario measures what the peer keeps there.
        self.cache_dir = cache_dir

    def path(self, rel):
        return os.path.join(self.root, rel)

    def status(self):
        return self._status() if self._status else None


class System:
    """Something that shows the home at a path: `mount(ctx, tag, link, writable)` is a context manager
    yielding a Mount with an empty cache, unmounted and its cache removed on exit."""
    name = "?"
    peer = False

    def available(self, ctx):
        """None when usable, else why not."""
        return None


class Direct(System):
    """The home directory itself, on the disk the caches use: the local-disk limit (no link)."""
    name = "direct"

    @contextlib.contextmanager
    def mount(self, ctx, tag, link=None, writable=False, flags=()):
        yield Mount(self, ctx.home)


class Larder(System):
    name = "larder"

    def __init__(self, name="larder", flags=(), cache_size=None):
        self.name, self.flags, self.cache_size = name, list(flags), cache_size

    @contextlib.contextmanager
    def mount(self, ctx, tag, link=None, writable=False, flags=()):
        mnt, cache = ctx.scratch(f"mnt-{self.name}-{tag}"), ctx.scratch(f"cache-{self.name}-{tag}")
        size = str(self.cache_size or ctx.args.cache_size)
        extra = self.flags + list(flags)
        lag = [] if "--validity-lag" in extra else ["--validity-lag", "1h"]
        args = ["--cache-size", size] + lag + extra
        if not writable:
            args.append("--read-only")
        elif "--write-mode" not in args:
            args += ["--write-mode", "write-back"]
        if link:
            args += ["--emulate-wan", link.larder_spec()]
        cmd = H.larder_mount(ctx.home, mnt, cache, args)
        try:
            pid = H.larder_status(mnt).get("pid")
            yield Mount(self, mnt, {"larder": pid}, lambda: H.larder_status(mnt), cmd)
            if writable:  # not when interrupted: then the unmount leaves the queue in the cache dir
                H.run([H.LARDER, "drain", mnt, "--timeout", "600s"], timeout=700, check=False)
        finally:
            H.unmount("larder", mnt)
            H.forget_mount(mnt)
            shutil.rmtree(cache, ignore_errors=True)


class PassthroughHp(System):
    """libfuse's passthrough_hp over the home: a FUSE file system that adds nothing to the kernel's path
    (kernel caches on, long timeouts), so the least any FUSE file system pays on this machine. Built by
    `scripts/bench-setup.sh`; used where a scenario asks for it, not among the peers."""
    name = "passthrough_hp"

    def available(self, ctx):
        return None if ctx.setup.get("PASSTHROUGH_HP") else (ctx.setup.get("PASSTHROUGH_HP_ERROR") or "not built")

    @contextlib.contextmanager
    def mount(self, ctx, tag, link=None, writable=False, flags=()):
        mnt = ctx.scratch(f"mnt-passthrough-{tag}")
        cmd = [ctx.setup["PASSTHROUGH_HP"], "--foreground", ctx.home, mnt]
        p = H.spawn(cmd, os.path.join(ctx.work, f"passthrough-{tag}.log"), preexec_fn=H.raise_nofile)
        H._mounts.append(("fuse", mnt))
        try:
            if not H.wait_mounted(mnt, 30, p):
                raise RuntimeError("passthrough_hp did not mount")
            yield Mount(self, mnt, {"passthrough_hp": p.pid}, None, cmd)
        finally:
            H.unmount("fuse", mnt)
            H.forget_mount(mnt)
            H.stop_proc(p)


class Rclone(System):
    """`rclone mount --vfs-cache-mode full` over `rclone serve webdav` of the home."""
    name = "rclone"
    peer = True

    def available(self, ctx):
        return None if shutil.which("rclone") else "rclone is not installed"

    @contextlib.contextmanager
    def mount(self, ctx, tag, link=None, writable=False, flags=()):
        url = ctx.webdav_url(link)
        cfg = os.path.join(ctx.work, f"rclone-{tag}.conf")
        with open(cfg, "w") as f:
            f.write(f"[home]\ntype = webdav\nurl = {url}\nvendor = other\n")
        mnt, cache = ctx.scratch(f"mnt-rclone-{tag}"), ctx.scratch(f"cache-rclone-{tag}")
        fl = RCLONE_FLAGS + ([] if writable else ["--read-only"]) + list(flags)
        p, cmd = H.rclone_mount(cfg, mnt, cache, os.path.join(ctx.work, f"rclone-mount-{tag}.log"), fl)
        try:
            yield Mount(self, mnt, {"rclone_mount": p.pid}, None, cmd, cache_dir=cache)
        finally:
            H.unmount("rclone", mnt)
            H.forget_mount(mnt)
            H.stop_proc(p)
            shutil.rmtree(cache, ignore_errors=True)


class Context:
    """What scenarios share: arguments, the home, the work directory, servers, and the systems."""

    def __init__(self, args, work, home, setup):
        self.args, self.work, self.home, self.setup = args, work, home, setup
        self.run_work = work  # the run's own work directory (programs moves ctx.work onto a disk of its own)
        self.wan = Link(args.latency, args.bandwidth)
        self._servers = {}
        self.systems = [Direct(), Larder()]
        self.skipped = {}
        if not args.skip_peers:
            peers = [Rclone()]
            try:
                from s3fs_peer import S3fs
                peers.append(S3fs())
            except ImportError as e:
                self.skipped["s3fs"] = f"bench/s3fs_peer.py: {e}"
            try:
                from juicefs_peer import JuiceFS
                peers.append(JuiceFS())
            except ImportError as e:
                self.skipped["juicefs"] = f"bench/juicefs_peer.py: {e}"
            if args.peers:
                wanted = {p.strip() for p in args.peers.split(",")}
                peers = [p for p in peers if p.name in wanted]
            for p in peers:
                why = p.available(self)
                if why:
                    self.skipped[p.name] = why
                    note(f"{p.name} skipped: {why}")
                else:
                    self.systems.append(p)
        self.plot_dir = None

    def link(self, latency, bandwidth=None):
        """An emulated link other than the suite's own (`ctx.wan`)."""
        return Link(latency, bandwidth)

    def larder(self, name, flags=(), cache_size=None):
        """A larder variant: its own name, extra mount flags and cache size."""
        return Larder(name, flags, cache_size)

    def system(self, name):
        return next((s for s in self.systems if s.name == name), None)

    def fuse_limit(self):
        """libfuse's passthrough_hp if it is built, else None (the reason noted)."""
        s = PassthroughHp()
        why = s.available(self)
        if why:
            self.skipped[s.name] = why
            note(f"{s.name} skipped: {why}")
            return None
        return s

    def peers(self):
        return [s for s in self.systems if s.peer]

    @contextlib.contextmanager
    def home_view(self, s):
        """A directory showing what reached system `s`'s home: the home itself, or, for a peer that keeps
        its files its own way (JuiceFS: Redis and a bucket), a new mount of that without the link."""
        view = getattr(s, "home_view", None)
        if view is None:
            yield self.home
        else:
            with view(self) as root:
                yield root

    def scratch(self, name):
        path = os.path.join(self.work, name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        return path

    def subhome(self, name):
        """A directory of the home for one scenario's data (relative name, absolute path)."""
        path = os.path.join(self.home, name)
        os.makedirs(path, exist_ok=True)
        return path

    def stop_servers(self):
        """Stop the servers started so far. Called between scenarios: a server may keep listings of the
        home (rclone serve's directory cache) that the next scenario's new files would make stale."""
        for p, _ in self._servers.values():
            H.stop_proc(p)
        self._servers.clear()

    def start(self, key, cmd, port, logname):
        """A server kept for the run, started once per key; its port."""
        if key in self._servers and self._servers[key][0].poll() is None:
            return self._servers[key][1]
        p = H.spawn(cmd, os.path.join(self.work, logname))
        if not H.wait_port(port, 60, p):
            raise RuntimeError(f"{' '.join(cmd[:3])} did not come up (see {logname})")
        self._servers[key] = (p, port)
        return port

    def proxy(self, target_port, link):
        """bench/wanproxy.py in front of a local port, emulating `link`; its port."""
        port = H.free_port()
        cmd = [sys.executable, os.path.join(BENCH, "wanproxy.py"), "--listen", f"127.0.0.1:{port}",
               "--target", f"127.0.0.1:{target_port}"] + link.proxy_args()
        return self.start(("proxy", target_port, link.key()), cmd, port, f"wanproxy-{target_port}.log")

    def webdav_url(self, link=None):
        """`rclone serve webdav` of the home (writable), behind `link` if given."""
        port = H.free_port()
        port = self.start("webdav", ["rclone", "serve", "webdav", self.home, "--addr", f"127.0.0.1:{port}"],
                          port, "rclone-serve.log")
        if link:
            port = self.proxy(port, link)
        return f"http://127.0.0.1:{port}/"

    def together(self, cmds, phases, timeout, label):
        """Start `cmds` as processes and release them together at each of their `phases` barriers (a client
        prints "ready", then waits for a line on stdin); per client, (the JSON lines it printed, its stderr,
        its exit code). `label(cmd)` names a client in errors."""
        procs = [subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True) for c in cmds]
        H._procs.extend(procs)
        deadline = time.monotonic() + timeout
        try:
            for _ in range(phases):
                for p, c in zip(procs, cmds):
                    line = p.stdout.readline()
                    if line.strip() != "ready":
                        raise RuntimeError(f"{label(c)}: {line.strip() or p.stderr.read()[-800:]}")
                for p in procs:
                    p.stdin.write("go\n")
                    p.stdin.flush()
            out = []
            for p in procs:
                stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
                out.append(([json.loads(x) for x in stdout.splitlines() if x.startswith("{")], stderr, p.returncode))
            return out
        finally:
            for p in procs:
                H.stop_proc(p)

    def workers(self, cmds, phases=1, timeout=600):
        """Run `bench/worker.py` clients as processes, releasing them together at each of their `phases`
        barriers; their JSON results, in order."""
        worker = [sys.executable, os.path.join(BENCH, "worker.py")]
        ran = self.together([worker + list(c) for c in cmds], phases, timeout,
                            lambda c: f"worker {' '.join(c[2:4])}")
        out = []
        for c, (lines, stderr, code) in zip(cmds, ran):
            if code != 0 or not lines:
                raise RuntimeError(f"worker {' '.join(c[:2])} failed ({code}): {stderr.strip()[-800:]}")
            out.append(lines[-1])
        return out

    def statbench(self, root, listfile, clients, passes=1, timeout=1800):
        """K statbench processes over the same list, released together; per client, its passes."""
        exe = self.setup.get("STATBENCH")
        if not exe:
            raise RuntimeError("statbench was not built")
        cmd = [exe, root, listfile, str(passes), "--barrier"]
        return [lines for lines, _, _ in self.together([cmd] * clients, 1, timeout, lambda c: "statbench")]

    def plot(self, name):
        """The path for a PNG plot, or None when matplotlib is missing."""
        if self.plot_dir is None:
            return None
        return os.path.join(self.plot_dir, name + ".png")

    def drop_caches(self):
        return H.drop_caches()


def setup_plots():
    try:
        import matplotlib
        matplotlib.use("Agg")
        return True
    except ImportError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the seeds' sizes (longer)")
    ap.add_argument("--only", help="comma-separated scenarios to run")
    ap.add_argument("--skip-peers", action="store_true", help="larder and direct only")
    ap.add_argument("--peers", help="only these peers, comma-separated (rclone, s3fs, juicefs) [all]")
    ap.add_argument("--latency", default="30ms", help="the link's round trip [30ms]")
    ap.add_argument("--bandwidth", type=H.parse_size, default=200 * MiB, help="the link's bandwidth [200MiB]")
    ap.add_argument("--stat-latency", default="1ms",
                    help="round trip of the stat storm's link [1ms]: at 30 ms, one client's pass over 20,000 "
                         "files would take 10 minutes")
    ap.add_argument("--cache-size", default="8GiB", help="larder's --cache-size where a scenario sets none")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--out-dir", default=os.path.join(BENCH, "results"))
    ap.add_argument("--name", help="result name [<date>-<host>]")
    for name in SCENARIOS:
        try:
            mod = importlib.import_module(f"scenarios.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"scenarios.{name}":
                raise
            continue  # reported when the scenario is asked for
        if hasattr(mod, "add_args"):
            mod.add_args(ap)  # a scenario's own sizes, --NAME-...
    a = ap.parse_args()
    only = SCENARIOS if not a.only else [s.strip() for s in a.only.split(",")]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario(s): {', '.join(unknown)} (have: {', '.join(SCENARIOS)})")
    if not os.path.exists(H.LARDER):
        sys.exit(f"{H.LARDER} is missing: cargo build --release -p larder (or set LARDER_BIN)")
    if os.geteuid() != 0:
        note("not root: page caches cannot be dropped, so 'cold' reads of direct are not cold")
    H.on_signals()
    name = a.name or f"{time.strftime('%Y-%m-%d')}-{socket.gethostname()}"
    cmdline = "bench/suite.py" + "".join(" " + x for x in sys.argv[1:])
    res = {"name": name, "command": cmdline, "config": {
        "full": a.full, "link": {"latency": a.latency, "bandwidth_MiB_s": a.bandwidth / MiB},
        "stat_latency": a.stat_latency, "cache_size": a.cache_size, "rclone_flags": RCLONE_FLAGS},
        "scenarios": {}}
    # s3fs and JuiceFS need s3s-fs, whose build takes minutes: asked for only when one of them runs.
    wants_s3 = not a.skip_peers and (not a.peers or bool({"s3fs", "juicefs"} & set(a.peers.split(","))))
    res["setup"] = H.bench_setup(res["config"], suite=True, peers=wants_s3)
    work = tempfile.mkdtemp(prefix="larder-bench-suite-", dir="/var/tmp")
    res["work_dir"] = work
    t_start = time.monotonic()
    ctx = None
    try:
        res["environment"] = H.environment()
        copy = os.path.join(work, "larder")
        shutil.copy2(H.LARDER, copy)
        H.LARDER = copy
        home = os.path.join(work, "s3root", "home")  # s3s-fs serves s3root: the bucket "home" is the home
        os.makedirs(home)
        ctx = Context(a, work, home, res["setup"])
        res["systems"] = [s.name for s in ctx.systems]
        if ctx.system("s3fs"):
            import s3fs_peer
            res["config"]["s3fs_options"] = s3fs_peer.S3FS_OPTIONS
        if ctx.system("juicefs"):
            import juicefs_peer
            res["config"]["juicefs_options"] = juicefs_peer.JUICEFS_OPTIONS
            res["environment"]["juicefs"] = H.run([res["setup"]["JUICEFS"], "version"], check=False).stdout.strip()
        res["skipped_systems"] = ctx.skipped
        os.makedirs(a.out_dir, exist_ok=True)
        if setup_plots():
            ctx.plot_dir = os.path.join(a.out_dir, name)
            os.makedirs(ctx.plot_dir, exist_ok=True)
        else:
            note("matplotlib is missing: no plots")
        res["environment"]["cpu_busy_at_start"] = H.cpu_busy()
        for s in only:
            mod = importlib.import_module(f"scenarios.{s}")
            log(f"=== {s}: {mod.TITLE}")
            t0 = time.monotonic()
            ctx.stop_servers()
            try:
                out = mod.run(ctx)
            except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as e:
                note(f"{s}: failed: {e}")
                out = {"error": str(e)}
                H.unmount_all()
            out["elapsed_s"] = round(time.monotonic() - t0, 1)
            res["scenarios"][s] = out
            log(f"=== {s}: {out['elapsed_s']} s")
    except KeyboardInterrupt:
        log("interrupted; cleaning up")
        H.cleanup()
        shutil.rmtree(work, ignore_errors=True)
        sys.exit(130)
    finally:
        H.cleanup()
        if a.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    res["elapsed_s"] = round(time.monotonic() - t_start, 1)
    res["environment"]["loadavg_end"] = os.getloadavg()
    res["notes"] = H._notes
    out_json = os.path.join(a.out_dir, name + ".json")
    with open(out_json, "w") as f:
        json.dump(res, f, indent=2)
    md = report(res, ctx, only)
    out_md = os.path.join(a.out_dir, name + ".md")
    with open(out_md, "w") as f:
        f.write(md)
    print(md)
    print(f"JSON: {out_json}\nMarkdown: {out_md}" + (f"\nPlots: {ctx.plot_dir}" if ctx and ctx.plot_dir else ""))


def report(res, ctx, only):
    env = res.get("environment", {})
    out = [f"# larder benchmark suite: {res['name']}", "",
           f"`{res['command']}` on this machine: {env.get('cpus')} CPUs ({env.get('cpu', '?')}), "
           f"{env.get('mem_GiB')} GiB RAM, kernel {env.get('kernel')}, {env.get('larder')} "
           f"(repository at {env.get('git')}); {res.get('elapsed_s', 0) / 60:.1f} minutes in all. "
           "Absolute figures are this machine's; every ratio compares two figures of this run.",
           "", f"Systems: {', '.join(res.get('systems', []))}."]
    for k, v in res.get("skipped_systems", {}).items():
        out.append(f"Skipped: {k} ({v}).")
    out.append(f"The link: {res['config']['link']['latency']} round trip, "
               f"{res['config']['link']['bandwidth_MiB_s']:g} MiB/s (larder `--emulate-wan`, peers through "
               "bench/wanproxy.py).")
    out.append("")
    for s in only:
        r = res["scenarios"].get(s)
        if r is None:
            continue
        mod = importlib.import_module(f"scenarios.{s}")
        out.append(f"## {mod.TITLE}")
        out.append("")
        if "error" in r:
            out.append(f"Failed: {r['error']}")
        else:
            try:
                out.append(mod.report(r, ctx))
            except Exception as e:  # noqa: BLE001 - a report bug must not lose the other scenarios
                out.append(f"(report failed: {e!r}; the figures are in the JSON)")
        out.append("")
        out.append(f"_{r.get('elapsed_s', 0):.0f} s._")
        out.append("")
    if res.get("notes"):
        out.append("## Notes")
        out.append("")
        out += [f"- {n}" for n in res["notes"]]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    main()
