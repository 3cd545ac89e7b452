//! Errors: what went wrong, and what to do about it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use rbln_hw::ring::FaultCode;

/// The kernel call (or mapping) an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Open,
    Info,
    BoCreate,
    BoInfo,
    BoDestroy,
    VmMap,
    VmUnmap,
    QueueCreate,
    QueueDestroy,
    Submit,
    /// User-mode submission (ring write + doorbell, no system call).
    UserSubmit,
    FenceWait,
    Stats,
    MmapBo,
    MmapRing,
    MmapStatus,
    MmapDoorbell,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
            Op::Info => "RBLN_IOCTL_INFO",
            Op::BoCreate => "RBLN_IOCTL_BO_CREATE",
            Op::BoInfo => "RBLN_IOCTL_BO_INFO",
            Op::BoDestroy => "RBLN_IOCTL_BO_DESTROY",
            Op::VmMap => "RBLN_IOCTL_VM_MAP",
            Op::VmUnmap => "RBLN_IOCTL_VM_UNMAP",
            Op::QueueCreate => "RBLN_IOCTL_QUEUE_CREATE",
            Op::QueueDestroy => "RBLN_IOCTL_QUEUE_DESTROY",
            Op::Submit => "RBLN_IOCTL_SUBMIT",
            Op::UserSubmit => "user-mode submission",
            Op::FenceWait => "RBLN_IOCTL_FENCE_WAIT",
            Op::Stats => "RBLN_IOCTL_STATS",
            Op::MmapBo => "mmap of a host buffer",
            Op::MmapRing => "mmap of a queue's ring",
            Op::MmapStatus => "mmap of a queue's status block",
            Op::MmapDoorbell => "mmap of a queue's doorbell",
        })
    }
}

/// A queue's error record as the device reported it (when the UMD saw it
/// before the kernel reset the queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInfo {
    /// Fault code ([`FaultCode`]), or `None` for a code this library does
    /// not know.
    pub code: Option<FaultCode>,
    /// Raw Q_FAULT_CODE value: code, access (bits 15..8), depth (23..16).
    pub raw: u32,
    /// Faulting device VA (or packet address for packet/descriptor errors).
    pub addr: u64,
    /// Ring index of the entry that faulted.
    pub ring_index: u32,
}

impl FaultInfo {
    pub(crate) fn from_status(s: &rbln_hw::ring::QueueStatus) -> Option<Self> {
        (s.fault_code & 0xff != 0).then(|| FaultInfo {
            code: FaultCode::from_u8(s.fault_code as u8),
            raw: s.fault_code,
            addr: s.fault_addr,
            ring_index: s.fault_ring_index,
        })
    }

    /// "read", "write" or "-".
    pub fn access(&self) -> &'static str {
        match (self.raw >> 8) & 0xff {
            1 => "read",
            2 => "write",
            _ => "-",
        }
    }

    /// Whether the fault is a memory (MMU) fault rather than a malformed
    /// command.
    pub fn is_memory_fault(&self) -> bool {
        matches!(self.code, Some(FaultCode::Unmapped | FaultCode::Permission | FaultCode::BadPte | FaultCode::BusError))
    }
}

impl fmt::Display for FaultInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.code.map_or("unknown fault", |c| c.name());
        let kind = if self.is_memory_fault() { "a memory fault" } else { "a fault" };
        write!(f, "the device reported {kind}: {name}")?;
        match self.access() {
            "-" => write!(f, " at {:#x}", self.addr),
            a => write!(f, " ({a} at {:#x})", self.addr),
        }
    }
}

fn fault_text(f: &Option<FaultInfo>) -> String {
    match f {
        Some(f) => f.to_string(),
        None => "the device stopped the queue after a fault or a hang (the error record is in the kernel log: dmesg)".into(),
    }
}

/// Everything that can go wrong. Messages say what happened and what to
/// do; [`Error::errno`] gives the kernel's errno where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("no {}: is rbln.ko loaded? (insmod kmd/rbln.ko; `ls /dev/rbln*` lists the NPUs)", path.display())]
    NoDevice { path: PathBuf },
    /// RBLN_VISIBLE_DEVICES hides the device asked for (or cannot be read).
    #[error("NPU {index} is not visible to this process: RBLN_VISIBLE_DEVICES={visible:?} {why}")]
    NotVisible { index: u32, visible: String, why: &'static str },

    #[error("cannot open {}: permission denied; run as root or give your user read-write access to the device node", path.display())]
    PermissionDenied { path: PathBuf },

    #[error("cannot open {}: every device context is in use (EBUSY): close another program using the NPU and retry", path.display())]
    NoContext { path: PathBuf },

    #[error("{} is not an rbln NPU, or its driver is too old for this library: {op} is unknown to it (ENOTTY)", path.display())]
    NotAnNpu { path: PathBuf, op: Op },

    #[error("cannot open {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{op}: device lost (ENODEV): the NPU stopped answering (removed, or its driver unbound); reopen it once it is back")]
    DeviceGone { op: Op },

    #[error("{op}: invalid argument (EINVAL): {hint}")]
    InvalidArgument { op: Op, hint: &'static str },

    #[error("{op}: {hint} (ENOENT)")]
    NotFound { op: Op, hint: &'static str },

    #[error("{op}: {hint} (EBUSY)")]
    Busy { op: Op, hint: &'static str },

    #[error("{op}: {hint} (ENOSPC)")]
    NoSpace { op: Op, hint: &'static str },

    #[error("{op}: out of host memory (ENOMEM): free buffers or queues and retry")]
    OutOfMemory { op: Op },

    #[error("queue {queue} faulted: {}; the context is poisoned, reopen the device", fault_text(fault))]
    Faulted { queue: u32, fault: Option<FaultInfo> },

    #[error("{op} refused: an earlier fault or hang poisoned this device context (EIO); reopen the device")]
    Poisoned { op: Op },

    #[error("fence {value} of queue {queue} did not signal within {timeout:?} (ETIMEDOUT): the job is still running or blocked (e.g. in a semaphore wait); wait longer or release what it waits for")]
    Timeout { queue: u32, value: u64, timeout: Duration },

    #[error("{op}: interrupted by a signal (EINTR); retry the call")]
    Interrupted { op: Op },

    #[error("{op} failed: {errno} ({})", errno.desc())]
    Os { op: Op, errno: Errno },

    #[error("{what}: bytes {offset}..{} lie outside the buffer of {size} bytes", *offset as u128 + *len as u128)]
    OutOfBounds { what: &'static str, offset: u64, len: u64, size: u64 },

    #[error("{what} must be {align}-byte aligned, got {value:#x}")]
    Misaligned { what: &'static str, value: u64, align: u64 },

    #[error("the buffer lives in device DRAM and has no CPU mapping: move its data through a host buffer with a DMA copy")]
    NotHostVisible,

    #[error("buffer {handle} is not mapped into the device VA space: call Buffer::map first")]
    NotMapped { handle: u32 },

    #[error("buffer {handle} is mapped without {needed} permission, which {what} needs: map it with Perms::{needed}")]
    PermissionMissing { handle: u32, what: &'static str, needed: &'static str },

    #[error("buffer {handle} belongs to another open device: buffers, command buffers and queues must come from the same Device")]
    ForeignDevice { handle: u32 },

    #[error("the command buffer is empty: add at least one command before submitting")]
    EmptyCommandBuffer,

    #[error("command buffer overflow: {what} needs {need} bytes but has room for {capacity}; create it with CommandBuffer::with_capacity")]
    CommandBufferFull { what: &'static str, need: u64, capacity: u64 },

    #[error("the command buffer was changed while its last submission (fence {fence} of queue {queue}) is still executing: wait for that fence first, or build into another command buffer")]
    CommandBufferBusy { queue: u32, fence: u64 },

    #[error("invalid argument: {0}")]
    InvalidInput(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The errno behind this error, when the kernel reported one.
    pub fn errno(&self) -> Option<Errno> {
        use Error::*;
        Some(match self {
            NoDevice { .. } | NotVisible { .. } => Errno::ENOENT,
            PermissionDenied { .. } => Errno::EACCES,
            NoContext { .. } => Errno::EBUSY,
            NotAnNpu { .. } => Errno::ENOTTY,
            Open { source, .. } => Errno::from_raw(source.raw_os_error()?),
            DeviceGone { .. } => Errno::ENODEV,
            InvalidArgument { .. } => Errno::EINVAL,
            NotFound { .. } => Errno::ENOENT,
            Busy { .. } => Errno::EBUSY,
            NoSpace { .. } => Errno::ENOSPC,
            OutOfMemory { .. } => Errno::ENOMEM,
            Faulted { .. } | Poisoned { .. } => Errno::EIO,
            Timeout { .. } => Errno::ETIMEDOUT,
            Interrupted { .. } => Errno::EINTR,
            Os { errno, .. } => *errno,
            _ => return None,
        })
    }

    /// Map the errno of `op` to an error, following each ioctl's contract
    /// (docs/uapi.md, kmd/ctx.rs). Fence waits (ETIMEDOUT, EIO) and open
    /// are mapped where their context is known.
    pub(crate) fn from_errno(op: Op, e: Errno) -> Error {
        use Errno::*;
        use Op::*;
        const NO_BO: &str = "no such buffer in this device context (destroyed, or created through another open file)";
        const NO_QUEUE: &str = "no such queue in this device context (it was destroyed)";
        match (op, e) {
            (_, ENODEV | ENXIO) => Error::DeviceGone { op },
            (_, EINTR) => Error::Interrupted { op },
            (_, ENOMEM) => Error::OutOfMemory { op },
            (BoCreate, EINVAL) => Error::InvalidArgument {
                op,
                hint: "the size must be 1 byte ..= 1 GiB and the placement exactly one of Host and Dram",
            },
            (BoCreate, ENOSPC) => Error::NoSpace {
                op,
                hint: "not enough free device DRAM for this buffer: free DRAM buffers or use a host buffer",
            },
            (BoInfo | BoDestroy | VmMap | MmapBo, ENOENT) => Error::NotFound { op, hint: NO_BO },
            (BoDestroy, EBUSY) => Error::Busy { op, hint: "the buffer is still mapped into the device VA space: unmap it first" },
            (VmMap, EINVAL) => Error::InvalidArgument {
                op,
                hint: "offset, size and VA must be page aligned and inside the buffer and the user VA range, with READ and/or WRITE permission",
            },
            (VmMap, EBUSY) => Error::Busy { op, hint: "the requested device VA range overlaps an existing mapping" },
            (VmMap, ENOSPC) => Error::NoSpace {
                op,
                hint: "the device VA space has no free range this large: unmap buffers you no longer use",
            },
            (VmUnmap, ENOENT) => Error::NotFound { op, hint: "no mapping starts at this device VA" },
            (QueueCreate, EINVAL) => Error::InvalidArgument { op, hint: "the ring size must be a power of two in 4..=128 entries" },
            (QueueCreate, EBUSY) => Error::Busy {
                op,
                hint: "every hardware queue is in use: destroy a queue (or wait for other programs to) and retry",
            },
            (QueueDestroy | Submit | FenceWait | MmapRing | MmapStatus | MmapDoorbell, ENOENT) => {
                Error::NotFound { op, hint: NO_QUEUE }
            }
            (Submit, EINVAL) => Error::InvalidArgument {
                op,
                hint: "the command buffer must be 4-byte aligned and 4 bytes ..= 16 MiB long",
            },
            (Submit, EBUSY) => Error::Busy {
                op,
                hint: "the queue's ring is full (too many submissions in flight) or the queue is in user mode: wait for an earlier fence and retry",
            },
            (Submit, EIO) => Error::Poisoned { op },
            (FenceWait, EINVAL) => Error::InvalidArgument { op, hint: "this fence value was never submitted on this queue" },
            (MmapStatus, EACCES) => Error::InvalidArgument { op, hint: "the status block can only be mapped read-only" },
            (MmapDoorbell, EINVAL) => Error::InvalidArgument { op, hint: "the doorbell mapping must be exactly one page" },
            (_, E2BIG) => Error::InvalidArgument {
                op,
                hint: "the driver is older than this library and does not know a field it was given (E2BIG)",
            },
            _ => Error::Os { op, errno: e },
        }
    }

    /// Map the errno of opening `path`.
    pub(crate) fn open(path: PathBuf, source: std::io::Error) -> Error {
        match source.raw_os_error().map(Errno::from_raw) {
            Some(Errno::ENOENT | Errno::ENXIO | Errno::ENODEV) => Error::NoDevice { path },
            Some(Errno::EACCES | Errno::EPERM) => Error::PermissionDenied { path },
            Some(Errno::EBUSY) => Error::NoContext { path },
            _ => Error::Open { path, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Errno::*;

    #[test]
    fn errnos_map_per_ioctl() {
        let e = |op, errno| Error::from_errno(op, errno);
        assert!(matches!(e(Op::BoCreate, ENOSPC), Error::NoSpace { .. }));
        assert!(matches!(e(Op::VmMap, ENOSPC), Error::NoSpace { .. }));
        assert!(matches!(e(Op::BoDestroy, EBUSY), Error::Busy { .. }));
        assert!(matches!(e(Op::QueueCreate, EBUSY), Error::Busy { .. }));
        assert!(matches!(e(Op::Submit, EIO), Error::Poisoned { .. }));
        assert!(matches!(e(Op::Submit, ENOENT), Error::NotFound { .. }));
        assert!(matches!(e(Op::FenceWait, EINTR), Error::Interrupted { .. }));
        assert!(matches!(e(Op::VmMap, ENODEV), Error::DeviceGone { .. }));
        assert!(matches!(e(Op::Info, EFAULT), Error::Os { errno: EFAULT, .. }));
        assert_eq!(e(Op::BoDestroy, EBUSY).errno(), Some(EBUSY));
        assert_eq!(e(Op::Submit, EIO).errno(), Some(EIO));
        // Messages say what went wrong and what to do.
        let m = e(Op::QueueCreate, EBUSY).to_string();
        assert_eq!(m, "RBLN_IOCTL_QUEUE_CREATE: every hardware queue is in use: destroy a queue (or wait for other programs to) and retry (EBUSY)");
        let m = e(Op::BoDestroy, EBUSY).to_string();
        assert!(m.contains("unmap it first"), "{m}");
        let m = e(Op::Submit, EIO).to_string();
        assert!(m.contains("reopen the device"), "{m}");
        let m = e(Op::BoCreate, ENOSPC).to_string();
        assert!(m.contains("not enough free device DRAM"), "{m}");
    }

    #[test]
    fn open_errors_say_what_to_do() {
        let io = |e: Errno| std::io::Error::from_raw_os_error(e as i32);
        let m = Error::open("/dev/rbln0".into(), io(ENOENT)).to_string();
        assert_eq!(m, "no /dev/rbln0: is rbln.ko loaded? (insmod kmd/rbln.ko; `ls /dev/rbln*` lists the NPUs)");
        assert!(matches!(Error::open("/dev/rbln0".into(), io(EACCES)), Error::PermissionDenied { .. }));
        assert!(matches!(Error::open("/dev/rbln0".into(), io(EBUSY)), Error::NoContext { .. }));
        assert!(matches!(Error::open("/dev/rbln0".into(), io(EIO)), Error::Open { .. }));
    }

    #[test]
    fn fault_messages_name_the_fault() {
        let f = FaultInfo {
            code: Some(FaultCode::Unmapped),
            raw: rbln_hw::ring::fault_code_reg(FaultCode::Unmapped, rbln_hw::ring::Access::Write, 0),
            addr: 0x7000_0000,
            ring_index: 4,
        };
        let m = Error::Faulted { queue: 3, fault: Some(f) }.to_string();
        assert_eq!(
            m,
            "queue 3 faulted: the device reported a memory fault: unmapped address (write at 0x70000000); the context is poisoned, reopen the device"
        );
        let m = Error::Faulted { queue: 3, fault: None }.to_string();
        assert!(m.starts_with("queue 3 faulted: the device stopped the queue"), "{m}");
        assert!(m.ends_with("the context is poisoned, reopen the device"), "{m}");
        let m = Error::Timeout { queue: 2, value: 9, timeout: Duration::from_millis(50) }.to_string();
        assert!(m.starts_with("fence 9 of queue 2 did not signal within 50ms"), "{m}");
    }
}
