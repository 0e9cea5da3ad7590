//! Integration tests of the cache engine through real FUSE mounts: prefetch, pin, unpin and evict from
//! the command line, whole-file prefetch, small files as whole units, and dedup of identical small files.

mod common;

use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use common::*;

/// Read `path` whole after dropping the kernel's page cache of it, so the read reaches the daemon.
fn read_uncached(path: &Path) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: fadvise on a valid descriptor.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    v
}

fn home_reads(m: &Mount) -> u64 {
    num(&m.status(), "/home/ops_by_kind/read")
}

/// `larder CMD args...`, which must succeed; its stdout.
fn ok(args: &[&str]) -> String {
    let out = larder(args);
    assert!(out.success(), "larder {args:?} failed:\n{out}");
    out.stdout
}

#[test]
fn prefetch_evict_pin_and_unpin_from_the_command_line() {
    let t = TestDir::new("residency");
    let mut rng = Rng::new(41);
    std::fs::create_dir_all(t.home.join("data/sub")).unwrap();
    let big = write_random(&t.home.join("data/big.bin"), 3 << 20, &mut rng);
    let small = write_random(&t.home.join("data/sub/small.bin"), 100_000, &mut rng);
    let other = write_random(&t.home.join("other.bin"), 40 << 20, &mut rng);
    let m = t.mount(&[
        "--block-size",
        "64KiB",
        "--cache-size",
        "24MiB",
        "--write-mode",
        "read-only",
    ]);

    // Metadata only: names and attributes, no data.
    let out = ok(&["prefetch", "--metadata-only", "--recursive", s(&m.path("data"))]);
    assert!(out.contains("metadata of 2 files"), "{out}");
    assert_eq!(home_reads(&m), 0, "a metadata-only prefetch read data");

    // A recursive prefetch brings every byte in; reading afterwards asks home for nothing.
    let out = ok(&["prefetch", "--recursive", s(&m.path("data"))]);
    assert!(out.starts_with("prefetch: 2 files"), "{out}");
    let reads = home_reads(&m);
    assert!(reads > 0);
    assert_same_bytes(&read_uncached(&m.path("data/big.bin")), &big, "big.bin");
    assert_same_bytes(&read_uncached(&m.path("data/sub/small.bin")), &small, "small.bin");
    assert_eq!(home_reads(&m), reads, "a prefetched file was read from home again");

    // Evict drops the data; the next read goes home.
    let out = ok(&["evict", "--recursive", s(&m.path("data"))]);
    assert!(out.contains("0 B still cached"), "{out}");
    assert_same_bytes(&read_uncached(&m.path("data/big.bin")), &big, "big.bin after evict");
    assert!(home_reads(&m) > reads, "an evicted file was served without home");

    // A pinned file survives reading more than the cache holds; evict leaves it, unpin lets it go.
    ok(&["pin", s(&m.path("data/big.bin"))]);
    assert_eq!(num(&m.status(), "/cache/bytes_pinned"), 3 << 20);
    assert_same_bytes(&read_uncached(&m.path("other.bin")), &other, "other.bin");
    let reads = home_reads(&m);
    assert_same_bytes(&read_uncached(&m.path("data/big.bin")), &big, "pinned big.bin");
    assert_eq!(home_reads(&m), reads, "a pinned file was evicted");
    let out = ok(&["evict", s(&m.path("data/big.bin"))]);
    assert!(out.contains("1 pinned or open files kept"), "{out}");
    ok(&["unpin", s(&m.path("data/big.bin"))]);
    let out = ok(&["evict", s(&m.path("data/big.bin"))]);
    assert!(out.contains("3.0 MiB dropped"), "{out}");
    assert_eq!(num(&m.status(), "/cache/bytes_pinned"), 0);

    // A pin larger than the cache allows for pins is refused with a reason, and nothing is pinned.
    let out = larder(&["pin", s(&m.path("other.bin"))]);
    assert!(!out.success(), "pinning 40 MiB in a 24 MiB cache succeeded:\n{out}");
    assert!(out.stderr.contains("pinned files would take more than"), "{out}");
    assert_eq!(num(&m.status(), "/cache/bytes_pinned"), 0);

    // Paths outside a larder mount are refused clearly.
    let out = larder(&["prefetch", s(&t.home)]);
    assert!(
        !out.success() && out.stderr.contains("not inside a larder mount"),
        "{out}"
    );
    m.unmount();
}

#[test]
fn a_pin_follows_the_file_to_its_new_version() {
    let t = TestDir::new("pin-version");
    let mut rng = Rng::new(42);
    write_random(&t.home.join("f.bin"), 1 << 20, &mut rng);
    let m = t.mount(&[
        "--block-size",
        "64KiB",
        "--validity-lag",
        "0",
        "--write-mode",
        "read-only",
    ]);
    ok(&["pin", s(&m.path("f.bin"))]);
    // Home gets a new version; larder learns of it at the next open and fetches it in the background.
    let new = write_random(&t.home.join("f.bin"), 2 << 20, &mut rng);
    set_mtime(&t.home.join("f.bin"), 1_000_000);
    assert_eq!(std::fs::metadata(m.path("f.bin")).unwrap().len(), 2 << 20);
    drop(std::fs::File::open(m.path("f.bin")).unwrap());
    assert!(
        wait_until(Duration::from_secs(20), || num(&m.status(), "/cache/bytes_pinned")
            == 2 << 20),
        "the new version was not pinned and fetched: {}",
        m.status()
    );
    let reads = home_reads(&m);
    assert_same_bytes(&read_uncached(&m.path("f.bin")), &new, "new version");
    assert_eq!(home_reads(&m), reads, "the pinned new version was read from home");
    m.unmount();
}

#[test]
fn whole_file_prefetch_brings_a_file_in_after_its_first_read() {
    let t = TestDir::new("whole-file");
    let mut rng = Rng::new(43);
    let want = write_random(&t.home.join("f.bin"), 6 << 20, &mut rng);
    let m = t.mount(&["--prefetch", "whole-file", "--write-mode", "read-only"]);
    let mut f = std::fs::File::open(m.path("f.bin")).unwrap();
    let mut head = [0u8; 4096];
    f.read_exact(&mut head).unwrap();
    assert_eq!(&head[..], &want[..4096]);
    drop(f);
    assert!(
        wait_until(Duration::from_secs(20), || num(&m.status(), "/cache/logical_bytes")
            == 6 << 20),
        "the file did not come in whole: {}",
        m.status()
    );
    m.unmount();
}

#[test]
fn identical_small_files_are_stored_once_and_stay_exact() {
    let t = TestDir::new("dedup");
    let mut rng = Rng::new(44);
    let common = rng.bytes(150_000);
    for i in 0..20 {
        std::fs::write(t.home.join(format!("same{i:02}.bin")), &common).unwrap();
    }
    let unique: Vec<Vec<u8>> = (0..5)
        .map(|i| write_random(&t.home.join(format!("unique{i}.bin")), 150_000, &mut rng))
        .collect();
    // 64 KiB blocks: each file spans three, fetched and kept as one unit.
    let m = t.mount(&[
        "--block-size",
        "64KiB",
        "--write-mode",
        "write-back",
        "--sync-lag",
        "60s",
    ]);
    let home_reads_before = home_reads(&m);
    for i in 0..20 {
        assert_same_bytes(&read(&m.path(&format!("same{i:02}.bin"))), &common, "same");
    }
    for (i, u) in unique.iter().enumerate() {
        assert_same_bytes(&read(&m.path(&format!("unique{i}.bin"))), u, "unique");
    }
    let v = m.status();
    assert_eq!(
        home_reads(&m) - home_reads_before,
        25,
        "each small file must come in one request: {v}"
    );
    assert_eq!(num(&v, "/cache/logical_bytes"), 25 * 150_000, "{v}");
    assert_eq!(
        num(&v, "/cache/bytes_used"),
        6 * 150_000,
        "20 identical files are not stored once: {v}"
    );
    assert_eq!(num(&v, "/cache/dedup/saved_bytes"), 19 * 150_000, "{v}");
    // Changing one of them changes only it.
    std::fs::write(m.path("same03.bin"), b"changed").unwrap();
    assert_eq!(read(&m.path("same03.bin")), b"changed");
    for i in [0, 4, 19] {
        assert_same_bytes(
            &read_uncached(&m.path(&format!("same{i:02}.bin"))),
            &common,
            "a sharer after a change",
        );
    }
    m.unmount();
    assert_eq!(std::fs::read(t.home.join("same03.bin")).unwrap(), b"changed");
    assert_eq!(std::fs::read(t.home.join("same04.bin")).unwrap(), common);
}

#[test]
fn a_file_whole_in_the_cache_is_read_by_the_kernel_directly() {
    if !kernel_has_passthrough() {
        eprintln!("skipped: this kernel has no FUSE passthrough");
        return;
    }
    use std::os::unix::fs::FileExt;
    let t = TestDir::new("passthrough");
    let mut rng = Rng::new(45);
    let want = write_random(&t.home.join("f.bin"), 4 << 20, &mut rng);
    let m = t.mount(&["--write-mode", "read-only", "--validity-lag", "0"]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "cold read");
    // Whole and clean now: the kernel reads the cache file, and the daemon sees no read request.
    let reads = num(&m.status(), "/efficiency/reads");
    assert_same_bytes(&read_uncached(&m.path("f.bin")), &want, "passthrough read");
    assert_eq!(
        num(&m.status(), "/efficiency/reads"),
        reads,
        "the daemon served a read of a whole cached file"
    );

    // While a passthrough reader is open, eviction leaves the file and other readers share it.
    let reader = std::fs::File::open(m.path("f.bin")).unwrap();
    let out = larder(&["evict", s(&m.path("f.bin"))]);
    assert!(
        out.success() && out.stdout.contains("1 pinned or open files kept"),
        "{out}"
    );
    assert_same_bytes(&read_uncached(&m.path("f.bin")), &want, "a second reader");
    let mut tail = vec![0u8; 4096];
    reader.read_exact_at(&mut tail, (4 << 20) - 4096).unwrap();
    assert_eq!(tail, want[(4 << 20) - 4096..]);

    // A new version at home cannot be opened while the old one is read directly (the kernel allows one
    // backing file per inode): the open says so, and works once the old readers are gone.
    let new = write_random(&t.home.join("f.bin"), 1 << 20, &mut rng);
    set_mtime(&t.home.join("f.bin"), 1_000_000);
    let err = std::fs::File::open(m.path("f.bin")).expect_err("opened a new version beside an old reader");
    assert_eq!(err.raw_os_error(), Some(libc::EBUSY), "{err}");
    drop(reader);
    assert_same_bytes(&read(&m.path("f.bin")), &new, "the new version");
    m.unmount();
}

/// On the default (write-back) mount a file whole in the cache is read and written by the kernel in its
/// cache file: the daemon serves none of its reads or writes, sees the writes at close (and mmap'ed
/// pages written after the close at release), and hands them to home.
#[test]
fn writers_of_a_file_whole_in_the_cache_write_its_cache_file_and_home_gets_what_they_wrote() {
    if !kernel_has_passthrough() {
        eprintln!("skipped: this kernel has no FUSE passthrough");
        return;
    }
    use std::os::unix::fs::FileExt;
    let t = TestDir::new("passthrough-write");
    let mut rng = Rng::new(47);
    let mut want = write_random(&t.home.join("f.bin"), 3 << 20, &mut rng);
    let m = t.mount(&[
        "--write-mode",
        "write-back",
        "--sync-lag",
        "0s",
        "--validity-lag",
        "60s",
    ]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "cold read");
    let reads = num(&m.status(), "/efficiency/reads");
    let put = |want: &mut Vec<u8>, off: usize, chunk: &[u8]| {
        if want.len() < off + chunk.len() {
            want.resize(off + chunk.len(), 0);
        }
        want[off..off + chunk.len()].copy_from_slice(chunk);
    };
    {
        // Rewritten in place in three places, the last past the end; its size shows before the close.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.path("f.bin"))
            .unwrap();
        for (off, len) in [(5000usize, 100usize), ((1 << 20) + 7, 70_000), ((3 << 20) - 10, 30)] {
            let chunk = rng.bytes(len);
            f.write_all_at(&chunk, off as u64).unwrap();
            put(&mut want, off, &chunk);
        }
        assert_eq!(
            std::fs::metadata(m.path("f.bin")).unwrap().len(),
            want.len() as u64,
            "the size another process sees before the close"
        );
        let mut back = vec![0u8; want.len()];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_same_bytes(&back, &want, "read back through the writer");
    }
    {
        // Written through a shared mapping, before the close and after it.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.path("f.bin"))
            .unwrap();
        let len = 8192usize;
        // SAFETY: a fresh shared mapping of `len` bytes of an open file, unmapped below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                2 << 20,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        // SAFETY: the mapping is `len` bytes long and writable.
        let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
        let before = rng.bytes(100);
        bytes[100..200].copy_from_slice(&before);
        put(&mut want, (2 << 20) + 100, &before);
        drop(f);
        let after = rng.bytes(100);
        bytes[300..400].copy_from_slice(&after);
        put(&mut want, (2 << 20) + 300, &after);
        // SAFETY: unmapping the mapping made above, not used after.
        assert_eq!(unsafe { libc::munmap(map, len) }, 0);
    }
    assert_eq!(
        num(&m.status(), "/efficiency/reads"),
        reads,
        "the daemon served reads of a file whole in the cache"
    );
    // A new file is written through the daemon, then appended to by the kernel at its next open.
    let mut new = rng.bytes(300_000);
    std::fs::write(m.path("new.bin"), &new).unwrap();
    let tail = rng.bytes(5000);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(m.path("new.bin"))
            .unwrap();
        f.write_all(&tail).unwrap();
    }
    new.extend_from_slice(&tail);
    assert_same_bytes(&read_uncached(&m.path("new.bin")), &new, "a new file read back");
    assert_same_bytes(&read_uncached(&m.path("f.bin")), &want, "read back after the close");
    drain_ok(&m, 30);
    assert_same_bytes(
        &std::fs::read(t.home.join("f.bin")).unwrap(),
        &want,
        "home after the drain",
    );
    assert_same_bytes(
        &std::fs::read(t.home.join("new.bin")).unwrap(),
        &new,
        "the new file at home",
    );
    m.unmount();
}

#[test]
fn without_passthrough_every_read_reaches_the_daemon() {
    let t = TestDir::new("no-passthrough");
    let mut rng = Rng::new(46);
    let want = write_random(&t.home.join("f.bin"), 1 << 20, &mut rng);
    let m = t.mount(&["--no-passthrough", "--write-mode", "read-only"]);
    assert_same_bytes(&read(&m.path("f.bin")), &want, "cold read");
    let reads = num(&m.status(), "/efficiency/reads");
    assert_same_bytes(&read_uncached(&m.path("f.bin")), &want, "warm read");
    assert!(num(&m.status(), "/efficiency/reads") > reads);
    assert_eq!(num(&m.status(), "/home/ops_by_kind/read"), 1, "a warm read went home");
    m.unmount();
}
