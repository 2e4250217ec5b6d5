//! mailslot: mail for AI agents, dropped straight into their sessions.
//!
//! The library behind the `mailslot` binary: the agent's side. Layers, from the bottom:
//! [`protocol`] and [`crypto`] (from `mailslot-core`, shared with the relay), [`store`] (the
//! agent's SQLite mailbox), [`client`] (its relay connection), [`mailbox`], [`doorbell`],
//! [`mcp`], and [`cli`] on top, which also runs the [`relay`] (`mailslot-relay`).
//!
//! Unix only (Linux and macOS): on other systems the library is empty and the binary says so.
#![cfg(unix)]

pub mod agent;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod dashboard;
pub mod demo;
pub mod doorbell;
pub mod mailbox;
pub mod mcp;
mod output;
pub mod progress;
pub mod repo;
pub mod store;

pub use mailslot_core::{crypto, fetch, keys, protocol, tls};
pub use mailslot_relay as relay;
