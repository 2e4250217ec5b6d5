//! The MCP handler: server info and capabilities, and the wiring of tools (`tools.rs`),
//! resources (`resources.rs`), prompts (`prompts.rs`), completions (`completions.rs`) and
//! pushes (`push.rs`). Every tool
//! result carries the unread notice (`notice.rs`); a call with an unknown argument is refused
//! before its tool runs (`strict.rs`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rmcp::handler::server::router::prompt::PromptRouter;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams, CompleteResult,
    ContentBlock, DiscoverRequestMethod, DiscoverResult, Implementation, JsonObject,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
    ServerConfig, SubscribeRequestParams, SubscriptionFilter, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, prompt_handler};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::completions;
use super::era;
use super::links;
use super::notice;
use super::prompts::fill;
use super::push::{self, Feeds, Subscriptions};
use super::resources;
use super::strict;
use crate::doorbell::Doorbell;
use crate::doorbell::claude_code::Route;
use crate::doorbell::footer::footer;
use crate::doorbell::{bell, codex};
use crate::mailbox::Mailbox;
use crate::protocol::MessageId;
use crate::store::{SessionKey, UnreadSummary, Via};

const INSTRUCTIONS: &str = include_str!("../../prompts/instructions.md");

/// The mailslot MCP server for one agent. Clones share the mailbox and the doorbell; each
/// client session gets its own clone (its own subscriptions).
#[derive(Clone)]
pub struct MailslotServer {
    pub(super) mailbox: Mailbox,
    doorbell: Doorbell,
    tool_router: ToolRouter<Self>,
    prompt_router: PromptRouter<Self>,
    subscriptions: Subscriptions,
    /// Rings and mailbox events since this session began, kept until the session's pushes
    /// can start (a legacy client's peer is known only once it initializes).
    pending: Arc<Mutex<Option<Feeds>>>,
    /// Fires when the client's input ends: long-lived handlers return at once.
    pub(super) stop: CancellationToken,
    /// The client's own session (Claude Code's), when it names one: messages that tool
    /// results list are recorded as shown to it, so its hooks do not show them again.
    client_session: Option<SessionKey>,
    /// Whether rings go out as channel events (see `doorbell::claude_code`).
    route: Route,
    /// The Codex thread this server serves, once a tool call named it: rung through
    /// `codex queue`, and what its tool results show is recorded under it.
    codex_thread: Arc<std::sync::OnceLock<SessionKey>>,
}

impl MailslotServer {
    /// A server over `mailbox`, ringing `doorbell`; `stop` ends pushes and listen streams.
    pub fn new(mailbox: Mailbox, doorbell: Doorbell, stop: CancellationToken) -> Self {
        Self {
            tool_router: Self::tool_router_with_notice(),
            prompt_router: Self::prompt_router(),
            subscriptions: Subscriptions::default(),
            pending: Arc::new(Mutex::new(Some(Feeds::subscribe(&doorbell, &mailbox)))),
            mailbox,
            doorbell,
            stop,
            client_session: None,
            route: Route::open(),
            codex_thread: Arc::default(),
        }
    }

    /// Rings go out as channel events as `route` says (a Claude Code session's path).
    pub fn with_route(mut self, route: Route) -> Self {
        self.route = route;
        self
    }

    /// This server serves the client session `session` (one stdio client).
    pub fn with_client_session(mut self, session: Option<SessionKey>) -> Self {
        self.client_session = session;
        self
    }

    /// Records that a tool result put `ids` in front of the client session's model.
    pub(super) async fn shown(&self, ids: Vec<MessageId>) {
        let Some(session) = self
            .client_session
            .clone()
            .or_else(|| self.codex_thread.get().cloned())
        else {
            return;
        };
        if let Err(e) = self.mailbox.mark_shown(session, ids, Via::Tool).await {
            tracing::warn!(error = %e, "cannot record what a tool result showed");
        }
    }

    /// The tools, each output schema declaring the unread notice and each input schema
    /// refusing unknown arguments (done once, here).
    fn tool_router_with_notice() -> ToolRouter<Self> {
        let mut router = super::tools::router();
        for route in router.map.values_mut() {
            notice::declare(&mut route.attr);
            strict::forbid_unknown(&mut route.attr);
        }
        router
    }

    /// A fresh per-session copy (for Streamable HTTP, where every session is its own client).
    pub fn for_new_session(&self) -> Self {
        Self {
            subscriptions: Subscriptions::default(),
            client_session: None,
            route: Route::open(),
            codex_thread: Arc::default(),
            pending: Arc::new(Mutex::new(Some(Feeds::subscribe(
                &self.doorbell,
                &self.mailbox,
            )))),
            ..self.clone()
        }
    }

    /// Starts pushing to a legacy session's peer, once.
    fn start_pushing(&self, peer: rmcp::service::Peer<RoleServer>) {
        let Some(feeds) = self.pending.lock().expect("not poisoned").take() else {
            return;
        };
        tokio::spawn(push::legacy(
            push::Legacy {
                peer,
                subscriptions: self.subscriptions.clone(),
                route: self.route.clone(),
                mailbox: self.mailbox.clone(),
            },
            feeds,
            self.stop.clone(),
        ));
    }

    /// Codex names its thread in every tool call's `_meta.threadId`: the first one starts the
    /// Codex doorbell (stdio only: one client, one thread).
    fn learn_codex_thread(&self, context: &RequestContext<RoleServer>) {
        if self.codex_thread.get().is_some() || self.client_session.is_some() {
            return;
        }
        let Some(raw) = context.meta.get("threadId").and_then(|v| v.as_str()) else {
            return;
        };
        match codex::ThreadId::parse(raw) {
            Ok(thread) => {
                let _ = self
                    .codex_thread
                    .get_or_init(|| bell::ring_codex_thread(&self.mailbox, &self.doorbell, thread));
            }
            Err(e) => tracing::warn!(error = %e, "ignoring the tool call's thread id"),
        }
    }

    /// A tool call's answer: the tool's result, links to the attachments it lists, and the
    /// unread notice.
    async fn answer_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let refusal = self
            .tool_router
            .get(&request.name)
            .and_then(|tool| strict::unknown_arguments(tool, request.arguments.as_ref()));
        let mut response = match refusal {
            Some(e) => CallToolResult::error(vec![ContentBlock::text(e)]).into(),
            None => {
                // One span per call, so a message's life can be followed in the logs from
                // the tool that sent or read it.
                let span = tracing::debug_span!("tool", name = %request.name);
                let call = ToolCallContext::new(self, request, context);
                self.tool_router.call(call).instrument(span).await?
            }
        };
        if let CallToolResponse::Complete(result) = &mut response {
            links::attach(result);
            if let Some(line) = self.footer_line().await {
                notice::attach(result, line);
            }
        }
        Ok(response)
    }

    /// Keeps the unread summary a tool read with its result, for the notice of the same call,
    /// which then does not ask the store again; returns it.
    pub(super) fn keep_summary(&self, summary: UnreadSummary) -> UnreadSummary {
        // Outside a tool call there is no slot, and nothing to keep it for.
        let _ = CALL_SUMMARY.try_with(|kept| kept.set(Some(summary.clone())));
        summary
    }

    async fn footer_line(&self) -> Option<String> {
        let kept = CALL_SUMMARY.try_with(Cell::take).ok().flatten();
        let summary = match kept {
            Some(summary) => Ok(summary),
            None => self.mailbox.unread_summary().await,
        };
        match summary {
            Ok(summary) => footer(&summary),
            Err(e) => Some(format!("[mailslot] cannot read the inbox: {e}")),
        }
    }
}

tokio::task_local! {
    /// The unread summary a tool read for its result during this call (`call_tool`'s scope).
    /// Tools that change what is unread do not read it, so the notice reads it afresh.
    static CALL_SUMMARY: Cell<Option<UnreadSummary>>;
}

#[prompt_handler(router = self.prompt_router)]
impl ServerHandler for MailslotServer {
    fn get_info(&self) -> ServerConfig {
        // Logging is deprecated (SEP-2577), but legacy clients send logging/setLevel.
        #[allow(deprecated)]
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_resources_list_changed()
            .enable_logging()
            .enable_completions()
            .build();
        capabilities.experimental = Some(BTreeMap::from([(
            "claude/channel".to_owned(),
            JsonObject::new(),
        )]));
        let instructions = fill(
            INSTRUCTIONS,
            &[("address", &self.mailbox.address().to_string())],
        );
        ServerConfig::new(capabilities)
            .with_server_info(
                Implementation::new("mailslot", env!("CARGO_PKG_VERSION"))
                    .with_title("mailslot: mail and memory for agents"),
            )
            .with_instructions(instructions)
    }

    /// Answers the 2026-07-28 probe, except for clients that need a 2025-11-25 connection for
    /// their doorbell (see `era.rs`): they are told the method does not exist and fall back to
    /// `initialize`.
    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let client = context.meta.client_info();
        if era::wants_legacy(client.as_ref()) {
            tracing::debug!(client = ?client.map(|c| c.name), "refusing server/discover so the client connects with initialize (channel events)");
            return Err(ErrorData::method_not_found::<DiscoverRequestMethod>());
        }
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.learn_codex_thread(&context);
        CALL_SUMMARY
            .scope(Cell::new(None), self.answer_tool(request, context))
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_router.list_all()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(
            resources::list(&self.mailbox).await?,
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let contents = resources::read(&self.mailbox, &request.uri).await?;
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    /// Message ids, thread ids, attachment indexes and agent names for the prompts' and
    /// resource templates' arguments (see `completions.rs`).
    async fn complete(
        &self,
        request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        completions::complete(&self.mailbox, &request).await
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(push::accept(requested))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        push::listen(
            context,
            Feeds::subscribe(&self.doorbell, &self.mailbox),
            &self.stop,
        )
        .await
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.start_pushing(context.peer);
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.add(request.uri);
        self.start_pushing(context.peer);
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.remove(&request.uri);
        Ok(())
    }

    /// Legacy clients (the Inspector) set a level on connect; logs go to stderr only, so
    /// there is nothing to change, but the request must succeed.
    #[allow(deprecated)]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}
