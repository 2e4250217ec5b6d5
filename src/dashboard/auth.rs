//! Who may use the dashboard: whoever holds this launch's secret. The secret works once: it
//! is exchanged for another random value in an HttpOnly, SameSite=Strict cookie. It arrives
//! by one of two ways: the launch page (`launch.rs`, a file only the owner can read) posts it
//! to `/login`, which is how the browser gets it, so it never reaches a command line; or the
//! URL printed to the owner's terminal (`/?token=…`) carries it, for a person to paste, and the
//! browser is sent on to a clean URL. Every request must carry the cookie; every POST must also
//! carry the page's CSRF token and an `Origin` naming the dashboard itself (`/login` excepted:
//! it is posted from a `file://` page, and only the secret opens it). The `Host` must be
//! `localhost` or an IP address with the dashboard's port, so a name that an attacker points
//! at 127.0.0.1 (DNS rebinding) gets nowhere. Secrets are compared in constant time and never
//! logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

/// Bytes of randomness in the secret and the CSRF token.
const SECRET_BYTES: usize = 32;
/// The longest `Host` or `Origin` header looked at.
const MAX_HOST_LEN: usize = 300;
/// Where the launch page posts the secret.
pub const LOGIN_PATH: &str = "/login";
/// The largest `/login` body read.
const MAX_LOGIN_BYTES: usize = 1024;

/// This launch's secrets.
pub struct Auth {
    /// The URL's token: exchanged for the session once.
    secret: String,
    /// Whether the URL's token was exchanged already.
    exchanged: std::sync::atomic::AtomicBool,
    /// Fires when it is.
    used: CancellationToken,
    /// The cookie's value.
    session: String,
    csrf: String,
    port: u16,
}

impl Auth {
    /// Fresh random secrets for a dashboard listening on `port`.
    pub fn new(port: u16) -> Self {
        Self {
            secret: random_token(),
            exchanged: std::sync::atomic::AtomicBool::new(false),
            used: CancellationToken::new(),
            session: random_token(),
            csrf: random_token(),
            port,
        }
    }

    /// The secret, for the URL printed to the owner's terminal.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Fires once the secret was exchanged for the cookie (the launch page is then useless).
    pub fn used(&self) -> CancellationToken {
        self.used.clone()
    }

    /// The token every form carries.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether `given` is this launch's CSRF token.
    pub fn csrf_matches(&self, given: &str) -> bool {
        same(given, &self.csrf)
    }

    /// The cookie's name: one per port, so two dashboards on one machine do not overwrite
    /// each other's (cookies ignore ports).
    fn cookie_name(&self) -> String {
        format!("mailslot_dashboard_{}", self.port)
    }

    /// Whether the `Host` header names this dashboard by `localhost` or an IP address.
    fn host_allowed(&self, host: &str) -> bool {
        let Some((name, port)) = host.rsplit_once(':') else {
            return false;
        };
        if port != self.port.to_string() {
            return false;
        }
        let name = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
    }

    fn cookie_secret<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let name = self.cookie_name();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }
}

pub(super) fn random_token() -> String {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn same(given: &str, expected: &str) -> bool {
    bool::from(given.as_bytes().ct_eq(expected.as_bytes()))
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{why}\n"),
    )
        .into_response()
}

/// The value of `token` in a query string or a form body, if any.
fn query_token(query: &str) -> Option<&str> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| v)
}

/// Why a secret opened nothing.
enum SecretRefused {
    /// Not this launch's.
    Wrong,
    /// This launch's, used already.
    Used,
}

impl IntoResponse for SecretRefused {
    fn into_response(self) -> Response {
        match self {
            SecretRefused::Wrong => refuse(
                StatusCode::FORBIDDEN,
                "wrong or expired token: open the URL that `mailslot dashboard` printed in the terminal (a new one on every launch)",
            ),
            SecretRefused::Used => refuse(
                StatusCode::FORBIDDEN,
                "this link was used already, and it works once: go to / in the browser that opened it, or restart `mailslot dashboard` for a new link",
            ),
        }
    }
}

/// Exchanges the secret `given` for the session cookie: the `Set-Cookie` value, or the
/// refusal.
fn exchange(auth: &Auth, given: &str) -> Result<HeaderValue, SecretRefused> {
    if !same(given, &auth.secret) {
        return Err(SecretRefused::Wrong);
    }
    if auth
        .exchanged
        .swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        return Err(SecretRefused::Used);
    }
    auth.used.cancel();
    let cookie = format!(
        "{}={}; HttpOnly; SameSite=Strict; Path=/",
        auth.cookie_name(),
        auth.session
    );
    Ok(cookie.parse().expect("the cookie is ASCII"))
}

/// `POST /login` from the launch page: the secret in a form. The answer sets the cookie and
/// moves on to `/` from a page of the dashboard's own (a redirect would not do: after a
/// cross-site POST, and a `file://` page is one, the browser would leave the new SameSite=Strict
/// cookie off the redirected request).
async fn login(auth: &Auth, request: Request) -> Response {
    let Ok(body) = axum::body::to_bytes(request.into_body(), MAX_LOGIN_BYTES).await else {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the login form is larger than it can be",
        );
    };
    let Some(given) = std::str::from_utf8(&body).ok().and_then(query_token) else {
        return SecretRefused::Wrong.into_response();
    };
    match exchange(auth, given) {
        Ok(cookie) => {
            let mut response = super::pages::entered().into_response();
            response.headers_mut().insert(header::SET_COOKIE, cookie);
            response
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// Checks every request: Host, then the secret (taking it from `?token=` or `/login` once), and
/// for a POST the Origin. The CSRF token in a form is checked by the handler that reads the
/// form.
pub async fn check(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let auth = &*auth;
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.len() <= MAX_HOST_LEN);
    let Some(host) = host.filter(|h| auth.host_allowed(h)) else {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this dashboard answers only to localhost or an IP address with its port in the Host header; open the URL printed in the terminal",
        );
    };
    if request.method() == Method::POST && request.uri().path() == LOGIN_PATH {
        return login(auth, request).await;
    }
    if let Some(token) = request.uri().query().and_then(query_token) {
        if request.method() != Method::GET {
            return SecretRefused::Wrong.into_response();
        }
        return match exchange(auth, token) {
            // A clean URL afterwards (always `/`: never a redirect elsewhere): the secret
            // leaves the address bar and the history.
            Ok(cookie) => {
                let mut response = Redirect::to("/").into_response();
                response.headers_mut().insert(header::SET_COOKIE, cookie);
                response
            }
            Err(refusal) => refusal.into_response(),
        };
    }
    if !auth
        .cookie_secret(headers)
        .is_some_and(|s| same(s, &auth.session))
    {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "no dashboard secret: open the URL that `mailslot dashboard` printed in the terminal (it carries the secret)",
        );
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
        let expected = format!("http://{host}");
        if origin != Some(expected.as_str()) {
            return refuse(
                StatusCode::FORBIDDEN,
                "a change must come from the dashboard's own page (the Origin header is missing or names another site)",
            );
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_localhost_or_an_ip_with_the_port() {
        let auth = Auth::new(8080);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
            "10.0.0.5:8080",
        ] {
            assert!(auth.host_allowed(ok), "{ok}");
        }
        for bad in [
            "127.0.0.1",
            "127.0.0.1:8081",
            "evil.example:8080",
            "localhost.evil.example:8080",
            "127.0.0.1.nip.io:8080",
            "",
        ] {
            assert!(!auth.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn secrets_are_fresh_and_compared_whole() {
        let (a, b) = (Auth::new(1), Auth::new(1));
        assert_ne!(a.secret(), b.secret());
        assert_ne!(a.secret(), a.csrf());
        assert!(a.secret().len() >= 43, "256 bits in base64");
        assert!(a.csrf_matches(&a.csrf.clone()));
        assert!(!a.csrf_matches(&a.csrf[..10]));
        assert!(!a.csrf_matches(""));
    }

    #[test]
    fn the_token_is_found_in_a_query() {
        assert_eq!(query_token("a=1&token=xyz"), Some("xyz"));
        assert_eq!(query_token("tokens=xyz"), None);
    }

    #[test]
    fn the_cookie_is_read_by_its_name() {
        let auth = Auth::new(9);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "other=1; mailslot_dashboard_9=abc; mailslot_dashboard_10=def"
                .parse()
                .unwrap(),
        );
        assert_eq!(auth.cookie_secret(&headers), Some("abc"));
    }
}
