//! The wizard's one-line text question. inquire's text input reads every Ctrl-letter it does
//! not know as the letter (Ctrl-U typed "u", Ctrl-W "w"), and its keys cannot be remapped, and
//! an answer it offers again is a default that cannot be edited. This prompt starts with the
//! earlier answer as editable text and knows the shell's editing keys: Ctrl-U (to the start),
//! Ctrl-W (the word before), Ctrl-K (to the end), Ctrl-A/E, Ctrl-B/F, arrows, Home, End.
//! It looks like inquire's questions around it ("? Question: answer", then "> ...").

use std::io::{IsTerminal as _, Write as _};

use crossterm::event::{Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use crossterm::{cursor, queue, style, terminal};
use inquire::InquireError;

/// The text being edited and where the cursor is (in characters).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Line {
    text: Vec<char>,
    cursor: usize,
}

/// What a key does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Key {
    Edit(Edit),
    Submit,
    /// Esc: the wizard ends, nothing written.
    Cancel,
    /// Ctrl-C.
    Interrupt,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Edit {
    Insert(char),
    Backspace,
    Delete,
    Left,
    Right,
    Home,
    End,
    WordLeft,
    WordRight,
    /// Ctrl-U: everything before the cursor.
    KillToStart,
    /// Ctrl-W: the word before the cursor (and the spaces after it), as a shell does.
    KillWordBack,
    /// Ctrl-K: everything from the cursor on.
    KillToEnd,
}

impl Line {
    pub(super) fn new(initial: &str) -> Line {
        let text: Vec<char> = initial.chars().collect();
        Line {
            cursor: text.len(),
            text,
        }
    }

    pub(super) fn text(&self) -> String {
        self.text.iter().collect()
    }

    fn word_start(&self) -> usize {
        let mut at = self.cursor;
        while at > 0 && self.text[at - 1].is_whitespace() {
            at -= 1;
        }
        while at > 0 && !self.text[at - 1].is_whitespace() {
            at -= 1;
        }
        at
    }

    fn word_end(&self) -> usize {
        let mut at = self.cursor;
        while at < self.text.len() && self.text[at].is_whitespace() {
            at += 1;
        }
        while at < self.text.len() && !self.text[at].is_whitespace() {
            at += 1;
        }
        at
    }

    pub(super) fn apply(&mut self, edit: Edit) {
        match edit {
            Edit::Insert(c) => {
                self.text.insert(self.cursor, c);
                self.cursor += 1;
            }
            Edit::Backspace if self.cursor > 0 => {
                self.cursor -= 1;
                self.text.remove(self.cursor);
            }
            Edit::Delete if self.cursor < self.text.len() => {
                self.text.remove(self.cursor);
            }
            Edit::Backspace | Edit::Delete => {}
            Edit::Left => self.cursor = self.cursor.saturating_sub(1),
            Edit::Right => self.cursor = (self.cursor + 1).min(self.text.len()),
            Edit::Home => self.cursor = 0,
            Edit::End => self.cursor = self.text.len(),
            Edit::WordLeft => self.cursor = self.word_start(),
            Edit::WordRight => self.cursor = self.word_end(),
            Edit::KillToStart => {
                self.text.drain(..self.cursor);
                self.cursor = 0;
            }
            Edit::KillWordBack => {
                let start = self.word_start();
                self.text.drain(start..self.cursor);
                self.cursor = start;
            }
            Edit::KillToEnd => {
                self.text.truncate(self.cursor);
            }
        }
    }
}

/// What `key` does in this prompt; `None` for keys it ignores.
pub(super) fn key(event: KeyEvent) -> Option<Key> {
    let ctrl = event.modifiers.contains(KeyModifiers::CONTROL);
    let alt = event.modifiers.contains(KeyModifiers::ALT);
    let edit = match event.code {
        KeyCode::Enter => return Some(Key::Submit),
        KeyCode::Esc => return Some(Key::Cancel),
        KeyCode::Char('c') if ctrl => return Some(Key::Interrupt),
        KeyCode::Char('u') if ctrl => Edit::KillToStart,
        KeyCode::Char('w') if ctrl => Edit::KillWordBack,
        KeyCode::Backspace if alt || ctrl => Edit::KillWordBack,
        KeyCode::Char('k') if ctrl => Edit::KillToEnd,
        KeyCode::Char('a') if ctrl => Edit::Home,
        KeyCode::Char('e') if ctrl => Edit::End,
        KeyCode::Char('b') if ctrl => Edit::Left,
        KeyCode::Char('f') if ctrl => Edit::Right,
        KeyCode::Char('h') if ctrl => Edit::Backspace,
        KeyCode::Char('d') if ctrl => Edit::Delete,
        KeyCode::Char('b') if alt => Edit::WordLeft,
        KeyCode::Char('f') if alt => Edit::WordRight,
        KeyCode::Left if ctrl || alt => Edit::WordLeft,
        KeyCode::Right if ctrl || alt => Edit::WordRight,
        // Any other Ctrl or Alt letter is not text.
        KeyCode::Char(_) if ctrl || alt => return None,
        KeyCode::Char(c) => Edit::Insert(c),
        KeyCode::Backspace => Edit::Backspace,
        KeyCode::Delete => Edit::Delete,
        KeyCode::Left => Edit::Left,
        KeyCode::Right => Edit::Right,
        KeyCode::Home => Edit::Home,
        KeyCode::End => Edit::End,
        _ => return None,
    };
    Some(Key::Edit(edit))
}

/// Raw mode for as long as the question is asked, left however it ends.
struct Raw;

impl Raw {
    fn on() -> std::io::Result<Raw> {
        terminal::enable_raw_mode()?;
        Ok(Raw)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = terminal::disable_raw_mode();
    }
}

/// Draws the question over its last drawing; remembers the cursor's row in it.
struct Screen {
    out: std::io::Stderr,
    /// The row the cursor was left on, counted from the question's first row.
    row: u16,
}

impl Screen {
    fn draw(
        &mut self,
        mark: &str,
        label: &str,
        line: &Line,
        help: Option<&str>,
    ) -> std::io::Result<()> {
        let width = terminal::size().map(|(w, _)| w.max(1)).unwrap_or(80) as usize;
        let prefix = format!("{mark} {label} ");
        let shown = format!("{prefix}{}", line.text());
        let rows = shown.chars().count().max(1).div_ceil(width);
        // Never MoveUp(0): terminals read "up 0" as "up 1".
        if self.row > 0 {
            queue!(self.out, cursor::MoveUp(self.row))?;
        }
        queue!(
            self.out,
            cursor::MoveToColumn(0),
            terminal::Clear(terminal::ClearType::FromCursorDown),
            style::Print(&shown)
        )?;
        // The row the drawing ends on: the last of the text, or the help line below it.
        let mut end = rows.saturating_sub(1);
        if let Some(help) = help {
            queue!(self.out, style::Print(format!("\r\n[{help}]")))?;
            end += 1;
        }
        let at = prefix.chars().count() + line.cursor;
        let (row, col) = (at / width, at % width);
        let up = end.saturating_sub(row);
        if up > 0 {
            queue!(self.out, cursor::MoveUp(up as u16))?;
        }
        queue!(self.out, cursor::MoveToColumn(col as u16))?;
        self.out.flush()?;
        self.row = row.min(u16::MAX as usize) as u16;
        Ok(())
    }
}

/// Asks `label` with `initial` as editable text (an earlier answer, or a guess), `help` shown
/// below. Esc cancels, Ctrl-C interrupts, as in inquire.
pub(super) fn ask(label: &str, initial: &str, help: Option<&str>) -> Result<String, InquireError> {
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        return Err(InquireError::NotTTY);
    }
    let mut line = Line::new(initial);
    let mut screen = Screen {
        out: std::io::stderr(),
        row: 0,
    };
    let raw = Raw::on()?;
    screen.draw("?", label, &line, help)?;
    let end = loop {
        let Event::Key(event) = crossterm::event::read()? else {
            continue;
        };
        if event.kind == KeyEventKind::Release {
            continue;
        }
        match key(event) {
            Some(Key::Edit(edit)) => {
                line.apply(edit);
                screen.draw("?", label, &line, help)?;
            }
            Some(Key::Submit) => break Ok(line.text()),
            Some(Key::Cancel) => break Err(InquireError::OperationCanceled),
            Some(Key::Interrupt) => break Err(InquireError::OperationInterrupted),
            None => {}
        }
    };
    let last = match &end {
        Ok(_) => line,
        Err(_) => Line::new("<canceled>"),
    };
    screen.draw(">", label, &last, None)?;
    queue!(screen.out, style::Print("\r\n"))?;
    screen.out.flush()?;
    drop(raw);
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(line: &mut Line, code: KeyCode, modifiers: KeyModifiers) {
        match key(KeyEvent::new(code, modifiers)) {
            Some(Key::Edit(e)) => line.apply(e),
            other => panic!("{code:?}: {other:?}"),
        }
    }

    #[test]
    fn ctrl_u_and_ctrl_w_edit_instead_of_typing_letters() {
        let mut line = Line::new("https://mail.example.com/jmap");
        press(&mut line, KeyCode::Char('w'), KeyModifiers::CONTROL);
        assert_eq!(line.text(), "");
        let mut line = Line::new("a b  cd");
        press(&mut line, KeyCode::Char('w'), KeyModifiers::CONTROL);
        assert_eq!(line.text(), "a b  ");
        press(&mut line, KeyCode::Char('w'), KeyModifiers::CONTROL);
        assert_eq!(line.text(), "a ");
        press(&mut line, KeyCode::Char('x'), KeyModifiers::NONE);
        press(&mut line, KeyCode::Left, KeyModifiers::NONE);
        press(&mut line, KeyCode::Char('u'), KeyModifiers::CONTROL);
        assert_eq!(line.text(), "x");
        // Another Ctrl letter types nothing.
        assert_eq!(
            key(KeyEvent::new(KeyCode::Char('t'), KeyModifiers::CONTROL)),
            None
        );
        assert_eq!(
            key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
            Some(Key::Interrupt)
        );
    }

    /// One wrong digit in an offered answer is fixed in place, not retyped.
    #[test]
    fn an_offered_answer_is_edited_in_place() {
        let mut line = Line::new("https://mail.example.com:8443/jmap");
        for _ in 0.."/jmap".len() {
            press(&mut line, KeyCode::Left, KeyModifiers::NONE);
        }
        press(&mut line, KeyCode::Backspace, KeyModifiers::NONE);
        press(&mut line, KeyCode::Char('4'), KeyModifiers::NONE);
        assert_eq!(line.text(), "https://mail.example.com:8444/jmap");
        press(&mut line, KeyCode::Char('k'), KeyModifiers::CONTROL);
        press(&mut line, KeyCode::Char('a'), KeyModifiers::CONTROL);
        press(&mut line, KeyCode::Delete, KeyModifiers::NONE);
        assert_eq!(line.text(), "ttps://mail.example.com:8444");
    }
}
