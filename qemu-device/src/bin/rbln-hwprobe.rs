//! `rbln-hwprobe`: drive an rbln NPU from guest user space, without a
//! kernel driver, through the PCI sysfs resource files.
//!
//! It is the VM-level smoke test of the device model under QEMU: register
//! reads and writes reach the vfio-user server, BAR2 is really the DRAM
//! memfd, and guest RAM is really shared for DMA. It builds a context's
//! page tables, a ring and a command buffer in locked pages of its own
//! (physical addresses from /proc/self/pagemap), runs FILL, DMA, TIMESTAMP
//! and FENCE, checks the results, then provokes a fault and resets.
//!
//!     rbln-hwprobe [/sys/bus/pci/devices/0000:00:04.0]
//!
//! Prints one "ok - ..." line per check; exits 1 on the first failure.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use rbln_hw::cmd::Encoder;
use rbln_hw::mmu::{self, Target};
use rbln_hw::pci::{doorbell_page_offset, DEVICE_ID, VENDOR_ID};
use rbln_hw::regs::{self, qctl};
use rbln_hw::ring::{FaultCode, QueueState, QueueStatus, RingEntry};
use rbln_hw::{HW_VERSION_MAJOR, PAGE_SIZE};

type Res<T> = Result<T, String>;

/// A mapped BAR, accessed with volatile 32/64-bit loads and stores.
struct Bar {
    map: MmapRaw,
}

impl Bar {
    fn open(dev: &Path, index: u32) -> Res<Self> {
        let path = dev.join(format!("resource{index}"));
        let file = OpenOptions::new().read(true).write(true).open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let map = MmapOptions::new().map_raw(&file).map_err(|e| format!("mmap {}: {e}", path.display()))?;
        Ok(Self { map })
    }

    fn ptr(&self, off: u64, width: usize) -> *mut u8 {
        assert!(off as usize + width <= self.map.len() && (off as usize).is_multiple_of(width), "BAR access out of range");
        // SAFETY: the assertion keeps the offset inside the mapping.
        unsafe { self.map.as_mut_ptr().add(off as usize) }
    }

    fn r32(&self, off: u64) -> u32 {
        // SAFETY: aligned, in-bounds MMIO (checked by `ptr`); volatile
        // because every access is a device register access.
        unsafe { std::ptr::read_volatile(self.ptr(off, 4) as *const u32) }
    }

    fn w32(&self, off: u64, v: u32) {
        // SAFETY: as in `r32`.
        unsafe { std::ptr::write_volatile(self.ptr(off, 4) as *mut u32, v) }
    }

    fn r64(&self, off: u64) -> u64 {
        // SAFETY: as in `r32`.
        unsafe { std::ptr::read_volatile(self.ptr(off, 8) as *const u64) }
    }

    fn w64(&self, off: u64, v: u64) {
        // SAFETY: as in `r32`.
        unsafe { std::ptr::write_volatile(self.ptr(off, 8) as *mut u64, v) }
    }
}

/// Locked, zeroed pages of this process with their physical addresses.
struct Pages {
    map: MmapRaw,
    phys: Vec<u64>,
}

impl Pages {
    fn new(count: usize) -> Res<Self> {
        let len = count * PAGE_SIZE as usize;
        let map = MmapOptions::new().len(len).map_anon().map_err(|e| format!("mmap: {e}"))?;
        let map = MmapRaw::from(map);
        // SAFETY: the range is this process's own anonymous mapping.
        if unsafe { libc::mlock(map.as_ptr() as *const libc::c_void, len) } != 0 {
            return Err(format!("mlock: {}", std::io::Error::last_os_error()));
        }
        let mut pagemap = File::open("/proc/self/pagemap").map_err(|e| format!("pagemap: {e}"))?;
        let mut phys = Vec::new();
        for i in 0..count {
            let va = map.as_ptr() as u64 + i as u64 * PAGE_SIZE;
            // SAFETY: inside the mapping; touching it makes the page present.
            unsafe { std::ptr::write_volatile(va as *mut u8, 0) };
            let mut e = [0u8; 8];
            pagemap.seek(SeekFrom::Start(va / PAGE_SIZE * 8)).and_then(|_| pagemap.read_exact(&mut e)).map_err(|e| format!("pagemap: {e}"))?;
            let e = u64::from_le_bytes(e);
            if e >> 63 == 0 || e & ((1 << 55) - 1) == 0 {
                return Err("page not present or PFN hidden (need root)".into());
            }
            phys.push((e & ((1 << 55) - 1)) * PAGE_SIZE);
        }
        Ok(Self { map, phys })
    }

    fn write(&self, page: usize, off: usize, data: &[u8]) {
        assert!(off + data.len() <= PAGE_SIZE as usize);
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds of page `page` (asserted); the device may
            // read it concurrently, hence volatile.
            unsafe { std::ptr::write_volatile(self.map.as_mut_ptr().add(page * PAGE_SIZE as usize + off + i), *b) };
        }
    }

    fn read(&self, page: usize, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= PAGE_SIZE as usize);
        (0..len)
            // SAFETY: in bounds (asserted); written by the device, hence volatile.
            .map(|i| unsafe { std::ptr::read_volatile(self.map.as_ptr().add(page * PAGE_SIZE as usize + off + i)) })
            .collect()
    }

    fn u64_at(&self, page: usize, off: usize) -> u64 {
        u64::from_le_bytes(self.read(page, off, 8).try_into().unwrap_or([0; 8]))
    }
}

fn find_device(arg: Option<String>) -> Res<PathBuf> {
    if let Some(a) = arg {
        return Ok(PathBuf::from(a));
    }
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
    for e in std::fs::read_dir("/sys/bus/pci/devices").map_err(|e| e.to_string())?.flatten() {
        if read(e.path().join("vendor")) == format!("{VENDOR_ID:#06x}") && read(e.path().join("device")) == format!("{DEVICE_ID:#06x}") {
            return Ok(e.path());
        }
    }
    Err("no rbln NPU found".into())
}

fn check(ok: bool, what: &str) -> Res<()> {
    if ok {
        println!("ok - {what}");
        Ok(())
    } else {
        Err(what.to_string())
    }
}

// Page roles in the probe's locked memory.
const L2: usize = 0;
const L1: usize = 1;
const L0: usize = 2;
const RING: usize = 3;
const STATUS: usize = 4;
const CMDS: usize = 5;
const DATA: usize = 6;
const NPAGES: usize = 7;
// Device VAs.
const VA_CMDS: u64 = 0x20_0000;
const VA_DATA: u64 = 0x20_1000;
const VA_DRAM: u64 = 0x20_2000;

fn run(dev: &Path) -> Res<()> {
    std::fs::write(dev.join("enable"), "1").map_err(|e| format!("enable: {e}"))?;
    let regs_bar = Bar::open(dev, 0)?;
    let dram = Bar::open(dev, 2)?;
    let doorbells = Bar::open(dev, 4)?;

    check(regs_bar.r32(regs::ID) == regs::ID_VALUE, "BAR0 ID register reads \"RBLN\" through vfio-user")?;
    check(regs_bar.r32(regs::VERSION) >> 16 == HW_VERSION_MAJOR, "hardware major version matches")?;
    regs_bar.w32(regs::SCRATCH, 0xA5A5_1234);
    check(regs_bar.r32(regs::SCRATCH) == 0xA5A5_1234, "SCRATCH write/read round trip")?;
    check(regs_bar.r64(regs::DRAM_SIZE_64) == dram.map.len() as u64, "DRAM_SIZE equals the BAR2 size")?;
    regs_bar.w32(regs::DEVICE_RESET, regs::RESET_MAGIC);
    check(regs_bar.r32(regs::SCRATCH) == 0, "device reset clears SCRATCH")?;
    dram.w64(0x1000, 0x0123_4567_89AB_CDEF);
    check(dram.r64(0x1000) == 0x0123_4567_89AB_CDEF, "BAR2 DRAM write/read (trapped to the device unless rbln-npu --dram-bar-mmap)")?;

    let p = Pages::new(NPAGES)?;
    // Page tables: L2[0] -> L1, L1[1] -> L0 (VA 2 MiB..4 MiB), three leaves.
    p.write(L2, mmu::va_index(VA_CMDS, 2) * 8, &mmu::table_pte(p.phys[L1]).to_le_bytes());
    p.write(L1, mmu::va_index(VA_CMDS, 1) * 8, &mmu::table_pte(p.phys[L0]).to_le_bytes());
    p.write(L0, mmu::va_index(VA_CMDS, 0) * 8, &mmu::leaf_pte(p.phys[CMDS], Target::Host, true, false).to_le_bytes());
    p.write(L0, mmu::va_index(VA_DATA, 0) * 8, &mmu::leaf_pte(p.phys[DATA], Target::Host, true, true).to_le_bytes());
    p.write(L0, mmu::va_index(VA_DRAM, 0) * 8, &mmu::leaf_pte(0x8000, Target::Dram, true, true).to_le_bytes());
    regs_bar.w64(regs::ctx_reg(2, regs::CTX_PT_ROOT_64), p.phys[L2]);
    regs_bar.w32(regs::ctx_reg(2, regs::CTX_CONTROL), regs::CTX_CONTROL_VALID);

    let q = 3;
    regs_bar.w64(regs::queue_reg(q, regs::Q_RING_BASE_64), p.phys[RING]);
    regs_bar.w32(regs::queue_reg(q, regs::Q_RING_SIZE), 16);
    regs_bar.w32(regs::queue_reg(q, regs::Q_CTX_ID), 2);
    regs_bar.w64(regs::queue_reg(q, regs::Q_STATUS_ADDR_64), p.phys[STATUS]);
    regs_bar.w32(regs::queue_reg(q, regs::Q_CONTROL), qctl::ENABLE);
    check(regs_bar.r32(regs::queue_reg(q, regs::Q_STATE)) == QueueState::Idle as u32, "queue enabled and idle")?;

    let mut e = Encoder::new(Vec::new());
    e.fill(VA_DATA, 64, 0x600D_F00D)
        .dma_copy(VA_DATA, VA_DRAM, 64)
        .timestamp(VA_DATA + 0x200)
        .fence(7, VA_DATA + 0x100, false);
    p.write(CMDS, 0, &e.buf);
    let entry = RingEntry { cmdbuf_va: VA_CMDS, cmdbuf_size: e.buf.len() as u32, ..Default::default() };
    p.write(RING, 0, &entry.to_bytes());
    doorbells.w32(doorbell_page_offset(q), 1);

    let t0 = Instant::now();
    let status = loop {
        let s = QueueStatus::read_from(&p.read(STATUS, 0, 64)).unwrap_or_default();
        if s.fence == 7 || s.state == QueueState::Faulted as u32 || t0.elapsed() > Duration::from_secs(10) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    check(status.fence == 7 && status.head == 1, "fence 7 completes; status block written back to guest RAM")?;
    check(p.read(DATA, 0, 64).chunks(4).all(|c| c == 0x600D_F00Du32.to_le_bytes()), "FILL wrote guest RAM through the device MMU")?;
    check(dram.r32(0x8000) == 0x600D_F00D && dram.r32(0x803C) == 0x600D_F00D, "DMA_COPY guest RAM -> DRAM, seen through BAR2")?;
    check(p.u64_at(DATA, 0x100) == 7, "FENCE wrote its value to memory")?;
    check(p.u64_at(DATA, 0x200) > 0, "TIMESTAMP wrote the device clock")?;
    check(regs_bar.r64(regs::queue_reg(q, regs::Q_FENCE_64)) == 7, "Q_FENCE register reads 7")?;

    // A write to the read-only command page faults the queue, not the device.
    let mut bad = Encoder::new(Vec::new());
    bad.fill(VA_CMDS + 0x800, 4, 1);
    p.write(CMDS, 0x400, &bad.buf);
    let entry = RingEntry { cmdbuf_va: VA_CMDS + 0x400, cmdbuf_size: bad.buf.len() as u32, ..Default::default() };
    p.write(RING, RingEntry::SIZE, &entry.to_bytes());
    doorbells.w32(doorbell_page_offset(q), 2);
    let t0 = Instant::now();
    while regs_bar.r32(regs::queue_reg(q, regs::Q_STATE)) != QueueState::Faulted as u32 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let code = regs_bar.r32(regs::queue_reg(q, regs::Q_FAULT_CODE));
    check(code as u8 == FaultCode::Permission as u8, "write to a read-only page: permission fault")?;
    check(regs_bar.r64(regs::queue_reg(q, regs::Q_FAULT_ADDR_64)) == VA_CMDS + 0x800, "error record holds the faulting VA")?;
    check(regs_bar.r32(regs::IRQ_ERROR_STATUS) & (1 << q) != 0, "error status bit set for the queue")?;
    regs_bar.w32(regs::queue_reg(q, regs::Q_CONTROL), qctl::RESET);
    check(regs_bar.r32(regs::queue_reg(q, regs::Q_STATE)) == QueueState::Disabled as u32, "queue reset clears the fault")?;
    regs_bar.w32(regs::DEVICE_RESET, regs::RESET_MAGIC);
    Ok(())
}

fn main() {
    let result = find_device(std::env::args().nth(1)).and_then(|dev| run(&dev));
    if let Err(e) = result {
        eprintln!("FAIL: {e}");
        std::process::exit(1);
    }
}
