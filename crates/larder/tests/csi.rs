//! The CSI plugin (`larder csi`) as a CO drives it, over its Unix socket with the CSI v1 protocol: a
//! volume made by CreateVolume, staged (a real larder mount) and published (a bind mount) into a "pod"
//! path, written through it, unpublished and unstaged; its data found at home. Run as root with
//! /dev/fuse. The community's conformance suite runs in `scripts/csi-sanity.sh`.

mod common;
mod moto;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

#[allow(clippy::all, dead_code)]
mod csi {
    tonic::include_proto!("csi.v1");
}

use csi::controller_client::ControllerClient;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi::*;

/// A running `larder csi --mode all`, killed when dropped.
struct Plugin {
    child: Child,
    socket: PathBuf,
    state: PathBuf,
    rt: tokio::runtime::Runtime,
    channel: tonic::transport::Channel,
}

impl Plugin {
    fn start(root: &Path) -> Plugin {
        let socket = root.join("csi/csi.sock");
        let state = root.join("state");
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(LARDER)
            .args(["csi", "--mode", "all", "--node-id", "node-a", "--log-level", "debug"])
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg("--state-dir")
            .arg(&state)
            // The keys a volume uses are its secrets', never the plugin's environment.
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join("csi.log")).unwrap())
            .spawn()
            .expect("start larder csi");
        assert!(
            wait_until(Duration::from_secs(20), || socket.exists()),
            "larder csi did not make its socket:\n{}",
            std::fs::read_to_string(root.join("csi.log")).unwrap_or_default()
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let path = socket.clone();
        let channel = rt
            .block_on(
                tonic::transport::Endpoint::try_from("http://[::1]:1")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    })),
            )
            .expect("connect to the plugin's socket");
        Plugin {
            child,
            socket,
            state,
            rt,
            channel,
        }
    }

    fn node(&self) -> NodeClient<tonic::transport::Channel> {
        NodeClient::new(self.channel.clone())
    }

    fn controller(&self) -> ControllerClient<tonic::transport::Channel> {
        ControllerClient::new(self.channel.clone())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn mount_cap(flags: &[&str], mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: String::new(),
            mount_flags: flags.iter().map(|f| f.to_string()).collect(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

impl Plugin {
    fn stage(
        &self,
        id: &str,
        staging: &Path,
        context: &HashMap<String, String>,
        secrets: &HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        self.rt
            .block_on(self.node().node_stage_volume(NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: s(staging).into(),
                volume_capability: Some(mount_cap(&[], Mode::MultiNodeMultiWriter)),
                volume_context: context.clone(),
                secrets: secrets.clone(),
                ..Default::default()
            }))
            .map(|_| ())
    }

    fn unstage(&self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.rt
            .block_on(self.node().node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: s(staging).into(),
            }))
            .map(|_| ())
    }

    fn publish(&self, id: &str, staging: &Path, target: &Path, readonly: bool) -> Result<(), tonic::Status> {
        self.rt
            .block_on(self.node().node_publish_volume(NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: s(staging).into(),
                target_path: s(target).into(),
                volume_capability: Some(mount_cap(&[], Mode::MultiNodeMultiWriter)),
                readonly,
                ..Default::default()
            }))
            .map(|_| ())
    }

    fn unpublish(&self, id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.rt
            .block_on(self.node().node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: s(target).into(),
            }))
            .map(|_| ())
    }

    fn create(&self, name: &str, params: &HashMap<String, String>, secrets: &HashMap<String, String>) -> Volume {
        self.rt
            .block_on(self.controller().create_volume(CreateVolumeRequest {
                name: name.into(),
                volume_capabilities: vec![mount_cap(&[], Mode::MultiNodeMultiWriter)],
                parameters: params.clone(),
                secrets: secrets.clone(),
                ..Default::default()
            }))
            .expect("CreateVolume")
            .into_inner()
            .volume
            .expect("CreateVolume returns a volume")
    }

    fn delete(&self, id: &str, secrets: &HashMap<String, String>) {
        self.rt
            .block_on(self.controller().delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                secrets: secrets.clone(),
            }))
            .expect("DeleteVolume");
    }
}

/// Unmount whatever a failed test left mounted under `root` (binds first, then the daemons).
fn clean_mounts(root: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounted: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(s(root)))
        .collect();
    mounted.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounted {
        let _ = Command::new("umount").arg("-l").arg(&m).status();
    }
}

struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        clean_mounts(&self.0);
    }
}

#[test]
fn a_volume_made_staged_and_published_takes_writes_to_home_as_its_unmount_option_says() {
    let t = TestDir::new("csi-volume");
    let _cleanup = Cleanup(t.root().to_path_buf());
    let plugin = Plugin::start(t.root());
    let id_client = IdentityClient::new(plugin.channel.clone());
    let info = plugin
        .rt
        .block_on(id_client.clone().get_plugin_info(GetPluginInfoRequest {}))
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "csi.larder.dev");

    // A dynamic volume: a directory of its own under the StorageClass's home. A long pause before pushes
    // keeps what is written queued in the node's cache when the volume is unstaged.
    let params = map(&[("home", s(&t.home)), ("sync-lag", "1h"), ("validity-lag", "1s")]);
    let vol = plugin.create("pvc-0001", &params, &HashMap::new());
    assert_eq!(vol.volume_id, format!("retain:{}/pvc-0001", s(&t.home)));
    assert!(
        t.home.join("pvc-0001").is_dir(),
        "CreateVolume made no directory at home"
    );
    assert_eq!(vol.volume_context["home"], format!("{}/pvc-0001", s(&t.home)));

    let staging = t.root().join("kubelet/staging/pvc-0001");
    let pod_a = t.root().join("kubelet/pods/a/volumes/data");
    let pod_b = t.root().join("kubelet/pods/b/volumes/data");
    std::fs::create_dir_all(&staging).unwrap();
    plugin
        .stage(&vol.volume_id, &staging, &vol.volume_context, &HashMap::new())
        .unwrap();
    // Idempotent: a second staging of a staged volume succeeds and starts nothing.
    plugin
        .stage(&vol.volume_id, &staging, &vol.volume_context, &HashMap::new())
        .unwrap();
    plugin.publish(&vol.volume_id, &staging, &pod_a, false).unwrap();
    plugin.publish(&vol.volume_id, &staging, &pod_b, true).unwrap();
    plugin.publish(&vol.volume_id, &staging, &pod_a, false).unwrap();

    let data = Rng::new(17).bytes(300_000);
    std::fs::write(pod_a.join("weights.bin"), &data).unwrap();
    // The other pod shares the node's one daemon: it reads what the first wrote, and may not write.
    assert_same_bytes(&read(&pod_b.join("weights.bin")), &data, "the read-only pod's view");
    let refused = std::fs::write(pod_b.join("other"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");

    plugin.unpublish(&vol.volume_id, &pod_a).unwrap();
    plugin.unpublish(&vol.volume_id, &pod_b).unwrap();
    plugin.unpublish(&vol.volume_id, &pod_b).unwrap();
    assert!(
        !pod_a.exists() && !pod_b.exists(),
        "unpublishing leaves the target paths"
    );
    plugin.unstage(&vol.volume_id, &staging).unwrap();
    assert!(!is_mounted(&staging), "unstaging left the volume mounted");
    // leave-pending (the default): the write waits in the node's cache directory, not yet at home.
    assert!(
        !t.home.join("pvc-0001/weights.bin").exists(),
        "the write reached home before its sync lag"
    );

    // Staged again on the same node (with a short lag now): the queued write goes home, and unstaging
    // with `drain` returns once home has everything.
    let mut context = vol.volume_context.clone();
    context.insert("sync-lag".into(), "1s".into());
    context.insert("unmount".into(), "drain".into());
    plugin
        .stage(&vol.volume_id, &staging, &context, &HashMap::new())
        .unwrap();
    plugin.publish(&vol.volume_id, &staging, &pod_a, false).unwrap();
    assert_same_bytes(&read(&pod_a.join("weights.bin")), &data, "after staging again");
    std::fs::write(pod_a.join("late.txt"), b"written just before unstaging").unwrap();
    plugin.unpublish(&vol.volume_id, &pod_a).unwrap();
    plugin.unstage(&vol.volume_id, &staging).unwrap();
    assert_same_bytes(&read(&t.home.join("pvc-0001/weights.bin")), &data, "at home");
    assert_eq!(
        read(&t.home.join("pvc-0001/late.txt")),
        b"written just before unstaging"
    );

    // retain (the default): deleting the volume leaves its files; on-delete=delete removes them.
    plugin.delete(&vol.volume_id, &HashMap::new());
    assert!(
        t.home.join("pvc-0001/weights.bin").exists(),
        "a retained volume lost its files"
    );
    let mut doomed = params.clone();
    doomed.insert("on-delete".into(), "delete".into());
    let gone = plugin.create("pvc-0002", &doomed, &HashMap::new());
    std::fs::create_dir_all(t.home.join("pvc-0002/a/b")).unwrap();
    std::fs::write(t.home.join("pvc-0002/a/b/f"), b"x").unwrap();
    plugin.delete(&gone.volume_id, &HashMap::new());
    assert!(
        !t.home.join("pvc-0002").exists(),
        "on-delete=delete left the volume's files"
    );
    plugin.delete(&gone.volume_id, &HashMap::new());
}

#[test]
fn wrong_options_are_refused_at_the_call_naming_them() {
    let t = TestDir::new("csi-refusals");
    let _cleanup = Cleanup(t.root().to_path_buf());
    let plugin = Plugin::start(t.root());
    let staging = t.root().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let cases = [
        (
            map(&[("home", s(&t.home)), ("cache-sise", "1GiB")]),
            "cache-sise is not an option",
        ),
        (
            map(&[("home", s(&t.home)), ("cache-dir", "/tmp")]),
            "set by the CSI plugin",
        ),
        (map(&[("validity-lag", "1s")]), "names no home"),
        (map(&[("home", s(&t.root().join("missing")))]), "larder mount"),
    ];
    for (context, want) in cases {
        let e = plugin.stage("v", &staging, &context, &HashMap::new()).unwrap_err();
        assert!(e.message().contains(want), "{context:?}: {e:?}");
        assert!(!is_mounted(&staging), "{context:?} mounted something");
    }
    let e = plugin
        .rt
        .block_on(plugin.controller().create_volume(CreateVolumeRequest {
            name: "pvc-x".into(),
            volume_capabilities: vec![mount_cap(&[], Mode::SingleNodeWriter)],
            parameters: map(&[("home", s(&t.home)), ("no-dedup", "maybe")]),
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        !t.home.join("pvc-x").exists(),
        "a refused CreateVolume made a directory"
    );
    let e = plugin.publish("v", &staging, &t.root().join("pod"), false).unwrap_err();
    assert_eq!(
        e.code(),
        tonic::Code::FailedPrecondition,
        "publishing an unstaged volume: {e:?}"
    );
}

#[test]
fn a_restarted_plugin_stages_again_the_volumes_whose_daemons_died_with_it() {
    let t = TestDir::new("csi-restart");
    let _cleanup = Cleanup(t.root().to_path_buf());
    let mut plugin = Plugin::start(t.root());
    let staging = t.root().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let context = map(&[("home", s(&t.home)), ("sync-lag", "1h"), ("unmount", "drain")]);
    plugin.stage("vol-r", &staging, &context, &HashMap::new()).unwrap();
    let pod = t.root().join("pods/p/volumes/data");
    plugin.publish("vol-r", &staging, &pod, false).unwrap();
    std::fs::write(pod.join("kept.txt"), b"acknowledged by close").unwrap();
    let pid = num(&status(&staging), "/pid") as i32;
    // The plugin's container stops: its daemons die with it.
    plugin.kill();
    signal(pid, libc::SIGKILL);
    assert!(
        wait_until(Duration::from_secs(10), || !alive(pid)),
        "the daemon did not die"
    );

    let plugin = Plugin::start(t.root());
    assert!(
        wait_until(Duration::from_secs(30), || larder(&["status", s(&staging)]).success()),
        "the restarted plugin did not stage the volume again:\n{}",
        std::fs::read_to_string(t.root().join("csi.log")).unwrap_or_default()
    );
    assert_eq!(read(&staging.join("kept.txt")), b"acknowledged by close");
    assert!(!t.home.join("kept.txt").exists(), "pushed before its sync lag");
    // The pod's bind of the dead daemon's mount stays dead, until the volume is published there again.
    let dead = std::fs::metadata(&pod).unwrap_err();
    assert_eq!(dead.raw_os_error(), Some(libc::ENOTCONN), "{dead}");
    plugin.publish("vol-r", &staging, &pod, false).unwrap();
    assert_eq!(read(&pod.join("kept.txt")), b"acknowledged by close");
    plugin.unpublish("vol-r", &pod).unwrap();
    // Unstaged with drain: the queued write, made under the dead daemon, goes home.
    plugin.unstage("vol-r", &staging).unwrap();
    assert_eq!(read(&t.home.join("kept.txt")), b"acknowledged by close");
}

/// The one volume directory in a state directory.
fn volume_dir(state: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(state.join("volumes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

#[test]
fn s3_keys_from_the_secrets_reach_the_daemon_through_a_private_file_only() {
    let st = moto::S3Test::new("csi-s3", "volumes");
    let _cleanup = Cleanup(st.t.root().to_path_buf());
    let plugin = Plugin::start(st.t.root());
    let endpoint = st
        .srv
        .env()
        .iter()
        .find(|(k, _)| *k == "S3_ENDPOINT")
        .unwrap()
        .1
        .to_string();
    let secret = "csi-secret-key-7f3a";
    let secrets = map(&[("aws_access_key_id", "test"), ("aws_secret_access_key", secret)]);
    let params = map(&[("home", &st.url()), ("s3-endpoint", &endpoint), ("unmount", "drain")]);
    let vol = plugin.create("pvc-s3", &params, &secrets);
    assert_eq!(vol.volume_id, format!("retain:{}/pvc-s3", st.url()));

    let staging = st.t.root().join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    plugin
        .stage(&vol.volume_id, &staging, &vol.volume_context, &secrets)
        .unwrap();
    let creds = volume_dir(&plugin.state).join("credentials");
    assert_eq!(std::fs::metadata(&creds).unwrap().permissions().mode() & 0o777, 0o600);
    let pid = num(&status(&staging), "/pid");
    for what in ["cmdline", "environ"] {
        let text = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains(secret),
            "the secret is in the daemon's {what}"
        );
    }
    let log = std::fs::read_to_string(st.t.root().join("csi.log")).unwrap();
    assert!(!log.contains(secret), "the secret is in the plugin's log");

    std::fs::write(staging.join("hello.txt"), b"from a pod").unwrap();
    plugin.unstage(&vol.volume_id, &staging).unwrap();
    assert_eq!(st.get(&st.key("pvc-s3/hello.txt")), b"from a pod");
    assert!(!creds.exists(), "the S3 keys stayed on the node after unstaging");
}
