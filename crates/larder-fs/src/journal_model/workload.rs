//! A workload: the steps that change the local file system, the pushes made while it runs, and the rounds
//! of the final drain.

use super::model::Kind;

const NAMES: [&str; 5] = ["a", "b", "c", "x", "y"];
const PERMS: [u32; 4] = [0o600, 0o644, 0o700, 0o755];
/// Deepest directory the generator makes (it may move one deeper by a rename).
pub(super) const MAX_DEPTH: usize = 3;

/// Picks one of the candidates a step has (modulo their number): shrinks toward the first.
pub(super) type Pick = u8;

pub(super) fn pick<T: Clone>(items: &[T], p: Pick) -> Option<T> {
    (!items.is_empty()).then(|| items[p as usize % items.len()].clone())
}

pub(super) fn name(p: Pick) -> &'static str {
    NAMES[p as usize % NAMES.len()]
}

pub(super) fn perm(p: Pick) -> u32 {
    PERMS[p as usize % PERMS.len()]
}

/// One step of a workload, interpreted against the local model as it stands: the picks choose among what
/// exists then, and a step that does not apply (a name taken, nothing to remove) is skipped.
#[derive(Clone, Debug)]
pub(super) enum Step {
    Create {
        kind: Kind,
        dir: Pick,
        name: Pick,
        perm: Pick,
    },
    /// A write or truncate: the file's content changes.
    Write {
        file: Pick,
    },
    SetAttr {
        ino: Pick,
        perm: Option<Pick>,
        uid: Option<u32>,
    },
    Unlink {
        entry: Pick,
    },
    Rmdir {
        entry: Pick,
    },
    /// `exchange` applies only where the target exists (and the run makes exchanges), `no_replace` only
    /// where it does not.
    Rename {
        entry: Pick,
        dir: Pick,
        name: Pick,
        exchange: bool,
        no_replace: bool,
    },
    Link {
        entry: Pick,
        dir: Pick,
        name: Pick,
    },
    /// Begin up to `limit` ready ops while the workload runs.
    Begin {
        limit: usize,
    },
    /// Push and finish some of the ops under way while the workload runs.
    Push(Vec<Push>),
}

/// One op under way (picked among them) pushed to home, or failing cleanly (home untouched).
#[derive(Clone, Copy, Debug)]
pub(super) enum Push {
    Done(Pick),
    /// Back to the queue: at once (`retry_now`) or as a refusal with no wait.
    Fail {
        op: Pick,
        retry_now: bool,
    },
}

/// One round of the final drain: begin up to `limit` ready ops (all when `None`), push `pushes`, then the
/// rest of those under way if `rest`. Once the rounds are used up, each round begins and pushes all.
#[derive(Clone, Debug)]
pub(super) struct Round {
    pub(super) limit: Option<usize>,
    pub(super) pushes: Vec<Push>,
    pub(super) rest: bool,
}

/// A workload and how the journal's ops reach home.
#[derive(Clone, Debug)]
pub(super) struct Workload {
    pub(super) steps: Vec<Step>,
    pub(super) drain: Vec<Round>,
}
