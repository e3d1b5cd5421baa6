//! Diagnostics (file:line + message) and the crate's error type.

use std::fmt;

/// How bad a [`Diagnostic`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The file was still understood (unknown key, duplicate key, …).
    Warning,
    /// Part of the file could not be understood or is invalid.
    Error,
}

/// One problem found in a file. `line` is 1-based; 0 means "the file as
/// a whole" (e.g. a required key is missing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: u32,
    pub severity: Severity,
    pub message: String,
}

impl Diagnostic {
    pub fn error(file: &str, line: u32, message: impl Into<String>) -> Self {
        Diagnostic { file: file.to_string(), line, severity: Severity::Error, message: message.into() }
    }

    pub fn warning(file: &str, line: u32, message: impl Into<String>) -> Self {
        Diagnostic { file: file.to_string(), line, severity: Severity::Warning, message: message.into() }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// `file:line: message` (`file: message` when line is 0).
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        }
    }
}

/// A typed config plus the warnings met while building it.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded<T> {
    pub conf: T,
    pub warnings: Vec<Diagnostic>,
}

/// Errors of the file-loading and typed-config functions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The top-level file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but holds at least one error. `first` is the
    /// first error; `all` holds every error (including `first`).
    #[error("{first}{}", more_suffix(.all.len()))]
    Invalid { first: Diagnostic, all: Vec<Diagnostic> },
}

fn more_suffix(n: usize) -> String {
    match n {
        0 | 1 => String::new(),
        2 => " (and 1 more error)".to_string(),
        n => format!(" (and {} more errors)", n - 1),
    }
}

impl Error {
    /// Builds [`Error::Invalid`] from diagnostics if any of them is an
    /// error; `None` otherwise.
    pub fn from_diagnostics(diags: &[Diagnostic]) -> Option<Error> {
        let all: Vec<Diagnostic> = diags.iter().filter(|d| d.is_error()).cloned().collect();
        let first = all.first()?.clone();
        Some(Error::Invalid { first, all })
    }

    /// Every diagnostic carried (empty for I/O errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            Error::Io { .. } => &[],
            Error::Invalid { all, .. } => all,
        }
    }
}
