//! Pushing doorbell rings to the MCP client, for both protocol eras:
//! - 2025-11-25 sessions get `notifications/resources/updated` for the URIs they subscribed
//!   to, `notifications/resources/list_changed`, and the Claude Code channel event
//!   `notifications/claude/channel` (other clients ignore it), through the session's peer;
//! - 2026-07-28 `subscriptions/listen` streams get what their accepted filter allows.
//!
//! `mailslot://sent` changes without a ring (a delivery does not ring the model): its updates
//! come from the mailbox's events, beside the rings.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CustomNotification, ResourceUpdatedNotificationParam, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{Peer, SubscriptionContext};
use rmcp::{ErrorData, RoleServer};
use tokio_util::sync::CancellationToken;

use super::resources::{INBOX, SENT};
use crate::doorbell::claude_code::Route;
use crate::doorbell::{Doorbell, Ring};
use crate::mailbox::{Feed, Heard, Mailbox, MailboxEvent};

/// The Claude Code channel notification.
pub const CHANNEL_METHOD: &str = "notifications/claude/channel";

/// The resource URIs a legacy session subscribed to.
#[derive(Clone, Default)]
pub struct Subscriptions(Arc<Mutex<HashSet<String>>>);

impl Subscriptions {
    /// Adds `uri`.
    pub fn add(&self, uri: String) {
        self.0.lock().expect("not poisoned").insert(uri);
    }

    /// Removes `uri`.
    pub fn remove(&self, uri: &str) {
        self.0.lock().expect("not poisoned").remove(uri);
    }

    fn contains(&self, uri: &str) -> bool {
        self.0.lock().expect("not poisoned").contains(uri)
    }
}

/// What a session's pushes are made from: the doorbell's rings and the mailbox's events,
/// subscribed together when the session begins.
pub struct Feeds {
    rings: Feed<Ring>,
    events: Feed<MailboxEvent>,
}

/// The next thing to push.
enum Push {
    /// A ring for the model.
    Ring(Ring),
    /// The sent view changed (a copy was delivered or bounced, or a receipt came).
    SentChanged,
    /// A feed fell behind: any view may have changed (see [`Feed`]).
    Missed,
}

impl Feeds {
    /// Subscribes to `doorbell` and `mailbox` now.
    pub fn subscribe(doorbell: &Doorbell, mailbox: &Mailbox) -> Self {
        Self {
            rings: doorbell.subscribe("mcp push"),
            events: mailbox.subscribe("mcp push"),
        }
    }

    /// The next thing to push; `None` when either feed ends.
    async fn next(&mut self) -> Option<Push> {
        loop {
            tokio::select! {
                heard = self.rings.next() => match heard? {
                    Heard::Event(ring) => return Some(Push::Ring(ring)),
                    Heard::Missed(_) => return Some(Push::Missed),
                },
                heard = self.events.next() => match heard? {
                    Heard::Event(e) if e.changes_sent_view() => return Some(Push::SentChanged),
                    Heard::Event(_) => {}
                    Heard::Missed(_) => return Some(Push::Missed),
                },
            }
        }
    }
}

/// The channel event for `ring`.
pub fn channel_notification(ring: &Ring) -> ServerNotification {
    ServerNotification::CustomNotification(CustomNotification::new(
        CHANNEL_METHOD,
        Some(serde_json::json!({ "content": ring.content, "meta": ring.meta })),
    ))
}

/// A legacy session's push targets.
pub struct Legacy {
    /// The session's peer.
    pub peer: Peer<RoleServer>,
    /// The URIs it subscribed to.
    pub subscriptions: Subscriptions,
    /// Whether rings go out as channel events.
    pub route: Route,
    /// The mailbox (to record what a channel event showed).
    pub mailbox: Mailbox,
}

/// Pushes `feeds` (subscribed when the session began) to a legacy session until its
/// transport closes or `stop` fires.
pub async fn legacy(to: Legacy, mut feeds: Feeds, stop: CancellationToken) {
    let Legacy {
        peer,
        subscriptions,
        route,
        mailbox,
    } = to;
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => return,
            next = feeds.next() => match next {
                Some(next) => next,
                None => return,
            },
        };
        let pushed = match next {
            Push::Ring(ring) => push_legacy(&peer, &ring, &subscriptions, &route, &mailbox).await,
            Push::SentChanged => updated(&peer, &subscriptions, &[SENT]).await,
            Push::Missed => match updated(&peer, &subscriptions, &[INBOX, SENT]).await {
                Ok(()) => peer.notify_resource_list_changed().await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = pushed {
            tracing::debug!(error = %e, "the client is gone; no more pushes");
            return;
        }
    }
}

/// Tells a legacy session that those of `uris` it subscribed to changed.
async fn updated(
    peer: &Peer<RoleServer>,
    subscriptions: &Subscriptions,
    uris: &[&str],
) -> Result<(), rmcp::service::ServiceError> {
    for uri in uris {
        if subscriptions.contains(uri) {
            peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(*uri))
                .await?;
        }
    }
    Ok(())
}

async fn push_legacy(
    peer: &Peer<RoleServer>,
    ring: &Ring,
    subscriptions: &Subscriptions,
    route: &Route,
    mailbox: &Mailbox,
) -> Result<(), rmcp::service::ServiceError> {
    if ring.message.is_some() {
        if subscriptions.contains(INBOX) {
            peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(INBOX))
                .await?;
        }
        peer.notify_resource_list_changed().await?;
    }
    // A Claude Code session served by the inbox socket or the rewake hook gets no channel
    // event: never two rings for one message.
    if !route.rings_channel() {
        return Ok(());
    }
    peer.send_notification(channel_notification(ring)).await?;
    // Only a Claude Code session's channel is recorded or proven.
    if route.session().is_some() && ring.message.is_some() {
        let (route, mailbox, ring) = (route.clone(), mailbox.clone(), ring.clone());
        tokio::spawn(async move { route.after_channel_ring(&mailbox, ring).await });
    }
    Ok(())
}

/// What a listen stream may carry: the inbox and any URI asked for (other URIs simply never
/// change), and list changes.
pub fn accept(requested: &SubscriptionFilter) -> SubscriptionFilter {
    requested.clone()
}

/// Serves one `subscriptions/listen` stream until the client cancels it or `stop` fires.
pub async fn listen(
    context: SubscriptionContext,
    mut feeds: Feeds,
    stop: &CancellationToken,
) -> Result<(), ErrorData> {
    let accepted = context.accepted().clone();
    let asked = |uri: &str| {
        accepted
            .resource_subscriptions
            .as_ref()
            .is_some_and(|uris| uris.iter().any(|u| u == uri))
    };
    let (inbox, sent) = (asked(INBOX), asked(SENT));
    let list_changed = accepted.resources_list_changed == Some(true);
    loop {
        let next = tokio::select! {
            _ = context.cancelled() => return Ok(()),
            _ = stop.cancelled() => return Ok(()),
            next = feeds.next() => match next {
                Some(next) => next,
                None => return Ok(()),
            },
        };
        let (inbox_changed, sent_changed) = match &next {
            Push::Ring(ring) => (ring.message.is_some(), false),
            Push::SentChanged => (false, true),
            Push::Missed => (true, true),
        };
        let pushed = async {
            if inbox_changed && inbox {
                context.sink().notify_resource_updated(INBOX).await?;
            }
            if inbox_changed && list_changed {
                context.sink().notify_resource_list_changed().await?;
            }
            if sent_changed && sent {
                context.sink().notify_resource_updated(SENT).await?;
            }
            Ok::<_, rmcp::service::SubscriptionSendError>(())
        };
        if pushed.await.is_err() {
            return Ok(());
        }
    }
}
