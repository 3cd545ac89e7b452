//! The NPUs of this node as the kubelet sees them: one device per
//! /dev/rblnN, healthy while the driver's sysfs `health` reads `ok`.

use std::path::{Path, PathBuf};

use rbln_umd::uapi::sysfs;

/// Where to look (the real paths, or a fake tree in tests).
#[derive(Clone, Debug)]
pub struct Roots {
    /// The device nodes: `<dev>/rblnN`.
    pub dev: PathBuf,
    /// The attributes: `<sysfs>/rblnN/<attr>` (the misc class directory).
    pub sysfs: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots { dev: "/dev".into(), sysfs: "/sys/class/misc".into() }
    }
}

/// One NPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Npu {
    /// N of /dev/rblnN.
    pub node: u32,
    /// The driver's health (`ok`, `faulted`, `hung`, `lost`), or why it
    /// could not be read.
    pub health: String,
    /// NUMA node of the PCI function, if the platform has one.
    pub numa_node: Option<i64>,
    pub hw_version: Option<String>,
    pub driver_version: Option<String>,
    pub dram_total_bytes: Option<u64>,
}

impl Npu {
    /// The device ID the kubelet knows it by.
    pub fn id(&self) -> String {
        format!("rbln{}", self.node)
    }

    pub fn healthy(&self) -> bool {
        self.health == "ok"
    }

    /// The device node's path (the same inside the container).
    pub fn path(&self, roots: &Roots) -> PathBuf {
        roots.dev.join(self.id())
    }
}

/// N of an ID "rblnN".
pub fn node_of(id: &str) -> Option<u32> {
    id.strip_prefix("rbln").filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).and_then(|n| n.parse().ok())
}

fn attr(roots: &Roots, node: u32, name: &std::ffi::CStr) -> std::io::Result<String> {
    std::fs::read_to_string(roots.sysfs.join(format!("rbln{node}")).join(name.to_string_lossy().as_ref())).map(|s| s.trim().to_string())
}

/// Every /dev/rblnN with its state, by N.
pub fn scan(roots: &Roots) -> Vec<Npu> {
    let mut nodes: Vec<u32> = std::fs::read_dir(&roots.dev)
        .map(|d| d.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str().and_then(node_of)).collect())
        .unwrap_or_default();
    nodes.sort_unstable();
    nodes
        .into_iter()
        .map(|node| Npu {
            node,
            health: attr(roots, node, sysfs::HEALTH).unwrap_or_else(|e| format!("unreadable: {e}")),
            numa_node: numa_node(&roots.sysfs, node),
            hw_version: attr(roots, node, sysfs::HW_VERSION).ok(),
            driver_version: attr(roots, node, sysfs::DRIVER_VERSION).ok(),
            dram_total_bytes: attr(roots, node, sysfs::DRAM_TOTAL_BYTES).ok().and_then(|s| s.parse().ok()),
        })
        .collect()
}

/// The PCI function's `numa_node` (the misc device's parent); -1 or
/// missing means none.
fn numa_node(sysfs_root: &Path, node: u32) -> Option<i64> {
    let v: i64 = std::fs::read_to_string(sysfs_root.join(format!("rbln{node}/device/numa_node"))).ok()?.trim().parse().ok()?;
    (v >= 0).then_some(v)
}
