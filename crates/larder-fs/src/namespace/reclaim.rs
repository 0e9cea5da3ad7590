//! Letting go of inodes nothing needs in memory: files (and links) the kernel forgot, with no handle
//! open, of which the index holds all there is to know (no queued change, no data not at home, no push
//! under way).
//! A later lookup loads them again from the index; within the validity lag of their directory's listing
//! they come back fresh, so forgetting costs no home call.

use super::*;

/// Most inodes kept in memory that only a listing loaded (nothing looked them up, or the kernel forgot
/// them again): a directory of that many entries listed by `ls -l` still finds all of them there when the
/// kernel looks each one up right after.
pub(crate) const IDLE_MAX: usize = 16_384;

/// Most inodes one pass of [`crate::Fs::trim_inodes`] lets go of or asks the kernel about.
const TRIM_BATCH: usize = 16_384;

impl Names {
    /// Whether `ino` may leave memory once the kernel forgot it: see the module doc. Directories stay: an
    /// inode loaded for a home path (after a restart, for a queued change) is in memory without being
    /// bound in its directory's children, so nothing cheap tells that a directory is no one's parent; and
    /// they are few beside files.
    fn idle_file(&self, ns: &Namespace, ino: u64, node: &Inode) -> bool {
        let plain = ino != ROOT
            && node.kind != FileKind::Dir
            && node.opens() == 0
            && node.pt_writers.load(Relaxed) == 0
            && !node.removed
            // (Hard links stay: a name found later must find the inode its other names have.)
            && node.attr.as_ref().is_some_and(|a| a.nlink <= 1)
            && node.dirty.is_empty()
            && node.pushing == 0
            && node.attempt.is_none()
            && node.unconfirmed.is_none()
            && !node.conflict
            && node.aliases.is_empty()
            && node.home_loc.as_ref().is_some_and(|(p, n)| *p == node.parent && *n == node.name);
        if !plain || ns.renames.contains_key(&ino) {
            return false;
        }
        // Bound under its parent by this name (or not bound at all: loaded for a home path).
        let bound = ns.inodes.get(&node.parent).and_then(|p| p.d().children.get(&node.name));
        if bound.is_some_and(|&b| b != ino) {
            return false;
        }
        let j = self.pipeline.journal();
        !j.has(ino) && !j.pinned(node.parent, node.name.as_bytes())
    }

    /// Whether `ino` may leave memory now: idle, and the kernel holds no reference.
    fn reclaimable(&self, ns: &Namespace, ino: u64) -> bool {
        ns.inodes
            .get(&ino)
            .is_some_and(|node| node.lookups() == 0 && self.idle_file(ns, ino, node))
    }

    /// Let `ino` go if it may: returns whether it left memory. Not while a namespace change is being made
    /// (under `mutate`): it found the objects it works on in memory, and they must stay there until it
    /// commits. What could have gone meanwhile goes at the next reclaim.
    pub(crate) fn reclaim(&self, ns: &mut Namespace, ino: u64) -> bool {
        let _no_change = match self.mutate.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if self.reclaimable(ns, ino) {
                    ns.deferred.push(ino);
                }
                return false;
            }
        };
        for ino in std::mem::take(&mut ns.deferred) {
            self.let_go(ns, ino);
        }
        self.let_go(ns, ino)
    }

    /// [`Names::reclaim`], no namespace change being made.
    fn let_go(&self, ns: &mut Namespace, ino: u64) -> bool {
        if !self.reclaimable(ns, ino) {
            return false;
        }
        let Some(node) = ns.inodes.remove(&ino) else {
            return false;
        };
        if node.own
            && let Some(at) = node.checked
            && at.elapsed() < OWN_CHANGE_WINDOW
        {
            ns.own_changes.insert(ino, at);
            if ns.own_changes.len() > (2 * ns.own_changes_pruned).max(4096) {
                ns.own_changes.retain(|_, at| at.elapsed() < OWN_CHANGE_WINDOW);
                ns.own_changes.shrink_to_fit();
                ns.own_changes_pruned = ns.own_changes.len();
            }
        }
        if let Some(a) = &node.attr
            && ns.by_id.get(&a.id) == Some(&ino)
        {
            ns.by_id.remove(&a.id);
        }
        if let Some(p) = ns.inodes.get_mut(&node.parent)
            && p.d().children.get(&node.name) == Some(&ino)
        {
            let d = p.dm();
            d.children.remove(&node.name);
            // Its entry is in the index only now.
            d.complete = false;
            if d.children.is_empty() && d.children.capacity() > 0 {
                d.children.shrink_to_fit();
            }
        }
        self.meta_counters.reclaimed.fetch_add(1, Relaxed);
        true
    }

    /// An inode loaded again from the index under `parent`: if `parent`'s listing is within the validity
    /// lag, that listing vouches for it (it carried its attributes, and the index took them in).
    pub(crate) fn vouch_by_listing(&self, ns: &mut Namespace, parent: u64, ino: u64) {
        let listed = ns.inodes.get(&parent).and_then(|p| p.d().listed);
        if !self.fresh(listed) {
            return;
        }
        if let Some(node) = ns.inodes.get_mut(&ino)
            && node.checked.is_none()
        {
            node.checked = listed;
        }
    }

    /// `inos` were loaded by a listing and nothing else refers to them: the oldest such inodes leave
    /// memory once there are more than [`IDLE_MAX`].
    pub(crate) fn note_idle(&self, ns: &mut Namespace, inos: Vec<u64>) {
        ns.idle.extend(inos);
        while ns.idle.len() > IDLE_MAX {
            let Some(ino) = ns.idle.pop_front() else { break };
            // (Kept by a change under way, it waits in `deferred`, not here again.)
            self.reclaim(ns, ino);
        }
    }

    /// Keep the files in memory within `--max-inodes`: idle ones nothing refers to leave at once, and
    /// the kernel is asked to forget idle ones it holds (its forget then lets them go). At most
    /// [`TRIM_BATCH`] a call; returns how many were let go or asked about.
    pub(crate) fn trim_inodes(&self) -> usize {
        let max = self.cfg.max_inodes;
        if max == 0 {
            return 0;
        }
        let (mut free, mut ask) = (Vec::new(), Vec::new());
        {
            let ns = read(&self.ns);
            let n = ns.inodes.len();
            if n <= max {
                return 0;
            }
            // Down to nine tenths of the limit, so that passes are not one at every new inode.
            let want = (n - max / 10 * 9).min(TRIM_BATCH);
            for (&ino, node) in &ns.inodes {
                if free.len() + ask.len() >= want {
                    break;
                }
                if !self.idle_file(&ns, ino, node) {
                    continue;
                }
                if node.lookups() == 0 {
                    free.push(ino);
                } else {
                    ask.push((node.parent, node.name.clone()));
                }
            }
        }
        let done = free.len() + ask.len();
        if !free.is_empty() {
            let mut ns = write(&self.ns);
            for ino in free {
                self.reclaim(&mut ns, ino);
            }
        }
        self.meta_counters.trimmed.fetch_add(ask.len() as u64, Relaxed);
        for (parent, name) in ask {
            self.invalidate(crate::Invalidation::Entry(parent, name));
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::super::hit_tests::dir_f;
    use super::*;

    #[test]
    fn an_answer_home_gave_before_our_change_cannot_undo_it_after_the_inode_left_memory() {
        let (_tmp, fs, _, f) = dir_f();
        let stale = fs.core().home.stat(Path::new("dir/f")).unwrap();
        // Home is asked; then a change of ours lands there, and we adopt what it made.
        let asked = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        let mut ours = stale.clone();
        ours.size += 1;
        ours.version = larder_home::Version("ours".into());
        {
            let mut ns = fs.names.write();
            fs.names.adopt_attr(&mut ns, f, ours.clone());
        }
        // The kernel forgets it, and it leaves memory.
        fs.forget(f, 1);
        assert!(!fs.names.read().inodes.contains_key(&f), "the file left memory");
        // Home's older answer arrives for the inode loaded back: it is not taken.
        let mut ns = fs.names.write();
        fs.names.load_inode(&mut ns, f).unwrap();
        fs.names.update_attr(&mut ns, f, stale, asked);
        assert_eq!(ns.inode(f).unwrap().attr.as_ref().unwrap().version, ours.version);
    }
}
