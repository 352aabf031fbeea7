//! What went wrong, and which exit status it gets: 2 when the command line asks for something
//! that cannot be (so a script's retry would not help), 1 when the world did not cooperate.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A bad command line: an unknown option, rule, limit or label, a bad number, a limit
    /// without overrides. Exit status 2.
    Usage,
    /// Everything else: a config that cannot be read, Redis unreachable or refusing, a state
    /// that cannot be read. Exit status 1.
    Failure,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
}

impl Error {
    pub fn usage(message: impl Into<String>) -> Error {
        Error {
            kind: Kind::Usage,
            message: message.into(),
        }
    }

    pub fn failure(message: impl Into<String>) -> Error {
        Error {
            kind: Kind::Failure,
            message: message.into(),
        }
    }

    pub fn exit_status(&self) -> u8 {
        match self.kind {
            Kind::Usage => 2,
            Kind::Failure => 1,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
