//! Element-wise ops: broadcasting binary arithmetic and activations
//! (BINARY and UNARY descriptors; folded on constants).

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Relu",
    "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf",
    "Reciprocal", "Gelu", "Clip", "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish", "Sin", "Cos",
];

impl Importer {
    pub(super) fn lower_elementwise(&mut self, cx: &Cx, ins: &[Option<ValueId>]) -> Result<Vec<ValueId>> {
        let input = |i: usize| -> Result<ValueId> {
            ins.get(i).copied().flatten().ok_or_else(|| cx.err(format!("input {i} is missing")))
        };
        let opt = |i: usize| ins.get(i).copied().flatten();
        let op = cx.n.op_type.as_str();
        let v = match op {
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" => {
                let kind = match op {
                    "Add" => Binary::Add,
                    "Sub" => Binary::Sub,
                    "Mul" => Binary::Mul,
                    "Div" => Binary::Div,
                    "Pow" => Binary::Pow,
                    "Max" => Binary::Max,
                    _ => Binary::Min,
                };
                let xs: Vec<ValueId> = ins.iter().flatten().copied().collect();
                match xs.len() {
                    0 => return Err(cx.err("no inputs")),
                    1 => self.alias(cx, xs[0]),
                    _ => {
                        let mut acc = xs[0];
                        for (i, &x) in xs[1..].iter().enumerate() {
                            let last = i + 2 == xs.len();
                            acc = self.binary(cx, kind, acc, x, last)?;
                        }
                        acc
                    }
                }
            }
            "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Neg" | "Abs" | "Erf" | "Reciprocal" | "Sin" | "Cos" | "Gelu" => {
                let x = input(0)?;
                let kind = match op {
                    "Relu" => Unary::Relu,
                    "Sigmoid" => Unary::Sigmoid,
                    "Tanh" => Unary::Tanh,
                    "Exp" => Unary::Exp,
                    "Log" => Unary::Log,
                    "Sqrt" => Unary::Sqrt,
                    "Neg" => Unary::Neg,
                    "Abs" => Unary::Abs,
                    "Erf" => Unary::Erf,
                    "Reciprocal" => Unary::Reciprocal,
                    "Sin" => Unary::Sin,
                    "Cos" => Unary::Cos,
                    _ => match cx.string("approximate").as_deref() {
                        None | Some("none") => Unary::Gelu,
                        Some("tanh") => Unary::GeluTanh,
                        Some(o) => return Err(cx.err(format!("approximate='{o}' is not supported"))),
                    },
                };
                self.unary(cx, kind, x, 0.0, 0.0)?
            }
            "Clip" => {
                let x = input(0)?;
                let (lo, hi) = if self.opset < 11 {
                    (cx.float("min", f32::NEG_INFINITY), cx.float("max", f32::INFINITY))
                } else {
                    let bound = |s: &Self, i: usize, d: f32| -> Result<f32> {
                        match opt(i) {
                            None => Ok(d),
                            Some(v) => s
                                .konst(v)
                                .and_then(Const::scalar)
                                .ok_or_else(|| cx.err(format!("input {i} (a bound) must be a one-element constant"))),
                        }
                    };
                    (bound(self, 1, f32::NEG_INFINITY)?, bound(self, 2, f32::INFINITY)?)
                };
                if lo == 0.0 && hi == f32::INFINITY {
                    self.unary(cx, Unary::Relu, x, 0.0, 0.0)?
                } else {
                    self.unary(cx, Unary::Clip, x, lo, hi)?
                }
            }
            "LeakyRelu" => {
                let (x, alpha) = (input(0)?, cx.float("alpha", 0.01));
                let s = self.shape(x);
                if (0.0..=1.0).contains(&alpha) {
                    // max(x, alpha * x)
                    let a = self.scalar(cx, "alpha", alpha);
                    let ax = self.elementwise(cx, Binary::Mul, x, a, Some("scaled"))?;
                    self.elementwise(cx, Binary::Max, x, ax, None)?
                } else {
                    let a = self.scalar(cx, "alpha", alpha);
                    self.relu_plus_scaled_negative(cx, x, a, s)?
                }
            }
            "PRelu" => {
                let (x, slope) = (input(0)?, input(1)?);
                let s = self.shape(x);
                if cx.shape(shape::broadcast(&s, &self.shape(slope)))? != s {
                    return Err(cx.err(format!("slope {:?} does not broadcast to the input {s:?}", self.shape(slope))));
                }
                self.relu_plus_scaled_negative(cx, x, slope, s)?
            }
            "HardSigmoid" => {
                let x = input(0)?;
                self.unary(cx, Unary::HardSigmoid, x, cx.float("alpha", 0.2), cx.float("beta", 0.5))?
            }
            "HardSwish" => self.unary(cx, Unary::HardSwish, input(0)?, 0.0, 0.0)?,
            _ => return Err(cx.err(format!("internal error: '{op}' is not a elementwise op"))),
        };
        Ok(vec![v])
    }

    /// `a (kind) b`, folded when both are constants; `last` names the
    /// result after the node's output, otherwise it is an intermediate.
    pub(super) fn binary(&mut self, cx: &Cx, kind: Binary, a: ValueId, b: ValueId, last: bool) -> Result<ValueId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let out = cx.shape(shape::broadcast(&sa, &sb))?;
        if let (Some(ca), Some(cb)) = (self.konst(a), self.konst(b)) {
            let c = cx.shape(fold::binary(&cx.n.op_type, ca, cb))?;
            let name = if last { Self::out_name(cx, 0) } else { format!("{}.{}", Self::out_name(cx, 0), self.g.values.len()) };
            return Ok(self.constant(&name, c));
        }
        rank_ok(cx, &out, "the result")?;
        let r = out.len();
        let k = Kind::Binary { kind, a, b, a_dims: shape::pad_rank(&sa, r), b_dims: shape::pad_rank(&sb, r), act: Act::NONE };
        Ok(if last { self.device(cx, k, out) } else { self.device_tmp(cx, k, out, "partial") })
    }

    pub(super) fn scalar(&mut self, cx: &Cx, tag: &str, v: f32) -> ValueId {
        self.constant(&format!("{}.{tag}", cx.name), Const::f32(&[], vec![v]))
    }

    /// One element-wise device op of a multi-op lowering (never folded):
    /// an intermediate named by `tag`, or the node's output when None.
    pub(super) fn elementwise(&mut self, cx: &Cx, kind: Binary, a: ValueId, b: ValueId, tag: Option<&str>) -> Result<ValueId> {
        let (sa, sb) = (self.shape(a), self.shape(b));
        let out = cx.shape(shape::broadcast(&sa, &sb))?;
        rank_ok(cx, &out, "the result")?;
        let r = out.len();
        let k = Kind::Binary { kind, a, b, a_dims: shape::pad_rank(&sa, r), b_dims: shape::pad_rank(&sb, r), act: Act::NONE };
        Ok(match tag {
            Some(t) => self.device_tmp(cx, k, out, t),
            None => self.device(cx, k, out),
        })
    }

    /// relu(x) + slope * min(x, 0): LeakyRelu with alpha > 1, PRelu.
    pub(super) fn relu_plus_scaled_negative(&mut self, cx: &Cx, x: ValueId, slope: ValueId, s: Vec<u64>) -> Result<ValueId> {
        let pos = self.device_tmp(cx, Kind::Unary { kind: Unary::Relu, x, p0: 0.0, p1: 0.0 }, s, "positive");
        let zero = self.scalar(cx, "zero", 0.0);
        let neg = self.elementwise(cx, Binary::Min, x, zero, Some("negative"))?;
        let scaled = self.elementwise(cx, Binary::Mul, neg, slope, Some("scaled"))?;
        self.elementwise(cx, Binary::Add, pos, scaled, None)
    }

    pub(super) fn unary(&mut self, cx: &Cx, kind: Unary, x: ValueId, p0: f32, p1: f32) -> Result<ValueId> {
        let s = self.shape(x);
        if let Some(c) = self.konst(x) {
            let name = match kind {
                Unary::Relu => Some("Relu"),
                Unary::Sigmoid => Some("Sigmoid"),
                Unary::Tanh => Some("Tanh"),
                Unary::Exp => Some("Exp"),
                Unary::Log => Some("Log"),
                Unary::Sqrt => Some("Sqrt"),
                Unary::Neg => Some("Neg"),
                Unary::Abs => Some("Abs"),
                Unary::Reciprocal => Some("Reciprocal"),
                Unary::Sin => Some("Sin"),
                Unary::Cos => Some("Cos"),
                _ => None,
            };
            if let Some(f) = name.and_then(|n| fold::unary(n, c)) {
                return Ok(self.constant(&Self::out_name(cx, 0), f));
            }
            let f: Option<fn(f32, f32, f32) -> f32> = match kind {
                Unary::Clip => Some(|x, lo, hi| x.max(lo).min(hi)),
                Unary::HardSigmoid => Some(|x, a, b| (a * x + b).clamp(0.0, 1.0)),
                Unary::HardSwish => Some(|x, _, _| x * (x * (1.0 / 6.0) + 0.5).clamp(0.0, 1.0)),
                _ => None,
            };
            if let Some(f) = f {
                let v = c.floats().iter().map(|&x| f(x, p0, p1)).collect();
                return Ok(self.constant(&Self::out_name(cx, 0), Const::f32(&s, v)));
            }
        }
        Ok(self.device(cx, Kind::Unary { kind, x, p0, p1 }, s))
    }
}
