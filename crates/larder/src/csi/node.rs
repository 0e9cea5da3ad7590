//! The Node service: stage a volume (one larder daemon per volume and node, at the staging path), publish
//! it into pods (bind mounts of the staging path, read-only where asked), and undo both.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use tonic::{Request, Response, Status};

use super::options::{self, Unmount};
use super::proto::node_server::Node;
use super::proto::node_service_capability::rpc::Type as Rpc;
use super::proto::volume_capability::AccessType;
use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_usage::Unit;
use super::proto::*;
use super::state::{Record, StateDir};
use super::{blocking, required};
use crate::mounts::{self, Mounted};

pub struct NodeService {
    node_id: String,
    state: StateDir,
    /// Volumes with a call under way: a second call for one of them is told to come back (ABORTED).
    busy: Arc<Mutex<HashSet<String>>>,
}

/// A volume held for one call.
struct Held {
    busy: Arc<Mutex<HashSet<String>>>,
    id: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        larder_util::contention::lock(&self.busy).remove(&self.id);
    }
}

impl NodeService {
    pub fn new(node_id: String, state: StateDir) -> NodeService {
        NodeService {
            node_id,
            state,
            busy: Arc::default(),
        }
    }

    fn hold(&self, id: &str) -> Result<Held, Status> {
        if !larder_util::contention::lock(&self.busy).insert(id.to_string()) {
            return Err(Status::aborted(format!("another call for volume {id} is under way")));
        }
        Ok(Held {
            busy: self.busy.clone(),
            id: id.to_string(),
        })
    }

    /// Stage again every volume recorded as staged whose daemon is gone (it died with an earlier run of
    /// the plugin). Its bind mounts in pods stay dead: those pods need a restart (docs/design/018-csi.md).
    pub fn restage_recorded(&self) {
        for record in self.state.staged() {
            // A CO's call for the volume got there first.
            let Ok(_held) = self.hold(&record.volume_id) else {
                continue;
            };
            if serving(&record.staging_path) {
                continue;
            }
            match run_mount(&record.mount) {
                Ok(()) => tracing::info!(volume = %record.volume_id, staging = %record.staging_path.display(),
                    "staged again a volume whose daemon was gone"),
                Err(e) => tracing::error!(volume = %record.volume_id, staging = %record.staging_path.display(),
                    error = %e.message(), "cannot stage again a volume whose daemon was gone"),
            }
        }
    }
}

/// Whether a live larder daemon serves `path`.
fn serving(path: &Path) -> bool {
    mounts::mounted_at(path) == Mounted::Larder
        && mounts::daemon_socket(path)
            .ok()
            .is_some_and(|s| crate::control::status(&s).is_ok())
}

/// Run `larder mount` with these arguments; its error, if any, is its own first line.
fn run_mount(args: &[String]) -> Result<(), Status> {
    let exe = std::env::current_exe().map_err(|e| Status::internal(format!("cannot find larder's binary: {e}")))?;
    let out = Command::new(exe)
        .args(args)
        .env_remove("AWS_PROFILE")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Status::internal(format!("cannot run larder mount: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let why = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("larder mount failed")
        .trim_start_matches("larder: ");
    Err(Status::internal(format!("larder mount: {why}")))
}

fn c_path(p: &Path) -> Result<CString, Status> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Status::invalid_argument("a path holds a NUL byte"))
}

/// Bind `from` at `to`, read-only if asked.
fn bind(from: &Path, to: &Path, read_only: bool) -> std::io::Result<()> {
    let (src, dst) = (
        CString::new(from.as_os_str().as_bytes())?,
        CString::new(to.as_os_str().as_bytes())?,
    );
    // SAFETY: both paths are valid NUL-terminated strings for the duration of the calls; null fstype and
    // data are allowed for bind mounts.
    unsafe {
        if libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        if read_only {
            let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
            if libc::mount(
                std::ptr::null(),
                dst.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            ) != 0
            {
                let e = std::io::Error::last_os_error();
                libc::umount2(dst.as_ptr(), 0);
                return Err(e);
            }
        }
    }
    Ok(())
}

fn capability_checked(cap: Option<&VolumeCapability>) -> Result<&VolumeCapability, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    if let Some(AccessType::Block(_)) = cap.access_type {
        return Err(Status::invalid_argument(
            "larder volumes are file systems: block access is not offered",
        ));
    }
    Ok(cap)
}

fn mount_flags(cap: &VolumeCapability) -> &[String] {
    match &cap.access_type {
        Some(AccessType::Mount(m)) => &m.mount_flags,
        _ => &[],
    }
}

fn read_only_mode(cap: &VolumeCapability) -> bool {
    let mode = cap.access_mode.as_ref().map_or(0, |m| m.mode);
    mode == Mode::SingleNodeReaderOnly as i32 || mode == Mode::MultiNodeReaderOnly as i32
}

impl NodeService {
    fn stage(&self, req: NodeStageVolumeRequest) -> Result<(), Status> {
        required(&req.volume_id, "volume_id")?;
        required(&req.staging_target_path, "staging_target_path")?;
        let cap = capability_checked(req.volume_capability.as_ref())?;
        let opts = options::volume_options(&req.volume_context, mount_flags(cap)).map_err(Status::invalid_argument)?;
        let id = &req.volume_id;
        let _held = self.hold(id)?;
        let staging = PathBuf::from(&req.staging_target_path);
        if serving(&staging) {
            return Ok(());
        }
        std::fs::create_dir_all(&staging)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", staging.display())))?;
        let credentials = match options::credentials_file(&req.secrets).map_err(Status::invalid_argument)? {
            Some(text) => Some(
                self.state
                    .write_credentials(id, &text)
                    .map_err(|e| Status::internal(format!("cannot keep the volume's S3 keys: {e}")))?,
            ),
            None => {
                self.state.forget_credentials(id);
                None
            }
        };
        let cache = self.state.cache_dir(id);
        let mount = options::mount_command(&opts, &staging, &cache, credentials.as_deref());
        let record = Record {
            volume_id: id.clone(),
            staging_path: staging.clone(),
            mount: mount.clone(),
            unmount: opts.unmount,
            drain_timeout_secs: opts.drain_timeout.as_secs(),
        };
        // Recorded first: a plugin restarted while the mount comes up stages it again.
        self.state
            .save(&record)
            .map_err(|e| Status::internal(format!("cannot record the volume's staging: {e}")))?;
        if let Err(e) = run_mount(&mount) {
            self.state.unstaged(id);
            return Err(e);
        }
        tracing::info!(volume = %id, staging = %staging.display(), home = %opts.home, "staged");
        Ok(())
    }

    fn unstage(&self, req: NodeUnstageVolumeRequest) -> Result<(), Status> {
        required(&req.volume_id, "volume_id")?;
        required(&req.staging_target_path, "staging_target_path")?;
        let id = &req.volume_id;
        let _held = self.hold(id)?;
        let staging =
            mounts::absolute(Path::new(&req.staging_target_path)).map_err(|e| Status::internal(e.to_string()))?;
        let record = self.state.load(id);
        match mounts::mounted_at(&staging) {
            Mounted::Nothing => {}
            Mounted::Other(t) => {
                return Err(Status::failed_precondition(format!(
                    "{} holds a {t} mount, not this volume",
                    staging.display()
                )));
            }
            Mounted::Larder => {
                let unmount = record.as_ref().map_or(Unmount::LeavePending, |r| r.unmount);
                let timeout = record
                    .as_ref()
                    .map_or(std::time::Duration::from_secs(600), Record::drain_timeout);
                let args = crate::cli::UnmountArgs {
                    mountpoint: staging.clone(),
                    timeout,
                    drain: unmount == Unmount::Drain,
                    leave_pending: unmount == Unmount::LeavePending,
                };
                crate::mounts::unmount(args).map_err(|e| Status::internal(format!("{e:#}")))?;
            }
        }
        self.state.unstaged(id);
        tracing::info!(volume = %id, staging = %staging.display(), "unstaged");
        Ok(())
    }

    fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), Status> {
        required(&req.volume_id, "volume_id")?;
        required(&req.staging_target_path, "staging_target_path")?;
        required(&req.target_path, "target_path")?;
        let cap = capability_checked(req.volume_capability.as_ref())?;
        let read_only = req.readonly || read_only_mode(cap);
        let _held = self.hold(&req.volume_id)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let target = PathBuf::from(&req.target_path);
        c_path(&target)?;
        if mounts::mounted_at(&target) == Mounted::Larder {
            match std::fs::metadata(&target) {
                Ok(_) => return Ok(()),
                // A bind of a daemon that is gone (the plugin restarted): made again from the live staging.
                Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                    mounts::kernel_unmount(&target, true).map_err(|e| {
                        Status::internal(format!("cannot clear the dead mount {}: {e}", target.display()))
                    })?;
                }
                Err(e) => return Err(Status::internal(format!("{}: {e}", target.display()))),
            }
        }
        if mounts::mounted_at(&staging) != Mounted::Larder {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id,
                staging.display()
            )));
        }
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("cannot create {}: {e}", target.display())))?;
        bind(&staging, &target, read_only).map_err(|e| {
            Status::internal(format!(
                "cannot bind {} at {}: {e}",
                staging.display(),
                target.display()
            ))
        })?;
        tracing::info!(volume = %req.volume_id, target = %target.display(), read_only, "published");
        Ok(())
    }

    fn unpublish(&self, req: NodeUnpublishVolumeRequest) -> Result<(), Status> {
        required(&req.volume_id, "volume_id")?;
        required(&req.target_path, "target_path")?;
        let _held = self.hold(&req.volume_id)?;
        let target = mounts::absolute(Path::new(&req.target_path)).map_err(|e| Status::internal(e.to_string()))?;
        // Every mount stacked there (a bind made twice by an interrupted call too).
        while mounts::mounted_at(&target) == Mounted::Larder {
            mounts::kernel_unmount(&target, false)
                .map_err(|e| Status::internal(format!("cannot unmount {}: {e}", target.display())))?;
        }
        match std::fs::remove_dir(&target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Status::internal(format!("cannot remove {}: {e}", target.display()))),
        }
        tracing::info!(volume = %req.volume_id, target = %target.display(), "unpublished");
        Ok(())
    }

    fn stats(&self, req: NodeGetVolumeStatsRequest) -> Result<NodeGetVolumeStatsResponse, Status> {
        required(&req.volume_id, "volume_id")?;
        required(&req.volume_path, "volume_path")?;
        let path = PathBuf::from(&req.volume_path);
        if !path.exists() || mounts::mounted_at(&path) != Mounted::Larder {
            return Err(Status::not_found(format!(
                "no larder volume is mounted at {}",
                path.display()
            )));
        }
        let s = crate::preflight::statvfs(&path)
            .map_err(|e| Status::internal(format!("statvfs {}: {e}", path.display())))?;
        let frsize = s.f_frsize as i64;
        let usage = |total: u64, free: u64, avail: u64, unit: Unit| VolumeUsage {
            total: total as i64,
            available: avail as i64,
            used: total.saturating_sub(free) as i64,
            unit: unit as i32,
        };
        let bytes = |blocks: u64| blocks.saturating_mul(frsize as u64);
        Ok(NodeGetVolumeStatsResponse {
            usage: vec![
                usage(bytes(s.f_blocks), bytes(s.f_bfree), bytes(s.f_bavail), Unit::Bytes),
                usage(s.f_files, s.f_ffree, s.f_favail, Unit::Inodes),
            ],
        })
    }
}

#[tonic::async_trait]
impl Node for Arc<NodeService> {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let this = self.clone();
        blocking(move || this.stage(request.into_inner())).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let this = self.clone();
        blocking(move || this.unstage(request.into_inner())).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let this = self.clone();
        blocking(move || this.publish(request.into_inner())).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let this = self.clone();
        blocking(move || this.unpublish(request.into_inner())).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let this = self.clone();
        Ok(Response::new(blocking(move || this.stats(request.into_inner())).await?))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let cap = |t: Rpc| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc {
                r#type: t as i32,
            })),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![cap(Rpc::StageUnstageVolume), cap(Rpc::GetVolumeStats)],
        }))
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
        }))
    }
}
