//! The NPUs of this node as the kubelet sees them: one device per
//! /dev/rblnN, healthy while the driver's sysfs `health` reads `ok`.

use std::path::{Path, PathBuf};

pub use rbln_umd::node_of;
use rbln_umd::uapi::sysfs;

/// Where to look (the real paths, or a fake tree in tests).
#[derive(Clone, Debug)]
pub struct Roots {
    /// The device nodes: `<dev>/rblnN`.
    pub dev: PathBuf,
    /// The attributes: `<sysfs>/rblnN/<attr>` (the misc class directory).
    pub sysfs: PathBuf,
    /// PCI functions: `<pci>/<pci_address>/numa_node`.
    pub pci: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots { dev: "/dev".into(), sysfs: sysfs::DIR.into(), pci: "/sys/bus/pci/devices".into() }
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

fn attr(roots: &Roots, node: u32, name: &std::ffi::CStr) -> std::io::Result<String> {
    std::fs::read_to_string(rbln_umd::sysfs_path(&roots.sysfs, node, name)).map(|s| s.trim().to_string())
}

/// Every /dev/rblnN with its state, by N.
pub fn scan(roots: &Roots) -> Vec<Npu> {
    rbln_umd::nodes_in(&roots.dev)
        .into_iter()
        .map(|node| Npu {
            node,
            health: attr(roots, node, sysfs::HEALTH).unwrap_or_else(|e| format!("unreadable: {e}")),
            numa_node: attr(roots, node, sysfs::PCI_ADDRESS).ok().and_then(|bdf| numa_node(&roots.pci, &bdf)),
            hw_version: attr(roots, node, sysfs::HW_VERSION).ok(),
            driver_version: attr(roots, node, sysfs::DRIVER_VERSION).ok(),
            dram_total_bytes: attr(roots, node, sysfs::DRAM_TOTAL_BYTES).ok().and_then(|s| s.parse().ok()),
        })
        .collect()
}

/// The `numa_node` of PCI function `bdf`; -1 or missing means none.
fn numa_node(pci_root: &Path, bdf: &str) -> Option<i64> {
    let v: i64 = std::fs::read_to_string(pci_root.join(bdf).join("numa_node")).ok()?.trim().parse().ok()?;
    (v >= 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /dev and sysfs: devices by number, health and identity from
    /// the attributes, unreadable health is not ok, other nodes ignored.
    #[test]
    fn scan_a_fake_node() {
        let root = std::env::temp_dir().join(format!("rbln-inventory-{}", std::process::id()));
        let roots = Roots { dev: root.join("dev"), sysfs: root.join("sys"), pci: root.join("pci") };
        std::fs::create_dir_all(&roots.dev).unwrap();
        for n in ["rbln10", "rbln2", "rbln", "null", "rblnx"] {
            std::fs::write(roots.dev.join(n), "").unwrap();
        }
        let d2 = roots.sysfs.join("rbln2");
        std::fs::create_dir_all(&d2).unwrap();
        for (a, v) in [("health", "faulted\n"), ("hw_version", "1.5\n"), ("driver_version", "0.2.0\n"), ("dram_total_bytes", "536870912\n"), ("pci_address", "0000:00:05.0\n")] {
            std::fs::write(d2.join(a), v).unwrap();
        }
        std::fs::create_dir_all(roots.pci.join("0000:00:05.0")).unwrap();
        std::fs::write(roots.pci.join("0000:00:05.0/numa_node"), "1\n").unwrap();
        let npus = scan(&roots);
        assert_eq!(npus.iter().map(|n| n.node).collect::<Vec<_>>(), [2, 10]);
        assert_eq!((npus[0].health.as_str(), npus[0].numa_node, npus[0].dram_total_bytes), ("faulted", Some(1), Some(512 << 20)));
        assert!(!npus[0].healthy());
        assert!(npus[1].health.starts_with("unreadable") && !npus[1].healthy(), "{:?}", npus[1]);
        assert_eq!(npus[1].path(&roots), roots.dev.join("rbln10"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
