//! Letting go of inodes nothing needs in memory: the kernel forgot them, no handle is open, and the
//! index holds all there is to know of them (no queued change, no data not at home, no push under way).
//! A later lookup loads them again from the index; within the validity lag of their directory's listing
//! they come back fresh, so forgetting costs no home call.

use super::*;

/// Most inodes kept in memory that only a listing loaded (nothing looked them up, or the kernel forgot
/// them again): a directory of that many entries listed by `ls -l` still finds all of them there when the
/// kernel looks each one up right after.
pub(crate) const IDLE_MAX: usize = 16_384;

impl Fs {
    /// Whether `ino` may leave memory: see the module doc. Directories only once no child is bound in
    /// memory and their listing is past the validity lag (it would be lost, and its children asked home
    /// again).
    fn reclaimable(&self, ns: &Namespace, ino: u64) -> bool {
        if ino == ROOT {
            return false;
        }
        let Some(node) = ns.inodes.get(&ino) else { return false };
        let plain = node.lookups() == 0
            && node.opens() == 0
            && node.pt_writers.load(Relaxed) == 0
            && !node.removed
            && node.attr.is_some()
            && node.dirty.is_empty()
            && node.pushing == 0
            && node.attempt.is_none()
            && node.unconfirmed.is_none()
            && !node.conflict
            && node.aliases.is_empty()
            && node
                .home_loc
                .as_ref()
                .is_some_and(|(p, n)| *p == node.parent && *n == node.name);
        if !plain || ns.renames.contains_key(&ino) {
            return false;
        }
        if let Some(d) = node.dir.as_deref()
            && (!d.children.is_empty() || self.fresh(d.listed))
        {
            return false;
        }
        // Bound under its parent by this name (or not bound at all: loaded for a home path).
        let bound = ns.inodes.get(&node.parent).and_then(|p| p.d().children.get(&node.name));
        if bound.is_some_and(|&b| b != ino) {
            return false;
        }
        let j = self.pipeline.journal();
        // (A directory whose entries have changes queued gets its time at home once they landed.)
        !j.has(ino)
            && !j.pinned(node.parent, node.name.as_bytes())
            && (node.kind != FileKind::Dir || j.dir_settled(ino))
    }

    /// Let `ino` go if it may (and then its parent, if that was all that kept it): returns whether it
    /// left memory.
    pub(crate) fn reclaim(&self, ns: &mut Namespace, ino: u64) -> bool {
        let mut cur = ino;
        let mut first = true;
        let mut reclaimed = false;
        while self.reclaimable(ns, cur) {
            let Some(node) = ns.inodes.remove(&cur) else { break };
            if let Some(a) = &node.attr
                && ns.by_id.get(&a.id) == Some(&cur)
            {
                ns.by_id.remove(&a.id);
            }
            let parent = node.parent;
            if let Some(p) = ns.inodes.get_mut(&parent)
                && p.d().children.get(&node.name) == Some(&cur)
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
            if first {
                reclaimed = true;
                first = false;
            }
            cur = parent;
        }
        reclaimed
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
            self.reclaim(ns, ino);
        }
        if ns.idle.is_empty() && ns.idle.capacity() > IDLE_MAX {
            ns.idle.shrink_to_fit();
        }
    }
}
