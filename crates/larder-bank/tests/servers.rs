//! The bank against real memcached and Redis servers.

use std::time::{Duration, Instant};

use larder_bank::testing::CacheServer;
use larder_bank::{Bank, BankConfig, BankError, BankUrl};

fn bank(url: &str) -> Bank {
    Bank::connect(&BankUrl::parse(url).unwrap(), &BankConfig::default()).unwrap()
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn round_trips_at_every_size(url: &str) {
    let b = bank(url);
    let sizes = [0, 1, 4096, (1 << 20) - 600, 1 << 20, (3 << 20) + 17];
    for (i, &n) in sizes.iter().enumerate() {
        let value = bytes(n, i as u8);
        b.put(&format!("k{i}"), &value, Duration::ZERO).unwrap();
        assert_eq!(
            b.get(&format!("k{i}")).unwrap().as_deref(),
            Some(&value[..]),
            "a value of {n} bytes"
        );
    }
    assert_eq!(b.get("never-set").unwrap(), None);
    let s = b.stats();
    assert_eq!((s.hits, s.misses, s.errors, s.bad), (sizes.len() as u64, 1, 0, 0));
}

#[test]
fn values_of_every_size_come_back_exact_from_memcached_past_its_item_limit() {
    let m = CacheServer::memcached();
    round_trips_at_every_size(&m.url());
}

#[test]
fn values_of_every_size_come_back_exact_from_redis() {
    let r = CacheServer::redis();
    round_trips_at_every_size(&r.url());
}

#[test]
fn the_item_limit_is_read_at_connect_and_a_larger_one_takes_fewer_chunks() {
    // With -I 4m a 3 MiB value is one item: deleting what would be its second chunk changes nothing.
    let big = CacheServer::memcached_with(4 << 20);
    let b = bank(&big.url());
    let value = bytes(3 << 20, 7);
    b.put("one", &value, Duration::ZERO).unwrap();
    let raw = memcache::Client::connect(format!("memcache://{}", big.addr())).unwrap();
    assert!(
        raw.get::<Vec<u8>>("one").unwrap().unwrap().len() > 3 << 20,
        "stored as one item"
    );
    assert_eq!(b.get("one").unwrap().unwrap(), value);
}

#[test]
fn a_lost_chunk_or_a_damaged_value_is_a_miss_never_wrong_bytes() {
    let m = CacheServer::memcached();
    let b = bank(&m.url());
    let raw = memcache::Client::connect(format!("memcache://{}", m.addr())).unwrap();
    let value = bytes(3 << 20, 1);

    // A chunk evicted: the head alone is not the value.
    b.put("v", &value, Duration::ZERO).unwrap();
    let head: Vec<u8> = raw.get("v").unwrap().unwrap();
    let generation = u64::from_le_bytes(head[3..11].try_into().unwrap());
    assert!(
        raw.delete(&format!("v.{generation:016x}.2")).unwrap(),
        "the value has a second chunk"
    );
    assert!(matches!(b.get("v"), Err(BankError::Bad(_))));

    // A byte flipped in the head's data.
    b.put("v", &value, Duration::ZERO).unwrap();
    let mut head: Vec<u8> = raw.get("v").unwrap().unwrap();
    let last = head.len() - 1;
    head[last] ^= 1;
    raw.set("v", &head[..], 0).unwrap();
    assert!(matches!(b.get("v"), Err(BankError::Bad(_))));

    // Something else stored under the key.
    raw.set("v", "not a bank value", 0).unwrap();
    assert!(matches!(b.get("v"), Err(BankError::Bad(_))));
    assert_eq!(b.stats().bad, 3);

    // The next good put is read back.
    b.put("v", &value, Duration::ZERO).unwrap();
    assert_eq!(b.get("v").unwrap().unwrap(), value);
}

#[test]
fn a_killed_server_is_a_quick_miss_and_is_asked_again_once_it_is_back() {
    let mut m = CacheServer::memcached();
    let b = bank(&m.url());
    b.put("k", b"value", Duration::ZERO).unwrap();
    m.kill();
    let started = Instant::now();
    assert!(b.get("k").is_err());
    assert!(
        matches!(b.get("k"), Err(BankError::Skipped(_))),
        "skipped after a failure"
    );
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(b.stats().servers_down, 1);
    m.run();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if b.put("k", b"again", Duration::ZERO).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "the bank never asked the server again");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(b.get("k").unwrap().as_deref(), Some(&b"again"[..]));
}

#[test]
fn keys_spread_over_the_servers_and_each_is_read_where_it_was_written() {
    let (a, c) = (CacheServer::memcached(), CacheServer::memcached());
    let b = bank(&format!("memcache://{},{}", a.addr(), c.addr()));
    for i in 0..200 {
        b.put(&format!("k{i}"), format!("v{i}").as_bytes(), Duration::ZERO)
            .unwrap();
    }
    let on = |s: &CacheServer| {
        let raw = memcache::Client::connect(format!("memcache://{}", s.addr())).unwrap();
        (0..200)
            .filter(|i| raw.get::<Vec<u8>>(&format!("k{i}")).unwrap().is_some())
            .count()
    };
    let (na, nc) = (on(&a), on(&c));
    assert_eq!(na + nc, 200, "each key on one server");
    assert!((60..=140).contains(&na), "{na} of 200 on the first server");
    for i in 0..200 {
        assert_eq!(b.get(&format!("k{i}")).unwrap().unwrap(), format!("v{i}").as_bytes());
    }
}

#[test]
fn a_bank_none_of_whose_servers_answers_is_refused_at_connect_with_its_address() {
    let port = larder_bank::testing::free_port();
    let url = format!("memcache://127.0.0.1:{port}");
    let e = Bank::connect(&BankUrl::parse(&url).unwrap(), &BankConfig::default())
        .err()
        .unwrap();
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    // A Redis server is not a memcached one.
    let r = CacheServer::redis();
    let e = Bank::connect(
        &BankUrl::parse(&format!("memcache://{}", r.addr())).unwrap(),
        &BankConfig::default(),
    )
    .err()
    .unwrap();
    assert!(e.contains("no server of the bank"), "{e}");
}

#[test]
fn queued_fills_are_written_in_the_background_and_a_full_queue_drops_rather_than_waits() {
    let m = CacheServer::memcached();
    let config = BankConfig {
        queue_bytes: 1 << 20,
        ..BankConfig::default()
    };
    let b = Bank::connect(&BankUrl::parse(&m.url()).unwrap(), &config).unwrap();
    let values: Vec<Vec<u8>> = (0..64).map(|i| bytes(256 << 10, i as u8)).collect();
    let started = Instant::now();
    for (i, v) in values.into_iter().enumerate() {
        b.put_later(format!("q{i}"), v, Duration::ZERO);
    }
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(b.settle(Duration::from_secs(20)));
    let s = b.stats();
    assert!(s.dropped > 0, "a 1 MiB queue cannot hold 16 MiB queued at once");
    assert_eq!(s.puts + s.dropped, 64);
    let kept = (0..64).filter(|i| b.get(&format!("q{i}")).unwrap().is_some()).count() as u64;
    assert_eq!(kept, s.puts);
}
