//! The chat page served at `/`, as llama-server serves its web UI: plain
//! HTML, CSS and JavaScript from `server/webui/`, built into the binary and
//! loading nothing from elsewhere (its Content-Security-Policy allows only
//! this server), so it works offline. It streams `/v1/chat/completions` and
//! shades each macro step with the `hamburger` object of every chunk.

use axum::http::header;
use axum::routing::get;
use axum::Router;

use super::state::AppState;

/// What the page may load: only this server's files and API.
const CSP: &str =
    "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's files: path, content type, contents.
const FILES: [(&str, &str, &str); 3] = [
    ("/", "text/html; charset=utf-8", include_str!("../../webui/index.html")),
    ("/webui/app.js", "text/javascript; charset=utf-8", include_str!("../../webui/app.js")),
    ("/webui/style.css", "text/css; charset=utf-8", include_str!("../../webui/style.css")),
];

/// The routes of the page's files (GET), outside the API key's check: the
/// page asks for the key and sends it with its API calls.
pub(super) fn routes() -> Router<AppState> {
    FILES.iter().fold(Router::new(), |router, &(path, content_type, body)| {
        router.route(
            path,
            get(move || async move {
                ([(header::CONTENT_TYPE, content_type), (header::CONTENT_SECURITY_POLICY, CSP)], body)
            }),
        )
    })
}
