//! `rbln-device-plugin`: advertises the node's rbln NPUs to the kubelet as
//! the extended resource `rbln.dev/npu` (device plugin API v1beta1), keeps
//! their health current from sysfs, hands allocated devices to containers
//! with RBLN_VISIBLE_DEVICES, registers again when the kubelet restarts,
//! and keeps the node's NFD feature file (labels) up to date.
//! docs/kubernetes.md.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rbln_device_plugin::api::{device_plugin_server::DevicePluginServer, registration_client::RegistrationClient, RegisterRequest};
use rbln_device_plugin::inventory::{self, Npu, Roots};
use rbln_device_plugin::{labels, service, unix_channel, API_VERSION, DEFAULT_PLUGIN_DIR, DEFAULT_RESOURCE_NAME, KUBELET_SOCKET};
use tokio::sync::watch;

#[derive(Parser)]
#[command(name = "rbln-device-plugin", version, about = "Kubernetes device plugin for the rbln NPUs")]
struct Args {
    /// The kubelet's device plugin directory (its kubelet.sock, our socket).
    #[arg(long, default_value = DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    /// Extended resource name pods request.
    #[arg(long, default_value = DEFAULT_RESOURCE_NAME)]
    resource_name: String,
    /// File name of this plugin's socket in the plugin directory.
    #[arg(long, default_value = "rbln-npu.sock")]
    endpoint: String,
    /// How often health is read from sysfs, in milliseconds.
    #[arg(long, default_value_t = 200)]
    health_interval_ms: u64,
    /// Node Feature Discovery's local feature directory; the plugin keeps
    /// the file `rbln` there.
    #[arg(long, default_value = "/etc/kubernetes/node-feature-discovery/features.d")]
    nfd_features_dir: PathBuf,
    /// Do not write node labels.
    #[arg(long)]
    no_labels: bool,
    /// Where the device nodes are.
    #[arg(long, default_value = "/dev")]
    dev_dir: PathBuf,
    /// Where the driver's per-device sysfs directories are.
    #[arg(long, default_value = rbln_umd::uapi::sysfs::DIR)]
    sysfs_dir: PathBuf,
}

fn log(msg: impl AsRef<str>) {
    eprintln!("rbln-device-plugin: {}", msg.as_ref());
}

/// Re-read the inventory every `every`; publish changes, rewrite labels.
async fn poll(roots: Roots, tx: watch::Sender<Vec<Npu>>, every: Duration, labels_dir: Option<PathBuf>) {
    let mut written: Option<String> = None;
    loop {
        let r = roots.clone();
        let Ok(now) = tokio::task::spawn_blocking(move || inventory::scan(&r)).await else { return };
        if let Some(dir) = &labels_dir {
            let text = labels::render(&now);
            if written.as_ref() != Some(&text) {
                match labels::write(dir, &now) {
                    Ok(()) => written = Some(text),
                    Err(e) => log(format!("cannot write node labels to {}: {e}", dir.display())),
                }
            }
        }
        tx.send_if_modified(|cur| {
            if *cur == now {
                return false;
            }
            for n in &now {
                match cur.iter().find(|c| c.node == n.node) {
                    Some(c) if c.health == n.health => {}
                    _ => log(format!("{}: health {}", n.id(), n.health)),
                }
            }
            *cur = now;
            true
        });
        tokio::time::sleep(every).await;
    }
}

/// Identity of the kubelet's socket file: a restarted kubelet makes a new
/// one (the change time tells them apart when the inode number is reused).
fn inode(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

enum Registered {
    Yes,
    /// The kubelet refused (wrong version, resource name taken): fatal.
    Refused(tonic::Status),
}

async fn register(args: &Args) -> Result<Registered, String> {
    let channel = unix_channel(&args.plugin_dir.join(KUBELET_SOCKET)).await.map_err(|e| format!("cannot reach the kubelet: {e}"))?;
    let req = RegisterRequest {
        version: API_VERSION.into(),
        endpoint: args.endpoint.clone(),
        resource_name: args.resource_name.clone(),
        options: Some(service::options()),
    };
    match RegistrationClient::new(channel).register(req).await {
        Ok(_) => Ok(Registered::Yes),
        Err(s) if s.code() == tonic::Code::Unavailable => Err(format!("kubelet unavailable: {}", s.message())),
        Err(s) => Ok(Registered::Refused(s)),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.endpoint.is_empty() || args.endpoint.contains('/') {
        log(format!("--endpoint {:?} must be a file name", args.endpoint));
        return ExitCode::from(2);
    }
    let roots = Roots { dev: args.dev_dir.clone(), sysfs: args.sysfs_dir.clone(), ..Roots::default() };
    let first = inventory::scan(&roots);
    log(format!("{} NPU(s): {}", first.len(), first.iter().map(|n| format!("{} ({})", n.id(), n.health)).collect::<Vec<_>>().join(", ")));
    let (tx, rx) = watch::channel(first);
    let labels_dir = (!args.no_labels).then(|| args.nfd_features_dir.clone());
    tokio::spawn(poll(roots.clone(), tx, Duration::from_millis(args.health_interval_ms.max(10)), labels_dir));

    let socket = args.plugin_dir.join(&args.endpoint);
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            log(format!("cannot watch SIGTERM: {e}"));
            return ExitCode::from(1);
        }
    };
    loop {
        // A stale socket from an earlier run is replaced.
        let _ = std::fs::remove_file(&socket);
        let listener = match tokio::net::UnixListener::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                log(format!("cannot listen on {}: {e}; retrying", socket.display()));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let plugin = service::Plugin { devices: rx.clone(), roots: roots.clone() };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(plugin))
                .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        // Register (again), waiting for a kubelet that is not there yet.
        let kubelet = loop {
            match register(&args).await {
                Ok(Registered::Yes) => break inode(&args.plugin_dir.join(KUBELET_SOCKET)),
                Ok(Registered::Refused(s)) => {
                    log(format!("the kubelet refused the registration of {}: {}", args.resource_name, s.message()));
                    return ExitCode::from(1);
                }
                Err(e) => log(format!("{e}; retrying")),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = term.recv() => {
                    let _ = std::fs::remove_file(&socket);
                    return ExitCode::SUCCESS;
                }
            }
        };
        log(format!("registered {} with the kubelet (endpoint {})", args.resource_name, args.endpoint));
        // A kubelet restart removes our socket and makes a new kubelet.sock.
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = term.recv() => {
                    let _ = std::fs::remove_file(&socket);
                    log("SIGTERM: stopped");
                    return ExitCode::SUCCESS;
                }
            }
            if !socket.exists() || inode(&args.plugin_dir.join(KUBELET_SOCKET)) != kubelet {
                log("the kubelet restarted (socket removed or kubelet.sock recreated): registering again");
                break;
            }
        }
        // Graceful, but a ListAndWatch stream of the old kubelet never ends
        // by itself: give open calls a moment, then drop them.
        let _ = stop.send(());
        let mut server = server;
        if tokio::time::timeout(Duration::from_secs(2), &mut server).await.is_err() {
            server.abort();
        }
    }
}
