//! What the Claude Code session that started this process asked for, read from what Claude
//! Code documents: the channels named on its command line (`--channels`,
//! `--dangerously-load-development-channels`) and the `crossSessionInbound` setting of its
//! settings files. Both are read once, when `mailslot mcp` starts.

use std::path::{Path, PathBuf};

/// The launch flags that name the session's channels.
const CHANNEL_FLAGS: &[&str] = &["--channels", "--dangerously-load-development-channels"];
/// How many ancestors are searched for Claude Code's command line (a config may start
/// mailslot through `npx` or a shell).
const MAX_ANCESTORS: usize = 6;
/// The largest settings file read.
const MAX_SETTINGS_BYTES: u64 = 1024 * 1024;

/// Whether a channel entry (`server:NAME`, `plugin:NAME@marketplace`) names mailslot's MCP
/// server: by convention its name contains `mailslot` (the README's examples name it so).
pub fn names_mailslot(entry: &str) -> bool {
    let name = entry
        .strip_prefix("server:")
        .or_else(|| entry.strip_prefix("plugin:"))
        .unwrap_or(entry);
    let name = name.split('@').next().unwrap_or(name);
    name.to_ascii_lowercase().contains("mailslot")
}

/// The channel entries in a command line (`--flag a b`, `--flag=a,b`).
pub fn channel_entries(argv: &[String]) -> Vec<String> {
    let mut entries = Vec::new();
    let mut taking = false;
    for arg in argv {
        if let Some((flag, value)) = arg.split_once('=')
            && CHANNEL_FLAGS.contains(&flag)
        {
            entries.extend(split_entries(value));
            taking = false;
        } else if CHANNEL_FLAGS.contains(&arg.as_str()) {
            taking = true;
        } else if arg.starts_with('-') {
            taking = false;
        } else if taking {
            entries.extend(split_entries(arg));
        }
    }
    entries
}

fn split_entries(value: &str) -> impl Iterator<Item = String> + '_ {
    value
        .split([',', ' '])
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
}

/// What Claude Code's command line asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// It names mailslot's channel.
    pub channel: bool,
    /// It runs headless (`-p`, `--print`): no idle session to wake.
    pub headless: bool,
}

impl Flags {
    /// The flags of `argv`, Claude Code's command line.
    pub fn of(argv: &[String]) -> Self {
        Self {
            channel: channel_entries(argv).iter().any(|e| names_mailslot(e)),
            headless: argv.iter().any(|a| a == "-p" || a == "--print"),
        }
    }
}

/// The flags of the Claude Code that started this process: the nearest ancestor whose
/// program is Claude Code (`claude`, or its npm `cli.js`). An SDK entry point
/// (`CLAUDE_CODE_ENTRYPOINT=sdk-…`, which Claude Code sets for its children) is headless too.
pub fn claude_code_flags() -> Flags {
    let sdk = std::env::var("CLAUDE_CODE_ENTRYPOINT").is_ok_and(|e| e.starts_with("sdk"));
    let mut pid = nix::unistd::getppid().as_raw() as u32;
    for _ in 0..MAX_ANCESTORS {
        if pid <= 1 {
            break;
        }
        let Some((argv, parent)) = process::argv_and_parent(pid) else {
            break;
        };
        if is_claude_code(&argv) {
            let flags = Flags::of(&argv);
            return Flags {
                headless: flags.headless || sdk,
                ..flags
            };
        }
        pid = parent;
    }
    Flags {
        channel: false,
        headless: sdk,
    }
}

/// Whether `argv` runs Claude Code.
fn is_claude_code(argv: &[String]) -> bool {
    let file = |a: &String| {
        Path::new(a)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    argv.first().is_some_and(|a| file(a) == "claude")
        || argv
            .get(1)
            .is_some_and(|a| a.contains("claude-code") && file(a) == "cli.js")
}

/// The `crossSessionInbound` setting: what Claude Code does with a message on the session's
/// inbox socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// Not set, `auto` or `accept`: the message is queued as the next prompt.
    Accept,
    /// `hold`: the owner must click Deliver (not a wake).
    Hold,
    /// `refuse`: dropped.
    Refuse,
}

impl Inbound {
    /// The setting's value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Inbound::Accept => "accept",
            Inbound::Hold => "hold",
            Inbound::Refuse => "refuse",
        }
    }
}

/// Claude Code's settings files for a project, highest precedence first: managed, local
/// project, project, user.
pub fn settings_files(project: &Path, user_claude_dir: Option<&Path>) -> Vec<PathBuf> {
    let managed = if cfg!(target_os = "macos") {
        PathBuf::from("/Library/Application Support/ClaudeCode/managed-settings.json")
    } else {
        PathBuf::from("/etc/claude-code/managed-settings.json")
    };
    let mut files = vec![
        managed,
        project.join(".claude/settings.local.json"),
        project.join(".claude/settings.json"),
    ];
    files.extend(user_claude_dir.map(|d| d.join("settings.json")));
    files
}

/// The settings files of the session Claude Code runs in this project (see
/// [`settings_files`]).
pub fn session_settings_files() -> Vec<PathBuf> {
    settings_files(&project_dir(), user_claude_dir().as_deref())
}

/// The user's Claude Code folder: `CLAUDE_CONFIG_DIR`, else `~/.claude`.
pub fn user_claude_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CLAUDE_CONFIG_DIR") {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".claude"))
}

/// The project Claude Code runs in: `CLAUDE_PROJECT_DIR` (which it gives its MCP servers and
/// hooks), else the working directory.
pub fn project_dir() -> PathBuf {
    std::env::var_os("CLAUDE_PROJECT_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_default()
}

/// The effective `crossSessionInbound` of `files` (highest precedence first), and the file
/// that set it. An unreadable or invalid file is skipped with a warning.
pub fn inbound_setting(files: &[PathBuf]) -> (Inbound, Option<PathBuf>) {
    for file in files {
        let Some(value) = read_setting(file, "crossSessionInbound") else {
            continue;
        };
        let inbound = match value.as_str() {
            "hold" => Inbound::Hold,
            "refuse" => Inbound::Refuse,
            "accept" | "auto" => Inbound::Accept,
            other => {
                tracing::warn!(file = %file.display(), value = other, "unknown crossSessionInbound value; taken as accept");
                Inbound::Accept
            }
        };
        return (inbound, Some(file.clone()));
    }
    (Inbound::Accept, None)
}

/// Whether any of `files` configures a hook command containing `needle` with
/// `"asyncRewake": true`.
pub fn has_rewake_hook(files: &[PathBuf], needle: &str) -> bool {
    files.iter().filter_map(|f| read_json(f)).any(|settings| {
        settings["hooks"].as_object().is_some_and(|events| {
            events
                .values()
                .filter_map(|v| v.as_array())
                .flatten()
                .any(|entry| {
                    entry["hooks"].as_array().is_some_and(|hooks| {
                        hooks.iter().any(|h| {
                            h["asyncRewake"] == true
                                && h["command"].as_str().is_some_and(|c| c.contains(needle))
                        })
                    })
                })
        })
    })
}

fn read_setting(file: &Path, key: &str) -> Option<String> {
    read_json(file)?.get(key)?.as_str().map(str::to_owned)
}

fn read_json(file: &Path) -> Option<serde_json::Value> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(file)
        .ok()?
        .take(MAX_SETTINGS_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(&text)
        .inspect_err(|e| tracing::warn!(file = %file.display(), error = %e, "cannot parse Claude Code settings"))
        .ok()
}

/// The Claude Code process a hook runs under: `CLAUDE_PID`, which Claude Code gives its
/// hooks, else the hook shell's parent.
pub fn claude_pid() -> Option<u32> {
    std::env::var("CLAUDE_PID")
        .ok()
        .and_then(|p| p.parse().ok())
        .filter(|p| *p > 1)
        .or_else(|| parent_of(nix::unistd::getppid().as_raw() as u32).filter(|p| *p > 1))
}

/// Whether the session a hook runs in is headless (`claude -p`), where nobody waits to be
/// woken and Claude Code holds its first request until a SessionStart `asyncRewake` hook
/// exits: `CLAUDE_CODE_SESSION_ATTENDED=0` in the hook's environment, else `-p`/`--print`
/// on Claude Code's command line.
pub fn hook_headless() -> bool {
    if let Ok(attended) = std::env::var("CLAUDE_CODE_SESSION_ATTENDED") {
        return attended == "0";
    }
    claude_pid()
        .and_then(process::argv_and_parent)
        .is_some_and(|(argv, _)| Flags::of(&argv).headless)
}

/// `pid`'s parent, if `pid` runs.
pub fn parent_of(pid: u32) -> Option<u32> {
    process::argv_and_parent(pid).map(|(_, parent)| parent)
}

/// Reading another process's command line and parent.
mod process {
    /// `pid`'s arguments and parent process id.
    #[cfg(target_os = "linux")]
    pub fn argv_and_parent(pid: u32) -> Option<(Vec<String>, u32)> {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let argv = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // The state line is `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let parent = after.split_whitespace().nth(1)?.parse().ok()?;
        Some((argv, parent))
    }

    /// `pid`'s arguments (split on spaces, as `ps` prints them) and parent process id.
    #[cfg(not(target_os = "linux"))]
    pub fn argv_and_parent(pid: u32) -> Option<(Vec<String>, u32)> {
        let out = std::process::Command::new("ps")
            .args(["-ww", "-o", "ppid=", "-o", "args=", "-p", &pid.to_string()])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text.split_whitespace();
        let parent = words.next()?.parse().ok()?;
        Some((words.map(str::to_owned).collect(), parent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn knows_claude_code_and_its_headless_runs() {
        assert!(is_claude_code(&argv("/usr/bin/claude --debug")));
        assert!(is_claude_code(&argv(
            "node /x/node_modules/@anthropic-ai/claude-code/cli.js -p hi"
        )));
        assert!(!is_claude_code(&argv("/bin/sh -c claude")));
        assert!(Flags::of(&argv("claude -p hello")).headless);
        assert!(!Flags::of(&argv("claude --debug-file x")).headless);
    }

    #[test]
    fn finds_mailslot_among_the_channel_flags() {
        let e = channel_entries(&argv(
            "claude --debug-file x --dangerously-load-development-channels server:mailslot --model y",
        ));
        assert_eq!(e, ["server:mailslot"]);
        assert!(e.iter().any(|e| names_mailslot(e)));
        let e = channel_entries(&argv(
            "claude --channels=plugin:telegram@official,server:team-mailslot",
        ));
        assert_eq!(e, ["plugin:telegram@official", "server:team-mailslot"]);
        assert!(names_mailslot(&e[1]) && !names_mailslot(&e[0]));
        assert!(channel_entries(&argv("claude -p hello server:mailslot")).is_empty());
        assert!(!names_mailslot("plugin:slot@mailslot-market"));
    }

    #[test]
    fn the_highest_settings_file_that_sets_inbound_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (high, low) = (dir.path().join("a.json"), dir.path().join("b.json"));
        std::fs::write(&low, r#"{"crossSessionInbound":"refuse"}"#).unwrap();
        assert_eq!(
            inbound_setting(&[high.clone(), low.clone()]).0,
            Inbound::Refuse
        );
        std::fs::write(&high, r#"{"crossSessionInbound":"hold"}"#).unwrap();
        assert_eq!(
            inbound_setting(&[high.clone(), low.clone()]),
            (Inbound::Hold, Some(high.clone()))
        );
        std::fs::write(&high, "not json").unwrap();
        assert_eq!(inbound_setting(&[high]).0, Inbound::Accept);
    }

    #[test]
    fn finds_a_rewake_hook() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.json");
        std::fs::write(&f, r#"{"hooks":{"Stop":[{"hooks":[{"type":"command","command":"mailslot hook wake","asyncRewake":true}]}]}}"#).unwrap();
        assert!(has_rewake_hook(std::slice::from_ref(&f), "hook wake"));
        std::fs::write(
            &f,
            r#"{"hooks":{"Stop":[{"hooks":[{"type":"command","command":"mailslot hook wake"}]}]}}"#,
        )
        .unwrap();
        assert!(!has_rewake_hook(&[f], "hook wake"));
    }
}
