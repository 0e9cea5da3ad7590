//! The Controller service: a dynamic volume is a directory (an S3 prefix) of its own under the home the
//! StorageClass names, made by CreateVolume. Its id says where it is and what DeleteVolume does with it
//! (`retain:URL` or `delete:URL`), so the controller keeps no state that a restart could lose.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use larder_home::{FileKind, Home, HomeError, HomeSpec, Owner, open_home};
use tonic::{Request, Response, Status};

use super::options;
use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::rpc::Type as Rpc;
use super::proto::validate_volume_capabilities_response::Confirmed;
use super::proto::volume_capability::AccessType;
use super::proto::*;
use super::{blocking, required};

#[derive(Default)]
pub struct ControllerService {
    /// The capacity each volume this controller made was asked with: a second CreateVolume of the same name
    /// with another capacity is refused, as the interface wants (home has no quotas to tell it apart).
    asked: Arc<Mutex<HashMap<String, i64>>>,
}

/// What DeleteVolume does with a volume's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnDelete {
    Retain,
    Delete,
}

/// A volume this controller made: its policy and its own home.
#[derive(Debug, PartialEq, Eq)]
struct VolumeId {
    on_delete: OnDelete,
    home: String,
}

impl VolumeId {
    fn encode(&self) -> String {
        let p = match self.on_delete {
            OnDelete::Retain => "retain",
            OnDelete::Delete => "delete",
        };
        format!("{p}:{}", self.home)
    }

    fn parse(id: &str) -> Option<VolumeId> {
        let (p, home) = id.split_once(':')?;
        let on_delete = match p {
            "retain" => OnDelete::Retain,
            "delete" => OnDelete::Delete,
            _ => return None,
        };
        let (parent, name) = split_home(home)?;
        (!parent.is_empty() && !name.is_empty()).then(|| VolumeId {
            on_delete,
            home: home.to_string(),
        })
    }

    /// The home it is in, and its name there.
    fn parent(&self) -> (&str, &str) {
        split_home(&self.home).expect("a parsed id splits")
    }
}

fn split_home(home: &str) -> Option<(&str, &str)> {
    let (parent, name) = home.rsplit_once('/')?;
    let parent = if parent.is_empty() || parent.ends_with(':') || parent.ends_with(":/") || parent.ends_with("://") {
        // "/name" or "file:///name": the parent is the root itself.
        &home[..home.len() - name.len()]
    } else {
        parent
    };
    Some((parent, name))
}

/// The directory a volume named `name` gets: the name itself when it is short and of safe characters
/// (Kubernetes' `pvc-UUID`), else its safe characters (at most 40) and a hash of the whole name.
fn dir_name(name: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.len() <= 64 && name.chars().all(safe) {
        return name.to_string();
    }
    let mut kept: String = name.chars().filter(|c| safe(*c)).take(40).collect();
    if kept.is_empty() {
        kept = "volume".into();
    }
    format!("{kept}-{:016x}", crate::mounts::fnv64(name.as_bytes()))
}

/// A home as the controller reaches it: S3 settings from the parameters or the secrets, S3 keys from the
/// secrets.
fn open(
    url: &str,
    params: &HashMap<String, String>,
    secrets: &HashMap<String, String>,
) -> Result<Arc<dyn Home>, Status> {
    let setting = |k: &str| params.get(k).or_else(|| secrets.get(k)).cloned();
    let s3_credentials = options::credentials(secrets).map_err(Status::invalid_argument)?;
    let spec = HomeSpec {
        url: url.to_string(),
        op_timeout: Some(Duration::from_secs(30)),
        wan: None,
        s3_endpoint: setting("s3-endpoint"),
        s3_region: setting("s3-region"),
        s3_credentials,
        s3_metadata: setting("s3-metadata").as_deref() != Some("off"),
        fault_file: None,
    };
    open_home(&spec)
        .map(|o| o.home)
        .map_err(|e| Status::failed_precondition(format!("home {url}: {e}")))
}

fn home_status(what: &str, e: HomeError) -> Status {
    let text = format!("{what}: {e}");
    match e {
        HomeError::NotFound => Status::not_found(text),
        HomeError::PermissionDenied => Status::permission_denied(text),
        HomeError::NoSpace => Status::resource_exhausted(text),
        HomeError::NameTooLong | HomeError::InvalidName(_) => Status::invalid_argument(text),
        _ => Status::unavailable(text),
    }
}

/// Remove `path` at home and everything below it.
fn remove_tree(home: &dyn Home, path: &Path) -> Result<(), HomeError> {
    let entries = match home.list(path) {
        Ok(e) => e,
        Err(HomeError::NotFound) => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let child = path.join(&entry.name);
        let gone = if entry.kind == FileKind::Dir {
            remove_tree(home, &child)
        } else {
            home.unlink(&child)
        };
        match gone {
            Ok(()) | Err(HomeError::NotFound) => {}
            Err(e) => return Err(e),
        }
    }
    match home.rmdir(path) {
        Ok(()) | Err(HomeError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

fn check_capabilities(caps: &[VolumeCapability]) -> Result<(), String> {
    if caps.is_empty() {
        return Err("volume_capabilities is required".into());
    }
    for cap in caps {
        match cap.access_type {
            Some(AccessType::Mount(_)) => {}
            Some(AccessType::Block(_)) => {
                return Err("larder volumes are file systems: block access is not offered".into());
            }
            None => return Err("a volume capability names no access type".into()),
        }
        if cap.access_mode.as_ref().is_none_or(|m| m.mode == 0) {
            return Err("a volume capability names no access mode".into());
        }
    }
    Ok(())
}

impl ControllerService {
    fn create(&self, req: CreateVolumeRequest) -> Result<CreateVolumeResponse, Status> {
        required(&req.name, "name")?;
        check_capabilities(&req.volume_capabilities).map_err(Status::invalid_argument)?;
        if req.volume_content_source.is_some() {
            return Err(Status::invalid_argument(
                "volumes made from snapshots or other volumes are not offered",
            ));
        }
        let parent = req
            .parameters
            .get("home")
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Status::invalid_argument("the StorageClass names no home (parameter `home`)"))?;
        // Trailing slashes go, but not the root's own ("/", "file:///").
        let trimmed = parent.trim_end_matches('/');
        let parent = if trimmed.is_empty() || trimmed.ends_with(':') {
            parent.clone()
        } else {
            trimmed.to_string()
        };
        let on_delete = match req.parameters.get("on-delete").map(String::as_str) {
            None | Some("retain") => OnDelete::Retain,
            Some("delete") => OnDelete::Delete,
            Some(other) => {
                return Err(Status::invalid_argument(format!(
                    "on-delete={other:?}: expected retain or delete"
                )));
            }
        };
        let required_bytes = req.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
        let limit = req.capacity_range.as_ref().map_or(0, |c| c.limit_bytes);
        if required_bytes < 0 || limit < 0 || (limit > 0 && required_bytes > limit) {
            return Err(Status::out_of_range(
                "capacity_range: required_bytes must be within 0..=limit_bytes",
            ));
        }
        {
            let asked = larder_util::contention::lock(&self.asked);
            if let Some(before) = asked.get(&req.name)
                && *before != required_bytes
            {
                return Err(Status::already_exists(format!(
                    "volume {} was made with a capacity of {before} bytes",
                    req.name
                )));
            }
        }
        let name = dir_name(&req.name);
        let id = VolumeId {
            on_delete,
            home: if parent.ends_with('/') {
                format!("{parent}{name}")
            } else {
                format!("{parent}/{name}")
            },
        };
        // The mount options the volume will be staged with are checked now, not at the first pod.
        let mut context: HashMap<String, String> = req
            .parameters
            .iter()
            .filter(|(k, _)| !k.contains('/') && k.as_str() != "on-delete")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        context.insert("home".into(), id.home.clone());
        options::volume_options(&context, &[]).map_err(Status::invalid_argument)?;
        let home = open(&parent, &req.parameters, &req.secrets)?;
        match home.mkdir(Path::new(&name), 0o777, Owner::default()) {
            Ok(_) => {}
            Err(HomeError::Exists) => match home.stat(Path::new(&name)) {
                Ok(a) if a.kind == FileKind::Dir => {}
                Ok(_) => {
                    return Err(Status::already_exists(format!(
                        "{} is at home and is not a directory",
                        id.home
                    )));
                }
                Err(e) => return Err(home_status(&id.home, e)),
            },
            Err(e) => return Err(home_status(&format!("cannot make {}", id.home), e)),
        }
        larder_util::contention::lock(&self.asked).insert(req.name.clone(), required_bytes);
        tracing::info!(volume = %id.encode(), name = %req.name, "created");
        Ok(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: required_bytes,
                volume_id: id.encode(),
                volume_context: context,
            }),
        })
    }

    fn delete(&self, req: DeleteVolumeRequest) -> Result<(), Status> {
        required(&req.volume_id, "volume_id")?;
        // An id this controller never made names no volume: it is gone already.
        let Some(id) = VolumeId::parse(&req.volume_id) else {
            return Ok(());
        };
        if id.on_delete == OnDelete::Delete {
            let (parent, name) = id.parent();
            let home = open(parent, &HashMap::new(), &req.secrets)?;
            remove_tree(home.as_ref(), Path::new(name))
                .map_err(|e| home_status(&format!("cannot remove {}", id.home), e))?;
            tracing::info!(volume = %req.volume_id, "deleted, with its files");
        } else {
            tracing::info!(volume = %req.volume_id, "deleted; its files stay at home (on-delete: retain)");
        }
        let name = id.parent().1.to_string();
        larder_util::contention::lock(&self.asked).retain(|n, _| dir_name(n) != name);
        Ok(())
    }

    fn validate(&self, req: ValidateVolumeCapabilitiesRequest) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
        required(&req.volume_id, "volume_id")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let id =
            VolumeId::parse(&req.volume_id).ok_or_else(|| Status::not_found(format!("no volume {}", req.volume_id)))?;
        let (parent, name) = id.parent();
        let home = open(parent, &req.volume_context, &req.secrets)?;
        match home.stat(Path::new(name)) {
            Ok(a) if a.kind == FileKind::Dir => {}
            Ok(_) | Err(HomeError::NotFound) => return Err(Status::not_found(format!("no volume {}", req.volume_id))),
            Err(e) => return Err(home_status(&id.home, e)),
        }
        Ok(match check_capabilities(&req.volume_capabilities) {
            Ok(()) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                }),
                message: String::new(),
            },
            Err(why) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            },
        })
    }
}

#[tonic::async_trait]
impl Controller for Arc<ControllerService> {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let this = self.clone();
        Ok(Response::new(
            blocking(move || this.create(request.into_inner())).await?,
        ))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let this = self.clone();
        blocking(move || this.delete(request.into_inner())).await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let this = self.clone();
        Ok(Response::new(
            blocking(move || this.validate(request.into_inner())).await?,
        ))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(
                    controller_service_capability::Rpc {
                        r#type: Rpc::CreateDeleteVolume as i32,
                    },
                )),
            }],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_say_where_the_volume_is_and_what_deleting_it_does() {
        for (home, parent, name) in [
            ("/srv/home/pvc-1", "/srv/home", "pvc-1"),
            ("/pvc-1", "/", "pvc-1"),
            ("s3://bucket/data/pvc-1", "s3://bucket/data", "pvc-1"),
            ("s3://bucket/pvc-1", "s3://bucket", "pvc-1"),
            ("file:///pvc-1", "file:///", "pvc-1"),
        ] {
            let id = VolumeId {
                on_delete: OnDelete::Delete,
                home: home.into(),
            };
            let back = VolumeId::parse(&id.encode()).unwrap();
            assert_eq!(back, id);
            assert_eq!(back.parent(), (parent, name), "{home}");
        }
        for foreign in ["", "pvc-1", "keep:/srv/x", "retain:", "retain:/srv/", "delete:noslash"] {
            assert_eq!(VolumeId::parse(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn directory_names_are_safe_and_tell_names_apart() {
        let pv = "pvc-5f0c7a3e-1111-2222-3333-444455556666";
        assert_eq!(dir_name(pv), pv);
        let odd = dir_name("sanity [Node] ../x y");
        assert!(
            !odd.contains('/') && !odd.contains(' ') && !odd.starts_with('.'),
            "{odd}"
        );
        assert_ne!(dir_name("a b"), dir_name("a_b"));
        assert!(dir_name(&"n".repeat(128)).len() <= 60);
    }
}
