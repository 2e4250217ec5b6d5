//! Whether a delivery connection counts as its agent being online. An owner's window (the
//! dashboard) holds the agent's delivery connection to receive its mail, but is no session of
//! the agent: it says so with `?presence=hidden` on the WebSocket URL. A query parameter, not
//! a `hello` field, because `hello` refuses unknown fields: a relay from before this ignores
//! the parameter (and shows the agent online), where it would refuse the field.

/// How a delivery connection shows in presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Shown {
    /// Online while connected (an agent's own session).
    #[default]
    Online,
    /// Delivered to, but never listed as online.
    Hidden,
}

/// The query parameter that asks for [`Shown::Hidden`].
pub const HIDDEN_QUERY: &str = "presence=hidden";

impl Shown {
    /// What the WebSocket URL's query asks for; anything else than [`HIDDEN_QUERY`] among
    /// its pairs leaves the default.
    pub fn from_query(query: Option<&str>) -> Self {
        match query {
            Some(q) if q.split('&').any(|pair| pair == HIDDEN_QUERY) => Self::Hidden,
            _ => Self::Online,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_pair_hides() {
        assert_eq!(Shown::from_query(None), Shown::Online);
        assert_eq!(Shown::from_query(Some("presence=hidden")), Shown::Hidden);
        assert_eq!(
            Shown::from_query(Some("x=1&presence=hidden")),
            Shown::Hidden
        );
        assert_eq!(Shown::from_query(Some("presence=hiddenx")), Shown::Online);
        assert_eq!(Shown::from_query(Some("presence=online")), Shown::Online);
    }
}
