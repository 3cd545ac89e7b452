//! The NPU: register file, queues and their command processors.
//!
//! Transport-independent: the vfio-user server (`vfio.rs`) and the host
//! tests drive it through [`Device::bar_read`] / [`Device::bar_write`] and
//! feed it guest memory through [`Device::host_memory`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rbln_hw::pci::{BAR_DOORBELL, BAR_DRAM, BAR_REGS, DOORBELL_TAIL};
use rbln_hw::regs::{self, qctl};
use rbln_hw::ring::{fault_code_reg, Access, FaultCode, QueueState, QueueStatus};
use rbln_hw::{PAGE_SIZE, HW_VERSION};

use crate::engines::{Counters, EnginePool};
use crate::exec;
use crate::faults::{Injector, Kind, Plan};
use crate::memory::{Dram, HostMemory};
use crate::mmu::{Fault, Invalidation};

/// Device configuration (the server's command line).
#[derive(Clone, Debug)]
pub struct Config {
    pub dram_size: u64,
    pub num_queues: u32,
    pub num_cores: u32,
    pub num_dma_engines: u32,
    /// Value of the VERSION register. Only tests set it to something other
    /// than [`HW_VERSION`], to check that drivers refuse unknown hardware.
    pub reported_version: u32,
    /// How long a compute core's helper threads keep spinning for the next
    /// op after one ends (zero: they sleep at once); see `workers`.
    pub spin: std::time::Duration,
    /// Offer BAR2 (DRAM) to the VMM as a mappable region, so that guest
    /// CPU loads and stores reach the memfd without trapping. Off by
    /// default: QEMU's vfio-user client then stops posting MMIO writes for
    /// the whole device (a mapped region could otherwise observe a posted
    /// write before it is applied), and every doorbell write stalls the
    /// vCPU until the server answers. The driver stack reaches DRAM only
    /// by DMA; trapped BAR2 accesses still work, slowly.
    pub dram_bar_mmap: bool,
}

/// Device DRAM of the default configuration (`rbln-npu --dram-mib`), in
/// MiB: room for the weights and activations of the classic large
/// classifiers (VGG-16/19 hold about 550 MB of weights) with a second
/// model beside them. The memfd behind it is only backed where written.
pub const DEFAULT_DRAM_MIB: u64 = 2048;

impl Default for Config {
    fn default() -> Self {
        Self {
            dram_size: DEFAULT_DRAM_MIB << 20,
            num_queues: 16,
            num_cores: 2,
            num_dma_engines: 2,
            reported_version: HW_VERSION,
            spin: crate::workers::DEFAULT_SPIN,
            dram_bar_mmap: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("DRAM size must be a power of two between 1 MiB and 64 GiB, got {0}")]
    DramSize(u64),
    #[error("queue count must be {min}..={max}, got {0}", min = regs::MIN_QUEUES, max = regs::MAX_QUEUES)]
    Queues(u32),
    #[error("compute core count must be 1..={max}, got {0}", max = regs::MAX_CORES)]
    Cores(u32),
    #[error("DMA engine count must be 1..={max}, got {0}", max = regs::MAX_DMA_ENGINES)]
    DmaEngines(u32),
    #[error("cannot create device DRAM: {0}")]
    Dram(#[from] std::io::Error),
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.dram_size.is_power_of_two() || !(1 << 20..=64 << 30).contains(&self.dram_size) {
            return Err(ConfigError::DramSize(self.dram_size));
        }
        if !(regs::MIN_QUEUES..=regs::MAX_QUEUES).contains(&self.num_queues) {
            return Err(ConfigError::Queues(self.num_queues));
        }
        if !(1..=regs::MAX_CORES).contains(&self.num_cores) {
            return Err(ConfigError::Cores(self.num_cores));
        }
        if !(1..=regs::MAX_DMA_ENGINES).contains(&self.num_dma_engines) {
            return Err(ConfigError::DmaEngines(self.num_dma_engines));
        }
        Ok(())
    }
}

/// Where interrupts go: MSI-X eventfds in the server, a recorder in tests.
pub trait IrqSink: Send + Sync {
    fn raise(&self, vector: u32);
}

struct NoIrq;
impl IrqSink for NoIrq {
    fn raise(&self, _vector: u32) {}
}

#[derive(Clone, Copy, Default)]
struct ContextRegs {
    pt_root: u64,
    valid: bool,
}

struct GlobalRegs {
    scratch: u32,
    irq_queue_status: u32,
    irq_queue_mask: u32,
    irq_error_status: u32,
    irq_error_mask: u32,
    error_count: u32,
    contexts: [ContextRegs; regs::MAX_CONTEXTS as usize],
}

impl GlobalRegs {
    fn reset_value() -> Self {
        Self {
            scratch: 0,
            irq_queue_status: 0,
            irq_queue_mask: u32::MAX,
            irq_error_status: 0,
            irq_error_mask: u32::MAX,
            error_count: 0,
            contexts: [ContextRegs::default(); regs::MAX_CONTEXTS as usize],
        }
    }
}

/// One queue's registers and execution state.
pub(crate) struct QueueRegs {
    pub ring_base: u64,
    pub ring_size: u32,
    pub ctx_id: u32,
    pub status_addr: u64,
    pub enabled: bool,
    pub state: QueueState,
    pub head: u32,
    pub tail: u32,
    pub fence: u64,
    pub fault_code: u32,
    pub fault_ring_index: u32,
    pub fault_addr: u64,
    pub packets: u64,
    /// Q_BUSY_NS_64.
    pub busy_ns: u64,
    /// Bumped whenever the queue is reset or disabled; work started under
    /// an older generation is abandoned.
    pub generation: u64,
    /// The command processor is executing a ring entry.
    pub busy: bool,
}

impl QueueRegs {
    fn new() -> Self {
        Self {
            ring_base: 0,
            ring_size: 0,
            ctx_id: 0,
            status_addr: 0,
            enabled: false,
            state: QueueState::Disabled,
            head: 0,
            tail: 0,
            fence: 0,
            fault_code: 0,
            fault_ring_index: 0,
            fault_addr: 0,
            packets: 0,
            busy_ns: 0,
            generation: 0,
            busy: false,
        }
    }

    /// What a corrupted write-back (fault injection) carries instead of the status
    /// block: a head beyond any ring, no state, a fence far ahead.
    fn corrupt_status_block(&self) -> QueueStatus {
        QueueStatus { head: 0xDEAD_BEEF, state: 0xBAD, fence: self.fence ^ (0xDEAD << 40), ..self.status_block() }
    }

    pub fn status_block(&self) -> QueueStatus {
        QueueStatus {
            head: self.head,
            state: self.state as u32,
            fence: self.fence,
            fault_code: self.fault_code,
            fault_ring_index: self.fault_ring_index,
            fault_addr: self.fault_addr,
            packets: self.packets,
            reserved: [0; 3],
        }
    }

    fn config_ok(&self) -> bool {
        self.ring_base.is_multiple_of(PAGE_SIZE)
            && self.ring_size.is_power_of_two()
            && (rbln_hw::ring::MIN_RING_ENTRIES..=rbln_hw::ring::MAX_RING_ENTRIES).contains(&self.ring_size)
            && self.ctx_id < regs::MAX_CONTEXTS
            && self.status_addr.is_multiple_of(64)
            && self.tail < self.ring_size
    }
}

pub(crate) struct Queue {
    pub index: u32,
    pub regs: Mutex<QueueRegs>,
    pub cv: Condvar,
    /// `regs.generation`, readable without the lock: a command processor
    /// checks it between packets.
    pub generation: AtomicU64,
}

impl Queue {
    pub fn lock(&self) -> MutexGuard<'_, QueueRegs> {
        self.regs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// State shared by the register interface and the command processors.
pub(crate) struct Shared {
    pub cfg: Config,
    pub host: HostMemory,
    pub dram: Dram,
    irq: RwLock<Arc<dyn IrqSink>>,
    start: Instant,
    global: Mutex<GlobalRegs>,
    pub queues: Vec<Queue>,
    /// Per-context TLB shoot-down state (MMU_INVALIDATE).
    pub invalidation: Vec<Invalidation>,
    pub counters: Counters,
    pub dma_engines: EnginePool,
    pub cores: EnginePool,
    /// Signalled by SEM_SIGNAL so that SEM_WAITs re-check promptly.
    pub sem_lock: Mutex<u64>,
    pub sem_cv: Condvar,
    pub shutdown: AtomicBool,
    /// Set by `Device::fall_off_bus`: the function no longer answers.
    pub off_bus: AtomicBool,
    /// Fault injection (the harness's, never the guest's).
    pub faults: Injector,
    /// A `die` fault fired on a command processor: it takes the device
    /// off the bus once it has let go of its job.
    pub die: AtomicBool,
}

/// The device. Dropping it stops its command processors.
pub struct Device {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Device {
    pub fn new(cfg: Config) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let dram = Dram::new(cfg.dram_size, cfg.dram_bar_mmap)?;
        let shared = Arc::new(Shared {
            host: HostMemory::default(),
            dram,
            irq: RwLock::new(Arc::new(NoIrq)),
            start: Instant::now(),
            global: Mutex::new(GlobalRegs::reset_value()),
            queues: (0..cfg.num_queues)
                .map(|index| Queue { index, regs: Mutex::new(QueueRegs::new()), cv: Condvar::new(), generation: AtomicU64::new(0) })
                .collect(),
            invalidation: (0..regs::MAX_CONTEXTS).map(|_| Invalidation::default()).collect(),
            counters: Counters::default(),
            dma_engines: EnginePool::new(cfg.num_dma_engines),
            cores: EnginePool::new(cfg.num_cores),
            sem_lock: Mutex::new(0),
            sem_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            off_bus: AtomicBool::new(false),
            faults: Injector::default(),
            die: AtomicBool::new(false),
            cfg,
        });
        let threads = (0..shared.cfg.num_queues)
            .map(|q| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("rbln-cp{q}"))
                    .spawn(move || command_processor(&s, q as usize))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { shared, threads })
    }

    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// Guest memory shared with the device (DMA_MAP / DMA_UNMAP).
    pub fn host_memory(&self) -> &HostMemory {
        &self.shared.host
    }

    pub fn dram(&self) -> &Dram {
        &self.shared.dram
    }

    pub fn set_irq_sink(&self, sink: Arc<dyn IrqSink>) {
        *self.shared.irq.write().unwrap_or_else(|e| e.into_inner()) = sink;
    }

    /// Read from a BAR. Sizes 1, 2, 4 and 8 are accepted; anything the
    /// device does not define reads as 0. Once off the bus, every read
    /// completes with all ones (a PCIe master abort).
    pub fn bar_read(&self, bar: u32, off: u64, data: &mut [u8]) {
        if self.is_off_bus() {
            data.fill(0xff);
            return;
        }
        data.fill(0);
        match bar {
            BAR_REGS => {
                if data.len() == 8 && off.is_multiple_of(8) {
                    if let Some(v) = self.shared.reg_read64(off) {
                        data.copy_from_slice(&v.to_le_bytes()); // one snapshot: no tearing
                        return;
                    }
                }
                let aligned = off & !3;
                let mut bytes = [0u8; 8];
                bytes[..4].copy_from_slice(&self.shared.reg_read32(aligned).to_le_bytes());
                bytes[4..].copy_from_slice(&self.shared.reg_read32(aligned + 4).to_le_bytes());
                let start = (off - aligned) as usize;
                let n = data.len().min(8 - start);
                data[..n].copy_from_slice(&bytes[start..start + n]);
            }
            BAR_DRAM => {
                let _ = self.shared.dram.read(off, data);
            }
            BAR_DOORBELL
                if off % PAGE_SIZE == DOORBELL_TAIL && data.len() == 4 => {
                    if let Some(q) = self.shared.queues.get((off / PAGE_SIZE) as usize) {
                        data.copy_from_slice(&q.lock().tail.to_le_bytes());
                    }
                }
            _ => {}
        }
    }

    /// Write to a BAR. Registers take 4- and 8-byte writes; others are
    /// ignored (and logged).
    pub fn bar_write(&self, bar: u32, off: u64, data: &[u8]) {
        if self.is_off_bus() {
            return;
        }
        match bar {
            BAR_REGS => match data.len() {
                4 => self.shared.reg_write32(off, u32::from_le_bytes([data[0], data[1], data[2], data[3]])),
                8 => {
                    let v = u64::from_le_bytes(data.try_into().unwrap_or([0; 8]));
                    self.shared.reg_write32(off, v as u32);
                    self.shared.reg_write32(off + 4, (v >> 32) as u32);
                }
                n => log::warn!("ignored {n}-byte register write at {off:#x}"),
            },
            BAR_DRAM
                if self.shared.dram.write(off, data).is_err() => {
                    log::warn!("DRAM write outside BAR2 at {off:#x}");
                }
            BAR_DOORBELL
                if off % PAGE_SIZE == DOORBELL_TAIL && data.len() == 4 => {
                    if let Some(q) = self.shared.queues.get((off / PAGE_SIZE) as usize) {
                        self.shared.write_tail(q, u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
                    }
                }
            _ => {}
        }
    }

    /// True while every command processor is alive. The device model is
    /// built never to panic; tests assert this after hostile input.
    pub fn healthy(&self) -> bool {
        self.threads.iter().all(|t| !t.is_finished())
    }

    /// Whole-device reset (also what a PCI function reset does).
    pub fn reset(&self) {
        if !self.is_off_bus() {
            self.shared.device_reset();
        }
    }

    /// Surprise removal as the host sees it, without the vfio-user peer
    /// going away (QEMU 11.1's client aborts the whole VM when it does):
    /// every queue stops, no interrupt or DMA reaches the host again, and
    /// from now on register and config reads return all ones and writes
    /// are dropped. There is no way back; a new device model is a new
    /// device.
    pub fn fall_off_bus(&self) {
        self.shared.fall_off_bus();
    }

    /// Arm a fault-injection plan; irq-spurious fires at once: `count`
    /// interrupts (at least one) spread over the vectors, none with
    /// anything pending.
    pub fn inject(&self, plan: Plan) {
        if plan.kind != Kind::IrqSpurious {
            return self.shared.faults.arm(plan);
        }
        log::warn!("fault injected: {plan}");
        for i in 0..plan.count.clamp(1, 1 << 20) {
            let vector = match plan.queue {
                Some(q) => regs::queue_vector(q),
                None => (i % regs::MSIX_VECTORS as u64) as u32,
            };
            self.shared.raise(vector);
            self.shared.faults.record(Kind::IrqSpurious);
        }
    }

    pub fn faults(&self) -> &Injector {
        &self.shared.faults
    }

    pub fn is_off_bus(&self) -> bool {
        self.shared.off_bus.load(Ordering::SeqCst)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for q in &self.shared.queues {
            let _g = q.lock();
            q.cv.notify_all();
        }
        self.shared.sem_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn lo(v: u64) -> u32 {
    v as u32
}
fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}
fn set_half(v: &mut u64, high: bool, x: u32) {
    if high {
        *v = (*v & 0xFFFF_FFFF) | (x as u64) << 32;
    } else {
        *v = (*v & !0xFFFF_FFFF) | x as u64;
    }
}

impl Shared {
    fn global(&self) -> MutexGuard<'_, GlobalRegs> {
        self.global.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn raise(&self, vector: u32) {
        let sink = self.irq.read().unwrap_or_else(|e| e.into_inner()).clone();
        sink.raise(vector);
    }

    /// Raise `vector` for queue `q`'s fence or fault, unless an injected
    /// fault drops or delays it.
    fn interrupt(&self, vector: u32, q: u32) {
        if self.faults.fire(Kind::IrqDrop, Some(q)).is_some() {
            return;
        }
        if let Some(p) = self.faults.fire(Kind::IrqDelay, Some(q)) {
            let sink = self.irq.read().unwrap_or_else(|e| e.into_inner()).clone();
            let delay = Duration::from_millis(p.delay_ms);
            let late = std::thread::Builder::new().name("rbln-irq-delay".into()).spawn(move || {
                std::thread::sleep(delay);
                sink.raise(vector);
            });
            if late.is_err() {
                self.raise(vector); // no thread: on time after all
            }
            return;
        }
        self.raise(vector);
    }

    /// Surprise removal (see `Device::fall_off_bus`).
    pub fn fall_off_bus(&self) {
        if self.off_bus.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.irq.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(NoIrq);
        self.host.clear();
        self.device_reset();
        log::warn!("fell off the bus: reads return all ones from now on");
    }

    /// Context `ctx`'s page-table root, if the context is valid.
    pub fn context_root(&self, ctx: u32) -> Option<u64> {
        let g = self.global();
        g.contexts.get(ctx as usize).filter(|c| c.valid).map(|c| c.pt_root & !(PAGE_SIZE - 1))
    }

    /// A FENCE packet with the IRQ flag completed on queue `q`.
    pub fn queue_interrupt(&self, q: u32) {
        let fire = {
            let mut g = self.global();
            g.irq_queue_status |= 1 << q;
            g.irq_queue_mask & (1 << q) == 0
        };
        if fire {
            self.interrupt(regs::queue_vector(q), q);
        }
    }

    /// Record a fault on queue `q` (its lock held by the caller through
    /// `r`), stop the queue and raise the error interrupt.
    fn record_fault(&self, q: u32, r: &mut QueueRegs, fault: Fault, depth: u8) {
        r.state = QueueState::Faulted;
        r.fault_code = fault_code_reg(fault.code, fault.access, depth);
        r.fault_ring_index = r.head;
        r.fault_addr = fault.addr;
        self.write_status(q, r);
        Counters::add(&self.counters.faults, 1);
        log::info!("queue {q}: fault {} ({:?}) at {:#x}", fault.code.name(), fault.access, fault.addr);
        let fire = {
            let mut g = self.global();
            g.error_count = g.error_count.wrapping_add(1);
            g.irq_error_status |= 1 << q;
            g.irq_error_mask & (1 << q) == 0
        };
        if fire {
            self.interrupt(regs::MSIX_ERROR_VECTOR, q);
        }
    }

    /// Write queue `q`'s status block to host memory, if it has one.
    pub fn write_status(&self, q: u32, r: &QueueRegs) {
        if r.status_addr == 0 {
            return;
        }
        let block = match self.faults.fire(Kind::StatusCorrupt, Some(q)) {
            Some(_) => r.corrupt_status_block(),
            None => r.status_block(),
        };
        if self.host.write(r.status_addr, &block.to_bytes()).is_err() {
            log::warn!("status block at {:#x} is not in shared memory", r.status_addr);
        }
    }

    fn write_tail(&self, q: &Queue, tail: u32) {
        let mut r = q.lock();
        if r.ring_size != 0 && tail >= r.ring_size {
            if r.enabled && r.state != QueueState::Faulted {
                self.record_fault(q.index, &mut r, Fault::new(FaultCode::BadDoorbell, Access::None, tail as u64), 0);
            }
            return;
        }
        r.tail = tail;
        if r.enabled && r.state == QueueState::Idle && r.head != r.tail {
            r.state = QueueState::Running;
        }
        q.cv.notify_all();
    }

    /// Stop queue `q`: abandon in-flight work and wait until its command
    /// processor let go of it.
    fn stop_queue<'a>(&self, q: &'a Queue) -> MutexGuard<'a, QueueRegs> {
        let mut r = q.lock();
        r.enabled = false;
        r.generation += 1;
        q.generation.store(r.generation, Ordering::Release);
        q.cv.notify_all();
        self.sem_cv.notify_all();
        while r.busy {
            r = q.cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        r
    }

    /// Queue reset (Q_CONTROL.RESET); `report` writes the status block.
    fn queue_reset(&self, q: &Queue, report: bool) {
        let mut r = self.stop_queue(q);
        r.head = 0;
        r.tail = 0;
        r.state = QueueState::Disabled;
        r.fault_code = 0;
        r.fault_ring_index = 0;
        r.fault_addr = 0;
        r.packets = 0;
        r.busy_ns = 0;
        r.fence = 0;
        if report {
            self.write_status(q.index, &r);
        }
        drop(r);
        let mut g = self.global();
        g.irq_error_status &= !(1 << q.index);
        g.irq_queue_status &= !(1 << q.index);
    }

    fn queue_control(&self, q: &Queue, v: u32) {
        if v & qctl::RESET != 0 {
            self.queue_reset(q, true);
        }
        let enable = v & qctl::ENABLE != 0;
        let mut r = q.lock();
        if enable && !r.enabled {
            if r.state == QueueState::Faulted {
                return; // only a reset leaves Faulted
            }
            if !r.config_ok() {
                r.enabled = true;
                let base = r.ring_base;
                self.record_fault(q.index, &mut r, Fault::new(FaultCode::BadQueueConfig, Access::None, base), 0);
                return;
            }
            r.enabled = true;
            r.state = if r.head == r.tail { QueueState::Idle } else { QueueState::Running };
            self.write_status(q.index, &r);
            q.cv.notify_all();
        } else if !enable && r.enabled {
            drop(r);
            let mut r = self.stop_queue(q);
            if r.state != QueueState::Faulted {
                r.state = QueueState::Disabled;
            }
            self.write_status(q.index, &r);
        }
    }

    fn device_reset(&self) {
        // Status blocks are not written: their memory may already be gone.
        for q in &self.queues {
            self.queue_reset(q, false);
            let mut r = q.lock();
            *r = QueueRegs { generation: r.generation, ..QueueRegs::new() };
        }
        *self.global() = GlobalRegs::reset_value();
        self.counters.reset();
        self.dma_engines.reset_counters();
        self.cores.reset_counters();
    }

    fn queue_for(&self, off: u64) -> Option<(&Queue, u64)> {
        let rel = off.checked_sub(regs::QUEUE_BASE)?;
        let q = self.queues.get((rel / regs::QUEUE_STRIDE) as usize)?;
        Some((q, rel % regs::QUEUE_STRIDE))
    }

    fn context_index(off: u64) -> Option<(usize, u64)> {
        let rel = off.checked_sub(regs::CTX_BASE)?;
        let i = (rel / regs::CTX_STRIDE) as usize;
        (i < regs::MAX_CONTEXTS as usize).then_some((i, rel % regs::CTX_STRIDE))
    }

    /// The value of the 64-bit register at 8-aligned offset `off`, if any.
    fn reg_read64(&self, off: u64) -> Option<u64> {
        let c = &self.counters;
        Some(match off {
            regs::DRAM_SIZE_64 => self.cfg.dram_size,
            regs::TIMESTAMP_64 => self.now_ns(),
            regs::CNT_PACKETS_64 => Counters::get(&c.packets),
            regs::CNT_DMA_BYTES_64 => Counters::get(&c.dma_bytes),
            regs::CNT_COMPUTE_OPS_64 => Counters::get(&c.compute_ops),
            regs::CNT_COMPUTE_FLOPS_64 => Counters::get(&c.compute_flops),
            regs::CNT_FAULTS_64 => Counters::get(&c.faults),
            o if (regs::CNT_DMA_BUSY_NS_64..regs::CNT_DMA_BUSY_NS_64 + 8 * regs::MAX_DMA_ENGINES as u64).contains(&o) => {
                self.dma_engines.busy_ns(((o - regs::CNT_DMA_BUSY_NS_64) / 8) as usize)
            }
            o if (regs::CNT_CORE_BUSY_NS_64..regs::CNT_CORE_BUSY_NS_64 + 8 * regs::MAX_CORES as u64).contains(&o) => {
                self.cores.busy_ns(((o - regs::CNT_CORE_BUSY_NS_64) / 8) as usize)
            }
            o => {
                if let Some((i, reg)) = Self::context_index(o) {
                    return (reg == regs::CTX_PT_ROOT_64).then(|| self.global().contexts[i].pt_root);
                }
                let (q, reg) = self.queue_for(o)?;
                let r = q.lock();
                match reg {
                    regs::Q_RING_BASE_64 => r.ring_base,
                    regs::Q_STATUS_ADDR_64 => r.status_addr,
                    regs::Q_FENCE_64 => r.fence,
                    regs::Q_FAULT_ADDR_64 => r.fault_addr,
                    regs::Q_PACKETS_64 => r.packets,
                    regs::Q_BUSY_NS_64 => r.busy_ns,
                    _ => return None,
                }
            }
        })
    }

    pub fn reg_read32(&self, off: u64) -> u32 {
        if let Some(v) = self.reg_read64(off & !7) {
            return if off & 4 == 0 { lo(v) } else { hi(v) };
        }
        let g = || self.global();
        match off {
            regs::ID => regs::ID_VALUE,
            regs::VERSION => self.cfg.reported_version,
            regs::CAPS => regs::caps::ALL,
            regs::NUM_QUEUES => self.cfg.num_queues,
            regs::NUM_CORES => self.cfg.num_cores,
            regs::NUM_DMA_ENGINES => self.cfg.num_dma_engines,
            regs::NUM_CONTEXTS => regs::MAX_CONTEXTS,
            regs::NUM_MSIX_VECTORS => regs::MSIX_VECTORS,
            regs::STATUS => regs::status::READY,
            regs::SCRATCH => g().scratch,
            regs::IRQ_QUEUE_STATUS => g().irq_queue_status,
            regs::IRQ_QUEUE_MASK => g().irq_queue_mask,
            regs::IRQ_ERROR_STATUS => g().irq_error_status,
            regs::IRQ_ERROR_MASK => g().irq_error_mask,
            regs::ERROR_COUNT => g().error_count,
            o => {
                if let Some((i, reg)) = Self::context_index(o) {
                    return if reg == regs::CTX_CONTROL { g().contexts[i].valid as u32 } else { 0 };
                }
                let Some((q, reg)) = self.queue_for(o) else { return 0 };
                let r = q.lock();
                match reg {
                    regs::Q_RING_SIZE => r.ring_size,
                    regs::Q_CTX_ID => r.ctx_id,
                    regs::Q_CONTROL => r.enabled as u32,
                    regs::Q_STATE => r.state as u32,
                    regs::Q_HEAD => r.head,
                    regs::Q_TAIL => r.tail,
                    regs::Q_FAULT_CODE => r.fault_code,
                    regs::Q_FAULT_RING_INDEX => r.fault_ring_index,
                    _ => 0,
                }
            }
        }
    }

    pub fn reg_write32(&self, off: u64, v: u32) {
        let high = off & 4 != 0;
        match off {
            regs::DEVICE_RESET => {
                if v == regs::RESET_MAGIC {
                    self.device_reset();
                }
            }
            regs::SCRATCH => self.global().scratch = v,
            regs::IRQ_QUEUE_STATUS => self.global().irq_queue_status &= !v,
            regs::IRQ_ERROR_STATUS => self.global().irq_error_status &= !v,
            regs::IRQ_QUEUE_MASK | regs::IRQ_ERROR_MASK => {
                let (pending, vector) = {
                    let mut g = self.global();
                    if off == regs::IRQ_QUEUE_MASK {
                        let newly = g.irq_queue_mask & !v;
                        g.irq_queue_mask = v;
                        (g.irq_queue_status & newly, None)
                    } else {
                        let newly = g.irq_error_mask & !v;
                        g.irq_error_mask = v;
                        (g.irq_error_status & newly, Some(regs::MSIX_ERROR_VECTOR))
                    }
                };
                // Unmasking a pending interrupt delivers it (once).
                for q in (0..32).filter(|q| pending & (1 << q) != 0) {
                    self.interrupt(vector.unwrap_or(regs::queue_vector(q)), q);
                }
            }
            regs::MMU_INVALIDATE => {
                if let Some(inv) = self.invalidation.get(v as usize) {
                    inv.invalidate();
                }
            }
            o => {
                if let Some((i, reg)) = Self::context_index(o) {
                    let mut g = self.global();
                    match reg & !4 {
                        regs::CTX_PT_ROOT_64 => set_half(&mut g.contexts[i].pt_root, high, v),
                        regs::CTX_CONTROL if !high => g.contexts[i].valid = v & regs::CTX_CONTROL_VALID != 0,
                        _ => {}
                    }
                    return;
                }
                let Some((q, reg)) = self.queue_for(o) else { return };
                match reg {
                    regs::Q_CONTROL => return self.queue_control(q, v),
                    regs::Q_TAIL => return self.write_tail(q, v),
                    _ => {}
                }
                let mut r = q.lock();
                if r.enabled {
                    return; // configuration is frozen while the queue runs
                }
                match reg & !4 {
                    regs::Q_RING_BASE_64 => set_half(&mut r.ring_base, high, v),
                    regs::Q_STATUS_ADDR_64 => set_half(&mut r.status_addr, high, v),
                    _ => match reg {
                        regs::Q_RING_SIZE => r.ring_size = v,
                        regs::Q_CTX_ID => r.ctx_id = v,
                        _ => {}
                    },
                }
            }
        }
    }
}

/// Body of queue `qi`'s command-processor thread.
fn command_processor(s: &Shared, qi: usize) {
    let q = &s.queues[qi];
    // Created with the queue's first job (most queues never get one) and
    // dropped on this thread when it exits.
    let mut workers: Option<crate::workers::Workers> = None;
    loop {
        let job = {
            let mut r = q.lock();
            loop {
                if s.shutdown.load(Ordering::SeqCst) {
                    return;
                }
                if r.enabled && r.state != QueueState::Faulted && r.head != r.tail {
                    break;
                }
                r = q.cv.wait(r).unwrap_or_else(|e| e.into_inner());
            }
            r.busy = true;
            r.state = QueueState::Running;
            exec::Job {
                queue: q.index,
                generation: r.generation,
                ring_base: r.ring_base,
                head: r.head,
                ctx_id: r.ctx_id,
            }
        };
        let workers = workers.get_or_insert_with(|| crate::workers::Workers::join(s.cfg.spin));
        workers.job_start();
        let result = exec::run_ring_entry(s, &job, workers);
        let mut r = q.lock();
        r.busy = false;
        if r.generation == job.generation {
            match result {
                // A fault raised meanwhile (a bad doorbell) stands.
                Ok(()) if r.state == QueueState::Faulted => {}
                Ok(()) => {
                    r.head = (r.head + 1) % r.ring_size.max(1);
                    r.state = if r.head == r.tail { QueueState::Idle } else { QueueState::Running };
                    s.write_status(q.index, &r);
                }
                Err(exec::Stop::Fault(f, depth)) => s.record_fault(q.index, &mut r, f, depth),
                Err(exec::Stop::Aborted) => {}
            }
        }
        q.cv.notify_all();
        drop(r);
        if s.die.swap(false, Ordering::SeqCst) {
            s.fall_off_bus();
        }
    }
}

/// Wait helper for SEM_WAIT: sleep until a SEM_SIGNAL or `timeout`.
pub(crate) fn sem_sleep(s: &Shared, timeout: Duration) {
    let g = s.sem_lock.lock().unwrap_or_else(|e| e.into_inner());
    let _ = s.sem_cv.wait_timeout(g, timeout);
}
