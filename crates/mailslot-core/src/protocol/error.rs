//! The one error every validated protocol value returns.

use std::fmt;

/// A value broke a rule: names the field, what is wrong, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    /// The field, with its position where it has one: `to[2]`, `attachments[0].name`.
    pub field: String,
    /// What is wrong and what to do about it, as a sentence fragment.
    pub problem: String,
}

impl ValidationError {
    /// Builds an error for `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The error for a value longer than its limit.
    pub fn too_long(field: impl Into<String>, len: usize, limit: usize, unit: &str) -> Self {
        Self::new(
            field,
            format!("is {len} {unit}, over the limit of {limit} {unit}; shorten it"),
        )
    }

    /// Prefixes the field with its parent, for errors from nested values.
    pub fn within(mut self, parent: &str) -> Self {
        self.field = if self.field.is_empty() {
            parent.to_owned()
        } else {
            format!("{parent}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}
