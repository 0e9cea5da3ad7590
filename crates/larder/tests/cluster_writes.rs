//! Writes across a cluster (design note 016): what one node changed and closed, another node sees at its
//! next open, before home has it. Each node is a daemon in a network namespace of its own, with a real
//! etcd on the bridge (`site`); the home is a directory, and each node pushes to it after an hour, so
//! that home is behind for the whole test unless a node is drained.

mod common;
mod moto;
mod netns;
mod site;

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::{Mount, TestDir, assert_same_bytes, drain_ok, read, require_fuse, walk};
use site::{Site, certs};

/// Every node writes back, and pushes to home an hour after a change.
const LATE: [&str; 4] = ["--write-mode", "write-back", "--sync-lag", "1h"];

/// Every entry under `root`: path, kind, permissions, and the size and modification time of files (a
/// directory's size is its file system's own business).
fn tree(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .map(|(p, m)| {
            let (size, mtime) = if m.is_file() { (m.len(), m.mtime()) } else { (0, 0) };
            format!("{} {:?} {size} {:o} {mtime}", p.display(), m.file_type(), m.mode())
        })
        .collect()
}

/// How many members `m` counts live.
fn live_members(m: &Mount) -> usize {
    m.status()["cluster"]["members"]
        .as_array()
        .map_or(0, |ms| ms.iter().filter(|x| x["live"] == true).count())
}

fn wait_live(nodes: &[&Mount], n: usize) {
    for m in nodes {
        assert!(
            common::wait_until(Duration::from_secs(20), || live_members(m) >= n),
            "{} never saw {n} live members",
            m.mnt.display()
        );
    }
}

/// Kill `victim`'s daemon (SIGKILL: what it holds stays unpushed) and wait until its lease runs out (10
/// s) and `watcher` counts `live` members live.
fn kill_node(victim: Mount, watcher: &Mount, live: usize) {
    common::signal(victim.pid, libc::SIGKILL);
    assert!(common::wait_until(Duration::from_secs(10), || !common::alive(
        victim.pid
    )));
    victim.force_cleanup();
    let gone = victim.mnt.display().to_string();
    victim.disarm();
    assert!(
        common::wait_until(Duration::from_secs(30), || live_members(watcher) == live),
        "{gone} was never counted gone"
    );
}

/// Wait until `m` holds no record (its journal drained, its records removed).
fn wait_records_gone(m: &Mount, what: &str) {
    assert!(
        common::wait_until(Duration::from_secs(10), || common::num(
            &m.status(),
            "/cluster/held_here"
        ) == 0),
        "{what}"
    );
}

#[test]
fn what_one_node_closed_another_opens_before_home_has_it_and_its_cached_pages_go() {
    require_fuse();
    let t = TestDir::new("cw-open");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("f"), b"the old content").unwrap();
    let site = Site::new("cw-open", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);

    // B has the old version cached, in its store and the kernel's pages, and open.
    let mut held_open = std::fs::File::open(b.path("f")).unwrap();
    let mut old = Vec::new();
    held_open.read_to_end(&mut old).unwrap();
    assert_eq!(old, b"the old content");

    let new = b"the new content, written on a and closed, longer than the old".repeat(300);
    std::fs::write(a.path("f"), &new).unwrap();
    // At once, B's next open reads A's bytes; home still has the old ones.
    assert_same_bytes(&read(&b.path("f")), &new, "b's open after a's close");
    assert_eq!(std::fs::metadata(b.path("f")).unwrap().len(), new.len() as u64);
    let at_home = std::fs::read(home.join("f")).unwrap();
    assert!(
        at_home == b"the old content",
        "home has {} bytes already:\n{}\n{}",
        at_home.len(),
        a.status()["journal"],
        a.status()["write_mode"]
    );
    drop(held_open);
    assert_eq!(
        common::num(&a.status(), "/cluster/held_here"),
        1,
        "a holds f for the others"
    );
    assert_eq!(common::num(&b.status(), "/cluster/held_elsewhere"), 1);

    // Once A drains, home has them, and B still reads them (now from home).
    drain_ok(&a, 60);
    wait_records_gone(&a, "a forgets its record once home has the change");
    assert_eq!(std::fs::read(home.join("f")).unwrap(), new);
    assert!(
        common::wait_until(Duration::from_secs(10), || b.status()["cluster"].is_object()
            && read(&b.path("f")) == new),
        "b after a drained"
    );
    b.unmount();
    a.unmount();
}

#[test]
fn names_made_renamed_and_removed_on_one_node_show_on_another_at_once() {
    require_fuse();
    let t = TestDir::new("cw-names");
    let home = t.root().join("home");
    std::fs::create_dir_all(home.join("d/old")).unwrap();
    std::fs::write(home.join("d/gone"), b"to be removed").unwrap();
    std::fs::write(home.join("d/old/kept"), b"kept").unwrap();
    std::fs::write(home.join("d/moved"), b"to be renamed").unwrap();
    let site = Site::new("cw-names", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);
    // B has listed the tree before.
    assert_eq!(tree(&b.mnt), tree(&home));

    std::fs::create_dir(a.path("d/new")).unwrap();
    std::fs::write(a.path("d/new/file"), b"made on a").unwrap();
    std::fs::rename(a.path("d/moved"), a.path("d/new/renamed")).unwrap();
    std::fs::remove_file(a.path("d/gone")).unwrap();
    std::fs::rename(a.path("d/old"), a.path("d/older")).unwrap();
    std::os::unix::fs::symlink("new/file", a.path("d/link")).unwrap();

    let seen_a = tree(&a.mnt);
    assert_eq!(tree(&b.mnt), seen_a, "b's tree is a's at once");
    assert_eq!(read(&b.path("d/new/file")), b"made on a");
    assert_eq!(read(&b.path("d/new/renamed")), b"to be renamed");
    assert_eq!(read(&b.path("d/older/kept")), b"kept");
    assert_eq!(std::fs::read_link(b.path("d/link")).unwrap(), Path::new("new/file"));
    assert!(home.join("d/gone").exists(), "home has none of it yet");

    drain_ok(&a, 60);
    assert_eq!(tree(&home), seen_a, "home has a's tree once a drained");
    assert!(
        common::wait_until(Duration::from_secs(10), || tree(&b.mnt) == seen_a),
        "b's tree after a drained"
    );
    b.unmount();
    a.unmount();
}

#[test]
fn renames_and_drains_on_one_node_are_seen_at_the_next_lookup_or_open_on_another() {
    require_fuse();
    let t = TestDir::new("cw-next");
    let home = t.root().join("home");
    std::fs::create_dir_all(home.join("d")).unwrap();
    let site = Site::new("cw-next", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);

    // B knew the old name: the new one is there at B's next lookup, every time.
    for i in 0..30 {
        let (x, y) = (format!("d/x{i}"), format!("d/y{i}"));
        std::fs::write(a.path(&x), format!("v{i}")).unwrap();
        assert_eq!(read(&b.path(&x)), format!("v{i}").as_bytes());
        std::fs::rename(a.path(&x), a.path(&y)).unwrap();
        match std::fs::read(b.path(&y)) {
            Ok(bytes) => assert_eq!(bytes, format!("v{i}").as_bytes()),
            Err(e) => panic!("round {i}: b cannot open the new name {y}: {e}"),
        }
        assert!(!b.path(&x).exists(), "round {i}: b still has the old name");
    }

    // A directory made, filled and renamed on A: its files are at their new paths on B at once.
    for i in 0..5 {
        let (made, moved) = (format!("made{i}"), format!("moved{i}"));
        std::fs::create_dir_all(a.path(&format!("{made}/sub"))).unwrap();
        std::fs::write(a.path(&format!("{made}/f")), b"f").unwrap();
        std::fs::write(a.path(&format!("{made}/sub/g")), b"g").unwrap();
        std::fs::rename(a.path(&made), a.path(&moved)).unwrap();
        let mut listed: Vec<String> = std::fs::read_dir(b.path(&moved))
            .unwrap_or_else(|e| panic!("round {i}: {e}"))
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        listed.sort();
        assert_eq!(listed, ["f", "sub"], "round {i}: b lists the moved directory so");
        assert_eq!(read(&b.path(&format!("{moved}/f"))), b"f", "round {i}");
        assert_eq!(read(&b.path(&format!("{moved}/sub/g"))), b"g", "round {i}");
        assert!(!b.path(&made).exists(), "round {i}: b still has the old directory");
    }

    // A drained: its held version is gone, home has it; B's next reads get it, never ESTALE.
    for i in 0..5 {
        let f = format!("drained{i}");
        std::fs::write(a.path(&f), format!("w{i}")).unwrap();
        drain_ok(&a, 60);
        for _ in 0..20 {
            match std::fs::read(b.path(&f)) {
                Ok(bytes) => assert_eq!(bytes, format!("w{i}").as_bytes(), "round {i}"),
                Err(e) => panic!("round {i}: b's read after a drained: {e}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    b.unmount();
    a.unmount();
}

#[test]
fn bytes_held_by_a_dead_node_are_an_error_or_homes_version_never_a_mix_and_come_back_with_it() {
    require_fuse();
    let t = TestDir::new("cw-dead");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let old = vec![b'o'; 3 << 20];
    std::fs::write(home.join("f"), &old).unwrap();
    let site = Site::new("cw-dead", &["a", "b", "c"]);
    let tls = certs(&t.root().join("tls"), &["a", "b", "c"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &[LATE.as_slice(), &["--peer-timeout", "2s"]].concat());
    let c = site.node(
        &t,
        &tls,
        "c",
        &[LATE.as_slice(), &["--peer-timeout", "2s", "--holder-lost", "home"]].concat(),
    );
    wait_live(&[&a, &b, &c], 3);

    let new = vec![b'n'; 3 << 20];
    std::fs::write(a.path("f"), &new).unwrap();
    // An open on another node sees the new size at once (close-to-open: the open reads what other nodes
    // published; a bare stat sees it when etcd's watch brings it, a moment later). Nothing of it is read.
    let opened = std::fs::File::open(b.path("f")).unwrap();
    assert_eq!(opened.metadata().unwrap().len(), new.len() as u64);
    drop(opened);

    // A dies with its change unpushed.
    kill_node(a, &b, 2);
    let err = match std::fs::read(b.path("f")) {
        Ok(bytes) => panic!("b read {} bytes held by a dead node", bytes.len()),
        Err(e) => e,
    };
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_same_bytes(
        &read(&c.path("f")),
        &old,
        "c, with --holder-lost home, reads home's version whole",
    );

    // A comes back on its cache, pushes, and B reads A's bytes.
    let a = site.node(&t, &tls, "a", &LATE);
    wait_live(&[&a, &b], 3);
    drain_ok(&a, 60);
    assert_eq!(std::fs::read(home.join("f")).unwrap(), new);
    assert!(
        common::wait_until(Duration::from_secs(10), || std::fs::read(b.path("f"))
            .is_ok_and(|d| d == new)),
        "b reads a's bytes once a pushed them"
    );
    c.unmount();
    b.unmount();
    a.unmount();
}

#[test]
fn two_nodes_appending_to_and_rewriting_one_file_in_turns_end_as_the_sequential_model() {
    require_fuse();
    let t = TestDir::new("cw-turns");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("log"), b"start\n").unwrap();
    let site = Site::new("cw-turns", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);
    let nodes = [&a, &b];
    let mut model = b"start\n".to_vec();
    for turn in 0..12 {
        let (me, other) = (nodes[turn % 2], nodes[(turn + 1) % 2]);
        if turn % 4 == 3 {
            model = format!("rewritten at turn {turn}\n").into_bytes();
            std::fs::write(me.path("log"), &model).unwrap();
        } else {
            let line = format!("turn {turn} on {}\n", if turn % 2 == 0 { "a" } else { "b" });
            let mut f = std::fs::OpenOptions::new().append(true).open(me.path("log")).unwrap();
            std::io::Write::write_all(&mut f, line.as_bytes()).unwrap();
            drop(f);
            model.extend_from_slice(line.as_bytes());
        }
        assert_same_bytes(
            &read(&other.path("log")),
            &model,
            &format!("the other node after turn {turn}"),
        );
        assert_same_bytes(&read(&me.path("log")), &model, &format!("the writer after turn {turn}"));
    }
    drain_ok(&a, 60);
    drain_ok(&b, 60);
    assert_same_bytes(
        &std::fs::read(home.join("log")).unwrap(),
        &model,
        "home after both drained",
    );
    assert!(
        common::larder(&["conflicts", common::s(&a.mnt), "--json"])
            .stdout
            .contains("[]")
            && common::larder(&["conflicts", common::s(&b.mnt), "--json"])
                .stdout
                .contains("[]"),
        "no conflicts"
    );
    b.unmount();
    a.unmount();
}

#[test]
fn a_name_made_in_a_directory_another_node_made_reaches_home_after_that_directory() {
    require_fuse();
    let t = TestDir::new("cw-dir");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let site = Site::new("cw-dir", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);
    std::fs::create_dir_all(a.path("made/on/a")).unwrap();
    std::fs::write(a.path("made/on/a/first"), b"a's").unwrap();
    // B makes a name in A's new directory: A's changes go home first.
    std::fs::write(b.path("made/on/a/second"), b"b's").unwrap();
    assert_eq!(
        std::fs::read(home.join("made/on/a/first")).unwrap(),
        b"a's",
        "a pushed when b made a name there"
    );
    drain_ok(&b, 60);
    drain_ok(&a, 60);
    assert_eq!(std::fs::read(home.join("made/on/a/second")).unwrap(), b"b's");
    assert_eq!(tree(&a.mnt), tree(&home));
    assert!(
        common::wait_until(Duration::from_secs(10), || tree(&b.mnt) == tree(&home)),
        "b's tree is home's"
    );
    b.unmount();
    a.unmount();
}

#[test]
fn a_node_that_serves_nothing_shares_its_changes_through_home_only() {
    require_fuse();
    let t = TestDir::new("cw-client");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("f"), b"old").unwrap();
    let site = Site::new("cw-client", &["a", "c"]);
    let tls = certs(&t.root().join("tls"), &["a", "c"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let mut args = site.cluster_options("c", &tls, false);
    args.extend(site::NODE_OPTIONS.iter().chain(LATE.iter()).map(|s| s.to_string()));
    let c = site.mount(&t, "c", common::s(&home), &args, &[]);
    wait_live(&[&a, &c], 2);
    std::fs::write(c.path("f"), b"new from c").unwrap();
    // Nothing published that a could not read: a reads home's version, not an error.
    assert_eq!(read(&a.path("f")), b"old");
    drain_ok(&c, 60);
    assert_eq!(std::fs::read(home.join("f")).unwrap(), b"new from c");
    c.unmount();
    a.unmount();
}

#[test]
fn over_an_s3_home_a_file_written_on_one_node_is_read_on_another_before_the_bucket_has_it() {
    require_fuse();
    let site = Site::new("cw-s3", &["a", "b"]);
    let st = moto::S3Test::new_on("cw-s3", "home", &site.net.host_ip().to_string());
    st.put(&st.key("dir/f"), b"the bucket's version");
    let tls = certs(&st.t.root().join("tls"), &["a", "b"]);
    let env = st.srv.env();
    let node = |n: &str| {
        let mut args = site.cluster_options(n, &tls, true);
        args.extend(st.mount_args(&site::NODE_OPTIONS).iter().map(|a| a.to_string()));
        args.extend(LATE.iter().map(|a| a.to_string()));
        site.mount(&st.t, n, &st.url(), &args, &env)
    };
    let (a, b) = (node("a"), node("b"));
    wait_live(&[&a, &b], 2);
    assert_eq!(read(&b.path("dir/f")), b"the bucket's version");
    let new = vec![b'z'; 3 << 20];
    std::fs::write(a.path("dir/f"), &new).unwrap();
    std::fs::write(a.path("dir/g"), b"made on a").unwrap();
    assert_same_bytes(&read(&b.path("dir/f")), &new, "b reads a's bytes");
    assert_eq!(read(&b.path("dir/g")), b"made on a");
    assert_eq!(
        st.get(&st.key("dir/f")),
        b"the bucket's version",
        "the bucket has none of it yet"
    );
    drain_ok(&a, 60);
    assert_same_bytes(&st.get(&st.key("dir/f")), &new, "the bucket after a drained");
    assert_eq!(st.get(&st.key("dir/g")), b"made on a");
    b.unmount();
    a.unmount();
}

#[test]
fn with_etcd_away_a_node_writes_alone_and_publishes_once_etcd_is_back() {
    require_fuse();
    let t = TestDir::new("cw-etcd");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("f"), b"old").unwrap();
    let mut site = Site::new("cw-etcd", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &LATE);
    let b = site.node(&t, &tls, "b", &LATE);
    wait_live(&[&a, &b], 2);
    assert_eq!(read(&b.path("f")), b"old");
    site.etcd.kill();
    let offline = |m: &Mount| m.status()["cluster"]["etcd_online"] == false;
    assert!(common::wait_until(Duration::from_secs(30), || offline(&a) && offline(&b)));
    // A writes alone; B reads what it knows.
    std::fs::write(a.path("f"), b"written while etcd was away").unwrap();
    std::fs::write(a.path("g"), b"made while etcd was away").unwrap();
    // More changes than etcd takes in one transaction (128 operations).
    std::fs::create_dir(a.path("many")).unwrap();
    for i in 0..200 {
        std::fs::write(a.path(&format!("many/{i}")), format!("{i}")).unwrap();
    }
    assert_eq!(read(&b.path("f")), b"old");
    site.etcd.run();
    // Once etcd is back, A publishes what it changed meanwhile, and B reads it.
    assert!(
        common::wait_until(Duration::from_secs(30), || std::fs::read(b.path("g"))
            .is_ok_and(|d| d == b"made while etcd was away")
            && std::fs::read(b.path("f")).is_ok_and(|d| d == b"written while etcd was away")
            && std::fs::read(b.path("many/199")).is_ok_and(|d| d == b"199")),
        "b never saw a's changes made while etcd was away: {}",
        b.status()["cluster"]
    );
    // Once both journals are empty, no held record is left in etcd, and A logged its retries a few
    // times at most.
    drain_ok(&a, 60);
    drain_ok(&b, 60);
    // etcd's JSON gateway: how many keys start with the held records' prefix.
    let count = r#"
import base64, json, sys, urllib.request
b = lambda x: base64.b64encode(x).decode()
prefix = sys.argv[2].encode()
end = prefix[:-1] + bytes([prefix[-1] + 1])
body = json.dumps({"key": b(prefix), "range_end": b(end), "count_only": True}).encode()
print(json.load(urllib.request.urlopen(sys.argv[1] + "/v3/kv/range", body)).get("count", 0))
"#;
    let held = || {
        let out = common::run_cmd(
            "python3",
            &["-c", count, &site.etcd.endpoint(), "/larder/test/held/"],
            Duration::from_secs(10),
        );
        assert!(out.success(), "{out}");
        out.stdout.trim().parse::<usize>().unwrap()
    };
    assert!(
        common::wait_until(Duration::from_secs(10), || held() == 0),
        "{} held records stayed in etcd after both journals drained",
        held()
    );
    let retries = a.log().matches("could not publish").count();
    assert!(retries <= 3, "a logged {retries} failed publications");
    b.unmount();
    a.unmount();
}

/// Append `line` to `path`; the error if the write or the close fails.
fn append(path: &Path, line: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
    std::io::Write::write_all(&mut f, line)?;
    f.sync_all()
}

#[test]
fn with_home_away_a_file_another_node_changed_is_handed_over_peer_to_peer_and_every_write_lands() {
    require_fuse();
    let t = TestDir::new("cw-handover");
    let home = t.root().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // Over three blocks, so that the copy a hand-over makes spans several.
    let mut want: Vec<u8> = (0..(3 << 20) + 1000).map(|i| (i % 251) as u8).collect();
    std::fs::write(home.join("f"), &want).unwrap();
    let away = t.root().join("home-away");
    let opts = [
        "--write-mode",
        "write-back",
        "--sync-lag",
        "1s",
        "--fault-file",
        common::s(&away),
    ];
    let site = Site::new("cw-handover", &["a", "b"]);
    let tls = certs(&t.root().join("tls"), &["a", "b"]);
    let a = site.node(&t, &tls, "a", &opts);
    let b = site.node(&t, &tls, "b", &opts);
    wait_live(&[&a, &b], 2);
    assert_same_bytes(&read(&a.path("f")), &want, "a before");
    assert_same_bytes(&read(&b.path("f")), &want, "b before");
    // A writes `g`; B reads it from A (as A's held version); then home has it, and A keeps its token.
    std::fs::write(a.path("g"), b"g from a\n").unwrap();
    let mut g = b"g from a\n".to_vec();
    assert_eq!(read(&b.path("g")), g, "b reads g from a");
    drain_ok(&a, 60);
    wait_records_gone(&a, "a forgets its record of g once home has it");

    // Home goes away. A changes a block in the middle of the file, its mode, and its end.
    std::fs::write(&away, b"").unwrap();
    let middle = b"written on a while home is away";
    let at = (1 << 20) + 5;
    {
        let f = std::fs::OpenOptions::new().write(true).open(a.path("f")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, middle, at as u64).unwrap();
        f.sync_all().unwrap();
    }
    want[at..at + middle.len()].copy_from_slice(middle);
    std::fs::set_permissions(a.path("f"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    append(&a.path("f"), b"appended on a\n").unwrap();
    want.extend_from_slice(b"appended on a\n");

    // A file open on A before it hands the file over reads the newest version after.
    let held_open = std::fs::File::open(a.path("f")).unwrap();

    // B changes it next: A cannot push, so it hands its changes over with the token, peer to peer, and
    // B's write lands on them (refused with EIO before, once A had tried home for 30 s).
    let mut turns = vec![(&b, "b"), (&a, "a"), (&b, "b")];
    for (round, (node, name)) in turns.drain(..).enumerate() {
        let line = format!("appended on {name} in round {round}\n");
        append(&node.path("f"), line.as_bytes())
            .unwrap_or_else(|e| panic!("{name}'s append in round {round}: {e}\n{}", node.log()));
        want.extend_from_slice(line.as_bytes());
        assert_same_bytes(&read(&a.path("f")), &want, &format!("a after round {round}"));
        assert_same_bytes(&read(&b.path("f")), &want, &format!("b after round {round}"));
        assert_eq!(
            std::fs::metadata(a.path("f")).unwrap().mode() & 0o777,
            0o600,
            "the mode a set goes with the changes"
        );
        let mut through_handle = vec![0u8; want.len()];
        std::os::unix::fs::FileExt::read_exact_at(&held_open, &mut through_handle, 0).unwrap();
        assert_same_bytes(&through_handle, &want, &format!("a's open file after round {round}"));
    }
    drop(held_open);
    // A has nothing of `g` queued (its other changes wait for home): it gives the token up at once, and
    // tells B which version home has of what B read from it (B cannot ask home).
    append(&b.path("g"), b"g from b\n").unwrap();
    g.extend_from_slice(b"g from b\n");
    assert_same_bytes(&read(&a.path("g")), &g, "a reads b's change of g");
    assert_eq!(
        std::fs::read(home.join("f")).unwrap().len(),
        (3 << 20) + 1000,
        "home has none of it yet"
    );
    // Only B, the last to change the file, queues it: A dropped what it handed over.
    assert_eq!(
        common::num(&a.status(), "/journal/pending_ops"),
        0,
        "{}",
        a.status()["journal"]
    );
    assert!(common::num(&b.status(), "/journal/pending_ops") >= 1);

    // B dies with the changes unpushed: what it acknowledged is in its cache.
    kill_node(b, &a, 1);
    // Home comes back; B is mounted again on its cache and pushes what it took over, on A's base.
    std::fs::remove_file(&away).unwrap();
    let b = site.node(&t, &tls, "b", &opts);
    wait_live(&[&a, &b], 2);
    drain_ok(&b, 60);
    drain_ok(&a, 60);
    assert_same_bytes(
        &std::fs::read(home.join("f")).unwrap(),
        &want,
        "home after both drained",
    );
    assert_eq!(std::fs::metadata(home.join("f")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read(home.join("g")).unwrap(), g, "{}\n{}", b.log(), a.log());
    assert_eq!(common::names(&home), vec!["f", "g"], "no conflict copy at home");
    for m in [&a, &b] {
        let listed = common::larder(&["conflicts", common::s(&m.mnt), "--json"]).stdout;
        assert!(listed.contains("[]"), "conflicts on {}: {listed}", m.mnt.display());
    }
    assert_same_bytes(&read(&a.path("f")), &want, "a at the end");
    b.unmount();
    a.unmount();
}
