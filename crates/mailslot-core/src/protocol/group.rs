//! Groups: a name in its relay's agent namespace whose mail the relay fans out, one sealed
//! copy per member. The record the relay keeps and serves: who owns it, who may post, and the
//! roster (docs/decisions.md, "Groups").

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Address, AgentName, OwnerKey, ValidationError};

/// The most members a group has: the bound on a group's roster and on one group send's key
/// wraps (the plain-send recipient limit does not apply to group sends).
pub const MAX_GROUP_MEMBERS: usize = 256;

/// The most groups one `groups` listing returns.
pub const MAX_GROUPS_LISTED: usize = 100;

/// The most groups one agent creates on its relay: each costs the relay a record and a name.
pub const MAX_GROUPS_PER_CREATOR: usize = 100;

/// Who may post to a group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupPolicy {
    /// Agents on the roster.
    #[default]
    Members,
    /// Agents whose registered owner key is the group's owner key.
    Owner,
    /// Any agent (each member's consent to the group still applies).
    Anyone,
}

impl GroupPolicy {
    /// The name, as on the wire and in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupPolicy::Members => "members",
            GroupPolicy::Owner => "owner",
            GroupPolicy::Anyone => "anyone",
        }
    }
}

impl FromStr for GroupPolicy {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "members" => Ok(GroupPolicy::Members),
            "owner" => Ok(GroupPolicy::Owner),
            "anyone" => Ok(GroupPolicy::Anyone),
            _ => Err(ValidationError::new(
                "policy",
                format!("{s:?} is not members, owner or anyone"),
            )),
        }
    }
}

impl fmt::Display for GroupPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A group as its relay keeps and serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupView {
    /// Its name on its relay.
    pub name: AgentName,
    /// The agent that created it.
    pub creator: AgentName,
    /// The owner key that signs its roster changes: the creator's registered owner key when
    /// it was created.
    pub owner: OwnerKey,
    /// Who may post.
    pub policy: GroupPolicy,
    /// The roster, in the order members were added: local names bare, others `name@host`.
    #[serde(deserialize_with = "bounded_roster")]
    pub members: Vec<Address>,
}

impl GroupView {
    /// Whether `who` (as the group's relay writes it) is on the roster.
    pub fn has_member(&self, who: &Address) -> bool {
        self.members.contains(who)
    }
}

/// A roster read from the network, refused over [`MAX_GROUP_MEMBERS`] before it is kept.
fn bounded_roster<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Address>, D::Error> {
    struct Roster;
    impl<'de> serde::de::Visitor<'de> for Roster {
        type Value = Vec<Address>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "at most {MAX_GROUP_MEMBERS} member addresses")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(a) = seq.next_element::<Address>()? {
                if out.len() == MAX_GROUP_MEMBERS {
                    return Err(serde::de::Error::custom(format!(
                        "members: over {MAX_GROUP_MEMBERS}, the most a group has"
                    )));
                }
                out.push(a);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Roster)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_round_trip_and_name_the_choices() {
        for p in [
            GroupPolicy::Members,
            GroupPolicy::Owner,
            GroupPolicy::Anyone,
        ] {
            assert_eq!(p.as_str().parse::<GroupPolicy>().unwrap(), p);
        }
        let e = "everyone".parse::<GroupPolicy>().unwrap_err().to_string();
        assert!(e.contains("members, owner or anyone"), "{e}");
    }

    #[test]
    fn a_roster_over_the_bound_is_refused_on_reading() {
        let view = |n: usize| {
            let members: Vec<String> = (0..n).map(|i| format!("\"a{i}\"")).collect();
            format!(
                r#"{{"name":"team","creator":"lead","owner":"{}","policy":"members","members":[{}]}}"#,
                crate::protocol::b64::encode(&[1; 32]),
                members.join(",")
            )
        };
        assert!(serde_json::from_str::<GroupView>(&view(MAX_GROUP_MEMBERS)).is_ok());
        let e = serde_json::from_str::<GroupView>(&view(MAX_GROUP_MEMBERS + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("over 256"), "{e}");
    }
}
