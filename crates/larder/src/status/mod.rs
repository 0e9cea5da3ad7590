//! `larder status`, and the snapshot the daemon serves on its control socket and metrics endpoint: the
//! status document ([`model`]), how the daemon gathers it and a client fetches it ([`source`]), and how it
//! is printed ([`render`]).

mod model;
mod render;
mod source;

pub use model::*;
pub use render::{describe_refused, human_bytes, members, run};
pub use source::{ABD_UNITS, StatusSource, fetch};
