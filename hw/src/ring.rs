//! Queue rings, the queue status block and error records.

wire_struct! {
    /// One ring entry: a command buffer to execute. 32 bytes.
    pub struct RingEntry {
        /// Device virtual address of the command buffer (4-byte aligned).
        pub cmdbuf_va: u64,
        /// Size of the command buffer in bytes (a multiple of 4, at most
        /// [`MAX_CMDBUF_SIZE`]).
        pub cmdbuf_size: u32,
        /// Reserved, must be 0.
        pub flags: u32,
        /// Opaque to the device (drivers use it to find the job).
        pub tag: u64,
        /// Reserved, must be 0.
        pub reserved: u64,
    }
}

/// Largest command buffer a ring entry or INDIRECT packet may name.
pub const MAX_CMDBUF_SIZE: u32 = 16 << 20;
/// Smallest and largest ring sizes (entries, powers of two).
pub const MIN_RING_ENTRIES: u32 = 2;
pub const MAX_RING_ENTRIES: u32 = 65536;

wire_struct! {
    /// The queue status block the device writes to host memory at
    /// `Q_STATUS_ADDR` whenever the mirrored registers change: after each
    /// ring entry and FENCE packet, on entering and leaving Waiting, on a
    /// fault, on enable/disable and on a queue reset (not on a device
    /// reset), so that drivers can poll without touching registers. 64 bytes.
    pub struct QueueStatus {
        /// Mirror of Q_HEAD.
        pub head: u32,
        /// Mirror of Q_STATE ([`QueueState`]).
        pub state: u32,
        /// Mirror of Q_FENCE.
        pub fence: u64,
        /// Mirror of Q_FAULT_CODE.
        pub fault_code: u32,
        /// Mirror of Q_FAULT_RING_INDEX.
        pub fault_ring_index: u32,
        /// Mirror of Q_FAULT_ADDR.
        pub fault_addr: u64,
        /// Mirror of Q_PACKETS.
        pub packets: u64,
        pub reserved: [u64; 3],
    }
}

const _: () = assert!(RingEntry::SIZE == 32);
const _: () = assert!(QueueStatus::SIZE == 64);
const _: () = assert!(core::mem::offset_of!(QueueStatus, fence) == 8);
const _: () = assert!(core::mem::offset_of!(RingEntry, tag) == 16);

/// Value of Q_STATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum QueueState {
    /// Not enabled.
    Disabled = 0,
    /// Enabled, head == tail.
    Idle = 1,
    /// Executing a command buffer.
    Running = 2,
    /// Blocked in a SEM_WAIT packet.
    Waiting = 3,
    /// Stopped by a fault; the error record is valid. Only a queue reset
    /// (or a device reset) leaves this state.
    Faulted = 4,
}

impl QueueState {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Disabled,
            1 => Self::Idle,
            2 => Self::Running,
            3 => Self::Waiting,
            4 => Self::Faulted,
            _ => return None,
        })
    }
}

/// Fault code of an error record (Q_FAULT_CODE bits 7..0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FaultCode {
    None = 0,
    /// A VA has no valid translation in the queue's context, or lies at or
    /// beyond [`super::mmu::VA_LIMIT`].
    Unmapped = 1,
    /// A write to a page without write permission (or read without read).
    Permission = 2,
    /// A page-table entry has reserved bits set.
    BadPte = 3,
    /// Unknown opcode, wrong packet size, unknown flags, a misaligned or
    /// out-of-range field, non-zero reserved bits, or a packet running past
    /// the end of its command buffer.
    BadPacket = 4,
    /// A compute descriptor is malformed (unknown op, inconsistent shapes).
    BadDescriptor = 5,
    /// A ring entry is malformed (alignment, size, reserved bits).
    BadRingEntry = 6,
    /// A translated address is outside guest memory shared with the
    /// device or outside device DRAM.
    BusError = 7,
    /// A doorbell wrote a tail >= ring size.
    BadDoorbell = 8,
    /// INDIRECT packets nested deeper than [`super::cmd::MAX_INDIRECT_DEPTH`].
    Nesting = 9,
    /// The queue was enabled with an invalid ring configuration.
    BadQueueConfig = 10,
    /// The queue's context is not valid.
    ContextInvalid = 11,
    /// A compute descriptor's tensor address is misaligned (tensors are
    /// 4-byte aligned; i64 gather indices 8-byte aligned).
    Alignment = 12,
    /// A run-time index (GATHER) is outside its axis; the fault address is
    /// that of the offending index (hardware minor version 2).
    IndexOutOfRange = 13,
    /// A tile program's load or store of an active lane outside its
    /// buffer; the fault address is the VA it would have touched
    /// (hardware minor version 8).
    OutOfBounds = 14,
    /// A DMA engine's transfer failed in the data path (a completion
    /// timeout or poisoned data on the link or in memory); the transfer
    /// wrote nothing (hardware minor version 9).
    TransferError = 15,
}

impl FaultCode {
    pub fn from_u8(v: u8) -> Option<Self> {
        use FaultCode::*;
        Some(match v {
            0 => None,
            1 => Unmapped,
            2 => Permission,
            3 => BadPte,
            4 => BadPacket,
            5 => BadDescriptor,
            6 => BadRingEntry,
            7 => BusError,
            8 => BadDoorbell,
            9 => Nesting,
            10 => BadQueueConfig,
            11 => ContextInvalid,
            12 => Alignment,
            13 => IndexOutOfRange,
            14 => OutOfBounds,
            15 => TransferError,
            _ => return Option::None,
        })
    }

    pub fn name(self) -> &'static str {
        use FaultCode::*;
        match self {
            None => "none",
            Unmapped => "unmapped address",
            Permission => "permission denied",
            BadPte => "bad page-table entry",
            BadPacket => "malformed command packet",
            BadDescriptor => "malformed compute descriptor",
            BadRingEntry => "malformed ring entry",
            BusError => "bus error",
            BadDoorbell => "bad doorbell value",
            Nesting => "indirect nesting too deep",
            BadQueueConfig => "bad queue configuration",
            ContextInvalid => "invalid context",
            Alignment => "misaligned address",
            IndexOutOfRange => "index out of range",
            OutOfBounds => "tile access outside its buffer",
            TransferError => "DMA transfer error",
        }
    }
}

/// Kind of access that faulted (Q_FAULT_CODE bits 15..8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Access {
    None = 0,
    Read = 1,
    Write = 2,
}

/// Pack an error record's Q_FAULT_CODE value.
pub const fn fault_code_reg(code: FaultCode, access: Access, depth: u8) -> u32 {
    code as u32 | (access as u32) << 8 | (depth as u32) << 16
}
