//! The watcher: announces mail committed to the store (each message read once, whole, with
//! its sender), notices writes by other processes for the same agent (their mail to send,
//! their received mail), and lets a follower take over the relay connection when its holder
//! exits.

use std::sync::Arc;
use std::time::Duration;

use super::{Arrived, Mailbox, MailboxEvent};

/// How often the store is checked for other processes' writes. The process holding the relay
/// connection is woken at once by its own session; this bounds the others' delay.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Announcements read per round.
const BATCH: usize = 256;

/// Runs until the mailbox closes. `seen` is the store position already announced.
pub(super) async fn run(mailbox: Mailbox, mut seen: i64) {
    let inner = &mailbox.0;
    let mut version = None;
    loop {
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = inner.signals.wake.notified() => {}
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
        if let Err(e) = mailbox.try_hold().await {
            tracing::warn!(error = %e, "cannot take the relay connection lock");
        }
        let round = inner
            .store
            .call(move |s| Ok((s.data_version()?, s.arrived_since(seen, BATCH)?)))
            .await;
        let (now, fresh) = match round {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the store");
                continue;
            }
        };
        if fresh.len() == BATCH {
            inner.signals.wake.notify_one();
        }
        for (position, stored, sender) in fresh {
            seen = position;
            tracing::debug!(id = %stored.message.id, "announced");
            let arrived = Arc::new(Arrived { stored, sender });
            let _ = inner.signals.events.send(MailboxEvent::Mail(arrived));
        }
        // Another process wrote: it may have queued mail that only this one can send.
        if version.is_some_and(|v| v != now)
            && let Some(session) = mailbox.session().await
        {
            session.flush();
        }
        version = Some(now);
        inner.rounds.send_modify(|r| *r = r.wrapping_add(1));
    }
}
