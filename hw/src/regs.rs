//! BAR0 register map. Offsets are bytes from the start of BAR0.
//!
//! 32-bit registers take 4-byte accesses. 64-bit registers (suffix `_64`)
//! take one 8-byte access or two 4-byte accesses (low half first). An
//! 8-byte read returns one snapshot; an 8-byte write is performed as two
//! 32-bit writes, low half first. Reads of undefined offsets
//! return 0; writes to them and to read-only registers are ignored.

// ---- Global block (0x000 - 0x0FF) -------------------------------------

/// RO. Identification: the bytes "RBLN".
pub const ID: u64 = 0x000;
pub const ID_VALUE: u32 = u32::from_le_bytes(*b"RBLN");
/// RO. Hardware version ([`super::HW_VERSION`]).
pub const VERSION: u64 = 0x004;
/// RO. Capability bits ([`caps`]).
pub const CAPS: u64 = 0x008;
/// RO. Number of hardware queues (16..=[`MAX_QUEUES`]).
pub const NUM_QUEUES: u64 = 0x00C;
/// RO. Number of compute cores (1..=[`MAX_CORES`]).
pub const NUM_CORES: u64 = 0x010;
/// RO. Number of DMA engines (1..=[`MAX_DMA_ENGINES`]).
pub const NUM_DMA_ENGINES: u64 = 0x014;
/// RO. Number of MMU contexts ([`MAX_CONTEXTS`]).
pub const NUM_CONTEXTS: u64 = 0x018;
/// RO. Number of MSI-X vectors ([`MSIX_VECTORS`]).
pub const NUM_MSIX_VECTORS: u64 = 0x01C;
/// RO. Size of device DRAM (BAR2) in bytes.
pub const DRAM_SIZE_64: u64 = 0x020;
/// WO. Writing [`RESET_MAGIC`] resets the whole device (see docs).
pub const DEVICE_RESET: u64 = 0x028;
pub const RESET_MAGIC: u32 = 0x5253_5421;
/// RO. Device status ([`status`]).
pub const STATUS: u64 = 0x02C;
/// RO. Device clock in nanoseconds since the device (model) started.
pub const TIMESTAMP_64: u64 = 0x030;
/// RW. Scratch register, no side effects (reset value 0).
pub const SCRATCH: u64 = 0x038;
/// RW1C. Bit q set: queue q completed a fence packet with the IRQ flag.
pub const IRQ_QUEUE_STATUS: u64 = 0x040;
/// RW. Bit q set: queue q's fence interrupts are masked. Reset: all set.
pub const IRQ_QUEUE_MASK: u64 = 0x044;
/// RW1C. Bit q set: queue q faulted (its error record is valid).
pub const IRQ_ERROR_STATUS: u64 = 0x048;
/// RW. Bit q set: queue q's error interrupts are masked. Reset: all set.
pub const IRQ_ERROR_MASK: u64 = 0x04C;
/// WO. Writing a context id drops every cached translation of that
/// context. Required after a PTE is changed or removed.
pub const MMU_INVALIDATE: u64 = 0x050;
/// RO. Total number of error records raised since reset.
pub const ERROR_COUNT: u64 = 0x054;

pub mod caps {
    /// Device MMU with per-context page tables.
    pub const MMU: u32 = 1 << 0;
    /// SEM_WAIT / SEM_SIGNAL packets.
    pub const SEMAPHORES: u32 = 1 << 1;
    /// TIMESTAMP packets.
    pub const TIMESTAMPS: u32 = 1 << 2;
    /// INDIRECT packets.
    pub const INDIRECT: u32 = 1 << 3;
    /// fp32 compute descriptors.
    pub const COMPUTE_FP32: u32 = 1 << 4;
    pub const ALL: u32 = MMU | SEMAPHORES | TIMESTAMPS | INDIRECT | COMPUTE_FP32;
}

pub mod status {
    /// The device is out of reset and accepts commands.
    pub const READY: u32 = 1 << 0;
}

// ---- Counters (0x100 - 0x1FF), all 64-bit, RO, cleared by device reset --

/// Packets executed by all queues.
pub const CNT_PACKETS_64: u64 = 0x100;
/// Bytes written by DMA_COPY and FILL.
pub const CNT_DMA_BYTES_64: u64 = 0x108;
/// Compute descriptors executed.
pub const CNT_COMPUTE_OPS_64: u64 = 0x110;
/// Floating-point operations of executed compute descriptors (nominal).
pub const CNT_COMPUTE_FLOPS_64: u64 = 0x118;
/// Error records raised (same as ERROR_COUNT, 64-bit).
pub const CNT_FAULTS_64: u64 = 0x120;
/// Busy nanoseconds of DMA engine e: `CNT_DMA_BUSY_NS_64 + 8 * e`.
pub const CNT_DMA_BUSY_NS_64: u64 = 0x140;
/// Busy nanoseconds of compute core c: `CNT_CORE_BUSY_NS_64 + 8 * c`.
pub const CNT_CORE_BUSY_NS_64: u64 = 0x180;

// ---- Contexts (0x1000 - 0x13FF): 16 bytes per context -----------------

pub const CTX_BASE: u64 = 0x1000;
pub const CTX_STRIDE: u64 = 0x10;
/// RW. Bus address of the context's level-2 page table (4 KiB aligned,
/// host memory). Low 12 bits are ignored.
pub const CTX_PT_ROOT_64: u64 = 0x0;
/// RW. Bit 0: context valid. Queues bound to an invalid context fault
/// with [`FaultCode::ContextInvalid`](super::ring::FaultCode) when they run.
pub const CTX_CONTROL: u64 = 0x8;
pub const CTX_CONTROL_VALID: u32 = 1 << 0;

/// Offset of register `reg` of context `ctx`.
pub const fn ctx_reg(ctx: u32, reg: u64) -> u64 {
    CTX_BASE + ctx as u64 * CTX_STRIDE + reg
}

// ---- Queues (0x2000 - 0x2FFF): 0x80 bytes per queue ---------------------

pub const QUEUE_BASE: u64 = 0x2000;
pub const QUEUE_STRIDE: u64 = 0x80;
/// RW. Bus address of the ring (host memory, 4 KiB aligned). Writable only
/// while the queue is disabled.
pub const Q_RING_BASE_64: u64 = 0x00;
/// RW. Ring size in entries: a power of two in 2..=65536.
pub const Q_RING_SIZE: u64 = 0x08;
/// RW. Context id the queue's commands are translated with.
pub const Q_CTX_ID: u64 = 0x0C;
/// RW. Bus address of the queue's 64-byte status block (host memory,
/// 64-byte aligned), written by the device ([`super::ring::QueueStatus`]).
pub const Q_STATUS_ADDR_64: u64 = 0x10;
/// RW. Queue control ([`qctl`]).
pub const Q_CONTROL: u64 = 0x18;
/// RO. Queue state ([`super::ring::QueueState`]).
pub const Q_STATE: u64 = 0x1C;
/// RO. Index of the next ring entry the device will consume.
pub const Q_HEAD: u64 = 0x20;
/// RW. Index one past the last valid ring entry (the doorbell writes it).
pub const Q_TAIL: u64 = 0x24;
/// RO. Value of the last FENCE packet the queue executed.
pub const Q_FENCE_64: u64 = 0x28;
/// RO. Error record: fault code (bits 7..0), access (bits 15..8: 1 read,
/// 2 write), nesting depth (bits 23..16).
pub const Q_FAULT_CODE: u64 = 0x30;
/// RO. Error record: ring index of the entry that faulted.
pub const Q_FAULT_RING_INDEX: u64 = 0x34;
/// RO. Error record: faulting device virtual address (or packet address
/// for packet/descriptor errors).
pub const Q_FAULT_ADDR_64: u64 = 0x38;
/// RO. Packets executed by this queue since its last reset (progress
/// counter for hang detection).
pub const Q_PACKETS_64: u64 = 0x40;
/// RO. Nanoseconds this queue spent executing packets other than SEM_WAIT
/// since its last reset (per-client engine time; since minor version 5).
pub const Q_BUSY_NS_64: u64 = 0x48;

pub mod qctl {
    /// Set: the queue consumes ring entries. Clear: the queue stops at the
    /// next packet boundary (the write returns once it has); the ring entry
    /// in progress is abandoned, head still points at it, and re-enabling
    /// without a reset executes it again from its first packet.
    pub const ENABLE: u32 = 1 << 0;
    /// Write 1: stop the queue, clear its fault and set head = tail = 0.
    /// Self-clearing. Q_FENCE is cleared too: the next user of the queue
    /// starts its fence timeline at 0.
    pub const RESET: u32 = 1 << 1;
}

/// Offset of register `reg` of queue `q`.
pub const fn queue_reg(q: u32, reg: u64) -> u64 {
    QUEUE_BASE + q as u64 * QUEUE_STRIDE + reg
}

// ---- Limits ----------------------------------------------------------

pub const MAX_QUEUES: u32 = 32;
pub const MIN_QUEUES: u32 = 16;
pub const MAX_CONTEXTS: u32 = 64;
pub const MAX_CORES: u32 = 8;
pub const MAX_DMA_ENGINES: u32 = 4;
/// MSI-X vector 0 signals errors; vector 1 + (q % 8) signals queue q's fences.
pub const MSIX_VECTORS: u32 = 9;
pub const MSIX_ERROR_VECTOR: u32 = 0;
pub const MSIX_QUEUE_GROUPS: u32 = MSIX_VECTORS - 1;

/// MSI-X vector that carries queue `q`'s fence interrupts.
pub const fn queue_vector(q: u32) -> u32 {
    1 + q % MSIX_QUEUE_GROUPS
}

const _: () = assert!(ctx_reg(MAX_CONTEXTS, 0) <= QUEUE_BASE);
const _: () = assert!(queue_reg(MAX_QUEUES, 0) <= super::pci::MSIX_TABLE_OFFSET as u64);
const _: () = assert!(Q_BUSY_NS_64 + 8 <= QUEUE_STRIDE);
const _: () = assert!(CNT_CORE_BUSY_NS_64 + 8 * MAX_CORES as u64 <= 0x200);
const _: () = assert!(CNT_DMA_BUSY_NS_64 + 8 * MAX_DMA_ENGINES as u64 <= CNT_CORE_BUSY_NS_64);
