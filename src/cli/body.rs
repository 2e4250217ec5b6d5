//! A message's body from `--body`, `--body-file` or stdin, refused when a file or stdin gave
//! nothing (a mistake, like `/dev/null` or a pipe that produced no output) and, when it is too
//! large, measured and answered with the limits that would take it.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::protocol::Limits;

/// Where the body comes from.
pub(super) struct BodySource {
    pub body: Option<String>,
    pub body_file: Option<PathBuf>,
}

/// The body, checked: text, not empty unless given as `--body ""`, within the limit.
pub(super) fn read(src: BodySource) -> anyhow::Result<String> {
    let limits = Limits::default();
    let (bytes, origin) = match (src.body, src.body_file) {
        // Typed on purpose; its size is checked with the rest of the message.
        (Some(b), _) => return Ok(b),
        (None, Some(path)) => {
            let origin = format!("--body-file {}", path.display());
            let len = std::fs::metadata(&path)
                .with_context(|| format!("{origin}: cannot read it"))?
                .len();
            if len > limits.body_bytes as u64 {
                bail!(too_large(&origin, Size::Exactly(len), &limits, Some(&path)));
            }
            let bytes =
                std::fs::read(&path).with_context(|| format!("{origin}: cannot read it"))?;
            (bytes, origin)
        }
        (None, None) => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                bail!("no body given: pass --body TEXT, --body-file FILE, or pipe it on stdin");
            }
            let origin = "the body on stdin".to_owned();
            let mut bytes = Vec::new();
            let mut input = stdin.lock();
            (&mut input)
                .take(limits.body_bytes as u64 + 1)
                .read_to_end(&mut bytes)
                .context("reading the body from stdin")?;
            if bytes.len() > limits.body_bytes {
                bail!(too_large(
                    &origin,
                    measure(bytes.len(), input)?,
                    &limits,
                    None
                ));
            }
            (bytes, origin)
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        bail!(
            "body: {origin} is empty, so nothing was sent; give the text with --body TEXT, --body-file FILE, or on stdin (--body \"\" sends an empty body on purpose)"
        );
    }
    String::from_utf8(bytes).with_context(|| format!("body: {origin} is not UTF-8 text"))
}

/// How large an oversized body is: exactly, or past a bound where counting stopped.
enum Size {
    Exactly(u64),
    MoreThan(u64),
}

/// Stdin is measured up to this many bytes: far past anything a message holds, and an
/// endless pipe is not read forever.
const MEASURED: u64 = 1 << 30;

/// Counts the rest of `input` after `read` bytes, up to [`MEASURED`] in all.
fn measure(read: usize, input: impl Read) -> anyhow::Result<Size> {
    let rest = std::io::copy(
        &mut input.take(MEASURED + 1 - read as u64),
        &mut std::io::sink(),
    )
    .context("reading the body from stdin")?;
    let total = read as u64 + rest;
    Ok(if total > MEASURED {
        Size::MoreThan(MEASURED)
    } else {
        Size::Exactly(total)
    })
}

/// The refusal: the real size, the body limit, and what would take it (`file`, when the body
/// is one, can be attached as it is).
fn too_large(origin: &str, size: Size, limits: &Limits, file: Option<&Path>) -> String {
    let (size, fits_an_attachment) = match size {
        Size::Exactly(n) => (
            format!("{n} bytes ({})", in_units(n)),
            n <= limits.attachment_bytes as u64,
        ),
        Size::MoreThan(n) => (format!("more than {n} bytes ({})", in_units(n)), false),
    };
    let body = format!(
        "body: {origin} is {size}, over the limit of {} bytes ({}) for a body",
        limits.body_bytes,
        in_units(limits.body_bytes as u64)
    );
    let attachment = in_units(limits.attachment_bytes as u64);
    if fits_an_attachment {
        let attach = match file {
            Some(path) => format!(
                "send it as an attachment instead: --attach {}",
                path.display()
            ),
            None => "save it to a file and send that as an attachment: --attach FILE".to_owned(),
        };
        format!("{body}; {attach} (up to {attachment}) with a short --body")
    } else {
        format!(
            "{body} and over the {} a message's attachments may hold together; put it where the recipient can read it (a shared path or URL) and send its location",
            in_units(limits.attachments_bytes as u64)
        )
    }
}

/// A size in KiB or MiB, with one decimal when it is not whole.
fn in_units(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let (value, unit) = if bytes as f64 >= KIB * KIB {
        (bytes as f64 / (KIB * KIB), "MiB")
    } else {
        (bytes as f64 / KIB, "KiB")
    };
    if value.fract() == 0.0 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_units_and_advice_matches_the_limits() {
        let limits = Limits::default();
        assert_eq!(in_units(64 * 1024), "64 KiB");
        assert_eq!(in_units(13 * 1000 * 1000), "12.4 MiB");
        let attachable = too_large("x", Size::Exactly(100_000), &limits, None);
        assert!(
            attachable.contains("100000 bytes") && attachable.contains("--attach"),
            "{attachable}"
        );
        let huge = too_large(
            "x",
            Size::Exactly(13_000_000),
            &limits,
            Some(Path::new("f")),
        );
        assert!(
            huge.contains("13000000 bytes (12.4 MiB)")
                && huge.contains("8 MiB")
                && !huge.contains("--attach"),
            "{huge}"
        );
        let endless = too_large("x", Size::MoreThan(MEASURED), &limits, None);
        assert!(endless.contains("more than 1073741824 bytes"), "{endless}");
    }
}
