//! The command line as clap sees it, with the top-level help grouped by what a person wants
//! to do, and the `completions` and `man` commands that print it for shells and `man`.

use std::io::Write;
use std::path::Path;

use clap::{CommandFactory, FromArgMatches};

use super::Cli;
use super::output::{StdoutClosed, outln};

/// The subcommands by family, in the order the help lists them. A test checks that every
/// subcommand is in exactly one family.
const FAMILIES: &[(&str, &[&str])] = &[
    (
        "The agent",
        &[
            "init",
            "register",
            "whoami",
            "doing",
            "status",
            "doctor",
            "export",
            "import",
            "rotate-keys",
            "retire",
        ],
    ),
    (
        "Mail",
        &[
            "send",
            "reply",
            "tell",
            "inbox",
            "read",
            "thread",
            "mark-read",
            "search",
            "sent",
            "retry",
            "acknowledge",
            "read-receipts",
            "sync",
            "wait",
        ],
    ),
    ("Memory", &["remember", "recall", "forget"]),
    (
        "Who may write (the owner's)",
        &[
            "owner",
            "groups",
            "connect",
            "requests",
            "approve",
            "deny",
            "block",
            "unblock",
            "uncontact",
            "contacts",
            "policy",
            "directory",
            "presence",
            "whois",
            "keys",
            "trust-relay",
        ],
    ),
    (
        "Agents on one repository",
        &["reserve", "release", "renew", "reservations", "guard"],
    ),
    ("LLM clients", &["mcp", "hook"]),
    ("The owner's window", &["dashboard"]),
    (
        "Relays and tools",
        &["relay", "demo", "bench", "completions", "man"],
    ),
];

/// Width the help is wrapped to (as `max_term_width` on [`Cli`]).
const WIDTH: usize = 100;

/// The command line, with the grouped top-level help.
pub fn command() -> clap::Command {
    let cli = Cli::command();
    let groups = grouped(&cli);
    cli.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{groups}\nOptions:\n{{options}}{{after-help}}"
    ))
}

/// Parses the process's arguments; exits with clap's message and code 2 on a usage error.
/// With no command, the grouped help goes to stdout (clap would list every subcommand in one
/// line) and the exit code is still 2: nothing ran.
pub fn parse() -> Cli {
    let matches = command().try_get_matches().unwrap_or_else(|e| {
        if no_command(&e) {
            let _ = command().print_help();
            std::process::exit(2);
        }
        e.exit()
    });
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut command()).exit())
}

/// Whether `e` is `mailslot` given no command at all (a subcommand's missing one, like
/// `mailslot owner`, keeps clap's message naming that subcommand's commands).
fn no_command(e: &clap::Error) -> bool {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    e.kind() == ErrorKind::MissingSubcommand
        && matches!(
            e.get(ContextKind::InvalidSubcommand),
            Some(ContextValue::String(parent)) if parent == "mailslot"
        )
}

/// The families' lines: each subcommand's name and the first sentence of its about.
fn grouped(cli: &clap::Command) -> String {
    let name_width = FAMILIES
        .iter()
        .flat_map(|(_, names)| names.iter())
        .map(|n| n.len())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (family, names) in FAMILIES {
        text.push_str(&format!("{family}:\n"));
        for name in *names {
            let about = cli
                .find_subcommand(name)
                .and_then(|c| c.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            let indent = 2 + name_width + 2;
            let lines = wrap(&about, WIDTH - indent);
            let mut lines = lines.iter();
            text.push_str(&format!(
                "  {name:<name_width$}  {}\n",
                lines.next().map(String::as_str).unwrap_or("")
            ));
            for line in lines {
                text.push_str(&format!("{:indent$}{line}\n", ""));
            }
        }
        text.push('\n');
    }
    text.push_str("Run `mailslot help COMMAND` for a command's options and examples.\n");
    text
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// `mailslot completions SHELL`: the completion script on stdout.
pub(super) fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command(), "mailslot", &mut out);
    write_stdout(&out)
}

/// `mailslot man`: the manual page on stdout, or with `dir` one page per command there.
pub(super) fn man(dir: Option<&Path>) -> anyhow::Result<()> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            clap_mangen::generate_to(command(), dir)?;
            outln!("wrote the manual pages to {}", dir.display())?;
            Ok(())
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(command()).render(&mut out)?;
            write_stdout(&out)
        }
    }
}

/// Writes `bytes` to stdout; a reader that went away ends the command quietly.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_is_in_exactly_one_family() {
        let cli = Cli::command();
        let listed: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        for sub in cli.get_subcommands() {
            let n = listed.iter().filter(|l| **l == sub.get_name()).count();
            assert_eq!(n, 1, "{} is listed {n} times in FAMILIES", sub.get_name());
        }
        for name in &listed {
            assert!(
                cli.find_subcommand(name).is_some(),
                "FAMILIES lists {name}, which is not a subcommand"
            );
        }
    }

    #[test]
    fn wrap_breaks_at_spaces_within_the_width() {
        assert_eq!(wrap("a bb ccc dddd", 6), vec!["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("", 6), Vec::<String>::new());
    }
}
