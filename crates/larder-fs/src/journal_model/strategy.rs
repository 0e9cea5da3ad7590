//! Generators of workloads: which steps, how often, and how the drain goes.

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::model::Kind;
use super::workload::{Pick, Push, Round, Step, Workload};

fn push() -> impl Strategy<Value = Push> {
    prop_oneof![
        24 => any::<Pick>().prop_map(Push::Done),
        1 => (any::<Pick>(), any::<bool>()).prop_map(|(op, retry_now)| Push::Fail { op, retry_now }),
    ]
}

fn step(exchange: bool, early: bool) -> BoxedStrategy<Step> {
    let p = any::<Pick>;
    let kind =
        prop_oneof![7 => Just(Kind::File), 4 => Just(Kind::Dir), 1 => Just(Kind::Symlink), 1 => Just(Kind::Node)];
    let setattr = prop_oneof![
        (p(), p()).prop_map(|(ino, perm)| Step::SetAttr {
            ino,
            perm: Some(perm),
            uid: None
        }),
        (p(), 0..3u32).prop_map(|(ino, uid)| Step::SetAttr {
            ino,
            perm: None,
            uid: Some(uid)
        }),
        (p(), p(), 0..3u32).prop_map(|(ino, perm, uid)| Step::SetAttr {
            ino,
            perm: Some(perm),
            uid: Some(uid)
        }),
    ];
    let exchange = if exchange {
        prop::bool::weighted(0.4).boxed()
    } else {
        Just(false).boxed()
    };
    let rename =
        (p(), p(), p(), exchange, prop::bool::weighted(0.3)).prop_map(|(entry, dir, name, exchange, no_replace)| {
            Step::Rename {
                entry,
                dir,
                name,
                exchange,
                no_replace,
            }
        });
    let change = prop_oneof![
        25 => (kind, p(), p(), p()).prop_map(|(kind, dir, name, perm)| Step::Create { kind, dir, name, perm }),
        18 => p().prop_map(|file| Step::Write { file }),
        8 => setattr,
        12 => p().prop_map(|entry| Step::Unlink { entry }),
        6 => p().prop_map(|entry| Step::Rmdir { entry }),
        24 => rename,
        7 => (p(), p(), p()).prop_map(|(entry, dir, name)| Step::Link { entry, dir, name }),
    ];
    if !early {
        return change.boxed();
    }
    prop_oneof![
        84 => change,
        8 => (1..4usize).prop_map(|limit| Step::Begin { limit }),
        8 => vec(push(), 1..4).prop_map(Step::Push),
    ]
    .boxed()
}

fn round() -> impl Strategy<Value = Round> {
    (
        option::weighted(0.5, 1..4usize),
        vec(push(), 0..3),
        prop::bool::weighted(0.7),
    )
        .prop_map(|(limit, pushes, rest)| Round { limit, pushes, rest })
}

/// Workloads of up to 80 steps; in half of them, ops are pushed while the workload runs.
pub(super) fn workload(exchange: bool) -> impl Strategy<Value = Workload> {
    any::<bool>().prop_flat_map(move |early| {
        (vec(step(exchange, early), 1..80), vec(round(), 0..8)).prop_map(|(steps, drain)| Workload { steps, drain })
    })
}
