//! The cache's own integrity on real mounts: what the cache directory holds is never served wrong, and
//! what a cut-short write or a full cache disk leaves never shows past a file's end.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// The cache files of objects (not spares nor shared contents) under `cache`, with their lengths.
fn cache_files(cache: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(cache.join("objects")).unwrap().flatten() {
        let name = dir.file_name();
        if name == "spare" || name == "cas" || !dir.path().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            out.push((f.path(), f.metadata().unwrap().len()));
        }
    }
    out
}

/// The one cache file under `cache` at least `len` bytes long.
fn cache_file_of(cache: &Path, len: u64) -> PathBuf {
    let found: Vec<PathBuf> = cache_files(cache)
        .into_iter()
        .filter(|(_, l)| *l >= len)
        .map(|(p, _)| p)
        .collect();
    assert_eq!(found.len(), 1, "cache files of {len} bytes or more: {found:?}");
    found.into_iter().next().unwrap()
}

/// Overwrite 16 bytes at `offset` of `file`, as a damaged disk or a hand outside larder would.
fn damage(file: &Path, offset: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.write_all_at(b"\xde\xad\xbe\xef damaged!!", offset).unwrap();
    f.sync_all().unwrap();
}

fn wb(extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--write-mode", "write-back", "--validity-lag", "60s"];
    args.extend_from_slice(extra);
    args.into_iter().map(String::from).collect()
}

fn mount(t: &TestDir, extra: &[&str]) -> Mount {
    let args = wb(extra);
    t.mount(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A clean cached file whose cache file was damaged between two mounts is read exactly as home has it,
/// through passthrough too: the damaged block fails its check before the kernel is given the file, is
/// counted, logged and fetched again, and the cache file holds home's bytes afterwards. With a check too
/// large for the open (`--verify-at-open` below the file), the daemon serves the open and checks as it
/// reads.
#[test]
fn a_damaged_cache_file_is_never_served_and_its_block_is_fetched_again() {
    for verify_at_open in ["256MiB", "1MiB"] {
        let t = TestDir::new("integrity-clean");
        let mut rng = Rng::new(121);
        let want = write_random(&t.home.join("f.bin"), 32 << 20, &mut rng);
        let extra = ["--verify-at-open", verify_at_open];
        let m = mount(&t, &extra);
        assert_same_bytes(&read(&m.path("f.bin")), &want, "cold read");
        m.wait_released();
        m.unmount();
        let file = cache_file_of(&t.cache, 32 << 20);
        damage(&file, 16 << 20);

        let m = mount(&t, &extra);
        assert_same_bytes(&read(&m.path("f.bin")), &want, "the read after the damage");
        m.wait_released();
        // And again, from the kernel's side if it serves the file now.
        assert_same_bytes(&read(&m.path("f.bin")), &want, "the second read");
        let st = m.status();
        assert!(
            num(&st, "/cache/corrupt_blocks") >= 1,
            "the damaged block was not counted ({verify_at_open}): {}",
            st["cache"]
        );
        assert!(
            m.log().contains("failed its checksum"),
            "nothing in the log ({verify_at_open}):\n{}",
            m.log()
        );
        assert_same_bytes(
            &std::fs::read(&file).unwrap(),
            &want,
            "the cache file after the damaged block came again",
        );
        m.unmount();
    }
}

/// A file written here whose changes are not at home yet, its cache file damaged between two mounts:
/// its damaged bytes are an error (EIO), never served; the log and `larder status` name the file; it is
/// not pushed (a drain says so at once); written again whole, it reads and goes home as written.
#[test]
fn damaged_changes_not_yet_at_home_are_an_error_named_by_status_and_never_pushed() {
    let t = TestDir::new("integrity-dirty");
    let mut rng = Rng::new(122);
    let _ = write_random(&t.home.join("other.bin"), 1000, &mut rng);
    let m = mount(&t, &["--sync-lag", "120s"]);
    let ours = rng.bytes(3 << 20);
    std::fs::write(m.path("ours.bin"), &ours).unwrap();
    m.wait_released();
    let out = larder(&["unmount", s(&m.mnt), "--leave-pending"]);
    assert!(out.success(), "{out}");
    m.disarm();
    let file = cache_file_of(&t.cache, 3 << 20);
    damage(&file, (1 << 20) + 5);

    let m = mount(&t, &["--sync-lag", "0s"]);
    let err = match std::fs::read(m.path("ours.bin")) {
        Ok(bytes) => panic!("damaged changes were served: {} bytes read", bytes.len()),
        Err(e) => e,
    };
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    // The bytes around them are still there.
    let f = std::fs::File::open(m.path("ours.bin")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    assert_same_bytes(&head, &ours[..4096], "the first block");
    drop(f);
    m.wait_released();
    let st = m.status();
    let damaged = st["cache"]["damaged_files"].as_array().cloned().unwrap_or_default();
    assert!(
        damaged.iter().any(|d| d["path"] == "ours.bin"),
        "status does not name the damaged file: {}",
        st["cache"]
    );
    let table = larder(&["status", s(&m.mnt)]);
    assert!(
        table.stdout.contains("DAMAGED") && table.stdout.contains("ours.bin"),
        "{table}"
    );
    assert!(
        m.log().contains("ours.bin"),
        "the log does not name the file:\n{}",
        m.log()
    );
    let drained = run_cmd(
        LARDER,
        &["drain", s(&m.mnt), "--timeout", "30s"],
        Duration::from_secs(60),
    );
    assert!(
        !drained.success(),
        "a drain said a damaged file reached home:\n{drained}"
    );
    assert!(
        std::fs::metadata(t.home.join("ours.bin")).map_or(true, |m| m.len() == 0),
        "bytes of the damaged file reached home"
    );
    // Written again whole: its own bytes, which go home.
    let again = rng.bytes(3 << 20);
    std::fs::write(m.path("ours.bin"), &again).unwrap();
    assert_same_bytes(&read(&m.path("ours.bin")), &again, "the file written again");
    drain_ok(&m, 30);
    assert_same_bytes(
        &std::fs::read(t.home.join("ours.bin")).unwrap(),
        &again,
        "home after the drain",
    );
    assert!(
        m.status()["cache"]["damaged_files"]
            .as_array()
            .is_none_or(|a| a.is_empty()),
        "still named damaged after it was written again"
    );
    m.unmount();
}

/// A tmpfs of `mib` MiB mounted at `dir` for the length of a test.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(dir: &Path, mib: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let size = format!("size={mib}m,mode=0700");
        let out = run_cmd(
            "mount",
            &["-t", "tmpfs", "-o", &size, "tmpfs", s(dir)],
            COMMAND_DEADLINE,
        );
        assert!(out.success(), "mount -t tmpfs: {out}");
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = run_cmd("umount", &["-l", s(&self.0)], COMMAND_DEADLINE);
    }
}

/// Bytes of `path` read to its end through a descriptor of its own, as `cat` reads.
fn read_to_end_len(path: &Path) -> u64 {
    std::fs::read(path).map(|d| d.len() as u64).unwrap()
}

/// A write cut short by a full cache disk leaves the file the size `stat` shows, and every reader (the
/// kernel through passthrough, the daemon) reads exactly that many bytes: after the error, after a drain
/// and after a remount. No cache file holds bytes past its file's end. (Home is away while the file is
/// written: pushed, its data could leave the disk and make room, and the write would not be cut short.)
#[test]
fn a_write_cut_short_by_a_full_cache_disk_leaves_no_bytes_past_the_file_end() {
    let t = TestDir::new("integrity-full");
    let _tmpfs = Tmpfs::new(&t.cache, 64);
    let fault = t.root().join("home-away");
    let m = t.mount_with_fault(&fault, &["--cache-size", "1GiB", "--validity-lag", "60s"]);
    std::fs::write(&fault, b"").unwrap();
    let out = run_cmd(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", s(&m.path("big"))),
            "bs=1M",
            "count=200",
        ],
        Duration::from_secs(120),
    );
    assert!(!out.success(), "200 MiB fit a 64 MiB cache disk:\n{out}");
    assert!(
        out.stderr.contains("No space left"),
        "dd did not end with ENOSPC:\n{out}"
    );
    m.wait_released();
    let check = |when: &str| {
        let size = std::fs::metadata(m_path(&t, "big")).unwrap().len();
        assert!(size > 0, "{when}: nothing was kept");
        assert_eq!(
            read_to_end_len(&m_path(&t, "big")),
            size,
            "{when}: a reader read past the file's end"
        );
        for (file, len) in cache_files(&t.cache) {
            assert!(
                len <= size,
                "{when}: cache file {} holds {len} bytes, the file {size}",
                file.display()
            );
        }
    };
    check("after the error");
    std::fs::remove_file(&fault).unwrap();
    wait_online(&m, 30, "after the fault file went");
    drain_ok(&m, 120);
    check("after a drain");
    let size = std::fs::metadata(m.path("big")).unwrap().len();
    assert_eq!(
        std::fs::metadata(t.home.join("big")).unwrap().len(),
        size,
        "home's size"
    );
    m.unmount();
    let m = mount(&t, &["--cache-size", "1GiB"]);
    check("after a remount");
    m.unmount();
}

fn m_path(t: &TestDir, rel: &str) -> PathBuf {
    t.mnt.join(rel)
}

/// A process reading a file that is replaced (written aside and renamed over it, as editors, deploy tools
/// and `sed -i` do) or removed through the same mount reads the version it opened to its end, after the
/// change reached home, as on a local file system: the rest of that version is brought into the cache
/// before home loses it. Home ends with the new version (or none).
#[test]
fn a_reader_of_a_file_replaced_or_removed_through_the_mount_reads_its_version_to_the_end() {
    let t = TestDir::new("integrity-reader");
    let mut rng = Rng::new(123);
    let old_f = write_random(&t.home.join("f"), 16 << 20, &mut rng);
    let old_g = write_random(&t.home.join("g"), 16 << 20, &mut rng);
    // A small readahead window, so that the readers are far from having the whole file when it goes.
    let m = mount(
        &t,
        &["--sync-lag", "0s", "--readahead", "1MiB", "--ingest-streams", "1"],
    );
    let chunk = 1 << 20;
    let reader = |name: &str| {
        let f = std::fs::File::open(m.path(name)).unwrap();
        let mut first = vec![0u8; chunk];
        f.read_exact_at(&mut first, 0).unwrap();
        (f, first)
    };
    let (f, first_f) = reader("f");
    let (g, first_g) = reader("g");
    assert_same_bytes(&first_f, &old_f[..chunk], "f's first MiB");
    assert_same_bytes(&first_g, &old_g[..chunk], "g's first MiB");

    let new_f = rng.bytes(3 << 20);
    std::fs::write(m.path("f.tmp"), &new_f).unwrap();
    std::fs::rename(m.path("f.tmp"), m.path("f")).unwrap();
    std::fs::remove_file(m.path("g")).unwrap();
    drain_ok(&m, 60);
    assert_same_bytes(
        &std::fs::read(t.home.join("f")).unwrap(),
        &new_f,
        "home's f after the drain",
    );
    assert!(!t.home.join("g").exists(), "g is still at home after the drain");

    for (file, old, name) in [(&f, &old_f, "f"), (&g, &old_g, "g")] {
        let mut rest = vec![0u8; old.len() - chunk];
        file.read_exact_at(&mut rest, chunk as u64)
            .unwrap_or_else(|e| panic!("the reader of {name} was cut off: {e}"));
        assert_same_bytes(&rest, &old[chunk..], &format!("the rest of {name}'s old version"));
    }
    drop((f, g));
    assert_same_bytes(&read(&m.path("f")), &new_f, "f opened anew");
    m.wait_released();
    m.unmount();
}

/// Append `tail` to the file at `path` (and to `want`, what it should hold).
fn append(path: &Path, tail: &[u8], want: &mut Vec<u8>) {
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    std::io::Write::write_all(&mut f, tail).unwrap();
    want.extend_from_slice(tail);
}

/// The conflicts `larder conflicts --json` lists.
fn conflicts(m: &Mount) -> Vec<serde_json::Value> {
    let out = larder(&["conflicts", s(&m.mnt), "--json"]);
    assert!(out.success(), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["conflicts"].as_array().cloned().unwrap_or_default()
}

/// A file made here and an edit of a file there, in a directory that home then loses (renamed or removed
/// by others) while the changes wait: the mount keeps showing them with their bytes, and when they
/// cannot land where they were made they are set aside as conflicts whose copies hold those bytes, listed
/// by `larder conflicts`. Nothing is dropped in silence.
#[test]
fn changes_in_a_directory_home_loses_meanwhile_are_kept_as_conflicts_with_their_bytes() {
    for what in ["renamed", "removed"] {
        let t = TestDir::new("integrity-lost-dir");
        let mut rng = Rng::new(124);
        std::fs::create_dir(t.home.join("d")).unwrap();
        let mut edited = write_random(&t.home.join("d/existing"), 5000, &mut rng);
        let m = mount(&t, &["--sync-lag", "120s", "--validity-lag", "1s"]);
        assert_same_bytes(&read(&m.path("d/existing")), &edited, "cold read");
        let ours = rng.bytes(200 << 10);
        std::fs::write(m.path("d/new"), &ours).unwrap();
        append(&m.path("d/existing"), &rng.bytes(3000), &mut edited);
        m.wait_released();
        match what {
            "renamed" => std::fs::rename(t.home.join("d"), t.home.join("d2")).unwrap(),
            _ => std::fs::remove_dir_all(t.home.join("d")).unwrap(),
        }
        // Past the validity lag, the directories are listed again: the changes made in `d` stay shown.
        std::thread::sleep(Duration::from_millis(1500));
        let _ = names(&m.mnt);
        let _ = std::fs::read_dir(m.path("d")).map(|d| d.count());
        assert_same_bytes(&read(&m.path("d/new")), &ours, &format!("{what}: d/new on the mount"));
        assert_same_bytes(
            &read(&m.path("d/existing")),
            &edited,
            &format!("{what}: d/existing on the mount"),
        );
        // Each drain tries the refused changes once more; past the refusals allowed they are set aside.
        let mut drained = false;
        for _ in 0..12 {
            let out = run_cmd(
                LARDER,
                &["drain", s(&m.mnt), "--timeout", "5s"],
                Duration::from_secs(30),
            );
            if out.success() {
                drained = true;
                break;
            }
        }
        assert!(
            drained,
            "{what}: the changes were never set aside: {}",
            m.status()["journal"]
        );
        let listed = conflicts(&m);
        for (name, want) in [("d/new", &ours), ("d/existing", &edited)] {
            let c = listed
                .iter()
                .find(|c| c["path"] == name)
                .unwrap_or_else(|| panic!("{what}: {name} is not listed as a conflict: {listed:?}"));
            let kept = c["kept_at"].as_str().unwrap();
            let copy = std::fs::read(kept).unwrap_or_else(|e| panic!("{what}: {name}'s copy {kept}: {e}"));
            assert_same_bytes(&copy, want, &format!("{what}: the copy of {name}"));
        }
        m.unmount();
    }
}

/// Fill the file system at `dir` with a file `dir/filler` until it has no room left.
fn fill_up(dir: &Path) {
    let out = run_cmd(
        "dd",
        &["if=/dev/zero", &format!("of={}", s(&dir.join("filler"))), "bs=64k"],
        Duration::from_secs(60),
    );
    assert!(out.stderr.contains("No space left"), "{out}");
}

/// Home's disk full while changes are pushed, for longer than the refusals a change is allowed: every
/// push fails before it changes home (home keeps its previous versions, never a fragment), nothing is set
/// aside (a full disk is temporary), the mount keeps showing what was written, and once there is room
/// again the changes land whole.
#[test]
fn a_full_home_keeps_its_previous_versions_and_takes_the_changes_once_there_is_room() {
    let t = TestDir::new("integrity-home-full");
    let _tmpfs = Tmpfs::new(&t.home, 40);
    let mut rng = Rng::new(125);
    let big_before = write_random(&t.home.join("big"), 1 << 20, &mut rng);
    let two_before = write_random(&t.home.join("two"), 1 << 20, &mut rng);
    std::fs::write(t.home.join("small"), b"abcdef").unwrap();
    let m = mount(&t, &["--sync-lag", "120s"]);
    assert_same_bytes(&read(&m.path("big")), &big_before, "cold read");
    assert_same_bytes(&read(&m.path("two")), &two_before, "cold read");
    fill_up(&t.home);
    let big = rng.bytes(20 << 20);
    std::fs::write(m.path("big"), &big).unwrap();
    // Two ranges: one that fits where home's file has room already, one that needs more than home has.
    let mut two = two_before.clone();
    let (head, far) = (rng.bytes(4096), rng.bytes(4 << 20));
    {
        let f = std::fs::OpenOptions::new().write(true).open(m.path("two")).unwrap();
        f.write_all_at(&head, 0).unwrap();
        f.write_all_at(&far, 8 << 20).unwrap();
    }
    two[..4096].copy_from_slice(&head);
    two.resize(8 << 20, 0);
    two.extend_from_slice(&far);
    std::fs::write(m.path("small"), b"123456").unwrap();
    std::fs::write(m.path("fresh"), b"fresh!").unwrap();
    m.wait_released();
    // More attempts than a refused change is allowed before it is set aside.
    for _ in 0..8 {
        let out = run_cmd(
            LARDER,
            &["drain", s(&m.mnt), "--timeout", "5s"],
            Duration::from_secs(30),
        );
        assert!(!out.success(), "a drain succeeded onto a full home:\n{out}");
    }
    let st = m.status();
    assert_eq!(
        num(&st, "/journal/conflicts"),
        0,
        "a change was set aside: {}",
        st["journal"]
    );
    assert!(
        st["journal"]["refused"].to_string().contains("no space"),
        "the refusals do not say why: {}",
        st["journal"]
    );
    assert_same_bytes(
        &std::fs::read(t.home.join("big")).unwrap(),
        &big_before,
        "home's big while full",
    );
    assert_same_bytes(
        &std::fs::read(t.home.join("two")).unwrap(),
        &two_before,
        "home's two while full",
    );
    // (Written in place, a file no larger than before may find the room it had: ours whole, then.)
    let small = std::fs::read(t.home.join("small")).unwrap();
    assert!(
        small == b"abcdef" || small == b"123456",
        "home's small while full: {small:?}"
    );
    assert!(
        std::fs::metadata(t.home.join("fresh")).map_or(true, |m| m.len() == 0),
        "a fragment of fresh at home"
    );
    assert_same_bytes(&read(&m.path("big")), &big, "the mount's big while home is full");
    assert_eq!(read(&m.path("small")), b"123456");
    assert_eq!(read(&m.path("fresh")), b"fresh!");
    std::fs::remove_file(t.home.join("filler")).unwrap();
    drain_ok(&m, 60);
    assert_same_bytes(&std::fs::read(t.home.join("big")).unwrap(), &big, "home's big at last");
    assert_same_bytes(&std::fs::read(t.home.join("two")).unwrap(), &two, "home's two at last");
    assert_same_bytes(&read(&m.path("two")), &two, "the mount's two at last");
    assert_eq!(
        num(&m.status(), "/journal/conflicts"),
        0,
        "a push that found no room was taken for someone else's change"
    );
    assert_eq!(std::fs::read(t.home.join("small")).unwrap(), b"123456");
    assert_eq!(std::fs::read(t.home.join("fresh")).unwrap(), b"fresh!");
    m.unmount();
}

/// A tarball of `files` small files (1 to 30 KB) in `dirs` directories, made under `root`.
fn small_files_tar(root: &Path, dirs: usize, files: usize, rng: &mut Rng) -> PathBuf {
    let src = root.join("src");
    for d in 0..dirs {
        std::fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for f in 0..files / dirs {
            let len = 1000 + rng.below(29_000) as usize;
            std::fs::write(src.join(format!("d{d}/f{f}")), rng.bytes(len)).unwrap();
        }
    }
    let tar = root.join("src.tar");
    let out = run_cmd("tar", &["cf", s(&tar), "-C", s(&src), "."], COMMAND_DEADLINE);
    assert!(out.success(), "{out}");
    tar
}

/// `tar x` of `tar` into `dir` (made first): its output.
fn untar(tar: &Path, dir: &Path) -> Output {
    let _ = std::fs::create_dir_all(dir);
    run_cmd("tar", &["xf", s(tar), "-C", s(dir)], Duration::from_secs(180))
}

/// A cache disk filled by many small files while home is away (nothing can be pushed to free it): the
/// writer that needs room gets `ENOSPC` (never `EIO`, never a hang), the mount keeps answering (listings,
/// reads of what is cached, status), and once home is back it pushes everything and takes new files
/// again by itself. With a cache size below the disk and one far above it.
#[test]
fn a_cache_disk_filled_by_small_files_refuses_writers_keeps_serving_and_recovers_by_itself() {
    for cache_size in ["24MiB", "1GiB"] {
        let t = TestDir::new("integrity-disk-full");
        let _tmpfs = Tmpfs::new(&t.cache, 32);
        let mut rng = Rng::new(126);
        let tar = small_files_tar(t.root(), 10, 600, &mut rng);
        let fault = t.root().join("home-away");
        let m = t.mount_with_fault(&fault, &["--cache-size", cache_size, "--validity-lag", "3s"]);
        let out = untar(&tar, &m.path("x0"));
        assert!(out.success(), "{cache_size}: the first tar x: {out}");
        drain_ok(&m, 120);
        // Home away: nothing pushed frees the disk.
        std::fs::write(&fault, b"").unwrap();
        let mut full = false;
        for i in 1..=6 {
            let out = untar(&tar, &m.path(&format!("x{i}")));
            if out.success() {
                continue;
            }
            let errors: Vec<&str> = out
                .stderr
                .lines()
                .filter(|l| !l.contains("Exiting with failure"))
                .collect();
            assert!(
                // (A write the kernel split may land in part before the room runs out: a short write.)
                errors
                    .iter()
                    .all(|l| l.contains("No space left on device") || l.contains("Wrote only")),
                "{cache_size}: tar x {i} failed otherwise than with ENOSPC:\n{}",
                errors.iter().take(20).copied().collect::<Vec<_>>().join("\n")
            );
            full = true;
            break;
        }
        assert!(
            full,
            "{cache_size}: six tar x of the tarball never filled a 32 MiB cache disk"
        );
        // The mount keeps answering: a listing, what is cached, its status.
        let listed = names(&m.mnt);
        assert!(
            listed.contains(&"x0".to_string()) && listed.contains(&"x1".to_string()),
            "{listed:?}"
        );
        // (Clean files may have been evicted to make room: with home away, those are EIO.)
        assert_eq!(
            read(&m.path("x1/d3/f7")),
            std::fs::read(t.root().join("src/d3/f7")).unwrap(),
            "{cache_size}: a file written while home was away"
        );
        assert!(num(&m.status(), "/journal/pending_ops") > 0);
        // Home back: everything goes home, and new files are taken again, without a remount.
        std::fs::remove_file(&fault).unwrap();
        wait_online(&m, 30, "after the fault file went");
        drain_ok(&m, 180);
        let out = untar(&tar, &m.path("again"));
        assert!(out.success(), "{cache_size}: tar x once there was room again: {out}");
        drain_ok(&m, 180);
        for dir in ["x0", "again"] {
            for d in [0, 9] {
                for f in [0, 59] {
                    let rel = format!("d{d}/f{f}");
                    assert_same_bytes(
                        &std::fs::read(t.home.join(dir).join(&rel)).unwrap(),
                        &std::fs::read(t.root().join("src").join(&rel)).unwrap(),
                        &format!("{cache_size}: home's {dir}/{rel}"),
                    );
                }
            }
        }
        m.unmount();
    }
}

/// `larder recover CACHE --to OUT`: its output, and the report it wrote.
fn recover(cache: &Path, out: &Path) -> (Output, serde_json::Value) {
    let o = larder(&["recover", s(cache), "--to", s(out), "--json"]);
    let report = std::fs::read_to_string(out.join("larder-recovered.json"))
        .ok()
        .and_then(|r| serde_json::from_str(&r).ok())
        .unwrap_or(serde_json::Value::Null);
    (o, report)
}

/// Ten changes queued and not pushed, the mount let go with them pending, then its index deleted or cut to
/// nothing: the cache never comes up looking healthy (the mount is refused, one line naming the problem
/// and the command), `larder recover` saves every file with unpushed data the cache still holds (new
/// files, a file appended to), and the next mount starts anew.
#[test]
fn a_lost_index_refuses_the_mount_and_recover_saves_every_unpushed_file() {
    for how in ["deleted", "emptied"] {
        let t = TestDir::new("integrity-lost-index");
        let mut rng = Rng::new(127);
        let mut existing = write_random(&t.home.join("existing.txt"), 1000, &mut rng);
        write_random(&t.home.join("gone.txt"), 100, &mut rng);
        write_random(&t.home.join("moved.txt"), 100, &mut rng);
        let m = mount(&t, &["--sync-lag", "120s"]);
        assert_same_bytes(&read(&m.path("existing.txt")), &existing, "cold read");
        let a = rng.bytes(5000);
        let b = rng.bytes(300 << 10);
        std::fs::write(m.path("a"), &a).unwrap();
        std::fs::create_dir(m.path("d")).unwrap();
        std::fs::write(m.path("d/b"), &b).unwrap();
        append(&m.path("existing.txt"), &rng.bytes(777), &mut existing);
        std::fs::remove_file(m.path("gone.txt")).unwrap();
        std::fs::rename(m.path("moved.txt"), m.path("renamed.txt")).unwrap();
        std::fs::create_dir(m.path("e")).unwrap();
        std::fs::write(m.path("e/empty"), b"").unwrap();
        m.wait_released();
        let out = larder(&["unmount", s(&m.mnt), "--leave-pending"]);
        assert!(out.success(), "{out}");
        m.disarm();
        let index = t.cache.join("index.redb");
        match how {
            "deleted" => std::fs::remove_file(&index).unwrap(),
            _ => std::fs::File::options()
                .write(true)
                .open(&index)
                .unwrap()
                .set_len(0)
                .unwrap(),
        }
        let refused = Mount::try_new(
            &t.home,
            &t.mnt,
            &t.cache,
            &wb(&[]).iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let Err(refused) = refused else {
            panic!("{how}: a cache whose index was {how} with changes pending mounted")
        };
        let said = if how == "deleted" { "missing" } else { "empty" };
        assert_cli_error(&refused, &["index", said, "larder recover"]);
        let saved = t.root().join("saved");
        let (o, report) = recover(&t.cache, &saved);
        assert!(o.success(), "{how}: {o}");
        for (rel, want) in [("a", &a), ("d/b", &b), ("existing.txt", &existing)] {
            assert_same_bytes(
                &std::fs::read(saved.join(rel)).unwrap_or_else(|e| panic!("{how}: {rel} not saved: {e}\n{report}")),
                want,
                &format!("{how}: the saved {rel}"),
            );
        }
        assert!(report["index_set_aside"].is_string(), "{how}: {report}");
        // Set aside, and the files saved: the cache mounts anew (what was pending is what was saved).
        let m = mount(&t, &[]);
        assert_same_bytes(&read(&m.path("existing.txt")), &existing[..1000], "home's existing.txt");
        m.unmount();
    }
}

/// The positions of the record marks in a log file of the index.
fn marks(log: &[u8]) -> Vec<usize> {
    (0..log.len().saturating_sub(4))
        .filter(|&i| &log[i..i + 4] == b"LRec")
        .collect()
}

/// The index's log file holding most.
fn busiest_log(cache: &Path) -> PathBuf {
    ["index.redb.log0", "index.redb.log1"]
        .iter()
        .map(|n| cache.join(n))
        .max_by_key(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .unwrap()
}

/// Twenty creates acknowledged and queued, the daemon killed before the index's group commit, then 16
/// bytes of its log changed: within one copy of a record, nothing is lost (every record is written
/// twice); across both copies of one, that record alone is lost, and the cache refuses to mount with the
/// command that saves what it holds, which then saves the other files.
#[test]
fn a_damaged_log_loses_at_most_the_record_it_hit() {
    for both in [false, true] {
        let t = TestDir::new("integrity-log");
        let mut rng = Rng::new(128);
        let m = mount(&t, &["--sync-lag", "120s"]);
        let files: Vec<Vec<u8>> = (0..20).map(|_| rng.bytes(100)).collect();
        for (i, data) in files.iter().enumerate() {
            std::fs::write(m.path(&format!("f{i}")), data).unwrap();
        }
        signal(m.pid, libc::SIGKILL);
        assert!(wait_until(Duration::from_secs(10), || !alive(m.pid)));
        m.force_cleanup();
        m.disarm();
        let log = busiest_log(&t.cache);
        let data = std::fs::read(&log).unwrap();
        let at = marks(&data);
        assert!(at.len() >= 20, "the log holds {} records", at.len());
        // Marks come in pairs: a record's two copies.
        let k = at.len() / 2 / 2 * 2;
        let damage_at = if both { at[k + 1] - 8 } else { at[k] + 4 };
        let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
        f.write_all_at(&[0x5a; 16], damage_at as u64).unwrap();
        drop(f);
        let tried = Mount::try_new(
            &t.home,
            &t.mnt,
            &t.cache,
            &wb(&[]).iter().map(String::as_str).collect::<Vec<_>>(),
        );
        if !both {
            let m = tried.unwrap_or_else(|o| panic!("one copy damaged: the mount was refused: {o}"));
            for (i, data) in files.iter().enumerate() {
                assert_same_bytes(&read(&m.path(&format!("f{i}"))), data, &format!("f{i}"));
            }
            assert!(
                m.log().contains("second copies"),
                "the mend is not in the log:\n{}",
                m.log()
            );
            m.unmount();
            continue;
        }
        let Err(refused) = tried else {
            panic!("both copies of a record damaged: the cache mounted as if healthy")
        };
        assert_cli_error(&refused, &["damaged", "larder recover"]);
        let saved = t.root().join("saved");
        let (o, report) = recover(&t.cache, &saved);
        assert!(o.success(), "{o}");
        let kept = files
            .iter()
            .enumerate()
            .filter(|(i, data)| std::fs::read(saved.join(format!("f{i}"))).is_ok_and(|d| d == **data))
            .count();
        assert!(kept >= 18, "of 20 files, {kept} saved whole: {report}");
    }
}

/// A cache file labelled as holding changes not yet at home that nothing in the index refers to (a
/// damaged index, or a crash at the wrong moment) is never deleted as an orphan: the start moves it to
/// the conflicts area, and `larder conflicts` lists it with its path.
#[test]
fn a_labelled_cache_file_the_index_does_not_know_is_kept_and_listed_not_deleted() {
    let t = TestDir::new("integrity-orphan");
    let mut rng = Rng::new(129);
    let m = mount(&t, &["--sync-lag", "120s"]);
    let ours = rng.bytes(70_000);
    std::fs::write(m.path("ours.bin"), &ours).unwrap();
    m.wait_released();
    let out = larder(&["unmount", s(&m.mnt), "--leave-pending"]);
    assert!(out.success(), "{out}");
    m.disarm();
    let file = cache_file_of(&t.cache, 70_000);
    let stray = t.cache.join("objects/ff/00000000000fffff");
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    let out = run_cmd("cp", &["--preserve=xattr", s(&file), s(&stray)], COMMAND_DEADLINE);
    assert!(out.success(), "{out}");
    let m = mount(&t, &[]);
    assert!(!stray.exists(), "the stray cache file is still among the objects");
    let listed = conflicts(&m);
    let c = listed
        .iter()
        .find(|c| c["policy"] == "lost+found")
        .unwrap_or_else(|| panic!("not listed: {listed:?}"));
    assert_eq!(c["path"], "ours.bin");
    assert_same_bytes(
        &std::fs::read(c["kept_at"].as_str().unwrap()).unwrap(),
        &ours,
        "the kept copy",
    );
    m.unmount();
}
