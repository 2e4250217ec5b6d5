//! The gateway's HTTP side: `POST /tools/invoke` with `sessions_send` (deliver) and
//! `sessions_history` (was it delivered?), and what every answer means for the owner.
//!
//! HTTP 200 is not success: the gateway answers tool errors with 200 too. Success is
//! `result.details.status == "accepted"`.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::openclaw::{GatewayUrl, Token, TokenSource};
use crate::doorbell::frame::one_line;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole request may take (`sessions_send` with `timeoutSeconds: 0` answers at
/// once; a busy gateway on a small machine can still take seconds).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The history entries searched for a marker (the newest).
const HISTORY_LIMIT: u32 = 50;
/// The longest error text kept from an answer.
const ERROR_CHARS: usize = 300;
/// The longest wait a `Retry-After` may ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// The fence that opens the sender's words in a framed message (see `frame`).
const FENCE: &str = "<<<mailslot-untrusted";

/// What a delivery attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The gateway admitted the message into the session.
    Accepted {
        /// The run it started, if the gateway said.
        run_id: Option<String>,
    },
    /// The session does not exist yet (it is created over the WebSocket, then sent again).
    NoSession,
    /// It failed.
    Failed(Failure),
}

/// Why a request to the gateway failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// 404 `Tool not available`: the tool is not exposed over HTTP.
    NotAllowed {
        /// The tool.
        tool: &'static str,
    },
    /// 401: the token was refused.
    BadToken,
    /// The token could not be read (the text says what to fix).
    NoToken(String),
    /// 503: the gateway is starting.
    Starting {
        /// Its `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 429: too many requests.
    RateLimited {
        /// Its `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// 200 with `details.status == "error"`: the tool ran and refused.
    Rejected(String),
    /// The session could not be created over the WebSocket.
    Session(String),
    /// A 4xx that sending again will not change (bad request, too large).
    Refused {
        /// The HTTP status.
        status: u16,
        /// The gateway's message.
        message: String,
    },
    /// 404 from something that is not the gateway's tool endpoint.
    NotFound(String),
    /// Nothing was sent (connection refused, DNS, TLS).
    Unreachable(String),
    /// The request may have arrived (timeout, 5xx, reset after sending, an answer of unknown
    /// shape): check the session before sending again.
    Ambiguous(String),
}

impl Failure {
    /// One sentence for the owner: what happened and what to do.
    pub fn describe(&self, url: &GatewayUrl, token: &TokenSource) -> String {
        match self.fix(token) {
            Some(fix) => format!("{}: {fix}", self.what(url)),
            None => self.what(url),
        }
    }

    /// What happened.
    pub fn what(&self, url: &GatewayUrl) -> String {
        match self {
            Failure::NotAllowed { tool } => format!(
                "the OpenClaw gateway at {url} does not allow {tool} over HTTP (404 Tool not available)"
            ),
            Failure::BadToken => {
                format!("the OpenClaw gateway at {url} refused the token (401 Unauthorized)")
            }
            Failure::NoToken(why) => why.clone(),
            Failure::Starting { .. } => {
                format!("the OpenClaw gateway at {url} is still starting (503 Service Unavailable)")
            }
            Failure::RateLimited { retry_after } => format!(
                "the OpenClaw gateway at {url} is rate limiting mailslot (429 Too Many Requests, retry in {} s)",
                retry_after
                    .unwrap_or(Duration::from_secs(1))
                    .as_secs()
                    .max(1)
            ),
            Failure::Rejected(error) => {
                format!("the OpenClaw gateway at {url} did not accept the message: {error}")
            }
            Failure::Session(why) => format!("cannot create the OpenClaw session: {why}"),
            Failure::Refused { status, message } => {
                format!("the OpenClaw gateway at {url} refused the request ({status}: {message})")
            }
            Failure::NotFound(message) => format!(
                "{} answered 404 Not Found ({message})",
                url.join("tools/invoke")
            ),
            Failure::Unreachable(why) => {
                format!("cannot reach the OpenClaw gateway at {url} ({why})")
            }
            Failure::Ambiguous(why) => format!(
                "no clear answer from the OpenClaw gateway at {url} ({why}); the message may have arrived, so its session is checked before sending again"
            ),
        }
    }

    /// What the owner should do, when there is something to do.
    pub fn fix(&self, token: &TokenSource) -> Option<String> {
        Some(match self {
            Failure::NotAllowed { tool } => format!(
                "add {tool} to gateway.tools.allow in openclaw.json (the gateway reloads it by itself)"
            ),
            Failure::BadToken => format!(
                "put the gateway's token (gateway.auth.token in openclaw.json) in {}",
                token.describe()
            ),
            Failure::Starting { .. } => "wait until it is ready; mailslot retries".into(),
            Failure::NotFound(_) => {
                "set openclaw.gateway_url to the gateway's address, like http://127.0.0.1:18789"
                    .into()
            }
            Failure::Unreachable(_) => {
                "start the gateway (openclaw gateway), or correct openclaw.gateway_url".into()
            }
            _ => return None,
        })
    }

    /// Whether sending again may help (config that can be fixed while mailslot runs counts:
    /// the gateway reloads `openclaw.json`, and the token is read again).
    pub fn retryable(&self) -> bool {
        !matches!(self, Failure::Refused { .. })
    }

    /// Whether the message may have arrived although the attempt failed.
    pub fn ambiguous(&self) -> bool {
        matches!(self, Failure::Ambiguous(_))
    }

    /// How long the gateway asked us to wait.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Starting { retry_after } | Failure::RateLimited { retry_after } => {
                *retry_after
            }
            _ => None,
        }
    }
}

/// The HTTP client for one gateway.
pub struct Gateway {
    http: reqwest::Client,
    url: GatewayUrl,
    source: TokenSource,
    /// Read when first needed, and again after a 401 (the owner may have fixed it).
    token: Mutex<Option<Token>>,
}

impl Gateway {
    /// A client for `url` with the token from `source`.
    pub fn new(url: GatewayUrl, source: TokenSource) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("mailslot/", env!("CARGO_PKG_VERSION")));
        if url.is_loopback() {
            builder = builder.no_proxy();
        }
        let tls = crate::tls::http_tls(url.is_tls())?;
        builder = builder.tls_backend_preconfigured(tls);
        let http = builder
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
        Ok(Self {
            http,
            url,
            source,
            token: Mutex::new(None),
        })
    }

    /// The gateway's address.
    pub fn url(&self) -> &GatewayUrl {
        &self.url
    }

    /// Where the token comes from.
    pub fn token_source(&self) -> &TokenSource {
        &self.source
    }

    /// The token, read now if not yet (or since a 401).
    pub fn token(&self) -> Result<Token, Failure> {
        let mut cached = self.token.lock().expect("not poisoned");
        if let Some(t) = cached.as_ref() {
            return Ok(t.clone());
        }
        let token = self.source.read().map_err(Failure::NoToken)?;
        *cached = Some(token.clone());
        Ok(token)
    }

    /// Forgets the token so the next request reads it again.
    pub fn forget_token(&self) {
        *self.token.lock().expect("not poisoned") = None;
    }

    /// Delivers `message` into the session `key`, as that session itself (the top-level
    /// `sessionKey`): otherwise the caller would be the user's main session and OpenClaw
    /// would run its agent-to-agent reply loop.
    pub async fn send(&self, key: &str, message: &str) -> Sent {
        let body = json!({
            "tool": "sessions_send",
            "sessionKey": key,
            "args": { "sessionKey": key, "message": message, "timeoutSeconds": 0 },
        });
        match self.invoke(&body).await {
            Ok((status, retry_after, bytes)) => {
                classify_send(status, retry_after.as_deref(), &bytes)
            }
            Err(f) => Sent::Failed(f),
        }
    }

    /// Whether the session `key` already holds a message carrying `marker` (in its newest
    /// history, or waiting as pending input). A missing session holds nothing.
    pub async fn history_has(&self, key: &str, marker: &str) -> Result<bool, Failure> {
        let body = json!({
            "tool": "sessions_history",
            "sessionKey": key,
            "args": { "sessionKey": key, "limit": HISTORY_LIMIT },
        });
        let (status, retry_after, bytes) = self.invoke(&body).await?;
        if status != 200 {
            return Err(classify_status(
                status,
                retry_after.as_deref(),
                &bytes,
                "sessions_history",
            ));
        }
        let value: Value = serde_json::from_slice(&bytes).map_err(|_| {
            Failure::Ambiguous("sessions_history answered something that is not JSON".into())
        })?;
        let details = &value["result"]["details"];
        if details["status"] == "error" {
            let error = error_text(details);
            return if error.starts_with("No session found") {
                Ok(false)
            } else {
                Err(Failure::Rejected(error))
            };
        }
        if !details.is_object() {
            return Err(Failure::Ambiguous(
                "sessions_history answered without details".into(),
            ));
        }
        Ok(history_has_marker(details, marker))
    }

    /// Checks the token and that `sessions_send` is exposed, without sending anything: a
    /// call without arguments is refused with 400 when all is well.
    pub async fn probe_send(&self) -> Result<(), Failure> {
        let body = json!({ "tool": "sessions_send", "args": {} });
        let (status, retry_after, bytes) = self.invoke(&body).await?;
        match status {
            400 => Ok(()),
            200 => Err(Failure::Ambiguous(
                "sessions_send without arguments was accepted, which this gateway version should not do".into(),
            )),
            _ => Err(classify_status(status, retry_after.as_deref(), &bytes, "sessions_send")),
        }
    }

    /// `GET /readyz`: `Ok(true)` when ready, `Ok(false)` while starting.
    pub async fn ready(&self) -> Result<bool, Failure> {
        let response = self
            .http
            .get(self.url.join("readyz"))
            .send()
            .await
            .map_err(|e| transport_failure(&e))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            200 => Ok(body["ready"] != false),
            503 => Ok(false),
            404 => Err(Failure::NotFound("no /readyz".into())),
            other => Err(Failure::Refused {
                status: other,
                message: "GET /readyz".into(),
            }),
        }
    }

    /// One `POST /tools/invoke`: (status, `Retry-After`, body).
    async fn invoke(&self, body: &Value) -> Result<(u16, Option<String>, Vec<u8>), Failure> {
        let token = self.token()?;
        let response = self
            .http
            .post(self.url.join("tools/invoke"))
            .bearer_auth(token.expose())
            .json(body)
            .send()
            .await
            .map_err(|e| transport_failure(&e))?;
        let status = response.status().as_u16();
        if status == 401 {
            self.forget_token();
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Failure::Ambiguous(format!("the answer broke off: {}", chain(&e))))?;
        Ok((status, retry_after, bytes.to_vec()))
    }
}

/// A failed request: refused before anything was sent, or possibly delivered.
fn transport_failure(e: &reqwest::Error) -> Failure {
    if e.is_connect() {
        Failure::Unreachable(chain(e))
    } else if e.is_timeout() {
        Failure::Ambiguous(format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()))
    } else {
        Failure::Ambiguous(chain(e))
    }
}

/// An error with its causes, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    one_line(&text, ERROR_CHARS)
}

/// What an answer to `sessions_send` means.
pub fn classify_send(status: u16, retry_after: Option<&str>, body: &[u8]) -> Sent {
    if status != 200 {
        return Sent::Failed(classify_status(status, retry_after, body, "sessions_send"));
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return Sent::Failed(Failure::Ambiguous("a 200 answer that is not JSON".into()));
    };
    if value["ok"] == false {
        return Sent::Failed(Failure::Rejected(error_text(&value)));
    }
    let details = &value["result"]["details"];
    match details["status"].as_str() {
        Some("accepted") => Sent::Accepted {
            run_id: details["runId"].as_str().map(str::to_owned),
        },
        Some("error") => {
            let error = error_text(details);
            if error.starts_with("No session found") {
                Sent::NoSession
            } else {
                Sent::Failed(Failure::Rejected(error))
            }
        }
        other => Sent::Failed(Failure::Ambiguous(format!(
            "a 200 answer with details.status {}",
            other.map_or_else(
                || "missing".to_owned(),
                |s| format!("{:?}", one_line(s, 40))
            )
        ))),
    }
}

/// What a status other than 200 means, for a request about `tool`.
fn classify_status(
    status: u16,
    retry_after: Option<&str>,
    body: &[u8],
    tool: &'static str,
) -> Failure {
    let message = serde_json::from_slice::<Value>(body)
        .map(|v| error_text(&v))
        .unwrap_or_else(|_| one_line(&String::from_utf8_lossy(body), ERROR_CHARS));
    let retry_after = retry_after.and_then(parse_retry_after);
    match status {
        401 => Failure::BadToken,
        // Blocked by the gateway's tool policy, which the owner can change.
        403 => Failure::Rejected(format!("403 Forbidden: {message}")),
        404 if message.contains("Tool not available") => Failure::NotAllowed { tool },
        404 => Failure::NotFound(if message.is_empty() {
            "no such page".into()
        } else {
            message
        }),
        429 => Failure::RateLimited { retry_after },
        503 => Failure::Starting { retry_after },
        // The body was not read in time: nothing ran.
        408 => Failure::Unreachable("the gateway timed out reading the request".into()),
        400..=499 => Failure::Refused { status, message },
        _ => Failure::Ambiguous(format!(
            "HTTP {status}{}",
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        )),
    }
}

/// The error text of an answer: `error.message`, `error` as text, or `message`.
fn error_text(value: &Value) -> String {
    let text = value["error"]["message"]
        .as_str()
        .or_else(|| value["error"].as_str())
        .or_else(|| value["message"].as_str())
        .unwrap_or_default();
    one_line(text, ERROR_CHARS)
}

/// `Retry-After` in seconds or as an HTTP date, at most five minutes.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let wait = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
        let secs = at.as_second() - jiff::Timestamp::now().as_second();
        Duration::from_secs(secs.max(0) as u64)
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// Whether `details` (a `sessions_history` result) holds a message that carries `marker` in
/// the part mailslot wrote: its first line, or the start of a line before the fence that
/// opens the sender's words. (The sender controls the subject, but the subject never starts
/// a line, and its body is inside the fence.)
pub fn history_has_marker(details: &Value, marker: &str) -> bool {
    let messages = details["messages"].as_array().into_iter().flatten();
    let pending = details["pendingInputs"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| &item["message"]);
    messages
        .chain(pending)
        .any(|m| texts(&m["content"]).any(|t| carries_marker(t, marker)))
}

/// The texts of a message's `content` (a string, or parts with `text`).
fn texts(content: &Value) -> Box<dyn Iterator<Item = &str> + '_> {
    match content {
        Value::String(s) => Box::new(std::iter::once(s.as_str())),
        Value::Array(parts) => Box::new(parts.iter().filter_map(|p| p["text"].as_str())),
        _ => Box::new(std::iter::empty()),
    }
}

/// See [`history_has_marker`].
pub fn carries_marker(text: &str, marker: &str) -> bool {
    let ours = text.split(FENCE).next().unwrap_or_default();
    let mut lines = ours.lines();
    lines.next().is_some_and(|first| first.contains(marker))
        || lines.any(|line| line.starts_with(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(status: u16, body: &str) -> Sent {
        classify_send(status, None, body.as_bytes())
    }

    #[test]
    fn only_accepted_is_success() {
        let ok = r#"{"ok":true,"result":{"details":{"runId":"r1","status":"accepted","sessionKey":"k"}}}"#;
        assert_eq!(
            send(200, ok),
            Sent::Accepted {
                run_id: Some("r1".into())
            }
        );
        let missing = r#"{"ok":true,"result":{"details":{"status":"error","error":"No session found: agent:main:dm:mailbox-bob"}}}"#;
        assert_eq!(send(200, missing), Sent::NoSession);
        let other =
            r#"{"ok":true,"result":{"details":{"status":"error","error":"Session is archived"}}}"#;
        assert_eq!(
            send(200, other),
            Sent::Failed(Failure::Rejected("Session is archived".into()))
        );
        assert!(matches!(
            send(
                200,
                r#"{"ok":true,"result":{"details":{"status":"timeout"}}}"#
            ),
            Sent::Failed(Failure::Ambiguous(_))
        ));
        assert!(matches!(
            send(200, "<html>"),
            Sent::Failed(Failure::Ambiguous(_))
        ));
        assert!(
            matches!(send(200, r#"{"ok":false,"error":{"message":"nope"}}"#), Sent::Failed(Failure::Rejected(m)) if m == "nope")
        );
    }

    #[test]
    fn statuses_map_to_what_the_owner_must_do() {
        let url = GatewayUrl::parse("http://127.0.0.1:18789").unwrap();
        let source = TokenSource::Env("OPENCLAW_GATEWAY_TOKEN".into());
        let not_allowed = send(
            404,
            r#"{"ok":false,"error":{"type":"not_found","message":"Tool not available: sessions_send"}}"#,
        );
        let Sent::Failed(f) = not_allowed else {
            panic!()
        };
        assert_eq!(
            f,
            Failure::NotAllowed {
                tool: "sessions_send"
            }
        );
        assert!(
            f.describe(&url, &source)
                .contains("add sessions_send to gateway.tools.allow in openclaw.json")
        );
        assert!(f.retryable() && !f.ambiguous());

        let Sent::Failed(f) = send(
            401,
            r#"{"error":{"message":"Unauthorized","type":"unauthorized"}}"#,
        ) else {
            panic!()
        };
        assert_eq!(f, Failure::BadToken);
        assert!(
            f.describe(&url, &source)
                .contains("the environment variable OPENCLAW_GATEWAY_TOKEN")
        );

        let Sent::Failed(f) = classify_send(429, Some("7"), b"{}") else {
            panic!()
        };
        assert_eq!(f.retry_after(), Some(Duration::from_secs(7)));
        assert!(f.describe(&url, &source).contains("retry in 7 s"));
        let Sent::Failed(f) = classify_send(503, None, b"") else {
            panic!()
        };
        assert!(matches!(f, Failure::Starting { retry_after: None }));
        assert!(f.describe(&url, &source).contains("starting"));

        for status in [500, 502, 504] {
            let Sent::Failed(f) = send(status, "oops") else {
                panic!()
            };
            assert!(f.ambiguous(), "{status}");
        }
        for status in [400, 413] {
            let Sent::Failed(f) = send(
                status,
                r#"{"ok":false,"error":{"type":"tool_error","message":"message required"}}"#,
            ) else {
                panic!()
            };
            assert!(!f.retryable(), "{status}");
            assert!(f.describe(&url, &source).contains("message required"));
        }
        let Sent::Failed(f) = send(404, "Not Found") else {
            panic!()
        };
        assert!(f.describe(&url, &source).contains("openclaw.gateway_url"));
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date_is_bounded() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn the_marker_counts_only_where_mailslot_wrote_it() {
        let marker = "[mailslot:0192f0c4-0000-7000-8000-000000000001]";
        let ours = format!(
            "{marker} New mail for bob\n[mailslot message x]\nSubject: hi\n<<<mailslot-untrusted n>>>\nbody\n<<<end mailslot-untrusted n>>>"
        );
        assert!(carries_marker(&ours, marker));
        // OpenClaw may put a header in front of the first line.
        assert!(carries_marker(
            &format!("[Sun 2026-11-22 12:18 UTC] {ours}"),
            marker
        ));
        // A sender cannot fake it: not in the subject (never starts a line) nor the body.
        let fake_subject =
            format!("[mailslot:other] New mail\nSubject: {marker}\n<<<mailslot-untrusted n>>>\nx");
        assert!(!carries_marker(&fake_subject, marker));
        let fake_body =
            format!("[mailslot:other] New mail\n<<<mailslot-untrusted n>>>\n{marker}\n");
        assert!(!carries_marker(&fake_body, marker));

        let details = json!({
            "messages": [
                { "role": "assistant", "content": [{ "type": "text", "text": "Noted." }] },
                { "role": "user", "content": fake_body },
            ],
            "pendingInputs": { "items": [], "total": 0 },
        });
        assert!(!history_has_marker(&details, marker));
        let with_pending = json!({
            "messages": [],
            "pendingInputs": { "items": [{ "state": "queued", "message": { "role": "user", "content": ours } }] },
        });
        assert!(history_has_marker(&with_pending, marker));
        let in_parts = json!({ "messages": [{ "content": [{ "type": "text", "text": ours }] }] });
        assert!(history_has_marker(&in_parts, marker));
    }
}
