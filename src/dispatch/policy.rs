//! Who may hand an agent work. Pure code.

/// Allowed senders: exact addresses, `*@domain` or `@domain` (exact domain, not subdomains),
/// compared case-insensitively. An empty policy allows nobody.
#[derive(Clone, Debug, Default)]
pub struct SenderPolicy {
    patterns: Vec<String>,
}

impl SenderPolicy {
    pub fn new(patterns: &[String]) -> SenderPolicy {
        SenderPolicy {
            patterns: patterns
                .iter()
                .map(|p| p.trim().to_ascii_lowercase())
                .collect(),
        }
    }

    pub fn allows(&self, sender: &str) -> bool {
        let sender = sender.trim().to_ascii_lowercase();
        let Some((_, domain)) = sender.rsplit_once('@') else {
            return false;
        };
        self.patterns.iter().any(|p| {
            if let Some(d) = p.strip_prefix("*@").or_else(|| p.strip_prefix('@')) {
                d == domain
            } else {
                *p == sender
            }
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let p = SenderPolicy::new(&[
            "Boss@Corp.test".into(),
            "*@team.test".into(),
            "@ops.test".into(),
        ]);
        assert!(p.allows("boss@corp.test"));
        assert!(p.allows("BOSS@CORP.TEST"));
        assert!(!p.allows("other@corp.test"));
        assert!(p.allows("anyone@team.test"));
        assert!(!p.allows("anyone@evil-team.test"));
        assert!(!p.allows("anyone@sub.team.test"));
        assert!(p.allows("x@ops.test"));
        assert!(!p.allows("no-at-sign"));
        assert!(!SenderPolicy::new(&[]).allows("boss@corp.test"));
    }
}
