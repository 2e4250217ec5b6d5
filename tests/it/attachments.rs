//! Attachments end to end: a real relay on loopback, real `mailslot mcp` processes (started in
//! a working directory of their own, the folder a client without roots may use) and the CLI.

use crate::common;

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use common::mcp::*;
use common::*;
use mailslot::crypto::{Identity, OpenError, open, seal};
use mailslot::protocol::{Address, Attachment, Limits, Message};
use rmcp::model::{ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const FIVE_MIB: usize = 5 * 1024 * 1024;

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Bytes that are not text and do not repeat in any short period.
fn binary(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// `mailslot mcp` for `name`, working in `dir`.
async fn spawn_in(
    dir: &Path,
    home: &Path,
    name: &str,
    relay: &mailslot::client::RelayUrl,
) -> McpClient {
    spawn_with_roots(dir, &[], home, name, relay).await
}

/// Reads a resource; its text or its decoded blob, and its media type.
async fn read_resource(c: &McpClient, uri: &str) -> (Vec<u8>, Option<String>) {
    let result = c
        .client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    match result.contents.into_iter().next().unwrap() {
        ResourceContents::TextResourceContents {
            text, mime_type, ..
        } => (text.into_bytes(), mime_type),
        ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        } => (
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .unwrap(),
            mime_type,
        ),
        other => panic!("{uri}: unexpected contents {other:?}"),
    }
}

/// Waits until `c`'s inbox lists `id`.
async fn wait_for_message(c: &McpClient, id: &Value) {
    wait_until(Duration::from_secs(30), "the message arrives", async || {
        let list = c.ok("inbox", json!({ "unread_only": false })).await;
        list["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["message_id"] == *id)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_a_5_mib_binary_go_through_intact_by_resource_save_and_cli() {
    let relay = TestRelay::start(|_| {}).await;
    let home = relay.home(&["bob"]);
    let (alice_dir, bob_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let alice = spawn_in(alice_dir.path(), home.path(), "alice", &relay.url).await;
    let bob = spawn_in(bob_dir.path(), home.path(), "bob", &relay.url).await;

    let blob = binary(FIVE_MIB);
    std::fs::write(alice_dir.path().join("model.bin"), &blob).unwrap();
    let sent = alice
        .ok(
            "send",
            json!({ "to": ["bob"], "subject": "weights", "body": "two files",
                    "attachments": [
                        { "path": "model.bin" },
                        { "name": "notes.md", "text": "# notes\nall good" }
                    ] }),
        )
        .await;
    // Sealing 5 MiB in a debug build beside the other tests can take longer than the 5 s the
    // tool waits for the relay; then it says queued and sends it anyway. Bob's copy is the proof.
    assert!(
        sent["status"] == "sent" || sent["status"] == "queued",
        "{sent}"
    );
    let id = sent["message_id"].clone();
    wait_for_message(&bob, &id).await;

    // The listing carries no content; the read lists each attachment and links it.
    let list = bob.ok("inbox", json!({})).await;
    assert!(list.to_string().len() < 16 * 1024, "{list}");
    let result = bob.call("read", json!({ "message_id": id })).await;
    let view = result.structured_content.clone().unwrap();
    let attachments = view["attachments"].as_array().unwrap();
    assert_eq!(attachments.len(), 2, "{view}");
    assert_eq!(attachments[0]["size"], FIVE_MIB);
    assert_eq!(attachments[0]["sha256"], sha256_hex(&blob));
    assert_eq!(attachments[0]["media_type"], "application/octet-stream");
    assert_eq!(attachments[1]["media_type"], "text/markdown");
    let framed = view["framed"].as_str().unwrap();
    assert!(
        framed.contains(&format!(
            "model.bin (application/octet-stream, {FIVE_MIB} bytes, sha256 {})",
            sha256_hex(&blob)
        )),
        "{framed}"
    );
    assert!(framed.len() < 16 * 1024, "no content in the framed text");
    let links: Vec<String> = result
        .content
        .iter()
        .filter_map(|c| c.as_resource_link().map(|r| r.uri.clone()))
        .collect();
    let uri = |n: usize| {
        format!(
            "mailslot://messages/{}/attachments/{n}",
            id.as_str().unwrap()
        )
    };
    assert_eq!(links, vec![uri(0), uri(1)]);

    // Through the resource: a blob for binary, text for text.
    let (bytes, media_type) = read_resource(&bob, &uri(0)).await;
    assert_eq!(sha256_hex(&bytes), sha256_hex(&blob));
    assert!(bytes == blob);
    assert_eq!(media_type.as_deref(), Some("application/octet-stream"));
    let (text, _) = read_resource(&bob, &uri(1)).await;
    assert_eq!(text, b"# notes\nall good");

    // Through save_attachment, inside bob's working directory only, never over a file.
    let missing = bob
        .err(
            "save_attachment",
            json!({ "message_id": id, "index": 0, "path": "in/model.bin" }),
        )
        .await;
    assert!(
        missing.contains("in/model.bin"),
        "a missing folder is an error: {missing}"
    );
    std::fs::create_dir(bob_dir.path().join("in")).unwrap();
    let saved = bob
        .ok(
            "save_attachment",
            json!({ "message_id": id, "index": 0, "path": "in/model.bin" }),
        )
        .await;
    assert_eq!(saved["sha256"], sha256_hex(&blob));
    assert!(std::fs::read(bob_dir.path().join("in/model.bin")).unwrap() == blob);
    let again = bob
        .err(
            "save_attachment",
            json!({ "message_id": id, "index": 0, "path": "in/model.bin" }),
        )
        .await;
    assert!(
        again.contains("exists") && again.contains("overwrite"),
        "{again}"
    );
    let outside = alice_dir.path().join("stolen.bin");
    let refused = bob
        .err(
            "save_attachment",
            json!({ "message_id": id, "index": 0, "path": outside }),
        )
        .await;
    assert!(refused.contains("outside the folders"), "{refused}");
    assert!(!outside.exists());

    // Through the CLI: read --save writes each attachment under its name.
    drop(bob);
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap().to_owned();
    mailslot_cli(
        home.path(),
        relay.url.as_str(),
        &[
            "--agent",
            "bob",
            "read",
            id.as_str().unwrap(),
            "--save",
            &out_dir,
        ],
    )
    .await;
    assert!(std::fs::read(out.path().join("model.bin")).unwrap() == blob);
    assert_eq!(
        std::fs::read(out.path().join("notes.md")).unwrap(),
        b"# notes\nall good"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_folder_symlinks_out_and_oversized_files_are_refused() {
    let relay = TestRelay::start(|_| {}).await;
    let home = relay.home(&["bob"]);
    let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let alice = spawn_in(dir.path(), home.path(), "alice", &relay.url).await;
    let secret = elsewhere.path().join("secret.txt");
    std::fs::write(&secret, "not for bob").unwrap();
    std::os::unix::fs::symlink(&secret, dir.path().join("innocent.txt")).unwrap();
    let limit = Limits::default().attachment_bytes;
    std::fs::write(dir.path().join("huge.bin"), vec![0u8; limit + 1]).unwrap();

    let send = |attachment: Value| json!({ "to": ["bob"], "subject": "s", "body": "b", "attachments": [attachment] });
    let e = alice.err("send", send(json!({ "path": secret }))).await;
    assert!(
        e.contains(&secret.display().to_string())
            && e.contains("outside the folders")
            && e.contains("the working directory"),
        "{e}"
    );
    let e = alice
        .err("send", send(json!({ "path": "innocent.txt" })))
        .await;
    assert!(
        e.contains("innocent.txt") && e.contains("outside the folders"),
        "{e}"
    );
    let e = alice.err("send", send(json!({ "path": "huge.bin" }))).await;
    assert!(
        e.contains("huge.bin") && e.contains(&format!("over the limit of {limit} bytes")),
        "{e}"
    );
    let e = alice
        .err(
            "send",
            send(json!({ "name": "x.txt", "text": "x".repeat(64 * 1024 + 1) })),
        )
        .await;
    assert!(e.contains("65536"), "{e}");
    let e = alice.err("send", send(json!({ "path": "." }))).await;
    assert!(e.contains("not a regular file"), "{e}");
    let sent = alice.ok("sent", json!({})).await;
    assert!(
        sent["messages"].as_array().unwrap().is_empty(),
        "nothing was sent: {sent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_over_the_relays_limit_is_refused_naming_it_and_the_connection_carries_on() {
    let relay = TestRelay::start(|c| c.limits.envelope_bytes = 1024 * 1024).await;
    let home = relay.home(&["bob"]);
    let dir = tempfile::tempdir().unwrap();
    let alice = spawn_in(dir.path(), home.path(), "alice", &relay.url).await;
    let bob = spawn_in(dir.path(), home.path(), "bob", &relay.url).await;
    std::fs::write(dir.path().join("big.bin"), binary(2 * 1024 * 1024)).unwrap();

    let e = alice
        .err(
            "send",
            json!({ "to": ["bob"], "subject": "big", "body": "b", "attachments": [{ "path": "big.bin" }] }),
        )
        .await;
    assert!(e.contains("over the limit of 1048576"), "{e}");
    // The same connection takes the next message at once: it was not closed.
    let sent = alice
        .ok("send", send_args(&["bob"], "small", "after the big one"))
        .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    wait_for_message(&bob, &sent["message_id"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_attaches_files() {
    let relay = TestRelay::start(|_| {}).await;
    let home = relay.home(&["alice", "bob"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.csv");
    std::fs::write(&file, "a,b\n1,2\n").unwrap();
    let out = mailslot_cli(
        home.path(),
        relay.url.as_str(),
        &[
            "--agent",
            "alice",
            "--json",
            "send",
            "--to",
            "bob",
            "--subject",
            "numbers",
            "--body",
            "attached",
            "--attach",
            file.to_str().unwrap(),
        ],
    )
    .await;
    let sent: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(sent["status"], "sent", "{sent}");
    let bob = spawn_in(dir.path(), home.path(), "bob", &relay.url).await;
    wait_for_message(&bob, &sent["id"]).await;
    let view = bob.ok("read", json!({ "message_id": sent["id"] })).await;
    assert_eq!(view["attachments"][0]["media_type"], "text/csv");
    let uri = view["attachments"][0]["uri"].as_str().unwrap().to_owned();
    assert_eq!(read_resource(&bob, &uri).await.0, b"a,b\n1,2\n");
}

#[test]
fn a_flipped_byte_in_a_sealed_attachment_fails_verification() {
    let (alice, bob) = (Identity::generate(), Identity::generate());
    let bob_addr = Address::parse("bob").unwrap();
    let mut m = Message::new(
        Address::parse("alice").unwrap(),
        vec![bob_addr.clone()],
        "s",
        "b",
    );
    m.attachments = vec![Attachment::new(
        "a.bin",
        "application/octet-stream",
        binary(64 * 1024),
    )];
    let limits = Limits::default();
    let env = seal(
        &m,
        &alice,
        &[(bob_addr.clone(), bob.public().clone())],
        &limits,
    )
    .unwrap()
    .remove(0);
    let opened = open(&env, &bob_addr, &bob, alice.public(), &limits).unwrap();
    assert_eq!(opened.attachments[0].sha256, m.attachments[0].sha256);
    let mut tampered = env.clone();
    // Well inside the attachment's bytes, past the header fields.
    let at = tampered.ciphertext.len() / 2;
    tampered.ciphertext[at] ^= 0x01;
    assert!(matches!(
        open(&tampered, &bob_addr, &bob, alice.public(), &limits),
        Err(OpenError::Decrypt)
    ));
}

/// `mailslot mcp` for `name` in working directory `dir`, its client declaring `roots`.
async fn spawn_with_roots(
    dir: &Path,
    roots: &[&Path],
    home: &Path,
    name: &str,
    relay: &mailslot::client::RelayUrl,
) -> McpClient {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"));
    cmd.args(["--agent", name, "--relay", relay.as_str(), "mcp"])
        .current_dir(dir)
        .env_clear()
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_LOG", "warn");
    let transport = rmcp::transport::TokioChildProcess::new(cmd).expect("mailslot mcp starts");
    let uris = roots
        .iter()
        .map(|r| format!("file://{}", r.display()))
        .collect();
    McpClient::connect_with_roots(transport, Era::Legacy, uris).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_roots_attaches_and_saves_inside_them_only_not_in_the_working_directory() {
    let relay = TestRelay::start(|_| {}).await;
    let home = relay.home(&["bob"]);
    let (cwd, root, bob_root) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let alice =
        spawn_with_roots(cwd.path(), &[root.path()], home.path(), "alice", &relay.url).await;
    let mut bob = spawn_with_roots(
        cwd.path(),
        &[bob_root.path()],
        home.path(),
        "bob",
        &relay.url,
    )
    .await;
    std::fs::write(root.path().join("report.txt"), "inside the root").unwrap();
    let in_cwd = cwd.path().join("cwd.txt");
    std::fs::write(&in_cwd, "the working directory is not a root").unwrap();
    let send = |attachment: Value| json!({ "to": ["bob"], "subject": "s", "body": "b", "attachments": [attachment] });

    // A root declared, the working directory no longer counts.
    let e = alice.err("send", send(json!({ "path": in_cwd }))).await;
    assert!(
        e.contains(&in_cwd.display().to_string())
            && e.contains("outside the folders")
            && e.contains("roots"),
        "{e}"
    );
    // A relative path is read against the first root.
    let sent = alice
        .ok("send", send(json!({ "path": "report.txt" })))
        .await;
    assert_eq!(sent["status"], "sent", "{sent}");
    let rung = bob.channel_event().await;
    let id = rung["meta"]["message_id"].as_str().unwrap().to_owned();
    assert_eq!(id, sent["message_id"].as_str().unwrap());

    // Bob saves inside his root (a relative path lands there), never in his working directory.
    let saved = bob
        .ok(
            "save_attachment",
            json!({ "message_id": id, "index": 0, "path": "report.txt" }),
        )
        .await;
    assert_eq!(saved["sha256"], sha256_hex(b"inside the root"));
    assert_eq!(
        std::fs::read_to_string(bob_root.path().join("report.txt")).unwrap(),
        "inside the root"
    );
    let outside = cwd.path().join("saved.txt");
    let refused = bob
        .err(
            "save_attachment",
            json!({ "message_id": id, "index": 0, "path": outside }),
        )
        .await;
    assert!(refused.contains("outside the folders"), "{refused}");
    assert!(!outside.exists());
}
