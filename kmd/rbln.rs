// SPDX-License-Identifier: GPL-2.0

//! rbln: Rust-for-Linux driver for the rbln virtual NPU.
//!
//! This is the skeleton that proves the out-of-tree Rust build and the VM
//! harness: it loads, logs its version and unloads cleanly.

use kernel::prelude::*;

module! {
    type: Rbln,
    name: "rbln",
    authors: ["rbln developers"],
    description: "Driver for the rbln virtual NPU",
    license: "GPL",
}

/// Driver version reported in the kernel log (and later by the info ioctl).
const DRIVER_VERSION: &str = "0.1.0";

struct Rbln;

impl kernel::Module for Rbln {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        pr_info!("rbln driver {} loaded\n", DRIVER_VERSION);
        Ok(Rbln)
    }
}

impl Drop for Rbln {
    fn drop(&mut self) {
        pr_info!("rbln driver {} unloaded\n", DRIVER_VERSION);
    }
}
