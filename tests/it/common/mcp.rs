//! MCP test helpers over `mailslot::demo::driver`: the same client handler and driver the
//! demo uses, with methods that fail the test instead of returning errors, and ways to run
//! `mailslot mcp` in-process (over a duplex pipe) or as a real child process.

use mailslot::agent::Agent;
use mailslot::client::RelayUrl;
use mailslot::config::Paths;
use mailslot::demo::driver::Driver;
pub use mailslot::demo::driver::{Era, Pushed, text_of};
use mailslot::mailbox::Mailbox;
use mailslot::protocol::AgentName;

use super::EVENT_TIMEOUT;
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

/// Every tool `mailslot mcp` offers, sorted (no approve tool).
pub const TOOLS: [&str; 30] = [
    "acknowledge",
    "contacts",
    "create_group",
    "directory",
    "forget",
    "group_members",
    "groups",
    "inbox",
    "join_group",
    "leave_group",
    "mark_read",
    "presence",
    "read",
    "recall",
    "release_files",
    "remember",
    "renew_files",
    "reply",
    "reply_all",
    "request_contact",
    "reservations",
    "reserve_files",
    "save_attachment",
    "search",
    "send",
    "sent",
    "set_status",
    "thread",
    "wait_for_mail",
    "whois",
];

/// Splits framed text at its untrusted fence: what is inside, and what follows the closing
/// marker. Fails the test when the fence is missing or does not close exactly once.
pub fn split_fence(framed: &str) -> (String, String) {
    let nonce = framed
        .split("<<<mailslot-untrusted ")
        .nth(1)
        .and_then(|r| r.split(">>>").next())
        .unwrap_or_else(|| panic!("no fence in: {framed}"));
    let close = format!("<<<end mailslot-untrusted {nonce}>>>");
    assert_eq!(framed.matches(&close).count(), 1, "{framed}");
    let (before, after) = framed.split_once(&close).unwrap();
    let inside = before
        .split_once(&format!("<<<mailslot-untrusted {nonce}>>>"))
        .unwrap()
        .1;
    (inside.to_owned(), after.to_owned())
}

/// A connected MCP client whose calls fail the test on error.
pub struct McpClient(pub Driver);

impl std::ops::Deref for McpClient {
    type Target = Driver;
    fn deref(&self) -> &Driver {
        &self.0
    }
}

impl McpClient {
    /// Connects over `transport`.
    pub async fn connect<T, E, A>(transport: T, era: Era) -> Self
    where
        T: rmcp::transport::IntoTransport<rmcp::RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        Self(
            Driver::connect(transport, era)
                .await
                .expect("the MCP session starts"),
        )
    }

    /// Connects over `transport`, declaring these `file://` roots.
    pub async fn connect_with_roots<T, E, A>(transport: T, era: Era, roots: Vec<String>) -> Self
    where
        T: rmcp::transport::IntoTransport<rmcp::RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        Self(
            Driver::connect_with_roots(transport, era, roots)
                .await
                .expect("the MCP session starts"),
        )
    }

    /// Calls a tool; the raw result (check `is_error`).
    pub async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        self.0.call(tool, args).await.unwrap()
    }

    /// Calls a tool that must succeed; its structured result.
    pub async fn ok(&self, tool: &str, args: Value) -> Value {
        self.0.ok(tool, args).await.unwrap()
    }

    /// Calls a tool that must fail; its error text.
    pub async fn err(&self, tool: &str, args: Value) -> String {
        let result = self.call(tool, args.clone()).await;
        assert_eq!(
            result.is_error,
            Some(true),
            "{tool}({args}) should fail: {:?}",
            result.structured_content
        );
        text_of(&result)
    }

    /// The `sent` tool's entry for message `id`, listed with `args` (a state, a limit).
    pub async fn sent_entry(&self, args: Value, id: &Value) -> Option<Value> {
        let list = self.ok("sent", args).await;
        list["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["message_id"] == *id)
            .cloned()
    }

    /// Waits for the first push matching `pick`.
    pub async fn wait_for<T>(&mut self, pick: impl FnMut(&Pushed) -> Option<T>) -> T {
        self.0.wait_for(pick).await.unwrap()
    }

    /// Waits for a Claude Code channel event; its params.
    pub async fn channel_event(&mut self) -> Value {
        self.0.channel_event().await.unwrap()
    }
}

/// An agent home in a temp folder, served in-process over a duplex pipe.
pub struct InProcess {
    pub mailbox: Mailbox,
    pub mcp: McpClient,
    pub home: tempfile::TempDir,
}

/// Opens `name` in `home` and serves it in-process for a client of `era`.
pub async fn serve_in(
    home: &std::path::Path,
    name: &str,
    relay: &RelayUrl,
    era: Era,
) -> (Mailbox, McpClient) {
    let paths = Paths::new(Some(home.to_owned()), None).unwrap();
    let (agent, _) = Agent::open_or_create(&paths, &AgentName::new(name).unwrap()).unwrap();
    let mailbox = Mailbox::open(agent, relay.clone()).await.unwrap();
    let (server_end, client_end) = tokio::io::duplex(256 * 1024);
    let (reader, writer) = tokio::io::split(server_end);
    tokio::spawn(mailslot::mcp::serve(mailbox.clone(), reader, writer));
    let mcp = McpClient::connect(client_end, era).await;
    (mailbox, mcp)
}

impl InProcess {
    /// A fresh agent `name` served in-process.
    pub async fn start(name: &str, relay: &RelayUrl, era: Era) -> Self {
        let home = tempfile::tempdir().unwrap();
        let (mailbox, mcp) = serve_in(home.path(), name, relay, era).await;
        Self { mailbox, mcp, home }
    }

    /// Waits until the mailbox is connected to its relay.
    pub async fn online(&self) {
        let mut status = self.mailbox.watch_status();
        tokio::time::timeout(
            EVENT_TIMEOUT,
            status.wait_for(|s| *s == mailslot::mailbox::RelayStatus::Online),
        )
        .await
        .expect("the mailbox did not connect")
        .unwrap();
    }
}

/// A `mailslot mcp` child process for `name` in `home`, talking to `relay`. It logs warnings
/// to the test's stderr, or what `MAILSLOT_TEST_CHILD_LOG` asks for (a filter, like
/// `mailslot=debug`), to diagnose a test that fails only sometimes.
pub async fn spawn_mcp(
    home: &std::path::Path,
    name: &str,
    relay: &RelayUrl,
    era: Era,
) -> McpClient {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"));
    cmd.args(["--agent", name, "--relay", relay.as_str(), "mcp"])
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env(
            "MAILSLOT_LOG",
            std::env::var("MAILSLOT_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".to_owned()),
        );
    let transport = rmcp::transport::TokioChildProcess::new(cmd).expect("mailslot mcp starts");
    McpClient::connect(transport, era).await
}

/// Arguments for a simple send.
pub fn send_args(to: &[&str], subject: &str, body: &str) -> Value {
    json!({ "to": to, "subject": subject, "body": body })
}
