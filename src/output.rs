//! The commands' printing, in one place: `println!` panics when stdout is closed
//! (`aamp-bridge service status | head` once `head` has its lines), and `eprintln!` when
//! stderr is. Every command and the wizard print through [`outln!`], [`out!`] and
//! [`errln!`] instead.

use std::io::Write as _;

/// Writes `args` to stdout at once. A stdout whose reader went away ends the command quietly,
/// with exit status 0: the reader took what it wanted (`| head`), and nobody reads what was
/// left to print. Another write error ends it with status 1 and the reason on stderr.
pub fn stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        stderr(format_args!("aamp-bridge: cannot write to stdout: {e}\n"));
        std::process::exit(1);
    }
}

/// Writes `args` to stderr; a stderr nobody reads is no reason to stop.
pub fn stderr(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `println!` that a closed stdout does not panic ([`stdout`]).
macro_rules! outln {
    () => {
        $crate::output::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that a closed stdout does not panic ([`stdout`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` that a closed stderr does not panic ([`stderr`]).
macro_rules! errln {
    () => {
        $crate::output::stderr(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln};
