//! Consent between library agents on one relay: a contact request and its approval, as the
//! consent and migration tests make them.

use mailslot::client::{ClientError, Connection};
use mailslot::protocol::{Address, ClientFrame, OwnerAct, RequestCode, ServerFrame};

use super::TestAgent;

/// `conn`'s agent asks `to` for contact; the code its owner is shown.
pub async fn request(conn: &mut Connection, to: &TestAgent) -> RequestCode {
    match conn
        .call(|r| ClientFrame::Connect {
            reference: r,
            to: to.address(),
            note: "we work on the relay together".into(),
        })
        .await
        .unwrap()
    {
        ServerFrame::Requested { code, .. } => code,
        other => panic!("expected requested, got {other:?}"),
    }
}

/// `by`'s owner approves `from`'s request on `by`'s connection.
pub async fn approve(
    conn: &mut Connection,
    by: &TestAgent,
    from: &TestAgent,
    code: RequestCode,
) -> Result<ServerFrame, ClientError> {
    let owner_signature = by.owner_signs(
        conn,
        &OwnerAct::Approve {
            from: &from.address(),
            code: &code,
        },
    );
    conn.call(|r| ClientFrame::Approve {
        reference: r,
        from: from.address(),
        code,
        dry_run: false,
        owner_signature,
    })
    .await
}

/// `by`'s owner denies `from`'s request on `by`'s connection.
pub async fn deny(
    conn: &mut Connection,
    by: &TestAgent,
    from: &Address,
) -> Result<ServerFrame, ClientError> {
    let owner_signature = by.owner_signs(conn, &OwnerAct::Deny(from));
    conn.call(|r| ClientFrame::Deny {
        reference: r,
        agent: from.clone(),
        owner_signature,
    })
    .await
}
