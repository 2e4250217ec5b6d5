//! The consent rule a send is checked against: the recipient's policy and how it relates to
//! the sender, read inside the writer's batch (so a consent change and a send never race) and
//! remembered in the queue's index until the next consent change.

use rusqlite::OptionalExtension;

use crate::protocol::{AgentName, Policy};
use crate::storage::StorageError;

/// What decides whether `recipient` takes mail from `sender`: the recipient's own policy
/// (if it set one) and how it relates to the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rule {
    policy: Option<Policy>,
    relation: Relation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relation {
    None,
    Contact,
    Blocked,
}

impl Rule {
    /// Reads the rule for mail from `sender` to `recipient`.
    pub(super) fn read(
        tx: &rusqlite::Transaction<'_>,
        sender: &AgentName,
        recipient: &AgentName,
    ) -> Result<Self, StorageError> {
        let (policy, kind): (Option<String>, Option<String>) = tx
            // The sender's own row first, else a block of its whole relay (`*@host`).
            .prepare_cached(
                "SELECT a.policy, (SELECT kind FROM relations WHERE owner = a.name
                                       AND peer IN (?2, '*@' || substr(?2, instr(?2, '@') + 1))
                                   ORDER BY peer = ?2 DESC LIMIT 1)
                 FROM agents a WHERE a.name = ?1",
            )?
            .query_row([recipient.as_str(), sender.as_str()], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()?
            .unwrap_or((None, None));
        Ok(Self {
            policy: policy.and_then(|p| p.parse().ok()),
            relation: match kind.as_deref() {
                Some("blocked") => Relation::Blocked,
                Some("contact") => Relation::Contact,
                _ => Relation::None,
            },
        })
    }

    /// Whether the recipient joined the group this rule was read for (the group's row is a
    /// contact) and is not closed: the group's copy passes its consent.
    pub(super) fn joined(self) -> bool {
        self.relation == Relation::Contact && self.policy != Some(Policy::Closed)
    }

    /// Whether the recipient blocks the sender (or its relay).
    pub(super) fn blocked(self) -> bool {
        self.relation == Relation::Blocked
    }

    /// Blocks always refuse; contacts pass unless the recipient is closed; anyone else passes
    /// only an open policy (the recipient's, else `default`).
    pub(super) fn allows(self, default: Policy) -> bool {
        let policy = self.policy.unwrap_or(default);
        match self.relation {
            Relation::Blocked => false,
            Relation::Contact => policy != Policy::Closed,
            Relation::None => policy == Policy::Open,
        }
    }
}
