//! `bench relay --group N`: one sender and a group of N members on the first relay. The group
//! is made, its members added (signed by the group's owner key) and joined (each signed by
//! its owner's) before the timed phase; the sender then sends every message to the group,
//! sealed once for the N members, flat out. Reported: send → last member delivered (p50,
//! p99) per message, and member copies per second beside the plain sends' delivered+acked/s
//! measured just before on the same relays. Every member must get every message once.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::bail;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::RelayBenchArgs;
use super::relay::{Relays, Socket, Tally, agents, drive, login_as, on_every_core};
use super::stats::Summary;
use crate::crypto::{Owner, PublicIdentity, seal_for_group};
use crate::protocol::{Address, ClientFrame, GroupPolicy, Limits, Message, OwnerAct, ServerFrame};

/// Sends `frame` and waits for its answer (frames in between are not expected: nothing is
/// sent to these agents before the timed phase).
async fn ask(ws: &mut Socket, frame: ClientFrame) -> anyhow::Result<ServerFrame> {
    let reference = frame.reference().unwrap_or_default().to_owned();
    ws.send(WsMessage::Text(serde_json::to_string(&frame)?.into()))
        .await?;
    loop {
        let Some(Ok(WsMessage::Text(text))) = ws.next().await else {
            bail!("the relay closed the connection while setting up the group")
        };
        match serde_json::from_str::<ServerFrame>(&text)? {
            ServerFrame::Error { code, message, .. } => bail!("relay refused: {code}: {message}"),
            answer if answer.reference() == Some(reference.as_str()) => return Ok(answer),
            _ => {}
        }
    }
}

/// The group run: `members` members, names tagged with `tag`; `plain` is the plain sends'
/// delivered+acked/s to compare member copies with.
pub(super) async fn run(
    relays: &Relays,
    args: &RelayBenchArgs,
    (members, tag): (usize, &str),
    plain: f64,
) -> anyhow::Result<Vec<Summary>> {
    let url = relays.url(0);
    let owner = Owner::generate();
    let crowd = agents(members + 1, &format!("group-{tag}-"))?;
    let (sender, crowd) = crowd.split_first().expect("at least the sender");
    let group = crate::protocol::AgentName::new(&format!("team-{tag}"))?;
    let at = Address::local(group.clone());
    let (mut lead, relay, nonce) =
        login_as(url, (&sender.name, &sender.identity), Some(owner.public())).await?;
    ask(
        &mut lead,
        ClientFrame::CreateGroup {
            reference: "create".into(),
            group: group.clone(),
            policy: GroupPolicy::Members,
        },
    )
    .await?;
    // Members register as they log in, before they can be added; then each one's owner
    // joins it on its own connection.
    let mut sockets = Vec::with_capacity(members);
    for m in crowd {
        sockets.push(login_as(url, (&m.name, &m.identity), Some(owner.public())).await?);
    }
    for (i, (m, (ws, their_relay, their_nonce))) in crowd.iter().zip(&mut sockets).enumerate() {
        let member = Address::local(m.name.clone());
        let act = OwnerAct::GroupAdd {
            group: &group,
            member: &member,
        };
        let owner_signature = owner.sign(&relay, &nonce, &sender.name, &act).to_vec();
        let add = ClientFrame::GroupAdd {
            reference: format!("add{i}"),
            group: group.clone(),
            member,
            owner_signature,
        };
        ask(&mut lead, add).await?;
        let owner_signature = owner
            .sign(their_relay, their_nonce, &m.name, &OwnerAct::Join(&at))
            .to_vec();
        let join = ClientFrame::Join {
            reference: "join".into(),
            group: at.clone(),
            owner_signature,
        };
        ask(ws, join).await?;
    }
    let count = (args.messages as usize / members).max(1);
    eprintln!(
        "sealing {count} messages of {} bytes for a group of {members}…",
        args.size
    );
    let keys: Vec<(Address, PublicIdentity)> = crowd
        .iter()
        .map(|m| (Address::local(m.name.clone()), m.identity.public().clone()))
        .collect();
    let from = Address::local(sender.name.clone());
    let outgoing = on_every_core(count, |i| {
        let m = Message::new(
            from.clone(),
            vec![at.clone()],
            "bench",
            "x".repeat(args.size as usize),
        );
        let envelope = seal_for_group(&m, &sender.identity, &keys, &Limits::default())?;
        let frame = ClientFrame::Send {
            reference: i.to_string(),
            envelope,
            group: Some(group.clone()),
        };
        Ok((m.id, serde_json::to_string(&frame)?))
    })?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();
    let mut tasks = vec![tokio::spawn(drive(lead, outgoing, 0, None, tally.clone()))];
    tasks.extend(
        sockets
            .into_iter()
            .map(|(ws, ..)| tokio::spawn(drive(ws, Vec::new(), count, None, tally.clone()))),
    );
    for t in tasks {
        t.await??;
    }
    let elapsed = started.elapsed();
    let tally = Arc::try_unwrap(tally)
        .map_err(|_| anyhow::anyhow!("tasks still hold results"))?
        .into_inner()
        .map_err(|_| anyhow::anyhow!("poisoned"))?;
    let once = tally.received.values().all(|n| *n as usize == members);
    if tally.received.len() != count || !once {
        bail!(
            "exactly-once violated: {} of {count} group messages arrived, not every one once at each of {members} members",
            tally.received.len()
        );
    }
    let latencies: Vec<_> = tally
        .sent_at
        .iter()
        .filter_map(|(id, sent)| Some(*tally.last.get(id)? - *sent))
        .collect();
    let copies = (count * members) as f64 / elapsed.as_secs_f64();
    let share = copies / plain * 100.0;
    eprintln!(
        "group of {members}: {count} messages, {copies:.0} member copies/s ({share:.0} % of the plain sends' {plain:.0} delivered+acked/s), every member got each once"
    );
    Ok(vec![
        Summary::new(
            format!(
                "send→last of {members} members delivered, one sender flat out (ops/s = group messages)"
            ),
            latencies,
            elapsed,
        ),
        Summary::figure(
            format!("group of {members}: member copies delivered+acked"),
            copies,
            "copies/s",
        ),
        Summary::figure(
            format!("group of {members}: member copies/s, share of plain sends' delivered+acked/s"),
            share,
            "%",
        ),
    ])
}
