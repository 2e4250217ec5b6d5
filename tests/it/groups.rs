//! Groups (issue 31): a real relay on loopback, library agents speaking the protocol with
//! their owners' keys in memory, and real `mailslot mcp` processes on a home whose owner key
//! the CLI made at a terminal. A group send is sealed once, each member's copy holds only its
//! own wrap, a copy reaches a member only while it is on the roster and joined, and nobody
//! but the owners changes who that is.

use std::process::Command;

use crate::common;

use common::mcp::*;
use common::*;
use mailslot::client::ClientError;
use mailslot::client::consent::{self, Change};
use mailslot::client::groups::{self, Roster};
use mailslot::crypto::{Owner, seal_for_group};
use mailslot::protocol::{
    Address, AgentName, ClientFrame, ErrorCode, GroupPolicy, Limits, MAX_GROUP_MEMBERS,
    MAX_GROUPS_PER_CREATOR, Message, OwnerAct, Policy,
};
use mailslot::store::Membership;
use serde_json::json;

fn team() -> Address {
    Address::parse("team").unwrap()
}

fn team_name() -> AgentName {
    AgentName::new("team").unwrap()
}

fn refused<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (ErrorCode, String) {
    match r {
        Err(ClientError::Refused { code, message, .. }) => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// `member`'s owner joins `team` for it, and its store records it, as `groups join` does.
async fn join(relay: &TestRelay, member: &TestAgent) {
    let mut conn = member.connect(relay).await;
    consent::apply(&mut conn, &member.owner, Change::Join(team()))
        .await
        .unwrap();
    conn.close().await;
    member
        .store
        .call(|s| s.mark_group(&team(), Membership::Joined))
        .await
        .unwrap();
}

/// A message from `from` to the group, with a body nobody else writes.
fn to_team(from: &TestAgent, body: &str) -> Message {
    Message::new(from.address(), vec![team()], "to the team", body)
}

/// The bodies `agent` has received, oldest first.
async fn bodies(agent: &TestAgent) -> Vec<String> {
    let inbox = agent
        .store
        .call(|s| s.inbox(&Default::default()))
        .await
        .unwrap();
    let mut out: Vec<String> = inbox.iter().map(|m| m.message.body.clone()).collect();
    out.reverse();
    out
}

// A contacts relay: joining, not the relay's policy, is what lets group mail in.
async fn relay() -> TestRelay {
    TestRelay::start(|c| c.default_policy = Some(Policy::Contacts)).await
}

#[tokio::test]
async fn a_copy_reaches_a_member_only_on_the_roster_and_joined_and_never_the_sender() {
    let relay = relay().await;
    let [lead, bob, carol, dave, eve] = relay.agents(["lead", "bob", "carol", "dave", "eve"]).await;
    let mut conn = lead.connect(&relay).await;
    let made = groups::create(&mut conn, team_name(), GroupPolicy::Members)
        .await
        .unwrap();
    assert_eq!(
        made.members,
        [lead.address()],
        "the creator is its first member"
    );
    for member in [&bob, &carol, &dave] {
        groups::change(
            &mut conn,
            &lead.owner,
            (team_name(), Roster::Add, member.address()),
        )
        .await
        .unwrap();
    }
    conn.close().await;
    // bob and carol's owners join; dave's does not; eve is on no roster but joins anyway.
    for member in [&bob, &carol, &eve] {
        join(&relay, member).await;
    }

    let report = lead.send(&relay, to_team(&lead, "first")).await;
    assert_eq!(report.sent.len(), 1, "{report:?}");
    for (member, got) in [(&bob, true), (&carol, true), (&dave, false), (&eve, false)] {
        let received = member.sync(&relay).await;
        assert!(received.unreadable.is_empty(), "{received:?}");
        assert_eq!(
            bodies(member).await,
            if got { vec!["first"] } else { vec![] },
            "{}",
            member.name
        );
    }
    assert!(bodies(&lead).await.is_empty(), "the sender gets no copy");
    let opened = bob
        .store
        .call(|s| s.inbox(&Default::default()))
        .await
        .unwrap();
    assert_eq!(opened[0].message.from, lead.address(), "the real sender");
    assert_eq!(opened[0].message.to, [team()], "addressed to the group");

    // carol leaves (no owner needed); dave's owner joins: the next copy follows.
    let mut carols = carol.connect(&relay).await;
    groups::leave(&mut carols, team()).await.unwrap();
    carols.close().await;
    join(&relay, &dave).await;
    lead.send(&relay, to_team(&lead, "second")).await;
    for member in [&bob, &carol, &dave] {
        member.sync(&relay).await;
    }
    assert_eq!(bodies(&bob).await, ["first", "second"], "exactly once each");
    assert_eq!(bodies(&carol).await, ["first"], "nothing after leaving");
    assert_eq!(bodies(&dave).await, ["second"]);
    let roster = groups::roster(&mut bob.connect(&relay).await, &team_name())
        .await
        .unwrap();
    assert!(
        !roster.has_member(&carol.address()),
        "leaving leaves the roster too"
    );

    // A member's block of the sender still refuses the group's copy.
    let mut bobs = bob.connect(&relay).await;
    consent::apply(
        &mut bobs,
        &bob.owner,
        Change::Block(mailslot::protocol::Peer::Agent(lead.address())),
    )
    .await
    .unwrap();
    bobs.close().await;
    lead.send(&relay, to_team(&lead, "third")).await;
    bob.sync(&relay).await;
    dave.sync(&relay).await;
    assert_eq!(bodies(&dave).await, ["second", "third"]);
    assert_eq!(bodies(&bob).await, ["first", "second"], "blocked sender");
}

#[tokio::test]
async fn the_posting_policy_refuses_others_and_says_why() {
    let relay = relay().await;
    let [lead, bob, outsider] = relay.agents(["lead", "bob", "outsider"]).await;
    let mut conn = lead.connect(&relay).await;
    groups::create(&mut conn, team_name(), GroupPolicy::Members)
        .await
        .unwrap();
    groups::change(
        &mut conn,
        &lead.owner,
        (team_name(), Roster::Add, bob.address()),
    )
    .await
    .unwrap();
    conn.close().await;
    join(&relay, &bob).await;

    // Under `members`, an outsider neither reads the roster nor posts.
    let report = outsider.send(&relay, to_team(&outsider, "spam")).await;
    let (_, why, retry) = &report.not_sent[0];
    assert!(
        !retry && why.contains("team is a group") && why.contains("members"),
        "{why}"
    );
    let mut theirs = outsider.connect(&relay).await;
    let (code, _) = refused(groups::roster(&mut theirs, &team_name()).await);
    assert_eq!(code, ErrorCode::NotAllowed);
    // Sealed by hand to the member's key and sent as a group send: still refused, by policy.
    let bob_keys =
        mailslot::crypto::PublicIdentity::try_from(theirs.lookup(&bob.name).await.unwrap())
            .unwrap();
    let letter = to_team(&outsider, "spam");
    let envelope = seal_for_group(
        &letter,
        &outsider.identity,
        &[(bob.address(), bob_keys)],
        &Limits::default(),
    )
    .unwrap();
    let (code, message) = refused(theirs.send_to(envelope, Some(team_name())).await);
    assert_eq!(code, ErrorCode::NotAllowed);
    assert!(message.contains("policy is `members`"), "{message}");
    theirs.close().await;
    bob.sync(&relay).await;
    assert!(bodies(&bob).await.is_empty());
}

#[tokio::test]
async fn the_relay_stores_only_roster_wraps_and_refuses_a_send_missing_a_member() {
    let relay = relay().await;
    let [lead, bob, carol, outsider] = relay.agents(["lead", "bob", "carol", "outsider"]).await;
    let mut conn = lead.connect(&relay).await;
    groups::create(&mut conn, team_name(), GroupPolicy::Members)
        .await
        .unwrap();
    groups::change(
        &mut conn,
        &lead.owner,
        (team_name(), Roster::Add, bob.address()),
    )
    .await
    .unwrap();
    for agent in [&bob, &outsider] {
        join(&relay, agent).await;
    }
    let keys = |a: &TestAgent| (a.address(), a.identity.public().clone());
    let sealed = |to: &[(Address, mailslot::crypto::PublicIdentity)], body: &str| {
        seal_for_group(
            &to_team(&lead, body),
            &lead.identity,
            to,
            &Limits::default(),
        )
        .unwrap()
    };
    // A wrap for someone off the roster is dropped, never stored.
    let (_, skipped) = conn
        .send_to(
            sealed(&[keys(&bob), keys(&outsider)], "one"),
            Some(team_name()),
        )
        .await
        .unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    // carol is added, but the next envelope has no wrap for her: the roster changed.
    groups::change(
        &mut conn,
        &lead.owner,
        (team_name(), Roster::Add, carol.address()),
    )
    .await
    .unwrap();
    let (code, message) = refused(
        conn.send_to(sealed(&[keys(&bob)], "two"), Some(team_name()))
            .await,
    );
    assert_eq!(code, ErrorCode::GroupChanged);
    assert!(
        message.contains("carol") && message.contains("seal again"),
        "{message}"
    );
    // Sealed for the whole roster: carol has not joined, and the answer says so.
    let (_, skipped) = conn
        .send_to(
            sealed(&[keys(&bob), keys(&carol)], "three"),
            Some(team_name()),
        )
        .await
        .unwrap();
    assert_eq!(skipped, [carol.address()]);
    conn.close().await;
    for agent in [&bob, &carol, &outsider] {
        agent.sync(&relay).await;
    }
    assert_eq!(bodies(&bob).await, ["one", "three"]);
    assert!(bodies(&outsider).await.is_empty(), "the dropped wrap");
    assert!(bodies(&carol).await.is_empty());
}

#[tokio::test]
async fn only_the_owners_change_a_roster_or_join_and_the_roster_is_bounded() {
    let relay = relay().await;
    let [lead, bob] = relay.agents(["lead", "bob"]).await;
    let mut conn = lead.connect(&relay).await;
    groups::create(&mut conn, team_name(), GroupPolicy::Anyone)
        .await
        .unwrap();
    // The group's name is taken for agents and groups alike.
    let (code, _) = refused(groups::create(&mut conn, team_name(), GroupPolicy::Members).await);
    assert_eq!(code, ErrorCode::NameTaken);

    // bob, a member with a shell and his own owner key, cannot add anyone: only the group's
    // owner key signs roster changes. Nor can lead's agent key, without its owner's.
    let mut bobs = bob.connect(&relay).await;
    let (code, message) = refused(
        groups::change(
            &mut bobs,
            &bob.owner,
            (team_name(), Roster::Add, bob.address()),
        )
        .await,
    );
    assert_eq!(code, ErrorCode::NotOwner);
    assert!(message.contains("mailslot groups add"), "{message}");
    let (code, _) = refused(
        groups::change(
            &mut conn,
            &Owner::generate(),
            (team_name(), Roster::Add, bob.address()),
        )
        .await,
    );
    assert_eq!(code, ErrorCode::NotOwner);
    // bob cannot join by himself: the join is his owner's, signed by his owner key.
    let forged = bob.owner_signs(&bobs, &OwnerAct::Join(&team()));
    let signed_elsewhere = lead.owner_signs(&bobs, &OwnerAct::Join(&team()));
    for owner_signature in [Vec::new(), signed_elsewhere, forged[..63].to_vec()] {
        let answer = bobs
            .call(|reference| ClientFrame::Join {
                reference,
                group: team(),
                owner_signature,
            })
            .await;
        assert_eq!(refused(answer).0, ErrorCode::NotOwner);
    }
    bobs.close().await;
    // Alone on its roster, the group has nobody to send to, and the sender is told.
    let alone = lead.send(&relay, to_team(&lead, "nobody")).await;
    let (_, why, retry) = &alone.not_sent[0];
    assert!(!retry && why.contains("no members but the sender"), "{why}");
    // That sync's connection replaced this one.
    let mut conn = lead.connect(&relay).await;

    // 256 members at most (members on other relays are taken on the owner's word).
    for i in 1..MAX_GROUP_MEMBERS {
        let member = Address::parse(&format!("m{i}@relay-b.example")).unwrap();
        groups::change(&mut conn, &lead.owner, (team_name(), Roster::Add, member))
            .await
            .unwrap();
    }
    let full = groups::roster(&mut conn, &team_name()).await.unwrap();
    assert_eq!(full.members.len(), MAX_GROUP_MEMBERS);
    let (code, message) = refused(
        groups::change(
            &mut conn,
            &lead.owner,
            (team_name(), Roster::Add, bob.address()),
        )
        .await,
    );
    assert_eq!(code, ErrorCode::GroupFull);
    assert!(
        message.contains("256 members") && message.contains("remove one"),
        "{message}"
    );
    // One agent makes at most 100 groups.
    for i in 1..MAX_GROUPS_PER_CREATOR {
        let name = AgentName::new(&format!("team{i}")).unwrap();
        groups::create(&mut conn, name, GroupPolicy::Members)
            .await
            .unwrap();
    }
    let one_more = AgentName::new("one-more").unwrap();
    let (code, message) = refused(groups::create(&mut conn, one_more, GroupPolicy::Members).await);
    assert_eq!(code, ErrorCode::TooManyGroups);
    assert!(message.contains("100 groups"), "{message}");
    conn.close().await;
    bob.sync(&relay).await;
    assert!(
        bodies(&bob).await.is_empty(),
        "never on the roster, never joined"
    );
}

const PASSPHRASE: &str = "correct horse battery staple";

/// `mailslot ARGS` without a terminal; the exit code, stdout and stderr.
fn cli(home: &std::path::Path, relay: &TestRelay, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mailslot"))
        .args(args)
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_RELAY", relay.url.as_str())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// Multi-threaded: the test blocks on child processes while the in-process relay serves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_five_gets_one_sealed_copy_each_through_real_mcp_processes() {
    let relay = relay().await;
    let members = ["ann", "ben", "cat", "dan", "eli"];
    let mut names = vec!["lead"];
    names.extend(members);
    let home = relay.home(&names);
    let input = format!("{PASSPHRASE}\n{PASSPHRASE}\n");
    let (status, shown) = at_terminal(home.path(), relay.url.as_str(), "owner init", &input);
    assert_eq!(status, 0, "{shown}");

    let (status, out, err) = cli(
        home.path(),
        &relay,
        &["--agent", "lead", "groups", "create", "team"],
    );
    assert_eq!(status, 0, "{out}{err}");
    // Without a terminal, the owner's decisions are refused with the command to run.
    let (status, _, err) = cli(
        home.path(),
        &relay,
        &["--agent", "lead", "groups", "add", "team", "ann"],
    );
    assert_eq!(status, 1);
    assert!(
        err.contains("`mailslot --agent lead groups add team ann`"),
        "{err}"
    );
    for m in members {
        let (status, shown) = at_terminal(
            home.path(),
            relay.url.as_str(),
            &format!("--agent lead groups add team {m}"),
            &format!("{PASSPHRASE}\n"),
        );
        assert_eq!(status, 0, "{shown}");
    }

    let mut lead = spawn_mcp(home.path(), "lead", &relay.url, Era::Legacy).await;
    let mut clients = Vec::new();
    for m in members {
        clients.push(spawn_mcp(home.path(), m, &relay.url, Era::Legacy).await);
    }
    // A model can only wish to join; its owner sees the wish and joins at a terminal.
    let wished = clients[0]
        .ok("join_group", json!({ "group": "team" }))
        .await;
    assert_eq!(wished["status"], "waiting_for_owner", "{wished}");
    assert!(
        wished["detail"]
            .as_str()
            .unwrap()
            .contains("mailslot --agent ann groups join team"),
        "{wished}"
    );
    let (_, listed, _) = cli(home.path(), &relay, &["--agent", "ann", "groups"]);
    assert!(listed.contains("wished  team"), "{listed}");
    // The creator is a member like the others: its owner joins it too, to hear the answers.
    for m in members.iter().chain(&["lead"]) {
        let (status, shown) = at_terminal(
            home.path(),
            relay.url.as_str(),
            &format!("--agent {m} groups join team"),
            &format!("{PASSPHRASE}\n"),
        );
        assert_eq!(status, 0, "{shown}");
    }
    let mine = clients[0].ok("groups", json!({})).await;
    assert_eq!(mine["joined"], json!(["team"]), "{mine}");
    assert_eq!(
        mine["groups"][0]["members"].as_array().unwrap().len(),
        6,
        "{mine}"
    );

    let sent = lead
        .ok(
            "send",
            send_args(&["team"], "standup", "marker-7f3a: ship it"),
        )
        .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    for c in &mut clients {
        let event = c.channel_event().await;
        assert_eq!(event["meta"]["from"], "lead", "{event}");
        let content = event["content"].as_str().unwrap();
        assert!(
            content.contains("To: team") && content.contains("marker-7f3a"),
            "{content}"
        );
    }
    // The sender's view: the group's message, with each member's copy where it stands.
    let entry = lead
        .sent_entry(json!({ "limit": 10 }), &sent["message_id"])
        .await
        .unwrap();
    let copies: Vec<&str> = entry["recipients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["to"].as_str().unwrap())
        .collect();
    assert_eq!(copies, members, "{entry}");
    // Each member has it once; reply_all answers the group, which fans it out to the lead.
    for c in &clients {
        let inbox = c.ok("inbox", json!({})).await;
        assert_eq!(inbox["messages"].as_array().unwrap().len(), 1, "{inbox}");
    }
    let id = sent["message_id"].clone();
    let answer = clients[1]
        .ok(
            "reply_all",
            json!({ "message_id": id, "body": "marker-7f3a: on it" }),
        )
        .await;
    assert_eq!(answer["status"], "sent", "{answer}");
    let heard = lead.channel_event().await;
    assert_eq!(heard["meta"]["from"], "ben", "{heard}");
    assert!(
        heard["content"].as_str().unwrap().contains("To: team"),
        "{heard}"
    );
    for (i, c) in clients.iter_mut().enumerate() {
        if i != 1 {
            let event = c.channel_event().await;
            assert_eq!(event["meta"]["from"], "ben", "{event}");
        }
    }
    let leads = lead.ok("inbox", json!({})).await;
    assert_eq!(
        leads["messages"].as_array().unwrap().len(),
        1,
        "only ben's: {leads}"
    );

    // The relay holds sealed copies, one wrap each, and never the text.
    let spool = relay.db().with_extension("db-spool");
    let mut bytes = std::fs::read(relay.db()).unwrap();
    for entry in std::fs::read_dir(&spool).unwrap() {
        bytes.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains("marker-7f3a") && !text.contains("standup"));
    assert!(text.contains(r#""keys":[{"to":"ann""#), "a copy for ann");
    assert!(
        !text.contains(r#""},{"to":"#),
        "no stored copy holds two wraps"
    );

    // ann leaves from her session: the next message skips her.
    let left = clients[0]
        .ok("leave_group", json!({ "group": "team" }))
        .await;
    assert_eq!(left["status"], "left", "{left}");
    lead.ok("send", send_args(&["team"], "later", "after ann left"))
        .await;
    for c in clients.iter_mut().skip(2) {
        let event = c.channel_event().await;
        assert_eq!(event["meta"]["from"], "lead", "{event}");
    }
    let anns = clients[0].ok("inbox", json!({})).await;
    assert_eq!(
        anns["messages"].as_array().unwrap().len(),
        2,
        "the first and ben's: {anns}"
    );
}

#[tokio::test]
async fn members_on_a_relay_this_one_does_not_deliver_to_are_named_in_the_answer() {
    let far = Address::parse("far@relay-b.example").unwrap();
    let denied = far.host().unwrap().clone();
    let relay = TestRelay::start(|c| {
        c.default_policy = Some(Policy::Contacts);
        c.deny_relays.push(denied);
    })
    .await;
    let [lead] = relay.agents(["lead"]).await;
    let mut conn = lead.connect(&relay).await;
    groups::create(&mut conn, team_name(), GroupPolicy::Members)
        .await
        .unwrap();
    groups::change(
        &mut conn,
        &lead.owner,
        (team_name(), Roster::Add, far.clone()),
    )
    .await
    .unwrap();
    let mut letter = to_team(&lead, "across");
    letter.from = conn.full_address().await.unwrap();
    let keys = [(
        far.clone(),
        mailslot::crypto::Identity::generate().public().clone(),
    )];
    let envelope = seal_for_group(&letter, &lead.identity, &keys, &Limits::default()).unwrap();
    let (_, skipped) = conn.send_to(envelope, Some(team_name())).await.unwrap();
    assert_eq!(
        skipped,
        [far],
        "its operator denied that relay, and said so"
    );
    conn.close().await;
}

/// `agent`'s full address on `relay`.
fn at(agent: &TestAgent, relay: &TestRelay) -> Address {
    Address::remote(agent.name.clone(), relay.relay.name().clone())
}

/// The group `team` of `relay`, as another relay's agents address it.
fn team_of(relay: &TestRelay) -> Address {
    Address::remote(team_name(), relay.relay.name().clone())
}

/// `member`'s owner, at `relay`, joins `group` of another relay for it, as `groups join` does.
async fn join_remote(relay: &TestRelay, member: &TestAgent, group: &Address) {
    let mut conn = member.connect(relay).await;
    consent::apply(&mut conn, &member.owner, Change::Join(group.clone()))
        .await
        .unwrap();
    conn.close().await;
    let group = group.clone();
    member
        .store
        .call(move |s| s.mark_group(&group, Membership::Joined))
        .await
        .unwrap();
}

/// Syncs `agent` until it holds `n` messages; their bodies, oldest first.
async fn receive(agent: &TestAgent, relay: &TestRelay, n: usize) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT * 4;
    loop {
        let report = agent.sync(relay).await;
        assert!(report.unreadable.is_empty(), "{report:?}");
        let got = bodies(agent).await;
        if got.len() >= n {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} got {got:?}, not {n}",
            agent.name
        );
        // The link delivers in the background; the next sync asks again.
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_another_relay_get_one_sealed_copy_each_over_the_link_exactly_once() {
    across_relays(relay().await, relay().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_another_relay_get_their_copies_between_postgres_relays() {
    let Some(cluster) = common::postgres::PgCluster::shared() else {
        return;
    };
    let mut relays = Vec::new();
    for db in ["group_a", "group_b"] {
        let url = cluster.create_database(db).await;
        relays.push(
            TestRelay::start(move |c| {
                c.default_policy = Some(Policy::Contacts);
                c.db = Some(url.into());
            })
            .await,
        );
    }
    let [a, b] = relays.try_into().ok().unwrap();
    across_relays(a, b).await;
}

/// On relays `a` and `b` (contacts policy): a group of five on `a` with two members on `b`
/// who joined and one there who did not; one copy each, sealed to each alone, exactly once
/// through `b`'s restart, and a bounce naming the one who did not join.
async fn across_relays(a: TestRelay, b: TestRelay) {
    let [lead, bob, carol] = a.agents(["lead", "bob", "carol"]).await;
    let [dan, erin, frank] = b.agents(["dan", "erin", "frank"]).await;
    let team_a = team_of(&a);
    let mut conn = lead.connect(&a).await;
    groups::create(&mut conn, team_name(), GroupPolicy::Members)
        .await
        .unwrap();
    // Five who joined (lead, bob and carol here, dan and erin at B), and frank at B, who did not.
    let members = [
        bob.address(),
        carol.address(),
        at(&dan, &b),
        at(&erin, &b),
        at(&frank, &b),
    ];
    for member in members {
        groups::change(&mut conn, &lead.owner, (team_name(), Roster::Add, member))
            .await
            .unwrap();
    }
    conn.close().await;
    for member in [&lead, &bob, &carol] {
        join(&a, member).await;
    }
    for member in [&dan, &erin] {
        join_remote(&b, member, &team_a).await;
    }

    let report = lead.send(&a, to_team(&lead, "first")).await;
    assert_eq!(report.sent.len(), 1, "{report:?}");
    // erin's copy at B holds her wrap alone.
    let mut ws = raw_login(&b, &erin).await;
    let envelope = loop {
        match raw_recv(&mut ws).await {
            Some(mailslot::protocol::ServerFrame::Deliver { envelope, .. }) => break envelope,
            Some(_) => {}
            None => panic!("erin's session ended before her copy"),
        }
    };
    let wraps: Vec<&Address> = envelope.keys.iter().map(|k| &k.to).collect();
    assert_eq!(wraps, [&at(&erin, &b)], "sealed to her alone");
    drop(ws);
    for (member, relay) in [(&bob, &a), (&carol, &a), (&dan, &b), (&erin, &b)] {
        assert_eq!(
            receive(member, relay, 1).await,
            ["first"],
            "{}",
            member.name
        );
    }
    let opened = dan
        .store
        .call(|s| s.inbox(&Default::default()))
        .await
        .unwrap();
    assert_eq!(opened[0].message.from, at(&lead, &a), "the real sender");
    assert_eq!(
        opened[0].message.to,
        std::slice::from_ref(&team_a),
        "the group it joined"
    );
    assert_eq!(
        opened[0].trust,
        mailslot::store::Trust::Verified,
        "the sender's keys from the sender's relay"
    );
    // frank never joined: B refuses his copy and the sender hears it, naming him.
    let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT * 2;
    let bounce = loop {
        if let Some(bounce) = lead.sync(&a).await.bounced.first() {
            break bounce.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no bounce for frank"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!(bounce.to, at(&frank, &b));
    frank.sync(&b).await;
    assert!(bodies(&frank).await.is_empty(), "not joined");
    assert!(bodies(&lead).await.is_empty(), "the sender gets no copy");

    // B goes away and comes back: the link reconnects, and each copy still arrives once.
    let b = b.stop().await;
    lead.send(&a, to_team(&lead, "second")).await;
    let b = b.restart().await;
    lead.send(&a, to_team(&lead, "third")).await;
    for member in [&dan, &erin] {
        // Exactly once each. The order of "second" and "third" is not asserted: one CI run
        // stored them third first, before the link's answer queued each write only after the
        // one before it (`relay/link/answer.rs`, `Turn`); see issue 31's closing note.
        let mut got = receive(member, &b, 3).await;
        got.sort();
        assert_eq!(
            got,
            ["first", "second", "third"],
            "{}: exactly once each",
            member.name
        );
        let report = member.sync(&b).await;
        assert!(
            report.received.is_empty() && report.duplicates == 0,
            "{report:?}"
        );
    }
    a.relay.shutdown().await;
    b.relay.shutdown().await;
}

/// Delivers, over `ws` (a link from another relay), a copy of `group` from `from` to `to`.
async fn deliver_group_copy(
    ws: &mut RawSocket,
    seq: u64,
    (group, from): (&Address, &Address),
    (to, to_at): (&TestAgent, &Address),
) -> mailslot::protocol::LinkAnswer {
    use futures_util::{SinkExt, StreamExt};
    use mailslot::protocol::{group_copy, link_deliver_frame};
    use tokio_tungstenite::tungstenite::Message as Ws;
    let letter = Message::new(from.clone(), vec![group.clone()], "s", "b");
    let sealed = seal_for_group(
        &letter,
        &mailslot::crypto::Identity::generate(),
        &[(to_at.clone(), to.identity.public().clone())],
        &Limits::default(),
    )
    .unwrap();
    let stored = group_copy(group, &sealed.to_bytes());
    ws.send(Ws::text(link_deliver_frame(seq, &stored).unwrap()))
        .await
        .unwrap();
    let Some(Ok(Ws::Text(text))) = ws.next().await else {
        panic!("no answer")
    };
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn a_relay_cannot_deliver_a_copy_of_another_relays_group() {
    use mailslot::protocol::{LinkAnswer, Refusal};
    let (a, b, c) = (relay().await, relay().await, relay().await);
    let [dan, erin] = b.agents(["dan", "erin"]).await;
    let (team_a, team_c) = (team_of(&a), team_of(&c));
    for group in [&team_a, &team_c] {
        join_remote(&b, &dan, group).await;
    }
    let (dan_at, erin_at) = (at(&dan, &b), at(&erin, &b));
    // Any poster: the group's host fans out the copies of whoever posted.
    let poster = Address::parse(&format!("lead@{}", a.relay.name())).unwrap();
    let mut ws = link_as(&c, &b).await;
    let taken = |seq, refused| LinkAnswer::Taken { seq, refused };
    // C claims a copy of A's group: refused, though dan joined it.
    assert_eq!(
        deliver_group_copy(&mut ws, 1, (&team_a, &poster), (&dan, &dan_at)).await,
        taken(
            1,
            vec![Refusal {
                to: dan_at.clone(),
                code: ErrorCode::NotSender
            }]
        )
    );
    // A copy of C's own group is taken for dan, who joined it, from a poster on another relay.
    assert_eq!(
        deliver_group_copy(&mut ws, 2, (&team_c, &poster), (&dan, &dan_at)).await,
        taken(2, vec![])
    );
    // erin joined nothing: her copy is refused, and C bounces it to the sender.
    assert_eq!(
        deliver_group_copy(&mut ws, 3, (&team_c, &poster), (&erin, &erin_at)).await,
        taken(
            3,
            vec![Refusal {
                to: erin_at,
                code: ErrorCode::NotAllowed
            }]
        )
    );
    drop(ws);
    for r in [a, b, c] {
        r.relay.shutdown().await;
    }
}

#[tokio::test]
async fn posting_to_a_group_from_another_relay_is_refused_with_the_reason() {
    let a = relay().await;
    let b = relay().await;
    let [lead] = a.agents(["lead"]).await;
    let [far] = b.agents(["far"]).await;
    let mut conn = lead.connect(&a).await;
    groups::create(&mut conn, team_name(), GroupPolicy::Anyone)
        .await
        .unwrap();
    conn.close().await;
    let group = Address::parse(&format!("team@{}", a.relay.name())).unwrap();
    let letter = Message::new(far.address(), vec![group], "hello", "from elsewhere");
    let report = far.send(&b, letter).await;
    let (_, why, _) = &report.not_sent[0];
    assert!(
        why.contains("team is a group") && why.contains("not carried yet"),
        "{why}"
    );
}
