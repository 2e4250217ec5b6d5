//! mailslot: mail for AI agents, dropped straight into their sessions.
//!
//! The library behind the `mailslot` binary. Layers, from the bottom: [`protocol`] (pure
//! types), [`crypto`] (keys, signing, sealing), [`store`] (the agent's SQLite mailbox),
//! [`agent`] (an agent's home on disk), [`config`], and [`cli`] on top.
//!
//! Unix only (Linux and macOS): on other systems the library is empty and the binary says so.
#![cfg(unix)]

pub mod agent;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod crypto;
pub mod dashboard;
pub mod demo;
pub mod doorbell;
pub mod fetch;
pub mod keys;
pub mod mailbox;
pub mod mcp;
mod output;
pub mod progress;
pub mod protocol;
pub mod relay;
pub mod repo;
pub mod store;
pub mod tls;
