//! POSIX behaviour the Linux file-system tests (xfstests) look at, on a real mount: each test does what a
//! program would through the kernel, and compares with what a local file system gives.

mod common;

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::{TestDir, require_fuse};

/// The names `readdir` gives from the directory stream's position on, without `.` and `..`.
///
/// # Safety
/// `d` is an open directory stream.
unsafe fn names_from(d: *mut libc::DIR) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        if name != "." && name != ".." {
            out.push(name);
        }
    }
    out.sort();
    out
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn rewinddir_sees_names_made_and_removed_since_the_opendir() {
    require_fuse();
    let t = TestDir::new("rewinddir");
    std::fs::create_dir(t.home.join("d")).unwrap();
    std::fs::write(t.home.join("d/old"), b"x").unwrap();
    let m = t.mount(&[]);
    let dir = cstr(&m.path("d"));
    let d = unsafe { libc::opendir(dir.as_ptr()) };
    assert!(!d.is_null(), "opendir: {}", std::io::Error::last_os_error());
    let before = unsafe { names_from(d) };
    assert_eq!(before, vec!["old".to_string()]);
    let made: Vec<String> = (0..1000).map(|i| format!("new{i:04}")).collect();
    for n in &made {
        std::fs::write(m.path(&format!("d/{n}")), b"").unwrap();
    }
    std::fs::remove_file(m.path("d/old")).unwrap();
    unsafe { libc::rewinddir(d) };
    let after = unsafe { names_from(d) };
    unsafe { libc::closedir(d) };
    assert_eq!(
        after.len(),
        made.len(),
        "after the rewind: {:?}...",
        &after[..after.len().min(5)]
    );
    assert_eq!(after, made);
    m.unmount();
}
