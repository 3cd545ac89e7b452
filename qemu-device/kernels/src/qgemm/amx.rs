//! The int8 convolution core on the AMX tile unit: for weights in the
//! tile layout (`rbln_hw::ops::pack_qconv_tiles`), 16 output channels ×
//! 16 positions per `tdpbsud`.
//!
//! The product is computed transposed, `Cᵀ = W · Xᵀ`: tile A holds 16
//! output channels' rows of 64 weight bytes (16 quads of one tap: one run
//! of the tile layout, rows 64 bytes apart), tile B 16 quads of the same
//! tap for 16 positions (each row one 64-byte vector of [`super::vnni`]'s
//! layout, 16 positions × 4 channels, the quads `quad_stride` apart in the
//! stage), and `tdpbsud` (signed A × unsigned B, sums of 4 products in
//! i32, exact) accumulates C's rows: one output channel's 16 positions,
//! exactly what the VNNI core holds in one register, so the epilogue is
//! [`super::vnni::store_column`] and the results are bit-identical.
//!
//! A micro-tile is 2 × 2 C tiles (32 channels × 32 positions) in tmm0-3,
//! two weight tiles in tmm4-5 and two activation tiles in tmm6-7: per run
//! 4 tile loads for 4 `tdpbsud` (16 × 16 × 64 multiply-adds each); the
//! quads past a tap's whole runs are added to the stored tiles with
//! `vpdpbusd`. Weights with zero points (the rows' sums of A), and taps of
//! fewer than 16 quads, stay on the VNNI core.
//!
//! Linux enables the tile state per process on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), which
//! [`available`] makes once; each task loads the tile configuration and
//! releases the tiles when it is done, so that threads switched out
//! between kernels carry no tile state.

use core::arch::asm;
use core::arch::x86_64::{__m512i, _mm512_dpbusd_epi32, _mm512_loadu_si512, _mm512_set1_epi32};

use super::vnni::{store_column, Core, Dst, Seg, TILE_COLS, TILE_RUN};

/// Whether this CPU and OS run the AMX core: the VNNI core's features,
/// AMX-TILE and AMX-INT8, the tile state enabled by the OS and granted to
/// this process, and `RBLN_NO_AMX` unset (tests and A/B measurements).
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| super::vnni::available() && std::env::var_os("RBLN_NO_AMX").is_none() && cpu_has_amx_int8() && request_tile_data())
}

/// CPUID: AMX-TILE and AMX-INT8 (leaf 7, EDX bits 24 and 25), and the OS
/// enabling the tile state in XCR0 (bits 17 and 18; OSXSAVE first).
fn cpu_has_amx_int8() -> bool {
    use core::arch::x86_64::__cpuid_count;
    // CPUID is always available on x86_64.
    let (l1, l7) = (__cpuid_count(1, 0), __cpuid_count(7, 0));
    if l1.ecx & (1 << 27) == 0 || l7.edx & (3 << 24) != 3 << 24 {
        return false;
    }
    let (lo, _hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 reads XCR0; OSXSAVE (checked) makes it
    // available at any privilege level.
    unsafe { asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack, preserves_flags)) };
    lo & (3 << 17) == 3 << 17
}

/// Asks Linux for permission to use the tile data state (process-wide).
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this code only changes the process's
    // permitted extended-state features.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

/// LDTILECFG's 64-byte operand: palette 1, every tile 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// One micro-tile's C tiles, stored: `[tile][channel row][position]`,
/// tile `2i + v` for channel block i and vector v.
#[repr(C, align(64))]
struct CTiles([[[i32; 16]; 16]; 4]);

/// Runs `core`'s columns `c0 .. c0+nc` over `nvec` vectors as
/// [`Core::tiles`] describes (`a`, `vstride`, `at`, `quad_stride`,
/// `segs`), the weights in tiles of `taps` taps.
///
/// Each tap's quads past its whole runs (`kg/taps` mod 16 of them) are
/// added on the vector unit, as the VNNI core does, to the stored C
/// tiles.
///
/// # Safety
/// [`available`]; `c0` a multiple of 16, `kg/taps` at least 16, B at
/// least `⌈(c0+nc)/16⌉` blocks, no zero points; every vector's 64 bytes
/// of every group readable, quad runs `quad_stride` apart as stated; the
/// stored elements lie in the destination and no other task writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tiles(core: &Core<'_>, taps: usize, a: *const u8, vstride: usize, nvec: usize, at: &impl Fn(usize) -> usize, quad_stride: usize, segs: &[Seg], c0: usize, nc: usize, d: &Dst<'_>) {
    let kg = core.kg;
    let qn = kg / taps;
    let (runs, tail) = (qn / TILE_RUN, qn % TILE_RUN);
    let block_bytes = 64 * kg;
    // Run r of tap s: its weights' and its first quad's offsets.
    let run_at = |s: usize, r: usize| (rbln_hw::ops::qconv_tile_run(kg, taps, s, r).0, at(r * TILE_RUN * taps + s));
    let mut c = CTiles([[[0; 16]; 16]; 4]);
    // SAFETY: AMX available (caller); the configuration is well formed.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
    let (b0, b1) = (c0 / TILE_COLS, (c0 + nc).div_ceil(TILE_COLS));
    let mut blk = b0;
    while blk < b1 {
        let nb = (b1 - blk).min(2);
        let w0 = core.b[blk * block_bytes..].as_ptr();
        let mut v = 0;
        while v < nvec {
            let nv = (nvec - v).min(2);
            let x0 = a.wrapping_add(v * vstride);
            // SAFETY: the tiles exist (configured above); every load reads
            // 16 rows of 64 bytes: weight rows of blocks blk, blk+1 (nb =
            // 2) inside B (caller), vector rows of vectors v, v+1 (nv = 2)
            // of the caller's readable groups.
            unsafe {
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
                let steps = taps * runs;
                for step in 0..steps {
                    let (wo, xo) = run_at(step / runs, step % runs);
                    let (wa, xa) = (w0.add(wo), x0.wrapping_add(xo));
                    match (nb, nv) {
                        (2, 2) => asm!(
                            "tileloadd tmm4, [{w} + {ws}*1]",
                            "tileloadd tmm5, [{w2} + {ws}*1]",
                            "tileloadd tmm6, [{x} + {xs}*1]",
                            "tileloadd tmm7, [{x2} + {xs}*1]",
                            "tdpbsud tmm0, tmm4, tmm6",
                            "tdpbsud tmm1, tmm4, tmm7",
                            "tdpbsud tmm2, tmm5, tmm6",
                            "tdpbsud tmm3, tmm5, tmm7",
                            w = in(reg) wa, w2 = in(reg) wa.add(block_bytes), ws = in(reg) 64usize,
                            x = in(reg) xa, x2 = in(reg) xa.wrapping_add(vstride), xs = in(reg) quad_stride,
                            options(nostack, readonly),
                        ),
                        (2, _) => asm!(
                            "tileloadd tmm4, [{w} + {ws}*1]",
                            "tileloadd tmm5, [{w2} + {ws}*1]",
                            "tileloadd tmm6, [{x} + {xs}*1]",
                            "tdpbsud tmm0, tmm4, tmm6",
                            "tdpbsud tmm2, tmm5, tmm6",
                            w = in(reg) wa, w2 = in(reg) wa.add(block_bytes), ws = in(reg) 64usize,
                            x = in(reg) xa, xs = in(reg) quad_stride,
                            options(nostack, readonly),
                        ),
                        (_, 2) => asm!(
                            "tileloadd tmm4, [{w} + {ws}*1]",
                            "tileloadd tmm6, [{x} + {xs}*1]",
                            "tileloadd tmm7, [{x2} + {xs}*1]",
                            "tdpbsud tmm0, tmm4, tmm6",
                            "tdpbsud tmm1, tmm4, tmm7",
                            w = in(reg) wa, ws = in(reg) 64usize,
                            x = in(reg) xa, x2 = in(reg) xa.wrapping_add(vstride), xs = in(reg) quad_stride,
                            options(nostack, readonly),
                        ),
                        _ => asm!(
                            "tileloadd tmm4, [{w} + {ws}*1]",
                            "tileloadd tmm6, [{x} + {xs}*1]",
                            "tdpbsud tmm0, tmm4, tmm6",
                            w = in(reg) wa, ws = in(reg) 64usize,
                            x = in(reg) xa, xs = in(reg) quad_stride,
                            options(nostack, readonly),
                        ),
                    }
                }
                let cp = c.0.as_mut_ptr();
                asm!(
                    "tilestored [{c0} + {s}*1], tmm0",
                    "tilestored [{c1} + {s}*1], tmm1",
                    "tilestored [{c2} + {s}*1], tmm2",
                    "tilestored [{c3} + {s}*1], tmm3",
                    c0 = in(reg) cp, c1 = in(reg) cp.add(1), c2 = in(reg) cp.add(2), c3 = in(reg) cp.add(3), s = in(reg) 64usize,
                    options(nostack),
                );
            }
            for i in 0..nb {
                for vi in 0..nv {
                    let tile = &c.0[2 * i + vi];
                    // SAFETY: 16 i32 per row.
                    let mut acc: [__m512i; 16] = core::array::from_fn(|r| unsafe { _mm512_loadu_si512(tile[r].as_ptr().cast()) });
                    // The quads past a tap's whole runs on the vector unit:
                    // channel r's row of the last run (4·tail bytes) against
                    // the vector's 64 bytes of each quad.
                    if tail > 0 {
                        let xv = x0.wrapping_add(vi * vstride);
                        for s in 0..taps {
                            let wrun = w0.wrapping_add(i * block_bytes + rbln_hw::ops::qconv_tile_run(kg, taps, s, runs).0);
                            for t in 0..tail {
                                // SAFETY: the vector's 64 bytes of group
                                // (16·runs + t)·taps + s, and channel r's 4
                                // bytes of that quad inside the block
                                // (caller).
                                let av = unsafe { _mm512_loadu_si512(xv.wrapping_add(at((runs * TILE_RUN + t) * taps + s)).cast()) };
                                for (r, acc) in acc.iter_mut().enumerate() {
                                    // SAFETY: as above.
                                    let wq = unsafe { wrun.add(4 * tail * r + 4 * t).cast::<i32>().read_unaligned() };
                                    *acc = _mm512_dpbusd_epi32(*acc, av, _mm512_set1_epi32(wq));
                                }
                            }
                        }
                    }
                    let seg = &segs[v + vi];
                    for (row, acc) in acc.into_iter().enumerate() {
                        let j = (blk + i) * TILE_COLS + row;
                        if j >= c0 + nc {
                            break;
                        }
                        // SAFETY: the stores are the caller's.
                        unsafe { store_column(acc, None, &core.cols, j, j - c0, seg, core.kind, d) };
                    }
                }
            }
            v += nv;
        }
        blk += nb;
    }
    // SAFETY: AMX available; drops the tile state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}
