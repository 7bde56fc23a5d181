//! A restricted unpickler for PyTorch checkpoints.
//!
//! It interprets the pickle opcodes torch and Lightning emit, but never imports
//! or calls anything: the few globals torch uses to describe tensors, storages
//! and dicts (the allow-list in [`call`]) are interpreted by this module;
//! every other global becomes an inert [`Value::Object`] placeholder that holds
//! only its name. Every read is bounded by the input length.

mod value;

use std::collections::HashMap;
use std::rc::{Rc, Weak};

use value::Made;
pub use value::{Container, Storage, StorageDtype, TensorRef, Unpickled, Value};

/// Dict-like classes that pickle their items with SETITEMS (or a dict BUILD state).
const DICT_CLASSES: &[&str] = &[
    "collections.OrderedDict",
    "builtins.dict",
    "lightning.fabric.utilities.data.AttributeDict",
    "pytorch_lightning.utilities.parsing.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict",
    "argparse.Namespace",
    "omegaconf.dictconfig.DictConfig",
];

/// Interprets a call of an allow-listed global; anything else is inert.
fn call(global: &str, args: &[Value], made: &mut Vec<Weak<Container>>) -> Result<Value, String> {
    let tensor = |args: &[Value]| -> Result<Value, String> {
        let bad = || format!("malformed arguments to {global}");
        let Value::Storage(storage) = args.first().ok_or_else(bad)? else { return Err(bad()) };
        let offset = args.get(1).and_then(Value::as_usize).ok_or_else(bad)?;
        let shape = args.get(2).and_then(Value::usizes).ok_or_else(bad)?;
        let stride = args.get(3).and_then(Value::usizes).ok_or_else(bad)?;
        if shape.len() != stride.len() {
            return Err(bad());
        }
        Ok(Value::Tensor(Rc::new(TensorRef { storage: storage.clone(), offset, shape, stride })))
    };
    match global {
        "torch._utils._rebuild_tensor_v2" | "torch._utils._rebuild_tensor" => tensor(args),
        "torch._utils._rebuild_parameter" | "torch._utils._rebuild_parameter_with_state" => {
            args.first().cloned().ok_or_else(|| format!("malformed arguments to {global}"))
        }
        g if DICT_CLASSES.contains(&g) => Ok(Value::Dict(Value::container(Vec::new(), made))),
        "torch.Size" | "builtins.tuple" => Ok(args.first().cloned().unwrap_or(Value::None)),
        other => Ok(Value::Object(other.into())),
    }
}

/// Why unpickling failed.
#[derive(Debug, thiserror::Error)]
#[error("pickle: {0}")]
pub struct PickleError(pub String);

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| PickleError(format!("truncated: {n} bytes needed at offset {}", self.pos)))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, PickleError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or_else(|| PickleError("unterminated line".into()))?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| PickleError("non-UTF-8 global name".into()))?;
        self.pos += n + 1;
        Ok(s)
    }
    fn string(&mut self, n: usize) -> Result<Value, PickleError> {
        let b = self.take(n)?;
        Ok(Value::Str(String::from_utf8_lossy(b).into()))
    }
}

/// Unpickles `data`, calling `persistent_load` for each persistent id.
///
/// # Errors
/// On malformed or truncated input, an unsupported opcode, or a persistent id
/// `persistent_load` rejects.
pub fn unpickle(
    data: &[u8],
    mut persistent_load: impl FnMut(&Value) -> Result<Value, String>,
) -> Result<Unpickled, PickleError> {
    let mut r = Reader { data, pos: 0 };
    let mut stack: Vec<Value> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    // Sparse, so a hostile index cannot size it; at most one entry per opcode.
    let mut memo: HashMap<usize, Value> = HashMap::new();
    // Items BUILD copies from a state into a dict: the one opcode that copies
    // what is already counted, so bounded by the input's length.
    let mut copied = 0usize;
    let mut made = Made::default();
    let err = |m: String| PickleError(m);
    macro_rules! pop {
        () => {
            stack.pop().ok_or_else(|| err("stack underflow".into()))?
        };
    }
    macro_rules! pop_mark {
        () => {{
            let m = marks.pop().ok_or_else(|| err("no mark".into()))?;
            if m > stack.len() {
                return Err(err("mark beyond stack".into()));
            }
            stack.split_off(m)
        }};
    }
    loop {
        let at = r.pos;
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?;
            } // PROTO
            0x95 => {
                r.u64()?;
            } // FRAME
            b'.' => {
                let root = stack.pop().ok_or_else(|| err("empty stack at STOP".into()))?;
                return Ok(Unpickled { root, _made: made });
            }
            b'(' => marks.push(stack.len()),
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool(true)),
            0x89 => stack.push(Value::Bool(false)),
            b'J' => stack.push(Value::Int(r.u32()? as i32 as i64)),
            b'K' => stack.push(Value::Int(r.u8()? as i64)),
            b'M' => stack.push(Value::Int(r.u16()? as i64)),
            0x8a => {
                // LONG1: little-endian two's complement of n bytes
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                if n > 8 {
                    return Err(err(format!("integer of {n} bytes at offset {at}")));
                }
                let mut v: i64 = 0;
                for (i, &byte) in b.iter().enumerate() {
                    v |= (byte as i64) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                stack.push(Value::Int(v));
            }
            b'G' => stack.push(Value::Float(f64::from_be_bytes(r.take(8)?.try_into().unwrap()))),
            b'X' => {
                let n = r.u32()? as usize;
                let v = r.string(n)?;
                stack.push(v);
            }
            0x8c => {
                let n = r.u8()? as usize;
                let v = r.string(n)?;
                stack.push(v);
            }
            0x8d => {
                let n = r.u64()?;
                let v = r.string(usize::try_from(n).map_err(|_| err("huge string".into()))?)?;
                stack.push(v);
            }
            b'T' => {
                let n = r.u32()? as usize;
                let v = r.string(n)?;
                stack.push(v);
            } // BINSTRING
            b'U' => {
                let n = r.u8()? as usize;
                let v = r.string(n)?;
                stack.push(v);
            } // SHORT_BINSTRING
            b'B' => {
                let n = r.u32()? as usize;
                stack.push(Value::Bytes(r.take(n)?.into()));
            }
            b'C' => {
                let n = r.u8()? as usize;
                stack.push(Value::Bytes(r.take(n)?.into()));
            }
            b')' => stack.push(Value::Tuple(Value::container(Vec::new(), &mut made.0))),
            b']' => stack.push(Value::List(Value::container(Vec::new(), &mut made.0))),
            b'}' => stack.push(Value::Dict(Value::container(Vec::new(), &mut made.0))),
            b't' => {
                let items = pop_mark!();
                stack.push(Value::Tuple(Value::container(items, &mut made.0)));
            }
            b'l' => {
                let items = pop_mark!();
                stack.push(Value::List(Value::container(items, &mut made.0)));
            }
            b'd' => {
                let items = pop_mark!();
                if items.len() % 2 != 0 {
                    return Err(err(format!("odd dict items at offset {at}")));
                }
                stack.push(Value::Dict(Value::container(items, &mut made.0)));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return Err(err("stack underflow".into()));
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Value::Tuple(Value::container(items, &mut made.0)));
            }
            b'a' => {
                let v = pop!();
                match stack.last() {
                    Some(Value::List(c)) => c.items.borrow_mut().push(v),
                    Some(Value::Object(_)) => {}
                    _ => return Err(err(format!("APPEND to a non-list at offset {at}"))),
                }
            }
            b'e' => {
                let items = pop_mark!();
                match stack.last() {
                    Some(Value::List(c)) => c.items.borrow_mut().extend(items),
                    Some(Value::Object(_)) => {}
                    _ => return Err(err(format!("APPENDS to a non-list at offset {at}"))),
                }
            }
            b's' => {
                let v = pop!();
                let k = pop!();
                match stack.last() {
                    Some(Value::Dict(c)) => c.items.borrow_mut().extend([k, v]),
                    Some(Value::Object(_)) => {}
                    _ => return Err(err(format!("SETITEM on a non-dict at offset {at}"))),
                }
            }
            b'u' => {
                let items = pop_mark!();
                if items.len() % 2 != 0 {
                    return Err(err(format!("odd SETITEMS at offset {at}")));
                }
                match stack.last() {
                    Some(Value::Dict(c)) => c.items.borrow_mut().extend(items),
                    Some(Value::Object(_)) => {}
                    _ => return Err(err(format!("SETITEMS on a non-dict at offset {at}"))),
                }
            }
            b'c' => {
                let module = r.line()?.to_string();
                let name = r.line()?;
                stack.push(Value::Global(format!("{module}.{name}").into()));
            }
            0x93 => {
                let name = pop!();
                let module = pop!();
                match (module, name) {
                    (Value::Str(m), Value::Str(n)) => stack.push(Value::Global(format!("{m}.{n}").into())),
                    _ => return Err(err(format!("STACK_GLOBAL of non-strings at offset {at}"))),
                }
            }
            b'R' | 0x81 => {
                // REDUCE (callable, args) / NEWOBJ (cls, args)
                let args = pop!();
                let callable = pop!();
                let args = args.items().ok_or_else(|| err(format!("call arguments are not a tuple at offset {at}")))?;
                let v = match callable {
                    Value::Global(g) => call(&g, &args, &mut made.0).map_err(err)?,
                    other => Value::Object(other.describe().into()),
                };
                stack.push(v);
            }
            0x92 => {
                // NEWOBJ_EX (cls, args, kwargs)
                let _kwargs = pop!();
                let args = pop!();
                let cls = pop!();
                let args = args.items();
                let args = args.as_deref().unwrap_or(&[]);
                let v = match cls {
                    Value::Global(g) => call(&g, args, &mut made.0).map_err(err)?,
                    other => Value::Object(other.describe().into()),
                };
                stack.push(v);
            }
            b'b' => {
                // BUILD: a dict state merges into a dict; other states are ignored.
                let state = pop!();
                if let (Some(Value::Dict(c)), Value::Dict(s)) = (stack.last(), &state) {
                    let items = s.items.borrow().clone();
                    copied += items.len();
                    if copied > data.len() {
                        return Err(err(format!("BUILD copies more items than the pickle has bytes at offset {at}")));
                    }
                    c.items.borrow_mut().extend(items);
                }
            }
            b'Q' => {
                let pid = pop!();
                stack.push(persistent_load(&pid).map_err(err)?);
            }
            b'q' | b'r' | 0x94 => {
                let idx = match op {
                    b'q' => r.u8()? as usize,
                    b'r' => r.u32()? as usize,
                    _ => memo.len(),
                };
                let v = stack.last().cloned().ok_or_else(|| err("memoize of empty stack".into()))?;
                memo.insert(idx, v);
            }
            b'h' | b'j' => {
                let idx = if op == b'h' { r.u8()? as usize } else { r.u32()? as usize };
                let v = memo.get(&idx).cloned().ok_or_else(|| err(format!("memo {idx} unset at offset {at}")))?;
                stack.push(v);
            }
            b'0' => {
                pop!();
            }
            b'1' => {
                let _ = pop_mark!();
            }
            b'2' => {
                let v = stack.last().cloned().ok_or_else(|| err("DUP of empty stack".into()))?;
                stack.push(v);
            }
            other => return Err(err(format!("unsupported opcode 0x{other:02x} at offset {at}"))),
        }
    }
}

/// Interprets torch's persistent id `('storage', StorageClass, key, location, numel)`.
///
/// # Errors
/// When the id has another form.
pub fn torch_storage(pid: &Value) -> Result<Value, String> {
    let items = pid.items().ok_or("persistent id is not a tuple")?;
    let bad = || "malformed storage persistent id".to_string();
    match &*items {
        [Value::Str(kind), Value::Global(class), Value::Str(key), _location, numel] if &**kind == "storage" => {
            let class_name = class.rsplit('.').next().unwrap_or("");
            let dtype = StorageDtype::from_class(class_name).ok_or_else(|| format!("unknown storage class {class}"))?;
            Ok(Value::Storage(Rc::new(Storage {
                dtype,
                key: key.to_string(),
                numel: numel.as_usize().ok_or_else(bad)?,
            })))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(data: &[u8]) -> Result<Unpickled, PickleError> {
        unpickle(data, torch_storage)
    }

    #[test]
    fn memoized_dict_filled_later_is_shared() {
        // {}, memo 0, MARK 'a' 1 SETITEMS, pop, get memo 0, STOP
        let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01u0h\x00.";
        let v = run(data).unwrap();
        assert!(matches!(v.root.get("a"), Some(Value::Int(1))));
    }

    #[test]
    fn globals_outside_the_allow_list_are_inert() {
        let data = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.";
        let v = run(data).unwrap();
        assert!(matches!(v.root, Value::Object(ref o) if &**o == "os.system"));
    }

    #[test]
    fn truncated_input_is_an_error() {
        assert!(run(b"\x80\x02X\xff\x00\x00\x00ab").unwrap_err().0.contains("truncated"));
        assert!(run(b"\x80\x02").unwrap_err().0.contains("truncated"));
        assert!(run(b"\x80\x02h\x05.").unwrap_err().0.contains("memo 5"));
        assert!(run(b"\x80\x02\xff").unwrap_err().0.contains("unsupported opcode"));
    }

    #[test]
    fn deep_nesting_drops_without_recursion() {
        let mut data = b"\x80\x02N".to_vec();
        data.extend(std::iter::repeat_n(0x85u8, 1_000_000)); // TUPLE1 a million times
        data.push(b'.');
        let v = run(&data).unwrap();
        drop(v);
    }

    #[test]
    fn memo_indices_do_not_size_the_memo() {
        // LONG_BINPUT 4e9 then LONG_BINGET of it: a few bytes, no 4e9-entry table.
        let v = run(b"\x80\x02Nr\x00\x28\x6b\xeej\x00\x28\x6b\xee.").unwrap();
        assert!(matches!(v.root, Value::None));
    }

    #[test]
    fn build_that_doubles_a_shared_dict_is_bounded() {
        // {'a': 1} memoized, then BUILD it with itself as the state, again and again:
        // each BUILD would double it (2^k items from 3k bytes).
        let mut data = b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01s".to_vec();
        for _ in 0..64 {
            data.extend(b"h\x00b");
        }
        data.push(b'.');
        assert!(run(&data).unwrap_err().0.contains("BUILD copies more items"));
    }

    #[test]
    fn a_list_inside_itself_is_freed() {
        // [] memo 0, get memo 0, APPEND: the list holds itself.
        let v = run(b"\x80\x02]q\x00h\x00a.").unwrap();
        let Value::List(c) = &v.root else { panic!("not a list") };
        let weak = Rc::downgrade(c);
        drop(v);
        assert!(weak.upgrade().is_none(), "the cycle outlived the result");
    }
}
