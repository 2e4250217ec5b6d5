//! The writing side of `mailslot relay migrate`: a [`Snapshot`] of another relay into an empty
//! database, in one transaction, so a failure at any point leaves the database as it was.
//!
//! The relay id carries over (clients sign it in their hello). Waiting copies are numbered
//! afresh per recipient from 1, in the order they came (each recipient's sequence order), and
//! each recipient's `mailboxes` row gets the totals and the next number. They are written a
//! chunk at a time as the snapshot reads them, so the queue is never in memory at once.

use std::collections::HashMap;

use deadpool_postgres::{Client, Transaction};

use super::unsigned;
use crate::storage::relays::OWN_KEY;
use crate::storage::{
    MigrateError, Moved, RelationKind, Snapshot, StorageError, WaitingCopies, WaitingCopy,
};

/// One recipient's mailbox as the import fills it.
#[derive(Default)]
struct Totals {
    waiting: i64,
    bytes: i64,
}

/// Writes `snapshot` into the database `client` is connected to (`target`: its URL as shown),
/// which must hold no agents and no mail; returns what it moved.
pub(super) async fn import(
    client: &mut Client,
    target: &str,
    snapshot: Snapshot,
) -> Result<Moved, MigrateError> {
    let tx = client.transaction().await.map_err(StorageError::from)?;
    // Whatever the database's default, the move is on disk when this returns.
    tx.batch_execute("SET LOCAL synchronous_commit = on")
        .await
        .map_err(StorageError::from)?;
    // A node registering beside the import waits for it, and the emptiness checked here holds
    // to the commit.
    tx.batch_execute("LOCK TABLE agents, queue IN EXCLUSIVE MODE")
        .await
        .map_err(StorageError::from)?;
    let row = tx
        .query_one(
            "SELECT (SELECT count(*) FROM agents), (SELECT count(*) FROM queue)",
            &[],
        )
        .await
        .map_err(StorageError::from)?;
    let (agents, copies): (i64, i64) = (
        row.try_get(0).map_err(StorageError::from)?,
        row.try_get(1).map_err(StorageError::from)?,
    );
    if agents > 0 || copies > 0 {
        return Err(MigrateError::NotEmpty {
            target: target.to_owned(),
            agents: unsigned(agents, "count")?,
            copies: unsigned(copies, "count")?,
        });
    }
    let mut moved = tables(&tx, &snapshot).await?;
    moved.relay_id = snapshot.relay_id;
    moved.damaged_records = snapshot.damaged_records as u64;
    mail(&tx, snapshot.copies, &mut moved).await?;
    tx.commit().await.map_err(StorageError::from)?;
    Ok(moved)
}

/// Everything but the mail: the relay id, agents, invites, relations, requests, bounces,
/// other relays' pinned keys.
async fn tables(tx: &Transaction<'_>, s: &Snapshot) -> Result<Moved, StorageError> {
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('relay_id', $1)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&s.relay_id],
    )
    .await?;
    if let Some(key) = &s.relay_key {
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ($1, $2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&OWN_KEY, &key.to_base64()],
        )
        .await?;
    }

    let a = &s.agents;
    let names: Vec<&str> = a.iter().map(|r| r.name.as_str()).collect();
    let signing: Vec<&[u8]> = a.iter().map(|r| r.keys.signing.as_slice()).collect();
    let sealing: Vec<&[u8]> = a.iter().map(|r| r.keys.sealing.as_slice()).collect();
    let registered: Vec<i64> = a.iter().map(|r| r.registered_at_ms).collect();
    let policy: Vec<Option<&str>> = a.iter().map(|r| r.policy.map(|p| p.as_str())).collect();
    let listing: Vec<Option<&str>> = a.iter().map(|r| r.listing.as_deref()).collect();
    let owner: Vec<Option<&[u8]>> = a
        .iter()
        .map(|r| r.owner.as_ref().map(|k| k.as_bytes().as_slice()))
        .collect();
    let retired: Vec<Option<i64>> = a.iter().map(|r| r.retired_until_ms).collect();
    let rotations: Vec<Option<String>> = a
        .iter()
        .map(|r| {
            (!r.rotations.is_empty())
                .then(|| serde_json::to_string(&r.rotations).expect("rotations always serialize"))
        })
        .collect();
    tx.execute(
        "INSERT INTO agents (name, signing, sealing, registered_at, policy, listing, owner, retired_until, rotations)
         SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::bigint[], $5::text[], $6::text[], $7::bytea[], $8::bigint[], $9::text[])",
        &[&names, &signing, &sealing, &registered, &policy, &listing, &owner, &retired, &rotations],
    )
    .await?;

    let digests: Vec<&[u8]> = s.invites.iter().map(|i| i.digest.as_slice()).collect();
    let created: Vec<i64> = s.invites.iter().map(|i| i.created_at_ms).collect();
    // Invites made for this database before the move stay beside the moved ones.
    let invites = tx
        .execute(
            "INSERT INTO invites (digest, created_at)
             SELECT * FROM unnest($1::bytea[], $2::bigint[]) ON CONFLICT (digest) DO NOTHING",
            &[&digests, &created],
        )
        .await?;

    let r = &s.relations;
    let owners: Vec<&str> = r.iter().map(|x| x.owner.as_str()).collect();
    let peers: Vec<&str> = r.iter().map(|x| x.peer.as_str()).collect();
    let kinds: Vec<&str> = r.iter().map(|x| x.kind.as_str()).collect();
    let since: Vec<i64> = r.iter().map(|x| x.since_ms).collect();
    tx.execute(
        "INSERT INTO relations (owner, peer, kind, since)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])",
        &[&owners, &peers, &kinds, &since],
    )
    .await?;

    let q = &s.requests;
    let requesters: Vec<&str> = q.iter().map(|x| x.requester.as_str()).collect();
    let targets: Vec<&str> = q.iter().map(|x| x.target.as_str()).collect();
    let notes: Vec<&str> = q.iter().map(|x| x.note.as_str()).collect();
    let codes: Vec<&str> = q.iter().map(|x| x.code.as_str()).collect();
    let expires: Vec<i64> = q.iter().map(|x| x.expires_at_ms).collect();
    tx.execute(
        "INSERT INTO contact_requests (requester, target, note, code, expires_at)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[])",
        &[&requesters, &targets, &notes, &codes, &expires],
    )
    .await?;

    let b = &s.bounces;
    let senders: Vec<&str> = b.iter().map(|(sender, _)| sender.as_str()).collect();
    let ids: Vec<String> = b.iter().map(|(_, x)| x.id.to_string()).collect();
    let recipients: Vec<String> = b.iter().map(|(_, x)| x.to.to_string()).collect();
    let expired: Vec<i64> = b
        .iter()
        .map(|(_, x)| x.expired_at.as_millisecond())
        .collect();
    tx.execute(
        "INSERT INTO bounces (sender, message_id, recipient, expired_at)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])",
        &[&senders, &ids, &recipients, &expired],
    )
    .await?;

    let p = &s.relay_pins;
    let relays: Vec<&str> = p.iter().map(|x| x.relay.as_str()).collect();
    let relay_keys: Vec<&[u8]> = p.iter().map(|x| x.key.as_bytes().as_slice()).collect();
    let pinned: Vec<i64> = p.iter().map(|x| x.pinned_at_ms).collect();
    tx.execute(
        "INSERT INTO relay_pins (relay, key, pinned_at)
         SELECT * FROM unnest($1::text[], $2::bytea[], $3::bigint[])",
        &[&relays, &relay_keys, &pinned],
    )
    .await?;

    let count = |kind| r.iter().filter(|x| x.kind == kind).count() as u64;
    Ok(Moved {
        agents: a.len() as u64,
        retired: a.iter().filter(|x| x.retired_until_ms.is_some()).count() as u64,
        invites,
        // Stored both ways.
        contacts: count(RelationKind::Contact) / 2,
        blocks: count(RelationKind::Blocked),
        requests: q.len() as u64,
        bounces: b.len() as u64,
        relay_pins: p.len() as u64,
        ..Moved::default()
    })
}

/// The waiting copies, a chunk at a time as the source reads them (off the async threads),
/// then the mailboxes' rows.
async fn mail(
    tx: &Transaction<'_>,
    mut copies: WaitingCopies,
    moved: &mut Moved,
) -> Result<(), StorageError> {
    let insert = tx
        .prepare(
            "INSERT INTO queue (recipient, seq, sender, message_id, envelope, size, accepted_at, expires_at)
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::bigint[], $7::bigint[], $8::bigint[])",
        )
        .await?;
    let mut boxes: HashMap<String, Totals> = HashMap::new();
    loop {
        let (rest, chunk) = tokio::task::spawn_blocking(move || {
            let chunk = copies.next();
            (copies, chunk)
        })
        .await
        .map_err(|e| StorageError::Database(format!("reading the waiting mail failed: {e}")))?;
        copies = rest;
        let Some(chunk) = chunk else { break };
        let chunk: Vec<WaitingCopy> = chunk?;
        let mut seqs = Vec::with_capacity(chunk.len());
        let mut sizes = Vec::with_capacity(chunk.len());
        for copy in &chunk {
            let size = i64::try_from(copy.envelope.len()).unwrap_or(i64::MAX);
            let totals = boxes.entry(copy.recipient.as_str().to_owned()).or_default();
            totals.waiting += 1;
            totals.bytes += size;
            seqs.push(totals.waiting);
            sizes.push(size);
            moved.copies += 1;
            moved.bytes += size.unsigned_abs();
        }
        let recipients: Vec<&str> = chunk.iter().map(|c| c.recipient.as_str()).collect();
        let senders: Vec<&str> = chunk.iter().map(|c| c.sender.as_str()).collect();
        let ids: Vec<String> = chunk.iter().map(|c| c.id.to_string()).collect();
        let envelopes: Vec<&[u8]> = chunk.iter().map(|c| c.envelope.as_slice()).collect();
        let accepted: Vec<i64> = chunk.iter().map(|c| c.accepted_at_ms).collect();
        let expires: Vec<i64> = chunk.iter().map(|c| c.expires_at_ms).collect();
        tx.execute(
            &insert,
            &[
                &recipients,
                &seqs,
                &senders,
                &ids,
                &envelopes,
                &sizes,
                &accepted,
                &expires,
            ],
        )
        .await?;
    }
    let mut names: Vec<&str> = boxes.keys().map(String::as_str).collect();
    names.sort_unstable();
    let next: Vec<i64> = names.iter().map(|n| boxes[*n].waiting + 1).collect();
    let waiting: Vec<i64> = names.iter().map(|n| boxes[*n].waiting).collect();
    let bytes: Vec<i64> = names.iter().map(|n| boxes[*n].bytes).collect();
    tx.execute(
        "INSERT INTO mailboxes (recipient, next_seq, waiting, bytes)
         SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
         ON CONFLICT (recipient) DO UPDATE
             SET next_seq = excluded.next_seq, waiting = excluded.waiting, bytes = excluded.bytes",
        &[&names, &next, &waiting, &bytes],
    )
    .await?;
    moved.recipients = names.len() as u64;
    Ok(())
}
