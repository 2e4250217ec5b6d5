//! Bounces: the relay keeps a record for each copy of this agent's mail that expired
//! undelivered until the agent asks for it and acknowledges it. The client asks on every
//! connection and whenever the relay says `bounced`, records them in the store, and only then
//! acknowledges them, so a bounce is never lost; one delivered twice is recorded once.

use super::{ClientError, Connection};
use crate::protocol::{Bounce, ClientFrame, ErrorCode, MAX_BOUNCES, ServerFrame};
use crate::store::StoreHandle;

/// Fetches the waiting bounces, records them, acknowledges them; returns those recorded now.
pub async fn collect(
    conn: &mut Connection,
    store: &StoreHandle,
) -> Result<Vec<Bounce>, ClientError> {
    let mut recorded = Vec::new();
    loop {
        let answer = match conn
            .call(|reference| ClientFrame::Bounces { reference })
            .await
        {
            // A relay from before bounces refuses the frame; it has none to give.
            Err(ClientError::Refused {
                code: ErrorCode::BadFrame | ErrorCode::UnexpectedFrame,
                ..
            }) => {
                tracing::debug!("the relay does not keep bounces");
                return Ok(recorded);
            }
            other => other?,
        };
        let bounces = match answer {
            ServerFrame::BounceList { bounces, .. } if bounces.len() <= MAX_BOUNCES => bounces,
            other => {
                return Err(ClientError::Protocol(format!(
                    "expected a bounce_list of at most {MAX_BOUNCES}, got {other:?}"
                )));
            }
        };
        if bounces.is_empty() {
            return Ok(recorded);
        }
        let more = bounces.len() == MAX_BOUNCES;
        let keys = bounces.iter().map(Bounce::key).collect();
        let batch = bounces.clone();
        recorded.extend(store.call(move |s| s.record_bounces(&batch)).await?);
        conn.call(|reference| ClientFrame::AckBounces {
            reference,
            bounces: keys,
        })
        .await?;
        if !more {
            return Ok(recorded);
        }
    }
}
