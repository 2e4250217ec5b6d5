//! A loopback mock of a model API for real LLM clients: the Anthropic Messages API (Claude
//! Code) or the OpenAI Responses API (Codex). It hands each turn of the main conversation to
//! the test (each request holds the whole conversation, so it is exactly what the model would
//! see), which answers with text or a tool call. Side requests (no
//! tools: titles, summaries) get a short text at once.

use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

/// How long a turn waits for the test's answer before the mock answers "ok" itself.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// Which API the mock speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `POST /v1/messages`, streamed as the Messages API's server-sent events.
    Anthropic,
    /// `POST /v1/responses`, streamed as the Responses API's server-sent events.
    OpenAiResponses,
}

/// What the mock model answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A text answer that ends the turn.
    Text(String),
    /// A call of `name` with `input`. For the Responses API an MCP tool's name is
    /// `mcp__<server>__<tool>`: its namespace, then the tool.
    Tool { name: String, input: Value },
}

impl Reply {
    pub fn text(text: &str) -> Self {
        Self::Text(text.to_owned())
    }

    pub fn tool(name: &str, input: Value) -> Self {
        Self::Tool {
            name: name.to_owned(),
            input,
        }
    }
}

/// One model request of the main conversation, waiting for its answer.
pub struct Turn {
    /// The request body.
    pub request: Value,
    reply: oneshot::Sender<Reply>,
}

impl Turn {
    /// The whole request as text: what the model sees, to search.
    pub fn text(&self) -> String {
        self.request.to_string()
    }

    /// How often `needle` occurs in the request.
    pub fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }

    /// The newest user message (the newest input, tool results included). Claude Code may
    /// put a system message after it.
    pub fn last_message(&self) -> &Value {
        self.request["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .expect("a request has a user message")
    }

    /// The newest user message as text.
    pub fn last_text(&self) -> String {
        self.last_message().to_string()
    }

    /// The newest user message and what Claude Code put after it (hook context comes as
    /// system messages), as text.
    pub fn since_last_user(&self) -> String {
        let messages = self.request["messages"].as_array().expect("messages");
        let from = messages
            .iter()
            .rposition(|m| m["role"] == "user")
            .unwrap_or(0);
        Value::from(messages[from..].to_vec()).to_string()
    }

    /// The request's messages as text, cut for a failure message.
    pub fn excerpt(&self) -> String {
        let text = self.request["messages"].to_string();
        match text.char_indices().nth(6000) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        }
    }

    pub fn answer(self, reply: Reply) {
        let _ = self.reply.send(reply);
    }
}

#[derive(Clone)]
struct Mock {
    wire: Wire,
    turns: mpsc::UnboundedSender<Turn>,
}

/// The running mock.
pub struct ModelApi {
    /// Its base URL, for `ANTHROPIC_BASE_URL`.
    pub url: String,
    turns: mpsc::UnboundedReceiver<Turn>,
}

impl ModelApi {
    /// Starts the mock on a free loopback port.
    pub async fn start(wire: Wire) -> Self {
        let (tx, turns) = mpsc::unbounded_channel();
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(Mock { wire, turns: tx });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { url, turns }
    }

    /// The next turn of the main conversation (fails the test after `timeout`).
    pub async fn next_turn(&mut self, timeout: Duration) -> Turn {
        self.turn_within(timeout)
            .await
            .expect("the client asked the model nothing in time")
    }

    /// The next turn of the main conversation if one comes within `wait`.
    pub async fn turn_within(&mut self, wait: Duration) -> Option<Turn> {
        tokio::time::timeout(wait, self.turns.recv())
            .await
            .ok()
            .map(|turn| turn.expect("the mock is running"))
    }

    /// Turns that already came and wait for an answer, without waiting.
    pub fn pending_turn(&mut self) -> Option<Turn> {
        self.turns.try_recv().ok()
    }
}

/// Whether `request` is a turn of the main conversation (it offers the agent its tools).
fn is_main(request: &Value) -> bool {
    request["tools"].as_array().is_some_and(|t| !t.is_empty())
}

async fn answer(State(mock): State<Mock>, uri: axum::http::Uri, body: String) -> Response {
    if uri.path().ends_with("/count_tokens") {
        return axum::Json(json!({ "input_tokens": 100 })).into_response();
    }
    let Ok(request) = serde_json::from_str::<Value>(&body) else {
        return (axum::http::StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let reply = if is_main(&request) {
        let (tx, rx) = oneshot::channel();
        let _ = mock.turns.send(Turn {
            request: request.clone(),
            reply: tx,
        });
        tokio::time::timeout(ANSWER_TIMEOUT, rx)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| Reply::text("ok"))
    } else {
        Reply::text("ok")
    };
    let model = request["model"].as_str().unwrap_or("mock-model").to_owned();
    match mock.wire {
        Wire::Anthropic if request["stream"] == true => stream(&model, &reply),
        Wire::Anthropic => axum::Json(message(&model, &reply)).into_response(),
        Wire::OpenAiResponses => responses_stream(&reply),
    }
}

fn block(reply: &Reply) -> Value {
    match reply {
        Reply::Text(text) => json!({ "type": "text", "text": text }),
        Reply::Tool { name, input } => json!({
            "type": "tool_use",
            "id": format!("toolu_{}", uuid::Uuid::now_v7().simple()),
            "name": name,
            "input": input,
        }),
    }
}

fn stop_reason(reply: &Reply) -> &'static str {
    match reply {
        Reply::Text(_) => "end_turn",
        Reply::Tool { .. } => "tool_use",
    }
}

fn message(model: &str, reply: &Reply) -> Value {
    json!({
        "id": format!("msg_{}", uuid::Uuid::now_v7().simple()),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block(reply)],
        "stop_reason": stop_reason(reply),
        "stop_sequence": null,
        "usage": { "input_tokens": 100, "output_tokens": 10 },
    })
}

fn event_stream(body: String) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(axum::body::Body::from(body))
        .unwrap()
}

/// The reply as the Responses API streams it: the finished output item, then the end.
fn responses_stream(reply: &Reply) -> Response {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let item = match reply {
        Reply::Text(text) => json!({
            "type": "message", "role": "assistant", "id": format!("msg_{id}"),
            "content": [{ "type": "output_text", "text": text, "annotations": [] }],
        }),
        Reply::Tool { name, input } => {
            let (namespace, tool) = name.rsplit_once("__").unwrap_or(("", name));
            let mut call = json!({
                "type": "function_call", "id": format!("fc_{id}"), "call_id": format!("call_{id}"),
                "name": tool, "arguments": input.to_string(),
            });
            if !namespace.is_empty() {
                call["namespace"] = json!(namespace);
            }
            call
        }
    };
    let events = [
        json!({ "type": "response.created", "response": { "id": format!("resp_{id}") } }),
        json!({ "type": "response.output_item.done", "output_index": 0, "item": item }),
        json!({ "type": "response.completed", "response": { "id": format!("resp_{id}") } }),
    ];
    event_stream(
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect(),
    )
}

/// The reply as the Messages API streams it (server-sent events).
fn stream(model: &str, reply: &Reply) -> Response {
    let mut start = message(model, reply);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    let full = block(reply);
    let (first, delta) = match reply {
        Reply::Text(text) => (
            json!({ "type": "text", "text": "" }),
            json!({ "type": "text_delta", "text": text }),
        ),
        Reply::Tool { input, .. } => {
            let mut first = full.clone();
            first["input"] = json!({});
            (
                first,
                json!({ "type": "input_json_delta", "partial_json": input.to_string() }),
            )
        }
    };
    let events = [
        (
            "message_start",
            json!({ "type": "message_start", "message": start }),
        ),
        (
            "content_block_start",
            json!({ "type": "content_block_start", "index": 0, "content_block": first }),
        ),
        (
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": 0, "delta": delta }),
        ),
        (
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": 0 }),
        ),
        (
            "message_delta",
            json!({
                "type": "message_delta",
                "delta": { "stop_reason": stop_reason(reply), "stop_sequence": null },
                "usage": { "output_tokens": 10 },
            }),
        ),
        ("message_stop", json!({ "type": "message_stop" })),
    ];
    event_stream(
        events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect(),
    )
}
