//! The bank of shared cache servers (`--bank`): mounts with cache directories of their own, each daemon in
//! a network namespace of its own, and a real memcached or redis-server (Debian's), started by the test on
//! the bridge's address in the root namespace. A directory home is shared through the file system.

mod common;
mod netns;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use common::{
    Mount, Rng, TestDir, assert_cli_error, assert_ls_l_is_one_listing, assert_root_revalidated_by_listing,
    assert_same_bytes, home_ops, larder, num, read, require_fuse, s, walk,
};
use larder_bank::testing::{CacheServer, Kind};
use netns::TestNet;

/// Every mount's options: 4 MiB blocks, so that a unit is four times memcached's default item limit (the
/// bank must split it to keep it at all); attributes trusted for an hour.
const OPTIONS: [&str; 5] = ["--block-size", "4MiB", "--no-passthrough", "--validity-lag", "1h"];

/// A test's network, its bank server on the bridge, and the home `t/home`.
struct Site {
    bank: CacheServer,
    net: TestNet,
}

impl Site {
    fn new(label: &str, kind: Kind, nodes: &[&str]) -> Site {
        let net = TestNet::new(label, nodes);
        let bank = CacheServer::start(kind, &net.host_ip().to_string(), 1 << 20);
        Site { bank, net }
    }

    fn mount(&self, t: &TestDir, name: &str, extra: &[&str]) -> Mount {
        let mut args: Vec<String> = vec!["--bank".into(), self.bank.url()];
        args.extend(OPTIONS.iter().chain(extra).map(|a| a.to_string()));
        self.net.mount(t.root(), name, s(&t.root().join("home")), &args, &[])
    }
}

/// A tree of 30 small files in three directories and one file of 10 MiB (three 4 MiB blocks, the last
/// short), as (relative path, content).
fn make_tree(home: &Path, rng: &mut Rng) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for d in 0..3 {
        for i in 0..10 {
            let rel = format!("d{d}/f{i}");
            let size = 100 + rng.below(30 << 10) as usize;
            files.push((rel.clone(), common::write_random(&home.join(&rel), size, rng)));
        }
    }
    files.push(("big".into(), common::write_random(&home.join("big"), 10 << 20, rng)));
    files
}

fn read_all(m: &Mount, files: &[(String, Vec<u8>)], what: &str) {
    for (rel, want) in files {
        assert_same_bytes(&read(&m.path(rel)), want, &format!("{rel} on {what}"));
    }
}

fn bank(m: &Mount, figure: &str) -> u64 {
    num(&m.status(), &format!("/bank/{figure}"))
}

/// Home calls of `kind` the mount made.
/// Wait until what `m` gave the bank is written: its writer has nothing left (puts stop growing).
fn settle(m: &Mount) {
    let mut last = u64::MAX;
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            let now = bank(m, "puts") + bank(m, "dropped");
            let still = now == last;
            last = now;
            if !still {
                std::thread::sleep(Duration::from_millis(300));
            }
            still
        }),
        "the bank's writer never settled"
    );
}

/// `ls -lR`-like: every path under `root` with its kind, size, mode and mtime.
fn listing(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .map(|(p, m)| {
            format!(
                "{} {:?} {} {:o} {:?}",
                p.display(),
                m.file_type(),
                m.len(),
                m.mode(),
                m.modified().ok()
            )
        })
        .collect()
}

use std::os::unix::fs::MetadataExt;

fn second_node_reads_from_the_bank(kind: Kind, label: &str) {
    require_fuse();
    let t = TestDir::new(label);
    let files = make_tree(&t.root().join("home"), &mut Rng::new(41));
    let site = Site::new(label, kind, &["a", "b"]);

    let a = site.mount(&t, "a", &[]);
    let seen_a = listing(&a.mnt);
    read_all(&a, &files, "a");
    settle(&a);
    assert_eq!(bank(&a, "put_errors") + bank(&a, "dropped"), 0, "{}", a.log());
    assert!(home_ops(&a, "read") > 0);

    let b = site.mount(&t, "b", &[]);
    assert_eq!(listing(&b.mnt), seen_a, "b sees the tree a saw");
    read_all(&b, &files, "b");
    assert_eq!(
        num(&b.status(), "/home/bytes_read"),
        0,
        "b read nothing from home:\n{}",
        b.log()
    );
    for op in ["stat", "list", "read"] {
        assert_eq!(
            home_ops(&b, op),
            0,
            "b asked home to {op}: its answers were in the bank"
        );
    }
    assert_eq!(bank(&b, "bad"), 0);
    assert!(
        bank(&b, "hits") >= files.len() as u64,
        "b's bank hits: {}",
        bank(&b, "hits")
    );
}

#[test]
fn a_second_node_takes_its_data_attributes_and_listings_from_a_memcached_bank_and_not_from_home() {
    second_node_reads_from_the_bank(Kind::Memcached, "bank-mc");
}

#[test]
fn a_second_node_takes_its_data_attributes_and_listings_from_a_redis_bank_and_not_from_home() {
    second_node_reads_from_the_bank(Kind::Redis, "bank-redis");
}

#[test]
fn a_bank_killed_mid_read_costs_the_reader_no_error_and_home_serves_the_rest() {
    require_fuse();
    let t = TestDir::new("bank-kill");
    let files = make_tree(&t.root().join("home"), &mut Rng::new(43));
    let big = &files.last().unwrap().1;
    let mut site = Site::new("bank-kill", Kind::Memcached, &["a", "b"]);
    let a = site.mount(&t, "a", &[]);
    read_all(&a, &files, "a");
    settle(&a);

    // b reads half the small files from the bank; the bank dies; b reads the rest and the large file,
    // which it never touched, from home, without an error.
    let b = site.mount(&t, "b", &["--bank-timeout", "200ms"]);
    read_all(&b, &files[..15], "b");
    assert_eq!(num(&b.status(), "/home/bytes_read"), 0);
    site.bank.kill();
    read_all(&b, &files[15..], "b with the bank gone");
    let st = b.status();
    let rest: usize = files[15..].iter().map(|(_, d)| d.len()).sum();
    assert_eq!(num(&st, "/home/bytes_read"), rest as u64, "home served the rest: {st}");
    assert!(num(&st, "/bank/errors") > 0, "{st}");
    assert_eq!(num(&st, "/bank/servers_down"), 1, "the dead server is skipped: {st}");
    assert_eq!(big.len(), 10 << 20);
}

/// `ls -l` of a directory of 2,000 files on a bank mount: one listing of home and no stat. Past the lag,
/// the mount's root is revalidated by its own listing, which carries its attributes (a POSIX home reads
/// them in the same call, and the bank keeps them with the listing), not by a stat.
#[test]
fn a_listing_through_the_bank_is_one_home_call_with_the_directorys_own_attributes() {
    require_fuse();
    let label = "bank-ls";
    let t = TestDir::new(label);
    let home = t.root().join("home");
    std::fs::create_dir_all(home.join("many")).unwrap();
    for i in 0..2000 {
        std::fs::write(home.join(format!("many/f{i}")), [i as u8]).unwrap();
    }
    let site = Site::new(label, Kind::Memcached, &["a"]);
    let lag = Duration::from_secs(2);
    let args: Vec<String> = ["--bank", &site.bank.url(), "--no-passthrough", "--validity-lag", "2s"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let a = site.net.mount(t.root(), "a", s(&home), &args, &[]);
    assert_ls_l_is_one_listing(&a, "many", 2000);
    // Past the lag (the bank's copies expired with it), the root is asked for again.
    settle(&a);
    assert_root_revalidated_by_listing(&a, lag + Duration::from_millis(500));
}

#[test]
fn a_change_made_through_one_node_is_not_hidden_from_a_new_one_by_what_the_bank_kept() {
    require_fuse();
    let t = TestDir::new("bank-change");
    let files = make_tree(&t.root().join("home"), &mut Rng::new(47));
    let site = Site::new("bank-change", Kind::Memcached, &["a", "c"]);
    let a = site.mount(&t, "a", &["--write-mode", "write-through"]);
    listing(&a.mnt);
    read_all(&a, &files[..3], "a");
    settle(&a);

    // Through a: one file rewritten longer, one removed, one created.
    std::fs::write(
        a.path("d0/f0"),
        b"rewritten through a, longer than before?".repeat(2000),
    )
    .unwrap();
    std::fs::remove_file(a.path("d0/f1")).unwrap();
    std::fs::write(a.path("d0/new"), b"new").unwrap();
    settle(&a);

    let c = site.mount(&t, "c", &[]);
    assert_eq!(
        read(&c.path("d0/f0")),
        b"rewritten through a, longer than before?".repeat(2000),
        "c reads the new content"
    );
    assert!(!c.path("d0/f1").exists(), "c does not see the removed file");
    assert_eq!(read(&c.path("d0/new")), b"new");
    assert_eq!(listing(&c.mnt), listing(&t.root().join("home")), "c's tree is home's");
}

#[test]
fn a_bank_that_cannot_be_reached_or_parsed_fails_the_mount_with_its_address() {
    require_fuse();
    let t = TestDir::new("bank-bad");
    std::fs::create_dir_all(t.root().join("home")).unwrap();
    let mnt = t.root().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let port = larder_bank::testing::free_port();
    let home = s(&t.root().join("home")).to_string();
    let cache = s(&t.root().join("cache")).to_string();
    let url = format!("memcache://{}:{port}", Ipv4Addr::LOCALHOST);
    let out = larder(&["mount", &home, s(&mnt), "--cache-dir", &cache, "--bank", &url]);
    assert_cli_error(&out, &["--bank", &format!("127.0.0.1:{port}")]);
    let out = larder(&[
        "mount",
        &home,
        s(&mnt),
        "--cache-dir",
        &cache,
        "--bank",
        "http://127.0.0.1:1",
    ]);
    assert!(!out.success() && out.stderr.contains("memcache://"), "{out}");
    assert!(!common::is_mounted(&mnt));
}
