//! `larder demo`: build a demo home (a few hundred small files and one large file), mount it behind an
//! emulated slow link, read everything cold and then warm, and print what it cost each time.
//!
//! Before the warm pass the kernel's caches are dropped (when run as root), so the warm figures are
//! larder's own cache on local disk, not the kernel's page cache.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cli::DemoArgs;
use crate::{mounts, status};

const DIRS: usize = 20;

/// Deterministic pseudo-random bytes (xorshift64*), fast enough to make a large file quickly.
struct Prng(u64);

impl Prng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

fn small_path(home: &Path, i: usize) -> PathBuf {
    home.join(format!("docs/d{:02}/file{i:04}.txt", i % DIRS))
}

fn big_path(home: &Path) -> PathBuf {
    home.join("data/dataset.bin")
}

/// Create the demo home unless one of the same shape is there already.
fn build_home(home: &Path, args: &DemoArgs) -> Result<()> {
    let stamp = home.with_extension("ready");
    let want = format!("{} {}", args.small_files, args.big_size);
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    if home.exists() {
        std::fs::remove_dir_all(home)?;
    }
    let mut rng = Prng(0x9e37_79b9_7f4a_7c15);
    for i in 0..args.small_files {
        let path = small_path(home, i);
        std::fs::create_dir_all(path.parent().unwrap_or(home))?;
        let size = 512 + (rng.next() % (64 << 10)) as usize;
        let mut buf = vec![0u8; size];
        rng.fill(&mut buf);
        std::fs::write(&path, &buf)?;
    }
    std::fs::create_dir_all(home.join("data"))?;
    let mut f = std::fs::File::create(big_path(home))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = args.big_size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill(&mut buf[..n]);
        std::io::Write::write_all(&mut f, &buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    std::fs::write(&stamp, want)?;
    Ok(())
}

fn larder(args: &[&std::ffi::OsStr]) -> Result<()> {
    let out = Command::new(std::env::current_exe()?).args(args).output()?;
    if !out.status.success() {
        bail!(
            "larder {:?} failed: {}",
            args,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[derive(Clone, Copy, Default)]
struct Cost {
    seconds: f64,
    ops: u64,
    bytes: u64,
}

fn counters(mnt: &Path) -> Result<(u64, u64)> {
    let v = status::fetch(mnt)?;
    Ok((v.home.ops, v.home.bytes_read))
}

fn measure(mnt: &Path, f: impl FnOnce() -> Result<()>) -> Result<Cost> {
    let (ops0, bytes0) = counters(mnt)?;
    let start = Instant::now();
    f()?;
    let seconds = start.elapsed().as_secs_f64();
    let (ops1, bytes1) = counters(mnt)?;
    Ok(Cost {
        seconds,
        ops: ops1 - ops0,
        bytes: bytes1 - bytes0,
    })
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

fn read_all(path: &Path, buf: &mut [u8]) -> Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut total = 0;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            return Ok(total);
        }
        total += n as u64;
    }
}

fn drop_kernel_caches() -> bool {
    // SAFETY: sync and geteuid have no preconditions.
    unsafe { libc::sync() };
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() == 0 };
    root && std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

fn same_content(a: &Path, b: &Path) -> Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = read_exactish(&mut fa, &mut ba)?;
        let nb = read_exactish(&mut fb, &mut bb)?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

fn read_exactish(f: &mut std::fs::File, buf: &mut [u8]) -> Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read(&mut buf[done..])?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

/// `larder demo`.
pub fn run(args: DemoArgs) -> Result<()> {
    let dir = mounts::absolute(&args.dir)?;
    let (home, mnt, cache) = (dir.join("home"), dir.join("mnt"), dir.join("cache"));
    std::fs::create_dir_all(&dir)?;
    if mounts::mounted_at(&mnt) == mounts::Mounted::Larder {
        let _ = mounts::kernel_unmount(&mnt, true);
    }
    println!("building the demo home in {} ...", home.display());
    build_home(&home, &args)?;
    if cache.exists() {
        std::fs::remove_dir_all(&cache)?;
    }
    std::fs::create_dir_all(&mnt)?;
    let wan = format!(
        "latency={}ms{}",
        args.wan.latency.as_millis(),
        args.wan
            .bandwidth
            .map(|b| format!(",bandwidth={}MiB/s", b >> 20))
            .unwrap_or_default()
    );
    larder(&[
        "mount".as_ref(),
        home.as_os_str(),
        mnt.as_os_str(),
        "--cache-dir".as_ref(),
        cache.as_os_str(),
        "--emulate-wan".as_ref(),
        wan.as_ref(),
        "--validity-lag".as_ref(),
        "1h".as_ref(),
    ])?;
    let result = passes(&args, &home, &mnt, &wan);
    let unmounted = larder(&["unmount".as_ref(), mnt.as_os_str()]);
    result?;
    unmounted
}

fn passes(args: &DemoArgs, home: &Path, mnt: &Path, wan: &str) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let small: Vec<PathBuf> = (0..args.small_files).map(|i| small_path(mnt, i)).collect();
    let small_bytes: u64 = (0..args.small_files)
        .map(|i| std::fs::metadata(small_path(home, i)).map_or(0, |m| m.len()))
        .sum();
    let mut rows: Vec<(String, Cost, Cost)> = Vec::new();
    let mut pass = |warm: bool, rows: &mut Vec<(String, Cost, Cost)>| -> Result<()> {
        let stat = measure(mnt, || {
            let mut all = Vec::new();
            walk(mnt, &mut all)?;
            if all.len() != args.small_files + 1 {
                bail!("the mount lists {} files, home has {}", all.len(), args.small_files + 1);
            }
            Ok(())
        })?;
        let read_small = measure(mnt, || {
            for p in &small {
                read_all(p, &mut buf)?;
            }
            Ok(())
        })?;
        let read_big = measure(mnt, || {
            let n = read_all(&big_path(mnt), &mut buf)?;
            if n != args.big_size {
                bail!("read {n} bytes of the large file, expected {}", args.big_size);
            }
            Ok(())
        })?;
        let labels = [
            format!("list + stat {} files", args.small_files + 1),
            format!(
                "read {} small files ({})",
                args.small_files,
                status::human_bytes(small_bytes)
            ),
            format!("read the {} file", status::human_bytes(args.big_size)),
        ];
        for (i, (label, cost)) in labels.into_iter().zip([stat, read_small, read_big]).enumerate() {
            if warm {
                rows[i].2 = cost;
            } else {
                rows.push((label, cost, Cost::default()));
            }
        }
        Ok(())
    };
    println!("cold pass: home {} behind {wan}", home.display());
    pass(false, &mut rows)?;
    let dropped = drop_kernel_caches();
    println!(
        "warm pass: {}",
        if dropped {
            "kernel caches dropped first, so this is larder's disk cache"
        } else {
            "kernel caches kept (not root)"
        }
    );
    pass(true, &mut rows)?;

    let mut identical = same_content(&big_path(mnt), &big_path(home))?;
    for i in 0..args.small_files {
        identical &= same_content(&small_path(mnt, i), &small_path(home, i))?;
    }

    println!();
    println!(
        "{:<34} {:>9} {:>9} {:>8} {:>15} {:>17}",
        "phase", "cold", "warm", "speedup", "home ops c/w", "home read c/w"
    );
    for (label, cold, warm) in &rows {
        println!(
            "{:<34} {:>8.3}s {:>8.3}s {:>7.0}x {:>15} {:>17}",
            label,
            cold.seconds,
            warm.seconds,
            cold.seconds / warm.seconds.max(1e-6),
            format!("{} / {}", cold.ops, warm.ops),
            format!(
                "{} / {}",
                status::human_bytes(cold.bytes),
                status::human_bytes(warm.bytes)
            ),
        );
    }
    let warm_ops: u64 = rows.iter().map(|r| r.2.ops).sum();
    println!();
    println!("home operations during the warm pass: {warm_ops}");
    println!(
        "content through the mount identical to home: {}",
        if identical { "yes" } else { "NO" }
    );
    if !identical {
        bail!("content read through the mount differs from home");
    }
    Ok(())
}
