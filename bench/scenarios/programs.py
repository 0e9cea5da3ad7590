"""Real programs on the default (write-back) mount, home 10 ms away, against the same on the local disk.

`tar x` of a tree of about 5,000 entries, `git clone` of a repository of about 900 files (from a local
path outside the mount into it), `cp -a` of the extracted tree within the mount and `rm -rf` of the copy:
each timed on larder and on the local disk (`direct`) in the same run; the target is 10 × the local disk
at most; then `tar x` of the tarball again, right after the `rm -rf` (files made where as many were just
removed, as `make clean && make` does). libfuse's passthrough_hp (when `scripts/bench-setup.sh` built it) runs them too, over the same
disk without the link: what a FUSE file system that adds nothing pays for the same calls here. Then, with
the tree pushed home and the validity lag (the default, 15 s) passed, `find | xargs cat` over it: home
calls per directory (target: at most one), from larder's status: the directories walked are the tree's
and, for the walk's `cd`, the ones above it; the status command's own call for home's capacity (statfs)
is not counted.

--programs-dirs scales the tree and the repository (for a quick run). Peers named by --programs-peers
(juicefs) run the programs too, on a disk of their own, their home behind the same 10 ms link (none by
default: JuiceFS asks its Redis many round trips per file, so its `tar x` of the whole tree alone takes
about 20 minutes there); their failures and unfinished programs are recorded, not fatal.

Where `perf` can count the kernel's `fuse:fuse_request_send` tracepoint (root), each program's FUSE
requests are counted too (system-wide, while it runs; nothing else uses FUSE during the scenario): requests
per file of the tree, and the time per request, tell what FUSE itself costs from what a file system adds.
"""
import contextlib
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import time

import harness as H
from harness import log

TITLE = "Real programs at 10 ms (tar x, git clone, cp -a, rm -rf, find | xargs cat)"
LATENCY = "10ms"
DIRS, FILES_PER_DIR = 50, 99   # 50 directories + 4,950 files
REPO_FILES = 900
# The default validity lag (`larder mount --validity-lag`): the programs run on the default mount.
LAG = 15.0
DISK_BYTES = 8 << 30
PROGRAM_TIMEOUT = 1800  # seconds one program may take


def add_args(ap):
    ap.add_argument("--programs-dirs", type=int, default=DIRS,
                    help=f"programs: directories of {FILES_PER_DIR} files in the tree, the repository "
                         f"{REPO_FILES // DIRS} files per directory of the tree [{DIRS}]")
    ap.add_argument("--programs-peers", default="",
                    help="programs: peers that run the programs too, comma-separated (juicefs) [none: at 10 ms "
                         "JuiceFS's tar x alone takes minutes]")


@contextlib.contextmanager
def fresh_disk(ctx, name):
    """A new file system for one system's run, with the home and the work directory (the cache's) moved onto
    it: ext4 without a journal, as this machine's disk, on a loop device over a sparse file of that disk.

    Not the disk itself: there a create skips, one by one, every inode freed in the last minute (several,
    while the inode table is not written back), and what earlier runs and scenarios removed slowed the local
    disk's own `tar x` from 0.12 s to 2.5-3.3 s in runs a minute apart, whichever system came first."""
    img, mnt = os.path.join(ctx.work, f"{name}.img"), os.path.join(ctx.work, name)
    with open(img, "wb") as f:
        f.truncate(DISK_BYTES)
    H.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "nodiscard", img])
    os.makedirs(mnt, exist_ok=True)
    H.run(["mount", "-o", "loop,discard", img, mnt])
    home, work = ctx.home, ctx.work
    ctx.home, ctx.work = os.path.join(mnt, "home"), mnt
    os.makedirs(ctx.home)
    try:
        yield
    finally:
        ctx.home, ctx.work = home, work
        ctx.stop_servers()  # a peer's servers (s3s-fs) may serve this disk
        H.run(["umount", mnt], check=False)
        os.remove(img)


def make_sources(work, dirs, repo_files):
    """A tarball of a tree of `dirs` directories and a git repository of `repo_files` files, outside every
    mount."""
    src = os.path.join(work, "programs-src")
    tar = os.path.join(work, f"tree-{dirs}.tar")
    repo = os.path.join(work, f"repo-{repo_files}")
    if os.path.exists(tar) and os.path.isdir(os.path.join(repo, ".git")):
        return tar, repo
    shutil.rmtree(src, ignore_errors=True)
    rng = random.Random(11)
    for d in range(dirs):
        dd = os.path.join(src, "tree", f"d{d:02d}")
        os.makedirs(dd)
        for f in range(FILES_PER_DIR):
            with open(os.path.join(dd, f"f{f:03d}.txt"), "wb") as fh:
                fh.write(rng.randbytes(rng.randrange(0, 8192)))
    with tarfile.open(tar, "w") as t:
        t.add(os.path.join(src, "tree"), arcname="tree")
    shutil.rmtree(repo, ignore_errors=True)
    os.makedirs(repo)
    for i in range(repo_files):
        d = os.path.join(repo, f"pkg{i % 30:02d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"m{i:04d}.c"), "w") as fh:
            fh.write(f"int f{i}(void) {{ return {i}; }}\n" * (1 + rng.randrange(40)))
    env = dict(os.environ, GIT_AUTHOR_NAME="b", GIT_AUTHOR_EMAIL="b@b", GIT_COMMITTER_NAME="b",
               GIT_COMMITTER_EMAIL="b@b")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "tree"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env, timeout=300)
    shutil.rmtree(src, ignore_errors=True)
    return tar, repo


EVENT = "fuse:fuse_request_send"


def can_count_requests():
    """Whether `perf stat` can count FUSE requests here (root, perf installed, the tracepoint present)."""
    if os.geteuid() != 0 or not shutil.which("perf"):
        return False
    r = H.run(["perf", "stat", "-e", EVENT, "-a", "-x", ",", "--", "true"], check=False, timeout=60)
    return r.returncode == 0


def timed(cmd, cwd=None, failures=None, requests=None, key=None):
    """Seconds `cmd` took. With a list `failures`, a failing exit is recorded there rather than raised. With a
    dict `requests`, the FUSE requests sent while it ran are counted (`perf stat`) into `requests[key]`."""
    counted = None
    if requests is not None:
        fd, counted = tempfile.mkstemp(prefix=f"larder-requests-{key}-", suffix=".csv")
        os.close(fd)
        cmd = ["perf", "stat", "-e", EVENT, "-a", "-x", ",", "-o", counted, "--"] + cmd
    t0 = time.monotonic()
    name = cmd[cmd.index("--") + 1:] if counted else cmd
    try:
        r = H.run(cmd, timeout=PROGRAM_TIMEOUT, cwd=cwd, check=False)
    except subprocess.TimeoutExpired:
        if failures is None:
            raise
        failures.append(f"{name[0]} {name[1]}: not done after {PROGRAM_TIMEOUT} s")
        return None
    secs = round(time.monotonic() - t0, 3)
    if r.returncode != 0 and failures is not None:
        failures.append(f"{name[0]} {name[1]}: exit {r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1][:200]}")
    elif r.returncode != 0:
        raise RuntimeError(f"{' '.join(name)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()[-500:]}")
    if counted:
        with open(counted) as f:
            for line in f:
                fields = line.strip().split(",")
                if len(fields) > 2 and fields[2] == EVENT and fields[0].isdigit():
                    requests[key] = int(fields[0])
        os.remove(counted)
    return secs


def files_below(path, skip=()):
    """Regular files below `path` (directories named in `skip` not entered)."""
    n = 0
    for _, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        n += len(files)
    return n


def complete(r, key, failures, found, want, what):
    """A program's time counts only if it did all its work: `found` of `want` files. A system whose failures
    are recorded (passthrough_hp) keeps no time for an incomplete run; any other fails the scenario."""
    if found == want:
        return
    if failures is None:
        raise RuntimeError(f"{what}: {found} files where {want} were expected")
    failures.append(f"{what} left {found} of {want} files: its time is not counted")
    r[key] = None


def run(ctx):
    dirs = ctx.args.programs_dirs
    repo_files = REPO_FILES * dirs // DIRS
    tar, repo = make_sources(ctx.work, dirs, repo_files)
    link = ctx.link(LATENCY)
    res = {"link": link.describe(), "entries": dirs * (FILES_PER_DIR + 1), "repo_files": repo_files,
           "systems": {}}
    # (Named: the suite's mounts otherwise trust what they cached for an hour.)
    systems = [ctx.system("direct"), ctx.larder("larder", ["--validity-lag", f"{LAG:g}s"]), ctx.fuse_limit()]
    wanted = {p.strip() for p in ctx.args.programs_peers.split(",") if p.strip()}
    systems += [p for p in ctx.peers() if p.name in wanted]
    count = can_count_requests()
    res["requests_counted"] = count
    for s in filter(None, systems):
        with fresh_disk(ctx, f"programs-{s.name}"):
            sub = "programs"
            os.makedirs(os.path.join(ctx.home, sub))
            r = res["systems"].setdefault(s.name, {})
            # libfuse 3.14's passthrough_hp cannot set times (utimensat answers EOPNOTSUPP): `tar x` and
            # `cp -a` report that and exit 1, having made the same calls; its failures, and a peer's, are
            # recorded, not fatal.
            failures = r.setdefault("failures", []) if s.name == "passthrough_hp" or s.peer else None
            reqs = r.setdefault("fuse_requests", {}) if count and s.name != "direct" else None
            with s.mount(ctx, "programs", link=link if s.name == "larder" or s.peer else None,
                         writable=True) as m:
                base = m.path(sub)
                log(f"programs: {s.name}, tar x")
                os.makedirs(os.path.join(base, "t"))
                r["tar_x"] = timed(["tar", "xf", tar, "-C", os.path.join(base, "t")], failures=failures,
                                   requests=reqs, key="tar_x")
                tree_files = dirs * FILES_PER_DIR
                complete(r, "tar_x", failures, files_below(os.path.join(base, "t")), tree_files, "tar x")
                log(f"programs: {s.name}, git clone")
                r["git_clone"] = timed(["git", "clone", "-q", repo, os.path.join(base, "repo")], failures=failures,
                                       requests=reqs, key="git_clone")
                complete(r, "git_clone", failures, files_below(os.path.join(base, "repo"), skip=(".git",)),
                         repo_files, "git clone")
                log(f"programs: {s.name}, cp -a")
                r["cp_a"] = timed(["cp", "-a", os.path.join(base, "t"), os.path.join(base, "t-copy")], failures=failures,
                                  requests=reqs, key="cp_a")
                complete(r, "cp_a", failures, files_below(os.path.join(base, "t-copy")), tree_files, "cp -a")
                log(f"programs: {s.name}, rm -rf")
                r["rm_rf"] = timed(["rm", "-rf", os.path.join(base, "t-copy")], failures=failures,
                                   requests=reqs, key="rm_rf")
                complete(r, "rm_rf", failures, files_below(os.path.join(base, "t-copy")), 0, "rm -rf")
                # Files made right after as many were removed (`make clean && make`, a branch checkout):
                # where the removed inodes are freed, a create skips each one freed in the last minutes.
                log(f"programs: {s.name}, tar x after the rm -rf")
                os.makedirs(os.path.join(base, "t2"))
                r["tar_x_after_rm"] = timed(["tar", "xf", tar, "-C", os.path.join(base, "t2")], failures=failures,
                                            requests=reqs, key="tar_x_after_rm")
                complete(r, "tar_x_after_rm", failures, files_below(os.path.join(base, "t2")), tree_files,
                         "tar x after the rm -rf")
                st = m.status()
                if st:
                    H.run([H.LARDER, "drain", m.root, "--timeout", "600s"], timeout=700)
                    # Read once (cached), then past the lag: a walk that opens every file.
                    walk = f'cd "{os.path.join(base, "t")}" && find . -type f -print0 | xargs -0 cat > /dev/null'
                    timed(["sh", "-c", walk])
                    time.sleep(LAG + 1)
                    before = m.status()
                    r["find_cat_after_lag"] = timed(["sh", "-c", walk])
                    after = m.status()
                    # `larder status` itself asks home for its capacity (statfs): not the walk's.
                    ops = lambda st: H.get(st, "home", "ops") - (H.get(st, "home", "ops_by_kind", "statfs") or 0)
                    calls = ops(after) - ops(before)
                    r["home_calls_after_lag"] = calls
                    # The walk revalidates each directory of the tree (the tarball's `tree/` and the `dirs` below
                    # it) and, for its `cd`, the ones above it: the mount's root, programs/ and t/. (The root's
                    # own attributes come with its own listing from a POSIX home.)
                    walked = dirs + 4
                    r["directories"] = walked
                    r["home_calls_per_directory"] = round(calls / walked, 2)
                    r["stats_after_lag"] = (H.get(after, "home", "ops_by_kind", "stat") or 0) - (
                        H.get(before, "home", "ops_by_kind", "stat") or 0)
                    r["listings_after_lag"] = H.get(after, "metadata", "listings") - H.get(before, "metadata", "listings")
                    r["bytes_from_home_after_lag"] = (H.get(after, "home", "bytes_read")
                                                      - H.get(before, "home", "bytes_read"))
    return res


def report(r, ctx):
    sy = r["systems"]
    rows = []
    for k, label in [("tar_x", f"tar x ({r['entries']:,} entries)"), ("git_clone", f"git clone ({r['repo_files']} files)"),
                     ("cp_a", "cp -a of the tree within the mount"), ("rm_rf", "rm -rf of the copy"),
                     ("tar_x_after_rm", "tar x again, right after the rm -rf")]:
        d, l, p = H.get(sy, "direct", k), H.get(sy, "larder", k), H.get(sy, "passthrough_hp", k)
        rows.append([label, d, l, H.ratio(l, d), "≤ 10", p, H.ratio(p, d), H.ratio(l, p)])
    peers = [n for n in sy if n not in ("direct", "larder", "passthrough_hp")]
    lines = [f"The default mount (write-back), home behind {r['link']}; seconds, and larder ÷ the local disk "
             "(lower is better). passthrough_hp: libfuse's passthrough file system over the same disk, no link: "
             "what a FUSE file system that adds nothing pays for the same calls on this machine. (Its build here "
             "keeps no extended attributes, so after its first refusal the kernel stops asking it for "
             "`security.capability` before each file's first write and its chown: two requests per created "
             "file that larder, which keeps extended attributes, answers.)", "",
             H.md_table(["program", "direct, s", "larder, s", "larder ÷ direct", "target", "passthrough_hp, s",
                         "passthrough_hp ÷ direct", "larder ÷ passthrough_hp"], rows)]
    if peers:
        prow = []
        for k, label in [("tar_x", "tar x"), ("git_clone", "git clone"), ("cp_a", "cp -a"), ("rm_rf", "rm -rf"),
                         ("tar_x_after_rm", "tar x after the rm -rf")]:
            row = [label]
            for p in peers:
                row += [H.get(sy, p, k), H.fmt(H.ratio(H.get(sy, "larder", k), H.get(sy, p, k)), 3)]
            prow.append(row)
        lines += ["", f"The peers, their home behind the same link ({r['link']}; JuiceFS's Redis too), seconds "
                  "(lower is better):", "",
                  H.md_table(["program"] + [x for p in peers for x in (f"{p}, s", f"larder ÷ {p}")], prow)]
    if r.get("requests_counted"):
        files = {"tar_x": r["entries"], "git_clone": r["repo_files"], "cp_a": r["entries"], "rm_rf": r["entries"],
                 "tar_x_after_rm": r["entries"]}
        counts = []
        for k, label in [("tar_x", "tar x"), ("git_clone", "git clone"), ("cp_a", "cp -a"), ("rm_rf", "rm -rf"),
                         ("tar_x_after_rm", "tar x after the rm -rf")]:
            row = [label]
            for name in ("larder", "passthrough_hp"):
                n, secs = H.get(sy, name, "fuse_requests", k), H.get(sy, name, k)
                row += [n, round(n / files[k], 1) if n else None,
                        round(secs * 1e6 / n, 1) if n and secs else None]
            counts.append(row)
        lines += ["", "FUSE requests while each program ran (`perf stat -e fuse:fuse_request_send -a`), per entry "
                  "of the tree (per file for git clone), and the program's time per request:", "",
                  H.md_table(["program", "larder requests", "per entry", "µs per request", "passthrough_hp requests",
                              "per entry", "µs per request"], counts)]
    failed = [(n, f) for n in sy if n != "direct" for f in H.get(sy, n, "failures") or []]
    if failed:
        lines += [""] + [f"- {n}: {f}" for n, f in failed]
    lar = sy.get("larder", {})
    if "home_calls_after_lag" in lar:
        lines += ["", f"`find | xargs cat` over the extracted tree ({lar['directories']} directories with the ones above it), cached, pushed, "
                  f"after the validity lag: {lar['find_cat_after_lag']} s, {lar['home_calls_after_lag']} home calls "
                  f"({lar['home_calls_per_directory']} per directory, target ≤ 1; {lar['listings_after_lag']} listings, "
                  f"{lar.get('stats_after_lag')} stats), "
                  f"{lar['bytes_from_home_after_lag']} bytes read from home."]
    return "\n".join(lines)
