//! The router and its handlers. GETs only read (through the mailbox's store handle, and the
//! relay for consent); the one POST changes consent. Every route sits behind
//! [`super::auth::check`], and every answer carries headers that keep the page to itself: a
//! Content-Security-Policy allowing only the dashboard's own script and style, no framing, no
//! referrer to other sites, no caching.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::Markup;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::agents::Agents;
use super::auth::{self, Auth};
use super::consent;
use super::flash::{Flash, Flashes};
use super::form;
use super::live;
use super::pages::{self, AgentRow, Notice};
use super::relay_status;
use super::tell;
use crate::client::RelayUrl;
use crate::mailbox::{AgentStatus, Mailbox, RelayStatus};
use crate::protocol::{AgentName, MessageId, ThreadId};
use crate::store::MAX_QUERY_CHARS;

/// Received messages listed on an inbox page.
const INBOX_PAGE: usize = 50;
/// Messages a search lists, best first.
const SEARCH_LIMIT: usize = 50;
/// Sent messages listed.
const SENT_LIMIT: usize = 200;
/// Memories listed.
const MEMORY_LIMIT: usize = 100;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON: &[u8] = include_bytes!("assets/favicon.ico");

/// Everything the handlers share.
pub struct App {
    /// This launch's secrets.
    pub auth: Arc<Auth>,
    /// The agents of this home, running.
    pub agents: Arc<Agents>,
    /// Their relay.
    pub relay: RelayUrl,
    /// The owner key file of this home.
    pub owner_key: PathBuf,
    /// For the relay's `/healthz` and `/metrics`.
    pub http: reqwest::Client,
    /// Fires when the dashboard stops (ends the live streams).
    pub stop: CancellationToken,
    /// What the last consent changes said, for the pages they redirect to.
    pub flashes: Flashes,
}

/// The handlers' state.
pub type AppState = Arc<App>;

/// `GET /events`: new mail, live.
async fn events(State(app): State<AppState>) -> Result<Response, PageError> {
    let agents = app.agents.all().await.map_err(internal)?;
    Ok(live::events(&agents, app.stop.clone()).into_response())
}

/// Every route, behind the auth check and the security headers.
pub fn router(app: AppState) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/relay", get(relay))
        .route("/events", get(events))
        .route("/static/app.js", get(app_js))
        .route("/static/app.css", get(app_css))
        .route("/favicon.ico", get(favicon))
        .route("/agents/{agent}", get(inbox))
        .route("/agents/{agent}/search", get(search))
        .route("/agents/{agent}/sent", get(sent))
        .route("/agents/{agent}/contacts", get(contacts))
        .route("/agents/{agent}/consent", post(change_consent))
        .route("/agents/{agent}/tell", post(owner_tells))
        .route("/agents/{agent}/memories", get(memories))
        .route("/agents/{agent}/messages/{id}", get(message))
        .route(
            "/agents/{agent}/messages/{id}/attachments/{index}",
            get(attachment),
        )
        .route("/agents/{agent}/threads/{id}", get(thread))
        .layer(middleware::from_fn_with_state(
            app.auth.clone(),
            auth::check,
        ))
        .layer(middleware::from_fn(security_headers))
        .with_state(app)
}

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not `no-referrer`: under it Chromium sends `Origin: null` with the page's own forms.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A page that could not be shown.
struct PageError(StatusCode, String);

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        (
            self.0,
            pages::error(self.0.canonical_reason().unwrap_or("Error"), &self.1),
        )
            .into_response()
    }
}

fn internal(e: impl std::fmt::Display) -> PageError {
    PageError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

fn not_found(what: String) -> PageError {
    PageError(StatusCode::NOT_FOUND, what)
}

type Page = Result<Markup, PageError>;

async fn agent(app: &App, name: &str) -> Result<(AgentName, Mailbox), PageError> {
    let unknown = || not_found(format!("no agent named {name:?} on this machine"));
    let name = AgentName::new(name).map_err(|_| unknown())?;
    match app.agents.get(&name).await.map_err(internal)? {
        Some(mailbox) => Ok((name, mailbox)),
        None => Err(unknown()),
    }
}

fn message_id(raw: &str) -> Result<MessageId, PageError> {
    raw.parse()
        .map_err(|_| not_found(format!("{raw:?} is not a message id")))
}

async fn rows(app: &App) -> Result<Vec<AgentRow>, PageError> {
    let mut rows = Vec::new();
    for (name, mailbox) in app.agents.all().await.map_err(internal)? {
        let AgentStatus {
            identity,
            current_task: task,
        } = mailbox.agent_status().await.map_err(internal)?;
        let unread = mailbox.unread_summary().await.map_err(internal)?.count;
        let status = mailbox.status();
        rows.push(AgentRow {
            name: name.clone(),
            fingerprint: mailbox.identity().fingerprint(),
            identity,
            task,
            online: matches!(status, RelayStatus::Online | RelayStatus::Elsewhere { .. }),
            status: status.describe(&app.relay),
            unread,
        });
    }
    Ok(rows)
}

async fn index(State(app): State<AppState>) -> Page {
    Ok(pages::agents(app.relay.as_str(), &rows(&app).await?))
}

async fn relay(State(app): State<AppState>) -> Page {
    let report = relay_status::read(&app.http, &app.relay).await;
    Ok(pages::relay(
        app.relay.as_str(),
        &report,
        &rows(&app).await?,
    ))
}

async fn app_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        APP_JS,
    )
}

async fn app_css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS)
}

async fn favicon() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "image/x-icon")], FAVICON)
}

#[derive(Deserialize)]
struct Cursor {
    #[serde(default)]
    before: Option<String>,
    /// What the owner's message from this page said (`owner_tells`).
    #[serde(default)]
    flash: Option<String>,
}

async fn inbox(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(cursor): Query<Cursor>,
) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let before = cursor
        .before
        .as_deref()
        .filter(|b| !b.is_empty())
        .map(message_id)
        .transpose()?;
    let page = mailbox
        .received_page(before, INBOX_PAGE)
        .await
        .map_err(internal)?;
    let items = page.items;
    let older = (page.more > 0)
        .then(|| items.last().map(|m| m.message.id))
        .flatten();
    let (total, unread) = mailbox.received_counts().await.map_err(internal)?;
    let flash = cursor.flash.and_then(|k| app.flashes.take(&k));
    Ok(pages::inbox(
        &name,
        &pages::InboxPage {
            total,
            unread,
            items: &items,
            before,
            older,
            csrf: app.auth.csrf().to_owned(),
            notice: flash.as_ref().map(|f| &f.notice),
        },
    ))
}

/// `POST /agents/NAME/tell`: the owner's message to the agent, signed with the owner key the
/// form's passphrase unlocks, then `303 See Other` to the inbox page, which shows what
/// happened (Post/Redirect/Get: a reload never posts again).
async fn owner_tells(
    State(app): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, PageError> {
    let (name, mailbox) = agent(&app, &name).await?;
    // The body holds the passphrase: read into wiped buffers only (`tell.rs`, `form.rs`).
    let form = tell::read_form(body).await;
    if let Ok(form) = &form
        && !app.auth.csrf_matches(&form.csrf)
    {
        return Err(PageError(
            StatusCode::FORBIDDEN,
            consent::ActionError::Csrf.to_string(),
        ));
    }
    let outcome = match form {
        Ok(form) => tell::tell(&mailbox, &app.owner_key, form).await,
        Err(e) => Err(e.into()),
    };
    let notice = match outcome {
        Ok(id) => Notice::Done(format!(
            "Told {name}: message {id}, signed with your owner key. Its sessions show it as your words."
        )),
        Err(e) => Notice::Failed(e.to_string()),
    };
    let key = app.flashes.put(Flash {
        notice,
        kept_code: None,
    });
    Ok(Redirect::to(&format!("/agents/{name}?flash={key}")).into_response())
}

async fn search(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(search): Query<Search>,
) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let query: String = search.q.trim().chars().take(MAX_QUERY_CHARS).collect();
    let found = if query.is_empty() {
        Vec::new()
    } else {
        mailbox
            .search(query.clone(), SEARCH_LIMIT)
            .await
            .map_err(internal)?
            .messages
    };
    Ok(pages::search(&name, &query, &found, SEARCH_LIMIT))
}

async fn message(State(app): State<AppState>, Path((name, id)): Path<(String, String)>) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let id = message_id(&id)?;
    // Reading here does not mark the message read: unread is the agent's state, and a GET
    // changes nothing.
    match mailbox.message_and_sender(id).await.map_err(internal)? {
        Some((stored, contact)) => Ok(pages::message(&name, &stored, contact.as_ref())),
        None => Err(not_found(format!("{name} has no message {id}"))),
    }
}

async fn attachment(
    State(app): State<AppState>,
    Path((name, id, index)): Path<(String, String, usize)>,
) -> Result<Response, PageError> {
    let (name, mailbox) = agent(&app, &name).await?;
    let id = message_id(&id)?;
    let Some(file) = mailbox.attachment(id, index).await.map_err(internal)? else {
        return Err(not_found(format!(
            "{name} has no message {id} with an attachment {index}"
        )));
    };
    // Always a download of opaque bytes: the sender's media type and file name never make
    // the browser render it here.
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"attachment-{index}\""),
            ),
        ],
        file.bytes,
    )
        .into_response())
}

async fn thread(State(app): State<AppState>, Path((name, id)): Path<(String, String)>) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let id: ThreadId = id
        .parse()
        .map_err(|_| not_found(format!("{id:?} is not a thread id")))?;
    let items: Vec<_> = mailbox
        .thread(id)
        .await
        .map_err(internal)?
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    if items.is_empty() {
        return Err(not_found(format!("{name} has no thread {id}")));
    }
    Ok(pages::thread(&name, &items))
}

async fn sent(State(app): State<AppState>, Path(name): Path<String>) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let items = mailbox.sent(None, SENT_LIMIT).await.map_err(internal)?;
    Ok(pages::sent(&name, &items))
}

#[derive(Deserialize)]
struct FlashKey {
    #[serde(default)]
    flash: Option<String>,
}

async fn contacts(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(key): Query<FlashKey>,
) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let flash = key.flash.and_then(|k| app.flashes.take(&k));
    let consent = consent::read(&mailbox, &app.relay, &app.owner_key)
        .await
        .map_err(|e| e.to_string());
    let pinned = mailbox.pinned_contacts().await.map_err(internal)?;
    Ok(pages::contacts(
        &name,
        &consent,
        &pinned,
        &pages::ContactsPage {
            csrf: app.auth.csrf(),
            notice: flash.as_ref().map(|f| &f.notice),
            kept_code: flash.as_ref().and_then(|f| f.kept_code.as_ref()),
        },
    ))
}

/// `POST /agents/NAME/consent`: the change, then `303 See Other` to the contacts page, which
/// shows what happened (Post/Redirect/Get: a reload never posts again).
async fn change_consent(
    State(app): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, PageError> {
    let (name, mailbox) = agent(&app, &name).await?;
    // The body holds the passphrase: read into wiped buffers only (`form.rs`).
    let form = form::read_form(body).await;
    if let Ok(form) = &form
        && !app.auth.csrf_matches(&form.csrf)
    {
        return Err(PageError(
            StatusCode::FORBIDDEN,
            consent::ActionError::Csrf.to_string(),
        ));
    }
    let (outcome, kept_code) = match form {
        Ok(form) => {
            let typed = match &form.action {
                form::Action::Approve(requester) => Some((requester.clone(), form.code.clone())),
                _ => None,
            };
            let outcome = consent::apply(&mailbox, &app.relay, &app.owner_key, form).await;
            // The code is offered again only when the approval failed.
            let kept = typed.filter(|_| outcome.is_err());
            (outcome, kept)
        }
        Err(e) => (Err(e.into()), None),
    };
    let notice = match outcome {
        Ok(detail) => Notice::Done(detail),
        Err(e) => Notice::Failed(e.to_string()),
    };
    let key = app.flashes.put(Flash { notice, kept_code });
    Ok(Redirect::to(&format!("/agents/{name}/contacts?flash={key}")).into_response())
}

#[derive(Deserialize)]
struct Search {
    #[serde(default)]
    q: String,
}

async fn memories(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(search): Query<Search>,
) -> Page {
    let (name, mailbox) = agent(&app, &name).await?;
    let query: String = search.q.trim().chars().take(MAX_QUERY_CHARS).collect();
    let found = mailbox
        .recall((!query.is_empty()).then(|| query.clone()), MEMORY_LIMIT)
        .await
        .map_err(internal)?;
    Ok(pages::memories(&name, &query, &found))
}
