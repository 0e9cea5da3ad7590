//! `larder mount`: check, start the daemon, wait until it serves (or print why it could not).
//!
//! Without `--foreground` the command re-runs itself as a detached daemon whose standard output is a pipe
//! back to the command: the daemon writes `READY` once the kernel mount is live, or `error: ...`. Its logs
//! go to `larder.log` in the cache directory.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use fuser::{Config, MountOption, Session, SessionACL};
use larder_bank::{Bank, BankConfig};
use larder_bank::{BankStat, BankTier};
use larder_cache::{Db, Store, StoreConfig};
use larder_cluster::coherence::EtcdCoherence;
use larder_cluster::locks::EtcdLocks;
use larder_cluster::node::{FsUnitSource, Migrator};
use larder_cluster::peer::{ADMIT_GRACE, Admit, PeerClient, PeerConfig, PeerServer, PeerStats};
use larder_cluster::tier::{PeerTier, Whereabouts};
use larder_cluster::{EtcdTls, MemberRecord, Membership, MembershipConfig, NodeTls};
use larder_fs::coherence::HeldOverlay;
use larder_fs::{Fs, FsConfig, WriteMode};
use larder_fuse::LarderFuse;
use larder_home::{Health, HealthLayer, Home, Layered};

use crate::cli::{HolderLost, MountArgs, OnOff};
use crate::status::StatusSource;
use crate::{control, metrics, mounts, preflight};

const NOTIFY_ENV: &str = "LARDER_NOTIFY";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Tell glibc's allocator to serve buffers of up to 4 MiB (units, blocks, peers' chunks, FUSE replies)
/// from its heaps and to keep up to 64 MiB free at a heap's top, rather than map fresh pages for each
/// and unmap them when it is freed: its default threshold for that is 128 KiB (growing only as mapped
/// buffers are freed), and every 1 MiB unit then costs page faults and zeroed pages. Measured with the
/// transport bench (`cargo bench -p larder-cluster --bench transport`): the CPU per GiB of peer data
/// fell from 6.45 to 3.54 seconds. Called before the daemon starts any thread.
fn keep_large_buffers() {
    // SAFETY: mallopt changes settings of the allocator; no other thread is running yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// `larder mount`.
pub fn mount(args: MountArgs) -> Result<()> {
    if args.foreground {
        keep_large_buffers();
        let notify = std::env::var(NOTIFY_ENV).as_deref() == Ok("1");
        let result = serve(&args, notify);
        if let Err(e) = &result
            && notify
        {
            println!("error: {e:#}");
        }
        return result;
    }
    let prepared = preflight::check(&args)?;
    if let Some(note) = &prepared.note {
        eprintln!("larder: note: {note}");
    }
    if let Some(warning) = args.metrics_addr.and_then(metrics::exposure_warning) {
        eprintln!("larder: warning: {warning}");
    }
    let log_path = prepared.cache_dir.join("larder.log");
    let log = larder_util::private::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open the log {}", log_path.display()))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(crate::invocation::given()).arg("--foreground");
    if args.cache_dir.is_none() {
        cmd.arg("--cache-dir").arg(&prepared.cache_dir);
    }
    cmd.env(NOTIFY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    drop(prepared);
    let mut child = cmd.spawn().context("cannot start the larder daemon")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("daemon has no output pipe"))?;
    let mut errors = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if line == "READY" {
            // Silent on success, as mount helpers are, unless a person is watching.
            if args.quiet || !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                return Ok(());
            }
            let mnt = mounts::absolute(&args.mountpoint)?;
            println!(
                "larder: serving {} at {} (pid {})",
                args.home,
                mnt.display(),
                child.id()
            );
            return Ok(());
        }
        if let Some(e) = line.strip_prefix("error: ") {
            errors.push(e.to_string());
        }
    }
    let status = child.wait()?;
    match errors.first() {
        Some(e) => bail!("{e}"),
        None => bail!(
            "the daemon exited ({status}) before the mount was ready; see {}",
            log_path.display()
        ),
    }
}

pub(crate) fn init_logging(filter: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local, zero-initialised set; pthread_sigmask on the current thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// On SIGTERM, SIGINT or SIGHUP: detach the mount so the session ends once no file is open.
fn watch_signals(set: libc::sigset_t, mountpoint: PathBuf) {
    let _ = std::thread::Builder::new()
        .name("larder-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is a valid signal set and `sig` a valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                tracing::info!(signal = sig, "signal received; unmounting");
                // A service manager waiting on the stop hears that it began.
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                if let Err(e) = mounts::kernel_unmount(&mountpoint, true) {
                    tracing::error!(error = %e, "unmount on signal failed");
                }
            }
        });
}

/// Longest a mount waits for the daemon of a mount that is gone to finish closing the same cache dir
/// (an unmount returns before its daemon has put the cache on record and exited).
const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Take the cache dir `dir` for this process, for a mount at `mountpoint` (noted in the lock file, with
/// this process's pid). Another larder holding it is an error at once, unless the mount it noted is gone:
/// that daemon is closing the cache, and is waited for, at most [`CLOSING_WAIT`].
pub(crate) fn lock_cache_dir(dir: &Path, mountpoint: Option<&Path>) -> Result<std::fs::File> {
    let path = dir.join("lock");
    let file = larder_util::private::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)?;
    let deadline = std::time::Instant::now() + CLOSING_WAIT;
    // SAFETY: flock on a valid open descriptor.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        let mut lines = holder.lines();
        let pid = lines.next().unwrap_or_default().trim().to_string();
        let closing = lines
            .next()
            .is_some_and(|m| !matches!(mounts::mounted_at(Path::new(m)), mounts::Mounted::Larder));
        if !closing || std::time::Instant::now() >= deadline {
            bail!(
                "cache dir {} is in use by another larder (pid {pid}){}",
                dir.display(),
                if closing { ", still closing it" } else { "" }
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    file.set_len(0)?;
    let mut note = std::process::id().to_string();
    if let Some(m) = mountpoint {
        note.push('\n');
        note.push_str(&m.to_string_lossy());
    }
    (&file).write_all(note.as_bytes())?;
    Ok(file)
}

/// The cache dir holds copies of files the mount may deny other users: it and everything in it must be
/// this user's alone. What is found wider (made by an older larder, or by hand) is narrowed, once, with a
/// warning naming it.
fn make_cache_dir_private(dir: &Path) -> Result<()> {
    let fixed = larder_util::private::make_private(dir)
        .map_err(|e| anyhow!("cache dir {} cannot be made private to its owner: {e}", dir.display()))?;
    if !fixed.is_empty() {
        tracing::warn!(
            cache_dir = %dir.display(),
            "the cache dir was open to other users; made it owner-only (directories 0700, files 0600): {}",
            fixed.describe(12)
        );
    }
    Ok(())
}

/// Makes the cache durable and marks it closed cleanly however `serve` ends once the core is up (a mount
/// that fails after that is no crash to recover from at the next start).
struct CloseOnExit(Arc<Fs>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            tracing::error!(error = %e, "shutting down the cache failed");
        }
    }
}

/// Every second: while home is offline, ask it whether it is back (reopening its root if needed); while
/// online, check that its root is still the one its path names.
fn spawn_prober(health: Arc<Health>, home: Arc<dyn Home>, fs: std::sync::Weak<Fs>) {
    let _ = std::thread::Builder::new().name("larder-health".into()).spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let Some(fs) = fs.upgrade() else { return };
            let back = if health.online() {
                health.recheck(home.as_ref())
            } else {
                health.probe(home.as_ref())
            };
            if back {
                fs.wake();
            }
        }
    });
}

/// Tell the cluster, every few seconds, how much this node's cache could take without evicting.
fn spawn_free_teller(membership: Arc<Membership>, fs: std::sync::Weak<Fs>) {
    let _ = std::thread::Builder::new().name("larder-free".into()).spawn(move || {
        loop {
            let Some(fs) = fs.upgrade() else { return };
            let store = fs.store().stats();
            membership.say_free(store.bytes_limit.saturating_sub(store.bytes_used));
            drop(fs);
            std::thread::sleep(Duration::from_secs(3));
        }
    });
}

/// Send the core's invalidations to the kernel from a thread of their own: a notification may wait for a
/// lock the kernel holds while it waits for the very request that caused it.
///
/// A barrier (for an open in a cluster, which must not reply before the kernel dropped what another node's
/// change made stale) waits until the invalidations sent before it reached the kernel, at most
/// [`BARRIER_WAIT`].
fn forward_invalidations(fs: &Arc<Fs>, notifier: fuser::Notifier) {
    enum Sent {
        Drop(larder_fs::Invalidation),
        Barrier(std::sync::mpsc::SyncSender<()>),
    }
    let (tx, rx) = std::sync::mpsc::channel::<Sent>();
    let spawned = std::thread::Builder::new().name("larder-inval".into()).spawn(move || {
        for sent in rx {
            // The kernel may not have the entry or inode cached (ENOENT): nothing to drop, then.
            let _ = match &sent {
                Sent::Drop(larder_fs::Invalidation::Inode(ino)) => notifier.inval_inode(fuser::INodeNo(*ino), 0, 0),
                // A negative offset: the attributes alone, no page.
                Sent::Drop(larder_fs::Invalidation::Attr(ino)) => notifier.inval_inode(fuser::INodeNo(*ino), -1, 0),
                Sent::Drop(larder_fs::Invalidation::Entry(parent, name)) => {
                    notifier.inval_entry(fuser::INodeNo(*parent), name)
                }
                Sent::Barrier(done) => {
                    let _ = done.try_send(());
                    Ok(())
                }
            };
        }
    });
    if spawned.is_ok() {
        let barrier = tx.clone();
        fs.set_invalidator(Box::new(move |what| {
            let _ = tx.send(Sent::Drop(what));
        }));
        fs.set_kernel_barrier(Box::new(move || {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if barrier.send(Sent::Barrier(done)).is_ok() {
                let _ = wait.recv_timeout(BARRIER_WAIT);
            }
        }));
    }
}

/// Longest an open waits for the kernel to take in earlier invalidations.
const BARRIER_WAIT: Duration = Duration::from_millis(100);

/// This host's name as one word (for conflict copies' names): `_` for anything but letters, digits and
/// `-`, and `localhost` when it cannot be had.
fn host_name() -> String {
    let name = crate::cluster::host_name().unwrap_or_default();
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .collect();
    if clean.is_empty() { "localhost".into() } else { clean }
}

/// This node's part in a cluster.
struct Cluster {
    membership: Arc<Membership>,
    client: Arc<PeerClient>,
    stats: Arc<PeerStats>,
    tls: NodeTls,
    serve: bool,
}

/// Join the cluster `--cluster` names, if any: this node's id (kept in its cache directory), its TLS
/// (`--cluster-tls`: the certificate of its node name), its record (with that certificate's fingerprint)
/// and liveness in etcd.
fn join_cluster(args: &MountArgs, cache_dir: &Path) -> Result<Option<Cluster>> {
    let Some(endpoints) = &args.cluster else {
        return Ok(None);
    };
    let serve = args.peer_serve == OnOff::On;
    let addr = match args.listen {
        Some(a) if a.ip().is_unspecified() => {
            return Err(anyhow!(
                "--listen {a}: give the address the other nodes reach this one at, not an unspecified one"
            ));
        }
        Some(a) => a.to_string(),
        None if serve => return Err(anyhow!("--cluster needs --listen IP:PORT (or --peer-serve off)")),
        None => String::new(),
    };
    let Some(tls_dir) = &args.cluster_tls else {
        return Err(anyhow!(
            "--cluster needs --cluster-tls DIR: the cluster's certificates (ca.pem, and this node's NAME.pem and \
             NAME.key from `larder cluster cert DIR NAME`); every peer connection is mutual TLS"
        ));
    };
    let name = match &args.node_name {
        Some(name) => name.clone(),
        None => crate::cluster::host_name().context("no --node-name, and this host's name cannot be had")?,
    };
    let tls = NodeTls::load(tls_dir, &name).map_err(|e| anyhow!("--cluster-tls {}: {e}", tls_dir.display()))?;
    let id = larder_cluster::node_id(cache_dir)?;
    let record = MemberRecord {
        id,
        name,
        addr,
        weight: args.cache_size,
        fingerprint: tls.fingerprint().to_string(),
        serve,
    };
    let mut cfg = MembershipConfig::new(endpoints.0.clone(), args.cluster_name.clone());
    // A node of another cluster's CA, pointed at this cluster's etcd and name, is refused: the others
    // could neither verify it nor ask back a token it took.
    cfg.ca = Some(tls.ca_fingerprint().to_string());
    cfg.forget_after = args.forget_gone_after;
    if endpoints.tls() {
        cfg.tls =
            Some(EtcdTls::load(tls_dir, tls.name()).map_err(|e| anyhow!("--cluster-tls {}: {e}", tls_dir.display()))?);
    }
    let membership =
        Arc::new(Membership::join(cfg, record).map_err(|e| anyhow!("cannot join cluster {}: {e}", args.cluster_name))?);
    let stats = Arc::new(PeerStats::default());
    let client = Arc::new(
        PeerClient::new(
            id,
            PeerConfig {
                timeout: args.peer_timeout,
                ..PeerConfig::default()
            },
            tls.client_config(),
            stats.clone(),
        )
        .map_err(|e| anyhow!("cannot start the peer client: {e}"))?,
    );
    let view = membership.view();
    tracing::info!(
        cluster = %args.cluster_name,
        node = format!("{id:016x}"),
        name = %tls.name(),
        members = view.members.len(),
        live = view.live.len(),
        "joined the cluster"
    );
    Ok(Some(Cluster {
        membership,
        client,
        stats,
        tls,
        serve,
    }))
}

/// The bank `--bank` names, connected; refused only if none of its servers answers.
fn connect_bank(args: &MountArgs) -> Result<Option<Arc<Bank>>> {
    let Some(url) = &args.bank else {
        return Ok(None);
    };
    let config = BankConfig {
        timeout: args.bank_timeout,
        ..BankConfig::default()
    };
    let bank = Bank::connect(url, &config).map_err(|e| anyhow!("--bank {url}: {e}"))?;
    tracing::info!(bank = %url, "keeping units, attributes and listings in the bank");
    Ok(Some(Arc::new(bank)))
}

/// Run the daemon in this process until the mount goes away.
fn serve(args: &MountArgs, notify: bool) -> Result<()> {
    init_logging(&args.log_level);
    // Objects created at home get exactly the modes callers ask for (the kernel applied their umask).
    // Everything in the cache dir is created with an explicit owner-only mode (`larder_util::private`).
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    let signals = block_signals();
    let p = preflight::check(args)?;
    let _lock = lock_cache_dir(&p.cache_dir, Some(&p.mountpoint))?;
    make_cache_dir_private(&p.cache_dir)?;
    // A cache dir whose index is lost or damaged while it holds changes not yet at home never comes up
    // looking healthy: refused, with the command that saves them (`recover.rs`).
    crate::recover::check_index(&p.cache_dir)?;
    let db = Db::open_with(&p.cache_dir.join("index.redb"), args.durability.into())
        .map_err(|e| crate::recover::index_error(&p.cache_dir, &e))?;
    let store_cfg = StoreConfig {
        dir: p.cache_dir.join("objects"),
        block_size: args.block_size,
        limit: args.cache_size,
        high_watermark: 0.95,
        low_watermark: 0.90,
        dedup: !args.no_dedup,
        eviction: args.eviction.into(),
    };
    let store = Arc::new(Store::open(store_cfg, db).map_err(|e| anyhow!("cache in {}: {e}", p.cache_dir.display()))?);
    store
        .start_harvester()
        .map_err(|e| anyhow!("cannot start the cache's harvester thread: {e}"))?;
    let write_mode = if args.read_only {
        WriteMode::ReadOnly
    } else {
        args.write_mode.into()
    };
    let fs_cfg = FsConfig {
        validity_lag: args.validity_lag,
        readahead_max: args.readahead,
        ingest_streams: args.ingest_streams.max(1),
        prefetch: args.prefetch.into(),
        small_file_threshold: args.small_file_threshold,
        write_mode,
        sync_lag: if write_mode == WriteMode::WriteThrough {
            Duration::ZERO
        } else {
            args.sync_lag
        },
        flush_threads: args.flush_threads.max(1),
        conflict_policy: args.conflict_policy.into(),
        conflicts_dir: p.cache_dir.join("conflicts"),
        host: host_name(),
        set_owner: is_root(),
        // Files whole in the cache are read and written by the kernel in their cache files; what writers
        // wrote is adopted at close and fsync (docs/design/009).
        passthrough: !args.no_passthrough,
        max_inodes: args.max_inodes,
        home_id: None,
        verify_at_open: args.verify_at_open,
        atime: larder_fs::Atime {
            policy: args.atime.into(),
            no_dirs: args.nodiratime,
        },
    };
    let home_url = p.home.describe();
    // Layers, inside out: the backend (with emulation, the tests' fault switch and counters), then the
    // health gate. The prober asks the home below the gate.
    // health gate, then the bank's stat cache (it answers from the bank while home is away). The prober
    // asks the home below the gate.
    let below_gate = p.home.clone();
    let health = Health::new();
    let mut gated: Arc<dyn Home> = Arc::new(Layered::new(below_gate.clone(), HealthLayer(health.clone())));
    let bank = connect_bank(args)?;
    if let Some(bank) = &bank
        && BankStat::worth_it(args.validity_lag)
    {
        gated = Arc::new(BankStat::over(gated, bank.clone(), args.validity_lag, home_url.clone()));
    }
    let cluster = join_cluster(args, &p.cache_dir)?;
    // Writes across the cluster: the records of changes other nodes hold stand over home and the bank.
    let coherence = cluster.as_ref().map(|c| {
        EtcdCoherence::new(
            c.membership.clone(),
            c.client.clone(),
            args.close_to_open == OnOff::On,
            args.holder_lost == HolderLost::Home,
            c.serve,
        )
    });
    if let Some(co) = &coherence {
        gated = Arc::new(HeldOverlay::over(
            gated,
            co.clone(),
            args.holder_lost == HolderLost::Home,
        ));
    }
    let whereabouts = Arc::new(Whereabouts::default());
    let mut between: Vec<Arc<dyn larder_fs::tier::Tier>> = Vec::new();
    if let Some(c) = &cluster {
        between.push(Arc::new(PeerTier::new(
            c.membership.clone(),
            c.client.clone(),
            whereabouts.clone(),
        )));
    }
    if let Some(bank) = &bank {
        between.push(Arc::new(BankTier::new(bank.clone(), args.bank_ttl)));
    }
    let fs = Arc::new(
        Fs::with_tiers(gated, store, fs_cfg, health.clone(), between).map_err(|e| anyhow!("home {home_url}: {e}"))?,
    );
    // Opening the cache read every record of the index into short-lived maps (a million files: hundreds
    // of MiB); freed, that memory would otherwise stay in the allocator's arenas for the daemon's life.
    larder_fs::release_freed_memory();
    if let Some(co) = &coherence {
        co.attach(&fs);
    }
    if let Some(c) = cluster.as_ref().filter(|_| args.cluster_locks == OnOff::On) {
        fs.set_lock_table(EtcdLocks::new(c.membership.clone()));
    }
    if let Some(c) = cluster.as_ref().filter(|c| c.serve) {
        // The units this node owns go to members with room rather than away, at a bounded rate.
        let migrator = Migrator::new(
            c.membership.clone(),
            c.client.clone(),
            whereabouts,
            c.stats.clone(),
            args.migrate_rate,
        );
        let weak = Arc::downgrade(&fs);
        fs.store().set_departing(Arc::new(move |object, indexes| {
            if let Some(fs) = weak.upgrade() {
                migrator.depart(&fs, object, indexes);
            }
        }));
    }
    let _peer_server = match &cluster {
        Some(c) if c.serve => {
            let listen = c.membership.me().addr.parse().expect("checked at join");
            let source = Arc::new(FsUnitSource {
                fs: Arc::downgrade(&fs),
                coherence: coherence.clone(),
            });
            // A peer is admitted while its certificate is a live member's, as this node's view has it now.
            let membership = c.membership.clone();
            let admit: Admit = Arc::new(move |peer| membership.view().admits(peer));
            let server = PeerServer::start(
                listen,
                c.tls.server_config(),
                admit,
                ADMIT_GRACE,
                source,
                c.stats.clone(),
            )
            .map_err(|e| anyhow!("cannot serve peers at {listen}: {e}"))?;
            tracing::info!(addr = %server.addr(), "serving cached units to the cluster");
            Some(server)
        }
        _ => None,
    };
    fs.start();
    let closer = CloseOnExit(fs.clone());
    spawn_prober(health, below_gate, Arc::downgrade(&fs));
    if let Some(c) = &cluster {
        spawn_free_teller(c.membership.clone(), Arc::downgrade(&fs));
    }
    let source = Arc::new(StatusSource {
        fs: fs.clone(),
        counters: p.counters.clone(),
        started: Instant::now(),
        mountpoint: p.mountpoint.clone(),
        home: home_url.clone(),
        cache_dir: p.cache_dir.clone(),
        block_size: args.block_size,
        peers: cluster.as_ref().map(|c| c.stats.clone()),
        bank: bank.clone(),
        cluster: cluster
            .as_ref()
            .map(|c| (args.cluster_name.clone(), c.membership.clone())),
        peer_client: cluster.as_ref().map(|c| c.client.clone()),
        meta_samples: Default::default(),
    });
    {
        // The rates `larder status` shows come from a sample a second.
        let source = Arc::downgrade(&source);
        std::thread::Builder::new()
            .name("larder-rates".into())
            .spawn(move || {
                while let Some(s) = source.upgrade() {
                    s.sample();
                    drop(s);
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
            .context("starting the status sampler")?;
    }
    let socket = mounts::socket_path(&p.mountpoint);
    let socket_ino = control::serve(&socket, source.clone())?;
    if let Some(addr) = args.metrics_addr {
        metrics::serve(addr, source.clone())?;
    }

    // The source is the home as it was given (what mount(8), fstab and tools comparing the two name; a
    // path made absolute), unless it cannot stand in a mount option (a comma) or may carry a secret (user
    // info): then the home's description.
    let source = if args.home.contains([',', '@']) {
        home_url.clone()
    } else if args.home.contains("://") {
        args.home.clone()
    } else {
        mounts::absolute(Path::new(&args.home)).map_or_else(|_| args.home.clone(), |p| p.display().to_string())
    };
    let mut options = vec![
        MountOption::FSName(source),
        // A kernel option, not fusermount's alone: a mount made directly is of type `fuse.larder` too.
        MountOption::CUSTOM("subtype=larder".into()),
        MountOption::DefaultPermissions,
    ];
    // Shown in /proc/mounts as the mount's option; larder follows it (the kernel moves no FUSE atime).
    if args.atime == crate::cli::AtimeArg::Noatime {
        options.push(MountOption::NoAtime);
    }
    options.push(if write_mode == WriteMode::ReadOnly {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let mut config = Config::default();
    config.mount_options = options;
    config.acl = if is_root() { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(args.threads.unwrap_or_else(default_threads).max(1));
    config.clone_fd = true;
    let session = Session::new(LarderFuse::new(fs.clone()), &p.mountpoint, &config)
        .map_err(|e| anyhow!("cannot mount at {}: {e}", p.mountpoint.display()))?;
    forward_invalidations(&fs, session.notifier());
    watch_signals(signals, p.mountpoint.clone());
    tracing::info!(home = %home_url, mountpoint = %p.mountpoint.display(), cache = %p.cache_dir.display(), "serving");
    // Under a service manager (systemd's Type=notify): the mount is live.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "cannot tell the service manager the mount is ready");
    }
    if notify {
        println!("READY");
        let _ = std::io::stdout().flush();
        if let Ok(null) = OpenOptions::new().write(true).open("/dev/null") {
            // SAFETY: dup2 onto stdout of a valid descriptor; nothing else holds a reference to fd 1's state.
            unsafe { libc::dup2(null.as_raw_fd(), 1) };
        }
    }
    // Served from a thread of the session's own, so that this one decides what becomes of the mount when it
    // ends (below).
    let mut session = session.spawn()?;
    let serving = std::mem::replace(&mut session.guard, std::thread::spawn(|| Ok(())));
    let result = serving
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("a FUSE request thread panicked")));
    drop(closer);
    if let Some(c) = cluster {
        // Gone from the others' views at once, rather than when the lease runs out.
        c.membership.leave();
    }
    // Only its own: a daemon mounted at the same place since (this one outlived its unmount) has its
    // socket there now.
    if std::fs::metadata(&socket).is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == socket_ino) {
        let _ = std::fs::remove_file(&socket);
    }
    // The session, dropped, unmounts whatever is at its mount point if it believes its connection alive,
    // and after an unmount made while this daemon was busy or stopped it may (the kernel reuses even the
    // device number for the next mount there): it unmounted a mount made at the same place since. A
    // session that ended without an error ended because its mount went: nothing of its own is left to
    // unmount, and it is not dropped. One that failed still unmounts its own.
    if result.is_ok() {
        std::mem::forget(session);
    } else {
        drop(session);
    }
    tracing::info!("unmounted; exiting");
    result.map_err(|e| anyhow!("the FUSE session failed: {e}"))
}

/// FUSE request threads when `--threads` is not given: 4 per CPU, at least 8 and at most 64. On two CPUs,
/// 16 threads made 4 clients' creates 17 % slower than 8 (every request of a burst woke another of them,
/// in turn), while 8 readers reading cold over 30 ms took as long with 8 as with 16 (each waits on home
/// in a thread of its own).
fn default_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    (4 * cpus).clamp(8, 64)
}
