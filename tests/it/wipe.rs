//! The owner's passphrase posted to the dashboard leaves no copy in freed memory: this test
//! binary's allocator scans every heap block freed on the test's thread while the consent form
//! is read from a request body, parsed and turned into a `Passphrase`, and counts the blocks
//! that still hold the passphrase (decoded, or as it was posted). A copy that is wiped before
//! it is freed is not counted; one that is freed unwiped is exactly what the issue found.
//! (hyper's own read buffer is outside this: the test hands the body over as axum gets it.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use axum::body::{Body, Bytes};

/// As typed: spaces and characters a form encodes as `%XX`.
const PASSPHRASE: &str = "wipe me & keep nothing = ok? ünïcode";
/// How a browser posts it.
const POSTED: &str = "wipe+me+%26+keep+nothing+%3D+ok%3F+%C3%BCn%C3%AFcode";

struct Scanning;

// Per thread: the harness runs tests on threads of their own, and only the test's own frees
// count.
thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static UNWIPED: Cell<usize> = const { Cell::new(0) };
}

fn holds(block: &[u8], needle: &[u8]) -> bool {
    block.windows(needle.len()).any(|w| w == needle)
}

// SAFETY: every call is passed on to `System` unchanged; `dealloc` only reads the block it is
// about to free, and allocates nothing.
unsafe impl GlobalAlloc for Scanning {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ARMED.try_with(Cell::get).unwrap_or(false) {
            let block = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            // The decoded passphrase, and its longest stretch that posting leaves as it is.
            if holds(block, PASSPHRASE.as_bytes()) || holds(block, b"keep+nothing") {
                let _ = UNWIPED.try_with(|n| n.set(n.get() + 1));
            }
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Scanning = Scanning;

/// Runs `f` with freed blocks scanned; how many held the passphrase.
fn scanned(f: impl FnOnce()) -> usize {
    UNWIPED.with(|n| n.set(0));
    ARMED.with(|a| a.set(true));
    f();
    ARMED.with(|a| a.set(false));
    UNWIPED.with(Cell::get)
}

/// The form as the page posts it, in `parts` pieces (hyper hands over a body in frames).
fn body(parts: usize) -> Body {
    let form = format!("csrf=abc&action=approve+alice&code.alice=ABCD-EFGH&passphrase={POSTED}");
    let size = form.len().div_ceil(parts);
    let frames: Vec<Result<Bytes, std::io::Error>> = form
        .as_bytes()
        .chunks(size)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    Body::from_stream(futures_util::stream::iter(frames))
}

#[test]
fn the_scan_sees_an_unwiped_copy() {
    assert_eq!(scanned(|| drop(PASSPHRASE.to_owned())), 1);
    assert_eq!(
        scanned(|| drop(zeroize::Zeroizing::new(PASSPHRASE.to_owned()))),
        0
    );
}

#[test]
fn the_consent_form_leaves_no_copy_of_the_passphrase() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for parts in [1, 3] {
        let body = body(parts);
        let found = scanned(|| {
            runtime.block_on(async {
                let form = mailslot::dashboard::read_form(body).await.unwrap();
                let passphrase = form.passphrase.into_passphrase().unwrap();
                assert!(format!("{passphrase:?}").contains('…'));
                drop(passphrase);
            });
        });
        assert_eq!(
            found, 0,
            "{found} freed block(s) still held the passphrase (body in {parts} frame(s))"
        );
    }
}
