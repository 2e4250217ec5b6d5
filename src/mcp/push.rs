//! Pushing doorbell rings to the MCP client, for both protocol eras:
//! - 2025-11-25 sessions get `notifications/resources/updated` for the URIs they subscribed
//!   to, `notifications/resources/list_changed`, and the Claude Code channel event
//!   `notifications/claude/channel` (other clients ignore it), through the session's peer;
//! - 2026-07-28 `subscriptions/listen` streams get what their accepted filter allows.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CustomNotification, ResourceUpdatedNotificationParam, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{Peer, SubscriptionContext};
use rmcp::{ErrorData, RoleServer};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::resources::INBOX;
use crate::doorbell::{Doorbell, Ring};

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

/// The channel event for `ring`.
pub fn channel_notification(ring: &Ring) -> ServerNotification {
    ServerNotification::CustomNotification(CustomNotification::new(
        CHANNEL_METHOD,
        Some(serde_json::json!({ "content": ring.content, "meta": ring.meta })),
    ))
}

/// Pushes `rings` (subscribed when the session began) to a legacy session until its transport closes or `stop` fires.
pub async fn legacy(
    peer: Peer<RoleServer>,
    mut rings: broadcast::Receiver<Ring>,
    subscriptions: Subscriptions,
    stop: CancellationToken,
) {
    loop {
        let ring = tokio::select! {
            _ = stop.cancelled() => return,
            ring = rings.recv() => match ring {
                Ok(r) => r,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if let Err(e) = push_legacy(&peer, &ring, &subscriptions).await {
            tracing::debug!(error = %e, "the client is gone; no more pushes");
            return;
        }
    }
}

async fn push_legacy(
    peer: &Peer<RoleServer>,
    ring: &Ring,
    subscriptions: &Subscriptions,
) -> Result<(), rmcp::service::ServiceError> {
    if ring.message.is_some() {
        if subscriptions.contains(INBOX) {
            peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(INBOX))
                .await?;
        }
        peer.notify_resource_list_changed().await?;
    }
    peer.send_notification(channel_notification(ring)).await
}

/// What a listen stream may carry: the inbox and any URI asked for (other URIs simply never
/// change), and list changes.
pub fn accept(requested: &SubscriptionFilter) -> SubscriptionFilter {
    requested.clone()
}

/// Serves one `subscriptions/listen` stream until the client cancels it or `stop` fires.
pub async fn listen(
    context: SubscriptionContext,
    doorbell: &Doorbell,
    stop: &CancellationToken,
) -> Result<(), ErrorData> {
    let mut rings = doorbell.subscribe();
    let accepted = context.accepted().clone();
    let inbox = accepted
        .resource_subscriptions
        .as_ref()
        .is_some_and(|uris| uris.iter().any(|u| u == INBOX));
    let list_changed = accepted.resources_list_changed == Some(true);
    loop {
        let ring = tokio::select! {
            _ = context.cancelled() => return Ok(()),
            _ = stop.cancelled() => return Ok(()),
            ring = rings.recv() => match ring {
                Ok(r) => r,
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
        };
        if ring.message.is_none() {
            continue;
        }
        let sent = async {
            if inbox {
                context.sink().notify_resource_updated(INBOX).await?;
            }
            if list_changed {
                context.sink().notify_resource_list_changed().await?;
            }
            Ok::<_, rmcp::service::SubscriptionSendError>(())
        };
        if sent.await.is_err() {
            return Ok(());
        }
    }
}
