//! The user-space ABI of `/dev/rbln*` (see docs/uapi.md): ioctl numbers
//! and argument structs, shared by the kernel driver (`kmd/`, through
//! `#[path]`) and the user-mode driver (`umd/`).
//!
//! Every struct is `#[repr(C)]`, built from fixed-width integers, with
//! explicit padding (`pad*`) and reserved fields that must be zero; sizes
//! and offsets are asserted at compile time.
//!
//! Growth: the ioctl number encodes the size of the caller's struct. The
//! driver copies `min(caller size, its size)` bytes and zero-fills the
//! rest, so old binaries keep working with new drivers; bytes a newer
//! caller passes beyond what the driver knows must be zero (else `E2BIG`).
//! New fields are only ever appended, and zero always means "old
//! behaviour".
#![no_std]
#![forbid(unsafe_code)]

/// ABI version reported by [`DeviceInfo::uapi_version`].
pub const UAPI_VERSION: u32 = 1;

/// ioctl "type" byte of the rbln driver.
pub const IOCTL_TYPE: u32 = b'R' as u32;

const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Linux `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32 & 0x3FFF) << 16) | (IOCTL_TYPE << 8) | nr
}

/// Linux `_IOWR(IOCTL_TYPE, nr, T)` for a struct of `size` bytes.
pub const fn iowr(nr: u32, size: usize) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, size)
}

/// Split an ioctl command into (type, nr, size).
pub const fn decode(cmd: u32) -> (u32, u32, usize) {
    ((cmd >> 8) & 0xFF, cmd & 0xFF, ((cmd >> 16) & 0x3FFF) as usize)
}

macro_rules! abi_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: $t,)* }
        // No implicit padding anywhere: every byte is a named field.
        const _: () = assert!(0 $(+ core::mem::size_of::<$t>())* == core::mem::size_of::<$name>());
        const _: () = assert!(core::mem::size_of::<$name>() % 8 == 0);
    };
}

abi_struct! {
    /// `RBLN_IOCTL_INFO` (out): what the device and driver are.
    pub struct DeviceInfo {
        pub uapi_version: u32,
        /// Driver version: major << 16 | minor << 8 | patch.
        pub driver_version: u32,
        pub vendor_id: u16,
        pub device_id: u16,
        /// Hardware version register (major << 16 | minor).
        pub hw_version: u32,
        pub dram_size: u64,
        pub num_queues: u32,
        pub num_cores: u32,
        pub num_dma_engines: u32,
        /// Capability bits of the hardware (CAPS register).
        pub caps: u32,
        /// Index N of /dev/rblnN.
        pub minor_index: u32,
        pub pad: u32,
        pub reserved: [u64; 4],
    }
}

/// BO placement (exactly one).
pub const BO_DRAM: u32 = 1 << 0;
pub const BO_HOST: u32 = 1 << 1;
pub const BO_PLACEMENTS: u32 = BO_DRAM | BO_HOST;

abi_struct! {
    /// `RBLN_IOCTL_BO_CREATE`: allocate a buffer object of `size` bytes
    /// (rounded up to 4 KiB) in device DRAM or host memory.
    pub struct BoCreate {
        /// In: size in bytes (1 ..= 1 GiB).
        pub size: u64,
        /// In: exactly one of BO_DRAM, BO_HOST.
        pub flags: u32,
        /// Out: handle (never 0).
        pub handle: u32,
        pub reserved: [u64; 2],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_BO_INFO`: describe a BO of the caller.
    pub struct BoInfo {
        /// In.
        pub handle: u32,
        /// Out: the placement flag.
        pub flags: u32,
        /// Out: size in bytes (page aligned).
        pub size: u64,
        /// Out: offset to pass to mmap(2) on this file to map the BO.
        pub mmap_offset: u64,
        /// Out: device VA of the BO's oldest remaining mapping, or 0.
        pub device_va: u64,
        pub reserved: [u64; 2],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_BO_DESTROY`: free the BO. Refused (EBUSY) while it is
    /// mapped in the device VA space; CPU mmaps of a host BO keep its pages
    /// alive until they are unmapped.
    pub struct BoDestroy {
        pub handle: u32,
        pub pad: u32,
        pub reserved: [u64; 1],
    }
}

/// VM_MAP permissions.
pub const VM_READ: u32 = 1 << 0;
pub const VM_WRITE: u32 = 1 << 1;

abi_struct! {
    /// `RBLN_IOCTL_VM_MAP`: map [offset, offset+size) of a BO into the
    /// caller's device VA space.
    pub struct VmMap {
        pub handle: u32,
        /// VM_READ and/or VM_WRITE (at least one).
        pub flags: u32,
        /// In: page-aligned VA, or 0 to let the driver choose. Out: the VA.
        pub va: u64,
        /// Page-aligned offset into the BO.
        pub offset: u64,
        /// Page-aligned size; 0 maps to the BO's end.
        pub size: u64,
        pub reserved: [u64; 2],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_VM_UNMAP`: remove the mapping that starts at `va`.
    pub struct VmUnmap {
        pub va: u64,
        pub reserved: [u64; 1],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_QUEUE_CREATE`: bind a free hardware queue to the
    /// caller's context.
    pub struct QueueCreate {
        /// In: ring size in entries (power of two, 4 ..= 128, one page);
        /// 0 = 128. Each SUBMIT uses two entries.
        pub ring_entries: u32,
        /// In: reserved flags, must be 0.
        pub flags: u32,
        /// Out: queue id (for SUBMIT, FENCE_WAIT, QUEUE_DESTROY).
        pub queue_id: u32,
        /// Out: hardware queue index (the doorbell page number).
        pub hw_queue: u32,
        /// Out: mmap offset of the ring (read-write, one page). Mapping the
        /// ring or the doorbell makes the queue user-mode: SUBMIT then fails
        /// with EBUSY and user space owns the tail.
        pub ring_mmap_offset: u64,
        /// Out: mmap offset of the queue's status block page (read-only).
        pub status_mmap_offset: u64,
        /// Out: mmap offset of this queue's doorbell page (write-only use:
        /// a 32-bit store of the new tail at offset 0).
        pub doorbell_mmap_offset: u64,
        pub reserved: [u64; 2],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_QUEUE_DESTROY`.
    pub struct QueueDestroy {
        pub queue_id: u32,
        pub pad: u32,
        pub reserved: [u64; 1],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_SUBMIT`: the driver puts the command buffer on the
    /// queue's ring followed by a fence of its own and returns the fence
    /// value to wait for.
    pub struct Submit {
        pub queue_id: u32,
        /// Reserved flags, must be 0.
        pub flags: u32,
        /// Device VA of the command buffer (4-byte aligned).
        pub cmdbuf_va: u64,
        /// Size in bytes (multiple of 4, 4 ..= 16 MiB).
        pub cmdbuf_size: u32,
        pub pad: u32,
        /// Out: fence value signalled when the command buffer completed.
        pub fence: u64,
        pub reserved: [u64; 2],
    }
}

abi_struct! {
    /// `RBLN_IOCTL_FENCE_WAIT`: sleep until the queue's fence reaches
    /// `value`. Errors: ETIMEDOUT, EIO (the queue or its context faulted or
    /// hung), EINTR (signal; not restarted), ENODEV (device unbound).
    pub struct FenceWait {
        pub queue_id: u32,
        /// Reserved flags, must be 0.
        pub flags: u32,
        pub value: u64,
        /// Relative timeout in nanoseconds; 0 polls.
        pub timeout_ns: u64,
        pub reserved: [u64; 1],
    }
}

macro_rules! ioctls {
    ($($name:ident = $nr:expr, $t:ty;)*) => {
        $(pub const $name: u32 = iowr($nr, core::mem::size_of::<$t>());)*
        /// Every ioctl with its name, for diagnostics and tests.
        pub const ALL: &[(u32, &str)] = &[$(($name, stringify!($name))),*];
    };
}

/// `DeviceStats::health`.
pub const HEALTH_OK: u32 = 0;
/// At least one queue faulted and was not yet destroyed (nor the device
/// reset).
pub const HEALTH_FAULTED: u32 = 1;
/// The device stopped answering (surprise removal: its registers read all
/// ones). Final until the driver is rebound.
pub const HEALTH_LOST: u32 = 2;
/// At least one queue hung (made no progress for the driver's `hang_ms`)
/// and was not yet destroyed (nor the device reset).
pub const HEALTH_HUNG: u32 = 3;

/// The attributes of /dev/rblnN in sysfs, files in `sysfs::dir(N)`
/// (docs/uapi.md, "sysfs"): one value per file, text, newline-terminated.
pub mod sysfs {
    use core::ffi::CStr;
    /// The class directory: the attributes of /dev/rblnN are in
    /// `DIR/rblnN/`.
    pub const DIR: &str = "/sys/class/misc";
    /// "MAJOR.MINOR" of the hardware.
    pub const HW_VERSION: &CStr = c"hw_version";
    /// "MAJOR.MINOR.PATCH" of the driver.
    pub const DRIVER_VERSION: &CStr = c"driver_version";
    /// Device DRAM, bytes.
    pub const DRAM_TOTAL_BYTES: &CStr = c"dram_total_bytes";
    /// Device DRAM allocated to buffers, bytes.
    pub const DRAM_USED_BYTES: &CStr = c"dram_used_bytes";
    /// Percent (0..=100) of the compute cores' time busy since the
    /// previous sample (samples at least 100 ms apart).
    pub const UTILIZATION: &CStr = c"utilization";
    /// `health_name` of the device's health.
    pub const HEALTH: &CStr = c"health";
    /// Privileged resets since the driver bound the device.
    pub const RESET_COUNT: &CStr = c"reset_count";
    /// Error records the device raised since its last reset.
    pub const FAULTS: &CStr = c"faults";
    /// Write-only, root: "1" resets the device (`Npu::reset`).
    pub const RESET: &CStr = c"reset";
    /// The PCI function's address, "DDDD:BB:DD.F" (its directory in
    /// /sys/bus/pci/devices: NUMA node, unbind).
    pub const PCI_ADDRESS: &CStr = c"pci_address";
}

/// The name of a `DeviceStats::health` value, as sysfs `health`, rbln-smi
/// and the exporters spell it.
pub const fn health_name(health: u32) -> &'static str {
    match health {
        HEALTH_OK => "ok",
        HEALTH_FAULTED => "faulted",
        HEALTH_LOST => "lost",
        HEALTH_HUNG => "hung",
        _ => "unknown",
    }
}

abi_struct! {
    /// `RBLN_IOCTL_STATS` (out): the device's counters and state, read at
    /// one moment, for monitoring (rbln-smi, exporters). Busy times grow
    /// while a core or DMA engine works; utilisation is their growth over
    /// the growth of `timestamp_ns` between two reads.
    pub struct DeviceStats {
        /// When the counters were read: ns since the driver bound the
        /// device (a monotonic clock; compare two reads of one device).
        pub timestamp_ns: u64,
        /// HEALTH_OK, HEALTH_FAULTED, HEALTH_HUNG or HEALTH_LOST.
        pub health: u32,
        /// Device contexts open (files), without the driver's own.
        pub contexts: u32,
        /// Hardware queues in use, without the driver's own.
        pub queues: u32,
        /// Queues faulted or hung and not yet destroyed.
        pub faulted_queues: u32,
        /// Device DRAM not allocated to any buffer.
        pub dram_free: u64,
        /// Counters of the hardware (docs/hardware.md 4.3), since its last
        /// reset: packets, DMA bytes, compute descriptors, nominal FLOPs,
        /// error records.
        pub packets: u64,
        pub dma_bytes: u64,
        pub compute_ops: u64,
        pub compute_flops: u64,
        pub faults: u64,
        /// Busy ns of compute core c (cores >= num_cores read 0).
        pub core_busy_ns: [u64; 8],
        /// Busy ns of DMA engine e (engines >= num_dma_engines read 0).
        pub dma_busy_ns: [u64; 4],
        /// Privileged resets (sysfs `reset`) since the driver bound it.
        pub resets: u64,
        pub reserved: [u64; 3],
    }
}

ioctls! {
    RBLN_IOCTL_INFO = 0x00, DeviceInfo;
    RBLN_IOCTL_BO_CREATE = 0x01, BoCreate;
    RBLN_IOCTL_BO_INFO = 0x02, BoInfo;
    RBLN_IOCTL_BO_DESTROY = 0x03, BoDestroy;
    RBLN_IOCTL_VM_MAP = 0x04, VmMap;
    RBLN_IOCTL_VM_UNMAP = 0x05, VmUnmap;
    RBLN_IOCTL_QUEUE_CREATE = 0x06, QueueCreate;
    RBLN_IOCTL_QUEUE_DESTROY = 0x07, QueueDestroy;
    RBLN_IOCTL_SUBMIT = 0x08, Submit;
    RBLN_IOCTL_FENCE_WAIT = 0x09, FenceWait;
    RBLN_IOCTL_STATS = 0x0a, DeviceStats;
}

const _: () = assert!(core::mem::size_of::<DeviceInfo>() == 80);
const _: () = assert!(core::mem::size_of::<BoCreate>() == 32);
const _: () = assert!(core::mem::size_of::<BoInfo>() == 48);
const _: () = assert!(core::mem::size_of::<BoDestroy>() == 16);
const _: () = assert!(core::mem::size_of::<VmMap>() == 48);
const _: () = assert!(core::mem::size_of::<VmUnmap>() == 16);
const _: () = assert!(core::mem::size_of::<QueueCreate>() == 56);
const _: () = assert!(core::mem::size_of::<QueueDestroy>() == 16);
const _: () = assert!(core::mem::size_of::<Submit>() == 48);
const _: () = assert!(core::mem::size_of::<FenceWait>() == 32);
const _: () = assert!(core::mem::size_of::<DeviceStats>() == 200);
const _: () = assert!(core::mem::offset_of!(DeviceStats, core_busy_ns) == 72);
const _: () = assert!(core::mem::offset_of!(Submit, fence) == 24);
const _: () = assert!(core::mem::offset_of!(QueueCreate, ring_mmap_offset) == 16);

/// mmap offsets: kind in bits 63..56, object id in bits 55..30, so that
/// every object owns a 1 GiB window of file offsets and an offset inside an
/// object can never name another one. Mappings start at an object's first
/// byte (the window's remaining bits must be zero).
pub const MMAP_KIND_SHIFT: u32 = 56;
const MMAP_ID_SHIFT: u32 = 30;
pub const MMAP_KIND_BO: u64 = 1;
pub const MMAP_KIND_RING: u64 = 2;
pub const MMAP_KIND_STATUS: u64 = 3;
pub const MMAP_KIND_DOORBELL: u64 = 4;

/// The mmap offset of object `id` (< 2^26) of `kind`.
pub const fn mmap_offset(kind: u64, id: u32) -> u64 {
    (kind << MMAP_KIND_SHIFT) | (((id as u64) & ((1 << 26) - 1)) << MMAP_ID_SHIFT)
}

/// Split an mmap offset into (kind, id); None unless it names the start of
/// an object.
pub const fn mmap_decode(off: u64) -> Option<(u64, u32)> {
    if off & ((1 << MMAP_ID_SHIFT) - 1) != 0 {
        return None;
    }
    let id = (off & ((1 << MMAP_KIND_SHIFT) - 1)) >> MMAP_ID_SHIFT;
    Some((off >> MMAP_KIND_SHIFT, id as u32))
}

/// Smallest argument size each ioctl accepts (the size of its first
/// version); index by ioctl number.
pub const MIN_ARG_SIZE: [usize; 11] = [80, 32, 48, 16, 48, 16, 56, 16, 48, 32, 200];

/// Largest BO.
pub const MAX_BO_SIZE: u64 = 1 << 30;
/// Device VAs the driver hands out start here (below: reserved, so that a
/// null VA is never valid); the top 1 GiB of the 39-bit space is the
/// driver's own (fence command buffers).
pub const VA_USER_START: u64 = 1 << 21;
pub const VA_USER_END: u64 = (1 << 39) - (1 << 30);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_linux_encoding() {
        assert_eq!(RBLN_IOCTL_INFO as u64, nix::request_code_readwrite!(b'R', 0x00, core::mem::size_of::<DeviceInfo>()) as u64);
        assert_eq!(RBLN_IOCTL_SUBMIT as u64, nix::request_code_readwrite!(b'R', 0x08, core::mem::size_of::<Submit>()) as u64);
        assert_eq!(decode(RBLN_IOCTL_FENCE_WAIT), (IOCTL_TYPE, 0x09, 32));
    }

    #[test]
    fn mmap_offsets_round_trip() {
        let off = mmap_offset(MMAP_KIND_DOORBELL, 17);
        assert_eq!(mmap_decode(off), Some((MMAP_KIND_DOORBELL, 17)));
        assert_eq!(mmap_decode(off + 1), None);
        assert_eq!(mmap_decode(off + 4096), None, "an offset inside one object names no other");
    }

    #[test]
    fn minimum_sizes_are_the_v1_sizes() {
        let sizes = [
            core::mem::size_of::<DeviceInfo>(),
            core::mem::size_of::<BoCreate>(),
            core::mem::size_of::<BoInfo>(),
            core::mem::size_of::<BoDestroy>(),
            core::mem::size_of::<VmMap>(),
            core::mem::size_of::<VmUnmap>(),
            core::mem::size_of::<QueueCreate>(),
            core::mem::size_of::<QueueDestroy>(),
            core::mem::size_of::<Submit>(),
            core::mem::size_of::<FenceWait>(),
            core::mem::size_of::<DeviceStats>(),
        ];
        assert_eq!(MIN_ARG_SIZE, sizes);
    }
}
