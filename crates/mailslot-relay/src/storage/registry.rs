//! The registry role: who is registered with which keys, owner keys, invites, the directory.

use std::future::Future;

use super::StorageError;
use crate::protocol::{AgentName, KeyRotation, OwnerKey, PublicKeys};

/// The outcome of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The name is now bound to the keys.
    Created,
    /// The name was already bound to these same keys.
    Unchanged,
    /// The name is bound to other keys; nothing changed.
    NameTaken,
    /// The invite is unknown or used; nothing changed.
    BadInvite,
    /// The name was retired and is held until then (Unix ms); nothing changed.
    Retired(i64),
}

/// The SHA-256 digest of an invite token: all a relay keeps of it.
pub type InviteDigest = [u8; 32];

/// Names, keys and owner keys. Every write is durable before its future resolves.
pub trait Registry: Send + Sync + 'static {
    /// Binds `name` to `keys`, first come first served. With `invite` (the digest of an invite
    /// token), a new name uses the invite up in the same write, and is refused without a
    /// valid unused one.
    fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
        invite: Option<InviteDigest>,
    ) -> impl Future<Output = Result<Registration, StorageError>> + Send;

    /// The keys registered for `name`.
    fn keys(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Option<PublicKeys>, StorageError>> + Send;

    /// Replaces `rotation.agent`'s keys with `rotation.new` if they are `rotation.old` now,
    /// and keeps the statement (the last [`crate::protocol::MAX_ROTATIONS`]); returns whether
    /// it did. The caller has checked the signatures.
    fn rotate(
        &self,
        rotation: KeyRotation,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// The rotations kept for `name`, oldest first (none for an unknown or retired name).
    fn rotations(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Vec<KeyRotation>, StorageError>> + Send;

    /// Retires `name` (its own request): until `until_ms` the name is held but answers as
    /// unknown, then it is free; contacts, blocks, requests, listing and owner key go at once.
    /// Returns whether there was such an agent. Mail still queued for it is the caller's.
    fn retire(
        &self,
        name: AgentName,
        until_ms: i64,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// The owner key registered for `name`: the key its consent changes must be signed by.
    fn owner(
        &self,
        name: AgentName,
    ) -> impl Future<Output = Result<Option<OwnerKey>, StorageError>> + Send;

    /// Registers `key` as `name`'s owner key if the one registered now is `current` (`None`:
    /// none yet), atomically; returns whether it did.
    fn set_owner(
        &self,
        name: AgentName,
        key: OwnerKey,
        current: Option<OwnerKey>,
    ) -> impl Future<Output = Result<bool, StorageError>> + Send;

    /// Puts `agent` in the public directory with `description`, or (`None`) takes it out.
    fn set_listing(
        &self,
        agent: AgentName,
        description: Option<String>,
    ) -> impl Future<Output = Result<(), StorageError>> + Send;

    /// The public directory: agents that opted in, with their keys and descriptions, by name.
    fn directory(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(AgentName, PublicKeys, String)>, StorageError>> + Send;
}

/// The rotations column as both backends keep it: a JSON array, oldest first; `NULL` is none.
pub(super) fn rotations_from_column(
    name: &str,
    column: Option<&str>,
) -> Result<Vec<KeyRotation>, StorageError> {
    column.map_or(Ok(Vec::new()), |json| {
        serde_json::from_str(json).map_err(|e| {
            StorageError::Database(format!(
                "the stored key rotations of {name} are invalid: {e}"
            ))
        })
    })
}

/// The rotations column after `rotation`: appended, the oldest dropped past the limit.
pub(super) fn rotations_column_with(mut kept: Vec<KeyRotation>, rotation: KeyRotation) -> String {
    kept.push(rotation);
    let excess = kept.len().saturating_sub(crate::protocol::MAX_ROTATIONS);
    kept.drain(..excess);
    serde_json::to_string(&kept).expect("rotations always serialize")
}
