//! Deliveries: which recipients took their copy of this agent's sent mail. When the relay
//! takes a message, each recipient's copy is recorded as open, for that relay; the client
//! asks the relay about open copies ([`Store::open_copies`]) and records what it says
//! ([`Store::record_copy_states`]): a copy taken is delivered (at the time of the check that
//! found it gone), and a copy nobody can say about any more is closed. A bounce or a
//! receipt closes a copy too: it says more than "delivered" could.

use jiff::Timestamp;
use rusqlite::{Transaction, params};
use serde::{Deserialize, Serialize};

use super::time::{from_ms, to_ms};
use super::{Store, StoreError};
use crate::protocol::{Address, CopyFate, CopyKey, CopyState, Message, MessageId};

/// A recipient's copy of a sent message that its recipient took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    /// The sent message.
    pub id: MessageId,
    /// The recipient, as addressed.
    pub to: Address,
    /// When the relay was found to no longer hold it: the recipient took it no later.
    pub at: Timestamp,
}

/// A copy still asked about, in the order they are asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCopy {
    /// When the relay took its message (Unix ms).
    pub taken_at: i64,
    /// Which copy.
    pub key: CopyKey,
}

/// Records each recipient's copy of `message`, which the relay `relay` just took, as open,
/// inside the caller's transaction. Receipts are not tracked: nobody asks where they stand.
pub(super) fn open_in(
    tx: &Transaction<'_>,
    (message, members): (&Message, Option<&[Address]>),
    relay: &str,
    taken_at: Timestamp,
) -> Result<(), StoreError> {
    if message.receipt.is_some() {
        return Ok(());
    }
    let mut insert = tx.prepare_cached(
        "INSERT INTO deliveries (message_id, recipient, agent, relay, taken_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )?;
    let copies: Vec<&Address> = match members {
        Some(members) => members.iter().collect(),
        None => message.recipients().collect(),
    };
    for to in copies {
        insert.execute(params![
            message.id.to_string(),
            to.to_string(),
            delivery_key(to),
            relay,
            to_ms(taken_at)
        ])?;
    }
    Ok(())
}

/// Closes `agent`'s copy of `id` (a bounce or a receipt says where it stands now).
pub(super) fn close_in(
    tx: &Transaction<'_>,
    id: &MessageId,
    to: &Address,
) -> Result<(), StoreError> {
    tx.prepare_cached("UPDATE deliveries SET open = 0 WHERE message_id = ?1 AND agent = ?2")?
        .execute(params![id.to_string(), delivery_key(to)])?;
    Ok(())
}

/// How a recipient's copy is named when the relay is asked about it: the bare name on the
/// sender's relay, the full address on another (the relay answers for those through its
/// queue for that relay).
fn delivery_key(to: &Address) -> String {
    match to.host() {
        None => to.name().to_string(),
        Some(_) => to.to_string(),
    }
}

#[derive(Deserialize)]
struct Row(String, i64);

/// Reads the deliveries column of a message row (a JSON array of `[recipient, at]`: a local
/// recipient by bare name, another relay's by full address, as [`delivery_key`] writes them).
pub(super) fn decode_delivered(
    json: Option<&str>,
) -> Result<Vec<(Address, Timestamp)>, StoreError> {
    let corrupt = |detail: String| StoreError::Corrupt {
        what: "delivery",
        detail,
    };
    let rows: Vec<Row> =
        serde_json::from_str(json.unwrap_or("[]")).map_err(|e| corrupt(e.to_string()))?;
    rows.into_iter()
        .map(|Row(agent, at)| {
            Ok((
                Address::parse(&agent).map_err(|e| corrupt(e.to_string()))?,
                from_ms(at)?,
            ))
        })
        .collect()
}

/// Reads back every copy row (its message id and recipient); how many there are.
pub(super) fn check_rows(conn: &rusqlite::Connection) -> Result<u64, StoreError> {
    let mut stmt = conn.prepare("SELECT message_id, agent, recipient FROM deliveries")?;
    let mut rows = stmt.query([])?;
    let mut n = 0;
    while let Some(row) = rows.next()? {
        let (id, agent, recipient): (String, String, String) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "delivery",
            detail: format!("copy of {id} for {recipient:?}: {detail}"),
        };
        MessageId::parse(&id).map_err(|e| corrupt(e.to_string()))?;
        Address::parse(&agent).map_err(|e| corrupt(e.to_string()))?;
        Address::parse(&recipient).map_err(|e| corrupt(e.to_string()))?;
        n += 1;
    }
    Ok(n)
}

impl Store {
    /// Open copies asked about at the relay `relay`, oldest first, after `after` (exclusive),
    /// at most `limit`.
    pub fn open_copies(
        &self,
        relay: &str,
        after: Option<&OpenCopy>,
        limit: usize,
    ) -> Result<Vec<OpenCopy>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT taken_at, message_id, agent FROM deliveries
             WHERE open = 1 AND relay = ?1
               AND (taken_at, message_id, agent) > (?2, ?3, ?4)
             ORDER BY taken_at, message_id, agent LIMIT ?5",
        )?;
        let (at, id, to) = after.map_or((i64::MIN, String::new(), String::new()), |a| {
            (a.taken_at, a.key.id.to_string(), a.key.to.to_string())
        });
        let rows = stmt.query_map(params![relay, at, id, to, limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let corrupt = |detail: String| StoreError::Corrupt {
            what: "delivery",
            detail,
        };
        rows.map(|row| {
            let (taken_at, id, agent) = row?;
            Ok(OpenCopy {
                taken_at,
                key: CopyKey {
                    id: MessageId::parse(&id).map_err(|e| corrupt(e.to_string()))?,
                    to: Address::parse(&agent).map_err(|e| corrupt(e.to_string()))?,
                },
            })
        })
        .collect()
    }

    /// Records what the relay said about open copies, checked at `at`: a copy it no longer
    /// holds (`gone`) is delivered at `at`, one it cannot say about (`unknown`) is closed;
    /// waiting and bounced ones stay open (a bounce closes its copy when it is recorded).
    /// Returns the deliveries recorded now: a copy is delivered once, however often asked.
    pub fn record_copy_states(
        &mut self,
        states: &[CopyState],
        at: Timestamp,
    ) -> Result<Vec<Delivery>, StoreError> {
        let tx = self.write_tx()?;
        let mut delivered = Vec::new();
        {
            let mut deliver = tx.prepare_cached(
                "UPDATE deliveries SET delivered_at = ?3, open = 0
                 WHERE message_id = ?1 AND agent = ?2 AND open = 1 RETURNING recipient",
            )?;
            let mut close = tx.prepare_cached(
                "UPDATE deliveries SET open = 0 WHERE message_id = ?1 AND agent = ?2",
            )?;
            for s in states {
                let (id, agent) = (s.id.to_string(), delivery_key(&s.to));
                match s.state {
                    CopyFate::Gone => {
                        let mut rows = deliver.query(params![id, agent, to_ms(at)])?;
                        while let Some(row) = rows.next()? {
                            let to: String = row.get(0)?;
                            delivered.push(Delivery {
                                id: s.id,
                                to: Address::parse(&to).map_err(|e| StoreError::Corrupt {
                                    what: "delivery",
                                    detail: e.to_string(),
                                })?,
                                at,
                            });
                        }
                    }
                    CopyFate::Unknown => {
                        close.execute(params![id, agent])?;
                    }
                    CopyFate::Waiting | CopyFate::Bounced => {}
                }
            }
        }
        tx.commit()?;
        Ok(delivered)
    }
}
