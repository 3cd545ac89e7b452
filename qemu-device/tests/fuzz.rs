//! Robustness: arbitrary command buffers, compute descriptors and register
//! writes. The device model must never panic (every command processor
//! stays alive), never touch guest memory that was not shared with it or
//! that the context did not map, and keep working afterwards.
//!
//! Bounded for `make test`; raise RBLN_FUZZ_CASES for a longer run.

mod common;

use std::time::Duration;

use common::*;
use proptest::prelude::*;
use rbln_hw::cmd::{header, Opcode};
use rbln_hw::mmu::{Target, VA_LIMIT};
use rbln_hw::ops::{CastDesc, ConcatDesc, EltInstr, EltwiseDesc, GatherDesc, OpHeader, QBinaryDesc, QConvDesc, QGemmDesc, QuantDesc, RecurrentDesc, WhereDesc, MAX_CONCAT_PARTS};
use rbln_hw::pci::{BAR_DOORBELL, BAR_DRAM, BAR_REGS};
use rbln_hw::regs;
use rbln_hw::ring::QueueState;

fn cases(default: u32) -> u32 {
    std::env::var("RBLN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// VAs the context maps: host RAM at HOST_VA, DRAM at DRAM_VA, descriptors
/// at DESC_VA, the command buffer at CMD_VA.
const HOST_VA: u64 = 0x10_0000;
const DRAM_VA: u64 = 0x40_0000;
const DESC_VA: u64 = 0x60_0000;
const CMD_VA: u64 = 0x80_0000;
const WINDOW: u64 = 64 << 10;

fn address() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..WINDOW).prop_map(|o| HOST_VA + (o & !3)),
        (0..WINDOW).prop_map(|o| DRAM_VA + (o & !3)),
        (0..4096u64).prop_map(|o| DESC_VA + (o & !3)),
        Just(CMD_VA),
        Just(0xdead_0000u64),
        Just(VA_LIMIT - 8),
        Just(0u64),
        Just(!7u64), // the highest 8-aligned address
        any::<u64>(),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(4), Just(64), Just(4096), Just(WINDOW), Just(1 << 20), Just(u64::MAX), 0..(1u64 << 40),]
}

/// A packet with a valid header and random (often nonsensical) fields, or
/// random words.
fn packet() -> impl Strategy<Value = Vec<u8>> {
    let words = prop::collection::vec(any::<u32>(), 1..8)
        .prop_map(|w| w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let structured = (0u8..10, any::<u8>(), address(), address(), size(), any::<u32>(), any::<bool>()).prop_map(
        |(op, flags, a, b, n, v, keep_flags)| {
            let size_dw: u16 = match op {
                1 => 8,
                2 | 4 | 5 | 6 => 6,
                3 | 7 | 8 => 4,
                _ => 1,
            };
            let flags = if keep_flags { flags & 1 } else { flags };
            let mut p = header(Opcode::from_u8(op).unwrap_or(Opcode::Nop), flags, size_dw).to_le_bytes().to_vec();
            if op == 9 {
                p[0] = 9; // unknown opcode
            }
            // Fill the body with the random values in field order.
            let mut body = Vec::new();
            body.extend_from_slice(&v.to_le_bytes());
            body.extend_from_slice(&a.to_le_bytes());
            body.extend_from_slice(&b.to_le_bytes());
            body.extend_from_slice(&n.to_le_bytes());
            p.extend_from_slice(&body[..(size_dw as usize - 1) * 4]);
            if op == 3 {
                // COMPUTE: a descriptor in the descriptor page, small size.
                p[4..8].copy_from_slice(&((v % 200) & !3).to_le_bytes());
            }
            p
        },
    );
    prop_oneof![1 => words, 4 => structured]
}

/// Addresses for typed operands (CAST's 1-, 4- and 8-byte elements, i64
/// gather indices): 8-byte aligned ones in the mapped windows, any address
/// of `address` moved by 0..8 bytes, or one as `address` draws it.
fn element_address() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (0..WINDOW).prop_map(|o| HOST_VA + (o & !7)),
        2 => (0..WINDOW).prop_map(|o| DRAM_VA + (o & !7)),
        2 => (address(), 0u64..8).prop_map(|(a, d)| a.wrapping_add(d)),
        1 => address(),
    ]
}

/// CAST descriptors with mostly valid types and awkward counts and
/// addresses, or GATHER descriptors whose indices (random values at the
/// start of the host window) are often out of range.
fn typed_descriptor() -> impl Strategy<Value = Vec<u8>> {
    let ty = || prop_oneof![9 => 0u32..4, 1 => any::<u32>()];
    let count = prop_oneof![
        6 => 0u64..64,
        1 => Just(WINDOW / 8),
        1 => Just(WINDOW / 4),
        1 => Just(WINDOW),
        1 => Just(1 << 27),
        1 => Just(1 << 28),
        1 => size(),
    ];
    let cast = (ty(), ty(), count, element_address(), element_address()).prop_map(|(src_type, dst_type, count, in_va, out_va)| {
        CastDesc { src_type, dst_type, count, in_va, out_va, ..Default::default() }.with_header().to_bytes().to_vec()
    });
    let indices_at = prop_oneof![3 => Just(HOST_VA), 1 => element_address()];
    let gather = (1u32..4, 0u32..3, prop::collection::vec(0u32..6, 3), 0u32..2, 0u64..32, indices_at, element_address())
        .prop_map(|(rank, axis, dims, index_type, num_indices, indices_va, out_va)| {
            let mut d = [0u32; 6];
            d[..rank as usize].copy_from_slice(&dims[..rank as usize]);
            GatherDesc {
                rank, axis: axis % rank, dims: d, index_type, num_indices, data_va: DRAM_VA, indices_va, out_va,
                ..Default::default()
            }
            .with_header()
            .to_bytes()
            .to_vec()
        });
    // int8 ops: small shapes, types and zero points often out of range,
    // operands anywhere (scales are whatever the memory holds).
    let zero = || prop_oneof![3 => -3i32..3, 1 => -300i32..300, 1 => any::<i32>()];
    let qt = || prop_oneof![6 => 0u32..3, 1 => any::<u32>()];
    let quant = (0u32..3, qt(), 0u64..4, 0u64..9, 0u64..40, element_address(), element_address(), element_address(), element_address())
        .prop_map(|(mode, qtype, outer, channels, inner, scale_va, zero_va, in_va, out_va)| {
            QuantDesc { mode, qtype, outer, channels, inner, scale_va, zero_va, in_va, out_va, ..Default::default() }.with_header().to_bytes().to_vec()
        });
    let qgemm = ((0u32..20, 0u32..40, 0u32..70, 0u32..8, qt(), qt()), (zero(), zero(), zero(), zero()), (element_address(), element_address(), element_address(), element_address(), element_address()))
        .prop_map(|((m, n, k, flags, a_type, out_type), (a_zero, out_zero, out_min, out_max), (a_va, b_va, bias_va, scale_va, out_va))| {
            QGemmDesc { m, n, k, flags, a_type, out_type, a_zero, out_zero, out_min, out_max, a_va, b_va, b_zero_va: bias_va, bias_va, scale_va, out_va, ..Default::default() }
                .with_header()
                .to_bytes()
                .to_vec()
        });
    let qconv = ((0u32..3, 0u32..9, 0u32..9, 0u32..9, 0u32..9, 0u32..4), (0u32..3, 0u32..3, 0u32..3, 0u32..4), (qt(), qt(), zero(), 0u32..8), (element_address(), element_address(), element_address(), element_address()))
        .prop_map(|((n, c_in, h, w, c_out, kh), (stride, dil, pad, groups), (x_type, out_type, x_zero, flags), (x_va, w_va, scale_va, out_va))| {
            QConvDesc {
                n, c_in, h, w, c_out, kh, kw: kh, stride_h: stride, stride_w: stride, dil_h: dil, dil_w: dil, pad_top: pad, pad_left: pad, pad_bottom: pad, pad_right: pad,
                groups, flags, x_type, out_type, x_zero, out_max: if out_type == 0 { 255 } else { 0 }, x_va, w_va, w_zero_va: scale_va, bias_va: scale_va, scale_va, out_va,
                ..Default::default()
            }
            .with_header()
            .to_bytes()
            .to_vec()
        });
    let scale = || prop_oneof![4 => 0.001f32..10.0, 1 => any::<f32>()];
    let qbinary = ((0u32..4, 0u32..3, qt(), qt(), qt()), (scale(), scale(), scale(), zero(), zero(), zero()), (0u64..300, element_address(), element_address(), element_address()))
        .prop_map(|((kind, flags, a_type, b_type, out_type), (a_scale, b_scale, out_scale, a_zero, b_zero, out_zero), (count, a_va, b_va, out_va))| {
            QBinaryDesc { kind, flags, a_type, b_type, out_type, a_scale, b_scale, out_scale, a_zero, b_zero, out_zero, count, a_va, b_va, out_va, ..Default::default() }
                .with_header()
                .to_bytes()
                .to_vec()
        });
    prop_oneof![3 => cast, 1 => gather, 1 => quant, 1 => qgemm, 1 => qconv, 1 => qbinary]
}

/// WHERE descriptors that decode: small dims, often not broadcastable
/// together, sometimes huge, with awkward addresses.
fn where_descriptor() -> impl Strategy<Value = Vec<u8>> {
    let dim = || prop_oneof![6 => 0u32..5, 1 => Just(1u32 << 16), 1 => any::<u32>()];
    let dims = move |rank: u32| {
        prop::collection::vec(dim(), 6).prop_map(move |v| {
            let mut d = [0u32; 6];
            d[..rank as usize].copy_from_slice(&v[..rank as usize]);
            d
        })
    };
    (0u32..7)
        .prop_flat_map(move |rank| (Just(rank), dims(rank), dims(rank), dims(rank)))
        .prop_flat_map(|(rank, c, a, b)| {
            (Just((rank, c, a, b)), element_address(), element_address(), element_address(), element_address())
        })
        .prop_map(|((rank, cond_dims, a_dims, b_dims), cond_va, a_va, b_va, out_va)| {
            WhereDesc { rank, cond_dims, a_dims, b_dims, cond_va, a_va, b_va, out_va, ..Default::default() }
                .with_header()
                .to_bytes()
                .to_vec()
        })
}

/// ELTWISE descriptors, mostly decodable: small dims (some huge), strides
/// from 0 and 1 to overflowing, programs over the input registers with
/// random codes, operands and immediates, awkward addresses.
fn eltwise_descriptor() -> impl Strategy<Value = Vec<u8>> {
    let dim = prop_oneof![6 => 0u32..6, 1 => Just(1u32 << 16), 1 => any::<u32>()];
    let stride = prop_oneof![4 => 0u64..8, 1 => Just(1u64 << 20), 1 => Just(u64::MAX / 3), 1 => any::<u64>()];
    let instr = (1u8..3, 0u8..24, 0u8..8, prop_oneof![6 => 0u8..2, 1 => Just(0xffu8), 1 => any::<u8>()], prop_oneof![6 => 0u8..2, 1 => Just(0xffu8)], any::<f32>())
        .prop_map(|(class, code, dst, a, b, imm)| EltInstr { class, code, dst, a, b: if class == 1 { 0 } else { b }, imm, ..Default::default() });
    (
        0u32..7,
        1u32..5,
        prop::collection::vec(dim, 6),
        prop::collection::vec(stride, 24),
        prop::collection::vec(instr, 1..17),
        prop::collection::vec(element_address(), 5),
        0u32..8,
    )
        .prop_map(|(rank, n_inputs, dims, strides, prog, vas, out_reg)| {
            // Mostly the last result (a register that holds a value).
            let out_reg = if out_reg < 6 { u32::from(prog[prog.len() - 1].dst) } else { out_reg };
            let mut d = EltwiseDesc { rank, n_inputs, n_instrs: prog.len() as u32, out_reg, out_va: vas[4], ..Default::default() };
            d.out_dims[..rank as usize].copy_from_slice(&dims[..rank as usize]);
            for i in 0..n_inputs as usize {
                d.in_va[i] = vas[i];
                d.in_strides[i][..rank as usize].copy_from_slice(&strides[i * 6..i * 6 + rank as usize]);
            }
            d.instrs[..prog.len()].copy_from_slice(&prog);
            d.with_header().to_bytes().to_vec()
        })
}

/// RECURRENT descriptors, mostly decodable: every cell and flag, sizes
/// from tiny to overflowing, optional operands present or not, awkward
/// and overlapping addresses.
fn recurrent_descriptor() -> impl Strategy<Value = Vec<u8>> {
    let size = || prop_oneof![8 => 1u32..6, 1 => Just(0u32), 1 => Just(1u32 << 16), 1 => any::<u32>()];
    let optional = || prop_oneof![1 => Just(0u64), 2 => element_address()];
    (
        (0u32..5, 0u32..4, size(), size(), size()),
        (element_address(), element_address(), optional(), optional(), optional(), element_address(), optional()),
    )
        .prop_map(|((cell, flags, seq, batch, hidden), (x_va, r_va, rb_va, h0_va, c0_va, y_va, c_va))| {
            RecurrentDesc { cell, flags, seq, batch, hidden, x_va, r_va, rb_va, h0_va, c0_va, y_va, c_va, ..Default::default() }.with_header().to_bytes().to_vec()
        })
}

/// CONCAT descriptors, mostly decodable: 1 to 16 parts (sometimes 0 or
/// 17), rows and columns from tiny to overflowing, parts overlapping each
/// other and the output, awkward addresses.
fn concat_descriptor() -> impl Strategy<Value = Vec<u8>> {
    let size = || prop_oneof![8 => 1u32..8, 1 => Just(0u32), 1 => Just(1u32 << 16), 1 => any::<u32>()];
    let part = (element_address(), prop_oneof![4 => 0u32..8, 1 => any::<u32>()], size());
    (
        (prop_oneof![9 => 1u32..=MAX_CONCAT_PARTS as u32, 1 => Just(0u32), 1 => Just(MAX_CONCAT_PARTS as u32 + 1)], size(), size()),
        element_address(),
        prop::collection::vec(part, MAX_CONCAT_PARTS),
    )
        .prop_map(|((parts, rows, out_cols), out_va, ps)| {
            let mut d = ConcatDesc { rows, out_cols, parts, out_va, ..Default::default() };
            for (i, &(va, col, cols)) in ps.iter().enumerate().take(parts as usize) {
                (d.src_va[i], d.col[i], d.cols[i]) = (va, col % out_cols.max(1), cols);
            }
            d.with_header().to_bytes().to_vec()
        })
}

/// A descriptor page: a valid header for a random op with random fields
/// drawn mostly from small numbers and mapped addresses.
fn descriptor() -> impl Strategy<Value = Vec<u8>> {
    (1u32..18, prop::collection::vec(prop_oneof![0u32..8, 0u32..100, address().prop_map(|a| a as u32), any::<u32>()], 40))
        .prop_map(|(op, fields)| {
            let mut d: Vec<u8> = fields.iter().flat_map(|x| x.to_le_bytes()).collect();
            d.truncate(152);
            let size = match op {
                1 => 96,
                2 => 120,
                3 | 4 => 88,
                5 => 48,
                6 | 8 => 64,
                7 => 56,
                9 | 11 => 80,
                12 => 40,
                13 => 72,
                14 => 120,
                15 => 72,
                16 => 96,
                _ => 152,
            };
            OpHeader { op, size }.write_to(&mut d).unwrap();
            d
        })
}

struct Setup {
    rig: Rig,
    ctx: Ctx,
    q: Queue,
    /// Bus ranges commands may legitimately write.
    writable: Vec<(u64, u64)>,
}

fn setup() -> Setup {
    let mut rig = Rig::new();
    let ctx = rig.context(3);
    let q = rig.queue(2, &ctx, 8);
    let host = rig.host_buffer(&ctx, HOST_VA, WINDOW);
    rig.map(&ctx, DRAM_VA, Target::Dram, 0, WINDOW, true, true);
    let desc = rig.host_buffer(&ctx, DESC_VA, 4096);
    let cmd = rig.host_buffer(&ctx, CMD_VA, 1 << 16);
    // The ring is written by the driver (this test), not by commands.
    let writable = vec![(host, WINDOW), (desc, 4096), (cmd, 1 << 16), (q.status, 64), (q.ring, 4096)];
    Setup { rig, ctx, q, writable }
}

/// Snapshot of all shared RAM the rig allocated, with legitimately
/// writable ranges blanked out.
fn protected_snapshot(s: &Setup) -> Vec<u8> {
    let end = s.rig.alloc_end();
    let mut snap = s.rig.read(RAM_BASE, (end - RAM_BASE) as usize);
    for &(bus, len) in &s.writable {
        let off = (bus - RAM_BASE) as usize;
        snap[off..off + len as usize].fill(0);
    }
    snap
}

fn dram_outside_window_untouched(rig: &Rig) -> bool {
    rig.dram_read(WINDOW, (16 << 20) - WINDOW as usize).iter().all(|&b| b == 0)
}

/// After hostile input: a clean job on a fresh queue of another context
/// still runs to completion.
/// One COMPUTE of `desc` (written to the descriptor page) over `data` at
/// the start of the host window, then a fence, checked as every command
/// buffer is.
fn run_descriptor(desc: &[u8], data: &[u8]) -> Result<(), TestCaseError> {
    let mut s = setup();
    let desc_bus = s.writable[1].0;
    s.rig.write(desc_bus, desc);
    let host_bus = s.writable[0].0;
    s.rig.write(host_bus, data);
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.compute(DESC_VA, desc.len() as u32).fence(1, 0, false);
    run_checked(&mut s, &e.buf)
}

fn still_works(rig: &mut Rig) {
    let ctx = rig.context(9);
    let mut q = rig.queue(7, &ctx, 4);
    let host = rig.host_buffer(&ctx, 0x10_0000, 4096);
    let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
    e.fill(0x10_0000, 8, 0x5A5A_5A5A).fence(77, 0, false);
    rig.run(&ctx, &mut q, 0x20_0000, &e.buf);
    assert_eq!(rig.wait_idle(&q, Duration::from_secs(10)).fence, 77, "device still executes work");
    assert_eq!(rig.read(host, 4), 0x5A5A_5A5Au32.to_le_bytes());
}

/// Run `cmds` on the setup's queue and check that the device survived and
/// wrote only where the context may write.
fn run_checked(s: &mut Setup, cmds: &[u8]) -> Result<(), TestCaseError> {
    let before = protected_snapshot(s);
    let cmd_bus = s.writable[2].0;
    s.rig.write(cmd_bus, cmds);
    let len = cmds.len() as u32;
    s.rig.submit(&mut s.q, CMD_VA, len);
    s.rig.wait_idle(&s.q, Duration::from_secs(5));
    if !matches!(s.rig.state(&s.q), QueueState::Idle | QueueState::Faulted) {
        // Blocked in SEM_WAIT (or still busy): the reset path must end it.
        s.rig.reset_queue(&mut s.q);
        prop_assert_eq!(s.rig.state(&s.q), QueueState::Disabled);
    }
    prop_assert!(s.rig.dev.healthy(), "a command processor died");
    prop_assert!(s.rig.private_canary_intact(), "unshared guest memory was written");
    prop_assert!(protected_snapshot(s) == before, "memory outside the context's mappings changed");
    prop_assert!(dram_outside_window_untouched(&s.rig), "DRAM outside the context's mappings changed");
    let _ = &s.ctx;
    still_works(&mut s.rig);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(200), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_command_buffers(pkts in prop::collection::vec(packet(), 1..16), desc in descriptor()) {
        let mut s = setup();
        let desc_bus = s.writable[1].0;
        s.rig.write(desc_bus, &desc);
        run_checked(&mut s, &pkts.concat())?;
    }

    #[test]
    fn hostile_cast_and_gather_descriptors(
        desc in typed_descriptor(),
        data in prop::collection::vec(prop_oneof![3 => -6i64..6, 1 => any::<i64>()], 512),
    ) {
        // Random operands and gather indices (as i64 or i32: mostly
        // small, some in range).
        run_descriptor(&desc, &data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }

    #[test]
    fn hostile_where_descriptors(
        desc in where_descriptor(),
        data in prop::collection::vec(prop_oneof![Just(0.0f32), Just(1.0), Just(f32::NAN), any::<f32>()], 256),
    ) {
        run_descriptor(&desc, &data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }

    #[test]
    fn hostile_eltwise_descriptors(
        desc in eltwise_descriptor(),
        data in prop::collection::vec(prop_oneof![Just(0.0f32), Just(-1.0), Just(f32::NAN), any::<f32>()], 256),
    ) {
        run_descriptor(&desc, &data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }

    #[test]
    fn hostile_recurrent_descriptors(
        desc in recurrent_descriptor(),
        data in prop::collection::vec(prop_oneof![Just(0.0f32), Just(-1.0), Just(f32::NAN), any::<f32>()], 256),
    ) {
        run_descriptor(&desc, &data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }

    #[test]
    fn hostile_concat_descriptors(
        desc in concat_descriptor(),
        data in prop::collection::vec(prop_oneof![Just(0.0f32), Just(-1.0), Just(f32::NAN), any::<f32>()], 256),
    ) {
        run_descriptor(&desc, &data.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    }

    #[test]
    fn arbitrary_register_writes(ops in prop::collection::vec(
        (prop_oneof![8 => Just(BAR_REGS), 1 => Just(BAR_DOORBELL), 1 => Just(BAR_DRAM)],
         prop_oneof![
            (0u64..0x60).prop_map(|o| o & !3),
            (0u64..32 * 0x80).prop_map(|o| regs::QUEUE_BASE + (o & !3)),
            (0u64..64 * 16).prop_map(|o| regs::CTX_BASE + (o & !3)),
            any::<u64>(),
            (0u64..0x10000),
         ],
         prop_oneof![any::<u64>(), (0u64..64), Just(regs::RESET_MAGIC as u64), Just(RAM_BASE)],
         prop_oneof![Just(4usize), Just(8), Just(1), Just(2)]),
        1..64)) {
        let mut rig = Rig::new();
        for (bar, off, v, n) in ops {
            let bytes = v.to_le_bytes();
            rig.dev.bar_write(bar, off, &bytes[..n]);
            let mut b = [0u8; 8];
            rig.dev.bar_read(bar, off, &mut b[..n]);
        }
        prop_assert!(rig.dev.healthy(), "a command processor died");
        prop_assert!(rig.private_canary_intact(), "unshared guest memory was written");
        rig.set32(regs::DEVICE_RESET, regs::RESET_MAGIC);
        still_works(&mut rig);
    }
}

/// `make fuzz` (RBLN_FUZZ_SCALE=N): N arbitrary command buffers and
/// descriptors (the strategies above) through one device, as a long-lived
/// device sees them: the queue is reset after every fault or block, the
/// invariants are checked after every case (device healthy, unshared and
/// unmapped memory untouched) and the device still works every 1000
/// cases. A fresh device per case, as the properties above use, costs
/// ~40 ms; this loop runs thousands per second.
#[test]
fn command_buffers_at_scale() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let n: u64 = std::env::var("RBLN_FUZZ_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let mut s = setup();
    let mut runner = TestRunner::deterministic();
    let cmds = prop::collection::vec(packet(), 1..16);
    let descs = descriptor();
    let typed = typed_descriptor();
    let (desc_bus, cmd_bus) = (s.writable[1].0, s.writable[2].0);
    // The periodic check's own context, queue and buffers, made once: made
    // per check, they grew the snapshotted RAM with every check (each
    // case's snapshot longer than the last, the RAM used up after ~2000
    // checks). The device writes their status block and buffer, the test
    // their ring and commands: all writable.
    let check_ctx = s.rig.context(9);
    let mut check_q = s.rig.queue(7, &check_ctx, 4);
    let check_host = s.rig.host_buffer(&check_ctx, 0x10_0000, 4096);
    let check_cmds_len = {
        let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
        e.fill(0x10_0000, 8, 0).fence(1, 0, false);
        e.buf.len() as u64
    };
    let check_cmds = s.rig.host_buffer(&check_ctx, 0x20_0000, check_cmds_len);
    s.writable.extend([(check_q.ring, 4096), (check_q.status, 64), (check_host, 4096), (check_cmds, 4096)]);
    let ram_end = s.rig.alloc_end();
    let t0 = std::time::Instant::now();
    let (mut faulted, mut blocked) = (0u64, 0u64);
    for case in 0..n {
        let pkts = cmds.new_tree(&mut runner).expect("strategy").current();
        let desc = if case % 3 == 0 {
            typed.new_tree(&mut runner).expect("strategy").current()
        } else {
            descs.new_tree(&mut runner).expect("strategy").current()
        };
        let before = protected_snapshot(&s);
        s.rig.write(desc_bus, &desc);
        let buf = pkts.concat();
        s.rig.write(cmd_bus, &buf);
        s.rig.submit(&mut s.q, CMD_VA, buf.len() as u32);
        s.rig.wait_idle(&s.q, Duration::from_millis(20));
        match s.rig.state(&s.q) {
            QueueState::Idle => {}
            st => {
                if st == QueueState::Faulted {
                    faulted += 1;
                } else {
                    blocked += 1;
                }
                s.rig.reset_queue(&mut s.q);
                assert_eq!(s.rig.state(&s.q), QueueState::Disabled, "case {case}: the reset did not stop the queue");
                s.rig.set32(regs::queue_reg(s.q.index, regs::Q_CONTROL), regs::qctl::ENABLE);
            }
        }
        assert!(s.rig.dev.healthy(), "case {case}: a command processor died");
        assert!(s.rig.private_canary_intact(), "case {case}: unshared guest memory was written");
        assert!(protected_snapshot(&s) == before, "case {case}: memory outside the context's mappings changed");
        if case % 1000 == 999 {
            assert!(dram_outside_window_untouched(&s.rig), "case {case}: DRAM outside the context's mappings changed");
            let mut e = rbln_hw::cmd::Encoder::new(Vec::new());
            e.fill(0x10_0000, 8, case as u32).fence(case + 1, 0, false);
            assert_eq!(e.buf.len() as u64, check_cmds_len);
            s.rig.write(check_cmds, &e.buf);
            s.rig.submit(&mut check_q, 0x20_0000, e.buf.len() as u32);
            assert_eq!(s.rig.wait_idle(&check_q, Duration::from_secs(10)).fence, case + 1, "case {case}: the device stopped executing work");
            assert_eq!(s.rig.read(check_host, 4), (case as u32).to_le_bytes());
            assert_eq!(s.rig.alloc_end(), ram_end, "case {case}: the check allocated guest RAM");
        }
    }
    println!(
        "fuzz command buffers: {n} cases on one device in {:.1} s, {faulted} faulted, {blocked} blocked and reset, 0 crashes",
        t0.elapsed().as_secs_f64()
    );
}
