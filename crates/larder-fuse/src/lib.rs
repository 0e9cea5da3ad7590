//! The thin FUSE adapter: forwards each request to the core ([`larder_fs::Fs`]), turns results into
//! replies and errors into errno (in [`errno`], one exhaustive match), and records one span per request.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod locks;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use larder_cache::CacheError;
use larder_fs::{Attr, Entry, Fs, FsError, OpenReply};
use larder_home::{FileKind, HomeError, RenameFlags, SetAttr, TimeSet};

/// The errno a core error becomes at the mount.
pub fn errno(e: &FsError) -> Errno {
    let code = match e {
        FsError::Home(h) => match h {
            HomeError::NotFound => libc::ENOENT,
            HomeError::Exists => libc::EEXIST,
            HomeError::NotEmpty => libc::ENOTEMPTY,
            HomeError::PermissionDenied => libc::EACCES,
            HomeError::NoSpace => libc::ENOSPC,
            HomeError::NameTooLong => libc::ENAMETOOLONG,
            HomeError::InvalidName(_) => libc::EINVAL,
            HomeError::Stale => libc::ESTALE,
            HomeError::Conflict => libc::EIO,
            HomeError::TimedOut(_) => libc::EIO,
            HomeError::Unavailable(_) => libc::EIO,
            HomeError::Unsupported(_) => libc::EOPNOTSUPP,
            HomeError::Os(code) => *code,
        },
        FsError::Cache(c) => match c {
            CacheError::NoSpace => libc::ENOSPC,
            // A write past the largest file the cache disk's file system holds is the caller's to hear.
            CacheError::Io(e) if e.raw_os_error() == Some(libc::EFBIG) => libc::EFBIG,
            CacheError::Io(_) => libc::EIO,
            CacheError::Index(_) => libc::EIO,
            CacheError::Damaged { .. } => libc::EIO,
            CacheError::IndexDamaged(_) => libc::EIO,
        },
        FsError::NotFound => libc::ENOENT,
        FsError::NotDir => libc::ENOTDIR,
        FsError::IsDir => libc::EISDIR,
        FsError::Exists => libc::EEXIST,
        FsError::NotEmpty => libc::ENOTEMPTY,
        FsError::NameTooLong => libc::ENAMETOOLONG,
        FsError::BadHandle => libc::EBADF,
        FsError::ReadOnly => libc::EROFS,
        FsError::Invalid => libc::EINVAL,
        FsError::NoSpace => libc::ENOSPC,
        // As link(2), symlink(2) and mknod(2) answer on a file system that cannot create such objects.
        FsError::HomeCannotHold(_) => libc::EPERM,
        FsError::NoXattr => libc::ENODATA,
        FsError::XattrUnsupported => libc::EOPNOTSUPP,
        FsError::Unsupported => libc::EOPNOTSUPP,
        FsError::Lock(l) => match l {
            larder_fs::locks::LockError::WouldBlock => libc::EAGAIN,
            larder_fs::locks::LockError::Interrupted => libc::EINTR,
            larder_fs::locks::LockError::Unavailable(_) => libc::ENOLCK,
        },
    };
    Errno::from_i32(code)
}

/// Whether the process behind `req` is in group `gid`, as Linux decides whether a write or a truncation
/// clears a file's set-group-ID bit (`in_group_or_capable`): root stands for `CAP_FSETID`, as elsewhere
/// here; otherwise its file-system group, or one of its supplementary groups, read from
/// `/proc/PID/status` only when the first is not it. A process already gone is in no other group: the
/// bit goes, the safe way.
fn caller_in_group(req: &Request, gid: u32) -> bool {
    if req.uid() == 0 || req.gid() == gid {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{}/status", req.pid())).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|groups| groups.split_whitespace().any(|g| g.parse() == Ok(gid)))
    })
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: file_type(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn time_set(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(t),
    })
}

fn reply_entry(reply: ReplyEntry, r: Result<Entry, FsError>, generation: u32) {
    match r {
        Ok(e) => reply.entry(&e.ttl, &file_attr(&e.attr), Generation(generation.into())),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_data(reply: ReplyData, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// An extended attribute's value, or a list of names: its size when asked with a size of 0, `ERANGE` when
/// it does not fit the caller's buffer.
fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(data);
    }
}

fn open_flags(r: &OpenReply) -> FopenFlags {
    if r.keep_cache {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

/// How the kernel does I/O on one open file, which decides what the other opens of its inode may do. The
/// kernel requires every open of an inode with passthrough opens to be a passthrough open on the same
/// backing file, and refuses passthrough while an inode has page-cache opens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IoMode {
    Cached,
    Direct,
    /// Opened `O_DIRECT` (served by the daemon, no page cache), counted in [`InodeIo::direct`].
    DirectAsked,
    Passthrough,
}

/// The reply to an open or a create: both answer with a handle and its I/O mode.
enum AnyReply {
    Open(ReplyOpen),
    Create {
        reply: ReplyCreate,
        ttl: std::time::Duration,
        attr: FileAttr,
        generation: u32,
    },
}

impl AnyReply {
    fn open_backing(&self, file: &std::fs::File) -> std::io::Result<BackingId> {
        match self {
            AnyReply::Open(r) => r.open_backing(file),
            AnyReply::Create { reply, .. } => reply.open_backing(file),
        }
    }

    fn passthrough(self, fh: u64, flags: FopenFlags, id: &BackingId) {
        match self {
            AnyReply::Open(r) => r.opened_passthrough(FileHandle(fh), flags, id),
            AnyReply::Create {
                reply,
                ttl,
                attr,
                generation,
            } => reply.created_passthrough(&ttl, &attr, Generation(generation.into()), FileHandle(fh), flags, id),
        }
    }

    fn plain(self, fh: u64, flags: FopenFlags) {
        match self {
            AnyReply::Open(r) => r.opened(FileHandle(fh), flags),
            AnyReply::Create {
                reply,
                ttl,
                attr,
                generation,
            } => reply.created(&ttl, &attr, Generation(generation.into()), FileHandle(fh), flags),
        }
    }

    fn error(self, e: Errno) {
        match self {
            AnyReply::Open(r) => r.error(e),
            AnyReply::Create { reply, .. } => reply.error(e),
        }
    }
}

#[derive(Default)]
struct InodeIo {
    cached: u32,
    passthrough: u32,
    /// `O_DIRECT` handles the daemon serves: no passthrough begins while there are any.
    direct: u32,
    /// The backing file registered for this inode's passthrough opens (one per inode), and its object.
    backing: Option<(u64, BackingId)>,
}

#[derive(Default)]
struct IoModes {
    inodes: HashMap<u64, InodeIo>,
    handles: HashMap<u64, (u64, IoMode)>,
}

/// Serves a core over FUSE.
pub struct LarderFuse {
    fs: Arc<Fs>,
    /// Whether the kernel agreed to passthrough at init (and it was asked for).
    passthrough: AtomicBool,
    /// Whether the kernel leaves clearing set-ID bits to larder (`FUSE_HANDLE_KILLPRIV_V2`).
    killpriv: AtomicBool,
    io: Mutex<IoModes>,
}

impl LarderFuse {
    /// An adapter for `fs`.
    pub fn new(fs: Arc<Fs>) -> LarderFuse {
        LarderFuse {
            fs,
            passthrough: AtomicBool::new(false),
            killpriv: AtomicBool::new(false),
            io: Mutex::new(IoModes::default()),
        }
    }

    /// Answer an open (or a create) the core accepted, choosing the kernel's I/O mode for it. The kernel
    /// requires every open of an inode with passthrough opens to be a passthrough open on the same backing
    /// file, and refuses passthrough while the inode has page-cache opens.
    fn opened(&self, ino: u64, r: &OpenReply, flags: i32, reply: AnyReply) {
        // A handle opened only for reading has nothing for `flush` to commit (locks are the kernel's): its
        // close asks the daemon nothing.
        let noflush = if flags & libc::O_ACCMODE == libc::O_RDONLY {
            FopenFlags::FOPEN_NOFLUSH
        } else {
            FopenFlags::empty()
        };
        let mut guard = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let io = &mut *guard;
        let state = io.inodes.entry(ino).or_default();
        let object = self.fs.handle_object(r.fh);
        let reusable = matches!(&state.backing, Some((o, _)) if Some(*o) == object);
        if state.passthrough > 0 && !reusable {
            // Home has a new version while the kernel still reads the old one from its cache file: the
            // kernel cannot open the inode another way until those readers close.
            drop(guard);
            tracing::warn!(
                ino,
                "a new version cannot be opened while readers of the old one are open"
            );
            let _ = self.fs.release(r.fh);
            reply.error(Errno::from_i32(libc::EBUSY));
            return;
        }
        // `O_DIRECT` on a file the kernel serves (or would serve) from its cache file: through the daemon,
        // which writes the cache file through its page cache. Passed through, it would be direct I/O on the
        // cache file beside the buffered I/O of the other handles, and every collision of the two (the
        // kernel cannot drop a page a buffered writer holds) marks the cache file with an error that the
        // daemon's next `fsync` of it reports, as `EIO`, to a writer that did nothing wrong.
        // (Only when passthrough is not under way: the kernel takes no other open of an inode it serves
        // from a backing file. While such daemon-served direct opens last, no passthrough begins.)
        let direct = flags & libc::O_DIRECT != 0 && state.passthrough == 0 && (r.passthrough || reusable);
        if (r.passthrough || reusable)
            && !direct
            && state.direct == 0
            && state.cached == 0
            && self.passthrough.load(Ordering::Relaxed)
            && let Some(file) = self.fs.passthrough(r.fh, reusable)
        {
            if !reusable {
                match reply.open_backing(file.as_ref()) {
                    Ok(id) => state.backing = Some((object.unwrap_or(0), id)),
                    Err(e) => {
                        tracing::debug!(error = %e, "the kernel refused a backing file; reading through the daemon");
                        state.backing = None;
                    }
                }
            }
            if let Some((_, id)) = &state.backing {
                state.passthrough += 1;
                io.handles.insert(r.fh, (ino, IoMode::Passthrough));
                reply.passthrough(r.fh, noflush, id);
                return;
            }
            self.fs.unhold(r.fh);
        }
        let mode = if direct {
            state.direct += 1;
            IoMode::DirectAsked
        } else if state.passthrough > 0 {
            // Only when the cache file of an inode the kernel serves from it cannot be had (the open above
            // found nothing to give): the kernel may refuse this open.
            IoMode::Direct
        } else {
            state.cached += 1;
            IoMode::Cached
        };
        io.handles.insert(r.fh, (ino, mode));
        let flags = match mode {
            IoMode::Direct | IoMode::DirectAsked => FopenFlags::FOPEN_DIRECT_IO,
            _ => open_flags(r),
        };
        reply.plain(r.fh, flags | noflush);
    }

    /// A handle is gone: its inode's I/O modes follow.
    fn closed(&self, fh: u64) {
        let mut io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let Some((ino, mode)) = io.handles.remove(&fh) else {
            return;
        };
        let Some(state) = io.inodes.get_mut(&ino) else { return };
        match mode {
            IoMode::Cached => state.cached = state.cached.saturating_sub(1),
            IoMode::Passthrough => {
                state.passthrough = state.passthrough.saturating_sub(1);
                if state.passthrough == 0 {
                    // Closes the backing file's registration.
                    state.backing = None;
                }
            }
            IoMode::DirectAsked => state.direct = state.direct.saturating_sub(1),
            IoMode::Direct => {}
        }
        if state.cached == 0 && state.passthrough == 0 && state.direct == 0 {
            io.inodes.remove(&ino);
        }
    }
}

macro_rules! span {
    ($op:expr, $ino:expr) => {
        tracing::trace_span!("req", op = $op, ino = $ino).entered()
    };
}

impl LarderFuse {
    /// Answer a create (or an `O_TMPFILE` open): the new file's entry and its open.
    fn reply_made(&self, made: Result<(Entry, OpenReply), FsError>, flags: i32, reply: ReplyCreate) {
        match made {
            Ok((e, r)) => self.opened(
                e.attr.ino,
                &r,
                flags,
                AnyReply::Create {
                    reply,
                    ttl: e.ttl,
                    attr: file_attr(&e.attr),
                    generation: self.fs.generation(),
                },
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for LarderFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Not FUSE_AUTO_INVAL_DATA: with it the kernel drops a file's pages whenever fresh attributes show
        // a new mtime, and every local write gives one. Pages dropped while other processes write the file
        // came back stale (the daemon's answers were exact): two SQLite processes sharing a database in
        // WAL mode lost committed rows that way (docs/design/009). larder tells the kernel itself when
        // home has a new version (an inode invalidation, and an open without FOPEN_KEEP_CACHE), which is
        // the only time its pages are wrong.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // File handles (`name_to_handle_at`, an NFS server re-exporting the mount) stay good after the kernel
        // drops the inode and across remounts: it looks the inode up by number (`.`) and its directory
        // (`..`), which `Fs::lookup` answers from the persistent inode numbers.
        let _ = config.add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT);
        // larder clears set-user-ID and set-group-ID bits itself (`Fs::setattr_dropping`): otherwise the
        // kernel asks for the attributes again before every chown of a file (`tar x` and `cp -a` as root
        // chown every file), to compute the mode it would send.
        if config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok() {
            self.killpriv.store(true, Ordering::Relaxed);
        }
        // In a cluster, locks are the cluster's (design note 017): the kernel forwards them, POSIX locks
        // and flock alike. Otherwise it keeps them itself, for this node.
        if self.fs.shares_locks()
            && config
                .add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS)
                .is_err()
        {
            tracing::warn!("the kernel does not forward file locks: they hold on this node only");
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        // Passthrough: the kernel reads files whole in the cache from their cache files. larder does not
        // ask for FUSE_WRITEBACK_CACHE (writes must reach the daemon, which journals them), so nothing
        // stands in its way but the kernel (6.9 or later) and the mount's own choice.
        if self.fs.passthrough_wanted()
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.shutdown() {
            tracing::error!(error = %e, "shutting the core down failed");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _s = span!("lookup", parent.0);
        reply_entry(reply, self.fs.lookup(parent.0, name), self.fs.generation());
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _s = span!("getattr", ino.0);
        match self.fs.getattr(ino.0) {
            Ok(e) => reply.attr(&e.ttl, &file_attr(&e.attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _s = span!("setattr", ino.0);
        let changes = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: time_set(atime),
            mtime: time_set(mtime),
        };
        // Set-ID bits go at every owner change, and at a truncation by a caller without CAP_FSETID (the
        // kernel's flag for that is not passed on here: root stands for the capability). A request that
        // changes nothing at all is the kernel clearing them after a write it made itself (passthrough).
        let nothing = changes == SetAttr::default() && ctime.is_none();
        let drop_set_id = self.killpriv.load(Ordering::Relaxed)
            && (uid.is_some() || gid.is_some() || ((size.is_some() || nothing) && req.uid() != 0));
        let in_group = |gid| caller_in_group(req, gid);
        match self
            .fs
            .setattr_dropping(ino.0, &changes, drop_set_id.then_some(&in_group))
        {
            Ok(e) => reply.attr(&e.ttl, &file_attr(&e.attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _s = span!("readlink", ino.0);
        reply_data(reply, self.fs.readlink(ino.0));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _s = span!("mknod", parent.0);
        reply_entry(
            reply,
            self.fs.mknod(parent.0, name, mode, rdev as u64, req.uid(), req.gid()),
            self.fs.generation(),
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let _s = span!("mkdir", parent.0);
        reply_entry(
            reply,
            self.fs.mkdir(parent.0, name, mode, req.uid(), req.gid()),
            self.fs.generation(),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _s = span!("unlink", parent.0);
        reply_empty(reply, self.fs.unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _s = span!("rmdir", parent.0);
        reply_empty(reply, self.fs.rmdir(parent.0, name));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _s = span!("symlink", parent.0);
        reply_entry(
            reply,
            self.fs
                .symlink(parent.0, link_name, target.as_os_str().as_bytes(), req.uid(), req.gid()),
            self.fs.generation(),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _s = span!("rename", parent.0);
        // A whiteout (overlayfs's) is not made, so such a rename is refused, as by a file system without
        // them, rather than done as a plain one; so is any flag larder does not know.
        let known = fuser::RenameFlags::RENAME_NOREPLACE | fuser::RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        }
        let flags = RenameFlags {
            no_replace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
        };
        reply_empty(reply, self.fs.rename(parent.0, name, newparent.0, newname, flags));
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _s = span!("link", ino.0);
        reply_entry(reply, self.fs.link(ino.0, newparent.0, newname), self.fs.generation());
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _s = span!("open", ino.0);
        match self.fs.open(ino.0, flags.0) {
            Ok(r) => self.opened(ino.0, &r, flags.0, AnyReply::Open(reply)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _s = span!("read", ino.0);
        reply_data(reply, self.fs.read(fh.0, offset, size));
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _s = span!("write", ino.0);
        let result = self.fs.write(fh.0, offset, data).and_then(|n| {
            // A writer without CAP_FSETID: the file's set-ID bits go.
            if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) && self.killpriv.load(Ordering::Relaxed) {
                self.fs.drop_set_id(ino.0, &|gid| caller_in_group(req, gid))?;
            }
            Ok(n)
        });
        match result {
            Ok(n) => reply.written(n),
            Err(e) => {
                tracing::warn!(ino = ino.0, offset, len = data.len(), error = %e, "write failed");
                reply.error(errno(&e))
            }
        }
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        let _s = span!("flush", ino.0);
        let result = self.fs.flush(fh.0);
        if self.fs.shares_locks() {
            // A close by a process ends its POSIX locks on the file, after what it wrote is published.
            self.fs.release_locks(ino.0, lock_owner.0);
        }
        reply_empty(reply, result);
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let _s = span!("getlk", ino.0);
        let Some(ask) = locks::ask(lock_owner.0, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        match self.fs.getlk(ino.0, &ask) {
            Ok(Some(l)) => reply.locked(l.start, l.end, locks::typ(l.kind), l.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let _s = span!("setlk", ino.0);
        let Some(ask) = locks::ask(lock_owner.0, start, end, typ, pid) else {
            return reply.error(Errno::EINVAL);
        };
        if !sleep || ask.kind.is_none() {
            return reply_empty(reply, self.fs.setlk(ino.0, &ask, false, &|| false));
        }
        // A lock that may wait does so on a thread of its own: the request threads serve the holder.
        let fs = self.fs.clone();
        let tid = req.pid();
        let spawned = std::thread::Builder::new().name("larder-lockw".into()).spawn(move || {
            reply_empty(reply, fs.setlk(ino.0, &ask, true, &|| locks::interrupted(tid)));
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a thread to wait for a lock");
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _s = span!("release", ino.0);
        if let Some(owner) = lock_owner.filter(|_| self.fs.shares_locks()) {
            // The last close of an open file ends its flock.
            self.fs.release_locks(ino.0, owner.0);
        }
        self.closed(fh.0);
        reply_empty(reply, self.fs.release(fh.0));
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let _s = span!("fsync", ino.0);
        reply_empty(reply, self.fs.fsync(fh.0));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _s = span!("fallocate", ino.0);
        reply_empty(reply, self.fs.fallocate(fh.0, offset, length, mode));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _s = span!("opendir", ino.0);
        match self.fs.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _s = span!("readdir", ino.0);
        match self.fs.readdir(fh.0, offset) {
            Ok(items) => {
                for (next, item) in items {
                    if reply.add(INodeNo(item.ino), next, file_type(item.kind), &item.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let _s = span!("fsyncdir", ino.0);
        // The names changed so far are in the cache's index durably (write-back), or at home already.
        reply_empty(reply, self.fs.sync_changes());
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    // Extended attributes (`user.` and `trusted.`; the core refuses the others): kept in the cache with
    // the attributes and pushed to home like any change. The size protocol: a size of 0 asks how large the
    // answer is; a buffer too small for it is `ERANGE`.
    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _s = span!("listxattr", ino.0);
        match self.fs.listxattr(ino.0) {
            Ok(names) => {
                let mut list = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
                for n in names {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                reply_xattr(reply, size, &list);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _s = span!("getxattr", ino.0);
        match self.fs.getxattr(ino.0, name.as_bytes()) {
            Ok(value) => reply_xattr(reply, size, &value),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let _s = span!("setxattr", ino.0);
        // `position` is macOS's resource forks; Linux always sends 0.
        if position != 0 || flags & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) != 0 {
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        }
        let flags = larder_fs::XattrFlags {
            create: flags & libc::XATTR_CREATE != 0,
            replace: flags & libc::XATTR_REPLACE != 0,
        };
        reply_empty(reply, self.fs.setxattr(ino.0, name.as_bytes(), value, flags));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _s = span!("removexattr", ino.0);
        reply_empty(reply, self.fs.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission checks are the kernel's (default_permissions), against the attributes we report.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _s = span!("create", parent.0);
        let made = self.fs.create(parent.0, name, mode, flags, req.uid(), req.gid());
        self.reply_made(made, flags, reply);
    }

    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, _umask: u32, flags: i32, reply: ReplyCreate) {
        let _s = span!("tmpfile", parent.0);
        let made = self.fs.tmpfile(parent.0, mode, flags, req.uid(), req.gid());
        self.reply_made(made, flags, reply);
    }
}
