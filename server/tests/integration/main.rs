//! The server crate over real loopback HTTP, one test binary (`cargo test -p
//! hamburger-server --test integration`): `common` is the harness every module
//! shares; the others are one concern each, named in their opening comments.

mod choices;
mod common;
mod draft_model;
mod http;
mod openai_client;
mod pool;
mod structured;
mod tools;
