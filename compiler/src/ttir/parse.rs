//! The TTIR parser (see the module docs of [`crate::ttir`]): line by line,
//! each line split at its top-level delimiters. Delimiters are ASCII, so
//! every slice falls on a character boundary; nesting is bounded, so
//! hostile text gives an error, never a panic or a deep recursion.

use super::{Attr, Func, Module, Op, Region, TtirError, Type};

/// Deepest nesting of types (`!tt.ptr<tensor<...>>`) read.
const MAX_DEPTH: usize = 16;

type R<T> = Result<T, TtirError>;

fn err<T>(line: usize, msg: impl Into<String>) -> R<T> {
    Err(TtirError { line, kernel_line: None, msg: msg.into() })
}

/// Parses a TTIR module (what triton's `str()` or `str_nodebug()`
/// prints). Locations (`loc(...)` and the `#locN = loc(...)` table) are
/// taken off the ops and resolved to the kernel's source lines
/// ([`Module::sources`]), which errors then name.
pub fn parse(text: &str) -> R<Module> {
    let (stripped, sources) = locations(text);
    let lines: Vec<(usize, &str)> = stripped.iter().map(|(i, l)| (*i, l.as_str())).filter(|(_, l)| !l.is_empty()).collect();
    let mut m = parse_lines(lines).map_err(|e| e.located(&sources))?;
    m.sources = sources;
    Ok(m)
}

/// Deepest chain of location references followed.
const MAX_LOC_DEPTH: usize = 16;

/// Every line with its `loc(...)` annotations removed (the `#loc`
/// definitions become empty lines), and the source line each TTIR line's
/// own location resolves to. An op that opens a region (`scf.for ... {`)
/// takes the location printed on its closing `} loc(...)`.
fn locations(text: &str) -> (Vec<(usize, String)>, std::collections::BTreeMap<usize, String>) {
    let mut table = std::collections::HashMap::new();
    let mut out = Vec::new();
    let mut own: Vec<Option<String>> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let l = raw.trim();
        if let Some((name, def)) = l.split_once(" = loc(").filter(|(n, _)| n.starts_with("#loc")) {
            table.insert(name.trim().to_string(), def.strip_suffix(')').unwrap_or(def).to_string());
            out.push((i + 1, String::new()));
            own.push(None);
            continue;
        }
        // Remove every ` loc(...)` (ops carry one at the end, a function's
        // arguments one each); the last is the line's own.
        let mut line = l.to_string();
        let mut last = None;
        while let Some(at) = line.find(" loc(").or_else(|| line.starts_with("loc(").then_some(0)) {
            let open = at + line[at..].find('(').unwrap_or(0);
            let Some(close) = matching_paren(&line[open..]) else { break };
            last = Some(line[open + 1..open + close].to_string());
            line.replace_range(at..open + close + 1, "");
        }
        out.push((i + 1, line.trim().to_string()));
        own.push(last);
    }
    // Region openers without a location take their closer's.
    let mut stack: Vec<usize> = Vec::new();
    for k in 0..out.len() {
        let l = out[k].1.as_str();
        if l.starts_with('}') {
            if let Some(o) = stack.pop() {
                if own[o].is_none() {
                    own[o] = own[k].clone();
                }
            }
        }
        if l.ends_with('{') && !l.starts_with("module") {
            stack.push(k);
        }
    }
    let sources = out
        .iter()
        .zip(&own)
        .filter_map(|((n, _), loc)| loc.as_deref().and_then(|l| resolve_loc(l, &table, 0)).map(|s| (*n, s)))
        .collect();
    (out, sources)
}

/// Index of the `)` closing the `(` at the start of `s`.
fn matching_paren(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut in_str = false;
    for (i, b) in s.bytes().enumerate() {
        match b {
            b'"' => in_str = !in_str,
            b'(' if !in_str => depth += 1,
            b')' if !in_str => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `file.py:N` of a location: `"path":L:C`, `#locN` (looked up), `"name"(L)`,
/// `callsite(CALLEE at CALLER)` (the caller: the kernel's own line, not
/// triton's library), `fused[...]` (the first that resolves).
fn resolve_loc(l: &str, table: &std::collections::HashMap<String, String>, depth: usize) -> Option<String> {
    let l = l.trim();
    if depth > MAX_LOC_DEPTH {
        return None;
    }
    if l.starts_with("#loc") {
        return table.get(l).and_then(|d| resolve_loc(d, table, depth + 1));
    }
    if let Some(inner) = l.strip_prefix("callsite(").and_then(|r| r.strip_suffix(')')) {
        let (callee, caller) = inner.rsplit_once(" at ")?;
        return resolve_loc(caller, table, depth + 1).or_else(|| resolve_loc(callee, table, depth + 1));
    }
    if let Some(inner) = l.strip_prefix("fused").map(|r| r.trim_start_matches(|c| c != '[')) {
        let inner = inner.strip_prefix('[')?.strip_suffix(']')?;
        return split_top(inner, b',').into_iter().find_map(|p| resolve_loc(p, table, depth + 1));
    }
    let rest = l.strip_prefix('"')?;
    let q = rest.find('"')?;
    let (s, after) = (&rest[..q], &rest[q + 1..]);
    if let Some(nested) = after.strip_prefix('(').and_then(|r| r.strip_suffix(')')) {
        return resolve_loc(nested, table, depth + 1);
    }
    let line = after.strip_prefix(':')?.split(':').next()?.parse::<u32>().ok()?;
    let file = s.rsplit('/').next().unwrap_or(s);
    Some(format!("{file}:{line}"))
}

fn parse_lines(lines: Vec<(usize, &str)>) -> R<Module> {
    let mut p = Parser { lines, pos: 0 };
    let (line, head) = p.next().ok_or(TtirError { line: 1, kernel_line: None, msg: "empty text: expected `module {`".into() })?;
    if !(head.starts_with("module") && head.ends_with('{')) {
        return err(line, format!("expected `module {{`, found `{}`", clip(head)));
    }
    let mut funcs = Vec::new();
    loop {
        let Some((line, l)) = p.next() else {
            return err(p.last_line(), "the module is not closed (missing `}`)");
        };
        if l == "}" {
            break;
        }
        if l.starts_with("tt.func") {
            funcs.push(p.func(line, l)?);
        } else {
            return err(line, format!("expected `tt.func` or `}}` at module level, found `{}`", clip(l)));
        }
    }
    if let Some((line, l)) = p.next() {
        return err(line, format!("text after the module: `{}`", clip(l)));
    }
    if funcs.is_empty() {
        return err(1, "the module has no tt.func");
    }
    Ok(Module { funcs, sources: Default::default() })
}

/// At most 60 characters of a line, for messages.
fn clip(s: &str) -> String {
    let mut c: String = s.chars().take(60).collect();
    if c.len() < s.len() {
        c.push('…');
    }
    c
}

struct Parser<'a> {
    lines: Vec<(usize, &'a str)>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn next(&mut self) -> Option<(usize, &'a str)> {
        let l = self.lines.get(self.pos).copied();
        self.pos += 1;
        l
    }

    fn last_line(&self) -> usize {
        self.lines.last().map_or(1, |l| l.0)
    }

    /// `tt.func [public|private] @name(args) [-> types] [attributes {...}] {`
    /// and its body up to the closing `}`.
    fn func(&mut self, line: usize, head: &str) -> R<Func> {
        let rest = head["tt.func".len()..].trim_start();
        let rest = rest.strip_prefix("public").or_else(|| rest.strip_prefix("private")).unwrap_or(rest).trim_start();
        let Some(rest) = rest.strip_prefix('@') else { return err(line, "tt.func without an @name") };
        let open = rest.find('(').ok_or(TtirError { line, kernel_line: None, msg: "tt.func without an argument list".into() })?;
        let name = rest[..open].to_string();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'$') {
            return err(line, format!("bad function name `{}`", clip(&name)));
        }
        let (inner, after) = balanced(line, &rest[open..], b'(', b')')?;
        let mut args = Vec::new();
        for a in split_top(inner, b',') {
            let a = a.trim();
            if a.is_empty() {
                continue;
            }
            let (n, t) = a.split_once(':').ok_or(TtirError { line, kernel_line: None, msg: format!("argument `{}` has no type", clip(a)) })?;
            let n = ssa_name(line, n.trim())?;
            // A type, then maybe `{tt.divisibility = 16 : i32}`.
            let t = t.trim();
            let t = match t.find('{') {
                Some(i) if t.ends_with('}') => &t[..i],
                _ => t,
            };
            args.push((n, parse_type(line, t.trim(), 0)?));
        }
        let after = after.trim();
        if !after.ends_with('{') {
            return err(line, "tt.func header does not end with `{`");
        }
        if after.starts_with("->") {
            return err(line, "a tt.func with results (a called helper); kernels return nothing");
        }
        let ops = self.block(line, "}")?;
        Ok(Func { line, name, args, ops })
    }

    /// Ops up to a line equal to (or, for `})`, starting with) `end`.
    fn block(&mut self, open_line: usize, end: &str) -> R<Vec<Op>> {
        let mut ops = Vec::new();
        loop {
            let Some((line, l)) = self.next() else {
                return err(self.last_line(), format!("the block opened at line {open_line} is not closed"));
            };
            if l == end || (end == "})" && l.starts_with("})")) {
                self.pos -= usize::from(end == "})");
                return Ok(ops);
            }
            ops.push(self.op(line, l)?);
        }
    }

    fn op(&mut self, line: usize, l: &'a str) -> R<Op> {
        // Results: `%a = `, `%a, %b = `, `%a:2 = `.
        let (results, body) = match split_results(l) {
            Some((res, body)) => (parse_results(line, res)?, body.trim_start()),
            None => (Vec::new(), l),
        };
        if body.starts_with('"') {
            return self.generic(line, results, body);
        }
        let end = body.find(|c: char| c.is_ascii_whitespace()).unwrap_or(body.len());
        let name = &body[..end];
        if !name.contains('.') || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
            return err(line, format!("expected an op name (dialect.op), found `{}`", clip(name)));
        }
        match name {
            "scf.for" => return err(line, "scf.for (a loop over tl.range or a runtime bound) is not supported: use tl.static_range with constexpr bounds, which Triton unrolls"),
            "scf.if" | "scf.while" | "scf.execute_region" => return err(line, format!("{name} (data-dependent control flow) is not supported")),
            "tt.call" => return err(line, "tt.call: calls to other functions are not supported (mark helpers @triton.jit for inlining)"),
            _ => {}
        }
        if body.ends_with('{') {
            return err(line, format!("{name}: ops with regions are not supported (only \"tt.reduce\")"));
        }
        let mut op = Op { line, name: name.to_string(), results, operands: Vec::new(), keyword: None, value: None, attrs: Vec::new(), types: Vec::new(), region: None };
        let rest = body[end..].trim();
        let (head, types) = match split_colon(rest) {
            Some((h, t)) => (h.trim(), Some(t.trim())),
            None => (rest, None),
        };
        if let Some(t) = types {
            op.types = parse_signature(line, t)?;
        }
        if name == "arith.constant" {
            let v = parse_attr(line, head)?;
            op.value = Some(typed_value(v, op.types.first()));
            return Ok(op);
        }
        // Operands, a keyword, attribute dicts, in any order the syntax
        // puts them (`cmpi slt, %a, %b`, `make_range {..}`, `get_program_id x`).
        for part in split_top(head, b',') {
            let mut part = part.trim();
            while !part.is_empty() {
                if part.starts_with('{') {
                    let (inner, after) = balanced(line, part, b'{', b'}')?;
                    op.attrs.extend(parse_attrs(line, inner)?);
                    part = after.trim_start();
                } else if let Some((k, v)) = part.split_once(" = ").filter(|(k, _)| k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')) {
                    // An inline attribute: `tt.dot %a, %b, %c, inputPrecision = tf32`.
                    op.attrs.push((k.to_string(), parse_attr(line, v)?));
                    part = "";
                } else if part.starts_with('%') {
                    let e = part.find(|c: char| c.is_ascii_whitespace() || c == '{').unwrap_or(part.len());
                    op.operands.push(ssa_name(line, &part[..e])?);
                    part = part[e..].trim_start();
                } else {
                    let e = part.find(|c: char| c.is_ascii_whitespace() || c == '{').unwrap_or(part.len());
                    let word = &part[..e];
                    // One word before the operands (`cmpi slt, %a, %b`).
                    let word_ok = word.bytes().next().is_some_and(|b| b.is_ascii_alphabetic()) && word.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if op.keyword.is_some() || !op.operands.is_empty() || !word_ok {
                        return err(line, format!("{name}: unexpected `{}`", clip(word)));
                    }
                    op.keyword = Some(word.to_string());
                    part = part[e..].trim_start();
                }
            }
        }
        Ok(op)
    }

    /// `"tt.reduce"(%x, ...) <{props}> ({` + region + `}) : (T...) -> T...`
    fn generic(&mut self, line: usize, results: Vec<String>, body: &'a str) -> R<Op> {
        let close = body[1..].find('"').ok_or(TtirError { line, kernel_line: None, msg: "unterminated op name".into() })? + 1;
        let name = body[1..close].to_string();
        if name != "tt.reduce" {
            return err(line, format!("generic-form op \"{}\" is not supported (only \"tt.reduce\")", clip(&name)));
        }
        let rest = body[close + 1..].trim_start();
        if !rest.starts_with('(') {
            return err(line, "\"tt.reduce\" without operands");
        }
        let (inner, mut rest) = balanced(line, rest, b'(', b')')?;
        let mut op = Op { line, name, results, operands: Vec::new(), keyword: None, value: None, attrs: Vec::new(), types: Vec::new(), region: None };
        for o in split_top(inner, b',') {
            op.operands.push(ssa_name(line, o.trim())?);
        }
        rest = rest.trim_start();
        if rest.starts_with("<{") {
            let (inner, after) = balanced(line, &rest[1..], b'{', b'}')?;
            op.attrs.extend(parse_attrs(line, inner)?);
            rest = after.strip_prefix('>').ok_or(TtirError { line, kernel_line: None, msg: "`<{` without `}>`".into() })?.trim_start();
        }
        if rest != "({" {
            return err(line, "\"tt.reduce\" without its combiner region `({`");
        }
        // ^bb0(%a: T, %b: T):
        let (bl, bb) = self.next().ok_or(TtirError { line, kernel_line: None, msg: "the reduce region is empty".into() })?;
        let Some(bb) = bb.strip_prefix("^bb0").and_then(|b| b.strip_suffix(':')) else {
            return err(bl, "expected the region's block header `^bb0(...):`");
        };
        let (inner, after) = balanced(bl, bb.trim(), b'(', b')')?;
        if !after.trim().is_empty() {
            return err(bl, "text after the block arguments");
        }
        let mut args = Vec::new();
        for a in split_top(inner, b',') {
            let (n, t) = a.split_once(':').ok_or(TtirError { line: bl, kernel_line: None, msg: "block argument without a type".into() })?;
            args.push((ssa_name(bl, n.trim())?, parse_type(bl, t.trim(), 0)?));
        }
        let ops = self.block(line, "})")?;
        let (cl, close) = self.next().ok_or(TtirError { line, kernel_line: None, msg: "the reduce region is not closed".into() })?;
        let sig = close["})".len()..].trim();
        let sig = sig.strip_prefix(':').ok_or(TtirError { line: cl, kernel_line: None, msg: "expected `}) : (types) -> types`".into() })?;
        op.types = parse_signature(cl, sig.trim())?;
        op.region = Some(Region { args, ops });
        Ok(op)
    }
}

/// `%a, %b = rest` → ("%a, %b", rest); None when the line binds nothing.
fn split_results(l: &str) -> Option<(&str, &str)> {
    if !l.starts_with('%') {
        return None;
    }
    let eq = l.find(" = ")?;
    Some((&l[..eq], &l[eq + 3..]))
}

fn parse_results(line: usize, res: &str) -> R<Vec<String>> {
    let mut out = Vec::new();
    for r in res.split(',') {
        let r = r.trim();
        match r.split_once(':') {
            // `%5:2`: two results, named %5#0 and %5#1 as MLIR does.
            Some((n, k)) => {
                let n = ssa_name(line, n)?;
                let k: usize = k.parse().map_err(|_| TtirError { line, kernel_line: None, msg: format!("bad result count in `{}`", clip(r)) })?;
                if k == 0 || k > 16 {
                    return err(line, format!("result count {k} out of range"));
                }
                out.extend((0..k).map(|i| format!("{n}#{i}")));
            }
            None => out.push(ssa_name(line, r)?),
        }
    }
    Ok(out)
}

/// An SSA value name: `%` and letters, digits, `_`, `#`.
fn ssa_name(line: usize, s: &str) -> R<String> {
    let ok = s.len() > 1 && s.starts_with('%') && s[1..].bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'#' || b == b'$' || b == b'.');
    if !ok {
        return err(line, format!("expected an SSA value (%name), found `{}`", clip(s)));
    }
    Ok(s.to_string())
}

/// The bytes of `s` outside string literals, each with the bracket depth
/// before and after it: (), {}, [] and <> nest; the `>` of `->` does not.
fn depths(s: &str) -> impl Iterator<Item = (usize, u8, i32, i32)> + '_ {
    let b = s.as_bytes();
    let (mut depth, mut in_str) = (0i32, false);
    b.iter().enumerate().filter_map(move |(i, &c)| {
        if in_str {
            in_str = c != b'"';
            return None;
        }
        let before = depth;
        match c {
            b'"' => in_str = true,
            b'(' | b'{' | b'[' | b'<' => depth += 1,
            b'>' if i > 0 && b[i - 1] == b'-' => {}
            b')' | b'}' | b']' | b'>' => depth -= 1,
            _ => {}
        }
        Some((i, c, before, depth))
    })
}

/// The bracket matching `s[0]` (`open`), with what is inside and after.
fn balanced(line: usize, s: &str, open: u8, close: u8) -> R<(&str, &str)> {
    if s.as_bytes().first() != Some(&open) {
        return err(line, format!("expected `{}`", open as char));
    }
    for (i, c, before, after) in depths(s) {
        if after < before && after == 0 {
            if c != close {
                return err(line, format!("`{}` closed by `{}`", open as char, c as char));
            }
            return Ok((&s[1..i], &s[i + 1..]));
        }
    }
    err(line, format!("unclosed `{}`", open as char))
}

/// `s` split at top-level `sep` bytes (outside brackets and strings).
fn split_top(s: &str, sep: u8) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c, before, _) in depths(s) {
        if c == sep && before == 0 {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out
}

/// `head : types` at the first top-level ` : `.
fn split_colon(s: &str) -> Option<(&str, &str)> {
    let b = s.as_bytes();
    depths(s).find(|&(i, c, before, _)| c == b':' && before == 0 && (i == 0 || b[i - 1] == b' ')).map(|(i, ..)| (&s[..i], &s[i + 1..]))
}

/// The types after `:`: `T`, `A, B`, `A -> R`, `(A, B) -> R`,
/// `A * B -> R`, `A to R`, `-> R`.
fn parse_signature(line: usize, s: &str) -> R<Vec<Type>> {
    let mut out = Vec::new();
    let parts: Vec<&str> = split_arrow(s);
    for (k, part) in parts.iter().enumerate() {
        let mut p = part.trim();
        if p.is_empty() && k == 0 && parts.len() == 2 {
            continue;
        }
        if p.starts_with('(') {
            let (inner, after) = balanced(line, p, b'(', b')')?;
            if !after.trim().is_empty() {
                return err(line, format!("text after `({})`", clip(inner)));
            }
            p = inner;
        }
        for t in split_top(p, b',') {
            let t = t.trim();
            if t.is_empty() {
                continue;
            }
            for piece in t.split(" * ").flat_map(|x| x.split(" to ")) {
                out.push(parse_type(line, piece.trim(), 0)?);
            }
        }
    }
    Ok(out)
}

/// `s` split at its top-level `->`.
fn split_arrow(s: &str) -> Vec<&str> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c, before, _) in depths(s) {
        if c == b'-' && before == 0 && b.get(i + 1) == Some(&b'>') {
            out.push(&s[start..i]);
            start = i + 2;
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_type(line: usize, s: &str, depth: usize) -> R<Type> {
    if depth > MAX_DEPTH {
        return err(line, "types nested too deeply");
    }
    let bits = |t: &str| t.parse::<u32>().ok().filter(|&b| (1..=128).contains(&b));
    if let Some(b) = s.strip_prefix('i').and_then(bits) {
        return Ok(Type::Int(b));
    }
    match s {
        "f16" => return Ok(Type::Float(16)),
        "f32" => return Ok(Type::Float(32)),
        "f64" => return Ok(Type::Float(64)),
        "bf16" => return Ok(Type::BFloat),
        _ => {}
    }
    if let Some(inner) = s.strip_prefix("!tt.ptr<").and_then(|r| r.strip_suffix('>')) {
        // `!tt.ptr<f32>` or `!tt.ptr<f32, 1>` (address space).
        let elem = split_top(inner, b',')[0].trim();
        return Ok(Type::Ptr(Box::new(parse_type(line, elem, depth + 1)?)));
    }
    if let Some(inner) = s.strip_prefix("tensor<").and_then(|r| r.strip_suffix('>')) {
        let mut dims = Vec::new();
        let mut rest = inner;
        loop {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || rest.as_bytes().get(digits) != Some(&b'x') {
                break;
            }
            let d: u64 = rest[..digits].parse().map_err(|_| TtirError { line, kernel_line: None, msg: format!("dimension too large in `{}`", clip(s)) })?;
            dims.push(d);
            rest = &rest[digits + 1..];
        }
        if dims.is_empty() {
            return err(line, format!("tensor type without static dims: `{}`", clip(s)));
        }
        return Ok(Type::Tensor(dims, Box::new(parse_type(line, rest, depth + 1)?)));
    }
    err(line, format!("unknown type `{}`", clip(s)))
}

/// `{a = 1 : i32, b = false, unit}` (the inside).
fn parse_attrs(line: usize, inner: &str) -> R<Vec<(String, Attr)>> {
    let mut out = Vec::new();
    for e in split_top(inner, b',') {
        let e = e.trim();
        if e.is_empty() {
            continue;
        }
        match e.split_once(" = ") {
            Some((k, v)) => out.push((k.trim().to_string(), parse_attr(line, v.trim())?)),
            None => out.push((e.to_string(), Attr::Bool(true))),
        }
    }
    Ok(out)
}

/// One attribute value: `16 : i32`, `-1`, `1.5e+00`, `0xFF800000`,
/// `true`, `"s"`, `dense<V>`; anything else kept as text.
fn parse_attr(line: usize, v: &str) -> R<Attr> {
    let v = v.trim();
    // `N : type` (the type is the op's business).
    let bare = match split_colon(v) {
        Some((n, _)) => n.trim(),
        None => v,
    };
    if let Some(inner) = bare.strip_prefix("dense<").and_then(|r| r.strip_suffix('>')) {
        if inner.starts_with('[') {
            return Ok(Attr::Other(bare.to_string()));
        }
        return Ok(Attr::Splat(Box::new(parse_attr(line, inner)?)));
    }
    if bare == "true" || bare == "false" {
        return Ok(Attr::Bool(bare == "true"));
    }
    if let Some(h) = bare.strip_prefix("0x") {
        let bits = u64::from_str_radix(h, 16).map_err(|_| TtirError { line, kernel_line: None, msg: format!("bad hex literal `{}`", clip(bare)) })?;
        return Ok(Attr::Other(format!("0x{bits:X}")));
    }
    if let Ok(i) = bare.parse::<i64>() {
        return Ok(Attr::Int(i));
    }
    if bare.bytes().next().is_some_and(|c| c.is_ascii_digit() || c == b'-' || c == b'+') {
        if let Ok(f) = bare.parse::<f64>() {
            return Ok(Attr::Float(f));
        }
    }
    if let Some(s) = bare.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        return Ok(Attr::Str(s.to_string()));
    }
    Ok(Attr::Other(bare.to_string()))
}

/// A constant's value read with its type: a hex bit pattern of a float
/// type is that float; an integer of a float type is that float.
fn typed_value(v: Attr, ty: Option<&Type>) -> Attr {
    let float = matches!(ty.map(Type::elem), Some(Type::Float(_) | Type::BFloat));
    let conv = |a: Attr| match a {
        Attr::Other(ref h) if h.starts_with("0x") => match (u64::from_str_radix(&h[2..], 16), ty.map(Type::elem)) {
            (Ok(b), Some(Type::Float(32))) => u32::try_from(b).map_or(a, |b| Attr::Float(f32::from_bits(b) as f64)),
            (Ok(b), Some(Type::Float(64))) => Attr::Float(f64::from_bits(b)),
            (Ok(b), Some(Type::Int(_))) => i64::try_from(b).map_or(a, Attr::Int),
            _ => a,
        },
        Attr::Int(i) if float => Attr::Float(i as f64),
        a => a,
    };
    match v {
        Attr::Splat(inner) => Attr::Splat(Box::new(conv(*inner))),
        v => conv(v),
    }
}
