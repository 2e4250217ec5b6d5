//! Everyone alice writes with, and the mail of every kind they and she write: received, sent,
//! acknowledged, read, bounced, refused, with attachments, across relays and nodes, from and to
//! rotated keys.

use std::path::Path;
use std::time::Duration;

use mailslot::client::RelayUrl;
use mailslot::protocol::{
    Address, AgentName, Attachment, ClientFrame, Message, MessageId, OwnerAct, Peer, Receipt,
    ReceiptKind, RelayName,
};
use mailslot::store::SentState;
use serde_json::Value;

use super::kinds::{Kind, Side};
use super::world::Relays;
use crate::common::{TestAgent, TestRelay, mailslot_cli, wait_until};

/// How long the world may take to settle (mail over links, receipts coming back).
const SETTLE: Duration = Duration::from_secs(60);

/// Everyone alice writes with. On A: bob, dan (never fetches), dave (read receipts on),
/// mallory (blocked), pete (on A's second node), rob (a CLI home; rotates his keys). On B:
/// carol, erin (read receipts on), eve (blocked), frank (blocks alice), rhea (a CLI home;
/// rotates her keys) and a namesake of bob.
pub(crate) struct Cast {
    pub(crate) alice: TestAgent,
    bob: TestAgent,
    pub(crate) dan: TestAgent,
    dave: TestAgent,
    mallory: TestAgent,
    pete: TestAgent,
    carol: TestAgent,
    erin: TestAgent,
    eve: TestAgent,
    frank: TestAgent,
    bob_at_b: TestAgent,
    rob: tempfile::TempDir,
    rhea: tempfile::TempDir,
    a_name: RelayName,
    b_name: RelayName,
}

/// Syncs `agent` at `url` until it has received every one of `ids`.
async fn receive_all(agent: &TestAgent, url: &RelayUrl, ids: &[MessageId]) {
    let mut missing: Vec<MessageId> = ids.to_vec();
    let what = format!("{} receives {ids:?}", agent.name);
    wait_until(SETTLE, &what, async || {
        let report = agent.sync_url(url).await;
        assert!(report.unreadable.is_empty(), "{:?}", report.unreadable);
        missing.retain(|id| !report.received.contains(id));
        missing.is_empty().then_some(())
    })
    .await;
}

/// Syncs `agent` until its store has `id` bounced (any sync may have heard of it).
async fn bounced(agent: &TestAgent, relay: &TestRelay, id: MessageId) {
    wait_until(SETTLE, &format!("{id} bounces"), async || {
        agent.sync(relay).await;
        let stored = agent.store.call(move |s| s.message(&id)).await.unwrap();
        stored.is_some_and(|m| !m.bounced.is_empty()).then_some(())
    })
    .await;
}

/// `mailslot --agent NAME --json ARGS` in a CLI agent's home, on `relay`.
async fn cli_agent(home: &Path, name: &str, relay: &TestRelay, args: &[&str]) -> Value {
    let all = [&["--agent", name, "--json"], args].concat();
    let out = mailslot_cli(home, relay.url.as_str(), &all).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// A CLI agent's send to `to`, with `word` in the subject; its id.
async fn cli_send(home: &Path, name: &str, relay: &TestRelay, to: &str, word: &str) -> MessageId {
    let subject = Kind::subject_with(word);
    let args = ["send", "--to", to, "--subject", &subject, "--body", "text"];
    let sent = cli_agent(home, name, relay, &args).await;
    assert_eq!(sent["status"], "sent", "{sent}");
    sent["id"].as_str().unwrap().parse().unwrap()
}

/// `message` with one attachment.
fn with_attachment(mut message: Message, a: &Attachment) -> Message {
    message.attachments = vec![a.clone()];
    message
}

/// `message`, asking its recipients to acknowledge it.
fn asking_ack(mut message: Message) -> Message {
    message.ack_required = true;
    message
}

/// Blocks `whom` for `agent`, signed by its owner, on its relay.
async fn block(agent: &TestAgent, relay: &TestRelay, whom: Peer) {
    let mut conn = agent.connect(relay).await;
    let owner_signature = agent.owner_signs(&conn, &OwnerAct::Block(&whom));
    conn.call(|r| ClientFrame::Block {
        reference: r,
        agent: whom.clone(),
        owner_signature,
    })
    .await
    .unwrap();
    conn.close().await;
}

/// Sends each message from its agent through its relay; each must be taken.
async fn send_each(sends: &[(&TestAgent, &TestRelay, &Message)]) {
    for (agent, relay, m) in sends {
        let report = agent.send(relay, (*m).clone()).await;
        assert_eq!(report.sent, [m.id], "{report:?}");
    }
}

impl Cast {
    /// Everyone, registered (the CLI agents made with `init`).
    pub(crate) async fn register(relays: &Relays) -> Self {
        let (a, b) = (&relays.a, &relays.b);
        let [alice, bob, dan, dave, mallory, pete] =
            ["alice", "bob", "dan", "dave", "mallory", "pete"].map(TestAgent::new);
        let [carol, erin, eve, frank, bob_at_b] =
            ["carol", "erin", "eve", "frank", "bob"].map(TestAgent::new);
        for agent in [&alice, &bob, &dan, &dave, &mallory] {
            agent.sync(a).await;
        }
        pete.sync(relays.a2()).await;
        for agent in [&carol, &erin, &eve, &frank, &bob_at_b] {
            agent.sync(b).await;
        }
        let (rob, rhea) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        cli_agent(rob.path(), "rob", a, &["init"]).await;
        cli_agent(rhea.path(), "rhea", b, &["init"]).await;
        for agent in [&dave, &erin] {
            agent
                .store
                .call(|s| s.set_read_receipts(true))
                .await
                .unwrap();
        }
        Self {
            alice,
            bob,
            dan,
            dave,
            mallory,
            pete,
            carol,
            erin,
            eve,
            frank,
            bob_at_b,
            rob,
            rhea,
            a_name: a.relay.name().clone(),
            b_name: b.relay.name().clone(),
        }
    }

    fn at_b(&self, agent: &TestAgent) -> Address {
        Address::remote(agent.name.clone(), self.b_name.clone())
    }

    fn alice_at_a(&self) -> Address {
        Address::remote(self.alice.name.clone(), self.a_name.clone())
    }

    /// `from` (on B) to alice, with `word` in the subject.
    fn to_alice(&self, from: &TestAgent, word: &str) -> Message {
        Message::new(
            from.address(),
            vec![self.alice_at_a()],
            Kind::subject_with(word),
            "from relay B",
        )
    }

    /// Mail to alice, one of each kind, and what becomes of it: she acknowledges one, her
    /// owner blocks a sender on each relay, and the senders with CLI homes rotate their keys
    /// and write again.
    pub(crate) async fn mail_in(&self, relays: &Relays, kinds: &mut Vec<Kind>) {
        let (a, b) = (&relays.a, &relays.b);
        let alice_at = self.alice_at_a().to_string();
        let notes = Attachment::new("notes.md", "text/markdown", b"# notes\nall good\n".to_vec());
        let table = Attachment::new(
            "table.tsv",
            "text/tab-separated-values",
            b"a\tb\n1\t2\n".to_vec(),
        );
        let m = |from: &TestAgent, word: &str| {
            from.message(&[&self.alice], &Kind::subject_with(word), "hi")
        };
        let local = m(&self.bob, "zlocalin");
        let attached = with_attachment(m(&self.bob, "zattachin"), &notes);
        let nodes = m(&self.pete, "znodesin");
        let blocked = m(&self.mallory, "zblockedbefore");
        let federated = self.to_alice(&self.carol, "zfederatedin");
        let attached_federated =
            with_attachment(self.to_alice(&self.carol, "zattachfederatedin"), &table);
        let acked = asking_ack(self.to_alice(&self.carol, "zackedin"));
        let blocked_federated = self.to_alice(&self.eve, "zblockedfederatedbefore");
        send_each(&[
            (&self.bob, a, &local),
            (&self.bob, a, &attached),
            (&self.pete, relays.a2(), &nodes),
            (&self.mallory, a, &blocked),
            (&self.carol, b, &federated),
            (&self.carol, b, &attached_federated),
            (&self.carol, b, &acked),
            (&self.eve, b, &blocked_federated),
        ])
        .await;
        let rotated = cli_send(self.rob.path(), "rob", a, "alice", "zrotatedbefore").await;
        let rotated_federated = cli_send(
            self.rhea.path(),
            "rhea",
            b,
            &alice_at,
            "zrotatedfederatedbefore",
        )
        .await;
        let ids = [
            &local,
            &attached,
            &nodes,
            &blocked,
            &federated,
            &attached_federated,
            &acked,
            &blocked_federated,
        ]
        .map(|m| m.id);
        receive_all(
            &self.alice,
            &a.url,
            &[&ids[..], &[rotated, rotated_federated]].concat(),
        )
        .await;
        let carol = self.at_b(&self.carol).to_string();
        let eve = self.at_b(&self.eve).to_string();
        let rhea = Address::remote(AgentName::new("rhea").unwrap(), self.b_name.clone());
        kinds.extend([
            Kind::new("local, received", Side::In, &local, "bob"),
            Kind::new("attachments, received", Side::In, &attached, "bob").attachment(&notes),
            Kind::new("across nodes, received", Side::In, &nodes, "pete"),
            Kind::new(
                "blocked sender, before the block",
                Side::In,
                &blocked,
                "mallory",
            ),
            Kind::new("federated, received", Side::In, &federated, &carol),
            Kind::new(
                "attachments across relays, received",
                Side::In,
                &attached_federated,
                &carol,
            )
            .attachment(&table),
            Kind::new("acknowledged, received", Side::In, &acked, &carol),
            Kind::new(
                "blocked sender across relays, before the block",
                Side::In,
                &blocked_federated,
                &eve,
            ),
            Kind::new(
                "rotated key, before",
                Side::In,
                &self.stored(rotated).await,
                "rob",
            ),
            Kind::new(
                "rotated key across relays, before",
                Side::In,
                &self.stored(rotated_federated).await,
                &rhea,
            ),
        ]);

        // alice acknowledges carol's; her owner blocks mallory and eve, whose next mail is
        // refused (at A for mallory, at A's link for eve, who hears of it as a bounce).
        let (me, of) = (self.alice.address(), acked.id);
        self.alice
            .store
            .call(move |s| s.acknowledge(&me, &of, Some("noted".into())))
            .await
            .unwrap();
        assert_eq!(self.alice.sync(a).await.not_sent, []);
        block(&self.alice, a, self.mallory.address().into()).await;
        block(&self.alice, a, self.at_b(&self.eve).into()).await;
        let refused = m(&self.mallory, "zblockedafter");
        let report = self.mallory.send(a, refused.clone()).await;
        assert!(
            report
                .not_sent
                .iter()
                .any(|(id, why, _)| *id == refused.id && why.contains("not_allowed")),
            "{report:?}"
        );
        let refused_federated = self.to_alice(&self.eve, "zblockedfederatedafter");
        send_each(&[(&self.eve, b, &refused_federated)]).await;
        bounced(&self.eve, b, refused_federated.id).await;
        kinds.extend([
            Kind::new(
                "blocked sender, after the block",
                Side::Refused,
                &refused,
                "mallory",
            ),
            Kind::new(
                "blocked sender across relays, after the block",
                Side::Refused,
                &refused_federated,
                &eve,
            ),
        ]);

        // rob and rhea rotate: their peers (alice) are told, then they write again.
        for (home, name, relay) in [(&self.rob, "rob", a), (&self.rhea, "rhea", b)] {
            let rotated = cli_agent(home.path(), name, relay, &["rotate-keys"]).await;
            assert_eq!(rotated["announced"][0]["status"], "sent", "{rotated}");
        }
        let rotated = cli_send(self.rob.path(), "rob", a, "alice", "zrotatedafter").await;
        let rotated_federated = cli_send(
            self.rhea.path(),
            "rhea",
            b,
            &alice_at,
            "zrotatedfederatedafter",
        )
        .await;
        receive_all(&self.alice, &a.url, &[rotated, rotated_federated]).await;
        kinds.extend([
            Kind::new(
                "rotated key, after",
                Side::In,
                &self.stored(rotated).await,
                "rob",
            ),
            Kind::new(
                "rotated key across relays, after",
                Side::In,
                &self.stored(rotated_federated).await,
                &rhea,
            ),
        ]);
    }

    /// A message in alice's store.
    async fn stored(&self, id: MessageId) -> Message {
        self.alice
            .store
            .call(move |s| s.message(&id))
            .await
            .unwrap()
            .unwrap()
            .message
    }

    /// Mail from alice, one of each kind, and its recipients taking, acknowledging and
    /// reading it (a namesake of bob's acknowledges first, which must not count); frank's
    /// owner blocks her, so B refuses hers.
    pub(crate) async fn mail_out(&self, relays: &Relays, kinds: &mut Vec<Kind>) {
        let (a, b) = (&relays.a, &relays.b);
        block(&self.frank, b, self.alice_at_a().into()).await;
        let report = Attachment::new("report.csv", "text/csv", b"day,mail\nfri,7\n".to_vec());
        let to = |whom: Address, word: &str| {
            Message::new(
                self.alice.address(),
                vec![whom],
                Kind::subject_with(word),
                "from alice",
            )
        };
        let rob = Address::local(AgentName::new("rob").unwrap());
        let rhea = Address::remote(AgentName::new("rhea").unwrap(), self.b_name.clone());
        let carol = self.at_b(&self.carol);
        let local = to(self.bob.address(), "zlocalout");
        let federated = to(carol.clone(), "zfederatedout");
        let nodes = to(self.pete.address(), "znodesout");
        let attached = with_attachment(to(carol.clone(), "zattachout"), &report);
        let acked = asking_ack(to(self.bob.address(), "zackedout"));
        let acked_federated = asking_ack(to(carol.clone(), "zackedfederatedout"));
        let read = to(self.dave.address(), "zreadout");
        let read_federated = to(self.at_b(&self.erin), "zreadfederatedout");
        let bounced_federated = to(self.at_b(&self.frank), "zbouncedfederatedout");
        let rotated = to(rob.clone(), "zrotatedout");
        let rotated_federated = to(rhea.clone(), "zrotatedfederatedout");
        let outs = [
            &local,
            &federated,
            &nodes,
            &attached,
            &acked,
            &acked_federated,
            &read,
            &read_federated,
            &bounced_federated,
            &rotated,
            &rotated_federated,
        ];
        for m in outs {
            let m = m.clone();
            self.alice
                .store
                .call(move |s| s.queue_outgoing(&m))
                .await
                .unwrap();
        }
        let sent = self.alice.sync(a).await;
        assert_eq!(sent.sent, outs.map(|m| m.id), "{sent:?}");
        // A reply, as the owner writes it, to carol's mail: back to her full address.
        let federated_in = kinds.iter().find(|k| k.word == "zfederatedin").unwrap().id;
        let reply = cli_agent(
            self.alice.home(),
            "alice",
            a,
            &["reply", &federated_in.to_string(), "--body", "zreplyout"],
        )
        .await;
        assert_eq!(reply["status"], "sent", "{reply}");
        let reply = self
            .stored(reply["id"].as_str().unwrap().parse().unwrap())
            .await;
        let reply_kind = Kind::new("reply across relays, sent", Side::Out, &reply, &carol)
            .stands(SentState::Delivered)
            .found_by("zreplyout");
        kinds.extend([
            Kind::new("local, sent", Side::Out, &local, "bob").stands(SentState::Delivered),
            Kind::new("federated, sent", Side::Out, &federated, &carol)
                .stands(SentState::Delivered),
            Kind::new("across nodes, sent", Side::Out, &nodes, "pete").stands(SentState::Delivered),
            Kind::new("attachments, sent", Side::Out, &attached, &carol)
                .stands(SentState::Delivered)
                .attachment(&report),
            Kind::new(
                "acknowledged, sent (a namesake's receipt first)",
                Side::Out,
                &acked,
                "bob",
            )
            .stands(SentState::Acknowledged)
            .answer("on it"),
            Kind::new(
                "acknowledged across relays, sent",
                Side::Out,
                &acked_federated,
                &carol,
            )
            .stands(SentState::Acknowledged)
            .answer("done at B"),
            Kind::new("read-receipted, sent", Side::Out, &read, "dave").stands(SentState::Read),
            Kind::new(
                "read-receipted across relays, sent",
                Side::Out,
                &read_federated,
                self.at_b(&self.erin),
            )
            .stands(SentState::Read),
            Kind::new(
                "bounced across relays, sent",
                Side::Out,
                &bounced_federated,
                self.at_b(&self.frank),
            )
            .stands(SentState::Bounced),
            Kind::new("rotated key, sent", Side::Out, &rotated, "rob").stands(SentState::Delivered),
            Kind::new(
                "rotated key across relays, sent",
                Side::Out,
                &rotated_federated,
                &rhea,
            )
            .stands(SentState::Delivered),
            reply_kind,
        ]);

        // bob's namesake at B acknowledges bob's mail; alice finds it is not from a recipient.
        let forged = Message::receipt(
            self.bob_at_b.address(),
            self.alice_at_a(),
            acked.thread,
            Receipt {
                of: acked.id,
                kind: ReceiptKind::Acknowledged,
                answer: Some("the namesake agrees".into()),
            },
        );
        send_each(&[(&self.bob_at_b, b, &forged)]).await;
        let namesake = self.at_b(&self.bob_at_b);
        wait_until(SETTLE, "alice refuses the namesake's receipt", async || {
            let report = self.alice.sync(a).await;
            report
                .unreadable
                .iter()
                .any(|(from, _, why)| {
                    *from == namesake && why.contains("not one of its recipients")
                })
                .then_some(())
        })
        .await;

        // The recipients take theirs, acknowledge and read.
        receive_all(&self.bob, &a.url, &[local.id, acked.id]).await;
        receive_all(
            &self.carol,
            &b.url,
            &[federated.id, attached.id, acked_federated.id, reply.id],
        )
        .await;
        receive_all(&self.pete, &relays.a2().url, &[nodes.id]).await;
        receive_all(&self.dave, &a.url, &[read.id]).await;
        receive_all(&self.erin, &b.url, &[read_federated.id]).await;
        for (agent, relay, of, answer) in [
            (&self.bob, a, acked.id, "on it"),
            (&self.carol, b, acked_federated.id, "done at B"),
        ] {
            let me = agent.address();
            agent
                .store
                .call(move |s| s.acknowledge(&me, &of, Some(answer.into())))
                .await
                .unwrap();
            assert_eq!(agent.sync(relay).await.not_sent, []);
        }
        for (agent, relay, of) in [(&self.dave, a, read.id), (&self.erin, b, read_federated.id)] {
            let me = agent.address();
            agent
                .store
                .call(move |s| s.mark_read(&me, &[of]))
                .await
                .unwrap();
            assert_eq!(agent.sync(relay).await.not_sent, []);
        }
        for (home, name, relay, id) in [
            (&self.rob, "rob", a, rotated.id),
            (&self.rhea, "rhea", b, rotated_federated.id),
        ] {
            wait_until(SETTLE, &format!("{name} receives {id}"), async || {
                let synced = cli_agent(home.path(), name, relay, &["sync"]).await;
                synced["received"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r.to_string().contains(&id.to_string())))
                    .then_some(())
            })
            .await;
        }
        let sent: Vec<Kind> = kinds
            .iter()
            .filter(|k| k.side == Side::Out)
            .cloned()
            .collect();
        settle(&self.alice, &a.url, &sent).await;
    }
}

impl Cast {
    /// alice's owner writes to her: the owner key made in her home (the one her relay has),
    /// the message signed with it and stored as `mailslot tell` stores it.
    pub(crate) async fn owner_tells(&self, kinds: &mut Vec<Kind>) {
        let paths = mailslot::config::Paths::new(Some(self.alice.home().to_owned()), None).unwrap();
        let passphrase = mailslot::crypto::Passphrase::new("matrix owner passphrase".into());
        self.alice
            .owner
            .save_new(&paths.owner_key(), &passphrase.unwrap())
            .unwrap();
        mailslot::keys::pin_owner_key(&paths.owner_key()).unwrap();
        let subject = Kind::subject_with("zownerin");
        let (told, signature) = mailslot::agent::voice::compose(
            &self.alice.owner,
            &self.alice.name,
            Some(&subject),
            "Review the relay patch first.",
        )
        .unwrap();
        let stored = told.clone();
        let inserted = self
            .alice
            .store
            .call(move |s| s.insert_owner_message(&stored, &signature))
            .await
            .unwrap();
        assert!(inserted);
        kinds.push(Kind::new(
            "the owner's, received",
            Side::Owner,
            &told,
            "alice",
        ));
    }
}

/// Syncs alice until each of `kinds` (sent) stands where it should in her store.
pub(crate) async fn settle(alice: &TestAgent, url: &RelayUrl, kinds: &[Kind]) {
    let names: Vec<&str> = kinds.iter().map(|k| k.name.as_str()).collect();
    let what = format!("alice's sent mail stands where it should: {names:?}");
    wait_until(SETTLE, &what, async || {
        alice.sync_url(url).await;
        let sent = alice.store.call(|s| s.sent(None, 100)).await.unwrap();
        kinds
            .iter()
            .all(|k| {
                sent.iter()
                    .any(|i| i.stored.message.id == k.id && Some(i.state) == k.sent)
            })
            .then_some(())
    })
    .await;
}
