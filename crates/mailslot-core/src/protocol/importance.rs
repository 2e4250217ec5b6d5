//! How urgent the sender says a message is. Sealed with the message: the relay never sees it.

use serde::{Deserialize, Serialize};

use super::ValidationError;

/// The sender's importance mark. Ordered: `Normal < High < Urgent`, so a filter can ask for
/// "at least high".
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Importance {
    /// The default; not shown.
    #[default]
    Normal,
    /// Worth reading before normal mail.
    High,
    /// Needs attention now.
    Urgent,
}

impl Importance {
    /// Every value, lowest first.
    pub const ALL: [Importance; 3] = [Self::Normal, Self::High, Self::Urgent];

    /// Its name, as in JSON, tool arguments and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::High => "high",
            Self::Urgent => "urgent",
        }
    }

    /// Its rank in the store (0, 1, 2): ordered like the enum, so "at least" is `>=`.
    pub fn rank(self) -> i64 {
        self as i64
    }

    /// Whether it is the default (left out of the sealed message, so older clients read it).
    pub fn is_normal(&self) -> bool {
        *self == Self::Normal
    }
}

impl std::fmt::Display for Importance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Importance {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|i| i.as_str() == s.trim())
            .ok_or_else(|| {
                ValidationError::new(
                    "importance",
                    format!("{s:?} is not an importance: use normal, high or urgent"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_orders_and_refuses_others() {
        assert_eq!("urgent".parse::<Importance>().unwrap(), Importance::Urgent);
        assert!(Importance::Normal < Importance::High && Importance::High < Importance::Urgent);
        let ranks: Vec<i64> = Importance::ALL.iter().map(|i| i.rank()).collect();
        assert_eq!(
            ranks,
            [0, 1, 2],
            "the store's CHECK and filter rely on these"
        );
        let err = "critical".parse::<Importance>().unwrap_err();
        assert_eq!(err.field, "importance");
        assert!(err.problem.contains("normal, high or urgent"), "{err}");
    }
}
