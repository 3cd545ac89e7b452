//! The rbln NPUs in Kubernetes: a device plugin for the kubelet (API
//! v1beta1 over unix sockets) and node labels for Node Feature Discovery.
//!
//! Devices and their health come from the driver's sysfs attributes
//! (`rbln_umd::uapi::sysfs`), never from opening the devices: the plugin is
//! not a client of the NPUs it advertises. docs/kubernetes.md.

pub mod inventory;
pub mod labels;
pub mod service;

/// The generated kubelet API (proto/deviceplugin/v1beta1/api.proto).
pub mod api {
    tonic::include_proto!("v1beta1");
}

use std::path::Path;

/// API version the plugin speaks (RegisterRequest.version).
pub const API_VERSION: &str = "v1beta1";
/// Where the kubelet keeps its socket and the plugins theirs.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's Registration socket, in the plugin dir.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The extended resource pods ask for.
pub const DEFAULT_RESOURCE_NAME: &str = "rbln.dev/npu";
/// Device.health values.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// A gRPC channel over the unix socket at `path` (the URI is a placeholder
/// tonic requires; every connection goes to the socket).
pub async fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    tonic::transport::Endpoint::from_static("http://[::1]:1")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}
