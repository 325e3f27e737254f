//! Questions an agent asks its dispatcher (`task.help_needed`), and matching their answers.

/// A question mailed to a dispatcher, waiting for the answer.
pub(super) struct PendingQuestion {
    /// The Message-ID of the help_needed mail, which a reply may name in In-Reply-To.
    pub help_message_id: String,
    /// The question as the agent put it (the live view shows it).
    pub text: String,
    pub options: Vec<String>,
    pub answer: tokio::sync::oneshot::Sender<crate::runner::Answer>,
    /// The journal row of the task that asked.
    pub task_row: i64,
}

/// The answer's own words: its lines up to the first quoted one (`>`), trimmed; `None` when
/// empty.
pub fn own_words(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim_start().starts_with('>'))
        .collect();
    let words = words.join("\n").trim().to_string();
    (!words.is_empty()).then_some(words)
}

/// Which option an answer names: a number (`2`), an option's name, or text containing one
/// (the longest match wins). The first line that is not empty or quoted (`>`) is the answer.
pub fn choose(options: &[String], text: &str) -> Option<usize> {
    let answer = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('>'))?;
    let answer = answer.trim_end_matches(['.', '!']);
    if let Ok(n) = answer.parse::<usize>() {
        return (1..=options.len()).contains(&n).then(|| n - 1);
    }
    if let Some(i) = options
        .iter()
        .position(|o| o.trim().eq_ignore_ascii_case(answer))
    {
        return Some(i);
    }
    let lower = answer.to_lowercase();
    options
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.trim().is_empty() && lower.contains(&o.trim().to_lowercase()))
        .max_by_key(|(_, o)| o.len())
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_name_an_option() {
        let options: Vec<String> = ["Allow", "Always allow", "Reject"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(choose(&options, "2"), Some(1));
        assert_eq!(choose(&options, "  reject.\n\n> quoted question"), Some(2));
        assert_eq!(choose(&options, "> Which option?\nAlways allow"), Some(1));
        assert_eq!(choose(&options, "I allow it, go ahead"), Some(0));
        assert_eq!(choose(&options, "4"), None);
        assert_eq!(choose(&options, "maybe later"), None);
        assert_eq!(choose(&options, ""), None);
    }
}
