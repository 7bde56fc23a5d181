//! A request answered by the server's routes inside this process: the
//! answer's status, then its body, whole or (streamed) as each Server-Sent
//! Event's payload. Dropping the answer's receiver or its task cancels the
//! generation, as a client that hangs up does.

use std::convert::Infallible;
use std::sync::Mutex;

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use pyo3::prelude::*;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio_stream::StreamExt;
use tower::ServiceExt;

use crate::wait;

/// What a request's task sends, in order: the status, then the body.
pub enum Item {
    /// The HTTP status of the answer.
    Head(u16),
    /// The whole body, or one event's payload of a stream.
    Data(String),
}

/// Events a stream may run ahead of its reader.
const AHEAD: usize = 64;

/// Answers `req` with `app` on `rt`: its status, then its body (whole, or
/// with `events`, when the answer is 200, each Server-Sent Event's payload).
/// The task stops when its receiver is dropped.
pub fn send(
    rt: &tokio::runtime::Handle,
    app: Router,
    req: Request<Body>,
    events: bool,
) -> (mpsc::Receiver<Item>, AbortHandle) {
    let (tx, rx) = mpsc::channel(AHEAD);
    let task = rt.spawn(async move {
        let answer = app.oneshot(req).await.unwrap_or_else(|e: Infallible| match e {});
        let status = answer.status().as_u16();
        if tx.send(Item::Head(status)).await.is_err() {
            return;
        }
        let mut body = answer.into_body().into_data_stream();
        let mut frames = Frames::default();
        let events = events && status == 200;
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else { break };
            frames.buf.extend_from_slice(&chunk);
            // A whole body (not an event stream) is kept as it came.
            while let Some(data) = events.then(|| frames.next_event()).flatten() {
                if tx.send(Item::Data(data)).await.is_err() {
                    return;
                }
            }
        }
        if !events {
            let _ = tx.send(Item::Data(String::from_utf8_lossy(&frames.buf).into_owned())).await;
        }
    });
    (rx, task.abort_handle())
}

/// Bytes of a Server-Sent Events body not yet cut into events.
#[derive(Default)]
struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    /// The data of the next whole event that carries any (comments, such
    /// as keep-alives, carry none), taken off the buffer.
    fn next_event(&mut self) -> Option<String> {
        loop {
            let end = self.buf.windows(2).position(|w| w == b"\n\n")?;
            let event: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                return Some(data.join("\n"));
            }
        }
    }
}

/// A streamed answer, iterated from Python: each event's payload (a JSON
/// chunk, then `[DONE]`); an answer that is not 200 yields its error body
/// once. Iteration waits with the GIL released; a signal raises its
/// exception and cancels the generation, as dropping the stream does.
#[pyclass(module = "hamburger._native")]
pub struct Stream {
    /// The answer's HTTP status.
    #[pyo3(get)]
    status: u16,
    rt: tokio::runtime::Handle,
    rx: Mutex<mpsc::Receiver<Item>>,
    task: AbortHandle,
}

impl Stream {
    /// Waits for the status of the answer `rx` receives from `task`.
    pub fn open(
        py: Python<'_>,
        rt: tokio::runtime::Handle,
        mut rx: mpsc::Receiver<Item>,
        task: AbortHandle,
    ) -> PyResult<Stream> {
        let status = match wait::one(py, &rt, &mut rx) {
            Ok(Item::Head(status)) => status,
            Ok(Item::Data(_)) => {
                task.abort();
                return Err(pyo3::exceptions::PyRuntimeError::new_err("an answer without a status"));
            }
            Err(e) => {
                task.abort();
                return Err(e);
            }
        };
        Ok(Stream { status, rt, rx: Mutex::new(rx), task })
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let mut rx = self.rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match wait::next(py, &self.rt, &mut rx) {
            Ok(Some(Item::Data(data))) => Ok(Some(data)),
            Ok(Some(Item::Head(_)) | None) => Ok(None),
            Err(e) => {
                self.task.abort();
                Err(e)
            }
        }
    }

    /// Stops the generation now (the stream then ends).
    fn close(&self) {
        self.task.abort();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
