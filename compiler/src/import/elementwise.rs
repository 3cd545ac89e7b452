//! Element-wise ops: broadcasting binary arithmetic and activations
//! (BINARY and UNARY descriptors; folded on constants). Activations without
//! a UNARY code of their own (Softplus, Softsign, Elu, Selu, Celu, Mish,
//! ThresholdedRelu) are short chains of them, written in forms that do not
//! overflow: `softplus(x) = relu(x) + log(1 + exp(−|x|))`, the ELU family
//! through `exp(min(x, 0))`.

use super::*;

/// The ONNX op types this module lowers.
pub(super) const OPS: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Relu",
    "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf",
    "Reciprocal", "Gelu", "Clip", "LeakyRelu", "PRelu", "HardSigmoid", "HardSwish", "Sin", "Cos",
    "Floor", "Ceil", "Round", "Sign", "Mod",
    "Sum", "Mean", "Softplus", "Softsign", "Elu", "Selu", "Celu", "Mish", "ThresholdedRelu",
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
            "Mod" => {
                let (a, b) = (input(0)?, input(1)?);
                let fmod = match cx.int("fmod", 0) {
                    0 => false,
                    1 => true,
                    f => return Err(cx.err(format!("fmod={f}; it must be 0 or 1"))),
                };
                if let (Some(ca), Some(cb)) = (self.konst(a), self.konst(b)) {
                    let c = cx.shape(fold::modulo(ca, cb, fmod))?;
                    self.constant(&Self::out_name(cx, 0), c)
                } else {
                    // fmod=0 is Python's remainder. (ONNX allows it for
                    // integers only, but integer arithmetic runs in f32 here,
                    // so run-time integer operands look like floats.)
                    let kind = if fmod { Binary::FMod } else { Binary::Mod };
                    self.elementwise(cx, kind, a, b, None)?
                }
            }
            "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Neg" | "Abs" | "Erf" | "Reciprocal" | "Sin" | "Cos" | "Gelu"
            | "Floor" | "Ceil" | "Round" | "Sign" => {
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
                    "Floor" => Unary::Floor,
                    "Ceil" => Unary::Ceil,
                    "Round" => Unary::Round,
                    "Sign" => Unary::Sign,
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
            "Sum" | "Mean" => {
                let xs: Vec<ValueId> = ins.iter().flatten().copied().collect();
                let Some((&first, rest)) = xs.split_first() else { return Err(cx.err("no inputs")) };
                let mut acc = first;
                for (i, &x) in rest.iter().enumerate() {
                    let last = op == "Sum" && i + 1 == rest.len();
                    acc = self.elementwise(cx, Binary::Add, acc, x, (!last).then_some("sum"))?;
                }
                match (op, xs.len()) {
                    ("Mean", n) if n > 1 => {
                        let inv = self.scalar(cx, "inverse_count", 1.0 / n as f32);
                        self.elementwise(cx, Binary::Mul, acc, inv, None)?
                    }
                    _ if xs.len() == 1 => self.alias(cx, acc),
                    _ => acc,
                }
            }
            "Softplus" | "Softsign" | "Elu" | "Selu" | "Celu" | "Mish" | "ThresholdedRelu" => self.composite_activation(cx, op, input(0)?)?,
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

    /// `kind(x)` as an intermediate of a multi-op lowering, named by `tag`.
    pub(super) fn unary_tmp(&mut self, cx: &Cx, kind: Unary, x: ValueId, tag: &str) -> ValueId {
        let s = self.shape(x);
        self.device_tmp(cx, Kind::Unary { kind, x, p0: 0.0, p1: 0.0 }, s, tag)
    }

    /// relu(x) + slope * min(x, 0): LeakyRelu with alpha > 1, PRelu.
    pub(super) fn relu_plus_scaled_negative(&mut self, cx: &Cx, x: ValueId, slope: ValueId, s: Vec<u64>) -> Result<ValueId> {
        let pos = self.device_tmp(cx, Kind::Unary { kind: Unary::Relu, x, p0: 0.0, p1: 0.0 }, s, "positive");
        let zero = self.scalar(cx, "zero", 0.0);
        let neg = self.elementwise(cx, Binary::Min, x, zero, Some("negative"))?;
        let scaled = self.elementwise(cx, Binary::Mul, neg, slope, Some("scaled"))?;
        self.elementwise(cx, Binary::Add, pos, scaled, None)
    }

    /// An activation made of several ops; see the module docs.
    fn composite_activation(&mut self, cx: &Cx, op: &str, x: ValueId) -> Result<ValueId> {
        let un = |me: &mut Self, kind: Unary, v: ValueId, tag: &str| me.unary_tmp(cx, kind, v, tag);
        // relu(x) + log(1 + exp(−|x|)).
        let softplus = |me: &mut Self, last: bool| -> Result<ValueId> {
            let a = un(me, Unary::Abs, x, "abs");
            let n = un(me, Unary::Neg, a, "neg_abs");
            let e = un(me, Unary::Exp, n, "exp");
            let one = me.scalar(cx, "one", 1.0);
            let p = me.elementwise(cx, Binary::Add, e, one, Some("one_plus"))?;
            let l = un(me, Unary::Log, p, "log");
            let r = un(me, Unary::Relu, x, "relu");
            me.elementwise(cx, Binary::Add, r, l, if last { None } else { Some("softplus") })
        };
        // relu(x) + alpha·(exp(min(x, 0)·k) − 1), then ·gamma when given.
        let elu = |me: &mut Self, alpha: f32, k: f32, gamma: Option<f32>| -> Result<ValueId> {
            let zero = me.scalar(cx, "zero", 0.0);
            let mut m = me.elementwise(cx, Binary::Min, x, zero, Some("negative"))?;
            if k != 1.0 {
                let kv = me.scalar(cx, "inverse_alpha", k);
                m = me.elementwise(cx, Binary::Mul, m, kv, Some("scaled"))?;
            }
            let e = un(me, Unary::Exp, m, "exp");
            let one = me.scalar(cx, "one", 1.0);
            let em1 = me.elementwise(cx, Binary::Sub, e, one, Some("exp_minus_one"))?;
            let av = me.scalar(cx, "alpha", alpha);
            let neg = me.elementwise(cx, Binary::Mul, em1, av, Some("negative_part"))?;
            let r = un(me, Unary::Relu, x, "relu");
            match gamma {
                None => me.elementwise(cx, Binary::Add, r, neg, None),
                Some(g) => {
                    let sum = me.elementwise(cx, Binary::Add, r, neg, Some("elu"))?;
                    let gv = me.scalar(cx, "gamma", g);
                    me.elementwise(cx, Binary::Mul, sum, gv, None)
                }
            }
        };
        match op {
            "Softplus" => softplus(self, true),
            "Mish" => {
                let sp = softplus(self, false)?;
                let t = un(self, Unary::Tanh, sp, "tanh");
                self.elementwise(cx, Binary::Mul, x, t, None)
            }
            "Softsign" => {
                let a = un(self, Unary::Abs, x, "abs");
                let one = self.scalar(cx, "one", 1.0);
                let d = self.elementwise(cx, Binary::Add, a, one, Some("one_plus"))?;
                self.elementwise(cx, Binary::Div, x, d, None)
            }
            "Elu" => elu(self, cx.float("alpha", 1.0), 1.0, None),
            "Selu" => elu(self, cx.float("alpha", 1.673_263_2), 1.0, Some(cx.float("gamma", 1.050_701))),
            "Celu" => {
                let alpha = cx.float("alpha", 1.0);
                if !(alpha.is_finite() && alpha != 0.0) {
                    return Err(cx.err(format!("alpha {alpha}: a finite non-zero value expected")));
                }
                elu(self, alpha, 1.0 / alpha, None)
            }
            _ => {
                // ThresholdedRelu: x·(x > alpha).
                let av = self.scalar(cx, "alpha", cx.float("alpha", 1.0));
                let g = self.elementwise(cx, Binary::Greater, x, av, Some("above"))?;
                self.elementwise(cx, Binary::Mul, x, g, None)
            }
        }
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
                Unary::Floor => Some("Floor"),
                Unary::Ceil => Some("Ceil"),
                Unary::Round => Some("Round"),
                Unary::Sign => Some("Sign"),
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
