//! `rbln-kubelet-stub`: the kubelet's half of the device plugin API, for
//! the VM tests. It serves Registration on `<dir>/kubelet.sock`, calls the
//! plugin that registers as a DevicePlugin client on `<dir>/<endpoint>`,
//! and walks through what a kubelet does and what a node operator sees:
//! the device list, a preferred allocation, allocations (good and bad), a
//! fault (Unhealthy within 1 s) and a reset (Healthy again), and a kubelet
//! restart (sockets removed, kubelet.sock recreated: the plugin must
//! register again). Prints "ok - ..." per step; exits 1 at the first
//! failure with what was wrong.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use rbln_device_plugin::api::{
    self, device_plugin_client::DevicePluginClient, registration_server::Registration, registration_server::RegistrationServer, RegisterRequest,
};
use rbln_device_plugin::{unix_channel, API_VERSION, HEALTHY, KUBELET_SOCKET, UNHEALTHY};
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status, Streaming};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = rbln_device_plugin::DEFAULT_PLUGIN_DIR)]
    plugin_dir: PathBuf,
    #[arg(long, default_value = rbln_device_plugin::DEFAULT_RESOURCE_NAME)]
    resource_name: String,
    /// Devices the node has (rbln0 ..).
    #[arg(long)]
    expect_devices: usize,
    /// Shell command that makes rbln0 faulty (returns once it is).
    #[arg(long)]
    fault_cmd: String,
    /// Shell command that resets rbln0.
    #[arg(long)]
    reset_cmd: String,
    /// Where to write the environment of the allocation of rbln1 (NAME=VALUE lines).
    #[arg(long)]
    env_out: PathBuf,
    /// Where the plugin finds the device nodes.
    #[arg(long, default_value = "/dev")]
    dev_dir: PathBuf,
    /// Shell command that brings the devices (e.g. loads the driver): run
    /// once the plugin has listed none; the list must then fill up.
    #[arg(long)]
    add_devices_cmd: Option<String>,
}

struct Kubelet {
    registered: mpsc::Sender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<api::Empty>, Status> {
        let _ = self.registered.send(req.into_inner()).await;
        Ok(Response::new(api::Empty {}))
    }
}

type Res<T = ()> = Result<T, String>;

fn ok(what: &str) {
    println!("ok - {what}");
}

/// Serve Registration on `<dir>/kubelet.sock` until `stop` fires.
fn serve_kubelet(dir: &Path) -> Res<(mpsc::Receiver<RegisterRequest>, oneshot::Sender<()>)> {
    let path = dir.join(KUBELET_SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path).map_err(|e| format!("bind {}: {e}", path.display()))?;
    let (tx, rx) = mpsc::channel(4);
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet { registered: tx }))
            .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    Ok((rx, stop))
}

async fn expect_registration(rx: &mut mpsc::Receiver<RegisterRequest>, args: &Args, within: Duration) -> Res<RegisterRequest> {
    let r = tokio::time::timeout(within, rx.recv()).await.map_err(|_| format!("no Register within {within:?}"))?.ok_or("registration server gone")?;
    if r.version != API_VERSION || r.resource_name != args.resource_name || r.endpoint.is_empty() || r.endpoint.contains('/') {
        return Err(format!("bad RegisterRequest {r:?}"));
    }
    if !r.options.as_ref().is_some_and(|o| o.get_preferred_allocation_available) {
        return Err(format!("options {:?}: GetPreferredAllocation not offered", r.options));
    }
    Ok(r)
}

async fn connect(dir: &Path, endpoint: &str) -> Res<DevicePluginClient<tonic::transport::Channel>> {
    let ch = unix_channel(&dir.join(endpoint)).await.map_err(|e| format!("connect to the plugin's {endpoint}: {e}"))?;
    Ok(DevicePluginClient::new(ch))
}

async fn next_list(s: &mut Streaming<api::ListAndWatchResponse>, within: Duration) -> Res<Vec<api::Device>> {
    match tokio::time::timeout(within, s.message()).await {
        Err(_) => Err(format!("no ListAndWatch update within {within:?}")),
        Ok(Err(e)) => Err(format!("ListAndWatch: {e}")),
        Ok(Ok(None)) => Err("ListAndWatch ended".into()),
        Ok(Ok(Some(r))) => Ok(r.devices),
    }
}

fn health_of<'a>(devs: &'a [api::Device], id: &str) -> Option<&'a str> {
    devs.iter().find(|d| d.id == id).map(|d| d.health.as_str())
}

/// Read updates until `id` has `health`; the time it took.
async fn await_health(s: &mut Streaming<api::ListAndWatchResponse>, id: &str, health: &str, within: Duration) -> Res<(Duration, Vec<api::Device>)> {
    let t0 = Instant::now();
    loop {
        let left = within.checked_sub(t0.elapsed()).ok_or_else(|| format!("{id} not {health} within {within:?}"))?;
        let devs = next_list(s, left).await.map_err(|e| format!("waiting for {id} {health}: {e}"))?;
        if health_of(&devs, id) == Some(health) {
            return Ok((t0.elapsed(), devs));
        }
    }
}

fn sh(cmd: &str) -> Res {
    let st = std::process::Command::new("sh").arg("-c").arg(cmd).status().map_err(|e| format!("{cmd}: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("{cmd}: {st}")) }
}

async fn run(args: Args) -> Res {
    std::fs::create_dir_all(&args.plugin_dir).map_err(|e| format!("{}: {e}", args.plugin_dir.display()))?;
    let (mut registered, stop) = serve_kubelet(&args.plugin_dir)?;
    println!("# kubelet stub listening on {}", args.plugin_dir.join(KUBELET_SOCKET).display());
    let reg = expect_registration(&mut registered, &args, Duration::from_secs(60)).await?;
    ok(&format!("the plugin registered {} (endpoint {})", reg.resource_name, reg.endpoint));

    let mut client = connect(&args.plugin_dir, &reg.endpoint).await?;
    let opts = client.get_device_plugin_options(api::Empty {}).await.map_err(|e| format!("GetDevicePluginOptions: {e}"))?.into_inner();
    if opts.pre_start_required || !opts.get_preferred_allocation_available {
        return Err(format!("GetDevicePluginOptions: {opts:?}"));
    }
    let mut stream = client.list_and_watch(api::Empty {}).await.map_err(|e| format!("ListAndWatch: {e}"))?.into_inner();
    let mut devs = next_list(&mut stream, Duration::from_secs(5)).await?;
    if let Some(cmd) = &args.add_devices_cmd {
        if !devs.is_empty() {
            return Err(format!("before the devices were added the plugin listed {devs:?}"));
        }
        ok("ListAndWatch before the driver is loaded: no devices");
        sh(cmd)?;
        let t0 = Instant::now();
        // Until all are there and healthy: a node appears a moment before
        // its sysfs attributes (unreadable health reads Unhealthy).
        while devs.len() < args.expect_devices || devs.iter().any(|d| d.health != HEALTHY) {
            devs = next_list(&mut stream, Duration::from_secs(10)).await.map_err(|e| format!("waiting for the devices to appear: {e}"))?;
        }
        println!("# the devices were listed {:?} after they were added", t0.elapsed());
    }
    let ids: Vec<String> = (0..args.expect_devices).map(|i| format!("rbln{i}")).collect();
    let listed: Vec<String> = devs.iter().map(|d| d.id.clone()).collect();
    if listed != ids || devs.iter().any(|d| d.health != HEALTHY) {
        return Err(format!("ListAndWatch listed {devs:?}, expected {ids:?} all Healthy"));
    }
    ok(&format!("ListAndWatch: {} devices, all Healthy", devs.len()));

    let pref = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: ids.clone(),
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .map_err(|e| format!("GetPreferredAllocation: {e}"))?
        .into_inner();
    match pref.container_responses.as_slice() {
        [c] if c.device_i_ds.len() == 1 && ids.contains(&c.device_i_ds[0]) => ok(&format!("GetPreferredAllocation of 1: {:?}", c.device_i_ds)),
        other => return Err(format!("GetPreferredAllocation: {other:?}")),
    }

    let alloc = client
        .allocate(api::AllocateRequest { container_requests: vec![api::ContainerAllocateRequest { devices_ids: vec!["rbln1".into()] }] })
        .await
        .map_err(|e| format!("Allocate rbln1: {e}"))?
        .into_inner();
    let [c] = alloc.container_responses.as_slice() else { return Err(format!("Allocate: {alloc:?}")) };
    let node = args.dev_dir.join("rbln1").display().to_string();
    let spec_ok = matches!(c.devices.as_slice(), [d] if d.host_path == node && d.container_path == node && d.permissions == "rw");
    if !spec_ok || c.envs.get("RBLN_VISIBLE_DEVICES").map(String::as_str) != Some("1") {
        return Err(format!("Allocate rbln1: {c:?}"));
    }
    let env: String = c.envs.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
    std::fs::write(&args.env_out, env).map_err(|e| format!("{}: {e}", args.env_out.display()))?;
    ok("Allocate rbln1: /dev/rbln1 (rw) and RBLN_VISIBLE_DEVICES=1");
    for bad in [vec!["rbln9".to_string()], vec!["nvidia0".into()], vec![]] {
        let r = client.allocate(api::AllocateRequest { container_requests: vec![api::ContainerAllocateRequest { devices_ids: bad.clone() }] }).await;
        match r {
            Err(s) if s.code() == tonic::Code::InvalidArgument => println!("# Allocate {bad:?}: {}", s.message()),
            other => return Err(format!("Allocate {bad:?}: {other:?}, expected InvalidArgument")),
        }
    }
    ok("Allocate of unknown or no devices: InvalidArgument");

    sh(&args.fault_cmd)?;
    let (took, devs) = await_health(&mut stream, "rbln0", UNHEALTHY, Duration::from_secs(5)).await?;
    println!("# rbln0 Unhealthy {took:?} after the fault");
    if took > Duration::from_secs(1) || health_of(&devs, "rbln1") != Some(HEALTHY) {
        return Err(format!("after the fault: {took:?}, {devs:?}"));
    }
    ok("a fault on rbln0: Unhealthy within 1 s, rbln1 still Healthy");
    sh(&args.reset_cmd)?;
    let (took, _) = await_health(&mut stream, "rbln0", HEALTHY, Duration::from_secs(5)).await?;
    println!("# rbln0 Healthy {took:?} after the reset");
    ok("after a reset: rbln0 Healthy again");

    // Kubelet restart: the old kubelet's connections and sockets go, a new
    // kubelet.sock appears.
    drop((stream, client));
    let _ = stop.send(());
    for e in std::fs::read_dir(&args.plugin_dir).map_err(|e| e.to_string())?.flatten() {
        if e.file_name().to_string_lossy().ends_with(".sock") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut registered, _stop) = serve_kubelet(&args.plugin_dir)?;
    let t0 = Instant::now();
    let reg = expect_registration(&mut registered, &args, Duration::from_secs(10)).await?;
    println!("# registered again {:?} after the restart", t0.elapsed());
    let mut client = connect(&args.plugin_dir, &reg.endpoint).await?;
    let mut stream = client.list_and_watch(api::Empty {}).await.map_err(|e| format!("ListAndWatch after the restart: {e}"))?.into_inner();
    let devs = next_list(&mut stream, Duration::from_secs(5)).await?;
    if devs.len() != args.expect_devices {
        return Err(format!("after the restart: {devs:?}"));
    }
    ok("kubelet restart: the plugin registered again and lists its devices");
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            println!("FAIL: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
