//! Executing ring entries: reading command buffers through the context's
//! MMU and running their packets.

use std::time::Duration;

use rbln_hw::cmd::{self, Packet, MAX_INDIRECT_DEPTH};
use rbln_hw::ring::{Access, FaultCode, QueueState, RingEntry, MAX_CMDBUF_SIZE};

use crate::compute;
use crate::device::{sem_sleep, Shared};
use crate::engines::Counters;
use crate::faults::Kind;
use crate::mmu::{AddressSpace, Fault, Piece};
use crate::workers::Workers;

/// What a command processor is working on.
pub(crate) struct Job {
    pub queue: u32,
    pub generation: u64,
    pub ring_base: u64,
    pub head: u32,
    pub ctx_id: u32,
}

/// Why execution of a ring entry stopped early.
pub(crate) enum Stop {
    /// The queue faults (with the INDIRECT depth the fault happened at).
    Fault(Fault, u8),
    /// The queue was reset, disabled or the device is shutting down.
    Aborted,
}

/// DMA moves data in chunks of this size, checking for reset in between.
const DMA_CHUNK: u64 = 1 << 20;
/// A DMA_COPY of at least this many bytes between ranges that do not
/// overlap (in VA space) is split into steps of at most [`DMA_STEP`]
/// bytes copied by all of the queue's compute threads, like a multi-channel
/// DMA engine: one host thread copies well below the memory system's
/// bandwidth (measured in the VM: 1 MiB host->DRAM at 8-9 GB/s on one
/// thread, where a hot-cache memcpy does 28 GB/s).
const DMA_PARALLEL_MIN: u64 = 256 << 10;
const DMA_STEP: usize = 64 << 10;

thread_local! {
    /// The plan of a shared DMA copy, reused by the command processor
    /// thread: its steps (source, destination, bytes, as addresses) and
    /// where each task's run of steps starts (then the end).
    #[allow(clippy::type_complexity)]
    static DMA_STEPS: std::cell::RefCell<(Vec<(usize, usize, usize)>, Vec<usize>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}
/// How often a blocked SEM_WAIT re-reads memory the guest CPU may write.
const SEM_POLL: Duration = Duration::from_micros(200);

/// The queue's packet and busy-time counters are brought up to date at
/// least this often (ns; and at every FENCE and the end of every ring
/// entry), not per packet: each update takes the queue's lock, a large
/// share of a tiny op's cost. Drivers watch Q_PACKETS_64 for progress
/// over tens of milliseconds.
const COUNTER_FLUSH_NS: u64 = 100_000;

struct Exec<'a> {
    s: &'a Shared,
    workers: &'a Workers,
    job: &'a Job,
    mem: AddressSpace<'a>,
    depth: u8,
    /// The descriptor of the COMPUTE packet being run (reused: no
    /// allocation or zeroing per op).
    desc: Box<[u8; compute::MAX_DESC_SIZE]>,
    /// When the current packet started ([`Workers::now_ns`]): the previous
    /// packet's end, so the clock is read once per packet.
    t: u64,
    /// When the current packet ended, if it read the clock itself.
    end: Option<u64>,
    /// Packets run and busy time not yet added to the queue's counters,
    /// and when they last were.
    pending_packets: u64,
    pending_busy_ns: u64,
    flushed_ns: u64,
}

pub(crate) fn run_ring_entry(s: &Shared, job: &Job, workers: &Workers) -> Result<(), Stop> {
    let entry_addr = job.ring_base + job.head as u64 * RingEntry::SIZE as u64;
    let mut raw = [0u8; RingEntry::SIZE];
    s.host
        .read(entry_addr, &mut raw)
        .map_err(|_| Stop::Fault(Fault::new(FaultCode::BusError, Access::Read, entry_addr), 0))?;
    let entry = RingEntry::read_from(&raw).unwrap_or_default();
    let bad_entry = Stop::Fault(Fault::new(FaultCode::BadRingEntry, Access::Read, entry_addr), 0);
    if entry.flags != 0
        || entry.reserved != 0
        || !entry.cmdbuf_size.is_multiple_of(4)
        || !entry.cmdbuf_va.is_multiple_of(4)
        || entry.cmdbuf_size > MAX_CMDBUF_SIZE
    {
        return Err(bad_entry);
    }
    if s.faults.fire(Kind::QueueStall, Some(job.queue)).is_some() {
        stall(s, job)?;
    }
    let root = s
        .context_root(job.ctx_id)
        .ok_or(Stop::Fault(Fault::new(FaultCode::ContextInvalid, Access::None, job.ctx_id as u64), 0))?;
    let inval = &s.invalidation[job.ctx_id as usize];
    let mut ex = Exec {
        s,
        workers,
        job,
        mem: AddressSpace::new(&s.host, &s.dram, root, inval),
        depth: 0,
        desc: Box::new([0; compute::MAX_DESC_SIZE]),
        t: workers.now_ns(),
        end: None,
        pending_packets: 0,
        pending_busy_ns: 0,
        flushed_ns: 0,
    };
    ex.flushed_ns = ex.t;
    let r = ex.run_cmdbuf(entry.cmdbuf_va, entry.cmdbuf_size);
    ex.flush_counters();
    r
}

/// An injected stall: the ring entry makes no progress (the queue stays
/// Running, no packet executes) until the queue is reset or disabled.
fn stall(s: &Shared, job: &Job) -> Result<(), Stop> {
    loop {
        if s.shutdown.load(std::sync::atomic::Ordering::Relaxed) || s.queues[job.queue as usize].lock().generation != job.generation {
            return Err(Stop::Aborted);
        }
        sem_sleep(s, SEM_POLL);
    }
}

impl Exec<'_> {
    fn fault(&self, f: Fault) -> Stop {
        Stop::Fault(f, self.depth)
    }

    fn fault_at(&self, code: FaultCode, access: Access, addr: u64) -> Stop {
        self.fault(Fault::new(code, access, addr))
    }

    /// Abort if the queue was reset or disabled since the job started.
    fn check_live(&self) -> Result<(), Stop> {
        use std::sync::atomic::Ordering;
        if self.s.shutdown.load(Ordering::Relaxed) || self.s.queues[self.job.queue as usize].generation.load(Ordering::Acquire) != self.job.generation {
            return Err(Stop::Aborted);
        }
        Ok(())
    }

    /// Add the packets run and busy time since the last call to the
    /// queue's and the device's counters (a reset meanwhile zeroed them).
    fn flush_counters(&mut self) {
        if self.pending_packets == 0 {
            return;
        }
        Counters::add(&self.s.counters.packets, self.pending_packets);
        let mut r = self.s.queues[self.job.queue as usize].lock();
        if r.generation == self.job.generation {
            r.packets += self.pending_packets;
            r.busy_ns = r.busy_ns.saturating_add(self.pending_busy_ns);
        }
        self.pending_packets = 0;
        self.pending_busy_ns = 0;
        self.flushed_ns = self.t;
    }

    fn run_cmdbuf(&mut self, va: u64, size: u32) -> Result<(), Stop> {
        let buf = self.mem.read_vec(va, size as usize).map_err(|f| self.fault(f))?;
        let mut off = 0usize;
        while off < buf.len() {
            self.check_live()?;
            if self.s.faults.fire(Kind::Die, Some(self.job.queue)).is_some() {
                self.s.die.store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(Stop::Aborted);
            }
            let pkt_va = va + off as u64;
            let (pkt, len) = Packet::decode(&buf[off..]).map_err(|e| {
                log::debug!("bad packet at {pkt_va:#x}: {e:?}");
                self.fault_at(FaultCode::BadPacket, Access::Read, pkt_va)
            })?;
            // Waiting on a semaphore is not work (Q_BUSY_NS_64); an
            // INDIRECT's packets count their own time.
            let timed = !matches!(pkt, Packet::SemWait(_) | Packet::Indirect(_));
            let start = self.t;
            self.run_packet(pkt, pkt_va)?;
            let end = self.end.take().unwrap_or_else(|| self.workers.now_ns());
            self.t = end;
            if timed {
                self.pending_busy_ns = self.pending_busy_ns.saturating_add(end.saturating_sub(start));
            }
            self.pending_packets += 1;
            if end.saturating_sub(self.flushed_ns) >= COUNTER_FLUSH_NS {
                self.flush_counters();
            }
            off += len;
        }
        Ok(())
    }

    fn run_packet(&mut self, pkt: Packet, pkt_va: u64) -> Result<(), Stop> {
        match pkt {
            Packet::Nop { .. } => Ok(()),
            Packet::DmaCopy(p) => self.dma_copy(p.src_va, p.dst_va, p.size),
            Packet::Fill(p) => self.fill(p.dst_va, p.size, p.value),
            Packet::Compute(p) => {
                if p.desc_size as usize > compute::MAX_DESC_SIZE {
                    return Err(self.fault_at(FaultCode::BadDescriptor, Access::Read, p.desc_va));
                }
                let n = p.desc_size as usize;
                self.mem.read(p.desc_va, &mut self.desc[..n]).map_err(|f| self.fault(f))?;
                let s = self.s;
                let core = self.acquire(&s.cores)?;
                let start = if core.waited { self.workers.now_ns() } else { self.t };
                let (desc, mem) = (&self.desc[..n], &mut self.mem);
                let (result, end) = self.workers.run(|| compute::run(mem, desc, p.desc_va));
                core.finish(end.saturating_sub(start));
                self.end = Some(end);
                let flops = result.map_err(|f| self.fault(f))?;
                if flops >= crate::workers::WAKE_WORK {
                    self.workers.shareable();
                }
                Counters::add(&self.s.counters.compute_ops, 1);
                Counters::add(&self.s.counters.compute_flops, flops);
                Ok(())
            }
            Packet::SemWait(p) => self.sem_wait(p.addr_va, p.value, p.cond),
            Packet::SemSignal(p) => {
                // Atomic against other queues' SEM_SIGNALs (not against
                // the guest CPU, which has no device atomics).
                let _g = self.s.sem_lock.lock().unwrap_or_else(|e| e.into_inner());
                self.mem.check(p.addr_va, 8, Access::Write).map_err(|f| self.fault(f))?;
                let old = self.mem.read_u64(p.addr_va).map_err(|f| self.fault(f))?;
                let new = if p.op == cmd::SEM_OP_ADD { old.wrapping_add(p.value) } else { p.value };
                self.mem.write_u64(p.addr_va, new).map_err(|f| self.fault(f))?;
                self.s.sem_cv.notify_all();
                Ok(())
            }
            Packet::Fence(p) => {
                self.flush_counters();
                if p.addr_va != 0 {
                    self.mem.write_u64(p.addr_va, p.value).map_err(|f| self.fault(f))?;
                }
                {
                    let mut r = self.s.queues[self.job.queue as usize].lock();
                    if r.generation != self.job.generation {
                        return Err(Stop::Aborted);
                    }
                    r.fence = p.value;
                    self.s.write_status(self.job.queue, &r);
                }
                if cmd::split_header(p.header).1 & cmd::FENCE_FLAG_IRQ != 0 {
                    self.s.queue_interrupt(self.job.queue);
                }
                Ok(())
            }
            Packet::Timestamp(p) => {
                let now = self.s.now_ns();
                self.mem.write_u64(p.addr_va, now).map_err(|f| self.fault(f))
            }
            Packet::Indirect(p) => {
                if self.depth as u32 >= MAX_INDIRECT_DEPTH {
                    return Err(self.fault_at(FaultCode::Nesting, Access::Read, pkt_va));
                }
                self.depth += 1;
                let r = self.run_cmdbuf(p.va, p.size);
                self.depth -= 1;
                r
            }
        }
    }

    /// Take an engine from `pool`, giving up if the queue is reset meanwhile.
    fn acquire<'p>(&self, pool: &'p crate::engines::EnginePool) -> Result<crate::engines::EngineGuard<'p>, Stop> {
        loop {
            if let Some(g) = pool.acquire_timeout(SEM_POLL) {
                return Ok(g);
            }
            self.check_live()?;
        }
    }

    /// An injected transfer failure of the DMA engine about to write `dst`.
    fn injected_dma_failure(&self, dst: u64) -> Result<(), Stop> {
        match self.s.faults.fire(Kind::DmaFail, Some(self.job.queue)) {
            Some(_) => Err(self.fault_at(FaultCode::TransferError, Access::Write, dst)),
            None => Ok(()),
        }
    }

    /// Run `f` holding one of the DMA engines, which is busy from the
    /// packet's start (or from when it was free) until `f` returns.
    fn on_dma_engine(&mut self, f: impl FnOnce(&mut Self) -> Result<(), Stop>) -> Result<(), Stop> {
        let s = self.s;
        let engine = self.acquire(&s.dma_engines)?;
        let start = if engine.waited { self.workers.now_ns() } else { self.t };
        let r = f(self);
        let end = self.workers.now_ns();
        engine.finish(end.saturating_sub(start));
        self.end = Some(end);
        r
    }

    fn fill(&mut self, dst: u64, size: u64, value: u32) -> Result<(), Stop> {
        self.on_dma_engine(|ex| ex.fill_on_engine(dst, size, value))
    }

    fn fill_on_engine(&mut self, dst: u64, size: u64, value: u32) -> Result<(), Stop> {
        self.injected_dma_failure(dst)?;
        // Translate the whole destination first (a faulting FILL writes
        // nothing), then fill it where it lies, chunk by chunk.
        let depth = self.depth;
        let pinned = self.mem.pin();
        let to = pinned.resolve(dst, size, Access::Write).map_err(|f| Stop::Fault(f, depth))?;
        let pattern = value.to_le_bytes();
        let mut chunks = Chunks::new(to.pieces());
        while let Some(p) = chunks.next(DMA_CHUNK as usize) {
            self.check_live()?;
            // SAFETY: `p` is writable device memory resolved above, alive
            // while `pinned` lives; pieces start at 4-byte aligned VAs (the
            // packet's dst_va and page boundaries), so the pattern's phase
            // is the same in every piece.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p.ptr, p.len) };
            // Whole words: pieces and chunks are multiples of 4 bytes.
            for w in bytes.chunks_exact_mut(4) {
                w.copy_from_slice(&pattern);
            }
            Counters::add(&self.s.counters.dma_bytes, p.len as u64);
        }
        Ok(())
    }

    fn dma_copy(&mut self, src: u64, dst: u64, size: u64) -> Result<(), Stop> {
        self.on_dma_engine(|ex| ex.dma_copy_on_engine(src, dst, size))
    }

    fn dma_copy_on_engine(&mut self, src: u64, dst: u64, size: u64) -> Result<(), Stop> {
        self.injected_dma_failure(dst)?;
        // Translate both ranges first (a faulting DMA_COPY writes nothing),
        // then copy memory to memory in place, chunk by chunk.
        let depth = self.depth;
        let pinned = self.mem.pin();
        let from = pinned.resolve(src, size, Access::Read).map_err(|f| Stop::Fault(f, depth))?;
        let to = pinned.resolve(dst, size, Access::Write).map_err(|f| Stop::Fault(f, depth))?;
        let (mut a, mut b) = (Chunks::new(from.pieces()), Chunks::new(to.pieces()));
        let disjoint = src.saturating_add(size) <= dst || dst.saturating_add(size) <= src;
        if size >= DMA_PARALLEL_MIN && disjoint {
            DMA_STEPS.with(|plan| -> Result<(), Stop> {
                let (steps, tasks) = &mut *plan.borrow_mut();
                steps.clear();
                tasks.clear();
                // Steps are contiguous on both sides; a task is a run of
                // consecutive steps of about DMA_STEP bytes (guest pages
                // are scattered 4 KiB pieces: one task per piece made the
                // threads contend on the task counter for every 4 KiB).
                let mut in_task = DMA_STEP;
                loop {
                    let n = a.peek().min(b.peek()).min(DMA_STEP);
                    let (Some(s), Some(d)) = (a.next(n), b.next(n)) else { break };
                    if in_task + n > DMA_STEP {
                        tasks.push(steps.len());
                        in_task = 0;
                    }
                    in_task += n;
                    steps.push((s.ptr as usize, d.ptr as usize, n));
                }
                tasks.push(steps.len());
                self.workers.shareable();
                // A reset or shutdown is noticed between groups of tasks.
                let per_group = (DMA_CHUNK as usize / DMA_STEP) * 16;
                let ntasks = tasks.len() - 1;
                for g0 in (0..ntasks).step_by(per_group) {
                    self.check_live()?;
                    let bounds = &tasks[g0..=(g0 + per_group).min(ntasks)];
                    let steps = &steps[..];
                    self.workers.run(|| {
                        rbln_kernels::parallel_tasks(bounds.len() - 1, |t| {
                            for &(s, d, n) in &steps[bounds[t]..bounds[t + 1]] {
                                // SAFETY: both are resolved device memory
                                // of `n` bytes, alive while `pinned` lives
                                // (this call returns before it drops). The
                                // VA ranges do not overlap, so the steps
                                // are independent; should the context's
                                // page tables alias one physical page under
                                // both, that page gets unspecified bytes,
                                // as with a multi-channel DMA engine
                                // (memory stays valid: `copy_bytes` allows
                                // overlap).
                                unsafe { rbln_kernels::copy_bytes(s as *const u8, d as *mut u8, n) };
                            }
                        })
                    });
                }
                Ok(())
            })?;
            Counters::add(&self.s.counters.dma_bytes, size);
            return Ok(());
        }
        let mut since_check = 0;
        loop {
            // The largest step both sides can take contiguously.
            let n = a.peek().min(b.peek()).min(DMA_CHUNK as usize);
            let (Some(s), Some(d)) = (a.next(n), b.next(n)) else { break };
            if since_check == 0 {
                self.check_live()?;
            }
            // SAFETY: both pieces are resolved device memory of `n` bytes,
            // alive while `pinned` lives; `copy_bytes` allows overlap (a copy
            // within one buffer).
            unsafe { rbln_kernels::copy_bytes(s.ptr, d.ptr, n) };
            Counters::add(&self.s.counters.dma_bytes, n as u64);
            since_check += n;
            if since_check >= DMA_CHUNK as usize {
                since_check = 0;
            }
        }
        Ok(())
    }

    fn sem_wait(&mut self, addr: u64, value: u64, cond: u32) -> Result<(), Stop> {
        let mut waiting = false;
        loop {
            let v = self.mem.read_u64(addr).map_err(|f| self.fault(f))?;
            let ok = match cond {
                cmd::SEM_COND_EQ => v == value,
                _ => v >= value,
            };
            if ok {
                break;
            }
            self.check_live()?;
            if !waiting {
                waiting = true;
                self.set_state(QueueState::Waiting);
            }
            sem_sleep(self.s, SEM_POLL);
        }
        if waiting {
            self.set_state(QueueState::Running);
        }
        Ok(())
    }

    fn set_state(&self, st: QueueState) {
        let mut r = self.s.queues[self.job.queue as usize].lock();
        if r.generation == self.job.generation && r.state != QueueState::Faulted {
            r.state = st;
            self.s.write_status(self.job.queue, &r);
        }
    }
}

/// Walks a list of pieces in steps of at most a given length.
struct Chunks<'p> {
    pieces: &'p [Piece],
    index: usize,
    offset: usize,
}

impl<'p> Chunks<'p> {
    fn new(pieces: &'p [Piece]) -> Self {
        Self { pieces, index: 0, offset: 0 }
    }

    /// Bytes left in the current piece (0 at the end).
    fn peek(&self) -> usize {
        self.pieces.get(self.index).map_or(0, |p| p.len - self.offset)
    }

    /// The next contiguous step of at most `max` bytes.
    fn next(&mut self, max: usize) -> Option<Piece> {
        let p = self.pieces.get(self.index)?;
        let n = (p.len - self.offset).min(max);
        if n == 0 {
            return None;
        }
        // SAFETY: offset + n stays within the piece.
        let ptr = unsafe { p.ptr.add(self.offset) };
        self.offset += n;
        if self.offset == p.len {
            self.index += 1;
            self.offset = 0;
        }
        Some(Piece { ptr, len: n })
    }
}
