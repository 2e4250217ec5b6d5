//! A session ending while its last ack commits: the agent's next session must not read the
//! queue before that ack is applied.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::crypto::Identity;
use crate::crypto::sign::{Domain, signature};
use crate::protocol::{
    Address, AgentName, Bounce, ClientFrame, CopyKey, GroupView, MessageId, OwnerKey, Policy,
    ProjectName, PublicKeys, RelayKey, RelayName, RequestCode, Reservation, ReservationId,
    ReservationRequest, Seq, ServerFrame, Shown, Ttl, hello_payload,
};
use crate::storage::{
    Accepted, AckOutcome, CommitListener, ConsentChange, ConsentLedger, ConsentOutcome,
    ConsentState, Epoch, GroupCreation, Groups, InviteDigest, Pending, Queue, Queued, QueuedCopy,
    Quota, Registration, Registry, RelayPin, RelayPinRecord, RelayPins, Reservations, Reserve,
    RosterChange, SqliteStorage, Storage, StorageError, StorageMetrics, Which,
};
use crate::{Relay, RelayConfig};

const TIMEOUT: Duration = Duration::from_secs(20);

/// How long an ack is held when nothing reads the queue meanwhile (the fixed relay).
const HOLD: Duration = Duration::from_millis(300);

/// SQLite storage whose acks are held back, as a busy group commit would: each one is
/// applied only after a queue read (which then saw the acked mail still stored) or after
/// [`HOLD`].
struct SlowAcks {
    inner: SqliteStorage,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    holding: AtomicBool,
    arrived: Notify,
    read_while_held: AtomicBool,
    release: Notify,
}

impl Registry for SlowAcks {
    async fn register(
        &self,
        name: AgentName,
        keys: PublicKeys,
        invite: Option<InviteDigest>,
    ) -> Result<Registration, StorageError> {
        self.inner.register(name, keys, invite).await
    }

    async fn keys(&self, name: AgentName) -> Result<Option<PublicKeys>, StorageError> {
        self.inner.keys(name).await
    }

    async fn owner(&self, name: AgentName) -> Result<Option<OwnerKey>, StorageError> {
        self.inner.owner(name).await
    }

    async fn rotate(&self, rotation: crate::protocol::KeyRotation) -> Result<bool, StorageError> {
        self.inner.rotate(rotation).await
    }

    async fn rotations(
        &self,
        name: AgentName,
    ) -> Result<Vec<crate::protocol::KeyRotation>, StorageError> {
        self.inner.rotations(name).await
    }

    async fn retire(&self, name: AgentName, until_ms: i64) -> Result<bool, StorageError> {
        self.inner.retire(name, until_ms).await
    }

    async fn set_owner(
        &self,
        name: AgentName,
        key: OwnerKey,
        current: Option<OwnerKey>,
    ) -> Result<bool, StorageError> {
        self.inner.set_owner(name, key, current).await
    }

    async fn set_listing(
        &self,
        agent: AgentName,
        description: Option<String>,
    ) -> Result<(), StorageError> {
        self.inner.set_listing(agent, description).await
    }

    async fn directory(
        &self,
        limit: usize,
    ) -> Result<Vec<(AgentName, PublicKeys, String)>, StorageError> {
        self.inner.directory(limit).await
    }
}

impl ConsentLedger for SlowAcks {
    async fn consent(&self, change: ConsentChange) -> Result<ConsentOutcome, StorageError> {
        self.inner.consent(change).await
    }

    async fn has_request(
        &self,
        target: AgentName,
        requester: AgentName,
        code: RequestCode,
        now_ms: i64,
    ) -> Result<bool, StorageError> {
        self.inner
            .has_request(target, requester, code, now_ms)
            .await
    }

    async fn take_denials(
        &self,
        requester: AgentName,
        now_ms: i64,
    ) -> Result<Vec<AgentName>, StorageError> {
        self.inner.take_denials(requester, now_ms).await
    }

    async fn consent_state(
        &self,
        agent: AgentName,
        now_ms: i64,
    ) -> Result<ConsentState, StorageError> {
        self.inner.consent_state(agent, now_ms).await
    }
}

impl Queue for SlowAcks {
    fn on_commit(&self, listener: CommitListener) {
        self.inner.on_commit(listener)
    }

    fn accept(
        &self,
        sender: AgentName,
        id: MessageId,
        copies: Vec<QueuedCopy>,
        quota: Quota,
        expires_at_ms: i64,
        default: Policy,
    ) -> Pending<Accepted> {
        self.inner
            .accept(sender, id, copies, quota, expires_at_ms, default)
    }

    async fn pending(
        &self,
        agent: AgentName,
        after: Seq,
        limit: usize,
    ) -> Result<Vec<Queued>, StorageError> {
        let held = self.gate.holding.load(Ordering::SeqCst);
        let read = self.inner.pending(agent, after, limit).await;
        if held {
            self.gate.read_while_held.store(true, Ordering::SeqCst);
            self.gate.release.notify_one();
        }
        read
    }

    async fn claim(&self, agent: AgentName, shown: Shown) -> Result<Epoch, StorageError> {
        self.inner.claim(agent, shown).await
    }

    async fn release(&self, agent: AgentName, epoch: Epoch) -> Result<(), StorageError> {
        self.inner.release(agent, epoch).await
    }

    async fn ack(
        &self,
        agent: AgentName,
        upto: Seq,
        epoch: Epoch,
    ) -> Result<AckOutcome, StorageError> {
        self.gate.holding.store(true, Ordering::SeqCst);
        self.gate.arrived.notify_one();
        let _ = tokio::time::timeout(HOLD, self.gate.release.notified()).await;
        let done = self.inner.ack(agent, upto, epoch).await;
        self.gate.holding.store(false, Ordering::SeqCst);
        done
    }

    async fn waiting(&self, agent: AgentName) -> Result<u64, StorageError> {
        self.inner.waiting(agent).await
    }

    async fn remote_bounce_senders(&self, limit: usize) -> Result<Vec<AgentName>, StorageError> {
        self.inner.remote_bounce_senders(limit).await
    }

    async fn relay_mailboxes(&self) -> Result<Vec<RelayName>, StorageError> {
        self.inner.relay_mailboxes().await
    }

    async fn total_waiting(&self) -> Result<u64, StorageError> {
        self.inner.total_waiting().await
    }

    async fn expire(&self, now_ms: i64) -> Result<Vec<(AgentName, Bounce)>, StorageError> {
        self.inner.expire(now_ms).await
    }

    async fn bounces(&self, sender: AgentName, limit: usize) -> Result<Vec<Bounce>, StorageError> {
        self.inner.bounces(sender, limit).await
    }

    async fn copy_statuses(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<Vec<crate::storage::CopyStatus>, StorageError> {
        self.inner.copy_statuses(sender, keys).await
    }

    async fn ack_bounces(
        &self,
        sender: AgentName,
        keys: Vec<CopyKey>,
    ) -> Result<u64, StorageError> {
        self.inner.ack_bounces(sender, keys).await
    }

    async fn record_bounces(
        &self,
        sender: AgentName,
        bounces: Vec<Bounce>,
    ) -> Result<(), StorageError> {
        self.inner.record_bounces(sender, bounces).await
    }
}

impl RelayPins for SlowAcks {
    async fn pin_relay(&self, relay: RelayName, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.inner.pin_relay(relay, key).await
    }

    async fn pin_own_key(&self, key: RelayKey) -> Result<RelayPin, StorageError> {
        self.inner.pin_own_key(key).await
    }

    async fn pinned_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.inner.pinned_relay(relay).await
    }

    async fn relays_pinned_with(&self, key: RelayKey) -> Result<Vec<RelayName>, StorageError> {
        self.inner.relays_pinned_with(key).await
    }

    async fn relay_pins(&self) -> Result<Vec<RelayPinRecord>, StorageError> {
        self.inner.relay_pins().await
    }

    async fn unpin_relay(&self, relay: RelayName) -> Result<Option<RelayKey>, StorageError> {
        self.inner.unpin_relay(relay).await
    }

    async fn repin_relay(
        &self,
        relay: RelayName,
        was: Option<RelayKey>,
        key: RelayKey,
    ) -> Result<bool, StorageError> {
        self.inner.repin_relay(relay, was, key).await
    }
}

impl Reservations for SlowAcks {
    async fn reserve(
        &self,
        holder: AgentName,
        wanted: ReservationRequest,
        now_ms: i64,
    ) -> Result<Reserve, StorageError> {
        self.inner.reserve(holder, wanted, now_ms).await
    }

    async fn release_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        which: Which,
        now_ms: i64,
    ) -> Result<Vec<ReservationId>, StorageError> {
        self.inner
            .release_reserved(holder, project, which, now_ms)
            .await
    }

    async fn renew_reserved(
        &self,
        holder: AgentName,
        project: ProjectName,
        ids: Vec<ReservationId>,
        ttl: Ttl,
        now_ms: i64,
    ) -> Result<Vec<Reservation>, StorageError> {
        self.inner
            .renew_reserved(holder, project, ids, ttl, now_ms)
            .await
    }

    async fn reservations(
        &self,
        project: ProjectName,
        now_ms: i64,
    ) -> Result<Vec<Reservation>, StorageError> {
        self.inner.reservations(project, now_ms).await
    }
}

impl Groups for SlowAcks {
    async fn create_group(
        &self,
        group: GroupView,
        max: usize,
    ) -> Result<GroupCreation, StorageError> {
        self.inner.create_group(group, max).await
    }

    async fn group(&self, name: AgentName) -> Result<Option<GroupView>, StorageError> {
        self.inner.group(name).await
    }

    async fn add_member(
        &self,
        group: AgentName,
        member: Address,
        max: usize,
    ) -> Result<RosterChange, StorageError> {
        self.inner.add_member(group, member, max).await
    }

    async fn remove_member(
        &self,
        group: AgentName,
        member: Address,
    ) -> Result<RosterChange, StorageError> {
        self.inner.remove_member(group, member).await
    }

    async fn groups_of(
        &self,
        member: Address,
        owner: Option<OwnerKey>,
        limit: usize,
    ) -> Result<Vec<GroupView>, StorageError> {
        self.inner.groups_of(member, owner, limit).await
    }
}

impl Storage for SlowAcks {
    fn relay_id(&self) -> &str {
        self.inner.relay_id()
    }

    fn metrics(&self) -> &StorageMetrics {
        self.inner.metrics()
    }

    async fn check_health(&self) -> Result<(), StorageError> {
        self.inner.check_health().await
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text frame as JSON (`null` once closed).
async fn next(ws: &mut Socket) -> serde_json::Value {
    loop {
        match tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("a frame in time")
        {
            Some(Ok(WsMessage::Text(t))) => return serde_json::from_str(&t).unwrap(),
            Some(Ok(WsMessage::Close(_))) | None | Some(Err(_)) => {
                return serde_json::Value::Null;
            }
            Some(Ok(_)) => {}
        }
    }
}

async fn login(url: &str, agent: &AgentName, identity: &Identity) -> Socket {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let Ok(ServerFrame::Challenge { relay, nonce, .. }) =
        serde_json::from_value(next(&mut ws).await)
    else {
        panic!("expected a challenge")
    };
    let hello = ClientFrame::Hello {
        agent: agent.clone(),
        signature: signature(identity, Domain::Hello, &hello_payload(&relay, &nonce)).to_vec(),
        register: Some(identity.public().to_keys()),
        control: false,
        owner: None,
        invite: None,
    };
    let text = serde_json::to_string(&hello).unwrap();
    ws.send(WsMessage::Text(text.into())).await.unwrap();
    assert_eq!(next(&mut ws).await["type"], "welcome");
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_still_committing_is_applied_before_the_next_session_reads_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let storage = SlowAcks {
        inner: SqliteStorage::open(&dir.path().join("relay.db")).unwrap(),
        gate: gate.clone(),
    };
    let bob = AgentName::new("bob").unwrap();
    let identity = Identity::generate();
    let keys = identity.public().to_keys();
    storage.register(bob.clone(), keys, None).await.unwrap();
    let stored = storage
        .accept(
            AgentName::new("alice").unwrap(),
            MessageId::new(),
            vec![QueuedCopy {
                id: None,
                recipient: bob.clone(),
                envelope: Arc::from(&br#"{"opaque":true}"#[..]),
                group: None,
            }],
            Quota {
                count: 10,
                bytes: 1 << 20,
            },
            i64::MAX,
            Policy::Open,
        )
        .await
        .unwrap();
    assert!(matches!(stored, Accepted::Stored(_)));
    let config = RelayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..RelayConfig::default()
    };
    let relay = Relay::start_with(storage, config, crate::crypto::RelayIdentity::generate())
        .await
        .unwrap();
    let url = relay.url();

    let mut first = login(&url, &bob, &identity).await;
    let delivery = next(&mut first).await;
    assert_eq!(delivery["type"], "deliver");
    let seq = delivery["seq"].as_u64().unwrap();
    assert_eq!(next(&mut first).await["type"], "caught_up");
    let ack = serde_json::to_string(&ClientFrame::Ack { seq }).unwrap();
    first.send(WsMessage::Text(ack.into())).await.unwrap();
    first.close(None).await.unwrap();
    // The ack reached storage and is being committed; the client reconnects at once.
    tokio::time::timeout(TIMEOUT, gate.arrived.notified())
        .await
        .expect("the ack reaches storage");
    let mut second = login(&url, &bob, &identity).await;
    let frame = next(&mut second).await;
    assert_eq!(
        frame["type"], "caught_up",
        "acked mail is not delivered again: {frame}"
    );
    assert!(
        !gate.read_while_held.load(Ordering::SeqCst),
        "the queue was read while an ack was being committed"
    );
    relay.shutdown().await;
}
