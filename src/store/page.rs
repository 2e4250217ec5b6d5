//! Pages of a long listing (the inbox, sent mail, memories): newest first, each page named by
//! the last item of the one before it (`--before ID`), so a page continues exactly where the
//! last stopped, whatever arrives meanwhile and however many items share a timestamp.

/// One page of a listing, and how many items follow it in the listing's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, in the listing's order.
    pub items: Vec<T>,
    /// How many follow the last one.
    pub more: u64,
}
