//! vfio-user transport: serves a [`Device`] to QEMU's `vfio-user-pci`.
//!
//! Only translation lives here: config space, region accesses, DMA
//! map/unmap and MSI-X eventfds. Handlers never wait for device work to
//! finish, at most for it to reach an abort point (a queue stop): the
//! server loop is single-threaded and QEMU waits on every reply but a
//! posted write's. Messages are handled in order, so a region read is
//! answered after every write posted before it (the flush rbln.ko relies
//! on, hardware.md 15.3).

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, RwLock};

use vfio_bindings::bindings::vfio::{
    vfio_region_info, vfio_region_sparse_mmap_area, VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_NORESIZE,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_INTX_IRQ_INDEX,
    VFIO_PCI_MSIX_IRQ_INDEX, VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_MMAP,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, Server, ServerBackend, ServerRegion, SparseArea};

use rbln_hw::pci;
use rbln_hw::regs::MSIX_VECTORS;

use crate::device::{Device, IrqSink};
use crate::memory::Mapping;
use crate::pci_config::{PciConfig, CONFIG_SIZE};

/// MSI-X vectors backed by the eventfds QEMU hands over.
#[derive(Default)]
struct MsixEventfds {
    fds: RwLock<Vec<Option<File>>>,
}

impl IrqSink for MsixEventfds {
    fn raise(&self, vector: u32) {
        let fds = self.fds.read().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(fd)) = fds.get(vector as usize) {
            if let Err(e) = (&*fd).write_all(&1u64.to_le_bytes()) {
                log::warn!("MSI-X vector {vector}: eventfd write failed: {e}");
            }
        } else {
            log::debug!("MSI-X vector {vector} raised with no eventfd");
        }
    }
}

struct Backend {
    device: Arc<Device>,
    config: PciConfig,
    msix: Arc<MsixEventfds>,
}

fn region(index: u32, size: u64, flags: u32) -> ServerRegion {
    ServerRegion {
        region_info: vfio_region_info {
            argsz: std::mem::size_of::<vfio_region_info>() as u32,
            flags,
            index,
            cap_offset: 0,
            size,
            offset: 0,
        },
        sparse_areas: Vec::new(),
        mmap_fd: None,
    }
}

/// Serve `device` on the UNIX socket `path` until QEMU disconnects (or the
/// server loop is interrupted by a signal).
pub fn serve(device: Arc<Device>, path: &Path) -> Result<(), vfio_user::Error> {
    let cfg = device.config().clone();
    let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
    let doorbell_size = pci::doorbell_bar_size(cfg.num_queues);
    let mut regions: Vec<ServerRegion> = (0..VFIO_PCI_NUM_REGIONS).map(|i| region(i, 0, 0)).collect();
    regions[pci::BAR_REGS as usize] = region(pci::BAR_REGS, pci::BAR_REGS_SIZE, rw);
    regions[pci::BAR_DOORBELL as usize] = region(pci::BAR_DOORBELL, doorbell_size, rw);
    regions[VFIO_PCI_CONFIG_REGION_INDEX as usize] =
        region(VFIO_PCI_CONFIG_REGION_INDEX, CONFIG_SIZE as u64, rw);
    // DRAM: trapped by default, so that QEMU posts MMIO writes (it stops
    // posting them for a device with any mappable region: a doorbell would
    // then stall the vCPU for a round trip). With `dram_bar_mmap` the
    // whole BAR is one mappable area of the memfd and guest CPU accesses
    // never trap. (The crate sends the fd with the sparse-mmap capability,
    // hence the single area covering the region.)
    // (The device made its DRAM a memfd exactly when `dram_bar_mmap`.)
    regions[pci::BAR_DRAM as usize] = if let (true, Some(file)) = (cfg.dram_bar_mmap, device.dram().file()) {
        let mut dram = region(pci::BAR_DRAM, cfg.dram_size, rw | VFIO_REGION_INFO_FLAG_MMAP);
        dram.sparse_areas = vec![SparseArea { area: vfio_region_sparse_mmap_area { offset: 0, size: cfg.dram_size } }];
        dram.mmap_fd = Some(file.as_raw_fd());
        dram
    } else {
        region(pci::BAR_DRAM, cfg.dram_size, rw)
    };

    let irqs: Vec<IrqInfo> = (0..VFIO_PCI_NUM_IRQS)
        .map(|index| {
            let (flags, count) = match index {
                VFIO_PCI_INTX_IRQ_INDEX => (VFIO_IRQ_INFO_EVENTFD, 1),
                VFIO_PCI_MSIX_IRQ_INDEX => (VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE, MSIX_VECTORS),
                _ => (0, 0),
            };
            IrqInfo { index, flags, count }
        })
        .collect();

    let server = Server::new(path, true, irqs, regions)?;
    let msix = Arc::new(MsixEventfds::default());
    device.set_irq_sink(msix.clone());
    let mut backend = Backend { config: PciConfig::new(cfg.dram_size, doorbell_size), device, msix };
    server.run(&mut backend)
}

impl ServerBackend for Backend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), std::io::Error> {
        if region == VFIO_PCI_CONFIG_REGION_INDEX {
            self.config.read(offset, data);
            if self.device.is_off_bus() {
                data.fill(0xff);
            }
        } else {
            self.device.bar_read(region, offset, data);
        }
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        if region == VFIO_PCI_CONFIG_REGION_INDEX {
            self.config.write(offset, data);
        } else {
            self.device.bar_write(region, offset, data);
        }
        Ok(())
    }

    fn dma_map(
        &mut self,
        _flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> Result<(), std::io::Error> {
        // Errors are logged, not returned: the crate reports backend errors
        // to QEMU with error code 0, which reads as success anyway.
        let Some(fd) = fd else {
            log::info!("dma_map {address:#x}+{size:#x} without fd (e.g. firmware ROM): not reachable by the device");
            return Ok(());
        };
        match Mapping::new(&fd, offset, size) {
            Ok(m) => {
                if let Err(e) = self.device.host_memory().map(address, m) {
                    log::warn!("dma_map {address:#x}+{size:#x}: {e}");
                } else {
                    log::debug!("dma_map {address:#x}+{size:#x} (fd offset {offset:#x})");
                }
            }
            Err(e) => log::warn!("dma_map {address:#x}+{size:#x}: cannot map: {e}"),
        }
        Ok(())
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> Result<(), std::io::Error> {
        if flags.contains(DmaUnmapFlags::UNMAP_ALL) {
            self.device.host_memory().clear();
        } else {
            self.device.host_memory().unmap(address, size);
        }
        log::debug!("dma_unmap {address:#x}+{size:#x}");
        Ok(())
    }

    fn reset(&mut self) -> Result<(), std::io::Error> {
        log::info!("device reset requested by the client");
        self.device.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), std::io::Error> {
        if index != VFIO_PCI_MSIX_IRQ_INDEX {
            log::debug!("set_irqs index {index} ignored (the device uses MSI-X only)");
            return Ok(());
        }
        let mut table = self.msix.fds.write().unwrap_or_else(|e| e.into_inner());
        table.resize_with(MSIX_VECTORS as usize, || None);
        if flags & VFIO_IRQ_SET_DATA_NONE != 0 && count == 0 {
            table.iter_mut().for_each(|f| *f = None);
        } else if flags & VFIO_IRQ_SET_DATA_EVENTFD != 0 {
            // QEMU may send the vectors over several messages (one fd each
            // when the server allows one fd per message): accumulate.
            for (i, fd) in fds.into_iter().enumerate().take(count as usize) {
                if let Some(slot) = table.get_mut(start as usize + i) {
                    *slot = Some(fd);
                }
            }
        }
        log::debug!("set_irqs MSI-X start {start} count {count} flags {flags:#x}");
        Ok(())
    }
}
