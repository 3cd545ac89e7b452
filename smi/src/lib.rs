//! What `rbln-smi` and `rbln-exporter` report: the NPUs of this machine
//! (INFO and STATS through `rbln_umd`) and the processes using them (the
//! driver's per-file statistics, [`clients`]). docs/smi.md.

pub mod clients;

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

#[derive(Clone, Serialize)]
pub struct DeviceReport {
    pub index: u32,
    pub path: String,
    /// "ok", "faulted" (a queue faulted or hung and was not yet destroyed),
    /// "lost" (the device stopped answering), or why it could not be
    /// opened or asked.
    pub health: String,
    pub hw_version: Option<String>,
    pub dram_total_bytes: Option<u64>,
    /// Device DRAM allocated to buffers (all clients).
    pub dram_used_bytes: Option<u64>,
    /// Busy share of the compute cores (0 to 1) and of the DMA engines over
    /// the sampling window.
    pub core_utilization: Option<f64>,
    pub dma_utilization: Option<f64>,
    /// Error records the device raised since its last reset.
    pub faults: Option<u64>,
    /// The device's counters as read (STATS), for exporters.
    #[serde(skip)]
    pub stats: Option<rbln_umd::uapi::DeviceStats>,
    pub host_bytes: u64,
    pub cores: Option<u32>,
    pub queues: Option<u32>,
    pub dma_engines: Option<u32>,
    pub clients: u64,
}

#[derive(Serialize)]
pub struct Report {
    pub driver_version: Option<String>,
    pub devices: Vec<DeviceReport>,
    pub processes: Vec<clients::ProcessUse>,
}

/// Busy share over two reads: the busy times' growth over the elapsed time
/// of `units` units.
fn utilization(a: &[u64], b: &[u64], units: u32, dt_ns: u64) -> Option<f64> {
    if dt_ns == 0 || units == 0 {
        return None;
    }
    let busy: u64 = a.iter().zip(b).take(units as usize).map(|(x, y)| y.saturating_sub(*x)).sum();
    Some((busy as f64 / (dt_ns as f64 * units as f64)).min(1.0))
}

/// Counters of each device from the previous report (watch mode), or
/// from a first read `SAMPLE` before this one.
pub type Samples = std::collections::HashMap<u32, rbln_umd::uapi::DeviceStats>;

/// Sampling window of a single report.
pub const SAMPLE: Duration = Duration::from_millis(200);

pub fn gather(prev: &mut Samples) -> Report {
    let proc_root = Path::new("/proc");
    let me = std::process::id();
    let mut driver_version = None;
    let mut devices = Vec::new();
    // Opening a device makes this process a client of it: its own files
    // are left out of the scan below.
    // Every node, whatever RBLN_VISIBLE_DEVICES says: this is the
    // administrator's view.
    let opened: Vec<_> =
        rbln_umd::present_nodes().into_iter().map(|i| (i, rbln_umd::Device::open_path(format!("/dev/rbln{i}")))).collect();
    if opened.iter().any(|(i, d)| d.is_ok() && !prev.contains_key(i)) {
        for (i, d) in &opened {
            if let Some(s) = d.as_ref().ok().and_then(|d| d.stats().ok()) {
                prev.insert(*i, s);
            }
        }
        std::thread::sleep(SAMPLE);
    }
    let all = clients::scan(proc_root, me);
    for (index, dev) in &opened {
        let mine: Vec<_> = all.iter().filter(|c| c.device == *index).collect();
        let mut d = DeviceReport {
            index: *index,
            path: format!("/dev/rbln{index}"),
            health: "-".into(),
            hw_version: None,
            dram_total_bytes: None,
            dram_used_bytes: None,
            core_utilization: None,
            dma_utilization: None,
            faults: None,
            stats: None,
            host_bytes: mine.iter().map(|c| c.host_bytes).sum(),
            cores: None,
            queues: None,
            dma_engines: None,
            clients: mine.len() as u64,
        };
        match dev {
            Ok(dev) => {
                let i = dev.info();
                driver_version.get_or_insert_with(|| format!("{}.{}.{}", i.driver_version.0, i.driver_version.1, i.driver_version.2));
                d.hw_version = Some(format!("{}.{}", i.hw_version.0, i.hw_version.1));
                d.dram_total_bytes = Some(i.dram_size);
                d.cores = Some(i.num_cores);
                d.queues = Some(i.num_queues);
                d.dma_engines = Some(i.num_dma_engines);
                match dev.stats() {
                    Ok(now) => {
                        d.health = rbln_umd::uapi::health_name(now.health).into();
                        d.dram_used_bytes = Some(i.dram_size.saturating_sub(now.dram_free));
                        d.faults = Some(now.faults);
                        if let Some(before) = prev.get(index) {
                            let dt = now.timestamp_ns.saturating_sub(before.timestamp_ns);
                            d.core_utilization = utilization(&before.core_busy_ns, &now.core_busy_ns, i.num_cores, dt);
                            d.dma_utilization = utilization(&before.dma_busy_ns, &now.dma_busy_ns, i.num_dma_engines, dt);
                        }
                        d.stats = Some(now);
                        prev.insert(*index, now);
                    }
                    Err(e) => d.health = e.to_string(),
                }
            }
            Err(e) => d.health = e.to_string(),
        }
        devices.push(d);
    }
    let processes = clients::by_process(&all, proc_root);
    Report { driver_version, devices, processes }
}

