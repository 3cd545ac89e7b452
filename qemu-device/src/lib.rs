//! The rbln virtual NPU device model (see docs/hardware.md).
//!
//! [`Device`] is the hardware: registers, queues, command processors, MMU,
//! DMA engines and compute cores. It knows nothing of the transport; the
//! `vfio` module serves it to QEMU over vfio-user, and the host tests
//! drive it directly with fake guest memory.

pub mod compute;
pub mod device;
mod engines;
mod exec;
pub mod faults;
pub mod memory;
pub mod mmu;

pub use device::{Config, ConfigError, Device, IrqSink};
mod pci_config;
pub mod vfio;
pub mod workers;
