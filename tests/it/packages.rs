//! The packages a user installs without a Rust toolchain: the npm package (`npx -y mailslot`)
//! and the Python wheel (`pipx install mailslot`, `uvx mailslot`), built from one release build
//! by `.ci/package`, installed offline into a clean prefix and venv, and driven here the way a
//! user and a client's config would: `--version`, `mailslot demo`, and real MCP sessions through
//! each installed command. Each case is written once and run per installed command.
//!
//! `.ci/package` prints the variables read here (`MAILSLOT_PACKAGE_*`). Without them the tests
//! say they are skipped and pass, unless `MAILSLOT_REQUIRE_PACKAGES=1` (CI sets it), where they
//! fail: CI never passes without running them.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::TestRelay;
use common::mcp::{Era, McpClient, TOOLS, spawn_mcp};
use serde_json::json;

/// How long a process started through a package may outlive its client.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// One way a user runs mailslot from a package.
struct Installed {
    /// How the README names it.
    name: &'static str,
    command: PathBuf,
}

struct Packages {
    binary: PathBuf,
    npm_prefix: PathBuf,
    installed: Vec<Installed>,
}

/// What `.ci/package` installed, or `None` (after saying so) when it did not run and the tests
/// are not required.
fn packages() -> Option<Packages> {
    let [binary, npm, wheel, uvx] = common::external_tools(
        &[
            "MAILSLOT_PACKAGE_BINARY",
            "MAILSLOT_PACKAGE_NPM",
            "MAILSLOT_PACKAGE_WHEEL",
            "MAILSLOT_PACKAGE_UVX",
        ],
        "MAILSLOT_REQUIRE_PACKAGES",
        "package",
        "Packages",
    )?
    .try_into()
    .unwrap();
    let npm_prefix = PathBuf::from(std::env::var_os("MAILSLOT_PACKAGE_NPM_PREFIX")?);
    Some(Packages {
        binary,
        npm_prefix,
        installed: vec![
            Installed {
                name: "npm package",
                command: npm,
            },
            Installed {
                name: "wheel (pip)",
                command: wheel,
            },
            Installed {
                name: "wheel (uvx)",
                command: uvx,
            },
        ],
    })
}

fn run(command: &mut Command) -> Output {
    let out = command.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn each_package_runs_the_release_binary_of_this_commit() {
    let Some(packages) = packages() else { return };
    let version = format!("mailslot {}\n", env!("CARGO_PKG_VERSION"));
    let built = std::fs::read(&packages.binary).unwrap();
    for installed in &packages.installed {
        let out = run(Command::new(&installed.command).arg("--version"));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            version,
            "{}",
            installed.name
        );
    }
    // The binaries that were installed are the one that was built, byte for byte.
    let npm_binary = packages
        .npm_prefix
        .join("node_modules/@mailslot/linux-x64/bin/mailslot");
    assert!(
        std::fs::read(&npm_binary).unwrap() == built,
        "{} is not the release binary",
        npm_binary.display()
    );
    let wheel = &packages.installed[1].command;
    assert!(
        std::fs::read(wheel).unwrap() == built,
        "{} is not the release binary",
        wheel.display()
    );
    // `npx mailslot` resolves the installed package's command, offline.
    let out = run(Command::new("npm")
        .args(["exec", "--offline", "--yes", "--", "mailslot", "--version"])
        .current_dir(&packages.npm_prefix));
    assert_eq!(String::from_utf8_lossy(&out.stdout), version);
}

#[test]
fn the_npm_command_without_its_platform_package_says_what_is_missing() {
    let Some(_) = packages() else { return };
    let shim = std::env::var_os("MAILSLOT_PACKAGE_NPM_SHIM_ONLY").expect(".ci/package sets it");
    let out = Command::new(shim).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "stdout belongs to the protocol");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("@mailslot/linux-x64") && said.contains("--omit=optional"),
        "{said}"
    );
}

#[test]
fn the_demo_runs_through_each_package() {
    let Some(packages) = packages() else { return };
    for installed in &packages.installed {
        let home = tempfile::tempdir().unwrap();
        let out = run(Command::new(&installed.command)
            .arg("demo")
            .env("MAILSLOT_HOME", home.path()));
        let text = String::from_utf8_lossy(&out.stdout);
        for step in [
            "1. alice calls the send tool",
            "2. bob's doorbell rings",
            "4. alice's doorbell rings",
        ] {
            assert!(
                text.contains(step),
                "{}: no {step:?} in\n{text}",
                installed.name
            );
        }
    }
}

/// A `mailslot mcp` for `name` started through `command`, as a client's config starts it.
async fn spawn_through(
    command: &Path,
    home: &Path,
    name: &str,
    relay: &mailslot::client::RelayUrl,
) -> McpClient {
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(["--agent", name, "--relay", relay.as_str(), "mcp"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("MAILSLOT_HOME", home)
        .env("MAILSLOT_LOG", "warn");
    let transport =
        rmcp::transport::TokioChildProcess::new(cmd).expect("the package's mailslot starts");
    McpClient::connect(transport, Era::Legacy).await
}

/// The processes a session for `agent` started: those whose command line names the agent.
fn processes_of(agent: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|argv| argv.split(|b| *b == 0).any(|a| a == agent.as_bytes()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_talks_mcp_through_each_package_and_nothing_outlives_it() {
    let Some(packages) = packages() else { return };
    let relay = TestRelay::start(|_| {}).await;
    // One home, one owner: its agents may write to each other without a contact request.
    let home = relay.home(&["bob"]);
    let mut bob = spawn_mcp(home.path(), "bob", &relay.url, Era::Legacy).await;
    for (i, installed) in packages.installed.iter().enumerate() {
        let name = format!("package-agent-{i}-{}", std::process::id());
        let mut alice = spawn_through(&installed.command, home.path(), &name, &relay.url).await;
        let tools = alice.client.list_all_tools().await.unwrap();
        let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        names.sort_unstable();
        assert_eq!(names, TOOLS, "{}", installed.name);

        let subject = format!("through the {}", installed.name);
        let sent = alice
            .ok(
                "send",
                json!({ "to": ["bob"], "subject": subject, "body": "hello" }),
            )
            .await;
        assert_eq!(sent["status"], "sent", "{}: {sent}", installed.name);
        let event = bob.channel_event().await;
        assert_eq!(event["meta"]["from"], name.as_str(), "{event}");
        assert_eq!(event["meta"]["message_id"], sent["message_id"]);

        bob.ok(
            "reply",
            json!({ "message_id": sent["message_id"], "body": "got it" }),
        )
        .await;
        let answer = alice.channel_event().await;
        assert_eq!(
            answer["meta"]["from"], "bob",
            "{}: {answer}",
            installed.name
        );

        // The client goes away as clients do (its end of stdin closes); the shim and the binary
        // it started go with it.
        assert!(!processes_of(&name).is_empty());
        alice.0.client.cancel().await.unwrap();
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            let left = processes_of(&name);
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: processes {left:?} outlived their client by {EXIT_TIMEOUT:?}",
                installed.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
