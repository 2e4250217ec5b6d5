//! The reading side of `mailslot relay migrate`: a stopped relay's database and spool as a
//! [`Snapshot`], read without changing either. The tables are read whole; the waiting copies
//! are read from the spool in chunks of at most [`CHUNK_BYTES`] of envelopes (or one larger
//! copy), so only the queue index (a few dozen bytes per copy, as the relay itself holds) and
//! one chunk are in memory at once.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::iter::Peekable;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::clock::now_ms;
use super::index::{QueueIndex, WaitingRow};
use super::{scan, schema, spool};
use crate::protocol::{
    Address, AgentName, Bounce, MessageId, OwnerKey, Policy, PublicKeys, RequestCode,
};
use crate::storage::registry::rotations_from_column;
use crate::storage::relays::{OWN_KEY, parse_own_key};
use crate::storage::{
    AgentRecord, InviteRecord, RelationKind, RelationRecord, RequestRecord, Snapshot, StorageError,
    WaitingCopy,
};

/// Envelope bytes one chunk of waiting copies holds at most (a single larger copy makes a
/// chunk of its own).
pub(super) const CHUNK_BYTES: usize = 4 << 20;
/// Copies one chunk holds at most.
const CHUNK_COPIES: usize = 1024;

/// Reads the stopped relay's database at `path` and its spool (see the module docs).
pub(super) fn export(path: &Path) -> Result<Snapshot, StorageError> {
    if !path.is_file() {
        return Err(StorageError::Database(format!(
            "no relay database at {}; pass the stopped relay's database file with --from",
            path.display()
        )));
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let version = conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))?;
    let current = schema::MIGRATIONS.len();
    if usize::try_from(version).ok() != Some(current) {
        return Err(StorageError::Database(format!(
            "{} has schema {version}, this build {current}: start the relay on it once with this build (it brings the schema up to date), stop it, then migrate",
            path.display()
        )));
    }
    let relay_id: String = conn
        .query_row("SELECT value FROM meta WHERE key = 'relay_id'", [], |r| {
            r.get(0)
        })
        .optional()?
        .ok_or_else(|| {
            StorageError::Database(format!(
                "{} has no relay id: it was never opened by a relay",
                path.display()
            ))
        })?;
    let relay_key = conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [OWN_KEY], |r| {
            r.get::<_, String>(0)
        })
        .optional()?
        .map(parse_own_key)
        .transpose()?;
    let now = now_ms();
    let mut bounces = bounces(&conn)?;
    let scanned = scan::scan(&spool::dir_of(path))?;
    let (index, expired) = QueueIndex::load_expiring(&scanned.segments, now);
    // Copies that expired while the relay was stopped bounce, as its next start would have
    // bounced them; one that already bounced is not recorded twice.
    let known: HashSet<(AgentName, MessageId, Address)> = bounces
        .iter()
        .map(|(sender, b)| (sender.clone(), b.id, b.to.clone()))
        .collect();
    let expired_at = Timestamp::from_millisecond(now).unwrap_or(Timestamp::UNIX_EPOCH);
    for (sender, to, id) in expired {
        let to = Address::local(to);
        if !known.contains(&(sender.clone(), id, to.clone())) {
            bounces.push((sender, Bounce { id, to, expired_at }));
        }
    }
    Ok(Snapshot {
        relay_id,
        relay_key,
        agents: agents(&conn, now)?,
        invites: invites(&conn)?,
        relations: relations(&conn)?,
        requests: requests(&conn, now)?,
        bounces,
        relay_pins: super::relays::all(&conn)?,
        damaged_records: scanned.damaged.len(),
        copies: Box::new(Chunks {
            dir: spool::dir_of(path),
            rows: index.waiting_rows().into_iter().peekable(),
            files: HashMap::new(),
        }),
    })
}

/// A value read from the database that does not validate.
fn invalid(table: &str, what: &str, why: impl std::fmt::Display) -> StorageError {
    StorageError::Database(format!("a row of {table} has an invalid {what}: {why}"))
}

fn name(table: &str, what: &str, raw: &str) -> Result<AgentName, StorageError> {
    AgentName::new(raw).map_err(|e| invalid(table, what, e))
}

fn key32(table: &str, what: &str, raw: Vec<u8>) -> Result<[u8; 32], StorageError> {
    raw.try_into()
        .map_err(|_| invalid(table, what, "not 32 bytes"))
}

/// Registered agents, and retired names still held (a name past its hold is free: it stays).
fn agents(conn: &Connection, now: i64) -> Result<Vec<AgentRecord>, StorageError> {
    let mut stmt = conn.prepare(
        "SELECT name, signing, sealing, registered_at, policy, listing, owner, retired_until, rotations
         FROM agents WHERE retired_until IS NULL OR retired_until > ?1 ORDER BY name",
    )?;
    let mut rows = stmt.query([now])?;
    let mut agents = Vec::new();
    while let Some(r) = rows.next()? {
        let policy: Option<String> = r.get(4)?;
        let owner: Option<Vec<u8>> = r.get(6)?;
        agents.push(AgentRecord {
            name: name("agents", "name", &r.get::<_, String>(0)?)?,
            keys: PublicKeys {
                signing: key32("agents", "signing key", r.get(1)?)?,
                sealing: key32("agents", "sealing key", r.get(2)?)?,
            },
            registered_at_ms: r.get(3)?,
            policy: policy
                .map(|p| {
                    p.parse::<Policy>()
                        .map_err(|e| invalid("agents", "policy", e))
                })
                .transpose()?,
            listing: r.get(5)?,
            owner: owner
                .map(|k| key32("agents", "owner key", k).map(OwnerKey::from_bytes))
                .transpose()?,
            retired_until_ms: r.get(7)?,
            rotations: rotations_from_column(
                &r.get::<_, String>(0)?,
                r.get::<_, Option<String>>(8)?.as_deref(),
            )?,
        });
    }
    Ok(agents)
}

/// Invites not used yet.
fn invites(conn: &Connection) -> Result<Vec<InviteRecord>, StorageError> {
    let mut stmt = conn.prepare(
        "SELECT digest, created_at FROM invites WHERE used_by IS NULL ORDER BY created_at",
    )?;
    let mut rows = stmt.query([])?;
    let mut invites = Vec::new();
    while let Some(r) = rows.next()? {
        invites.push(InviteRecord {
            digest: key32("invites", "digest", r.get(0)?)?,
            created_at_ms: r.get(1)?,
        });
    }
    Ok(invites)
}

fn relations(conn: &Connection) -> Result<Vec<RelationRecord>, StorageError> {
    let mut stmt =
        conn.prepare("SELECT owner, peer, kind, since FROM relations ORDER BY owner, peer")?;
    let mut rows = stmt.query([])?;
    let mut relations = Vec::new();
    while let Some(r) = rows.next()? {
        let kind = match r.get::<_, String>(2)?.as_str() {
            "contact" => RelationKind::Contact,
            "blocked" => RelationKind::Blocked,
            other => return Err(invalid("relations", "kind", other)),
        };
        relations.push(RelationRecord {
            owner: name("relations", "owner", &r.get::<_, String>(0)?)?,
            peer: name("relations", "peer", &r.get::<_, String>(1)?)?,
            kind,
            since_ms: r.get(3)?,
        });
    }
    Ok(relations)
}

/// Contact requests that have not lapsed.
fn requests(conn: &Connection, now: i64) -> Result<Vec<RequestRecord>, StorageError> {
    let mut stmt = conn.prepare(
        "SELECT requester, target, note, code, expires_at FROM contact_requests
         WHERE expires_at >= ?1 ORDER BY requester, target",
    )?;
    let mut rows = stmt.query([now])?;
    let mut requests = Vec::new();
    while let Some(r) = rows.next()? {
        requests.push(RequestRecord {
            requester: name("contact_requests", "requester", &r.get::<_, String>(0)?)?,
            target: name("contact_requests", "target", &r.get::<_, String>(1)?)?,
            note: r.get(2)?,
            code: RequestCode::parse(&r.get::<_, String>(3)?)
                .map_err(|e| invalid("contact_requests", "code", e))?,
            expires_at_ms: r.get(4)?,
        });
    }
    Ok(requests)
}

/// Bounces not fetched yet, with their senders.
fn bounces(conn: &Connection) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
    let mut stmt = conn.prepare(
        "SELECT sender, message_id, recipient, expired_at FROM bounces
         ORDER BY sender, expired_at, message_id, recipient",
    )?;
    let mut rows = stmt.query([])?;
    let mut bounces = Vec::new();
    while let Some(r) = rows.next()? {
        let at: i64 = r.get(3)?;
        bounces.push((
            // A queue's sender: an agent, or a relay mailbox for mail that came over a link.
            AgentName::from_stored(&r.get::<_, String>(0)?)
                .map_err(|e| invalid("bounces", "sender", e))?,
            Bounce {
                id: MessageId::parse(&r.get::<_, String>(1)?)
                    .map_err(|e| invalid("bounces", "message_id", e))?,
                to: Address::parse(&r.get::<_, String>(2)?)
                    .map_err(|e| invalid("bounces", "recipient", e))?,
                expired_at: Timestamp::from_millisecond(at)
                    .map_err(|e| invalid("bounces", "expired_at", e))?,
            },
        ));
    }
    Ok(bounces)
}

/// The waiting copies, read from the spool a chunk at a time.
struct Chunks {
    dir: PathBuf,
    rows: Peekable<std::vec::IntoIter<WaitingRow>>,
    /// Segments opened so far.
    files: HashMap<u32, File>,
}

impl Chunks {
    /// Reads one copy's record back from its segment.
    fn read(&mut self, row: WaitingRow) -> Result<WaitingCopy, StorageError> {
        let file = match self.files.entry(row.at.seg) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let path = spool::segment_path(&self.dir, row.at.seg);
                e.insert(File::open(&path).map_err(|err| spool::io_error("opening", &path, err))?)
            }
        };
        let len = spool::stored_len(&row.recipient, &row.sender, row.size);
        let record = spool::read_run(file, row.at, len)?;
        let (seq, accepted_at_ms, envelope) = spool::parse_stored(row.at, &record)?;
        if seq != row.seq {
            return Err(StorageError::Database(format!(
                "spool segment {} at byte {} holds copy {seq}, not {}",
                row.at.seg, row.at.offset, row.seq
            )));
        }
        Ok(WaitingCopy {
            recipient: row.recipient,
            sender: row.sender,
            id: row.id,
            envelope,
            accepted_at_ms,
            expires_at_ms: row.expires_at_ms,
        })
    }
}

impl Iterator for Chunks {
    type Item = Result<Vec<WaitingCopy>, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut chunk = Vec::new();
        let mut bytes = 0;
        while chunk.len() < CHUNK_COPIES
            && let Some(row) = self
                .rows
                .next_if(|r| chunk.is_empty() || bytes + r.size as usize <= CHUNK_BYTES)
        {
            bytes += row.size as usize;
            match self.read(row) {
                Ok(copy) => chunk.push(copy),
                Err(e) => return Some(Err(e)),
            }
        }
        (!chunk.is_empty()).then_some(Ok(chunk))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::SqliteStorage;
    use super::*;
    use crate::storage::{Accepted, Queue, QueuedCopy, Quota};

    fn name(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    #[tokio::test]
    async fn waiting_copies_come_in_bounded_chunks_and_expired_ones_as_bounces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("relay.db");
        let storage = SqliteStorage::open(&path).unwrap();
        let quota = Quota {
            count: 100,
            bytes: 1 << 30,
        };
        let far = now_ms() + 3_600_000;
        // Three copies of 3 MiB for bob (no two fit one chunk), and one for carol that is past
        // its expiry when the relay stops (expiry did not run yet).
        let mut sent = Vec::new();
        for (to, fill, expires) in [
            ("bob", 1u8, far),
            ("carol", 9, now_ms() - 1),
            ("bob", 2, far),
            ("bob", 3, far),
        ] {
            let id = MessageId::new();
            let envelope: Arc<[u8]> = vec![fill; 3 << 20].into();
            let copies = vec![QueuedCopy {
                id: None,
                recipient: name(to),
                envelope,
                group: None,
            }];
            let accepted = storage
                .accept(name("alice"), id, copies, quota, expires, Policy::Open)
                .await
                .unwrap();
            assert!(matches!(accepted, Accepted::Stored(_)), "{accepted:?}");
            sent.push((to, fill, id));
        }
        drop(storage);

        let snapshot = export(&path).unwrap();
        assert_eq!(snapshot.bounces.len(), 1, "{:?}", snapshot.bounces);
        let (sender, bounce) = &snapshot.bounces[0];
        assert_eq!(
            (sender, &bounce.to, bounce.id),
            (&name("alice"), &Address::local(name("carol")), sent[1].2)
        );
        let chunks: Vec<Vec<WaitingCopy>> = snapshot.copies.map(Result::unwrap).collect();
        assert_eq!(chunks.len(), 3, "one 3 MiB copy per chunk");
        let got: Vec<(AgentName, u8, MessageId)> = chunks
            .into_iter()
            .flatten()
            .map(|c| {
                assert!(c.envelope.len() <= CHUNK_BYTES);
                (c.recipient, c.envelope[0], c.id)
            })
            .collect();
        let bob: Vec<(AgentName, u8, MessageId)> = sent
            .iter()
            .filter(|(to, ..)| *to == "bob")
            .map(|(to, fill, id)| (name(to), *fill, *id))
            .collect();
        assert_eq!(got, bob, "bob's copies, in the order they were sent");
    }
}
