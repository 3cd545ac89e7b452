//! A test rig that plays the driver: fake guest RAM shared with the
//! device, page tables, queues and a doorbell, all through the device's
//! register interface.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rbln_hw::mmu::{self, Target};
use rbln_hw::pci::{doorbell_page_offset, BAR_DOORBELL, BAR_REGS};
use rbln_hw::regs::{self, qctl};
use rbln_hw::ring::{QueueState, QueueStatus, RingEntry};
use rbln_hw::PAGE_SIZE;
use rbln_npu::memory::{memfd, Mapping};
use rbln_npu::{Config, Device, IrqSink};

/// Bus address of the fake guest RAM shared with the device.
pub const RAM_BASE: u64 = 0x4000_0000;
pub const RAM_SIZE: u64 = 64 << 20;
/// A further range of guest RAM that is *not* shared with the device; it
/// holds a canary that must survive anything a command does.
pub const PRIVATE_SIZE: u64 = 1 << 20;

/// Counts interrupts per MSI-X vector.
#[derive(Default)]
pub struct IrqCounter {
    pub counts: [AtomicU32; regs::MSIX_VECTORS as usize],
}

impl IrqSink for IrqCounter {
    fn raise(&self, vector: u32) {
        self.counts[vector as usize].fetch_add(1, Ordering::SeqCst);
    }
}

impl IrqCounter {
    pub fn get(&self, v: u32) -> u32 {
        self.counts[v as usize].load(Ordering::SeqCst)
    }
}

pub struct Rig {
    pub dev: Device,
    /// The driver's view of all guest RAM (shared part first, then private).
    pub ram: Mapping,
    next_free: u64,
    pub irqs: Arc<IrqCounter>,
}

#[derive(Clone, Copy)]
pub struct Ctx {
    pub id: u32,
    pub root: u64,
}

pub struct Queue {
    pub index: u32,
    pub ring: u64,
    pub status: u64,
    pub entries: u32,
    pub tail: u32,
}

impl Rig {
    pub fn new() -> Self {
        Self::with_config(Config { dram_size: 16 << 20, ..Config::default() })
    }

    pub fn with_config(cfg: Config) -> Self {
        let dev = Device::new(cfg).expect("device");
        let file = memfd("guest-ram", RAM_SIZE + PRIVATE_SIZE).unwrap();
        let ram = Mapping::new(&file, 0, RAM_SIZE + PRIVATE_SIZE).unwrap();
        dev.host_memory().map(RAM_BASE, Mapping::new(&file, 0, RAM_SIZE).unwrap()).unwrap();
        ram.fill(RAM_SIZE, PRIVATE_SIZE, 0xC0DE_CAFE).unwrap();
        let irqs = Arc::new(IrqCounter::default());
        dev.set_irq_sink(irqs.clone());
        Self { dev, ram, next_free: RAM_BASE, irqs }
    }

    pub fn private_canary_intact(&self) -> bool {
        let mut b = vec![0u8; PRIVATE_SIZE as usize];
        self.ram.read(RAM_SIZE, &mut b).unwrap();
        b.chunks_exact(4).all(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) == 0xC0DE_CAFE)
    }

    /// Allocate zeroed, page-aligned guest RAM; returns its bus address.
    pub fn alloc(&mut self, bytes: u64) -> u64 {
        let addr = self.next_free;
        let len = bytes.div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE;
        assert!(addr + len <= RAM_BASE + RAM_SIZE, "fake guest RAM exhausted");
        self.next_free += len;
        self.ram.fill(addr - RAM_BASE, len, 0).unwrap();
        addr
    }

    /// One past the last allocated bus address.
    pub fn alloc_end(&self) -> u64 {
        self.next_free
    }

    pub fn write(&self, bus: u64, data: &[u8]) {
        self.ram.write(bus - RAM_BASE, data).unwrap();
    }

    pub fn read(&self, bus: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.ram.read(bus - RAM_BASE, &mut b).unwrap();
        b
    }

    pub fn read_u64(&self, bus: u64) -> u64 {
        u64::from_le_bytes(self.read(bus, 8).try_into().unwrap())
    }

    pub fn write_f32s(&self, bus: u64, v: &[f32]) {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.write(bus, &b);
    }

    pub fn read_f32s(&self, bus: u64, n: usize) -> Vec<f32> {
        self.read(bus, n * 4).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    pub fn dram_read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.dev.dram().read(off, &mut b).unwrap();
        b
    }

    pub fn reg32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.dev.bar_read(BAR_REGS, off, &mut b);
        u32::from_le_bytes(b)
    }

    pub fn reg64(&self, off: u64) -> u64 {
        let mut b = [0u8; 8];
        self.dev.bar_read(BAR_REGS, off, &mut b);
        u64::from_le_bytes(b)
    }

    pub fn set32(&self, off: u64, v: u32) {
        self.dev.bar_write(BAR_REGS, off, &v.to_le_bytes());
    }

    pub fn set64(&self, off: u64, v: u64) {
        self.dev.bar_write(BAR_REGS, off, &v.to_le_bytes());
    }

    /// Create context `id` with an empty page table and mark it valid.
    pub fn context(&mut self, id: u32) -> Ctx {
        let root = self.alloc(PAGE_SIZE);
        self.set64(regs::ctx_reg(id, regs::CTX_PT_ROOT_64), root);
        self.set32(regs::ctx_reg(id, regs::CTX_CONTROL), regs::CTX_CONTROL_VALID);
        Ctx { id, root }
    }

    /// The next-level table under `table[index]`, created if missing.
    fn table(&mut self, table: u64, index: usize) -> u64 {
        let e = self.read_u64(table + index as u64 * 8);
        if e & mmu::PTE_VALID != 0 {
            return e & mmu::PTE_ADDR_MASK;
        }
        let t = self.alloc(PAGE_SIZE);
        self.write(table + index as u64 * 8, &mmu::table_pte(t).to_le_bytes());
        t
    }

    /// Map [va, va+len) to `target` memory starting at `addr`.
    #[allow(clippy::too_many_arguments)] // one PTE's worth of fields
    pub fn map(&mut self, ctx: &Ctx, va: u64, target: Target, addr: u64, len: u64, read: bool, write: bool) {
        let mut off = 0;
        while off < len {
            let v = va + off;
            let l1 = self.table(ctx.root, mmu::va_index(v, 2));
            let l0 = self.table(l1, mmu::va_index(v, 1));
            let pte = mmu::leaf_pte(addr + off, target, read, write);
            self.write(l0 + mmu::va_index(v, 0) as u64 * 8, &pte.to_le_bytes());
            off += PAGE_SIZE;
        }
    }

    /// Allocate host RAM of `len` bytes and map it read-write at `va`.
    pub fn host_buffer(&mut self, ctx: &Ctx, va: u64, len: u64) -> u64 {
        let bus = self.alloc(len);
        self.map(ctx, va, Target::Host, bus, len.div_ceil(PAGE_SIZE) * PAGE_SIZE, true, true);
        bus
    }

    /// Set up queue `index` on `ctx` with a ring of `entries` and enable it.
    pub fn queue(&mut self, index: u32, ctx: &Ctx, entries: u32) -> Queue {
        let ring = self.alloc(entries as u64 * RingEntry::SIZE as u64);
        let status = self.alloc(64);
        self.set64(regs::queue_reg(index, regs::Q_RING_BASE_64), ring);
        self.set32(regs::queue_reg(index, regs::Q_RING_SIZE), entries);
        self.set32(regs::queue_reg(index, regs::Q_CTX_ID), ctx.id);
        self.set64(regs::queue_reg(index, regs::Q_STATUS_ADDR_64), status);
        self.set32(regs::queue_reg(index, regs::Q_CONTROL), qctl::ENABLE);
        Queue { index, ring, status, entries, tail: 0 }
    }

    /// Put a command buffer on the ring and ring the doorbell.
    pub fn submit(&self, q: &mut Queue, cmdbuf_va: u64, size: u32) {
        let e = RingEntry { cmdbuf_va, cmdbuf_size: size, flags: 0, tag: 0, reserved: 0 };
        self.write(q.ring + q.tail as u64 * RingEntry::SIZE as u64, &e.to_bytes());
        q.tail = (q.tail + 1) % q.entries;
        self.doorbell(q.index, q.tail);
    }

    pub fn doorbell(&self, q: u32, tail: u32) {
        self.dev.bar_write(BAR_DOORBELL, doorbell_page_offset(q), &tail.to_le_bytes());
    }

    /// Write a command buffer to host RAM mapped at `va` and submit it.
    pub fn run(&mut self, ctx: &Ctx, q: &mut Queue, va: u64, cmds: &[u8]) {
        let bus = self.host_buffer(ctx, va, cmds.len() as u64);
        self.write(bus, cmds);
        self.submit(q, va, cmds.len() as u32);
    }

    pub fn status(&self, q: &Queue) -> QueueStatus {
        QueueStatus::read_from(&self.read(q.status, 64)).unwrap()
    }

    /// Wait until the queue consumed everything or stopped.
    pub fn wait_idle(&self, q: &Queue, timeout: Duration) -> QueueStatus {
        let t0 = Instant::now();
        loop {
            let s = self.status(q);
            let state = QueueState::from_u32(self.reg32(regs::queue_reg(q.index, regs::Q_STATE)));
            if state == Some(QueueState::Faulted) || (s.head == q.tail && state == Some(QueueState::Idle)) {
                return self.status(q);
            }
            if t0.elapsed() > timeout {
                return s;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn state(&self, q: &Queue) -> QueueState {
        QueueState::from_u32(self.reg32(regs::queue_reg(q.index, regs::Q_STATE))).unwrap()
    }

    pub fn reset_queue(&self, q: &mut Queue) {
        self.set32(regs::queue_reg(q.index, regs::Q_CONTROL), qctl::RESET);
        q.tail = 0;
    }
}
