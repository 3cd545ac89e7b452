//! The rbln virtual NPU's hardware contract: PCI identity, BAR0 register
//! map, queue rings, command packets, device-MMU page-table entries and
//! compute descriptors.
//!
//! This crate is the single source of truth shared by the device model
//! (`qemu-device/`), the kernel driver (`kmd/`) and the user-mode driver
//! (`umd/`). It is `no_std` and has no dependencies so the kernel can use
//! it as is. `docs/hardware.md` is the prose version of the same contract.
//!
//! All multi-byte values in memory and in registers are little-endian.
//!
//! The kernel driver compiles this crate as a module (`#[path]` include),
//! so paths between its modules are written `super::`, never `crate::`.
#![no_std]
#![forbid(unsafe_code)]

#[macro_use]
mod wire;

pub mod cmd;
pub mod mmu;
pub mod ops;
pub mod pci;
pub mod regs;
pub mod ring;
pub mod tile;

pub use wire::Wire;

/// Hardware version implemented by this contract: major in bits 31..16,
/// minor in bits 15..0. A driver refuses a device whose major differs.
pub const HW_VERSION_MAJOR: u32 = 1;
pub const HW_VERSION_MINOR: u32 = 18;
pub const HW_VERSION: u32 = (HW_VERSION_MAJOR << 16) | HW_VERSION_MINOR;

/// Size of a device page, a doorbell page and a page-table page.
pub const PAGE_SIZE: u64 = 4096;
pub const PAGE_SHIFT: u32 = 12;
