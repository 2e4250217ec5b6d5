//! The docs say what the code does: their configuration examples parse, their links and anchors
//! resolve, every `mailslot` command they quote exists with the flags shown, every doc can be
//! reached from the README or CONTRIBUTING.md, every decision has a status, and the README's
//! test command is the one CI runs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files under `dir` (relative to the crate) whose names end in `.ext`, recursively.
fn files_under(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![root().join(dir)];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn markdown_under(dir: &str) -> Vec<PathBuf> {
    files_under(dir, "md")
}

/// The user's and the contributor's docs: what the README and CONTRIBUTING.md lead to.
fn reference_docs() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md"), root().join("CONTRIBUTING.md")];
    docs.extend(markdown_under("docs"));
    docs
}

/// Every Markdown file whose links must resolve: the reference docs, ARCHITECTURE.md and the
/// client config examples' READMEs.
fn all_docs() -> Vec<PathBuf> {
    let mut docs = reference_docs();
    docs.push(root().join("ARCHITECTURE.md"));
    docs.extend(markdown_under("mcp-config-examples"));
    docs
}

fn name(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The fenced blocks of `text` whose info string is `lang`.
fn fenced(text: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, String)> = None;
    for line in text.lines() {
        if let Some(info) = line.strip_prefix("```") {
            match open.take() {
                Some((wanted, body)) => {
                    if wanted {
                        blocks.push(body);
                    }
                }
                None => open = Some((info.trim() == lang, String::new())),
            }
        } else if let Some((_, body)) = open.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    blocks
}

/// `text` without its fenced blocks (each of their lines left empty, so line numbers hold).
fn prose(text: &str) -> String {
    let mut inside = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            inside = !inside;
        } else if !inside {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The inline code spans of `prose`, which may wrap lines.
fn code_spans(prose: &str) -> Vec<String> {
    let joined = prose.replace('\n', " ");
    joined
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The targets of the Markdown links and images in `prose`, inline code left out.
fn link_targets(prose: &str) -> Vec<String> {
    let without_code: String = prose.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let mut targets = Vec::new();
    let mut rest = without_code.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest
            .find(|c: char| c == ')' || c.is_whitespace())
            .unwrap_or(rest.len());
        targets.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    targets
}

/// The anchor GitHub makes for a heading: lowercase, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of `text` (outside fenced blocks), as written.
fn headings(text: &str) -> Vec<String> {
    prose(text)
        .lines()
        .filter_map(|l| {
            let hashes = l.len() - l.trim_start_matches('#').len();
            (1..=6)
                .contains(&hashes)
                .then(|| l[hashes..].strip_prefix(' '))?
        })
        .map(str::to_owned)
        .collect()
}

/// The anchors of `text`'s headings, repeated ones numbered as GitHub numbers them.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for heading in headings(text) {
        let base = slug(&heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

#[test]
fn every_toml_example_in_the_docs_is_a_valid_config() {
    let dir = tempfile::tempdir().unwrap();
    let (mut agent_configs, mut relay_configs) = (0, 0);
    for doc in reference_docs() {
        for (i, block) in fenced(&read(&doc), "toml").iter().enumerate() {
            let path = dir.path().join(format!("example{i}.toml"));
            std::fs::write(&path, block).unwrap();
            // Each block is an agent config or a relay config; one of them must accept it.
            let agent = mailslot::config::Config::load(&path);
            let relay = mailslot::relay::RelayConfig::load(&path);
            assert!(
                agent.is_ok() || relay.is_ok(),
                "{} example {i} parses as neither:\n{block}\nagent: {agent:?}\nrelay: {relay:?}",
                name(&doc)
            );
            agent_configs += usize::from(agent.is_ok());
            relay_configs += usize::from(relay.is_ok());
        }
    }
    assert!(
        agent_configs >= 2 && relay_configs >= 1,
        "the docs show agent configs ({agent_configs}) and a relay config ({relay_configs})"
    );
}

#[test]
fn every_link_between_the_docs_resolves() {
    let mut broken = Vec::new();
    for doc in all_docs() {
        for target in link_targets(&prose(&read(&doc))) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let path = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", name(&doc)));
            } else if !anchor.is_empty()
                && path.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&path)).contains(anchor)
            {
                broken.push(format!("{}: {target} (no such heading)", name(&doc)));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_doc_is_linked_from_the_readme_or_contributing() {
    let mut linked = HashSet::new();
    for from in ["README.md", "CONTRIBUTING.md"] {
        let from = root().join(from);
        for target in link_targets(&prose(&read(&from))) {
            let file = target.split('#').next().unwrap();
            if let Ok(path) = from.parent().unwrap().join(file).canonicalize() {
                linked.insert(path);
            }
        }
    }
    let orphans: Vec<String> = markdown_under("docs")
        .iter()
        .filter(|doc| !linked.contains(&doc.canonicalize().unwrap()))
        .map(|doc| name(doc))
        .collect();
    assert!(
        orphans.is_empty(),
        "docs no one is led to from the README or CONTRIBUTING.md: {orphans:?}"
    );
}

/// What is wrong with a quoted `mailslot` command line (`words` after the program), if
/// anything: a subcommand that does not exist is read as an argument, so what is checked is
/// that every `--flag` belongs to the command it follows (or is global).
fn command_problem(cli: &clap::Command, words: &[String]) -> Option<String> {
    let mut command = cli;
    let mut positional_seen = false;
    let mut words = words.iter().peekable();
    // `mailslot help bench relay` names a command path: check it as one.
    if words.peek().is_some_and(|w| *w == "help") {
        words.next();
        // A placeholder (`mailslot help COMMAND`) ends the path.
        let placeholder = |w: &str| w.chars().all(|c| c.is_ascii_uppercase() || c == '_');
        for word in words.take_while(|w| !placeholder(w)) {
            match command.find_subcommand(word) {
                Some(sub) => command = sub,
                None => return Some(format!("`{word}`: no such command")),
            }
        }
        return None;
    }
    while let Some(word) = words.next() {
        if let Some(flag) = word.strip_prefix("--") {
            let (flag, inline_value) = match flag.split_once('=') {
                Some((flag, _)) => (flag, true),
                None => (flag, false),
            };
            let Some(arg) = command.get_arguments().find(|a| {
                a.get_long() == Some(flag)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&flag))
            }) else {
                return Some(format!("`mailslot {}` has no --{flag}", command.get_name()));
            };
            if arg.get_action().takes_values() && !inline_value {
                words.next();
            }
        } else if !word.starts_with('-') && !positional_seen {
            match command.find_subcommand(word) {
                Some(sub) => command = sub,
                None if command.get_positionals().next().is_some() => positional_seen = true,
                None => {
                    return Some(format!(
                        "`mailslot {}` has no command or argument `{word}`",
                        command.get_name()
                    ));
                }
            }
        }
    }
    None
}

/// Shell words of `line`, with `"…"` and `'…'` quoting, up to a `#` comment or a pipe.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut in_word = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#' | '|' | ';' | '&') if !in_word => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `mailslot` command lines quoted in `text` (also as `npx -y mailslot` and `uvx
/// mailslot`): in `sh` blocks (continuation lines joined) and in inline code, each as the words
/// after the program.
fn quoted_commands(text: &str) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    for block in fenced(text, "sh") {
        let mut joined = String::new();
        for line in block.lines() {
            match line.trim_end().strip_suffix('\\') {
                Some(start) => joined.push_str(start),
                None => {
                    joined.push_str(line);
                    lines.push(std::mem::take(&mut joined));
                }
            }
        }
    }
    lines.extend(code_spans(&prose(text)));
    lines
        .iter()
        .filter_map(|line| {
            let words = shell_words(line.trim_start_matches("$ "));
            crate::common::mailslot_args(&words).map(<[String]>::to_vec)
        })
        .collect()
}

#[test]
fn every_mailslot_command_quoted_in_the_docs_exists() {
    let mut cli = mailslot::cli::Cli::command();
    cli.build();
    let mut docs = reference_docs();
    docs.extend(markdown_under("mcp-config-examples"));
    // The performance log quotes commands as they were run then.
    docs.retain(|d| !d.ends_with("docs/performance-log.md"));
    let mut checked = 0;
    let mut wrong = Vec::new();
    for doc in docs {
        for words in quoted_commands(&read(&doc)) {
            checked += 1;
            if let Some(problem) = command_problem(&cli, &words) {
                wrong.push(format!(
                    "{}: `mailslot {}`: {problem}",
                    name(&doc),
                    words.join(" ")
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} commands found: is the parser right?"
    );
    assert!(
        wrong.is_empty(),
        "commands the CLI does not have:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_command_check_catches_what_it_should() {
    let mut cli = mailslot::cli::Cli::command();
    cli.build();
    let check = |line: &str| command_problem(&cli, &shell_words(line)[1..]);
    assert_eq!(check("mailslot --agent bob inbox --all --json"), None);
    assert_eq!(
        check("mailslot relay migrate --from a.db --to 'postgres://x'"),
        None
    );
    assert_eq!(check("mailslot help bench relay"), None);
    assert!(check("mailslot inbox --everything").is_some());
    assert!(check("mailslot relay explode --db x").is_some());
    assert!(check("mailslot help bench nothing").is_some());
}

#[test]
fn the_readme_gives_the_test_command_ci_runs() {
    let ci = read(&root().join(".ci/run"));
    let command = ci
        .lines()
        .skip_while(|l| !l.starts_with("step \"tests"))
        .find(|l| l.starts_with("cargo test"))
        .expect(".ci/run has a tests step running cargo test");
    for doc in ["README.md", "CONTRIBUTING.md"] {
        let text = read(&root().join(doc));
        assert!(
            fenced(&text, "sh")
                .iter()
                .any(|b| b.lines().any(|l| l.trim() == command)),
            "{doc} gives `{command}`, the command .ci/run runs, in a sh block"
        );
    }
}

#[test]
fn the_readme_stays_a_newcomers_page() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(
        lines <= 350,
        "README.md has {lines} lines: reference goes in a doc of its own under docs/"
    );
}

#[test]
fn every_decision_has_a_status() {
    let text = prose(&read(&root().join("docs/decisions.md")));
    let mut entries = 0;
    let mut missing = Vec::new();
    for entry in text.split("\n### ").skip(1) {
        entries += 1;
        let body = entry.split("\n#").next().unwrap();
        let status = body.lines().find_map(|l| l.strip_prefix("Status: "));
        let known = status.is_some_and(|s| {
            ["accepted", "superseded by", "left as is"]
                .iter()
                .any(|k| s.starts_with(k))
        });
        if !known {
            missing.push(entry.lines().next().unwrap().to_owned());
        }
    }
    assert!(entries > 100, "only {entries} decisions found");
    assert!(
        missing.is_empty(),
        "decisions without a `Status: accepted | superseded by … | left as is` line:\n{}",
        missing.join("\n")
    );
}

/// The names quoted right after `marker` in `text` (`marker, "Name"`, quotes escaped or not),
/// and right before it (`"Name" in marker`), when the name ends on the same line.
fn named_after(text: &str, marker: &str) -> Vec<String> {
    let unescaped = text.replace("\\\"", "\"");
    let mut names = Vec::new();
    for line in unescaped.lines() {
        for (at, _) in line.match_indices(marker) {
            if let Some(rest) = line[at + marker.len()..].strip_prefix(", \"")
                && let Some((name, _)) = rest.split_once('"')
            {
                names.push(name.to_owned());
            }
            if let Some(before) = line[..at].strip_suffix("\" in ")
                && let Some((_, name)) = before.rsplit_once('"')
            {
                names.push(name.to_owned());
            }
        }
    }
    names.retain(|n| !n.contains('{'));
    names
}

#[test]
fn sections_the_code_names_exist() {
    let mut sources = vec![root().join("ARCHITECTURE.md")];
    sources.extend(markdown_under("docs"));
    sources.extend(files_under("src", "rs"));
    sources.extend(files_under("tests", "rs"));
    let decisions = headings(&read(&root().join("docs/decisions.md")));
    let readme = headings(&read(&root().join("README.md")));
    let mut missing = Vec::new();
    for source in sources {
        let text = read(&source);
        for (marker, heads) in [("docs/decisions.md", &decisions), ("README", &readme)] {
            for wanted in named_after(&text, marker) {
                let lower = wanted.to_lowercase();
                if !heads.iter().any(|h| h.to_lowercase().starts_with(&lower)) {
                    missing.push(format!("{}: {marker}, \"{wanted}\"", name(&source)));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "sections named in the code that the docs no longer have:\n{}",
        missing.join("\n")
    );
}
