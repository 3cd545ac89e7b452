//! Fault injection: misbehaviour the test harness switches on, per run, to
//! check that drivers recover from a device that goes wrong.
//!
//! The guest cannot reach this: plans come from the server's command line
//! (`--inject`) or its control socket (`--control`, `rbln-npu-ctl`), both
//! on the host. With nothing armed the hooks cost one relaxed atomic load.
//!
//! A plan is `KIND[:key=value,...]`:
//!
//! | kind | event counted | what a firing event does |
//! |---|---|---|
//! | `irq-drop` | an interrupt raised | it is not delivered (its status bit stays set) |
//! | `irq-delay` | an interrupt raised | it is delivered `ms` milliseconds late |
//! | `irq-spurious` | (fires at once, `count` times) | an interrupt on a vector with nothing pending |
//! | `queue-stall` | a ring entry starting | it never progresses (Running, no packets) until the queue is reset |
//! | `dma-fail` | a DMA_COPY or FILL starting | it fails with fault TransferError, writing nothing |
//! | `status-corrupt` | a status block write-back | it carries an impossible head, state and fence |
//! | `die` | a packet starting | the device falls off the bus (reads all ones, no interrupts, no DMA) |
//!
//! Keys: `after=N` lets N events pass first (default 0); `count=N` is how
//! many events fire (default 1; 0 = every one from then on); `queue=Q`
//! counts only events of hardware queue Q (an interrupt belongs to the
//! queue whose fence or fault raised it);
//! `ms=M` is irq-delay's delay (default 100).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    IrqDrop,
    IrqDelay,
    IrqSpurious,
    QueueStall,
    DmaFail,
    StatusCorrupt,
    Die,
}

impl Kind {
    pub const ALL: [Kind; 7] =
        [Kind::IrqDrop, Kind::IrqDelay, Kind::IrqSpurious, Kind::QueueStall, Kind::DmaFail, Kind::StatusCorrupt, Kind::Die];

    pub fn name(self) -> &'static str {
        match self {
            Kind::IrqDrop => "irq-drop",
            Kind::IrqDelay => "irq-delay",
            Kind::IrqSpurious => "irq-spurious",
            Kind::QueueStall => "queue-stall",
            Kind::DmaFail => "dma-fail",
            Kind::StatusCorrupt => "status-corrupt",
            Kind::Die => "die",
        }
    }
}

/// One armed misbehaviour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub kind: Kind,
    /// Events let through before the first that fires.
    pub after: u64,
    /// Events that fire (0: all of them).
    pub count: u64,
    /// Only events of this hardware queue.
    pub queue: Option<u32>,
    /// irq-delay: how late.
    pub delay_ms: u64,
}

impl FromStr for Plan {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, args) = s.split_once(':').unwrap_or((s, ""));
        let kind = Kind::ALL
            .into_iter()
            .find(|k| k.name() == kind.trim())
            .ok_or_else(|| format!("unknown fault '{}' (one of: {})", kind.trim(), Kind::ALL.map(Kind::name).join(", ")))?;
        let mut plan = Plan { kind, after: 0, count: 1, queue: None, delay_ms: 100 };
        for kv in args.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let (key, value) = kv.split_once('=').ok_or_else(|| format!("'{kv}': expected key=value"))?;
            let n: u64 = value.trim().parse().map_err(|_| format!("'{kv}': '{}' is not a number", value.trim()))?;
            match key.trim() {
                "after" => plan.after = n,
                "count" => plan.count = n,
                "queue" => plan.queue = Some(u32::try_from(n).map_err(|_| format!("'{kv}': no such queue"))?),
                "ms" if kind == Kind::IrqDelay => plan.delay_ms = n.min(60_000),
                k => return Err(format!("'{k}' is not a key of {} (after, count, queue{})", kind.name(), if kind == Kind::IrqDelay { ", ms" } else { "" })),
            }
        }
        Ok(plan)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:after={},count={}", self.kind.name(), self.after, self.count)?;
        if let Some(q) = self.queue {
            write!(f, ",queue={q}")?;
        }
        if self.kind == Kind::IrqDelay {
            write!(f, ",ms={}", self.delay_ms)?;
        }
        Ok(())
    }
}

struct Armed {
    plan: Plan,
    /// Matching events seen so far.
    seen: u64,
}

impl Armed {
    /// Count one matching event; whether it fires.
    fn event(&mut self) -> bool {
        self.seen += 1;
        self.seen > self.plan.after && (self.plan.count == 0 || self.seen <= self.plan.after + self.plan.count)
    }

    fn spent(&self) -> bool {
        self.plan.count != 0 && self.seen >= self.plan.after + self.plan.count
    }
}

/// The armed plans and what has fired.
#[derive(Default)]
pub struct Injector {
    armed: AtomicBool,
    plans: Mutex<Vec<Armed>>,
    fired: [AtomicU64; Kind::ALL.len()],
}

impl Injector {
    /// Arm `plan` (irq-spurious is returned to the caller to raise).
    pub fn arm(&self, plan: Plan) {
        log::warn!("fault injection armed: {plan}");
        let mut plans = self.lock();
        plans.push(Armed { plan, seen: 0 });
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Disarm every plan (what has fired stays counted).
    pub fn clear(&self) {
        self.lock().clear();
        self.armed.store(false, Ordering::SeqCst);
    }

    /// An event of `kind` (on hardware queue `queue`, if it has one): the
    /// firing plan, if any. Every armed plan of the kind counts the event.
    pub fn fire(&self, kind: Kind, queue: Option<u32>) -> Option<Plan> {
        if !self.armed.load(Ordering::Relaxed) {
            return None;
        }
        let mut plans = self.lock();
        let mut fired = None;
        for a in plans.iter_mut().filter(|a| a.plan.kind == kind && (a.plan.queue.is_none() || a.plan.queue == queue)) {
            if a.event() && fired.is_none() {
                fired = Some(a.plan.clone());
            }
        }
        plans.retain(|a| !a.spent());
        self.armed.store(!plans.is_empty(), Ordering::SeqCst);
        if let Some(p) = &fired {
            self.record(p.kind);
            log::warn!("fault injected: {}{}", kind.name(), queue.map(|q| format!(" (queue {q})")).unwrap_or_default());
        }
        fired
    }

    /// Count a firing that happened outside `fire` (irq-spurious).
    pub fn record(&self, kind: Kind) {
        self.fired[kind as usize].fetch_add(1, Ordering::SeqCst);
    }

    /// How many events of each kind fired: `irq-drop=N irq-delay=N ...`,
    /// then the plans still armed.
    pub fn report(&self) -> String {
        let mut s = Kind::ALL.map(|k| format!("{}={}", k.name(), self.fired[k as usize].load(Ordering::SeqCst))).join(" ");
        for a in self.lock().iter() {
            s.push_str(&format!(" armed[{}; seen {}]", a.plan, a.seen));
        }
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Armed>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_print() {
        let p: Plan = "irq-delay:after=2,count=0,queue=3,ms=250".parse().unwrap();
        assert_eq!(p, Plan { kind: Kind::IrqDelay, after: 2, count: 0, queue: Some(3), delay_ms: 250 });
        assert_eq!(p.to_string(), "irq-delay:after=2,count=0,queue=3,ms=250");
        assert_eq!("die".parse::<Plan>().unwrap(), Plan { kind: Kind::Die, after: 0, count: 1, queue: None, delay_ms: 100 });
        for (bad, says) in [
            ("irq-dorp", "unknown fault 'irq-dorp'"),
            ("die:after", "expected key=value"),
            ("die:after=x", "'x' is not a number"),
            ("die:ms=3", "'ms' is not a key of die"),
            ("dma-fail:queue=99999999999", "no such queue"),
        ] {
            let e = bad.parse::<Plan>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn after_count_and_queue_select_the_events_that_fire() {
        let inj = Injector::default();
        assert!(inj.fire(Kind::DmaFail, Some(0)).is_none(), "nothing armed");
        inj.arm("dma-fail:after=1,count=2,queue=1".parse().unwrap());
        let fired: Vec<bool> = [Some(0), Some(1), Some(1), Some(0), Some(1), Some(1)]
            .into_iter()
            .map(|q| inj.fire(Kind::DmaFail, q).is_some())
            .collect();
        // Queue 0's events do not count; queue 1's first passes, the next two fire.
        assert_eq!(fired, [false, false, true, false, true, false]);
        assert!(inj.report().starts_with("irq-drop=0 irq-delay=0 irq-spurious=0 queue-stall=0 dma-fail=2 "), "{}", inj.report());
        assert!(!inj.report().contains("armed["), "a spent plan is disarmed: {}", inj.report());
        inj.arm("irq-drop:count=0".parse().unwrap());
        assert!((0..100).all(|_| inj.fire(Kind::IrqDrop, None).is_some()), "count=0 fires forever");
        assert!(inj.fire(Kind::DmaFail, Some(1)).is_none(), "other kinds are untouched");
        inj.clear();
        assert!(inj.fire(Kind::IrqDrop, None).is_none());
    }
}
