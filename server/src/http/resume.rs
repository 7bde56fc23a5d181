//! Resumable streams, as llama-server has them: a streamed completion sent
//! with an `X-Conversation-Id` header is written into a buffer kept under
//! that id, and generation goes on when the client disconnects (a page
//! reload). `GET /v1/stream?conv_id=ID&from=N` replays the stream's bytes
//! from offset N and follows it live until it ends; `DELETE
//! /v1/stream?conv_id=ID` stops it (the generation is cancelled) and forgets
//! it; `POST /v1/streams/lookup` says which of the given ids have a stream.
//!
//! One id holds at most one stream (a new request replaces and cancels the
//! old one); a buffer keeps the last [`MAX_BYTES`] of its stream, and a
//! finished stream is gone [`TTL`] after its end (its memory is given back
//! when the next stream starts).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::state::body;
use super::{AppState, KEEP_ALIVE};
use crate::error::{status, ApiError};

/// Most bytes of one stream kept; older bytes are dropped first.
pub const MAX_BYTES: usize = 4 << 20;

/// How long a finished stream stays replayable.
pub const TTL: Duration = Duration::from_secs(300);

/// The header that names a conversation.
pub const CONVERSATION_ID: header::HeaderName = header::HeaderName::from_static("x-conversation-id");

/// The routes: `GET`/`DELETE /v1/stream`, `POST /v1/streams/lookup`.
pub(super) fn routes() -> Router<AppState> {
    Router::new().route("/v1/stream", get(replay).delete(stop)).route("/v1/streams/lookup", post(lookup))
}

/// The conversation id a request names, if any (an empty header is none).
pub(super) fn conversation_id(headers: &HeaderMap) -> Option<String> {
    let id = headers.get(CONVERSATION_ID)?.to_str().ok()?;
    (!id.is_empty()).then(|| id.to_string())
}

/// Every live or recently finished stream, by conversation id.
#[derive(Default)]
pub struct StreamSessions {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

impl StreamSessions {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh session under `id`, cancelling the one it replaces; finished
    /// sessions past their time are forgotten on the way.
    fn create(&self, id: &str) -> Arc<Session> {
        let fresh = Arc::new(Session::new(id));
        let mut map = self.map();
        let now = unix_now();
        map.retain(|_, s| s.completed_at().is_none_or(|at| now < at + TTL.as_secs()));
        if let Some(old) = map.insert(id.to_string(), fresh.clone()) {
            old.cancel();
        }
        fresh
    }

    /// `id`'s session, unless it ended more than [`TTL`] ago.
    fn get(&self, id: &str) -> Option<Arc<Session>> {
        let now = unix_now();
        self.map().get(id).filter(|s| s.completed_at().is_none_or(|at| now < at + TTL.as_secs())).cloned()
    }

    /// Forgets `id`'s session and cancels its generation; false when there was none.
    fn stop(&self, id: &str) -> bool {
        let removed = self.map().remove(id);
        removed.inspect(|s| s.cancel()).is_some()
    }

    /// The sessions whose id is one of `ids`, or one of them followed by `::` (a model's variant).
    fn matching(&self, ids: &[String]) -> Vec<Arc<Session>> {
        let map = self.map();
        let named = |key: &str| {
            ids.iter().any(|id| key == id || key.strip_prefix(id.as_str()).is_some_and(|r| r.starts_with("::")))
        };
        let mut found: Vec<_> = map.iter().filter(|(k, _)| named(k)).map(|(_, s)| s.clone()).collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        found
    }
}

/// One stream's bytes and state.
struct Session {
    id: String,
    started_at: u64,
    buffer: Mutex<Buffer>,
    /// Bumped on every change, so readers and the writer can wait for one.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    /// Bytes dropped from the front to keep within [`MAX_BYTES`].
    dropped: usize,
    /// When the stream ended (Unix seconds).
    completed_at: Option<u64>,
    cancelled: bool,
}

impl Session {
    fn new(id: &str) -> Self {
        Session { id: id.to_string(), started_at: unix_now(), buffer: Mutex::default(), changed: watch::Sender::new(0) }
    }

    fn buffer(&self) -> MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn append(&self, data: &[u8]) {
        {
            let mut b = self.buffer();
            if b.completed_at.is_some() {
                return;
            }
            b.bytes.extend_from_slice(data);
            let over = b.bytes.len().saturating_sub(MAX_BYTES);
            if over > 0 {
                b.bytes.drain(..over);
                b.dropped += over;
            }
        }
        self.bump();
    }

    fn finish(&self) {
        {
            let mut b = self.buffer();
            b.completed_at.get_or_insert_with(unix_now);
        }
        self.bump();
    }

    fn cancel(&self) {
        self.buffer().cancelled = true;
        self.finish();
    }

    fn completed_at(&self) -> Option<u64> {
        self.buffer().completed_at
    }

    fn cancelled(&self) -> bool {
        self.buffer().cancelled
    }

    /// The bytes from `offset` on, and whether the stream has ended; `None`
    /// when `offset` lies in the dropped prefix.
    fn read_from(&self, offset: usize) -> Option<(Vec<u8>, bool)> {
        let b = self.buffer();
        let start = offset.checked_sub(b.dropped)?;
        let bytes = b.bytes.get(start..).unwrap_or_default().to_vec();
        Some((bytes, b.completed_at.is_some()))
    }

    fn total_bytes(&self) -> usize {
        let b = self.buffer();
        b.dropped + b.bytes.len()
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One event's Server-Sent Events bytes.
fn sse_event(data: &str) -> String {
    data.lines().map(|line| format!("data: {line}\n")).collect::<String>() + "\n"
}

/// Answers a streamed completion kept under `id`: a task writes `events`
/// into the session (and goes on when the client leaves, until the stream
/// ends or is stopped), and the client reads the session from its start.
pub(super) fn resumable(sessions: &StreamSessions, id: &str, mut events: mpsc::Receiver<String>) -> Response {
    let session = sessions.create(id);
    let writer = session.clone();
    tokio::spawn(async move {
        let mut changed = writer.changed.subscribe();
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(data) => writer.append(sse_event(&data).as_bytes()),
                    None => break,
                },
                _ = changed.wait_for(|_| writer.cancelled()) => break,
            }
        }
        // Dropping `events` here cancels a generation that was stopped.
        writer.finish();
    });
    follow(session, 0)
}

/// A `text/event-stream` response of `session`'s bytes from `offset` until
/// it ends, `: keep-alive` comments filling silences.
fn follow(session: Arc<Session>, mut offset: usize) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let mut changed = session.changed.subscribe();
        loop {
            changed.mark_unchanged();
            let Some((bytes, ended)) = session.read_from(offset) else { break };
            offset += bytes.len();
            let sent = if !bytes.is_empty() {
                tx.send(Bytes::from(bytes)).await
            } else if ended {
                break;
            } else if tokio::time::timeout(KEEP_ALIVE, changed.changed()).await.is_err() {
                tx.send(Bytes::from_static(b": keep-alive\n\n")).await
            } else {
                Ok(())
            };
            if sent.is_err() {
                break;
            }
        }
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// The query of the stream routes.
#[derive(Deserialize)]
struct StreamQuery {
    #[serde(default)]
    conv_id: String,
    from: Option<String>,
}

fn conv_id(q: &StreamQuery) -> Result<&str, ApiError> {
    if q.conv_id.is_empty() {
        return Err(ApiError::field("conv_id", "missing conversation id"));
    }
    Ok(&q.conv_id)
}

/// `GET /v1/stream?conv_id=ID&from=N`: the stream from byte N (default 0).
async fn replay(State(s): State<AppState>, Query(q): Query<StreamQuery>) -> Result<Response, ApiError> {
    let session =
        s.streams.get(conv_id(&q)?).ok_or_else(|| ApiError::new(status::NOT_FOUND, "stream not found or expired"))?;
    let from = match &q.from {
        Some(n) => n.parse().map_err(|_| ApiError::field("from", format!("invalid offset {n:?}")))?,
        None => 0,
    };
    if session.read_from(from).is_none() {
        return Err(ApiError::field("from", "stream offset lost (dropped from the buffer), please restart"));
    }
    Ok(follow(session, from))
}

/// `DELETE /v1/stream?conv_id=ID`: stops and forgets the stream (204 whether or not it was there).
async fn stop(State(s): State<AppState>, Query(q): Query<StreamQuery>) -> Result<StatusCode, ApiError> {
    let id = conv_id(&q)?;
    if !s.streams.stop(id) {
        log::info!("stop for unknown stream {id:?}");
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/streams/lookup` `{"conversation_ids": [...]}`: the streams of
/// those ids only (a caller cannot list ids it does not know).
async fn lookup(State(s): State<AppState>, b: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    #[derive(Deserialize)]
    struct Lookup {
        #[serde(default)]
        conversation_ids: Vec<String>,
    }
    let req: Lookup = crate::protocol::parse(&body(b)?)?;
    let ids: Vec<String> = req.conversation_ids.into_iter().filter(|id| !id.is_empty()).collect();
    let found = s.streams.matching(&ids);
    Ok(Json(Value::Array(
        found
            .iter()
            .map(|s| {
                json!({
                    "conversation_id": s.id,
                    "is_done": s.completed_at().is_some(),
                    "total_bytes": s.total_bytes(),
                    "started_at": s.started_at,
                    "completed_at": s.completed_at().unwrap_or(0),
                })
            })
            .collect(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_buffer_drops_its_oldest_bytes_and_says_so() {
        let s = Session::new("c");
        s.append(&vec![b'a'; MAX_BYTES]);
        s.append(b"bc");
        assert_eq!(s.total_bytes(), MAX_BYTES + 2);
        assert!(s.read_from(0).is_none(), "offset 0 was dropped");
        assert_eq!(s.read_from(MAX_BYTES).map(|(b, _)| b), Some(b"bc".to_vec()));
    }

    #[test]
    fn a_new_stream_under_an_id_cancels_the_old_one() {
        let all = StreamSessions::default();
        let old = all.create("c::m");
        all.create("c::m");
        assert!(old.cancelled() && old.completed_at().is_some());
        assert_eq!(all.matching(&["c".into()]).len(), 1, "the model's variant matches its conversation");
        assert!(all.matching(&["c:".into()]).is_empty());
        assert!(all.stop("c::m") && !all.stop("c::m"));
    }

    #[test]
    fn multi_line_data_is_one_event() {
        assert_eq!(sse_event("a\nb"), "data: a\ndata: b\n\n");
    }
}
