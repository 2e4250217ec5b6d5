//! What a consent change said, kept for the page the browser is sent to next: the POST answers
//! `303 See Other` to the contacts page with `?flash=KEY` (Post/Redirect/Get), so a reload
//! reads the page again and never posts the change twice. The key is random and names an
//! entry held here, in memory, once and briefly: it carries no secret itself, and the
//! passphrase is never part of a flash (the code typed for a failed approval is, to be
//! offered again).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::pages::Notice;
use crate::protocol::Address;

/// How long a flash waits for its page.
const FLASH_TTL: Duration = Duration::from_secs(60);
/// Flashes kept at most; the oldest go first.
const MAX_FLASHES: usize = 32;

/// The outcome of a change, for the next page.
pub struct Flash {
    /// What happened.
    pub notice: Notice,
    /// The code typed for a request whose approval failed.
    pub kept_code: Option<(Address, String)>,
}

/// The flashes waiting for their pages.
#[derive(Default)]
pub struct Flashes(Mutex<HashMap<String, (Instant, Flash)>>);

impl Flashes {
    /// Keeps `flash` for the next page; the key that names it.
    pub fn put(&self, flash: Flash) -> String {
        let key = super::auth::random_token();
        let mut all = self.0.lock().expect("not poisoned");
        all.retain(|_, (at, _)| at.elapsed() < FLASH_TTL);
        if all.len() >= MAX_FLASHES
            && let Some(oldest) = all
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
        {
            all.remove(&oldest);
        }
        all.insert(key.clone(), (Instant::now(), flash));
        key
    }

    /// The flash named `key`, once, if it is still fresh.
    pub fn take(&self, key: &str) -> Option<Flash> {
        let (at, flash) = self.0.lock().expect("not poisoned").remove(key)?;
        (at.elapsed() < FLASH_TTL).then_some(flash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flash_is_shown_once() {
        let flashes = Flashes::default();
        let key = flashes.put(Flash {
            notice: Notice::Done("approved".into()),
            kept_code: None,
        });
        assert!(
            matches!(flashes.take(&key), Some(Flash { notice: Notice::Done(d), .. }) if d == "approved")
        );
        assert!(flashes.take(&key).is_none(), "once");
        assert!(flashes.take("made-up").is_none());
    }
}
