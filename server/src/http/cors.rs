//! Cross-origin requests as llama-server answers them: every response to an
//! allowed `Origin` carries it back with credentials allowed, and a
//! preflight (`OPTIONS`, any path, no API key needed) is answered 200 with
//! the methods and headers allowed. By default every origin is allowed
//! (llama-server's default); `--cors-origins` names those allowed, where
//! `localhost` stands for the loopback hosts on any port.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::state::AppState;

/// Which origins may call the API from a browser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cors {
    /// Any origin (llama-server's default).
    Any,
    /// These origins: exact, or `localhost` for `http(s)://localhost`,
    /// `127.0.0.1` and `[::1]` on any port.
    Origins(Vec<String>),
}

impl Cors {
    /// `--cors-origins`' comma-separated list (`*`: any).
    pub fn of_list(list: &str) -> Cors {
        let origins: Vec<String> = list.split(',').map(str::trim).filter(|o| !o.is_empty()).map(String::from).collect();
        if origins.iter().any(|o| o == "*") {
            Cors::Any
        } else {
            Cors::Origins(origins)
        }
    }

    /// Whether `origin` may call the API.
    fn allows(&self, origin: &str) -> bool {
        match self {
            Cors::Any => true,
            Cors::Origins(list) => list.iter().any(|o| o == origin || (o == "localhost" && is_loopback(origin))),
        }
    }
}

/// `http(s)://` then localhost, 127.0.0.1 or [::1], then a port or nothing.
fn is_loopback(origin: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else {
        return false;
    };
    ["localhost", "127.0.0.1", "[::1]"].iter().any(|host| {
        rest.strip_prefix(host).is_some_and(|port| {
            port.is_empty()
                || port.strip_prefix(':').is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// The request's `Origin` when the policy allows it.
fn allowed_origin(s: &AppState, headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get(header::ORIGIN)?;
    s.cors.allows(origin.to_str().ok()?).then(|| origin.clone())
}

/// The middleware: answers preflights, marks responses to allowed origins.
pub(super) async fn layer(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let origin = allowed_origin(&s, req.headers());
    let mut response = if req.method() == Method::OPTIONS {
        let mut r = StatusCode::OK.into_response();
        if origin.is_some() {
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("*"));
        }
        r
    } else {
        next.run(req).await
    };
    if let Some(origin) = origin {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_stands_for_the_loopback_hosts_on_any_port() {
        let cors = Cors::of_list("localhost, https://app.example");
        for origin in [
            "http://localhost",
            "http://localhost:8080",
            "http://127.0.0.1:3000",
            "http://[::1]",
            "https://app.example",
        ] {
            assert!(cors.allows(origin), "{origin}");
        }
        for origin in ["http://evil.com", "http://notlocalhost", "http://localhost.evil.com", "http://localhost:"] {
            assert!(!cors.allows(origin), "{origin}");
        }
        assert_eq!(Cors::of_list("*"), Cors::Any);
    }
}
