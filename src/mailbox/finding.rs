//! What a check of a mailbox found, part by part: one line of `doctor` each. Every kind's
//! check gives them (`kinds::check`), AAMP's from its own parts (`aamp::probe`).

/// How one part of a mailbox check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// What one part of a mailbox check found: one line of `doctor`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// `config`, the system's name (`ASMTP`), or a part of an AAMP mailbox (`JMAP`, `push`).
    pub part: &'static str,
    pub verdict: Verdict,
    pub detail: String,
    /// What to do about it; empty when nothing is to be done.
    pub fix: String,
}

impl Finding {
    pub fn new(
        part: &'static str,
        verdict: Verdict,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            part,
            verdict,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}
