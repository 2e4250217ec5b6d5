//! Writing mail: send, reply, reply to all, acknowledge. The sender is always this agent.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{parse_addresses, parse_importance, parse_message_id};
use crate::mailbox::{AckOutcome, SendOutcome, reply_at as compose_reply};
use crate::mcp::attach::{self, AttachmentArg};
use crate::mcp::errors::{Doing, no_message};
use crate::mcp::server::MailslotServer;
use crate::protocol::Message;
use crate::store::StoredMessage;

/// Arguments of `send`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendArgs {
    /// Recipients: agent names ("bob") or addresses ("bob@relay.example.com"). At least one
    /// of to, cc, bcc.
    #[serde(default)]
    pub to: Vec<String>,
    /// Copied recipients, visible to everyone.
    #[serde(default)]
    pub cc: Vec<String>,
    /// Blind copies: each gets its own copy; nobody else learns of them.
    #[serde(default)]
    pub bcc: Vec<String>,
    /// One line.
    pub subject: String,
    /// Text or Markdown.
    pub body: String,
    /// Optional structured payload (any JSON).
    #[serde(default)]
    pub data: Option<Value>,
    /// Optional snapshot of where your work stands (any JSON), shown with the thread.
    #[serde(default)]
    pub context: Option<Value>,
    /// "normal" (default), "high" or "urgent": shown to the recipients in the header.
    #[serde(default)]
    pub importance: Option<String>,
    /// Ask the recipients to acknowledge it; the sent tool then shows who did.
    #[serde(default)]
    pub ack_required: Option<bool>,
    /// Files or small inline content to attach (at most 8; 8 MiB per file and per message).
    /// The recipients see each one's name, type, size and SHA-256, and read the content as
    /// a resource.
    #[serde(default)]
    pub attachments: Vec<AttachmentArg>,
}

/// Arguments of `reply` and `reply_all`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyArgs {
    /// The message to answer.
    pub message_id: String,
    /// Text or Markdown.
    pub body: String,
    /// Optional structured payload (any JSON).
    #[serde(default)]
    pub data: Option<Value>,
    /// Optional snapshot of where your work stands (any JSON).
    #[serde(default)]
    pub context: Option<Value>,
    /// "normal" (default), "high" or "urgent": shown to the recipients in the header.
    #[serde(default)]
    pub importance: Option<String>,
    /// Ask the recipients to acknowledge it; the sent tool then shows who did.
    #[serde(default)]
    pub ack_required: Option<bool>,
    /// Files or small inline content to attach (at most 8; 8 MiB per file and per message).
    /// The recipients see each one's name, type, size and SHA-256, and read the content as
    /// a resource.
    #[serde(default)]
    pub attachments: Vec<AttachmentArg>,
}

/// Arguments of `acknowledge`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcknowledgeArgs {
    /// The received message to acknowledge.
    pub message_id: String,
    /// An optional short answer for the sender (at most 500 characters).
    #[serde(default)]
    pub answer: Option<String>,
}

/// What became of an acknowledgement.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AcknowledgeResult {
    /// The acknowledged message.
    pub message_id: String,
    /// "sent" (the relay took the receipt), "queued" (it goes out by itself later) or
    /// "already_acknowledged" (nothing was sent again).
    pub status: String,
    /// Why it is queued, or when it was acknowledged before.
    pub detail: String,
}

/// What became of a sent message.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SendResult {
    /// The new message's id.
    pub message_id: String,
    /// Its conversation.
    pub thread_id: String,
    /// "sent" (the relay stored it for the recipients) or "queued" (it goes out when the
    /// relay takes it; nothing to do).
    pub status: String,
    /// Why it is queued, or where it went.
    pub detail: String,
}

impl MailslotServer {
    async fn send_as_this_agent(&self, mut message: Message) -> Result<Json<SendResult>, String> {
        message.from = self.mailbox.address().clone();
        let (id, thread) = (message.id, message.thread);
        let (status, detail) = match self.mailbox.send(message).await {
            Ok(SendOutcome::Sent) => (
                "sent",
                format!("the relay at {} took it", self.mailbox.relay().authority()),
            ),
            Ok(SendOutcome::Queued { reason }) => ("queued", reason),
            Err(e) => return Err(self.tool_error(e, Doing::Sending).await),
        };
        Ok(Json(SendResult {
            message_id: id.to_string(),
            thread_id: thread.to_string(),
            status: status.into(),
            detail,
        }))
    }

    async fn original(&self, raw: &str) -> Result<StoredMessage, String> {
        let id = parse_message_id("message_id", raw)?;
        match self.mailbox.message(id).await {
            Ok(Some(m)) => Ok(m),
            Ok(None) => Err(no_message(&id)),
            Err(e) => Err(self.tool_error(e, Doing::Local).await),
        }
    }

    /// Reads the attachments of a send or reply (nothing is asked of the client without any).
    async fn attachments(
        &self,
        args: Vec<AttachmentArg>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Vec<crate::protocol::Attachment>, String> {
        if args.is_empty() {
            return Ok(Vec::new());
        }
        attach::load(args, attach::folders(ctx).await?).await
    }

    async fn reply_to(
        &self,
        args: ReplyArgs,
        all: bool,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SendResult>, String> {
        let attachments = self.attachments(args.attachments, &ctx).await?;
        let original = self.original(&args.message_id).await?;
        let mut message = compose_reply(
            &original,
            self.mailbox.name(),
            self.mailbox.relay(),
            all,
            args.body,
        )
        .await
        .map_err(|e| e.to_string())?;
        message.data = args.data;
        message.context = args.context;
        message.importance =
            parse_importance("importance", args.importance.as_deref())?.unwrap_or_default();
        message.ack_required = args.ack_required.unwrap_or(false);
        message.attachments = attachments;
        self.send_as_this_agent(message).await
    }
}

#[tool_router(router = writing_tools, vis = "pub(super)")]
impl MailslotServer {
    /// Send a message to other agents. It is signed and end-to-end encrypted; the sender is
    /// always this agent. When the relay is unreachable the message is queued and goes out
    /// by itself later (status "queued").
    #[tool(annotations(
        title = "Send a message",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn send(
        &self,
        Parameters(args): Parameters<SendArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SendResult>, String> {
        let to = parse_addresses("to", &args.to)?;
        let cc = parse_addresses("cc", &args.cc)?;
        let bcc = parse_addresses("bcc", &args.bcc)?;
        let importance = parse_importance("importance", args.importance.as_deref())?;
        if to.is_empty() && cc.is_empty() && bcc.is_empty() {
            return Err("no recipients: give at least one address in to, cc or bcc".into());
        }
        let mut message = Message::new(self.mailbox.address().clone(), to, args.subject, args.body);
        message.cc = cc;
        message.bcc = bcc;
        message.data = args.data;
        message.context = args.context;
        message.importance = importance.unwrap_or_default();
        message.ack_required = args.ack_required.unwrap_or(false);
        message.attachments = self.attachments(args.attachments, &ctx).await?;
        self.send_as_this_agent(message).await
    }

    /// Reply to the sender of a message, in its thread.
    #[tool(annotations(
        title = "Reply",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn reply(
        &self,
        Parameters(args): Parameters<ReplyArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SendResult>, String> {
        self.reply_to(args, false, ctx).await
    }

    /// Reply to the sender and every visible recipient (to and cc) of a message, in its
    /// thread. Blind-copied recipients are never included.
    #[tool(annotations(
        title = "Reply to all",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = true
    ))]
    async fn reply_all(
        &self,
        Parameters(args): Parameters<ReplyArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<SendResult>, String> {
        self.reply_to(args, true, ctx).await
    }

    /// Acknowledge a received message to its sender (a signed, sealed receipt; once per
    /// message), with an optional short answer. For messages whose header says an
    /// acknowledgement is requested, once you have taken them in.
    #[tool(annotations(
        title = "Acknowledge",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = true
    ))]
    async fn acknowledge(
        &self,
        Parameters(args): Parameters<AcknowledgeArgs>,
    ) -> Result<Json<AcknowledgeResult>, String> {
        let id = parse_message_id("message_id", &args.message_id)?;
        let (status, detail) = match self.mailbox.acknowledge(id, args.answer).await {
            Ok(AckOutcome::Sent(SendOutcome::Sent)) => (
                "sent",
                "the relay took the receipt for the sender".to_owned(),
            ),
            Ok(AckOutcome::Sent(SendOutcome::Queued { reason })) => ("queued", reason),
            Ok(AckOutcome::Already(at)) => (
                "already_acknowledged",
                format!("you acknowledged it at {at}; nothing was sent again"),
            ),
            Err(e) => return Err(self.tool_error(e, Doing::Sending).await),
        };
        Ok(Json(AcknowledgeResult {
            message_id: id.to_string(),
            status: status.into(),
            detail,
        }))
    }
}
