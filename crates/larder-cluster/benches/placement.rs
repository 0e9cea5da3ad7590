//! Placement beyond this machine, by simulation of the placement code itself: 10, 100 and 1,000 members
//! of unequal weights holding 10 million units. For each size: the most and least loaded member's share
//! against its weight's, the units that move when a member joins and when one leaves (against the share
//! rendezvous hashing moves by construction: the joiner's or the leaver's weight over the total), and
//! owner lookups per second on one thread.
//!
//!     cargo bench -p larder-cluster --bench placement -- [--units 10000000] [--members 10,100,1000]
//!                                                      [--out bench/results/placement.json]
//!
//! JSON to `--out`, a table on stdout and as Markdown beside the JSON.

use std::time::Instant;

use larder_cluster::placement::score;
use larder_cluster::{Member, Placement, UnitDigest};
use xxhash_rust::xxh3::xxh3_64_with_seed;

struct Args {
    units: usize,
    members: Vec<usize>,
    out: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        units: 10_000_000,
        members: vec![10, 100, 1000],
        out: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--units" => a.units = it.next().and_then(|v| v.parse().ok()).expect("--units N"),
            "--members" => {
                a.members = it
                    .next()
                    .expect("--members LIST")
                    .split(',')
                    .map(|v| v.parse().expect("a member count"))
                    .collect()
            }
            "--out" => a.out = it.next(),
            // `cargo bench` passes --bench.
            _ => {}
        }
    }
    a
}

/// Unit `i`'s key digest, as uniform as part 7's SHA-256 digests.
fn unit(i: u64) -> UnitDigest {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&xxh3_64_with_seed(&i.to_le_bytes(), 1).to_le_bytes());
    d[8..].copy_from_slice(&xxh3_64_with_seed(&i.to_le_bytes(), 2).to_le_bytes());
    d
}

/// `n` members with cache sizes (GiB) spread over 100 GiB to 2 TiB, and random-looking ids.
fn members(n: usize) -> Vec<Member> {
    const SIZES: [u64; 5] = [100, 250, 500, 1000, 2000];
    (0..n as u64)
        .map(|i| Member {
            id: xxh3_64_with_seed(&i.to_le_bytes(), 7) | 1,
            weight: SIZES[i as usize % SIZES.len()] + i % 7,
        })
        .collect()
}

/// Per unit: the best member (index) and its score, and the second best.
struct Ranked {
    best: Vec<u32>,
    best_score: Vec<f64>,
    second: Vec<u32>,
}

fn rank_all(list: &[Member], units: usize) -> Ranked {
    let mut r = Ranked {
        best: vec![0; units],
        best_score: vec![0.0; units],
        second: vec![0; units],
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = units.div_ceil(threads);
    std::thread::scope(|s| {
        let parts = r
            .best
            .chunks_mut(chunk)
            .zip(r.best_score.chunks_mut(chunk))
            .zip(r.second.chunks_mut(chunk))
            .enumerate();
        for (t, ((best, best_score), second)) in parts {
            s.spawn(move || {
                for j in 0..best.len() {
                    let u = unit((t * chunk + j) as u64);
                    let (mut b, mut bs, mut sec, mut ss) = (0u32, f64::MIN, 0u32, f64::MIN);
                    for (k, m) in list.iter().enumerate() {
                        let sc = score(&u, m.id, m.weight as f64);
                        if sc > bs {
                            (sec, ss) = (b, bs);
                            (b, bs) = (k as u32, sc);
                        } else if sc > ss {
                            (sec, ss) = (k as u32, sc);
                        }
                    }
                    best[j] = b;
                    best_score[j] = bs;
                    second[j] = sec;
                }
            });
        }
    });
    r
}

fn main() {
    let a = args();
    let mut rows = Vec::new();
    println!("{} units; members of weights 100-2006 (GiB of cache)", a.units);
    println!(
        "{:>8} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>13} {:>9}",
        "members",
        "max/share",
        "min/share",
        "join moved",
        "join want",
        "leave mvd",
        "leave want",
        "lookups/s",
        "rank s"
    );
    for &n in &a.members {
        let list = members(n);
        let total: f64 = list.iter().map(|m| m.weight as f64).sum();
        let started = Instant::now();
        let r = rank_all(&list, a.units);
        let rank_seconds = started.elapsed().as_secs_f64();

        // Load against weight.
        let mut owned = vec![0u64; n];
        for &b in &r.best {
            owned[b as usize] += 1;
        }
        let ratio = |k: usize| owned[k] as f64 / (a.units as f64 * list[k].weight as f64 / total);
        let max_ratio = (0..n).map(ratio).fold(f64::MIN, f64::max);
        let min_ratio = (0..n).map(ratio).fold(f64::MAX, f64::min);

        // A member of the middle weight joins: a unit moves if and only if the joiner outscores its owner.
        let joiner = Member {
            id: 0xfeed_f00d_0000_0001,
            weight: 500,
        };
        let join_moved = (0..a.units)
            .filter(|&i| score(&unit(i as u64), joiner.id, joiner.weight as f64) > r.best_score[i])
            .count();
        let join_want = joiner.weight as f64 / (total + joiner.weight as f64);

        // Member 0 leaves: its units, and only they, move (to their second candidate).
        let leave_moved = owned[0] as usize;
        let leave_want = list[0].weight as f64 / total;
        // Spot-check the simulation against the real placement after the leave.
        let without = Placement::new(list[1..].iter().copied());
        for i in (0..a.units).step_by((a.units / 2000).max(1)) {
            let want = if r.best[i] == 0 { r.second[i] } else { r.best[i] };
            assert_eq!(without.owner(&unit(i as u64)), Some(list[want as usize].id));
        }

        // Lookups per second of the owner function, one thread.
        let p = Placement::new(list.iter().copied());
        let count = (20_000_000 / n).clamp(10_000, 2_000_000);
        let started = Instant::now();
        let mut check = 0u64;
        for i in 0..count {
            check ^= p.owner(&unit(i as u64)).unwrap_or(0);
        }
        let lookups = count as f64 / started.elapsed().as_secs_f64();
        std::hint::black_box(check);

        let (jm, lm) = (join_moved as f64 / a.units as f64, leave_moved as f64 / a.units as f64);
        println!(
            "{n:>8} {max_ratio:>11.4} {min_ratio:>11.4} {jm:>10.5} {join_want:>10.5} {lm:>10.5} {leave_want:>10.5} {lookups:>13.0} {rank_seconds:>9.1}"
        );
        rows.push(serde_json::json!({
            "members": n, "units": a.units, "total_weight": total,
            "max_load_over_share": max_ratio, "min_load_over_share": min_ratio,
            "join_moved_share": jm, "join_expected_share": join_want,
            "leave_moved_share": lm, "leave_expected_share": leave_want,
            "owner_lookups_per_s": lookups.round(), "rank_seconds": rank_seconds,
        }));
    }
    let result = serde_json::json!({
        "units": a.units,
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "rows": rows,
    });
    if let Some(out) = a.out {
        std::fs::write(&out, serde_json::to_string_pretty(&result).unwrap()).unwrap();
        let mut md = format!(
            "# Placement by weighted rendezvous hashing, simulated\n\n{} units over members of weights 100-2006 \
             (GiB of cache); `cargo bench -p larder-cluster --bench placement`. Load is a member's units over its \
             weight's share of them; a join adds a member of weight 500, a leave removes the first member; \
             \"expected\" is the share rendezvous hashing moves by construction (the joiner's or leaver's weight \
             over the total).\n\n\
             | members | most loaded / share | least loaded / share | moved on a join | expected | moved on a leave | expected | owner lookups/s (1 thread) |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|\n",
            a.units
        );
        for r in result["rows"].as_array().unwrap() {
            let f = |k: &str| r[k].as_f64().unwrap();
            md.push_str(&format!(
                "| {} | {:.4} | {:.4} | {:.5} | {:.5} | {:.5} | {:.5} | {:.0} |\n",
                r["members"],
                f("max_load_over_share"),
                f("min_load_over_share"),
                f("join_moved_share"),
                f("join_expected_share"),
                f("leave_moved_share"),
                f("leave_expected_share"),
                f("owner_lookups_per_s"),
            ));
        }
        std::fs::write(std::path::Path::new(&out).with_extension("md"), md).unwrap();
        println!("JSON: {out}");
    }
}
