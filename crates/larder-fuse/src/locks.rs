//! What the adapter adds to the core's cluster locks (design note 017): the kernel's lock types turned
//! into the core's, and whether a process waiting for a lock was interrupted.
//!
//! The FUSE library larder uses answers the kernel's interrupt requests itself ("not implemented"), so
//! the kernel would wait for a lock it forwarded until the daemon answers, even after Ctrl-C. Instead, a
//! waiting lock asks every moment whether the process that asked has a signal pending it does not block
//! or ignore (`/proc/<tid>/status`), and gives up with `EINTR` if so, as the kernel's own locks do; a
//! process that is gone gives up too.

use larder_fs::locks::{LockAsk, LockKind};

/// The core's ask for a lock of the kernel's type `typ` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
pub fn ask(owner: u64, start: u64, end: u64, typ: i32, pid: u32) -> Option<LockAsk> {
    let kind = match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => None,
        _ => return None,
    };
    Some(LockAsk {
        owner,
        start,
        end,
        kind,
        pid,
    })
}

/// The kernel's type of a lock of `kind`.
pub fn typ(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
    }
}

/// Whether thread `tid` has a signal pending that it neither blocks nor ignores, or is gone.
pub fn interrupted(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let pending = mask("SigPnd:") | mask("ShdPnd:");
    pending & !mask("SigBlk:") & !mask("SigIgn:") != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_thread_is_not_interrupted_and_a_gone_one_is() {
        let tid = unsafe { libc::gettid() } as u32;
        assert!(!interrupted(tid));
        assert!(interrupted(u32::MAX - 1));
    }

    #[test]
    fn a_pending_signal_the_thread_does_not_block_interrupts_it() {
        // A child that blocks nothing and stops itself: a SIGTERM sent to a stopped process stays pending.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "kill -STOP $$; sleep 5"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .contains("State:\tT")
        {
            assert!(std::time::Instant::now() < deadline, "the child never stopped");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!interrupted(pid));
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let seen = interrupted(pid);
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = child.wait();
        assert!(seen, "a pending SIGTERM was not seen");
    }
}
