//! Driving `mailslot mcp` with rmcp's client, as an LLM client would: connect in either
//! protocol era, call tools, and record what the server pushes. Used by `mailslot demo`,
//! `mailslot bench mcp` and the tests.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, CustomNotification,
    ErrorData, ProtocolVersion, ReadResourceRequestParams, ResourceContents,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::client::RelayUrl;
use crate::mcp::CHANNEL_METHOD;

/// How long the driver waits for an answer or a push.
pub const WAIT: Duration = Duration::from_secs(20);

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

/// A client handler that records every push on a channel.
#[derive(Clone)]
pub struct Recorder {
    pushed: mpsc::UnboundedSender<Pushed>,
    /// `file://` URIs this client declares as its roots; none declares no roots capability.
    roots: Vec<String>,
}

// Roots are deprecated by SEP-2577, but today's clients declare them and `mailslot mcp` reads
// them (`mcp/attach.rs`), so the tests' client can too.
#[allow(deprecated)]
impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        if !self.roots.is_empty() {
            info.capabilities = ClientCapabilities::builder().enable_roots().build();
        }
        info
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ListRootsResult, ErrorData> {
        Ok(rmcp::model::ListRootsResult::new(
            self.roots
                .iter()
                .map(|uri| rmcp::model::Root::new(uri.clone()))
                .collect(),
        ))
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.pushed.send(Pushed::Updated(params.uri));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.pushed.send(Pushed::ListChanged);
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.pushed.send(Pushed::Custom(
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
pub struct Driver {
    /// The rmcp client.
    pub client: RunningService<RoleClient, Recorder>,
    /// Pushes, in arrival order.
    pushed: mpsc::UnboundedReceiver<Pushed>,
    /// Pushes that arrived but no wait has taken yet (handlers run concurrently, so pushes
    /// sent in one order may arrive in another).
    unclaimed: Vec<Pushed>,
}

impl Driver {
    /// Connects over `transport` in `era`, declaring no roots.
    pub async fn connect<T, E, A>(transport: T, era: Era) -> anyhow::Result<Self>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::connect_with_roots(transport, era, Vec::new()).await
    }

    /// Connects over `transport` in `era`, declaring the roots capability with these
    /// `file://` URIs when there are any.
    pub async fn connect_with_roots<T, E, A>(
        transport: T,
        era: Era,
        roots: Vec<String>,
    ) -> anyhow::Result<Self>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let (tx, pushed) = mpsc::unbounded_channel();
        let lifecycle = match era {
            Era::Legacy => ClientLifecycleMode::Initialize,
            Era::Modern => ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        };
        let client = tokio::time::timeout(
            WAIT,
            Recorder { pushed: tx, roots }.serve_with_lifecycle(transport, lifecycle),
        )
        .await
        .context("the MCP server did not answer")??;
        Ok(Self {
            client,
            pushed,
            unclaimed: Vec::new(),
        })
    }

    /// Starts `mailslot mcp` (the binary at `exe`) for `agent` in `home` against `relay`,
    /// with a minimal environment (as MCP hosts do), and connects to it.
    pub async fn spawn(
        exe: &Path,
        home: &Path,
        agent: &str,
        relay: &RelayUrl,
        era: Era,
    ) -> anyhow::Result<Self> {
        let mut cmd = tokio::process::Command::new(exe);
        // The home is its working directory: files it may attach are those under it.
        cmd.args(["--agent", agent, "--relay", relay.as_str(), "mcp"])
            .current_dir(home)
            .env_clear()
            .env(crate::config::ENV_HOME, home)
            .env(crate::config::ENV_LOG, "warn");
        let transport = rmcp::transport::TokioChildProcess::new(cmd)
            .with_context(|| format!("starting {}", exe.display()))?;
        Self::connect(transport, era).await
    }

    /// Calls a tool; the raw result (check `is_error`).
    pub async fn call(&self, tool: &str, args: Value) -> anyhow::Result<CallToolResult> {
        let Value::Object(args) = args else {
            bail!("tool arguments must be a JSON object")
        };
        let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        Ok(tokio::time::timeout(WAIT, self.client.call_tool(request))
            .await
            .with_context(|| format!("{tool} did not answer"))??)
    }

    /// Calls a tool that must succeed; its structured result.
    pub async fn ok(&self, tool: &str, args: Value) -> anyhow::Result<Value> {
        let result = self.call(tool, args).await?;
        if result.is_error == Some(true) {
            bail!("{tool} failed: {}", text_of(&result));
        }
        result
            .structured_content
            .ok_or_else(|| anyhow!("{tool} returned no structured content"))
    }

    /// Waits (up to 10 s) until the server says its relay is connected; returns its identity
    /// document (`mailslot://identity`).
    pub async fn wait_connected(&self) -> anyhow::Result<serde_json::Value> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let identity: serde_json::Value =
                serde_json::from_str(&self.read(crate::mcp::IDENTITY).await?)?;
            let relay = identity["relay"].as_str().unwrap_or_default();
            if relay.starts_with("connected") {
                return Ok(identity);
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("the agent did not connect to the relay: {relay}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Reads a text resource.
    pub async fn read(&self, uri: &str) -> anyhow::Result<String> {
        let result = tokio::time::timeout(
            WAIT,
            self.client
                .read_resource(ReadResourceRequestParams::new(uri)),
        )
        .await
        .with_context(|| format!("reading {uri} timed out"))??;
        match result.contents.into_iter().next() {
            Some(ResourceContents::TextResourceContents { text, .. }) => Ok(text),
            other => bail!("{uri}: expected text, got {other:?}"),
        }
    }

    /// Waits for the first push that `pick` accepts; pushes it passes over stay for later
    /// waits.
    pub async fn wait_for<T>(
        &mut self,
        mut pick: impl FnMut(&Pushed) -> Option<T>,
    ) -> anyhow::Result<T> {
        if let Some((at, found)) = self
            .unclaimed
            .iter()
            .enumerate()
            .find_map(|(at, p)| pick(p).map(|f| (at, f)))
        {
            self.unclaimed.remove(at);
            return Ok(found);
        }
        tokio::time::timeout(WAIT, async {
            while let Some(p) = self.pushed.recv().await {
                match pick(&p) {
                    Some(found) => return Ok(found),
                    None => self.unclaimed.push(p),
                }
            }
            bail!("the MCP server went away")
        })
        .await
        .context("the push did not come")?
    }

    /// Waits for a Claude Code channel event; its params (`content`, `meta`).
    pub async fn channel_event(&mut self) -> anyhow::Result<Value> {
        self.wait_for(|p| match p {
            Pushed::Custom(method, params) if method == CHANNEL_METHOD => Some(params.clone()),
            _ => None,
        })
        .await
    }

    /// Closes the session (the server exits when its input closes).
    pub async fn close(self) -> anyhow::Result<()> {
        self.client.cancel().await?;
        Ok(())
    }
}

/// All text blocks of a result, joined by newlines.
pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}
