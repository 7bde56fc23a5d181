//! What the unpickler produces: values, torch storages and tensor views,
//! and containers whose drop cannot overflow the stack.

use std::cell::{Ref, RefCell};
use std::rc::{Rc, Weak};

/// Element types of torch storages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageDtype {
    /// float32
    F32,
    /// float16
    F16,
    /// bfloat16
    BF16,
    /// float64
    F64,
    /// An integer or bool storage (not a weight type); holds torch's class name.
    Other(&'static str),
}

impl StorageDtype {
    pub(super) fn from_class(name: &str) -> Option<StorageDtype> {
        Some(match name {
            "FloatStorage" => StorageDtype::F32,
            "HalfStorage" => StorageDtype::F16,
            "BFloat16Storage" => StorageDtype::BF16,
            "DoubleStorage" => StorageDtype::F64,
            "LongStorage" => StorageDtype::Other("int64"),
            "IntStorage" => StorageDtype::Other("int32"),
            "ShortStorage" => StorageDtype::Other("int16"),
            "CharStorage" => StorageDtype::Other("int8"),
            "ByteStorage" => StorageDtype::Other("uint8"),
            "BoolStorage" => StorageDtype::Other("bool"),
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StorageDtype::F32 => 4,
            StorageDtype::F16 | StorageDtype::BF16 => 2,
            StorageDtype::F64 => 8,
            StorageDtype::Other("int64") => 8,
            StorageDtype::Other("int32") => 4,
            StorageDtype::Other("int16") => 2,
            StorageDtype::Other(_) => 1,
        }
    }
}

/// A storage reference from a persistent id: the bytes live in the archive's
/// `data/<key>` entry.
#[derive(Debug)]
pub struct Storage {
    /// Element type.
    pub dtype: StorageDtype,
    /// Archive entry key.
    pub key: String,
    /// Elements in the storage.
    pub numel: usize,
}

/// A tensor as torch describes it: a view into a storage.
#[derive(Debug)]
pub struct TensorRef {
    /// The storage.
    pub storage: Rc<Storage>,
    /// Offset into the storage, in elements.
    pub offset: usize,
    /// Shape.
    pub shape: Vec<usize>,
    /// Strides, in elements.
    pub stride: Vec<usize>,
}

/// A container's elements (a dict stores keys and values alternately). Its
/// drop is iterative, so hostile nesting cannot overflow the stack.
#[derive(Debug, Default)]
pub struct Container {
    pub(super) items: RefCell<Vec<Value>>,
}

impl Drop for Container {
    fn drop(&mut self) {
        let mut work = std::mem::take(self.items.get_mut());
        while let Some(v) = work.pop() {
            if let Value::Tuple(c) | Value::List(c) | Value::Dict(c) = v {
                if let Ok(mut inner) = Rc::try_unwrap(c) {
                    work.append(inner.items.get_mut());
                }
            }
        }
    }
}

/// The result of unpickling: the root value, and every container made on the
/// way ([`Made`] breaks their cycles when this is dropped).
#[derive(Debug)]
pub struct Unpickled {
    /// The value the pickle returns.
    pub root: Value,
    pub(super) _made: Made,
}

/// Every container an unpickling made. A pickle can put a list inside itself;
/// such cycles would outlive the `Rc`s, so dropping this (after a result, or
/// on an error) empties every container still alive.
#[derive(Debug, Default)]
pub(super) struct Made(pub(super) Vec<Weak<Container>>);

impl Drop for Made {
    fn drop(&mut self) {
        for c in self.0.drain(..).filter_map(|w| w.upgrade()) {
            let items = std::mem::take(&mut *c.items.borrow_mut());
            drop(c);
            drop(items);
        }
    }
}

/// A pickled value.
#[derive(Debug, Clone)]
pub enum Value {
    /// Python None.
    None,
    /// A bool.
    Bool(bool),
    /// An int that fits i64.
    Int(i64),
    /// A float.
    Float(f64),
    /// A str.
    Str(Rc<str>),
    /// A bytes object.
    Bytes(Rc<[u8]>),
    /// A tuple.
    Tuple(Rc<Container>),
    /// A list.
    List(Rc<Container>),
    /// A dict (or an allow-listed dict subclass).
    Dict(Rc<Container>),
    /// A global reference `module.name`, not imported.
    Global(Rc<str>),
    /// A torch storage.
    Storage(Rc<Storage>),
    /// A torch tensor.
    Tensor(Rc<TensorRef>),
    /// The inert result of calling or instantiating a global outside the allow-list.
    Object(Rc<str>),
}

impl Value {
    /// A new container holding `items`, recorded in `made` so that
    /// [`Unpickled`] can break its reference cycles.
    pub(super) fn container(items: Vec<Value>, made: &mut Vec<Weak<Container>>) -> Rc<Container> {
        let c = Rc::new(Container { items: RefCell::new(items) });
        made.push(Rc::downgrade(&c));
        c
    }

    /// The entries of a dict, as (key, value) pairs.
    pub fn dict_entries(&self) -> Option<Vec<(Value, Value)>> {
        let Value::Dict(c) = self else { return None };
        let items = c.items.borrow();
        Some(items.chunks_exact(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect())
    }

    /// The value under string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<Value> {
        self.dict_entries()?.into_iter().find(|(k, _)| matches!(k, Value::Str(s) if &**s == key)).map(|(_, v)| v)
    }

    /// The elements of a tuple or list, borrowed (a hostile pickle may call
    /// with one huge argument tuple many times: no copies).
    pub(super) fn items(&self) -> Option<Ref<'_, [Value]>> {
        match self {
            Value::Tuple(c) | Value::List(c) => Some(Ref::map(c.items.borrow(), Vec::as_slice)),
            _ => None,
        }
    }

    pub(super) fn as_usize(&self) -> Option<usize> {
        match *self {
            Value::Int(i) if i >= 0 => Some(i as usize),
            _ => None,
        }
    }

    pub(super) fn usizes(&self) -> Option<Vec<usize>> {
        self.items()?.iter().map(Value::as_usize).collect()
    }

    /// A short description for error messages.
    pub fn describe(&self) -> String {
        match self {
            Value::None => "None".into(),
            Value::Bool(_) => "bool".into(),
            Value::Int(_) => "int".into(),
            Value::Float(_) => "float".into(),
            Value::Str(_) => "str".into(),
            Value::Bytes(_) => "bytes".into(),
            Value::Tuple(_) => "tuple".into(),
            Value::List(_) => "list".into(),
            Value::Dict(_) => "dict".into(),
            Value::Global(g) => format!("global {g}"),
            Value::Storage(_) => "storage".into(),
            Value::Tensor(_) => "tensor".into(),
            Value::Object(o) => format!("object of {o}"),
        }
    }
}
