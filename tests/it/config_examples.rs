//! Every file in `mcp-config-examples/` parses, starts `mailslot` (or `npx -y mailslot`), and
//! names only flags and environment variables that mailslot accepts; every example has its
//! `npx` twin under `mcp-config-examples/npx/`, the same but for the command.

use std::path::{Path, PathBuf};

use crate::common::mailslot_args;
use clap::Parser;
use mailslot::cli::Cli;
use serde_json::Value;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "json" || e == "toml") {
            out.push(path);
        }
    }
}

/// A mailslot command line must parse exactly as the binary would parse it.
fn check_command(file: &Path, args: &[String]) {
    let argv = std::iter::once("mailslot".to_owned()).chain(args.iter().cloned());
    if let Err(e) = Cli::try_parse_from(argv) {
        panic!(
            "{}: `mailslot {}` is not accepted:\n{e}",
            file.display(),
            args.join(" ")
        );
    }
}

fn check_server(file: &Path, name: &str, server: &Value) -> bool {
    let argv: Vec<String> = std::iter::once(&server["command"])
        .chain(server["args"].as_array().into_iter().flatten())
        .map(|a| a.as_str().unwrap_or_default().to_owned())
        .collect();
    let Some(args) = mailslot_args(&argv) else {
        return false;
    };
    assert!(
        server["args"].is_array(),
        "{}: {name} has no args",
        file.display()
    );
    assert!(
        args.contains(&"mcp".to_owned()),
        "{}: {name} does not run `mailslot mcp`",
        file.display()
    );
    check_command(file, args);
    let named = server["env"]
        .as_object()
        .into_iter()
        .flat_map(|env| env.keys().cloned())
        .chain(
            server["env_vars"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_owned()),
        );
    for key in named {
        assert!(
            mailslot::config::ENV_VARS.contains(&key.as_str()),
            "{}: {name} names {key}, which mailslot does not read",
            file.display()
        );
    }
    true
}

#[test]
fn every_example_runs_mailslot_with_flags_and_variables_it_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp-config-examples");
    let mut found = Vec::new();
    files(&root, &mut found);
    assert!(found.len() >= 5, "examples are missing: {found:?}");
    let mut servers = 0;
    let mut hooks = 0;
    for file in &found {
        let json = parse(file);
        for map in [
            &json["mcpServers"],
            &json["servers"],
            &json["mcp"]["servers"],
            &json["mcp_servers"],
        ] {
            for (name, server) in map.as_object().into_iter().flatten() {
                if check_server(file, name, server) {
                    servers += 1;
                }
            }
        }
        for (_, groups) in json["hooks"].as_object().into_iter().flatten() {
            for group in groups.as_array().unwrap() {
                for hook in group["hooks"].as_array().unwrap() {
                    let words: Vec<String> = hook["command"]
                        .as_str()
                        .unwrap()
                        .split_whitespace()
                        .map(str::to_owned)
                        .collect();
                    let args = mailslot_args(&words)
                        .unwrap_or_else(|| panic!("{}: {hook} runs no mailslot", file.display()));
                    assert!(words.contains(&"hook".to_owned()));
                    check_command(file, args);
                    // The rewake hook only works in the background: it waits for mail.
                    let wake = words.last().is_some_and(|w| w == "wake");
                    assert_eq!(
                        hook["asyncRewake"] == true,
                        wake,
                        "{}: {hook}",
                        file.display()
                    );
                    hooks += 1;
                }
            }
        }
    }
    assert!(servers >= 8, "only {servers} mailslot servers found");
    assert_eq!(
        hooks, 12,
        "the Claude Code example and its npx twin have the four hooks and the rewake hook at SessionStart and Stop"
    );
}

/// `value` as it reads when mailslot is run as `npx -y mailslot`.
fn through_npx(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut map: serde_json::Map<String, Value> = map
                .iter()
                .map(|(k, v)| (k.clone(), through_npx(v)))
                .collect();
            match map.get("command").and_then(Value::as_str) {
                Some("mailslot") if map.get("args").is_some_and(Value::is_array) => {
                    map.insert("command".into(), "npx".into());
                    let args = map["args"].as_array().unwrap();
                    let args = ["-y", "mailslot"]
                        .into_iter()
                        .map(Value::from)
                        .chain(args.iter().cloned())
                        .collect();
                    map.insert("args".into(), Value::Array(args));
                }
                Some(line) if line.starts_with("mailslot ") => {
                    map.insert("command".into(), format!("npx -y {line}").into());
                }
                _ => {}
            }
            Value::Object(map)
        }
        Value::Array(items) => Value::Array(items.iter().map(through_npx).collect()),
        other => other.clone(),
    }
}

fn parse(file: &Path) -> Value {
    let text = std::fs::read_to_string(file).unwrap();
    if file.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).unwrap_or_else(|e| panic!("{} is not TOML: {e}", file.display()))
    } else {
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", file.display()))
    }
}

#[test]
fn every_example_has_its_npx_twin() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp-config-examples");
    let npx = root.join("npx");
    let mut found = Vec::new();
    files(&root, &mut found);
    let mut twins = 0;
    for file in found.iter().filter(|f| !f.starts_with(&npx)) {
        let example = parse(file);
        let expected = through_npx(&example);
        let twin = npx.join(file.strip_prefix(&root).unwrap());
        if expected == example {
            assert!(
                !twin.exists(),
                "{} runs no mailslot command",
                file.display()
            );
            continue;
        }
        assert!(
            twin.is_file(),
            "{} has no npx twin at {}",
            file.display(),
            twin.display()
        );
        assert_eq!(
            parse(&twin),
            expected,
            "{} is not {} run through npx",
            twin.display(),
            file.display()
        );
        twins += 1;
    }
    assert_eq!(
        twins, 7,
        "the examples that start mailslot, each with its twin"
    );
}
