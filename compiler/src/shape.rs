//! Static shape rules shared by constant folding and device lowering, and
//! element-index helpers for folding. Errors are plain reasons; the caller
//! adds the node.

pub type R<T> = Result<T, String>;

/// Row-major strides (elements) of a shape.
pub fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

/// Element count; saturates instead of overflowing (the importer refuses
/// any tensor above [`MAX_ELEMS`]).
pub fn volume(shape: &[u64]) -> u64 {
    shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
}

/// Largest tensor the compiler accepts (elements): 64 GiB of f32.
pub const MAX_ELEMS: u64 = 1 << 34;
/// Largest tensor the compiler computes on the host (constant folding).
pub const MAX_FOLD_ELEMS: u64 = 1 << 26;

/// Refuse folding a constant of `shape` when it is too large.
pub fn fold_limit(shape: &[u64]) -> R<()> {
    let n = volume(shape);
    if n > MAX_FOLD_ELEMS {
        return Err(format!("a {n}-element constant result is too large to fold (limit {MAX_FOLD_ELEMS})"));
    }
    Ok(())
}

/// Normalise a possibly negative axis for a tensor of `rank` dims
/// (`rank + 1` allowed when `inclusive`, as for Unsqueeze).
pub fn axis(a: i64, rank: usize, inclusive: bool) -> R<usize> {
    let r = rank as i64 + inclusive as i64;
    let v = if a < 0 { a + r } else { a };
    if v < 0 || v >= r {
        return Err(format!("axis {a} is out of range for rank {rank}"));
    }
    Ok(v as usize)
}

/// Numpy broadcast of two shapes.
pub fn broadcast(a: &[u64], b: &[u64]) -> R<Vec<u64>> {
    let r = a.len().max(b.len());
    let pad = |s: &[u64]| -> Vec<u64> { std::iter::repeat_n(1, r - s.len()).chain(s.iter().copied()).collect() };
    let (pa, pb) = (pad(a), pad(b));
    pa.iter()
        .zip(&pb)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Ok(x),
            (1, _) => Ok(y),
            (_, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// `shape` padded with leading 1s to `rank`.
pub fn pad_rank(shape: &[u64], rank: usize) -> Vec<u64> {
    std::iter::repeat_n(1, rank.saturating_sub(shape.len())).chain(shape.iter().copied()).collect()
}

/// ONNX Reshape target: 0 copies the input dim (unless `allowzero`), one
/// -1 is inferred.
pub fn reshape(input: &[u64], spec: &[i64], allowzero: bool) -> R<Vec<u64>> {
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            -1 => return Err("shape has more than one -1".into()),
            0 if !allowzero => out.push(*input.get(i).ok_or_else(|| format!("shape {spec:?}: 0 at axis {i} beyond the input's rank"))?),
            d if d < 0 => return Err(format!("shape {spec:?} has a negative dimension")),
            d => out.push(d as u64),
        }
    }
    let n = volume(input);
    if let Some(i) = infer {
        let rest = volume(&out);
        if rest == 0 || !n.is_multiple_of(rest) {
            return Err(format!("cannot reshape {input:?} to {spec:?}"));
        }
        out[i] = n / rest;
    }
    if volume(&out) != n {
        return Err(format!("cannot reshape {input:?} ({n} elements) to {out:?}"));
    }
    Ok(out)
}

/// Shape after ONNX Slice, and per-axis (start, step) of the source box.
/// An axis sliced with a negative step is described by its elements in
/// ascending order (`start` is the lowest index taken, `step` the
/// magnitude) and marked `reversed`: the result is that box flipped along
/// the axis.
pub struct SliceBox {
    pub out: Vec<u64>,
    pub start: Vec<u64>,
    pub step: Vec<u64>,
    pub reversed: Vec<bool>,
}

pub fn slice(input: &[u64], starts: &[i64], ends: &[i64], axes: Option<&[i64]>, steps: Option<&[i64]>) -> R<SliceBox> {
    let rank = input.len();
    if starts.len() != ends.len() {
        return Err(format!("{} starts but {} ends", starts.len(), ends.len()));
    }
    let mut out = input.to_vec();
    let mut start = vec![0u64; rank];
    let mut step = vec![1u64; rank];
    let mut seen = vec![false; rank];
    let mut reversed = vec![false; rank];
    for i in 0..starts.len() {
        let a = match axes {
            Some(ax) => axis(*ax.get(i).ok_or("fewer axes than starts")?, rank, false)?,
            None => i,
        };
        if a >= rank || seen[a] {
            return Err(format!("axis {a} is repeated or out of range"));
        }
        seen[a] = true;
        let st = steps.map_or(Ok(1), |s| s.get(i).copied().ok_or("fewer steps than starts"))?;
        if st == 0 {
            return Err(format!("step 0 on axis {a}"));
        }
        let d = input[a] as i64;
        if st < 0 {
            // Counting down: starts clamp to [0, d-1], ends to [-1, d-1].
            let clamp = |v: i64| -> i64 { (if v < 0 { v.saturating_add(d) } else { v }).clamp(-1, d - 1) };
            let (s, e) = (clamp(starts[i]).max(0), clamp(ends[i]));
            let mag = st.unsigned_abs() as i64;
            let len = if s > e && d > 0 { (s - e + mag - 1) / mag } else { 0 };
            out[a] = len as u64;
            start[a] = if len > 0 { (s - (len - 1) * mag) as u64 } else { 0 };
            step[a] = mag as u64;
            reversed[a] = true;
            continue;
        }
        let clamp = |v: i64| -> i64 {
            let v = if v < 0 { v.saturating_add(d) } else { v };
            v.clamp(0, d)
        };
        let (s, e) = (clamp(starts[i]), clamp(ends[i]));
        let len = if e > s { (e - s + st - 1) / st } else { 0 };
        out[a] = len as u64;
        start[a] = s as u64;
        step[a] = st as u64;
    }
    Ok(SliceBox { out, start, step, reversed })
}

/// Flat source indices of the elements of a strided box, in row-major
/// order of the box.
pub fn box_indices(sizes: &[u64], strides: &[u64], offset: u64) -> Vec<usize> {
    let n = volume(sizes) as usize;
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0u64; sizes.len()];
    for _ in 0..n {
        out.push((offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<u64>()) as usize);
        for d in (0..sizes.len()).rev() {
            idx[d] += 1;
            if idx[d] < sizes[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Source strides that broadcast `shape` (right-aligned) to `out`.
pub fn broadcast_strides(shape: &[u64], out: &[u64]) -> Vec<u64> {
    let p = pad_rank(shape, out.len());
    let s = strides(&p);
    p.iter().zip(s).map(|(&d, s)| if d == 1 { 0 } else { s }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_rules() {
        assert_eq!(broadcast(&[2, 1, 4], &[3, 1]).unwrap(), vec![2, 3, 4]);
        assert!(broadcast(&[2, 3], &[4]).is_err());
        assert_eq!(reshape(&[2, 16, 2, 16], &[2, 16, -1], false).unwrap(), vec![2, 16, 32]);
        assert_eq!(reshape(&[2, 3, 4], &[0, -1], false).unwrap(), vec![2, 12]);
        assert!(reshape(&[2, 3], &[-1, -1], false).is_err());
        assert!(reshape(&[2, 3], &[4, 2], false).is_err());
        let b = slice(&[4, 9], &[1], &[8], Some(&[1]), Some(&[2])).unwrap();
        assert_eq!((b.out, b.start, b.step), (vec![4, 4], vec![0, 1], vec![1, 2]));
        let b = slice(&[10], &[-3], &[i64::MAX], None, None).unwrap();
        assert_eq!((b.out, b.start), (vec![3], vec![7]));
        assert_eq!(axis(-1, 3, false).unwrap(), 2);
        assert_eq!(axis(3, 3, true).unwrap(), 3);
        assert!(axis(3, 3, false).is_err());
        assert_eq!(box_indices(&[2, 2], &[3, 1], 1), vec![1, 2, 4, 5]);
        assert_eq!(broadcast_strides(&[3, 1], &[2, 3, 4]), vec![0, 1, 0]);
    }
}
