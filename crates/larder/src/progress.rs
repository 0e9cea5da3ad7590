//! Progress bars for long client commands (`larder drain`, `prefetch`, `pin`, ...), drawn on stderr only
//! when it is a terminal: piped or redirected, a command prints just its result lines.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar on stderr, cleared when dropped (however the command ends) so that what the command
/// prints next starts on a clean line.
pub struct Bar(ProgressBar);

impl std::ops::Deref for Bar {
    type Target = ProgressBar;
    fn deref(&self) -> &ProgressBar {
        &self.0
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// A bar of `len` units drawn with `template` (indicatif's template syntax) and first showing `message`,
/// hidden unless stderr is a terminal.
pub fn bar(len: u64, template: &str, message: String) -> Bar {
    if !std::io::stderr().is_terminal() {
        return Bar(ProgressBar::hidden());
    }
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#-");
    Bar(ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        .with_style(style)
        .with_message(message))
}

/// `larder drain`: changes pushed of those waiting at the start.
pub const DRAIN: &str = "[{bar:30}] {msg}";

/// `larder prefetch|pin|unpin|evict`: bytes of the files acted on.
pub const RESIDENCY: &str = "{prefix} [{bar:30}] {msg}, {bytes}/{total_bytes}";

#[cfg(test)]
mod tests {
    #[test]
    fn templates_parse() {
        for template in [super::DRAIN, super::RESIDENCY] {
            indicatif::ProgressStyle::with_template(template).unwrap();
        }
    }
}
