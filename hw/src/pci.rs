//! PCI identity and BAR layout.

/// QEMU's vendor ID for emulated devices; belongs to no real product.
pub const VENDOR_ID: u16 = 0x1234;
/// Device ID of the rbln NPU (unused by QEMU's own devices).
pub const DEVICE_ID: u16 = 0x52b1;
pub const SUBSYSTEM_VENDOR_ID: u16 = 0x1234;
pub const SUBSYSTEM_ID: u16 = 0x0001;
pub const REVISION: u8 = 0x01;
/// Class code: processing accelerator (base 0x12, sub 0x00, prog-if 0x00).
pub const CLASS_CODE: u32 = 0x12_00_00;

/// BAR0: control registers (32-bit, non-prefetchable, trapping).
pub const BAR_REGS: u32 = 0;
pub const BAR_REGS_SIZE: u64 = 64 * 1024;
/// BAR2: device DRAM (64-bit, prefetchable, mappable without trapping).
pub const BAR_DRAM: u32 = 2;
/// BAR4: doorbells, one 4 KiB page per queue (64-bit, non-prefetchable,
/// trapping so that writes reach the device as posted writes).
pub const BAR_DOORBELL: u32 = 4;

/// MSI-X table and PBA live in BAR0 at these offsets.
pub const MSIX_TABLE_OFFSET: u32 = 0xC000;
pub const MSIX_PBA_OFFSET: u32 = 0xD000;

/// Size of BAR4 for `num_queues` queues (a power of two, at least 4 KiB).
pub const fn doorbell_bar_size(num_queues: u32) -> u64 {
    let bytes = num_queues as u64 * super::PAGE_SIZE;
    if bytes <= super::PAGE_SIZE {
        super::PAGE_SIZE
    } else {
        bytes.next_power_of_two()
    }
}

/// Offset of the doorbell register in queue `q`'s doorbell page (32-bit
/// write: the new tail; read: the current tail). The page holds nothing
/// else: other offsets ignore writes and read as 0.
pub const DOORBELL_TAIL: u64 = 0x0;

/// Offset of queue `q`'s doorbell page in BAR4.
pub const fn doorbell_page_offset(q: u32) -> u64 {
    q as u64 * super::PAGE_SIZE
}
