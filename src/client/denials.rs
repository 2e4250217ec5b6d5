//! A denial the relay tells (at once, or at the next login of an agent that was offline) is
//! told once, to whichever process holds the connection: it is kept in the store, so
//! `mailslot requests` shows it whoever heard it.

use super::ClientError;
use crate::protocol::ConsentEvent;
use crate::store::StoreHandle;

/// Keeps `event` in the store when it is a denial; other events have nothing to keep.
/// `false` for a denial heard before (the relay repeats one told live at the next login,
/// since the connection that heard it may have closed before reading it): not news.
pub(super) async fn keep(store: &StoreHandle, event: &ConsentEvent) -> Result<bool, ClientError> {
    match event {
        ConsentEvent::Denied { by } => {
            let by = by.clone();
            Ok(store.call(move |s| s.record_denial(&by)).await?)
        }
        _ => Ok(true),
    }
}
