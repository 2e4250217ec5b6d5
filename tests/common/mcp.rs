//! MCP test helpers: a client handler that records what the server pushes, and ways to run
//! `mailslot mcp` in-process (over a duplex pipe) or as a real child process.

use mailslot::agent::Agent;
use mailslot::client::RelayUrl;
use mailslot::config::Paths;
use mailslot::mailbox::Mailbox;
use mailslot::protocol::AgentName;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, CustomNotification, ProtocolVersion,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::EVENT_TIMEOUT;

/// What the server pushed.
#[derive(Debug, Clone, PartialEq)]
pub enum Pushed {
    /// `notifications/resources/updated`.
    Updated(String),
    /// `notifications/resources/list_changed`.
    ListChanged,
    /// A custom notification: method and params.
    Custom(String, Value),
}

/// Records every push on a channel.
#[derive(Clone)]
pub struct Recorder(pub mpsc::UnboundedSender<Pushed>);

impl ClientHandler for Recorder {
    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(Pushed::Updated(params.uri));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(Pushed::ListChanged);
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.0.send(Pushed::Custom(
            notification.method,
            notification.params.unwrap_or(Value::Null),
        ));
    }
}

/// Which protocol era a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-11-25: initialize, resources/subscribe.
    Legacy,
    /// 2026-07-28: server/discover, subscriptions/listen.
    Modern,
}

/// A connected MCP client and what it has been pushed.
pub struct McpClient {
    pub client: RunningService<RoleClient, Recorder>,
    pub pushed: mpsc::UnboundedReceiver<Pushed>,
}

fn lifecycle(era: Era) -> ClientLifecycleMode {
    match era {
        Era::Legacy => ClientLifecycleMode::Initialize,
        Era::Modern => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    }
}

impl McpClient {
    /// Connects over `transport`.
    pub async fn connect<T, E, A>(transport: T, era: Era) -> Self
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let (tx, pushed) = mpsc::unbounded_channel();
        let client = tokio::time::timeout(
            EVENT_TIMEOUT,
            Recorder(tx).serve_with_lifecycle(transport, lifecycle(era)),
        )
        .await
        .expect("connecting timed out")
        .expect("the MCP session starts");
        Self { client, pushed }
    }

    /// Calls a tool; the raw result (check `is_error`).
    pub async fn call(&self, tool: &str, args: Value) -> CallToolResult {
        let Value::Object(args) = args else {
            panic!("tool arguments are an object")
        };
        tokio::time::timeout(
            EVENT_TIMEOUT,
            self.client
                .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args)),
        )
        .await
        .expect("the tool call timed out")
        .expect("the tool call is answered")
    }

    /// Calls a tool that must succeed; its structured result.
    pub async fn ok(&self, tool: &str, args: Value) -> Value {
        let result = self.call(tool, args.clone()).await;
        assert_ne!(
            result.is_error,
            Some(true),
            "{tool}({args}) failed: {:?}",
            result.content
        );
        result
            .structured_content
            .expect("tools return structured content")
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

    /// Waits for the first push matching `pick`.
    pub async fn wait_for<T>(&mut self, mut pick: impl FnMut(&Pushed) -> Option<T>) -> T {
        tokio::time::timeout(EVENT_TIMEOUT, async {
            loop {
                let p = self.pushed.recv().await.expect("the client is running");
                if let Some(found) = pick(&p) {
                    return found;
                }
            }
        })
        .await
        .expect("the push did not come")
    }

    /// Waits for a Claude Code channel event; its params.
    pub async fn channel_event(&mut self) -> Value {
        self.wait_for(|p| match p {
            Pushed::Custom(method, params) if method == mailslot::mcp::CHANNEL_METHOD => {
                Some(params.clone())
            }
            _ => None,
        })
        .await
    }
}

/// All text blocks of a result, joined.
pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
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

/// A `mailslot mcp` child process for `name` in `home`, talking to `relay`.
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
        .env("MAILSLOT_LOG", "warn");
    let transport = rmcp::transport::TokioChildProcess::new(cmd).expect("mailslot mcp starts");
    McpClient::connect(transport, era).await
}

/// Arguments for a simple send.
pub fn send_args(to: &[&str], subject: &str, body: &str) -> Value {
    json!({ "to": to, "subject": subject, "body": body })
}
