//! The pages, as HTML rendered on the server with `maud`, which escapes every value put into
//! the markup: another agent's words (subjects, bodies, notes, attachment names) can only
//! ever be text. They also sit inside an "untrusted" frame that says whose words they are,
//! with the facts mailslot verified (sender, signature, pinned fingerprint) outside it.

use jiff::Timestamp;
use maud::{DOCTYPE, Markup, html};
use serde::Serialize;

use super::consent::Consent;
use super::form::code_field;
use super::relay_status::RelayReport;
use crate::doorbell::frame;
use crate::protocol::{
    Address, AgentName, Fingerprint, Importance, Limits, MAX_ANSWER_CHARS, MAX_GROUP_MEMBERS,
    Message, MessageId, Policy,
};
use crate::store::{
    Contact, Direction, GroupMark, Membership, OwnerVoice, Recalled, SentItem, SentState,
    StoredMessage, Trust,
};

/// The longest subject shown in a list (characters).
const LIST_SUBJECT_CHARS: usize = 120;
/// The longest memory excerpt in a list (characters).
const EXCERPT_CHARS: usize = 240;

/// An agent on this machine, for the first page.
pub struct AgentRow {
    /// Its name.
    pub name: AgentName,
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
    /// Who it is (its own words).
    pub identity: Option<String>,
    /// What it is doing (its own words).
    pub task: Option<String>,
    /// Its relay connection in one sentence.
    pub status: String,
    /// Whether it is connected (here or through another process).
    pub online: bool,
    /// Unread received mail.
    pub unread: u32,
}

/// Which tab of an agent's pages is shown.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    /// Received mail.
    Inbox,
    /// Sent mail.
    Sent,
    /// Contacts and requests.
    Contacts,
    /// Memories.
    Memories,
}

/// A time as every page shows it, server-rendered or live.
pub fn when(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A mark on a message in a list, in words (never colour alone): what mailslot verified or
/// the sender asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mark {
    /// The style it takes (`danger`, `warn`, `flag`).
    pub class: &'static str,
    /// What it says.
    pub text: &'static str,
}

/// The marks of a message in a list: a changed key, its importance, a request to acknowledge.
pub fn marks(message: &Message, trust: Trust) -> Vec<Mark> {
    let mut marks = Vec::new();
    if trust == Trust::KeyChanged {
        marks.push(Mark {
            class: "danger",
            text: "KEY CHANGED",
        });
    }
    match message.importance {
        Importance::Urgent => marks.push(Mark {
            class: "flag urgent",
            text: "urgent",
        }),
        Importance::High => marks.push(Mark {
            class: "flag high",
            text: "high importance",
        }),
        Importance::Normal => {}
    }
    if message.ack_required {
        marks.push(Mark {
            class: "flag ack",
            text: "acknowledgement requested",
        });
    }
    marks
}

fn mark_list(message: &Message, trust: Trust) -> Markup {
    html! {
        @for mark in marks(message, trust) { " " span class=(mark.class) { (mark.text) } }
    }
}

fn subject_line(subject: &str) -> String {
    let line = frame::one_line(subject, LIST_SUBJECT_CHARS);
    if line.is_empty() {
        "(no subject)".to_owned()
    } else {
        line
    }
}

/// The frame around every page.
pub fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " — mailslot" }
                link rel="icon" href="/favicon.ico";
                link rel="stylesheet" href="/static/app.css";
                script src="/static/app.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/" { "mailslot" }
                    nav {
                        a href="/" { "Agents" }
                        a href="/relay" { "Relay" }
                    }
                    span #live title="New mail appears without reloading" { "live: connecting" }
                }
                main { (body) }
            }
        }
    }
}

fn agent_tabs(agent: &AgentName, current: Tab) -> Markup {
    let tabs = [
        (Tab::Inbox, "", "Inbox"),
        (Tab::Sent, "/sent", "Sent"),
        (Tab::Contacts, "/contacts", "Contacts & requests"),
        (Tab::Memories, "/memories", "Memories"),
    ];
    html! {
        h1 { "Agent " (agent) }
        nav.tabs {
            @for (tab, path, label) in tabs {
                a.current[tab == current] href={ "/agents/" (agent) (path) } { (label) }
            }
        }
    }
}

/// `/`: the agents on this machine.
pub fn agents(relay: &str, rows: &[AgentRow]) -> Markup {
    layout(
        "Agents",
        html! {
            h1 { "Agents on this machine" }
            p.muted { "Relay: " code { (relay) } }
            @if rows.is_empty() {
                p { "No agents yet: " code { "mailslot --agent NAME init" } " makes one." }
            }
            table.agents {
                thead { tr { th { "Agent" } th { "Identity" } th { "Current task" } th { "Fingerprint" } th { "Relay" } th { "Unread" } } }
                tbody {
                    @for row in rows {
                        tr {
                            td { a href={ "/agents/" (row.name) } { (row.name) } }
                            td { (row.identity.as_deref().unwrap_or("—")) }
                            td { (row.task.as_deref().unwrap_or("—")) }
                            td { code { (row.fingerprint) } }
                            td { span.online[row.online].offline[!row.online] { (if row.online { "online" } else { "offline" }) } " " span.muted { (row.status) } }
                            td.unread data-unread=(row.name) { (row.unread) }
                        }
                    }
                }
            }
        },
    )
}

fn mail_row(agent: &AgentName, stored: &StoredMessage) -> Markup {
    let m = &stored.message;
    let list = |v: &[crate::protocol::Address]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    html! {
        li.unread[stored.direction == Direction::In && stored.read_at.is_none()] data-id=(m.id) {
            a href={ "/agents/" (agent) "/messages/" (m.id) } { (subject_line(&m.subject)) }
            @if stored.trust == Trust::Owner {
                " " span.from { "from you, the owner" }
            } @else if stored.direction == Direction::In {
                " " span.from { "from " (m.from) }
            } @else {
                " " span.from { "to " (list(&m.to)) }
            }
            " " span.muted { (when(m.sent_at)) }
            (mark_list(m, stored.trust))
        }
    }
}

/// What the inbox page lists.
pub struct InboxPage<'a> {
    /// Received mail, all of it and unread.
    pub total: u64,
    /// Unread received mail.
    pub unread: u64,
    /// This page's messages, newest first.
    pub items: &'a [StoredMessage],
    /// The message this page lists mail older than (none: the newest).
    pub before: Option<MessageId>,
    /// The cursor of the next, older page, if there is one.
    pub older: Option<MessageId>,
    /// The token the owner's message form carries.
    pub csrf: String,
    /// What the owner's last message from this page said, if the browser was sent here by it.
    pub notice: Option<&'a Notice>,
}

/// The owner's form to write to their agent: signed with the owner key, so it asks the
/// passphrase like the consent form.
fn tell_form(agent: &AgentName, csrf: &str) -> Markup {
    html! {
        details.tell #tell {
            summary { "Write to " (agent) " as its owner" }
            form.tell method="post" action={ "/agents/" (agent) "/tell" } {
                input type="hidden" name="csrf" value=(csrf);
                label { "Subject (optional) " input type="text" name="subject" maxlength="200" autocomplete="off"; }
                label { "Message " textarea name="body" required rows="5" maxlength=(Limits::default().body_bytes) {} }
                label {
                    "Owner passphrase "
                    input type="password" name="passphrase" required autocomplete="off" minlength="10" maxlength="1024";
                }
                button type="submit" { "Sign and send to " (agent) }
                p.muted { "Signed with your owner key: " (agent) "'s sessions show it as your own words, not another agent's. The passphrase unlocks the key for this message only and is never stored." }
            }
        }
    }
}

fn search_form(agent: &AgentName, query: &str) -> Markup {
    html! {
        form.search method="get" action={ "/agents/" (agent) "/search" } role="search" {
            input type="search" name="q" value=(query) placeholder="Search this agent's mail" maxlength="500" aria-label="Search this agent's mail";
            button type="submit" { "Search" }
        }
    }
}

/// `/agents/NAME?before=ID`: received mail newest first, a page at a time; new mail is added
/// to the first page by the page's script.
pub fn inbox(agent: &AgentName, page: &InboxPage<'_>) -> Markup {
    let first = page.before.is_none();
    layout(
        &format!("{agent}: inbox"),
        html! {
            (agent_tabs(agent, Tab::Inbox))
            @match page.notice {
                Some(Notice::Done(detail)) => p.notice.ok #notice role="status" { (detail) },
                Some(Notice::Failed(why)) => p.notice.danger #notice role="alert" { (why) },
                None => {}
            }
            (search_form(agent, ""))
            @if first { (tell_form(agent, &page.csrf)) }
            p #counts {
                strong data-total=(agent) { (page.total) } " received, "
                strong data-unread=(agent) { (page.unread) } " unread"
                @if !first { " — older mail" }
            }
            p.muted { "Newest first; unread mail is bold. Reading it here does not mark it read: that is the agent's own state." }
            // Only the first page takes live mail: an older page stays as it was listed.
            ul.mail #inbox data-inbox=[first.then_some(agent)] {
                @for stored in page.items { (mail_row(agent, stored)) }
            }
            @if page.items.is_empty() {
                p.empty #inbox-empty { (if first { "No mail yet." } else { "No older mail." }) }
            }
            nav.pages aria-label="Pages" {
                @if !first { a href={ "/agents/" (agent) } { "Newest" } }
                @if let Some(older) = page.older { a rel="next" href={ "/agents/" (agent) "?before=" (older) } { "Older" } }
            }
        },
    )
}

/// `/agents/NAME/search?q=…`: received and sent mail matching the words, best first.
pub fn search(agent: &AgentName, query: &str, found: &[StoredMessage], limit: usize) -> Markup {
    layout(
        &format!("{agent}: search"),
        html! {
            (agent_tabs(agent, Tab::Inbox))
            (search_form(agent, query))
            @if query.is_empty() {
                p.empty { "Type words to find in subjects, bodies and senders." }
            } @else if found.is_empty() {
                p.empty #search-empty { "No mail matches." }
            } @else {
                p #search-count { (found.len()) " found, best first" @if found.len() == limit { " (the best " (limit) " only: add words to narrow it)" } }
            }
            ul.mail #found { @for stored in found { (mail_row(agent, stored)) } }
        },
    )
}

fn trust_badge(trust: Trust) -> Markup {
    match trust {
        Trust::Verified => html! { span.ok { "signature verified with the pinned key" } },
        Trust::Own => html! { span.ok { "sent by this agent" } },
        Trust::Owner => {
            html! { span.ok { "written by you, the owner: signed with the owner key" } }
        }
        Trust::Unverified => html! { span.warn { "signature not verified" } },
        Trust::KeyChanged => html! {
            span.danger { "KEY CHANGED: signed by a key other than the one pinned for this sender — do not trust it" }
        },
    }
}

/// Another agent's words, framed: who wrote them (verified), then the text as text.
fn framed(agent: &AgentName, stored: &StoredMessage, contact: Option<&Contact>) -> Markup {
    let m = &stored.message;
    let list = |v: &[crate::protocol::Address]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    html! {
        article.message data-id=(m.id) {
            dl.facts {
                @match &stored.owner {
                    Some(OwnerVoice::Verified(fp)) => {
                        dt { "From" } dd { "you, the owner " (trust_badge(stored.trust)) }
                        dt { "Owner key" } dd { code { (fp) } }
                    }
                    Some(OwnerVoice::Unverified) => {
                        dt { "From" } dd { (m.from) " " span.danger { "claims to be from you, the owner, but your owner key did not sign it: these are not your words" } }
                    }
                    None => {
                        dt { "From" } dd { (m.from) " " (trust_badge(stored.trust)) }
                        @if let Some(c) = contact { dt { "Fingerprint" } dd { code { (c.fingerprint) } } }
                    }
                }
                dt { "To" } dd { (list(&m.to)) }
                @if !m.cc.is_empty() { dt { "Cc" } dd { (list(&m.cc)) } }
                @if !m.bcc.is_empty() { dt { "Bcc" } dd { (list(&m.bcc)) } }
                dt { "Sent" } dd { (when(m.sent_at)) }
                @if !stored.bounced.is_empty() {
                    dt { "Bounced" } dd.danger { "expired on the relay before " (stored.bounced.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")) " took it" }
                }
                // Where the other copies of sent mail stand, as the sent page and `read` say.
                @if !stored.delivered.is_empty() {
                    dt { "Delivered" } dd { (stored.delivered.iter().map(|(to, at)| format!("{to} by {}", when(*at))).collect::<Vec<_>>().join(", ")) }
                }
                @if stored.direction == Direction::Out && !stored.receipts.is_empty() {
                    dt { "Receipts" } dd { (stored.receipts.iter().map(|r| format!("{} {} at {}", r.recipient, r.kind.as_str(), when(r.at))).collect::<Vec<_>>().join(", ")) }
                }
            }
            (untrusted(agent, stored))
        }
    }
}

fn untrusted(agent: &AgentName, stored: &StoredMessage) -> Markup {
    let (m, trust) = (&stored.message, stored.trust);
    html! {
        section.untrusted aria-label={ "Written by " (m.from) } {
            @if trust == Trust::Owner {
                p.fence { "Written by you, the owner, to " (agent) " and signed with your owner key." }
            } @else if trust != Trust::Own {
                p.fence { "Written by " strong { (m.from) } ": another agent's words, shown as text. mailslot vouches only for who sent them; check claims and instructions before acting on them." }
            }
            h2.subject { (frame::one_line(&m.subject, 400)) }
            pre.body { (frame::fenced(&m.body, "")) }
            @if let Some(data) = &m.data {
                h3 { "Structured data" }
                pre.data { (serde_json::to_string_pretty(data).unwrap_or_default()) }
            }
            // The recipients' answers to sent mail are their words, so they stay in here.
            @if stored.direction == Direction::Out {
                @for (r, answer) in stored.receipts.iter().filter_map(|r| Some((r, r.answer.as_ref()?))) {
                    p.answer { "Answer from " strong { (r.recipient) } ": " (frame::one_line(answer, MAX_ANSWER_CHARS)) }
                }
            }
            @if !stored.attachments.is_empty() {
                h3 { "Attachments" }
                ul.attachments {
                    @for (i, a) in stored.attachments.iter().enumerate() {
                        li {
                            a href={ "/agents/" (agent) "/messages/" (m.id) "/attachments/" (i) } download { (frame::one_line(&a.name, 200)) }
                            " " span.muted { (frame::one_line(&a.media_type, 100)) ", " (a.size) " bytes, sha256 " (a.sha256) }
                        }
                    }
                }
            }
        }
    }
}

/// `/agents/NAME/messages/ID`: one message.
pub fn message(agent: &AgentName, stored: &StoredMessage, contact: Option<&Contact>) -> Markup {
    let m = &stored.message;
    layout(
        &format!("{agent}: message"),
        html! {
            (agent_tabs(agent, Tab::Inbox))
            (framed(agent, stored, contact))
            p { a href={ "/agents/" (agent) "/threads/" (m.thread) } { "The whole thread" } }
        },
    )
}

/// `/agents/NAME/threads/ID`: a thread, oldest first.
pub fn thread(agent: &AgentName, items: &[StoredMessage]) -> Markup {
    layout(
        &format!("{agent}: thread"),
        html! {
            (agent_tabs(agent, Tab::Inbox))
            h2 { "Thread (" (items.len()) " messages, oldest first)" }
            @for stored in items { (framed(agent, stored, None)) }
        },
    )
}

fn sent_state(item: &SentItem) -> Markup {
    let bounced = &item.stored.bounced;
    match item.state {
        SentState::Sent => html! { span.ok { "sent (accepted by the relay)" } },
        SentState::Queued => html! {
            span.warn { "queued" }
            @if item.attempts > 0 { " after " (item.attempts) " tries" }
            @if let Some(e) = &item.last_error { " — " span.muted { (e) } }
        },
        SentState::Failed => html! {
            span.danger { "failed" } " — " (item.last_error.as_deref().unwrap_or("refused by the relay"))
        },
        SentState::Bounced => html! {
            span.danger { "bounced" } " — expired before "
            (bounced.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")) " took it"
        },
        SentState::Delivered | SentState::Read | SentState::Acknowledged => html! {
            span.ok { (item.state.as_str()) }
            @for r in &item.recipients {
                br; span.muted { (r.to.to_string()) ": " (r.state.as_str()) }
                @if let Some(answer) = &r.answer { " — “" (answer) "”" }
            }
        },
    }
}

/// `/agents/NAME/sent`: sent mail with where each stands.
pub fn sent(agent: &AgentName, items: &[SentItem]) -> Markup {
    layout(
        &format!("{agent}: sent"),
        html! {
            (agent_tabs(agent, Tab::Sent))
            @if items.is_empty() { p.empty { "Nothing sent yet." } }
            table.sent {
                thead { tr { th { "Subject" } th { "To" } th { "Sent" } th { "State" } } }
                tbody {
                    @for item in items {
                        @let m = &item.stored.message;
                        tr {
                            td { a href={ "/agents/" (agent) "/messages/" (m.id) } { (subject_line(&m.subject)) } }
                            td { (m.to.iter().chain(&m.cc).map(ToString::to_string).collect::<Vec<_>>().join(", ")) }
                            td.muted { (when(m.sent_at)) }
                            td { (sent_state(item)) }
                        }
                    }
                }
            }
        },
    )
}

/// The outcome of a consent change, shown above the contacts.
pub enum Notice {
    /// It was done: the relay's sentence.
    Done(String),
    /// It was not: why.
    Failed(String),
}

/// A button of the consent form: `ACTION AGENT`, which the form's one passphrase signs.
fn act(action: &str, other: &impl std::fmt::Display, label: &str) -> Markup {
    html! {
        button type="submit" name="action" value={ (action) " " (other) } data-action=(action) data-agent=(other) { (label) }
    }
}

/// What the contacts page shows besides the relay's state.
pub struct ContactsPage<'a> {
    /// The form's CSRF token.
    pub csrf: &'a str,
    /// The outcome of the change just made, once.
    pub notice: Option<&'a Notice>,
    /// The code typed for a request whose approval failed, kept for another try.
    pub kept_code: Option<&'a (Address, String)>,
}

/// `/agents/NAME/contacts`: the relay's consent state, requests to answer, pinned keys. Every
/// change is one form with one passphrase field at the top, which each button signs.
pub fn contacts(
    agent: &AgentName,
    consent: &Result<Consent, String>,
    pinned: &[Contact],
    page: &ContactsPage<'_>,
) -> Markup {
    let kept = |requester: &Address| {
        page.kept_code
            .filter(|(a, _)| a == requester)
            .map(|(_, code)| code.as_str())
    };
    layout(
        &format!("{agent}: contacts"),
        html! {
            (agent_tabs(agent, Tab::Contacts))
            @match page.notice {
                Some(Notice::Done(detail)) => p.notice.ok #notice role="status" { (detail) },
                Some(Notice::Failed(why)) => p.notice.danger #notice role="alert" { (why) },
                None => {},
            }
            @match consent {
                Err(why) => p.danger { "The relay's consent state is unavailable: " (why) },
                Ok(c) => form.consent #consent method="post" action={ "/agents/" (agent) "/consent" } {
                    input type="hidden" name="csrf" value=(page.csrf);
                    // Enter in a field submits the default button, the first: a disabled one
                    // makes Enter do nothing, so only a pressed button changes anything.
                    button.default type="submit" disabled hidden aria-hidden="true" {}
                    p.owner {
                        label {
                            "Owner passphrase "
                            input type="password" name="passphrase" required autocomplete="off" minlength="10" maxlength="1024";
                        }
                        br;
                        span.muted { "Every change below is signed with your owner key: type its passphrase, then press the change's button. It unlocks the key for that change only and is never stored." }
                    }
                    h2 { "Policy" }
                    p {
                        "Accepts mail from: " strong #policy { (c.state.policy) } " "
                        select name="policy" aria-label="Policy" {
                            @for (policy, meaning) in [(Policy::Open, "anyone not blocked"), (Policy::Contacts, "approved contacts only"), (Policy::Closed, "no one")] {
                                option value=(policy) selected[policy == c.state.policy] { (policy) " — " (meaning) }
                            }
                        }
                        " "
                        button type="submit" name="action" value="policy" data-action="policy" { "Set policy" }
                    }
                    h2 { "Requests to " (agent) }
                    @if c.incoming.is_empty() { p.empty { "No open requests." } }
                    @for q in &c.incoming {
                        section.request data-from=(q.agent) {
                            h3 { "From " (q.agent) }
                            p { "Fingerprint: " code { (q.fingerprint.as_ref().map(ToString::to_string).unwrap_or_else(|| "not known yet (its relay gave no keys, or not in time; reload to ask again)".into())) } " — compare it with " (q.agent) "'s owner." }
                            @if !q.note.is_empty() {
                                div.untrusted { p.fence { "Note from " (q.agent) ", as text:" } pre.body { (frame::fenced(&q.note, "")) } }
                            }
                            p.muted { "Expires " (when(q.expires_at)) }
                            p.actions {
                                label { "Code from " (q.agent) "'s owner " input type="text" name=(code_field(&q.agent)) value=[kept(&q.agent)] autocomplete="off" placeholder="XXXX-XXXX" maxlength="20"; }
                                " " (act("approve", &q.agent, "Approve"))
                                " " (act("deny", &q.agent, "Deny"))
                                " " (act("block", &q.agent, "Block"))
                            }
                        }
                    }
                    h2 { "Requests from " (agent) }
                    @if c.state.outgoing.is_empty() { p.empty { "None open." } }
                    ul {
                        @for q in &c.state.outgoing {
                            li { "To " (q.agent) ", until " (when(q.expires_at)) ". Code for their owner: " code { (q.code.as_ref().map(|c| c.as_str()).unwrap_or("?")) } }
                        }
                    }
                    h2 { "Contacts" }
                    @if c.state.contacts.is_empty() { p.empty { "None yet." } }
                    @for other in &c.state.contacts {
                        section.contact { strong { (other) } " " (act("remove", other, "End contact")) " " (act("block", other, "Block")) }
                    }
                    h2 { "Blocked" }
                    @if c.state.blocked.is_empty() { p.empty { "Nobody." } }
                    @for other in &c.state.blocked {
                        section.contact { strong { (other) } " " (act("unblock", other, "Unblock")) }
                    }
                    (groups(agent, c))
                },
            }
            h2 { "Pinned keys" }
            table.pinned {
                thead { tr { th { "Agent" } th { "Fingerprint" } th { "First seen" } th { "Key changes" } } }
                tbody {
                    @for c in pinned {
                        tr {
                            td { (c.address) }
                            td { code { (c.fingerprint) } }
                            td.muted { (when(c.first_seen)) }
                            td.danger[c.key_changes > 0] { (c.key_changes) }
                        }
                    }
                }
            }
        },
    )
}

/// The contacts page's groups: those the agent's model asked to join, with the owner's
/// button; where it stands with the others; and the groups on its relay it is on or owns,
/// with their rosters. Joining is signed like every change on the page; leaving is the
/// agent's own (`leave_group`, `mailslot groups leave`).
fn groups(agent: &AgentName, c: &Consent) -> Markup {
    let wished: Vec<&GroupMark> = c
        .marks
        .iter()
        .filter(|m| m.state == Membership::Wished)
        .collect();
    html! {
        h2 { "Groups" }
        @if !wished.is_empty() {
            p { (agent) " asked to join these; its group mail reaches it only once you join:" }
            @for m in &wished {
                section.group data-wished=(m.group) { strong { (m.group) } " " span.muted { "asked " (when(m.since)) } " " (act("join", &m.group, "Join")) }
            }
        }
        @let joined: Vec<&GroupMark> = c.marks.iter().filter(|m| m.state == Membership::Joined).collect();
        @if !joined.is_empty() {
            p { "Joined: " @for (i, m) in joined.iter().enumerate() { @if i > 0 { ", " } strong.joined { (m.group) } } }
        }
        @match &c.groups {
            Err(why) => p.danger { "The relay's groups are unavailable: " (why) },
            Ok(listed) if listed.is_empty() && c.marks.is_empty() => p.empty { "None. Make one with " code { "mailslot --agent " (agent) " groups create NAME" } "." },
            Ok(listed) => {
                @for g in listed {
                    section.group data-group=(g.name) {
                        h3 { (g.name) }
                        p.muted { "Posting: " (g.policy.as_str()) " · created by " (g.creator) " · " (g.members.len()) " of " (MAX_GROUP_MEMBERS) " members" }
                        ul.members { @for m in &g.members { li { (m) } } }
                    }
                }
            }
        }
    }
}

/// `/agents/NAME/memories?q=…`: memories, found by relevance and recency.
pub fn memories(agent: &AgentName, query: &str, found: &[Recalled]) -> Markup {
    layout(
        &format!("{agent}: memories"),
        html! {
            (agent_tabs(agent, Tab::Memories))
            form.search method="get" {
                input type="search" name="q" value=(query) placeholder="Search memories" maxlength="500";
                button type="submit" { "Search" }
            }
            @if found.is_empty() { p.empty { (if query.is_empty() { "No memories yet." } else { "No memories match." }) } }
            ul.memories {
                @for r in found {
                    li {
                        strong { (frame::one_line(&r.memory.title, 200)) }
                        @if !r.memory.tags.is_empty() { " " span.muted { "[" (r.memory.tags.join(", ")) "]" } }
                        " " span.muted { (when(r.memory.updated_at)) }
                        p { (frame::one_line(&r.memory.body, EXCERPT_CHARS)) }
                    }
                }
            }
        },
    )
}

/// `/relay`: the relay's health and key metrics, and each agent's connection.
pub fn relay(url: &str, report: &RelayReport, rows: &[AgentRow]) -> Markup {
    layout(
        "Relay",
        html! {
            h1 { "Relay" }
            p { code { (url) } }
            h2 { "Health" }
            @match &report.health {
                Ok(text) => p.ok #health { (text) },
                Err(why) => p.danger #health { (why) },
            }
            h2 { "Key metrics" }
            @match &report.metrics {
                Err(why) => p.danger { (why) },
                Ok(metrics) => table.metrics {
                    tbody {
                        @for (name, meaning, value) in metrics {
                            tr { td { (meaning) } td.num { (value) } td.muted { code { (name) } } }
                        }
                    }
                },
            }
            h2 { "Agents' connections" }
            ul { @for row in rows { li { strong { (row.name) } ": " (row.status) } } }
        },
    )
}

/// Any error, as a page.
pub fn error(title: &str, why: &str) -> Markup {
    layout(
        title,
        html! { h1 { (title) } p.danger { (why) } p { a href="/" { "Back to the agents" } } },
    )
}

/// After `/login`: on to `/` at once (a navigation from the dashboard's own page, so the new
/// cookie goes with it).
pub fn entered() -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content="0; url=/";
                title { "mailslot" }
            }
            body { p { a href="/" { "Open the dashboard" } } }
        }
    }
}
