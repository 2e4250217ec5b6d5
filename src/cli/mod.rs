//! The owner's command line: argument types (clap) and dispatch to one module per family.
//! Every command is thin: it opens the agent and calls the library.

mod archive;
mod body;
mod consent;
mod dashboard;
mod directory;
mod doctor;
mod groups;
mod guard;
mod help;
mod hook;
mod identity;
mod keys;
mod local_relay;
mod logging;
mod mail;
mod mcp;
mod memory;
mod owner;
mod peers;
mod reach;
mod relay;
mod relay_db;
mod relay_pins;
mod reservations;
mod send;
mod tell;
mod wait;

use crate::output;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::agent::Agent;
use crate::bench::BenchCommand;
use crate::client::RelayUrl;
use crate::client::consent::Change;
use crate::client::groups::Roster;
use crate::config::{self, Config, Paths};
use crate::protocol::{
    Address, AgentName, Fingerprint, GroupPolicy, Importance, InviteToken, Peer, Policy, RelayName,
    RequestCode,
};
use crate::store::{IdPart, SentState};

pub use help::{command, parse};

/// Mail for AI agents, dropped straight into their sessions.
#[derive(Debug, Parser)]
#[command(
    name = "mailslot",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    /// The agent to act as [default: the config's default_agent, else this folder's name]
    #[arg(long, global = true, help_heading = "Global options", env = config::ENV_AGENT, value_name = "NAME")]
    pub agent: Option<AgentName>,
    /// Where agents' keys and stores live [default: the platform data folder]
    #[arg(long, global = true, help_heading = "Global options", env = config::ENV_HOME, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// The config file [default: config.toml in --home, else the platform config folder]
    #[arg(long, global = true, help_heading = "Global options", env = config::ENV_CONFIG, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The relay, like wss://relay.example.com or ws://10.0.0.5:7878 [default: the config's relay, else ws://127.0.0.1:7878]
    #[arg(long, global = true, help_heading = "Global options", env = config::ENV_RELAY, value_name = "URL")]
    pub relay: Option<RelayUrl>,
    /// Print JSON instead of text
    #[arg(long, global = true, help_heading = "Global options")]
    pub json: bool,
    /// Log more on stderr, one level per -v (a command logs only errors, `mcp` and `dashboard`
    /// warnings, `relay` what it does); MAILSLOT_LOG or RUST_LOG set the filter instead
    #[arg(short, long, global = true, help_heading = "Global options", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the agent's keys and store and register its name with the relay (`register` and
    /// `mcp` also create it on first use)
    #[command(
        after_help = "Examples:\n  mailslot --agent alice init\n  mailslot --agent alice --relay wss://relay.example.com init\n  mailslot --agent scratch init --offline"
    )]
    Init {
        /// Only make the keys and store; register later with `register`
        #[arg(long)]
        offline: bool,
    },
    /// Give up the agent's name on the relay (interactive: asks you to type the name)
    Retire,
    /// Make new keys for the agent, signed by the old ones, register them with the relay and
    /// announce them to every peer whose keys it pinned (they re-pin on the signature)
    #[command(name = "rotate-keys")]
    RotateKeys,
    /// Register the agent's name with the relay now (a relay with closed registration needs
    /// an invite from its operator)
    Register {
        /// The invite (single use)
        #[arg(
            long,
            value_name = "TOKEN",
            env = "MAILSLOT_INVITE",
            hide_env_values = true
        )]
        invite: Option<InviteToken>,
    },
    /// Show who the agent is; --set changes its identity text
    Whoami {
        /// New identity text ("" clears it)
        #[arg(long, value_name = "TEXT")]
        set: Option<String>,
    },
    /// Show what the agent is doing; --set changes its current task
    Doing {
        /// New current task ("" clears it)
        #[arg(long, value_name = "TEXT")]
        set: Option<String>,
    },
    /// Store a memory (text from the argument, or stdin when it is absent or "-")
    #[command(
        after_help = "Examples:\n  mailslot remember --title \"relay port\" --tag ops \"The team relay listens on 7878\"\n  echo \"Standup moved to 09:30\" | mailslot remember"
    )]
    Remember {
        /// A short title [default: the text's first line]
        #[arg(long, value_name = "TITLE")]
        title: Option<String>,
        /// A tag (repeatable)
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// The text
        text: Option<String>,
    },
    /// Find memories by relevance and recency; without a query, the most recent
    Recall {
        /// Words to look for
        query: Option<String>,
        /// At most this many
        #[arg(long, default_value_t = memory::DEFAULT_RECALL_LIMIT, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Without a query: the memories after this one (the last a page listed)
        #[arg(long, value_name = "ID", value_parser = memory_id_part, conflicts_with = "query")]
        before: Option<IdPart>,
    },
    /// Delete a memory
    Forget {
        /// The memory's id, or its first or last characters when they name one memory
        #[arg(value_parser = memory_id_part)]
        id: IdPart,
    },
    /// List received mail, unread first
    #[command(
        after_help = "Examples:\n  mailslot inbox\n  mailslot inbox --all --limit 200\n  mailslot --json inbox | jq -r '.[].subject'"
    )]
    Inbox {
        /// Include mail already read (all of it newest first, unread marked *)
        #[arg(long)]
        all: bool,
        /// At most this many
        #[arg(long, default_value_t = mail::DEFAULT_LIMIT, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Only mail of at least this importance: high lists high and urgent, urgent only urgent
        #[arg(long, value_name = "LEVEL")]
        importance: Option<Importance>,
        /// The next page: the messages after this one (the last a page listed)
        #[arg(long, value_name = "ID")]
        before: Option<IdPart>,
    },
    /// Show a message and mark it read
    Read {
        /// The message's id, or its first or last characters when they name one message
        id: IdPart,
        /// Write its attachments into this folder, under their names (an existing file is
        /// never replaced)
        #[arg(long, value_name = "DIR")]
        save: Option<PathBuf>,
    },
    /// Show a message's whole thread, sent and received, oldest first
    Thread {
        /// A message of the thread: its id, or its first or last characters
        id: IdPart,
    },
    /// Mark messages read without showing them
    MarkRead {
        /// The messages: ids, or their first or last characters
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<IdPart>,
        /// Every unread message
        #[arg(long)]
        all: bool,
    },
    /// List sent mail, newest first, with where each stands (per recipient too): queued,
    /// sent, delivered, read, acknowledged, failed or bounced
    Sent {
        /// Only messages in this state: queued, sent, delivered, read, acknowledged, failed or
        /// bounced (a message stands where its least advanced copy does)
        #[arg(long, value_name = "STATE")]
        state: Option<SentState>,
        /// At most this many
        #[arg(long, default_value_t = mail::DEFAULT_LIMIT, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// The next page: the messages after this one (the last a page listed)
        #[arg(long, value_name = "ID")]
        before: Option<IdPart>,
    },
    /// Queue failed messages again and send the outbox
    Retry {
        /// The failed messages: ids, or their first or last characters
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        ids: Vec<IdPart>,
        /// Every failed message
        #[arg(long)]
        all_failed: bool,
    },
    /// Search mail by words in the subject, body or sender
    #[command(
        after_help = "Examples:\n  mailslot search \"deploy window\"\n  mailslot search alice --limit 5"
    )]
    Search {
        /// Words to look for
        query: String,
        /// At most this many
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// Show the agent's identity, store and counts
    Status,
    /// Check what the agent needs and say how to fix what fails: the config, the owner key, its
    /// keys and store, its relay and the other relays it met, and how Claude Code and OpenClaw
    /// reach it
    Doctor,
    /// Send a message (queued first, so nothing is lost when the relay is down)
    #[command(
        after_help = "Examples:\n  mailslot send --to bob --subject \"deploy window\" --body \"Friday 10:00?\"\n  mailslot send --to bob --cc carol --subject \"notes\" --body-file notes.md\n  mailslot send --to bob --subject \"logs\" --body \"see attached\" --attach build.log --attach trace.json\n  git log -5 | mailslot send --to bob --subject \"what landed\"\n  mailslot send --to bob@relay.example.com --subject \"hi\" --body \"…\" --data '{\"pr\": 42}'"
    )]
    Send {
        /// A recipient (repeatable)
        #[arg(long, required = true, value_name = "ADDR")]
        to: Vec<Address>,
        /// A copied recipient (repeatable)
        #[arg(long, value_name = "ADDR")]
        cc: Vec<Address>,
        /// A blind-copied recipient (repeatable); no one learns the others
        #[arg(long, value_name = "ADDR")]
        bcc: Vec<Address>,
        /// One line
        #[arg(long)]
        subject: String,
        /// The body [default: stdin]
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        /// Read the body from a file
        #[arg(long, value_name = "FILE")]
        body_file: Option<PathBuf>,
        /// Structured payload (JSON)
        #[arg(long, value_name = "JSON")]
        data: Option<String>,
        /// normal (default), high or urgent: shown to the recipients
        #[arg(long, value_name = "LEVEL")]
        importance: Option<Importance>,
        /// Ask the recipients to acknowledge it (`sent` shows who did)
        #[arg(long)]
        ack_required: bool,
        /// Attach a file (repeatable; at most 8, 8 MiB per file and per message)
        #[arg(long, value_name = "FILE")]
        attach: Vec<PathBuf>,
    },
    /// Reply to a message, in its thread
    #[command(
        after_help = "Examples:\n  mailslot reply 01a2 --body \"Works for me\"        # an id prefix is enough when unique\n  mailslot reply 01a2 --all --body-file answer.md"
    )]
    Reply {
        /// The message's id, or its first or last characters when they name one message
        id: IdPart,
        /// Reply to the sender and every other recipient (never BCC)
        #[arg(long)]
        all: bool,
        /// The body [default: stdin]
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        /// Read the body from a file
        #[arg(long, value_name = "FILE")]
        body_file: Option<PathBuf>,
        /// normal (default), high or urgent: shown to the recipients
        #[arg(long, value_name = "LEVEL")]
        importance: Option<Importance>,
        /// Ask the recipients to acknowledge it (`sent` shows who did)
        #[arg(long)]
        ack_required: bool,
        /// Attach a file (repeatable; at most 8, 8 MiB per file and per message)
        #[arg(long, value_name = "FILE")]
        attach: Vec<PathBuf>,
    },
    /// Acknowledge a received message to its sender (a signed receipt, once per message)
    #[command(
        after_help = "Examples:\n  mailslot acknowledge 01a2\n  mailslot acknowledge 01a2 --answer \"on it, done by Friday\""
    )]
    Acknowledge {
        /// The message's id, or its first or last characters when they name one message
        id: IdPart,
        /// A short answer for the sender (at most 500 characters)
        #[arg(long, value_name = "TEXT")]
        answer: Option<String>,
    },
    /// Show or set whether this agent tells senders when it read their mail (off by default)
    #[command(
        after_help = "Examples:\n  mailslot --agent bob read-receipts        # shows the setting\n  mailslot --agent bob read-receipts on"
    )]
    ReadReceipts {
        /// on or off; without it, the setting is shown
        #[arg(value_name = "on|off", value_parser = ["on", "off"])]
        set: Option<String>,
    },
    /// Write to your own agent as its owner (signed with the owner key; needs a terminal)
    #[command(
        after_help = "Examples:\n  mailslot --agent bob tell \"Stop the deploy and tell me why it failed.\"\n  mailslot --agent bob tell --subject \"review\" --body-file notes.md\n  git diff | mailslot --agent bob tell --subject \"look at this diff\""
    )]
    Tell {
        /// The message [default: stdin]
        #[arg(value_name = "TEXT", conflicts_with = "body_file")]
        body: Option<String>,
        /// Read the message from a file
        #[arg(long, value_name = "FILE")]
        body_file: Option<PathBuf>,
        /// One line [default: the message's first line]
        #[arg(long)]
        subject: Option<String>,
    },
    /// Send the outbox and fetch new mail from the relay, then exit
    Sync,
    /// Wait for mail: print it (marked read) and exit 0, or exit 3 when none came in time
    #[command(
        after_help = "Examples:\n  mailslot wait --timeout 300 && echo \"mail came\"\n  until mailslot wait --timeout 60; do :; done"
    )]
    Wait {
        /// Seconds to wait
        #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
        timeout: u64,
    },
    /// Ask another agent's owner to accept mail from this agent (prints a code for them)
    #[command(
        after_help = "Examples:\n  mailslot --agent alice connect bob --note \"we share the deploy work\""
    )]
    Connect {
        /// The agent to ask: NAME on this relay, NAME@HOST on another
        #[arg(value_name = "AGENT")]
        peer: Address,
        /// Why, for its owner
        #[arg(long, default_value = "")]
        note: String,
    },
    /// List open contact requests, to and from this agent
    Requests,
    /// Approve a contact request (interactive: needs a person at a terminal)
    #[command(
        after_help = "Examples:\n  mailslot --agent bob requests\n  mailslot --agent bob approve 7KQF-3MZA\n  mailslot --agent bob approve 7KQF-3MZA --from alice"
    )]
    Approve {
        /// The code the requester's owner gave you
        code: RequestCode,
        /// The requester, when several requests are open
        #[arg(long, value_name = "NAME")]
        from: Option<Address>,
    },
    /// Deny a contact request
    Deny {
        /// The requester
        #[arg(value_name = "AGENT")]
        peer: Address,
    },
    /// Refuse all mail and requests from an agent
    Block {
        /// The agent (NAME, NAME@HOST), or every agent of a relay (*@HOST)
        #[arg(value_name = "AGENT")]
        peer: Peer,
    },
    /// Lift a block
    Unblock {
        /// The agent (NAME, NAME@HOST), or a relay (*@HOST)
        #[arg(value_name = "AGENT")]
        peer: Peer,
    },
    /// End a contact, both ways
    Uncontact {
        /// The contact
        #[arg(value_name = "AGENT")]
        peer: Address,
    },
    /// Show contacts, blocks and the policy; `contacts trust` accepts a peer's changed keys
    Contacts {
        /// Accept keys a peer presented that its pinned keys did not sign
        #[command(subcommand)]
        action: Option<ContactsCommand>,
    },
    /// Look up an agent's keys and pin them, showing the fingerprint to compare with its
    /// owner; NAME@HOST is looked up at the relay HOST, checked against that relay's key
    Keys {
        /// NAME (on your relay) or NAME@HOST[:PORT] (on the relay HOST)
        #[arg(value_name = "ADDRESS")]
        address: Address,
    },
    /// Accept another relay's new key, once its operator confirmed the fingerprint
    #[command(name = "trust-relay")]
    TrustRelay {
        /// The relay, as in addresses: HOST[:PORT]
        #[arg(value_name = "HOST")]
        host: RelayName,
        /// The fingerprint its operator confirmed (the relay must present exactly this key)
        #[arg(long, value_name = "FINGERPRINT", value_parser = parse_fingerprint)]
        fingerprint: Fingerprint,
    },
    /// The owner key that signs consent changes: `owner init` makes it (asks for a passphrase)
    #[command(subcommand)]
    Owner(OwnerCommand),
    /// Groups: list this agent's (and the ones its model asked to join); create, members,
    /// and the owner's add, remove and join (asks for the owner passphrase at a terminal)
    Groups {
        /// What to do; nothing lists the groups
        #[command(subcommand)]
        action: Option<GroupsCommand>,
    },
    /// List the relay's directory of agents that opted in, or join or leave it
    Directory {
        /// List this agent with a one-line description
        #[arg(long, value_name = "DESCRIPTION", conflicts_with = "leave")]
        join: Option<String>,
        /// Take this agent out of the directory
        #[arg(long)]
        leave: bool,
    },
    /// Who is online now, and since when, among this agent's contacts and the listed agents
    Presence {
        /// Only these agents (at most 100); none: everyone this agent may see
        #[arg(value_name = "AGENT")]
        agents: Vec<AgentName>,
    },
    /// One agent in one answer: fingerprint, contact status, directory listing, presence;
    /// pins nothing. NAME@HOST is looked up at the relay HOST
    Whois {
        /// NAME (on your relay) or NAME@HOST[:PORT] (on the relay HOST)
        #[arg(value_name = "ADDRESS")]
        address: Address,
    },
    /// Reserve files in this repository for this agent, so other agents keep off them;
    /// exits 3 when other agents hold them (each is told you wait)
    #[command(
        after_help = "Examples:\n  mailslot reserve 'src/relay/**' --reason \"refactoring the relay\"\n  mailslot reserve docs/cli.md --shared --ttl 30m --reason \"reading the CLI docs\""
    )]
    Reserve {
        /// Repository-relative paths or globs (`src/**/*.rs`; a folder holds what is under it)
        #[arg(value_name = "PATTERN", required = true)]
        patterns: Vec<crate::protocol::Pattern>,
        /// Why, in one line; the other agents see it
        #[arg(long)]
        reason: String,
        /// Others may hold the files too, unless exclusively [default: exclusive]
        #[arg(long)]
        shared: bool,
        /// How long, like 30m or 2h (1 min to 24 h on most relays); renew to keep it longer
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: crate::protocol::Ttl,
        /// The project [default: `git config mailslot.project`, else the repository's root commit]
        #[arg(long, value_name = "NAME")]
        project: Option<crate::protocol::ProjectName>,
    },
    /// Release this agent's reservations: by id, by pattern as reserved, or --all
    Release {
        /// Reservation ids, or patterns exactly as reserved
        #[arg(value_name = "ID|PATTERN")]
        targets: Vec<String>,
        /// Every one of this agent's in the project
        #[arg(long)]
        all: bool,
        /// The project [default: the repository's]
        #[arg(long, value_name = "NAME")]
        project: Option<crate::protocol::ProjectName>,
    },
    /// Give this agent's reservations (those named, else all) a new TTL from now
    Renew {
        /// Reservation ids [default: all of this agent's in the project]
        #[arg(value_name = "ID")]
        ids: Vec<crate::protocol::ReservationId>,
        /// How long from now, like 30m or 2h
        #[arg(long, default_value = "1h", value_parser = parse_ttl)]
        ttl: crate::protocol::Ttl,
        /// The project [default: the repository's]
        #[arg(long, value_name = "NAME")]
        project: Option<crate::protocol::ProjectName>,
    },
    /// Who holds which files in this repository's project, until when and why
    Reservations {
        /// The project [default: the repository's]
        #[arg(long, value_name = "NAME")]
        project: Option<crate::protocol::ProjectName>,
    },
    /// The git pre-commit hook that refuses commits touching files another agent holds
    /// exclusively
    #[command(subcommand)]
    Guard(GuardCommand),
    /// Set whom this agent accepts mail from: open, contacts or closed
    Policy {
        /// open, contacts or closed
        policy: Policy,
    },
    /// Serve this agent's mailbox to an LLM client (MCP over stdio)
    #[command(
        after_help = "Examples:\n  claude mcp add mailslot -- mailslot --agent reviewer mcp\n  mailslot --agent reviewer mcp --http 127.0.0.1:8787\n  mailslot --agent reviewer mcp --print-token   # the HTTP client's bearer token"
    )]
    Mcp {
        /// Serve Streamable HTTP on this loopback address instead, like 127.0.0.1:8787; every
        /// request needs the agent's bearer token (see --print-token)
        #[arg(long, value_name = "ADDR")]
        http: Option<std::net::SocketAddr>,
        /// Print the agent's bearer token for MCP over HTTP (made on first use, kept in the
        /// agent's folder as mcp-http.token) and exit; put it in the client's config, never on a
        /// command line
        #[arg(long, conflicts_with_all = ["http", "max_sessions", "session_idle_secs"])]
        print_token: bool,
        /// With --http: the most sessions served at once
        #[arg(long, value_name = "N", default_value_t = crate::mcp::SessionLimits::DEFAULT.max, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000), requires = "http")]
        max_sessions: usize,
        /// With --http: a session without a request or message for this many seconds ends
        #[arg(long, value_name = "SECS", default_value_t = crate::mcp::SessionLimits::DEFAULT.idle.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400), requires = "http")]
        session_idle_secs: u64,
    },
    /// Claude Code hooks: the digest of mail the session has not seen (session-start, prompt, post-tool), keep working on it (stop), or wake an idle session (wake, in an asyncRewake entry)
    Hook {
        /// Which hook
        #[arg(value_enum)]
        kind: hook::HookKind,
    },
    /// The owner's web UI on loopback: agents, mail, contacts and requests, memories, the
    /// relay; opened with a secret URL printed here
    Dashboard {
        /// Where to listen; anything but loopback is reachable from other machines
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
        /// Print the URL only; do not start a browser
        #[arg(long)]
        no_open: bool,
    },
    /// See it work: a relay and two MCP servers in a temp folder, a message, its doorbell and a reply
    Demo,
    /// Run a relay in the foreground, or manage one: this home's background relay, invites, a
    /// stopped relay's database (`mailslot help relay` lists them)
    Relay(relay::RelayArgs),
    /// Measure the store, the crypto, a relay and the MCP server on this machine (percentiles,
    /// never pass or fail)
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write the agent (its keys and mail) to one file sealed under a passphrase
    #[command(after_help = "Examples:
  mailslot --agent alice export                       # alice.mailslot, asks for a passphrase twice
  mailslot --agent alice export --out /backup/alice.mailslot --passphrase-file ~/.mailslot-backup-pass")]
    Export {
        /// The file to write [default: NAME.mailslot in this folder]
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Read the passphrase from this file's first line instead of the terminal
        #[arg(long, value_name = "FILE")]
        passphrase_file: Option<PathBuf>,
    },
    /// Make the agent in an export here (refuses an existing agent unless --replace)
    #[command(after_help = "Examples:
  mailslot import alice.mailslot
  mailslot import alice.mailslot --replace            # the old folder is kept beside it")]
    Import {
        /// The export
        file: PathBuf,
        /// Replace an agent of the same name (its folder is moved aside, not deleted)
        #[arg(long)]
        replace: bool,
        /// Read the passphrase from this file's first line instead of the terminal
        #[arg(long, value_name = "FILE")]
        passphrase_file: Option<PathBuf>,
    },
    /// Print a shell's completion script
    #[command(after_help = "Examples:
  mailslot completions bash > ~/.local/share/bash-completion/completions/mailslot
  mailslot completions zsh > ~/.zfunc/_mailslot      # with fpath+=~/.zfunc before compinit
  mailslot completions fish > ~/.config/fish/completions/mailslot.fish")]
    Completions {
        /// bash, zsh, fish, elvish or powershell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), or write one page per command into a folder
    #[command(after_help = "Examples:
  mailslot man | man -l -
  mailslot man --dir ~/.local/share/man/man1")]
    Man {
        /// Write mailslot.1 and mailslot-COMMAND.1 pages into this folder instead
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// `contacts` subcommands.
#[derive(Debug, Subcommand)]
pub enum ContactsCommand {
    /// Pin the keys a peer presented after a change its old keys did not sign, once its owner
    /// confirmed the fingerprint (asks for the owner passphrase at a terminal)
    Trust {
        /// The peer, as its mail names it
        #[arg(value_name = "ADDRESS")]
        address: Address,
        /// The fingerprint its owner confirmed (one the peer presented)
        #[arg(long, value_name = "FINGERPRINT", value_parser = parse_fingerprint)]
        fingerprint: Fingerprint,
    },
}

/// `mailslot guard`'s commands.
#[derive(Debug, Subcommand)]
pub enum GuardCommand {
    /// Write the repository's pre-commit hook (where `core.hooksPath` says, if set); a
    /// different existing hook is kept unless --force
    Install {
        /// Replace another pre-commit hook (kept as pre-commit.before-mailslot)
        #[arg(long)]
        force: bool,
    },
    /// What the hook runs: exit 1 if a staged path is held exclusively by another agent
    /// (override once: git commit --no-verify, or MAILSLOT_GUARD=off); a relay out of reach
    /// lets the commit through with a warning
    Check {
        /// The project [default: the repository's]
        #[arg(long, value_name = "NAME")]
        project: Option<crate::protocol::ProjectName>,
    },
}

/// `groups` subcommands.
#[derive(Debug, Subcommand)]
pub enum GroupsCommand {
    /// Make a group on this agent's relay, owned by this home's owner key, with this agent as
    /// its first member
    Create {
        /// Its name (agents and groups share one namespace on a relay)
        #[arg(value_name = "GROUP")]
        group: AgentName,
        /// Who may post: members (default), owner (agents with this owner key) or anyone
        #[arg(long, default_value = "members", value_parser = parse_group_policy)]
        policy: GroupPolicy,
    },
    /// Put an agent on a group's roster (the group's owner; asks for the passphrase)
    Add {
        /// The group, on this agent's relay
        #[arg(value_name = "GROUP")]
        group: AgentName,
        /// NAME on this relay, or NAME@HOST on another
        #[arg(value_name = "MEMBER")]
        member: Address,
    },
    /// Take an agent off a group's roster (the group's owner; asks for the passphrase)
    Remove {
        /// The group, on this agent's relay
        #[arg(value_name = "GROUP")]
        group: AgentName,
        /// The member, as the roster lists it
        #[arg(value_name = "MEMBER")]
        member: Address,
    },
    /// Accept a group's mail for this agent (its owner's decision; asks for the passphrase)
    Join {
        /// GROUP on this relay, or GROUP@HOST on another
        #[arg(value_name = "GROUP")]
        group: Address,
    },
    /// Leave a group: its mail stops (an agent may always leave)
    Leave {
        /// GROUP on this relay, or GROUP@HOST on another
        #[arg(value_name = "GROUP")]
        group: Address,
    },
    /// Show a group's owner, policy and members
    Members {
        /// The group, on this agent's relay
        #[arg(value_name = "GROUP")]
        group: AgentName,
    },
    /// List this agent's groups (as `groups` alone)
    List,
}

fn parse_group_policy(s: &str) -> Result<GroupPolicy, String> {
    s.parse()
        .map_err(|e: crate::protocol::ValidationError| e.to_string())
}

/// The owner key's commands.
#[derive(Debug, Subcommand)]
pub enum OwnerCommand {
    /// Make the owner key, sealed under a passphrase you type, and register it for this
    /// home's agents (once, before agents get a shell)
    Init,
    /// Replace the owner key and its passphrase (asks for the current one), for every agent
    /// of this home
    Change,
    /// Make an owner key file you put in place of this home's confirmed one its owner key
    /// (asks the passphrases of both), for every agent of this home
    Confirm,
}

/// A memory's id or its start or end, with an error that speaks of memories.
fn memory_id_part(s: &str) -> Result<IdPart, String> {
    s.parse().map_err(|_| {
        format!(
            "{s:?} is not part of a memory id: give its first or last {} to 36 characters (hex digits and dashes), as `recall` prints it",
            crate::store::MIN_ID_PART
        )
    })
}

fn parse_fingerprint(s: &str) -> Result<Fingerprint, String> {
    Fingerprint::parse(s).map_err(|e| e.to_string())
}

fn parse_ttl(s: &str) -> Result<crate::protocol::Ttl, String> {
    crate::protocol::Ttl::parse(s).map_err(|e| e.to_string())
}

/// What every command needs: where things are, the config, the output mode.
pub(crate) struct Ctx {
    paths: Paths,
    config: Config,
    agent: Option<AgentName>,
    relay: Option<RelayUrl>,
    json: bool,
}

impl Ctx {
    /// The chosen agent's name, without opening it.
    fn agent_name(&self) -> anyhow::Result<AgentName> {
        let cwd = std::env::current_dir()?;
        Ok(config::resolve_agent(
            self.agent.clone(),
            &self.config,
            &cwd,
        )?)
    }

    /// Opens the chosen agent, which must exist: only `init`, `register` and `mcp` make one,
    /// so a typo in `--agent`, or a folder's name, never makes a stray agent.
    fn open_agent(&self) -> anyhow::Result<Agent> {
        let name = self.agent_name()?;
        if !self.paths.agent_dir(&name).exists() {
            anyhow::bail!(self.unknown_agent(&name)?);
        }
        Ok(Agent::open_or_create(&self.paths, &name)?.0)
    }

    /// What to say when the chosen agent does not exist: where the name came from, the
    /// closest existing one, and the command that makes it.
    fn unknown_agent(&self, name: &AgentName) -> anyhow::Result<String> {
        let chosen_by = if self.agent.is_some() {
            ""
        } else if self.config.default_agent.is_some() {
            " (default_agent in the config)"
        } else {
            " (this folder's name; pass --agent NAME to choose another)"
        };
        let existing = self.paths.agent_names()?;
        let closest = existing
            .iter()
            .map(|e| (edit_distance(e.as_str(), name.as_str()), e))
            .min()
            .filter(|(d, _)| *d <= (name.as_str().len() / 3).max(2));
        // A question ends its own sentence; a statement takes the full stop.
        let known = match (closest, existing.as_slice()) {
            (Some((_, e)), _) => format!("; did you mean {e}? To make {name}"),
            (None, []) => ". To make it".to_owned(),
            (None, all) => format!(
                "; this home has {}. To make it",
                all.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Ok(format!(
            "no agent named {name}{chosen_by} in {}{known}, run `{}`",
            self.paths.home().display(),
            output::command(name, "init")
        ))
    }

    /// Opens the chosen agent, creating it (and saying so on stderr) on first use.
    fn open_or_create_agent(&self) -> anyhow::Result<Agent> {
        let name = self.agent_name()?;
        let (agent, created) = Agent::open_or_create(&self.paths, &name)?;
        if created {
            eprintln!(
                "mailslot: created agent {} (fingerprint {}) in {}",
                agent.name,
                agent.identity.fingerprint(),
                agent.dir.display()
            );
        }
        Ok(agent)
    }
}

impl Ctx {
    /// The relay: `--relay` / `MAILSLOT_RELAY`, else the config, else the loopback relay of
    /// this home, started in the background when it is not running.
    pub(super) fn relay_url(&self) -> anyhow::Result<RelayUrl> {
        match self.relay.clone().or_else(|| self.config.relay.clone()) {
            Some(url) => Ok(url),
            None => local_relay::ensure(&self.paths, self.local_relay_port()?),
        }
    }

    /// The loopback relay's port when no relay is configured (the embedded default).
    pub(super) fn local_relay(&self) -> anyhow::Result<Option<u16>> {
        if self.relay.is_some() || self.config.relay.is_some() {
            return Ok(None);
        }
        self.local_relay_port().map(Some)
    }

    /// [`Ctx::relay_url`], or when the embedded relay cannot be started, its URL anyway (saying
    /// why, in a sentence: a one-off command logs no warnings): a long-running client retries
    /// until it is up.
    pub(super) fn relay_url_or_default(&self) -> RelayUrl {
        self.relay_url().unwrap_or_else(|e| {
            let port = self.local_relay_port().unwrap_or(local_relay::DEFAULT_PORT);
            eprintln!("mailslot: cannot start this home's relay ({e:#}); mail waits in the outbox");
            format!("ws://127.0.0.1:{port}")
                .parse()
                .expect("a loopback URL is valid")
        })
    }

    fn local_relay_port(&self) -> anyhow::Result<u16> {
        let name = crate::config::ENV_LOCAL_RELAY_PORT;
        match std::env::var(name) {
            Ok(v) => v
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .with_context(|| format!("{name}={v:?} is not a port from 1 to 65535")),
            Err(_) => Ok(self
                .config
                .local_relay_port
                .unwrap_or(local_relay::DEFAULT_PORT)),
        }
    }
}

/// Runs a parsed command line; exit code 0 on success, 1 on failure (clap exits 2 on usage).
pub fn run(cli: Cli) -> ExitCode {
    let (kind, json) = match &cli.command {
        // A relay is a service: its operator wants to see what it does. Its one-off
        // subcommands (migrate, invite, check) say only what went wrong.
        Command::Relay(args) if args.action.is_none() => (
            logging::Kind::Relay,
            args.log_format == relay::LogFormat::Json,
        ),
        Command::Mcp { .. } | Command::Dashboard { .. } => (logging::Kind::Service, false),
        _ => (logging::Kind::Command, false),
    };
    logging::init(kind, cli.verbose, json);
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) if e.chain().any(|c| c.is::<output::StdoutClosed>()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mailslot: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let named = match &cli.config {
        Some(file) => missing_config(file, cli.home.clone()),
        None => Ok(()),
    };
    let paths = Paths::new(cli.home, cli.config)?;
    let loaded = named.and_then(|()| Ok(Config::load(paths.config_file())?));
    // Doctor reports a broken config as its first check and runs the others on the defaults;
    // every other command stops at it.
    let (config, config_problem) = match loaded {
        Ok(config) => (config, None),
        Err(e) if matches!(cli.command, Command::Doctor) => (Config::default(), Some(e)),
        Err(e) => return Err(e),
    };
    let ctx = Ctx {
        paths,
        config,
        agent: cli.agent,
        relay: cli.relay,
        json: cli.json,
    };
    let done = match cli.command {
        Command::Init { offline } => identity::init(&ctx, offline),
        Command::Register { invite } => identity::register(&ctx, invite),
        Command::Retire => identity::retire(&ctx),
        Command::RotateKeys => identity::rotate_keys(&ctx),
        Command::Whoami { set } => identity::whoami(&ctx, set),
        Command::Doing { set } => identity::doing(&ctx, set),
        Command::Status => identity::status(&ctx),
        Command::Doctor => doctor::run(&ctx, config_problem),
        Command::Remember { title, tags, text } => memory::remember(&ctx, title, tags, text),
        Command::Recall {
            query,
            limit,
            before,
        } => memory::recall(&ctx, query, limit, before),
        Command::Forget { id } => memory::forget(&ctx, id),
        Command::Inbox {
            all,
            limit,
            importance,
            before,
        } => mail::inbox(&ctx, all, limit, importance, before),
        Command::Read { id, save } => mail::read(&ctx, id, save.as_deref()),
        Command::Thread { id } => mail::thread(&ctx, id),
        Command::MarkRead { ids, all } => mail::mark_read(&ctx, ids, all),
        Command::Sent {
            state,
            limit,
            before,
        } => mail::sent(&ctx, state, limit, before),
        Command::Retry { ids, all_failed } => send::retry(&ctx, ids, all_failed),
        Command::Search { query, limit } => mail::search(&ctx, &query, limit),
        Command::Tell {
            body,
            body_file,
            subject,
        } => tell::tell(&ctx, subject, body::BodySource { body, body_file }),
        Command::Send {
            to,
            cc,
            bcc,
            subject,
            body,
            body_file,
            data,
            importance,
            ack_required,
            attach,
        } => send::send(
            &ctx,
            send::Recipients { to, cc, bcc },
            subject,
            body::BodySource { body, body_file },
            data,
            send::Marks {
                importance,
                ack_required,
                attach,
            },
        ),
        Command::Reply {
            id,
            all,
            body,
            body_file,
            importance,
            ack_required,
            attach,
        } => send::reply(
            &ctx,
            id,
            all,
            body::BodySource { body, body_file },
            send::Marks {
                importance,
                ack_required,
                attach,
            },
        ),
        Command::Acknowledge { id, answer } => send::acknowledge(&ctx, id, answer),
        Command::ReadReceipts { set } => mail::read_receipts(&ctx, set.as_deref()),
        Command::Sync => send::sync(&ctx),
        Command::Wait { timeout } => return wait::run(&ctx, timeout),
        Command::Connect { peer, note } => consent::connect(&ctx, peer, note),
        Command::Requests => consent::requests(&ctx),
        Command::Approve { code, from } => consent::approve(&ctx, code, from),
        Command::Deny { peer } => consent::change(&ctx, Change::Deny(peer)),
        Command::Block { peer } => consent::change(&ctx, Change::Block(peer)),
        Command::Unblock { peer } => consent::change(&ctx, Change::Unblock(peer)),
        Command::Uncontact { peer } => consent::change(&ctx, Change::Remove(peer)),
        Command::Contacts { action: None } => consent::contacts(&ctx),
        Command::Contacts {
            action:
                Some(ContactsCommand::Trust {
                    address,
                    fingerprint,
                }),
        } => keys::trust_contact(&ctx, address, fingerprint),
        Command::Keys { address } => keys::keys(&ctx, address),
        Command::TrustRelay { host, fingerprint } => keys::trust_relay(&ctx, host, fingerprint),
        Command::Groups { action } => match action {
            None | Some(GroupsCommand::List) => groups::list(&ctx),
            Some(GroupsCommand::Create { group, policy }) => groups::create(&ctx, group, policy),
            Some(GroupsCommand::Add { group, member }) => {
                groups::roster(&ctx, (group, Roster::Add, member))
            }
            Some(GroupsCommand::Remove { group, member }) => {
                groups::roster(&ctx, (group, Roster::Remove, member))
            }
            Some(GroupsCommand::Join { group }) => groups::join(&ctx, group),
            Some(GroupsCommand::Leave { group }) => groups::leave(&ctx, group),
            Some(GroupsCommand::Members { group }) => groups::members(&ctx, group),
        },
        Command::Owner(OwnerCommand::Init) => owner::init(&ctx),
        Command::Owner(OwnerCommand::Change) => owner::change(&ctx),
        Command::Owner(OwnerCommand::Confirm) => owner::confirm(&ctx),
        Command::Directory { join, leave } => directory::run(
            &ctx,
            match (join, leave) {
                (Some(description), _) => directory::Action::Join(description),
                (None, true) => directory::Action::Leave,
                (None, false) => directory::Action::List,
            },
        ),
        Command::Presence { agents } => peers::presence(&ctx, agents),
        Command::Whois { address } => peers::whois(&ctx, address),
        Command::Policy { policy } => consent::change(&ctx, Change::Policy(policy)),
        Command::Reserve {
            patterns,
            reason,
            shared,
            ttl,
            project,
        } => {
            let wanted = reservations::Wanted {
                patterns,
                reason,
                shared,
                ttl,
            };
            return reservations::reserve(&ctx, project, wanted);
        }
        Command::Release {
            targets,
            all,
            project,
        } => reservations::release(&ctx, project, targets, all),
        Command::Renew { ids, ttl, project } => reservations::renew(&ctx, project, ids, ttl),
        Command::Reservations { project } => reservations::list(&ctx, project),
        Command::Guard(GuardCommand::Install { force }) => guard::install(force),
        Command::Guard(GuardCommand::Check { project }) => return guard::check(&ctx, project),
        Command::Hook { kind } => return hook::run(&ctx, kind),
        Command::Mcp {
            http,
            print_token,
            max_sessions,
            session_idle_secs,
        } => {
            if print_token {
                mcp::print_token(&ctx)
            } else {
                let limits = crate::mcp::SessionLimits {
                    max: max_sessions,
                    idle: std::time::Duration::from_secs(session_idle_secs),
                };
                mcp::run(&ctx, http, limits)
            }
        }
        Command::Dashboard { listen, no_open } => dashboard::run(&ctx, listen, !no_open),
        Command::Demo => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(crate::demo::run()),
        Command::Relay(args) => return relay::run(&ctx, args),
        Command::Bench(cmd) => crate::bench::run(cmd, ctx.json),
        Command::Export {
            out,
            passphrase_file,
        } => archive::export(&ctx, out, passphrase_file),
        Command::Import {
            file,
            replace,
            passphrase_file,
        } => archive::import(&ctx, &file, replace, passphrase_file),
        Command::Completions { shell } => help::completions(shell),
        Command::Man { dir } => help::man(dir.as_deref()),
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// A config file named on purpose must exist: silently running on defaults would hide a typo.
/// (The default one is optional.)
fn missing_config(file: &std::path::Path, home: Option<PathBuf>) -> anyhow::Result<()> {
    match std::fs::metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let (named_by, leave_out) =
                if std::env::var_os(config::ENV_CONFIG).is_some_and(|v| v == file) {
                    (
                        format!("{}={}", config::ENV_CONFIG, file.display()),
                        format!("unset {}", config::ENV_CONFIG),
                    )
                } else {
                    (
                        format!("--config {}", file.display()),
                        "leave out --config".to_owned(),
                    )
                };
            let default = Paths::new(home, None)?;
            anyhow::bail!(
                "the config file {} does not exist (from {named_by}); create it, fix the path, or {leave_out} to use {}, which is optional",
                file.display(),
                default.config_file().display()
            )
        }
        _ => Ok(()),
    }
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::edit_distance;

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("alice", "alice"), 0);
        assert_eq!(edit_distance("alcie", "alice"), 2);
        assert_eq!(edit_distance("alic", "alice"), 1);
        assert_eq!(edit_distance("", "bob"), 3);
        assert_eq!(edit_distance("proj", "alice"), 5);
    }
}
