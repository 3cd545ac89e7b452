// SPDX-License-Identifier: GPL-2.0

//! PCI binding: probe, the device-wide state shared with open files, and
//! teardown.

use kernel::{
    device::Core,
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    pci,
    prelude::*,
    sync::{aref::ARef, Arc},
};

use crate::file::RblnFile;
use crate::hw::{self, regs};

/// BAR0 (registers) is 64 KiB.
pub(crate) const REGS_SIZE: usize = hw::pci::BAR_REGS_SIZE as usize;
type RegsBar = pci::DevresBar<REGS_SIZE>;

/// Most devices one system may have (/dev/rbln0 ../dev/rbln7).
const MAX_DEVICES: usize = 8;
static DEVICE_NAMES: [&CStr; MAX_DEVICES] =
    [c"rbln0", c"rbln1", c"rbln2", c"rbln3", c"rbln4", c"rbln5", c"rbln6", c"rbln7"];

/// Minor indices in use (bit i: /dev/rbln{i}).
static INDICES: kernel::sync::atomic::Atomic<u32> = kernel::sync::atomic::Atomic::new(0);

fn take_index() -> Result<usize> {
    use kernel::sync::atomic::{Acquire, Relaxed};
    loop {
        let used = INDICES.load(Relaxed);
        let free = (!used).trailing_zeros() as usize;
        if free >= MAX_DEVICES {
            return Err(ENOSPC);
        }
        if INDICES.cmpxchg(used, used | (1 << free), Acquire).is_ok() {
            return Ok(free);
        }
    }
}

fn put_index(i: usize) {
    use kernel::sync::atomic::{Relaxed, Release};
    loop {
        let used = INDICES.load(Relaxed);
        if INDICES.cmpxchg(used, used & !(1u32 << i), Release).is_ok() {
            return;
        }
    }
}

/// What probe learned from the hardware's identity registers.
#[derive(Clone, Copy)]
pub(crate) struct HwInfo {
    pub(crate) version: u32,
    pub(crate) caps: u32,
    pub(crate) num_queues: u32,
    pub(crate) num_cores: u32,
    pub(crate) num_dma_engines: u32,
    pub(crate) dram_size: u64,
}

/// Device-wide state, shared (by `Arc`) by the PCI binding and every open
/// file. Hardware access goes through revocable BAR mappings: after the
/// device is unbound, file operations get `ENODEV` instead of touching
/// unmapped registers.
pub(crate) struct Npu {
    pub(crate) index: usize,
    pub(crate) pdev: ARef<pci::Device>,
    pub(crate) regs: RegsBar,
    pub(crate) hw: HwInfo,
}

impl Npu {
    /// Run `f` with the register BAR, or fail with ENODEV once unbound.
    pub(crate) fn with_regs<R>(&self, f: impl FnOnce(&Regs<'_>) -> Result<R>) -> Result<R> {
        let bar = self.regs.try_access().ok_or(ENODEV)?;
        f(&Regs(&bar))
    }
}

/// Typed access to BAR0 at runtime-computed offsets (bounds-checked).
pub(crate) struct Regs<'a>(&'a pci::Bar<'a, REGS_SIZE>);

impl Regs<'_> {
    pub(crate) fn r32(&self, off: u64) -> Result<u32> {
        use kernel::io::Io;
        self.0.try_read32(off as usize)
    }

    pub(crate) fn w32(&self, off: u64, v: u32) -> Result {
        use kernel::io::Io;
        self.0.try_write32(v, off as usize)
    }

    pub(crate) fn r64(&self, off: u64) -> Result<u64> {
        use kernel::io::Io;
        self.0.try_read64(off as usize)
    }

    pub(crate) fn w64(&self, off: u64, v: u64) -> Result {
        use kernel::io::Io;
        self.0.try_write64(v, off as usize)
    }
}

/// Holds the misc device next to the state its `open` needs: `open` finds
/// this struct from the registration it is given (see `file.rs`).
#[pin_data]
pub(crate) struct MiscHolder {
    #[pin]
    pub(crate) reg: MiscDeviceRegistration<RblnFile>,
    pub(crate) npu: Arc<Npu>,
}

/// Per-bound-device driver data.
#[pin_data(PinnedDrop)]
pub(crate) struct RblnData {
    npu: Arc<Npu>,
    misc: Pin<KBox<MiscHolder>>,
}

pub(crate) struct RblnDriver;

// QEMU's vendor ID 0x1234 has no named constant in the kernel, so the table
// matches the class (processing accelerator) and probe checks the IDs
// before touching anything.
kernel::pci_device_table!(
    PCI_TABLE,
    <RblnDriver as pci::Driver>::IdInfo,
    [(pci::DeviceId::from_class(hw::pci::CLASS_CODE, 0xffffff), ())]
);

/// Check identity and version, then reset the device.
fn init_hw(pdev: &pci::Device<Core<'_>>, r: &Regs<'_>) -> Result<HwInfo> {
    let id = r.r32(regs::ID)?;
    if id != regs::ID_VALUE {
        dev_err!(pdev, "identity register reads {:#x}, not \"RBLN\"; refusing the device\n", id);
        return Err(ENODEV);
    }
    let version = r.r32(regs::VERSION)?;
    if version >> 16 != hw::HW_VERSION_MAJOR {
        dev_err!(
            pdev,
            "hardware version {}.{} is not supported (driver speaks {}.x); refusing the device\n",
            version >> 16,
            version & 0xffff,
            hw::HW_VERSION_MAJOR
        );
        return Err(ENODEV);
    }
    r.w32(regs::DEVICE_RESET, regs::RESET_MAGIC)?;
    if r.r32(regs::STATUS)? & regs::status::READY == 0 {
        dev_err!(pdev, "device not ready after reset\n");
        return Err(EIO);
    }
    let info = HwInfo {
        version,
        caps: r.r32(regs::CAPS)?,
        num_queues: r.r32(regs::NUM_QUEUES)?,
        num_cores: r.r32(regs::NUM_CORES)?,
        num_dma_engines: r.r32(regs::NUM_DMA_ENGINES)?,
        dram_size: r.r64(regs::DRAM_SIZE_64)?,
    };
    if info.num_queues == 0 || info.num_queues > regs::MAX_QUEUES {
        dev_err!(pdev, "implausible queue count {}\n", info.num_queues);
        return Err(ENODEV);
    }
    Ok(info)
}

impl pci::Driver for RblnDriver {
    type IdInfo = ();
    type Data<'bound> = RblnData;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        if pdev.vendor_id().as_raw() != hw::pci::VENDOR_ID || pdev.device_id() != hw::pci::DEVICE_ID {
            return Err(ENODEV);
        }
        pdev.enable_device_mem()?;
        pdev.set_master();

        let regs = pdev.iomap_region_sized::<REGS_SIZE>(hw::pci::BAR_REGS, c"rbln-regs")?.into_devres()?;
        let hw_info = {
            let bar = regs.access(pdev.as_ref())?;
            init_hw(pdev, &Regs(bar))?
        };
        let index = take_index()?;
        let npu = match Arc::new(
            Npu { index, pdev: ARef::from(&**pdev), regs, hw: hw_info },
            GFP_KERNEL,
        ) {
            Ok(n) => n,
            Err(e) => {
                put_index(index);
                return Err(e.into());
            }
        };
        let for_files = npu.clone();
        let misc = KBox::pin_init(
            try_pin_init!(MiscHolder {
                reg <- MiscDeviceRegistration::register(MiscDeviceOptions { name: DEVICE_NAMES[index] }),
                npu: for_files,
            }),
            GFP_KERNEL,
        );
        let misc = match misc {
            Ok(m) => m,
            Err(e) => {
                put_index(index);
                return Err(e);
            }
        };
        dev_info!(
            pdev,
            "rbln{}: NPU hw {}.{}, {} MiB DRAM, {} queues, {} cores, {} DMA engines\n",
            index,
            hw_info.version >> 16,
            hw_info.version & 0xffff,
            hw_info.dram_size >> 20,
            hw_info.num_queues,
            hw_info.num_cores,
            hw_info.num_dma_engines
        );
        Ok(RblnData { npu, misc })
    }
}

#[pinned_drop]
impl PinnedDrop for RblnData {
    fn drop(self: Pin<&mut Self>) {
        // Quiesce the hardware while the BAR is still mapped.
        let _ = self.npu.with_regs(|r| r.w32(regs::DEVICE_RESET, regs::RESET_MAGIC));
        put_index(self.npu.index);
        dev_info!(self.npu.pdev, "rbln{}: removed\n", self.npu.index);
        let _ = &self.misc;
    }
}
