//! The integration tests, in one binary: one module per feature, the shared fixtures in
//! `common`. One binary links the crate once, where a binary per file linked it 36 times.
//!
//! All tests share this process, so nothing here may rely on having one to itself:
//! - modules take turns ([`common::turns`]): a test that starts a relay, an agent, a relay
//!   process or an outside client (Claude Code, Codex, OpenClaw, the interop clients,
//!   Chromium) waits while another module's tests hold the turn, so a module's tests run
//!   beside each other and never beside another module's, as when cargo ran their binaries
//!   one after another;
//! - a test that re-runs the binary as a child names itself by its full path
//!   (`store::child_single_writer`, see `store::spawn_child`);
//! - one PostgreSQL cluster serves every module ([`common::postgres::PgCluster::shared`]);
//! - the allocator is `wipe`'s, which scans freed blocks only on a thread that armed it;
//! - `abuse::slowloris_sockets_time_out_and_count_against_their_ip` raises the open-file
//!   limit for the whole process (every relay here then derives larger connection limits from
//!   it; none of the other tests depends on those).
//!
//! Run one module with `cargo test --test it MODULE::`, one test by its name.

mod common;

mod abuse;
mod attachments;
mod claude_code;
mod cli;
mod codex;
mod config_examples;
mod consent;
mod crypto_props;
mod dashboard;
mod delivered;
mod docs;
mod embedded;
mod federation;
mod federation_link;
mod groups;
mod hooks;
mod interop;
mod matrix;
mod mcp;
mod mcp_process;
mod nodes;
mod nodes_crash;
mod openclaw;
mod packages;
mod postgres_tls;
mod presence;
mod receipts;
mod relay;
mod relay_crash;
mod relay_migrate;
mod relay_postgres;
mod reservations;
mod rotation;
mod session;
mod spool_corruption;
mod storage_contract;
mod store;
mod tls;
mod tour;
mod voice;
mod wipe;
