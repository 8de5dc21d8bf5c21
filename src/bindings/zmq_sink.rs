//! `kvpool.ZmqSink`: a pyzmq PUB socket that a batch of events is sent on from Rust, its
//! payload lent to ZeroMQ instead of copied.
//!
//! pyzmq copies every frame it sends into a ZeroMQ message (a serving step's 266-541 kB
//! payload: 28-40 µs on the scheduler's thread); lending a Python object instead
//! (`copy=False`) costs more, because ZeroMQ's I/O thread must then hand the object back
//! to a Python thread that takes the GIL to release it. Here the payload is a Rust buffer:
//! `zmq_msg_init_data` takes it as it is, and the function ZeroMQ calls when it is done
//! with it (on its I/O thread, or inside the send when no subscriber wants it) puts the
//! buffer back on a short free list, with no Python involved. The next batch is encoded
//! into it. A payload that already is a Python `bytes` (`ZmqSink.send`) is lent as it is:
//! it is kept alive in a process-wide list, the callback only marks it returned, and a
//! later send, holding the GIL, lets go of the returned ones.
//!
//! The libzmq used is the one pyzmq loaded (its wheel bundles one): it is found among the
//! process's loaded objects (`dl_iterate_phdr`), opened with `RTLD_NOLOAD` (never loaded
//! here) and must report pyzmq's version; more than one such library is refused. The
//! socket is pyzmq's (`Socket.underlying`, the address pyzmq documents for use from C);
//! the sink keeps the socket object alive and checks `closed` with the GIL held just
//! before each send, and holds the GIL until the send returns, so that no Python thread
//! can close the socket under it.
//!
//! One of the crate's modules with `unsafe` code: the calls into libzmq through the
//! function pointers found here, and the buffer given to and taken back from ZeroMQ.

#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::{error, ErrorKind};

/// `ZMQ_SNDMORE`: more frames of the same message follow.
const SNDMORE: c_int = 2;
/// `ZMQ_TYPE`, the socket option, and the types a sink accepts (`ZMQ_PUB`, `ZMQ_XPUB`).
const OPTION_TYPE: c_int = 16;
const SOCKET_PUB: c_int = 1;
const SOCKET_XPUB: c_int = 9;

/// libzmq's `zmq_msg_t`: 64 opaque bytes, pointer-aligned (`zmq.h`, 4.x).
#[repr(C, align(8))]
struct ZmqMsg([u8; 64]);

type FreeFn = unsafe extern "C" fn(data: *mut c_void, hint: *mut c_void);
type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int, *mut c_int);
type SendFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int;
type MsgInitDataFn =
    unsafe extern "C" fn(*mut ZmqMsg, *mut c_void, usize, Option<FreeFn>, *mut c_void) -> c_int;
type MsgSendFn = unsafe extern "C" fn(*mut ZmqMsg, *mut c_void, c_int) -> c_int;
type MsgCloseFn = unsafe extern "C" fn(*mut ZmqMsg) -> c_int;
type GetsockoptFn = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut usize) -> c_int;
type ErrnoFn = unsafe extern "C" fn() -> c_int;
type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The libzmq functions a sink calls (C ABI, stable since libzmq 4.0).
struct LibZmq {
    version: VersionFn,
    send: SendFn,
    msg_init_data: MsgInitDataFn,
    msg_send: MsgSendFn,
    msg_close: MsgCloseFn,
    getsockopt: GetsockoptFn,
    errno: ErrnoFn,
    strerror: StrerrorFn,
}

impl LibZmq {
    /// `(major, minor, patch)`.
    fn version(&self) -> (i32, i32, i32) {
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: `zmq_version` writes three ints through the pointers given.
        unsafe { (self.version)(&mut a, &mut b, &mut c) };
        (a, b, c)
    }

    /// The last libzmq error on this thread, in words.
    fn last_error(&self) -> String {
        // SAFETY: `zmq_errno` takes nothing; `zmq_strerror` returns a static C string
        // (or null, checked) for any error number.
        unsafe {
            let code = (self.errno)();
            let text = (self.strerror)(code);
            if text.is_null() {
                format!("libzmq error {code}")
            } else {
                format!(
                    "{} (libzmq error {code})",
                    CStr::from_ptr(text).to_string_lossy()
                )
            }
        }
    }
}

/// The loaded libraries whose file name contains `libzmq`.
#[cfg(target_os = "linux")]
fn loaded_libzmq_paths() -> Vec<std::ffi::CString> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut c_void,
    ) -> c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid `info` for the call's duration, whose
        // `dlpi_name` is null or a C string; `out` is the vector `loaded_libzmq_paths`
        // passed in, borrowed by nothing else during the walk.
        unsafe {
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let name = CStr::from_ptr(name);
                let file = name
                    .to_bytes()
                    .rsplit(|&b| b == b'/')
                    .next()
                    .unwrap_or_default();
                if file.starts_with(b"libzmq") {
                    (*out.cast::<Vec<std::ffi::CString>>()).push(name.to_owned());
                }
            }
        }
        0
    }
    let mut found: Vec<std::ffi::CString> = Vec::new();
    // SAFETY: `visit` only reads what the loader passes it and pushes onto `found`.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut found).cast()) };
    found
}

/// The functions of the loaded library at `path` (not loaded if it is not already).
#[cfg(target_os = "linux")]
fn open_loaded(path: &CStr) -> Result<LibZmq, String> {
    // SAFETY: RTLD_NOLOAD returns a handle only for an object already loaded (no
    // initialisers run); the handle is never closed, so the functions stay valid.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return Err(format!("{} is not loaded", path.to_string_lossy()));
    }
    let symbol = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: `handle` is a live handle and `name` a C string.
        let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if address.is_null() {
            Err(format!(
                "{} has no {}",
                path.to_string_lossy(),
                name.to_string_lossy()
            ))
        } else {
            Ok(address)
        }
    };
    // SAFETY: each symbol is the libzmq 4.x function of that name, whose C signature
    // the field's type spells out (`zmq.h`).
    unsafe {
        Ok(LibZmq {
            version: std::mem::transmute::<*mut c_void, VersionFn>(symbol(c"zmq_version")?),
            send: std::mem::transmute::<*mut c_void, SendFn>(symbol(c"zmq_send")?),
            msg_init_data: std::mem::transmute::<*mut c_void, MsgInitDataFn>(symbol(
                c"zmq_msg_init_data",
            )?),
            msg_send: std::mem::transmute::<*mut c_void, MsgSendFn>(symbol(c"zmq_msg_send")?),
            msg_close: std::mem::transmute::<*mut c_void, MsgCloseFn>(symbol(c"zmq_msg_close")?),
            getsockopt: std::mem::transmute::<*mut c_void, GetsockoptFn>(symbol(
                c"zmq_getsockopt",
            )?),
            errno: std::mem::transmute::<*mut c_void, ErrnoFn>(symbol(c"zmq_errno")?),
            strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(symbol(c"zmq_strerror")?),
        })
    }
}

/// The one loaded libzmq of version `wanted` (pyzmq's). The process's libraries are
/// looked through once, the first time a sink is made (pyzmq imported by then).
fn libzmq(wanted: (i32, i32, i32)) -> Result<&'static LibZmq, String> {
    static FOUND: OnceLock<Vec<LibZmq>> = OnceLock::new();
    #[cfg(target_os = "linux")]
    let found = FOUND.get_or_init(|| {
        loaded_libzmq_paths()
            .iter()
            .filter_map(|path| open_loaded(path).ok())
            .collect()
    });
    #[cfg(not(target_os = "linux"))]
    let found = FOUND.get_or_init(Vec::new);
    let mut matching = found.iter().filter(|lib| lib.version() == wanted);
    match (matching.next(), matching.next()) {
        (Some(lib), None) => Ok(lib),
        (None, _) => Err(format!(
            "no loaded libzmq with every function a sink calls reports pyzmq's version \
             {}.{}.{} (sending from Rust is implemented on Linux)",
            wanted.0, wanted.1, wanted.2
        )),
        (Some(_), Some(_)) => Err("more than one libzmq of pyzmq's version is loaded".into()),
    }
}

/// Encoding buffers back from ZeroMQ, for the next batches to be encoded into.
static SPARE_BUFFERS: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
/// How many spare buffers are kept, and the largest kept (as `WIRE_SCRATCH`).
const SPARE_BUFFERS_MAX: usize = 4;
const SPARE_BUFFER_BYTES_MAX: usize = 1 << 26;

/// An empty buffer for a batch to be encoded into: one ZeroMQ gave back, or a new one.
pub fn spare_buffer() -> Vec<u8> {
    let mut buf = SPARE_BUFFERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .pop()
        .unwrap_or_default();
    buf.clear();
    buf
}

/// Keeps `buf` for a later batch, within the bounds.
fn recycle(buf: Vec<u8>) {
    if buf.capacity() <= SPARE_BUFFER_BYTES_MAX {
        let mut spare = SPARE_BUFFERS.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_BUFFERS_MAX {
            spare.push(buf);
        }
    }
}

/// A payload lent to ZeroMQ, as the free callback's hint: what to do once ZeroMQ is done.
enum Lent {
    /// A Rust buffer: back to the spare buffers.
    Buffer(Vec<u8>),
    /// A Python ``bytes`` held in [`LENT_BYTES`]: marked returned, and let go by a later
    /// send (which holds the GIL; ZeroMQ's thread does not).
    Bytes(Arc<AtomicBool>),
}

/// Python payloads lent to ZeroMQ, oldest first, each with the mark set once it is
/// returned (by ZeroMQ's free callback, or by a send that failed first). A
/// process-wide list, not the sink's: a payload must outlive the sink that sent it
/// while ZeroMQ still holds it.
static LENT_BYTES: Mutex<VecDeque<(Py<PyBytes>, Arc<AtomicBool>)>> = Mutex::new(VecDeque::new());

/// Lets go of the lent Python payloads ZeroMQ has returned, from the oldest up to the
/// first it still holds (they are returned nearly in order), after the list's lock is
/// released. Needs the GIL (the payloads are dropped here).
fn release_returned(_py: Python<'_>) {
    let returned: Vec<Py<PyBytes>> = {
        let mut lent = LENT_BYTES.lock().unwrap_or_else(|p| p.into_inner());
        let n = lent
            .iter()
            .take_while(|(_, done)| done.load(Ordering::Acquire))
            .count();
        lent.drain(..n).map(|(payload, _)| payload).collect()
    };
    drop(returned);
}

impl Lent {
    /// Done with: by ZeroMQ, or by a send that failed before ZeroMQ took it.
    fn returned(self) {
        match self {
            Lent::Buffer(buf) => recycle(buf),
            Lent::Bytes(done) => done.store(true, Ordering::Release),
        }
    }
}

/// What ZeroMQ calls once it is done with a lent payload (any thread; no Python).
unsafe extern "C" fn give_back(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Lent>` leaked in `send_lent` for this message, and ZeroMQ
    // calls this exactly once per message.
    unsafe { Box::from_raw(hint.cast::<Lent>()) }.returned();
}

/// A pyzmq ``PUB`` (or ``XPUB``) socket that event batches are sent on from Rust, each
/// as vLLM's three frames (topic, sequence number as 8 bytes big-endian, payload), the
/// payload lent to ZeroMQ without a copy (``send_events`` of a manager, a pool or a
/// group manager; ``ZmqPublisher`` uses it when it can).
///
/// Raises ``TransportError`` when the libzmq pyzmq uses cannot be reached from here
/// (not Linux, or no single loaded libzmq of pyzmq's version), ``DtypeError`` for
/// anything but a ``zmq.Socket`` (and a topic not ``bytes``) and ``InvalidArgumentError``
/// for a socket closed or of another type than PUB or XPUB. The
/// socket stays pyzmq's: options, binding and closing go through it; the sink keeps it
/// alive and sends only while it is open. Like the socket, a sink must not be used by
/// two threads at once.
#[pyclass(frozen, module = "kvpool", name = "ZmqSink")]
pub struct PyZmqSink {
    socket: Py<PyAny>,
    address: usize,
    topic: Vec<u8>,
    lib: &'static LibZmq,
}

#[pymethods]
impl PyZmqSink {
    #[new]
    #[pyo3(signature = (socket, topic=None))]
    fn new(socket: &Bound<'_, PyAny>, topic: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let py = socket.py();
        let zmq = py.import("zmq")?;
        let invalid = |what: String| error(py, ErrorKind::InvalidArgument, what);
        if !socket.is_instance(&zmq.getattr("Socket")?)? {
            return Err(error(
                py,
                ErrorKind::Dtype,
                format!(
                    "socket must be a zmq.Socket, got {}",
                    super::convert::type_name(socket)
                ),
            ));
        }
        if socket.getattr("closed")?.is_truthy()? {
            return Err(invalid("the socket is closed".into()));
        }
        let topic = match topic.filter(|t| !t.is_none()) {
            None => Vec::new(),
            Some(t) => super::convert::bytes_arg(t, "topic")?.as_bytes().to_vec(),
        };
        let wanted: (i32, i32, i32) = zmq.call_method0("zmq_version_info")?.extract()?;
        let lib = libzmq(wanted).map_err(|e| error(py, ErrorKind::Transport, e))?;
        let address: usize = socket.getattr("underlying")?.extract()?;
        let mut kind: c_int = -1;
        let mut size = std::mem::size_of::<c_int>();
        // SAFETY: `address` is the live socket pyzmq holds (checked open above, with the
        // GIL held) in the libzmq pyzmq loaded; `ZMQ_TYPE` writes one int.
        let rc = unsafe {
            (lib.getsockopt)(
                address as *mut c_void,
                OPTION_TYPE,
                (&raw mut kind).cast(),
                &mut size,
            )
        };
        if rc != 0 {
            return Err(error(py, ErrorKind::Transport, lib.last_error()));
        }
        if kind != SOCKET_PUB && kind != SOCKET_XPUB {
            return Err(invalid(format!(
                "the socket must be a PUB or XPUB socket (ZeroMQ type {kind})"
            )));
        }
        Ok(Self {
            socket: socket.clone().unbind(),
            address,
            topic,
            lib,
        })
    }

    /// Sends ``payload`` (``bytes``) as batch ``seq``: the topic, the sequence number as 8
    /// bytes big-endian and the payload, which is lent to ZeroMQ rather than copied (kept
    /// alive until ZeroMQ is done with it, and let go by a later send). Raises
    /// ``TransportError`` if the socket is closed or the send fails.
    fn send(
        &self,
        py: Python<'_>,
        seq: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let seq = super::convert::int_arg(seq, "seq", 0, i64::MAX)? as u64;
        let bytes = super::convert::bytes_arg(payload, "payload")?;
        release_returned(py);
        let data = bytes.as_bytes();
        let done = Arc::new(AtomicBool::new(false));
        // Held before ZeroMQ can see it; a send that fails marks it returned.
        LENT_BYTES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back((bytes.clone().unbind(), Arc::clone(&done)));
        self.send_lent(py, seq, data.as_ptr(), data.len(), Lent::Bytes(done))
    }

    /// The topic frame every batch is sent with.
    #[getter]
    fn topic<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.topic)
    }

    /// The libzmq version in use, ``(major, minor, patch)``.
    #[getter]
    fn libzmq_version(&self) -> (i32, i32, i32) {
        self.lib.version()
    }
}

impl PyZmqSink {
    /// Raises ``TransportError`` if the socket is closed (a check to make before taking
    /// anything that a refused send would lose).
    pub(crate) fn check_open(&self, py: Python<'_>) -> PyResult<()> {
        if self.socket.bind(py).getattr("closed")?.is_truthy()? {
            return Err(error(py, ErrorKind::Transport, "the socket is closed"));
        }
        Ok(())
    }

    /// Sends batch `seq`: the topic and the sequence number (copied, 8 bytes big-endian)
    /// and `payload`, lent to ZeroMQ (it comes back to the spare buffers when ZeroMQ is
    /// done with it, or here if the send fails). The GIL is held throughout, so the
    /// socket, open when checked here, stays open. ``TransportError`` on failure.
    pub(crate) fn send_batch(&self, py: Python<'_>, seq: u64, payload: Vec<u8>) -> PyResult<()> {
        let len = payload.len();
        let data = payload.as_ptr();
        // The vector's buffer stays where it is until `give_back` drops the box.
        self.send_lent(py, seq, data, len, Lent::Buffer(payload))
    }

    /// Sends the frames of batch `seq`, the payload `data..data + len` lent as `lent`,
    /// which is returned once ZeroMQ is done with it, or here if the send fails first.
    fn send_lent(
        &self,
        py: Python<'_>,
        seq: u64,
        data: *const u8,
        len: usize,
        lent: Lent,
    ) -> PyResult<()> {
        if let Err(e) = self.check_open(py) {
            lent.returned();
            return Err(e);
        }
        let socket = self.address as *mut c_void;
        let failed = || {
            error(
                py,
                ErrorKind::Transport,
                format!("sending batch {seq}: {}", self.lib.last_error()),
            )
        };
        let seq_bytes = seq.to_be_bytes();
        for frame in [&self.topic[..], &seq_bytes[..]] {
            // SAFETY: `socket` is open (checked above, the GIL held since); `zmq_send`
            // copies `frame` before returning.
            if unsafe { (self.lib.send)(socket, frame.as_ptr().cast(), frame.len(), SNDMORE) } < 0 {
                let err = failed(); // before anything else can touch errno
                lent.returned();
                return Err(err);
            }
        }
        let hint = Box::into_raw(Box::new(lent));
        let mut msg = ZmqMsg([0; 64]);
        // SAFETY: `data..data + len` stays valid and unchanged until `give_back` runs:
        // it is a vector's buffer owned by the box, or an immutable `bytes` that
        // `LENT_BYTES` holds until it is marked returned.
        let made = unsafe {
            (self.lib.msg_init_data)(
                &mut msg,
                data.cast_mut().cast(),
                len,
                Some(give_back),
                hint.cast(),
            )
        };
        if made != 0 {
            let err = failed();
            // SAFETY: the message was not made, so ZeroMQ never took the box.
            unsafe { Box::from_raw(hint) }.returned();
            return Err(err);
        }
        // SAFETY: `msg` is initialised; on success ZeroMQ owns it (and will call
        // `give_back`), on failure it is still ours and closing it calls `give_back`.
        unsafe {
            if (self.lib.msg_send)(&mut msg, socket, 0) < 0 {
                let err = failed();
                (self.lib.msg_close)(&mut msg);
                return Err(err);
            }
        }
        Ok(())
    }
}
