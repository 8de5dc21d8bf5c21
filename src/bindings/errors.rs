//! The `KVPoolError` exception tree and the one mapping from [`PoolError`].
//!
//! Several classes subclass a builtin too (`InvalidBlockIdError(KVPoolError,
//! ValueError)`), which `create_exception!` cannot express, so the classes are made
//! with `type(name, bases, ns)` when the module is initialised and kept in statics.

use pyo3::exceptions::{
    PyAssertionError, PyKeyError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

use crate::pool::PoolError;

/// Every exception class of the module, by its index in [`CLASSES`].
#[derive(Clone, Copy)]
pub enum ErrorKind {
    #[allow(dead_code)] // the base class is raised only as a superclass
    Base = 0,
    NoFreeBlocks,
    InvalidBlockId,
    DoubleFree,
    BlockState,
    HashWidth,
    Dtype,
    InvalidArgument,
    CachingDisabled,
    Invariant,
    UnknownRequest,
    DuplicateRequest,
    OutOfMemory,
    PinBudget,
    Transport,
}

/// Builtin base of a class, besides `KVPoolError`.
enum Builtin {
    None,
    Value,
    Type,
    Runtime,
    Assertion,
    Key,
    Memory,
}

const CLASSES: [(&str, Builtin, &str); 15] = [
    (
        "KVPoolError",
        Builtin::None,
        "Base class of every error kvpool raises.",
    ),
    (
        "NoFreeBlocksError",
        Builtin::Value,
        "Fewer free blocks than requested; nothing was allocated.",
    ),
    (
        "InvalidBlockIdError",
        Builtin::Value,
        "A block id is negative or out of range; nothing was changed.",
    ),
    (
        "DoubleFreeError",
        Builtin::Value,
        "A block would be freed while its reference count is already 0; nothing was changed.",
    ),
    (
        "BlockStateError",
        Builtin::Value,
        "A block is in the wrong state for the operation (caching a free or cached block).",
    ),
    (
        "HashWidthError",
        Builtin::Value,
        "A block hash is empty, longer than 32 bytes, or of another width than the pool's.",
    ),
    (
        "DtypeError",
        Builtin::Type,
        "An argument has the wrong type or numpy dtype (block ids must be integers).",
    ),
    (
        "InvalidArgumentError",
        Builtin::Value,
        "An argument is out of its valid range or inconsistent with another one.",
    ),
    (
        "CachingDisabledError",
        Builtin::Runtime,
        "A prefix-cache operation was called on a pool built with enable_caching=False.",
    ),
    (
        "InvariantError",
        Builtin::Assertion,
        "check_invariants found the pool's structure inconsistent (a bug in kvpool).",
    ),
    (
        "UnknownRequestError",
        Builtin::Key,
        "A request id that the manager does not track.",
    ),
    (
        "DuplicateRequestError",
        Builtin::Value,
        "A request id that the manager already tracks.",
    ),
    (
        "OutOfMemoryError",
        Builtin::Memory,
        "Memory for a pool, a manager or a batch could not be allocated; nothing was changed.",
    ),
    (
        "PinBudgetError",
        Builtin::Value,
        "Pinning would exceed the pool's budget of pinned blocks (max_pinned_blocks); nothing was pinned.",
    ),
    (
        "TransportError",
        Builtin::Runtime,
        "A batch could not be handed to ZeroMQ: the socket is closed, its context terminated, or the libzmq pyzmq uses cannot be reached from kvpool.",
    ),
];

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn build_types(py: Python<'_>) -> PyResult<Vec<Py<PyType>>> {
    let type_fn = py.import("builtins")?.getattr("type")?;
    let mut types: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
    for (name, builtin, doc) in CLASSES {
        let builtin = match builtin {
            Builtin::None => py.get_type::<pyo3::exceptions::PyException>(),
            Builtin::Value => py.get_type::<PyValueError>(),
            Builtin::Type => py.get_type::<PyTypeError>(),
            Builtin::Runtime => py.get_type::<PyRuntimeError>(),
            Builtin::Assertion => py.get_type::<PyAssertionError>(),
            Builtin::Key => py.get_type::<PyKeyError>(),
            Builtin::Memory => py.get_type::<PyMemoryError>(),
        };
        let bases = match types.first() {
            None => PyTuple::new(py, [builtin])?,
            Some(base) => PyTuple::new(py, [base.bind(py).clone(), builtin])?,
        };
        let ns = PyDict::new(py);
        ns.set_item("__module__", "kvpool")?;
        ns.set_item("__doc__", doc)?;
        let cls = type_fn.call1((name, bases, ns))?.cast_into::<PyType>()?;
        types.push(cls.unbind());
    }
    Ok(types)
}

/// Creates the classes (once) and adds them to `module`.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let types = TYPES.get_or_try_init(py, || build_types(py))?;
    for ((name, _, _), cls) in CLASSES.iter().zip(types) {
        module.add(*name, cls.bind(py))?;
    }
    Ok(())
}

/// An exception of class `kind` with `message`.
pub fn error(py: Python<'_>, kind: ErrorKind, message: impl Into<String>) -> PyErr {
    match TYPES.get(py) {
        Some(types) => PyErr::from_type(types[kind as usize].bind(py).clone(), message.into()),
        None => PyRuntimeError::new_err(message.into()),
    }
}

/// The exception class for a core error.
pub fn kind_of(err: &PoolError) -> ErrorKind {
    match err {
        PoolError::NoFreeBlocks { .. } => ErrorKind::NoFreeBlocks,
        PoolError::InvalidBlockId { .. } => ErrorKind::InvalidBlockId,
        PoolError::DoubleFree { .. } => ErrorKind::DoubleFree,
        PoolError::BlockState { .. } => ErrorKind::BlockState,
        PoolError::HashWidth { .. } => ErrorKind::HashWidth,
        PoolError::InvalidArgument(_) => ErrorKind::InvalidArgument,
        PoolError::CachingDisabled => ErrorKind::CachingDisabled,
        PoolError::UnknownRequest(_) => ErrorKind::UnknownRequest,
        PoolError::DuplicateRequest(_) => ErrorKind::DuplicateRequest,
        PoolError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
        PoolError::PinBudget { .. } => ErrorKind::PinBudget,
    }
}

/// Converts a core error into its Python exception.
pub fn to_py(py: Python<'_>, err: PoolError) -> PyErr {
    error(py, kind_of(&err), err.to_string())
}

/// `?`-friendly conversion of a core result.
pub trait IntoPyResult<T> {
    /// The core result as a `PyResult`.
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, PoolError> {
    #[inline]
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
