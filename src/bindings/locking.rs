//! The one way the bindings take their locks.
//!
//! The rules (`docs/design.md`, "Locks"):
//!
//! 1. No Python code runs while a kvpool lock is held: arguments are converted
//!    before locking, Python results are built after unlocking. Object creation
//!    counts (it can start the garbage collector, whose finalizers can call back into
//!    kvpool on the same thread), so the closures below return plain Rust data.
//! 2. Long work runs with the GIL released, and takes its lock inside that section
//!    ([`with_detached`]), so a lock is never held while the GIL is given up and
//!    taken back.
//! 3. A thread never waits for a kvpool lock while holding the GIL ([`with_lock`]
//!    tries first and, if another thread holds the lock, which can then only be one
//!    working with the GIL released, waits with the GIL released), so a holder that
//!    needs nothing from Python always finishes and nobody stalls the interpreter.
//!
//! A poisoned lock is taken over: the core never leaves its state half-changed, so a
//! panic elsewhere does not make it unusable.

use std::sync::{Mutex, MutexGuard, TryLockError};

use pyo3::prelude::*;

/// Takes `mutex` under rule 3: the uncontended path, one `try_lock`, inline; the
/// wait out of line.
#[inline]
fn lock<'a, T: Send>(py: Python<'_>, mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
    loop {
        match mutex.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => wait_for(py, mutex),
        }
    }
}

/// Waits for the holder of `mutex` with the GIL released (the caller then tries
/// again with it).
#[cold]
#[inline(never)]
fn wait_for<T: Send>(py: Python<'_>, mutex: &Mutex<T>) {
    py.detach(|| drop(mutex.lock()));
}

/// Runs `f` on the value behind `mutex`, the GIL held; `f` must not call into Python.
#[inline]
pub fn with_lock<T: Send, R>(py: Python<'_>, mutex: &Mutex<T>, f: impl FnOnce(&mut T) -> R) -> R {
    f(&mut lock(py, mutex))
}

/// Runs `f` on the value behind `mutex` if it is free now, the GIL held throughout;
/// `None`, without running `f`, if another thread holds it. For a caller whose `f`
/// reads memory that is only safe while the GIL has not been given up (a numpy
/// array's, lent in place); it then takes its general path.
#[inline]
pub fn try_with_lock<T: Send, R>(mutex: &Mutex<T>, f: impl FnOnce(&mut T) -> R) -> Option<R> {
    match mutex.try_lock() {
        Ok(mut guard) => Some(f(&mut guard)),
        Err(TryLockError::Poisoned(poisoned)) => Some(f(&mut poisoned.into_inner())),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The guard of `mutex` if it is free now (never waits, never gives up the GIL):
/// for a caller that holds memory only safe while the GIL is kept, and otherwise
/// copies it before taking the lock with [`with_lock`].
#[inline]
pub fn lock_if_free<T: Send>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Runs `f` on the value behind `mutex` with the GIL released, the lock taken (and
/// waited for) inside that section.
pub fn with_detached<T: Send, R: Send>(
    py: Python<'_>,
    mutex: &Mutex<T>,
    f: impl FnOnce(&mut T) -> R + Send,
) -> R {
    py.detach(|| f(&mut mutex.lock().unwrap_or_else(|p| p.into_inner())))
}

/// `cell`'s value, made by `init` on first use under rule 1: `init` (which may run
/// Python code: an import, object creation) runs without holding the cell, so code it
/// triggers (a garbage-collector callback reading the same value) makes a value of its
/// own instead of deadlocking on the cell's initialisation. The first value stored
/// wins; a losing one is dropped.
pub fn init_once<'a, T>(
    py: Python<'_>,
    cell: &'a pyo3::sync::PyOnceLock<T>,
    init: impl FnOnce() -> PyResult<T>,
) -> PyResult<&'a T> {
    if let Some(value) = cell.get(py) {
        return Ok(value);
    }
    let made = init()?;
    // `Err` returns `made` when another call stored a value first.
    drop(cell.set(py, made));
    cell.get(py).ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err("kvpool: a cached value was not stored")
    })
}
