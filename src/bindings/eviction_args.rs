//! The arguments of eviction policies, pins and retention priorities, converted
//! before any lock is taken.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use super::convert::{opt_int_arg, opt_str_arg, type_name};
use super::errors::{error, ErrorKind, IntoPyResult};
use crate::pool::{BlockPriority, EvictionPolicy, MAX_PRIORITY};

/// The constructor arguments a pool and a manager share: ``eviction=``,
/// ``max_pinned_blocks=`` and ``clock=``.
#[derive(Clone, Copy, Debug)]
pub struct PolicyArgs {
    /// The eviction policy.
    pub eviction: EvictionPolicy,
    /// The pin budget, when given (``0..=num_blocks``).
    pub max_pinned_blocks: Option<u32>,
    /// Whether the clock is manual.
    pub manual_clock: bool,
    /// The adaptive policy's horizon, when given.
    pub adaptive_horizon: Option<u64>,
}

impl PolicyArgs {
    /// Checks the three arguments for a pool of `num_blocks`.
    pub fn extract(
        py: Python<'_>,
        num_blocks: u32,
        eviction: Option<&Bound<'_, PyAny>>,
        max_pinned_blocks: Option<&Bound<'_, PyAny>>,
        clock: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            eviction: eviction_arg(py, eviction)?,
            max_pinned_blocks: opt_int_arg(
                max_pinned_blocks,
                "max_pinned_blocks",
                0,
                i64::from(num_blocks),
            )?
            .map(|n| n as u32),
            manual_clock: clock_arg(py, clock)?,
            adaptive_horizon: None,
        })
    }

    /// Adds the ``adaptive_horizon=`` argument: blocks freed, and only with
    /// ``eviction="adaptive"`` (elsewhere it would be ignored, so it is refused). Its
    /// upper bound is the pool's to check, as for every other setting.
    pub fn with_horizon(
        mut self,
        py: Python<'_>,
        obj: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if let Some(horizon) = opt_int_arg(obj, "adaptive_horizon", 0, i64::MAX)? {
            if self.eviction != EvictionPolicy::Adaptive {
                return Err(error(
                    py,
                    ErrorKind::InvalidArgument,
                    format!(
                        "adaptive_horizon applies to eviction='adaptive', not '{}'",
                        self.eviction.name()
                    ),
                ));
            }
            self.adaptive_horizon = Some(horizon as u64);
        }
        Ok(self)
    }
}

/// The ``eviction=`` argument: ``"lru"`` (default), ``"priority"`` or ``"adaptive"``.
pub fn eviction_arg(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<EvictionPolicy> {
    match opt_str_arg(obj, "eviction")? {
        None => Ok(EvictionPolicy::Lru),
        Some(name) => EvictionPolicy::from_name(&name)
            .map_err(|e| error(py, ErrorKind::InvalidArgument, e.to_string())),
    }
}

/// The ``clock=`` argument: ``"monotonic"`` (default) or ``"manual"``; true for manual.
pub fn clock_arg(py: Python<'_>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
    match opt_str_arg(obj, "clock")?.as_deref() {
        None | Some("monotonic") => Ok(false),
        Some("manual") => Ok(true),
        Some(other) => Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!("clock must be 'monotonic' or 'manual', got '{other}'"),
        )),
    }
}

/// A number of seconds (an int or a float, not a bool), finite; `None` allowed.
pub fn opt_seconds_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<f64>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let py = obj.py();
    let number = obj.is_instance_of::<PyFloat>() || obj.is_instance_of::<PyInt>();
    if obj.is_instance_of::<PyBool>() || !number {
        return Err(error(
            py,
            ErrorKind::Dtype,
            format!("{what} must be a number of seconds, got {}", type_name(obj)),
        ));
    }
    // An int past f64's range is as infinite as `inf` (not Python's OverflowError).
    let value: f64 = obj.extract().unwrap_or(f64::INFINITY);
    if !value.is_finite() {
        return Err(error(
            py,
            ErrorKind::InvalidArgument,
            format!("{what} must be finite, got {value}"),
        ));
    }
    Ok(Some(value))
}

/// A finite number of seconds `obj` must be (`None` is refused, as any non-number).
pub fn seconds_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    match opt_seconds_arg(Some(obj), what)? {
        Some(seconds) => Ok(seconds),
        None => Err(error(
            obj.py(),
            ErrorKind::Dtype,
            format!("{what} must be a number of seconds, got NoneType"),
        )),
    }
}

/// A retention priority and its duration, checked; turned into a
/// [`BlockPriority`] under the pool's lock, where the clock is read.
#[derive(Clone, Copy, Debug)]
pub struct PriorityArg {
    priority: u8,
    duration_s: Option<f64>,
}

impl PriorityArg {
    /// ``priority=`` and ``retention_s=``: both `None` is no priority; a duration
    /// needs a priority; the priority is in ``0..=100``, the duration positive.
    pub fn extract(
        py: Python<'_>,
        priority: Option<&Bound<'_, PyAny>>,
        retention_s: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Self>> {
        let priority = opt_int_arg(priority, "priority", 0, i64::from(MAX_PRIORITY))?;
        let duration_s = opt_seconds_arg(retention_s, "retention_s")?;
        match (priority, duration_s) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(error(
                py,
                ErrorKind::InvalidArgument,
                "retention_s needs a priority (the priority it keeps for that long)",
            )),
            (Some(p), d) => {
                if let Some(d) = d.filter(|&d| d <= 0.0) {
                    return Err(error(
                        py,
                        ErrorKind::InvalidArgument,
                        format!("retention_s must be > 0 seconds, got {d}"),
                    ));
                }
                Ok(Some(Self {
                    priority: p as u8,
                    duration_s: d,
                }))
            }
        }
    }

    /// The priority as of `now` on the pool's clock.
    pub fn at(self, now: f64) -> BlockPriority {
        BlockPriority {
            priority: self.priority,
            expires_at: self.duration_s.map(|d| now + d),
        }
    }
}

/// The fingerprint by which the adaptive policy's ghost table knows the key
/// ``(block_hash, group)``: what ``kvpool.reference`` computes in plain Python, so
/// that the two tables agree way for way.
#[pyfunction]
#[pyo3(signature = (block_hash, group=None))]
pub fn ghost_fingerprint(
    block_hash: &Bound<'_, PyAny>,
    group: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let py = block_hash.py();
    let bytes = block_hash
        .cast::<pyo3::types::PyBytes>()
        .map_err(|_| {
            error(
                py,
                ErrorKind::Dtype,
                format!("block_hash must be bytes, got {}", type_name(block_hash)),
            )
        })?
        .as_bytes();
    let group = opt_int_arg(group, "group", 0, i64::from(u32::MAX))?.unwrap_or(0) as u32;
    let hash = crate::pool::BlockHash::new(bytes).py_err(py)?;
    Ok(crate::pool::ghost_fingerprint(
        &crate::pool::BlockHashKey::new(hash, group),
    ))
}
