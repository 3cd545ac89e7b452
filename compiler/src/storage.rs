//! Which run-time values share arena bytes: concatenations and slices
//! done in place.
//!
//! A storage is a set of values at byte positions; its bytes are the span
//! of theirs. A view shares its input's bytes; a slice that is one
//! contiguous range of its input (a split along channels at batch 1)
//! shares those bytes instead of copying them. A concatenation whose
//! inputs each land in one contiguous range of the result (the axis and
//! everything before it of extent 1: a channel concat at batch 1, any
//! concat of vectors) becomes a view of its inputs side by side when
//! their producers can write straight into the result: the copy
//! disappears, and with it the bytes of the separate inputs (DenseNet's
//! blocks, whose every layer concatenates all earlier features, then live
//! in one buffer). The rule the `.rbln` reader checks
//! (docs/rbln-format.md §13.7) holds by construction: within a storage,
//! the values something writes (not views) share no byte; a concatenation
//! that would break it (an input used twice, two concatenations placing
//! one value at different positions) stays a copy.

use std::collections::HashMap;

use crate::error::{CompileError, Result};
use crate::ir::{CopyPart, Graph, Kind, ValueId};

/// A value's bytes in its storage: (storage, byte position, bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub storage: usize,
    pub pos: i64,
    pub bytes: u64,
}

#[derive(Default)]
struct Storage {
    /// (value, position, bytes).
    members: Vec<(ValueId, i64, u64)>,
    /// Byte ranges [start, end) of the members something writes.
    written: Vec<(i64, i64)>,
}

/// The storages of a graph's run-time values.
#[derive(Default)]
pub struct Storages {
    of: HashMap<ValueId, Place>,
    storages: Vec<Storage>,
}

impl Storages {
    /// A value an op (or the runtime, for a model input) writes, in bytes
    /// of its own.
    pub fn written(&mut self, v: ValueId, bytes: u64) {
        let storage = self.storages.len();
        self.storages.push(Storage { members: vec![(v, 0, bytes)], written: vec![(0, bytes as i64)] });
        self.of.insert(v, Place { storage, pos: 0, bytes });
    }

    /// `out` reinterprets the bytes of `x`.
    pub fn view(&mut self, out: ValueId, x: ValueId) -> Result<()> {
        let p = self.place(x)?;
        self.storages[p.storage].members.push((out, p.pos, p.bytes));
        self.of.insert(out, p);
        Ok(())
    }

    /// `out` is the bytes of `x` from byte `offset` on.
    pub fn view_at(&mut self, out: ValueId, x: ValueId, offset: u64, bytes: u64) -> Result<()> {
        let p = self.place(x)?;
        if offset.checked_add(bytes).is_none_or(|end| end > p.bytes) {
            return Err(CompileError::Invalid(format!("value {out}: bytes {offset}+{bytes} outside its source's {}", p.bytes)));
        }
        let pos = p.pos + offset as i64;
        self.storages[p.storage].members.push((out, pos, bytes));
        self.of.insert(out, Place { storage: p.storage, pos, bytes });
        Ok(())
    }

    /// Make `out` the values `parts` (value, bytes) side by side, each
    /// moved to its position inside `out` with everything sharing its
    /// storage. False (and nothing changed) when that would place a value
    /// at two positions or make two written values share bytes.
    pub fn concat(&mut self, out: ValueId, parts: &[(ValueId, u64)]) -> Result<bool> {
        let Some(&(first, _)) = parts.first() else { return Ok(false) };
        let base = self.place(first)?;
        // Every storage involved and the shift that brings it into base's
        // coordinates, where `out` starts at `start`.
        let start = base.pos;
        let mut shift: Vec<(usize, i64)> = Vec::new();
        let mut at = start;
        for &(v, bytes) in parts {
            let p = self.place(v)?;
            if p.bytes != bytes {
                return Ok(false);
            }
            let s = at - p.pos;
            match shift.iter().find(|(st, _)| *st == p.storage) {
                Some(&(_, s0)) if s0 != s => return Ok(false),
                Some(_) => {}
                None => shift.push((p.storage, s)),
            }
            at += bytes as i64;
        }
        // Base keeps its coordinates; a part that is in base must already
        // sit where it belongs.
        if shift.iter().any(|&(st, s)| st == base.storage && s != 0) {
            return Ok(false);
        }
        let mut written: Vec<(i64, i64)> =
            shift.iter().flat_map(|&(st, s)| self.storages[st].written.iter().map(move |&(a, b)| (a + s, b + s))).collect();
        written.sort_unstable();
        if written.windows(2).any(|w| w[0].1 > w[1].0) {
            return Ok(false);
        }
        // Commit: every other storage's members move into base.
        for &(st, s) in &shift {
            if st == base.storage {
                continue;
            }
            let moved = std::mem::take(&mut self.storages[st]);
            for &(v, pos, bytes) in &moved.members {
                self.of.insert(v, Place { storage: base.storage, pos: pos + s, bytes });
                self.storages[base.storage].members.push((v, pos + s, bytes));
            }
        }
        let b = &mut self.storages[base.storage];
        b.written = written;
        let bytes = (at - start) as u64;
        b.members.push((out, start, bytes));
        self.of.insert(out, Place { storage: base.storage, pos: start, bytes });
        Ok(true)
    }

    pub fn place(&self, v: ValueId) -> Result<Place> {
        self.of.get(&v).copied().ok_or_else(|| CompileError::Invalid(format!("value {v} is read before it is computed")))
    }

    /// Storages with members: (index, lowest position, bytes spanned).
    pub fn spans(&self) -> Vec<(usize, i64, u64)> {
        self.storages
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let lo = s.members.iter().map(|m| m.1).min()?;
                let hi = s.members.iter().map(|m| m.1 + m.2 as i64).max()?;
                Some((i, lo, (hi - lo) as u64))
            })
            .collect()
    }

    /// The storages of `g`'s run-time values, its in-place concatenations
    /// ([`Kind::ConcatView`]) laid out as [`in_place`] decided.
    pub fn of_graph(g: &Graph) -> Result<Self> {
        let mut s = Storages::default();
        for (_, v) in &g.inputs {
            s.written(*v, byte_size(g, *v));
        }
        for op in &g.ops {
            match &op.kind {
                Kind::View { x } => s.view(op.out, *x)?,
                Kind::SliceView { x, offset } => s.view_at(op.out, *x, *offset, byte_size(g, op.out))?,
                Kind::ConcatView { parts } => {
                    let parts: Vec<(ValueId, u64)> = parts.iter().map(|&v| (v, byte_size(g, v))).collect();
                    if !s.concat(op.out, &parts)? {
                        return Err(CompileError::Invalid(format!("{}: the concatenation can no longer be done in place", op.name)));
                    }
                }
                _ => s.written(op.out, byte_size(g, op.out)),
            }
        }
        Ok(s)
    }
}

fn byte_size(g: &Graph, v: ValueId) -> u64 {
    g.values[v].elems() * g.values[v].dtype.size()
}

/// Whether a copy part moves one contiguous run on both sides: its box
/// is row-major over both (extent-1 dims skipped).
fn one_run(p: &CopyPart) -> bool {
    let mut expect = 1;
    for d in (0..p.sizes.len()).rev() {
        if p.sizes[d] == 1 {
            continue;
        }
        if p.src_strides.get(d) != Some(&expect) || p.dst_strides.get(d) != Some(&expect) {
            return false;
        }
        expect *= p.sizes[d];
    }
    true
}

/// The inputs of a copy that is a concatenation with every input landing
/// whole in one contiguous range of the output, in output order; None for
/// any other copy.
fn contiguous_concat(g: &Graph, parts: &[CopyPart], out: ValueId) -> Option<Vec<ValueId>> {
    // Copies move 4-byte elements.
    let four = |v: ValueId| g.values[v].dtype.size() == 4;
    if !four(out) {
        return None;
    }
    let mut at = 0;
    let mut srcs = Vec::with_capacity(parts.len());
    for p in parts {
        let n = crate::shape::volume(&p.sizes);
        if g.konst(p.src).is_some() || !four(p.src) || p.src_offset != 0 || p.dst_offset != at || n != g.values[p.src].elems() {
            return None;
        }
        if !one_run(p) {
            return None;
        }
        at += n;
        srcs.push(p.src);
    }
    (at == g.values[out].elems() && !srcs.is_empty()).then_some(srcs)
}

/// The source and element offset of a copy that takes one contiguous
/// range of its source whole into its output (a slice along the first axis
/// of extent above 1, a channel split at batch 1); None for any other copy.
fn contiguous_slice(g: &Graph, parts: &[CopyPart], out: ValueId) -> Option<(ValueId, u64)> {
    let [p] = parts else { return None };
    let four = |v: ValueId| g.values[v].dtype.size() == 4;
    if g.konst(p.src).is_some() || !four(p.src) || !four(out) || p.dst_offset != 0 || crate::shape::volume(&p.sizes) != g.values[out].elems() {
        return None;
    }
    one_run(p).then_some((p.src, p.src_offset))
}

/// What [`in_place`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InPlace {
    /// Concatenations become [`Kind::ConcatView`]s.
    pub concats: usize,
    /// Slices become [`Kind::SliceView`]s.
    pub slices: usize,
}

/// Turn every copy that is a concatenation its inputs' producers can write
/// in place into a [`Kind::ConcatView`], and every copy of one contiguous
/// range of a value into a [`Kind::SliceView`] of it.
pub fn in_place(g: &mut Graph) -> InPlace {
    let mut s = Storages::default();
    for (_, v) in &g.inputs {
        s.written(*v, byte_size(g, *v));
    }
    let mut done = InPlace::default();
    for i in 0..g.ops.len() {
        let out = g.ops[i].out;
        let ok = match &g.ops[i].kind {
            Kind::View { x } => s.view(out, *x).is_ok(),
            Kind::Copy { parts } => {
                if let Some((x, at)) = contiguous_slice(g, parts, out) {
                    if s.view_at(out, x, 4 * at, byte_size(g, out)).is_ok() {
                        g.ops[i].kind = Kind::SliceView { x, offset: 4 * at };
                        done.slices += 1;
                        continue;
                    }
                }
                match contiguous_concat(g, parts, out) {
                    Some(srcs) => {
                        let sized: Vec<(ValueId, u64)> = srcs.iter().map(|&v| (v, byte_size(g, v))).collect();
                        if s.concat(out, &sized).unwrap_or(false) {
                            g.ops[i].kind = Kind::ConcatView { parts: srcs };
                            done.concats += 1;
                            continue;
                        }
                        false
                    }
                    None => false,
                }
            }
            _ => false,
        };
        if !ok {
            s.written(out, byte_size(g, out));
        }
    }
    done
}
