//! Opening a device and asking what it is.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rbln_uapi as uapi;

use crate::error::{Error, Op, Result};
use crate::sys;

/// What the device and its driver are (`RBLN_IOCTL_INFO`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    /// uAPI version of the driver ([`rbln_uapi::UAPI_VERSION`]).
    pub uapi_version: u32,
    /// Driver version (major, minor, patch).
    pub driver_version: (u32, u32, u32),
    pub vendor_id: u16,
    pub device_id: u16,
    /// Hardware version (major, minor).
    pub hw_version: (u32, u32),
    /// Device DRAM in bytes.
    pub dram_size: u64,
    pub num_queues: u32,
    pub num_cores: u32,
    pub num_dma_engines: u32,
    /// Capability bits ([`rbln_hw::regs::caps`]).
    pub caps: u32,
    /// N of /dev/rblnN.
    pub index: u32,
}

impl From<uapi::DeviceInfo> for DeviceInfo {
    fn from(i: uapi::DeviceInfo) -> Self {
        DeviceInfo {
            uapi_version: i.uapi_version,
            driver_version: (i.driver_version >> 16, (i.driver_version >> 8) & 0xff, i.driver_version & 0xff),
            vendor_id: i.vendor_id,
            device_id: i.device_id,
            hw_version: (i.hw_version >> 16, i.hw_version & 0xffff),
            dram_size: i.dram_size,
            num_queues: i.num_queues,
            num_cores: i.num_cores,
            num_dma_engines: i.num_dma_engines,
            caps: i.caps,
            index: i.minor_index,
        }
    }
}

/// One open file of /dev/rblnN: one device context (address space),
/// shared by every object made from it.
#[derive(Debug)]
pub(crate) struct DeviceInner {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) info: DeviceInfo,
    /// A fault or hang was seen on one of this context's queues: the kernel
    /// refuses its submissions from then on, and so does the UMD for
    /// user-mode queues (which the kernel cannot stop), so that both kinds
    /// of queue behave alike.
    pub(crate) poisoned: AtomicBool,
}

impl DeviceInner {
    pub(crate) fn ioctl<T: sys::IoctlArg>(&self, arg: &mut T) -> Result<()> {
        sys::ioctl(&self.file, arg).map_err(|e| Error::from_errno(T::OP, e))
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Relaxed)
    }

    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Relaxed);
    }
}

/// An open NPU.
///
/// `Device` is `Send + Sync` and cheap to clone (a reference count): share
/// it between threads and give each thread its own [`Queue`](crate::Queue)
/// or [`UserQueue`](crate::UserQueue). Everything made from one `Device`
/// (buffers, queues, command buffers) lives in its device context and keeps
/// the file open; the context goes away when the last of them is dropped.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

/// The environment variable that selects and orders the NPUs a process
/// uses, as a comma-separated list of /dev/rblnN indices ("1", "2,0"; empty:
/// none). Device index i of every API (`Device::open(i)`, `rbln-run
/// --device i`, the Python SDK, rbln-serve) is then the i-th listed node,
/// so a program written for device 0 runs unchanged on the NPU it was
/// given (the Kubernetes device plugin sets it). Unset: index i is
/// /dev/rblni.
pub const VISIBLE_DEVICES_ENV: &str = "RBLN_VISIBLE_DEVICES";

/// The list in RBLN_VISIBLE_DEVICES, if set.
fn visible_devices() -> Option<std::result::Result<Vec<u32>, String>> {
    let raw = std::env::var_os(VISIBLE_DEVICES_ENV)?;
    let text = raw.to_string_lossy().into_owned();
    Some(parse_visible(&text).ok_or(text))
}

fn parse_visible(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() {
        return Some(Vec::new());
    }
    let list: Vec<u32> = text.split(',').map(|t| t.trim().parse().ok()).collect::<Option<_>>()?;
    // Each node once: two indices naming one device would share a context limit and confuse users.
    let mut seen = list.clone();
    seen.sort_unstable();
    seen.dedup();
    (seen.len() == list.len()).then_some(list)
}

/// The /dev/rblnN index behind device index `index` of this process.
pub fn physical_index(index: u32) -> Result<u32> {
    match visible_devices() {
        None => Ok(index),
        Some(Err(visible)) => Err(Error::NotVisible { index, visible, why: "is not a comma-separated list of distinct device indices" }),
        Some(Ok(list)) => list.get(index as usize).copied().ok_or_else(|| Error::NotVisible {
            index,
            visible: std::env::var(VISIBLE_DEVICES_ENV).unwrap_or_default(),
            why: "lists fewer devices",
        }),
    }
}

/// Indices of the NPUs this process can open, ascending: the `/dev/rblnN`
/// nodes present (empty when rbln.ko is not loaded), through
/// RBLN_VISIBLE_DEVICES when it is set.
pub fn device_indices() -> Vec<u32> {
    let present = present_nodes();
    match visible_devices() {
        None => present,
        Some(Err(_)) => Vec::new(),
        Some(Ok(list)) => (0..list.len() as u32).filter(|&i| present.contains(&list[i as usize])).collect(),
    }
}

/// Attribute `attr` (a `uapi::sysfs` name) of /dev/rbln`node` under the
/// sysfs class directory `class_dir` (normally `uapi::sysfs::DIR`).
pub fn sysfs_path(class_dir: &Path, node: u32, attr: &std::ffi::CStr) -> PathBuf {
    class_dir.join(format!("rbln{node}")).join(attr.to_string_lossy().as_ref())
}

/// Attribute `attr` (a `uapi::sysfs` name) of /dev/rbln`node`, trimmed.
pub fn read_sysfs(node: u32, attr: &std::ffi::CStr) -> std::io::Result<String> {
    std::fs::read_to_string(sysfs_path(Path::new(uapi::sysfs::DIR), node, attr)).map(|s| s.trim().to_string())
}

/// The privileged reset of /dev/rbln`node` (sysfs `reset`; root). Every
/// context open on it is poisoned; a lost device cannot be reset (ENODEV).
pub fn reset_device(node: u32) -> std::io::Result<()> {
    std::fs::write(sysfs_path(Path::new(uapi::sysfs::DIR), node, uapi::sysfs::RESET), "1")
}

/// N of a device node's name "rblnN" (digits only after the prefix).
pub fn node_of(name: &str) -> Option<u32> {
    name.strip_prefix("rbln").filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).and_then(|n| n.parse().ok())
}

/// N of every `rblnN` node in directory `dev`, ascending.
pub fn nodes_in(dev: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(dev)
        .map(|d| d.filter_map(|e| e.ok()).filter_map(|e| e.file_name().to_str().and_then(node_of)).collect())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// N of every `/dev/rblnN` node, ascending, whatever RBLN_VISIBLE_DEVICES
/// says (for administration tools).
pub fn present_nodes() -> Vec<u32> {
    nodes_in(Path::new("/dev"))
}

/// The devices of [`device_indices`] this process may open for reading and
/// writing (a container or a user is often given only some of them).
pub fn usable_device_indices() -> Vec<u32> {
    device_indices()
        .into_iter()
        .filter(|&i| {
            let Ok(n) = physical_index(i) else { return false };
            nix::unistd::access(format!("/dev/rbln{n}").as_str(), nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK).is_ok()
        })
        .collect()
}

impl Device {
    /// Open NPU `index` of this process: `/dev/rbln{index}`, or the
    /// index-th node RBLN_VISIBLE_DEVICES lists.
    pub fn open(index: u32) -> Result<Device> {
        Self::open_path(format!("/dev/rbln{}", physical_index(index)?))
    }

    /// Open an rbln device node by path.
    pub fn open_path(path: impl AsRef<Path>) -> Result<Device> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| Error::open(path.clone(), e))?;
        let mut raw = uapi::DeviceInfo::default();
        match sys::ioctl(&file, &mut raw) {
            Ok(()) => {}
            Err(nix::errno::Errno::ENOTTY | nix::errno::Errno::EINVAL) => {
                return Err(Error::NotAnNpu { path, op: Op::Info });
            }
            Err(e) => return Err(Error::from_errno(Op::Info, e)),
        }
        let info = DeviceInfo::from(raw);
        if info.uapi_version < uapi::UAPI_VERSION {
            return Err(Error::NotAnNpu { path, op: Op::Info });
        }
        Ok(Device { inner: Arc::new(DeviceInner { file, path, info, poisoned: AtomicBool::new(false) }) })
    }

    /// The device's counters and state now (RBLN_IOCTL_STATS): busy time
    /// of every core and DMA engine, traffic, faults, health, free DRAM.
    /// Utilisation is the growth of the busy times over the growth of
    /// `timestamp_ns` between two calls.
    pub fn stats(&self) -> Result<uapi::DeviceStats> {
        let mut s = uapi::DeviceStats::default();
        sys::ioctl(&self.inner.file, &mut s).map_err(|e| Error::from_errno(Op::Stats, e))?;
        Ok(s)
    }

    /// What the device is (queried once, at open).
    pub fn info(&self) -> DeviceInfo {
        self.inner.info
    }

    /// Ask the driver again (`RBLN_IOCTL_INFO`).
    pub fn query_info(&self) -> Result<DeviceInfo> {
        let mut raw = uapi::DeviceInfo::default();
        self.inner.ioctl(&mut raw)?;
        Ok(raw.into())
    }

    /// The device node this was opened from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether a fault or hang on one of this context's queues was seen;
    /// from then on every submission fails with [`Error::Poisoned`] and the
    /// device must be reopened.
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }
}

#[cfg(test)]
impl Device {
    /// A stand-in device for host tests: /dev/null, on which every ioctl
    /// fails (ENOTTY), so destructors are harmless.
    pub(crate) fn fake() -> Device {
        let file = File::open("/dev/null").expect("/dev/null");
        Device {
            inner: Arc::new(DeviceInner {
                file,
                path: "/dev/null".into(),
                info: DeviceInfo::default(),
                poisoned: AtomicBool::new(false),
            }),
        }
    }
}

#[cfg(test)]
mod visible_tests {
    use super::{node_of, parse_visible};

    #[test]
    fn node_names() {
        assert_eq!(node_of("rbln0"), Some(0));
        assert_eq!(node_of("rbln12"), Some(12));
        for bad in ["rbln", "rbln-1", "rbln1a", "nvidia0", "rbln+1", ""] {
            assert_eq!(node_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn visible_device_lists() {
        assert_eq!(parse_visible(""), Some(vec![]));
        assert_eq!(parse_visible("1"), Some(vec![1]));
        assert_eq!(parse_visible(" 2, 0 "), Some(vec![2, 0]));
        assert_eq!(parse_visible("0,0"), None, "duplicates");
        assert_eq!(parse_visible("a"), None);
        assert_eq!(parse_visible("1,"), None);
        assert_eq!(parse_visible("-1"), None);
    }
}
