//! The unread-mail footer: one line on every tool result, the doorbell that works in every
//! client. It names the count and the newest sender (a verified address, or the owner when
//! the owner key's signature verified), never the subject: a sender's words reach a model
//! only inside a fence, and a footer has none.

use crate::store::UnreadSummary;

/// The footer for `summary`, or `None` when nothing is unread.
pub fn footer(summary: &UnreadSummary) -> Option<String> {
    let from = summary.newest_from.as_ref()?;
    let count = summary.count;
    let noun = if count == 1 { "message" } else { "messages" };
    if summary.newest_from_owner {
        return Some(format!(
            "[mailslot] {count} unread {noun}; newest from your owner (signed with the owner key). Read with the inbox tool."
        ));
    }
    Some(format!(
        "[mailslot] {count} unread {noun}; newest from {from}. Read with the inbox tool."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Address;

    #[test]
    fn one_line_with_count_sender_and_subject() {
        assert_eq!(
            footer(&UnreadSummary {
                count: 0,
                newest_from: None,
                newest_from_owner: false,
            }),
            None
        );
        let line = footer(&UnreadSummary {
            count: 3,
            newest_from: Some(Address::parse("bob").unwrap()),
            newest_from_owner: false,
        })
        .unwrap();
        assert_eq!(
            line,
            "[mailslot] 3 unread messages; newest from bob. Read with the inbox tool."
        );
        let line = footer(&UnreadSummary {
            count: 1,
            newest_from: Some(Address::parse("bob").unwrap()),
            newest_from_owner: true,
        })
        .unwrap();
        assert_eq!(
            line,
            "[mailslot] 1 unread message; newest from your owner (signed with the owner key). Read with the inbox tool."
        );
    }
}
