//! `mailslot dashboard` on alice's home, logged in with its secret: the inbox, sent, message,
//! thread and attachment pages.

use std::path::Path;

use mailslot::client::RelayUrl;

use super::kinds::{Cells, Kind, Side, attachment_read, want};
use crate::common::EVENT_TIMEOUT;

/// `mailslot dashboard` on alice's home, logged in; killed when dropped.
struct Dashboard {
    _child: tokio::process::Child,
    addr: std::net::SocketAddr,
    cookie: String,
}

impl Dashboard {
    async fn start(home: &Path, relay: &RelayUrl) -> Result<Self, String> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mailslot"))
            .args(["dashboard", "--listen", "127.0.0.1:0", "--no-open"])
            .env_clear()
            .env("MAILSLOT_HOME", home)
            .env("MAILSLOT_RELAY", relay.as_str())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Its URL, with this launch's secret, is its first line.
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(EVENT_TIMEOUT, lines.next_line())
            .await
            .map_err(|_| "the dashboard printed no URL".to_owned())?
            .map_err(|e| e.to_string())?
            .ok_or("the dashboard exited before printing its URL")?;
        let (origin, token) = url
            .trim()
            .split_once("/?token=")
            .ok_or(format!("not a dashboard URL: {url}"))?;
        let addr = origin
            .trim_start_matches("http://")
            .parse()
            .map_err(|e| format!("{origin}: {e}"))?;
        let mut dashboard = Self {
            _child: child,
            addr,
            cookie: String::new(),
        };
        let entry = dashboard.get(&format!("/?token={token}")).await;
        dashboard.cookie = entry
            .1
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .starts_with("set-cookie:")
                    .then(|| l[11..].trim())
            })
            .and_then(|c| c.split(';').next())
            .ok_or(format!("no cookie for the secret: {}", entry.1))?
            .to_owned();
        Ok(dashboard)
    }

    /// `GET path` with the session cookie: status, head, body.
    async fn get(&self, path: &str) -> (u16, String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let cookie = if self.cookie.is_empty() {
            String::new()
        } else {
            format!("Cookie: {}\r\n", self.cookie)
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{cookie}Connection: close\r\n\r\n",
            self.addr
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(EVENT_TIMEOUT, stream.read_to_end(&mut raw))
            .await
            .expect("the dashboard answers in time")
            .unwrap();
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, head.to_owned(), body.to_owned())
    }

    /// A page that must render: its body.
    async fn page(&self, path: &str) -> Result<String, String> {
        match self.get(path).await {
            (200, _, body) => Ok(body),
            (status, _, body) => Err(format!("GET {path}: {status}: {body}")),
        }
    }
}

/// A page's own content, without its header.
fn main(page: &str) -> &str {
    slice(page, "<main>", "</main>").unwrap_or(page)
}

/// The part of `page` from `start` to the next `end`, when `start` is in it.
fn slice<'a>(page: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = page.find(start)?;
    let rest = &page[from..];
    Some(&rest[..rest.find(end).unwrap_or(rest.len())])
}

/// Every page that shows mail, per kind.
pub(crate) async fn check(home: &Path, relay: &RelayUrl, kinds: &[Kind], cells: &mut Cells) {
    let dashboard = match Dashboard::start(home, relay).await {
        Ok(d) => d,
        Err(why) => {
            for view in ["inbox", "sent", "message", "thread"] {
                cells.view_failed(&format!("dashboard {view}"), kinds, &why);
            }
            return;
        }
    };
    match dashboard.page("/agents/alice").await {
        Ok(page) => {
            for k in kinds {
                let row = slice(&page, &format!("data-id=\"{}\"", k.id), "</li>");
                let outcome = match (k.side, row) {
                    (Side::In, Some(row)) => want(
                        row.contains(&k.subject)
                            && row.contains(&format!("from {}", k.peer))
                            && !row.contains("KEY CHANGED"),
                        || format!("row: {row}"),
                    ),
                    (Side::Owner, Some(row)) => want(
                        row.contains(&k.subject) && row.contains("from you, the owner"),
                        || format!("row: {row}"),
                    ),
                    (Side::In | Side::Owner, None) => Err(format!("not listed: {}", main(&page))),
                    (_, Some(row)) => Err(format!("listed among received mail: {row}")),
                    (_, None) => Ok(()),
                };
                cells.record("dashboard inbox", &k.name, outcome);
            }
        }
        Err(why) => cells.view_failed("dashboard inbox", kinds, &why),
    }
    match dashboard.page("/agents/alice/sent").await {
        Ok(page) => {
            for k in kinds {
                let row = slice(&page, &format!("/agents/alice/messages/{}", k.id), "</tr>");
                let state = match k.state() {
                    "bounced" => format!("expired before {} took it", k.peer),
                    state => format!("{}: {state}", k.peer),
                };
                let outcome = match (k.side, row) {
                    (Side::Out, Some(row)) => want(
                        row.contains(&k.subject)
                            && row.contains(&format!("<td>{}</td>", k.peer))
                            && row.contains(&state)
                            && k.answer.is_none_or(|a| row.contains(a)),
                        || format!("no {state:?}: {row}"),
                    ),
                    (Side::Out, None) => Err(format!("not listed: {}", main(&page))),
                    (_, Some(row)) => Err(format!("listed among sent mail: {row}")),
                    (_, None) => Ok(()),
                };
                cells.record("dashboard sent", &k.name, outcome);
            }
        }
        Err(why) => cells.view_failed("dashboard sent", kinds, &why),
    }
    for k in kinds {
        let path = format!("/agents/alice/messages/{}", k.id);
        let thread = format!("/agents/alice/threads/{}", k.thread);
        let attachment = dashboard.page(&format!("{path}/attachments/0")).await;
        cells.record(
            "dashboard attachment",
            &k.name,
            attachment_read(attachment.map(String::into_bytes), k),
        );
        if k.side == Side::Refused {
            let (status, _, _) = dashboard.get(&path).await;
            cells.record(
                "dashboard message",
                &k.name,
                want(status == 404, || format!("{status}")),
            );
            let (status, _, _) = dashboard.get(&thread).await;
            cells.record(
                "dashboard thread",
                &k.name,
                want(status == 404, || format!("{status}")),
            );
            continue;
        }
        let facts = match (k.side, k.state()) {
            (Side::Owner, _) => vec![
                "<dt>From</dt><dd>you, the owner ".to_owned(),
                "written by you, the owner: signed with the owner key".to_owned(),
                "<dt>Owner key</dt>".to_owned(),
            ],
            (Side::In, _) => vec![
                format!("<dt>From</dt><dd>{} ", k.peer),
                "signature verified with the pinned key".to_owned(),
            ],
            (_, "bounced") => vec![format!("expired on the relay before {} took it", k.peer)],
            (_, "delivered") => vec![format!("<dt>Delivered</dt><dd>{} by ", k.peer)],
            (_, state) => vec![format!("<dt>Receipts</dt><dd>{} {state} at ", k.peer)],
        };
        let mut facts = facts;
        if k.side == Side::Out {
            facts.push(format!("<dt>To</dt><dd>{}</dd>", k.peer));
        }
        if let Some(answer) = k.answer {
            facts.push(answer.to_owned());
        }
        if let Some(a) = &k.attachment {
            facts.push(format!("{}</a>", a.name));
            facts.push(format!("{} bytes", a.size));
        }
        let message = dashboard.page(&path).await.and_then(|page| {
            let missing: Vec<&String> = facts
                .iter()
                .filter(|f| !page.contains(f.as_str()))
                .collect();
            want(page.contains(&k.subject) && missing.is_empty(), || {
                format!("missing {missing:?}: {}", main(&page))
            })
        });
        cells.record("dashboard message", &k.name, message);
        let thread = dashboard.page(&thread).await.and_then(|page| {
            let article = slice(&page, &format!("data-id=\"{}\"", k.id), "</article>");
            want(
                article.is_some_and(|a| {
                    a.contains(&k.word)
                        && (a.contains(&k.peer)
                            || k.side == Side::Owner && a.contains("you, the owner"))
                }),
                || format!("not in its thread: {}", main(&page)),
            )
        });
        cells.record("dashboard thread", &k.name, thread);
    }
}
