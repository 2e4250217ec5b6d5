//! Every file in `mcp-config-examples/` parses, starts `mailslot`, and names only flags and
//! environment variables that mailslot accepts.

use std::path::{Path, PathBuf};

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
    let command = server["command"].as_str().unwrap_or_default();
    if !command.ends_with("mailslot") {
        return false;
    }
    let args: Vec<String> = server["args"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: {name} has no args", file.display()))
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert!(
        args.contains(&"mcp".to_owned()),
        "{}: {name} does not run `mailslot mcp`",
        file.display()
    );
    check_command(file, &args);
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
        let text = std::fs::read_to_string(file).unwrap();
        let json: Value = if file.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).unwrap_or_else(|e| panic!("{} is not TOML: {e}", file.display()))
        } else {
            serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", file.display()))
        };
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
                    assert_eq!(words[0], "mailslot", "{}", file.display());
                    assert!(words.contains(&"hook".to_owned()));
                    check_command(file, &words[1..]);
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
    assert!(servers >= 4, "only {servers} mailslot servers found");
    assert_eq!(
        hooks, 6,
        "the Claude Code example has the four hooks and the rewake hook at SessionStart and Stop"
    );
}
