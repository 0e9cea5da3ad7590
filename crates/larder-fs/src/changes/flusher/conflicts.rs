//! Conflicts: home changed what the cache changed too, or took a name made here; the mount's policy
//! decides which version keeps the name, and every conflict is recorded.

use super::*;

impl Changes {
    /// Home took the name of an object created here: its content is pushed by the conflict policy.
    pub(super) fn name_taken(&self, op: &Op) -> Outcome {
        let mut ns = self.names.write();
        let Some(node) = ns.inodes.get_mut(&op.ino) else {
            return Outcome::Done;
        };
        node.home_loc = op
            .names
            .first()
            .map(|(d, n)| (*d, std::ffi::OsString::from_vec(n.clone())));
        self.names.load_home_ancestors(&mut ns, op.ino);
        let Some(node) = ns.inodes.get_mut(&op.ino) else {
            return Outcome::Done;
        };
        if node.kind != larder_home::FileKind::File {
            drop(ns);
            self.record_conflict(
                &op.path,
                self.cfg.conflict_policy.as_str(),
                format!("{:?}", op.kind),
                true,
                "home had another object of that name; home's stays".into(),
            );
            return Outcome::Done;
        }
        node.conflict = true;
        if node.home_size.is_none() {
            node.home_size = Some(0);
        }
        let path = op.path.clone();
        let ino = op.ino;
        let mut j = self.pipeline.journal();
        let muts = j.record(Op::new(ino, path, Vec::new(), OpKind::Data));
        drop(j);
        self.core.store.db().submit(muts);
        drop(ns);
        Outcome::Done
    }

    /// `NAME.conflict-HOST-TIMESTAMP` beside `path`.
    pub(super) fn conflict_path(&self, path: &[u8]) -> PathBuf {
        let (stamp, _) = utc(SystemTime::now());
        let mut p = path.to_vec();
        p.extend_from_slice(format!(".conflict-{}-{stamp}", self.cfg.host).as_bytes());
        os(&p)
    }

    pub(crate) fn record_conflict(&self, path: &[u8], policy: &str, kept_at: String, complete: bool, detail: String) {
        let (_, time) = utc(SystemTime::now());
        let c = Conflict {
            time,
            path: String::from_utf8_lossy(path).into_owned(),
            policy: policy.to_string(),
            kept_at,
            complete,
            detail,
        };
        tracing::warn!(path = %c.path, policy, kept_at = %c.kept_at, "conflict: {}", c.detail);
        let _ = larder_util::private::create_dir_all(&self.cfg.conflicts_dir);
        let line = serde_json::to_string(&c).unwrap_or_default();
        let written = larder_util::private::options()
            .create(true)
            .append(true)
            .open(self.cfg.conflicts_dir.join("conflicts.jsonl"))
            .and_then(|mut f| {
                f.write_all(format!("{line}\n").as_bytes())?;
                f.sync_data()
            });
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot record a conflict in the cache directory");
        }
        lock(&self.pipeline.conflicts).push(c);
    }

    /// The cached blocks of `ino` as byte ranges, and whether they cover all of it.
    pub(super) fn present_ranges(&self, ino: u64) -> FsResult<(u64, Vec<std::ops::Range<u64>>, u64, bool)> {
        let ns = self.names.read();
        let node = ns.inode(ino)?;
        let size = node.attr.as_ref().map_or(0, |a| a.size);
        let bs = self.core.store.block_size();
        let local_from = node.home_size.unwrap_or(u64::MAX);
        let mut ranges = Vec::new();
        let mut complete = true;
        for index in 0..size.div_ceil(bs) {
            let start = index * bs;
            if self.core.store.contains((node.object, index as u32)) || start >= local_from {
                crate::ranges::add_range(&mut ranges, start..(start + bs).min(size));
            } else {
                complete = false;
            }
        }
        Ok((node.object, ranges, size, complete))
    }

    /// Copy the cache's version of `ino` into the conflicts area; returns where.
    pub(super) fn keep_locally(&self, ino: u64, path: &[u8]) -> FsResult<String> {
        let (object, ranges, size, _) = self.present_ranges(ino)?;
        let (stamp, _) = utc(SystemTime::now());
        let base = Path::new(std::ffi::OsStr::from_bytes(path))
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "root".into());
        larder_util::private::create_dir_all(&self.cfg.conflicts_dir).map_err(|e| FsError::Cache(e.into()))?;
        let dest = self.cfg.conflicts_dir.join(format!("{stamp}-{ino}-{base}"));
        let src = self.core.store.file(object)?;
        let out = larder_util::private::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dest)
            .map_err(|e| FsError::Cache(e.into()))?;
        out.set_len(size).map_err(|e| FsError::Cache(e.into()))?;
        let mut buf = vec![0u8; 1 << 20];
        for r in ranges {
            let mut pos = r.start;
            while pos < r.end {
                let want = ((r.end - pos) as usize).min(buf.len());
                let got = std::os::unix::fs::FileExt::read_at(src.as_ref(), &mut buf[..want], pos)
                    .map_err(|e| FsError::Cache(e.into()))?;
                if got == 0 {
                    break;
                }
                std::os::unix::fs::FileExt::write_all_at(&out, &buf[..got], pos)
                    .map_err(|e| FsError::Cache(e.into()))?;
                pos += got as u64;
            }
        }
        out.sync_all().map_err(|e| FsError::Cache(e.into()))?;
        Ok(dest.display().to_string())
    }

    /// Home changed a file that has local changes: apply the mount's policy.
    pub(super) fn resolve_conflict(&self, ino: u64, path: &[u8]) -> Outcome {
        let policy = self.cfg.conflict_policy;
        match policy {
            ConflictPolicy::CacheWins => match self.data.push_data(ino, Some(os(path)), true) {
                Ok(()) => {
                    self.record_conflict(
                        path,
                        policy.as_str(),
                        String::from_utf8_lossy(path).into_owned(),
                        true,
                        "home's version was replaced by the cache's".into(),
                    );
                    Outcome::Done
                }
                Err(FsError::Home(e)) => self.classify(e),
                Err(e) => Outcome::Refused(e),
            },
            ConflictPolicy::KeepBoth => {
                let aside = self.conflict_path(path);
                let written = self.present_ranges(ino).and_then(|(object, ranges, size, complete)| {
                    let perm = self.names.read().inode(ino)?.attr.as_ref().map_or(0o644, |a| a.perm);
                    let file = self.core.store.file(object)?;
                    self.core.home.create(&aside, perm, Owner::default())?;
                    self.core.home.write(&aside, &file, &ranges, size, None, None)?;
                    Ok(complete)
                });
                match written {
                    Ok(complete) => {
                        self.record_conflict(
                            path,
                            policy.as_str(),
                            String::from_utf8_lossy(aside.as_os_str().as_bytes()).into_owned(),
                            complete,
                            "home changed the file; the cache's version was written beside it".into(),
                        );
                        // A name the directory did not have: its listing is home's to give again.
                        let parent = {
                            let mut ns = self.names.write();
                            let parent = ns.inodes.get(&ino).map(|n| n.parent);
                            if let Some(d) = parent.and_then(|p| ns.inodes.get_mut(&p)) {
                                d.unlist();
                                d.checked = None;
                            }
                            parent
                        };
                        if let Some(p) = parent {
                            self.names.invalidate(crate::Invalidation::Inode(p));
                        }
                        self.discard_local(ino);
                        Outcome::Done
                    }
                    Err(FsError::Home(e)) => self.classify(e),
                    Err(e) => Outcome::Refused(e),
                }
            }
            ConflictPolicy::HomeWins => match self.keep_locally(ino, path) {
                Ok(kept) => {
                    let complete = self.present_ranges(ino).map(|r| r.3).unwrap_or(false);
                    self.record_conflict(
                        path,
                        policy.as_str(),
                        kept,
                        complete,
                        "home changed the file; the cache's version was kept in the conflicts area".into(),
                    );
                    self.discard_local(ino);
                    Outcome::Done
                }
                Err(e) => Outcome::Refused(e),
            },
        }
    }

    /// Drop the local changes of `ino` (they were kept elsewhere): the next access reads home's version.
    pub(crate) fn discard_local(&self, ino: u64) {
        let mut ns = self.names.write();
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        node.dirty.clear();
        node.conflict = false;
        node.home_size = None;
        node.checked = None;
        if let Some(a) = node.attr.as_mut() {
            // No version home could have: the next revalidation takes home's as new.
            a.version = Version(super::DISCARDED.into());
        }
        let (old, pushing) = (node.object, node.pushing);
        let object = self.names.alloc_object(&mut ns);
        self.core.store.replace_object(old, object, pushing > 0);
        if let Some(node) = ns.inodes.get_mut(&ino) {
            node.object = object;
            self.core
                .store
                .db()
                .submit(vec![Mutation::PutInode(ino, node.record().encode())]);
        }
    }
}
