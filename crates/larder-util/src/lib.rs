//! larder's small shared helpers, used by the store, the core and the cluster alike: locks whose waits
//! are counted ([`contention`]), one computation per key at a time ([`SingleFlight`]), files and
//! directories created for their owner alone ([`private`]), and holes punched in files ([`holes`]). A leaf: it depends on no other larder crate.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod contention;
mod flight;
pub mod holes;
pub mod private;

pub use flight::{Lead, SingleFlight};
