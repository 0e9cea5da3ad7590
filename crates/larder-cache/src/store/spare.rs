//! Spare cache files. The file of a removed object is emptied and kept in `spare/` for the next object
//! that needs a file, up to [`SPARE_MAX`] of them, instead of being unlinked while another file is
//! created: a workload that deletes files and makes new ones (`make clean && make`, `rm -rf` then `tar x`,
//! checking out another branch) then moves inodes between directories rather than freeing and allocating
//! them. On ext4 without a journal, allocating an inode in a group where many were freed in the last
//! minutes skips each recently freed one after reading it (`recently_deleted`): `tar x` of 5,000 files
//! right after an `rm -rf` of as many took three times as long, nearly all of it in the daemon's creates.
//!
//! A spare is emptied (`set_len(0)`, its blocks given back) before it is renamed into `spare/`, so a
//! spare never holds bytes: taken, it is an empty file like a new one. The file of an object the kernel
//! holds open (passthrough), or that a push to home is reading (`in_use` of [`Store::remove_object_with`]), is
//! unlinked as before: its reader keeps the bytes.

use super::*;

/// Most spare files kept. Each is an empty inode and a directory entry.
pub(super) const SPARE_MAX: usize = 16384;

/// The spares ready to be taken (their numbers, the names of their files in `spare/`).
#[derive(Default)]
pub(super) struct Spares {
    ready: Vec<u64>,
    /// The next number to name a spare.
    next: u64,
    /// Spares being put in place (counted against [`SPARE_MAX`] before they are ready).
    arriving: usize,
}

impl Spares {
    pub(super) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }
}

impl Store {
    pub(super) fn spare_dir(&self) -> PathBuf {
        self.cfg.dir.join("spare")
    }

    fn spare_path(&self, n: u64) -> PathBuf {
        self.spare_dir().join(n.to_string())
    }

    /// How many spare files are ready.
    pub fn spare_files(&self) -> usize {
        lock(&self.spares).ready.len()
    }

    /// Find the spares a previous run left (at the open): empty ones are kept, up to [`SPARE_MAX`]; any
    /// other file there goes.
    pub(super) fn load_spares(&self) {
        let Ok(files) = std::fs::read_dir(self.spare_dir()) else {
            return;
        };
        let mut spares = lock(&self.spares);
        for f in files.flatten() {
            let n = f.file_name().to_str().and_then(|n| n.parse::<u64>().ok());
            let empty = f.metadata().is_ok_and(|m| m.is_file() && m.len() == 0);
            match n {
                Some(n) if empty && spares.ready.len() < SPARE_MAX => {
                    spares.ready.push(n);
                    spares.next = spares.next.max(n + 1);
                }
                _ => {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
    }

    /// Put `object`'s file (being removed; `file` its open descriptor if the store had one) aside as a
    /// spare, emptied, or unlink it if there are enough spares or its bytes must stay (`keep_bytes`: a
    /// reader outside the store has it). Called while the object is marked changing and has no blocks
    /// left, with no lock held.
    pub(super) fn retire_file(&self, object: u64, file: Option<Arc<File>>, keep_bytes: bool) {
        let path = self.path_of(object);
        let n = {
            let mut spares = lock(&self.spares);
            if keep_bytes || spares.ready.len() + spares.arriving >= SPARE_MAX {
                None
            } else {
                spares.arriving += 1;
                spares.next += 1;
                Some(spares.next - 1)
            }
        };
        let Some(n) = n else {
            let _ = std::fs::remove_file(&path);
            return;
        };
        // Emptied, and no longer labelled as holding changes not yet at home (`unpushed.rs`).
        let empty = |f: &File| {
            f.set_len(0)?;
            crate::unpushed::clear(f)
        };
        let emptied = match file {
            Some(f) => empty(&f),
            None => OpenOptions::new().write(true).open(&path).and_then(|f| empty(&f)),
        };
        let kept = emptied.is_ok() && {
            let to = self.spare_path(n);
            match std::fs::rename(&path, &to) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    larder_util::private::create_dir_all(&self.spare_dir()).is_ok()
                        && std::fs::rename(&path, &to).is_ok()
                }
                Err(_) => false,
            }
        };
        if !kept {
            // Never created (NotFound above), or the disk refused: unlinked as before.
            let _ = std::fs::remove_file(&path);
        }
        let mut spares = lock(&self.spares);
        spares.arriving -= 1;
        if kept {
            spares.ready.push(n);
        }
    }

    /// Give `path` (the file of an object that has none yet) a spare file: whether it now exists. The
    /// rename does not replace a file made there meanwhile (that one is kept, and the spare too).
    pub(super) fn take_spare(&self, path: &Path) -> bool {
        let Some(n) = lock(&self.spares).ready.pop() else {
            return false;
        };
        let from = self.spare_path(n);
        let mut moved = rename_noreplace(&from, path);
        if matches!(&moved, Err(e) if e.kind() == io::ErrorKind::NotFound)
            && path.parent().is_some_and(|p| !p.exists())
            && larder_util::private::create_dir_all(path.parent().unwrap_or(&self.cfg.dir)).is_ok()
        {
            moved = rename_noreplace(&from, path);
        }
        match moved {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                lock(&self.spares).ready.push(n);
                true
            }
            // The spare is gone (removed by hand): forgotten.
            Err(_) => false,
        }
    }
}

/// `rename(2)` that fails with `EEXIST` rather than replace `to`.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let from = CString::new(from.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let to = CString::new(to.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: both are NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
