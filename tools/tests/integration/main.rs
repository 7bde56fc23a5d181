//! The binaries as users run them, one test binary (`cargo test -p
//! hamburger-tools --test integration`): each module is one tool or concern,
//! named in its own opening comment; one binary links the tools once.

mod adapters;
mod average_heads;
mod bad_input;
mod cli;
mod convert;
mod device_check;
mod draft;
mod draft_copy;
mod draft_head;
mod draft_vocab;
mod eval;
mod gpu;
mod graft_head;
mod help;
mod quantize;
mod reproducible;
mod rpc;
mod server;
mod train;
mod window;
