//! Files that claim huge counts or sizes are rejected without allocating
//! what they claim: a counting global allocator records the largest single
//! allocation made while each crafted file is parsed.
//!
//! One test function only, so no other test allocates concurrently.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::*;
use rbln_format::*;

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.load(SeqCst) {
            LARGEST.fetch_max(layout.size(), SeqCst);
            TOTAL.fetch_add(layout.size(), SeqCst);
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ARMED.load(SeqCst) {
            LARGEST.fetch_max(new_size, SeqCst);
            TOTAL.fetch_add(new_size, SeqCst);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Parse `bytes`, returning the result, the largest single allocation and
/// the sum of all allocations made meanwhile.
fn measure(bytes: &[u8]) -> (Result<Model, FormatError>, usize, usize, Duration) {
    LARGEST.store(0, SeqCst);
    TOTAL.store(0, SeqCst);
    let t = Instant::now();
    ARMED.store(true, SeqCst);
    let r = Model::from_bytes(bytes);
    ARMED.store(false, SeqCst);
    (r, LARGEST.load(SeqCst), TOTAL.load(SeqCst), t.elapsed())
}

#[test]
fn huge_claims_allocate_nothing_big() {
    let base = mlp_bytes();
    let file = base.len();
    let weights_size_at = 20 + 4 + 4 + 4 + 17 + 24;
    let streams_at = weights_size_at + 8;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        // ~1M tensors (within MAX_TENSORS) claimed by a 700-byte section:
        // 1M decoded tensors would take ~100 MB.
        ("tensor count", patch_section(&base, ".rbln.graph", |d| put_u32(d, 0, 1 << 20)), "CountExceedsData"),
        (
            "tensor count above the limit",
            patch_section(&base, ".rbln.graph", |d| put_u32(d, 0, u32::MAX)),
            "LimitExceeded",
        ),
        ("4 KiB name", patch_section(&base, ".rbln.graph", |d| put_u32(d, 4, 4096)), "SectionTruncated"),
        ("4 GiB name", patch_section(&base, ".rbln.graph", |d| put_u32(d, 4, u32::MAX)), "LimitExceeded"),
        ("16M relocations", patch_section(&base, ".rbln.reloc", |d| put_u32(d, 0, 1 << 24)), "CountExceedsData"),
        ("1M profile entries", patch_section(&base, ".rbln.profile", |d| put_u32(d, 0, 1 << 20)), "CountExceedsData"),
        ("1T weights", patch_section(&base, ".rbln.meta", |d| put_u64(d, weights_size_at, 1 << 40)), "BadField"),
        ("64 streams", patch_section(&base, ".rbln.meta", |d| put_u32(d, streams_at, 64)), "CountExceedsData"),
        (
            "1 TiB section",
            {
                let mut b = base.clone();
                let at = shdr_field(&b, section_index(&b, ".rbln.weights"), 32);
                put_u64(&mut b, at, 1 << 40);
                b
            },
            "SectionOutOfBounds",
        ),
        (
            "1024 section headers",
            {
                let mut b = base.clone();
                b[60..62].copy_from_slice(&1024u16.to_le_bytes());
                b
            },
            "Truncated",
        ),
        (
            "check table with 1024 entries",
            {
                let c = rbln_format::container::read_elf(&base).unwrap();
                let chk = c.get(".rbln.check").unwrap();
                let mut b = base.clone();
                let at = chk.offset as usize + 12;
                put_u32(&mut b, at, 1024);
                let end = chk.offset as usize + chk.data.len();
                let fixed = crc(&b[chk.offset as usize..end - 4]);
                b[end - 4..end].copy_from_slice(&fixed.to_le_bytes());
                b
            },
            "CountExceedsData",
        ),
    ];
    for (what, bytes, variant) in cases {
        let (r, largest, total, took) = measure(&bytes);
        let e = r.expect_err(what);
        assert!(format!("{e:?}").starts_with(variant), "{what}: expected {variant}, got {e:?}");
        // Nothing bigger than the file itself (the reader copies sections
        // it has verified), and a few file sizes in total.
        assert!(largest <= file.max(64 << 10), "{what}: allocated {largest} bytes at once ({e})");
        assert!(total <= 16 * file + (256 << 10), "{what}: allocated {total} bytes in total ({e})");
        assert!(took < Duration::from_secs(1), "{what}: took {took:?}");
        eprintln!("{what}: {e} (largest allocation {largest} B, total {total} B, {took:?})");
    }

    // A valid model planning a 1 TiB arena and staging buffer is read
    // without allocating either: the reader only describes memory.
    let (mut b, _) = mlp_builder();
    b.arena_size(limits::MAX_ARENA_SIZE).staging_size(limits::MAX_STAGING_SIZE);
    let bytes = b.build().unwrap();
    let (r, largest, _, _) = measure(&bytes);
    assert_eq!(r.unwrap().meta.arena_size, 1 << 40);
    assert!(largest <= bytes.len().max(64 << 10), "allocated {largest} bytes at once");
}
