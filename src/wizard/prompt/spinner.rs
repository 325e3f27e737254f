//! The spinner shown while `init` waits (a service's answer, a scan, a mailbox's test).

use crate::output::errln;

use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::time::Duration;

use crate::wizard::Progress;

/// A spinner on stderr while a slow step runs; nothing when stderr is not a terminal.
pub struct Spinner {
    bar: Mutex<Option<indicatif::ProgressBar>>,
    tty: bool,
}

impl Spinner {
    pub fn new() -> Spinner {
        Spinner {
            bar: Mutex::new(None),
            tty: std::io::stderr().is_terminal() && std::io::stdout().is_terminal(),
        }
    }
}

impl Spinner {
    /// Removes the spinner without a line of its own (the caller prints the outcome).
    pub fn clear(&self) {
        if let Some(bar) = self.bar.lock().expect("spinner lock").take() {
            bar.finish_and_clear();
        }
    }
}

impl Default for Spinner {
    fn default() -> Self {
        Spinner::new()
    }
}

impl Progress for Spinner {
    fn step(&self, what: &str) {
        if !self.tty {
            return;
        }
        self.clear();
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        *self.bar.lock().expect("spinner lock") = Some(bar);
    }

    fn done(&self, what: &str) {
        match self.bar.lock().expect("spinner lock").take() {
            Some(bar) => bar.finish_with_message(format!("✓ {what}")),
            None if self.tty => errln!("✓ {what}"),
            None => {}
        }
    }
}
