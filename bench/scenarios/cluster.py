"""A cluster of larder nodes: peer hits, nodes reading one data set together, and a cold read through the
units' owners (design note 013; IMCa §5.5 for the nodes reading at once).

Every node is a larder daemon in a network namespace of its own (started there with `nsenter --net`, so
its FUSE mount stays visible), on a private bridge: 10.78.0.0/24, with the rest of 10.78.0.0/16 a
blackhole route in the root namespace, so nothing leaves the machine. Membership is in an etcd started in
the root namespace on the bridge's address; peer connections are mutual TLS with certificates from
`larder cluster init` and `larder cluster cert`. Each node's home calls pay the suite's link through its
own `--emulate-wan` (a link per node, each with the link's latency and bandwidth). Readers are processes
in the root namespace reading the nodes' mounts. Every mount starts with an empty cache and each file is
read once per mount, so the reading node's page cache never answers.

1. Peer hits of a large file (1 GiB; --cluster-file-size): node A (of two) reads it cold, so A and the
   owners of its units hold it; then B, a node that serves nothing (`--peer-serve off`: no unit is its
   own, so every unit it misses comes from a peer), reads it with an empty cache, once after the page
   cache is dropped (the peers read their caches from disk) and once more, as a fresh node, with the
   peers' page cache warm. Baselines: raw TCP between two of the namespaces (one Python stream of a few
   GiB), the link's bandwidth, the same file read cold by a node alone, and the local disk.
2. 4 KiB peer hits: small files (2,000 of 4 KiB; --cluster-small-files) read by A, then by B one after
   another, each once: open+read+close per file, median and 99th percentile. B's first 20 reads open its
   connections to the peers and are reported apart; of the rest, half are read with the peers' page
   cache warm and half after it is dropped. B has listed and stat'ed them first, so the figure is the
   data's path, not a lookup at home. Baselines: a sample of the files read by a node alone (from home)
   and from the local disk.
3. N = 1, 2, 4 nodes each reading one data set (512 MiB in 8 files; --cluster-set-size) whole, cold, at
   the same time (released together): aggregate MiB/s (N × the set over the slowest node's time) and
   the bytes home sent (the sum of the nodes' `home.bytes_read`), in a cluster and as N nodes alone.
4. One node of four reads the large file cold, the others idle with empty caches: its units come through
   their owners, each fetching its share from home over its own link. Against the link's bandwidth and
   the node alone of baseline 1; then again with the reader's `--ingest-streams 32`.
"""
import contextlib
import os
import random
import shutil
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import harness as H
from harness import MiB, log, note

TITLE = "Cluster: peer hits, nodes reading together, cold reads through owners (design 013, IMCa §5.5)"

# The private network: a bridge in the root namespace, one namespace per node, nothing routed elsewhere.
BRIDGE = "larderc-br"
NAMESPACES = [f"larderc-n{i}" for i in range(5)]  # four cluster nodes, and the reader that serves nothing
BLACKHOLE = "10.78.0.0/16"
BRIDGE_IP = "10.78.0.1"
PREFIX = 24
PEER_PORT = 7070
# The data at home: the large file, the 4 KiB files, the data set.
BIG = "cluster/big"
SMALL_DIR = "cluster/small"
SMALL_SIZE = 4096
SET_DIR = "cluster/set"
SET_FILES = 8
FIRST_READS = 20  # B's first 4 KiB reads, which open its connections to the peers, reported apart
SCALE_NODES = [1, 2, 4]
# Targets the project set for a cluster (ratios of figures of one run).
TARGET_PEER_OVER_LINK = 5.0
TARGET_PEER_OVER_TCP = 0.5
TARGET_SMALL_P50_MS = 0.5
TARGET_SMALL_P99_MS = 2.0
TARGET_ONE_OF_FOUR_OVER_LINK = 0.8
NETNS_DIR = "/var/run/netns"
BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_args(ap):
    ap.add_argument("--cluster-file-size", type=H.parse_size, default=1 << 30,
                    help="cluster: the large file's size [1GiB]")
    ap.add_argument("--cluster-small-files", type=int, default=2000,
                    help="cluster: 4 KiB files read for peer-hit latency [2000]")
    ap.add_argument("--cluster-home-samples", type=int, default=200,
                    help="cluster: of those, how many a node alone reads from home for the baseline [200]")
    ap.add_argument("--cluster-set-size", type=H.parse_size, default=512 * MiB,
                    help="cluster: the data set N nodes read together, in 8 files [512MiB]")
    ap.add_argument("--cluster-tcp-bytes", type=H.parse_size, default=4 << 30,
                    help="cluster: bytes of the raw TCP stream between two namespaces [4GiB]")


def ip(*args, check=True):
    return H.run(["ip"] + list(args), timeout=30, check=check)


class Net:
    """The bridge, the namespaces and their veth pairs; `down()` removes them, as it removes leftovers of
    a run that was killed before it could."""

    def __init__(self, count):
        self.namespaces = NAMESPACES[:count]

    @staticmethod
    def addr(i):
        return f"10.78.0.{10 + i}"

    def down(self):
        for i, ns in enumerate(NAMESPACES):
            if os.path.exists(os.path.join(NETNS_DIR, ns)):
                pids = ip("netns", "pids", ns, check=False).stdout.split()
                if pids:
                    note(f"cluster: namespace {ns} still has processes {', '.join(pids)}; its name is removed")
                ip("netns", "del", ns, check=False)
            if os.path.exists(f"/sys/class/net/larderc-v{i}"):
                ip("link", "del", f"larderc-v{i}", check=False)
        if os.path.exists(f"/sys/class/net/{BRIDGE}"):
            ip("link", "del", BRIDGE, check=False)
        if "blackhole" in ip("route", "show", BLACKHOLE, check=False).stdout:
            ip("route", "del", "blackhole", BLACKHOLE, check=False)

    def up(self):
        self.down()
        # First: whatever of 10.78.0.0/16 is not the bridge's /24 goes nowhere.
        ip("route", "add", "blackhole", BLACKHOLE)
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{BRIDGE_IP}/{PREFIX}", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        for i, ns in enumerate(self.namespaces):
            host, inside = f"larderc-v{i}", f"larderc-p{i}"
            ip("netns", "add", ns)
            ip("link", "add", host, "type", "veth", "peer", "name", inside)
            ip("link", "set", inside, "netns", ns)
            ip("link", "set", host, "master", BRIDGE)
            ip("link", "set", host, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", inside, "name", "eth0")
            ip("-n", ns, "addr", "add", f"{self.addr(i)}/{PREFIX}", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")

    def check(self, addr, port):
        """Every namespace reaches addr:port (a TCP connect from inside it)."""
        probe = f"import socket; socket.create_connection(({addr!r}, {port}), timeout=5).close()"
        for ns in self.namespaces:
            r = H.run(["nsenter", f"--net={NETNS_DIR}/{ns}", sys.executable, "-c", probe], timeout=30, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"namespace {ns} cannot reach {addr}:{port}: {r.stderr.strip()[-300:]}")


def free_port(addr):
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def wait_tcp(addr, port, seconds, proc):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=1):
                return True
        except OSError:
            if proc.poll() is not None:
                return False
            time.sleep(0.1)
    return False


def start_etcd(ctx):
    """An etcd of the run's own in the root namespace, on the bridge's address; its endpoint."""
    if not shutil.which("etcd"):
        raise RuntimeError("etcd is not installed (Debian's etcd-server; scripts/bench-setup.sh --suite installs it)")
    client, peer = free_port(BRIDGE_IP), free_port(BRIDGE_IP)
    data = ctx.scratch("cluster-etcd")
    c_url, p_url = f"http://{BRIDGE_IP}:{client}", f"http://{BRIDGE_IP}:{peer}"
    cmd = ["etcd", "--name", "bench", "--data-dir", os.path.join(data, "data"),
           "--listen-client-urls", c_url, "--advertise-client-urls", c_url,
           "--listen-peer-urls", p_url, "--initial-advertise-peer-urls", p_url,
           "--initial-cluster", f"bench={p_url}"]
    p = H.spawn(cmd, os.path.join(ctx.work, "cluster-etcd.log"))
    if not wait_tcp(BRIDGE_IP, client, 60, p):
        raise RuntimeError("etcd did not come up (see cluster-etcd.log in the work directory)")
    return p, f"etcd://{BRIDGE_IP}:{client}"


def make_certs(ctx, names):
    tls = ctx.scratch("cluster-tls")
    os.rmdir(tls)  # `larder cluster init` makes the directory, and refuses one that holds a CA
    H.run([H.LARDER, "cluster", "init", tls])
    for n in names:
        H.run([H.LARDER, "cluster", "cert", tls, n])
    return tls


class Node:
    """A larder mount whose daemon runs in the namespace of node `index`, with a cache of its own; in
    cluster `cluster` when that is set, serving its units to the others unless not `serve`. `access` is
    how it reaches home and whether it writes: by default read-only, behind the suite's link."""

    def __init__(self, ctx, index, tag, cluster=None, serve=True, flags=(), access=None):
        self.ctx, self.index, self.ns = ctx, index, NAMESPACES[index]
        self.name = f"n{index}"
        self.addr = Net.addr(index)
        self.mnt = ctx.scratch(f"mnt-cluster-{tag}-{self.name}")
        self.cache = ctx.scratch(f"cache-cluster-{tag}-{self.name}")
        self.cluster, self.serve, self.flags = cluster, serve, list(flags)
        self.access = ["--read-only", "--emulate-wan", ctx.wan.larder_spec()] if access is None else list(access)
        self.pid = None

    def mount(self, shared):
        a = self.ctx.args
        flags = ["--cache-size", str(a.cache_size), "--validity-lag", "1h"] + self.access + self.flags
        if self.cluster:
            flags += ["--cluster", shared["etcd"], "--cluster-name", self.cluster, "--node-name", self.name,
                      "--cluster-tls", shared["tls"]]
            flags += ["--listen", f"{self.addr}:{PEER_PORT}"] if self.serve else ["--peer-serve", "off"]
        cmd = ["nsenter", f"--net={NETNS_DIR}/{self.ns}", H.LARDER, "mount", self.ctx.home, self.mnt,
               "--cache-dir", self.cache] + flags
        H._mounts.append(("larder", self.mnt))
        r = H.run(cmd, timeout=120, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"larder mount ({self.name}) failed: {r.stderr.strip() or r.stdout.strip()}")
        if not H.wait_mounted(self.mnt, 30):
            raise RuntimeError(f"larder did not mount {self.mnt}")
        self.pid = self.status().get("pid")
        return cmd

    def status(self):
        return H.larder_status(self.mnt)

    def path(self, rel):
        return os.path.join(self.mnt, rel)

    def unmount(self):
        H.unmount("larder", self.mnt)
        H.forget_mount(self.mnt)
        shutil.rmtree(self.cache, ignore_errors=True)


@contextlib.contextmanager
def nodes(ctx, shared, tag, indices, cluster=True, client=None, flags=(), access=None):
    """Fresh mounts of the nodes `indices` (and `client`, a node that serves nothing), in cluster
    `tag` if `cluster`, each reaching home as `access` says (see Node); each sees every member live
    before this yields."""
    cname = f"bench-{tag}" if cluster else None
    ns = [Node(ctx, i, tag, cname, flags=flags, access=access) for i in indices]
    if client is not None:
        ns.append(Node(ctx, client, tag, cname, serve=False, access=access))
    try:
        for n in ns:
            cmd = n.mount(shared)
            shared.setdefault("commands", {}).setdefault(tag, []).append(" ".join(cmd))
        if cluster:
            wait_views(ns)
        yield ns
    finally:
        for n in reversed(ns):
            n.unmount()


def wait_views(ns, seconds=30):
    """Wait until every node's view has every node live."""
    deadline = time.monotonic() + seconds
    want = len(ns)
    while True:
        live = [sum(1 for m in (H.get(n.status(), "cluster", "members") or []) if m.get("live")) for n in ns]
        if all(x == want for x in live):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster views did not converge in {seconds} s (live members seen: {live})")
        time.sleep(0.2)


def walk(st):
    """The status's walk tiers by name: hits and bytes."""
    return {t["name"]: {k: t.get(k) for k in ("hits", "misses", "errors", "bytes", "mean_us")}
            for t in (H.get(st, "tiers", "walk") or [])}


def node_figures(n):
    st = n.status()
    out = {"home_bytes_read": H.get(st, "home", "bytes_read"), "home_ops": H.get(st, "home", "ops"),
           "walk": walk(st)}
    if H.get(st, "peers"):
        p = st["peers"]
        out["peers"] = {k: p.get(k) for k in ("fetches", "hits", "misses", "failures", "bytes", "served",
                                             "served_bytes", "refused")}
    if H.get(st, "cluster"):
        out["owned_bytes"] = st["cluster"].get("owned_bytes")
    return out


def timed_read(ctx, cmds, timeout, pids):
    """Worker commands run together (one process each), with the daemons' CPU seconds: the slowest
    process's time and the bytes read."""
    def go():
        out = ctx.workers(cmds, timeout=timeout)
        return {"seconds": round(max(o["seconds"] for o in out), 3), "bytes": sum(o["bytes"] for o in out),
                "per_reader_s": [round(o["seconds"], 3) for o in out]}
    return H.with_cpu(pids, go)


def read_big(ctx, node, size, pids, drop=True):
    """One process reads the large file whole on `node`, page cache dropped first (if `drop`)."""
    if drop:
        ctx.drop_caches()
    r = timed_read(ctx, [["read", node.path(BIG), "0", str(size)]], read_timeout(size), pids)
    if r["bytes"] != size:
        note(f"cluster: {r['bytes']} of {size} bytes of the large file read on {node.name}")
    r["MiB_s"] = round(size / MiB / r["seconds"], 1)
    return r


def read_timeout(size):
    return max(120, int(size / (5 * MiB)))  # even at 5 MiB/s


def pids_of(ns):
    return {n.name: n.pid for n in ns if n.pid}


def list_and_stat(node, rel_dir, names, seconds=300, threads=8):
    """List a directory on `node` and stat the named files in it, by `threads` at once (each stat a node
    has not seen asks home): the metadata warm, the data cold. Seconds taken."""
    t0 = time.monotonic()
    d = node.path(rel_dir)
    listed = set(os.listdir(d))
    paths = [os.path.join(d, n) for n in names if n in listed]
    if len(paths) != len(names):
        raise RuntimeError(f"{rel_dir} on {node.name} lists {len(paths)} of {len(names)} files")
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(os.stat, paths, timeout=seconds):
            pass
    return round(time.monotonic() - t0, 3)


def small_latencies(d, names, seconds=300):
    """Open, read 4 KiB and close each file of directory `d` once, in the order given; per-file seconds."""
    out = []
    short = 0
    t_end = time.monotonic() + seconds
    for name in names:
        p = os.path.join(d, name)
        t0 = time.perf_counter()
        fd = os.open(p, os.O_RDONLY)
        try:
            n = len(os.read(fd, SMALL_SIZE))
        finally:
            os.close(fd)
        out.append(time.perf_counter() - t0)
        if n != SMALL_SIZE:
            short += 1
        if time.monotonic() > t_end:
            note(f"cluster: 4 KiB reads in {d} stopped after {len(out)} files ({seconds} s)")
            break
    if short:
        note(f"cluster: {short} short 4 KiB reads in {d}")
    return out


def small_figures(d, names):
    """small_latencies' figures, and every latency (µs, in the order read)."""
    lat = small_latencies(d, names)
    return dict(lat_stats(lat), latencies_us=[round(x * 1e6) for x in lat])


def lat_stats(lat):
    """Count, mean, median, 90th and 99th percentiles and maximum of per-file seconds, in ms."""
    s = sorted(lat)
    if not s:
        return {}

    def q(p):
        return round(s[min(len(s) - 1, int(p * len(s)))] * 1e3, 4)
    return {"files": len(s), "mean_ms": round(sum(s) / len(s) * 1e3, 4), "p50_ms": q(0.5), "p90_ms": q(0.9),
            "p99_ms": q(0.99), "max_ms": round(s[-1] * 1e3, 4)}


def warm_small(ctx, node, names, parts=8):
    """Read every small file on `node`, by `parts` processes at once (each file pays home's round trip)."""
    lists = []
    for k in range(parts):
        path = os.path.join(ctx.work, f"cluster-small-{k}.list")
        with open(path, "w") as f:
            f.writelines(f"{SMALL_DIR}/{n}\n" for n in names[k::parts])
        lists.append(path)
    out = ctx.workers([["trace", node.mnt, p] for p in lists], timeout=900)
    errors = sum(o["errors"] for o in out)
    if errors:
        note(f"cluster: {errors} small files failed to read on {node.name}")
    return round(max(o["seconds"] for o in out), 3)


def make_data(ctx, size, small, set_size):
    d = ctx.subhome("cluster")
    big = os.path.join(d, "big")
    if not os.path.exists(big) or os.path.getsize(big) != size:
        log(f"cluster: writing a {size / MiB:.0f} MiB file at home")
        H.write_random(big, size)
    sd = ctx.subhome(SMALL_DIR)
    names = [f"f{i:05d}" for i in range(small)]
    H.random_files(sd, names, SMALL_SIZE)
    setd = ctx.subhome(SET_DIR)
    part = set_size // SET_FILES
    files = []
    for i in range(SET_FILES):
        p = os.path.join(setd, f"part{i}")
        if not os.path.exists(p) or os.path.getsize(p) != part:
            H.write_random(p, part)
        files.append(f"{SET_DIR}/part{i}")
    return names, files, part * SET_FILES


def raw_tcp(ctx, src, dst, size):
    """One TCP stream of `size` bytes from namespace `src` to `dst` (Python sendall / recv_into, 4 MiB)."""
    worker = [sys.executable, os.path.join(BENCH, "worker.py")]
    addr = Net.addr(dst)
    port = 7171
    seconds = 60
    recv = ["nsenter", f"--net={NETNS_DIR}/{NAMESPACES[dst]}"] + worker + ["tcp-recv", addr, str(port), str(seconds)]
    send = ["nsenter", f"--net={NETNS_DIR}/{NAMESPACES[src]}"] + worker + ["tcp-send", addr, str(port), str(size),
                                                                          str(seconds)]
    ran = ctx.together([recv, send], 1, seconds + 60, lambda c: f"raw TCP {c[-4]}")
    for (lines, stderr, code), what in zip(ran, ("receiver", "sender")):
        if code != 0 or not lines:
            raise RuntimeError(f"raw TCP {what} failed ({code}): {stderr.strip()[-800:]}")
    r = ran[0][0][-1]
    return {"bytes": r["bytes"], "seconds": round(r["seconds"], 3), "MiB_s": round(r["MiB_s"], 1)}


def require(scenario):
    """What every scenario of nodes in namespaces needs: root, and nsenter."""
    if os.geteuid() != 0:
        raise RuntimeError(f"the {scenario} scenario needs root (network namespaces)")
    if not shutil.which("nsenter"):
        raise RuntimeError("nsenter is missing (util-linux)")


@contextlib.contextmanager
def network(ctx, count):
    """The private network with `count` namespaces, an etcd on its bridge, and certificates for nodes n0
    to n<count-1>: yields what `nodes()` takes as `shared`. On exit every mount is unmounted, etcd
    stopped, and the namespaces, the bridge and the route removed."""
    net = Net(count)
    etcd = None
    try:
        net.up()
        etcd, endpoint = start_etcd(ctx)
        net.check(BRIDGE_IP, int(endpoint.rsplit(":", 1)[1]))
        yield {"etcd": endpoint, "tls": make_certs(ctx, [f"n{i}" for i in range(count)])}
    finally:
        H.unmount_all()
        if etcd is not None:
            H.stop_proc(etcd)
        net.down()


def run(ctx):
    a = ctx.args
    require("cluster")
    size, set_size = a.cluster_file_size, a.cluster_set_size
    small_names, set_files, set_size = make_data(ctx, size, a.cluster_small_files, set_size)
    res = {"size": size, "small_files": len(small_names), "small_size": SMALL_SIZE, "set_size": set_size,
           "set_files": SET_FILES, "link": ctx.wan.describe(),
           "link_MiB_s": ctx.wan.bandwidth / MiB if ctx.wan.bandwidth else None, "link_latency": ctx.wan.latency,
           "network": f"bridge {BRIDGE} {BRIDGE_IP}/{PREFIX}, blackhole {BLACKHOLE}, a namespace per node"}
    with network(ctx, len(NAMESPACES)) as shared:
        res["baseline"] = baselines(ctx, shared, size, small_names)
        res["peer"] = peer_hits(ctx, shared, size, small_names)
        res["scale"] = scale(ctx, shared, set_files, set_size)
        res["one_of_four"] = one_of_four(ctx, shared, size)
        res["commands"] = shared.get("commands", {})
    res["targets"] = targets(res)
    return res


def baselines(ctx, shared, size, small_names):
    """Raw TCP between two namespaces; the local disk (home read directly, page cache dropped); a node
    alone reading from home."""
    out = {}
    log(f"cluster: raw TCP, {ctx.args.cluster_tcp_bytes / MiB:.0f} MiB from {NAMESPACES[0]} to {NAMESPACES[4]}")
    out["tcp"] = raw_tcp(ctx, 0, 4, ctx.args.cluster_tcp_bytes)
    sample = random.Random(11).sample(small_names, min(len(small_names), ctx.args.cluster_home_samples))
    ctx.drop_caches()
    log("cluster: the local disk: the large file and 4 KiB files read at home directly, page cache dropped")
    out["disk_big"] = H.seq_read(os.path.join(ctx.home, BIG), read_timeout(size))
    ctx.drop_caches()
    out["disk_small"] = small_figures(os.path.join(ctx.home, SMALL_DIR), sample)
    with nodes(ctx, shared, "alone", [0], cluster=False) as (n,):
        log("cluster: a node alone reads the large file cold from home")
        out["home_cold"] = read_big(ctx, n, size, pids_of([n]))
        out["home_small_stat_s"] = list_and_stat(n, SMALL_DIR, sample)
        ctx.drop_caches()
        log(f"cluster: a node alone reads {len(sample)} 4 KiB files from home, one after another")
        out["home_small"] = small_figures(n.path(SMALL_DIR), sample)
        out["node"] = node_figures(n)
    return out


def peer_hits(ctx, shared, size, small_names):
    """Node A reads the large file and the small files cold; then B, serving nothing, reads them from
    the peers: half the small files while the peers' page cache still holds them, the other half and the
    large file after it is dropped (the peers read their caches from disk), and the large file again on a
    fresh B with the peers' page cache warm."""
    out = {}
    with nodes(ctx, shared, "peer", [0, 1], client=4) as (na, nb, reader):
        servers = (na, nb)
        pids = pids_of([na, nb, reader])
        log("cluster: node A (of two) reads the large file cold")
        out["a_cold"] = read_big(ctx, na, size, pids)
        log(f"cluster: node A reads {len(small_names)} 4 KiB files (8 processes)")
        out["a_small_s"] = warm_small(ctx, na, small_names)
        out["reader_stat_s"] = list_and_stat(reader, SMALL_DIR, small_names)
        os.stat(reader.path(BIG))
        order = list(small_names)
        random.Random(5).shuffle(order)
        # B's first asks open its connections to the peers (TLS handshakes, TCP and HTTP/2 windows still
        # small): reported apart, not mixed into the steady state.
        first, rest = order[:FIRST_READS], order[FIRST_READS:]
        log(f"cluster: node B reads {len(first)} 4 KiB files from the peers: its first asks, new connections")
        out["b_small_first"] = measured(reader, servers, lambda: small_figures(reader.path(SMALL_DIR), first))
        half = len(rest) // 2
        log(f"cluster: node B reads {half} 4 KiB files from the peers, one after another (their page cache warm)")
        out["b_small_warm"] = measured(reader, servers, lambda: small_figures(reader.path(SMALL_DIR), rest[:half]))
        ctx.drop_caches()
        log(f"cluster: node B reads {len(rest) - half} more 4 KiB files from the peers (their page cache dropped)")
        out["b_small_dropped"] = measured(reader, servers, lambda: small_figures(reader.path(SMALL_DIR),
                                                                                 rest[half:]))
        log("cluster: node B reads the large file from the peers (their page cache dropped)")
        out["b_big_dropped"] = measured(reader, servers, lambda: read_big(ctx, reader, size, pids))
        out["nodes"] = {n.name: node_figures(n) for n in (na, nb, reader)}
        reader.unmount()
        fresh = Node(ctx, reader.index, "peer-fresh", reader.cluster, serve=False)
        fresh.mount(shared)
        wait_views([na, nb, fresh])
        os.stat(fresh.path(BIG))
        log("cluster: a fresh node B reads the large file from the peers (their page cache warm)")
        out["b_big_warm"] = measured(fresh, servers, lambda: read_big(ctx, fresh, size, pids_of([na, nb, fresh]),
                                                                         drop=False))
        fresh.unmount()
    return out


def measured(reader, servers, fn):
    """fn()'s figures, with what the reader's and the servers' counters moved by meanwhile."""
    before = {n.name: node_figures(n) for n in (reader,) + tuple(servers)}
    r = fn()
    r["reader"] = delta(before[reader.name], node_figures(reader))
    r["servers"] = {n.name: delta(before[n.name], node_figures(n)) for n in servers}
    return r


def delta(before, after):
    """What a node's counters moved by: home bytes and calls, and each walk tier's answers, hits, bytes and
    mean time per answer (µs)."""
    d = {"home_bytes_read": (after.get("home_bytes_read") or 0) - (before.get("home_bytes_read") or 0),
         "home_ops": (after.get("home_ops") or 0) - (before.get("home_ops") or 0)}
    for tier, v in after.get("walk", {}).items():
        b = before.get("walk", {}).get(tier, {})

        def answers(t):
            return sum(t.get(k) or 0 for k in ("hits", "misses", "errors"))
        n = answers(v) - answers(b)
        d[f"{tier}_hits"] = (v.get("hits") or 0) - (b.get("hits") or 0)
        d[f"{tier}_bytes"] = (v.get("bytes") or 0) - (b.get("bytes") or 0)
        if n > 0:
            spent = (v.get("mean_us") or 0) * answers(v) - (b.get("mean_us") or 0) * answers(b)
            d[f"{tier}_mean_us"] = round(spent / n, 1)
    if "peers" in after:
        d["served"] = (after["peers"].get("served") or 0) - (H.get(before, "peers", "served") or 0)
    return d


def scale(ctx, shared, set_files, set_size):
    out = {}
    for mode in ("alone", "cluster"):
        for n in SCALE_NODES:
            tag = f"scale-{mode}-{n}"
            with nodes(ctx, shared, tag, list(range(n)), cluster=mode == "cluster") as ns:
                ctx.drop_caches()
                log(f"cluster: {n} node(s) {'in a cluster' if mode == 'cluster' else 'alone'} read the data set")
                cmds = [["reread", "1"] + [m.path(f) for f in set_files] for m in ns]
                r = timed_read(ctx, cmds, read_timeout(set_size * n), pids_of(ns))
                figs = [node_figures(m) for m in ns]
            if r["bytes"] != set_size * n:
                note(f"cluster: {tag}: {r['bytes']} of {set_size * n} bytes read")
            r["aggregate_MiB_s"] = round(n * set_size / MiB / r["seconds"], 1)
            r["home_bytes_read"] = sum(f.get("home_bytes_read") or 0 for f in figs)
            r["home_over_set"] = round(r["home_bytes_read"] / set_size, 3)
            r["peer_bytes"] = sum(H.get(f, "walk", "peer", "bytes") or 0 for f in figs)
            out.setdefault(mode, {})[str(n)] = r
    return out


def one_of_four(ctx, shared, size):
    """One node of four reads the large file cold; then the same on fresh nodes whose reader brings in
    more blocks at once (each unit through its owner costs a hop more than from home)."""
    out = {}
    for label, flags in (("default", []), ("ingest32", ["--ingest-streams", "32"])):
        with nodes(ctx, shared, f"four-{label}", [0, 1, 2, 3], flags=flags) as ns:
            log(f"cluster: one node of four reads the large file cold ({' '.join(flags) or 'default flags'})")
            r = read_big(ctx, ns[0], size, pids_of(ns))
            r["flags"] = flags
            r["nodes"] = {n.name: node_figures(n) for n in ns}
        out[label] = r
    return out


def targets(r):
    """Each target: the figure, its value, its baseline, the ratio compared, the target, whether met."""
    link = r.get("link_MiB_s")
    tcp = H.get(r, "baseline", "tcp", "MiB_s")
    alone = H.get(r, "baseline", "home_cold", "MiB_s")
    home_p50 = H.get(r, "baseline", "home_small", "p50_ms")
    home_p99 = H.get(r, "baseline", "home_small", "p99_ms")
    out = []

    def row(what, value, base, target, met, ratio=True):
        out.append({"what": what, "value": value, "baseline": base,
                    "ratio": H.ratio(value, base) if ratio else None, "target": target,
                    "met": None if met is None or value is None else bool(met)})
    for key, how in (("b_big_warm", "peers' page cache warm"), ("b_big_dropped", "peers' page cache dropped")):
        b = H.get(r, "peer", key, "MiB_s")
        q_link, q_tcp = H.ratio(b, link), H.ratio(b, tcp)
        row(f"large file from peers ({how}), MiB/s; ÷ the link", b, link, f"≥ {TARGET_PEER_OVER_LINK:g} ×",
            q_link is not None and q_link >= TARGET_PEER_OVER_LINK)
        row(f"large file from peers ({how}), MiB/s; ÷ raw TCP", b, tcp, f"≥ {TARGET_PEER_OVER_TCP:g} ×",
            q_tcp is not None and q_tcp >= TARGET_PEER_OVER_TCP)
    for key, how in (("b_small_warm", "peers' page cache warm"), ("b_small_dropped", "peers' page cache dropped")):
        p50, p99 = H.get(r, "peer", key, "p50_ms"), H.get(r, "peer", key, "p99_ms")
        row(f"4 KiB peer hit ({how}), median ms; ÷ from home", p50, home_p50, f"≤ {TARGET_SMALL_P50_MS:g} ms",
            p50 is not None and p50 <= TARGET_SMALL_P50_MS)
        row(f"4 KiB peer hit ({how}), p99 ms; ÷ from home", p99, home_p99, f"≤ {TARGET_SMALL_P99_MS:g} ms",
            p99 is not None and p99 <= TARGET_SMALL_P99_MS)
    for key, how in (("default", "default flags"), ("ingest32", "--ingest-streams 32")):
        four = H.get(r, "one_of_four", key, "MiB_s")
        q = H.ratio(four, link)
        row(f"one node of four, cold ({how}), MiB/s; ÷ the link", four, link,
            f"≥ {TARGET_ONE_OF_FOUR_OVER_LINK:g} ×", q is not None and q >= TARGET_ONE_OF_FOUR_OVER_LINK)
        row(f"one node of four, cold ({how}), MiB/s; ÷ a node alone", four, alone, "—", None)
    return out


def yes_no(met):
    return "—" if met is None else ("yes" if met else "**no**")


def fmt_cpu(cpu):
    if not cpu:
        return "—"
    return ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())


def report(r, ctx):
    md = H.md_table
    base, peer = r["baseline"], r["peer"]
    lines = [f"Nodes in network namespaces of their own on a private bridge, membership in etcd, peers over "
             f"mutual TLS; each node's home behind its own emulated link ({r['link']}). Large file "
             f"{r['size'] / MiB:.0f} MiB; {r['small_files']} files of 4 KiB; a data set of "
             f"{r['set_size'] / MiB:.0f} MiB in {r['set_files']} files. Every mount starts with an empty cache, "
             "and each file is read once per mount, so the reading node's page cache never answers. Node B "
             "serves nothing (`--peer-serve off`): every unit it misses comes from a peer. Figures are this "
             "machine's; every ratio is of figures of this run.", ""]
    rows = [[t["what"], t["value"], t["baseline"], t["ratio"], t["target"], yes_no(t["met"])]
            for t in r["targets"]]
    lines += [md(["figure; compared with", "value", "baseline", "ratio", "target", "met"], rows), ""]
    lines += [f"Baselines, same run: raw TCP between two namespaces {H.fmt(base['tcp']['MiB_s'])} MiB/s (one "
              f"Python stream of {base['tcp']['bytes'] / MiB:,.0f} MiB); the link {H.fmt(r['link_MiB_s'])} MiB/s; "
              f"a node alone reading the large file cold from home {H.fmt(base['home_cold']['MiB_s'])} MiB/s; "
              f"the local disk (the file at home, page cache dropped) {H.fmt(base['disk_big']['MiB_s'])} MiB/s. "
              f"Node A (of two) read it cold at {H.fmt(peer['a_cold']['MiB_s'])} MiB/s.", ""]
    rows = []
    for key, how in (("b_big_warm", "peers' page cache warm"), ("b_big_dropped", "peers' page cache dropped")):
        x = peer.get(key) or {}
        rd = x.get("reader", {})
        srv = x.get("servers", {})
        rows.append([how, x.get("MiB_s"), rd.get("peer_hits"), rd.get("peer_mean_us"),
                     ", ".join(f"{k} {v.get('cache_mean_us', 0) or 0:,.0f}" for k, v in srv.items()),
                     round(rd.get("home_bytes_read", 0) / MiB, 1), fmt_cpu(x.get("cpu_s")), x.get("other_busy")])
    lines += [md(["node B reads the large file", "MiB/s", "units from peers", "µs per unit at B",
                  "µs per unit read from each peer's cache", "MiB from home", "daemons' CPU s",
                  "CPUs busy with other work"], rows), ""]
    rows = []
    for label, x in (("node B from peers, its first reads (new connections)", peer.get("b_small_first")),
                     ("node B from peers, peers' page cache warm", peer.get("b_small_warm")),
                     ("node B from peers, peers' page cache dropped", peer.get("b_small_dropped")),
                     ("a node alone, from home", base.get("home_small")),
                     ("the local disk (home directly, page cache dropped)", base.get("disk_small"))):
        x = x or {}
        rows.append([label, x.get("files"), x.get("p50_ms"), x.get("p90_ms"), x.get("p99_ms"), x.get("max_ms"),
                     x.get("mean_ms"), H.get(x, "reader", "peer_hits"), H.get(x, "reader", "home_ops")])
    lines += [md(["4 KiB files, open+read+close", "files", "median ms", "p90 ms", "p99 ms", "max ms", "mean ms",
                  "peer hits", "home calls"], rows), ""]
    sc = r["scale"]
    alone1 = H.get(sc, "alone", "1", "aggregate_MiB_s")
    rows = []
    for mode in ("alone", "cluster"):
        for n in map(str, SCALE_NODES):
            x = H.get(sc, mode, n)
            if not x:
                continue
            rows.append([n, "alone" if mode == "alone" else "a cluster", x["aggregate_MiB_s"], x["seconds"],
                         H.ratio(x["aggregate_MiB_s"], alone1), x["home_over_set"], round(x["peer_bytes"] / MiB),
                         fmt_cpu(x.get("cpu_s")), x.get("other_busy")])
    lines += [f"N nodes each read the {r['set_size'] / MiB:.0f} MiB data set whole, cold, released together "
              "(one process per node); aggregate = N × the set ÷ the slowest node's time. Nodes alone each have "
              "their own emulated link, so N of them have N links' bandwidth between them; a real home's "
              "would be shared.", "",
              md(["N", "nodes", "aggregate MiB/s", "slowest s", "÷ one node alone", "home bytes ÷ set",
                  "MiB from peers", "daemons' CPU s", "CPUs busy with other work"], rows), ""]
    rows = []
    for key, x in r["one_of_four"].items():
        rows.append([" ".join(x.get("flags") or []) or "default", x["MiB_s"], H.ratio(x["MiB_s"], r["link_MiB_s"]),
                     ", ".join(f"{k} {(v.get('home_bytes_read') or 0) / MiB:,.0f}" for k, v in x["nodes"].items()),
                     round(H.get(x, "nodes", "n0", "walk", "peer", "mean_us") or 0),
                     round(H.get(x, "nodes", "n0", "walk", "home", "mean_us") or 0), fmt_cpu(x.get("cpu_s"))])
    lines += ["One node of four (n0) reads the large file cold; the others idle with empty caches.", "",
              md(["reader's flags", "MiB/s", "÷ the link", "MiB from home by node", "µs per unit from an owner",
                  "µs per unit from home", "daemons' CPU s"], rows)]
    return "\n".join(lines)
