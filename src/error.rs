//! How an error should be handled, decided once where it is made, so that retry logic never
//! has to match on message strings.

/// The four ways a failure can be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Worth retrying with backoff: network trouble, 5xx, 429, SMTP 4xx.
    Transient,
    /// Credentials were refused: retrying soon will not help; a person must act.
    Auth,
    /// The request itself is wrong or refused for good: do not retry.
    Permanent,
    /// The work was stopped on purpose.
    Cancelled,
}

/// Implemented by every error type at a module boundary.
pub trait Classify {
    fn class(&self) -> ErrorClass;

    fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }
}
