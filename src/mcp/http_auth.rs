//! Who may use `mailslot mcp --http`: whoever sends the agent's bearer token
//! (`Authorization: Bearer …`, RFC 6750), which only its owner's MCP client has. The token is
//! made on first use and kept in the agent's folder (`mcp-http.token`, mode 0600); `mailslot
//! mcp --print-token` prints it for the client's config. Anything else gets `401` with
//! `WWW-Authenticate: Bearer`, the shape the MCP authorization spec gives a protected server
//! (mailslot runs no OAuth authorization server). Compared in constant time, never logged.

use std::path::{Path, PathBuf};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::crypto::KeyFileError;

/// The token file's name in the agent's folder.
pub const TOKEN_FILE: &str = "mcp-http.token";
/// Bytes of randomness in a token.
const TOKEN_BYTES: usize = 32;

/// An agent's bearer token for MCP over HTTP. `Debug` never shows it.
pub struct BearerToken(Zeroizing<String>);

impl BearerToken {
    /// The token of the agent whose folder is `agent_dir`, made (and kept) now if it has none.
    pub fn load_or_create(agent_dir: &Path) -> Result<Self, KeyFileError> {
        let path = Self::path(agent_dir);
        let bytes = crate::keys::read_or_create_secret(&path, || {
            let mut random = Zeroizing::new([0u8; TOKEN_BYTES]);
            getrandom::fill(random.as_mut()).expect("the OS random source works");
            Zeroizing::new(
                base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(random.as_ref())
                    .into_bytes(),
            )
        })?;
        let text = std::str::from_utf8(&bytes)
            .ok()
            .map(str::trim)
            .filter(|t| t.len() >= 32 && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| KeyFileError::Malformed {
                path: path.clone(),
                problem: "not a token (at least 32 visible ASCII characters); delete it and a new one is made".into(),
            })?;
        Ok(Self(Zeroizing::new(text.to_owned())))
    }

    /// Where the token of the agent whose folder is `agent_dir` is kept.
    pub fn path(agent_dir: &Path) -> PathBuf {
        agent_dir.join(TOKEN_FILE)
    }

    /// The token, for the owner's client config (printed by `--print-token`, nowhere else).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the request's `Authorization` header carries this token.
    fn admits(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match given {
            None => Err(Refusal::Missing),
            Some(token) if bool::from(token.as_bytes().ct_eq(self.0.as_bytes())) => Ok(()),
            Some(_) => Err(Refusal::Wrong),
        }
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(…)")
    }
}

/// Why a request was refused.
enum Refusal {
    Missing,
    Wrong,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (challenge, why) = match self {
            Refusal::Missing => (
                r#"Bearer realm="mailslot""#,
                "this MCP server needs the agent's token: send `Authorization: Bearer <token>`",
            ),
            Refusal::Wrong => (
                r#"Bearer realm="mailslot", error="invalid_token""#,
                "the bearer token is not this agent's",
            ),
        };
        (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, challenge),
                (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            ],
            format!(
                "{why}; `mailslot --agent <agent> mcp --print-token` prints it for the client's config (it is in the agent's folder, {TOKEN_FILE})\n"
            ),
        )
            .into_response()
    }
}

/// Refuses every request without the token, before anything else looks at it.
pub async fn check(
    State(token): State<std::sync::Arc<BearerToken>>,
    request: Request,
    next: Next,
) -> Response {
    match token.admits(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn made_once_with_mode_0600_then_read() {
        let dir = tempfile::tempdir().unwrap();
        let made = BearerToken::load_or_create(dir.path()).unwrap();
        let path = BearerToken::path(dir.path());
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(made.expose().len() >= 43, "256 bits in base64");
        let again = BearerToken::load_or_create(dir.path()).unwrap();
        assert_eq!(made.expose(), again.expose());
        assert_eq!(format!("{made:?}"), "BearerToken(…)");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(BearerToken::load_or_create(dir.path()).is_err());
    }

    #[test]
    fn only_the_whole_token_as_bearer_is_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let token = BearerToken::load_or_create(dir.path()).unwrap();
        let t = token.expose().to_owned();
        assert!(token.admits(&with(&format!("Bearer {t}"))).is_ok());
        assert!(token.admits(&with(&format!("bearer {t}"))).is_ok());
        assert!(matches!(
            token.admits(&HeaderMap::new()),
            Err(Refusal::Missing)
        ));
        assert!(matches!(
            token.admits(&with(&format!("Basic {t}"))),
            Err(Refusal::Missing)
        ));
        for wrong in [&t[..t.len() - 1], "", "x"] {
            assert!(
                matches!(
                    token.admits(&with(&format!("Bearer {wrong}"))),
                    Err(Refusal::Wrong)
                ),
                "{wrong}"
            );
        }
    }
}
