//! Google Cloud's Vertex AI custom-container protocol, as llama-server
//! speaks it: with `AIP_MODE=PREDICTION` the server listens on
//! `AIP_HTTP_PORT` and answers `POST AIP_PREDICT_ROUTE` (default
//! `/predict`) `{"instances": [...]}`: each instance names a route by its
//! `@requestFormat`, a camel-case alias (`chatCompletions`, `completions`,
//! `messages`, ...) or the path itself, is answered by that route (never
//! streamed), and its answer (or error) is one of `predictions`;
//! `AIP_HEALTH_ROUTE` serves `/health` under another path.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderMap, Request};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::state::body;
use super::BODY_LIMIT;
use crate::error::{status, ApiError};

/// Most instances one prediction request may hold (llama-server's).
pub const MAX_INSTANCES: usize = 128;

/// The routes an instance may name (`POST`), in order: an alias names the first with it.
const ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completion",
    "/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/chat/completions/input_tokens",
    "/apply-template",
    "/tokenize",
    "/detokenize",
];

/// Vertex AI's settings, from its environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vertex {
    /// The port to listen on (`AIP_HTTP_PORT`, default 8080).
    pub port: u16,
    /// The prediction route (`AIP_PREDICT_ROUTE`).
    pub predict: String,
    /// Another path of `/health` (`AIP_HEALTH_ROUTE`), if set.
    pub health: Option<String>,
}

impl Vertex {
    /// The settings when `AIP_MODE` is `PREDICTION`, from `var` (the
    /// environment's lookup).
    ///
    /// # Errors
    /// An `AIP_HTTP_PORT` that is not a port, naming it.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Vertex>, String> {
        if var("AIP_MODE").as_deref() != Some("PREDICTION") {
            return Ok(None);
        }
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        let path = |v: String| if v.starts_with('/') { v } else { format!("/{v}") };
        let port = match set("AIP_HTTP_PORT") {
            Some(p) => p.parse().map_err(|_| format!("AIP_HTTP_PORT: '{p}' is not a port number"))?,
            None => 8080,
        };
        let predict = set("AIP_PREDICT_ROUTE").map_or_else(|| "/predict".to_string(), path);
        Ok(Some(Vertex { port, predict, health: set("AIP_HEALTH_ROUTE").map(path) }))
    }
}

/// llama-server's camel-case alias of a route (`/v1/chat/completions`: `chatCompletions`).
fn alias(route: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in route.strip_prefix("/v1").unwrap_or(route).trim_start_matches('/').chars() {
        if matches!(c, '/' | '-' | '_') {
            upper = true;
        } else {
            out.push(if upper { c.to_ascii_uppercase() } else { c });
            upper = false;
        }
    }
    out
}

/// `app` with the prediction route (and the health alias) added.
pub fn wrap(app: Router, v: &Vertex) -> Router {
    let mut aliases = HashMap::new();
    for route in ROUTES {
        aliases.entry(alias(route)).or_insert(*route);
    }
    let aliases = Arc::new(aliases);
    let inner = app.clone();
    let mut app = app.route(
        &v.predict,
        post(move |headers: HeaderMap, b: Result<Bytes, BytesRejection>| {
            predict(inner.clone(), aliases.clone(), headers, b)
        }),
    );
    if let Some(health) = &v.health {
        let inner = app.clone();
        app = app.route(health, get(move || forward(inner.clone(), "GET", "/health", HeaderMap::new(), Vec::new())));
    }
    app
}

/// `app`'s answer to `method path` with `body` (the client's key and origin headers kept).
async fn forward(app: Router, method: &str, path: &str, headers: HeaderMap, body: Vec<u8>) -> axum::response::Response {
    let mut req = Request::builder().method(method).uri(path).header(header::CONTENT_TYPE, "application/json");
    for name in [header::AUTHORIZATION, header::HeaderName::from_static("x-api-key")] {
        if let Some(v) = headers.get(&name) {
            req = req.header(name, v);
        }
    }
    let req = req.body(Body::from(body)).expect("a request of valid parts");
    match app.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// `POST /predict`: each instance answered by the route it names, in order.
async fn predict(
    app: Router,
    aliases: Arc<HashMap<String, &'static str>>,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body: Value =
        serde_json::from_slice(&body(b)?).map_err(|e| ApiError::field("body", format!("invalid JSON body: {e}")))?;
    let instances = body
        .get("instances")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::field("instances", "the body must hold an array field named instances"))?;
    if instances.len() > MAX_INSTANCES {
        return Err(ApiError::field(
            "instances",
            format!("instances holds {} entries, more than {MAX_INSTANCES}", instances.len()),
        ));
    }
    let error = |message: String| ApiError::field("instances", message).body();
    let tasks: Vec<_> = instances
        .iter()
        .map(|instance| {
            let (app, headers) = (app.clone(), headers.clone());
            let mut payload = instance.clone();
            let route = match payload.get("@requestFormat").and_then(Value::as_str) {
                _ if !instance.is_object() => Err(error("each instance must be a JSON object".into())),
                None => Err(error("each instance must include a string @requestFormat".into())),
                Some(f) => aliases
                    .get(f)
                    .copied()
                    .or_else(|| ROUTES.iter().copied().find(|r| *r == f))
                    .ok_or_else(|| error(format!("no route for @requestFormat: {f}"))),
            };
            if let Some(obj) = payload.as_object_mut() {
                obj.remove("@requestFormat");
                obj.insert("stream".into(), json!(false));
            }
            tokio::spawn(async move {
                let route = route?;
                let response = forward(app, "POST", route, headers, payload.to_string().into_bytes()).await;
                let bytes = to_bytes(response.into_body(), BODY_LIMIT * 16).await.unwrap_or_default();
                Ok::<_, Value>(
                    serde_json::from_slice(&bytes).unwrap_or_else(|_| json!(String::from_utf8_lossy(&bytes))),
                )
            })
        })
        .collect();
    let mut predictions = Vec::with_capacity(tasks.len());
    for task in tasks {
        let answer =
            task.await.map_err(|e| ApiError::new(status::INTERNAL, format!("an instance's task failed: {e}")))?;
        predictions.push(answer.unwrap_or_else(|e| e));
    }
    Ok(Json(json!({"predictions": predictions})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_llama_servers() {
        assert_eq!(alias("/v1/chat/completions"), "chatCompletions");
        assert_eq!(alias("/apply-template"), "applyTemplate");
        assert_eq!(alias("/v1/messages/count_tokens"), "messagesCountTokens");
    }

    #[test]
    fn the_settings_come_from_aip_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(Vertex::from_env(env(&[])), Ok(None));
        let v = Vertex::from_env(env(&[
            ("AIP_MODE", "PREDICTION"),
            ("AIP_PREDICT_ROUTE", "go"),
            ("AIP_HTTP_PORT", "9000"),
        ]));
        assert_eq!(v, Ok(Some(Vertex { port: 9000, predict: "/go".into(), health: None })));
        let bad = Vertex::from_env(env(&[("AIP_MODE", "PREDICTION"), ("AIP_HTTP_PORT", "x")]));
        assert!(bad.unwrap_err().starts_with("AIP_HTTP_PORT"));
    }
}
