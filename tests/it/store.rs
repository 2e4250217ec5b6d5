//! The local store: idempotency, search and recall ranking, key pinning, migrations, and
//! durability under concurrent processes and SIGKILL.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use jiff::ToSpan;
use mailslot::crypto::Identity;
use mailslot::protocol::{
    Address, AgentName, Importance, MAX_ANSWER_CHARS, Message, MessageId, Receipt, ReceiptKind,
    now_millis,
};
use mailslot::store::{
    Acknowledged, Direction, InboxQuery, KeyCheck, MemoryDraft, ReceiptOutcome, SCHEMA_VERSION,
    SentState, Store, StoreError, StoreHandle, Trust,
};

const CHILD_DB: &str = "MAILSLOT_TEST_CHILD_DB";

fn addr(name: &str) -> Address {
    Address::local(AgentName::new(name).unwrap())
}

fn mail(from: &str, subject: &str, body: &str) -> Message {
    Message::new(addr(from), vec![addr("me")], subject, body)
}

fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store.db")).unwrap();
    (dir, store)
}

#[test]
fn inserting_the_same_id_twice_stores_it_once() {
    let (_dir, mut store) = temp_store();
    let m = mail("bob", "hello", "first");
    assert!(
        store
            .insert_message(&m, Direction::In, Trust::Verified)
            .unwrap()
    );
    let mut again = m.clone();
    again.body = "a redelivery must not overwrite".into();
    assert!(
        !store
            .insert_message(&again, Direction::In, Trust::Verified)
            .unwrap()
    );
    assert_eq!(store.message_count().unwrap(), 1);
    assert_eq!(store.message(&m.id).unwrap().unwrap().message.body, "first");
    assert_eq!(store.thread(&m.thread).unwrap().len(), 1);
    let batch = store
        .insert_messages(&[
            (&m, Direction::In, Trust::Verified),
            (&mail("bob", "new", "x"), Direction::In, Trust::Verified),
        ])
        .unwrap();
    assert_eq!(batch, vec![false, true]);
}

#[test]
fn inbox_lists_unread_first_and_mark_read_moves_them() {
    let (_dir, mut store) = temp_store();
    let older = mail("bob", "older", "a");
    let newer = mail("carol", "newer", "b");
    let sent = Message::new(addr("me"), vec![addr("bob")], "mine", "c");
    for m in [&older, &newer] {
        store
            .insert_message(m, Direction::In, Trust::Verified)
            .unwrap();
    }
    store
        .insert_message(&sent, Direction::Out, Trust::Own)
        .unwrap();
    let unread = store.inbox(&InboxQuery::default()).unwrap();
    assert_eq!(
        unread.iter().map(|s| s.message.id).collect::<Vec<_>>(),
        vec![newer.id, older.id]
    );
    let summary = store.unread_summary().unwrap();
    assert_eq!(summary.count, 2);
    assert_eq!(summary.newest_from, Some(addr("carol")));

    assert_eq!(
        store.mark_read(&addr("me"), &[newer.id, newer.id]).unwrap(),
        1
    );
    let all = store
        .inbox(&InboxQuery {
            unread_only: false,
            ..InboxQuery::default()
        })
        .unwrap();
    assert_eq!(
        all.iter().map(|s| s.message.id).collect::<Vec<_>>(),
        vec![older.id, newer.id],
        "unread first"
    );
    let from_bob = store
        .inbox(&InboxQuery {
            unread_only: false,
            from: Some(addr("bob")),
            ..InboxQuery::default()
        })
        .unwrap();
    assert_eq!(from_bob.len(), 1);
    assert_eq!(store.unread_summary().unwrap().count, 1);
}

#[test]
fn the_unread_count_follows_every_insert_and_every_marking() {
    let (_dir, mut store) = temp_store();
    let counted = |store: &Store| {
        let kept = store.unread_summary().unwrap().count;
        assert_eq!(u64::from(kept), store.received_count(true).unwrap());
        kept
    };
    let first = mail("bob", "one", "a");
    let second = mail("carol", "two", "b");
    store
        .insert_messages(&[
            (&first, Direction::In, Trust::Verified),
            (&second, Direction::In, Trust::Verified),
            (&first, Direction::In, Trust::Verified),
            (
                &Message::new(addr("me"), vec![addr("bob")], "mine", "c"),
                Direction::Out,
                Trust::Own,
            ),
        ])
        .unwrap();
    assert_eq!(counted(&store), 2, "a duplicate and own mail do not count");
    store
        .insert_message(&first, Direction::In, Trust::Verified)
        .unwrap();
    assert_eq!(counted(&store), 2);
    store.mark_read(&addr("me"), &[first.id, first.id]).unwrap();
    assert_eq!(counted(&store), 1);
    store.mark_read(&addr("me"), &[first.id]).unwrap();
    assert_eq!(counted(&store), 1, "marking read twice counts once");
    store
        .insert_message(&mail("dave", "three", "d"), Direction::In, Trust::Verified)
        .unwrap();
    assert_eq!(counted(&store), 2);
    assert_eq!(store.mark_all_read(&addr("me")).unwrap(), 2);
    assert_eq!(counted(&store), 0);
}

#[test]
fn inbox_limit_cuts_each_group_in_order_with_filters_applied_first() {
    let (_dir, mut store) = temp_store();
    // 12 messages, oldest first; bob's are urgent, carol's normal. Every third is read.
    let all: Vec<Message> = (0..12)
        .map(|i| {
            let from = if i % 2 == 0 { "bob" } else { "carol" };
            let mut m = mail(from, &format!("m{i}"), "x");
            if from == "bob" {
                m.importance = Importance::Urgent;
            }
            store
                .insert_message(&m, Direction::In, Trust::Verified)
                .unwrap();
            m
        })
        .collect();
    let read: Vec<MessageId> = all.iter().step_by(3).map(|m| m.id).collect();
    store.mark_read(&addr("me"), &read).unwrap();
    let subjects = |q: InboxQuery| -> Vec<String> {
        store
            .inbox(&q)
            .unwrap()
            .into_iter()
            .map(|s| s.message.subject)
            .collect()
    };
    let everything = InboxQuery {
        unread_only: false,
        limit: 10,
        ..InboxQuery::default()
    };
    assert_eq!(
        subjects(everything.clone()),
        ["m11", "m10", "m8", "m7", "m5", "m4", "m2", "m1", "m9", "m6"],
        "unread newest first, then read newest first, cut at the limit"
    );
    assert_eq!(
        subjects(InboxQuery {
            limit: 3,
            ..InboxQuery::default()
        }),
        ["m11", "m10", "m8"]
    );
    assert_eq!(
        subjects(InboxQuery {
            from: Some(addr("carol")),
            ..everything.clone()
        }),
        ["m11", "m7", "m5", "m1", "m9", "m3"]
    );
    assert_eq!(
        subjects(InboxQuery {
            importance: Some(Importance::Urgent),
            limit: 4,
            ..everything
        }),
        ["m10", "m8", "m4", "m2"]
    );
}

#[test]
fn search_finds_words_in_subject_body_and_sender_and_ignores_syntax() {
    let (_dir, mut store) = temp_store();
    let deploy = mail("bob", "Deploy plan", "we deploy the relay on friday");
    let lunch = mail("carol", "lunch", "pizza at noon");
    for m in [&deploy, &lunch] {
        store
            .insert_message(m, Direction::In, Trust::Verified)
            .unwrap();
    }
    let ids = |q: &str| {
        store
            .search_messages(q, 10)
            .unwrap()
            .iter()
            .map(|s| s.message.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids("deploying"), vec![deploy.id], "porter stemming");
    assert_eq!(ids("carol"), vec![lunch.id]);
    assert_eq!(ids("pizza deploy").len(), 2);
    assert!(ids("\"unbalanced AND OR NEAR(").is_empty());
    assert!(ids("nothing-matches-this").is_empty());
    let err = store.search_messages(&"x".repeat(1001), 10).unwrap_err();
    assert!(
        matches!(err, StoreError::Invalid(ref e) if e.field == "query"),
        "{err}"
    );
}

#[test]
fn recall_prefers_a_fresh_exact_match_over_an_old_weak_one() {
    let (_dir, mut store) = temp_store();
    let now = now_millis();
    let drafts = [
        MemoryDraft {
            text: "notes from the offsite: the deploy came up briefly among many other topics like budgets, hiring, travel and the office move".into(),
            title: Some("offsite notes".into()),
            tags: vec![],
            at: now - (400 * 24).hours(),
        },
        MemoryDraft {
            text: "The deploy pipeline runs on merge to main; deploy pipeline secrets are in the vault".into(),
            title: Some("deploy pipeline".into()),
            tags: vec!["ops".into()],
            at: now,
        },
    ];
    let stored = store.remember_all(&drafts).unwrap();
    let found = store.recall(Some("deploy pipeline"), 10).unwrap();
    assert_eq!(
        found.iter().map(|r| r.memory.id).collect::<Vec<_>>(),
        vec![stored[1].id, stored[0].id]
    );
    assert!(found[0].score > found[1].score);
}

#[test]
fn recall_breaks_ties_by_recency_and_lists_recent_without_a_query() {
    let (_dir, mut store) = temp_store();
    let now = now_millis();
    let same = |days: i64| MemoryDraft {
        text: "the relay port is 7878".into(),
        title: None,
        tags: vec![],
        at: now - (days * 24).hours(),
    };
    let stored = store.remember_all(&[same(90), same(1), same(30)]).unwrap();
    let found = store.recall(Some("relay port"), 10).unwrap();
    assert_eq!(
        found.iter().map(|r| r.memory.id).collect::<Vec<_>>(),
        vec![stored[1].id, stored[2].id, stored[0].id]
    );
    let recent = store.recall(None, 2).unwrap();
    assert_eq!(
        recent.iter().map(|r| r.memory.id).collect::<Vec<_>>(),
        vec![stored[1].id, stored[2].id]
    );
    assert_eq!(
        stored[0].title, "the relay port is 7878",
        "title defaults to the first line"
    );
    assert!(store.forget(&stored[0].id).unwrap());
    assert!(!store.forget(&stored[0].id).unwrap());
    assert_eq!(store.recall(Some("relay"), 10).unwrap().len(), 2);
}

#[test]
fn recall_past_hundreds_of_matches_finds_rare_words_and_the_newest_common_ones() {
    let (_dir, mut store) = temp_store();
    let now = now_millis();
    // 1,000 memories share "deploy": too many to score each (the store bounds that).
    let common = |i: i64| MemoryDraft {
        text: format!("deploy note number {i}"),
        title: None,
        tags: vec![],
        at: now - (1000 - i).hours(),
    };
    let mut drafts: Vec<MemoryDraft> = (0..500).map(common).collect();
    // An old memory holding the rare word, written before most of the common ones.
    drafts.push(MemoryDraft {
        text: "deploy to kubernetes needs the staging kubeconfig".into(),
        title: Some("kubernetes deploys".into()),
        tags: vec![],
        at: now - (2000 * 24).hours(),
    });
    drafts.extend((500..1000).map(common));
    let stored = store.remember_all(&drafts).unwrap();
    let rare = &stored[500];

    // Found by its rare word although it is old and the common word matches 1,001 memories.
    let found = store.recall(Some("deploy kubernetes"), 5).unwrap();
    assert_eq!(found[0].memory.id, rare.id, "{found:?}");
    // Only common words: the newest of their matches come first.
    let found = store.recall(Some("deploy note"), 3).unwrap();
    assert_eq!(
        found.iter().map(|r| r.memory.id).collect::<Vec<_>>(),
        vec![stored[1000].id, stored[999].id, stored[998].id]
    );
    // Mail search bounds its work the same way.
    let me = Address::parse("me").unwrap();
    let peer = Address::parse("peer").unwrap();
    let mut mail: Vec<Message> = (0..600)
        .map(|i| {
            Message::new(
                peer.clone(),
                vec![me.clone()],
                "deploy",
                format!("status {i}"),
            )
        })
        .collect();
    mail.insert(
        10,
        Message::new(
            peer.clone(),
            vec![me.clone()],
            "deploy",
            "kubernetes is down",
        ),
    );
    let wanted = mail[10].id;
    let rows: Vec<_> = mail
        .iter()
        .map(|m| (m, Direction::In, Trust::Verified))
        .collect();
    store.insert_messages(&rows).unwrap();
    let hits = store.search_messages("deploy kubernetes", 5).unwrap();
    assert_eq!(hits[0].message.id, wanted);
}

#[test]
fn memory_limits_name_the_field() {
    let (_dir, mut store) = temp_store();
    fn field<T: std::fmt::Debug>(r: Result<T, StoreError>) -> String {
        match r {
            Err(StoreError::Invalid(e)) => e.field,
            other => panic!("expected a validation error, got {other:?}"),
        }
    }
    assert!(store.remember(&"x".repeat(64 * 1024), None, &[]).is_ok());
    assert_eq!(
        field(store.remember(&"x".repeat(64 * 1024 + 1), None, &[])),
        "text"
    );
    assert_eq!(field(store.remember("   ", None, &[])), "text");
    assert!(store.remember("t", Some(&"t".repeat(200)), &[]).is_ok());
    assert_eq!(
        field(store.remember("t", Some(&"t".repeat(201)), &[])),
        "title"
    );
    let tags: Vec<String> = (0..16).map(|i| format!("t{i}")).collect();
    assert!(store.remember("t", None, &tags).is_ok());
    let too_many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    assert_eq!(field(store.remember("t", None, &too_many)), "tags");
    assert_eq!(
        field(store.remember("t", None, &["has space".into()])),
        "tags[0]"
    );
    assert!(store.set_identity_text(&"i".repeat(8 * 1024)).is_ok());
    assert_eq!(
        field(store.set_current_task(&"i".repeat(8 * 1024 + 1))),
        "current task"
    );
}

#[test]
fn keys_are_pinned_on_first_contact_and_a_change_is_caught() {
    let (_dir, mut store) = temp_store();
    let bob = addr("bob");
    let (original, impostor) = (Identity::generate(), Identity::generate());
    assert_eq!(
        store.check_and_pin(&bob, original.public()).unwrap(),
        KeyCheck::Pinned
    );
    assert_eq!(
        store.check_and_pin(&bob, original.public()).unwrap(),
        KeyCheck::Matches
    );
    assert_eq!(
        store.check_and_pin(&bob, impostor.public()).unwrap(),
        KeyCheck::Changed {
            pinned: original.fingerprint(),
            presented: impostor.fingerprint()
        }
    );
    assert_eq!(
        store.pinned_keys(&bob).unwrap().as_ref(),
        Some(original.public()),
        "the pinned key stays"
    );
    let contacts = store.contacts().unwrap();
    assert_eq!(contacts.len(), 1);
    assert_eq!(contacts[0].fingerprint, original.fingerprint());
    assert_eq!(contacts[0].key_changes, 1);
}

#[test]
fn outbox_queues_atomically_with_the_sent_copy() {
    let (_dir, mut store) = temp_store();
    let mut m = Message::new(addr("alice"), vec![addr("bob")], "queued", "hi");
    m.bcc = vec![addr("carol")];
    store.queue_outgoing(&m).unwrap();
    store.queue_outgoing(&m).unwrap();
    let queued = store.outbox(10).unwrap();
    assert_eq!(queued.len(), 1, "queueing twice is idempotent");
    assert_eq!(queued[0].message, m, "the sender keeps the full bcc list");
    assert_eq!(
        store.message(&m.id).unwrap().unwrap().direction,
        Direction::Out
    );
    store
        .outbox_failed(&m.id, "relay unreachable", false)
        .unwrap();
    let retried = &store.outbox(10).unwrap()[0];
    assert_eq!(
        (retried.attempts, retried.last_error.as_deref()),
        (1, Some("relay unreachable"))
    );
    store
        .outbox_failed(&m.id, "no agent named bob", true)
        .unwrap();
    assert!(
        store.outbox(10).unwrap().is_empty(),
        "failed for good: no retries"
    );
    assert_eq!(
        store.outbox_failed_items(10).unwrap()[0]
            .last_error
            .as_deref(),
        Some("no agent named bob")
    );
    assert_eq!(store.outbox_len().unwrap(), 0);
    let other = Message::new(addr("alice"), vec![addr("bob")], "second", "hi");
    store.queue_outgoing(&other).unwrap();
    store.outbox_done(&other.id, "test-relay", None).unwrap();
    assert_eq!(store.outbox_len().unwrap(), 0);
}

#[test]
fn sent_mail_lists_each_message_with_where_it_stands() {
    let (_dir, mut store) = temp_store();
    let sent = |subject: &str| Message::new(addr("alice"), vec![addr("bob")], subject, "hi");
    let (queued, failed, accepted, bounced) = (
        sent("queued"),
        sent("failed"),
        sent("accepted"),
        sent("bounced"),
    );
    for m in [&queued, &failed, &accepted, &bounced] {
        store.queue_outgoing(m).unwrap();
    }
    store
        .insert_message(
            &mail("bob", "received", "x"),
            Direction::In,
            Trust::Verified,
        )
        .unwrap();
    store
        .outbox_failed(&queued.id, "relay unreachable", false)
        .unwrap();
    store
        .outbox_failed(&failed.id, "no agent named bob", true)
        .unwrap();
    store.outbox_done(&accepted.id, "test-relay", None).unwrap();
    store.outbox_done(&bounced.id, "test-relay", None).unwrap();
    let bounce = mailslot::protocol::Bounce {
        id: bounced.id,
        to: Address::parse("bob").unwrap(),
        expired_at: now_millis(),
    };
    store.record_bounces(&[bounce]).unwrap();

    let listed = store.sent(None, 10).unwrap();
    let states: Vec<(&str, SentState, u32, Option<&str>)> = listed
        .iter()
        .map(|s| {
            (
                s.stored.message.subject.as_str(),
                s.state,
                s.attempts,
                s.last_error.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("bounced", SentState::Bounced, 0, None),
            ("accepted", SentState::Sent, 0, None),
            ("failed", SentState::Failed, 1, Some("no agent named bob")),
            ("queued", SentState::Queued, 1, Some("relay unreachable")),
        ],
        "newest first, received mail left out"
    );
    assert_eq!(listed[0].stored.bounced, [addr("bob")]);
    assert_eq!(store.sent(None, 1).unwrap().len(), 1);
    let only_failed = store.sent(Some(SentState::Failed), 10).unwrap();
    assert_eq!(only_failed.len(), 1);
    assert_eq!(only_failed[0].stored.message.id, failed.id);

    // A retry puts failed mail back in the outbox, and leaves the rest alone.
    assert!(store.retry_failed(Some(&[queued.id])).unwrap().is_empty());
    assert_eq!(store.retry_failed(None).unwrap(), [failed.id]);
    assert_eq!(
        store.sent(Some(SentState::Queued), 10).unwrap().len(),
        2,
        "the retried message waits with the queued one"
    );
    assert_eq!(store.outbox_len().unwrap(), 2);
}

#[test]
fn migrations_run_on_an_empty_file_and_refuse_a_newer_schema() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    std::fs::write(&path, b"").unwrap();
    let store = Store::open(&path).unwrap();
    store.check_integrity().unwrap();
    drop(store);
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    // Reopening is a no-op.
    Store::open(&path).unwrap();
    set_user_version(&path, SCHEMA_VERSION + 1);
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::NewerSchema { .. }), "{err}");
    assert!(err.to_string().contains("upgrade mailslot"));
}

#[test]
fn a_store_from_before_the_unread_count_starts_with_its_unread_mail_counted() {
    let (dir, mut store) = temp_store();
    for i in 0..3 {
        store
            .insert_message(
                &mail("bob", &format!("m{i}"), "x"),
                Direction::In,
                Trust::Verified,
            )
            .unwrap();
    }
    drop(store);
    // Back to schema 5: no partial index, no count, no triggers (nor what 6 to 14 added).
    let path = dir.path().join("store.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "DROP INDEX messages_recency; DROP INDEX messages_read; DROP TRIGGER unread_insert; DROP TRIGGER unread_read;
         DROP TRIGGER unread_delete; DROP TABLE unread; DROP TABLE deliveries;
         DROP TRIGGER attachments_delete; DROP TABLE attachments; DROP TABLE doorbells;
         DROP TABLE turns; DROP TABLE parked; DROP TABLE denials; DROP TABLE groups;
         ALTER TABLE messages DROP COLUMN owner_signature; PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(conn);
    let mut store = Store::open(&path).unwrap();
    assert_eq!(store.unread_summary().unwrap().count, 3);
    store
        .insert_message(&mail("bob", "m3", "x"), Direction::In, Trust::Verified)
        .unwrap();
    assert_eq!(store.unread_summary().unwrap().count, 4);
}

/// SQLite keeps `user_version` in the file header, big-endian at offset 60.
fn user_version(path: &Path) -> u32 {
    let bytes = std::fs::read(path).unwrap();
    u32::from_be_bytes(bytes[60..64].try_into().unwrap())
}

fn set_user_version(path: &Path, v: u32) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[60..64].copy_from_slice(&v.to_be_bytes());
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn the_async_handle_runs_work_off_the_runtime() {
    let (_dir, store) = temp_store();
    let handle = StoreHandle::spawn(store).unwrap();
    let m = mail("bob", "async", "body");
    let m2 = m.clone();
    let inserted = handle
        .call(move |s| s.insert_message(&m2, Direction::In, Trust::Verified))
        .await
        .unwrap();
    assert!(inserted);
    let thread = std::thread::current().id();
    let (count, ran_on) = handle
        .call(move |s| Ok((s.message_count()?, std::thread::current().id())))
        .await
        .unwrap();
    assert_eq!(count, 1);
    assert_ne!(ran_on, thread);
    let clone = handle.clone();
    let results = tokio::join!(
        clone.call(|s| s.unread_summary()),
        handle.call(|s| s.recall(None, 5))
    );
    assert_eq!(results.0.unwrap().count, 1);
    assert!(results.1.unwrap().is_empty());
}

// ---- multi-process tests: the test binary re-runs itself as the writer ----

fn spawn_child(test: &str, db: &Path, extra: &[(&str, &str)]) -> Child {
    // libtest names a test by its path below the crate: `store::child_single_writer`.
    let (_crate, module) = module_path!().split_once("::").unwrap();
    let name = format!("{module}::{test}");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        name.as_str(),
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_DB, db)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn child_db() -> PathBuf {
    PathBuf::from(std::env::var(CHILD_DB).expect("run by the multi-process tests, not on its own"))
}

/// Ids a child reported as committed, from lines `committed <id> <id> …` (libtest may print
/// its own `test … ` prefix on the same line; a line cut short by SIGKILL loses only its
/// last, partial id).
fn committed_ids(line: &str) -> Vec<MessageId> {
    line.split_once("committed ")
        .map(|(_, rest)| rest.split(' ').filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_default()
}

#[test]
#[ignore = "helper: run as a child process by two_processes_writing_at_once_lose_nothing"]
fn child_single_writer() {
    let mut store = Store::open(&child_db()).unwrap();
    let n: usize = std::env::var("WRITES").unwrap().parse().unwrap();
    for i in 0..n {
        let m = mail("peer", &format!("message {i}"), "body");
        store
            .insert_message(&m, Direction::In, Trust::Verified)
            .unwrap();
        store.remember(&format!("memory {i}"), None, &[]).unwrap();
        println!("committed {}", m.id);
    }
}

#[test]
fn two_processes_writing_at_once_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    Store::open(&db).unwrap();
    let children: Vec<Child> = (0..2)
        .map(|_| spawn_child("child_single_writer", &db, &[("WRITES", "150")]))
        .collect();
    let mut ids = Vec::new();
    for mut child in children {
        let out = BufReader::new(child.stdout.take().unwrap());
        for line in out.lines() {
            ids.extend(committed_ids(&line.unwrap()));
        }
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(ids.len(), 300);
    let store = Store::open(&db).unwrap();
    assert_eq!(store.message_count().unwrap(), 300);
    assert_eq!(store.memory_count().unwrap(), 300);
    for id in &ids {
        assert!(store.message(id).unwrap().is_some(), "{id} lost");
    }
}

#[test]
#[ignore = "helper: run as a child process by sigkill_mid_batch_keeps_every_committed_row"]
fn child_batch_writer() {
    let mut store = Store::open(&child_db()).unwrap();
    loop {
        let batch: Vec<Message> = (0..200)
            .map(|i| mail("peer", &format!("batch message {i}"), &"body ".repeat(50)))
            .collect();
        let refs: Vec<_> = batch
            .iter()
            .map(|m| (m, Direction::In, Trust::Verified))
            .collect();
        store.insert_messages(&refs).unwrap();
        let ids: Vec<String> = batch.iter().map(|m| m.id.to_string()).collect();
        println!("committed {}", ids.join(" "));
    }
}

#[test]
fn sigkill_mid_batch_keeps_every_committed_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("store.db");
    Store::open(&db).unwrap();
    let mut child = spawn_child("child_batch_writer", &db, &[]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ids = Vec::new();
    let mut batches = 0;
    while batches < 5 {
        let line = lines.next().expect("the writer stopped early").unwrap();
        let got = committed_ids(&line);
        if !got.is_empty() {
            ids.extend(got);
            batches += 1;
        }
    }
    // The writer loops with no pause, so it is almost surely inside a transaction now.
    child.kill().unwrap();
    child.wait().unwrap();
    // Lines already written but not yet read were committed too.
    for line in lines {
        ids.extend(committed_ids(&line.unwrap()));
    }
    let store = Store::open(&db).unwrap();
    store.check_integrity().unwrap();
    for id in &ids {
        assert!(store.message(id).unwrap().is_some(), "committed {id} lost");
    }
    let count = store.message_count().unwrap();
    assert!(count >= ids.len() as u64);
    assert_eq!(count % 200, 0, "a batch was half written: {count} rows");
}

#[test]
fn a_bounce_marks_only_this_agents_sent_mail_and_only_once() {
    let (_dir, mut store) = temp_store();
    let sent = Message::new(addr("me"), vec![addr("bob"), addr("carol")], "s", "b");
    store.queue_outgoing(&sent).unwrap();
    let received = mail("bob", "hi", "b");
    store
        .insert_message(&received, Direction::In, Trust::Verified)
        .unwrap();
    let bounce = |id: MessageId, to: &str| mailslot::protocol::Bounce {
        id,
        to: Address::parse(to).unwrap(),
        expired_at: jiff::Timestamp::now(),
    };
    let recorded = store
        .record_bounces(&[
            bounce(sent.id, "bob"),
            bounce(received.id, "me"),
            bounce(MessageId::new(), "bob"),
        ])
        .unwrap();
    assert_eq!(recorded.len(), 1, "only the sent message: {recorded:?}");
    assert_eq!(
        (recorded[0].id, recorded[0].to.to_string()),
        (sent.id, "bob".to_owned())
    );
    assert!(
        store
            .record_bounces(&[bounce(sent.id, "bob")])
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .record_bounces(&[bounce(sent.id, "carol")])
            .unwrap()
            .len(),
        1
    );
    let stored = store.message(&sent.id).unwrap().unwrap();
    let names: Vec<&str> = stored.bounced.iter().map(|a| a.name().as_str()).collect();
    assert_eq!(names.len(), 2);
    assert!(
        names.contains(&"bob") && names.contains(&"carol"),
        "{names:?}"
    );
    assert!(
        store
            .message(&received.id)
            .unwrap()
            .unwrap()
            .bounced
            .is_empty()
    );
}

#[test]
fn a_message_is_found_by_the_start_or_end_of_its_id_when_only_one_matches() {
    use mailslot::store::{Direction, IdPart, StoreError, Trust};
    let (_dir, mut store) = temp_store();
    let mut a = mail("alice", "a", "x");
    a.id = "01a21010-c6f3-72af-9b2e-85104b712300".parse().unwrap();
    let mut b = mail("alice", "b", "x");
    b.id = "01a21010-c6f3-72af-9b2e-aaaaaaaaaaaa".parse().unwrap();
    for m in [&a, &b] {
        store
            .insert_message(m, Direction::In, Trust::Verified)
            .unwrap();
    }
    let part = |s: &str| s.parse::<IdPart>().unwrap();
    assert_eq!(store.resolve_message(&part("4b712300")).unwrap(), a.id);
    assert_eq!(store.resolve_message(&part("AAAA")).unwrap(), b.id);
    assert_eq!(
        store.resolve_message(&part(&a.id.to_string())).unwrap(),
        a.id
    );
    match store.resolve_message(&part("01a21010")) {
        Err(StoreError::AmbiguousId { some, .. }) => assert_eq!(some.len(), 2),
        other => panic!("expected ambiguous, got {other:?}"),
    }
    assert!(matches!(
        store.resolve_message(&part("ffff")),
        Err(StoreError::NoSuchMessage { .. })
    ));
    assert!("01a".parse::<IdPart>().is_err());
    assert!("01a2-zz".parse::<IdPart>().is_err());
}

#[test]
fn the_importance_filter_means_at_least() {
    let (_dir, mut store) = temp_store();
    let mut ids = Vec::new();
    for importance in Importance::ALL {
        let mut m = mail("bob", importance.as_str(), "x");
        m.importance = importance;
        store
            .insert_message(&m, Direction::In, Trust::Verified)
            .unwrap();
        ids.push(m.id);
    }
    let listed = |store: &Store, importance| {
        let mut found: Vec<MessageId> = store
            .inbox(&InboxQuery {
                importance,
                ..InboxQuery::default()
            })
            .unwrap()
            .iter()
            .map(|s| s.message.id)
            .collect();
        found.sort();
        found
    };
    assert_eq!(listed(&store, None), ids);
    assert_eq!(listed(&store, Some(Importance::Normal)), ids);
    assert_eq!(listed(&store, Some(Importance::High)), ids[1..]);
    assert_eq!(listed(&store, Some(Importance::Urgent)), ids[2..]);
    let stored = store.message(&ids[2]).unwrap().unwrap();
    assert_eq!(stored.message.importance, Importance::Urgent);
}

fn receipt(of: MessageId, kind: ReceiptKind, answer: Option<&str>) -> Receipt {
    Receipt {
        of,
        kind,
        answer: answer.map(Into::into),
    }
}

#[test]
fn receipts_count_once_and_only_from_recipients_of_sent_mail() {
    let (_dir, mut store) = temp_store();
    let sent = Message::new(addr("me"), vec![addr("bob"), addr("carol")], "plan", "b");
    store.queue_outgoing(&sent).unwrap();
    store.outbox_done(&sent.id, "test-relay", None).unwrap();
    let received = mail("bob", "theirs", "x");
    store
        .insert_message(&received, Direction::In, Trust::Verified)
        .unwrap();
    let now = now_millis();
    let ack = receipt(sent.id, ReceiptKind::Acknowledged, Some("on it"));
    assert!(matches!(
        store.record_receipt(&addr("bob"), &ack, now).unwrap(),
        ReceiptOutcome::Recorded(r) if r.answer.as_deref() == Some("on it")
    ));
    // Redelivered, or given again with other words: the first one stands.
    let again = receipt(sent.id, ReceiptKind::Acknowledged, Some("changed"));
    for r in [&ack, &again] {
        assert_eq!(
            store.record_receipt(&addr("bob"), r, now).unwrap(),
            ReceiptOutcome::Duplicate
        );
    }
    assert_eq!(
        store.record_receipt(&addr("mallory"), &ack, now).unwrap(),
        ReceiptOutcome::NotRecipient
    );
    for of in [MessageId::new(), received.id] {
        let r = receipt(of, ReceiptKind::Read, None);
        assert_eq!(
            store.record_receipt(&addr("bob"), &r, now).unwrap(),
            ReceiptOutcome::NotSent
        );
    }
    // The weakest copy decides: carol has said nothing yet.
    let item = &store.sent(None, 10).unwrap()[0];
    assert_eq!(item.state, SentState::Sent);
    let states: Vec<SentState> = item.recipients.iter().map(|r| r.state).collect();
    assert_eq!(states, [SentState::Acknowledged, SentState::Sent]);
    assert_eq!(item.recipients[0].answer.as_deref(), Some("on it"));

    let read = receipt(sent.id, ReceiptKind::Read, None);
    store.record_receipt(&addr("carol"), &read, now).unwrap();
    assert_eq!(store.sent(None, 10).unwrap()[0].state, SentState::Read);
    assert_eq!(store.sent(Some(SentState::Read), 10).unwrap().len(), 1);
    assert!(
        store
            .sent(Some(SentState::Acknowledged), 10)
            .unwrap()
            .is_empty()
    );
    let ack = receipt(sent.id, ReceiptKind::Acknowledged, None);
    store.record_receipt(&addr("carol"), &ack, now).unwrap();
    assert_eq!(
        store.sent(Some(SentState::Acknowledged), 10).unwrap()[0].state,
        SentState::Acknowledged
    );
    assert!(store.sent(Some(SentState::Sent), 10).unwrap().is_empty());
}

#[test]
fn read_receipts_are_queued_only_when_the_owner_turned_them_on() {
    let (_dir, mut store) = temp_store();
    let me = addr("me");
    let first = mail("bob", "one", "x");
    let second = mail("bob", "two", "x");
    let third = mail("carol", "three", "x");
    for m in [&first, &second, &third] {
        store
            .insert_message(m, Direction::In, Trust::Verified)
            .unwrap();
    }
    assert!(!store.read_receipts().unwrap(), "off unless turned on");
    assert_eq!(store.mark_read(&me, &[first.id]).unwrap(), 1);
    assert_eq!(
        store.outbox_len().unwrap(),
        0,
        "off: nothing is ever queued"
    );

    store.set_read_receipts(true).unwrap();
    assert_eq!(store.mark_read(&me, &[first.id, second.id]).unwrap(), 1);
    assert_eq!(store.mark_read(&me, &[second.id]).unwrap(), 0);
    let queued = store.outbox(10).unwrap();
    assert_eq!(queued.len(), 1, "once, for the message read now");
    let r = &queued[0].message;
    assert_eq!(r.to, vec![addr("bob")]);
    assert_eq!(r.from, me);
    assert_eq!(r.receipt, Some(receipt(second.id, ReceiptKind::Read, None)));
    assert_eq!(store.mark_all_read(&me).unwrap(), 1);
    assert_eq!(store.outbox_len().unwrap(), 2);
    // Receipts are never listed as mail.
    assert!(store.sent(None, 10).unwrap().is_empty());
    assert!(store.search_messages("three", 10).unwrap().len() == 1);
    store.set_read_receipts(false).unwrap();
    assert!(!store.read_receipts().unwrap());
}

#[test]
fn an_acknowledgement_is_queued_once() {
    let (_dir, mut store) = temp_store();
    let me = addr("me");
    let m = mail("bob", "sign off", "x");
    store
        .insert_message(&m, Direction::In, Trust::Verified)
        .unwrap();
    let Acknowledged::Now(id) = store.acknowledge(&me, &m.id, Some("yes".into())).unwrap() else {
        panic!("the first acknowledgement is queued");
    };
    assert!(matches!(
        store.acknowledge(&me, &m.id, None).unwrap(),
        Acknowledged::Before(_)
    ));
    let queued = store.outbox(10).unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].message.id, id);
    let stored = store.message(&m.id).unwrap().unwrap();
    assert_eq!(stored.receipts.len(), 1);
    assert_eq!(stored.receipts[0].recipient, me);

    let mine = Message::new(me.clone(), vec![addr("bob")], "mine", "x");
    store.queue_outgoing(&mine).unwrap();
    assert_eq!(
        store.acknowledge(&me, &mine.id, None).unwrap(),
        Acknowledged::OwnMessage
    );
    let other = mail("carol", "long", "x");
    store
        .insert_message(&other, Direction::In, Trust::Verified)
        .unwrap();
    let err = store
        .acknowledge(&me, &other.id, Some("x".repeat(MAX_ANSWER_CHARS + 1)))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Invalid(e) if e.field == "answer"),
        "{err}"
    );
    assert!(matches!(
        store.acknowledge(&me, &MessageId::new(), None).unwrap_err(),
        StoreError::NoSuchMessage { .. }
    ));
}

#[test]
fn deliveries_are_recorded_once_per_copy_and_close_on_bounce_or_receipt() {
    use mailslot::protocol::{CopyFate, CopyState};
    let (_dir, mut store) = temp_store();
    let to_both = Message::new(addr("me"), vec![addr("bob"), addr("carol")], "both", "b");
    let to_dave = Message::new(addr("me"), vec![addr("dave")], "dave", "b");
    let elsewhere = Message::new(addr("me"), vec![addr("erin")], "other relay", "b");
    for m in [&to_both, &to_dave, &elsewhere] {
        store.queue_outgoing(m).unwrap();
    }
    store.outbox_done(&to_both.id, "relay-a", None).unwrap();
    store.outbox_done(&to_dave.id, "relay-a", None).unwrap();
    store.outbox_done(&elsewhere.id, "relay-b", None).unwrap();
    let name = |s: &str| Address::parse(s).unwrap();
    let open = |store: &Store| -> Vec<(MessageId, Address)> {
        store
            .open_copies("relay-a", None, 10)
            .unwrap()
            .into_iter()
            .map(|o| (o.key.id, o.key.to))
            .collect()
    };
    assert_eq!(
        open(&store),
        [
            (to_both.id, name("bob")),
            (to_both.id, name("carol")),
            (to_dave.id, name("dave")),
        ],
        "each copy the relay took, in order; another relay's copies are not asked about there"
    );
    // Paged: after the first, the rest.
    let first = store.open_copies("relay-a", None, 1).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        store
            .open_copies("relay-a", Some(&first[0]), 10)
            .unwrap()
            .len(),
        2
    );

    let state = |id, to: &str, state| CopyState {
        id,
        to: name(to),
        state,
    };
    let at = now_millis();
    let answer = [
        state(to_both.id, "bob", CopyFate::Gone),
        state(to_both.id, "carol", CopyFate::Waiting),
        state(to_dave.id, "dave", CopyFate::Unknown),
    ];
    let delivered = store.record_copy_states(&answer, at).unwrap();
    assert_eq!(delivered.len(), 1);
    assert_eq!(
        (delivered[0].id, &delivered[0].to, delivered[0].at),
        (to_both.id, &addr("bob"), at)
    );
    assert!(
        store
            .record_copy_states(&answer, now_millis())
            .unwrap()
            .is_empty(),
        "a second answer records nothing again"
    );
    assert_eq!(open(&store), [(to_both.id, name("carol"))]);

    let state_of = |store: &Store, id: MessageId| {
        let item = store
            .sent(None, 10)
            .unwrap()
            .into_iter()
            .find(|i| i.stored.message.id == id)
            .unwrap();
        let filtered = store
            .sent(Some(item.state), 10)
            .unwrap()
            .iter()
            .any(|i| i.stored.message.id == id);
        assert!(filtered, "the state filter agrees for {id}");
        item
    };
    let both = state_of(&store, to_both.id);
    assert_eq!(both.state, SentState::Sent, "carol has not taken hers");
    assert_eq!(
        both.recipients
            .iter()
            .map(|r| (r.state, r.at))
            .collect::<Vec<_>>(),
        [(SentState::Delivered, Some(at)), (SentState::Sent, None)]
    );
    assert_eq!(
        state_of(&store, to_dave.id).state,
        SentState::Sent,
        "unknown is not delivered"
    );

    // Carol reads it: her copy closes, and the message is delivered (bob) and read (carol).
    let read = receipt(to_both.id, ReceiptKind::Read, None);
    store
        .record_receipt(&addr("carol"), &read, now_millis())
        .unwrap();
    assert!(open(&store).is_empty());
    assert_eq!(state_of(&store, to_both.id).state, SentState::Delivered);
    let stored = store.message(&to_both.id).unwrap().unwrap();
    assert_eq!(stored.delivered, [(addr("bob"), at)]);

    // A bounce closes its copy too.
    let later = Message::new(addr("me"), vec![addr("bob")], "later", "b");
    store.queue_outgoing(&later).unwrap();
    store.outbox_done(&later.id, "relay-a", None).unwrap();
    store
        .record_bounces(&[mailslot::protocol::Bounce {
            id: later.id,
            to: name("bob"),
            expired_at: now_millis(),
        }])
        .unwrap();
    assert!(open(&store).is_empty());
    assert_eq!(state_of(&store, later.id).state, SentState::Bounced);
}

#[test]
fn every_row_is_read_back_and_the_first_unreadable_one_is_named() {
    let (dir, mut store) = temp_store();
    let sent = Message::new(
        addr("alice"),
        vec![addr("bob"), Address::parse("cal@relay-b.example").unwrap()],
        "plan",
        "x",
    );
    let id = sent.id;
    store.queue_outgoing(&sent).unwrap();
    store
        .insert_message(&mail("bob", "hello", "x"), Direction::In, Trust::Verified)
        .unwrap();
    // A bounce for the recipient on another relay, named by its full address as the relay
    // names it: every view reads it.
    store
        .record_bounces(&[mailslot::protocol::Bounce {
            id,
            to: Address::parse("cal@relay-b.example").unwrap(),
            expired_at: mailslot::protocol::now_millis(),
        }])
        .unwrap();
    let checked = store.check_rows().unwrap();
    assert_eq!((checked.messages, checked.outbox), (2, 1));
    let shown = store.message(&id).unwrap().unwrap();
    assert_eq!(
        shown.bounced,
        [Address::parse("cal@relay-b.example").unwrap()]
    );
    drop(store);
    let path = dir.path().join("store.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE bounces SET recipient = 'Not An Address' WHERE message_id = ?1",
        [id.to_string()],
    )
    .unwrap();
    drop(conn);
    let store = Store::open(&path).unwrap();
    store.check_integrity().unwrap();
    let err = store.check_rows().unwrap_err().to_string();
    assert!(
        err.contains(&id.to_string()) && err.contains("bounce"),
        "{err}"
    );
}
