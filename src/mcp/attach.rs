//! Attachments through the MCP surface: the `attachments` argument of send and reply (a file
//! by path, or small inline content), the folders a path may be in (the client's roots when
//! it declares them, else the working directory of `mailslot mcp`), and `save_attachment`.

use std::path::PathBuf;
use std::time::Duration;

use rmcp::RoleServer;
use rmcp::service::RequestContext;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::mailbox::{AttachmentSource, FileError, Folders, MAX_INLINE_BYTES, load_attachment};
use crate::protocol::{Attachment, Limits};

/// How long the client has to list its roots.
const ROOTS_WAIT: Duration = Duration::from_secs(10);

/// One attachment: a file by `path`, or `name` with inline `text` or `base64` (at most
/// 64 KiB; larger content goes in a file).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachmentArg {
    /// A file to attach: absolute, or relative to the first of your client's roots (else
    /// the working directory). Only files inside the roots (or the working directory) can be
    /// attached; at most 8 MiB per file and per message.
    #[serde(default)]
    pub path: Option<String>,
    /// The file name the recipients see, for inline content.
    #[serde(default)]
    pub name: Option<String>,
    /// Inline UTF-8 text content (with name).
    #[serde(default)]
    pub text: Option<String>,
    /// Inline binary content in standard base64 (with name).
    #[serde(default)]
    pub base64: Option<String>,
}

/// Arguments of `save_attachment`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SaveAttachmentArgs {
    /// The message carrying it.
    pub message_id: String,
    /// Which attachment, from 0 (index in the read result).
    pub index: u32,
    /// Where to write it: absolute, or relative to the first of your client's roots (else the
    /// working directory); inside them only.
    pub path: String,
    /// Replace an existing file (default false: an existing file is refused).
    #[serde(default)]
    pub overwrite: Option<bool>,
}

/// What `save_attachment` wrote.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SavedAttachment {
    /// The file written (absolute).
    pub path: String,
    /// Bytes written.
    pub size: u32,
    /// Lowercase hex SHA-256 of what was written.
    pub sha256: String,
}

/// The folders this call may read and write: the client's roots (file:// only) when it
/// declares the roots capability, else the working directory. Roots are deprecated by
/// SEP-2577 but are what today's clients (Claude Code, the Inspector) declare.
#[allow(deprecated)]
pub async fn folders(ctx: &RequestContext<RoleServer>) -> Result<Folders, String> {
    let declared = ctx.client_capabilities().is_some_and(|c| c.roots.is_some());
    let roots = if declared {
        let listed = tokio::time::timeout(ROOTS_WAIT, ctx.peer.list_roots())
            .await
            .map_err(|_| {
                format!(
                    "your client did not list its roots within {} s; try again",
                    ROOTS_WAIT.as_secs()
                )
            })?
            .map_err(|e| format!("your client could not list its roots ({e}); try again"))?;
        let paths = crate::mailbox::paths_of_file_uris(listed.roots.iter().map(|r| r.uri.as_str()));
        if paths.is_empty() {
            return Err("your client declares no file:// roots, so no file can be attached or saved; add a root folder in the client, or attach small content inline".into());
        }
        paths
    } else {
        Vec::new()
    };
    Folders::within(roots, "the client's roots")
        .map_err(|e| format!("cannot read the working directory ({e})"))
}

/// The attachments of a send or reply, read from their files or decoded.
pub async fn load(args: Vec<AttachmentArg>, folders: Folders) -> Result<Vec<Attachment>, String> {
    let limits = Limits::default();
    if args.len() > limits.attachments {
        return Err(format!(
            "attachments has {} items, over the limit of {}; send the rest in another message",
            args.len(),
            limits.attachments
        ));
    }
    let sources = args
        .into_iter()
        .enumerate()
        .map(|(i, a)| source(i, a))
        .collect::<Result<Vec<_>, _>>()?;
    tokio::task::spawn_blocking(move || {
        sources
            .into_iter()
            .enumerate()
            .map(|(i, s)| load_attachment(&format!("attachments[{i}]"), s, &folders, &limits))
            .collect::<Result<Vec<_>, FileError>>()
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("reading the attachments failed ({e}); try again"))?
}

fn source(i: usize, a: AttachmentArg) -> Result<AttachmentSource, String> {
    let field = format!("attachments[{i}]");
    match (a.path, a.name, a.text, a.base64) {
        (Some(path), None, None, None) => Ok(AttachmentSource::Path(PathBuf::from(path))),
        (None, Some(name), Some(text), None) => Ok(AttachmentSource::Text { name, text }),
        (None, Some(name), None, Some(base64)) => Ok(AttachmentSource::Base64 { name, base64 }),
        _ => Err(format!(
            "{field} needs either path (a file), or name with text or base64 (inline content up to {MAX_INLINE_BYTES} bytes)"
        )),
    }
}
