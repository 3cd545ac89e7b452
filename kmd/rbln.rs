// SPDX-License-Identifier: GPL-2.0

//! rbln: Rust-for-Linux driver for the rbln virtual NPU.
//!
//! The hardware contract (`hw/`) and the user ABI (`uapi/`) are the same
//! source files the device model and the user-mode driver compile: they are
//! included here as modules, so there is one definition of every register,
//! packet and ioctl struct.

use kernel::prelude::*;

#[path = "../hw/src/lib.rs"]
#[allow(dead_code, unused_attributes, unreachable_pub, clippy::all)]
mod hw;

#[path = "../uapi/src/lib.rs"]
#[allow(dead_code, unused_attributes, unreachable_pub, clippy::all)]
mod uapi;

mod ctx;
mod engine;
mod file;
mod mem;
mod npu;
mod sysfs;

/// Driver version (also reported by the INFO ioctl): major, minor, patch.
pub(crate) const DRIVER_VERSION: (u32, u32, u32) = (0, 2, 0);

struct RblnModule {
    driver: Option<Pin<KBox<kernel::driver::Registration<kernel::pci::Adapter<npu::RblnDriver>>>>>,
}

impl kernel::Module for RblnModule {
    fn init(module: &'static ThisModule) -> Result<Self> {
        let (ma, mi, pa) = DRIVER_VERSION;
        pr_info!("rbln driver {}.{}.{} loaded (uapi {})\n", ma, mi, pa, uapi::UAPI_VERSION);
        let driver = KBox::pin_init(kernel::driver::Registration::new(c"rbln", module), GFP_KERNEL)?;
        Ok(Self { driver: Some(driver) })
    }
}

impl Drop for RblnModule {
    fn drop(&mut self) {
        // Unbind every device first, so the log reads in order.
        drop(self.driver.take());
        let (ma, mi, pa) = DRIVER_VERSION;
        pr_info!("rbln driver {}.{}.{} unloaded\n", ma, mi, pa);
    }
}

module! {
    type: RblnModule,
    name: "rbln",
    authors: ["rbln developers"],
    description: "Driver for the rbln virtual NPU",
    license: "GPL",
    params: {
        hang_ms: u32 {
            default: 10000,
            description: "A pending fence whose queue executes no packet for this long is a hang: the queue is reset, its fences fail and its context is poisoned (0: never). Checked while someone waits.",
        },
    },
}
