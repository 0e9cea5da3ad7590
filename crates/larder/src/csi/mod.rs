//! `larder csi`: a Container Storage Interface plugin, so that Kubernetes (or any CO) mounts larder
//! volumes in pods (docs/design/018-csi.md).
//!
//! - Identity: the plugin's name, and whether it offers the Controller service.
//! - Node: a volume is staged once per node (one larder daemon at the staging path, its cache directory in
//!   the node's state directory), and published into each pod by a bind mount of the staging path.
//! - Controller: a dynamic volume is a directory (or S3 prefix) under the home the StorageClass names.

mod controller;
mod node;
mod options;
mod state;

use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result, bail};
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::cli::{CsiArgs, CsiMode};

#[allow(clippy::all, clippy::pedantic, dead_code)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

use proto::identity_server::{Identity, IdentityServer};
use proto::plugin_capability::service::Type as ServiceType;
use proto::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest, GetPluginInfoResponse,
    PluginCapability, ProbeRequest, ProbeResponse, plugin_capability,
};

/// The plugin's name, as a CSIDriver object and a StorageClass's provisioner name it.
pub const DRIVER_NAME: &str = "csi.larder.dev";

/// `unix:///PATH` (or `unix:PATH`), the only endpoint a CSI plugin serves on.
fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| anyhow::anyhow!("--endpoint {endpoint:?}: expected unix:///PATH (an absolute path)"))?;
    Ok(PathBuf::from(path))
}

/// Run the plugin until SIGTERM or SIGINT.
pub fn run(args: CsiArgs) -> Result<()> {
    crate::daemon::init_logging(&args.log_level);
    let path = socket_path(&args.endpoint)?;
    let node = matches!(args.mode, CsiMode::Node | CsiMode::All);
    let controller = matches!(args.mode, CsiMode::Controller | CsiMode::All);
    let node_id = match (&args.node_id, node) {
        (Some(id), _) => id.clone(),
        (None, false) => String::new(),
        (None, true) => bail!("--node-id is required with --mode node or all (Kubernetes: the node's name)"),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // A socket left by a plugin that died is in the way; anything else at that path is not ours to remove.
    match std::fs::symlink_metadata(&path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => std::fs::remove_file(&path)?,
        Ok(_) => bail!("--endpoint {}: something that is not a socket is there", path.display()),
        Err(_) => {}
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("larder-csi")
        .enable_all()
        .build()
        .context("cannot start the CSI plugin's runtime")?;
    let node_service = if node {
        let state = state::StateDir::open(&args.state_dir)?;
        let service = std::sync::Arc::new(node::NodeService::new(node_id.clone(), state));
        // Volumes staged before a restart of the plugin, whose daemons died with it, are staged again
        // while the plugin serves: a home that does not answer holds up no other volume's calls.
        let restaging = service.clone();
        std::thread::Builder::new()
            .name("larder-csi-restage".into())
            .spawn(move || restaging.restage_recorded())
            .context("cannot start the CSI plugin's restaging thread")?;
        Some(service)
    } else {
        None
    };
    runtime.block_on(async move {
        let listener =
            tokio::net::UnixListener::bind(&path).with_context(|| format!("cannot listen on {}", path.display()))?;
        tracing::info!(endpoint = %path.display(), mode = ?args.mode, node_id = %node_id, "serving CSI");
        let identity = IdentityServer::new(IdentityService { controller });
        let router = Server::builder()
            .add_service(identity)
            .add_optional_service(node_service.map(proto::node_server::NodeServer::new))
            .add_optional_service(controller.then(|| {
                proto::controller_server::ControllerServer::new(std::sync::Arc::new(
                    controller::ControllerService::default(),
                ))
            }));
        router
            .serve_with_incoming_shutdown(Incoming(listener), stop_signal())
            .await
            .context("the CSI server stopped")?;
        let _ = std::fs::remove_file(&path);
        tracing::info!("CSI plugin stopped");
        Ok(())
    })
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// The connections to the plugin's socket, as tonic takes them.
struct Incoming(tokio::net::UnixListener);

impl futures::Stream for Incoming {
    type Item = std::io::Result<tokio::net::UnixStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_accept(cx).map(|r| Some(r.map(|(stream, _)| stream)))
    }
}

struct IdentityService {
    controller: bool,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.into(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let capabilities = if self.controller {
            vec![PluginCapability {
                r#type: Some(plugin_capability::Type::Service(plugin_capability::Service {
                    r#type: ServiceType::ControllerService as i32,
                })),
            }]
        } else {
            Vec::new()
        };
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {}))
    }
}

/// A required field left empty.
fn required(value: &str, what: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    Ok(())
}

/// Run blocking work (a mount, a home call) off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Status> + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("a CSI call's work failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unix_endpoints_with_absolute_paths_are_taken() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        for bad in [
            "tcp://127.0.0.1:10000",
            "/csi/csi.sock",
            "unix://csi.sock",
            "unix:csi.sock",
        ] {
            let e = socket_path(bad).unwrap_err().to_string();
            assert!(e.contains("unix:///PATH"), "{bad}: {e}");
        }
    }
}
