//! Core events to the dataclasses of `kvpool.events`.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList};

use crate::pool::PoolEvent;

static EVENTS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Converts queued events, oldest first, into a Python list of event objects.
pub fn events_to_py<'py>(py: Python<'py>, events: Vec<PoolEvent>) -> PyResult<Bound<'py, PyList>> {
    let module = EVENTS_MODULE
        .get_or_try_init(py, || py.import("kvpool.events").map(Bound::unbind))?
        .bind(py);
    let list = PyList::empty(py);
    for event in events {
        let obj = match event {
            PoolEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                lora_name,
                group_idx,
            } => {
                let hashes = PyList::new(
                    py,
                    block_hashes.iter().map(|h| PyBytes::new(py, h.as_bytes())),
                )?;
                let parent = parent_block_hash.map(|h| PyBytes::new(py, h.as_bytes()));
                module.getattr("BlockStored")?.call1((
                    hashes,
                    parent,
                    PyList::new(py, token_ids)?,
                    block_size,
                    lora_id,
                    "GPU",
                    lora_name,
                    group_idx,
                ))?
            }
            PoolEvent::BlockRemoved {
                block_hash,
                group_idx,
            } => {
                let hashes = PyList::new(py, [PyBytes::new(py, block_hash.as_bytes())])?;
                module
                    .getattr("BlockRemoved")?
                    .call1((hashes, "GPU", group_idx))?
            }
            PoolEvent::AllBlocksCleared => module.getattr("AllBlocksCleared")?.call0()?,
        };
        list.append(obj)?;
    }
    Ok(list)
}
